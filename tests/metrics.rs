//! `sparse-volume metrics`: parsed by prometheus_client's own parser (not
//! ours), every number compared with stat(2)/statvfs(2) of the real files
//! after real writes and an `fstrim`, the textfile replaced atomically
//! under a racing reader, and space pressure logged once per crossing.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use common::{free_and_total, test_python, tool, Fixture, Mounted};
use serde_json::Value;

/// One sample as the real parser read it.
#[derive(Debug, Clone)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// Parses an exposition with prometheus_client (tests/metrics/parse.py).
fn parse(text: &str) -> Vec<Sample> {
    let file = tempfile::NamedTempFile::new().unwrap();
    fs::write(file.path(), text).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/metrics/parse.py");
    let output = Command::new(test_python())
        .arg(&script)
        .arg(file.path())
        .output()
        .expect("running the Prometheus parser");
    assert!(
        output.status.success(),
        "prometheus_client rejected the exposition: {}\n{text}",
        String::from_utf8_lossy(&output.stderr)
    );
    let parsed: Vec<Value> = serde_json::from_slice(&output.stdout).unwrap();
    parsed
        .iter()
        .map(|s| Sample {
            name: s["name"].as_str().unwrap().to_string(),
            labels: s["labels"]
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
                .collect(),
            value: s["value"].as_f64().unwrap(),
        })
        .collect()
}

/// Prometheus's own linter (naming conventions, units, HELP/TYPE): its
/// complaints, empty when the exposition passes. Run on an exposition that
/// has every family.
fn lint(text: &str) -> String {
    let mut promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("running promtool (Debian package prometheus)");
    promtool
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let output = promtool.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    match output.status.success() {
        true => String::new(),
        false if said.trim().is_empty() => "promtool failed without a word".to_string(),
        false => said,
    }
}

/// The value of `name` whose labels include `label=value`; None when the
/// series is absent. More than one match is a test error.
fn value(samples: &[Sample], name: &str, label: Option<(&str, &str)>) -> Option<f64> {
    let matching: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.name == name)
        .filter(|s| label.is_none_or(|(k, v)| s.labels.get(k).map(String::as_str) == Some(v)))
        .collect();
    assert!(matching.len() <= 1, "{name} {label:?} twice: {matching:?}");
    matching.first().map(|s| s.value)
}

fn must(samples: &[Sample], name: &str, label: Option<(&str, &str)>) -> u64 {
    let v = value(samples, name, label).unwrap_or_else(|| panic!("no {name} {label:?}"));
    assert!(v >= 0.0 && v.fract() == 0.0, "{name} = {v}");
    v as u64
}

fn allocated(path: &Path) -> u64 {
    fs::metadata(path).unwrap().blocks() * 512
}

/// Metrics taken while `observe` gives the same answer before and after:
/// the volume's own file system may still write in the background (ext4
/// lazy init), and a comparison with a moving number proves nothing.
fn metrics_while_stable<T: PartialEq + std::fmt::Debug>(
    fx: &Fixture,
    observe: impl Fn() -> T,
) -> (Vec<Sample>, T) {
    for _ in 0..20 {
        let before = observe();
        let text = fx.run_ok(&["metrics"]).stdout;
        let after = observe();
        if before == after {
            return (parse(&text), after);
        }
        thread::sleep(Duration::from_millis(200));
    }
    panic!("the files kept changing while metrics ran");
}

