//! Level 3 backups and restores on the dev cluster, with a real S3 server
//! (versitygw, listening on the local node's bridge address so the agents
//! in pods reach it) and real Redis servers:
//!
//! - a `RedisBackup` of a 3-instance Redis under a writer: taken from a
//!   replica by a Job of the operator's image, Completed, and its status
//!   (size, SHA-256, keys, engine, source, offset) matches the stored
//!   object; the writer saw no error;
//! - bad input ends in Failed with a reason naming the cause and no secret:
//!   wrong credentials (no object left), a Redis or a Secret that does not
//!   exist;
//! - a new Redis bootstrapped from the backup is Ready with the same keys
//!   (count, and a sample of values) on all three instances;
//! - a bootstrap from a corrupted copy or a missing object stops with a
//!   Degraded condition naming the cause;
//! - deletion: `Retain` keeps the stored object, `Delete` removes it and its
//!   manifest; deleting the Redis deletes no backup.

mod support;
// Tuning advice's scenarios (tests/tuning/) run in this binary: its
// longest test waits on a backup schedule's minutes, so they cost the run
// no time here.
mod tuning;
// Volume growth's scenarios (tests/volumes/), for the same reason.
mod volumes;
// Helm's install, upgrade and uninstall (tests/helm/), for the same reason.
mod helm;

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use redpilot::api::v1alpha1::RedisBackup;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use support::operator::{
    OperatorOptions, apply_redis, connect_pod, create_backup, ended, kubectl, recent_events,
    redis_api, redis_password, start_operator, wait_ready,
};
use support::s3_server::{ACCESS_KEY, S3Server, SECRET_KEY};
use support::writer::Writer;
use support::{TestNamespace, client, wait_for};

/// The local node's bridge address: pods reach the host there.
const NODE_IP: &str = "10.244.0.1";
const BUCKET: &str = "backups";
const SEEDED: usize = 20_000;
const READY: Duration = Duration::from_secs(180);

async fn secret(client: &Client, ns: &str, name: &str, id: &str, key: &str) {
    let s: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": name, "labels": {"redpilot.io/allow-use": "true"}},
        "stringData": {"AWS_ACCESS_KEY_ID": id, "AWS_SECRET_ACCESS_KEY": key}
    }))
    .expect("secret");
    Api::<Secret>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &s)
        .await
        .expect("creating the credentials Secret");
}

fn s3_target(s3: &S3Server, secret: &str) -> Value {
    json!({"endpoint": s3.endpoint(), "bucket": BUCKET, "prefix": "e2e", "pathStyle": true,
           "credentials": {"secretName": secret}})
}

fn backup_target(s3: &S3Server, secret: &str) -> Value {
    json!({"s3": s3_target(s3, secret)})
}

/// Waits for the backup to be Running and returns the name of its Job.
async fn job_of(client: &Client, ns: &str, name: &str) -> String {
    let api: Api<RedisBackup> = Api::namespaced(client.clone(), ns);
    wait_for(
        &format!("{name} to be Running"),
        Duration::from_secs(60),
        || async { api.get(name).await.ok()?.status?.job },
    )
    .await
}

async fn seed(client: &Client, ns: &str, redis: &str, primary: &str) {
    let pw = redis_password(client, ns, redis).await;
    let mut node = connect_pod(client, ns, primary, &pw)
        .await
        .expect("connect");
    let mut cmd = vec!["MSET".to_string()];
    for i in 0..SEEDED {
        cmd.push(format!("seed:{i}"));
        cmd.push(format!("value-{i}-{}", i * 7919 % 10007));
        if cmd.len() > 2000 || i + 1 == SEEDED {
            let mut c = redis::cmd("MSET");
            for a in &cmd[1..] {
                c.arg(a);
            }
            node.query::<()>("MSET", &c).await.expect("MSET");
            cmd.truncate(1);
        }
    }
}

async fn dbsize(client: &Client, ns: &str, redis: &str, pod: &str) -> i64 {
    let pw = redis_password(client, ns, redis).await;
    let mut node = connect_pod(client, ns, pod, &pw).await.expect("connect");
    node.query::<i64>("DBSIZE", &redis::cmd("DBSIZE"))
        .await
        .expect("DBSIZE")
}

