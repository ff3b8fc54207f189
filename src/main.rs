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

fn main() -> ExitCode {
    let cli = Cli::parse();
    telemetry::init(cli.log_format);
    match cli.command {
        Command::Run(args) => {
            let runtime = match tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("redpilot run: starting the runtime: {e}");
                    return ExitCode::FAILURE;
                }
            };
            match runtime.block_on(run(args)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!(error = %e, "operator stopped");
                    ExitCode::FAILURE
                }
            }
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