#[test]
fn every_number_matches_stat_and_statvfs_after_writes_and_fstrim() {
    needs_root!();
    let fx = Fixture::new();
    let storage = fx.mount_storage(512 << 20);
    let db = fx.run_ok(&[
        "create",
        "--size",
        "192M",
        "--name",
        "db \"main\"\\1",
        "--now",
        "--json",
    ]);
    let db = db.json();
    let db_uuid = db["uuid"].as_str().unwrap().to_string();
    let device = db["device"].as_str().unwrap().to_string();
    let spare = fx.run_ok(&["create", "--size", "64M", "--mode", "block", "--json"]);
    let spare_uuid = spare.json()["uuid"].as_str().unwrap().to_string();
    // `disable` wants systemd for its reload; the flag is what it writes.
    let registry_file = fx.registry_file(&spare_uuid);
    let text = fs::read_to_string(&registry_file).unwrap();
    assert!(text.contains("enabled = true\n"), "{text}");
    fs::write(
        &registry_file,
        text.replace("enabled = true\n", "enabled = false\n"),
    )
    .unwrap();
    let db_file = fx.backing(&db_uuid);
    let spare_file = fx.backing(&spare_uuid);

    let mount = tempfile::tempdir().unwrap();
    let mount_point = mount.path().to_str().unwrap().to_string();
    tool("mount", &[&device, &mount_point]);
    let data = mount.path().join("data");
    let mut random = fs::File::open("/dev/urandom").unwrap();
    let mut out = fs::File::create(&data).unwrap();
    std::io::copy(&mut std::io::Read::take(&mut random, 96 << 20), &mut out).unwrap();
    out.sync_all().unwrap();
    drop(out);

    let observe = || {
        (
            allocated(&db_file),
            allocated(&spare_file),
            free_and_total(&storage.mount_point),
        )
    };
    let (samples, (db_alloc, spare_alloc, (free, total))) = metrics_while_stable(&fx, observe);
    let db_label = Some(("uuid", db_uuid.as_str()));
    let spare_label = Some(("uuid", spare_uuid.as_str()));
    assert!(
        db_alloc > 96 << 20,
        "the data did not reach the file: {db_alloc}"
    );
    assert_eq!(
        must(&samples, "sparse_volume_size_bytes", db_label),
        192 << 20
    );
    assert_eq!(
        must(&samples, "sparse_volume_allocated_bytes", db_label),
        db_alloc
    );
    assert_eq!(
        must(&samples, "sparse_volume_allocated_bytes", spare_label),
        spare_alloc
    );
    assert_eq!(must(&samples, "sparse_volume_attached", db_label), 1);
    assert_eq!(must(&samples, "sparse_volume_attached", spare_label), 0);
    assert_eq!(must(&samples, "sparse_volume_enabled", db_label), 1);
    assert_eq!(must(&samples, "sparse_volume_enabled", spare_label), 0);
    assert_eq!(must(&samples, "sparse_volume_read_only", db_label), 0);
    assert_eq!(must(&samples, "sparse_volume_encrypted", db_label), 0);
    // Without systemd the unit state is unknown: no sample, not a false 0.
    assert_eq!(value(&samples, "sparse_volume_unit_active", db_label), None);
    assert_eq!(must(&samples, "sparse_volume_systemd_up", None), 0);
    let db_sample = samples
        .iter()
        .find(|s| s.name == "sparse_volume_size_bytes" && s.labels["uuid"] == db_uuid)
        .unwrap();
    assert_eq!(db_sample.labels["name"], "db \"main\"\\1", "label escaping");
    assert_eq!(db_sample.labels["mode"], "filesystem");

    let root = Some(("storage_root", "/var/lib/sparse-volume"));
    let growth = (192u64 << 20) - db_alloc + (64u64 << 20) - spare_alloc;
    assert_eq!(
        must(&samples, "sparse_volume_backing_fs_free_bytes", root),
        free
    );
    assert_eq!(
        must(&samples, "sparse_volume_backing_fs_size_bytes", root),
        total
    );
    assert_eq!(
        must(
            &samples,
            "sparse_volume_backing_fs_committed_growth_bytes",
            root
        ),
        growth
    );
    assert_eq!(
        value(&samples, "sparse_volume_backing_fs_headroom_bytes", root),
        Some(free as f64 - growth as f64)
    );
    assert_eq!(must(&samples, "sparse_volume_backing_fs_volumes", root), 2);
    assert_eq!(must(&samples, "sparse_volume_registry_errors", None), 0);
    let info: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.name == "sparse_volume_info")
        .collect();
    assert_eq!(info.len(), 1);
    assert_eq!(info[0].labels["version"], env!("CARGO_PKG_VERSION"));

    // The consumer deletes its data and trims: the space goes back to the
    // storage root, and the metrics follow.
    fs::remove_file(&data).unwrap();
    // ext4 trims only blocks whose freeing is committed.
    tool("sync", &["-f", &mount_point]);
    tool("fstrim", &[&mount_point]);
    let (samples, (trimmed, _, (free_after, _))) = metrics_while_stable(&fx, observe);
    assert!(
        trimmed + (64 << 20) < db_alloc,
        "fstrim returned too little: {db_alloc} -> {trimmed}"
    );
    assert_eq!(
        must(&samples, "sparse_volume_allocated_bytes", db_label),
        trimmed
    );
    assert_eq!(
        must(&samples, "sparse_volume_backing_fs_free_bytes", root),
        free_after
    );
    eprintln!(
        "metrics: allocated {db_alloc} -> {trimmed} bytes after fstrim, free {free} -> {free_after}"
    );
    tool("umount", &[&mount_point]);
    fx.run_ok(&["detach", &db_uuid]);
}

