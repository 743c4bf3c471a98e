"""The growth gate's sched_ext scheduler: holds denied tool-call cgroups, releases allowed ones.

:class:`Gate` drives the scheduler in ``gate.bpf.c``. Denied cgroups' runnable tasks are parked
in a held dispatch queue (they get no CPU, so their next allocations wait) and moved back when
allowed. Verdicts go into a BPF hash map keyed by cgroup id (cgroups/ids.py), written directly
with the bpf(2) syscall through ctypes: one syscall per ``set``, no process spawned. Where
sched_ext is absent the daemon uses cgroup.freeze instead (daemon/actuator.py, which chooses).

:func:`recover` undoes what a dead daemon left behind (this gate's pins and deny entries, and
the fallback's frozen tool cgroups). Stdlib + ctypes only; ``bpftool`` and ``clang`` build and
load (loader.py). Runs as a command too (gate_cli.py): ``python3 -m execgate.bpf.gate --help``.

Lifetime of the scheduler (``load(persist=...)``):

* ``persist=False`` (default, the safe one): ``bpftool struct_ops register`` pins the struct_ops
  link, the loader opens it and removes the pin, so the loading process's file descriptor is the
  only reference. When that process exits - including ``kill -9`` - the kernel closes the fd,
  the link goes away and sched_ext unloads the scheduler: every held task returns to the fair
  class and nothing stays held (its SCHED_EXT policy stays until :func:`recover` resets it: the
  kernel runs SCHED_EXT tasks on the fair class while no BPF scheduler is loaded). (A child
  forked without exec inherits the fd and keeps it alive.)
* ``persist=True``: the link stays pinned under ``pin_dir`` and the scheduler outlives the
  loader, *with its deny entries*: held tasks then only get a slice per hold cap (20 s) until
  :func:`recover` clears the map or unloads. Use it only when something restarts the loader.

Maps are pinned under ``pin_dir`` in both modes (``deny``, ``cfg``, ``stat``, ``timer``) so
tools can inspect a running gate; :func:`recover` removes stale ones.
"""

from __future__ import annotations

import contextlib
import os
import struct
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from execgate.bpf import loader
from execgate.bpf import syscall as _sys
from execgate.bpf.loader import BPFFS, DEFAULT_BUILD_DIR
from execgate.bpf.scx import SCX_SYSFS, scheduler_name, state, wait_state
from execgate.cgroups import sched_policy
from execgate.cgroups.freeze import thaw_all
from execgate.cgroups.ids import (
    CGROUP_ROOT,
    CgroupRef,
    cgroup_id,
    cgroup_path,
    find_cgroup,
    protected_ids,
)

# The gate's map client (re-exported: tests and tools use them from here).
BPF_ANY, BpfMap, MapInfo = _sys.BPF_ANY, _sys.BpfMap, _sys.MapInfo
obj_get, obj_info, obj_pin = _sys.obj_get, _sys.obj_info, _sys.obj_pin
_attr, _syscall_bpf = _sys._attr, _sys._syscall_bpf

SRC = Path(__file__).resolve().with_name("gate.bpf.c")
SCHED_NAME = "execgate"  # sched_ext_ops.name in gate.bpf.c
DEFAULT_PIN_DIR = "/sys/fs/bpf/execgate"

# Pinned objects: libbpf pins each map at BPFFS/<map name> (LIBBPF_PIN_BY_NAME); the loader
# moves them to pin_dir/<short name>. bpftool pins the link at pin_dir/<struct_ops var name>.
MAP_NAMES = {"deny": "execgate_deny", "cfg": "execgate_cfg", "stat": "execgate_stat",
             "timer": "execgate_timer"}
LINK_PIN = "gate_ops"

# The hold cap (see gate.bpf.c): a parked task runs one slice at least this often. sched_ext's
# watchdog ejects the scheduler past 30 s; the BPF side clamps to 25 s as well.
DEFAULT_HOLD_CAP_S = 20.0
MAX_HOLD_CAP_S = 25.0
DEFAULT_SCAN_MS = 10.0