/// `REDPILOT_BACKUP_MB` (`make bench-restore`).
fn bench_megabytes() -> Option<u64> {
    std::env::var("REDPILOT_BACKUP_MB").ok()?.parse().ok()
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn backup_to_s3_and_restore_into_a_new_redis() {
    let client = client().await;
    let tns = TestNamespace::new(&client, "backup", &[]).await;
    let ns = tns.name.as_str();
    let s3 = S3Server::start_on(NODE_IP, &[BUCKET]);
    secret(&client, ns, "s3", ACCESS_KEY, SECRET_KEY).await;
    secret(
        &client,
        ns,
        "s3-wrong",
        ACCESS_KEY,
        "not-the-secret-key-at-all",
    )
    .await;
    let _op = start_operator(&client, OperatorOptions::watching(&[ns])).await;

    // A source with data, and a writer that keeps writing throughout.
    apply_redis(
        &client,
        ns,
        "src",
        json!({"mode": "Replication", "instances": 3,
               "config": {"slowlog-log-slower-than": "5000"}}),
    )
    .await;
    let src = wait_ready(&client, ns, "src", READY).await;
    let primary = src
        .status
        .as_ref()
        .and_then(|s| s.primary.clone())
        .expect("primary");
    seed(&client, ns, "src", &primary).await;
    // `make bench-restore`: a dataset of REDPILOT_BACKUP_MB MiB more (1 KiB
    // values), to time the backup and the restore at that size.
    let big_keys = bench_megabytes().map(|mb| mb * 1024).unwrap_or(0);
    if big_keys > 0 {
        let t = Instant::now();
        let pw = redis_password(&client, ns, "src").await;
        let mut node = connect_pod(&client, ns, &primary, &pw)
            .await
            .expect("connect");
        // MSETs of 1,000 keys (1 MiB each): written through the primary,
        // so the replicas (where backups come from) get them too.
        // Values that do not compress (the RDB file is LZF-compressed):
        // a xorshift stream.
        let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut noise = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for chunk in (0..big_keys).collect::<Vec<_>>().chunks(1000) {
            let mut c = redis::cmd("MSET");
            for i in chunk {
                let mut v = format!("{i:>24}").into_bytes();
                while v.len() < 1024 {
                    v.extend_from_slice(&noise().to_le_bytes());
                }
                v.truncate(1024);
                c.arg(format!("big:{i}")).arg(v);
            }
            node.query_within::<()>("MSET", &c, Duration::from_secs(60))
                .await
                .expect("MSET");
        }
        println!(
            "populated {big_keys} keys of 1 KiB in {:.1} s",
            t.elapsed().as_secs_f64()
        );
        wait_ready(&client, ns, "src", READY).await;
    }
    let pw = redis_password(&client, ns, "src").await;
    let writer = Writer::start(&client, ns, "src", &pw, "w", 0);
    writer.wait_progress(200, Duration::from_secs(30)).await;

    // 1. A backup: from a replica, described by the stored object.
    let t = Instant::now();
    create_backup(
        &client,
        ns,
        "b1",
        json!({"redis": "src", "target": backup_target(&s3, "s3")}),
    )
    .await;
    // Bench sizes get a second per MiB more.
    let slow = Duration::from_secs(big_keys / 1024);
    let b1 = ended(&client, ns, "b1", Duration::from_secs(120) + slow).await;
    let took = t.elapsed();
    let st = b1.status.clone().expect("status");
    assert_eq!(
        st.phase,
        Some(redpilot::api::v1alpha1::BackupPhase::Completed),
        "{st:?}\n{}",
        recent_events(&client, ns, 15).await
    );
    let source = st.source.clone().expect("source");
    assert_ne!(source, primary, "the backup must come from a replica");
    // The server named as the source says it is a replica (not only the
    // backup's own status).
    let mut at_source = connect_pod(&client, ns, &source, &pw)
        .await
        .expect("connect to the backup's source");
    let role = at_source
        .info_section("replication")
        .await
        .expect("INFO replication")
        .replication
        .role;
    assert_eq!(
        role,
        Some(redpilot::redis::info::Role::Replica),
        "{source} is a replica"
    );
    drop(at_source);
    let key = st.key.clone().expect("key");
    assert!(key.starts_with(&format!("e2e/{ns}/src/b1-")), "{key}");
    assert_eq!(
        st.location.as_deref(),
        Some(format!("s3://{BUCKET}/{key}").as_str())
    );
    let stored = std::fs::read(s3.bucket_dir(BUCKET).join(&key)).expect("the stored object");
    assert_eq!(st.size_bytes, Some(stored.len() as i64));
    assert_eq!(st.sha256.as_deref(), Some(sha256_hex(&stored).as_str()));
    let keys = st.keys.expect("keys");
    assert!(keys >= SEEDED as i64, "{keys} keys");
    assert_eq!(st.engine.as_deref(), Some("Redis"));
    assert!(
        st.engine_version
            .as_deref()
            .is_some_and(|v| v.starts_with("7.0"))
    );
    assert!(st.offset.is_some_and(|o| o > 0));
    assert!(
        s3.files(BUCKET).contains(&format!("{key}.manifest.json")),
        "{:?}",
        s3.files(BUCKET)
    );
    println!(
        "backup b1: {} bytes, {keys} keys, from {source}, Completed {:.1} s after it was created",
        stored.len(),
        took.as_secs_f64()
    );
    let out = kubectl(&["get", "redisbackups", "-n", ns]);
    let table = String::from_utf8_lossy(&out.stdout);
    println!("{table}");
    assert!(
        table.contains("Completed") && table.contains(&source),
        "{table}"
    );

    // 2. Bad input: each fails with its cause, never a secret.
    create_backup(
        &client,
        ns,
        "wrong-key",
        json!({"redis": "src", "target": backup_target(&s3, "s3-wrong")}),
    )
    .await;
    create_backup(
        &client,
        ns,
        "no-redis",
        json!({"redis": "absent", "target": backup_target(&s3, "s3")}),
    )
    .await;
    create_backup(
        &client,
        ns,
        "no-secret",
        json!({"redis": "src", "target": {"s3": s3_target(&s3, "absent-secret")}}),
    )
    .await;
    for (name, reason, words) in [
        (
            "wrong-key",
            "StoreAccessDenied",
            "secret access key is wrong",
        ),
        ("no-redis", "RedisNotFound", "Redis absent does not exist"),
        (
            "no-secret",
            "CredentialsNotFound",
            "Secret absent-secret does not exist",
        ),
    ] {
        let b = ended(&client, ns, name, Duration::from_secs(90)).await;
        let st = b.status.clone().expect("status");
        let text = serde_json::to_string(&st).expect("json");
        assert_eq!(st.reason.as_deref(), Some(reason), "{name}: {text}");
        assert!(
            st.message.as_deref().is_some_and(|m| m.contains(words)),
            "{name}: {text}"
        );
        assert!(
            !text.contains(SECRET_KEY) && !text.contains("not-the-secret-key"),
            "{text}"
        );
        println!("{name}: {reason}: {}", st.message.unwrap_or_default());
        if let Some(k) = st.key {
            assert!(
                !s3.files(BUCKET).iter().any(|f| f.starts_with(&k)),
                "a failed backup left an object under {k}"
            );
        }
    }
    let events = recent_events(&client, ns, 40).await;
    assert!(!events.contains(SECRET_KEY) && !events.contains("not-the-secret-key"));
    let tally = writer.stop().await;
    assert_eq!(
        tally.failed, 0,
        "the Redis kept serving throughout the backups"
    );
    println!(
        "writer: {} writes acknowledged during the backups, 0 failed",
        tally.acked.len()
    );

    // 3. Restore into a new Redis that names only the backup: it takes
    // the backed-up Redis's mode, instances, engine, version and config.
    let t = Instant::now();
    apply_redis(
        &client,
        ns,
        "restored",
        json!({"bootstrap": {"fromBackup": {"backup": "b1"}}}),
    )
    .await;
    let restored = wait_ready(&client, ns, "restored", READY + slow).await;
    println!(
        "restored Redis Ready {:.1} s after creation",
        t.elapsed().as_secs_f64()
    );
    let shape = &restored.spec;
    assert_eq!(
        (
            shape.mode,
            shape.instances,
            shape.engine,
            shape.version.as_deref()
        ),
        (
            Some(redpilot::api::v1alpha1::Mode::Replication),
            Some(3),
            Some(redpilot::api::v1alpha1::Engine::Redis),
            Some("7.0")
        ),
        "the spec takes the backed-up Redis's shape"
    );
    assert_eq!(
        shape
            .config
            .get("slowlog-log-slower-than")
            .map(String::as_str),
        Some("5000")
    );
    let events = recent_events(&client, ns, 60).await;
    assert!(
        events.contains("SpecFromBackup") && events.contains("mode Replication, engine Redis, version 7.0, 3 instances, config slowlog-log-slower-than from RedisBackup b1"),
        "{events}"
    );
    let rst = restored.status.clone().expect("status");
    assert_eq!(
        rst.bootstrap.as_ref().map(|b| b.done),
        Some(true),
        "{:?}",
        rst.bootstrap
    );
    assert!(
        rst.bootstrap
            .as_ref()
            .and_then(|b| b.origin.as_ref())
            .is_some_and(|o| o.instances == 3),
        "status.bootstrap.origin: {:?}",
        rst.bootstrap
    );
    let rprimary = rst.primary.clone().expect("primary");
    assert_eq!(rprimary, "restored-0");
    for i in 0..3 {
        let pod = format!("restored-{i}");
        assert_eq!(dbsize(&client, ns, "restored", &pod).await, keys, "{pod}");
    }
    let rpw = redis_password(&client, ns, "restored").await;
    let mut node = connect_pod(&client, ns, "restored-2", &rpw)
        .await
        .expect("connect");
    for i in (0..SEEDED).step_by(97) {
        let v: String = node
            .query("GET", redis::cmd("GET").arg(format!("seed:{i}")))
            .await
            .expect("GET");
        assert_eq!(v, format!("value-{i}-{}", i * 7919 % 10007), "seed:{i}");
    }
    if big_keys > 0 {
        let mut source = connect_pod(&client, ns, &primary, &pw)
            .await
            .expect("connect");
        for i in (0..big_keys).step_by(4099) {
            let k = format!("big:{i}");
            let a: Vec<u8> = source
                .query("GET", redis::cmd("GET").arg(&k))
                .await
                .expect("GET");
            let b: Vec<u8> = node
                .query("GET", redis::cmd("GET").arg(&k))
                .await
                .expect("GET");
            assert!(a.len() == 1024 && a == b, "{k}");
        }
        println!(
            "{} sampled 1 KiB values equal to the source's",
            big_keys.div_ceil(4099)
        );
    }
    println!(
        "restored: {keys} keys on all 3 instances, {} sampled values equal",
        SEEDED.div_ceil(97)
    );

    // 4. Bootstraps that must stop with their cause.
    let copy = format!("e2e/corrupt/{}", key.rsplit('/').next().unwrap_or("x.rdb"));
    let dir = s3.bucket_dir(BUCKET);
    std::fs::create_dir_all(dir.join("e2e/corrupt")).expect("dir");
    let mut bytes = stored.clone();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x01;
    std::fs::write(dir.join(&copy), &bytes).expect("corrupt copy");
    std::fs::copy(
        dir.join(format!("{key}.manifest.json")),
        dir.join(format!("{copy}.manifest.json")),
    )
    .expect("manifest copy");
    for (name, k, reason) in [
        ("corrupt", copy.as_str(), "ChecksumMismatch"),
        ("missing", "e2e/none/missing.rdb", "StoreNotFound"),
    ] {
        apply_redis(
            &client,
            ns,
            name,
            json!({"mode": "Replication", "instances": 1,
                   "bootstrap": {"fromBackup": {"s3": s3_target(&s3, "s3"), "key": k}}}),
        )
        .await;
        let r = wait_for(
            &format!("{name} to report {reason}"),
            Duration::from_secs(120),
            || async {
                let r = redis_api(&client, ns).get(name).await.ok()?;
                let c = r
                    .status
                    .as_ref()?
                    .conditions
                    .iter()
                    .find(|c| c.type_ == "Degraded" && c.status == "True")?
                    .clone();
                (c.reason == reason).then_some(c)
            },
        )
        .await;
        println!("{name}: Degraded {}: {}", r.reason, r.message);
        assert!(!r.message.contains(SECRET_KEY));
        let red = redis_api(&client, ns).get(name).await.expect("get");
        assert_ne!(
            red.status.and_then(|s| s.phase),
            Some(redpilot::api::v1alpha1::Phase::Ready)
        );
    }

    // 5. Deletion: Retain keeps the object, Delete removes it; deleting the
    // Redis deletes no backup.
    create_backup(
        &client,
        ns,
        "b2",
        json!({"redis": "restored", "target": backup_target(&s3, "s3"), "deletionPolicy": "Delete"}),
    )
    .await;
    let b2 = ended(&client, ns, "b2", Duration::from_secs(120)).await;
    let key2 = b2.status.and_then(|s| s.key).expect("key of b2");
    assert!(s3.files(BUCKET).contains(&key2));
    redis_api(&client, ns)
        .delete("src", &DeleteParams::default())
        .await
        .expect("delete src");
    let backups: Api<RedisBackup> = Api::namespaced(client.clone(), ns);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        backups.get_opt("b1").await.expect("get").is_some(),
        "deleting the Redis deleted its backup"
    );
    backups
        .delete("b1", &DeleteParams::default())
        .await
        .expect("delete b1");
    backups
        .delete("b2", &DeleteParams::default())
        .await
        .expect("delete b2");
    wait_for("b1 and b2 to be gone", Duration::from_secs(60), || async {
        (backups.get_opt("b1").await.ok()?.is_none() && backups.get_opt("b2").await.ok()?.is_none())
            .then_some(())
    })
    .await;
    let files = s3.files(BUCKET);
    assert!(
        files.contains(&key) && files.contains(&format!("{key}.manifest.json")),
        "Retain kept b1: {files:?}"
    );
    assert!(
        !files.iter().any(|f| f.starts_with(&key2)),
        "Delete removed b2 and its manifest: {files:?}"
    );
    // The delete ran in the agent's Job (a pod), not in the operator (which
    // reaches the node's address from the host). The access log is written
    // behind the requests: wait for the lines.
    let _ = tokio::time::timeout(Duration::from_secs(20), async {
        while s3
            .requests()
            .iter()
            .filter(|r| r.operation.contains("Delete"))
            .count()
            < 2
        {
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    })
    .await;
    let requests = s3.requests();
    let deletes: Vec<_> = requests
        .iter()
        .filter(|r| r.operation.contains("Delete"))
        .collect();
    assert!(
        deletes.len() >= 2 && deletes.iter().all(|r| r.remote != NODE_IP),
        "the stored backup was deleted from a pod: {deletes:?}; all requests: {requests:?}"
    );
}

/// What a tenant who may create RedisBackups (but not read Secrets) could
/// abuse is refused before anything leaves the cluster: a Secret without
/// the `redpilot.io/allow-use` mark, and an endpoint outside the
/// operator's allow-list (`--s3-endpoints`), for a backup, a restore from a
/// bucket, and a delete. The S3 servers' access logs prove no request
/// arrived; a lent Secret and a listed endpoint still work, and the same
/// log shows their requests (so it would have seen the others).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn secrets_and_endpoints_a_tenant_names_are_checked_before_any_request() {
    let client = client().await;
    let tns = TestNamespace::new(&client, "backup-tenant", &[]).await;
    let ns = tns.name.as_str();
    let allowed = S3Server::start_on(NODE_IP, &[BUCKET]);
    let outside = S3Server::start_on(NODE_IP, &[BUCKET]);
    secret(&client, ns, "lent", ACCESS_KEY, SECRET_KEY).await;
    // The same keys, but not lent to the operator by its owner.
    let plain: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "plain"},
        "stringData": {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}
    }))
    .expect("secret");
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    secrets
        .create(&PostParams::default(), &plain)
        .await
        .expect("creating Secret plain");
    let mut opts = OperatorOptions::watching(&[ns]);
    opts.env.push((
        "REDPILOT_S3_ENDPOINTS".into(),
        format!("http://{NODE_IP}:{}", allowed.port()),
    ));
    let _op = start_operator(&client, opts).await;
    apply_redis(
        &client,
        ns,
        "src",
        json!({"mode": "Replication", "instances": 1}),
    )
    .await;
    let src = wait_ready(&client, ns, "src", READY).await;
    let primary = src.status.and_then(|s| s.primary).expect("primary");
    seed(&client, ns, "src", &primary).await;
    let jobs: Api<k8s_openapi::api::batch::v1::Job> = Api::namespaced(client.clone(), ns);
    let jobs_of = |b: &'static str| {
        let jobs = jobs.clone();
        async move {
            jobs.list(&kube::api::ListParams::default().labels(&format!("redpilot.io/backup={b}")))
                .await
                .expect("list jobs")
                .items
                .len()
        }
    };

    // An unmarked Secret: Failed, no Job, nothing reached the store.
    create_backup(
        &client,
        ns,
        "unmarked",
        json!({"redis": "src", "target": backup_target(&allowed, "plain")}),
    )
    .await;
    let b = ended(&client, ns, "unmarked", Duration::from_secs(60)).await;
    let st = b.status.expect("status");
    println!("unmarked: {:?}: {:?}", st.reason, st.message);
    assert_eq!(st.phase, Some(redpilot::api::v1alpha1::BackupPhase::Failed));
    assert_eq!(st.reason.as_deref(), Some("CredentialsNotAllowed"));
    let msg = st.message.unwrap_or_default();
    assert!(
        msg.contains("spec.target.s3.credentials.secretName: Secret plain")
            && msg.contains("redpilot.io/allow-use=\"true\""),
        "{msg}"
    );
    assert!(!msg.contains(SECRET_KEY));
    assert_eq!(st.job, None);
    assert_eq!(jobs_of("unmarked").await, 0, "no agent Job was created");

    // An endpoint outside the allow-list, with a lent Secret: the same.
    create_backup(
        &client,
        ns,
        "elsewhere",
        json!({"redis": "src", "target": backup_target(&outside, "lent")}),
    )
    .await;
    let b = ended(&client, ns, "elsewhere", Duration::from_secs(60)).await;
    let st = b.status.expect("status");
    println!("elsewhere: {:?}: {:?}", st.reason, st.message);
    assert_eq!(st.reason.as_deref(), Some("EndpointNotAllowed"));
    let msg = st.message.unwrap_or_default();
    assert!(
        msg.contains(&format!("spec.target.s3: endpoint {}", outside.endpoint()))
            && msg.contains("--s3-endpoints"),
        "{msg}"
    );
    assert_eq!(jobs_of("elsewhere").await, 0, "no agent Job was created");

    // A restore from a bucket with the unmarked Secret: Degraded, no
    // StatefulSet, no request.
    apply_redis(
        &client,
        ns,
        "restore-plain",
        json!({"mode": "Replication", "instances": 1,
        "bootstrap": {"fromBackup": {"s3": s3_target(&allowed, "plain"), "key": "e2e/any.rdb"}}}),
    )
    .await;
    let degraded = wait_for(
        "restore-plain to be Degraded",
        Duration::from_secs(60),
        || async {
            let r = redis_api(&client, ns).get("restore-plain").await.ok()?;
            r.status?.conditions.into_iter().find(|c| {
                c.type_ == "Degraded" && c.status == "True" && c.reason == "CredentialsNotAllowed"
            })
        },
    )
    .await;
    println!("restore-plain: {}", degraded.message);
    assert!(
        degraded
            .message
            .contains("spec.bootstrap.fromBackup.s3.credentials.secretName: Secret plain"),
        "{}",
        degraded.message
    );
    let sts: Api<k8s_openapi::api::apps::v1::StatefulSet> = Api::namespaced(client.clone(), ns);
    assert!(
        sts.get_opt("restore-plain")
            .await
            .expect("get sts")
            .is_none(),
        "nothing was created"
    );

    assert_eq!(
        allowed.requests().len(),
        0,
        "nothing reached the listed store: {:?}",
        allowed.requests()
    );
    assert_eq!(
        outside.requests().len(),
        0,
        "nothing reached the other store: {:?}",
        outside.requests()
    );

    // The control: a lent Secret and a listed endpoint work, and the log
    // sees the agent's requests.
    create_backup(&client, ns, "good",
        json!({"redis": "src", "target": backup_target(&allowed, "lent"), "deletionPolicy": "Delete"})).await;
    let b = ended(&client, ns, "good", Duration::from_secs(120)).await;
    let st = b.status.expect("status");
    assert_eq!(
        st.phase,
        Some(redpilot::api::v1alpha1::BackupPhase::Completed),
        "{st:?}"
    );
    let key = st.key.expect("key");
    // The access log is written behind the requests: wait for them. Every
    // request it holds then is the good backup's (the refused ones, made
    // before, would be there too).
    let deadline = Instant::now() + Duration::from_secs(20);
    let logged = loop {
        let r = allowed.requests();
        if r.iter().any(|r| r.key.ends_with(".manifest.json")) {
            break r;
        }
        assert!(
            Instant::now() < deadline,
            "the manifest's upload is not in the access log after 20 s: {r:?}\n{}",
            allowed.access_log()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let ops: Vec<String> = logged
        .iter()
        .map(|r| format!("{} {}", r.operation, r.key))
        .collect();
    println!("good: stored {key}; the store logged {ops:?}");
    assert!(
        logged.iter().all(|r| r.key.contains("/good-")),
        "only the lent, listed backup reached the store: {ops:?}"
    );
    assert_eq!(
        outside.requests().len(),
        0,
        "nothing reached the other store"
    );

    // The owner takes the mark back: deleting the backup leaves the
    // stored object, says why, and sends nothing.
    secrets
        .patch(
            "lent",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"redpilot.io/allow-use": null}}})),
        )
        .await
        .expect("unlabel");
    let before = allowed.requests().len();
    let backups: Api<RedisBackup> = Api::namespaced(client.clone(), ns);
    backups
        .delete("good", &DeleteParams::default())
        .await
        .expect("delete good");
    wait_for("good to be gone", Duration::from_secs(60), || async {
        backups.get_opt("good").await.ok()?.is_none().then_some(())
    })
    .await;
    let events = recent_events(&client, ns, 40).await;
    assert!(
        events.contains("RedisBackup/good StoredBackupNotDeleted")
            && events.contains("CredentialsNotAllowed"),
        "{events}"
    );
    assert!(
        allowed.files(BUCKET).contains(&key),
        "the stored backup remains"
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        allowed.requests().len(),
        before,
        "no request after the mark was taken back"
    );
}

