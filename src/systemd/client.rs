//! The systemd client: one system-bus connection, the Manager calls we
//! need, and waiting for the `JobRemoved` signal of the jobs we queue.
//!
//! zbus is async; each public method runs its calls to completion on the
//! calling thread (`async_io::block_on`), which keeps callers synchronous
//! and lets every call race a timer, so nothing here waits unbounded.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use async_io::{block_on, Timer};
use futures_lite::StreamExt;
use zbus::connection;
use zbus::proxy::CacheProperties;
use zbus::Connection;

use super::job_wait;
use super::proxy::{ManagerProxy, ServiceProxy, UnitProxy, SERVICE};
use super::unit::{UnitActivity, UnitState};

/// Connecting and authenticating to a local bus takes milliseconds; a bus
/// that does not answer within this is as good as absent.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// The first call to systemd. A bus without systemd answers it at once
/// (ServiceUnknown); this only bounds a systemd that is there but busy,
/// e.g. in the middle of a daemon-reload, which must not read as absent.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);
/// The D-Bus convention for a method call (sd-bus and libdbus use 25 s).
const CALL_TIMEOUT: Duration = Duration::from_secs(25);

/// `mode` for StartUnit/StopUnit: like `systemctl start`, replace a
/// conflicting queued job rather than fail.
const JOB_MODE: &str = "replace";

const NO_SUCH_UNIT: &str = "org.freedesktop.systemd1.NoSuchUnit";
const ALREADY_SUBSCRIBED: &str = "org.freedesktop.systemd1.AlreadySubscribed";

pub struct Systemd {
    connection: Connection,
    manager: ManagerProxy<'static>,
    version: String,
    subscribed: Cell<bool>,
}

impl Systemd {
    /// Connects to the system bus (`DBUS_SYSTEM_BUS_ADDRESS` when set) and
    /// checks systemd answers there. Fails within a few seconds with
    /// "cannot reach systemd on the system bus: ..." when it does not.
    pub fn connect() -> Result<Self> {
        block_on(Self::connect_async())
            .map_err(|e| anyhow!("cannot reach systemd on the system bus: {e:#}"))
    }

    async fn connect_async() -> Result<Self> {
        let connection = call(CONNECT_TIMEOUT, async {
            connection::Builder::system()?.build().await
        })
        .await?;
        let manager = ManagerProxy::builder(&connection)
            .cache_properties(CacheProperties::No)
            .build()
            .await?;
        // A cheap call that only systemd answers, so that "no systemd"
        // reads the same whichever command runs into it.
        let version = call(PROBE_TIMEOUT, manager.version()).await?;
        Ok(Self {
            connection,
            manager,
            version,
            subscribed: Cell::new(false),
        })
    }

    /// systemd's version string, e.g. `252.22-1~deb12u1`.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// `daemon-reload`, so the generator sees the registry as it is now.
    /// Bounded like a job: a reload is as slow as all generators and unit
    /// files together.
    pub fn reload(&self) -> Result<()> {
        block_on(call(job_wait(None), self.manager.reload())).context("reloading systemd")
    }

    /// Starts `unit` and waits up to `limit` for its job (see
    /// [`job_wait`]); returns the job result (`done` on success;
    /// `failed`, `timeout`, `dependency`, `canceled`, `skipped`, ...
    /// otherwise).
    pub fn start_unit(&self, unit: &str, limit: Duration) -> Result<String> {
        block_on(self.run_job(Job::Start, unit, limit))
    }

    /// Stops `unit` and waits up to `limit` for its job; returns the job
    /// result.
    pub fn stop_unit(&self, unit: &str, limit: Duration) -> Result<String> {
        block_on(self.run_job(Job::Stop, unit, limit))
    }

    /// Forgets a failed state (and the start rate limit with it). A unit
    /// systemd has not loaded has nothing to forget.
    pub fn reset_failed(&self, unit: &str) -> Result<()> {
        match block_on(call(CALL_TIMEOUT, self.manager.reset_failed_unit(unit))) {
            Err(error) if error.is_named(NO_SUCH_UNIT) => Ok(()),
            other => other.with_context(|| format!("resetting the failed state of {unit}")),
        }
    }

    /// `systemctl disable UNIT`: the changes systemd made (type such as
    /// `unlink`, the file, the link's target).
    pub fn disable_unit_files(&self, unit: &str) -> Result<Vec<(String, String, String)>> {
        block_on(call(
            CALL_TIMEOUT,
            self.manager.disable_unit_files(&[unit], false),
        ))
        .with_context(|| format!("disabling {unit}"))
    }

