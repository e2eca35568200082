use std::process::ExitCode;

use clap::Parser;

use std::io::Read;

use sparse_volume::cli::{ApplyArgs, Cli, Command, CreateArgs, ManifestFormat, PvArgs};
use sparse_volume::logging;
use sparse_volume::ops::apply::{self, desired::Desired};
use sparse_volume::ops::{attach, check, create, detach, register, remove, resize};
use sparse_volume::ops::{enable, list, metrics, pv, start, status};
use sparse_volume::ops::{PartlyApplied, Report};
use sparse_volume::paths::SystemRoot;
use sparse_volume::registry::{Entry, Registry};
use sparse_volume::volume_id::VolumeId;
use sparse_volume::volume_ref::VolumeRef;

fn main() -> ExitCode {
    // clap exits with status 2 on usage errors, as the contract asks.
    let cli = Cli::parse();
    logging::init(cli.verbose);
    let root = SystemRoot::from_env();
    let mut out = Output {
        json: cli.json,
        dry_run: false,
        uuid: cli.command.new_uuid().map(|id| id.to_string()),
    };
    if needs_root(&cli.command) && !running_as_root() {
        return out.fail(
            "this command needs root (it changes loop devices, backing files or the registry); run it with sudo",
            ExitCode::FAILURE,
        );
    }
    // A name stands for the one volume that carries it; resolved once, so
    // every command below works on a UUID as before.
    let resolved = match cli.command.volume() {
        Some(volume) => match Registry::open(root.clone()).resolve(volume) {
            Ok(id) => Some(id),
            Err(error) => return out.fail(&format!("{volume}: {error:#}"), ExitCode::FAILURE),
        },
        None => None,
    };
    if let Some(id) = resolved {
        out.uuid = Some(id.to_string());
    }
    for warning in registry_warnings(&root, &cli.command, resolved.as_ref()) {
        eprintln!("sparse-volume: warning: {warning}");
    }
    // Only read in the arms of commands that name a volume, where
    // `resolved` was set above or the command returned.
    let id = || resolved.expect("every command that names a volume resolved it");
    let dry_run = cli.dry_run;
    out.dry_run = dry_run;

    match &cli.command {
        Command::Create(args) => match create_request(args, dry_run) {
            Ok(request) => {
                let doing = args
                    .uuid
                    .map_or("creating a volume".to_string(), |u| format!("creating {u}"));
                out.emit(create::create(&root, &request), &doing)
            }
            Err(message) => out.usage(&message),
        },
        Command::Register {
            uuid,
            path,
            mode,
            fs_type,
            name,
            sector_size,
        } => match mode.to_register_mode(*fs_type) {
            Ok(mode) => {
                let request = register::RegisterRequest {
                    uuid: *uuid,
                    path: path.clone(),
                    mode,
                    name: name.clone(),
                    sector_size: *sector_size,
                    dry_run,
                };
                out.emit(
                    register::register(&root, &request),
                    &format!("registering {uuid}"),
                )
            }
            Err(message) => out.usage(&message),
        },
        Command::Remove {
            volume,
            delete_data,
        } => {
            let id = id();
            let named = match volume {
                VolumeRef::Name(name) => Some(name.as_str()),
                VolumeRef::Id(_) => None,
            };
            out.emit(
                remove::remove(&root, &id, named, *delete_data, dry_run),
                &format!("removing {id}"),
            )
        }
        Command::Resize { size, .. } => {
            let id = id();
            out.emit(
                resize::resize(&root, &id, *size, dry_run),
                &format!("resizing {id}"),
            )
        }
        Command::Attach { .. } => {
            let id = id();
            let doing = format!("attaching {id}");
            if dry_run {
                out.emit(attach::plan_attach(&root, &id), &doing)
            } else {
                out.emit(attach::attach(&root, &id), &doing)
            }
        }
        Command::Detach { .. } => {
            let id = id();
            let doing = format!("detaching {id}");
            if dry_run {
                out.emit(detach::plan_detach(&root, &id), &doing)
            } else {
                out.emit(detach::detach(&root, &id), &doing)
            }
        }
        // A dry run of a repair is the audit: it lists what a repair fixes.
        Command::Check { repair } => {
            out.emit(check::check(&root, *repair && !dry_run), "checking volumes")
        }
        Command::Enable { now, .. } => {
            let id = id();
            out.emit(
                enable::enable(&root, &id, *now, dry_run),
                &format!("enabling {id}"),
            )
        }
        Command::Disable { now, .. } => {
            let id = id();
            out.emit(
                enable::disable(&root, &id, *now, dry_run),
                &format!("disabling {id}"),
            )
        }
        Command::Start { .. } => {
            let id = id();
            out.emit(start::start(&root, &id, dry_run), &format!("starting {id}"))
        }
        Command::Stop { .. } => {
            let id = id();
            out.emit(start::stop(&root, &id, dry_run), &format!("stopping {id}"))
        }
        Command::List { wide } => out.emit(list::list(&root, *wide), "listing volumes"),
        Command::Status { .. } => {
            let id = id();
            out.emit(
                status::status(&root, &id),
                &format!("reading the status of {id}"),
            )
        }
        Command::Metrics { textfile: None } => {
            out.document(metrics::render(&root), "collecting metrics")
        }
        Command::Metrics {
            textfile: Some(directory),
        } => out.emit(
            metrics::write_textfile(&root, directory.as_deref()),
            "writing the metrics textfile",
        ),
        Command::Apply(args) => match apply_desired(args) {
            Ok(desired) => {
                // By name: a refusal still tells config management which
                // volume it was about.
                if let Some(id) = desired.uuid {
                    out.uuid = Some(id.to_string());
                }
                if let (None, Some(name)) = (&desired.uuid, &desired.name) {
                    if let Ok(Some(volume)) = Registry::open(root.clone()).volume_named(name) {
                        out.uuid = Some(volume.id.to_string());
                    }
                }
                let doing = match (&desired.name, &desired.uuid) {
                    (_, Some(id)) => format!("applying {id}"),
                    (Some(name), None) => format!("applying {name:?}"),
                    (None, None) => "applying".to_string(),
                };
                out.emit(apply::apply(&root, &desired, dry_run), &doing)
            }
            Err(message) => out.usage(&message),
        },
        Command::Pv(args) => {
            let what = match resolved {
                Some(id) => format!("writing the PersistentVolume of {id}"),
                None => "writing PersistentVolumes".to_string(),
            };
            out.document(
                pv::manifest(&root, &pv_request(args, resolved, cli.json)),
                &what,
            )
        }
    }
}

