//! systemd's quoting rules, for the two kinds of text the generator puts
//! into unit names and unit files.

/// `systemd-escape --path PATH`: the unit-name form of a path, as systemd
/// itself derives `blockdev@.target` and mount unit names from device and
/// mount paths. `path` must be normalised (no `.`, `..` or `//`), which
/// holds for the `/dev/disk/by-*` links this is used for.
pub fn unit_name_path_escape(path: &str) -> String {
    let trimmed = path.trim_matches('/');
    if trimmed.is_empty() {
        return "-".to_string();
    }
    let mut out = String::with_capacity(trimmed.len() * 2);
    for (index, byte) in trimmed.bytes().enumerate() {
        match byte {
            b'/' => out.push('-'),
            // A leading dot would make a hidden file name.
            b'.' if index == 0 => push_hex(&mut out, byte),
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b':' | b'_' | b'.' => {
                out.push(char::from(byte))
            }
            _ => push_hex(&mut out, byte),
        }
    }
    out
}

fn push_hex(out: &mut String, byte: u8) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    out.push_str("\\x");
    out.push(char::from(DIGITS[usize::from(byte >> 4)]));
    out.push(char::from(DIGITS[usize::from(byte & 0xf)]));
}

/// One path as a word of a space-separated unit file setting such as
/// `RequiresMountsFor=`: systemd splits the value into words (honouring
/// double quotes and backslash escapes) and then expands `%` specifiers.
///
/// Fails for control characters: a line break cannot be expressed in a
/// unit file setting at all, and the others are not worth the risk.
pub fn unit_file_path_word(path: &str) -> Result<String, String> {
    if let Some(bad) = path.chars().find(|c| c.is_control()) {
        return Err(format!(
            "path {path:?} contains the control character {bad:?}, which cannot be written into a unit file"
        ));
    }
    let expanded = path.replace('%', "%%");
    if !expanded.contains([' ', '"', '\'', '\\']) {
        return Ok(expanded);
    }
    let mut out = String::with_capacity(expanded.len() + 4);
    out.push('"');
    for c in expanded.chars() {
        if matches!(c, '"' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_escape_matches_systemd_rules() {
        assert_eq!(
            unit_name_path_escape("/dev/disk/by-uuid/6f1c2a8e-3b4d-4e5f-8a9b-0c1d2e3f4a5b"),
            "dev-disk-by\\x2duuid-6f1c2a8e\\x2d3b4d\\x2d4e5f\\x2d8a9b\\x2d0c1d2e3f4a5b"
        );
        assert_eq!(unit_name_path_escape("/"), "-");
        assert_eq!(unit_name_path_escape("/.a/b c"), "\\x2ea-b\\x20c");
    }

    /// Cross-checks against systemd's own implementation where it exists.
    #[test]
    fn path_escape_agrees_with_systemd_escape() {
        let paths = [
            "/dev/disk/by-uuid/6f1c2a8e-3b4d-4e5f-8a9b-0c1d2e3f4a5b",
            "/dev/disk/by-partuuid/0e2f7c5a-1111-4222-8333-444455556666",
            "/srv/fast disk/.hidden/ä%",
        ];
        for path in paths {
            let Ok(output) = std::process::Command::new("systemd-escape")
                .args(["--path", path])
                .output()
            else {
                eprintln!("systemd-escape is not installed; cross-check skipped");
                return;
            };
            assert!(output.status.success());
            let expected = String::from_utf8_lossy(&output.stdout);
            assert_eq!(unit_name_path_escape(path), expected.trim_end(), "{path}");
        }
    }

    #[test]
    fn plain_paths_stay_plain() {
        assert_eq!(unit_file_path_word("/srv/volumes").unwrap(), "/srv/volumes");
        assert_eq!(unit_file_path_word("/srv/100%").unwrap(), "/srv/100%%");
    }

    #[test]
    fn awkward_paths_are_quoted() {
        assert_eq!(
            unit_file_path_word("/srv/fast disk").unwrap(),
            "\"/srv/fast disk\""
        );
        assert_eq!(
            unit_file_path_word("/srv/a\"b\\c'd").unwrap(),
            "\"/srv/a\\\"b\\\\c'd\""
        );
    }

    #[test]
    fn control_characters_are_refused() {
        for path in ["/srv/a\nb", "/srv/a\tb", "/srv/a\u{7f}"] {
            let err = unit_file_path_word(path).unwrap_err();
            assert!(err.contains("control character"), "{err}");
        }
    }
}
