//! The scorecard as OperatorHub's pipeline runs it: `operator-sdk scorecard
//! ./bundle` against the dev cluster, each test as a pod on the local node
//! (init container `scorecard-untar` untars the bundle ConfigMap, then
//! `scorecard-test <test>` prints its result), the results read from the
//! pods' logs through the API server. Pod logs come from the local node's
//! kubelet endpoint (`GET /containerLogs/…`), which `kubectl logs` uses too.
//!
//! Needs the dev cluster with the local node (`make cluster-up`), the image
//! mappings of the scorecard images in dev/images.yaml, and bin/operator-sdk
//! and bin/scorecard-test (`make tools`).

mod localnode_common;
mod olm_common;
mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ContainerStatus, Node, Pod, ServiceAccount};
use kube::api::{Api, ListParams};
use localnode_common::*;
use redpilot::scorecard::{TESTS, highest_level};
use serde_json::{Value, json};
use support::operator::{OperatorOptions, redis_api, start_operator};
use support::{TestNamespace, client, kubeconfig_path, repo_root, wait_for};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};

/// The scorecard's own deadline (`--wait-time`), and ours around it.
const SCORECARD_WAIT: &str = "180s";
const OUR_DEADLINE: Duration = Duration::from_secs(200);
/// A scorecard pod left unscheduled this long fails the test.
const UNSCHEDULED: Duration = Duration::from_secs(30);

fn tool(name: &str) -> PathBuf {
    let p = repo_root().join("bin").join(name);
    assert!(
        p.exists(),
        "bin/{name} is missing: run `make tools` (it installs operator-sdk and scorecard-test)"
    );
    p
}

fn kubectl() -> tokio::process::Command {
    let mut c = tokio::process::Command::new(tool("kubectl"));
    c.arg("--kubeconfig").arg(kubeconfig_path());
    c
}