fn pv_request(args: &PvArgs, uuid: Option<VolumeId>, json: bool) -> pv::PvRequest {
    pv::PvRequest {
        uuid,
        storage_class: args.storage_class.clone(),
        node: args.node.clone(),
        reclaim: args.reclaim,
        format: if json {
            ManifestFormat::Json
        } else {
            args.output
        },
    }
}

/// Everything but the read-only reports changes state that only root may
/// change; saying so up front beats "Permission denied" on a lock file.
fn needs_root(command: &Command) -> bool {
    !matches!(
        command,
        Command::List { .. }
            | Command::Status { .. }
            | Command::Check { repair: false }
            | Command::Metrics { .. }
            | Command::Pv(_)
    )
}

fn running_as_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// What the registry ignored or could not use, on every command: a typo
/// in a key should be seen long before it matters. `list` shows it for
/// every volume, other commands for the volume they are about; `check`
/// reports all of it among its findings, so once is enough.
fn registry_warnings(root: &SystemRoot, command: &Command, id: Option<&VolumeId>) -> Vec<String> {
    if matches!(command, Command::Check { .. }) {
        return Vec::new();
    }
    let registry = Registry::open(root.clone());
    let mut warnings: Vec<String> = registry
        .config_warnings()
        .iter()
        .map(ToString::to_string)
        .collect();
    if let Some(problem) = registry.config_problem() {
        warnings.push(format!("{problem}; using built-in defaults"));
    }
    let entries: Vec<Entry> = match command {
        // Unreadable volumes.d is list's own error to report.
        Command::List { .. } => registry.entries().unwrap_or_default(),
        _ => id
            .or(command.new_uuid().as_ref())
            .and_then(|id| registry.entry(id))
            .into_iter()
            .collect(),
    };
    for entry in entries {
        warnings.extend(entry.warnings.iter().map(ToString::to_string));
    }
    warnings
}

