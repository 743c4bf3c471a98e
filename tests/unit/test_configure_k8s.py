"""packaging/k8s: the manifests parse and agree with each other and with what `execgatectl
configure` registers (no Kubernetes schemas here: structure only)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

K8S = Path(__file__).resolve().parents[2] / "packaging" / "k8s"
yaml = pytest.importorskip("yaml", reason="PyYAML is not installed in this environment")


def _docs(name: str) -> dict[str, Any]:
    with open(K8S / name) as f:
        return {d["kind"]: d for d in yaml.safe_load_all(f) if d}


def test_runtimeclass_names_the_handler_configure_registers() -> None:
    rc = _docs("runtimeclass.yaml")["RuntimeClass"]
    assert rc["apiVersion"] == "node.k8s.io/v1" and rc["handler"] == "execgate"
    ds = _docs("node-installer.yaml")["DaemonSet"]
    assert rc["scheduling"]["nodeSelector"] == {"execgate.io/installed": "true"}
    script = (K8S / "node-install.sh").read_text()
    assert "label=execgate.io/installed" in script
    assert ds["spec"]["template"]["spec"]["nodeSelector"] == {"execgate.io/enabled": "true"}


def test_installer_rbac_is_nodes_get_and_patch_narrowed_to_its_own_node() -> None:
    docs = _docs("node-installer.yaml")
    assert docs["ClusterRole"]["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}]
    sa = docs["ServiceAccount"]["metadata"]
    ds = docs["DaemonSet"]
    assert ds["spec"]["template"]["spec"]["serviceAccountName"] == sa["name"]
    assert docs["ClusterRoleBinding"]["subjects"] == [
        {"kind": "ServiceAccount", "name": sa["name"], "namespace": sa["namespace"]}]
    policy = docs["ValidatingAdmissionPolicy"]
    assert f"system:serviceaccount:{sa['namespace']}:{sa['name']}" in \
        policy["spec"]["matchConditions"][0]["expression"]
    assert "authentication.kubernetes.io/node-name" in policy["spec"]["validations"][0][
        "expression"]
    assert docs["ValidatingAdmissionPolicyBinding"]["spec"]["policyName"] == \
        policy["metadata"]["name"]


def test_installer_pod_runs_the_script_the_image_holds() -> None:
    c = _docs("node-installer.yaml")["DaemonSet"]["spec"]["template"]["spec"]["containers"][0]
    assert c["command"] == ["/opt/execgate-src/packaging/k8s/node-install.sh"]
    assert "COPY . /opt/execgate-src" in (K8S / "Dockerfile").read_text()
    assert os.access(K8S / "node-install.sh", os.X_OK)
    assert subprocess.run(["sh", "-n", str(K8S / "node-install.sh")]).returncode == 0
    assert "--no-swap" in (K8S / "node-install.sh").read_text()
