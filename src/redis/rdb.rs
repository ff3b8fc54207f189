//! Consistent snapshots through the replication protocol (what
//! `redis-cli --rdb` does), streamed to an [`AsyncWrite`] in chunks.
//!
//! The client authenticates, advertises `capa eof` (so diskless servers can
//! stream without touching their disk), asks for `rdb-only` (7.0+; ignored by
//! older servers), sends `PSYNC ? -1` and copies the payload, which arrives
//! either as `$<length>` or, from diskless servers, terminated by a 40-byte
//! `$EOF:<mark>`. Nothing is buffered beyond one chunk. The payload must start
//! with the `REDIS00xx` (or `VALKEYxxx`) magic and end with the EOF opcode.
//!
//! Length: ~750 lines of code: one stream state machine (handshake, two
//! framings, header checks, TLS) that is simpler to audit in one file.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{
    AsyncBufRead, AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader,
};
use tokio::net::TcpStream;

use super::conn::{ConnectOptions, TlsOptions};
use super::endpoint::Endpoint;
use super::error::{Error, Result};

/// Bounds and behaviour of a snapshot download.
#[derive(Debug, Clone)]
pub struct RdbOptions {
    /// Bound on the wait for the payload to start (the server forks and, for
    /// disk-based transfers, writes the file first).
    pub preamble_timeout: Duration,
    /// Longest silence tolerated while the payload streams (also bounds each
    /// write to the output).
    pub idle_timeout: Duration,
    /// Read buffer size.
    pub chunk_size: usize,
    /// Advertise `capa eof`, letting diskless servers stream without writing
    /// to their disk. When `false`, the server always uses a disk-based save.
    pub allow_diskless: bool,
    /// The replication offset the snapshot must have reached
    /// (`+FULLRESYNC <id> <offset>`): the instance's when it was checked
    /// and chosen. A snapshot behind it is of a server that restarted empty
    /// or lost its history since (a failover keeps the offset counting),
    /// and nothing is read.
    pub min_offset: Option<i64>,
}

impl Default for RdbOptions {
    fn default() -> Self {
        Self {
            preamble_timeout: Duration::from_secs(300),
            idle_timeout: Duration::from_secs(60),
            chunk_size: 1024 * 1024,
            allow_diskless: true,
            min_offset: None,
        }
    }
}

/// The file's magic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RdbFormat {
    /// `REDIS` + 4 digits.
    Redis,
    /// `VALKEY` + 3 digits (Valkey 9+ with RDB version 80 and later).
    Valkey,
}

/// How the server framed the payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransferMode {
    /// `$<length>`: the server saved to disk first.
    Sized {
        /// Announced length.
        length: u64,
    },
    /// `$EOF:<mark>`: streamed straight from the fork (diskless).
    Diskless,
}

/// What a snapshot download produced.
#[derive(Debug, Clone, PartialEq)]
pub struct RdbReport {
    /// Magic family.
    pub format: RdbFormat,
    /// RDB format version (e.g. 9 for Redis 6.2, 10 for 7.0, 11 for 7.2/Valkey 8).
    pub rdb_version: u32,
    /// Engine version from the `valkey-ver` / `redis-ver` aux field.
    pub engine_version: Option<String>,
    /// All aux fields found at the start of the file.
    pub aux: BTreeMap<String, String>,
    /// The first database section: its number and its key count (from the
    /// snapshot's `RESIZEDB` record), when the first chunk reaches it.
    pub first_db: Option<(u64, u64)>,
    /// Bytes written.
    pub size: u64,
    /// Framing used by the server.
    pub mode: TransferMode,
    /// Replication id of the snapshot (from `+FULLRESYNC`).
    pub replid: Option<String>,
    /// Replication offset the snapshot corresponds to.
    pub offset: Option<i64>,
    /// Time from connecting to the last byte.
    pub duration: Duration,
}

impl RdbReport {
    /// Average throughput in bytes per second.
    pub fn bytes_per_second(&self) -> f64 {
        self.size as f64 / self.duration.as_secs_f64().max(1e-9)
    }
}

pub(super) trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

const EOF_MARK_LEN: usize = 40;
const MAX_LINE: usize = 4096;
const HEAD_KEEP: usize = 4096;

