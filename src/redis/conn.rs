//! Connections: endpoints, credentials, TLS and time-bounded commands.

use std::fmt;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, ConnectionAddr, FromRedisValue, RedisConnectionInfo};

use super::endpoint::Endpoint;
use super::error::{Error, Result};
use super::info::{Info, ReplicationInfo};

/// A secret string (password). Its `Debug` output is redacted and it has no `Display`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The secret value. Never log it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl From<&str> for Secret {
    fn from(value: &str) -> Self {
        Self::new(value)
    }
}

impl From<String> for Secret {
    fn from(value: String) -> Self {
        Self(value)
    }
}

/// TLS settings for connecting to a server's `tls-port`.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct TlsOptions {
    /// PEM bundle of the CA(s) that sign the server certificate. When `None`,
    /// the platform trust store is used.
    pub ca_pem: Option<Vec<u8>>,
    /// PEM client certificate, for servers with `tls-auth-clients yes`.
    pub client_cert_pem: Option<Vec<u8>>,
    /// PEM private key matching `client_cert_pem`. Redacted in `Debug`.
    pub client_key_pem: Option<Vec<u8>>,
    /// Check the chain and dates only, not that the certificate names the
    /// address connected to (servers reached by pod address: see
    /// [`super::certs::ChainOnly`]). Only with `ca_pem`, a CA trusted for
    /// these servers alone.
    pub skip_name_check: bool,
    /// Check nothing: for a server on the same pod's loopback only (a
    /// sidecar's), which no other pod can answer for, and whose mounted CA
    /// may run ahead of the certificate it serves while a CA changes.
    /// Command connections only (the snapshot stream refuses it).
    pub unverified: bool,
}

impl TlsOptions {
    /// TLS trusting the given PEM CA bundle.
    pub fn with_ca(ca_pem: impl Into<Vec<u8>>) -> Self {
        Self {
            ca_pem: Some(ca_pem.into()),
            ..Self::default()
        }
    }

    /// TLS without any check of the server's certificate: only for a
    /// server on the pod's own loopback (see [`TlsOptions::unverified`]).
    pub fn loopback() -> Self {
        Self {
            unverified: true,
            ..Self::default()
        }
    }

    /// TLS trusting the given PEM CA bundle, which signs these servers
    /// only, for servers reached by address: any name is accepted.
    pub fn servers_of_ca(ca_pem: impl Into<Vec<u8>>) -> Self {
        Self {
            ca_pem: Some(ca_pem.into()),
            skip_name_check: true,
            ..Self::default()
        }
    }
}

impl fmt::Debug for TlsOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsOptions")
            .field("ca_pem", &self.ca_pem.as_ref().map(|c| c.len()))
            .field(
                "client_cert_pem",
                &self.client_cert_pem.as_ref().map(|c| c.len()),
            )
            .field(
                "client_key_pem",
                &self.client_key_pem.as_ref().map(|_| "<redacted>"),
            )
            .field("skip_name_check", &self.skip_name_check)
            .field("unverified", &self.unverified)
            .finish()
    }
}

/// Which servers listen with TLS while some do and some do not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listeners {
    /// How to reach the servers that listen with TLS.
    pub tls: TlsOptions,
    /// The hosts (as [`Endpoint::host`] gives them) that listen with TLS;
    /// every other listens in plain text.
    pub tls_hosts: std::collections::BTreeSet<String>,
}

impl Listeners {
    /// The TLS settings for the server at `host`; `None`: plain text.
    pub fn tls_for(&self, host: &str) -> Option<&TlsOptions> {
        self.tls_hosts.contains(host).then_some(&self.tls)
    }
}

