# shellcheck shell=bash
# Test VM harness of sparse-volume: a Debian 12 guest under qemu, driven
# over SSH. Source this file from bash (it sets no shell options itself):
#
#   . tests/vm/lib.sh
#   trap vm_cleanup EXIT
#   vm_start 1G                 # builds or reuses the image, boots, waits for SSH
#   vm_ssh 'uname -r'
#   vm_reboot
#   vm_stop
#
# Call vm_start in the main shell, not in $(...) or a pipeline: it sets the
# globals the other functions use. Every function logs to stderr with a
# timestamp and returns non-zero on failure (after printing the tail of the
# guest's serial console when there is one). See README.md beside this file.

SV_VM_LIB_DIR=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)

# Settings (environment variables; defaults below).
: "${SV_VM_CACHE:=/var/cache/sparse-volume-vm}"  # where base images are kept
: "${SV_VM_REBUILD:=0}"            # 1: rebuild the image even if cached
: "${SV_VM_SUITE:=bookworm}"       # Debian release of the guest: bookworm or trixie
: "${SV_VM_ACCEL:=auto}"           # auto | tcg | kvm
: "${SV_VM_MEM:=2048}"             # guest memory, MiB
: "${SV_VM_CPUS:=2}"               # guest vCPUs
: "${SV_VM_DATA_DISKS:=}"          # sizes of extra disks, e.g. "1G 512M@4k"
: "${SV_VM_BOOT_TIMEOUT:=180}"     # s until SSH must answer after qemu starts
: "${SV_VM_KVM_PROBE_TIMEOUT:=40}" # s a KVM boot gets before auto falls back to TCG
: "${SV_VM_REBOOT_TIMEOUT:=180}"   # s for a reboot cycle
: "${SV_VM_STOP_TIMEOUT:=60}"      # s for a clean poweroff before qemu is killed
: "${SV_VM_APPEND:=}"              # extra kernel command line, e.g. systemd.log_level=debug
: "${SV_VM_EXTRA_PACKAGES:=}"      # more Debian packages in an image of its own, e.g. "fio"
: "${SV_VM_SERIAL_TAIL:=40}"       # lines of serial console shown on failure
: "${SV_VM_KEEP:=0}"               # 1: vm_cleanup keeps the run directory

# State, set by vm_image_build and vm_start.
SV_VM_IMAGE=""        # cache directory of the base image in use
SV_VM_RUN=""          # run directory: overlay, disks, pid, QMP socket, logs
SV_VM_PID=""          # pid of the qemu process this shell started
SV_VM_PORT=""         # host port (127.0.0.1) forwarded to the guest's sshd
SV_VM_ACCEL_USED=""   # accelerator of the running VM: tcg or kvm
SV_VM_SSH_OPTS=()     # ssh/scp options (key, no host key checks, timeouts)
SV_VM_SSH_CMD=()      # ssh command line up to (and including) the "--"

# ---------------------------------------------------------------- logging

vm_log() { printf '%s vm: %s\n' "$(date +%T.%3N)" "$*" >&2; }

vm__now_ms() { echo $(($(date +%s%N) / 1000000)); }

# Seconds since a vm__now_ms value, with one decimal: "12.3s".
vm__since() {
    local ms=$(($(vm__now_ms) - $1))
    printf '%d.%ds' $((ms / 1000)) $((ms % 1000 / 100))
}

# vm_serial_tail [LINES]: prints the end of the guest's serial console log.
vm_serial_tail() {
    local lines=${1:-$SV_VM_SERIAL_TAIL} file=${SV_VM_RUN:+$SV_VM_RUN/serial.log}
    [[ -n $file && -s $file ]] || return 0
    vm_log "last $lines lines of the serial console ($file):"
    tail -n "$lines" "$file" | tr -d '\r' |
        sed -e 's/\x1b\[[0-9;:]*m//g' -e 's/^/    | /' | awk 1 >&2
}

vm__fail() {
    vm_log "ERROR: $*"
    vm_serial_tail
    if [[ -n $SV_VM_RUN && -s $SV_VM_RUN/qemu.log ]]; then
        vm_log "qemu's own output:"
        tail -n 20 "$SV_VM_RUN/qemu.log" | sed 's/^/    | /' >&2
    fi
    return 1
}

