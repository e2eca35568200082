//! sparse-volume-generator: a systemd.generator(7) that turns the registry
//! into `sparse-volume@<UUID>.service` instances at boot and on every
//! daemon-reload.
//!
//! It reads the registry's text and nothing else (no backing file, no
//! device, no D-Bus: `/var` may not even be mounted yet), and it never
//! fails the boot because of the registry: a bad volume file is logged and
//! skipped, a bad `config.toml` is logged and the built-in defaults apply,
//! unknown keys are logged and ignored. Only failing to write the output
//! directory is an error. The kernel command line's emergency switch
//! (`sparse_volume=off`, `sparse_volume.skip=`) leaves volumes out.

mod escape;
mod kmsg;
mod output;
mod units;

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use sparse_volume::registry::paths::SystemRoot;
use sparse_volume::registry::Registry;
use sparse_volume::systemd::kernel_cmdline::{EmergencySwitch, Skip};

use crate::kmsg::Kmsg;
use crate::units::Plan;

const USAGE: &str = "\
usage: sparse-volume-generator NORMAL_DIR [EARLY_DIR LATE_DIR]

A systemd generator (see systemd.generator(7)): systemd passes three output
directories; one directory is accepted for testing (systemd-analyze, tests).
Links and drop-ins go into the first. SPARSE_VOLUME_ROOT=DIR reads the registry
and proc/cmdline below DIR instead of /.

Kernel command line: sparse_volume=off generates no volume units;
sparse_volume.skip=UUID[,UUID...] leaves out those volumes.
";

enum Invocation {
    Generate { normal_dir: PathBuf },
    Help,
}

fn parse_args(args: &[OsString]) -> Result<Invocation, String> {
    match args {
        [flag] if flag == "-h" || flag == "--help" => Ok(Invocation::Help),
        _ if args.iter().any(|a| a.as_bytes().starts_with(b"-")) => {
            Err("options are not supported; expected directories".to_string())
        }
        [normal] | [normal, _, _] => Ok(Invocation::Generate {
            normal_dir: PathBuf::from(normal),
        }),
        _ => Err(format!(
            "expected 1 or 3 output directories, got {}",
            args.len()
        )),
    }
}

fn main() -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    match parse_args(&args) {
        Ok(Invocation::Generate { normal_dir }) => generate(&normal_dir),
        Ok(Invocation::Help) => {
            print!("{USAGE}");
            ExitCode::SUCCESS
        }
        Err(reason) => {
            eprint!("sparse-volume-generator: {reason}\n{USAGE}");
            ExitCode::from(2)
        }
    }
}

fn generate(normal_dir: &Path) -> ExitCode {
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
        match entry.volume {
            Err(e) => log.warning(&format!("{e}; volume skipped")),
            Ok(volume) if !volume.enabled => {}
            Ok(volume) if switch.skips(&volume.id).is_some() => {
                unmatched_skips.retain(|id| *id != volume.id);
                log.warning(&format!("volume {} skipped: {}", volume.id, Skip::Listed));
            }
            Ok(volume) => {
                if let Err(reason) = plan.add_volume(&volume) {
                    log.warning(&format!(
                        "{}: {reason}; volume skipped",
                        entry.file.display()
                    ));
                }
            }
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

    match output::write_all(normal_dir, &plan.finish(registry.config())) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            log.error(&format!("writing units to {}: {e:#}", normal_dir.display()));
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Invocation, String> {
        parse_args(&args.iter().map(OsString::from).collect::<Vec<_>>())
    }

    #[test]
    fn accepts_one_or_three_directories() {
        for args in [&["/run/a"][..], &["/run/a", "/run/b", "/run/c"]] {
            match parse(args) {
                Ok(Invocation::Generate { normal_dir }) => {
                    assert_eq!(normal_dir, PathBuf::from("/run/a"))
                }
                _ => panic!("{args:?} refused"),
            }
        }
    }

    #[test]
    fn refuses_other_counts_and_options() {
        for args in [
            &[][..],
            &["a", "b"],
            &["a", "b", "c", "d"],
            &["--bogus"],
            &["a", "-x", "c"],
        ] {
            assert!(parse(args).is_err(), "{args:?} accepted");
        }
        assert!(matches!(parse(&["--help"]), Ok(Invocation::Help)));
    }
}
