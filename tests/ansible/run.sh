#!/usr/bin/env bash
# Tests of the Ansible collection (packaging/ansible): its documentation,
# ansible-test sanity, unit tests, the tarball build, and a simulated fleet
# of 50 hosts converging volumes with the real CLI (tests/ansible/README.md).
#
#   SV_BINARY=target/release/sparse-volume tests/ansible/run.sh
#
# Needs root (the CLI manages root-owned registries and backing files) and
# PyPI (pip). Environment:
#   SV_BINARY            the sparse-volume binary to test (required)
#   SV_TEST_VENV_CACHE   where the venv of tests/ansible/requirements.txt
#                        and ansible-test's own venvs are cached
#                        (default /var/cache/sparse-volume-tests)
#   SV_FLEET_FORKS_ONE=1 also time the fleet's converge with one fork
#   SV_FLEET_HOSTS       fleet size (default 50)
#   SV_PYTHON            the Python 3.11 that makes the venv (default python3)
#   SV_PACKAGES_DIR      where to keep the tarball (tests/run: beside the packages)
set -euo pipefail
cd "$(dirname "$0")/../.."
started=$SECONDS

die() {
    echo "tests/ansible/run.sh: $*" >&2
    exit 1
}

[[ $EUID -eq 0 ]] || die "run as root (the CLI manages root-owned registries and backing files)"
[[ -n ${SV_BINARY:-} ]] ||
    die "set SV_BINARY to the sparse-volume binary to test (e.g. target/release/sparse-volume)"
SV_BINARY=$(realpath "$SV_BINARY")
[[ -x $SV_BINARY ]] || die "SV_BINARY=$SV_BINARY is not an executable file"
"$SV_BINARY" apply --help >/dev/null 2>&1 ||
    die "$SV_BINARY has no working 'apply' command, which the collection wraps"
export SV_BINARY

# ------------------------------------------------------------ bookkeeping

# Each section runs in a subshell with errexit: one that fails is
# recorded and the others still run (they test independent things), and
# the script fails at the end.
results=()
failures=0
section() {
    local name=$1 rc=0 t0=$SECONDS
    shift
    printf '\n=== %s\n' "$name"
    set +e
    (set -euo pipefail; "$@")
    rc=$?
    set -e
    local verdict=ok
    if ((rc != 0)); then
        verdict="FAILED (exit $rc)"
        failures=$((failures + 1))
    fi
    results+=("$(printf '%-58s %5d s  %s' "$name" $((SECONDS - t0)) "$verdict")")
    printf '=== %s: %s, %d s\n' "$name" "$verdict" $((SECONDS - t0))
}

work=$(mktemp -d /tmp/sv-ansible-tests-XXXXXX)
trap 'rm -rf "$work"' EXIT

# ------------------------------------------------------------ the venv

printf '=== venv of tests/ansible/requirements.txt\n'
# shellcheck source=tests/pinned-venv.sh
. tests/pinned-venv.sh
venv=$(pinned_venv ansible tests/ansible/requirements.txt ansible-test)
cache=$(dirname "$venv") # ansible-test's own venvs are kept beside it
export PATH=$venv/bin:$PATH
export PYTHONDONTWRITEBYTECODE=1 # no __pycache__ in the source tree
export ANSIBLE_HOME=$work/ansible-home ANSIBLE_LOCAL_TEMP=$work/ansible-tmp ANSIBLE_NOCOLOR=1
python -c 'import ansible.release; print("ansible-core", ansible.release.__version__)'

# The collection where Ansible looks for it: .../ansible_collections/NS/NAME.
collections=$work/collections
collection=$collections/ansible_collections/sparse_volume/sparse_volume
mkdir -p "$(dirname "$collection")"
cp -r packaging/ansible/sparse_volume "$collection"
rm -rf "$collection/tests/output"
find "$collection" -name __pycache__ -prune -exec rm -rf {} +

# ------------------------------------------------------------ sections

