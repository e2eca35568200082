//! sparse-volume: persistent loop-device volumes on sparse files.

pub mod backing;
pub mod capacity;
pub mod cli;
pub mod crashpoint;
pub mod creating_mark;
pub mod device_note;
pub mod extents;
pub mod faultpoint;
pub mod fsutil;
pub mod growing_mark;
pub mod inuse;
pub mod kernel_cmdline;
pub mod logging;
pub mod loopdev;
pub mod mkfs;
pub mod ops;
pub mod partition_table;
pub mod paths;
pub mod private_mount;
pub mod probe;
pub mod registry;
pub mod size;
/// The zbus client inside is behind the `dbus` feature (see the module).
pub mod systemd;
pub mod termination;
pub mod udev;
pub mod volume_id;
pub mod volume_ref;
