"""Sandbox cgroup files read at most once per LOOK_S, however many stages ask.

While a create waits, every control period asked each sandbox what it could give back three
times (the idle room, sandbox admission's snapshot, residency's step), each a memory.stat (an
rstat flush and ~60 formatted lines) and four swap files. Under TCG that was the daemon's
largest cost: 102 s of CPU in sandbox admission and 46 s in residency over an 869-second 15x
run, CPU the sandboxes' own starts did not get. An idle sandbox's memory changes when a call
starts in it (`forget`: it is active again), when the daemon reclaims it (`forget` after), or
when the kernel swaps it out under pressure, which a look a second old overstates by what moved
within that second; the idle room already re-measured at most once a second.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from execgate.cgroups import v2

from .cgfiles import KeptFiles

LOOK_S = 1.0  # a sandbox's files are read again once their last look is this old
# Limits (memory.swap.max) change when someone writes them, not when memory moves: read again
# this often, and kept across `forget`. Reading two per sandbox every second was a tenth of
# residency's CPU at the 15x burst.
LIMIT_LOOK_S = 30.0
LIMITS = frozenset({"memory.swap.max"})


@dataclass
class _Look:
    at: float
    text: str | None
    keyed: dict[str, int] | None = None


class Looks:
    """files: where the reads go (descriptors kept open: a pread, not an open, a read and a
    close; the engine's, so one bound covers every descriptor the daemon keeps)."""

    def __init__(self, clock: Callable[[], float], ttl_s: float = LOOK_S,
                 files: KeptFiles | None = None) -> None:
        self.clock = clock
        self.ttl_s = ttl_s
        self.files = KeptFiles() if files is None else files
        # cgroup -> name -> (when, content or None, the content parsed as flat keys, once)
        self._seen: dict[str, dict[str, _Look]] = {}

    def _look(self, cg: str, name: str) -> _Look:
        now = self.clock()
        files = self._seen.setdefault(cg, {})
        seen = files.get(name)
        if seen is not None and now - seen.at < (
                LIMIT_LOOK_S if name in LIMITS and seen.text is not None else self.ttl_s):
            return seen  # (a limit not read, say in a restart's gap, is looked for again soon)
        data = self.files.read(cg, name)
        look = files[name] = _Look(now, None if data is None else data.decode(errors="replace"))
        return look

    def text(self, cg: str, name: str) -> str | None:
        """The file's content as last seen within ttl_s, or read now; None when absent."""
        return self._look(cg, name).text

    def int(self, cg: str, name: str) -> int | None:
        text = self.text(cg, name)
        try:
            return None if text is None else int(text)
        except ValueError:
            return None

    def keyed(self, cg: str, name: str) -> dict[str, int]:
        """A flat-keyed file as a dict ({} if absent), as v2.read_keyed (not to be changed)."""
        look = self._look(cg, name)
        if look.keyed is None:
            look.keyed = {} if look.text is None else v2.parse_keyed(look.text)
        return look.keyed

    def forget(self, *cgroups: str) -> None:
        """Read these cgroups' memory files afresh at the next ask (their memory has just
        changed); their limits stay."""
        for cg in cgroups:
            files = self._seen.get(cg)
            if files:
                for name in [n for n, look in files.items()
                             if n not in LIMITS or look.text is None]:
                    del files[name]

    def keep_only(self, cgroups: set[str]) -> None:
        """Drop what was seen of cgroups no longer asked about (removed sandboxes), and close
        their descriptors."""
        for cg in set(self._seen) - cgroups:
            del self._seen[cg]
            self.files.forget(cg)
