//! A small YAML emitter for manifests: block mappings and sequences, and
//! every string in double quotes with escapes, so that no value (a
//! volume's free-text name included) can be read back as anything but
//! the string it was. A YAML library would be a dependency for what
//! fits on a page, and the well-known Rust one is unmaintained.

use serde_json::{Map, Value};

/// One YAML document, opened with `---` so that documents from several
/// runs can be concatenated into one stream.
pub fn document(value: &Value) -> String {
    let mut out = String::from("---\n");
    match value {
        Value::Object(map) if !map.is_empty() => write_map(&mut out, map, 0),
        Value::Array(items) if !items.is_empty() => write_sequence(&mut out, items, 0),
        scalar => {
            out.push_str(&inline(scalar));
            out.push('\n');
        }
    }
    out
}

fn write_map(out: &mut String, map: &Map<String, Value>, indent: usize) {
    for (key, value) in map {
        pad(out, indent);
        out.push_str(&mapping_key(key));
        out.push(':');
        write_nested(out, value, indent + 2);
    }
}

fn write_sequence(out: &mut String, items: &[Value], indent: usize) {
    for item in items {
        match item {
            Value::Object(map) if !map.is_empty() => {
                // The first key shares the line with the dash; the others
                // line up under it.
                let mut block = String::new();
                write_map(&mut block, map, indent + 2);
                pad(out, indent);
                out.push_str("- ");
                out.push_str(&block[indent + 2..]);
            }
            _ => {
                pad(out, indent);
                out.push('-');
                write_nested(out, item, indent + 2);
            }
        }
    }
}

/// What follows a `key:` or a `-`: a nested block on the next lines, or
/// a scalar on the same line.
fn write_nested(out: &mut String, value: &Value, indent: usize) {
    match value {
        Value::Object(map) if !map.is_empty() => {
            out.push('\n');
            write_map(out, map, indent);
        }
        Value::Array(items) if !items.is_empty() => {
            out.push('\n');
            write_sequence(out, items, indent);
        }
        scalar => {
            out.push(' ');
            out.push_str(&inline(scalar));
            out.push('\n');
        }
    }
}

fn inline(value: &Value) -> String {
    match value {
        Value::Null => "null".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => quoted(s),
        Value::Array(_) => "[]".into(),
        Value::Object(_) => "{}".into(),
    }
}

fn pad(out: &mut String, indent: usize) {
    out.extend(std::iter::repeat_n(' ', indent));
}

/// Field names stay plain (`apiVersion:`); anything else, label keys
/// included, is quoted. Words that YAML 1.1 reads as booleans or null
/// are quoted even when they look like field names.
fn mapping_key(key: &str) -> String {
    const SPECIAL: [&str; 11] = [
        "y", "n", "yes", "no", "on", "off", "true", "false", "null", "~", "",
    ];
    let identifier = key.starts_with(|c: char| c.is_ascii_alphabetic())
        && key.chars().all(|c| c.is_ascii_alphanumeric());
    if identifier && !SPECIAL.contains(&key.to_ascii_lowercase().as_str()) {
        key.to_string()
    } else {
        quoted(key)
    }
}

/// A double-quoted scalar. Besides `"` and `\`, escapes every character
/// YAML does not allow raw (C0 and C1 controls, DEL, U+FFFE, U+FFFF) and
/// those YAML 1.1 readers take for line breaks or a byte-order mark
/// (U+0085, U+2028, U+2029, U+FEFF), which would otherwise be folded or
/// dropped. Everything else, non-ASCII text included, stays as written.
pub fn quoted(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if c.is_control()
                || matches!(
                    c,
                    '\u{2028}' | '\u{2029}' | '\u{FEFF}' | '\u{FFFE}' | '\u{FFFF}'
                ) =>
            {
                out.push_str(&format!("\\u{:04X}", u32::from(c)));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn strings_are_always_quoted() {
        for (text, expected) in [
            ("v1", r#""v1""#),
            ("true", r#""true""#),
            ("null", r#""null""#),
            ("0755", r#""0755""#),
            ("1e3", r#""1e3""#),
            ("", r#""""#),
            ("- item", r#""- item""#),
            ("a: b # c", r#""a: b # c""#),
            ("--- x", r#""--- x""#),
            ("&anchor *alias !tag |>", r#""&anchor *alias !tag |>""#),
            (" padded ", r#"" padded ""#),
        ] {
            assert_eq!(quoted(text), expected);
        }
    }

    #[test]
    fn quotes_backslashes_and_line_breaks_are_escaped() {
        assert_eq!(quoted(r#"say "hi""#), r#""say \"hi\"""#);
        assert_eq!(quoted(r"C:\temp\n"), r#""C:\\temp\\n""#);
        assert_eq!(quoted("two\nlines\r\n"), r#""two\nlines\r\n""#);
        assert_eq!(quoted("tab\there"), r#""tab\there""#);
        assert_eq!(
            quoted("nul\0bell\u{7}del\u{7f}"),
            r#""nul\u0000bell\u0007del\u007F""#
        );
        assert_eq!(
            quoted("nel\u{85}ls\u{2028}ps\u{2029}bom\u{FEFF}x\u{FFFF}"),
            r#""nel\u0085ls\u2028ps\u2029bom\uFEFFx\uFFFF""#
        );
    }

    #[test]
    fn unicode_text_stays_readable() {
        assert_eq!(quoted("Daten für Zürich"), "\"Daten für Zürich\"");
        assert_eq!(quoted("データ 💾"), "\"データ 💾\"");
    }

    #[test]
    fn keys_are_plain_only_when_they_are_field_names() {
        assert_eq!(mapping_key("apiVersion"), "apiVersion");
        assert_eq!(mapping_key("fsType"), "fsType");
        assert_eq!(mapping_key("sparse-volume/uuid"), r#""sparse-volume/uuid""#);
        assert_eq!(mapping_key("on"), r#""on""#);
        assert_eq!(mapping_key("Yes"), r#""Yes""#);
        assert_eq!(mapping_key("y"), r#""y""#);
        assert_eq!(mapping_key("1st"), r#""1st""#);
        assert_eq!(mapping_key(""), r#""""#);
    }

    #[test]
    fn nested_blocks_are_indented() {
        let value = json!({
            "kind": "X",
            "list": [
                { "a": "1", "b": ["x", "y"] },
                "plain",
                [],
                {},
            ],
            "map": { "k": { "deep": true }, "n": 5, "none": null },
            "empty": {},
        });
        assert_eq!(
            document(&value),
            concat!(
                "---\n",
                "empty: {}\n",
                "kind: \"X\"\n",
                "list:\n",
                "  - a: \"1\"\n",
                "    b:\n",
                "      - \"x\"\n",
                "      - \"y\"\n",
                "  - \"plain\"\n",
                "  - []\n",
                "  - {}\n",
                "map:\n",
                "  k:\n",
                "    deep: true\n",
                "  \"n\": 5\n",
                "  none: null\n",
            )
        );
    }

    #[test]
    fn sequences_of_sequences_nest() {
        assert_eq!(
            document(&json!([["a"], "b"])),
            "---\n-\n  - \"a\"\n- \"b\"\n"
        );
    }
}