/// `kubectl logs` with extra arguments: (success, stdout, stderr).
async fn kubectl_logs(ns: &str, args: &[&str]) -> (bool, String, String) {
    let out = kubectl()
        .args(["-n", ns, "logs"])
        .args(args)
        .output()
        .await
        .unwrap_or_else(|e| panic!("running kubectl logs: {e}"));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The namespace's `default` ServiceAccount (the scorecard's pods run as
/// it; a pod created before the controller made it is refused).
async fn wait_default_service_account(client: &kube::Client, ns: &str) {
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    wait_for(
        &format!("serviceaccount {ns}/default"),
        Duration::from_secs(30),
        || async { sas.get_opt("default").await.ok().flatten() },
    )
    .await;
}

/// The node advertises a kubelet endpoint the API server can reach: a port
/// and a loopback `Hostname` address (the type the API server tries first).
async fn require_kubelet_endpoint(client: &kube::Client) -> (String, i32) {
    let node = Api::<Node>::all(client.clone())
        .get(NODE)
        .await
        .unwrap_or_else(|e| panic!("reading node/{NODE}: {e}"));
    let status = node.status.unwrap_or_default();
    let port = status
        .daemon_endpoints
        .and_then(|d| d.kubelet_endpoint)
        .map(|e| e.port)
        .unwrap_or(0);
    let host = status
        .addresses
        .unwrap_or_default()
        .into_iter()
        .find(|a| a.type_ == "Hostname")
        .map(|a| a.address)
        .unwrap_or_default();
    assert!(
        port > 0 && host.starts_with("127."),
        "node/{NODE} advertises no kubelet endpoint the API server can reach \
         (Hostname address {host:?}, daemonEndpoints.kubeletEndpoint.Port {port}): \
         is dev/localnode.sh running a localnode with the kubelet API? Restart it: \
         dev/localnode.sh stop; dev/localnode.sh start"
    );
    (host, port)
}

// ---------------------------------------------------------------------------
// kubectl logs

/// `kubectl logs` of a local node pod: the current run only (the log file
/// holds every run), `--previous`, `--tail`, `--limit-bytes`, and `-f`
/// streaming until the container ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_logs_serves_current_and_previous_runs_tail_limit_and_follow() {
    let client = client().await;
    require_localnode(&client).await;
    let (host, port) = require_kubelet_endpoint(&client).await;
    let ns = TestNamespace::new(&client, "ln-logs", &[]).await;
    wait_default_service_account(&client, &ns.name).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    // Run 1 prints five lines and fails; run 2 prints them, then ticks
    // once a second for four seconds and succeeds.
    let script = r#"n=$(cat /data/n 2>/dev/null || echo 0); n=$((n+1)); echo $n > /data/n
echo "run $n"; for i in 1 2 3 4 5; do echo "line $i"; done
[ "$n" -ge 2 ] || exit 1
for i in 1 2 3 4; do sleep 1; echo "tick $i"; done"#;
    let mut p = pod(
        "talker",
        json!({
            "name": "talk",
            "image": "redis:7.0",
            "command": ["sh", "-c", script],
            "volumeMounts": [{"name": "data", "mountPath": "/data"}],
        }),
    );
    let spec = p.spec.as_mut().expect("pod spec");
    spec.restart_policy = Some("OnFailure".into());
    spec.volumes = Some(vec![
        serde_json::from_value(json!({"name": "data", "emptyDir": {}})).expect("volume"),
    ]);
    create(&pods, &p).await;
    // The second run is running.
    wait_for(
        "talker's second run (restartCount 1, running)",
        Duration::from_secs(60),
        || async {
            let p = pods.get("talker").await.ok()?;
            let cs = container_status(&p, "talk")?;
            (cs.restart_count == 1 && cs.state.as_ref()?.running.is_some()).then_some(())
        },
    )
    .await;

    // Follow: lines arrive while the container runs; kubectl returns once
    // it has ended.
    let started = Instant::now();
    let mut follow = kubectl()
        .args(["-n", &ns.name, "logs", "-f", "talker"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("running kubectl logs -f");
    let mut lines = BufReader::new(follow.stdout.take().expect("stdout")).lines();
    let mut followed = Vec::new();
    let read_all = async {
        while let Ok(Some(l)) = lines.next_line().await {
            followed.push((started.elapsed(), l));
        }
    };
    tokio::time::timeout(Duration::from_secs(30), read_all)
        .await
        .expect("kubectl logs -f did not end within 30 s of a container that runs 4 s");
    let status = follow.wait().await.expect("kubectl logs -f");
    let mut err = String::new();
    if let Some(mut e) = follow.stderr.take() {
        let _ = e.read_to_string(&mut err).await;
    }
    assert!(status.success(), "kubectl logs -f failed: {err}");
    let text: Vec<&str> = followed.iter().map(|(_, l)| l.as_str()).collect();
    let run2 = [
        "run 2", "line 1", "line 2", "line 3", "line 4", "line 5", "tick 1", "tick 2", "tick 3",
        "tick 4",
    ];
    assert_eq!(text, run2, "kubectl logs -f talker");
    let first = followed.first().map(|(t, _)| *t).unwrap_or_default();
    let last = followed.last().map(|(t, _)| *t).unwrap_or_default();
    assert!(
        last - first >= Duration::from_millis(1500),
        "kubectl logs -f gave everything at once ({first:?} .. {last:?}): not streamed"
    );

    // The container has ended (Completed); its log stays readable.
    wait_for("talker Succeeded", Duration::from_secs(30), || async {
        let p = pods.get("talker").await.ok()?;
        (p.status?.phase.as_deref() == Some("Succeeded")).then_some(())
    })
    .await;
    let expect = |args: &[&str], want: &str| {
        let ns = ns.name.clone();
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let want = want.to_string();
        async move {
            let a: Vec<&str> = args.iter().map(String::as_str).collect();
            let (ok, out, err) = kubectl_logs(&ns, &a).await;
            assert!(ok, "kubectl logs {a:?} failed: {err}");
            assert_eq!(out, want, "kubectl logs {a:?}");
            println!(
                "kubectl logs {}: {} bytes as expected",
                a.join(" "),
                out.len()
            );
        }
    };
    let run2_text = run2.iter().map(|l| format!("{l}\n")).collect::<String>();
    expect(&["talker"], &run2_text).await;
    expect(
        &["talker", "--previous"],
        "run 1\nline 1\nline 2\nline 3\nline 4\nline 5\n",
    )
    .await;
    expect(&["talker", "--tail", "2"], "tick 3\ntick 4\n").await;
    expect(&["talker", "--tail", "0"], "").await;
    expect(&["talker", "--limit-bytes", "6"], "run 2\n").await;
    expect(&["talker", "-c", "talk", "--tail", "1", "-p"], "line 5\n").await;
    println!("kubectl logs: served by the local node at {host}:{port} through the API server");
}

/// `kubectl logs` of a container that never started says why, as the
/// kubelet does; one that does not exist is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_logs_of_a_container_waiting_for_its_image_says_why() {
    let client = client().await;
    require_localnode(&client).await;
    require_kubelet_endpoint(&client).await;
    let ns = TestNamespace::new(&client, "ln-logs-wait", &[]).await;
    wait_default_service_account(&client, &ns.name).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    create(
        &pods,
        &pod(
            "nope",
            json!({"name": "app", "image": "example.invalid/nope:1"}),
        ),
    )
    .await;
    wait_for(
        "nope waiting for its image",
        Duration::from_secs(60),
        || async {
            waiting_reason(&pods.get("nope").await.ok()?)
                .filter(|(r, _)| r == "ErrImagePull" || r == "ImagePullBackOff")
        },
    )
    .await;
    let (ok, out, err) = kubectl_logs(&ns.name, &["nope"]).await;
    assert!(
        !ok,
        "kubectl logs of a container that never ran succeeded: {out}"
    );
    assert!(
        err.contains("container \"app\" in pod \"nope\" is waiting to start"),
        "kubectl logs nope: {err}"
    );
    println!("kubectl logs nope: {}", err.trim());
}

fn container_status<'a>(p: &'a Pod, name: &str) -> Option<&'a ContainerStatus> {
    let s = p.status.as_ref()?;
    s.container_statuses
        .iter()
        .flatten()
        .chain(s.init_container_statuses.iter().flatten())
        .find(|c| c.name == name)
}

