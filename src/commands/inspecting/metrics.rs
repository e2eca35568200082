//! `sparse-volume metrics`: the Prometheus text exposition format, printed
//! or written atomically for node_exporter's textfile collector. The
//! numbers are `list`'s (one truth for people and for monitoring: sizes,
//! states, each attached volume's I/O counters), plus each storage root's
//! file system and what the last `check` found.
//!
//! Writing the textfile is what the metrics timer does every minute, so
//! that is also where a storage root crossing its `warn_headroom` is
//! logged: once per crossing, remembered in the run directory.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::Serialize;

use crate::commands::inspecting::check::LastCheck;
use crate::commands::inspecting::list::{listing, ListReport};
use crate::commands::report::{Failure, Outcome, Report};
use crate::engine::capacity::StorageRootUsage;
use crate::engine::inspect::VolumeInfo;
use crate::kernel::block_stat::IoCounters;
use crate::kernel::files::{replace_for_readers, write_atomically};
use crate::registry::paths::SystemRoot;
use crate::registry::run_dir;
use crate::registry::Registry;

/// The file node_exporter's textfile collector reads (it reads `*.prom`;
/// the temporary of an atomic write ends in `.tmp`, so it is never read).
pub const TEXTFILE_NAME: &str = "sparse_volume.prom";
/// Storage roots under pressure at the last textfile write, one per line.
const PRESSURE_STATE_FILE: &str = "space-pressure";

/// Everything one exposition is made of: `list`'s report (its volumes
/// and storage roots) and the last check's summary.
struct Snapshot {
    listing: ListReport,
    last_check: Option<LastCheck>,
}

fn snapshot(registry: &Registry) -> Result<Snapshot> {
    Ok(Snapshot {
        listing: listing(registry, false)?,
        last_check: LastCheck::read(registry.root()),
    })
}

/// The exposition, for `metrics` without `--textfile`.
pub fn render(registry: &Registry) -> Outcome<String> {
    Ok(exposition(&snapshot(registry).map_err(Failure::Unchanged)?))
}

#[derive(Debug, Serialize)]
pub struct TextfileReport {
    pub changed: bool,
    pub path: PathBuf,
    pub volumes: usize,
    /// Storage roots whose headroom is below `warn_headroom` (or zero).
    pub under_pressure: Vec<PathBuf>,
}

impl Report for TextfileReport {
    fn human(&self) -> String {
        format!("wrote {} ({} volumes)", self.path.display(), self.volumes)
    }
}

/// Writes `DIR/sparse_volume.prom` (DIR: `directory`, or config.toml's
/// `metrics_textfile_directory`) and logs storage roots that crossed
/// their threshold since the last write.
pub fn write_textfile(registry: &Registry, directory: Option<&Path>) -> Outcome<TextfileReport> {
    write(registry, directory).map_err(Failure::Unchanged)
}

fn write(registry: &Registry, directory: Option<&Path>) -> Result<TextfileReport> {
    let root = registry.root();
    let directory = match directory {
        Some(directory) => directory.to_path_buf(),
        None => root.host_path(&registry.config().metrics_textfile_directory),
    };
    let snapshot = snapshot(registry)?;
    let path = directory.join(TEXTFILE_NAME);
    // node_exporter runs as its own user: the file must be readable.
    write_atomically(&path, exposition(&snapshot).as_bytes(), 0o644)
        .with_context(|| format!("writing {}", path.display()))?;
    let under_pressure = log_pressure_crossings(root, &snapshot.listing.storage_roots);
    Ok(TextfileReport {
        changed: true,
        path,
        volumes: snapshot.listing.volumes.len(),
        under_pressure,
    })
}

