#!/usr/bin/env bash
# shellcheck disable=SC2153 # the volume variables come from $STATE
# The guest half of the VM scenario (tests/vm/scenario.sh copies it in and
# runs one phase at a time over SSH, as root, in a Debian 12 or 13 guest
# with real systemd and udev):
#
#   guest.sh setup            make volumes of every kind and their consumers
#   guest.sh verify N         after boot N: everything is back, exactly once
#   guest.sh consumers        stopping one volume leaves the target's consumers up
#   guest.sh device-truth     start/check/stop report the device, not the unit
#   guest.sh prepare-boot N   boot 2: an unknown key in a volume file, a
#                             config.toml that does not parse, two volumes
#                             skipped; boot 3: an unknown key in the fresh
#                             config.toml; boot 4: sparse_volume=off;
#                             boot 5: the generator removed (negative control)
#   guest.sh restore-config   the good config.toml and volume file again
#   guest.sh systemd          enable/disable/start/stop against real systemd
#   guest.sh detach-by-link   detach a partition's parent found by udev link
#   guest.sh package          upgrade keeps volumes attached; remove and purge
#                             keep data quietly; a fresh install (boot 3 follows)
#   guest.sh partition-once   a block volume's partition appears once per attach
#   guest.sh metrics          the metrics timer under real systemd: textfile,
#                             one journal warning per warn_headroom crossing
#   guest.sh upgrade-from-previous
#                             setup ran on the last release's package; the
#                             package under test replaces it with volumes
#                             attached and mounted: nothing detaches, no unit
#                             restarts, the units now run the lean executable
#   guest.sh clone            a clone of the mounted consumer, and an import
#                             of its export, attached at every later boot
#                             under their own UUIDs
#   guest.sh take-over        volumes a MetalK8s-style unit attached (ext4,
#                             xfs, block), consumers mounted, taken over by
#                             register --replaces-unit: the same loop device,
#                             the old unit masked, disabled and stopped
#                             without its ExecStop
#   guest.sh readme-create    the README's first-volume commands, as written
#   guest.sh readme-check     after the reboot: the README's check commands,
#                             the volume back and mounted; then removed
#   guest.sh encrypted-create the encryption guide's volume and an xfs one,
#                             mounted by UUID=; detach refused while mounted;
#                             a block one read raw by a unit of its own
#   guest.sh encrypted-check N
#                             boot 1: back unattended, shutdown order; boot
#                             3: one without its key fails alone, and the
#                             guide's recovery brings it back
#   guest.sh emergency-switch-doc
#                             in a boot with sparse_volume.skip=: the
#                             emergency-switch guide's commands, as written
#
# Volume UUIDs are chosen at setup and kept in $STATE for later phases.
# SV_VM_SOFT=1: a failed check is logged (and kept in $SOFT_FAILURES)
# instead of ending the phase, to see every failure of a build at once.
set -Eeuo pipefail
# A command that ends a phase under set -e says which one (only in the
# phase's own shell: inside $(...) a failure is the caller's to judge).
trap 'err_rc=$?; ((BASH_SUBSHELL)) || printf "[guest %s] FAIL: exit %s at line %s: %s\n" "$phase" "$err_rc" "$LINENO" "$BASH_COMMAND" >&2' ERR

STATE=/root/scenario.env
SOFT_FAILURES=/root/soft-failures
CONFIG=/etc/sparse-volume/config.toml
VOLUMES_D=/etc/sparse-volume/volumes.d
# The storage root on the disk with 4096-byte logical sectors.
ROOT4K=/srv/volumes4k
CONSUMERS="consumer-wants.service consumer-requires.service"
CLI=sparse-volume
phase=${1:?phase}

log() { printf '[guest %s] %s\n' "$phase" "$*"; }
fail() {
    printf '[guest %s] FAIL: %s\n' "$phase" "$*" >&2
    if [[ ${SV_VM_SOFT:-} == 1 ]]; then
        printf '%s: %s\n' "$phase" "$*" >>"$SOFT_FAILURES"
        return 0
    fi
    exit 1
}
new_uuid() { cat /proc/sys/kernel/random/uuid; }
# A top-level scalar of a one-line JSON object (the guest has no python).
json_field() { sed -n "s/.*\"$1\":\(\"[^\"]*\"\|[a-z0-9]*\).*/\1/p" | tr -d '"'; }

# The one loop device that backs FILE (fails unless there is exactly one).
only_loop_of() {
    local file=$1 devices
    devices=$(losetup --noheadings -O NAME -j "$file")
    [[ $(grep -c . <<<"$devices") -eq 1 ]] || fail "$file: expected one loop device, got: ${devices:-none}"
    echo "$devices"
}

# The backing file a volume's registry file names.
file_of() { sed -n 's/^path = "\(.*\)"$/\1/p' "$VOLUMES_D/$1.toml"; }

# Every enabled volume (a variable name of $STATE each; CLONE and
# IMPORTED from the clone phase on, MK_* from the take-over phase on,
# which only the full scope runs): enabled_volumes names the ones made.
ALL_ENABLED_VOLUMES="EXT4 XFS BLOCK READONLY OTHER E4K X4K B4K CLONE IMPORTED MK_EXT4 MK_XFS MK_BLOCK MK_REPAIRED ENC_DB ENC_XFS ENC_BLK"
enabled_volumes() {
    local name
    for name in $ALL_ENABLED_VOLUMES; do
        [[ -z ${!name:-} ]] || echo "$name"
    done
}

# Every enabled volume but the one named has exactly one loop device.
others_attached() {
    local except=$1 context=$2 name
    for name in $(enabled_volumes); do
        [[ -z ${!name:-} || ${!name} == "$except" ]] && continue
        [[ $(losetup --noheadings -j "$(file_of "${!name}")" | grep -c .) -eq 1 ]] ||
            fail "$context: volume $name (${!name}) is no longer attached (expected the other volumes untouched)"
    done
}

consumers_active() {
    local context=$1 unit
    for unit in $CONSUMERS; do
        systemctl is-active --quiet "$unit" ||
            fail "$context: $unit is $(systemctl is-active "$unit") (expected active: a consumer of sparse-volumes.target must outlive one volume's stop)"
    done
}

# Back to the state every later phase expects, whatever a failed check left
# (a no-op on a correct build): enabled volumes attached through their
# units, the target and its consumers up.
restore_units() {
    local name
    systemctl reset-failed 'sparse-volume@*' 2>/dev/null || true
    for name in $(enabled_volumes); do
        grep -q '^enabled = true$' "$VOLUMES_D/${!name}.toml" || $CLI enable "${!name}" >/dev/null || true
        if [[ -z $(losetup --noheadings -j "$(file_of "${!name}")") ]]; then
            systemctl restart "sparse-volume@${!name}.service" || true
        else
            systemctl start "sparse-volume@${!name}.service" || true
        fi
    done
    systemctl start sparse-volumes.target $CONSUMERS || true
}

# run_rc VAR_OUT VAR_ERR CMD...: runs CMD, keeping its stdout, stderr and
# exit status (in $rc) without tripping set -e.
run_rc() {
    local -n _out=$1 _err=$2
    local errfile
    shift 2
    errfile=$(mktemp)
    rc=0
    _out=$("$@" 2>"$errfile") || rc=$?
    _err=$(<"$errfile")
    rm -f "$errfile"
}

# A consumer's file of random data, with its checksum kept for later boots.
write_payload() {
    local dir=$1 name=$2
    head -c 4M /dev/urandom >"$dir/payload"
    sync
    (cd "$dir" && sha256sum payload) >"/root/$name.sha256"
}

check_payload() {
    local dir=$1 name=$2
    (cd "$dir" && sha256sum --quiet -c "/root/$name.sha256") || fail "$name: payload checksum differs"
}

setup() {
    # A second file system, mounted through fstab, as a second storage root:
    # volumes there need RequiresMountsFor= and must not create a cycle.
    local data=/dev/disk/by-id/virtio-sv-data1
    udevadm wait --timeout=30 "$data"
    mkfs.ext4 -q -F -U "$(new_uuid)" "$data"
    mkdir -p /srv/volumes
    echo "UUID=$(blkid -s UUID -o value "$data") /srv/volumes ext4 defaults 0 2" >>/etc/fstab
    systemctl daemon-reload
    mount /srv/volumes
    chmod 0700 /srv/volumes
    # A third storage root on a disk with 4096-byte logical sectors (as NVMe
    # and cloud disks have): volumes made there must come up with 4096-byte
    # sectors, or their GPT and xfs do not read.
    local data4k=/dev/disk/by-id/virtio-sv-data2 ss
    udevadm wait --timeout=30 "$data4k"
    ss=$(blockdev --getss "$data4k")
    [[ $ss == 4096 ]] || fail "harness: $data4k has $ss-byte logical sectors, expected 4096 (vm_start ...@4k)"
    mkfs.ext4 -q -F -U "$(new_uuid)" "$data4k"
    mkdir -p "$ROOT4K"
    echo "UUID=$(blkid -s UUID -o value "$data4k") $ROOT4K ext4 defaults 0 2" >>/etc/fstab
    systemctl daemon-reload
    mount "$ROOT4K"
    chmod 0700 "$ROOT4K"
    cat >"$CONFIG" <<EOF
storage_roots = ["/var/lib/sparse-volume", "/srv/volumes", "$ROOT4K"]
EOF
    cp "$CONFIG" /root/config.toml.good

    local ext4 xfs block ro other disabled corrupt e4k x4k b4k
    ext4=$(new_uuid) xfs=$(new_uuid) block=$(new_uuid) ro=$(new_uuid)
    other=$(new_uuid) disabled=$(new_uuid) corrupt=$(new_uuid)
    e4k=$(new_uuid) x4k=$(new_uuid) b4k=$(new_uuid)
    cat >"$STATE" <<EOF
EXT4=$ext4
XFS=$xfs
BLOCK=$block
READONLY=$ro
OTHER=$other
DISABLED=$disabled
CORRUPT=$corrupt
E4K=$e4k
X4K=$x4k
B4K=$b4k
EOF
    # shellcheck disable=SC1090
    . "$STATE"
    log "volumes: $(tr '\n' ' ' <"$STATE")"

    $CLI create --uuid "$ext4" --size 64M --name consumer --now
    $CLI create --uuid "$xfs" --size 320M --fs xfs --now
    $CLI create --uuid "$block" --size 64M --mode block --now
    $CLI create --uuid "$ro" --size 64M
    sed -i 's/^read_only = false$/read_only = true/' "/etc/sparse-volume/volumes.d/$ro.toml"
    $CLI start "$ro"
    $CLI create --uuid "$other" --size 64M --path "/srv/volumes/$other" --now
    $CLI create --uuid "$disabled" --size 64M
    $CLI disable "$disabled" --now
    # A registry file that does not parse must not take the others down.
    printf 'uuid = "%s"\nsize = [broken\n' "$corrupt" >"/etc/sparse-volume/volumes.d/$corrupt.toml"

    # Consumers: an fstab mount of the ext4 volume by UUID (no nofail: the
    # boot really waits for it) and of the block volume's partition by
    # PARTUUID, formatted by the consumer as a raw block device would be.
    udevadm wait --timeout=30 "/dev/disk/by-uuid/$ext4" "/dev/disk/by-partuuid/$block"
    mkfs.ext4 -q -F "/dev/disk/by-partuuid/$block"
    mkdir -p /srv/consumer /srv/block
    {
        echo "UUID=$ext4 /srv/consumer ext4 defaults 0 2"
        echo "PARTUUID=$block /srv/block ext4 defaults 0 2"
    } >>/etc/fstab
    systemctl daemon-reload
    mount /srv/consumer
    mount /srv/block
    write_payload /srv/consumer consumer
    write_payload /srv/block block

    # Volumes on the 4K storage root, with fstab consumers by UUID= (nofail:
    # a volume that cannot attach is then a clear verify failure instead of
    # a boot stuck in emergency mode). The device timeout runs from the
    # start of the boot, not from the storage root's mount: 30 s ran out on
    # a loaded host before /srv/volumes4k was even mounted, so it is
    # systemd's default, written out.
    $CLI create --uuid "$e4k" --size 64M --path "$ROOT4K/$e4k" --now
    $CLI create --uuid "$x4k" --size 320M --fs xfs --path "$ROOT4K/$x4k" --now
    $CLI create --uuid "$b4k" --size 64M --mode block --path "$ROOT4K/$b4k" --now
    local uuid
    for uuid in "$e4k" "$x4k" "$b4k"; do
        grep -q '^sector_size = 4096$' "$VOLUMES_D/$uuid.toml" ||
            fail "4K storage root: $VOLUMES_D/$uuid.toml does not record sector_size = 4096 (has: $(grep '^sector_size' "$VOLUMES_D/$uuid.toml" || echo nothing))"
    done
    udevadm wait --timeout=30 "/dev/disk/by-uuid/$e4k" "/dev/disk/by-uuid/$x4k" ||
        fail "4K storage root: no /dev/disk/by-uuid link for the ext4 or xfs volume after create --now"
    mkdir -p /srv/e4k /srv/x4k
    {
        echo "UUID=$e4k /srv/e4k ext4 nofail,x-systemd.device-timeout=90s 0 2"
        echo "UUID=$x4k /srv/x4k xfs nofail,x-systemd.device-timeout=90s 0 2"
    } >>/etc/fstab
    systemctl daemon-reload
    mount /srv/e4k || fail "4K storage root: the ext4 volume does not mount"
    mount /srv/x4k || fail "4K storage root: the xfs volume does not mount"
    write_payload /srv/e4k e4k
    write_payload /srv/x4k x4k
    verify_4k

    # Consumers of sparse-volumes.target as kubelet would be: one Wants=,
    # one Requires= the target, both After= it.
    local dep
    for dep in Wants Requires; do
        cat >"/etc/systemd/system/consumer-${dep,,}.service" <<EOF
[Unit]
Description=Test consumer of sparse-volumes.target ($dep=)
$dep=sparse-volumes.target
After=sparse-volumes.target

[Service]
ExecStart=/bin/sleep infinity

[Install]
WantedBy=multi-user.target
EOF
    done
    systemctl daemon-reload
    # shellcheck disable=SC2086 # a list of unit names
    systemctl enable --now --quiet $CONSUMERS

    # Grow the mounted ext4 online; the new size must survive the reboots.
    local before after
    before=$(df --output=size -B1M /srv/consumer | tail -n 1)
    $CLI resize "$ext4" --size 128M
    after=$(df --output=size -B1M /srv/consumer | tail -n 1)
    ((after > before + 50)) || fail "online resize: df went from $before to $after MiB"
    grep -q "^size = $((128 << 20))$" "/etc/sparse-volume/volumes.d/$ext4.toml" || fail "resize not recorded"
    log "online resize of the mounted ext4: ${before} -> ${after} MiB"

    # list shows every volume and exits 1 because of the corrupt file.
    if $CLI list; then fail "list did not report the corrupt registry file"; fi
}

