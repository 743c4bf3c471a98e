"""install.sh's parts that run without root or a VM: --help, and the Docker check it makes."""

import subprocess
from pathlib import Path

SRC = Path(__file__).resolve().parents[2]


def test_help_is_the_header_and_nothing_after_it() -> None:
    out = subprocess.run(["bash", str(SRC / "install.sh"), "--help"], capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0
    assert out.stdout.startswith("Installs execgate on a container host")
    assert "set -euo pipefail" not in out.stdout  # the line after the header (issue 20)
    assert out.stdout.rstrip().endswith("PIP_FIND_LINKS=/path/to/wheels ./install.sh")


def test_an_install_asks_whether_docker_is_there_before_registering() -> None:
    """The order install.sh checks in: which engines are there (else no registration), then a
    dry run of each (refused before anything changes), then configure, after the install."""
    text = (SRC / "install.sh").read_text()
    install = text[text.index("command -v python3"):]
    present = install.index("selected=$(select_engines")
    assert present < install.index('engine_ctl configure "$e" $set_default --dry-run') < \
        install.index("pip install") < \
        install.index('out=$(engine_ctl configure "$e" $set_default)')


def test_a_host_without_docker_is_not_registered_with(tmp_path: Path) -> None:
    """Issue 20: on a host with no Docker, install.sh wrote /etc/docker/daemon.json anyway.
    install.sh's own engine selection runs here (its functions, the real `configure present`),
    with no daemon.json, no /etc/docker and no dockerd: Docker is not among the engines it
    registers with, so nothing writes a daemon.json."""
    import os
    import shutil
    import sys

    import pytest

    if any(os.path.exists(os.path.join(d, "dockerd"))
           for d in ("/usr/sbin", "/sbin", "/usr/local/sbin", "/usr/bin", "/usr/local/bin")):
        pytest.skip("this host has a dockerd")
    text = (SRC / "install.sh").read_text()

    def function(name: str) -> str:
        start = text.index(f"\n{name}() {{") + 1
        return text[start:text.index("\n}\n", start) + 3]

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(os.path.realpath(sys.executable))  # stdlib is enough
    (bin_dir / "sed").symlink_to(shutil.which("sed") or "/usr/bin/sed")
    daemon_json = tmp_path / "etc" / "docker" / "daemon.json"
    script = "\n".join([
        "set -u", f"src={SRC}", "engines=auto", "uninstall=0", "docker=1", "name=execgate",
        "runtime_path=/usr/local/bin/execgate", f"daemon_json={daemon_json}",
        "all_engines=(docker containerd crio podman)",
        function("engine_ctl"), function("select_engines"), "select_engines"])
    out = subprocess.run([shutil.which("bash") or "/bin/bash", "-c", script], capture_output=True,
                         text=True, timeout=60, env={"PATH": str(bin_dir)})
    assert out.returncode == 0 and out.stderr == "", out.stderr
    assert "docker" not in out.stdout.split(), out.stdout
    assert not daemon_json.parent.exists()
    (daemon_json.parent).mkdir(parents=True)  # Docker's directory alone says it is there
    out = subprocess.run([shutil.which("bash") or "/bin/bash", "-c", script], capture_output=True,
                         text=True, timeout=60, env={"PATH": str(bin_dir)})
    assert "docker" in out.stdout.split(), out.stdout
