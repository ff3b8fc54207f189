//! The failure monitor's connection to a primary: one socket per server,
//! kept open, that says `PING` twice a second and reads `+PONG`.
//!
//! A [`super::Node`] would do, but its multiplexed connection hands every
//! command to a driver task through channels and allocates for each
//! request and reply; for a probe that runs 120 times a minute for every
//! watched primary that was most of the monitor's cost. Here a probe is one
//! write of fixed bytes and one read into a buffer the connection keeps:
//! no task, no allocation while the server answers. Connecting (TCP or TLS,
//! `AUTH`, `ROLE`) happens once, and again only after a failure.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};

use super::conn::ConnectOptions;
use super::endpoint::Endpoint;
use super::error::{Error, Result};
use super::info::Info;
use super::rdb::{Stream, encode, open_stream, read_line_into, reply_error};

const PING: &[u8] = b"*1\r\n$4\r\nPING\r\n";
const ROLE: &[u8] = b"*1\r\n$4\r\nROLE\r\n";
const INFO_MEMORY: &[u8] = b"*2\r\n$4\r\nINFO\r\n$6\r\nmemory\r\n";
const INFO_REPLICATION: &[u8] = b"*2\r\n$4\r\nINFO\r\n$11\r\nreplication\r\n";
/// Largest bulk reply read (`INFO memory` is about 1.5 KB).
const MAX_BULK: usize = 1 << 20;

/// An open, authenticated probe connection.
pub struct ProbeConn {
    stream: BufReader<Box<dyn Stream>>,
    label: String,
    timeout: Duration,
    /// The last reply line, kept to reuse its allocation.
    line: Vec<u8>,
}

impl std::fmt::Debug for ProbeConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProbeConn")
            .field("endpoint", &self.label)
            .finish_non_exhaustive()
    }
}

impl ProbeConn {
    /// Connects (TCP, TLS when `opts` says so) within `opts.connect_timeout`
    /// and authenticates as `opts` says, falling back to the default user
    /// with the same password when the named user is refused and
    /// `opts.default_fallback` allows it. Later commands are bounded by
    /// `opts.command_timeout`.
    pub async fn open(endpoint: &Endpoint, opts: &ConnectOptions) -> Result<Self> {
        let label = endpoint.to_string();
        let stream = open_stream(endpoint, opts).await?;
        let mut conn = Self {
            stream: BufReader::with_capacity(4096, stream),
            label,
            timeout: opts.connect_timeout,
            line: Vec::with_capacity(64),
        };
        if let Some(password) = &opts.password {
            let password = password.expose().as_bytes();
            let first = match &opts.username {
                Some(user) => conn.auth(&[b"AUTH", user.as_bytes(), password]).await,
                None => conn.auth(&[b"AUTH", password]).await,
            };
            match first {
                Err(Error::Auth { .. }) if opts.default_fallback && opts.username.is_some() => {
                    conn.auth(&[b"AUTH", password]).await?
                }
                other => other?,
            }
        }
        conn.timeout = opts.command_timeout;
        Ok(conn)
    }

    async fn auth(&mut self, args: &[&[u8]]) -> Result<()> {
        let request = encode(args);
        let r = tokio::time::timeout(self.timeout, self.exchange(&request, "AUTH")).await;
        self.within(r, "AUTH")
    }

    /// `PING`: `Ok` on `+PONG`; an error reply is returned as the error it
    /// names (a server that is loading, or that no longer takes the
    /// password, still answered).
    pub async fn ping(&mut self) -> Result<()> {
        let r = tokio::time::timeout(self.timeout, self.exchange(PING, "PING")).await;
        self.within(r, "PING")
    }

    /// Returns when the connection has something to read between probes:
    /// the server closed it (a killed process's socket is closed by its
    /// kernel at once), it failed, or bytes came unasked (a server sends
    /// none to a client that has not asked). Either way the connection is
    /// not to be used again. Cancel-safe: dropped at the next probe.
    pub async fn until_closed(&mut self) {
        use tokio::io::AsyncBufReadExt;
        let _ = self.stream.fill_buf().await;
    }

    /// Sends `request` and reads a simple reply.
    async fn exchange(&mut self, request: &[u8], command: &'static str) -> Result<()> {
        self.write(request).await?;
        self.simple_reply(command).await
    }

    /// Whether the server says it is a primary (`ROLE`).
    pub async fn is_primary(&mut self) -> Result<bool> {
        let r = tokio::time::timeout(self.timeout, self.role_once()).await;
        self.within(r, "ROLE")
    }

    async fn role_once(&mut self) -> Result<bool> {
        self.write(ROLE).await?;
        self.read_line().await?;
        self.fail_on_error("ROLE")?;
        let n = self.header(b'*', "ROLE")?;
        if n < 1 {
            return Err(self.protocol("ROLE replied with an empty array"));
        }
        self.read_line().await?;
        let len = self.header(b'$', "ROLE")?;
        let role = self.bulk(len).await?;
        // The rest of the reply (offsets, replicas) is not needed.
        self.skip(n - 1).await?;
        Ok(role == b"master" || role == b"primary")
    }