# A clone of the mounted consumer, made once the package is this version
# (setup ran on the last release's, which has no clone). This storage
# root shares no extents, so it is a copy while the consumer's file
# system is frozen; enabled, it comes back at every boot under its own
# UUID (verify checks both links), holding the consumer's payload.
clone_consumer() {
    # shellcheck disable=SC1090
    . "$STATE"
    local out clone device
    out=$($CLI clone consumer --name consumer-clone --now --freeze-during-copy --json) ||
        fail "clone of the mounted consumer: $out"
    clone=$(json_field uuid <<<"$out")
    [[ $(json_field consistency <<<"$out") == frozen && $(json_field method <<<"$out") == copy ]] ||
        fail "clone of the mounted consumer: expected a frozen copy: $out"
    echo "CLONE=$clone" >>"$STATE"
    udevadm wait --timeout=30 "/dev/disk/by-uuid/$clone" ||
        fail "no /dev/disk/by-uuid/$clone after clone --now"
    device=$(only_loop_of "/var/lib/sparse-volume/$clone")
    [[ $(readlink -f "/dev/disk/by-uuid/$clone") == "$device" ]] ||
        fail "/dev/disk/by-uuid/$clone $(link_text "/dev/disk/by-uuid/$clone"), expected $device"
    [[ $(readlink -f "/dev/disk/by-uuid/$EXT4") == "$(only_loop_of "/var/lib/sparse-volume/$EXT4")" ]] ||
        fail "the clone moved its source's link: /dev/disk/by-uuid/$EXT4 $(link_text "/dev/disk/by-uuid/$EXT4")"
    mkdir -p /mnt/clone
    mount -o ro "/dev/disk/by-uuid/$clone" /mnt/clone
    check_payload /mnt/clone consumer
    umount /mnt/clone
    log "clone $clone of the mounted consumer: $(json_field frozen_ms <<<"$out") ms frozen, its own link, the payload"

    # The clone exported and imported again beside it under a new UUID,
    # as a volume moved from another node would come: attached at every
    # later boot too. This storage root shares no extents, so the clone is
    # exported stopped (a device in use is read only through a reflink).
    local imported
    $CLI stop consumer-clone >/dev/null
    out=$($CLI export consumer-clone | $CLI import --new-uuid --name consumer-import --now --json) ||
        fail "export | import --new-uuid of the clone: $out"
    $CLI start consumer-clone >/dev/null
    imported=$(json_field uuid <<<"$out")
    echo "IMPORTED=$imported" >>"$STATE"
    udevadm wait --timeout=30 "/dev/disk/by-uuid/$imported" ||
        fail "no /dev/disk/by-uuid/$imported after import --now"
    mount -o ro "/dev/disk/by-uuid/$imported" /mnt/clone
    check_payload /mnt/clone consumer
    umount /mnt/clone
    log "imported $imported from an export of the clone: its own link, the payload"
}

# Where MetalK8s keeps its sparse files, and what its unit's ExecStop
# leaves behind here when it runs (it must never run once taken over).
MK_DIR=/var/lib/metalk8s/storage/sparse
MK_STOP_RAN=/var/lib/mk-cleanup-ran
MK_VOLUMES="MK_EXT4 MK_XFS MK_BLOCK MK_REPAIRED"

# Volumes made and attached the MetalK8s way, their consumers mounted
# (fstab, nofail) with data, then taken over one by one while mounted.
take_over() {
    # shellcheck disable=SC1090
    . "$STATE"
    # Their directory becomes a storage root (register adopts only there).
    local config
    for config in "$CONFIG" /root/config.toml.good; do
        sed -i "s|^storage_roots = \[\(.*\)\]$|storage_roots = [\1, \"$MK_DIR\"]|" "$config"
        grep -q "\"$MK_DIR\"\]$" "$config" || fail "harness: $MK_DIR not added to $config: $(cat "$config")"
    done
    local ext4 xfs block uuid file name device
    ext4=$(new_uuid) xfs=$(new_uuid) block=$(new_uuid)
    printf 'MK_EXT4=%s\nMK_XFS=%s\nMK_BLOCK=%s\n' "$ext4" "$xfs" "$block" >>"$STATE"
    bash /root/metalk8s-volume.sh make ext4 "$ext4" /srv/mk-ext4
    bash /root/metalk8s-volume.sh make xfs "$xfs" /srv/mk-xfs
    bash /root/metalk8s-volume.sh make block "$block" /srv/mk-block
    for name in ext4 xfs block; do
        write_payload "/srv/mk-$name" "mk-$name"
    done

    # The take-over guide's commands, as written.
    local out unit commands
    local -A before
    for uuid in "$ext4" "$xfs" "$block"; do
        before[$uuid]=$(only_loop_of "$MK_DIR/$uuid")
    done
    commands=$(doc_block take-over.md 1)
    grep -q -- '--replaces-unit' <<<"$commands" || fail "take-over guide: the first sh block is not the take-over: $commands"
    out=$(bash -euo pipefail -c "$commands" 2>&1) || fail "take-over guide: its commands failed as written: $out"
    log "take-over guide, as written: $out"
    for uuid in "$ext4" "$xfs" "$block"; do
        file=$MK_DIR/$uuid
        unit=metalk8s-sparse-volume@$uuid.service
        grep -F "took over from $unit " <<<"$out" | grep -q "holds ${before[$uuid]}\$" ||
            fail "take-over of $uuid: the guide's commands did not say $unit was taken over with ${before[$uuid]} kept: $out"
        device=$(only_loop_of "$file")
        [[ $device == "${before[$uuid]}" ]] || fail "take-over of $uuid: $file moved from ${before[$uuid]} to $device"
        [[ $(cat "/sys/block/${device#/dev/}/loop/autoclear") == 0 ]] ||
            fail "take-over of $uuid: $device has a pending detach (the old ExecStop ran?)"
        [[ $(systemctl show -P LoadState "$unit") == masked ]] ||
            fail "take-over of $uuid: $unit is $(systemctl show -P LoadState "$unit"), expected masked"
        [[ $(systemctl is-active "$unit") == inactive ]] ||
            fail "take-over of $uuid: $unit is $(systemctl is-active "$unit"), expected inactive"
        [[ ! -e /etc/systemd/system/multi-user.target.wants/$unit ]] ||
            fail "take-over of $uuid: $unit is still enabled"
        systemctl is-active --quiet "sparse-volume@$uuid.service" ||
            fail "take-over of $uuid: sparse-volume@$uuid.service is $(systemctl is-active "sparse-volume@$uuid.service")"
        log "took over $uuid on $device: $unit masked, disabled, stopped; sparse-volume@$uuid.service active"
    done
    # Config management repeats it: nothing to do.
    out=$($CLI register --uuid "$ext4" --path "$MK_DIR/$ext4" --replaces-unit "metalk8s-sparse-volume@$ext4.service" --json)
    [[ $(json_field changed <<<"$out") == false ]] || fail "a repeated take-over changed something: $out"
    # (list exits 1 for the scenario's corrupt registry file: set aside.)
    mv "$VOLUMES_D/$CORRUPT.toml" /root/corrupt.toml
    out=$(bash -euo pipefail -c "$(doc_block take-over.md 2)" 2>&1) || {
        mv /root/corrupt.toml "$VOLUMES_D/$CORRUPT.toml"
        fail "take-over guide: its checking commands failed as written: $out"
    }
    mv /root/corrupt.toml "$VOLUMES_D/$CORRUPT.toml"
    [[ $(grep -c '^metalk8s-sparse-volume@.*: masked, inactive$' <<<"$out") == 3 ]] ||
        fail "take-over guide: the listing does not show the three old units masked and inactive: $out"
    take_over_interrupted
    # shellcheck disable=SC1090
    . "$STATE"
    verify_taken_over "the take-over"
    # The xfs volume's old unit enabled again behind our back (as the
    # field's config management may do): from the next boot on only the
    # generator's mask keeps it from binding a second loop device.
    ln -s /etc/systemd/system/metalk8s-sparse-volume@.service \
        "/etc/systemd/system/multi-user.target.wants/metalk8s-sparse-volume@$xfs.service"
}

# A take-over killed right after its registry write (the entry names the
# old unit; nothing reloaded, disabled or stopped yet): check reports it,
# and check --repair finishes it with the consumer mounted.
take_over_interrupted() {
    local uuid file unit before out err device
    uuid=$(new_uuid) file=$MK_DIR/$uuid unit=metalk8s-sparse-volume@$uuid.service
    echo "MK_REPAIRED=$uuid" >>"$STATE"
    bash /root/metalk8s-volume.sh make ext4 "$uuid" /srv/mk-repaired
    write_payload /srv/mk-repaired mk-repaired
    before=$(only_loop_of "$file")
    cat >"$VOLUMES_D/$uuid.toml" <<EOF
uuid = "$uuid"
path = "$file"
size = 67108864
mode = "filesystem"
fs_type = "ext4"
replaces_unit = "$unit"
EOF
    mv "$VOLUMES_D/$CORRUPT.toml" /root/corrupt.toml
    run_rc out err $CLI check --json
    ((rc == 1)) && grep -q "\"kind\":\"replaced-unit-not-retired\"[^}]*$uuid" <<<"$out" || {
        mv /root/corrupt.toml "$VOLUMES_D/$CORRUPT.toml"
        fail "an interrupted take-over: check exited $rc without replaced-unit-not-retired for $uuid: $out $err"
    }
    run_rc out err $CLI check --repair --json
    mv /root/corrupt.toml "$VOLUMES_D/$CORRUPT.toml"
    ((rc == 0)) || fail "an interrupted take-over: check --repair exited $rc: $out $err"
    device=$(only_loop_of "$file")
    [[ $device == "$before" ]] || fail "an interrupted take-over: the repair moved $file from $before to $device"
    [[ $(cat "/sys/block/${device#/dev/}/loop/autoclear") == 0 ]] ||
        fail "an interrupted take-over: $device has a pending detach after the repair"
    [[ $(systemctl show -P LoadState "$unit") == masked && $(systemctl is-active "$unit" || true) == inactive ]] ||
        fail "an interrupted take-over: after the repair $unit is $(systemctl show -P LoadState "$unit"), $(systemctl is-active "$unit" || true)"
    [[ ! -e /etc/systemd/system/multi-user.target.wants/$unit ]] || fail "an interrupted take-over: $unit is still enabled after the repair"
    systemctl is-active --quiet "sparse-volume@$uuid.service" ||
        fail "an interrupted take-over: sparse-volume@$uuid.service is $(systemctl is-active "sparse-volume@$uuid.service") after the repair"
    check_payload /srv/mk-repaired mk-repaired
    log "an interrupted take-over: check reported replaced-unit-not-retired, check --repair finished it on $device"
}

# After the take-over and at every later boot: each file on one loop
# device with its link, the consumer mounted with its data, the old unit
# inactive, and its ExecStop never run (not at the take-over, not at a
# shutdown).
verify_taken_over() {
    local context=$1 name uuid device link
    [[ -n ${MK_EXT4:-} ]] || return 0
    for name in $MK_VOLUMES; do
        uuid=${!name}
        device=$(only_loop_of "$MK_DIR/$uuid")
        link=/dev/disk/by-uuid/$uuid
        if [[ $name == MK_BLOCK ]]; then
            link=/dev/disk/by-partuuid/$uuid device=${device}p1
        fi
        [[ $(readlink -f "$link") == "$device" ]] || fail "$context: $link $(link_text "$link"), expected $device"
        [[ $(systemctl is-active "metalk8s-sparse-volume@$uuid.service") == inactive ]] ||
            fail "$context: metalk8s-sparse-volume@$uuid.service is $(systemctl is-active "metalk8s-sparse-volume@$uuid.service")"
        [[ $(systemctl show -P LoadState "metalk8s-sparse-volume@$uuid.service") == masked ]] ||
            fail "$context: metalk8s-sparse-volume@$uuid.service is $(systemctl show -P LoadState "metalk8s-sparse-volume@$uuid.service"), expected masked (by the generator)"
    done
    for name in ext4 xfs block repaired; do
        findmnt "/srv/mk-$name" >/dev/null || fail "$context: the consumer /srv/mk-$name is not mounted"
        check_payload "/srv/mk-$name" "mk-$name"
    done
    [[ ! -e $MK_STOP_RAN ]] || fail "$context: the old unit's ExecStop ran: $(cat "$MK_STOP_RAN")"
    log "$context: the four volumes taken over from MetalK8s-style units attached once, linked, mounted, data intact; the old units masked and inactive, their ExecStop never run"
}

