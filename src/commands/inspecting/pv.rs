//! `sparse-volume pv`: a Kubernetes local PersistentVolume for a
//! registered volume, so operators stop writing it by hand.
//!
//! The manifest is built once as a JSON value and rendered as JSON or as
//! YAML from that same value, so the two formats cannot drift apart.

mod yaml;

use anyhow::{bail, Context, Result};
use serde_json::{json, Map, Value};

use crate::commands::report::{Failure, Outcome};
use crate::registry::{Registry, Volume};
use crate::volume::id::VolumeId;
use crate::volume::spec::Mode;

/// `spec.persistentVolumeReclaimPolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reclaim {
    Retain,
    Delete,
}

/// How the manifest is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ManifestFormat {
    Yaml,
    Json,
}

/// What to write: one volume (`uuid`) or every enabled one (`None`).
#[derive(Debug, Clone)]
pub struct PvRequest {
    pub uuid: Option<VolumeId>,
    pub storage_class: String,
    pub node: Option<String>,
    pub reclaim: Reclaim,
    pub format: ManifestFormat,
}

/// Carries the volume UUID, so a claim can ask for this very volume
/// (`selector.matchLabels`) and `kubectl get pv -l` can find it.
pub const UUID_LABEL: &str = "sparse-volume/uuid";
/// The volume's free-text name: annotations take any string, labels do not.
pub const NAME_ANNOTATION: &str = "sparse-volume/name";
/// Where the data lives on the node, for whoever has to find it there.
pub const BACKING_FILE_ANNOTATION: &str = "sparse-volume/backing-file";
/// The node label kubelet sets from the host name; the local volume
/// plugin's documentation pins local PVs with it.
const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";
/// The kernel's host name, the nodename uname(2) reports and Go's
/// `os.Hostname` (so kubelet) returns, readable without unsafe code.
const HOSTNAME_FILE: &str = "/proc/sys/kernel/hostname";
/// Label values, and so `kubernetes.io/hostname`, are at most this long.
const MAX_LABEL_VALUE: usize = 63;
/// DNS-1123 subdomains (object names) are at most this long.
const MAX_SUBDOMAIN: usize = 253;

pub fn manifest(registry: &Registry, request: &PvRequest) -> Outcome<String> {
    manifests(registry, request).map_err(Failure::Unchanged)
}

fn manifests(registry: &Registry, request: &PvRequest) -> Result<String> {
    let node = match &request.node {
        Some(node) => {
            if let Err(reason) = check_node_name(node) {
                bail!("--node {node:?} is not a valid Kubernetes node name: {reason}");
            }
            node.clone()
        }
        None => this_node()?,
    };
    if let Err(reason) = check_storage_class(&request.storage_class) {
        bail!(
            "--storage-class {:?} is not a valid StorageClass name: {reason}",
            request.storage_class
        );
    }
    let render = |volume: &Volume| persistent_volume(volume, &node, request);
    match request.uuid {
        Some(id) => {
            let volume = registry.require(&id)?;
            if !volume.enabled {
                tracing::warn!(
                    "volume {id} is disabled: its device does not come up at boot until `sparse-volume enable {id}`"
                );
            }
            Ok(single(&render(&volume), request.format))
        }
        None => {
            let items: Vec<Value> = enabled_volumes(registry)?.iter().map(render).collect();
            Ok(several(&items, request.format))
        }
    }
}

/// Every enabled volume that reads. A broken entry is left out with a
/// warning rather than failing the rest: the generator skips it at boot
/// too, so a PersistentVolume for it would point at a device that never
/// comes.
fn enabled_volumes(registry: &Registry) -> Result<Vec<Volume>> {
    if let Some(problem) = registry.directory_problem() {
        // Every entry is refused; an empty list would read as "no volumes".
        return Err(problem.clone().into());
    }
    let mut volumes = Vec::new();
    for entry in registry.entries()? {
        match entry.volume {
            Ok(volume) if volume.enabled => volumes.push(volume),
            Ok(_) => {}
            Err(error) => tracing::warn!("left out: {error}"),
        }
    }
    Ok(volumes)
}

