"""packaging/config.toml lists every key the code reads (set, or commented out as `# key =`),
nothing else, and its values are the defaults: the file cannot drift from the settings."""

import dataclasses
import re
from pathlib import Path

from execgate.common import config
from execgate.ctl import config_check, swap
from execgate.daemon import settings

SHIPPED = Path(__file__).resolve().parents[2] / "packaging" / "config.toml"


def _listed() -> set[tuple[str, str]]:
    """(table, key) of every key written in the file, set or commented out."""
    keys, table = set(), ""
    for line in SHIPPED.read_text().splitlines():
        if m := re.match(r"\[([a-z_]+)\]", line):
            table = m.group(1)
        elif m := re.match(r"(?:# )?([a-z0-9_]+) = ", line):
            keys.add((table, m.group(1)))
    return keys


def _read() -> set[tuple[str, str]]:
    """(table, key) of every key the code reads."""
    keys = {("", name) for name in config.SETTINGS}
    for table, cls in settings.TABLES.items():
        keys |= {(table, f.name) for f in dataclasses.fields(cls)}
    keys |= {("swap", key) for key in swap.CONFIG_KEYS}
    return keys


def test_every_key_is_listed_and_nothing_else() -> None:
    listed, read = _listed(), _read()
    assert sorted(read - listed) == [], "keys missing from packaging/config.toml"
    assert sorted(listed - read) == [], "keys in packaging/config.toml that nothing reads"


def test_the_tables_are_the_ones_the_code_reads() -> None:
    assert set(config.TABLES) == {*settings.TABLES, "swap"}


def test_the_shipped_file_checks_clean_and_sets_the_defaults() -> None:
    assert config_check.problems(str(SHIPPED)) == ([], [])
    cfg = config.load(str(SHIPPED))
    assert cfg == config.Config()
    assert settings.load(cfg)[0] == settings.load(config.Config())[0]
    for key, value in cfg.tables.get("swap", {}).items():
        assert swap.CONFIG_KEYS[key] == value
