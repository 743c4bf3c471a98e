"""A call's AGENT_RESOURCE_HINT as admission uses it: parsed, clamped, a bad one told once.

Both front doors read the hint from a different place (the exec's process spec, an inside
call's /proc/PID/environ) and tell the agent on a different stream; what a hint means, and that
a malformed one is reported once per sandbox and value, is the same for both.
"""

from __future__ import annotations

import os

from execgate.cgroups import v2

TYPE_CHECKING = False  # typing's, without importing typing on the exec path
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any


def resolve(raw: str | None, cgroup: str, sandbox: str, state_dir: str,
            ignored: Callable[[str], None],
            tell: Callable[[str], None] | None) -> dict[str, Any] | None:
    """The parsed hint, clamped to the limit of the container at `cgroup`; None without one.

    A malformed hint is logged (`ignored(why)`) and, where the call has a stream for it
    (`tell`), reported to the agent the first time this sandbox sends this value.
    """
    if not raw:
        return None
    from execgate.common import hints  # only calls that carry a hint pay for parsing one

    parsed = hints.parse(raw)
    if parsed.error or parsed.hint is None:
        ignored(f"{hints.ENV_NAME} ignored: {parsed.error}")
        if tell is not None and hints.should_warn(state_dir, sandbox, raw):
            from . import feedback

            tell(feedback.hint_ignored(raw, parsed.error or "unparsable"))
        return None
    return hints.clamp(parsed.hint, priority_allowed=True,
                       memory_limit=memory_limit(cgroup)).to_dict()


def memory_limit(cgroup: str) -> int | None:
    """The most a call in the container at `cgroup` can ever use: the smallest memory.max of
    the container's cgroup and its ancestors (a domain slice's budget among them), and never
    more than the host's memory. No declaration is worth more: `mem=1000000000g` must not
    become a charge that stalls every neighbour."""
    limits = []
    path = cgroup
    while path and os.path.isfile(os.path.join(path, "memory.max")):
        value = v2.read_int(path, "memory.max")  # "max" reads as None: no limit here
        if value is not None:
            limits.append(value)
        path = os.path.dirname(path) if path != "/" else ""
    from execgate.common import meminfo

    try:
        limits.append(meminfo.read()["MemTotal"])
    except (OSError, ValueError, KeyError):
        pass
    return min(limits) if limits else None
