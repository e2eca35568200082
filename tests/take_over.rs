//! Taking over volumes a MetalK8s-style unit attached (`losetup --find
//! --partscan` on a file under /var/lib/metalk8s/storage/sparse), with
//! their consumers mounted: `register --replaces-unit`. These run without
//! systemd (the device is adopted directly); the VM scenario does the same
//! against real systemd, the old unit active, and reboots twice.

mod common;

use std::fs;
use std::path::PathBuf;

use common::{bound_by_hand, loops_of, new_uuid, sysfs_flag, tool, DetachOnDrop, Fixture, Mounted};

const SPARSE_DIR: &str = "/var/lib/metalk8s/storage/sparse";

/// A fixture whose storage roots include MetalK8s's directory.
fn metalk8s_node() -> Fixture {
    let fx = Fixture::new();
    fs::create_dir_all(fx.host(SPARSE_DIR)).unwrap();
    fs::write(
        fx.host("/etc/sparse-volume/config.toml"),
        format!("storage_roots = [\"/var/lib/sparse-volume\", \"{SPARSE_DIR}\"]\n"),
    )
    .unwrap();
    fx
}

/// A backing file made the way MetalK8s makes each kind, and the unit
/// that attached it there.
struct SparseFile {
    uuid: String,
    /// The path as the registry writes it.
    logical: String,
    /// Where it is in the fixture.
    path: PathBuf,
    unit: String,
}

impl SparseFile {
    fn new(fx: &Fixture, kind: &str) -> Self {
        let uuid = new_uuid();
        let logical = format!("{SPARSE_DIR}/{uuid}");
        let path = fx.host(&logical);
        let file = path.to_str().unwrap();
        match kind {
            "ext4" => {
                fx.sparse_file_of(&path, 64 << 20);
                tool("mkfs.ext4", &["-q", "-F", "-U", &uuid, file]);
            }
            "xfs" => {
                fx.sparse_file_of(&path, 320 << 20);
                tool(
                    "mkfs.xfs",
                    &["-q", "-f", "-m", &format!("uuid={uuid}"), file],
                );
            }
            _ => {
                fx.sparse_file_of(&path, 64 << 20);
                let guid = format!("1:{uuid}");
                tool(
                    "sgdisk",
                    &["--largest-new", "1", "--partition-guid", &guid, file],
                );
            }
        }
        let unit = format!("metalk8s-sparse-volume@{uuid}.service");
        Self {
            uuid,
            logical,
            path,
            unit,
        }
    }

    /// `COMMAND --uuid U --path P --replaces-unit UNIT` and `extra`.
    fn taken_over_by<'a>(
        &'a self,
        command: &'a str,
        unit: &'a str,
        extra: &[&'a str],
    ) -> Vec<&'a str> {
        let mut args = vec![
            command,
            "--uuid",
            &self.uuid,
            "--path",
            &self.logical,
            "--replaces-unit",
            unit,
        ];
        args.extend_from_slice(extra);
        args
    }

    /// `register` of the file, taking it over from its unit.
    fn register<'a>(&'a self, extra: &[&'a str]) -> Vec<&'a str> {
        self.taken_over_by("register", &self.unit, extra)
    }
}

