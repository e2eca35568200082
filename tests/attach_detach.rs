//! attach/detach against real loop devices, real mkfs and sgdisk (root).

mod common;

use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::sync::Arc;

use common::{bound_by_hand, loops_of, new_uuid, sysfs_flag, tool, Fixture};

/// A registered ext4 volume, attached: (uuid, backing file, device).
fn attached_ext4(fx: &Fixture) -> (String, std::path::PathBuf, String) {
    let uuid = new_uuid();
    let file = fx.make_ext4(&uuid);
    fx.register(&uuid, "filesystem", "");
    let attached = fx.run_ok(&["attach", &uuid, "--json"]).json();
    let device = attached["device"].as_str().unwrap().to_string();
    (uuid, file, device)
}

#[test]
fn filesystem_volume_attaches_once_and_detaches() {
    needs_root!();
    let fx = Fixture::new();
    let uuid = new_uuid();
    let file = fx.make_ext4(&uuid);
    fx.register(&uuid, "filesystem", "");

    let first = fx.run_ok(&["attach", &uuid, "--json"]).json();
    assert_eq!(first["changed"], true);
    assert_eq!(first["uuid"], uuid.as_str());
    let device = first["device"].as_str().unwrap().to_string();
    assert_eq!(loops_of(&file), vec![device.clone()]);
    // The device really carries the volume (blkid reads it independently).
    let probed = tool("blkid", &["-p", "-o", "value", "-s", "UUID", &device]);
    assert_eq!(probed.trim(), uuid);
    assert_eq!(
        sysfs_flag(&device, "loop/partscan"),
        "0",
        "filesystem mode must not scan partitions"
    );
    let reference = tool(
        "losetup",
        &["--noheadings", "--raw", "-O", "BACK-FILE", &device],
    );
    assert!(
        reference.contains(&uuid),
        "backing file not reported: {reference}"
    );

    let again = fx.run_ok(&["attach", &uuid, "--json"]).json();
    assert_eq!(again["changed"], false);
    assert_eq!(again["device"], device.as_str());
    assert_eq!(loops_of(&file).len(), 1);

    let detached = fx.run_ok(&["detach", &uuid, "--json"]).json();
    assert_eq!(detached["changed"], true);
    assert_eq!(detached["devices"][0], device.as_str());
    assert!(loops_of(&file).is_empty());

    let repeated = fx.run_ok(&["detach", &uuid, "--json"]).json();
    assert_eq!(repeated["changed"], false);
    assert_eq!(repeated["uuid"], uuid.as_str());
}

#[test]
fn xfs_volume_is_verified_and_attached() {
    needs_root!();
    let fx = Fixture::new();
    let uuid = new_uuid();
    let file = fx.make_xfs(&uuid);
    fx.register(&uuid, "filesystem", "fs_type = \"xfs\"\n");
    let attached = fx.run_ok(&["attach", &uuid, "--json"]).json();
    let device = attached["device"].as_str().unwrap();
    assert_eq!(
        tool("blkid", &["-p", "-o", "value", "-s", "TYPE", device]).trim(),
        "xfs"
    );
    fx.run_ok(&["detach", &uuid]);
    assert!(loops_of(&file).is_empty());
}

#[test]
fn sixteen_concurrent_attaches_make_one_device() {
    needs_root!();
    let fx = Arc::new(Fixture::new());
    let uuid = Arc::new(new_uuid());
    let file = fx.make_ext4(&uuid);
    fx.register(&uuid, "filesystem", "");

    let children: Vec<_> = (0..16)
        .map(|_| fx.command(&["attach", &uuid, "--json"]).spawn_piped())
        .collect();
    let reports: Vec<serde_json::Value> = children
        .into_iter()
        .map(|child| {
            let output = child.wait_with_output().unwrap();
            assert!(
                output.status.success(),
                "{}",
                String::from_utf8_lossy(&output.stderr)
            );
            serde_json::from_slice(&output.stdout).unwrap()
        })
        .collect();

    let devices = loops_of(&file);
    assert_eq!(
        devices.len(),
        1,
        "one file, several loop devices: {devices:?}"
    );
    assert!(reports.iter().all(|r| r["device"] == devices[0].as_str()));
    assert_eq!(reports.iter().filter(|r| r["changed"] == true).count(), 1);
    fx.run_ok(&["detach", &uuid]);
    assert!(loops_of(&file).is_empty());
}

trait SpawnPiped {
    fn spawn_piped(&mut self) -> std::process::Child;
}

