//! The local node runs pods as real processes: StatefulSets with volume
//! claims keep their data, crashed servers restart, engines report their
//! versions, readiness comes from real probes, deleted pods leave nothing
//! behind, unknown images get a clear waiting reason.
//!
//! Needs the dev cluster with the local node (`make cluster-up`) and root.

mod localnode_common;
mod support;

use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::watcher;
use localnode_common::*;
use serde_json::json;
use support::{TestNamespace, client, wait_for};

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
