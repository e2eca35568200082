//! enable/disable/start/stop/list/status against a real dbus-daemon on a
//! private socket, with a stub systemd on it (tests/stub_systemd). The
//! same commands against real systemd run in the VM test.

#![cfg(feature = "dbus")]

mod common;
mod stub_systemd;

use std::fs;
use std::time::{Duration, Instant};

use common::{loops_of, new_uuid, tool, Fixture, Run};
use stub_systemd::{PrivateBus, StubSystemd};

/// A registry fixture, a private bus and a stub systemd on it. Fields drop
/// in order: the stub leaves the bus, then the daemon is killed.
struct World {
    stub: StubSystemd,
    bus: PrivateBus,
    fx: Fixture,
}

impl World {
    fn new() -> Self {
        let fx = Fixture::new();
        let bus = PrivateBus::start();
        let stub = StubSystemd::start(&bus.address, fx.root.path().to_path_buf());
        Self { stub, bus, fx }
    }

    fn run(&self, args: &[&str]) -> Run {
        run_on(&self.fx, &self.bus.address, args, &[])
    }

    fn run_with(&self, args: &[&str], env: &[(&str, &str)]) -> Run {
        run_on(&self.fx, &self.bus.address, args, env)
    }

    fn run_ok(&self, args: &[&str]) -> Run {
        let run = self.run(args);
        assert_eq!(run.code, 0, "sparse-volume {args:?} failed: {}", run.stderr);
        run
    }

    /// A registered ext4 volume with the given `enabled` flag; the stub's
    /// jobs run the real attach/detach on it, as the unit would.
    fn volume(&self, enabled: bool) -> String {
        let uuid = new_uuid();
        self.fx.make_ext4(&uuid);
        self.fx
            .register(&uuid, "filesystem", &format!("enabled = {enabled}\n"));
        uuid
    }

    fn calls(&self) -> Vec<String> {
        self.stub.calls()
    }
}

