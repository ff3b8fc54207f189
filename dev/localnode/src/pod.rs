//! One worker per pod bound to this node: sandbox, volumes, containers,
//! probes, restarts, status, graceful termination and the final deletion.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{
    Container, Event, ObjectReference, Pod, Probe, ResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::task::AbortHandle;

use crate::cgroup;
use crate::env::{Refs, expand, field_value, resource_value};
use crate::error::{Error, IoContext, Result};
use crate::images::{ImageError, ImageMap, ResolvedImage};
use crate::launch::{LaunchSpec, MountSpec};
use crate::net::{Network, PodNet};
use crate::probe::{self, Outcome, Target};
use crate::resize::{self, Amounts, Fit, Member, Named};
use crate::volumes::{VolumeCtx, materialize};

const DEFAULT_PATH: &str =
    "/.image/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
const MAX_BACKOFF: Duration = Duration::from_secs(300);
const FIRST_BACKOFF: Duration = Duration::from_secs(10);
const BACKOFF_RESET_AFTER: Duration = Duration::from_secs(600);
/// A pod's Secret, ConfigMap and projected volumes are refreshed every
/// 10–30 s, drawn anew each time (see [`volume_resync`]).
const VOLUME_RESYNC: Duration = Duration::from_secs(10);
const VOLUME_RESYNC_JITTER_MS: u64 = 20_000;

/// How long until a pod's volumes are refreshed again. A kubelet refreshes
/// them at its periodic, jittered sync of each pod (a minute or more), so
/// pods that mount one Secret see a change of it at different moments;
/// drawn per refresh, so pods started together drift apart as they do there.
fn volume_resync() -> Duration {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0);
    VOLUME_RESYNC + Duration::from_millis(h.finish() % VOLUME_RESYNC_JITTER_MS)
}
/// How soon a resize that failed to actuate (a memory limit below the
/// current usage) is tried again.
const RESIZE_RETRY: Duration = Duration::from_secs(3);

/// What every pod worker shares.
pub struct NodeCtx {
    pub client: kube::Client,
    pub node_name: String,
    pub images: ImageMap,
    pub net: Network,
    pub state_dir: PathBuf,
    pub self_exe: PathBuf,
    pub cpu_millis: i64,
    pub memory_bytes: i64,
    /// The apiserver's port; pods reach it as kubernetes.default.svc (an
    /// /etc/hosts entry for the node address; the serving certificate
    /// names it).
    pub apiserver_port: Option<u16>,
    /// Set on shutdown: no container is (re)started any more.
    pub stopping: std::sync::atomic::AtomicBool,
    /// The memory cgroups that enforce containers' memory limits.
    pub memory: cgroup::Memory,
    /// Allocated requests of every pod this node runs, by UID: what a
    /// resize must fit next to.
    pub allocations: std::sync::Mutex<BTreeMap<String, Amounts>>,
    /// Where each container run's output lies in its log file (for the
    /// kubelet API's `/containerLogs`).
    pub logs: crate::logs::LogIndex,
}

impl NodeCtx {
    pub fn host_ip(&self) -> String {
        self.net.gateway.to_string()
    }

    /// Allocatable as the Node advertises it (memory in whole KiB).
    fn allocatable(&self) -> Amounts {
        Amounts {
            cpu_millis: self.cpu_millis,
            memory: self.memory_bytes / 1024 * 1024,
        }
    }

    fn set_allocation(&self, uid: &str, requests: Option<Amounts>) {
        if let Ok(mut m) = self.allocations.lock() {
            match requests {
                Some(r) => m.insert(uid.to_string(), r),
                None => m.remove(uid),
            };
        }
    }

    /// The allocated requests of every pod but this one.
    fn others(&self, uid: &str) -> Amounts {
        self.allocations
            .lock()
            .map(|m| {
                m.iter()
                    .filter(|(u, _)| u.as_str() != uid)
                    .fold(Amounts::default(), |acc, (_, a)| acc + *a)
            })
            .unwrap_or_default()
    }
}

/// Messages from the pod watcher to a worker.
#[derive(Debug)]
pub enum PodMsg {
    Update(Box<Pod>),
    /// The pod is gone from the API (force deletion).
    Gone,
}

