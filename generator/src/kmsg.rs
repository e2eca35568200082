//! A tiny logger for `/dev/kmsg`: generators run before the journal is up,
//! so the kernel ring buffer is where their messages survive the boot.

use std::fs::{File, OpenOptions};
use std::io::Write;

const IDENT: &str = "sparse-volume-generator";
/// The kernel refuses (EINVAL) records longer than this; keep room for the
/// prefix and the newline.
const MAX_RECORD: usize = 1000;

/// syslog(3) priorities, as `/dev/kmsg` expects them in the `<N>` prefix.
#[derive(Clone, Copy, Debug)]
pub enum Level {
    Err = 3,
    Warning = 4,
}

pub struct Kmsg {
    kmsg: Option<File>,
}

impl Kmsg {
    /// Opens `/dev/kmsg`, or falls back to stderr when asked to (test runs
    /// under `SPARSE_VOLUME_ROOT` must not write into the host's kernel
    /// log) or when the device cannot be opened (containers, non-root).
    pub fn open(use_stderr: bool) -> Self {
        let kmsg = if use_stderr {
            None
        } else {
            OpenOptions::new().write(true).open("/dev/kmsg").ok()
        };
        Self { kmsg }
    }

    /// Logs `message` as one line: some parser messages span several.
    pub fn log(&self, level: Level, message: &str) {
        let message = one_line(message);
        let message = message.as_str();
        match &self.kmsg {
            // One write is one record; a failed log line must not stop the
            // generator, so errors are ignored.
            Some(file) => {
                let line = format!(
                    "<{}>{IDENT}: {}\n",
                    level as u8,
                    truncate(message, MAX_RECORD - IDENT.len() - 8)
                );
                let _ = (&*file).write_all(line.as_bytes());
            }
            None => {
                let _ = writeln!(std::io::stderr().lock(), "{IDENT}: {message}");
            }
        }
    }

    pub fn error(&self, message: &str) {
        self.log(Level::Err, message);
    }

    pub fn warning(&self, message: &str) {
        self.log(Level::Warning, message);
    }
}

fn one_line(text: &str) -> String {
    text.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .collect::<Vec<_>>()
        .join("; ")
}

fn truncate(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn joins_lines() {
        assert_eq!(
            one_line("a.toml:3: invalid array\nexpected `]`\n"),
            "a.toml:3: invalid array; expected `]`"
        );
        assert_eq!(one_line("plain"), "plain");
    }

    #[test]
    fn truncates_on_a_character_boundary() {
        assert_eq!(truncate("abc", 10), "abc");
        assert_eq!(truncate("abcdef", 3), "abc");
        assert_eq!(truncate("aää", 2), "a");
    }
}