/// Runs the CLI against `address` as the system bus; never the host's.
fn run_on(fx: &Fixture, address: &str, args: &[&str], env: &[(&str, &str)]) -> Run {
    let mut command = fx.command(args);
    command.env("DBUS_SYSTEM_BUS_ADDRESS", address);
    for (key, value) in env {
        command.env(key, value);
    }
    let output = command.output().expect("running sparse-volume");
    Run {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

fn unit(uuid: &str) -> String {
    format!("sparse-volume@{uuid}.service")
}

fn registry_says_enabled(fx: &Fixture, uuid: &str) -> bool {
    let text = fs::read_to_string(fx.registry_file(uuid)).unwrap();
    let value: toml::Value = toml::from_str(&text).unwrap();
    value["enabled"].as_bool().unwrap()
}

fn position(calls: &[String], wanted: &str) -> usize {
    calls
        .iter()
        .position(|c| c == wanted)
        .unwrap_or_else(|| panic!("no call {wanted:?} in {calls:#?}"))
}

#[test]
fn enable_now_sets_the_flag_reloads_then_starts() {
    needs_root!();
    let world = World::new();
    let uuid = world.volume(false);

    let report = world.run_ok(&["enable", &uuid, "--now", "--json"]).json();
    assert_eq!(report["changed"], true);
    assert_eq!(report["uuid"], uuid.as_str());
    assert_eq!(report["unit"], unit(&uuid).as_str());
    assert_eq!(report["enabled"], true);
    assert_eq!(report["reloaded"], true);
    assert_eq!(report["job_result"], "done");
    assert_eq!(report["active_state"], "active");
    assert!(registry_says_enabled(&world.fx, &uuid));

    let calls = world.calls();
    let reload = position(&calls, "Reload");
    let subscribe = position(&calls, "Subscribe");
    let start = position(&calls, &format!("StartUnit {} replace", unit(&uuid)));
    assert!(
        reload < start,
        "Reload must come before StartUnit: {calls:#?}"
    );
    assert!(
        subscribe < start,
        "Subscribe must come before StartUnit: {calls:#?}"
    );

    // Idempotent: nothing to change, no reload, no second start.
    let again = world.run_ok(&["enable", &uuid, "--now", "--json"]).json();
    assert_eq!(again["changed"], false, "{again}");
    assert_eq!(again["reloaded"], false);
    assert_eq!(again["job_result"], serde_json::Value::Null);
    assert_eq!(again["active_state"], "active");
    let calls = world.calls();
    assert_eq!(
        calls.iter().filter(|c| *c == "Reload").count(),
        1,
        "{calls:#?}"
    );
    assert_eq!(
        calls.iter().filter(|c| c.starts_with("StartUnit")).count(),
        1
    );
}

#[test]
fn enable_without_now_only_reloads_and_a_hand_edit_is_noticed() {
    needs_root!();
    let world = World::new();
    let uuid = world.volume(false);
    let report = world.run_ok(&["enable", &uuid, "--json"]).json();
    assert_eq!(report["changed"], true);
    assert_eq!(report["active_state"], serde_json::Value::Null);
    assert!(!world.calls().iter().any(|c| c.starts_with("StartUnit")));

    // A repeat changes nothing, also after a hand edit that agrees.
    world.fx.register(&uuid, "filesystem", "enabled = true\n");
    let repeat = world.run_ok(&["enable", &uuid, "--json"]).json();
    assert_eq!(repeat["changed"], false, "{repeat}");
    // Hand edits without a daemon-reload: the flag is already what the
    // command asks for, but systemd's view (RequiredBy) is not, so it
    // reloads.
    world.fx.register(&uuid, "filesystem", "enabled = false\n");
    let disabled = world.run_ok(&["disable", &uuid, "--json"]).json();
    assert_eq!(disabled["reloaded"], true, "{disabled}");
    world.fx.register(&uuid, "filesystem", "enabled = true\n");
    let drift = world.run_ok(&["enable", &uuid, "--json"]).json();
    assert_eq!(drift["reloaded"], true, "{drift}");
    assert_eq!(drift["changed"], true);
}

/// Issue 25, item 21: a volume the generator leaves out on purpose (the
/// kernel command line's `sparse_volume.skip=` or `sparse_volume=off`)
/// is never pulled in, whatever the flag: a converged node reports no
/// change, instead of a reload and `changed` at every run.
#[test]
fn a_volume_the_command_line_skips_settles_instead_of_reloading_forever() {
    needs_root!();
    for cmdline in ["sparse_volume.skip={uuid}", "sparse_volume=off"] {
        let world = World::new();
        let uuid = world.volume(false);
        let proc_cmdline = world.fx.host("/proc/cmdline");
        fs::create_dir_all(proc_cmdline.parent().unwrap()).unwrap();
        fs::write(&proc_cmdline, cmdline.replace("{uuid}", &uuid)).unwrap();
        let first = world.run_ok(&["enable", &uuid, "--json"]).json();
        assert_eq!(first["changed"], true, "{cmdline}: {first}");
        let reloads = |world: &World| world.calls().iter().filter(|c| *c == "Reload").count();
        let before = reloads(&world);
        let again = world.run_ok(&["enable", &uuid, "--json"]).json();
        assert_eq!(again["changed"], false, "{cmdline}: {again}");
        let applied = world
            .run_ok(&["apply", "--uuid", &uuid, "--enabled", "true", "--json"])
            .json();
        assert_eq!(applied["changed"], false, "{cmdline}: {applied}");
        assert_eq!(reloads(&world), before, "{cmdline}: reloaded again");
    }
}

/// Issue 25, item 10 and its review: an enabled volume that is not
/// attached is a warning only while the boot could not have attached it
/// yet (registered or changed since this boot, a `create` without
/// `--now`); one the boot should have attached, whose unit is inactive
/// (a dependency failed, a condition), is an error.
#[test]
fn not_attached_is_an_error_when_this_boot_should_have_attached_it() {
    needs_root!();
    let world = World::new();
    let fresh = world.volume(true);
    let (_, report) = check_on(&world);
    let finding = not_attached(&report, &fresh);
    assert_eq!(finding["severity"], "warning", "{finding}");
    assert!(
        finding["message"].as_str().unwrap().contains("next boot"),
        "{finding}"
    );

    let old = world.volume(true);
    // Registered before this boot: the generator saw it then.
    tool(
        "touch",
        &["-d", "@1", world.fx.registry_file(&old).to_str().unwrap()],
    );
    let (run, report) = check_on(&world);
    let finding = not_attached(&report, &old);
    assert_eq!(finding["severity"], "error", "{finding}");
    assert!(
        finding["message"].as_str().unwrap().contains("journalctl"),
        "{finding}"
    );
    assert_eq!(run.code, 1);
}

fn check_on(world: &World) -> (Run, serde_json::Value) {
    let run = world.run(&["check", "--json"]);
    let report = run.json();
    (run, report)
}

fn not_attached<'a>(report: &'a serde_json::Value, uuid: &str) -> &'a serde_json::Value {
    report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["kind"] == "not-attached" && f["uuid"] == uuid)
        .unwrap_or_else(|| panic!("no not-attached finding for {uuid}: {report}"))
}

