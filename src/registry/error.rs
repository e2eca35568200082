//! Registry errors that point at the file and line an operator must fix.

use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistryError {
    pub file: PathBuf,
    pub line: Option<usize>,
    pub reason: String,
    /// The file (or its directory) is writable by someone other than
    /// root: its content was not even looked at.
    pub untrusted: bool,
}

impl RegistryError {
    pub fn new(file: &Path, line: Option<usize>, reason: impl Into<String>) -> Self {
        Self {
            file: file.to_path_buf(),
            line,
            reason: reason.into(),
            untrusted: false,
        }
    }

    /// A file or directory refused because of who can write it.
    pub fn untrusted(file: &Path, reason: impl Into<String>) -> Self {
        Self {
            untrusted: true,
            ..Self::new(file, None, reason)
        }
    }

    /// An error at a byte span of the file's text.
    pub fn at(
        file: &Path,
        text: &str,
        span: Option<Range<usize>>,
        reason: impl Into<String>,
    ) -> Self {
        let line = span.map(|s| line_of(text, s.start));
        Self::new(file, line, reason)
    }
}

fn line_of(text: &str, offset: usize) -> usize {
    let end = offset.min(text.len());
    text.as_bytes()[..end]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

impl RegistryError {
    /// The file's path on one line: a control character in a file name
    /// would otherwise split the one-line message.
    pub fn file_for_display(&self) -> String {
        let text = self.file.display().to_string();
        if text.chars().any(char::is_control) {
            text.escape_debug().to_string()
        } else {
            text
        }
    }
}

impl fmt::Display for RegistryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let file = self.file_for_display();
        match self.line {
            Some(line) => write!(f, "{file}:{line}: {}", self.reason),
            None => write!(f, "{file}: {}", self.reason),
        }
    }
}

impl std::error::Error for RegistryError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_count_from_one() {
        let text = "a = 1\nb = 2\nc = 3\n";
        assert_eq!(line_of(text, 0), 1);
        assert_eq!(line_of(text, 6), 2);
        assert_eq!(line_of(text, 12), 3);
        assert_eq!(line_of(text, 999), 4);
    }
}

/// Nothing the registry knows answers to what the user typed: `remove`
/// takes that as "already removed", every other command as an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoSuchVolume {
    pub reference: String,
    /// Also no registered volume's backing file (the text was a path).
    pub as_path: bool,
}

impl NoSuchVolume {
    /// A plain name (no path, no loop device) that no volume has: what a
    /// repeated `remove` by name meets. A path or a device that resolves
    /// to nothing may still be a volume's, written another way.
    pub fn is_a_name_nobody_has(&self) -> bool {
        !self.reference.contains('/')
            && !crate::volume::reference::reads_as_loop_device(&self.reference)
    }
}

impl fmt::Display for NoSuchVolume {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "no volume is named {:?}", self.reference)?;
        if self.as_path {
            f.write_str(", and it is no registered volume's backing file")?;
        }
        f.write_str(" (`sparse-volume list` shows every volume)")
    }
}

impl std::error::Error for NoSuchVolume {}