    /// `used_memory` from `INFO memory`, with `used_memory_dataset` when
    /// the server reports it.
    pub async fn used_memory(&mut self) -> Result<Option<(u64, Option<u64>)>> {
        let r = tokio::time::timeout(self.timeout, self.memory_once()).await;
        self.within(r, "INFO")
    }

    async fn memory_once(&mut self) -> Result<Option<(u64, Option<u64>)>> {
        let memory = self.info_once(INFO_MEMORY).await?.memory;
        Ok(memory.used_memory.map(|u| (u, memory.used_memory_dataset)))
    }

    /// Sends an `INFO <section>` `request` and parses its bulk reply.
    async fn info_once(&mut self, request: &[u8]) -> Result<Info> {
        self.write(request).await?;
        self.read_line().await?;
        self.fail_on_error("INFO")?;
        let len = self.header(b'$', "INFO")?;
        let body = self.bulk(len).await?;
        Ok(Info::parse(&String::from_utf8_lossy(&body)))
    }

    /// From `INFO replication`: how many replicas are online with an
    /// acknowledgement at most `max_lag` seconds old (a link that names no
    /// listening port, such as an archiving sidecar's, is not a replica).
    pub async fn replicas_heard(&mut self, max_lag: i64) -> Result<usize> {
        let r = tokio::time::timeout(self.timeout, self.replication_once(max_lag)).await;
        self.within(r, "INFO")
    }

    async fn replication_once(&mut self, max_lag: i64) -> Result<usize> {
        let replication = self.info_once(INFO_REPLICATION).await?.replication;
        Ok(replication
            .replicas
            .iter()
            .filter(|r| {
                r.endpoint.port() != 0
                    && r.state == "online"
                    && r.lag_seconds.is_some_and(|l| l <= max_lag)
            })
            .count())
    }

    /// A step's result, or a timeout naming `operation` when the bound
    /// passed first (the connection is then in an unknown state: callers
    /// drop it).
    fn within<T>(
        &self,
        r: std::result::Result<Result<T>, tokio::time::error::Elapsed>,
        operation: &'static str,
    ) -> Result<T> {
        r.unwrap_or_else(|_| {
            Err(Error::Timeout {
                endpoint: self.label.clone(),
                operation,
                after: self.timeout,
            })
        })
    }

    async fn write(&mut self, bytes: &[u8]) -> Result<()> {
        let s = self.stream.get_mut();
        let sent = match s.write_all(bytes).await {
            Ok(()) => s.flush().await,
            Err(e) => Err(e),
        };
        sent.map_err(|e| self.closed(e.to_string()))
    }

    /// A `+` reply is `Ok`; a `-` reply is its error.
    async fn simple_reply(&mut self, command: &'static str) -> Result<()> {
        self.read_line().await?;
        self.fail_on_error(command)?;
        match self.line.first() {
            Some(b'+') => Ok(()),
            _ => Err(self.protocol(&format!("{command}: unexpected reply"))),
        }
    }

    fn fail_on_error(&self, command: &'static str) -> Result<()> {
        match self.line.first() {
            Some(b'-') => Err(reply_error(
                &self.label,
                command,
                &String::from_utf8_lossy(&self.line),
            )),
            _ => Ok(()),
        }
    }

    /// The count of a `*n` or `$n` line; -1 for a null.
    fn header(&self, kind: u8, command: &str) -> Result<i64> {
        match self.line.split_first() {
            Some((k, rest)) if *k == kind => std::str::from_utf8(rest)
                .ok()
                .and_then(|n| n.parse::<i64>().ok())
                .filter(|n| *n >= -1)
                .ok_or_else(|| self.protocol(&format!("{command}: bad length"))),
            _ => Err(self.protocol(&format!("{command}: unexpected reply"))),
        }
    }

    /// Reads one line into `self.line`, without its `\r\n`.
    async fn read_line(&mut self) -> Result<()> {
        read_line_into(&mut self.stream, &self.label, &mut self.line).await
    }

    /// The `len` bytes of a bulk reply and its `\r\n`.
    async fn bulk(&mut self, len: i64) -> Result<Vec<u8>> {
        let Ok(len) = usize::try_from(len) else {
            return Ok(Vec::new());
        };
        if len > MAX_BULK {
            return Err(self.protocol("bulk reply too long"));
        }
        let mut body = vec![0; len + 2];
        if let Err(e) = self.stream.read_exact(&mut body).await {
            return Err(self.closed(e.to_string()));
        }
        body.truncate(len);
        Ok(body)
    }

