//! The shell completions: clap_complete's scripts for bash, zsh and fish,
//! mended where they fall short, and taught the volumes: where a command
//! takes a VOLUME, they offer the registered UUIDs and names, which
//! `sparse-volume list --names` prints (from the registry alone, without
//! root where the registry is readable).

use std::fs;
use std::path::Path;

use anyhow::{Context, Result};
use clap::CommandFactory;
use clap_complete::Shell;

use crate::BIN;
use sparse_volume::cli::args::Cli;

/// The placeholder clap shows for an argument that names a volume.
const VOLUME: &str = "VOLUME";

/// What the scripts need to know of the command line: the subcommands
/// that take a VOLUME, and every option of theirs that takes a value (the
/// word after it is that value, not a volume).
struct VolumeCommands {
    names: Vec<String>,
    options_with_values: Vec<String>,
}

impl VolumeCommands {
    fn of(cli: &clap::Command) -> Self {
        let mut names = Vec::new();
        let mut options_with_values = Vec::new();
        for command in cli.get_subcommands() {
            let takes_volume = command.get_positionals().any(|arg| {
                arg.get_value_names()
                    .is_some_and(|names| names.iter().any(|n| n.as_str() == VOLUME))
            });
            if !takes_volume {
                continue;
            }
            names.push(command.get_name().to_string());
            for arg in command.get_opts().filter(|a| a.get_action().takes_values()) {
                options_with_values.extend(arg.get_long().map(|long| format!("--{long}")));
                options_with_values.extend(arg.get_short().map(|short| format!("-{short}")));
            }
        }
        options_with_values.sort();
        options_with_values.dedup();
        Self {
            names,
            options_with_values,
        }
    }
}

pub fn write_completions(dir: &Path) -> Result<()> {
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut cmd = Cli::command();
    let volumes = VolumeCommands::of(&cmd);
    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        let path = clap_complete::generate_to(shell, &mut cmd, BIN, dir)
            .with_context(|| format!("writing the {shell} completion to {}", dir.display()))?;
        let text =
            fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        let taught = match shell {
            Shell::Bash => bash_with_volumes(&mend_bash_function_names(&text), &volumes),
            Shell::Zsh => zsh_with_volumes(&text),
            Shell::Fish => fish_with_volumes(&text, &volumes),
            _ => text,
        };
        fs::write(&path, taught).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// clap_complete (4.6) names the bash script's per-subcommand branches
/// after the program with its hyphen turned into `__subcmd__`
/// (`sparse__subcmd__volume__subcmd__create`), while the words typed are
/// matched to names with the hyphen turned into `__`
/// (`sparse__volume__subcmd__create`): the two never meet, and nothing
/// completes after the subcommand. The branches get the matched names.
fn mend_bash_function_names(script: &str) -> String {
    script.replace(&BIN.replace('-', "__subcmd__"), &BIN.replace('-', "__"))
}

/// A function around clap's that offers the volumes in a VOLUME's place
/// (the first word after the subcommand that is neither an option nor an
/// option's value), registered instead of clap's.
fn bash_with_volumes(script: &str, volumes: &VolumeCommands) -> String {
    let generated = format!("_{}", BIN.replace('-', "__"));
    let ours = format!("{generated}__volumes");
    let function = format!(
        r#"
# Where a command takes a VOLUME: the registered UUIDs and names.
{ours}() {{
    {generated} "$@"
    local cur=${{COMP_WORDS[COMP_CWORD]}} prev=${{COMP_WORDS[COMP_CWORD-1]}}
    local i word command="" positionals=0
    for ((i = 1; i < COMP_CWORD; i++)); do
        word=${{COMP_WORDS[i]}}
        case $word in
            {options}) i=$((i + 1)) ;;
            -*) ;;
            *)
                if [[ -z $command ]]; then
                    command=$word
                else
                    positionals=$((positionals + 1))
                fi
                ;;
        esac
    done
    case $command in
        {commands}) ;;
        *) return 0 ;;
    esac
    case $prev in
        {options}) return 0 ;;
    esac
    [[ $cur != -* && $positionals -eq 0 ]] || return 0
    # One volume a line: a name may hold spaces or glob characters.
    local volume
    local -a volumes
    mapfile -t volumes < <({BIN} list --names 2>/dev/null)
    COMPREPLY=()
    for volume in "${{volumes[@]}}"; do
        [[ $volume == "$cur"* ]] && COMPREPLY+=("$(printf '%q' "$volume")")
    done
    return 0
}}
"#,
        options = volumes.options_with_values.join("|"),
        commands = volumes.names.join("|"),
    );
    let registered = script.replace(
        &format!("complete -F {generated} "),
        &format!("complete -F {ours} "),
    );
    // Defined before the `complete` lines that name it.
    match registered.find("\nif [[ \"${BASH_VERSINFO[0]}\"") {
        Some(at) => format!("{}\n{function}{}", &registered[..at], &registered[at..]),
        None => format!("{registered}{function}"),
    }
}

