//! The command line: clap's arguments (which the man pages are made from
//! too), the output for people and as JSON with the exit status, and
//! logging. `main.rs` is the dispatch table.

pub mod args;
pub mod logging;
pub mod output;
pub mod usage;
pub mod warnings;
