//! A summary of the last `check` in the run directory: `metrics` exposes
//! it, so an alert can fire on findings without an audit every scrape.

use std::fs;

use serde::{Deserialize, Serialize};

use crate::commands::inspecting::check::CheckReport;
use crate::registry::paths::SystemRoot;
use crate::registry::run_dir;

/// Where `check` leaves a summary of its findings for `metrics`.
const LAST_CHECK_FILE: &str = "last-check.json";

/// What the last `check` found and did not repair, by kind.
#[derive(Debug, Serialize, Deserialize)]
pub struct LastCheck {
    /// Unix time the check finished.
    pub finished: u64,
    pub counts: Vec<FindingCount>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct FindingCount {
    pub kind: String,
    pub severity: String,
    pub count: u64,
}

impl LastCheck {
    pub(super) fn of(report: &CheckReport) -> Self {
        let mut counts: Vec<FindingCount> = Vec::new();
        for finding in report.findings.iter().filter(|f| !f.repaired) {
            match counts
                .iter_mut()
                .find(|c| c.kind == finding.kind && c.severity == finding.severity)
            {
                Some(count) => count.count += 1,
                None => counts.push(FindingCount {
                    kind: finding.kind.to_string(),
                    severity: finding.severity.to_string(),
                    count: 1,
                }),
            }
        }
        counts.sort_by(|a, b| (&a.kind, &a.severity).cmp(&(&b.kind, &b.severity)));
        let finished = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        Self { finished, counts }
    }

    /// Best effort: a check by a user who cannot write the run directory
    /// still reports; metrics then show the previous summary.
    pub(super) fn record(&self, root: &SystemRoot) {
        let written = serde_json::to_vec(self)
            .map_err(anyhow::Error::from)
            .and_then(|bytes| {
                let file = run_dir::ensure(root)?.join(LAST_CHECK_FILE);
                crate::kernel::files::write_atomically(&file, &bytes, 0o644)
            });
        if let Err(e) = written {
            tracing::debug!("not recording this check for metrics: {e:#}");
        }
    }

    pub fn read(root: &SystemRoot) -> Option<Self> {
        let bytes = fs::read(run_dir::ensure(root).ok()?.join(LAST_CHECK_FILE)).ok()?;
        serde_json::from_slice(&bytes).ok()
    }
}
