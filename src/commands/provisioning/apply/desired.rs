//! The state `apply` converges a volume to, from flags or from one JSON
//! object or TOML document on stdin. Both end in [`Desired`], checked by
//! the same rules, so a playbook and a shell line mean the same thing.

use std::path::PathBuf;

use serde::Deserialize;

use crate::registry::check_replaced_unit;
use crate::volume::id::VolumeId;
use crate::volume::reference::{check_name_as_reference, parse_uuid_any_case, VolumeRef};
use crate::volume::size::parse_size;
use crate::volume::spec::ModeKind;
use crate::volume::spec::{FsType, SECTOR_SIZES};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    #[default]
    Present,
    Absent,
}

/// `None` everywhere means "as it is" for an existing volume and the
/// default for a new one.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Desired {
    pub state: State,
    pub uuid: Option<VolumeId>,
    pub name: Option<String>,
    pub size: Option<u64>,
    pub mode: Option<ModeKind>,
    pub fs_type: Option<FsType>,
    pub path: Option<PathBuf>,
    pub enabled: Option<bool>,
    pub read_only: Option<bool>,
    pub preallocate: Option<bool>,
    pub sector_size: Option<u32>,
    pub mkfs_options: Option<Vec<String>>,
    /// LUKS2 inside the backing file of a new volume (`create --encrypt`);
    /// an existing volume must be encrypted (true) or not (false).
    pub encrypt: Option<bool>,
    /// With `encrypt`: the operator's key file, by path (its content never
    /// passes through a document or a command line); by default `create`
    /// makes one in the keys directory.
    pub key_file: Option<PathBuf>,
    /// Made as a clone of this volume (when it does not exist yet); an
    /// existing volume must be its clone.
    pub clone_of: Option<VolumeRef>,
    /// For a clone on storage without reflink, of a mounted source.
    pub freeze_during_copy: bool,
    /// The existing file at `path` is registered (never made) and taken
    /// over from this unit (`register --replaces-unit`).
    pub replaces_unit: Option<String>,
    pub delete_data: bool,
    pub now: bool,
}

/// What a document may say. Config-management modules send every option,
/// unset ones as null, so every key takes null.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Document {
    state: Option<State>,
    uuid: Option<String>,
    name: Option<String>,
    /// Bytes or text ("10G"); read as a TOML value whichever the
    /// document is, to say what is wrong with anything else.
    size: Option<toml::Value>,
    mode: Option<String>,
    fs_type: Option<FsType>,
    path: Option<PathBuf>,
    enabled: Option<bool>,
    read_only: Option<bool>,
    preallocate: Option<bool>,
    sector_size: Option<u32>,
    mkfs_options: Option<Vec<String>>,
    encrypt: Option<bool>,
    key_file: Option<PathBuf>,
    clone_of: Option<String>,
    freeze_during_copy: Option<bool>,
    replaces_unit: Option<String>,
    delete_data: Option<bool>,
    now: Option<bool>,
}

impl Desired {
    /// A JSON object (text starting with `{`) or a TOML document.
    pub fn from_document(text: &str) -> Result<Self, String> {
        let document: Document = if text.trim_start().starts_with('{') {
            serde_json::from_str(text).map_err(|e| format!("the JSON document on stdin: {e}"))?
        } else {
            toml::from_str(text).map_err(|e| format!("the TOML document on stdin: {e}"))?
        };
        let mode = document.mode.as_deref().map(str::parse).transpose()?;
        let size = match document.size {
            None => None,
            Some(toml::Value::Integer(bytes)) => {
                Some(u64::try_from(bytes).map_err(|_| format!("size {bytes} is not a size"))?)
            }
            Some(toml::Value::String(text)) => Some(parse_size(&text)?),
            Some(other) => {
                return Err(format!(
                    "size {other} is neither a whole number of bytes nor text such as \"10G\""
                ))
            }
        };
        let desired = Self {
            state: document.state.unwrap_or_default(),
            uuid: document
                .uuid
                .map(|text| parse_uuid_any_case(&text))
                .transpose()?,
            name: document.name,
            size,
            mode,
            fs_type: document.fs_type,
            path: document.path,
            enabled: document.enabled,
            read_only: document.read_only,
            preallocate: document.preallocate,
            sector_size: document.sector_size,
            mkfs_options: document.mkfs_options,
            encrypt: document.encrypt,
            key_file: document.key_file,
            clone_of: document
                .clone_of
                .map(|text| text.parse::<VolumeRef>())
                .transpose()?,
            freeze_during_copy: document.freeze_during_copy.unwrap_or(false),
            replaces_unit: document.replaces_unit,
            delete_data: document.delete_data.unwrap_or(false),
            now: document.now.unwrap_or(false),
        };
        desired.check()?;
        Ok(desired)
    }

