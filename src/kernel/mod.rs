//! Kernel-facing code with no policy of ours: loop devices, block-device
//! ioctls and I/O counters, file-system health, extents (and the ones a
//! file shares), reflinks and hole-keeping copies of files, freezing a
//! file system for a moment with a guardian that thaws it if we die, who
//! holds a device, udev's links, signals, a private mount namespace, child
//! processes that die with us, atomic files and locks, writes around the
//! page cache. The one place where `unsafe` is allowed; each block says
//! why it is sound. What a volume is, and what to do with one, lives above.
#![allow(unsafe_code)]

pub mod block_device;
pub mod block_stat;
pub mod capabilities;
pub mod child_process;
pub mod direct_write;
pub mod dm_crypt;
pub mod extents;
pub mod file_clone;
pub mod files;
pub mod freeze;
pub mod fs_health;
pub mod holders;
pub mod loop_device;
pub mod private_mount;
pub mod signals;
pub mod sysfs;
pub mod udev_link;

/// For the unit tests that make devices or mounts: true, after saying so,
/// when they cannot run (not root), so that the tier without root skips
/// them instead of failing.
#[cfg(test)]
pub(crate) fn skipped_without_root() -> bool {
    let skipped = !nix::unistd::geteuid().is_root();
    if skipped {
        eprintln!("skipped: needs root (device nodes, mounts); tests/run runs it as root");
    }
    skipped
}
