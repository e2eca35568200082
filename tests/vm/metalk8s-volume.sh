#!/usr/bin/env bash
# Volumes as a MetalK8s node has them, in a test guest (tests/vm/guest.sh and
# tests/vm/ansible/check.sh run it; scenario.sh and config-management.sh
# copy it to /root):
#
#   metalk8s-volume.sh make KIND UUID MOUNT_POINT
#       KIND ext4, xfs or block: the file in /var/lib/metalk8s/storage/sparse
#       made the MetalK8s way (mkfs.ext4 -U, mkfs.xfs -m uuid=, a GPT by
#       sgdisk whose partition 1 has the UUID as its GUID), attached by an
#       instance of the stand-in unit (installed once), and its consumer
#       mounted through fstab (UUID=, or PARTUUID= on an ext4 the consumer
#       made in the partition), nofail
#
# The stand-in unit is written for these tests with the behaviour of the
# field's unit: a oneshot that stays active, `losetup --find --partscan`
# under a lock at start, and at stop a LOOP_CLR_FD of the device found
# through the volume's udev link (on a device in use the kernel makes that
# a pending detach: the device goes at the consumer's unmount). Its
# ExecStop writes a line to /var/lib/mk-cleanup-ran first, so a test can
# tell it never ran.
set -euo pipefail

MK_DIR=/var/lib/metalk8s/storage/sparse
UNIT_FILE=/etc/systemd/system/metalk8s-sparse-volume@.service
CLEANUP=/usr/local/libexec/mk-sparse-cleanup

install_unit() {
    [[ -e $UNIT_FILE ]] && return 0
    mkdir -p "$MK_DIR" "${CLEANUP%/*}"
    cat >"$CLEANUP" <<'SCRIPT'
#!/bin/sh
echo "$(date +%s) $1" >>/var/lib/mk-cleanup-ran
if [ -e "/dev/disk/by-uuid/$1" ]; then
    device=$(readlink -f "/dev/disk/by-uuid/$1")
else
    part=$(basename "$(readlink -f "/dev/disk/by-partuuid/$1")")
    device=/dev/$(basename "$(readlink -f "/sys/class/block/$part/..")")
fi
exec losetup -d "$device"
SCRIPT
    chmod 0755 "$CLEANUP"
    cat >"$UNIT_FILE" <<UNIT
[Unit]
Description=MetalK8s-style sparse loop volume %I (test stand-in)
RequiresMountsFor=$MK_DIR
AssertFileNotEmpty=$MK_DIR/%i

[Service]
Type=oneshot
ExecStart=/bin/flock --exclusive --wait 10 /run/lock/mk-sparse.lock /sbin/losetup --find --partscan $MK_DIR/%i
ExecStop=$CLEANUP %i
TimeoutStartSec=10
RemainAfterExit=yes

[Install]
WantedBy=multi-user.target
UNIT
    systemctl daemon-reload
}

make_volume() {
    local kind=$1 uuid=$2 mount_point=$3 file=$MK_DIR/$2 link source fs=ext4
    install_unit
    case $kind in
    ext4)
        truncate -s 64M "$file"
        mkfs.ext4 -q -F -U "$uuid" "$file"
        link=/dev/disk/by-uuid/$uuid source=UUID=$uuid
        ;;
    xfs)
        truncate -s 320M "$file"
        mkfs.xfs -q -f -m "uuid=$uuid" "$file"
        link=/dev/disk/by-uuid/$uuid source=UUID=$uuid fs=xfs
        ;;
    block)
        truncate -s 64M "$file"
        sgdisk --largest-new 1 --partition-guid "1:$uuid" "$file" >/dev/null
        link=/dev/disk/by-partuuid/$uuid source=PARTUUID=$uuid
        ;;
    *)
        echo "metalk8s-volume.sh: no kind $kind" >&2
        exit 2
        ;;
    esac
    systemctl enable --now --quiet "metalk8s-sparse-volume@$uuid.service"
    udevadm wait --timeout=30 "$link"
    [[ $kind != block ]] || mkfs.ext4 -q -F "$link"
    mkdir -p "$mount_point"
    echo "$source $mount_point $fs nofail,x-systemd.device-timeout=90s 0 2" >>/etc/fstab
    systemctl daemon-reload
    mount "$mount_point"
}

case ${1:-} in
make) make_volume "${2:?kind}" "${3:?uuid}" "${4:?mount point}" ;;
*)
    echo "usage: metalk8s-volume.sh make KIND UUID MOUNT_POINT" >&2
    exit 2
    ;;
esac
