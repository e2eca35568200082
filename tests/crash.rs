//! SIGKILL at random moments, not only at the named crash points: a
//! seeded RNG picks an operation (create, resize, remove, enable/disable,
//! attach) and a delay spread over that operation's measured duration,
//! and the process is killed after it. After every trial `check --repair`
//! (plus the documented finish of an interrupted resize or remove: run it
//! again) must leave a state `check` calls clean, every registered volume
//! must pass `e2fsck -fn` and match its record, and a volume holding known
//! data must still hold it. Volumes being created may vanish; registered
//! ones must not lose data.
//!
//! The seed is printed and replayable with `SV_SEED`; `SV_CRASH_TRIALS`
//! sets the number of trials (default 300).

#![cfg(feature = "dbus")]

mod common;
mod stub_systemd;

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{ext4_bytes, loops_of, new_uuid, tool, Fixture, Rng, Run};
use stub_systemd::{PrivateBus, StubSystemd};

const MIB: u64 = 1 << 20;
const NO_BUS: &str = "unix:path=/nonexistent";
const DEFAULT_TRIALS: usize = 300;
/// Resizes stop at this size (see `plan`).
const MAX_SIZE: u64 = 120 * MIB;
/// Trial volumes besides the data volume; more get removed first.
const POOL: usize = 3;

fn env_number(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|text| {
        text.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name} must be a number"))
    })
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Create,
    Resize,
    Remove,
    Enable,
    Attach,
}

const KINDS: [Kind; 5] = [
    Kind::Create,
    Kind::Resize,
    Kind::Remove,
    Kind::Enable,
    Kind::Attach,
];

struct World {
    // Drop order: the stub leaves the bus, the bus dies, then the fixture
    // detaches what is left.
    stub: StubSystemd,
    bus: PrivateBus,
    fx: Fixture,
}

impl World {
    /// The CLI with an unreachable system bus, or (enable/disable, which
    /// refuse to change the flag without systemd) the stub's private bus.
    fn command(&self, args: &[&str]) -> Command {
        let bus = match args.first() {
            Some(&"enable") | Some(&"disable") => self.bus.address.as_str(),
            _ => NO_BUS,
        };
        let mut command = self.fx.command(args);
        command.env("DBUS_SYSTEM_BUS_ADDRESS", bus);
        command
    }

