//! sparse-volume-generator: a systemd.generator(7) that turns the registry
//! into `sparse-volume@<UUID>.service` instances at boot and on every
//! daemon-reload (`generate.rs`). `main` reads the arguments.
//!
//! The same crate builds `sparse-volume-unit` (`unit.rs`), the program the
//! instances run: a binary of its own, outside the generators' directory,
//! because security policies confine what runs from there (SELinux gives
//! it the generator domain, which may not touch loop devices).
#![deny(unsafe_code)]

mod escape;
mod generate;
mod kmsg;
mod output;
mod units;

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::process::ExitCode;

const USAGE: &str = "\
usage: sparse-volume-generator NORMAL_DIR [EARLY_DIR LATE_DIR]

A systemd generator (see systemd.generator(7)): systemd passes three output
directories; one directory is accepted for testing (systemd-analyze, tests).
Links and drop-ins go into the first; the units that volumes were taken over
from (replaces_unit) are masked in the second, or in the only one. SPARSE_VOLUME_ROOT=DIR reads the registry
and proc/cmdline below DIR instead of /.

Kernel command line: sparse_volume=off generates no volume units;
sparse_volume.skip=UUID[,UUID...] leaves out those volumes.
";

enum Invocation {
    Generate {
        normal_dir: PathBuf,
        early_dir: Option<PathBuf>,
    },
    Help,
}

fn parse_args(args: &[OsString]) -> Result<Invocation, String> {
    match args {
        [flag] if flag == "-h" || flag == "--help" => Ok(Invocation::Help),
        _ if args.iter().any(|a| a.as_bytes().starts_with(b"-")) => {
            Err("options are not supported; expected directories".to_string())
        }
        [normal] => Ok(Invocation::Generate {
            normal_dir: PathBuf::from(normal),
            early_dir: None,
        }),
        [normal, early, _] => Ok(Invocation::Generate {
            normal_dir: PathBuf::from(normal),
            early_dir: Some(PathBuf::from(early)),
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
        Ok(Invocation::Generate {
            normal_dir,
            early_dir,
        }) => generate::generate(&normal_dir, early_dir.as_deref()),
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
                Ok(Invocation::Generate { normal_dir, .. }) => {
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
