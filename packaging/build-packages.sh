#!/usr/bin/env bash
# Builds the .deb and the .rpm of sparse-volume from this work tree:
#
#   packaging/build-packages.sh
#
# writes target/packages/sparse-volume_<version>-1_<arch>.deb and
# target/packages/sparse-volume-<version>-1.<arch>.rpm (<version> from
# Cargo.toml; CARGO_TARGET_DIR moves target/). Needs cargo, dpkg-dev
# (dpkg-deb, dpkg-shlibdeps), rpm (rpmbuild), binutils (strip) and gzip.
#
# Both packages are made from one staged tree, without debhelper or a
# source package: release binaries, man pages and completions generated
# from the clap definitions (packaging/docgen), the units, a commented
# config.toml. dpkg-deb and rpmbuild only wrap that tree, which takes
# seconds and keeps everything that is packaged visible in this directory.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
TOP=$(cd "$HERE/.." && pwd)
TARGET=${CARGO_TARGET_DIR:-$TOP/target}
OUT=$TARGET/packages
WORK=$TARGET/packaging

NAME=sparse-volume
# The Debian revision and the RPM release: bump to re-release one version.
REVISION=1
MAINTAINER="sparse-volume maintainers <maintainers@sparse-volume.invalid>"

log() { printf 'build-packages: %s\n' "$*" >&2; }

# Same bytes for the same commit: dates in the changelog, the man pages and
# file times come from the last commit, not from the clock.
source_date_epoch() {
    if [[ -n ${SOURCE_DATE_EPOCH:-} ]]; then
        echo "$SOURCE_DATE_EPOCH"
    elif git -C "$TOP" rev-parse --git-dir >/dev/null 2>&1; then
        git -C "$TOP" log -1 --format=%ct
    else
        date +%s
    fi
}

build_binaries() {
    log "cargo build --release"
    # The generator on its own: built together with the CLI, cargo would
    # unify features and link D-Bus into it.
    (cd "$TOP" && cargo build --release --locked -p sparse-volume -p sparse-volume-docgen)
    (cd "$TOP" && cargo build --release --locked -p sparse-volume-generator)
}

# The version that was built, as the binary reports it ("sparse-volume 0.1.0").
built_version() {
    local line
    line=$("$TARGET/release/$NAME" --version)
    echo "${line#"$NAME "}"
}

# $1: file; $2, $3: version and date for the @VERSION@/@DATE@ markers.
fill_in() {
    sed -e "s/@VERSION@/$2/g" -e "s/@DATE@/$3/g" "$1"
}

