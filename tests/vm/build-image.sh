#!/usr/bin/env bash
# Builds a base image of the sparse-volume test VM into OUTDIR, which must
# exist and be empty. The Debian release is SV_VM_SUITE: bookworm (Debian
# 12, the default) or trixie (Debian 13); one recipe serves both.
#
#   OUTDIR/root.qcow2          4 GiB ext4 root disk (filesystem UUID below)
#   OUTDIR/vmlinuz             kernel, for qemu -kernel
#   OUTDIR/initrd.img          initrd, for qemu -initrd
#   OUTDIR/id_ed25519{,.pub}   SSH key pair; the public key is root's in the guest
#   OUTDIR/image.env           facts about the image, sourced by lib.sh
#   OUTDIR/build.log           mmdebstrap's output
#
# Usage: build-image.sh OUTDIR      (as root; needs mmdebstrap, e2fsprogs,
#                                    qemu-utils, openssh-client)
#
# Normally run by vm_image_build in lib.sh, which caches the result under a
# hash of this file and packages.txt: every change here rebuilds the image.
set -euo pipefail

readonly SUITE=${SV_VM_SUITE:-bookworm}
readonly ROOT_UUID=5e1f0c3a-7b2d-4c8e-9a61-0d3b5f7e2c94
readonly DISK_SIZE=4G
readonly GUEST_HOSTNAME=sv-test
readonly SOURCES_FILE=/etc/apt/sources.list.d/debian.sources

HERE=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)
readonly HERE

# vm__remove_tree: the harness's safe removal of a bootstrap tree.
# shellcheck source=tests/vm/lib.sh
. "$HERE/lib.sh"

