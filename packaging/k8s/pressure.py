"""The node's memory pressure, published where the cluster scheduler sees it (run by
node-install.sh in the installer pod, stdlib only).

Every PERIOD seconds it reads `execgatectl status --json` on the host and writes two things on
its own node, and nothing else:
  - the label `execgate.io/memory-pressure=green|yellow|red|unknown` (for node affinity), and
  - the taint `execgate.io/memory-pressure=red:NoSchedule` while red: new pods that do not
    tolerate it go to nodes with room. It comes off at green (yellow keeps what was, so a node
    on the edge does not flap) and when the daemon does not answer (fail open: execgate's own
    trouble never keeps pods off a node). Both go when the publisher stops (SIGTERM).
A PATCH carries the node's resourceVersion: a taint another writer set in between is never lost
(409, read again). The decisions (`want_taint`, `patch`) are pure and unit-tested.
"""

from __future__ import annotations

import json
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any

KEY = "execgate.io/memory-pressure"
TAINT = {"key": KEY, "value": "red", "effect": "NoSchedule"}
# The pod's service account and the API server, as Kubernetes mounts and names them (the
# variables serve a test against a local API server).
SA = os.environ.get("EXECGATE_K8S_SA", "/var/run/secrets/kubernetes.io/serviceaccount")
API = os.environ.get("EXECGATE_K8S_API", "https://kubernetes.default.svc")
STATUS = ["nsenter", "--target", "1", "--mount", "--", "execgatectl", "status", "--json"]


def state_of(status: dict[str, Any] | None) -> str:
    """green/yellow/red from the daemon's status; unknown when it did not answer."""
    if not status or not str(status.get("source", "")).startswith("execgated pid"):
        return "unknown"
    state = ((status.get("daemon") or {}).get("pressure") or {}).get("state")
    return state if state in ("green", "yellow", "red") else "unknown"


def want_taint(state: str, tainted: bool) -> bool:
    """On at red, off at green or unknown, as it was at yellow."""
    return {"red": True, "green": False, "unknown": False}.get(state, tainted)


def patch(node: dict[str, Any], state: str | None) -> dict[str, Any] | None:
    """The merge patch that brings the node to `state` (None: neither label nor taint, as when
    the publisher stops), or None when it is there already."""
    meta = node.get("metadata") or {}
    taints = list((node.get("spec") or {}).get("taints") or [])
    ours = [t for t in taints if t.get("key") == KEY]
    want = state is not None and want_taint(state, bool(ours))
    taint_ok = ours == [TAINT] if want else not ours
    if (meta.get("labels") or {}).get(KEY) == state and taint_ok:
        return None
    body: dict[str, Any] = {"metadata": {"labels": {KEY: state},
                                         "resourceVersion": meta.get("resourceVersion")}}
    if not taint_ok:
        others = [t for t in taints if t.get("key") != KEY]
        body["spec"] = {"taints": others + ([TAINT] if want else [])}
    return body


def _request(method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    with open(f"{SA}/token") as f:
        token = f.read().strip()
    req = urllib.request.Request(
        API + path, method=method, data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {token}",
                 "Content-Type": "application/merge-patch+json"})
    ctx = ssl.create_default_context(cafile=f"{SA}/ca.crt")
    with urllib.request.urlopen(req, context=ctx, timeout=10) as r:
        return json.loads(r.read())


def read_status() -> dict[str, Any] | None:
    try:
        p = subprocess.run(STATUS, capture_output=True, text=True, timeout=20)
        return json.loads(p.stdout) if p.returncode in (0, 3) else None
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


def step(node_name: str, state: str | None) -> None:
    for _ in range(3):  # a 409 (someone wrote the node in between): read it again
        node = _request("GET", f"/api/v1/nodes/{node_name}")
        body = patch(node, state)
        if body is None:
            return
        try:
            _request("PATCH", f"/api/v1/nodes/{node_name}", body)
            return
        except urllib.error.HTTPError as e:
            if e.code != 409:
                raise


def main() -> int:
    node_name = os.environ["NODE_NAME"]
    period = float(os.environ.get("EXECGATE_PRESSURE_PERIOD_S", "5"))
    last = None

    def stop(_sig: int, _frame: object) -> None:
        step(node_name, None)  # nothing of ours left on the node
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    while True:
        state = state_of(read_status())
        try:
            step(node_name, state)
            if state != last:
                print(f"pressure: {node_name} is {state}", flush=True)
                last = state
        except (OSError, urllib.error.URLError, ValueError) as e:
            print(f"pressure: cannot publish: {e}", file=sys.stderr, flush=True)
        time.sleep(period)


if __name__ == "__main__":
    sys.exit(main())