/// Reads `file` as fast as it can until `stop`; returns (reads, partial
/// reads), where a read is complete when it equals one of `complete`'s
/// accepted shapes.
fn race_reader(
    file: std::path::PathBuf,
    stop: Arc<AtomicBool>,
    is_complete: impl Fn(&str) -> bool + Send + 'static,
) -> thread::JoinHandle<(u64, u64)> {
    thread::spawn(move || {
        let (mut reads, mut partial) = (0, 0);
        while !stop.load(Ordering::Relaxed) {
            if let Ok(text) = fs::read_to_string(&file) {
                reads += 1;
                if !is_complete(&text) {
                    partial += 1;
                }
            }
        }
        (reads, partial)
    })
}

#[test]
fn the_textfile_is_replaced_atomically_under_a_racing_reader() {
    needs_root!();
    let fx = Fixture::new();
    for _ in 0..20 {
        let uuid = common::new_uuid();
        fx.make_ext4(&uuid);
        fx.register(&uuid, "filesystem", "fs_type = \"ext4\"\n");
    }
    let directory = fx.host("/textfiles");
    fs::create_dir_all(&directory).unwrap();
    let dir = directory.to_str().unwrap().to_string();
    let written = fx.run_ok(&["metrics", "--textfile", &dir, "--json"]).json();
    let file = directory.join("sparse_volume.prom");
    assert_eq!(written["path"], file.to_str().unwrap());
    let reference = fs::read_to_string(&file).unwrap();
    assert_eq!(
        parse(&reference).len(),
        reference.lines().filter(|l| !l.starts_with('#')).count()
    );
    // Every complete exposition has this many lines and ends with the
    // last family; the numbers in it may change between writes.
    let lines = reference.lines().count();
    let last_family = reference
        .lines()
        .rev()
        .find(|l| l.starts_with("# TYPE"))
        .unwrap()
        .to_string();
    let complete = move |text: &str| {
        text.ends_with('\n') && text.lines().count() == lines && text.contains(&last_family)
    };

    let stop = Arc::new(AtomicBool::new(false));
    let reader = race_reader(file.clone(), stop.clone(), complete.clone());
    for _ in 0..150 {
        fx.run_ok(&["metrics", "--textfile", &dir]);
    }
    stop.store(true, Ordering::Relaxed);
    let (reads, partial) = reader.join().unwrap();
    eprintln!("textfile race: 150 writes, {reads} reads, {partial} partial");
    assert!(reads >= 150, "the reader hardly ran: {reads} reads");
    assert_eq!(partial, 0, "a reader saw a partial textfile");
    let names: Vec<String> = fs::read_dir(&directory)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["sparse_volume.prom"], "temporaries left behind");

    // The control: the same reader against a writer that rewrites the file
    // in place sees partial files, so a zero above means something.
    let stop = Arc::new(AtomicBool::new(false));
    let reader = race_reader(file.clone(), stop.clone(), complete);
    for _ in 0..150 {
        let mut f = fs::File::create(&file).unwrap();
        let (head, tail) = reference.split_at(reference.len() / 2);
        f.write_all(head.as_bytes()).unwrap();
        thread::sleep(Duration::from_millis(1));
        f.write_all(tail.as_bytes()).unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    let (reads, partial) = reader.join().unwrap();
    eprintln!("control (in-place writer): {reads} reads, {partial} partial");
    assert!(partial > 0, "the reader cannot tell a partial file");
}

/// Fills the storage root with a file of `bytes` (another process's data).
fn fill(path: &Path, bytes: u64) {
    tool(
        "fallocate",
        &["-l", &bytes.to_string(), path.to_str().unwrap()],
    );
}

fn textfile_warnings(fx: &Fixture, dir: &str) -> Vec<String> {
    let run = fx.run_ok(&["metrics", "--textfile", dir]);
    run.stderr
        .lines()
        .filter(|l| l.contains("is short of space"))
        .map(str::to_string)
        .collect()
}

