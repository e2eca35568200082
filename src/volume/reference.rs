//! How a command names a volume: by UUID (in any case), or by anything
//! else the registry resolves (`Registry::resolve`): the name it was
//! given, the beginning of its UUID that `list` shows, its loop device or
//! its backing file's path. A name is an identity too (config management
//! converges a volume by name without knowing its UUID), so it must never
//! be mistaken for any of the others, and must name one volume only.

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

    /// Anything that reads as a UUID is one. The hyphenated form may be
    /// written in any case, as on the kernel command line; other forms
    /// (braces, no hyphens) are a mistake, not a name.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if Uuid::try_parse(text).is_ok() {
            return parse_uuid_any_case(text).map(VolumeRef::Id);
        }
        check_name_as_reference(text)?;
        Ok(VolumeRef::Name(text.to_string()))
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

/// A UUID typed on the command line: the hyphenated form in any case (as
/// on the kernel command line), stored and shown in lower case; braces,
/// a `urn:uuid:` or no hyphens are refused with the form to use.
pub fn parse_uuid_any_case(text: &str) -> Result<VolumeId, String> {
    let lower = text.to_ascii_lowercase();
    match Uuid::try_parse(&lower) {
        Ok(uuid) if uuid.hyphenated().to_string() != lower => Err(format!(
            "{text:?} is a UUID written in a form that is not taken; write it hyphenated: {}",
            uuid.hyphenated()
        )),
        _ => lower.parse(),
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

/// How many characters of a UUID at least name a volume by its beginning:
/// as many as `list` shows for an unnamed volume, and more than a word
/// made of hex digits usually has.
pub const MIN_UUID_PREFIX: usize = 8;

/// Whether `text` could be the beginning of a UUID that names a volume:
/// hex digits, with hyphens exactly where the canonical form has them (so
/// that `2024-01-01` stays a name).
pub fn reads_as_uuid_prefix(text: &str) -> bool {
    (MIN_UUID_PREFIX..36).contains(&text.len())
        && text.chars().enumerate().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => c == '-',
            _ => c.is_ascii_hexdigit(),
        })
}

/// Whether `text` names a loop device or one of its partitions the short
/// way (`loop0`, `loop0p1`), as `lsblk` shows them.
pub fn reads_as_loop_device(text: &str) -> bool {
    let Some(rest) = text.strip_prefix("loop") else {
        return false;
    };
    let (number, partition) = rest.split_once('p').unwrap_or((rest, "0"));
    [number, partition]
        .iter()
        .all(|digits| !digits.is_empty() && digits.chars().all(|c| c.is_ascii_digit()))
}

/// What a name newly given to a volume must also not be: anything a
/// command would read as another way of naming a volume.
pub fn check_name_to_give(name: &str) -> Result<(), String> {
    check_name_as_reference(name)?;
    if name.starts_with('/') {
        return Err(format!(
            "the name {name:?} reads as a path (a backing file or a device names its volume); a name must not start with /"
        ));
    }
    if reads_as_loop_device(name) {
        return Err(format!(
            "the name {name:?} reads as a loop device, which names the volume it holds; choose another name"
        ));
    }
    if reads_as_uuid_prefix(name) {
        return Err(format!(
            "the name {name:?} reads as the beginning of a UUID ({MIN_UUID_PREFIX} or more of its characters), which names the volume whose UUID it begins; choose another name"
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
        // Upper case is the same UUID; braces are a mistake, not a name.
        assert_eq!(
            id.to_uppercase().parse::<VolumeRef>(),
            Ok(VolumeRef::Id(id.parse().expect("canonical")))
        );
        assert!(format!("{{{id}}}").parse::<VolumeRef>().is_err());
        assert!("".parse::<VolumeRef>().is_err());
        assert!(" ".parse::<VolumeRef>().is_err());
    }

    #[test]
    fn names_that_would_read_as_another_reference_are_not_given() {
        for name in ["2183af89", "2183af89-0000", "/srv/pg", "loop7", "loop7p1"] {
            assert!(check_name_to_give(name).is_err(), "{name}");
        }
        for name in [
            "pg-data",
            "cafe",
            "loop",
            "loopy",
            "2183af8",
            "pg-2183af89",
            "2024-01-01",
        ] {
            assert_eq!(check_name_to_give(name), Ok(()), "{name}");
        }
    }
}
