//! Shared fixtures for the integration tests: a private registry root
//! (`SPARSE_VOLUME_ROOT`), real backing files made with the real tools
//! (`mkfs.ext4`, `mkfs.xfs`, `sgdisk`), and an independent view of the
//! loop devices through `losetup`, so the tests never check our code with
//! our own code.

#![allow(dead_code)]

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub const SIZE: u64 = 64 << 20;
/// mkfs.xfs refuses file systems below 300 MB; sparse, so it costs nothing.
pub const XFS_SIZE: u64 = 320 << 20;

pub struct Fixture {
    pub root: tempfile::TempDir,
}

pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl From<Output> for Run {
    fn from(output: Output) -> Self {
        Self {
            code: output.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }
}

impl Run {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.stdout))
    }
}

pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// The first line of a test that needs root (real loop devices, mounts,
/// device nodes, the CLI's state-changing commands): without root it says
/// so and returns, so that the tier without root (tests/run runs every test
/// binary as an unprivileged user too) runs what it can.
#[macro_export]
macro_rules! needs_root {
    () => {
        if !$crate::common::is_root() {
            eprintln!(
                "skipped: needs root (real loop devices, mkfs, mount, the CLI's state-changing commands); tests/run runs it as root"
            );
            return;
        }
    };
}

/// The Python of the tests' venv (pinned independent parsers and
/// validators, tests/python-requirements.txt), which tests/run creates.
pub fn test_python() -> String {
    std::env::var("SV_TEST_PYTHON").unwrap_or_else(|_| {
        panic!("SV_TEST_PYTHON is not set: run the tests through tests/run, which makes the venv of tests/python-requirements.txt")
    })
}

/// Whether this process holds CAP_SYS_RESOURCE, which online ext4 growth
/// needs and root in a container (these CI machines among them) may lack.
pub fn has_cap_sys_resource() -> bool {
    use sparse_volume::kernel::capabilities::{has_effective, CAP_SYS_RESOURCE};
    has_effective(CAP_SYS_RESOURCE)
}

pub fn new_uuid() -> String {
    uuid::Uuid::new_v4().hyphenated().to_string()
}

