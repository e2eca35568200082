//! The stand-in for systemd's Manager and unit objects.

use std::collections::HashMap;
use std::fmt::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sparse_volume::registry::paths::SystemRoot;
use sparse_volume::registry::Registry;
use sparse_volume::systemd::kernel_cmdline::skip_reason;
use sparse_volume::systemd::unit::VOLUMES_TARGET;
use sparse_volume::systemd::{unit_name, ListedUnit};
use zbus::object_server::SignalEmitter;
use zbus::zvariant::{ObjectPath, OwnedObjectPath};
use zbus::{connection, interface, Connection, ObjectServer};

const MANAGER_PATH: &str = "/org/freedesktop/systemd1";

/// What a unit looks like to clients.
#[derive(Clone, Debug)]
pub struct UnitRecord {
    pub active_state: String,
    pub sub_state: String,
    pub result: String,
    pub wanted_by: Vec<String>,
    pub required_by: Vec<String>,
}

impl UnitRecord {
    fn inactive() -> Self {
        Self {
            active_state: "inactive".into(),
            sub_state: "dead".into(),
            result: "success".into(),
            wanted_by: Vec::new(),
            required_by: Vec::new(),
        }
    }
}

struct State {
    calls: Vec<String>,
    /// What the next jobs end with; `None`: they never end (no JobRemoved).
    job_result: Option<String>,
    units: HashMap<String, UnitRecord>,
    next_job: u32,
    /// The registry root the emulated generator reads on Reload.
    registry_root: PathBuf,
}

type Shared = Arc<Mutex<State>>;

/// Owns `org.freedesktop.systemd1` on the bus until dropped.
pub struct StubSystemd {
    connection: Connection,
    state: Shared,
}

impl StubSystemd {
    /// Serves on `address`; Reload reads the registry under `registry_root`
    /// the way the generator would.
    pub fn start(address: &str, registry_root: PathBuf) -> Self {
        let state = Arc::new(Mutex::new(State {
            calls: Vec::new(),
            job_result: Some("done".into()),
            units: HashMap::new(),
            next_job: 1,
            registry_root,
        }));
        let manager = Manager {
            state: state.clone(),
        };
        let connection = async_io::block_on(async {
            connection::Builder::address(address)?
                .name("org.freedesktop.systemd1")?
                .serve_at(MANAGER_PATH, manager)?
                .build()
                .await
        })
        .expect("serving the stub systemd on the private bus");
        Self { connection, state }
    }

    /// `Some("failed")` etc. for the result of the next jobs; `None` for
    /// jobs that never finish.
    pub fn set_job_result(&self, result: Option<&str>) {
        self.state.lock().unwrap().job_result = result.map(str::to_string);
    }

    /// Every call so far, e.g. `StartUnit sparse-volume@U.service replace`.
    pub fn calls(&self) -> Vec<String> {
        self.state.lock().unwrap().calls.clone()
    }

    pub fn unit(&self, name: &str) -> Option<UnitRecord> {
        self.state.lock().unwrap().units.get(name).cloned()
    }
}

impl Drop for StubSystemd {
    fn drop(&mut self) {
        // Give the name back at once rather than when the bus goes away.
        let _ = async_io::block_on(self.connection.release_name("org.freedesktop.systemd1"));
    }
}

#[derive(Debug, zbus::DBusError)]
#[zbus(prefix = "org.freedesktop.systemd1")]
enum SystemdError {
    #[zbus(error)]
    ZBus(zbus::Error),
    NoSuchUnit(String),
}

/// systemd's object path for a unit: `/org/freedesktop/systemd1/unit/`
/// plus the name with every byte but letters (and digits after the first
/// byte) escaped as `_xx` (sd-bus's bus_label_escape).
fn unit_path(name: &str) -> OwnedObjectPath {
    let mut path = String::from("/org/freedesktop/systemd1/unit/");
    for (i, byte) in name.bytes().enumerate() {
        if byte.is_ascii_alphabetic() || (i > 0 && byte.is_ascii_digit()) {
            path.push(byte as char);
        } else {
            let _ = write!(path, "_{byte:02x}");
        }
    }
    OwnedObjectPath::try_from(path).expect("a valid object path")
}

/// fnmatch(3) for patterns whose only special character is `*`.
fn glob_matches(pattern: &str, name: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == name,
        Some((head, rest)) => {
            let Some(name) = name.strip_prefix(head) else {
                return false;
            };
            (0..=name.len())
                .filter(|&i| name.is_char_boundary(i))
                .any(|i| glob_matches(rest, &name[i..]))
        }
    }
}

struct Manager {
    state: Shared,
}

#[derive(Clone, Copy)]
enum Verb {
    Start,
    Stop,
}

