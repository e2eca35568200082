//! sparse-volume-docgen: writes the man pages and shell completions of
//! `sparse-volume` from its clap definitions (`sparse_volume::cli::args`),
//! so that `--help`, `man` and tab completion cannot disagree, and the
//! man pages of the references in `docs/reference/` from their Markdown,
//! so that the web page and `man` cannot either.
//!
//! Used by `packaging/build-packages.sh`; never installed.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::CommandFactory;
use clap_mangen::Man;

mod command_docs;
mod completions;
mod markdown_man;
use sparse_volume::cli::args::Cli;

const BIN: &str = "sparse-volume";
/// An administration tool: it needs root and changes the system.
const SECTION: &str = "8";

const USAGE: &str = "\
usage: sparse-volume-docgen [--date YYYY-MM-DD] OUT_DIR

Writes OUT_DIR/man/sparse-volume.8 (with the JSON contract of
docs/reference/json.md), one page per subcommand (sparse-volume-create.8,
...) and sparse-volume.toml.5 (docs/reference/registry.md), and
OUT_DIR/completions/ with sparse-volume.bash, _sparse-volume (zsh) and
sparse-volume.fish.
--date is the date the man pages show (the build script passes the
release's date, so rebuilding gives the same bytes).
";

/// The one description of the JSON output: a section of sparse-volume(8).
const JSON_REFERENCE: &str = include_str!("../../../docs/reference/json.md");
/// The one description of the registry: sparse-volume.toml(5).
const REGISTRY_REFERENCE: &str = include_str!("../../../docs/reference/registry.md");

/// Sections that clap knows nothing about, appended to sparse-volume(8).
const MAIN_PAGE_TAIL: &str = r#".SH "EXIT STATUS"
.TP
0
Success, including a command that found nothing to change.
.TP
1
Failure; one sentence naming the volume and the cause is printed on
standard error (or in the JSON object with \fB\-\-json\fR).
.TP
2
Usage error.
.SH "KERNEL COMMAND LINE"
An emergency switch for a volume that breaks the boot (see
\fBsparse-volume-generator\fR(8)):
.TP
\fBsparse_volume.skip=\fR\fIUUID\fR[\fB,\fR\fIUUID\fR...]
These volumes get no unit at boot, and \fBattach\fR refuses them (exit
status 1, naming the switch).
.TP
\fBsparse_volume=off\fR
The same for every volume.
.PP
\fBdetach\fR, \fBstatus\fR, \fBcheck\fR and \fBremove\fR work as usual.
To recover: boot with \fBsparse_volume.skip=\fR\fIUUID\fR (or
\fBsparse_volume=off\fR), fix the cause, run \fBsparse-volume check
\-\-repair\fR, and reboot without the switch.
.SH ENVIRONMENT
.TP
\fBSPARSE_VOLUME_ROOT\fR=\fIdir\fR
Makes every path below (registry, storage roots, run-time locks,
\fI/proc/cmdline\fR, udev's \fI/run/udev/control\fR) relative to
\fIdir\fR, for tests and image builds.
.SH FILES
.TP
\fI/etc/sparse-volume/config.toml\fR
Global settings; optional.
.TP
\fI/etc/sparse-volume/volumes.d/\fRUUID\fI.toml\fR
One registry file per volume.
.TP
\fI/var/lib/sparse-volume/\fR
Default storage root for backing files.
.TP
\fI/usr/lib/systemd/system/sparse-volume@.service\fR
The unit that attaches and detaches one volume: it runs
\fBsparse-volume-generator \-\-attach\fR and \fB\-\-detach\fR, the same
code as \fBattach\fR and \fBdetach\fR in a smaller program.
.TP
\fI/usr/lib/systemd/system/sparse-volumes.target\fR
Reached once every enabled volume is attached.
.SH "SEE ALSO"
\fBsparse-volume.toml\fR(5), \fBsparse-volume-generator\fR(8),
\fBlosetup\fR(8), \fBsystemd.generator\fR(7), \fBkernel-command-line\fR(7)
"#;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (date, out) = match args.as_slice() {
        [flag] if flag == "-h" || flag == "--help" => {
            print!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        [out] => ("", out),
        [flag, date, out] if flag == "--date" => (date.as_str(), out),
        _ => ("", &String::new()),
    };
    match out {
        out if !out.is_empty() && !out.starts_with('-') => match write_all(Path::new(out), date) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("sparse-volume-docgen: {e:#}");
                ExitCode::FAILURE
            }
        },
        _ => {
            eprint!("sparse-volume-docgen: expected [--date DATE] OUT_DIR\n{USAGE}");
            ExitCode::from(2)
        }
    }
}

