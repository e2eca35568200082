#!/usr/bin/env bash
# packaging/salt/build.sh OUTDIR: builds the saltext.sparse_volume wheel
# into OUTDIR from the same two files operators copy into file_roots
# (_modules/sparse_volume.py, _states/sparse_volume.py).
# PYTHON picks the interpreter whose pip builds it (default python3); pip
# fetches the pinned build backend (wheel/pyproject.toml.in) from PyPI.
set -euo pipefail
if [[ $# -ne 1 ]]; then
    echo "usage: $0 OUTDIR" >&2
    exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
TOP=$(cd "$here/../.." && pwd)
# shellcheck source=../lib.sh
source "$TOP/packaging/lib.sh"
mkdir -p "$1"
outdir=$(cd "$1" && pwd)

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
package=$stage/src/saltext/sparse_volume
mkdir -p "$package/modules" "$package/states"
# saltext/ stays a namespace package (no __init__.py) so other extensions
# can share it.
cp "$here/wheel/__init__.py" "$package/__init__.py"
cp "$here/_modules/sparse_volume.py" "$package/modules/sparse_volume.py"
cp "$here/_states/sparse_volume.py" "$package/states/sparse_volume.py"
cp "$here/README.md" "$stage/README.md"
# The wheel carries the license (setuptools takes LICENSE* into the
# wheel's .dist-info/licenses/ by default).
project_license >"$stage/LICENSE"
# | as the sed delimiter: the homepage holds slashes.
sed -e "s|@VERSION@|$(cargo_field version)|" \
    -e "s|@LICENSE@|$(cargo_field license)|" \
    -e "s|@HOMEPAGE@|$(cargo_field homepage)|" \
    "$here/wheel/pyproject.toml.in" >"$stage/pyproject.toml"
if grep -q '@[A-Z]*@' "$stage/pyproject.toml"; then
    echo "$0: a field of Cargo.toml was not found" >&2
    exit 1
fi

"${PYTHON:-python3}" -m pip wheel --quiet --disable-pip-version-check \
    --no-deps --wheel-dir "$outdir" "$stage"
ls "$outdir"/saltext_sparse_volume-*.whl
