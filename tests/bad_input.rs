//! Bad input, case by case (issue 10): broken volume files, broken
//! `config.toml`, and bad command lines, each run through the real
//! binaries against a private root.
//!
//! The registry cases are data: `tests/bad_input/<category>/<case>.toml`,
//! whose first lines say what must happen (`# expect: TEXT`, a piece of the
//! one line that must name the file, and optionally `# file: NAME`, the
//! name to install it under). Inputs too big or too binary to commit are
//! built in `generated_encoding_cases`. Adding a case means adding a file.
//!
//! For every bad volume file:
//! * `list`, `status`, `attach` and `check` exit 1 and print exactly one
//!   line naming the file and the reason (on stderr for the volume's own
//!   commands; `list` and `check` may carry it in their report), and no
//!   panic text;
//! * the good volume in the same registry is still listed, and attaches;
//! * the generator exits 0, logs one line naming the file, skips that
//!   volume only;
//! * nothing under the root changes (contents, modes, links).
//!
//! A bad `config.toml` never takes volumes down: every command still works
//! on the good volume and warns once. An unknown key is one warning naming
//! the nearest known key; the volume is kept and works.
//!
//! Each category is one `#[test]` that collects every failing case before
//! it asserts, so one run shows them all.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{new_uuid, tool, Fixture, Run};

/// The UUID every bad volume file is installed under (it never attaches,
/// so a fixed value cannot collide with another test's loop device).
const BAD: &str = "bad0bad0-1111-4222-8333-444455556666";
const GOOD_SIZE: u64 = 8 << 20;
const VOLUMES_D: &str = "/etc/sparse-volume/volumes.d";
const CONFIG: &str = "/etc/sparse-volume/config.toml";

/// Output that means a crash, never a message.
const CRASH_MARKERS: [&str; 4] = [
    "panicked",
    "RUST_BACKTRACE",
    "stack backtrace",
    "thread 'main'",
];

struct Case {
    name: String,
    /// Logical path the bytes are installed at.
    install: String,
    bytes: Vec<u8>,
    /// A piece of the one line that must name the file.
    expect: String,
    /// A defect in code this suite does not own (`# known-defect: WHY`):
    /// the case must still fail, and passing is reported so that the
    /// marker is removed once the defect is fixed.
    known_defect: Option<String>,
}

/// A private root with one good, attachable ext4 volume.
struct Bench {
    fixture: Fixture,
    good: String,
    good_text: String,
    generator: PathBuf,
    category: &'static str,
    tried: usize,
    failures: Vec<String>,
    known: Vec<String>,
}

#[derive(Debug, PartialEq)]
enum Node {
    /// Mode and owner, then content.
    Dir(u32, u32),
    File(u32, u32, Vec<u8>),
    Link(PathBuf),
    /// FIFOs and the like: reading one would block.
    Special(u32, u32),
}

impl Bench {
    fn new(category: &'static str) -> Self {
        let fixture = Fixture::new();
        let good = new_uuid();
        let backing = fixture.backing(&good);
        fixture.sparse_file_of(&backing, GOOD_SIZE);
        tool(
            "mkfs.ext4",
            &[
                "-q",
                "-F",
                "-U",
                &good,
                backing.to_str().expect("UTF-8 path"),
            ],
        );
        let good_text = format!(
            "uuid = \"{good}\"\npath = \"{}\"\nsize = {GOOD_SIZE}\nmode = \"filesystem\"\n",
            fixture.logical_backing(&good)
        );
        let bench = Self {
            fixture,
            good,
            good_text,
            generator: generator_binary(),
            category,
            tried: 0,
            failures: Vec::new(),
            known: Vec::new(),
        };
        bench.write(
            &format!("{VOLUMES_D}/{}.toml", bench.good),
            bench.good_text.as_bytes(),
        );
        bench
    }

