//! `systemd-analyze verify` of the static units together with what the
//! generator writes, in a throw-away root that holds this host's systemd
//! units, ours, the generator's output and a few consumer units.
//!
//! Besides "verify is happy", the ordering we promise is proven with probe
//! units: a probe ordered After=X and Before=Y closes an ordering cycle
//! exactly when Y is (transitively) ordered before X, and verify reports
//! that cycle. So a probe demonstrates an ordering chain that systemd
//! itself computed, including the dependencies it adds implicitly (mounts
//! after `blockdev@.target`, `RequiresMountsFor=` after mount units).

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;
use std::process::Command;

use tempfile::TempDir;

/// Filesystem mode, backing file on a separately mounted file system whose
/// mount point has a space in it.
const FS_ID: &str = "53ca3910-b376-4076-95e0-d56a0f20e36e";
/// Block mode, backing file in the default storage root.
const BLOCK_ID: &str = "b509373d-5761-4662-b3ef-04c74fc51fac";
const FS_INSTANCE: &str = "sparse-volume@53ca3910-b376-4076-95e0-d56a0f20e36e.service";
const BLOCK_INSTANCE: &str = "sparse-volume@b509373d-5761-4662-b3ef-04c74fc51fac.service";
/// `systemd-escape --path --suffix=mount "/srv/fast disk"`
const BACKING_MOUNT: &str = "srv-fast\\x20disk.mount";
/// `systemd-escape --path --suffix=mount /var/lib/sparse-volume`
const DEFAULT_ROOT_MOUNT: &str = "var-lib-sparse\\x2dvolume.mount";
/// A consumer of the filesystem volume, as fstab-generator writes it for
/// `UUID=<FS_ID> /data ext4`.
const DATA_MOUNT: &str = "data.mount";
/// A consumer of the block volume.
const BLOCK_SWAP: &str =
    "dev-disk-by\\x2dpartuuid-b509373d\\x2d5761\\x2d4662\\x2db3ef\\x2d04c74fc51fac.swap";
const KUBELET: &str = "kubelet.service";
/// A consumer of "every volume tried", with the strongest dependency the
/// guide (docs/guide/boot.md) allows on the target.
const NEEDS_ALL: &str = "needs-all-volumes.service";
/// A consumer of one particular volume, as the guide advises.
const NEEDS_FS: &str = "needs-fs-volume.service";
const HOST_UNITS: &str = "/usr/lib/systemd/system";

fn write(path: &Path, text: &str) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, text).unwrap();
}

/// verify checks that ExecStart= names an executable: the unit's program
/// where the unit runs it, and one at the CLI's path for the consumers of
/// the tests.
fn install_executables(r: &Path) {
    for (dir, name) in [
        ("usr/libexec", "sparse-volume-unit"),
        ("usr/bin", "sparse-volume"),
    ] {
        fs::create_dir_all(r.join(dir)).unwrap();
        fs::copy(
            env!("CARGO_BIN_EXE_sparse-volume-unit"),
            r.join(dir).join(name),
        )
        .unwrap();
    }
}

