//! Reports that only read (with `check --repair` as the one that may fix):
//! list, status, check, metrics and Kubernetes PersistentVolumes.

pub mod check;
pub mod list;
pub mod metrics;
pub mod pv;
pub mod status;
