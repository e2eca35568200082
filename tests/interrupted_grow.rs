//! A grow that dies part way must leave a file system that the next
//! `resize` finishes, with the data in it intact. An offline resize2fs
//! rewrites the primary superblock a few bytes at a time, its checksum
//! last: killed in between, it left a superblock that neither the kernel
//! nor e2fsck would open (found by tests/crash.rs, seed
//! 1796306972281912891). Here the kill is placed exactly: strace stops
//! resize2fs at its Nth write, for every N that it reaches.

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{loops_of, tool, Fixture};

const MIB: u64 = 1 << 20;
const BEFORE: u64 = 32 * MIB;
/// Across several block groups: killed part way, such a grow also leaves
/// damage that `e2fsck -p` does not repair (a resize inode not valid).
const AFTER: u64 = 700 * MIB;
/// Past the last write such a grow makes (22, counted with strace), so
/// every kill point is covered.
const KILL_POINTS: u32 = 24;

/// Where `program` is on PATH, found before the test puts its wrapper first.
fn on_path(program: &str) -> PathBuf {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
        .unwrap_or_else(|| panic!("{program} not found on PATH"))
}

/// A directory holding a `resize2fs` that runs the real one under strace,
/// which kills it with SIGKILL as it enters its `nth` `syscall`.
fn killing_resize2fs(fx: &Fixture, syscall: &str, nth: u32) -> PathBuf {
    let bin = fx.root.path().join(format!("kill-{syscall}-{nth}"));
    fs::create_dir_all(&bin).expect("wrapper directory");
    let wrapper = bin.join("resize2fs");
    fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nexec {} -o /dev/null -e trace={syscall} -e inject={syscall}:signal=KILL:when={nth} {} \"$@\"\n",
            on_path("strace").display(),
            on_path("resize2fs").display(),
        ),
    )
    .expect("writing the wrapper");
    fs::set_permissions(&wrapper, fs::Permissions::from_mode(0o755)).expect("chmod");
    bin
}

fn sha256(path: &Path) -> String {
    tool("sha256sum", &[path.to_str().expect("utf-8 path")])
        .split_whitespace()
        .next()
        .expect("a digest")
        .to_string()
}

/// Puts `source` into the file system on `target` as /data, with debugfs:
/// no mount, so the test does not depend on what it tests.
fn write_data(target: &Path, source: &Path) {
    tool(
        "debugfs",
        &[
            "-w",
            "-R",
            &format!("write {} data", source.display()),
            target.to_str().expect("utf-8 path"),
        ],
    );
}

fn read_data(target: &Path, into: &Path) {
    let _ = fs::remove_file(into);
    tool(
        "debugfs",
        &[
            "-R",
            &format!("dump data {}", into.display()),
            target.to_str().expect("utf-8 path"),
        ],
    );
}

fn block_count(target: &Path) -> u64 {
    let header = tool("dumpe2fs", &["-h", target.to_str().expect("utf-8 path")]);
    header
        .lines()
        .find_map(|line| line.strip_prefix("Block count:"))
        .and_then(|count| count.trim().parse().ok())
        .unwrap_or_else(|| panic!("no block count in dumpe2fs -h:\n{header}"))
}

/// One kill point: grow, killed at `syscall` number `nth`; then grow again
/// and check the file system and its data.
/// Whether resize2fs was killed at all (it was not when it made fewer
/// writes than `nth`).
fn kill_and_finish(attached: bool, syscall: &str, nth: u32) -> bool {
    let fx = Fixture::new();
    let size = BEFORE.to_string();
    let created = fx.run_ok(&["create", "--size", &size, "--json"]).json();
    let uuid = created["uuid"].as_str().expect("uuid").to_string();
    let backing = fx.backing(&uuid);
    // Attached, the tools work on the device, whose page cache the
    // backing file does not see: the test reads where they write.
    let target = if attached {
        fx.run_ok(&["attach", &uuid]);
        PathBuf::from(loops_of(&backing).first().expect("a loop device"))
    } else {
        backing.clone()
    };

    let data = fx.root.path().join("data");
    tool(
        "dd",
        &[
            "if=/dev/urandom",
            &format!("of={}", data.display()),
            "bs=1M",
            "count=4",
            "status=none",
        ],
    );
    write_data(&target, &data);
    let want = sha256(&data);

    let wrapper = killing_resize2fs(&fx, syscall, nth);
    let path = format!(
        "{}:{}",
        wrapper.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let after = AFTER.to_string();
    let killed = fx
        .command(&["resize", &uuid, "--size", &after])
        .env("PATH", path)
        .output()
        .expect("running resize");
    let what = format!(
        "{} volume, resize2fs killed at {syscall} #{nth} (first resize exit {:?}: {})",
        if attached {
            "an attached"
        } else {
            "a detached"
        },
        killed.status.code(),
        String::from_utf8_lossy(&killed.stderr).trim()
    );

    let killed_at_this_point = String::from_utf8_lossy(&killed.stderr).contains("SIGKILL");

    let again = fx.run(&["resize", &uuid, "--size", &after]);
    assert_eq!(
        again.code, 0,
        "{what}: running resize again did not finish the grow: {}",
        again.stderr
    );
    let fsck = Command::new("e2fsck")
        .args(["-f", "-n"])
        .arg(&target)
        .output()
        .expect("running e2fsck");
    assert!(
        fsck.status.success(),
        "{what}: e2fsck -fn after the second resize: {}{}",
        String::from_utf8_lossy(&fsck.stdout),
        String::from_utf8_lossy(&fsck.stderr)
    );
    assert_eq!(
        block_count(&target),
        AFTER / 4096,
        "{what}: the file system did not reach the new size"
    );
    let read_back = fx.root.path().join("read-back");
    read_data(&target, &read_back);
    assert_eq!(sha256(&read_back), want, "{what}: the data changed");
    assert_eq!(
        xattr::get(&backing, "user.sparse-volume.growing").expect("reading xattrs"),
        None,
        "{what}: the growing mark is still on the backing file"
    );
    killed_at_this_point
}

#[test]
fn a_grow_killed_at_any_write_of_resize2fs_is_finished_by_the_next_resize() {
    needs_root!();
    for attached in [false, true] {
        // The tools write with write(2) (with pwrite64 only when allowed to
        // rewrite superblocks piecemeal, which is what this test caught).
        let killed = (1..=KILL_POINTS)
            .filter(|&nth| kill_and_finish(attached, "write", nth))
            .count();
        // Else strace did not kill (no ptrace here, say) and this test
        // only grew file systems.
        assert!(
            killed >= 20,
            "resize2fs was killed at only {killed} of {KILL_POINTS} points (attached: {attached})"
        );
    }
}