/// Builds a rustls client configuration from [`TlsOptions`].
pub(crate) fn tls_client_config(
    endpoint: &Endpoint,
    tls: &TlsOptions,
) -> Result<tokio_rustls::rustls::ClientConfig> {
    let tls_err = |message: String| Error::Tls {
        endpoint: endpoint.to_string(),
        message,
    };
    if tls.unverified {
        return Err(Error::Config(
            "a snapshot stream always checks the server's certificate".into(),
        ));
    }
    let mut roots = rustls::RootCertStore::empty();
    match &tls.ca_pem {
        Some(pem) => {
            for cert in CertificateDer::pem_slice_iter(pem) {
                let cert = cert.map_err(|e| tls_err(format!("invalid CA PEM: {e}")))?;
                roots
                    .add(cert)
                    .map_err(|e| tls_err(format!("unusable CA certificate: {e}")))?;
            }
        }
        None => {
            let native = rustls_native_certs::load_native_certs();
            for cert in native.certs {
                let _ = roots.add(cert);
            }
        }
    }
    if roots.is_empty() {
        return Err(tls_err("no trusted CA certificates".into()));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let versions = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| tls_err(e.to_string()))?;
    let builder = if tls.skip_name_check {
        if tls.ca_pem.is_none() {
            return Err(Error::Config(
                "TLS without a name check needs the servers' own CA".into(),
            ));
        }
        let verifier = super::certs::ChainOnly::new(roots).map_err(tls_err)?;
        versions
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(verifier))
    } else {
        versions.with_root_certificates(roots)
    };
    match (&tls.client_cert_pem, &tls.client_key_pem) {
        (Some(cert), Some(key)) => {
            let chain = CertificateDer::pem_slice_iter(cert)
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(|e| tls_err(format!("invalid client certificate PEM: {e}")))?;
            let key = PrivateKeyDer::from_pem_slice(key)
                .map_err(|_| tls_err("invalid client key PEM".into()))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| tls_err(format!("client certificate rejected: {e}")))
        }
        (None, None) => Ok(builder.with_no_client_auth()),
        _ => Err(Error::Config(
            "TLS client certificate and key must be given together".into(),
        )),
    }
}

/// The certificate (DER) the server at `endpoint` presents in a TLS
/// handshake with `opts` (its TLS settings and connect bound); nothing is
/// sent after the handshake. How a reload of the certificate files is
/// confirmed: the files a server was told to read may lag behind.
pub async fn served_certificate(endpoint: &Endpoint, opts: &ConnectOptions) -> Result<Vec<u8>> {
    served_chain(endpoint, opts)
        .await?
        .into_iter()
        .next()
        .ok_or_else(|| Error::Tls {
            endpoint: endpoint.to_string(),
            message: "the server presented no certificate".into(),
        })
}

/// Every certificate (DER, leaf first) the server at `endpoint` presents,
/// the chain checked as `opts` says.
pub async fn served_chain(endpoint: &Endpoint, opts: &ConnectOptions) -> Result<Vec<Vec<u8>>> {
    let Some(tls) = opts.tls_for(endpoint.host()) else {
        return Err(Error::Config(format!("{endpoint}: no TLS settings")));
    };
    let stream = handshake(endpoint, opts, tls, connect_tcp(endpoint, opts).await?).await?;
    let (_, conn) = stream.get_ref();
    Ok(conn
        .peer_certificates()
        .unwrap_or_default()
        .iter()
        .map(|c| c.to_vec())
        .collect())
}

/// Whether the server at `endpoint` answers a plain-text `PING` (with a
/// reply or an error such as `NOAUTH`) within `opts.connect_timeout`:
/// it listens in plain text. A TLS port takes the bytes for a broken
/// handshake and answers none of that. Nothing else is sent.
pub async fn answers_plain(endpoint: &Endpoint, opts: &ConnectOptions) -> bool {
    let ask = async {
        let mut stream = connect_tcp(endpoint, opts).await.ok()?;
        stream.write_all(b"PING\r\n").await.ok()?;
        let mut first = [0u8; 1];
        stream.read_exact(&mut first).await.ok()?;
        Some(matches!(first[0], b'+' | b'-'))
    };
    tokio::time::timeout(opts.connect_timeout, ask)
        .await
        .ok()
        .flatten()
        .unwrap_or(false)
}

fn connect_timeout(endpoint: &Endpoint, opts: &ConnectOptions, operation: &'static str) -> Error {
    Error::Timeout {
        endpoint: endpoint.to_string(),
        operation,
        after: opts.connect_timeout,
    }
}

