#!/usr/bin/env bash
# Acceptance test of the Ansible collection (packaging/ansible) and the Salt
# extension (packaging/salt) over SSH against a Debian guest with real
# systemd and udev: the guest has only the .deb and python3; the collection
# is installed on this machine (the controller) from the tarball
# packaging/ansible/build.sh makes, and salt-ssh carries the Salt modules
# from a file_roots tree as a master would.
#
#   tests/vm/config-management.sh                     (root; builds the .deb if missing)
#   SV_VM_SUITE=trixie tests/vm/config-management.sh  (the same on Debian 13)
#
# Phases (each timed; the playbooks are in tests/vm/ansible/, the state in
# tests/vm/salt/, the guest's checks in tests/vm/ansible/check.sh):
#   converge         playbook 1: ext4, xfs (320M) and block volumes, enabled
#                    and attached now; an fstab consumer of the ext4 one
#                    (UUID=), mounted, with 8 MiB of random data
#   converge again   the same playbook: changed=0
#   check --diff     playbook 2 (grow the mounted ext4 volume, disable the
#                    xfs one now) with --check --diff: changed=2 and a diff
#                    of both, and the registry, the backing files (size,
#                    allocated blocks, sha256), the loop devices and the
#                    units byte-identical before and after
#   change           playbook 2 for real: size in registry, file, loop
#                    device and the mounted file system; xfs disabled,
#                    stopped and detached
#   reboot           ansible.builtin.reboot, then sparse_volume_info: the
#                    enabled volumes attached, the disabled one not; then
#                    their links, the fstab mount and the data's checksum
#   remove           state: absent keeps the backing file; with
#                    delete_data: true it is gone
#   refuse           a grow to 100T is a failed task whose msg is the CLI's
#                    own one-line reason for the same request (run directly)
#   salt converge    salt-ssh state.apply of tests/vm/salt/volumes.sls: an
#                    ext4 and a block volume, attached now
#   salt again       the same: every state True, no changes
#   salt test=True   a grow (pillar) under test=True: result None with the
#                    planned size, the node byte-identical
#   salt refuse      a grow to 100T: result False, the comment the CLI's own
#                    reason for the same request; the node unchanged
#   ansible take-over  the take-over guide's play, as written, on a
#                    MetalK8s-style ext4 volume attached by its unit and
#                    mounted: the storage root added to the package's
#                    config.toml, the same loop device, the old unit
#                    masked, stopped, disabled; run again: changed=0
#   salt take-over   the guide's Salt state, as written, on a second one
#                    (xfs): the same (not run again: see salt_take_over)
#
# The .deb is the newest in ${CARGO_TARGET_DIR:-target}/packages (as for
# scenario.sh); ansible-core and Salt are the venvs of
# tests/ansible/requirements.txt and tests/salt/requirements.txt, shared
# with tests/ansible/run.sh and tests/salt/run.sh (tests/pinned-venv.sh).
# Exit status 75: the guest's kernel panicked (the oops is printed).
set -euo pipefail
target=${CARGO_TARGET_DIR:-}
[[ -z $target || $target == /* ]] || target=$PWD/$target
cd "$(dirname "$0")/../.."
target=${target:-$PWD/target}

# shellcheck source=tests/vm/lib.sh
. tests/vm/lib.sh

# The volumes. UUIDs pinned, as a real inventory would.
EXT4=6a1f3c2e-0b7d-4e59-8c41-2d9e7f1a5b30
XFS=7b2e4d3f-1c8e-4f6a-9d52-3eaf8a2b6c41
BLOCK=8c3f5e4a-2d9f-4a7b-8e63-4fb09b3c7d52
EXT4_GROWN=$((96 * 1024 * 1024))
TOO_BIG=100T
# The Salt state's two volumes (tests/vm/salt/volumes.sls).
SALT_EXT4=9d4a6f5b-3e0a-4b8c-9f74-50c1ac4d8e63
SALT_BLOCK=ae5b7a6c-4f1b-4c9d-8a85-61d2bd5e9f74
# Volumes a MetalK8s-style unit attached, taken over by the guide's play
# and state (docs/guide/take-over.md).
MK_ANSIBLE=b06c8b7d-5a2c-4dae-9b96-72e3ce6fa085
MK_SALT=c17d9c8e-6b3d-4ebf-8ca7-83f4df70b196

current_phase=""
timings=()
watched_pid=""
on_exit() {
    local rc=$? sock
    # An ansible-playbook or salt-ssh still running (interrupted).
    if [[ -n $watched_pid ]] && kill -0 "$watched_pid" 2>/dev/null; then
        kill "$watched_pid" 2>/dev/null || true
    fi
    if ((rc != 0)); then
        [[ -z $current_phase ]] || vm_log "FAIL in phase '$current_phase' (exit $rc)"
        rc=$(vm_status_after_panic "$rc")
        ((rc == 75)) || vm_serial_tail
    fi
    # Ansible's SSH control masters (ControlPersist) of this run.
    for sock in "${work:-/nonexistent}"/cp/*; do
        if [[ -S $sock ]]; then
            ssh -o ControlPath="$sock" -O exit sv-test >/dev/null 2>&1 || true
        fi
    done
    vm_cleanup || true
    exit "$rc"
}
trap on_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

fail() {
    vm_log "FAIL: $*"
    exit 1
}

# phase NAME FUNCTION [ARGS...]: runs one step, timed.
phase() {
    local name=$1 start
    shift
    current_phase=$name
    start=$(vm__now_ms)
    vm_log "=== $name"
    "$@"
    timings+=("$(printf '%-16s %8s' "$name" "$(vm__since "$start")")")
    vm_log "=== $name: PASS in $(vm__since "$start")"
    current_phase=""
}

# ------------------------------------------------------------ controller

prepare() {
    deb=$(vm_package_under_test "$target") || fail "no package to test"

    # The venvs of tests/ansible/run.sh and tests/salt/run.sh.
    # shellcheck source=tests/pinned-venv.sh
    . tests/pinned-venv.sh
    venv=$(pinned_venv ansible tests/ansible/requirements.txt ansible-test)
    salt_venv=$(pinned_venv salt tests/salt/requirements.txt salt-call)
    export PATH=$venv/bin:$PATH PYTHONDONTWRITEBYTECODE=1
    mkdir -p "$work/cp" "$work/home" "$work/tmp"
    export ANSIBLE_CONFIG=$work/ansible.cfg ANSIBLE_COLLECTIONS_PATH=$work/collections
    export ANSIBLE_HOME=$work/home ANSIBLE_LOCAL_TEMP=$work/tmp ANSIBLE_NOCOLOR=1
    cat >"$work/ansible.cfg" <<EOF
[defaults]
inventory = $work/inventory.yml
collections_path = $work/collections
retry_files_enabled = False
forks = 1
timeout = 30
[ssh_connection]
pipelining = True
control_path_dir = $work/cp
ssh_args = -o ControlMaster=auto -o ControlPersist=120s -o ServerAliveInterval=5 -o ServerAliveCountMax=6
EOF
    vm_log "$(ansible --version | head -n 1) from $venv"

    # The collection as users get it: the tarball, installed.
    local tarball
    tarball=$(packaging/ansible/build.sh "$work/dist")
    ansible-galaxy collection install -p "$work/collections" "$tarball" >"$work/galaxy.log" 2>&1 ||
        { cat "$work/galaxy.log" >&2; fail "ansible-galaxy collection install $tarball"; }
    [[ -d $work/collections/ansible_collections/sparse_volume/sparse_volume ]] ||
        fail "the collection is not where ansible-galaxy was told to install it"
    vm_log "collection: ${tarball##*/} installed in $work/collections"

    # salt-ssh's master side: the modules where a master keeps custom
    # modules (file_roots: _modules, _states), and everything it writes
    # under $salt.
    salt=$work/salt
    mkdir -p "$salt/srv/_modules" "$salt/srv/_states"
    cp packaging/salt/_modules/sparse_volume.py "$salt/srv/_modules/"
    cp packaging/salt/_states/sparse_volume.py "$salt/srv/_states/"
    cp tests/vm/salt/volumes.sls "$salt/srv/"
    # known_hosts_file, not ignore_host_keys: Salt 3006 does not pass the
    # latter to the scp of a state run's salt_state.tgz, which then waits
    # forever at ssh's host-key prompt (measured: state.apply hung, test.ping
    # did not).
    cat >"$salt/master" <<EOF
root_dir: $salt
pki_dir: $salt/pki
cachedir: $salt/cache
log_file: $salt/master.log
ssh_log_file: $salt/ssh.log
known_hosts_file: $salt/known_hosts
file_roots:
  base:
    - $salt/srv
EOF
    vm_log "salt-ssh: $("$salt_venv/bin/python" "$salt_venv/bin/salt-ssh" --version) from $salt_venv"
}

