//! What the terminal can show: colour or not, how many columns, and how
//! wide a piece of text is on screen.

use std::ffi::OsStr;
use std::io::IsTerminal;

/// The width a listing aims to fit when `COLUMNS` does not say: wide
/// enough for long names, narrow enough for a split screen.
pub const DEFAULT_COLUMNS: usize = 100;

/// How a report is rendered for people.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Style {
    /// ANSI colours on (only for a terminal that wants them).
    pub colour: bool,
    /// The width rows should fit.
    pub columns: usize,
}

impl Style {
    /// For standard output as it is now.
    pub fn detect() -> Self {
        Self {
            colour: colour_wanted(
                std::io::stdout().is_terminal(),
                std::env::var_os("NO_COLOR").as_deref(),
                std::env::var_os("TERM").as_deref(),
            ),
            columns: columns_from(std::env::var_os("COLUMNS").as_deref()),
        }
    }

    /// Plain text at the default width: what pipes and tests get.
    pub fn plain() -> Self {
        Self {
            colour: false,
            columns: DEFAULT_COLUMNS,
        }
    }

    /// `text` in `paint`'s colour when colour is on, else as it is.
    pub fn paint(&self, text: &str, paint: Paint) -> String {
        if !self.colour || text.is_empty() {
            return text.to_string();
        }
        format!("\x1b[{}m{text}\x1b[0m", paint.code())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Paint {
    Green,
    Red,
    Yellow,
    Dim,
}

impl Paint {
    fn code(self) -> &'static str {
        match self {
            Paint::Green => "32",
            Paint::Red => "1;31",
            Paint::Yellow => "33",
            Paint::Dim => "2",
        }
    }
}

/// Colour only on a terminal, unless `NO_COLOR` is set to anything but
/// the empty string (no-color.org), and never on a terminal that says it
/// cannot show it (`TERM` unset or `dumb`, as systemd decides).
pub fn colour_wanted(is_terminal: bool, no_color: Option<&OsStr>, term: Option<&OsStr>) -> bool {
    is_terminal
        && no_color.is_none_or(OsStr::is_empty)
        && term.is_some_and(|t| !t.is_empty() && t != "dumb")
}

/// `COLUMNS` when it holds a width, else [`DEFAULT_COLUMNS`].
pub fn columns_from(value: Option<&OsStr>) -> usize {
    value
        .and_then(OsStr::to_str)
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|&c| c > 0)
        .unwrap_or(DEFAULT_COLUMNS)
}

/// Columns `text` takes on a terminal (Unicode's East Asian Width data:
/// wide and fullwidth characters take two, combining marks none).
pub fn width(text: &str) -> usize {
    text.chars().map(char_width).sum()
}

fn char_width(c: char) -> usize {
    // Control characters have no width of their own; `sanitise` shows them.
    unicode_width::UnicodeWidthChar::width(c).unwrap_or(0)
}

/// `text` cut to at most `max` columns, ending in `…` when cut.
pub fn truncate(text: &str, max: usize) -> String {
    if width(text) <= max {
        return text.to_string();
    }
    let mut kept = String::new();
    let mut used = 0;
    for c in text.chars() {
        let w = char_width(c);
        if used + w + 1 > max {
            break;
        }
        kept.push(c);
        used += w;
    }
    if max > 0 {
        kept.push('…');
    }
    kept
}

/// Text from a registry file as one safe table cell: characters that
/// reorder or hide the text around them (bidirectional overrides and
/// isolates) are shown as `?`, so a label cannot disguise other rows.
pub fn sanitise(text: &str) -> String {
    text.chars()
        .map(|c| match u32::from(c) {
            0x202A..=0x202E | 0x2066..=0x2069 => '?',
            _ if c.is_control() => '?',
            _ => c,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colour_needs_a_terminal_that_wants_it() {
        let term = Some(OsStr::new("xterm-256color"));
        assert!(colour_wanted(true, None, term));
        assert!(colour_wanted(true, Some(OsStr::new("")), term));
        assert!(!colour_wanted(true, Some(OsStr::new("1")), term));
        assert!(!colour_wanted(true, Some(OsStr::new("0")), term));
        assert!(!colour_wanted(false, None, term));
        assert!(!colour_wanted(true, None, Some(OsStr::new("dumb"))));
        assert!(!colour_wanted(true, None, None));
    }

    #[test]
    fn columns_come_from_the_environment_when_they_make_sense() {
        assert_eq!(columns_from(None), DEFAULT_COLUMNS);
        assert_eq!(columns_from(Some(OsStr::new("80"))), 80);
        assert_eq!(columns_from(Some(OsStr::new("0"))), DEFAULT_COLUMNS);
        assert_eq!(columns_from(Some(OsStr::new("wide"))), DEFAULT_COLUMNS);
    }

    #[test]
    fn widths_count_columns_not_bytes() {
        assert_eq!(width("db"), 2);
        assert_eq!(width("é"), 1);
        assert_eq!(width("e\u{301}"), 1);
        assert_eq!(width("データ"), 6);
        assert_eq!(width("数据卷"), 6);
    }

    #[test]
    fn truncation_keeps_within_the_width_and_says_so() {
        assert_eq!(truncate("postgres", 8), "postgres");
        assert_eq!(truncate("postgres-data", 8), "postgre…");
        assert_eq!(width(&truncate("データベース", 7)), 7);
        assert_eq!(truncate("データベース", 7), "データ…");
        assert_eq!(truncate("データベース", 6), "デー…");
    }

    #[test]
    fn paint_wraps_only_when_colour_is_on() {
        let on = Style {
            colour: true,
            columns: 80,
        };
        assert_eq!(on.paint("failed", Paint::Red), "\x1b[1;31mfailed\x1b[0m");
        assert_eq!(Style::plain().paint("failed", Paint::Red), "failed");
    }

    #[test]
    fn labels_cannot_reorder_the_table() {
        assert_eq!(sanitise("a\u{202E}b"), "a?b");
        assert_eq!(sanitise("plain name"), "plain name");
    }
}