/// A TCP connection within `opts.connect_timeout`.
async fn connect_tcp(endpoint: &Endpoint, opts: &ConnectOptions) -> Result<TcpStream> {
    let tcp = tokio::time::timeout(
        opts.connect_timeout,
        TcpStream::connect((endpoint.host(), endpoint.port())),
    )
    .await
    .map_err(|_| connect_timeout(endpoint, opts, "connect"))?
    .map_err(|e| Error::Connection {
        endpoint: endpoint.to_string(),
        message: e.to_string(),
    })?;
    if let Some(every) = opts.keepalive {
        let keepalive = socket2::TcpKeepalive::new()
            .with_time(every)
            .with_interval(every)
            .with_retries(super::conn::KEEPALIVE_RETRIES);
        socket2::SockRef::from(&tcp)
            .set_tcp_keepalive(&keepalive)
            .map_err(|e| Error::Connection {
                endpoint: endpoint.to_string(),
                message: format!("setting TCP keepalive: {e}"),
            })?;
    }
    Ok(tcp)
}

/// The TLS handshake over `tcp` within `opts.connect_timeout`.
async fn handshake(
    endpoint: &Endpoint,
    opts: &ConnectOptions,
    tls: &TlsOptions,
    tcp: TcpStream,
) -> Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let config = tls_client_config(endpoint, tls)?;
    let name = ServerName::try_from(endpoint.host().to_string()).map_err(|e| Error::Tls {
        endpoint: endpoint.to_string(),
        message: format!("invalid server name: {e}"),
    })?;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    tokio::time::timeout(opts.connect_timeout, connector.connect(name, tcp))
        .await
        .map_err(|_| connect_timeout(endpoint, opts, "TLS handshake"))?
        .map_err(|e| Error::Tls {
            endpoint: endpoint.to_string(),
            message: e.to_string(),
        })
}

pub(super) async fn open_stream(
    endpoint: &Endpoint,
    opts: &ConnectOptions,
) -> Result<Box<dyn Stream>> {
    let tcp = connect_tcp(endpoint, opts).await?;
    let _ = tcp.set_nodelay(true);
    match opts.tls_for(endpoint.host()) {
        None => Ok(Box::new(tcp)),
        Some(tls) => Ok(Box::new(handshake(endpoint, opts, tls, tcp).await?)),
    }
}

pub(super) async fn send<S: AsyncRead + AsyncWrite + Unpin>(
    conn: &mut BufReader<S>,
    label: &str,
    bound: Duration,
    bytes: Vec<u8>,
) -> Result<()> {
    tokio::time::timeout(bound, conn.get_mut().write_all(&bytes))
        .await
        .map_err(|_| Error::Timeout {
            endpoint: label.to_string(),
            operation: "send",
            after: bound,
        })?
        .map_err(|e| Error::Connection {
            endpoint: label.to_string(),
            message: e.to_string(),
        })
}

/// `AUTH` with `opts`' user and password, when it has a password.
pub(super) async fn authenticate<S: AsyncRead + AsyncWrite + Unpin>(
    conn: &mut BufReader<S>,
    label: &str,
    bound: Duration,
    opts: &ConnectOptions,
) -> Result<()> {
    let Some(password) = &opts.password else {
        return Ok(());
    };
    let mut args: Vec<&[u8]> = vec![b"AUTH"];
    if let Some(user) = &opts.username {
        args.push(user.as_bytes());
    }
    args.push(password.expose().as_bytes());
    send(conn, label, bound, encode(&args)).await?;
    let reply = next_reply(conn, label, "AUTH", bound).await?;
    if !reply.starts_with('+') {
        return Err(reply_error(label, "AUTH", &reply));
    }
    Ok(())
}

