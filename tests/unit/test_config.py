from pathlib import Path

from execgate.common import config


def test_defaults_when_absent(tmp_path: Path) -> None:
    cfg = config.load(str(tmp_path / "none.toml"))
    assert cfg == config.Config()
    assert cfg.runtime == ("runc", "crun") and cfg.errors == ()


def test_values_and_string_or_list(tmp_path: Path) -> None:
    p = tmp_path / "c.toml"
    p.write_text('runtime = "/usr/sbin/runc"\ncontrollers = ["memory"]\ndaemon_timeout_ms = 50\n'
                 '[daemon]\nx = 1\n')
    cfg = config.load(str(p))
    assert cfg.runtime == ("/usr/sbin/runc",)
    assert cfg.controllers == ("memory",)
    assert cfg.daemon_timeout_ms == 50
    assert cfg.errors == ()


def test_bad_values_fall_back_with_errors(tmp_path: Path) -> None:
    p = tmp_path / "c.toml"
    p.write_text('runtime = 5\nper_exec_cgroups = "yes"\nbogus = 1\n')
    cfg = config.load(str(p))
    assert cfg.runtime == config.Config().runtime
    assert cfg.per_exec_cgroups is True
    assert len(cfg.errors) == 2
    assert [w for w in cfg.warnings if "bogus" in w] == [f"{p}:3: unknown key 'bogus' ignored"]


def test_broken_toml_never_raises(tmp_path: Path) -> None:
    p = tmp_path / "c.toml"
    p.write_text("runtime = [\n")
    cfg = config.load(str(p))
    assert cfg.runtime == config.Config().runtime
    assert cfg.errors and "using defaults" in cfg.errors[0]


def test_env_override(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    p = tmp_path / "c.toml"
    p.write_text('state_dir = "/x"\n')
    monkeypatch.setenv("EXECGATE_CONFIG", str(p))
    assert config.load().state_dir == "/x"


def test_an_empty_runtime_list_keeps_the_defaults_with_an_error(tmp_path: Path) -> None:
    """`runtime = []` left nothing to run: every container operation failed (issue 21 §10)."""
    for value in ("[]", '[""]'):
        p = tmp_path / "c.toml"
        p.write_text(f"runtime = {value}\n")
        cfg = config.load(str(p))
        assert cfg.runtime == config.Config().runtime
        assert len(cfg.errors) == 1 and "runtime" in cfg.errors[0]
