//! The `redpilot` binary: the operator (`run`), the backup agent (`backup`,
//! `restore`, `delete`, what the Jobs and init containers run), `crd`.
//!
//! Length: the command line of five subcommands with their documented
//! options, and the agent's thin glue to [`redpilot::backup`].

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
    /// environment only: REDIS_PASSWORD (of REDIS_USER when set, else of
    /// the default user), AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY.
    Backup(BackupArgs),
    /// Fetch a backup into a file a server then loads (what a restore runs
    /// before the server starts), after checking it against its manifest.
    /// Prints the manifest as JSON. Secrets from the environment only.
    Restore(RestoreArgs),
    /// Delete a stored backup and its manifest (what deleting a RedisBackup
    /// with `deletionPolicy: Delete` runs).
    Delete(DeleteArgs),
    /// Archive the replication stream continuously (what the `archive`
    /// sidecar of a Redis with `spec.archive` runs): `--key` is the
    /// archive's root. Serves `/status` (JSON) and `/metrics`. Secrets from
    /// the environment only.
    Archive(ArchiveArgs),
    /// Serve Prometheus metrics of the server in the same pod (what the
    /// metrics sidecar runs): `INFO ALL` at each scrape, in the names the
    /// usual Redis exporter uses.
    Exporter(ExporterArgs),
    /// Print the alert rules (every Redis, default bounds, and the
    /// operator's) as a Prometheus rules file, or write them to a file.
    Rules {
        /// Write to this file instead of standard output.
        #[arg(long)]
        output: Option<std::path::PathBuf>,
    },
    /// Run one test of Redpilot's scorecard suite (what the scorecard's
    /// `redpilot` test pods run) against the cluster, and print its result
    /// as the scorecard's JSON. Exit 0 when it passes.
    ScorecardTest(ScorecardArgs),
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
    /// S3 endpoints backup and restore agents may send credentials to,
    /// comma-separated `[scheme://]host[:port]` (host may start with `*.`;
    /// no scheme: https only; no port: any). Empty: any http(s) endpoint.
    #[arg(long, env = "REDPILOT_S3_ENDPOINTS", default_value = "")]
    s3_endpoints: String,
    /// Lifetime of the server certificates the operator issues (`spec.tls`
    /// without a Secret), in seconds (default 90 days).
    #[arg(long, env = "REDPILOT_TLS_CERT_VALIDITY_SECONDS", default_value_t = 90 * 24 * 3600)]
    tls_cert_validity_seconds: u64,
    /// Such a certificate expiring within this many seconds is issued again
    /// (default 30 days; shorter than the lifetime).
    #[arg(long, env = "REDPILOT_TLS_RENEW_BEFORE_SECONDS", default_value_t = 30 * 24 * 3600)]
    tls_renew_before_seconds: u64,
    /// How often the operator looks at each Redis's servers for tuning
    /// advice (status.insights), in seconds; 0 turns it off (at most
    /// 86,400).
    #[arg(long, env = "REDPILOT_TUNING_INTERVAL_SECONDS", default_value_t = 300,
          value_parser = clap::value_parser!(u64).range(0..=86_400))]
    tuning_interval_seconds: u64,
}

/// Options of `redpilot scorecard-test`.
#[derive(clap::Args, Debug)]
struct ScorecardArgs {
    /// The test: redpilot-basic-install, redpilot-cluster-install, redpilot-seamless-upgrades,
    /// redpilot-full-lifecycle, redpilot-deep-insights, redpilot-auto-pilot,
    /// redpilot-memory-autopilot, redpilot-shard-autopilot.
    test: String,
    /// Namespace to create its objects in (default: the scorecard's,
    /// `SCORECARD_NAMESPACE`, else the client's default).
    #[arg(long)]
    namespace: Option<String>,
    /// Bound of each wait (a Redis Ready, an upgrade, a backup), 10 to 3600.
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(10..=3600))]
    timeout_seconds: u64,
}

