#!/usr/bin/env bash
# The guest half of tests/vm/config-management.sh: what the playbooks and
# salt-ssh left on the node, read with the node's own tools (not through
# the modules under test). config-management.sh copies it to /root and runs
# one step at a time:
#
#   check.sh snapshot   prints the registry files, the backing files (size,
#                       allocated blocks, sha256), the loop devices and the
#                       units, for a byte comparison before and after a
#                       --check or test=True run; of the volumes in
#                       SV_VOLUMES (UUIDs), or of every registered volume
#   check.sh changed    after playbook 2: the ext4 volume grown (registry,
#                       file, loop device, mounted file system), the xfs one
#                       disabled, stopped and detached
#   check.sh booted     after the reboot: every enabled volume attached once
#                       under its link, the fstab consumer mounted from it,
#                       the disabled one not attached
#   check.sh removed    after state: absent: both unregistered, one backing
#                       file kept, the other deleted, nothing attached to them
#   check.sh refused    after the refused grow: the ext4 volume unchanged
#   check.sh salt       after salt-ssh's first state.apply: its ext4 volume
#                       (SV_SALT_EXT4) and block volume (SV_SALT_BLOCK)
#                       registered, attached once, linked, units active
#   check.sh taken-over after the take-over guide's play or state: the
#                       MetalK8s-style volume SV_MK still on the loop device
#                       SV_MK_DEVICE (and only there, no pending detach), its
#                       consumer mounted at SV_MK_MOUNT, the old unit masked,
#                       inactive, disabled, its ExecStop never run, and
#                       sparse-volume's unit active
#
# The volumes come from the environment: SV_EXT4, SV_XFS, SV_BLOCK (UUIDs)
# and SV_EXT4_GROWN (the ext4 volume's size in bytes after playbook 2).
set -euo pipefail

step=${1:?step}
VOLUMES_D=/etc/sparse-volume/volumes.d
STORAGE=/var/lib/sparse-volume
MOUNT=/mnt/data

fail() {
    printf '[guest %s] FAIL: %s\n' "$step" "$*" >&2
    exit 1
}
log() { printf '[guest %s] %s\n' "$step" "$*"; }

# A top-level key of a volume's registry file ("size", "enabled", ...).
registry_value() {
    sed -n "s/^$2 = \"\{0,1\}\([^\"]*\)\"\{0,1\}$/\1/p" "$VOLUMES_D/$1.toml"
}

# The loop devices whose backing file is FILE, one per line.
loops_of() { losetup --noheadings -O NAME -j "$1"; }

# The one loop device of FILE (fails unless there is exactly one).
only_loop_of() {
    local devices
    devices=$(loops_of "$1")
    [[ $(grep -c . <<<"$devices") -eq 1 ]] || fail "$1: expected one loop device, got: ${devices:-none}"
    echo "$devices"
}

not_attached() {
    local uuid=$1 devices
    devices=$(loops_of "$STORAGE/$uuid")
    [[ -z $devices ]] || fail "$uuid: still attached to $devices"
    [[ ! -e /dev/disk/by-uuid/$uuid && ! -e /dev/disk/by-partuuid/$uuid ]] ||
        fail "$uuid: a /dev/disk link to it is still there"
}

unit_state() { systemctl is-active "sparse-volume@$1.service" 2>/dev/null || true; }