    /// The unit's `LoadState` (`loaded`, `masked`, `not-found`, ...),
    /// loading it first if systemd has not.
    pub fn load_state(&self, unit: &str) -> Result<String> {
        block_on(async {
            let unit_proxy = UnitProxy::builder(&self.connection)
                .path(self.unit_path(unit).await?)?
                .cache_properties(CacheProperties::No)
                .build()
                .await?;
            Ok::<_, anyhow::Error>(call(CALL_TIMEOUT, unit_proxy.load_state()).await?)
        })
        .with_context(|| format!("reading the load state of {unit}"))
    }

    /// The unit's object path, loading the unit first if systemd has not.
    async fn unit_path(&self, unit: &str) -> Result<zbus::zvariant::OwnedObjectPath> {
        Ok(
            match call(CALL_TIMEOUT, self.manager.get_unit(unit)).await {
                Err(error) if error.is_named(NO_SUCH_UNIT) => {
                    call(CALL_TIMEOUT, self.manager.load_unit(unit)).await?
                }
                other => other?,
            },
        )
    }

    /// `ActiveState` and `SubState` of every loaded unit whose name
    /// matches `pattern` (a shell glob), in one call, as `systemctl
    /// list-units --all PATTERN`. A unit systemd has not loaded is not in
    /// the answer (to systemd it is inactive and dead).
    pub fn loaded_units_matching(&self, pattern: &str) -> Result<BTreeMap<String, UnitActivity>> {
        let listed = block_on(call(
            CALL_TIMEOUT,
            self.manager.list_units_by_patterns(&[], &[pattern]),
        ))
        .with_context(|| format!("listing the units {pattern}"))?;
        Ok(listed
            .into_iter()
            .map(|(name, _, _, active_state, sub_state, ..)| {
                (
                    name,
                    UnitActivity {
                        active_state,
                        sub_state,
                    },
                )
            })
            .collect())
    }

    /// The unit's `ActiveState`, `SubState`, `Result`, `WantedBy` and
    /// `RequiredBy`,
    /// loading the unit first if systemd has not (as `systemctl status`).
    pub fn unit_state(&self, unit: &str) -> Result<UnitState> {
        block_on(self.unit_state_async(unit))
            .with_context(|| format!("reading the state of {unit}"))
    }

    async fn unit_state_async(&self, unit: &str) -> Result<UnitState> {
        let path = self.unit_path(unit).await?;
        let unit_proxy = UnitProxy::builder(&self.connection)
            .path(path.clone())?
            .cache_properties(CacheProperties::No)
            .build()
            .await?;
        let service = ServiceProxy::builder(&self.connection)
            .path(path)?
            .cache_properties(CacheProperties::No)
            .build()
            .await?;
        Ok(UnitState {
            active_state: call(CALL_TIMEOUT, unit_proxy.active_state()).await?,
            sub_state: call(CALL_TIMEOUT, unit_proxy.sub_state()).await?,
            result: call(CALL_TIMEOUT, service.result()).await?,
            wanted_by: call(CALL_TIMEOUT, unit_proxy.wanted_by()).await?,
            required_by: call(CALL_TIMEOUT, unit_proxy.required_by()).await?,
            timeout_start_usec: call(CALL_TIMEOUT, service.timeout_start_usec()).await?,
            timeout_stop_usec: call(CALL_TIMEOUT, service.timeout_stop_usec()).await?,
            // Detail for a failure's message: never a reason to fail.
            invocation_id: call(CALL_TIMEOUT, unit_proxy.invocation_id())
                .await
                .ok()
                .filter(|id| !id.is_empty())
                .map(|id| id.iter().map(|byte| format!("{byte:02x}")).collect()),
        })
    }

    /// systemd sends job signals only to subscribed clients (or once any
    /// client subscribed); subscribing is what makes `JobRemoved` certain.
    async fn subscribe(&self) -> Result<()> {
        if self.subscribed.get() {
            return Ok(());
        }
        match call(CALL_TIMEOUT, self.manager.subscribe()).await {
            Err(error) if error.is_named(ALREADY_SUBSCRIBED) => {}
            other => other.context("subscribing to systemd's signals")?,
        }
        self.subscribed.set(true);
        Ok(())
    }

