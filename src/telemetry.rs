//! Logging and, later, metrics and traces.

use tracing_subscriber::{EnvFilter, fmt, prelude::*};

/// Output format of the operator's logs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One JSON object per line (the default: what log pipelines expect).
    #[default]
    Json,
    /// Human-readable lines, for local runs.
    Text,
}

/// Installs the global tracing subscriber. The filter comes from `RUST_LOG`
/// (default `info`). Calling it twice is harmless: the second call is ignored.
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let registry = tracing_subscriber::registry().with(filter);
    let result = match format {
        LogFormat::Json => registry
            .with(
                fmt::layer()
                    .json()
                    .flatten_event(true)
                    .with_current_span(false),
            )
            .try_init(),
        LogFormat::Text => {
            // Colour only on a terminal: log files stay plain text.
            let ansi = std::io::IsTerminal::is_terminal(&std::io::stdout());
            registry.with(fmt::layer().with_ansi(ansi)).try_init()
        }
    };
    // An already-installed subscriber (tests) is not an error worth reporting.
    drop(result);
}

/// The operator's Prometheus metrics. Labels are bounded: outcomes, error
/// categories and request verbs, never object names.
pub struct Metrics {
    /// The registry served at `/metrics`.
    pub registry: prometheus::Registry,
    /// Reconciliations by outcome (`ok`, `error`).
    pub reconciliations: prometheus::IntCounterVec,
    /// Failed reconciliations by error category.
    pub reconcile_errors: prometheus::IntCounterVec,
    /// Reconcile duration in seconds.
    pub reconcile_duration: prometheus::Histogram,
    /// Kubernetes API requests made by reconciles, by verb.
    pub kube_requests: prometheus::IntCounterVec,
    /// Whether this process holds the leader lease (0 or 1).
    pub leader: prometheus::IntGauge,
    /// Automatic failovers by result (`promoted`, `error`).
    pub failovers: prometheus::IntCounterVec,
    /// Backups that ended, by result (`completed`, `failed`).
    pub backups: prometheus::IntCounterVec,
}

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> Result<Self, prometheus::Error> {
        use prometheus::{HistogramOpts, IntCounterVec, IntGauge, Opts};
        let registry = prometheus::Registry::new();
        let reconciliations = IntCounterVec::new(
            Opts::new(
                "redpilot_reconciliations_total",
                "Reconciliations by outcome",
            ),
            &["result"],
        )?;
        let reconcile_errors = IntCounterVec::new(
            Opts::new(
                "redpilot_reconcile_errors_total",
                "Failed reconciliations by error category",
            ),
            &["category"],
        )?;
        let reconcile_duration = prometheus::Histogram::with_opts(
            HistogramOpts::new("redpilot_reconcile_duration_seconds", "Reconcile duration")
                .buckets(vec![0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0]),
        )?;
        let kube_requests = IntCounterVec::new(
            Opts::new(
                "redpilot_kube_requests_total",
                "Kubernetes API requests made by reconciles",
            ),
            &["verb"],
        )?;
        let leader = IntGauge::new(
            "redpilot_leader",
            "1 when this process holds the leader lease",
        )?;
        registry.register(Box::new(reconciliations.clone()))?;
        registry.register(Box::new(reconcile_errors.clone()))?;
        registry.register(Box::new(reconcile_duration.clone()))?;
        registry.register(Box::new(kube_requests.clone()))?;
        let failovers = IntCounterVec::new(
            Opts::new(
                "redpilot_failovers_total",
                "Automatic failovers of a lost primary, by result",
            ),
            &["result"],
        )?;
        registry.register(Box::new(leader.clone()))?;
        registry.register(Box::new(failovers.clone()))?;
        let backups = IntCounterVec::new(
            Opts::new("redpilot_backups_total", "Backups that ended, by result"),
            &["result"],
        )?;
        registry.register(Box::new(backups.clone()))?;
        Ok(Metrics {
            registry,
            reconciliations,
            reconcile_errors,
            reconcile_duration,
            kube_requests,
            leader,
            failovers,
            backups,
        })
    }

    /// Counts one Kubernetes request of `verb`.
    pub fn kube(&self, verb: &str) {
        self.kube_requests.with_label_values(&[verb]).inc();
    }

    /// The text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let encoder = prometheus::TextEncoder::new();
        if let Err(e) = encoder.encode_utf8(&self.registry.gather(), &mut out) {
            tracing::warn!(error = %e, "encoding metrics");
        }
        out
    }
}

/// What `/readyz` answers from: ready means the API server answered the
/// last leader-election attempt, and, once this process leads, every watch
/// cache holds its initial list. A standby that reaches the API is ready
/// (it can take over at once).
#[derive(Debug, Default)]
pub struct Health {
    api_reachable: std::sync::atomic::AtomicBool,
    leading: std::sync::atomic::AtomicBool,
    caches_pending: std::sync::atomic::AtomicUsize,
}

impl Health {
    /// Records whether the last request to the API server got an answer.
    pub fn set_api_reachable(&self, ok: bool) {
        self.api_reachable
            .store(ok, std::sync::atomic::Ordering::Relaxed);
    }
    /// This process now leads, with `scopes` sets of watch caches to sync.
    pub fn start_leading(&self, scopes: usize) {
        use std::sync::atomic::Ordering::Relaxed;
        self.caches_pending.store(scopes, Relaxed);
        self.leading.store(true, Relaxed);
    }
    /// One set of watch caches holds its initial list.
    pub fn caches_synced(&self) {
        use std::sync::atomic::Ordering::Relaxed;
        let _ = self
            .caches_pending
            .fetch_update(Relaxed, Relaxed, |n| Some(n.saturating_sub(1)));
    }
    /// `Ok` when ready, else why not.
    pub fn readiness(&self) -> Result<(), &'static str> {
        use std::sync::atomic::Ordering::Relaxed;
        if !self.api_reachable.load(Relaxed) {
            return Err("the API server did not answer the last leader-election request");
        }
        if self.leading.load(Relaxed) && self.caches_pending.load(Relaxed) > 0 {
            return Err("leading, but the watch caches are not synced yet");
        }
        Ok(())
    }
}

/// Serves `/metrics`, `/healthz` and `/readyz` on `listener` until the task is
/// dropped.
pub async fn serve_http(
    listener: tokio::net::TcpListener,
    metrics: std::sync::Arc<Metrics>,
    health: std::sync::Arc<Health>,
) -> std::io::Result<()> {
    use axum::http::StatusCode;
    use axum::routing::get;
    let app = axum::Router::new()
        .route(
            "/metrics",
            get(move || {
                let m = metrics.clone();
                async move { m.render() }
            }),
        )
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(move || {
                let h = health.clone();
                async move {
                    match h.readiness() {
                        Ok(()) => (StatusCode::OK, "ok".to_string()),
                        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, why.to_string()),
                    }
                }
            }),
        );
    axum::serve(listener, app).await
}

#[cfg(test)]
mod tests {
    use super::Health;

    #[test]
    fn readiness_needs_the_api_and_synced_caches_when_leading() {
        let h = Health::default();
        assert!(h.readiness().is_err(), "no API answer yet");
        h.set_api_reachable(true);
        assert_eq!(h.readiness(), Ok(()), "a standby that reaches the API");
        h.start_leading(2);
        assert!(h.readiness().is_err());
        h.caches_synced();
        assert!(h.readiness().is_err(), "one of two scopes synced");
        h.caches_synced();
        assert_eq!(h.readiness(), Ok(()));
        h.set_api_reachable(false);
        assert!(h.readiness().is_err());
    }
}
