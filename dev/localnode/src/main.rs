//! localnode: a kubelet stand-in for Redpilot's dev cluster. It registers a
//! Node, runs the pods bound to it as local processes (one network
//! namespace per pod, a private mount namespace per container), reports
//! their status like a kubelet, and provisions hostPath volumes for the
//! default StorageClass. See dev/README.md.

mod cgroup;
mod cmd;
mod env;
mod error;
mod images;
mod kubelet;
mod launch;
mod logs;
mod net;
mod node;
mod oci;
mod pod;
mod probe;
mod provisioner;
mod resize;
mod volumes;

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand};
use futures::TryStreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::runtime::watcher;
use tokio::sync::mpsc;

use crate::error::{Error, Result};
use crate::pod::{NodeCtx, PodMsg, Worker};

#[derive(Parser, Debug)]
#[command(
    name = "localnode",
    version,
    about = "Runs the dev cluster's pods as local processes"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Register the node and run the pods bound to it.
    Run(Box<RunArgs>),
    /// Internal: set up a container's root and exec its program.
    ExecContainer { spec: PathBuf },
    /// Kill every pod process and remove every namespace, veth, memory
    /// cgroup and the bridge.
    Cleanup {
        #[arg(long, default_value = "rp")]
        instance_prefix: String,
    },
}

#[derive(clap::Args, Debug)]
struct RunArgs {
    /// Kubeconfig of the dev cluster.
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    #[arg(long, default_value = "localnode")]
    node_name: String,
    /// Repository root ({repo} in the image mapping).
    #[arg(long, default_value = ".")]
    repo: PathBuf,
    /// Node state: pod directories, logs, volumes.
    #[arg(long, default_value = ".dev/localnode")]
    state_dir: PathBuf,
    /// The image → executable mapping.
    #[arg(long, default_value = "dev/images.yaml")]
    images: PathBuf,
    /// Node (bridge) address and prefix; pods get addresses in the same subnet.
    #[arg(long, default_value = "10.244.0.1/16")]
    pod_network: String,
    /// Allocatable CPUs to advertise (default: the host's).
    #[arg(long)]
    cpu: Option<f64>,
    /// Allocatable memory in MiB to advertise (default: the host's).
    #[arg(long)]
    memory_mib: Option<i64>,
    #[arg(long, default_value_t = 110)]
    max_pods: i64,
    /// Prefix of the host objects this node creates: bridge <p>node0,
    /// network namespaces <p>-<id>, veths <p>v<id>, memory cgroups under
    /// /sys/fs/cgroup/memory/<p>.
    #[arg(long, default_value = "rp")]
    instance_prefix: String,
    /// Run the default StorageClass's provisioner (one node per cluster should).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    provisioner: bool,
    /// Register the node as unschedulable (only pods naming it in
    /// spec.nodeName land there).
    #[arg(long)]
    unschedulable: bool,
    /// Address of the kubelet API (pod logs), advertised as the Node's
    /// Hostname address: the API server connects there.
    #[arg(long, default_value = "127.0.0.1")]
    kubelet_address: std::net::IpAddr,
    /// Port of the kubelet API (another free one when it is taken).
    #[arg(long, default_value_t = 10250)]
    kubelet_port: u16,
}

fn main() {
    let cli = Cli::parse();
    match cli.command {
        Command::ExecContainer { spec } => {
            let err = launch::exec_container(&spec);
            eprintln!("localnode exec-container: {err}");
            std::process::exit(127);
        }
        Command::Cleanup { instance_prefix } => {
            let names = match net::Names::new(&instance_prefix) {
                Ok(n) => n,
                Err(e) => {
                    eprintln!("localnode: {e}");
                    std::process::exit(2);
                }
            };
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("localnode: {e}");
                    std::process::exit(1);
                }
            };
            rt.block_on(shutdown_pods(&names, Duration::from_secs(0)));
        }
        Command::Run(args) => {
            tracing_subscriber::fmt()
                .with_ansi(false)
                .with_env_filter(
                    tracing_subscriber::EnvFilter::try_from_default_env()
                        .unwrap_or_else(|_| "info".into()),
                )
                .init();
            let rt = match tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("localnode: {e}");
                    std::process::exit(1);
                }
            };
            let names = match net::Names::new(&args.instance_prefix) {
                Ok(n) => n,
                Err(e) => {
                    eprintln!("localnode: {e}");
                    std::process::exit(2);
                }
            };
            if let Err(e) = rt.block_on(run(*args, names.clone())) {
                tracing::error!(error = %e, "localnode failed");
                rt.block_on(shutdown_pods(&names, Duration::from_secs(0)));
                std::process::exit(1);
            }
        }
    }
}

