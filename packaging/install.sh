#!/usr/bin/env bash
# Builds the packages from this tree and installs the .deb on this machine:
#
#   packaging/install.sh
#
# For Debian 12 (or a derivative) as root, with a Rust toolchain. Installs
# the build tools from Debian, runs build-packages.sh, then lets apt-get
# install target/packages/sparse-volume_<version>-1_<arch>.deb with its
# dependencies. Re-running it upgrades in place, or installs the package
# again when the version did not change (a build from an edited tree):
# attached volumes stay attached (the package only reloads systemd).
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
TOP=$(cd "$HERE/.." && pwd)
OUT=${CARGO_TARGET_DIR:-$TOP/target}/packages

die() {
    printf 'install: %s\n' "$*" >&2
    exit 1
}

install_build_tools() {
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    # dpkg-deb and dpkg-shlibdeps, rpmbuild, strip.
    apt-get install -y -q --no-install-recommends dpkg-dev rpm binutils
}

# apt-get installs the file with its dependencies. --reinstall: without it,
# a package rebuilt from an edited tree but of the installed version is
# "already the newest version" and stays as it was; with it, apt-get
# installs it again (and installs or upgrades as usual otherwise).
install_deb() {
    apt-get install -y -q --reinstall "$1"
}

main() {
    [[ $EUID -eq 0 ]] || die "run as root: it installs packages"
    command -v cargo >/dev/null || die "cargo not found: install a Rust toolchain first"
    install_build_tools
    "$HERE/build-packages.sh"

    local debs=("$OUT"/sparse-volume_*_"$(dpkg --print-architecture)".deb)
    [[ ${#debs[@]} -eq 1 && -f ${debs[0]} ]] || die "expected one .deb in $OUT"
    # An absolute path makes apt-get treat it as a file, not a package name.
    install_deb "${debs[0]}"
    echo "installed ${debs[0]##*/}; see man sparse-volume"
}

main "$@"
