import os
import sys
from pathlib import Path

import pytest
from execgate.oci import runtime


def _exe(p: Path, body: str = "#!/bin/sh\nexit 0\n") -> str:
    p.write_text(body)
    p.chmod(0o755)
    return str(p)


def test_first_usable_candidate(tmp_path: Path) -> None:
    real = _exe(tmp_path / "runc")
    assert runtime.find((str(tmp_path / "missing"), real)) == real


def test_never_itself(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    me = _exe(tmp_path / "execgate")
    link = tmp_path / "runc"
    link.symlink_to(me)
    monkeypatch.setattr(sys, "argv", [me])
    with pytest.raises(runtime.RuntimeNotFound, match="is execgate itself"):
        runtime.find((str(link),))


def test_console_script_of_another_install_is_recognised(tmp_path: Path) -> None:
    other = _exe(tmp_path / "runc", "#!/opt/x/bin/python\nfrom execgate.shim.main import main\n")
    with pytest.raises(runtime.RuntimeNotFound):
        runtime.find((other,))


def test_loop_marker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(runtime.LOOP_MARKER, raising=False)
    assert not runtime.in_loop()
    assert runtime.child_env()[runtime.LOOP_MARKER] == "1"
    monkeypatch.setenv(runtime.LOOP_MARKER, "1")
    assert runtime.in_loop()


def test_run_returns_exit_status(tmp_path: Path) -> None:
    prog = _exe(tmp_path / "rt", "#!/bin/sh\nexit 7\n")
    assert runtime.run(prog, []) == 7
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
        assert runtime.which(name, path) == shutil.which(name, path=path)
    assert runtime.which("rt", path) == str(b / "rt")
    assert runtime.which("rt", "") is None
    monkeypatch.setenv("PATH", str(b))
    assert runtime.which("rt") == str(b / "rt")
