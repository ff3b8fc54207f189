//! Drift repair and the steady state, against the dev cluster with real
//! servers and the API server's audit log:
//! - a StatefulSet scaled by hand, a Service selector edited by hand, a
//!   deleted Service and a deleted ConfigMap are each put back within 5 s;
//!   a user's annotation on the StatefulSet survives every repair; a replica
//!   pod deleted by hand comes back re-wired;
//! - a Ready Redis costs no write per reconcile, and its only reads are
//!   GETs of its two Secrets by name, as the API server counted them
//!   (Secrets are never listed or watched);
//! - the work-queue metrics show Redis waiting behind a single worker, and
//!   an empty queue once the burst is worked off.

mod support;

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use kube::{Api, Client};
use serde_json::json;
use support::audit::{operator_requests, tally};
use support::operator::{
    Operator, OperatorOptions, apply_redis, connect_pod, create_user_secret, kubectl, metric_sum,
    poke, recent_events, redis_api, redis_password, redis_pods, settled_children, start_operator,
    wait_ready,
};
use support::{TestNamespace, client, wait_for};

const READY: Duration = Duration::from_secs(120);
/// What the issue promises for a repair.
const REPAIR_BOUND: Duration = Duration::from_secs(5);

fn run_kubectl(args: &[&str]) {
    let out = kubectl(args);
    assert!(
        out.status.success(),
        "kubectl {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Polls every 100 ms until `check` holds; returns how long it took. Fails
/// past `REPAIR_BOUND` with `what`.
async fn repaired<F, Fut>(what: &str, mut check: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        if check().await {
            return start.elapsed();
        }
        assert!(
            start.elapsed() <= REPAIR_BOUND,
            "{what} was not repaired within {REPAIR_BOUND:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn sts_replicas(client: &Client, ns: &str, name: &str) -> Option<i32> {
    Api::<StatefulSet>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await
        .ok()
        .flatten()
        .and_then(|s| s.spec.replicas)
}

async fn service_selector_role(client: &Client, ns: &str, name: &str) -> Option<String> {
    Api::<Service>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await
        .ok()
        .flatten()?
        .spec?
        .selector?
        .get("redpilot.io/role")
        .cloned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hand_edits_and_deleted_children_are_repaired_within_5s() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "drift", &[]).await;
    let _op = start_operator(&client, OperatorOptions::watching(&[&ns.name])).await;
    apply_redis(
        &client,
        &ns.name,
        "cache",
        json!({"mode": "Replication", "instances": 2}),
    )
    .await;
    wait_ready(&client, &ns.name, "cache", READY).await;

    // A user's annotation, under another field manager: never removed.
    run_kubectl(&[
        "-n",
        &ns.name,
        "annotate",
        "statefulset/cache",
        "team.example.com/owner=payments",
    ]);

    // 1. kubectl scale.
    run_kubectl(&["-n", &ns.name, "scale", "statefulset/cache", "--replicas=1"]);
    let scaled = repaired("the StatefulSet scaled to 1 by hand", || async {
        sts_replicas(&client, &ns.name, "cache").await == Some(2)
    })
    .await;

    // 2. An edited selector: the read-only Service pointed at the primary.
    run_kubectl(&[
        "-n",
        &ns.name,
        "patch",
        "service/cache-ro",
        "--type=merge",
        "-p",
        r#"{"spec":{"selector":{"redpilot.io/role":"primary"}}}"#,
    ]);
    let selector = repaired("the cache-ro selector edited by hand", || async {
        service_selector_role(&client, &ns.name, "cache-ro")
            .await
            .as_deref()
            == Some("replica")
    })
    .await;

    // 3. A deleted Service.
    run_kubectl(&["-n", &ns.name, "delete", "service/cache", "--wait=false"]);
    let service = repaired("the deleted read-write Service", || async {
        service_selector_role(&client, &ns.name, "cache")
            .await
            .as_deref()
            == Some("primary")
    })
    .await;

    // 4. A deleted ConfigMap (redis.conf and the current primary).
    run_kubectl(&[
        "-n",
        &ns.name,
        "delete",
        "configmap/cache-config",
        "--wait=false",
    ]);
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    let config = repaired("the deleted ConfigMap", || async {
        cms.get_opt("cache-config")
            .await
            .ok()
            .flatten()
            .and_then(|c| c.data)
            .is_some_and(|d| {
                d.contains_key("redis.conf")
                    && d.get("primary").is_some_and(|p| !p.trim().is_empty())
            })
    })
    .await;

    let sts = Api::<StatefulSet>::namespaced(client.clone(), &ns.name)
        .get("cache")
        .await
        .expect("statefulset");
    assert_eq!(
        sts.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("team.example.com/owner"))
            .map(String::as_str),
        Some("payments"),
        "the user's annotation survived the repairs"
    );
    let events = recent_events(&client, &ns.name, 50).await;
    assert!(
        events.contains("DriftRepaired"),
        "a DriftRepaired event is recorded; events:\n{events}"
    );

    // 5. A replica pod deleted by hand: re-created by the StatefulSet and
    // re-wired by the operator.
    // The pod step 1 removed is back, but labelled a replica only once the
    // operator has wired it: wait for one.
    let replica = wait_for("a pod labelled a replica", READY, || async {
        redis_pods(&client, &ns.name, "cache")
            .await
            .iter()
            .find(|(_, p)| {
                p.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get("redpilot.io/role"))
                    .map(String::as_str)
                    == Some("replica")
            })
            .map(|(n, p)| (n.clone(), p.metadata.uid.clone()))
    })
    .await;
    run_kubectl(&["-n", &ns.name, "delete", "pod", &replica.0, "--wait=false"]);
    wait_for(
        "the deleted replica pod to be re-created",
        READY,
        || async {
            let p = redis_pods(&client, &ns.name, "cache").await;
            (p.get(&replica.0).and_then(|p| p.metadata.uid.clone()) != replica.1
                && p.contains_key(&replica.0))
            .then_some(())
        },
    )
    .await;
    let back = wait_ready(&client, &ns.name, "cache", READY).await;
    let status = back.status.expect("status");
    let linked = status
        .instances
        .iter()
        .find(|i| i.name == replica.0)
        .and_then(|i| i.link_up);
    assert_eq!(linked, Some(true), "the new replica replicates: {status:?}");

    println!(
        "drift repaired: scale {:.2}s, selector {:.2}s, deleted Service {:.2}s, deleted ConfigMap {:.2}s",
        scaled.as_secs_f64(),
        selector.as_secs_f64(),
        service.as_secs_f64(),
        config.as_secs_f64()
    );
}