log() { printf '%s build-image: %s\n' "$(date +%T)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# The mirror URL: $SV_VM_MIRROR, else the URIs: of the stanza of
# debian.sources whose Suites: names $SUITE, else the one that names the
# host's own release (one Debian archive serves every release), else a
# matching line of sources.list.
mirror_url() {
    if [[ -n ${SV_VM_MIRROR:-} ]]; then
        printf '%s\n' "$SV_VM_MIRROR"
        return
    fi
    local url="" suite host_suite
    # shellcheck source=/dev/null
    host_suite=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
    for suite in "$SUITE" "$host_suite"; do
        [[ -n $suite && -z $url ]] || continue
        if [[ -r $SOURCES_FILE ]]; then
            # deb822: stanzas separated by blank lines.
            url=$(awk -v suite="$suite" '
                function stanza_end() { if (ok && uri != "" && !found) { print uri; found = 1 } ok = 0; uri = "" }
                /^[ \t]*$/              { stanza_end(); next }
                tolower($1) == "uris:"   { uri = $2 }
                tolower($1) == "suites:" { for (i = 2; i <= NF; i++) if ($i == suite) ok = 1 }
                END                      { stanza_end() }
            ' "$SOURCES_FILE")
        fi
        if [[ -z $url && -r /etc/apt/sources.list ]]; then
            url=$(awk -v suite="$suite" '$1 == "deb" && $3 == suite { print $2; exit }' \
                /etc/apt/sources.list)
        fi
    done
    [[ -n $url ]] || die "no Debian mirror for '$SUITE' or '$host_suite' in $SOURCES_FILE; set SV_VM_MIRROR"
    printf '%s\n' "$url"
}

# packages.txt without comments and blank lines, comma-separated.
package_list() {
    sed -e 's/#.*//' -e 's/[[:space:]]//g' -e '/^$/d' "$HERE/packages.txt" | paste -sd, -
}

check_tools() {
    local tool
    for tool in mmdebstrap mkfs.ext4 e2fsck qemu-img ssh-keygen; do
        command -v "$tool" >/dev/null ||
            die "missing host tool: $tool (apt-get install -y mmdebstrap e2fsprogs qemu-utils openssh-client)"
    done
    [[ $(id -u) == 0 ]] || die "must run as root"
}

# Debootstraps the root file system into $1. The setup hooks run before any
# package is installed, so the kernel's first initrd is already the small
# one: under TCG every module the initrd loads costs seconds.
# shellcheck disable=SC2016 # the hooks' "$1" is expanded by mmdebstrap's sh
bootstrap() {
    local rootfs=$1 log_file=$2 mirror
    mirror=$(mirror_url)
    log "mmdebstrap $SUITE from $mirror"
    if ! mmdebstrap --variant=minbase --include="$(package_list)" \
        --setup-hook='mkdir -p "$1/etc/initramfs-tools/conf.d" "$1/usr/share/initramfs-tools/modules.d"' \
        --setup-hook='echo MODULES=list > "$1/etc/initramfs-tools/conf.d/sparse-volume-vm.conf"' \
        --setup-hook='printf "virtio_pci\nvirtio_blk\n" > "$1/usr/share/initramfs-tools/modules.d/sparse-volume-vm"' \
        "$SUITE" "$rootfs" "deb $mirror $SUITE main" >"$log_file" 2>&1; then
        tail -n 30 "$log_file" >&2
        die "mmdebstrap failed (full log: $log_file)"
    fi
}

write_file() {
    local path=$1 mode=$2
    mkdir -p "$(dirname "$path")"
    cat >"$path"
    chmod "$mode" "$path"
}

configure_system() {
    local root=$1
    echo "$GUEST_HOSTNAME" | write_file "$root/etc/hostname" 0644
    printf '127.0.0.1\tlocalhost\n127.0.1.1\t%s\n' "$GUEST_HOSTNAME" |
        write_file "$root/etc/hosts" 0644
    printf 'UUID=%s\t/\text4\terrors=remount-ro\t0\t1\n' "$ROOT_UUID" |
        write_file "$root/etc/fstab" 0644
    # A fixed machine-id: an empty one would make every boot of a fresh
    # overlay a "first boot" (preset-all re-enables what is masked below).
    tr -d '-' </proc/sys/kernel/random/uuid | write_file "$root/etc/machine-id" 0444
    # Persistent journal, so `journalctl -b -1` reads the previous boot.
    mkdir -p "$root/var/log/journal"
    printf '[Journal]\nStorage=persistent\n' |
        write_file "$root/etc/systemd/journald.conf.d/sparse-volume-vm.conf" 0644
    # Nothing periodic that could disturb a test, and no boot work the tests
    # don't need (under TCG each of these costs seconds: a module load at
    # boot took 6-7 s on the Debian 13 guest). dm_mod and fuse still load on
    # demand (their /dev nodes autoload them); nothing here uses configfs,
    # pstore or a display.
    systemctl --root="$root" --quiet mask apt-daily.timer apt-daily-upgrade.timer \
        man-db.timer e2scrub_all.timer e2scrub_reap.service fstrim.timer \
        modprobe@dm_mod.service modprobe@fuse.service modprobe@configfs.service \
        modprobe@drm.service modprobe@efi_pstore.service
}

configure_network() {
    local root=$1
    write_file "$root/etc/systemd/network/20-sv-wired.network" 0644 <<'EOF'
[Match]
Name=en* eth*

[Network]
DHCP=ipv4
LinkLocalAddressing=no
IPv6AcceptRA=no
EOF
    systemctl --root="$root" --quiet enable systemd-networkd.service
    # Nothing in the image needs network-online.target; don't let it wait.
    systemctl --root="$root" --quiet mask systemd-networkd-wait-online.service
}

configure_ssh() {
    local root=$1 pubkey=$2
    install -d -m 0700 "$root/root/.ssh"
    write_file "$root/root/.ssh/authorized_keys" 0600 <"$pubkey"
    write_file "$root/etc/ssh/sshd_config.d/sparse-volume-vm.conf" 0644 <<'EOF'
PermitRootLogin prohibit-password
PasswordAuthentication no
UseDNS no
EOF
}

# Copies the kernel and initrd out of /boot and records image facts.
export_boot_files() {
    local root=$1 out=$2 kernels
    kernels=("$root"/boot/vmlinuz-*)
    [[ ${#kernels[@]} == 1 && -f ${kernels[0]} ]] ||
        die "expected exactly one kernel in /boot, found: ${kernels[*]}"
    local version=${kernels[0]##*/vmlinuz-}
    cp "${kernels[0]}" "$out/vmlinuz"
    cp "$root/boot/initrd.img-$version" "$out/initrd.img"
    cat >"$out/image.env" <<EOF
SV_VM_ROOT_UUID=$ROOT_UUID
SV_VM_SUITE=$SUITE
SV_VM_KERNEL_VERSION=$version
SV_VM_IMAGE_BUILT=$(date -u +%Y-%m-%dT%H:%M:%SZ)
EOF
    log "kernel $version, initrd $(du -h "$out/initrd.img" | cut -f1)"
}

# ext4 populated straight from the directory (mkfs.ext4 -d): no loop
# device and no mount on the host.
make_disk() {
    local root=$1 out=$2 raw=$2/scratch/root.raw
    truncate -s "$DISK_SIZE" "$raw"
    mkfs.ext4 -q -F -L sv-root -U "$ROOT_UUID" -d "$root" "$raw"
    local fsck_out
    fsck_out=$(e2fsck -fn "$raw" 2>&1) || {
        printf '%s\n' "$fsck_out" >&2
        die "e2fsck found problems in the new root file system"
    }
    qemu-img convert -f raw -O qcow2 "$raw" "$out/root.qcow2"
    rm -f "$raw"
    log "root disk $(du -h "$out/root.qcow2" | cut -f1) used of $DISK_SIZE"
}

main() {
    [[ $# == 1 && -d $1 ]] || die "usage: build-image.sh OUTDIR (an existing, empty directory)"
    local out work
    out=$(cd -- "$1" && pwd)
    work=$out/scratch
    check_tools
    mkdir "$work"
    WORK=$work
    trap 'vm__remove_tree "$WORK"' EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM

    ssh-keygen -q -t ed25519 -N '' -C sparse-volume-vm -f "$out/id_ed25519"
    bootstrap "$work/rootfs" "$out/build.log"
    configure_system "$work/rootfs"
    configure_network "$work/rootfs"
    configure_ssh "$work/rootfs" "$out/id_ed25519.pub"
    export_boot_files "$work/rootfs" "$out"
    make_disk "$work/rootfs" "$out"
}

main "$@"
