//! A writer that goes through whatever the operator does to a Redis and
//! counts what it was promised. It writes unique keys to the primary named
//! in `status.primary` (re-read from the API on every reconnect), and counts
//! a write as acknowledged only when the server answered OK *and* `WAIT`
//! reported at least one replica holding it (`min_replicas`; 0 for a
//! Standalone): with asynchronous replication, that is the promise a
//! primary's crash must not break. Writes answered OK but not yet replicated
//! are counted apart.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client};
use redpilot::redis::{ConnectOptions, Endpoint, Node};

use super::operator::{pod_ip, redis_api, redis_pods};

/// What the writer saw.
#[derive(Debug, Default, Clone)]
pub struct Tally {
    /// Keys acknowledged (OK and replicated to `min_replicas`).
    pub acked: Vec<String>,
    /// Writes answered OK that `WAIT` did not confirm in time.
    pub unreplicated: u64,
    /// Writes refused or failed (no promise made).
    pub failed: u64,
}

/// A running writer; [`Writer::stop`] returns its tally.
pub struct Writer {
    stop: Arc<AtomicBool>,
    tally: Arc<Mutex<Tally>>,
    written: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Writer {
    /// Starts writing `prefix:N` keys to Redis `name` in `ns`.
    pub fn start(
        client: &Client,
        ns: &str,
        name: &str,
        password: &str,
        prefix: &str,
        min_replicas: i64,
    ) -> Writer {
        Self::spawn(
            client,
            ns,
            name,
            Password::Fixed(password.to_string()),
            prefix,
            min_replicas,
        )
    }

    /// As [`Writer::start`], reading the password from key `password` of
    /// Secret `secret` on every (re)connect, as an application following a
    /// password rotation does.
    pub fn start_with_secret(
        client: &Client,
        ns: &str,
        name: &str,
        secret: &str,
        prefix: &str,
        min_replicas: i64,
    ) -> Writer {
        Self::spawn(
            client,
            ns,
            name,
            Password::Secret(secret.to_string()),
            prefix,
            min_replicas,
        )
    }

    /// As [`Writer::start_with_secret`], logging in as ACL user `user`
    /// (the `default` user may be off), in plain text or, once the Secret
    /// `tls_secret` exists, with TLS checked against its `ca.crt` (whichever
    /// the server takes: while TLS is turned on, both are tried); each
    /// write confirmed by one replica.
    pub fn start_as_user(
        client: &Client,
        ns: &str,
        name: &str,
        user: &str,
        secret: &str,
        tls_secret: &str,
        prefix: &str,
    ) -> Writer {
        Self::spawn(
            client,
            ns,
            name,
            Password::User {
                user: user.to_string(),
                secret: secret.to_string(),
                tls_secret: tls_secret.to_string(),
            },
            prefix,
            1,
        )
    }

    fn spawn(
        client: &Client,
        ns: &str,
        name: &str,
        password: Password,
        prefix: &str,
        min_replicas: i64,
    ) -> Writer {
        let stop = Arc::new(AtomicBool::new(false));
        let tally = Arc::new(Mutex::new(Tally::default()));
        let written = Arc::new(AtomicU64::new(0));
        let task = tokio::spawn(run(
            client.clone(),
            ns.to_string(),
            name.to_string(),
            password,
            prefix.to_string(),
            min_replicas,
            stop.clone(),
            tally.clone(),
            written.clone(),
        ));
        Writer {
            stop,
            tally,
            written,
            task,
        }
    }

    /// Acknowledged writes so far.
    pub fn acked(&self) -> u64 {
        self.written.load(Ordering::SeqCst)
    }

    /// Waits until `n` more writes than now were acknowledged (the writer
    /// is making progress), or panics after `timeout`.
    pub async fn wait_progress(&self, n: u64, timeout: Duration) {
        let start = self.acked();
        let deadline = tokio::time::Instant::now() + timeout;
        while self.acked() < start + n {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the writer acknowledged {} writes in {timeout:?}, wanted {n}",
                self.acked() - start
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Stops the writer and returns what it saw.
    pub async fn stop(self) -> Tally {
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.task.await;
        self.tally.lock().map(|t| t.clone()).unwrap_or_default()
    }
}

/// Where the writer gets its password.
enum Password {
    Fixed(String),
    Secret(String),
    /// ACL user `user`, its password in Secret `secret`, TLS once Secret
    /// `tls_secret` holds a `ca.crt`.
    User {
        user: String,
        secret: String,
        tls_secret: String,
    },
}

impl Password {
    async fn get(&self, client: &Client, ns: &str) -> Option<String> {
        match self {
            Password::Fixed(p) => Some(p.clone()),
            Password::Secret(name) | Password::User { secret: name, .. } => {
                secret_file(client, ns, name, "password").await
            }
        }
    }

    /// The ways to connect, the last one that worked (`tls`) first.
    async fn ways(&self, client: &Client, ns: &str, tls_first: bool) -> Vec<ConnectOptions> {
        let Some(pw) = self.get(client, ns).await else {
            return Vec::new();
        };
        let base =
            ConnectOptions::default().with_timeouts(Duration::from_secs(1), Duration::from_secs(2));
        let Password::User {
            user, tls_secret, ..
        } = self
        else {
            return vec![base.with_password(pw)];
        };
        let plain = base.with_user(user.clone(), pw);
        let mut out = vec![plain.clone()];
        if let Some(ca) = secret_file(client, ns, tls_secret, "ca.crt").await {
            let tls = plain.with_tls(redpilot::redis::TlsOptions::servers_of_ca(ca.into_bytes()));
            if tls_first {
                out.insert(0, tls);
            } else {
                out.push(tls);
            }
        }
        out
    }
}

async fn secret_file(client: &Client, ns: &str, name: &str, key: &str) -> Option<String> {
    let s = Api::<Secret>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .ok()?;
    let bytes = s.data?.get(key)?.0.clone();
    String::from_utf8(bytes).ok()
}

#[allow(clippy::too_many_arguments)]
async fn run(
    client: Client,
    ns: String,
    name: String,
    password: Password,
    prefix: String,
    min_replicas: i64,
    stop: Arc<AtomicBool>,
    tally: Arc<Mutex<Tally>>,
    written: Arc<AtomicU64>,
) {
    let mut i: u64 = 0;
    let mut conn: Option<Node> = None;
    let mut tls_first = false;
    let mut pace = super::pace::pacer();
    while !stop.load(Ordering::SeqCst) {
        pace.tick().await;
        let Some(node) = conn.as_mut() else {
            let primary = redis_api(&client, &ns)
                .get(&name)
                .await
                .ok()
                .and_then(|r| r.status)
                .and_then(|s| s.primary);
            if let Some(p) = primary {
                let ip = pod_ip(&client, &ns, &p).await;
                for opts in password.ways(&client, &ns, tls_first).await {
                    conn = Node::connect(&Endpoint::new(&ip, 6379), &opts).await.ok();
                    if conn.is_some() {
                        tls_first = opts.tls.is_some();
                        break;
                    }
                }
            }
            if conn.is_none() {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            continue;
        };
        i += 1;
        let key = format!("{prefix}:{i}");
        let set: redpilot::redis::Result<redis::Value> =
            node.query("SET", redis::cmd("SET").arg(&key).arg(i)).await;
        if set.is_err() {
            if let Ok(mut t) = tally.lock() {
                t.failed += 1;
            }
            conn = None;
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        }
        let replicated = if min_replicas == 0 {
            Ok(0)
        } else {
            node.query::<i64>("WAIT", redis::cmd("WAIT").arg(min_replicas).arg(500))
                .await
        };
        let Ok(mut t) = tally.lock() else { return };
        match replicated {
            Ok(n) if n >= min_replicas => {
                t.acked.push(key);
                written.fetch_add(1, Ordering::SeqCst);
            }
            Ok(_) => t.unreplicated += 1,
            Err(_) => {
                t.unreplicated += 1;
                conn = None;
            }
        }
    }
}

/// The keys of `keys` missing on the server at `ip`.
pub async fn missing_keys(ip: &str, password: &str, keys: &[String]) -> Vec<String> {
    let opts = ConnectOptions::default().with_password(password);
    let mut node = Node::connect(&Endpoint::new(ip, 6379), &opts)
        .await
        .unwrap_or_else(|e| panic!("connecting to {ip}: {e}"));
    missing_on(&mut node, keys).await
}

/// The keys of `keys` missing on the server `node` is connected to (with
/// any options: TLS, an ACL user).
pub async fn missing_on(node: &mut Node, keys: &[String]) -> Vec<String> {
    let ip = node.endpoint().to_string();
    let mut missing = Vec::new();
    // MGET in chunks: one round trip per thousand keys.
    for chunk in keys.chunks(1000) {
        let values: Vec<Option<String>> = node
            .query("MGET", redis::cmd("MGET").arg(chunk))
            .await
            .unwrap_or_else(|e| panic!("MGET on {ip}: {e}"));
        missing.extend(
            chunk
                .iter()
                .zip(values)
                .filter(|(_, v)| v.is_none())
                .map(|(k, _)| k.clone()),
        );
    }
    missing
}

/// Every acknowledged key is on every instance (replicas are given time to
/// catch up; nothing acknowledged may be missing anywhere).
pub async fn assert_everywhere(
    client: &kube::Client,
    ns: &str,
    name: &str,
    instances: usize,
    pw: &str,
    keys: &[String],
) {
    let pods = redis_pods(client, ns, name).await;
    assert_eq!(pods.len(), instances, "{:?}", pods.keys());
    for pod in pods.keys() {
        let ip = pod_ip(client, ns, pod).await;
        // Replicas get time to catch up; whatever is still missing then is lost.
        let deadline = Instant::now() + Duration::from_secs(30);
        let missing = loop {
            let m = missing_keys(&ip, pw, keys).await;
            if m.is_empty() || Instant::now() > deadline {
                break m;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        };
        assert!(
            missing.is_empty(),
            "{pod}: {} of {} acknowledged writes lost, e.g. {:?}",
            missing.len(),
            keys.len(),
            &missing[..missing.len().min(5)]
        );
    }
}