# vm__need_tools TOOL...: fails, naming the Debian packages, if any is missing.
vm__need_tools() {
    local tool missing=()
    for tool in "$@"; do
        command -v "$tool" >/dev/null || missing+=("$tool")
    done
    ((${#missing[@]} == 0)) && return 0
    vm_log "ERROR: missing host tools: ${missing[*]}"
    vm_log "install: apt-get install -y qemu-system-x86 qemu-utils mmdebstrap openssh-client (see tests/vm/README.md)"
    return 1
}

# ------------------------------------------------------------------ image

# The cache key: the release and a hash of the files that define the
# image, e.g. "trixie-0123456789abcdef".
vm__recipe_key() {
    [[ $SV_VM_SUITE =~ ^[a-z]+$ ]] || {
        vm_log "ERROR: SV_VM_SUITE must be a Debian code name such as bookworm or trixie, not '$SV_VM_SUITE'"
        return 1
    }
    [[ $SV_VM_EXTRA_PACKAGES =~ ^[a-z0-9.+-]*( [a-z0-9.+-]+)*$ ]] || {
        vm_log "ERROR: SV_VM_EXTRA_PACKAGES must be Debian package names separated by spaces, not '$SV_VM_EXTRA_PACKAGES'"
        return 1
    }
    local hash
    hash=$( (cd -- "$SV_VM_LIB_DIR" && sha256sum build-image.sh packages.txt &&
        if [[ -n $SV_VM_EXTRA_PACKAGES ]]; then echo "$SV_VM_EXTRA_PACKAGES"; fi) |
        sha256sum | cut -c1-16) || return 1
    # An image with extra packages (a benchmark's) has a name of its own,
    # so it never replaces, nor is pruned as, the suite's test image.
    if [[ -n $SV_VM_EXTRA_PACKAGES ]]; then
        echo "$SV_VM_SUITE+${SV_VM_EXTRA_PACKAGES// /+}-$hash"
    else
        echo "$SV_VM_SUITE-$hash"
    fi
}

vm__use_image() {
    SV_VM_IMAGE=$1
    # shellcheck source=/dev/null
    . "$SV_VM_IMAGE/image.env"
}

# vm_image_build: builds the base image, or reuses the cached one, and
# makes it the one vm_start boots. Builds go to a temporary directory that
# is renamed into place only when complete, under a lock.
vm_image_build() {
    local hash dir start lock_fd
    vm__need_tools sha256sum flock || return 1
    hash=$(vm__recipe_key) || return 1
    dir=$SV_VM_CACHE/$hash
    if [[ $SV_VM_REBUILD != 1 && -f $dir/image.env ]]; then
        vm_log "image: cache hit, $dir"
        vm__use_image "$dir"
        return 0
    fi
    mkdir -p -- "$SV_VM_CACHE" || return 1
    exec {lock_fd}>"$SV_VM_CACHE/.lock" || return 1
    if ! flock -n "$lock_fd"; then
        vm_log "image: waiting for another build ($SV_VM_CACHE/.lock)"
        flock -w 900 "$lock_fd" || {
            exec {lock_fd}>&-
            vm_log "ERROR: $SV_VM_CACHE/.lock still held after 900s"
            return 1
        }
    fi
    if [[ $SV_VM_REBUILD != 1 && -f $dir/image.env ]]; then
        vm_log "image: built meanwhile by another process, $dir"
    else
        start=$(vm__now_ms)
        vm_log "image: cache miss, building $dir"
        if ! vm__build_locked "$hash" "$dir"; then
            exec {lock_fd}>&-
            vm_log "ERROR: image build failed after $(vm__since "$start")"
            return 1
        fi
        vm_log "image: built in $(vm__since "$start"), $dir"
        vm__prune_images "$hash"
    fi
    exec {lock_fd}>&-
    vm__use_image "$dir"
}

# Images of older recipes of the same release are never booted again; at
# ~0.5 GB each they would pile up on a machine that keeps its cache. The
# other releases' images stay, and so does every image with extra packages
# when the test image is built, and the reverse. Called under the lock.
vm__prune_images() {
    local keep=$1 old name
    for old in "$SV_VM_CACHE"/*; do
        name=${old##*/}
        # Unprefixed names are images of recipes older than the release prefix.
        [[ -d $old && $name != "$keep" ]] || continue
        if [[ -n $SV_VM_EXTRA_PACKAGES ]]; then
            [[ $name == "${keep%-*}-"* ]] || continue
        else
            [[ $name =~ ^${SV_VM_SUITE}-[0-9a-f]{16}$ || $name =~ ^[0-9a-f]{16}$ ]] || continue
        fi
        vm_log "image: removing the outdated image $old"
        rm -rf --one-file-system -- "$old"
    done
}

# Removes a directory tree that a killed mmdebstrap may have left with
# /proc, /sys or /dev nodes mounted inside: unmounts those first, and never
# crosses into another file system.
vm__remove_tree() {
    local dir=$1 mnt
    [[ -e $dir ]] || return 0
    awk -v d="$dir/" 'index($5, d) == 1 { print $5 }' /proc/self/mountinfo |
        sort -r | while read -r mnt; do umount -l -- "$mnt" || true; done
    rm -rf --one-file-system -- "$dir"
}

# Runs with the cache lock held.
vm__build_locked() {
    local hash=$1 dir=$2 tmp old
    # Left-overs of killed builds: nobody else can be building now.
    for old in "$SV_VM_CACHE"/.build-* "$SV_VM_CACHE"/.old-*; do
        vm__remove_tree "$old"
    done
    tmp=$(mktemp -d "$SV_VM_CACHE/.build-$hash.XXXXXX") || return 1
    local recipe=$SV_VM_LIB_DIR
    if [[ -n $SV_VM_EXTRA_PACKAGES ]]; then
        # The recipe with the extra packages appended, beside a copy of the
        # script and the library it sources (it reads packages.txt beside itself).
        recipe=$tmp.recipe
        mkdir -p -- "$recipe" && cp -- "$SV_VM_LIB_DIR/build-image.sh" "$SV_VM_LIB_DIR/lib.sh" "$SV_VM_LIB_DIR/packages.txt" "$recipe/" &&
            printf '%s\n' $SV_VM_EXTRA_PACKAGES >>"$recipe/packages.txt" || return 1
    fi
    if ! SV_VM_SUITE=$SV_VM_SUITE bash "$recipe/build-image.sh" "$tmp"; then
        [[ $recipe == "$SV_VM_LIB_DIR" ]] || rm -rf -- "$recipe"
        vm__remove_tree "$tmp"
        return 1
    fi
    [[ $recipe == "$SV_VM_LIB_DIR" ]] || rm -rf -- "$recipe"
    if [[ -e $dir ]]; then
        old=$SV_VM_CACHE/.old-$hash.$$
        mv -T -- "$dir" "$old" || return 1
        mv -T -- "$tmp" "$dir" || return 1
        rm -rf -- "$old"
    else
        mv -T -- "$tmp" "$dir" || return 1
    fi
}

# ------------------------------------------------------------------- qemu

# True while the qemu of this run is alive (a recycled pid whose command
# line does not name our run directory does not count).
vm__qemu_alive() {
    local pid=${1:-$SV_VM_PID} cmdline
    [[ -n $pid && -r /proc/$pid/cmdline ]] || return 1
    cmdline=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) || return 1
    [[ -n $SV_VM_RUN && $cmdline == *"$SV_VM_RUN/"* ]]
}

vm__port_in_use() {
    local hex
    hex=$(printf '%04X' "$1")
    grep -qs ":$hex " /proc/net/tcp /proc/net/tcp6
}

vm__free_port() {
    local port try
    for try in {1..100}; do
        port=$((20000 + (RANDOM * 32768 + RANDOM) % 40000))
        if ! vm__port_in_use "$port"; then
            echo "$port"
            return 0
        fi
    done
    vm_log "ERROR: no free TCP port found (tried $try)"
    return 1
}

# Creates the run's disks: a fresh overlay on the base image, and empty
# (sparse) data disks of the given sizes. A size may end in @BLOCKSIZE
# ("1G@4k", "1G@4096", "1G@512"): the disk then reports that logical and
# physical block size to the guest (recorded in dataN.bs for vm__qemu_cmd).
vm__make_disks() {
    local i=1 spec size bs
    rm -f -- "$SV_VM_RUN"/root.qcow2 "$SV_VM_RUN"/data*.raw "$SV_VM_RUN"/data*.bs
    qemu-img create -q -f qcow2 -F qcow2 -b "$SV_VM_IMAGE/root.qcow2" \
        "$SV_VM_RUN/root.qcow2" || return 1
    for spec in "$@"; do
        size=${spec%%@*}
        if [[ $spec == *@* ]]; then
            bs=${spec#*@}
            case $bs in
            4k | 4K) bs=4096 ;;
            512 | 1024 | 2048 | 4096) ;;
            *)
                vm_log "ERROR: data disk '$spec': block size must be 512, 1024, 2048, 4096 or 4k"
                return 1
                ;;
            esac
            echo "$bs" >"$SV_VM_RUN/data$i.bs"
        fi
        truncate -s "$size" "$SV_VM_RUN/data$i.raw" || return 1
        i=$((i + 1))
    done
}

