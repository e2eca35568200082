//! Crash, stop and fault points for the test suites: the space between two
//! steps, made reachable on purpose. They act only in builds with the
//! `test-hooks` cargo feature (`cargo test` turns it on; the packages are
//! built without it). Without it every point is an empty function: the
//! shipped binaries neither read the environment for them nor contain the
//! variables' names (`packaging/check-packages.sh` holds that).
//!
//! With the feature, the environment chooses the points:
//! * `SPARSE_VOLUME_CRASH_AT=<crash point>`: the process SIGKILLs itself
//!   there, to prove that a crash anywhere in a multi-step change leaves
//!   what `check --repair` understands;
//! * `SPARSE_VOLUME_STOP_AT=<stop point>`: it SIGSTOPs itself there, so a
//!   test can change something before it goes on (SIGCONT);
//! * `SPARSE_VOLUME_FAULT=<fault point>[*<times>][,…]`: the kernel call
//!   behind the point fails the way an older or different kernel's would
//!   (the first `<times>` times, or always), so the fallbacks run here;
//! * `SPARSE_VOLUME_JOB_TIMEOUT_SEC=<seconds>`: every wait for a systemd
//!   job ends after that long, so a test of a job that never ends does
//!   not take the default 90 s;
//! * `SPARSE_VOLUME_LOCK_WAIT_SEC=<seconds>`: a bounded wait for a lock
//!   (the units' program's) ends after that long instead of its 45 s.

