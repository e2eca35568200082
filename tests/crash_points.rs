//! Every named crash point (`hooks::Crash::ALL`): the operation is killed
//! there (SIGKILL, as a power cut would stop it), then `check` reports,
//! `check --repair` repairs, the same operation run again succeeds, and
//! the end state is what an uninterrupted run makes: checked with `blkid`,
//! `dumpe2fs`, `e2fsck`, `losetup` and the data itself.
//!
//! The scenario for each point is chosen by an exhaustive match, so a new
//! point does not compile until it has one here.

mod common;

use std::fs;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Command;

use common::{ext4_bytes, loops_of, new_uuid, tool, Fixture, Run};
use sparse_volume::hooks::{Crash, CRASH_ENV};

const MIB: u64 = 1 << 20;
const NO_BUS: &str = "unix:path=/nonexistent";

fn run_ok(fx: &Fixture, args: &[&str]) -> Run {
    let run = fx.run(args);
    assert_eq!(
        run.code, 0,
        "sparse-volume {args:?}: {}{}",
        run.stdout, run.stderr
    );
    run
}

/// Runs `args` with the crash point armed and insists it was killed there.
fn crash(fx: &Fixture, point: &str, args: &[&str]) {
    let status = fx
        .command(args)
        .env("DBUS_SYSTEM_BUS_ADDRESS", NO_BUS)
        .env(CRASH_ENV, point)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .expect("running sparse-volume");
    assert_eq!(
        status.signal(),
        Some(9),
        "{point}: {args:?} was not killed at the point ({status})"
    );
}

