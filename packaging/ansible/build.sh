#!/usr/bin/env bash
# Builds the Ansible collection tarball into OUTDIR (beside the .deb and
# .rpm): OUTDIR/sparse_volume-sparse_volume-<version>.tar.gz, <version>
# being the workspace version of Cargo.toml, which galaxy.yml must carry.
# Needs ansible-galaxy (ansible-core) on PATH, or its path in
# $ANSIBLE_GALAXY. Prints the tarball's path.
set -euo pipefail

if (($# != 1)); then
    echo "usage: $0 OUTDIR" >&2
    exit 2
fi
outdir=$1
TOP=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=packaging/lib.sh
. "$TOP/packaging/lib.sh"
source_dir=$TOP/packaging/ansible/sparse_volume
galaxy=${ANSIBLE_GALAXY:-ansible-galaxy}
command -v "$galaxy" >/dev/null || {
    echo "$0: $galaxy not found: install ansible-core (or set ANSIBLE_GALAXY)" >&2
    exit 1
}

# One version for the product and its collection: a release bumps both.
version=$(cargo_field version)
collection_version=$(sed -n 's/^version: *//p' "$source_dir/galaxy.yml")
if [[ $version != "$collection_version" ]]; then
    echo "$0: galaxy.yml has version '$collection_version', Cargo.toml '$version': make them equal" >&2
    exit 1
fi

# From a clean copy, so nothing left in the source directory by a test
# run (tests/output, byte code) can end up in the tarball.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -r "$source_dir" "$work/sparse_volume"
find "$work/sparse_volume" \( -name __pycache__ -o -name output -path '*/tests/output' \) -prune -exec rm -rf {} +
# The collection carries the license text, at its top as Galaxy expects.
project_license >"$work/sparse_volume/LICENSE"

mkdir -p "$outdir"
tarball=$outdir/sparse_volume-sparse_volume-$version.tar.gz
rm -f "$tarball"
"$galaxy" collection build --output-path "$outdir" "$work/sparse_volume" >/dev/null
[[ -f $tarball ]] || {
    echo "$0: ansible-galaxy did not make $tarball" >&2
    exit 1
}

# Same bytes for the same commit, like the .deb and .rpm: ansible-galaxy
# stamps the build time on every entry and in the gzip header, so the
# entries are rewritten (same order and content) with the time of the last
# commit (SOURCE_DATE_EPOCH when set) and a gzip header without a time.
# (The order of FILES.json and of the entries is ansible-galaxy's directory
# walk, stable for a given file system, not sorted.)
epoch=${SOURCE_DATE_EPOCH:-$(git -C "$TOP" log -1 --format=%ct 2>/dev/null || stat -c %Y "$TOP/Cargo.toml")}
python3 - "$tarball" "$epoch" <<'PY'
import gzip, io, sys, tarfile
path, epoch = sys.argv[1], int(sys.argv[2])
out = io.BytesIO()
with tarfile.open(path, "r:gz") as src, tarfile.open(fileobj=out, mode="w", format=src.format) as dst:
    for member in src.getmembers():
        member.mtime = epoch
        member.pax_headers.pop("mtime", None)  # the sub-second file time
        dst.addfile(member, src.extractfile(member) if member.isfile() else None)
with open(path, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz:
    gz.write(out.getvalue())
PY
echo "$tarball"