# The loader's errors, by the gate's names: a build or load failure is a GateError.
GateError = loader.BpfError
GateUnavailable = loader.BpfUnavailable


class GateBusy(GateError):
    """A sched_ext scheduler (another one, or a stale execgate) is already loaded."""


# ---------------------------------------------------------------------------------------------
# Map layouts (mirror gate.bpf.c)
# ---------------------------------------------------------------------------------------------

GATE_DENY = 1
_DENY_KEY = struct.Struct("=Q")
_DENY_VALUE = struct.Struct("=I")
_CFG = struct.Struct("=QQ")  # struct gate_cfg
_STAT = struct.Struct("=7Q2q128s256s")  # struct gate_stat


@dataclass(frozen=True)
class GateStats:
    """Counters from the scheduler (struct gate_stat)."""

    parked: int  # enqueues into the held queue (re-parks count again)
    released: int  # moved back because their cgroup was allowed
    capped: int  # moved back by the hold cap
    killed: int  # moved back because SIGKILL was pending or the task was exiting
    scans: int  # walks of the held queue
    held: int  # tasks in the held queue at the last park or scan
    exited: bool  # ops.exit() ran: the scheduler is gone (unloaded or ejected)
    exit_kind: int  # enum scx_exit_kind (64 = unregistered, 1026 = watchdog stall, ...)
    exit_code: int
    exit_reason: str
    exit_msg: str

    @classmethod
    def parse(cls, raw: bytes) -> GateStats:
        (parked, released, capped, killed, scans, held, exited, kind, code, reason,
         msg) = _STAT.unpack_from(raw)
        text = lambda b: b.split(b"\0", 1)[0].decode(errors="replace")  # noqa: E731
        return cls(parked, released, capped, killed, scans, held, bool(exited), kind, code,
                   text(reason), text(msg))


# ---------------------------------------------------------------------------------------------
# Build (loader.py's, for gate.bpf.c)
# ---------------------------------------------------------------------------------------------

def build(out_dir: str | os.PathLike[str] = DEFAULT_BUILD_DIR, *, force: bool = False,
          **opts: Any) -> Path:
    """``gate.bpf.o`` for the running kernel, cached (see loader.build; ``opts``: clang,
    bpftool, btf, timeout)."""
    return loader.build(out_dir, src=SRC, force=force, **opts)


# ---------------------------------------------------------------------------------------------
# Load / unload
# ---------------------------------------------------------------------------------------------

def _remove_pins(pin_dir: str, *, link: bool = True) -> list[str]:
    """Removes execgate's pins (and only those) from pin_dir and libbpf's by-name spots."""
    names = [os.path.join(pin_dir, short) for short in MAP_NAMES]
    names += [os.path.join(BPFFS, full) for full in MAP_NAMES.values()]
    if link:
        names.append(os.path.join(pin_dir, LINK_PIN))
    return loader.remove_pins(names, pin_dir)


