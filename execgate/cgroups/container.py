"""The layout execgate gives a container's cgroup:

    <container cgroup>/            controllers cpu, memory, pids enabled for children; no tasks
        init/                      the container's init and everything it forks
        tool-<hex>/                one per tool call (a `docker exec`), removed when it ends

cgroup v2 forbids tasks in a cgroup that hands controllers to its children, so init must move
into a leaf before the controllers can be enabled. The container's own limits stay on the
parent and still bound the sum of init and every tool call.
"""

from __future__ import annotations

import errno
import os
import time

from . import v2

INIT = "init"
TOOL_PREFIX = "tool-"
FREEZE_WAIT_S = 1.0  # of prepare's timeout, the most spent waiting for the freeze


def prepare(cg: str, controllers: tuple[str, ...], timeout: float = 10.0) -> list[str]:
    """Move every task of the container cgroup into init/ and enable controllers.

    The container is frozen meanwhile, so nothing forks into the parent behind our back; a
    container the engine itself paused stays paused. Freezing is not instant: under load (many
    sandboxes starting at once, TCG) a task can still fork, or reach the cgroup, after a round
    of moves, and enabling controllers then fails with EBUSY (no tasks are allowed beside
    children with controllers). So it moves and retries until `timeout`, rather than giving the
    sandbox up as unmanaged over one late task. It waits for the freeze only FREEZE_WAIT_S: a
    task in direct reclaim (an init writing its baseline into a full host) freezes only once
    its allocation returns; a wait as long as the timeout left no time to move, and one
    sandbox of a 15x burst ran unmanaged (EBUSY). Moving needs no freeze: the freeze only
    keeps forks out, and a late fork is moved in the next round.
    """
    leaf = init_leaf(cg)
    os.makedirs(leaf, exist_ok=True)
    was_frozen = v2.read_int(cg, "cgroup.freeze") == 1
    if not was_frozen:
        v2.write(cg, "cgroup.freeze", "1")
    deadline = time.monotonic() + timeout
    try:
        v2.wait_event(cg, "frozen", 1, timeout=min(FREEZE_WAIT_S, timeout))
        while True:
            _move_tasks(cg, leaf, deadline)
            try:
                return v2.enable_controllers(cg, controllers)
            except OSError as e:
                if e.errno != errno.EBUSY or time.monotonic() >= deadline:
                    raise
                time.sleep(0.01)  # a task arrived after the last round: move it too
    finally:
        if not was_frozen:
            v2.write(cg, "cgroup.freeze", "0")


def _move_tasks(cg: str, leaf: str, deadline: float) -> None:
    """Move tasks from cg into leaf until none is left, or the deadline has passed after at
    least one round."""
    while True:
        pids = v2.procs(cg)
        if not pids:
            return
        for pid in pids:
            try:
                v2.move(pid, leaf)
            except ProcessLookupError:
                continue
        if time.monotonic() >= deadline:
            return


def init_leaf(cg: str) -> str:
    return os.path.join(cg, INIT)


def swap_max_value(value: object) -> str | None:
    """[residency] swap_max as memory.swap.max takes it: "max", a byte count ("512m", 0), or
    None for "" (nothing written: init/ has the container's limit, as before execgate wrote it).
    ValueError on anything else."""
    if value is None or value == "":
        return None
    if value == "max":
        return "max"
    if value == 0 or value == "0":
        return "0"
    from execgate.common.hints import parse_size

    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"swap_max must be \"max\", a size or 0, not {value!r}")
    return str(parse_size(value))


def set_swap_max(cg: str, value: str) -> None:
    """Let the sandbox's idle baseline swap (`init/`'s memory.swap.max), not its tool calls.

    Written on init/, not on the container's cgroup: that one is the engine's (`docker run
    --memory-swap`, `docker update` write it) and still bounds init/ and every call together.
    init/ holds what stays resident between calls — the agent framework, servers, an inside
    agent itself — which is exactly what residency pushes out with memory.reclaim while the
    agent waits on its model. Tool calls are left at the container's limit: a call that bursts
    wants RAM, and the kernel's LRU already keeps its fresh pages in over the idle baseline's;
    forbidding a call swap outright would turn a squeeze into an OOM kill (and a call held by
    the growth gate is exactly the memory that should go)."""
    v2.write(init_leaf(cg), "memory.swap.max", value)


def is_prepared(cg: str) -> bool:
    return os.path.isdir(init_leaf(cg))


def thaw_init(cg: str) -> bool:
    """Thaw init/ if execgate froze it (an idle sandbox under pressure); whether it was frozen.
    init/'s own cgroup.freeze is only ever ours: `docker pause` freezes the container's."""
    return v2.thaw(init_leaf(cg))


def new_tool_name() -> str:
    """A fresh tool-call name; 48 random bits keep it unique on the host, not just here."""
    return TOOL_PREFIX + os.urandom(6).hex()


def make_tool_cgroup(cg: str, name: str) -> str:
    """Create the call's cgroup. OOM kills inside it take the whole call, never half of it."""
    path = os.path.join(cg, name)
    os.mkdir(path)
    try:
        v2.write(path, "memory.oom.group", "1")
    except OSError:
        pass
    return path


GROUP_OOM_FLOOR = 16 << 20  # a contained call gets at least this much


def contain_group_oom(cg: str, tool: str) -> int | None:
    """Where the container's cgroup kills as a group (memory.oom.group = 1: Kubernetes >= 1.28
    sets it on every container), a call that runs the container out of memory would take the
    agent and init with it. Cap the call's own cgroup below what the container still has:
    memory.max = L - the container's anonymous memory now (the agent's, other calls') - a
    margin of max(16 MiB, 5 % of L), at least 16 MiB. Then the call reaches its own limit
    first and its OOM is its own (the kernel kills the group of the cgroup whose limit was hit,
    the tool cgroup). Returns the limit set, None where nothing was needed or possible."""
    if v2.read_int(cg, "memory.oom.group") != 1:
        return None
    limit = v2.read_int(cg, "memory.max")  # "max" reads as None: no container limit
    if limit is None:
        return None
    anon = v2.read_keyed(cg, "memory.stat").get("anon", 0)
    cap = max(limit - anon - max(16 << 20, limit // 20), GROUP_OOM_FLOOR)
    try:
        v2.write(tool, "memory.max", str(cap))
    except OSError:
        return None
    return cap


def tool_cgroups(cg: str) -> list[str]:
    try:
        return sorted(e.path for e in os.scandir(cg)
                      if e.name.startswith(TOOL_PREFIX) and e.is_dir(follow_symlinks=False))
    except OSError:
        return []


def remove_idle_tool_cgroups(cg: str) -> int:
    """rmdir every tool cgroup without tasks; returns how many remain (still in use)."""
    left = 0
    for tool in tool_cgroups(cg):
        if v2.populated(tool) or not v2.remove(tool, attempts=3):
            left += 1
    return left