fn check(output: Output, what: &str) {
    assert!(
        output.status.success(),
        "{what} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

pub fn tool(program: &str, args: &[&str]) -> String {
    let output = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {program}: {e}"));
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    check(output, program);
    stdout
}

impl Fixture {
    pub fn new() -> Self {
        let root = tempfile::Builder::new()
            .prefix("sv-test-")
            .tempdir()
            .expect("temporary root");
        let fixture = Self { root };
        fs::create_dir_all(fixture.host("/etc/sparse-volume/volumes.d")).unwrap();
        fs::create_dir_all(fixture.host("/var/lib/sparse-volume")).unwrap();
        fixture
    }

    /// Where a logical path lives inside this fixture.
    pub fn host(&self, logical: &str) -> PathBuf {
        self.root.path().join(logical.trim_start_matches('/'))
    }

    pub fn logical_backing(&self, uuid: &str) -> String {
        format!("/var/lib/sparse-volume/{uuid}")
    }

    pub fn backing(&self, uuid: &str) -> PathBuf {
        self.host(&self.logical_backing(uuid))
    }

    pub fn sparse_file(&self, path: &Path) {
        self.sparse_file_of(path, SIZE);
    }

    pub fn sparse_file_of(&self, path: &Path, size: u64) {
        let file = fs::File::create(path).unwrap();
        file.set_len(size).unwrap();
        fs::set_permissions(path, fs::Permissions::from_mode(0o600)).unwrap();
    }

    pub fn make_ext4(&self, uuid: &str) -> PathBuf {
        let path = self.backing(uuid);
        self.sparse_file(&path);
        tool(
            "mkfs.ext4",
            &["-q", "-F", "-U", uuid, path.to_str().unwrap()],
        );
        path
    }

    pub fn make_xfs(&self, uuid: &str) -> PathBuf {
        let path = self.backing(uuid);
        self.sparse_file_of(&path, XFS_SIZE);
        tool(
            "mkfs.xfs",
            &[
                "-q",
                "-f",
                "-m",
                &format!("uuid={uuid}"),
                path.to_str().unwrap(),
            ],
        );
        path
    }

    /// A GPT with one partition whose unique GUID is `uuid`, as an
    /// operator (or the provisioning code) would make it.
    pub fn make_gpt(&self, uuid: &str) -> PathBuf {
        let path = self.backing(uuid);
        self.sparse_file(&path);
        tool(
            "sgdisk",
            &[
                "-n",
                "1:0:0",
                "-u",
                &format!("1:{uuid}"),
                path.to_str().unwrap(),
            ],
        );
        path
    }

    /// Registers the volume with the size its backing file has.
    pub fn register(&self, uuid: &str, mode: &str, extra: &str) {
        let size = fs::metadata(self.backing(uuid)).map_or(SIZE, |m| m.len());
        let text = format!(
            "uuid = \"{uuid}\"\npath = \"{}\"\nsize = {size}\nmode = \"{mode}\"\n{extra}",
            self.logical_backing(uuid)
        );
        fs::write(self.registry_file(uuid), text).unwrap();
    }

    pub fn registry_file(&self, uuid: &str) -> PathBuf {
        self.host(&format!("/etc/sparse-volume/volumes.d/{uuid}.toml"))
    }

    pub fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_sparse-volume"));
        command
            .args(args)
            .env("SPARSE_VOLUME_ROOT", self.root.path())
            .env_remove("JOURNAL_STREAM")
            // Never the host's systemd: a test that wants a bus (a private
            // dbus-daemon) sets this again after calling `command`.
            .env("DBUS_SYSTEM_BUS_ADDRESS", self.absent_bus());
        command
    }

    /// A system bus address where no bus listens, so the CLI takes its
    /// "no systemd" paths however the host is set up.
    pub fn absent_bus(&self) -> String {
        format!("unix:path={}", self.root.path().join("no-bus").display())
    }

    pub fn run(&self, args: &[&str]) -> Run {
        self.command(args)
            .output()
            .expect("running sparse-volume")
            .into()
    }

    /// The CLI with `args` and the fixture's environment, run by `wrapper`
    /// (`timeout`, `strace`, a shell): `wrapper… sparse-volume args…`.
    pub fn wrapped(&self, wrapper: &[&str], args: &[&str]) -> Command {
        let cli = self.command(args);
        let mut wrapped = Command::new(wrapper[0]);
        wrapped
            .args(&wrapper[1..])
            .arg(cli.get_program())
            .args(cli.get_args())
            .envs(cli.get_envs().filter_map(|(k, v)| Some((k, v?))))
            .env_remove("JOURNAL_STREAM");
        wrapped
    }

    /// [`Fixture::run`] killed after `seconds`: for what must not hang
    /// (a hang shows as code 124, timeout's own).
    pub fn run_within(&self, seconds: u32, args: &[&str]) -> Run {
        self.wrapped(&["timeout", "--kill-after=5", &seconds.to_string()], args)
            .output()
            .expect("running timeout")
            .into()
    }

    /// The CLI as an unprivileged user (nobody), without a bus.
    pub fn run_as_nobody(&self, args: &[&str]) -> Run {
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(env!("CARGO_BIN_EXE_sparse-volume"))
            .args(args)
            .env("SPARSE_VOLUME_ROOT", self.root.path())
            .env("DBUS_SYSTEM_BUS_ADDRESS", self.absent_bus())
            .env_remove("JOURNAL_STREAM")
            .output()
            .expect("running setpriv")
            .into()
    }

    /// Makes the fixture's directories readable by everyone, like /etc and
    /// /var/lib are on a real system (the data files stay 0600).
    pub fn open_directories_to_everyone(&self) {
        for dir in [
            "",
            "/etc",
            "/etc/sparse-volume",
            "/etc/sparse-volume/volumes.d",
            "/var",
            "/var/lib",
            "/var/lib/sparse-volume",
        ] {
            fs::set_permissions(self.host(dir), fs::Permissions::from_mode(0o755)).unwrap();
        }
    }

    pub fn run_ok(&self, args: &[&str]) -> Run {
        let run = self.run(args);
        assert_eq!(run.code, 0, "sparse-volume {args:?} failed: {}", run.stderr);
        run
    }
}

/// Loop devices backing `path`, as `losetup` (util-linux) sees them.
pub fn loops_of(path: &Path) -> Vec<String> {
    tool(
        "losetup",
        &[
            "--noheadings",
            "--output",
            "NAME",
            "-j",
            path.to_str().unwrap(),
        ],
    )
    .lines()
    .map(|l| l.trim().to_string())
    .filter(|l| !l.is_empty())
    .collect()
}

pub fn sysfs_flag(device: &str, attribute: &str) -> String {
    let name = device.trim_start_matches("/dev/");
    fs::read_to_string(format!("/sys/block/{name}/{attribute}"))
        .unwrap_or_else(|e| panic!("reading {attribute} of {device}: {e}"))
        .trim()
        .to_string()
}

impl Drop for Fixture {
    /// Never leak loop devices into the next test or the CI machine: every
    /// device whose backing file lies anywhere under this fixture (at any
    /// depth, also when the file was deleted), as the kernel reports it.
    fn drop(&mut self) {
        let prefix = self.root.path().to_string_lossy().into_owned() + "/";
        let Ok(listing) = fs::read_dir("/sys/block") else {
            return;
        };
        for entry in listing.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Ok(backing) = fs::read_to_string(entry.path().join("loop/backing_file")) else {
                continue;
            };
            if !backing.starts_with(&prefix) {
                continue;
            }
            let device = format!("/dev/{name}");
            let _ = Command::new("umount").arg(&device).output();
            let _ = Command::new("losetup").args(["-d", &device]).output();
        }
    }
}