/// Builds the root; `edit_template` may alter our template (to prove that
/// a broken unit is caught).
fn build_root(edit_template: impl Fn(String) -> String) -> TempDir {
    assert!(
        Path::new(HOST_UNITS).join("blockdev@.target").exists(),
        "these tests need systemd's units in {HOST_UNITS} (Debian package systemd)"
    );
    let root = TempDir::new().unwrap();
    let r = root.path();
    let units = r.join("usr/lib/systemd/system");
    fs::create_dir_all(units.parent().unwrap()).unwrap();
    let copied = Command::new("cp")
        .arg("-a")
        .arg(HOST_UNITS)
        .arg(units.parent().unwrap())
        .status()
        .unwrap();
    assert!(copied.success(), "copying {HOST_UNITS}");

    let ours = Path::new(env!("CARGO_MANIFEST_DIR")).join("../units");
    for entry in fs::read_dir(&ours).unwrap() {
        let path = entry.unwrap().path();
        let mut text = fs::read_to_string(&path).unwrap();
        if path.file_name().unwrap() == "sparse-volume@.service" {
            text = edit_template(text);
        }
        write(&units.join(path.file_name().unwrap()), &text);
    }
    install_executables(r);

    write(
        &r.join("etc/sparse-volume/config.toml"),
        "storage_roots = [\"/var/lib/sparse-volume\", \"/srv/fast disk\"]\n",
    );
    write(
        &r.join(format!("etc/sparse-volume/volumes.d/{FS_ID}.toml")),
        &format!(
            "uuid = \"{FS_ID}\"\npath = \"/srv/fast disk/{FS_ID}\"\nsize = 1073741824\nmode = \"filesystem\"\n"
        ),
    );
    write(
        &r.join(format!("etc/sparse-volume/volumes.d/{BLOCK_ID}.toml")),
        &format!(
            "uuid = \"{BLOCK_ID}\"\npath = \"/var/lib/sparse-volume/{BLOCK_ID}\"\nsize = 1073741824\nmode = \"block\"\n"
        ),
    );
    let generator_dir = r.join("run/systemd/generator");
    let early = r.join("run/systemd/generator.early");
    let late = r.join("run/systemd/generator.late");
    for dir in [&generator_dir, &early, &late] {
        fs::create_dir_all(dir).unwrap();
    }
    let generated = Command::new(env!("CARGO_BIN_EXE_sparse-volume-generator"))
        .args([&generator_dir, &early, &late])
        .env("SPARSE_VOLUME_ROOT", r)
        .output()
        .unwrap();
    assert!(generated.status.success(), "{generated:?}");
    assert!(generated.stderr.is_empty(), "{generated:?}");

    // What an fstab with the backing file system, the default storage root
    // on its own file system, and one consumer per volume generates.
    let etc = r.join("etc/systemd/system");
    write(
        &etc.join(BACKING_MOUNT),
        "[Mount]\nWhat=/dev/vdb\nWhere=/srv/fast disk\nType=ext4\n",
    );
    write(
        &etc.join(DEFAULT_ROOT_MOUNT),
        "[Mount]\nWhat=/dev/vdc\nWhere=/var/lib/sparse-volume\nType=xfs\n",
    );
    write(
        &etc.join(DATA_MOUNT),
        &format!("[Mount]\nWhat=/dev/disk/by-uuid/{FS_ID}\nWhere=/data\nType=ext4\n"),
    );
    write(
        &etc.join(BLOCK_SWAP),
        &format!("[Swap]\nWhat=/dev/disk/by-partuuid/{BLOCK_ID}\n"),
    );
    for (target, unit) in [
        ("local-fs.target.requires", BACKING_MOUNT),
        ("local-fs.target.requires", DEFAULT_ROOT_MOUNT),
        ("local-fs.target.requires", DATA_MOUNT),
        ("swap.target.requires", BLOCK_SWAP),
    ] {
        fs::create_dir_all(etc.join(target)).unwrap();
        symlink(format!("../{unit}"), etc.join(target).join(unit)).unwrap();
    }
    write(
        &etc.join(KUBELET),
        "[Unit]\nWants=sparse-volumes.target\nAfter=sparse-volumes.target\n\n[Service]\nExecStart=/usr/bin/sparse-volume\n",
    );
    write(
        &etc.join(NEEDS_ALL),
        "[Unit]\nRequires=sparse-volumes.target\nAfter=sparse-volumes.target\n\n[Service]\nExecStart=/usr/bin/sparse-volume\n",
    );
    write(
        &etc.join(NEEDS_FS),
        &format!("[Unit]\nRequires={FS_INSTANCE}\nAfter={FS_INSTANCE}\n\n[Service]\nExecStart=/usr/bin/sparse-volume\n"),
    );
    root
}

