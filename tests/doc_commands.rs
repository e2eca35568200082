//! Every command the README and the guides show runs in a test (issue 25,
//! item 6 and the acceptance), so that a page that drifts fails CI. Each
//! fenced block says what it holds (an info string: `sh`, `text`, `yaml`,
//! …), and each shell block says, on the line before it, where it runs:
//!
//! * `<!-- doc-test: vm -->`: the VM scenario runs it as written
//!   (tests/vm/guest.sh takes it with `doc_block PAGE N`), on Debian 12 and
//!   13 with systemd and udev;
//! * `<!-- doc-test: ci -->`: the scripts CI runs run these commands
//!   (their program and first argument, as the page writes them);
//! * `<!-- doc-test: host -->`: this test runs it, as root, against a
//!   fixture registry, with `sparse-volume` on `PATH`.
//!
//! And every `apt-get install` names packages that Debian's archive has.

mod common;

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::Fixture;

const SHELL: [&str; 4] = ["sh", "bash", "shell", "console"];
/// Where `doc-test: ci` commands must appear.
const CI_SCRIPTS: [&str; 7] = [
    ".ci/run",
    "tests/run",
    "tests/ansible/run.sh",
    "tests/salt/run.sh",
    "tests/vm/scenario.sh",
    "tests/vm/config-management.sh",
    "packaging/build-packages.sh",
];

/// The Ansible collection's tarball, as `ansible-galaxy collection build`
/// names it.
const COLLECTION: &str = "sparse_volume-sparse_volume-";

fn collection_version() -> String {
    let galaxy =
        fs::read_to_string(top().join("packaging/ansible/sparse_volume/galaxy.yml")).unwrap();
    galaxy
        .lines()
        .find_map(|l| l.strip_prefix("version:"))
        .expect("galaxy.yml has a version")
        .trim()
        .to_string()
}

fn top() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A fenced block of a page.
#[derive(Debug)]
struct Block {
    page: String,
    /// 1-based line of the opening fence.
    line: usize,
    info: String,
    /// The `doc-test:` marker on the line before, if any.
    marker: Option<String>,
    /// Its place among the page's unindented ```sh blocks, as guest.sh's
    /// `doc_block` counts them.
    sh_index: Option<usize>,
    body: String,
}

impl Block {
    fn is_shell(&self) -> bool {
        SHELL.contains(&self.info.as_str())
    }

    fn at(&self) -> String {
        format!("{}:{}", self.page, self.line)
    }

    /// Its command lines: comments and blank lines left out, a trailing
    /// comment cut, a line continued with `\` or a trailing `|` joined.
    fn commands(&self) -> Vec<String> {
        let mut commands = Vec::new();
        let mut pending = String::new();
        for raw in self.body.lines() {
            let line = raw.split(" #").next().unwrap_or("").trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            pending.push_str(line.trim_end_matches('\\'));
            pending.push(' ');
            if !(line.ends_with('\\') || line.ends_with('|')) {
                commands.push(pending.trim().to_string());
                pending.clear();
            }
        }
        commands
    }
}

/// The pages whose commands must run: the README and the guides.
fn pages() -> Vec<PathBuf> {
    let mut pages = vec![top().join("README.md")];
    let guide = top().join("docs/guide");
    let mut guides: Vec<PathBuf> = fs::read_dir(&guide)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    guides.sort();
    pages.extend(guides);
    pages
}

fn blocks_of(path: &Path) -> Vec<Block> {
    let text = fs::read_to_string(path).unwrap();
    let page = path.strip_prefix(top()).unwrap().display().to_string();
    let lines: Vec<&str> = text.lines().collect();
    let mut blocks = Vec::new();
    let mut sh_count = 0;
    let mut i = 0;
    while i < lines.len() {
        let trimmed = lines[i].trim_start();
        let Some(info) = trimmed.strip_prefix("```") else {
            i += 1;
            continue;
        };
        let indent = lines[i].len() - trimmed.len();
        let sh_index = (lines[i] == "```sh").then(|| {
            sh_count += 1;
            sh_count
        });
        let marker = lines[..i]
            .iter()
            .rev()
            .find(|l| !l.trim().is_empty())
            .and_then(|l| l.trim().strip_prefix("<!-- doc-test:"))
            .and_then(|l| l.strip_suffix("-->"))
            .map(|m| m.trim().to_string());
        let close = (i + 1..lines.len())
            .find(|&j| lines[j].trim() == "```")
            .unwrap_or_else(|| panic!("{page}:{}: a fence that never closes", i + 1));
        let body = lines[i + 1..close]
            .iter()
            .map(|l| l.get(indent..).unwrap_or(l.trim_start()))
            .collect::<Vec<_>>()
            .join("\n");
        blocks.push(Block {
            page: page.clone(),
            line: i + 1,
            info: info.trim().to_string(),
            marker,
            sh_index,
            body,
        });
        i = close + 1;
    }
    blocks
}

fn all_blocks() -> Vec<Block> {
    pages().iter().flat_map(|p| blocks_of(p)).collect()
}

