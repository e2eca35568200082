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
# - every man page renders with `man --warnings` without a diagnostic;
# - the bash completion parses;
# - the maintainer scripts of both packages, run against a scratch root
#   with a stub systemctl: daemon-reload only where systemd runs, nothing
#   else ever, and removal/purge keep volume data and the registry;
# - dpkg installing, reinstalling, removing and purging the .deb in a
#   scratch root.
#
# Needs dpkg, lintian, rpm, man-db. Runs every check, then prints
# "N passed, N failed" and exits non-zero if any failed.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
TOP=$(cd "$HERE/.." && pwd)
DIR=${1:-${CARGO_TARGET_DIR:-$TOP/target}/packages}
SCRATCH=$(mktemp -d)
trap 'rm -rf "$SCRATCH"' EXIT

passed=0
failed=0

pass() {
    passed=$((passed + 1))
    printf 'ok   %s\n' "$1"
}

fail() {
    failed=$((failed + 1))
    printf 'FAIL %s\n' "$1"
    if [[ -n ${2:-} ]]; then
        printf '%s\n' "$2" | sed 's/^/     /'
    fi
}

# check NAME COMMAND...: passes when COMMAND succeeds; its output explains a
# failure.
check() {
    local name=$1 output
    shift
    if output=$("$@" 2>&1); then
        pass "$name"
    else
        fail "$name" "$output"
    fi
}