#[test]
fn disable_now_clears_the_flag_and_stops() {
    needs_root!();
    let world = World::new();
    let uuid = world.volume(false);
    world.run_ok(&["enable", &uuid, "--now"]);

    let report = world.run_ok(&["disable", &uuid, "--now", "--json"]).json();
    assert_eq!(report["changed"], true);
    assert_eq!(report["enabled"], false);
    assert_eq!(report["job_result"], "done");
    assert_eq!(report["active_state"], "inactive");
    assert!(!registry_says_enabled(&world.fx, &uuid));
    let calls = world.calls();
    let stop = position(&calls, &format!("StopUnit {} replace", unit(&uuid)));
    assert!(position(&calls, "Reload") < stop);

    let again = world.run_ok(&["disable", &uuid, "--now", "--json"]).json();
    assert_eq!(again["changed"], false, "{again}");
}

#[test]
fn dry_runs_through_systemd_run_no_job_and_agree_with_the_real_run() {
    needs_root!();
    let world = World::new();
    let uuid = world.volume(false);
    let steps: [&[&str]; 7] = [
        &["enable", &uuid, "--now"],
        &["stop", &uuid],
        &["start", &uuid],
        &["disable", &uuid, "--now"],
        &["apply", "--uuid", &uuid, "--enabled", "true", "--now"],
        &["apply", "--uuid", &uuid, "--enabled", "false", "--now"],
        &["apply", "--uuid", &uuid, "--state", "absent"],
    ];
    for args in steps {
        let registry = fs::read(world.fx.registry_file(&uuid)).unwrap();
        let devices = loops_of(&world.fx.backing(&uuid));
        let seen = world.calls().len();
        let dry = world
            .run_ok(&[args, &["--dry-run", "--json"]].concat())
            .json();
        let calls = world.calls()[seen..].to_vec();
        assert!(
            !calls
                .iter()
                .any(|c| ["Reload", "StartUnit", "StopUnit", "ResetFailedUnit"]
                    .iter()
                    .any(|job| c.starts_with(job))),
            "{args:?} --dry-run asked systemd to change something: {calls:#?}"
        );
        assert_eq!(fs::read(world.fx.registry_file(&uuid)).unwrap(), registry);
        assert_eq!(loops_of(&world.fx.backing(&uuid)), devices);

        let real = world.run_ok(&[args, &["--json"]].concat()).json();
        assert_eq!(dry["changed"], real["changed"], "{args:?}: {dry} / {real}");
        assert_eq!(dry["actions"], real["actions"], "{args:?}");
    }
    assert!(!world.fx.registry_file(&uuid).exists());
    assert!(world.fx.backing(&uuid).exists());
}

#[test]
fn start_and_stop_report_changed_and_are_idempotent() {
    needs_root!();
    let world = World::new();
    let uuid = world.volume(true);
    let started = world.run_ok(&["start", &uuid, "--json"]).json();
    assert_eq!(started["changed"], true);
    assert_eq!(started["uuid"], uuid.as_str());
    assert_eq!(started["job_result"], "done");
    assert_eq!(started["active_state"], "active");
    assert_eq!(started["sub_state"], "exited");
    let device = started["device"].as_str().unwrap().to_string();
    assert_eq!(loops_of(&world.fx.backing(&uuid)), vec![device]);
    let again = world.run_ok(&["start", &uuid, "--json"]).json();
    assert_eq!(again["changed"], false);

    let stopped = world.run_ok(&["stop", &uuid, "--json"]).json();
    assert_eq!(stopped["changed"], true);
    assert_eq!(stopped["active_state"], "inactive");
    assert!(loops_of(&world.fx.backing(&uuid)).is_empty());
    let again = world.run_ok(&["stop", &uuid, "--json"]).json();
    assert_eq!(again["changed"], false);
    // Reads like systemctl's own output for people.
    let human = world.run_ok(&["stop", &uuid]);
    assert!(
        human.stdout.contains("already inactive"),
        "{}",
        human.stdout
    );
}

