"""The daemon writes the compiled front's copy of the config when it starts and reloads
(config.refresh_front, daemon/main.keep_front_fresh): the runtime writes it only once the file
is SETTLE_NS old, so the calls right after a config change and a restart all started Python."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from execgate.common import config, frontconf
from execgate.daemon import main as daemon_main


@pytest.fixture
def box(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """A config the runtime reads ($EXECGATE_CONFIG), just written; where its front copy goes."""
    conf = tmp_path / "config.toml"
    conf.write_text('runtime = "/usr/bin/runc"\nsocket = "/run/x/execgated.sock"\n')
    cache = tmp_path / "run" / "config.cache"
    monkeypatch.setenv("EXECGATE_CONFIG", str(conf))
    monkeypatch.setattr(config, "CACHE_PATH", str(cache))
    return conf, Path(frontconf.path_for(str(cache)))


def test_the_runtime_leaves_a_config_just_written_to_python(box: tuple[Path, Path]) -> None:
    """The gap: a call right after the change writes no copy (every call meanwhile is Python's)."""
    front = box[1]
    config.load_cached()
    assert not front.exists()


def test_the_daemon_writes_the_copy_at_once_and_again_once_settled(
        box: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    conf, front = box
    monkeypatch.setattr(config, "SETTLE_NS", 300_000_000)

    async def start() -> None:
        daemon_main.keep_front_fresh(str(conf))
        assert front.exists(), "written while the file is unsettled"
        assert not os.path.exists(config.CACHE_PATH)  # the runtime's cache waits
        text = front.read_text()
        assert "runtime /usr/bin/runc\n" in text and "socket /run/x/execgated.sock\n" in text
        assert f"config {os.stat(conf).st_dev} {os.stat(conf).st_ino} " in text
        await asyncio.sleep(0.6)  # the second look, once settled, caches it too

    asyncio.run(start())
    assert os.path.exists(config.CACHE_PATH)
    assert config.load_cached().runtime == ("/usr/bin/runc",)


def test_a_daemon_on_another_config_leaves_the_copy_alone(box: tuple[Path, Path],
                                                           tmp_path: Path) -> None:
    other = tmp_path / "other.toml"
    other.write_text('runtime = "/usr/bin/crun"\n')
    daemon_main.keep_front_fresh(str(other))
    daemon_main.keep_front_fresh(None)
    assert not box[1].exists()


def test_a_config_with_problems_gets_no_copy(box: tuple[Path, Path]) -> None:
    """Python must run every call to report them (frontconf.render)."""
    conf, front = box
    config.refresh_front()
    assert front.exists()
    conf.write_text("bogus = 1\n")
    assert config.refresh_front() is True
    assert not front.exists()
