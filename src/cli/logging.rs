//! Log to the journal when systemd started us, to stderr otherwise; and
//! on a terminal, one progress line for the long steps, which the result
//! replaces.
//!
//! Steps are `tracing` events at INFO with a `progress` field (any layer
//! may say one: `tracing::info!(progress = true, "making …")`): `-v` shows
//! them as lines, a person at a terminal sees them one at a time, and a
//! pipe, JSON or the journal get nothing extra.

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Filter};
use tracing_subscriber::{filter::LevelFilter, prelude::*, EnvFilter, Layer};

/// Set while a progress line is on the terminal, to be erased.
static PROGRESS_SHOWN: AtomicBool = AtomicBool::new(false);

/// Carriage return, then erase to the end of the line.
const ERASE_LINE: &str = "\r\x1b[K";

/// systemd sets `JOURNAL_STREAM` for services whose output goes to the
/// journal; structured records are better there than plain text.
fn started_by_systemd() -> bool {
    std::env::var_os("JOURNAL_STREAM").is_some() && std::env::var_os("INVOCATION_ID").is_some()
}

/// `json`: the caller reads stdout as one object; no progress then, even
/// on a terminal (stderr may be one while stdout is captured).
pub fn init(verbosity: u8, json: bool) {
    let level = match verbosity {
        0 => LevelFilter::WARN,
        1 => LevelFilter::INFO,
        _ => LevelFilter::DEBUG,
    };
    let filter = EnvFilter::builder()
        .with_default_directive(level.into())
        .with_env_var("SPARSE_VOLUME_LOG")
        .from_env_lossy();
    if started_by_systemd() {
        if let Ok(journald) = tracing_journald::layer() {
            let _ = tracing_subscriber::registry()
                .with(
                    journald
                        .with_syslog_identifier("sparse-volume".into())
                        .with_filter(filter),
                )
                .try_init();
            return;
        }
    }
    let on_terminal = std::io::stderr().is_terminal();
    // SPARSE_VOLUME_LOG asks for log lines; they and a progress line would
    // share one line of the terminal.
    let asked_for_lines = std::env::var_os("SPARSE_VOLUME_LOG").is_some();
    let progress = (verbosity == 0 && !json && on_terminal && !asked_for_lines)
        .then(|| ProgressLine.with_filter(Steps));
    let _ = tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                // A warning during a step gets a line of its own.
                .with_writer(|| {
                    clear_progress();
                    std::io::stderr()
                })
                // Colour codes only for a person at a terminal, never in
                // what a script or config management captures.
                .with_ansi(on_terminal)
                .without_time()
                .with_target(false)
                .fmt_fields(without_progress_field())
                .with_filter(filter),
        )
        .with(progress)
        .try_init();
}

/// The fields of a log line, without `progress`, which only marks a step.
fn without_progress_field() -> impl for<'w> tracing_subscriber::fmt::FormatFields<'w> {
    tracing_subscriber::fmt::format::debug_fn(|writer, field, value| match field.name() {
        "progress" => Ok(()),
        "message" => write!(writer, "{value:?}"),
        name => write!(writer, " {name}={value:?}"),
    })
}

/// Erases the progress line, if one is shown: called before anything
/// else is printed.
pub fn clear_progress() {
    if PROGRESS_SHOWN.swap(false, Ordering::Relaxed) {
        let mut stderr = std::io::stderr();
        let _ = write!(stderr, "{ERASE_LINE}");
        let _ = stderr.flush();
    }
}

/// The events that are steps.
struct Steps;

impl<S: Subscriber> Filter<S> for Steps {
    fn enabled(&self, metadata: &tracing::Metadata<'_>, _: &Context<'_, S>) -> bool {
        *metadata.level() <= Level::INFO && metadata.fields().field("progress").is_some()
    }
}

/// Draws each step over the last one.
struct ProgressLine;

impl<S: Subscriber> Layer<S> for ProgressLine {
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let mut message = Message(String::new());
        event.record(&mut message);
        let mut stderr = std::io::stderr();
        let _ = write!(stderr, "{ERASE_LINE}sparse-volume: {}…", fit(&message.0));
        let _ = stderr.flush();
        PROGRESS_SHOWN.store(true, Ordering::Relaxed);
    }
}

/// What fits an 80-column terminal after the program's name: the erase
/// covers one row only, so a step must not wrap.
const STEP_WIDTH: usize = 64;

/// The step, its middle cut when too long (paths are the long part).
fn fit(step: &str) -> String {
    let chars: Vec<char> = step.chars().collect();
    if chars.len() <= STEP_WIDTH {
        return step.to_string();
    }
    let half = (STEP_WIDTH - 1) / 2;
    let head: String = chars[..half].iter().collect();
    let tail: String = chars[chars.len() - half..].iter().collect();
    format!("{head}…{tail}")
}

struct Message(String);

impl Visit for Message {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_step_is_cut_in_the_middle_to_one_row() {
        let step = format!(
            "binding /var/lib/sparse-volume/{} to a free loop device",
            "x".repeat(36)
        );
        let fitted = fit(&step);
        assert!(fitted.chars().count() <= STEP_WIDTH, "{fitted}");
        assert!(fitted.starts_with("binding /var/lib/") && fitted.ends_with("free loop device"));
        assert_eq!(
            fit("making the ext4 file system"),
            "making the ext4 file system"
        );
    }
}
