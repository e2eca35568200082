//! sparse-volume-generator: one small binary (no clap, no D-Bus, no async
//! runtime) in two roles, as systemd's zram-generator is:
//! * the generator (systemd.generator(7), called with its output
//!   directories at boot and on every daemon-reload): the registry's
//!   enabled volumes as `sparse-volume@<UUID>.service` instances;
//! * the unit's own work, `--attach UUID` (ExecStart) and `--detach UUID`
//!   (ExecStop): the engine's attach and detach, which `sparse-volume
//!   attach`/`detach` run too.
//!
//! `main` only tells the roles apart.
#![deny(unsafe_code)]

mod boot;
mod escape;
mod generate;
mod kmsg;
mod output;
mod stderr_log;
mod units;

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::process::ExitCode;

use sparse_volume::volume::id::VolumeId;

const USAGE: &str = "\
usage: sparse-volume-generator NORMAL_DIR [EARLY_DIR LATE_DIR]
       sparse-volume-generator --attach UUID | --detach UUID

A systemd generator (see systemd.generator(7)): systemd passes three output
directories; one directory is accepted for testing (systemd-analyze, tests).
Links and drop-ins go into the first.

--attach and --detach are what sparse-volume@UUID.service runs: the same
attach and detach as `sparse-volume attach|detach UUID`, for the unit.

SPARSE_VOLUME_ROOT=DIR reads the registry and proc/cmdline below DIR
instead of /.

Kernel command line: sparse_volume=off generates no volume units;
sparse_volume.skip=UUID[,UUID...] leaves out those volumes.
";

enum Invocation {
    Generate { normal_dir: PathBuf },
    Attach(VolumeId),
    Detach(VolumeId),
    Help,
}

fn parse_args(args: &[OsString]) -> Result<Invocation, String> {
    match args {
        [flag] if flag == "-h" || flag == "--help" => Ok(Invocation::Help),
        [flag, uuid] if flag == "--attach" || flag == "--detach" => {
            let id = uuid
                .to_str()
                .ok_or_else(|| format!("{uuid:?} is not a UUID"))?
                .parse()?;
            Ok(if flag == "--attach" {
                Invocation::Attach(id)
            } else {
                Invocation::Detach(id)
            })
        }
        _ if args.iter().any(|a| a.as_bytes().starts_with(b"-")) => Err(
            "the options are --attach UUID, --detach UUID and --help; the generator takes directories"
                .to_string(),
        ),
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
        Ok(Invocation::Generate { normal_dir }) => generate::generate(&normal_dir),
        Ok(Invocation::Attach(id)) => boot::attach(&id),
        Ok(Invocation::Detach(id)) => boot::detach(&id),
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

    #[test]
    fn the_unit_roles_take_one_canonical_uuid() {
        let uuid = "6f1c2a8e-3b4d-4e5f-8a9b-0c1d2e3f4a5b";
        assert!(matches!(
            parse(&["--attach", uuid]),
            Ok(Invocation::Attach(_))
        ));
        assert!(matches!(
            parse(&["--detach", uuid]),
            Ok(Invocation::Detach(_))
        ));
        for args in [
            &["--attach"][..],
            &["--attach", "not-a-uuid"],
            &["--detach", uuid, "x"],
            &["--attach", "6F1C2A8E-3B4D-4E5F-8A9B-0C1D2E3F4A5B"],
        ] {
            assert!(parse(args).is_err(), "{args:?} accepted");
        }
    }
}