fn single(object: &Value, format: ManifestFormat) -> String {
    match format {
        ManifestFormat::Yaml => yaml::document(object),
        ManifestFormat::Json => pretty_json(object),
    }
}

/// YAML: one document each (nothing at all for none). JSON: a `v1 List`,
/// the one JSON shape `kubectl apply -f` takes several objects in.
fn several(objects: &[Value], format: ManifestFormat) -> String {
    match format {
        ManifestFormat::Yaml => objects.iter().map(yaml::document).collect(),
        ManifestFormat::Json => pretty_json(&json!({
            "apiVersion": "v1",
            "kind": "List",
            "items": objects,
        })),
    }
}

fn pretty_json(value: &Value) -> String {
    // A Value has string keys only, so rendering it cannot fail.
    let mut text = serde_json::to_string_pretty(value).unwrap_or_default();
    text.push('\n');
    text
}

fn persistent_volume(volume: &Volume, node: &str, request: &PvRequest) -> Value {
    let id = volume.id.to_string();
    let link = volume.consumer_path().display().to_string();
    let mut annotations = Map::new();
    if let Some(name) = &volume.name {
        annotations.insert(NAME_ANNOTATION.into(), name.as_str().into());
    }
    annotations.insert(
        BACKING_FILE_ANNOTATION.into(),
        volume.path.display().to_string().into(),
    );
    let (volume_mode, local) = match &volume.mode {
        // kubelet mounts with this type, and refuses a device whose file
        // system differs (it formats one that has none, with ext4 when no
        // type is given): always say which.
        Mode::Filesystem { fs_type, .. } => (
            "Filesystem",
            json!({ "path": link, "fsType": fs_type.to_string() }),
        ),
        Mode::Block => ("Block", json!({ "path": link })),
    };
    let mut spec = json!({
        "accessModes": [access_mode(volume)],
        "capacity": { "storage": quantity(volume.size) },
        "local": local,
        "nodeAffinity": { "required": { "nodeSelectorTerms": [{
            "matchExpressions": [{
                "key": HOSTNAME_LABEL,
                "operator": "In",
                "values": [node],
            }],
        }]}},
        "persistentVolumeReclaimPolicy": match request.reclaim {
            Reclaim::Retain => "Retain",
            Reclaim::Delete => "Delete",
        },
        "storageClassName": request.storage_class,
        "volumeMode": volume_mode,
    });
    if volume.read_only && !volume.mode.is_block() {
        // kubelet passes these to its mount of the device and, seeing
        // "ro", skips the fsck it runs before read-write mounts, which
        // cannot work on a read-only loop device. Block volumes are never
        // mounted; the device itself refuses writes.
        spec["mountOptions"] = json!(["ro"]);
    }
    json!({
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {
            "name": format!("sparse-volume-{id}"),
            "labels": { UUID_LABEL: id },
            "annotations": annotations,
        },
        "spec": spec,
    })
}

/// Access modes are what claims are matched against, not something
/// kubelet enforces: a read-only device must not be offered to a claim
/// that wants to write. Local volumes live on one node, which is all
/// "Once" and "Many" count.
fn access_mode(volume: &Volume) -> &'static str {
    if volume.read_only {
        "ReadOnlyMany"
    } else {
        "ReadWriteOnce"
    }
}

/// The exact size as a Kubernetes quantity: the largest binary suffix
/// that divides it, else plain bytes. Never rounded, so a claim for the
/// size the volume was created with fits.
pub fn quantity(bytes: u64) -> String {
    const SUFFIXES: [(&str, u32); 6] = [
        ("Ei", 60),
        ("Pi", 50),
        ("Ti", 40),
        ("Gi", 30),
        ("Mi", 20),
        ("Ki", 10),
    ];
    for (suffix, shift) in SUFFIXES {
        let unit = 1u64 << shift;
        if bytes >= unit && bytes.is_multiple_of(unit) {
            return format!("{}{suffix}", bytes >> shift);
        }
    }
    bytes.to_string()
}

