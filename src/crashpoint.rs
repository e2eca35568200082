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
