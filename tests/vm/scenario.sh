#!/usr/bin/env bash
# The boot-persistence test: installs the .deb in a Debian 12 guest with
# real systemd and udev, makes volumes of every kind (ext4, xfs, block,
# read-only, on a second fstab-mounted file system, on a third one on a disk
# with 4096-byte sectors, disabled, plus a corrupt registry file) and two
# consumers of sparse-volumes.target, reboots and checks after each boot that
# every enabled volume is back exactly once before its fstab consumers. In
# between: stopping one volume leaves the consumers up, start/check/stop
# report the device's truth, boot 2 has unknown keys in the registry and
# boot 3 a config.toml that does not parse; then enable/disable/start/stop
# through real systemd, the package's upgrade, removal and purge, and a
# fresh install with the default config.toml before boot 4. The checks
# themselves live in guest.sh.
#
#   tests/vm/scenario.sh            (root; builds the packages if missing)
#
# The .deb is taken from ${CARGO_TARGET_DIR:-target}/packages.
# SV_VM_BREAK=generator removes the generator in the guest before the
# reboots: the test must then fail (proof that it can).
# SV_VM_SOFT=1 logs a failed check and goes on (a phase that fails outright
# is logged too), then lists every failure and exits 1: for seeing at once
# everything a build gets wrong.
set -euo pipefail
cd "$(dirname "$0")/../.."

# shellcheck source=tests/vm/lib.sh
. tests/vm/lib.sh
trap vm_cleanup EXIT

packages=${CARGO_TARGET_DIR:-target}/packages
debs=("$packages"/sparse-volume_*_amd64.deb)
if [[ ! -f ${debs[0]} ]]; then
    packaging/build-packages.sh
    debs=("$packages"/sparse-volume_*_amd64.deb)
fi

soft=${SV_VM_SOFT:-0}
phase() {
    local name=$1 start rc=0
    shift
    start=$(vm__now_ms)
    vm_log "=== $name"
    vm_ssh "SV_VM_BREAK=${SV_VM_BREAK:-} SV_VM_SOFT=$soft bash /root/guest.sh $*" </dev/null || rc=$?
    if ((rc != 0)); then
        [[ $soft == 1 ]] || exit "$rc"
        vm_log "=== $name: FAILED (exit $rc), going on (SV_VM_SOFT=1)"
        echo "$name: the phase failed (exit $rc)" >>"$SV_VM_RUN/soft-failures"
        return 0
    fi
    vm_log "=== $name: done in $(vm__since "$start")"
}

# reboot_checked N WHAT: a reboot whose failure names what that boot tests.
reboot_checked() {
    local boot=$1 what=$2
    # Where the shutdown starts in the journal, for verify's checks of it.
    vm_ssh 'date +%s >/root/reboot-at' </dev/null
    vm_reboot && return 0
    vm_log "FAIL: boot $boot ($what): the guest did not come back (expected every volume attached and the boot finished; see the serial console above)"
    exit 1
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
# data1: the second storage root; data2: the 4K-sector storage root.
vm_start 1G 1G@4k
vm_copy_in "${debs[0]}" "$(upgrade_deb)" tests/vm/guest.sh /root/
vm_ssh "dpkg -i /root/${debs[0]##*/}" </dev/null
phase setup setup
reboot_checked 1 "the volumes made at setup"
phase "verify after reboot 1" verify 1
phase "consumers of sparse-volumes.target" consumers
phase "reports tell the device's truth" device-truth
phase "unknown keys for boot 2" prepare-boot 2
reboot_checked 2 "unknown keys in config.toml and in a volume file"
phase "verify after reboot 2" verify 2
phase "config.toml that does not parse for boot 3" prepare-boot 3
reboot_checked 3 "a config.toml that does not parse"
phase "verify after reboot 3" verify 3
phase "good config.toml again" restore-config
phase "systemd commands" systemd
phase "detach by udev link" detach-by-link
phase "package upgrade, removal, purge, fresh install" package
reboot_checked 4 "after purge and a fresh install with the default config.toml"
phase "verify after reboot 4" verify 4
if [[ $soft == 1 ]]; then
    failures=$(
        cat "$SV_VM_RUN/soft-failures" 2>/dev/null || true
        vm_ssh 'cat /root/soft-failures 2>/dev/null' </dev/null || true
    )
    if [[ -n $failures ]]; then
        vm_log "SV_VM_SOFT=1: $(grep -c . <<<"$failures") failures:"
        sed 's/^/    /' <<<"$failures" >&2
        vm_stop
        vm_log "VM scenario FAILED in $(vm__since "$total") (accelerator: $SV_VM_ACCEL_USED)"
        exit 1
    fi
fi
vm_stop
vm_log "VM scenario passed in $(vm__since "$total") (accelerator: $SV_VM_ACCEL_USED)"
