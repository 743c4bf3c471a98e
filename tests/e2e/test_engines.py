"""Engines besides Docker, configured by `execgatectl configure` and driven through their own
clients: containerd (its config read back by containerd itself; `ctr` through the runc v2 shim
with BinaryName = execgate: run, exec in a tool cgroup, kill, delete) and Podman (run, exec, rm
through containers.conf, execgate's warnings in its log). Each file as it was afterwards."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tomllib
from collections.abc import Iterator

import pytest
from conftest import CONFIG, IMAGE, STATE_DIR, docker, journal_for, wait_for

EXECGATE = "/usr/local/bin/execgate"
CTR_NS = "execgate-e2e"
CONTAINERD_CONFIG = "/etc/containerd/config.toml"
DROP_IN = "/etc/containerd/conf.d/99-execgate.toml"


def _run(*argv: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    p = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout,
                       stdin=subprocess.DEVNULL)
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} -> {p.returncode}: {p.stdout}{p.stderr}")
    return p


def ctr(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return _run("ctr", "-n", CTR_NS, *args, check=check, timeout=timeout)


def _files(*paths: str) -> dict[str, bytes | None]:
    out: dict[str, bytes | None] = {}
    for p in paths:
        try:
            with open(p, "rb") as f:
                out[p] = f.read()
        except FileNotFoundError:
            out[p] = None
    return out


def _restart_containerd() -> None:
    _run("systemctl", "restart", "containerd")
    wait_for(lambda: _run("ctr", "version", check=False).returncode == 0, timeout=120)


@pytest.fixture(scope="module")
def rootfs() -> Iterator[str]:
    """The test image's files, for `ctr run --rootfs` and `podman run --rootfs` (not under /tmp,
    which an engine's unit may keep private)."""
    root = f"/var/lib/execgate-e2e-rootfs-{os.getpid()}"
    os.mkdir(root)
    cid = docker("create", IMAGE, "true").stdout.decode().strip()
    try:
        export = subprocess.Popen(["docker", "export", cid], stdout=subprocess.PIPE)
        subprocess.run(["tar", "-x", "-C", root], stdin=export.stdout, check=True)
        assert export.wait() == 0
    finally:
        docker("rm", cid)
    assert os.path.exists(os.path.join(root, "bin", "sleep")), os.listdir(root)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def containerd_configured() -> Iterator[str]:
    if shutil.which("ctr") is None:
        pytest.skip("no containerd/ctr on this host")
    before = _files(CONTAINERD_CONFIG, DROP_IN)
    p = _run("execgatectl", "configure", "containerd")
    print(p.stdout)
    assert "systemctl restart containerd" in p.stdout
    _restart_containerd()
    try:
        yield p.stdout
    finally:
        p = _run("execgatectl", "unconfigure", "containerd", check=False)
        print(p.stdout, p.stderr)
        _restart_containerd()
        assert _files(CONTAINERD_CONFIG, DROP_IN) == before, "unconfigure restores the files"
        wait_for(lambda: docker("info", check=False).returncode == 0, timeout=120)


def test_containerd_reads_the_runtime_execgatectl_configured(containerd_configured: str) -> None:
    """containerd itself (config dump: the merged view of config.toml and its imports) has the
    runc-v2 runtime with BinaryName = execgate, and the CRI section the host had (1.x replaces a
    plugin's whole section from an import: the drop-in must carry it)."""
    dump = tomllib.loads(_run("containerd", "config", "dump").stdout)
    version = dump.get("version")
    plugin = "io.containerd.cri.v1.runtime" if version == 3 else "io.containerd.grpc.v1.cri"
    cri = dump["plugins"][plugin]
    ours = cri["containerd"]["runtimes"]["execgate"]
    assert ours["runtime_type"] == "io.containerd.runc.v2"
    assert ours["options"]["BinaryName"] == EXECGATE
    assert "runc" in cri["containerd"]["runtimes"]
    with open(CONTAINERD_CONFIG, "rb") as f:
        host = tomllib.load(f)
    for key, value in ((host.get("plugins") or {}).get(plugin) or {}).get("cni", {}).items():
        assert cri["cni"][key] == value, f"the host's cni.{key} is kept"
    assert docker("info", check=False).returncode == 0, "Docker works with the restarted containerd"
    # A second configure changes nothing.
    again = _run("execgatectl", "configure", "containerd").stdout
    assert "nothing to change" in again, again


