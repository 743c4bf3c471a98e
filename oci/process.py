"""An exec's process spec (runc exec --process FILE): the only place its command is."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field


@dataclass
class ProcessSpec:
    args: list[str] = field(default_factory=list)
    env: list[str] = field(default_factory=list)
    cwd: str = ""
    terminal: bool = False

    def getenv(self, name: str) -> str | None:
        prefix = name + "="
        for item in reversed(self.env):  # the last definition wins, as in execve
            if item.startswith(prefix):
                return item[len(prefix):]
        return None


def raise_oom_score_adj(path: str, value: int) -> bool:
    """Make runc start the process with at least this oom_score_adj (it applies the spec's
    `oomScoreAdj` before exec, so no allocation happens at the old value). True if changed."""
    with open(path) as f:
        spec = json.load(f)
    current = spec.get("oomScoreAdj")
    if isinstance(current, int) and current >= value:
        return False
    spec["oomScoreAdj"] = value
    tmp = f"{path}.execgate"
    with open(tmp, "w") as f:
        json.dump(spec, f)
    os.replace(tmp, path)
    return True


def load(path: str) -> ProcessSpec:
    with open(path) as f:
        spec = json.load(f)
    return ProcessSpec(
        args=[a for a in spec.get("args") or [] if isinstance(a, str)],
        env=[e for e in spec.get("env") or [] if isinstance(e, str)],
        cwd=spec.get("cwd") or "",
        terminal=bool(spec.get("terminal")),
    )