    /// Writes a registry file as an operator would: root-owned, 0644.
    fn write(&self, logical: &str, bytes: &[u8]) {
        let path = self.host(logical);
        fs::write(&path, bytes).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).expect("chmod 0644");
    }

    fn host(&self, logical: &str) -> PathBuf {
        self.fixture.host(logical)
    }

    fn good_file(&self) -> String {
        format!("{VOLUMES_D}/{}.toml", self.good)
    }

    fn substitute(&self, text: &[u8]) -> Vec<u8> {
        let text = String::from_utf8_lossy(text)
            .replace("@GOODPATH@", &self.fixture.logical_backing(&self.good))
            .replace("@GOODSIZE@", &GOOD_SIZE.to_string())
            .replace("@GOOD@", &self.good);
        text.into_bytes()
    }

    /// Every file, directory and link below the root but `run/` (lock
    /// files appear there by design).
    fn snapshot(&self) -> BTreeMap<PathBuf, Node> {
        fn walk(base: &Path, dir: &Path, out: &mut BTreeMap<PathBuf, Node>) {
            for entry in fs::read_dir(dir).expect("read_dir") {
                let path = entry.expect("dir entry").path();
                let relative = path.strip_prefix(base).expect("below base").to_path_buf();
                if relative == Path::new("run") {
                    continue;
                }
                let meta = fs::symlink_metadata(&path).expect("lstat");
                let (mode, uid) = (meta.permissions().mode(), meta.uid());
                if meta.file_type().is_symlink() {
                    out.insert(
                        relative,
                        Node::Link(fs::read_link(&path).expect("readlink")),
                    );
                } else if meta.is_dir() {
                    out.insert(relative, Node::Dir(mode, uid));
                    walk(base, &path, out);
                } else if meta.is_file() {
                    out.insert(
                        relative,
                        Node::File(mode, uid, fs::read(&path).expect("read")),
                    );
                } else {
                    out.insert(relative, Node::Special(mode, uid));
                }
            }
        }
        let mut out = BTreeMap::new();
        walk(self.fixture.root.path(), self.fixture.root.path(), &mut out);
        out
    }

    fn run(&self, args: &[&str]) -> Run {
        let output = self
            .fixture
            .command(args)
            .env("RUST_BACKTRACE", "1")
            .output()
            .expect("running sparse-volume");
        Run {
            code: output.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }

    /// Runs the generator into a fresh output directory; returns its run
    /// and every output path (relative).
    fn generate(&self) -> (Run, Vec<String>) {
        let out = tempfile::tempdir().expect("output dir");
        let dirs: Vec<PathBuf> = ["normal", "early", "late"]
            .iter()
            .map(|d| out.path().join(d))
            .collect();
        for dir in &dirs {
            fs::create_dir(dir).expect("output subdir");
        }
        let output = Command::new(&self.generator)
            .args(&dirs)
            .env("SPARSE_VOLUME_ROOT", self.fixture.root.path())
            .env("RUST_BACKTRACE", "1")
            .output()
            .expect("running sparse-volume-generator");
        let mut written = Vec::new();
        let mut stack = vec![out.path().to_path_buf()];
        while let Some(dir) = stack.pop() {
            for entry in fs::read_dir(&dir).expect("read output") {
                let path = entry.expect("entry").path();
                written.push(
                    path.strip_prefix(out.path())
                        .expect("below out")
                        .display()
                        .to_string(),
                );
                if fs::symlink_metadata(&path).expect("lstat").is_dir() {
                    stack.push(path);
                }
            }
        }
        let run = Run {
            code: output.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        };
        (run, written)
    }

    fn fail(&mut self, case: &str, what: &str, problem: String) {
        // A 10 MiB input echoed back would bury every other failure.
        let problem: String = problem.chars().take(800).collect();
        self.failures
            .push(format!("[{}] {case}: {what}: {problem}", self.category));
    }

    /// Runs `args`, checks exit code and that nothing changed, returns the run.
    fn step(
        &mut self,
        case: &str,
        args: &[&str],
        code: i32,
        before: &BTreeMap<PathBuf, Node>,
    ) -> Run {
        let run = self.run(args);
        let what = format!("sparse-volume {}", args.join(" "));
        if run.code != code {
            self.fail(
                case,
                &what,
                format!(
                    "exit {} (expected {code}); stderr: {}",
                    run.code,
                    run.stderr.trim()
                ),
            );
        }
        self.no_crash(case, &what, &run);
        self.unchanged(case, &what, before);
        run
    }

    fn no_crash(&mut self, case: &str, what: &str, run: &Run) {
        for marker in CRASH_MARKERS {
            if let Some(line) = run
                .stderr
                .lines()
                .chain(run.stdout.lines())
                .find(|l| l.contains(marker))
            {
                self.fail(case, what, format!("crash output: {line}"));
                return;
            }
        }
    }

    fn unchanged(&mut self, case: &str, what: &str, before: &BTreeMap<PathBuf, Node>) {
        let after = self.snapshot();
        if &after != before {
            let changed: Vec<String> = before
                .keys()
                .chain(after.keys())
                .filter(|k| before.get(*k) != after.get(*k))
                .map(|k| k.display().to_string())
                .collect();
            self.fail(case, what, format!("changed files: {changed:?}"));
        }
    }

    /// Exactly one line of `run` mentions `name`; it also names the
    /// registry directory and contains `expect`. `stderr_only` demands
    /// that line on stderr.
    fn one_line(
        &mut self,
        case: &str,
        what: &str,
        run: &Run,
        name: &str,
        expect: &str,
        stderr_only: bool,
    ) {
        let mentions = |text: &str| -> Vec<String> {
            text.lines()
                .filter(|l| l.contains(name))
                .map(str::to_string)
                .collect()
        };
        let on_stderr = mentions(&run.stderr);
        let on_stdout = mentions(&run.stdout);
        let all: Vec<&String> = on_stderr.iter().chain(&on_stdout).collect();
        let full = |l: &str| l.contains(expect) && l.contains("sparse-volume/");
        if all.len() != 1 || !full(all[0]) || (stderr_only && on_stderr.len() != 1) {
            self.fail(
                case,
                what,
                format!(
                    "expected one line naming {name:?} with {expect:?}{}; stderr: {:?} stdout: {:?}",
                    if stderr_only { " on stderr" } else { "" },
                    run.stderr,
                    run.stdout
                ),
            );
        }
    }

    /// Holds a case with a known defect to "fails as described": its
    /// failures since `mark` are set aside, and its passing is a failure.
    fn settle(&mut self, case: &str, known_defect: Option<&str>, mark: usize) {
        let Some(why) = known_defect else { return };
        if self.failures.len() == mark {
            self.fail(
                case,
                "known defect",
                format!("passes now; remove its known-defect marker ({why})"),
            );
        } else {
            let seen = self.failures.split_off(mark);
            self.known.push(format!(
                "[{}] {case}: {why} ({} checks fail)",
                self.category,
                seen.len()
            ));
        }
    }

    fn good_listed(&mut self, case: &str, run: &Run) {
        if !run.stdout.lines().any(|l| l.starts_with(&self.good[..8])) {
            let good = self.good.clone();
            self.fail(
                case,
                "list",
                format!("good volume {good} missing: {}", run.stdout),
            );
        }
    }

    /// Attaches and detaches the good volume; both must succeed.
    fn good_attaches(&mut self, case: &str, before: &BTreeMap<PathBuf, Node>) {
        let good = self.good.clone();
        self.step(case, &["status", &good], 0, before);
        self.step(case, &["attach", &good], 0, before);
        self.step(case, &["detach", &good], 0, before);
    }

    fn generator_skips(
        &mut self,
        case: &str,
        name: &str,
        expect: &str,
        before: &BTreeMap<PathBuf, Node>,
    ) {
        let (run, written) = self.generate();
        let what = "sparse-volume-generator";
        if run.code != 0 {
            self.fail(case, what, format!("exit {}: {}", run.code, run.stderr));
        }
        self.no_crash(case, what, &run);
        self.one_line(case, what, &run, name, expect, true);
        let link = format!(
            "normal/sparse-volumes.target.wants/sparse-volume@{}.service",
            self.good
        );
        if !written.contains(&link) {
            self.fail(
                case,
                what,
                format!("good volume not generated: {written:?}"),
            );
        }
        if written.iter().any(|w| w.contains(BAD)) {
            self.fail(case, what, format!("bad volume generated: {written:?}"));
        }
        self.unchanged(case, what, before);
    }

    /// A broken volume file next to the good one.
    fn bad_volume(&mut self, case: &Case) {
        self.write(&case.install, &case.bytes);
        self.installed_bad_volume(case);
    }

    /// Like [`Bench::bad_volume`], for an entry already in place (special
    /// files); `case.bytes` is unused.
    fn installed_bad_volume(&mut self, case: &Case) {
        self.tried += 1;
        let mark = self.failures.len();
        let before = self.snapshot();
        let name = shown_name(&case.install);
        let expect = case.expect.as_str();
        let c = case.name.as_str();

        let run = self.step(c, &["list"], 1, &before);
        self.one_line(c, "list", &run, &name, expect, false);
        self.good_listed(c, &run);
        if case.install == format!("{VOLUMES_D}/{BAD}.toml") {
            for command in ["status", "attach"] {
                let run = self.step(c, &[command, BAD], 1, &before);
                self.one_line(c, command, &run, &name, expect, true);
            }
        }
        let run = self.step(c, &["check"], 1, &before);
        self.one_line(c, "check", &run, &name, expect, false);
        self.good_attaches(c, &before);
        self.generator_skips(c, &name, expect, &before);

        let installed = self.host(&case.install);
        if fs::symlink_metadata(&installed).is_ok_and(|m| m.is_dir()) {
            fs::remove_dir(&installed).expect("removing the case");
        } else {
            fs::remove_file(&installed).expect("removing the case");
        }
        self.settle(c, case.known_defect.as_deref(), mark);
    }

    /// A broken `config.toml`: the good volume keeps working, every
    /// command warns once.
    fn bad_config(&mut self, case: &Case) {
        self.tried += 1;
        self.write(CONFIG, &case.bytes);
        let before = self.snapshot();
        let (c, expect) = (case.name.as_str(), case.expect.as_str());
        let good = self.good.clone();

        let run = self.step(c, &["list"], 0, &before);
        self.one_line(c, "list", &run, "config.toml", expect, true);
        self.good_listed(c, &run);
        for args in [["status", &good], ["attach", &good]] {
            let run = self.step(c, &args, 0, &before);
            self.one_line(c, args[0], &run, "config.toml", expect, true);
        }
        // Attached, so the only finding left is the configuration.
        let run = self.step(c, &["check"], 1, &before);
        self.one_line(c, "check", &run, "config.toml", expect, false);
        self.step(c, &["detach", &good], 0, &before);
        self.generator_keeps_good(c, expect, &before);

        fs::remove_file(self.host(CONFIG)).expect("removing config.toml");
    }

    fn generator_keeps_good(&mut self, case: &str, expect: &str, before: &BTreeMap<PathBuf, Node>) {
        let (run, written) = self.generate();
        let what = "sparse-volume-generator";
        if run.code != 0 {
            self.fail(case, what, format!("exit {}: {}", run.code, run.stderr));
        }
        self.no_crash(case, what, &run);
        self.one_line(case, what, &run, "config.toml", expect, true);
        let link = format!(
            "normal/sparse-volumes.target.wants/sparse-volume@{}.service",
            self.good
        );
        if !written.contains(&link) {
            self.fail(
                case,
                what,
                format!("good volume not generated: {written:?}"),
            );
        }
        self.unchanged(case, what, before);
    }

    /// An unknown key in the good volume's file or in `config.toml`: one
    /// warning naming the nearest known key; the volume is kept and works.
    fn unknown_key(&mut self, case: &Case) {
        self.tried += 1;
        self.write(&case.install, &case.bytes);
        let before = self.snapshot();
        let name = shown_name(&case.install);
        let (c, expect) = (case.name.as_str(), case.expect.as_str());
        let good = self.good.clone();

        let run = self.step(c, &["list"], 0, &before);
        self.one_line(c, "list", &run, &name, expect, true);
        self.good_listed(c, &run);
        for args in [["status", &good], ["attach", &good]] {
            let run = self.step(c, &args, 0, &before);
            self.one_line(c, args[0], &run, &name, expect, true);
        }
        // Attached and otherwise sound: a warning keeps check clean.
        let run = self.step(c, &["check"], 0, &before);
        self.one_line(c, "check", &run, &name, expect, false);
        self.step(c, &["detach", &good], 0, &before);
        self.generator_keeps_good_with_warning(c, &name, expect, &before);

        if case.install == CONFIG {
            fs::remove_file(self.host(CONFIG)).expect("removing config.toml");
        } else {
            let text = self.good_text.clone();
            self.write(&self.good_file(), text.as_bytes());
        }
    }

    fn generator_keeps_good_with_warning(
        &mut self,
        case: &str,
        name: &str,
        expect: &str,
        before: &BTreeMap<PathBuf, Node>,
    ) {
        let (run, written) = self.generate();
        let what = "sparse-volume-generator";
        if run.code != 0 {
            self.fail(case, what, format!("exit {}: {}", run.code, run.stderr));
        }
        self.one_line(case, what, &run, name, expect, true);
        let link = format!(
            "normal/sparse-volumes.target.wants/sparse-volume@{}.service",
            self.good
        );
        if !written.contains(&link) {
            self.fail(
                case,
                what,
                format!("good volume not generated: {written:?}"),
            );
        }
        self.unchanged(case, what, before);
    }

    fn finish(self) {
        println!(
            "bad_input {}: {} inputs tried, {} failures, {} known defects",
            self.category,
            self.tried,
            self.failures.len(),
            self.known.len()
        );
        for known in &self.known {
            println!("  known defect: {known}");
        }
        assert!(self.tried > 0, "no cases in category {}", self.category);
        assert!(
            self.failures.is_empty(),
            "{} failing checks:\n{}",
            self.failures.len(),
            self.failures.join("\n")
        );
    }
}