/// A VOLUME argument's action becomes a function that offers the volumes.
fn zsh_with_volumes(script: &str) -> String {
    let function = format!(
        r#"(( $+functions[_{BIN}_volumes] )) ||
_{BIN}_volumes() {{
    local -a volumes
    volumes=(${{(f)"$(_call_program volumes {BIN} list --names 2>/dev/null)"}})
    _describe -t volumes 'volume' volumes
}}

"#
    );
    let lines: Vec<String> = script
        .lines()
        .map(|line| {
            if line.contains(":volume -- ") && line.ends_with(":_default' \\") {
                let cut = line.len() - "_default' \\".len();
                format!("{}_{BIN}_volumes' \\", &line[..cut])
            } else {
                line.to_string()
            }
        })
        .collect();
    let text = lines.join("\n") + "\n";
    match text.find("\nif [ \"$funcstack[1]\"") {
        Some(at) => format!("{}\n{function}{}", &text[..at], &text[at + 1..]),
        None => format!("{text}{function}"),
    }
}

/// After a subcommand that takes a VOLUME, in its place (the first word
/// after the subcommand that is neither an option nor an option's value),
/// the volumes.
fn fish_with_volumes(script: &str, volumes: &VolumeCommands) -> String {
    let function = format!("__fish_{}_wants_volume", BIN.replace('-', "_"));
    format!(
        r#"{script}
function {function}
    set -l words
    set -l skip_value 0
    for token in (commandline -opc)[2..]
        if test $skip_value = 1
            set skip_value 0
            continue
        end
        switch $token
            case {options}
                set skip_value 1
            case '-*'
            case '*'
                set -a words $token
        end
    end
    test (count $words) -eq 1; and contains -- $words[1] {commands}
end
complete -c {BIN} -n {function} -f -a "({BIN} list --names 2>/dev/null)" -d 'registered volume'
"#,
        options = volumes.options_with_values.join(" "),
        commands = volumes.names.join(" "),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::os::unix::fs::PermissionsExt;
    use std::path::PathBuf;
    use std::process::Command;

    /// The scripts, and a stand-in `sparse-volume` on PATH whose
    /// `list --names` prints two volumes (the installed binary's answer is
    /// checked by packaging/check-packages.sh against a real registry).
    struct Scripts {
        dir: tempfile::TempDir,
    }

    impl Scripts {
        fn new() -> Self {
            let dir = tempfile::tempdir().unwrap();
            write_completions(&dir.path().join("completions")).unwrap();
            let bin = dir.path().join("bin");
            fs::create_dir(&bin).unwrap();
            let stand_in = bin.join(BIN);
            fs::write(
                &stand_in,
                "#!/bin/sh\n[ \"$1 $2\" = 'list --names' ] && printf '%s\\n' 6f1c2a8e-3b4d-4e5f-8a9b-0c1d2e3f4a5b pg-data 'db *main*'\n",
            )
            .unwrap();
            fs::set_permissions(&stand_in, fs::Permissions::from_mode(0o755)).unwrap();
            Self { dir }
        }

        fn script(&self, name: &str) -> PathBuf {
            self.dir.path().join("completions").join(name)
        }

        fn path(&self) -> String {
            format!(
                "{}:{}",
                self.dir.path().join("bin").display(),
                std::env::var("PATH").unwrap_or_default()
            )
        }

        /// What bash offers for the words typed so far (the last one being
        /// completed), through the function the script registers with
        /// `complete`, as bash-completion runs it.
        fn bash(&self, words: &[&str]) -> Vec<String> {
            let line = words.join(" ");
            let quoted: Vec<_> = words.iter().map(|word| format!("'{word}'")).collect();
            let program = format!(
                "source {script:?}; function=$(complete -p {BIN} | sed -n 's/.*-F \\([^ ]*\\) .*/\\1/p'); \
                 COMP_WORDS=({quoted}); COMP_CWORD={cword}; \
                 COMP_LINE='{line}'; COMP_POINT=${{#COMP_LINE}}; \
                 \"$function\" {BIN} '{cur}' '{prev}'; printf '%s\\n' \"${{COMPREPLY[@]}}\"",
                script = self.script(&format!("{BIN}.bash")),
                quoted = quoted.join(" "),
                cword = words.len() - 1,
                cur = words[words.len() - 1],
                prev = words[words.len() - 2],
            );
            let output = Command::new("bash")
                .args(["-c", &program])
                .env("PATH", self.path())
                .output()
                .expect("bash runs");
            assert!(output.status.success(), "{output:?}");
            let mut offered: Vec<String> = String::from_utf8_lossy(&output.stdout)
                .lines()
                .filter(|l| !l.is_empty())
                .map(str::to_owned)
                .collect();
            offered.sort();
            offered
        }
    }

    fn sorted(words: &[&str]) -> Vec<String> {
        let mut words: Vec<String> = words.iter().map(|w| w.to_string()).collect();
        words.sort();
        words
    }

    /// Completion goes on after the subcommand (issue 25, item 1: the
    /// generated functions and the names they were matched by never met,
    /// because of the hyphen in the program's name).
    #[test]
    fn bash_completes_the_options_and_values_of_subcommands() {
        let scripts = Scripts::new();
        for (words, expected) in [
            (&["sparse-volume", "cr"][..], &["create"][..]),
            (
                &["sparse-volume", "create", "--s"],
                &["--size", "--sector-size"],
            ),
            (&["sparse-volume", "create", "--fs", ""], &["ext4", "xfs"]),
            (
                &["sparse-volume", "create", "--mode", ""],
                &["filesystem", "block"],
            ),
            (
                &["sparse-volume", "create", "--sector-size", ""],
                &["512", "4096"],
            ),
            (
                &["sparse-volume", "remove", "--d"],
                &["--dry-run", "--delete-data"],
            ),
            (&["sparse-volume", "list", "--w"], &["--wide"]),
        ] {
            assert_eq!(
                scripts.bash(words),
                sorted(expected),
                "completing {words:?}"
            );
        }
    }

    #[test]
    fn bash_offers_the_volumes_where_a_command_takes_one() {
        let scripts = Scripts::new();
        let both = [
            "6f1c2a8e-3b4d-4e5f-8a9b-0c1d2e3f4a5b",
            "db\\ \\*main\\*",
            "pg-data",
        ];
        for words in [
            &["sparse-volume", "status", ""][..],
            &["sparse-volume", "--json", "remove", "--delete-data", ""],
            &["sparse-volume", "resize", "--size", "2G", ""],
            &["sparse-volume", "pv", "--storage-class", "local", ""],
            &["sparse-volume", "attach", "-v", ""],
        ] {
            assert_eq!(scripts.bash(words), sorted(&both), "completing {words:?}");
        }
        assert_eq!(
            scripts.bash(&["sparse-volume", "detach", "pg"]),
            sorted(&["pg-data"])
        );
        assert_eq!(
            scripts.bash(&["sparse-volume", "enable", "6f"]),
            sorted(&["6f1c2a8e-3b4d-4e5f-8a9b-0c1d2e3f4a5b"])
        );
        // Not a volume's place: an option's value, a second word, a
        // command that takes none.
        // Nor files where a size, a name or a node is typed.
        for words in [
            &["sparse-volume", "resize", "--size", ""][..],
            &["sparse-volume", "create", "--name", ""],
            &["sparse-volume", "pv", "--node", ""],
        ] {
            let offered = scripts.bash(words);
            assert!(
                offered.iter().all(|w| w.is_empty()),
                "completing {words:?}: {offered:?}"
            );
        }
        assert!(scripts
            .bash(&["sparse-volume", "status", "pg-data", ""])
            .iter()
            .all(|w| w.starts_with('-')));
        assert!(!scripts
            .bash(&["sparse-volume", "list", ""])
            .contains(&"pg-data".to_string()));
    }

    #[test]
    fn the_volume_commands_are_read_from_the_command_line() {
        let volumes = VolumeCommands::of(&Cli::command());
        let mut names = volumes.names.clone();
        names.sort();
        assert_eq!(
            names,
            [
                "attach", "clone", "detach", "disable", "enable", "export", "pv", "remove",
                "resize", "start", "status", "stop"
            ]
        );
        for option in [
            "--size",
            "--storage-class",
            "--node",
            "--reclaim",
            "--output",
        ] {
            assert!(
                volumes.options_with_values.contains(&option.to_string()),
                "{option} not known to take a value: {:?}",
                volumes.options_with_values
            );
        }
        assert!(!volumes.options_with_values.contains(&"--json".to_string()));
    }

    #[test]
    fn zsh_and_fish_call_for_the_volumes_where_a_command_takes_one() {
        let scripts = Scripts::new();
        let zsh = fs::read_to_string(scripts.script(&format!("_{BIN}"))).unwrap();
        let volume_args = zsh.lines().filter(|l| l.contains(":volume -- ")).count();
        assert_eq!(volume_args, 12, "{zsh}");
        assert_eq!(
            zsh.lines()
                .filter(
                    |l| l.contains(":volume -- ") && l.ends_with(&format!(":_{BIN}_volumes' \\"))
                )
                .count(),
            volume_args
        );
        assert!(zsh.contains(&format!("_{BIN}_volumes() {{")));
        assert!(
            zsh.trim_end().ends_with("fi"),
            "the script's last block stays last"
        );
        let fish = fs::read_to_string(scripts.script(&format!("{BIN}.fish"))).unwrap();
        assert!(fish.ends_with(
            "-f -a \"(sparse-volume list --names 2>/dev/null)\" -d 'registered volume'\n"
        ));
    }

    /// What fish offers for a command line (its `complete -C`); empty
    /// when fish is not installed here (packaging/check-packages.sh, which
    /// installs it, runs the installed script as well).
    fn fish(scripts: &Scripts, line: &str) -> Option<Vec<String>> {
        let output = Command::new("fish")
            .arg("-c")
            .arg(format!(
                "source {:?}; complete -C '{line}'",
                scripts.script(&format!("{BIN}.fish"))
            ))
            .env("PATH", scripts.path())
            .output()
            .ok()?;
        assert!(output.status.success(), "{output:?}");
        let mut offered: Vec<String> = String::from_utf8_lossy(&output.stdout)
            .lines()
            .map(|l| l.split('\t').next().unwrap_or("").to_string())
            .collect();
        offered.sort();
        Some(offered)
    }

    #[test]
    fn fish_offers_the_volumes_in_a_volumes_place_only() {
        let scripts = Scripts::new();
        let Some(offered) = fish(&scripts, "sparse-volume status ") else {
            eprintln!("skipped: fish is not installed");
            return;
        };
        let both = sorted(&[
            "6f1c2a8e-3b4d-4e5f-8a9b-0c1d2e3f4a5b",
            "db *main*",
            "pg-data",
        ]);
        assert_eq!(offered, both);
        assert_eq!(
            fish(&scripts, "sparse-volume resize --size 2G ").unwrap(),
            both
        );
        // A second word, an option's value, a command without a volume.
        for line in [
            "sparse-volume status pg-data ",
            "sparse-volume resize --size ",
            "sparse-volume list ",
        ] {
            let offered = fish(&scripts, line).unwrap();
            assert!(
                !offered.contains(&"pg-data".to_string()),
                "{line:?} offered {offered:?}"
            );
        }
    }
}
