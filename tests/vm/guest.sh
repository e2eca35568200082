#!/usr/bin/env bash
# shellcheck disable=SC2153 # the volume variables come from $STATE
# The guest half of the VM scenario (tests/vm/scenario.sh copies it in and
# runs one phase at a time over SSH, as root, in a Debian 12 guest with real
# systemd and udev):
#
#   guest.sh setup            make volumes of every kind and their consumers
#   guest.sh verify N         after boot N: everything is back, exactly once
#   guest.sh systemd          enable/disable/start/stop against real systemd
#   guest.sh detach-by-link   detach a partition's parent found by udev link
#   guest.sh package          an upgrade keeps volumes attached; remove keeps data
#
# Volume UUIDs are chosen at setup and kept in $STATE for later phases.
set -euo pipefail

STATE=/root/scenario.env
CLI=sparse-volume
phase=${1:?phase}

log() { printf '[guest %s] %s\n' "$phase" "$*"; }
fail() {
    printf '[guest %s] FAIL: %s\n' "$phase" "$*" >&2
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
    cat >/etc/sparse-volume/config.toml <<'EOF'
storage_roots = ["/var/lib/sparse-volume", "/srv/volumes"]
EOF

    local ext4 xfs block ro other disabled corrupt
    ext4=$(new_uuid) xfs=$(new_uuid) block=$(new_uuid) ro=$(new_uuid)
    other=$(new_uuid) disabled=$(new_uuid) corrupt=$(new_uuid)
    cat >"$STATE" <<EOF
EXT4=$ext4
XFS=$xfs
BLOCK=$block
READONLY=$ro
OTHER=$other
DISABLED=$disabled
CORRUPT=$corrupt
EOF
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

    # Grow the mounted ext4 online; the new size must survive the reboots.
    local before after
    before=$(df --output=size -B1M /srv/consumer | tail -n 1)
    $CLI resize "$ext4" --size 128M
    after=$(df --output=size -B1M /srv/consumer | tail -n 1)
    ((after > before + 50)) || fail "online resize: df went from $before to $after MiB"
    grep -q "^size = $((128 << 20))$" "/etc/sparse-volume/volumes.d/$ext4.toml" || fail "resize not recorded"
    log "online resize of the mounted ext4: ${before} -> ${after} MiB"

    if [[ ${SV_VM_BREAK:-} == generator ]]; then
        log "breaking the product on purpose: removing the generator"
        rm -f /usr/lib/systemd/system-generators/sparse-volume-generator
    fi
    # list shows every volume and exits 1 because of the corrupt file.
    if $CLI list; then fail "list did not report the corrupt registry file"; fi
}

verify() {
    local boot=$1
    # shellcheck disable=SC1090
    . "$STATE"
    systemctl is-system-running --wait >/dev/null || true

    local uuid file device
    for uuid in "$EXT4" "$XFS" "$READONLY"; do
        device=$(only_loop_of "/var/lib/sparse-volume/$uuid")
        [[ $(readlink -f "/dev/disk/by-uuid/$uuid") == "$device" ]] ||
            fail "/dev/disk/by-uuid/$uuid does not point at $device"
    done
    device=$(only_loop_of "/srv/volumes/$OTHER")
    [[ $(readlink -f "/dev/disk/by-uuid/$OTHER") == "$device" ]] || fail "by-uuid link of the second-root volume"
    device=$(only_loop_of "/var/lib/sparse-volume/$BLOCK")
    [[ $(cat "/sys/block/${device#/dev/}/loop/partscan") == 1 ]] || fail "$device does not scan partitions"
    [[ $(readlink -f "/dev/disk/by-partuuid/$BLOCK") == "${device}p1" ]] ||
        fail "/dev/disk/by-partuuid/$BLOCK does not point at ${device}p1"
    device=$(only_loop_of "/var/lib/sparse-volume/$READONLY")
    [[ $(cat "/sys/block/${device#/dev/}/ro") == 1 ]] || fail "the read-only volume is writable"

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
    if ((boot > 1)); then
        # The previous shutdown: every detach ran, none failed.
        local stops
        stops=$(journalctl -b -1 --no-pager -o cat | grep -c '^detached ' || true)
        ((stops >= 5)) || fail "previous shutdown: only $stops volumes detached"
        if journalctl -b -1 --no-pager -o cat | grep -E '^sparse-volume: detaching'; then
            fail "previous shutdown had detach errors"
        fi
    fi
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
    # A volume whose content does not match fails its unit, with the reason.
    local bad
    bad=$(new_uuid)
    $CLI create --uuid "$bad" --size 32M
    mkfs.ext4 -q -F -U "$(new_uuid)" "/var/lib/sparse-volume/$bad"
    if out=$($CLI start "$bad" 2>&1); then fail "a volume with foreign content started: $out"; fi
    grep -q 'failed' <<<"$out" || fail "the failed start did not say so: $out"
    $CLI remove "$bad" --delete-data
    log "enable/disable/start/stop against systemd $(systemctl --version | head -n 1 | cut -d' ' -f2): ok"
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
    apt-get remove -y sparse-volume >/dev/null
    [[ -f /etc/sparse-volume/volumes.d/$EXT4.toml && -f /var/lib/sparse-volume/$EXT4 ]] ||
        fail "apt-get remove deleted the registry or the data"
    check_payload /srv/consumer consumer
    log "upgrade kept every volume attached; remove kept registry and data"
}

case $phase in
setup) setup ;;
verify) verify "${2:?boot number}" ;;
systemd) systemd_commands ;;
detach-by-link) detach_by_link ;;
package) package ;;
*) fail "unknown phase" ;;
esac
