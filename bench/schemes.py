"""The schemes the replay benchmark compares, and the pure pieces of the replay around them.

Everything here is deterministic and free of I/O so it can be unit-tested on any host; the
runner (bench/runner.py) adds Docker, cgroups and threads. Stdlib only: it runs in the test VM.

* `Scheme`: how one scheme sets up the host (runtime, daemon, AgentCgroup mode, hints) and
  which runner-side admission gate it uses. An ablation is a `replace()` of a base scheme plus a
  registry entry (see `_ABLATIONS`).
* The workload every scheme of a run replays: bench/workload.py.
* Runner-side gates: static-K slots and profiled-peak reservations, both strict FIFO.
* The execgate config a scheme needs (tomllib can read TOML but not write it).
"""

from __future__ import annotations

import dataclasses
import importlib
import json
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from bench.trace import Task, ToolCall
from bench.workload import hint_for
from execgate.common.units import MiB

# ---------------------------------------------------------------------------------------------
# Schemes

GATES = ("none", "static", "reserve")


@dataclass(frozen=True)
class Scheme:
    """One way of running the same tasks; the runner turns these fields into host state."""

    name: str
    runtime: str  # docker run --runtime
    daemon: bool  # execgated running, its domain = the benchmark's slice
    hints: bool  # tool calls carry AGENT_RESOURCE_HINT=memory:<profiled peak>
    memory_high_from_hint: bool = False  # AgentCgroup mode (top-level config key)
    gate: str = "none"  # runner-side admission of whole tasks
    k: int | None = None  # slots of the static gate
    # Extra config.toml tables for the daemon ({"growth": {"enabled": False}} for an ablation).
    daemon_tables: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    family: str = ""  # the base scheme's name ("static" for static-4); the report groups by it
    description: str = ""
    # Swap: a point runs every scheme with swap on, or every one with it off (sweep --swap).
    # needs_swap: runs only at swap-on points (eager+swap); uses_swap=False: the ablation that
    # keeps its sandboxes out of the swap the point has (execgate-noswap).
    needs_swap: bool = False
    uses_swap: bool = True

    def __post_init__(self) -> None:
        if self.gate not in GATES:
            raise ValueError(f"gate must be one of {', '.join(GATES)} (got {self.gate!r})")
        if (self.gate == "static") != (self.k is not None):
            raise ValueError("k is required by, and only by, the static gate")
        if self.k is not None and self.k < 1:
            raise ValueError("k must be >= 1")
        if not self.family:
            object.__setattr__(self, "family", self.name)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["daemon_tables"] = {k: dict(v) for k, v in self.daemon_tables.items()}
        return d

    def swap_at(self, point_swap: bool) -> bool | None:
        """Whether this scheme's sandboxes may swap at a point with swap on/off; None: the
        scheme does not run there (eager+swap without swap, -noswap where nothing swaps)."""
        if self.needs_swap and not point_swap:
            return None
        if not self.uses_swap and not point_swap:
            return None  # the same run as its base scheme
        return point_swap and self.uses_swap


EAGER = Scheme("eager", "runc", daemon=False, hints=False,
               description="runc, no control: tasks start on arrival, calls run at once")
# What a careful operator could set up alone: compressed swap under plain runc, no policy. At a
# swap-on point plain eager is this same run (the sweep runs it once, as eager+swap).
EAGER_SWAP = replace(EAGER, name="eager+swap", family="eager+swap", needs_swap=True,
                     description="runc, no control, compressed swap (zram, zstd) on")
STATIC = Scheme("static", "runc", daemon=False, hints=False, gate="static", k=1,
                description="runc, at most K tasks (sandboxes) at a time, FIFO")
RESERVE = Scheme("reserve", "runc", daemon=False, hints=False, gate="reserve",
                 description="runc, a task starts once its profiled peak fits the budget "
                             "beside the reservations of running tasks (FIFO)")
AGENTCGROUP = Scheme("agentcgroup", "execgate", daemon=False, hints=True,
                     memory_high_from_hint=True,
                     description="execgate runtime, hint -> memory.high of the call's cgroup, "
                                 "no admission (daemon stopped)")
EXECGATE = Scheme("execgate", "execgate", daemon=True, hints=True,
                  description="execgate runtime + execgated admitting calls in the slice")
NO_ADMISSION = Scheme("execgate-noadmit", "execgate", daemon=False, hints=True,
                      description="ablation: execgate runtime, daemon stopped (fail open)")

