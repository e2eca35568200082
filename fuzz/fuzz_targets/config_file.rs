//! `config.toml` as an operator may have written it.
//!
//! Properties: parsing never panics; an error or warning names a line of
//! the file; a configuration that parses obeys the rules the rest of the
//! program relies on (at least one normalised absolute storage root other
//! than `/`, each of which holds the paths below it; a finite
//! overcommit ratio >= 1; a reserve below 100%), and parsing is
//! deterministic.
#![no_main]

use std::path::{Component, Path};

use libfuzzer_sys::fuzz_target;
use sparse_volume::registry::{Config, Reserve};

const FILE: &str = "/etc/sparse-volume/config.toml";

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let file = Path::new(FILE);
    let lines = text.lines().count().max(1);
    let (config, warnings) = match Config::parse_with_warnings(file, text) {
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
    for warning in &warnings {
        if let Some(line) = warning.line {
            assert!((1..=lines).contains(&line), "{warning}");
        }
    }
    assert!(!config.storage_roots.is_empty());
    for root in &config.storage_roots {
        assert!(root.is_absolute() && root != Path::new("/"), "{root:?}");
        assert!(
            root.components()
                .skip(1)
                .all(|c| matches!(c, Component::Normal(_))),
            "{root:?}"
        );
        // A root holds what is below it, not itself (nested roots are
        // accepted: then the outer one holds the inner one).
        if let Some(outer) = config.storage_root_of(root) {
            assert!(
                outer != root && root.starts_with(outer),
                "{root:?} in {outer:?}"
            );
        }
        assert!(config.storage_root_of(&root.join("volume")).is_some());
    }
    assert!(config.overcommit_ratio.is_finite() && config.overcommit_ratio >= 1.0);
    if let Reserve::Percent(percent) = config.reserve {
        assert!((0.0..100.0).contains(&percent), "{percent}");
    }
    let again = Config::parse(file, text).expect("parsed once, not twice");
    assert_eq!(again, config);
});
