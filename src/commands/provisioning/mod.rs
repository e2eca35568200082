//! Making, cloning, exporting and importing, adopting, growing and
//! removing volumes, and converging one to a desired state (`apply`, for
//! config management).

pub mod apply;
pub mod clone;
pub mod create;
pub mod export;
pub mod import;
pub mod register;
pub mod remove;
pub mod resize;