/// Logs a warning for each storage root that went under pressure since
/// the previous call (and an info line for each that recovered), so a
/// timer running every minute warns once per crossing, not every minute.
fn log_pressure_crossings(root: &SystemRoot, usages: &[StorageRootUsage]) -> Vec<PathBuf> {
    let now: Vec<&StorageRootUsage> = usages.iter().filter(|u| u.under_pressure()).collect();
    let state_file = root.run_dir().join(PRESSURE_STATE_FILE);
    // Two writers at once must not both see "not yet warned".
    let _lock = match run_dir::lock(root, "metrics.lock") {
        Ok(lock) => lock,
        Err(e) => {
            tracing::debug!("not tracking space pressure: {e:#}");
            return now.iter().map(|u| u.storage_root.clone()).collect();
        }
    };
    let before: BTreeSet<PathBuf> = std::fs::read_to_string(&state_file)
        .unwrap_or_default()
        .lines()
        .filter(|line| !line.is_empty())
        .map(PathBuf::from)
        .collect();
    for usage in &now {
        if !before.contains(&usage.storage_root) {
            tracing::warn!("{}", usage.pressure_message());
        }
    }
    for storage_root in &before {
        if !now.iter().any(|u| &u.storage_root == storage_root) {
            tracing::info!(
                "storage root {} is no longer short of space",
                storage_root.display()
            );
        }
    }
    let text: String = now
        .iter()
        .map(|u| format!("{}\n", u.storage_root.display()))
        .collect();
    if let Err(e) = replace_for_readers(&state_file, text.as_bytes(), 0o644) {
        tracing::debug!("cannot remember space pressure: {e:#}");
    }
    now.iter().map(|u| u.storage_root.clone()).collect()
}

/// Prometheus text format 0.0.4: `# HELP`/`# TYPE` once per metric, then
/// its samples.
fn exposition(snapshot: &Snapshot) -> String {
    let mut out = Exposition::default();
    out.gauge(
        "sparse_volume_info",
        "Version of sparse-volume that wrote these metrics.",
        vec![(labels(&[("version", env!("CARGO_PKG_VERSION"))]), 1)],
    );

    let volumes = &snapshot.listing.volumes;
    let per_volume = |value: &dyn Fn(&VolumeInfo) -> Option<i128>| {
        volumes
            .iter()
            .filter_map(|v| value(v).map(|x| (volume_labels(v), x)))
            .collect::<Vec<_>>()
    };
    out.gauge(
        "sparse_volume_size_bytes",
        "Registered size of the volume.",
        per_volume(&|v| Some(i128::from(v.size))),
    );
    out.gauge(
        "sparse_volume_allocated_bytes",
        "Bytes the backing file occupies on its file system.",
        per_volume(&|v| v.allocated.map(i128::from)),
    );
    out.gauge(
        "sparse_volume_attached",
        "1 when the backing file is attached to a loop device.",
        per_volume(&|v| Some(flag(v.device.is_some()))),
    );
    out.gauge(
        "sparse_volume_enabled",
        "1 when the volume is attached at boot.",
        per_volume(&|v| Some(flag(v.enabled))),
    );
    out.gauge(
        "sparse_volume_attach_missed",
        "1 when the volume is enabled, not attached, and this boot should have attached it (its unit failed, runs without the device, or is inactive although the volume was registered before the boot); 0 for one created since the boot or skipped by the kernel command line; absent when systemd cannot be asked.",
        per_volume(&|v| v.attach_missed.map(flag)),
    );
    out.gauge(
        "sparse_volume_encrypted",
        "1 when the volume is encrypted (LUKS2 in its backing file, unlocked at boot by its key file).",
        per_volume(&|v| Some(flag(v.encryption.is_some()))),
    );
    out.gauge(
        "sparse_volume_read_only",
        "1 when the volume is attached read-only.",
        per_volume(&|v| Some(flag(v.read_only))),
    );
    out.gauge(
        "sparse_volume_unit_active",
        "1 when the volume's sparse-volume@.service is active; absent when systemd cannot be asked.",
        per_volume(&|v| match v.active_state.as_str() {
            crate::engine::inspect::UNKNOWN => None,
            state => Some(flag(state == "active")),
        }),
    );
    io_families(&mut out, volumes);
    out.gauge(
        "sparse_volume_fs_read_only",
        "1 when the volume's mounted file system is read-only (mounted so, or turned read-only after an error); mounted filesystem volumes only.",
        per_volume(&|v| v.fs_health.as_ref().map(|h| flag(h.read_only))),
    );
    out.gauge(
        "sparse_volume_fs_shut_down",
        "1 when the kernel shut the volume's mounted file system down after an error (xfs does so where ext4 turns read-only): every access to it fails until it is unmounted; mounted filesystem volumes only.",
        per_volume(&|v| v.fs_health.as_ref().map(|h| flag(h.shut_down))),
    );
    out.gauge(
        "sparse_volume_fs_errors",
        "Errors the volume's ext4 file system recorded in its superblock, kept across mounts until e2fsck clears them; mounted ext4 volumes only.",
        per_volume(&|v| v.fs_health.as_ref()?.errors.map(i128::from)),
    );
    out.gauge(
        "sparse_volume_fs_last_error_timestamp_seconds",
        "When the volume's ext4 file system recorded its last error (Unix time); only where it recorded one.",
        per_volume(&|v| v.fs_health.as_ref()?.last_error_time.map(i128::from)),
    );
    out.gauge(
        "sparse_volume_systemd_up",
        "1 when systemd answered for the unit states.",
        vec![(
            String::new(),
            flag(snapshot.listing.systemd_error.is_none()),
        )],
    );

    let per_root = |value: &dyn Fn(&StorageRootUsage) -> i128| {
        snapshot
            .listing
            .storage_roots
            .iter()
            .map(|u| {
                (
                    labels(&[("storage_root", &u.storage_root.display().to_string())]),
                    value(u),
                )
            })
            .collect::<Vec<_>>()
    };
    out.gauge(
        "sparse_volume_backing_fs_size_bytes",
        "Size of the file system holding a storage root.",
        per_root(&|u| i128::from(u.total)),
    );
    out.gauge(
        "sparse_volume_backing_fs_free_bytes",
        "Free bytes on it for unprivileged writers.",
        per_root(&|u| i128::from(u.free)),
    );
    out.gauge(
        "sparse_volume_backing_fs_committed_growth_bytes",
        "What the sparse volumes on it may still grow into (size minus allocated).",
        per_root(&|u| i128::from(u.committed_growth)),
    );
    out.gauge(
        "sparse_volume_backing_fs_headroom_bytes",
        "Free bytes left once every volume on it has grown to its size; negative when they cannot all grow.",
        per_root(&|u| i128::from(u.headroom())),
    );
    out.gauge(
        "sparse_volume_backing_fs_warn_headroom_bytes",
        "The warn_headroom threshold of config.toml for this file system (0 when unset).",
        per_root(&|u| i128::from(u.warn_headroom)),
    );
    out.gauge(
        "sparse_volume_backing_fs_volumes",
        "Registered volumes whose backing file is on it.",
        per_root(&|u| u.volumes as i128),
    );

    out.gauge(
        "sparse_volume_registry_errors",
        "Registry files that do not read (those volumes are skipped at boot).",
        vec![(String::new(), snapshot.listing.errors.len() as i128)],
    );
    if let Some(last) = &snapshot.last_check {
        out.gauge(
            "sparse_volume_check_timestamp_seconds",
            "When sparse-volume check last ran (Unix time).",
            vec![(String::new(), i128::from(last.finished))],
        );
        out.gauge(
            "sparse_volume_check_findings",
            "Findings of the last sparse-volume check that were not repaired, by kind and severity.",
            last.counts
                .iter()
                .map(|c| {
                    (
                        labels(&[("kind", &c.kind), ("severity", &c.severity)]),
                        i128::from(c.count),
                    )
                })
                .collect(),
        );
    }
    out.text
}

