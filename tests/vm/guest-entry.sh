#!/bin/bash
# Runs inside the test VM at boot: mounts the payload disk (/dev/vdb), runs its run.sh, stores the
# exit code next to the results, and powers off. The host reads the disk back with debugfs.
set -u
mkdir -p /mnt/payload
if ! mount -t ext4 /dev/vdb /mnt/payload; then
    echo "EXECGATE-GUEST: no payload disk" >/dev/console
    systemctl poweroff --force --force
fi
mkdir -p /mnt/payload/results
echo "EXECGATE-GUEST: booted $(uname -r)" >/dev/console
( cd /mnt/payload && bash ./run.sh ) 2>&1 | tee /mnt/payload/results/console.log >/dev/console
rc=${PIPESTATUS[0]}
echo "$rc" >/mnt/payload/results/rc
echo "EXECGATE-GUEST: done rc=$rc" >/dev/console
sync
umount /mnt/payload
systemctl poweroff --force --force
