//! Redpilot: a Kubernetes operator for Redis and Valkey.
//!
//! The crate is split by concern: [`redis`] is the data-plane library (no
//! Kubernetes types), [`backup`] streams snapshots to object stores,
//! [`telemetry`] sets up logging.

pub mod api;
pub mod backup;
pub mod controller;
pub mod exporter;
pub mod failpoint;
pub mod pages;
pub mod plugin;
pub mod redis;
pub mod scorecard;
pub mod telemetry;

/// The operator's version, as built.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
