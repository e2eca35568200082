//! The volume operations behind the CLI commands. Each returns a report
//! that the CLI prints for people or as one JSON object.

pub mod activate;
pub mod apply;
pub mod attach;
pub mod check;
pub mod create;
pub mod detach;
pub mod enable;
pub mod inspect;
pub mod list;
pub mod metrics;
pub mod pv;
pub mod register;
pub mod remove;
pub mod resize;
pub mod start;
pub mod status;

use serde::Serialize;

/// What a command tells its caller.
pub trait Report: Serialize {
    /// One or a few sentences for people.
    fn human(&self) -> String;

    /// Things that went well enough but deserve a look.
    fn warnings(&self) -> Vec<String> {
        Vec::new()
    }

    /// False when the command ran but found a problem (exit status 1).
    fn succeeded(&self) -> bool {
        true
    }
}
