#!/usr/bin/env bash
# Checks the packages that build-packages.sh wrote:
#
#   packaging/check-packages.sh [DIR]      (DIR defaults to target/packages)
#
# - the .deb's exact contents (dpkg-deb -c) and the .rpm's exact file list
#   against packaging/expected/, modes and owners included;
# - control fields and RPM metadata: version from Cargo.toml, dependencies,
#   conffiles;
# - lintian: no error and no warning that lacks a commented override;
# - every man page renders with `man --warnings` without a diagnostic, and
#   each command's page has EXIT STATUS, EXAMPLES and SEE ALSO;
# - README.md and docs/guide/ are shipped as docs, as in the tree;
# - debian/copyright's paragraph per linked crate and the RPM License: tag
#   agree with `cargo metadata`;
# - install.sh's apt-get would install a rebuilt package of the installed
#   version again (simulated);
# - the completions offer a subcommand's option values and the registered
#   volumes (bash and fish run, zsh parses);
# - no shipped binary carries the test hooks (src/hooks.rs: the names of
#   their environment variables), which the test build does carry;
# - the unit's program (/usr/libexec/sparse-volume-unit) and the generator
#   have no clap or zbus code, which the CLI has;
# - the maintainer scripts of both packages, run against a scratch root
#   with stubs of systemctl and deb-systemd-helper/-invoke: daemon-reload
#   only where systemd runs, the metrics timer stopped or disabled on
#   removal (never on an upgrade), a warning naming the enabled volumes of
#   a fixture registry on removal only, nothing else ever, and
#   removal/purge keep volume data and the registry;
# - dpkg installing, reinstalling, removing and purging the .deb in a
#   scratch root;
# - rpmlint: no error and no warning that lacks a filter with its reason
#   in packaging/rpmlint.toml;
# - rpm installing the .rpm, upgrading it to release 2 and erasing it in a
#   scratch root, running the real scriptlets there: `rpm -V` clean, the
#   edited config.toml kept, volume data and the registry kept.
#
# Release 2 is built here with rpmbuild from the spec, reusing the binaries
# in CARGO_TARGET_DIR: run it with the target directory of the build.
# Needs root (rpm --root chroots), dpkg, lintian, rpm, rpmlint, man-db,
# cpio, apt-get, fish, zsh, and cargo and python3 (cargo metadata,
# offline).
# Runs every check, then prints "N passed, N failed" and exits non-zero if
# any failed.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
TOP=$(cd "$HERE/.." && pwd)
# Absolute, as build-packages.sh takes it: rpmbuild runs it from $TOP.
export CARGO_TARGET_DIR
CARGO_TARGET_DIR=$(realpath -m "${CARGO_TARGET_DIR:-$TOP/target}")
DIR=${1:-$CARGO_TARGET_DIR/packages}
SCRATCH=$(mktemp -d)
trap 'rm -rf "$SCRATCH"' EXIT

# shellcheck source=packaging/lib.sh
. "$HERE/lib.sh"


# diff_list EXPECTED_FILE ACTUAL_TEXT REGENERATE_HINT
diff_list() {
    local expected=$1 actual=$2 hint=$3
    if diff -u --label expected --label actual <(grep -v "^#" "$expected") <(printf "%s\n" "$actual"); then
        return 0
    fi
    echo "if the change is intended, update ${expected#"$TOP/"} from: $hint"
    return 1
}

deb_listing() {
    dpkg-deb -c "$1" | awk '{ print $1, $2, $6 }'
}

rpm_listing() {
    rpm -qp --qf '[%{FILEMODES:perms} %{FILEUSERNAME}/%{FILEGROUPNAME} %{FILENAMES}\n]' "$1"
}

# field_is FILE_DESCRIPTION ACTUAL EXPECTED
field_is() {
    if [[ $2 != "$3" ]]; then
        echo "$1 is \"$2\", expected \"$3\""
        return 1
    fi
}

# The package names in a Depends field or an `rpm --requires` list, one a
# line, without versions ("libc6 (>= 2.34)" -> libc6, "a >= 1" -> a).
relation_names() {
    tr ',' '\n' <<<"$1" | sed -e 's/^ *//' -e 's/ \+([^)]*)$//' -e 's/ *[<>=].*$//'
}