/// Two schedules every minute, one with `keepLast: 1`, one with `maxAge:
/// 1m`: each runs twice, and retention deletes each one's first backup and
/// its stored object once the second completes. A third, suspended as soon
/// as its first run appears, starts no more runs while the others run
/// again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_schedule_runs_twice_and_prunes_by_retention() {
    use redpilot::api::v1alpha1::{BackupPhase, RedisBackupSchedule};
    let client = client().await;
    let tns = TestNamespace::new(&client, "schedule", &[]).await;
    let ns = tns.name.as_str();
    let s3 = S3Server::start_on(NODE_IP, &[BUCKET]);
    secret(&client, ns, "s3", ACCESS_KEY, SECRET_KEY).await;
    let _op = start_operator(&client, OperatorOptions::watching(&[ns])).await;
    apply_redis(&client, ns, "cache", json!({"mode": "Standalone"})).await;
    wait_ready(&client, ns, "cache", READY).await;
    seed(&client, ns, "cache", "cache-0").await;

    let schedules: Api<RedisBackupSchedule> = Api::namespaced(client.clone(), ns);
    let names = ["every-minute", "young"];
    // The two with retention, and "paused" (suspended once its first run
    // appears), which keeps the defaults.
    for (name, extra) in [
        (
            names[0],
            json!({"timeZone": "Europe/Paris", "retention": {"keepLast": 1}}),
        ),
        (
            names[1],
            json!({"timeZone": "Europe/Paris", "retention": {"maxAge": "1m"}}),
        ),
        ("paused", json!({})),
    ] {
        let mut spec = json!({"redis": "cache", "schedule": "* * * * *",
                              "target": backup_target(&s3, "s3")});
        for (k, v) in extra.as_object().into_iter().flatten() {
            spec[k] = v.clone();
        }
        let s = json!({"apiVersion": "redpilot.io/v1alpha1", "kind": "RedisBackupSchedule",
            "metadata": {"name": name}, "spec": spec});
        schedules
            .patch(name, &PatchParams::apply("e2e").force(), &Patch::Apply(&s))
            .await
            .expect("creating the schedule");
    }
    let backups: Api<RedisBackup> = Api::namespaced(client.clone(), ns);
    let lp =
        |s: &str| kube::api::ListParams::default().labels(&format!("redpilot.io/schedule={s}"));
    let listed = |s: &'static str| {
        let backups = backups.clone();
        async move {
            let mut n: Vec<String> = backups
                .list(&lp(s))
                .await
                .expect("list")
                .items
                .iter()
                .map(kube::ResourceExt::name_any)
                .collect();
            n.sort();
            n
        }
    };
    // "paused" once suspended: its runs then, and the first due time after.
    let mut suspended: Option<(Vec<String>, chrono::DateTime<chrono::Utc>)> = None;
    // Per schedule: (backup, key) of each completed run, in order.
    let mut seen: Vec<Vec<(String, String)>> = vec![Vec::new(); names.len()];
    let mut pruned = [false; 2];
    let start = Instant::now();
    // Two completed runs each, the first pruned with its object.
    while pruned.iter().any(|p| !p) {
        if suspended.is_none() && !listed("paused").await.is_empty() {
            schedules
                .patch(
                    "paused",
                    &PatchParams::default(),
                    &Patch::Merge(&json!({"spec": {"suspend": true}})),
                )
                .await
                .expect("suspend");
            // A run whose pass had begun before the suspend was seen may
            // still appear: the names are taken once it is observed.
            tokio::time::sleep(Duration::from_secs(2)).await;
            let now = chrono::Utc::now();
            // "* * * * *" is due at every minute boundary.
            let due = now + chrono::Duration::seconds(60 - now.timestamp().rem_euclid(60));
            println!("paused: suspended at {now}; next due time {due}");
            suspended = Some((listed("paused").await, due));
        }
        for (i, name) in names.iter().enumerate() {
            let items = backups.list(&lp(name)).await.expect("list").items;
            for b in &items {
                let st = b.status.clone().unwrap_or_default();
                let bname = kube::ResourceExt::name_any(b);
                if st.phase == Some(BackupPhase::Completed)
                    && let Some(k) = st.key
                    && !seen[i].iter().any(|(n, _)| *n == bname)
                {
                    println!(
                        "{name}: run {bname} completed at {:.0} s: {k}",
                        start.elapsed().as_secs_f64()
                    );
                    seen[i].push((bname, k));
                }
            }
            if seen[i].len() >= 2 && !pruned[i] {
                let first = &seen[i][0];
                let gone = backups.get_opt(&first.0).await.expect("get").is_none();
                let files = s3.files(BUCKET);
                if gone && !files.iter().any(|f| f.starts_with(&first.1)) {
                    assert!(
                        files.contains(&seen[i][1].1),
                        "{name}: the newest backup is kept: {files:?}"
                    );
                    println!(
                        "{name}: two runs, the first pruned with its object, {:.0} s after the schedules were created",
                        start.elapsed().as_secs_f64()
                    );
                    pruned[i] = true;
                }
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(240),
            "two runs and a prune for each schedule within 240 s; seen {seen:?}\n{}",
            recent_events(&client, ns, 20).await
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    for (i, name) in names.iter().enumerate() {
        let st = schedules
            .get(name)
            .await
            .expect("get")
            .status
            .expect("status");
        assert!(st.kept >= 1, "{name}: {st:?}");
        assert!(
            st.last_successful_time.is_some() && st.next_schedule_time.is_some(),
            "{name}: {st:?}"
        );
        assert!(
            st.last_runs.iter().all(|r| r.name != seen[i][0].0),
            "{name}: the pruned run is not listed: {st:?}"
        );
    }
    let events = recent_events(&client, ns, 120).await;
    assert!(
        events.contains("BackupsPruned") && events.contains("BackupScheduled"),
        "{events}"
    );

    // Suspended: its due times pass without a run (the names compared),
    // past the first one after the suspend with the time a run would take
    // to appear.
    let (before, due) = suspended.expect("the paused schedule's first run appeared");
    let watch_until = due + chrono::Duration::seconds(10);
    if let Ok(left) = (watch_until - chrono::Utc::now()).to_std() {
        tokio::time::sleep(left).await;
    }
    let after = listed("paused").await;
    let new: Vec<&String> = after.iter().filter(|n| !before.contains(n)).collect();
    println!(
        "paused: {} run(s) before the suspend, none after it through {due} (checked at {})",
        before.len(),
        chrono::Utc::now()
    );
    assert!(
        new.is_empty(),
        "a suspended schedule started {new:?} (before: {before:?})"
    );
}

/// A backup to a PersistentVolumeClaim: stored on the volume by the Job,
/// restored from it into a new Redis, and deleted from it (by a Job) with
/// its RedisBackup (`deletionPolicy: Delete`). A missing claim fails by
/// name.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn backup_to_a_volume_and_restore_from_it() {
    use k8s_openapi::api::core::v1::PersistentVolumeClaim;
    let client = client().await;
    let tns = TestNamespace::new(&client, "volbackup", &[]).await;
    let ns = tns.name.as_str();
    let _op = start_operator(&client, OperatorOptions::watching(&[ns])).await;
    support::operator::create_claim(&client, ns, "backups").await;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    apply_redis(&client, ns, "src", json!({"mode": "Standalone"})).await;
    wait_ready(&client, ns, "src", READY).await;
    seed(&client, ns, "src", "src-0").await;

    let target = json!({"volume": {"claimName": "backups", "path": "redis"}});
    create_backup(
        &client,
        ns,
        "vb",
        json!({"redis": "src", "target": target, "deletionPolicy": "Delete"}),
    )
    .await;
    create_backup(
        &client,
        ns,
        "no-claim",
        json!({"redis": "src", "target": {"volume": {"claimName": "absent"}}}),
    )
    .await;
    let vb = ended(&client, ns, "vb", Duration::from_secs(120)).await;
    let st = vb.status.clone().expect("status");
    assert_eq!(
        st.phase,
        Some(redpilot::api::v1alpha1::BackupPhase::Completed),
        "{st:?}"
    );
    let key = st.key.clone().expect("key");
    assert_eq!(
        st.location.as_deref(),
        Some(format!("pvc://backups/redis/{key}").as_str())
    );
    let uid = claims
        .get("backups")
        .await
        .expect("claim")
        .metadata
        .uid
        .expect("uid");
    let dir = support::repo_root().join(format!(".dev/localnode/volumes/pvc-{uid}/redis"));
    let stored = std::fs::read(dir.join(&key))
        .unwrap_or_else(|e| panic!("{}: {e}", dir.join(&key).display()));
    assert_eq!(st.sha256.as_deref(), Some(sha256_hex(&stored).as_str()));
    assert!(dir.join(format!("{key}.manifest.json")).exists());
    println!(
        "volume backup: {} bytes, {} keys at {}",
        stored.len(),
        st.keys.unwrap_or(0),
        st.location.unwrap_or_default()
    );
    let nc = ended(&client, ns, "no-claim", Duration::from_secs(60))
        .await
        .status
        .expect("status");
    assert_eq!(nc.reason.as_deref(), Some("ClaimNotFound"), "{nc:?}");
    assert!(
        nc.message
            .as_deref()
            .is_some_and(|m| m.contains("spec.target.volume.claimName")),
        "{nc:?}"
    );

    apply_redis(
        &client,
        ns,
        "restored",
        json!({"mode": "Standalone", "bootstrap": {"fromBackup": {"backup": "vb"}}}),
    )
    .await;
    wait_ready(&client, ns, "restored", READY).await;
    assert_eq!(
        dbsize(&client, ns, "restored", "restored-0").await,
        st.keys.expect("keys")
    );
    println!("restored from the volume: {} keys", st.keys.unwrap_or(0));

    // A Standalone without storage: a re-created pod starts empty, it
    // never loads the old backup again (deleted keys would come back).
    let redis = redis_api(&client, ns);
    wait_for(
        "the bootstrap of restored to be done",
        Duration::from_secs(60),
        || async {
            let r = redis.get("restored").await.ok()?;
            r.status?.bootstrap?.done.then_some(())
        },
    )
    .await;
    let cms: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(client.clone(), ns);
    wait_for(
        "the ConfigMap to record the finished bootstrap",
        Duration::from_secs(60),
        || async {
            let cm = cms.get("restored-config").await.ok()?;
            cm.data?.get("bootstrapped").cloned()
        },
    )
    .await;
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), ns);
    let old_uid = pods
        .get("restored-0")
        .await
        .expect("pod")
        .metadata
        .uid
        .expect("uid");
    pods.delete("restored-0", &DeleteParams::default())
        .await
        .expect("delete restored-0");
    wait_for(
        "restored-0 to be re-created",
        Duration::from_secs(60),
        || async {
            let p = pods.get("restored-0").await.ok()?;
            (p.metadata.uid.as_deref() != Some(old_uid.as_str())).then_some(())
        },
    )
    .await;
    wait_ready(&client, ns, "restored", READY).await;
    let after = wait_for("restored-0 to answer", Duration::from_secs(60), || async {
        let pw = redis_password(&client, ns, "restored").await;
        let mut node = connect_pod(&client, ns, "restored-0", &pw).await.ok()?;
        node.query::<i64>("DBSIZE", &redis::cmd("DBSIZE"))
            .await
            .ok()
    })
    .await;
    // The node reports the init container's end in the pod's status a
    // moment after the server answers; wait for the message it left.
    let said = wait_for(
        "restored-0's restore container to report how it ended",
        Duration::from_secs(30),
        || async {
            let pod = pods.get("restored-0").await.ok()?;
            let statuses = pod.status?.init_container_statuses?;
            redpilot::controller::agent::termination(&statuses, "restore").and_then(|(_, m)| m)
        },
    )
    .await;
    assert_eq!(
        after, 0,
        "a re-created Standalone without storage starts empty; the restore said: {said}"
    );
    assert!(said.contains("skipped"), "{said}");
    println!("a re-created pod of the bootstrapped Standalone started empty: {said}");

    // The same Redis 7.0 backup (RDB 10) restored into Valkey 8.1, which
    // reads Redis files up to RDB 11.
    apply_redis(
        &client,
        ns,
        "to-valkey",
        json!({"mode": "Standalone", "engine": "Valkey", "version": "8.1",
               "bootstrap": {"fromBackup": {"backup": "vb"}}}),
    )
    .await;
    wait_ready(&client, ns, "to-valkey", READY).await;
    let pw = redis_password(&client, ns, "to-valkey").await;
    let mut node = connect_pod(&client, ns, "to-valkey-0", &pw)
        .await
        .expect("connect");
    let info = node
        .info_section("server")
        .await
        .expect("INFO server")
        .server;
    assert_eq!(
        info.engine,
        Some(redpilot::redis::info::EngineKind::Valkey),
        "{info:?}"
    );
    assert_eq!(
        dbsize(&client, ns, "to-valkey", "to-valkey-0").await,
        st.keys.expect("keys")
    );
    let v: Option<String> = node
        .query("GET", redis::cmd("GET").arg("seed:7"))
        .await
        .expect("GET");
    assert_eq!(
        v.as_deref(),
        Some(format!("value-7-{}", 7 * 7919 % 10007).as_str())
    );
    println!(
        "the Redis backup restored into Valkey {}: {} keys",
        info.version.map(|v| v.to_string()).unwrap_or_default(),
        st.keys.unwrap_or(0)
    );

    let backups: Api<RedisBackup> = Api::namespaced(client.clone(), ns);
    backups
        .delete("vb", &DeleteParams::default())
        .await
        .expect("delete vb");
    wait_for("vb to be gone", Duration::from_secs(90), || async {
        backups.get_opt("vb").await.ok()?.is_none().then_some(())
    })
    .await;
    assert!(
        !dir.join(&key).exists() && !dir.join(format!("{key}.manifest.json")).exists(),
        "the delete Job removed the backup"
    );
    println!("deleted from the volume with its RedisBackup");
}

