//! Preallocation is a guarantee: a consumer's `fstrim` (Debian's
//! `fstrim.timer`) must not hand a preallocated volume's space back, while
//! sparse volumes keep returning freed space. Real loop devices, real
//! ext4, real `fstrim`; allocation is read with `stat` (st_blocks), never
//! with our own code.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{sysfs_flag, tool, Fixture};

const MIB: u64 = 1 << 20;
const VOLUME: &str = "64M";
const WRITTEN_MIB: u64 = 24;

/// Bytes the file occupies on disk, as `stat` reports them.
fn allocated(path: &Path) -> u64 {
    let blocks: u64 = tool("stat", &["-c", "%b", path.to_str().expect("UTF-8 path")])
        .trim()
        .parse()
        .expect("stat prints a number");
    blocks * 512
}

fn create(fixture: &Fixture, extra: &[&str]) -> (String, PathBuf) {
    let mut args = vec!["create", "--size", VOLUME, "--json"];
    args.extend_from_slice(extra);
    let uuid = fixture.run_ok(&args).json()["uuid"]
        .as_str()
        .expect("create reports the uuid")
        .to_string();
    let path = fixture.backing(&uuid);
    (uuid, path)
}

fn attach(fixture: &Fixture, uuid: &str) -> String {
    fixture.run_ok(&["attach", uuid, "--json"]).json()["device"]
        .as_str()
        .expect("attach reports the device")
        .to_string()
}

fn discard_max(device: &str) -> u64 {
    sysfs_flag(device, "queue/discard_max_bytes")
        .parse()
        .expect("a number")
}

/// Mounted for the life of the value.
struct Mount {
    point: tempfile::TempDir,
}

impl Mount {
    fn new(device: &str) -> Self {
        let point = tempfile::tempdir().expect("mount point");
        tool("mount", &[device, point.path().to_str().expect("UTF-8")]);
        Self { point }
    }

    fn path(&self) -> &Path {
        self.point.path()
    }

    /// Writes data, deletes it again and runs `fstrim`, as a consumer's
    /// timer would. Returns whether fstrim succeeded.
    fn write_delete_trim(&self) -> bool {
        let data = self.path().join("data");
        tool(
            "dd",
            &[
                "if=/dev/urandom",
                &format!("of={}", data.display()),
                "bs=1M",
                &format!("count={WRITTEN_MIB}"),
                "conv=fsync",
                "status=none",
            ],
        );
        fs::remove_file(&data).expect("deleting the data");
        tool("sync", &[]);
        Command::new("fstrim")
            .arg(self.path())
            .status()
            .expect("running fstrim")
            .success()
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.point.path()).status();
    }
}

#[test]
fn a_preallocated_volume_keeps_its_space_through_fstrim() {
    needs_root!();
    let fixture = Fixture::new();
    let (uuid, path) = create(&fixture, &["--preallocate"]);
    let device = attach(&fixture, &uuid);
    assert_eq!(discard_max(&device), 0, "{device} must refuse discards");
    let before = allocated(&path);
    assert!(before >= 64 * MIB, "preallocated: {before} bytes on disk");
    {
        let mount = Mount::new(&device);
        let trimmed = mount.write_delete_trim();
        println!("fstrim on the preallocated volume succeeded: {trimmed}");
    }
    let after = allocated(&path);
    println!("preallocated volume: {before} bytes allocated before fstrim, {after} after");
    assert!(
        after >= before,
        "fstrim handed back {} bytes of a preallocated volume",
        before - after
    );
    fixture.run_ok(&["detach", &uuid]);
}

#[test]
fn a_sparse_volume_returns_freed_space_on_fstrim() {
    needs_root!();
    let fixture = Fixture::new();
    let (uuid, path) = create(&fixture, &[]);
    let device = attach(&fixture, &uuid);
    assert!(discard_max(&device) > 0, "{device} must pass discards");
    let mount = Mount::new(&device);
    let before = allocated(&path);
    assert!(
        mount.write_delete_trim(),
        "fstrim must succeed on a sparse volume"
    );
    drop(mount);
    let after = allocated(&path);
    println!(
        "sparse volume: {before} bytes allocated before writing, {after} after write+delete+fstrim"
    );
    // Most of what was written and deleted must be a hole again.
    assert!(
        after < before + WRITTEN_MIB * MIB / 4,
        "fstrim returned too little: {before} before, {after} after"
    );
    fixture.run_ok(&["detach", &uuid]);
}

