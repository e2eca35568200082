//! The rendering against golden files in `tests/list_layout/`, from a
//! made-up report (every number fixed). `SPARSE_VOLUME_BLESS=1` rewrites
//! the files after a deliberate change; review the diff.

use std::path::PathBuf;

use crate::commands::inspecting::list::table::render;
use crate::commands::inspecting::list::terminal::{width, Style};
use crate::commands::inspecting::list::{ListReport, RegistryErrorRow};
use crate::engine::capacity::{BackingFs, StorageRootUsage};
use crate::engine::inspect::VolumeInfo;
use crate::kernel::block_stat::IoCounters;

const G: u64 = 1 << 30;
const M: u64 = 1 << 20;

struct Spec {
    uuid: &'static str,
    name: Option<&'static str>,
    fs: Option<&'static str>,
    size: u64,
    allocated: Option<u64>,
    enabled: bool,
    read_only: bool,
    device: Option<&'static str>,
    active: &'static str,
    fast: bool,
}

const SPEC: Spec = Spec {
    uuid: "",
    name: None,
    fs: Some("ext4"),
    size: 20 * G,
    allocated: Some(0),
    enabled: true,
    read_only: false,
    device: None,
    active: "inactive",
    fast: false,
};

/// A detached ext4 volume with this UUID, for other modules' tests.
pub(in crate::commands::inspecting::list) fn volume_info(uuid: &'static str) -> VolumeInfo {
    volume(Spec { uuid, ..SPEC })
}

fn volume(spec: Spec) -> VolumeInfo {
    let directory = if spec.fast {
        "/srv/fast"
    } else {
        "/var/lib/sparse-volume"
    };
    let block = spec.fs.is_none();
    let device = spec.device.map(|d| PathBuf::from(format!("/dev/{d}")));
    VolumeInfo {
        uuid: spec.uuid.to_string(),
        name: spec.name.map(str::to_string),
        origin: None,
        replaces_unit: None,
        encryption: None,
        mode: if block { "block" } else { "filesystem" },
        fs_type: spec.fs.map(str::to_string),
        size: spec.size,
        allocated: spec.allocated,
        path: PathBuf::from(format!("{directory}/{}", spec.uuid)),
        enabled: spec.enabled,
        read_only: spec.read_only,
        partition: device
            .as_ref()
            .filter(|_| block)
            .map(|d| PathBuf::from(format!("{}p1", d.display()))),
        device,
        link: PathBuf::from(format!(
            "/dev/disk/{}/{}",
            if block { "by-partuuid" } else { "by-uuid" },
            spec.uuid
        )),
        link_state: "missing",
        link_target: None,
        io: spec.device.map(|_| IoCounters {
            reads: 40,
            read_bytes: 3 << 19,
            read_time_ms: 12,
            writes: 900,
            written_bytes: spec.allocated.unwrap_or(0) / 2,
            write_time_ms: 2400,
            discards: 0,
            discarded_bytes: 0,
            discard_time_ms: 0,
            in_flight: 0,
            io_time_ms: 2000,
        }),
        fs_health: None,
        unit: format!("sparse-volume@{}.service", spec.uuid),
        active_state: spec.active.to_string(),
        sub_state: match spec.active {
            "active" => "exited",
            "failed" => "failed",
            _ => "dead",
        }
        .to_string(),
        unit_result: Some("success".to_string()),
        attach_missed: Some(false),
        backing_fs: Some(std::sync::Arc::new(BackingFs {
            directory: PathBuf::from(directory),
            free: if spec.fast { 2 * G } else { 412 * G },
            total: if spec.fast { 50 * G } else { 931 * G },
            committed_growth: if spec.fast { 7 * G } else { 96 * G },
            volumes: Vec::new(),
            short: spec.fast,
        })),
        problems: Vec::new(),
        needs_root: None,
        device_read_only: None,
    }
}

