#!/usr/bin/env bash
# The guest half of tests/vm/endurance.sh (copied in, one phase per SSH
# call, as root, in a Debian guest with real systemd and udev):
#
#   endurance-guest.sh setup           three consumers on a storage root of
#                                      their own (disk 1): an ext4 and an
#                                      xfs volume mounted through fstab, a
#                                      block volume written raw
#   endurance-guest.sh churn CUT SEED  starts, in the background, a churn of
#                                      create/resize/remove/enable/disable/
#                                      apply/start/stop and one writer of
#                                      fsynced records per consumer; returns
#   endurance-guest.sh verify-cut CUT TENTHS
#                                      after the power cut (TENTHS of a
#                                      second after the churn started): one
#                                      check --repair, then everything holds
#   endurance-guest.sh remove-package  apt-get remove with the consumers
#                                      mounted (a clean reboot follows)
#   endurance-guest.sh verify-removed  that shutdown unmounted the consumers
#                                      cleanly; the package back, volumes too
#   endurance-guest.sh scale-setup N   N more volumes (half ext4, half
#                                      block) and an inotify probe for the
#                                      next boot
#   endurance-guest.sh verify-scale WHAT
#                                      every volume attached once, the probe
#                                      never refused an inotify instance,
#                                      udev's CPU time (WHAT names the boot)
#   endurance-guest.sh share-partition-names
#                                      the scale block volumes' partitions
#                                      all named "sparse-volume", as before
#                                      0.3 (for a comparison boot)
set -euo pipefail

CLI=sparse-volume
VOLUMES_D=/etc/sparse-volume/volumes.d
STATE=/root/endurance.env
# The consumers' storage root (disk 1) and the raw disk of the writers'
# acknowledgements (disk 2): neither shares a file system with the
# registry, the churn's volumes or each other, so the writers' fsyncs do
# not commit what the commands wrote, and an acknowledgement is on a disk
# the moment its write returns.
CONSUMERS_ROOT=/srv/consumers
ACK_DISK=/dev/disk/by-id/virtio-sv-data2
phase=${1:?phase}

log() { printf '[guest %s] %s\n' "$phase" "$*"; }
fail() {
    printf '[guest %s] FAIL: %s\n' "$phase" "$*" >&2
    exit 1
}

# A volume's registry field (top-level scalar) from its file.
field() { sed -n "s/^$2 = \"\{0,1\}\([^\"]*\)\"\{0,1\}$/\1/p" "$VOLUMES_D/$1.toml"; }

write_tools() {
    # One record per 4 KiB block: a header naming it, then bytes derived
    # from the header, so a torn, stale or misplaced block shows.
    cat >/root/records.py <<'EOF'
import hashlib, mmap, os, sys

BLOCK = 4096
SLOTS = 4096  # acknowledgements per writer and cut

def record(name, cut, index):
    head = f"{name} cut {cut} record {index}\n".encode()
    body = hashlib.sha256(head).digest() * (BLOCK // 32)
    return head + body[: BLOCK - len(head)]

def ack_block(name, cut, index):
    return f"ack {name} cut {cut} record {index}\n".encode().ljust(BLOCK, b"\0")

def write(name, slot, cut, target, first, count, acks):
    # Records go to TARGET (a file or a partition); record i is
    # acknowledged in block SLOT * SLOTS + i of the raw disk ACKS (direct
    # and synchronous: on the disk when the write returns) only after its
    # fsync returned.
    flags = os.O_WRONLY | (0 if target.startswith("/dev/") else os.O_CREAT)
    fd = os.open(target, flags, 0o600)
    ack = os.open(acks, os.O_WRONLY | os.O_DIRECT | os.O_DSYNC)
    buffer = mmap.mmap(-1, BLOCK)  # page-aligned, as O_DIRECT wants
    for i in range(count):
        os.pwrite(fd, record(name, cut, first + i), (first + i) * BLOCK)
        os.fsync(fd)
        buffer[:] = ack_block(name, cut, first + i)
        os.pwrite(ack, buffer, (slot * SLOTS + i) * BLOCK)

def verify(name, slot, cut, target, first, acks):
    # Every acknowledged record reads back as written; prints how many.
    ack = os.open(acks, os.O_RDONLY)
    acknowledged = 0
    while acknowledged < SLOTS and os.pread(ack, BLOCK, (slot * SLOTS + acknowledged) * BLOCK) == ack_block(name, cut, first + acknowledged):
        acknowledged += 1
    # A cut before the first fsync may leave no file at all: that loses
    # nothing, as long as nothing was acknowledged.
    try:
        fd = os.open(target, os.O_RDONLY)
    except FileNotFoundError:
        if acknowledged:
            sys.exit(f"{name}: {acknowledged} records acknowledged, but {target} is gone")
        print(0)
        return
    bad = [i for i in range(first, first + acknowledged) if os.pread(fd, BLOCK, i * BLOCK) != record(name, cut, i)]
    if bad:
        sys.exit(f"{name}: {len(bad)} of {acknowledged} acknowledged records differ (first: {bad[:5]})")
    print(acknowledged)

if __name__ == "__main__":
    a = sys.argv
    if a[1] == "write":
        write(a[2], int(a[3]), int(a[4]), a[5], int(a[6]), int(a[7]), a[8])
    else:
        verify(a[2], int(a[3]), int(a[4]), a[5], int(a[6]), a[7])
EOF
}

# Where writer NAME puts cut CUT's records: "SLOT TARGET FIRST COUNT".
writer_of() {
    local name=$1 cut=$2
    case $name in
    pc-ext4) echo "0 /srv/pc-ext4/records-$cut 0 $SLOTS" ;;
    pc-xfs) echo "1 /srv/pc-xfs/records-$cut 0 $SLOTS" ;;
    # The partition (32 MiB less the GPT): 1024 records per cut, in turns.
    pc-block) echo "2 /dev/disk/by-partuuid/$PC_BLOCK $(((cut % 6) * 1024)) 1024" ;;
    esac
}
SLOTS=4096

