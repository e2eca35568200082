//! Sizes as people write them (`--size 10G`, `reserve = "1GiB"`).
//!
//! Properties: `parse_size` accepts exactly `DIGITS [. DIGITS] [SPACE]
//! [UNIT]` (with surrounding white space, the unit in any case) where that
//! makes whole bytes, and returns the exact value, or an error on
//! overflow, checked against an independent computation in u128; every
//! u64 written in digits, and in each unit it is a whole multiple of,
//! parses back to itself; `format_size` renders a value within the
//! rounding of its one decimal.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sparse_volume::volume::size::{format_size, parse_size};

/// The multiplier a unit spelling means (coreutils' rules, any case), or
/// None.
fn unit(suffix: &str) -> Option<u128> {
    let suffix = suffix.to_ascii_uppercase();
    if suffix.is_empty() || suffix == "B" {
        return Some(1);
    }
    let mut chars = suffix.chars();
    let letter = chars.next()?;
    let power = "KMGTPE".find(letter)? as u32 + 1;
    match chars.as_str() {
        "" | "I" | "IB" => Some(1024u128.pow(power)),
        "B" => Some(1000u128.pow(power)),
        _ => None,
    }
}

/// What `text` means, computed without `parse_size`'s code: DIGITS
/// [. DIGITS] [SPACE] [UNIT], whole bytes only.
fn expected(text: &str) -> Option<u64> {
    let trimmed = text.trim();
    let number_end = trimmed
        .bytes()
        .position(|b| !b.is_ascii_digit() && b != b'.')
        .unwrap_or(trimmed.len());
    let (number, rest) = trimmed.split_at(number_end);
    let mut parts = number.split('.');
    let whole = parts.next()?;
    let fraction = parts.next();
    if whole.is_empty() || fraction == Some("") || parts.next().is_some() {
        return None;
    }
    // Trailing zeros of the fraction change nothing, however many.
    let fraction = fraction.unwrap_or("").trim_end_matches('0');
    let all = format!("{whole}{fraction}");
    let significant = all.trim_start_matches('0');
    // Both refuse as too large what u128 cannot hold: 39 or more
    // significant digits, or a fraction of 39 or more places (10^39 is
    // beyond u128), although a rare such input would make whole bytes
    // (0.000000000001818989403545856475830078125T is 2): nobody writes
    // a size so.
    let number: u128 = if significant.is_empty() {
        0
    } else {
        significant.parse().ok()?
    };
    let product = number.checked_mul(unit(rest.trim())?)?;
    let scale = 10u128.checked_pow(u32::try_from(fraction.len()).ok()?)?;
    if product % scale != 0 {
        return None;
    }
    u64::try_from(product / scale).ok()
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
