//! `sparse-volume`: parses the command line, opens the registry once,
//! names the volume a command is about, and hands the command to its
//! module; `cli::output` says what came of it.
#![deny(unsafe_code)]

use std::process::ExitCode;

use clap::Parser;

use sparse_volume::cli::args::{Cli, Command};
use sparse_volume::cli::logging;
use sparse_volume::cli::output::{warn, Output};
use sparse_volume::cli::usage::usage_error;
use sparse_volume::cli::warnings::registry_warnings;
use sparse_volume::commands::inspecting::{check, list, metrics, pv, status};
use sparse_volume::commands::provisioning::remove::RemoveReport;
use sparse_volume::commands::provisioning::{
    apply, clone, create, export, import, register, remove, resize,
};
use sparse_volume::commands::running::{attach, detach, enable, start};
use sparse_volume::registry::paths::SystemRoot;
use sparse_volume::registry::{NoSuchVolume, Registry, ResolvedBy};
use sparse_volume::volume::id::VolumeId;

const NEEDS_ROOT: &str = "this command needs root (it changes loop devices, backing files or the registry); run it with sudo";

fn main() -> ExitCode {
    // Usage errors exit with status 2, as the contract asks.
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => {
            let args: Vec<String> = std::env::args_os()
                .skip(1)
                .map(|arg| arg.to_string_lossy().into_owned())
                .collect();
            return usage_error(error, &args);
        }
    };
    logging::init(cli.verbose, cli.json);
    let registry = Registry::open(SystemRoot::from_env());
    let mut out = Output {
        json: cli.json,
        dry_run: cli.command.dry_run(),
        uuid: cli.command.new_uuid().map(|id| id.to_string()),
        doing: cli.command.doing(None),
        stream_on_stdout: cli.command.streams_to_stdout(),
    };
    if cli.command.needs_root() && !nix::unistd::geteuid().is_root() {
        return out.fail(NEEDS_ROOT, ExitCode::FAILURE);
    }
    // A name, a device, a path or a beginning of a UUID stands for one
    // volume; resolved once, so every command below works on a UUID. Each
    // reason names what was typed already.
    let resolved = match cli
        .command
        .volume()
        .map(|v| registry.resolve(v))
        .transpose()
    {
        Ok(resolved) => resolved,
        Err(error) => {
            // Removed already: a repeated remove by name succeeds, as one
            // by UUID does, and says that nothing answered.
            if let (Command::Remove { .. }, Some(missing)) =
                (&cli.command, error.downcast_ref::<NoSuchVolume>())
            {
                if missing.is_a_name_nobody_has() {
                    return out.emit(Ok(RemoveReport::nothing_answers_to(missing)));
                }
            }
            return out.fail(&format!("{error:#}"), ExitCode::FAILURE);
        }
    };
    let how = resolved.as_ref().map(|r| r.how.clone());
    let id = resolved.map(|r| r.id);
    if let Some(id) = &id {
        out.uuid = Some(id.to_string());
        out.doing = cli.command.doing(Some(id));
    }
    for warning in registry_warnings(&registry, &cli.command, id.as_ref()) {
        warn(&warning);
    }
    run(&registry, &cli, id, how, &mut out)
}

/// The dispatch table: one command, one call.
fn run(
    registry: &Registry,
    cli: &Cli,
    id: Option<VolumeId>,
    how: Option<ResolvedBy>,
    out: &mut Output,
) -> ExitCode {
    let dry_run = cli.command.dry_run();
    // Only read in the arms of commands that name a volume, which `main`
    // resolved or refused.
    let id = || id.expect("every command that names a volume resolved it");
    match &cli.command {
        Command::Create(args) => match args.request(dry_run) {
            Ok(request) => out.emit(create::create(registry, &request)),
            Err(message) => out.usage(&message),
        },
        Command::Clone(args) => out.emit(clone::clone(registry, &args.request(id(), dry_run))),
        Command::Export {
            output,
            freeze_during_copy,
            ..
        } => {
            let request = export::ExportRequest {
                volume: id(),
                output: output.clone().filter(|p| p.as_os_str() != "-"),
                freeze_during_copy: *freeze_during_copy,
            };
            let outcome = export::export(registry, &request);
            match out.stream_on_stdout {
                false => out.emit(outcome),
                true => out.streamed(outcome),
            }
        }
        Command::Import(args) => out.emit(import::import(registry, &args.request(dry_run))),
        Command::Register(args) => match args.request(dry_run) {
            Ok(request) => out.emit(register::register(registry, &request)),
            Err(message) => out.usage(&message),
        },
        Command::Remove { delete_data, .. } => out.emit(remove::remove(
            registry,
            &id(),
            how.as_ref().unwrap_or(&ResolvedBy::Uuid),
            *delete_data,
            dry_run,
        )),
        Command::Resize { size, .. } => out.emit(resize::resize(registry, &id(), *size, dry_run)),
        Command::Attach { .. } if dry_run => out.emit(attach::plan_attach(registry, &id())),
        Command::Attach { .. } => out.emit(attach::attach(registry, &id())),
        Command::Detach { .. } if dry_run => out.emit(detach::plan_detach(registry, &id())),
        Command::Detach { .. } => out.emit(detach::detach(registry, &id())),
        // A dry run of a repair is the audit: it lists what a repair fixes.
        Command::Check { repair, .. } => out.emit(check::check(registry, *repair && !dry_run)),
        Command::Enable { now, .. } => out.emit(enable::enable(registry, &id(), *now, dry_run)),
        Command::Disable { now, .. } => out.emit(enable::disable(registry, &id(), *now, dry_run)),
        Command::Start { .. } => out.emit(start::start(registry, &id(), dry_run)),
        Command::Stop { .. } => out.emit(start::stop(registry, &id(), dry_run)),
        Command::List { names: true, .. } => out.emit(list::names::names(registry)),
        Command::List { wide, .. } => out.emit(list::list(registry, *wide)),
        Command::Status { .. } => out.emit(status::status(registry, &id())),
        Command::Metrics { textfile: None } => out.document(metrics::render(registry)),
        Command::Metrics {
            textfile: Some(dir),
        } => out.emit(metrics::write_textfile(registry, dir.as_deref())),
        Command::Apply(args) => match args.read_desired() {
            Ok(desired) => {
                // By name too: a refusal still tells config management
                // which volume it was about.
                out.uuid = apply::known_uuid(registry, &desired).map(|id| id.to_string());
                out.doing = apply::doing(&desired);
                out.emit(apply::apply(registry, &desired, dry_run))
            }
            Err(message) => out.usage(&message),
        },
        Command::Pv(args) => {
            let uuid = args.volume.as_ref().map(|_| id());
            out.document(pv::manifest(registry, &args.request(uuid, cli.json)))
        }
    }
}
