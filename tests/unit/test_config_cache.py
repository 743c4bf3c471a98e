"""The runtime's config cache (config.load_cached): same answers as load(), fewer parses."""

import marshal
import os
from pathlib import Path

import pytest

from execgate.common import config


@pytest.fixture
def settled(monkeypatch: pytest.MonkeyPatch) -> None:
    """Files just written count as settled (the cache waits SETTLE_NS after an edit)."""
    monkeypatch.setattr(config, "SETTLE_NS", 0)


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths the TOML parser was run on."""
    seen: list[str] = []
    parse = config._parse

    def counting(path: str, text: bytes) -> config.Config:
        seen.append(path)
        return parse(path, text)

    monkeypatch.setattr(config, "_parse", counting)
    return seen


def _conf(tmp_path: Path, text: str = 'runtime = "/usr/sbin/runc"\nbogus = 1\n[daemon]\nx = 1\n'
          ) -> str:
    p = tmp_path / "config.toml"
    p.write_text(text)
    return str(p)


def test_hit_equals_load_and_skips_the_parse(tmp_path: Path, settled: None,
                                             parses: list[str]) -> None:
    path, cache = _conf(tmp_path), str(tmp_path / "run" / "config.cache")
    first = config.load_cached(path, cache)
    assert os.path.exists(cache) and len(parses) == 1
    second = config.load_cached(path, cache)
    assert len(parses) == 1, "served from the cache"
    fresh = config.load(path)
    for cfg in (first, second):
        assert cfg == fresh and cfg.__dict__ == fresh.__dict__  # errors and tables too
    assert second.runtime == ("/usr/sbin/runc",) and second.tables == {"daemon": {"x": 1}}
    assert any("bogus" in e for e in second.warnings)


def test_edit_makes_the_cache_stale(tmp_path: Path, settled: None, parses: list[str]) -> None:
    path, cache = _conf(tmp_path), str(tmp_path / "config.cache")
    config.load_cached(path, cache)
    Path(path).write_text('runtime = "/usr/bin/crun"\n')
    assert config.load_cached(path, cache).runtime == ("/usr/bin/crun",)
    assert config.load_cached(path, cache).runtime == ("/usr/bin/crun",)
    assert len(parses) == 2


def test_replaced_file_of_the_same_size_and_times_is_stale(tmp_path: Path, settled: None) -> None:
    path, cache = _conf(tmp_path, 'runtime = "/a/runc"\n'), str(tmp_path / "config.cache")
    config.load_cached(path, cache)
    st = os.stat(path)
    other = tmp_path / "new.toml"
    other.write_text('runtime = "/b/runc"\n')
    os.utime(other, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(other, path)  # same size, same mtime: only the inode tells
    assert config.load_cached(path, cache).runtime == ("/b/runc",)


def test_another_config_path_misses(tmp_path: Path, settled: None) -> None:
    cache = str(tmp_path / "config.cache")
    a = _conf(tmp_path, 'runtime = "/a/runc"\n')
    (tmp_path / "b").mkdir()
    b = _conf(tmp_path / "b", 'runtime = "/b/runc"\n')
    assert config.load_cached(a, cache).runtime == ("/a/runc",)
    assert config.load_cached(b, cache).runtime == ("/b/runc",)
    assert config.load_cached(a, cache).runtime == ("/a/runc",)


@pytest.mark.parametrize("garbage", [b"", b"\x00garbage", marshal.dumps(42),
                                     marshal.dumps(("k", "v")), marshal.dumps((1, 2, 3))])
def test_corrupt_cache_is_ignored_and_rewritten(tmp_path: Path, settled: None,
                                                garbage: bytes) -> None:
    path, cache = _conf(tmp_path), tmp_path / "config.cache"
    good = config.load_cached(path, str(cache)).__dict__
    key, _ = marshal.loads(cache.read_bytes())
    cache.write_bytes(garbage)
    assert config.load_cached(path, str(cache)).__dict__ == good
    assert marshal.loads(cache.read_bytes())[0] == key


def test_cache_with_unknown_fields_is_ignored(tmp_path: Path, settled: None) -> None:
    path, cache = _conf(tmp_path), tmp_path / "config.cache"
    good = config.load_cached(path, str(cache))
    key, values = marshal.loads(cache.read_bytes())
    cache.write_bytes(marshal.dumps((key, {**values, "gone": 1})))
    assert config.load_cached(path, str(cache)) == good


def test_cache_of_another_owner_is_ignored(tmp_path: Path, settled: None,
                                           parses: list[str]) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to chown")
    path, cache = _conf(tmp_path), str(tmp_path / "config.cache")
    config.load_cached(path, cache)
    os.chown(cache, 12345, 12345)
    config.load_cached(path, cache)
    assert len(parses) == 2


def test_missing_or_unwritable_cache_only_costs_a_parse(tmp_path: Path, settled: None,
                                                        parses: list[str]) -> None:
    path = _conf(tmp_path)
    blocker = tmp_path / "file"
    blocker.write_text("")
    cache = str(blocker / "config.cache")  # its directory is a file: never writable
    for _ in range(2):
        assert config.load_cached(path, cache).runtime == ("/usr/sbin/runc",)
    assert len(parses) == 2
    assert not list(tmp_path.glob("**/*.tmp"))


def test_recent_edits_are_not_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(config, "SETTLE_NS", 3600 * 10**9)
    path, cache = _conf(tmp_path), tmp_path / "config.cache"
    assert config.load_cached(path, str(cache)).runtime == ("/usr/sbin/runc",)
    assert not cache.exists()


def test_values_marshal_cannot_hold_are_not_cached(tmp_path: Path, settled: None) -> None:
    path, cache = _conf(tmp_path, "[daemon]\nsince = 2024-01-01\n"), tmp_path / "config.cache"
    cfg = config.load_cached(path, str(cache))
    assert str(cfg.tables["daemon"]["since"]) == "2024-01-01" and not cache.exists()


def test_missing_and_broken_configs_behave_as_load(tmp_path: Path, settled: None) -> None:
    cache = str(tmp_path / "config.cache")
    assert config.load_cached(str(tmp_path / "none.toml"), cache) == config.Config()
    broken = _conf(tmp_path, "runtime = [\n")
    for _ in range(2):
        cfg = config.load_cached(broken, cache)
        assert cfg.runtime == config.Config().runtime and "using defaults" in cfg.errors[0]


def test_env_and_default_cache_path(tmp_path: Path, settled: None,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(config, "CACHE_PATH", str(tmp_path / "default.cache"))
    monkeypatch.setenv("EXECGATE_CONFIG", _conf(tmp_path, 'state_dir = "/x"\n'))
    assert config.load_cached().state_dir == "/x"
    assert (tmp_path / "default.cache").exists()


def test_config_is_an_immutable_value() -> None:
    cfg = config.Config(state_dir="/s")
    with pytest.raises(AttributeError):
        cfg.state_dir = "/t"  # type: ignore[misc]
    with pytest.raises(TypeError):
        config.Config(bogus=1)
    assert config.Config(errors=("x",), tables={"a": {}}) == config.Config()
    assert config.Config(**{**cfg.__dict__, "socket": "/k"}).socket == "/k"
    assert hash(cfg) == hash(config.Config(state_dir="/s")) and cfg != config.Config()
    assert config.Config().tables is not config.Config().tables
    assert "state_dir='/s'" in repr(cfg)
    assert config.SETTINGS[0] == "runtime" and "errors" not in config.SETTINGS