/// Faults around a backup: the S3 server down when the Job starts (the
/// agent fails, the Job retries with backoff, and the retry after the
/// server is back completes the backup) and the operator killed while the
/// backup runs (a new operator finds the running Job and completes the
/// status). The Redis keeps serving a writer throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn backups_survive_an_unreachable_store_and_an_operator_restart() {
    use k8s_openapi::api::batch::v1::Job;
    let client = client().await;
    let tns = TestNamespace::new(&client, "backupfault", &[]).await;
    let ns = tns.name.as_str();
    let mut s3 = S3Server::start_on(NODE_IP, &[BUCKET]);
    secret(&client, ns, "s3", ACCESS_KEY, SECRET_KEY).await;
    let opts = OperatorOptions::watching(&[ns]).crash_lease();
    let mut op = start_operator(&client, opts.clone()).await;
    apply_redis(
        &client,
        ns,
        "src",
        json!({"mode": "Replication", "instances": 2}),
    )
    .await;
    let src = wait_ready(&client, ns, "src", READY).await;
    let primary = src.status.and_then(|s| s.primary).expect("primary");
    seed(&client, ns, "src", &primary).await;
    let pw = redis_password(&client, ns, "src").await;
    let writer = Writer::start(&client, ns, "src", &pw, "f", 0);

    // 1. The store is down when the Job starts; back during the backoff.
    s3.kill();
    let t = Instant::now();
    create_backup(
        &client,
        ns,
        "retried",
        json!({"redis": "src", "target": backup_target(&s3, "s3")}),
    )
    .await;
    let jobs: Api<Job> = Api::namespaced(client.clone(), ns);
    let retried_job = job_of(&client, ns, "retried").await;
    wait_for(
        "the first attempt to fail",
        Duration::from_secs(60),
        || async {
            let j = jobs.get_opt(&retried_job).await.ok()??;
            (j.status?.failed? >= 1).then_some(())
        },
    )
    .await;
    println!(
        "first attempt failed {:.1} s after the backup was created (store down)",
        t.elapsed().as_secs_f64()
    );
    s3.restart();
    let b = ended(&client, ns, "retried", Duration::from_secs(120)).await;
    let st = b.status.expect("status");
    assert_eq!(
        st.phase,
        Some(redpilot::api::v1alpha1::BackupPhase::Completed),
        "{st:?}"
    );
    let j = jobs.get(&retried_job).await.expect("job");
    let failed = j.status.and_then(|s| s.failed).unwrap_or(0);
    assert!(failed >= 1);
    println!(
        "completed on a retry {:.1} s after creation, after {failed} failed attempt(s)",
        t.elapsed().as_secs_f64()
    );

    // 2. The operator killed while the backup runs.
    create_backup(
        &client,
        ns,
        "orphaned",
        json!({"redis": "src", "target": backup_target(&s3, "s3")}),
    )
    .await;
    let orphaned_job = job_of(&client, ns, "orphaned").await;
    op.kill();
    let t = Instant::now();
    // The Job goes on without the operator.
    wait_for("the Job to complete", Duration::from_secs(60), || async {
        let j = jobs.get_opt(&orphaned_job).await.ok()??;
        (j.status?.succeeded? >= 1).then_some(())
    })
    .await;
    let b = Api::<RedisBackup>::namespaced(client.clone(), ns)
        .get("orphaned")
        .await
        .expect("get");
    assert_eq!(
        b.status.and_then(|s| s.phase),
        Some(redpilot::api::v1alpha1::BackupPhase::Running)
    );
    let mut op2 = support::operator::spawn_operator(&client, opts.clone().named("op-again")).await;
    let b = ended(&client, ns, "orphaned", Duration::from_secs(60)).await;
    let st = b.status.expect("status");
    assert_eq!(
        st.phase,
        Some(redpilot::api::v1alpha1::BackupPhase::Completed),
        "{st:?}"
    );
    assert!(st.sha256.is_some() && st.keys.is_some());
    println!(
        "a new operator completed the status {:.1} s after the old one was killed",
        t.elapsed().as_secs_f64()
    );

    // 3. Backups asked for while no operator runs: the next operator may
    // look at them before its cache of the Redis is filled (the harness's
    // seed 12 met it after an operator kill), and must not fail them as if
    // their Redis did not exist.
    op2.kill();
    let asked: Vec<String> = (1..=3).map(|i| format!("asked-while-down-{i}")).collect();
    for name in &asked {
        create_backup(
            &client,
            ns,
            name,
            json!({"redis": "src", "target": backup_target(&s3, "s3")}),
        )
        .await;
    }
    // The next one's cache of Redis fills 5 s late (a test point), so it
    // looks at the backups first.
    let mut late = opts.named("op-third");
    late.env
        .push(("REDPILOT_FAILPOINTS".into(), "redis-cache-late".into()));
    let _op3 = support::operator::spawn_operator(&client, late).await;
    for name in &asked {
        let b = ended(&client, ns, name, Duration::from_secs(120)).await;
        let st = b.status.expect("status");
        assert_eq!(
            st.phase,
            Some(redpilot::api::v1alpha1::BackupPhase::Completed),
            "{name}: {st:?}"
        );
    }
    println!("3 backups asked for while no operator ran: all Completed");

    let tally = writer.stop().await;
    assert_eq!(tally.failed, 0, "the Redis kept serving throughout");
    println!(
        "writer: {} writes acknowledged, 0 failed",
        tally.acked.len()
    );
}