/// Finding kinds of a `check --json`, sorted.
fn finding_kinds(run: &Run) -> Vec<String> {
    let mut kinds: Vec<String> = run.json()["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .map(|f| f["kind"].as_str().expect("kind").to_string())
        .collect();
    kinds.sort();
    kinds
}

fn fsck_clean(path: &Path) {
    let output = Command::new("e2fsck")
        .arg("-fn")
        .arg(path)
        .output()
        .expect("running e2fsck");
    assert!(
        output.status.success(),
        "e2fsck -fn {}: {}",
        path.display(),
        String::from_utf8_lossy(&output.stdout)
    );
}

fn registered_size(fx: &Fixture, uuid: &str) -> u64 {
    let text = fs::read_to_string(fx.registry_file(uuid)).expect("registry file");
    let value: toml::Value = toml::from_str(&text).expect("registry file parses");
    value["size"].as_integer().expect("size") as u64
}

/// Mounts the volume's device, runs `work` on the mount point, unmounts.
fn with_mounted<T>(fx: &Fixture, uuid: &str, work: impl FnOnce(&Path) -> T) -> T {
    let devices = loops_of(&fx.backing(uuid));
    assert_eq!(devices.len(), 1, "{uuid}: devices {devices:?}");
    let point = fx.host(&format!("/mnt-{uuid}"));
    fs::create_dir_all(&point).expect("mount point");
    tool("mount", &[&devices[0], point.to_str().expect("UTF-8 path")]);
    let result = work(&point);
    tool("umount", &[point.to_str().expect("UTF-8 path")]);
    result
}

/// Writes a file of pseudo-random data and returns its content.
fn write_data(fx: &Fixture, uuid: &str) -> Vec<u8> {
    let data: Vec<u8> = (0..3 * MIB as usize)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    with_mounted(fx, uuid, |point| {
        fs::write(point.join("data"), &data).expect("writing data");
    });
    data
}

fn read_data(fx: &Fixture, uuid: &str) -> Vec<u8> {
    with_mounted(fx, uuid, |point| {
        fs::read(point.join("data")).expect("reading data back")
    })
}

fn blkid_uuid(path: &Path) -> String {
    let text = tool(
        "blkid",
        &[
            "-p",
            "-o",
            "value",
            "-s",
            "UUID",
            path.to_str().expect("UTF-8 path"),
        ],
    );
    text.trim().to_string()
}

/// What `check` said right after the crash, and after `check --repair`.
struct Seen {
    after_crash: Vec<String>,
    after_repair: Vec<String>,
}

fn check_and_repair(fx: &Fixture) -> Seen {
    let after_crash = finding_kinds(&fx.run(&["check", "--json"]));
    let repair = fx.run(&["check", "--repair", "--json"]);
    assert!(
        repair.code == 0 || repair.code == 1,
        "check --repair: {}{}",
        repair.stdout,
        repair.stderr
    );
    // What a repair leaves is only what it reports it could not fix.
    let after_repair = finding_kinds(&fx.run(&["check", "--json"]));
    Seen {
        after_crash,
        after_repair,
    }
}

fn assert_clean(fx: &Fixture, point: &str) {
    let check = fx.run(&["check", "--json"]);
    assert_eq!(check.code, 0, "{point}: check not clean: {}", check.stdout);
    assert_eq!(check.json()["clean"], true, "{point}");
}

fn crash_create(fx: &Fixture, point: &str) -> Seen {
    let uuid = new_uuid();
    let args = ["create", "--size", "32M", "--uuid", &uuid];
    crash(fx, point, &args);
    let seen = check_and_repair(fx);
    assert_eq!(
        seen.after_repair,
        Vec::<String>::new(),
        "{point}: repair left findings"
    );
    let again = run_ok(fx, &[&args[..], &["--json"]].concat()).json();
    assert_eq!(again["uuid"], uuid.as_str(), "{point}");
    // The volume is there, formatted for its UUID, at the asked size, and
    // holds data across detach and attach.
    let path = fx.backing(&uuid);
    assert_eq!(blkid_uuid(&path), uuid, "{point}: content");
    assert_eq!(registered_size(fx, &uuid), 32 * MIB, "{point}");
    assert_eq!(
        fs::metadata(&path).expect("file").len(),
        32 * MIB,
        "{point}"
    );
    fsck_clean(&path);
    let leftovers: Vec<_> = fs::read_dir(fx.host("/var/lib/sparse-volume"))
        .expect("storage root")
        .map(|e| e.expect("entry").file_name())
        .filter(|name| name.to_string_lossy() != uuid)
        .collect();
    assert!(leftovers.is_empty(), "{point}: leftovers {leftovers:?}");
    run_ok(fx, &["attach", &uuid]);
    let data = write_data(fx, &uuid);
    run_ok(fx, &["detach", &uuid]);
    run_ok(fx, &["attach", &uuid]);
    assert!(read_data(fx, &uuid) == data, "{point}: data changed");
    assert_clean(fx, point);
    run_ok(fx, &["detach", &uuid]);
    seen
}

/// A clone killed at each of its points, its source mounted and frozen
/// for the whole copy (this storage shares no extents, so every point is
/// reached): the freeze does not outlive the kill, `check --repair` leaves
/// nothing, and the same clone run again makes the volume.
fn crash_clone(fx: &Fixture, point: &str) -> Seen {
    let source = new_uuid();
    run_ok(fx, &["create", "--size", "32M", "--uuid", &source, "--now"]);
    let device = loops_of(&fx.backing(&source)).remove(0);
    let mount_point = fx.host("/mnt-source");
    fs::create_dir_all(&mount_point).expect("mount point");
    tool(
        "mount",
        &[&device, mount_point.to_str().expect("UTF-8 path")],
    );
    let data = (0..3 * MIB as usize)
        .map(|i| (i % 253) as u8)
        .collect::<Vec<u8>>();
    write_synced(&mount_point.join("data"), &data);
    let clone = new_uuid();
    let args = [
        "clone",
        &source,
        "--name",
        "copy",
        "--uuid",
        &clone,
        "--freeze-during-copy",
    ];
    crash(fx, point, &args);
    // A frozen file system would hang this write: it must finish.
    let (done, finished) = std::sync::mpsc::channel();
    let after = mount_point.join("after-the-kill");
    std::thread::spawn(move || {
        write_synced(&after, b"written");
        let _ = done.send(());
    });
    if finished
        .recv_timeout(std::time::Duration::from_secs(30))
        .is_err()
    {
        let _ = Command::new("fsfreeze")
            .arg("-u")
            .arg(&mount_point)
            .status();
        panic!("{point}: the source's file system stayed frozen after the kill");
    }
    let seen = check_and_repair(fx);
    assert_eq!(
        seen.after_repair,
        Vec::<String>::new(),
        "{point}: repair left findings"
    );
    let again = run_ok(fx, &[&args[..], &["--json"]].concat()).json();
    assert_eq!(again["uuid"], clone.as_str(), "{point}");
    assert_eq!(blkid_uuid(&fx.backing(&clone)), clone, "{point}: identity");
    assert_eq!(blkid_uuid(&fx.backing(&source)), source, "{point}");
    fsck_clean(&fx.backing(&clone));
    tool("umount", &[mount_point.to_str().expect("UTF-8 path")]);
    run_ok(fx, &["detach", &source]);
    run_ok(fx, &["attach", &clone]);
    assert!(read_data(fx, &clone) == data, "{point}: the clone's data");
    run_ok(fx, &["detach", &clone]);
    assert_clean(fx, point);
    seen
}

/// An import killed at each of its points (under a new UUID, so that the
/// data written is the exported identity's until the end): nothing is
/// registered, `check --repair` removes the file, and the same import
/// run again makes the volume.
fn crash_import(fx: &Fixture, point: &str) -> Seen {
    let source = new_uuid();
    run_ok(fx, &["create", "--size", "32M", "--uuid", &source]);
    run_ok(fx, &["attach", &source]);
    let data = write_data(fx, &source);
    run_ok(fx, &["detach", &source]);
    let stream = fx.host("/export.tar");
    let _ = fs::remove_file(&stream);
    run_ok(
        fx,
        &[
            "export",
            &source,
            "--output",
            stream.to_str().expect("UTF-8 path"),
        ],
    );
    let args = [
        "import",
        "--input",
        stream.to_str().expect("UTF-8 path"),
        "--new-uuid",
        "--name",
        "copy",
    ];
    crash(fx, point, &args);
    assert!(
        !run_ok(fx, &["list", "--names"]).stdout.contains("copy"),
        "{point}: registered"
    );
    let seen = check_and_repair(fx);
    assert_eq!(
        seen.after_repair,
        Vec::<String>::new(),
        "{point}: repair left findings"
    );
    let again = run_ok(fx, &[&args[..], &["--json"]].concat()).json();
    let copy = again["uuid"].as_str().expect("uuid").to_string();
    assert_eq!(blkid_uuid(&fx.backing(&copy)), copy, "{point}: identity");
    assert_eq!(blkid_uuid(&fx.backing(&source)), source, "{point}");
    fsck_clean(&fx.backing(&copy));
    run_ok(fx, &["attach", &copy]);
    assert!(read_data(fx, &copy) == data, "{point}: the import's data");
    run_ok(fx, &["detach", &copy]);
    assert_clean(fx, point);
    seen
}

fn write_synced(path: &Path, data: &[u8]) {
    use std::io::Write;
    let mut file = fs::File::create(path).expect("creating a file");
    file.write_all(data).expect("writing");
    file.sync_all().expect("syncing");
}

/// After a killed resize: `check --repair` does not finish it (it points
/// at `resize`), and the same resize run again does, recording `size`.
fn repaired_then_resized_again(
    fx: &Fixture,
    point: &str,
    uuid: &str,
    args: &[&str],
    size: u64,
) -> Seen {
    let seen = check_and_repair(fx);
    assert_eq!(
        seen.after_repair,
        ["size-mismatch"],
        "{point}: after repair"
    );
    let again = run_ok(fx, &[args, &["--json"]].concat()).json();
    assert_eq!(again["size"], size, "{point}");
    assert_eq!(registered_size(fx, uuid), size, "{point}");
    seen
}

fn crash_resize(fx: &Fixture, point: &str) -> Seen {
    let uuid = new_uuid();
    run_ok(fx, &["create", "--size", "32M", "--uuid", &uuid]);
    run_ok(fx, &["attach", &uuid]);
    let data = write_data(fx, &uuid);
    let args = ["resize", &uuid, "--size", "48M"];
    crash(fx, point, &args);
    // Never a size that was not applied.
    assert_eq!(
        registered_size(fx, &uuid),
        32 * MIB,
        "{point}: size recorded early"
    );
    let seen = repaired_then_resized_again(fx, point, &uuid, &args, 48 * MIB);
    let path = fx.backing(&uuid);
    assert_eq!(
        fs::metadata(&path).expect("file").len(),
        48 * MIB,
        "{point}"
    );
    let devices = loops_of(&path);
    assert_eq!(devices.len(), 1, "{point}: {devices:?}");
    assert_eq!(
        tool("blockdev", &["--getsize64", &devices[0]]).trim(),
        (48 * MIB).to_string(),
        "{point}: the loop device did not grow"
    );
    assert_eq!(
        ext4_bytes(&path),
        48 * MIB,
        "{point}: file system not grown"
    );
    fsck_clean(&path);
    assert!(read_data(fx, &uuid) == data, "{point}: data changed");
    assert_clean(fx, point);
    run_ok(fx, &["detach", &uuid]);
    seen
}

/// A detached xfs volume grows through a loop device of its own for the
/// grow: killed while that device is bound, nothing may keep the file
/// attached (a later attach would adopt that device, without direct I/O).
fn crash_resize_xfs(fx: &Fixture, point: &str) -> Seen {
    let uuid = new_uuid();
    run_ok(
        fx,
        &["create", "--size", "320M", "--fs", "xfs", "--uuid", &uuid],
    );
    let path = fx.backing(&uuid);
    let args = ["resize", &uuid, "--size", "400M"];
    crash(fx, point, &args);
    assert_eq!(
        loops_of(&path),
        Vec::<String>::new(),
        "{point}: the grow's loop device outlived the killed resize"
    );
    assert_eq!(registered_size(fx, &uuid), 320 * MIB, "{point}");
    let seen = repaired_then_resized_again(fx, point, &uuid, &args, 400 * MIB);
    // The repair attached the volume (enabled, so meant to be attached):
    // one device, the volume's own.
    assert_eq!(loops_of(&path).len(), 1, "{point}");
    let blocks: u64 = tool(
        "xfs_db",
        &[
            "-r",
            "-c",
            "sb 0",
            "-c",
            "print dblocks",
            path.to_str().expect("UTF-8 path"),
        ],
    )
    .trim()
    .trim_start_matches("dblocks = ")
    .parse()
    .expect("xfs_db prints dblocks");
    assert!(
        blocks * 4096 > 390 * MIB,
        "{point}: xfs not grown: {blocks} blocks"
    );
    assert_clean(fx, point);
    seen
}

fn crash_remove(fx: &Fixture, point: &str) -> Seen {
    let uuid = new_uuid();
    run_ok(fx, &["create", "--size", "32M", "--uuid", &uuid]);
    run_ok(fx, &["attach", &uuid]);
    let path = fx.backing(&uuid);
    let args = ["remove", &uuid, "--delete-data"];
    crash(fx, point, &args);
    assert!(
        fx.registry_file(&uuid).exists(),
        "{point}: unregistered before the end"
    );
    let seen = check_and_repair(fx);
    // Data goes before the entry: a remove killed after deleting the file
    // leaves a registered volume without its file, which only a repeated
    // remove finishes (repair never drops registry entries).
    let left: &[&str] = if path.exists() {
        &[]
    } else {
        &["missing-backing-file"]
    };
    assert_eq!(seen.after_repair, left, "{point}: after repair");
    let again = run_ok(fx, &[&args[..], &["--json"]].concat()).json();
    assert_eq!(again["changed"], true, "{point}: the entry was still there");
    assert!(
        !fx.registry_file(&uuid).exists(),
        "{point}: still registered"
    );
    assert!(!path.exists(), "{point}: data not deleted");
    let devices = tool("losetup", &["-l", "-n", "-O", "NAME,BACK-FILE"]);
    assert!(
        !devices.contains(&uuid),
        "{point}: a device still holds it: {devices}"
    );
    assert_clean(fx, point);
    seen
}

#[test]
fn every_crash_point_is_repaired_and_the_operation_completes_when_repeated() {
    needs_root!();
    let mut table = Vec::new();
    for &point in Crash::ALL {
        let fx = Fixture::new();
        let name = point.name();
        let seen = match point {
            Crash::CreateAfterAllocate
            | Crash::CreateAfterFormat
            | Crash::CreateBeforeRename
            | Crash::CreateBeforeRegistry
            | Crash::CreateBeforeUnmark => crash_create(&fx, name),
            Crash::ResizeAfterFile | Crash::ResizeBeforeRegistry => crash_resize(&fx, name),
            Crash::ResizeXfsDeviceBound => crash_resize_xfs(&fx, name),
            Crash::RemoveAfterDetach | Crash::RemoveBeforeRegistry => crash_remove(&fx, name),
            Crash::CloneWhileFrozen
            | Crash::CloneAfterCopy
            | Crash::CloneBeforeRename
            | Crash::CloneBeforeRegistry
            | Crash::CloneBeforeUnmark => crash_clone(&fx, name),
            Crash::ImportAfterData | Crash::ImportBeforeRename => crash_import(&fx, name),
        };
        table.push(format!(
            "  {name:<24} check after the kill: {:?}; after --repair: {:?}",
            seen.after_crash, seen.after_repair
        ));
        println!("{}", table.last().expect("a row"));
    }
    println!(
        "crash points: {} of {} driven",
        table.len(),
        Crash::ALL.len()
    );
}
