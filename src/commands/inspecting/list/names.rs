//! `sparse-volume list --names`: every registered volume's UUID and name,
//! one per line, for scripts and the shell completions. Only the registry
//! is read (no device, no systemd), so a completion costs a few small file
//! reads; a registry file that does not read is left out here (`list`
//! says why).

use serde::Serialize;

use crate::commands::report::{Failure, Outcome, Report};
use crate::registry::Registry;

#[derive(Debug, Serialize)]
pub struct NamesReport {
    /// Always false: listing changes nothing.
    pub changed: bool,
    pub volumes: Vec<Named>,
}

#[derive(Debug, Serialize)]
pub struct Named {
    pub uuid: String,
    pub name: Option<String>,
}

pub fn names(registry: &Registry) -> Outcome<NamesReport> {
    let entries = registry.entries().map_err(Failure::Unchanged)?;
    let volumes = entries
        .into_iter()
        .filter_map(|entry| entry.volume.ok())
        .map(|volume| Named {
            uuid: volume.id.to_string(),
            name: volume.name,
        })
        .collect();
    Ok(NamesReport {
        changed: false,
        volumes,
    })
}

impl Report for NamesReport {
    /// Each UUID and each name on a line of its own, sorted: words a
    /// shell can offer as they are.
    fn human(&self) -> String {
        let mut words: Vec<&str> = self
            .volumes
            .iter()
            .flat_map(|v| std::iter::once(v.uuid.as_str()).chain(v.name.as_deref()))
            .collect();
        words.sort_unstable();
        words.dedup();
        words.join("\n")
    }
}