# The volumes on the 4K storage root: attached once, with 4096-byte
# sectors, their links, and their fstab consumers mounted with data intact.
verify_4k() {
    local uuid device ss
    for uuid in "$E4K" "$X4K" "$B4K"; do
        device=$(only_loop_of "$ROOT4K/$uuid")
        [[ -n $device ]] || continue
        ss=$(blockdev --getss "$device")
        [[ $ss == 4096 ]] ||
            fail "4K storage root: $device of volume $uuid has $ss-byte logical sectors, expected 4096 (the backing disk's)"
    done
    for uuid in "$E4K" "$X4K"; do
        device=$(losetup --noheadings -O NAME -j "$ROOT4K/$uuid" | head -n 1)
        [[ -n $device ]] || continue
        [[ $(readlink -f "/dev/disk/by-uuid/$uuid") == "$device" ]] ||
            fail "4K storage root: /dev/disk/by-uuid/$uuid $(link_text "/dev/disk/by-uuid/$uuid"), expected it to point at $device"
    done
    device=$(losetup --noheadings -O NAME -j "$ROOT4K/$B4K" | head -n 1)
    if [[ -n $device ]]; then
        [[ -b ${device}p1 ]] ||
            fail "4K storage root: block volume $B4K on $device has no partition ${device}p1 (its GPT does not read at $(blockdev --getss "$device")-byte sectors)"
        [[ $(readlink -f "/dev/disk/by-partuuid/$B4K") == "${device}p1" ]] ||
            fail "4K storage root: /dev/disk/by-partuuid/$B4K $(link_text "/dev/disk/by-partuuid/$B4K"), expected it to point at ${device}p1"
    fi
    local name
    for name in e4k x4k; do
        if findmnt "/srv/$name" >/dev/null; then
            check_payload "/srv/$name" "$name"
        else
            fail "4K storage root: the fstab consumer /srv/$name (UUID=) is not mounted"
        fi
    done
}

# "points at X" or "does not exist", for a udev link.
link_text() {
    if [[ -L $1 ]]; then echo "points at $(readlink -f "$1")"; else echo "does not exist"; fi
}

# `sparse-volume check` after boot N. The corrupt registry file is there on
# purpose: check must name it and exit 1. Without it, check must exit 0 and
# find nothing, except what this boot leaves on purpose: on boot 2 the
# config.toml that does not parse (an error, exit 1) and the volume file's
# unknown key, on boot 3 the unknown key in config.toml (a warning, exit 0);
# and on a boot with an emergency switch, a volume it keeps detached may
# only be mentioned with the switch named.
check_findings() {
    local boot=$1 out err rc required="" expect_rc=0 finding kind
    case $boot in
    2) required="invalid-config unknown-key" expect_rc=1 ;;
    3) required="unknown-key" ;;
    esac
    run_rc out err $CLI check --json
    ((rc == 1)) ||
        fail "after boot $boot: check exited $rc with the corrupt registry file $CORRUPT.toml in place, expected 1: $out $err"
    grep -q "\"kind\":\"invalid-registry-file\"[^}]*$CORRUPT\.toml" <<<"$out" ||
        fail "after boot $boot: check did not report the corrupt registry file $CORRUPT.toml as invalid-registry-file: $out"
    mv "$VOLUMES_D/$CORRUPT.toml" /root/corrupt.toml
    run_rc out err $CLI check --json
    mv /root/corrupt.toml "$VOLUMES_D/$CORRUPT.toml"
    ((rc == expect_rc)) ||
        fail "after boot $boot: check (corrupt registry file set aside) exited $rc, expected $expect_rc: $out $err"
    for kind in $required; do
        grep -q "\"kind\":\"$kind\"" <<<"$out" ||
            fail "after boot $boot: check did not report $kind (left on purpose for this boot): $out"
    done
    while read -r finding; do
        kind=$(sed -n 's/^{"kind":"\([^"]*\)".*/\1/p' <<<"$finding")
        [[ " $required " == *" $kind "* ]] && continue
        [[ -n $(expected_switch) && $finding == *sparse_volume* ]] && continue
        # The block volumes setup made with the previous release carry the
        # partition name every block volume had before; check says so.
        if [[ $kind == shared-partition-name &&
            ($finding == *"\"uuid\":\"$BLOCK\""* || $finding == *"\"uuid\":\"$B4K\""*) ]]; then
            continue
        fi
        fail "after boot $boot: sparse-volume check found $finding (expected no finding but: ${required:-none})"
    done < <(sed 's/{"kind":/\n{"kind":/g' <<<"$out" | grep '^{"kind":')
    log "check after boot $boot: exit 1 naming the corrupt registry file; without it exit $rc, findings: $(grep -o '"kind":"[^"]*"' <<<"$out" | cut -d'"' -f4 | sort | uniq -c | tr -s ' \n' ' ' || true)"
}

# The kernel announced DEVICE's partition once in this boot: a second scan
# (udev re-reading the table after a writer's close, or a pending scan run
# by an open) removes p1 under a consumer already started on it, and an
# fstab consumer then fails the boot.
partition_scanned_once() {
    local boot=$1 device=$2 scans
    scans=$(journalctl -b 0 -k --no-pager | grep -cE " ${device#/dev/}: p1\$" || true)
    ((scans == 1)) || fail "boot $boot: the kernel scanned the partitions of $device $scans times (expected once: a second scan pulls p1 from under its consumer)"
}

# `pv --all` names one device path per enabled volume, and after this
# boot each exists and is that volume's device: what kubelet will open.
pv_paths_exist() {
    local boot=$1 out err paths path name want=""
    run_rc out err $CLI pv --all
    ((rc == 0)) || fail "after boot $boot: pv --all exited $rc: $err"
    paths=$(grep -oE '/dev/(disk/by-[a-z]*/|mapper/sparse-volume-)[0-9a-f-]*' <<<"$out" | sort)
    for name in $(enabled_volumes); do
        case $name in
        BLOCK | B4K | MK_BLOCK) want+="/dev/disk/by-partuuid/${!name}"$'\n' ;;
        ENC_BLK) want+="/dev/mapper/sparse-volume-${!name}"$'\n' ;;
        *) want+="/dev/disk/by-uuid/${!name}"$'\n' ;;
        esac
    done
    [[ $paths == "$(sort <<<"${want%$'\n'}")" ]] ||
        fail "after boot $boot: pv --all names $paths, expected one path per enabled volume: $want"
    for path in $paths; do
        [[ -b $path ]] || fail "after boot $boot: $path (from pv --all) is not a block device"
    done
    log "pv --all after boot $boot: $(grep -c . <<<"$paths") PersistentVolumes, every local.path is a block device"
}

# The emergency switch of this boot (prepare-boot writes it; scenario.sh
# puts it on the kernel command line for that boot only), or nothing.
BOOT_SWITCH=/root/boot-switch
expected_switch() { cat "$BOOT_SWITCH" 2>/dev/null || true; }
# The UUIDs sparse_volume.skip= names in this boot, space-separated.
switch_skips() { expected_switch | sed -n 's/^sparse_volume\.skip=//p' | tr ',' ' '; }
# stderr without the warnings every command repeats (unknown keys).
error_lines() { grep -v '^sparse-volume: warning: ' <<<"$1" || true; }

# Booted with sparse_volume.skip=: those volumes stay detached, the
# generator says so naming each, and attaching one by hand is refused in
# one line naming the switch (verify checks the others as usual).
verify_skipped() {
    local boot=$1 skipped=$2 uuid out err rc line kernel_log
    kernel_log=$(journalctl -b 0 -k --no-pager)
    for uuid in $skipped; do
        [[ -z $(losetup --noheadings -j "$(file_of "$uuid")") ]] ||
            fail "boot $boot: $uuid is attached although sparse_volume.skip= names it"
        systemctl is-active --quiet "sparse-volume@$uuid.service" &&
            fail "boot $boot: sparse-volume@$uuid.service is active although sparse_volume.skip= names it"
        line=$(grep -E "sparse-volume-generator: .*$uuid.*sparse_volume\.skip=" <<<"$kernel_log") ||
            fail "boot $boot: no generator line in the kernel log naming the skipped volume $uuid and sparse_volume.skip=; generator lines: $(grep sparse-volume-generator <<<"$kernel_log" || echo none)"
        log "kernel log: $line"
        run_rc out err $CLI attach "$uuid"
        err=$(error_lines "$err")
        ((rc == 1)) || fail "boot $boot: attach of the skipped volume $uuid exited $rc, expected 1: $out $err"
        [[ $(grep -c . <<<"$err") == 1 && $err == *"$uuid"*"sparse_volume.skip="* ]] ||
            fail "boot $boot: attach of the skipped volume $uuid: expected one line on stderr naming it and sparse_volume.skip=, got: $err"
        log "attach refused: $err"
        [[ -z $(losetup --noheadings -j "$(file_of "$uuid")") ]] ||
            fail "boot $boot: the refused attach of $uuid left a loop device"
    done
}

# Booted with sparse_volume=off: no volume attached, no volume unit
# started, the generator says why, attach by hand is refused naming the
# switch, and the boot still reaches multi-user.target.
verify_off() {
    local boot=$1 system name units line out err rc kernel_log
    [[ $(</proc/cmdline) == *sparse_volume=off* ]] ||
        fail "harness: this boot should have sparse_volume=off on the kernel command line, has: $(</proc/cmdline)"
    system=$(systemctl is-system-running --wait || true)
    [[ $(systemctl is-active multi-user.target) == active ]] ||
        fail "sparse_volume=off: multi-user.target is $(systemctl is-active multi-user.target) (expected active); system: $system; failed units: $(systemctl --failed --no-legend --plain)"
    for name in $(enabled_volumes) DISABLED; do
        [[ -z $(losetup --noheadings -j "$(file_of "${!name}")") ]] ||
            fail "sparse_volume=off: volume $name (${!name}) is attached"
    done
    units=$(systemctl list-units --all --no-legend --plain --state=active,activating,failed 'sparse-volume@*')
    [[ -z $units ]] || fail "sparse_volume=off: volume units were started: $units"
    kernel_log=$(journalctl -b 0 -k --no-pager)
    line=$(grep -E "sparse-volume-generator: .*sparse_volume=off" <<<"$kernel_log") ||
        fail "sparse_volume=off: no generator line in the kernel log naming the switch; generator lines: $(grep sparse-volume-generator <<<"$kernel_log" || echo none)"
    log "kernel log: $line"
    run_rc out err $CLI attach "$EXT4"
    err=$(error_lines "$err")
    ((rc == 1)) || fail "sparse_volume=off: attach $EXT4 exited $rc, expected 1: $out $err"
    [[ $(grep -c . <<<"$err") == 1 && $err == *"$EXT4"*"sparse_volume=off"* ]] ||
        fail "sparse_volume=off: attach $EXT4: expected one line on stderr naming it and sparse_volume=off, got: $err"
    log "attach refused: $err"
    [[ -z $(losetup --noheadings -j "$(file_of "$EXT4")") ]] || fail "sparse_volume=off: the refused attach left a loop device"
    check_findings "$boot"
    log "sparse_volume=off: no volume attached, no volume unit started, multi-user.target active (system $system; failed units: $(systemctl --failed --no-legend --plain | cut -d' ' -f1 | tr '\n' ' '))"
}

# udev of systemd 254 and later (Debian 13) links
# /dev/disk/by-loop-ref/<lo_file_name>, and attach names each device
# "sparse-volume:<UUID>": there every attached volume has that second stable
# name, its partition one with -part1, and no link outlives its device.
# udev 252 (Debian 12) has no such rule.
verify_loop_ref() {
    local boot=$1 name uuid device skipped expected=0 links
    if ! grep -qs 'by-loop-ref' /usr/lib/udev/rules.d/60-persistent-storage.rules; then
        log "boot $boot: this udev ($(udevadm --version)) makes no /dev/disk/by-loop-ref links; nothing to check"
        return 0
    fi
    skipped=$(switch_skips)
    for name in $(enabled_volumes); do
        uuid=${!name}
        [[ " $skipped " == *" $uuid "* ]] && continue
        device=$(only_loop_of "$(file_of "$uuid")")
        expected=$((expected + 1))
        [[ $(readlink -f "/dev/disk/by-loop-ref/sparse-volume:$uuid") == "$device" ]] ||
            fail "/dev/disk/by-loop-ref/sparse-volume:$uuid $(link_text "/dev/disk/by-loop-ref/sparse-volume:$uuid"), expected it to point at $device"
        [[ $(losetup --noheadings -O REF "$device" | tr -d ' ') == "sparse-volume:$uuid" ]] ||
            fail "losetup -O REF $device says '$(losetup --noheadings -O REF "$device")', expected sparse-volume:$uuid"
    done
    for uuid in "$BLOCK" "$B4K"; do
        [[ -b /dev/disk/by-loop-ref/sparse-volume:$uuid-part1 ]] ||
            fail "no /dev/disk/by-loop-ref/sparse-volume:$uuid-part1 for the block volume's partition"
    done
    links=$(find /dev/disk/by-loop-ref -name 'sparse-volume:*' ! -name '*-part*' 2>/dev/null | grep -c . || true)
    ((links == expected)) ||
        fail "/dev/disk/by-loop-ref has $links sparse-volume links, expected $expected (one per attached volume): $(ls /dev/disk/by-loop-ref)"
    log "boot $boot: /dev/disk/by-loop-ref/sparse-volume:<UUID> of each of the $expected attached volumes points at its device"
}

# systemd-analyze verify of the package's units as this guest's systemd
# reads them, with the generator's instances and drop-ins of this boot:
# a newer systemd may warn about what an older one accepted.
# The units' own program: what ExecStart/ExecStop run since the package
# under test (not the CLI).
LEAN=/usr/libexec/sparse-volume-unit

# The InvocationID of every active volume unit: a restarted unit has a new one.
volume_invocations() {
    local unit
    for unit in $(systemctl list-units --no-legend --plain --state=active 'sparse-volume@*.service' | awk '{print $1}'); do
        echo "$unit $(systemctl show -p InvocationID --value "$unit")"
    done
}