/// A small ext4 file system mounted over the fixture's storage root, so
/// that free space is known, small and changes only when a test writes
/// to it. Borrows the fixture so that it is unmounted before the fixture
/// goes away.
pub struct MountedStorage<'a> {
    _fixture: &'a Fixture,
    pub mount_point: PathBuf,
}

impl Fixture {
    /// Mounts a fresh `size`-byte ext4 image (no root reserve, inode
    /// tables and journal written at mkfs time so that no background
    /// initialisation moves the free-space numbers) over the storage root.
    pub fn mount_storage(&self, size: u64) -> MountedStorage<'_> {
        self.mount_storage_made_by(
            size,
            &[
                "mkfs.ext4",
                "-q",
                "-F",
                "-m",
                "0",
                "-E",
                "lazy_itable_init=0,lazy_journal_init=0",
            ],
        )
    }

    /// [`Fixture::mount_storage`] with a file system that shares extents
    /// (reflink): `xfs` or `btrfs`.
    pub fn mount_reflink_storage(&self, size: u64, fs_type: &str) -> MountedStorage<'_> {
        match fs_type {
            "xfs" => self.mount_storage_made_by(size, &["mkfs.xfs", "-q", "-f", "-m", "reflink=1"]),
            "btrfs" => self.mount_storage_made_by(size, &["mkfs.btrfs", "-q", "-f"]),
            other => panic!("{other} does not share extents here"),
        }
    }

    /// The storage root on a fresh `size`-byte image made by `mkfs` (the
    /// program and its options; the image is the last argument).
    fn mount_storage_made_by(&self, size: u64, mkfs: &[&str]) -> MountedStorage<'_> {
        let images = self.host("/images");
        fs::create_dir_all(&images).unwrap();
        let image = images.join("storage.img");
        self.sparse_file_of(&image, size);
        tool(mkfs[0], &[&mkfs[1..], &[image.to_str().unwrap()]].concat());
        let mount_point = self.host("/var/lib/sparse-volume");
        // util-linux sets autoclear on the loop device it makes here, so
        // the unmount releases it.
        tool(
            "mount",
            &[
                "-o",
                "loop",
                image.to_str().unwrap(),
                mount_point.to_str().unwrap(),
            ],
        );
        fs::set_permissions(&mount_point, fs::Permissions::from_mode(0o755)).unwrap();
        MountedStorage {
            _fixture: self,
            mount_point,
        }
    }
}