/// A family of I/O series: its name between `sparse_volume_` and its
/// suffix, what it counts, and the counter it is read from.
type IoFamily = (&'static str, &'static str, fn(&IoCounters) -> u64);

/// What the loop device of each attached volume did since its attach, as
/// node_exporter's disk collector names it (which skips loop devices, and
/// could only name them by a number that changes at every attach).
fn io_families(out: &mut Exposition, volumes: &[VolumeInfo]) {
    const SINCE: &str =
        "since the volume's loop device was attached (the whole device in block mode); \
        a new attach starts again at 0, which rate() and increase() take as a counter reset";
    let per_volume = |value: &dyn Fn(&IoCounters) -> u64| {
        volumes
            .iter()
            .filter_map(|v| v.io.as_ref().map(|io| (volume_labels(v), value(io))))
            .collect::<Vec<_>>()
    };
    let counters: [IoFamily; 6] = [
        ("reads_completed", "Read requests completed", |io| io.reads),
        ("writes_completed", "Write requests completed", |io| {
            io.writes
        }),
        ("discards_completed", "Discard requests completed", |io| {
            io.discards
        }),
        ("read_bytes", "Bytes read", |io| io.read_bytes),
        ("written_bytes", "Bytes written", |io| io.written_bytes),
        ("discarded_bytes", "Bytes discarded", |io| {
            io.discarded_bytes
        }),
    ];
    for (name, what, value) in counters {
        out.counter(
            &format!("sparse_volume_{name}_total"),
            &format!("{what} {SINCE}."),
            per_volume(&value),
        );
    }
    let times: [IoFamily; 4] = [
        (
            "read_time",
            "Seconds spent by read requests (summed over the requests)",
            |io| io.read_time_ms,
        ),
        (
            "write_time",
            "Seconds spent by write requests (summed over the requests)",
            |io| io.write_time_ms,
        ),
        (
            "discard_time",
            "Seconds spent by discard requests (summed over the requests)",
            |io| io.discard_time_ms,
        ),
        (
            "io_time",
            "Seconds during which the device had requests in flight",
            |io| io.io_time_ms,
        ),
    ];
    for (name, what, milliseconds) in times {
        out.counter_seconds(
            &format!("sparse_volume_{name}_seconds_total"),
            &format!("{what} {SINCE}."),
            per_volume(&milliseconds),
        );
    }
    out.gauge(
        "sparse_volume_io_now",
        "I/O requests in flight on the volume's loop device.",
        per_volume(&|io| io.in_flight)
            .into_iter()
            .map(|(labels, value)| (labels, i128::from(value)))
            .collect(),
    );
}

