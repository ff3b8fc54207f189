//! Logging and, later, metrics and traces.

use tracing_subscriber::{EnvFilter, fmt, prelude::*};

/// Output format of the operator's logs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One JSON object per line (the default: what log pipelines expect).
    #[default]
    Json,
    /// Human-readable lines, for local runs.
    Text,
}

/// Installs the global tracing subscriber. The filter comes from `RUST_LOG`
/// (default `info`). Calling it twice is harmless: the second call is ignored.
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let registry = tracing_subscriber::registry().with(filter);
    let result = match format {
        LogFormat::Json => registry
            .with(fmt::layer().json().flatten_event(true).with_current_span(false))
            .try_init(),
        LogFormat::Text => registry.with(fmt::layer()).try_init(),
    };
    // An already-installed subscriber (tests) is not an error worth reporting.
    drop(result);
}
