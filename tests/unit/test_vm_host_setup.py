"""tests/vm/host-setup.sh: what a fresh machine is missing before either way in boots the VM.

`sudo ./demo.sh` on a host without Docker runs itself in the test VM, but it did not install
what that takes (qemu, debootstrap) nor the venv whose matplotlib draws its plots: on a fresh
machine it failed at the boot, and on one that had only run the tests it drew nothing. Both ways
in now share this script. Here it runs with a PATH that has none of the VM's tools, dry.
"""

import os
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "vm" / "host-setup.sh"


def _dry(tmp_path: Path, *args: str) -> str:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for tool in ("python3", "dirname"):  # what the script itself runs, nothing of the VM's
        link = bin_dir / tool
        if not link.exists():
            link.symlink_to(shutil.which(tool) or f"/usr/bin/{tool}")
    env = {"PATH": str(bin_dir), "EXECGATE_SETUP_DRY_RUN": "1"}
    out = subprocess.run([shutil.which("bash") or "/bin/bash", str(SCRIPT), *args], env=env,
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_a_fresh_machine_gets_the_vm_tools(tmp_path: Path) -> None:
    said = _dry(tmp_path, "bench")
    for package in ("qemu-system-x86", "debootstrap", "e2fsprogs"):
        assert package in said, said
    assert "venv extras: bench" in said


def test_unit_tests_alone_need_no_vm_tools(tmp_path: Path) -> None:
    said = _dry(tmp_path, "--no-vm", "test")
    assert "qemu" not in said and "debootstrap" not in said, said


def test_both_ways_in_set_the_host_up_before_the_vm() -> None:
    for script in ("demo.sh", "tests/run.sh"):
        text = (REPO / script).read_text()
        setup = text.find("tests/vm/host-setup.sh")
        boot = text.find("tests/vm/run.sh", text.find("\n", setup) if setup >= 0 else 0)
        assert setup >= 0, f"{script} does not set the host up"
        assert setup < boot, f"{script} boots the VM before setting the host up"
    assert os.access(SCRIPT, os.X_OK)


def test_the_demo_draws_its_plots_with_the_venv_on_a_native_host_too() -> None:
    """On a Docker host (no VM) the demo drew with the system python3: no matplotlib on a fresh
    host, Markdown only (issue 20). Both paths now draw through one report(), which sets the
    checkout's venv up first."""
    text = (REPO / "demo.sh").read_text()
    body = text[text.index("\nreport() {"):]
    body = body[:body.index("\n}\n")]
    assert "tests/vm/host-setup.sh\" --no-vm bench" in body
    assert ".venv/bin/python" in body and "--plots-optional" in body
    native = text[text.index("\nnative() {"):]
    native = native[:native.index("\n}\n")]
    assert "report \"$results/results.json\"" in native
    vm = text[text.index("running the demo inside the test VM"):]
    assert "report \"$results/demo/results.json\"" in vm
