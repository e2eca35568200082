#!/usr/bin/env bash
# Builds the .deb and the .rpm of sparse-volume from this source tree:
#
#   packaging/build-packages.sh              binaries, staged tree, both packages
#   packaging/build-packages.sh binaries     cargo build only (the spec's %build)
#   packaging/build-packages.sh stage DIR    installs the built tree into DIR
#                                            (the spec's %install)
#   packaging/build-packages.sh licenses     after Cargo.lock changed: the
#                                            crates' paragraphs of
#                                            debian/copyright and the spec's
#                                            License: from cargo metadata
#
# writes target/packages/sparse-volume_<version>-<revision>_<arch>.deb and
# target/packages/sparse-volume-<version>-<revision>.<arch>.rpm (<version>
# from Cargo.toml; CARGO_TARGET_DIR moves target/; SV_PACKAGE_REVISION sets
# <revision>, default 1). Needs cargo, dpkg-dev (dpkg-deb, dpkg-shlibdeps),
# rpm (rpmbuild), binutils (strip) and gzip.
#
# Both packages hold one staged tree, without debhelper or a source
# package: release binaries, man pages and completions generated from the
# clap definitions (packaging/docgen), the units, a commented config.toml.
# The .rpm is built through packaging/rpm/sparse-volume.spec, whose %build
# and %install call this script back: cargo finds the binaries fresh, and
# `stage` is the one list of what gets installed, for both packages.
#
# Same commit, same bytes, wherever the tree, the target directory and
# CARGO_HOME are: dates come from the last commit, and rustc maps the build
# paths to fixed ones (packaging/check-reproducible.sh proves it).
set -euo pipefail

# Physical paths: rpmbuild calls this script back from the same tree, and
# the path remapping must see the same prefixes both times.
HERE=$(cd "$(dirname "$0")" && pwd -P)
TOP=$(cd "$HERE/.." && pwd -P)
# Absolute, from where the script was started (as cargo takes a relative
# CARGO_TARGET_DIR), and exported: cargo runs in $TOP, and rpmbuild's
# callback must see the same directory.
TARGET=$(realpath -m "${CARGO_TARGET_DIR:-$TOP/target}")
export CARGO_TARGET_DIR=$TARGET
OUT=$TARGET/packages
WORK=$TARGET/packaging

NAME=sparse-volume
# The Debian revision and the RPM release: raise it to re-release a version.
REVISION=${SV_PACKAGE_REVISION:-1}

# cargo_field: the metadata the checks compare against.
# shellcheck source=packaging/lib.sh
. "$HERE/lib.sh"

log() { printf 'build-packages: %s\n' "$*" >&2; }

die() {
    log "$*"
    exit 1
}

# Same bytes for the same commit: dates in the changelog, the man pages and
# file times come from the last commit, not from the clock. Without git (a
# `git archive` tarball), Cargo.toml carries the commit time.
source_date_epoch() {
    if [[ -n ${SOURCE_DATE_EPOCH:-} ]]; then
        echo "$SOURCE_DATE_EPOCH"
    elif git -C "$TOP" rev-parse --git-dir >/dev/null 2>&1; then
        git -C "$TOP" log -1 --format=%ct
    else
        stat -c %Y "$TOP/Cargo.toml"
    fi
}

# rustc writes the source paths of panic locations into the binaries: our
# crates relative to the workspace, the others under CARGO_HOME, generated
# code under the target directory. Map them to fixed names; the last match
# wins, so a target directory or a CARGO_HOME inside the tree is mapped as
# such. Flags the caller set in CARGO_ENCODED_RUSTFLAGS or RUSTFLAGS come
# first (cargo ignores build.rustflags in its config once these are set).
# SV_REMAP_TREE and SV_REMAP_TARGET replace the tree and the target
# directory in these flags: check-reproducible.sh --quick builds a copy
# with the original's flags, so that cargo reuses the crates.io crates
# compiled for the original and compiles only ours, from the copy.
export_rustflags() {
    local flags=() cargo_home=${CARGO_HOME:-${HOME:?}/.cargo}
    local tree=${SV_REMAP_TREE:-$TOP} target=${SV_REMAP_TARGET:-$TARGET}
    if [[ -n ${CARGO_ENCODED_RUSTFLAGS:-} ]]; then
        IFS=$'\x1f' read -r -a flags <<<"$CARGO_ENCODED_RUSTFLAGS"
    elif [[ -n ${RUSTFLAGS:-} ]]; then
        read -r -a flags <<<"$RUSTFLAGS"
    fi
    flags+=("--remap-path-prefix=$tree=."
        "--remap-path-prefix=$target=target"
        "--remap-path-prefix=$cargo_home=cargo")
    CARGO_ENCODED_RUSTFLAGS=$(IFS=$'\x1f' && echo "${flags[*]}")
    export CARGO_ENCODED_RUSTFLAGS
    unset RUSTFLAGS
}

