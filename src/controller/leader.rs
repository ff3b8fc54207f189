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

use super::FIELD_MANAGER;

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

fn held_by_other_and_live(lease: &Lease, me: &str, now: Timestamp) -> Option<String> {
    let spec = lease.spec.as_ref()?;
    let holder = spec.holder_identity.clone()?;
    if holder == me || holder.is_empty() {
        return None;
    }
    let renewed = spec.renew_time.as_ref()?.0;
    let secs = i64::from(spec.lease_duration_seconds.unwrap_or(15));
    let expires = renewed.checked_add(jiff_secs(secs)).ok()?;
    (expires > now).then_some(holder)
}

fn jiff_secs(secs: i64) -> k8s_openapi::jiff::SignedDuration {
    k8s_openapi::jiff::SignedDuration::from_secs(secs)
}

/// Field manager of the empty Lease written when none exists. It is not
/// [`FIELD_MANAGER`]: an apply by that manager without the holder fields
/// would remove the holder another process has just written.
const INIT_FIELD_MANAGER: &str = "redpilot-leader-init";

/// One try to acquire or renew the lease.
pub async fn try_acquire(client: &Client, cfg: &LeaseConfig) -> Result<Attempt, kube::Error> {
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
    let now = Timestamp::now();
    if let Some(holder) = current
        .as_ref()
        .and_then(|l| held_by_other_and_live(l, &cfg.identity, now))
    {
        return Ok(Attempt::HeldBy(holder));
    }
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

/// Blocks until this process holds the lease.
pub async fn acquire(client: &Client, cfg: &LeaseConfig) {
    let mut last_holder = String::new();
    loop {
        match try_acquire(client, cfg).await {
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
pub async fn keep(client: &Client, cfg: &LeaseConfig) {
    let mut last_ok = std::time::Instant::now();
    let mut wait = cfg.renew_every;
    loop {
        tokio::time::sleep(wait).await;
        let Some(budget) = renewal_budget(last_ok.elapsed(), cfg) else {
            tracing::error!(
                since = ?last_ok.elapsed(),
                "lease not renewed in time; stepping down before it can expire"
            );
            return;
        };
        let started = std::time::Instant::now();
        let attempt = tokio::time::timeout(budget.min(cfg.renew_every), try_acquire(client, cfg));
        let failure = match attempt.await {
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
    fn live_lease_of_another_blocks_until_expiry() {
        let now = Timestamp::from_second(1_010).expect("ts");
        assert_eq!(
            held_by_other_and_live(&lease("a", 1_000, 15), "b", now),
            Some("a".into())
        );
        assert_eq!(
            held_by_other_and_live(&lease("a", 1_000, 5), "b", now),
            None
        );
        assert_eq!(
            held_by_other_and_live(&lease("b", 1_000, 15), "b", now),
            None
        );
        assert_eq!(
            held_by_other_and_live(&lease("", 1_000, 15), "b", now),
            None
        );
    }
}
