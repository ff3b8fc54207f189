//! `redpilot-exporter`: the metrics sidecar of every Redis pod, shipped in
//! the operator's image next to `redpilot` (whose `redpilot exporter` runs
//! the same code). A binary of its own keeps the sidecar small: it links only
//! the exporter, not the operator, the backup agent or the Kubernetes client.
//!
//!   redpilot-exporter [--listen ADDR] [--host HOST] [--port PORT]
//!                     [--password-dir DIR] [--tls-loopback [--tls-client-dir DIR]] [--timeout-ms MS]
//!
//! Without `--password-dir` the password comes from `REDIS_PASSWORD`.

use std::process::ExitCode;
use std::time::Duration;

use redpilot::exporter::Settings;

struct Args {
    listen: String,
    host: String,
    port: u16,
    password_dir: Option<std::path::PathBuf>,
    tls_loopback: bool,
    tls_client_dir: Option<std::path::PathBuf>,
    timeout_ms: u64,
}

fn parse(mut argv: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut a = Args {
        listen: std::env::var("REDPILOT_EXPORTER_LISTEN").unwrap_or_else(|_| "0.0.0.0:9121".into()),
        host: "127.0.0.1".into(),
        port: 6379,
        password_dir: None,
        tls_loopback: false,
        tls_client_dir: None,
        timeout_ms: 2000,
    };
    while let Some(arg) = argv.next() {
        let (key, inline) = match arg.split_once('=') {
            Some((k, v)) => (k.to_string(), Some(v.to_string())),
            None => (arg.clone(), None),
        };
        if key == "--help" || key == "-h" {
            return Err(String::new());
        }
        if key == "--tls-loopback" {
            a.tls_loopback = true;
            continue;
        }
        let value = match inline {
            Some(v) => v,
            None => argv.next().ok_or_else(|| format!("{key} needs a value"))?,
        };
        match key.as_str() {
            "--listen" => a.listen = value,
            "--host" => a.host = value,
            "--port" => {
                a.port = value
                    .parse()
                    .map_err(|_| format!("--port: not a port: {value}"))?
            }
            "--password-dir" => a.password_dir = Some(value.into()),
            "--tls-client-dir" => a.tls_client_dir = Some(value.into()),
            "--timeout-ms" => {
                a.timeout_ms = value
                    .parse()
                    .map_err(|_| format!("--timeout-ms: not a number: {value}"))?
            }
            other => return Err(format!("unknown option {other}")),
        }
    }
    Ok(a)
}

fn main() -> ExitCode {
    let args = match parse(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("redpilot-exporter: {e}");
            }
            eprintln!(
                "usage: redpilot-exporter [--listen ADDR] [--host HOST] [--port PORT] [--password-dir DIR] [--tls-loopback [--tls-client-dir DIR]] [--timeout-ms MS]"
            );
            return if e.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(2)
            };
        }
    };
    redpilot::telemetry::init(redpilot::telemetry::LogFormat::Json, false);
    let settings = Settings::new(
        &args.host,
        args.port,
        args.password_dir,
        Duration::from_millis(args.timeout_ms),
    )
    .with_tls_loopback(args.tls_loopback)
    .with_tls_client_dir(args.tls_client_dir);
    match redpilot::exporter::run(&args.listen, settings) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "exporter stopped");
            ExitCode::FAILURE
        }
    }
}
