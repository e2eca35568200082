//! sparse-volume: persistent loop-device volumes on sparse files.

pub mod backing;
pub mod cli;
pub mod fsutil;
pub mod inuse;
pub mod logging;
pub mod loopdev;
pub mod ops;
pub mod partition_table;
pub mod paths;
pub mod probe;
pub mod registry;
pub mod size;
pub mod udev;
pub mod volume_id;
