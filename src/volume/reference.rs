//! How a command names a volume: by UUID, or by the name it was given.
//! A name is an identity too (config management converges a volume by
//! name without knowing its UUID), so it must never be mistaken for a
//! UUID, and must name one volume only.

use std::fmt;
use std::str::FromStr;

use uuid::Uuid;

use crate::volume::id::VolumeId;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VolumeRef {
    Id(VolumeId),
    Name(String),
}

impl FromStr for VolumeRef {
    type Err = String;

    /// Anything that reads as a UUID is one, and must then be canonical:
    /// a non-canonical spelling is a mistake, not a name.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if Uuid::try_parse(text).is_ok() {
            return text.parse().map(VolumeRef::Id);
        }
        check_name_as_reference(text)?;
        Ok(VolumeRef::Name(text.to_string()))
    }
}

impl VolumeRef {
    /// The name the volume was given by, if it was named that way.
    pub fn name(&self) -> Option<&str> {
        match self {
            VolumeRef::Name(name) => Some(name),
            VolumeRef::Id(_) => None,
        }
    }
}

impl fmt::Display for VolumeRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VolumeRef::Id(id) => id.fmt(f),
            VolumeRef::Name(name) => write!(f, "{name:?}"),
        }
    }
}

/// The rules a name must follow to be given to a volume, beyond what the
/// registry accepts for a label: an empty name or one that reads as a
/// UUID could never be used to name the volume on the command line.
pub fn check_name_as_reference(name: &str) -> Result<(), String> {
    if name.trim().is_empty() {
        return Err("a volume name must not be empty".into());
    }
    // The registry refuses them in a name, so no volume could have it.
    if name.chars().any(char::is_control) {
        return Err(format!(
            "{name:?} contains control characters, which no volume name has"
        ));
    }
    if Uuid::try_parse(name).is_ok() {
        return Err(format!(
            "the name {name:?} reads as a UUID; a name must not (pass it as the UUID instead)"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_uuid_is_an_id_and_anything_else_a_name() {
        let id = "6f1c2a8e-3b4d-4e5f-8a9b-0c1d2e3f4a5b";
        assert_eq!(
            id.parse::<VolumeRef>(),
            Ok(VolumeRef::Id(id.parse().expect("canonical")))
        );
        assert_eq!(
            "pg-data".parse::<VolumeRef>(),
            Ok(VolumeRef::Name("pg-data".into()))
        );
        // Upper case reads as a UUID, so it is refused, not taken as a name.
        assert!(id.to_uppercase().parse::<VolumeRef>().is_err());
        assert!("".parse::<VolumeRef>().is_err());
        assert!(" ".parse::<VolumeRef>().is_err());
    }
}
