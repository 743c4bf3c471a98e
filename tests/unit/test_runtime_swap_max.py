"""[residency] swap_max: parsed once for the runtime and the daemon, written on a sandbox's init/
at start (temp-dir cgroupfs); a bad value is logged and writes nothing, never fails a start."""

from __future__ import annotations

from pathlib import Path

import pytest

from execgate.cgroups import container
from execgate.cgroups.sandbox import _swap_max as swap_max
from execgate.common.config import Config
from execgate.daemon import settings


@pytest.mark.parametrize(("raw", "value"), [
    ("max", "max"), (0, "0"), ("0", "0"), ("512m", str(512 << 20)), (1048576, "1048576"),
    ("", None), (None, None)])
def test_values(raw: object, value: str | None) -> None:
    assert container.swap_max_value(raw) == value


@pytest.mark.parametrize("raw", ["lots", -1, True, 1.5, ["max"]])
def test_bad_values(raw: object) -> None:
    with pytest.raises(ValueError):
        container.swap_max_value(raw)


class Log:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def warning(self, msg: str) -> None:
        self.lines.append(msg)


class Ctx:
    def __init__(self, tables: dict[str, dict[str, object]]) -> None:
        self.config = Config(tables=tables)
        self.log = Log()


def _swap_max(ctx: Ctx, cg: str) -> None:
    swap_max(ctx.config, cg, ctx.log)  # type: ignore[arg-type]


def _cg(tmp_path: Path) -> Path:
    cg = tmp_path / "ctr"
    (cg / "init").mkdir(parents=True)
    (cg / "init" / "memory.swap.max").write_text("max\n")
    (cg / "memory.swap.max").write_text("max\n")
    return cg


def test_written_on_init_not_on_the_containers_cgroup(tmp_path: Path) -> None:
    cg = _cg(tmp_path)
    ctx = Ctx({"residency": {"swap_max": "256m"}})
    _swap_max(ctx, str(cg))  # type: ignore[arg-type]
    assert (cg / "init" / "memory.swap.max").read_text() == str(256 << 20)
    assert (cg / "memory.swap.max").read_text() == "max\n"  # the engine's
    (cg / "init" / "memory.swap.max").write_text("")  # a regular file is not truncated by write
    _swap_max(Ctx({"residency": {"swap_max": 0}}), str(cg))  # type: ignore[arg-type]
    assert (cg / "init" / "memory.swap.max").read_text() == "0"
    (cg / "init" / "memory.swap.max").write_text("")
    _swap_max(Ctx({}), str(cg))  # type: ignore[arg-type]  # the default
    assert (cg / "init" / "memory.swap.max").read_text() == "max"


def test_unset_bad_or_unsupported_writes_nothing_and_never_fails(tmp_path: Path) -> None:
    cg = _cg(tmp_path)
    _swap_max(Ctx({"residency": {"swap_max": ""}}), str(cg))  # type: ignore[arg-type]
    assert (cg / "init" / "memory.swap.max").read_text() == "max\n"
    bad = Ctx({"residency": {"swap_max": "lots"}})
    _swap_max(bad, str(cg))  # type: ignore[arg-type]
    assert (cg / "init" / "memory.swap.max").read_text() == "max\n"
    assert "swap_max 'lots' not applied" in bad.log.lines[0]
    (cg / "init" / "memory.swap.max").unlink()  # no swap accounting in this kernel
    quiet = Ctx({})
    _swap_max(quiet, str(cg))  # type: ignore[arg-type]
    assert quiet.log.lines == []  # "max" is what it has anyway
    loud = Ctx({"residency": {"swap_max": "1g"}})
    _swap_max(loud, str(cg))  # type: ignore[arg-type]
    assert len(loud.log.lines) == 1


def test_daemon_settings_check_it_too() -> None:
    s, errors = settings.load(Config(tables={"residency": {"swap_max": 0}}))
    assert errors == [] and s.residency.swap_max == "0"
    s, errors = settings.load(Config(tables={"residency": {"swap_max": "lots"}}))
    assert s.residency.swap_max == "" and "swap_max" in errors[0]
    assert settings.load(Config())[0].residency.swap_max == "max"


def test_status_shows_where_a_sandboxs_memory_is(tmp_path: Path) -> None:
    """memory.swap.current and memory.stat's anon/zswap fields per live sandbox (status.py)."""
    from execgate.common import records
    from execgate.daemon import status

    cg = _cg(tmp_path)
    (cg / "memory.current").write_text(f"{20 << 20}\n")
    (cg / "memory.swap.current").write_text(f"{30 << 20}\n")
    (cg / "memory.stat").write_text(f"anon {12 << 20}\nfile {4 << 20}\nzswap 0\nshmem 0\n")
    state = tmp_path / "state"
    records.save_container(str(state), {"id": "c1", "managed": True, "cgroup": str(cg)})
    box = status.collect(Config(state_dir=str(state), journal=str(tmp_path / "j")))["sandboxes"][0]
    assert box["memory_swap_current"] == 30 << 20 and box["memory_anon"] == 12 << 20
    assert box["memory_file"] == 4 << 20 and box["memory_zswap"] == 0
    assert "memory_zswapped" not in box  # not in this kernel's memory.stat: left out