// ---------------------------------------------------------------------------
// The scorecard

/// Why a scorecard pod cannot finish, if it cannot: a container stuck
/// waiting (image not mapped, bad config), a failed untar, a pod left
/// unscheduled or placed on another node.
async fn stuck(pods: &Api<Pod>, p: &Pod, first_seen: Instant) -> Option<String> {
    let name = p.metadata.name.clone().unwrap_or_default();
    let spec = p.spec.as_ref()?;
    let status = p.status.clone().unwrap_or_default();
    if let Some(node) = spec.node_name.as_deref()
        && node != NODE
    {
        return Some(format!(
            "scorecard pod {name} was scheduled to node {node}, not {NODE}"
        ));
    }
    if spec.node_name.is_none() && first_seen.elapsed() > UNSCHEDULED {
        let why = status
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == "PodScheduled")
            .and_then(|c| c.message.clone())
            .unwrap_or_else(|| "no PodScheduled condition".into());
        return Some(format!(
            "scorecard pod {name} is still unscheduled after {}s: {why}",
            UNSCHEDULED.as_secs()
        ));
    }
    let images: BTreeMap<String, String> = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .map(|c| (c.name.clone(), c.image.clone().unwrap_or_default()))
        .collect();
    for cs in status
        .init_container_statuses
        .iter()
        .flatten()
        .chain(status.container_statuses.iter().flatten())
    {
        let image = images.get(&cs.name).cloned().unwrap_or_default();
        let state = cs.state.clone().unwrap_or_default();
        if let Some(w) = &state.waiting {
            let reason = w.reason.clone().unwrap_or_default();
            if matches!(
                reason.as_str(),
                "ErrImagePull"
                    | "ImagePullBackOff"
                    | "InvalidImageName"
                    | "CreateContainerConfigError"
                    | "CreateContainerError"
                    | "RunContainerError"
            ) {
                return Some(format!(
                    "scorecard pod {name}: container {} (image {image}) cannot run: {reason}: {}",
                    cs.name,
                    w.message.clone().unwrap_or_default()
                ));
            }
        }
        let init = spec
            .init_containers
            .iter()
            .flatten()
            .any(|c| c.name == cs.name);
        if let Some(t) = &state.terminated
            && init
            && t.exit_code != 0
        {
            let log = pods
                .logs(
                    &name,
                    &kube::api::LogParams {
                        container: Some(cs.name.clone()),
                        tail_lines: Some(20),
                        ..Default::default()
                    },
                )
                .await
                .unwrap_or_else(|e| format!("(no log: {e})"));
            return Some(format!(
                "scorecard pod {name}: init container {} (image {image}) failed with exit code {} ({}); its log:\n{log}",
                cs.name,
                t.exit_code,
                t.reason.clone().unwrap_or_default()
            ));
        }
    }
    None
}

/// One row of the result table.
struct Row {
    name: String,
    suite: String,
    state: String,
    errors: Vec<String>,
    log: String,
}