impl SpawnPiped for std::process::Command {
    fn spawn_piped(&mut self) -> std::process::Child {
        self.stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    }
}

#[test]
fn block_volume_scans_partitions_and_detaches_without_registry() {
    needs_root!();
    let fx = Fixture::new();
    let uuid = new_uuid();
    let file = fx.make_gpt(&uuid);
    fx.register(&uuid, "block", "");

    let run = fx.run_ok(&["attach", &uuid, "--json"]);
    let attached = run.json();
    let device = attached["device"].as_str().unwrap().to_string();
    // What the kernel made, not a name built from the device's: a kernel
    // without GPT support (this CI host) makes no partition device.
    let partition = format!("{device}p1");
    let no_partition = "the kernel made no partition device";
    if std::path::Path::new(&partition).exists() {
        assert_eq!(attached["partition"], partition.as_str());
        assert!(!run.stderr.contains(no_partition), "{}", run.stderr);
    } else {
        assert_eq!(attached["partition"], serde_json::Value::Null);
        assert!(
            attached["warnings"]
                .as_array()
                .unwrap()
                .iter()
                .any(|w| w.as_str().unwrap().contains(no_partition)),
            "no warning about the missing partition: {attached}"
        );
        assert!(run.stderr.contains(no_partition), "{}", run.stderr);
    }
    assert_eq!(
        attached["link"],
        format!("/dev/disk/by-partuuid/{uuid}").as_str()
    );
    assert_eq!(sysfs_flag(&device, "loop/partscan"), "1");
    // The GPT read back through the loop device names the volume, in the
    // byte order udev uses for by-partuuid.
    let info = tool("sgdisk", &["-i", "1", &device]);
    assert!(
        info.contains(&format!("Partition unique GUID: {}", uuid.to_uppercase())),
        "{info}"
    );

    fs::remove_file(fx.registry_file(&uuid)).unwrap();
    let detached = fx.run_ok(&["detach", &uuid, "--json"]).json();
    assert_eq!(detached["changed"], true);
    assert_eq!(detached["found_by"], "backing-file");
    assert!(loops_of(&file).is_empty());
}

#[test]
fn detach_finds_the_device_by_reference_when_the_file_is_gone() {
    needs_root!();
    let fx = Fixture::new();
    let (uuid, file, device) = attached_ext4(&fx);

    // Registry entry and backing file both gone (the inode lives on while
    // the loop device holds it).
    fs::remove_file(fx.registry_file(&uuid)).unwrap();
    fs::remove_file(&file).unwrap();
    let detached = fx.run_ok(&["detach", &uuid, "--json"]).json();
    assert_eq!(detached["found_by"], "reference");
    assert_eq!(detached["devices"][0], device.as_str());
    // By backing file, not by number: other tests may reuse the number at once.
    let status = tool(
        "losetup",
        &["--list", "--noheadings", "-O", "NAME,BACK-FILE"],
    );
    assert!(
        !status.contains(&uuid),
        "the deleted backing file is still attached: {status}"
    );
}

#[test]
fn read_only_volume_gets_a_read_only_device() {
    needs_root!();
    let fx = Fixture::new();
    let uuid = new_uuid();
    let file = fx.make_ext4(&uuid);
    fx.register(&uuid, "filesystem", "read_only = true\n");
    let attached = fx.run_ok(&["attach", &uuid, "--json"]).json();
    assert_eq!(attached["read_only"], true);
    assert_eq!(sysfs_flag(attached["device"].as_str().unwrap(), "ro"), "1");

    // Made read-write while attached: its own read-only device is still
    // the volume's (the flag takes effect at the next attach), not a
    // device bound by hand to refuse.
    fx.run_ok(&["apply", "--uuid", &uuid, "--read-only", "false"]);
    let again = fx.run_ok(&["attach", &uuid, "--json"]).json();
    assert_eq!(again["device"], attached["device"]);
    assert!(
        again["warnings"].to_string().contains("stop and start"),
        "{again}"
    );
    fx.run_ok(&["detach", &uuid]);
    assert!(loops_of(&file).is_empty());
}

/// Every refusal: exit 1, one line on stderr naming the volume and the
/// cause, and no loop device for the file.
fn assert_refused(fx: &Fixture, uuid: &str, cause: &str, file: &std::path::Path) {
    let run = fx.run(&["attach", uuid]);
    assert_eq!(run.code, 1, "attach should fail: {}", run.stderr);
    assert_eq!(
        run.stderr.lines().count(),
        1,
        "not one line: {}",
        run.stderr
    );
    assert!(
        run.stderr.contains(uuid),
        "volume not named: {}",
        run.stderr
    );
    assert!(
        run.stderr.contains(cause),
        "cause '{cause}' missing: {}",
        run.stderr
    );
    assert!(loops_of(file).is_empty(), "a loop device was left behind");
}

