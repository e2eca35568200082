#!/usr/bin/env bash
# Self-test of the harness's reading of the guest's serial console
# (tests/vm/lib.sh), without a guest: a few seconds, run by tests/run before
# the VM sections. What it reads decides whether a guest kernel panic is
# retried (exit 75) or fails CI: a CI run once failed instead of retrying,
# because the check read a console of several boots through `cat | grep -q`
# under pipefail, where grep's early exit kills cat with SIGPIPE and the
# pipeline reports "no panic".
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"

failures=0
check() {
    local what=$1
    shift
    if "$@"; then
        printf 'ok    %s\n' "$what"
    else
        printf 'FAIL  %s\n' "$what"
        failures=$((failures + 1))
    fi
}
refuse() { ! "$@"; }

SV_VM_RUN=$(mktemp -d)
trap 'rm -rf -- "$SV_VM_RUN"' EXIT

# One boot's console: kernel lines with a carriage return, as the serial
# port writes them, then a few hundred kilobytes of boot messages: more than
# a pipe holds, so a reader that stops early leaves its writer blocked.
boot_console() {
    local i
    printf 'Linux version 6.12.0 (test)\r\n'
    for ((i = 0; i < 6000; i++)); do
        printf '[   %d.000000] systemd[1]: Started unit-%d.service - a unit of this boot.\r\n' $((i / 100)) "$i"
    done
}
panic_lines() {
    printf '[    2.612935] Oops: int3: 0000 [#2] PREEMPT SMP NOPTI\r\n'
    printf '[    2.613073] RIP: 0010:sched_clock_cpu+0x9/0x1d0\r\n'
    printf '[    2.613448] Kernel panic - not syncing: Fatal exception in interrupt\r\n'
    printf '[    4.413812] ---[ end Kernel panic - not syncing: Fatal exception in interrupt ]---\r\n'
}

# A run of three boots, the last one on a new qemu that panicked: the
# current console (serial.log) holds the panic, and earlier boots were kept
# as serial.log.1 and .2 (vm_restart's copies), read after it.
boot_console >"$SV_VM_RUN/serial.log.1"
boot_console >"$SV_VM_RUN/serial.log.2"
{ boot_console; panic_lines; } >"$SV_VM_RUN/serial.log"
check "a panic in the current console, earlier boots kept beside it: vm_guest_panicked" vm_guest_panicked
check "the same: vm__serial_panicked (the running boot)" vm__serial_panicked
check "the same: the running boot is not in emergency mode" refuse vm__serial_emergency
oops=$(vm_serial_oops 2>&1)
check "vm_serial_oops prints the oops from its first line to the panic" \
    grep -q -z 'Oops: int3.*RIP: 0010:sched_clock_cpu.*end Kernel panic' <<<"$oops"

# A panic in an earlier boot only: the run panicked, the running boot did not.
{ boot_console; panic_lines; } >"$SV_VM_RUN/serial.log.1"
{ boot_console; boot_console; } >"$SV_VM_RUN/serial.log"
check "a panic in an earlier boot only: vm_guest_panicked" vm_guest_panicked
check "the same: the running boot did not panic" refuse vm__serial_panicked

# No panic anywhere.
boot_console >"$SV_VM_RUN/serial.log.1"
check "no panic in any boot: vm_guest_panicked is false" refuse vm_guest_panicked

# Emergency mode early in a long console (sshd never comes there).
{
    boot_console
    printf 'You are in emergency mode. After logging in, type "journalctl -xb"\r\n'
    boot_console | tail -n +2
} >"$SV_VM_RUN/serial.log"
check "emergency mode followed by more console: vm__serial_emergency" vm__serial_emergency

# The negative control's reason early in a long console: a reader that
# stops at the first match must not turn "found" into "not found" (CI
# once failed the negative control this way).
{
    boot_console
    printf '[DEPEND] Dependency failed for \x1b[0;1;39msrv-block.mount\x1b[0m - /srv/block.\r\n'
    boot_console | tail -n +2
} >"$SV_VM_RUN/serial.log"
why=$(vm__serial_missing_device) || why=
check "a missing device's mount early in a long console: vm__serial_missing_device finds it" \
    grep -q 'Dependency failed for srv-block.mount - /srv/block' <<<"$why"
boot_console >"$SV_VM_RUN/serial.log"
check "no missing device: vm__serial_missing_device is false" refuse vm__serial_missing_device

if ((failures)); then
    printf '%d check(s) of the console reading failed\n' "$failures"
    exit 1
fi
echo "console reading: all checks passed"