/// How to connect and authenticate, and the time bounds of network calls.
#[derive(Clone, Debug)]
pub struct ConnectOptions {
    /// ACL user name; `None` authenticates as the `default` user.
    pub username: Option<String>,
    /// Password (`requirepass` or the ACL user's password).
    pub password: Option<Secret>,
    /// TLS settings; `None` means plain TCP.
    pub tls: Option<TlsOptions>,
    /// Servers that do not all listen the same way (TLS being turned on
    /// or off, one instance after another): when set, it decides per host
    /// in place of `tls`.
    pub listeners: Option<std::sync::Arc<Listeners>>,
    /// Bound on establishing a connection (TCP, TLS and authentication).
    pub connect_timeout: Duration,
    /// Bound on each command's reply.
    pub command_timeout: Duration,
    /// When `username`'s credentials are refused, try the same password
    /// as the default user (a server that has not got that user yet).
    pub default_fallback: bool,
    /// TCP keepalive on the connection: the kernel probes the peer after
    /// this long without traffic and then as often, and fails the
    /// connection when [`KEEPALIVE_RETRIES`] probes in a row go
    /// unanswered (a partition is seen without a command sent).
    pub keepalive: Option<Duration>,
}

/// Unanswered keepalive probes after which the kernel fails a connection
/// (see [`ConnectOptions::keepalive`]).
pub const KEEPALIVE_RETRIES: u32 = 2;

impl Default for ConnectOptions {
    fn default() -> Self {
        Self {
            username: None,
            password: None,
            default_fallback: false,
            tls: None,
            listeners: None,
            connect_timeout: Duration::from_secs(2),
            command_timeout: Duration::from_secs(3),
            keepalive: None,
        }
    }
}

impl ConnectOptions {
    /// Sets TCP keepalive (see [`ConnectOptions::keepalive`]).
    pub fn with_keepalive(mut self, every: Duration) -> Self {
        self.keepalive = Some(every);
        self
    }

    /// Sets the password of the default user.
    pub fn with_password(mut self, password: impl Into<Secret>) -> Self {
        self.password = Some(password.into());
        self
    }

    /// Authenticates as ACL user `username` with `password`.
    pub fn with_user(mut self, username: impl Into<String>, password: impl Into<Secret>) -> Self {
        self.username = Some(username.into());
        self.password = Some(password.into());
        self
    }

    /// Authenticates as ACL user `username` with `password`, or, where the
    /// server refuses that, as the default user with the same password. An
    /// empty password means no authentication.
    pub fn with_user_or_default(
        mut self,
        username: impl Into<String>,
        password: impl Into<Secret>,
    ) -> Self {
        let password: Secret = password.into();
        if password.expose().is_empty() {
            return self;
        }
        self.username = Some(username.into());
        self.password = Some(password);
        self.default_fallback = true;
        self
    }

    /// Enables TLS.
    pub fn with_tls(mut self, tls: TlsOptions) -> Self {
        self.tls = Some(tls);
        self
    }

    /// The TLS settings for a server at `host`: per host while
    /// [`Self::listeners`] is set, `tls` otherwise.
    pub fn tls_for(&self, host: &str) -> Option<&TlsOptions> {
        match &self.listeners {
            Some(l) => l.tls_for(host),
            None => self.tls.as_ref(),
        }
    }

    /// Sets both time bounds.
    pub fn with_timeouts(mut self, connect: Duration, command: Duration) -> Self {
        self.connect_timeout = connect;
        self.command_timeout = command;
        self
    }
}