# Ablations of the full system: one line each (a `replace()` of EXECGATE and the config tables
# it changes).
NO_GROWTH = replace(EXECGATE, name="execgate-nogrowth", family="execgate-nogrowth",
                    daemon_tables={"daemon": {"gate": "off"}},
                    description="ablation: execgated admitting calls, growth gate off")
NO_RESIDENCY = replace(EXECGATE, name="execgate-noresidency", family="execgate-noresidency",
                       daemon_tables={"residency": {"enabled": False}},
                       description="ablation: execgated admitting calls, idle sandboxes left "
                                   "resident (no reclaim, no freeze)")
# [sandbox_admission] enabled: the runtime's create asks the daemon before a sandbox starts.
NO_SANDBOX_ADMISSION = replace(EXECGATE, name="execgate-nosandboxadmit",
                               family="execgate-nosandboxadmit",
                               daemon_tables={"sandbox_admission": {"enabled": False}},
                               description="ablation: execgated admitting calls, sandboxes "
                                           "start on arrival (no sandbox admission)")
# [residency] swap_max = 0 on the sandboxes, and the slice's memory.swap.max = 0: idle memory
# has nowhere to go though the point has swap.
NO_SWAP = replace(EXECGATE, name="execgate-noswap", family="execgate-noswap", uses_swap=False,
                  daemon_tables={"residency": {"swap_max": 0}},
                  description="ablation: execgated, its sandboxes kept out of swap "
                              "(memory.swap.max = 0) at a swap-on point")
# Sandbox admission as it was before 3 Dec: one call's room, not the live sandboxes' call
# load, and a baseline set aside only until the sandbox's first call.
ONE_CALL = replace(EXECGATE, name="execgate-onecall", family="execgate-onecall",
                   daemon_tables={"sandbox_admission": {"count_call_load": False,
                                                        "reserve_growth": False}},
                   description="ablation: sandbox admission sets aside one call's room and a "
                               "baseline until the first call (the rule before 3 Dec)")
# Sandbox admission before 6 Dec, night: any number of admitted creates under way at once.
NO_LAUNCH_BOUND = replace(EXECGATE, name="execgate-nolaunchbound",
                          family="execgate-nolaunchbound",
                          daemon_tables={"sandbox_admission": {"max_launching": 0}},
                          description="ablation: sandbox admission lets any number of admitted "
                                      "creates be under way at once (the rule before 6 Dec)")
_ABLATIONS: tuple[Scheme, ...] = (NO_ADMISSION, NO_GROWTH, NO_RESIDENCY, NO_SANDBOX_ADMISSION,
                                  NO_SWAP, ONE_CALL, NO_LAUNCH_BOUND)

SCHEMES: dict[str, Scheme] = {
    s.name: s for s in (EAGER, EAGER_SWAP, STATIC, RESERVE, AGENTCGROUP, EXECGATE, *_ABLATIONS)
}
DEFAULT_SCHEMES = ("eager,eager+swap,static,reserve,agentcgroup,execgate,execgate-noadmit,"
                   "execgate-nogrowth,execgate-noresidency,execgate-nosandboxadmit,"
                   "execgate-noswap")
# At a swap-on point these are the same run as the scheme named (it runs once, under that name).
_SAME_WITH_SWAP = {"eager": "eager+swap"}
DEFAULT_STATIC_K = (1, 2, 4, 8)


def schemes_at(schemes: Sequence[Scheme], swap: bool,
               ) -> tuple[list[tuple[Scheme, bool]], list[str]]:
    """The schemes a point with swap on/off runs, each with whether its sandboxes may swap,
    and why the others do not run there."""
    names = {s.name for s in schemes}
    runs: list[tuple[Scheme, bool]] = []
    skipped: list[str] = []
    for s in schemes:
        sw = s.swap_at(swap)
        if sw is None:
            skipped.append(f"{s.name}: needs a point with swap on" if s.needs_swap else
                           f"{s.name}: the same run as {s.family.removesuffix('-noswap')} "
                           "without swap")
        elif swap and _SAME_WITH_SWAP.get(s.name) in names:
            skipped.append(f"{s.name}: the same run as {_SAME_WITH_SWAP[s.name]} with swap on")
        else:
            runs.append((s, sw))
    return runs, skipped


def static_scheme(k: int) -> Scheme:
    return replace(STATIC, name=f"static-{k}", k=k, family="static")


