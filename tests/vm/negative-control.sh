#!/usr/bin/env bash
# The negative control of the VM scenario: with the generator removed in
# the guest after setup (SV_VM_BREAK=generator), tests/vm/scenario.sh must
# fail at the first boot, because the volumes did not come back: the fstab
# consumer of a volume times out waiting for its /dev/disk/by-uuid link
# (the boot goes to emergency mode, which lib.sh notices at once), or, if
# the boot comes up anyway, verify finds no loop device. Any other failure
# (the package does not build, setup fails, the guest does not start) is
# not proof that the scenario can fail, and fails this script too.
#
#   tests/vm/negative-control.sh        (root; same environment as scenario.sh)
#
# Costs setup plus one boot (about 2-3 minutes under TCG: guest.sh gives the
# consumers a 15 s device timeout when it breaks the generator).
set -euo pipefail
cd "$(dirname "$0")/../.."

log=$(mktemp -t sv-negative-control.XXXXXX)
trap 'rm -f "$log"' EXIT
started=$(date +%s)

say() { printf 'negative-control: %s\n' "$*" >&2; }

rc=0
SV_VM_BREAK=generator SV_VM_SOFT=0 bash tests/vm/scenario.sh 2>&1 | tee "$log" || rc=${PIPESTATUS[0]}
took="$(($(date +%s) - started)) s"

if ((rc == 0)); then
    say "FAIL: the scenario passed with the generator removed ($took): it cannot see a missing generator"
    exit 1
fi
if ! grep -q 'breaking the product on purpose: removing the generator' "$log"; then
    say "FAIL: the scenario failed (exit $rc, $took) before the generator was removed: not the expected failure (see above)"
    exit 1
fi
# Where it failed: the first boot, or the checks right after it.
where=$(grep -E 'FAIL: boot 1 |\[guest verify\] FAIL: ' "$log" | head -n 1) || {
    say "FAIL: the scenario failed (exit $rc, $took), but not at boot 1 or its verify: not the expected failure (see above)"
    exit 1
}
# Why: a volume's device never appeared.
why=$(grep -E 'Timed out waiting for device .*/dev/disk/by-(part)?uuid/|Dependency failed for .*/srv/(consumer|block)|expected one loop device, got: none' "$log" | head -n 1) || {
    say "FAIL: the scenario failed at boot 1 (exit $rc, $took), but not because a volume was missing: $where"
    exit 1
}
say "PASS: the scenario failed as it must without the generator (exit $rc, $took)"
say "  where: $where"
say "  why:   $(sed -e 's/^[[:space:]|]*//' <<<"$why")"