#[test]
fn attach_refuses_an_unregistered_volume() {
    needs_root!();
    let fx = Fixture::new();
    let uuid = new_uuid();
    let file = fx.make_ext4(&uuid);
    assert_refused(&fx, &uuid, "is not registered", &file);
}

#[test]
fn attach_refuses_a_symlinked_backing_file() {
    needs_root!();
    let fx = Fixture::new();
    let uuid = new_uuid();
    let real = fx.host("/var/lib/sparse-volume/real-file");
    fx.sparse_file(&real);
    tool(
        "mkfs.ext4",
        &["-q", "-F", "-U", &uuid, real.to_str().unwrap()],
    );
    symlink(&real, fx.backing(&uuid)).unwrap();
    fx.register(&uuid, "filesystem", "");
    assert_refused(&fx, &uuid, "is a symbolic link", &real);
}

#[test]
fn attach_refuses_a_world_writable_backing_file() {
    needs_root!();
    let fx = Fixture::new();
    let uuid = new_uuid();
    let file = fx.make_ext4(&uuid);
    fs::set_permissions(&file, fs::Permissions::from_mode(0o666)).unwrap();
    fx.register(&uuid, "filesystem", "");
    assert_refused(&fx, &uuid, "writable by group or others", &file);
}

#[test]
fn attach_refuses_content_with_another_uuid() {
    needs_root!();
    let fx = Fixture::new();
    let uuid = new_uuid();
    let file = fx.backing(&uuid);
    fx.sparse_file(&file);
    tool(
        "mkfs.ext4",
        &["-q", "-F", "-U", &new_uuid(), file.to_str().unwrap()],
    );
    fx.register(&uuid, "filesystem", "");
    assert_refused(&fx, &uuid, "not an ext4 file system with UUID", &file);

    let block = new_uuid();
    let gpt = fx.backing(&block);
    fx.sparse_file(&gpt);
    tool(
        "sgdisk",
        &[
            "-n",
            "1:0:0",
            "-u",
            &format!("1:{}", new_uuid()),
            gpt.to_str().unwrap(),
        ],
    );
    fx.register(&block, "block", "");
    assert_refused(&fx, &block, "not a GPT whose partition 1 has GUID", &gpt);

    // Right UUID, wrong file system type.
    let typed = new_uuid();
    let xfs = fx.make_xfs(&typed);
    fx.register(&typed, "filesystem", "fs_type = \"ext4\"\n");
    assert_refused(&fx, &typed, "holds an xfs file system", &xfs);
}

#[test]
fn detach_refuses_a_mounted_device_and_then_succeeds() {
    needs_root!();
    let fx = Fixture::new();
    let (uuid, file, device) = attached_ext4(&fx);
    let mountpoint = fx.host("/mnt");
    fs::create_dir_all(&mountpoint).unwrap();
    tool("mount", &[&device, mountpoint.to_str().unwrap()]);

    let refused = fx.run(&["detach", &uuid]);
    tool("umount", &[mountpoint.to_str().unwrap()]);
    assert_eq!(refused.code, 1);
    assert!(refused.stderr.contains(&uuid), "{}", refused.stderr);
    assert!(
        refused.stderr.contains("is mounted on"),
        "{}",
        refused.stderr
    );
    assert_eq!(loops_of(&file), vec![device]);

    fx.run_ok(&["detach", &uuid]);
    assert!(loops_of(&file).is_empty());
}

#[test]
fn detach_reports_a_device_the_kernel_releases_later() {
    needs_root!();
    let fx = Fixture::new();
    let (uuid, file, device) = attached_ext4(&fx);

    let holder = fs::File::open(&device).unwrap();
    let deferred = fx.run(&["detach", &uuid]);
    assert_eq!(
        deferred.code, 1,
        "a device still open was reported detached"
    );
    assert!(
        deferred.stderr.contains("still open by another program"),
        "{}",
        deferred.stderr
    );
    drop(holder);
    // Our LOOP_CLR_FD set autoclear: the last close released it.
    assert!(loops_of(&file).is_empty());
}