/// `(available to unprivileged writers, total)` bytes of the file system
/// holding `path`, straight from statvfs(2).
pub fn free_and_total(path: &Path) -> (u64, u64) {
    let stats = nix::sys::statvfs::statvfs(path)
        .unwrap_or_else(|e| panic!("statvfs {}: {e}", path.display()));
    let fragment = stats.fragment_size();
    (
        stats.blocks_available() * fragment,
        stats.blocks() * fragment,
    )
}

impl MountedStorage<'_> {
    pub fn free(&self) -> u64 {
        free_and_total(&self.mount_point).0
    }

    pub fn total(&self) -> u64 {
        free_and_total(&self.mount_point).1
    }
}

impl Drop for MountedStorage<'_> {
    /// A loop device on a file in here keeps the file system busy.
    fn drop(&mut self) {
        if let Ok(listing) = fs::read_dir(&self.mount_point) {
            for entry in listing.flatten() {
                for device in loops_of_quiet(&entry.path()) {
                    let _ = Command::new("umount").arg(&device).output();
                    let _ = Command::new("losetup").args(["-d", &device]).output();
                }
            }
        }
        let unmounted = Command::new("umount")
            .arg(&self.mount_point)
            .status()
            .is_ok_and(|s| s.success());
        if !unmounted {
            // Never leave a mount behind in the temporary directory.
            let _ = Command::new("umount")
                .arg("-l")
                .arg(&self.mount_point)
                .status();
        }
    }
}

/// Like [`loops_of`], for clean-up paths that must not panic.
fn loops_of_quiet(path: &Path) -> Vec<String> {
    Command::new("losetup")
        .args(["--noheadings", "--output", "NAME", "-j"])
        .arg(path)
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// splitmix64: tiny, seedable, good enough to pick operations and delays.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The size of the ext4 in `path` (a backing file), as dumpe2fs reads it.
pub fn ext4_bytes(path: &Path) -> u64 {
    let text = tool("dumpe2fs", &["-h", path.to_str().expect("UTF-8 path")]);
    let field = |name: &str| -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .unwrap_or_else(|| panic!("dumpe2fs shows no {name}"))
            .trim()
            .parse()
            .expect("a number")
    };
    field("Block count:") * field("Block size:")
}

/// A command stopped at one of its stop points (`SPARSE_VOLUME_STOP_AT`),
/// for a test to act in the window and then let it go on. Killed if the
/// test fails first, so no stopped process keeps a lock.
pub struct Stopped {
    child: Option<std::process::Child>,
}

impl Fixture {
    /// Starts `args` and returns once it has stopped itself at `point`.
    pub fn run_until(&self, point: sparse_volume::hooks::Stop, args: &[&str]) -> Stopped {
        Stopped::start(self.command(args), point)
    }
}

/// A process's state letter (`R`, `S`, `T` stopped, `Z` ended but not
/// reaped, ...), which follows its command name in `/proc/PID/stat`; None
/// once it is gone.
fn process_state(pid: u32) -> Option<char> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(") ")?.1.chars().next()
}