/// What a line naming the installed file must contain: its name after the
/// last control character (a raw newline in a file name must not split
/// the line, so the part after it has to sit on the line that names the
/// directory and the reason).
fn shown_name(install: &str) -> String {
    let name = Path::new(install)
        .file_name()
        .expect("file name")
        .to_string_lossy()
        .into_owned();
    match name.rfind(char::is_control) {
        Some(at) => name[at + 1..].to_string(),
        None => name,
    }
}

fn generator_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("SPARSE_VOLUME_GENERATOR") {
        return PathBuf::from(path);
    }
    let path =
        Path::new(env!("CARGO_BIN_EXE_sparse-volume")).with_file_name("sparse-volume-generator");
    assert!(
        path.exists(),
        "{} is missing: build the workspace first (cargo build --workspace) or set SPARSE_VOLUME_GENERATOR",
        path.display()
    );
    path
}

/// The committed cases of one category, with their `# expect:` and
/// `# file:` headers; installed as the bad volume's file by default.
fn corpus(bench: &Bench, category: &str, default_install: &str) -> Vec<Case> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/bad_input")
        .join(category);
    let mut files: Vec<PathBuf> = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| e.expect("entry").path())
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|file| {
            let bytes = bench.substitute(&fs::read(&file).expect("reading a case"));
            let text = String::from_utf8_lossy(&bytes).into_owned();
            let header = |key: &str| {
                text.lines()
                    .find_map(|l| l.strip_prefix(&format!("# {key}: ")))
                    .map(str::to_string)
            };
            let name = file
                .file_stem()
                .expect("stem")
                .to_string_lossy()
                .into_owned();
            let expect = header("expect")
                .unwrap_or_else(|| panic!("{} has no # expect: line", file.display()));
            let install = match header("file") {
                Some(file_name) => format!("{VOLUMES_D}/{}", file_name.replace("\\n", "\n")),
                None if default_install == "volume" && name.starts_with("config-") => {
                    CONFIG.to_string()
                }
                None if default_install == "volume" => bench.good_file(),
                None => default_install.to_string(),
            };
            Case {
                name,
                install,
                bytes,
                expect,
                known_defect: header("known-defect"),
            }
        })
        .collect()
}