/// Pokes each Redis `n` times and returns the reconciles the operator made
/// in that window, with the window's bounds.
async fn poke_window(
    client: &Client,
    op: &Operator,
    ns: &str,
    names: &[&str],
    n: usize,
) -> (
    f64,
    chrono::DateTime<chrono::Utc>,
    chrono::DateTime<chrono::Utc>,
) {
    let before = op.counters().await.reconciles;
    let from = chrono::Utc::now();
    for i in 0..n {
        for name in names {
            poke(client, ns, name, 100 + i).await;
        }
        tokio::time::sleep(Duration::from_millis(1500)).await;
    }
    let want = before + (n * names.len()) as f64;
    wait_for(
        "the operator to reconcile every poke",
        Duration::from_secs(30),
        || async { (op.counters().await.reconciles >= want).then_some(()) },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let to = chrono::Utc::now();
    (op.counters().await.reconciles - before, from, to)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steady_state_costs_no_write_and_reads_only_its_secrets_by_name() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "steady", &[]).await;
    let op = start_operator(&client, OperatorOptions::watching(&[&ns.name])).await;
    // One Redis with a generated password, one with a user-named Secret.
    create_user_secret(&client, &ns.name, "app-password", "a-user-chosen-password").await;
    apply_redis(
        &client,
        &ns.name,
        "gen",
        json!({"mode": "Replication", "instances": 2}),
    )
    .await;
    apply_redis(
        &client,
        &ns.name,
        "own",
        json!({"mode": "Standalone", "auth": {"secretName": "app-password"}}),
    )
    .await;
    wait_ready(&client, &ns.name, "gen", READY).await;
    wait_ready(&client, &ns.name, "own", READY).await;
    for name in ["gen", "own"] {
        settled_children(
            &client,
            &ns.name,
            name,
            Duration::from_secs(4),
            Duration::from_secs(60),
        )
        .await;
    }

    let (reconciles, from, to) = poke_window(&client, &op, &ns.name, &["gen", "own"], 5).await;
    let requests = operator_requests(&ns.name, from, to);
    let writes: Vec<_> = requests.iter().filter(|r| r.is_write()).collect();
    let reads: Vec<_> = requests.iter().filter(|r| r.is_read()).collect();
    println!(
        "steady state (API server audit log): {reconciles} reconciles, {} reads, {} writes; {:?}",
        reads.len(),
        writes.len(),
        tally(&requests)
    );
    assert!(reconciles >= 10.0, "every poke reconciled: {reconciles}");
    assert!(
        writes.is_empty(),
        "a Ready Redis is reconciled without writes; the API server saw {:?}",
        tally(&requests)
    );
    // Secrets have no watch cache (the operator may not list or watch
    // them): each reconcile reads the two a Redis uses, by name: its
    // server-auth Secret and its password Secret (generated or the user's).
    let its_secrets = [
        "gen-auth",
        "gen-server-auth",
        "app-password",
        "own-server-auth",
    ];
    assert!(
        reads.iter().all(|r| r.verb == "get"
            && r.resource == "secrets"
            && its_secrets.contains(&r.name.as_str())),
        "the only reads are GETs of the Redis' own Secrets by name: {:?}",
        tally(&requests)
    );
    assert!(
        reads.len() as f64 <= 2.0 * reconciles,
        "at most two reads per reconcile: {} reads for {reconciles} reconciles ({:?})",
        reads.len(),
        tally(&requests)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_redis_backs_off_without_delaying_the_others() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "backoff", &[]).await;
    let op = start_operator(&client, OperatorOptions::watching(&[&ns.name])).await;
    // Its pod goes to the fake node: Running, with an address that leads
    // nowhere (dev/cluster.sh blackholes the fake node's pod range).
    apply_redis(
        &client,
        &ns.name,
        "ghost",
        json!({"mode": "Standalone", "podTemplate": {
            "nodeSelector": {"type": "kwok"},
            "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}]
        }}),
    )
    .await;
    wait_for(
        "the unreachable Redis's pod to run on the fake node",
        READY,
        || async {
            let pods = redis_pods(&client, &ns.name, "ghost").await;
            pods.get("ghost-0")?
                .status
                .as_ref()?
                .pod_ip
                .clone()
                .filter(|ip| !ip.is_empty())
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(20)).await;
    let before = op.counters().await.reconciles;
    tokio::time::sleep(Duration::from_secs(30)).await;
    let reconciles = op.counters().await.reconciles - before;
    let ghost = redis_api(&client, &ns.name)
        .get("ghost")
        .await
        .expect("ghost");
    assert!(
        !support::operator::is_ready(&ghost),
        "an unreachable Redis is not Ready"
    );
    let degraded = ghost
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Degraded"))
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()));
    assert!(
        matches!(&degraded, Some((s, r, m)) if s == "True" && r == "InstancesUnreachable" && m.contains("ghost-0")),
        "the status says which instance does not answer: {degraded:?}"
    );

    // Another Redis, on the real node, is not held up by the first.
    let start = Instant::now();
    apply_redis(&client, &ns.name, "real", json!({"mode": "Standalone"})).await;
    wait_ready(&client, &ns.name, "real", Duration::from_secs(30)).await;
    let real_ready = start.elapsed();
    println!(
        "backoff: the unreachable Redis was reconciled {reconciles} times in 30 s; a reachable one was Ready {:.1}s after it was applied",
        real_ready.as_secs_f64()
    );
    // Without the backoff it is reconciled every 2 s: 15 times in the
    // window. With it: waits of 16 and 32 s by then.
    assert!(
        reconciles <= 5.0,
        "{reconciles} reconciles in 30 s: the unreachable Redis is retried in a hot loop"
    );
}

