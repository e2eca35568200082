//! attach's fallbacks for other kernels (no `LOOP_CONFIGURE`, direct I/O
//! refused, a device taken by another program, flags ignored) run here
//! through fault points (`SPARSE_VOLUME_FAULT`), and every outcome is read
//! back from the kernel: sysfs (`loop/dio`, `loop/partscan`, `ro`), the
//! sector size from `blockdev`, and which ioctls ran from `strace`.

mod common;

use std::fs;

use common::{sysfs_flag, tool, Fixture};

struct Case {
    name: &'static str,
    faults: &'static str,
    mode: &'static str,
    sector_size: &'static str,
    /// Registry lines replaced before attaching.
    edits: &'static [(&'static str, &'static str)],
    expect_dio: &'static str,
    expect_ro: &'static str,
    /// An ioctl strace must show, and one it must not.
    expect_ioctl: &'static str,
    forbid_ioctl: Option<&'static str>,
    /// A warning attach must give.
    expect_warning: Option<&'static str>,
}

const CASES: &[Case] = &[
    Case {
        name: "direct I/O on",
        faults: "",
        mode: "filesystem",
        sector_size: "512",
        edits: &[],
        expect_dio: "1",
        expect_ro: "0",
        expect_ioctl: "LOOP_CONFIGURE",
        forbid_ioctl: Some("LOOP_SET_FD"),
        expect_warning: None,
    },
    Case {
        name: "direct I/O off in the registry",
        faults: "",
        mode: "filesystem",
        sector_size: "512",
        edits: &[("direct_io = true", "direct_io = false")],
        expect_dio: "0",
        expect_ro: "0",
        expect_ioctl: "LOOP_CONFIGURE",
        forbid_ioctl: Some("LOOP_SET_FD"),
        expect_warning: None,
    },
    Case {
        name: "kernel without LOOP_CONFIGURE",
        faults: "configure-unsupported",
        mode: "filesystem",
        sector_size: "4096",
        edits: &[],
        expect_dio: "1",
        expect_ro: "0",
        expect_ioctl: "LOOP_SET_FD",
        forbid_ioctl: Some("LOOP_CONFIGURE"),
        expect_warning: None,
    },
    Case {
        name: "kernel without LOOP_CONFIGURE, read-only block volume",
        faults: "configure-unsupported",
        mode: "block",
        sector_size: "512",
        edits: &[("read_only = false", "read_only = true")],
        expect_dio: "1",
        expect_ro: "1",
        expect_ioctl: "LOOP_SET_STATUS64",
        forbid_ioctl: Some("LOOP_CONFIGURE"),
        expect_warning: None,
    },
    Case {
        name: "direct I/O refused by the backing file system",
        faults: "direct-io-refused",
        mode: "filesystem",
        sector_size: "512",
        edits: &[],
        expect_dio: "0",
        expect_ro: "0",
        expect_ioctl: "LOOP_CONFIGURE",
        forbid_ioctl: Some("LOOP_SET_FD"),
        expect_warning: Some("direct I/O"),
    },
    Case {
        name: "device taken by another program twice",
        faults: "device-taken*2",
        mode: "filesystem",
        sector_size: "512",
        edits: &[],
        expect_dio: "1",
        expect_ro: "0",
        expect_ioctl: "LOOP_CONFIGURE",
        forbid_ioctl: None,
        expect_warning: None,
    },
    Case {
        name: "kernel ignores read-only and partition-scan flags",
        faults: "flags-ignored",
        mode: "block",
        sector_size: "512",
        edits: &[("read_only = false", "read_only = true")],
        expect_dio: "1",
        expect_ro: "1",
        expect_ioctl: "LOOP_SET_STATUS64",
        forbid_ioctl: None,
        expect_warning: None,
    },
];

