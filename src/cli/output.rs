//! What the user sees: a command's report for people or as one JSON
//! object on stdout, warnings and errors on stderr, and the exit status
//! (0 success, 1 failure, 2 usage error).

use std::process::ExitCode;

use serde::Serialize;

use crate::cli::logging::clear_progress;
use crate::commands::report::{Failure, Outcome, Report};

/// A report with `dry_run` added after its own fields.
#[derive(Serialize)]
struct DryRunTagged<'a, R> {
    #[serde(flatten)]
    report: &'a R,
    dry_run: bool,
}

/// Prints a command's outcome for people or as one JSON object, and turns
/// it into the exit status.
pub struct Output {
    pub json: bool,
    /// Said in every report, so a dry run's output is never mistaken for a
    /// change made.
    pub dry_run: bool,
    /// The volume the command is about, for the JSON of a failure.
    pub uuid: Option<String>,
    /// What the command does, the first words of a failure's line:
    /// "attaching U: …".
    pub doing: String,
    /// Standard output carries a stream (`export` to `-`): every report
    /// and failure goes to standard error.
    pub stream_on_stdout: bool,
}

impl Output {
    pub fn emit<R: Report>(&self, outcome: Outcome<R>) -> ExitCode {
        clear_progress();
        let report = match outcome {
            Ok(report) => report,
            Err(failure) => return self.failed(&failure),
        };
        for warning in report.warnings() {
            warn(&warning);
        }
        if self.json {
            // Flattened rather than inserted into a serde_json::Value, whose
            // map sorts the keys: the report keeps its own field order (uuid
            // first in a listing's rows).
            let tagged = DryRunTagged {
                report: &report,
                dry_run: self.dry_run,
            };
            match serde_json::to_string(&tagged) {
                Ok(text) => to_stdout(&text),
                Err(e) => eprintln!("sparse-volume: cannot render the report as JSON: {e}"),
            }
        } else if self.dry_run {
            to_stdout(&format!("dry run, nothing changed: {}", report.planned()));
        } else {
            to_stdout(&report.human());
        }
        if report.succeeded() {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        }
    }

    /// [`Output::emit`] for a command whose standard output carries a
    /// stream (`export` to `-`): the report, or the failure, goes to
    /// standard error, as a line or (`--json`) an object.
    pub fn streamed<R: Report>(&self, outcome: Outcome<R>) -> ExitCode {
        clear_progress();
        match outcome {
            Ok(report) => {
                for warning in report.warnings() {
                    warn(&warning);
                }
                if self.json {
                    match serde_json::to_string(&report) {
                        Ok(text) => eprintln!("{text}"),
                        Err(e) => eprintln!("sparse-volume: cannot render the report as JSON: {e}"),
                    }
                } else {
                    eprintln!("sparse-volume: {}", report.human());
                }
                ExitCode::SUCCESS
            }
            Err(failure) => {
                let message = match &failure {
                    Failure::Unchanged(error) => format!("{}: {error:#}", self.doing),
                    Failure::PartlyApplied { error, .. } => format!("{}: {error:#}", self.doing),
                };
                self.fail(&message, ExitCode::FAILURE)
            }
        }
    }

    /// A document another program reads (metrics, manifests): printed as
    /// it is, whatever `--json` says; failures as usual.
    pub fn document(&self, outcome: Outcome<String>) -> ExitCode {
        clear_progress();
        match outcome {
            Ok(text) => {
                write_stdout(&text);
                ExitCode::SUCCESS
            }
            Err(failure) => self.failed(&failure),
        }
    }

    /// Argument combinations clap cannot express: still a usage error.
    pub fn usage(&self, message: &str) -> ExitCode {
        self.fail(message, ExitCode::from(2))
    }

    /// One line on stderr and, with `--json`, the failure's object: after
    /// a change, `changed` is true and the volume and what was done are
    /// named.
    fn failed(&self, failure: &Failure) -> ExitCode {
        let doing = &self.doing;
        match failure {
            Failure::Unchanged(error) => {
                self.fail(&format!("{doing}: {error:#}"), ExitCode::FAILURE)
            }
            Failure::PartlyApplied {
                uuid,
                actions,
                error,
            } => {
                // What was done is in the sentence too, for people: "creating
                // a volume: U after: create: starting …".
                let message = format!("{doing}: {uuid} after: {}: {error:#}", actions.join(", "));
                eprintln!("sparse-volume: {message}");
                if self.json {
                    to_stdout(
                        &serde_json::json!({
                            "changed": true,
                            "uuid": uuid.to_string(),
                            "actions": actions,
                            "dry_run": self.dry_run,
                            "error": message,
                        })
                        .to_string(),
                    );
                }
                ExitCode::FAILURE
            }
        }
    }

    /// A failure that changed nothing: one line on stderr and, with
    /// `--json`, `changed: false` with the error.
    pub fn fail(&self, message: &str, code: ExitCode) -> ExitCode {
        clear_progress();
        eprintln!("sparse-volume: {message}");
        if self.json {
            let object = serde_json::json!({
                "changed": false,
                "uuid": self.uuid,
                "dry_run": self.dry_run,
                "error": message,
            });
            if self.stream_on_stdout {
                eprintln!("{object}");
            } else {
                to_stdout(&object.to_string());
            }
        }
        code
    }
}

/// A line on standard output.
fn to_stdout(line: &str) {
    write_stdout(&[line, "\n"].concat());
}

/// Standard output may be a pipe whose reader is gone (`status | head`):
/// what it did not read is no failure of the command, whose work is done
/// (`println!` panics there). Any other write error is said on stderr.
fn write_stdout(text: &str) {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
        Err(e) => eprintln!("sparse-volume: writing to standard output: {e}"),
        Ok(()) => {}
    }
}

pub fn warn(warning: &str) {
    clear_progress();
    eprintln!("sparse-volume: warning: {warning}");
}
