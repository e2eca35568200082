//! Usage errors (exit status 2) said like every other failure: one line
//! on stderr naming the help to read, and with `--json` the error object,
//! instead of clap's several lines of usage.

use std::process::ExitCode;

use clap::error::ErrorKind;
use clap::CommandFactory;

use crate::cli::args::Cli;
use crate::cli::output::Output;

/// Prints `error` and returns the exit status; help and version requests
/// (and a missing subcommand, whose help is the answer) keep clap's own
/// rendering.
pub fn usage_error(error: clap::Error, args: &[String]) -> ExitCode {
    let json = args.iter().any(|arg| arg == "--json");
    if matches!(
        error.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    ) {
        error.exit();
    }
    let rendered = error.render().to_string();
    let mut blocks = rendered.split("\n\n").map(str::trim);
    let mut message = one_line(blocks.next().unwrap_or_default());
    if let Some(tip) = blocks.find_map(|block| block.strip_prefix("tip: ")) {
        message.push_str(&format!(" ({tip})"));
    }
    message.push_str(&format!("; `{} --help` shows the usage", command_of(args)));
    let out = Output {
        json,
        dry_run: args.iter().any(|arg| arg == "--dry-run"),
        uuid: None,
        doing: String::new(),
        // A usage error of `export` to standard output must not write its
        // object into a pipe that expects the stream.
        stream_on_stdout: args.get(1).is_some_and(|a| a == "export")
            && !args
                .iter()
                .any(|a| a == "--output" || a.starts_with("--output=")),
    };
    out.fail(&message, ExitCode::from(2))
}

/// clap's first paragraph on one line: "the following required arguments
/// were not provided:" with the list below it joined, and a newline typed
/// inside a value shown as `\n`.
fn one_line(paragraph: &str) -> String {
    let paragraph = paragraph.trim_start_matches("error: ");
    let mut lines = paragraph.lines();
    let first = lines.next().unwrap_or("the command line does not parse");
    if first.ends_with(':') {
        let listed: Vec<&str> = lines.map(str::trim).collect();
        format!("{first} {}", listed.join(", "))
    } else {
        paragraph.replace('\n', "\\n")
    }
}

/// `sparse-volume create`: the program and the first of `args` that is
/// one of its subcommands (clap's own usage line is missing from errors
/// about a value).
fn command_of(args: &[String]) -> String {
    let cli = Cli::command();
    let subcommand = args.iter().find(|arg| {
        cli.get_subcommands()
            .any(|sub| sub.get_name() == arg.as_str())
    });
    match subcommand {
        Some(name) => format!("sparse-volume {name}"),
        None => "sparse-volume".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_is_the_first_subcommand_named() {
        let args = |words: &[&str]| words.iter().map(|w| w.to_string()).collect::<Vec<_>>();
        assert_eq!(
            command_of(&args(&["--json", "create", "--size", "x"])),
            "sparse-volume create"
        );
        assert_eq!(command_of(&args(&["--frob"])), "sparse-volume");
    }
}