#[test]
fn start_and_repair_bring_back_a_device_detached_behind_an_active_unit() {
    needs_root!();
    // The unit is a oneshot with RemainAfterExit: it stays "active" after
    // someone detached its device by hand.
    let world = World::new();
    let uuid = world.volume(true);
    world.run_ok(&["start", &uuid]);
    world.run_ok(&["detach", &uuid]);
    assert_eq!(
        world.stub.unit(&unit(&uuid)).unwrap().active_state,
        "active"
    );

    let started = world.run_ok(&["start", &uuid, "--json"]).json();
    assert_eq!(started["changed"], true, "{started}");
    assert_eq!(loops_of(&world.fx.backing(&uuid)).len(), 1);

    world.run_ok(&["detach", &uuid]);
    let repaired = world.run(&["check", "--repair", "--json"]);
    assert_eq!(repaired.code, 0, "{}", repaired.stdout);
    assert_eq!(
        loops_of(&world.fx.backing(&uuid)).len(),
        1,
        "check --repair said repaired, the device is still gone: {}",
        repaired.stdout
    );
    world.run_ok(&["stop", &uuid]);
}

#[test]
fn stop_of_a_mounted_volume_fails_with_the_reason_and_changes_nothing() {
    needs_root!();
    let world = World::new();
    let uuid = world.volume(true);
    let device = world.run_ok(&["start", &uuid, "--json"]).json()["device"]
        .as_str()
        .unwrap()
        .to_string();
    let mnt = tempfile::tempdir().unwrap();
    tool("mount", &[&device, mnt.path().to_str().unwrap()]);
    let first = world.run(&["stop", &uuid]);
    let second = world.run(&["stop", &uuid, "--json"]);
    let disable = world.run(&["disable", &uuid, "--now"]);
    let still = loops_of(&world.fx.backing(&uuid));
    let enabled = registry_says_enabled(&world.fx, &uuid);
    tool("umount", &[mnt.path().to_str().unwrap()]);
    for run in [&first, &second, &disable] {
        assert_eq!(run.code, 1, "{}{}", run.stdout, run.stderr);
        assert!(run.stderr.contains("unmount it first"), "{}", run.stderr);
        assert!(!run.stdout.contains("\"changed\":true"), "{}", run.stdout);
    }
    assert_eq!(still, vec![device], "the device went away");
    assert!(enabled, "a refused disable --now still cleared the flag");
    assert_eq!(
        world.stub.unit(&unit(&uuid)).unwrap().active_state,
        "active"
    );
    world.run_ok(&["stop", &uuid]);
}

#[test]
fn stop_of_a_failed_unit_releases_the_device_it_left_bound() {
    needs_root!();
    let world = World::new();
    let uuid = world.volume(true);
    // A start that failed after binding (say, the udev wait timed out).
    world.run_ok(&["attach", &uuid]);
    world.stub.set_job_result(Some("failed"));
    assert_eq!(world.run(&["start", &uuid]).code, 1);
    world.stub.set_job_result(Some("done"));
    assert_eq!(
        world.stub.unit(&unit(&uuid)).unwrap().active_state,
        "failed"
    );
    let stopped = world.run_ok(&["stop", &uuid, "--json"]).json();
    assert_eq!(stopped["changed"], true);
    assert!(loops_of(&world.fx.backing(&uuid)).is_empty());
}

