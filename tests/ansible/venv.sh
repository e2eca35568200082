# Sourced by tests/ansible/run.sh and tests/vm/ansible.sh, from the top of
# the tree: ansible_venv prints the path of the venv of
# tests/ansible/requirements.txt, making it first when it is missing.
# Cached by the hash of the pinned list; built aside and renamed, so an
# interrupted install is never used. Progress goes to stderr.
ansible_venv() {
    local cache=${SV_TEST_VENV_CACHE:-/var/cache/sparse-volume-tests} venv script
    venv=$cache/ansible-venv-$(sha256sum tests/ansible/requirements.txt | cut -c1-16)
    if [[ ! -x $venv/bin/ansible-test ]]; then
        echo "making $venv" >&2
        rm -rf "$venv.building"
        mkdir -p "$cache"
        "${SV_PYTHON:-python3}" -m venv "$venv.building" >&2
        "$venv.building/bin/pip" install --quiet --disable-pip-version-check -r tests/ansible/requirements.txt >&2
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