# The one file in DIR matching a glob.
only_file() {
    # shellcheck disable=SC2206 # $1 is a glob, expanded on purpose
    local matches=("$DIR"/$1)
    if [[ ${#matches[@]} -ne 1 || ! -f ${matches[0]} ]]; then
        echo "expected exactly one $1 in $DIR, found: ${matches[*]}" >&2
        return 1
    fi
    echo "${matches[0]}"
}

cargo_version() {
    sed -n '/^\[workspace.package\]/,/^\[/ s/^version = "\(.*\)"$/\1/p' "$TOP/Cargo.toml"
}

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
        field_is Recommends "$(dpkg-deb -f "$deb" Recommends)" xfsprogs &&
        field_is Suggests "$(dpkg-deb -f "$deb" Suggests)" gdisk &&
        field_is "control members" "$(dpkg-deb --ctrl-tarfile "$deb" | tar -t | grep -c conffiles)" 0
}

check_rpm_metadata() {
    local rpm=$1 version=$2 info
    info=$(rpm -qp --qf '%{NAME} %{VERSION} %{RELEASE} %{ARCH} %{LICENSE}' "$rpm")
    field_is "name version release arch license" "$info" \
        "sparse-volume $version 1 $(rpm --eval '%{_arch}') MIT" &&
        contains_all "$(rpm -qp --requires "$rpm")" util-linux e2fsprogs systemd 'libc.so.6()(64bit)' &&
        field_is Recommends "$(rpm -qp --recommends "$rpm")" xfsprogs &&
        field_is Suggests "$(rpm -qp --suggests "$rpm")" gdisk &&
        field_is "config files" "$(rpm -qcp "$rpm")" /etc/sparse-volume/config.toml &&
        rpm -qip "$rpm" >/dev/null
}

check_lintian() {
    # Info tags are shown for the record; errors and warnings fail.
    lintian --fail-on error,warning --display-info "$1"
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

# --- maintainer scripts -----------------------------------------------------

# A scratch root for one scenario, with a systemctl stub that logs its
# arguments; $2 = yes makes it look as if systemd were running.
make_sandbox() {
    local box=$1 systemd=$2
    rm -rf "$box" && mkdir -p "$box/bin"
    printf '#!/bin/sh\necho "$*" >>"%s/systemctl.log"\n' "$box" >"$box/bin/systemctl"
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
# upgrade must not detach them), no enabling (the units are static). No
# rm but of config.toml (which postinst installs and purge removes).
no_forbidden_commands() {
    local script
    for script in "$@"; do
        if grep -nE 'systemctl +([a-z-]+ +)*(start|stop|restart|try-restart|reload-or-restart|enable|disable|mask|kill)\b|deb-systemd-(invoke|helper)|invoke-rc\.d|\brm +' "$script" |
            grep -vE '^[0-9]+: *rm -f( "\$\{DPKG_ROOT:-\}\$CONFIG_DIR/config\.toml(\.dpkg-tmp)?")+$'; then
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

check_deb_scripts() {
    local control=$1 box=$SCRATCH/box reload="--system daemon-reload"
    # Another root for DPKG_ROOT, where postinst makes its directories.
    local other=$SCRATCH/other-root
    mkdir -p "$other$box/etc" "$other$box/var/lib"
    install -D -m 0644 "$HERE/config.toml" "$other$box/usr/share/sparse-volume/config.toml"
    no_forbidden_commands "$control/postinst" "$control/postrm" &&
        expect_run "postinst configure, systemd" "$box" yes "$reload" "" "$control/postinst" configure 0.0.9-1 &&
        expect_run "postinst configure, no systemd" "$box" no "" "" "$control/postinst" configure &&
        DPKG_ROOT=$other expect_run "postinst configure, DPKG_ROOT" "$box" yes "" "" "$control/postinst" configure &&
        cmp "$HERE/config.toml" "$other$box/etc/sparse-volume/config.toml" &&
        expect_run "postrm remove, systemd" "$box" yes "$reload" "" "$control/postrm" remove &&
        expect_run "postrm upgrade" "$box" yes "" "" "$control/postrm" upgrade 0.2.0-1 &&
        expect_run "postrm purge" "$box" yes "" kept-message "$control/postrm" purge &&
        check_postinst_config "$control/postinst"
}

# dpkg itself, installing into a scratch root: --root with chrootless
# maintainer scripts, which see that root as DPKG_ROOT (dependencies are not
# installed there, hence --force-depends).
dpkg_in() {
    local root=$1
    shift
    dpkg --root="$root" --force-script-chrootless --force-depends --log=/dev/null "$@"
}

# Install, reinstall over local changes (what dpkg does on an upgrade),
# remove, purge: modes as packaged, the edited conffile kept, volume data
# and registry kept by remove and purge, and purge says where they are.
check_dpkg_lifecycle() {
    local deb=$1 root=$SCRATCH/dpkg-root output
    local data=$root/var/lib/sparse-volume/backing
    local entry=$root/etc/sparse-volume/volumes.d/x.toml
    local config=$root/etc/sparse-volume/config.toml
    mkdir -p "$root/var/lib/dpkg/info" "$root/var/lib/dpkg/updates"
    touch "$root/var/lib/dpkg/status" "$root/var/lib/dpkg/available"

    output=$(dpkg_in "$root" -i "$deb" 2>&1) || { echo "install: $output"; return 1; }
    field_is "mode of /var/lib/sparse-volume" "$(stat -c %a "$root/var/lib/sparse-volume")" 700 || return 1
    echo data >"$data"
    echo 'uuid = "x"' >"$entry"
    echo '# local edit' >>"$config"

    output=$(dpkg_in "$root" -i "$deb" 2>&1) || { echo "reinstall: $output"; return 1; }
    grep -q '^# local edit$' "$config" || { echo "reinstall replaced the edited config.toml"; return 1; }

    output=$(dpkg_in "$root" -r sparse-volume 2>&1) || { echo "remove: $output"; return 1; }
    [[ ! -e $root/usr/bin/sparse-volume ]] || { echo "remove left /usr/bin/sparse-volume"; return 1; }
    [[ -f $data && -f $entry && -f $config ]] || { echo "remove deleted data, registry or config.toml"; return 1; }

    output=$(dpkg_in "$root" -P sparse-volume 2>&1) || { echo "purge: $output"; return 1; }
    [[ -f $data && -f $entry ]] || { echo "purge deleted volume data or the registry"; return 1; }
    [[ ! -e $config ]] || { echo "purge left config.toml"; return 1; }
    grep -q '^sparse-volume: kept volume data (/var/lib/sparse-volume' <<<"$output" ||
        { echo "purge did not say where the data is kept: $output"; return 1; }
    ! grep 'warning' <<<"$output" || { echo "purge: dpkg warned"; return 1; }

    # Without volumes, install and purge leave nothing behind, silently.
    rm -r "$root/var/lib/sparse-volume" "$root/etc/sparse-volume"
    output=$(dpkg_in "$root" -i "$deb" 2>&1) || { echo "install again: $output"; return 1; }
    output=$(dpkg_in "$root" -P sparse-volume 2>&1) || { echo "purge without volumes: $output"; return 1; }
    [[ ! -e $root/var/lib/sparse-volume && ! -e $root/etc/sparse-volume ]] ||
        { echo "purge without volumes left $(ls -d "$root"/var/lib/sparse-volume "$root"/etc/sparse-volume 2>/dev/null)"; return 1; }
    ! grep -E 'warning|kept' <<<"$output" || { echo "purge without volumes printed the above"; return 1; }
}

check_rpm_scripts() {
    local rpm=$1 box=$SCRATCH/box reload="--system daemon-reload"
    rpm -qp --qf '%{POSTIN}\n' "$rpm" >"$SCRATCH/post"
    rpm -qp --qf '%{POSTUN}\n' "$rpm" >"$SCRATCH/postun"
    field_is "%post/%postun interpreter" "$(rpm -qp --qf '%{POSTINPROG} %{POSTUNPROG}' "$rpm")" "/bin/sh /bin/sh" &&
        no_forbidden_commands "$SCRATCH/post" "$SCRATCH/postun" &&
        expect_run "%post install" "$box" yes "$reload" "" "$SCRATCH/post" 1 &&
        expect_run "%post upgrade" "$box" yes "$reload" "" "$SCRATCH/post" 2 &&
        expect_run "%post, no systemd" "$box" no "" "" "$SCRATCH/post" 1 &&
        expect_run "%postun upgrade" "$box" yes "$reload" "" "$SCRATCH/postun" 1 &&
        expect_run "%postun erase" "$box" yes "$reload" kept-message "$SCRATCH/postun" 0
}

main() {
    local version deb rpm
    version=$(cargo_version)
    deb=$(only_file "sparse-volume_${version}-1_*.deb")
    rpm=$(only_file "sparse-volume-${version}-1.*.rpm")
    echo "checking ${deb#"$TOP/"} and ${rpm#"$TOP/"}"

    dpkg-deb -x "$deb" "$SCRATCH/root"
    dpkg-deb -e "$deb" "$SCRATCH/control"

    check ".deb contents match packaging/expected/deb-contents.txt" \
        diff_list "$HERE/expected/deb-contents.txt" "$(deb_listing "$deb")" \
        "dpkg-deb -c $deb | awk '{ print \$1, \$2, \$6 }'"
    check ".deb control fields and conffiles" check_deb_control "$deb" "$version"
    check "lintian: no errors or warnings" check_lintian "$deb"
    check "man pages render without warnings" check_man_pages "$SCRATCH/root"
    check "bash completion parses" \
        bash -n "$SCRATCH/root/usr/share/bash-completion/completions/sparse-volume"
    check "config.toml is the commented example" \
        cmp "$HERE/config.toml" "$SCRATCH/root/usr/share/sparse-volume/config.toml"
    check ".deb maintainer scripts" check_deb_scripts "$SCRATCH/control"
    check ".deb install, reinstall, remove, purge with dpkg" check_dpkg_lifecycle "$deb"

    check ".rpm files match packaging/expected/rpm-files.txt" \
        diff_list "$HERE/expected/rpm-files.txt" "$(rpm_listing "$rpm")" \
        "rpm -qp --qf '[%{FILEMODES:perms} %{FILEUSERNAME}/%{FILEGROUPNAME} %{FILENAMES}\\n]' $rpm"
    check ".rpm metadata" check_rpm_metadata "$rpm" "$version"
    check ".rpm scriptlets" check_rpm_scripts "$rpm"

    printf '%d passed, %d failed\n' "$passed" "$failed"
    [[ $failed -eq 0 ]]
}

main "$@"
