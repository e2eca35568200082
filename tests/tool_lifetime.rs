//! The file system tools a command runs (e2fsck, resize2fs, mkfs) work on
//! a volume under the command's volume lock, which they do not inherit: a
//! command killed with SIGKILL must take them with it, or they would go on
//! changing the volume while the next command holds the lock.

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::Fixture;

/// Waits (bounded) for `condition`; the bound only turns a hang into a
/// failure, it measures nothing.
fn eventually(what: &str, condition: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_killed_resize_takes_its_e2fsck_with_it() {
    needs_root!();
    let fx = Fixture::new();
    let created = fx.run_ok(&["create", "--size", "32M", "--json"]).json();
    let uuid = created["uuid"].as_str().expect("uuid").to_string();

    // An e2fsck that records its pid and then works for a long time.
    let bin = fx.root.path().join("slow-bin");
    fs::create_dir_all(&bin).expect("bin dir");
    let pid_file = fx.root.path().join("e2fsck.pid");
    let script = bin.join("e2fsck");
    fs::write(
        &script,
        format!(
            "#!/bin/sh\necho $$ > {}\nexec sleep 60\n",
            pid_file.display()
        ),
    )
    .expect("script");
    fs::set_permissions(&script, fs::Permissions::from_mode(0o755)).expect("chmod");
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );

    let mut resize = fx.command(&["resize", &uuid, "--size", "48M"]);
    let mut child = resize
        .env("PATH", path)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting resize");
    eventually("e2fsck to start", || {
        pid_file.exists() && fs::read_to_string(&pid_file).is_ok_and(|t| !t.trim().is_empty())
    });
    let tool_pid = fs::read_to_string(&pid_file)
        .expect("pid")
        .trim()
        .to_string();
    let proc_dir = format!("/proc/{tool_pid}");
    assert!(Path::new(&proc_dir).exists(), "e2fsck is not running");

    child.kill().expect("SIGKILL to resize only");
    child.wait().expect("reaping resize");
    eventually("e2fsck to die with resize", || {
        // A zombie (its parent is gone, so it is reaped soon) no longer runs.
        fs::read_to_string(format!("{proc_dir}/stat"))
            .map(|stat| stat.contains(") Z "))
            .unwrap_or(true)
    });
}
