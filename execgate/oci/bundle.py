"""The parts of a bundle's config.json that execgate records for a container."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

# Orchestrators that group containers into one sandbox say so in annotations.
SANDBOX_ANNOTATIONS = ("io.kubernetes.cri.sandbox-id", "io.kubernetes.cri-o.SandboxID")
# The CRI runtimes (containerd's CRI plugin, CRI-O) mark what kubelet asked for.
KUBELET_PREFIX = "io.kubernetes."


@dataclass
class Bundle:
    path: str
    hostname: str = ""
    cgroups_path: str = ""
    annotations: dict[str, str] = field(default_factory=dict)
    env: list[str] = field(default_factory=list)
    args: list[str] = field(default_factory=list)
    memory_limit: int | None = None

    def sandbox_id(self, container_id: str) -> str:
        for key in SANDBOX_ANNOTATIONS:
            if self.annotations.get(key):
                return self.annotations[key]
        return container_id

    def caller_deadline(self) -> bool:
        """Whether whoever asked for this container times the runtime out: kubelet does (its
        runtime request timeout, 2 minutes); Docker, Podman and containerd's own clients do not."""
        return any(key.startswith(KUBELET_PREFIX) for key in self.annotations)


def load(bundle_dir: str) -> Bundle:
    with open(os.path.join(bundle_dir, "config.json")) as f:
        spec = json.load(f)
    linux = spec.get("linux") or {}
    process = spec.get("process") or {}
    memory = (linux.get("resources") or {}).get("memory") or {}
    limit = memory.get("limit")
    return Bundle(
        path=os.path.abspath(bundle_dir),
        hostname=spec.get("hostname") or "",
        cgroups_path=linux.get("cgroupsPath") or "",
        annotations={str(k): str(v) for k, v in (spec.get("annotations") or {}).items()},
        env=[e for e in process.get("env") or [] if isinstance(e, str)],
        args=[a for a in process.get("args") or [] if isinstance(a, str)],
        memory_limit=limit if isinstance(limit, int) and limit > 0 else None,
    )
