#!/usr/bin/env bash
# Proves that the packages are reproducible: the same commit built in
# another directory gives the same bytes.
#
#   packaging/check-reproducible.sh [--quick]
#
# Build A is this tree's (build-packages.sh; cargo finds everything fresh
# when build-packages.sh has just run, as in tests/run). Build B copies the
# work tree (the files git tracks or would track) to a scratch directory
# with a longer path and runs the copy's build-packages.sh there, with its
# own target directory:
#
# - by default B also gets its own CARGO_HOME (a copy of this one's
#   registry: no network) and shares nothing compiled: the path-mapping
#   flags name each build's directories, so cargo compiles every crate
#   again, ours from the copied tree, the crates.io ones from the copied
#   registry. A full release build (about 6 minutes on 2 cores).
# - --quick (for CI) shares CARGO_HOME, so the crates.io crates have the
#   same paths in both builds: B starts from a copy of A's target
#   directory without our crates, and builds with A's mapping flags
#   (SV_REMAP_TREE, SV_REMAP_TARGET), so cargo reuses the crates.io
#   crates and compiles every crate of ours from the copy (checked from
#   cargo's output). B's own directories are mapped by nothing, so they
#   must not reach the bytes at all. That the crates.io paths are mapped
#   is shown by the strings check below (CARGO_HOME in no binary). About
#   2 minutes.
#
# Then, in both modes:
# - the .deb and the .rpm of A and B are identical (cmp); on a difference
#   it prints diffoscope's report if diffoscope is installed, else the
#   first differing bytes and the files that differ inside the packages;
# - no shipped binary of A or B contains its source tree, target
#   directory, CARGO_HOME or rustup directory.
#
# Needs what build-packages.sh needs, git and cpio, and room for a second
# target directory (about 0.5 GB) under TMPDIR. Prints "N passed, N failed"
# and exits non-zero if any failed.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd -P)
TOP=$(cd "$HERE/.." && pwd -P)
TARGET_A=$(realpath -m "${CARGO_TARGET_DIR:-$TOP/target}")
export CARGO_TARGET_DIR=$TARGET_A
CARGO_HOME_A=${CARGO_HOME:-$HOME/.cargo}
SCRATCH=$(mktemp -d)
trap 'rm -rf "$SCRATCH"' EXIT
# A longer path than A's, so that a leaked path also shifts what follows it.
TOP_B=$SCRATCH/elsewhere/sparse-volume-copy
TARGET_B=$SCRATCH/target-b
CARGO_HOME_B=$SCRATCH/cargo-home-b

# shellcheck source=packaging/lib.sh
. "$HERE/lib.sh"

log() { printf 'check-reproducible: %s\n' "$*" >&2; }

# The files of the work tree as git sees them (tracked or new, not ignored,
# not deleted), with their contents as they are now.
copy_tree() {
    mkdir -p "$1"
    (cd "$TOP" && git ls-files -z --cached --others --exclude-standard |
        while IFS= read -r -d '' file; do
            if [[ -f $file || -L $file ]]; then printf '%s\0' "$file"; fi
        done | cpio --null --pass-through --make-directories --preserve-modification-time --quiet "$1")
}

# The files inside a package, extracted to DIR.
unpack() {
    local package=$1 dir=$2
    mkdir -p "$dir"
    case $package in
        *.deb)
            dpkg-deb -R "$package" "$dir"
            ;;
        *.rpm)
            rpm -qp --qf '%{NAME} %{VERSION}-%{RELEASE} %{BUILDTIME} %{BUILDHOST}\n' "$package" >"$dir/.header"
            (cd "$dir" && rpm2cpio "$package" | cpio -idm --quiet)
            ;;
    esac
}

# Why two packages differ, as precisely as the tools here allow.
explain_difference() {
    local a=$1 b=$2
    if command -v diffoscope >/dev/null; then
        diffoscope --text - "$a" "$b" | head -n 200 || true
        return
    fi
    echo "first differing bytes (offset, octal A, octal B):"
    cmp -l "$a" "$b" | head -n 10 || true
    unpack "$a" "$SCRATCH/unpacked-a"
    unpack "$b" "$SCRATCH/unpacked-b"
    echo "files that differ inside the packages:"
    diff -rq "$SCRATCH/unpacked-a" "$SCRATCH/unpacked-b" || true
    rm -rf "$SCRATCH/unpacked-a" "$SCRATCH/unpacked-b"
}

compare() {
    local a=$1 b=$2
    if cmp -s "$a" "$b"; then
        return 0
    fi
    echo "${a##*/} differs between the two builds"
    explain_difference "$a" "$b"
    return 1
}

