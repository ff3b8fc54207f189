//! Leader election on a `coordination.k8s.io` Lease, so that of several
//! operator processes exactly one reconciles.
//!
//! Every write is a server-side apply that carries the Lease's
//! `resourceVersion`, which makes it a compare-and-swap: two candidates that
//! race for an expired lease cannot both win.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ObjectMeta, Patch, PatchParams};
use kube::{Api, Client};

use crate::controller::base::FIELD_MANAGER;

/// Lease settings.
#[derive(Debug, Clone)]
pub struct LeaseConfig {
    /// Namespace of the Lease.
    pub namespace: String,
    /// Name of the Lease.
    pub name: String,
    /// This process's identity.
    pub identity: String,
    /// How long a lease lasts without renewal.
    pub duration: Duration,
    /// How often the holder renews (and others retry).
    pub renew_every: Duration,
}

/// What one attempt found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempt {
    /// We hold the lease (acquired or renewed).
    Held,
    /// Someone else holds a live lease.
    HeldBy(String),
}

/// What a candidate last saw of a lease held by someone else, and when (by
/// its own monotonic clock). Expiry is judged from the moment the lease was
/// last seen to change, as client-go does, never from the holder's
/// `renewTime`: the two machines' clocks may disagree by any amount.
#[derive(Debug, Clone, Default)]
pub struct Observed {
    /// Holder, renew time and resource version of the last version seen.
    record: Option<(String, Option<String>, Option<String>)>,
    /// When that version was first seen.
    since: Option<std::time::Instant>,
}

impl Observed {
    /// Records `lease` as seen at `now`; returns the other holder while its
    /// lease is live, `None` when it is ours, free, or has not changed for
    /// its whole duration.
    pub fn held_by_other(
        &mut self,
        lease: &Lease,
        me: &str,
        now: std::time::Instant,
    ) -> Option<String> {
        let spec = lease.spec.as_ref()?;
        let holder = spec.holder_identity.clone()?;
        if holder == me || holder.is_empty() {
            return None;
        }
        let record = (
            holder.clone(),
            spec.renew_time.as_ref().map(|t| t.0.to_string()),
            lease.metadata.resource_version.clone(),
        );
        if self.record.as_ref() != Some(&record) {
            self.record = Some(record);
            self.since = Some(now);
        }
        let secs = spec.lease_duration_seconds.unwrap_or(15).max(1);
        let duration = Duration::from_secs(u64::try_from(secs).unwrap_or(15));
        let since = self.since.unwrap_or(now);
        (now.saturating_duration_since(since) < duration).then_some(holder)
    }
}

/// Field manager of the empty Lease written when none exists. It is not
/// [`FIELD_MANAGER`]: an apply by that manager without the holder fields
/// would remove the holder another process has just written.
const INIT_FIELD_MANAGER: &str = "redpilot-leader-init";

/// One try to acquire or renew the lease; `seen` carries what earlier tries
/// observed of another holder.
pub async fn try_acquire(
    client: &Client,
    cfg: &LeaseConfig,
    seen: &mut Observed,
) -> Result<Attempt, kube::Error> {
    let api: Api<Lease> = Api::namespaced(client.clone(), &cfg.namespace);
    let mut current = api.get_opt(&cfg.name).await?;
    if current.is_none() {
        // An apply without a resourceVersion creates or leaves as is, so two
        // candidates could both "create" the holder. First make sure an
        // empty Lease exists (a no-op if someone was quicker), then take it
        // by compare-and-swap on its resourceVersion like any other.
        let empty = Lease {
            metadata: ObjectMeta {
                name: Some(cfg.name.clone()),
                namespace: Some(cfg.namespace.clone()),
                ..Default::default()
            },
            spec: None,
        };
        let pp = PatchParams::apply(INIT_FIELD_MANAGER);
        current = Some(api.patch(&cfg.name, &pp, &Patch::Apply(&empty)).await?);
    }
    if let Some(holder) = current
        .as_ref()
        .and_then(|l| seen.held_by_other(l, &cfg.identity, std::time::Instant::now()))
    {
        return Ok(Attempt::HeldBy(holder));
    }
    let now = Timestamp::now();
    let previous_spec = current
        .as_ref()
        .and_then(|l| l.spec.clone())
        .unwrap_or_default();
    let ours = previous_spec.holder_identity.as_deref() == Some(cfg.identity.as_str());
    let transitions = previous_spec.lease_transitions.unwrap_or(0) + i32::from(!ours);
    let acquire_time = if ours {
        previous_spec.acquire_time.clone()
    } else {
        Some(MicroTime(now))
    };
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some(cfg.name.clone()),
            namespace: Some(cfg.namespace.clone()),
            resource_version: current.and_then(|l| l.metadata.resource_version),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(cfg.identity.clone()),
            lease_duration_seconds: Some(cfg.duration.as_secs().try_into().unwrap_or(15)),
            acquire_time,
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(transitions),
            ..Default::default()
        }),
    };
    let pp = PatchParams::apply(FIELD_MANAGER).force();
    match api.patch(&cfg.name, &pp, &Patch::Apply(&lease)).await {
        Ok(_) => Ok(Attempt::Held),
        // Someone else wrote first: they hold it now.
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(Attempt::HeldBy("(contended)".into())),
        Err(e) => Err(e),
    }
}