/// Two backups whose names share their first 56 characters (as every run
/// of a schedule with a long name does) each get a Job of their own,
/// controlled by them, and each stores its own object: both Completed, each
/// `location` naming an object that exists and whose manifest names it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn backups_with_a_long_common_prefix_never_share_a_job() {
    use k8s_openapi::api::batch::v1::Job;
    use redpilot::api::v1alpha1::BackupPhase;
    let client = client().await;
    let tns = TestNamespace::new(&client, "backupnames", &[]).await;
    let ns = tns.name.as_str();
    let s3 = S3Server::start_on(NODE_IP, &[BUCKET]);
    secret(&client, ns, "s3", ACCESS_KEY, SECRET_KEY).await;
    let _op = start_operator(&client, OperatorOptions::watching(&[ns])).await;
    apply_redis(&client, ns, "cache", json!({"mode": "Standalone"})).await;
    wait_ready(&client, ns, "cache", READY).await;
    seed(&client, ns, "cache", "cache-0").await;

    // 58 characters, the first 57 in common.
    let base = "nightly-backup-of-the-cache-in-the-shop-namespace-x";
    let names = [format!("{base}-0001-a"), format!("{base}-0001-b")];
    assert_eq!(names[0][..57], names[1][..57]);
    for n in &names {
        assert_eq!(n.len(), 58, "{n}");
        create_backup(
            &client,
            ns,
            n,
            json!({"redis": "cache", "target": backup_target(&s3, "s3")}),
        )
        .await;
    }
    let jobs: Api<Job> = Api::namespaced(client.clone(), ns);
    let mut seen_jobs = Vec::new();
    let mut seen_keys = Vec::new();
    for n in &names {
        let b = ended(&client, ns, n, Duration::from_secs(120)).await;
        let uid = b.metadata.uid.clone().expect("uid");
        let st = b.status.clone().expect("status");
        assert_eq!(
            st.phase,
            Some(BackupPhase::Completed),
            "{n}: {st:?}\n{}",
            recent_events(&client, ns, 20).await
        );
        let job = st.job.clone().expect("job");
        assert!(job.len() <= 63, "{job}");
        let j = jobs.get(&job).await.expect("the backup's Job");
        let controller = j
            .metadata
            .owner_references
            .unwrap_or_default()
            .into_iter()
            .find(|o| o.controller == Some(true))
            .expect("a controller owner reference");
        assert_eq!(
            (controller.name.as_str(), controller.uid.as_str()),
            (n.as_str(), uid.as_str()),
            "Job {job}"
        );
        let key = st.key.clone().expect("key");
        let files = s3.files(BUCKET);
        assert!(
            files.contains(&key),
            "{n} is Completed but {key} was never written: {files:?}"
        );
        let manifest: Value = serde_json::from_slice(
            &std::fs::read(s3.bucket_dir(BUCKET).join(format!("{key}.manifest.json")))
                .expect("the manifest"),
        )
        .expect("manifest json");
        assert_eq!(manifest["key"], json!(key), "{n}");
        println!("{n}: Job {job}, stored {key}");
        seen_jobs.push(job);
        seen_keys.push(key);
    }
    assert_ne!(seen_jobs[0], seen_jobs[1], "the two backups shared a Job");
    assert_ne!(seen_keys[0], seen_keys[1]);
}