/// The kernel keeps a discard limit of 0 on a device number after detach,
/// and will not raise it again: the number must come back clean.
#[test]
fn detaching_a_preallocated_volume_leaves_no_discard_limit_behind() {
    needs_root!();
    let fixture = Fixture::new();
    let (uuid, _) = create(&fixture, &["--preallocate"]);
    let device = attach(&fixture, &uuid);
    assert_eq!(discard_max(&device), 0);
    fixture.run_ok(&["detach", &uuid]);

    // Bind a sparse file to that very number with util-linux, as any
    // other program on the node could, and discard through it.
    let sparse = fixture.host("/var/lib/sparse-volume/plain.img");
    tool(
        "dd",
        &[
            "if=/dev/urandom",
            &format!("of={}", sparse.display()),
            "bs=1M",
            "count=8",
            "conv=fsync",
            "status=none",
        ],
    );
    tool("truncate", &["-s", "64M", sparse.to_str().expect("UTF-8")]);
    let bound = Command::new("losetup")
        .args([&device, sparse.to_str().expect("UTF-8")])
        .status()
        .expect("running losetup");
    if !bound.success() {
        // Another test took the number first; it must pass discards too.
        println!("{device} was taken by another test; skipping the same-number check");
        return;
    }
    let limit = discard_max(&device);
    let before = allocated(&sparse);
    let discarded = Command::new("blkdiscard")
        .args(["-f", "-o", "0", "-l", "8M", &device])
        .status()
        .expect("running blkdiscard")
        .success();
    tool("losetup", &["-d", &device]);
    let after = allocated(&sparse);
    println!("{device} after a preallocated volume: discard_max_bytes {limit}, {before} -> {after} bytes allocated");
    assert!(
        limit > 0,
        "{device} kept the preallocated volume's discard limit"
    );
    assert!(discarded, "blkdiscard failed on {device}");
    assert!(after + 7 * MIB <= before, "the discard punched no hole");
}

/// A preallocated volume detached by another tool (or a crash) leaves its
/// limit on the device; a sparse volume must not silently inherit it.
#[test]
fn a_sparse_volume_never_inherits_a_left_over_discard_limit() {
    needs_root!();
    let fixture = Fixture::new();
    let (preallocated, _) = create(&fixture, &["--preallocate"]);
    let device = attach(&fixture, &preallocated);
    tool("losetup", &["-d", &device]);
    assert_eq!(
        discard_max(&device),
        0,
        "the kernel no longer keeps the limit; this test needs rethinking"
    );
    let (sparse, _) = create(&fixture, &[]);
    let sparse_device = attach(&fixture, &sparse);
    println!("left-over limit on {device}; the sparse volume got {sparse_device}");
    assert!(
        discard_max(&sparse_device) > 0,
        "{sparse_device} does not pass discards"
    );
    fixture.run_ok(&["detach", &sparse]);
}

#[test]
fn growing_a_preallocated_volume_keeps_discards_off_and_allocates_the_new_space() {
    needs_root!();
    let fixture = Fixture::new();
    let (uuid, path) = create(&fixture, &["--preallocate", "--mode", "block"]);
    let device = attach(&fixture, &uuid);
    fixture.run_ok(&["resize", &uuid, "--size", "96M"]);
    assert_eq!(
        discard_max(&device),
        0,
        "{device} passes discards after the resize"
    );
    assert!(
        allocated(&path) >= 96 * MIB,
        "the new space is not preallocated"
    );
    fixture.run_ok(&["detach", &uuid]);
}

/// A detached xfs volume grows through a device of its own (xfs grows only
/// mounted); a preallocated one's refuses discards, and its number must
/// not keep that once the grow is done, whoever binds it next.
#[test]
fn growing_a_detached_preallocated_xfs_volume_leaves_no_discard_limit_behind() {
    needs_root!();
    let fixture = Fixture::new();
    let uuid = fixture
        .run_ok(&[
            "create",
            "--size",
            "320M",
            "--fs",
            "xfs",
            "--preallocate",
            "--json",
        ])
        .json()["uuid"]
        .as_str()
        .expect("create reports the uuid")
        .to_string();
    // Which number the grow bound, from the kernel's own answer.
    let trace = fixture.host("/resize.strace");
    let status = Command::new("strace")
        .args(["-f", "-e", "trace=ioctl", "-e", "signal=none", "-o"])
        .arg(&trace)
        .arg(env!("CARGO_BIN_EXE_sparse-volume"))
        .args(["resize", &uuid, "--size", "400M"])
        .env("SPARSE_VOLUME_ROOT", fixture.host("/"))
        .env("DBUS_SYSTEM_BUS_ADDRESS", fixture.absent_bus())
        .status()
        .expect("running strace");
    assert!(status.success(), "resize under strace failed");
    let log = fs::read_to_string(&trace).expect("the strace log");
    let number: u32 = log
        .lines()
        .filter(|line| line.contains("LOOP_CTL_GET_FREE"))
        .find_map(|line| line.rsplit('=').next()?.trim().parse().ok())
        .expect("resize asked /dev/loop-control for a free device");
    let sys = PathBuf::from(format!("/sys/block/loop{number}"));
    if !sys.exists() {
        return; // deleted, so it comes back with the default limit
    }
    if sys.join("loop").exists() {
        println!("loop{number} was taken by another test; skipping the check of its limit");
        return;
    }
    let limit = discard_max(&format!("/dev/loop{number}"));
    let hardware: u64 = sysfs_flag(&format!("/dev/loop{number}"), "queue/discard_max_hw_bytes")
        .parse()
        .expect("a number");
    assert!(
        limit > 0 || hardware == 0,
        "loop{number}, released after the grow, kept the preallocated volume's discard limit (discard_max_bytes 0, hardware {hardware})"
    );
}

