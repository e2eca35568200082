//! Bringing volumes up and down: attach and detach (the unit's own work,
//! usable by hand), enable/disable and start/stop through systemd.

pub mod attach;
pub mod detach;
pub mod enable;
pub mod start;