/// Options of `redpilot exporter`.
#[derive(clap::Args, Debug)]
struct ExporterArgs {
    /// Address to serve /metrics on.
    #[arg(long, env = "REDPILOT_EXPORTER_LISTEN", default_value = "0.0.0.0:9121")]
    listen: String,
    /// The server to export.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Its port.
    #[arg(long, default_value_t = 6379)]
    port: u16,
    /// Directory of the mounted server-auth Secret, read at each
    /// connection: `exporter-password` (the sidecar's own ACL user), else
    /// `password` and, during a rotation, `previous`. Without it the
    /// password comes from REDIS_PASSWORD.
    #[arg(long)]
    password_dir: Option<std::path::PathBuf>,
    /// Connect with TLS without checking the certificate: for a server on
    /// the pod's own loopback (the sidecar's), refused for any other host.
    #[arg(long)]
    tls_loopback: bool,
    /// With `--tls-loopback`: a directory with `tls.crt` and `tls.key`,
    /// presented to a server that asks clients for a certificate (read at
    /// each connection).
    #[arg(long, requires = "tls_loopback")]
    tls_client_dir: Option<std::path::PathBuf>,
    /// Bound, in milliseconds, of the connection and of each command.
    #[arg(long, default_value_t = 2000)]
    timeout_ms: u64,
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
    /// The shard of a Cluster Redis the instance serves (with `--slots`).
    #[arg(long, requires = "slots")]
    shard: Option<i32>,
    /// The slot ranges of that shard, e.g. `0-5460`.
    #[arg(long, requires = "shard")]
    slots: Option<String>,
    /// Connect with TLS, trusting this CA bundle (the certificate's name
    /// is not checked: the server is reached by address).
    #[arg(long)]
    tls_ca_file: Option<std::path::PathBuf>,
    /// With `--tls-ca-file`: present this certificate (PEM, with its
    /// intermediates) to a server that asks clients for one.
    #[arg(long, requires_all = ["tls_ca_file", "tls_key_file"])]
    tls_cert_file: Option<std::path::PathBuf>,
    /// The private key of `--tls-cert-file`.
    #[arg(long, requires = "tls_cert_file")]
    tls_key_file: Option<std::path::PathBuf>,
    /// Read only a snapshot at this replication offset or past it (where
    /// the instance was when it was chosen); one behind fails with
    /// `SourceChanged`.
    #[arg(long)]
    min_offset: Option<i64>,
    #[command(flatten)]
    store: StoreArgs,
    #[command(flatten)]
    result: ResultArgs,
}

/// Options of `redpilot delete`.
#[derive(clap::Args, Debug)]
struct DeleteArgs {
    #[command(flatten)]
    store: StoreArgs,
    /// More backups in the same store to delete (the other shards of a
    /// Cluster Redis's backup).
    #[arg(long)]
    also_key: Vec<String>,
    #[command(flatten)]
    result: ResultArgs,
}

/// Options of `redpilot archive`.
#[derive(clap::Args, Debug)]
struct ArchiveArgs {
    #[command(flatten)]
    store: StoreArgs,
    /// The line archived (`main`, or `shard-<i>` of a Cluster Redis).
    #[arg(long, default_value = "main")]
    line: String,
    /// A Cluster Redis's shard index: recorded in bases, and the slots its
    /// primary serves recorded with each checkpoint (a restore to a time
    /// rebuilds the layout from them).
    #[arg(long)]
    shard: Option<i32>,
    /// The pod's own server.
    #[arg(long, default_value_t = 6379)]
    port: u16,
    /// This pod's address (as its primary lists it).
    #[arg(long, env = "POD_IP", default_value = "")]
    pod_ip: String,
    /// This pod's name.
    #[arg(long, env = "POD_NAME", default_value = "")]
    pod: String,
    /// One instance per primary: archive the primary itself.
    #[arg(long)]
    alone: bool,
    /// Milliseconds between segments (the archive's delay behind the
    /// stream, plus the upload).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(100..=60_000))]
    interval_ms: u64,
    /// Milliseconds between checkpoints (the granularity of a restore).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(10..=10_000))]
    checkpoint_ms: u64,
    /// Seconds between bases (snapshots) within a run.
    #[arg(long, default_value_t = 86_400)]
    base_every_seconds: u64,
    /// Seconds of history kept restorable.
    #[arg(long, default_value_t = 7 * 86_400)]
    retention_seconds: u64,
    /// MiB received and not yet stored beyond which the stream waits.
    #[arg(long, default_value_t = 128)]
    queue_limit_mib: usize,
    /// Address of `/status` and `/metrics`.
    #[arg(long, default_value = "0.0.0.0:9122")]
    listen: String,
    /// TLS to the own server (its loopback: nothing checked).
    #[arg(long)]
    tls_loopback: bool,
    /// With TLS: the CA of the other pods' servers.
    #[arg(long)]
    tls_ca_file: Option<std::path::PathBuf>,
    /// With TLS: a directory with `tls.crt` and `tls.key` to present.
    #[arg(long)]
    tls_client_dir: Option<std::path::PathBuf>,
    /// Where a failure to start is written (the container's termination
    /// message).
    #[command(flatten)]
    result: ResultArgs,
}

