//! The kernel primitives under `clone`, on real file systems mounted from
//! loop devices: a reflink shares extents on xfs and btrfs and is refused
//! on ext4, where the hole-keeping copy stands in; a freeze blocks writers
//! until the thaw, is refused on a frozen file system, and never outlives
//! its freezer: not a SIGKILL, not a freezer that sleeps past its limit.

mod common;

use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver, TryRecvError};
use std::thread;
use std::time::{Duration, Instant};

use common::Fixture;
use nix::errno::Errno;
use sparse_volume::kernel::extents::shared_bytes;
use sparse_volume::kernel::file_clone::{copy_keeping_holes, reflink};
use sparse_volume::kernel::freeze::freeze;

/// The helper test that freezes for the kill test reads the mount point
/// from here; without it, it does nothing.
const HELPER_MOUNT: &str = "SV_TEST_FREEZE_HELPER_MOUNT";
const HELPER_TEST: &str = "helper_freezes_and_sleeps";
const FROZEN_LINE: &str = "sv-test-frozen";

/// How long a writer must still be blocked to count as blocked.
const BLOCKED_FOR: Duration = Duration::from_millis(300);
/// Bounds for what must happen, generous for a busy 2-core machine.
const PROMPTLY: Duration = Duration::from_secs(10);
const EVENTUALLY: Duration = Duration::from_secs(60);
/// A limit the freezes under test never reach.
const LONG_LIMIT: Duration = Duration::from_secs(120);

/// A file system of `kind` on a sparse image in a fixture, mounted with
/// `mount -o loop` (util-linux sets autoclear, so the unmount releases the
/// loop device); thawed and unmounted however the test ends.
struct Scratch {
    mount_point: PathBuf,
    // After the unmount: its drop detaches any loop device left on it.
    _fx: Fixture,
}

impl Scratch {
    fn new(kind: &str) -> Self {
        let fx = Fixture::new();
        let images = fx.host("/images");
        fs::create_dir_all(&images).unwrap();
        let image = images.join(format!("{kind}.img"));
        let size: u64 = match kind {
            // mkfs.xfs refuses less than 300 MB.
            "xfs" => common::XFS_SIZE,
            "btrfs" => 256 << 20,
            _ => 64 << 20,
        };
        File::create(&image).unwrap().set_len(size).unwrap();
        let image = image.to_str().unwrap();
        match kind {
            "xfs" => common::tool("mkfs.xfs", &["-q", "-m", "reflink=1", image]),
            "btrfs" => common::tool("mkfs.btrfs", &["-q", image]),
            _ => common::tool("mkfs.ext4", &["-q", "-F", image]),
        };
        let mount_point = fx.host("/mnt");
        fs::create_dir_all(&mount_point).unwrap();
        common::tool(
            "mount",
            &[
                "-o",
                "loop",
                "-t",
                kind,
                image,
                mount_point.to_str().unwrap(),
            ],
        );
        Self {
            mount_point,
            _fx: fx,
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.mount_point.join(name)
    }

    /// Whether the file system unmounts within `within` (a guardian still
    /// alive holds its mount point open, and keeps it busy).
    fn unmounts_within(&self, within: Duration) -> bool {
        let start = Instant::now();
        loop {
            let unmounted = Command::new("umount")
                .arg(&self.mount_point)
                .output()
                .is_ok_and(|o| o.status.success());
            if unmounted || !is_mounted(&self.mount_point) {
                return true;
            }
            if start.elapsed() > within {
                return false;
            }
            thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if !is_mounted(&self.mount_point) {
            return;
        }
        // A failed test may have left it frozen (fsfreeze is an independent
        // hand; EINVAL when it is not frozen).
        let _ = Command::new("fsfreeze")
            .args(["-u"])
            .arg(&self.mount_point)
            .output();
        if !self.unmounts_within(Duration::from_secs(5)) {
            // Never leave a mount behind; the loop device goes with the
            // last reference.
            let _ = Command::new("umount")
                .arg("-l")
                .arg(&self.mount_point)
                .output();
        }
    }
}

fn is_mounted(point: &Path) -> bool {
    Command::new("findmnt")
        .arg("--mountpoint")
        .arg(point)
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Bytes that do not compress or repeat within a block.
fn pattern(length: usize, seed: u64) -> Vec<u8> {
    let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
    (0..length)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 56) as u8
        })
        .collect()
}

fn read_write(path: &Path) -> File {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .unwrap()
}

const MIB: u64 = 1 << 20;