def load(obj: str | os.PathLike[str], pin_dir: str = DEFAULT_PIN_DIR, *, persist: bool = False,
         hold_cap_s: float = DEFAULT_HOLD_CAP_S, scan_ms: float = DEFAULT_SCAN_MS,
         bpftool: str = "bpftool", cgroup_root: str = CGROUP_ROOT, sysfs: str = SCX_SYSFS,
         timeout: float = 120.0) -> Gate:
    """Loads the scheduler (``bpftool struct_ops register``) and returns its :class:`Gate`.

    A partial switch: it schedules only SCHED_EXT tasks, which :meth:`Gate.set` makes of a
    denied cgroup's tasks; everything else stays on the fair class.
    See the module doc for ``persist``. Raises :class:`GateUnavailable` (no sched_ext/bpffs/
    tools), :class:`GateBusy` (a scheduler is already loaded: see :func:`recover`) or
    :class:`GateError` (the build or the verifier said no: the message has bpftool's log)."""
    st = state(sysfs)
    if st in ("enabling", "disabling"):  # a scheduler going away (a daemon restart): wait
        st = wait_state({"enabled", "disabled"}, 10, sysfs)
    if st == "unsupported":
        raise GateUnavailable(f"kernel has no sched_ext ({sysfs} missing)")
    if st != "disabled":
        raise GateBusy(f"sched_ext is {st} with scheduler {scheduler_name(sysfs)!r}")
    _check_cfg(hold_cap_s, scan_ms)
    loader.ensure_bpffs()
    _remove_pins(pin_dir)  # stale pins of an earlier run would be reused by libbpf
    os.makedirs(pin_dir, exist_ok=True)

    try:
        loader.run([bpftool, "struct_ops", "register", os.fspath(obj), pin_dir], timeout=timeout)
    except GateError:
        _remove_pins(pin_dir)
        raise
    maps: dict[str, BpfMap] = {}
    link_fd = -1
    try:
        for short, full in MAP_NAMES.items():
            by_name = os.path.join(BPFFS, full)
            maps[short] = BpfMap.open(by_name)
            dest = os.path.join(pin_dir, short)
            loader.unlink(dest)
            obj_pin(maps[short].fd, dest)
            loader.unlink(by_name)
        link_path = os.path.join(pin_dir, LINK_PIN)
        link_fd = obj_get(link_path)
        if not persist:
            os.unlink(link_path)  # our fd is now the scheduler's only anchor
        gate = Gate(pin_dir, maps, link_fd, persist=persist, cgroup_root=cgroup_root,
                    sysfs=sysfs)
    except BaseException:
        _remove_pins(pin_dir)
        if link_fd >= 0:
            os.close(link_fd)
        for m in maps.values():
            m.close()
        wait_state({"disabled"}, 10, sysfs)
        raise
    gate.configure(hold_cap_s=hold_cap_s, scan_ms=scan_ms)
    if wait_state({"enabled"}, 10, sysfs) != "enabled" or not gate.attached():
        reason = gate.exit_reason()
        gate.unload()
        raise GateError(f"scheduler did not stay enabled: {reason}")
    return gate


def _check_cfg(hold_cap_s: float, scan_ms: float) -> None:
    if not 0 < hold_cap_s <= MAX_HOLD_CAP_S:
        raise ValueError(f"hold_cap_s must be in (0, {MAX_HOLD_CAP_S}] (watchdog: 30 s)")
    if not 1 <= scan_ms <= 1000:
        raise ValueError("scan_ms must be in [1, 1000]")