    fn run(&self, args: &[&str]) -> Run {
        let output = self.command(args).output().expect("running sparse-volume");
        Run {
            code: output.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }

    fn run_ok(&self, args: &[&str]) -> Run {
        let run = self.run(args);
        assert_eq!(
            run.code, 0,
            "sparse-volume {args:?}: {}{}",
            run.stdout, run.stderr
        );
        run
    }
}

struct Record {
    size: u64,
    enabled: bool,
}

/// The registry as its TOML files say, read without our parser.
fn registry(fx: &Fixture) -> BTreeMap<String, Record> {
    let mut records = BTreeMap::new();
    for entry in fs::read_dir(fx.host("/etc/sparse-volume/volumes.d")).expect("volumes.d") {
        let path = entry.expect("volumes.d entry").path();
        let name = path
            .file_name()
            .expect("a name")
            .to_string_lossy()
            .into_owned();
        if name.starts_with('.') {
            continue; // a temporary; `check` judges those
        }
        let text = fs::read_to_string(&path).expect("registry file");
        let value: toml::Value = toml::from_str(&text)
            .unwrap_or_else(|e| panic!("registry file {name} does not parse: {e}\n{text}"));
        records.insert(
            value["uuid"].as_str().expect("uuid").to_string(),
            Record {
                size: value["size"].as_integer().expect("size") as u64,
                enabled: value["enabled"].as_bool().expect("enabled"),
            },
        );
    }
    records
}

fn blkid_uuid(path: &Path) -> String {
    tool(
        "blkid",
        &[
            "-p",
            "-o",
            "value",
            "-s",
            "UUID",
            path.to_str().expect("UTF-8 path"),
        ],
    )
    .trim()
    .to_string()
}

/// The data file, read straight from the backing file with debugfs: no
/// mount, no loop device, no code of ours.
fn read_data(path: &Path) -> Vec<u8> {
    let output = Command::new("debugfs")
        .args(["-c", "-R", "cat /data"])
        .arg(path)
        .stderr(Stdio::null())
        .output()
        .expect("running debugfs");
    output.stdout
}

/// What the trials saw, printed at the end.
#[derive(Default)]
struct Tally {
    trials: BTreeMap<Kind, usize>,
    killed: BTreeMap<Kind, usize>,
    finished_first: BTreeMap<Kind, usize>,
    repaired: BTreeMap<String, usize>,
    rerun: BTreeMap<&'static str, usize>,
    created_then_gone: usize,
}

fn bump<K: Ord>(map: &mut BTreeMap<K, usize>, key: K) {
    *map.entry(key).or_default() += 1;
}

/// `check --repair`, the documented finish of what repair leaves (an
/// interrupted resize or remove is finished by running it again), and a
/// final `check` that must be clean.
fn repair(world: &World, tally: &mut Tally, trial: &str, rerun: Option<&[&str]>) {
    let repaired = world.run(&["check", "--repair", "--json"]);
    for finding in repaired.json()["findings"].as_array().expect("findings") {
        if finding["repaired"] == true {
            bump(
                &mut tally.repaired,
                finding["kind"].as_str().expect("kind").to_string(),
            );
        }
    }
    let check = world.run(&["check", "--json"]);
    if check.code == 0 {
        return;
    }
    let kinds: BTreeSet<String> = check.json()["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .map(|f| f["kind"].as_str().expect("kind").to_string())
        .collect();
    let finishable = ["size-mismatch", "missing-backing-file"];
    assert!(
        kinds.iter().all(|k| finishable.contains(&k.as_str())),
        "{trial}: check --repair left {}",
        check.stdout
    );
    let args = rerun.unwrap_or_else(|| panic!("{trial}: nothing to re-run for {kinds:?}"));
    let finished = world.run(args);
    assert_eq!(
        finished.code, 0,
        "{trial}: re-running {args:?} to finish it failed: {}",
        finished.stderr
    );
    bump(
        &mut tally.rerun,
        if args[0] == "resize" {
            "resize"
        } else {
            "remove"
        },
    );
    // The finish may leave an enabled volume detached; repair attaches it.
    world.run(&["check", "--repair"]);
    let check = world.run(&["check", "--json"]);
    assert_eq!(
        check.code, 0,
        "{trial}: not clean after re-running: {}",
        check.stdout
    );
}

/// Everything registered is whole, and nothing else is there.
fn audit(world: &World, trial: &str, data_volume: &str, data: &[u8]) {
    let fx = &world.fx;
    let records = registry(fx);
    assert!(
        records.contains_key(data_volume),
        "{trial}: the data volume is gone"
    );
    let storage = fx.host("/var/lib/sparse-volume");
    let files: BTreeSet<String> = fs::read_dir(&storage)
        .expect("storage root")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    let registered: BTreeSet<String> = records.keys().cloned().collect();
    assert_eq!(files, registered, "{trial}: leftover or lost backing files");
    for (uuid, record) in &records {
        let path = fx.backing(uuid);
        assert_eq!(
            fs::metadata(&path).expect("backing file").len(),
            record.size,
            "{trial}: {uuid} file size"
        );
        assert_eq!(blkid_uuid(&path), *uuid, "{trial}: {uuid} content");
        assert_eq!(
            ext4_bytes(&path),
            record.size,
            "{trial}: {uuid} file system size"
        );
        let fsck = Command::new("e2fsck")
            .arg("-fn")
            .arg(&path)
            .output()
            .expect("running e2fsck");
        assert!(
            fsck.status.success(),
            "{trial}: e2fsck -fn {uuid}: {}",
            String::from_utf8_lossy(&fsck.stdout)
        );
        let devices = loops_of(&path);
        assert!(
            devices.len() <= 1,
            "{trial}: {uuid} has devices {devices:?}"
        );
        // Repair attaches every enabled volume.
        assert!(
            !record.enabled || devices.len() == 1,
            "{trial}: {uuid} is enabled but not attached after repair"
        );
    }
    assert!(
        read_data(&fx.backing(data_volume)) == data,
        "{trial}: the data volume's data changed"
    );
}

/// Writes known data into a fresh volume through a real mount.
fn make_data_volume(world: &World, rng: &mut Rng) -> (String, Vec<u8>) {
    let uuid = new_uuid();
    world.run_ok(&["create", "--size", "32M", "--uuid", &uuid]);
    world.run_ok(&["attach", &uuid]);
    let data: Vec<u8> = (0..2 * MIB).map(|_| rng.next() as u8).collect();
    let device = loops_of(&world.fx.backing(&uuid)).remove(0);
    let point = world.fx.host("/mnt-data");
    fs::create_dir_all(&point).expect("mount point");
    let point_text = point.to_str().expect("UTF-8 path");
    tool("mount", &[&device, point_text]);
    fs::write(point.join("data"), &data).expect("writing data");
    tool("umount", &[point_text]);
    assert!(
        read_data(&world.fx.backing(&uuid)) == data,
        "data not written"
    );
    (uuid, data)
}

/// The operation of a trial: its arguments and how to finish it if it
/// was interrupted.
struct Plan {
    kind: Kind,
    args: Vec<String>,
    /// A created volume, which may legitimately vanish.
    creates: Option<String>,
}

fn plan(world: &World, rng: &mut Rng, kind: Kind, data_volume: &str) -> Plan {
    let records = registry(&world.fx);
    let others: Vec<&String> = records.keys().filter(|u| *u != data_volume).collect();
    // Keep the pool small: remove when full; a remove with nothing to
    // remove first creates (uninterrupted) what it will remove.
    let kind = match kind {
        Kind::Create if others.len() >= POOL => Kind::Remove,
        // Sizes stay below the second ext4 block group (128 MiB with 4 KiB
        // blocks): resize2fs drops a too-small last group, so a resize to
        // just past it grows the file but not the file system (reported
        // as a product defect; this suite is about crashes).
        Kind::Resize if records.values().any(|r| r.size > MAX_SIZE) => Kind::Enable,
        other => other,
    };
    let made;
    let others = if kind == Kind::Remove && others.is_empty() {
        made = new_uuid();
        world.run_ok(&["create", "--size", "16M", "--uuid", &made]);
        vec![&made]
    } else {
        others
    };
    // Any registered volume, the data volume included (its data must
    // survive resizes, flag changes and attaches).
    let mut any = || -> String {
        let all: Vec<&String> = records.keys().collect();
        all[rng.below(all.len() as u64) as usize].clone()
    };
    let (args, creates) = match kind {
        Kind::Create => {
            let uuid = new_uuid();
            let args = vec!["create", "--size", "16M", "--uuid", &uuid]
                .into_iter()
                .map(String::from)
                .collect();
            (args, Some(uuid))
        }
        Kind::Remove => {
            let uuid = others[rng.below(others.len() as u64) as usize].clone();
            (vec!["remove".into(), uuid, "--delete-data".into()], None)
        }
        Kind::Resize => {
            let uuid = any();
            let size = records[&uuid].size + (1 + rng.below(4)) * MIB;
            (
                vec!["resize".into(), uuid, "--size".into(), size.to_string()],
                None,
            )
        }
        Kind::Enable => {
            let uuid = any();
            let verb = if records[&uuid].enabled {
                "disable"
            } else {
                "enable"
            };
            (vec![verb.into(), uuid], None)
        }
        Kind::Attach => {
            // Detached first, so the attach has real work to be killed in.
            let uuid = any();
            world.run_ok(&["detach", &uuid]);
            (vec!["attach".into(), uuid], None)
        }
    };
    Plan {
        kind,
        args,
        creates,
    }
}

/// After a crash nothing of the killed command runs any more: its tools
/// (already reparented once it is reaped) must be gone too, or they would
/// still hold the device open when the next command starts.
fn wait_for_group_gone(group: i32) {
    // Zombies do not count: they closed their files when they died (and
    // nothing may reap them when PID 1 is not an init).
    let running = || {
        fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .any(|entry| {
                let Ok(stat) = fs::read_to_string(entry.path().join("stat")) else {
                    return false;
                };
                // pid (comm) state ppid pgrp ...
                let Some((_, rest)) = stat.rsplit_once(')') else {
                    return false;
                };
                let fields: Vec<&str> = rest.split_whitespace().collect();
                fields.len() > 2 && fields[0] != "Z" && fields[2] == group.to_string()
            })
    };
    while running() {
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Runs the plan to completion and returns its wall time.
fn timed(world: &World, plan: &Plan) -> Duration {
    let args: Vec<&str> = plan.args.iter().map(String::as_str).collect();
    let start = Instant::now();
    world.run_ok(&args);
    start.elapsed()
}

#[test]
fn random_sigkills_leave_state_that_check_repair_makes_whole() {
    needs_root!();
    let seed = env_number("SV_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock after 1970")
            .as_nanos() as u64
    });
    let trials = env_number("SV_CRASH_TRIALS").map_or(DEFAULT_TRIALS, |n| n as usize);
    println!("crash: seed {seed} (replay with SV_SEED={seed}), {trials} trials");
    let mut rng = Rng(seed);
    let started = Instant::now();

    let fx = Fixture::new();
    let bus = PrivateBus::start();
    let stub = StubSystemd::start(&bus.address, fx.root.path().to_path_buf());
    let world = World { stub, bus, fx };
    let (data_volume, data) = make_data_volume(&world, &mut rng);

    // How long each operation really takes here, uninterrupted: the kill
    // delays are spread over that (and a little past it, so that some
    // operations finish before the kill).
    let mut measured: BTreeMap<Kind, Vec<Duration>> = BTreeMap::new();
    for _ in 0..5 {
        for kind in KINDS {
            let plan = plan(&world, &mut rng, kind, &data_volume);
            let took = timed(&world, &plan);
            measured.entry(plan.kind).or_default().push(took);
            world.run(&["check", "--repair"]);
        }
    }
    // The median: the first runs pay for cold caches.
    let duration: BTreeMap<Kind, Duration> = measured
        .into_iter()
        .map(|(kind, mut times)| {
            times.sort();
            (kind, times[times.len() / 2])
        })
        .collect();
    for (kind, took) in &duration {
        println!("crash: {kind:?} takes {took:?} uninterrupted (median)");
    }
    audit(&world, "calibration", &data_volume, &data);

    let mut tally = Tally::default();
    for trial in 0..trials {
        let kind = KINDS[rng.below(KINDS.len() as u64) as usize];
        let plan = plan(&world, &mut rng, kind, &data_volume);
        let span = duration[&plan.kind].as_micros() as u64 * 11 / 10;
        let delay = Duration::from_micros(rng.below(span.max(1)));
        let label = format!(
            "trial {trial} (SV_SEED={seed}): {:?} killed after {delay:?}",
            plan.args
        );
        let args: Vec<&str> = plan.args.iter().map(String::as_str).collect();
        // Its own process group, killed as a whole: like a power cut or
        // systemd killing the unit's cgroup, the tools it runs (mkfs,
        // e2fsck, resize2fs) die with it instead of finishing unlocked.
        let mut child = world
            .command(&args)
            .process_group(0)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawning sparse-volume");
        std::thread::sleep(delay);
        bump(&mut tally.trials, plan.kind);
        match child.try_wait().expect("polling the child") {
            Some(status) => {
                bump(&mut tally.finished_first, plan.kind);
                assert!(status.success(), "{label}: failed on its own ({status})");
            }
            None => {
                let group = i32::try_from(child.id()).expect("a pid");
                // SAFETY: kill(2) has no memory effects; the group is the
                // child's own (process_group(0) above) and not yet reaped.
                let killed = unsafe { libc::kill(-group, libc::SIGKILL) };
                assert_eq!(killed, 0, "kill -9 of the process group failed");
                wait_for_group_gone(group);
                let status = child.wait().expect("reaping the child");
                if status.signal() == Some(9) {
                    bump(&mut tally.killed, plan.kind);
                } else {
                    // It finished between the poll and the kill.
                    bump(&mut tally.finished_first, plan.kind);
                    assert!(status.success(), "{label}: failed on its own ({status})");
                }
            }
        }
        let rerun: Option<&[&str]> = match plan.kind {
            Kind::Resize | Kind::Remove => Some(&args),
            _ => None,
        };
        repair(&world, &mut tally, &label, rerun);
        if let Some(uuid) = &plan.creates {
            if !registry(&world.fx).contains_key(uuid) {
                tally.created_then_gone += 1;
            }
        }
        audit(&world, &label, &data_volume, &data);
    }

    println!("crash: {trials} trials in {:?}", started.elapsed());
    for kind in KINDS {
        println!(
            "  {kind:?}: {} trials, {} killed before completion, {} finished first",
            tally.trials.get(&kind).copied().unwrap_or(0),
            tally.killed.get(&kind).copied().unwrap_or(0),
            tally.finished_first.get(&kind).copied().unwrap_or(0)
        );
    }
    println!(
        "crash: killed before completion {}, creates that left nothing {}",
        tally.killed.values().sum::<usize>(),
        tally.created_then_gone
    );
    println!("crash: repairs by kind {:?}", tally.repaired);
    println!("crash: finished by re-running {:?}", tally.rerun);
    println!(
        "crash: {} calls to the stub systemd",
        world.stub.calls().len()
    );
    println!("crash: failures 0");
    assert!(
        tally.killed.values().sum::<usize>() * 2 >= trials,
        "most kills came too late to interrupt anything: {:?}",
        tally.killed
    );
    for uuid in registry(&world.fx).keys() {
        world.run_ok(&["detach", uuid]);
    }
    drop(world);
}