def test_ctr_run_exec_kill_delete_through_the_runc_shim(containerd_configured: str,
                                                        rootfs: str) -> None:
    cid = f"eg-ctr-{os.getpid()}"
    try:
        p = ctr("run", "-d", "--runc-binary", EXECGATE, "--rootfs", rootfs, cid, "/bin/sleep",
                "inf", check=False)
        if p.returncode != 0:  # what ctr made of it, for the failure's message
            spec = ctr("containers", "info", cid, check=False).stdout
            raise AssertionError(f"ctr run -> {p.returncode}: {p.stderr}\n{spec[-3000:]}")
        pid = _task_pid(cid)
        wait_for(lambda: _cgroup(pid).endswith("/init"), timeout=60,
                 what="execgate's start to put init into the container's init/")
        box = os.path.dirname(_cgroup(pid))
        assert box.endswith(cid), box  # ctr's cgroupfs path: /<namespace>/<id>

        out = ctr("task", "exec", "--exec-id", "call1", cid, "/bin/cat", "/proc/self/cgroup").stdout
        call_cg = out.strip().split("::", 1)[1]
        assert os.path.basename(call_cg).startswith("tool-"), out
        wait_for(lambda: any(e.get("argv") == ["/bin/cat", "/proc/self/cgroup"]
                             for e in journal_for(cid)), timeout=60,
                 what="the call's outcome in the journal")

        ctr("task", "kill", "-s", "SIGKILL", cid)
        wait_for(lambda: _task_status(cid) == "STOPPED", timeout=60)
        ctr("task", "delete", cid)
        ctr("container", "delete", cid)
        wait_for(lambda: not os.path.exists(os.path.join("/sys/fs/cgroup", box.lstrip("/"))),
                 timeout=60, what="the container's cgroup is gone")
        assert not os.path.exists(os.path.join(STATE_DIR, "containers", cid + ".json"))
    finally:
        ctr("task", "kill", "-s", "SIGKILL", cid, check=False)
        ctr("task", "delete", "-f", cid, check=False)
        ctr("container", "delete", cid, check=False)


def _cgroup(pid: int) -> str:
    with open(f"/proc/{pid}/cgroup") as f:
        return f.read().strip().split("::", 1)[1]


def _task_line(cid: str) -> list[str]:
    for line in ctr("task", "ls").stdout.splitlines()[1:]:
        fields = line.split()
        if fields and fields[0] == cid:
            return fields
    return []


def _task_pid(cid: str) -> int:
    wait_for(lambda: len(_task_line(cid)) == 3 and _task_line(cid)[1] != "0", timeout=60)
    return int(_task_line(cid)[1])


def _task_status(cid: str) -> str:
    fields = _task_line(cid)
    return fields[2] if len(fields) == 3 else ""


PODMAN_DROP_IN = "/etc/containers/containers.conf.d/99-execgate.conf"


@pytest.fixture
def podman_configured() -> Iterator[None]:
    """Podman with execgate's drop-in; unconfigure leaves the files as they are without
    execgate. install.sh registers with every engine it finds, so Podman may be configured
    already: that state is put back after."""
    if shutil.which("podman") is None:
        pytest.skip("no podman on this host")
    installed = _files(PODMAN_DROP_IN)
    _run("execgatectl", "unconfigure", "podman")
    before = _files(PODMAN_DROP_IN)
    _run("execgatectl", "configure", "podman")
    try:
        yield
    finally:
        _run("execgatectl", "unconfigure", "podman")
        assert _files(PODMAN_DROP_IN) == before
        if installed != before:
            _run("execgatectl", "configure", "podman")
            assert _files(PODMAN_DROP_IN) == installed


