//! A replica's side of the replication protocol, kept open: on a full
//! resync the snapshot, then the command stream, byte for byte, with the
//! replication offset of every byte. What the continuous archive records.
//!
//! Unlike a snapshot download ([`super::rdb::stream_rdb`]) the connection
//! stays a replica: it acknowledges an offset every second (else the
//! primary drops it after `repl-timeout`), and it may ask to continue a
//! history (`PSYNC <replid> <offset>`), which the primary grants from its
//! backlog (`+CONTINUE`) or refuses with a full resync.

use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWrite, BufReader};

use super::conn::ConnectOptions;
use super::endpoint::Endpoint;
use super::error::{Error, Result};
use super::rdb::{
    RdbHeader, RdbOptions, Stream, TransferMode, authenticate, encode, next_reply, open_stream,
    read_snapshot, reply_error, send, truncate,
};

/// How the primary answered the `PSYNC`.
#[derive(Debug, Clone, PartialEq)]
pub enum Began {
    /// A full resync: the snapshot at `offset` was written to the output.
    Full {
        /// Replication id of the snapshot.
        replid: String,
        /// Its offset (the stream continues after it).
        offset: i64,
        /// The snapshot's header.
        header: RdbHeader,
        /// Its size.
        size: u64,
        /// How it was framed.
        mode: TransferMode,
    },
    /// The history continues from the requested offset.
    Continued {
        /// The primary's replication id now (its own after a promotion).
        replid: String,
    },
}

/// An open replication link: bytes after [`ReplStream::offset`] are next.
pub struct ReplStream {
    conn: BufReader<Box<dyn Stream>>,
    label: String,
    bound: Duration,
    /// Replication id of the history being received.
    pub replid: String,
    /// Offset of the last byte handed out by [`ReplStream::read`].
    pub offset: i64,
}

impl std::fmt::Debug for ReplStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplStream")
            .field("label", &self.label)
            .field("replid", &self.replid)
            .field("offset", &self.offset)
            .finish()
    }
}

/// Opens a replication link to `endpoint`. With `resume` (`(replid,
/// offset)`: the last byte already held), asks to continue after it;
/// otherwise, or when the primary refuses, takes a full resync whose
/// snapshot is written to `snapshot`.
pub async fn open<W: AsyncWrite + Unpin>(
    endpoint: &Endpoint,
    opts: &ConnectOptions,
    rdb: &RdbOptions,
    resume: Option<(&str, i64)>,
    snapshot: &mut W,
) -> Result<(ReplStream, Began)> {
    let label = endpoint.to_string();
    let stream = open_stream(endpoint, opts).await?;
    let mut conn = BufReader::with_capacity(rdb.chunk_size.max(4096), stream);
    let bound = opts.command_timeout;
    authenticate(&mut conn, &label, bound, opts).await?;
    let capa: Vec<&[u8]> = if rdb.allow_diskless {
        vec![b"REPLCONF", b"capa", b"eof", b"capa", b"psync2"]
    } else {
        vec![b"REPLCONF", b"capa", b"psync2"]
    };
    send(&mut conn, &label, bound, encode(&capa)).await?;
    let reply = next_reply(&mut conn, &label, "REPLCONF", bound).await?;
    if !reply.starts_with('+') {
        return Err(reply_error(&label, "REPLCONF", &reply));
    }
    let (id, from) = match resume {
        Some((replid, offset)) => (replid.to_string(), (offset + 1).to_string()),
        None => ("?".to_string(), "-1".to_string()),
    };
    send(
        &mut conn,
        &label,
        bound,
        encode(&[b"PSYNC", id.as_bytes(), from.as_bytes()]),
    )
    .await?;
    let reply = next_reply(&mut conn, &label, "PSYNC", rdb.preamble_timeout).await?;
    let protocol = |message: String| Error::Protocol {
        endpoint: label.clone(),
        message,
    };
    let (replid, offset, began) = if let Some(rest) = reply.strip_prefix("+CONTINUE") {
        let Some((old, offset)) = resume else {
            return Err(protocol("+CONTINUE to a PSYNC that asked for none".into()));
        };
        let now = rest.trim();
        let replid = if now.is_empty() { old } else { now }.to_string();
        let began = Began::Continued {
            replid: replid.clone(),
        };
        (replid, offset, began)
    } else {
        let Some(rest) = reply.strip_prefix("+FULLRESYNC ") else {
            if reply.starts_with('-') {
                return Err(reply_error(&label, "PSYNC", &reply));
            }
            return Err(protocol(format!(
                "unexpected PSYNC reply {:?}",
                truncate(&reply)
            )));
        };
        let mut parts = rest.split_whitespace();
        let replid = parts.next().unwrap_or_default().to_string();
        let offset = parts
            .next()
            .and_then(|o| o.parse::<i64>().ok())
            .ok_or_else(|| protocol(format!("unexpected PSYNC reply {:?}", truncate(&reply))))?;
        let header_line = next_reply(
            &mut conn,
            &label,
            "snapshot preparation",
            rdb.preamble_timeout,
        )
        .await?;
        if header_line.starts_with('-') {
            return Err(reply_error(&label, "PSYNC", &header_line));
        }
        let (header, size, mode) =
            read_snapshot(&mut conn, &label, &header_line, rdb, snapshot).await?;
        let began = Began::Full {
            replid: replid.clone(),
            offset,
            header,
            size,
            mode,
        };
        (replid, offset, began)
    };
    Ok((
        ReplStream {
            conn,
            label,
            bound,
            replid,
            offset,
        },
        began,
    ))
}

impl ReplStream {
    /// Appends the bytes that arrive within `wait` to `buf` (none when the
    /// primary sent nothing), advancing [`ReplStream::offset`]. An error
    /// when the link closed or failed.
    pub async fn read(&mut self, buf: &mut Vec<u8>, wait: Duration) -> Result<usize> {
        let got = match tokio::time::timeout(wait, self.conn.fill_buf()).await {
            Err(_) => return Ok(0),
            Ok(Err(e)) => {
                return Err(Error::Connection {
                    endpoint: self.label.clone(),
                    message: e.to_string(),
                });
            }
            Ok(Ok(b)) => b,
        };
        if got.is_empty() {
            return Err(Error::Connection {
                endpoint: self.label.clone(),
                message: "connection closed by the server".into(),
            });
        }
        let n = got.len();
        buf.extend_from_slice(got);
        self.conn.consume(n);
        self.offset += n as i64;
        Ok(n)
    }

    /// Tells the primary the offset processed (`REPLCONF ACK`): what
    /// `WAIT` counts and what keeps the link alive.
    pub async fn ack(&mut self, offset: i64) -> Result<()> {
        let o = offset.to_string();
        send(
            &mut self.conn,
            &self.label,
            self.bound,
            encode(&[b"REPLCONF", b"ACK", o.as_bytes()]),
        )
        .await
    }
}