fn bad_volume_category(category: &'static str) {
    let mut bench = Bench::new(category);
    for case in corpus(&bench, category, &format!("{VOLUMES_D}/{BAD}.toml")) {
        bench.bad_volume(&case);
    }
    bench.finish();
}

#[test]
fn syntax_errors() {
    needs_root!();
    bad_volume_category("syntax");
}

#[test]
fn wrong_types() {
    needs_root!();
    bad_volume_category("types");
}

#[test]
fn bad_sizes() {
    needs_root!();
    bad_volume_category("sizes");
}

#[test]
fn bad_uuids() {
    needs_root!();
    bad_volume_category("uuids");
}

#[test]
fn bad_paths_and_names() {
    needs_root!();
    bad_volume_category("paths");
}

#[test]
fn bad_modes_and_sector_sizes() {
    needs_root!();
    bad_volume_category("modes");
}

#[test]
fn bad_config() {
    needs_root!();
    let mut bench = Bench::new("config");
    for case in corpus(&bench, "config", CONFIG) {
        bench.bad_config(&case);
    }
    for case in generated_config_cases() {
        bench.bad_config(&case);
    }
    bench.finish();
}

#[test]
fn unknown_keys_warn_and_keep_the_volume() {
    needs_root!();
    let mut bench = Bench::new("unknown_keys");
    for case in corpus(&bench, "unknown_keys", "volume") {
        bench.unknown_key(&case);
    }
    bench.finish();
}

