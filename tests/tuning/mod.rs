//! Tuning advice on the dev cluster: the operator looks at a Ready Redis's
//! servers every `--tuning-interval-seconds` (3 s here) and reports what it
//! finds in `status.insights`, the `Tuned` condition, `TuningAdvice` events,
//! the metric `redpilot_redis_findings` and `kubectl redpilot advise`.
//!
//! The scenario: a Replication Redis with `maxclients 30` in `spec.config`.
//! At first the only finding is informational (the latency monitor is off):
//! Tuned. Idle clients pile up on the primary until 26 or more of 30 are
//! connected: `clients-near-max` (warning), Tuned False, the event and the
//! metric. The operator is killed and a new one started: the finding stands
//! (same `since`, no clearing). The `kubectl patch` the plugin prints is run
//! as printed: maxclients doubles live, the finding clears.

//!
//! A Cluster Redis with a big hash in each of its three shards: each is
//! reported, found on a server of its own shard.
//!
//! It runs in the `operator_backup` binary, beside that suite's tests,
//! whose longest waits minutes on a schedule: the scenarios cost no time
//! there.

use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::operator::{
    OperatorOptions, apply_redis, connect_pod, info_u64, metric_sum, pod_ip, recent_events,
    redis_api, redis_password, redis_pods, start_operator, wait_ready,
};
use crate::support::{TestNamespace, client, kubeconfig_path, repo_root, wait_for};
use redpilot::api::v1alpha1::{Insight, Redis};
use serde_json::json;

const READY: Duration = Duration::from_secs(180);

fn plugin(args: &[&str]) -> String {
    let (ok, text) = crate::support::kubectl_redpilot(args);
    assert!(ok, "{text}");
    text
}

fn tuned(r: &Redis) -> Option<(String, String)> {
    r.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == "Tuned")
        .map(|c| (c.status.clone(), c.reason.clone()))
}

fn finding<'a>(r: &'a Redis, rule: &str) -> Option<&'a Insight> {
    r.status.as_ref()?.insights.iter().find(|i| i.rule == rule)
}

/// An operator for `ns` that looks at the servers every 3 s.
fn looking_every_3s(ns: &str) -> OperatorOptions {
    let mut opts = OperatorOptions::watching(&[ns]);
    opts.env
        .push(("REDPILOT_TUNING_INTERVAL_SECONDS".into(), "3".into()));
    opts
}

