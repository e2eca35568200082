//! A volume file (`volumes.d/<UUID>.toml`) as an operator or an older or
//! newer version may have written it.
//!
//! Properties: parsing never panics; an error names a line of the file;
//! a volume that parses is valid, serialises, and its serialisation parses
//! back to the same volume, without warnings, and serialises identically.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use sparse_volume::registry::{Config, Volume};

/// The seeds use this UUID, so that most mutations get past the
/// file-name check to the rules behind it.
const FILE: &str = "/etc/sparse-volume/volumes.d/6f1c2a8e-3b4d-4e5f-8a9b-0c1d2e3f4a5b.toml";

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let file = Path::new(FILE);
    let config = Config::default();
    let lines = text.lines().count().max(1);
    let parsed = match Volume::parse(file, text, &config) {
        Ok(parsed) => parsed,
        Err(error) => {
            if let Some(line) = error.line {
                assert!(
                    (1..=lines + 1).contains(&line),
                    "{error} (of {lines} lines)"
                );
            }
            assert!(error.to_string().starts_with(FILE));
            return;
        }
    };
    for warning in &parsed.warnings {
        if let Some(line) = warning.line {
            assert!((1..=lines).contains(&line), "{warning}");
        }
    }
    let volume = parsed.volume;
    volume
        .validate()
        .unwrap_or_else(|e| panic!("parsed but invalid: {e}: {volume:?}"));
    let written = volume
        .to_toml()
        .unwrap_or_else(|e| panic!("parsed but not writable: {e}: {volume:?}"));
    let reread = Volume::parse(file, &written, &config)
        .unwrap_or_else(|e| panic!("own output does not parse: {e}\n{written}"));
    assert!(reread.warnings.is_empty(), "own output warns:\n{written}");
    assert_eq!(
        reread.volume, volume,
        "round trip changed the volume:\n{written}"
    );
    assert_eq!(reread.volume.to_toml().as_deref(), Ok(written.as_str()));
});
