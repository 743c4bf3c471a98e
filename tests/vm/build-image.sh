#!/usr/bin/env bash
# Builds the test VM: a Debian trixie rootfs with the sched_ext-capable backports kernel, Docker,
# containerd, Podman, runc, python3 and the BPF toolchain, as a raw ext4 image plus the kernel and
# initramfs to boot it.
# Cached under $EXECGATE_VM_CACHE/<key>, where the key hashes this script: a changed recipe rebuilds.
set -euo pipefail
# Standard output carries the image directory and nothing else (boot.sh reads it): every tool's
# output goes to stderr (mkfs.ext4 prints "Creating regular file ..." on stdout, -q or not).
exec 3>&1 1>&2

here=$(cd "$(dirname "$0")" && pwd)
cache=${EXECGATE_VM_CACHE:-/var/cache/execgate-vm}
mirror=${EXECGATE_VM_MIRROR:-http://deb.debian.org/debian}
kver=7.3.4+deb13-cloud-amd64
key=$(cat "$here/build-image.sh" "$here/guest-entry.sh" | sha256sum | cut -c1-16)
out=$cache/$key

if [[ -f $out/done ]]; then
    echo "$out" >&3
    exit 0
fi
# Two callers at once (the suite's lanes on a fresh machine): one builds, the other waits and
# takes its image.
mkdir -p "$cache"
exec 7>"$cache/.build.lock"
flock 7
if [[ -f $out/done ]]; then
    echo "$out" >&3
    exit 0
fi
[[ $(id -u) == 0 ]] || { echo "build-image.sh: must run as root (debootstrap, chroot)" >&2; exit 1; }

work=$(mktemp -d "${TMPDIR:-/tmp}/execgate-vm.XXXXXX")
root=$work/root
cleanup() {
    for m in dev/pts dev proc sys; do umount -l "$root/$m" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT

log() { echo "[build-image] $*" >&2; }

log "debootstrap trixie into $root"
debootstrap --variant=minbase --include=systemd-sysv,apt \
    trixie "$root" "$mirror" >"$work/debootstrap.log" 2>&1 \
    || { tail -30 "$work/debootstrap.log" >&2; exit 1; }

cat >"$root/etc/apt/sources.list" <<SRC
deb $mirror trixie main
deb $mirror trixie-backports main
SRC
# No service may start inside the chroot.
printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
chmod +x "$root/usr/sbin/policy-rc.d"

mount -t proc proc "$root/proc"
mount -t sysfs sys "$root/sys"
mount --bind /dev "$root/dev"
mount --bind /dev/pts "$root/dev/pts"

in_root() { chroot "$root" env DEBIAN_FRONTEND=noninteractive LC_ALL=C.UTF-8 "$@"; }

log "apt: kernel, docker, runc, python, bpf toolchain"
in_root apt-get update -qq
in_root apt-get install -y -qq --no-install-recommends \
    initramfs-tools kmod udev iproute2 procps util-linux e2fsprogs psmisc \
    docker.io docker-cli containerd runc podman netavark conmon \
    python3 python3-venv python3-pip python3-pytest python3-msgpack python3-psutil \
    python3-bpfcc busybox-static libc6-dev clang llvm libbpf-dev \
    >"$work/apt.log" 2>&1 || { tail -30 "$work/apt.log" >&2; exit 1; }
in_root apt-get install -y -qq --no-install-recommends -t trixie-backports \
    "linux-image-$kver" "linux-headers-$kver" bpftool \
    >>"$work/apt.log" 2>&1 || { tail -30 "$work/apt.log" >&2; exit 1; }
in_root apt-get clean
rm -f "$root/usr/sbin/policy-rc.d"

log "configure: fstab, docker, autologin-free test entry"
echo "execgate-vm" >"$root/etc/hostname"
cat >"$root/etc/fstab" <<FSTAB
/dev/vda / ext4 rw,relatime 0 1
FSTAB
mkdir -p "$root/etc/docker"
cat >"$root/etc/docker/daemon.json" <<JSON
{
  "iptables": false,
  "ip6tables": false,
  "bridge": "none",
  "runtimes": {
    "sentinel": {"path": "/usr/bin/runc"}
  }
}
JSON
install -m 0755 "$here/guest-entry.sh" "$root/usr/local/sbin/execgate-guest-entry"
cat >"$root/etc/systemd/system/execgate-guest.service" <<UNIT
[Unit]
Description=execgate test-bed entry (runs the payload on /dev/vdb, then powers off)
After=local-fs.target
Wants=local-fs.target

[Service]
Type=oneshot
ExecStart=/usr/local/sbin/execgate-guest-entry
StandardOutput=journal+console
StandardError=journal+console
TimeoutStartSec=infinity

[Install]
WantedBy=multi-user.target
UNIT
in_root systemctl enable execgate-guest.service >/dev/null 2>&1
# Things that only slow a headless test boot.
for u in apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer fstrim.timer systemd-timesyncd.service; do
    in_root systemctl disable "$u" >/dev/null 2>&1 || true
    in_root systemctl mask "$u" >/dev/null 2>&1 || true
done
in_root systemctl set-default multi-user.target >/dev/null 2>&1
echo 'root:execgate' | in_root chpasswd

for m in dev/pts dev proc sys; do umount -l "$root/$m"; done

mkdir -p "$work/out"
cp "$root/boot/vmlinuz-$kver" "$work/out/vmlinuz"
cp "$root/boot/initrd.img-$kver" "$work/out/initrd.img"
log "mkfs.ext4 -d (no mount needed)"
mkfs.ext4 -q -F -L execgate-root -d "$root" "$work/out/rootfs.img" 8G
mkdir -p "$cache"
rm -rf "$out"
mv "$work/out" "$out"
touch "$out/done"
log "image ready: $out"
echo "$out" >&3
