//! Typed proxies for the parts of systemd's D-Bus API we use
//! (org.freedesktop.systemd1(5)). Signatures match systemd 252 and later.

use zbus::proxy;
use zbus::zvariant::{ObjectPath, OwnedObjectPath};

pub const SERVICE: &str = "org.freedesktop.systemd1";

/// One row of `ListUnitsByPatterns` (`a(ssssssouso)`).
pub type ListedUnit = (
    String,
    String,
    String,
    String,
    String,
    String,
    OwnedObjectPath,
    u32,
    String,
    OwnedObjectPath,
);

#[proxy(
    interface = "org.freedesktop.systemd1.Manager",
    default_service = "org.freedesktop.systemd1",
    default_path = "/org/freedesktop/systemd1",
    gen_blocking = false
)]
pub trait Manager {
    /// Asks systemd to send job and unit signals to this client.
    fn subscribe(&self) -> zbus::Result<()>;

    /// `daemon-reload`: reruns the generators and reloads unit files. The
    /// reply comes once the reload is done.
    fn reload(&self) -> zbus::Result<()>;

    /// Queues a start job; the reply carries the job's object path.
    fn start_unit(&self, name: &str, mode: &str) -> zbus::Result<OwnedObjectPath>;

    fn stop_unit(&self, name: &str, mode: &str) -> zbus::Result<OwnedObjectPath>;

    fn reset_failed_unit(&self, name: &str) -> zbus::Result<()>;

    /// `systemctl disable`: removes the unit's enablement links; the
    /// changes made (type, link, target).
    fn disable_unit_files(
        &self,
        files: &[&str],
        runtime: bool,
    ) -> zbus::Result<Vec<(String, String, String)>>;

    /// Fails with `org.freedesktop.systemd1.NoSuchUnit` when not loaded.
    fn get_unit(&self, name: &str) -> zbus::Result<OwnedObjectPath>;

    /// Loads the unit if needed (as `systemctl status` does).
    fn load_unit(&self, name: &str) -> zbus::Result<OwnedObjectPath>;

    /// Loaded units whose names match one of `patterns` (shell globs), in
    /// any state when `states` is empty: name, description, load state,
    /// active state, sub state, followed unit, object path, job id, job
    /// type, job path.
    fn list_units_by_patterns(
        &self,
        states: &[&str],
        patterns: &[&str],
    ) -> zbus::Result<Vec<ListedUnit>>;

    /// `JobRemoved(u id, o job, s unit, s result)`.
    #[zbus(signal)]
    fn job_removed(
        &self,
        id: u32,
        job: ObjectPath<'_>,
        unit: &str,
        result: &str,
    ) -> zbus::Result<()>;

    #[zbus(property)]
    fn version(&self) -> zbus::Result<String>;
}

#[proxy(
    interface = "org.freedesktop.systemd1.Unit",
    default_service = "org.freedesktop.systemd1",
    gen_blocking = false
)]
pub trait Unit {
    /// `loaded`, `masked`, `not-found`, ...
    #[zbus(property)]
    fn load_state(&self) -> zbus::Result<String>;

    #[zbus(property)]
    fn active_state(&self) -> zbus::Result<String>;

    #[zbus(property)]
    fn sub_state(&self) -> zbus::Result<String>;

    #[zbus(property)]
    fn wanted_by(&self) -> zbus::Result<Vec<String>>;

    #[zbus(property)]
    fn required_by(&self) -> zbus::Result<Vec<String>>;

    #[zbus(property, name = "InvocationID")]
    fn invocation_id(&self) -> zbus::Result<Vec<u8>>;
}

/// `Result` and the timeouts are properties of the service, not of the
/// generic unit.
#[proxy(
    interface = "org.freedesktop.systemd1.Service",
    default_service = "org.freedesktop.systemd1",
    gen_blocking = false
)]
pub trait Service {
    #[zbus(property, name = "Result")]
    fn result(&self) -> zbus::Result<String>;

    #[zbus(property, name = "TimeoutStartUSec")]
    fn timeout_start_usec(&self) -> zbus::Result<u64>;

    #[zbus(property, name = "TimeoutStopUSec")]
    fn timeout_stop_usec(&self) -> zbus::Result<u64>;
}
