"""The growth gate's actuator: holds the tasks of denied tool-call cgroups, releases allowed ones.

Two implementations with one interface (``set(cgroup, allow)``, ``clear()``, ``denied()``,
``attached()``, ``unload()``):

* :class:`Gate` - the sched_ext scheduler in ``gate.bpf.c``. Denied cgroups' runnable tasks are
  parked in a held dispatch queue (they get no CPU, so their next allocations wait) and moved
  back when allowed. Verdicts go into a BPF hash map keyed by cgroup id, written directly with
  the bpf(2) syscall through ctypes: one syscall per ``set``, no process spawned.
* :class:`FreezeGate` - the fallback when sched_ext is unavailable: ``cgroup.freeze``.

:func:`select_gate` picks one (with a reason string); :func:`recover` undoes what a dead
daemon left behind. Stdlib + ctypes only; ``bpftool`` and ``clang`` are needed to build and load.
Runs as a command too: ``python3 -m execgate.bpf.gate --help``.

Lifetime of the scheduler (``load(persist=...)``):

* ``persist=False`` (default, the safe one): ``bpftool struct_ops register`` pins the struct_ops
  link, the loader opens it and removes the pin, so the loading process's file descriptor is the
  only reference. When that process exits - including ``kill -9`` - the kernel closes the fd,
  the link goes away and sched_ext unloads the scheduler: every task returns to the fair class
  and nothing stays held. (A child forked without exec inherits the fd and keeps it alive.)
* ``persist=True``: the link stays pinned under ``pin_dir`` and the scheduler outlives the
  loader, *with its deny entries*: held tasks then only get a slice per hold cap (20 s) until
  :func:`recover` clears the map or unloads. Use it only when something restarts the loader.

Maps are pinned under ``pin_dir`` in both modes (``deny``, ``cfg``, ``stat``, ``timer``) so
tools can inspect a running gate; :func:`recover` removes stale ones.
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import hashlib
import json
import os
import platform
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Union

from execgate.bpf import syscall as _sys

# The gate's map client (re-exported: tests and tools use them from here).
BPF_ANY, BpfMap, MapInfo = _sys.BPF_ANY, _sys.BpfMap, _sys.MapInfo
obj_get, obj_info, obj_pin = _sys.obj_get, _sys.obj_info, _sys.obj_pin
_attr, _syscall_bpf = _sys._attr, _sys._syscall_bpf

CgroupRef = Union[int, str, "os.PathLike[str]"]

SRC = Path(__file__).resolve().with_name("gate.bpf.c")
SCHED_NAME = "execgate"  # sched_ext_ops.name in gate.bpf.c
SCX_SYSFS = "/sys/kernel/sched_ext"
CGROUP_ROOT = "/sys/fs/cgroup"
BPFFS = "/sys/fs/bpf"
VMLINUX_BTF = "/sys/kernel/btf/vmlinux"
DEFAULT_PIN_DIR = "/sys/fs/bpf/execgate"
DEFAULT_BUILD_DIR = "/var/lib/execgate/bpf"

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

_TARGET_ARCH = {"x86_64": "x86", "aarch64": "arm64", "ppc64le": "powerpc", "s390x": "s390",
                "riscv64": "riscv", "loongarch64": "loongarch"}


class GateError(RuntimeError):
    """The sched_ext gate could not be built, loaded or driven."""


class GateUnavailable(GateError):
    """This kernel/host cannot run the sched_ext gate (no sched_ext, no bpffs, not root...)."""


class GateBusy(GateError):
    """A sched_ext scheduler (another one, or a stale execgate) is already loaded."""


# ---------------------------------------------------------------------------------------------
# Kernel state
# ---------------------------------------------------------------------------------------------

def state(sysfs: str = SCX_SYSFS) -> str:
    """sched_ext's state: ``enabled``, ``disabled``, ``enabling``, ``disabling``, or
    ``unsupported`` when the kernel has no sched_ext. A scheduler the kernel ejected (watchdog,
    error) shows as ``disabled``."""
    try:
        with open(os.path.join(sysfs, "state")) as f:
            return f.read().strip() or "unknown"
    except FileNotFoundError:
        return "unsupported"


def scheduler_name(sysfs: str = SCX_SYSFS) -> str | None:
    """The loaded scheduler's name (``/sys/kernel/sched_ext/root/ops``), None if none."""
    try:
        with open(os.path.join(sysfs, "root", "ops")) as f:
            return f.read().strip() or None
    except OSError:
        return None


