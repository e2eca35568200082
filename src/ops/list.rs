//! `sparse-volume list`: every registered volume, one row each, plus one
//! error row per registry file that does not read. Exits 1 when there is
//! such a row (the generator skips that volume at boot, so it will not
//! come back), but still shows every volume that reads.

use anyhow::Result;
use serde::Serialize;

use super::inspect::{inspect, yes_no, UnitLookup, VolumeInfo, UNKNOWN};
use super::Report;
use crate::capacity::{backing_file_systems, backing_fs_of, BackingFs};
use crate::paths::SystemRoot;
use crate::registry::{Registry, RegistryError};
use crate::size::format_size;
use crate::systemd::Systemd;

#[derive(Debug, Serialize)]
pub struct ListReport {
    /// Always false: listing changes nothing.
    pub changed: bool,
    pub volumes: Vec<VolumeInfo>,
    /// Registry files that failed to parse or validate.
    pub errors: Vec<RegistryErrorRow>,
    /// Null when systemd answered; otherwise why unit states are `unknown`.
    pub systemd_error: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct RegistryErrorRow {
    pub file: String,
    /// 1-based line of the problem, null when it concerns the whole file.
    pub line: Option<usize>,
    pub reason: String,
}

impl From<&RegistryError> for RegistryErrorRow {
    fn from(error: &RegistryError) -> Self {
        Self {
            file: error.file_for_display(),
            line: error.line,
            reason: error.reason.clone(),
        }
    }
}

pub fn list(root: &SystemRoot) -> Result<ListReport> {
    let registry = Registry::open(root.clone());
    let entries = registry.entries()?;
    let (mut systemd, mut systemd_error) = connect_for_reading(!entries.is_empty());
    let valid: Vec<_> = entries
        .iter()
        .filter_map(|e| e.volume.as_ref().ok().cloned())
        .collect();
    let file_systems = backing_file_systems(root, &valid);
    let mut volumes = Vec::new();
    let mut errors = Vec::new();
    for entry in &entries {
        match &entry.volume {
            Ok(volume) => {
                let lookup = UnitLookup::ask(systemd.as_ref(), volume);
                if let UnitLookup::Failed(error) = &lookup {
                    // Stop asking: one slow answer is enough to wait for.
                    systemd_error = Some(error.clone());
                    systemd = None;
                }
                volumes.push(inspect(root, volume, lookup).with_backing_fs(backing_fs_of(
                    root,
                    &file_systems,
                    volume,
                )));
            }
            Err(error) => errors.push(RegistryErrorRow::from(error)),
        }
    }
    Ok(ListReport {
        changed: false,
        volumes,
        errors,
        systemd_error,
    })
}

/// Reading never requires systemd: without it, unit states are unknown.
pub(super) fn connect_for_reading(needed: bool) -> (Option<Systemd>, Option<String>) {
    if !needed {
        return (None, None);
    }
    match Systemd::connect() {
        Ok(systemd) => (Some(systemd), None),
        Err(e) => (None, Some(format!("{e:#}"))),
    }
}

impl Report for ListReport {
    fn human(&self) -> String {
        if self.volumes.is_empty() && self.errors.is_empty() {
            return "no volumes are registered".to_string();
        }
        let header = [
            "UUID", "NAME", "MODE", "SIZE", "ALLOC", "ENABLED", "DEVICE", "UNIT", "PATH",
        ];
        let mut rows: Vec<Vec<String>> = vec![header.iter().map(|h| h.to_string()).collect()];
        for v in &self.volumes {
            rows.push(vec![
                v.uuid.clone(),
                v.name.clone().unwrap_or_else(|| "-".into()),
                v.mode.to_string(),
                format_size(v.size),
                format!(
                    "{}{}",
                    v.allocated.map_or(UNKNOWN.to_string(), format_size),
                    if short(v) { " !" } else { "" }
                ),
                yes_no(v.enabled),
                v.partition
                    .as_ref()
                    .or(v.device.as_ref())
                    .map_or("-".to_string(), |d| d.display().to_string()),
                v.unit_state(),
                v.path.display().to_string(),
            ]);
        }
        let mut lines = table(&rows);
        let mut short_file_systems: Vec<&BackingFs> = Vec::new();
        for fs in self.volumes.iter().filter_map(|v| v.backing_fs.as_ref()) {
            if fs.short
                && !short_file_systems
                    .iter()
                    .any(|s| s.directory == fs.directory)
            {
                short_file_systems.push(fs);
            }
        }
        for fs in short_file_systems {
            lines.push(format!(
                "! {} has {} free, but its volumes may still grow by {}: writes inside them fail once it is full",
                fs.directory.display(),
                format_size(fs.free),
                format_size(fs.committed_growth)
            ));
        }
        for error in &self.errors {
            lines.push(format!(
                "error: {}{}: {}",
                error.file,
                error.line.map_or(String::new(), |l| format!(":{l}")),
                error.reason
            ));
        }
        lines.join("\n")
    }

    fn warnings(&self) -> Vec<String> {
        let mut warnings: Vec<String> = self
            .volumes
            .iter()
            .flat_map(|v| v.problems.iter().map(move |p| format!("{}: {p}", v.uuid)))
            .collect();
        if let Some(error) = &self.systemd_error {
            warnings.push(format!("unit states are unknown: {error}"));
        }
        warnings
    }

    fn succeeded(&self) -> bool {
        self.errors.is_empty()
    }
}

/// Whether the volume's backing file system has less free space than its
/// volumes may still grow into (marked `!` in the listing).
fn short(volume: &VolumeInfo) -> bool {
    volume.backing_fs.as_ref().is_some_and(|fs| fs.short)
}

/// Left-aligned columns, two spaces apart; the last column is not padded.
fn table(rows: &[Vec<String>]) -> Vec<String> {
    let columns = rows.first().map_or(0, Vec::len);
    let widths: Vec<usize> = (0..columns)
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    rows.iter()
        .map(|row| {
            let mut line = String::new();
            for (c, cell) in row.iter().enumerate() {
                if c + 1 == columns {
                    line.push_str(cell);
                } else {
                    line.push_str(&format!("{cell:<width$}  ", width = widths[c]));
                }
            }
            line.trim_end().to_string()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_aligns_columns_and_leaves_the_last_unpadded() {
        let rows = vec![
            vec!["A".to_string(), "BB".to_string(), "C".to_string()],
            vec!["aaa".to_string(), "b".to_string(), "cc".to_string()],
        ];
        assert_eq!(table(&rows), vec!["A    BB  C", "aaa  b   cc"]);
    }
}