fn write_all(out: &Path, date: &str) -> Result<()> {
    write_man_pages(&out.join("man"), date)?;
    completions::write_completions(&out.join("completions"))?;
    Ok(())
}

/// The main page plus one page per visible subcommand, all in section 8
/// (clap_mangen's own `generate_to` writes section 1 only).
fn write_man_pages(dir: &Path, date: &str) -> Result<Vec<PathBuf>> {
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    // Building resolves the subcommands' display names (sparse-volume-create).
    let mut cmd = Cli::command().disable_help_subcommand(true);
    cmd.build();

    // Subcommands carry no version: name the package on every page.
    let source = format!("{BIN} {}", cmd.get_version().unwrap_or_default());
    let page = |cmd: &clap::Command, tail: &str| write_page(dir, cmd.clone(), date, &source, tail);

    let json = markdown_man::section(JSON_REFERENCE, "JSON OUTPUT")
        .context("rendering docs/reference/json.md")?;
    let mut written = vec![page(&cmd, &(json + MAIN_PAGE_TAIL))?];
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        let doc = command_docs::command_doc(sub.get_name()).with_context(|| {
            format!(
                "`{}` has no entry in packaging/docgen/src/command_docs.rs (exit status, examples, SEE ALSO)",
                sub.get_name()
            )
        })?;
        written.push(page(sub, &command_docs::page_tail(doc))?);
    }
    written.push(write_registry_page(dir, date, &source)?);
    Ok(written)
}

