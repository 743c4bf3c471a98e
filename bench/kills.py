"""Who the kernel OOM-killed during a run, and which task, attempt and call that was.

The kernel logs every OOM kill twice: `oom-kill:constraint=…,oom_memcg=…,task_memcg=…,task=…,
pid=…` (where the limit was hit, which cgroup the victim was in) and `Memory cgroup out of
memory: Killed process PID (comm) … anon-rss:…kB … oom_score_adj:N`; a victim that was exiting
already gets the first and `OOM victim PID (comm) is already exiting. Skip killing the task`
instead of the second, and is no kill (memory.events does not count it). Joined by pid, the victim's
cgroup names its container (`docker-<id>.scope`) and, under execgate, its call's cgroup
(`tool-…`, the journal's call id) or the sandbox's init. Pure functions: the runner reads the
log (`Host.kernel_log`) and passes the container and call tables in.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

_OOM_KILL = re.compile(r"oom-kill:(?P<fields>\S+)")
_KILLED = re.compile(r"Killed process (?P<pid>\d+) \((?P<comm>[^)]*)\)(?P<rest>.*)")
_SIZE = re.compile(r"(?P<key>total-vm|anon-rss|file-rss|shmem-rss):(?P<kb>\d+)kB")
_ADJ = re.compile(r"oom_score_adj:(?P<adj>-?\d+)")
_SKIPPED = re.compile(r"OOM victim (?P<pid>\d+) \([^)]*\) is already exiting")
_SCOPE = re.compile(r"docker-(?P<cid>[0-9a-f]{12,64})\.scope")


def parse_kills(records: Iterable[tuple[int, str]]) -> list[dict[str, Any]]:
    """OOM kills in kernel log records (sequence, message), one dict per victim."""
    kills: list[dict[str, Any]] = []
    by_pid: dict[int, dict[str, Any]] = {}
    for seq, msg in records:
        m = _OOM_KILL.search(msg)
        if m:
            fields = dict(kv.partition("=")[::2] for kv in m["fields"].split(","))
            k = {"seq": seq, "oom_memcg": fields.get("oom_memcg", ""),
                 "task_memcg": fields.get("task_memcg", ""), "comm": fields.get("task", ""),
                 "pid": int(fields["pid"]) if fields.get("pid", "").isdigit() else None,
                 "constraint": fields.get("constraint", "")}
            kills.append(k)
            if k["pid"] is not None:
                by_pid[k["pid"]] = k
            continue
        m = _SKIPPED.search(msg)
        if m:  # chosen, but exiting already: not killed
            k = by_pid.pop(int(m["pid"]), None)
            if k is not None and "anon_rss_kb" not in k:
                kills.remove(k)
            continue
        m = _KILLED.search(msg)
        if m:
            pid = int(m["pid"])
            k = by_pid.get(pid)
            if k is None:  # the first line was lost (ring buffer): keep what there is
                k = {"seq": seq, "oom_memcg": "", "task_memcg": "", "comm": m["comm"],
                     "pid": pid, "constraint": ""}
                kills.append(k)
                by_pid[pid] = k
            for s in _SIZE.finditer(m["rest"]):
                k[s["key"].replace("-", "_") + "_kb"] = int(s["kb"])
            adj = _ADJ.search(m["rest"])
            if adj:
                k["oom_score_adj"] = int(adj["adj"])
    return kills


def attribute(kill: Mapping[str, Any], containers: Mapping[str, Mapping[str, Any]],
              calls: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The kill with what it hit: `containers` maps a container id to its task, attempt and
    init_pid, `calls` a journal call id (the `tool-…` cgroup) to the replayed call. victim:
    "init" (the sandbox itself: the agent framework), "call" (a tool call's process; under runc
    it shares the sandbox's cgroup, so its call is the one that exited 137), "other" (outside
    the run's sandboxes) or "unattributed" (the kernel rate-limits the line naming the cgroup:
    only an init is then known, by its pid)."""
    out = dict(kill)
    path = str(kill.get("task_memcg", ""))
    m = _SCOPE.search(path)
    cid = next((c for c in containers if c.startswith(m["cid"])), None) if m else None
    leaf = path.rstrip("/").rsplit("/", 1)[-1] if path else ""
    if cid is None and not path:  # its oom-kill line was rate-limited away: by pid, if an init
        cid = next((c for c, b in containers.items()
                    if kill.get("pid") is not None and b.get("init_pid") == kill.get("pid")), None)
    out["container"] = cid
    if cid is None:
        out["victim"] = "other" if path else "unattributed"
        return out
    box = containers[cid]
    out.update(task=box.get("task"), attempt=box.get("attempt"))
    if kill.get("pid") is not None and kill.get("pid") == box.get("init_pid"):
        out["victim"] = "init"
    else:
        out["victim"] = "call"
        if leaf.startswith("tool-"):
            out["call_id"] = leaf
            if leaf in calls:
                out["call"] = calls[leaf].get("call")
    return out