impl Verb {
    /// Runs the template unit's ExecStart/ExecStop for an instance of
    /// `sparse-volume@.service`; other units have nothing to run.
    fn exec(self, registry_root: &std::path::Path, unit: &str) -> bool {
        let Some(uuid) = unit
            .strip_prefix("sparse-volume@")
            .and_then(|u| u.strip_suffix(".service"))
        else {
            return true;
        };
        let command = match self {
            Verb::Start => "attach",
            Verb::Stop => "detach",
        };
        std::process::Command::new(env!("CARGO_BIN_EXE_sparse-volume"))
            .args([command, uuid])
            .env("SPARSE_VOLUME_ROOT", registry_root)
            .env_remove("DBUS_SYSTEM_BUS_ADDRESS")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|status| status.success())
    }
}

impl Manager {
    fn record(&self, call: String) {
        self.state.lock().unwrap().calls.push(call);
    }

    /// Loads the unit (creating its objects) if it is not loaded yet.
    async fn load(&self, server: &ObjectServer, name: &str) -> zbus::Result<OwnedObjectPath> {
        let path = unit_path(name);
        let fresh = {
            let mut state = self.state.lock().unwrap();
            let fresh = !state.units.contains_key(name);
            state
                .units
                .entry(name.to_string())
                .or_insert_with(UnitRecord::inactive);
            fresh
        };
        if fresh {
            let unit = UnitObject {
                name: name.to_string(),
                state: self.state.clone(),
            };
            server.at(&path, unit).await?;
            let service = ServiceObject {
                name: name.to_string(),
                state: self.state.clone(),
            };
            server.at(&path, service).await?;
        }
        Ok(path)
    }

    /// Queues a job: the reply names it, and like systemd the JobRemoved
    /// signal follows later, after the unit's ExecStart/ExecStop (the real
    /// `sparse-volume attach`/`detach`) ran and the unit changed state.
    fn queue_job(&self, connection: &Connection, unit: &str, verb: Verb) -> OwnedObjectPath {
        let (id, result, registry_root) = {
            let mut state = self.state.lock().unwrap();
            let id = state.next_job;
            state.next_job += 1;
            (id, state.job_result.clone(), state.registry_root.clone())
        };
        let job = OwnedObjectPath::try_from(format!("/org/freedesktop/systemd1/job/{id}"))
            .expect("a valid object path");
        let Some(result) = result else {
            // A job that hangs: the unit stays in transition for good.
            if let Some(record) = self.state.lock().unwrap().units.get_mut(unit) {
                record.active_state = "activating".into();
                record.sub_state = "start".into();
            }
            return job;
        };
        let state = self.state.clone();
        let connection = connection.clone();
        let unit = unit.to_string();
        let signal_job = job.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            let ran = result == "done" && verb.exec(&registry_root, &unit);
            // As systemd: a failed ExecStart fails the job; a failed
            // ExecStop still ends the stop job "done", with a failed unit.
            let (active, sub, unit_result, result) = match (verb, ran) {
                (Verb::Start, true) => ("active", "exited", "success", result),
                (Verb::Stop, true) => ("inactive", "dead", "success", result),
                (Verb::Start, false) if result == "done" => {
                    ("failed", "failed", "exit-code", "failed".to_string())
                }
                (_, false) => ("failed", "failed", "exit-code", result),
            };
            let (active, sub, unit_result) =
                (active.to_string(), sub.to_string(), unit_result.to_string());
            if let Some(record) = state.lock().unwrap().units.get_mut(&unit) {
                record.active_state = active;
                record.sub_state = sub;
                record.result = unit_result;
            }
            let _ = async_io::block_on(async {
                let emitter = SignalEmitter::new(&connection, MANAGER_PATH)?;
                Manager::job_removed(&emitter, id, signal_job.as_ref(), &unit, &result).await
            });
        });
        job
    }
}

#[interface(name = "org.freedesktop.systemd1.Manager")]
impl Manager {
    fn subscribe(&self) {
        self.record("Subscribe".into());
    }

    /// Reruns "the generator": units of enabled volumes become wanted by
    /// sparse-volumes.target (its `.wants` links), those of disabled
    /// ones no longer are.
    async fn reload(&self, #[zbus(object_server)] server: &ObjectServer) -> zbus::fdo::Result<()> {
        self.record("Reload".into());
        let root = self.state.lock().unwrap().registry_root.clone();
        let registry = Registry::open(SystemRoot::at(root));
        let entries = registry
            .entries()
            .map_err(|e| zbus::fdo::Error::Failed(e.to_string()))?;
        for volume in entries.into_iter().filter_map(|e| e.volume.ok()) {
            let name = unit_name(&volume.id);
            // As the real generator: a volume the kernel command line
            // skips gets no `.wants` link (generator golden cases 20-22).
            let wanted = volume.enabled && skip_reason(registry.root(), &volume.id).is_none();
            if wanted {
                self.load(server, &name).await?;
            }
            if let Some(record) = self.state.lock().unwrap().units.get_mut(&name) {
                record.wanted_by = if wanted {
                    vec![VOLUMES_TARGET.to_string()]
                } else {
                    Vec::new()
                };
            }
        }
        Ok(())
    }

