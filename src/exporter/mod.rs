//! `redpilot exporter`: the Prometheus metrics sidecar of every Redis pod.
//!
//! Each scrape of `/metrics` asks the server in the same pod for `INFO ALL`
//! over one kept connection and answers with [`render`]'s exposition plus
//! the exporter's own series (`redis_up`, scrape duration and count); a
//! node in cluster mode adds its `CLUSTER INFO` (`redis_cluster_*`). A
//! server that does not answer within the bound gives `redis_up 0`, never a
//! hung scrape. The password is read from the mounted server-auth Secret at
//! each (re)connection, so a live rotation is followed without a restart
//! (the current password first, then the one being retired).

pub mod render;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::Mutex;

use crate::controller::names::EXPORTER_USER;
use crate::redis::{ConnectOptions, Endpoint, Node, TlsOptions};
use render::Exposition;

/// Where the exporter finds its server and password.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The server (normally the same pod's, 127.0.0.1:6379).
    pub endpoint: Endpoint,
    /// Directory holding `password` (and during a rotation `previous`).
    pub password_dir: Option<PathBuf>,
    /// A fixed password when no directory is given.
    pub password: Option<String>,
    /// Bound of the connection and of each command.
    pub timeout: Duration,
    /// TLS to the pod's own loopback without checking the certificate
    /// (the sidecar's case: see [`TlsOptions::unverified`]).
    pub tls_loopback: bool,
    /// A directory with `tls.crt` and `tls.key`, presented to a server
    /// that asks clients for a certificate; read at each connection, so a
    /// renewed certificate is followed.
    pub tls_client_dir: Option<PathBuf>,
}

impl Settings {
    /// The server at `host:port`; the password from the files of
    /// `password_dir`, or else from `REDIS_PASSWORD`.
    pub fn new(host: &str, port: u16, password_dir: Option<PathBuf>, timeout: Duration) -> Self {
        Settings {
            endpoint: Endpoint::new(host, port),
            password_dir,
            password: std::env::var("REDIS_PASSWORD")
                .ok()
                .filter(|p| !p.is_empty()),
            timeout,
            tls_loopback: false,
            tls_client_dir: None,
        }
    }

    /// Connects with TLS to the pod's own loopback, checking nothing.
    pub fn with_tls_loopback(mut self, on: bool) -> Self {
        self.tls_loopback = on;
        self
    }

    /// Presents the certificate in `dir` (`tls.crt`, `tls.key`).
    pub fn with_tls_client_dir(mut self, dir: Option<PathBuf>) -> Self {
        self.tls_client_dir = dir;
        self
    }
}

/// Runs the exporter until it fails: one thread (a scrape is one `INFO`,
/// and the sidecar stays small), `/metrics` on `listen`. What both
/// `redpilot-exporter` and `redpilot exporter` run.
pub fn run(listen: &str, settings: Settings) -> std::io::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(listen).await?;
        tracing::info!(listen, "exporter serving /metrics");
        serve(listener, Arc::new(Exporter::new(settings))).await
    })
}

/// How many scrapes may wait for the one in progress; more are answered
/// `503` at once rather than queued without bound behind a slow server.
pub const MAX_WAITING: usize = 4;

/// The exporter's state across scrapes.
pub struct Exporter {
    settings: Settings,
    conn: Mutex<Option<Node>>,
    /// The last answer and when it came: a scrape that waited for another
    /// one takes its answer if it came after the wait began (single flight:
    /// scrapes piled up behind a slow server cost one `INFO`, not one each).
    last: std::sync::Mutex<Option<(Instant, String)>>,
    waiting: std::sync::atomic::AtomicUsize,
    scrapes: AtomicU64,
    errors: AtomicU64,
}

/// A scrape refused because [`MAX_WAITING`] others already wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Busy;

impl Exporter {
    /// An exporter that connects on its first scrape.
    pub fn new(settings: Settings) -> Self {
        Exporter {
            settings,
            conn: Mutex::new(None),
            last: std::sync::Mutex::new(None),
            waiting: std::sync::atomic::AtomicUsize::new(0),
            scrapes: AtomicU64::new(0),
            errors: AtomicU64::new(0),
        }
    }