/// Builds a `redis` crate client for `endpoint` with the credentials and TLS of `opts`.
///
/// Useful for callers that need their own connection type; [`Node`] is the
/// time-bounded wrapper used by this library.
pub fn redis_client(endpoint: &Endpoint, opts: &ConnectOptions) -> Result<Client> {
    let mut settings = RedisConnectionInfo::default();
    if let Some(password) = &opts.password {
        settings = settings.set_password(password.expose());
    }
    if let Some(user) = &opts.username {
        settings = settings.set_username(user);
    }
    let tls = opts.tls_for(&endpoint.host);
    let addr = match tls {
        None => ConnectionAddr::Tcp(endpoint.host.clone(), endpoint.port),
        Some(tls) => {
            if tls.skip_name_check && tls.ca_pem.is_none() {
                return Err(Error::Config(
                    "TLS without a name check needs the servers' own CA".into(),
                ));
            }
            ConnectionAddr::TcpTls {
                host: endpoint.host.clone(),
                port: endpoint.port,
                insecure: tls.unverified,
                tls_params: None,
            }
        }
    };
    let config_err = |e: redis::RedisError| {
        Error::Config(format!("invalid connection settings for {endpoint}: {e}"))
    };
    let info = redis::IntoConnectionInfo::into_connection_info(addr)
        .map_err(config_err)?
        .set_redis_settings(settings);
    match tls {
        None => Client::open(info).map_err(config_err),
        Some(tls) if tls.unverified => {
            if !(endpoint.host == "127.0.0.1"
                || endpoint.host == "::1"
                || endpoint.host == "localhost")
            {
                return Err(Error::Config(format!(
                    "TLS without checking the certificate is for the pod's own loopback only, not {endpoint}"
                )));
            }
            match client_tls(tls)? {
                None => Client::open(info).map_err(config_err),
                // The certificate is presented; the server's is still not
                // checked (the address is insecure), whatever roots build.
                Some(client_tls) => Client::build_with_tls(
                    info,
                    redis::TlsCertificates {
                        client_tls: Some(client_tls),
                        root_cert: tls.ca_pem.clone(),
                    },
                )
                .map_err(|e| Error::Tls {
                    endpoint: endpoint.to_string(),
                    message: e.to_string(),
                }),
            }
        }
        Some(tls) => {
            let client_tls = client_tls(tls)?;
            let certs = redis::TlsCertificates {
                client_tls,
                root_cert: tls.ca_pem.clone(),
            };
            let tls_err = |e: redis::RedisError| Error::Tls {
                endpoint: endpoint.to_string(),
                message: e.to_string(),
            };
            let client = Client::build_with_tls(info, certs).map_err(tls_err)?;
            if !tls.skip_name_check {
                return Ok(client);
            }
            // The chain is still checked against `ca_pem`; the flag is set
            // on the parameters the build made (it replaces the address's).
            let info = client.get_connection_info().clone();
            let mut addr = info.addr().clone();
            addr.set_danger_accept_invalid_hostnames(true);
            Client::open(info.set_addr(addr)).map_err(tls_err)
        }
    }
}

/// The certificate a client presents, when `tls` has one.
fn client_tls(tls: &TlsOptions) -> Result<Option<redis::ClientTlsConfig>> {
    match (&tls.client_cert_pem, &tls.client_key_pem) {
        (Some(cert), Some(key)) => Ok(Some(redis::ClientTlsConfig {
            client_cert: cert.clone(),
            client_key: key.clone(),
        })),
        (None, None) => Ok(None),
        _ => Err(Error::Config(
            "TLS client certificate and key must be given together".into(),
        )),
    }
}

/// `fut` (a request to `label`) within `bound`, its errors mapped.
async fn bounded<T>(
    label: &str,
    command: &'static str,
    bound: Duration,
    fut: impl std::future::Future<Output = redis::RedisResult<T>>,
) -> Result<T> {
    match tokio::time::timeout(bound, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(Error::from_redis(label, command, bound, e)),
        Err(_) => Err(Error::Timeout {
            endpoint: label.to_string(),
            operation: command,
            after: bound,
        }),
    }
}

/// A time-bounded, authenticated connection to one server.
pub struct Node {
    endpoint: Endpoint,
    label: String,
    conn: MultiplexedConnection,
    command_timeout: Duration,
    /// The ACL user this connection logged in as (`None`: the default
    /// user, or no authentication).
    user: Option<String>,
}

impl fmt::Debug for Node {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Node")
            .field("endpoint", &self.endpoint)
            .field("command_timeout", &self.command_timeout)
            .finish_non_exhaustive()
    }
}