const BAD_PATH: &str = "/var/lib/sparse-volume/bad0bad0-1111-4222-8333-444455556666";

fn valid_bad_volume(extra: &str) -> String {
    format!("uuid = \"{BAD}\"\npath = \"{BAD_PATH}\"\nsize = {GOOD_SIZE}\nmode = \"filesystem\"\n{extra}")
}

const TEN_MIB: usize = 10 << 20;

/// Inputs too big or too binary to commit.
fn generated_encoding_cases() -> Vec<Case> {
    let install = format!("{VOLUMES_D}/{BAD}.toml");
    let case = |name: &str, bytes: Vec<u8>, expect: &str| Case {
        name: name.to_string(),
        install: install.clone(),
        bytes,
        expect: expect.to_string(),
        known_defect: None,
    };
    let mut latin1_name = valid_bad_volume("name = \"caf").into_bytes();
    latin1_name.extend_from_slice(b"\xe9\"\n");
    let mut utf16 = vec![0xff, 0xfe];
    for unit in valid_bad_volume("").encode_utf16() {
        utf16.extend_from_slice(&unit.to_le_bytes());
    }
    let mut raw_nul = valid_bad_volume("name = \"a").into_bytes();
    raw_nul.extend_from_slice(b"\0b\"\n");
    let mut garbage = Vec::with_capacity(TEN_MIB);
    let mut state: u32 = 0x2545_f491;
    while garbage.len() < TEN_MIB {
        // xorshift: reproducible bytes without a dependency.
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        garbage.extend_from_slice(&state.to_le_bytes());
    }
    let mut padded = valid_bad_volume("");
    while padded.len() < TEN_MIB {
        padded.push_str("# padding padding padding padding padding padding padding\n");
    }
    let padded_lines = padded.lines().count();
    padded.push_str("size = \n");
    let huge_name = valid_bad_volume(&format!("name = \"{}\"\n", "n".repeat(TEN_MIB)));
    let huge_path =
        valid_bad_volume("").replace(BAD_PATH, &format!("/var/lib/{}", "p/".repeat(TEN_MIB / 2)));
    let huge_path = huge_path.replace("/\"\n", "/x\"\n");
    let mut bom = b"\xef\xbb\xbf".to_vec();
    bom.extend_from_slice(valid_bad_volume("sector_size = 1024\n").as_bytes());
    vec![
        case("latin-1-in-name", latin1_name, "not valid UTF-8"),
        case("utf-16-with-bom", utf16, "not valid UTF-8"),
        case("raw-nul-byte", raw_nul, ".toml:5:"),
        case("ten-mib-of-random-bytes", garbage, "not valid UTF-8"),
        case(
            "ten-mib-then-a-syntax-error",
            padded.into_bytes(),
            &format!(".toml:{}:", padded_lines + 1),
        ),
        case("ten-mib-name", huge_name.into_bytes(), "at most 255"),
        case("ten-mib-path", huge_path.into_bytes(), "at most 4095"),
        case("utf-8-bom-then-bad-sector-size", bom, "512 or 4096"),
    ]
}

fn generated_config_cases() -> Vec<Case> {
    let case = |name: &str, bytes: Vec<u8>, expect: &str| Case {
        name: name.to_string(),
        install: CONFIG.to_string(),
        bytes,
        expect: expect.to_string(),
        known_defect: None,
    };
    let mut padded = String::new();
    while padded.len() < TEN_MIB {
        padded.push_str("# padding padding padding padding padding padding padding\n");
    }
    let line = padded.lines().count() + 1;
    padded.push_str("direct_io = \"no\"\n");
    vec![
        case(
            "config-latin-1",
            b"reserve = \"5\xa0%\"\n".to_vec(),
            "UTF-8",
        ),
        case(
            "config-ten-mib-then-a-type-error",
            padded.into_bytes(),
            &format!(".toml:{line}:"),
        ),
        case(
            "config-raw-nul",
            b"reserve = \"5\0%\"\n".to_vec(),
            ".toml:1:",
        ),
    ]
}