/// Waits until `pid` has ended or sleeps in `flock` (waiting for a lock
/// somebody holds); true when it sleeps there.
pub fn ends_or_waits_for_a_lock(pid: u32) -> bool {
    // /proc/PID/syscall starts with the number of the call a sleeping
    // process is in.
    let flock = nix::libc::SYS_flock.to_string();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        match fs::read_to_string(format!("/proc/{pid}/syscall")) {
            Err(_) => return false,
            Ok(text) if text.split(' ').next() == Some(flock.as_str()) => return true,
            Ok(_) => {}
        }
        if process_state(pid) == Some('Z') {
            return false;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "process {pid} neither ended nor waited for a lock"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

impl Stopped {
    /// Starts `command` and returns once it has stopped itself at `point`.
    pub fn start(mut command: Command, point: sparse_volume::hooks::Stop) -> Self {
        let child = command
            .env(sparse_volume::hooks::STOP_ENV, point.name())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("starting sparse-volume");
        let stopped = Self { child: Some(child) };
        stopped.wait_until_stopped();
        stopped
    }

    fn id(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    fn pid(&self) -> nix::unistd::Pid {
        nix::unistd::Pid::from_raw(self.id() as i32)
    }

    fn wait_until_stopped(&self) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while process_state(self.id()) != Some('T') {
            assert!(
                std::time::Instant::now() < deadline,
                "the process never reached its stop point: {:?}",
                process_state(self.id())
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }

    /// Lets it go on and waits for its end (a test fails, not hangs, when
    /// the process stops again or never ends).
    pub fn resume(mut self) -> Run {
        nix::sys::signal::kill(self.pid(), nix::sys::signal::Signal::SIGCONT).expect("SIGCONT");
        let pid = self.id();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        let child = self.child.as_mut().expect("running");
        while child.try_wait().expect("waiting").is_none() {
            let state = process_state(pid);
            assert!(state != Some('T'), "stopped again after SIGCONT");
            assert!(
                std::time::Instant::now() < deadline,
                "never ended: {state:?}"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        self.child
            .take()
            .expect("running")
            .wait_with_output()
            .expect("reaping sparse-volume")
            .into()
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Binds `file` to a free loop device with `losetup` (as an operator
/// would by hand); returns the device.
pub fn bound_by_hand(file: &Path, extra: &[&str]) -> String {
    let mut args = vec!["--find", "--show"];
    args.extend_from_slice(extra);
    args.push(file.to_str().unwrap());
    tool("losetup", &args).trim().to_string()
}

/// Detaches a loop device a test bound when dropped, passed or failed,
/// if it still holds the file it held when this was made: tests run in
/// parallel, and a device the test detached itself may hold another
/// test's file by then.
pub struct DetachOnDrop {
    device: String,
    backing: Option<String>,
}

impl DetachOnDrop {
    pub fn new(device: String) -> Self {
        let backing = backing_file_of(&device);
        Self { device, backing }
    }

    pub fn device(&self) -> &str {
        &self.device
    }
}

fn backing_file_of(device: &str) -> Option<String> {
    let name = device.trim_start_matches("/dev/");
    fs::read_to_string(format!("/sys/block/{name}/loop/backing_file")).ok()
}

impl Drop for DetachOnDrop {
    fn drop(&mut self) {
        if self.backing.is_some() && backing_file_of(&self.device) == self.backing {
            let _ = Command::new("losetup").args(["-d", &self.device]).status();
        }
    }
}

/// A mount made by a test under the fixture's `/mnt`, unmounted however
/// the test ends.
pub struct Mounted(pub PathBuf);

impl Mounted {
    /// Mounts `device` with mount(8)'s `options` (`-t xfs`, `-o ...`), or
    /// returns mount's complaint.
    pub fn new(fx: &Fixture, device: &str, options: &[&str]) -> Result<Self, String> {
        let point = fx.host(&format!("/mnt/{}", device.trim_start_matches("/dev/")));
        fs::create_dir_all(&point).unwrap();
        let output = Command::new("mount")
            .args(options)
            .arg(device)
            .arg(&point)
            .output()
            .unwrap();
        if !output.status.success() {
            return Err(String::from_utf8_lossy(&output.stderr).into_owned());
        }
        Ok(Self(point))
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).output();
    }
}