# no_build_paths PACKAGE PATH...: no binary in the .deb contains any PATH.
no_build_paths() {
    local deb=$1 root=$SCRATCH/paths-root binary path count status=0
    shift
    rm -rf "$root" && dpkg-deb -x "$deb" "$root"
    for binary in "$root/usr/bin/sparse-volume" \
        "$root/usr/lib/systemd/system-generators/sparse-volume-generator"; do
        for path in "$@"; do
            count=$(strings -a "$binary" | grep -cF -- "$path" || true)
            if [[ $count -ne 0 ]]; then
                echo "${binary#"$root"} contains $path $count times, e.g.:"
                strings -a "$binary" | grep -F -- "$path" | head -n 3 || true
                status=1
            fi
        done
    done
    rm -rf "$root"
    return "$status"
}

# The crates build B compiled, "name path" per line, from cargo's output.
compiled_crates() {
    sed -n 's/^ *Compiling \([^ ]*\) v[^ ]* (\(.*\))$/\1 \2/p; s/^ *Compiling \([^ ]*\) v[^ ]*$/\1 crates.io/p' "$1" |
        LC_ALL=C sort -u
}

# --quick: cargo compiled exactly our crates, each from the copy.
compiled_only_ours() {
    local want
    want=$(printf '%s\n' "sparse-volume $TOP_B" "sparse-volume-docgen $TOP_B/packaging/docgen" \
        "sparse-volume-generator $TOP_B/generator" | LC_ALL=C sort)
    if [[ $(compiled_crates "$1") != "$want" ]]; then
        printf 'build B compiled:\n%s\nexpected:\n%s\n' "$(compiled_crates "$1")" "$want"
        return 1
    fi
}

# B's directories and build, as the mode says. $1: quick or full.
build_b() {
    local mode=$1
    copy_tree "$TOP_B"
    if [[ $mode == quick ]]; then
        CARGO_HOME_B=$CARGO_HOME_A
        mkdir -p "$TARGET_B"
        cp -a "$TARGET_A/release" "$TARGET_B/"
        (cd "$TOP_B" && CARGO_TARGET_DIR=$TARGET_B cargo clean --release --quiet \
            -p sparse-volume -p sparse-volume-docgen -p sparse-volume-generator)
        SV_REMAP_TREE=$TOP SV_REMAP_TARGET=$TARGET_A CARGO_TARGET_DIR=$TARGET_B \
            "$TOP_B/packaging/build-packages.sh" 2>&1 | tee "$SCRATCH/build-b.log"
    else
        mkdir -p "$CARGO_HOME_B"
        cp -a "$CARGO_HOME_A/registry" "$CARGO_HOME_B/"
        if [[ -d $CARGO_HOME_A/git ]]; then cp -a "$CARGO_HOME_A/git" "$CARGO_HOME_B/"; fi
        CARGO_TARGET_DIR=$TARGET_B CARGO_HOME=$CARGO_HOME_B CARGO_NET_OFFLINE=true \
            "$TOP_B/packaging/build-packages.sh" 2>&1 | tee "$SCRATCH/build-b.log"
    fi
}

main() {
    local rustup_home=${RUSTUP_HOME:-$HOME/.rustup} deb_a deb_b rpm_a rpm_b start mode=full
    case "${1:-}" in
        "") ;;
        --quick) mode=quick ;;
        *)
            echo "usage: $0 [--quick]" >&2
            exit 2
            ;;
    esac
    # One date for both builds: the copy has no .git to take it from.
    SOURCE_DATE_EPOCH=$(git -C "$TOP" log -1 --format=%ct)
    export SOURCE_DATE_EPOCH

    log "build A in ${TOP}"
    start=$SECONDS
    "$TOP/packaging/build-packages.sh"
    log "build A took $((SECONDS - start)) s"

    log "build B ($mode) in $TOP_B, target $TARGET_B"
    start=$SECONDS
    build_b "$mode"
    log "build B took $((SECONDS - start)) s"
    if [[ $mode == quick ]]; then
        check "build B compiled every crate of ours from the copy, and only these" \
            compiled_only_ours "$SCRATCH/build-b.log"
    fi

    deb_a=$(one_file "$TARGET_A/packages" 'sparse-volume_*.deb')
    deb_b=$(one_file "$TARGET_B/packages" 'sparse-volume_*.deb')
    rpm_a=$(one_file "$TARGET_A/packages" 'sparse-volume-*.rpm')
    rpm_b=$(one_file "$TARGET_B/packages" 'sparse-volume-*.rpm')

    check "the .deb of both builds is identical" compare "$deb_a" "$deb_b"
    check "the .rpm of both builds is identical" compare "$rpm_a" "$rpm_b"
    check "no build path in the binaries of build A" \
        no_build_paths "$deb_a" "$TOP" "$TARGET_A" "$CARGO_HOME_A" "$rustup_home"
    check "no build path in the binaries of build B" \
        no_build_paths "$deb_b" "$TOP_B" "$TARGET_B" "$CARGO_HOME_B" "$rustup_home"

    report
}

main "$@"