/// Where the outcome goes besides stdout/stderr.
#[derive(clap::Args, Debug, Clone)]
struct ResultArgs {
    /// Also write the outcome (the manifest, or `{"reason","message"}`) to
    /// this file: a Job's `terminationMessagePath`, which the operator reads.
    #[arg(long, env = "REDPILOT_RESULT_FILE")]
    result_file: Option<std::path::PathBuf>,
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
    /// Bucket (or `--dir`).
    #[arg(
        long,
        env = "S3_BUCKET",
        conflicts_with = "dir",
        required_unless_present = "dir"
    )]
    bucket: Option<String>,
    /// A directory (a mounted volume) instead of a bucket.
    #[arg(long)]
    dir: Option<std::path::PathBuf>,
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
    /// The RDB version the server that loads it writes (`REDIS0011` → 11,
    /// `VALKEY080` → 80): newer files are refused before any download.
    #[arg(long)]
    max_rdb_version: Option<u32>,
    /// The engine of the server that loads it: `redis` or `valkey` (Valkey
    /// also reads Redis files up to RDB 11; Redis never reads Valkey's).
    #[arg(long, default_value = "redis", value_parser = ["redis", "valkey"])]
    server_engine: String,
    /// Bootstrap mode (an init container): restore only in the pod named
    /// here (compared with `$POD_NAME`), only while the bootstrap is not
    /// finished (`$REDPILOT_BOOTSTRAPPED` empty) and no primary is
    /// published (`$REDPILOT_PRIMARY` empty: once one is, the data comes
    /// from it), and only once for the Redis whose UID is
    /// `$REDPILOT_RESTORE_OWNER`: `<dest>.restored` holds that UID and the
    /// checksum restored. A file left by another object (a retained volume
    /// of a deleted Redis of the same name) is overwritten, with its AOF.
    #[arg(long)]
    only_pod: Option<String>,
    /// Restore to this time (RFC 3339) from a continuous archive whose
    /// root is `--key`: `--dest` becomes an append-only file (the base as
    /// its RDB preamble, then the commands up to the time).
    #[arg(long)]
    point_in_time: Option<String>,
    /// With `--point-in-time`: the archive's line (`main`, `shard-<i>`).
    #[arg(long, default_value = "main")]
    line: String,
    #[command(flatten)]
    result: ResultArgs,
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

/// Exit status of a backup or restore that failed in a way running it
/// again cannot fix (a Job's podFailurePolicy fails the Job at once on it).
const EXIT_PERMANENT: u8 = 3;

/// The manifest on stdout, or `{"reason", "message"}` on stderr; the same
/// in the result file when one is named. Exit 0, 1 (worth retrying) or
/// [`EXIT_PERMANENT`].
fn report(r: Result<String, redpilot::backup::BackupError>, result: &ResultArgs) -> ExitCode {
    let (text, code) = match r {
        Ok(manifest) => {
            println!("{manifest}");
            (manifest, ExitCode::SUCCESS)
        }
        Err(e) => {
            let line = serde_json::json!({"reason": e.category(), "message": e.to_string()});
            eprintln!("{line}");
            let code = if e.retryable() {
                ExitCode::FAILURE
            } else {
                ExitCode::from(EXIT_PERMANENT)
            };
            (line.to_string(), code)
        }
    };
    if let Some(path) = &result.result_file
        && let Err(e) = std::fs::write(path, text)
    {
        eprintln!("writing the result to {}: {e}", path.display());
    }
    code
}