#[tokio::test]
async fn tuning_advice_appears_survives_an_operator_crash_and_clears_with_the_advised_change() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "op-tuning", &[]).await;
    let opts = looking_every_3s(&ns.name);
    let mut op = start_operator(&client, opts.clone()).await;
    apply_redis(
        &client,
        &ns.name,
        "cache",
        json!({
            "mode": "Replication",
            "instances": 2,
            "storage": {"size": "64Mi"},
            "config": {"maxclients": "30"},
        }),
    )
    .await;
    wait_ready(&client, &ns.name, "cache", READY).await;
    let api = redis_api(&client, &ns.name);

    // 1. Only an informational finding: Tuned.
    let r = wait_for("the first look", Duration::from_secs(60), || async {
        let r = api.get("cache").await.ok()?;
        (tuned(&r).is_some() && finding(&r, "latency-monitor-off").is_some()).then_some(r)
    })
    .await;
    assert_eq!(
        tuned(&r),
        Some(("True".into(), "NoWarnings".into())),
        "{:?}",
        r.status.as_ref().map(|s| &s.insights)
    );
    let info = finding(&r, "latency-monitor-off").expect("finding");
    assert_eq!(info.severity, "info");
    assert_eq!(
        info.config_key.as_deref(),
        Some("latency-monitor-threshold")
    );

    // 2. Idle clients on the primary: 26 of 30 or more.
    let primary = r
        .status
        .as_ref()
        .and_then(|s| s.primary.clone())
        .expect("primary");
    let password = redis_password(&client, &ns.name, "cache").await;
    let mut node = connect_pod(&client, &ns.name, &primary, &password)
        .await
        .expect("connect to the primary");
    let connected = info_u64(&mut node, "clients", "connected_clients").await;
    let ip = pod_ip(&client, &ns.name, &primary).await;
    // Other clients (the operator's looks, the metrics sidecar) come and
    // go: open idle ones until 26 are counted (never past maxclients).
    let mut idle: Vec<TcpStream> = Vec::new();
    let mut now = connected;
    while now < 26 && idle.len() < 28 {
        for _ in now..26 {
            idle.push(TcpStream::connect((ip.as_str(), 6379)).expect("idle client"));
        }
        now = info_u64(&mut node, "clients", "connected_clients").await;
    }
    println!(
        "{connected} clients connected, {} idle ones opened: {now} of 30",
        idle.len()
    );
    assert!(now >= 26, "{now}");
    let r = wait_for("clients-near-max", Duration::from_secs(60), || async {
        let r = api.get("cache").await.ok()?;
        finding(&r, "clients-near-max").is_some().then_some(r)
    })
    .await;
    let warn = finding(&r, "clients-near-max").expect("finding").clone();
    println!("finding: {warn:?}");
    assert_eq!(warn.instance, primary);
    assert_eq!(warn.severity, "warning");
    assert!(
        warn.evidence.contains("of maxclients 30"),
        "{}",
        warn.evidence
    );
    assert_eq!(
        (warn.config_key.as_deref(), warn.config_value.as_deref()),
        (Some("maxclients"), Some("60"))
    );
    assert_eq!(tuned(&r), Some(("False".into(), "AdviceStands".into())));
    let events = recent_events(&client, &ns.name, 40).await;
    assert!(
        events.contains("TuningAdvice") && events.contains("clients-near-max on"),
        "{events}"
    );
    let page = op.metrics().await.expect("metrics");
    let line = page
        .lines()
        .find(|l| l.starts_with("redpilot_redis_findings{") && l.contains("clients-near-max"))
        .unwrap_or_else(|| panic!("no findings series:\n{page}"));
    println!("{line}");
    let value: f64 = line
        .rsplit(' ')
        .next()
        .and_then(|v| v.parse().ok())
        .expect("a value");
    assert!(
        line.contains("severity=\"warning\"") && value == 1.0,
        "{line}"
    );
    assert_eq!(
        metric_sum(&page, "redpilot_redis_findings").map(|v| v >= 1.0),
        Some(true)
    );

    // 3. The operator crashes; the next one keeps the finding as it was.
    op.kill();
    let mut op = start_operator(&client, opts).await;
    // Its first pass looks (it remembers nothing): the finding is compared
    // once the new operator has looked at every server (its own count of
    // looks; it watches this namespace only) and written a pass after.
    let servers = redis_pods(&client, &ns.name, "cache").await.len();
    let reconciles_at_look = wait_for(
        "the new operator to look at every server",
        Duration::from_secs(60),
        || async {
            let page = op.metrics().await?;
            let ok = page
                .lines()
                .find(|l| l.starts_with("redpilot_tuning_looks_total{result=\"ok\"}"))?
                .rsplit(' ')
                .next()?
                .parse::<f64>()
                .ok()?;
            (ok >= servers as f64).then_some(metric_sum(&page, "redpilot_reconciliations_total"))
        },
    )
    .await
    .unwrap_or(0.0);
    wait_for(
        "a pass of the new operator after its look",
        Duration::from_secs(60),
        || async { (op.counters().await.reconciles > reconciles_at_look).then_some(()) },
    )
    .await;
    let r = api.get("cache").await.expect("redis");
    let kept = finding(&r, "clients-near-max").expect("the finding stands after a restart");
    assert_eq!(kept.since, warn.since);
    let events = recent_events(&client, &ns.name, 40).await;
    assert!(!events.contains("TuningAdviceCleared"), "{events}");

    // 4. The change the plugin prints, run as printed.
    let text = plugin(&["advise", "cache", "-n", &ns.name]);
    assert!(text.contains("WARNING  clients-near-max on"), "{text}");
    let apply = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("apply:  kubectl "))
        .find(|l| l.contains("maxclients"))
        .expect("an apply line for maxclients");
    // `kubectl patch redis cache -n <ns> --type merge -p '<json>'`
    let (head, patch) = apply.split_once(" -p '").expect("a -p argument");
    let mut args: Vec<&str> = head.split_whitespace().collect();
    args.push("-p");
    args.push(patch.trim_end_matches('\''));
    let out = Command::new(repo_root().join("bin/kubectl"))
        .env("KUBECONFIG", kubeconfig_path())
        .args(&args)
        .output()
        .expect("kubectl patch");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r = wait_for("the finding cleared", Duration::from_secs(90), || async {
        let r = api.get("cache").await.ok()?;
        finding(&r, "clients-near-max").is_none().then_some(r)
    })
    .await;
    assert_eq!(tuned(&r).map(|t| t.0), Some("True".into()));
    let max: Vec<String> = node
        .query("CONFIG", redis::cmd("CONFIG").arg("GET").arg("maxclients"))
        .await
        .expect("CONFIG GET");
    assert_eq!(max.get(1).map(String::as_str), Some("60"), "{max:?}");
    println!(
        "maxclients now 60, {} idle clients still connected",
        idle.len()
    );
    let events = recent_events(&client, &ns.name, 60).await;
    assert!(events.contains("TuningAdviceCleared"), "{events}");
    // The series are computed at each scrape from the operator's watch
    // cache, which follows the status write by its watch event.
    let t = Instant::now();
    let standing = |page: &str| {
        page.lines()
            .any(|l| l.starts_with("redpilot_redis_findings{") && l.contains("clients-near-max"))
    };
    wait_for(
        "the findings series gone",
        Duration::from_secs(10),
        || async { op.metrics().await.filter(|p| !standing(p)) },
    )
    .await;
    println!(
        "findings series gone {} ms after the status showed the finding cleared",
        t.elapsed().as_millis()
    );
    drop(idle);
    op.kill();
}