fn create_request(args: &CreateArgs, dry_run: bool) -> Result<create::CreateRequest, String> {
    Ok(create::CreateRequest {
        size: args.size,
        mode: args.mode.to_mode(args.fs_type, args.mkfs_options.clone())?,
        uuid: args.uuid,
        name: args.name.clone(),
        path: args.path.clone(),
        preallocate: args.preallocate,
        sector_size: args.sector_size,
        now: args.now,
        dry_run,
    })
}

/// The desired state from the flags or, with `--stdin`, from the document
/// there; anything wrong with it is a usage error.
fn apply_desired(args: &ApplyArgs) -> Result<Desired, String> {
    if !args.stdin {
        let desired = args.desired();
        desired.check()?;
        return Ok(desired);
    }
    let mut text = String::new();
    std::io::stdin()
        .read_to_string(&mut text)
        .map_err(|e| format!("reading the desired state from stdin: {e}"))?;
    Desired::from_document(&text)
}

/// A report with `dry_run` added after its own fields.
#[derive(serde::Serialize)]
struct DryRunTagged<'a, R> {
    #[serde(flatten)]
    report: &'a R,
    dry_run: bool,
}

/// Prints a command's outcome for people or as one JSON object, and turns
/// it into the exit status.
struct Output {
    json: bool,
    /// Said in every report, so a dry run's output is never mistaken
    /// for a change made.
    dry_run: bool,
    uuid: Option<String>,
}

impl Output {
    fn emit<R: Report>(&self, result: anyhow::Result<R>, doing: &str) -> ExitCode {
        match result {
            Ok(report) => {
                for warning in report.warnings() {
                    eprintln!("sparse-volume: warning: {warning}");
                }
                if self.json {
                    // Flattened rather than inserted into a serde_json::Value,
                    // whose map sorts the keys: the report keeps its own
                    // field order (uuid first in a listing's rows).
                    let tagged = DryRunTagged {
                        report: &report,
                        dry_run: self.dry_run,
                    };
                    match serde_json::to_string(&tagged) {
                        Ok(text) => println!("{text}"),
                        Err(e) => eprintln!("sparse-volume: cannot render the report as JSON: {e}"),
                    }
                } else if self.dry_run {
                    println!("dry run, nothing changed: {}", report.human());
                } else {
                    println!("{}", report.human());
                }
                if report.succeeded() {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::FAILURE
                }
            }
            // One line: "attaching U: backing file … is a symbolic link".
            Err(error) => {
                let message = format!("{doing}: {error:#}");
                match error.downcast_ref::<PartlyApplied>() {
                    Some(partly) => self.fail_after_changes(&message, partly),
                    None => self.fail(&message, ExitCode::FAILURE),
                }
            }
        }
    }

    /// A document another program reads (metrics, manifests): printed as
    /// it is, whatever `--json` says; failures as usual.
    fn document(&self, result: anyhow::Result<String>, doing: &str) -> ExitCode {
        match result {
            Ok(text) => {
                print!("{text}");
                ExitCode::SUCCESS
            }
            Err(error) => self.fail(&format!("{doing}: {error:#}"), ExitCode::FAILURE),
        }
    }

    /// Argument combinations clap cannot express: still a usage error.
    fn usage(&self, message: &str) -> ExitCode {
        self.fail(message, ExitCode::from(2))
    }

    /// A failure after something was changed: `changed` is true, and the
    /// volume and what was done are named.
    fn fail_after_changes(&self, message: &str, partly: &PartlyApplied) -> ExitCode {
        eprintln!("sparse-volume: {message}");
        if self.json {
            println!(
                "{}",
                serde_json::json!({
                    "changed": true,
                    "uuid": partly.uuid,
                    "actions": partly.actions,
                    "dry_run": self.dry_run,
                    "error": message,
                })
            );
        }
        ExitCode::FAILURE
    }

    fn fail(&self, message: &str, code: ExitCode) -> ExitCode {
        eprintln!("sparse-volume: {message}");
        if self.json {
            println!(
                "{}",
                serde_json::json!({
                    "changed": false,
                    "uuid": self.uuid,
                    "dry_run": self.dry_run,
                    "error": message,
                })
            );
        }
        code
    }
}
