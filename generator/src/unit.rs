//! sparse-volume-unit: what `sparse-volume@<UUID>.service` runs, `attach
//! UUID` as its ExecStart and `detach UUID` as its ExecStop (`roles.rs`).
//! The same attach and detach as `sparse-volume attach|detach`, in a small
//! program (no argument parser, no D-Bus client, no async runtime) that
//! every volume's unit starts at every boot and shutdown. `main` reads the
//! arguments.
#![deny(unsafe_code)]

mod roles;
mod stderr_log;

use std::ffi::OsString;
use std::process::ExitCode;

use sparse_volume::volume::id::VolumeId;

const USAGE: &str = "\
usage: sparse-volume-unit attach UUID | detach UUID

What sparse-volume@UUID.service runs (ExecStart, ExecStop): the same attach
and detach as `sparse-volume attach|detach UUID`. By hand, use
sparse-volume(8). SPARSE_VOLUME_ROOT=DIR reads the registry below DIR.
";

enum Invocation {
    Attach(VolumeId),
    Detach(VolumeId),
    Help,
}

fn parse_args(args: &[OsString]) -> Result<Invocation, String> {
    match args {
        [flag] if flag == "-h" || flag == "--help" => Ok(Invocation::Help),
        [role, uuid] if role == "attach" || role == "detach" => {
            let id = uuid
                .to_str()
                .ok_or_else(|| format!("{uuid:?} is not a UUID"))?
                .parse()?;
            Ok(if role == "attach" {
                Invocation::Attach(id)
            } else {
                Invocation::Detach(id)
            })
        }
        _ => Err("expected attach UUID or detach UUID".to_string()),
    }
}

fn main() -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    match parse_args(&args) {
        Ok(Invocation::Attach(id)) => roles::attach(&id),
        Ok(Invocation::Detach(id)) => roles::detach(&id),
        Ok(Invocation::Help) => {
            print!("{USAGE}");
            ExitCode::SUCCESS
        }
        Err(reason) => {
            eprint!("sparse-volume-unit: {reason}\n{USAGE}");
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
    fn a_role_and_one_canonical_uuid() {
        let uuid = "6f1c2a8e-3b4d-4e5f-8a9b-0c1d2e3f4a5b";
        assert!(matches!(
            parse(&["attach", uuid]),
            Ok(Invocation::Attach(_))
        ));
        assert!(matches!(
            parse(&["detach", uuid]),
            Ok(Invocation::Detach(_))
        ));
        assert!(matches!(parse(&["--help"]), Ok(Invocation::Help)));
        for args in [
            &[][..],
            &["attach"],
            &["attach", "not-a-uuid"],
            &["detach", uuid, "x"],
            &["--attach", uuid],
            &["attach", "6F1C2A8E-3B4D-4E5F-8A9B-0C1D2E3F4A5B"],
        ] {
            assert!(parse(args).is_err(), "{args:?} accepted");
        }
    }
}