#[test]
fn usage_errors_exit_with_status_two() {
    let fx = Fixture::new();
    for args in [
        &["attach"][..],
        // Anything else is a name, but an empty one names nothing.
        &["attach", ""],
        // A UUID in braces: a mistake, not a name (upper case is fine).
        &["detach", "{6f1c2a8e-3b4d-4e5f-8a9b-0c1d2e3f4a5b}"],
        &["frobnicate"],
    ] {
        let run = fx.run(args);
        assert_eq!(run.code, 2, "{args:?}: {}", run.stderr);
    }
}

/// Makes attach believe udev runs (its control socket, looked up below the
/// test root) and wait at most one second for a link that, on a host
/// without udev, never comes.
fn pretend_udev_runs(fx: &Fixture) {
    let control = fx.host("/run/udev/control");
    fs::create_dir_all(control.parent().unwrap()).unwrap();
    fs::write(&control, "").unwrap();
    fs::write(
        fx.host("/etc/sparse-volume/config.toml"),
        "udev_timeout_sec = 1\n",
    )
    .unwrap();
}

#[test]
fn a_failed_attach_releases_the_device_it_bound() {
    needs_root!();
    let fx = Fixture::new();
    for (uuid, mode) in [(new_uuid(), "filesystem"), (new_uuid(), "block")] {
        let file = if mode == "block" {
            fx.make_gpt(&uuid)
        } else {
            fx.make_ext4(&uuid)
        };
        fx.register(&uuid, mode, "");
        pretend_udev_runs(&fx);

        let run = fx.run(&["attach", &uuid, "--json"]);
        assert_eq!(run.code, 1, "{mode}: attach should fail: {}", run.stderr);
        assert_eq!(run.stderr.lines().count(), 1, "{}", run.stderr);
        assert!(run.stderr.contains("udev did not point"), "{}", run.stderr);
        assert!(
            run.stderr.contains("again, which this attach had bound"),
            "the release is not reported: {}",
            run.stderr
        );
        assert_eq!(run.json()["changed"], false);
        // losetup's view, not ours: nothing is left bound to the file.
        assert!(
            loops_of(&file).is_empty(),
            "{mode}: a failed attach left {:?} bound",
            loops_of(&file)
        );
    }
}

#[test]
fn a_failed_attach_keeps_a_device_it_did_not_bind() {
    needs_root!();
    let fx = Fixture::new();
    let (uuid, file, device) = attached_ext4(&fx);
    pretend_udev_runs(&fx);

    let run = fx.run(&["attach", &uuid]);
    assert_eq!(run.code, 1, "attach should fail: {}", run.stderr);
    assert!(
        run.stderr.contains(&format!(
            "{device} was attached before this call and stays attached"
        )),
        "{}",
        run.stderr
    );
    assert_eq!(loops_of(&file), vec![device]);
    fs::remove_file(fx.host("/run/udev/control")).unwrap();
    fx.run_ok(&["detach", &uuid]);
    assert!(loops_of(&file).is_empty());
}

/// Issue 24 item 13: attach cancels a pending detach to adopt the device;
/// when the attach then failed, the detach stayed cancelled, so a device
/// that was to go at its holder's close stayed bound for good.
#[test]
fn a_failed_attach_restores_the_pending_detach_it_cancelled() {
    needs_root!();
    let fx = Fixture::new();
    let (uuid, file, device) = attached_ext4(&fx);
    let holder = fs::File::open(&device).unwrap();
    let pending = fx.run(&["detach", &uuid]);
    assert!(pending.stderr.contains("still open"), "{}", pending.stderr);
    assert_eq!(sysfs_flag(&device, "loop/autoclear"), "1");
    pretend_udev_runs(&fx);

    let run = fx.run(&["attach", &uuid]);
    assert_eq!(run.code, 1, "attach should fail: {}", run.stderr);
    assert_eq!(run.stderr.lines().count(), 1, "{}", run.stderr);
    assert!(run.stderr.contains("pending detach"), "{}", run.stderr);
    assert_eq!(
        sysfs_flag(&device, "loop/autoclear"),
        "1",
        "the detach stays cancelled"
    );
    drop(holder);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !loops_of(&file).is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(
        loops_of(&file).is_empty(),
        "not released at the holder's close"
    );
}