# The tree both packages contain. $1: empty destination directory.
stage_common() {
    local root=$1 version=$2 date=$3
    local docs=$WORK/docs

    # Debian's dh_strip does the same: no symbols, no .comment/.note noise.
    install -D -m 0755 "$TARGET/release/$NAME" "$root/usr/bin/$NAME"
    install -D -m 0755 "$TARGET/release/$NAME-generator" \
        "$root/usr/lib/systemd/system-generators/$NAME-generator"
    strip --remove-section=.comment --remove-section=.note \
        "$root/usr/bin/$NAME" "$root/usr/lib/systemd/system-generators/$NAME-generator"

    install -D -m 0644 -t "$root/usr/lib/systemd/system" \
        "$TOP/units/$NAME@.service" "$TOP/units/sparse-volumes.target" \
        "$TOP/units/$NAME-metrics.service" "$TOP/units/$NAME-metrics.timer"
    install -D -m 0644 "$HERE/prometheus/$NAME-alerts.yml" \
        "$root/usr/share/$NAME/prometheus-alerts.yml"

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
    fill_in "$HERE/man/$NAME.toml.5" "$version" "$date" \
        >"$root/usr/share/man/man5/$NAME.toml.5"
    # -n: no name or time stamp in the header, so rebuilds are identical.
    gzip -9 -n "$root"/usr/share/man/man*/*

    install -D -m 0644 "$docs/completions/$NAME.bash" \
        "$root/usr/share/bash-completion/completions/$NAME"
    install -D -m 0644 "$docs/completions/_$NAME" \
        "$root/usr/share/zsh/vendor-completions/_$NAME"
    install -D -m 0644 "$docs/completions/$NAME.fish" \
        "$root/usr/share/fish/vendor_completions.d/$NAME.fish"

    install -D -m 0644 "$HERE/debian/copyright" "$root/usr/share/doc/$NAME/copyright"
}

# changelog.Debian for this build: one entry, dated like the commit.
debian_changelog() {
    local version=$1 epoch=$2
    cat <<EOF
$NAME ($version) unstable; urgency=medium

  * Package built from the $NAME source tree, version ${version%-*}.

 -- $MAINTAINER  $(date -u -R -d "@$epoch")
EOF
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
    rm -r "$root/etc" "$root/var"
    debian_changelog "$deb_version" "$epoch" | gzip -9 -n \
        >"$root/usr/share/doc/$NAME/changelog.Debian.gz"
    chmod 0644 "$root/usr/share/doc/$NAME/changelog.Debian.gz"
    install -D -m 0644 "$HERE/debian/lintian-overrides" \
        "$root/usr/share/lintian/overrides/$NAME"

    install -d -m 0755 "$root/DEBIAN"
    install -m 0755 -t "$root/DEBIAN" "$HERE/debian/postinst" "$HERE/debian/postrm"
    # Like dh_md5sums: every file (there are no conffiles).
    (cd "$root" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' |
        LC_ALL=C sort -z | xargs -0 md5sum) >"$root/DEBIAN/md5sums"
    chmod 0644 "$root/DEBIAN/md5sums"

    local size shlibs
    size=$(du -s -k --exclude=DEBIAN "$root" | cut -f1)
    shlibs=$(shlibs_depends "$root")
    sed -e "s/@VERSION@/$deb_version/" -e "s/@ARCH@/$arch/" \
        -e "s/@MAINTAINER@/$MAINTAINER/" -e "s/@INSTALLED_SIZE@/$size/" \
        -e "s/@SHLIBS@/$shlibs/" -e '/^#/d' "$HERE/debian/control.in" >"$root/DEBIAN/control"

    set_mtimes "$root" "$epoch"
    dpkg-deb --root-owner-group -Zxz --build "$root" \
        "$OUT/${NAME}_${deb_version}_$arch.deb" >/dev/null
    log "wrote $OUT/${NAME}_${deb_version}_$arch.deb"
}

build_rpm() {
    local common=$1 version=$2 topdir=$WORK/rpm
    rm -rf "$topdir" && mkdir -p "$topdir"
    # The last three make the .rpm reproducible, like the .deb: build time
    # from SOURCE_DATE_EPOCH, and no host name.
    rpmbuild -bb --quiet \
        --define "_topdir $topdir" \
        --define "_rpmdir $OUT" \
        --define "_build_name_fmt %%{NAME}-%%{VERSION}-%%{RELEASE}.%%{ARCH}.rpm" \
        --define "sv_version $version" \
        --define "sv_release $REVISION" \
        --define "sv_stage $common" \
        --define "use_source_date_epoch_as_buildtime 1" \
        --define "clamp_mtime_to_source_date_epoch 1" \
        --define "_buildhost reproducible" \
        "$HERE/rpm/$NAME.spec"
    log "wrote $OUT/$NAME-$version-$REVISION.$(rpm --eval '%{_arch}').rpm"
}

set_mtimes() {
    find "$1" -exec touch -h -d "@$2" {} +
}

main() {
    local version epoch date common=$WORK/root
    build_binaries
    version=$(built_version)
    epoch=$(source_date_epoch)
    date=$(date -u -d "@$epoch" +%Y-%m-%d)
    export SOURCE_DATE_EPOCH=$epoch

    mkdir -p "$OUT" "$WORK"
    rm -f "$OUT/$NAME"_*.deb "$OUT/$NAME"-*.rpm
    rm -rf "$common" && mkdir -m 0755 "$common"
    stage_common "$common" "$version" "$date"
    set_mtimes "$common" "$epoch"

    build_deb "$common" "$version" "$epoch"
    build_rpm "$common" "$version"
}

main "$@"