/// Blocks until this process holds the lease; records in `health` whether
/// the API server answers.
pub async fn acquire(client: &Client, cfg: &LeaseConfig, health: &crate::telemetry::Health) {
    let mut last_holder = String::new();
    let mut seen = Observed::default();
    loop {
        let attempt = try_acquire(client, cfg, &mut seen).await;
        health.set_api_reachable(attempt.is_ok());
        match attempt {
            Ok(Attempt::Held) => {
                tracing::info!(lease = %cfg.name, identity = %cfg.identity, "acquired leadership");
                return;
            }
            Ok(Attempt::HeldBy(holder)) => {
                if holder != last_holder {
                    tracing::info!(lease = %cfg.name, holder = %holder, "waiting for leadership");
                    last_holder = holder;
                }
            }
            Err(e) => tracing::warn!(error = %e, "leader election attempt failed"),
        }
        tokio::time::sleep(cfg.renew_every).await;
    }
}

/// How long before the lease would expire a holder that cannot renew stops
/// (room for clock skew between this process and the other candidates).
const STEP_DOWN_MARGIN: Duration = Duration::from_secs(2);

/// Pause between renewal attempts after a failed one.
const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(1);

/// Renews the lease; returns (leadership lost) when another process holds
/// it, or when renewal keeps failing and the lease is about to expire. Each
/// attempt is bounded by the time left, so a hanging API server cannot keep
/// this process reconciling after another one has taken over.
pub async fn keep(client: &Client, cfg: &LeaseConfig, health: &crate::telemetry::Health) {
    let mut last_ok = std::time::Instant::now();
    let mut wait = cfg.renew_every;
    let mut seen = Observed::default();
    loop {
        // Never sleep past the moment to step down.
        let left = renewal_budget(last_ok.elapsed(), cfg).unwrap_or_default();
        tokio::time::sleep(wait.min(left)).await;
        let Some(budget) = renewal_budget(last_ok.elapsed(), cfg) else {
            tracing::error!(
                since = ?last_ok.elapsed(),
                "lease not renewed in time; stepping down before it can expire"
            );
            return;
        };
        let started = std::time::Instant::now();
        // A slow answer that still comes in time counts: the attempt may use
        // all the time left before stepping down, not just one renewal
        // period (on a busy API server a 1 s bound lost a 5 s lease).
        let attempt = tokio::time::timeout(budget, try_acquire(client, cfg, &mut seen));
        let outcome = attempt.await;
        health.set_api_reachable(matches!(outcome, Ok(Ok(_))));
        let failure = match outcome {
            Ok(Ok(Attempt::Held)) => {
                // The lease counts from the renewTime written, taken after
                // `started`.
                last_ok = started;
                wait = cfg.renew_every;
                continue;
            }
            Ok(Ok(Attempt::HeldBy(holder))) => {
                tracing::error!(holder = %holder, "leadership taken by another process");
                return;
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => "no answer in time".to_string(),
        };
        tracing::warn!(error = %failure, "renewing the lease failed");
        wait = RETRY_AFTER_FAILURE;
    }
}

/// How long a renewal attempt may take when the last successful one started
/// `since_renewal` ago; `None` once the holder must step down.
fn renewal_budget(since_renewal: Duration, cfg: &LeaseConfig) -> Option<Duration> {
    let left = cfg
        .duration
        .saturating_sub(since_renewal)
        .saturating_sub(STEP_DOWN_MARGIN);
    (!left.is_zero()).then_some(left)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(holder: &str, renewed_at: i64, duration: i32) -> Lease {
        Lease {
            metadata: Default::default(),
            spec: Some(LeaseSpec {
                holder_identity: Some(holder.into()),
                renew_time: Some(MicroTime(Timestamp::from_second(renewed_at).expect("ts"))),
                lease_duration_seconds: Some(duration),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn holder_steps_down_before_the_lease_can_expire() {
        let cfg = LeaseConfig {
            namespace: "ns".into(),
            name: "l".into(),
            identity: "me".into(),
            duration: Duration::from_secs(15),
            renew_every: Duration::from_secs(5),
        };
        // One failed attempt leaves room for more, each bounded by what is
        // left of the lease minus the margin.
        assert_eq!(
            renewal_budget(Duration::from_secs(5), &cfg),
            Some(Duration::from_secs(8))
        );
        assert_eq!(
            renewal_budget(Duration::from_millis(12_500), &cfg),
            Some(Duration::from_millis(500))
        );
        assert_eq!(renewal_budget(Duration::from_secs(13), &cfg), None);
        assert_eq!(renewal_budget(Duration::from_secs(60), &cfg), None);
    }

    #[test]
    fn expiry_follows_the_local_clock_not_the_holders() {
        let t0 = std::time::Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut seen = Observed::default();
        // A holder whose clock is an hour behind, renewing: live as long as
        // the lease keeps changing.
        let mut l = lease("a", 1_000, 6);
        l.metadata.resource_version = Some("1".into());
        assert_eq!(seen.held_by_other(&l, "b", at(0)), Some("a".into()));
        l.metadata.resource_version = Some("2".into());
        if let Some(spec) = l.spec.as_mut() {
            spec.renew_time = Some(MicroTime(Timestamp::from_second(1_004).expect("ts")));
        }
        assert_eq!(seen.held_by_other(&l, "b", at(5)), Some("a".into()));
        assert_eq!(seen.held_by_other(&l, "b", at(10)), Some("a".into()));
        // No change for the lease's whole duration: expired, whatever its
        // renewTime says (here far in the future).
        assert_eq!(seen.held_by_other(&l, "b", at(11)), None);
        let mut future = lease("a", 4_000_000_000, 6);
        future.metadata.resource_version = Some("3".into());
        assert_eq!(seen.held_by_other(&future, "b", at(12)), Some("a".into()));
        assert_eq!(seen.held_by_other(&future, "b", at(18)), None);
        // Ours, or nobody's: never blocks.
        assert_eq!(seen.held_by_other(&lease("b", 1_000, 15), "b", at(0)), None);
        assert_eq!(seen.held_by_other(&lease("", 1_000, 15), "b", at(0)), None);
    }
}
