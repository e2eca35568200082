use std::process::ExitCode;

use clap::Parser;

use sparse_volume::cli::{Cli, Command, CreateArgs, ManifestFormat, PvArgs};
use sparse_volume::logging;
use sparse_volume::ops::{attach, check, create, detach, register, remove, resize, Report};
use sparse_volume::ops::{enable, list, metrics, pv, start, status};
use sparse_volume::paths::SystemRoot;
use sparse_volume::registry::{Entry, Registry};
use sparse_volume::volume_id::VolumeId;

fn main() -> ExitCode {
    // clap exits with status 2 on usage errors, as the contract asks.
    let cli = Cli::parse();
    logging::init(cli.verbose);
    let root = SystemRoot::from_env();
    let out = Output {
        json: cli.json,
        uuid: cli.command.uuid().map(ToString::to_string),
    };
    if needs_root(&cli.command) && !running_as_root() {
        return out.fail(
            "this command needs root (it changes loop devices, backing files or the registry); run it with sudo",
            ExitCode::FAILURE,
        );
    }
    for warning in registry_warnings(&root, &cli.command) {
        eprintln!("sparse-volume: warning: {warning}");
    }

    match &cli.command {
        Command::Create(args) => match create_request(args) {
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
                };
                out.emit(
                    register::register(&root, &request),
                    &format!("registering {uuid}"),
                )
            }
            Err(message) => out.usage(&message),
        },
        Command::Remove { uuid, delete_data } => out.emit(
            remove::remove(&root, uuid, *delete_data),
            &format!("removing {uuid}"),
        ),
        Command::Resize { uuid, size } => out.emit(
            resize::resize(&root, uuid, *size),
            &format!("resizing {uuid}"),
        ),
        Command::Attach { uuid } => {
            out.emit(attach::attach(&root, uuid), &format!("attaching {uuid}"))
        }
        Command::Detach { uuid } => {
            out.emit(detach::detach(&root, uuid), &format!("detaching {uuid}"))
        }
        Command::Check { repair } => out.emit(check::check(&root, *repair), "checking volumes"),
        Command::Enable { uuid, now } => out.emit(
            enable::enable(&root, uuid, *now),
            &format!("enabling {uuid}"),
        ),
        Command::Disable { uuid, now } => out.emit(
            enable::disable(&root, uuid, *now),
            &format!("disabling {uuid}"),
        ),
        Command::Start { uuid } => out.emit(start::start(&root, uuid), &format!("starting {uuid}")),
        Command::Stop { uuid } => out.emit(start::stop(&root, uuid), &format!("stopping {uuid}")),
        Command::List { wide } => out.emit(list::list(&root, *wide), "listing volumes"),
        Command::Status { uuid } => out.emit(
            status::status(&root, uuid),
            &format!("reading the status of {uuid}"),
        ),
        Command::Metrics { textfile: None } => {
            out.document(metrics::render(&root), "collecting metrics")
        }
        Command::Metrics {
            textfile: Some(directory),
        } => out.emit(
            metrics::write_textfile(&root, directory.as_deref()),
            "writing the metrics textfile",
        ),
        Command::Pv(args) => out.document(
            pv::manifest(&root, &pv_request(args, cli.json)),
            &args
                .uuid
                .map_or("writing PersistentVolumes".to_string(), |u| {
                    format!("writing the PersistentVolume of {u}")
                }),
        ),
    }
}

fn pv_request(args: &PvArgs, json: bool) -> pv::PvRequest {
    pv::PvRequest {
        uuid: args.uuid,
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
fn registry_warnings(root: &SystemRoot, command: &Command) -> Vec<String> {
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
        _ => command
            .uuid()
            .and_then(|id: &VolumeId| registry.entry(id))
            .into_iter()
            .collect(),
    };
    for entry in entries {
        warnings.extend(entry.warnings.iter().map(ToString::to_string));
    }
    warnings
}

fn create_request(args: &CreateArgs) -> Result<create::CreateRequest, String> {
    Ok(create::CreateRequest {
        size: args.size,
        mode: args.mode.to_mode(args.fs_type, args.mkfs_options.clone())?,
        uuid: args.uuid,
        name: args.name.clone(),
        path: args.path.clone(),
        preallocate: args.preallocate,
        sector_size: args.sector_size,
        now: args.now,
    })
}

/// Prints a command's outcome for people or as one JSON object, and turns
/// it into the exit status.
struct Output {
    json: bool,
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
                    match serde_json::to_string(&report) {
                        Ok(text) => println!("{text}"),
                        Err(e) => eprintln!("sparse-volume: cannot render the report as JSON: {e}"),
                    }
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
            Err(error) => self.fail(&format!("{doing}: {error:#}"), ExitCode::FAILURE),
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

    fn fail(&self, message: &str, code: ExitCode) -> ExitCode {
        eprintln!("sparse-volume: {message}");
        if self.json {
            println!(
                "{}",
                serde_json::json!({ "changed": false, "uuid": self.uuid, "error": message })
            );
        }
        code
    }
}