fn main() -> ExitCode {
    limit_heap_arenas();
    let cli = Cli::parse();
    // A scorecard test prints nothing but its result: the scorecard parses
    // the pod's whole log as JSON.
    let traces = if matches!(cli.command, Command::ScorecardTest(_)) {
        None
    } else {
        telemetry::init(cli.log_format, matches!(cli.command, Command::Run(_)))
    };
    let code = command(cli);
    if let Some(provider) = traces {
        // Sends what is queued (bounded: a collector that is down costs 5 s).
        drop(provider.shutdown_with_timeout(std::time::Duration::from_secs(5)));
    }
    code
}

fn command(cli: Cli) -> ExitCode {
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
            let result = args.result.clone();
            report(runtime.block_on(backup(args)), &result)
        }
        Command::Restore(args) => {
            let Some(runtime) = runtime("restore") else {
                return ExitCode::FAILURE;
            };
            let result = args.result.clone();
            report(runtime.block_on(restore(args)), &result)
        }
        Command::Delete(args) => {
            let Some(runtime) = runtime("delete") else {
                return ExitCode::FAILURE;
            };
            let result = args.result.clone();
            report(runtime.block_on(delete(args)), &result)
        }
        Command::Archive(args) => {
            let Some(runtime) = runtime("archive") else {
                return ExitCode::FAILURE;
            };
            let result = args.result.clone();
            match runtime.block_on(archive(args)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => report(Err(e), &result),
            }
        }
        Command::Exporter(args) => {
            let settings = redpilot::exporter::Settings::new(
                &args.host,
                args.port,
                args.password_dir,
                std::time::Duration::from_millis(args.timeout_ms),
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
        Command::ScorecardTest(args) => {
            let Some(runtime) = runtime("scorecard-test") else {
                return ExitCode::FAILURE;
            };
            let status = runtime.block_on(redpilot::scorecard::run(
                &args.test,
                args.namespace,
                std::time::Duration::from_secs(args.timeout_seconds),
            ));
            match serde_json::to_string_pretty(&status) {
                Ok(json) => println!("{json}"),
                Err(e) => {
                    eprintln!("redpilot scorecard-test: encoding the result: {e}");
                    return ExitCode::FAILURE;
                }
            }
            if status.results.iter().all(|r| r.state == "pass") {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Command::Version => {
            println!("redpilot {}", redpilot::VERSION);
            ExitCode::SUCCESS
        }
        Command::Rules { output } => {
            let text = match serde_yaml::to_string(
                &redpilot::controller::insights::rules::fleet_file(),
            ) {
                Ok(t) => format!(
                    "# Alert rules of Redpilot (generated by `redpilot rules`; do not edit).\n{t}"
                ),
                Err(e) => {
                    eprintln!("redpilot rules: {e}");
                    return ExitCode::FAILURE;
                }
            };
            let written = match output {
                Some(path) => std::fs::write(&path, text),
                None => {
                    print!("{text}");
                    Ok(())
                }
            };
            match written {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("redpilot rules: {e}");
                    ExitCode::FAILURE
                }
            }
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
    if let Some(dir) = &args.dir {
        std::fs::create_dir_all(dir)
            .map_err(|e| BackupError::Invalid(format!("creating {}: {e}", dir.display())))?;
        let store = object_store::local::LocalFileSystem::new_with_prefix(dir)
            .map_err(|e| BackupError::Invalid(format!("the directory {}: {e}", dir.display())))?;
        return Ok((
            std::sync::Arc::new(store),
            format!("file://{}", dir.display()),
        ));
    }
    let Some(bucket) = args.bucket.clone() else {
        return Err(BackupError::Invalid("--bucket or --dir is required".into()));
    };
    // HTTPS to the store goes through rustls with ring, as everything else.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let need = |name: &str| {
        env_value(name)
            .ok_or_else(|| BackupError::Invalid(format!("{name} is not set in the environment")))
    };
    let target = S3Target {
        endpoint: args.endpoint.clone(),
        region: args.region.clone(),
        bucket,
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
        options = match env_value("REDIS_USER") {
            Some(user) => options.with_user(user, pw),
            None => options.with_password(pw),
        };
    }
    if let Some(file) = &args.tls_ca_file {
        let ca = std::fs::read(file).map_err(|e| {
            redpilot::backup::BackupError::Invalid(format!("--tls-ca-file {}: {e}", file.display()))
        })?;
        let mut tls = redpilot::redis::TlsOptions::servers_of_ca(ca);
        if let (Some(cert), Some(key)) = (&args.tls_cert_file, &args.tls_key_file) {
            let read = |flag: &str, file: &std::path::Path| {
                std::fs::read(file).map_err(|e| {
                    redpilot::backup::BackupError::Invalid(format!(
                        "{flag} {}: {e}",
                        file.display()
                    ))
                })
            };
            tls.client_cert_pem = Some(read("--tls-cert-file", cert)?);
            tls.client_key_pem = Some(read("--tls-key-file", key)?);
        }
        options = options.with_tls(tls);
    }
    let source = Source {
        name: args.source_name.unwrap_or_else(|| endpoint.to_string()),
        endpoint,
        options,
        shard: args.shard.zip(args.slots),
        min_offset: args.min_offset,
    };
    let m = backup::backup(&source, store, &location, &args.store.key).await?;
    manifest_json(&m)
}

async fn restore(args: RestoreArgs) -> Result<String, redpilot::backup::BackupError> {
    let mut marker = args.dest.as_os_str().to_owned();
    marker.push(".restored");
    let marker = std::path::PathBuf::from(marker);
    let owner = env_value("REDPILOT_RESTORE_OWNER").unwrap_or_default();
    if args.point_in_time.is_some() && env_value("REDPILOT_BOOTSTRAPPED").is_some() {
        pitr_cleanup(&args.dest, &marker)?;
    }
    if let Some(only) = &args.only_pod {
        let skip = |why: String| Ok(serde_json::json!({"skipped": why}).to_string());
        let pod = env_value("POD_NAME").unwrap_or_default();
        if pod != *only {
            return skip(format!("{pod} is not {only}; it syncs from the primary"));
        }
        if let Some(p) = env_value("REDPILOT_PRIMARY") {
            return skip(format!(
                "a primary is published ({p}); the data comes from it"
            ));
        }
        if let Some(done) = env_value("REDPILOT_BOOTSTRAPPED") {
            return skip(format!(
                "the bootstrap finished ({done}); this instance keeps its own data"
            ));
        }
        let previous = std::fs::read_to_string(&marker).unwrap_or_default();
        if restored_for(&previous, &owner) {
            return skip(format!(
                "already restored for this Redis ({} names it)",
                marker.display()
            ));
        }
    }
    let (store, location) = open_store(&args.store)?;
    let loader = args
        .max_rdb_version
        .map(|max_rdb_version| redpilot::backup::restore::Loader {
            valkey: args.server_engine == "valkey",
            max_rdb_version,
        });
    if let Some(at) = &args.point_in_time {
        return restore_to_time(
            &args,
            at,
            store.as_ref(),
            &location,
            loader,
            &marker,
            &owner,
        )
        .await;
    }
    let m = redpilot::backup::restore(
        store.as_ref(),
        &location,
        &args.store.key,
        &args.dest,
        loader,
    )
    .await?;
    if args.only_pod.is_some() {
        // The server must start from the restored file alone: an AOF left
        // on a retained volume would be loaded instead once AOF is on.
        if let Some(dir) = args.dest.parent() {
            let aof = dir.join("appendonlydir");
            if aof.exists() {
                std::fs::remove_dir_all(&aof).map_err(|e| {
                    redpilot::backup::BackupError::Invalid(format!(
                        "removing {}: {e}",
                        aof.display()
                    ))
                })?;
            }
        }
        std::fs::write(&marker, format!("{owner} {}\n", m.sha256)).map_err(|e| {
            redpilot::backup::BackupError::Invalid(format!("writing {}: {e}", marker.display()))
        })?;
    }
    manifest_json(&m)
}

/// Restores line `--line` of the archive under `--key` to `at` into
/// `--dest` (an append-only file), with the marker the start script and
/// the operator look for.
async fn restore_to_time(
    args: &RestoreArgs,
    at: &str,
    store: &dyn object_store::ObjectStore,
    location: &str,
    loader: Option<redpilot::backup::restore::Loader>,
    marker: &std::path::Path,
    owner: &str,
) -> Result<String, redpilot::backup::BackupError> {
    use redpilot::backup::{BackupError, archive, pitr};
    let ms = chrono::DateTime::parse_from_rfc3339(at)
        .map_err(|e| BackupError::Invalid(format!("--point-in-time {at:?} is not RFC 3339: {e}")))?
        .timestamp_millis();
    let prefix = archive::line_prefix(&args.store.key, &args.line);
    let dir = args.dest.parent().unwrap_or(std::path::Path::new("."));
    // The server starts from this file alone: what an earlier life of the
    // volume left is removed first.
    for stale in [dir.join("appendonlydir"), pitr_dir(&args.dest)] {
        if stale.exists() {
            std::fs::remove_dir_all(&stale)
                .map_err(|e| BackupError::Invalid(format!("removing {}: {e}", stale.display())))?;
        }
    }
    let dump = dir.join("dump.rdb");
    if dump.exists() {
        std::fs::remove_file(&dump)
            .map_err(|e| BackupError::Invalid(format!("removing {}: {e}", dump.display())))?;
    }
    let o = pitr::restore_to(store, location, &prefix, ms, &args.dest, loader).await?;
    if args.only_pod.is_some() {
        std::fs::write(marker, format!("{owner} {}\n", o.sha256))
            .map_err(|e| BackupError::Invalid(format!("writing {}: {e}", marker.display())))?;
    }
    serde_json::to_string(&o)
        .map_err(|e| BackupError::Invalid(format!("encoding the outcome: {e}")))
}

/// The directory a server started on the restored append-only file keeps
/// it in (`appenddirname`, Redis 7+): the file's name without `.aof`.
fn pitr_dir(dest: &std::path::Path) -> std::path::PathBuf {
    dest.with_extension("")
}

/// After the bootstrap finished: once the server saved its data as
/// `dump.rdb` after the restore, the restored append-only file and its
/// marker go (the start script then starts the server as configured).
fn pitr_cleanup(
    dest: &std::path::Path,
    marker: &std::path::Path,
) -> Result<(), redpilot::backup::BackupError> {
    use redpilot::backup::BackupError;
    let modified = |p: &std::path::Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let Some(restored) = modified(marker) else {
        return Ok(());
    };
    let dir = dest.parent().unwrap_or(std::path::Path::new("."));
    if modified(&dir.join("dump.rdb")).is_none_or(|saved| saved < restored) {
        return Ok(());
    }
    let gone = |r: std::io::Result<()>, p: &std::path::Path| match r {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(BackupError::Invalid(format!(
            "removing {}: {e}",
            p.display()
        ))),
        _ => Ok(()),
    };
    gone(std::fs::remove_file(dest), dest)?;
    let d = pitr_dir(dest);
    gone(std::fs::remove_dir_all(&d), &d)?;
    gone(std::fs::remove_file(marker), marker)
}

/// `redpilot archive`: the archiver and its HTTP endpoint.
async fn archive(args: ArchiveArgs) -> Result<(), redpilot::backup::BackupError> {
    use redpilot::backup::BackupError;
    use redpilot::backup::archiver::{self, Settings, State};
    use redpilot::redis::{ConnectOptions, Endpoint, TlsOptions};
    let (store, location) = open_store(&args.store)?;
    let read = |flag: &str, file: &std::path::Path| {
        std::fs::read(file)
            .map_err(|e| BackupError::Invalid(format!("{flag} {}: {e}", file.display())))
    };
    let mut base = ConnectOptions::default();
    if let Some(pw) = env_value("REDIS_PASSWORD") {
        base = match env_value("REDIS_USER") {
            Some(user) => base.with_user(user, pw),
            None => base.with_password(pw),
        };
    }
    let client = match &args.tls_client_dir {
        Some(dir) => Some((
            read("--tls-client-dir", &dir.join("tls.crt"))?,
            read("--tls-client-dir", &dir.join("tls.key"))?,
        )),
        None => None,
    };
    let with_client = |mut t: TlsOptions| {
        if let Some((cert, key)) = &client {
            t.client_cert_pem = Some(cert.clone());
            t.client_key_pem = Some(key.clone());
        }
        t
    };
    // The replication stream always checks the server's certificate: with
    // the servers' CA, the own server is checked like the others (by its
    // chain: it is reached by address).
    let mut peer_options = base.clone();
    if let Some(ca) = &args.tls_ca_file {
        peer_options = peer_options.with_tls(with_client(TlsOptions::servers_of_ca(read(
            "--tls-ca-file",
            ca,
        )?)));
    }
    let own_options = if args.tls_ca_file.is_some() {
        peer_options.clone()
    } else if args.tls_loopback {
        return Err(BackupError::Invalid(
            "--tls-loopback needs --tls-ca-file: the replication stream checks the server's certificate".into(),
        ));
    } else {
        base
    };
    let settings = Settings {
        own: Endpoint::new("127.0.0.1", args.port),
        pod_ip: args.pod_ip.clone(),
        pod: if args.pod.is_empty() {
            "archiver".into()
        } else {
            args.pod.clone()
        },
        own_options,
        peer_options,
        alone: args.alone,
        store,
        location,
        prefix: redpilot::backup::archive::line_prefix(&args.store.key, &args.line),
        shard: args.shard,
        interval: std::time::Duration::from_millis(args.interval_ms),
        checkpoint_every: std::time::Duration::from_millis(args.checkpoint_ms),
        base_every: std::time::Duration::from_secs(args.base_every_seconds.max(10)),
        retention: std::time::Duration::from_secs(args.retention_seconds.max(10)),
        queue_limit: args.queue_limit_mib.max(1) * 1024 * 1024,
        status_port: args
            .listen
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .unwrap_or(9122),
    };
    let state = std::sync::Arc::new(std::sync::Mutex::new(State::default()));
    let listener = tokio::net::TcpListener::bind(&args.listen)
        .await
        .map_err(|e| BackupError::Invalid(format!("listening on {}: {e}", args.listen)))?;
    let shared = state.clone();
    let app = axum::Router::new()
        .route(
            "/status",
            axum::routing::get({
                let s = shared.clone();
                move || async move {
                    let st = s.lock().map(|g| g.clone()).unwrap_or_default();
                    (
                        [("content-type", "application/json")],
                        serde_json::to_string(&st).unwrap_or_default(),
                    )
                }
            }),
        )
        .route(
            "/metrics",
            axum::routing::get(move || async move {
                let st = shared.lock().map(|g| g.clone()).unwrap_or_default();
                archiver::metrics(&st, chrono::Utc::now().timestamp_millis())
            }),
        );
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "archive endpoint stopped");
        }
    });
    tracing::info!(prefix = %settings.prefix, alone = settings.alone, "archiver started");
    archiver::run(settings, state).await;
    Ok(())
}