#[test]
fn every_block_says_what_it_holds_and_every_shell_block_where_it_runs() {
    let blocks = all_blocks();
    // Guards the parser: the README's first volume is among them.
    assert!(
        blocks
            .iter()
            .any(|b| b.is_shell() && b.body.contains("sparse-volume create")),
        "{blocks:#?}"
    );
    let mut wrong = Vec::new();
    for block in &blocks {
        if block.info.is_empty() {
            wrong.push(format!(
                "{}: a block without an info string (sh, text, yaml, …)",
                block.at()
            ));
        } else if block.is_shell() {
            match block.marker.as_deref() {
                Some("vm" | "ci" | "host") => {}
                other => wrong.push(format!(
                    "{}: a shell block must say where it runs (<!-- doc-test: vm|ci|host -->), found {other:?}",
                    block.at()
                )),
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn vm_blocks_are_run_by_the_guest_as_written() {
    let guest = fs::read_to_string(top().join("tests/vm/guest.sh")).unwrap();
    let scenario = fs::read_to_string(top().join("tests/vm/scenario.sh")).unwrap();
    let mut wrong = Vec::new();
    let mut checked = 0;
    for block in all_blocks()
        .iter()
        .filter(|b| b.marker.as_deref() == Some("vm"))
    {
        let Some(index) = block.sh_index else {
            wrong.push(format!(
                "{}: the guest finds only unindented ```sh blocks",
                block.at()
            ));
            continue;
        };
        let file = Path::new(&block.page)
            .file_name()
            .unwrap()
            .to_string_lossy();
        if !guest.contains(&format!("doc_block {file} {index}")) {
            wrong.push(format!(
                "{}: tests/vm/guest.sh runs no `doc_block {file} {index}`",
                block.at()
            ));
        }
        if !scenario.contains(&block.page) {
            wrong.push(format!(
                "{}: tests/vm/scenario.sh does not copy {} into the guest",
                block.at(),
                block.page
            ));
        }
        checked += 1;
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    assert!(checked >= 4, "only {checked} blocks run in the VM");
}

#[test]
fn ci_blocks_are_commands_the_ci_scripts_run() {
    let scripts: String = CI_SCRIPTS
        .iter()
        .map(|s| fs::read_to_string(top().join(s)).unwrap_or_default())
        .collect();
    let mut wrong = Vec::new();
    for block in all_blocks()
        .iter()
        .filter(|b| b.marker.as_deref() == Some("ci"))
    {
        for command in block.commands() {
            let words: Vec<&str> = command.split_whitespace().collect();
            if let Some(tarball) = words.iter().find(|w| w.starts_with(COLLECTION)) {
                let expected = format!("{COLLECTION}{}.tar.gz", collection_version());
                if *tarball != expected {
                    wrong.push(format!(
                        "{}: {tarball}, but the build makes {expected}",
                        block.at()
                    ));
                }
            }
            // A script of ours by its path; a tool by itself and its
            // first argument.
            let needle = if words[0].contains('/') {
                words[0].to_string()
            } else {
                words.iter().take(2).copied().collect::<Vec<_>>().join(" ")
            };
            if !scripts.contains(&needle) {
                wrong.push(format!(
                    "{}: no CI script runs `{needle}` ({command})",
                    block.at()
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn host_blocks_run_as_written() {
    needs_root!();
    let mut ran = 0;
    for block in all_blocks()
        .iter()
        .filter(|b| b.marker.as_deref() == Some("host"))
    {
        let fx = Fixture::new();
        let bin = fx.host("/doc-bin");
        fs::create_dir_all(&bin).unwrap();
        symlink(
            env!("CARGO_BIN_EXE_sparse-volume"),
            bin.join("sparse-volume"),
        )
        .unwrap();
        let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap());
        let output = Command::new("bash")
            .args(["-euo", "pipefail", "-c", &block.body])
            .env("PATH", path)
            .env("SPARSE_VOLUME_ROOT", fx.root.path())
            .env("DBUS_SYSTEM_BUS_ADDRESS", fx.absent_bus())
            .env_remove("JOURNAL_STREAM")
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{}: failed as written ({}):\n{}\n{}",
            block.at(),
            output.status,
            block.body,
            String::from_utf8_lossy(&output.stderr)
        );
        // Whatever it attached (without systemd, directly) is let go.
        for file in fs::read_dir(fx.host("/var/lib/sparse-volume"))
            .unwrap()
            .flatten()
        {
            for device in common::loops_of(&file.path()) {
                let _ = Command::new("losetup").args(["-d", &device]).status();
            }
        }
        ran += 1;
    }
    assert!(ran >= 1, "no block runs on the host");
}

#[test]
fn apt_get_installs_name_packages_debian_has() {
    let mut wrong = Vec::new();
    let mut named = 0;
    for block in all_blocks().iter().filter(|b| b.is_shell()) {
        for command in block.commands() {
            let Some(rest) = command.strip_prefix("apt-get install ") else {
                continue;
            };
            for package in rest.split_whitespace().filter(|w| !w.starts_with('-')) {
                named += 1;
                let shown = Command::new("apt-cache")
                    .args(["show", "--no-all-versions", package])
                    .output()
                    .expect("apt-cache (Debian's)");
                if !shown.status.success() || shown.stdout.is_empty() {
                    wrong.push(format!("{}: Debian has no package {package}", block.at()));
                }
            }
        }
    }
    assert!(named >= 1, "no apt-get install found: the parser missed it");
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