/// `spec.tuning.apply`: the operator sets what a listed rule advises, live
/// and in redis.conf, records it with the evidence before and the finding
/// gone after; a pod made anew boots with it; a rule whose advice would
/// change what the application sees is refused at admission.
#[tokio::test]
async fn spec_tuning_applies_the_advice_live_and_a_new_pod_boots_with_it() {
    use crate::support::operator::{config_get, kill_9, pod_uids, redis_pods, server_pid};
    use k8s_openapi::api::core::v1::{ConfigMap, Pod};
    use kube::Api;
    use kube::api::{DeleteParams, Patch, PatchParams};

    let client = client().await;
    let ns = TestNamespace::new(&client, "op-tuning-apply", &[]).await;
    let _op = start_operator(&client, looking_every_3s(&ns.name)).await;
    let api = redis_api(&client, &ns.name);

    // Admission: a policy change is not the operator's to make.
    let bad = json!({
        "apiVersion": "redpilot.io/v1alpha1", "kind": "Redis",
        "metadata": {"name": "cache", "namespace": ns.name},
        "spec": {"mode": "Replication", "instances": 2,
                 "tuning": {"apply": ["volatile-without-ttl"]}},
    });
    let err = api
        .patch("cache", &PatchParams::apply("test"), &Patch::Apply(&bad))
        .await
        .expect_err("an unsupported rule is refused");
    println!("refused: {err}");
    assert!(
        err.to_string().contains("spec.tuning.apply"),
        "the error names the field: {err}"
    );

    apply_redis(
        &client,
        &ns.name,
        "cache",
        json!({
            "mode": "Replication",
            "instances": 2,
            "storage": {"size": "64Mi"},
            "tuning": {"apply": ["latency-monitor-off"]},
        }),
    )
    .await;
    wait_ready(&client, &ns.name, "cache", READY).await;
    let uids = pod_uids(&client, &ns.name, "cache").await;

    let r = wait_for(
        "the monitor's threshold applied and the finding gone",
        Duration::from_secs(90),
        || async {
            let r = api.get("cache").await.ok()?;
            let t = r.status.as_ref()?.tuning.as_ref()?;
            (t.applied.len() == 1 && t.applied[0].state == "Cleared").then_some(r)
        },
    )
    .await;
    let st = r.status.as_ref().expect("status");
    let a = &st.tuning.as_ref().expect("tuning").applied[0];
    println!("applied: {a:?}");
    assert_eq!(
        (
            a.rule.as_str(),
            a.key.as_str(),
            a.from.as_str(),
            a.to.as_str()
        ),
        (
            "latency-monitor-off",
            "latency-monitor-threshold",
            "0",
            "100"
        )
    );
    assert!(
        a.before.contains("latency-monitor-threshold is 0"),
        "{}",
        a.before
    );
    assert!(
        !st.insights.iter().any(|i| i.rule == "latency-monitor-off"),
        "{:?}",
        st.insights
    );
    let password = redis_password(&client, &ns.name, "cache").await;
    for pod in uids.keys() {
        let mut n = connect_pod(&client, &ns.name, pod, &password)
            .await
            .expect("connect");
        assert_eq!(
            config_get(&mut n, "latency-monitor-threshold")
                .await
                .as_deref(),
            Some("100"),
            "{pod}"
        );
    }
    // Live: no pod was made anew or restarted.
    assert_eq!(pod_uids(&client, &ns.name, "cache").await, uids);
    for (name, p) in redis_pods(&client, &ns.name, "cache").await {
        let restarts: i32 = p
            .status
            .and_then(|s| s.container_statuses)
            .map(|cs| cs.iter().map(|c| c.restart_count).sum())
            .unwrap_or(0);
        assert_eq!(restarts, 0, "{name}");
    }
    let conf = Api::<ConfigMap>::namespaced(client.clone(), &ns.name)
        .get("cache-config")
        .await
        .expect("ConfigMap")
        .data
        .and_then(|d| d.get("redis.conf").cloned())
        .expect("redis.conf");
    assert!(conf.contains("\nlatency-monitor-threshold 100\n"), "{conf}");
    let events = recent_events(&client, &ns.name, 60).await;
    for reason in ["TuningApplied", "ConfigApplied", "TuningAdviceCleared"] {
        assert!(events.contains(reason), "{reason}: {events}");
    }

    let replica = uids
        .keys()
        .find(|p| Some(p.as_str()) != st.primary.as_deref())
        .expect("a replica")
        .clone();

    // The replica's server killed in place (kill -9): it comes back, the
    // operator sets the applied value on it again (its mounted redis.conf
    // may be older than the ConfigMap: the kubelet refreshes mounted
    // ConfigMaps on its own schedule), and over the next looks the
    // finding stays gone and nothing is recorded as applied again.
    let mut n = connect_pod(&client, &ns.name, &replica, &password)
        .await
        .expect("connect");
    let pid = server_pid(&mut n).await;
    kill_9(pid);
    let back = wait_for(
        "the killed server back in place",
        Duration::from_secs(90),
        || async {
            let mut n = connect_pod(&client, &ns.name, &replica, &password)
                .await
                .ok()?;
            let now = server_pid(&mut n).await;
            (now != pid).then_some(n)
        },
    )
    .await;
    let restarted = Instant::now();
    drop(back);
    wait_for(
        "the applied setting back on the restarted server",
        Duration::from_secs(30),
        || async {
            let mut n = connect_pod(&client, &ns.name, &replica, &password)
                .await
                .ok()?;
            (config_get(&mut n, "latency-monitor-threshold")
                .await
                .as_deref()
                == Some("100"))
            .then_some(())
        },
    )
    .await;
    println!(
        "kill -9: the applied setting was back {:.1} s after the server answered again",
        restarted.elapsed().as_secs_f64()
    );
    assert_eq!(
        pod_uids(&client, &ns.name, "cache").await,
        uids,
        "restarted in place, not made anew"
    );
    wait_ready(&client, &ns.name, "cache", READY).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let r = api.get("cache").await.expect("redis");
    let st = r.status.as_ref().expect("status");
    assert!(
        !st.insights.iter().any(|i| i.rule == "latency-monitor-off"),
        "after the restart: {:?}",
        st.insights
    );
    let applied = &st.tuning.as_ref().expect("tuning").applied;
    assert!(
        applied.len() == 1 && applied[0].state == "Cleared",
        "after the restart, nothing applied again: {applied:?}"
    );

    // A pod made anew boots with the applied setting.
    Api::<Pod>::namespaced(client.clone(), &ns.name)
        .delete(&replica, &DeleteParams::default())
        .await
        .expect("delete the replica's pod");
    wait_for(
        "the replica's new pod",
        Duration::from_secs(120),
        || async {
            let now = pod_uids(&client, &ns.name, "cache").await;
            (now.get(&replica)
                .is_some_and(|u| Some(u) != uids.get(&replica)))
            .then_some(())
        },
    )
    .await;
    wait_ready(&client, &ns.name, "cache", READY).await;
    // The status may still say Ready from before the deletion: wait for
    // the new server to answer.
    let mut n = wait_for(
        "the new pod's server to answer",
        Duration::from_secs(60),
        || async {
            connect_pod(&client, &ns.name, &replica, &password)
                .await
                .ok()
        },
    )
    .await;
    assert_eq!(
        config_get(&mut n, "latency-monitor-threshold")
            .await
            .as_deref(),
        Some("100")
    );
    let r = api.get("cache").await.expect("redis");
    let applied = &r
        .status
        .as_ref()
        .and_then(|s| s.tuning.clone())
        .expect("tuning")
        .applied;
    assert_eq!(applied.len(), 1, "nothing applied twice: {applied:?}");
}