#[test]
fn bad_encodings_and_huge_files() {
    needs_root!();
    let mut bench = Bench::new("encoding");
    for case in generated_encoding_cases() {
        bench.bad_volume(&case);
    }
    bench.finish();
}

/// Paths that only the file system can judge: the registry text is fine
/// (so the generator makes the unit), `attach` must refuse.
#[test]
fn backing_paths_through_links() {
    needs_root!();
    let mut bench = Bench::new("links");
    let real = bench.host("/var/lib/sparse-volume/real");
    fs::create_dir(&real).expect("mkdir");
    let backing = real.join(BAD);
    bench.fixture.sparse_file_of(&backing, GOOD_SIZE);
    tool(
        "mkfs.ext4",
        &["-q", "-F", "-U", BAD, backing.to_str().expect("UTF-8")],
    );
    symlink("real", bench.host("/var/lib/sparse-volume/linked-dir")).expect("symlink dir");
    symlink(
        format!("real/{BAD}"),
        bench.host(&format!("/var/lib/sparse-volume/{BAD}")),
    )
    .expect("symlink file");

    let cases = [
        (
            "backing-file-is-a-symlink",
            BAD_PATH.to_string(),
            "symbolic link",
            None,
        ),
        (
            "symlinked-directory-in-path",
            format!("/var/lib/sparse-volume/linked-dir/{BAD}"),
            "symbolic link",
            None,
        ),
    ];
    for (name, path, expect, known_defect) in cases {
        bench.tried += 1;
        let mark = bench.failures.len();
        let text = format!(
            "uuid = \"{BAD}\"\npath = \"{path}\"\nsize = {GOOD_SIZE}\nmode = \"filesystem\"\n"
        );
        bench.write(&format!("{VOLUMES_D}/{BAD}.toml"), text.as_bytes());
        let before = bench.snapshot();
        let run = bench.step(name, &["attach", BAD], 1, &before);
        bench.one_line(name, "attach", &run, &path, expect, true);
        if !common::loops_of(&backing).is_empty() {
            bench.fail(name, "attach", "a loop device was set up".into());
            let _ = bench.run(&["detach", BAD]);
        }
        bench.good_attaches(name, &before);
        bench.settle(name, known_defect, mark);
    }
    bench.finish();
}