#[test]
fn space_pressure_is_a_finding_and_one_log_line_per_crossing() {
    needs_root!();
    let fx = Fixture::new();
    let storage = fx.mount_storage(160 << 20);
    fs::write(
        fx.host("/etc/sparse-volume/config.toml"),
        "warn_headroom = \"48M\"\n",
    )
    .unwrap();
    let uuid = fx.run_ok(&["create", "--size", "40M", "--json"]).json()["uuid"]
        .as_str()
        .unwrap()
        .to_string();
    let dir = fx.host("/textfiles");
    fs::create_dir_all(&dir).unwrap();
    let dir = dir.to_str().unwrap().to_string();
    let growth = (40u64 << 20) - allocated(&fx.backing(&uuid));

    let check = |fx: &Fixture| fx.run(&["check", "--json"]).json();
    let low = |report: &Value| -> Vec<Value> {
        report["findings"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|f| f["kind"] == "low-headroom")
            .cloned()
            .collect()
    };
    assert!(low(&check(&fx)).is_empty(), "no pressure yet");
    assert_eq!(textfile_warnings(&fx, &dir), Vec::<String>::new());

    // Another process takes space until 24 MiB of headroom remain.
    let filler = storage.mount_point.join("other-data");
    let target_headroom = 24u64 << 20;
    fill(&filler, storage.free() - growth - target_headroom);
    let free = storage.free();
    let report = check(&fx);
    let found = low(&report);
    assert_eq!(found.len(), 1, "{report}");
    assert_eq!(found[0]["severity"], "warning");
    assert_eq!(found[0]["path"], "/var/lib/sparse-volume");
    let message = found[0]["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("({free} bytes) free")),
        "{message}"
    );
    assert!(
        message.contains(&format!("grow by 40.0 MiB ({growth} bytes)"))
            || message.contains(&format!("({growth} bytes)")),
        "{message}"
    );

    let first = textfile_warnings(&fx, &dir);
    assert_eq!(first.len(), 1, "{first:?}");
    assert!(
        first[0].contains("/var/lib/sparse-volume")
            && first[0].contains(&format!("({free} bytes) free")),
        "{first:?}"
    );
    for _ in 0..3 {
        assert_eq!(
            textfile_warnings(&fx, &dir),
            Vec::<String>::new(),
            "warned twice"
        );
    }
    let samples = parse(&fs::read_to_string(Path::new(&dir).join("sparse_volume.prom")).unwrap());
    let root = Some(("storage_root", "/var/lib/sparse-volume"));
    assert_eq!(
        value(&samples, "sparse_volume_backing_fs_headroom_bytes", root),
        Some(free as f64 - growth as f64)
    );
    assert_eq!(
        must(
            &samples,
            "sparse_volume_backing_fs_warn_headroom_bytes",
            root
        ),
        48 << 20
    );

    // Going deeper (the volumes could no longer all grow) is the same
    // crossing: no new line; check now says overcommitted instead.
    fill(&storage.mount_point.join("more"), 32 << 20);
    assert_eq!(textfile_warnings(&fx, &dir), Vec::<String>::new());
    let report = check(&fx);
    assert!(low(&report).is_empty(), "{report}");
    assert!(
        report["findings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["kind"] == "overcommitted"),
        "{report}"
    );

    // Space comes back, then goes again: a second crossing, a second line.
    fs::remove_file(storage.mount_point.join("more")).unwrap();
    fs::remove_file(&filler).unwrap();
    assert_eq!(textfile_warnings(&fx, &dir), Vec::<String>::new());
    assert!(low(&check(&fx)).is_empty());
    fill(&filler, storage.free() - growth - target_headroom);
    assert_eq!(textfile_warnings(&fx, &dir).len(), 1, "second crossing");
    eprintln!("space pressure: warned once per crossing over 2 crossings and 5 quiet runs");
}

#[test]
fn registry_errors_and_the_last_check_are_exposed() {
    needs_root!();
    let fx = Fixture::new();
    let uuid = common::new_uuid();
    fx.make_ext4(&uuid);
    fx.register(&uuid, "filesystem", "fs_type = \"ext4\"\n");
    let broken = common::new_uuid();
    fs::write(fx.registry_file(&broken), "uuid = [\n").unwrap();

    let samples = parse(&fx.run_ok(&["metrics"]).stdout);
    assert_eq!(must(&samples, "sparse_volume_registry_errors", None), 1);
    // The linter can fail: a non-base unit is refused.
    let refused = lint("# HELP x_milliseconds h\n# TYPE x_milliseconds gauge\nx_milliseconds 1\n");
    assert!(
        refused.contains("base unit"),
        "promtool accepted a non-base unit: {refused:?}"
    );
    assert_eq!(
        value(&samples, "sparse_volume_check_timestamp_seconds", None),
        None
    );

    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert_eq!(fx.run(&["check"]).code, 1);
    let text = fx.run_ok(&["metrics"]).stdout;
    assert_eq!(lint(&text), "", "promtool check metrics");
    let samples = parse(&text);
    let at = must(&samples, "sparse_volume_check_timestamp_seconds", None);
    assert!(at >= before && at <= before + 600, "{at} vs {before}");
    assert_eq!(
        must(
            &samples,
            "sparse_volume_check_findings",
            Some(("kind", "invalid-registry-file"))
        ),
        1
    );
    assert_eq!(
        must(
            &samples,
            "sparse_volume_check_findings",
            Some(("kind", "not-attached"))
        ),
        1
    );
    // A repair that fixes a finding removes it from the next summary.
    fs::remove_file(fx.registry_file(&broken)).unwrap();
    fx.run_ok(&["check", "--repair"]);
    let samples = parse(&fx.run_ok(&["metrics"]).stdout);
    assert_eq!(
        value(
            &samples,
            "sparse_volume_check_findings",
            Some(("kind", "not-attached"))
        ),
        None
    );
    assert_eq!(
        value(
            &samples,
            "sparse_volume_check_findings",
            Some(("kind", "invalid-registry-file"))
        ),
        None
    );
    fx.run_ok(&["detach", &uuid]);
}

/// Bytes fio says it moved in `rw` (`read` or `write`) of `file`, 1 MiB
/// requests straight to the device (O_DIRECT), flushed at the end.
fn fio(rw: &str, file: &Path, bytes: u64) -> u64 {
    let report = tool(
        "fio",
        &[
            "--name=volume",
            &format!("--filename={}", file.display()),
            &format!("--rw={rw}"),
            "--bs=1M",
            &format!("--size={bytes}"),
            "--direct=1",
            "--end_fsync=1",
            "--output-format=json",
        ],
    );
    let report: Value = serde_json::from_str(&report).expect("fio's JSON report");
    let side = if rw == "write" { "write" } else { "read" };
    report["jobs"][0][side]["io_bytes"]
        .as_u64()
        .unwrap_or_else(|| panic!("no {side} io_bytes in fio's report: {report}"))
}

#[test]
fn io_counters_rise_by_what_fio_moved_and_start_again_at_each_attach() {
    needs_root!();
    let fx = Fixture::new();
    let made = fx.run_ok(&[
        "create", "--size", "256M", "--name", "pg", "--now", "--json",
    ]);
    let uuid = made.json()["uuid"].as_str().unwrap().to_string();
    let device = made.json()["device"].as_str().unwrap().to_string();
    let block = fx.run_ok(&[
        "create", "--size", "64M", "--mode", "block", "--now", "--json",
    ]);
    let block_uuid = block.json()["uuid"].as_str().unwrap().to_string();
    let block_device = block.json()["device"].as_str().unwrap().to_string();
    let _detach = (
        common::DetachOnDrop::new(device.clone()),
        common::DetachOnDrop::new(block_device),
    );
    // noinit_itable: no background zeroing of inode tables, so what the
    // file system writes besides fio's data is its journal and metadata.
    let mounted = Mounted::new(&fx, &device, &["-o", "noinit_itable"]).expect("mounting pg");
    let data = mounted.0.join("data");
    let label = Some(("uuid", uuid.as_str()));
    let counter = |samples: &[Sample], name: &str| must(samples, name, label);
    // The file system's metadata for 64 MiB of data: its journal commits
    // and block bitmaps, far below this.
    const OVERHEAD: u64 = 4 << 20;

    let before = parse(&fx.run_ok(&["metrics"]).stdout);
    let written = fio("write", &data, 64 << 20);
    assert_eq!(written, 64 << 20, "fio wrote less than asked");
    tool("sync", &["-f", mounted.0.to_str().unwrap()]);
    let text = fx.run_ok(&["metrics"]).stdout;
    assert_eq!(lint(&text), "", "promtool check metrics");
    let after_write = parse(&text);
    let grew = counter(&after_write, "sparse_volume_written_bytes_total")
        - counter(&before, "sparse_volume_written_bytes_total");
    assert!(
        (written..=written + OVERHEAD).contains(&grew),
        "fio wrote {written} bytes; the counter rose by {grew}"
    );
    let requests = counter(&after_write, "sparse_volume_writes_completed_total")
        - counter(&before, "sparse_volume_writes_completed_total");
    assert!(requests >= 64, "64 requests of 1 MiB, counted {requests}");

    // Read back past the page cache.
    let read = fio("read", &data, 64 << 20);
    let after_read = parse(&fx.run_ok(&["metrics"]).stdout);
    let grew_read = counter(&after_read, "sparse_volume_read_bytes_total")
        - counter(&after_write, "sparse_volume_read_bytes_total");
    assert!(
        (read..=read + OVERHEAD).contains(&grew_read),
        "fio read {read} bytes; the counter rose by {grew_read}"
    );
    for name in [
        "sparse_volume_read_time_seconds_total",
        "sparse_volume_write_time_seconds_total",
        "sparse_volume_io_time_seconds_total",
        "sparse_volume_discards_completed_total",
        "sparse_volume_io_now",
    ] {
        assert!(value(&after_read, name, label).is_some(), "no {name}");
    }
    assert!(
        value(&after_read, "sparse_volume_io_time_seconds_total", label).unwrap() > 0.0,
        "128 MiB of direct I/O took no time"
    );
    // A block volume is counted too (its whole loop device).
    assert!(
        value(
            &after_read,
            "sparse_volume_written_bytes_total",
            Some(("uuid", block_uuid.as_str()))
        )
        .is_some(),
        "no I/O series for the attached block volume"
    );

    // status and list --wide say the same, for people and in JSON.
    let status = fx.run_ok(&["status", "pg", "--json"]).json();
    let json_written = status["io"]["written_bytes"].as_u64().unwrap();
    assert!(json_written >= counter(&after_read, "sparse_volume_written_bytes_total"));
    let human = fx.run_ok(&["status", "pg"]).stdout;
    assert!(
        human.contains("i/o:") && human.contains("wrote 6"),
        "{human}"
    );
    let wide = fx.run_ok(&["list", "--wide"]).stdout;
    assert!(wide.lines().next().unwrap().contains("I/O"), "{wide}");
    let row = wide.lines().find(|l| l.contains(&uuid)).unwrap();
    assert!(row.contains(" w 6"), "{row}");

    // A new attach is a new loop device: the counters start again, and a
    // volume that is not attached has no I/O series at all.
    drop(mounted);
    fx.run_ok(&["detach", "pg"]);
    let detached = parse(&fx.run_ok(&["metrics"]).stdout);
    assert_eq!(
        value(&detached, "sparse_volume_written_bytes_total", label),
        None
    );
    assert!(fx.run_ok(&["status", "pg", "--json"]).json()["io"].is_null());
    let attached = fx.run_ok(&["attach", "pg", "--json"]).json();
    let _detach_again = common::DetachOnDrop::new(attached["device"].as_str().unwrap().to_string());
    let again = parse(&fx.run_ok(&["metrics"]).stdout);
    let since_attach = counter(&again, "sparse_volume_written_bytes_total");
    assert!(
        since_attach < written,
        "after a new attach the counter still holds {since_attach} bytes"
    );
    eprintln!(
        "i/o counters: fio wrote {written} (counter +{grew}, {requests} requests), read {read} (counter +{grew_read}); {since_attach} bytes after the new attach"
    );
    fx.run_ok(&["detach", "pg"]);
    let base = fx.host(&format!("/run/sparse-volume/{uuid}.io-base"));
    assert!(!base.exists(), "detach left {} behind", base.display());

    // Bound by hand: no base, and status says why it shows no I/O.
    let by_hand = common::bound_by_hand(&fx.backing(&uuid), &[]);
    let _detach_by_hand = common::DetachOnDrop::new(by_hand);
    assert!(fx.run_ok(&["status", "pg", "--json"]).json()["io"].is_null());
    let status = fx.run_ok(&["status", "pg"]).stdout;
    assert!(
        status.contains(
            "i/o:      not counted for this attach: it was made other than by sparse-volume"
        ),
        "{status}"
    );
    // attach adopts the device and counts from then on.
    fx.run_ok(&["attach", "pg"]);
    assert_eq!(
        fx.run_ok(&["status", "pg", "--json"]).json()["io"]["written_bytes"],
        0
    );
    fx.run_ok(&["detach", "pg"]);
}

/// A file-system error, made as the field gets them: a directory block
/// damaged under the unmounted file system, then read.
#[test]
fn file_system_errors_show_in_metrics_and_check_and_fire_the_alert() {
    needs_root!();
    let fx = Fixture::new();
    let made = fx.run_ok(&["create", "--size", "64M", "--name", "pg", "--now", "--json"]);
    let uuid = made.json()["uuid"].as_str().unwrap().to_string();
    let device = made.json()["device"].as_str().unwrap().to_string();
    let _detach = common::DetachOnDrop::new(device.clone());
    let label = Some(("uuid", uuid.as_str()));
    let loop_name = device.trim_start_matches("/dev/").to_string();

    let mounted = Mounted::new(&fx, &device, &["-o", "errors=continue"]).expect("mounting pg");
    let directory = mounted.0.join("d");
    fs::create_dir(&directory).unwrap();
    for i in 0..64 {
        fs::write(directory.join(format!("file-{i}")), b"x").unwrap();
    }
    // Healthy and mounted: the series are there, and say so.
    let healthy = parse(&fx.run_ok(&["metrics"]).stdout);
    assert_eq!(must(&healthy, "sparse_volume_fs_errors", label), 0);
    assert_eq!(must(&healthy, "sparse_volume_fs_read_only", label), 0);
    assert_eq!(
        value(
            &healthy,
            "sparse_volume_fs_last_error_timestamp_seconds",
            label
        ),
        None
    );
    assert!(fx.run_ok(&["check", "--json"]).json()["clean"] == true);
    drop(mounted);

    tool(
        "debugfs",
        &["-w", "-R", "zap_block -f /d -p 0x55 0", &device],
    );
    let mounted = Mounted::new(&fx, &device, &["-o", "errors=continue"]).expect("mounting pg");
    let listed = fs::read_dir(mounted.0.join("d"))
        .and_then(|entries| entries.collect::<Result<Vec<_>, _>>());
    assert!(listed.is_err(), "the damaged directory read: {listed:?}");
    // ext4 records the error in its superblock from a work queue.
    let count = Path::new("/sys/fs/ext4")
        .join(&loop_name)
        .join("errors_count");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while fs::read_to_string(&count).unwrap().trim() == "0" {
        assert!(
            std::time::Instant::now() < deadline,
            "ext4 recorded no error"
        );
        thread::sleep(Duration::from_millis(100));
    }

    let text = fx.run_ok(&["metrics"]).stdout;
    assert_eq!(lint(&text), "", "promtool check metrics");
    let samples = parse(&text);
    let errors = must(&samples, "sparse_volume_fs_errors", label);
    assert!(errors >= 1, "{text}");
    let last = must(
        &samples,
        "sparse_volume_fs_last_error_timestamp_seconds",
        label,
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(
        last <= now && last + 600 > now,
        "last error at {last}, now {now}"
    );

    let check = fx.run(&["check", "--json"]);
    assert_eq!(check.code, 1, "{}", check.stdout);
    let report = check.json();
    let finding = report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["kind"] == "file-system-errors")
        .unwrap_or_else(|| panic!("no file-system-errors finding: {report}"))
        .clone();
    assert_eq!(finding["severity"], "error");
    assert_eq!(finding["uuid"], uuid.as_str());
    let message = finding["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("e2fsck -f {device}"))
            && message.contains(mounted.0.to_str().unwrap()),
        "{message}"
    );
    let status = fx.run_ok(&["status", "pg"]).stdout;
    assert!(status.contains(" recorded (the last at "), "{status}");

    // The shipped alert fires on this very scrape.
    let rules =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/prometheus/sparse-volume-alerts.yml");
    let test = fx.host("/alert-test.yml");
    fs::write(
        &test,
        format!(
            r#"rule_files: ["{rules}"]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'sparse_volume_fs_errors{{instance="n1",uuid="{uuid}",name="pg",mode="filesystem"}}'
        values: '{errors}x10'
    alert_rule_test:
      - eval_time: 1m
        alertname: SparseVolumeFilesystemErrors
        exp_alerts:
          - exp_labels: {{severity: critical, instance: n1, uuid: "{uuid}", name: pg, mode: filesystem}}
            exp_annotations:
              summary: "The file system of sparse volume {uuid} recorded errors"
              description: "n1: the file system of volume {uuid} (pg) recorded {errors} error(s); `sparse-volume check` says where it is mounted and how to run e2fsck on it."
"#,
            rules = rules.display()
        ),
    )
    .unwrap();
    let promtool = Command::new("promtool")
        .args(["test", "rules"])
        .arg(&test)
        .output()
        .unwrap();
    assert!(
        promtool.status.success(),
        "{}{}",
        String::from_utf8_lossy(&promtool.stdout),
        String::from_utf8_lossy(&promtool.stderr)
    );

    // Unmounted, the superblock still says so, and check with it; the
    // e2fsck it names (with -y: no terminal here) clears it.
    drop(mounted);
    let unmounted = fx.run(&["check", "--json"]).json();
    let finding = unmounted["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["kind"] == "file-system-errors")
        .unwrap_or_else(|| panic!("unmounted, check forgot the errors: {unmounted}"))
        .clone();
    let message = finding["message"].as_str().unwrap();
    assert!(
        message.contains(&format!("run `e2fsck -f {device}`"))
            && message.contains("before it is mounted again"),
        "{message}"
    );
    let repaired = Command::new("e2fsck")
        .args(["-f", "-y", &device])
        .output()
        .unwrap();
    assert!(
        matches!(repaired.status.code(), Some(0..=1)),
        "e2fsck -fy: {repaired:?}"
    );
    let clean = fx.run(&["check", "--json"]).json();
    assert_eq!(clean["clean"], true, "after e2fsck: {clean}");

    // Mounted read-only: the gauge says so, and no errors are left.
    let mounted = Mounted::new(&fx, &device, &["-o", "ro"]).expect("mounting pg read-only");
    let samples = parse(&fx.run_ok(&["metrics"]).stdout);
    assert_eq!(must(&samples, "sparse_volume_fs_read_only", label), 1);
    assert_eq!(must(&samples, "sparse_volume_fs_errors", label), 0);
    eprintln!(
        "file-system errors: {errors} recorded, the last at {last}; check and the alert saw them"
    );
    drop(mounted);
    fx.run_ok(&["detach", "pg"]);
}

/// A file system the kernel shut down after an error, as xfs does where
/// ext4 would turn read-only: made here with the shutdown ioctl that
/// xfstests uses (xfs_io's `shutdown`; ext4 answers the same ioctl).
#[test]
fn a_shut_down_file_system_shows_in_metrics_check_and_status_and_fires_the_alert() {
    needs_root!();
    let fx = Fixture::new();
    for (fs_type, size, repair) in [
        ("xfs", "320M", "xfs_repair -n /dev/"),
        ("ext4", "64M", "e2fsck -f /dev/"),
    ] {
        let made = fx.run_ok(&[
            "create", "--size", size, "--fs", fs_type, "--name", fs_type, "--now", "--json",
        ]);
        let uuid = made.json()["uuid"].as_str().unwrap().to_string();
        let device = made.json()["device"].as_str().unwrap().to_string();
        let _detach = common::DetachOnDrop::new(device.clone());
        let label = Some(("uuid", uuid.as_str()));

        let mounted = Mounted::new(&fx, &device, &[]).expect("mounting");
        let mut data = fs::File::create(mounted.0.join("data")).unwrap();
        data.write_all(b"kept").unwrap();
        data.sync_all().unwrap();
        drop(data);
        let healthy = parse(&fx.run_ok(&["metrics"]).stdout);
        assert_eq!(must(&healthy, "sparse_volume_fs_shut_down", label), 0);

        tool(
            "xfs_io",
            &["-x", "-c", "shutdown -f", mounted.0.to_str().unwrap()],
        );
        let text = fx.run_ok(&["metrics"]).stdout;
        assert_eq!(lint(&text), "", "promtool check metrics");
        let samples = parse(&text);
        assert_eq!(
            must(&samples, "sparse_volume_fs_shut_down", label),
            1,
            "{fs_type}: {text}"
        );

        let check = fx.run(&["check", "--json"]);
        assert_eq!(check.code, 1, "{fs_type}: {}", check.stdout);
        let report = check.json();
        let finding = report["findings"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["kind"] == "file-system-shut-down" && f["uuid"] == uuid.as_str())
            .unwrap_or_else(|| panic!("{fs_type}: no file-system-shut-down finding: {report}"))
            .clone();
        assert_eq!(finding["severity"], "error");
        let message = finding["message"].as_str().unwrap();
        assert!(
            message.contains(mounted.0.to_str().unwrap()) && message.contains(repair),
            "{fs_type}: {message}"
        );
        let status = fx.run_ok(&["status", fs_type]).stdout;
        assert!(status.contains("shut down after an error"), "{status}");
        assert_eq!(
            fx.run_ok(&["status", fs_type, "--json"]).json()["fs_health"]["shut_down"],
            true
        );

        // Unmounted and mounted again (xfs replays its log then), it is
        // healthy, and what was synced before the shutdown is there.
        drop(mounted);
        let mounted = Mounted::new(&fx, &device, &[]).expect("mounting again");
        assert_eq!(fs::read(mounted.0.join("data")).unwrap(), b"kept");
        let samples = parse(&fx.run_ok(&["metrics"]).stdout);
        assert_eq!(must(&samples, "sparse_volume_fs_shut_down", label), 0);
        drop(mounted);
        fx.run_ok(&["detach", fs_type]);
    }

    let rules =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/prometheus/sparse-volume-alerts.yml");
    let test = fx.host("/alert-test.yml");
    fs::write(
        &test,
        format!(
            r#"rule_files: ["{rules}"]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'sparse_volume_fs_shut_down{{instance="n1",uuid="u1",name="logs",mode="filesystem"}}'
        values: '0 1x10'
      - series: 'sparse_volume_fs_shut_down{{instance="n1",uuid="u2",name="ok",mode="filesystem"}}'
        values: '0x10'
    alert_rule_test:
      - eval_time: 2m
        alertname: SparseVolumeFilesystemShutDown
        exp_alerts:
          - exp_labels: {{severity: critical, instance: n1, uuid: u1, name: logs, mode: filesystem}}
            exp_annotations:
              summary: "The file system of sparse volume u1 is shut down"
              description: "n1: the kernel shut the file system of volume u1 (logs) down after an error: every access to it fails; `sparse-volume check` says how to unmount and repair it."
"#,
            rules = rules.display()
        ),
    )
    .unwrap();
    let promtool = Command::new("promtool")
        .args(["test", "rules"])
        .arg(&test)
        .output()
        .unwrap();
    assert!(
        promtool.status.success(),
        "{}{}",
        String::from_utf8_lossy(&promtool.stdout),
        String::from_utf8_lossy(&promtool.stderr)
    );
}