    async fn start_unit(
        &self,
        name: String,
        mode: String,
        #[zbus(connection)] connection: &Connection,
        #[zbus(object_server)] server: &ObjectServer,
    ) -> zbus::fdo::Result<OwnedObjectPath> {
        self.record(format!("StartUnit {name} {mode}"));
        self.load(server, &name).await?;
        Ok(self.queue_job(connection, &name, Verb::Start))
    }

    async fn stop_unit(
        &self,
        name: String,
        mode: String,
        #[zbus(connection)] connection: &Connection,
        #[zbus(object_server)] server: &ObjectServer,
    ) -> zbus::fdo::Result<OwnedObjectPath> {
        self.record(format!("StopUnit {name} {mode}"));
        self.load(server, &name).await?;
        Ok(self.queue_job(connection, &name, Verb::Stop))
    }

    fn reset_failed_unit(&self, name: String) -> Result<(), SystemdError> {
        self.record(format!("ResetFailedUnit {name}"));
        let mut state = self.state.lock().unwrap();
        let record = state
            .units
            .get_mut(&name)
            .ok_or_else(|| SystemdError::NoSuchUnit(format!("Unit {name} not loaded.")))?;
        if record.active_state == "failed" {
            *record = UnitRecord {
                wanted_by: record.wanted_by.clone(),
                required_by: record.required_by.clone(),
                ..UnitRecord::inactive()
            };
        }
        Ok(())
    }

    fn get_unit(&self, name: String) -> Result<OwnedObjectPath, SystemdError> {
        self.record(format!("GetUnit {name}"));
        if self.state.lock().unwrap().units.contains_key(&name) {
            Ok(unit_path(&name))
        } else {
            Err(SystemdError::NoSuchUnit(format!("Unit {name} not loaded.")))
        }
    }

    async fn load_unit(
        &self,
        name: String,
        #[zbus(object_server)] server: &ObjectServer,
    ) -> zbus::fdo::Result<OwnedObjectPath> {
        self.record(format!("LoadUnit {name}"));
        Ok(self.load(server, &name).await?)
    }

    /// Loaded units matching a pattern, in a state of `states` (any when
    /// empty), as systemd lists them.
    fn list_units_by_patterns(
        &self,
        states: Vec<String>,
        patterns: Vec<String>,
    ) -> Vec<ListedUnit> {
        self.record(format!(
            "ListUnitsByPatterns [{}] [{}]",
            states.join(" "),
            patterns.join(" ")
        ));
        let no_job = OwnedObjectPath::try_from("/").expect("a valid object path");
        let state = self.state.lock().unwrap();
        let mut listed: Vec<ListedUnit> = state
            .units
            .iter()
            .filter(|(name, _)| patterns.iter().any(|p| glob_matches(p, name)))
            .filter(|(_, unit)| {
                states.is_empty()
                    || states
                        .iter()
                        .any(|s| *s == unit.active_state || *s == unit.sub_state)
            })
            .map(|(name, unit)| {
                (
                    name.clone(),
                    String::new(),
                    "loaded".into(),
                    unit.active_state.clone(),
                    unit.sub_state.clone(),
                    String::new(),
                    unit_path(name),
                    0,
                    String::new(),
                    no_job.clone(),
                )
            })
            .collect();
        listed.sort_by(|a, b| a.0.cmp(&b.0));
        listed
    }

    #[zbus(signal)]
    async fn job_removed(
        emitter: &SignalEmitter<'_>,
        id: u32,
        job: ObjectPath<'_>,
        unit: &str,
        result: &str,
    ) -> zbus::Result<()>;

    #[zbus(property)]
    fn version(&self) -> String {
        "252-stub".into()
    }
}

struct UnitObject {
    name: String,
    state: Shared,
}

impl UnitObject {
    fn get(&self) -> UnitRecord {
        self.state.lock().unwrap().units[&self.name].clone()
    }
}

#[interface(name = "org.freedesktop.systemd1.Unit")]
impl UnitObject {
    /// The stub has unit files for every name and masks none.
    #[zbus(property)]
    fn load_state(&self) -> String {
        "loaded".into()
    }

    #[zbus(property)]
    fn active_state(&self) -> String {
        self.get().active_state
    }

    #[zbus(property)]
    fn sub_state(&self) -> String {
        self.get().sub_state
    }

    #[zbus(property)]
    fn wanted_by(&self) -> Vec<String> {
        self.get().wanted_by
    }

    #[zbus(property)]
    fn required_by(&self) -> Vec<String> {
        self.get().required_by
    }
}

struct ServiceObject {
    name: String,
    state: Shared,
}

#[interface(name = "org.freedesktop.systemd1.Service")]
impl ServiceObject {
    #[zbus(property, name = "Result")]
    fn result(&self) -> String {
        self.state.lock().unwrap().units[&self.name].result.clone()
    }

    /// The template unit's TimeoutStartSec=90s.
    #[zbus(property, name = "TimeoutStartUSec")]
    fn timeout_start_usec(&self) -> u64 {
        90_000_000
    }

    /// systemd's default, and its "infinity" would read the same way.
    #[zbus(property, name = "TimeoutStopUSec")]
    fn timeout_stop_usec(&self) -> u64 {
        90_000_000
    }
}
