//! The unit's own work: `attach UUID` is `sparse-volume@UUID.service`'s
//! ExecStart, `detach UUID` its ExecStop. They run the commands that
//! `sparse-volume attach` and `detach` run, print the same lines (the
//! report on stdout, warnings and the failure on stderr, which systemd
//! puts in the unit's journal) and exit 0 or 1, but start in a fraction of
//! the CLI's time: no argument parser, no D-Bus client, and the registry
//! read once (`config.toml` and the volume's own file).

use std::io::Write;
use std::time::Duration;

use sparse_volume::commands::report::{Outcome, Report};
use sparse_volume::commands::running::{attach, detach};
use sparse_volume::registry::paths::SystemRoot;
use sparse_volume::registry::run_dir;
use sparse_volume::registry::Registry;
use sparse_volume::volume::id::VolumeId;

use crate::stderr_log::{self, Priority};

/// The exit status: 0, 1, or 2 for a usage error.
#[derive(Clone, Copy)]
pub enum Status {
    Success = 0,
    Failure = 1,
    Usage = 2,
}

pub fn attach(id: &VolumeId) -> Status {
    let registry = open_registry();
    let outcome = attach::attach(&registry, id);
    if let Ok(report) = &outcome {
        // What the registry ignored in the volume's file, said where the
        // operator looks when the volume misbehaves.
        for warning in &report.registry_warnings {
            stderr_log::line(Priority::Warning, &format!("warning: {warning}"));
        }
    }
    finish(outcome, &format!("attaching {id}"))
}

/// Needs no registry entry: a volume's unit must stop after its
/// configuration is gone.
pub fn detach(id: &VolumeId) -> Status {
    let registry = open_registry();
    finish(detach::detach(&registry, id), &format!("detaching {id}"))
}

/// Within the unit's start and stop timeouts (90 s), leaving room for
/// attach's own wait for udev's link (30 s by default).
const LOCK_WAIT_LIMIT: Duration = Duration::from_secs(45);

fn open_registry() -> Registry {
    stderr_log::init();
    run_dir::bound_lock_waits(LOCK_WAIT_LIMIT);
    let registry = Registry::open(SystemRoot::from_env());
    if let Some(problem) = registry.config_problem() {
        stderr_log::line(
            Priority::Warning,
            &format!("warning: {problem}; using built-in defaults"),
        );
    }
    for warning in registry.config_warnings() {
        stderr_log::line(Priority::Warning, &format!("warning: {warning}"));
    }
    registry
}

/// The report's sentence on stdout, or the failure's one line on stderr.
fn finish<R: Report>(outcome: Outcome<R>, doing: &str) -> Status {
    match outcome {
        Ok(report) => {
            for warning in report.warnings() {
                stderr_log::line(Priority::Warning, &format!("warning: {warning}"));
            }
            // The report is for the journal; a stdout that cannot take it
            // does not undo the attach (`println!` would panic on EPIPE).
            let _ = writeln!(std::io::stdout(), "{}", report.human());
            Status::Success
        }
        Err(failure) => {
            stderr_log::line(Priority::Error, &format!("{doing}: {:#}", failure.error()));
            Status::Failure
        }
    }
}
