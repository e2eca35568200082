//! The generator's quoting of paths into unit names and unit files.
//!
//! Properties, for any path:
//! * `unit_name_path_escape` uses only the characters systemd allows in a
//!   unit name, never starts with a dot, and systemd's unescaping
//!   (`unit_name_path_unescape`, modelled below) gives back the path, with
//!   its leading and trailing slashes normalised to one leading slash.
//! * `unit_file_path_word` refuses exactly the paths with control
//!   characters, and otherwise gives one word that systemd's word
//!   splitting (`extract_first_word` with `EXTRACT_UNQUOTE`) and specifier
//!   expansion (`%%` to `%`) turn back into the path.
#![no_main]

use libfuzzer_sys::fuzz_target;

// The generator is a binary crate: its module is compiled in from where
// it lives, so that the fuzzed code is the shipped code.
#[allow(dead_code)]
#[path = "../../generator/src/escape.rs"]
mod escape;

/// systemd's `unit_name_path_unescape`: `-` is `/`, `\xNN` a byte.
fn unit_name_unescape(name: &str) -> Vec<u8> {
    if name == "-" {
        return b"/".to_vec();
    }
    let mut out = vec![b'/'];
    let bytes = name.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'-' => out.push(b'/'),
            b'\\' => {
                assert_eq!(bytes.get(i + 1), Some(&b'x'), "lone backslash in {name}");
                let hex = std::str::from_utf8(&bytes[i + 2..i + 4]).expect("hex digits");
                out.push(u8::from_str_radix(hex, 16).expect("hex digits"));
                i += 3;
            }
            other => out.push(other),
        }
        i += 1;
    }
    out
}

/// The words systemd splits a setting's value into, unquoted.
fn split_words(value: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut quote: Option<char> = None;
    let mut chars = value.chars();
    while let Some(c) = chars.next() {
        match (quote, c) {
            (_, '\\') => {
                let escaped = chars.next().expect("a backslash escapes something");
                word.get_or_insert_with(String::new).push(escaped);
            }
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.get_or_insert_with(String::new).push(c),
            (None, '"' | '\'') => {
                quote = Some(c);
                word.get_or_insert_with(String::new);
            }
            (None, ' ' | '\t' | '\n' | '\r') => words.extend(word.take()),
            (None, c) => word.get_or_insert_with(String::new).push(c),
        }
    }
    assert!(quote.is_none(), "unterminated quote in {value}");
    words.extend(word);
    words
}

/// Specifier expansion, for a word without specifiers other than `%%`.
fn expand_percent(word: &str) -> String {
    let mut out = String::new();
    let mut chars = word.chars();
    while let Some(c) = chars.next() {
        if c == '%' {
            assert_eq!(chars.next(), Some('%'), "a specifier in {word}");
        }
        out.push(c);
    }
    out
}

fuzz_target!(|data: &[u8]| {
    let Ok(path) = std::str::from_utf8(data) else {
        return;
    };

    let name = escape::unit_name_path_escape(path);
    assert!(!name.is_empty() && !name.starts_with('.'), "{name}");
    assert!(
        name.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b":-_.\\".contains(&b)),
        "{name}"
    );
    let normalised = format!("/{}", path.trim_matches('/'));
    assert_eq!(unit_name_unescape(&name), normalised.as_bytes(), "{name}");

    match escape::unit_file_path_word(path) {
        Err(_) => assert!(path.chars().any(char::is_control)),
        Ok(word) => {
            assert!(!path.chars().any(char::is_control));
            // An empty path is no word at all; the registry never holds one.
            if !path.is_empty() {
                let words = split_words(&word);
                assert_eq!(words.len(), 1, "{word} splits into {words:?}");
                assert_eq!(expand_percent(&words[0]), path, "{word}");
            }
        }
    }
});