fn run_case(fixture: &Fixture, case: &Case) -> Result<(), String> {
    let created = fixture.run_ok(&[
        "create",
        "--size",
        "64M",
        "--mode",
        case.mode,
        "--sector-size",
        case.sector_size,
        "--json",
    ]);
    let uuid = created.json()["uuid"]
        .as_str()
        .ok_or("create reported no uuid")?
        .to_string();
    let registry = fixture.registry_file(&uuid);
    let mut text = fs::read_to_string(&registry).map_err(|e| e.to_string())?;
    for (from, to) in case.edits {
        if !text.contains(from) {
            return Err(format!("the registry file has no `{from}`:\n{text}"));
        }
        text = text.replace(from, to);
    }
    fs::write(&registry, text).map_err(|e| e.to_string())?;

    let trace = fixture.root.path().join(format!("{uuid}.strace"));
    let command = fixture.command(&["attach", &uuid, "--json"]);
    let program = command.get_program().to_owned();
    let args: Vec<_> = command.get_args().map(|a| a.to_owned()).collect();
    let envs: Vec<_> = command
        .get_envs()
        .filter_map(|(k, v)| Some((k.to_owned(), v?.to_owned())))
        .collect();
    let output = std::process::Command::new("strace")
        .arg("-f")
        .arg("-e")
        .arg("trace=ioctl")
        .arg("-o")
        .arg(&trace)
        .arg(program)
        .args(args)
        .envs(envs)
        .env(sparse_volume::hooks::FAULT_ENV, case.faults)
        .output()
        .map_err(|e| format!("running strace: {e}"))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        return Err(format!(
            "attach failed: {}",
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    let report: serde_json::Value =
        serde_json::from_str(&stdout).map_err(|e| format!("{e}: {stdout}"))?;
    let device = report["device"].as_str().ok_or("no device")?.to_string();
    let result = (|| {
        let ioctls = fs::read_to_string(&trace).map_err(|e| e.to_string())?;
        if !ioctls.contains(case.expect_ioctl) {
            return Err(format!("strace shows no {}", case.expect_ioctl));
        }
        if let Some(forbidden) = case.forbid_ioctl {
            if ioctls.contains(&format!("{forbidden},")) {
                return Err(format!("strace shows {forbidden}"));
            }
        }
        let dio = sysfs_flag(&device, "loop/dio");
        if dio != case.expect_dio {
            return Err(format!("loop/dio is {dio}, expected {}", case.expect_dio));
        }
        let ro = sysfs_flag(&device, "ro");
        if ro != case.expect_ro {
            return Err(format!("ro is {ro}, expected {}", case.expect_ro));
        }
        let partscan = sysfs_flag(&device, "loop/partscan");
        let want_partscan = if case.mode == "block" { "1" } else { "0" };
        if partscan != want_partscan {
            return Err(format!("loop/partscan is {partscan}"));
        }
        let sectors = tool("blockdev", &["--getss", &device]);
        if sectors.trim() != case.sector_size {
            return Err(format!("{} sectors", sectors.trim()));
        }
        if report["direct_io"] != (case.expect_dio == "1") {
            return Err(format!("attach reports direct_io {}", report["direct_io"]));
        }
        // This host's kernel parses no partition tables; attach says so
        // for every block volume, which is not what these cases are about.
        let warnings: Vec<&str> = report["warnings"]
            .as_array()
            .ok_or("no warnings array")?
            .iter()
            .filter_map(|w| w.as_str())
            .filter(|w| !w.contains("no partition device"))
            .collect();
        match case.expect_warning {
            Some(wanted) if !warnings.iter().any(|w| w.contains(wanted)) => {
                Err(format!("no warning about {wanted}: {warnings:?}"))
            }
            None if !warnings.is_empty() => Err(format!("unexpected warnings: {warnings:?}")),
            _ => Ok(()),
        }
    })();
    fixture.run_ok(&["detach", &uuid]);
    result
}

#[test]
fn every_attach_fallback_yields_the_device_the_volume_asks_for() {
    needs_root!();
    let fixture = Fixture::new();
    let mut failures = Vec::new();
    for case in CASES {
        if let Err(why) = run_case(&fixture, case) {
            failures.push(format!("{}: {why}", case.name));
        }
    }
    println!(
        "attach fallbacks: {} cases, {} failures",
        CASES.len(),
        failures.len()
    );
    assert!(failures.is_empty(), "{failures:#?}");
}