fn absolute(p: &Path) -> Result<PathBuf> {
    if p.is_absolute() {
        Ok(p.to_path_buf())
    } else {
        Ok(std::env::current_dir()
            .map_err(|e| Error::Io {
                path: p.to_path_buf(),
                source: e,
            })?
            .join(p))
    }
}

async fn client(kubeconfig: Option<&Path>) -> Result<(kube::Client, Option<u16>)> {
    let config = match kubeconfig {
        Some(path) => {
            let kc =
                kube::config::Kubeconfig::read_from(path).map_err(|source| Error::Kubeconfig {
                    path: path.to_path_buf(),
                    source,
                })?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|source| Error::Kubeconfig {
                    path: path.to_path_buf(),
                    source,
                })?
        }
        None => kube::Config::infer()
            .await
            .map_err(|e| Error::Setup(format!("no kubeconfig: {e}")))?,
    };
    let port = config.cluster_url.port_u16().or(Some(443));
    Ok((kube::Client::try_from(config)?, port))
}

fn parse_cidr(s: &str) -> Result<(Ipv4Addr, u8)> {
    let bad = || Error::Setup(format!("--pod-network {s}: expected ADDRESS/PREFIX"));
    let (a, p) = s.split_once('/').ok_or_else(bad)?;
    let ip: Ipv4Addr = a.parse().map_err(|_| bad())?;
    let prefix: u8 = p.parse().map_err(|_| bad())?;
    if !(8..=30).contains(&prefix) {
        return Err(bad());
    }
    Ok((ip, prefix))
}

async fn run(args: RunArgs, names: net::Names) -> Result<()> {
    let repo = absolute(&args.repo)?;
    let state_dir = absolute(&args.state_dir)?;
    let images_path = if args.images.is_absolute() {
        args.images.clone()
    } else {
        repo.join(&args.images)
    };
    let images = images::ImageMap::load(&images_path, &repo)?;
    let (gateway, prefix) = parse_cidr(&args.pod_network)?;
    let self_exe = std::env::current_exe().map_err(|e| Error::Setup(format!("own path: {e}")))?;

    // Whatever an earlier run left behind goes first.
    net::cleanup_all(&names).await;
    cgroup::cleanup_all(&names.prefix).await;
    remove_run_dirs(&state_dir);
    let memory = cgroup::Memory::new(&names.prefix);
    let network = net::Network::new(names.clone(), gateway, prefix);
    network.ensure_bridge().await?;

    let (client, apiserver_port) = client(args.kubeconfig.as_deref()).await?;
    let cpu_millis = (args.cpu.unwrap_or(node::host_cpus() as f64) * 1000.0) as i64;
    let memory_bytes = args
        .memory_mib
        .map(|m| m * 1024 * 1024)
        .unwrap_or_else(node::host_memory);
    let kubelet = kubelet::bind(args.kubelet_address, args.kubelet_port, &args.node_name).await?;
    let info = node::NodeInfo {
        name: args.node_name.clone(),
        address: gateway.to_string(),
        kubelet_address: kubelet.addr.ip().to_string(),
        kubelet_port: kubelet.addr.port(),
        cpu_millis,
        memory_bytes,
        max_pods: args.max_pods,
        unschedulable: args.unschedulable,
    };

    let prov = provisioner::Provisioner {
        client: client.clone(),
        node_name: args.node_name.clone(),
        volumes_dir: state_dir.join("volumes"),
    };
    if args.provisioner {
        prov.ensure_class().await?;
    }
    let node_obj = node::register(&client, &info).await?;
    node::renew_lease(&client, &node_obj, &info).await?;
    tracing::info!(node = %info.name, address = %info.address, kubelet = %kubelet.addr, cpu_millis, memory_bytes, "node registered");

    tokio::spawn(node::heartbeat(client.clone(), node_obj, info.clone()));
    if args.provisioner {
        tokio::spawn(prov.run());
    }

    let ctx = Arc::new(NodeCtx {
        client: client.clone(),
        node_name: args.node_name.clone(),
        images,
        net: network,
        state_dir: state_dir.clone(),
        self_exe,
        cpu_millis,
        memory_bytes,
        apiserver_port,
        stopping: std::sync::atomic::AtomicBool::new(false),
        memory,
        allocations: std::sync::Mutex::new(BTreeMap::new()),
        logs: logs::LogIndex::default(),
    });
    tokio::spawn(kubelet::serve(kubelet, ctx.clone()));

    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| Error::Setup(format!("signal handler: {e}")))?;
    tokio::select! {
        r = watch_pods(ctx.clone()) => r?,
        _ = sigterm.recv() => tracing::info!("SIGTERM: stopping"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: stopping"),
    }
    ctx.stopping
        .store(true, std::sync::atomic::Ordering::SeqCst);
    shutdown_pods(&names, Duration::from_secs(5)).await;
    remove_run_dirs(&state_dir);
    tracing::info!("localnode stopped");
    Ok(())
}

