# shellcheck shell=bash
# Shared by the packaging scripts: source it after setting TOP (the top of
# the source tree). Sets no shell options.

# A string field of [workspace.package] in Cargo.toml (authors: the one
# entry of the list): the packages' metadata comes from there.
cargo_field() {
    sed -n -e '/^\[workspace\.package\]/,/^\[/ {' \
        -e "s/^$1 = \"\(.*\)\"$/\1/p" \
        -e "s/^$1 = \[\"\([^\"]*\)\"\]$/\1/p" \
        -e '}' "$TOP/Cargo.toml"
}

# ------------------------------------------- the crates in the binaries

# The crates compiled into the shipped binaries and their licenses, from
# `cargo metadata` for the build host, offline and exactly as Cargo.lock
# says (packaging/debian/crate-licenses.py): $1 = copyright prints
# debian/copyright's paragraph per crate, $1 = spdx the RPM License: tag.
# Needs python3: build-packages.sh licenses and check-packages.sh run it,
# the package build itself does not.
crate_licenses() {
    local host
    host=$(rustc -vV | sed -n 's/^host: //p')
    (cd "$TOP" && cargo metadata --offline --locked --format-version 1 --filter-platform "$host") |
        python3 "$TOP/packaging/debian/crate-licenses.py" "$1" sparse-volume sparse-volume-generator
}

# debian/copyright ($1) in two parts: what is written by hand (the header,
# our own files and the license texts), and the crates' paragraphs that
# `crate_licenses copyright` makes, which come last (Files: vendor/...).
copyright_own_part() {
    awk 'BEGIN { RS = ""; ORS = "\n\n" } /^Files: vendor\// { exit } { print }' "$1" | sed '$d'
}

copyright_crate_part() {
    awk 'BEGIN { RS = ""; ORS = "\n\n" } /^Files: vendor\// { found = 1 } found { print }' "$1" | sed '$d'
}

# The project's license, MIT, as a LICENSE file: its copyright line and
# text from debian/copyright (the one place they are written), for what
# ships without that file (the Salt wheel, the Ansible collection).
project_license() {
    local copyright=$TOP/packaging/debian/copyright
    printf 'MIT License\n\n'
    awk 'BEGIN { RS = "" } /^Files: \*\n/' "$copyright" | sed -n 's/^Copyright: /Copyright (c) /p'
    echo
    awk 'BEGIN { RS = "" } /^License: MIT\n /' "$copyright" | sed -e '1d' -e 's/^ //' -e 's/^\.$//'
}

# ------------------------------------------------- the checks' bookkeeping

passed=0
failed=0

pass() {
    passed=$((passed + 1))
    printf 'ok   %s\n' "$1"
}

fail() {
    failed=$((failed + 1))
    printf 'FAIL %s\n' "$1"
    if [[ -n ${2:-} ]]; then
        printf '%s\n' "$2" | sed 's/^/     /'
    fi
}

# check NAME COMMAND...: passes when COMMAND succeeds; its output explains a
# failure.
check() {
    local name=$1 output
    shift
    if output=$("$@" 2>&1); then
        pass "$name"
    else
        fail "$name" "$output"
    fi
}

# "N passed, N failed"; false if any failed.
report() {
    printf '%d passed, %d failed\n' "$passed" "$failed"
    [[ $failed -eq 0 ]]
}

# The one file in DIR matching GLOB.
one_file() {
    local dir=$1 glob=$2
    # shellcheck disable=SC2206 # $glob is a glob, expanded on purpose
    local matches=("$dir"/$glob)
    if [[ ${#matches[@]} -ne 1 || ! -f ${matches[0]} ]]; then
        echo "expected exactly one $glob in $dir, found: ${matches[*]}" >&2
        return 1
    fi
    echo "${matches[0]}"
}