def parse_schemes(spec: str, static_k: Sequence[int] = DEFAULT_STATIC_K,
                  n_tasks: int | None = None) -> list[Scheme]:
    """"eager,static,static-3,execgate" -> schemes; bare "static" sweeps `static_k` (capped at
    n_tasks: K beyond the task count is the same run as eager on runc); "all" = every scheme."""
    out: list[Scheme] = []
    names = [s.strip() for s in spec.split(",") if s.strip()]
    if names == ["all"]:
        names = list(SCHEMES)
    for name in names:
        if name == "static":
            ks = sorted({min(k, n_tasks) if n_tasks else k for k in static_k})
            if any(k < 1 for k in ks):
                raise ValueError("static K values must be >= 1")
            out.extend(static_scheme(k) for k in ks)
        elif name.startswith("static-"):
            try:
                k = int(name.removeprefix("static-"))
            except ValueError:
                raise ValueError(f"bad static scheme {name!r} (want static-<K>)") from None
            out.append(static_scheme(k))
        elif name in SCHEMES:
            out.append(SCHEMES[name])
        else:
            raise ValueError(f"unknown scheme {name!r}; known: {', '.join(SCHEMES)}, static-<K>")
    seen: set[str] = set()
    return [s for s in out if not (s.name in seen or seen.add(s.name))]


# ---------------------------------------------------------------------------------------------
# Runner-side admission of whole tasks


class Gate(Protocol):
    """Decides whether a task may start now; `demand` is its profiled peak in bytes."""

    def admit(self, task_id: str, demand: int) -> bool: ...

    def release(self, task_id: str) -> None: ...


class OpenGate:
    """No control: every task starts on arrival."""

    def admit(self, task_id: str, demand: int) -> bool:
        return True

    def release(self, task_id: str) -> None:
        pass


class SlotGate:
    """Static-K: at most k tasks hold a sandbox at once, however small they are."""

    def __init__(self, k: int) -> None:
        if k < 1:
            raise ValueError("k must be >= 1")
        self.k = k
        self.held: set[str] = set()

    def admit(self, task_id: str, demand: int) -> bool:
        if len(self.held) >= self.k:
            return False
        self.held.add(task_id)
        return True

    def release(self, task_id: str) -> None:
        self.held.discard(task_id)


class ReservationGate:
    """Each task reserves its profiled peak for its whole lifetime (retries included).

    A task larger than the whole budget is admitted only when nothing else is reserved: it can
    never fit, and refusing it forever would turn a sizing problem into a hang.
    """

    def __init__(self, budget: int) -> None:
        if budget <= 0:
            raise ValueError("budget must be > 0")
        self.budget = budget
        self.held: dict[str, int] = {}

    @property
    def reserved(self) -> int:
        return sum(self.held.values())

    def admit(self, task_id: str, demand: int) -> bool:
        if self.held and self.reserved + demand > self.budget:
            return False
        self.held[task_id] = demand
        return True

    def release(self, task_id: str) -> None:
        self.held.pop(task_id, None)


def make_gate(scheme: Scheme, budget: int) -> Gate:
    if scheme.gate == "static":
        assert scheme.k is not None
        return SlotGate(scheme.k)
    if scheme.gate == "reserve":
        return ReservationGate(budget)
    return OpenGate()


def admit_fifo(queue: deque[tuple[str, int]], gate: Gate) -> list[str]:
    """Start tasks from the head of the arrival queue while the gate lets them in. Strict FIFO
    (no backfilling): a big task at the head waits for room rather than starve behind small
    ones, which is how a reservation system keeps its latency bound."""
    started = []
    while queue and gate.admit(*queue[0]):
        started.append(queue.popleft()[0])
    return started


# ---------------------------------------------------------------------------------------------
# execgate's config for a scheme

# Tables whose absolute byte (and byte/s) tunables are scaled with the workload's memory, so the
# daemon sees a proportionally smaller world, not a 256 MiB safety margin in a 512 MiB domain.
_SCALED_TABLES = {
    "pressure": "execgate.policy.pressure:PressureConfig",
    "admission": "execgate.policy.admission:AdmissionConfig",
    "estimate": "execgate.policy.estimate:EstimateConfig",
    "growth": "execgate.policy.growth:GrowthConfig",
    "residency": "execgate.policy.residency:ResidencyConfig",
    # a sandbox's default baseline and next-call peak (256 MiB: 6x a scaled sandbox's)
    "sandbox_admission": "execgate.policy.sandbox_admission:SandboxAdmissionConfig",
}