    /// The credentials to try, in order: the sidecar's own user
    /// (`redpilot-exporter`, whose password the operator keeps in the
    /// mounted Secret's `exporter-password`), then the default user's
    /// current and previous passwords (a server started before the
    /// sidecar's user was added to it).
    fn passwords(&self) -> Vec<(Option<&'static str>, String)> {
        let Some(dir) = &self.settings.password_dir else {
            return self
                .settings
                .password
                .clone()
                .into_iter()
                .map(|p| (None, p))
                .collect();
        };
        let mut out = Vec::new();
        for (f, user) in [
            ("exporter-password", Some(EXPORTER_USER)),
            ("password", None),
            ("previous", None),
        ] {
            let path = dir.join(f);
            match std::fs::read_to_string(&path) {
                Ok(p) => out.push((user, p.trim_end_matches(['\r', '\n']).to_string())),
                // `previous` exists only during a rotation, and
                // `exporter-password` not in a Secret of an older release.
                Err(e) if f != "password" && e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "reading the password")
                }
            }
        }
        out.retain(|(_, p)| !p.is_empty());
        out
    }

    async fn connect(&self) -> crate::redis::Result<Node> {
        let t = self.settings.timeout;
        let mut last = None;
        let mut candidates = self.passwords();
        if candidates.is_empty() {
            candidates.push((None, String::new()));
        }
        let mut tls = self.settings.tls_loopback.then(TlsOptions::loopback);
        if let (Some(tls), Some(dir)) = (tls.as_mut(), &self.settings.tls_client_dir) {
            let read = |file: &str| {
                std::fs::read(dir.join(file)).map_err(|e| {
                    crate::redis::Error::Config(format!(
                        "reading {}: {e}",
                        dir.join(file).display()
                    ))
                })
            };
            tls.client_cert_pem = Some(read("tls.crt")?);
            tls.client_key_pem = Some(read("tls.key")?);
        }
        for (user, password) in candidates {
            let mut opts = ConnectOptions::default().with_timeouts(t, t);
            if let Some(tls) = &tls {
                opts = opts.with_tls(tls.clone());
            }
            match user {
                Some(u) => opts = opts.with_user(u, password),
                None if !password.is_empty() => opts = opts.with_password(password),
                None => {}
            }
            match Node::connect(&self.settings.endpoint, &opts).await {
                Ok(node) => return Ok(node),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or(crate::redis::Error::Timeout {
            endpoint: self.settings.endpoint.to_string(),
            operation: "connect",
            after: t,
        }))
    }

    /// `INFO ALL`, reconnecting once when the kept connection failed. At
    /// most one runs at a time; a caller that waited for another takes its
    /// answer when it came after the wait began, and waits no longer than
    /// the timeout.
    async fn info(&self) -> crate::redis::Result<String> {
        let asked = Instant::now();
        let mut guard = match tokio::time::timeout(self.settings.timeout, self.conn.lock()).await {
            Ok(g) => g,
            Err(_) => {
                return Err(crate::redis::Error::Timeout {
                    endpoint: self.settings.endpoint.to_string(),
                    operation: "waiting for the scrape in progress",
                    after: self.settings.timeout,
                });
            }
        };
        if let Ok(last) = self.last.lock()
            && let Some((at, text)) = last.as_ref()
            && *at >= asked
        {
            return Ok(text.clone());
        }
        let text = self.info_locked(&mut guard).await?;
        if let Ok(mut last) = self.last.lock() {
            *last = Some((Instant::now(), text.clone()));
        }
        Ok(text)
    }

    async fn info_locked(&self, guard: &mut Option<Node>) -> crate::redis::Result<String> {
        for attempt in 0..2 {
            if guard.is_none() {
                *guard = Some(self.connect().await?);
            }
            let Some(node) = guard.as_mut() else {
                continue;
            };
            match node
                .query::<String>("INFO", redis::cmd("INFO").arg("ALL"))
                .await
            {
                Ok(mut text) => {
                    if cluster_enabled(&text) {
                        // A node in cluster mode: its slots and state too.
                        match node
                            .query::<String>("CLUSTER INFO", redis::cmd("CLUSTER").arg("INFO"))
                            .await
                        {
                            Ok(cluster) => {
                                text.push_str("\r\n# ClusterInfo\r\n");
                                text.push_str(&cluster);
                            }
                            Err(e) => tracing::warn!(
                                category = crate::controller::error::redis_category(&e),
                                error = %e,
                                "CLUSTER INFO failed; the cluster series are left out of this scrape"
                            ),
                        }
                    }
                    return Ok(text);
                }
                Err(e) => {
                    *guard = None;
                    if attempt == 1 {
                        return Err(e);
                    }
                }
            }
        }
        Err(crate::redis::Error::Timeout {
            endpoint: self.settings.endpoint.to_string(),
            operation: "INFO",
            after: self.settings.timeout,
        })
    }

    /// One scrape, unless [`MAX_WAITING`] others already wait. The count
    /// is given back when the scrape ends or is dropped (a client that hung
    /// up), never left behind.
    pub async fn try_scrape(&self) -> Result<String, Busy> {
        struct Waiting<'a>(&'a std::sync::atomic::AtomicUsize);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::SeqCst);
            }
        }
        let before = self.waiting.fetch_add(1, Ordering::SeqCst);
        let _waiting = Waiting(&self.waiting);
        if before >= MAX_WAITING {
            return Err(Busy);
        }
        Ok(self.scrape().await)
    }

    /// One scrape: the exposition text.
    pub async fn scrape(&self) -> String {
        let start = Instant::now();
        self.scrapes.fetch_add(1, Ordering::Relaxed);
        let mut out = Exposition::default();
        let up = match self.info().await {
            Ok(text) => {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs_f64())
                    .unwrap_or(0.0);
                render::info_samples(&mut out, &text, now);
                true
            }
            Err(e) => {
                self.errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(category = crate::controller::error::redis_category(&e), error = %e, "scrape failed");
                false
            }
        };
        out.add(
            "redis_up",
            "gauge",
            "1 when the server answered the last scrape",
            &[],
            if up { 1.0 } else { 0.0 },
        );
        out.add(
            "redis_exporter_scrapes_total",
            "counter",
            "Scrapes served",
            &[],
            self.scrapes.load(Ordering::Relaxed) as f64,
        );
        out.add(
            "redis_exporter_scrape_errors_total",
            "counter",
            "Scrapes whose server did not answer",
            &[],
            self.errors.load(Ordering::Relaxed) as f64,
        );
        out.add(
            "redis_exporter_last_scrape_error",
            "gauge",
            "1 when the last scrape failed",
            &[],
            if up { 0.0 } else { 1.0 },
        );
        out.add(
            "redis_exporter_build_info",
            "gauge",
            "The exporter's build",
            &[("version", crate::VERSION), ("exporter", "redpilot")],
            1.0,
        );
        out.add(
            "redis_exporter_last_scrape_duration_seconds",
            "gauge",
            "Duration of the last scrape",
            &[],
            start.elapsed().as_secs_f64(),
        );
        out.text()
    }
}