/// sparse-volume.toml(5) from docs/reference/registry.md.
fn write_registry_page(dir: &Path, date: &str, source: &str) -> Result<PathBuf> {
    let text = markdown_man::page(
        REGISTRY_REFERENCE,
        &markdown_man::Header {
            title: "SPARSE-VOLUME.TOML",
            section: "5",
            date: shown_date(date),
            source,
            manual: "File Formats",
        },
    )
    .context("rendering docs/reference/registry.md")?;
    let path = dir.join("sparse-volume.toml.5");
    fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

/// An empty date would be written as an empty word, which roff drops,
/// shifting the source into the date's place: say so instead.
fn shown_date(date: &str) -> &str {
    if date.is_empty() {
        "unknown date"
    } else {
        date
    }
}

fn write_page(
    dir: &Path,
    cmd: clap::Command,
    date: &str,
    source: &str,
    tail: &str,
) -> Result<PathBuf> {
    let name = cmd.get_display_name().unwrap_or(cmd.get_name()).to_owned();
    let date = shown_date(date);
    let man = Man::new(cmd)
        .title(name.to_uppercase())
        .section(SECTION)
        .date(date)
        .source(source)
        .manual("System Administration");
    let mut page = Vec::new();
    man.render(&mut page)
        .with_context(|| format!("rendering {name}({SECTION})"))?;
    page.extend_from_slice(tail.as_bytes());
    let path = dir.join(man.get_filename());
    fs::write(&path, page).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    use sparse_volume::registry::Config;

    /// The registry's reference names every key the parser knows, each as
    /// a key of its own (a `####` heading, a tagged paragraph in the man
    /// page): a key added to the parser and not to the page fails here.
    #[test]
    fn the_registry_reference_describes_every_key() {
        let (volume_part, config_part) = REGISTRY_REFERENCE
            .split_once("\n## config.toml\n")
            .expect("a config.toml section");
        for (keys, part) in [
            (sparse_volume::registry::VOLUME_KEYS, volume_part),
            (sparse_volume::registry::CONFIG_KEYS, config_part),
        ] {
            for key in keys {
                assert!(
                    part.contains(&format!("\n#### `{key}` (")),
                    "docs/reference/registry.md does not describe `{key}`"
                );
            }
        }
    }

    /// The commented example shipped as /etc/sparse-volume/config.toml.
    const EXAMPLE_CONFIG: &str = include_str!("../../config.toml");
    const CONFIG_KEYS: [&str; 5] = [
        "storage_roots",
        "overcommit_ratio",
        "reserve",
        "udev_timeout_sec",
        "direct_io",
    ];

    fn parse(text: &str) -> Config {
        Config::parse(Path::new("config.toml"), text)
            .unwrap_or_else(|e| panic!("{e}\n--- text:\n{text}"))
    }

    #[test]
    fn example_config_yields_the_defaults() {
        assert_eq!(parse(EXAMPLE_CONFIG), Config::default());
    }

    /// Every key is listed as `# key = <default>`: uncommenting all of
    /// them must still give the defaults, so the example cannot lie.
    #[test]
    fn example_config_lists_every_key_with_its_default() {
        let uncommented: String = EXAMPLE_CONFIG
            .lines()
            .map(|line| match line.strip_prefix("# ") {
                Some(rest)
                    if CONFIG_KEYS
                        .iter()
                        .any(|k| rest.starts_with(&format!("{k} ="))) =>
                {
                    rest
                }
                _ => line,
            })
            .map(|line| format!("{line}\n"))
            .collect();
        for key in CONFIG_KEYS {
            let assignment = format!("\n{key} = ");
            assert_eq!(
                uncommented.matches(&assignment).count(),
                1,
                "{key} is not listed exactly once as \"# {key} = <default>\""
            );
        }
        assert_eq!(parse(&uncommented), Config::default());
    }

    #[test]
    fn writes_a_page_per_subcommand_and_three_completions() {
        let out = tempfile::tempdir().unwrap();
        write_all(out.path(), "2026-01-02").unwrap();

        let main = fs::read_to_string(out.path().join("man/sparse-volume.8")).unwrap();
        assert!(
            main.contains("\n.TH SPARSE-VOLUME 8 2026-01-02 \"sparse-volume "),
            "{main}"
        );
        for sub in Cli::command()
            .get_subcommands()
            .filter(|s| !s.is_hide_set())
        {
            let page = out
                .path()
                .join(format!("man/sparse-volume-{}.8", sub.get_name()));
            assert!(page.is_file(), "{} missing", page.display());
            assert!(main.contains(&format!("sparse\\-volume\\-{}(8)", sub.get_name())));
        }
        assert!(main.contains(".SH \"JSON OUTPUT\""), "{main}");
        let registry = fs::read_to_string(out.path().join("man/sparse-volume.toml.5")).unwrap();
        assert!(
            registry.contains("\n.TH SPARSE-VOLUME.TOML 5 2026-01-02 "),
            "{registry}"
        );
        for file in ["sparse-volume.bash", "_sparse-volume", "sparse-volume.fish"] {
            let text = fs::read_to_string(out.path().join("completions").join(file)).unwrap();
            assert!(text.contains("resize"), "{file} lacks subcommands");
        }
    }

    /// Every command's page has what clap knows nothing about: what its
    /// exit status means, examples and related pages (issue 25, item 17).
    #[test]
    fn every_command_page_has_exit_status_examples_and_see_also() {
        let out = tempfile::tempdir().unwrap();
        write_man_pages(out.path(), "2026-01-02").unwrap();
        for sub in Cli::command()
            .get_subcommands()
            .filter(|s| !s.is_hide_set())
        {
            let name = sub.get_name();
            let page =
                fs::read_to_string(out.path().join(format!("sparse-volume-{name}.8"))).unwrap();
            for heading in [
                ".SH \"EXIT STATUS\"\n",
                ".SH EXAMPLES\n",
                ".SH \"SEE ALSO\"\n",
            ] {
                assert_eq!(
                    page.matches(heading).count(),
                    1,
                    "sparse-volume-{name}(8) has not one {heading:?}:\n{page}"
                );
            }
        }
    }
}