/// systemd stops a start that takes too long (TimeoutStartSec=) with
/// SIGTERM: attach must release the device it bound, as after any other
/// failure, since the unit has no ExecStopPost= to do it.
#[test]
fn a_stopped_attach_releases_the_device_it_bound() {
    needs_root!();
    let fx = Fixture::new();
    let uuid = new_uuid();
    let file = fx.make_ext4(&uuid);
    fx.register(&uuid, "filesystem", "");
    pretend_udev_runs(&fx);
    // Long enough that only the SIGTERM can end the wait.
    fs::write(
        fx.host("/etc/sparse-volume/config.toml"),
        "udev_timeout_sec = 600\n",
    )
    .unwrap();
    let child = fx
        .command(&["attach", &uuid])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("starting attach");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while loops_of(&file).is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "attach never bound a device"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // Bound, so the stop request is caught (it is from before binding).
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
    let output = child.wait_with_output().expect("reaping attach");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("stopped"), "{stderr}");
    assert!(
        stderr.contains("again, which this attach had bound"),
        "{stderr}"
    );
    assert!(
        loops_of(&file).is_empty(),
        "a stopped attach left {:?} bound",
        loops_of(&file)
    );
}

/// A stop that arrives while attach waits for `/dev/loop-control` (held
/// here as systemd's tools would hold it) ends attach at once, with
/// nothing bound, instead of binding once the lock is free.
#[test]
fn a_stop_while_waiting_for_the_loop_control_lock_binds_nothing() {
    needs_root!();
    let fx = Fixture::new();
    let uuid = new_uuid();
    let file = fx.make_ext4(&uuid);
    fx.register(&uuid, "filesystem", "");
    let control = fs::File::open("/dev/loop-control").expect("opening /dev/loop-control");
    let held = nix::fcntl::Flock::lock(control, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| e)
        .expect("locking /dev/loop-control");
    let mut child = fx
        .command(&["attach", &uuid])
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("starting attach");
    // Wait until attach blocks on the lock (its wait channel says so).
    let wchan = format!("/proc/{}/wchan", child.id());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !fs::read_to_string(&wchan).is_ok_and(|w| w.contains("lock")) {
        assert!(
            std::time::Instant::now() < deadline,
            "attach never blocked on the lock"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
    // Still holding the lock: attach must end without it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().expect("waiting for attach") {
            break status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "attach ignored the stop while waiting for the lock"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    drop(held);
    assert!(!status.success(), "attach reported success after a stop");
    assert!(
        loops_of(&file).is_empty(),
        "a stopped attach bound {:?}",
        loops_of(&file)
    );
}

/// The JSON report of `sparse-volume COMMAND UUID --json` and the
/// `LOOP_GET_STATUS64` calls it made, from strace.
fn status_queries(fx: &Fixture, command: &str, uuid: &str) -> (serde_json::Value, usize) {
    let trace = fx.root.path().join(format!("{uuid}.{command}.strace"));
    let command = fx.command(&[command, uuid, "--json"]);
    let output = std::process::Command::new("strace")
        .args(["-f", "-e", "trace=ioctl", "-o"])
        .arg(&trace)
        .arg(command.get_program())
        .args(command.get_args())
        .envs(
            command
                .get_envs()
                .filter_map(|(key, value)| Some((key, value?))),
        )
        .output()
        .expect("strace runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{} failed: {}",
        command
            .get_args()
            .next()
            .unwrap_or_default()
            .to_string_lossy(),
        String::from_utf8_lossy(&output.stderr)
    );
    let queries = fs::read_to_string(&trace)
        .expect("the trace")
        .matches("LOOP_GET_STATUS64")
        .count();
    (serde_json::from_str(&stdout).expect("JSON"), queries)
}

/// Loop devices bound by hand to `count` small files of their own.
struct Crowd {
    devices: Vec<String>,
}

impl Crowd {
    fn bind(fx: &Fixture, count: usize) -> Self {
        let devices = (0..count)
            .map(|i| {
                let file = fx.root.path().join(format!("crowd-{i}"));
                fx.sparse_file_of(&file, 1 << 20);
                tool("losetup", &["--find", "--show", file.to_str().unwrap()])
                    .trim()
                    .to_string()
            })
            .collect();
        Self { devices }
    }
}

impl Drop for Crowd {
    fn drop(&mut self) {
        for device in &self.devices {
            let _ = std::process::Command::new("losetup")
                .args(["-d", device])
                .status();
        }
    }
}

#[test]
fn attach_asks_no_other_device_when_nothing_else_holds_the_file() {
    needs_root!();
    let fx = Fixture::new();
    let crowd = Crowd::bind(&fx, 48);
    let uuid = new_uuid();
    let file = fx.make_ext4(&uuid);
    fx.register(&uuid, "filesystem", "");

    let (report, queries) = status_queries(&fx, "attach", &uuid);
    assert_eq!(report["changed"], true);
    assert_eq!(loops_of(&file).len(), 1);
    // The bind's own read-backs only, not one per bound device.
    assert!(
        queries < crowd.devices.len(),
        "attach asked {queries} devices for their status with {} others bound",
        crowd.devices.len()
    );

    // Attached now: the file is held by the device, so the devices are
    // asked, and the one holding it is found.
    let (again, _) = status_queries(&fx, "attach", &uuid);
    assert_eq!(again["changed"], false);
    assert_eq!(again["device"], report["device"]);

    // Detach goes to the device attach noted, and the file then held by
    // nothing else needs no look at the others.
    let (detached, queries) = status_queries(&fx, "detach", &uuid);
    assert_eq!(detached["devices"][0], report["device"]);
    assert!(loops_of(&file).is_empty());
    assert!(
        queries < crowd.devices.len(),
        "detach asked {queries} devices for their status with {} others bound",
        crowd.devices.len()
    );
}

#[test]
fn attach_finds_a_device_bound_by_hand_through_a_hard_link() {
    needs_root!();
    let fx = Fixture::new();
    let _crowd = Crowd::bind(&fx, 4);
    let uuid = new_uuid();
    let file = fx.make_ext4(&uuid);
    fx.register(&uuid, "filesystem", "");
    let alias = fx.root.path().join("another-name");
    fs::hard_link(&file, &alias).unwrap();

    for read_only in [false, true] {
        let mut args = vec!["--find", "--show"];
        if read_only {
            args.push("--read-only");
        }
        args.push(alias.to_str().unwrap());
        let by_hand = tool("losetup", &args).trim().to_string();
        if read_only {
            // Found through the link, and refused: it cannot serve a
            // read-write volume (issue 24 item 7).
            let refused = fx.run(&["attach", &uuid]);
            tool("losetup", &["-d", &by_hand]);
            assert_eq!(refused.code, 1, "{}", refused.stdout);
            assert!(
                refused.stderr.contains(&by_hand) && refused.stderr.contains("read-only"),
                "{}",
                refused.stderr
            );
            continue;
        }
        let attached = fx.run_ok(&["attach", &uuid, "--json"]).json();
        assert_eq!(
            attached["device"],
            by_hand.as_str(),
            "attach must use the device bound through the hard link"
        );
        assert_eq!(loops_of(&file), vec![by_hand.clone()]);
        fx.run_ok(&["detach", &uuid]);
        assert!(loops_of(&file).is_empty());
    }
}

/// The devices a detach report lists, sorted.
fn released(report: &serde_json::Value) -> Vec<String> {
    sorted(
        report["devices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_str().unwrap().to_string())
            .collect(),
    )
}

fn sorted(mut devices: Vec<String>) -> Vec<String> {
    devices.sort();
    devices
}

/// A loop device bound to `file` by hand, as an operator would
/// (`extra`: more losetup options, such as `-r`).
#[test]
fn detach_releases_a_second_device_bound_beside_the_noted_one() {
    needs_root!();
    let fx = Fixture::new();
    let (uuid, file, device) = attached_ext4(&fx);
    let alias = fx.root.path().join("second-name");
    fs::hard_link(&file, &alias).unwrap();
    let second = bound_by_hand(&alias, &[]);

    let detached = fx.run_ok(&["detach", &uuid, "--json"]).json();
    assert_eq!(
        released(&detached),
        sorted(vec![device, second]),
        "{detached}"
    );
    assert_eq!(detached["found_by"], "backing-file");
    assert!(loops_of(&file).is_empty());
}

#[test]
fn detach_leaves_alone_a_noted_device_now_bound_to_another_file() {
    needs_root!();
    let fx = Fixture::new();
    let (uuid, file, device) = attached_ext4(&fx);
    // The device goes away behind our back and its number is handed to
    // someone else's file.
    tool("losetup", &["-d", &device]);
    let other = fx.root.path().join("someone-else");
    fx.sparse_file_of(&other, 1 << 20);
    let reused = tool("losetup", &["--show", &device, other.to_str().unwrap()])
        .trim()
        .to_string();
    assert_eq!(reused, device);

    let detached = fx.run_ok(&["detach", &uuid, "--json"]).json();
    assert_eq!(detached["changed"], false, "{detached}");
    assert_eq!(loops_of(&other), vec![device.clone()]);
    assert!(loops_of(&file).is_empty());
    tool("losetup", &["-d", &device]);
}

#[test]
fn detach_releases_a_copy_in_another_storage_root_beside_the_noted_device() {
    needs_root!();
    let fx = Fixture::new();
    fs::create_dir_all(fx.host("/srv/second")).unwrap();
    fs::write(
        fx.host("/etc/sparse-volume/config.toml"),
        "storage_roots = [\"/var/lib/sparse-volume\", \"/srv/second\"]\n",
    )
    .unwrap();
    let (uuid, file, device) = attached_ext4(&fx);
    // A copy of the volume's file where `find_bound` also looks (the
    // default name in another storage root), attached by hand.
    let copy = fx.host(&format!("/srv/second/{uuid}"));
    fs::copy(&file, &copy).unwrap();
    let second = bound_by_hand(&copy, &[]);

    let detached = fx.run_ok(&["detach", &uuid, "--json"]).json();
    assert_eq!(
        released(&detached),
        sorted(vec![device, second]),
        "{detached}"
    );
    assert!(loops_of(&file).is_empty());
    assert!(loops_of(&copy).is_empty());
}

/// The backing file renamed while detach releases the noted device: the
/// second device on the same file must still be found (by the file detach
/// looked at before the release, not by a path looked up again after it).
#[test]
fn detach_releases_a_second_device_when_the_file_is_renamed_meanwhile() {
    needs_root!();
    let fx = Fixture::new();
    let (uuid, file, device) = attached_ext4(&fx);
    let second = bound_by_hand(&file, &["-r"]);
    let stopped = fx.run_until(
        sparse_volume::hooks::Stop::DetachAfterNotedRelease,
        &["detach", &uuid, "--json"],
    );
    let moved = file.with_file_name("renamed-meanwhile");
    fs::rename(&file, &moved).unwrap();
    let detach = stopped.resume();
    assert_eq!(detach.code, 0, "{} {}", detach.stdout, detach.stderr);
    let left = loops_of(&moved);
    for device in &left {
        tool("losetup", &["-d", device]);
    }
    assert!(
        left.is_empty(),
        "{left:?} left bound; detach said {}",
        detach.stdout
    );
    let detached = detach.json();
    assert_eq!(released(&detached), sorted(vec![device, second]));
}

/// Issue 24 item 7: a device bound to the volume's file by hand with an
/// offset, a size limit or read-only (on a read-write volume) does not
/// hold the volume; attach adopted it silently ("changed": false), and a
/// later stop would have detached it.
#[test]
fn attach_refuses_a_device_that_does_not_hold_the_volume_as_registered() {
    needs_root!();
    for (how, losetup_args, says) in [
        ("offset", &["-o", "1048576"][..], "offset 1048576"),
        (
            "size limit",
            &["--sizelimit", "4194304"][..],
            "size limit 4194304",
        ),
        ("read-only", &["-r"][..], "read-only"),
    ] {
        let fx = Fixture::new();
        let uuid = new_uuid();
        fx.run_ok(&["create", "--size", "16M", "--uuid", &uuid]);
        let backing = fx.backing(&uuid);
        let by_hand = common::DetachOnDrop::new(bound_by_hand(&backing, losetup_args));

        for command in [&["attach", &uuid][..], &["attach", &uuid, "--dry-run"][..]] {
            let refused = fx.run(command);
            let stderr = refused.stderr.trim_end();
            assert_eq!(refused.code, 1, "{how} {command:?}: {}", refused.stdout);
            assert_eq!(stderr.lines().count(), 1, "{how}: {stderr}");
            assert!(
                stderr.contains(by_hand.device())
                    && stderr.contains(says)
                    && stderr.contains("losetup -d"),
                "{how}: {stderr}"
            );
        }
        assert_eq!(
            loops_of(&backing),
            vec![by_hand.device().to_string()],
            "{how}"
        );
        drop(by_hand);
        fx.run_ok(&["attach", &uuid]);
        assert_eq!(loops_of(&backing).len(), 1, "{how}");
        fx.run_ok(&["detach", &uuid]);
    }
}

/// Issue 24 item 12: below a storage root a symbolic link is refused
/// (tests/bad_input.rs); the storage root itself being a link is only
/// warned about, so nodes set up that way keep booting.
#[test]
fn a_storage_root_that_is_a_link_attaches_with_a_warning() {
    needs_root!();
    let fx = Fixture::new();
    let root = fx.host("/var/lib/sparse-volume");
    let real = fx.host("/var/lib/elsewhere");
    fs::rename(&root, &real).unwrap();
    symlink(&real, &root).unwrap();
    let uuid = new_uuid();
    fx.run_ok(&["create", "--size", "16M", "--uuid", &uuid]);
    let attached = fx.run_ok(&["attach", &uuid, "--json"]).json();
    let warnings = attached["warnings"].to_string();
    assert!(
        warnings.contains("storage root") && warnings.contains("is a symbolic link"),
        "{attached}"
    );
    assert_eq!(loops_of(&real.join(&uuid)).len(), 1);
    fx.run_ok(&["detach", &uuid]);
}

/// The `/dev/.sparse-volume-*` directories there are now.
fn private_directories_in_dev() -> std::collections::BTreeSet<String> {
    fs::read_dir("/dev")
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with(".sparse-volume-"))
        .collect()
}

/// Issue 24 item 5: attach configured a writable device through a node it
/// made under `/dev` and unlinked once open; a SIGKILL in between left a
/// block device node there. It is now made in a tmpfs mounted nowhere, so
/// a kill at any step leaves nothing in `/dev` (or anywhere).
#[test]
fn a_kill_while_binding_leaves_no_device_node_behind() {
    needs_root!();
    let fx = Fixture::new();
    let uuid = new_uuid();
    fx.make_ext4(&uuid);
    fx.register(&uuid, "filesystem", "");
    // Killed at the node's mknod: the versions that made it in /dev left
    // their directory there (and, killed at the unlink after the open, the
    // node in it).
    let before = private_directories_in_dev();
    let output = fx
        .wrapped(
            &[
                "strace",
                "-f",
                "-qq",
                "-o",
                "/dev/null",
                "-e",
                "trace=mknod,mknodat",
                "-e",
                "inject=mknod,mknodat:signal=KILL:when=1",
            ],
            &["attach", &uuid],
        )
        .output()
        .expect("strace");
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&output.status),
        Some(9),
        "attach made no device node to be killed at: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let after = private_directories_in_dev();
    let new: Vec<_> = after.difference(&before).collect();
    assert!(new.is_empty(), "the kill left {new:?} in /dev");
    let _ = fx.run(&["detach", &uuid]);
}

/// inotify instances held by the processes `pids`.
fn inotify_instances_of(pids: &[u32]) -> usize {
    pids.iter()
        .flat_map(|pid| {
            fs::read_dir(format!("/proc/{pid}/fd"))
                .into_iter()
                .flatten()
                .flatten()
        })
        .filter(|fd| {
            fs::read_link(fd.path()).is_ok_and(|t| t.to_string_lossy() == "anon_inode:inotify")
        })
        .count()
}

/// Issue 24 item 6: each attach waiting for udev's link held an inotify
/// instance of its own, and Debian allows 128 for all of root: with more
/// than about 120 volumes starting at once, other root services failed
/// `inotify_init`. Our processes now hold at most 32 between them; the
/// others look at the link without one.
#[test]
fn waiting_attaches_hold_a_bounded_number_of_inotify_instances() {
    needs_root!();
    const WAITERS: usize = 48;
    let fx = Fixture::new();
    let uuids: Vec<String> = (0..WAITERS).map(|_| new_uuid()).collect();
    for uuid in &uuids {
        fx.make_ext4(uuid);
        fx.register(uuid, "filesystem", "");
    }
    // udev "runs" (its control socket exists) but makes no link: every
    // attach waits its whole timeout.
    let control = fx.host("/run/udev/control");
    fs::create_dir_all(control.parent().unwrap()).unwrap();
    fs::write(&control, "").unwrap();
    fs::write(
        fx.host("/etc/sparse-volume/config.toml"),
        "udev_timeout_sec = 6\n",
    )
    .unwrap();
    // The links are the host's: their directory must be there to watch.
    let links = std::path::Path::new("/dev/disk/by-uuid");
    let made_links = !links.exists();
    fs::create_dir_all(links).unwrap();
    let children: Vec<_> = uuids
        .iter()
        .map(|uuid| {
            fx.command(&["attach", uuid])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    let pids: Vec<u32> = children.iter().map(|child| child.id()).collect();
    let mut most = 0;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(4);
    while std::time::Instant::now() < deadline {
        most = most.max(inotify_instances_of(&pids));
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    for mut child in children {
        let _ = child.wait();
    }
    if made_links {
        let _ = fs::remove_dir(links);
        let _ = fs::remove_dir(links.parent().unwrap());
    }
    assert!(most > 0, "no attach ever waited with inotify");
    assert!(
        most <= 32,
        "{most} inotify instances held by {WAITERS} waiting attaches"
    );
    for uuid in &uuids {
        assert!(
            loops_of(&fx.backing(uuid)).is_empty(),
            "a failed attach left its device"
        );
    }
}