/// A backup whose pod cannot start fails instead of running for ever, and
/// a schedule is not blocked by it:
///
/// - the agent's image cannot be pulled: Failed, `ImagePullFailed`, the
///   message naming the image, and its Job stopped (no pod left waiting);
/// - a schedule every minute whose backups go to a claim that never binds
///   (the pod stays unschedulable) with `timeoutSeconds: 70`: the first run
///   is still Running when the next is due (skipped, `RunSkipped`), then
///   its Job's deadline fails it (`DeadlineExceeded`), and a later run
///   starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_backup_that_cannot_start_fails_and_frees_its_schedule() {
    use k8s_openapi::api::batch::v1::Job;
    use redpilot::api::v1alpha1::{BackupPhase, RedisBackupSchedule};
    let client = client().await;
    let tns = TestNamespace::new(&client, "backupstuck", &[]).await;
    let ns = tns.name.as_str();
    let mut opts = OperatorOptions::watching(&[ns]);
    // No image of the local node: the agent's pod waits in ErrImagePull.
    let missing_image = "redpilot-test/no-such-agent:1";
    opts.env
        .push(("OPERATOR_IMAGE".into(), missing_image.into()));
    let _op = start_operator(&client, opts).await;
    // The metrics sidecar runs the operator's image too: off here.
    apply_redis(
        &client,
        ns,
        "cache",
        json!({"mode": "Standalone", "monitoring": {"exporter": false}}),
    )
    .await;
    wait_ready(&client, ns, "cache", READY).await;
    support::operator::create_claim(&client, ns, "backups").await;
    let never: k8s_openapi::api::core::v1::PersistentVolumeClaim = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "never-bound"},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "redpilot-test-no-such-class",
                 "resources": {"requests": {"storage": "1Gi"}}}
    }))
    .expect("claim");
    Api::<k8s_openapi::api::core::v1::PersistentVolumeClaim>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &never)
        .await
        .expect("creating the claim that never binds");

    // 2. A schedule whose first run cannot be scheduled: made first, so
    // its first minute boundary passes while step 1 runs (the two backups
    // have nothing in common but the Redis).
    let schedules: Api<RedisBackupSchedule> = Api::namespaced(client.clone(), ns);
    let s = json!({"apiVersion": "redpilot.io/v1alpha1", "kind": "RedisBackupSchedule",
        "metadata": {"name": "stuck"},
        "spec": {"redis": "cache", "schedule": "* * * * *", "timeoutSeconds": 70,
                 "target": {"volume": {"claimName": "never-bound"}}}});
    schedules
        .patch(
            "stuck",
            &PatchParams::apply("e2e").force(),
            &Patch::Apply(&s),
        )
        .await
        .expect("creating the schedule");
    let backups: Api<RedisBackup> = Api::namespaced(client.clone(), ns);
    let lp = kube::api::ListParams::default().labels("redpilot.io/schedule=stuck");
    let start = Instant::now();

    // 1. The image cannot be pulled.
    let t = Instant::now();
    create_backup(
        &client,
        ns,
        "no-image",
        json!({"redis": "cache", "target": {"volume": {"claimName": "backups"}}}),
    )
    .await;
    let job = job_of(&client, ns, "no-image").await;
    let b = ended(&client, ns, "no-image", Duration::from_secs(120)).await;
    let st = b.status.expect("status");
    println!(
        "no-image: {:?} {:?} after {:.0} s: {}",
        st.phase,
        st.reason,
        t.elapsed().as_secs_f64(),
        st.message.clone().unwrap_or_default()
    );
    assert_eq!(st.phase, Some(BackupPhase::Failed), "{st:?}");
    assert_eq!(st.reason.as_deref(), Some("ImagePullFailed"), "{st:?}");
    assert!(
        st.message
            .as_deref()
            .is_some_and(|m| m.contains(missing_image)),
        "{st:?}"
    );
    let jobs: Api<Job> = Api::namespaced(client.clone(), ns);
    wait_for(
        "the stuck Job to be stopped (Failed, no pod left)",
        Duration::from_secs(30),
        || async {
            let st = jobs.get(&job).await.ok()?.status?;
            let failed = st
                .conditions?
                .iter()
                .any(|c| c.type_ == "Failed" && c.status == "True");
            (failed && st.active.unwrap_or(0) == 0).then_some(())
        },
    )
    .await;

    // 2. (below) The schedule's first run waits for its minute boundary
    // meanwhile.
    let first = wait_for("the first run", Duration::from_secs(75), || async {
        let items = backups.list(&lp).await.ok()?.items;
        items.first().map(kube::ResourceExt::name_any)
    })
    .await;
    println!(
        "first run {first} at {:.0} s",
        start.elapsed().as_secs_f64()
    );
    let failed = wait_for(
        "the first run to fail by its deadline",
        Duration::from_secs(160),
        || async {
            let b = backups.get(&first).await.ok()?;
            let st = b.status?;
            (st.phase == Some(BackupPhase::Failed)).then_some(st)
        },
    )
    .await;
    println!(
        "{first}: {:?} at {:.0} s: {}",
        failed.reason,
        start.elapsed().as_secs_f64(),
        failed.message.clone().unwrap_or_default()
    );
    assert_eq!(
        failed.reason.as_deref(),
        Some("DeadlineExceeded"),
        "{failed:?}"
    );
    assert!(
        failed
            .message
            .as_deref()
            .is_some_and(|m| m.contains("70 s") && m.contains("spec.timeoutSeconds")),
        "{failed:?}"
    );
    let st = schedules
        .get("stuck")
        .await
        .expect("schedule")
        .status
        .expect("status");
    assert!(st.skipped >= 1, "a run was due while the first ran: {st:?}");
    let events = recent_events(&client, ns, 40).await;
    assert!(
        events.contains("RunSkipped") && events.contains(&format!("{first} is still running")),
        "{events}"
    );
    let next = wait_for(
        "a run after the failed one",
        Duration::from_secs(75),
        || async {
            let items = backups.list(&lp).await.ok()?.items;
            items
                .iter()
                .map(kube::ResourceExt::name_any)
                .find(|n| *n != first)
        },
    )
    .await;
    println!(
        "the schedule started {next} at {:.0} s",
        start.elapsed().as_secs_f64()
    );
}