case $step in
snapshot)
    # Everything a --check run must leave alone. sync first, so what the
    # kernel still holds for the mounted ext4 volume is not written in
    # between by chance.
    sync
    if [[ -n ${SV_VOLUMES:-} ]]; then
        read -r -a volumes <<<"$SV_VOLUMES"
    else
        volumes=()
        for f in "$VOLUMES_D"/*.toml; do
            volumes+=("$(basename "$f" .toml)")
        done
    fi
    for uuid in "${volumes[@]}"; do
        f=$VOLUMES_D/$uuid.toml
        printf '=== %s\n' "$(stat -c '%n %s bytes, mode %a, modified %y' "$f")"
        cat "$f"
    done
    for uuid in "${volumes[@]}"; do
        f=$STORAGE/$uuid
        printf '=== %s %s\n' "$(stat -c '%n %s bytes, %b blocks allocated, modified %y' "$f")" \
            "$(sha256sum <"$f" | cut -d' ' -f1)"
    done
    echo '=== losetup -l'
    losetup -l
    echo '=== loop devices (lsblk)'
    lsblk -b -n -l -o NAME,SIZE,RO,TYPE | grep '^loop' || true
    echo '=== units'
    for uuid in "${volumes[@]}"; do
        echo "sparse-volume@$uuid.service $(unit_state "$uuid")"
    done
    ;;
changed)
    size=$(registry_value "$SV_EXT4" size)
    [[ $size == "$SV_EXT4_GROWN" ]] || fail "ext4 volume: registry size $size, expected $SV_EXT4_GROWN"
    size=$(stat -c %s "$STORAGE/$SV_EXT4")
    [[ $size == "$SV_EXT4_GROWN" ]] || fail "ext4 volume: backing file of $size bytes, expected $SV_EXT4_GROWN"
    loop=$(only_loop_of "$STORAGE/$SV_EXT4")
    size=$(blockdev --getsize64 "$loop")
    [[ $size == "$SV_EXT4_GROWN" ]] || fail "ext4 volume: $loop has $size bytes, expected $SV_EXT4_GROWN"
    # The mounted file system was grown online: more than the 64M it had
    # (ext4 keeps some of the device for itself).
    fs=$(findmnt -bno SIZE "$MOUNT")
    ((fs > 64 * 1024 * 1024)) || fail "ext4 volume: the file system mounted on $MOUNT still has $fs bytes"
    [[ $(registry_value "$SV_XFS" enabled) == false ]] || fail "xfs volume: not enabled = false in the registry"
    [[ $(unit_state "$SV_XFS") != active ]] || fail "xfs volume: its unit is still active"
    not_attached "$SV_XFS"
    only_loop_of "$STORAGE/$SV_BLOCK" >/dev/null
    log "ext4 grown to $SV_EXT4_GROWN bytes ($loop; file system $fs bytes, mounted), xfs disabled and detached"
    ;;
booted)
    loop=$(only_loop_of "$STORAGE/$SV_EXT4")
    [[ $(readlink -f "/dev/disk/by-uuid/$SV_EXT4") == "$loop" ]] ||
        fail "ext4 volume: /dev/disk/by-uuid/$SV_EXT4 -> $(readlink -f "/dev/disk/by-uuid/$SV_EXT4"), expected $loop"
    [[ $(findmnt -no SOURCE "$MOUNT") == "$loop" ]] ||
        fail "the fstab consumer $MOUNT is mounted from '$(findmnt -no SOURCE "$MOUNT")', expected $loop"
    [[ $(unit_state "$SV_EXT4") == active ]] || fail "ext4 volume: its unit is $(unit_state "$SV_EXT4")"
    block=$(only_loop_of "$STORAGE/$SV_BLOCK")
    [[ $(readlink -f "/dev/disk/by-partuuid/$SV_BLOCK") == "${block}p1" ]] ||
        fail "block volume: /dev/disk/by-partuuid/$SV_BLOCK -> $(readlink -f "/dev/disk/by-partuuid/$SV_BLOCK"), expected ${block}p1"
    [[ $(unit_state "$SV_BLOCK") == active ]] || fail "block volume: its unit is $(unit_state "$SV_BLOCK")"
    not_attached "$SV_XFS"
    [[ $(unit_state "$SV_XFS") != active ]] || fail "xfs volume (disabled): its unit is active"
    [[ $(systemctl is-active sparse-volumes.target) == active ]] || fail "sparse-volumes.target is not active"
    failed=$(systemctl list-units --failed --plain --no-legend 'sparse-volume*' | cut -d' ' -f1)
    [[ -z $failed ]] || fail "failed units: $failed"
    log "ext4 on $loop, mounted on $MOUNT; block on ${block}p1; xfs not attached"
    ;;
removed)
    for uuid in "$SV_BLOCK" "$SV_XFS"; do
        [[ ! -e $VOLUMES_D/$uuid.toml ]] || fail "$uuid: still registered"
        not_attached "$uuid"
        [[ $(unit_state "$uuid") != active ]] || fail "$uuid: its unit is still active"
    done
    [[ -f $STORAGE/$SV_BLOCK ]] || fail "block volume: its backing file is gone (state: absent without delete_data keeps it)"
    [[ ! -e $STORAGE/$SV_XFS ]] || fail "xfs volume: its backing file is still there (delete_data: true)"
    [[ -e $VOLUMES_D/$SV_EXT4.toml ]] || fail "ext4 volume: no longer registered"
    log "block unregistered, file kept; xfs unregistered, file deleted"
    ;;
refused)
    size=$(registry_value "$SV_EXT4" size)
    [[ $size == "$SV_EXT4_GROWN" ]] || fail "ext4 volume: registry size $size after the refusal, expected $SV_EXT4_GROWN"
    size=$(stat -c %s "$STORAGE/$SV_EXT4")
    [[ $size == "$SV_EXT4_GROWN" ]] || fail "ext4 volume: backing file of $size bytes after the refusal, expected $SV_EXT4_GROWN"
    log "ext4 volume unchanged at $SV_EXT4_GROWN bytes"
    ;;
salt)
    for uuid in "$SV_SALT_EXT4" "$SV_SALT_BLOCK"; do
        [[ -e $VOLUMES_D/$uuid.toml ]] || fail "$uuid: not registered"
        [[ $(unit_state "$uuid") == active ]] || fail "$uuid: its unit is $(unit_state "$uuid")"
    done
    loop=$(only_loop_of "$STORAGE/$SV_SALT_EXT4")
    [[ $(readlink -f "/dev/disk/by-uuid/$SV_SALT_EXT4") == "$loop" ]] ||
        fail "salt ext4 volume: /dev/disk/by-uuid/$SV_SALT_EXT4 -> $(readlink -f "/dev/disk/by-uuid/$SV_SALT_EXT4"), expected $loop"
    [[ $(blkid -o value -s TYPE "$loop") == ext4 ]] || fail "salt ext4 volume: $loop holds no ext4"
    block=$(only_loop_of "$STORAGE/$SV_SALT_BLOCK")
    [[ $(readlink -f "/dev/disk/by-partuuid/$SV_SALT_BLOCK") == "${block}p1" ]] ||
        fail "salt block volume: /dev/disk/by-partuuid/$SV_SALT_BLOCK -> $(readlink -f "/dev/disk/by-partuuid/$SV_SALT_BLOCK"), expected ${block}p1"
    log "ext4 on $loop, block on ${block}p1, both units active"
    ;;
taken-over)
    old=metalk8s-sparse-volume@$SV_MK.service
    loop=$(only_loop_of "/var/lib/metalk8s/storage/sparse/$SV_MK")
    [[ $loop == "$SV_MK_DEVICE" ]] || fail "$SV_MK: on $loop, expected the device its old unit made, $SV_MK_DEVICE"
    [[ $(cat "/sys/block/${loop#/dev/}/loop/autoclear") == 0 ]] || fail "$SV_MK: $loop has a pending detach"
    findmnt "$SV_MK_MOUNT" >/dev/null || fail "$SV_MK: the consumer $SV_MK_MOUNT is not mounted"
    [[ $(systemctl show -P LoadState "$old") == masked ]] || fail "$old is $(systemctl show -P LoadState "$old"), expected masked"
    [[ $(systemctl is-active "$old" || true) == inactive ]] || fail "$old is $(systemctl is-active "$old" || true)"
    [[ ! -e /etc/systemd/system/multi-user.target.wants/$old ]] || fail "$old is still enabled"
    [[ ! -e /var/lib/mk-cleanup-ran ]] || fail "the old unit's ExecStop ran: $(cat /var/lib/mk-cleanup-ran)"
    [[ $(unit_state "$SV_MK") == active ]] || fail "$SV_MK: its unit is $(unit_state "$SV_MK")"
    log "$SV_MK: still on $loop, $SV_MK_MOUNT mounted, $old masked and inactive, sparse-volume@$SV_MK.service active"
    ;;
*)
    fail "unknown step"
    ;;
esac