class Gate:
    """A loaded sched_ext gate. ``set(cgroup, allow=False)`` holds the cgroup's tasks (and
    those of every cgroup below it): its id goes into the deny map, then its tasks get
    SCHED_EXT (cgroups/sched_policy.py), which puts them under the scheduler, parked.
    ``set(cgroup, allow=True)`` gives them their own policy back (they leave the scheduler at
    once) and drops the id. Not thread-safe; one per process."""

    kind = "sched_ext"

    def __init__(self, pin_dir: str, maps: dict[str, BpfMap], link_fd: int = -1, *,
                 persist: bool = False, cgroup_root: str = CGROUP_ROOT,
                 sysfs: str = SCX_SYSFS) -> None:
        self.pin_dir = pin_dir
        self.persist = persist
        self.cgroup_root = cgroup_root
        self.sysfs = sysfs
        self._maps = maps
        self._link_fd = link_fd
        self._closed = False
        self._ids: dict[str, int] = {}  # path -> id of denied cgroups (for allow after rmdir)
        # denied id -> (its path, the policies its switched tasks had)
        self._switched: dict[int, tuple[str, dict[int, int]]] = {}
        self.switch_failed = 0  # tasks that could not be given SCHED_EXT (so not held)
        self._protected = protected_ids(cgroup_root)
        info = maps["deny"].info
        if (info.key_size, info.value_size) != (_DENY_KEY.size, _DENY_VALUE.size):
            raise GateError(f"map {info.name!r} is not execgate's deny map")

    @classmethod
    def open(cls, pin_dir: str = DEFAULT_PIN_DIR, *, cgroup_root: str = CGROUP_ROOT,
             sysfs: str = SCX_SYSFS) -> Gate:
        """Attaches to a scheduler loaded (persist=True) by another process, by its pins."""
        maps: dict[str, BpfMap] = {}
        try:
            for short in ("deny", "cfg", "stat"):
                maps[short] = BpfMap.open(os.path.join(pin_dir, short))
        except FileNotFoundError as e:
            for m in maps.values():
                m.close()
            raise GateError(f"no execgate gate pinned at {pin_dir}") from e
        link = os.path.join(pin_dir, LINK_PIN)
        return cls(pin_dir, maps, -1, persist=os.path.exists(link), cgroup_root=cgroup_root,
                   sysfs=sysfs)

    # -- verdicts ---------------------------------------------------------------------------

    def set(self, cg: CgroupRef, allow: bool) -> bool:
        """Allows or denies a cgroup (id, absolute path, or path under the cgroup root).
        Returns False when there was nothing to do: denying a cgroup that no longer exists, or
        allowing one that was not denied."""
        self._check_open()
        path = None if isinstance(cg, int) else cgroup_path(cg, self.cgroup_root)
        try:
            cid = cgroup_id(cg, self.cgroup_root)
        except FileNotFoundError:
            if not allow and path is not None:
                return False  # the call ended meanwhile: nothing to hold
            cid = self._ids.get(path) if path is not None else None
            if cid is None:
                return False
        key = _DENY_KEY.pack(cid)
        if allow:
            if path is not None:
                self._ids.pop(path, None)
            self._restore(cid, path)  # first: a task back on the fair class runs at once
            return self._maps["deny"].delete(key)
        if cid in self._protected:
            raise ValueError(f"refusing to deny cgroup {cg!r}: it holds this process "
                             "(or it is the root)")
        self._maps["deny"].update(key, _DENY_VALUE.pack(GATE_DENY))
        if path is not None:
            self._ids[path] = cid
        where = None if not self._running() else path or find_cgroup(cid, self.cgroup_root)
        if where is not None:  # second: a task entering the scheduler must find the entry
            saved = self._switched.setdefault(cid, (where, {}))[1]
            self.switch_failed += sched_policy.to_ext(where, saved)[1]
        return True

    def _running(self) -> bool:
        """Is the loaded sched_ext scheduler execgate's? Tasks are never given SCHED_EXT for
        another one (loaded after an ejection, before the daemon noticed)."""
        return state(self.sysfs) == "enabled" and scheduler_name(self.sysfs) == SCHED_NAME

    def _restore(self, cid: int, path: str | None = None) -> None:
        """The denied cgroup's tasks back to their own policy (by path also when this handle
        did not switch them: a gate adopted with :meth:`open`)."""
        where, saved = self._switched.pop(cid, (path, {}))
        if where is not None:
            sched_policy.restore(where, saved)

    def deny(self, cg: CgroupRef) -> bool:
        return self.set(cg, allow=False)

    def allow(self, cg: CgroupRef) -> bool:
        return self.set(cg, allow=True)

    def denied(self) -> list[int]:
        """Ids of the cgroups denied right now."""
        self._check_open()
        return sorted(_DENY_KEY.unpack(k)[0] for k in self._maps["deny"].iter_keys())

    def clear(self) -> int:
        """Allows everything; returns how many cgroups were denied."""
        self._check_open()
        for cid in list(self._switched):
            self._restore(cid)
        n = _clear_map(self._maps["deny"])
        self._ids.clear()
        return n

    # -- health ------------------------------------------------------------------------------

    def stats(self) -> GateStats:
        raw = self._maps["stat"].lookup(struct.pack("=I", 0))
        if raw is None:
            raise GateError("stat map has no entry")
        return GateStats.parse(raw)

    def attached(self) -> bool:
        """True while this gate's scheduler is the one sched_ext runs. False once unloaded or
        ejected by the kernel (watchdog stall, BPF error): then nothing is held, and
        :meth:`exit_reason` tells why."""
        if self._closed or state(self.sysfs) != "enabled":
            return False
        name = scheduler_name(self.sysfs)
        if name is not None and name != SCHED_NAME:
            return False
        try:
            return not self.stats().exited
        except (OSError, GateError):
            return False

    def exit_reason(self) -> str | None:
        """None while attached; else why the scheduler is gone."""
        if self.attached():
            return None
        with contextlib.suppress(OSError, GateError, ValueError):
            s = self.stats()
            if s.exited:
                msg = f": {s.exit_msg}" if s.exit_msg else ""
                return f"{s.exit_reason or 'exited'} (kind {s.exit_kind}){msg}"
        return f"sched_ext state is {state(self.sysfs)}"

    def configure(self, *, hold_cap_s: float | None = None, scan_ms: float | None = None) -> None:
        """Sets the hold cap and the held-queue scan period (None keeps the BPF default)."""
        self._check_open()
        _check_cfg(hold_cap_s or DEFAULT_HOLD_CAP_S, scan_ms or DEFAULT_SCAN_MS)
        cfg = _CFG.pack(int((hold_cap_s or 0) * 1e9), int((scan_ms or 0) * 1e6))
        self._maps["cfg"].update(struct.pack("=I", 0), cfg)

    # -- lifetime ----------------------------------------------------------------------------

    def unload(self, timeout: float = 10.0) -> bool:
        """Unloads the scheduler: clears the deny map, drops the link (pin and fd), waits for
        sched_ext to return every task to the fair class, removes the map pins. Safe to call
        again. Returns False if the scheduler stayed loaded (another process holds the link)."""
        if self._closed:
            return True
        with contextlib.suppress(OSError):
            self.clear()
        self._closed = True
        link_pin = os.path.join(self.pin_dir, LINK_PIN)
        had_link = self._link_fd >= 0 or os.path.exists(link_pin)
        loader.unlink(link_pin)
        if self._link_fd >= 0:
            os.close(self._link_fd)
            self._link_fd = -1
        gone = True
        if had_link:
            # The link's release unregisters the scheduler; sched_ext then moves every task
            # (held ones included) back to the fair class. Wait for *this* instance's ops.exit()
            # (a new gate may already be loaded, e.g. after an ejection).
            gone = _wait_exited(self._maps["stat"], timeout, self.sysfs)
        _remove_own_pins(self.pin_dir, self._maps)
        for m in self._maps.values():
            m.close()
        return gone

    close = unload

    def detach(self) -> None:
        """Closes this handle without unloading: a persistent (pinned) scheduler keeps running
        with its deny entries. For an owned gate this drops the only link reference, which
        unloads the scheduler."""
        if self._closed:
            return
        self._closed = True
        if self._link_fd >= 0:
            os.close(self._link_fd)
            self._link_fd = -1
        for m in self._maps.values():
            m.close()

    def __enter__(self) -> Gate:
        return self

    def __exit__(self, *exc: object) -> None:
        self.unload()

    def _check_open(self) -> None:
        if self._closed:
            raise GateError("gate unloaded")

    def __repr__(self) -> str:
        mode = "persistent" if self.persist else "owned"
        return f"<Gate sched_ext {mode} pins={self.pin_dir} closed={self._closed}>"