pub(super) fn encode(args: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// Reads one `\n`-terminated line (without the line ending), bounded in size.
async fn read_line<R: AsyncBufRead + Unpin>(r: &mut R, label: &str) -> Result<Vec<u8>> {
    let mut line = Vec::new();
    read_line_into(r, label, &mut line).await?;
    Ok(line)
}

/// [`read_line`] into `line` (cleared first), reusing its allocation.
pub(super) async fn read_line_into<R: AsyncBufRead + Unpin>(
    r: &mut R,
    label: &str,
    line: &mut Vec<u8>,
) -> Result<()> {
    line.clear();
    loop {
        let buf = r.fill_buf().await.map_err(|e| Error::Connection {
            endpoint: label.to_string(),
            message: e.to_string(),
        })?;
        if buf.is_empty() {
            return Err(Error::Connection {
                endpoint: label.to_string(),
                message: "connection closed by the server".into(),
            });
        }
        let (take, done) = match buf.iter().position(|b| *b == b'\n') {
            Some(i) => (i + 1, true),
            None => (buf.len(), false),
        };
        line.extend_from_slice(&buf[..take]);
        r.consume(take);
        if line.len() > MAX_LINE {
            return Err(Error::Protocol {
                endpoint: label.to_string(),
                message: "reply line too long".into(),
            });
        }
        if done {
            while matches!(line.last(), Some(b'\n' | b'\r')) {
                line.pop();
            }
            return Ok(());
        }
    }
}

/// Reads the next non-empty line within `bound` (servers send bare `\n` as
/// keep-alives while preparing a snapshot).
pub(super) async fn next_reply<R: AsyncBufRead + Unpin>(
    r: &mut R,
    label: &str,
    operation: &'static str,
    bound: Duration,
) -> Result<String> {
    let deadline = tokio::time::Instant::now() + bound;
    loop {
        let line = tokio::time::timeout_at(deadline, read_line(r, label))
            .await
            .map_err(|_| Error::Timeout {
                endpoint: label.to_string(),
                operation,
                after: bound,
            })??;
        if !line.is_empty() {
            return Ok(String::from_utf8_lossy(&line).into_owned());
        }
    }
}

pub(super) fn reply_error(label: &str, command: &'static str, line: &str) -> Error {
    let body = line.strip_prefix('-').unwrap_or(line);
    let code = body.split_whitespace().next().unwrap_or("ERR").to_string();
    if matches!(code.as_str(), "NOAUTH" | "WRONGPASS" | "NOPERM") {
        Error::Auth {
            endpoint: label.to_string(),
            message: body.to_string(),
        }
    } else {
        Error::Server {
            endpoint: label.to_string(),
            command,
            code,
            message: body.to_string(),
        }
    }
}

/// Parsed start of an RDB file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RdbHeader {
    /// Magic family.
    pub format: RdbFormat,
    /// Format version.
    pub version: u32,
    /// Aux fields that could be decoded from the given prefix.
    pub aux: BTreeMap<String, String>,
    /// The first database section, when the prefix reaches it right after
    /// the aux fields: its number and the key count its `RESIZEDB` record
    /// declares.
    pub first_db: Option<(u64, u64)>,
}

/// Checks the magic and decodes the leading aux fields of an RDB prefix.
/// Returns `None` when the magic is wrong (or the prefix is shorter than 9 bytes).
pub fn parse_rdb_header(head: &[u8]) -> Option<RdbHeader> {
    let digits = |b: &[u8]| -> Option<u32> {
        if b.iter().all(u8::is_ascii_digit) {
            std::str::from_utf8(b).ok()?.parse().ok()
        } else {
            None
        }
    };
    let (format, version) = if let Some(rest) = head.strip_prefix(b"REDIS") {
        (RdbFormat::Redis, digits(rest.get(..4)?)?)
    } else if let Some(rest) = head.strip_prefix(b"VALKEY") {
        (RdbFormat::Valkey, digits(rest.get(..3)?)?)
    } else {
        return None;
    };
    let mut aux = BTreeMap::new();
    let mut pos = 9;
    while head.get(pos) == Some(&0xFA) && aux.len() < 64 {
        pos += 1;
        let Some((key, p)) = rdb_string(head, pos) else {
            break;
        };
        let Some((value, p)) = rdb_string(head, p) else {
            break;
        };
        pos = p;
        aux.insert(key, value);
    }
    // SELECTDB <db> RESIZEDB <keys> <keys with an expiry>.
    let first_db = (head.get(pos) == Some(&0xFE))
        .then(|| {
            let (db, p) = rdb_length(head, pos + 1)?;
            (head.get(p) == Some(&0xFB)).then_some(())?;
            let (keys, _) = rdb_length(head, p + 1)?;
            Some((db, keys))
        })
        .flatten();
    Some(RdbHeader {
        format,
        version,
        aux,
        first_db,
    })
}

/// Decodes an RDB length (not a special encoding) at `pos`.
fn rdb_length(b: &[u8], pos: usize) -> Option<(u64, usize)> {
    let first = *b.get(pos)?;
    match first >> 6 {
        0 => Some((u64::from(first & 0x3F), pos + 1)),
        1 => Some((
            (u64::from(first & 0x3F) << 8) | u64::from(*b.get(pos + 1)?),
            pos + 2,
        )),
        2 if first == 0x80 => {
            let raw: [u8; 4] = b.get(pos + 1..pos + 5)?.try_into().ok()?;
            Some((u64::from(u32::from_be_bytes(raw)), pos + 5))
        }
        2 if first == 0x81 => {
            let raw: [u8; 8] = b.get(pos + 1..pos + 9)?.try_into().ok()?;
            Some((u64::from_be_bytes(raw), pos + 9))
        }
        _ => None,
    }
}

