//! Status conditions: built from the reconcile outcome, with transition times
//! preserved when a condition keeps its status.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

/// One condition as the reconciler sees it, before times are attached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cond {
    /// `Ready`, `Progressing` or `Degraded`.
    pub type_: &'static str,
    /// True or false.
    pub status: bool,
    /// CamelCase reason.
    pub reason: String,
    /// Human message.
    pub message: String,
}

impl Cond {
    /// A condition.
    pub fn new(
        type_: &'static str,
        status: bool,
        reason: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Cond {
            type_,
            status,
            reason: reason.into(),
            message: message.into(),
        }
    }
}

/// Merges `desired` into `previous`: a condition whose status did not change
/// keeps its `lastTransitionTime`; others get `now`.
pub fn merge(
    previous: &[Condition],
    desired: &[Cond],
    generation: Option<i64>,
    now: Timestamp,
) -> Vec<Condition> {
    desired
        .iter()
        .map(|d| {
            let status = if d.status { "True" } else { "False" };
            let old = previous.iter().find(|c| c.type_ == d.type_);
            let last = match old {
                Some(c) if c.status == status => c.last_transition_time.clone(),
                _ => Time(now),
            };
            Condition {
                type_: d.type_.to_string(),
                status: status.to_string(),
                reason: d.reason.clone(),
                message: d.message.clone(),
                observed_generation: generation,
                last_transition_time: last,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transition_time_is_kept_while_status_holds() {
        let t0 = Timestamp::from_second(1_000).expect("t0");
        let t1 = Timestamp::from_second(2_000).expect("t1");
        let first = merge(
            &[],
            &[Cond::new("Ready", false, "Creating", "0/3")],
            Some(1),
            t0,
        );
        assert_eq!(first[0].last_transition_time, Time(t0));
        let same = merge(
            &first,
            &[Cond::new("Ready", false, "Creating", "1/3")],
            Some(1),
            t1,
        );
        assert_eq!(same[0].last_transition_time, Time(t0));
        assert_eq!(same[0].message, "1/3");
        let flipped = merge(
            &same,
            &[Cond::new("Ready", true, "Ready", "3/3")],
            Some(2),
            t1,
        );
        assert_eq!(flipped[0].last_transition_time, Time(t1));
        assert_eq!(flipped[0].status, "True");
        assert_eq!(flipped[0].observed_generation, Some(2));
    }
}