#[derive(Debug)]
enum Ev {
    Exited {
        idx: usize,
        epoch: u64,
        status: std::process::ExitStatus,
    },
    Probe {
        idx: usize,
        epoch: u64,
        kind: ProbeKind,
        outcome: Outcome,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ProbeKind {
    Startup,
    Readiness,
    Liveness,
}

#[derive(Debug, Clone)]
struct Terminated {
    exit_code: i32,
    signal: Option<i32>,
    reason: String,
    message: Option<String>,
    started_at: Timestamp,
    finished_at: Timestamp,
    container_id: String,
}

#[derive(Debug)]
struct Running {
    pid: u32,
    epoch: u64,
    started_at: Timestamp,
    started_instant: Instant,
    probes: Vec<AbortHandle>,
    env: Vec<(String, String)>,
    container_id: String,
    /// Where the container's termination message lands on the host.
    message: MessageSource,
    /// The resources in force for this process (the kubelet's "actual").
    resources: ResourceRequirements,
    /// The container's memory cgroup, when limits are enforced.
    cgroup: Option<PathBuf>,
    /// The cgroup's OOM kill count when this run started.
    oom_base: Option<u64>,
}

/// Where a container's termination message is read from when it exits
/// (the kubelet's `terminationMessagePath` and `terminationMessagePolicy`).
#[derive(Debug, Clone, Default)]
struct MessageSource {
    /// Host path of the container's `terminationMessagePath`, when the path
    /// lies in a volume or in the container's `/tmp` (the local node has no
    /// per-file bind over `/dev`; see dev/README.md).
    file: Option<PathBuf>,
    /// `FallbackToLogsOnError`: the log's tail when the file is empty and
    /// the container failed.
    fallback_to_logs: bool,
    /// The log file and its length when this run started.
    log: Option<(PathBuf, u64)>,
}

/// The kubelet's bounds: a message file is read up to 4 KiB; the log
/// fallback takes at most the last 80 lines and 2 KiB.
const MESSAGE_FILE_MAX: usize = 4096;
const MESSAGE_LOG_LINES: usize = 80;
const MESSAGE_LOG_MAX: usize = 2048;

impl MessageSource {
    fn read(&self, failed: bool) -> Option<String> {
        if let Some(f) = &self.file
            && let Ok(bytes) = std::fs::read(f)
            && !bytes.is_empty()
        {
            let end = bytes.len().min(MESSAGE_FILE_MAX);
            return Some(String::from_utf8_lossy(&bytes[..end]).into_owned());
        }
        if !(self.fallback_to_logs && failed) {
            return None;
        }
        let (path, from) = self.log.as_ref()?;
        // Only this run's part of the log (it is appended across restarts).
        let mut run = Vec::new();
        {
            use std::io::{Read, Seek, SeekFrom};
            let mut f = std::fs::File::open(path).ok()?;
            f.seek(SeekFrom::Start(*from)).ok()?;
            f.read_to_end(&mut run).ok()?;
        }
        let text = String::from_utf8_lossy(&run);
        let lines: Vec<&str> = text.trim_end().lines().collect();
        let tail = lines[lines.len().saturating_sub(MESSAGE_LOG_LINES)..].join("\n");
        let mut start = tail.len().saturating_sub(MESSAGE_LOG_MAX);
        while !tail.is_char_boundary(start) {
            start += 1;
        }
        let tail = &tail[start..];
        (!tail.is_empty()).then(|| tail.to_string())
    }
}

/// The host path behind `path` inside a container: the volume mounted
/// deepest above it, or the container's private `/tmp`.
fn host_path_of(path: &str, mounts: &[MountSpec], tmp: &Path) -> Option<PathBuf> {
    let under = |base: &str| -> Option<String> {
        let base = base.trim_end_matches('/');
        let rest = path.strip_prefix(base)?;
        (rest.is_empty() || rest.starts_with('/')).then(|| rest.trim_start_matches('/').to_string())
    };
    let best = mounts
        .iter()
        .filter(|m| !m.read_only)
        .filter_map(|m| under(&m.target).map(|rest| (m.target.len(), m.source.join(rest))))
        .max_by_key(|(len, _)| *len)
        .map(|(_, p)| p);
    best.or_else(|| under("/tmp").map(|rest| tmp.join(rest)))
        .filter(|p| !p.as_os_str().is_empty())
}

#[derive(Debug)]
struct Ctr {
    /// The spec; its `resources` are the allocated ones (below).
    spec: Container,
    init: bool,
    /// The resources the node admitted (at start: the spec's; after an
    /// accepted resize: the new ones). A (re)start runs with these.
    allocated: ResourceRequirements,
    image_ref: String,
    image_id: String,
    run: Option<Running>,
    waiting: (String, Option<String>),
    last: Option<Terminated>,
    /// The termination before `last`: `lastState` once the container has
    /// terminated for good (the kubelet shows the previous instance there).
    prev: Option<Terminated>,
    restart_count: i32,
    next_start: Instant,
    backoff: Duration,
    /// Succeeded (init) or terminated for good (regular).
    done: bool,
    ready: bool,
    started: bool,
    ready_ok: i32,
    ready_fail: i32,
    live_fail: i32,
    startup_fail: i32,
    image_attempts: u32,
}

impl Ctr {
    fn new(spec: Container, init: bool, restart_base: i32) -> Self {
        let image_ref = spec.image.clone().unwrap_or_default();
        let allocated = spec.resources.clone().unwrap_or_default();
        Self {
            spec,
            init,
            allocated,
            image_id: String::new(),
            image_ref,
            run: None,
            waiting: ("ContainerCreating".into(), None),
            last: None,
            prev: None,
            restart_count: restart_base,
            next_start: Instant::now(),
            backoff: Duration::ZERO,
            done: false,
            ready: false,
            started: false,
            ready_ok: 0,
            ready_fail: 0,
            live_fail: 0,
            startup_fail: 0,
            image_attempts: 0,
        }
    }
}

/// Runs one pod until it is deleted.
pub struct Worker {
    ctx: Arc<NodeCtx>,
    pod: Pod,
    uid: String,
    ns: String,
    name: String,
    log_dir: PathBuf,
    run_dir: PathBuf,
    net: Option<PodNet>,
    volumes: Option<BTreeMap<String, PathBuf>>,
    last_volume_sync: Instant,
    /// How long after `last_volume_sync` the volumes are refreshed.
    volume_resync: Duration,
    ctrs: Vec<Ctr>,
    epoch: u64,
    final_phase: Option<&'static str>,
    start_time: Timestamp,
    conditions: BTreeMap<&'static str, (bool, Timestamp)>,
    last_pushed: Option<Value>,
    ev_tx: mpsc::UnboundedSender<Ev>,
    ev_rx: mpsc::UnboundedReceiver<Ev>,
    last_event: BTreeMap<String, String>,
    gone: bool,
    /// The pod address; kept in the status after teardown, like the kubelet.
    status_ip: String,
    /// Process group of every container started in this pod (each is led by
    /// the container's first process); teardown waits until all are empty.
    groups: Vec<i32>,
    resize: ResizeState,
}

/// A resize condition (`PodResizePending` / `PodResizeInProgress`), True
/// while it is there.
#[derive(Debug, Clone)]
struct ResizeCond {
    reason: Option<String>,
    message: Option<String>,
    generation: Option<i64>,
    since: Timestamp,
}

impl ResizeCond {
    /// Sets the condition; the transition time stays while reason and
    /// message do.
    fn set(
        slot: &mut Option<ResizeCond>,
        reason: Option<&str>,
        message: Option<&str>,
        generation: Option<i64>,
    ) {
        let same = slot
            .as_ref()
            .is_some_and(|c| c.reason.as_deref() == reason && c.message.as_deref() == message);
        let since = match slot {
            Some(c) if same => c.since,
            _ => now(),
        };
        *slot = Some(ResizeCond {
            reason: reason.map(String::from),
            message: message.map(String::from),
            generation,
            since,
        });
    }
}

/// In-place resize bookkeeping of a pod (see resize.rs).
#[derive(Debug, Default)]
struct ResizeState {
    pending: Option<ResizeCond>,
    in_progress: Option<ResizeCond>,
    /// The pod cgroup's memory limit as last written; `None` until the
    /// first container started (the cgroup does not exist yet).
    pod_limit: Option<Option<i64>>,
    /// No actuation before this (after a failed one).
    retry_at: Option<Instant>,
    /// The generation whose actuation error was already recorded as an Event.
    error_reported: Option<i64>,
    /// What each regular container ran with before the resize in progress.
    before: Vec<(String, ResourceRequirements)>,
}

fn now() -> Timestamp {
    Timestamp::now()
}

impl Worker {
    pub fn new(ctx: Arc<NodeCtx>, pod: Pod) -> Self {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let log_dir = ctx.state_dir.join("pods").join(format!("{ns}_{name}"));
        let run_dir = log_dir.join(format!("run-{}", short_id(&uid)));
        let spec = pod.spec.clone().unwrap_or_default();
        // Carry restart counts over a node restart.
        let old = |init: bool, n: &str| -> i32 {
            let st = pod.status.as_ref();
            let list = if init {
                st.and_then(|s| s.init_container_statuses.as_ref())
            } else {
                st.and_then(|s| s.container_statuses.as_ref())
            };
            list.and_then(|l| l.iter().find(|c| c.name == n))
                .map(|c| c.restart_count)
                .unwrap_or(0)
        };
        let mut ctrs = Vec::new();
        for c in spec.init_containers.unwrap_or_default() {
            let base = old(true, &c.name);
            ctrs.push(Ctr::new(c, true, base));
        }
        for c in spec.containers {
            let base = old(false, &c.name);
            let mut ctr = Ctr::new(c, false, base);
            // After a node restart the allocation is what the status last
            // reported (the kubelet keeps it in a checkpoint): a resize the
            // node had not accepted stays a resize to decide on.
            if let Some(cs) = pod
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .and_then(|l| l.iter().find(|s| s.name == ctr.spec.name))
                && let Some(res) = &cs.resources
            {
                ctr.allocated = ResourceRequirements {
                    requests: cs.allocated_resources.clone().or(res.requests.clone()),
                    limits: res.limits.clone(),
                    ..Default::default()
                };
                ctr.spec.resources = Some(ctr.allocated.clone());
            }
            ctrs.push(ctr);
        }
        let (ev_tx, ev_rx) = mpsc::unbounded_channel();
        let start_time = pod
            .status
            .as_ref()
            .and_then(|s| s.start_time.as_ref())
            .map(|t| t.0)
            .unwrap_or_else(now);
        let final_phase = match pod.status.as_ref().and_then(|s| s.phase.as_deref()) {
            Some("Succeeded") => Some("Succeeded"),
            Some("Failed") => Some("Failed"),
            _ => None,
        };
        Self {
            ctx,
            pod,
            uid,
            ns,
            name,
            log_dir,
            run_dir,
            net: None,
            volumes: None,
            last_volume_sync: Instant::now(),
            volume_resync: volume_resync(),
            ctrs,
            epoch: 0,
            final_phase,
            start_time,
            conditions: BTreeMap::new(),
            last_pushed: None,
            ev_tx,
            ev_rx,
            last_event: BTreeMap::new(),
            gone: false,
            status_ip: String::new(),
            groups: Vec::new(),
            resize: ResizeState::default(),
        }
    }

    fn members(&self) -> Vec<Member<'_>> {
        self.ctrs
            .iter()
            .map(|c| Member {
                init: c.init,
                resources: &c.allocated,
            })
            .collect()
    }

    /// Records this pod's allocated requests for other pods' fit checks.
    fn register_allocation(&self) {
        let requests = resize::pod_requests(&self.members());
        self.ctx.set_allocation(&self.uid, Some(requests));
    }

    fn restart_policy(&self) -> String {
        self.pod
            .spec
            .as_ref()
            .and_then(|s| s.restart_policy.clone())
            .unwrap_or_else(|| "Always".into())
    }

    fn deleting(&self) -> bool {
        self.gone || self.pod.metadata.deletion_timestamp.is_some()
    }

    /// The worker's life: runs until the pod is deleted and cleaned up.
    pub async fn run(mut self, mut rx: mpsc::UnboundedReceiver<PodMsg>) {
        tracing::info!(pod = %format!("{}/{}", self.ns, self.name), uid = %self.uid, "pod worker started");
        let mut tick = tokio::time::interval(Duration::from_millis(500));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        if self.final_phase.is_none() {
            self.register_allocation();
        }
        loop {
            tokio::select! {
                msg = rx.recv() => match msg {
                    Some(PodMsg::Update(p)) => self.pod = *p,
                    Some(PodMsg::Gone) | None => self.gone = true,
                },
                Some(ev) = self.ev_rx.recv() => self.handle(ev).await,
                _ = tick.tick() => {}
            }
            if self.deleting() {
                self.terminate(&mut rx).await;
                break;
            }
            if let Err(e) = self.step().await {
                tracing::warn!(pod = %self.name, error = %e, "pod step failed");
            }
            self.push_status().await;
        }
        self.ctx.set_allocation(&self.uid, None);
        self.ctx.logs.forget_pod(&self.uid);
        tracing::info!(pod = %format!("{}/{}", self.ns, self.name), "pod worker finished");
    }

    async fn step(&mut self) -> Result<()> {
        if self.final_phase.is_some() || self.ctx.stopping.load(std::sync::atomic::Ordering::SeqCst)
        {
            return Ok(());
        }
        // Before any (re)start: a container starts with what is allocated.
        self.sync_resize().await;
        if self.net.is_none() {
            std::fs::create_dir_all(&self.run_dir).at(&self.run_dir)?;
            match self.ctx.net.create(&short_id(&self.uid)).await {
                Ok(n) => {
                    self.write_hosts(&n)?;
                    self.status_ip = n.ip.to_string();
                    self.net = Some(n);
                }
                Err(e) => {
                    self.event("Warning", "FailedCreatePodSandBox", &e.to_string())
                        .await;
                    return Err(e);
                }
            }
        }
        let resync = self.last_volume_sync.elapsed() >= self.volume_resync;
        if self.volumes.is_none() || resync {
            self.last_volume_sync = Instant::now();
            self.volume_resync = volume_resync();
            match self.sync_volumes().await {
                Ok(v) => self.volumes = Some(v),
                Err(e) => {
                    if self.volumes.is_none() {
                        self.event("Warning", "FailedMount", &e.to_string()).await;
                        // Retry soon rather than after the full resync period.
                        self.volume_resync = Duration::from_secs(2);
                        return Ok(());
                    }
                    tracing::debug!(error = %e, "volume refresh failed");
                }
            }
        }
        let now_i = Instant::now();
        // Init containers one at a time, in order.
        if let Some(idx) = self.ctrs.iter().position(|c| c.init && !c.done) {
            if self.ctrs[idx].run.is_none() && now_i >= self.ctrs[idx].next_start {
                self.start(idx).await;
            }
            return Ok(());
        }
        for idx in 0..self.ctrs.len() {
            let c = &self.ctrs[idx];
            if c.init || c.done || c.run.is_some() || now_i < c.next_start {
                continue;
            }
            self.start(idx).await;
        }
        // restartPolicy Never/OnFailure: the pod ends when no container runs any more.
        let regular: Vec<&Ctr> = self.ctrs.iter().filter(|c| !c.init).collect();
        if !regular.is_empty() && regular.iter().all(|c| c.done) {
            let failed = regular
                .iter()
                .any(|c| c.last.as_ref().is_some_and(|t| t.exit_code != 0));
            self.final_phase = Some(if failed { "Failed" } else { "Succeeded" });
            self.teardown().await;
        }
        Ok(())
    }

    fn write_hosts(&self, n: &PodNet) -> Result<()> {
        let spec = self.pod.spec.as_ref();
        let hostname = self.hostname();
        let mut fqdn = hostname.clone();
        if let Some(sub) = spec.and_then(|s| s.subdomain.as_ref()) {
            fqdn = format!("{hostname}.{sub}.{}.svc.cluster.local {hostname}", self.ns);
        }
        let mut text = format!(
            "# Kubernetes-managed hosts file (localnode).\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n{}\t{}\n",
            n.ip, fqdn
        );
        if self.ctx.apiserver_port.is_some() {
            text.push_str(&format!(
                "{}\tkubernetes kubernetes.default kubernetes.default.svc kubernetes.default.svc.cluster.local\n",
                self.ctx.host_ip()
            ));
        }
        for ha in spec
            .and_then(|s| s.host_aliases.clone())
            .unwrap_or_default()
        {
            text.push_str(&format!(
                "{}\t{}\n",
                ha.ip,
                ha.hostnames.unwrap_or_default().join(" ")
            ));
        }
        let p = self.run_dir.join("hosts");
        std::fs::write(&p, text).at(&p)
    }

    fn hostname(&self) -> String {
        self.pod
            .spec
            .as_ref()
            .and_then(|s| s.hostname.clone())
            .unwrap_or_else(|| self.name.clone())
            .chars()
            .take(63)
            .collect()
    }

    fn pod_ip(&self) -> String {
        self.net
            .as_ref()
            .map(|n| n.ip.to_string())
            .unwrap_or_default()
    }

    async fn sync_volumes(&self) -> Result<BTreeMap<String, PathBuf>> {
        let dir = self.run_dir.join("volumes");
        let pod_ip = self.pod_ip();
        let host_ip = self.ctx.host_ip();
        let ctx = VolumeCtx {
            client: &self.ctx.client,
            pod: &self.pod,
            pod_ip: &pod_ip,
            host_ip: &host_ip,
            dir: &dir,
            node_cpu_millis: self.ctx.cpu_millis,
            node_memory: self.ctx.memory_bytes,
        };
        let mut refs = Refs::new(self.ctx.client.clone(), &self.ns);
        materialize(&ctx, &mut refs).await
    }

    /// The container's environment in kubelet order: the image's own
    /// (`image_env`, a real image's), then envFrom, then env, each value
    /// expanded against what came before.
    async fn build_env(
        &self,
        c: &Container,
        image_env: &[(String, String)],
    ) -> Result<Vec<(String, String)>> {
        let mut refs = Refs::new(self.ctx.client.clone(), &self.ns);
        let mut vars: BTreeMap<String, String> = BTreeMap::new();
        let mut order: Vec<String> = Vec::new();
        let mut set = |vars: &mut BTreeMap<String, String>, k: String, v: String| {
            if !vars.contains_key(&k) {
                order.push(k.clone());
            }
            vars.insert(k, v);
        };
        for (k, v) in image_env {
            set(&mut vars, k.clone(), v.clone());
        }
        let text = |b: Vec<u8>| String::from_utf8_lossy(&b).into_owned();
        for ef in c.env_from.as_deref().unwrap_or(&[]) {
            let prefix = ef.prefix.clone().unwrap_or_default();
            if let Some(r) = &ef.config_map_ref {
                match refs.config_map(&r.name).await? {
                    Some(cm) => {
                        for (k, v) in cm.data.unwrap_or_default() {
                            set(&mut vars, format!("{prefix}{k}"), v);
                        }
                    }
                    None if r.optional.unwrap_or(false) => {}
                    None => {
                        return Err(Error::ContainerConfig(format!(
                            "configmap \"{}\" not found",
                            r.name
                        )));
                    }
                }
            }
            if let Some(r) = &ef.secret_ref {
                match refs.secret(&r.name).await? {
                    Some(s) => {
                        for (k, v) in s.data.unwrap_or_default() {
                            set(&mut vars, format!("{prefix}{k}"), text(v.0));
                        }
                    }
                    None if r.optional.unwrap_or(false) => {}
                    None => {
                        return Err(Error::ContainerConfig(format!(
                            "secret \"{}\" not found",
                            r.name
                        )));
                    }
                }
            }
        }
        let pod_ip = self.pod_ip();
        let host_ip = self.ctx.host_ip();
        for e in c.env.as_deref().unwrap_or(&[]) {
            let value = if let Some(vf) = &e.value_from {
                if let Some(r) = &vf.secret_key_ref {
                    match refs.secret_key(&r.name, &r.key).await? {
                        Some(v) => text(v),
                        None if r.optional.unwrap_or(false) => continue,
                        None => {
                            return Err(Error::ContainerConfig(format!(
                                "secret \"{}\" or its key \"{}\" not found (env {})",
                                r.name, r.key, e.name
                            )));
                        }
                    }
                } else if let Some(r) = &vf.config_map_key_ref {
                    match refs.config_map_key(&r.name, &r.key).await? {
                        Some(v) => text(v),
                        None if r.optional.unwrap_or(false) => continue,
                        None => {
                            return Err(Error::ContainerConfig(format!(
                                "configmap \"{}\" or its key \"{}\" not found (env {})",
                                r.name, r.key, e.name
                            )));
                        }
                    }
                } else if let Some(f) = &vf.field_ref {
                    field_value(&self.pod, &pod_ip, &host_ip, &f.field_path)?
                } else if let Some(r) = &vf.resource_field_ref {
                    resource_value(
                        c,
                        &r.resource,
                        r.divisor.as_ref().map(|d| d.0.as_str()),
                        self.ctx.cpu_millis,
                        self.ctx.memory_bytes,
                    )?
                } else {
                    String::new()
                }
            } else {
                expand(e.value.as_deref().unwrap_or(""), &vars)
            };
            set(&mut vars, e.name.clone(), value);
        }
        if let Some(port) = self.ctx.apiserver_port {
            for (k, v) in [
                (
                    "KUBERNETES_SERVICE_HOST",
                    "kubernetes.default.svc".to_string(),
                ),
                ("KUBERNETES_SERVICE_PORT", port.to_string()),
                ("KUBERNETES_SERVICE_PORT_HTTPS", port.to_string()),
            ] {
                if !vars.contains_key(k) {
                    set(&mut vars, k.into(), v);
                }
            }
        }
        if !vars.contains_key("PATH") {
            set(&mut vars, "PATH".into(), DEFAULT_PATH.into());
        }
        if !vars.contains_key("HOSTNAME") {
            set(&mut vars, "HOSTNAME".into(), self.hostname());
        }
        if !vars.contains_key("HOME") {
            set(&mut vars, "HOME".into(), "/root".into());
        }
        Ok(order
            .into_iter()
            .filter_map(|k| vars.get(&k).map(|v| (k.clone(), v.clone())))
            .collect())
    }

    async fn start(&mut self, idx: usize) {
        let image_ref = self.ctrs[idx].image_ref.clone();
        let image = if crate::oci::is_registry_ref(&image_ref) {
            let crane = std::env::var_os("LOCALNODE_CRANE")
                .map(PathBuf::from)
                .unwrap_or_else(|| self.ctx.images.repo().join("bin/crane"));
            crate::oci::pull(&crane, &self.ctx.state_dir.join("images"), &image_ref)
                .await
                .map(ResolvedImage::from_oci)
                .map_err(|message| ImageError::Pull {
                    image: image_ref.clone(),
                    message,
                })
        } else {
            self.ctx.images.resolve(&image_ref)
        };
        let image = match image {
            Ok(i) => i,
            Err(e) => {
                let c = &mut self.ctrs[idx];
                c.image_attempts += 1;
                let reason = if c.image_attempts <= 1 {
                    "ErrImagePull"
                } else {
                    "ImagePullBackOff"
                };
                c.waiting = (reason.into(), Some(e.to_string()));
                let delay = (FIRST_BACKOFF * c.image_attempts.min(30)).min(MAX_BACKOFF);
                c.next_start = Instant::now() + delay;
                let name = c.spec.name.clone();
                if matches!(
                    e,
                    ImageError::Unmapped { .. }
                        | ImageError::Missing { .. }
                        | ImageError::Pull { .. }
                ) {
                    self.event("Warning", "Failed", &format!("container {name}: {e}"))
                        .await;
                }
                return;
            }
        };
        let c_spec = self.ctrs[idx].spec.clone();
        let image_env = image
            .oci
            .as_ref()
            .map(|o| o.env.clone())
            .unwrap_or_default();
        let env = match self.build_env(&c_spec, &image_env).await {
            Ok(e) => e,
            Err(e) => {
                let c = &mut self.ctrs[idx];
                c.waiting = ("CreateContainerConfigError".into(), Some(e.to_string()));
                c.next_start = Instant::now() + Duration::from_secs(2);
                let msg = format!("container {}: {e}", c_spec.name);
                self.event("Warning", "Failed", &msg).await;
                return;
            }
        };
        match self.launch(idx, &image, &c_spec, env).await {
            Ok(()) => {}
            Err(e @ Error::ContainerConfig(_)) => {
                let c = &mut self.ctrs[idx];
                c.waiting = ("CreateContainerConfigError".into(), Some(e.to_string()));
                c.next_start = Instant::now() + FIRST_BACKOFF;
                let msg = format!("container {}: {e}", c_spec.name);
                self.event("Warning", "Failed", &msg).await;
            }
            Err(e) => {
                let c = &mut self.ctrs[idx];
                c.waiting = ("RunContainerError".into(), Some(e.to_string()));
                c.next_start = Instant::now() + FIRST_BACKOFF;
                let msg = format!("container {}: {e}", c_spec.name);
                self.event("Warning", "Failed", &msg).await;
            }
        }
    }

    async fn launch(
        &mut self,
        idx: usize,
        image: &ResolvedImage,
        c: &Container,
        env: Vec<(String, String)>,
    ) -> Result<()> {
        let net = self
            .net
            .clone()
            .ok_or_else(|| Error::Network("pod network is not ready".into()))?;
        let volumes = self.volumes.clone().unwrap_or_default();
        let vars: BTreeMap<String, String> = env.iter().cloned().collect();
        let command: Vec<String> = c
            .command
            .as_deref()
            .unwrap_or(&[])
            .iter()
            .map(|s| expand(s, &vars))
            .collect();
        let args: Vec<String> = c
            .args
            .as_deref()
            .unwrap_or(&[])
            .iter()
            .map(|s| expand(s, &vars))
            .collect();
        let mut inv = match &image.oci {
            Some(oci) => {
                let argv = oci.argv(&command, &args);
                let Some((first, rest)) = argv.split_first() else {
                    return Err(Error::ContainerConfig(
                        "no command: the pod gives none and the image has no entrypoint".into(),
                    ));
                };
                let path = vars.get("PATH").map(String::as_str).unwrap_or(DEFAULT_PATH);
                let program = oci.locate(first, path).ok_or_else(|| {
                    Error::ContainerConfig(format!(
                        "exec: \"{first}\": executable file not found in $PATH ({path}) of the image"
                    ))
                })?;
                crate::images::Invocation {
                    arg0: first.clone(),
                    program,
                    args: rest.to_vec(),
                }
            }
            None => image.invocation(&command, &args),
        };
        if image.takes_default_config(&inv)
            && inv.args.first().is_none_or(|a| a.starts_with('-'))
            && !inv.args.iter().any(|a| a == "--sentinel")
        {
            let mut defaults = Vec::new();
            for line in &image.default_config {
                let mut parts = line.splitn(2, ' ');
                if let (Some(k), Some(v)) = (parts.next(), parts.next()) {
                    defaults.push(format!("--{k}"));
                    defaults.push(v.to_string());
                }
            }
            defaults.append(&mut inv.args);
            inv.args = defaults;
        }
        let mut mounts = Vec::new();
        for m in c.volume_mounts.as_deref().unwrap_or(&[]) {
            let base = volumes.get(&m.name).ok_or_else(|| {
                Error::ContainerConfig(format!("volumeMount {} names no volume of the pod", m.name))
            })?;
            let sub = match (&m.sub_path, &m.sub_path_expr) {
                (Some(s), _) if !s.is_empty() => Some(s.clone()),
                (_, Some(s)) if !s.is_empty() => Some(expand(s, &vars)),
                _ => None,
            };
            let source = match sub {
                Some(s) => {
                    if s.split('/').any(|x| x == "..") || s.starts_with('/') {
                        return Err(Error::ContainerConfig(format!("bad subPath {s}")));
                    }
                    let p = base.join(&s);
                    if !p.exists() {
                        std::fs::create_dir_all(&p).at(&p)?;
                    }
                    p
                }
                None => base.clone(),
            };
            mounts.push(MountSpec {
                source,
                target: m.mount_path.clone(),
                read_only: m.read_only.unwrap_or(false),
            });
        }
        let cname = c.name.clone();
        let tmp = self.run_dir.join("tmp").join(&cname);
        std::fs::create_dir_all(&tmp).at(&tmp)?;
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o1777)).at(&tmp)?;
        }
        let message_path = c
            .termination_message_path
            .clone()
            .unwrap_or_else(|| "/dev/termination-log".into());
        let message_file = host_path_of(&message_path, &mounts, &tmp);
        if let Some(f) = &message_file {
            // Each run of a container starts with an empty message.
            let _ = std::fs::remove_file(f);
        }
        let fallback_to_logs =
            c.termination_message_policy.as_deref() == Some("FallbackToLogsOnError");
        let image_user = match &image.oci {
            Some(oci) => oci.user_ids().map_err(Error::ContainerConfig)?,
            None => (None, None),
        };
        let (uid, gid, read_only_root) = security(&self.pod, c, image_user)?;
        // A fresh writable layer for every start, like a new container.
        let layer_dir = self.run_dir.join("layers").join(&cname);
        if layer_dir.exists() {
            std::fs::remove_dir_all(&layer_dir).at(&layer_dir)?;
        }
        std::fs::create_dir_all(&layer_dir).at(&layer_dir)?;
        self.epoch += 1;
        let epoch = self.epoch;
        let cgroup = self.container_cgroup(idx);
        let oom_base = cgroup.as_deref().and_then(cgroup::oom_events);
        let spec = LaunchSpec {
            hostname: self.hostname(),
            private_tmp: tmp,
            layer_dir,
            hosts_file: Some(self.run_dir.join("hosts")),
            mounts,
            image_bins: image
                .binaries
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            program: inv.program.clone(),
            arg0: inv.arg0.clone(),
            args: inv.args.clone(),
            env: env.clone(),
            workdir: c
                .working_dir
                .clone()
                .or_else(|| image.oci.as_ref().and_then(|o| o.workdir.clone())),
            rootfs: image.oci.as_ref().map(|o| o.rootfs.clone()),
            uid,
            gid,
            groups: supplementary_groups(&self.pod)?,
            read_only_root,
            cgroup: cgroup.clone(),
        };
        let spec_path = self.run_dir.join(format!("{cname}.launch.json"));
        std::fs::write(&spec_path, serde_json::to_vec_pretty(&spec)?).at(&spec_path)?;
        std::fs::create_dir_all(&self.log_dir).at(&self.log_dir)?;
        let log_path = self.log_dir.join(format!("{cname}.log"));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .at(&log_path)?;
        let log2 = log.try_clone().at(&log_path)?;
        let log_start = log.metadata().map(|m| m.len()).unwrap_or(0);
        let message = MessageSource {
            file: message_file,
            fallback_to_logs,
            log: Some((log_path.clone(), log_start)),
        };
        let mut cmd = tokio::process::Command::new("ip");
        cmd.args([
            "netns",
            "exec",
            &net.netns,
            "unshare",
            "--mount",
            "--uts",
            "--propagation",
            "private",
        ])
        .arg(&self.ctx.self_exe)
        .arg("exec-container")
        .arg(&spec_path)
        .stdin(Stdio::null())
        .stdout(Stdio::from(log))
        .stderr(Stdio::from(log2))
        .process_group(0)
        .kill_on_drop(false);
        let mut child = cmd.spawn().map_err(|e| Error::Command {
            command: "ip netns exec … exec-container".into(),
            message: e.to_string(),
        })?;
        let pid = child
            .id()
            .ok_or_else(|| Error::Setup("container exited before it got a pid".into()))?;
        // exec-container joins the cgroup itself before anything else; this
        // makes sure of it (the same cgroup: harmless if it already did).
        if let Some(dir) = &cgroup
            && let Err(e) = cgroup::add_process(dir, pid)
        {
            tracing::debug!(pod = %self.name, container = %cname, error = %e, "adding the process to its cgroup");
        }
        if let Ok(group) = i32::try_from(pid)
            && !self.groups.contains(&group)
        {
            self.groups.push(group);
        }
        let tx = self.ev_tx.clone();
        tokio::spawn(async move {
            let status = match child.wait().await {
                Ok(s) => s,
                Err(_) => std::process::ExitStatus::from_raw(255 << 8),
            };
            let _ = tx.send(Ev::Exited { idx, epoch, status });
        });
        let started_at = now();
        let container_id = format!("localnode://{}-{}-{}", short_id(&self.uid), cname, epoch);
        self.ctx
            .logs
            .started(&container_id, &self.uid, &log_path, log_start);
        let pod_ip: IpAddr = net.ip.into();
        let target = Target {
            pod_ip,
            pid,
            env: env.clone(),
            container: c.clone(),
        };
        let c = &mut self.ctrs[idx];
        let resources = c.allocated.clone();
        if c.last.is_some() {
            c.restart_count += 1;
        }
        // A pulled image is identified by its digest, as a kubelet reports
        // it; a mapped one by the program it runs.
        c.image_id = match &image.oci {
            Some(oci) => format!("{}@{}", crate::oci::repository(&c.image_ref), oci.digest),
            None => format!(
                "localnode://{}",
                image
                    .binaries
                    .get(&image.entrypoint)
                    .map(|p| p.display().to_string())
                    .unwrap_or_default()
            ),
        };
        c.waiting = (String::new(), None);
        c.ready = false;
        c.started = false;
        c.ready_ok = 0;
        c.ready_fail = 0;
        c.live_fail = 0;
        c.startup_fail = 0;
        c.image_attempts = 0;
        let mut probes = Vec::new();
        if !c.init {
            if let Some(p) = &c.spec.startup_probe {
                probes.push(spawn_probe(
                    self.ev_tx.clone(),
                    idx,
                    epoch,
                    ProbeKind::Startup,
                    p.clone(),
                    target.clone(),
                ));
            } else {
                c.started = true;
                probes.extend(spawn_main_probes(&self.ev_tx, idx, epoch, &c.spec, &target));
            }
        }
        c.run = Some(Running {
            pid,
            epoch,
            started_at,
            started_instant: Instant::now(),
            probes,
            env,
            container_id,
            message,
            resources,
            cgroup,
            oom_base,
        });
        tracing::info!(pod = %self.name, container = %cname, pid, program = %inv.program, "container started");
        self.event("Normal", "Started", &format!("Started container {cname}"))
            .await;
        Ok(())
    }

    async fn handle(&mut self, ev: Ev) {
        match ev {
            Ev::Exited { idx, epoch, status } => self.on_exit(idx, epoch, status).await,
            Ev::Probe {
                idx,
                epoch,
                kind,
                outcome,
            } => self.on_probe(idx, epoch, kind, outcome).await,
        }
    }

    async fn on_exit(&mut self, idx: usize, epoch: u64, status: std::process::ExitStatus) {
        let policy = self.restart_policy();
        let deleting = self.deleting();
        let Some(c) = self.ctrs.get_mut(idx) else {
            return;
        };
        let Some(run) = c.run.take_if(|r| r.epoch == epoch) else {
            return;
        };
        for p in &run.probes {
            p.abort();
        }
        // Reap what the process left in its group (e.g. a forked BGSAVE).
        kill_group(run.pid, rustix::process::Signal::KILL);
        self.ctx.logs.finished(&run.container_id);
        let (exit_code, signal) = match (status.code(), status.signal()) {
            (Some(code), _) => (code, None),
            (None, Some(sig)) => (128 + sig, Some(sig)),
            (None, None) => (255, None),
        };
        // SIGKILLed while the OOM killer struck in its cgroup: OOMKilled,
        // as the runtime reports it to the kubelet.
        let oom_killed = signal == Some(9)
            && run.cgroup.as_deref().is_some_and(|dir| {
                cgroup::oom_events(dir)
                    .zip(run.oom_base)
                    .is_some_and(|(now, before)| now > before)
            });
        let reason = if oom_killed {
            "OOMKilled"
        } else if exit_code == 0 {
            "Completed"
        } else {
            "Error"
        };
        let ran = run.started_instant.elapsed();
        tracing::info!(pod = %self.name, container = %c.spec.name, exit_code, ?signal, reason, "container exited");
        c.prev = c.last.take();
        c.last = Some(Terminated {
            exit_code,
            signal,
            reason: reason.into(),
            message: run.message.read(exit_code != 0),
            started_at: run.started_at,
            finished_at: now(),
            container_id: run.container_id,
        });
        c.ready = false;
        c.started = false;
        let restart = if c.init {
            exit_code != 0 && policy != "Never"
        } else {
            match policy.as_str() {
                "Never" => false,
                "OnFailure" => exit_code != 0,
                _ => true,
            }
        };
        if c.init && exit_code == 0 {
            c.done = true;
            return;
        }
        if !restart || deleting {
            c.done = true;
            if c.init {
                // A failed init container with restartPolicy Never fails the pod.
                self.final_phase = Some("Failed");
                self.teardown().await;
            }
            return;
        }
        if ran >= BACKOFF_RESET_AFTER {
            c.backoff = Duration::ZERO;
        }
        let delay = c.backoff;
        c.next_start = Instant::now() + delay;
        c.backoff = if delay.is_zero() {
            FIRST_BACKOFF
        } else {
            (delay * 2).min(MAX_BACKOFF)
        };
        if !delay.is_zero() {
            let name = c.spec.name.clone();
            c.waiting = (
                "CrashLoopBackOff".into(),
                Some(format!(
                    "back-off {}s restarting failed container={name} pod={}_{}({})",
                    delay.as_secs(),
                    self.name,
                    self.ns,
                    self.uid
                )),
            );
            self.event(
                "Warning",
                "BackOff",
                &format!("Back-off restarting failed container {name}"),
            )
            .await;
        }
    }

    async fn on_probe(&mut self, idx: usize, epoch: u64, kind: ProbeKind, outcome: Outcome) {
        let tx = self.ev_tx.clone();
        let Some(c) = self.ctrs.get_mut(idx) else {
            return;
        };
        let Some(run) = c.run.as_mut().filter(|r| r.epoch == epoch) else {
            return;
        };
        let ok = outcome == Outcome::Success;
        let mut warn: Option<String> = None;
        match kind {
            ProbeKind::Startup => {
                let p = c.spec.startup_probe.clone().unwrap_or_default();
                if ok {
                    c.started = true;
                    // The startup loop ends; readiness and liveness take over.
                    for h in run.probes.drain(..) {
                        h.abort();
                    }
                    let target = Target {
                        pod_ip: self
                            .net
                            .as_ref()
                            .map(|n| IpAddr::from(n.ip))
                            .unwrap_or(IpAddr::from([0, 0, 0, 0])),
                        pid: run.pid,
                        env: run.env.clone(),
                        container: c.spec.clone(),
                    };
                    run.probes = spawn_main_probes(&tx, idx, epoch, &c.spec, &target);
                } else {
                    c.startup_fail += 1;
                    if c.startup_fail >= p.failure_threshold.unwrap_or(3) {
                        warn = Some(format!("Startup probe failed: {}", failure_text(&outcome)));
                        let grace = probe_grace(&p, &self.pod);
                        terminate_process(run.pid, grace);
                        c.startup_fail = 0;
                    }
                }
            }
            ProbeKind::Readiness => {
                let p = c.spec.readiness_probe.clone().unwrap_or_default();
                if ok {
                    c.ready_fail = 0;
                    c.ready_ok += 1;
                    if c.ready_ok >= p.success_threshold.unwrap_or(1) {
                        c.ready = true;
                    }
                } else {
                    c.ready_ok = 0;
                    c.ready_fail += 1;
                    if c.ready_fail >= p.failure_threshold.unwrap_or(3) || !c.ready {
                        if c.ready || c.ready_fail == p.failure_threshold.unwrap_or(3) {
                            warn = Some(format!(
                                "Readiness probe failed: {}",
                                failure_text(&outcome)
                            ));
                        }
                        if c.ready_fail >= p.failure_threshold.unwrap_or(3) {
                            c.ready = false;
                        }
                    }
                }
            }
            ProbeKind::Liveness => {
                let p = c.spec.liveness_probe.clone().unwrap_or_default();
                if ok {
                    c.live_fail = 0;
                } else {
                    c.live_fail += 1;
                    if c.live_fail >= p.failure_threshold.unwrap_or(3) {
                        warn = Some(format!(
                            "Liveness probe failed: {}; container will be restarted",
                            failure_text(&outcome)
                        ));
                        let grace = probe_grace(&p, &self.pod);
                        terminate_process(run.pid, grace);
                        c.live_fail = 0;
                    }
                }
            }
        }
        if let Some(w) = warn {
            self.event("Warning", "Unhealthy", &w).await;
        }
    }

    /// Graceful termination: preStop hooks, SIGTERM, SIGKILL after the grace
    /// period, sandbox teardown, final status, then the pod's deletion.
    async fn terminate(&mut self, rx: &mut mpsc::UnboundedReceiver<PodMsg>) {
        let grace_secs = if self.gone {
            0
        } else {
            self.pod
                .metadata
                .deletion_grace_period_seconds
                .or_else(|| {
                    self.pod
                        .spec
                        .as_ref()
                        .and_then(|s| s.termination_grace_period_seconds)
                })
                .unwrap_or(30)
                .max(0)
        };
        let deadline = Instant::now() + Duration::from_secs(grace_secs as u64);
        tracing::info!(pod = %format!("{}/{}", self.ns, self.name), grace_secs, "terminating pod");
        let running: Vec<usize> = (0..self.ctrs.len())
            .filter(|i| self.ctrs[*i].run.is_some())
            .collect();
        if !running.is_empty() {
            self.event(
                "Normal",
                "Killing",
                &format!("Stopping pod (grace period {grace_secs}s)"),
            )
            .await;
        }
        // preStop exec hooks, bounded by the grace period.
        let mut hooks = Vec::new();
        for &i in &running {
            let c = &self.ctrs[i];
            let (Some(run), Some(cmd)) = (
                c.run.as_ref(),
                c.spec
                    .lifecycle
                    .as_ref()
                    .and_then(|l| l.pre_stop.as_ref())
                    .and_then(|h| h.exec.as_ref())
                    .and_then(|e| e.command.clone()),
            ) else {
                continue;
            };
            let target = Target {
                pod_ip: self
                    .net
                    .as_ref()
                    .map(|n| IpAddr::from(n.ip))
                    .unwrap_or(IpAddr::from([0, 0, 0, 0])),
                pid: run.pid,
                env: run.env.clone(),
                container: c.spec.clone(),
            };
            let budget = deadline.saturating_duration_since(Instant::now());
            hooks.push(tokio::spawn(async move {
                probe::exec(&cmd, &target, budget).await
            }));
        }
        for h in hooks {
            let _ = h.await;
        }
        for &i in &running {
            if let Some(r) = &self.ctrs[i].run {
                kill_group(r.pid, rustix::process::Signal::TERM);
            }
        }
        let mut killed = false;
        let hard_deadline = deadline + Duration::from_secs(10);
        let mut status_tick = tokio::time::interval(Duration::from_secs(1));
        while self.ctrs.iter().any(|c| c.run.is_some()) {
            if !killed && Instant::now() >= deadline {
                for c in &self.ctrs {
                    if let Some(r) = &c.run {
                        kill_group(r.pid, rustix::process::Signal::KILL);
                    }
                }
                killed = true;
            }
            if Instant::now() >= hard_deadline {
                tracing::warn!(pod = %self.name, "processes did not exit after SIGKILL");
                break;
            }
            let wake = if killed { hard_deadline } else { deadline };
            tokio::select! {
                Some(ev) = self.ev_rx.recv() => {
                    if let Ev::Exited { .. } = ev { self.handle(ev).await; }
                }
                msg = rx.recv() => match msg {
                    Some(PodMsg::Update(p)) => {
                        // A shorter grace period (e.g. --force) cuts the wait.
                        let shorter = p.metadata.deletion_grace_period_seconds == Some(0);
                        self.pod = *p;
                        if shorter && !killed {
                            for c in &self.ctrs { if let Some(r) = &c.run { kill_group(r.pid, rustix::process::Signal::KILL); } }
                            killed = true;
                        }
                    }
                    Some(PodMsg::Gone) | None => {
                        self.gone = true;
                        if !killed {
                            for c in &self.ctrs { if let Some(r) = &c.run { kill_group(r.pid, rustix::process::Signal::KILL); } }
                            killed = true;
                        }
                    }
                },
                _ = tokio::time::sleep_until(wake.into()) => {}
                _ = status_tick.tick() => { if !self.gone { self.push_status().await; } }
            }
        }
        for c in &mut self.ctrs {
            c.done = true;
            c.ready = false;
        }
        self.teardown().await;
        if self.final_phase.is_none() {
            let all_ok = self
                .ctrs
                .iter()
                .filter(|c| !c.init)
                .all(|c| c.last.as_ref().is_some_and(|t| t.exit_code == 0));
            self.final_phase = Some(if all_ok { "Succeeded" } else { "Failed" });
        }
        if self.gone {
            return;
        }
        self.push_status().await;
        let api: Api<Pod> = Api::namespaced(self.ctx.client.clone(), &self.ns);
        let dp = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: Some(self.uid.clone()),
                resource_version: None,
            }),
            ..Default::default()
        };
        match api.delete(&self.name, &dp).await {
            Ok(_) => tracing::info!(pod = %format!("{}/{}", self.ns, self.name), "pod deleted"),
            Err(kube::Error::Api(s)) if s.is_not_found() || s.code == 409 => {}
            Err(e) => tracing::warn!(pod = %self.name, error = %e, "final pod deletion failed"),
        }
    }

    /// Removes the network namespace (killing anything left in it) and the
    /// pod's runtime directory; logs stay.
    async fn teardown(&mut self) {
        for c in &self.ctrs {
            if let Some(r) = &c.run {
                kill_group(r.pid, rustix::process::Signal::KILL);
            }
        }
        if let Some(n) = self.net.take() {
            self.ctx.net.destroy(&n, &self.groups).await;
        }
        // Whatever escaped the namespace and the process groups is killed
        // with the cgroups.
        self.ctx.memory.remove_pod(&short_id(&self.uid)).await;
        self.resize.pod_limit = None;
        self.ctx.set_allocation(&self.uid, None);
        if self.run_dir.exists()
            && let Err(e) = std::fs::remove_dir_all(&self.run_dir)
        {
            tracing::warn!(dir = %self.run_dir.display(), error = %e, "cannot remove pod directory");
        }
    }

    /// The container's memory cgroup with its limit (and the pod's, the
    /// first time), ready for the process to join; `None` without
    /// enforcement. Failing here never fails the container.
    fn container_cgroup(&mut self, idx: usize) -> Option<PathBuf> {
        let pod_dir = self.ctx.memory.pod_dir(&short_id(&self.uid))?;
        let c = &self.ctrs[idx];
        let dir = pod_dir.join(&c.spec.name);
        let limit = resize::memory_limit(&c.allocated);
        let pod_limit = resize::pod_memory_limit(&self.members());
        let first = self.resize.pod_limit.is_none();
        let made = cgroup::ensure(&dir)
            .and_then(|()| {
                if first {
                    cgroup::set_limit(&pod_dir, pod_limit)?;
                }
                Ok(())
            })
            .and_then(|()| cgroup::set_limit(&dir, limit));
        match made {
            Ok(()) => {
                if first {
                    self.resize.pod_limit = Some(pod_limit);
                }
                Some(dir)
            }
            Err(e) => {
                tracing::warn!(pod = %self.name, container = %c.spec.name, error = %e,
                    "memory cgroup not set up: the container runs without its memory limit");
                None
            }
        }
    }

    /// The resources each regular container asks for now (the spec the API
    /// holds, resized through `pods/resize`), by container index; init
    /// containers are not resizable.
    fn desired(&self) -> Vec<ResourceRequirements> {
        let containers = self
            .pod
            .spec
            .as_ref()
            .map(|s| s.containers.as_slice())
            .unwrap_or(&[]);
        self.ctrs
            .iter()
            .map(|c| {
                if c.init {
                    return c.allocated.clone();
                }
                containers
                    .iter()
                    .find(|s| s.name == c.spec.name)
                    .map(|s| s.resources.clone().unwrap_or_default())
                    .unwrap_or_else(|| c.allocated.clone())
            })
            .collect()
    }

    fn named<'a>(&'a self, res: &'a [ResourceRequirements]) -> Vec<Named<'a>> {
        self.ctrs
            .iter()
            .zip(res)
            .filter(|(c, _)| !c.init)
            .map(|(c, r)| Named {
                name: &c.spec.name,
                init: c.init,
                resources: r,
            })
            .collect()
    }

    /// The resources in force for a container: the running process's, or
    /// the allocation when it does not run.
    fn actual(c: &Ctr) -> &ResourceRequirements {
        c.run.as_ref().map_or(&c.allocated, |r| &r.resources)
    }

    /// The kubelet's resize handling: a spec that differs from the
    /// allocation is admitted if it fits the node (then actuated), or marked
    /// `PodResizePending` (`Infeasible`: more than the node has; `Deferred`:
    /// not next to the other pods, re-evaluated on every tick).
    async fn sync_resize(&mut self) {
        let generation = self.pod.metadata.generation;
        let desired = self.desired();
        let differs = self
            .ctrs
            .iter()
            .zip(&desired)
            .any(|(c, d)| !c.init && !resize::same(&c.allocated, d));
        if differs {
            let members: Vec<Member> = self
                .ctrs
                .iter()
                .zip(&desired)
                .map(|(c, d)| Member {
                    init: c.init,
                    resources: d,
                })
                .collect();
            let wanted = resize::pod_requests(&members);
            let verdict = resize::fit(wanted, self.ctx.others(&self.uid), self.ctx.allocatable());
            let gen_ = generation.unwrap_or(0);
            match &verdict {
                Fit::Fits => {
                    if self.resize.in_progress.is_none() {
                        self.resize.before = self
                            .ctrs
                            .iter()
                            .filter(|c| !c.init)
                            .map(|c| (c.spec.name.clone(), Self::actual(c).clone()))
                            .collect();
                    }
                    for (c, d) in self.ctrs.iter_mut().zip(&desired) {
                        if !c.init {
                            c.allocated = d.clone();
                            c.spec.resources = Some(d.clone());
                        }
                    }
                    self.register_allocation();
                    self.resize.pending = None;
                    // A new allocation clears an earlier actuation error.
                    self.resize.in_progress = None;
                    ResizeCond::set(&mut self.resize.in_progress, None, None, generation);
                    self.resize.retry_at = None;
                    tracing::info!(pod = %self.name, generation = gen_, "resize admitted");
                    let msg = resize::event_message(
                        "Pod resize started",
                        &self.named(&desired),
                        gen_,
                        None,
                    );
                    self.event("Normal", "ResizeStarted", &msg).await;
                }
                Fit::Infeasible(why) | Fit::Deferred(why) => {
                    let reason = if matches!(verdict, Fit::Infeasible(_)) {
                        "Infeasible"
                    } else {
                        "Deferred"
                    };
                    ResizeCond::set(
                        &mut self.resize.pending,
                        Some(reason),
                        Some(why),
                        generation,
                    );
                    let msg = resize::event_message(
                        &format!("Pod resize {reason}"),
                        &self.named(&desired),
                        gen_,
                        Some(why),
                    );
                    self.event("Warning", &format!("Resize{reason}"), &msg)
                        .await;
                }
            }
        } else {
            self.resize.pending = None;
        }
        self.actuate(generation).await;
    }

    /// Brings running containers (and the pod cgroup) to their allocation:
    /// memory limit decreases first, increases last, never a limit below
    /// what a container uses now (that stays `PodResizeInProgress` with
    /// reason `Error`, retried). Once nothing differs, the resize is done.
    async fn actuate(&mut self, generation: Option<i64>) {
        let pod_dir = self.ctx.memory.pod_dir(&short_id(&self.uid));
        let pod_limit = resize::pod_memory_limit(&self.members());
        // The pod cgroup exists once a container started.
        let pod_current = self.resize.pod_limit.filter(|_| pod_dir.is_some());
        let pod_stale = pod_current.is_some_and(|cur| cur != pod_limit);
        let stale: Vec<usize> = (0..self.ctrs.len())
            .filter(|&i| {
                let c = &self.ctrs[i];
                c.run
                    .as_ref()
                    .is_some_and(|r| !resize::same(&r.resources, &c.allocated))
            })
            .collect();
        if stale.is_empty() && !pod_stale {
            if let Some(done) = self.resize.in_progress.take() {
                self.resize.retry_at = None;
                self.resize.error_reported = None;
                let gen_ = done.generation.or(generation).unwrap_or(0);
                let allocated: Vec<ResourceRequirements> =
                    self.ctrs.iter().map(|c| c.allocated.clone()).collect();
                let mut msg = resize::event_message(
                    "Pod resize completed",
                    &self.named(&allocated),
                    gen_,
                    None,
                );
                let changed: Vec<String> = std::mem::take(&mut self.resize.before)
                    .iter()
                    .filter_map(|(name, old)| {
                        let c = self.ctrs.iter().find(|c| !c.init && &c.spec.name == name)?;
                        Some(resize::changes(name, old, &c.allocated))
                    })
                    .flatten()
                    .collect();
                if !changed.is_empty() {
                    msg.push_str(&format!(" ({})", changed.join(", ")));
                }
                tracing::info!(pod = %self.name, generation = gen_, "resize completed");
                self.event("Normal", "ResizeCompleted", &msg).await;
            }
            return;
        }
        if self.resize.in_progress.is_none() {
            ResizeCond::set(&mut self.resize.in_progress, None, None, generation);
        }
        if self.resize.retry_at.is_some_and(|t| Instant::now() < t) {
            return;
        }

        // The kubelet's best-effort check (since 1.34): a memory limit is
        // not lowered below what is in use (cgroup v1 would refuse it, v2
        // would OOM-kill).
        let lowers = |old: Option<i64>, new: Option<i64>| match (old, new) {
            (_, None) => false,
            (None, Some(_)) => true,
            (Some(o), Some(n)) => n < o,
        };
        let mut errors = Vec::new();
        if let (Some(dir), Some(cur)) = (&pod_dir, pod_current)
            && pod_stale
            && lowers(cur, pod_limit)
            && let (Some(new), Some(used)) = (pod_limit, cgroup::usage(dir))
            && used > new
        {
            errors.push(format!(
                "attempting to set pod memory limit ({new}) below current usage ({used})"
            ));
        }
        for &i in &stale {
            let c = &self.ctrs[i];
            let Some(run) = &c.run else { continue };
            let new = resize::memory_limit(&c.allocated);
            if let Some(dir) = &run.cgroup
                && lowers(resize::memory_limit(&run.resources), new)
                && let (Some(new), Some(used)) = (new, cgroup::usage(dir))
                && used > new
            {
                errors.push(format!(
                    "attempting to set container \"{}\" memory limit ({new}) below current usage ({used})",
                    c.spec.name
                ));
            }
        }
        if !errors.is_empty() {
            let msg = if errors.len() == 1 {
                format!("cannot decrease memory limits: {}", errors[0])
            } else {
                format!("cannot decrease memory limits: [{}]", errors.join(", "))
            };
            self.resize_error(generation, &msg).await;
            return;
        }

        // Pod limit up first, then container decreases, the pod limit
        // down, container increases (and changes without a memory limit
        // change, which only need recording).
        let pod_up = pod_stale && !lowers(pod_current.flatten(), pod_limit);
        let pod_down = pod_stale && !pod_up;
        let (decreases, others): (Vec<usize>, Vec<usize>) = stale.iter().partition(|&&i| {
            let c = &self.ctrs[i];
            c.run.as_ref().is_some_and(|r| {
                lowers(
                    resize::memory_limit(&r.resources),
                    resize::memory_limit(&c.allocated),
                )
            })
        });
        enum Step {
            Pod,
            Ctr(usize),
        }
        let mut plan = Vec::new();
        if pod_up {
            plan.push(Step::Pod);
        }
        plan.extend(decreases.into_iter().map(Step::Ctr));
        if pod_down {
            plan.push(Step::Pod);
        }
        plan.extend(others.into_iter().map(Step::Ctr));
        for step in plan {
            match step {
                Step::Pod => {
                    if let Some(dir) = &pod_dir {
                        if let Err(e) = cgroup::set_limit(dir, pod_limit) {
                            let msg = format!("setting the pod memory limit: {e}");
                            self.resize_error(generation, &msg).await;
                            return;
                        }
                        self.resize.pod_limit = Some(pod_limit);
                    }
                }
                Step::Ctr(i) => {
                    let c = &mut self.ctrs[i];
                    let Some(run) = c.run.as_mut() else { continue };
                    let new = resize::memory_limit(&c.allocated);
                    if let Some(dir) = &run.cgroup
                        && new != resize::memory_limit(&run.resources)
                        && let Err(e) = cgroup::set_limit(dir, new)
                    {
                        let msg = format!(
                            "setting the memory limit of container \"{}\": {e}",
                            c.spec.name
                        );
                        self.resize_error(generation, &msg).await;
                        return;
                    }
                    run.resources = c.allocated.clone();
                    tracing::info!(pod = %self.name, container = %c.spec.name, memory_limit = ?new, "container resized");
                }
            }
        }
        // The in-progress condition goes on the next pass, once the status
        // shows the new resources (the kubelet clears it on its next sync).
        if let Some(c) = self.resize.in_progress.as_ref()
            && c.reason.is_some()
        {
            let gen_ = c.generation;
            ResizeCond::set(&mut self.resize.in_progress, None, None, gen_);
        }
    }

    /// An actuation that failed: `PodResizeInProgress` with reason `Error`,
    /// one Warning event per generation, another try after RESIZE_RETRY.
    async fn resize_error(&mut self, generation: Option<i64>, message: &str) {
        let gen_ = self
            .resize
            .in_progress
            .as_ref()
            .and_then(|c| c.generation)
            .or(generation);
        ResizeCond::set(
            &mut self.resize.in_progress,
            Some("Error"),
            Some(message),
            gen_,
        );
        self.resize.retry_at = Some(Instant::now() + RESIZE_RETRY);
        if self.resize.error_reported != Some(gen_.unwrap_or(0)) {
            self.resize.error_reported = Some(gen_.unwrap_or(0));
            tracing::warn!(pod = %self.name, error = message, "resize not actuated");
            let allocated: Vec<ResourceRequirements> =
                self.ctrs.iter().map(|c| c.allocated.clone()).collect();
            let msg = resize::event_message(
                "Pod resize error",
                &self.named(&allocated),
                gen_.unwrap_or(0),
                Some(message),
            );
            self.event("Warning", "ResizeError", &msg).await;
        }
    }

    fn set_condition(&mut self, ty: &'static str, value: bool) {
        match self.conditions.get(ty) {
            Some((v, _)) if *v == value => {}
            _ => {
                self.conditions.insert(ty, (value, now()));
            }
        }
    }

    fn container_status(&self, c: &Ctr) -> Value {
        let state = if let Some(r) = &c.run {
            json!({"running": {"startedAt": Time(r.started_at)}})
        } else if c.done {
            match &c.last {
                Some(t) => json!({"terminated": terminated_json(t)}),
                None => json!({"waiting": {"reason": "ContainerCreating"}}),
            }
        } else {
            let (reason, message) = &c.waiting;
            let reason = if !reason.is_empty() {
                reason.as_str()
            } else if !c.init
                && self.ctrs.iter().any(|i| {
                    i.init && !(i.done && i.last.as_ref().is_some_and(|t| t.exit_code == 0))
                })
            {
                "PodInitializing"
            } else {
                "ContainerCreating"
            };
            let mut w = json!({"reason": reason});
            if let Some(m) = message {
                w["message"] = json!(m);
            }
            json!({"waiting": w})
        };
        let last_state = match (&c.last, &c.prev, c.done) {
            (Some(t), _, false) | (_, Some(t), true) => json!({"terminated": terminated_json(t)}),
            _ => json!({}),
        };
        let mut v = json!({
            "name": c.spec.name,
            "image": c.image_ref,
            "imageID": c.image_id,
            "ready": c.ready,
            "started": c.run.is_some() && c.started,
            "restartCount": c.restart_count,
            "state": state,
            "lastState": last_state,
        });
        if let Some(r) = &c.run {
            v["containerID"] = json!(r.container_id);
        } else if let Some(t) = &c.last {
            v["containerID"] = json!(t.container_id);
        }
        // Always there, like the kubelet's: the apiserver refuses to resize
        // a running pod whose statuses lack `resources` ("Pod running on
        // node without support for resize").
        let actual = Self::actual(c);
        let mut resources = json!({});
        if let Some(r) = actual.requests.as_ref().filter(|m| !m.is_empty()) {
            resources["requests"] = json!(r);
        }
        if let Some(l) = actual.limits.as_ref().filter(|m| !m.is_empty()) {
            resources["limits"] = json!(l);
        }
        v["resources"] = resources;
        if let Some(r) = c.allocated.requests.as_ref().filter(|m| !m.is_empty()) {
            v["allocatedResources"] = json!(r);
        }
        v
    }

    fn status_json(&mut self) -> Value {
        let has_net = self.net.is_some();
        let inits_done = self
            .ctrs
            .iter()
            .filter(|c| c.init)
            .all(|c| c.done && c.last.as_ref().is_some_and(|t| t.exit_code == 0));
        let all_ready = self.ctrs.iter().any(|c| !c.init)
            && self.ctrs.iter().filter(|c| !c.init).all(|c| c.ready)
            && self.final_phase.is_none()
            && !self.deleting();
        let phase = match self.final_phase {
            Some(p) => p,
            None if inits_done
                && self
                    .ctrs
                    .iter()
                    .any(|c| !c.init && (c.run.is_some() || c.last.is_some())) =>
            {
                "Running"
            }
            None => "Pending",
        };
        self.set_condition("PodReadyToStartContainers", has_net);
        self.set_condition("Initialized", inits_done);
        self.set_condition("ContainersReady", all_ready);
        self.set_condition("Ready", all_ready);
        let regular: Vec<&Ctr> = self.ctrs.iter().filter(|c| !c.init).collect();
        let generation = self.pod.metadata.generation;
        let mut conditions = Vec::new();
        for (ty, (v, at)) in &self.conditions {
            let mut c = json!({
                "type": ty,
                "status": if *v { "True" } else { "False" },
                "lastProbeTime": null,
                "lastTransitionTime": Time(*at),
                "reason": null,
                "message": null,
            });
            if let Some(g) = generation {
                c["observedGeneration"] = json!(g);
            }
            if !*v && (*ty == "Ready" || *ty == "ContainersReady") {
                let not_ready: Vec<&str> = regular
                    .iter()
                    .filter(|c| !c.ready)
                    .map(|c| c.spec.name.as_str())
                    .collect();
                if !not_ready.is_empty() {
                    c["reason"] = json!("ContainersNotReady");
                    c["message"] = json!(format!(
                        "containers with unready status: [{}]",
                        not_ready.join(" ")
                    ));
                } else if self.final_phase.is_some() {
                    c["reason"] = json!("PodCompleted");
                }
            }
            if !*v && *ty == "Initialized" {
                let pending: Vec<&str> = self
                    .ctrs
                    .iter()
                    .filter(|c| c.init && !c.done)
                    .map(|c| c.spec.name.as_str())
                    .collect();
                c["reason"] = json!("ContainersNotInitialized");
                c["message"] = json!(format!(
                    "containers with incomplete status: [{}]",
                    pending.join(" ")
                ));
            }
            conditions.push(c);
        }
        for (ty, cond) in [
            ("PodResizePending", &self.resize.pending),
            ("PodResizeInProgress", &self.resize.in_progress),
        ] {
            conditions.push(match cond {
                Some(c) => json!({
                    "type": ty,
                    "status": "True",
                    "lastProbeTime": null,
                    "lastTransitionTime": Time(c.since),
                    "reason": c.reason,
                    "message": c.message,
                    "observedGeneration": c.generation,
                }),
                // Conditions merge by type in a strategic merge patch: a
                // finished resize's condition has to be deleted explicitly
                // (a no-op when it is not there).
                None => json!({"type": ty, "$patch": "delete"}),
            });
        }
        let statuses: Vec<Value> = regular.iter().map(|c| self.container_status(c)).collect();
        let init_statuses: Vec<Value> = self
            .ctrs
            .iter()
            .filter(|c| c.init)
            .map(|c| self.container_status(c))
            .collect();
        let host_ip = self.ctx.host_ip();
        let mut st = json!({
            "phase": phase,
            "conditions": conditions,
            "hostIP": host_ip,
            "hostIPs": [{"ip": host_ip}],
            "startTime": Time(self.start_time),
            "containerStatuses": statuses,
        });
        if !init_statuses.is_empty() {
            st["initContainerStatuses"] = json!(init_statuses);
        }
        if let Some(g) = generation {
            st["observedGeneration"] = json!(g);
        }
        if !self.status_ip.is_empty() {
            st["podIP"] = json!(self.status_ip);
            // podIPs merge by `ip` in a strategic merge patch: after a node
            // restart (a new address) the list would hold both and the
            // apiserver refuses the whole status. Replaced, not merged.
            st["podIPs"] = json!([{"$patch": "replace"}, {"ip": self.status_ip}]);
        }
        st
    }

    async fn push_status(&mut self) {
        let st = self.status_json();
        if self.last_pushed.as_ref() == Some(&st) {
            return;
        }
        let api: Api<Pod> = Api::namespaced(self.ctx.client.clone(), &self.ns);
        // The UID makes the patch a precondition: once this pod is gone and a
        // new one has its name (a StatefulSet re-creating it), the write is
        // refused as a UID change instead of landing on the new pod.
        let patch = json!({"metadata": {"uid": self.uid}, "status": st});
        match api
            .patch_status(
                &self.name,
                &PatchParams::default(),
                &Patch::Strategic(&patch),
            )
            .await
        {
            Ok(_) => self.last_pushed = Some(st),
            Err(kube::Error::Api(s)) if s.is_not_found() => {}
            Err(kube::Error::Api(s)) if s.code == 422 && s.message.contains("metadata.uid") => {
                tracing::debug!(pod = %self.name, "pod replaced by a new one; status not written");
            }
            Err(e) => tracing::warn!(pod = %self.name, error = %e, "status update failed"),
        }
    }

    /// Records a core/v1 Event on the pod (identical repeats are dropped).
    async fn event(&mut self, type_: &str, reason: &str, message: &str) {
        if self.last_event.get(reason).map(String::as_str) == Some(message) {
            return;
        }
        self.last_event
            .insert(reason.to_string(), message.to_string());
        let ts = now();
        let ev = Event {
            metadata: ObjectMeta {
                generate_name: Some(format!("{}.", self.name)),
                namespace: Some(self.ns.clone()),
                ..Default::default()
            },
            involved_object: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(self.name.clone()),
                namespace: Some(self.ns.clone()),
                uid: Some(self.uid.clone()),
                ..Default::default()
            },
            reason: Some(reason.into()),
            message: Some(message.chars().take(1024).collect()),
            type_: Some(type_.into()),
            first_timestamp: Some(Time(ts)),
            last_timestamp: Some(Time(ts)),
            count: Some(1),
            source: Some(k8s_openapi::api::core::v1::EventSource {
                component: Some("localnode".into()),
                host: Some(self.ctx.node_name.clone()),
            }),
            reporting_component: Some("localnode".into()),
            reporting_instance: Some(self.ctx.node_name.clone()),
            ..Default::default()
        };
        let api: Api<Event> = Api::namespaced(self.ctx.client.clone(), &self.ns);
        if let Err(e) = api.create(&PostParams::default(), &ev).await {
            tracing::debug!(error = %e, "event not recorded");
        }
    }
}