#[test]
fn a_take_over_adopts_the_device_in_use_and_records_the_unit_to_mask() {
    if !common::is_root() {
        return;
    }
    let fx = metalk8s_node();
    for kind in ["ext4", "xfs", "block"] {
        let file = SparseFile::new(&fx, kind);
        let bound = DetachOnDrop::new(bound_by_hand(&file.path, &["--partscan"]));
        let device = bound.device().to_string();
        // The consumer: a mount of the file system (this host's kernel
        // makes no partitions, so the block volume's consumer is an open
        // descriptor on the whole device, as a raw-block pod holds).
        let mounted = (kind != "block")
            .then(|| Mounted::new(&fx, &device, &[]).expect("mounting the consumer"));
        if let Some(mounted) = &mounted {
            fs::write(mounted.0.join("payload"), kind).unwrap();
        }
        let holder = (kind == "block").then(|| fs::File::open(&device).unwrap());
        // The old unit's ExecStop, run while the consumer holds the device:
        // the kernel makes the detach a pending one, which the take-over
        // must cancel, or the device goes at the consumer's unmount.
        tool("losetup", &["-d", &device]);
        assert_eq!(
            sysfs_flag(&device, "loop/autoclear"),
            "1",
            "{kind}: no pending detach"
        );

        let report = fx.run_ok(&file.register(&["--json"])).json();
        assert_eq!(report["changed"], true, "{kind}: {report}");
        assert_eq!(
            report["take_over"]["unit"],
            file.unit.as_str(),
            "{kind}: {report}"
        );
        assert_eq!(report["device"], device.as_str(), "{kind}: {report}");
        assert_eq!(
            loops_of(&file.path),
            vec![device.clone()],
            "{kind}: a second device"
        );
        assert_eq!(
            sysfs_flag(&device, "loop/autoclear"),
            "0",
            "{kind}: the pending detach stayed"
        );
        let entry = fs::read_to_string(fx.registry_file(&file.uuid)).unwrap();
        assert!(
            entry.contains(&format!("replaces_unit = \"{}\"", file.unit)),
            "{kind}: {entry}"
        );
        if let Some(mounted) = &mounted {
            assert_eq!(fs::read_to_string(mounted.0.join("payload")).unwrap(), kind);
        }

        // Repeated (Salt and Ansible do): nothing changes.
        let again = fx.run_ok(&file.register(&["--json"])).json();
        assert_eq!(again["changed"], false, "{kind}: {again}");
        assert_eq!(loops_of(&file.path), vec![device.clone()]);
        drop(holder);
        drop(mounted);
    }
}

#[test]
fn a_volume_registered_before_takes_the_unit_over_as_a_change() {
    if !common::is_root() {
        return;
    }
    let fx = metalk8s_node();
    let file = SparseFile::new(&fx, "ext4");
    fx.run_ok(&["register", "--uuid", &file.uuid, "--path", &file.logical]);
    let report = fx.run_ok(&file.register(&["--json"])).json();
    assert_eq!(report["changed"], true, "{report}");
    // Nothing was attached, and no --now: nothing is attached now.
    assert!(report["device"].is_null(), "{report}");
    let entry = fs::read_to_string(fx.registry_file(&file.uuid)).unwrap();
    assert!(entry.contains("replaces_unit"), "{entry}");
}

#[test]
fn a_file_attached_twice_is_refused_before_anything_is_written() {
    if !common::is_root() {
        return;
    }
    let fx = metalk8s_node();
    let file = SparseFile::new(&fx, "ext4");
    let first = DetachOnDrop::new(bound_by_hand(&file.path, &[]));
    let second = DetachOnDrop::new(bound_by_hand(&file.path, &[]));
    for extra in [&["--dry-run"][..], &[]] {
        let run = fx.run(&file.register(extra));
        assert_eq!(run.code, 1, "{}", run.stderr);
        assert!(
            run.stderr.contains("attached 2 times")
                && run.stderr.contains(first.device())
                && run.stderr.contains(second.device()),
            "{}",
            run.stderr
        );
        assert!(!fx.registry_file(&file.uuid).exists());
    }
}

#[test]
fn a_dry_run_says_the_take_over_and_writes_nothing() {
    if !common::is_root() {
        return;
    }
    let fx = metalk8s_node();
    let file = SparseFile::new(&fx, "ext4");
    let bound = DetachOnDrop::new(bound_by_hand(&file.path, &[]));
    let run = fx.run_ok(&file.register(&["--dry-run"]));
    // Without systemd (this host) the run would only register: the
    // generator masks the unit from the next boot on, and the plan says so.
    let planned = format!(
        "would have the generator mask {} from the next boot on",
        file.unit
    );
    assert!(run.stdout.contains(&planned), "{}", run.stdout);
    assert!(
        run.stderr.contains("systemd is not reachable"),
        "{}",
        run.stderr
    );
    assert!(!fx.registry_file(&file.uuid).exists());
    assert_eq!(loops_of(&file.path), vec![bound.device().to_string()]);
}

