"""`execgated --recover`: undo what a daemon that died left held, without starting one.

systemd runs it as the unit's ExecStopPost, after any end of the daemon — a crash, a kill -9,
an OOM kill, a failed start — so nothing stays frozen or held while the daemon is down, even
when systemd's start limit keeps it down (issue 21, item 9). It does what a starting daemon
does first: every managed sandbox's init/ thawed (only execgate freezes it), the growth gate's
deny entries cleared and its pins removed, tool cgroups it froze thawed, and a container it
left frozen in the middle of preparing its start thawed. It reads the
container records and cgroupfs only: no store, no journal, no socket.
"""

from __future__ import annotations

import logging

from execgate.cgroups import container, v2
from execgate.common import config as config_mod
from execgate.common import records

log = logging.getLogger("execgated")


def thaw_sandboxes(state_dir: str) -> int:
    """Thaw every managed sandbox's init/ that is frozen; how many were."""
    thawed = 0
    for rec in records.containers(state_dir):
        cg = rec.get("cgroup")
        if not rec.get("managed") or not cg or not container.is_prepared(cg):
            continue
        if rec.get("prepared") is False and _thaw_mid_prepare(cg):
            thawed += 1
            log.info("recover: thawed %s, left frozen mid-start", str(rec.get("id", ""))[:12])
        try:
            if container.thaw_init(cg):
                thawed += 1
                log.info("recover: thawed %s", str(rec.get("id", ""))[:12])
        except OSError as e:  # gone meanwhile, or not ours to write: the rest still
            log.warning("recover: cannot thaw %s: %s", cg, e)
    return thawed


def _thaw_mid_prepare(cg: str) -> bool:
    """A daemon that died while it prepared a start (daemon/lifecycle_op.py) left the
    container's own cgroup frozen and its record unprepared (an engine pauses only started,
    prepared containers); whether it was."""
    try:
        if v2.read_int(cg, "cgroup.freeze") != 1:
            return False
        v2.write(cg, "cgroup.freeze", "0")
        return True
    except OSError as e:
        log.warning("recover: cannot thaw %s: %s", cg, e)
        return False


def recover(cfg: config_mod.Config) -> str:
    """Everything a dead daemon may have left held; a line for the log."""
    done = [f"thawed {thaw_sandboxes(cfg.state_dir)} sandboxes"]
    try:
        from .actuator import recover as gate_recover

        done.append(f"gate: {gate_recover()}")
    except Exception as e:  # noqa: BLE001 - the sandboxes are thawed whatever the gate says
        done.append(f"gate: not recovered: {e}")
    return "; ".join(done)
