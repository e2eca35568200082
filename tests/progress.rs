//! What a long command shows while it works (issue 25, item 14): with
//! `-v`, a line per step on stderr; on a terminal without `-v`, one
//! progress line that the result replaces; in a pipe or with `--json`,
//! nothing but the result.

mod common;

use std::process::Command;

use common::{Fixture, Run};

const STEP: &str = "making the ext4 file system";

#[test]
fn verbose_tells_each_step_and_quiet_tells_none() {
    needs_root!();
    let fx = Fixture::new();
    let verbose = fx.run_ok(&["create", "--size", "16M", "-v"]);
    for step in ["sizing the backing file", STEP, "registering"] {
        assert!(verbose.stderr.contains(step), "{step}: {}", verbose.stderr);
    }
    assert!(verbose.stdout.starts_with("created "), "{}", verbose.stdout);
    let quiet = fx.run_ok(&["create", "--size", "16M"]);
    assert_eq!(quiet.stderr, "", "a pipe gets no progress");
}

/// The CLI on a pseudo-terminal (`script`), as a person runs it.
fn on_a_terminal(fx: &Fixture, args: &str) -> Run {
    let binary = env!("CARGO_BIN_EXE_sparse-volume");
    Command::new("script")
        .args(["-qec", &format!("{binary} {args}"), "/dev/null"])
        .env("SPARSE_VOLUME_ROOT", fx.root.path())
        .env("DBUS_SYSTEM_BUS_ADDRESS", fx.absent_bus())
        .env_remove("JOURNAL_STREAM")
        .output()
        .expect("running script")
        .into()
}

#[test]
fn a_terminal_sees_a_progress_line_that_the_result_replaces() {
    needs_root!();
    let fx = Fixture::new();
    let run = on_a_terminal(&fx, "create --size 16M");
    assert_eq!(run.code, 0, "{}", run.stdout);
    assert!(run.stdout.contains(STEP), "{:?}", run.stdout);
    // Erased before the result: carriage return, then clear the line.
    let result = run.stdout.find("created ").expect("the result");
    let erased = run.stdout[..result].rfind("\r\x1b[K").expect("erased");
    assert!(erased > run.stdout.find(STEP).unwrap(), "{:?}", run.stdout);

    let json = on_a_terminal(&fx, "create --size 16M --json");
    assert!(!json.stdout.contains(STEP), "{:?}", json.stdout);
}