/// A Redis deleted with its volumes retained (the default) and re-created
/// under the same name from a backup taken before 2,000 more writes: the
/// retained claims come back with those writes, and every instance must
/// serve the backup's data, not them. Ordinal 0 is restored and promoted
/// whatever the others' offsets say, and they resync from it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restore_into_retained_volumes_serves_the_backup() {
    let client = client().await;
    let tns = TestNamespace::new(&client, "retained", &[]).await;
    let ns = tns.name.as_str();
    let _op = start_operator(&client, OperatorOptions::watching(&[ns])).await;
    support::operator::create_claim(&client, ns, "backups").await;
    let spec = json!({"mode": "Replication", "instances": 3, "storage": {"size": "1Gi"}});
    apply_redis(&client, ns, "keep", spec.clone()).await;
    let r = wait_ready(&client, ns, "keep", READY).await;
    let primary = r.status.and_then(|s| s.primary).expect("primary");
    seed(&client, ns, "keep", &primary).await;
    let target = json!({"volume": {"claimName": "backups", "path": "redis"}});
    create_backup(
        &client,
        ns,
        "before",
        json!({"redis": "keep", "target": target}),
    )
    .await;
    let st = ended(&client, ns, "before", Duration::from_secs(120))
        .await
        .status
        .expect("status");
    assert_eq!(
        st.phase,
        Some(redpilot::api::v1alpha1::BackupPhase::Completed),
        "{st:?}"
    );
    let keys = st.keys.expect("keys");

    // 2,000 writes after the backup, on every instance.
    let pw = redis_password(&client, ns, "keep").await;
    let mut node = connect_pod(&client, ns, &primary, &pw)
        .await
        .expect("connect");
    let mut mset = redis::cmd("MSET");
    for i in 0..2000 {
        mset.arg(format!("after:{i}")).arg(i);
    }
    node.query::<()>("MSET", &mset).await.expect("MSET");
    let acked: i64 = node
        .query("WAIT", redis::cmd("WAIT").arg(2).arg(5000))
        .await
        .expect("WAIT");
    assert_eq!(acked, 2, "both replicas have the later writes");
    drop(node);

    let redis = redis_api(&client, ns);
    redis
        .delete("keep", &DeleteParams::default())
        .await
        .expect("delete keep");
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), ns);
    wait_for("keep and its pods to be gone", READY, || async {
        let gone = redis.get_opt("keep").await.ok()?.is_none();
        let none = pods
            .list(&kube::api::ListParams::default().labels("app.kubernetes.io/instance=keep"))
            .await
            .ok()?
            .items
            .is_empty();
        (gone && none).then_some(())
    })
    .await;
    let claims: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> =
        Api::namespaced(client.clone(), ns);
    for i in 0..3 {
        let name = format!("data-keep-{i}");
        assert!(
            claims.get_opt(&name).await.expect("claim").is_some(),
            "{name} is retained"
        );
    }

    let mut again = spec.clone();
    again["bootstrap"] = json!({"fromBackup": {"backup": "before"}});
    apply_redis(&client, ns, "keep", again).await;
    let t = Instant::now();
    let r = wait_ready(&client, ns, "keep", READY).await;
    let status = r.status.clone().expect("status");
    assert_eq!(status.primary.as_deref(), Some("keep-0"), "{status:?}");
    let pw = redis_password(&client, ns, "keep").await;
    for i in 0..3 {
        let pod = format!("keep-{i}");
        let (size, later) = wait_for(
            &format!("{pod} to hold the backup's keys"),
            Duration::from_secs(60),
            || async {
                let mut n = connect_pod(&client, ns, &pod, &pw).await.ok()?;
                let size: i64 = n.query("DBSIZE", &redis::cmd("DBSIZE")).await.ok()?;
                let later: Option<String> = n
                    .query("GET", redis::cmd("GET").arg("after:7"))
                    .await
                    .ok()?;
                let info: String = n
                    .query("INFO", redis::cmd("INFO").arg("replication"))
                    .await
                    .ok()?;
                let synced = i == 0 || info.contains("master_link_status:up");
                synced.then_some((size, later))
            },
        )
        .await;
        assert_eq!(
            (size, later),
            (keys, None),
            "{pod} serves the backup ({keys} keys), not the retained volume's later writes"
        );
    }
    let bs = status.bootstrap.clone().expect("status.bootstrap");
    wait_for(
        "status.bootstrap to be done",
        Duration::from_secs(60),
        || async {
            let b = redis.get("keep").await.ok()?.status?.bootstrap?;
            (b.done && b.sha256 == st.sha256).then_some(())
        },
    )
    .await;
    let events = recent_events(&client, ns, 40).await;
    assert!(
        events.contains("Bootstrapped") && events.contains("keep-0 serves as primary"),
        "{events}"
    );
    println!(
        "re-created over retained claims: Ready in {:.1}s, all 3 instances hold the backup's {keys} keys and none of the 2,000 later ones ({})",
        t.elapsed().as_secs_f64(),
        bs.location
    );
}

/// The claim `backups` and a Replication Redis `src` of `instances`, Ready,
/// under a writer that has had 200 writes acknowledged: its password and
/// the writer.
async fn src_under_a_writer(client: &Client, ns: &str, instances: i32) -> (String, Writer) {
    support::operator::create_claim(client, ns, "backups").await;
    apply_redis(
        client,
        ns,
        "src",
        json!({"mode": "Replication", "instances": instances}),
    )
    .await;
    wait_ready(client, ns, "src", READY).await;
    let pw = redis_password(client, ns, "src").await;
    let writer = Writer::start(client, ns, "src", &pw, "w", 0);
    writer.wait_progress(200, Duration::from_secs(30)).await;
    (pw, writer)
}

/// A change of `src` that only a restart applies: `tcp-backlog`.
async fn restart_only_change(client: &Client, ns: &str, backlog: u32) {
    support::operator::patch_redis(
        client,
        ns,
        "src",
        json!({"spec": {"config": {"tcp-backlog": backlog.to_string()}}}),
    )
    .await;
}

/// Backup `name` of `src` onto the claim `backups`.
async fn backup_of_src(client: &Client, ns: &str, name: &str) {
    create_backup(
        client,
        ns,
        name,
        json!({"redis": "src", "target": {"volume": {"claimName": "backups", "path": "redis"}}}),
    )
    .await;
}

