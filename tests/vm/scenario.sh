#!/usr/bin/env bash
# The boot-persistence test: installs the .deb in a Debian 12 guest with
# real systemd and udev, makes volumes of every kind (ext4, xfs, block,
# read-only, on a second fstab-mounted file system, disabled, plus a corrupt
# registry file), reboots three times and checks after each boot that every
# enabled volume is back exactly once before its fstab consumers, then drives
# enable/disable/start/stop through real systemd and checks the package's
# upgrade and removal. The checks themselves live in guest.sh.
#
#   tests/vm/scenario.sh            (root; builds the packages if missing)
#
# SV_VM_BREAK=generator removes the generator in the guest before the
# reboots: the test must then fail (proof that it can).
set -euo pipefail
cd "$(dirname "$0")/../.."

# shellcheck source=tests/vm/lib.sh
. tests/vm/lib.sh
trap vm_cleanup EXIT

debs=(target/packages/sparse-volume_*_amd64.deb)
if [[ ! -f ${debs[0]} ]]; then
    packaging/build-packages.sh
    debs=(target/packages/sparse-volume_*_amd64.deb)
fi

phase() {
    local name=$1 start
    shift
    start=$(vm__now_ms)
    vm_log "=== $name"
    vm_ssh "SV_VM_BREAK=${SV_VM_BREAK:-} bash /root/guest.sh $*" </dev/null
    vm_log "=== $name: done in $(vm__since "$start")"
}

# The same package with a higher revision, to exercise a real upgrade
# (maintainer scripts see "configure <old version>") in the guest.
upgrade_deb() {
    local tree=$SV_VM_RUN/upgrade
    rm -rf "$tree"
    dpkg-deb -R "${debs[0]}" "$tree"
    sed -i 's/^Version: \(.*\)-\([0-9]*\)$/Version: \1-\2+upgrade1/' "$tree/DEBIAN/control"
    dpkg-deb --root-owner-group -Zxz -b "$tree" "$SV_VM_RUN/upgrade.deb" >/dev/null
    echo "$SV_VM_RUN/upgrade.deb"
}

total=$(vm__now_ms)
vm_start 1G
vm_copy_in "${debs[0]}" "$(upgrade_deb)" tests/vm/guest.sh /root/
vm_ssh "dpkg -i /root/${debs[0]##*/}" </dev/null
phase setup setup
for boot in 1 2 3; do
    vm_reboot
    phase "verify after reboot $boot" verify "$boot"
done
phase "systemd commands" systemd
phase "detach by udev link" detach-by-link
phase "package upgrade and removal" package
vm_stop
vm_log "VM scenario passed in $(vm__since "$total") (accelerator: $SV_VM_ACCEL_USED)"