#[test]
fn sparse_volumes_own_units_and_templates_are_refused() {
    let fx = metalk8s_node();
    let uuid = new_uuid();
    for (unit, says) in [
        (format!("sparse-volume@{uuid}.service"), "own units"),
        (
            "metalk8s-sparse-volume@.service".to_string(),
            "is a template",
        ),
        ("local-fs.target".to_string(), "must name a service"),
    ] {
        let run = fx.run(&[
            "register",
            "--uuid",
            &uuid,
            "--path",
            "/var/lib/sparse-volume/x",
            "--replaces-unit",
            &unit,
        ]);
        assert_eq!(run.code, 2, "{unit}: {}", run.stderr);
        assert!(run.stderr.contains(says), "{unit}: {}", run.stderr);
    }
    // The same rule in the registry file itself, with the line.
    fx.register(
        &uuid,
        "filesystem",
        "replaces_unit = \"sparse-volume-metrics.service\"\n",
    );
    let run = fx.run(&["check"]);
    assert_eq!(run.code, 1);
    assert!(
        run.stdout.contains(".toml:5: replaces_unit") && run.stdout.contains("own units"),
        "{}",
        run.stdout
    );
}

#[test]
fn apply_takes_over_with_the_same_steps_and_repeats_as_no_change() {
    if !common::is_root() {
        return;
    }
    let fx = metalk8s_node();
    let file = SparseFile::new(&fx, "ext4");
    let bound = DetachOnDrop::new(bound_by_hand(&file.path, &["--partscan"]));
    let apply = |extra: &[&str]| {
        let mut args = file.taken_over_by("apply", &file.unit, &["--name", "pg-data", "--json"]);
        args.extend_from_slice(extra);
        fx.run_ok(&args).json()
    };
    let planned = apply(&["--dry-run"]);
    assert_eq!(planned["changed"], true, "{planned}");
    assert!(
        !fx.registry_file(&file.uuid).exists(),
        "a dry run registered"
    );

    let applied = apply(&[]);
    assert_eq!(applied["changed"], true, "{applied}");
    let actions = applied["actions"].to_string();
    let action = format!("and take it over from {}", file.unit);
    assert!(actions.contains(&action), "{actions}");
    assert_eq!(applied["after"]["device"], bound.device(), "{applied}");
    assert_eq!(loops_of(&file.path), vec![bound.device().to_string()]);
    assert_eq!(applied["before"], serde_json::Value::Null);

    let again = apply(&[]);
    assert_eq!(again["changed"], false, "{again}");

    // A new file at that path is never made: the file must be there.
    let missing = new_uuid();
    let path = format!("{SPARSE_DIR}/{missing}");
    let unit = format!("metalk8s-sparse-volume@{missing}.service");
    let run = fx.run(&[
        "apply",
        "--uuid",
        &missing,
        "--path",
        &path,
        "--replaces-unit",
        &unit,
    ]);
    assert_eq!(run.code, 1, "{}", run.stdout);
    assert!(!fx.registry_file(&missing).exists());
}

#[test]
fn an_unrelated_or_a_second_unit_is_refused_before_anything_is_written() {
    if !common::is_root() {
        return;
    }
    let fx = metalk8s_node();
    let file = SparseFile::new(&fx, "ext4");
    // A typo or another service would be masked at every boot.
    let run = fx.run(&file.taken_over_by("register", "dbus.service", &[]));
    assert_eq!(run.code, 1, "{}", run.stdout);
    assert!(
        run.stderr.contains("does not name the volume's UUID"),
        "{}",
        run.stderr
    );
    assert!(!fx.registry_file(&file.uuid).exists());

    fx.run_ok(&file.register(&[]));
    let entry = fs::read_to_string(fx.registry_file(&file.uuid)).unwrap();
    let other = format!("other-attach@{}.service", file.uuid);
    let run = fx.run(&file.taken_over_by("register", &other, &[]));
    assert_eq!(run.code, 1, "{}", run.stdout);
    assert!(
        run.stderr
            .contains("taken over from metalk8s-sparse-volume@"),
        "{}",
        run.stderr
    );
    assert_eq!(
        fs::read_to_string(fx.registry_file(&file.uuid)).unwrap(),
        entry
    );

    // apply with a name: the registered (unnamed) volume is renamed, not
    // refused.
    let args = file.taken_over_by("apply", &file.unit, &["--name", "taken", "--json"]);
    let applied = fx.run_ok(&args).json();
    assert_eq!(applied["changed"], true, "{applied}");
    assert_eq!(applied["after"]["name"], "taken", "{applied}");
}
