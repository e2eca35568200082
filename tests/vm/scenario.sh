#!/usr/bin/env bash
# The boot-persistence test: installs the .deb in a Debian guest
# (SV_VM_SUITE: bookworm, the default, or trixie) with
# real systemd and udev, makes volumes of every kind (ext4, xfs, block,
# read-only, on a second fstab-mounted file system, on a third one on a disk
# with 4096-byte sectors, disabled, plus a corrupt registry file) and two
# consumers of sparse-volumes.target, reboots and checks after each boot that
# every enabled volume is back exactly once before its fstab consumers. In
# between: stopping one volume leaves the consumers up, start/check/stop
# report the device's truth; boot 2 has a config.toml that does not parse
# and an unknown key in a volume file; then enable/disable/start/stop, the
# unit states list and status report, remove and a failed start through
# real systemd, the package's upgrade, removal and purge, and a fresh
# install whose default config.toml gets an unknown key before boot 3,
# which also has sparse_volume.skip= naming two volumes on the kernel
# command line; boot 4 has sparse_volume=off. After every boot
# `sparse-volume check` must find nothing but what the scenario leaves on
# purpose. The checks themselves live in guest.sh. Boot 1 is a reboot,
# boots 2 to 4 a poweroff and a new qemu (a switch is on the kernel command
# line of that boot only).
#
#   tests/vm/scenario.sh            (root; builds the packages if missing)
#
# The .deb is the newest in ${CARGO_TARGET_DIR:-target}/packages, where
# packaging/build-packages.sh writes.
# SV_VM_NEGATIVE_CONTROL=1 adds boot 5 with the generator removed, which
# must fail, and for the reason that matters: a volume's device never came
# (tests/run sets it for the last guest; it costs one boot).
# SV_VM_SCOPE=distro (tests/run sets it for the second guest) leaves out
# what was proven on the first guest and depends on nothing the
# distribution brings, only on our code: boot 2 (a config.toml that does
# not parse: what the generator logs), the detach by udev link, the
# metrics phase, boot 4 (sparse_volume=off), the README's commands (the
# README's platform is Debian 12), the clone and export (our copy and
# checksum code on an ext4 root without reflink), the reports' device
# truth (the loop driver's answers: the Debian 12 guest's 6.1 kernel and
# this host's newer one are the ends that differ) and the MetalK8s take-over
# (proven on both guests when it was built; its systemd side, D-Bus
# calls and a generator's mask, behaves alike in systemd 252 and 257). Whatever meets systemd,
# udev, the kernel, util-linux or dpkg still runs: setup, the partition
# check, boots 1 and 3 (after purge and a fresh install), encrypted
# volumes, consumers, systemd commands, unit states and the package phase.
# SV_VM_QUICK=1 runs only setup, unit-states and the boots with the
# emergency switches (for work on those steps; not a test run).
# Exit status 75: the guest's kernel panicked (the oops is printed).
# SV_VM_SOFT=1 logs a failed check and goes on (a phase that fails outright
# is logged too), then lists every failure and exits 1: for seeing at once
# everything a build gets wrong.
set -euo pipefail
# Where packaging/build-packages.sh writes: cargo's target directory, a
# relative CARGO_TARGET_DIR taken from where we were started, as cargo does.
target=${CARGO_TARGET_DIR:-}
[[ -z $target || $target == /* ]] || target=$PWD/$target
cd "$(dirname "$0")/../.."
target=${target:-$PWD/target}

# shellcheck source=tests/vm/lib.sh
. tests/vm/lib.sh
on_exit() {
    # $? first: `local` is a command, and would leave 0 there (which made
    # every failed phase exit 0, from 53cbfe3 until found in issue 25).
    local rc=$?
    rc=$(vm_status_after_panic "$rc")
    vm_cleanup || true
    exit "$rc"
}
trap on_exit EXIT

deb=$(vm_package_under_test "$target")
debs=("$deb")
# The last release: setup runs on it, and the package under test replaces
# it with volumes attached and mounted (tests/vm/previous-release/).
previous=$(ls tests/vm/previous-release/sparse-volume_*_amd64.deb)

soft=${SV_VM_SOFT:-0}
scope=${SV_VM_SCOPE:-full}
[[ $scope == full || $scope == distro ]] || {
    echo "scenario.sh: SV_VM_SCOPE must be full or distro, not $scope" >&2
    exit 2
}
phase() {
    local name=$1 start rc=0
    shift
    start=$(vm__now_ms)
    vm_log "=== $name"
    vm_ssh "SV_VM_SOFT=$soft bash /root/guest.sh $*" </dev/null || rc=$?
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
    vm_ssh 'date +%s >/root/reboot-at; systemctl list-units --no-legend --plain --state=active "sparse-volume@*.service" | grep -c . >/root/active-at-reboot || true' </dev/null
    vm_reboot && return 0
    vm_log "FAIL: boot $boot ($what): the guest did not come back (expected every volume attached and the boot finished; see the serial console above)"
    exit 1
}

# restart_checked N WHAT: boot N on a new qemu (a clean poweroff first),
# with the emergency switch guest.sh prepared for it (/root/boot-switch) on
# the kernel command line of that boot only; none when there is no file.
restart_checked() {
    local boot=$1 what=$2 append
    append=$(vm_ssh 'cat /root/boot-switch 2>/dev/null || true' </dev/null)
    vm_ssh 'date +%s >/root/reboot-at; systemctl list-units --no-legend --plain --state=active "sparse-volume@*.service" | grep -c . >/root/active-at-reboot || true' </dev/null
    vm_restart "$append" && return 0
    vm_log "FAIL: boot $boot ($what${append:+, kernel command line +\"$append\"}): the guest did not come back (see the serial console above)"
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

# Boot 5 without the generator must fail, because a volume's device never
# came: otherwise these boots could not see a missing generator. The guest
# is left in emergency mode (no SSH), so qemu is stopped here.
negative_control() {
    local why
    phase "negative control: the generator removed for boot 5" prepare-boot 5
    vm_log "negative control: boot 5 must fail; the errors that follow are expected"
    if vm_restart ""; then
        vm_log "FAIL: negative control: boot 5 came up without the generator: these boots cannot see a missing generator"
        exit 1
    fi
    why=$(vm__serial_missing_device) || {
        vm_log "FAIL: negative control: boot 5 failed, but not because a volume's device was missing (see above)"
        exit 1
    }
    vm__kill_qemu
    vm_log "negative control passed: without the generator boot 5 failed as it must: $(sed -e 's/^[[:space:]]*//' <<<"$why")"
}

total=$(vm__now_ms)
# data1: the second storage root; data2: the 4K-sector storage root.
vm_start 1G 1G@4k
# The CI log names what each guest proved things on.
# shellcheck disable=SC2016 # expanded in the guest
vm_log "guest: $(vm_ssh '. /etc/os-release && echo "$PRETTY_NAME, $(systemctl --version | head -n 1 | cut -d" " -f1,2), $(losetup --version), kernel $(uname -r)"' </dev/null)"
vm_copy_in "${debs[0]}" "$(upgrade_deb)" tests/vm/guest.sh tests/vm/partition-once.sh tests/vm/metalk8s-volume.sh README.md \
    docs/guide/emergency-switch.md docs/guide/monitoring.md docs/guide/take-over.md docs/guide/encryption.md /root/
vm_ssh "mkdir -p /root/previous" </dev/null
vm_copy_in "$previous" /root/previous/
vm_ssh "dpkg-deb -f /root/previous/${previous##*/} Version >/root/previous/version && dpkg -i /root/previous/${previous##*/}" </dev/null
phase "setup, on the last release's package" setup
phase "upgrade from the last release with volumes attached and mounted" upgrade-from-previous
if [[ $scope == full ]]; then
    phase "a clone of the mounted consumer, under its own identity" clone
    phase "MetalK8s-style volumes taken over with their consumers mounted" take-over
fi
if [[ ${SV_VM_QUICK:-0} == 1 ]]; then
    # For work on these steps only: no boot 1 and 2, no package phase.
    vm_log "SV_VM_QUICK=1: only the unit states and the two emergency-switch boots"
    phase "unit states, enable, stop, remove through systemd" unit-states
    phase "an unknown key in config.toml and sparse_volume.skip= for boot 3" prepare-boot 3
    restart_checked 3 "an unknown key in config.toml, two volumes skipped"
    phase "verify after boot 3" verify 3
    phase "the emergency switch guide's commands, as written" emergency-switch-doc
    phase "sparse_volume=off for boot 4" prepare-boot 4
    restart_checked 4 "sparse_volume=off: no volume, the boot still reaches multi-user.target"
    phase "verify after boot 4" verify 4
else
    phase "encrypted volumes: the guide's and an xfs one, mounted by UUID=; a block one, read raw" encrypted-create
    phase "a block volume's partition appears once per attach" partition-once
    if [[ $scope == full ]]; then
        phase "the README's first volume, as written" readme-create
    fi
    reboot_checked 1 "the volumes made at setup"
    if [[ $scope == full ]]; then
        # First, so that the checks of boot 1 see only the scenario's volumes.
        phase "the README's commands after the reboot, as written" readme-check
    fi
    phase "verify after reboot 1" verify 1
    phase "encrypted volumes after reboot 1: unlocked unattended, the shutdown's order" encrypted-check 1
    phase "consumers of sparse-volumes.target" consumers
    if [[ $scope == full ]]; then
        phase "reports tell the device's truth" device-truth
        phase "a config.toml that does not parse and an unknown key in a volume file for boot 2" prepare-boot 2
        restart_checked 2 "a config.toml that does not parse, an unknown key in a volume file"
        phase "verify after boot 2" verify 2
        phase "good config.toml again" restore-config
    fi
    phase "systemd commands" systemd
    phase "unit states, enable, stop, remove through systemd" unit-states
    if [[ $scope == full ]]; then
        phase "detach by udev link" detach-by-link
        phase "metrics timer and space pressure under real systemd" metrics
    fi
    phase "package upgrade, removal, purge, fresh install" package
    phase "an unknown key in config.toml and sparse_volume.skip= for boot 3" prepare-boot 3
    restart_checked 3 "after purge and a fresh install with the default config.toml plus an unknown key, two volumes skipped, an encrypted volume's key file gone"
    phase "encrypted volumes after boot 3: the one without its key failed alone; the guide's recoveries (filesystem and block mode)" encrypted-check 3
    phase "verify after boot 3" verify 3
    phase "the emergency switch guide's commands, as written" emergency-switch-doc
    if [[ $scope == full ]]; then
        phase "sparse_volume=off for boot 4" prepare-boot 4
        restart_checked 4 "sparse_volume=off: no volume, the boot still reaches multi-user.target"
        phase "verify after boot 4" verify 4
    fi
    if [[ ${SV_VM_NEGATIVE_CONTROL:-0} == 1 ]]; then
        negative_control
    fi
fi
if [[ $soft == 1 ]]; then
    failures=$(
        cat "$SV_VM_RUN/soft-failures" 2>/dev/null || true
        vm_ssh 'cat /root/soft-failures 2>/dev/null' </dev/null || true
    )
    if [[ -n $failures ]]; then
        vm_log "SV_VM_SOFT=1: $(grep -c . <<<"$failures") failures:"
        sed 's/^/    /' <<<"$failures" >&2
        vm_stop
        vm_log "VM scenario FAILED on $SV_VM_SUITE in $(vm__since "$total") (accelerator: $SV_VM_ACCEL_USED)"
        exit 1
    fi
fi
vm_stop
boots=$([[ $scope == full ]] && echo "1 2 3 4" || echo "1 3")
[[ ${SV_VM_NEGATIVE_CONTROL:-0} != 1 ]] || boots+=" 5"
vm_log "VM scenario passed on $SV_VM_SUITE in $(vm__since "$total"), boots $boots after the first, scope $scope (accelerator: $SV_VM_ACCEL_USED)"