/// Whether an `INFO` reply comes from a node in cluster mode.
fn cluster_enabled(info: &str) -> bool {
    info.lines()
        .any(|l| l.trim_end_matches('\r') == "cluster_enabled:1")
}

/// Serves `/metrics` (and `/healthz`) on `listener` until the task ends.
pub async fn serve(
    listener: tokio::net::TcpListener,
    exporter: Arc<Exporter>,
) -> std::io::Result<()> {
    use axum::routing::get;
    let app = axum::Router::new()
        .route(
            "/metrics",
            get(move || {
                let e = exporter.clone();
                async move {
                    match e.try_scrape().await {
                        Ok(text) => (
                            axum::http::StatusCode::OK,
                            [(
                                axum::http::header::CONTENT_TYPE,
                                "text/plain; version=0.0.4; charset=utf-8",
                            )],
                            text,
                        ),
                        Err(Busy) => (
                            axum::http::StatusCode::SERVICE_UNAVAILABLE,
                            [(
                                axum::http::header::CONTENT_TYPE,
                                "text/plain; charset=utf-8",
                            )],
                            format!("{MAX_WAITING} scrapes already wait for the server\n"),
                        ),
                    }
                }
            }),
        )
        .route("/healthz", get(|| async { "ok" }));
    axum::serve(listener, app).await
}