    async fn run_job(&self, job: Job, unit: &str, limit: Duration) -> Result<String> {
        self.subscribe().await?;
        // Listen before queueing: a quick job's JobRemoved may go out
        // before (or right after) the reply that names the job, and the
        // stream keeps it until we know which job to look for. The match
        // rule filters on the unit name, so the bus drops everyone else's.
        let mut removed = call(
            CALL_TIMEOUT,
            self.manager.receive_job_removed_with_args(&[(2, unit)]),
        )
        .await
        .context("listening for systemd's JobRemoved signal")?;
        let queued = match job {
            Job::Start => call(CALL_TIMEOUT, self.manager.start_unit(unit, JOB_MODE)).await,
            Job::Stop => call(CALL_TIMEOUT, self.manager.stop_unit(unit, JOB_MODE)).await,
        };
        let path = queued.with_context(|| format!("asking systemd to {} {unit}", job.name()))?;

        let wait = async {
            while let Some(signal) = removed.next().await {
                let args = signal
                    .args()
                    .context("reading a JobRemoved signal from systemd")?;
                if args.job().as_str() == path.as_str() {
                    return Ok(Some(args.result().to_string()));
                }
            }
            Ok(None)
        };
        let outcome = futures_lite::future::or(async { Some(wait.await) }, async {
            Timer::after(limit).await;
            None
        })
        .await;
        match outcome {
            Some(Ok(Some(result))) => Ok(result),
            Some(Ok(None)) => bail!(
                "the bus connection closed while waiting for systemd to finish {} {unit}",
                job.verb()
            ),
            Some(Err(error)) => Err(error),
            None => bail!(
                "systemd did not finish {} {unit} within {} s (job {} may still be running; see `systemctl list-jobs`)",
                job.verb(),
                limit.as_secs(),
                path.as_str()
            ),
        }
    }
}

#[derive(Clone, Copy)]
enum Job {
    Start,
    Stop,
}

impl Job {
    fn name(self) -> &'static str {
        match self {
            Job::Start => "start",
            Job::Stop => "stop",
        }
    }

    fn verb(self) -> &'static str {
        match self {
            Job::Start => "starting",
            Job::Stop => "stopping",
        }
    }
}

/// A D-Bus call that failed, or that did not answer in time.
#[derive(Debug)]
enum CallError {
    Bus(zbus::Error),
    TimedOut(Duration),
}

impl CallError {
    /// The D-Bus error name and message of an error reply. zbus hands
    /// them over as `MethodError`, or as `FDO` for the standard
    /// `org.freedesktop.DBus.Error.*` names its fdo proxies (such as the
    /// one reading properties) return.
    fn reply(&self) -> Option<(String, String)> {
        use zbus::DBusError;
        match self {
            CallError::Bus(zbus::Error::MethodError(name, detail, _)) => Some((
                name.to_string(),
                detail.clone().unwrap_or_else(|| "no details".into()),
            )),
            CallError::Bus(zbus::Error::FDO(error)) => Some((
                error.name().to_string(),
                error.description().unwrap_or("no details").to_string(),
            )),
            _ => None,
        }
    }

    fn is_named(&self, wanted: &str) -> bool {
        self.reply().is_some_and(|(name, _)| name == wanted)
    }
}

impl fmt::Display for CallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let CallError::TimedOut(limit) = self {
            return write!(f, "no answer within {} s", limit.as_secs_f32());
        }
        let Some((name, detail)) = self.reply() else {
            return match self {
                CallError::Bus(error) => write!(f, "{error}"),
                CallError::TimedOut(_) => Ok(()),
            };
        };
        match name.as_str() {
            "org.freedesktop.DBus.Error.ServiceUnknown"
            | "org.freedesktop.DBus.Error.NameHasNoOwner" => {
                write!(f, "{SERVICE} is not on the bus ({detail})")
            }
            "org.freedesktop.DBus.Error.AccessDenied"
            | "org.freedesktop.DBus.Error.InteractiveAuthorizationRequired" => {
                write!(f, "permission denied ({detail}); run as root")
            }
            _ => write!(f, "{detail} ({name})"),
        }
    }
}

impl std::error::Error for CallError {}

/// Runs one call, giving up after `limit`.
async fn call<T>(
    limit: Duration,
    future: impl Future<Output = zbus::Result<T>>,
) -> Result<T, CallError> {
    let answer = futures_lite::future::or(async { Some(future.await) }, async {
        Timer::after(limit).await;
        None
    })
    .await;
    match answer {
        Some(Ok(value)) => Ok(value),
        Some(Err(error)) => Err(CallError::Bus(error)),
        None => Err(CallError::TimedOut(limit)),
    }
}
