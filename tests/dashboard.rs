//! The Grafana dashboard the package ships
//! (packaging/grafana/sparse-volume-dashboard.json): it loads into
//! Grafana's own dashboard model without losing a key, every query parses
//! as PromQL (promtool), and every series it names is one that a real
//! `sparse-volume metrics` scrape holds.

mod common;
#[cfg(feature = "dbus")]
mod stub_systemd;

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{test_python, Fixture, Mounted};
use serde_json::Value;

fn dashboard_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/grafana/sparse-volume-dashboard.json")
}

fn dashboard() -> Value {
    serde_json::from_str(&fs::read_to_string(dashboard_path()).unwrap())
        .expect("the dashboard is JSON")
}

/// Every query target of every panel, rows' nested panels included.
fn targets(dashboard: &Value) -> Vec<Value> {
    fn walk(panels: &[Value], out: &mut Vec<Value>) {
        for panel in panels {
            if let Some(targets) = panel["targets"].as_array() {
                out.extend(targets.iter().cloned());
            }
            if let Some(nested) = panel["panels"].as_array() {
                walk(nested, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(dashboard["panels"].as_array().unwrap(), &mut out);
    out
}

/// The queries with Grafana's variables given values, as Grafana sends them.
fn expressions(dashboard: &Value) -> Vec<String> {
    targets(dashboard)
        .iter()
        .map(|t| {
            t["expr"]
                .as_str()
                .unwrap_or_else(|| panic!("a target without a query: {t}"))
                .replace("$instance", ".*")
                .replace("$volume", ".*")
                .replace("$__rate_interval", "5m")
        })
        .collect()
}

/// `sparse_volume_…` names in a query (label values are quoted and
/// cannot start one).
fn series_named(expression: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = expression;
    while let Some(at) = rest.find("sparse_volume_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        names.insert(tail[..end].to_string());
        rest = &tail[end..];
    }
    names
}

#[test]
fn the_dashboard_loads_into_grafanas_model_without_losing_a_key() {
    // The pinned venv (SV_TEST_PYTHON) is root's.
    needs_root!();
    let output = Command::new(test_python())
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/dashboard/roundtrip.py"))
        .arg(dashboard_path())
        .output()
        .expect("running tests/dashboard/roundtrip.py");
    assert!(
        output.status.success(),
        "keys of the dashboard that Grafana's model does not know:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    // The model keeps a query target as it is: its keys are checked here.
    let known: BTreeSet<&str> = [
        "refId",
        "datasource",
        "expr",
        "legendFormat",
        "format",
        "instant",
    ]
    .into();
    for target in targets(&dashboard()) {
        for key in target.as_object().unwrap().keys() {
            assert!(
                known.contains(key.as_str()),
                "unknown key {key} in {target}"
            );
        }
    }
}

#[test]
fn every_query_parses_as_promql() {
    let rules = tempfile::NamedTempFile::new().unwrap();
    let mut text = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (index, expression) in expressions(&dashboard()).iter().enumerate() {
        text.push_str(&format!(
            "      - record: dashboard:query{index}\n        expr: {}\n",
            serde_json::to_string(expression).unwrap()
        ));
    }
    fs::write(rules.path(), &text).unwrap();
    let output = Command::new("promtool")
        .args(["check", "rules"])
        .arg(rules.path())
        .output()
        .expect("running promtool (Debian package prometheus)");
    assert!(
        output.status.success(),
        "promtool check rules:\n{}{}\n{text}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    // The control: promtool does refuse a query that does not parse.
    fs::write(
        rules.path(),
        "groups:\n  - name: g\n    rules:\n      - record: r\n        expr: \"rate(x[5m]\"\n",
    )
    .unwrap();
    let refused = Command::new("promtool")
        .args(["check", "rules"])
        .arg(rules.path())
        .output()
        .unwrap();
    assert!(
        !refused.status.success(),
        "promtool accepted a broken query"
    );
}

#[cfg(feature = "dbus")]
#[test]
fn every_series_the_dashboard_names_is_in_a_real_scrape() {
    needs_root!();
    let fx = Fixture::new();
    // A scrape with every family: systemd answering (unit states; a stub
    // on a real dbus-daemon), a mounted ext4 volume (I/O, file-system
    // health), a detached block volume, and a check that found something.
    let bus = stub_systemd::PrivateBus::start();
    let _systemd = stub_systemd::StubSystemd::start(&bus.address, fx.root.path().to_path_buf());
    let made = fx.run_ok(&["create", "--size", "64M", "--name", "pg", "--now", "--json"]);
    let device = made.json()["device"].as_str().unwrap().to_string();
    let _detach = common::DetachOnDrop::new(device.clone());
    let mounted = Mounted::new(&fx, &device, &[]).expect("mounting pg");
    fs::write(mounted.0.join("data"), vec![7u8; 1 << 20]).unwrap();
    fx.run_ok(&["create", "--size", "64M", "--mode", "block"]);
    let gone = common::new_uuid();
    fx.register(&gone, "filesystem", "");
    assert_eq!(fx.run(&["check"]).code, 1);
    let mut metrics = fx.command(&["metrics"]);
    metrics.env("DBUS_SYSTEM_BUS_ADDRESS", &bus.address);
    let output = metrics.output().expect("running sparse-volume metrics");
    assert!(output.status.success(), "{output:?}");
    let scrape = String::from_utf8_lossy(&output.stdout).into_owned();
    let scraped: BTreeSet<String> = scrape
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| l.split(['{', ' ']).next().unwrap().to_string())
        .collect();

    let mut named = BTreeSet::new();
    for expression in expressions(&dashboard()) {
        let series = series_named(&expression);
        assert!(
            !series.is_empty(),
            "a query of no sparse-volume series: {expression}"
        );
        named.extend(series);
    }
    let missing: Vec<&String> = named.difference(&scraped).collect();
    assert!(
        missing.is_empty(),
        "the dashboard names series no scrape has: {missing:?}\nscrape:\n{scrape}"
    );
    eprintln!(
        "dashboard: {} series named, all among the {} of a real scrape",
        named.len(),
        scraped.len()
    );
    drop(mounted);
    fx.run_ok(&["detach", "pg"]);
}

#[test]
fn series_names_are_read_out_of_queries() {
    assert_eq!(
        series_named(
            r#"rate(sparse_volume_write_time_seconds_total{name=~".*"}[5m]) / rate(sparse_volume_writes_completed_total[5m])"#
        ),
        BTreeSet::from([
            "sparse_volume_write_time_seconds_total".to_string(),
            "sparse_volume_writes_completed_total".to_string()
        ])
    );
}