upgrade_from_previous() {
    # shellcheck disable=SC1090
    . "$STATE"
    local version before after invocations mounts deb=(/root/sparse-volume_*_amd64.deb)
    version=$(dpkg-query -W -f '${Version}' sparse-volume)
    [[ $version == "$(cat /root/previous/version)" ]] ||
        fail "harness: setup ran on sparse-volume $version, expected the last release $(cat /root/previous/version)"
    before=$(losetup --noheadings -O NAME,BACK-FILE | sort)
    invocations=$(volume_invocations)
    mounts=$(findmnt -rn -o TARGET,SOURCE | sort)
    [[ -n $invocations ]] || fail "harness: no volume unit is active before the upgrade"
    dpkg -i "${deb[0]}" >/dev/null
    version=$(dpkg-query -W -f '${Version}' sparse-volume)
    [[ $version == "$(dpkg-deb -f "${deb[0]}" Version)" ]] || fail "the upgrade did not install ${deb[0]##*/} (sparse-volume $version)"
    after=$(losetup --noheadings -O NAME,BACK-FILE | sort)
    [[ $before == "$after" ]] || fail "upgrading from the last release changed the loop devices: before $before; after $after"
    [[ $(volume_invocations) == "$invocations" ]] || fail "upgrading from the last release restarted volume units: before $invocations; after $(volume_invocations)"
    [[ $(findmnt -rn -o TARGET,SOURCE | sort) == "$mounts" ]] || fail "upgrading from the last release changed the mounts"
    [[ -z $(systemctl --failed --no-legend --plain) ]] || fail "units failed during the upgrade: $(systemctl --failed --no-legend --plain)"
    local exec
    exec=$(systemctl show -p ExecStop --value "sparse-volume@$EXT4.service")
    [[ $exec == *"path=$LEAN ;"*" detach $EXT4 ;"* ]] ||
        fail "after the upgrade, the running unit's ExecStop is not the lean executable: $exec"
    check_payload /srv/consumer consumer
    log "upgraded $(cat /root/previous/version) -> $version with $(wc -l <<<"$invocations") volume units active: no device, mount or unit changed; the units stop with $LEAN"
}

# The units of boot N ran the lean executable: what systemd ran at boot is
# what ExecStart names (loaded before the boot's first start, unchanged
# since), and the unit said "attached" in this boot's journal. (Not
# ExecStart's runtime fields, which a daemon-reload since the start
# clears, nor the lines' _EXE, which journald cannot read from a process
# that exited within a millisecond.)
verify_lean_units() {
    local unit=sparse-volume@$EXT4.service exec said
    exec=$(systemctl show -p ExecStart --value "$unit")
    [[ $exec == *"path=$LEAN ;"*" attach $EXT4 ;"* ]] ||
        fail "$unit does not run $LEAN attach: ExecStart=$exec"
    [[ $(systemctl show -p Result --value "$unit") == success ]] ||
        fail "$unit: Result=$(systemctl show -p Result --value "$unit")"
    said=$(journalctl -b 0 -u "$unit" -t sparse-volume -o cat --no-pager | grep "^attached $EXT4 as /dev/loop" || true)
    [[ -n $said ]] || fail "$unit's journal of this boot has no \"attached $EXT4 as ...\" line from sparse-volume"
    log "the units ran $LEAN at boot: \"$said\""
}

# The N-th ```sh block of a doc page that scenario.sh copies in (README.md,
# emergency-switch.md, monitoring.md, take-over.md). tests/doc_commands.rs checks that
# every shell block of the docs is run by a `doc_block PAGE N` here (or
# by the scripts CI runs).
doc_block() {
    awk -v want="$2" '/^```sh$/ { n++; if (n == want) { inside = 1; next } } /^```$/ { if (inside) exit } inside' "/root/$1"
}

readme_create() {
    local block
    block=$(doc_block README.md 2)
    grep -q 'sparse-volume create' <<<"$block" || fail "README: the second sh block is not the first volume: $block"
    bash -euo pipefail -c "$block" || fail "README: the first volume's commands failed as written: $block"
    findmnt /srv/pg >/dev/null || fail "README: /srv/pg is not mounted after its commands"
    [[ $(doc_block README.md 3) == "systemctl reboot" ]] ||
        fail "README: the reboot block is not 'systemctl reboot' (scenario.sh reboots the guest so): $(doc_block README.md 3)"
    log "README: the first volume made and mounted, as written"
}

readme_check() {
    local block out source
    # As a reader would: once the boot is over (the mount is nofail).
    systemctl is-system-running --wait >/dev/null || true
    block=$(doc_block README.md 4)
    out=$(bash -euo pipefail -c "$block" 2>&1) || fail "README: the commands after the reboot failed as written: $out"
    source=$(findmnt -n -o SOURCE /srv/pg) || fail "README: /srv/pg is not mounted after the reboot"
    grep -qE '^ +device: +/dev/loop[0-9]+$' <<<"$out" || fail "README: status shows no loop device for the volume: $out"
    [[ $source == /dev/loop* ]] || fail "README: /srv/pg is mounted from $source, not a loop device"
    # Out of the way of the scenario's later phases.
    umount /srv/pg
    sed -i '\| /srv/pg |d' /etc/fstab
    systemctl daemon-reload
    $CLI remove pg-data --delete-data >/dev/null || fail "README: removing pg-data failed"
    log "README: after the reboot /srv/pg is mounted from $source, status shows its device; removed again"
}

# The emergency-switch guide's commands, as written, in a boot with
# sparse_volume.skip=: its placeholder UUID stands for a skipped volume.
# Every line runs; each exits 0, or 1 where an audit finds something
# (attach must: it is refused while the switch is on, naming it). Its last
# line, the reboot, is the scenario's next boot.
emergency_switch_doc() {
    # shellcheck disable=SC1090
    . "$STATE"
    local skipped uuid block line command rc out ran=0
    skipped=$(switch_skips)
    uuid=${skipped%% *}
    [[ -n $uuid ]] || fail "emergency-switch guide: this boot skips no volume"
    block=$(doc_block emergency-switch.md 1)
    [[ $(tail -n 1 <<<"$block" | sed 's/ *#.*$//') == "systemctl reboot" ]] ||
        fail "emergency-switch guide: the block does not end with 'systemctl reboot': $block"
    while IFS= read -r line; do
        command=$(sed 's/ *#.*$//' <<<"$line")
        [[ -n $command && $command != "systemctl reboot" ]] || continue
        command=${command//2f0c…/$uuid}
        rc=0
        out=$(bash -o pipefail -c "$command" 2>&1) || rc=$?
        case $command in
        "sparse-volume attach "*)
            ((rc == 1)) && [[ $out == *sparse_volume.skip=* ]] ||
                fail "emergency-switch guide: '$command' exited $rc, expected 1 naming the switch: $out" ;;
        "cat /proc/cmdline")
            [[ $out == *sparse_volume* ]] || fail "emergency-switch guide: the switch is not on the command line: $out" ;;
        "dmesg | grep "*)
            ((rc == 0)) || fail "emergency-switch guide: '$command' found no line" ;;
        *)
            ((rc <= 1)) || fail "emergency-switch guide: '$command' exited $rc: $out" ;;
        esac
        ran=$((ran + 1))
    done <<<"$block"
    ((ran >= 6)) || fail "emergency-switch guide: only $ran commands ran: $block"
    log "emergency-switch guide: its $ran commands ran as written for the skipped volume $uuid"
}

verify_units() {
    local out
    out=$(systemd-analyze verify --no-pager "sparse-volume@$EXT4.service" "sparse-volume@$BLOCK.service" \
        sparse-volumes.target sparse-volume-metrics.service sparse-volume-metrics.timer 2>&1 |
        grep -i 'sparse-volume' || true)
    [[ -z $out ]] || fail "systemd-analyze verify ($(systemctl --version | head -n 1)) warns about our units: $out"
    log "systemd-analyze verify ($(systemctl --version | head -n 1 | cut -d' ' -f1,2)): no warning about the units, instances and drop-ins"
}

verify() {
    local boot=$1
    # shellcheck disable=SC1090
    . "$STATE"
    if [[ $(expected_switch) == sparse_volume=off ]]; then
        verify_off "$boot"
        return
    fi
    systemctl is-system-running --wait >/dev/null || true

    local uuid file device skipped
    skipped=$(switch_skips)
    [[ $(</proc/cmdline) == *"$(expected_switch)"* ]] ||
        fail "harness: boot $boot should have \"$(expected_switch)\" on the kernel command line, has: $(</proc/cmdline)"
    if [[ -z $(expected_switch) ]] && grep -q 'sparse_volume' /proc/cmdline; then
        fail "harness: boot $boot should have no sparse_volume switch on the kernel command line, has: $(</proc/cmdline)"
    fi
    for uuid in "$EXT4" "$XFS" "$READONLY" ${CLONE:-} ${IMPORTED:-}; do
        [[ " $skipped " == *" $uuid "* ]] && continue
        device=$(only_loop_of "/var/lib/sparse-volume/$uuid")
        [[ $(readlink -f "/dev/disk/by-uuid/$uuid") == "$device" ]] ||
            fail "/dev/disk/by-uuid/$uuid does not point at $device"
    done
    device=$(only_loop_of "/srv/volumes/$OTHER")
    [[ $(readlink -f "/dev/disk/by-uuid/$OTHER") == "$device" ]] || fail "by-uuid link of the second-root volume"
    device=$(only_loop_of "/var/lib/sparse-volume/$BLOCK")
    [[ $(cat "/sys/block/${device#/dev/}/loop/partscan") == 1 ]] || fail "$device does not scan partitions"
    partition_scanned_once "$boot" "$device"
    [[ $(readlink -f "/dev/disk/by-partuuid/$BLOCK") == "${device}p1" ]] ||
        fail "/dev/disk/by-partuuid/$BLOCK does not point at ${device}p1"
    if [[ " $skipped " != *" $READONLY "* ]]; then
        device=$(only_loop_of "/var/lib/sparse-volume/$READONLY")
        [[ $(cat "/sys/block/${device#/dev/}/ro") == 1 ]] || fail "the read-only volume is writable"
    fi
    [[ -z $skipped ]] || verify_skipped "$boot" "$skipped"

    [[ -z $(losetup --noheadings -j "/var/lib/sparse-volume/$DISABLED") ]] || fail "the disabled volume was attached"
    systemctl is-active --quiet "sparse-volume@$DISABLED.service" && fail "the disabled volume's unit is active"

    findmnt /srv/consumer >/dev/null || fail "the fstab consumer (UUID=) is not mounted"
    findmnt /srv/block >/dev/null || fail "the fstab consumer (PARTUUID=) is not mounted"
    check_payload /srv/consumer consumer
    check_payload /srv/block block
    local size
    size=$(df --output=size -B1M /srv/consumer | tail -n 1)
    ((size > 100)) || fail "the grown file system is back to $size MiB"

    local failed
    failed=$(systemctl --failed --no-legend --plain)
    [[ -z $failed ]] || fail "failed units: $failed"
    systemctl is-active --quiet sparse-volumes.target || fail "sparse-volumes.target is not active"
    if journalctl -b 0 --no-pager | grep -i 'ordering cycle'; then
        fail "ordering cycle in this boot's journal"
    fi
    # The corrupt registry file is skipped and logged by the generator.
    # (grep -q on a pipe would SIGPIPE journalctl and fail under pipefail)
    local kernel_log
    kernel_log=$(journalctl -b 0 -k --no-pager)
    grep -q "sparse-volume-generator: .*$CORRUPT.toml:2: .*volume skipped" <<<"$kernel_log" ||
        fail "the generator did not log the corrupt registry file"
    if ((boot >= 1)); then
        # The previous shutdown: every detach ran, none failed (before boot
        # 1, that is the shutdown right after the upgrade from the last
        # release: volumes attached by its unit detached by ours). Only the
        # journal since the reboot was asked for (scenario.sh writes the
        # time to /root/reboot-at): a phase may provoke refusals on purpose.
        local stops shutdown_log active failed since
        since=$(cat /root/reboot-at 2>/dev/null || echo 0)
        shutdown_log=$(journalctl -b -1 --no-pager -o cat --since "@$since")
        # Every unit active when the reboot was asked for (scenario.sh
        # counts them) stopped with a detach that succeeded.
        active=$(cat /root/active-at-reboot 2>/dev/null || echo 0)
        stops=$(grep -cE '^detached |^[0-9a-f-]{36} is not attached$' <<<"$shutdown_log" || true)
        failed=$(journalctl -b -1 --no-pager -o cat --since "@$since" -u 'sparse-volume@*' |
            grep -E 'Failed with result|Control process exited|code=dumped|code=killed' || true)
        # Boot 3 follows a removal, a purge and a fresh install with the
        # volumes attached and mounted (issue 24, item 11): its shutdown too.
        [[ -z $failed ]] || fail "previous shutdown: volume units failed to stop: $failed"
        ((stops == active)) || fail "previous shutdown: $stops of the $active active volume units detached"
        if grep -E '^sparse-volume: detaching' <<<"$shutdown_log"; then
            fail "previous shutdown had detach errors (above): a volume detached before its consumer unmounted?"
        fi
    fi
    verify_4k
    verify_taken_over "after boot $boot"
    verify_loop_ref "$boot"
    ((boot != 1)) || verify_units
    ((boot != 1)) || verify_lean_units
    consumers_active "after boot $boot"
    case $boot in
    2)
        # Booted with "frobnicate = 1" in a volume file (ignored) and a
        # config.toml that does not parse: volumes still attach (checked
        # above) and the generator says why it ignored each.
        grep -E "sparse-volume-generator: .*frobnicate" <<<"$kernel_log" ||
            fail "boot 2: no generator line in the kernel log naming the unknown key frobnicate of $OTHER.toml; generator lines: $(grep sparse-volume-generator <<<"$kernel_log" || echo none)"
        grep -E "sparse-volume-generator: .*config\.toml" <<<"$kernel_log" ||
            fail "boot 2: no generator line in the kernel log about the config.toml that does not parse (expected it to say so and use the built-in defaults); generator lines: $(grep sparse-volume-generator <<<"$kernel_log" || echo none)"
        ;;
    3)
        # Booted with "overcommit = 2.0" added to the fresh install's
        # config.toml: ignored, reported by the generator with the key meant.
        grep -E "sparse-volume-generator: .*overcommit[^_].*overcommit_ratio" <<<"$kernel_log" ||
            fail "boot 3: no generator line in the kernel log naming the unknown key overcommit and suggesting overcommit_ratio; generator lines: $(grep sparse-volume-generator <<<"$kernel_log" || echo none)"
        ;;
    esac
    check_findings "$boot"
    [[ -n $skipped ]] || pv_paths_exist "$boot"
    log "boot $boot: every enabled volume attached once, links right, consumers mounted, checksums intact"
    echo "--- systemd-analyze blame (volume units)"
    systemd-analyze blame --no-pager | grep -E 'sparse-volume|srv-' || true
    echo "--- systemd-analyze critical-chain local-fs.target"
    systemd-analyze critical-chain --no-pager local-fs.target || true
}

