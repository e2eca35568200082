#!/usr/bin/env bash
# The endurance run: power cuts, a removed package at shutdown, and many
# volumes at one boot, in a Debian guest (SV_VM_SUITE, bookworm by
# default) with real systemd and udev. The guest half is
# endurance-guest.sh.
#
#   tests/vm/endurance.sh           (root; builds the packages if missing)
#
# 1. Power cuts: SV_VM_POWER_CUTS times (10 by default; `tests/run --soak`
#    asks for 100), a churn of create, resize, remove, enable, disable,
#    apply, start and stop runs beside three consumers writing fsynced
#    records (an ext4 and an xfs volume, a block volume's partition), and
#    the power is cut (QMP system_reset) after a delay that differs from
#    one cut to the next. After each boot and one `check --repair`: check
#    is clean, every registry file parses, every enabled volume is attached
#    exactly once with its link, every record whose fsync returned reads
#    back, and e2fsck -fn and xfs_repair -n find the file systems clean.
#    system_reset takes the guest's memory (page cache, queued requests);
#    what the guest had handed to the virtual disks survives (qemu's cache
#    is the host's), so a disk that loses its own write cache is not
#    simulated. The acknowledgements go to a raw disk of their own and the
#    consumers live on a file system of their own, so that the writers'
#    fsyncs commit nothing the commands wrote.
# 2. The package removed (not purged) with the consumers mounted, then a
#    clean reboot: the shutdown unmounts them without an I/O error (the
#    console shows its end), and a reinstall brings the volumes back with
#    their blockdev@ targets; the shutdown after it unmounts each consumer
#    before its volume detaches (checked at the next boot).
# 3. SV_VM_SCALE_VOLUMES more volumes (200 by default, half ext4, half
#    block) attached at one boot, with a root service asking for inotify
#    instances all along: it is never refused, and our attaches hold at
#    most 32 between them. udev's CPU time at that boot is reported, and
#    the metrics timer's textfile of that boot has I/O series for every
#    attached volume.
#    SV_VM_UDEV_COMPARE=1 adds a boot with the block volumes' partitions
#    all named "sparse-volume" (as made before 0.3) and reports udev's CPU
#    time again.
#
# The counts are printed at the end as "endurance:" lines (the CI log) and
# kept in docs/reliability.md. Exit status 75: the guest's kernel panicked.
set -euo pipefail
target=${CARGO_TARGET_DIR:-}
[[ -z $target || $target == /* ]] || target=$PWD/$target
cd "$(dirname "$0")/../.."
target=${target:-$PWD/target}

# shellcheck source=tests/vm/lib.sh
. tests/vm/lib.sh
on_exit() {
    # $? first: `local` is a command, and would leave 0 there.
    local rc=$?
    rc=$(vm_status_after_panic "$rc")
    if ((rc != 0 && rc != 75)) && [[ -n $SV_VM_PID ]] && vm__qemu_alive; then
        vm_log "the churn's last steps and the writers' errors in the guest:"
        vm_ssh 'tail -n 30 /root/churn.log; tail -n 5 /root/writers.log' </dev/null >&2 || true
    fi
    vm_cleanup || true
    exit "$rc"
}
trap on_exit EXIT

cuts=${SV_VM_POWER_CUTS:-10}
scale=${SV_VM_SCALE_VOLUMES:-200}
deb=${SV_VM_PACKAGE:-$(vm_package_under_test "$target")}

phase() {
    local name=$1 start
    shift
    start=$(vm__now_ms)
    vm_log "=== $name"
    vm_ssh "bash /root/endurance-guest.sh $*" </dev/null
    vm_log "=== $name: done in $(vm__since "$start")"
}

# The moment of cut N, in tenths of a second after the churn started:
# spread over 0.5 to 8 s, in an order that does not repeat within 17 cuts,
# so that cuts fall early in a command (while it creates or formats) and
# late (while it waits for udev or the writers' fsyncs queue up).
cut_delay() { echo $((5 + ($1 * 7 % 17) * 75 / 16)); }

total=$(vm__now_ms)
# No data disk: the volumes live on the guest's root file system.
# Disk 1: the consumers' storage root; disk 2: the writers' raw
# acknowledgements (endurance-guest.sh).
vm_start 1G 64M
# shellcheck disable=SC2016 # expanded in the guest
vm_log "guest: $(vm_ssh '. /etc/os-release && echo "$PRETTY_NAME, $(systemctl --version | head -n 1 | cut -d" " -f1,2), kernel $(uname -r)"' </dev/null)"
vm_copy_in "$deb" tests/vm/endurance-guest.sh /root/
vm_ssh "dpkg -i /root/${deb##*/} >/dev/null" </dev/null
phase "three consumers" setup

# The churn's step that had begun and not ended when cut N came, from the
# kernel log on the serial console (the guest's journal loses its last
# seconds at a power cut).
in_flight() {
    local last
    last=$(grep -a -o "endurance-churn: cut $1 step [0-9]* [a-z-]* [a-z]*" "$SV_VM_RUN/serial.log" | tail -n 1)
    case $last in
    *" begin") awk '{ print $6 }' <<<"$last" ;;
    "") echo "nothing-begun" ;;
    *) echo "between-steps" ;;
    esac
}