/// Bad command lines: usage errors exit 2 (clap's message plus a usage
/// hint); values the registry's rules or the system's state refuse exit 1
/// with one line. Either way the message names what is wrong, and nothing
/// under the root changes. (A NUL cannot be passed in argv at all.)
#[test]
fn bad_command_lines() {
    needs_root!();
    let mut bench = Bench::new("cli");
    let good = bench.good.clone();
    let braces = format!("{{{good}}}");
    let bare = good.replace('-', "");
    let urn = format!("urn:uuid:{good}");
    let invalid_utf8 = std::ffi::OsStr::from_bytes(b"/var/lib/sparse-volume/\xff").to_owned();
    let long_name = "n".repeat(256);
    let cases: Vec<(&str, Vec<&str>, &str)> = vec![
        ("no-command", vec![], "Usage"),
        // A name that could never name a volume: a usage error, as in apply.
        (
            "name-newline",
            vec!["create", "--size", "1G", "--name", "a\nb"],
            "control characters",
        ),
        (
            "name-escape",
            vec!["create", "--size", "1G", "--name", "\u{1b}[2J"],
            "control characters",
        ),
        ("unknown-command", vec!["frobnicate"], "frobnicate"),
        ("unknown-flag", vec!["list", "--frob"], "--frob"),
        ("unknown-global-flag", vec!["--colour", "list"], "--colour"),
        ("create-without-size", vec!["create"], "--size"),
        (
            "size-zero",
            vec!["create", "--size", "0"],
            "greater than zero",
        ),
        ("size-minus-one", vec!["create", "--size", "-1"], "-1"),
        (
            "size-minus-one-attached",
            vec!["create", "--size=-1"],
            "not a size",
        ),
        (
            "size-unknown-unit",
            vec!["create", "--size", "10X"],
            "unknown unit",
        ),
        (
            "size-exponent",
            vec!["create", "--size", "1e3"],
            "unknown unit",
        ),
        (
            "size-fraction-of-a-byte",
            vec!["create", "--size", "1.3K"],
            "not a whole number of bytes",
        ),
        (
            "size-overflow-digits",
            vec!["create", "--size", "99999999999999999999"],
            "too large",
        ),
        (
            "size-overflow-unit",
            vec!["create", "--size", "16E"],
            "too large",
        ),
        ("size-empty", vec!["create", "--size", ""], "not a size"),
        (
            "size-only-unit",
            vec!["create", "--size", "G"],
            "not a size",
        ),
        (
            "size-twice",
            vec!["create", "--size", "1G", "--size", "2G"],
            "multiple times",
        ),
        (
            "resize-size-zero",
            vec!["resize", &good, "--size", "0"],
            "greater than zero",
        ),
        ("resize-without-size", vec!["resize", &good], "--size"),
        (
            "uuid-braces",
            vec!["status", &braces],
            "write it hyphenated",
        ),
        (
            "uuid-no-hyphens",
            vec!["attach", &bare],
            "write it hyphenated",
        ),
        ("uuid-urn", vec!["detach", &urn], "write it hyphenated"),
        (
            "uuid-nil",
            vec!["status", "00000000-0000-0000-0000-000000000000"],
            "nil",
        ),
        // Anything that does not read as a UUID is a name (an unknown one
        // is exit 1, tests/apply.rs); these can name no volume at all.
        ("name-empty", vec!["status", ""], "must not be empty"),
        (
            "name-with-newline",
            vec!["status", "a\nb"],
            "control characters",
        ),
        ("volume-missing", vec!["attach"], "<VOLUME>"),
        (
            "two-uuids",
            vec!["status", &good, &good],
            "unexpected argument",
        ),
        (
            "block-with-fs",
            vec!["create", "--size", "1G", "--mode", "block", "--fs", "xfs"],
            "--fs",
        ),
        (
            "block-with-mkfs-option",
            vec![
                "create",
                "--size",
                "1G",
                "--mode",
                "block",
                "--mkfs-option",
                "-m",
            ],
            "--mkfs-option",
        ),
        (
            "mode-unknown",
            vec!["create", "--size", "1G", "--mode", "raw"],
            "raw",
        ),
        (
            "fs-unknown",
            vec!["create", "--size", "1G", "--fs", "btrfs"],
            "btrfs",
        ),
        (
            "sector-size-1024",
            vec!["create", "--size", "1G", "--sector-size", "1024"],
            "512 or 4096",
        ),
        (
            "sector-size-zero",
            vec!["create", "--size", "1G", "--sector-size", "0"],
            "512 or 4096",
        ),
        (
            "register-block-with-fs",
            vec![
                "register", "--uuid", &good, "--path", BAD_PATH, "--mode", "block", "--fs", "ext4",
            ],
            "--fs",
        ),
        (
            "repair-twice",
            vec!["check", "--repair", "--repair"],
            "multiple times",
        ),
        (
            "remove-without-volume",
            vec!["remove", "--delete-data"],
            "<VOLUME>",
        ),
    ];
    let absent = new_uuid();
    let outside = format!("/srv/{BAD}");
    let hidden = format!("/var/lib/sparse-volume/.{BAD}.creating");
    // Refused (exit 1, one line on stderr) by the rules the registry's
    // parser applies, or by the state of the system; nothing is touched.
    let refused: Vec<(&str, Vec<&str>, &str)> = vec![
        (
            "name-too-long",
            vec!["create", "--size", "1G", "--name", &long_name],
            "at most 255",
        ),
        (
            "mkfs-option-newline",
            vec!["create", "--size", "1G", "--mkfs-option", "-L\nx"],
            "control characters",
        ),
        (
            "path-dot-dot",
            vec![
                "create",
                "--size",
                "1G",
                "--path",
                "/var/lib/sparse-volume/../x",
            ],
            "normalised absolute",
        ),
        (
            "path-relative",
            vec!["create", "--size", "1G", "--path", "rel/x"],
            "normalised absolute",
        ),
        (
            "path-newline",
            vec![
                "create",
                "--size",
                "1G",
                "--path",
                "/var/lib/sparse-volume/a\nb",
            ],
            "control characters",
        ),
        (
            "path-outside-storage-roots",
            vec!["create", "--size", "1G", "--path", &outside],
            "not inside a storage root",
        ),
        (
            "path-temporary-name",
            vec!["create", "--size", "1G", "--path", &hidden],
            "reserved",
        ),
        (
            "register-path-dot-dot",
            vec![
                "register",
                "--uuid",
                &absent,
                "--path",
                "/var/lib/sparse-volume/../x",
            ],
            "normalised absolute",
        ),
        (
            "create-existing-uuid-other-spec",
            vec!["create", "--size", "1G", "--uuid", &good],
            "different spec",
        ),
        (
            "resize-shrink",
            vec!["resize", &good, "--size", "1M"],
            "shrinking",
        ),
        (
            "attach-unregistered",
            vec!["attach", &absent],
            "not registered",
        ),
        (
            "status-unregistered",
            vec!["status", &absent],
            "not registered",
        ),
    ];
    let before = bench.snapshot();
    let run_case =
        |bench: &mut Bench, name: &str, args: Vec<std::ffi::OsString>, code: i32, expect: &str| {
            bench.tried += 1;
            let output = bench
                .fixture
                .command(&[])
                .args(&args)
                .env("RUST_BACKTRACE", "1")
                .output()
                .expect("running sparse-volume");
            let run = Run {
                code: output.status.code().unwrap_or(-1),
                stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
                stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
            };
            let what = format!("sparse-volume {args:?}");
            if run.code != code {
                bench.fail(
                    name,
                    &what,
                    format!("exit {} (expected {code}): {}", run.code, run.stderr.trim()),
                );
            }
            if !run.stderr.contains(expect) {
                bench.fail(
                    name,
                    &what,
                    format!("stderr lacks {expect:?}: {}", run.stderr.trim()),
                );
            }
            // Refusals and usage errors alike are one line (issue 25, item
            // 16); only a missing command answers with the help.
            if name != "no-command" && run.stderr.lines().count() != 1 {
                bench.fail(
                    name,
                    &what,
                    format!("not one line on stderr: {:?}", run.stderr),
                );
            }
            let json = args.iter().any(|a| a == "--json");
            if json {
                let parsed: Result<serde_json::Value, _> = serde_json::from_str(&run.stdout);
                match parsed {
                    Ok(object) if object["changed"] == false && object["error"].is_string() => {}
                    _ => bench.fail(
                        name,
                        &what,
                        format!("not a JSON error object: {}", run.stdout),
                    ),
                }
            } else if !run.stdout.is_empty() {
                bench.fail(
                    name,
                    &what,
                    format!("printed on stdout: {}", run.stdout.trim()),
                );
            }
            bench.no_crash(name, &what, &run);
            bench.unchanged(name, &what, &before);
        };
    for (name, args, expect) in cases {
        run_case(
            &mut bench,
            name,
            args.iter().map(Into::into).collect(),
            2,
            expect,
        );
    }
    for (name, args, expect) in refused {
        run_case(
            &mut bench,
            name,
            args.iter().map(Into::into).collect(),
            1,
            expect,
        );
    }
    let json_refusal = ["--json", "create", "--size", "1G", "--name", "a\tb"];
    run_case(
        &mut bench,
        "json-usage-error",
        json_refusal.iter().map(Into::into).collect(),
        2,
        "control characters",
    );
    let json_refusal = ["create", "--size", "1G", "--path", "rel/x", "--json"];
    run_case(
        &mut bench,
        "json-refusal",
        json_refusal.iter().map(Into::into).collect(),
        1,
        "normalised absolute",
    );
    let non_utf8 = vec![
        "create".into(),
        "--size".into(),
        "1G".into(),
        "--path".into(),
        invalid_utf8,
    ];
    run_case(&mut bench, "path-not-utf-8", non_utf8, 1, "UTF-8");
    bench.finish();
}

