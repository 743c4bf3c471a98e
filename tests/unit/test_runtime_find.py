import os
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