# contains_all RELATIONS NAME...: every NAME is one of the RELATIONS.
contains_all() {
    local names name missing=()
    names=$(relation_names "$1")
    shift
    for name in "$@"; do
        grep -qxF -- "$name" <<<"$names" || missing+=("$name")
    done
    if [[ ${#missing[@]} -gt 0 ]]; then
        echo "missing ${missing[*]} in: $names"
        return 1
    fi
}

check_deb_control() {
    local deb=$1 version=$2
    field_is Package "$(dpkg-deb -f "$deb" Package)" sparse-volume &&
        field_is Version "$(dpkg-deb -f "$deb" Version)" "$version-1" &&
        field_is Architecture "$(dpkg-deb -f "$deb" Architecture)" "$(dpkg --print-architecture)" &&
        contains_all "$(dpkg-deb -f "$deb" Depends)" libc6 util-linux e2fsprogs systemd &&
        field_is Recommends "$(dpkg-deb -f "$deb" Recommends)" "xfsprogs, cryptsetup-bin (>= 2:2.4)" &&
        field_is Suggests "$(dpkg-deb -f "$deb" Suggests)" gdisk &&
        field_is "control members" "$(dpkg-deb --ctrl-tarfile "$deb" | tar -t | grep -c conffiles)" 0 &&
        check_deb_project_fields "$deb"
}

# The project as maintainer, its repository and its issue tracker, all
# from Cargo.toml.
check_deb_project_fields() {
    local deb=$1 repository
    repository=$(cargo_field repository)
    field_is Maintainer "$(dpkg-deb -f "$deb" Maintainer)" "$(cargo_field authors)" &&
        field_is Homepage "$(dpkg-deb -f "$deb" Homepage)" "$(cargo_field homepage)" &&
        field_is Vcs-Git "$(dpkg-deb -f "$deb" Vcs-Git)" "$repository.git" &&
        field_is Vcs-Browser "$(dpkg-deb -f "$deb" Vcs-Browser)" "$repository" &&
        field_is Bugs "$(dpkg-deb -f "$deb" Bugs)" "$repository/issues" &&
        field_is "changelog.Debian trailer" \
            "$(dpkg-deb --fsys-tarfile "$deb" | tar -xO ./usr/share/doc/sparse-volume/changelog.Debian.gz |
                gzip -d | sed -n 's/^ -- \(.*>\)  .*/\1/p')" "$(cargo_field authors)"
}

check_rpm_metadata() {
    local rpm=$1 version=$2 info
    info=$(rpm -qp --qf '%{NAME} %{VERSION} %{RELEASE} %{ARCH}' "$rpm")
    field_is "name version release arch" "$info" \
        "sparse-volume $version 1 $(rpm --eval '%{_arch}')" &&
        contains_all "$(rpm -qp --requires "$rpm")" util-linux e2fsprogs systemd 'libc.so.6()(64bit)' &&
        contains_all "$(rpm -qp --recommends "$rpm")" xfsprogs cryptsetup &&
        field_is Suggests "$(rpm -qp --suggests "$rpm")" gdisk &&
        field_is "config files" "$(rpm -qcp "$rpm")" /etc/sparse-volume/config.toml &&
        field_is "URL BugURL" "$(rpm -qp --qf '%{URL} %{BUGURL}' "$rpm")" \
            "$(cargo_field homepage) $(cargo_field repository)/issues" &&
        field_is Vendor "$(rpm -qp --qf '%{VENDOR}' "$rpm")" "The sparse-volume project" &&
        field_is Packager "$(rpm -qp --qf '%{PACKAGER}' "$rpm")" "$(cargo_field authors)" &&
        rpm -qip "$rpm" >/dev/null
}

# Every license that a Files paragraph of the copyright file $1 names
# (one of "A or B, and C") has its text in a License paragraph (lintian
# does not check this in a binary package).
check_license_texts() {
    local copyright=$1 named texts missing
    named=$(awk 'BEGIN { RS = "" } /^Files:/ && match($0, /\nLicense: [^\n]*/) { print substr($0, RSTART + 10, RLENGTH - 10) }' "$copyright" |
        sed -e 's/,* and /\n/g' -e 's/ or /\n/g' | sort -u)
    texts=$(awk 'BEGIN { RS = "" } /^License: [^\n]*\n / { sub(/\n.*/, ""); print substr($0, 10) }' "$copyright" | sort -u)
    missing=$(comm -23 <(echo "$named") <(echo "$texts"))
    [[ -z $missing ]] || { echo "no License paragraph with the text of: $missing"; return 1; }
}

# The licenses of the statically linked crates, from cargo metadata, are
# those of packaging/debian/copyright (a paragraph per crate) and of the
# spec's License: tag; both packages ship that copyright file as it is,
# with the text of every license it names.
check_crate_licenses() {
    local rpm=$1 root=$2 expected spdx
    expected=$(crate_licenses copyright) || return 1
    spdx=$(crate_licenses spdx) || return 1
    if ! diff -u --label "packaging/debian/copyright (its crates)" --label "cargo metadata" \
        <(copyright_crate_part "$HERE/debian/copyright") <(printf '%s\n' "$expected"); then
        echo "after a change of Cargo.lock: packaging/build-packages.sh licenses, then review the diff"
        return 1
    fi
    field_is "the .rpm's License" "$(rpm -qp --qf '%{LICENSE}' "$rpm")" "$spdx" || {
        echo "after a change of Cargo.lock: packaging/build-packages.sh licenses, then review the diff"
        return 1
    }
    check_license_texts "$HERE/debian/copyright" &&
        cmp "$HERE/debian/copyright" "$root/usr/share/doc/sparse-volume/copyright" &&
        cmp "$HERE/debian/copyright" <(rpm2cpio "$rpm" | cpio -i --quiet --to-stdout ./usr/share/doc/sparse-volume/copyright)
}

# The README and the guides (docs/guide/), as in the source tree: in the
# .deb compressed (Debian policy 12.3, as dh_compress does), in the .rpm
# as they are and marked %doc.
check_shipped_docs() {
    local rpm=$1 root=$2 doc=/usr/share/doc/sparse-volume file docs
    docs=$(rpm -qdp "$rpm")
    for file in README.md $(cd "$TOP" && echo docs/guide/*.md); do
        [[ -f $root$doc/$file.gz ]] || { echo "the .deb lacks $doc/$file.gz"; return 1; }
        gzip -dc "$root$doc/$file.gz" | cmp - "$TOP/$file" || return 1
        grep -qxF "$doc/$file" <<<"$docs" || { echo "the .rpm has no %doc $doc/$file"; return 1; }
        rpm2cpio "$rpm" | cpio -i --quiet --to-stdout ".$doc/$file" | cmp - "$TOP/$file" || return 1
    done
}

# Each command's page says what its exit status means, shows it at work
# and names related pages (packaging/docgen, COMMAND_DOCS).
check_command_pages() {
    local root=$1 page text section status=0
    for page in "$root"/usr/share/man/man8/sparse-volume-*.8.gz; do
        [[ $page != */sparse-volume-generator.8.gz ]] || continue
        text=$(LC_ALL=C.UTF-8 MANWIDTH=80 man -l "$page" 2>/dev/null)
        for section in "EXIT STATUS" EXAMPLES "SEE ALSO"; do
            if ! grep -qx "$section" <<<"$text"; then
                echo "${page##*/} has no $section section"
                status=1
            fi
        done
    done
    return "$status"
}

# packaging/install.sh installs a rebuilt package of the installed version
# again: its install_deb, with apt-get simulating against this machine's
# packages plus this very version as installed, would unpack the .deb.
# (The function alone, taken out of the script: running the script would
# build and install.)
check_install_reinstalls() {
    local deb=$1 dir=$SCRATCH/apt output
    mkdir -p "$dir"
    sed -n '/^install_deb() {$/,/^}$/p' "$HERE/install.sh" >"$dir/install_deb.sh"
    [[ -s $dir/install_deb.sh ]] || { echo "install.sh has no install_deb function"; return 1; }
    {
        awk 'BEGIN { RS = ""; ORS = "\n\n" } !/^Package: sparse-volume\n/' /var/lib/dpkg/status
        dpkg-deb -f "$deb"
        echo "Status: install ok installed"
    } >"$dir/status"
    printf 'Dir::State::status "%s";\nAPT::Get::Simulate "true";\nDebug::NoLocking "true";\n' \
        "$dir/status" >"$dir/apt.conf"
    # shellcheck disable=SC2016 # expanded by the inner bash
    output=$(APT_CONFIG=$dir/apt.conf bash -c '. "$1" && install_deb "$2"' bash "$dir/install_deb.sh" "$deb" 2>&1) ||
        { echo "install.sh's install_deb failed: $output"; return 1; }
    grep -q "^Inst sparse-volume " <<<"$output" ||
        { echo "apt-get would not install the rebuilt package again: $output"; return 1; }
}

# Errors and warnings fail unless packaging/rpmlint.toml filters them, each
# with its reason; the spec is linted too.
check_rpmlint() {
    local output
    output=$(rpmlint -c "$HERE/rpmlint.toml" "$1" "$HERE/rpm/sparse-volume.spec" 2>&1) || {
        echo "$output"
        return 1
    }
    if grep -E ': [EW]: ' <<<"$output"; then
        return 1
    fi
}

check_lintian() {
    # Info tags are shown for the record; errors and warnings fail.
    lintian --fail-on error,warning --display-info "$1"
}

# The environment variables of src/hooks.rs: read only by builds with the
# test-hooks feature.
HOOK_VARIABLES=(SPARSE_VOLUME_CRASH_AT SPARSE_VOLUME_STOP_AT SPARSE_VOLUME_FAULT SPARSE_VOLUME_JOB_TIMEOUT_SEC SPARSE_VOLUME_LOCK_WAIT_SEC)

# binary_mentions FILE WORD...: the WORDs that FILE's strings contain.
# (Read into a variable first: `strings | grep -q` under pipefail fails
# when grep stops reading early.)
binary_mentions() {
    local file=$1 word text
    shift
    text=$(strings -a "$file")
    for word in "$@"; do
        if grep -qF -- "$word" <<<"$text"; then
            echo "$word"
        fi
    done
}

# No shipped binary reads a hook's variable. The test builds of the CLI
# and of the units' program (cargo test's, when they are there) show that
# the check can see them: each hook is in one of the two (the lock-wait
# bound only in the units' program, which alone bounds its waits).
check_no_test_hooks() {
    local root=$1 binary found status=0 test_builds=("$CARGO_TARGET_DIR/debug/sparse-volume" "$CARGO_TARGET_DIR/debug/sparse-volume-unit")
    for binary in "$root/usr/bin/sparse-volume" "$root/usr/lib/systemd/system-generators/sparse-volume-generator" \
        "$root/usr/libexec/sparse-volume-unit"; do
        found=$(binary_mentions "$binary" "${HOOK_VARIABLES[@]}")
        if [[ -n $found ]]; then
            echo "${binary#"$root"} carries test hooks: $found"
            status=1
        fi
    done
    if [[ -x ${test_builds[0]} && -x ${test_builds[1]} ]]; then
        found=$(for binary in "${test_builds[@]}"; do binary_mentions "$binary" "${HOOK_VARIABLES[@]}"; done | sort -u)
        [[ $(wc -l <<<"$found") -eq ${#HOOK_VARIABLES[@]} ]] ||
            { echo "the check does not see the hooks of the test builds: only $found"; status=1; }
    fi
    return "$status"
}

# The unit's program and the generator link neither clap nor zbus (their
# source paths and names are in any binary that does, as the CLI shows).
check_lean_boot_binary() {
    local root=$1 cli=$1/usr/bin/sparse-volume boot=$1/usr/libexec/sparse-volume-unit found
    found=$(binary_mentions "$boot" clap zbus)
    [[ -z $found ]] || { echo "the unit's program contains $found"; return 1; }
    found=$(binary_mentions "$root/usr/lib/systemd/system-generators/sparse-volume-generator" clap zbus)
    [[ -z $found ]] || { echo "the generator contains $found"; return 1; }
    found=$(binary_mentions "$cli" clap zbus)
    [[ $(wc -l <<<"$found") -eq 2 ]] || { echo "the check does not see clap and zbus in the CLI: only $found"; return 1; }
    echo "the unit's program: $(stat -c %s "$boot") bytes; the CLI: $(stat -c %s "$cli") bytes"
}

# Every man page in the extracted .deb, rendered as `man` does.
check_man_pages() {
    local root=$1 page output status=0
    for page in "$root"/usr/share/man/man*/*; do
        output=$(LC_ALL=C.UTF-8 MANWIDTH=80 man --warnings -E UTF-8 -l "$page" 2>&1 >/dev/null) || {
            echo "${page#"$root"}: man failed"
            status=1
        }
        if [[ -n $output ]]; then
            printf '%s:\n%s\n' "${page#"$root"}" "$output"
            status=1
        fi
    done
    return "$status"
}

# The installed completions, run as the shells run them, with the
# installed binary on PATH and a registry of two volumes: bash (sourced as
# bash-completion does, through the function `complete -p` names) offers a
# subcommand's option values and the volumes' UUIDs and names where a
# command takes a volume; fish (`complete -C`) offers the volumes too; the
# zsh script parses (packaging/docgen's tests try more words).
check_completions() (
    local root=$1 registry volume offered function
    registry=$SCRATCH/completion-registry
    volume=6f1c2a8e-3b4d-4e5f-8a9b-0c1d2e3f4a5b
    mkdir -p "$registry/etc/sparse-volume/volumes.d"
    printf '%s\n' "uuid = \"$volume\"" "name = \"pg-data\"" \
        "path = \"/var/lib/sparse-volume/$volume\"" "size = 67108864" \
        'mode = "filesystem"' 'fs_type = "ext4"' >"$registry/etc/sparse-volume/volumes.d/$volume.toml"
    # shellcheck disable=SC2030 # the function runs in a subshell: so do these
    export SPARSE_VOLUME_ROOT=$registry PATH=$root/usr/bin:$PATH
    local bash_script=$root/usr/share/bash-completion/completions/sparse-volume
    bash -n "$bash_script" || return 1
    # shellcheck disable=SC2016 # expanded by the inner bash
    function=$(bash -c 'source "$1"; complete -p sparse-volume' bash "$bash_script" | sed -n 's/.*-F \([^ ]*\) .*/\1/p')
    # shellcheck disable=SC2016 # expanded by the inner bash
    offered=$(bash -c 'source "$1"; COMP_WORDS=(sparse-volume create --fs ""); COMP_CWORD=3
        "$2" sparse-volume "" --fs; echo "${COMPREPLY[*]}"' bash "$bash_script" "$function")
    field_is "bash: completions of create --fs" "$offered" "ext4 xfs" || return 1
    # shellcheck disable=SC2016 # expanded by the inner bash
    offered=$(bash -c 'source "$1"; COMP_WORDS=(sparse-volume status ""); COMP_CWORD=2
        "$2" sparse-volume "" status; echo "${COMPREPLY[*]}"' bash "$bash_script" "$function")
    field_is "bash: completions of status" "$offered" "$volume pg-data" || return 1
    offered=$(fish -c "source $root/usr/share/fish/vendor_completions.d/sparse-volume.fish; complete -C 'sparse-volume detach '" | cut -f1 | sort | tr '\n' ' ')
    field_is "fish: completions of detach" "$offered" "$volume pg-data " || return 1
    zsh -n "$root/usr/share/zsh/vendor-completions/_sparse-volume"
)

# --- maintainer scripts -----------------------------------------------------

# The stubs' answers to list-units and show: one volume unit is active and
# wants its blockdev@ target, so the scripts' start of the targets of
# active volumes (which runs nothing) shows in the log. `show` quotes the
# name as systemd 252 does (C-style, for its backslash).
# shellcheck disable=SC2016 # $1 is the stub's
ACTIVE_UNIT_STUB='[ "$1" != list-units ] || echo "sparse-volume@x.service loaded active exited Sparse volume x"
[ "$1" != show ] || printf "%s\n" "modprobe@loop.service \"blockdev@dev-disk-by\\\\x2duuid-x.target\""'
START_ACTIVE=$'list-units --no-legend --plain --state=active sparse-volume@*.service\nshow -p Wants --value sparse-volume@x.service\nstart --no-block --job-mode=fail blockdev@dev-disk-by\\x2duuid-x.target'

# A scratch root for one scenario, with stubs of systemctl,
# systemd-tmpfiles, deb-systemd-helper and deb-systemd-invoke that log
# their arguments (all but systemctl's prefixed with the program's name)
# to one log; $2 = yes makes it look as if systemd were running.
make_sandbox() {
    local box=$1 systemd=$2 helper
    rm -rf "$box" && mkdir -p "$box/bin"
    printf '#!/bin/sh\necho "$*" >>"%s/systemctl.log"\n%s\n' "$box" "$ACTIVE_UNIT_STUB" >"$box/bin/systemctl"
    for helper in systemd-tmpfiles deb-systemd-helper deb-systemd-invoke; do
        printf '#!/bin/sh\necho "%s $*" >>"%s/systemctl.log"\n' "$helper" "$box" >"$box/bin/$helper"
        chmod +x "$box/bin/$helper"
    done
    chmod +x "$box/bin/systemctl"
    touch "$box/systemctl.log"
    if [[ $systemd == yes ]]; then mkdir -p "$box/run/systemd/system"; fi
    install -D -m 0644 "$HERE/config.toml" "$box/usr/share/sparse-volume/config.toml"
}

# run_script BOX SCRIPT ARG...: runs a maintainer script with its absolute
# paths moved into BOX, the way dpkg or rpm would (/bin/sh, argument list).
run_script() {
    local box=$1 script=$2
    shift 2
    sed -e "s#/run/systemd/system#$box/run/systemd/system#g" \
        -e "s#/var/lib/sparse-volume#$box/var/lib/sparse-volume#g" \
        -e "s#/usr/share/sparse-volume#$box/usr/share/sparse-volume#g" \
        -e "s#/etc/sparse-volume#$box/etc/sparse-volume#g" "$script" >"$box/script"
    PATH="$box/bin:$PATH" sh "$box/script" "$@"
}

# expect_run LABEL BOX SYSTEMD EXPECTED_SYSTEMCTL_LOG EXPECTED_OUTPUT SCRIPT ARG...
expect_run() {
    local label=$1 box=$2 systemd=$3 want_log=$4 want_output=$5 script=$6 output
    shift 6
    make_sandbox "$box" "$systemd"
    # Volume data and a registry entry that nothing may delete.
    mkdir -p "$box/var/lib/sparse-volume" "$box/etc/sparse-volume/volumes.d"
    echo data >"$box/var/lib/sparse-volume/backing"
    echo 'uuid = "x"' >"$box/etc/sparse-volume/volumes.d/x.toml"

    output=$(run_script "$box" "$script" "$@" 2>&1) || {
        echo "$label: exited non-zero: $output"
        return 1
    }
    if [[ $(cat "$box/systemctl.log") != "$want_log" ]]; then
        echo "$label: systemctl calls were \"$(cat "$box/systemctl.log")\", expected \"$want_log\""
        return 1
    fi
    if [[ $want_output == kept-message ]]; then
        if [[ $(wc -l <<<"$output") -ne 1 || $output != *"/var/lib/sparse-volume"*"/etc/sparse-volume/volumes.d"* ]]; then
            echo "$label: expected one line naming where the data is kept, got: $output"
            return 1
        fi
    elif [[ $output != "$want_output" ]]; then
        echo "$label: printed \"$output\", expected \"$want_output\""
        return 1
    fi
    if [[ ! -f $box/var/lib/sparse-volume/backing || ! -f $box/etc/sparse-volume/volumes.d/x.toml ]]; then
        echo "$label: deleted volume data or the registry"
        return 1
    fi
}

# Nothing but daemon-reload: no start/stop/restart of volume units (an
# upgrade must not detach them), no enabling (the units are static), but
# the one start of the blockdev@ targets of active volumes, which runs
# nothing, and what removal does to the metrics timer (a line that names
# only its units: see METRICS_LINE). No rm but of config.toml (which
# postinst installs and purge removes). Comments run nothing.
no_forbidden_commands() {
    local script
    for script in "$@"; do
        # shellcheck disable=SC2016 # the pattern matches a literal ${DPKG_ROOT:-}
        if grep -nE 'systemctl +([a-z-]+ +)*(start|stop|restart|try-restart|reload-or-restart|enable|disable|mask|kill)\b|deb-systemd-(invoke|helper)|invoke-rc\.d|\brm +' "$script" |
            grep -vE '^[0-9]+: *#' |
            grep -vE '^[0-9]+: *rm -f( "\$\{DPKG_ROOT:-\}\$CONFIG_DIR/config\.toml(\.dpkg-tmp)?")+$' |
            grep -vE '^[0-9]+: *systemctl start --no-block --job-mode=fail \$targets >/dev/null 2>&1 \|\| (true|:)$' |
            grep -vE "^[0-9]+: *$METRICS_LINE" |
            grep -vE '^[0-9]+: *if ([^;]* && )?command -v deb-systemd-(helper|invoke) >/dev/null; then$'; then
            echo "forbidden command in ${script##*/}"
            return 1
        fi
    done
}

# postinst makes the directories and installs the default config.toml on a
# first install only; an existing one is never touched.
check_postinst_config() {
    local postinst=$1 box=$SCRATCH/box-config output
    make_sandbox "$box" no
    mkdir -p "$box/var/lib"
    output=$(run_script "$box" "$postinst" configure 2>&1) || { echo "first install: $output"; return 1; }
    cmp "$HERE/config.toml" "$box/etc/sparse-volume/config.toml" || { echo "first install: config.toml is not the default"; return 1; }
    field_is "mode of /var/lib/sparse-volume" "$(stat -c %a "$box/var/lib/sparse-volume")" 700 || return 1
    [[ -d $box/etc/sparse-volume/volumes.d ]] || { echo "first install: no volumes.d"; return 1; }
    echo '# local edit' >>"$box/etc/sparse-volume/config.toml"
    output=$(run_script "$box" "$postinst" configure 2>&1) || { echo "second configure: $output"; return 1; }
    grep -q '^# local edit$' "$box/etc/sparse-volume/config.toml" || { echo "configure replaced an existing config.toml"; return 1; }
    rm "$box/etc/sparse-volume/config.toml"
    output=$(run_script "$box" "$postinst" configure 0.0.9-1 2>&1) || { echo "upgrade: $output"; return 1; }
    [[ ! -e $box/etc/sparse-volume/config.toml ]] || { echo "an upgrade brought back a config.toml deleted on purpose"; return 1; }
}

# What an install or upgrade asks of systemd where it runs.
INSTALL_LOG=$'--system daemon-reload\nsystemd-tmpfiles --create sparse-volume.conf\n'$START_ACTIVE

# The metrics timer (off until the admin enables it) and its service: the
# only units the scripts may stop, start or disable, and only on removal
# (start: the deb's postinst, for a timer that is enabled, as debhelper's
# does). A line of a script that does so names them and nothing else.
METRICS_UNITS="sparse-volume-metrics.timer sparse-volume-metrics.service"
METRICS_LINE='(deb-systemd-invoke (start|stop)|deb-systemd-helper (update-state|purge)|systemctl --no-reload disable( --now)?)( sparse-volume-metrics\.(timer|service))+( >/dev/null( 2>&1)?)?( \|\| (true|:))?$'

# The .deb, debhelper's way for a unit the package ships but does not
# enable: postinst records the links that enabling it makes
# (update-state) and starts it where it is enabled (deb-systemd-invoke
# starts only enabled units; the stub says it is); prerm stops it on
# removal; postrm purge removes those links.
DEB_RECORD_TIMER="deb-systemd-helper update-state sparse-volume-metrics.timer"
DEB_INSTALL_LOG=$DEB_RECORD_TIMER$'\n'$INSTALL_LOG$'\nis-enabled --quiet sparse-volume-metrics.timer\ndeb-systemd-invoke start sparse-volume-metrics.timer'
DEB_STOP_TIMER="deb-systemd-invoke stop $METRICS_UNITS"
DEB_PURGE_TIMER="deb-systemd-helper purge sparse-volume-metrics.timer"
# The .rpm, as %systemd_preun does: erase disables the timer (and stops
# it where systemd runs); an upgrade leaves it alone.
RPM_DISABLE_TIMER="--no-reload disable --now $METRICS_UNITS"
RPM_DISABLE_TIMER_OFFLINE="--no-reload disable $METRICS_UNITS"

check_deb_scripts() {
    local control=$1 box=$SCRATCH/box reload="--system daemon-reload"
    # Another root for DPKG_ROOT, where postinst makes its directories.
    local other=$SCRATCH/other-root
    mkdir -p "$other$box/etc" "$other$box/var/lib"
    install -D -m 0644 "$HERE/config.toml" "$other$box/usr/share/sparse-volume/config.toml"
    [[ -f $control/prerm ]] || { echo "the .deb has no prerm"; return 1; }
    no_forbidden_commands "$control/postinst" "$control/prerm" "$control/postrm" &&
        expect_run "postinst configure, systemd" "$box" yes "$DEB_INSTALL_LOG" "" "$control/postinst" configure 0.0.9-1 &&
        expect_run "postinst configure, no systemd" "$box" no "$DEB_RECORD_TIMER" "" "$control/postinst" configure &&
        DPKG_ROOT=$other expect_run "postinst configure, DPKG_ROOT" "$box" yes "$DEB_RECORD_TIMER" "" "$control/postinst" configure &&
        cmp "$HERE/config.toml" "$other$box/etc/sparse-volume/config.toml" &&
        expect_run "prerm remove, systemd" "$box" yes "$DEB_STOP_TIMER" "" "$control/prerm" remove &&
        expect_run "prerm remove, no systemd" "$box" no "" "" "$control/prerm" remove &&
        expect_run "prerm upgrade" "$box" yes "" "" "$control/prerm" upgrade 0.2.1-1 &&
        expect_run "postrm remove, systemd" "$box" yes "$reload" "" "$control/postrm" remove &&
        expect_run "postrm upgrade" "$box" yes "" "" "$control/postrm" upgrade 0.2.0-1 &&
        expect_run "postrm purge" "$box" yes "$DEB_PURGE_TIMER" kept-message "$control/postrm" purge &&
        check_removal_warning "$control/prerm" remove upgrade 0.2.1-1 &&
        check_postinst_config "$control/postinst"
}

# Volumes of the fixture registry (write_fixture_registry).
PG_DATA=6f1c2a8e-3b4d-4e5f-8a9b-0c1d2e3f4a5b
UNNAMED=0b7e4f2a-9c1d-4e3f-8a5b-6c7d8e9f0a1b
HAND_EDITED=9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d
DISABLED=4d2c1b0a-8f7e-4d6c-9b5a-3e2f1d0c9b8a

# registry_file DIR UUID LINE...: a volume's file as the CLI writes it,
# with the LINEs (name, enabled) among its keys.
registry_file() {
    local dir=$1 uuid=$2
    shift 2
    {
        echo "uuid = \"$uuid\""
        printf '%s\n' "$@"
        echo "path = \"/var/lib/sparse-volume/$uuid\""
        printf 'size = 1073741824\nmode = "filesystem"\nfs_type = "ext4"\nread_only = false\n'
    } >"$dir/$uuid.toml"
}

# Under ROOT: two enabled volumes (one named), a disabled one with a name,
# a hand-edited enabled one (no spaces, a comment, a literal string), and
# what the CLI ignores: a temporary (leading dot) and a file not in .toml.
write_fixture_registry() {
    local dir=$1/etc/sparse-volume/volumes.d
    mkdir -p "$dir"
    registry_file "$dir" "$PG_DATA" 'name = "pg-data"' 'enabled = true'
    registry_file "$dir" "$UNNAMED" 'enabled = true'
    registry_file "$dir" "$DISABLED" 'name = "scratch"' 'enabled = false'
    registry_file "$dir" "$HAND_EDITED" "name='logs'" 'enabled=true   # back at boot'
    registry_file "$dir" 0c0c0c0c-0c0c-4c0c-8c0c-0c0c0c0c0c0c 'enabled = true'
    mv "$dir/0c0c0c0c-0c0c-4c0c-8c0c-0c0c0c0c0c0c.toml" "$dir/.0c0c0c0c-0c0c-4c0c-8c0c-0c0c0c0c0c0c.toml"
    printf 'enabled = true\n' >"$dir/notes.txt"
}

# removal_warning_is_right OUTPUT: names each enabled volume of the
# fixture (UUID, and name where it has one) and no other, and says what
# the next boot does and how to avoid it.
removal_warning_is_right() {
    local output=$1 volume word
    for volume in "$PG_DATA (pg-data)" "$UNNAMED" "$HAND_EDITED (logs)"; do
        grep -qF -- "$volume" <<<"$output" || { echo "the warning does not name $volume: $output"; return 1; }
    done
    for word in "$DISABLED" scratch 0c0c0c0c notes; do
        ! grep -qF -- "$word" <<<"$output" || { echo "the warning names $word, which is not an enabled volume: $output"; return 1; }
    done
    for word in "next boot" /etc/fstab nofail "emergency mode" "install sparse-volume again"; do
        grep -qF -- "$word" <<<"$output" || { echo "the warning does not say \"$word\": $output"; return 1; }
    done
}

# check_removal_warning SCRIPT REMOVE_ARG UPGRADE_ARG...: the script warns
# on stderr about the fixture's enabled volumes on removal, and says
# nothing on an upgrade (nor on removal without an enabled volume: see
# expect_run's registry).
check_removal_warning() {
    local script=$1 remove_arg=$2 box=$SCRATCH/box-warning stdout stderr
    shift 2
    make_sandbox "$box" yes
    write_fixture_registry "$box"
    run_script "$box" "$script" "$remove_arg" >"$box/stdout" 2>"$box/stderr" ||
        { echo "removal: exited non-zero: $(cat "$box/stderr")"; return 1; }
    stdout=$(cat "$box/stdout") stderr=$(cat "$box/stderr")
    [[ -z $stdout ]] || { echo "removal printed on stdout, not stderr: $stdout"; return 1; }
    removal_warning_is_right "$stderr" || return 1
    stderr=$(run_script "$box" "$script" "$@" 2>&1) || { echo "upgrade: exited non-zero: $stderr"; return 1; }
    [[ -z $stderr ]] || { echo "an upgrade printed: $stderr"; return 1; }
}

# dpkg itself, installing into a scratch root: --root with chrootless
# maintainer scripts, which see that root as DPKG_ROOT (dependencies are not
# installed there, hence --force-depends).
dpkg_in() {
    local root=$1
    shift
    dpkg --root="$root" --force-script-chrootless --force-depends --log=/dev/null "$@"
}

# The link `systemctl enable sparse-volume-metrics.timer` makes in ROOT.
TIMER_LINK=etc/systemd/system/timers.target.wants/sparse-volume-metrics.timer

enable_metrics_timer() {
    mkdir -p "$(dirname "$1/$TIMER_LINK")"
    ln -s /usr/lib/systemd/system/sparse-volume-metrics.timer "$1/$TIMER_LINK"
}

# Install, reinstall over local changes (what dpkg does on an upgrade),
# remove, purge: modes as packaged, the edited conffile kept, volume data
# and registry kept by remove and purge, and purge says where they are.
# remove warns about the enabled volume (a reinstall does not) and keeps
# the metrics timer enabled (the admin's choice, kept like a conffile, as
# debhelper does); purge, through the real deb-systemd-helper, forgets it.
check_dpkg_lifecycle() {
    local deb=$1 root=$SCRATCH/dpkg-root output
    local data=$root/var/lib/sparse-volume/backing
    local entry=$root/etc/sparse-volume/volumes.d/$PG_DATA.toml
    local config=$root/etc/sparse-volume/config.toml
    mkdir -p "$root/var/lib/dpkg/info" "$root/var/lib/dpkg/updates"
    touch "$root/var/lib/dpkg/status" "$root/var/lib/dpkg/available"

    output=$(dpkg_in "$root" -i "$deb" 2>&1) || { echo "install: $output"; return 1; }
    field_is "mode of /var/lib/sparse-volume" "$(stat -c %a "$root/var/lib/sparse-volume")" 700 || return 1
    echo data >"$data"
    registry_file "$(dirname "$entry")" "$PG_DATA" 'name = "pg-data"' 'enabled = true'
    echo '# local edit' >>"$config"
    enable_metrics_timer "$root"

    output=$(dpkg_in "$root" -i "$deb" 2>&1) || { echo "reinstall: $output"; return 1; }
    grep -q '^# local edit$' "$config" || { echo "reinstall replaced the edited config.toml"; return 1; }
    ! grep -i 'warning' <<<"$output" || { echo "reinstall warned"; return 1; }
    [[ -L $root/$TIMER_LINK ]] || { echo "reinstall disabled the metrics timer"; return 1; }

    output=$(dpkg_in "$root" -r sparse-volume 2>&1) || { echo "remove: $output"; return 1; }
    [[ ! -e $root/usr/bin/sparse-volume ]] || { echo "remove left /usr/bin/sparse-volume"; return 1; }
    [[ -f $data && -f $entry && -f $config ]] || { echo "remove deleted data, registry or config.toml"; return 1; }
    grep -qF "$PG_DATA (pg-data)" <<<"$output" || { echo "remove did not warn about the enabled volume: $output"; return 1; }
    [[ -L $root/$TIMER_LINK ]] || { echo "remove forgot that the metrics timer is enabled"; return 1; }

    output=$(dpkg_in "$root" -P sparse-volume 2>&1) || { echo "purge: $output"; return 1; }
    [[ -f $data && -f $entry ]] || { echo "purge deleted volume data or the registry"; return 1; }
    [[ ! -e $config ]] || { echo "purge left config.toml"; return 1; }
    grep -q '^sparse-volume: kept volume data (/var/lib/sparse-volume' <<<"$output" ||
        { echo "purge did not say where the data is kept: $output"; return 1; }
    ! grep 'warning' <<<"$output" || { echo "purge: dpkg warned"; return 1; }
    [[ ! -L $root/$TIMER_LINK ]] || { echo "purge left the metrics timer enabled"; return 1; }

    # Without volumes, install and purge leave nothing behind, silently,
    # and the timer purge forgot stays off.
    rm -r "$root/var/lib/sparse-volume" "$root/etc/sparse-volume"
    output=$(dpkg_in "$root" -i "$deb" 2>&1) || { echo "install again: $output"; return 1; }
    [[ ! -L $root/$TIMER_LINK ]] || { echo "installing after purge enabled the metrics timer"; return 1; }
    output=$(dpkg_in "$root" -P sparse-volume 2>&1) || { echo "purge without volumes: $output"; return 1; }
    [[ ! -e $root/var/lib/sparse-volume && ! -e $root/etc/sparse-volume ]] ||
        { echo "purge without volumes left $(ls -d "$root"/var/lib/sparse-volume "$root"/etc/sparse-volume 2>/dev/null)"; return 1; }
    ! grep -E 'warning|kept' <<<"$output" || { echo "purge without volumes printed the above"; return 1; }
}

check_rpm_scripts() {
    local rpm=$1 box=$SCRATCH/box reload="--system daemon-reload"
    rpm -qp --qf '%{POSTIN}\n' "$rpm" >"$SCRATCH/post"
    rpm -qp --qf '%{POSTUN}\n' "$rpm" >"$SCRATCH/postun"
    rpm -qp --qf '%{PREUN}\n' "$rpm" >"$SCRATCH/preun"
    field_is "%post/%preun/%postun interpreter" "$(rpm -qp --qf '%{POSTINPROG} %{PREUNPROG} %{POSTUNPROG}' "$rpm")" \
        "/bin/sh /bin/sh /bin/sh" &&
        no_forbidden_commands "$SCRATCH/post" "$SCRATCH/preun" "$SCRATCH/postun" &&
        expect_run "%post install" "$box" yes "$INSTALL_LOG" "" "$SCRATCH/post" 1 &&
        expect_run "%post upgrade" "$box" yes "$INSTALL_LOG" "" "$SCRATCH/post" 2 &&
        expect_run "%post, no systemd" "$box" no "" "" "$SCRATCH/post" 1 &&
        expect_run "%preun erase" "$box" yes "$RPM_DISABLE_TIMER" "" "$SCRATCH/preun" 0 &&
        expect_run "%preun erase, no systemd" "$box" no "$RPM_DISABLE_TIMER_OFFLINE" "" "$SCRATCH/preun" 0 &&
        expect_run "%preun upgrade" "$box" yes "" "" "$SCRATCH/preun" 1 &&
        expect_run "%postun upgrade" "$box" yes "$reload" "" "$SCRATCH/postun" 1 &&
        expect_run "%postun erase" "$box" yes "$reload" kept-message "$SCRATCH/postun" 0 &&
        check_removal_warning "$SCRATCH/preun" 0 1
}

# --- rpm itself ---------------------------------------------------------------

# rpm on root $1; $2 is the mode (-i, -U, -e, -V, ...). Debian's rpm warns
# at every install and erase that alien is preferable, unless forced.
rpm_in() {
    local root=$1 mode=$2 quiet=()
    shift 2
    # Not `rpm --help | grep -q`: grep exits first, and pipefail would see
    # rpm's SIGPIPE now and then.
    if [[ $mode == -[iUe] && $(rpm --help) == *--force-debian* ]]; then
        quiet=(--force-debian)
    fi
    rpm --root "$root" --dbpath /var/lib/rpm "$mode" "${quiet[@]}" "$@"
}

# copy_program ROOT PROGRAM [AS]: PROGRAM and the libraries it links into
# ROOT, at PROGRAM's path or AS.
copy_program() {
    local root=$1 program=$2 libs lib
    install -D "$program" "$root${3:-$program}"
    mapfile -t libs < <(ldd "$program" | grep -o '/[^ ]*')
    for lib in "${libs[@]}"; do
        cp --parents -L "$lib" "$root"
    done
}

# A root where rpm runs the real scriptlets, which it runs chrooted there:
# a /bin/sh (dash), the sed and basename that %preun reads the registry
# with (the spec requires them), /dev/null (the scriptlets redirect to
# it), a systemctl stub that logs its arguments to /systemctl.log, and
# /run/systemd/system if $2 = yes.
make_rpm_root() {
    local root=$1 systemd=$2
    mkdir -p "$root/bin" "$root/usr/bin" "$root/dev" "$root/var/tmp" "$root/var/lib/rpm"
    mknod -m 0666 "$root/dev/null" c 1 3
    copy_program "$root" /bin/dash /bin/sh
    copy_program "$root" /bin/sed
    copy_program "$root" /usr/bin/basename
    # shellcheck disable=SC2016 # $* is the stub's, not ours
    printf '#!/bin/sh\necho "$*" >>/systemctl.log\n%s\n' "$ACTIVE_UNIT_STUB" >"$root/usr/bin/systemctl"
    chmod +x "$root/usr/bin/systemctl"
    if [[ $systemd == yes ]]; then mkdir -p "$root/run/systemd/system"; fi
    rpm_in "$root" --initdb
}

# systemctl_log ROOT EXPECTED WHEN: the stub's calls since the last one.
systemctl_log() {
    local calls
    calls=$(cat "$1/systemctl.log" 2>/dev/null || true)
    rm -f "$1/systemctl.log"
    field_is "systemctl calls at $3" "$calls" "$2"
}

# Release 2 of the same tree through the spec's real %build and %install
# (cargo finds the binaries of release 1 fresh), with a default config.toml
# that differs from release 1's, as when a release documents a new key:
# only then does %config(noreplace) decide anything on upgrade.
build_release_2() {
    (cd "$TOP" && rpmbuild -bb --build-in-place --nodeps --quiet \
        --define "_topdir $SCRATCH/rpmbuild" \
        --define "_rpmdir $1" \
        --define "_build_name_fmt %%{NAME}-%%{VERSION}-%%{RELEASE}.%%{ARCH}.rpm" \
        --define "sv_release 2" \
        --define "__spec_install_post echo '# a key of release 2' >>%{buildroot}/etc/sparse-volume/config.toml" \
        "$HERE/rpm/sparse-volume.spec")
}

# Install, upgrade to release 2 over an edited config.toml, erase, with and
# without systemd, then once more without volumes. --nodeps: the scratch
# root has no util-linux, e2fsprogs or systemd packages.
check_rpm_lifecycle() {
    local rpm1=$1 rpm2 root=$SCRATCH/rpm-root output reload="--system daemon-reload"
    local data=$root/var/lib/sparse-volume/backing
    local entry=$root/etc/sparse-volume/volumes.d/$PG_DATA.toml
    local config=$root/etc/sparse-volume/config.toml
    output=$(build_release_2 "$SCRATCH/release-2" 2>&1) || { echo "building release 2: $output"; return 1; }
    rpm2=$(echo "$SCRATCH"/release-2/sparse-volume-*-2.*.rpm)
    make_rpm_root "$root" yes

    output=$(rpm_in "$root" -i --nodeps "$rpm1" 2>&1) || { echo "install: $output"; return 1; }
    systemctl_log "$root" "$reload"$'\n'"$START_ACTIVE" install || return 1
    output=$(rpm_in "$root" -V --nodeps sparse-volume 2>&1) || { echo "rpm -V after install: $output"; return 1; }
    field_is "mode of /var/lib/sparse-volume" "$(stat -c %a "$root/var/lib/sparse-volume")" 700 || return 1
    echo data >"$data"
    registry_file "$(dirname "$entry")" "$PG_DATA" 'name = "pg-data"' 'enabled = true'
    echo '# local edit' >>"$config"

    # %post of release 2, then %postun of release 1: a reload each; the
    # %preun of release 1 neither touches the timer nor warns.
    output=$(rpm_in "$root" -U --nodeps "$rpm2" 2>&1) || { echo "upgrade: $output"; return 1; }
    systemctl_log "$root" "$reload"$'\n'"$START_ACTIVE"$'\n'"$reload" upgrade || return 1
    ! grep -F "$PG_DATA" <<<"$output" || { echo "upgrade warned about the enabled volume"; return 1; }
    field_is "release after upgrade" "$(rpm_in "$root" -q --qf '%{RELEASE}' sparse-volume)" 2 || return 1
    grep -q '^# local edit$' "$config" || { echo "upgrade replaced the edited config.toml"; return 1; }
    grep -q '^# a key of release 2$' "$config.rpmnew" ||
        { echo "upgrade did not leave release 2's config.toml as config.toml.rpmnew"; return 1; }
    [[ -f $data && -f $entry ]] || { echo "upgrade deleted volume data or the registry"; return 1; }
    # Only the edited config.toml differs from the package.
    output=$(rpm_in "$root" -V --nodeps sparse-volume 2>&1) || true
    [[ $output =~ ^S\.5\.\.\.\.T\.\ +c\ /etc/sparse-volume/config\.toml$ ]] ||
        { echo "rpm -V after upgrade: $output"; return 1; }

    # rpm renames an edited %config file to .rpmsave on erase. %preun
    # disables the timer and warns about the enabled volume.
    output=$(rpm_in "$root" -e --nodeps sparse-volume 2>&1) || { echo "erase: $output"; return 1; }
    systemctl_log "$root" "$RPM_DISABLE_TIMER"$'\n'"$reload" erase || return 1
    grep -qF "$PG_DATA (pg-data)" <<<"$output" || { echo "erase did not warn about the enabled volume: $output"; return 1; }
    [[ ! -e $root/usr/bin/sparse-volume ]] || { echo "erase left /usr/bin/sparse-volume"; return 1; }
    [[ -f $data && -f $entry ]] || { echo "erase deleted volume data or the registry"; return 1; }
    if [[ -e $config ]] || ! grep -q '^# local edit$' "$config.rpmsave"; then
        echo "erase did not keep the edited config.toml as config.toml.rpmsave"
        return 1
    fi
    grep -q '^sparse-volume: kept volume data (/var/lib/sparse-volume' <<<"$output" ||
        { echo "erase did not say where the data is kept: $output"; return 1; }

    rm -r "$root/run/systemd/system"
    output=$(rpm_in "$root" -i --nodeps "$rpm1" 2>&1) || { echo "install, no systemd: $output"; return 1; }
    output=$(rpm_in "$root" -e --nodeps sparse-volume 2>&1) || { echo "erase, no systemd: $output"; return 1; }
    systemctl_log "$root" "$RPM_DISABLE_TIMER_OFFLINE" "install and erase without systemd" || return 1
    [[ -f $data && -f $entry ]] || { echo "erase deleted volume data or the registry"; return 1; }

    # Without volumes (and edits), install and erase leave nothing behind.
    rm -r "$root/var/lib/sparse-volume" "$root/etc/sparse-volume"
    output=$(rpm_in "$root" -i --nodeps "$rpm1" 2>&1) || { echo "install again: $output"; return 1; }
    output=$(rpm_in "$root" -e --nodeps sparse-volume 2>&1) || { echo "erase without volumes: $output"; return 1; }
    [[ ! -e $root/var/lib/sparse-volume && ! -e $root/etc/sparse-volume ]] ||
        { echo "erase without volumes left $(find "$root/var/lib/sparse-volume" "$root/etc/sparse-volume" 2>/dev/null)"; return 1; }
    [[ -z $output ]] || { echo "erase without volumes printed: $output"; return 1; }
}

main() {
    local version deb rpm
    version=$(cargo_field version)
    deb=$(one_file "$DIR" "sparse-volume_${version}-1_*.deb")
    rpm=$(one_file "$DIR" "sparse-volume-${version}-1.*.rpm")
    echo "checking ${deb#"$TOP/"} and ${rpm#"$TOP/"}"

    dpkg-deb -x "$deb" "$SCRATCH/root"
    dpkg-deb -e "$deb" "$SCRATCH/control"

    check ".deb contents match packaging/expected/deb-contents.txt" \
        diff_list "$HERE/expected/deb-contents.txt" "$(deb_listing "$deb")" \
        "dpkg-deb -c $deb | awk '{ print \$1, \$2, \$6 }'"
    check ".deb control fields and conffiles" check_deb_control "$deb" "$version"
    check "lintian: no errors or warnings" check_lintian "$deb"
    check "man pages render without warnings" check_man_pages "$SCRATCH/root"
    check "each command's man page has EXIT STATUS, EXAMPLES and SEE ALSO" check_command_pages "$SCRATCH/root"
    check "README.md and docs/guide/ shipped as docs" check_shipped_docs "$rpm" "$SCRATCH/root"
    check "copyright and License: cover the linked crates (cargo metadata)" check_crate_licenses "$rpm" "$SCRATCH/root"
    check "install.sh reinstalls a rebuilt package of the installed version" check_install_reinstalls "$deb"
    check "completions (bash, fish, zsh) offer option values and the registered volumes" \
        check_completions "$SCRATCH/root"
    check "no shipped binary carries the test hooks" check_no_test_hooks "$SCRATCH/root"
    check "the unit's program and the generator have no clap or zbus code" check_lean_boot_binary "$SCRATCH/root"
    check "config.toml is the commented example" \
        cmp "$HERE/config.toml" "$SCRATCH/root/usr/share/sparse-volume/config.toml"
    check ".deb maintainer scripts" check_deb_scripts "$SCRATCH/control"
    check ".deb install, reinstall, remove, purge with dpkg" check_dpkg_lifecycle "$deb"

    check ".rpm files match packaging/expected/rpm-files.txt" \
        diff_list "$HERE/expected/rpm-files.txt" "$(rpm_listing "$rpm")" \
        "rpm -qp --qf '[%{FILEMODES:perms} %{FILEUSERNAME}/%{FILEGROUPNAME} %{FILENAMES}\\n]' $rpm"
    check ".rpm metadata" check_rpm_metadata "$rpm" "$version"
    check ".rpm scriptlets" check_rpm_scripts "$rpm"
    check "rpmlint: no errors or warnings" check_rpmlint "$rpm"
    check ".rpm install, upgrade to release 2, erase with rpm" check_rpm_lifecycle "$rpm"

    report
}

main "$@"