# The qemu command line for accelerator $1 and the disks of the run.
# Disks are explicit virtio-blk devices in a fixed order: vda is the root
# disk (serial sv-root), vdb, vdc... the data disks (serial sv-dataN, so
# /dev/disk/by-id/virtio-sv-dataN in the guest), with the block size of
# dataN.bs when there is one.
# TCG: a 128 MiB translation cache instead of the default 1 GiB made
# reboots faster and steadier here (19-27 s against 25-48 s).
vm__qemu_cmd() {
    local accel=$1 cpu=max disk i bs
    case $accel in
    kvm) cpu=host ;;
    tcg) accel=tcg,tb-size=128 ;;
    esac
    VM__QEMU=(
        qemu-system-x86_64 -name sparse-volume-test -nodefaults -no-user-config
        -machine q35 -accel "$accel" -cpu "$cpu" -smp "$SV_VM_CPUS" -m "$SV_VM_MEM"
        -display none -serial "file:$SV_VM_RUN/serial.log"
        -qmp "unix:$SV_VM_RUN/qmp.sock,server=on,wait=off"
        -kernel "$SV_VM_IMAGE/vmlinuz" -initrd "$SV_VM_IMAGE/initrd.img"
        -append "root=UUID=$SV_VM_ROOT_UUID ro console=ttyS0,115200 net.ifnames=0 $SV_VM_APPEND"
        -drive "if=none,id=root,format=qcow2,file=$SV_VM_RUN/root.qcow2,cache=unsafe"
        -device "virtio-blk-pci,drive=root,serial=sv-root"
    )
    for ((i = 1; ; i++)); do
        disk=$SV_VM_RUN/data$i.raw
        [[ -e $disk ]] || break
        bs=""
        if [[ -s $SV_VM_RUN/data$i.bs ]]; then
            bs=$(<"$SV_VM_RUN/data$i.bs")
            bs=",logical_block_size=$bs,physical_block_size=$bs"
        fi
        VM__QEMU+=(
            -drive "if=none,id=data$i,format=raw,file=$disk,cache=unsafe"
            -device "virtio-blk-pci,drive=data$i,serial=sv-data$i$bs"
        )
    done
    VM__QEMU+=(
        -netdev "user,id=net0,restrict=on,hostfwd=tcp:127.0.0.1:$SV_VM_PORT-:22"
        -device "virtio-net-pci,netdev=net0"
        -device virtio-rng-pci
    )
}

