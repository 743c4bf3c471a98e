"""bcc probes: OOM kills attributed to cgroups, and per-cgroup page-fault counts.

Observation only (the growth gate in gate.py is the actuator). ``probes.bcc.c`` is compiled by
bcc (python3-bpfcc, against the running kernel's headers) when :func:`load` runs, which takes
seconds on hardware and tens of seconds under emulation - so the daemon loads it in a
background thread (:class:`ProbeRunner`) and never waits for it. No bcc, no headers, no
tracepoint: the runner says why and the daemon goes on without probes.

* OOM kills: :meth:`Probes.poll` returns one :class:`OomKill` per ``oom:mark_victim``, with the
  victim's cgroup id read from its ``task_struct`` (not the current task's: the OOM killer runs
  in whichever task's allocation failed), the kernel timestamp and the RSS fields. The id is
  resolved to a cgroup path at once (:func:`resolve_cgroup`), while the victim still exists.
* Page faults: :meth:`Probes.faults` reads per-cgroup user page-fault counts and the busiest
  10 ms window since the previous read (``peak``: a burst between two 100 ms samples).

Runs as a script too: ``python3 -m execgate.bpf.probes [--seconds N]`` loads the probes, prints
the load time, OOM kills as JSON lines and the top faulting cgroups.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from execgate.cgroups.ids import cgroup_id, find_cgroup, own_cgroup

log = logging.getLogger("execgated")

SRC = Path(__file__).resolve().with_name("probes.bcc.c")
TRACEFS = ("/sys/kernel/tracing", "/sys/kernel/debug/tracing")
# oom:mark_victim fields copied into the event when present (the set changed across kernels:
# before 6.8 it was only `pid`).
OOM_FIELDS = ("comm", "total_vm", "anon_rss", "file_rss", "shmem_rss", "pgtables", "uid",
              "oom_score_adj")


# Kernel 7.x headers embed anonymous struct members (the kernel builds with -fms-extensions).
RAW_CFLAGS = ("-fms-extensions", "-Wno-microsoft-anon-tag", "-Wno-missing-declarations")


class ProbesUnavailable(RuntimeError):
    """bcc, kernel headers or a tracepoint is missing: run without probes."""


# -- what the kernel offers (pure, unit-tested) --------------------------------------------------


def parse_format(text: str) -> dict[str, str]:
    """A tracepoint's format file -> {field name: declaration}, common_* fields left out."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("field:"):
            continue
        decl = line.split(";", 1)[0][len("field:"):].strip()
        name = decl.split()[-1].split("[", 1)[0]
        if not name.startswith("common_"):
            fields[name] = decl
    return fields


def defines(oom_fields: dict[str, str], *, raw_victim: bool, faults: bool) -> list[str]:
    """The #defines prepended to probes.bcc.c for this kernel."""
    out = []
    for name in OOM_FIELDS:
        decl = oom_fields.get(name)
        if decl is None:
            continue
        if name == "comm" and "__data_loc" not in decl:
            continue  # the probe reads comm as a __data_loc string only
        out.append(f"#define HAS_{name} 1")
    if raw_victim:
        out.append("#define RAW_VICTIM 1")
    if faults:
        out.append("#define FAULTS 1")
    return out


def tracefs() -> str | None:
    for d in TRACEFS:
        if os.path.isdir(os.path.join(d, "events")):
            return d
    return None


def read_format(system: str, event: str) -> str | None:
    root = tracefs()
    if root is None:
        return None
    try:
        return Path(root, "events", system, event, "format").read_text()
    except OSError:
        return None


def raw_victim_supported(oom_fields: dict[str, str]) -> bool:
    """mark_victim's prototype became (struct task_struct *, uid_t) together with the uid field
    (6.8); before, its only argument was the pid and the raw tracepoint has no task to read."""
    return "uid" in oom_fields


# -- cgroup ids (the id is the inode of the cgroup2 directory: cgroups/ids.py) -----------------


def resolve_cgroup(cid: int, pid: int, known: Callable[[int], str | None] | None = None,
                   root: str = "/sys/fs/cgroup") -> tuple[str | None, str]:
    """cgroup id -> (path, how). Tried in order: the caller's index of cgroups it knows (which
    survives the cgroup's removal), the victim's /proc/<pid>/cgroup when its inode matches (the
    victim is dying: it may already be gone - the race), then a walk of cgroupfs."""
    if known is not None and cid:
        path = known(cid)
        if path:
            return path, "index"
    path = own_cgroup(root, pid)
    if path is not None:
        try:
            if not cid or cgroup_id(path) == cid:
                return path, "proc"
        except OSError:
            pass
    if cid:
        path = find_cgroup(cid, root)
        if path:
            return path, "walk"
    return None, "unresolved"


# -- the loaded program ------------------------------------------------------------------------