docs() {
    local module out
    for module in sparse_volume sparse_volume_info; do
        # ansible-doc prints an [ERROR] and no page when the YAML is broken.
        out=$(ANSIBLE_COLLECTIONS_PATH=$collections ansible-doc "sparse_volume.sparse_volume.$module")
        if ! grep -q '^OPTIONS' <<<"$out" || ! grep -q '^EXAMPLES' <<<"$out" || ! grep -q '^RETURN VALUES' <<<"$out"; then
            echo "$out"
            echo "ansible-doc $module: a section is missing"
            return 1
        fi
        echo "ansible-doc sparse_volume.sparse_volume.$module: $(wc -l <<<"$out") lines"
    done
}

sanity() {
    # ansible-test bootstraps pip into each of its venvs with a get-pip.py
    # from its own CI file host, which is not reachable here (PyPI is):
    # the stand-in in its cache gets pip from ensurepip and then the pinned
    # pip from PyPI. HOME points into the cache so that ansible-test keeps
    # its per-test venvs there between runs, not in root's home.
    local home=$cache/ansible-test-home pip_version
    pip_version=$(python - <<'EOF'
import pathlib, re, ansible_test
source = (pathlib.Path(ansible_test.__file__).parent / "_internal" / "python_requirements.py").read_text()
print(re.search(r"pip='([0-9.]+)'", source).group(1))
EOF
    )
    mkdir -p "$home/.ansible/test/cache"
    cp tests/ansible/get-pip-standin.py "$home/.ansible/test/cache/get_pip_${pip_version//./_}.py"
    # Every sanity test of this ansible-core runs (those with nothing to
    # check here say "No tests applicable": changelog, empty-init, pslint
    # and the shell script check). compile and import run on Python 3.11 only: the other
    # Pythons a managed node may have are not installed on this machine.
    # --venv: each test in ansible-test's own pinned venv, from PyPI.
    (cd "$collection" && HOME=$home ansible-test sanity -v --venv --python 3.11 --color no) >"$work/sanity.log" 2>&1 ||
        {
            grep -v -e '^Collecting' -e 'Downloading' -e '━' "$work/sanity.log"
            return 1
        }
    grep -e '^Running sanity test' -e '^No tests applicable' -e '^WARNING' "$work/sanity.log" | grep -v 'Reviewing previous'
}

unit() {
    python -m pytest -p no:cacheprovider -q tests/ansible/unit
}

tarball() {
    # The tarball is built twice: same name, same bytes.
    local first second
    first=$(packaging/ansible/build.sh "$work/dist1")
    second=$(packaging/ansible/build.sh "$work/dist2")
    [[ $(basename "$first") == "$(basename "$second")" ]]
    cmp "$first" "$second" || {
        echo "two builds of the collection differ"
        return 1
    }
    echo "$(basename "$first"): $(sha256sum <"$first" | cut -c1-64), reproducible"
    ANSIBLE_COLLECTIONS_PATH=$work/installed ansible-galaxy collection install -p "$work/installed" "$first"
    # tests/run keeps it beside the .deb and the .rpm.
    if [[ -n ${SV_PACKAGES_DIR:-} ]]; then
        cp "$first" "$SV_PACKAGES_DIR/"
        echo "copied to $SV_PACKAGES_DIR/$(basename "$first")"
    fi
}

fleet() {
    [[ -d $work/installed/ansible_collections/sparse_volume/sparse_volume ]] || {
        echo "the collection tarball was not installed (see the section before)"
        return 1
    }
    # The fleet uses the collection as installed from the tarball.
    SV_ANSIBLE_COLLECTIONS=$work/installed python -m pytest -p no:cacheprovider -v -rs tests/ansible/fleet
}

section "ansible-doc of both modules" docs
section "ansible-test sanity (--venv --python 3.11)" sanity
section "unit tests (pytest, the CLI faked)" unit
section "collection tarball: packaging/ansible/build.sh, install" tarball
section "fleet: ${SV_FLEET_HOSTS:-50} hosts, 4 volumes each, the real CLI" fleet

# ------------------------------------------------------------ summary

printf '\n=== summary (SV_BINARY=%s)\n' "$SV_BINARY"
printf '%s\n' "${results[@]}"
printf 'total: %d s\n' $((SECONDS - started))
if ((failures)); then
    echo "tests/ansible: $failures section(s) FAILED"
    exit 1
fi
echo "tests/ansible: all sections passed"