systemd_commands() {
    # shellcheck disable=SC1090
    . "$STATE"
    local file=/var/lib/sparse-volume/$XFS out
    out=$($CLI disable "$XFS" --now --json)
    [[ $(json_field changed <<<"$out") == true ]] || fail "disable --now: $out"
    [[ -z $(losetup --noheadings -j "$file") ]] || fail "disable --now left the volume attached"
    out=$($CLI disable "$XFS" --now --json)
    [[ $(json_field changed <<<"$out") == false ]] || fail "a repeated disable changed something: $out"
    out=$($CLI enable "$XFS" --now --json)
    [[ $(json_field job_result <<<"$out") == "done" ]] || fail "enable --now: $out"
    only_loop_of "$file" >/dev/null
    [[ $(systemctl is-active "sparse-volume@$XFS.service") == active ]] || fail "unit not active after enable --now"
    $CLI stop "$XFS"
    [[ -z $(losetup --noheadings -j "$file") ]] || fail "stop left the volume attached"
    $CLI start "$XFS"
    only_loop_of "$file" >/dev/null
    out=$($CLI start "$XFS" --json)
    [[ $(json_field changed <<<"$out") == false ]] || fail "a repeated start changed something: $out"
    # disable without --now leaves the volume attached under its mounted
    # consumer, and the reload keeps its drop-in: its blockdev@ target stays.
    $CLI disable "$EXT4" >/dev/null
    blockdev_targets_active "after disable without --now"
    $CLI enable "$EXT4" >/dev/null
    # A volume whose content does not match fails its unit, with the reason.
    local bad
    bad=$(new_uuid)
    $CLI create --uuid "$bad" --size 32M
    mkfs.ext4 -q -F -U "$(new_uuid)" "/var/lib/sparse-volume/$bad"
    if out=$($CLI start "$bad" 2>&1); then fail "a volume with foreign content started: $out"; fi
    grep -q 'failed' <<<"$out" || fail "the failed start did not say so: $out"
    # remove --delete-data refuses a file that is not the volume's own.
    if out=$($CLI remove "$bad" --delete-data 2>&1); then fail "remove --delete-data deleted foreign content: $out"; fi
    grep -q 'not deleting' <<<"$out" || fail "the refusal did not say why: $out"
    [[ -f /var/lib/sparse-volume/$bad ]] || fail "the refused remove deleted the file"
    $CLI remove "$bad"
    rm -f "/var/lib/sparse-volume/$bad"
    log "enable/disable/start/stop against systemd $(systemctl --version | head -n 1 | cut -d' ' -f2): ok"
}

# What only the stub systemd had shown (issue 10): enable without --now
# and its "reloaded", a repeated stop, the unit states list and status
# report, remove of an active volume, and a failed start's error text.
unit_states() {
    # shellcheck disable=SC1090
    . "$STATE"
    local out err rc file

    # enable without --now: the flag and a daemon-reload (systemd then
    # sees the generator's wants link), but no start.
    file=$(file_of "$DISABLED")
    run_rc out err $CLI enable "$DISABLED" --json
    ((rc == 0)) || fail "enable $DISABLED --json exited $rc: $out $err"
    [[ $(json_field changed <<<"$out") == true && $(json_field reloaded <<<"$out") == true &&
        $(json_field enabled <<<"$out") == true && $(json_field job_result <<<"$out") == null ]] ||
        fail "enable (no --now) of the disabled volume: expected changed, reloaded and enabled true, job_result null: $out"
    grep -qw "sparse-volume@$DISABLED.service" <<<"$(systemctl show -P Wants sparse-volumes.target)" ||
        fail "enable said \"reloaded\":true, but systemd's sparse-volumes.target does not want sparse-volume@$DISABLED.service: $(systemctl show -P Wants sparse-volumes.target)"
    [[ -z $(losetup --noheadings -j "$file") ]] || fail "enable without --now attached $DISABLED"
    [[ $(systemctl is-active "sparse-volume@$DISABLED.service") == inactive ]] ||
        fail "enable without --now: sparse-volume@$DISABLED.service is $(systemctl is-active "sparse-volume@$DISABLED.service"), expected inactive"
    run_rc out err $CLI enable "$DISABLED" --json
    [[ $rc == 0 && $(json_field changed <<<"$out") == false && $(json_field reloaded <<<"$out") == false ]] ||
        fail "a repeated enable: expected exit 0, changed and reloaded false; exit $rc: $out $err"
    run_rc out err $CLI disable "$DISABLED" --json
    [[ $rc == 0 && $(json_field changed <<<"$out") == true && $(json_field reloaded <<<"$out") == true ]] ||
        fail "disable (no --now): expected exit 0, changed and reloaded true; exit $rc: $out $err"
    ! grep -qw "sparse-volume@$DISABLED.service" <<<"$(systemctl show -P Wants sparse-volumes.target)" ||
        fail "after disable, sparse-volumes.target still wants sparse-volume@$DISABLED.service"
    log "enable/disable without --now: reloaded, systemd's wants follow the flag, nothing started"

    # A repeated stop: the second changes nothing and still succeeds.
    file=$(file_of "$XFS")
    run_rc out err $CLI stop "$XFS" --json
    [[ $rc == 0 && $(json_field changed <<<"$out") == true ]] || fail "stop $XFS: expected exit 0, changed true; exit $rc: $out $err"
    [[ -z $(losetup --noheadings -j "$file") ]] || fail "stop left $XFS attached"
    run_rc out err $CLI stop "$XFS" --json
    [[ $rc == 0 && $(json_field changed <<<"$out") == false ]] ||
        fail "a repeated stop of $XFS: expected exit 0, changed false; exit $rc: $out $err"

    # A failed start (foreign content): one line on stderr naming the
    # volume and carrying attach's own reason (the run's error line in the
    # journal); the unit's last journal lines only with -v.
    local bad one
    bad=$(new_uuid)
    $CLI create --uuid "$bad" --size 32M >/dev/null
    mkfs.ext4 -q -F -U "$(new_uuid)" "$(file_of "$bad")"
    run_rc out err $CLI start "$bad"
    ((rc == 1)) || fail "start of a volume with foreign content exited $rc, expected 1: $out $err"
    [[ -z $out && $(grep -c . <<<"$err") == 1 && $err == "sparse-volume: starting $bad: "*failed* ]] ||
        fail "the failed start of $bad: expected nothing on stdout and one line on stderr (\"sparse-volume: starting $bad: ...failed...\"), got stdout: $out; stderr: $err"
    [[ $err == *"holds an ext4 file system with UUID"* ]] ||
        fail "the failed start of $bad: its one line does not carry attach's reason (\"holds an ext4 file system with UUID ...\"): $err"
    log "failed start, stderr: $err"
    run_rc out err $CLI start "$bad" --json
    [[ $rc == 1 && $(grep -c . <<<"$out") == 1 && $(json_field uuid <<<"$out") == "$bad" &&
        $(json_field changed <<<"$out") == false && $out == *'"error":"'* && $(grep -c . <<<"$err") == 1 ]] ||
        fail "the failed start --json of $bad: expected exit 1, one JSON line with uuid, changed false and error, one line on stderr; exit $rc, stdout: $out; stderr: $err"
    run_rc out err $CLI -v start "$bad"
    one=$(grep -c . <<<"$err" || true)
    [[ $rc == 1 && $err == *"holds an ext4 file system with UUID"* ]] ||
        fail "the failed start -v of $bad: expected the attach's reason from the journal (\"holds an ext4 file system with UUID ...\") on stderr; exit $rc, stderr: $err"
    log "failed start with -v: $one lines on stderr, with the journal's reason"

    # The states list and status report, for an active, a stopped, a
    # disabled and a failed volume.
    local list
    run_rc list err $CLI list --json
    ((rc == 1)) || fail "list --json exited $rc, expected 1 (the corrupt registry file): $list $err"
    expect_states "$EXT4" "active volume" active exited success linked "$list"
    expect_states "$XFS" "stopped volume" inactive dead success missing "$list"
    expect_states "$DISABLED" "disabled volume" inactive dead success missing "$list"
    expect_states "$bad" "volume whose start failed" failed failed exit-code missing "$list"
    log "list --json and status --json: active, stopped, disabled and failed volumes as systemd and the device say"

    $CLI remove "$bad" >/dev/null || fail "remove of the failed volume $bad failed"
    rm -f "/var/lib/sparse-volume/$bad"
    systemctl reset-failed "sparse-volume@$bad.service" 2>/dev/null || true
    $CLI start "$XFS" >/dev/null || fail "start $XFS failed"

    # remove of an active volume: its unit is stopped through systemd
    # (the unit's ExecStop detaches), then it is unregistered.
    local victim since
    victim=$(new_uuid)
    $CLI create --uuid "$victim" --size 32M --now >/dev/null
    file=$(file_of "$victim")
    [[ $(systemctl is-active "sparse-volume@$victim.service") == active ]] ||
        fail "create --now: sparse-volume@$victim.service is $(systemctl is-active "sparse-volume@$victim.service"), expected active"
    since=$(date +%s)
    sleep 1
    run_rc out err $CLI remove "$victim" --json
    [[ $rc == 0 && $(json_field changed <<<"$out") == true ]] || fail "remove of the active volume $victim: exit $rc: $out $err"
    [[ -z $(losetup --noheadings -j "$file") ]] || fail "remove of the active volume $victim left it attached"
    [[ ! -e $VOLUMES_D/$victim.toml ]] || fail "remove of the active volume $victim left its registry file"
    [[ $(systemctl is-active "sparse-volume@$victim.service") == inactive ]] ||
        fail "after remove, sparse-volume@$victim.service is $(systemctl is-active "sparse-volume@$victim.service"), expected inactive"
    local unit_log
    unit_log=$(journalctl -u "sparse-volume@$victim.service" --since "@$since" --no-pager -o cat || true)
    grep -q '^detached ' <<<"$unit_log" ||
        fail "remove of the active volume $victim: its unit's ExecStop did not detach (not stopped through systemd?); unit journal: $unit_log"
    rm -f "$file"
    log "remove of an active volume: stopped through its unit ($(grep '^detached ' <<<"$unit_log" | head -n 1)), then unregistered"
}

# expect_states UUID WHAT ACTIVE SUB RESULT LINK LIST_JSON: the volume's
# unit and link states in `list --json` (LIST_JSON) and `status --json`.
expect_states() {
    local uuid=$1 what=$2 active=$3 sub=$4 result=$5 link=$6 list=$7 row status rc=0 field got expected
    row=$(sed 's/{"uuid":/\n{"uuid":/g' <<<"$list" | grep "^{\"uuid\":\"$uuid\"") ||
        fail "list --json has no row for the $what $uuid: $list"
    status=$($CLI status "$uuid" --json) || rc=$?
    for field in active_state sub_state unit_result link_state; do
        case $field in
        active_state) expected=$active ;;
        sub_state) expected=$sub ;;
        unit_result) expected=$result ;;
        link_state) expected=$link ;;
        esac
        got=$(json_field "$field" <<<"$row")
        [[ $got == "$expected" ]] || fail "list --json, $what $uuid: $field is \"$got\", expected \"$expected\": $row"
        got=$(json_field "$field" <<<"$status")
        [[ $got == "$expected" ]] || fail "status --json (exit $rc), $what $uuid: $field is \"$got\", expected \"$expected\": $status"
    done
}

# Item 8 of issue 9: stopping or disabling one volume never stops units
# that only depend on sparse-volumes.target, with Wants= or Requires=.
consumers() {
    # shellcheck disable=SC1090
    . "$STATE"
    consumers_active "before the test"
    local file
    file=$(file_of "$XFS")
    $CLI stop "$XFS" || fail "sparse-volume stop $XFS (an unused volume) failed"
    [[ -z $(losetup --noheadings -j "$file") ]] || fail "stop left $XFS attached"
    consumers_active "after \`sparse-volume stop $XFS\`"
    others_attached "$XFS" "after \`sparse-volume stop $XFS\`"
    $CLI start "$XFS" || fail "sparse-volume start $XFS failed"
    restore_units

    $CLI disable --now "$XFS" || fail "sparse-volume disable --now $XFS (an unused volume) failed"
    [[ -z $(losetup --noheadings -j "$file") ]] || fail "disable --now left $XFS attached"
    consumers_active "after \`sparse-volume disable --now $XFS\`"
    others_attached "$XFS" "after \`sparse-volume disable --now $XFS\`"
    $CLI enable --now "$XFS" || fail "sparse-volume enable --now $XFS failed"
    only_loop_of "$file" >/dev/null
    restore_units
    log "stop and disable --now of one volume left both consumers of sparse-volumes.target and the other volumes up"
}

