//! A server's address, compared the way failover needs it (IP addresses in
//! canonical form, ordered host then port).

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use super::error::{Error, Result};

/// A server address: host (name or IP) and TCP port.
///
/// IP addresses are stored in canonical form so that `127.0.0.1` given by a
/// caller and `127.0.0.1` reported by a server in `INFO` compare equal.
/// Ordering (host, then port) is the deterministic tie-break used by failover.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Endpoint {
    pub(super) host: String,
    pub(super) port: u16,
}

impl Endpoint {
    /// Creates an endpoint, canonicalising IP literals.
    pub fn new(host: impl AsRef<str>, port: u16) -> Self {
        let host = host.as_ref().trim_start_matches('[').trim_end_matches(']');
        let host = match host.parse::<IpAddr>() {
            Ok(ip) => ip.to_string(),
            Err(_) => host.to_ascii_lowercase(),
        };
        Self { host, port }
    }

    /// The host part.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl FromStr for Endpoint {
    type Err = Error;

    /// Parses `host:port` or `[ipv6]:port`.
    fn from_str(s: &str) -> Result<Self> {
        let bad = || Error::Config(format!("invalid endpoint {s:?}: expected host:port"));
        let (host, port) = s.rsplit_once(':').ok_or_else(bad)?;
        let port = port.parse::<u16>().map_err(|_| bad())?;
        if host.is_empty() {
            return Err(bad());
        }
        Ok(Self::new(host, port))
    }
}