/// An enum of named points, its `ALL` list and `name()`, from one list, so
/// that a point cannot be added without the suites that iterate `ALL`
/// reaching it.
macro_rules! points {
    ($(#[$meta:meta])* pub enum $kind:ident {
        $($(#[$point_meta:meta])* $point:ident => $name:literal,)*
    }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum $kind {
            $($(#[$point_meta])* $point,)*
        }

        impl $kind {
            pub const ALL: &'static [$kind] = &[$($kind::$point,)*];

            pub const fn name(self) -> &'static str {
                match self {
                    $($kind::$point => $name,)*
                }
            }
        }
    };
}

points! {
    /// Named points where a test may kill the process.
    pub enum Crash {
        CreateAfterAllocate => "create:after-allocate",
        CreateAfterFormat => "create:after-format",
        CreateBeforeRename => "create:before-rename",
        CreateBeforeRegistry => "create:before-registry",
        CreateBeforeUnmark => "create:before-unmark",
        ResizeAfterFile => "resize:after-file",
        /// A detached xfs volume's grow holds a loop device of its own.
        ResizeXfsDeviceBound => "resize:xfs-device-bound",
        ResizeBeforeRegistry => "resize:before-registry",
        RemoveAfterDetach => "remove:after-detach",
        RemoveBeforeRegistry => "remove:before-registry",
        /// The source's file system is frozen for the copy.
        CloneWhileFrozen => "clone:while-frozen",
        /// The copy holds the source's identity still.
        CloneAfterCopy => "clone:after-copy",
        CloneBeforeRename => "clone:before-rename",
        CloneBeforeRegistry => "clone:before-registry",
        CloneBeforeUnmark => "clone:before-unmark",
        /// The imported data is written and verified, the identity not
        /// yet changed (under --new-uuid: the exported one).
        ImportAfterData => "import:after-data",
        ImportBeforeRename => "import:before-rename",
    }
}

points! {
    /// Named points where a test may stop the process and let it go on.
    pub enum Stop {
        /// Detach released the device attach noted and has not yet asked
        /// whether anything else holds the file.
        DetachAfterNotedRelease => "detach:after-noted-release",
        /// `check --repair` found duplicate devices and has not yet taken
        /// the volume lock to remove them.
        CheckBeforeDuplicateRepair => "check:before-duplicate-repair",
        /// `disable --now` (or `apply --enabled false --now`) stopped the
        /// volume and has not yet written the flag.
        DisableAfterStop => "disable:after-stop",
    }
}

points! {
    /// Kernel calls a test may make fail as another kernel would.
    pub enum Fault {
        /// `LOOP_CONFIGURE` is unknown (kernels before 5.8): `EINVAL`.
        ConfigureUnsupported => "configure-unsupported",
        /// `LOOP_CONFIGURE` refuses direct I/O for this backing file: `EINVAL`.
        DirectIoRefused => "direct-io-refused",
        /// Another process bound the device first: `EBUSY`.
        DeviceTaken => "device-taken",
        /// The kernel ignores the read-only and partition-scan flags it was given.
        FlagsIgnored => "flags-ignored",
    }
}

/// Kills the process here when a test asks for this point.
#[inline(always)]
pub fn crash_at(point: Crash) {
    #[cfg(feature = "test-hooks")]
    active::crash_at(point);
    #[cfg(not(feature = "test-hooks"))]
    let _ = point;
}

/// Stops the process here when a test asks for this point.
#[inline(always)]
pub fn stop_at(point: Stop) {
    #[cfg(feature = "test-hooks")]
    active::stop_at(point);
    #[cfg(not(feature = "test-hooks"))]
    let _ = point;
}

/// Whether the kernel call behind `point` is to fail this time.
#[inline(always)]
pub fn fails(point: Fault) -> bool {
    #[cfg(feature = "test-hooks")]
    return active::fails(point);
    #[cfg(not(feature = "test-hooks"))]
    {
        let _ = point;
        false
    }
}

/// How long to wait for any systemd job, when a test says.
#[inline(always)]
pub fn job_wait() -> Option<std::time::Duration> {
    #[cfg(feature = "test-hooks")]
    return active::job_wait();
    #[cfg(not(feature = "test-hooks"))]
    None
}

/// How long a bounded wait for a lock lasts, when a test says.
#[inline(always)]
pub fn lock_wait() -> Option<std::time::Duration> {
    #[cfg(feature = "test-hooks")]
    return active::lock_wait();
    #[cfg(not(feature = "test-hooks"))]
    None
}

#[cfg(feature = "test-hooks")]
pub use active::{CRASH_ENV, FAULT_ENV, JOB_TIMEOUT_ENV, LOCK_WAIT_ENV, STOP_ENV};

#[cfg(feature = "test-hooks")]
mod active {
    use std::collections::HashMap;
    use std::sync::Mutex;
    use std::time::Duration;

    use nix::sys::signal::{raise, Signal};

    use super::{Crash, Fault, Stop};

    pub const CRASH_ENV: &str = "SPARSE_VOLUME_CRASH_AT";
    pub const STOP_ENV: &str = "SPARSE_VOLUME_STOP_AT";
    pub const FAULT_ENV: &str = "SPARSE_VOLUME_FAULT";
    pub const JOB_TIMEOUT_ENV: &str = "SPARSE_VOLUME_JOB_TIMEOUT_SEC";
    pub const LOCK_WAIT_ENV: &str = "SPARSE_VOLUME_LOCK_WAIT_SEC";

    fn seconds_of(variable: &str) -> Option<Duration> {
        let seconds = std::env::var(variable).ok()?.trim().parse().ok()?;
        Some(Duration::from_secs(seconds))
    }

    pub fn job_wait() -> Option<Duration> {
        seconds_of(JOB_TIMEOUT_ENV)
    }

    pub fn lock_wait() -> Option<Duration> {
        seconds_of(LOCK_WAIT_ENV)
    }

    fn asked(variable: &str, name: &str) -> bool {
        std::env::var(variable).is_ok_and(|wanted| wanted == name)
    }

    pub fn crash_at(point: Crash) {
        if asked(CRASH_ENV, point.name()) {
            let _ = raise(Signal::SIGKILL);
        }
    }

    pub fn stop_at(point: Stop) {
        if asked(STOP_ENV, point.name()) {
            let _ = raise(Signal::SIGSTOP);
        }
    }

    /// How often each fault point failed so far, for `<name>*<times>`.
    static FIRED: Mutex<Option<HashMap<&'static str, u32>>> = Mutex::new(None);

    pub fn fails(point: Fault) -> bool {
        let Ok(spec) = std::env::var(FAULT_ENV) else {
            return false;
        };
        let Some(limit) = limit_for(&spec, point.name()) else {
            return false;
        };
        let Ok(mut fired) = FIRED.lock() else {
            return false;
        };
        let count = fired
            .get_or_insert_with(HashMap::new)
            .entry(point.name())
            .or_insert(0);
        *count += 1;
        limit.is_none_or(|limit| *count <= limit)
    }

    /// `Some(None)`: always; `Some(Some(n))`: the first n times; `None`:
    /// not named.
    pub(super) fn limit_for(spec: &str, name: &str) -> Option<Option<u32>> {
        spec.split(',').find_map(|item| {
            let (point, times) = match item.trim().split_once('*') {
                Some((point, times)) => (point, times.parse().ok()),
                None => (item.trim(), None),
            };
            (point == name).then_some(times)
        })
    }
}

#[cfg(all(test, feature = "test-hooks"))]
mod tests {
    use super::active::limit_for;
    use super::{Crash, Fault, Stop};

    #[test]
    fn spec_names_points_and_counts() {
        assert_eq!(limit_for("a,b*2", "a"), Some(None));
        assert_eq!(limit_for("a,b*2", "b"), Some(Some(2)));
        assert_eq!(limit_for("a, b*2", "c"), None);
        assert_eq!(limit_for("ab", "a"), None);
    }

    #[test]
    fn point_names_are_unique() {
        let mut names: Vec<&str> = Crash::ALL.iter().map(|p| p.name()).collect();
        names.extend(Stop::ALL.iter().map(|p| p.name()));
        names.extend(Fault::ALL.iter().map(|p| p.name()));
        let count = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), count);
    }
}
