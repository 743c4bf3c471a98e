"""A container's name for people, where the host has one; else its short id (as `docker ps`).

Kubernetes (CRI: containerd, CRI-O) and nerdctl put the name in the bundle's annotations, which
the container record keeps. Docker keeps it in its own container config (config.v2.json under
its data root: daemon.json's `data-root`, else /var/lib/docker), not in the OCI bundle: read
there, at status time only (never on a call's path).
"""

from __future__ import annotations

import json
import os
from typing import Any

NAME_ANNOTATIONS = ("io.kubernetes.cri.container-name", "io.kubernetes.container.name",
                    "nerdctl/name")
POD_ANNOTATIONS = ("io.kubernetes.cri.sandbox-name", "io.kubernetes.pod.name")
DOCKER_ROOT = "/var/lib/docker"
DOCKER_CONFIG = "/etc/docker/daemon.json"
SHORT_ID = 12
CONFIG_MAX = 1 << 20  # config.v2.json holds the container's state too: a few kB


def docker_root(config: str = DOCKER_CONFIG) -> str:
    """Docker's data root: daemon.json's `data-root` when it sets one (an absolute path), else
    the default. A dockerd started with --data-root on its command line is not seen."""
    try:
        with open(config, "rb") as f:
            root = json.loads(f.read(CONFIG_MAX)).get("data-root")
    except (OSError, ValueError, AttributeError):
        return DOCKER_ROOT
    return root if isinstance(root, str) and os.path.isabs(root) else DOCKER_ROOT


def name_of(record: dict[str, Any], docker_root: str = DOCKER_ROOT) -> str:
    """`pod/container` or the container's name from its annotations, else Docker's name,
    else the short id."""
    cid = str(record.get("id") or "")
    ann = record.get("annotations") or {}
    for key in NAME_ANNOTATIONS:
        if ann.get(key):
            pod = next((ann[k] for k in POD_ANNOTATIONS if ann.get(k)), "")
            return f"{pod}/{ann[key]}" if pod else str(ann[key])
    return docker_name(cid, docker_root) or cid[:SHORT_ID]


def docker_name(cid: str, docker_root: str = DOCKER_ROOT) -> str | None:
    """Docker's name of container cid (without its leading "/"), or None."""
    if not cid or "/" in cid or cid.startswith("."):
        return None
    try:
        with open(os.path.join(docker_root, "containers", cid, "config.v2.json"), "rb") as f:
            name = json.loads(f.read(CONFIG_MAX)).get("Name")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(name, str):
        return None
    return name.lstrip("/") or None