    /// The rules flags and documents share (clap enforces some of them for
    /// flags already; a document needs them all).
    pub fn check(&self) -> Result<(), String> {
        if self.uuid.is_none() && self.name.is_none() {
            return Err("say which volume: a uuid, a name, or both".into());
        }
        if let Some(name) = &self.name {
            check_name_as_reference(name)?;
        }
        if self.size == Some(0) {
            return Err("the size must be greater than zero".into());
        }
        if let Some(size) = self.sector_size.filter(|s| !SECTOR_SIZES.contains(s)) {
            return Err(format!("sector_size {size} is not supported (512 or 4096)"));
        }
        if self.mode == Some(ModeKind::Block)
            && (self.fs_type.is_some() || self.mkfs_options.as_ref().is_some_and(|o| !o.is_empty()))
        {
            return Err("fs_type and mkfs_options are only valid in filesystem mode".into());
        }
        if self.key_file.is_some() && self.encrypt != Some(true) {
            return Err(
                "key_file is the key of an encrypted volume: it needs encrypt = true".into(),
            );
        }
        if self.clone_of.is_some() {
            if self.name.is_none() {
                return Err("a clone needs a name (it is how a repeated apply finds it)".into());
            }
            let made_by_clone = [
                ("mode", self.mode.is_some()),
                ("fs_type", self.fs_type.is_some()),
                ("path", self.path.is_some()),
                ("preallocate", self.preallocate.is_some()),
                ("sector_size", self.sector_size.is_some()),
                ("mkfs_options", self.mkfs_options.is_some()),
                ("encrypt", self.encrypt.is_some()),
                ("key_file", self.key_file.is_some()),
            ];
            if let Some((key, _)) = made_by_clone.iter().find(|(_, set)| *set) {
                return Err(format!(
                    "{key} is the source's in a clone; leave it out with clone_of"
                ));
            }
        }
        if let Some(unit) = &self.replaces_unit {
            check_replaced_unit(unit)?;
            if self.state == State::Absent {
                return Err("replaces_unit is only valid with state present".into());
            }
            if self.clone_of.is_some() {
                return Err("replaces_unit takes over an existing file; a clone is made new (leave out one of clone_of and replaces_unit)".into());
            }
            if self.uuid.is_none() || self.path.is_none() {
                return Err("replaces_unit needs the uuid the file carries and its path".into());
            }
            if self.preallocate.is_some()
                || self.mkfs_options.is_some()
                || self.encrypt.is_some()
                || self.key_file.is_some()
            {
                return Err("preallocate, mkfs_options, encrypt and key_file make a new file; with replaces_unit the file exists".into());
            }
        }
        if self.state == State::Present && self.delete_data {
            return Err("delete_data is only valid with state absent".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_and_toml_say_the_same() {
        let json = r#"{"name": "pg-data", "size": "1G", "fs_type": "xfs", "enabled": false,
                      "uuid": null, "path": null, "now": null, "encrypt": true,
                      "key_file": "/root/pg.key"}"#;
        let toml = "name = \"pg-data\"\nsize = 1073741824\nfs_type = \"xfs\"\nenabled = false\n\
                    encrypt = true\nkey_file = \"/root/pg.key\"\n";
        let from_json = Desired::from_document(json).expect("JSON");
        assert_eq!(from_json, Desired::from_document(toml).expect("TOML"));
        assert_eq!(from_json.size, Some(1 << 30));
        assert_eq!(from_json.state, State::Present);
        assert_eq!(from_json.encrypt, Some(true));
        assert_eq!(from_json.key_file, Some(PathBuf::from("/root/pg.key")));
    }

    #[test]
    fn a_document_is_refused_with_the_reason() {
        for (text, reason) in [
            (r#"{"name": "a", "sise": 1}"#, "unknown field `sise`"),
            (r#"{"size": 1}"#, "say which volume"),
            (
                r#"{"name": "a", "mode": "raw"}"#,
                "is not \"filesystem\" or \"block\"",
            ),
            (r#"{"name": "a", "uuid": "NOT-A-UUID"}"#, "is not a UUID"),
            (
                r#"{"name": "a", "delete_data": true}"#,
                "only valid with state absent",
            ),
            (
                r#"{"name": "a", "mode": "block", "fs_type": "ext4"}"#,
                "only valid in filesystem",
            ),
            (r#"{"name": "a", "size": 0}"#, "greater than zero"),
            (
                r#"{"name": "a", "size": 64.5}"#,
                "neither a whole number of bytes",
            ),
            (r#"{"name": "a", "size": -1}"#, "is not a size"),
            (
                r#"{"name": "a", "replaces_unit": "old@a.service"}"#,
                "needs the uuid the file carries and its path",
            ),
            (
                r#"{"name": "a", "replaces_unit": "sparse-volume@a.service"}"#,
                "own units",
            ),
            (
                r#"{"name": "a", "key_file": "/root/a.key"}"#,
                "needs encrypt = true",
            ),
            (
                r#"{"name": "a", "encrypt": false, "key_file": "/root/a.key"}"#,
                "needs encrypt = true",
            ),
            (
                r#"{"name": "a", "clone_of": "b", "encrypt": true}"#,
                "encrypt is the source's in a clone",
            ),
            (
                r#"{"name": "a", "uuid": "0b6e3c52-4a8e-4f5f-9d8a-2f3c1f2b9e11",
                    "path": "/srv/a", "replaces_unit": "old@a.service", "encrypt": true}"#,
                "with replaces_unit the file exists",
            ),
            (r#"{"name": "a", "encrypt": "yes"}"#, "invalid type"),
        ] {
            let error = Desired::from_document(text).expect_err(text);
            assert!(error.contains(reason), "{text}: {error}");
        }
    }
}
