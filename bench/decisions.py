"""What execgate decided about each replayed call, from its journal and its event stream.

So a loss can be explained from results.json alone: every replayed call gets the daemon's
decision (admission wait, forced, the admission's reason and pressure state, growth-gate hold,
whether execgate or the kernel killed it) and what residency did to its sandbox since the
sandbox's previous call (reclaimed bytes, frozen, thawed). The journal (`calls.jsonl`) has one
line per finished call; `execgatectl events` one per admission, finish and residency action.
Pure functions over parsed lines; the runner does the I/O.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from bench.metrics import percentile
from execgate.common import records

# Journal fields kept per call (the rest: argv, cgroup, ids, already in the call record).
JOURNAL_FIELDS = ("call", "managed", "unmanaged", "waited_s", "forced", "held_s",
                  "killed_by_execgate", "oom_killed", "oom_kill", "oom_score_adj", "memory_peak",
                  "memory_max_events", "exit_code", "arrival", "start", "end")
# Slack between the runner's clock at `docker exec` and the runtime's arrival stamp.
_CLOCK_SLACK_S = 1.0


def read_lines(path: str, offset: int = 0) -> list[dict[str, Any]]:
    """JSON lines of a file from a byte offset (bad lines skipped; a missing file: none)."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return records.journal_entries(f)
    except OSError:
        return []


def _container_of(e: Mapping[str, Any]) -> str | None:
    c = e.get("container") or e.get("sandbox")
    return c if isinstance(c, str) else None


def of_containers(entries: Iterable[Mapping[str, Any]], containers: set[str],
                  call_ids: set[str] | None = None) -> list[dict[str, Any]]:
    """The entries about these containers (or, for events naming only a call, these calls)."""
    out = []
    for e in entries:
        c = _container_of(e)
        if c in containers or (c is None and call_ids and e.get("call") in call_ids):
            out.append(dict(e))
    return out


def journal_stats(entries: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Admission waits and OOM kills of this run's calls, from execgate's journal."""
    waits = [float(e["waited_s"]) for e in entries
             if isinstance(e.get("waited_s"), int | float)]
    return {"journal_calls": len(entries),
            "journal_calls_admitted": sum(bool(e.get("managed")) for e in entries),
            "journal_oom_killed": sum(bool(e.get("oom_killed")) for e in entries),
            "journal_forced": sum(bool(e.get("forced")) for e in entries),
            "journal_held": sum((e.get("held_s") or 0) > 0 for e in entries),
            "journal_killed_by_execgate": sum(bool(e.get("killed_by_execgate"))
                                              for e in entries),
            "admission_wait_p50_s": percentile(waits, 50),
            "admission_wait_p95_s": percentile(waits, 95),
            "admission_wait_max_s": max(waits, default=math.nan)}


def annotate_calls(calls: Sequence[dict[str, Any]], journal: Sequence[Mapping[str, Any]],
                   events: Sequence[Mapping[str, Any]], t0_epoch: float) -> dict[str, dict]:
    """Add `daemon` (the journal's decision and the admission event) and `residency` (what
    was done to the sandbox between its previous call and this one's end) to each call record,
    in place. A journal entry goes to the call of its container that started last before the
    runtime stamped its arrival (calls within a sandbox are sequential). Returns the call
    records by journal call id (for kill attribution)."""
    by_box: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for c in calls:
        by_box[str(c.get("container"))].append(c)
    for cs in by_box.values():
        cs.sort(key=lambda c: c["start"])
    admitted = {e["call"]: e for e in events
                if e.get("event") == "admitted" and isinstance(e.get("call"), str)}
    by_id: dict[str, dict[str, Any]] = {}
    for e in journal:
        cs = by_box.get(str(e.get("container")), [])
        at = e.get("arrival")
        if not cs or not isinstance(at, int | float):
            continue
        t = at - t0_epoch + _CLOCK_SLACK_S
        mine = [c for c in cs if c["start"] <= t and "daemon" not in c]
        if not mine:
            continue
        c = mine[-1]
        d = {k: e.get(k) for k in JOURNAL_FIELDS if k in e}
        for k in ("arrival", "start", "end"):
            if isinstance(d.get(k), int | float):
                d[k] = round(d[k] - t0_epoch, 3)  # on the run's clock, as the call's times
        adm = admitted.get(str(e.get("call")))
        if adm:
            d.update({f"admit_{k}": adm.get(k) for k in ("reason", "state", "charge", "probe")})
        c["daemon"] = d
        by_id[str(e.get("call"))] = c
    residency: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        if e.get("event") == "residency" and isinstance(e.get("time"), int | float):
            residency[str(e.get("container"))].append(e)
    for box, cs in by_box.items():
        prev_end = -math.inf
        for c in cs:
            acts = [e for e in residency.get(box, [])
                    if prev_end < e["time"] - t0_epoch <= c["end"]]
            if acts:
                c["residency"] = {
                    "reclaimed_bytes": sum(int(e.get("reclaimed") or 0) for e in acts
                                           if e.get("action") == "reclaimed"),
                    "actions": [e.get("action") for e in acts]}
            prev_end = c["end"]
    return by_id


def annotate_attempts(attempts: Sequence[dict[str, Any]],
                      events: Sequence[Mapping[str, Any]]) -> None:
    """Add `sandbox_admission` (the daemon's word on the sandbox's create: waited_s, verdict
    (admitted, or a fail-open start), its reason) to each attempt whose container it admitted,
    and `lifecycle` (per op of the front, where its time went: runc_s, waited_s, daemon_s), in
    place."""
    verdicts = {str(e.get("sandbox")): e for e in events
                if e.get("of") == "sandbox" and e.get("event") == "admitted"}
    ops: dict[str, dict[str, Any]] = {}
    for e in events:
        if e.get("event") == "lifecycle":
            ops.setdefault(str(e.get("container")), {})[str(e.get("op"))] = {
                k: e.get(k) for k in ("runc_s", "waited_s", "daemon_s")}
    for a in attempts:
        cid = str(a.get("container"))
        e = verdicts.get(cid)
        if e is not None:
            a["sandbox_admission"] = {k: e.get(k) for k in ("waited_s", "verdict", "reason",
                                                            "need", "room") if k in e}
        if cid in ops:
            a["lifecycle"] = ops[cid]
