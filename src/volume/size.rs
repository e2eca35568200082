//! Byte sizes as people write them (`10G`, `512M`, `1TiB`, `4096`).
//!
//! Suffixes follow coreutils: `K`/`KiB` are powers of 1024, `KB` powers of
//! 1000, so `truncate -s 10G` and `--size 10G` mean the same.

pub fn parse_size(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (digits, suffix) = trimmed.split_at(split);
    if digits.is_empty() {
        return Err(format!(
            "{text:?} is not a size (examples: 4096, 512M, 10G, 1TiB)"
        ));
    }
    let number: u64 = digits
        .parse()
        .map_err(|_| format!("{text:?} is too large"))?;
    let multiplier = multiplier(suffix.trim()).ok_or_else(|| {
        format!(
            "{text:?} has an unknown unit {:?} (use K, M, G, T, P, KiB…, KB…)",
            suffix.trim()
        )
    })?;
    number
        .checked_mul(multiplier)
        .ok_or_else(|| format!("{text:?} is too large"))
}

fn multiplier(suffix: &str) -> Option<u64> {
    let exponent = |letter: char| {
        "KMGTPE"
            .find(letter.to_ascii_uppercase())
            .map(|i| i as u32 + 1)
    };
    let mut chars = suffix.chars();
    let Some(first) = chars.next() else {
        return Some(1);
    };
    if suffix.eq_ignore_ascii_case("b") {
        return Some(1);
    }
    let power = exponent(first)?;
    match chars.as_str() {
        "" | "iB" | "i" => 1024u64.checked_pow(power),
        "B" => 1000u64.checked_pow(power),
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

    #[test]
    fn rejects_nonsense() {
        for bad in [
            "",
            "G",
            "-1G",
            "1.5G",
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
