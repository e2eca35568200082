//! Named points where tests can kill the process, to prove that a crash
//! anywhere in a multi-step change leaves state `check --repair`
//! understands. Setting `SPARSE_VOLUME_CRASH_AT=<name>` makes the process
//! SIGKILL itself when it reaches that point; nothing else changes.

pub const ENV: &str = "SPARSE_VOLUME_CRASH_AT";

pub fn here(name: &str) {
    if std::env::var(ENV).is_ok_and(|wanted| wanted == name) {
        let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
    }
}

/// Setting `SPARSE_VOLUME_STOP_AT=<name>` makes the process stop itself
/// (SIGSTOP) when it reaches that point, so that a test can change
/// something between two steps and let it go on (SIGCONT): the space
/// between two system calls where races live, made wide on purpose.
pub const STOP_ENV: &str = "SPARSE_VOLUME_STOP_AT";

pub fn stop_here(name: &str) {
    if std::env::var(STOP_ENV).is_ok_and(|wanted| wanted == name) {
        let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGSTOP);
    }
}