/// Runs `systemd-analyze verify` on `units` inside `root`.
fn verify(root: &Path, units: &[&str]) -> (bool, String) {
    let output = Command::new("systemd-analyze")
        .arg("verify")
        .arg(format!("--root={}", root.display()))
        // No man page is installed in the test root.
        .arg("--man=no")
        .args(units)
        // With --root, verify searches a temporary generator directory
        // instead of /run/systemd/generator; name it (relative to the root)
        // first, and the trailing ':' keeps the default search path.
        .env("SYSTEMD_UNIT_PATH", "/run/systemd/generator:")
        .env_remove("SYSTEMD_LOG_LEVEL")
        .env_remove("SYSTEMD_LOG_TARGET")
        .output()
        .expect("running systemd-analyze (Debian package systemd)");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// Everything wrong with our units in this root, empty when all is well.
fn problems(root: &Path) -> String {
    let units = [
        FS_INSTANCE,
        BLOCK_INSTANCE,
        "sparse-volumes.target",
        "sparse-volume-metrics.service",
        "sparse-volume-metrics.timer",
        BACKING_MOUNT,
        DEFAULT_ROOT_MOUNT,
        DATA_MOUNT,
        BLOCK_SWAP,
        KUBELET,
        NEEDS_ALL,
        NEEDS_FS,
        // Named so that their jobs join the transaction: an ordering cycle
        // only shows among jobs that are in it.
        "local-fs-pre.target",
        "local-fs.target",
        "swap.target",
    ];
    let (success, stderr) = verify(root, &units);
    let mut report = String::new();
    if !success {
        report.push_str("systemd-analyze verify failed\n");
    }
    // The only stderr tolerated is about the host's own units copied into
    // the root (their settings may be newer than this systemd): a line
    // that names none of the units above or our UUIDs and reports no
    // ordering cycle or transaction failure.
    let ours = [
        "sparse-volume",
        FS_ID,
        BLOCK_ID,
        "blockdev@",
        "srv-fast",
        "data.mount",
        "by\\x2dpartuuid",
        "kubelet",
        "needs-",
        "local-fs",
        "swap.target",
    ];
    for line in stderr.lines() {
        let relevant = ours.iter().any(|name| line.contains(name))
            || line.contains("cycle")
            || line.contains("ransaction");
        if relevant {
            report.push_str(&format!("  {line}\n"));
        } else {
            eprintln!("ignored (host unit): {line}");
        }
    }
    report
}

#[test]
fn units_and_generated_drop_ins_verify_cleanly() {
    let root = build_root(|text| text);
    let report = problems(root.path());
    assert!(report.is_empty(), "\n{report}");
}

#[test]
fn a_cycle_through_local_fs_pre_would_be_caught() {
    // The mistake the template's comments warn about: with the backing
    // file on its own file system this is an ordering cycle.
    let root =
        build_root(|text| text.replace("\n[Service]", "Before=local-fs-pre.target\n\n[Service]"));
    let report = problems(root.path());
    assert!(report.contains("ordering cycle"), "not caught:\n{report}");
}

/// Asserts that `before` is ordered (transitively) before `after`, by
/// showing that a probe ordered After=`after` Before=`before` closes a
/// cycle.
fn assert_ordered(root: &Path, before: &str, after: &str, also: &[&str]) {
    let probe = "ordering-probe.service";
    write(
        &root.join("etc/systemd/system").join(probe),
        &format!(
            "[Unit]\nDefaultDependencies=no\nAfter={after}\nBefore={before}\n\n[Service]\nExecStart=/usr/bin/sparse-volume\n"
        ),
    );
    let mut units = vec![before, after];
    units.extend_from_slice(also);
    units.push(probe);
    let (success, stderr) = verify(root, &units);
    fs::remove_file(root.join("etc/systemd/system").join(probe)).unwrap();
    assert!(
        !success
            && stderr.contains("Found ordering cycle")
            && stderr.contains(&format!(
                "Failed to create {probe}/start: Transaction order is cyclic"
            )),
        "{before} is not ordered before {after}:\n{stderr}"
    );
}

#[test]
fn promised_orderings_hold() {
    let root = build_root(|text| text);
    let r = root.path();
    // Started after (so stopped before) the file systems holding backing
    // files: a separately mounted one from the drop-in's quoted
    // RequiresMountsFor= (path with a space), the default root from the
    // template.
    assert_ordered(r, BACKING_MOUNT, FS_INSTANCE, &[]);
    assert_ordered(r, DEFAULT_ROOT_MOUNT, BLOCK_INSTANCE, &[]);
    // Consumers of the udev links start after (so stop before) the volume,
    // through blockdev@.target, which systemd orders mounts and swaps after.
    assert_ordered(r, FS_INSTANCE, DATA_MOUNT, &[]);
    assert_ordered(r, BLOCK_INSTANCE, BLOCK_SWAP, &[]);
    // sparse-volumes.target is reached after every enabled volume.
    assert_ordered(r, FS_INSTANCE, "sparse-volumes.target", &[]);
    assert_ordered(r, BLOCK_INSTANCE, KUBELET, &["sparse-volumes.target"]);
}

/// The quoting of `RequiresMountsFor=` (fixture 11-special-characters)
/// survives systemd's parser: verify's debug dump of each instance shows
/// the path as the registry has it.
#[test]
fn awkward_paths_reach_systemd_intact() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/11-special-characters");
    let root = TempDir::new().unwrap();
    let r = root.path();
    let units = r.join("usr/lib/systemd/system");
    fs::create_dir_all(&units).unwrap();
    for entry in fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("../units")).unwrap() {
        let path = entry.unwrap().path();
        fs::copy(&path, units.join(path.file_name().unwrap())).unwrap();
    }
    install_executables(r);
    let generator_dir = r.join("run/systemd/generator");
    fs::create_dir_all(&generator_dir).unwrap();
    let generated = Command::new(env!("CARGO_BIN_EXE_sparse-volume-generator"))
        .arg(&generator_dir)
        .env("SPARSE_VOLUME_ROOT", &fixture)
        .output()
        .unwrap();
    assert!(generated.status.success(), "{generated:?}");

    for (id, path) in [
        ("42ef8573-61f8-49c3-bcf8-2224fa077e7d", "/srv/100%"),
        ("2ca19031-3069-456b-881a-42c019bc53a6", "/srv/a\"quote"),
        ("9e4f8a9d-86f6-4c02-8728-3f79df764478", "/srv/back\\slash"),
    ] {
        let output = Command::new("systemd-analyze")
            .arg("verify")
            .arg(format!("--root={}", r.display()))
            .arg("--man=no")
            .arg(format!("sparse-volume@{id}.service"))
            .env("SYSTEMD_UNIT_PATH", "/run/systemd/generator:")
            .env("SYSTEMD_LOG_LEVEL", "debug")
            .env_remove("SYSTEMD_LOG_TARGET")
            .output()
            .expect("running systemd-analyze");
        // The dump goes to stdout, the log to stderr.
        let dump = String::from_utf8_lossy(&output.stdout);
        let wanted = format!("RequiresMountsFor: {path} (origin-file)");
        assert!(
            output.status.success() && dump.contains(&wanted),
            "{wanted} not in the dump of sparse-volume@{id}.service:\n{dump}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

/// A backing file on a network file system: the volume attaches after the
/// network is online, and the network is online only after `sysinit.target`,
/// so after `local-fs.target`. A local fstab consumer of the volume (before
/// `local-fs.target`) then closes an ordering cycle, which systemd breaks
/// by dropping a job at boot; a `_netdev` consumer does not. The design page and
/// sparse-volume-generator(8) tell users so; this proves the advice.
#[test]
fn a_volume_on_a_network_file_system_needs_netdev_consumers() {
    let root = build_root(|text| text);
    let r = root.path();
    let etc = r.join("etc/systemd/system");
    // What fstab-generator makes of "server:/export /srv/fast\040disk nfs".
    fs::remove_file(etc.join("local-fs.target.requires").join(BACKING_MOUNT)).unwrap();
    write(
        &etc.join(BACKING_MOUNT),
        "[Mount]\nWhat=server:/export\nWhere=/srv/fast disk\nType=nfs\nOptions=_netdev\n",
    );
    // Like systemd-networkd-wait-online or ifupdown-wait-online: an
    // ordinary service (so after sysinit.target) that network-online.target
    // waits for.
    let wait_online = "wait-online.service";
    write(
        &etc.join(wait_online),
        "[Unit]\nBefore=network-online.target\n\n[Service]\nType=oneshot\nExecStart=/usr/bin/sparse-volume\n",
    );
    for (target, unit) in [
        ("remote-fs.target.requires", BACKING_MOUNT),
        ("network-online.target.wants", wait_online),
    ] {
        fs::create_dir_all(etc.join(target)).unwrap();
        symlink(format!("../{unit}"), etc.join(target).join(unit)).unwrap();
    }
    let units = [
        FS_INSTANCE,
        BACKING_MOUNT,
        DATA_MOUNT,
        wait_online,
        "network-online.target",
        "local-fs.target",
        "remote-fs.target",
    ];
    let (_, stderr) = verify(r, &units);
    assert!(
        stderr.contains("Found ordering cycle") && stderr.contains(DATA_MOUNT),
        "a local consumer of a network-backed volume is no cycle?\n{stderr}"
    );

    // The consumer made _netdev, as fstab-generator writes it.
    fs::remove_file(etc.join("local-fs.target.requires").join(DATA_MOUNT)).unwrap();
    write(
        &etc.join(DATA_MOUNT),
        &format!(
            "[Mount]\nWhat=/dev/disk/by-uuid/{FS_ID}\nWhere=/data\nType=ext4\nOptions=_netdev\n"
        ),
    );
    symlink(
        format!("../{DATA_MOUNT}"),
        etc.join("remote-fs.target.requires").join(DATA_MOUNT),
    )
    .unwrap();
    let (_, stderr) = verify(r, &units);
    assert!(!stderr.contains("cycle"), "{stderr}");
}

/// The dependency kinds along which systemd carries a stop job from a
/// unit to others (its `UNIT_ATOM_PROPAGATE_STOP` and
/// `…_STOP_GRACEFUL` atoms): the reverse sides of `Requires=`,
/// `Requisite=`, `BindsTo=` and `PartOf=`, and `PropagatesStopTo=`.
const STOP_CARRIERS: [&str; 5] = [
    "RequiredBy",
    "RequisiteOf",
    "BoundBy",
    "ConsistsOf",
    "PropagatesStopTo",
];

/// Every unit that systemd would stop along with `unit`, computed from
/// its own dependency graph: verify's debug dump lists each named unit's
/// dependencies in both directions, including the implicit ones and those
/// from `.wants`/`.requires` directories. `loaded` names units that must
/// be loaded for their reverse dependencies to show (consumers are only
/// known to systemd once something loads them).
fn stopped_along_with(root: &Path, unit: &str, loaded: &[&str]) -> Vec<String> {
    let mut stopped: Vec<String> = Vec::new();
    let mut frontier = vec![unit.to_string()];
    while !frontier.is_empty() {
        let mut named: Vec<&str> = loaded.to_vec();
        named.extend(frontier.iter().map(String::as_str));
        let dump = dependency_dump(root, &named);
        let mut next = Vec::new();
        for from in &frontier {
            let edges = dump
                .get(from)
                .unwrap_or_else(|| panic!("no dump of {from}"));
            for (kind, to) in edges {
                let new = to != unit && !stopped.contains(to) && !next.contains(to);
                if STOP_CARRIERS.contains(&kind.as_str()) && new {
                    next.push(to.clone());
                }
            }
        }
        stopped.extend(next.iter().cloned());
        frontier = next;
    }
    stopped
}

/// `systemd-analyze verify`'s dump of `units`: for each, its dependencies
/// as (kind, other unit), e.g. ("WantedBy", "sparse-volumes.target").
fn dependency_dump(root: &Path, units: &[&str]) -> BTreeMap<String, Vec<(String, String)>> {
    let output = Command::new("systemd-analyze")
        .arg("verify")
        .arg(format!("--root={}", root.display()))
        .arg("--man=no")
        .args(units)
        .env("SYSTEMD_UNIT_PATH", "/run/systemd/generator:")
        .env("SYSTEMD_LOG_LEVEL", "debug")
        .env_remove("SYSTEMD_LOG_TARGET")
        .output()
        .expect("running systemd-analyze");
    let mut dump: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    let mut current = None;
    // The dump goes to stdout: "-> Unit NAME:" opens a unit, then one
    // "Kind: other (origin-…)" line per dependency.
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let line = line.trim();
        if let Some(name) = line
            .strip_prefix("-> Unit ")
            .and_then(|rest| rest.strip_suffix(':'))
        {
            current = Some(name.to_string());
            dump.entry(name.to_string()).or_default();
        } else if let (Some(unit), Some((kind, value))) = (&current, line.split_once(": ")) {
            if let Some(other) = value.split_whitespace().next() {
                dump.get_mut(unit)
                    .unwrap()
                    .push((kind.to_string(), other.to_string()));
            }
        }
    }
    assert!(
        units.iter().all(|u| dump.contains_key(*u)),
        "verify did not dump all of {units:?}:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    dump
}

/// Stopping, disabling or removing one volume stops its own consumers and
/// nothing else: not `sparse-volumes.target`, not a unit that `Requires=`
/// the target, not the other volume. (The VM scenario proves the same with
/// running units.)
#[test]
fn stopping_a_volume_stops_only_its_own_consumers() {
    let root = build_root(|text| text);
    let r = root.path();
    let consumers = [KUBELET, NEEDS_ALL, NEEDS_FS, "sparse-volumes.target"];
    let stopped = stopped_along_with(r, FS_INSTANCE, &consumers);
    assert_eq!(stopped, [NEEDS_FS], "stopping {FS_INSTANCE}");
    let stopped = stopped_along_with(r, BLOCK_INSTANCE, &consumers);
    assert!(stopped.is_empty(), "stopping {BLOCK_INSTANCE}: {stopped:?}");

    // The target only wants the volumes.
    let dump = dependency_dump(r, &["sparse-volumes.target"]);
    for instance in [FS_INSTANCE, BLOCK_INSTANCE] {
        let wants = ("Wants".to_string(), instance.to_string());
        assert!(dump["sparse-volumes.target"].contains(&wants), "{dump:?}");
    }
}

/// The check above would catch the generator's former
/// `sparse-volumes.target.requires/` links.
#[test]
fn a_requires_link_from_the_target_would_be_caught() {
    let root = build_root(|text| text);
    let r = root.path();
    let requires = r.join("etc/systemd/system/sparse-volumes.target.requires");
    fs::create_dir_all(&requires).unwrap();
    symlink(
        "/usr/lib/systemd/system/sparse-volume@.service",
        requires.join(FS_INSTANCE),
    )
    .unwrap();
    let consumers = [KUBELET, NEEDS_ALL, NEEDS_FS, "sparse-volumes.target"];
    let mut stopped = stopped_along_with(r, FS_INSTANCE, &consumers);
    stopped.sort();
    assert_eq!(
        stopped,
        [NEEDS_ALL, NEEDS_FS, "sparse-volumes.target"],
        "not caught"
    );
}