setup() {
    local uuid fs
    write_tools
    : >"$STATE"
    udevadm wait --timeout=30 /dev/disk/by-id/virtio-sv-data1 "$ACK_DISK"
    mkfs.ext4 -q -F /dev/disk/by-id/virtio-sv-data1
    mkdir -p "$CONSUMERS_ROOT"
    echo "UUID=$(blkid -s UUID -o value /dev/disk/by-id/virtio-sv-data1) $CONSUMERS_ROOT ext4 defaults 0 2" >>/etc/fstab
    mount "$CONSUMERS_ROOT"
    echo "storage_roots = [\"/var/lib/sparse-volume\", \"$CONSUMERS_ROOT\"]" >>/etc/sparse-volume/config.toml
    for fs in ext4 xfs; do
        # xfs wants at least 300 MB; the file is sparse.
        uuid=$($CLI create --name "pc-$fs" --fs "$fs" --size "$([[ $fs == xfs ]] && echo 320M || echo 64M)" \
            --path "$CONSUMERS_ROOT/pc-$fs" --now --json |
            python3 -c 'import json,sys; print(json.load(sys.stdin)["uuid"])')
        echo "PC_${fs^^}=$uuid" >>"$STATE"
        mkdir -p "/srv/pc-$fs"
        # nofail: a boot without the package (verify-removed) goes on
        # without them; pass 0: verify-cut runs the checks itself.
        echo "UUID=$uuid /srv/pc-$fs $fs nofail,x-systemd.device-timeout=90s 0 0" >>/etc/fstab
    done
    uuid=$($CLI create --name pc-block --mode block --size 32M --path "$CONSUMERS_ROOT/pc-block" --now --json |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["uuid"])')
    echo "PC_BLOCK=$uuid" >>"$STATE"
    systemctl daemon-reload
    mount /srv/pc-ext4
    mount /srv/pc-xfs
    # The test's own files must outlive the first cut (the product syncs
    # its own; a global sync here would hide what it forgets).
    sync /etc/fstab /etc/sparse-volume/config.toml "$STATE" /root/records.py /root/endurance-guest.sh /root/sparse-volume_*_amd64.deb
    log "consumers: ext4, xfs (mounted through fstab) and a block volume written raw, on $CONSUMERS_ROOT; $(losetup -a | grep -c .) loop devices"
}

# --- the churn ---------------------------------------------------------------

CHURN_MAX=6

churn_volumes() {
    grep -l '^name = "churn-' "$VOLUMES_D"/*.toml 2>/dev/null | sed 's#.*/##; s#\.toml$##' || true
}