cut_in=()
for ((cut = 1; cut <= cuts; cut++)); do
    delay=$(cut_delay "$cut")
    old=$(vm_boot_id)
    phase "power cut $cut of $cuts: churn and writers, the cut after $((delay / 10)).$((delay % 10)) s" churn "$cut" "$((cut * 7919))"
    sleep "$((delay / 10)).$((delay % 10))"
    vm_power_cut "$old"
    cut_in+=("$(in_flight "$cut")")
    vm_log "power cut $cut came during: ${cut_in[-1]}"
    phase "after power cut $cut: one repair, then check, registry, devices, records, file systems" verify-cut "$cut" "$delay"
done

phase "the package removed with the consumers mounted" remove-package
console_before=$(wc -l <"$SV_VM_RUN/serial.log")
vm_reboot
# That shutdown's end (systemd-shutdown's last unmounts and detaches) is on
# the console only: the journal has stopped by then.
if tail -n "+$console_before" "$SV_VM_RUN/serial.log" | grep -a -E 'I/O error.*loop|Buffer I/O error|EXT4-fs (error|warning).*loop|XFS \(loop[0-9]+\).*(error|shutdown)'; then
    vm_log "FAIL: the shutdown with the package removed had I/O or file system errors on loop devices (above)"
    exit 1
fi
phase "that shutdown, then the package again" verify-removed

phase "$scale more volumes and an inotify probe" scale-setup "$scale"
vm_reboot
phase "a boot with $((scale + 3)) volumes" verify-scale "unique-partition-names"
if [[ ${SV_VM_UDEV_COMPARE:-0} == 1 ]]; then
    phase "the block volumes' partitions named alike, as before 0.3" share-partition-names
    vm_reboot
    phase "a boot with $((scale + 3)) volumes, partitions named alike" verify-scale "shared-partition-name"
fi

results=$(vm_ssh 'cat /root/endurance-results' </dev/null)
vm_stop
cuts_passed=$(grep -c '^RESULT ' <<<"$results" || true)
records=$({ grep -o 'records=[^ ]*' <<<"$results" || true; } | { grep -oE ':[0-9]+' || true; } | tr -d : | awk '{ n += $1 } END { print n + 0 }')
repaired=$({ grep -o 'repaired=[^ ]*' <<<"$results" || true; } | cut -d= -f2 | tr ',' '\n' | { grep -v '^none$' || true; } | sort | uniq -c |
    awk '{ printf "%s%s x%d", sep, $2, $1; sep = ", " }')
during=$(printf '%s\n' "${cut_in[@]}" | sort | uniq -c | awk '{ printf "%s%s x%d", sep, $2, $1; sep = ", " }')
echo "endurance: $cuts_passed power cuts, each followed by one check --repair and a clean check; cuts came during: ${during:-none}; $records acknowledged records read back; repairs after the cuts: ${repaired:-none}"
grep -E '^(SCALE|METRICS) ' <<<"$results" | sed -E 's/^(SCALE|METRICS) /endurance: /'
vm_log "endurance run passed on $SV_VM_SUITE in $(vm__since "$total") (accelerator: $SV_VM_ACCEL_USED)"