# Starts qemu in the background, detached from this shell (started from a
# subshell, so it is nobody's job: no zombie, no job messages); its pid goes
# to qemu.pid. Fails if qemu exits within its first second (bad option,
# port taken, accelerator refused).
vm__launch() {
    local accel=$1
    vm__qemu_cmd "$accel"
    : >"$SV_VM_RUN/serial.log"
    rm -f -- "$SV_VM_RUN/qemu.pid"
    (
        "${VM__QEMU[@]}" </dev/null >"$SV_VM_RUN/qemu.log" 2>&1 &
        echo $! >"$SV_VM_RUN/qemu.pid"
    )
    SV_VM_PID=$(<"$SV_VM_RUN/qemu.pid")
    echo "$SV_VM_PORT" >"$SV_VM_RUN/ssh.port"
    sleep 1
    vm__qemu_alive
}

# Kills the qemu of this run (TERM, then KILL).
vm__kill_qemu() {
    local pid=$SV_VM_PID i
    [[ -n $pid ]] || return 0
    if vm__qemu_alive "$pid"; then
        kill -TERM "$pid" 2>/dev/null || true
        for i in {1..50}; do
            vm__qemu_alive "$pid" || break
            sleep 0.2
        done
        if vm__qemu_alive "$pid"; then
            kill -KILL "$pid" 2>/dev/null || true
            sleep 0.2
        fi
    fi
    SV_VM_PID=""
    rm -f -- "$SV_VM_RUN/qemu.pid"
}

# ssh options fit for a throw-away guest behind a forwarded port.
vm__set_ssh_cmd() {
    SV_VM_SSH_OPTS=(
        -F /dev/null -i "$SV_VM_IMAGE/id_ed25519"
        -o IdentitiesOnly=yes -o BatchMode=yes
        -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null
        -o GlobalKnownHostsFile=/dev/null -o LogLevel=ERROR
        -o ConnectTimeout=10 -o ServerAliveInterval=5 -o ServerAliveCountMax=3
    )
    SV_VM_SSH_CMD=(ssh "${SV_VM_SSH_OPTS[@]}" -p "$SV_VM_PORT" root@127.0.0.1 --)
}

# One bounded attempt: does the guest's sshd answer, and with which boot_id?
# (A shorter ConnectTimeout: the first value of an ssh option wins.)
vm__try_boot_id() {
    timeout 10 ssh -o ConnectTimeout=4 "${SV_VM_SSH_CMD[@]:1}" \
        cat /proc/sys/kernel/random/boot_id </dev/null 2>/dev/null
}

# How many times a kernel started on the serial console.
vm__serial_boots() {
    grep -c 'Linux version' "$SV_VM_RUN/serial.log" 2>/dev/null || true
}

# The serial console since the last kernel started, without colours.
vm__serial_this_boot() {
    tr -d '\r' <"$SV_VM_RUN/serial.log" 2>/dev/null | sed -e 's/\x1b\[[0-9;:]*m//g' |
        awk '/Linux version/ { n = 0 } { line[n++] = $0 } END { for (i = 0; i < n; i++) print line[i] }'
}

# The console is searched without a pipe into `grep -q`: grep leaves at
# the first match, the writer then dies of SIGPIPE and, under pipefail, the
# pipeline says "not found" (tests/vm/console-selftest.sh).

# True when the running boot went to emergency mode: sshd is stopped there,
# so waiting for SSH would only run into the timeout.
vm__serial_emergency() {
    grep -q 'You are in emergency mode' <<<"$(vm__serial_this_boot)"
}