/// Decodes an RDB string (length-prefixed or integer-encoded) at `pos`.
fn rdb_string(b: &[u8], pos: usize) -> Option<(String, usize)> {
    let first = *b.get(pos)?;
    let (len, start) = match first >> 6 {
        3 => {
            return match first & 0x3F {
                0 => Some(((*b.get(pos + 1)? as i8).to_string(), pos + 2)),
                1 => {
                    let raw: [u8; 2] = b.get(pos + 1..pos + 3)?.try_into().ok()?;
                    Some((i16::from_le_bytes(raw).to_string(), pos + 3))
                }
                2 => {
                    let raw: [u8; 4] = b.get(pos + 1..pos + 5)?.try_into().ok()?;
                    Some((i32::from_le_bytes(raw).to_string(), pos + 5))
                }
                _ => None,
            };
        }
        _ => rdb_length(b, pos)?,
    };
    let len = usize::try_from(len).ok()?;
    let end = start.checked_add(len)?;
    let s = b.get(start..end)?;
    Some((String::from_utf8_lossy(s).into_owned(), end))
}

/// Validates and forwards payload bytes to the output.
struct Sink<'a, W> {
    out: &'a mut W,
    label: String,
    idle: Duration,
    head: Vec<u8>,
    validated: bool,
    size: u64,
    last: Vec<u8>,
}

impl<'a, W: AsyncWrite + Unpin> Sink<'a, W> {
    fn new(out: &'a mut W, label: String, idle: Duration) -> Self {
        Self {
            out,
            label,
            idle,
            head: Vec::new(),
            validated: false,
            size: 0,
            last: Vec::with_capacity(18),
        }
    }

    async fn write(&mut self, data: &[u8]) -> Result<()> {
        bounded_io(
            self.idle,
            &self.label,
            "snapshot write",
            "writing",
            self.out.write_all(data),
        )
        .await
    }

    async fn push(&mut self, data: &[u8]) -> Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        self.size += data.len() as u64;
        self.last
            .extend_from_slice(&data[data.len().saturating_sub(9)..]);
        let excess = self.last.len().saturating_sub(9);
        self.last.drain(..excess);
        if !self.validated {
            self.head.extend_from_slice(data);
            if self.head.len() < 9 {
                return Ok(());
            }
            if parse_rdb_header(&self.head).is_none() {
                return Err(Error::Protocol {
                    endpoint: self.label.clone(),
                    message: format!(
                        "payload is not an RDB file (starts with {:?})",
                        String::from_utf8_lossy(&self.head[..9])
                    ),
                });
            }
            self.validated = true;
            let head = std::mem::take(&mut self.head);
            self.write(&head).await?;
            self.head = head;
            self.head.truncate(HEAD_KEEP);
            return Ok(());
        }
        if self.head.len() < HEAD_KEEP {
            let take = (HEAD_KEEP - self.head.len()).min(data.len());
            self.head.extend_from_slice(&data[..take]);
        }
        self.write(data).await
    }

    async fn finish(self) -> Result<(RdbHeader, u64)> {
        let protocol = |message: &str| Error::Protocol {
            endpoint: self.label.clone(),
            message: message.to_string(),
        };
        if !self.validated {
            return Err(protocol("RDB payload shorter than its header"));
        }
        // An RDB ends with the EOF opcode followed by an 8-byte checksum.
        if self.last.len() < 9 || self.last[0] != 0xFF {
            return Err(protocol("RDB payload does not end with the EOF opcode"));
        }
        bounded_io(
            self.idle,
            &self.label,
            "snapshot flush",
            "flushing",
            self.out.flush(),
        )
        .await?;
        let header = parse_rdb_header(&self.head).ok_or_else(|| protocol("bad RDB header"))?;
        Ok((header, self.size))
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    let first = *needle.first()?;
    let last_start = haystack.len().checked_sub(needle.len())?;
    let mut i = 0;
    while i <= last_start {
        match haystack[i..=last_start].iter().position(|b| *b == first) {
            Some(off) => {
                let at = i + off;
                if &haystack[at..at + needle.len()] == needle {
                    return Some(at);
                }
                i = at + 1;
            }
            None => return None,
        }
    }
    None
}