# After vm_start: the port is known.
write_inventory() {
    cat >"$work/inventory.yml" <<EOF
guest:
  hosts:
    sv-test:
      ansible_host: 127.0.0.1
      ansible_port: $SV_VM_PORT
      ansible_user: root
      ansible_ssh_private_key_file: $SV_VM_IMAGE/id_ed25519
      ansible_ssh_common_args: >-
        -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null
        -o GlobalKnownHostsFile=/dev/null -o IdentitiesOnly=yes -o LogLevel=ERROR
      ansible_python_interpreter: /usr/bin/python3
  vars:
    sv_ext4: $EXT4
    sv_xfs: $XFS
    sv_block: $BLOCK
    sv_ext4_grown: 96M
    sv_too_big: $TOO_BIG
    sv_results: $work
    sv_volumes:
      - {name: data, uuid: $EXT4, size: 64M, mode: filesystem, fs_type: ext4}
      - {name: scratch, uuid: $XFS, size: 320M, mode: filesystem, fs_type: xfs}
      - {name: raw, uuid: $BLOCK, size: 64M, mode: block}
# The take-over guide's play names this group.
metalk8s_nodes:
  hosts:
    sv-test:
EOF
    cat >"$salt/roster" <<EOF
sv-test:
  host: 127.0.0.1
  port: $SV_VM_PORT
  user: root
  priv: $SV_VM_IMAGE/id_ed25519
EOF
    ssh-keyscan -p "$SV_VM_PORT" 127.0.0.1 >"$salt/known_hosts" 2>/dev/null
    [[ -s $salt/known_hosts ]] || fail "ssh-keyscan got no host key of the guest"
}

