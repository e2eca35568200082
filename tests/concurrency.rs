//! 32 real `sparse-volume` processes at a time, mixing create, attach,
//! detach, enable, disable, resize, remove and list on six overlapping
//! volumes, chosen by a seeded RNG (the seed is printed; `SV_SEED` replays
//! it, `SV_ROUNDS` sets the operations per worker). Every exit code and
//! JSON report is kept; afterwards the state is audited with independent
//! tools (`losetup`, `blkid`, `dumpe2fs`, `e2fsck`, the TOML files read
//! directly) and every success claim is checked against the final state.
//!
//! enable/disable talk to a stub systemd on a private `dbus-daemon` (they
//! refuse to change the flag when systemd is unreachable); every other
//! command gets an unreachable bus address, so nothing here can reach the
//! host's bus.

#![cfg(feature = "dbus")]

mod common;
mod stub_systemd;

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

use common::{ext4_bytes, tool, Fixture, Rng};
use stub_systemd::{PrivateBus, StubSystemd};

const WORKERS: usize = 32;
const DEFAULT_ROUNDS: usize = 40;
const MIB: u64 = 1 << 20;
/// Fixed up front so that the workers collide on them.
const UUIDS: [&str; 6] = [
    "c0ffee00-0000-4000-8000-000000000001",
    "c0ffee00-0000-4000-8000-000000000002",
    "c0ffee00-0000-4000-8000-000000000003",
    "c0ffee00-0000-4000-8000-000000000004",
    "c0ffee00-0000-4000-8000-000000000005",
    "c0ffee00-0000-4000-8000-000000000006",
];
const NO_BUS: &str = "unix:path=/nonexistent";