# One command of the churn, chosen from RANDOM; failures (a refusal
# because of a concurrent command, say) are logged, not fatal: what matters
# is what a power cut in the middle of any of them leaves. Its start and
# end go to the kernel log, which the host reads on the serial console: the
# journal loses its last seconds at a power cut.
churn_step() {
    local cut=$1 step=$2 volumes count victim size op name enabled mode
    mapfile -t volumes < <(churn_volumes)
    count=${#volumes[@]}
    victim=${volumes[RANDOM % (count > 0 ? count : 1)]:-}
    op=$((RANDOM % 8))
    ((count > 0)) || op=0
    ((count < CHURN_MAX)) || op=2
    # Every RANDOM of the step drawn here, in this shell: a subshell would
    # reseed it, and the seed would no longer replay the run.
    mode=(--fs ext4)
    ((RANDOM % 3)) || mode=(--mode block)
    ((RANDOM % 2)) && mode+=(--now)
    enabled=$( ((RANDOM % 2)) && echo true || echo false)
    local start_or_stop=$((RANDOM % 2))
    name=(create create remove resize disable enable apply start-stop)
    echo "<5>endurance-churn: cut $cut step $step ${name[op]} begin" >/dev/kmsg
    case $op in
    0 | 1) $CLI create --name "churn-$step" --size 16M "${mode[@]}" --json ;;
    2) $CLI remove "$victim" --delete-data --json ;;
    3)
        size=$(field "$victim" size)
        $CLI resize "$victim" --size $((size + 8 * 1024 * 1024)) --json
        ;;
    4) $CLI disable "$victim" --now --json ;;
    5) $CLI enable "$victim" --now --json ;;
    6)
        printf '{"name": "%s", "state": "present", "enabled": %s, "now": true}\n' "$(field "$victim" name)" "$enabled" |
            $CLI apply --stdin --json
        ;;
    7)
        if ((start_or_stop)); then $CLI start "$victim" --json; else $CLI stop "$victim" --json; fi
        ;;
    esac
    local rc=$?
    echo "<5>endurance-churn: cut $cut step $step ${name[op]} end $rc" >/dev/kmsg
    return "$rc"
}

churn() {
    local cut=$1 seed=$2 writer slot target first count
    # shellcheck disable=SC1090
    . "$STATE"
    # The writers: one per consumer, records of this cut only (the last
    # cut's were verified and removed by verify-cut).
    for writer in pc-ext4 pc-xfs pc-block; do
        read -r slot target first count < <(writer_of "$writer" "$cut")
        setsid -f python3 /root/records.py write "$writer" "$slot" "$cut" "$target" "$first" "$count" "$ACK_DISK" \
            >>/root/writers.log 2>&1
    done
    # shellcheck disable=SC2016 # expanded by the churn's own shell
    setsid -f bash -c 'RANDOM=$1; . /root/endurance-guest.sh library; for ((step = $2 * 1000; ; step++)); do churn_step "$2" "$step" || true; done' \
        churn "$seed" "$cut" >>/root/churn.log 2>&1
    log "cut $cut: churn (seed $seed) and three writers started"
}

# --- after a power cut ---------------------------------------------------------

# Every registered, enabled volume: attached exactly once, its link there
# (waiting up to 30 s for udev). Prints how many; one pass over sysfs, as
# a shell loop of losetup calls took a minute with 200 volumes under TCG.
all_enabled_attached() {
    python3 - "$1" "$VOLUMES_D" <<'EOF'
import glob, os, sys, time, tomllib

context, volumes_d = sys.argv[1], sys.argv[2]
devices = {}
for backing in glob.glob("/sys/block/loop*/loop/backing_file"):
    with open(backing) as f:
        path = f.read().strip()
    devices.setdefault(path, []).append("/dev/" + backing.split("/")[3])
count = 0
deadline = time.monotonic() + 30
for file in sorted(glob.glob(f"{volumes_d}/*.toml")):
    with open(file, "rb") as f:
        volume = tomllib.load(f)
    if not volume.get("enabled", True):
        continue
    uuid, found = volume["uuid"], devices.get(volume["path"], [])
    if len(found) != 1:
        sys.exit(f"{context}: enabled volume {uuid} ({volume.get('name', '')}) has {found or 'no'} loop device(s), expected exactly one")
    block = volume.get("mode") == "block"
    link = f"/dev/disk/by-{'partuuid' if block else 'uuid'}/{uuid}"
    want = found[0] + ("p1" if block else "")
    while not os.path.exists(link) and time.monotonic() < deadline:
        time.sleep(0.2)
    if os.path.realpath(link) != want:
        sys.exit(f"{context}: {link} points at {os.path.realpath(link)}, expected {want}")
    count += 1
print(count)
EOF
}