/// Cluster mode: keys are sampled in every shard, not in one. A big hash
/// is written into each of the three shards (on its primary, by a key the
/// shard owns); each is reported, from a server of its own shard.
#[tokio::test]
async fn a_cluster_big_key_is_found_in_every_shard() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "op-tuning-cluster", &[]).await;
    let _op = start_operator(&client, looking_every_3s(&ns.name)).await;
    apply_redis(
        &client,
        &ns.name,
        "cache",
        json!({"mode": "Cluster", "shards": 3, "instances": 2, "engine": "Valkey", "version": "8.1",
               "storage": {"size": "64Mi"}}),
    )
    .await;
    let r = wait_ready(&client, &ns.name, "cache", READY).await;
    let password = redis_password(&client, &ns.name, "cache").await;
    let st = r.status.clone().expect("status");
    let mut keys = Vec::new();
    for (i, shard) in st.shards.iter().enumerate() {
        let primary = shard.primary.clone().expect("a primary per shard");
        let mut n = connect_pod(&client, &ns.name, &primary, &password)
            .await
            .expect("connect");
        // The first key of the form big:<n> this shard owns (another
        // shard's key is answered with MOVED).
        let mut key = None;
        for k in 0..1000 {
            let k = format!("big:{k}");
            let set: Result<i64, _> = n
                .query("HSET", redis::cmd("HSET").arg(&k).arg("f").arg("v"))
                .await;
            if set.is_ok() {
                key = Some(k);
                break;
            }
        }
        let key = key.expect("a key of this shard");
        // 18 MiB of fields (the rule's threshold is 16 MiB).
        let value = "x".repeat(1024);
        for chunk in 0..18 {
            let mut p = redis::pipe();
            let cmd = p.cmd("HSET").arg(&key);
            for f in 0..1024 {
                cmd.arg(format!("f{chunk}-{f}")).arg(&value);
            }
            n.pipeline::<()>("HSET", p.ignore())
                .await
                .expect("filling the hash");
        }
        println!("shard {i}: {key} (18 MiB) on {primary}");
        keys.push((i, key));
    }
    let r = wait_for(
        "a big-keys finding from every shard",
        Duration::from_secs(120),
        || async {
            let r = redis_api(&client, &ns.name).get("cache").await.ok()?;
            let found = r
                .status
                .as_ref()?
                .insights
                .iter()
                .filter(|i| i.rule == "big-keys")
                .count();
            (found >= 3).then_some(r)
        },
    )
    .await;
    let st = r.status.expect("status");
    for (i, key) in &keys {
        let own = format!("cache-s{i}-");
        let f = st
            .insights
            .iter()
            .find(|f| f.rule == "big-keys" && f.evidence.contains(key.as_str()))
            .unwrap_or_else(|| panic!("shard {i}'s {key} reported: {:?}", st.insights));
        println!("shard {i}: {} — {}", f.instance, f.evidence);
        assert!(
            f.instance.starts_with(&own),
            "shard {i}'s key was found on a server of that shard: {}",
            f.instance
        );
    }
}