def _byte_defaults() -> dict[str, dict[str, int | float]]:
    """{table: {field: default}} of the daemon's size-like tunables (missing modules skipped)."""
    out: dict[str, dict[str, int | float]] = {}
    for table, ref in _SCALED_TABLES.items():
        mod, _, cls = ref.partition(":")
        try:
            config_cls = getattr(importlib.import_module(mod), cls)
        except (ImportError, AttributeError):
            continue
        out[table] = {
            f.name: f.default for f in dataclasses.fields(config_cls)
            if f.name.endswith(("_bytes", "_bps")) and isinstance(f.default, int | float)
            and not isinstance(f.default, bool)
        }
    return out


def scaled_daemon_tables(current: Mapping[str, Any], mem_scale: float,
                         defaults: Mapping[str, Mapping[str, int | float]] | None = None,
                         ) -> dict[str, dict[str, int]]:
    """The daemon's byte tunables (as configured, else default) divided by `mem_scale`."""
    if mem_scale == 1:
        return {}
    defaults = _byte_defaults() if defaults is None else defaults
    out: dict[str, dict[str, int]] = {}
    for table, fields in defaults.items():
        have = current.get(table) if isinstance(current.get(table), dict) else {}
        for name, default in fields.items():
            value = have.get(name, default)
            if isinstance(value, str):  # "512m": sizes may be written like hints
                from execgate.common.hints import parse_size

                value = parse_size(value)
            if isinstance(value, int | float) and not isinstance(value, bool):
                out.setdefault(table, {})[name] = max(0, round(value / mem_scale))
    return out


def bench_config(original: Mapping[str, Any], scheme: Scheme, *, domain: str,
                 mem_scale: float = 1.0, admission_wait_s: float | None = None,
                 scale_daemon: bool = True,
                 defaults: Mapping[str, Mapping[str, int | float]] | None = None,
                 swap: bool | None = None,
                 ) -> dict[str, Any]:
    """The config.toml contents (as a dict) for running `scheme`: the original, plus the
    AgentCgroup switch (always written: a host left in that mode must not taint other schemes),
    plus, when the daemon runs, the slice as its domain and the scaled/ablation tables; at a
    point without swap (`swap` False), `[residency] swap_max = 0`, so the daemon does not count
    on swap the slice does not allow."""
    cfg: dict[str, Any] = json.loads(json.dumps(original))  # deep copy of plain TOML data
    cfg["memory_high_from_hint"] = scheme.memory_high_from_hint
    if not scheme.daemon:
        return cfg
    tables: list[Mapping[str, Mapping[str, Any]]] = [{"daemon": {"domain": domain}}]
    if scale_daemon:
        tables.append(scaled_daemon_tables(original, mem_scale, defaults))
    if admission_wait_s is not None:
        tables.append({"admission": {"max_admission_wait_s": float(admission_wait_s)}})
    if swap is False:
        tables.append({"residency": {"swap_max": 0}})
    tables.append(scheme.daemon_tables)
    for t in tables:
        for name, values in t.items():
            section = cfg.get(name)
            if not isinstance(section, dict):
                section = cfg[name] = {}
            section.update(values)
    return cfg


def slice_path(slice_name: str, root: str = "/sys/fs/cgroup") -> str:
    """Where systemd puts a slice: "a-b.slice" lives in a.slice/a-b.slice."""
    if not slice_name.endswith(".slice") or "/" in slice_name:
        raise ValueError(f"not a systemd slice name: {slice_name!r}")
    parts = slice_name.removesuffix(".slice").split("-")
    chain = ["-".join(parts[: i + 1]) + ".slice" for i in range(len(parts))]
    return "/".join([root.rstrip("/"), *chain])


def sandbox_command(task: Task, binary: str = "memload",
                    fill_ratio: float | None = None) -> list[str]:
    """The sandbox's init: it holds the agent framework's resident memory (task.baseline_bytes)
    for the task's lifetime, as the real framework would inside the container, filled with data
    of `fill_ratio` compressibility (None: memload's default)."""
    if task.baseline_bytes <= 0:
        return ["sleep", "inf"]
    mib = f"{task.baseline_bytes / MiB:.3f}"
    fill = ["--fill-ratio", f"{fill_ratio:g}"] if fill_ratio is not None else []
    return [binary, "--baseline-mib", mib, "--peak-mib", mib, "--shape", "plateau",
            "--peak-at", "1", "--duration", "10000000", "--tick-ms", "1000", *fill]


def call_env(call: ToolCall, hints: bool) -> list[str]:
    """The environment a tool call's exec carries: its resource hint, for schemes that give
    one, as an agent framework would set it."""
    return [f"AGENT_RESOURCE_HINT={hint_for(call)}"] if hints else []