fn terminated_json(t: &Terminated) -> Value {
    let mut v = json!({
        "exitCode": t.exit_code,
        "reason": t.reason,
        "startedAt": Time(t.started_at),
        "finishedAt": Time(t.finished_at),
        "containerID": t.container_id,
    });
    if let Some(s) = t.signal {
        v["signal"] = json!(s);
    }
    if let Some(m) = &t.message {
        v["message"] = json!(m);
    }
    v
}

/// A short, stable identifier derived from the pod UID (netns/veth names).
pub fn short_id(uid: &str) -> String {
    uid.chars()
        .filter(|c| c.is_ascii_hexdigit())
        .take(12)
        .collect()
}

/// Signals a container's process group (the container process and whatever
/// it forked).
pub fn kill_group(pid: u32, sig: rustix::process::Signal) {
    if let Some(p) = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    {
        let _ = rustix::process::kill_process_group(p, sig);
    }
}

/// SIGTERM now, SIGKILL after `grace` if the process is still there.
fn terminate_process(pid: u32, grace: Duration) {
    kill_group(pid, rustix::process::Signal::TERM);
    tokio::spawn(async move {
        tokio::time::sleep(grace).await;
        kill_group(pid, rustix::process::Signal::KILL);
    });
}

fn probe_grace(p: &Probe, pod: &Pod) -> Duration {
    let s = p
        .termination_grace_period_seconds
        .or_else(|| {
            pod.spec
                .as_ref()
                .and_then(|s| s.termination_grace_period_seconds)
        })
        .unwrap_or(30)
        .max(0);
    Duration::from_secs(s as u64)
}

