//! `sparse-volume volume-names` (hidden): every registered volume's UUID
//! and name, one per line, for the shell completions. Only the registry is
//! read (no device, no systemd), so a completion costs a few small file
//! reads; what cannot be read is left out without a word, since a
//! completion has nowhere to say it.

use crate::registry::Registry;

pub fn volume_names(registry: &Registry) -> String {
    let mut words = Vec::new();
    for volume in registry
        .entries()
        .unwrap_or_default()
        .into_iter()
        .filter_map(|entry| entry.volume.ok())
    {
        words.push(volume.id.to_string());
        words.extend(volume.name);
    }
    words.sort();
    words.dedup();
    words.into_iter().map(|word| word + "\n").collect()
}
