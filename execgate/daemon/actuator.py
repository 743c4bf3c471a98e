"""The growth gate's actuator, chosen by the daemon: the sched_ext gate (bpf/gate.py) where the
kernel runs it, else the cgroup.freeze fallback defined here.

Both have one interface (``set(cgroup, allow)``, ``clear()``, ``denied()``, ``attached()``,
``unload()``); :func:`select_gate` picks one, with a reason for the log. What a dead daemon
left held (the gate's maps and pins, frozen tool cgroups) is undone by ``gate.recover``.
"""

from __future__ import annotations

import os
from pathlib import Path

from execgate.bpf.gate import (
    DEFAULT_BUILD_DIR,
    DEFAULT_HOLD_CAP_S,
    DEFAULT_PIN_DIR,
    DEFAULT_SCAN_MS,
    SCHED_NAME,
    Gate,
    GateBusy,
    GateError,
    GateUnavailable,
    build,
    load,
    recover,
)
from execgate.bpf.scx import SCX_SYSFS, scheduler_name, state, wait_state
from execgate.cgroups.ids import CGROUP_ROOT, CgroupRef, cgroup_path, find_cgroup, protected_ids


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
            if name not in (None, SCHED_NAME):  # never unloaded: not ours
                raise GateBusy(f"another sched_ext scheduler ({name}) is loaded; "
                               "execgate leaves it loaded")
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

