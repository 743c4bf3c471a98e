"""An exec's process spec (runc exec --process FILE): the only place its command is."""

from __future__ import annotations

import json


class ProcessSpec:
    def __init__(self, args: list[str] | None = None, env: list[str] | None = None,
                 cwd: str = "", terminal: bool = False) -> None:
        self.args = args if args is not None else []
        self.env = env if env is not None else []
        self.cwd = cwd
        self.terminal = terminal

    def getenv(self, name: str) -> str | None:
        prefix = name + "="
        for item in reversed(self.env):  # the last definition wins, as in execve
            if item.startswith(prefix):
                return item[len(prefix):]
        return None


def load(path: str) -> ProcessSpec:
    with open(path) as f:
        spec = json.load(f)
    return ProcessSpec(
        args=[a for a in spec.get("args") or [] if isinstance(a, str)],
        env=[e for e in spec.get("env") or [] if isinstance(e, str)],
        cwd=spec.get("cwd") or "",
        terminal=bool(spec.get("terminal")),
    )