fn rows(list: &Value) -> Vec<Row> {
    let mut out = Vec::new();
    for item in list["items"].as_array().into_iter().flatten() {
        let suite = item["spec"]["labels"]["suite"]
            .as_str()
            .unwrap_or("")
            .to_string();
        for r in item["status"]["results"].as_array().into_iter().flatten() {
            out.push(Row {
                name: r["name"].as_str().unwrap_or("").to_string(),
                suite: suite.clone(),
                state: r["state"].as_str().unwrap_or("").to_string(),
                errors: r["errors"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|e| e.as_str().map(String::from))
                    .collect(),
                log: r["log"].as_str().unwrap_or("").to_string(),
            });
        }
    }
    out
}

fn table(rows: &[Row]) -> String {
    let w = rows.iter().map(|r| r.name.len()).max().unwrap_or(4).max(4);
    let sw = rows.iter().map(|r| r.suite.len()).max().unwrap_or(5).max(5);
    let mut s = format!("{:<w$}  {:<sw$}  STATE\n", "TEST", "SUITE");
    for r in rows {
        s.push_str(&format!("{:<w$}  {:<sw$}  {}\n", r.name, r.suite, r.state));
        for e in &r.errors {
            s.push_str(&format!("{:<w$}  {:<sw$}  error: {e}\n", "", ""));
        }
    }
    s
}

/// One `operator-sdk scorecard ./bundle` run.
struct ScorecardRun {
    exit: std::process::ExitStatus,
    took: Duration,
    rows: Vec<Row>,
    stderr: String,
    /// Test pods seen, with the node each ran on.
    nodes: BTreeSet<String>,
    pods: usize,
}

/// Runs `operator-sdk scorecard ./bundle` in namespace `ns` with `args`,
/// watching its test pods: where they run, and whether one cannot finish
/// (the scorecard itself would only give up after --wait-time, with a bare
/// deadline error).
async fn scorecard(
    client: &kube::Client,
    ns: &str,
    args: &[&str],
    wait: &str,
    deadline: Duration,
) -> ScorecardRun {
    let sdk = tool("operator-sdk");
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let started = Instant::now();
    let mut child = tokio::process::Command::new(&sdk)
        .arg("scorecard")
        .arg(repo_root().join("bundle"))
        .arg("--kubeconfig")
        .arg(kubeconfig_path())
        .args(["--namespace", ns, "--output", "json"])
        .args(["--wait-time", wait])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("running {}: {e}", sdk.display()));
    let mut stdout = child.stdout.take().expect("stdout");
    let mut stderr = child.stderr.take().expect("stderr");
    let out_task = tokio::spawn(async move {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s).await;
        s
    });
    let err_task = tokio::spawn(async move {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s).await;
        s
    });

    let mut seen: BTreeMap<String, (Instant, Option<String>)> = BTreeMap::new();
    let exit = loop {
        if let Some(status) = child.try_wait().expect("waiting for operator-sdk") {
            break status;
        }
        if started.elapsed() > deadline {
            let _ = child.kill().await;
            panic!(
                "operator-sdk scorecard did not finish within {}s; test pods seen: {:?}",
                deadline.as_secs(),
                seen.keys().collect::<Vec<_>>()
            );
        }
        let list = pods
            .list(&ListParams::default().labels("app=scorecard-test"))
            .await
            .map(|l| l.items)
            .unwrap_or_default();
        for p in &list {
            let name = p.metadata.name.clone().unwrap_or_default();
            let node = p.spec.as_ref().and_then(|s| s.node_name.clone());
            let entry = seen.entry(name).or_insert((Instant::now(), None));
            if node.is_some() {
                entry.1 = node;
            }
            if let Some(why) = stuck(&pods, p, entry.0).await {
                let _ = child.kill().await;
                panic!(
                    "the scorecard's test pods cannot run on the local node:\n{why}\n\
                     (image mappings: dev/images.yaml; node log: .dev/localnode/localnode.log)"
                );
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let took = started.elapsed();
    let stdout = out_task.await.unwrap_or_default();
    let stderr = err_task.await.unwrap_or_default();
    let list: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!(
            "operator-sdk scorecard ({exit}) printed no JSON test list ({e}).\nstdout:\n{stdout}\nstderr:\n{stderr}"
        )
    });
    let run = ScorecardRun {
        exit,
        took,
        rows: rows(&list),
        stderr,
        nodes: seen.values().filter_map(|(_, n)| n.clone()).collect(),
        pods: seen.len(),
    };
    println!(
        "operator-sdk scorecard ./bundle {}: {} in {:.1}s ({} test pods, on {:?})\n{}",
        args.join(" "),
        run.exit,
        run.took.as_secs_f64(),
        run.pods,
        run.nodes,
        table(&run.rows)
    );
    run
}