/// Copies the payload that follows a `$<len>` or `$EOF:<mark>` header line.
async fn copy_payload<R: AsyncBufRead + Unpin, W: AsyncWrite + Unpin>(
    reader: &mut R,
    sink: &mut Sink<'_, W>,
    mode: &Framing,
    idle: Duration,
) -> Result<()> {
    let label = sink.label.clone();
    let read = |e: std::io::Error| Error::Connection {
        endpoint: label.clone(),
        message: e.to_string(),
    };
    let idle_err = || Error::Timeout {
        endpoint: label.clone(),
        operation: "snapshot read",
        after: idle,
    };
    match mode {
        Framing::Sized(length) => {
            let mut remaining = *length;
            while remaining > 0 {
                let buf = tokio::time::timeout(idle, reader.fill_buf())
                    .await
                    .map_err(|_| idle_err())?
                    .map_err(read)?;
                if buf.is_empty() {
                    return Err(Error::Protocol {
                        endpoint: label.clone(),
                        message: format!("payload truncated: {remaining} bytes missing"),
                    });
                }
                let take = usize::try_from(remaining)
                    .unwrap_or(usize::MAX)
                    .min(buf.len());
                sink.push(&buf[..take]).await?;
                reader.consume(take);
                remaining -= take as u64;
            }
            Ok(())
        }
        Framing::Eof(mark) => {
            // The last bytes read that may begin the mark, not yet passed
            // on. Nothing past the mark is consumed: on a replication
            // connection the command stream follows it.
            let mut held: Vec<u8> = Vec::new();
            loop {
                let buf = tokio::time::timeout(idle, reader.fill_buf())
                    .await
                    .map_err(|_| idle_err())?
                    .map_err(read)?;
                if buf.is_empty() {
                    return Err(Error::Protocol {
                        endpoint: label.clone(),
                        message: "connection closed before the end-of-payload mark".into(),
                    });
                }
                let n = buf.len();
                let mut window = std::mem::take(&mut held);
                let kept = window.len();
                window.extend_from_slice(buf);
                if let Some(at) = find(&window, mark) {
                    sink.push(&window[..at]).await?;
                    reader.consume(at + EOF_MARK_LEN - kept);
                    return Ok(());
                }
                let cut = window.len().saturating_sub(EOF_MARK_LEN - 1);
                sink.push(&window[..cut]).await?;
                held = window.split_off(cut);
                reader.consume(n);
            }
        }
    }
}

enum Framing {
    Sized(u64),
    Eof(Vec<u8>),
}

fn parse_framing(label: &str, line: &str) -> Result<Framing> {
    let bad = || Error::Protocol {
        endpoint: label.to_string(),
        message: format!("unexpected payload header {:?}", truncate(line)),
    };
    let rest = line.strip_prefix('$').ok_or_else(bad)?;
    if let Some(mark) = rest.strip_prefix("EOF:") {
        if mark.len() != EOF_MARK_LEN {
            return Err(bad());
        }
        return Ok(Framing::Eof(mark.as_bytes().to_vec()));
    }
    rest.parse::<u64>().map(Framing::Sized).map_err(|_| bad())
}

pub(super) fn truncate(s: &str) -> String {
    s.chars().take(80).collect()
}

/// Downloads a consistent snapshot of `endpoint` and streams it into `out`.
///
/// Works against primaries and replicas (a replica serves the snapshot of what
/// it has replicated). Every network step is bounded: connecting by
/// `opts.connect_timeout`, each handshake reply by `opts.command_timeout`, the
/// start of the payload by `rdb.preamble_timeout`, and each read or write of the
/// payload by `rdb.idle_timeout`.
pub async fn stream_rdb<W: AsyncWrite + Unpin>(
    endpoint: &Endpoint,
    opts: &ConnectOptions,
    rdb: &RdbOptions,
    out: &mut W,
) -> Result<RdbReport> {
    let start = Instant::now();
    let label = endpoint.to_string();
    let stream = open_stream(endpoint, opts).await?;
    let mut conn = BufReader::with_capacity(rdb.chunk_size.max(4096), stream);
    let bound = opts.command_timeout;

    authenticate(&mut conn, &label, bound, opts).await?;
    if rdb.allow_diskless {
        send(
            &mut conn,
            &label,
            bound,
            encode(&[b"REPLCONF", b"capa", b"eof", b"capa", b"psync2"]),
        )
        .await?;
        let reply = next_reply(&mut conn, &label, "REPLCONF", bound).await?;
        if !reply.starts_with('+') {
            return Err(reply_error(&label, "REPLCONF", &reply));
        }
    }
    // 7.0+: send only the snapshot, no replication stream afterwards.
    send(
        &mut conn,
        &label,
        bound,
        encode(&[b"REPLCONF", b"rdb-only", b"1"]),
    )
    .await?;
    let reply = next_reply(&mut conn, &label, "REPLCONF", bound).await?;
    if reply.starts_with('-')
        && reply_error(&label, "REPLCONF", &reply).category() == super::ErrorCategory::Auth
    {
        return Err(reply_error(&label, "REPLCONF", &reply));
    }

    send(&mut conn, &label, bound, encode(&[b"PSYNC", b"?", b"-1"])).await?;
    let reply = next_reply(&mut conn, &label, "PSYNC", rdb.preamble_timeout).await?;
    let (replid, offset) = match reply.strip_prefix("+FULLRESYNC ") {
        Some(rest) => {
            let mut parts = rest.split_whitespace();
            (
                parts.next().map(str::to_string),
                parts.next().and_then(|o| o.parse::<i64>().ok()),
            )
        }
        None if reply.starts_with('-') => return Err(reply_error(&label, "PSYNC", &reply)),
        None => {
            return Err(Error::Protocol {
                endpoint: label.clone(),
                message: format!("unexpected PSYNC reply {:?}", truncate(&reply)),
            });
        }
    };
    if let Some(min) = rdb.min_offset
        && offset.is_none_or(|o| o < min)
    {
        return Err(Error::State(format!(
            "{label} offers a snapshot at replication offset {}, behind {min} where it was when it \
             was chosen: it restarted empty or lost its history since, and is not read",
            offset.map_or("(none)".to_string(), |o| o.to_string())
        )));
    }
    let header = next_reply(
        &mut conn,
        &label,
        "snapshot preparation",
        rdb.preamble_timeout,
    )
    .await?;
    if header.starts_with('-') {
        return Err(reply_error(&label, "PSYNC", &header));
    }
    let (header, size, mode) = read_snapshot(&mut conn, &label, &header, rdb, out).await?;
    let engine_version = header
        .aux
        .get("valkey-ver")
        .or_else(|| header.aux.get("redis-ver"))
        .cloned();
    Ok(RdbReport {
        format: header.format,
        rdb_version: header.version,
        engine_version,
        aux: header.aux,
        first_db: header.first_db,
        size,
        mode,
        replid,
        offset,
        duration: start.elapsed(),
    })
}

