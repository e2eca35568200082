//! sparse-volume: persistent loop-device volumes on sparse files.
//!
//! The crate is built in layers, each a folder whose name says its job. A
//! layer uses the layers below it and never one above it
//! (`tests/layering.rs` holds the rule; `docs/design/ARCHITECTURE.md` is
//! the map).
#![deny(unsafe_code)]

/// The layers from the bottom up: a module may use its own layer and the
/// ones before it in this list, never one after it.
pub const LAYERS: &[&str] = &[
    "hooks", "kernel", "volume", "registry", "systemd", "engine", "commands", "cli",
];

#[cfg(feature = "cli")]
pub mod cli;
pub mod commands;
pub mod engine;
pub mod hooks;
pub mod kernel;
pub mod registry;
/// The zbus client inside is behind the `dbus` feature (see the module).
pub mod systemd;
pub mod volume;
