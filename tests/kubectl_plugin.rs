//! `kubectl redpilot` (the `kubectl-redpilot` executable) against the dev
//! cluster: every verb on a real Redis, through the real operator, and its
//! errors for what it cannot do.

mod support;

use std::time::Duration;

use kube::Api;
use kube::api::PostParams;
use redpilot::api::v1alpha1::{BackupPhase, Phase, RedisBackup};
use serde_json::json;
use support::operator::{OperatorOptions, apply_redis, redis_api, start_operator, wait_ready};
use support::{TestNamespace, client, wait_for};

const READY: Duration = Duration::from_secs(240);

/// Runs the plugin; returns (success, stdout + stderr).
fn plugin(args: &[&str]) -> (bool, String) {
    support::kubectl_redpilot(args)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_verb_works_on_a_real_redis() {
    let client = client().await;
    let tns = TestNamespace::new(&client, "plugin", &[]).await;
    let ns = tns.name.as_str();
    let _op = start_operator(&client, OperatorOptions::watching(&[ns])).await;
    support::operator::create_claim(&client, ns, "backups").await;
    apply_redis(
        &client,
        ns,
        "cache",
        json!({"mode": "Replication", "instances": 3, "storage": {"size": "1Gi"},
               "persistence": {"rdb": false}}),
    )
    .await;
    let r = wait_ready(&client, ns, "cache", READY).await;
    let old_primary = r.status.and_then(|s| s.primary).expect("primary");

    // version
    let (ok, text) = plugin(&["version"]);
    assert!(ok, "{text}");
    assert!(
        text.contains(&format!("kubectl-redpilot {}", redpilot::VERSION)),
        "{text}"
    );
    assert!(text.contains("Kubernetes v1.37"), "{text}");

    // status
    let (ok, text) = plugin(&["-n", ns, "status", "cache"]);
    assert!(ok, "{text}");
    assert!(
        text.contains(&format!("Redis {ns}/cache: Redis 7.0 (7.0")),
        "{text}"
    );
    assert!(text.contains(&format!("primary {old_primary}")), "{text}");
    // Each instance's row: role, ready, offset, lag and link as the status
    // has them (the primary has no link; a replica's is up).
    let st = r0_status(&client, ns).await;
    for inst in &st.instances {
        let row = text
            .lines()
            .find(|l| l.starts_with(&format!("{} ", inst.name)))
            .unwrap_or_else(|| panic!("no row for {}: {text}", inst.name));
        let cols: Vec<&str> = row.split_whitespace().collect();
        let primary = inst.name == old_primary;
        assert_eq!(
            cols[1],
            if primary { "primary" } else { "replica" },
            "{row}"
        );
        assert_eq!(cols[2], "yes", "{row}");
        let offset: i64 = cols[3]
            .parse()
            .unwrap_or_else(|_| panic!("offset in {row}"));
        assert!(offset > 0, "{row}");
        assert_eq!(cols[5], if primary { "-" } else { "up" }, "{row}");
    }
    assert_eq!(st.instances.len(), 3, "{text}");
    assert!(
        text.contains("Memory: ") && text.contains("autopilot off"),
        "{text}"
    );
    assert!(text.contains("Ready=True AllInstancesReady"), "{text}");
    assert!(text.contains("Last backup: none"), "{text}");
    let events = text
        .split("Recent events:")
        .nth(1)
        .unwrap_or_else(|| panic!("no events section: {text}"));
    assert!(events.contains("PrimaryElected"), "{text}");
    assert!(!text.contains("Last failover"), "no failover yet: {text}");
    let (ok, text) = plugin(&["-n", ns, "status", "absent"]);
    assert!(
        !ok && text.contains(&format!("Redis {ns}/absent not found")),
        "{text}"
    );

    // switchover, to the replica least behind
    let (ok, text) = plugin(&["-n", ns, "switchover", "cache"]);
    assert!(ok, "{text}");
    let r = redis_api(&client, ns).get("cache").await.unwrap();
    let new_primary = r.status.and_then(|s| s.primary).expect("primary");
    assert_ne!(new_primary, old_primary);
    assert!(
        text.contains(&format!("{new_primary} is the primary of cache")),
        "{text}"
    );
    // The one-off request is withdrawn (it would pin the primary otherwise).
    let r = redis_api(&client, ns).get("cache").await.unwrap();
    assert_eq!(r.spec.failover.and_then(|f| f.switchover_to), None);
    // ... and back, naming it.
    let (ok, text) = plugin(&["-n", ns, "switchover", "cache", &old_primary]);
    assert!(ok, "{text}");
    let r = redis_api(&client, ns).get("cache").await.unwrap();
    assert_eq!(r.status.and_then(|s| s.primary), Some(old_primary.clone()));

    // A failover (the primary's server killed) shows as the last failover.
    let pw = support::operator::redis_password(&client, ns, "cache").await;
    let mut node = support::operator::connect_pod(&client, ns, &old_primary, &pw)
        .await
        .expect("connect");
    support::operator::kill_9(support::operator::server_pid(&mut node).await);
    let failover = wait_for("a failover", READY, || async {
        r0_status(&client, ns).await.last_failover
    })
    .await;
    assert_eq!(failover.from, old_primary);
    wait_ready(&client, ns, "cache", READY).await;
    let (ok, text) = plugin(&["-n", ns, "status", "cache"]);
    assert!(ok, "{text}");
    assert!(
        text.contains(&format!(
            "Last failover: {} → {} ({})",
            failover.from, failover.to, failover.reason
        )),
        "{text}"
    );

    // backup: no target known yet, then the target of the first backup.
    let (ok, text) = plugin(&["-n", ns, "backup", "cache"]);
    assert!(!ok && text.contains("no target known for cache"), "{text}");
    let backups: Api<RedisBackup> = Api::namespaced(client.clone(), ns);
    let first: RedisBackup = serde_json::from_value(json!({
        "apiVersion": "redpilot.io/v1alpha1", "kind": "RedisBackup",
        "metadata": {"name": "first"},
        "spec": {"redis": "cache", "target": {"volume": {"claimName": "backups", "path": "cache"}}},
    }))
    .unwrap();
    backups
        .create(&PostParams::default(), &first)
        .await
        .expect("first backup");
    wait_for("the first backup", Duration::from_secs(180), || async {
        let b = backups.get("first").await.ok()?;
        (b.status?.phase? == BackupPhase::Completed).then_some(())
    })
    .await;
    let (ok, text) = plugin(&["-n", ns, "backup", "cache", "--name", "second"]);
    assert!(ok, "{text}");
    assert!(text.contains("second Completed in"), "{text}");
    let second = backups.get("second").await.unwrap();
    assert_eq!(
        second.spec.target.volume.map(|v| v.claim_name).as_deref(),
        Some("backups")
    );
    let (_, text) = plugin(&["-n", ns, "status", "cache"]);
    assert!(text.contains("Last backup: second Completed"), "{text}");

    // hibernate and wake
    let (ok, text) = plugin(&["-n", ns, "hibernate", "cache"]);
    assert!(ok && text.contains("cache: hibernated"), "{text}");
    let r = redis_api(&client, ns).get("cache").await.unwrap();
    assert_eq!(r.status.and_then(|s| s.phase), Some(Phase::Hibernated));
    let (ok, text) = plugin(&["-n", ns, "wake", "cache"]);
    assert!(ok && text.contains("cache: Ready, 3/3"), "{text}");

    // A Redis without storage cannot hibernate: said before anything is sent.
    apply_redis(&client, ns, "plain", json!({"mode": "Standalone"})).await;
    let (ok, text) = plugin(&["-n", ns, "hibernate", "plain"]);
    assert!(!ok && text.contains("plain has no spec.storage"), "{text}");
}

/// The Redis `cache`'s status now.
async fn r0_status(client: &kube::Client, ns: &str) -> redpilot::api::v1alpha1::RedisStatus {
    redis_api(client, ns)
        .get("cache")
        .await
        .expect("get cache")
        .status
        .expect("status")
}
