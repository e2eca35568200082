#!/usr/bin/env bash
# tests/salt/run.sh: the Salt extension's tests (packaging/salt). As root:
#
#   SV_BINARY=target/release/sparse-volume tests/salt/run.sh [PYTEST-ARGS...]
#
# Unit tests of both modules (cmd.run_all replaced), then salt-call --local
# against the real binary in a private registry root (real mkfs, real
# files), and the saltext wheel loaded through its entry point. The pinned
# Salt of tests/salt/requirements.txt is installed into a venv cached under
# ${SV_TEST_VENV_CACHE:-/var/cache/sparse-volume-tests}.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)

if [[ $EUID -ne 0 ]]; then
    echo "tests/salt/run.sh: run as root (the CLI makes real volumes)" >&2
    exit 1
fi
if [[ -z ${SV_BINARY:-} ]]; then
    echo "tests/salt/run.sh: set SV_BINARY to the sparse-volume binary to test" >&2
    exit 1
fi
# Absolute: the minion config and the tests run it from other directories.
SV_BINARY=$(realpath "$SV_BINARY")
[[ -x $SV_BINARY ]] || {
    echo "tests/salt/run.sh: $SV_BINARY is not an executable" >&2
    exit 1
}
"$SV_BINARY" apply --help >/dev/null 2>&1 || {
    echo "tests/salt/run.sh: $SV_BINARY has no 'apply' command" >&2
    exit 1
}
export SV_BINARY
# No __pycache__ beside the sources (pytest imports the module files).
export PYTHONDONTWRITEBYTECODE=1

started=$SECONDS
timings=()
# Each step's time, for the summary.
lap() {
    timings+=("$(printf '%4d s  %s' $((SECONDS - $1)) "$2")")
}

work=$(mktemp -d -t sv-salt.XXXXXX)
# The real test detaches whatever it attached before this runs.
trap 'rm -rf "$work"' EXIT

t0=$SECONDS
# shellcheck source=tests/pinned-venv.sh
. "$top/tests/pinned-venv.sh"
venv=$(cd "$top" && pinned_venv salt tests/salt/requirements.txt salt-call)
lap "$t0" venv
python=$venv/bin/python

t0=$SECONDS
PYTHON=$python "$top/packaging/salt/build.sh" "$work/wheel"
lap "$t0" "wheel (packaging/salt/build.sh)"
SV_SALT_WHEEL=$(ls "$work"/wheel/saltext_sparse_volume-*.whl)
export SV_SALT_WHEEL
# tests/run keeps it beside the .deb and the .rpm (SV_PACKAGES_DIR).
if [[ -n ${SV_PACKAGES_DIR:-} ]]; then
    cp "$SV_SALT_WHEEL" "$SV_PACKAGES_DIR/"
fi

t0=$SECONDS
rc=0
cd "$here"
"$python" -m pytest -v -p no:cacheprovider --basetemp="$work/pytest" "$@" || rc=$?
lap "$t0" pytest

echo
echo "=== tests/salt summary"
printf '%s\n' "${timings[@]}"
printf '%4d s  total\n' $((SECONDS - started))
if ((rc == 0)); then
    echo "tests/salt: all passed"
else
    echo "tests/salt: FAILED (pytest exit $rc)"
fi
exit "$rc"