/// A 16 MiB (or `length`) file with `(offset, bytes)` of data, synced;
/// the rest holes.
fn sparse_file(path: &Path, length: u64, data: &[(u64, usize)]) -> File {
    let file = read_write(path);
    for (i, &(at, bytes)) in data.iter().enumerate() {
        file.write_all_at(&pattern(bytes, i as u64 + 1), at)
            .unwrap();
    }
    file.set_len(length).unwrap();
    file.sync_all().unwrap();
    file
}

fn same_content(a: &Path, b: &Path) -> bool {
    fs::read(a).unwrap() == fs::read(b).unwrap()
}

/// Starts a write of a new file in `dir` on a thread of its own; the
/// receiver gets its result when it has finished.
fn write_in_background(dir: &Path, name: &str) -> Receiver<std::io::Result<()>> {
    let path = dir.join(name);
    let (done, finished) = mpsc::channel();
    thread::spawn(move || {
        let result = File::create(&path)
            .and_then(|mut file| file.write_all(b"written after the thaw\n"))
            .map(drop);
        let _ = done.send(result);
    });
    finished
}

fn assert_still_blocked(writer: &Receiver<std::io::Result<()>>, what: &str) {
    thread::sleep(BLOCKED_FOR);
    assert!(
        matches!(writer.try_recv(), Err(TryRecvError::Empty)),
        "{what}: a write finished on a frozen file system"
    );
}

fn assert_finishes(writer: &Receiver<std::io::Result<()>>, within: Duration, what: &str) {
    match writer.recv_timeout(within) {
        Ok(result) => result.unwrap_or_else(|e| panic!("{what}: the write failed: {e}")),
        Err(_) => panic!("{what}: a write still blocked after {within:?}"),
    }
}

fn reflink_shares_extents(kind: &str) {
    let scratch = Scratch::new(kind);
    let length = 16 * MIB;
    let data = (5 * MIB) as i64;
    let source_path = scratch.path("source");
    let source = sparse_file(&source_path, length, &[(0, 4 << 20), (8 * MIB, 1 << 20)]);
    let original = fs::read(&source_path).unwrap();
    let clone_path = scratch.path("clone");
    let clone = read_write(&clone_path);
    reflink(&source, &clone).unwrap_or_else(|e| panic!("{kind}: FICLONE failed: {e}"));
    assert_eq!(clone.metadata().unwrap().len(), length);
    assert!(
        same_content(&source_path, &clone_path),
        "{kind}: the clone differs"
    );
    let shared_source = shared_bytes(&source, length).unwrap();
    let shared_clone = shared_bytes(&clone, length).unwrap();
    eprintln!("{kind}: shared after the reflink: source {shared_source}, clone {shared_clone} (data {data})");
    for shared in [shared_source, shared_clone] {
        assert!(
            (shared as i64 - data).abs() <= 256 << 10,
            "{kind}: {shared} bytes shared, {data} written"
        );
    }

    // A write to the clone is the clone's alone.
    clone.write_all_at(&pattern(1 << 20, 99), MIB).unwrap();
    clone.sync_all().unwrap();
    assert!(
        fs::read(&source_path).unwrap() == original,
        "{kind}: writing the clone changed the source"
    );
    let written = fs::read(&clone_path).unwrap();
    assert!(written[MIB as usize..2 * MIB as usize] == pattern(1 << 20, 99)[..]);
    assert!(written[..MIB as usize] == original[..MIB as usize]);
    let after_source = shared_bytes(&source, length).unwrap();
    let after_clone = shared_bytes(&clone, length).unwrap();
    eprintln!("{kind}: shared after 1 MiB of the clone was rewritten: source {after_source}, clone {after_clone}");
    assert!(
        (after_clone as i64 - (data - MIB as i64)).abs() <= 256 << 10,
        "{kind}: the clone still shares {after_clone} bytes"
    );
}

#[test]
fn a_reflink_on_xfs_shares_the_extents_and_a_write_unshares_them() {
    needs_root!();
    reflink_shares_extents("xfs");
}

#[test]
fn a_reflink_on_btrfs_shares_the_extents_and_a_write_unshares_them() {
    needs_root!();
    reflink_shares_extents("btrfs");
}

