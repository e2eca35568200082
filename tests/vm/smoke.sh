#!/usr/bin/env bash
# Self-test of the VM harness (tests/vm/lib.sh). Run as root from anywhere:
#
#   bash tests/vm/smoke.sh
#
# Builds or reuses the image, boots it with a 1 GiB data disk, checks the
# system state, checks that the guest kernel makes partition devices and
# by-partuuid links for a GPT on a loop device, installs and copies files,
# reboots and checks the persistent journal, powers off.
# Exits non-zero on any failure; always kills its qemu.
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"

PHASE=""
TIMES=()

log() { printf '%s smoke: %s\n' "$(date +%T.%3N)" "$*" >&2; }

# phase NAME CMD...: runs CMD, records how long it took.
phase() {
    local name=$1 start
    shift
    PHASE=$name
    log "--- $name"
    start=$(vm__now_ms)
    "$@"
    TIMES+=("$(printf '%-14s %s' "$name" "$(vm__since "$start")")")
    PHASE=""
}

on_exit() {
    local rc=$?
    if ((rc != 0)); then
        log "FAILED${PHASE:+ in phase \"$PHASE\"} (exit $rc)"
    fi
    vm_cleanup
    return "$rc"
}

check_system() {
    local kernel state
    kernel=$(vm_ssh uname -r </dev/null)
    log "guest kernel: $kernel"
    state=$(vm_ssh 'timeout 120 systemctl is-system-running --wait' </dev/null) || true
    log "system state: ${state:-?}"
    case $state in
    running) ;;
    degraded)
        log "failed units (accepted, but look at them):"
        vm_ssh 'systemctl --failed --no-pager --plain --no-legend' </dev/null >&2
        ;;
    *)
        vm__fail "system state is '$state', expected running or degraded"
        ;;
    esac
}

# GPT on a loop device: loopNp1 must appear and by-partuuid must point to it.
check_gpt() {
    local uuid
    uuid=$(cat /proc/sys/kernel/random/uuid)
    vm_ssh bash -s -- "$uuid" <<'EOF'
set -euo pipefail
uuid=$1
img=/var/tmp/sv-smoke-gpt.img
rm -f "$img"
truncate -s 64M "$img"
# Not -q: on a file without a GPT, `sgdisk -q` writes nothing and exits 0.
sgdisk -n1:0:0 -u1:"$uuid" "$img" >/dev/null
dev=$(losetup -f -P --show "$img")
trap 'losetup -d "$dev"; rm -f "$img"' EXIT
udevadm wait --timeout=30 "/dev/disk/by-partuuid/$uuid"
target=$(readlink -f "/dev/disk/by-partuuid/$uuid")
echo "loop device $dev, by-partuuid/$uuid -> $target" >&2
[ "$target" = "${dev}p1" ] || { echo "expected ${dev}p1" >&2; exit 1; }
EOF
}

# The harness's own file and disk plumbing: a data disk, vm_install_files,
# vm_copy_in.
check_files() {
    local tmp size
    size=$(vm_ssh 'blockdev --getsize64 /dev/disk/by-id/virtio-sv-data1' </dev/null)
    [[ $size == 1073741824 ]] || vm__fail "data disk virtio-sv-data1 has $size bytes, expected 1 GiB"
    tmp=$(mktemp -d "$SV_VM_RUN/smoke.XXXXXX") # vm_cleanup removes it
    printf '#!/bin/sh\necho hello\n' >"$tmp/hello"
    printf '[Unit]\nDescription=smoke\n[Service]\nExecStart=/usr/local/bin/sv-smoke-hello\n' \
        >"$tmp/sv-smoke.service"
    mkdir "$tmp/tree"
    echo one >"$tmp/tree/one"
    vm_install_files "$tmp/hello" /usr/local/bin/sv-smoke-hello 0755 \
        "$tmp/sv-smoke.service" /etc/systemd/system/sv-smoke.service 0644
    vm_copy_in "$tmp/tree" /root/
    vm_ssh bash -s <<'EOF'
set -euo pipefail
[ "$(stat -c %a:%U /usr/local/bin/sv-smoke-hello)" = 755:root ]
[ "$(stat -c %a /etc/systemd/system/sv-smoke.service)" = 644 ]
[ "$(stat -c %a /usr/local/bin)" = 755 ]
systemctl start sv-smoke.service
[ "$(cat /root/tree/one)" = one ]
EOF
}

check_reboot() {
    local before after
    before=$(vm_boot_id)
    vm_reboot
    after=$(vm_boot_id)
    [[ $after != "$before" ]] || vm__fail "boot_id did not change"
}

check_journal() {
    local boots last
    boots=$(vm_ssh 'journalctl --list-boots --no-pager -q | wc -l' </dev/null)
    ((boots >= 2)) || vm__fail "journal lists $boots boot(s), expected at least 2"
    last=$(vm_ssh 'journalctl -b -1 --no-pager -q -n 3 -o short-monotonic' </dev/null)
    [[ -n $last ]] || vm__fail "journalctl -b -1 is empty"
    log "journal has $boots boots; end of the previous one:"
    printf '    | %s\n' "${last//$'\n'/$'\n'    | }" >&2
    vm_ssh 'journalctl -b -1 --no-pager -q -u systemd-journald.service | grep -q "Journal stopped"' \
        </dev/null || vm__fail "the previous boot's journal lacks its shutdown"
}

check_stopped() {
    local pid=$SV_VM_PID
    vm_stop
    [[ -z $SV_VM_PID ]] || vm__fail "qemu still recorded after vm_stop"
    ! kill -0 "$pid" 2>/dev/null || [[ $(ps -o stat= -p "$pid") == Z* ]] ||
        vm__fail "qemu (pid $pid) still running after vm_stop"
}

main() {
    [[ $(id -u) == 0 ]] || { log "must run as root"; exit 1; }
    trap on_exit EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    local start
    start=$(vm__now_ms)
    phase image vm_image_build
    phase boot vm_start 1G
    phase system check_system
    phase gpt check_gpt
    phase files check_files
    phase reboot check_reboot
    phase journal check_journal
    phase stop check_stopped
    log "accelerator: $SV_VM_ACCEL_USED, kernel: $SV_VM_KERNEL_VERSION"
    printf '    %s\n' "${TIMES[@]}" >&2
    log "PASS in $(vm__since "$start")"
}

main "$@"
