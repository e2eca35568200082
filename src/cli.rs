//! The command line, defined once for parsing, man pages and completions.

use clap::{Parser, Subcommand};

use crate::volume_id::VolumeId;

#[derive(Debug, Parser)]
#[command(
    name = "sparse-volume",
    version,
    about = "Persistent loop-device volumes on sparse files, brought back at boot by systemd"
)]
pub struct Cli {
    /// Print one JSON object instead of a sentence.
    #[arg(long, global = true)]
    pub json: bool,

    /// More log output on stderr (repeat for more).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Attach a registered volume to a loop device (the unit's ExecStart).
    ///
    /// Reuses the loop device if the backing file is already attached,
    /// verifies the content carries the volume UUID, and waits for the
    /// udev link when udev runs.
    Attach {
        /// The volume UUID (canonical lowercase form).
        uuid: VolumeId,
    },
    /// Detach a volume's loop device (the unit's ExecStop).
    ///
    /// Needs no registry entry; a volume that is not attached is success.
    Detach {
        /// The volume UUID (canonical lowercase form).
        uuid: VolumeId,
    },
}

impl Command {
    /// The volume a command is about.
    pub fn uuid(&self) -> &VolumeId {
        match self {
            Command::Attach { uuid } | Command::Detach { uuid } => uuid,
        }
    }
}
