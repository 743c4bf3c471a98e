"""Config problems at their file:line: unknown tables and keys warned, a bad value refused
alone (the rest of its table kept), and `execgatectl config check`'s exit status."""

from pathlib import Path

import pytest

from execgate.common import config
from execgate.common.units import MiB
from execgate.ctl import config_check
from execgate.ctl import main as ctl
from execgate.daemon import settings


def _write(tmp_path: Path, text: str) -> str:
    p = tmp_path / "config.toml"
    p.write_text(text)
    return str(p)


def test_a_misspelled_table_is_a_warning_at_its_line(tmp_path: Path) -> None:
    path = _write(tmp_path, 'socket = "/s"\n\n[admision]\nmax_queued_s = 5\n')
    cfg = config.load(path)
    assert cfg.errors == ()
    assert len(cfg.warnings) == 1
    assert cfg.warnings[0].startswith(f"{path}:3: unknown table [admision] ignored")


def test_an_unknown_key_of_a_table_is_a_warning_at_its_line(tmp_path: Path) -> None:
    path = _write(tmp_path, '[daemon]\ndomain = "host"\ngaet = "off"\n')
    s, problems = settings.load(config.load(path))
    assert problems == [f"{path}:3: [daemon] unknown key 'gaet' ignored"]
    assert not problems[0].error
    assert s.daemon.gate == "auto"


def test_a_bad_value_is_refused_alone_and_the_rest_of_its_table_kept(tmp_path: Path) -> None:
    """One value the policy's own checks refuse reset its whole table (issue 20)."""
    path = _write(tmp_path, '[pressure]\nsafety_margin_bytes = "64m"\nred_fraction = -1\n'
                            'yellow_fraction = 0.2\n')
    s, problems = settings.load(config.load(path))
    assert s.pressure.safety_margin_bytes == 64 * MiB
    assert s.pressure.yellow_fraction == 0.2
    assert s.pressure.red_fraction == settings.PressureConfig().red_fraction
    assert [str(p) for p in problems] == [
        f"{path}:3: [pressure] red_fraction: red_fraction and yellow_fraction must be >= 0; "
        "default kept"]
    assert problems[0].error


def test_keys_that_are_valid_together_are_kept_in_any_order(tmp_path: Path) -> None:
    """max_hold_s = 2 is below the default overdue_after_s, but not below the one after it."""
    path = _write(tmp_path, '[growth]\nmax_hold_s = 2\noverdue_after_s = 1.5\nmin_deny_s = 0.5\n')
    s, problems = settings.load(config.load(path))
    assert problems == []
    assert (s.growth.max_hold_s, s.growth.overdue_after_s, s.growth.min_deny_s) == (2, 1.5, 0.5)


def test_a_bad_top_level_value_and_a_bad_word_are_errors_at_their_lines(tmp_path: Path) -> None:
    path = _write(tmp_path, 'daemon_timeout_ms = "fast"\n[daemon]\n\ngate = "quick"\n')
    cfg = config.load(path)
    assert cfg.errors == (f"{path}:1: daemon_timeout_ms must be an integer; default kept",)
    _, problems = settings.load(cfg)
    assert [str(p) for p in problems] == [
        f"{path}:4: [daemon] gate: 'quick' is not auto, sched_ext, freeze or off; auto used"]


def test_config_check_exits_1_on_errors_and_0_on_warnings(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = _write(tmp_path, '[residency]\nidle_after_s = "soon"\n[swap]\nmode = "zraam"\n'
                           'colour = "blue"\n')
    assert ctl.main(["config", "check", bad]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out == [
        f"error: {bad}:2: [residency] idle_after_s: must be a number; default kept",
        f"error: {bad}:4: [swap] mode: 'zraam' is not one of auto, zram, zswap, off",
        f"warning: {bad}:5: [swap] unknown key 'colour' ignored",
        f"{bad}: 2 errors, 1 warning",
    ]
    fine = _write(tmp_path, "[estimate]\nbogus = 1\n")
    assert ctl.main(["--config", fine, "config", "check"]) == 0
    assert ctl.main(["config", "check", str(tmp_path / "none.toml")]) == 1
    assert "no such file" in capsys.readouterr().err


def test_a_file_that_does_not_parse_is_an_error(tmp_path: Path) -> None:
    errors, _ = config_check.problems(_write(tmp_path, "[daemon\n"))
    assert len(errors) == 1 and "line 1" in errors[0] and "using defaults" in errors[0]