/// Whether a restore marker's text names `owner` (a Redis UID): the file
/// holds `<uid> <sha256>`. A marker without a UID (written before UIDs were
/// recorded) or with another one belongs to another object.
fn restored_for(marker: &str, owner: &str) -> bool {
    let mut words = marker.split_whitespace();
    !owner.is_empty() && words.next() == Some(owner) && words.next().is_some()
}

async fn delete(args: DeleteArgs) -> Result<String, redpilot::backup::BackupError> {
    let (store, location) = open_store(&args.store)?;
    let mut deleted = Vec::new();
    for key in std::iter::once(&args.store.key).chain(&args.also_key) {
        let at = format!("{location}/{key}");
        redpilot::backup::store::delete(store.as_ref(), &at, key).await?;
        deleted.push(at);
    }
    Ok(serde_json::json!({"deleted": deleted.join(", ")}).to_string())
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
    let settings = Arc::new(controller::Settings {
        endpoints: controller::trust::EndpointPolicy::parse(&args.s3_endpoints)?,
        namespace: args.leader_election_namespace.clone(),
        certs: controller::redis::issuer::CertPolicy::new(
            Duration::from_secs(args.tls_cert_validity_seconds),
            Duration::from_secs(args.tls_renew_before_seconds),
        )?,
        tuning_interval: Duration::from_secs(args.tuning_interval_seconds),
    });
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
    let namespaces = controller::base::watch_namespaces(Some(&args.watch_namespace));
    give_back_freed_heap();
    give_back_binary_pages();
    tracing::info!(
        version = redpilot::VERSION,
        namespaces = ?namespaces,
        related_images = images.len(),
        s3_endpoints_restricted = !settings.endpoints.is_open(),
        "starting controllers (all namespaces when empty)"
    );
    let result = tokio::select! {
        _ = controller::run_controllers(client.clone(), namespaces, metrics.clone(), images, settings, health.clone(), args.max_concurrent_reconciles) => Ok(()),
        _ = leader::keep(&lease_client, &lease, &health) => Err("lost leadership".into()),
    };
    metrics.leader.set(0);
    http.abort();
    result
}