@dataclass
class OomKill:
    """One OOM victim. ktime_ns is CLOCK_MONOTONIC; time_us the same instant in wall-clock µs."""

    pid: int
    tgid: int | None
    comm: str
    cgroup_id: int  # the victim's; 0 when the kernel did not say (no raw tracepoint)
    cgroup: str | None
    resolved_by: str
    ktime_ns: int
    time_us: int
    trigger_pid: int
    trigger_cgroup_id: int
    total_vm_kb: int
    anon_rss_kb: int
    file_rss_kb: int
    shmem_rss_kb: int
    pgtables_kb: int
    uid: int
    oom_score_adj: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Faults:
    count: int  # user page faults of the cgroup since its first one (summed over CPUs)
    peak_10ms: int  # busiest 10 ms window since the previous read (on the busiest CPU)


def wall_us(ktime_ns: int) -> int:
    """CLOCK_MONOTONIC ns (bpf_ktime_get_ns) -> wall-clock µs, via the offset right now."""
    return (time.time_ns() - time.monotonic_ns() + ktime_ns) // 1000


class Probes:
    """The loaded bcc program. poll() from one thread; faults()/forget() from another is fine
    (each is a bpf(2) syscall on its own)."""

    def __init__(self, bpf: Any, *, raw_victim: bool, faults: bool, load_s: float) -> None:
        self.bpf = bpf
        self.raw_victim = raw_victim
        self.has_faults = faults
        self.load_s = load_s
        self._pending: list[OomKill] = []
        self._known: Callable[[int], str | None] | None = None
        self._epoch = 0
        self.lost = 0
        bpf["ooms"].open_perf_buffer(self._on_oom, page_cnt=16, lost_cb=self._on_lost)

    def _on_lost(self, n: int) -> None:
        self.lost += n
        log.warning("probes: %d OOM events lost", n)

    def _on_oom(self, _cpu: int, data: Any, _size: int) -> None:
        ev = self.bpf["ooms"].event(data)
        tgid, cid = None, 0
        if self.raw_victim:
            victims = self.bpf["victims"]
            key = victims.Key(ev.pid)
            with contextlib.suppress(KeyError):
                v = victims[key]
                tgid, cid = int(v.tgid), int(v.cgroup_id)
                del victims[key]
        path, how = resolve_cgroup(cid, int(ev.pid), self._known)
        if not cid and path:
            with contextlib.suppress(OSError):
                cid = cgroup_id(path)
        self._pending.append(OomKill(
            pid=int(ev.pid), tgid=tgid, comm=bytes(ev.comm).split(b"\0", 1)[0].decode(
                errors="replace"), cgroup_id=cid, cgroup=path, resolved_by=how,
            ktime_ns=int(ev.ts_ns), time_us=wall_us(int(ev.ts_ns)),
            trigger_pid=int(ev.trigger_pid), trigger_cgroup_id=int(ev.trigger_cgroup),
            total_vm_kb=int(ev.total_vm_kb), anon_rss_kb=int(ev.anon_rss_kb),
            file_rss_kb=int(ev.file_rss_kb), shmem_rss_kb=int(ev.shmem_rss_kb),
            pgtables_kb=int(ev.pgtables_kb), uid=int(ev.uid),
            oom_score_adj=int(ev.oom_score_adj)))

    def poll(self, timeout_ms: int = 500,
             known: Callable[[int], str | None] | None = None) -> list[OomKill]:
        """Wait up to timeout_ms for OOM kills; known(cgroup id) -> path is tried first."""
        self._known = known
        self._pending = []
        self.bpf.perf_buffer_poll(timeout=timeout_ms)
        return self._pending

    def faults(self, cgroup_ids: Iterable[int]) -> dict[int, Faults]:
        """Counts for the given cgroups (absent: no fault yet); starts a new peak window."""
        out: dict[int, Faults] = {}
        if not self.has_faults:
            return out
        table = self.bpf["faults"]
        for cid in cgroup_ids:
            try:
                per_cpu = table[table.Key(cid)]
            except KeyError:
                continue
            count = sum(int(v.count) for v in per_cpu)
            peak = max((int(v.peak) for v in per_cpu if int(v.epoch) == self._epoch), default=0)
            out[cid] = Faults(count, peak)
        self._epoch += 1
        ep = self.bpf["epoch"]
        ep[ep.Key(0)] = ep.Leaf(self._epoch)
        return out

    def forget(self, cgroup_ids: Iterable[int]) -> None:
        """Drop the counters of gone cgroups (the LRU map would evict them anyway)."""
        if not self.has_faults:
            return
        table = self.bpf["faults"]
        for cid in cgroup_ids:
            with contextlib.suppress(KeyError):
                del table[table.Key(cid)]

    def close(self) -> None:
        self.bpf.cleanup()


