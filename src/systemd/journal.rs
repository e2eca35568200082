//! The journal of a unit, to put next to a failed job's result: the job
//! result says *that* the attach failed, the journal says *why*. The run's
//! own error line joins the failure's one line; the unit's last lines are
//! detail for whoever asked for it (`-v`), so that the error stays one
//! sentence on one line, as scripts and config management expect.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A failure message should not wait long for its explanation.
const JOURNAL_TIMEOUT: Duration = Duration::from_secs(3);
/// How long a failed run's own error line is waited for in the journal.
const RUN_ERROR_WAIT: Duration = Duration::from_secs(3);

/// Up to `count` recent lines `journalctl` shows for `unit`, when the
/// user asked for detail (`-v`, or `SPARSE_VOLUME_LOG` at `info` or
/// finer); else none, and journalctl is not even run. Best effort: no
/// journalctl, no journal, no permission or a slow journal all give an
/// empty list rather than an error that would hide the real one.
pub fn last_journal_lines(unit: &str, count: usize) -> Vec<String> {
    if !tracing::enabled!(tracing::Level::INFO) {
        return Vec::new();
    }
    journalctl(&[
        &format!("--unit={unit}"),
        &format!("--lines={count}"),
        "--output=short-iso",
    ])
    .unwrap_or_default()
}

/// The last error a unit's run logged (its program's failure line), found
/// by the run's invocation ID: the reason a failed start gives on its one
/// line, whatever the verbosity. Best effort, like the lines above.
pub fn last_error_of_run(invocation_id: &str) -> Option<String> {
    let filter = format!("_SYSTEMD_INVOCATION_ID={invocation_id}");
    // journald takes a service's output from a stream and may not have
    // stored its last line yet when the job's end reaches us: asked again
    // for up to RUN_ERROR_WAIT in all. One second was too short for a
    // busy guest under emulation (CI: the reason missing from a failed
    // start's line); a failure message may wait that long, not longer.
    let deadline = Instant::now() + RUN_ERROR_WAIT;
    loop {
        let found = journalctl(&[
            "--boot",
            &filter,
            "--priority=err",
            "--lines=1",
            "--output=cat",
        ])?;
        if let Some(line) = found.into_iter().next_back() {
            return Some(line);
        }
        if Instant::now() + Duration::from_millis(200) > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// What `journalctl ARGS --no-pager --quiet --no-hostname` prints, line by
/// line; None when it fails or takes longer than [`JOURNAL_TIMEOUT`].
fn journalctl(args: &[&str]) -> Option<Vec<String>> {
    let child = Command::new("journalctl")
        .args(args)
        .args(["--no-pager", "--quiet", "--no-hostname"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn();
    let Ok(mut child) = child else {
        return None;
    };
    // Read on another thread, so a full pipe cannot stall journalctl while
    // we wait for it to exit.
    let reader = child.stdout.take().map(|mut stdout| {
        std::thread::spawn(move || {
            let mut text = Vec::new();
            let _ = stdout.read_to_end(&mut text);
            text
        })
    });
    let deadline = Instant::now() + JOURNAL_TIMEOUT;
    let succeeded = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status.success(),
            Ok(None) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            _ => {
                // Too slow or unwaitable: end the child we started; its
                // closed pipe then ends the reader thread too.
                let _ = child.kill();
                let _ = child.wait();
                break false;
            }
        }
    };
    let text = reader.and_then(|r| r.join().ok()).unwrap_or_default();
    if !succeeded {
        return None;
    }
    Some(
        String::from_utf8_lossy(&text)
            .lines()
            .filter(|line| !line.trim().is_empty())
            .map(str::to_string)
            .collect(),
    )
}
