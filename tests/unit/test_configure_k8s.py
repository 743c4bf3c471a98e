"""packaging/k8s: every manifest is valid against the Kubernetes API schemas (offline, strict:
kubernetes-validate ships them), the manifests agree with each other and with what `execgatectl
configure` registers, and pressure.py's decisions (label, taint, conflicts)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

K8S = Path(__file__).resolve().parents[2] / "packaging" / "k8s"


def _docs(name: str) -> dict[str, Any]:
    import yaml

    with open(K8S / name) as f:
        return {d["kind"]: d for d in yaml.safe_load_all(f) if d}


KUBERNETES = "1.30.0"  # the oldest release whose pods set memory.oom.group (>= 1.28) we name


@pytest.mark.parametrize("name", sorted(p.name for p in K8S.glob("*.yaml")))
def test_every_manifest_is_valid_against_the_kubernetes_schemas(name: str) -> None:
    import kubernetes_validate
    import yaml

    with open(K8S / name) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    assert docs
    for doc in docs:  # strict: a misspelled field is an error, not ignored
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)


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


def test_installer_pod_runs_the_scripts_the_image_holds() -> None:
    installer, pressure = _docs("node-installer.yaml")["DaemonSet"]["spec"]["template"]["spec"][
        "containers"]
    assert installer["command"] == ["/opt/execgate-src/packaging/k8s/node-install.sh"]
    assert pressure["command"] == ["python3", "/opt/execgate-src/packaging/k8s/pressure.py"]
    assert "COPY . /opt/execgate-src" in (K8S / "Dockerfile").read_text()
    assert os.access(K8S / "node-install.sh", os.X_OK)
    assert subprocess.run(["sh", "-n", str(K8S / "node-install.sh")]).returncode == 0
    assert "--no-swap" in (K8S / "node-install.sh").read_text()


def _pressure() -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("k8s_pressure", K8S / "pressure.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _node(label: str | None = None, taints: list[dict[str, str]] | None = None) -> dict[str, Any]:
    labels = {"kubernetes.io/hostname": "n1", **({_pressure().KEY: label} if label else {})}
    return {"metadata": {"name": "n1", "resourceVersion": "7", "labels": labels},
            "spec": {"taints": taints or []}}


def test_pressure_taint_on_at_red_off_at_green_kept_at_yellow_fails_open() -> None:
    p = _pressure()
    other = {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}
    body = p.patch(_node("yellow", [other]), "red")
    assert body == {"metadata": {"labels": {p.KEY: "red"}, "resourceVersion": "7"},
                    "spec": {"taints": [other, p.TAINT]}}
    red = _node("red", [other, p.TAINT])
    assert p.patch(red, "red") is None
    assert "spec" not in p.patch(red, "yellow"), "yellow keeps the taint: no flapping"
    for state in ("green", "unknown"):
        assert p.patch(red, state)["spec"] == {"taints": [other]}
    assert "spec" not in p.patch(_node("green", [other]), "yellow")
    assert p.patch(red, None) == {"metadata": {"labels": {p.KEY: None}, "resourceVersion": "7"},
                                  "spec": {"taints": [other]}}, "stopping takes both off"


def test_pressure_state_is_unknown_unless_the_daemon_answered() -> None:
    p = _pressure()
    assert p.state_of(None) == "unknown"
    assert p.state_of({"source": "execgated not reachable (...); read from disk"}) == "unknown"
    assert p.state_of({"source": "execgated pid 4", "daemon": {"pressure": {"state": "red"}}}) \
        == "red"


def test_pressure_step_rereads_the_node_on_a_conflict(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 409 (the node written in between, e.g. another taint): read again, patch again."""
    import urllib.error

    p = _pressure()
    calls: list[tuple[str, Any]] = []
    nodes = [_node("green"), _node("green", [{"key": "x", "effect": "NoSchedule"}])]

    def request(method: str, path: str, body: Any = None) -> Any:
        calls.append((method, body))
        if method == "GET":
            return nodes.pop(0)
        if len(calls) == 2:
            raise urllib.error.HTTPError(path, 409, "Conflict", None, None)  # type: ignore[arg-type]
        return {}

    monkeypatch.setattr(p, "_request", request)
    p.step("n1", "red")
    assert [m for m, _ in calls] == ["GET", "PATCH", "GET", "PATCH"]
    assert calls[-1][1]["spec"]["taints"] == [{"key": "x", "effect": "NoSchedule"}, p.TAINT]