fn findings_of_kind(fixture: &Fixture, args: &[&str], kind: &str) -> Vec<serde_json::Value> {
    let run = fixture.run(args);
    run.json()["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .filter(|f| f["kind"] == kind)
        .cloned()
        .collect()
}

#[test]
fn check_finds_and_refills_holes_in_a_preallocated_volume() {
    needs_root!();
    let fixture = Fixture::new();
    let (uuid, path) = create(&fixture, &["--preallocate", "--mode", "block"]);
    // Punch into the middle of the partition, away from both GPT copies.
    tool(
        "fallocate",
        &["-p", "-o", "16M", "-l", "8M", path.to_str().expect("UTF-8")],
    );
    let content_before = tool("sha256sum", &[path.to_str().expect("UTF-8")]);
    let holes = findings_of_kind(&fixture, &["check", "--json"], "preallocation-holes");
    assert_eq!(holes.len(), 1, "{holes:?}");
    assert_eq!(holes[0]["uuid"], uuid.as_str());
    let message = holes[0]["message"].as_str().expect("message");
    assert!(
        message.contains("8 MiB") || message.contains("8388608"),
        "{message}"
    );

    let repaired = findings_of_kind(
        &fixture,
        &["check", "--repair", "--json"],
        "preallocation-holes",
    );
    assert_eq!(repaired.len(), 1);
    assert_eq!(repaired[0]["repaired"], true, "{repaired:?}");
    assert!(allocated(&path) >= 64 * MIB, "the holes are still there");
    assert_eq!(
        tool("sha256sum", &[path.to_str().expect("UTF-8")]),
        content_before,
        "refilling the holes changed the content"
    );
    assert!(findings_of_kind(&fixture, &["check", "--json"], "preallocation-holes").is_empty());
}

#[test]
fn check_turns_discards_off_on_a_preallocated_volume_bound_by_another_tool() {
    needs_root!();
    let fixture = Fixture::new();
    let (uuid, path) = create(&fixture, &["--preallocate"]);
    let device = tool(
        "losetup",
        &["--find", "--show", path.to_str().expect("UTF-8")],
    )
    .trim()
    .to_string();
    assert!(discard_max(&device) > 0);
    let found = findings_of_kind(&fixture, &["check", "--json"], "discards-allowed");
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0]["uuid"], uuid.as_str());
    let repaired = findings_of_kind(
        &fixture,
        &["check", "--repair", "--json"],
        "discards-allowed",
    );
    assert_eq!(repaired[0]["repaired"], true, "{repaired:?}");
    assert_eq!(discard_max(&device), 0);
    fixture.run_ok(&["detach", &uuid]);
}

/// A device carrying a left-over limit that someone holds open cannot be
/// renewed; the sparse volume must still end up on exactly one device.
#[test]
fn a_held_device_with_a_left_over_limit_never_doubles_a_volume() {
    needs_root!();
    let fixture = Fixture::new();
    let (preallocated, _) = create(&fixture, &["--preallocate"]);
    let device = attach(&fixture, &preallocated);
    tool("losetup", &["-d", &device]);
    let holder = fs::File::open(&device).expect("holding the device open");
    let (sparse, path) = create(&fixture, &[]);
    let run = fixture.run_ok(&["attach", &sparse, "--json"]);
    let devices = common::loops_of(&path);
    println!(
        "held {device}; the sparse volume got {devices:?}: {}",
        run.stdout
    );
    assert_eq!(devices.len(), 1, "the sparse volume is on {devices:?}");
    drop(holder);
    fixture.run_ok(&["detach", &sparse]);
}