#[test]
fn a_failed_start_job_exits_1_naming_unit_and_result() {
    needs_root!();
    let world = World::new();
    let uuid = world.volume(true);
    world.stub.set_job_result(Some("failed"));

    let run = world.run(&["start", &uuid]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(run.stderr.contains(&unit(&uuid)), "{}", run.stderr);
    assert!(run.stderr.contains("\"failed\""), "{}", run.stderr);
    assert!(
        run.stderr.contains("exit-code"),
        "unit Result missing: {}",
        run.stderr
    );

    // The JSON error object carries changed and uuid too.
    let json = world.run(&["start", &uuid, "--json"]);
    assert_eq!(json.code, 1);
    let value = json.json();
    assert_eq!(value["changed"], false);
    assert_eq!(value["uuid"], uuid.as_str());
    assert!(value["error"].as_str().unwrap().contains("failed"));
    // A failed unit is reset before the next start (start rate limit).
    let calls = world.calls();
    position(&calls, &format!("ResetFailedUnit {}", unit(&uuid)));
}

#[test]
fn a_start_job_that_never_ends_times_out() {
    needs_root!();
    let world = World::new();
    let uuid = world.volume(true);
    world.stub.set_job_result(None);

    let began = Instant::now();
    let run = world.run_with(
        &["start", &uuid],
        &[(sparse_volume::hooks::JOB_TIMEOUT_ENV, "1")],
    );
    let took = began.elapsed();
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(run.stderr.contains("within 1 s"), "{}", run.stderr);
    assert!(took >= Duration::from_secs(1), "gave up early: {took:?}");
    assert!(took < Duration::from_secs(10), "waited too long: {took:?}");
}

#[test]
fn no_bus_at_all_fails_fast_and_changes_nothing() {
    needs_root!();
    let fx = Fixture::new();
    let uuid = new_uuid();
    fx.register(&uuid, "filesystem", "enabled = false\n");
    let missing = format!("unix:path={}", fx.root.path().join("no-bus").display());
    for args in [vec!["start", uuid.as_str()], vec!["stop", uuid.as_str()]] {
        let began = Instant::now();
        let run = run_on(&fx, &missing, &args, &[]);
        let took = began.elapsed();
        assert_eq!(run.code, 1, "{args:?}: {}", run.stderr);
        assert!(
            run.stderr
                .contains("cannot reach systemd on the system bus"),
            "{args:?}: {}",
            run.stderr
        );
        assert_eq!(
            run.stderr.trim().lines().count(),
            1,
            "one line: {}",
            run.stderr
        );
        assert!(took < Duration::from_secs(2), "{args:?} took {took:?}");
    }
    // The flag without systemd is written, as `apply --enabled` writes it
    // (issue 25, item 13), with one warning that nothing was reloaded.
    let run = run_on(&fx, &missing, &["enable", uuid.as_str()], &[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.stderr.trim().lines().count(), 1, "{}", run.stderr);
    assert!(run.stderr.contains("at the next boot"), "{}", run.stderr);
    assert!(registry_says_enabled(&fx, &uuid));
}

#[test]
fn a_bus_without_systemd_fails_fast() {
    needs_root!();
    let fx = Fixture::new();
    let bus = PrivateBus::start();
    let uuid = new_uuid();
    fx.register(&uuid, "filesystem", "");
    let began = Instant::now();
    let run = run_on(&fx, &bus.address, &["start", &uuid], &[]);
    assert_eq!(run.code, 1);
    assert!(
        run.stderr
            .contains("cannot reach systemd on the system bus")
            && run
                .stderr
                .contains("org.freedesktop.systemd1 is not on the bus"),
        "{}",
        run.stderr
    );
    assert!(began.elapsed() < Duration::from_secs(2));
}

#[test]
fn unregistered_volumes_are_named_in_the_error() {
    needs_root!();
    let world = World::new();
    let uuid = new_uuid();
    for command in ["enable", "disable", "start", "status"] {
        let run = world.run(&[command, &uuid]);
        assert_eq!(run.code, 1, "{command}: {}", run.stderr);
        assert!(
            run.stderr.contains(&uuid) && run.stderr.contains("not registered"),
            "{command}: {}",
            run.stderr
        );
    }
    // Like detach, stop needs no registry entry.
    world.run_ok(&["stop", &uuid]);
}

/// The documented, stable field names of a volume in list/status --json.
const VOLUME_FIELDS: &[&str] = &[
    "uuid",
    "name",
    "mode",
    "fs_type",
    "size",
    "allocated",
    "path",
    "enabled",
    "read_only",
    "device",
    "partition",
    "link",
    "link_state",
    "io",
    "link_target",
    "unit",
    "active_state",
    "sub_state",
    "unit_result",
    "attach_missed",
    "problems",
];

fn assert_volume_fields(volume: &serde_json::Value) {
    let object = volume.as_object().expect("a volume is a JSON object");
    for field in VOLUME_FIELDS {
        assert!(object.contains_key(*field), "missing {field} in {volume}");
    }
}

#[test]
fn list_and_status_json_have_the_documented_fields() {
    needs_root!();
    let world = World::new();
    let fx = &world.fx;
    let attached = new_uuid();
    fx.make_ext4(&attached);
    fx.register(&attached, "filesystem", "name = \"db\"\n");
    let block = new_uuid();
    fx.make_gpt(&block);
    fx.register(&block, "block", "enabled = false\n");
    let missing = new_uuid();
    fx.register(&missing, "filesystem", "");
    let broken = new_uuid();
    // Valid TOML, invalid entry: the error names file, line and reason.
    fs::write(
        fx.registry_file(&broken),
        format!(
            "path = \"{}\"\nsize = 1048576\nmode = \"filesystem\"\nuuid = \"oops\"\n",
            fx.logical_backing(&broken)
        ),
    )
    .unwrap();

    let device = world.run_ok(&["attach", &attached, "--json"]).json()["device"]
        .as_str()
        .unwrap()
        .to_string();
    world.run_ok(&["attach", &block]);
    world.run_ok(&["start", &attached]);

    let run = world.run(&["list", "--json"]);
    // A broken registry file makes list fail, but not hide the others.
    assert_eq!(run.code, 1, "{}", run.stderr);
    let list = run.json();
    assert_eq!(list["changed"], false);
    assert_eq!(list["systemd_error"], serde_json::Value::Null);
    let volumes = list["volumes"].as_array().unwrap();
    assert_eq!(volumes.len(), 3, "{list}");
    volumes.iter().for_each(assert_volume_fields);
    let errors = list["errors"].as_array().unwrap();
    assert_eq!(errors.len(), 1);
    assert!(errors[0]["file"]
        .as_str()
        .unwrap()
        .ends_with(&format!("{broken}.toml")));
    assert_eq!(errors[0]["line"], 4, "{}", errors[0]);
    assert!(errors[0]["reason"].as_str().unwrap().contains("uuid"));

    let find = |uuid: &str| {
        volumes
            .iter()
            .find(|v| v["uuid"] == uuid)
            .unwrap_or_else(|| panic!("{uuid} not listed"))
            .clone()
    };
    let db = find(&attached);
    assert_eq!(db["name"], "db");
    assert_eq!(db["mode"], "filesystem");
    assert_eq!(db["fs_type"], "ext4");
    assert_eq!(db["size"], common::SIZE);
    assert!(db["allocated"].as_u64().unwrap() > 0);
    assert!(
        db["allocated"].as_u64().unwrap() < common::SIZE,
        "a sparse file"
    );
    assert_eq!(db["path"], fx.logical_backing(&attached).as_str());
    assert_eq!(db["enabled"], true);
    assert_eq!(db["device"], device.as_str());
    assert_eq!(db["partition"], serde_json::Value::Null);
    assert_eq!(db["link"], format!("/dev/disk/by-uuid/{attached}").as_str());
    assert_eq!(db["unit"], unit(&attached).as_str());
    assert_eq!(db["active_state"], "active");
    assert_eq!(db["sub_state"], "exited");
    assert_eq!(db["unit_result"], "success");
    if db["link_state"] == "linked" {
        assert_eq!(db["link_target"], device.as_str());
    }

    let raw = find(&block);
    assert_eq!(raw["mode"], "block");
    assert_eq!(raw["fs_type"], serde_json::Value::Null);
    assert_eq!(raw["enabled"], false);
    let parent = raw["device"].as_str().unwrap();
    // A kernel without GPT support (CONFIG_EFI_PARTITION) makes no
    // partition; then there is none to report.
    let partition = format!("{parent}p1");
    if std::path::Path::new(&partition).exists() {
        assert_eq!(raw["partition"], partition.as_str());
    } else {
        assert_eq!(raw["partition"], serde_json::Value::Null);
    }
    assert_eq!(
        raw["link"],
        format!("/dev/disk/by-partuuid/{block}").as_str()
    );

    let gone = find(&missing);
    assert_eq!(gone["allocated"], serde_json::Value::Null);
    assert_eq!(gone["device"], serde_json::Value::Null);
    assert_eq!(gone["active_state"], "inactive");
    assert!(!gone["problems"].as_array().unwrap().is_empty());

    let status = world.run_ok(&["status", &attached, "--json"]).json();
    assert_eq!(status["changed"], false);
    assert_eq!(status["uuid"], attached.as_str());
    assert_volume_fields(&status);
    assert_eq!(status["device"], device.as_str());
    let human = world.run_ok(&["status", &attached]).stdout;
    assert!(
        human.contains(&device) && human.contains("active (exited)"),
        "{human}"
    );
    let table = world.run(&["list"]).stdout;
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("db ") && l.ends_with("attached"))
            && table.contains("error:"),
        "{table}"
    );

    world.run_ok(&["detach", &attached]);
    world.run_ok(&["detach", &block]);
}

