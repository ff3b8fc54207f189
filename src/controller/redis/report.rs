//! What the steps of one pass found, for the status step to assemble: the
//! problems (Degraded), the work in progress (Progressing) and why it
//! waits, whether anything was written, and when to look again. Steps only
//! add to it; the status step (`status`, and the Cluster topology's own
//! status) reads it once the pass has run. What a step decides for the
//! steps after it is its return value, not this.

use std::time::Duration;

use super::facts::Cond;
use crate::api::v1alpha1::{Insight, TuningStatus};

/// The findings of one pass.
#[derive(Debug, Default)]
pub struct Report {
    /// Problems to report as Degraded.
    notes: Vec<String>,
    /// Work in progress, reported as Progressing.
    progressing: Vec<String>,
    /// The Progressing reason when a step waits on purpose (default
    /// `Reconciling`).
    progress_reason: Option<&'static str>,
    /// The Degraded reason of the first data-plane failure of this pass.
    degraded_reason: Option<&'static str>,
    /// Whether this pass wrote anything to the API (resets the backoff).
    wrote: bool,
    /// When a healthy Redis is to be looked at again sooner than the
    /// periodic pass (a certificate reload waiting for the kubelet).
    recheck_in: Option<Duration>,
    /// The primary this pass wrote to `status.primary`: the chosen one, or
    /// the target of a failover, switchover or recovery made here.
    primary: Option<String>,
}

impl Report {
    /// A problem, reported in the Degraded condition.
    pub fn note(&mut self, msg: String) {
        self.notes.push(msg);
    }

    /// Problems found together (a Cluster plan's).
    pub fn notes_from(&mut self, msgs: impl IntoIterator<Item = String>) {
        self.notes.extend(msgs);
    }

    /// Work in progress, reported in the Progressing condition.
    pub fn progress(&mut self, msg: String) {
        self.progressing.push(msg);
    }

    /// Several pieces of work in progress.
    pub fn progress_from(&mut self, msgs: impl IntoIterator<Item = String>) {
        self.progressing.extend(msgs);
    }

    /// The Progressing reason: the step waits on purpose.
    pub fn waiting(&mut self, reason: &'static str) {
        self.progress_reason = Some(reason);
    }

    /// The Progressing reason unless a step set one before.
    pub fn waiting_unless_set(&mut self, reason: &'static str) {
        self.progress_reason.get_or_insert(reason);
    }

    /// The Degraded reason unless an earlier failure of the pass set one.
    pub fn degraded(&mut self, reason: &'static str) {
        self.degraded_reason.get_or_insert(reason);
    }

    /// The pass wrote to the API.
    pub fn wrote(&mut self) {
        self.wrote = true;
    }

    /// Look again after `d` (the last step to ask decides).
    pub fn recheck_in(&mut self, d: Duration) {
        self.recheck_in = Some(d);
    }

    /// Look again within `d` (sooner if another step asked).
    pub fn recheck_within(&mut self, d: Duration) {
        self.recheck_in = Some(self.recheck_in.map_or(d, |r| r.min(d)));
    }

    /// The pass wrote `primary` to `status.primary`.
    pub fn recorded_primary(&mut self, primary: &str) {
        self.primary = Some(primary.to_string());
    }

    /// The primary this pass wrote to `status.primary`, when it wrote one.
    pub fn primary(&self) -> Option<&str> {
        self.primary.as_deref()
    }

    /// The problems found so far.
    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    /// The work in progress found so far.
    pub fn progressing(&self) -> &[String] {
        &self.progressing
    }

    /// The Progressing reason, when a step set one.
    pub fn progress_reason(&self) -> Option<&'static str> {
        self.progress_reason
    }

    /// The Degraded reason, when a failure set one.
    pub fn degraded_reason(&self) -> Option<&'static str> {
        self.degraded_reason
    }

    /// Whether the pass wrote to the API.
    pub fn has_written(&self) -> bool {
        self.wrote
    }

    /// When a step asked to look again.
    pub fn recheck(&self) -> Option<Duration> {
        self.recheck_in
    }
}

/// What steps decided this pass for the status step (each part returned by
/// the step named on it, kept by the topology pass, handed to `finish`).
#[derive(Debug, Default)]
pub struct Outcomes {
    /// The memory autopilot's (`autopilot`; a refused resize and the shard
    /// autopilot amend it).
    pub memory: Memory,
    /// `UpgradeFailed` when the spec cannot be served, in place of the
    /// upgrade's own condition (`track_upgrade`).
    pub upgrade: Option<Cond>,
    /// The data is saved and the pods are to go (`hibernate`): children are
    /// applied with no replica and no published primary.
    pub hibernating: bool,
    /// The tuning look's findings (`tune`).
    pub tuning: Tuning,
    /// Settings of `spec.tuning` a server refused this pass
    /// (`apply_live_config`): key, value, the server's message.
    pub refused: Vec<(String, String, String)>,
}

/// The memory autopilot's outcome.
#[derive(Debug, Default)]
pub struct Memory {
    /// Its condition this pass (none: it did not look; the last one stays).
    pub cond: Option<Cond>,
    /// When it wants to look again (a cooldown ending).
    pub due: Option<Duration>,
}

/// The tuning look's outcome.
#[derive(Debug, Default)]
pub struct Tuning {
    /// Its findings, when it looked.
    pub insights: Option<Vec<Insight>>,
    /// `status.tuning` as the look left it, when it changed it.
    pub status: Option<TuningStatus>,
}