# In a subshell: rpmbuild, which calls back `binaries`, must get the
# caller's flags, not these on top of them (cargo would rebuild it all).
build_binaries() (
    log "cargo build --release"
    export_rustflags
    cd "$TOP"
    # The generator and the unit's program on their own: built together
    # with the CLI, cargo would unify features and link clap and D-Bus into
    # them.
    cargo build --release --locked -p sparse-volume -p sparse-volume-docgen
    cargo build --release --locked -p sparse-volume-generator
)

# The version that was built, as the binary reports it ("sparse-volume 0.2.0").
built_version() {
    local line
    line=$("$TARGET/release/$NAME" --version)
    echo "${line#"$NAME "}"
}

# $1: file; $2, $3: version and date for the @VERSION@/@DATE@ markers.
fill_in() {
    sed -e "s/@VERSION@/$2/g" -e "s/@DATE@/$3/g" "$1"
}

# Everything both packages install, from the built binaries, into $1 (new
# or empty). The .deb and the spec's %install rearrange it afterwards.
stage() {
    local root=$1 version date docs=$WORK/docs
    version=$(built_version)
    date=$(date -u -d "@$(source_date_epoch)" +%Y-%m-%d)
    mkdir -p "$WORK" "$root"
    chmod 0755 "$root"

    # Debian's dh_strip does the same: no symbols, no .comment/.note noise.
    install -D -m 0755 "$TARGET/release/$NAME" "$root/usr/bin/$NAME"
    install -D -m 0755 "$TARGET/release/$NAME-generator" \
        "$root/usr/lib/systemd/system-generators/$NAME-generator"
    install -D -m 0755 "$TARGET/release/$NAME-unit" "$root/usr/libexec/$NAME-unit"
    strip --remove-section=.comment --remove-section=.note \
        "$root/usr/bin/$NAME" "$root/usr/lib/systemd/system-generators/$NAME-generator" \
        "$root/usr/libexec/$NAME-unit"

    install -D -m 0644 -t "$root/usr/lib/systemd/system" \
        "$TOP/units/$NAME@.service" "$TOP/units/sparse-volumes.target" \
        "$TOP/units/$NAME-metrics.service" "$TOP/units/$NAME-metrics.timer"
    install -D -m 0644 "$TOP/units/$NAME.tmpfiles" "$root/usr/lib/tmpfiles.d/$NAME.conf"
    # After 99-systemd.rules, which it amends (see the file).
    install -D -m 0644 "$TOP/units/$NAME.udev-rules" "$root/usr/lib/udev/rules.d/99-zz-$NAME.rules"
    install -D -m 0644 "$HERE/prometheus/$NAME-alerts.yml" \
        "$root/usr/share/$NAME/prometheus-alerts.yml"
    install -D -m 0644 "$HERE/grafana/$NAME-dashboard.json" \
        "$root/usr/share/$NAME/grafana-dashboard.json"

    install -D -m 0644 "$HERE/config.toml" "$root/etc/$NAME/config.toml"
    install -d -m 0755 "$root/etc/$NAME/volumes.d"
    # Backing files are users' data: root only, like the files themselves.
    install -d -m 0700 "$root/var/lib/$NAME"

    rm -rf "$docs"
    "$TARGET/release/$NAME-docgen" --date "$date" "$docs"
    install -d -m 0755 "$root/usr/share/man/man5" "$root/usr/share/man/man8"
    install -m 0644 -t "$root/usr/share/man/man8" "$docs"/man/*.8
    fill_in "$HERE/man/$NAME-generator.8" "$version" "$date" \
        >"$root/usr/share/man/man8/$NAME-generator.8"
    install -m 0644 "$docs/man/$NAME.toml.5" "$root/usr/share/man/man5/$NAME.toml.5"
    # -n: no name or time stamp in the header, so rebuilds are identical.
    gzip -9 -n "$root"/usr/share/man/man*/*

    install -D -m 0644 "$docs/completions/$NAME.bash" \
        "$root/usr/share/bash-completion/completions/$NAME"
    install -D -m 0644 "$docs/completions/_$NAME" \
        "$root/usr/share/zsh/vendor-completions/_$NAME"
    install -D -m 0644 "$docs/completions/$NAME.fish" \
        "$root/usr/share/fish/vendor_completions.d/$NAME.fish"

    install -D -m 0644 "$HERE/debian/copyright" "$root/usr/share/doc/$NAME/copyright"
    # The README and the guides it points to, laid out as in the tree so
    # that its links to docs/guide/ hold (the .deb compresses them).
    install -m 0644 "$TOP/README.md" "$root/usr/share/doc/$NAME/README.md"
    install -D -m 0644 -t "$root/usr/share/doc/$NAME/docs/guide" "$TOP"/docs/guide/*.md
}

# changelog.Debian for this build: one entry, dated like the commit.
debian_changelog() {
    local version=$1 epoch=$2
    cat <<EOF
$NAME ($version) unstable; urgency=medium

  * Package built from the $NAME source tree, version ${version%-*}.

 -- $(cargo_field authors)  $(date -u -R -d "@$epoch")
EOF
}

# What dpkg-gencontrol computes and, unlike `du`, the same on every file
# system: KiB per regular file, rounded up, and 1 for anything else.
installed_size() {
    find "$1" -path "$1/DEBIAN" -prune -o -printf '%y %s\n' |
        awk '{ size += $1 == "f" ? int(($2 + 1023) / 1024) : 1 } END { print size }'
}

# "libc6 (>= 2.34), libgcc-s1 (>= 4.2)" for the staged binaries.
# dpkg-shlibdeps insists on running in a source tree, so give it a stub one.
shlibs_depends() {
    local root=$1 stub=$WORK/shlibdeps
    rm -rf "$stub" && mkdir -p "$stub/debian"
    printf 'Source: %s\n\nPackage: %s\nArchitecture: any\n' "$NAME" "$NAME" \
        >"$stub/debian/control"
    (cd "$stub" && dpkg-shlibdeps -O "$root/usr/bin/$NAME" \
        "$root/usr/lib/systemd/system-generators/$NAME-generator") |
        sed -n 's/^shlibs:Depends=//p'
}

build_deb() {
    local common=$1 version=$2 epoch=$3
    local root=$WORK/deb arch deb_version=$version-$REVISION
    arch=$(dpkg --print-architecture)

    rm -rf "$root" && cp -a "$common" "$root"
    # dpkg warns at purge about every directory of the package that is not
    # empty ("directory ... not empty so not removed"), and the registry and
    # the default storage root hold volumes by design. So the .deb lists
    # nothing under /etc or /var: postinst makes those directories and
    # installs the default config.toml from /usr/share/sparse-volume on a
    # first install, postrm purge removes it and what is empty, and says
    # what it kept. (rpm removes a non-empty directory silently: the .rpm
    # keeps the staged layout, with config.toml as %config(noreplace).)
    install -D -m 0644 "$root/etc/$NAME/config.toml" "$root/usr/share/$NAME/config.toml"
    rm -r "${root:?}/etc" "${root:?}/var"
    # Debian policy 12.3: documentation is compressed, as dh_compress does
    # (all of it, not only what is over 4 kB: the file names then do not
    # change when a guide grows); copyright stays as it is.
    gzip -9 -n "$root/usr/share/doc/$NAME/README.md" "$root/usr/share/doc/$NAME"/docs/guide/*.md
    debian_changelog "$deb_version" "$epoch" | gzip -9 -n \
        >"$root/usr/share/doc/$NAME/changelog.Debian.gz"
    chmod 0644 "$root/usr/share/doc/$NAME/changelog.Debian.gz"
    install -D -m 0644 "$HERE/debian/lintian-overrides" \
        "$root/usr/share/lintian/overrides/$NAME"

    install -d -m 0755 "$root/DEBIAN"
    install -m 0755 -t "$root/DEBIAN" "$HERE/debian/postinst" "$HERE/debian/prerm" "$HERE/debian/postrm"
    # Like dh_md5sums: every file (there are no conffiles).
    (cd "$root" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' |
        LC_ALL=C sort -z | xargs -0 md5sum) >"$root/DEBIAN/md5sums"
    chmod 0644 "$root/DEBIAN/md5sums"

    local size shlibs repository
    size=$(installed_size "$root")
    shlibs=$(shlibs_depends "$root")
    repository=$(cargo_field repository)
    sed -e "s|@VERSION@|$deb_version|" -e "s|@ARCH@|$arch|" \
        -e "s|@MAINTAINER@|$(cargo_field authors)|" -e "s|@INSTALLED_SIZE@|$size|" \
        -e "s|@SHLIBS@|$shlibs|" -e "s|@HOMEPAGE@|$(cargo_field homepage)|" \
        -e "s|@REPOSITORY@|$repository|g" -e '/^#/d' \
        "$HERE/debian/control.in" >"$root/DEBIAN/control"

    set_mtimes "$root" "$epoch"
    dpkg-deb --root-owner-group -Zxz --build "$root" \
        "$OUT/${NAME}_${deb_version}_$arch.deb" >/dev/null
    log "wrote $OUT/${NAME}_${deb_version}_$arch.deb"
}

# Through the spec's own %build and %install, in this tree (build in
# place) and with this target directory, as a distribution builds it.
# --nodeps: rpm's database does not know Debian's packages (BuildRequires).
# The last three make the .rpm reproducible, like the .deb: build time
# from SOURCE_DATE_EPOCH, and no host name.
build_rpm() {
    local version=$1 topdir=$WORK/rpm spec=$HERE/rpm/$NAME.spec spec_version
    spec_version=$(rpmspec -q --srpm --qf '%{VERSION}' "$spec")
    [[ $spec_version == "$version" ]] ||
        die "Version: in ${spec#"$TOP/"} is $spec_version, Cargo.toml says $version"
    rm -rf "$topdir" && mkdir -p "$topdir"
    (cd "$TOP" && rpmbuild -bb --build-in-place --nodeps --quiet \
        --define "_topdir $topdir" \
        --define "_rpmdir $OUT" \
        --define "_build_name_fmt %%{NAME}-%%{VERSION}-%%{RELEASE}.%%{ARCH}.rpm" \
        --define "sv_release $REVISION" \
        --define "use_source_date_epoch_as_buildtime 1" \
        --define "clamp_mtime_to_source_date_epoch 1" \
        --define "_buildhost reproducible" \
        "$spec")
    log "wrote $OUT/$NAME-$version-$REVISION.$(rpm --eval '%{_arch}').rpm"
}

# After Cargo.lock changed: debian/copyright's paragraph per crate and the
# spec's License: (every license of ours and of the crates, joined with
# AND), from cargo metadata; review the diff. check-packages.sh fails
# until this is done.
update_licenses() {
    local copyright=$HERE/debian/copyright spec=$HERE/rpm/$NAME.spec crates spdx
    if ! crates=$(crate_licenses copyright) || ! spdx=$(crate_licenses spdx); then
        die "cargo metadata (offline) or python3 failed"
    fi
    { copyright_own_part "$copyright" && echo && echo "$crates"; } >"$copyright.new"
    mv "$copyright.new" "$copyright"
    sed -i "s|^License:\( *\).*|License:\1${spdx//&/\\&}|" "$spec"
    log "updated ${copyright#"$TOP/"} ($(grep -c '^Files: vendor/' "$copyright") crates) and License: in ${spec#"$TOP/"}"
}

set_mtimes() {
    find "$1" -exec touch -h -d "@$2" {} +
}

build_all() {
    local version epoch common=$WORK/root
    [[ $REVISION =~ ^[0-9][0-9a-z.+~]*$ ]] ||
        die "SV_PACKAGE_REVISION=$REVISION: expected a number such as 2"
    build_binaries
    version=$(built_version)
    epoch=$(source_date_epoch)
    export SOURCE_DATE_EPOCH=$epoch

    mkdir -p "$OUT" "$WORK"
    rm -f "$OUT/$NAME"_*.deb "$OUT/$NAME"-*.rpm
    rm -rf "$common"
    stage "$common"
    set_mtimes "$common" "$epoch"

    build_deb "$common" "$version" "$epoch"
    build_rpm "$version"
}

main() {
    case "${1:-}" in
        "") build_all ;;
        binaries) build_binaries ;;
        licenses) update_licenses ;;
        stage)
            [[ $# -eq 2 ]] || die "usage: $0 stage DIR"
            stage "$2"
            ;;
        *) die "usage: $0 [binaries | stage DIR | licenses]" ;;
    esac
}

main "$@"