/// Reads the snapshot whose header line (`$<length>` or `$EOF:<mark>`) was
/// `header` from `conn` into `out`, checking that it is an RDB file from
/// its magic to its EOF opcode. What follows it on `conn` (a replication
/// stream) is left unread.
pub(super) async fn read_snapshot<R: AsyncBufRead + Unpin, W: AsyncWrite + Unpin>(
    conn: &mut R,
    label: &str,
    header: &str,
    rdb: &RdbOptions,
    out: &mut W,
) -> Result<(RdbHeader, u64, TransferMode)> {
    let framing = parse_framing(label, header)?;
    let mode = match framing {
        Framing::Sized(length) => TransferMode::Sized { length },
        Framing::Eof(_) => TransferMode::Diskless,
    };
    let mut sink = Sink::new(out, label.to_string(), rdb.idle_timeout);
    copy_payload(conn, &mut sink, &framing, rdb.idle_timeout).await?;
    let (header, size) = sink.finish().await?;
    Ok((header, size, mode))
}

/// Runs one write-side I/O step within `idle`, mapping a timeout and an I/O
/// failure to the library's errors (`verb` reads "writing", "flushing").
async fn bounded_io(
    idle: Duration,
    label: &str,
    operation: &'static str,
    verb: &str,
    step: impl std::future::Future<Output = std::io::Result<()>>,
) -> Result<()> {
    tokio::time::timeout(idle, step)
        .await
        .map_err(|_| Error::Timeout {
            endpoint: label.to_string(),
            operation,
            after: idle,
        })?
        .map_err(|e| Error::Io {
            context: format!("{verb} snapshot of {label}"),
            source: e,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal RDB: header, aux fields, EOF opcode and an 8-byte checksum.
    fn fake_rdb(body_len: usize) -> Vec<u8> {
        let mut v = b"REDIS0011".to_vec();
        v.push(0xFA);
        v.push(9);
        v.extend_from_slice(b"redis-ver");
        v.push(6);
        v.extend_from_slice(b"7.0.15");
        v.push(0xFA);
        v.push(10);
        v.extend_from_slice(b"redis-bits");
        v.extend_from_slice(&[0xC0, 64]);
        v.extend((0..body_len).map(|i| (i % 251) as u8));
        v.push(0xFF);
        v.extend_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8]);
        v
    }

    async fn run(input: Vec<u8>, framing: Framing, chunk: usize) -> Result<(Vec<u8>, RdbHeader)> {
        let mut reader = BufReader::with_capacity(chunk, input.as_slice());
        let mut out = Vec::new();
        let mut sink = Sink::new(&mut out, "test".into(), Duration::from_secs(1));
        copy_payload(&mut reader, &mut sink, &framing, Duration::from_secs(1)).await?;
        let (header, size) = sink.finish().await?;
        assert_eq!(size as usize, out.len());
        Ok((out, header))
    }

    #[tokio::test]
    async fn sized_payload_is_copied_exactly() {
        let rdb = fake_rdb(100_000);
        let mut input = rdb.clone();
        input.extend_from_slice(b"*1\r\n$4\r\nPING\r\n");
        for chunk in [7, 4096, 1 << 20] {
            let (out, header) = run(input.clone(), Framing::Sized(rdb.len() as u64), chunk)
                .await
                .unwrap();
            assert_eq!(out, rdb);
            assert_eq!(header.version, 11);
            assert_eq!(
                header.aux.get("redis-ver").map(String::as_str),
                Some("7.0.15")
            );
            assert_eq!(header.aux.get("redis-bits").map(String::as_str), Some("64"));
        }
    }

    #[tokio::test]
    async fn eof_marked_payload_stops_at_the_mark() {
        let rdb = fake_rdb(50_000);
        let mark: Vec<u8> = b"0123456789abcdef0123456789abcdef01234567".to_vec();
        let mut input = rdb.clone();
        input.extend_from_slice(&mark);
        input.extend_from_slice(b"trailing replication stream");
        for chunk in [1, 13, 39, 40, 41, 4096, 1 << 20] {
            let (out, _) = run(input.clone(), Framing::Eof(mark.clone()), chunk)
                .await
                .unwrap();
            assert_eq!(out, rdb, "chunk {chunk}");
        }
    }

    #[tokio::test]
    async fn bad_payloads_are_rejected() {
        let mut not_rdb = b"HELLO0011".to_vec();
        not_rdb.extend_from_slice(&[0xFF; 20]);
        let e = run(not_rdb.clone(), Framing::Sized(not_rdb.len() as u64), 64)
            .await
            .unwrap_err();
        assert_eq!(e.category(), crate::redis::ErrorCategory::Protocol);

        let rdb = fake_rdb(10);
        let e = run(
            rdb[..rdb.len() - 3].to_vec(),
            Framing::Sized(rdb.len() as u64),
            64,
        )
        .await
        .unwrap_err();
        assert!(e.to_string().contains("truncated"), "{e}");

        let mut no_eof = rdb.clone();
        no_eof.truncate(no_eof.len() - 9);
        let e = run(no_eof.clone(), Framing::Sized(no_eof.len() as u64), 64)
            .await
            .unwrap_err();
        assert!(e.to_string().contains("EOF opcode"), "{e}");

        let e = run(rdb, Framing::Eof(vec![b'x'; 40]), 64)
            .await
            .unwrap_err();
        assert!(e.to_string().contains("end-of-payload"), "{e}");
    }

    #[test]
    fn header_parsing() {
        assert!(parse_rdb_header(b"REDIS00").is_none());
        assert!(parse_rdb_header(b"REDISabcd").is_none());
        let h = parse_rdb_header(b"VALKEY080").unwrap();
        assert_eq!((h.format, h.version), (RdbFormat::Valkey, 80));
        assert!(matches!(
            parse_framing("t", "$123"),
            Ok(Framing::Sized(123))
        ));
        assert!(parse_framing("t", "$EOF:short").is_err());
        assert!(parse_framing("t", "+OK").is_err());
        // Integer-encoded aux values of every width.
        let mut v = b"REDIS0009".to_vec();
        v.extend_from_slice(&[0xFA, 1, b'a', 0xC1, 0x34, 0x12]);
        v.extend_from_slice(&[0xFA, 1, b'b', 0xC2, 0xFF, 0xFF, 0xFF, 0xFF]);
        v.extend_from_slice(&[0xFA, 1, b'c', 0x40, 2, b'h', b'i']);
        let h = parse_rdb_header(&v).unwrap();
        assert_eq!(h.aux.get("a").map(String::as_str), Some("4660"));
        assert_eq!(h.aux.get("b").map(String::as_str), Some("-1"));
        assert_eq!(h.aux.get("c").map(String::as_str), Some("hi"));
        assert_eq!(h.first_db, None);
        // The first database section: SELECTDB 3, RESIZEDB 70000 keys.
        v.extend_from_slice(&[0xFE, 3, 0xFB, 0x80, 0, 1, 0x11, 0x70, 0x40, 1]);
        assert_eq!(parse_rdb_header(&v).unwrap().first_db, Some((3, 70000)));
        // Something else after the aux fields (a function): not guessed.
        let mut f = b"REDIS0010".to_vec();
        f.extend_from_slice(&[0xF5, 0xFE, 0, 0xFB, 1, 0]);
        assert_eq!(parse_rdb_header(&f).unwrap().first_db, None);
    }

    #[test]
    fn find_mark() {
        assert_eq!(find(b"aaab", b"ab"), Some(2));
        assert_eq!(find(b"aaa", b"ab"), None);
        assert_eq!(find(b"a", b"ab"), None);
    }
}