/// The value of `key` on every server of `name`, by pod.
async fn config_everywhere(
    client: &kube::Client,
    ns: &str,
    name: &str,
    password: &str,
    key: &str,
) -> Vec<(String, Option<String>)> {
    use crate::support::operator::config_get;
    let mut out = Vec::new();
    for (pod, _) in redis_pods(client, ns, name).await {
        let mut n = connect_pod(client, ns, &pod, password)
            .await
            .expect("connect");
        out.push((pod, config_get(&mut n, key).await));
    }
    out
}

/// `CONFIG SET key value` on one pod's server (a value the operator does
/// not own: not in `spec.config`).
async fn config_set(
    client: &kube::Client,
    ns: &str,
    pod: &str,
    password: &str,
    key: &str,
    value: &str,
) {
    let mut n = connect_pod(client, ns, pod, password)
        .await
        .expect("connect");
    let _: () = n
        .query(
            "CONFIG SET",
            redis::cmd("CONFIG").arg("SET").arg(key).arg(value),
        )
        .await
        .expect("CONFIG SET");
}

/// The record of `rule` in `status.tuning.applied` once it is in effect on
/// every server of `name` (a record is written before the value is set:
/// `Applied` first, then the servers) or refused.
async fn applied_live(
    client: &kube::Client,
    ns: &str,
    name: &str,
    password: &str,
    rule: &str,
) -> redpilot::api::v1alpha1::AppliedTuning {
    let api = redis_api(client, ns);
    wait_for(
        &format!("{name}: {rule} in effect on every server, or refused"),
        Duration::from_secs(120),
        || async {
            let r = api.get(name).await.ok()?;
            let a = r
                .status?
                .tuning?
                .applied
                .into_iter()
                .find(|a| a.rule == rule)?;
            if a.state == "Refused" {
                return Some(a);
            }
            let values = config_everywhere(client, ns, name, password, &a.key).await;
            values
                .iter()
                .all(|(_, v)| v.as_deref() == Some(a.to.as_str()))
                .then_some(a)
        },
    )
    .await
}

