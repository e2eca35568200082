//! Forward-compatible reading of registry TOML: a key this version does
//! not know (a typo, or a key from a newer version after a downgrade) is
//! reported and ignored, never a reason to drop a volume at boot.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;

use super::error::RegistryError;

/// A key that was ignored, with the known key it most likely meant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistryWarning {
    pub file: PathBuf,
    pub line: Option<usize>,
    pub key: String,
    pub suggestion: Option<&'static str>,
}

impl fmt::Display for RegistryWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        write!(f, ": unknown key \"{}\"", self.key)?;
        if let Some(suggestion) = self.suggestion {
            write!(f, " (did you mean \"{suggestion}\"?)")?;
        }
        f.write_str("; ignored")
    }
}

/// Deserialises `text`, collecting the keys `T` does not know as warnings.
pub fn from_toml<T: DeserializeOwned>(
    file: &Path,
    text: &str,
    known_keys: &[&'static str],
) -> Result<(T, Vec<RegistryWarning>), RegistryError> {
    let mut ignored = Vec::new();
    let to_error = |e: toml::de::Error| {
        RegistryError::at(file, text, e.span(), one_line(&parser_message(&e, text)))
    };
    let deserializer = toml::Deserializer::parse(text).map_err(to_error)?;
    let value = serde_ignored::deserialize(deserializer, |path| ignored.push(path.to_string()))
        .map_err(to_error)?;
    let warnings = ignored
        .into_iter()
        .map(|key| RegistryWarning {
            file: file.to_path_buf(),
            line: line_of_key(text, &key),
            suggestion: nearest(&key, known_keys),
            key,
        })
        .collect();
    Ok((value, warnings))
}

/// The parser's message (not its Display, which repeats the source line
/// with a caret: one sentence is what an operator reading the journal
/// needs), with the key named where toml 0.9 only says "duplicate key"
/// (its span is the key: a table header's name, or the repeated key).
fn parser_message(error: &toml::de::Error, text: &str) -> String {
    let message = error.message().trim_end();
    let key = error
        .span()
        .and_then(|span| text.get(span))
        .map(str::trim)
        .filter(|key| !key.is_empty() && !key.contains('\n'));
    match key {
        Some(key) if message == "duplicate key" => format!("duplicate key `{key}`"),
        _ => message.to_string(),
    }
}

/// A parser message as one line: some span several ("invalid array" /
/// "expected `]`"), and values quoted from the file may hold control
/// characters; an operator reads one line per problem in the journal.
fn one_line(message: &str) -> String {
    let joined = message
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .collect::<Vec<_>>()
        .join("; ");
    joined
        .chars()
        .flat_map(|c| {
            let escaped: Vec<char> = if c.is_control() {
                c.escape_default().collect()
            } else {
                vec![c]
            };
            escaped
        })
        .collect()
}

/// The known key within a small edit distance of `key`, if any.
fn nearest(key: &str, known_keys: &[&'static str]) -> Option<&'static str> {
    known_keys
        .iter()
        .map(|&known| {
            let similar = known.starts_with(key) || key.starts_with(known);
            let distance = if similar {
                0
            } else {
                strsim::damerau_levenshtein(key, known)
            };
            (distance, known)
        })
        .filter(|&(distance, known)| distance <= (known.len() / 3).max(2))
        .min_by_key(|&(distance, _)| distance)
        .map(|(_, known)| known)
}

/// The first line that assigns the top-level `key` (messages only: a
/// best effort, not a TOML parser).
fn line_of_key(text: &str, key: &str) -> Option<usize> {
    text.lines()
        .position(|line| {
            let line = line.trim_start();
            let rest = line
                .strip_prefix(key)
                .or_else(|| line.strip_prefix(&format!("\"{key}\"")));
            rest.is_some_and(|rest| rest.trim_start().starts_with('='))
        })
        .map(|index| index + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggests_the_nearest_known_key() {
        let known = ["overcommit_ratio", "reserve", "storage_roots", "direct_io"];
        assert_eq!(nearest("overcommit", &known), Some("overcommit_ratio"));
        assert_eq!(nearest("storage_root", &known), Some("storage_roots"));
        assert_eq!(nearest("direct-io", &known), Some("direct_io"));
        assert_eq!(nearest("reserv", &known), Some("reserve"));
        assert_eq!(nearest("frobnicate", &known), None);
    }

    #[test]
    fn parse_errors_are_one_line() {
        let file = Path::new("/etc/sparse-volume/config.toml");
        for text in [
            "a = [1,\n",
            "mode = \"raw\\u001b\"\nx = {",
            "a = \"\\u0085\"\na = 1\n",
        ] {
            let error = from_toml::<toml::Table>(file, text, &[]).unwrap_err();
            let shown = error.to_string();
            assert!(!shown.contains(char::is_control), "{shown:?}");
        }
        assert_eq!(
            one_line("invalid array\nexpected `]`\n"),
            "invalid array; expected `]`"
        );
        assert_eq!(one_line("a\u{1b}b"), "a\\u{1b}b");
    }

    #[test]
    fn finds_the_line_of_a_key() {
        let text = "a = 1\n  overcommit = 2\n\"quoted\" = 3\n";
        assert_eq!(line_of_key(text, "overcommit"), Some(2));
        assert_eq!(line_of_key(text, "quoted"), Some(3));
        assert_eq!(line_of_key(text, "missing"), None);
    }
}