fn failure_text(o: &Outcome) -> String {
    match o {
        Outcome::Success => "ok".into(),
        Outcome::Failure(m) => m.clone(),
    }
}

fn spawn_probe(
    tx: mpsc::UnboundedSender<Ev>,
    idx: usize,
    epoch: u64,
    kind: ProbeKind,
    p: Probe,
    target: Target,
) -> AbortHandle {
    tokio::spawn(async move {
        let delay = Duration::from_secs(p.initial_delay_seconds.unwrap_or(0).max(0) as u64);
        tokio::time::sleep(delay).await;
        let period = Duration::from_secs(p.period_seconds.unwrap_or(10).max(1) as u64);
        loop {
            let outcome = probe::run(&p, &target).await;
            if tx
                .send(Ev::Probe {
                    idx,
                    epoch,
                    kind,
                    outcome,
                })
                .is_err()
            {
                break;
            }
            tokio::time::sleep(period).await;
        }
    })
    .abort_handle()
}

fn spawn_main_probes(
    tx: &mpsc::UnboundedSender<Ev>,
    idx: usize,
    epoch: u64,
    spec: &Container,
    target: &Target,
) -> Vec<AbortHandle> {
    let mut v = Vec::new();
    match &spec.readiness_probe {
        Some(p) => v.push(spawn_probe(
            tx.clone(),
            idx,
            epoch,
            ProbeKind::Readiness,
            p.clone(),
            target.clone(),
        )),
        None => {
            // No readiness probe: ready as soon as it runs.
            let _ = tx.send(Ev::Probe {
                idx,
                epoch,
                kind: ProbeKind::Readiness,
                outcome: Outcome::Success,
            });
        }
    }
    if let Some(p) = &spec.liveness_probe {
        v.push(spawn_probe(
            tx.clone(),
            idx,
            epoch,
            ProbeKind::Liveness,
            p.clone(),
            target.clone(),
        ));
    }
    v
}

