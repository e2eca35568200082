#!/usr/bin/env bash
# The tier without root: every test binary of the workspace (built here,
# as root, with `cargo test --no-run`) runs as an unprivileged user
# (nobody). Tests that need root say "skipped: needs root" and return; the
# others (parsing, golden output, JSON shapes, bad input refused before
# any device is touched, the layering rule) must pass as they do for root.
# tests/run runs it before the root tier; by hand:
#
#   tests/without-root.sh [cargo test arguments...]
#
# Needs root itself only to change to the unprivileged user (setpriv).
set -euo pipefail
cd "$(dirname "$0")/.."

user=${SV_TEST_UNPRIVILEGED_USER:-nobody}
uid=$(id -u "$user")
gid=$(id -g "$user")
# Test binaries and the packages' directories they were built for.
mapfile -t binaries < <(
    cargo test --workspace --locked --no-run --message-format=json "$@" |
        python3 -c '
import json, os, sys
for line in sys.stdin:
    message = json.loads(line)
    if message.get("reason") == "compiler-artifact" and message.get("executable") and message["profile"]["test"]:
        print(os.path.dirname(message["manifest_path"]) + "\t" + message["executable"])
'
)
# A scratch directory the user owns, for the tests' temporary files.
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
chown "$uid:$gid" "$scratch"

failed=()
skipped=0
ran=0
for entry in "${binaries[@]}"; do
    dir=${entry%%$'\t'*}
    binary=${entry#*$'\t'}
    log=$scratch/log
    if (cd "$dir" && setpriv --reuid="$uid" --regid="$gid" --clear-groups -- \
        env -i PATH="$PATH" HOME="$scratch" TMPDIR="$scratch" SV_TEST_PYTHON="${SV_TEST_PYTHON:-}" \
        "$binary" --test-threads=2 --nocapture >"$log" 2>&1); then
        :
    else
        failed+=("${binary##*/}")
        cat "$log"
    fi
    ran=$((ran + $(sed -n 's/^test result: .* \([0-9]*\) passed;.*/\1/p' "$log" | paste -sd+ | bc)))
    skipped=$((skipped + $(grep -c '^skipped: needs root' "$log" || true)))
done
echo "without root: ${#binaries[@]} test binaries, $((ran - skipped)) tests passed, $skipped skipped themselves (they need root)"
if ((${#failed[@]})); then
    echo "failed without root: ${failed[*]}" >&2
    exit 1
fi
