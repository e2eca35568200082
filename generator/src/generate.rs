//! The generator (systemd.generator(7)): the registry's volumes as
//! drop-ins in the output directory, and the enabled ones as links.
//!
//! It reads the registry's text and nothing else (no backing file, no
//! device, no D-Bus: `/var` may not even be mounted yet), and it never
//! fails the boot because of the registry: a bad volume file is logged and
//! skipped, a bad `config.toml` is logged and the built-in defaults apply,
//! unknown keys are logged and ignored. Only failing to write the output
//! directory is an error. The kernel command line's emergency switch
//! (`sparse_volume=off`, `sparse_volume.skip=`) leaves volumes out.

use std::path::Path;
use std::process::ExitCode;

use sparse_volume::registry::paths::SystemRoot;
use sparse_volume::registry::Registry;
use sparse_volume::systemd::kernel_cmdline::{EmergencySwitch, Skip};

use crate::kmsg::Kmsg;
use crate::output;
use crate::units::{Generated, Outputs, Plan};

/// `early_dir` gets the masks of units that volumes were taken over from
/// (it overrides `/etc`); without one (a single directory given, as tests
/// and `systemd-analyze` do) they go to `normal_dir` too.
pub fn generate(normal_dir: &Path, early_dir: Option<&Path>) -> ExitCode {
    let root = SystemRoot::from_env();
    let log = Kmsg::open(root.is_overridden());

    let switch = EmergencySwitch::read(&root);
    for problem in switch.problems() {
        log.warning(&format!("kernel command line: {problem}"));
    }
    // Before the registry is even read: the switch is how an operator gets
    // past a registry or a volume that breaks the boot.
    if switch.is_off() {
        log.warning(&format!("{}: no volume units generated", Skip::Off));
        return ExitCode::SUCCESS;
    }
    let mut unmatched_skips: Vec<_> = switch.skipped().collect();

    let registry = Registry::open(root);
    if let Some(problem) = registry.config_problem() {
        log.warning(&format!("{problem}; using built-in defaults"));
    }
    for warning in registry.config_warnings() {
        log.warning(&warning.to_string());
    }
    let entries = match registry.entries() {
        Ok(entries) => entries,
        Err(e) => {
            log.error(&format!("{e:#}; no volume units generated"));
            return ExitCode::SUCCESS;
        }
    };

    let mut plan = Plan::default();
    for entry in entries {
        for warning in &entry.warnings {
            log.warning(&warning.to_string());
        }
        let volume = match entry.volume {
            Ok(volume) => volume,
            Err(e) => {
                log.warning(&format!("{e}; volume skipped"));
                continue;
            }
        };
        let skipped = volume.enabled && switch.skips(&volume.id).is_some();
        if skipped {
            unmatched_skips.retain(|id| *id != volume.id);
        }
        if let Err(reason) = plan.add_volume(&volume) {
            log.warning(&format!(
                "{}: {reason}; volume skipped",
                entry.file.display()
            ));
            continue;
        }
        if skipped {
            log.warning(&format!("volume {} skipped: {}", volume.id, Skip::Listed));
        } else if volume.enabled {
            plan.attach_at_boot(&volume);
        }
    }

    for id in unmatched_skips {
        // Most likely a typo, and then the volume the operator meant to
        // keep out of this boot is still attached.
        log.warning(&format!(
            "{}: {id} is not an enabled volume in the registry; nothing skipped for it",
            Skip::Listed.switch()
        ));
    }

    let Generated { mut normal, early } = plan.finish(registry.config());
    let early_dir = match early_dir {
        Some(dir) => dir,
        None => {
            normal.extend(early);
            return write(&log, normal_dir, &normal);
        }
    };
    // The masks first: a unit taken over must not start again because the
    // volumes' own outputs failed to write.
    match write(&log, early_dir, &early) {
        ExitCode::SUCCESS => write(&log, normal_dir, &normal),
        failed => failed,
    }
}

fn write(log: &Kmsg, dir: &Path, outputs: &Outputs) -> ExitCode {
    match output::write_all(dir, outputs) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            log.error(&format!("writing units to {}: {e:#}", dir.display()));
            ExitCode::FAILURE
        }
    }
}