def wait_state(want: Iterable[str], timeout: float = 10.0, sysfs: str = SCX_SYSFS) -> str:
    """Polls :func:`state` until it is one of ``want`` or ``timeout`` passes; returns it."""
    want = set(want)
    deadline = time.monotonic() + timeout
    while True:
        st = state(sysfs)
        if st in want or time.monotonic() >= deadline:
            return st
        time.sleep(0.05)


# ---------------------------------------------------------------------------------------------
# Cgroups
# ---------------------------------------------------------------------------------------------

def cgroup_path(cg: str | os.PathLike[str], root: str = CGROUP_ROOT) -> str:
    """An absolute cgroup directory; relative paths are taken under ``root``."""
    p = os.fspath(cg)
    return p if os.path.isabs(p) else os.path.join(root, p.lstrip("/"))


def cgroup_id(cg: CgroupRef, root: str = CGROUP_ROOT) -> int:
    """The cgroup id BPF sees (``cgroup->kn->id``, what ``bpf_get_current_cgroup_id()`` returns):
    on cgroup2 on 64-bit kernels it is the inode number of the cgroup's directory."""
    if isinstance(cg, bool):
        raise TypeError("a cgroup is an id or a path, not a bool")
    if isinstance(cg, int):
        if cg <= 0:
            raise ValueError(f"invalid cgroup id {cg}")
        return cg
    return os.stat(cgroup_path(cg, root)).st_ino


def own_cgroup(root: str = CGROUP_ROOT, pid: int | str = "self") -> str | None:
    """The cgroup2 directory of a process (default: this one)."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            for line in f:
                if line.startswith("0::"):
                    # "0::/a/b" is relative to the cgroup2 mount (cgroup_path keeps absolutes)
                    return os.path.normpath(os.path.join(root, line[3:].strip().lstrip("/")))
    except OSError:
        pass
    return None


def protected_ids(root: str = CGROUP_ROOT) -> set[int]:
    """Ids of this process's cgroup and all its ancestors, root included: denying any of them
    would hold the gate's own process (and the root would hold everything)."""
    ids: set[int] = set()
    root = os.path.normpath(root)
    with contextlib.suppress(OSError):
        ids.add(os.stat(root).st_ino)
    cg = own_cgroup(root)
    while cg and os.path.normpath(cg).startswith(root):
        with contextlib.suppress(OSError):
            ids.add(os.stat(cg).st_ino)
        if os.path.normpath(cg) == root:
            break
        cg = os.path.dirname(os.path.normpath(cg))
    return ids


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
# Build
# ---------------------------------------------------------------------------------------------

def clang_command(src: str | os.PathLike[str], obj: str | os.PathLike[str],
                  include_dir: str | os.PathLike[str], *, clang: str = "clang",
                  machine: str | None = None) -> list[str]:
    """The compiler command for the BPF object (-g: struct_ops needs the BTF)."""
    machine = machine or platform.machine()
    arch = _TARGET_ARCH.get(machine)
    if arch is None:
        raise GateUnavailable(f"no BPF target arch for {machine}")
    return [clang, "-O2", "-g", "-target", "bpf", "-mcpu=v3", f"-D__TARGET_ARCH_{arch}",
            # vmlinux.h of kernels built with -fms-extensions (6.19+) embeds tagged anonymous
            # structs; without the flag clang drops those members.
            "-fms-extensions", "-Wno-microsoft-anon-tag", "-Wall",
            "-I", os.fspath(include_dir), "-c", os.fspath(src), "-o", os.fspath(obj)]