def _exited(stat: BpfMap) -> bool:
    try:
        raw = stat.lookup(struct.pack("=I", 0))
    except OSError:
        return False
    return raw is not None and GateStats.parse(raw).exited


def _wait_exited(stat: BpfMap, timeout: float, sysfs: str = SCX_SYSFS) -> bool:
    """Waits until the scheduler owning ``stat`` ran ops.exit() (or sched_ext is off)."""
    deadline = time.monotonic() + timeout
    while not (_exited(stat) or state(sysfs) in ("disabled", "unsupported")):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


def _remove_own_pins(pin_dir: str, maps: dict[str, BpfMap]) -> None:
    """Unpins pin_dir/<name> only where it is still one of ``maps`` (same map id): a gate
    loaded later into the same pin_dir keeps its pins."""
    for short, m in maps.items():
        path = os.path.join(pin_dir, short)
        try:
            other = BpfMap.open(path)
        except OSError:
            continue
        try:
            if other.info.id == m.info.id:
                loader.unlink(path)
        finally:
            other.close()
    with contextlib.suppress(OSError):
        os.rmdir(pin_dir)


def _clear_map(m: BpfMap) -> int:
    n = 0
    for k in list(m.iter_keys()):
        n += m.delete(k)
    return n


# ---------------------------------------------------------------------------------------------
# Recovery
# ---------------------------------------------------------------------------------------------