def _read(path: str) -> str:
    with open(path, errors="replace") as f:
        return f.read()


def _oci_logs(cid: str) -> list[str]:
    return [p for root in ("/run/containers/storage", "/var/lib/containers/storage",
                           "/run/libpod")
            for p in glob.glob(f"{root}/**/{cid}*/**/oci-log", recursive=True)]


def test_podman_run_exec_rm_through_containers_conf(podman_configured: None, rootfs: str) -> None:
    """`--runtime execgate` names the drop-in's runtime; runtime_supports_json makes Podman pass
    --log, so a warning of execgate's (an unknown config key) lands in the container's oci-log."""
    with open(CONFIG) as f:
        config = f.read()
    name = f"eg-podman-{os.getpid()}"
    try:
        with open(CONFIG, "a") as f:
            f.write("\n[execgate_e2e_unknown_table]\nkey = 1\n")
        _run("podman", "run", "-d", "--name", name, "--runtime", "execgate", "--network", "none",
             "--rootfs", rootfs, "sleep", "inf")
        cid = _run("podman", "inspect", "--format", "{{.Id}}", name).stdout.strip()
        out = _run("podman", "exec", name, "cat", "/proc/self/cgroup").stdout
        assert os.path.basename(out.strip().split("::", 1)[1]).startswith("tool-"), out
        logs = _oci_logs(cid)
        assert logs, "Podman passed execgate a --log file (runtime_supports_json)"
        text = "".join(_read(p) for p in logs)
        assert "execgate: " in text and "execgate_e2e_unknown_table" in text, text
        _run("podman", "rm", "-f", "-t", "0", name)
        assert _run("podman", "ps", "-a", "-q", "--filter", f"name={name}").stdout.strip() == ""
    finally:
        with open(CONFIG, "w") as f:
            f.write(config)
        _run("podman", "rm", "-f", "-t", "0", name, check=False)


DAEMON_JSON = "/etc/docker/daemon.json"


def test_docker_restarts_after_unconfigure_when_execgate_was_its_default() -> None:
    """--set-as-default makes execgate Docker's default runtime; unconfigure takes the default
    with the runtime (Docker refuses a default-runtime it does not define) and puts daemon.json
    back byte for byte: Docker restarts on it, with runc as its default again."""
    with open(DAEMON_JSON, "rb") as f:
        before = f.read()
    try:
        out = _run("execgatectl", "configure", "docker", "--set-as-default").stdout
        assert "systemctl reload docker" in out, out
        _run("systemctl", "reload", "docker")
        wait_for(lambda: docker("info", "--format", "{{.DefaultRuntime}}", check=False)
                 .stdout.strip() == b"execgate", timeout=60, what="execgate as the default")
        _run("execgatectl", "unconfigure", "docker", "--runtime-path", "/nowhere")
        with open(DAEMON_JSON, "rb") as f:
            assert b"default-runtime" in f.read(), "another path's entry is not ours to take"
    finally:
        # As install.sh --uninstall does: the runtime install.sh registered stays until then.
        _run("execgatectl", "unconfigure", "docker")
        _run("execgatectl", "configure", "docker")
    with open(DAEMON_JSON, "rb") as f:
        after = f.read()
    assert b"default-runtime" not in after
    _run("systemctl", "restart", "docker", timeout=300)
    wait_for(lambda: docker("info", check=False).returncode == 0, timeout=120,
             what="Docker to start again")
    assert docker("info", "--format", "{{.DefaultRuntime}}").stdout.strip() == b"runc"
    assert after == before, "daemon.json as install.sh left it"