# Every acknowledged record of the cut reads back, and each writer had
# some acknowledged when the cut came 2 s or more after the start; the
# file systems check clean (unmounted for it, then mounted again). Prints
# the counts.
verify_consumers() {
    local cut=$1 tenths=$2 writer slot target first count n fs counts=()
    for writer in pc-ext4 pc-xfs pc-block; do
        read -r slot target first count < <(writer_of "$writer" "$cut")
        [[ $writer == pc-block ]] || findmnt "/srv/$writer" >/dev/null || fail "cut $cut: /srv/$writer is not mounted after the boot"
        n=$(python3 /root/records.py verify "$writer" "$slot" "$cut" "$target" "$first" "$ACK_DISK") ||
            fail "cut $cut: acknowledged records of $writer lost"
        ((n > 0 || tenths < 20)) ||
            fail "cut $cut: $writer had no record acknowledged $((tenths / 10)).$((tenths % 10)) s after it started (its log: $(tail -n 3 /root/writers.log))"
        counts+=("$writer $n")
    done
    for fs in ext4 xfs; do
        rm -f "/srv/pc-$fs/records-$cut"
        umount "/srv/pc-$fs"
        if [[ $fs == ext4 ]]; then
            e2fsck -fn "/dev/disk/by-uuid/$PC_EXT4" >/root/fsck.log 2>&1 ||
                fail "cut $cut: e2fsck -fn of pc-ext4: $(tail -n 5 /root/fsck.log)"
        else
            xfs_repair -n "/dev/disk/by-uuid/$PC_XFS" >/root/fsck.log 2>&1 ||
                fail "cut $cut: xfs_repair -n of pc-xfs: $(tail -n 5 /root/fsck.log)"
        fi
        mount "/srv/pc-$fs"
    done
    local IFS=,
    echo "${counts[*]}"
}