#[test]
fn list_and_metrics_ask_systemd_once_for_every_units_state() {
    needs_root!();
    let world = World::new();
    let fx = &world.fx;
    // 12 volumes: one started, one whose start failed (no backing file),
    // the others never loaded by systemd.
    let volumes: Vec<String> = (0..11).map(|_| world.volume(true)).collect();
    let failing = new_uuid();
    fx.register(&failing, "filesystem", "");
    world.run_ok(&["start", &volumes[0]]);
    assert_ne!(world.run(&["start", &failing]).code, 0);

    for command in [["list", "--json"], ["metrics", "--json"]] {
        let seen = world.calls().len();
        let run = world.run_ok(&command);
        let calls = world.calls()[seen..].to_vec();
        let listings: Vec<&String> = calls
            .iter()
            .filter(|c| c.starts_with("ListUnitsByPatterns"))
            .collect();
        assert_eq!(
            listings,
            ["ListUnitsByPatterns [] [sparse-volume@*.service]"],
            "{command:?}: {calls:?}"
        );
        // Only the failed unit is asked more (its Result).
        let failing_unit = unit(&failing);
        let asked: Vec<&String> = calls
            .iter()
            .filter(|c| c.starts_with("GetUnit") || c.starts_with("LoadUnit"))
            .collect();
        assert_eq!(
            asked,
            [&format!("GetUnit {failing_unit}")],
            "{command:?}: {calls:?}"
        );
        if command[0] == "list" {
            let list = run.json();
            let state = |uuid: &str| {
                let v = list["volumes"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|v| v["uuid"] == uuid)
                    .unwrap()
                    .clone();
                (
                    v["active_state"].clone(),
                    v["sub_state"].clone(),
                    v["unit_result"].clone(),
                )
            };
            assert_eq!(
                state(&volumes[0]),
                ("active".into(), "exited".into(), "success".into())
            );
            assert_eq!(
                state(&failing),
                ("failed".into(), "failed".into(), "exit-code".into())
            );
            assert_eq!(
                state(&volumes[5]),
                ("inactive".into(), "dead".into(), "success".into())
            );
        } else {
            let text = run.stdout;
            let active = |uuid: &str| {
                text.lines()
                    .find(|l| l.starts_with("sparse_volume_unit_active{") && l.contains(uuid))
                    .unwrap_or_else(|| panic!("no unit_active for {uuid}: {text}"))
                    .rsplit(' ')
                    .next()
                    .unwrap()
                    .to_string()
            };
            assert_eq!(active(&volumes[0]), "1");
            assert_eq!(active(&failing), "0");
            assert_eq!(active(&volumes[5]), "0");
        }
    }
    world.run_ok(&["detach", &volumes[0]]);
}

