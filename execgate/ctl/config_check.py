"""`execgatectl config check [PATH]`: every problem of a config file, at its line, before a
restart or a reload (SIGHUP) reads it. Errors are values refused (their defaults would be kept)
or a file that does not parse; warnings are keys and tables nothing reads. The exit status is 1
when there is an error, so `execgatectl config check && systemctl reload execgated` is safe."""

from __future__ import annotations

import os
import sys

from execgate.common import config as config_mod
from execgate.daemon import settings as settings_mod

from . import swap


def problems(path: str) -> tuple[list[str], list[str]]:
    """(errors, warnings) of the config file at path, each "path:line: what"."""
    cfg = config_mod.load(path)
    errors, warnings = list(cfg.errors), list(cfg.warnings)
    _, found = settings_mod.load(cfg)
    table = cfg.tables.get("swap")
    if isinstance(table, dict):
        report = settings_mod.Report()
        for key, text, error in swap.table_problems(table):
            (report.error if error else report.warn)("swap", key, text)
        found += report.problems(path)
    for problem in found:
        (errors if problem.error else warnings).append(problem)
    return errors, warnings


def main(path: str | None) -> int:
    path = path or os.environ.get("EXECGATE_CONFIG") or config_mod.DEFAULT_PATH
    if not os.path.exists(path):
        print(f"execgatectl: config check: {path}: no such file (the defaults would be used)",
              file=sys.stderr)
        return 1
    errors, warnings = problems(path)
    for e in errors:
        print(f"error: {e}")
    for w in warnings:
        print(f"warning: {w}")
    print(f"{path}: {len(errors)} error{'s' * (len(errors) != 1)}, "
          f"{len(warnings)} warning{'s' * (len(warnings) != 1)}")
    return 1 if errors else 0
