//! Volumes on storage with 4096-byte logical sectors (issue 9 item 1), and
//! neighbouring defects of attach, register and resize (items 6, 10, 16).
//!
//! Every assertion uses a witness other than our own code: `blockdev
//! --getss` (BLKSSZGET) for the loop device's sector size, `sgdisk -p`
//! reading the partition table through the loop device, a real `mount`,
//! sysfs for the loop flags and `losetup -j` for bindings.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{loops_of, new_uuid, sysfs_flag, tool, Fixture, Mounted, Run};
use sparse_volume::kernel::loop_device::ioctl::LoopInfo64;
use sparse_volume::kernel::loop_device::LoopDevice;

const STORAGE_IMAGE_SIZE: u64 = 2 << 30;
const FOUR_K_ROOT: &str = "/srv/4k";

/// A storage root on a file system whose block device has 4096-byte
/// logical sectors: a sparse image bound with `losetup -b 4096`, formatted
/// ext4 and mounted at [`FOUR_K_ROOT`] inside the fixture, which
/// `config.toml` names as the only storage root.
struct FourKRoot {
    mount_point: PathBuf,
    device: String,
}

impl FourKRoot {
    fn new(fx: &Fixture) -> Self {
        let image = fx.root.path().join("storage-4k.img");
        fs::File::create(&image)
            .unwrap()
            .set_len(STORAGE_IMAGE_SIZE)
            .unwrap();
        let device = tool(
            "losetup",
            &["-b", "4096", "--show", "-f", image.to_str().unwrap()],
        )
        .trim()
        .to_string();
        let mount_point = fx.host(FOUR_K_ROOT);
        fs::create_dir_all(&mount_point).unwrap();
        // From here on, Drop undoes whatever was set up.
        let root = Self {
            mount_point,
            device,
        };
        assert_eq!(getss(&root.device), 4096, "losetup -b 4096 did not apply");
        tool("mkfs.ext4", &["-q", "-F", &root.device]);
        tool("mount", &[&root.device, root.mount_point.to_str().unwrap()]);
        fs::set_permissions(
            &root.mount_point,
            std::os::unix::fs::PermissionsExt::from_mode(0o700),
        )
        .unwrap();
        fs::write(
            fx.host("/etc/sparse-volume/config.toml"),
            format!("storage_roots = [\"{FOUR_K_ROOT}\"]\n"),
        )
        .unwrap();
        root
    }
}

impl Drop for FourKRoot {
    fn drop(&mut self) {
        for entry in fs::read_dir(&self.mount_point)
            .into_iter()
            .flatten()
            .flatten()
        {
            release_loops_of(&entry.path());
        }
        let _ = Command::new("umount").arg(&self.mount_point).output();
        let _ = Command::new("losetup").args(["-d", &self.device]).output();
    }
}

/// Unmounts and detaches every loop device of `path`, whatever state a
/// failed test left it in.
fn release_loops_of(path: &Path) {
    let Ok(output) = Command::new("losetup")
        .args(["--noheadings", "--output", "NAME", "-j"])
        .arg(path)
        .output()
    else {
        return;
    };
    for device in String::from_utf8_lossy(&output.stdout).split_whitespace() {
        let _ = Command::new("umount").arg(device).output();
        let _ = Command::new("losetup").args(["-d", device]).output();
    }
}

/// A process that holds a device open, killed however the test ends.
struct Holder(Child);

impl Holder {
    fn new(device: &str) -> Self {
        let opened = fs::File::open(device).unwrap();
        let child = Command::new("sleep")
            .arg("60")
            .stdin(Stdio::from(opened))
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        Self(child)
    }