# watched OUT COMMAND...: runs COMMAND, its stdout in OUT and its stderr
# in OUT.err, and sets rc to its exit status. While it runs, a guest that
# went to emergency mode or whose kernel panicked (a reboot that will not
# come back) ends it at once, as does a run past ten minutes (a prompt no
# one answers).
watched() {
    local out=$1 pid
    shift
    timeout 600 "$@" >"$out" 2>"$out.err" </dev/null &
    pid=$!
    watched_pid=$pid
    while kill -0 "$pid" 2>/dev/null; do
        if vm__serial_emergency || vm__serial_panicked; then
            kill "$pid" 2>/dev/null || true
            wait "$pid" || true
            sed 's/^/    | /' "$out" "$out.err" >&2
            vm__serial_this_boot | grep -E 'Timed out|Dependency failed|FAILED|Kernel panic' |
                sed 's/^/    | /' >&2 || true
            fail "$*: the guest went to emergency mode or panicked"
        fi
        sleep 1
    done
    rc=0
    wait "$pid" || rc=$?
    watched_pid=""
}

# playbook LOG PLAYBOOK [ARGS...]: ansible-playbook (of tests/vm/ansible/
# unless the path is absolute), its output in LOG and on stderr; fails
# unless it succeeded.
playbook() {
    local log=$1 file=$2 rc
    shift 2
    [[ $file == /* ]] || file=tests/vm/ansible/$file
    watched "$log" ansible-playbook "$file" "$@"
    sed 's/^/    | /' "$log" "$log.err" >&2
    ((rc == 0)) || fail "ansible-playbook $file $* exited $rc"
}

# salt_ssh OUT ARGS...: salt-ssh against the guest with --out=json; its
# output in OUT (stderr on ours), its exit status in rc.
salt_ssh() {
    local out=$1
    shift
    watched "$out" "$salt_venv/bin/python" "$salt_venv/bin/salt-ssh" -c "$salt" \
        --roster-file "$salt/roster" --out=json sv-test "$@"
    sed 's/^/    | /' "$out.err" >&2
    jq -e '.["sv-test"] | type == "object"' "$out" >/dev/null ||
        fail "salt-ssh $* (exit $rc) returned no state results: $(cat "$out")"
}

# state_field OUT ID FIELD: a field (result, comment ...) of one state's
# return in salt_ssh's OUT, as JSON.
state_field() {
    jq -c --arg id "$2" --arg field "$3" \
        '.["sv-test"][] | select(.__id__ == $id) | .[$field]' "$1"
}

# states_summary OUT: "ID result changed|unchanged: comment" per state.
states_summary() {
    jq -r '.["sv-test"][] | "\(.__id__) result=\(.result) \(if .changes == {} then "unchanged" else "changed" end): \(.comment)"' "$1" |
        sed 's/^/    /' >&2
}

# recap LOG FIELD: a number of the guest's PLAY RECAP line (changed, failed...).
recap() {
    local line
    line=$(grep -E '^sv-test +:' "$1" | tail -n 1) || fail "no PLAY RECAP line for sv-test in $1"
    sed -n "s/.* $2=\([0-9]*\).*/\1/p" <<<"$line"
}

# ------------------------------------------------------------ guest

# guest_check STEP [VAR=VALUE...]: a step of check.sh in the guest.
guest_check() {
    local step=$1
    shift
    vm_ssh "SV_EXT4=$EXT4 SV_XFS=$XFS SV_BLOCK=$BLOCK SV_EXT4_GROWN=$EXT4_GROWN $* bash /root/check.sh $step" </dev/null ||
        fail "the guest's check '$step' failed (see above)"
}

# snapshot FILE [VAR=VALUE...]: check.sh's snapshot of the node into FILE.
snapshot() {
    local file=$1
    shift
    vm_ssh "SV_EXT4=$EXT4 SV_XFS=$XFS SV_BLOCK=$BLOCK $* bash /root/check.sh snapshot" </dev/null >"$file" ||
        fail "check.sh snapshot"
}

# same_node BEFORE AFTER WHAT: fails unless the two snapshots are equal.
same_node() {
    if ! cmp -s "$1" "$2"; then
        diff -u "$1" "$2" | sed 's/^/    | /' >&2 || true
        fail "$3 changed the node (above: registry, backing files, loop devices, units)"
    fi
    vm_log "the node is byte-identical before and after $3 ($(grep -c '^===' "$1") items compared)"
}

boot() {
    # shellcheck disable=SC2119 # no data disks: the volumes live on the root disk
    vm_start
    write_inventory
    # shellcheck disable=SC2016 # expanded in the guest
    vm_log "guest: $(vm_ssh '. /etc/os-release && echo "$PRETTY_NAME, $(systemctl --version | head -n 1 | cut -d" " -f1,2), $(python3 --version), kernel $(uname -r)"' </dev/null)"
}

install_package() {
    vm_copy_in "$deb" tests/vm/ansible/check.sh /root/
    vm_ssh "dpkg -i /root/${deb##*/} >/dev/null" </dev/null
    vm_ssh 'sparse-volume --version' </dev/null >&2
}

converge() {
    playbook "$work/converge.log" converge.yml
    [[ $(recap "$work/converge.log" failed) == 0 ]] || fail "playbook 1: failed tasks"
    (($(recap "$work/converge.log" changed) > 0)) || fail "playbook 1 on a fresh guest changed nothing"
    payload_sum=$(vm_ssh 'cat /root/payload.sha256' </dev/null)
    [[ -n $payload_sum ]] || fail "no checksum of the data on /mnt/data"
    vm_log "data on the ext4 volume: $payload_sum"
}

converge_again() {
    playbook "$work/converge2.log" converge.yml
    local changed
    changed=$(recap "$work/converge2.log" changed)
    [[ $changed == 0 ]] || fail "playbook 1 run again: changed=$changed, expected changed=0"
}

check_diff() {
    snapshot "$work/before.txt"
    playbook "$work/check.log" change.yml --check --diff
    snapshot "$work/after.txt"
    local changed
    changed=$(recap "$work/check.log" changed)
    [[ $changed == 2 ]] || fail "playbook 2 with --check: changed=$changed, expected changed=2"
    # The default callback prints each diff as before/after JSON lines.
    grep -q -E "^\+ +\"size\": $EXT4_GROWN,?\$" "$work/check.log" ||
        fail "the --diff output has no '+ \"size\": $EXT4_GROWN' for the ext4 volume"
    grep -q -E '^\+ +"enabled": false,?$' "$work/check.log" ||
        fail "the --diff output has no '+ \"enabled\": false' for the xfs volume"
    same_node "$work/before.txt" "$work/after.txt" "the --check run"
}

change() {
    playbook "$work/change.log" change.yml --diff
    local changed
    changed=$(recap "$work/change.log" changed)
    [[ $changed == 2 ]] || fail "playbook 2: changed=$changed, expected changed=2"
    guest_check changed
}

reboot_and_verify() {
    playbook "$work/reboot.log" reboot.yml
    guest_check booted
    local sum
    sum=$(vm_ssh 'sha256sum /mnt/data/payload' </dev/null)
    [[ $sum == "$payload_sum" ]] || fail "the data on the ext4 volume after the reboot: $sum, expected $payload_sum"
    vm_log "data intact after the reboot: $sum"
}

remove() {
    playbook "$work/remove.log" remove.yml
    local changed
    changed=$(recap "$work/remove.log" changed)
    [[ $changed == 2 ]] || fail "playbook 3: changed=$changed, expected changed=2"
    guest_check removed
}

free_masked() { sed -E 's/[0-9]+(\.[0-9]+)? ([KMGTPE]i)?B free/N free/'; }

# same_reason WHAT GOT CLI: fails unless GOT (a module's message) is the
# CLI's error CLI for the same request. The free space in the message may
# move between the two runs (the guest's journal writes): only that number
# may differ.
same_reason() {
    local what=$1 got=$2 cli=$3
    vm_log "the $what: $got"
    vm_log "the CLI's error: $cli"
    [[ $(grep -c . <<<"$got") == 1 ]] || fail "the $what is not one line"
    grep -q 'not enough space' <<<"$got" || fail "the $what does not give the reason (not enough space)"
    if [[ $got != "$cli" ]]; then
        [[ $(free_masked <<<"$got") == "$(free_masked <<<"$cli")" ]] ||
            fail "the $what is not the CLI's error for the same request"
        vm_log "(the two differ only in the free space they saw)"
    fi
}

# cli_refusal UUID SIZE: runs the CLI's apply of that grow on the node,
# expects exit 1 with one line on stderr, and prints its JSON's error.
cli_refusal() {
    local out err rc=0
    out=$(vm_ssh "sparse-volume apply --json --uuid $1 --size $2 2>/root/refuse.err" </dev/null) || rc=$?
    err=$(vm_ssh 'cat /root/refuse.err' </dev/null)
    [[ $rc == 1 ]] || fail "sparse-volume apply --size $2 on the node exited $rc, expected 1 (stdout: $out, stderr: $err)"
    [[ $err == "sparse-volume: $(jq -r '.error' <<<"$out")" ]] ||
        fail "the CLI's stderr is not the one line 'sparse-volume: <error>': $err"
    jq -r '.error' <<<"$out"
}

refuse() {
    playbook "$work/refuse.log" refuse.yml
    [[ $(recap "$work/refuse.log" ignored) == 1 ]] || fail "the grow to $TOO_BIG was not a failed (ignored) task"
    local msg cli_error
    msg=$(jq -r 'if .failed then .msg else "NOT FAILED" end' "$work/refuse.json")
    [[ $msg != "NOT FAILED" ]] || fail "the grow to $TOO_BIG did not fail the task"
    cli_error=$(cli_refusal "$EXT4" "$TOO_BIG")
    same_reason "task's msg" "$msg" "$cli_error"
    [[ $(jq -r '.rc' "$work/refuse.json") == 1 ]] || fail "the task's rc is not 1"
    guest_check refused
}

# ------------------------------------------------------------ salt-ssh

# check.sh's snapshot of the Salt state's volumes only: the Ansible ext4
# volume stays mounted, and a mounted file system may write on its own.
SALT_VOLUMES="SV_VOLUMES='$SALT_EXT4 $SALT_BLOCK'"

salt_converge() {
    salt_ssh "$salt/converge.json" state.apply volumes
    states_summary "$salt/converge.json"
    ((rc == 0)) || fail "salt-ssh state.apply volumes exited $rc"
    local id
    for id in salt-data salt-raw; do
        [[ $(state_field "$salt/converge.json" "$id" result) == true ]] || fail "$id: result is not True"
        [[ $(state_field "$salt/converge.json" "$id" changes) != "{}" ]] || fail "$id: no changes on a fresh volume"
    done
    guest_check salt "SV_SALT_EXT4=$SALT_EXT4 SV_SALT_BLOCK=$SALT_BLOCK"
}

salt_again() {
    salt_ssh "$salt/again.json" state.apply volumes
    states_summary "$salt/again.json"
    ((rc == 0)) || fail "salt-ssh state.apply volumes (again) exited $rc"
    local unchanged
    unchanged=$(jq '[.["sv-test"][] | select(.result == true and .changes == {})] | length' "$salt/again.json")
    [[ $unchanged == 2 ]] || fail "state.apply again: $unchanged of 2 states True without changes"
}

salt_test_mode() {
    snapshot "$salt/before.txt" "$SALT_VOLUMES"
    salt_ssh "$salt/test.json" state.apply volumes test=True 'pillar={"sv_test": {"ext4_size": "96M"}}'
    states_summary "$salt/test.json"
    snapshot "$salt/after.txt" "$SALT_VOLUMES"
    [[ $(state_field "$salt/test.json" salt-data result) == null ]] ||
        fail "salt-data under test=True: result is not None"
    [[ $(state_field "$salt/test.json" salt-data changes | jq '.after.size') == "$EXT4_GROWN" ]] ||
        fail "salt-data under test=True: changes.after.size is not $EXT4_GROWN"
    [[ $(state_field "$salt/test.json" salt-raw result) == true ]] || fail "salt-raw under test=True: result is not True"
    same_node "$salt/before.txt" "$salt/after.txt" "state.apply test=True"
}

salt_refuse() {
    snapshot "$salt/before.txt" "$SALT_VOLUMES"
    salt_ssh "$salt/refuse.json" state.apply volumes "pillar={\"sv_test\": {\"ext4_size\": \"$TOO_BIG\"}}"
    states_summary "$salt/refuse.json"
    snapshot "$salt/after.txt" "$SALT_VOLUMES"
    ((rc != 0)) || fail "salt-ssh state.apply with a refused state exited 0"
    [[ $(state_field "$salt/refuse.json" salt-data result) == false ]] || fail "salt-data grown to $TOO_BIG: result is not False"
    same_reason "state's comment" "$(state_field "$salt/refuse.json" salt-data comment | jq -r .)" \
        "$(cli_refusal "$SALT_EXT4" "$TOO_BIG")"
    same_node "$salt/before.txt" "$salt/after.txt" "the refused state.apply"
}

# ------------------------------------------------------------ take-over

# guide_yaml SECTION: the ```yaml block under "## SECTION" of the take-over
# guide, as written.
guide_yaml() {
    awk -v want="## $1" '$0 == want { section = 1; next } /^## / { section = 0 }
        section && /^```yaml$/ { inside = 1; next } inside && /^```$/ { exit } inside' docs/guide/take-over.md
}

# metalk8s_volume KIND UUID MOUNT_POINT: made and attached the MetalK8s way,
# mounted; prints its loop device.
metalk8s_volume() {
    vm_ssh "bash /root/metalk8s-volume.sh make $1 $2 $3 && date >$3/payload && losetup --noheadings -O NAME -j /var/lib/metalk8s/storage/sparse/$2" </dev/null
}

ansible_take_over() {
    vm_copy_in tests/vm/metalk8s-volume.sh /root/
    local device changed
    device=$(metalk8s_volume ext4 "$MK_ANSIBLE" /mnt/mk-ansible)
    [[ $device == /dev/loop* ]] || fail "the MetalK8s-style volume has no loop device: $device"
    guide_yaml Ansible >"$work/take-over.yml"
    grep -q 'replaces_unit:' "$work/take-over.yml" || fail "the take-over guide has no Ansible play with replaces_unit"
    playbook "$work/take-over.log" "$work/take-over.yml"
    # The storage root added to the package's config.toml, and the take-over.
    changed=$(recap "$work/take-over.log" changed)
    [[ $changed == 2 ]] || fail "the take-over play: changed=$changed, expected 2"
    guest_check taken-over "SV_MK=$MK_ANSIBLE SV_MK_DEVICE=$device SV_MK_MOUNT=/mnt/mk-ansible"
    playbook "$work/take-over2.log" "$work/take-over.yml"
    changed=$(recap "$work/take-over2.log" changed)
    [[ $changed == 0 ]] || fail "the take-over play run again: changed=$changed, expected 0"
}

salt_take_over() {
    local device
    device=$(metalk8s_volume xfs "$MK_SALT" /mnt/mk-salt)
    [[ $device == /dev/loop* ]] || fail "the MetalK8s-style volume has no loop device: $device"
    guide_yaml Salt >"$salt/srv/take_over.sls"
    grep -q 'replaces_unit:' "$salt/srv/take_over.sls" || fail "the take-over guide has no Salt state with replaces_unit"
    salt_ssh "$salt/take-over.json" state.apply take_over
    states_summary "$salt/take-over.json"
    ((rc == 0)) || fail "salt-ssh state.apply take_over exited $rc"
    [[ $(state_field "$salt/take-over.json" "metalk8s-$MK_SALT" result) == true ]] || fail "metalk8s-$MK_SALT: result is not True"
    [[ $(state_field "$salt/take-over.json" "metalk8s-$MK_SALT" changes) != "{}" ]] || fail "metalk8s-$MK_SALT: no changes"
    guest_check taken-over "SV_MK=$MK_SALT SV_MK_DEVICE=$device SV_MK_MOUNT=/mnt/mk-salt"
    # Not run again: the repeat of the Ansible play above proves the CLI's
    # repeat, and "salt again" the state's handling of an unchanged one.
}

# ------------------------------------------------------------ run

total=$(vm__now_ms)
# The run directory of lib.sh holds this run's controller files too (kept
# with SV_VM_KEEP=1, removed otherwise).
SV_VM_RUN=$(mktemp -d -t sv-vm.XXXXXX)
work=$SV_VM_RUN/ansible
mkdir -p "$work"
phase "prepare" prepare
phase "boot" boot
phase "install" install_package
phase "converge" converge
phase "converge again" converge_again
phase "check --diff" check_diff
phase "change" change
phase "reboot" reboot_and_verify
phase "remove" remove
phase "refuse" refuse
phase "salt converge" salt_converge
phase "salt again" salt_again
phase "salt test=True" salt_test_mode
phase "salt refuse" salt_refuse
phase "ansible take-over" ansible_take_over
phase "salt take-over" salt_take_over
phase "poweroff" vm_stop
vm_log "phase times:"
printf '    %s\n' "${timings[@]}" >&2
vm_log "PASS: Ansible and salt-ssh against the $SV_VM_SUITE guest in $(vm__since "$total") (accelerator: $SV_VM_ACCEL_USED)"
