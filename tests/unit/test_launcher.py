"""The runtime's lean entry point (runtime/launcher.py) and what a passthrough imports."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

import execgate
from execgate.common import config
from execgate.oci import runc
from execgate.runtime import launcher

SRC = Path(__file__).resolve().parents[2]
# What the runtime must not import before it execs the real runtime (a passthrough).
HEAVY = ("typing", "dataclasses", "re", "json", "tomllib", "shutil", "socket", "msgpack",
         "inspect", "enum")


@pytest.fixture
def site() -> list[str]:
    """sys.path entries as installed: the checkout holds the execgate package; and msgpack's."""
    import msgpack

    return [str(SRC), str(Path(msgpack.__file__).parent.parent)]


def _runtime(tmp_path: Path) -> tuple[str, dict[str, str]]:
    """A config naming a fake runtime that prints its argv."""
    rt = tmp_path / "rt"
    rt.write_text('#!/bin/sh\necho "rt:$*"\n')
    rt.chmod(0o755)
    conf = tmp_path / "config.toml"
    conf.write_text(f'runtime = "{rt}"\n')
    env = {k: v for k, v in os.environ.items() if k != runc.LOOP_MARKER}
    return str(conf), {**env, "EXECGATE_CONFIG": str(conf)}


def test_script_is_recognised_as_execgate(tmp_path: Path) -> None:
    text = launcher.render("/opt/execgate/bin/python", ["/opt/execgate/lib/site-packages"])
    assert text.startswith("#!/opt/execgate/bin/python -IS\n")
    assert "execgate.runtime" in text[:512]
    script = tmp_path / "execgate"
    script.write_text(text)
    script.chmod(0o755)
    with pytest.raises(runc.RuntimeNotFound, match="is execgate itself"):
        runc.find((str(script),))


def test_script_runs_the_runtime(tmp_path: Path, site: list[str]) -> None:
    _, env = _runtime(tmp_path)
    script = tmp_path / "execgate"
    script.write_text(launcher.render(sys.executable, site))
    script.chmod(0o755)
    out = subprocess.run([str(script), "--root", "/r", "state", "x"], env=env,
                         capture_output=True, text=True, check=True)
    assert out.stdout == "rt:--root /r state x\n"


def test_script_falls_back_to_site(tmp_path: Path) -> None:
    """Paths that moved: site's own paths are used (here the dev venv's editable install)."""
    _, env = _runtime(tmp_path)
    script = tmp_path / "execgate"
    script.write_text(launcher.render(sys.executable, [str(tmp_path / "gone")]))
    script.chmod(0o755)
    out = subprocess.run([str(script), "--version"], env=env, capture_output=True, text=True,
                         check=True)
    assert out.stdout == (f"execgate version {execgate.__version__}\n"
                          f"real runtime: {tmp_path / 'rt'}\nrt:--version\n")


def test_check_refuses_paths_without_the_runtime(tmp_path: Path, site: list[str]) -> None:
    launcher.check(sys.executable, site)
    with pytest.raises(subprocess.CalledProcessError):
        launcher.check(sys.executable, [str(tmp_path)])


def test_write_refuses_an_interpreter_a_shebang_cannot_hold(tmp_path: Path) -> None:
    target = tmp_path / "execgate"
    with pytest.raises(ValueError):
        launcher.write(str(target), "/opt/exec gate/bin/python")
    assert not target.exists()
    assert launcher.main([]) == 2


@pytest.mark.parametrize("argv", [["--version"], ["--root", "/r", "state", "x"]])
def test_passthrough_imports_nothing_heavy(tmp_path: Path, site: list[str], argv: list[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    conf, env = _runtime(tmp_path)
    cache = tmp_path / "config.cache"
    monkeypatch.setattr(config, "SETTLE_NS", 0)
    config.load_cached(conf, str(cache))  # what the first call leaves behind
    assert cache.exists()
    code = f"""
import os, sys
sys.path.extend({site!r})
import execgate
from execgate.common import config
config.CACHE_PATH = {str(cache)!r}
def execve(path, argv, env):
    print(path, argv, sorted(m for m in {HEAVY!r} if m in sys.modules))
    sys.exit(0)
os.execve = execve
sys.argv = ["execgate", *{argv!r}]
from execgate.runtime.main import main
main()
"""
    out = subprocess.run([sys.executable, "-IS", "-c", code], env=env, capture_output=True,
                         text=True, check=True)
    rt = tmp_path / "rt"
    own = (f"execgate version {execgate.__version__}\nreal runtime: {rt}\n"
           if argv == ["--version"] else "")
    assert out.stdout == f"{own}{rt} {[str(rt), *argv]!r} []\n"


def test_version_matches_the_package_metadata() -> None:
    """execgate's --version says what pyproject.toml's version says (one bump, not two)."""
    import tomllib

    meta = tomllib.loads((SRC / "pyproject.toml").read_text())
    assert meta["project"]["version"] == execgate.__version__
