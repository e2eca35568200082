//! What a command tells its caller: a [`Report`] when it ran, a
//! [`Failure`] when it did not, and whether that failure came after
//! something was already changed. There is no conversion from a plain
//! error: each command says at its boundary which kind of failure it has,
//! so none reports "nothing changed" after changing something by
//! forgetting to: the claim is written down, where a review can see it.
//!
//! Today `create --now` and `apply` report what they did before a failure;
//! the other commands report their failures as [`Failure::Unchanged`],
//! which is not true of every step (a `resize` whose file grew before the
//! file system tool failed, `disable --now` after its stop, `remove` after
//! its detach). Those are the next to say what they did.

use serde::Serialize;

use crate::volume::id::VolumeId;

/// What a command tells its caller when it ran.
pub trait Report: Serialize {
    /// One or a few sentences for people.
    fn human(&self) -> String;

    /// The same for a dry run: what the real run would do, in the
    /// conditional. Reports that only read, or that plan already, say the
    /// same either way.
    fn planned(&self) -> String {
        self.human()
    }

    /// Things that went well enough but deserve a look.
    fn warnings(&self) -> Vec<String> {
        Vec::new()
    }

    /// False when the command ran but found a problem (exit status 1).
    fn succeeded(&self) -> bool {
        true
    }
}

/// Why a command did not do what it was asked.
#[derive(Debug)]
pub enum Failure {
    /// Refused, or failed, before it changed anything.
    Unchanged(anyhow::Error),
    /// Failed after it changed something: config management must learn
    /// what was done and to which volume, not only what failed.
    PartlyApplied {
        uuid: VolumeId,
        /// What was done, in order, in the words of `apply`'s actions.
        actions: Vec<String>,
        error: anyhow::Error,
    },
}

/// A command's result.
pub type Outcome<R> = Result<R, Failure>;

impl Failure {
    /// The failure of a step that changes nothing when it fails.
    pub fn unchanged(error: impl Into<anyhow::Error>) -> Self {
        Failure::Unchanged(error.into())
    }

    pub fn error(&self) -> &anyhow::Error {
        match self {
            Failure::Unchanged(error) | Failure::PartlyApplied { error, .. } => error,
        }
    }
}