/// The name kubelet registers this host under by default (and puts in
/// the `kubernetes.io/hostname` label): the kernel's host name, trimmed
/// and lowercased.
fn this_node() -> Result<String> {
    let text = std::fs::read_to_string(HOSTNAME_FILE)
        .with_context(|| format!("cannot tell this host's name: reading {HOSTNAME_FILE}"))?;
    let node = text.trim().to_lowercase();
    if let Err(reason) = check_node_name(&node) {
        bail!(
            "this host's name {node:?} is not a valid Kubernetes node name ({reason}); \
             pass the name kubelet registered with --node"
        );
    }
    Ok(node)
}

/// A node name that can also be the value of its `kubernetes.io/hostname`
/// label: a DNS-1123 subdomain (node names) of at most 63 characters
/// (label values). The error says why not.
pub fn check_node_name(name: &str) -> Result<(), String> {
    check_subdomain(name)?;
    if name.len() > MAX_LABEL_VALUE {
        return Err(format!(
            "it is {} characters long, and its {HOSTNAME_LABEL} label can hold at most {MAX_LABEL_VALUE}",
            name.len()
        ));
    }
    Ok(())
}

/// Empty means "no class" (the claim must ask for `""` too); anything
/// else names a StorageClass, whose names are DNS-1123 subdomains.
fn check_storage_class(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Ok(());
    }
    check_subdomain(name)
}

/// Kubernetes' rule for object names: lowercase letters, digits, `-`
/// and `.`, dot-separated parts that start and end with a letter or
/// digit, at most 253 characters.
fn check_subdomain(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("it is empty".into());
    }
    if name.len() > MAX_SUBDOMAIN {
        return Err(format!("it is longer than {MAX_SUBDOMAIN} characters"));
    }
    let good_part = |part: &str| {
        let alphanumeric = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
        part.starts_with(alphanumeric)
            && part.ends_with(alphanumeric)
            && part.chars().all(|c| alphanumeric(c) || c == '-')
    };
    if !name.split('.').all(good_part) {
        return Err("it must be lowercase letters, digits, '-' and '.', \
             with a letter or digit at the start, the end and around every '.'"
            .into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_are_exact() {
        assert_eq!(quantity(64 << 20), "64Mi");
        assert_eq!(quantity(10 << 30), "10Gi");
        assert_eq!(quantity(1536 << 20), "1536Mi");
        assert_eq!(quantity(3 << 40), "3Ti");
        assert_eq!(quantity(2 << 50), "2Pi");
        assert_eq!(quantity(1 << 60), "1Ei");
        assert_eq!(quantity(4096), "4Ki");
        // Not a whole KiB: bytes, never a rounded or decimal quantity.
        assert_eq!(quantity(1536), "1536");
        assert_eq!(quantity(512), "512");
        assert_eq!(quantity((10 << 30) + 512), "10737418752");
        assert_eq!(quantity(i64::MAX as u64 - 511), "9223372036854775296");
    }

    #[test]
    fn node_names_follow_kubernetes_rules() {
        for good in ["vm", "node-1", "worker-7.example.com", "a", &"a".repeat(63)] {
            assert!(check_node_name(good).is_ok(), "{good:?} refused");
        }
        for bad in [
            "",
            "Node1",
            "node_1",
            "-node",
            "node-",
            "node..a",
            ".node",
            "node.",
            "nöde",
            "node 1",
            &"a".repeat(64),
        ] {
            assert!(check_node_name(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn storage_classes_are_object_names_or_empty() {
        assert!(check_storage_class("").is_ok());
        assert!(check_storage_class("local-storage").is_ok());
        assert!(check_storage_class(&"a".repeat(253)).is_ok());
        assert!(check_storage_class(&"a".repeat(254)).is_err());
        assert!(check_storage_class("Local").is_err());
        assert!(check_storage_class("local storage").is_err());
    }
}