/// How often the operator gives freed heap back to the system.
const TRIM_EVERY: std::time::Duration = std::time::Duration::from_secs(30);

/// glibc's allocator keeps what a burst of work freed in its per-thread
/// arenas: an operator started beside a thousand Redis lists and reconciles
/// them all at once and would keep most of that peak (the README's
/// performance section has the figures). Every [`TRIM_EVERY`] the free
/// pages of every arena go back (`malloc_trim`).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn give_back_freed_heap() {
    tokio::spawn(async {
        let mut tick = tokio::time::interval(TRIM_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            // SAFETY: `malloc_trim` takes the allocator's own locks and
            // releases only memory no allocation holds.
            unsafe {
                libc::malloc_trim(0);
            }
        }
    });
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn give_back_freed_heap() {}

/// glibc gives each thread that allocates while another holds the lock an
/// arena of its own, up to eight per core; what a burst of work leaves live
/// in each (a cache entry here, a connection there) keeps whole pages of
/// every arena from going back. Two arenas serve the runtime's few threads.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn limit_heap_arenas() {
    // SAFETY: called first in `main`, before any other thread exists or
    // anything is allocated on one; mallopt only sets the allocator's knob.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn limit_heap_arenas() {}

/// When the operator first lets go of the binary's pages it ran at start
/// (the clients set up, the caches listed), and how often after that it
/// lets go of those it has not needed since (they come back on use: see
/// [`redpilot::pages`]).
const UNMAP_FIRST: std::time::Duration = std::time::Duration::from_secs(60);
const UNMAP_EVERY: std::time::Duration = std::time::Duration::from_secs(300);
/// Every how many unmappings (the first one included) the binary's pages no
/// process maps also leave the page cache: every 30 minutes. Pages touched
/// since are read back from the disk one at a time, so evicting at every
/// unmapping would read the idle path's few MiB again every 5 minutes; in
/// between, only pages touched since the last eviction are cached, and the
/// unmapping maps back no more than those.
const EVICT_EVERY_NTH: u64 = 6;

#[cfg(target_os = "linux")]
fn give_back_binary_pages() {
    tokio::spawn(async {
        let start = tokio::time::Instant::now() + UNMAP_FIRST;
        let mut tick = tokio::time::interval_at(start, UNMAP_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        for round in 0u64.. {
            tick.tick().await;
            let evict = round % EVICT_EVERY_NTH == 0;
            match redpilot::pages::unmap_idle_binary_pages(evict) {
                Ok(bytes) => tracing::debug!(bytes, evict, "binary pages unmapped"),
                Err(e) => {
                    tracing::info!(error = %e, "binary pages left mapped");
                    return;
                }
            }
        }
    });
}

#[cfg(not(target_os = "linux"))]
fn give_back_binary_pages() {}

#[cfg(test)]
mod tests {
    use super::restored_for;

    #[test]
    fn a_restore_marker_counts_only_for_the_redis_it_names() {
        assert!(restored_for("uid-1 abc\n", "uid-1"));
        assert!(!restored_for("uid-2 abc\n", "uid-1"), "another object");
        assert!(!restored_for("abc\n", "uid-1"), "an old marker names none");
        assert!(!restored_for("", "uid-1"), "no marker");
        assert!(!restored_for("uid-1 abc", ""), "no owner given");
    }
}