verify_cut() {
    local cut=$1 tenths=$2 state repair kinds failed attached records uuid
    # shellcheck disable=SC1090
    . "$STATE"
    state=$(systemctl is-system-running --wait || true)
    failed=$(systemctl --failed --no-legend --plain | awk '{ print $1 }' | tr '\n' ' ')
    # The consumers' volumes came back by themselves, before any repair.
    for uuid in "$PC_EXT4" "$PC_XFS" "$PC_BLOCK"; do
        systemctl is-active --quiet "sparse-volume@$uuid.service" ||
            fail "cut $cut: the consumer volume $uuid did not attach at boot: $(systemctl status --no-pager "sparse-volume@$uuid.service" | tail -n 5)"
    done
    # One repair, as an operator would run after a power cut; what it found
    # is reported (the counts go to docs/reliability.md).
    repair=$($CLI check --repair --json) || true
    kinds=$(python3 -c '
import json, sys
findings = json.loads(sys.argv[1])["findings"]
print(" ".join(sorted(f["kind"] + ("" if f["repaired"] else "(left)") for f in findings)) or "none")' "$repair")
    # A cut inside a resize leaves what the finding names: a file larger
    # than the registry says, which running the resize again finishes (the
    # documented way; check --repair does not grow volumes).
    local grown file
    while read -r grown file; do
        [[ -n $grown ]] || continue
        $CLI resize "$grown" --size "$(stat -c %s "$file")" >/dev/null ||
            fail "cut $cut: resize again did not finish the interrupted resize of $grown"
        kinds+=" resize-finished"
    done < <(python3 -c '
import json, sys
for f in json.loads(sys.argv[1])["findings"]:
    if f["kind"] == "size-mismatch" and "interrupted resize" in f["message"]:
        print(f["uuid"], f["path"])' "$repair")
    # After it: check is clean, every registry file parses, every enabled
    # volume is there exactly once with its link.
    local after
    after=$($CLI check --json) || fail "cut $cut: check after one repair is not clean: $after"
    python3 -c 'import json, sys; d = json.loads(sys.argv[1]); sys.exit(0 if d["clean"] and not [f for f in d["findings"] if f["severity"] == "error"] else 1)' "$after" ||
        fail "cut $cut: check after one repair is not clean: $after"
    $CLI list --json >/root/list.json || fail "cut $cut: list fails (a registry file that does not read?): $(head -c 2000 /root/list.json)"
    attached=$(all_enabled_attached "cut $cut") || fail "cut $cut: not every enabled volume is attached once with its link (above)"
    records=$(verify_consumers "$cut" "$tenths")
    [[ -z $(find /dev -maxdepth 1 -name '.sparse-volume-*') ]] || fail "cut $cut: private device nodes left in /dev"
    # Units the boot failed are reported (the repair mended them).
    systemctl reset-failed >/dev/null 2>&1 || true
    log "cut $cut: boot ${state:-?}${failed:+ (failed at boot: $failed)}; repair found: $kinds; then clean; $attached enabled volumes attached once with their links; acknowledged records read back: $records; e2fsck -fn and xfs_repair -n clean"
    echo "RESULT cut=$cut repaired=${kinds// /,} attached=$attached failed_at_boot=$(wc -w <<<"$failed") records=${records// /:}" >>/root/endurance-results
    # Only the test's own file: the next cut must find what the product
    # wrote durable by the product's own doing.
    sync /root/endurance-results
}

# --- a package removal with mounted consumers ------------------------------

remove_package() {
    # shellcheck disable=SC1090
    . "$STATE"
    if ! findmnt /srv/pc-ext4 >/dev/null || ! findmnt /srv/pc-xfs >/dev/null; then
        fail "the consumers are not mounted before the removal"
    fi
    apt-get remove -y sparse-volume >/dev/null
    [[ -f $VOLUMES_D/$PC_EXT4.toml ]] || fail "apt-get remove deleted the registry"
    date +%s >/root/reboot-at
    log "removed with $(losetup -a | grep -c .) loop devices attached and both consumers mounted"
}

verify_removed() {
    # shellcheck disable=SC1090
    . "$STATE"
    local since shutdown_log kernel_log fs
    since=$(cat /root/reboot-at)
    shutdown_log=$(journalctl -b -1 --no-pager -o short-monotonic --since "@$since")
    for fs in ext4 xfs; do
        grep -qE "Unmounted .*/srv/pc-$fs|srv-pc\\\\x2d$fs\\.mount: Deactivated successfully" <<<"$shutdown_log" ||
            fail "the shutdown without the package did not unmount /srv/pc-$fs cleanly: $(grep -i "pc-$fs\|pc\\\\x2d$fs" <<<"$shutdown_log" | tail -n 5)"
    done
    kernel_log=$(journalctl -b -1 -k --no-pager -o cat --since "@$since")
    if grep -E 'I/O error.*loop|EXT4-fs (error|warning).*loop|XFS \(loop[0-9]+\).*(error|shutdown)' <<<"$kernel_log"; then
        fail "the shutdown without the package: I/O or file system errors on loop devices (above)"
    fi
    # This boot had no package, so the consumers' fstab mounts (nofail)
    # still wait for their devices: stopped, so that the file systems are
    # checked before anything mounts them. Unmounted cleanly at the
    # shutdown, they need no replay.
    for fs in ext4 xfs; do
        systemctl stop "$(systemd-escape --path --suffix=mount "/srv/pc-$fs")"
    done
    dpkg -i /root/sparse-volume_*_amd64.deb >/dev/null
    systemctl start sparse-volumes.target
    e2fsck -fn "/dev/disk/by-uuid/$PC_EXT4" >/root/fsck.log 2>&1 || fail "pc-ext4 after the shutdown without the package: $(tail -n 5 /root/fsck.log)"
    xfs_repair -n "/dev/disk/by-uuid/$PC_XFS" >/root/fsck.log 2>&1 || fail "pc-xfs after the shutdown without the package: $(tail -n 5 /root/fsck.log)"
    mount /srv/pc-ext4
    mount /srv/pc-xfs
    blockdev_targets_active "after the reinstall"
    log "a shutdown with the package removed and consumers mounted: both unmounted, no I/O error in the journal (the host reads the console's end of it); reinstalled, the volumes back, file systems clean, their blockdev@ targets active"
}

# Every active volume unit's blockdev@ target is active (the target that
# makes the consumers unmount before the volume detaches at shutdown), once
# systemd has no job left to run.
blockdev_targets_active() {
    local unit target i
    for ((i = 0; i < 50; i++)); do
        [[ -n $(systemctl list-jobs --no-legend) ]] || break
        sleep 0.2
    done
    for unit in $(systemctl list-units --no-legend --plain --state=active 'sparse-volume@*.service' | awk '{ print $1 }'); do
        for target in $(systemctl show -p Wants --value "$unit"); do
            # Quoted C-style by systemd for the backslash in the name.
            target=$(sed -e 's/^"//' -e 's/"$//' -e 's/\\\\/\\/g' <<<"$target")
            [[ $target == blockdev@*.target ]] || continue
            systemctl is-active --quiet "$target" ||
                fail "$1: $target is $(systemctl is-active "$target" || true) under the active $unit: its consumers would not unmount before it detaches at shutdown"
        done
    done
}

# The previous shutdown unmounted each consumer before its volume detached,
# and every volume unit stopped without an error.
shutdown_ordered() {
    local journal fs uuid unmounted detached failed
    journal=$(journalctl -b -1 --no-pager -o cat)
    for fs in ext4 xfs; do
        uuid=PC_${fs^^}
        unmounted=$(grep -n -m 1 -E "Unmounted .*/srv/pc-$fs\.?$" <<<"$journal" | cut -d: -f1)
        detached=$(grep -n -m 1 "^detached ${!uuid} " <<<"$journal" | cut -d: -f1)
        [[ -n $unmounted && -n $detached ]] ||
            fail "$1: the shutdown's journal lacks the unmount of /srv/pc-$fs (${unmounted:-none}) or the detach of ${!uuid} (${detached:-none})"
        ((unmounted < detached)) || fail "$1: ${!uuid} detached (journal line $detached) before /srv/pc-$fs was unmounted (line $unmounted)"
    done
    failed=$(journalctl -b -1 --no-pager -o cat -u 'sparse-volume@*' | grep -E 'Failed with result|Control process exited|^sparse-volume: detaching' || true)
    [[ -z $failed ]] || fail "$1: volume units failed to stop: $failed"
}

# --- many volumes at one boot ----------------------------------------------

scale_setup() {
    local count=$1 i start
    start=$SECONDS
    for ((i = 0; i < count; i++)); do
        if ((i % 2)); then
            $CLI create --name "scale-$i" --mode block --size 8M >/dev/null
        else
            $CLI create --name "scale-$i" --fs ext4 --size 8M >/dev/null
        fi
    done
    log "$count volumes created (not attached) in $((SECONDS - start)) s"
    # The metrics timer runs at these boots, into node_exporter's directory
    # (made here as its package would).
    mkdir -p /var/lib/prometheus/node-exporter
    systemctl enable sparse-volume-metrics.timer 2>/dev/null
    # A root service that starts beside the volumes and asks for an inotify
    # instance every 50 ms until the last attach has ended; it also counts
    # the instances our processes hold.
    cat >/root/inotify-probe.py <<'EOF'
import ctypes, json, os, subprocess, sys, time

libc = ctypes.CDLL(None, use_errno=True)
# The units' program (its comm cut to 15 bytes) and the CLI.
ours = ("sparse-volume-u", "sparse-volume")
if sys.argv[1:] == ["--once"]:
    # The probe's own control: one try, "refused" when it was.
    fd = libc.inotify_init1(0o2000000)
    print("refused" if fd < 0 else "granted")
    sys.exit(0)
result = {"tries": 0, "refused": 0, "errors": [], "max_ours": 0, "max_root": 0, "max_attaching": 0}
quiet_since = None
start = time.monotonic()
last_scan = 0.0
while time.monotonic() - start < 600:
    fd = libc.inotify_init1(0o2000000)
    result["tries"] += 1
    if fd < 0:
        result["refused"] += 1
        result["errors"].append(os.strerror(ctypes.get_errno()))
    else:
        os.close(fd)
    now = time.monotonic()
    if now - last_scan >= 0.25:
        last_scan = now
        attaching = mine = root = 0
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/comm") as f:
                    comm = f.read().strip()
                count = 0
                for fd_name in os.listdir(f"/proc/{pid}/fd"):
                    if os.readlink(f"/proc/{pid}/fd/{fd_name}") == "anon_inode:inotify":
                        count += 1
            except OSError:
                continue
            root += count
            if comm in ours:
                attaching += 1
                mine += count
        result["max_ours"] = max(result["max_ours"], mine)
        result["max_root"] = max(result["max_root"], root)
        result["max_attaching"] = max(result["max_attaching"], attaching)
        # Done once the volumes' target is reached and no attach has run
        # for 5 s (the scan runs every 0.25 s, systemctl once a second).
        if attaching:
            quiet_since = None
        else:
            quiet_since = quiet_since or now
            if now - quiet_since > 5 and subprocess.run(
                ["systemctl", "is-active", "--quiet", "sparse-volumes.target"]
            ).returncode == 0:
                break
            if now - quiet_since > 5:
                quiet_since = now - 4
    if notify_socket := os.environ.pop("NOTIFY_SOCKET", None):
        # Ready (the volumes are ordered after this) once it has tried and
        # scanned once.
        import socket
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notify:
            notify.connect("\0" + notify_socket[1:] if notify_socket[0] == "@" else notify_socket)
            notify.send(b"READY=1")
    time.sleep(0.05)
result["seconds"] = round(time.monotonic() - start, 1)
result["errors"] = sorted(set(result["errors"]))
with open("/root/inotify-probe.json.tmp", "w") as f:
    json.dump(result, f)
os.rename("/root/inotify-probe.json.tmp", "/root/inotify-probe.json")
EOF
    cat >/etc/systemd/system/inotify-probe.service <<'EOF'
[Unit]
Description=A root service that needs inotify while the volumes attach
DefaultDependencies=no
After=systemd-udevd.service

[Service]
Type=notify
ExecStart=/usr/bin/python3 /root/inotify-probe.py

[Install]
WantedBy=sysinit.target
EOF
    systemctl enable inotify-probe.service 2>/dev/null
    # The volumes start once the probe runs, so it sees every attach.
    mkdir -p /etc/systemd/system/sparse-volume@.service.d
    printf '[Unit]\nAfter=inotify-probe.service\n' >/etc/systemd/system/sparse-volume@.service.d/after-probe.conf
    rm -f /root/inotify-probe.json
    # The probe must be able to see a refusal: with root's limit at 1 for a
    # moment (systemd and udevd hold theirs already), it must be refused.
    local limit seen
    limit=$(sysctl -n fs.inotify.max_user_instances)
    sysctl -q -w fs.inotify.max_user_instances=1
    seen=$(python3 /root/inotify-probe.py --once)
    sysctl -q -w "fs.inotify.max_user_instances=$limit"
    [[ $seen == refused ]] || fail "the inotify probe was not refused with root's limit at 1 (got: $seen): it could not see an exhaustion"
    log "the probe's control: refused with root's limit at 1, as it must be"
}

verify_scale() {
    local what=$1 registered attached probe udev_ns target_us boot
    registered=$(find "$VOLUMES_D" -name '*.toml' | grep -c .)
    systemctl is-system-running --wait >/dev/null || true
    [[ -z $(systemctl --failed --no-legend --plain) ]] || fail "$what: failed units: $(systemctl --failed --no-legend --plain)"
    # shellcheck disable=SC1090
    . "$STATE"
    shutdown_ordered "$what: the shutdown before this boot"
    attached=$(all_enabled_attached "$what") || fail "$what: not every enabled volume is attached once with its link (above)"
    local i
    for ((i = 0; i < 600; i++)); do
        [[ ! -e /root/inotify-probe.json ]] || break
        sleep 1
    done
    probe=$(cat /root/inotify-probe.json 2>/dev/null) || fail "$what: the inotify probe wrote no result"
    # Root's limit is Debian's 128, the attaches ran while the probe looked
    # (more than 32 at once), none of its tries was refused, and ours held
    # at most 32 instances between them.
    [[ $(sysctl -n fs.inotify.max_user_instances) == 128 ]] ||
        fail "$what: root's inotify limit is $(sysctl -n fs.inotify.max_user_instances), not Debian's 128: the probe proves nothing"
    python3 -c '
import json, sys
p = json.loads(sys.argv[1])
sys.exit(0 if p["refused"] == 0 and p["tries"] > 0 and p["max_attaching"] > 32 and p["max_ours"] <= 32 else 1)' "$probe" ||
        fail "$what: a root service was refused inotify instances, ours held more than 32, or fewer than 33 attaches ran at once while it looked: $probe"
    udevadm settle --timeout=60 || true
    udev_ns=$(systemctl show -p CPUUsageNSec --value systemd-udevd.service)
    target_us=$(systemctl show -p ActiveEnterTimestampMonotonic --value sparse-volumes.target)
    boot=$(systemd-analyze 2>/dev/null | head -n 1 || true)
    log "$what: $registered registered, $attached enabled attached once with their links; sparse-volumes.target active at $((target_us / 1000)) ms; udev CPU $((udev_ns / 1000000)) ms; inotify probe: $probe; $boot"
    echo "SCALE what=$what volumes=$attached udev_cpu_ms=$((udev_ns / 1000000)) target_ms=$((target_us / 1000)) probe=$probe" >>/root/endurance-results
    metrics_at_boot "$what"
    # Measured on the next boot again, from its start.
    rm -f /root/inotify-probe.json
}

# The metrics timer wrote its textfile at this boot, with I/O series for
# every attached volume (all the enabled ones, as verify_scale found).
metrics_at_boot() {
    local what=$1 file=/var/lib/prometheus/node-exporter/sparse_volume.prom booted i with_io
    booted=$(($(date +%s) - $(cut -d. -f1 /proc/uptime)))
    for ((i = 0; i < 180; i++)); do
        [[ -e $file && $(stat -c %Y "$file") -ge $booted ]] && break
        sleep 1
    done
    [[ -e $file && $(stat -c %Y "$file") -ge $booted ]] ||
        fail "$what: the metrics timer wrote no textfile within 3 minutes of this boot: $(systemctl status sparse-volume-metrics.service --no-pager 2>&1 | tail -n 5)"
    with_io=$(python3 - "$file" "$VOLUMES_D" <<'EOF'
import glob, re, sys, tomllib

text = open(sys.argv[1]).read()
with_io = set(re.findall(r'^sparse_volume_written_bytes_total\{uuid="([^"]+)"', text, re.M))
enabled = []
for path in glob.glob(sys.argv[2] + "/*.toml"):
    with open(path, "rb") as f:
        volume = tomllib.load(f)
    if volume.get("enabled", True):
        enabled.append(volume["uuid"])
missing = [uuid for uuid in enabled if uuid not in with_io]
if missing:
    sys.exit(f"{len(missing)} of {len(enabled)} attached volumes have no I/O series in the textfile, e.g. {missing[:3]}")
print(len(with_io))
EOF
    ) || fail "$what: the metrics textfile at boot: see above"
    log "$what: the metrics timer's textfile of this boot has I/O series for all $with_io attached volumes"
    echo "METRICS what=$what volumes_with_io=$with_io" >>/root/endurance-results
}

share_partition_names() {
    local file uuid device n=0
    for file in $(grep -l '^name = "scale-' "$VOLUMES_D"/*.toml); do
        uuid=$(basename "$file" .toml)
        [[ $(field "$uuid" mode) == block ]] || continue
        device=$(losetup --noheadings -O NAME -j "$(field "$uuid" path)")
        sgdisk -c 1:sparse-volume "$device" >/dev/null
        n=$((n + 1))
    done
    udevadm settle --timeout=60 || true
    log "$n block volumes' partitions now all named sparse-volume (as made before 0.3)"
}

case $phase in
library) return 0 2>/dev/null || exit 0 ;;
setup) setup ;;
churn) churn "${2:?cut}" "${3:?seed}" ;;
verify-cut) verify_cut "${2:?cut}" "${3:?tenths of a second}" ;;
remove-package) remove_package ;;
verify-removed) verify_removed ;;
scale-setup) scale_setup "${2:?count}" ;;
verify-scale) verify_scale "${2:?what}" ;;
share-partition-names) share_partition_names ;;
*) fail "unknown phase $phase" ;;
esac
