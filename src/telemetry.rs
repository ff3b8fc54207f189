//! Logs, the operator's metrics and health endpoints, and traces (OTLP).

use std::sync::atomic::{AtomicU64, Ordering};

use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanProcessor};
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

/// Installs the global tracing subscriber: logs to stdout (the filter comes
/// from `RUST_LOG`, default `info`) and, when `traces` is true and
/// `OTEL_EXPORTER_OTLP_ENDPOINT` (or `..._TRACES_ENDPOINT`) is set, spans to
/// an OTLP collector over HTTP, named by `OTEL_SERVICE_NAME` (default
/// `redpilot`). In JSON logs every line inside a span lists the spans it is
/// in, with the reconcile's `trace_id`. Calling it twice is harmless: the
/// second call is ignored. The returned provider flushes on shutdown.
pub fn init(format: LogFormat, traces: bool) -> Option<SdkTracerProvider> {
    use tracing_subscriber::Layer;
    type Boxed = Box<dyn Layer<tracing_subscriber::Registry> + Send + Sync>;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let mut layers: Vec<Boxed> = Vec::new();
    layers.push(match format {
        LogFormat::Json => fmt::layer()
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(true)
            .with_filter(filter)
            .boxed(),
        LogFormat::Text => {
            // Colour only on a terminal: log files stay plain text.
            let ansi = std::io::IsTerminal::is_terminal(&std::io::stdout());
            fmt::layer().with_ansi(ansi).with_filter(filter).boxed()
        }
    });
    let provider = if traces { otlp_provider() } else { None };
    if let Some(provider) = &provider {
        use opentelemetry::trace::TracerProvider as _;
        // The operator's own spans, and the Kubernetes client's request
        // spans (kube marks them debug) under them.
        let targets = tracing_subscriber::filter::Targets::new()
            .with_target("redpilot", tracing::Level::INFO)
            .with_target("kube_client", tracing::Level::DEBUG);
        layers.push(
            tracing_opentelemetry::layer()
                .with_tracer(provider.tracer("redpilot"))
                .with_filter(targets)
                .boxed(),
        );
    }
    // An already-installed subscriber (tests) is not an error worth reporting.
    drop(tracing_subscriber::registry().with(layers).try_init());
    provider
}

/// Spans handed to the OTLP exporter, exported and dropped (queue full, or
/// the collector did not take them).
static SPANS_EXPORTED: AtomicU64 = AtomicU64::new(0);
static SPANS_DROPPED: AtomicU64 = AtomicU64::new(0);
/// Spans the export queue holds at most; more are dropped, never waited for.
const SPAN_QUEUE: usize = 2048;
/// Spans sent in one export request.
const SPAN_BATCH: usize = 512;

fn otlp_provider() -> Option<SdkTracerProvider> {
    use opentelemetry_otlp::WithExportConfig;
    use opentelemetry_sdk::trace::SpanExporter as _;
    let set = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
    set("OTEL_EXPORTER_OTLP_ENDPOINT").or_else(|| set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))?;
    // The HTTP client goes through rustls with ring, as everything else.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut exporter = match opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_timeout(std::time::Duration::from_secs(5))
        .build()
    {
        Ok(e) => e,
        Err(e) => {
            eprintln!("traces are off: building the OTLP exporter: {e}");
            return None;
        }
    };
    let service = set("OTEL_SERVICE_NAME").unwrap_or_else(|| "redpilot".to_string());
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name(service)
        .build();
    exporter.set_resource(&resource);
    Some(
        SdkTracerProvider::builder()
            .with_span_processor(QueueProcessor::start(exporter))
            .with_resource(resource)
            .build(),
    )
}

/// Hands ended spans to one export thread through a bounded queue: a full
/// queue drops the span (counted) instead of waiting, so a slow or absent
/// collector never slows a reconcile.
#[derive(Debug)]
struct QueueProcessor {
    queue: std::sync::Mutex<Option<std::sync::mpsc::SyncSender<SpanData>>>,
    done: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl QueueProcessor {
    fn start(exporter: opentelemetry_otlp::SpanExporter) -> Self {
        use opentelemetry_sdk::trace::SpanExporter as _;
        use std::sync::mpsc::RecvTimeoutError;
        let (tx, rx) = std::sync::mpsc::sync_channel::<SpanData>(SPAN_QUEUE);
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let finished = done.clone();
        let spawned = std::thread::Builder::new()
            .name("otlp-export".into())
            .spawn(move || {
                let mut open = true;
                while open {
                    let mut batch = Vec::new();
                    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
                    while batch.len() < SPAN_BATCH {
                        let left = deadline.saturating_duration_since(std::time::Instant::now());
                        match rx.recv_timeout(left) {
                            Ok(span) => batch.push(span),
                            Err(RecvTimeoutError::Timeout) => break,
                            Err(RecvTimeoutError::Disconnected) => {
                                open = false;
                                break;
                            }
                        }
                    }
                    if batch.is_empty() {
                        continue;
                    }
                    let n = batch.len() as u64;
                    match futures::executor::block_on(exporter.export(batch)) {
                        Ok(()) => SPANS_EXPORTED.fetch_add(n, Ordering::Relaxed),
                        Err(_) => SPANS_DROPPED.fetch_add(n, Ordering::Relaxed),
                    };
                }
                finished.store(true, Ordering::Relaxed);
            });
        if let Err(e) = spawned {
            eprintln!("traces are off: starting the export thread: {e}");
        }
        QueueProcessor {
            queue: std::sync::Mutex::new(Some(tx)),
            done,
        }
    }
}

impl SpanProcessor for QueueProcessor {
    fn on_start(&self, _span: &mut opentelemetry_sdk::trace::Span, _cx: &opentelemetry::Context) {}