/// A backup asked for while a restart-only change rolls the instances is
/// never started from an instance the roll is about to restart (the agent
/// reads the pod at its address, which the restart changes: the backup
/// failed `SourceFailed` once, found by the composition harness, seed 4).
/// It starts from an instance already on the new template, or waits for
/// one, and completes. Then the same meeting across an operator's death:
/// a restart-only change and a backup asked for while no operator runs;
/// the next operator takes the spec and restarts instances moments after
/// it starts, so the backup waits until it has (seed 7 of the harness:
/// the backup started from an instance restarted 190 ms later and failed
/// `SourceFailed`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_backup_asked_for_during_a_roll_reads_an_instance_the_roll_is_done_with() {
    use k8s_openapi::api::apps::v1::StatefulSet;
    use k8s_openapi::api::core::v1::Pod;
    let client = client().await;
    let tns = TestNamespace::new(&client, "backup-roll", &[]).await;
    let ns = tns.name.as_str();
    let opts = OperatorOptions::watching(&[ns])
        .named("backup-roll")
        .crash_lease();
    let mut op = start_operator(&client, opts.clone()).await;
    let (_, writer) = src_under_a_writer(&client, ns, 3).await;
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let revision = |p: &Pod| {
        p.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("controller-revision-hash").cloned())
    };
    // A restart-only change: every instance restarts, one at a time.
    restart_only_change(&client, ns, 600).await;
    // Half way: one instance on the new template, others still to go.
    let update = wait_for("the roll half way", Duration::from_secs(120), || async {
        let s = sets.get("src").await.ok()?;
        let update = s.status.as_ref()?.update_revision.clone()?;
        let all = support::operator::redis_pods(&client, ns, "src").await;
        let rolled = all
            .values()
            .filter(|p| revision(p).as_deref() == Some(update.as_str()))
            .filter(|p| support::operator::pod_ready(p))
            .count();
        (rolled >= 1 && rolled < all.len()).then_some(update)
    })
    .await;
    backup_of_src(&client, ns, "mid-roll").await;
    let backups: Api<RedisBackup> = Api::namespaced(client.clone(), ns);
    // Once backup `name` has its source: the source, the template revision
    // that pod runs then, and the backup's message before it started.
    let started = |name: &'static str| {
        let (backups, pods) = (&backups, &pods);
        async move {
            wait_for(
                &format!("backup {name} to start"),
                Duration::from_secs(180),
                move || async move {
                    let st = backups.get(name).await.ok()?.status?;
                    let source = st.source.clone()?;
                    let p = pods.get(&source).await.ok()?;
                    Some((source, revision(&p), st.message))
                },
            )
            .await
        }
    };
    // When it starts: its source runs the new template (the roll is done
    // with it) or it waited for one.
    let (source, at_start, waited) = started("mid-roll").await;
    let b = ended(&client, ns, "mid-roll", Duration::from_secs(180)).await;
    let st = b.status.clone().expect("status");
    println!(
        "backup asked for half way through the roll: source {source} at revision {at_start:?} \
         (the roll's {update}); {:?}, {:?} keys; message before start {waited:?}",
        st.phase, st.keys
    );
    assert_eq!(
        at_start.as_deref(),
        Some(update.as_str()),
        "the backup started from {source}, which the roll had yet to restart"
    );
    assert_eq!(
        st.phase,
        Some(redpilot::api::v1alpha1::BackupPhase::Completed),
        "{st:?}\n{}",
        recent_events(&client, ns, 20).await
    );
    wait_ready(&client, ns, "src", READY).await;

    // 2. Across an operator's death.
    op.kill();
    restart_only_change(&client, ns, 601).await;
    backup_of_src(&client, ns, "while-down").await;
    let _next = support::operator::spawn_operator(&client, opts.named("backup-roll-next")).await;
    let (source, at_start, _) = started("while-down").await;
    let b = ended(&client, ns, "while-down", Duration::from_secs(180)).await;
    let st = b.status.clone().expect("status");
    wait_ready(&client, ns, "src", READY).await;
    let last = sets
        .get("src")
        .await
        .expect("StatefulSet")
        .status
        .and_then(|s| s.update_revision);
    println!(
        "backup asked for while no operator ran, a roll pending: source {source} at revision {at_start:?} \
         (the roll's {last:?}); {:?}, {:?} keys",
        st.phase, st.keys
    );
    assert_eq!(
        at_start, last,
        "the backup started from {source}, which the new operator had yet to restart"
    );
    assert_eq!(
        st.phase,
        Some(redpilot::api::v1alpha1::BackupPhase::Completed),
        "{st:?}\n{}",
        recent_events(&client, ns, 20).await
    );
    let tally = writer.stop().await;
    assert!(
        tally.acked.len() > 200,
        "the writer wrote {} times",
        tally.acked.len()
    );
}

/// The other way round: a roll begun while a backup reads from an
/// instance waits to restart that instance until the backup ends (chaos
/// seed 35: an upgrade asked for in the same second as a backup restarted
/// its source and the backup failed `SourceFailed`). The backup's agent is
/// held with `SIGSTOP` once it runs, so the backup reads for as long as
/// the test needs; the only replica is its source and the first the roll
/// would restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_roll_waits_to_restart_the_instance_a_running_backup_reads_from() {
    use k8s_openapi::api::core::v1::Pod;
    let client = client().await;
    let tns = TestNamespace::new(&client, "backup-hold", &[]).await;
    let ns = tns.name.as_str();
    let _op = start_operator(
        &client,
        OperatorOptions::watching(&[ns]).named("backup-hold"),
    )
    .await;
    let (pw, writer) = src_under_a_writer(&client, ns, 2).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let uid = |p: &Pod| p.metadata.uid.clone().unwrap_or_default();

    backup_of_src(&client, ns, "held").await;
    let backups: Api<RedisBackup> = Api::namespaced(client.clone(), ns);
    let source = wait_for("backup held to start", Duration::from_secs(120), || async {
        backups.get("held").await.ok()?.status?.source
    })
    .await;
    assert_eq!(source, "src-1", "the backup reads the only replica");
    // Its agent: the process whose arguments name this backup's key. The
    // source waits `repl-diskless-sync-delay` (5 s) before it sends the
    // snapshot: time enough to stop the agent before it has read it.
    let pattern = format!("source-name src-1 .*{ns}/src/held-");
    let agent = wait_for(
        "the backup agent's process",
        Duration::from_secs(20),
        || async {
            let out = std::process::Command::new("pgrep")
                .args(["-f", &pattern])
                .output()
                .ok()?;
            String::from_utf8_lossy(&out.stdout)
                .split_whitespace()
                .next()
                .and_then(|p| p.parse::<u32>().ok())
        },
    )
    .await;
    support::operator::signal(agent, "-STOP");
    let before = pods.get("src-1").await.expect("src-1");
    println!("backup held reads {source}; its agent (pid {agent}) stopped");

    // A restart-only change: the roll would restart src-1 first.
    let asked = Instant::now();
    restart_only_change(&client, ns, 600).await;
    let said = wait_for(
        "the roll to say it waits for the backup",
        Duration::from_secs(60),
        || async {
            let r = redis_api(&client, ns).get("src").await.ok()?;
            let c = r
                .status?
                .conditions
                .into_iter()
                .find(|c| c.type_ == "Progressing")?;
            c.message
                .contains("waits for backup held, which is reading from it")
                .then_some(c.message)
        },
    )
    .await;
    // It keeps waiting: 15 s on, src-1 is the pod it was and the backup
    // still runs.
    tokio::time::sleep(Duration::from_secs(15)).await;
    let still = pods.get("src-1").await.expect("src-1");
    assert_eq!(
        uid(&still),
        uid(&before),
        "src-1 was restarted under the backup"
    );
    let phase = backups
        .get("held")
        .await
        .expect("held")
        .status
        .and_then(|s| s.phase);
    assert_eq!(phase, Some(redpilot::api::v1alpha1::BackupPhase::Running));
    println!(
        "{:.1} s after the change: \"{said}\"; src-1 not restarted, the backup Running",
        asked.elapsed().as_secs_f64()
    );

    // The agent goes on: the backup completes, then the roll restarts
    // src-1 and finishes, no acknowledged write lost.
    support::operator::signal(agent, "-CONT");
    let b = ended(&client, ns, "held", Duration::from_secs(120)).await;
    let st = b.status.clone().expect("status");
    assert_eq!(
        st.phase,
        Some(redpilot::api::v1alpha1::BackupPhase::Completed),
        "{st:?}\n{}",
        recent_events(&client, ns, 20).await
    );
    let rolled = wait_for("the roll to finish", READY, || async {
        let p = pods.get("src-1").await.ok()?;
        let r = redis_api(&client, ns).get("src").await.ok()?;
        (uid(&p) != uid(&before) && support::operator::is_ready(&r)).then_some(())
    });
    rolled.await;
    let tally = writer.stop().await;
    println!(
        "backup Completed ({:?} keys), then the roll restarted src-1 and finished {:.1} s after \
         the change; {} writes acknowledged",
        st.keys,
        asked.elapsed().as_secs_f64(),
        tally.acked.len(),
    );
    assert!(tally.acked.len() > 200, "the writer wrote");
    support::writer::assert_everywhere(&client, ns, "src", 2, &pw, &tally.acked).await;
}