def recover(pin_dir: str = DEFAULT_PIN_DIR, *, unload: bool = True,
            cgroup_root: str = CGROUP_ROOT, thaw: str | None = "tool-*",
            sysfs: str = SCX_SYSFS, timeout: float = 10.0) -> str:
    """Undoes what a dead loader left behind, so that nothing stays held; the daemon calls it
    on start. Clears the pinned deny map (held tasks run again within a scan period), then,
    with ``unload``, removes the pinned link (a persist=True scheduler unloads) and the map
    pins; with ``thaw``, thaws the frozen cgroups named like that (FreezeGate's leftovers) and
    gives their SCHED_EXT tasks (held ones of a dead gate) SCHED_OTHER back. Returns what was
    done, for the log."""
    done = []
    deny_pin = os.path.join(pin_dir, "deny")
    if os.path.exists(deny_pin):
        try:
            m = BpfMap.open(deny_pin)
            try:
                n = _clear_map(m)
            finally:
                m.close()
            done.append(f"cleared {n} deny entr{'y' if n == 1 else 'ies'}")
        except OSError as e:
            done.append(f"could not clear {deny_pin}: {e}")
    if unload:
        link_pin = os.path.join(pin_dir, LINK_PIN)
        stat = None
        with contextlib.suppress(OSError):
            stat = BpfMap.open(os.path.join(pin_dir, "stat"))
        try:
            if loader.unlink(link_pin):
                done.append(f"removed pinned link {link_pin}")
                if stat is not None:
                    ok = _wait_exited(stat, timeout, sysfs)
                else:
                    ok = wait_state({"disabled", "unsupported"}, timeout, sysfs) != "enabled"
                done.append("scheduler unloaded" if ok else
                            "scheduler still loaded (another process holds its link)")
        finally:
            if stat is not None:
                stat.close()
        removed = _remove_pins(pin_dir)
        if removed:
            done.append(f"removed {len(removed)} stale pins")
        if state(sysfs) == "enabled" and scheduler_name(sysfs) == SCHED_NAME:
            done.append("an execgate scheduler is still loaded by another process")
    if thaw:
        thawed = thaw_all(cgroup_root, thaw)
        if thawed:
            done.append(f"thawed {len(thawed)} cgroups")
        reset = sched_policy.restore_all(cgroup_root, thaw)
        if reset:
            done.append(f"gave {len(reset)} cgroups' SCHED_EXT tasks their fair policy back")
    return "; ".join(done) or "nothing to recover"



if __name__ == "__main__":
    from execgate.bpf.gate_cli import main

    sys.exit(main())