/// Fails with the table and each failed test's log unless every row passed.
fn assert_all_pass(rows: &[Row]) {
    let failed: Vec<&Row> = rows.iter().filter(|r| r.state != "pass").collect();
    assert!(
        failed.is_empty(),
        "scorecard tests did not pass:\n{}\n{}",
        table(rows),
        failed
            .iter()
            .map(|r| format!("--- {} log:\n{}", r.name, r.log))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// `operator-sdk scorecard ./bundle`: the basic and olm suites' six tests
/// run as pods on the local node and all pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scorecard_basic_and_olm_suites_pass_as_pods_on_the_local_node() {
    let client = client().await;
    require_localnode(&client).await;
    require_kubelet_endpoint(&client).await;
    tool("scorecard-test");
    let ns = TestNamespace::new(&client, "scorecard", &[]).await;
    wait_default_service_account(&client, &ns.name).await;

    let run = scorecard(
        &client,
        &ns.name,
        &["--selector", "suite in (basic,olm)"],
        SCORECARD_WAIT,
        OUR_DEADLINE,
    )
    .await;
    assert_suite_ran(
        &run,
        &ns.name,
        olm_common::SCORECARD_TESTS.into_iter().collect(),
    );
}

/// Every row passed, the scorecard ran exactly the tests `want` and exited
/// 0, and each test ran as a pod on the local node (its container logs are
/// in the node's state directory, kept after the scorecard deleted the pods).
fn assert_suite_ran(run: &ScorecardRun, ns: &str, want: BTreeSet<&str>) {
    assert_all_pass(&run.rows);
    let names: BTreeSet<&str> = run.rows.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, want, "the scorecard ran other tests than these");
    assert!(
        run.exit.success(),
        "operator-sdk scorecard exited with {}:\n{}",
        run.exit,
        run.stderr
    );
    assert_eq!(
        run.nodes,
        BTreeSet::from([NODE.to_string()]),
        "the test pods ran elsewhere than {NODE}"
    );
    assert_eq!(
        ran_on_local_node(ns).len(),
        want.len(),
        "expected {} scorecard test pods run by {NODE}",
        want.len(),
    );
}

/// The scorecard test pods of namespace `ns` whose container the local node
/// ran (their logs are kept in its state directory after the pods are gone).
fn ran_on_local_node(ns: &str) -> Vec<String> {
    let state = repo_root().join(".dev/localnode/pods");
    std::fs::read_dir(&state)
        .unwrap_or_else(|e| panic!("reading {}: {e}", state.display()))
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(&format!("{ns}_scorecard-test-")))
        .filter(|n| state.join(n).join("scorecard-test.log").exists())
        .collect()
}

/// The Redis of namespace `ns` not being deleted.
async fn live_redis(client: &kube::Client, ns: &str) -> Vec<String> {
    redis_api(client, ns)
        .list(&ListParams::default())
        .await
        .expect("listing Redis")
        .items
        .into_iter()
        .filter(|r| r.metadata.deletion_timestamp.is_none())
        .filter_map(|r| r.metadata.name)
        .collect()
}

/// The CSV's `capabilities` annotation.
fn csv_capability() -> String {
    let path = repo_root().join("bundle/manifests/redpilot.clusterserviceversion.yaml");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let csv: Value = serde_yaml::from_str(&text).expect("the CSV is YAML");
    csv["metadata"]["annotations"]["capabilities"]
        .as_str()
        .expect("the CSV has no capabilities annotation")
        .to_string()
}