fn seed() -> u64 {
    match std::env::var("SV_SEED") {
        Ok(text) => text.trim().parse().expect("SV_SEED must be a number"),
        Err(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock after 1970")
            .as_nanos() as u64,
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Create,
    Attach,
    Detach,
    Enable,
    Disable,
    Resize,
    Remove,
    List,
}

/// Weights: creates and removes often enough that volumes come and go
/// while others attach, grow and flip their flag.
const MIX: [(Kind, u64); 8] = [
    (Kind::Create, 3),
    (Kind::Attach, 3),
    (Kind::Detach, 2),
    (Kind::Enable, 1),
    (Kind::Disable, 1),
    (Kind::Resize, 2),
    (Kind::Remove, 2),
    (Kind::List, 1),
];

/// The size every create of a UUID asks for (creates must repeat the same
/// spec to be idempotent).
fn base_size(index: usize) -> u64 {
    (16 + 4 * (index as u64 % 5)) * MIB
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Success,
    Refusal,
    Failure,
}

#[derive(Debug)]
struct Op {
    worker: usize,
    kind: Kind,
    volume: usize,
    size: u64,
    start: Duration,
    end: Duration,
    code: i32,
    stdout: String,
    stderr: String,
    outcome: Outcome,
}

impl Op {
    fn ok(&self) -> bool {
        self.outcome == Outcome::Success
    }

    fn line(&self) -> String {
        format!(
            "worker {} {:?} {} size {} [{:?}..{:?}] exit {}: {}{}",
            self.worker,
            self.kind,
            UUIDS[self.volume],
            self.size,
            self.start,
            self.end,
            self.code,
            self.stdout.trim(),
            self.stderr.trim()
        )
    }
}

/// Exit 1 with one of these reasons is a refusal the contract allows in
/// this mix; anything else that is not a success is a failure.
fn allowed_refusal(kind: Kind, stderr: &str) -> bool {
    let unregistered = stderr.contains("is not registered");
    match kind {
        Kind::Create => stderr.contains("already exists with a different spec"),
        Kind::Resize => unregistered || stderr.contains("shrinking is not supported"),
        Kind::Attach | Kind::Enable | Kind::Disable => unregistered,
        Kind::Detach | Kind::Remove | Kind::List => false,
    }
}

fn classify(kind: Kind, volume: usize, code: i32, stdout: &str, stderr: &str) -> Outcome {
    match code {
        0 => {
            let Ok(report) = serde_json::from_str::<serde_json::Value>(stdout) else {
                return Outcome::Failure;
            };
            let well_formed = report["changed"].is_boolean()
                && match kind {
                    Kind::List => report["volumes"].is_array(),
                    _ => report["uuid"] == UUIDS[volume],
                };
            if well_formed {
                Outcome::Success
            } else {
                Outcome::Failure
            }
        }
        1 if allowed_refusal(kind, stderr) => Outcome::Refusal,
        _ => Outcome::Failure,
    }
}

struct World {
    stub: StubSystemd,
    bus: PrivateBus,
    fx: Fixture,
    epoch: Instant,
}

impl World {
    fn run(&self, worker: usize, kind: Kind, volume: usize, size: u64) -> Op {
        let uuid = UUIDS[volume];
        let size_text = size.to_string();
        let args: Vec<&str> = match kind {
            Kind::Create => vec!["create", "--size", &size_text, "--uuid", uuid],
            Kind::Attach => vec!["attach", uuid],
            Kind::Detach => vec!["detach", uuid],
            Kind::Enable => vec!["enable", uuid],
            Kind::Disable => vec!["disable", uuid],
            Kind::Resize => vec!["resize", uuid, "--size", &size_text],
            Kind::Remove => vec!["remove", uuid, "--delete-data"],
            Kind::List => vec!["list"],
        };
        let bus = match kind {
            Kind::Enable | Kind::Disable => self.bus.address.as_str(),
            _ => NO_BUS,
        };
        let mut command = self.fx.command(&args);
        command.arg("--json").env("DBUS_SYSTEM_BUS_ADDRESS", bus);
        let start = self.epoch.elapsed();
        let output = command.output().expect("running sparse-volume");
        let end = self.epoch.elapsed();
        let code = output.status.code().unwrap_or(-1);
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        Op {
            worker,
            kind,
            volume,
            size,
            start,
            end,
            code,
            outcome: classify(kind, volume, code, &stdout, &stderr),
            stdout,
            stderr,
        }
    }
}

/// `losetup -J` (util-linux) of every bound device, or of one: device,
/// backing file and its inode (absent for a device that is not bound).
fn losetup_listing(device: Option<&String>) -> Vec<serde_json::Value> {
    let output = Command::new("losetup")
        .args(["-J", "-l", "-O", "NAME,BACK-FILE,BACK-INO"])
        .args(device)
        .output()
        .expect("running losetup");
    // Asked for one device that is not bound, losetup fails; the whole
    // listing never may.
    assert!(
        device.is_some() || output.status.success(),
        "losetup -l: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8_lossy(&output.stdout);
    if text.trim().is_empty() {
        return Vec::new();
    }
    let listing: serde_json::Value = serde_json::from_str(&text).expect("losetup -J output");
    listing["loopdevices"]
        .as_array()
        .expect("loopdevices array")
        .clone()
}

fn device_name(entry: &serde_json::Value) -> String {
    entry["name"].as_str().unwrap_or("?").to_string()
}

/// Device → backing file, for files under `dir`.
fn loop_devices_under(dir: &str) -> Vec<(String, String)> {
    losetup_listing(None)
        .iter()
        .filter_map(|d| {
            let back = d["back-file"].as_str()?;
            back.starts_with(dir)
                .then(|| (device_name(d), back.to_string()))
        })
        .collect()
}

/// The same, with the backing file's inode, for the named devices only
/// (all when none are named).
fn loop_inodes(dir: &str, only: &[String]) -> Vec<(String, String)> {
    let listing: Vec<serde_json::Value> = if only.is_empty() {
        losetup_listing(None)
    } else {
        // `losetup -l A B` would mean "bind A to the file B": one at a time.
        only.iter()
            .flat_map(|device| losetup_listing(Some(device)))
            .collect()
    };
    listing
        .iter()
        .filter_map(|d| {
            let back = d["back-file"].as_str()?;
            let inode = d["back-ino"].as_u64()?;
            back.starts_with(dir)
                .then(|| (device_name(d), format!("{back} (inode {inode})")))
        })
        .collect()
}

/// Backing files with more than one device, and those devices.
fn duplicate_groups(devices: &[(String, String)]) -> Vec<(String, Vec<String>)> {
    let mut per_file: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for (name, back) in devices {
        per_file.entry(back).or_default().push(name.clone());
    }
    per_file
        .into_iter()
        .filter(|(_, names)| names.len() > 1)
        .map(|(file, names)| (file.to_string(), names))
        .collect()
}

/// Backing files with more than one device: never allowed, not even for
/// a moment.
fn duplicates(devices: &[(String, String)]) -> Vec<String> {
    duplicate_groups(devices)
        .into_iter()
        .map(|(file, names)| format!("{file}: {names:?}"))
        .collect()
}

/// Two devices of one file in a listing taken while operations run, still
/// both bound to that inode when asked again at once. One listing is no
/// snapshot: it reads device after device, so a detach and an attach of
/// the same file between two of its reads show both devices although they
/// never coexisted. Returns the confirmed ones and how many were not.
fn confirmed_duplicates(dir: &str) -> (Vec<String>, usize) {
    let mut confirmed = Vec::new();
    let mut passing = 0;
    for (file, names) in duplicate_groups(&loop_inodes(dir, &[])) {
        let again = duplicate_groups(&loop_inodes(dir, &names));
        if again.iter().any(|(same, _)| *same == file) {
            confirmed.push(format!("{file}: {names:?}"));
        } else {
            passing += 1;
        }
    }
    (confirmed, passing)
}

struct Record {
    size: u64,
    enabled: bool,
}

/// The registry as the TOML files say, read without our parser.
fn registry(fx: &Fixture) -> BTreeMap<String, Record> {
    let mut records = BTreeMap::new();
    for entry in fs::read_dir(fx.host("/etc/sparse-volume/volumes.d")).expect("volumes.d") {
        let entry = entry.expect("volumes.d entry");
        let name = entry.file_name().to_string_lossy().into_owned();
        let text = fs::read_to_string(entry.path()).expect("registry file");
        let value: toml::Value = toml::from_str(&text)
            .unwrap_or_else(|e| panic!("registry file {name} does not parse: {e}\n{text}"));
        let uuid = value["uuid"].as_str().expect("uuid").to_string();
        assert_eq!(name, format!("{uuid}.toml"), "file name and uuid disagree");
        records.insert(
            uuid,
            Record {
                size: value["size"].as_integer().expect("size") as u64,
                enabled: value["enabled"].as_bool().expect("enabled"),
            },
        );
    }
    records
}

fn blkid_value(path: &str, key: &str) -> String {
    let text = tool("blkid", &["-p", "-o", "export", path]);
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("blkid found no {key} in {path}: {text}"))
        .to_string()
}

/// The state after a round, when nothing runs: read from the TOML files,
/// the storage root, `losetup`, `blkid` and `dumpe2fs`. Inconsistencies
/// go to `problems` (a panic here would leave the workers at the barrier).
struct Snapshot {
    records: BTreeMap<String, Record>,
    attached: BTreeSet<String>,
}

fn snapshot(fx: &Fixture, storage_text: &str, problems: &mut Vec<String>) -> Snapshot {
    let records = registry(fx);
    let devices = loop_devices_under(storage_text);
    problems.extend(duplicates(&devices));
    let attached: BTreeSet<String> = devices
        .iter()
        .map(|(_, back)| back.rsplit('/').next().expect("a file name").to_string())
        .collect();
    let files: BTreeSet<String> = fs::read_dir(storage_text)
        .expect("storage root")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    let registered: BTreeSet<String> = records.keys().cloned().collect();
    if files != registered {
        problems.push(format!(
            "the storage root holds {files:?}, the registry {registered:?} (leftover or lost files)"
        ));
    }
    if !attached.is_subset(&registered) {
        problems.push(format!("devices on unregistered files: {devices:?}"));
    }
    for (uuid, record) in &records {
        let path = fx.backing(uuid);
        let path_text = path.to_str().expect("UTF-8 path");
        let Ok(meta) = fs::metadata(&path) else {
            continue; // reported as a lost file above
        };
        if meta.len() != record.size {
            problems.push(format!(
                "{uuid}: the file has {} bytes, the registry records {}",
                meta.len(),
                record.size
            ));
        }
        let (found, kind) = (
            blkid_value(path_text, "UUID"),
            blkid_value(path_text, "TYPE"),
        );
        if found != *uuid || kind != "ext4" {
            problems.push(format!("{uuid}: the file holds {kind} {found}"));
        }
        let applied = ext4_bytes(std::path::Path::new(path_text));
        if applied != record.size {
            problems.push(format!(
                "{uuid}: the file system has {applied} bytes, the registry records {}",
                record.size
            ));
        }
    }
    Snapshot { records, attached }
}

/// The oracle, for the operations of one round against the state right
/// after it. Operations on one volume are serialised by the product's
/// locks, so each took effect at one instant inside [start, end] of its
/// process; the state must be the effect of some order consistent with
/// those intervals. We check only the claims that hold for EVERY such
/// order: a success of X started at s is contradicted by the state only if
/// no operation that could undo X could have taken effect after X, i.e. no
/// successful undoing operation of the round ended after s (one that ended
/// before s took effect before X did; earlier rounds ended before this one
/// began). Refusals change nothing; failures are reported on their own.
/// Returns how many claims were checked.
fn contradictions(ops: &[Op], state: &Snapshot, problems: &mut Vec<String>) -> usize {
    let mut checked = 0;
    for op in ops.iter().filter(|o| o.ok()) {
        let uuid = UUIDS[op.volume];
        let present = state.records.get(uuid);
        let undone = |kinds: &[Kind]| {
            ops.iter().any(|o| {
                o.volume == op.volume && kinds.contains(&o.kind) && o.ok() && o.end > op.start
            })
        };
        let verdict = match op.kind {
            // remove: gone, unless a create could have re-made it after.
            Kind::Remove if !undone(&[Kind::Create]) => {
                Some(present.is_some().then_some("removed, but registered"))
            }
            // create: there, unless a remove could have come after.
            Kind::Create if !undone(&[Kind::Remove]) => {
                Some(present.is_none().then_some("created, but missing"))
            }
            // resize to S: a size >= S is recorded, unless it was removed
            // (and perhaps re-made at its base size) after.
            Kind::Resize if !undone(&[Kind::Remove]) => Some(match present {
                None => Some("resized, but missing"),
                Some(r) if r.size < op.size => Some("resize reported, size not recorded"),
                Some(_) => None,
            }),
            // The flag as set, unless the opposite call or a remove (and a
            // create, which makes volumes enabled) came after.
            Kind::Enable if !undone(&[Kind::Disable, Kind::Remove]) => Some(match present {
                None => Some("enabled, but missing"),
                Some(r) if !r.enabled => Some("enabled, but the flag is false"),
                Some(_) => None,
            }),
            Kind::Disable if !undone(&[Kind::Enable, Kind::Remove, Kind::Create]) => {
                Some(match present {
                    None => Some("disabled, but missing"),
                    Some(r) if r.enabled => Some("disabled, but the flag is true"),
                    Some(_) => None,
                })
            }
            Kind::Attach if !undone(&[Kind::Detach, Kind::Remove]) => {
                Some((!state.attached.contains(uuid)).then_some("attached, but no device"))
            }
            Kind::Detach if !undone(&[Kind::Attach]) => Some(
                state
                    .attached
                    .contains(uuid)
                    .then_some("detached, but a device is left"),
            ),
            _ => None,
        };
        if let Some(violation) = verdict {
            checked += 1;
            if let Some(what) = violation {
                problems.push(format!("{what}: {}", op.line()));
            }
        }
    }
    checked
}

fn pick_kind(rng: &mut Rng) -> Kind {
    let mut pick = rng.below(MIX.iter().map(|(_, w)| w).sum());
    for (kind, weight) in MIX {
        if pick < weight {
            return kind;
        }
        pick -= weight;
    }
    unreachable!("pick is below the sum of the weights")
}

#[test]
fn overlapping_operations_by_32_processes_leave_a_consistent_state() {
    needs_root!();
    let seed = seed();
    let rounds: usize = std::env::var("SV_ROUNDS")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(DEFAULT_ROUNDS);
    println!(
        "concurrency: seed {seed} (replay with SV_SEED={seed}), {WORKERS} workers x {rounds} rounds"
    );

    let fx = Fixture::new();
    let bus = PrivateBus::start();
    let stub = StubSystemd::start(&bus.address, fx.root.path().to_path_buf());
    let world = World {
        stub,
        bus,
        fx,
        epoch: Instant::now(),
    };
    let storage = world.fx.host("/var/lib/sparse-volume");
    let storage_text = storage.to_str().expect("UTF-8 path").to_string();

    // Each round: all workers start one operation together (32 processes
    // at once), then, with nothing running, the state is audited and the
    // round's success claims are checked against it.
    let barrier = Barrier::new(WORKERS + 1);
    let round_ops = Mutex::new(Vec::new());
    let done = AtomicBool::new(false);
    let samples = Mutex::new((0usize, Vec::<String>::new(), 0usize));
    let mut ops: Vec<Op> = Vec::new();
    let mut problems: Vec<String> = Vec::new();
    let mut claims = 0usize;
    std::thread::scope(|scope| {
        // An independent watcher, also mid-round: at no moment may one
        // file have two loop devices, nor a device outlive its file.
        scope.spawn(|| {
            while !done.load(Ordering::Relaxed) {
                let (mut bad, passing) = confirmed_duplicates(&storage_text);
                let devices = loop_devices_under(&storage_text);
                bad.extend(
                    devices
                        .iter()
                        .filter(|(_, back)| back.ends_with("(deleted)"))
                        .map(|(name, back)| format!("{name} on deleted {back}")),
                );
                let mut samples = samples.lock().unwrap();
                samples.0 += 1;
                samples.1.extend(bad);
                samples.2 += passing;
                drop(samples);
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        // A reader that never takes a lock, as `list`, the generator and
        // the unit's attach do: every registry file it finds must be whole
        // (writes are atomic renames), never empty or half written.
        scope.spawn(|| {
            let dir = world.fx.host("/etc/sparse-volume/volumes.d");
            let mut reads = 0usize;
            while !done.load(Ordering::Relaxed) {
                for entry in fs::read_dir(&dir).into_iter().flatten().flatten() {
                    let name = entry.file_name().to_string_lossy().into_owned();
                    if name.starts_with('.') || !name.ends_with(".toml") {
                        continue;
                    }
                    let Ok(text) = fs::read_to_string(entry.path()) else {
                        continue; // removed since the listing
                    };
                    reads += 1;
                    let whole = toml::from_str::<toml::Value>(&text)
                        .is_ok_and(|v| v.get("uuid").is_some() && v.get("size").is_some());
                    if !whole {
                        samples
                            .lock()
                            .unwrap()
                            .1
                            .push(format!("{name} read as {text:?}"));
                    }
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            println!("concurrency: {reads} lock-free registry reads");
        });
        for worker in 0..WORKERS {
            let (world, barrier, round_ops) = (&world, &barrier, &round_ops);
            scope.spawn(move || {
                let mut rng = Rng(seed ^ (worker as u64).wrapping_mul(0xA24B_AED4_963E_E407));
                for _ in 0..rounds {
                    let kind = pick_kind(&mut rng);
                    let volume = rng.below(UUIDS.len() as u64) as usize;
                    let size = match kind {
                        Kind::Resize => base_size(volume) + rng.below(17) * MIB,
                        _ => base_size(volume),
                    };
                    barrier.wait();
                    let op = world.run(worker, kind, volume, size);
                    round_ops.lock().unwrap().push(op);
                    barrier.wait();
                }
            });
        }
        for _ in 0..rounds {
            barrier.wait();
            barrier.wait();
            let finished = std::mem::take(&mut *round_ops.lock().unwrap());
            let state = snapshot(&world.fx, &storage_text, &mut problems);
            claims += contradictions(&finished, &state, &mut problems);
            ops.extend(finished);
        }
        done.store(true, Ordering::Relaxed);
    });
    let stub_calls = world.stub.calls().len();
    let (sample_count, sampled_problems, passing_duplicates) = samples.into_inner().unwrap();
    let fx = &world.fx;

    // Counts, printed before any assertion so a failing run still shows them.
    let mut per_kind: BTreeMap<Kind, [usize; 3]> = BTreeMap::new();
    for op in &ops {
        let slot = match op.outcome {
            Outcome::Success => 0,
            Outcome::Refusal => 1,
            Outcome::Failure => 2,
        };
        per_kind.entry(op.kind).or_default()[slot] += 1;
    }
    let total = |slot: usize| per_kind.values().map(|c| c[slot]).sum::<usize>();
    println!(
        "concurrency: {rounds} rounds, {} operations in {:?}; {sample_count} losetup samples ({passing_duplicates} showed one file on two devices that were not both bound to it when asked again at once); {stub_calls} calls to the stub systemd",
        ops.len(),
        world.epoch.elapsed()
    );
    for (kind, [ok, refused, failed]) in &per_kind {
        println!("  {kind:?}: {ok} succeeded, {refused} refused, {failed} failed");
    }
    println!(
        "concurrency: successes {}, refusals {}, failures {}; {claims} success claims checked against the state after their round",
        total(0),
        total(1),
        total(2)
    );
    assert!(
        sampled_problems.is_empty(),
        "seen while running: {sampled_problems:#?}"
    );
    assert!(
        problems.is_empty(),
        "inconsistent state or contradicted claims:\n{}",
        problems.join("\n")
    );
    // The mix must actually have exercised the contended paths.
    for kind in [
        Kind::Create,
        Kind::Attach,
        Kind::Detach,
        Kind::Enable,
        Kind::Disable,
        Kind::Resize,
        Kind::Remove,
    ] {
        assert!(
            per_kind.get(&kind).is_some_and(|c| c[0] > 0),
            "no successful {kind:?} in this run; raise SV_ROUNDS"
        );
    }

    // The end state, once more, with fsck and our own view of it.
    let state = snapshot(fx, &storage_text, &mut problems);
    assert!(problems.is_empty(), "{problems:#?}");
    for uuid in state.records.keys() {
        let fsck = Command::new("e2fsck")
            .arg("-fn")
            .arg(fx.backing(uuid))
            .output()
            .expect("running e2fsck");
        assert!(
            fsck.status.success(),
            "{uuid}: e2fsck -fn: {}",
            String::from_utf8_lossy(&fsck.stdout)
        );
    }
    let list = fx.run(&["list", "--json"]);
    assert_eq!(list.code, 0, "list: {}", list.stderr);
    let listed: BTreeMap<String, u64> = list.json()["volumes"]
        .as_array()
        .expect("volumes")
        .iter()
        .map(|v| {
            (
                v["uuid"].as_str().expect("uuid").to_string(),
                v["size"].as_u64().expect("size"),
            )
        })
        .collect();
    let recorded: BTreeMap<String, u64> = state
        .records
        .iter()
        .map(|(u, r)| (u.clone(), r.size))
        .collect();
    assert_eq!(
        listed, recorded,
        "list --json disagrees with the registry files"
    );
    let check = fx.run(&["check", "--json"]);
    let mut reported: BTreeSet<String> = BTreeSet::new();
    for finding in check.json()["findings"].as_array().expect("findings") {
        assert_eq!(
            finding["kind"], "not-attached",
            "check found a real problem: {finding}"
        );
        reported.insert(finding["uuid"].as_str().expect("uuid").to_string());
    }
    // The one finding a quiet end state may have: enabled, not attached.
    let expected: BTreeSet<String> = state
        .records
        .iter()
        .filter(|(u, r)| r.enabled && !state.attached.contains(*u))
        .map(|(u, _)| u.clone())
        .collect();
    assert_eq!(reported, expected, "check: {}", check.stdout);

    let failures: Vec<String> = ops
        .iter()
        .filter(|o| o.outcome == Outcome::Failure)
        .map(Op::line)
        .collect();
    // Last, so that a failed operation does not hide what the state says.
    assert!(
        failures.is_empty(),
        "failed operations:\n{}",
        failures.join("\n")
    );
    for uuid in state.records.keys() {
        let detached = fx.run(&["detach", uuid]);
        assert_eq!(detached.code, 0, "detach {uuid}: {}", detached.stderr);
    }
    drop(world);
}

/// The watcher's check can fail: one file bound twice (by hand, as no
/// operation of ours may) is a confirmed duplicate, and two devices of
/// two files are not.
#[test]
fn the_duplicate_watcher_confirms_a_file_bound_twice() {
    needs_root!();
    let dir = tempfile::tempdir().expect("a directory");
    let path = |name: &str| dir.path().join(name).to_str().expect("UTF-8").to_string();
    let bind = |file: &str| {
        tool("losetup", &["--find", "--show", file])
            .trim()
            .to_string()
    };
    for name in ["twice", "once"] {
        tool("truncate", &["-s", "8M", &path(name)]);
    }
    let devices = [
        bind(&path("twice")),
        bind(&path("twice")),
        bind(&path("once")),
    ];
    let (confirmed, passing) = confirmed_duplicates(dir.path().to_str().expect("UTF-8"));
    for device in &devices {
        tool("losetup", &["-d", device]);
    }
    assert_eq!(passing, 0, "{confirmed:?}");
    assert_eq!(confirmed.len(), 1, "{confirmed:?}");
    assert!(
        confirmed[0].contains("twice") && confirmed[0].contains(&devices[0]),
        "{confirmed:?}"
    );
}
