"""tests/vm/build-image.sh on a fresh machine: its standard output is the image directory alone.

boot.sh reads that path from build-image.sh's stdout. On a first build mkfs.ext4 printed
"Creating regular file …" there, qemu was handed that as a path and every boot failed (a cached
image hid it). Here the tools the build runs are stand-ins that write to stdout as the real
ones do, so the first-build path runs in a second, without debootstrap or a network.
"""

import os
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "tests" / "vm" / "build-image.sh"
KVER = "7.3.4+deb13-cloud-amd64"

FAKES = {
    # debootstrap lays out the few paths the recipe writes into (the kernel apt would install).
    "debootstrap": f"""root=${{@: -2:1}}
mkdir -p "$root/etc/apt" "$root/usr/sbin" "$root/usr/local/sbin" "$root/boot" \\
    "$root/etc/systemd/system" "$root/proc" "$root/sys" "$root/dev/pts"
echo "I: Retrieving InRelease"
touch "$root/boot/vmlinuz-{KVER}" "$root/boot/initrd.img-{KVER}"
""",
    "chroot": 'echo "chroot: $*"; cat >/dev/null\n',
    "mount": 'echo "mount: $*"\n',
    "umount": "exit 0\n",
    # As the real one: "Creating regular file PATH" on stdout, even with -q.
    "mkfs.ext4": 'img=${@: -2:1}; echo "Creating regular file $img"; : >"$img"\n',
}


def _fake_path(tmp_path: Path) -> str:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in FAKES.items():
        (bin_dir / name).write_text("#!/bin/bash\n" + body)
        (bin_dir / name).chmod(0o755)
    return f"{bin_dir}:{os.environ['PATH']}"


def _build(tmp_path: Path, path: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": path, "EXECGATE_VM_CACHE": str(tmp_path / "cache"),
           "TMPDIR": str(tmp_path)}
    return subprocess.run(["bash", str(SCRIPT)], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)


def test_first_build_prints_only_the_image_directory(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        import pytest

        pytest.skip("build-image.sh refuses to run as non-root")
    path = _fake_path(tmp_path)
    first = _build(tmp_path, path)
    assert first.returncode == 0, first.stderr
    lines = first.stdout.splitlines()
    assert len(lines) == 1, f"stdout must be the image path alone: {first.stdout!r}"
    image = Path(lines[0])
    assert image.parent == tmp_path / "cache"
    for name in ("rootfs.img", "vmlinuz", "initrd.img", "done"):
        assert (image / name).exists(), name
    assert "Creating regular file" in first.stderr  # the tools' output is kept, on stderr

    cached = _build(tmp_path, path)
    assert cached.returncode == 0 and cached.stdout == first.stdout


def test_a_first_boot_hands_qemu_the_built_images_paths(tmp_path: Path) -> None:
    """The whole first-run path as boot.sh takes it (issue 20): an empty cache, the image built
    (tools that print to stdout, as the real ones do), then qemu, here a recorder, handed the
    image's kernel and root disk, not a line of mkfs.ext4's output."""
    if os.geteuid() != 0:
        import pytest

        pytest.skip("build-image.sh refuses to run as non-root")
    path = _fake_path(tmp_path)
    bin_dir = Path(path.split(":", 1)[0])
    argv_file = tmp_path / "qemu.argv"
    (bin_dir / "qemu-system-x86_64").write_text(
        f"#!/bin/bash\nprintf '%s\\n' \"$@\" > {argv_file}\n")
    (bin_dir / "qemu-system-x86_64").chmod(0o755)
    (bin_dir / "debugfs").write_text("#!/bin/bash\nexit 0\n")
    (bin_dir / "debugfs").chmod(0o755)
    payload = tmp_path / "payload"
    payload.mkdir()
    env = {**os.environ, "PATH": path, "EXECGATE_VM_CACHE": str(tmp_path / "cache"),
           "TMPDIR": str(tmp_path), "EXECGATE_VM_TRIES": "1"}
    p = subprocess.run(["bash", str(SCRIPT.parent / "boot.sh"), str(payload),
                        str(tmp_path / "results"), "30"], env=env, cwd=tmp_path,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 125, p.stderr  # the recorder ran no payload: "never ran it"
    args = argv_file.read_text().splitlines()
    (image,) = {Path(a).parent for a in args if a.endswith("/vmlinuz")}
    assert image.parent == tmp_path / "cache" and (image / "vmlinuz").exists()
    assert f"file={image}/rootfs.img,format=raw,if=virtio,snapshot=on" in args
    assert not [a for a in args if "Creating regular file" in a]
