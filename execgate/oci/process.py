"""An exec's process spec (runc exec --process FILE): the only place its command is.

The file comes from the engine, but what is in it comes from whoever asked for the exec: any
JSON at all reads as a spec or raises ValueError, never anything else (a list where a map
belongs, a number for `args`, 100,000 nested arrays). runc itself refuses what is malformed.
"""

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


    def command_getenv(self, name: str) -> str | None:
        """What the command will see for name: an `env [-i] NAME=VALUE … cmd` prefix wins over
        the exec's environment. `kubectl exec` passes no environment of its own, so that prefix
        is how an agent in a pod declares a call (`kubectl exec P -- env AGENT_RESOURCE_HINT=…`);
        `env -i` starts from nothing, `-u NAME` drops one."""
        if not self.args or self.args[0].rsplit("/", 1)[-1] != "env":
            return self.getenv(name)
        value, prefix, args, i = self.getenv(name), name + "=", self.args, 1
        while i < len(args):
            arg = args[i]
            if arg in ("-i", "--ignore-environment", "-"):
                value = None
            elif arg in ("-u", "--unset") and i + 1 < len(args):
                value = None if args[i + 1] == name else value
                i += 1
            elif arg.startswith("-"):
                pass  # another option of env's (-0, -v): no NAME=VALUE of its own
            elif "=" in arg:
                if arg.startswith(prefix):
                    value = arg[len(prefix):]
            else:
                break  # the command
            i += 1
        return value


def _strings(spec: dict[str, object], key: str) -> list[str]:
    """The strings of a list field; anything else there reads as empty."""
    value = spec.get(key)
    return [a for a in value if isinstance(a, str)] if isinstance(value, list) else []


def parse(text: str | bytes) -> ProcessSpec:
    """A spec from the file's text; ValueError for anything that is not one."""
    try:
        spec = json.loads(text)
    except RecursionError as e:
        raise ValueError("process spec nested too deeply") from e
    if not isinstance(spec, dict):
        raise ValueError(f"process spec must be a JSON object, not {type(spec).__name__}")
    cwd = spec.get("cwd")
    return ProcessSpec(args=_strings(spec, "args"), env=_strings(spec, "env"),
                       cwd=cwd if isinstance(cwd, str) else "",
                       terminal=spec.get("terminal") is True)


def load(path: str) -> ProcessSpec:
    with open(path, "rb") as f:
        return parse(f.read())