def load(src: Path = SRC) -> Probes:
    """Compile and attach (slow: clang runs inside bcc). Raises ProbesUnavailable."""
    try:
        import bcc  # python3-bpfcc: Debian/Ubuntu package, not on PyPI
    except ImportError as e:
        raise ProbesUnavailable(f"bcc not importable ({e}); install python3-bpfcc") from e
    fmt = read_format("oom", "mark_victim")
    if fmt is None:
        raise ProbesUnavailable("no oom:mark_victim tracepoint (tracefs not mounted?)")
    oom_fields = parse_format(fmt)
    has_faults = read_format("exceptions", "page_fault_user") is not None
    # The raw tracepoint needs kernel struct headers (cgroup.h, kernfs.h), the part most likely
    # not to compile against a new kernel: without it, the victim's cgroup comes from /proc.
    variants = [(True, list(RAW_CFLAGS))] if raw_victim_supported(oom_fields) else []
    variants.append((False, []))
    failures = []
    t0 = time.monotonic()
    for raw, cflags in variants:
        text = "\n".join([*defines(oom_fields, raw_victim=raw, faults=has_faults),
                          src.read_text()])
        try:
            bpf = bcc.BPF(text=text, cflags=cflags)
        except Exception as e:  # noqa: BLE001 - bcc raises bare Exceptions; details on stderr
            failures.append(f"{'with' if raw else 'without'} the victim-cgroup probe: {e}")
            log.warning("probes: bcc failed %s", failures[-1])
            continue
        return Probes(bpf, raw_victim=raw, faults=has_faults, load_s=time.monotonic() - t0)
    raise ProbesUnavailable("bcc could not compile or attach the probes (" +
                            "; ".join(failures) + ")")


# -- the daemon's side: load in the background, poll in a thread --------------------------------


@dataclass
class RunnerState:
    state: str = "off"  # off | loading | on | unavailable | failed
    reason: str = ""
    load_s: float | None = None
    features: dict[str, bool] = field(default_factory=dict)


class ProbeRunner:
    """Loads the probes in a background thread at low CPU priority (the daemon's socket and
    admission never wait for clang) and then polls OOM events there; kills are queued for the
    control loop, which drains them with :meth:`drain`."""

    def __init__(self, known: Callable[[int], str | None] | None = None,
                 loader: Callable[[], Probes] = load, backlog: int = 4096) -> None:
        self.known = known
        self.loader = loader
        self.status = RunnerState()
        self.fail_level = logging.WARNING  # the daemon raises it when probes were asked for
        self.probes: Probes | None = None
        self._kills: collections.deque[OomKill] = collections.deque(maxlen=backlog)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self.status = RunnerState("loading", "compiling with bcc")
        self._thread = threading.Thread(target=self._run, name="execgate-probes", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with contextlib.suppress(OSError):  # nice 19 for this thread only (Linux: per-thread)
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        t0 = time.monotonic()
        try:
            probes = self.loader()
        except ProbesUnavailable as e:
            self.status = RunnerState("unavailable", str(e), time.monotonic() - t0)
            log.log(self.fail_level, "probes unavailable, running without: %s", e)
            return
        except Exception as e:  # probes are optional, the daemon is not
            self.status = RunnerState("failed", f"{type(e).__name__}: {e}", time.monotonic() - t0)
            log.exception("probes failed to load, running without")
            return
        if self._stop.is_set():
            probes.close()
            return
        self.probes = probes
        self.status = RunnerState(
            "on", f"loaded in {probes.load_s:.1f} s", time.monotonic() - t0,
            {"oom_victim_cgroup": probes.raw_victim, "page_faults": probes.has_faults})
        log.info("probes on: OOM kills%s, page faults %s (bcc load %.1f s)",
                 " with victim cgroups" if probes.raw_victim else " (victim cgroup from /proc)",
                 "counted" if probes.has_faults else "unavailable", probes.load_s)
        while not self._stop.is_set():
            try:
                self._kills.extend(probes.poll(200, self.known))
            except Exception as e:  # noqa: BLE001
                log.warning("probes poll: %s", e)
                self._stop.wait(1.0)

    def drain(self) -> list[OomKill]:
        out = []
        while self._kills:
            out.append(self._kills.popleft())
        return out

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if self.probes is not None:
            with contextlib.suppress(Exception):
                self.probes.close()
            self.probes = None


# -- CLI -----------------------------------------------------------------------------------------


def _top_faults(probes: Probes, n: int = 10) -> list[tuple[int, int]]:
    if not probes.has_faults:
        return []
    counts = {int(k.value): sum(int(v.count) for v in vals)
              for k, vals in probes.bpf["faults"].items()}
    return sorted(counts.items(), key=lambda kv: -kv[1])[:n]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="execgate-probes", description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="how long to watch")
    args = parser.parse_args(argv)
    t0 = time.monotonic()
    try:
        probes = load()
    except ProbesUnavailable as e:
        print(json.dumps({"loaded": False, "reason": str(e)}))
        return 1
    print(json.dumps({"loaded": True, "load_s": round(time.monotonic() - t0, 2),
                      "compile_s": round(probes.load_s, 2), "raw_victim": probes.raw_victim,
                      "faults": probes.has_faults}), flush=True)
    end = time.monotonic() + args.seconds
    with contextlib.suppress(KeyboardInterrupt):  # ^C ends the watch early, counts still shown
        while time.monotonic() < end:
            for kill in probes.poll(200):
                print(json.dumps({"oom_kill": kill.as_dict()}), flush=True)
    for cid, count in _top_faults(probes):
        print(json.dumps({"cgroup_id": cid, "faults": count,
                          "cgroup": find_cgroup(cid)}), flush=True)
    probes.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
