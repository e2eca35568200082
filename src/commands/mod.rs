//! The commands, grouped by what an operator does: provisioning volumes,
//! running them, inspecting them. Each returns a [`report::Report`] (or a
//! [`report::Failure`] that says whether something was changed) which the
//! CLI prints for people or as one JSON object.

pub mod inspecting;
pub mod provisioning;
pub mod report;
pub mod running;