impl Node {
    /// Connects and authenticates within `opts.connect_timeout` (twice
    /// that with [`ConnectOptions::default_fallback`] when the user is
    /// refused).
    pub async fn connect(endpoint: &Endpoint, opts: &ConnectOptions) -> Result<Self> {
        match Self::connect_once(endpoint, opts).await {
            Err(Error::Auth { .. }) if opts.default_fallback && opts.username.is_some() => {
                let as_default = ConnectOptions {
                    username: None,
                    default_fallback: false,
                    ..opts.clone()
                };
                Self::connect_once(endpoint, &as_default).await
            }
            other => other,
        }
    }

    async fn connect_once(endpoint: &Endpoint, opts: &ConnectOptions) -> Result<Self> {
        let label = endpoint.to_string();
        let client = redis_client(endpoint, opts)?;
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(opts.connect_timeout))
            .set_response_timeout(Some(opts.connect_timeout));
        let conn = tokio::time::timeout(
            opts.connect_timeout,
            client.get_multiplexed_async_connection_with_config(&config),
        )
        .await
        .map_err(|_| Error::Timeout {
            endpoint: label.clone(),
            operation: "connect",
            after: opts.connect_timeout,
        })?
        .map_err(|e| Error::from_redis(&label, "connect", opts.connect_timeout, e))?;
        let mut node = Self {
            endpoint: endpoint.clone(),
            label,
            conn,
            command_timeout: opts.command_timeout,
            user: opts
                .password
                .as_ref()
                .and(opts.username.clone())
                .filter(|u| u != "default"),
        };
        // The crate applies the response timeout given at connect time; keep
        // the handshake bound there and use the command bound from now on.
        node.conn.set_response_timeout(opts.command_timeout);
        Ok(node)
    }

    /// The server this node talks to.
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// The ACL user this connection logged in as; `None` for the default
    /// user (also after [`ConnectOptions::with_user_or_default`] fell back
    /// to it) or no authentication. A command that logs in to another
    /// server on the operator's behalf (`MIGRATE ... AUTH2`) uses it, so
    /// it works where the default user is off.
    pub fn user(&self) -> Option<&str> {
        self.user.as_deref()
    }

    /// Runs `cmd` within the command timeout. `command` names it in errors;
    /// arguments are never included in errors.
    pub async fn query<T: FromRedisValue>(
        &mut self,
        command: &'static str,
        cmd: &redis::Cmd,
    ) -> Result<T> {
        self.query_within(command, cmd, self.command_timeout).await
    }

    /// Like [`Node::query`] with an explicit bound (for commands that may take
    /// longer than usual, such as `SAVE`, `MIGRATE` or `DEBUG`).
    pub async fn query_within<T: FromRedisValue>(
        &mut self,
        command: &'static str,
        cmd: &redis::Cmd,
        bound: Duration,
    ) -> Result<T> {
        // The crate bounds every response by the connection's timeout:
        // lift it for this command, or it would cut a longer bound short.
        let lifted = bound != self.command_timeout;
        if lifted {
            self.conn.set_response_timeout(bound);
        }
        let fut = cmd.query_async::<T>(&mut self.conn);
        let out = bounded(&self.label, command, bound, fut).await;
        if lifted {
            self.conn.set_response_timeout(self.command_timeout);
        }
        out
    }

    /// Sends `pipe` in one round trip within the command timeout; `command`
    /// names it in errors.
    pub async fn pipeline<T: FromRedisValue>(
        &mut self,
        command: &'static str,
        pipe: &redis::Pipeline,
    ) -> Result<T> {
        self.pipeline_within(command, pipe, self.command_timeout)
            .await
    }

    /// Like [`Node::pipeline`] with an explicit bound for the whole
    /// pipeline (for commands that may take longer, such as `MIGRATE`).
    pub async fn pipeline_within<T: FromRedisValue>(
        &mut self,
        command: &'static str,
        pipe: &redis::Pipeline,
        bound: Duration,
    ) -> Result<T> {
        let lifted = bound != self.command_timeout;
        if lifted {
            self.conn.set_response_timeout(bound);
        }
        let fut = pipe.query_async::<T>(&mut self.conn);
        let out = bounded(&self.label, command, bound, fut).await;
        if lifted {
            self.conn.set_response_timeout(self.command_timeout);
        }
        out
    }

    /// `PING`.
    pub async fn ping(&mut self) -> Result<()> {
        let _: String = self.query("PING", &redis::cmd("PING")).await?;
        Ok(())
    }

    /// `INFO` (default sections: server, clients, memory, persistence, stats,
    /// replication, cpu, keyspace, ...), parsed.
    pub async fn info(&mut self) -> Result<Info> {
        let text: String = self.query("INFO", &redis::cmd("INFO")).await?;
        Ok(Info::parse(&text))
    }

    /// `INFO <section>`, parsed. Other sections of the result stay empty.
    pub async fn info_section(&mut self, section: &str) -> Result<Info> {
        let text: String = self.query("INFO", redis::cmd("INFO").arg(section)).await?;
        Ok(Info::parse(&text))
    }

    /// Writes a snapshot with `BGSAVE` (scheduled after an AOF rewrite
    /// that runs) and waits, within `within`, until it is on disk: unlike
    /// `SAVE`, the server's event loop never blocks, so a Cluster node
    /// answers its peers throughout (a foreground save of a large dataset
    /// would outlast `cluster-node-timeout` and get it failed over).
    pub async fn save_in_background(&mut self, within: Duration) -> Result<()> {
        let started = std::time::Instant::now();
        let before = self.lastsave().await?;
        // LASTSAVE counts seconds: a save in this same second would not
        // show as a new one.
        let now: Vec<String> = self.query("TIME", &redis::cmd("TIME")).await?;
        if now.first().and_then(|t| t.parse::<i64>().ok()) <= Some(before) {
            tokio::time::sleep(Duration::from_millis(1100)).await;
        }
        loop {
            let r: Result<redis::Value> = self
                .query("BGSAVE", redis::cmd("BGSAVE").arg("SCHEDULE"))
                .await;
            match r {
                Ok(_) => break,
                // One already runs (a replica's sync, an earlier request):
                // wait for it, then ask for ours.
                Err(Error::Server { message, .. })
                    if message.contains("already in progress") && started.elapsed() < within =>
                {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => return Err(e),
            }
        }
        loop {
            let p = self.info_section("persistence").await?;
            let field = |k: &str| p.fields.get(k).map(|v| v.trim().to_string());
            let running = field("rdb_bgsave_in_progress").as_deref() == Some("1")
                || field("aof_rewrite_in_progress").as_deref() == Some("1");
            if !running && self.lastsave().await? > before {
                return match field("rdb_last_bgsave_status").as_deref() {
                    Some("ok") | None => Ok(()),
                    Some(other) => Err(Error::State(format!(
                        "{}: the background save ended {other}",
                        self.label
                    ))),
                };
            }
            if !running && field("rdb_last_bgsave_status").as_deref() == Some("err") {
                return Err(Error::State(format!(
                    "{}: the background save failed (rdb_last_bgsave_status:err)",
                    self.label
                )));
            }
            if started.elapsed() >= within {
                return Err(Error::Timeout {
                    endpoint: self.label.clone(),
                    operation: "BGSAVE",
                    after: within,
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// `LASTSAVE`: when the last snapshot was written (Unix seconds).
    pub async fn lastsave(&mut self) -> Result<i64> {
        self.query("LASTSAVE", &redis::cmd("LASTSAVE")).await
    }

    /// `INFO replication`, parsed.
    pub async fn replication(&mut self) -> Result<ReplicationInfo> {
        Ok(self.info_section("replication").await?.replication)
    }

    /// `REPLICAOF host port`, or `REPLICAOF NO ONE` when `primary` is `None`.
    pub async fn replicaof(&mut self, primary: Option<&Endpoint>) -> Result<()> {
        let mut cmd = redis::cmd("REPLICAOF");
        match primary {
            Some(p) => cmd.arg(p.host()).arg(p.port()),
            None => cmd.arg("NO").arg("ONE"),
        };
        let _: redis::Value = self.query("REPLICAOF", &cmd).await?;
        Ok(())
    }

    /// `CLIENT PAUSE <ms> WRITE`: holds write commands of all normal clients
    /// until [`Node::client_unpause`] or until `max` elapses (the server
    /// releases the pause itself, so a crashed caller cannot block writes forever).
    pub async fn pause_writes(&mut self, max: Duration) -> Result<()> {
        let ms = u64::try_from(max.as_millis()).unwrap_or(u64::MAX).max(1);
        let _: redis::Value = self
            .query(
                "CLIENT PAUSE",
                redis::cmd("CLIENT").arg("PAUSE").arg(ms).arg("WRITE"),
            )
            .await?;
        Ok(())
    }

    /// `CLIENT UNPAUSE`.
    pub async fn client_unpause(&mut self) -> Result<()> {
        let _: redis::Value = self
            .query("CLIENT UNPAUSE", redis::cmd("CLIENT").arg("UNPAUSE"))
            .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn while_listeners_differ_tls_is_decided_per_host() {
        let ca = TlsOptions::servers_of_ca(b"ca".to_vec());
        let steady = ConnectOptions::default().with_tls(ca.clone());
        assert_eq!(steady.tls_for("10.0.0.1"), Some(&ca));
        assert!(ConnectOptions::default().tls_for("10.0.0.1").is_none());
        // Turning TLS on or off: only the hosts listed listen with TLS,
        // whatever `tls` says.
        for tls in [None, Some(ca.clone())] {
            let opts = ConnectOptions {
                tls,
                listeners: Some(std::sync::Arc::new(Listeners {
                    tls: ca.clone(),
                    tls_hosts: ["10.0.0.2".to_string()].into(),
                })),
                ..ConnectOptions::default()
            };
            assert_eq!(opts.tls_for("10.0.0.2"), Some(&ca));
            assert!(opts.tls_for("10.0.0.1").is_none());
            // A plain-text host gets a plain client (no TLS parameters).
            let c = redis_client(&Endpoint::new("10.0.0.1", 6379), &opts).expect("client");
            assert!(matches!(
                c.get_connection_info().addr(),
                ConnectionAddr::Tcp(..)
            ));
        }
    }

    #[test]
    fn endpoint_parse_and_canonical_form() {
        let e: Endpoint = "127.0.0.1:6379".parse().unwrap();
        assert_eq!(e, Endpoint::new("127.0.0.1", 6379));
        assert_eq!(e.to_string(), "127.0.0.1:6379");
        let v6: Endpoint = "[::1]:7000".parse().unwrap();
        assert_eq!(v6.host(), "::1");
        assert_eq!(v6.to_string(), "[::1]:7000");
        assert_eq!(Endpoint::new("Cache-0.Svc", 1).host(), "cache-0.svc");
        assert!("nohost".parse::<Endpoint>().is_err());
        assert!(":1".parse::<Endpoint>().is_err());
        assert!("h:99999".parse::<Endpoint>().is_err());
        assert!(Endpoint::new("127.0.0.1", 2) < Endpoint::new("127.0.0.2", 1));
    }

    #[test]
    fn debug_never_shows_secrets() {
        let mut tls = TlsOptions::with_ca(b"CA".to_vec());
        tls.client_cert_pem = Some(b"CERT".to_vec());
        tls.client_key_pem = Some(b"PRIVATE-KEY-BYTES".to_vec());
        let opts = ConnectOptions::default()
            .with_user("operator", "hunter2-secret")
            .with_tls(tls);
        let dbg = format!("{opts:?}");
        assert!(!dbg.contains("hunter2"), "{dbg}");
        assert!(!dbg.contains("PRIVATE-KEY"), "{dbg}");
        assert!(dbg.contains("operator"), "{dbg}");
    }
}
