//! Typed errors of the data-plane library.
//!
//! Every error carries the endpoint it concerns (never a password) and maps to a
//! bounded [`ErrorCategory`] suitable as a metric label.

use std::time::Duration;

/// Result alias used across [`crate::redis`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A bounded classification of [`Error`]s, meant for metric labels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ErrorCategory {
    /// Wrong password, unknown ACL user, missing authentication or permissions.
    Auth,
    /// A network operation did not finish within its bound.
    Timeout,
    /// The server could not be reached, or the connection dropped.
    Connection,
    /// TLS configuration or handshake failure.
    Tls,
    /// The server sent something this library does not understand.
    Protocol,
    /// Local I/O failure (for example writing a snapshot).
    Io,
    /// The server answered a command with an error reply.
    Server,
    /// The instances are not in a state that allows the requested action.
    State,
    /// The request itself was invalid (for example a non-dynamic parameter).
    Config,
}

impl ErrorCategory {
    /// A short, stable, lower-case name (`auth`, `timeout`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auth => "auth",
            Self::Timeout => "timeout",
            Self::Connection => "connection",
            Self::Tls => "tls",
            Self::Protocol => "protocol",
            Self::Io => "io",
            Self::Server => "server",
            Self::State => "state",
            Self::Config => "config",
        }
    }
}

impl std::fmt::Display for ErrorCategory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An error from the data-plane library.
///
/// Messages name the endpoint and the operation, never credentials.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Access was refused: the credentials (wrong password, unknown user,
    /// `NOAUTH`) or, for an authenticated user, the command (`NOPERM`).
    #[error("{endpoint} refused access: {message}")]
    Auth {
        /// `host:port` of the server.
        endpoint: String,
        /// The server's explanation (never contains the password).
        message: String,
    },
    /// A network operation exceeded its time bound.
    #[error("{operation} on {endpoint} timed out after {after:?}")]
    Timeout {
        /// `host:port` of the server.
        endpoint: String,
        /// What was being done.
        operation: &'static str,
        /// The bound that was exceeded.
        after: Duration,
    },
    /// The server was unreachable or the connection dropped.
    #[error("connection to {endpoint} failed: {message}")]
    Connection {
        /// `host:port` of the server.
        endpoint: String,
        /// Details.
        message: String,
    },
    /// TLS could not be set up.
    #[error("TLS with {endpoint} failed: {message}")]
    Tls {
        /// `host:port` of the server.
        endpoint: String,
        /// Details.
        message: String,
    },
    /// The server sent an unexpected or malformed reply.
    #[error("protocol error from {endpoint}: {message}")]
    Protocol {
        /// `host:port` of the server.
        endpoint: String,
        /// Details.
        message: String,
    },
    /// A local I/O operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The server answered with an error reply.
    #[error("{endpoint} rejected {command}: {message}")]
    Server {
        /// `host:port` of the server.
        endpoint: String,
        /// The command name (never its arguments).
        command: &'static str,
        /// The error code, e.g. `ERR`, `READONLY`, `LOADING`.
        code: String,
        /// The full message.
        message: String,
    },
    /// The instances are not in a state that allows the action.
    #[error("{0}")]
    State(String),
    /// The request was invalid.
    #[error("{0}")]
    Config(String),
}

impl Error {
    /// The bounded category of this error, for metrics.
    pub fn category(&self) -> ErrorCategory {
        match self {
            Self::Auth { .. } => ErrorCategory::Auth,
            Self::Timeout { .. } => ErrorCategory::Timeout,
            Self::Connection { .. } => ErrorCategory::Connection,
            Self::Tls { .. } => ErrorCategory::Tls,
            Self::Protocol { .. } => ErrorCategory::Protocol,
            Self::Io { .. } => ErrorCategory::Io,
            Self::Server { .. } => ErrorCategory::Server,
            Self::State(_) => ErrorCategory::State,
            Self::Config(_) => ErrorCategory::Config,
        }
    }

    /// The server error code (`READONLY`, `LOADING`, ...) when this is a server error reply.
    pub fn server_code(&self) -> Option<&str> {
        match self {
            Self::Server { code, .. } => Some(code),
            _ => None,
        }
    }

    /// Whether the server refused a write because it is a replica (`READONLY`).
    pub fn is_readonly(&self) -> bool {
        self.server_code() == Some("READONLY")
    }

    /// Translates an error from the `redis` crate, for a command named `command`.
    /// `bound` is the timeout that applied to the operation.
    pub(crate) fn from_redis(
        endpoint: &str,
        command: &'static str,
        bound: Duration,
        err: redis::RedisError,
    ) -> Self {
        let endpoint = endpoint.to_string();
        let code = err.code().map(str::to_string);
        let message = err.to_string();
        if matches!(code.as_deref(), Some("WRONGPASS" | "NOAUTH" | "NOPERM"))
            || err.kind() == redis::ErrorKind::AuthenticationFailed
            || message.contains("invalid password")
            || message.contains("invalid username-password")
        {
            return Self::Auth { endpoint, message };
        }
        if err.is_timeout() {
            return Self::Timeout {
                endpoint,
                operation: command,
                after: bound,
            };
        }
        if let Some(code) = code {
            return Self::Server {
                endpoint,
                command,
                code,
                message,
            };
        }
        if message.contains("certificate")
            || message.contains("TLS")
            || message.contains("tls")
            || message.contains("handshake")
        {
            return Self::Tls { endpoint, message };
        }
        if err.is_io_error() || err.is_connection_refusal() || err.is_connection_dropped() {
            return Self::Connection { endpoint, message };
        }
        match err.kind() {
            redis::ErrorKind::Parse | redis::ErrorKind::UnexpectedReturnType => {
                Self::Protocol { endpoint, message }
            }
            redis::ErrorKind::InvalidClientConfig => Self::Config(message),
            _ => Self::Connection { endpoint, message },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn categories_are_stable_strings() {
        let e = Error::Timeout {
            endpoint: "127.0.0.1:1".into(),
            operation: "connect",
            after: Duration::from_millis(5),
        };
        assert_eq!(e.category(), ErrorCategory::Timeout);
        assert_eq!(e.category().as_str(), "timeout");
        assert_eq!(Error::State("x".into()).category().to_string(), "state");
    }

    #[test]
    fn server_error_codes_are_classified() {
        let err = redis::make_extension_error("WRONGPASS".into(), Some("bad".into()));
        assert_eq!(
            Error::from_redis("h:1", "AUTH", Duration::from_secs(1), err).category(),
            ErrorCategory::Auth
        );
    }
}
