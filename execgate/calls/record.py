"""One tool call's record: what is known of it from arrival to its journal line.

A plain `__slots__` class, not a dataclass: `docker exec` builds one on its hot path, where
importing dataclasses (and typing) costs more than the call's own bookkeeping. Both front doors
build it (runtime/exec.py, daemon/inside/); the daemon's admit request and the journal line are
projections of it, so the two doors cannot drift apart.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing's, without importing typing on the exec path
if TYPE_CHECKING:
    from typing import Any

# What the daemon's `admit` op takes (docs/protocol.md).
ADMIT_KEYS = ("call", "container", "sandbox", "cgroup", "argv", "hint")
# The argv an admit request carries, in characters: enough to classify any command, and far
# below the daemon's 1 MiB request cap (an argv may be 2 MiB; the journal keeps it whole).
ADMIT_ARGV_CHARS = 64 << 10
# In the journal in this order; the optional ones only when known (not None).
_ALWAYS = ("call", "container", "sandbox", "cgroup", "argv", "tty", "detach", "hint")
_OPTIONAL = ("oom_score_adj", "hold_exit", "arrival", "managed", "unmanaged", "waited_s",
             "forced", "cgroup_id", "start", "inside", "adopted", "command_class")


class ToolCall:
    """A tool call: its identity and command, its admission, and where it came from.

    `daemon` (how the watcher tells the daemon the call is done) never reaches the journal;
    `inside` holds an inside agent's placement figures (daemon/inside/), None for docker exec.
    """

    __slots__ = ("adopted", "argv", "arrival", "call", "cgroup", "cgroup_id", "command_class",
                 "container", "daemon", "detach", "forced", "hint", "hold_exit", "inside",
                 "managed", "oom_score_adj", "redact", "sandbox", "start", "tty", "unmanaged",
                 "waited_s")

    def __init__(self, call: str, container: str, sandbox: str, cgroup: str, argv: list[str],
                 *, tty: bool = False, detach: bool = False,
                 hint: dict[str, Any] | None = None, oom_score_adj: int | None = None,
                 hold_exit: bool | None = None, arrival: float | None = None) -> None:
        self.call = call
        self.container = container
        self.sandbox = sandbox
        self.cgroup = cgroup
        self.argv = argv
        self.tty = tty
        self.detach = detach
        self.hint = hint
        self.oom_score_adj = oom_score_adj
        self.hold_exit = hold_exit  # hold a TTY call's exit for its note (None: the default)
        self.arrival = arrival
        self.managed: bool | None = None  # admitted by the daemon; None: not decided yet
        self.unmanaged: str | None = None  # why it runs without the daemon, when it does
        self.daemon: dict[str, Any] | None = None  # {"socket", "timeout_s"} for `done`
        self.waited_s: float | None = None
        self.forced: bool | None = None
        self.cgroup_id: int | None = None  # the tool cgroup's inode, to check an exit status
        self.start: float | None = None  # when it was let run; None: not yet
        self.inside: dict[str, Any] | None = None
        self.redact = False  # redact_commands: the journal keeps the program and its class
        self.command_class: str | None = None  # given with a redacted argv
        self.adopted: bool | None = None  # taken over from a previous daemon

    def admit_request(self) -> dict[str, Any]:
        """The fields of the daemon's `admit` op, argv cut to ADMIT_ARGV_CHARS."""
        msg = {k: getattr(self, k) for k in ADMIT_KEYS}
        argv, left = [], ADMIT_ARGV_CHARS
        for arg in self.argv:
            if left <= 0:
                break
            argv.append(arg[:left])
            left -= len(arg)
        msg["argv"] = argv
        return msg

    def admitted(self, managed: bool, waited_s: float = 0.0, forced: bool = False,
                 unmanaged: str | None = None) -> None:
        """The daemon's answer (or failing open: managed false, and why)."""
        self.managed = managed
        self.unmanaged = unmanaged
        self.waited_s = waited_s
        self.forced = forced

    def journal(self) -> dict[str, Any]:
        """Its part of the journal line (docs/protocol.md), also what a restart reads back."""
        out = {k: getattr(self, k) for k in _ALWAYS}
        for k in _OPTIONAL:
            value = getattr(self, k)
            if value is not None:
                out[k] = value
        if self.redact and self.argv:
            out["argv"], out["command_class"] = _redacted(self.argv)
        return out

    @classmethod
    def from_journal(cls, d: dict[str, Any]) -> ToolCall:
        """A record back from its journal form (an inside call's xattr, after a restart)."""
        c = cls(str(d.get("call") or ""), str(d.get("container") or ""),
                str(d.get("sandbox") or ""), str(d.get("cgroup") or ""), list(d.get("argv") or []))
        for k in _ALWAYS[5:] + _OPTIONAL:
            if k in d:
                setattr(c, k, d[k])
        return c


def _redacted(argv: list[str]) -> tuple[list[str], str]:
    """An argv as redact_commands journals it: its program's name, and its class (what the
    daemon learns by), without the arguments."""
    from execgate.common.commands import classify_command

    return [argv[0].rsplit("/", 1)[-1]], classify_command(argv)
