//! Golden-file tests: every directory under `generator/tests/golden/` is one case.
//!
//! A case holds an input tree (`etc/sparse-volume/...` and optionally
//! `proc/cmdline`, read through `SPARSE_VOLUME_ROOT`) and `expected/`, the exact output directory
//! (`expected/.empty` stands for an empty one, since git keeps no empty
//! directories); `expected-early/`, when there, is the early directory's
//! (which is otherwise empty). An optional `expected.stderr-contains` lists lines that
//! must each appear in the generator's stderr (its kernel-log lines, which
//! go to stderr under `SPARSE_VOLUME_ROOT`), and every stderr line must
//! contain one of them; without it, stderr must be empty. Adding a case
//! means adding a directory.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use similar::TextDiff;

const EMPTY_MARKER: &str = ".empty";

#[derive(Debug, PartialEq)]
enum Node {
    Dir,
    File(Vec<u8>),
    Symlink(PathBuf),
}

fn fixtures() -> Vec<PathBuf> {
    let base = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .canonicalize()
        .expect("the generator/tests/golden fixtures directory");
    let mut cases: Vec<PathBuf> = fs::read_dir(&base)
        .unwrap_or_else(|e| panic!("reading {}: {e}", base.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.is_dir())
        .collect();
    cases.sort();
    cases
}

/// Every entry below `dir`, by relative path, without following symlinks.
fn snapshot(dir: &Path) -> BTreeMap<String, Node> {
    fn walk(base: &Path, dir: &Path, out: &mut BTreeMap<String, Node>) {
        for entry in fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let relative = path.strip_prefix(base).unwrap().display().to_string();
            let kind = fs::symlink_metadata(&path).unwrap().file_type();
            if kind.is_symlink() {
                out.insert(relative, Node::Symlink(fs::read_link(&path).unwrap()));
            } else if kind.is_dir() {
                out.insert(relative, Node::Dir);
                walk(base, &path, out);
            } else {
                out.insert(relative, Node::File(fs::read(&path).unwrap()));
            }
        }
    }
    let mut out = BTreeMap::new();
    if dir.exists() {
        walk(dir, dir, &mut out);
    }
    out
}

fn describe(node: &Node) -> String {
    match node {
        Node::Dir => "a directory".into(),
        Node::File(_) => "a file".into(),
        Node::Symlink(target) => format!("a symlink to {}", target.display()),
    }
}

/// A readable account of every difference, empty when the trees agree.
fn compare(expected: &BTreeMap<String, Node>, actual: &BTreeMap<String, Node>) -> String {
    let mut report = String::new();
    for (path, want) in expected {
        match actual.get(path) {
            None => report.push_str(&format!("  missing: {path} ({})\n", describe(want))),
            Some(got) if got == want => {}
            Some(Node::File(got)) if matches!(want, Node::File(_)) => {
                let Node::File(want) = want else {
                    unreachable!()
                };
                let (want, got) = (String::from_utf8_lossy(want), String::from_utf8_lossy(got));
                let diff = TextDiff::from_lines(want.as_ref(), got.as_ref());
                report.push_str(&format!(
                    "  differs: {path}\n{}",
                    diff.unified_diff().header("expected", "actual")
                ));
            }
            Some(got) => report.push_str(&format!(
                "  differs: {path} is {}, expected {}\n",
                describe(got),
                describe(want)
            )),
        }
    }
    for (path, got) in actual {
        if !expected.contains_key(path) {
            report.push_str(&format!("  extra: {path} ({})\n", describe(got)));
        }
    }
    report
}

fn run_generator(root: &Path, dirs: &[&Path]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_sparse-volume-generator"))
        .args(dirs)
        .env("SPARSE_VOLUME_ROOT", root)
        .output()
        .expect("running sparse-volume-generator")
}

/// Runs one case; returns what went wrong, or an empty string.
fn check_case(case: &Path) -> String {
    let out = tempfile::tempdir().unwrap();
    let (normal, early, late) = (
        out.path().join("normal"),
        out.path().join("early"),
        out.path().join("late"),
    );
    for dir in [&normal, &early, &late] {
        fs::create_dir(dir).unwrap();
    }
    let mut problems = String::new();

    let result = run_generator(case, &[&normal, &early, &late]);
    let stderr = String::from_utf8_lossy(&result.stderr);
    if !result.status.success() {
        problems.push_str(&format!("  exit status {}\n", result.status));
    }
    match fs::read_to_string(case.join("expected.stderr-contains")) {
        Ok(wanted) => {
            let wanted: Vec<&str> = wanted.lines().filter(|l| !l.is_empty()).collect();
            for line in &wanted {
                if !stderr.contains(line) {
                    problems.push_str(&format!("  stderr lacks: {line}\n"));
                }
            }
            // Both ways: a case must not quietly gain a warning or a
            // skipped volume either.
            for line in stderr.lines() {
                if !wanted.iter().any(|w| line.contains(w)) {
                    problems.push_str(&format!("  unexpected stderr line: {line}\n"));
                }
            }
        }
        Err(_) if !stderr.is_empty() => {
            problems.push_str("  unexpected stderr (add expected.stderr-contains if intended)\n");
        }
        Err(_) => {}
    }
    if !problems.is_empty() {
        problems.push_str(&format!("  stderr was:\n{stderr}"));
    }

    let mut expected = snapshot(&case.join("expected"));
    expected.remove(EMPTY_MARKER);
    let actual = snapshot(&normal);
    problems.push_str(&compare(&expected, &actual));
    let actual_early = snapshot(&early);
    problems.push_str(&compare(
        &snapshot(&case.join("expected-early")),
        &actual_early,
    ));
    if !snapshot(&late).is_empty() {
        problems.push_str(&format!("  wrote into {}\n", late.display()));
    }

    // A second run over its own output (a daemon-reload by hand) must
    // succeed and leave the same bytes.
    let again = run_generator(case, &[&normal, &early, &late]);
    if !again.status.success() || snapshot(&normal) != actual || snapshot(&early) != actual_early {
        problems.push_str("  a second run did not reproduce the same output\n");
    }
    problems
}

#[test]
fn golden_cases() {
    let cases = fixtures();
    assert!(cases.len() >= 10, "fixtures not found: {cases:?}");
    let mut failures = Vec::new();
    for case in &cases {
        let name = case.file_name().unwrap().to_string_lossy().into_owned();
        assert!(
            case.join("expected").is_dir(),
            "{name}: every case needs an expected/ directory"
        );
        let problems = check_case(case);
        if problems.is_empty() {
            println!("ok {name}");
        } else {
            println!("FAILED {name}\n{problems}");
            failures.push(name);
        }
    }
    assert!(failures.is_empty(), "failed cases: {failures:?}");
}
