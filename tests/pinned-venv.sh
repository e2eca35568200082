# shellcheck shell=bash
# Sourced from the top of the tree by the scripts that need a pinned Python
# tool (tests/ansible/run.sh, tests/salt/run.sh, tests/vm/config-management.sh).
#
#   venv=$(pinned_venv NAME REQUIREMENTS PROBE)
#
# prints the path of the venv of REQUIREMENTS (a pinned pip list), making
# it first when bin/PROBE is missing. Cached under SV_TEST_VENV_CACHE by
# the hash of the list; built aside and renamed, so an interrupted install
# is never used. Progress goes to stderr.
pinned_venv() {
    local name=$1 requirements=$2 probe=$3 venv script
    local cache=${SV_TEST_VENV_CACHE:-/var/cache/sparse-volume-tests}
    venv=$cache/$name-venv-$(sha256sum "$requirements" | cut -c1-16)
    if [[ ! -x $venv/bin/$probe ]]; then
        echo "making $venv" >&2
        rm -rf "$venv.building"
        mkdir -p "$cache"
        "${SV_PYTHON:-python3}" -m venv "$venv.building" >&2
        "$venv.building/bin/pip" install --quiet --disable-pip-version-check -r "$requirements" >&2
        # pip wrote the .building path into the scripts' #! lines (and
        # activate): point them at the final path before the rename.
        grep -l -r -F "$venv.building" "$venv.building/bin" | while read -r script; do
            [[ -L $script ]] || sed -i "s|$venv.building|$venv|g" "$script"
        done
        mv "$venv.building" "$venv"
    else
        echo "cached: $venv" >&2
    fi
    echo "$venv"
}