/// Ten volumes on two storage roots, one of them short of space, and a
/// registry file that does not read.
fn report(wide: bool) -> ListReport {
    let volumes = vec![
        volume(Spec {
            uuid: "0b6f3a52-8d1e-4c07-9f7a-2e5c1d8b4a90",
            name: Some("postgres-data"),
            allocated: Some(2577 * M),
            device: Some("loop3"),
            active: "active",
            ..SPEC
        }),
        // A snapshot of it, listed under it.
        VolumeInfo {
            origin: Some("0b6f3a52-8d1e-4c07-9f7a-2e5c1d8b4a90".into()),
            ..volume(Spec {
                uuid: "0c7a4b63-9e2f-4d18-a08b-3f6d2e9c5b01",
                name: Some("postgres-data-before-upgrade"),
                allocated: Some(12 * M),
                enabled: false,
                read_only: true,
                ..SPEC
            })
        },
        volume(Spec {
            uuid: "1c2d3e4f-5a6b-4c7d-8e9f-0a1b2c3d4e5f",
            fs: None,
            size: 10 * G,
            allocated: Some(6 * M),
            device: Some("loop7"),
            active: "active",
            ..SPEC
        }),
        volume(Spec {
            uuid: "1c2d3e4f-9999-4c7d-8e9f-0a1b2c3d4e5f",
            fs: None,
            size: 10 * G,
            ..SPEC
        }),
        volume(Spec {
            uuid: "2a7e9c14-3f5b-4d6e-8a1c-9b0d2e4f6a8c",
            name: Some("logs"),
            fs: Some("xfs"),
            size: 320 * M,
            allocated: Some(M / 2),
            read_only: true,
            ..SPEC
        }),
        volume(Spec {
            uuid: "3b8f0d25-4a6c-4e7f-9b2d-0c1e3f5a7b9d",
            name: Some("scratch"),
            size: 64 * M,
            allocated: Some(2 * M),
            enabled: false,
            ..SPEC
        }),
        volume(Spec {
            uuid: "4c9a1e36-5b7d-4f80-8c3e-1d2f4a6b8c0e",
            name: Some("kafka-0"),
            size: 100 * G,
            allocated: None,
            active: "failed",
            fast: true,
            ..SPEC
        }),
        volume(Spec {
            uuid: "5d0b2f47-6c8e-4091-9d4f-2e3a5b7c9d1f",
            name: Some("cache"),
            size: 5 * G,
            allocated: Some(5 * G),
            device: Some("loop12"),
            active: "active",
            fast: true,
            ..SPEC
        }),
        volume(Spec {
            uuid: "6e1c3a58-7d9f-41a2-8e5a-3f4b6c8d0e2a",
            name: Some("cache"),
            size: 3 * G / 2,
            allocated: Some(G),
            fast: true,
            ..SPEC
        }),
        volume(Spec {
            uuid: "7f2d4b69-8e0a-42b3-9f6b-4a5c7d9e1f3b",
            name: Some(
                "analytics warehouse replica for the reporting cluster in zone b (do not delete)",
            ),
            size: 1536 * G,
            allocated: Some(700 * G),
            device: Some("loop5"),
            active: "active",
            ..SPEC
        }),
        volume(Spec {
            uuid: "8a3e5c70-9f1b-43c4-8a7c-5b6d8e0f2a4c",
            name: Some("データベース"),
            size: 8 * G,
            allocated: Some(8 * G - 1),
            device: Some("loop6"),
            active: "active",
            ..SPEC
        }),
    ];
    ListReport {
        changed: false,
        volumes,
        errors: vec![RegistryErrorRow {
            file: "/etc/sparse-volume/volumes.d/9b4f6d81-0a2c-44d5-9b8d-6c7e9f1a3b5d.toml".into(),
            line: Some(3),
            reason: "size -512 must be positive".into(),
        }],
        systemd_error: None,
        storage_roots: vec![
            StorageRootUsage {
                storage_root: PathBuf::from("/var/lib/sparse-volume"),
                also: Vec::new(),
                free: 412 * G,
                total: 931 * G,
                committed_growth: 96 * G,
                volumes: 7,
                warn_headroom: 0,
            },
            StorageRootUsage {
                storage_root: PathBuf::from("/srv/fast"),
                also: Vec::new(),
                free: 2 * G,
                total: 50 * G,
                committed_growth: 7 * G,
                volumes: 3,
                warn_headroom: 0,
            },
        ],
        other_file_systems: Vec::new(),
        volume_warnings: Vec::new(),
        wide,
    }
}

fn golden(name: &str, actual: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/list_layout")
        .join(name);
    if std::env::var_os("SPARSE_VOLUME_BLESS").is_some() {
        std::fs::write(&path, format!("{actual}\n")).expect("writing the golden file");
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    assert_eq!(
        actual,
        expected.strip_suffix('\n').unwrap_or(&expected),
        "{name} changed; after a deliberate change run with SPARSE_VOLUME_BLESS=1 and review the diff"
    );
}

fn at(columns: usize) -> Style {
    Style {
        colour: false,
        columns,
    }
}

#[test]
fn compact_listing_matches_the_golden_file() {
    let text = render(&report(false), &at(100));
    golden("compact-100.txt", &text);
    for line in text.lines().filter(|l| !l.starts_with("error: ")) {
        assert!(width(line) <= 100, "{} columns: {line}", width(line));
    }
}

#[test]
fn a_narrower_terminal_cuts_names_not_columns() {
    let text = render(&report(false), &at(80));
    golden("compact-80.txt", &text);
    let table: Vec<&str> = text.lines().take(12).collect();
    assert!(table.iter().all(|l| width(l) <= 80), "{text}");
    // Every row still shows its state: nothing but the name was cut.
    assert_eq!(
        table.iter().filter(|l| l.ends_with("attached")).count(),
        5,
        "{text}"
    );
}

#[test]
fn wide_listing_is_the_full_table() {
    golden("wide.txt", &render(&report(true), &at(100)));
}

#[test]
fn colour_marks_states_without_moving_columns() {
    let colour = Style {
        colour: true,
        columns: 100,
    };
    let painted = render(&report(false), &colour);
    assert!(painted.contains("\x1b[32mattached\x1b[0m"), "{painted}");
    assert!(painted.contains("\x1b[1;31mfailed\x1b[0m"), "{painted}");
    assert!(painted.contains("\x1b[33mdetached\x1b[0m"), "{painted}");
    assert!(painted.contains("\x1b[2mdisabled\x1b[0m"), "{painted}");
    let stripped = strip_escapes(&painted);
    assert_eq!(stripped, render(&report(false), &at(100)));
    assert!(!render(&report(false), &at(100)).contains('\x1b'));
}

fn strip_escapes(text: &str) -> String {
    let mut out = String::new();
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            for d in chars.by_ref() {
                if d == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[test]
fn nothing_registered_says_so() {
    let mut empty = report(false);
    empty.volumes.clear();
    empty.errors.clear();
    assert_eq!(render(&empty, &at(100)), "no volumes are registered");
    let mut broken = report(false);
    broken.volumes.clear();
    let text = render(&broken, &at(100));
    assert!(
        text.starts_with("error: "),
        "no header without rows: {text}"
    );
    assert_eq!(text.lines().count(), 1, "{text}");
}
