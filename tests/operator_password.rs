//! Password rotation, live, against the dev cluster and real servers:
//!
//! - the user's Secret gets a new password (with quotes, a backslash and a
//!   space) while a writer that re-reads the Secret keeps writing: every
//!   instance ends up refusing the old password and accepting the new one,
//!   every pod stays Ready (the readiness probe, whose environment is fixed
//!   when its container starts, does not use the rotated password),
//!   replication keeps working (a replica killed afterwards restarts with the
//!   new password and relinks), no acknowledged write is lost, and the
//!   password never appears on a server's command line;
//! - a deleted generated Secret comes back with the password the servers
//!   run, so clients keep working.

mod support;

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};
use redpilot::redis::{ConnectOptions, Endpoint, ErrorCategory, Node};
use serde_json::json;
use support::operator::{
    OperatorOptions, apply_redis, container_restarts, create_user_secret, is_ready, kill_9, pod_ip,
    pod_ready, poke, recent_events, redis_api, redis_password, redis_pods, server_pid,
    start_operator, wait_ready,
};
use support::writer::{Writer, assert_everywhere};
use support::{TestNamespace, client, wait_for};

const READY: Duration = Duration::from_secs(180);

async fn connect(ip: &str, password: &str) -> redpilot::redis::Result<Node> {
    Node::connect(
        &Endpoint::new(ip, 6379),
        &ConnectOptions::default().with_password(password),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_rotated_under_a_writer_locks_nobody_out() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "rotate", &[]).await;
    let _op = start_operator(&client, OperatorOptions::watching(&[&ns.name])).await;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns.name);
    let old = "first-password";
    let new = "second \"pass\" \\ word";
    create_user_secret(&client, &ns.name, "app-pw", old).await;
    apply_redis(
        &client,
        &ns.name,
        "cache",
        json!({
            "mode": "Replication", "instances": 3,
            "persistence": {"rdb": false},
            "auth": {"secretName": "app-pw"},
        }),
    )
    .await;
    wait_ready(&client, &ns.name, "cache", READY).await;
    let pods = redis_pods(&client, &ns.name, "cache").await;
    let mut ips = Vec::new();
    for name in pods.keys() {
        ips.push((name.clone(), pod_ip(&client, &ns.name, name).await));
    }
    // The password is not on any server's command line.
    for (name, ip) in &ips {
        let mut n = connect(ip, old).await.expect("connect with the password");
        let pid = server_pid(&mut n).await;
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).expect("cmdline");
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        assert!(!cmdline.contains(old), "{name}: {cmdline}");
    }

    let writer = Writer::start_with_secret(&client, &ns.name, "cache", "app-pw", "rot", 1);
    writer.wait_progress(200, Duration::from_secs(60)).await;
    // Settled: a Ready Redis is next looked at in 60 s unless it or its
    // pods change. Secrets are not watched (the operator may not list or
    // watch them): the README's way to start a rotation at once is to
    // touch the Redis after changing its Secret.
    wait_ready(&client, &ns.name, "cache", READY).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let t = Instant::now();
    secrets
        .patch(
            "app-pw",
            &PatchParams::default(),
            &Patch::Merge(json!({"stringData": {"password": new}})),
        )
        .await
        .expect("rotate the user's Secret");
    poke(&client, &ns.name, "cache", 1).await;
    let server_auth = wait_for("the rotation to complete", READY, || async {
        let events = recent_events(&client, &ns.name, 80).await;
        let s = secrets.get("cache-server-auth").await.ok()?;
        let data = s.data?;
        let done = events.contains("PasswordRotated")
            && !data.contains_key("previous")
            && data.get("password").map(|b| b.0.as_slice()) == Some(new.as_bytes());
        done.then_some(data)
    })
    .await;
    let rotated = t.elapsed();
    assert!(
        rotated < Duration::from_secs(30),
        "the rotation starts when the Redis is touched, not at the next periodic pass: {rotated:?}"
    );
    assert!(server_auth.contains_key("auth.conf"));
    for (name, ip) in &ips {
        let e = connect(ip, old).await.err();
        assert_eq!(
            e.as_ref().map(|e| e.category()),
            Some(ErrorCategory::Auth),
            "{name} refuses the old password: {e:?}"
        );
        connect(ip, new)
            .await
            .unwrap_or_else(|e| panic!("{name} accepts the new password: {e}"));
    }
    wait_ready(&client, &ns.name, "cache", READY).await;
    writer.wait_progress(200, Duration::from_secs(60)).await;
    // Every instance stays Ready after the old password is gone: the
    // readiness probes of pods started before the rotation (their
    // environment was fixed then) must not depend on it. Three failed
    // probes, 2 s apart, would take a pod out within 6 s; watch 12 s.
    let pod_api: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let watched = Instant::now();
    while watched.elapsed() < Duration::from_secs(12) {
        let r = redis_api(&client, &ns.name)
            .get("cache")
            .await
            .expect("get");
        let unready: Vec<String> = redis_pods(&client, &ns.name, "cache")
            .await
            .into_iter()
            .filter(|(_, p)| !pod_ready(p))
            .map(|(n, _)| n)
            .collect();
        assert!(
            unready.is_empty() && r.status.as_ref().and_then(|s| s.ready.as_deref()) == Some("3/3"),
            "{:.1}s after the rotation: pods not ready {unready:?}, Redis ready {:?}{}",
            watched.elapsed().as_secs_f64(),
            r.status.and_then(|s| s.ready),
            support::diag::report().await
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // A replica restarting now starts with the new password and relinks.
    let primary = redis_api(&client, &ns.name)
        .get("cache")
        .await
        .expect("get")
        .status
        .and_then(|s| s.primary)
        .expect("primary");
    let (victim, ip) = ips
        .iter()
        .find(|(n, _)| *n != primary)
        .cloned()
        .expect("a replica");
    let before = pod_api.get(&victim).await.expect("replica pod");
    let mut n = connect(&ip, new).await.expect("connect to the replica");
    let pid = server_pid(&mut n).await;
    drop(n);
    kill_9(pid);
    wait_for(
        "the replica to restart and the Redis to be Ready",
        READY,
        || async {
            let p = pod_api.get(&victim).await.ok()?;
            let r = redis_api(&client, &ns.name).get("cache").await.ok()?;
            (container_restarts(&p) > container_restarts(&before)
                && pod_ready(&p)
                && is_ready(&r)
                && r.status?.ready.as_deref() == Some("3/3"))
            .then_some(())
        },
    )
    .await;
    let mut n = connect(&ip, new).await.expect("the restarted replica");
    let info: String = n
        .query("INFO", redis::cmd("INFO").arg("replication"))
        .await
        .expect("INFO");
    assert!(info.contains("master_link_status:up"), "{info}");

    let tally = writer.stop().await;
    println!(
        "password rotated live in {:.1}s; {} writes acknowledged ({} unreplicated, {} failed)",
        rotated.as_secs_f64(),
        tally.acked.len(),
        tally.unreplicated,
        tally.failed
    );
    assert_everywhere(&client, &ns.name, "cache", 3, new, &tally.acked).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_generated_secret_comes_back_with_the_running_password() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "auth-restore", &[]).await;
    let _op = start_operator(&client, OperatorOptions::watching(&[&ns.name])).await;
    apply_redis(&client, &ns.name, "solo", json!({"mode": "Standalone"})).await;
    wait_ready(&client, &ns.name, "solo", READY).await;
    let password = redis_password(&client, &ns.name, "solo").await;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns.name);
    let uid = secrets
        .get("solo-auth")
        .await
        .expect("generated Secret")
        .metadata
        .uid;
    secrets
        .delete("solo-auth", &DeleteParams::default())
        .await
        .expect("delete the generated Secret");
    // Secrets are not watched: the next pass re-creates it (at the latest
    // the steady one, a minute after the last); touching the Redis starts
    // that pass at once, as the README says.
    poke(&client, &ns.name, "solo", 1).await;
    let t = Instant::now();
    wait_for(
        "the generated Secret to be re-created",
        Duration::from_secs(30),
        || async {
            let s = secrets.get_opt("solo-auth").await.ok()??;
            (s.metadata.uid != uid).then_some(())
        },
    )
    .await;
    println!("the deleted Secret was re-created after {:?}", t.elapsed());
    // Compared without printing either value.
    assert!(
        redis_password(&client, &ns.name, "solo").await == password,
        "the re-created Secret holds the password the servers run"
    );
    let ip = pod_ip(&client, &ns.name, "solo-0").await;
    connect(&ip, &password)
        .await
        .expect("clients keep working with the password they had");
    let r = wait_ready(&client, &ns.name, "solo", READY).await;
    assert!(is_ready(&r));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_user_secret_is_degraded_and_forgets_nothing() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "auth-missing", &[]).await;
    let _op = start_operator(&client, OperatorOptions::watching(&[&ns.name])).await;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns.name);
    create_user_secret(&client, &ns.name, "app-pw", "a-password").await;
    apply_redis(
        &client,
        &ns.name,
        "solo",
        json!({"mode": "Standalone", "auth": {"secretName": "app-pw"}}),
    )
    .await;
    let ready = wait_ready(&client, &ns.name, "solo", READY).await;
    let primary = ready.status.and_then(|s| s.primary);
    assert_eq!(primary.as_deref(), Some("solo-0"));

    secrets
        .delete("app-pw", &DeleteParams::default())
        .await
        .expect("delete the user's Secret");
    // Secrets are not watched: touching the Redis starts the pass at once.
    poke(&client, &ns.name, "solo", 1).await;
    let status = wait_for("Degraded, naming the Secret", READY, || async {
        let s = redis_api(&client, &ns.name)
            .get("solo")
            .await
            .ok()?
            .status?;
        let degraded = s
            .conditions
            .iter()
            .any(|c| c.type_ == "Degraded" && c.status == "True" && c.message.contains("app-pw"));
        let ready = s
            .conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        (degraded && !ready).then_some(s)
    })
    .await;
    assert_eq!(
        status.primary, primary,
        "a failed pass keeps the recorded primary"
    );

    create_user_secret(&client, &ns.name, "app-pw", "a-password").await;
    poke(&client, &ns.name, "solo", 2).await;
    wait_ready(&client, &ns.name, "solo", READY).await;
}