/// Only what this boot should have attached is reported missed (and so
/// alerted on): not a volume created since the boot without `--now`, nor
/// one the kernel command line skips.
#[test]
fn attach_missed_is_what_this_boot_should_have_attached() {
    needs_root!();
    let world = World::new();
    let fx = &world.fx;
    let before_boot = |uuid: &str| {
        let btime: u64 = fs::read_to_string("/proc/stat")
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix("btime "))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let file = fx.registry_file(uuid);
        tool(
            "touch",
            &["-d", &format!("@{}", btime - 3600), file.to_str().unwrap()],
        );
    };
    let inactive_old = world.volume(true);
    before_boot(&inactive_old);
    let created_now = world.volume(true);
    let failed = new_uuid();
    fx.register(&failed, "filesystem", "");
    let skipped = world.volume(true);
    before_boot(&skipped);
    fs::create_dir_all(fx.host("/proc")).unwrap();
    fs::write(
        fx.host("/proc/cmdline"),
        format!("quiet sparse_volume.skip={skipped}\n"),
    )
    .unwrap();
    let attached = world.volume(true);
    before_boot(&attached);
    world.run_ok(&["start", &attached]);
    assert_ne!(world.run(&["start", &failed]).code, 0);

    let list = world.run_ok(&["list", "--json"]).json();
    let missed = |uuid: &str| {
        list["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["uuid"] == uuid)
            .unwrap()["attach_missed"]
            .clone()
    };
    assert_eq!(missed(&inactive_old), true, "{list}");
    assert_eq!(missed(&failed), true, "{list}");
    assert_eq!(missed(&created_now), false, "{list}");
    assert_eq!(missed(&skipped), false, "{list}");
    assert_eq!(missed(&attached), false, "{list}");
    let metrics = world.run_ok(&["metrics"]).stdout;
    let gauge = |uuid: &str| {
        metrics
            .lines()
            .find(|l| l.starts_with("sparse_volume_attach_missed{") && l.contains(uuid))
            .unwrap_or_else(|| panic!("no attach_missed for {uuid}: {metrics}"))
            .rsplit(' ')
            .next()
            .unwrap()
            .to_string()
    };
    assert_eq!(
        [&inactive_old, &failed, &created_now, &skipped, &attached].map(|u| gauge(u)),
        ["1", "1", "0", "0", "0"]
    );
    // check weighs them alike: errors for the missed, warnings otherwise.
    let check = world.run(&["check", "--json"]).json();
    let severity = |uuid: &str| {
        check["findings"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["uuid"] == uuid)
            .map(|f| (f["kind"].clone(), f["severity"].clone()))
    };
    let said = |kind: &str, severity: &str| -> Option<(serde_json::Value, serde_json::Value)> {
        Some((kind.into(), severity.into()))
    };
    assert_eq!(
        severity(&inactive_old),
        said("not-attached", "error"),
        "{check}"
    );
    // Its file is missing: that is what check says first.
    assert_eq!(
        severity(&failed),
        said("missing-backing-file", "error"),
        "{check}"
    );
    assert_eq!(
        severity(&created_now),
        said("not-attached", "warning"),
        "{check}"
    );
    assert_eq!(
        severity(&skipped),
        said("skipped-by-kernel-cmdline", "warning"),
        "{check}"
    );
    assert_eq!(severity(&attached), None, "{check}");
    world.run_ok(&["detach", &attached]);
}

