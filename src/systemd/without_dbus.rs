//! Stands in for the D-Bus client in builds without the `dbus` feature
//! (the generator's), with the same API, so callers need no `cfg`.
//! It cannot be constructed: [`Systemd::connect`] always fails.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::time::Duration;

use anyhow::{bail, Result};

use super::unit::{UnitActivity, UnitState};

pub struct Systemd(Infallible);

impl Systemd {
    pub fn connect() -> Result<Self> {
        bail!("cannot reach systemd on the system bus: this build of sparse-volume has no D-Bus support (cargo feature \"dbus\")")
    }

    pub fn version(&self) -> &str {
        match self.0 {}
    }

    pub fn reload(&self) -> Result<()> {
        match self.0 {}
    }

    pub fn start_unit(&self, _unit: &str, _limit: Duration) -> Result<String> {
        match self.0 {}
    }

    pub fn stop_unit(&self, _unit: &str, _limit: Duration) -> Result<String> {
        match self.0 {}
    }

    pub fn reset_failed(&self, _unit: &str) -> Result<()> {
        match self.0 {}
    }

    pub fn disable_unit_files(&self, _unit: &str) -> Result<Vec<(String, String, String)>> {
        match self.0 {}
    }

    pub fn load_state(&self, _unit: &str) -> Result<String> {
        match self.0 {}
    }

    pub fn unit_state(&self, _unit: &str) -> Result<UnitState> {
        match self.0 {}
    }

    pub fn loaded_units_matching(&self, _pattern: &str) -> Result<BTreeMap<String, UnitActivity>> {
        match self.0 {}
    }
}
