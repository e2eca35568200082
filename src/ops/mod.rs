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

use std::fmt;

use serde::Serialize;

/// Attached to the error of a command that failed after it had already
/// changed something, so that the caller (config management above all)
/// learns what was done and to which volume, not only what failed.
#[derive(Debug, Clone)]
pub struct PartlyApplied {
    pub uuid: String,
    pub actions: Vec<String>,
}

impl fmt::Display for PartlyApplied {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} after: {}", self.uuid, self.actions.join(", "))
    }
}

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
