//! Sizes as people write them (`--size 10G`, `reserve = "1GiB"`).
//!
//! Properties: `parse_size` accepts exactly `DIGITS [SPACE] [UNIT]` (with
//! surrounding white space) and returns the exact product, or an error on
//! overflow, checked against an independent computation in u128; every
//! u64 written in digits, and in each unit it is a whole multiple of,
//! parses back to itself; `format_size` renders a value within the
//! rounding of its one decimal.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sparse_volume::volume::size::{format_size, parse_size};

/// The multiplier a unit spelling means (coreutils' rules), or None.
fn unit(suffix: &str) -> Option<u128> {
    if suffix.is_empty() || suffix == "b" || suffix == "B" {
        return Some(1);
    }
    let mut chars = suffix.chars();
    let letter = chars.next()?.to_ascii_uppercase();
    let power = "KMGTPE".find(letter)? as u32 + 1;
    match chars.as_str() {
        "" | "i" | "iB" => Some(1024u128.pow(power)),
        "B" => Some(1000u128.pow(power)),
        _ => None,
    }
}

/// What `text` means, computed without `parse_size`'s code.
fn expected(text: &str) -> Option<u64> {
    let trimmed = text.trim();
    let digits_end = trimmed
        .bytes()
        .position(|b| !b.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (digits, rest) = trimmed.split_at(digits_end);
    if digits.is_empty() {
        return None;
    }
    let significant = digits.trim_start_matches('0');
    if significant.len() > 20 {
        return None;
    }
    let number: u128 = if significant.is_empty() {
        0
    } else {
        significant.parse().ok()?
    };
    let product = number.checked_mul(unit(rest.trim())?)?;
    u64::try_from(product).ok()
}

/// Unit spellings and the power of 1024 they mean.
const UNITS: [(&str, u32); 13] = [
    ("", 0),
    ("K", 1),
    ("M", 2),
    ("G", 3),
    ("T", 4),
    ("P", 5),
    ("E", 6),
    ("KiB", 1),
    ("MiB", 2),
    ("GiB", 3),
    ("TiB", 4),
    ("PiB", 5),
    ("EiB", 6),
];

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        assert_eq!(parse_size(text).ok(), expected(text), "{text:?}");
    }
    let mut raw = [0u8; 8];
    let n = data.len().min(8);
    raw[..n].copy_from_slice(&data[..n]);
    let value = u64::from_le_bytes(raw);
    assert_eq!(parse_size(&value.to_string()), Ok(value));
    assert_eq!(parse_size(&format!(" {value} B ")), Ok(value));
    for (unit, power) in UNITS {
        let factor = 1024u64.pow(power);
        if value % factor == 0 {
            let text = format!("{}{unit}", value / factor);
            assert_eq!(parse_size(&text), Ok(value), "{text}");
            let spaced = format!("{} {unit}", value / factor);
            assert_eq!(parse_size(&spaced), Ok(value), "{spaced}");
        }
    }
    let shown = format_size(value);
    let (number, unit_name) = shown.split_once(' ').expect("number and unit");
    let scale = match unit_name {
        "B" => 1.0,
        "KiB" => 1024f64,
        "MiB" => 1024f64.powi(2),
        "GiB" => 1024f64.powi(3),
        "TiB" => 1024f64.powi(4),
        "PiB" => 1024f64.powi(5),
        other => panic!("unit {other} in {shown}"),
    };
    let number: f64 = number.parse().expect("a decimal number");
    if unit_name == "B" {
        assert!(value < 1024 && number == value as f64, "{shown}");
    } else {
        assert!(number >= 1.0, "{shown}");
        let error = (number * scale - value as f64).abs();
        // One decimal: off by at most half a tenth of the unit.
        assert!(
            error <= 0.05 * scale * (1.0 + 1e-9),
            "{value} shown as {shown}"
        );
    }
});
