//! The volume operations behind the CLI commands. Each returns a report
//! that the CLI prints for people or as JSON.

pub mod attach;
pub mod detach;
