//! The operator: controllers, their shared context, leader election.

pub mod images;
pub mod leader;
pub mod redis;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};

use crate::api::v1alpha1::Redis;
use crate::telemetry::Metrics;

/// The field manager of every write the operator makes.
pub const FIELD_MANAGER: &str = "redpilot";

/// Why a reconcile failed. Each variant maps to a bounded [`Error::category`]
/// used as a metric label and an event reason.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The Kubernetes API refused or failed a request.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// A Redis instance could not be observed or changed.
    #[error("redis: {0}")]
    Redis(#[from] crate::redis::Error),
    /// An object we would create exists and belongs to someone else.
    #[error(
        "{kind} {name} already exists and is not managed by this Redis; refusing to overwrite it"
    )]
    Conflict {
        /// Kind of the object.
        kind: &'static str,
        /// Its name.
        name: String,
    },
    /// The auth Secret named by the spec is missing or lacks its key.
    #[error("secret {name}: {reason}")]
    Secret {
        /// Secret name.
        name: String,
        /// What is wrong (never the value).
        reason: String,
    },
    /// An object could not be serialised.
    #[error("serialising {0}: {1}")]
    Serialize(&'static str, serde_json::Error),
    /// The OS random source failed.
    #[error("generating a password: {0}")]
    Random(String),
    /// The object lacks a namespace or name.
    #[error("object without {0}")]
    Incomplete(&'static str),
}

impl Error {
    /// A bounded, stable category for metrics and events.
    pub fn category(&self) -> &'static str {
        match self {
            Error::Kube(_) => "kubernetes",
            Error::Redis(e) => match e.category() {
                crate::redis::ErrorCategory::Auth => "redis_auth",
                crate::redis::ErrorCategory::Timeout | crate::redis::ErrorCategory::Connection => {
                    "redis_unreachable"
                }
                _ => "redis",
            },
            Error::Conflict { .. } => "conflict",
            Error::Secret { .. } => "secret",
            Error::Serialize(..) => "internal",
            Error::Random(_) => "internal",
            Error::Incomplete(_) => "internal",
        }
    }
}

/// Shared by every reconcile.
pub struct Context {
    /// The API client.
    pub client: Client,
    /// Publishes events.
    pub recorder: Recorder,
    /// Prometheus metrics.
    pub metrics: Arc<Metrics>,
    /// Engine images from `RELATED_IMAGE_*`.
    pub images: images::Images,
    /// Consecutive failures per object, for exponential backoff.
    failures: Mutex<HashMap<ObjectRef<Redis>, u32>>,
}

impl Context {
    /// A context for `client`.
    pub fn new(client: Client, metrics: Arc<Metrics>, images: images::Images) -> Self {
        let reporter = Reporter {
            controller: "redpilot".into(),
            instance: std::env::var("POD_NAME").ok(),
        };
        Context {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            metrics,
            images,
            failures: Mutex::new(HashMap::new()),
        }
    }

    fn record_success(&self, obj: &ObjectRef<Redis>) {
        if let Ok(mut f) = self.failures.lock() {
            f.remove(obj);
        }
    }

    /// Backoff for the next retry of `obj`: 2s, 4s, 8s ... capped at 5 min.
    fn next_backoff(&self, obj: &ObjectRef<Redis>) -> Duration {
        let n = match self.failures.lock() {
            Ok(mut f) => {
                let n = f.entry(obj.clone()).or_insert(0);
                *n = n.saturating_add(1);
                *n
            }
            Err(_) => 1,
        };
        backoff(n)
    }
}

/// Exponential backoff for the `n`th consecutive failure (n >= 1).
pub fn backoff(n: u32) -> Duration {
    let secs = 2u64.saturating_pow(n.clamp(1, 16)).min(300);
    Duration::from_secs(secs)
}

/// Which namespaces to watch, from `WATCH_NAMESPACE` (comma-separated; empty
/// or unset means all).
pub fn watch_namespaces(value: Option<&str>) -> Vec<String> {
    value
        .unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect()
}

