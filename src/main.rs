//! `sparse-volume`: parses the command line, opens the registry once,
//! names the volume a command is about, and hands the command to its
//! module; `cli::output` says what came of it.
#![deny(unsafe_code)]

use std::process::ExitCode;

use clap::Parser;

use sparse_volume::cli::args::{Cli, Command};
use sparse_volume::cli::logging;
use sparse_volume::cli::output::{warn, Output};
use sparse_volume::commands::inspecting::{check, list, metrics, pv, status};
use sparse_volume::commands::provisioning::{apply, create, register, remove, resize};
use sparse_volume::commands::running::{attach, detach, enable, start};
use sparse_volume::registry::paths::SystemRoot;
use sparse_volume::registry::Registry;
use sparse_volume::volume::id::VolumeId;
use sparse_volume::volume::reference::VolumeRef;

const NEEDS_ROOT: &str = "this command needs root (it changes loop devices, backing files or the registry); run it with sudo";

fn main() -> ExitCode {
    // clap exits with status 2 on usage errors, as the contract asks.
    let cli = Cli::parse();
    logging::init(cli.verbose);
    let registry = Registry::open(SystemRoot::from_env());
    let mut out = Output {
        json: cli.json,
        dry_run: cli.dry_run,
        uuid: cli.command.new_uuid().map(|id| id.to_string()),
    };
    if cli.command.needs_root() && !nix::unistd::geteuid().is_root() {
        return out.fail(NEEDS_ROOT, ExitCode::FAILURE);
    }
    // A name stands for the one volume that carries it; resolved once, so
    // every command below works on a UUID.
    let id = match cli.command.volume().map(|v| (v, registry.resolve(v))) {
        None => None,
        Some((_, Ok(id))) => Some(id),
        Some((volume, Err(error))) => {
            return out.fail(&format!("{volume}: {error:#}"), ExitCode::FAILURE)
        }
    };
    if let Some(id) = &id {
        out.uuid = Some(id.to_string());
    }
    for warning in registry_warnings(&registry, &cli.command, id.as_ref()) {
        warn(&warning);
    }
    run(&registry, &cli, id, &mut out)
}

/// The dispatch table: one command, one call.
fn run(registry: &Registry, cli: &Cli, id: Option<VolumeId>, out: &mut Output) -> ExitCode {
    let dry_run = cli.dry_run;
    // Only read in the arms of commands that name a volume, which `main`
    // resolved or refused.
    let id = || id.expect("every command that names a volume resolved it");
    match &cli.command {
        Command::Create(args) => match args.request(dry_run) {
            Ok(request) => {
                let doing = args
                    .uuid
                    .map_or("creating a volume".into(), |u| format!("creating {u}"));
                out.emit(create::create(registry, &request), &doing)
            }
            Err(message) => out.usage(&message),
        },
        Command::Register(args) => match args.request(dry_run) {
            Ok(request) => out.emit(
                register::register(registry, &request),
                &format!("registering {}", args.uuid),
            ),
            Err(message) => out.usage(&message),
        },
        Command::Remove {
            volume,
            delete_data,
        } => {
            let named = match volume {
                VolumeRef::Name(name) => Some(name.as_str()),
                VolumeRef::Id(_) => None,
            };
            out.emit(
                remove::remove(registry, &id(), named, *delete_data, dry_run),
                &format!("removing {}", id()),
            )
        }
        Command::Resize { size, .. } => out.emit(
            resize::resize(registry, &id(), *size, dry_run),
            &format!("resizing {}", id()),
        ),
        Command::Attach { .. } if dry_run => out.emit(
            attach::plan_attach(registry, &id()),
            &format!("attaching {}", id()),
        ),
        Command::Attach { .. } => out.emit(
            attach::attach(registry, &id()),
            &format!("attaching {}", id()),
        ),
        Command::Detach { .. } if dry_run => out.emit(
            detach::plan_detach(registry, &id()),
            &format!("detaching {}", id()),
        ),
        Command::Detach { .. } => out.emit(
            detach::detach(registry, &id()),
            &format!("detaching {}", id()),
        ),
        // A dry run of a repair is the audit: it lists what a repair fixes.
        Command::Check { repair } => out.emit(
            check::check(registry, *repair && !dry_run),
            "checking volumes",
        ),
        Command::Enable { now, .. } => out.emit(
            enable::enable(registry, &id(), *now, dry_run),
            &format!("enabling {}", id()),
        ),
        Command::Disable { now, .. } => out.emit(
            enable::disable(registry, &id(), *now, dry_run),
            &format!("disabling {}", id()),
        ),
        Command::Start { .. } => out.emit(
            start::start(registry, &id(), dry_run),
            &format!("starting {}", id()),
        ),
        Command::Stop { .. } => out.emit(
            start::stop(registry, &id(), dry_run),
            &format!("stopping {}", id()),
        ),
        Command::List { wide } => out.emit(list::list(registry, *wide), "listing volumes"),
        Command::Status { .. } => out.emit(
            status::status(registry, &id()),
            &format!("reading the status of {}", id()),
        ),
        Command::Metrics { textfile: None } => {
            out.document(metrics::render(registry), "collecting metrics")
        }
        Command::Metrics {
            textfile: Some(directory),
        } => out.emit(
            metrics::write_textfile(registry, directory.as_deref()),
            "writing the metrics textfile",
        ),
        Command::Apply(args) => match args.read_desired() {
            Ok(desired) => {
                // By name: a refusal still tells config management which
                // volume it was about.
                let known = desired.uuid.or_else(|| {
                    let name = desired.name.as_deref()?;
                    Some(registry.volume_named(name).ok()??.id)
                });
                if let Some(known) = known {
                    out.uuid = Some(known.to_string());
                }
                out.emit(
                    apply::apply(registry, &desired, dry_run),
                    &apply::doing(&desired),
                )
            }
            Err(message) => out.usage(&message),
        },
        Command::Pv(args) => {
            let doing = match args.volume {
                Some(_) => format!("writing the PersistentVolume of {}", id()),
                None => "writing PersistentVolumes".to_string(),
            };
            let uuid = args.volume.as_ref().map(|_| id());
            out.document(
                pv::manifest(registry, &args.request(uuid, cli.json)),
                &doing,
            )
        }
    }
}

/// What the registry ignored or could not use, on every command: a typo
/// in a key should be seen long before it matters. `list` shows it for
/// every volume, other commands for the volume they are about; `check`
/// reports all of it among its findings, so once is enough.
fn registry_warnings(registry: &Registry, command: &Command, id: Option<&VolumeId>) -> Vec<String> {
    if matches!(command, Command::Check { .. }) {
        return Vec::new();
    }
    let mut warnings: Vec<String> = registry
        .config_warnings()
        .iter()
        .map(ToString::to_string)
        .collect();
    if let Some(problem) = registry.config_problem() {
        warnings.push(format!("{problem}; using built-in defaults"));
    }
    let entries = match command {
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