# Items 7 and 13 of issue 9: what start, check --repair, stop and
# disable --now report is true of the device, not only of the unit.
device_truth() {
    # shellcheck disable=SC1090
    . "$STATE"
    local file device out err rc
    file=$(file_of "$XFS")
    systemctl is-active --quiet "sparse-volume@$XFS.service" || fail "sparse-volume@$XFS.service is not active before the test"
    # The corrupt registry file is an error that check cannot repair (exit
    # 1 by contract): out of the way for the exit status to mean something.
    mv "$VOLUMES_D/$CORRUPT.toml" /root/corrupt.toml

    # A device detached by hand under an active unit: check --repair must
    # bring it back through the unit (a new invocation, active), not call
    # the unit's "active" a repair.
    local invocation
    invocation=$(systemctl show -P InvocationID "sparse-volume@$XFS.service")
    $CLI detach "$XFS" >/dev/null
    [[ -z $(losetup --noheadings -j "$file") ]] || fail "detach by hand left $XFS attached"
    run_rc out err $CLI check --repair --json
    ((rc == 0)) || fail "check --repair --json after a detach by hand exited $rc, expected 0: $out $err"
    [[ -n $(losetup --noheadings -j "$file") ]] ||
        fail "after detach by hand and \`check --repair\` (exit $rc), $XFS has no loop device (expected: attached again); check said: $out"
    [[ $(systemctl is-active "sparse-volume@$XFS.service") == active ]] ||
        fail "after detach by hand and \`check --repair\`, sparse-volume@$XFS.service is $(systemctl is-active "sparse-volume@$XFS.service"), expected active"
    [[ $(systemctl show -P InvocationID "sparse-volume@$XFS.service") != "$invocation" ]] ||
        fail "after detach by hand and \`check --repair\`, sparse-volume@$XFS.service has the same invocation ($invocation): the repair did not go through the unit"
    [[ -n $(losetup --noheadings -j "$file") ]] || systemctl restart "sparse-volume@$XFS.service"

    # The same with start: it must say it changed something, and do it.
    $CLI detach "$XFS" >/dev/null
    run_rc out err $CLI start "$XFS" --json
    ((rc == 0)) || fail "start --json after a detach by hand exited $rc, expected 0: $out $err"
    [[ $(json_field changed <<<"$out") == true ]] ||
        fail "start --json after a detach by hand (unit still active) said \"changed\":$(json_field changed <<<"$out"), expected true: $out"
    [[ -n $(losetup --noheadings -j "$file") ]] ||
        fail "after detach by hand and \`start\`, $XFS has no loop device (expected: attached again); start said: $out"
    mv /root/corrupt.toml "$VOLUMES_D/$CORRUPT.toml"
    restore_units

    # Stop and disable --now of a mounted volume: refused, exit 1, with the
    # reason on stderr; the device stays; a repeated stop changes nothing.
    file=$(file_of "$EXT4")
    device=$(only_loop_of "$file")
    findmnt /srv/consumer >/dev/null || fail "/srv/consumer is not mounted before the test"
    run_rc out err $CLI stop "$EXT4"
    ((rc == 1)) || fail "stop of the mounted volume $EXT4 exited $rc, expected 1; stdout: $out; stderr: $err"
    [[ $err == *"unmount it first"* || $err == *"mounted on"* ]] ||
        fail "stop of the mounted volume $EXT4: stderr does not say \"mounted on ...; unmount it first\": $err"
    [[ $(losetup --noheadings -O NAME -j "$file") == "$device" ]] ||
        fail "stop of the mounted volume $EXT4: $device is gone or changed ($(losetup --noheadings -O NAME -j "$file")), expected it to stay"
    run_rc out err $CLI stop "$EXT4" --json
    ((rc == 1)) || fail "a second stop --json of the mounted volume $EXT4 exited $rc, expected 1: $out"
    [[ $out != *'"changed":true'* ]] || fail "a second stop --json of the mounted volume $EXT4 says \"changed\":true while $device is still attached: $out"
    run_rc out err $CLI disable --now "$EXT4"
    ((rc == 1)) || fail "disable --now of the mounted volume $EXT4 exited $rc, expected 1; stdout: $out; stderr: $err"
    [[ $(losetup --noheadings -O NAME -j "$file") == "$device" ]] ||
        fail "disable --now of the mounted volume $EXT4: $device is gone or changed, expected it to stay"
    grep -q '^enabled = true$' "$VOLUMES_D/$EXT4.toml" ||
        fail "the refused disable --now of the mounted volume $EXT4 still cleared its enabled flag"
    findmnt /srv/consumer >/dev/null || fail "/srv/consumer was unmounted"
    check_payload /srv/consumer consumer
    restore_units

    # A start that fails after binding (udev makes no link for this one
    # device, and attach waits 3 s for it) keeps no device once stopped.
    local bad rule=/etc/udev/rules.d/59-sv-test-nolink.rules
    bad=$(new_uuid)
    $CLI create --uuid "$bad" --size 32M >/dev/null
    file=$(file_of "$bad")
    echo "SUBSYSTEM==\"block\", KERNEL==\"loop*\", ATTR{loop/backing_file}==\"$file\", ENV{UDEV_DISABLE_PERSISTENT_STORAGE_RULES_FLAG}=\"1\"" >"$rule"
    udevadm control --reload
    echo "udev_timeout_sec = 3" >>"$CONFIG"
    if $CLI start "$bad" >/dev/null 2>&1; then fail "start of $bad succeeded although udev made no link for it"; fi
    log "after the failed start: $(losetup --noheadings -O NAME -j "$file" | tr '\n' ' ')bound to $file"
    $CLI stop "$bad" >/dev/null 2>&1 || true
    [[ -z $(losetup --noheadings -j "$file") ]] ||
        fail "after a start that failed after binding and \`sparse-volume stop\`, $(losetup --noheadings -O NAME -j "$file") is still bound to $file (expected: no device)"
    rm -f "$rule"
    udevadm control --reload
    cp /root/config.toml.good "$CONFIG"
    $CLI detach "$bad" >/dev/null 2>&1 || true
    systemctl reset-failed "sparse-volume@$bad.service" 2>/dev/null || true
    $CLI remove "$bad" --delete-data >/dev/null
    restore_units
    log "check --repair and start reattach a device detached by hand; stop/disable --now of a mounted volume refuse and keep it; a failed start keeps no device"
}

# Item 11 of issue 9: what the next boot starts from.
prepare_boot() {
    local boot=$1
    # shellcheck disable=SC1090
    . "$STATE"
    case $boot in
    2)
        # Two things one boot can carry without hiding each other: the
        # unknown key acts on one volume file, the config.toml only on
        # where files may go.
        echo "storage_roots = [" >"$CONFIG"
        echo "frobnicate = 1" >>"$VOLUMES_D/$OTHER.toml"
        rm -f "$BOOT_SWITCH"
        log "boot 2 starts with a config.toml that does not parse and an unknown key in $OTHER.toml (frobnicate), no switch on the kernel command line"
        ;;
    3)
        # After the package phase's fresh install: its default config.toml
        # plus a key that is not one (config.toml only limits where files
        # go, so the volumes of every storage root must still come back),
        # and two volumes skipped on the kernel command line: enabled ones
        # that no fstab consumer waits for, and that the skip keeps
        # detached for this whole boot, so no phase may follow that needs
        # them. The others must come up as usual.
        echo "overcommit = 2.0" >>"$CONFIG"
        echo "sparse_volume.skip=$READONLY,$XFS" >"$BOOT_SWITCH"
        if [[ -n ${ENC_DB:-} ]]; then
            mv "/etc/sparse-volume/keys/$ENC_DB.key" /root/lost.key
            # Its consumer gives up on the device after 10 s, not 90.
            sed -i "\# /srv/enc-db #s/device-timeout=90s/device-timeout=10s/" /etc/fstab
            log "boot 3: the key file of the encrypted volume $ENC_DB is gone"
        fi
        log "boot 3 starts with the fresh install's config.toml plus an unknown key (overcommit), and $(expected_switch) on the kernel command line"
        ;;
    4)
        # With every volume off, the fstab consumers must not hold the boot
        # (a mount that needs its device would, for 90 s, then go to
        # emergency mode): an operator using the switch mounts with nofail.
        sed -i -e "s|^\(UUID=$EXT4 /srv/consumer ext4 defaults\)|\1,nofail,x-systemd.device-timeout=5s|" \
            -e "s|^\(PARTUUID=$BLOCK /srv/block ext4 defaults\)|\1,nofail,x-systemd.device-timeout=5s|" \
            -e "/^UUID=$E4K /s/device-timeout=90s/device-timeout=5s/" \
            -e "/^UUID=$X4K /s/device-timeout=90s/device-timeout=5s/" \
            -e "\# /srv/mk-#s/device-timeout=90s/device-timeout=5s/" \
            -e "\# /srv/enc-#s/device-timeout=[0-9]*s/device-timeout=5s/" /etc/fstab
        local consumers=$((4 + $(grep -c ' /srv/mk-\| /srv/enc-' /etc/fstab || true)))
        [[ $(grep -c 'nofail,x-systemd.device-timeout=5s' /etc/fstab) == "$consumers" ]] ||
            fail "prepare-boot 4: the $consumers fstab consumers of volumes were not made nofail with a 5 s device timeout: $(cat /etc/fstab)"
        # Without the generator's masks in this boot, the old unit enabled
        # again after the take-over would attach the xfs volume (the guide
        # says so): the take-over's disable is what holds then.
        rm -f /etc/systemd/system/multi-user.target.wants/metalk8s-sparse-volume@*.service
        # Boot 3's unknown key has been seen; check must find nothing else.
        sed -i '/^overcommit = 2.0$/d' "$CONFIG"
        echo "sparse_volume=off" >"$BOOT_SWITCH"
        log "boot 4 starts with sparse_volume=off on the kernel command line"
        ;;
    5)
        # The negative control (scenario.sh, SV_VM_NEGATIVE_CONTROL=1): the
        # generator removed, and the two fstab consumers required (again,
        # after boot 4; SV_VM_SCOPE=distro has no boot 4), giving up on
        # their devices after 15 s instead of systemd's 90. The devices
        # never come, so this boot must go to emergency mode.
        log "breaking the product on purpose: removing the generator"
        rm -f /usr/lib/systemd/system-generators/sparse-volume-generator
        sed -i -E -e "s#^(UUID=$EXT4 /srv/consumer ext4 defaults)(,nofail,x-systemd.device-timeout=5s)? #\1,x-systemd.device-timeout=15s #" \
            -e "s#^(PARTUUID=$BLOCK /srv/block ext4 defaults)(,nofail,x-systemd.device-timeout=5s)? #\1,x-systemd.device-timeout=15s #" /etc/fstab
        [[ $(grep -c 'defaults,x-systemd.device-timeout=15s' /etc/fstab) == 2 ]] ||
            fail "prepare-boot 5: the two fstab consumers were not made required with a 15 s device timeout: $(cat /etc/fstab)"
        rm -f "$BOOT_SWITCH"
        ;;
    *) fail "prepare-boot: no boot $boot" ;;
    esac
}

restore_config() {
    # shellcheck disable=SC1090
    . "$STATE"
    cp /root/config.toml.good "$CONFIG"
    sed -i '/^frobnicate = 1$/d' "$VOLUMES_D/$OTHER.toml"
    systemctl daemon-reload
}

detach_by_link() {
    # A block volume attached behind our back (no lo_file_name reference),
    # with its registry entry gone and its file renamed: only the udev link
    # to the partition is left to find it by.
    local uuid file device out
    uuid=$(new_uuid)
    $CLI create --uuid "$uuid" --size 32M --mode block
    file=/var/lib/sparse-volume/$uuid
    rm "/etc/sparse-volume/volumes.d/$uuid.toml"
    device=$(losetup --find --show --partscan "$file")
    udevadm wait --timeout=30 "/dev/disk/by-partuuid/$uuid"
    mv "$file" "$file.moved"
    out=$($CLI detach "$uuid" --json)
    [[ $(json_field found_by <<<"$out") == udev-link ]] || fail "detach did not use the udev link: $out"
    [[ $out == *"\"$device\""* ]] || fail "detach did not resolve ${device}p1 to $device: $out"
    [[ -z $(losetup --noheadings -j "$file.moved") ]] || fail "$device is still attached"
    rm -f "$file.moved"
    log "detach resolved ${device}p1 to its parent $device through /dev/disk/by-partuuid"
}