#[test]
fn on_ext4_a_reflink_is_refused_and_the_copy_keeps_the_holes() {
    needs_root!();
    let scratch = Scratch::new("ext4");
    let length = 32 * MIB;
    let data = (2 << 20) + (64 << 10);
    let source_path = scratch.path("source");
    let source = sparse_file(
        &source_path,
        length,
        &[(0, 1 << 20), (10 * MIB, 1 << 20), (20 * MIB, 64 << 10)],
    );
    let copy_path = scratch.path("copy");
    let copy = read_write(&copy_path);
    let refused = reflink(&source, &copy).expect_err("ext4 has no reflinks");
    eprintln!("ext4: FICLONE failed with {refused:?}");
    assert!(
        [Errno::EOPNOTSUPP, Errno::EINVAL, Errno::EXDEV].contains(&refused),
        "{refused}"
    );
    assert_eq!(copy.metadata().unwrap().len(), 0, "a failed reflink wrote");

    let copied = copy_keeping_holes(&source, &copy).unwrap();
    copy.sync_all().unwrap();
    assert_eq!(copied, data);
    assert_sparse_copy(&source_path, &copy_path, length);
    assert_eq!(shared_bytes(&copy, length), Ok(0));

    // To another file system (the fixture's, on the host): no reflink
    // there, and copy_file_range across file systems falls back to reading
    // and writing.
    let elsewhere = tempfile::tempdir().unwrap();
    let far_path = elsewhere.path().join("copy");
    let far = read_write(&far_path);
    let refused = reflink(&source, &far).expect_err("a reflink across file systems");
    assert_eq!(refused, Errno::EXDEV);
    assert_eq!(copy_keeping_holes(&source, &far).unwrap(), data);
    far.sync_all().unwrap();
    assert_sparse_copy(&source_path, &far_path, length);
}

fn assert_sparse_copy(source: &Path, copy: &Path, length: u64) {
    assert!(same_content(source, copy), "the copy differs");
    let (source, copy) = (fs::metadata(source).unwrap(), fs::metadata(copy).unwrap());
    assert_eq!(copy.len(), length);
    let (source_bytes, copy_bytes) = (source.blocks() * 512, copy.blocks() * 512);
    eprintln!("allocated: source {source_bytes}, copy {copy_bytes} of {length}");
    assert!(
        copy_bytes.abs_diff(source_bytes) <= 256 << 10,
        "the copy has {copy_bytes} bytes of blocks, the source {source_bytes}"
    );
    assert!(copy_bytes < length / 4, "the copy's holes were filled");
}

/// The file system a mount point leads to now.
fn device_of(point: &Path) -> u64 {
    fs::metadata(point).unwrap().dev()
}

/// A mount on top of the one meant: its path leads to the other file
/// system, which must not be frozen in its place.
#[test]
fn a_covered_mount_point_is_not_frozen() {
    needs_root!();
    let scratch = Scratch::new("ext4");
    let meant = device_of(&scratch.mount_point);
    let status = Command::new("mount")
        .args(["-t", "tmpfs", "cover"])
        .arg(&scratch.mount_point)
        .status()
        .unwrap();
    assert!(status.success());
    let refused = freeze(&scratch.mount_point, meant, LONG_LIMIT);
    // Lazily: a guardian another test forks while the cover's root is
    // open here (freeze opens it before it refuses) holds it until that
    // guardian exits, and a plain umount is then refused as busy.
    let _ = Command::new("umount")
        .arg("-l")
        .arg(&scratch.mount_point)
        .status();
    let error = format!(
        "{:#}",
        refused.expect_err("freezing through a covered mount point")
    );
    assert!(error.contains("a mount covers it"), "{error}");
    // Uncovered, the same call freezes it.
    assert_eq!(device_of(&scratch.mount_point), meant, "still covered");
    freeze(&scratch.mount_point, meant, LONG_LIMIT)
        .unwrap()
        .thaw()
        .unwrap();
}

fn freeze_blocks_writers_until_thawed(kind: &str) {
    let scratch = Scratch::new(kind);
    fs::write(scratch.path("before"), b"before the freeze\n").unwrap();
    let frozen = freeze(
        &scratch.mount_point,
        device_of(&scratch.mount_point),
        LONG_LIMIT,
    )
    .unwrap();
    let writer = write_in_background(&scratch.mount_point, "during");
    assert_still_blocked(&writer, kind);
    let window = frozen.thaw().unwrap();
    eprintln!("{kind}: frozen for {window:?}");
    assert!(window >= BLOCKED_FOR && window < EVENTUALLY, "{window:?}");
    assert_finishes(&writer, EVENTUALLY, kind);
    assert_eq!(
        fs::read(scratch.path("during")).unwrap(),
        b"written after the thaw\n"
    );
    // No guardian left holding the mount point.
    assert!(scratch.unmounts_within(PROMPTLY), "{kind}: still busy");
}

#[test]
fn a_frozen_xfs_blocks_writers_until_the_thaw() {
    needs_root!();
    freeze_blocks_writers_until_thawed("xfs");
}

#[test]
fn a_frozen_ext4_blocks_writers_until_the_thaw() {
    needs_root!();
    freeze_blocks_writers_until_thawed("ext4");
}

