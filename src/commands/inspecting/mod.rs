//! Reports that only read (with `check --repair` as the one that may fix):
//! list, status, check, metrics, Kubernetes PersistentVolumes, and the
//! volume names the shell completions offer.

pub mod check;
pub mod list;
pub mod metrics;
pub mod pv;
pub mod status;
pub mod volume_names;