/// The effective user, group and read-only root of a container, from the
/// pod's and the container's securityContext, else `image_user` (a real
/// image's `User`). The images this node maps run as root unless told
/// otherwise, so runAsNonRoot needs a runAsUser for them.
fn security(
    pod: &Pod,
    c: &Container,
    image_user: (Option<u32>, Option<u32>),
) -> Result<(Option<u32>, Option<u32>, bool)> {
    let psc = pod.spec.as_ref().and_then(|s| s.security_context.as_ref());
    let csc = c.security_context.as_ref();
    let uid = csc
        .and_then(|s| s.run_as_user)
        .or(psc.and_then(|s| s.run_as_user))
        .or(image_user.0.map(i64::from));
    let gid = csc
        .and_then(|s| s.run_as_group)
        .or(psc.and_then(|s| s.run_as_group))
        .or(image_user.1.map(i64::from));
    let non_root = csc
        .and_then(|s| s.run_as_non_root)
        .or(psc.and_then(|s| s.run_as_non_root))
        .unwrap_or(false);
    if non_root && uid.unwrap_or(0) == 0 {
        return Err(Error::ContainerConfig(
            "container has runAsNonRoot and image will run as root (set runAsUser)".into(),
        ));
    }
    let to_u32 = |v: Option<i64>, what: &str| -> Result<Option<u32>> {
        v.map(|x| u32::try_from(x).map_err(|_| Error::ContainerConfig(format!("bad {what} {x}"))))
            .transpose()
    };
    let ro = csc
        .and_then(|s| s.read_only_root_filesystem)
        .unwrap_or(false);
    Ok((to_u32(uid, "runAsUser")?, to_u32(gid, "runAsGroup")?, ro))
}