# Every active volume unit's blockdev@ target is active: the target that
# makes the consumers unmount before the volume detaches at shutdown.
blockdev_targets_active() {
    local unit uuid link target i
    # postinst queues the starts without waiting for them: first let
    # systemd finish what it has queued (a reload's stops of unneeded
    # targets among them).
    for ((i = 0; i < 100; i++)); do
        [[ -n $(systemctl list-jobs --no-legend) ]] || break
        sleep 0.2
    done
    for unit in $(systemctl list-units --no-legend --plain --state=active 'sparse-volume@*.service' | awk '{ print $1 }'); do
        uuid=${unit#sparse-volume@}
        uuid=${uuid%.service}
        link=/dev/disk/by-uuid/$uuid
        if grep -q '^mode = "block"' "$VOLUMES_D/$uuid.toml"; then
            link=/dev/disk/by-partuuid/$uuid
            # An encrypted block volume's consumers use its opened device.
            grep -q '^luks_uuid = ' "$VOLUMES_D/$uuid.toml" && link=/dev/mapper/sparse-volume-$uuid
        fi
        target=blockdev@$(systemd-escape --path "$link").target
        # postinst queues the starts without waiting for them.
        for ((i = 0; i < 50; i++)); do
            systemctl is-active --quiet "$target" && break
            sleep 0.2
        done
        systemctl is-active --quiet "$target" ||
            fail "$1: $target is $(systemctl is-active "$target" || true) under the active $unit: its consumers would not unmount before it detaches at shutdown (the unit wants: $(systemctl show -p Wants --value "$unit"); jobs: $(systemctl list-jobs --no-legend | tr '\n' ';'); the target's journal: $(journalctl -b --no-pager -o cat -n 5 -u "$target" | tr '\n' ';'))"
    done
}

package() {
    # shellcheck disable=SC1090
    . "$STATE"
    local before after
    local page
    page=$(MANWIDTH=80 man sparse-volume 2>&1)
    grep -q '^SYNOPSIS' <<<"$page" || fail "man sparse-volume does not render: $page"
    before=$(losetup --noheadings -O NAME,BACK-FILE | sort)
    dpkg -i /root/upgrade.deb >/dev/null
    [[ $(dpkg-query -W -f '${Version}' sparse-volume) == *upgrade1 ]] || fail "the upgrade was not installed"
    after=$(losetup --noheadings -O NAME,BACK-FILE | sort)
    [[ $before == "$after" ]] || fail "upgrading the package changed the loop devices"
    findmnt /srv/consumer >/dev/null || fail "upgrading the package unmounted a consumer"
    [[ -z $(systemctl --failed --no-legend --plain) ]] || fail "units failed during the upgrade"
    local warned
    # apt-get runs dpkg on a terminal of its own: the maintainer scripts'
    # stderr comes out on apt-get's stdout.
    warned=$(apt-get remove -y sparse-volume 2>&1) || fail "apt-get remove failed: $warned"
    [[ -f /etc/sparse-volume/volumes.d/$EXT4.toml && -f /var/lib/sparse-volume/$EXT4 ]] ||
        fail "apt-get remove deleted the registry or the data"
    # Issue 25, item 23: the volumes nothing will attach at the next boot.
    [[ $warned == *"nothing attaches these enabled volumes"*"$EXT4"* ]] ||
        fail "apt-get remove did not name the enabled volume $EXT4: $warned"
    check_payload /srv/consumer consumer
    log "upgrade kept every volume attached; remove kept registry and data and named the enabled volumes"

    # Purge (item 12 of issue 9): keeps data and registry, says so itself,
    # once, and gives dpkg nothing to warn about.
    local out kept
    out=$(apt-get purge -y sparse-volume 2>&1) || fail "apt-get purge failed: $out"
    if grep -E "directory '(/etc/sparse-volume|/var/lib/sparse-volume)[^']*' not empty" <<<"$out"; then
        fail "apt-get purge printed dpkg's 'not empty' warnings (above); expected only the package's own note of what it kept"
    fi
    kept=$(grep -c '^sparse-volume: kept' <<<"$out" || true)
    ((kept == 1)) || fail "apt-get purge printed $kept lines saying what it kept, expected 1: $out"
    [[ -f $VOLUMES_D/$EXT4.toml && -f $(file_of "$OTHER") && -f $(file_of "$E4K") ]] ||
        fail "apt-get purge deleted the registry or the data"
    [[ ! -e $CONFIG ]] || fail "apt-get purge left $CONFIG"
    # A fresh install brings the default config.toml: only the default
    # storage root. The next boot must still bring back the volumes of the
    # other storage roots (they are registered; config.toml only limits
    # where create and register put files).
    local deb=(/root/sparse-volume_*_amd64.deb)
    dpkg -i "${deb[0]}" >/dev/null
    # While the package was gone the units had no drop-ins, so the
    # blockdev@ targets they pull in (StopWhenUnneeded=yes), which order the
    # consumers' unmounts before the detach, stopped; the install starts
    # them again (postinst). Boot 3's checks of this shutdown follow.
    blockdev_targets_active "after remove, purge and install"
    ! grep -q '^storage_roots' "$CONFIG" || fail "the fresh install's config.toml sets storage_roots: $(grep '^storage_roots' "$CONFIG")"
    log "purge kept registry and data and said so once, without dpkg warnings; fresh install has the default config.toml"
}

# The value of one sample of the metrics textfile (labels written exactly).
metric() { awk -v sample="$1" '$1 == sample { print $2 }' "$TEXTFILE"; }
TEXTFILE=/var/lib/prometheus/node-exporter/sparse_volume.prom

# Completed runs of the metrics service since the journal cursor time $1.
metrics_runs_since() {
    journalctl --no-pager -o cat -u sparse-volume-metrics.service --since "@$1" |
        grep -c '^Finished sparse-volume-metrics.service\|^Finished Sparse volume metrics' || true
}

# Waits until the metrics service has finished N more runs after time $1.
wait_metrics_runs() {
    local since=$1 want=$2 waited=0
    while (($(metrics_runs_since "$since") < want)); do
        ((waited++ < 120)) || fail "the metrics timer ran $(metrics_runs_since "$since") times in 60 s after @$since, expected $want (systemctl list-timers: $(systemctl list-timers --no-pager sparse-volume-metrics.timer))"
        sleep 0.5
    done
}

metrics() {
    # shellcheck disable=SC1090
    . "$STATE"
    local root='storage_root="/srv/volumes"' headroom filler=/srv/volumes/other-data start warnings
    mkdir -p "${TEXTFILE%/*}"
    # The shipped timer runs every minute; 2 s here so that several runs
    # fit in the test. Everything else is the package's units as shipped.
    # (An empty OnUnitActiveSec= resets every trigger of the timer.)
    mkdir -p /run/systemd/system/sparse-volume-metrics.timer.d
    printf '[Timer]\nOnUnitActiveSec=\nOnBootSec=1s\nOnUnitActiveSec=2s\nAccuracySec=100ms\n' \
        >/run/systemd/system/sparse-volume-metrics.timer.d/fast.conf
    cp "$CONFIG" /root/config.before-metrics
    # Below every storage root's headroom at the start (checked below), so
    # only the fill crosses it.
    echo 'warn_headroom = "200M"' >>"$CONFIG"
    systemctl daemon-reload
    systemctl is-enabled --quiet sparse-volume-metrics.timer &&
        fail "the package enabled the metrics timer (it must be off until the operator enables it)"
    start=$(date +%s)
    # The monitoring guide's commands, as written; its apt-get line
    # installs from Debian's archive, which this guest does not reach
    # (tests/doc_commands.rs checks on the host that the package exists).
    local guide
    guide=$(doc_block monitoring.md 1 | grep -v '^apt-get install ')
    grep -q '^systemctl enable --now sparse-volume-metrics.timer' <<<"$guide" ||
        fail "monitoring guide: no 'systemctl enable --now sparse-volume-metrics.timer' line: $guide"
    bash -euo pipefail -c "$guide" || fail "monitoring guide: its commands failed as written: $guide"
    wait_metrics_runs "$start" 1
    [[ -s $TEXTFILE ]] || fail "the metrics timer ran but $TEXTFILE is missing"
    [[ $(metric "sparse_volume_attached{uuid=\"$EXT4\",name=\"consumer\",mode=\"filesystem\"}") == 1 ]] ||
        fail "the textfile does not show $EXT4 attached: $(grep "$EXT4" "$TEXTFILE" || true)"
    [[ $(metric "sparse_volume_unit_active{uuid=\"$EXT4\",name=\"consumer\",mode=\"filesystem\"}") == 1 ]] ||
        fail "the textfile does not show the unit of $EXT4 active (systemd answers under the timer): $(grep "unit_active.*$EXT4\|systemd_up" "$TEXTFILE" || true)"
    local labels="{uuid=\"$EXT4\",name=\"consumer\",mode=\"filesystem\"}"
    [[ -n $(metric "sparse_volume_written_bytes_total$labels") ]] ||
        fail "the textfile has no I/O series for the attached $EXT4: $(grep "$EXT4" "$TEXTFILE" || true)"
    if findmnt --source "UUID=$EXT4" >/dev/null; then
        [[ $(metric "sparse_volume_fs_errors$labels") == 0 && $(metric "sparse_volume_fs_read_only$labels") == 0 &&
            $(metric "sparse_volume_fs_shut_down$labels") == 0 ]] ||
            fail "the mounted $EXT4 has no healthy file-system series: $(grep "fs_.*$EXT4" "$TEXTFILE" || true)"
    fi
    headroom=$(metric "sparse_volume_backing_fs_headroom_bytes{$root}")
    [[ -n $headroom ]] || fail "no headroom for /srv/volumes in $TEXTFILE: $(grep headroom "$TEXTFILE" || true)"
    local other
    for other in $(awk '/^sparse_volume_backing_fs_headroom_bytes/ { print $2 }' "$TEXTFILE"); do
        ((other > 200 * 1048576)) || fail "harness: a storage root starts with only $other bytes of headroom (needs > 200M): $(grep '^sparse_volume_backing_fs_headroom' "$TEXTFILE")"
    done
    [[ -z $(journalctl --no-pager -o cat -u sparse-volume-metrics.service --since "@$start" | grep 'short of space') ]] ||
        fail "a warning before any crossing"

    # Another process takes the space until 100 MiB of headroom remain.
    fallocate -l $((headroom - 100 * 1048576)) "$filler"
    start=$(date +%s)
    wait_metrics_runs "$start" 4
    warnings=$(journalctl --no-pager -o cat -p warning -u sparse-volume-metrics.service --since "@$((start - 1))" | grep 'short of space' || true)
    [[ $(grep -c . <<<"$warnings") -eq 1 ]] ||
        fail "expected one journal warning for the crossing over $(metrics_runs_since "$start") runs, got: ${warnings:-none}"
    [[ $warnings == *"storage root /srv/volumes is short of space"*"bytes) free"* ]] ||
        fail "the warning does not name the storage root and the numbers: $warnings"
    headroom=$(metric "sparse_volume_backing_fs_headroom_bytes{$root}")
    ((headroom < 200 * 1048576)) || fail "the textfile still shows $headroom bytes of headroom after the fill"
    local out err
    run_rc out err $CLI check --json
    grep -q '"kind":"low-headroom"[^}]*"/srv/volumes"' <<<"$out" ||
        fail "check does not report low-headroom for /srv/volumes: $out"
    log "metrics timer: $(metrics_runs_since "$start") runs after the crossing, one warning: $warnings"

    systemctl disable --now sparse-volume-metrics.timer
    rm -f "$filler" /run/systemd/system/sparse-volume-metrics.timer.d/fast.conf
    cp /root/config.before-metrics "$CONFIG"
    systemctl daemon-reload
}

# Encrypted volumes (issue 28): the encryption guide's volume (its key file
# made by create) and an xfs volume with a key file of known bytes, both
# mounted through fstab by UUID= (nofail), and a block volume read raw by a
# unit that waits for its opened device. Their
# UUIDs and recovery keys are kept in $ENCRYPTED_STATE.
ENCRYPTED_STATE=/root/encrypted.env
KNOWN_KEY=/root/known.key
# 64 bytes that `strings` finds wherever they land.
KNOWN_KEY_TEXT=SV-KNOWN-KEY-MATERIAL-0123456789-abcdefghijklmnopqrstuvwxyz-0064
encrypted_create() {
    local out db xfs blk db_recovery xfs_recovery blk_recovery
    printf '%s' "$KNOWN_KEY_TEXT" >"$KNOWN_KEY"
    chmod 0400 "$KNOWN_KEY"
    out=$(bash -o pipefail -c "$(doc_block encryption.md 1)") ||
        fail "encryption guide: its create command failed: $out"
    db=$(sed -n 's/^created filesystem volume \([0-9a-f-]\{36\}\) .*/\1/p' <<<"$out")
    db_recovery=$(sed -n 's/^recovery key: //p' <<<"$out")
    [[ -n $db && $db_recovery =~ ^([cbdefghijklnrtuv]{8}-){7}[cbdefghijklnrtuv]{8}$ ]] ||
        fail "encryption guide: create did not say the UUID and a recovery key: $out"
    # On the second storage root: the first has room for the README's
    # volume only without it.
    xfs=$(new_uuid)
    out=$($CLI create --uuid "$xfs" --path "/srv/volumes/$xfs" --size 320M --fs xfs --encrypt --key-file "$KNOWN_KEY" --now --json) ||
        fail "create --encrypt of the xfs volume failed: $out"
    xfs_recovery=$(json_field recovery_key <<<"$out")
    [[ -n $xfs && -n $xfs_recovery ]] || fail "create --encrypt --json: no uuid or recovery_key: $out"
    blk=$(new_uuid)
    # Its own key file (create's), which boot 3 takes away for the guide's
    # block-mode recovery.
    out=$($CLI create --uuid "$blk" --path "/srv/volumes/$blk" --size 64M --mode block --encrypt --now --json) ||
        fail "create --encrypt --mode block failed: $out"
    blk_recovery=$(json_field recovery_key <<<"$out")
    [[ -n $blk_recovery ]] || fail "create --encrypt --mode block --json: no recovery_key: $out"
    printf 'ENC_DB_RECOVERY=%s\nENC_XFS_RECOVERY=%s\nENC_BLK_RECOVERY=%s\n' "$db_recovery" "$xfs_recovery" "$blk_recovery" >"$ENCRYPTED_STATE"
    # Enabled volumes like the others: every later check of all of them
    # (pv, by-loop-ref links, the emergency switch) counts these too.
    printf 'ENC_DB=%s\nENC_XFS=%s\nENC_BLK=%s\n' "$db" "$xfs" "$blk" >>"$STATE"
    # shellcheck disable=SC1090
    . "$STATE"
    [[ $(stat -c '%u %a' "/etc/sparse-volume/keys/$db.key") == "0 400" ]] ||
        fail "the key file create made is $(stat -c 'uid %u mode %a' "/etc/sparse-volume/keys/$db.key"), expected root's, 0400"
    encrypted_links
    mkdir -p /srv/enc-db /srv/enc-xfs
    {
        echo "UUID=$db /srv/enc-db ext4 nofail,x-systemd.device-timeout=90s 0 2"
        echo "UUID=$xfs /srv/enc-xfs xfs nofail,x-systemd.device-timeout=90s 0 2"
    } >>/etc/fstab
    systemctl daemon-reload
    mount /srv/enc-db || fail "the encrypted ext4 volume does not mount by UUID="
    mount /srv/enc-xfs || fail "the encrypted xfs volume does not mount by UUID="
    write_payload /srv/enc-db enc-db
    write_payload /srv/enc-xfs enc-xfs
    # Grown while mounted: the loop device, the mapping, then the ext4.
    local before after
    before=$(df --output=size -B1M /srv/enc-db | tail -n 1 | tr -d ' ')
    out=$($CLI resize "$db" --size 384M 2>&1) || fail "resize of the mounted encrypted ext4 failed: $out"
    after=$(df --output=size -B1M /srv/enc-db | tail -n 1 | tr -d ' ')
    ((after > before + 100)) || fail "online resize of the encrypted ext4: df went from $before to $after MiB"
    check_payload /srv/enc-db enc-db
    local err rc
    run_rc out err $CLI detach "$db"
    ((rc != 0)) && [[ $err == *"is mounted on /srv/enc-db"* ]] ||
        fail "detach of the mounted encrypted volume: exit $rc, expected a refusal naming the mount: $out $err"
    findmnt /srv/enc-db >/dev/null || fail "the refused detach unmounted the consumer"
    # list exits 1 for the corrupt registry file setup left on purpose.
    out=$($CLI list --json || true)
    [[ $out == *"\"opened\":\"/dev/mapper/sparse-volume-$db\""* ]] ||
        fail "list --json does not show the opened device of $db: $out"
    encrypted_block_create
    no_key_material "after create"
    log "encrypted: $db (ext4, the guide's) and $xfs (xfs, key file of known bytes) created, opened, mounted by UUID=; the ext4 grown online ${before} -> ${after} MiB; detach refused while mounted"
}

# The encrypted block volume: its opened device (the documented path,
# /dev/mapper/sparse-volume-<UUID>) gets 4 MiB of random data raw, and a
# unit bound to that device reads them back at every boot. Without the
# package's udev rule systemd would keep the device "not ready" (dm-crypt
# with no file system on it) and the unit would never start.
ENC_BLK_PAYLOAD=/root/enc-blk.sha256
ENC_BLK_READ=/run/enc-blk.sha256
encrypted_block_create() {
    local mapper=/dev/mapper/sparse-volume-$ENC_BLK device_unit
    encrypted_block_device
    head -c 4M /dev/urandom >/root/enc-blk.payload
    dd if=/root/enc-blk.payload of="$mapper" bs=1M seek=1 oflag=direct conv=fsync status=none
    sha256sum </root/enc-blk.payload | cut -d' ' -f1 >"$ENC_BLK_PAYLOAD"
    rm /root/enc-blk.payload
    device_unit=$(systemd-escape --path --suffix=device "$mapper")
    cat >/etc/systemd/system/enc-blk-reader.service <<UNIT
[Unit]
Description=Reads the encrypted block volume raw
BindsTo=$device_unit
After=$device_unit sparse-volume@$ENC_BLK.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/sh -c 'dd if=$mapper bs=1M skip=1 count=4 iflag=direct status=none | sha256sum | cut -d" " -f1 >$ENC_BLK_READ'

[Install]
WantedBy=multi-user.target
UNIT
    systemctl daemon-reload
    systemctl enable --now enc-blk-reader.service ||
        fail "the reader of the encrypted block volume did not start: $(systemctl status --no-pager enc-blk-reader.service | tail -n 5)"
    encrypted_block_read "after create"
    local pv
    pv=$($CLI pv "$ENC_BLK" --json)
    [[ $pv == *"\"path\": \"$mapper\""* ]] || fail "pv of the encrypted block volume does not name $mapper: $pv"
}

# The opened device of the encrypted block volume sits on its loop device's
# partition, and systemd has its device unit (udev marked it ready).
encrypted_block_device() {
    local mapper=/dev/mapper/sparse-volume-$ENC_BLK device node
    device=$(only_loop_of "$(file_of "$ENC_BLK")")
    node=$(readlink -f "$mapper")
    [[ $node == /dev/dm-* && -e /sys/class/block/${device#/dev/}p1/holders/${node#/dev/} ]] ||
        fail "$ENC_BLK: $mapper is $node, expected a mapping on ${device}p1"
    [[ $(udevadm info --query=property --property=SYSTEMD_READY --value "$node") != 0 ]] ||
        fail "$ENC_BLK: udev marks $node SYSTEMD_READY=0: units waiting for it never start"
    systemctl is-active --quiet "$(systemd-escape --path --suffix=device "$mapper")" ||
        fail "$ENC_BLK: the device unit of $mapper is $(systemctl is-active "$(systemd-escape --path --suffix=device "$mapper")")"
}

encrypted_block_read() {
    local when=$1
    systemctl is-active --quiet enc-blk-reader.service ||
        fail "$when: enc-blk-reader.service (bound to the encrypted block volume's device) is $(systemctl is-active enc-blk-reader.service)"
    [[ $(cat "$ENC_BLK_READ" 2>/dev/null) == "$(cat "$ENC_BLK_PAYLOAD")" ]] ||
        fail "$when: the encrypted block volume's data read by its unit does not match what was written"
}

# Each encrypted volume: its file system's link points at its mapping,
# which sits on the volume's loop device, whose own link is the header's
# UUID (never the volume's).
encrypted_links() {
    local uuid luks device node
    for uuid in "$ENC_DB" "$ENC_XFS"; do
        luks=$(sed -n 's/^luks_uuid = "\(.*\)"$/\1/p' "$VOLUMES_D/$uuid.toml")
        [[ -n $luks && $luks != "$uuid" ]] || fail "$uuid: luks_uuid is \"$luks\", expected a UUID of its own"
        udevadm wait --timeout=30 "/dev/disk/by-uuid/$uuid" "/dev/disk/by-uuid/$luks" ||
            fail "$uuid: no by-uuid link for the volume or its header ($luks)"
        device=$(only_loop_of "$(file_of "$uuid")")
        node=$(readlink -f "/dev/disk/by-uuid/$uuid")
        [[ $node == /dev/dm-* && $(cat "/sys/class/block/${node#/dev/}/dm/name") == "sparse-volume-$uuid" ]] ||
            fail "$uuid: /dev/disk/by-uuid/$uuid points at $node, not at the mapping sparse-volume-$uuid"
        [[ -e /sys/class/block/${device#/dev/}/holders/${node#/dev/} ]] ||
            fail "$uuid: the mapping $node does not sit on the volume's device $device"
        [[ $(readlink -f "/dev/disk/by-uuid/$luks") == "$device" ]] ||
            fail "$uuid: the header's link /dev/disk/by-uuid/$luks points at $(readlink -f "/dev/disk/by-uuid/$luks"), not at $device"
    done
}

# Neither key file's bytes nor a recovery key in the journal (binary files
# and text) or in what the reporting commands print.
no_key_material() {
    # shellcheck disable=SC1090
    . "$ENCRYPTED_STATE"
    local where=$1 seen secret
    seen=$(
        strings /var/log/journal/*/*.journal* 2>/dev/null || true
        journalctl --no-pager -o cat 2>/dev/null || true
        $CLI list --json || true
        $CLI status "$ENC_DB" --json || true
        $CLI check --json || true
        $CLI pv --json 2>/dev/null || true
        $CLI metrics 2>/dev/null || true
    )
    # The generated key files hold raw bytes no report could print as
    # such; the key file of known text stands for them.
    for secret in "$KNOWN_KEY_TEXT" "$ENC_DB_RECOVERY" "$ENC_XFS_RECOVERY" "$ENC_BLK_RECOVERY"; do
        [[ $seen != *"$secret"* ]] || fail "$where: key material found in the journal or a report: ${secret:0:12}…"
    done
}

encrypted_check() {
    local boot=$1
    # shellcheck disable=SC1090
    . "$STATE"
    # shellcheck disable=SC1090
    . "$ENCRYPTED_STATE"
    case $boot in
    1)
        findmnt /srv/enc-db >/dev/null && findmnt /srv/enc-xfs >/dev/null ||
            fail "boot 1: the encrypted volumes' fstab consumers are not mounted"
        check_payload /srv/enc-db enc-db
        check_payload /srv/enc-xfs enc-xfs
        encrypted_links
        encrypted_block_device
        encrypted_block_read "boot 1"
        encrypted_shutdown_order
        no_key_material "after boot 1"
        log "boot 1: the three encrypted volumes unlocked unattended, mounted or read raw, checksums intact; the previous shutdown unmounted, closed, then detached"
        ;;
    3)
        # prepare-boot 3 took the guide volume's key file away.
        local system line
        system=$(systemctl is-system-running --wait || true)
        [[ $(systemctl is-active multi-user.target) == active ]] ||
            fail "boot 3: multi-user.target is not active with one encrypted volume's key missing (system: $system)"
        systemctl is-failed --quiet "sparse-volume@$ENC_DB.service" ||
            fail "boot 3: the unit of $ENC_DB (key file removed) is $(systemctl is-active "sparse-volume@$ENC_DB.service"), expected failed"
        line=$(journalctl -b 0 --no-pager -o cat -u "sparse-volume@$ENC_DB.service" | grep -F "key file /etc/sparse-volume/keys/$ENC_DB.key of volume $ENC_DB is missing" || true)
        [[ $(grep -c . <<<"$line") == 1 ]] ||
            fail "boot 3: expected one journal line of the unit naming the volume and its missing key file, got: ${line:-none}"
        ! findmnt /srv/enc-db >/dev/null || fail "boot 3: /srv/enc-db is mounted without its volume"
        findmnt /srv/enc-xfs >/dev/null || fail "boot 3: the other encrypted volume is not mounted"
        check_payload /srv/enc-xfs enc-xfs
        encrypted_block_device
        encrypted_block_read "boot 3"
        log "boot 3: without its key file $ENC_DB failed alone: $line"
        encrypted_recovery
        encrypted_block_recovery
        ;;
    *) fail "encrypted-check: no boot $boot" ;;
    esac
}

# A recovery block of the guide (on stdin) as a script for volume $1: its
# UUID and backing file put in for the example's, each cryptsetup given the
# recovery key ($RECOVERY_KEY) on its standard input as a person types it.
recovery_script() {
    local uuid=$1 line command
    while IFS= read -r line; do
        command=${line//2f0c5a8e-7d1b-4c3e-9a6f-0b1c2d3e4f5a/$uuid}
        command=${command//\/var\/lib\/sparse-volume\/\$uuid/$(file_of "$uuid")}
        [[ $command == cryptsetup* ]] && command+=' <<<"$RECOVERY_KEY"'
        printf '%s\n' "$command"
    done
}

# The guide's recovery commands as written (the volume's UUID put in), each
# cryptsetup given the recovery key on its standard input as a person
# types it at the prompt; then the consumer mounts, with its data.
encrypted_recovery() {
    local script out
    script=$(recovery_script "$ENC_DB" < <(doc_block encryption.md 3))
    [[ $script == *"systemctl start"* ]] || fail "encryption guide: the recovery block has no systemctl start: $script"
    out=$(RECOVERY_KEY=$ENC_DB_RECOVERY bash -euo pipefail -c "$script" 2>&1) ||
        fail "encryption guide: the recovery commands failed: $out"
    systemctl is-active --quiet "sparse-volume@$ENC_DB.service" || fail "after recovery the unit of $ENC_DB is not active"
    mount /srv/enc-db || fail "after recovery /srv/enc-db does not mount"
    check_payload /srv/enc-db enc-db
    encrypted_links
    no_key_material "after the recovery"
    log "recovery: the guide's commands with the recovery key gave $ENC_DB a new key file; unlocked, mounted, checksum intact"
}

# The encrypted block volume loses its key file while stopped: its start
# fails in one line naming it, then the guide's block-mode recovery
# commands (its UUID and backing file put in, the recovery key typed at
# each prompt) bring it back, and its reader finds the data intact.
encrypted_block_recovery() {
    local key=/etc/sparse-volume/keys/$ENC_BLK.key script out
    systemctl stop "sparse-volume@$ENC_BLK.service"
    mv "$key" /root/lost-blk.key
    systemctl start "sparse-volume@$ENC_BLK.service" 2>/dev/null &&
        fail "the encrypted block volume started without its key file"
    out=$(journalctl --no-pager -o cat -u "sparse-volume@$ENC_BLK.service" | grep -cF "key file $key of volume $ENC_BLK is missing" || true)
    ((out >= 1)) || fail "no journal line of the unit naming the encrypted block volume and its missing key file"
    script=$(recovery_script "$ENC_BLK" < <(doc_block encryption.md 4))
    [[ $script == *'"${dev}p1"'* ]] || fail "encryption guide: the block-mode recovery block does not work on the partition: $script"
    out=$(RECOVERY_KEY=$ENC_BLK_RECOVERY bash -euo pipefail -c "$script" 2>&1) ||
        fail "encryption guide: the block-mode recovery commands failed: $out"
    systemctl is-active --quiet "sparse-volume@$ENC_BLK.service" || fail "after recovery the unit of $ENC_BLK is not active"
    encrypted_block_device
    systemctl start enc-blk-reader.service
    encrypted_block_read "after the block-mode recovery"
    no_key_material "after the block-mode recovery"
    log "block-mode recovery: the guide's commands with the recovery key gave $ENC_BLK a new key file; opened, read raw, checksum intact"
}

# In the previous boot's shutdown, each encrypted volume's consumer
# unmounted before its unit stopped, and the stop closed the mapping and
# then released the loop device (its one line says both, in that order).
encrypted_shutdown_order() {
    local since journal uuid mountpoint unmounted stopped
    since=$(cat /root/reboot-at 2>/dev/null || echo 0)
    journal=$(journalctl -b -1 --no-pager -o cat --since "@$since")
    for uuid in "$ENC_DB" "$ENC_XFS"; do
        mountpoint=/srv/enc-db
        [[ $uuid == "$ENC_XFS" ]] && mountpoint=/srv/enc-xfs
        unmounted=$(grep -nE "^Unmounted .*$mountpoint\.?$" <<<"$journal" | head -n 1 | cut -d: -f1 || true)
        stopped=$(grep -nE "^detached $uuid \(/dev/loop[0-9]+; closed /dev/mapper/sparse-volume-$uuid first\)$" <<<"$journal" | head -n 1 | cut -d: -f1 || true)
        [[ -n $unmounted && -n $stopped ]] && ((unmounted < stopped)) ||
            fail "previous shutdown of $uuid: unmount at line ${unmounted:-none}, close and detach at ${stopped:-none} of the journal since the reboot; expected the unmount first: $(grep -E "$mountpoint|$uuid" <<<"$journal" | head -n 20)"
    done
    grep -qE "^detached $ENC_BLK \(/dev/loop[0-9]+; closed /dev/mapper/sparse-volume-$ENC_BLK first\)$" <<<"$journal" ||
        fail "previous shutdown of the encrypted block volume $ENC_BLK: no line saying its mapping closed before its loop device went: $(grep -E "$ENC_BLK" <<<"$journal" | head -n 20)"
}

case $phase in
partition-once) bash /root/partition-once.sh $CLI 10 ;;
metrics) metrics ;;
unit-states) unit_states ;;
setup) setup ;;
verify) verify "${2:?boot number}" ;;
consumers) consumers ;;
device-truth) device_truth ;;
prepare-boot) prepare_boot "${2:?boot number}" ;;
restore-config) restore_config ;;
systemd) systemd_commands ;;
detach-by-link) detach_by_link ;;
package) package ;;
upgrade-from-previous) upgrade_from_previous ;;
clone) clone_consumer ;;
take-over) take_over ;;
readme-create) readme_create ;;
readme-check) readme_check ;;
emergency-switch-doc) emergency_switch_doc ;;
encrypted-create) encrypted_create ;;
encrypted-check) encrypted_check "${2:?boot number}" ;;
*) fail "unknown phase" ;;
esac
