//! The local node runs pods as real processes: StatefulSets with volume
//! claims keep their data, crashed servers restart, engines report their
//! versions, readiness comes from real probes, deleted pods leave nothing
//! behind, unknown images get a clear waiting reason. Memory limits are real
//! (cgroup v1): a server past its limit is OOMKilled, and `pods/resize`
//! changes a running server's limit in place, as a kubelet does.
//!
//! Needs the dev cluster with the local node (`make cluster-up`) and root.

mod localnode_common;
mod support;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{
    ContainerStatus, Event, Node, PersistentVolumeClaim, Pod, PodCondition,
};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use localnode_common::*;
use serde_json::{Value, json};
use support::{TestNamespace, client, kubeconfig_path, repo_root, wait_for};

const READY: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statefulset_with_claims_runs_real_servers_and_keeps_data() {
    let client = client().await;
    require_localnode(&client).await;
    let ns = TestNamespace::new(&client, "ln-sts", &[]).await;
    let sts: StatefulSet = serde_json::from_value(json!({
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "cache"},
        "spec": {
            "serviceName": "cache",
            "replicas": 3,
            "selector": {"matchLabels": {"app": "cache"}},
            "template": {
                "metadata": {"labels": {"app": "cache"}},
                "spec": {
                    "terminationGracePeriodSeconds": 10,
                    "containers": [{
                        "name": "redis",
                        "image": "redis:7.0",
                        "command": ["redis-server"],
                        "args": ["--appendonly", "yes", "--dir", "/data"],
                        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                        "readinessProbe": {"exec": {"command": ["redis-cli", "ping"]}, "periodSeconds": 1},
                    }],
                },
            },
            "volumeClaimTemplates": [{
                "metadata": {"name": "data"},
                "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
            }],
        }
    }))
    .expect("statefulset json");
    Api::<StatefulSet>::namespaced(client.clone(), &ns.name)
        .create(&PostParams::default(), &sts)
        .await
        .expect("create statefulset");
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);

    let mut pids = Vec::new();
    for i in 0..3 {
        let p = wait_ready(&pods, &format!("cache-{i}"), None, Duration::from_secs(120)).await;
        assert_eq!(
            p.spec.as_ref().and_then(|s| s.node_name.as_deref()),
            Some(NODE)
        );
        let ip = pod_ip(&p).expect("pod IP");
        let pong = command(&ip, 6379, &["PING"])
            .await
            .expect("PING the pod IP");
        assert_eq!(pong, Reply::Simple("PONG".into()), "PING cache-{i} at {ip}");
        let pid: u32 = info_field(&ip, "process_id")
            .await
            .and_then(|p| p.parse().ok())
            .expect("process_id in INFO server");
        // Debian's redis-server is a symlink to redis-check-rdb, so look at
        // the process title rather than the executable.
        let cmdline =
            std::fs::read(format!("/proc/{pid}/cmdline")).expect("the server is a local process");
        let cmdline = String::from_utf8_lossy(&cmdline);
        assert!(
            cmdline.starts_with("redis-server"),
            "cache-{i} runs {cmdline}"
        );
        pids.push(pid);
    }
    pids.sort();
    pids.dedup();
    assert_eq!(pids.len(), 3, "three distinct redis-server processes");

    let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), &ns.name);
    let pvc = claims
        .get("data-cache-0")
        .await
        .expect("claim data-cache-0");
    assert_eq!(pvc.status.and_then(|s| s.phase).as_deref(), Some("Bound"));

    // Data written on pod-0 comes back after the pod is deleted and re-created.
    let p0 = pods.get("cache-0").await.expect("cache-0");
    let ip0 = pod_ip(&p0).expect("pod IP");
    let set = command(&ip0, 6379, &["SET", "survivor", "still-here"])
        .await
        .expect("SET");
    assert_eq!(set, Reply::Simple("OK".into()));
    let old_uid = p0.metadata.uid.clone().expect("uid");
    pods.delete("cache-0", &DeleteParams::default())
        .await
        .expect("delete cache-0");
    let p0 = wait_ready(&pods, "cache-0", Some(&old_uid), Duration::from_secs(120)).await;
    let ip0 = pod_ip(&p0).expect("pod IP");
    let got = command(&ip0, 6379, &["GET", "survivor"])
        .await
        .expect("GET");
    assert_eq!(
        got,
        Reply::Bulk(Some("still-here".into())),
        "the key survived pod re-creation"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_server_restarts_and_readiness_follows() {
    let client = client().await;
    require_localnode(&client).await;
    let ns = TestNamespace::new(&client, "ln-kill", &[]).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    create(&pods, &pod("crash", server("redis:7.0"))).await;
    let p = wait_ready(&pods, "crash", None, READY).await;
    let ip = pod_ip(&p).expect("pod IP");
    assert_eq!(restart_count(&p), 0);
    let pid: u32 = info_field(&ip, "process_id")
        .await
        .and_then(|p| p.parse().ok())
        .expect("process_id");

    // Record every Ready transition of this pod from here on.
    let watch = watcher(
        pods.clone(),
        watcher::Config::default().fields("metadata.name=crash"),
    );
    let seen = tokio::spawn(async move {
        let mut readiness = Vec::new();
        let stream = watch.boxed();
        let mut stream = stream.into_stream();
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            let next = tokio::time::timeout(Duration::from_secs(1), stream.try_next()).await;
            if let Ok(Ok(Some(watcher::Event::Apply(p) | watcher::Event::InitApply(p)))) = next {
                let r = (is_ready(&p), restart_count(&p));
                if readiness.last() != Some(&r) {
                    readiness.push(r);
                }
                if r == (true, 1) {
                    break;
                }
            }
        }
        readiness
    });
    tokio::time::sleep(Duration::from_millis(500)).await;

    let status = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -9 {pid}");

    let p = wait_for("restartCount 1 and Ready again", READY, || async {
        let p = pods.get("crash").await.ok()?;
        (restart_count(&p) == 1 && is_ready(&p)).then_some(p)
    })
    .await;
    let transitions = seen.await.expect("watch task");
    assert!(
        transitions.iter().any(|(ready, _)| !ready),
        "the pod went NotReady after the kill; saw {transitions:?}"
    );
    assert_eq!(transitions.last(), Some(&(true, 1)), "saw {transitions:?}");
    let last = p
        .status
        .and_then(|s| s.container_statuses)
        .and_then(|c| c.into_iter().next())
        .and_then(|c| c.last_state)
        .and_then(|s| s.terminated)
        .expect("lastState.terminated after the restart");
    assert_eq!(last.exit_code, 137, "SIGKILL shows as exit code 137");
    let new_pid: u32 = info_field(&ip, "process_id")
        .await
        .and_then(|p| p.parse().ok())
        .expect("process_id after restart");
    assert_ne!(new_pid, pid, "a new process serves the pod");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engines_report_their_versions_side_by_side() {
    let client = client().await;
    require_localnode(&client).await;
    let ns = TestNamespace::new(&client, "ln-ver", &[]).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let cases = [
        ("r62", "redis:6.2", "redis_version", "6.2."),
        (
            "r70",
            "docker.io/library/redis:7.0.15",
            "redis_version",
            "7.0.",
        ),
        ("vk8", "valkey/valkey:8.1", "valkey_version", "8.1."),
        ("vk9", "valkey/valkey:9.1", "valkey_version", "9.1."),
    ];
    for (name, image, _, _) in &cases {
        create(&pods, &pod(name, server(image))).await;
    }
    for (name, image, field, prefix) in &cases {
        let p = wait_ready(&pods, name, None, READY).await;
        let ip = pod_ip(&p).expect("pod IP");
        let version = info_field(&ip, field)
            .await
            .unwrap_or_else(|| panic!("{field} in INFO server of {name} ({image})"));
        assert!(
            version.starts_with(prefix),
            "{name} ({image}) reports {field}:{version}, expected {prefix}*"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_exec_readiness_probe_keeps_pod_not_ready() {
    let client = client().await;
    require_localnode(&client).await;
    let ns = TestNamespace::new(&client, "ln-probe", &[]).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let mut c = server("redis:7.0");
    c["readinessProbe"] = json!({
        "exec": {"command": ["redis-cli", "-p", "6390", "ping"]},
        "periodSeconds": 1,
    });
    create(&pods, &pod("unready", c)).await;
    let p = wait_for("the container running", READY, || async {
        let p = pods.get("unready").await.ok()?;
        let running = p
            .status
            .as_ref()?
            .container_statuses
            .as_ref()?
            .first()?
            .state
            .as_ref()?
            .running
            .is_some();
        running.then_some(p)
    })
    .await;
    let ip = pod_ip(&p).expect("pod IP");
    // The server answers, yet the probe (wrong port) fails: stays NotReady.
    let deadline = Instant::now() + Duration::from_secs(8);
    while Instant::now() < deadline {
        let p = pods.get("unready").await.expect("pod");
        assert!(
            !is_ready(&p),
            "a pod whose readiness probe fails must not be Ready"
        );
        assert_eq!(
            p.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Running")
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(
        command(&ip, 6379, &["PING"]).await.ok(),
        Some(Reply::Simple("PONG".into()))
    );
    let ready = p
        .status
        .and_then(|s| s.container_statuses)
        .and_then(|c| c.into_iter().next())
        .map(|c| c.ready);
    assert_eq!(ready, Some(false));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_image_gives_clear_waiting_reason() {
    let client = client().await;
    require_localnode(&client).await;
    let ns = TestNamespace::new(&client, "ln-img", &[]).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    create(
        &pods,
        &pod(
            "nope",
            json!({"name": "app", "image": "example.invalid/nope:1"}),
        ),
    )
    .await;
    let (reason, message) = wait_for("a waiting reason for the unknown image", READY, || async {
        waiting_reason(&pods.get("nope").await.ok()?)
            .filter(|(r, _)| r == "ErrImagePull" || r == "ImagePullBackOff")
    })
    .await;
    assert!(
        message.contains("example.invalid/nope:1") && message.contains("images.yaml"),
        "{reason}: {message}"
    );
    // The node is unharmed: another pod still runs.
    create(&pods, &pod("fine", server("redis:7.0"))).await;
    wait_ready(&pods, "fine", None, READY).await;
    require_localnode(&client).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_pods_leave_no_processes() {
    let client = client().await;
    require_localnode(&client).await;
    let ns = TestNamespace::new(&client, "ln-del", &[]).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let mut c = server("redis:7.0");
    // A shell parent with a server child: both must go.
    c["command"] = json!(["sh", "-c", "redis-server --save '' & wait"]);
    c.as_object_mut().map(|o| o.remove("args"));
    create(&pods, &pod("pair", c)).await;
    create(&pods, &pod("single", server("valkey/valkey:8.1"))).await;
    let mut victims = Vec::new();
    for name in ["pair", "single"] {
        let p = wait_ready(&pods, name, None, READY).await;
        let uid = p.metadata.uid.clone().expect("uid");
        let netns = pod_netns("rp", &uid);
        let out = std::process::Command::new("ip")
            .args(["netns", "pids", &netns])
            .output()
            .expect("ip netns pids");
        let pids: Vec<u32> = String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect();
        let expected = if name == "pair" { 2 } else { 1 };
        assert_eq!(
            pids.len(),
            expected,
            "processes of {name} in {netns}: {pids:?}"
        );
        victims.push((name, uid, netns, pids));
    }
    for (name, uid, netns, pids) in &victims {
        pods.delete(name, &DeleteParams::default())
            .await
            .expect("delete");
        wait_gone(&pods, name, uid, Duration::from_secs(30)).await;
        for pid in pids {
            assert!(
                !process_alive(*pid),
                "process {pid} of deleted pod {name} is still alive"
            );
        }
        assert!(
            netns_with_prefix(netns).is_empty(),
            "network namespace {netns} of deleted pod {name} is still there"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_to_ready_latency() {
    let client = client().await;
    require_localnode(&client).await;
    let ns = TestNamespace::new(&client, "ln-lat", &[]).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let mut samples = Vec::new();
    for i in 0..10 {
        let name = format!("lat-{i}");
        let start = Instant::now();
        create(&pods, &pod(&name, server("redis:7.0"))).await;
        wait_ready(&pods, &name, None, READY).await;
        samples.push(start.elapsed());
    }
    samples.sort();
    let median = (samples[4] + samples[5]) / 2;
    let max = samples[samples.len() - 1];
    println!(
        "pod create -> Ready over {} pods: median {median:?}, max {max:?}",
        samples.len()
    );
    assert!(
        median < Duration::from_secs(10),
        "median create->Ready {median:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_root_keeps_volumes_mounted_on_top_dirs_writable() {
    let client = client().await;
    require_localnode(&client).await;
    let ns = TestNamespace::new(&client, "ln-rofs", &[]).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let mut c = server("redis:7.0");
    // Writes to the emptyDir at /tmp must work; the root itself must not be
    // writable; then the server runs (and the probe sees the file).
    c["command"] = json!([
        "sh",
        "-c",
        "echo x > /tmp/written && if touch /etc/nope 2>/dev/null; then exit 3; fi; \
         exec redis-server --save ''"
    ]);
    c["args"] = json!([]);
    c["securityContext"] = json!({"readOnlyRootFilesystem": true});
    c["volumeMounts"] = json!([{"name": "tmp", "mountPath": "/tmp"}]);
    c["readinessProbe"] = json!({
        "exec": {"command": ["sh", "-c", "test -s /tmp/written"]},
        "periodSeconds": 1,
    });
    let mut p = pod("rofs", c);
    if let Some(spec) = p.spec.as_mut() {
        spec.volumes = Some(vec![
            serde_json::from_value(json!({"name": "tmp", "emptyDir": {}})).expect("volume"),
        ]);
    }
    create(&pods, &p).await;
    let p = wait_ready(&pods, "rofs", None, READY).await;
    assert_eq!(restart_count(&p), 0, "the container never failed");
}

// ---------------------------------------------------------------------------
// Memory limits and in-place resize (KEP-1287).

const MI: i64 = 1024 * 1024;

/// A redis:7.0 server with memory requests and limits.
fn sized_server(request: &str, limit: &str) -> Value {
    let mut c = server("redis:7.0");
    c["resources"] = json!({"requests": {"memory": request}, "limits": {"memory": limit}});
    c
}

/// `pods/resize` of the container `server` (a strategic merge patch, as
/// `kubectl patch --subresource resize` sends by default).
async fn resize(
    pods: &Api<Pod>,
    name: &str,
    request: &str,
    limit: &str,
) -> Result<Pod, kube::Error> {
    let patch = json!({"spec": {"containers": [{
        "name": "server",
        "resources": {"requests": {"memory": request}, "limits": {"memory": limit}},
    }]}});
    pods.patch_subresource(
        "resize",
        name,
        &PatchParams::default(),
        &Patch::Strategic(&patch),
    )
    .await
}

fn status_of(p: &Pod) -> ContainerStatus {
    p.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first())
        .cloned()
        .expect("a container status")
}

/// `status.containerStatuses[0].resources.<kind>.memory`.
fn status_memory(p: &Pod, kind: &str) -> Option<String> {
    let r = status_of(p).resources?;
    let map = if kind == "limits" {
        r.limits
    } else {
        r.requests
    };
    map?.get("memory").map(|q| q.0.clone())
}

fn allocated_memory(p: &Pod) -> Option<String> {
    status_of(p)
        .allocated_resources?
        .get("memory")
        .map(|q| q.0.clone())
}

fn condition(p: &Pod, ty: &str) -> Option<PodCondition> {
    p.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == ty)
        .cloned()
}

/// The memory cgroup a process is in, on the host (from /proc/<pid>/cgroup).
fn memory_cgroup(pid: u32) -> PathBuf {
    let path = memory_cgroup_of(pid).unwrap_or_else(|| panic!("no memory cgroup for {pid}"));
    PathBuf::from("/sys/fs/cgroup/memory").join(path.trim_start_matches('/'))
}

fn cgroup_value(pid: u32, file: &str) -> i64 {
    let f = memory_cgroup(pid).join(file);
    std::fs::read_to_string(&f)
        .unwrap_or_else(|e| panic!("{}: {e}", f.display()))
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("{}: {e}", f.display()))
}

async fn server_pid(ip: &str) -> u32 {
    info_field(ip, "process_id")
        .await
        .and_then(|p| p.parse().ok())
        .expect("process_id in INFO server")
}

/// Stores `mib` values of 1 MiB; returns how many were stored before the
/// server stopped answering.
async fn fill(ip: &str, mib: usize) -> usize {
    let value = "x".repeat(1 << 20);
    for i in 0..mib {
        match command(ip, 6379, &["SET", &format!("fill:{i}"), &value]).await {
            Ok(Reply::Simple(ok)) if ok == "OK" => {}
            _ => return i,
        }
    }
    mib
}

/// The pod's Events as (reason, message).
async fn events(client: &kube::Client, ns: &str, pod: &str) -> Vec<(String, String)> {
    Api::<Event>::namespaced(client.clone(), ns)
        .list(&ListParams::default().fields(&format!("involvedObject.name={pod}")))
        .await
        .expect("list events")
        .items
        .into_iter()
        .map(|e| (e.reason.unwrap_or_default(), e.message.unwrap_or_default()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_resize_up_applies_in_place_without_restart() {
    let client = client().await;
    require_localnode(&client).await;
    let ns = TestNamespace::new(&client, "ln-rsz-up", &[]).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    create(&pods, &pod("grow", sized_server("32Mi", "64Mi"))).await;
    let p = wait_ready(&pods, "grow", None, READY).await;
    let ip = pod_ip(&p).expect("pod IP");
    let pid = server_pid(&ip).await;
    let run_id = info_field(&ip, "run_id").await.expect("run_id");
    // Reported and enforced from the start.
    assert_eq!(status_memory(&p, "limits").as_deref(), Some("64Mi"));
    assert_eq!(status_memory(&p, "requests").as_deref(), Some("32Mi"));
    assert_eq!(allocated_memory(&p).as_deref(), Some("32Mi"));
    assert_eq!(cgroup_value(pid, "memory.limit_in_bytes"), 64 * MI);

    let start = Instant::now();
    let resized = resize(&pods, "grow", "48Mi", "96Mi")
        .await
        .expect("the apiserver accepts the resize");
    let generation = resized.metadata.generation.expect("pods have a generation");
    // Polled every 10 ms: the time is the node's, not the poll period's.
    let p = loop {
        let p = pods.get("grow").await.expect("pod");
        if status_memory(&p, "limits").as_deref() == Some("96Mi") {
            break p;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the new limit never reached the status: {:?}",
            p.status
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let took = start.elapsed();
    println!(
        "pods/resize 64Mi -> 96Mi: new limit in status.containerStatuses after {} ms",
        took.as_millis()
    );
    assert!(took < Duration::from_secs(5), "resize took {took:?}");
    assert_eq!(status_memory(&p, "requests").as_deref(), Some("48Mi"));
    assert_eq!(allocated_memory(&p).as_deref(), Some("48Mi"));
    assert_eq!(cgroup_value(pid, "memory.limit_in_bytes"), 96 * MI);
    assert_eq!(
        p.status.as_ref().and_then(|s| s.observed_generation),
        Some(generation)
    );
    // Done: both resize conditions gone (the kubelet removes them).
    let p = wait_for(
        "the resize conditions cleared",
        Duration::from_secs(5),
        || async {
            let p = pods.get("grow").await.ok()?;
            (condition(&p, "PodResizeInProgress").is_none()
                && condition(&p, "PodResizePending").is_none())
            .then_some(p)
        },
    )
    .await;
    // In place: the same process, never restarted.
    assert_eq!(restart_count(&p), 0);
    assert_eq!(server_pid(&ip).await, pid);
    assert_eq!(
        info_field(&ip, "run_id").await.as_deref(),
        Some(run_id.as_str())
    );
    // The room is real: 64 MiB of data would not have fitted the old limit.
    assert_eq!(
        fill(&ip, 64).await,
        64,
        "64 MiB stored under the 96Mi limit"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    let p = pods.get("grow").await.expect("pod");
    assert_eq!(restart_count(&p), 0, "not OOM-killed under the new limit");
    assert_eq!(server_pid(&ip).await, pid);
    let evs = wait_for(
        "a ResizeCompleted event",
        Duration::from_secs(5),
        || async {
            let evs = events(&client, &ns.name, "grow").await;
            evs.iter()
                .any(|(r, _)| r == "ResizeCompleted")
                .then_some(evs)
        },
    )
    .await;
    let (_, msg) = evs
        .iter()
        .find(|(r, _)| r == "ResizeCompleted")
        .expect("ResizeCompleted");
    assert!(
        msg.starts_with("Pod resize completed: ") && msg.contains("limits.memory 64Mi → 96Mi"),
        "{msg}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resize_beyond_node_allocatable_is_refused_and_changes_nothing() {
    let client = client().await;
    require_localnode(&client).await;
    let ns = TestNamespace::new(&client, "ln-rsz-big", &[]).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    create(&pods, &pod("huge", sized_server("32Mi", "64Mi"))).await;
    let p = wait_ready(&pods, "huge", None, READY).await;
    let ip = pod_ip(&p).expect("pod IP");
    let pid = server_pid(&ip).await;
    let node = Api::<Node>::all(client.clone())
        .get(NODE)
        .await
        .expect("node");
    let allocatable = node
        .status
        .and_then(|s| s.allocatable)
        .and_then(|a| a.get("memory").cloned())
        .expect("allocatable memory");
    let kib: i64 = allocatable
        .0
        .strip_suffix("Ki")
        .and_then(|k| k.parse().ok())
        .unwrap_or_else(|| panic!("allocatable memory {allocatable:?} in Ki"));
    let too_much = format!("{}Mi", kib / 1024 + 1024);
    // Kubernetes 1.35+ checks a resize against the node's allocatable at
    // admission; the kubelet's Infeasible verdict never gets a chance.
    match resize(&pods, "huge", &too_much, &too_much).await {
        Err(kube::Error::Api(s)) => {
            println!("resize to {too_much} refused: {} {}", s.code, s.message);
            assert_eq!(s.code, 403, "{s:?}");
            assert!(
                s.message
                    .contains("node didn't have enough allocatable resources: memory"),
                "{s:?}"
            );
        }
        Ok(_) => {
            // An apiserver without that check: the node must refuse it.
            let c = wait_for(
                "PodResizePending Infeasible",
                Duration::from_secs(10),
                || async {
                    let p = pods.get("huge").await.ok()?;
                    let c = condition(&p, "PodResizePending")?;
                    (c.reason.as_deref() == Some("Infeasible")).then_some(c)
                },
            )
            .await;
            assert!(
                c.message
                    .as_deref()
                    .is_some_and(|m| m.starts_with("Node didn't have enough capacity: memory")),
                "{c:?}"
            );
            // Nothing below holds for the spec (it has the new size).
            pods.patch_subresource(
                "resize",
                "huge",
                &PatchParams::default(),
                &Patch::Strategic(json!({"spec": {"containers": [{"name": "server",
                    "resources": {"requests": {"memory": "32Mi"}, "limits": {"memory": "64Mi"}}}]}})),
            )
            .await
            .expect("resize back");
        }
        Err(e) => panic!("resize: {e}"),
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let p = pods.get("huge").await.expect("pod");
    assert_eq!(status_memory(&p, "limits").as_deref(), Some("64Mi"));
    assert_eq!(allocated_memory(&p).as_deref(), Some("32Mi"));
    assert_eq!(cgroup_value(pid, "memory.limit_in_bytes"), 64 * MI);
    assert!(condition(&p, "PodResizeInProgress").is_none());
    assert_eq!(restart_count(&p), 0);
    assert_eq!(server_pid(&ip).await, pid);
}

/// A second local node with little memory, for one test: its own name,
/// host-object prefix, subnet and state directory; unschedulable (pods name
/// it in `spec.nodeName`). Dropped: stopped, its pods force-deleted, its
/// Node deleted.
struct SmallNode {
    name: &'static str,
    state: PathBuf,
    namespace: String,
}

impl SmallNode {
    fn script(&self, action: &str) -> std::process::Output {
        std::process::Command::new("bash")
            .arg(repo_root().join("dev/localnode.sh"))
            .arg(action)
            .env("KUBECONFIG", kubeconfig_path())
            .env("LOCALNODE_NAME", self.name)
            .env("LOCALNODE_STATE", &self.state)
            .env("LOCALNODE_PREFIX", "rrz")
            .env("LOCALNODE_POD_NETWORK", "10.246.0.1/16")
            .env("LOCALNODE_MEMORY_MIB", "256")
            .env("LOCALNODE_PROVISIONER", "false")
            .env("LOCALNODE_UNSCHEDULABLE", "1")
            .env("LOCALNODE_NO_BUILD", "1")
            .output()
            .unwrap_or_else(|e| panic!("dev/localnode.sh {action}: {e}"))
    }

    fn start(namespace: &str) -> Self {
        let node = SmallNode {
            name: "localnode-resize",
            state: repo_root().join(".dev/localnode-resize-test"),
            namespace: namespace.to_string(),
        };
        let _ = node.script("stop");
        let out = node.script("start");
        assert!(
            out.status.success(),
            "dev/localnode.sh start (256 MiB node) failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        node
    }

    fn place(&self, mut p: Pod) -> Pod {
        if let Some(spec) = p.spec.as_mut() {
            spec.node_selector = None;
            spec.node_name = Some(self.name.into());
        }
        p
    }
}

impl Drop for SmallNode {
    fn drop(&mut self) {
        let _ = self.script("stop");
        let kubectl = |args: &[&str]| {
            let _ = std::process::Command::new(repo_root().join("bin/kubectl"))
                .arg("--kubeconfig")
                .arg(kubeconfig_path())
                .args(args)
                .output();
        };
        let selector = format!("spec.nodeName={}", self.name);
        kubectl(&[
            "-n",
            &self.namespace,
            "delete",
            "pods",
            "--field-selector",
            &selector,
            "--force",
            "--grace-period=0",
            "--wait=false",
        ]);
        kubectl(&["delete", "node", self.name, "--wait=false"]);
        let _ = std::fs::remove_dir_all(&self.state);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resize_that_fits_the_node_but_not_its_free_memory_is_deferred() {
    let client = client().await;
    require_localnode(&client).await;
    let ns = TestNamespace::new(&client, "ln-rsz-defer", &[]).await;
    let node = SmallNode::start(&ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    create(
        &pods,
        &node.place(pod("hog", sized_server("160Mi", "160Mi"))),
    )
    .await;
    create(
        &pods,
        &node.place(pod("small", sized_server("32Mi", "64Mi"))),
    )
    .await;
    wait_ready(&pods, "hog", None, READY).await;
    let p = wait_ready(&pods, "small", None, READY).await;
    let ip = pod_ip(&p).expect("pod IP");
    assert!(
        ip.starts_with("10.246."),
        "small runs on the 256 MiB node: {ip}"
    );
    let pid = server_pid(&ip).await;

    // 128Mi fits the node (256Mi), not next to hog's 160Mi.
    resize(&pods, "small", "128Mi", "128Mi")
        .await
        .expect("the apiserver accepts a resize within the node's allocatable");
    let c = wait_for(
        "PodResizePending Deferred",
        Duration::from_secs(10),
        || async {
            let p = pods.get("small").await.ok()?;
            let c = condition(&p, "PodResizePending")?;
            (c.reason.as_deref() == Some("Deferred")).then_some(c)
        },
    )
    .await;
    assert_eq!(
        c.message.as_deref(),
        Some(
            format!(
                "Node didn't have enough resource: memory, requested: {}, used: {}, capacity: {}",
                128 * MI,
                160 * MI,
                256 * MI
            )
            .as_str()
        )
    );
    assert_eq!(c.status, "True");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let p = pods.get("small").await.expect("pod");
    assert_eq!(
        status_memory(&p, "limits").as_deref(),
        Some("64Mi"),
        "nothing applied"
    );
    assert_eq!(allocated_memory(&p).as_deref(), Some("32Mi"));
    assert_eq!(cgroup_value(pid, "memory.limit_in_bytes"), 64 * MI);
    assert!(condition(&p, "PodResizeInProgress").is_none());
    assert!(
        events(&client, &ns.name, "small")
            .await
            .iter()
            .any(|(r, m)| r == "ResizeDeferred" && m.starts_with("Pod resize Deferred: ")),
        "a ResizeDeferred event"
    );

    // Room is made: the deferred resize goes through, in place.
    let hog = pods.get("hog").await.expect("hog");
    pods.delete("hog", &DeleteParams::default())
        .await
        .expect("delete hog");
    wait_gone(
        &pods,
        "hog",
        hog.metadata.uid.as_deref().unwrap_or_default(),
        Duration::from_secs(30),
    )
    .await;
    let p = wait_for(
        "the deferred resize applied",
        Duration::from_secs(10),
        || async {
            let p = pods.get("small").await.ok()?;
            (status_memory(&p, "limits").as_deref() == Some("128Mi")
                && condition(&p, "PodResizePending").is_none())
            .then_some(p)
        },
    )
    .await;
    assert_eq!(cgroup_value(pid, "memory.limit_in_bytes"), 128 * MI);
    assert_eq!(restart_count(&p), 0);
    assert_eq!(server_pid(&ip).await, pid);
    drop(node);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_past_its_memory_limit_is_oom_killed_and_restarted() {
    let client = client().await;
    require_localnode(&client).await;
    let ns = TestNamespace::new(&client, "ln-oom", &[]).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    // maxmemory 0 (the default): the server grows until the kernel stops it.
    create(&pods, &pod("oom", sized_server("32Mi", "32Mi"))).await;
    let p = wait_ready(&pods, "oom", None, READY).await;
    let ip = pod_ip(&p).expect("pod IP");
    let pid = server_pid(&ip).await;
    assert_eq!(cgroup_value(pid, "memory.limit_in_bytes"), 32 * MI);
    let stored = fill(&ip, 100).await;
    assert!(
        stored < 32,
        "the server took {stored} MiB under a 32Mi limit"
    );
    let p = wait_for("restarted after the OOM kill", READY, || async {
        let p = pods.get("oom").await.ok()?;
        (restart_count(&p) == 1 && is_ready(&p)).then_some(p)
    })
    .await;
    let last = status_of(&p)
        .last_state
        .and_then(|s| s.terminated)
        .expect("lastState.terminated");
    assert_eq!(last.reason.as_deref(), Some("OOMKilled"), "{last:?}");
    assert_eq!(last.exit_code, 137);
    let new_pid = server_pid(&ip).await;
    assert_ne!(new_pid, pid, "a new process");
    assert_eq!(cgroup_value(new_pid, "memory.limit_in_bytes"), 32 * MI);
    assert!(!process_alive(pid));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_limit_decrease_below_usage_stays_in_progress_with_error() {
    let client = client().await;
    require_localnode(&client).await;
    let ns = TestNamespace::new(&client, "ln-rsz-down", &[]).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    create(&pods, &pod("shrink", sized_server("32Mi", "128Mi"))).await;
    let p = wait_ready(&pods, "shrink", None, READY).await;
    let ip = pod_ip(&p).expect("pod IP");
    let pid = server_pid(&ip).await;
    assert_eq!(fill(&ip, 48).await, 48);
    let used = cgroup_value(pid, "memory.usage_in_bytes");
    assert!(used > 40 * MI, "usage {used}");

    resize(&pods, "shrink", "32Mi", "40Mi")
        .await
        .expect("the apiserver accepts a limit decrease");
    let c = wait_for(
        "PodResizeInProgress Error",
        Duration::from_secs(10),
        || async {
            let p = pods.get("shrink").await.ok()?;
            let c = condition(&p, "PodResizeInProgress")?;
            (c.reason.as_deref() == Some("Error")).then_some(c)
        },
    )
    .await;
    let msg = c.message.clone().unwrap_or_default();
    assert!(
        msg.starts_with("cannot decrease memory limits: ")
            && msg.contains(&format!(
                "attempting to set container \"server\" memory limit ({}) below current usage",
                40 * MI
            )),
        "{msg}"
    );
    // Retried, never applied, the server untouched.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let p = pods.get("shrink").await.expect("pod");
    let c = condition(&p, "PodResizeInProgress").expect("still in progress");
    assert_eq!(c.reason.as_deref(), Some("Error"));
    assert_eq!(status_memory(&p, "limits").as_deref(), Some("128Mi"));
    assert_eq!(cgroup_value(pid, "memory.limit_in_bytes"), 128 * MI);
    assert_eq!(restart_count(&p), 0);
    assert_eq!(server_pid(&ip).await, pid);
    assert_eq!(
        command(&ip, 6379, &["DBSIZE"]).await.ok(),
        Some(Reply::Int(48))
    );
    assert!(
        events(&client, &ns.name, "shrink")
            .await
            .iter()
            .any(|(r, m)| r == "ResizeError" && m.contains("below current usage")),
        "a ResizeError event"
    );

    // A limit above the usage replaces it and completes.
    resize(&pods, "shrink", "32Mi", "256Mi")
        .await
        .expect("resize up");
    let p = wait_for(
        "the new resize completed",
        Duration::from_secs(10),
        || async {
            let p = pods.get("shrink").await.ok()?;
            (status_memory(&p, "limits").as_deref() == Some("256Mi")
                && condition(&p, "PodResizeInProgress").is_none())
            .then_some(p)
        },
    )
    .await;
    assert_eq!(cgroup_value(pid, "memory.limit_in_bytes"), 256 * MI);
    assert_eq!(restart_count(&p), 0);
    assert_eq!(server_pid(&ip).await, pid);
}
