//! Data-plane library for Redis and Valkey: connections (password, ACL user,
//! TLS, time bounds), typed `INFO`, topology observation, replication actions
//! (promote, repoint, switchover, failover, fencing), live configuration and
//! RDB snapshots through the replication protocol.
//!
//! Nothing here knows about Kubernetes: instances are plain [`Endpoint`]s.
//! Every network call is bounded by a timeout, and every error maps to a
//! bounded [`ErrorCategory`] for metrics.

pub mod actions;
pub mod advice;
pub mod certs;
pub mod cluster;
pub mod config;
mod conn;
mod endpoint;
mod error;
pub mod info;
pub mod probe;
pub mod rdb;
pub mod replstream;
pub mod reshard;
pub mod topology;
pub mod tuning;

pub use conn::{
    ConnectOptions, KEEPALIVE_RETRIES, Listeners, Node, Secret, TlsOptions, redis_client,
};
pub use endpoint::Endpoint;
pub use error::{Error, ErrorCategory, Result};
