"""Parse runc's command line the way runc (Go's flag package under urfave/cli) does.

execgate must accept every spelling runc accepts (`-flag`, `--flag`, `=value` or a separate
value) and hand the untouched argv to the real runtime, so the parser only *reads*: it records
where the subcommand sits so that an intercepting handler can splice in extra flags.
"""

from __future__ import annotations

# runc 1.1's global flags. Unknown flags are tolerated (newer runc): they are assumed boolean.
GLOBAL_VALUE_FLAGS = frozenset({"log", "log-format", "root", "criu", "rootless"})
GLOBAL_BOOL_FLAGS = frozenset({"debug", "systemd-cgroup", "help", "h", "version", "v"})

# Per-subcommand flags that take a value (everything else is treated as boolean): runc 1.1's
# and those runc 1.2 and 1.3 added (`--pidfd-socket` on create, run and exec: go-runc passes
# it, and read as a boolean it made the socket's path the container id).
SUBCOMMAND_VALUE_FLAGS: dict[str, frozenset[str]] = {
    "create": frozenset({"bundle", "b", "console-socket", "pidfd-socket", "pid-file",
                         "preserve-fds"}),
    "run": frozenset({"bundle", "b", "console-socket", "pidfd-socket", "pid-file",
                      "preserve-fds"}),
    "exec": frozenset(
        {
            "console-socket", "pidfd-socket", "cwd", "env", "e", "user", "u",
            "additional-gids", "g", "process", "p", "pid-file", "process-label", "apparmor",
            "cap", "c", "preserve-fds", "cgroup",
        }
    ),
    "delete": frozenset(),
    "kill": frozenset(),
}
ALIASES = {"b": "bundle", "e": "env", "u": "user", "g": "additional-gids", "p": "process",
           "c": "cap", "t": "tty", "d": "detach", "f": "force", "a": "all", "h": "help",
           "v": "version"}


class Flags:
    """Flags by canonical long name; repeated flags keep every value, booleans store 'true'."""

    def __init__(self) -> None:
        self.values: dict[str, list[str]] = {}
        self.positionals: list[str] = []

    def get(self, name: str, default: str | None = None) -> str | None:
        vals = self.values.get(name)
        return vals[-1] if vals else default

    def is_set(self, name: str) -> bool:
        val = self.get(name)
        return val is not None and val.lower() not in ("false", "0")


def _split_flag(arg: str) -> tuple[str, str | None] | None:
    """'-x', '--x', '--x=v' -> (name, value); None for a non-flag."""
    if len(arg) < 2 or arg[0] != "-" or arg == "--":
        return None
    name = arg[2:] if arg.startswith("--") else arg[1:]
    if not name or name.startswith("-"):
        return None
    if "=" in name:
        name, value = name.split("=", 1)
        return name, value
    return name, None


def parse_flags(args: list[str], value_flags: frozenset[str], *, interspersed: bool = False
                ) -> tuple[Flags, int]:
    """Parse flags from the front of args (or from anywhere, if interspersed).

    Returns the flags and the index at which parsing stopped (the first positional when not
    interspersed, else len(args)).
    """
    flags = Flags()
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            flags.positionals.extend(args[i + 1:])
            return flags, len(args)
        split = _split_flag(arg)
        if split is None:
            if not interspersed:
                return flags, i
            flags.positionals.append(arg)
            i += 1
            continue
        name, value = split
        if value is None:
            if name in value_flags:
                if i + 1 >= len(args):
                    value = ""
                else:
                    i += 1
                    value = args[i]
            else:
                value = "true"
        flags.values.setdefault(ALIASES.get(name, name), []).append(value)
        i += 1
    return flags, i


class Invocation:
    """One call of the runtime: global flags, the subcommand and its own arguments."""

    def __init__(self, argv: list[str], globals: Flags, command: str | None,
                 command_index: int) -> None:
        self.argv = argv
        self.globals = globals
        self.command = command
        self.command_index = command_index  # index in argv of the subcommand (len(argv): none)

    @property
    def command_args(self) -> list[str]:
        return self.argv[self.command_index + 1:]

    def command_flags(self) -> Flags:
        """Flags of the subcommand. runc lets create/delete/kill take flags after the id."""
        cmd = self.command or ""
        interspersed = cmd in ("create", "run", "delete", "kill")
        flags, stop = parse_flags(self.command_args, SUBCOMMAND_VALUE_FLAGS.get(cmd, frozenset()),
                                  interspersed=interspersed)
        if not interspersed:
            flags.positionals = self.command_args[stop:]
        return flags

    def replace_command_flag(self, argv: list[str], name: str, value: str) -> list[str]:
        """argv (this invocation's, maybe already spliced) with the value of a subcommand flag
        replaced wherever it is spelled (`--f v`, `-f v`, `--f=v`); flags stop at the first
        positional, as runc's own parsing does."""
        out = list(argv)
        values = SUBCOMMAND_VALUE_FLAGS.get(self.command or "", frozenset())
        i = out.index(self.command, self.command_index) + 1 if self.command else len(out)
        while i < len(out):
            split = _split_flag(out[i])
            if split is None:
                break
            flag, inline = split
            if ALIASES.get(flag, flag) == name:
                if inline is not None:
                    out[i] = out[i].split("=", 1)[0] + "=" + value
                elif i + 1 < len(out):
                    out[i + 1] = value
            i += 2 if inline is None and flag in values else 1
        return out

    def with_command_flags(self, extra: list[str]) -> list[str]:
        """argv with extra flags placed right after the subcommand token."""
        i = self.command_index + 1
        return self.argv[:i] + extra + self.argv[i:]


def parse(argv: list[str]) -> Invocation:
    """argv without the program name."""
    flags, stop = parse_flags(argv, GLOBAL_VALUE_FLAGS)
    command = argv[stop] if stop < len(argv) else None
    return Invocation(argv=list(argv), globals=flags, command=command, command_index=stop)