    fn release(mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The logical sector size of a block device, from BLKSSZGET.
fn getss(device: &str) -> u32 {
    tool("blockdev", &["--getss", device])
        .trim()
        .parse()
        .unwrap()
}

/// `sector_size` as the registry file records it (absent = 512).
fn recorded_sector_size(fx: &Fixture, uuid: &str) -> u32 {
    let text = fs::read_to_string(fx.registry_file(uuid)).unwrap();
    let table: toml::Table = text.parse().unwrap();
    table
        .get("sector_size")
        .and_then(toml::Value::as_integer)
        .map_or(512, |s| u32::try_from(s).unwrap())
}

fn recorded(fx: &Fixture, uuid: &str, key: &str) -> Option<String> {
    let text = fs::read_to_string(fx.registry_file(uuid)).unwrap();
    let table: toml::Table = text.parse().unwrap();
    table.get(key).map(|v| match v {
        toml::Value::String(s) => s.clone(),
        other => other.to_string(),
    })
}

fn device_of(run: &Run) -> String {
    run.json()["device"]
        .as_str()
        .unwrap_or_else(|| panic!("no device in {}", run.stdout))
        .to_string()
}

/// Partition 1's first and last sector as `sgdisk -p` reads them through
/// `device` (in the device's own sectors), `None` if it lists none.
fn sgdisk_partition_1(device: &str) -> Option<(u64, u64)> {
    let listing = tool("sgdisk", &["-p", device]);
    listing.lines().find_map(|line| {
        let mut fields = line.split_whitespace();
        (fields.next()? == "1").then_some(())?;
        let first = fields.next()?.parse().ok()?;
        let last = fields.next()?.parse().ok()?;
        Some((first, last))
    })
}

/// The unique GUID of partition 1, as sgdisk reads it through `device`.
fn sgdisk_partition_1_guid(device: &str) -> String {
    let info = tool("sgdisk", &["-i", "1", device]);
    info.lines()
        .find_map(|l| l.strip_prefix("Partition unique GUID: "))
        .unwrap_or_else(|| panic!("no partition 1 in {info}"))
        .trim()
        .to_lowercase()
}

/// Creates a volume with `--now` on the 4K root and checks it with the
/// independent witnesses; returns its UUID and device.
fn create_on_4k_root(fx: &Fixture, extra: &[&str]) -> (String, String, Run) {
    let uuid = new_uuid();
    let mut args = vec!["create", "--uuid", &uuid, "--now", "--json"];
    args.extend_from_slice(extra);
    let run = fx.run_ok(&args);
    let device = device_of(&run);
    (uuid, device, run)
}

fn assert_sector_size_matches_record(fx: &Fixture, uuid: &str, device: &str) {
    assert_eq!(
        getss(device),
        recorded_sector_size(fx, uuid),
        "BLKSSZGET of {device} differs from the volume's recorded sector size"
    );
}

fn assert_direct_io(device: &str, expected: bool) {
    assert_eq!(
        sysfs_flag(device, "loop/dio"),
        if expected { "1" } else { "0" },
        "direct I/O of {device}"
    );
}

#[test]
fn ext4_volume_on_a_4k_storage_root_mounts() {
    needs_root!();
    let fx = Fixture::new();
    let _root = FourKRoot::new(&fx);
    let (uuid, device, _) = create_on_4k_root(&fx, &["--size", "64M"]);
    assert_sector_size_matches_record(&fx, &uuid, &device);
    assert_eq!(recorded_sector_size(&fx, &uuid), 4096);
    assert_direct_io(&device, true);
    drop(Mounted::new(&fx, &device, &["-t", "ext4"]).expect("mounting the ext4 volume"));
    fx.run_ok(&["detach", &uuid]);
}

#[test]
fn xfs_volume_on_a_4k_storage_root_mounts() {
    needs_root!();
    let fx = Fixture::new();
    let _root = FourKRoot::new(&fx);
    let (uuid, device, _) = create_on_4k_root(&fx, &["--size", "320M", "--fs", "xfs"]);
    assert_sector_size_matches_record(&fx, &uuid, &device);
    assert_eq!(recorded_sector_size(&fx, &uuid), 4096);
    assert_direct_io(&device, true);
    drop(Mounted::new(&fx, &device, &["-t", "xfs"]).expect("mounting the xfs volume"));
    // It comes back the same way after a detach.
    fx.run_ok(&["detach", &uuid]);
    let device = device_of(&fx.run_ok(&["attach", &uuid, "--json"]));
    assert_sector_size_matches_record(&fx, &uuid, &device);
    let mounted =
        Mounted::new(&fx, &device, &["-t", "xfs"]).expect("mounting the xfs volume again");
    let before = nix::sys::statvfs::statvfs(&mounted.0).unwrap().blocks();
    drop(mounted);
    fx.run_ok(&["detach", &uuid]);
    // Growing it detached binds a temporary device: with its sectors too.
    fx.run_ok(&["resize", &uuid, "--size", "400M"]);
    let device = device_of(&fx.run_ok(&["attach", &uuid, "--json"]));
    let mounted =
        Mounted::new(&fx, &device, &["-t", "xfs"]).expect("mounting the grown xfs volume");
    let after = nix::sys::statvfs::statvfs(&mounted.0).unwrap().blocks();
    // 80 MiB more in 4 KiB blocks, give or take metadata.
    assert!(after > before + 19_000, "{before} -> {after} blocks");
    drop(mounted);
    fx.run_ok(&["detach", &uuid]);
}

#[test]
fn block_volume_on_a_4k_storage_root_shows_its_partition_and_grows() {
    needs_root!();
    let fx = Fixture::new();
    let _root = FourKRoot::new(&fx);
    let (uuid, device, _) = create_on_4k_root(&fx, &["--size", "64M", "--mode", "block"]);
    assert_sector_size_matches_record(&fx, &uuid, &device);
    assert_eq!(recorded_sector_size(&fx, &uuid), 4096);
    assert_direct_io(&device, true);
    let (first, last) =
        sgdisk_partition_1(&device).expect("sgdisk -p lists no partition 1 on the loop device");
    // 1 MiB alignment in 4096-byte sectors; the backup GPT takes 1 + 4.
    assert_eq!(first, 256);
    assert_eq!(last, (64 << 20) / 4096 - 6);
    assert_eq!(sgdisk_partition_1_guid(&device), uuid);

    fx.run_ok(&["resize", &uuid, "--size", "128M"]);
    assert_eq!(
        sgdisk_partition_1(&device),
        Some((256, (128 << 20) / 4096 - 6))
    );
    let verify = tool("sgdisk", &["-v", &device]);
    assert!(verify.contains("No problems found"), "{verify}");
    fx.run_ok(&["detach", &uuid]);
}

#[test]
fn volumes_with_512_byte_sectors_on_a_4k_root_work_buffered_and_say_so() {
    needs_root!();
    let fx = Fixture::new();
    let _root = FourKRoot::new(&fx);
    let (xfs, device, run) = create_on_4k_root(
        &fx,
        &["--size", "320M", "--fs", "xfs", "--sector-size", "512"],
    );
    assert_eq!(recorded_sector_size(&fx, &xfs), 512);
    assert_sector_size_matches_record(&fx, &xfs, &device);
    assert_direct_io(&device, false);
    drop(Mounted::new(&fx, &device, &["-t", "xfs"]).expect("mounting the 512-byte xfs volume"));
    fx.run_ok(&["detach", &xfs]);
    let attached = fx.run_ok(&["attach", &xfs]);
    assert!(
        attached.stderr.contains(
            "direct I/O off: the volume's 512-byte sectors are smaller than the backing device's 4096-byte sectors"
        ),
        "{}{}",
        run.stderr,
        attached.stderr
    );
    fx.run_ok(&["detach", &xfs]);

    let (block, device, _) = create_on_4k_root(
        &fx,
        &["--size", "64M", "--mode", "block", "--sector-size", "512"],
    );
    assert_sector_size_matches_record(&fx, &block, &device);
    assert_eq!(
        sgdisk_partition_1(&device),
        Some((2048, (64 << 20) / 512 - 34))
    );
    assert_eq!(sgdisk_partition_1_guid(&device), block);
    fx.run_ok(&["detach", &block]);

    let bad = fx.run(&["create", "--size", "64M", "--sector-size", "1024"]);
    assert_eq!(bad.code, 2, "{}", bad.stderr);
    // ext4 with 1 KiB blocks cannot mount on the default 4096-byte sectors.
    let small_blocks = fx.run(&["create", "--size", "64M", "--mkfs-option=-b1024"]);
    assert_eq!(small_blocks.code, 1, "{}", small_blocks.stderr);
    assert!(
        small_blocks
            .stderr
            .contains("does not mount on the volume's 4096-byte sectors"),
        "{}",
        small_blocks.stderr
    );
}

#[test]
fn register_detects_the_sector_size_of_adopted_content() {
    needs_root!();
    let fx = Fixture::new();
    let register = |uuid: &str, extra: &[&str]| {
        let path = fx.logical_backing(uuid);
        let mut args = vec!["register", "--uuid", uuid, "--path", &path];
        args.extend_from_slice(extra);
        fx.run(&args)
    };

    // xfs made for 4096-byte sectors, registered without --fs.
    let xfs = new_uuid();
    let path = fx.backing(&xfs);
    fx.sparse_file_of(&path, common::XFS_SIZE);
    tool(
        "mkfs.xfs",
        &[
            "-q",
            "-s",
            "size=4096",
            "-m",
            &format!("uuid={xfs}"),
            path.to_str().unwrap(),
        ],
    );
    let adopted = register(&xfs, &[]);
    assert_eq!(adopted.code, 0, "{}", adopted.stderr);
    assert_eq!(recorded_sector_size(&fx, &xfs), 4096);
    assert_eq!(recorded(&fx, &xfs, "fs_type").as_deref(), Some("xfs"));
    let device = device_of(&fx.run_ok(&["attach", &xfs, "--json"]));
    assert_eq!(getss(&device), 4096);
    drop(Mounted::new(&fx, &device, &["-t", "xfs"]).expect("mounting the adopted xfs"));
    fx.run_ok(&["detach", &xfs]);

    // A GPT written for 4096-byte LBAs, by sgdisk on a 4K loop device.
    let gpt = new_uuid();
    let path = fx.backing(&gpt);
    fx.sparse_file(&path);
    let scratch = tool(
        "losetup",
        &["-b", "4096", "--show", "-f", path.to_str().unwrap()],
    );
    let scratch = scratch.trim();
    let partitioned = Command::new("sgdisk")
        .args(["-n", "1:0:0", "-u", &format!("1:{gpt}"), scratch])
        .output()
        .unwrap();
    let _ = Command::new("losetup").args(["-d", scratch]).output();
    assert!(partitioned.status.success());
    let refused = register(&gpt, &["--mode", "block", "--sector-size", "512"]);
    assert_eq!(refused.code, 1, "{}", refused.stderr);
    assert!(refused.stderr.contains("4096"), "{}", refused.stderr);
    let adopted = register(&gpt, &["--mode", "block"]);
    assert_eq!(adopted.code, 0, "{}", adopted.stderr);
    assert_eq!(recorded_sector_size(&fx, &gpt), 4096);
    let device = device_of(&fx.run_ok(&["attach", &gpt, "--json"]));
    assert_eq!(getss(&device), 4096);
    assert_eq!(sgdisk_partition_1_guid(&device), gpt);
    fx.run_ok(&["detach", &gpt]);

    // xfs made for 512-byte sectors refuses to mount on 4096-byte ones.
    let small_xfs = new_uuid();
    fx.make_xfs(&small_xfs);
    let refused = register(&small_xfs, &["--sector-size", "4096"]);
    assert_eq!(refused.code, 1, "{}", refused.stderr);
    assert!(
        refused
            .stderr
            .contains("does not read with 4096-byte sectors"),
        "{}",
        refused.stderr
    );
    assert_eq!(register(&small_xfs, &[]).code, 0);
    assert_eq!(recorded_sector_size(&fx, &small_xfs), 512);

    // ext4 and a 512-byte GPT on this 512-byte host stay at 512; ext4
    // with 4 KiB blocks also reads with 4096-byte sectors if asked.
    let ext4 = new_uuid();
    fx.make_ext4(&ext4);
    assert_eq!(register(&ext4, &[]).code, 0);
    assert_eq!(recorded_sector_size(&fx, &ext4), 512);
    let big_ext4 = new_uuid();
    let path = fx.backing(&big_ext4);
    fx.sparse_file(&path);
    tool(
        "mkfs.ext4",
        &[
            "-q",
            "-F",
            "-b",
            "4096",
            "-U",
            &big_ext4,
            path.to_str().unwrap(),
        ],
    );
    assert_eq!(register(&big_ext4, &["--sector-size", "4096"]).code, 0);
    assert_eq!(recorded_sector_size(&fx, &big_ext4), 4096);
    let device = device_of(&fx.run_ok(&["attach", &big_ext4, "--json"]));
    assert_eq!(getss(&device), 4096);
    drop(Mounted::new(&fx, &device, &["-t", "ext4"]).expect("mounting ext4 on 4096-byte sectors"));
    fx.run_ok(&["detach", &big_ext4]);
    let small = new_uuid();
    fx.make_gpt(&small);
    let refused = register(&small, &["--mode", "block", "--sector-size", "4096"]);
    assert_eq!(refused.code, 1, "{}", refused.stderr);
    assert_eq!(register(&small, &["--mode", "block"]).code, 0);
    assert_eq!(recorded_sector_size(&fx, &small), 512);
}

/// Issue 9 item 16.
#[test]
fn register_detects_the_file_system_type() {
    needs_root!();
    let fx = Fixture::new();
    let uuid = new_uuid();
    fx.make_xfs(&uuid);
    let path = fx.logical_backing(&uuid);
    let wrong = fx.run(&["register", "--uuid", &uuid, "--path", &path, "--fs", "ext4"]);
    assert_eq!(wrong.code, 1, "{}", wrong.stderr);
    assert!(
        wrong.stderr.contains("holds an xfs file system, not ext4"),
        "{}",
        wrong.stderr
    );
    let adopted = fx.run(&["register", "--uuid", &uuid, "--path", &path]);
    assert_eq!(adopted.code, 0, "{}", adopted.stderr);
    assert_eq!(recorded(&fx, &uuid, "fs_type").as_deref(), Some("xfs"));
    let again = fx.run_ok(&[
        "register", "--uuid", &uuid, "--path", &path, "--fs", "xfs", "--json",
    ]);
    assert_eq!(again.json()["changed"], false);
}

/// Issue 9 item 6.
#[test]
fn attach_cancels_a_pending_detach_instead_of_adopting_a_vanishing_device() {
    needs_root!();
    let fx = Fixture::new();
    let uuid = new_uuid();
    let device = device_of(&fx.run_ok(&[
        "create", "--size", "32M", "--uuid", &uuid, "--now", "--json",
    ]));
    let file = fx.backing(&uuid);

    let holder = Holder::new(&device);
    let deferred = fx.run(&["detach", &uuid]);
    assert_eq!(deferred.code, 1, "{}", deferred.stderr);
    assert!(
        deferred.stderr.contains("still open by another program"),
        "{}",
        deferred.stderr
    );
    assert_eq!(sysfs_flag(&device, "loop/autoclear"), "1");

    // The dry run plans the cancellation (a change) and leaves it pending.
    let planned = fx.run(&["attach", &uuid, "--dry-run", "--json"]);
    assert_eq!(planned.code, 0, "{}", planned.stderr);
    assert_eq!(planned.json()["changed"], true, "{}", planned.stdout);
    assert_eq!(device_of(&planned), device);
    assert_eq!(sysfs_flag(&device, "loop/autoclear"), "1");

    let attached = fx.run(&["attach", &uuid, "--json"]);
    assert_eq!(attached.code, 0, "{}", attached.stderr);
    assert_eq!(attached.json()["changed"], true, "{}", attached.stdout);
    assert_eq!(device_of(&attached), device);
    holder.release();
    // The kernel releases an autoclear device at the holder's last close.
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        assert_eq!(
            loops_of(&file),
            vec![device.clone()],
            "the attached device vanished when the holder closed it"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(sysfs_flag(&device, "loop/autoclear"), "0");
    assert!(
        attached.stderr.contains("pending detach"),
        "{}",
        attached.stderr
    );
    fx.run_ok(&["detach", &uuid]);
}

/// Issue 9 item 10: rounding up to whole MiB must not wrap around.
#[test]
fn sizes_near_the_top_of_u64_are_too_large() {
    needs_root!();
    let fx = Fixture::new();
    let huge = u64::MAX.to_string();
    let created = fx.run(&["create", "--size", &huge]);
    assert_eq!(created.code, 1, "{}", created.stderr);
    assert!(created.stderr.contains("too large"), "{}", created.stderr);
    assert!(!created.stderr.contains("panicked"), "{}", created.stderr);

    let uuid = new_uuid();
    fx.run_ok(&["create", "--size", "16M", "--uuid", &uuid]);
    let resized = fx.run(&["resize", &uuid, "--size", &huge]);
    assert_eq!(resized.code, 1, "{}", resized.stderr);
    assert!(resized.stderr.contains("too large"), "{}", resized.stderr);
    assert!(!resized.stderr.contains("panicked"), "{}", resized.stderr);
}

/// Issue 9 item 10: the grown table must be what a reader of the loop
/// device sees, not the copy in the device's page cache.
#[test]
fn a_grown_partition_table_is_seen_through_the_attached_device() {
    needs_root!();
    let fx = Fixture::new();
    let uuid = new_uuid();
    let device = device_of(&fx.run_ok(&[
        "create", "--size", "64M", "--mode", "block", "--uuid", &uuid, "--now", "--json",
    ]));
    // A consumer keeps the device open (on the last close the kernel
    // drops a block device's page cache); reading the table once puts the
    // old copy into that cache.
    let consumer = fs::File::open(&device).unwrap();
    assert_eq!(
        sgdisk_partition_1(&device),
        Some((2048, (64 << 20) / 512 - 34))
    );
    fx.run_ok(&["resize", &uuid, "--size", "128M"]);
    assert_eq!(
        sgdisk_partition_1(&device),
        Some((2048, (128 << 20) / 512 - 34)),
        "sgdisk through {device} still sees the old table"
    );
    drop(consumer);
    fx.run_ok(&["detach", &uuid]);
}

/// The pre-5.8 path (LOOP_SET_FD, LOOP_SET_STATUS64, LOOP_SET_BLOCK_SIZE)
/// cannot be reached through the CLI on this kernel; drive it directly.
#[test]
fn the_legacy_bind_path_sets_the_sector_size() {
    needs_root!();
    let fx = Fixture::new();
    let path = fx.backing("legacy");
    fx.sparse_file(&path);
    let backing = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    let mut info = LoopInfo64::default();
    info.set_file_name("sparse-volume:legacy-test");
    // Another test may take the free device first: ask again.
    let device = (0..20)
        .find_map(|_| {
            let free = tool("losetup", &["-f"]);
            let number: u32 = free.trim().trim_start_matches("/dev/loop").parse().ok()?;
            let device = LoopDevice::open(number, true).ok()?.lock().ok()?;
            device.set_fd_then_status(&backing, &info, 4096).ok()?;
            Some(device)
        })
        .expect("no loop device could be bound");
    let name = device.path().display().to_string();
    let size = getss(&name);
    let _ = device.clear();
    drop(device);
    release_loops_of(&path);
    assert_eq!(size, 4096, "LOOP_SET_BLOCK_SIZE did not apply to {name}");
}
