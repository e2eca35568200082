//! sparse-volume-unit: what `sparse-volume@<UUID>.service` runs, `attach
//! UUID` as its ExecStart and `detach UUID` as its ExecStop (`roles.rs`).
//! The same attach and detach as `sparse-volume attach|detach`, in a small
//! program (no argument parser, no D-Bus client, no async runtime) that
//! every volume's unit starts at every boot and shutdown. `main` reads the
//! arguments.
#![deny(unsafe_code)]
// The C runtime calls `main` below directly: see there. (The unit tests
// keep the test harness's own main.)
#![cfg_attr(not(test), no_main)]

mod roles;
mod stderr_log;

use std::ffi::OsString;

use sparse_volume::volume::id::VolumeId;

use crate::roles::Status;

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

/// The process's entry point, called by the C runtime without Rust's own
/// start-up: that one installs a stack-overflow handler (which reads
/// `/proc/self/maps`), ignores SIGPIPE and makes sure descriptors 0 to 2
/// are open, 0.1 ms of a 1.2 ms attach that every volume's unit would pay
/// at every boot and shutdown (measured with hyperfine,
/// docs/benchmarks.md). The descriptors are checked here, as they must be:
/// run with stdout closed, the next file opened (a lock file, the backing
/// file, a loop device) would get descriptor 1 and the report would be
/// written into it. std works as usual otherwise: with glibc (the only C
/// library this is built for) it takes the arguments from the C runtime's
/// start-up hook. A stack overflow is a plain SIGSEGV, and a panic aborts
/// (it cannot unwind out of an `extern "C"` function). SIGPIPE is as the
/// caller left it: systemd ignores it for its services (`IgnoreSIGPIPE=`),
/// where a write to a closed pipe fails with EPIPE, which is ignored.
#[cfg(not(test))]
#[allow(unsafe_code)] // `no_mangle`: the C entry point; nothing else in this binary is named `main`.
#[no_mangle]
extern "C" fn main(
    _argc: std::ffi::c_int,
    _argv: *const *const std::ffi::c_char,
) -> std::ffi::c_int {
    standard_descriptors_open();
    let status = run();
    // The C runtime's exit flushes its own buffers, not Rust's.
    let _ = std::io::Write::flush(&mut std::io::stdout());
    status as std::ffi::c_int
}

/// Opens /dev/null on each of descriptors 0 to 2 that is closed (an open
/// takes the lowest free descriptor), as Rust's start-up would have.
#[cfg(not(test))]
fn standard_descriptors_open() {
    use nix::fcntl::{fcntl, open, FcntlArg, OFlag};
    for fd in 0..3 {
        if fcntl(fd, FcntlArg::F_GETFD) == Err(nix::errno::Errno::EBADF) {
            // Kept open for the process's life: it stands in for the
            // missing descriptor. Nothing to do if even this fails.
            let _ = open("/dev/null", OFlag::O_RDWR, nix::sys::stat::Mode::empty());
        }
    }
}

// Called by `main` only, which the unit tests leave out.
#[cfg_attr(test, allow(dead_code))]
fn run() -> Status {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    match parse_args(&args) {
        Ok(Invocation::Attach(id)) => roles::attach(&id),
        Ok(Invocation::Detach(id)) => roles::detach(&id),
        Ok(Invocation::Help) => {
            // A closed or full stdout is no reason to fail.
            let _ = std::io::Write::write_all(&mut std::io::stdout(), USAGE.as_bytes());
            Status::Success
        }
        Err(reason) => {
            eprint!("sparse-volume-unit: {reason}\n{USAGE}");
            Status::Usage
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
