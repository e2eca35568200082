//! Log lines of the units' program on stderr, which systemd connects to the
//! journal: each line starts with its syslog priority (`<4>`), which
//! journald reads (`SyslogLevelPrefix=`, on by default) and removes; run
//! by hand, the lines are plain. The engine's `tracing` events at warning
//! and above come out the same way; a subscriber this small saves the
//! unit's start-up what `tracing-subscriber` costs.

use std::io::Write;

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

/// Every line starts with this, as the CLI's do.
const IDENT: &str = "sparse-volume";

#[derive(Clone, Copy)]
pub enum Priority {
    Error = 3,
    Warning = 4,
}

/// systemd sets `JOURNAL_STREAM` when stderr is the journal (and
/// `INVOCATION_ID` for its services: a shell started from one inherits the
/// first alone).
fn to_journal() -> bool {
    std::env::var_os("JOURNAL_STREAM").is_some() && std::env::var_os("INVOCATION_ID").is_some()
}

/// Writes `<priority>sparse-volume: message` (without the priority when
/// stderr is not the journal) as one line.
pub fn line(priority: Priority, message: &str) {
    let text = if to_journal() {
        format!("<{}>{IDENT}: {message}\n", priority as u8)
    } else {
        format!("{IDENT}: {message}\n")
    };
    // Nothing is left to tell when stderr itself fails.
    let _ = std::io::stderr().lock().write_all(text.as_bytes());
}

/// Sends the engine's warnings and errors to [`line`].
pub fn init() {
    let _ = tracing::subscriber::set_global_default(Lines);
}

struct Lines;

/// The `message` field of an event.
struct Message(String);

impl Visit for Message {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.0.push_str(value);
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}

impl Subscriber for Lines {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        *metadata.level() <= Level::WARN
    }

    fn new_span(&self, _: &Attributes<'_>) -> Id {
        // No spans are shown; every one gets the same id.
        Id::from_u64(1)
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let mut message = Message(String::new());
        event.record(&mut message);
        let priority = if *event.metadata().level() == Level::ERROR {
            Priority::Error
        } else {
            Priority::Warning
        };
        line(priority, &message.0);
    }

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}
