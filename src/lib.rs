//! sparse-volume: persistent loop-device volumes on sparse files.

pub mod fsutil;
pub mod paths;
pub mod registry;
pub mod size;
pub mod volume_id;
