use std::process::ExitCode;

use clap::Parser;
use serde::Serialize;

use sparse_volume::cli::{Cli, Command};
use sparse_volume::logging;
use sparse_volume::ops::{attach, detach};
use sparse_volume::paths::SystemRoot;

fn main() -> ExitCode {
    // clap exits with status 2 on usage errors, as the contract asks.
    let cli = Cli::parse();
    logging::init(cli.verbose);
    let root = SystemRoot::from_env();

    let outcome = match &cli.command {
        Command::Attach { uuid } => attach::attach(&root, uuid)
            .map(|r| print(&r, cli.json, r.human(), &r.warnings))
            .map_err(|e| e.context(format!("attaching {uuid}"))),
        Command::Detach { uuid } => detach::detach(&root, uuid)
            .map(|r| print(&r, cli.json, r.human(), &[]))
            .map_err(|e| e.context(format!("detaching {uuid}"))),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            // One line: "attaching U: backing file … is a symbolic link".
            let message = format!("{error:#}");
            eprintln!("sparse-volume: {message}");
            if cli.json {
                println!(
                    "{}",
                    serde_json::json!({ "changed": false, "uuid": cli.command.uuid().to_string(), "error": message })
                );
            }
            ExitCode::FAILURE
        }
    }
}

fn print<T: Serialize>(report: &T, json: bool, human: String, warnings: &[String]) {
    for warning in warnings {
        eprintln!("sparse-volume: warning: {warning}");
    }
    if json {
        match serde_json::to_string(report) {
            Ok(text) => println!("{text}"),
            Err(e) => tracing::error!("cannot render the report as JSON: {e}"),
        }
    } else {
        println!("{human}");
    }
}
