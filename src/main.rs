use std::process::ExitCode;

use clap::{Parser, Subcommand};
use redpilot::telemetry::{self, LogFormat};

/// Redpilot: a Kubernetes operator for Redis and Valkey.
#[derive(Parser, Debug)]
#[command(name = "redpilot", version = redpilot::VERSION, about)]
struct Cli {
    /// Log format.
    #[arg(long, global = true, env = "REDPILOT_LOG_FORMAT", value_enum, default_value_t = LogFormat::Json)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Print the version and exit.
    Version,
    /// Run the operator.
    Run(RunArgs),
    /// Back up one server into an S3-compatible bucket (what a backup Job
    /// runs). Prints the backup's manifest as JSON. Secrets come from the
    /// environment only: REDIS_PASSWORD, AWS_ACCESS_KEY_ID,
    /// AWS_SECRET_ACCESS_KEY.
    Backup(BackupArgs),
    /// Fetch a backup into a file a server then loads (what a restore runs
    /// before the server starts), after checking it against its manifest.
    /// Prints the manifest as JSON. Secrets from the environment only.
    Restore(RestoreArgs),
    /// Print the CustomResourceDefinitions as YAML, or write them to a file.
    Crd {
        /// Write to this file instead of standard output.
        #[arg(long)]
        output: Option<std::path::PathBuf>,
    },
}

/// Options of `redpilot run`. The kubeconfig comes from the usual places
/// (in-cluster service account, `KUBECONFIG`, `~/.kube/config`).
#[derive(clap::Args, Debug)]
struct RunArgs {
    /// Namespaces to watch, comma-separated; all namespaces when empty.
    #[arg(long, env = "WATCH_NAMESPACE", default_value = "")]
    watch_namespace: String,
    /// Namespace of the leader-election Lease (the operator's own namespace).
    #[arg(long, env = "POD_NAMESPACE", default_value = "redpilot-system")]
    leader_election_namespace: String,
    /// Name of the leader-election Lease.
    #[arg(long, default_value = "redpilot-leader")]
    lease_name: String,
    /// Seconds a lease lasts without renewal (5 to 3600; the holder renews
    /// every third of it and steps down 2 s before it could expire, so a
    /// shorter lease would leave no time to renew).
    #[arg(long, env = "LEASE_DURATION_SECONDS", default_value_t = 15,
          value_parser = clap::value_parser!(u64).range(5..=3600))]
    lease_duration: u64,
    /// Reconciles running at once per watched namespace (1 to 1000); more
    /// wait in the controller's queue.
    #[arg(long, env = "MAX_CONCURRENT_RECONCILES", default_value_t = 32,
          value_parser = clap::value_parser!(u16).range(1..=1000))]
    max_concurrent_reconciles: u16,
    /// Address of the /metrics, /healthz and /readyz endpoints.
    #[arg(long, env = "METRICS_ADDR", default_value = "0.0.0.0:8080")]
    metrics_addr: String,
}

/// Options of `redpilot backup`.
#[derive(clap::Args, Debug)]
struct BackupArgs {
    /// Address of the server to back up.
    #[arg(long)]
    host: String,
    /// Its port.
    #[arg(long, default_value_t = 6379)]
    port: u16,
    /// The instance's name in the manifest (default: host:port).
    #[arg(long)]
    source_name: Option<String>,
    #[command(flatten)]
    store: StoreArgs,
}

/// Where a backup is stored (shared by backup and restore).
#[derive(clap::Args, Debug)]
struct StoreArgs {
    /// S3 endpoint URL (AWS S3 when absent).
    #[arg(long, env = "S3_ENDPOINT")]
    endpoint: Option<String>,
    /// Region.
    #[arg(long, env = "S3_REGION", default_value = "us-east-1")]
    region: String,
    /// Bucket.
    #[arg(long, env = "S3_BUCKET")]
    bucket: String,
    /// Object key of the RDB file; its manifest is `<key>.manifest.json`.
    #[arg(long)]
    key: String,
    /// Path-style requests (most self-hosted S3 servers need them).
    #[arg(long, env = "S3_PATH_STYLE", default_value_t = false)]
    path_style: bool,
    /// Retries of a request that may succeed when retried, with backoff.
    #[arg(long, default_value_t = 3)]
    retries: usize,
}

/// Options of `redpilot restore`.
#[derive(clap::Args, Debug)]
struct RestoreArgs {
    #[command(flatten)]
    store: StoreArgs,
    /// The file to write (the server's `dir`/`dbfilename`).
    #[arg(long)]
    dest: std::path::PathBuf,
    /// The newest RDB version the server that loads it reads.
    #[arg(long)]
    max_rdb_version: Option<u32>,
}

/// A two-thread runtime for `redpilot <what>`.
fn runtime(what: &str) -> Option<tokio::runtime::Runtime> {
    match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => Some(rt),
        Err(e) => {
            eprintln!("redpilot {what}: starting the runtime: {e}");
            None
        }
    }
}

