import os
import subprocess
import sys
from pathlib import Path

import pytest

from execgate.oci import runc


def _exe(p: Path, body: str = "#!/bin/sh\nexit 0\n") -> str:
    p.write_text(body)
    p.chmod(0o755)
    return str(p)


def test_first_usable_candidate(tmp_path: Path) -> None:
    real = _exe(tmp_path / "runc")
    assert runc.find((str(tmp_path / "missing"), real)) == real


def test_never_itself(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    me = _exe(tmp_path / "execgate")
    link = tmp_path / "runc"
    link.symlink_to(me)
    monkeypatch.setattr(sys, "argv", [me])
    with pytest.raises(runc.RuntimeNotFound, match="is execgate itself"):
        runc.find((str(link),))


def test_console_script_of_another_install_is_recognised(tmp_path: Path) -> None:
    other = _exe(tmp_path / "runc", "#!/opt/x/bin/python\nfrom execgate.runtime.main import main\n")
    with pytest.raises(runc.RuntimeNotFound):
        runc.find((other,))


def test_loop_marker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(runc.LOOP_MARKER, raising=False)
    assert not runc.in_loop()
    assert runc.child_env()[runc.LOOP_MARKER] == "1"
    monkeypatch.setenv(runc.LOOP_MARKER, "1")
    assert runc.in_loop()


def test_run_returns_exit_status(tmp_path: Path) -> None:
    prog = _exe(tmp_path / "rt", "#!/bin/sh\nexit 7\n")
    assert runc.run(prog, []) == 7
    assert os.path.exists(prog)


def test_which_agrees_with_shutil(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    _exe(b / "rt")
    (a / "rt").write_text("not executable")
    (a / "dir").mkdir(mode=0o755)
    _exe(b / "dir")
    path = f"{a}:{b}:{a}"
    for name in ("rt", "dir", "missing"):
        assert runc.which(name, path) == shutil.which(name, path=path)
    assert runc.which("rt", path) == str(b / "rt")
    assert runc.which("rt", "") is None
    monkeypatch.setenv("PATH", str(b))
    assert runc.which("rt") == str(b / "rt")


def _runtime_main(tmp_path: Path, configured: str) -> tuple[subprocess.CompletedProcess[str],
                                                              Path]:
    """runtime/main.py as the engine runs it (`state box`), with `runtime = configured` and a
    fake runc first on PATH that echoes its argv; and its runc log."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _exe(bin_dir / "runc", '#!/bin/sh\necho "runc:$*"\n')
    conf = tmp_path / "config.toml"
    conf.write_text(f"runtime = {configured}\n")
    log = tmp_path / "runc.log"
    code = (f"from execgate.common import config; config.CACHE_PATH = {str(tmp_path / 'c')!r}\n"
            "from execgate.runtime.main import main; main()")
    env = {k: v for k, v in os.environ.items() if k != runc.LOOP_MARKER}
    env.update(EXECGATE_CONFIG=str(conf), PATH=f"{bin_dir}:/usr/bin:/bin",
               PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    out = subprocess.run([sys.executable, "-c", code, "--log", str(log), "--log-format",
                          "json", "state", "box"], env=env, capture_output=True, text=True,
                         timeout=20)
    return out, log


@pytest.mark.parametrize("configured", ['"runcc"', '["/nope/runc"]', '"/bin"'])
def test_a_runtime_not_found_falls_back_to_the_defaults_with_an_error(
        tmp_path: Path, configured: str) -> None:
    """A typo in `runtime` must not break every container operation (issue 21 §10)."""
    out, log = _runtime_main(tmp_path, configured)
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"runc:--log {log} --log-format json state box\n"
    assert "configured runtime: no OCI runtime found" in log.read_text()


def test_a_runtime_that_is_execgate_itself_is_refused_not_worked_around(tmp_path: Path) -> None:
    other = _exe(tmp_path / "eg", "#!/opt/x/bin/python\nfrom execgate.runtime.main import main\n")
    out, _log = _runtime_main(tmp_path, f'"{other}"')
    assert out.returncode == 1 and out.stdout == ""
    assert "no OCI runtime found" in out.stderr and "is execgate itself" in out.stderr