    /// Reads and drops `n` more values (nested arrays included).
    async fn skip(&mut self, n: i64) -> Result<()> {
        let mut left = n.max(0);
        while left > 0 {
            left -= 1;
            self.read_line().await?;
            match self.line.first() {
                Some(b'*') => left += self.header(b'*', "ROLE")?.max(0),
                Some(b'$') => {
                    let len = self.header(b'$', "ROLE")?;
                    self.bulk(len).await?;
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn closed(&self, message: String) -> Error {
        Error::Connection {
            endpoint: self.label.clone(),
            message,
        }
    }

    fn protocol(&self, message: &str) -> Error {
        Error::Protocol {
            endpoint: self.label.clone(),
            message: message.to_string(),
        }
    }
}

/// Waits for the open probe connection to close (never, without one):
/// the probe loops watch it between two probes.
pub async fn closed(conn: &mut Option<ProbeConn>) {
    match conn.as_mut() {
        Some(c) => c.until_closed().await,
        None => std::future::pending().await,
    }
}

/// The server replied, with an error (a password being rotated, a dataset
/// loading): it is there, which is what a probe asks.
pub fn answered(e: &super::Error) -> bool {
    matches!(
        e.category(),
        super::ErrorCategory::Auth | super::ErrorCategory::Server
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpListener;

    /// A server that answers each request with the next canned reply and
    /// records what it was sent.
    async fn canned(replies: Vec<&'static [u8]>) -> (Endpoint, tokio::task::JoinHandle<Vec<u8>>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let task = tokio::spawn(async move {
            let (mut sock, _) = listener.accept().await.expect("accept");
            let mut seen = Vec::new();
            for reply in replies {
                let mut buf = [0u8; 512];
                let n = sock.read(&mut buf).await.expect("read");
                seen.extend_from_slice(&buf[..n]);
                sock.write_all(reply).await.expect("write");
            }
            seen
        });
        (Endpoint::new("127.0.0.1", port), task)
    }

    #[tokio::test]
    async fn role_reply_is_read_whole_so_the_next_ping_meets_its_own_reply() {
        let role: &[u8] = b"*3\r\n$6\r\nmaster\r\n:42\r\n*2\r\n*3\r\n$8\r\n10.0.0.2\r\n$4\r\n6379\r\n$2\r\n42\r\n*3\r\n$8\r\n10.0.0.3\r\n$4\r\n6379\r\n$2\r\n40\r\n";
        let (ep, server) = canned(vec![b"+OK\r\n", role, b"+PONG\r\n"]).await;
        let opts = ConnectOptions::default().with_user("op", "pw");
        let mut c = ProbeConn::open(&ep, &opts).await.expect("open");
        assert!(c.is_primary().await.expect("role"));
        c.ping().await.expect("ping");
        let seen = server.await.expect("server");
        assert_eq!(
            seen,
            b"*3\r\n$4\r\nAUTH\r\n$2\r\nop\r\n$2\r\npw\r\n*1\r\n$4\r\nROLE\r\n*1\r\n$4\r\nPING\r\n"
        );
    }

    #[tokio::test]
    async fn a_replica_and_error_replies_are_told_apart() {
        let role: &[u8] =
            b"*5\r\n$5\r\nslave\r\n$8\r\n10.0.0.1\r\n:6379\r\n$9\r\nconnected\r\n:42\r\n";
        let (ep, _server) = canned(vec![
            role,
            b"-LOADING Redis is loading the dataset in memory\r\n",
        ])
        .await;
        let mut c = ProbeConn::open(&ep, &ConnectOptions::default())
            .await
            .expect("open");
        assert!(!c.is_primary().await.expect("role"));
        let e = c.ping().await.expect_err("loading");
        assert_eq!(e.category(), crate::redis::ErrorCategory::Server);
    }

    #[tokio::test]
    async fn a_refused_user_falls_back_to_the_default_user_when_allowed() {
        let (ep, server) = canned(vec![
            b"-WRONGPASS invalid username-password pair\r\n",
            b"+OK\r\n",
        ])
        .await;
        let opts = ConnectOptions::default().with_user_or_default("op", "pw");
        ProbeConn::open(&ep, &opts).await.expect("open");
        let seen = String::from_utf8(server.await.expect("server")).expect("utf8");
        assert!(seen.ends_with("*2\r\n$4\r\nAUTH\r\n$2\r\npw\r\n"), "{seen}");
    }

    #[tokio::test]
    async fn a_silent_server_times_out_within_the_bound() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let ep = Endpoint::new("127.0.0.1", listener.local_addr().expect("addr").port());
        let _hold = tokio::spawn(async move {
            let (sock, _) = listener.accept().await.expect("accept");
            tokio::time::sleep(Duration::from_secs(5)).await;
            drop(sock);
        });
        let opts = ConnectOptions::default()
            .with_timeouts(Duration::from_millis(200), Duration::from_millis(200));
        let mut c = ProbeConn::open(&ep, &opts).await.expect("open");
        let t = std::time::Instant::now();
        let e = c.ping().await.expect_err("silent");
        assert_eq!(e.category(), crate::redis::ErrorCategory::Timeout);
        assert!(
            t.elapsed() < Duration::from_millis(400),
            "{:?}",
            t.elapsed()
        );
    }
}
