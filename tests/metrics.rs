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

use common::{free_and_total, test_python, tool, Fixture};
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
