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