/// Registry entries that are not plain root-owned files: refused with one
/// line each (never read through, never waited on), the rest unharmed.
#[test]
fn special_registry_files() {
    needs_root!();
    use std::os::unix::fs::chown;

    let mut bench = Bench::new("file_kinds");
    let install = format!("{VOLUMES_D}/{BAD}.toml");
    let valid = valid_bad_volume("");
    let elsewhere = "/etc/sparse-volume/elsewhere.toml";
    bench.write(elsewhere, valid.as_bytes());
    let case = |name: &str, expect: &str| Case {
        name: name.to_string(),
        install: install.clone(),
        bytes: Vec::new(),
        expect: expect.to_string(),
        known_defect: None,
    };
    let target = bench.host(&install);

    tool("mkfifo", &[target.to_str().expect("UTF-8")]);
    bench.installed_bad_volume(&case("fifo", "not a regular file"));

    fs::create_dir(&target).expect("mkdir");
    bench.installed_bad_volume(&case("directory", "Is a directory"));

    symlink(bench.host(elsewhere), &target).expect("symlink");
    bench.installed_bad_volume(&case("symlink-to-a-valid-file", "symbolic link"));

    symlink("/nonexistent/sparse-volume.toml", &target).expect("symlink");
    bench.installed_bad_volume(&case("dangling-symlink", "symbolic link"));

    for mode in [0o664, 0o666, 0o646] {
        bench.write(&install, valid.as_bytes());
        fs::set_permissions(&target, fs::Permissions::from_mode(mode)).expect("chmod");
        bench.installed_bad_volume(&case(
            &format!("mode-{mode:04o}"),
            &format!("mode {mode:04o}"),
        ));
    }

    bench.write(&install, valid.as_bytes());
    chown(&target, Some(65534), None).expect("chown");
    bench.installed_bad_volume(&case("owned-by-uid-65534", "uid 65534"));

    bench.write(&install, b"");
    bench.installed_bad_volume(&case("zero-bytes", "missing field"));
    bench.finish();
}

/// `sparse-volume list | head -1` with a reader that is gone: the command's
/// work is done, so a write to the closed pipe is neither a panic nor a
/// failure (Rust's `println!` panics there, exit 101). Seen failing before
/// the change: "failed printing to stdout: Broken pipe".
#[test]
fn a_reader_that_left_is_not_a_failure() {
    let fx = Fixture::new();
    let (reader, writer) = nix::unistd::pipe().expect("a pipe");
    drop(reader);
    let output = fx
        .command(&["list", "--json"])
        .stdout(std::process::Stdio::from(writer))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}
