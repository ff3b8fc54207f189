//! Insights: the metrics sidecar of every Redis pod ([`sidecar`]), and the
//! PodMonitor and PrometheusRule of each Redis when the cluster serves the
//! prometheus-operator CRDs ([`objects`], alert rules in [`rules`]).

pub mod objects;
pub mod rules;
pub mod sidecar;
pub mod state;
