//! Byte sizes as people write them (`10G`, `512M`, `1.5TiB`, `4096`).
//!
//! Suffixes follow coreutils: `K`/`KiB` are powers of 1024, `KB` powers of
//! 1000, so `truncate -s 10G` and `--size 10G` mean the same. The suffix
//! may be written in any case (`10gib`), and the number may have decimals
//! where they make whole bytes (`1.5G`, not `1.3K`).

const EXAMPLES: &str = "examples: 4096, 512M, 1.5G, 10GiB, 1TB";

pub fn parse_size(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(trimmed.len());
    let (number, suffix) = trimmed.split_at(split);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() || (number.contains('.') && fraction.is_empty()) || fraction.contains('.') {
        return Err(format!("{text:?} is not a size ({EXAMPLES})"));
    }
    // Trailing zeros change nothing (`1.50G` is `1.5G`), however many.
    let fraction = fraction.trim_end_matches('0');
    let multiplier = multiplier(suffix.trim()).ok_or_else(|| {
        format!(
            "{text:?} has an unknown unit {:?} (use K, M, G, T, P, E, with or without iB, or KB, MB, … for powers of 1000)",
            suffix.trim()
        )
    })?;
    let too_large = || format!("{text:?} is too large");
    // The exact value in u128: digits without the point, times the unit,
    // divided by the point's power of ten, which must leave nothing over.
    let digits = [whole, fraction].concat();
    let significant = digits.trim_start_matches('0');
    let digits: u128 = if significant.is_empty() {
        0
    } else {
        significant.parse().map_err(|_| too_large())?
    };
    let scale = u32::try_from(fraction.len())
        .ok()
        .and_then(|places| 10u128.checked_pow(places))
        .ok_or_else(too_large)?;
    let bytes = digits
        .checked_mul(u128::from(multiplier))
        .ok_or_else(too_large)?;
    if bytes % scale != 0 {
        return Err(format!(
            "{text:?} is not a whole number of bytes ({EXAMPLES})"
        ));
    }
    u64::try_from(bytes / scale).map_err(|_| too_large())
}

fn multiplier(suffix: &str) -> Option<u64> {
    let mut chars = suffix.chars();
    let Some(first) = chars.next() else {
        return Some(1);
    };
    if suffix.eq_ignore_ascii_case("b") {
        return Some(1);
    }
    let power = "KMGTPE".find(first.to_ascii_uppercase())? as u32 + 1;
    let rest = chars.as_str().to_ascii_lowercase();
    match rest.as_str() {
        "" | "ib" | "i" => 1024u64.checked_pow(power),
        "b" => 1000u64.checked_pow(power),
        _ => None,
    }
}

/// `10.0 GiB`-style rendering for messages.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

const MIB: u64 = 1 << 20;

/// Whole MiB, refusing sizes where rounding up would wrap around.
pub fn round_up_to_mib(size: u64) -> anyhow::Result<u64> {
    size.checked_next_multiple_of(MIB)
        .ok_or_else(|| anyhow::anyhow!("size {size} is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_common_spellings() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("10G"), Ok(10 << 30));
        assert_eq!(parse_size("1TiB"), Ok(1 << 40));
        assert_eq!(parse_size("1 GiB"), Ok(1 << 30));
        assert_eq!(parse_size("2k"), Ok(2048));
        assert_eq!(parse_size("1GB"), Ok(1_000_000_000));
        assert_eq!(parse_size("7B"), Ok(7));
    }

    /// Issue 25, item 15: one grammar, whatever the case of the suffix,
    /// and decimals where they make whole bytes.
    #[test]
    fn suffixes_in_any_case_and_decimals_that_make_whole_bytes() {
        assert_eq!(parse_size("10gib"), Ok(10 << 30));
        assert_eq!(parse_size("10GIB"), Ok(10 << 30));
        assert_eq!(parse_size("10gb"), Ok(10_000_000_000));
        assert_eq!(parse_size("1.5G"), Ok(1536 << 20));
        assert_eq!(parse_size("0.5K"), Ok(512));
        assert_eq!(parse_size("2.25 MiB"), Ok(2_359_296));
        assert_eq!(parse_size("1.5GB"), Ok(1_500_000_000));
        assert_eq!(parse_size(&format!("1.{}K", "0".repeat(40))), Ok(1024));
        assert_eq!(parse_size("1E"), Ok(1 << 60));
        for (bad, reason) in [
            ("1.3K", "whole number of bytes"),
            ("1.5", "whole number of bytes"),
            ("1.", "not a size"),
            (".5G", "not a size"),
            ("1..5G", "not a size"),
        ] {
            let error = parse_size(bad).expect_err(bad);
            assert!(error.contains(reason), "{bad}: {error}");
        }
    }

    #[test]
    fn rejects_nonsense() {
        for bad in [
            "",
            "G",
            "-1G",
            "10X",
            "10GiBs",
            "99999999999999999999",
            "20E",
        ] {
            assert!(parse_size(bad).is_err(), "{bad} was accepted");
        }
    }

    #[test]
    fn errors_stay_on_one_line() {
        for bad in ["1\nX", "x\ny", "99999999999999999999\n"] {
            let error = parse_size(bad).unwrap_err();
            assert!(!error.contains('\n'), "{error}");
        }
    }

    #[test]
    fn formats_for_people() {
        assert_eq!(format_size(512), "512 B");
        assert_eq!(format_size(10 << 30), "10.0 GiB");
        assert_eq!(format_size(1536 << 20), "1.5 GiB");
    }
}