# The first line of the running boot's console that says a volume's device
# never came (the negative control's expected failure); false when none
# does. Names are cut short on the console ("dev-d…"), so the mounts that
# wait for the devices are matched too.
vm__serial_missing_device() {
    grep -E -m 1 'Timed out waiting for device .*/dev/disk/by-(part)?uuid/|Dependency failed for .*/srv/(consumer|block)' \
        <<<"$(vm__serial_this_boot)"
}

# True when the running boot's kernel panicked: nothing will answer again.
vm__serial_panicked() {
    grep -q 'Kernel panic - not syncing' <<<"$(vm__serial_this_boot)"
}

# True when a kernel of this run (any boot, any qemu) panicked.
vm_guest_panicked() {
    grep -q -s -- 'Kernel panic - not syncing' "$SV_VM_RUN"/serial.log*
}

# vm_status_after_panic RC: the exit status a VM script ends with after RC:
# 75 when a guest kernel of this run panicked (its whole oops printed), so
# that tests/run can tell a panic from a failed check and run that guest
# once more (a second panic fails the run); else RC.
vm_status_after_panic() {
    local rc=$1
    if ((rc != 0)) && [[ -n $SV_VM_RUN ]] && vm_guest_panicked; then
        vm_log "the guest kernel panicked in this run; its oops from the serial console:"
        vm_serial_oops
        rc=75
    fi
    echo "$rc"
}

# vm_serial_oops: every kernel oops of this run, whole (from its first line
# to the panic or the end of its trace), for the log: the last lines of the
# console alone miss where a trace starts and what it is.
vm_serial_oops() {
    local file
    for file in "$SV_VM_RUN"/serial.log.* "$SV_VM_RUN"/serial.log; do
        [[ -s $file ]] || continue
        tr -d '\r' <"$file" | sed -e 's/\x1b\[[0-9;:]*m//g' | awk -v file="${file##*/}" '
            /BUG:|Oops:|general protection fault|kernel BUG at|Unable to handle|WARNING: CPU:|Kernel panic - not syncing/ && !inside {
                inside = 1; warning = /WARNING: CPU:/; printed = 0; print "    | --- " file
            }
            inside && printed++ < 250 { print "    | " $0 }
            inside && (/end Kernel panic/ || (warning && /end trace/)) { inside = 0 }
        ' >&2
    done
}

# vm__wait_ssh TIMEOUT [OLD_BOOT_ID]: waits until SSH answers (with a
# boot_id other than OLD_BOOT_ID, if given), and leaves the boot_id in
# VM__BOOT_ID. Fails early if qemu exits. While waiting for a reboot, logs
# when the new kernel starts (the end of the shutdown).
vm__wait_ssh() {
    local timeout=$1 old=${2:-} start boots=-1 id
    start=$(vm__now_ms)
    [[ -z $old ]] || boots=$(vm__serial_boots)
    while :; do
        vm__qemu_alive || { vm_log "qemu exited"; return 1; }
        if ((boots >= 0 && $(vm__serial_boots) > boots)); then
            vm_log "shutdown done, new kernel booting ($(vm__since "$start"))"
            boots=-1
        fi
        if vm__serial_emergency; then
            vm_log "the guest went to emergency mode (no SSH there); this boot's failures on the console:"
            vm__serial_this_boot | grep -E 'Timed out|Dependency failed|FAILED' |
                sed 's/^/    | /' >&2 || true
            return 1
        fi
        if vm__serial_panicked; then
            vm_log "the guest kernel panicked (the oops is printed when the run ends)"
            return 1
        fi
        if id=$(vm__try_boot_id) && [[ -n $id && $id != "$old" ]]; then
            VM__BOOT_ID=$id
            return 0
        fi
        (($(vm__now_ms) - start < timeout * 1000)) || {
            vm_log "no SSH answer within ${timeout}s"
            return 1
        }
        sleep 1
    done
}

# What a failed KVM probe is remembered by: the host kernel and the qemu
# that failed. Another kernel or qemu probes again.
vm__kvm_verdict_file() { echo "$SV_VM_CACHE/kvm-failed"; }
vm__kvm_host() { echo "$(uname -r) $(qemu-system-x86_64 --version | head -n 1)"; }

# The accelerators to try, in order. A KVM probe that failed costs
# SV_VM_KVM_PROBE_TIMEOUT on every boot, so auto skips KVM where it failed
# before on the same host kernel and qemu.
vm__accels() {
    case $SV_VM_ACCEL in
    tcg) echo tcg ;;
    kvm) echo kvm ;;
    auto)
        if [[ ! -r /dev/kvm || ! -w /dev/kvm ]]; then
            echo tcg
        elif [[ $(cat "$(vm__kvm_verdict_file)" 2>/dev/null) == "$(vm__kvm_host)" ]]; then
            vm_log "KVM skipped: its boot failed before on this host ($(vm__kvm_verdict_file); SV_VM_ACCEL=kvm tries it)"
            echo tcg
        else
            echo kvm tcg
        fi
        ;;
    *)
        vm_log "ERROR: SV_VM_ACCEL must be auto, tcg or kvm, not '$SV_VM_ACCEL'"
        return 1
        ;;
    esac
}