/// Redpilot's own suite (`suite: redpilot`, scorecard/config.yaml): one test
/// per capability level, each run by the scorecard as a pod of the
/// operator's image (`redpilot scorecard-test <test>`; the local node maps
/// the image to this tree's binary) as the ServiceAccount of
/// scorecard/rbac.yaml, against an operator watching the namespace. Every
/// test passes, and the CSV claims no level above the highest whose test,
/// and every lower level's, passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scorecard_redpilot_suite_passes_for_every_level_the_csv_claims() {
    let client = client().await;
    require_localnode(&client).await;
    require_kubelet_endpoint(&client).await;
    let ns = TestNamespace::new(&client, "sc-redpilot", &[]).await;
    let _op = start_operator(&client, OperatorOptions::watching(&[&ns.name])).await;
    let out = kubectl()
        .args(["apply", "--server-side", "-n", &ns.name, "-f"])
        .arg(repo_root().join("scorecard/rbac.yaml"))
        .output()
        .await
        .expect("running kubectl apply");
    assert!(
        out.status.success(),
        "kubectl apply -f scorecard/rbac.yaml: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), &ns.name);
    wait_for(
        "serviceaccount redpilot-scorecard",
        Duration::from_secs(30),
        || async { sas.get_opt("redpilot-scorecard").await.ok().flatten() },
    )
    .await;

    let run = scorecard(
        &client,
        &ns.name,
        &[
            "--selector",
            "suite=redpilot",
            "--service-account",
            "redpilot-scorecard",
        ],
        "600s",
        Duration::from_secs(660),
    )
    .await;
    for r in &run.rows {
        println!("--- {} ({}):\n{}", r.name, r.state, r.log);
    }

    // The CSV claims a level only when its test and every lower one pass.
    let claimed = csv_capability();
    let position = |level: &str| TESTS.iter().position(|t| t.level == level);
    let claimed_at = position(&claimed).unwrap_or_else(|| {
        panic!("the CSV claims {claimed:?}, a level the redpilot scorecard suite has no test for")
    });
    let passed: Vec<&str> = run
        .rows
        .iter()
        .filter(|r| r.state == "pass")
        .map(|r| r.name.as_str())
        .collect();
    let earned = highest_level(&passed);
    assert!(
        earned.and_then(position).is_some_and(|e| e >= claimed_at),
        "the CSV claims {claimed:?} but the scorecard backs only {earned:?}:\n{}",
        table(&run.rows)
    );
    println!("CSV capability {claimed:?}; the scorecard backs {earned:?}");

    assert_suite_ran(&run, &ns.name, TESTS.iter().map(|t| t.name).collect());
    // Each test deleted what it created.
    let left = live_redis(&client, &ns.name).await;
    assert!(
        left.is_empty(),
        "the scorecard tests left Redis behind: {left:?}"
    );
}

/// Each test of the suite, run where no operator watches its namespace,
/// fails within its bound and says which level does not work, what did not
/// happen and where to look: the failure a user sees when Redpilot is not
/// installed for the namespace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scorecard_redpilot_tests_fail_clearly_without_an_operator() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "sc-noop", &[]).await;
    support::operator::install_crds(&client).await;
    let bin = support::operator::operator_binary();
    let runs = TESTS.iter().map(|t| {
        let mut c = tokio::process::Command::new(&bin);
        c.args([
            "scorecard-test",
            t.name,
            "--namespace",
            &ns.name,
            "--timeout-seconds",
            "10",
        ])
        .env("KUBECONFIG", kubeconfig_path())
        .kill_on_drop(true);
        async move { (t, c.output().await) }
    });
    for (t, out) in futures::future::join_all(runs).await {
        let out = out.unwrap_or_else(|e| panic!("running redpilot scorecard-test {}: {e}", t.name));
        let stdout = String::from_utf8_lossy(&out.stdout);
        let v: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| {
            panic!(
                "{} printed no JSON ({e}):\n{stdout}\n{}",
                t.name,
                String::from_utf8_lossy(&out.stderr)
            )
        });
        let r = &v["results"][0];
        println!("{}: {} — {}", t.name, r["state"], r["errors"][0]);
        assert_eq!(r["name"], t.name);
        assert_eq!(r["state"], "fail", "{}: {r}", t.name);
        assert_eq!(out.status.code(), Some(1), "{} exit status", t.name);
        let error = r["errors"][0].as_str().unwrap_or_default();
        assert!(
            error.starts_with(&format!("{}: Redis sc-", t.level))
                && error.contains("Ready did not happen within 10s")
                && error.contains("no operator has reconciled it"),
            "{}: unclear error {error:?}",
            t.name
        );
        assert!(
            r["suggestions"][0]
                .as_str()
                .unwrap_or_default()
                .contains("operator running"),
            "{}: {r}",
            t.name
        );
    }
    // What they created is gone.
    let left = live_redis(&client, &ns.name).await;
    assert!(left.is_empty(), "left behind: {left:?}");
}