    fn on_end(&self, span: SpanData) {
        let sent = match self.queue.lock() {
            Ok(q) => q.as_ref().is_some_and(|tx| tx.try_send(span).is_ok()),
            Err(_) => false,
        };
        if !sent {
            SPANS_DROPPED.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn force_flush(&self) -> opentelemetry_sdk::error::OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(
        &self,
        timeout: std::time::Duration,
    ) -> opentelemetry_sdk::error::OTelSdkResult {
        if let Ok(mut q) = self.queue.lock() {
            q.take();
        }
        let until = std::time::Instant::now() + timeout;
        while !self.done.load(Ordering::Relaxed) && std::time::Instant::now() < until {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        Ok(())
    }
}

/// The trace id of `span` (hex), when traces are on.
pub fn trace_id(span: &tracing::Span) -> Option<String> {
    use opentelemetry::trace::TraceContextExt as _;
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;
    let cx = span.context();
    let sc = cx.span().span_context().clone();
    sc.is_valid().then(|| sc.trace_id().to_string())
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
    /// Automatic failovers by result (`promoted`, `handed_over` from a
    /// primary whose pod was deleted, `error`).
    pub failovers: prometheus::IntCounterVec,
    /// Backups that ended, by result (`completed`, `failed`).
    pub backups: prometheus::IntCounterVec,
    /// Planned switchovers, by result (`done`, `error`).
    pub switchovers: prometheus::IntCounterVec,
    /// Version upgrades that ended, by result (`succeeded`, `rolled_back`).
    pub upgrades: prometheus::IntCounterVec,
    /// Memory autopilot decisions, by direction and result.
    pub autopilot: prometheus::IntCounterVec,
    /// Servers looked at for tuning advice, by result (`ok`, `failed`).
    pub tuning_looks: prometheus::IntCounterVec,
    /// Reconciles running now.
    pub in_flight: prometheus::IntGauge,
    /// Periodic passes that ended after reading only what the last full
    /// pass read past the caches (see `controller::redis::light`).
    pub light_passes: prometheus::IntCounter,
    /// The Redis controller's work queue (the depth series are computed
    /// from it at each scrape).
    pub queue: crate::controller::queue::Queue,
    /// How long each reconcile waited in the work queue, in seconds.
    pub queue_wait: prometheus::Histogram,
    /// The watch caches the per-object series are computed from.
    sources: std::sync::Mutex<Vec<StateSource>>,
}

/// The caches of one watched scope, read at each scrape.
pub struct StateSource {
    /// The Redis.
    pub redis: kube::runtime::reflector::Store<
        crate::controller::cache::Frozen<crate::api::v1alpha1::Redis>,
    >,
    /// The RedisBackups.
    pub backups: kube::runtime::reflector::Store<crate::api::v1alpha1::RedisBackup>,
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
        let queue_wait = prometheus::Histogram::with_opts(
            HistogramOpts::new(
                "redpilot_workqueue_wait_seconds",
                "How long a Redis waited in the work queue before its reconcile started \
                 (from the trigger or the requeue time)",
            )
            .buckets(vec![
                0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
            ]),
        )?;
        registry.register(Box::new(queue_wait.clone()))?;
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
        let counter =
            |name: &str, help: &str, labels: &[&str]| -> Result<IntCounterVec, prometheus::Error> {
                let c = IntCounterVec::new(Opts::new(name, help), labels)?;
                registry.register(Box::new(c.clone()))?;
                Ok(c)
            };
        let switchovers = counter(
            "redpilot_switchovers_total",
            "Planned switchovers (requested, or for a restart), by result",
            &["result"],
        )?;
        let upgrades = counter(
            "redpilot_upgrades_total",
            "Version upgrades that ended, by result",
            &["result"],
        )?;
        let autopilot = counter(
            "redpilot_autopilot_decisions_total",
            "Memory and shard autopilot decisions, by direction and result",
            &["direction", "result"],
        )?;
        let tuning_looks = counter(
            "redpilot_tuning_looks_total",
            "Servers looked at for tuning advice (INFO, CONFIG, key sampling), by result",
            &["result"],
        )?;
        let in_flight = IntGauge::new("redpilot_reconciles_in_flight", "Reconciles running now")?;
        registry.register(Box::new(in_flight.clone()))?;
        let light_passes = prometheus::IntCounter::new(
            "redpilot_light_passes_total",
            "Periodic passes of a calm, unchanged Redis that re-read only its Secrets' versions",
        )?;
        registry.register(Box::new(light_passes.clone()))?;
        let build = prometheus::IntGaugeVec::new(
            Opts::new("redpilot_build_info", "The operator's build"),
            &["version"],
        )?;
        registry.register(Box::new(build.clone()))?;
        build.with_label_values(&[crate::VERSION]).set(1);
        // Every bounded label value starts at 0, so a series exists (and a
        // rate is 0, not absent) before the first event of its kind.
        for (c, values) in [
            (&reconciliations, &["ok", "error"][..]),
            (&failovers, &["promoted", "handed_over", "error"][..]),
            (&backups, &["completed", "failed"][..]),
            (&switchovers, &["done", "error"][..]),
            (&upgrades, &["succeeded", "rolled_back"][..]),
            (&tuning_looks, &["ok", "failed"][..]),
            (
                &reconcile_errors,
                &[
                    "kubernetes",
                    "redis_auth",
                    "redis_unreachable",
                    "redis",
                    "conflict",
                    "secret",
                    "internal",
                    "backup_store",
                ][..],
            ),
        ] {
            for v in values {
                c.with_label_values(&[v]);
            }
        }
        for d in ["grow", "shrink", "at_maximum"] {
            for r in ["applied", "refused"] {
                autopilot.with_label_values(&[d, r]);
            }
        }
        // The shard autopilot's (Cluster mode).
        for (d, r) in [
            ("add_shards", "applied"),
            ("remove_shard", "applied"),
            ("shards_at_maximum", "refused"),
        ] {
            autopilot.with_label_values(&[d, r]);
        }
        Ok(Metrics {
            switchovers,
            tuning_looks,
            upgrades,
            autopilot,
            in_flight,
            light_passes,
            queue: crate::controller::queue::Queue::default(),
            queue_wait,
            sources: std::sync::Mutex::new(Vec::new()),
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

    /// Adds the caches of one watched scope to the per-object series.
    pub fn add_source(&self, source: StateSource) {
        if let Ok(mut s) = self.sources.lock() {
            s.push(source);
        }
    }

    /// The text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let encoder = prometheus::TextEncoder::new();
        if let Err(e) = encoder.encode_utf8(&self.registry.gather(), &mut out) {
            tracing::warn!(error = %e, "encoding metrics");
        }
        let (mut redis, mut backups) = (Vec::new(), Vec::new());
        if let Ok(sources) = self.sources.lock() {
            for s in sources.iter() {
                // Decoded for the scrape only (the cache holds them frozen).
                redis.extend(
                    s.redis
                        .state()
                        .iter()
                        .filter_map(|r| r.thaw())
                        .map(std::sync::Arc::new),
                );
                backups.extend(s.backups.state());
            }
        }
        let mut state = crate::exporter::render::Exposition::default();
        crate::controller::insights::state::series(&mut state, &redis, &backups);
        let depth = self.queue.depth(std::time::Instant::now());
        state.add(
            "redpilot_workqueue_depth",
            "gauge",
            "Redis whose reconcile is due and has not started (behind busy workers, its own running reconcile, or the debounce)",
            &[],
            depth.waiting as f64,
        );
        state.add(
            "redpilot_workqueue_scheduled",
            "gauge",
            "Redis with a reconcile requeued for later",
            &[],
            depth.scheduled as f64,
        );
        state.add(
            "redpilot_workqueue_oldest_wait_seconds",
            "gauge",
            "How long the longest-waiting Redis in the work queue has waited",
            &[],
            depth.oldest.as_secs_f64(),
        );
        for (result, n) in [("exported", &SPANS_EXPORTED), ("dropped", &SPANS_DROPPED)] {
            state.add(
                "redpilot_trace_spans_total",
                "counter",
                "Trace spans handed to the OTLP exporter, by result (dropped: the queue was full or the collector did not take them)",
                &[("result", result)],
                n.load(Ordering::Relaxed) as f64,
            );
        }
        out.push_str(&state.text());
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