/// The manifest on stdout, or `{"reason", "message"}` on stderr.
fn report(r: Result<String, redpilot::backup::BackupError>) -> ExitCode {
    match r {
        Ok(manifest) => {
            println!("{manifest}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            let line = serde_json::json!({"reason": e.category(), "message": e.to_string()});
            eprintln!("{line}");
            ExitCode::FAILURE
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    telemetry::init(cli.log_format);
    match cli.command {
        Command::Run(args) => {
            let Some(runtime) = runtime("run") else {
                return ExitCode::FAILURE;
            };
            match runtime.block_on(run(args)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!(error = %e, "operator stopped");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Backup(args) => {
            let Some(runtime) = runtime("backup") else {
                return ExitCode::FAILURE;
            };
            report(runtime.block_on(backup(args)))
        }
        Command::Restore(args) => {
            let Some(runtime) = runtime("restore") else {
                return ExitCode::FAILURE;
            };
            report(runtime.block_on(restore(args)))
        }
        Command::Version => {
            println!("redpilot {}", redpilot::VERSION);
            ExitCode::SUCCESS
        }
        Command::Crd { output } => match write_crds(output.as_deref()) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("redpilot crd: {e}");
                ExitCode::FAILURE
            }
        },
    }
}

/// The store named by `args`, with credentials from the environment.
fn open_store(
    args: &StoreArgs,
) -> Result<(std::sync::Arc<dyn object_store::ObjectStore>, String), redpilot::backup::BackupError>
{
    use redpilot::backup::{self, BackupError, S3Target};
    // HTTPS to the store goes through rustls with ring, as everything else.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let need = |name: &str| {
        env_value(name)
            .ok_or_else(|| BackupError::Invalid(format!("{name} is not set in the environment")))
    };
    let target = S3Target {
        endpoint: args.endpoint.clone(),
        region: args.region.clone(),
        bucket: args.bucket.clone(),
        path_style: args.path_style,
        access_key_id: need("AWS_ACCESS_KEY_ID")?,
        secret_access_key: need("AWS_SECRET_ACCESS_KEY")?.into(),
        retries: args.retries,
        retry_timeout: std::time::Duration::from_secs(60),
    };
    Ok((backup::open(&target)?, format!("s3://{}", target.bucket)))
}

fn env_value(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn manifest_json(m: &redpilot::backup::Manifest) -> Result<String, redpilot::backup::BackupError> {
    serde_json::to_string(m)
        .map_err(|e| redpilot::backup::BackupError::Invalid(format!("encoding the manifest: {e}")))
}

async fn backup(args: BackupArgs) -> Result<String, redpilot::backup::BackupError> {
    use redpilot::backup::{self, Source};
    use redpilot::redis::{ConnectOptions, Endpoint};
    let (store, location) = open_store(&args.store)?;
    let endpoint = Endpoint::new(&args.host, args.port);
    let mut options = ConnectOptions::default();
    if let Some(pw) = env_value("REDIS_PASSWORD") {
        options = options.with_password(pw);
    }
    let source = Source {
        name: args.source_name.unwrap_or_else(|| endpoint.to_string()),
        endpoint,
        options,
    };
    let m = backup::backup(&source, store, &location, &args.store.key).await?;
    manifest_json(&m)
}

async fn restore(args: RestoreArgs) -> Result<String, redpilot::backup::BackupError> {
    let (store, location) = open_store(&args.store)?;
    let m = redpilot::backup::restore(
        store.as_ref(),
        &location,
        &args.store.key,
        &args.dest,
        args.max_rdb_version,
    )
    .await?;
    manifest_json(&m)
}

fn write_crds(output: Option<&std::path::Path>) -> Result<(), Box<dyn std::error::Error>> {
    let yaml = redpilot::api::crds_yaml()?;
    match output {
        Some(path) => std::fs::write(path, yaml)?,
        None => print!("{yaml}"),
    }
    Ok(())
}

async fn run(args: RunArgs) -> Result<(), Box<dyn std::error::Error>> {
    use std::sync::Arc;
    use std::time::Duration;

    use redpilot::controller::{self, leader};

    // A bad RELATED_IMAGE_* fails the start, before any lease is taken.
    let images = controller::images::Images::from_env()?;
    let client = kube::Client::try_default().await?;
    let metrics = Arc::new(telemetry::Metrics::new()?);
    let listener = tokio::net::TcpListener::bind(&args.metrics_addr).await?;
    tracing::info!(addr = %listener.local_addr()?, "serving /metrics, /healthz, /readyz");
    let health = Arc::new(telemetry::Health::default());
    let http = tokio::spawn(telemetry::serve_http(
        listener,
        metrics.clone(),
        health.clone(),
    ));

    let identity = std::env::var("POD_NAME").unwrap_or_else(|_| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        format!("{}-{}", host.trim(), std::process::id())
    });
    let lease = leader::LeaseConfig {
        namespace: args.leader_election_namespace.clone(),
        name: args.lease_name.clone(),
        identity,
        duration: Duration::from_secs(args.lease_duration),
        renew_every: Duration::from_secs((args.lease_duration / 3).max(1)),
    };
    // Leader election has a client (and connections) of its own, so lease
    // renewals never queue behind the reconcilers' requests.
    let lease_client = kube::Client::try_default().await?;
    leader::acquire(&lease_client, &lease, &health).await;
    metrics.leader.set(1);
    let namespaces = controller::watch_namespaces(Some(&args.watch_namespace));
    tracing::info!(
        version = redpilot::VERSION,
        namespaces = ?namespaces,
        related_images = images.len(),
        "starting controllers (all namespaces when empty)"
    );
    let result = tokio::select! {
        _ = controller::run_controllers(client.clone(), namespaces, metrics.clone(), images, health.clone(), args.max_concurrent_reconciles) => Ok(()),
        _ = leader::keep(&lease_client, &lease, &health) => Err("lost leadership".into()),
    };
    metrics.leader.set(0);
    http.abort();
    result
}