# Boots with one accelerator on fresh disks; $2 is how long SSH may take.
vm__boot() {
    local accel=$1 timeout=$2 _
    shift 2
    vm__make_disks "$@" || return 1
    for _ in 1 2 3; do
        SV_VM_PORT=$(vm__free_port) || return 1
        vm__set_ssh_cmd
        vm_log "starting qemu ($accel, ${SV_VM_CPUS} vCPU, ${SV_VM_MEM} MiB, ssh on 127.0.0.1:$SV_VM_PORT)"
        vm__launch "$accel" && break
        vm__kill_qemu
        # A port taken between the check and the bind: try another one.
        grep -qs 'hostfwd\|host forwarding' "$SV_VM_RUN/qemu.log" || return 1
        vm_log "port $SV_VM_PORT was taken, retrying"
    done
    vm__qemu_alive && vm__wait_ssh "$timeout"
}

# vm_start [SIZE...]: boots a fresh VM (a new overlay on the base image)
# with extra empty data disks of the given sizes (default: $SV_VM_DATA_DISKS,
# e.g. "1G"; "1G@4k" is a disk with 4096-byte logical sectors), and waits
# until SSH answers. With SV_VM_ACCEL=auto it tries KVM first when /dev/kvm
# is usable (and did not fail before on this host) and falls back to TCG.
vm_start() {
    local sizes=("$@") accels accel start timeout
    if [[ $# == 0 && -n $SV_VM_DATA_DISKS ]]; then
        read -r -a sizes <<<"$SV_VM_DATA_DISKS"
    fi
    if [[ -n $SV_VM_PID ]] && vm__qemu_alive; then
        vm_log "ERROR: a VM is already running (pid $SV_VM_PID); vm_stop it first"
        return 1
    fi
    vm__need_tools qemu-system-x86_64 qemu-img ssh scp timeout || return 1
    [[ -n $SV_VM_IMAGE ]] || vm_image_build || return 1
    accels=$(vm__accels) || return 1
    [[ -n $SV_VM_RUN ]] || SV_VM_RUN=$(mktemp -d -t sv-vm.XXXXXX) || return 1
    vm_log "run directory $SV_VM_RUN, data disks: ${sizes[*]:-none}"
    for accel in $accels; do
        timeout=$SV_VM_BOOT_TIMEOUT
        [[ $accel == kvm && $accels == *tcg* ]] && timeout=$SV_VM_KVM_PROBE_TIMEOUT
        start=$(vm__now_ms)
        if vm__boot "$accel" "$timeout" "${sizes[@]}"; then
            # shellcheck disable=SC2034 # for the scripts that source this
            SV_VM_ACCEL_USED=$accel
            echo "$accel" >"$SV_VM_RUN/accel"
            vm_log "VM up: SSH answered $(vm__since "$start") after qemu started (accelerator: $accel)"
            return 0
        fi
        if [[ $accel == kvm && $accels == *tcg* ]]; then
            vm_log "KVM boot failed after $(vm__since "$start"); falling back to TCG"
            mkdir -p -- "$SV_VM_CACHE" && vm__kvm_host >"$(vm__kvm_verdict_file)"
            vm_serial_tail 5
            sed 's/^/    | /' "$SV_VM_RUN/qemu.log" | tail -n 5 >&2
            vm__kill_qemu
            continue
        fi
        vm__kill_qemu
        vm__fail "VM did not come up ($accel, $(vm__since "$start"))"
        return 1
    done
    return 1
}

vm__require_vm() {
    [[ -n $SV_VM_PID ]] && vm__qemu_alive && return 0
    vm__fail "no VM running (vm_start first)"
}

# ------------------------------------------------------------ guest access

# vm_ssh CMD...: runs CMD as root in the guest (ssh joins the words with
# spaces and the guest's shell parses them). stdin is passed through.
vm_ssh() {
    vm__require_vm || return 1
    "${SV_VM_SSH_CMD[@]}" "$@"
}

# vm_copy_in SRC... DST: copies local files or directories (recursively,
# keeping modes) to the guest path DST.
vm_copy_in() {
    (($# >= 2)) || { vm_log "usage: vm_copy_in SRC... DST"; return 1; }
    vm__require_vm || return 1
    local dst=${*: -1}
    local srcs=("${@:1:$#-1}")
    scp -q -r -p "${SV_VM_SSH_OPTS[@]}" -P "$SV_VM_PORT" -- "${srcs[@]}" "root@127.0.0.1:$dst"
}

# vm_install_files SRC DST MODE [SRC DST MODE]...: installs local files at
# absolute guest paths with the given modes (owner root; missing parent
# directories are created 0755, existing ones are left alone), in one SSH
# connection, then runs `systemctl daemon-reload`.
vm_install_files() {
    (($# > 0 && $# % 3 == 0)) || {
        vm_log "usage: vm_install_files SRC DST MODE [SRC DST MODE]..."
        return 1
    }
    vm__require_vm || return 1
    local stage paths=() rc=0
    stage=$(mktemp -d "$SV_VM_RUN/install.XXXXXX") || return 1
    while (($# > 0)); do
        [[ $2 == /* ]] || { vm_log "ERROR: guest path must be absolute: $2"; rc=1; break; }
        install -D -m "$3" -- "$1" "$stage$2" || { rc=1; break; }
        vm_log "install $1 -> $2 ($3)"
        paths+=(".$2")
        shift 3
    done
    if ((rc == 0)); then
        tar -C "$stage" --owner=0 --group=0 --numeric-owner -cf - -- "${paths[@]}" |
            vm_ssh 'tar -C / --no-overwrite-dir -xpf - && systemctl daemon-reload' || rc=1
    fi
    rm -rf -- "$stage"
    return "$rc"
}

# vm_boot_id: prints the guest's current boot_id.
vm_boot_id() {
    vm_ssh cat /proc/sys/kernel/random/boot_id </dev/null
}

# vm_reboot: clean reboot (systemctl reboot); returns when SSH answers
# again with a new boot_id, proving the reboot happened.
vm_reboot() {
    local old start
    if ! old=$(vm_boot_id) || [[ -z $old ]]; then
        vm__fail "cannot read boot_id before reboot"
        return 1
    fi
    start=$(vm__now_ms)
    vm_log "rebooting (boot_id $old)"
    vm_ssh 'systemctl --no-block reboot' </dev/null || true
    if ! vm__wait_ssh "$SV_VM_REBOOT_TIMEOUT" "$old"; then
        vm__fail "guest did not come back from reboot within ${SV_VM_REBOOT_TIMEOUT}s"
        return 1
    fi
    vm_log "rebooted in $(vm__since "$start") (boot_id $VM__BOOT_ID)"
}

# vm_power_cut OLD_BOOT_ID: cuts the power (QMP system_reset: the guest
# loses its memory, page cache and queued requests included, as in a power
# cut; what it had handed to qemu's disk reaches the image) and returns when
# SSH answers with a boot_id other than OLD_BOOT_ID. The boot_id is read by
# the caller beforehand, so the cut comes exactly when it chooses.
vm_power_cut() {
    local old=$1 start
    start=$(vm__now_ms)
    vm_qmp '{"execute":"system_reset"}' >/dev/null || {
        vm__fail "QMP system_reset failed"
        return 1
    }
    if ! vm__wait_ssh "$SV_VM_REBOOT_TIMEOUT" "$old"; then
        vm__fail "guest did not come back within ${SV_VM_REBOOT_TIMEOUT}s after the power cut"
        return 1
    fi
    vm_log "power cut, booted again in $(vm__since "$start") (boot_id $VM__BOOT_ID)"
}

# vm_restart [APPEND]: clean poweroff, then qemu again on the same disks
# (same accelerator and SSH port), with APPEND added to the kernel command
# line of this boot: a direct kernel boot keeps its command line across a
# `systemctl reboot`, so a switch typed "at the boot loader" for one boot
# needs a new qemu. Later vm_reboot calls keep APPEND; `vm_restart` without
# it goes back to $SV_VM_APPEND alone. Returns when SSH answers with a new
# boot_id. The previous boots' console is kept in serial.log.N.
vm_restart() {
    local append=${1:-} old start i keep=$SV_VM_APPEND rc=0
    if ! old=$(vm_boot_id) || [[ -z $old ]]; then
        vm__fail "cannot read boot_id before the restart"
        return 1
    fi
    start=$(vm__now_ms)
    vm_log "restarting with '${append:-nothing}' added to the kernel command line (boot_id $old)"
    timeout 30 "${SV_VM_SSH_CMD[@]}" 'systemctl --no-block poweroff' </dev/null >/dev/null 2>&1 || true
    for ((i = 0; i < SV_VM_STOP_TIMEOUT * 5; i++)); do
        vm__qemu_alive || break
        sleep 0.2
    done
    if vm__qemu_alive; then
        vm__fail "no poweroff within ${SV_VM_STOP_TIMEOUT}s before the restart"
        vm__kill_qemu
        return 1
    fi
    vm__kill_qemu
    vm_log "powered off in $(vm__since "$start")"
    for ((i = 1; ; i++)); do
        [[ -e $SV_VM_RUN/serial.log.$i ]] || break
    done
    cp -- "$SV_VM_RUN/serial.log" "$SV_VM_RUN/serial.log.$i" 2>/dev/null || true
    SV_VM_APPEND="$keep${keep:+ }$append"
    # The port was ours until qemu exited; a race for it is retried once.
    vm__launch "$SV_VM_ACCEL_USED" || {
        vm__kill_qemu
        SV_VM_PORT=$(vm__free_port) && vm__set_ssh_cmd && vm__launch "$SV_VM_ACCEL_USED"
    } || rc=1
    SV_VM_APPEND=$keep
    if ((rc != 0)) || ! vm__wait_ssh "$SV_VM_REBOOT_TIMEOUT" "$old"; then
        vm__fail "guest did not come back from the restart within ${SV_VM_REBOOT_TIMEOUT}s"
        return 1
    fi
    vm_log "restarted in $(vm__since "$start") (boot_id $VM__BOOT_ID)"
}

# vm_qmp JSON: sends one QMP command, e.g. '{"execute":"query-kvm"}', and
# prints the reply. Needs python3 or socat on the host.
vm_qmp() {
    vm__require_vm || return 1
    local sock=$SV_VM_RUN/qmp.sock
    if command -v python3 >/dev/null; then
        python3 - "$sock" "$1" <<'EOF'
import json, socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
f = s.makefile("rw")
f.readline()  # greeting
for cmd in ('{"execute":"qmp_capabilities"}', sys.argv[2]):
    f.write(cmd + "\n"); f.flush()
    while True:
        reply = json.loads(f.readline())
        if "event" not in reply:
            break
print(json.dumps(reply))
EOF
    elif command -v socat >/dev/null; then
        printf '{"execute":"qmp_capabilities"}\n%s\n' "$1" |
            socat -t 2 - "UNIX-CONNECT:$sock" | grep -v '"event"' | tail -n 1
    else
        vm_log "ERROR: vm_qmp needs python3 or socat"
        return 1
    fi
}

# ---------------------------------------------------------------- the end

# vm_stop: clean poweroff, bounded; then qemu is killed if still there.
# Idempotent. The run directory stays (vm_start reuses it, vm_cleanup
# removes it).
vm_stop() {
    local start i
    if [[ -z $SV_VM_PID ]] || ! vm__qemu_alive; then
        [[ -z $SV_VM_PID ]] || vm__kill_qemu
        return 0
    fi
    start=$(vm__now_ms)
    vm_log "powering off"
    timeout 30 "${SV_VM_SSH_CMD[@]}" 'systemctl --no-block poweroff' \
        </dev/null >/dev/null 2>&1 || true
    for ((i = 0; i < SV_VM_STOP_TIMEOUT * 5; i++)); do
        vm__qemu_alive || break
        sleep 0.2
    done
    if vm__qemu_alive; then
        vm_log "no poweroff within ${SV_VM_STOP_TIMEOUT}s; killing qemu (pid $SV_VM_PID)"
        vm_serial_tail 10
    fi
    vm__kill_qemu
    vm_log "stopped in $(vm__since "$start")"
}

# vm_package_under_test TARGET: prints the newest .deb in TARGET/packages
# (a cargo target directory), building the packages there first when it
# has none, and logs which one it is.
vm_package_under_test() {
    local target=$1 deb
    # shellcheck disable=SC2012 # the newest by time; the names have no newlines
    deb=$(ls -t "$target/packages"/sparse-volume_*_amd64.deb 2>/dev/null | head -n 1)
    if [[ -z $deb ]]; then
        CARGO_TARGET_DIR=$target "$SV_VM_LIB_DIR/../../packaging/build-packages.sh" >&2 || return 1
        # shellcheck disable=SC2012
        deb=$(ls -t "$target/packages"/sparse-volume_*_amd64.deb 2>/dev/null | head -n 1)
    fi
    [[ -n $deb ]] || {
        vm_log "ERROR: no $target/packages/sparse-volume_*_amd64.deb after packaging/build-packages.sh"
        return 1
    }
    vm_log "package under test: $deb ($(date -r "$deb" '+built %F %T'))"
    echo "$deb"
}

# vm_cleanup: for `trap vm_cleanup EXIT`. Kills the qemu this shell started
# (by its recorded pid) and removes the run directory (kept if
# SV_VM_KEEP=1). Keeps the exit status it was called with.
vm_cleanup() {
    local rc=$?
    if [[ -n $SV_VM_PID ]]; then
        if vm__qemu_alive; then
            vm_log "cleanup: killing qemu (pid $SV_VM_PID)"
        fi
        vm__kill_qemu
    fi
    if [[ -n $SV_VM_RUN && -d $SV_VM_RUN ]]; then
        if [[ $SV_VM_KEEP == 1 ]]; then
            vm_log "cleanup: keeping $SV_VM_RUN"
        else
            rm -rf -- "$SV_VM_RUN"
        fi
    fi
    SV_VM_RUN=""
    return "$rc"
}
