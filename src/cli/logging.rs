//! Log to the journal when systemd started us, to stderr otherwise.

use std::io::IsTerminal;

use tracing_subscriber::{filter::LevelFilter, prelude::*, EnvFilter};

/// systemd sets `JOURNAL_STREAM` for services whose output goes to the
/// journal; structured records are better there than plain text.
fn started_by_systemd() -> bool {
    std::env::var_os("JOURNAL_STREAM").is_some() && std::env::var_os("INVOCATION_ID").is_some()
}

pub fn init(verbosity: u8) {
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
                .with(filter)
                .with(journald.with_syslog_identifier("sparse-volume".into()))
                .try_init();
            return;
        }
    }
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                // Colour codes only for a person at a terminal, never in
                // what a script or config management captures.
                .with_ansi(std::io::stderr().is_terminal())
                .without_time()
                .with_target(false),
        )
        .try_init();
}