/// Dispatches pod events to one worker per pod UID.
async fn watch_pods(ctx: Arc<NodeCtx>) -> Result<()> {
    let api: Api<Pod> = Api::all(ctx.client.clone());
    let cfg = watcher::Config::default().fields(&format!("spec.nodeName={}", ctx.node_name));
    let stream = watcher(api, cfg);
    futures::pin_mut!(stream);
    let mut workers: BTreeMap<String, mpsc::UnboundedSender<PodMsg>> = BTreeMap::new();
    let mut seen: BTreeSet<String> = BTreeSet::new();
    // Pods whose worker has finished (terminated and deleted them). Events
    // about them can still arrive (the deletion itself is a modification);
    // they must not start a second worker. Forgotten once the API reports
    // the pod deleted, or a re-list no longer has it.
    let mut finished: BTreeSet<String> = BTreeSet::new();
    loop {
        let ev = match stream.try_next().await {
            Ok(Some(ev)) => ev,
            Ok(None) => return Err(Error::Setup("pod watch ended".into())),
            Err(e) => {
                tracing::warn!(error = %e, "pod watch error");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        workers.retain(|uid, tx| {
            let open = !tx.is_closed();
            if !open {
                finished.insert(uid.clone());
            }
            open
        });
        match ev {
            watcher::Event::Init => seen.clear(),
            watcher::Event::InitApply(pod) | watcher::Event::Apply(pod) => {
                let Some(uid) = pod.metadata.uid.clone() else {
                    continue;
                };
                seen.insert(uid.clone());
                if finished.contains(&uid) {
                    continue;
                }
                match workers.get(&uid) {
                    Some(tx) => {
                        let _ = tx.send(PodMsg::Update(Box::new(pod)));
                    }
                    None => {
                        let (tx, rx) = mpsc::unbounded_channel();
                        let worker = Worker::new(ctx.clone(), pod);
                        tokio::spawn(worker.run(rx));
                        workers.insert(uid, tx);
                    }
                }
            }
            watcher::Event::InitDone => {
                for (uid, tx) in &workers {
                    if !seen.contains(uid) {
                        let _ = tx.send(PodMsg::Gone);
                    }
                }
                finished.retain(|uid| seen.contains(uid));
            }
            watcher::Event::Delete(pod) => {
                if let Some(uid) = pod.metadata.uid.as_ref() {
                    if let Some(tx) = workers.get(uid) {
                        let _ = tx.send(PodMsg::Gone);
                    }
                    finished.remove(uid);
                }
            }
        }
    }
}

/// Stops every pod process: SIGTERM, then SIGKILL after `grace`; removes
/// all pod namespaces, veths, memory cgroups and the bridge.
async fn shutdown_pods(names: &net::Names, grace: Duration) {
    if !grace.is_zero() {
        let nss = net_namespaces(names).await;
        for ns in &nss {
            signal_netns(ns, rustix::process::Signal::TERM).await;
        }
        let deadline = tokio::time::Instant::now() + grace;
        while tokio::time::Instant::now() < deadline {
            let mut any = false;
            for ns in &nss {
                if let Ok(out) = cmd::run("ip", &["netns", "pids", ns]).await {
                    any |= !out.trim().is_empty();
                }
            }
            if !any {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    net::cleanup_all(names).await;
    cgroup::cleanup_all(&names.prefix).await;
}

async fn net_namespaces(names: &net::Names) -> Vec<String> {
    cmd::run("ip", &["netns", "list"])
        .await
        .map(|out| {
            out.lines()
                .filter_map(|l| l.split_whitespace().next())
                .filter(|n| n.starts_with(&names.netns_prefix))
                .map(String::from)
                .collect()
        })
        .unwrap_or_default()
}

async fn signal_netns(ns: &str, sig: rustix::process::Signal) {
    if let Ok(out) = cmd::run("ip", &["netns", "pids", ns]).await {
        for pid in out.split_whitespace().filter_map(|p| p.parse::<i32>().ok()) {
            if let Some(pid) = rustix::process::Pid::from_raw(pid) {
                let _ = rustix::process::kill_process(pid, sig);
            }
        }
    }
}

/// Removes per-pod runtime directories (volumes of dead pods); logs stay.
fn remove_run_dirs(state_dir: &Path) {
    let Ok(pods) = std::fs::read_dir(state_dir.join("pods")) else {
        return;
    };
    for p in pods.flatten() {
        if let Ok(inner) = std::fs::read_dir(p.path()) {
            for e in inner.flatten() {
                if e.file_name().to_string_lossy().starts_with("run-") {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
    }
}