/// The work queue, measured: twenty Redis applied at once to an operator
/// with one worker wait in its queue (the depth and the longest wait say so
/// while it happens); once the burst is worked off nothing waits, the
/// periodic requeues are counted as scheduled, and every reconcile that
/// ran was counted in the wait histogram.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_work_queue_shows_what_waits_behind_one_worker() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "queue", &[]).await;
    let mut opts = OperatorOptions::watching(&[&ns.name]);
    opts.env
        .push(("MAX_CONCURRENT_RECONCILES".into(), "1".into()));
    let op = start_operator(&client, opts).await;
    let on_fake = json!({
        "nodeSelector": {"type": "kwok"},
        "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}]
    });
    // Twenty: with ten, the tenth waited 0.48 s once (reconciles of about
    // 50 ms each), under the half second asked for below.
    let n = 20;
    let t0 = Instant::now();
    futures::future::join_all((0..n).map(|i| {
        let (client, ns, on_fake) = (client.clone(), ns.name.clone(), on_fake.clone());
        async move {
            apply_redis(
                &client,
                &ns,
                &format!("q{i}"),
                json!({"mode": "Standalone", "podTemplate": on_fake}),
            )
            .await
        }
    }))
    .await;
    // The burst, scraped every 100 ms for 20 s.
    let (mut max_depth, mut max_oldest) = (0.0f64, 0.0f64);
    while t0.elapsed() < Duration::from_secs(20) {
        if let Some(page) = op.metrics().await {
            max_depth = max_depth.max(metric_sum(&page, "redpilot_workqueue_depth").unwrap_or(0.0));
            max_oldest = max_oldest
                .max(metric_sum(&page, "redpilot_workqueue_oldest_wait_seconds").unwrap_or(0.0));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!(
        "work queue: {n} Redis applied at once, one worker: depth up to {max_depth}, \
         longest wait {max_oldest:.2} s"
    );
    assert!(
        max_depth >= (n / 2) as f64,
        "with one worker, most of {n} Redis applied at once wait: depth reached only {max_depth}"
    );
    assert!(
        max_oldest >= 0.5,
        "the longest wait shows the backlog: {max_oldest:.3} s"
    );
    // Worked off: nothing waits; each Redis has a requeue scheduled.
    let settled = wait_for(
        "the work queue to drain with every Redis scheduled",
        Duration::from_secs(180),
        || async {
            let page = op.metrics().await?;
            let depth = metric_sum(&page, "redpilot_workqueue_depth")?;
            let scheduled = metric_sum(&page, "redpilot_workqueue_scheduled")?;
            (depth == 0.0 && scheduled >= n as f64).then_some(page)
        },
    )
    .await;
    // Every reconcile that started was due (a trigger or a requeue), so
    // the wait histogram counted each; the ledger missed none.
    let started = metric_sum(&settled, "redpilot_workqueue_wait_seconds_count").unwrap_or(0.0);
    let finished = metric_sum(&settled, "redpilot_reconciliations_total").unwrap_or(0.0);
    let running = metric_sum(&settled, "redpilot_reconciles_in_flight").unwrap_or(0.0);
    println!(
        "work queue: drained after {:.1} s; {started} waits counted, {finished} reconciles ended, {running} running",
        t0.elapsed().as_secs_f64()
    );
    assert!(finished >= n as f64, "{finished} reconciles for {n} Redis");
    assert!(
        (started - finished - running).abs() < 1.0,
        "every reconcile started from a due entry: {started} waits counted, {finished} ended, {running} running"
    );
}

/// The role and link state `pod` reports (`None` when it does not answer).
async fn role_of(
    client: &Client,
    ns: &str,
    pod: &str,
    password: &str,
) -> Option<(
    redpilot::redis::info::Role,
    Option<redpilot::redis::info::LinkStatus>,
)> {
    let mut node = connect_pod(client, ns, pod, password).await.ok()?;
    let info = node.info().await.ok()?;
    Some((info.replication.role?, info.replication.link_status))
}

/// A calm Replication Redis that nothing changes is looked at lightly: its
/// periodic pass re-reads only its Secrets' versions, not the servers. A
/// change still gets a full pass at once: a replica detached by hand (no
/// pod, child or Secret changes) is wired back as soon as the failure
/// monitor's calm probe misses it, not at the next full pass minutes
/// later; and a new password in the generated Secret starts a rotation at
/// the next periodic pass, within a minute, as with no light passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_calm_redis_is_looked_at_lightly_and_still_acts_on_a_change() {
    use redpilot::redis::info::{LinkStatus, Role};
    let client = client().await;
    let ns = TestNamespace::new(&client, "light", &[]).await;
    let op = start_operator(&client, OperatorOptions::watching(&[&ns.name])).await;
    apply_redis(
        &client,
        &ns.name,
        "calm",
        json!({"mode": "Replication", "instances": 3}),
    )
    .await;
    let ready = wait_ready(&client, &ns.name, "calm", READY).await;
    let t0 = Instant::now();
    let light = || async {
        op.metric_sum("redpilot_light_passes_total")
            .await
            .unwrap_or(0.0)
    };
    wait_for("a light pass", Duration::from_secs(200), || async {
        (light().await >= 1.0).then_some(())
    })
    .await;
    println!(
        "first light pass {:.1} s after Ready",
        t0.elapsed().as_secs_f64()
    );

    // 1. A replica detached by hand: it answers as a primary (the fault
    //    happened), then the operator wires it back.
    let primary = ready
        .status
        .as_ref()
        .and_then(|s| s.primary.clone())
        .expect("a primary in the status");
    let replica = redis_pods(&client, &ns.name, "calm")
        .await
        .into_keys()
        .find(|p| *p != primary)
        .expect("a replica pod");
    let pw = redis_password(&client, &ns.name, "calm").await;
    let mut node = connect_pod(&client, &ns.name, &replica, &pw)
        .await
        .expect("connect to the replica");
    let light_before = light().await;
    let cut = Instant::now();
    let _: String = node
        .query("REPLICAOF", redis::cmd("REPLICAOF").arg("NO").arg("ONE"))
        .await
        .expect("REPLICAOF NO ONE");
    let (role, _) = role_of(&client, &ns.name, &replica, &pw)
        .await
        .expect("the replica answers");
    assert_eq!(role, Role::Primary, "{replica} detached by hand");
    wait_for(
        "the detached replica wired back",
        Duration::from_secs(120),
        || async {
            match role_of(&client, &ns.name, &replica, &pw).await {
                Some((Role::Replica, Some(LinkStatus::Up))) => Some(()),
                _ => None,
            }
        },
    )
    .await;
    let back = cut.elapsed();
    println!(
        "{replica} detached by hand, replica again {:.1} s later ({} light passes meanwhile)",
        back.as_secs_f64(),
        light().await - light_before
    );
    assert!(
        back < Duration::from_secs(20),
        "a replica detached by hand is wired back within the monitor's calm probe and a \
         pass, not at the next full pass: {back:?}"
    );

    // 2. A new password in the generated Secret, nothing else touched: the
    //    next periodic pass (light or not) sees the Secret's new version.
    wait_for("light passes again", Duration::from_secs(200), || async {
        (light().await >= light_before + 1.0).then_some(())
    })
    .await;
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(client.clone(), &ns.name);
    let changed = Instant::now();
    secrets
        .patch(
            "calm-auth",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"stringData": {"password": "a-new-password"}})),
        )
        .await
        .expect("a new password in calm-auth");
    wait_for(
        "the rotation to start",
        Duration::from_secs(120),
        || async {
            recent_events(&client, &ns.name, 80)
                .await
                .contains("PasswordRotating")
                .then_some(())
        },
    )
    .await;
    let noticed = changed.elapsed();
    println!(
        "new password noticed {:.1} s after the Secret changed",
        noticed.as_secs_f64()
    );
    assert!(
        noticed < Duration::from_secs(70),
        "a changed Secret is noticed within a minute: {noticed:?}"
    );
    wait_ready(&client, &ns.name, "calm", READY).await;
}