fn error_policy(obj: Arc<Redis>, err: &Error, ctx: Arc<Context>) -> Action {
    let oref = ObjectRef::from_obj(obj.as_ref());
    let wait = ctx.next_backoff(&oref);
    ctx.metrics
        .reconcile_errors
        .with_label_values(&[err.category()])
        .inc();
    tracing::warn!(
        redis = %oref,
        category = err.category(),
        error = %err,
        retry_in_s = wait.as_secs(),
        "reconcile failed"
    );
    Action::requeue(wait)
}

async fn reconcile(obj: Arc<Redis>, ctx: Arc<Context>) -> Result<Action, Error> {
    let oref = ObjectRef::from_obj(obj.as_ref());
    let timer = std::time::Instant::now();
    let result = redis::reconcile(obj, ctx.clone()).await;
    ctx.metrics
        .reconcile_duration
        .observe(timer.elapsed().as_secs_f64());
    let outcome = if result.is_ok() { "ok" } else { "error" };
    ctx.metrics
        .reconciliations
        .with_label_values(&[outcome])
        .inc();
    if result.is_ok() {
        ctx.record_success(&oref);
    }
    result
}

/// Runs the Redis controller over `namespaces` (all when empty) until the
/// process is asked to stop.
pub async fn run_controllers(
    client: Client,
    namespaces: Vec<String>,
    metrics: Arc<Metrics>,
    images: images::Images,
) {
    let ctx = Arc::new(Context::new(client.clone(), metrics, images));
    let scopes: Vec<Option<String>> = if namespaces.is_empty() {
        vec![None]
    } else {
        namespaces.into_iter().map(Some).collect()
    };
    let runs = scopes.into_iter().map(|ns| {
        let ctx = ctx.clone();
        let client = client.clone();
        async move {
            fn api<K>(client: &Client, ns: &Option<String>) -> Api<K>
            where
                K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
                <K as kube::Resource>::DynamicType: Default,
            {
                match ns {
                    Some(ns) => Api::namespaced(client.clone(), ns),
                    None => Api::all(client.clone()),
                }
            }
            let managed =
                watcher::Config::default().labels("app.kubernetes.io/managed-by=redpilot");
            let pods: Api<Pod> = api(&client, &ns);
            Controller::new(api::<Redis>(&client, &ns), watcher::Config::default())
                .owns(api::<StatefulSet>(&client, &ns), managed.clone())
                .owns(api::<Service>(&client, &ns), managed.clone())
                .owns(api::<ConfigMap>(&client, &ns), managed.clone())
                .owns(api::<Secret>(&client, &ns), managed.clone())
                .owns(api::<PodDisruptionBudget>(&client, &ns), managed.clone())
                // Pods belong to the StatefulSet; map them to their Redis by
                // the instance label so readiness changes trigger a reconcile.
                .watches(pods, managed, |pod: Pod| {
                    let name = pod.labels().get(redis::build::INSTANCE_LABEL)?.clone();
                    let ns = pod.namespace()?;
                    Some(ObjectRef::<Redis>::new(&name).within(&ns))
                })
                .with_config(ControllerConfig::default().debounce(Duration::from_millis(500)))
                .shutdown_on_signal()
                .run(reconcile, error_policy, ctx)
                .for_each(|res| async move {
                    match res {
                        Ok((obj, _)) => tracing::debug!(redis = %obj, "reconciled"),
                        Err(e) => tracing::debug!(error = %e, "controller event"),
                    }
                })
                .await;
        }
    });
    futures::future::join_all(runs).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watch_namespaces_parse() {
        assert!(watch_namespaces(None).is_empty());
        assert!(watch_namespaces(Some("")).is_empty());
        assert_eq!(watch_namespaces(Some("a, b,,c ")), vec!["a", "b", "c"]);
    }

    #[test]
    fn backoff_grows_and_caps() {
        assert_eq!(backoff(1), Duration::from_secs(2));
        assert_eq!(backoff(2), Duration::from_secs(4));
        assert_eq!(backoff(5), Duration::from_secs(32));
        assert_eq!(backoff(30), Duration::from_secs(300));
    }
}