#[test]
fn list_and_status_work_without_systemd() {
    let fx = Fixture::new();
    let uuid = new_uuid();
    fx.make_ext4(&uuid);
    fx.register(&uuid, "filesystem", "");
    let missing = format!("unix:path={}", fx.root.path().join("no-bus").display());

    let began = Instant::now();
    let run = run_on(&fx, &missing, &["list", "--json"], &[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let list = run.json();
    assert!(list["systemd_error"]
        .as_str()
        .unwrap()
        .contains("cannot reach systemd"));
    assert_eq!(list["volumes"][0]["active_state"], "unknown");
    assert_eq!(list["volumes"][0]["sub_state"], "unknown");
    assert_eq!(list["volumes"][0]["unit_result"], serde_json::Value::Null);
    assert_eq!(list["volumes"][0]["device"], serde_json::Value::Null);

    let status = run_on(&fx, &missing, &["status", &uuid, "--json"], &[]);
    assert_eq!(status.code, 0, "{}", status.stderr);
    assert_eq!(status.json()["active_state"], "unknown");
    assert!(began.elapsed() < Duration::from_secs(4));
}

/// Issue 24 item 4, through systemd: `disable --now` stopped the unit
/// before taking the registry lock, and a `check --repair` in between
/// started it again (the volume was still enabled): disabled and attached.
#[test]
fn a_repair_cannot_start_again_what_disable_now_is_stopping() {
    needs_root!();
    let world = World::new();
    let uuid = world.volume(true);
    world.run_ok(&["start", &uuid]);
    assert_eq!(loops_of(&world.fx.backing(&uuid)).len(), 1);

    let mut disable = world.fx.command(&["disable", &uuid, "--now", "--json"]);
    disable.env("DBUS_SYSTEM_BUS_ADDRESS", &world.bus.address);
    let disabling = common::Stopped::start(disable, sparse_volume::hooks::Stop::DisableAfterStop);
    let check = world
        .fx
        .command(&["check", "--repair", "--json"])
        .env("DBUS_SYSTEM_BUS_ADDRESS", &world.bus.address)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("starting check");
    assert!(
        common::ends_or_waits_for_a_lock(check.id()),
        "check --repair did not wait for the registry lock"
    );
    let disabled = disabling.resume();
    let check = check.wait_with_output().expect("reaping check");
    assert_eq!(disabled.code, 0, "{}", disabled.stderr);
    assert!(!registry_says_enabled(&world.fx, &uuid));
    let left = loops_of(&world.fx.backing(&uuid));
    for device in &left {
        tool("losetup", &["-d", device]);
    }
    assert!(
        left.is_empty(),
        "disabled and attached again: check said {}",
        String::from_utf8_lossy(&check.stdout)
    );
}

/// A take-over interrupted right after its registry entry was written:
/// the unit it replaces is not masked yet (the stub masks nothing), and
/// `check` says so. Finishing it (`--repair`) needs systemd's generator
/// and masks: the VM does it (tests/vm/guest.sh, take_over_interrupted).
#[test]
fn check_reports_a_take_over_whose_old_unit_is_not_retired() {
    let world = World::new();
    let uuid = new_uuid();
    world.fx.make_ext4(&uuid);
    let old = format!("metalk8s-sparse-volume@{uuid}.service");
    world
        .fx
        .register(&uuid, "filesystem", &format!("replaces_unit = \"{old}\"\n"));
    let run = world.run(&["check", "--json"]);
    let report: serde_json::Value = serde_json::from_str(&run.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {} {}", run.stdout, run.stderr));
    let finding = report["findings"]
        .as_array()
        .and_then(|findings| {
            findings
                .iter()
                .find(|f| f["kind"] == "replaced-unit-not-retired")
        })
        .unwrap_or_else(|| panic!("no replaced-unit-not-retired finding: {report}"));
    assert_eq!(finding["uuid"], uuid.as_str(), "{finding}");
    let message = finding["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(&old) && message.contains("is not masked (load state loaded"),
        "{message}"
    );
    assert_eq!(run.code, 1, "{}", run.stdout);
}