#[test]
fn a_second_freeze_is_refused_and_leaves_the_first_in_place() {
    needs_root!();
    let scratch = Scratch::new("ext4");
    let first = freeze(
        &scratch.mount_point,
        device_of(&scratch.mount_point),
        LONG_LIMIT,
    )
    .unwrap();
    let error = freeze(
        &scratch.mount_point,
        device_of(&scratch.mount_point),
        LONG_LIMIT,
    )
    .expect_err("a second freeze");
    let text = format!("{error:#}");
    assert!(text.contains("already frozen"), "{text}");
    assert_eq!(error.downcast_ref::<Errno>(), Some(&Errno::EBUSY), "{text}");
    // The refused freeze's guardian stood down: the first freeze holds.
    let writer = write_in_background(&scratch.mount_point, "during");
    assert_still_blocked(&writer, "after a refused second freeze");
    thread::sleep(Duration::from_millis(500));
    assert!(matches!(writer.try_recv(), Err(TryRecvError::Empty)));
    first.thaw().unwrap();
    assert_finishes(&writer, EVENTUALLY, "after the thaw");
}

#[test]
fn a_freeze_dropped_without_a_thaw_is_thawed() {
    needs_root!();
    let scratch = Scratch::new("ext4");
    let frozen = freeze(
        &scratch.mount_point,
        device_of(&scratch.mount_point),
        LONG_LIMIT,
    )
    .unwrap();
    let writer = write_in_background(&scratch.mount_point, "during");
    assert_still_blocked(&writer, "before the drop");
    // As on a path that returns early with an error.
    drop(frozen);
    assert_finishes(&writer, PROMPTLY, "after the drop");
    assert!(
        scratch.unmounts_within(PROMPTLY),
        "still busy after the drop"
    );
}

#[test]
fn the_guardian_thaws_after_the_limit_and_the_late_thaw_says_so() {
    needs_root!();
    let scratch = Scratch::new("ext4");
    let limit = Duration::from_secs(2);
    let start = Instant::now();
    let frozen = freeze(&scratch.mount_point, device_of(&scratch.mount_point), limit).unwrap();
    let writer = write_in_background(&scratch.mount_point, "during");
    assert_still_blocked(&writer, "before the limit");
    // The caller sleeps past its limit: the guardian alone thaws.
    assert_finishes(&writer, limit + EVENTUALLY, "after the limit");
    let unblocked = start.elapsed();
    eprintln!("the guardian thawed about {unblocked:?} after the freeze began (limit {limit:?})");
    assert!(
        unblocked >= limit - Duration::from_millis(100),
        "{unblocked:?}"
    );
    let error = frozen.thaw().expect_err("a thaw after the guardian's");
    let text = format!("{error:#}");
    assert!(text.contains("did not last"), "{text}");
}

/// Run by the kill test as a child process of its own (the test binary
/// again, this test alone): freezes the mount point named in the
/// environment, says so, and sleeps until killed.
#[test]
#[ignore = "a helper: a_killed_freezer_leaves_the_file_system_thawed runs it"]
fn helper_freezes_and_sleeps() {
    let Some(mount_point) = std::env::var_os(HELPER_MOUNT) else {
        return;
    };
    let mount_point = Path::new(&mount_point);
    let _frozen = freeze(mount_point, device_of(mount_point), LONG_LIMIT).unwrap();
    println!("{FROZEN_LINE}");
    std::io::stdout().flush().unwrap();
    thread::sleep(Duration::from_secs(600));
}

/// The helper process, killed however the test ends.
struct Helper(Child);

impl Drop for Helper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_killed_freezer_leaves_the_file_system_thawed() {
    needs_root!();
    let scratch = Scratch::new("xfs");
    let mut helper = Helper(
        Command::new(std::env::current_exe().unwrap())
            .args([HELPER_TEST, "--exact", "--nocapture", "--include-ignored"])
            .env(HELPER_MOUNT, &scratch.mount_point)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let stdout = helper.0.stdout.take().unwrap();
    let (said, lines) = mpsc::channel();
    thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if said.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + EVENTUALLY;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) if line.contains(FROZEN_LINE) => break,
            Ok(_) => continue,
            Err(_) => panic!("the helper did not freeze within {EVENTUALLY:?}"),
        }
    }
    let writer = write_in_background(&scratch.mount_point, "during");
    assert_still_blocked(&writer, "while the helper lives");

    let killed = Instant::now();
    helper.0.kill().unwrap(); // SIGKILL
    helper.0.wait().unwrap();
    assert_finishes(&writer, PROMPTLY, "after the freezer was killed");
    eprintln!(
        "a write went through {:?} after SIGKILL to the freezer",
        killed.elapsed()
    );
    fs::write(scratch.path("after"), b"after\n").unwrap();
    // The guardian ended after it thawed: nothing holds the mount point.
    assert!(
        scratch.unmounts_within(PROMPTLY),
        "the file system is still busy after the freezer was killed"
    );
}