fn flag(value: bool) -> i128 {
    i128::from(value)
}

fn volume_labels(volume: &VolumeInfo) -> String {
    labels(&[
        ("uuid", &volume.uuid),
        ("name", volume.name.as_deref().unwrap_or("")),
        ("mode", volume.mode),
    ])
}

/// `{a="1",b="2"}` with values escaped as the text format requires.
fn labels(pairs: &[(&str, &str)]) -> String {
    let inner: Vec<String> = pairs
        .iter()
        .map(|(name, value)| format!("{name}=\"{}\"", escape_label_value(value)))
        .collect();
    format!("{{{}}}", inner.join(","))
}

fn escape_label_value(value: &str) -> String {
    let mut escaped = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => escaped.push_str("\\\\"),
            '"' => escaped.push_str("\\\""),
            '\n' => escaped.push_str("\\n"),
            c => escaped.push(c),
        }
    }
    escaped
}

#[derive(Default)]
struct Exposition {
    text: String,
}

impl Exposition {
    fn gauge(&mut self, name: &str, help: &str, samples: Vec<(String, i128)>) {
        self.family(name, help, "gauge", samples);
    }

    fn counter(&mut self, name: &str, help: &str, samples: Vec<(String, u64)>) {
        self.family(name, help, "counter", samples);
    }

    /// A counter of seconds from the kernel's milliseconds, printed
    /// exactly (`1.234`, never a rounded float).
    fn counter_seconds(&mut self, name: &str, help: &str, milliseconds: Vec<(String, u64)>) {
        let samples = milliseconds
            .into_iter()
            .map(|(labels, ms)| (labels, Seconds(ms)))
            .collect();
        self.family(name, help, "counter", samples);
    }

    /// A metric without samples is left out: a `# TYPE` line alone says
    /// nothing and some parsers reject it.
    fn family<V: std::fmt::Display>(
        &mut self,
        name: &str,
        help: &str,
        kind: &str,
        samples: Vec<(String, V)>,
    ) {
        if samples.is_empty() {
            return;
        }
        let _ = writeln!(self.text, "# HELP {name} {help}");
        let _ = writeln!(self.text, "# TYPE {name} {kind}");
        for (labels, value) in samples {
            let _ = writeln!(self.text, "{name}{labels} {value}");
        }
    }
}

/// Milliseconds shown as seconds with three decimals.
struct Seconds(u64);

impl std::fmt::Display for Seconds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{:03}", self.0 / 1000, self.0 % 1000)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(
            labels(&[("name", "a\"b\\c\nd"), ("mode", "block")]),
            r#"{name="a\"b\\c\nd",mode="block"}"#
        );
    }

    #[test]
    fn samples_are_exact_integers() {
        let mut out = Exposition::default();
        out.gauge(
            "x_bytes",
            "h",
            vec![
                (String::new(), 18_014_398_509_481_985),
                (labels(&[("a", "b")]), -3),
            ],
        );
        assert_eq!(
            out.text,
            "# HELP x_bytes h\n# TYPE x_bytes gauge\nx_bytes 18014398509481985\nx_bytes{a=\"b\"} -3\n"
        );
        let mut seconds = Exposition::default();
        seconds.counter_seconds(
            "t_seconds_total",
            "h",
            vec![(String::new(), 1_234), (String::new(), 7)],
        );
        assert_eq!(
            seconds.text,
            "# HELP t_seconds_total h\n# TYPE t_seconds_total counter\nt_seconds_total 1.234\nt_seconds_total 0.007\n"
        );
        let mut empty = Exposition::default();
        empty.gauge("y", "h", Vec::new());
        assert_eq!(empty.text, "");
    }
}