def _run(cmd: list[str], *, timeout: float, stdout=None) -> subprocess.CompletedProcess[str]:
    try:
        proc = subprocess.run(cmd, stdout=stdout if stdout is not None else subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, timeout=timeout)
    except FileNotFoundError as e:
        raise GateUnavailable(f"{cmd[0]} not found") from e
    except subprocess.TimeoutExpired as e:
        raise GateError(f"{cmd[0]} timed out after {timeout:.0f}s") from e
    if proc.returncode != 0:
        lines = (proc.stderr or "").strip().splitlines()
        last = lines[-1].strip() if lines else "no output"
        raise GateError(f"{' '.join(cmd[:3])} failed ({proc.returncode}): {last}\n"
                        + "\n".join(lines[-30:]))
    return proc


def build(out_dir: str | os.PathLike[str] = DEFAULT_BUILD_DIR, *, src: str | os.PathLike[str]
          = SRC, clang: str = "clang", bpftool: str = "bpftool", btf: str = VMLINUX_BTF,
          force: bool = False, timeout: float = 600.0) -> Path:
    """Builds ``gate.bpf.o`` (or ``src``'s object) for the running kernel into ``out_dir``.

    ``vmlinux.h`` is generated from the kernel's BTF (``bpftool btf dump ... format c``), then
    clang compiles. Both are cached: redone when the kernel, the source or the flags change."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    src = Path(src)
    if not os.path.exists(btf):
        raise GateUnavailable(f"{btf} missing: the kernel has no BTF")

    header, header_stamp = out / "vmlinux.h", out / "vmlinux.h.stamp"
    kernel_key = f"{os.uname().release} {os.stat(btf).st_size}\n"
    if force or not header.exists() or _read(header_stamp) != kernel_key:
        tmp = out / "vmlinux.h.tmp"
        with open(tmp, "w") as f:
            _run([bpftool, "btf", "dump", "file", btf, "format", "c"], timeout=timeout, stdout=f)
        os.replace(tmp, header)
        header_stamp.write_text(kernel_key)

    name = src.name.removesuffix(".c") + ".o"  # gate.bpf.c -> gate.bpf.o
    obj, obj_stamp = out / name, out / f"{name}.stamp"
    cmd = clang_command(src, out / f"{name}.tmp", out, clang=clang)
    key = hashlib.sha256(src.read_bytes() + kernel_key.encode()
                         + "\0".join(cmd).encode()).hexdigest() + "\n"
    if force or not obj.exists() or _read(obj_stamp) != key:
        _run(cmd, timeout=timeout)
        os.replace(out / f"{name}.tmp", obj)
        obj_stamp.write_text(key)
    return obj


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


# ---------------------------------------------------------------------------------------------
# Load / unload
# ---------------------------------------------------------------------------------------------

def _bpffs_mounted(path: str = BPFFS) -> bool:
    try:
        with open("/proc/mounts") as f:
            return any(line.split()[1] == path and line.split()[2] == "bpf" for line in f)
    except OSError:
        return False


def _ensure_bpffs() -> None:
    if _bpffs_mounted():
        return
    os.makedirs(BPFFS, exist_ok=True)
    proc = subprocess.run(["mount", "-t", "bpf", "bpf", BPFFS], capture_output=True, text=True)
    if proc.returncode != 0 or not _bpffs_mounted():
        raise GateUnavailable(f"bpffs not mounted at {BPFFS}: {proc.stderr.strip()}")


def _unlink(path: str) -> bool:
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


def _remove_pins(pin_dir: str, *, link: bool = True) -> list[str]:
    """Removes execgate's pins (and only those) from pin_dir and libbpf's by-name spots."""
    gone = []
    names = [os.path.join(pin_dir, short) for short in MAP_NAMES]
    names += [os.path.join(BPFFS, full) for full in MAP_NAMES.values()]
    if link:
        names.append(os.path.join(pin_dir, LINK_PIN))
    for p in names:
        if _unlink(p):
            gone.append(p)
    with contextlib.suppress(OSError):
        os.rmdir(pin_dir)  # only if empty
    return gone


def load(obj: str | os.PathLike[str], pin_dir: str = DEFAULT_PIN_DIR, *, persist: bool = False,
         hold_cap_s: float = DEFAULT_HOLD_CAP_S, scan_ms: float = DEFAULT_SCAN_MS,
         bpftool: str = "bpftool", cgroup_root: str = CGROUP_ROOT, sysfs: str = SCX_SYSFS,
         timeout: float = 120.0) -> Gate:
    """Loads the scheduler (``bpftool struct_ops register``) and returns its :class:`Gate`.

    Every task switches to it at once; nothing is held until :meth:`Gate.set` denies a cgroup.
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
    _ensure_bpffs()
    _remove_pins(pin_dir)  # stale pins of an earlier run would be reused by libbpf
    os.makedirs(pin_dir, exist_ok=True)

    try:
        _run([bpftool, "struct_ops", "register", os.fspath(obj), pin_dir], timeout=timeout)
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
            _unlink(dest)
            obj_pin(maps[short].fd, dest)
            _unlink(by_name)
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
    those of every cgroup below it); ``set(cgroup, allow=True)`` releases them within a scan
    period (10 ms) of the next dispatch. Not thread-safe; one per process."""

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
            return self._maps["deny"].delete(key)
        if cid in self._protected:
            raise ValueError(f"refusing to deny cgroup {cg!r}: it holds this process "
                             "(or it is the root)")
        self._maps["deny"].update(key, _DENY_VALUE.pack(GATE_DENY))
        if path is not None:
            self._ids[path] = cid
        return True

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
        self._closed = True
        with contextlib.suppress(OSError):
            _clear_map(self._maps["deny"])
        link_pin = os.path.join(self.pin_dir, LINK_PIN)
        had_link = self._link_fd >= 0 or os.path.exists(link_pin)
        _unlink(link_pin)
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
                _unlink(path)
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
# cgroup.freeze fallback
# ---------------------------------------------------------------------------------------------

class FreezeGate:
    """The fallback actuator: a denied cgroup is frozen (``cgroup.freeze`` = 1), which stops all
    of its tasks, sleeping ones included, and thawed when allowed. Same interface as Gate."""

    kind = "freeze"

    def __init__(self, cgroup_root: str = CGROUP_ROOT) -> None:
        self.cgroup_root = cgroup_root
        self._frozen: dict[str, None] = {}  # insertion-ordered set of paths
        self._paths: dict[int, str] = {}
        self._protected = protected_ids(cgroup_root)
        self._closed = False

    def _resolve(self, cg: CgroupRef) -> str:
        if isinstance(cg, bool):
            raise TypeError("a cgroup is an id or a path, not a bool")
        if isinstance(cg, int):
            path = self._paths.get(cg) or find_cgroup(cg, self.cgroup_root)
            if path is None:
                raise FileNotFoundError(f"no cgroup with id {cg}")
            return path
        return cgroup_path(cg, self.cgroup_root)

    def set(self, cg: CgroupRef, allow: bool) -> bool:
        if self._closed:
            raise GateError("gate unloaded")
        if allow and isinstance(cg, int) and not isinstance(cg, bool) and cg not in self._paths:
            return False  # never frozen by this gate (by id or path): nothing to thaw
        try:
            path = self._resolve(cg)
        except FileNotFoundError:
            return False
        if not allow:
            try:
                cid = os.stat(path).st_ino
            except FileNotFoundError:
                return False
            if cid in self._protected:
                raise ValueError(f"refusing to freeze cgroup {cg!r}: it holds this process "
                                 "(or it is the root)")
            self._paths[cid] = path
        try:
            with open(os.path.join(path, "cgroup.freeze"), "w") as f:
                f.write("0" if allow else "1")
        except FileNotFoundError:
            self._frozen.pop(path, None)
            return False
        if allow:
            self._frozen.pop(path, None)
        else:
            self._frozen[path] = None
        return True

    def deny(self, cg: CgroupRef) -> bool:
        return self.set(cg, allow=False)

    def allow(self, cg: CgroupRef) -> bool:
        return self.set(cg, allow=True)

    def denied(self) -> list[str]:
        return list(self._frozen)

    def clear(self) -> int:
        n = 0
        for path in list(self._frozen):
            n += self.set(path, allow=True)
        self._frozen.clear()
        return n

    def attached(self) -> bool:
        return not self._closed and os.path.exists(
            os.path.join(self.cgroup_root, "cgroup.controllers"))

    def exit_reason(self) -> str | None:
        return None if self.attached() else "cgroup v2 not mounted or gate unloaded"

    def unload(self, timeout: float = 10.0) -> bool:
        if not self._closed:
            self.clear()
            self._closed = True
        return True

    close = unload

    def __enter__(self) -> FreezeGate:
        return self

    def __exit__(self, *exc: object) -> None:
        self.unload()

    def __repr__(self) -> str:
        return f"<FreezeGate root={self.cgroup_root} frozen={len(self._frozen)}>"


def find_cgroup(cid: int, root: str = CGROUP_ROOT) -> str | None:
    """The cgroup directory with id ``cid`` (a walk of the hierarchy; None if gone)."""
    for dirpath, _dirs, _files in os.walk(root):
        with contextlib.suppress(OSError):
            if os.stat(dirpath).st_ino == cid:
                return dirpath
    return None


def thaw_all(root: str = CGROUP_ROOT, pattern: str = "tool-*") -> list[str]:
    """Thaws every cgroup named ``pattern`` under ``root`` whose ``cgroup.freeze`` is 1 (what a
    dead daemon's FreezeGate left behind). Returns the thawed paths."""
    thawed = []
    for dirpath, dirs, _files in os.walk(root):
        for d in dirs:
            if not fnmatch.fnmatch(d, pattern):
                continue
            path = os.path.join(dirpath, d)
            f = os.path.join(path, "cgroup.freeze")
            with contextlib.suppress(OSError):
                with open(f) as fh:
                    frozen = fh.read().strip() == "1"
                if frozen:
                    with open(f, "w") as fh:
                        fh.write("0")
                    thawed.append(path)
    return thawed


# ---------------------------------------------------------------------------------------------
# Recovery and selection
# ---------------------------------------------------------------------------------------------

def recover(pin_dir: str = DEFAULT_PIN_DIR, *, unload: bool = True,
            cgroup_root: str = CGROUP_ROOT, thaw: str | None = "tool-*",
            sysfs: str = SCX_SYSFS, timeout: float = 10.0) -> str:
    """Undoes what a dead loader left behind, so that nothing stays held; the daemon calls it
    on start. Clears the pinned deny map (held tasks run again within a scan period), then,
    with ``unload``, removes the pinned link (a persist=True scheduler unloads) and the map
    pins; with ``thaw``, thaws the frozen cgroups named like that (FreezeGate's leftovers).
    Returns what was done, for the log."""
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
            if _unlink(link_pin):
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
    return "; ".join(done) or "nothing to recover"


AnyGate = Gate | FreezeGate


def select_gate(build_dir: str | os.PathLike[str] = DEFAULT_BUILD_DIR,
                pin_dir: str = DEFAULT_PIN_DIR, *, prefer: str = "auto", persist: bool = False,
                hold_cap_s: float = DEFAULT_HOLD_CAP_S, scan_ms: float = DEFAULT_SCAN_MS,
                cgroup_root: str = CGROUP_ROOT, sysfs: str = SCX_SYSFS,
                obj: str | os.PathLike[str] | None = None) -> tuple[AnyGate, str]:
    """The sched_ext gate when this kernel supports it and the build and load work, else the
    cgroup.freeze fallback; with the reason, for the log. ``prefer``: ``auto``, ``sched_ext``
    (raise instead of falling back) or ``freeze``. ``obj`` skips the build."""
    if prefer not in ("auto", "sched_ext", "freeze"):
        raise ValueError(f"prefer must be auto, sched_ext or freeze, not {prefer!r}")
    if prefer == "freeze":
        return FreezeGate(cgroup_root), "cgroup.freeze requested"
    try:
        st = state(sysfs)
        if st in ("enabling", "disabling"):
            st = wait_state({"enabled", "disabled"}, 10, sysfs)
        if st == "unsupported":
            raise GateUnavailable(f"kernel has no sched_ext ({sysfs} missing)")
        if st != "disabled":
            name = scheduler_name(sysfs)
            if name not in (None, SCHED_NAME):
                raise GateBusy(f"another sched_ext scheduler ({name}) is loaded")
            recover(pin_dir, cgroup_root=cgroup_root, thaw=None, sysfs=sysfs)
        path = Path(obj) if obj is not None else build(build_dir)
        gate = load(path, pin_dir, persist=persist, hold_cap_s=hold_cap_s, scan_ms=scan_ms,
                    cgroup_root=cgroup_root, sysfs=sysfs)
        return gate, f"sched_ext scheduler {SCHED_NAME!r} loaded from {path}"
    except (GateError, OSError, ValueError) as e:
        if prefer == "sched_ext":
            raise
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return FreezeGate(cgroup_root), f"sched_ext unavailable ({first}); using cgroup.freeze"


# ---------------------------------------------------------------------------------------------
# Command line: python3 gate.py {build,status,load,unload,recover,set,hold}
# ---------------------------------------------------------------------------------------------

def _status(pin_dir: str) -> dict[str, object]:
    out: dict[str, object] = {"state": state(), "scheduler": scheduler_name(),
                              "pin_dir": pin_dir,
                              "link_pinned": os.path.exists(os.path.join(pin_dir, LINK_PIN))}
    try:
        g = Gate.open(pin_dir)
    except (GateError, OSError) as e:
        out["gate"] = f"not pinned ({e})"
        return out
    try:
        out["denied"] = g.denied()
        out["stats"] = asdict(g.stats())
        out["attached"] = g.attached()
    finally:
        g.detach()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="execgate-bpf-gate", description=__doc__.split("\n")[0])
    ap.add_argument("--pin-dir", default=DEFAULT_PIN_DIR)
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build gate.bpf.o for this kernel, print its path")
    b.add_argument("out_dir", nargs="?", default=DEFAULT_BUILD_DIR)
    b.add_argument("--force", action="store_true")
    sub.add_parser("status", help="sched_ext state, pins, deny entries, counters (JSON)")
    ld = sub.add_parser("load", help="load persistently (link pinned) and exit")
    ld.add_argument("obj")
    ld.add_argument("--hold-cap", type=float, default=DEFAULT_HOLD_CAP_S)
    sub.add_parser("unload", help="unload a persistent gate (same as recover)")
    rc = sub.add_parser("recover", help="clear deny entries, unload, thaw tool-* cgroups")
    rc.add_argument("--keep", action="store_true", help="only clear the map, keep it loaded")
    st = sub.add_parser("set", help="allow/deny a cgroup on a persistent gate")
    st.add_argument("cgroup")
    st.add_argument("verdict", choices=["allow", "deny"])
    h = sub.add_parser("hold", help="load (owned), deny cgroups, print 'ready', wait for a "
                                    "signal, unload")
    h.add_argument("obj")
    h.add_argument("--deny", action="append", default=[], metavar="CGROUP")
    h.add_argument("--persist", action="store_true")
    h.add_argument("--hold-cap", type=float, default=DEFAULT_HOLD_CAP_S)
    args = ap.parse_args(argv)

    if args.cmd == "build":
        print(build(args.out_dir, force=args.force))
    elif args.cmd == "status":
        print(json.dumps(_status(args.pin_dir), indent=2))
    elif args.cmd == "load":
        g = load(args.obj, args.pin_dir, persist=True, hold_cap_s=args.hold_cap)
        print(f"loaded: {g!r}")
    elif args.cmd in ("unload", "recover"):
        print(recover(args.pin_dir, unload=not getattr(args, "keep", False)))
    elif args.cmd == "set":
        g = Gate.open(args.pin_dir)
        g.set(args.cgroup, allow=args.verdict == "allow")
        g.detach()
        print(f"{args.verdict} {args.cgroup}")
    elif args.cmd == "hold":
        g = load(args.obj, args.pin_dir, persist=args.persist, hold_cap_s=args.hold_cap)
        for cg in args.deny:
            g.deny(cg)
        stop = False

        def _stop(*_: object) -> None:
            nonlocal stop
            stop = True

        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)
        print("ready", flush=True)
        while not stop:
            time.sleep(0.2)
        g.unload()
    return 0


if __name__ == "__main__":
    sys.exit(main())
