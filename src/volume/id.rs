//! The identity of a volume: a canonical (lowercase, hyphenated) UUID.

use std::fmt;
use std::str::FromStr;

use uuid::Uuid;

/// A volume UUID that is known to be in canonical form, so it can be used
/// verbatim in file names, unit instance names and udev link paths.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct VolumeId(Uuid);

impl VolumeId {
    pub fn new(uuid: Uuid) -> Self {
        Self(uuid)
    }

    pub fn uuid(&self) -> Uuid {
        self.0
    }

    /// Appends the canonical form to `out`, without the formatting
    /// machinery: the generator names thousands of volumes per run, and
    /// its `format!`s were a sixth of its instructions.
    pub fn push_to(&self, out: &mut String) {
        let mut text = [0u8; uuid::fmt::Hyphenated::LENGTH];
        out.push_str(self.0.hyphenated().encode_lower(&mut text));
    }

    /// The reference stored in the loop device's `lo_file_name`, so that a
    /// volume's device can be found even when its backing file is gone.
    pub fn loop_reference(&self) -> String {
        format!("{LOOP_REFERENCE_PREFIX}{}", self.0.hyphenated())
    }

    /// The volume a loop device's reference names, if it is one of ours.
    pub fn from_loop_reference(reference: &str) -> Option<Self> {
        reference.strip_prefix(LOOP_REFERENCE_PREFIX)?.parse().ok()
    }
}

const LOOP_REFERENCE_PREFIX: &str = "sparse-volume:";

impl FromStr for VolumeId {
    type Err = String;

    /// Accepts only the canonical form: other spellings of the same UUID
    /// would name different registry files and unit instances.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let uuid = Uuid::try_parse(text).map_err(|_| format!("{text:?} is not a UUID"))?;
        if uuid.hyphenated().to_string() != text {
            return Err(format!(
                "{text:?} is not a canonical UUID (lowercase, hyphenated: {})",
                uuid.hyphenated()
            ));
        }
        if uuid.is_nil() {
            return Err("the nil UUID cannot name a volume".to_string());
        }
        Ok(Self(uuid))
    }
}

impl fmt::Display for VolumeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.hyphenated().fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_only_canonical_form() {
        let canonical = "6f1c2a8e-3b4d-4e5f-8a9b-0c1d2e3f4a5b";
        assert_eq!(
            canonical.parse::<VolumeId>().unwrap().to_string(),
            canonical
        );
        for bad in [
            "6F1C2A8E-3B4D-4E5F-8A9B-0C1D2E3F4A5B",
            "6f1c2a8e3b4d4e5f8a9b0c1d2e3f4a5b",
            "{6f1c2a8e-3b4d-4e5f-8a9b-0c1d2e3f4a5b}",
            "00000000-0000-0000-0000-000000000000",
            "not-a-uuid",
            "",
        ] {
            assert!(bad.parse::<VolumeId>().is_err(), "{bad} was accepted");
        }
    }

    #[test]
    fn errors_stay_on_one_line() {
        for bad in ["6f1c2a8e-3b4d-4e5f-8a9b-0c1d2e3f4a5b\n", "a\nb"] {
            let error = bad.parse::<VolumeId>().unwrap_err();
            assert!(!error.contains('\n'), "{error}");
        }
    }

    #[test]
    fn loop_reference_fits_lo_file_name() {
        let id: VolumeId = "6f1c2a8e-3b4d-4e5f-8a9b-0c1d2e3f4a5b".parse().unwrap();
        // LO_NAME_SIZE is 64 including the terminating NUL.
        assert!(id.loop_reference().len() < 64);
    }
}