/// The record of `rule` in `status.tuning.applied` once `done` holds of it.
async fn applied_when(
    api: &kube::Api<Redis>,
    name: &str,
    rule: &str,
    done: impl Fn(&redpilot::api::v1alpha1::AppliedTuning) -> bool,
) -> redpilot::api::v1alpha1::AppliedTuning {
    wait_for(
        &format!("{name}: {rule} applied"),
        Duration::from_secs(120),
        || async {
            let r = api.get(name).await.ok()?;
            let t = r.status?.tuning?;
            t.applied.into_iter().find(|a| a.rule == rule && done(a))
        },
    )
    .await
}

/// `spec.tuning.apply` end to end for the five rules besides the latency
/// monitor's, each made to fire on real servers: connections near
/// `maxclients` and refused at it (both double it), a key of 17 MiB
/// (`lazyfree-lazy-user-del yes`), memory fragmented by deleting every
/// other key of 120 MiB (`activedefrag yes`, applied where the server's
/// jemalloc can defragment and recorded `Refused` with the server's words
/// where it cannot), and three full resynchronisations a small backlog
/// caused (`repl-backlog-size`, on every instance). Each value is read
/// back from the servers; no pod restarts.
#[tokio::test]
async fn spec_tuning_applies_each_rule_it_lists_on_real_servers() {
    use crate::support::operator::pod_uids;
    let client = client().await;
    let ns = TestNamespace::new(&client, "op-tuning-rules", &[]).await;
    let _op = start_operator(&client, looking_every_3s(&ns.name)).await;
    let api = redis_api(&client, &ns.name);
    apply_redis(
        &client,
        &ns.name,
        "cache",
        json!({"mode": "Standalone", "resources": {"limits": {"memory": "512Mi"}},
               "tuning": {"apply": ["clients-near-max", "fragmentation"]}}),
    )
    .await;
    apply_redis(
        &client,
        &ns.name,
        "busy",
        // Few keys: the key sampler (one SCAN step a look) finds the big one
        // at once.
        json!({"mode": "Standalone", "resources": {"limits": {"memory": "128Mi"}},
               "tuning": {"apply": ["rejected-connections", "big-keys"]}}),
    )
    .await;
    apply_redis(
        &client,
        &ns.name,
        "flows",
        // Unfenced: the primary takes the writes its stopped replica misses.
        json!({"mode": "Replication", "instances": 2, "resources": {"limits": {"memory": "256Mi"}},
               "failover": {"fence": false}, "tuning": {"apply": ["full-resyncs"]}}),
    )
    .await;
    let mut uids = Vec::new();
    let mut pw = std::collections::BTreeMap::new();
    for name in ["cache", "busy", "flows"] {
        wait_ready(&client, &ns.name, name, READY).await;
        uids.push(pod_uids(&client, &ns.name, name).await);
        pw.insert(name, redis_password(&client, &ns.name, name).await);
    }

    // cache: 60 clients allowed (set live), 50 connected (83 %): ten
    // left for the operator, the probes and the metrics sidecar, whose
    // connections a fuller server refused once.
    config_set(
        &client,
        &ns.name,
        "cache-0",
        &pw["cache"],
        "maxclients",
        "60",
    )
    .await;
    let ip = pod_ip(&client, &ns.name, "cache-0").await;
    let mut node = connect_pod(&client, &ns.name, "cache-0", &pw["cache"])
        .await
        .expect("connect");
    let mut idle: Vec<TcpStream> = Vec::new();
    let mut now = info_u64(&mut node, "clients", "connected_clients").await;
    while now < 50 && idle.len() < 52 {
        for _ in now..50 {
            idle.push(TcpStream::connect((ip.as_str(), 6379)).expect("idle client"));
        }
        // The server counts a connection once it has accepted it: counted
        // at once, the count once lagged and a second round filled all 60,
        // leaving the operator none.
        tokio::time::sleep(Duration::from_millis(500)).await;
        now = info_u64(&mut node, "clients", "connected_clients").await;
    }
    assert!(now >= 50, "{now} clients of 60");
    // 400,000 keys of 300 bytes, then every other one deleted: the pages
    // the kept ones sit on stay resident.
    let value = "v".repeat(300);
    for chunk in (0..400_000).collect::<Vec<u32>>().chunks(5000) {
        let mut p = redis::pipe();
        for i in chunk {
            p.cmd("SET").arg(format!("k:{i}")).arg(&value).ignore();
        }
        let _: () = node.pipeline("SET", &p).await.expect("fill");
    }
    for chunk in (0..400_000)
        .filter(|i| i % 2 == 1)
        .collect::<Vec<u32>>()
        .chunks(5000)
    {
        let mut p = redis::pipe();
        for i in chunk {
            p.cmd("DEL").arg(format!("k:{i}")).ignore();
        }
        let _: () = node.pipeline("DEL", &p).await.expect("delete");
    }
    let used = info_u64(&mut node, "memory", "used_memory").await;
    let rss = info_u64(&mut node, "memory", "used_memory_rss").await;
    println!(
        "cache: {now} clients of 60; used {} MiB, resident {} MiB",
        used >> 20,
        rss >> 20
    );
    assert!(
        used >= 64 << 20 && rss * 2 >= used * 3,
        "the workload fragments: used {used}, resident {rss}"
    );

    // busy: 10 clients allowed (set live), 14 tried: some are refused.
    config_set(&client, &ns.name, "busy-0", &pw["busy"], "maxclients", "10").await;
    let busy_ip = pod_ip(&client, &ns.name, "busy-0").await;
    let mut tried: Vec<redpilot::redis::Node> = Vec::new();
    let mut refused = 0;
    let opts = redpilot::redis::ConnectOptions::default().with_password(pw["busy"].clone());
    for _ in 0..14 {
        match redpilot::redis::Node::connect(&redpilot::redis::Endpoint::new(&busy_ip, 6379), &opts)
            .await
        {
            Ok(n) => tried.push(n),
            // The server answers "max number of clients reached" and
            // closes: the client may see the error or a broken pipe.
            Err(_) => refused += 1,
        }
    }
    // Only for a moment: the probes and the operator connect again.
    drop(tried);
    let mut n = wait_for(
        "a connection to busy-0 again",
        Duration::from_secs(10),
        || async {
            connect_pod(&client, &ns.name, "busy-0", &pw["busy"])
                .await
                .ok()
        },
    )
    .await;
    let counted = info_u64(&mut n, "stats", "rejected_connections").await;
    // A key of 17 MiB.
    let _: () = n
        .query(
            "SET",
            redis::cmd("SET").arg("big").arg("b".repeat(17 << 20)),
        )
        .await
        .expect("SET big");
    println!(
        "busy: {refused} of 14 connections failed at maxclients 10; the server refused {counted}"
    );
    assert!(refused > 0 && counted > 0);

    // flows: a 1 MiB backlog; three times the replica's server is stopped
    // while 24 MiB are written (more than the sockets between them hold),
    // then cut off: what it missed is no longer in the backlog, so it must
    // copy everything again.
    let flows = api.get("flows").await.expect("flows");
    let primary = flows
        .status
        .as_ref()
        .and_then(|s| s.primary.clone())
        .expect("primary");
    let replica = if primary == "flows-0" {
        "flows-1"
    } else {
        "flows-0"
    };
    config_set(
        &client,
        &ns.name,
        &primary,
        &pw["flows"],
        "repl-backlog-size",
        "1048576",
    )
    .await;
    let mut r = connect_pod(&client, &ns.name, replica, &pw["flows"])
        .await
        .expect("connect");
    let replica_pid = crate::support::operator::server_pid(&mut r).await;
    drop(r);
    let mut p = connect_pod(&client, &ns.name, &primary, &pw["flows"])
        .await
        .expect("connect");
    let full_before = info_u64(&mut p, "stats", "sync_full").await;
    let mb = "r".repeat(1 << 20);
    for round in 0..3 {
        crate::support::operator::signal(replica_pid, "-STOP");
        let mut pipe = redis::pipe();
        for i in 0..24 {
            pipe.cmd("SET").arg(format!("r:{i}")).arg(&mb).ignore();
        }
        pipe.cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("replica")
            .ignore();
        let cut = p.pipeline::<()>("cut off", &pipe).await;
        crate::support::operator::signal(replica_pid, "-CONT");
        cut.expect("cut off");
        let want = full_before + round + 1;
        wait_for(
            "the replica synced in full again",
            Duration::from_secs(30),
            || async {
                let mut p = connect_pod(&client, &ns.name, &primary, &pw["flows"])
                    .await
                    .ok()?;
                let full = info_u64(&mut p, "stats", "sync_full").await;
                let online = info_u64(&mut p, "replication", "connected_slaves").await;
                (full >= want && online == 1).then_some(())
            },
        )
        .await;
    }
    let refused_partial = info_u64(&mut p, "stats", "sync_partial_err").await;
    println!(
        "flows: {} full resyncs, {refused_partial} partial ones refused",
        info_u64(&mut p, "stats", "sync_full").await - full_before
    );
    assert!(refused_partial >= 1);

    // Each listed rule applied, read back from every server.
    let near = applied_when(&api, "cache", "clients-near-max", |a| a.state == "Cleared").await;
    assert_eq!(
        (near.key.as_str(), near.from.as_str(), near.to.as_str()),
        ("maxclients", "60", "120"),
        "{near:?}"
    );
    let lazy = applied_live(&client, &ns.name, "busy", &pw["busy"], "big-keys").await;
    assert_eq!(
        (lazy.key.as_str(), lazy.to.as_str(), lazy.state.as_str()),
        ("lazyfree-lazy-user-del", "yes", "Applied"),
        "{lazy:?}"
    );
    let defrag = applied_live(&client, &ns.name, "cache", &pw["cache"], "fragmentation").await;
    println!("fragmentation: {defrag:?}");
    assert_eq!(defrag.key, "activedefrag");
    let mut n = connect_pod(&client, &ns.name, "cache-0", &pw["cache"])
        .await
        .expect("connect");
    let allocator = crate::support::operator::config_get(&mut n, "activedefrag").await;
    match defrag.state.as_str() {
        "Applied" | "Cleared" => assert_eq!(allocator.as_deref(), Some("yes")),
        "Refused" => {
            assert_eq!(allocator.as_deref(), Some("no"));
            assert!(
                defrag.message.as_deref().is_some_and(|m| !m.is_empty()),
                "the server's words: {defrag:?}"
            );
        }
        other => panic!("fragmentation: state {other}"),
    }
    assert_eq!(
        config_everywhere(&client, &ns.name, "cache", &pw["cache"], "maxclients").await,
        [("cache-0".to_string(), Some("120".to_string()))]
    );
    assert_eq!(
        config_everywhere(
            &client,
            &ns.name,
            "busy",
            &pw["busy"],
            "lazyfree-lazy-user-del"
        )
        .await,
        [("busy-0".to_string(), Some("yes".to_string()))]
    );
    let rejected = applied_live(
        &client,
        &ns.name,
        "busy",
        &pw["busy"],
        "rejected-connections",
    )
    .await;
    assert_eq!(
        (
            rejected.key.as_str(),
            rejected.from.as_str(),
            rejected.to.as_str()
        ),
        ("maxclients", "10", "20"),
        "{rejected:?}"
    );
    assert_eq!(
        config_everywhere(&client, &ns.name, "busy", &pw["busy"], "maxclients").await,
        [("busy-0".to_string(), Some("20".to_string()))]
    );
    let backlog = applied_live(&client, &ns.name, "flows", &pw["flows"], "full-resyncs").await;
    println!("full-resyncs: {backlog:?}");
    assert_eq!(
        (backlog.key.as_str(), backlog.from.as_str()),
        ("repl-backlog-size", "1048576")
    );
    let to: u64 = backlog.to.parse().expect("bytes");
    assert!(
        to >= 4 << 20,
        "at least four times the backlog: {backlog:?}"
    );
    for (pod, v) in config_everywhere(
        &client,
        &ns.name,
        "flows",
        &pw["flows"],
        "repl-backlog-size",
    )
    .await
    {
        assert_eq!(v.as_deref(), Some(backlog.to.as_str()), "{pod}");
    }
    let events = recent_events(&client, &ns.name, 80).await;
    assert!(events.contains("TuningApplied"), "{events}");
    // Live: no pod made anew.
    for (name, before) in ["cache", "busy", "flows"].into_iter().zip(uids) {
        assert_eq!(pod_uids(&client, &ns.name, name).await, before, "{name}");
    }
    drop(idle);
}