/// The pod's fsGroup and supplementalGroups, each once: every container
/// process has them as supplementary groups.
fn supplementary_groups(pod: &Pod) -> Result<Vec<u32>> {
    let Some(psc) = pod.spec.as_ref().and_then(|s| s.security_context.as_ref()) else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for g in psc
        .fs_group
        .iter()
        .chain(psc.supplemental_groups.iter().flatten())
    {
        let g = u32::try_from(*g).map_err(|_| Error::ContainerConfig(format!("bad group {g}")))?;
        if !out.contains(&g) {
            out.push(g);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mount(source: &str, target: &str, read_only: bool) -> MountSpec {
        MountSpec {
            source: PathBuf::from(source),
            target: target.into(),
            read_only,
        }
    }

    #[test]
    fn termination_message_paths_map_to_the_host() {
        let tmp = Path::new("/run/pod/tmp/c");
        let mounts = [
            mount("/vol/data", "/data", false),
            mount("/vol/deep", "/data/deep/", false),
            mount("/vol/ro", "/etc/cfg", true),
        ];
        let at = |p: &str| host_path_of(p, &mounts, tmp);
        assert_eq!(
            at("/tmp/result"),
            Some(PathBuf::from("/run/pod/tmp/c/result"))
        );
        assert_eq!(at("/data/msg"), Some(PathBuf::from("/vol/data/msg")));
        assert_eq!(at("/data/deep/m"), Some(PathBuf::from("/vol/deep/m")));
        assert_eq!(
            at("/database/m"),
            None,
            "a prefix of a name is not a parent"
        );
        assert_eq!(at("/etc/cfg/m"), None, "read-only volumes hold no message");
        assert_eq!(at("/dev/termination-log"), None);
    }

    #[test]
    fn the_log_tail_is_the_message_of_a_failed_run_only() {
        let dir = std::env::temp_dir().join(format!("localnode-msg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let log = dir.join("c.log");
        std::fs::write(&log, "earlier run\n").expect("write");
        let from = std::fs::metadata(&log).expect("meta").len();
        let mut text = String::from("earlier run\n");
        for i in 0..100 {
            text.push_str(&format!("line {i}\n"));
        }
        std::fs::write(&log, &text).expect("write");
        let src = MessageSource {
            file: Some(dir.join("absent")),
            fallback_to_logs: true,
            log: Some((log.clone(), from)),
        };
        assert_eq!(src.read(false), None);
        let m = src.read(true).expect("a message");
        assert!(m.starts_with("line 20\n") && m.ends_with("line 99"), "{m}");
        let file = dir.join("msg");
        std::fs::write(&file, "{\"reason\":\"X\"}").expect("write");
        let src = MessageSource {
            file: Some(file),
            ..src
        };
        assert_eq!(src.read(false).as_deref(), Some("{\"reason\":\"X\"}"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
