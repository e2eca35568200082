//! What the registry ignored or could not use, said on every command as
//! warnings on stderr.

use crate::cli::args::Command;
use crate::registry::Registry;
use crate::volume::id::VolumeId;

/// What the registry ignored or could not use, on every command: a typo
/// in a key should be seen long before it matters. `list` shows it for
/// every volume, other commands for the volume they are about; `check`
/// reports all of it among its findings, so once is enough.
pub fn registry_warnings(
    registry: &Registry,
    command: &Command,
    id: Option<&VolumeId>,
) -> Vec<String> {
    if matches!(command, Command::Check { .. }) {
        return Vec::new();
    }
    let mut warnings: Vec<String> = registry
        .config_warnings()
        .iter()
        .map(ToString::to_string)
        .collect();
    if let Some(problem) = registry.config_problem() {
        warnings.push(format!("{problem}; using built-in defaults"));
    }
    let entries = match command {
        // Unreadable volumes.d is list's own error to report.
        Command::List { .. } => registry.entries().unwrap_or_default(),
        _ => id
            .or(command.new_uuid().as_ref())
            .and_then(|id| registry.entry(id))
            .into_iter()
            .collect(),
    };
    for entry in entries {
        warnings.extend(entry.warnings.iter().map(ToString::to_string));
    }
    warnings
}
