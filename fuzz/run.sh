#!/usr/bin/env bash
# Builds every fuzz target and runs each for SECONDS (default 60), one at
# a time, starting from the committed seeds in fuzz/corpus/<target>/.
# What a run adds goes to fuzz/grown/<target>/ (kept between runs, never
# committed); a crash leaves its reproducer in fuzz/artifacts/<target>/.
# Exits non-zero if any target found anything.
#
# The machine has only the stable toolchain: cargo-fuzz's nightly flags
# (-Zsanitizer=address and friends) are accepted with RUSTC_BOOTSTRAP=1.
# Needs a C++ compiler (libfuzzer-sys builds libFuzzer).
set -euo pipefail
cd "$(dirname "$0")"

seconds=${1:-60}
if ! [[ $seconds =~ ^[1-9][0-9]*$ ]]; then
    echo "usage: $0 [SECONDS per target]" >&2
    exit 2
fi

cargo_fuzz_version=0.13.2
if [[ "$(cargo fuzz --version 2>/dev/null || true)" != "cargo-fuzz $cargo_fuzz_version" ]]; then
    cargo install cargo-fuzz --version "$cargo_fuzz_version" --locked
fi

export RUSTC_BOOTSTRAP=1
# Debug assertions catch arithmetic overflow, which release builds wrap.
build_flags=(--debug-assertions --sanitizer address)
cargo fuzz build "${build_flags[@]}" </dev/null

failed=0
printf '%-12s %12s %8s %9s\n' target executions corpus findings
for target in $(cargo fuzz list); do
    grown=grown/$target
    artifacts=artifacts/$target
    mkdir -p "$grown" corpus/"$target"
    # A previous run's reproducers were reported then; count this run's.
    rm -rf "$artifacts"
    mkdir -p "$artifacts"
    log=$(mktemp)
    status=0
    cargo fuzz run "${build_flags[@]}" "$target" "$grown" corpus/"$target" -- \
        -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
        -print_final_stats=1 -artifact_prefix="$artifacts/" \
        </dev/null >"$log" 2>&1 || status=$?
    executions=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
    corpus=$(find "$grown" corpus/"$target" -type f | wc -l)
    findings=$(find "$artifacts" -type f | wc -l)
    printf '%-12s %12s %8s %9s\n' "$target" "${executions:-?}" "$corpus" "$findings"
    if [[ $status -ne 0 || $findings -ne 0 ]]; then
        failed=1
        echo "--- $target failed (exit $status); the end of its log:" >&2
        tail -n 40 "$log" >&2
        find "$artifacts" -type f -printf 'reproducer: fuzz/%p\n' >&2
        echo "replay: (cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run ${build_flags[*]} $target REPRODUCER)" >&2
    fi
    rm -f "$log"
done
exit "$failed"
