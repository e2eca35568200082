//! The listing's footer: one line per file system that holds (or may
//! hold) backing files, with its free space against what its volumes may
//! still grow into.

use crate::commands::inspecting::list::cells::size;
use crate::commands::inspecting::list::terminal::{Paint, Style};
use crate::engine::capacity::StorageRootUsage;

/// `/var/lib/sparse-volume: 40G free of 100G; 12 volumes may grow by 30G: 10G to spare`,
/// marked `!` when below `warn_headroom` or short, with a second line
/// saying what a shortfall means.
pub fn lines(file_systems: &[&StorageRootUsage], style: &Style) -> Vec<String> {
    let mut lines = Vec::new();
    for usage in file_systems {
        let headroom = usage.headroom();
        let verdict = if headroom < 0 {
            format!("short by {}", size(headroom.unsigned_abs()))
        } else if usage.under_pressure() {
            format!(
                "{} to spare, below warn_headroom {}",
                size(headroom.unsigned_abs()),
                size(usage.warn_headroom)
            )
        } else {
            format!("{} to spare", size(headroom.unsigned_abs()))
        };
        let mark = if !usage.under_pressure() {
            String::new()
        } else if headroom < 0 {
            format!("{} ", style.paint("!", Paint::Red))
        } else {
            format!("{} ", style.paint("!", Paint::Yellow))
        };
        lines.push(format!(
            "{mark}{}: {} free of {}; {} may grow by {}: {verdict}",
            label(usage),
            size(usage.free),
            size(usage.total),
            volumes(usage.volumes),
            size(usage.committed_growth),
        ));
        if headroom < 0 {
            lines.push(
                "  writes inside these volumes fail once the file system is full".to_string(),
            );
        }
    }
    lines
}

/// The storage root, and the others on the same file system.
fn label(usage: &StorageRootUsage) -> String {
    let mut label = usage.storage_root.display().to_string();
    if !usage.also.is_empty() {
        let also: Vec<String> = usage.also.iter().map(|p| p.display().to_string()).collect();
        label.push_str(&format!(" (also {})", also.join(", ")));
    }
    label
}

fn volumes(count: usize) -> String {
    match count {
        1 => "1 volume".to_string(),
        n => format!("{n} volumes"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn usage(free: u64, growth: u64, warn: u64) -> StorageRootUsage {
        StorageRootUsage {
            storage_root: PathBuf::from("/var/lib/sparse-volume"),
            also: Vec::new(),
            free,
            total: 100 << 30,
            committed_growth: growth,
            volumes: 3,
            warn_headroom: warn,
        }
    }

    #[test]
    fn says_what_is_left_or_how_much_is_missing() {
        let plain = Style::plain();
        assert_eq!(
            lines(&[&usage(40 << 30, 30 << 30, 0)], &plain),
            ["/var/lib/sparse-volume: 40G free of 100G; 3 volumes may grow by 30G: 10G to spare"]
        );
        assert_eq!(
            lines(&[&usage(40 << 30, 38 << 30, 5 << 30)], &plain),
            ["! /var/lib/sparse-volume: 40G free of 100G; 3 volumes may grow by 38G: 2G to spare, below warn_headroom 5G"]
        );
        assert_eq!(
            lines(&[&usage(1 << 30, 5 << 30, 0)], &plain),
            [
                "! /var/lib/sparse-volume: 1G free of 100G; 3 volumes may grow by 5G: short by 4G",
                "  writes inside these volumes fail once the file system is full",
            ]
        );
    }

    #[test]
    fn names_every_storage_root_on_the_file_system() {
        let mut shared = usage(40 << 30, 0, 0);
        shared.also.push(PathBuf::from("/srv/volumes"));
        shared.volumes = 1;
        assert_eq!(
            lines(&[&shared], &Style::plain()),
            ["/var/lib/sparse-volume (also /srv/volumes): 40G free of 100G; 1 volume may grow by 0B: 40G to spare"]
        );
    }
}
