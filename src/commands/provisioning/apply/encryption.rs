//! What `apply` adds to an encrypted volume: the desired `encrypt` and
//! `key_file` handed to `create` (whose comparison with an existing volume,
//! and whose words for the recovery key, apply shares), and the
//! encryption a dry run plans.

use anyhow::{anyhow, Result};

use super::desired::Desired;
use crate::commands::provisioning::create::{CreateReport, EncryptRequest};
use crate::volume::spec::Encryption;

/// What a new volume asks of `create`: `encrypt` left out is a plain
/// volume, as `create` without `--encrypt` makes.
pub fn request(desired: &Desired) -> Option<EncryptRequest> {
    desired
        .encrypt
        .filter(|encrypt| *encrypt)
        .map(|_| EncryptRequest {
            key_file: desired.key_file.clone(),
        })
}

/// The encryption a dry run's create plans (its header UUID is the one
/// that run drew; the real run draws its own, and no report shows it).
pub fn planned(created: &CreateReport) -> Result<Option<Encryption>> {
    let (Some(luks_uuid), Some(key_file)) = (&created.luks_uuid, &created.key_file) else {
        return Ok(None);
    };
    Ok(Some(Encryption {
        luks_uuid: luks_uuid
            .parse()
            .map_err(|e| anyhow!("create planned header UUID {luks_uuid:?}: {e}"))?,
        key_file: key_file.clone(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::provisioning::create::{spec_differences, AskedSpec};
    use crate::registry::Volume;
    use crate::volume::id::VolumeId;
    use crate::volume::spec::{FsType, Mode};
    use std::path::PathBuf;

    fn volume(encryption: Option<Encryption>) -> Volume {
        Volume {
            id: VolumeId::new(uuid::Uuid::new_v4()),
            path: "/var/lib/sparse-volume/a".into(),
            size: 64 << 20,
            mode: Mode::Filesystem {
                fs_type: FsType::Ext4,
                mkfs_options: Vec::new(),
            },
            enabled: true,
            read_only: false,
            direct_io: true,
            preallocated: false,
            name: Some("a".into()),
            sector_size: 512,
            origin: None,
            replaces_unit: None,
            encryption,
        }
    }

    fn desired(encrypt: Option<bool>, key_file: Option<&str>) -> Desired {
        Desired {
            name: Some("a".into()),
            encrypt,
            key_file: key_file.map(PathBuf::from),
            ..Desired::default()
        }
    }

    /// What `apply` says of an existing volume's encryption (through
    /// `create`'s comparison, which both commands share).
    fn differences(existing: &Volume, desired: &Desired) -> Vec<String> {
        spec_differences(
            existing,
            &AskedSpec {
                mode: None,
                fs_type: None,
                mkfs_options: None,
                path: None,
                preallocate: None,
                sector_size: None,
                encrypt: desired.encrypt,
                key_file: desired.key_file.as_deref(),
            },
        )
    }

    #[test]
    fn an_existing_volume_differs_only_in_what_was_asked() {
        let plain = volume(None);
        let encrypted = volume(Some(Encryption {
            luks_uuid: uuid::Uuid::new_v4(),
            key_file: "/etc/sparse-volume/keys/a.key".into(),
        }));
        let none: Vec<String> = Vec::new();
        for (existing, asked, expected) in [
            (&plain, desired(None, None), none.clone()),
            (&plain, desired(Some(false), None), none.clone()),
            (
                &plain,
                desired(Some(true), None),
                vec!["not encrypted (asked to encrypt)".to_string()],
            ),
            (&encrypted, desired(None, None), none.clone()),
            (&encrypted, desired(Some(true), None), none.clone()),
            (
                &encrypted,
                desired(Some(true), Some("/etc/sparse-volume/keys/a.key")),
                none.clone(),
            ),
            (
                &encrypted,
                desired(Some(true), Some("/root/other.key")),
                vec!["key file /etc/sparse-volume/keys/a.key (asked /root/other.key)".to_string()],
            ),
            (
                &encrypted,
                desired(Some(false), None),
                vec!["encrypted (asked not to)".to_string()],
            ),
        ] {
            assert_eq!(
                differences(existing, &asked),
                expected,
                "{:?}",
                (asked.encrypt, &asked.key_file)
            );
        }
    }

    #[test]
    fn only_encrypt_true_asks_create_to_encrypt() {
        assert!(request(&desired(None, None)).is_none());
        assert!(request(&desired(Some(false), None)).is_none());
        let asked = request(&desired(Some(true), Some("/root/k"))).expect("a request");
        assert_eq!(asked.key_file, Some(PathBuf::from("/root/k")));
    }
}
