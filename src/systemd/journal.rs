//! The last journal lines of a unit, to put next to a failed job's result:
//! the job result says *that* the attach failed, the journal says *why*.
//! They are detail for whoever asked for it (`-v`): the error itself stays
//! one sentence on one line, as scripts and config management expect.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A failure message should not wait long for its explanation.
const JOURNAL_TIMEOUT: Duration = Duration::from_secs(3);

/// Up to `count` recent lines `journalctl` shows for `unit`, when the
/// user asked for detail (`-v`, or `SPARSE_VOLUME_LOG` at `info` or
/// finer); else none, and journalctl is not even run. Best effort: no
/// journalctl, no journal, no permission or a slow journal all give an
/// empty list rather than an error that would hide the real one.
pub fn last_journal_lines(unit: &str, count: usize) -> Vec<String> {
    if !tracing::enabled!(tracing::Level::INFO) {
        return Vec::new();
    }
    let child = Command::new("journalctl")
        .arg(format!("--unit={unit}"))
        .arg(format!("--lines={count}"))
        .args([
            "--no-pager",
            "--quiet",
            "--no-hostname",
            "--output=short-iso",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn();
    let Ok(mut child) = child else {
        return Vec::new();
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
        return Vec::new();
    }
    String::from_utf8_lossy(&text)
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(str::to_string)
        .collect()
}
