//! The `Redis` CRD refuses bad specs at `kubectl apply`, with a message that
//! names the field: OpenAPI types, enums and bounds, and the CEL rules of
//! `src/api/v1alpha1.rs` (cross-field rules and immutability on update).
//! Valid specs pass, defaults are filled in, and `kubectl get redis` shows the
//! printer columns.
//!
//! Needs the dev cluster (`bash dev/cluster.sh up`); installs the checked-in
//! `crds/redis.yaml`. No operator is involved.

mod support;

use kube::api::{ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use redpilot::api::v1alpha1::Redis;
use serde_json::{Value, json};
use support::operator::{crds_path, install_crds, kubectl, redis_api};
use support::{TestNamespace, client};

fn dynamic_api(client: &Client, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), ns, &ApiResource::erase::<Redis>(&()))
}

fn redis_object(name: &str, spec: Value) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "redpilot.io/v1alpha1",
        "kind": "Redis",
        "metadata": {"name": name},
        "spec": spec,
    }))
    .expect("redis json")
}

fn dry_run_post() -> PostParams {
    PostParams {
        dry_run: true,
        ..Default::default()
    }
}

/// Checks that `result` is a 422 Invalid whose message contains every
/// fragment; returns a description of the mismatch otherwise.
fn check_rejection<T: std::fmt::Debug>(
    case: &str,
    result: Result<T, kube::Error>,
    fragments: &[&str],
) -> Option<String> {
    match result {
        Ok(obj) => Some(format!("{case}: accepted, expected a rejection: {obj:?}")),
        Err(kube::Error::Api(status)) => {
            let missing: Vec<&&str> = fragments
                .iter()
                .filter(|f| !status.message.contains(**f))
                .collect();
            if status.code != 422 {
                Some(format!(
                    "{case}: expected 422 Invalid, got {} {}: {}",
                    status.code, status.reason, status.message
                ))
            } else if !missing.is_empty() {
                Some(format!(
                    "{case}: message lacks {missing:?}: {}",
                    status.message
                ))
            } else {
                println!("{case}: rejected: {}", status.message);
                None
            }
        }
        Err(e) => Some(format!("{case}: unexpected error {e}")),
    }
}

#[tokio::test]
async fn checked_in_crd_is_accepted_and_established() {
    let client = client().await;
    install_crds(&client).await;
}

/// What a user (or `make install`, or OLM) does with the file: YAML 1.1
/// parsing by kubectl must give the same schema as the Rust types.
#[tokio::test]
async fn checked_in_crd_applies_with_kubectl() {
    let _client = client().await;
    let path = crds_path();
    let out = kubectl(&[
        "apply",
        "--server-side",
        "--dry-run=server",
        "--field-manager=redpilot-tests",
        "--force-conflicts",
        "-f",
        path.to_str().expect("utf-8 path"),
    ]);
    assert!(
        out.status.success(),
        "`kubectl apply -f crds/redis.yaml` is refused:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // The API server warns of what it does not know (an integer format
    // other than int32/int64 once printed `unrecognized format "uint64"`
    // on every install): a user sees none.
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.to_lowercase().contains("warning"),
        "installing the CRDs prints warnings:\n{stderr}"
    );
    // The plain `kubectl apply -f` too. Over CRDs installed by server-side
    // apply, kubectl itself notes the missing last-applied annotation (a
    // client-side notice, not the API server's): every other warning fails.
    let out = kubectl(&[
        "apply",
        "--dry-run=server",
        "-f",
        path.to_str().expect("utf-8 path"),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let warnings: Vec<&str> = stderr
        .lines()
        .filter(|l| l.to_lowercase().contains("warning"))
        .filter(|l| !l.contains("kubectl.kubernetes.io/last-applied-configuration"))
        .collect();
    assert!(
        warnings.is_empty(),
        "`kubectl apply -f crds/redis.yaml` prints warnings:\n{}",
        warnings.join("\n")
    );
}

#[tokio::test]
async fn invalid_specs_are_rejected_with_the_field_named() {
    let client = client().await;
    install_crds(&client).await;
    let ns = TestNamespace::new(&client, "crd-invalid", &[]).await;
    let api = dynamic_api(&client, &ns.name);

    let many_keys: serde_json::Map<String, Value> =
        (0..65).map(|i| (format!("key-{i}"), json!("1"))).collect();
    let cases: Vec<(&str, Value, Vec<&str>)> = vec![
        (
            "Standalone with 3 instances",
            json!({"mode": "Standalone", "instances": 3}),
            vec!["spec.instances", "Standalone mode runs exactly 1 instance"],
        ),
        (
            "instances 0",
            json!({"mode": "Replication", "instances": 0}),
            vec!["spec.instances", "greater than or equal to 1"],
        ),
        (
            "instances 16",
            json!({"mode": "Replication", "instances": 16}),
            vec!["spec.instances", "less than or equal to 15"],
        ),
        (
            "instances not a number",
            json!({"mode": "Replication", "instances": "three"}),
            vec!["spec.instances", "integer"],
        ),
        (
            "a Cluster following another Redis",
            json!({"mode": "Cluster", "shards": 3,
                   "replicaOf": {"host": "10.0.0.9"}}),
            vec![
                "spec.replicaOf",
                "a Cluster Redis cannot follow another Redis",
            ],
        ),
        (
            "following a source and bootstrapped from a backup",
            json!({"replicaOf": {"host": "10.0.0.9"},
                   "bootstrap": {"fromBackup": {"backup": "b1"}}}),
            vec!["spec.replicaOf", "cannot also be bootstrapped"],
        ),
        (
            "a follower hibernating",
            json!({"storage": {"size": "1Gi"}, "hibernate": true,
                   "replicaOf": {"host": "10.0.0.9"}}),
            vec!["spec.replicaOf", "cannot hibernate"],
        ),
        (
            "a source host with a space",
            json!({"replicaOf": {"host": "10.0.0.9 6380"}}),
            vec!["spec.replicaOf.host", "host name or an IP address"],
        ),
        (
            "a source port out of range",
            json!({"replicaOf": {"host": "db.example", "port": 70000}}),
            vec!["spec.replicaOf.port", "less than or equal to 65535"],
        ),
        (
            "a Cluster bootstrapped from a bucket key without a time",
            json!({"mode": "Cluster", "shards": 3,
                   "bootstrap": {"fromBackup": {"key": "ns/c/shard-0.rdb",
                   "s3": {"bucket": "bkt", "credentials": {"secretName": "s3"}}}}}),
            vec![
                "spec.bootstrap.fromBackup",
                "a bucket key alone holds one shard's file",
            ],
        ),
        (
            "an archive with a segment interval of two minutes",
            json!({"archive": {"intervalSeconds": 120,
                   "target": {"s3": {"bucket": "bkt", "credentials": {"secretName": "s3"}}}}}),
            vec!["spec.archive.intervalSeconds", "less than or equal to 60"],
        ),
        (
            "an archive with no target",
            json!({"archive": {"target": {}}}),
            vec!["spec.archive.target", "set exactly one of s3"],
        ),
        (
            "a point in time from a RedisBackup",
            json!({"bootstrap": {"fromBackup": {"backup": "b1",
                   "pointInTime": "2026-12-07T10:11:12Z"}}}),
            vec![
                "spec.bootstrap.fromBackup.pointInTime",
                "not from a RedisBackup",
            ],
        ),
        (
            "a point in time that is not RFC 3339",
            json!({"bootstrap": {"fromBackup": {"key": "ns/cache/archive",
                   "s3": {"bucket": "bkt", "credentials": {"secretName": "s3"}},
                   "pointInTime": "yesterday at five o'clock"}}}),
            vec!["spec.bootstrap.fromBackup.pointInTime", "RFC 3339"],
        ),
        (
            "bootstrap naming a backup and a bucket",
            json!({"bootstrap": {"fromBackup": {"backup": "b1", "key": "k.rdb",
                "s3": {"bucket": "bkt", "credentials": {"secretName": "s3"}}}}}),
            vec!["spec.bootstrap.fromBackup: set either backup"],
        ),
        (
            "tls naming a Secret and a cert-manager issuer",
            json!({"tls": {"secretName": "cache-tls", "issuerRef": {"name": "ca"}}}),
            vec![
                "spec.tls.issuerRef",
                "secretName and issuerRef exclude each other",
            ],
        ),
        (
            "tls issuerRef without a name",
            json!({"tls": {"issuerRef": {"kind": "ClusterIssuer"}}}),
            vec!["spec.tls.issuerRef.name", "Required"],
        ),
        (
            "bootstrap with a key but no bucket",
            json!({"bootstrap": {"fromBackup": {"key": "k.rdb"}}}),
            vec!["spec.bootstrap.fromBackup"],
        ),
        (
            "hibernate without storage",
            json!({"mode": "Standalone", "hibernate": true}),
            vec!["spec.hibernate needs spec.storage"],
        ),
        (
            "bootstrap with AOF on",
            json!({"bootstrap": {"fromBackup": {"backup": "b1"}}, "persistence": {"aof": "EverySec"}}),
            vec![
                "spec.persistence",
                "bootstrapped from a backup is created with AOF Disabled",
            ],
        ),
        (
            "mode Sentinel",
            json!({"mode": "Sentinel"}),
            vec!["spec.mode", "Unsupported value: \"Sentinel\""],
        ),
        (
            "engine Memcached",
            json!({"engine": "Memcached"}),
            vec!["spec.engine", "Unsupported value: \"Memcached\""],
        ),
        (
            "version latest",
            json!({"version": "latest"}),
            vec!["spec.version", "should match"],
        ),
        (
            "Redis 9.1 without an image",
            json!({"engine": "Redis", "version": "9.1"}),
            vec![
                "spec.version",
                "9.1 is not a Redis version Redpilot knows",
                "known: Redis 6.2, 7.0, 7.2, 7.4",
                "Valkey 7.2, 8.0, 8.1, 9.0, 9.1",
            ],
        ),
        (
            "Redis 7.1 (no such release)",
            json!({"engine": "Redis", "version": "7.1"}),
            vec!["spec.version", "7.1 is not a Redis version Redpilot knows"],
        ),
        (
            "Redis 6.0 (no write pause for a switchover)",
            json!({"engine": "Redis", "version": "6.0"}),
            vec!["spec.version", "6.0 lacks the write pause"],
        ),
        (
            "an ACL user in config",
            json!({"config": {"user": "app on >pw ~* +@all"}}),
            vec!["spec.config", "user", "managed by the operator"],
        ),
        (
            "replica-priority in config",
            json!({"config": {"replica-priority": "0"}}),
            vec!["spec.config", "replica-priority", "managed by the operator"],
        ),
        (
            "slave-read-only in config",
            json!({"config": {"slave-read-only": "no"}}),
            vec!["spec.config", "slave-read-only", "managed by the operator"],
        ),
        (
            "the role label in podTemplate.labels",
            json!({"podTemplate": {"labels": {"redpilot.io/role": "primary"}}}),
            vec![
                "spec.podTemplate.labels",
                "redpilot.io/role is set by the operator",
            ],
        ),
        (
            "a Secret name that is no object name",
            json!({"auth": {"secretName": "My_Secret"}}),
            vec!["spec.auth.secretName", "valid Secret name"],
        ),
        (
            "a StorageClass name that is no object name",
            json!({"storage": {"size": "1Gi", "storageClassName": "Fast SSD"}}),
            vec!["spec.storage.storageClassName", "valid StorageClass name"],
        ),
        (
            "Valkey 6.2 without an image",
            json!({"engine": "Valkey", "version": "6.2"}),
            vec!["spec.version", "6.2 is not a Valkey version Redpilot knows"],
        ),
        (
            "Valkey with the default version (only a backup gives one)",
            json!({"engine": "Valkey"}),
            vec![
                "spec.version",
                "7.0 (the default) is not a Valkey version Redpilot knows",
            ],
        ),
        (
            "Valkey with the default version, from a bucket key (no origin to take one from)",
            json!({"engine": "Valkey", "bootstrap": {"fromBackup": {
                "key": "a/b.rdb", "s3": {"bucket": "b", "endpoint": "http://127.0.0.1:9000",
                "credentials": {"secretName": "s3"}}}}}),
            vec![
                "spec.version",
                "7.0 (the default) is not a Valkey version Redpilot knows",
            ],
        ),
        (
            "empty image",
            json!({"image": ""}),
            vec!["spec.image", "at least 1"],
        ),
        (
            "config port",
            json!({"config": {"port": "7000"}}),
            vec!["spec.config", "port", "managed by the operator"],
        ),
        (
            "config requirepass",
            json!({"config": {"maxmemory-policy": "allkeys-lru", "requirepass": "x"}}),
            vec!["spec.config", "requirepass", "managed by the operator"],
        ),
        (
            "config replicaof",
            json!({"config": {"replicaof": "10.0.0.1 6379"}}),
            vec!["spec.config", "replicaof", "managed by the operator"],
        ),
        (
            "config maxmemory",
            json!({"config": {"maxmemory": "1gb"}}),
            vec!["spec.config", "maxmemory", "managed by the operator"],
        ),
        (
            "config key with upper case",
            json!({"config": {"MaxMemory-Policy": "allkeys-lru"}}),
            vec!["spec.config", "lowercase"],
        ),
        (
            "config value with a newline",
            json!({"config": {"maxmemory-policy": "allkeys-lru\nrequirepass x"}}),
            vec!["spec.config", "single line"],
        ),
        (
            "65 config keys",
            Value::Object(
                [("config".to_string(), Value::Object(many_keys))]
                    .into_iter()
                    .collect(),
            ),
            vec!["spec.config", "at most 64"],
        ),
        (
            "config value of 513 bytes",
            json!({"config": {"notify-keyspace-events": "x".repeat(513)}}),
            vec!["spec.config", "512"],
        ),
        (
            "storage size abc",
            json!({"storage": {"size": "abc"}}),
            vec!["spec.storage.size", "positive quantity"],
        ),
        (
            "storage size 0",
            json!({"storage": {"size": "0"}}),
            vec!["spec.storage.size", "positive quantity"],
        ),
        (
            "storage size negative",
            json!({"storage": {"size": "-1Gi"}}),
            vec!["spec.storage.size", "positive quantity"],
        ),
        (
            "storage without size",
            json!({"storage": {"storageClassName": "standard"}}),
            vec!["spec.storage.size", "Required"],
        ),
        (
            "aof sometimes",
            json!({"persistence": {"aof": "sometimes"}}),
            vec!["spec.persistence.aof", "Unsupported value: \"sometimes\""],
        ),
        (
            "memory autopilot without a memory limit",
            json!({"autopilot": {"memory": {"maxMemory": "1Gi"}}}),
            vec![
                "spec.autopilot.memory",
                "needs spec.resources.limits.memory",
            ],
        ),
        (
            "memory autopilot with its thresholds inverted",
            json!({"resources": {"limits": {"memory": "256Mi"}},
                "autopilot": {"memory": {"maxMemory": "1Gi", "scaleUpPercent": 50, "scaleDownPercent": 60}}}),
            vec![
                "spec.autopilot.memory.scaleDownPercent",
                "must be below scaleUpPercent",
            ],
        ),
        (
            "memory autopilot with min above max",
            json!({"resources": {"limits": {"memory": "256Mi"}},
                "autopilot": {"memory": {"maxMemory": "512Mi", "minMemory": "1Gi"}}}),
            vec![
                "spec.autopilot.memory.minMemory",
                "(1Gi) must not exceed maxMemory (512Mi)",
            ],
        ),
        (
            "memory autopilot with a maximum that is not a quantity",
            json!({"resources": {"limits": {"memory": "256Mi"}},
                "autopilot": {"memory": {"maxMemory": "lots"}}}),
            vec!["spec.autopilot.memory.maxMemory", "positive quantity"],
        ),
    ];
    assert!(cases.len() >= 12);

    let mut failures = Vec::new();
    for (i, (case, spec, fragments)) in cases.iter().enumerate() {
        let obj = redis_object(&format!("bad-{i}"), spec.clone());
        let result = api.create(&dry_run_post(), &obj).await;
        failures.extend(check_rejection(case, result, fragments));
    }
    assert!(
        failures.is_empty(),
        "{} of {} invalid specs were not rejected as expected:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[tokio::test]
async fn invalid_updates_are_rejected_with_the_field_named() {
    let client = client().await;
    install_crds(&client).await;
    let ns = TestNamespace::new(&client, "crd-update", &[]).await;
    let api = dynamic_api(&client, &ns.name);
    let with_storage = json!({
        "mode": "Replication",
        "engine": "Redis",
        "version": "7.0",
        "storage": {"size": "2Gi", "storageClassName": "standard"},
    });
    api.create(
        &PostParams::default(),
        &redis_object("stored", with_storage),
    )
    .await
    .expect("creating a valid Replication Redis with storage");
    api.create(
        &PostParams::default(),
        &redis_object("ephemeral", json!({"mode": "Standalone"})),
    )
    .await
    .expect("creating a valid Standalone Redis without storage");
    api.create(&PostParams::default(), &redis_object("unset", json!({})))
        .await
        .expect("creating a Redis with mode, engine and version unset");
    // A Redis that names only a backup: the operator sets what it left
    // unset from the backed-up Redis, once.
    api.create(
        &PostParams::default(),
        &redis_object(
            "from-backup",
            json!({"bootstrap": {"fromBackup": {"backup": "b1"}}}),
        ),
    )
    .await
    .expect("creating a Redis that names only a backup");
    api.create(
        &PostParams::default(),
        &redis_object(
            "valkey",
            json!({"mode": "Replication", "engine": "Valkey", "version": "9.1.3"}),
        ),
    )
    .await
    .expect("creating a valid Valkey Redis");
    // A Redis whose upgrade from 6.2 to 7.0 was rolled back.
    api.create(
        &PostParams::default(),
        &redis_object(
            "rolled-back",
            json!({"mode": "Replication", "version": "7.0"}),
        ),
    )
    .await
    .expect("creating a valid Redis");
    // A Redis whose upgrade from 7.0 to 7.4 was rolled back.
    api.create(
        &PostParams::default(),
        &redis_object(
            "rolled-back-74",
            json!({"mode": "Replication", "version": "7.4"}),
        ),
    )
    .await
    .expect("creating a valid Redis");
    let served = |v: &str| json!({"engine": "Redis", "version": v, "image": format!("redis:{v}")});
    api.patch_status(
        "rolled-back-74",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"upgrade": {
            "from": served("7.0"), "to": served("7.4"), "phase": "RolledBack",
            "done": 0, "total": 3, "startedAt": "2026-01-01T00:00:00Z",
            "reason": "ImagePullFailed"}}})),
    )
    .await
    .expect("writing status.upgrade");
    api.patch_status(
        "rolled-back",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"upgrade": {
            "from": served("6.2"), "to": served("7.0"), "phase": "RolledBack",
            "done": 0, "total": 3, "startedAt": "2026-01-01T00:00:00Z",
            "reason": "ImagePullFailed"}}})),
    )
    .await
    .expect("writing status.upgrade");
    // A Redis whose upgrade from 6.2 to 7.0 succeeded.
    api.create(
        &PostParams::default(),
        &redis_object("upgraded", json!({"mode": "Replication", "version": "7.0"})),
    )
    .await
    .expect("creating a valid Redis");
    api.patch_status(
        "upgraded",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"upgrade": {
            "from": served("6.2"), "to": served("7.0"), "phase": "Succeeded",
            "done": 3, "total": 3, "startedAt": "2026-01-01T00:00:00Z",
            "finishedAt": "2026-01-01T00:05:00Z"}}})),
    )
    .await
    .expect("writing status.upgrade");

    let cases: Vec<(&str, &str, Value, Vec<&str>)> = vec![
        (
            "back to the version a succeeded upgrade came from",
            "upgraded",
            json!({"spec": {"version": "6.2"}}),
            vec!["spec.version", "7.0 to 6.2 is a downgrade"],
        ),
        (
            "change storageClassName",
            "stored",
            json!({"spec": {"storage": {"storageClassName": "other"}}}),
            vec!["spec.storage.storageClassName", "immutable"],
        ),
        (
            "remove storageClassName",
            "stored",
            json!({"spec": {"storage": {"storageClassName": null}}}),
            vec!["spec.storage.storageClassName", "immutable"],
        ),
        (
            "shrink storage",
            "stored",
            json!({"spec": {"storage": {"size": "1Gi"}}}),
            vec!["spec.storage.size", "cannot shrink"],
        ),
        (
            "remove storage",
            "stored",
            json!({"spec": {"storage": null}}),
            vec!["spec.storage", "cannot be added or removed"],
        ),
        (
            "add storage",
            "ephemeral",
            json!({"spec": {"storage": {"size": "1Gi"}}}),
            vec!["spec.storage", "cannot be added or removed"],
        ),
        (
            "Valkey to Redis",
            "valkey",
            json!({"spec": {"engine": "Redis", "version": "7.0"}}),
            vec![
                "spec.engine",
                "Valkey 9.1.3 to Redis 7.0 is not a supported move",
                "supported: Redis 6.2 or 7.0 to Valkey 8.1 or 9.1",
            ],
        ),
        (
            "Redis 7.0 to an untested Valkey",
            "stored",
            json!({"spec": {"engine": "Valkey", "version": "8.0"}}),
            vec![
                "spec.engine",
                "Redis 7.0 to Valkey 8.0 is not a supported move",
            ],
        ),
        (
            "downgrade",
            "stored",
            json!({"spec": {"version": "6.2"}}),
            vec!["spec.version", "7.0 to 6.2 is a downgrade"],
        ),
        (
            "downgrade by a patch release",
            "valkey",
            json!({"spec": {"version": "9.1.0"}}),
            vec!["spec.version", "9.1.3 to 9.1.0 is a downgrade"],
        ),
        (
            "below the version a rolled-back upgrade came from",
            "rolled-back",
            json!({"spec": {"version": "6.2.1"}}),
            vec!["spec.version", "7.0 to 6.2.1 is a downgrade"],
        ),
        (
            "change mode",
            "stored",
            json!({"spec": {"mode": "Standalone", "instances": 1}}),
            vec!["spec.mode", "immutable"],
        ),
        (
            "Standalone to 2 instances",
            "ephemeral",
            json!({"spec": {"instances": 2}}),
            vec!["spec.instances", "Standalone mode runs exactly 1 instance"],
        ),
        (
            "after a rolled-back 7.0 to 7.4, a patch release of 7.0 (what runs may be newer)",
            "rolled-back-74",
            json!({"spec": {"version": "7.0.5"}}),
            vec!["spec.version", "7.4 to 7.0.5 is a downgrade"],
        ),
        (
            "an unset mode (Standalone) set to Replication",
            "unset",
            json!({"spec": {"mode": "Replication", "instances": 3}}),
            vec!["spec.mode", "immutable"],
        ),
        (
            "an unset version (7.0) set below it",
            "unset",
            json!({"spec": {"version": "6.2"}}),
            vec!["spec.version", "7.0 to 6.2 is a downgrade"],
        ),
        (
            "an unset engine (Redis 7.0) set to an untested Valkey",
            "unset",
            json!({"spec": {"engine": "Valkey", "version": "7.2"}}),
            vec![
                "spec.engine",
                "Redis 7.0 to Valkey 7.2 is not a supported move",
            ],
        ),
    ];
    let dry_run = PatchParams {
        dry_run: true,
        ..Default::default()
    };
    let mut failures = Vec::new();
    for (case, name, patch, fragments) in &cases {
        let result = api.patch(name, &dry_run, &Patch::Merge(patch)).await;
        failures.extend(check_rejection(case, result, fragments));
    }

    // The same objects accept the changes that are allowed.
    let allowed: Vec<(&str, &str, Value)> = vec![
        (
            "same storage size, spelled differently",
            "stored",
            json!({"spec": {"storage": {"size": "2048Mi"}}}),
        ),
        (
            "upgrade version",
            "stored",
            json!({"spec": {"version": "7.2"}}),
        ),
        ("scale", "stored", json!({"spec": {"instances": 5}})),
        (
            "Redis 7.0 to Valkey 8.1",
            "stored",
            json!({"spec": {"engine": "Valkey", "version": "8.1"}}),
        ),
        (
            "back to the version a rolled-back upgrade came from",
            "rolled-back",
            json!({"spec": {"version": "6.2"}}),
        ),
        (
            "a downgrade with an explicit image (the user's call)",
            "valkey",
            json!({"spec": {"version": "9.0", "image": "valkey/valkey:9.0"}}),
        ),
        (
            "change config",
            "stored",
            json!({"spec": {"config": {"maxmemory-policy": "allkeys-lru"}}}),
        ),
        (
            "retainOnDelete off",
            "stored",
            json!({"spec": {"storage": {"retainOnDelete": false}}}),
        ),
        (
            "grow storage (2Gi to 3Gi)",
            "stored",
            json!({"spec": {"storage": {"size": "3Gi"}}}),
        ),
        (
            "the same storage size written another way (2Gi as 2048Mi)",
            "stored",
            json!({"spec": {"storage": {"size": "2048Mi"}}}),
        ),
        ("pause", "ephemeral", json!({"spec": {"paused": true}})),
        (
            "after a rolled-back 7.0 to 7.4, 7.2 (an upgrade of what runs)",
            "rolled-back-74",
            json!({"spec": {"version": "7.2"}}),
        ),
        (
            "an unset mode set to its default",
            "unset",
            json!({"spec": {"mode": "Standalone", "engine": "Redis", "version": "7.0"}}),
        ),
        (
            "the shape of a backed-up Cluster Redis set on one that names only the backup",
            "from-backup",
            json!({"spec": {"mode": "Cluster", "shards": 3, "instances": 2, "engine": "Valkey",
                "version": "7.2", "config": {"maxmemory-policy": "allkeys-lru"}}}),
        ),
        (
            "the shape of a backed-up Redis 6.2 set on one that names only the backup",
            "from-backup",
            json!({"spec": {"mode": "Replication", "instances": 3, "version": "6.2"}}),
        ),
    ];
    for (case, name, patch) in &allowed {
        if let Err(e) = api.patch(name, &dry_run, &Patch::Merge(patch)).await {
            failures.push(format!("{case}: refused, expected to be allowed: {e}"));
        }
    }
    assert!(
        failures.is_empty(),
        "updates not handled as expected:\n{}",
        failures.join("\n")
    );
}

#[tokio::test]
async fn valid_specs_are_accepted_with_defaults() {
    let client = client().await;
    install_crds(&client).await;
    let ns = TestNamespace::new(&client, "crd-valid", &[]).await;
    let api = dynamic_api(&client, &ns.name);
    let cases: Vec<(&str, Value)> = vec![
        ("empty spec", json!({})),
        (
            "Replication on Valkey 9.1 with everything",
            json!({
                "mode": "Replication",
                "engine": "Valkey",
                "version": "9.1",
                "instances": 15,
                "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}},
                "config": {"maxmemory-policy": "allkeys-lru", "notify-keyspace-events": "Ex", "hz": "20"},
                "auth": {"secretName": "my-password"},
                "storage": {"size": "1Gi", "storageClassName": "standard", "retainOnDelete": false},
                "persistence": {"rdb": false, "aof": "EverySec"},
                "podTemplate": {"labels": {"team": "a"}, "nodeSelector": {"kubernetes.io/hostname": "localnode"}},
                "paused": false,
            }),
        ),
        (
            "Redis 9.1 with an explicit image",
            json!({"engine": "Redis", "version": "9.1", "image": "registry.example/redis:9.1"}),
        ),
        (
            "Redis 6.2.14 Standalone with 1 instance",
            json!({"mode": "Standalone", "version": "6.2.14", "instances": 1}),
        ),
        (
            "a Cluster archived continuously",
            json!({"mode": "Cluster", "shards": 3,
                   "archive": {"target": {"s3": {"bucket": "bkt", "credentials": {"secretName": "s3"}}}}}),
        ),
        (
            "a Cluster restored from an archive to a time",
            json!({"mode": "Cluster", "shards": 4, "engine": "Valkey", "version": "8.1",
                   "bootstrap": {"fromBackup": {"key": "ns/c/archive",
                   "s3": {"bucket": "bkt", "credentials": {"secretName": "s3"}},
                   "pointInTime": "2026-12-07T10:11:12.250Z"}}}),
        ),
    ];
    for (i, (case, spec)) in cases.iter().enumerate() {
        let created = api
            .create(
                &dry_run_post(),
                &redis_object(&format!("ok-{i}"), spec.clone()),
            )
            .await
            .unwrap_or_else(|e| panic!("{case}: a valid spec was refused: {e}"));
        if i == 0 {
            let spec = &created.data["spec"];
            // Mode, engine and version stay unset (a Redis bootstrapped
            // from a backup takes them from it); unset, they are
            // Standalone, Redis and 7.0.
            for field in ["mode", "engine", "version"] {
                assert!(spec.get(field).is_none(), "{field} left unset: {spec}");
            }
            let typed: redpilot::api::v1alpha1::RedisSpec =
                serde_json::from_value(spec.clone()).expect("a RedisSpec");
            assert_eq!(typed.mode(), redpilot::api::v1alpha1::Mode::Standalone);
            assert_eq!(typed.engine(), redpilot::api::v1alpha1::Engine::Redis);
            assert_eq!(typed.version(), "7.0");
            assert_eq!(typed.image(), "redis:7.0");
            assert_eq!(spec["paused"], false, "default paused: {spec}");
        }
    }

    // Defaults inside nested objects.
    let created = api
        .create(
            &dry_run_post(),
            &redis_object(
                "defaults",
                json!({"storage": {"size": "1Gi"}, "persistence": {}}),
            ),
        )
        .await
        .expect("storage and persistence with defaults");
    let spec = &created.data["spec"];
    assert_eq!(spec["storage"]["retainOnDelete"], true, "{spec}");
    assert_eq!(spec["persistence"]["rdb"], true, "{spec}");
    assert_eq!(spec["persistence"]["aof"], "Disabled", "{spec}");
}

#[tokio::test]
async fn kubectl_get_redis_shows_the_columns() {
    let client = client().await;
    install_crds(&client).await;
    let ns = TestNamespace::new(&client, "crd-columns", &[]).await;
    let api = redis_api(&client, &ns.name);
    let obj: Redis = serde_json::from_value(json!({
        "apiVersion": "redpilot.io/v1alpha1",
        "kind": "Redis",
        "metadata": {"name": "cache"},
        "spec": {"mode": "Replication", "instances": 3},
    }))
    .expect("redis");
    api.create(&PostParams::default(), &obj)
        .await
        .expect("create Redis cache");
    // What the operator would report; here written directly to the status
    // subresource to check the columns' JSON paths.
    api.patch_status(
        "cache",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {
            "currentVersion": "7.0.15",
            "primary": "cache-0",
            "ready": "3/3",
            "readyInstances": 3,
            "phase": "Ready",
            "memory": {"instance": "cache-0", "usedBytes": 12582912, "maxBytes": 50331648,
                       "percent": 25, "summary": "12Mi/48Mi (25%)"},
            "replicaOf": {"source": "10.0.0.9:6379", "link": "Up"},
        }})),
    )
    .await
    .expect("patch status");

    let out = kubectl(&["get", "redis", "-n", &ns.name]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "kubectl get redis: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut lines = stdout.lines();
    let header: Vec<&str> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(
        header,
        [
            "NAME", "MODE", "SHARDS", "VERSION", "PRIMARY", "READY", "PHASE", "MEMORY", "SOURCE",
            "AGE"
        ],
        "kubectl get redis header:\n{stdout}"
    );
    let row: Vec<&str> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    // SHARDS is blank outside Cluster mode.
    assert_eq!(
        row.get(..6),
        Some(&["cache", "Replication", "7.0.15", "cache-0", "3/3", "Ready"][..]),
        "kubectl get redis row:\n{stdout}"
    );
    assert!(stdout.contains("10.0.0.9:6379"), "SOURCE column:\n{stdout}");
    let wide = kubectl(&["get", "redis", "-n", &ns.name, "-o", "wide"]);
    let wide = String::from_utf8_lossy(&wide.stdout);
    assert!(
        wide.lines().next().is_some_and(|h| h.contains("LINK")) && wide.contains(" Up "),
        "LINK column with -o wide:\n{wide}"
    );
    assert!(
        stdout.contains("12Mi/48Mi (25%)"),
        "MEMORY column:\n{stdout}"
    );

    // The short name and the category work too.
    for what in ["rds", "redpilot"] {
        let out = kubectl(&["get", what, "-n", &ns.name, "-o", "name"]);
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            "redis.redpilot.io/cache",
            "kubectl get {what}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    api.delete("cache", &DeleteParams::default())
        .await
        .expect("delete");
}

fn object(kind: &str, name: &str, spec: Value) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "redpilot.io/v1alpha1",
        "kind": kind,
        "metadata": {"name": name},
        "spec": spec,
    }))
    .expect("object json")
}

/// RedisBackup and RedisBackupSchedule: a bad bucket, endpoint, prefix,
/// cron expression, time zone or age is refused naming the field; the
/// expressions admitted are ones the operator's schedule parser reads.
#[tokio::test]
async fn backup_specs_are_checked_at_admission() {
    use redpilot::api::v1alpha1::{RedisBackup, RedisBackupSchedule};
    let client = client().await;
    install_crds(&client).await;
    let ns = TestNamespace::new(&client, "crd-backup", &[]).await;
    let backups: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &ns.name,
        &ApiResource::erase::<RedisBackup>(&()),
    );
    let schedules: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &ns.name,
        &ApiResource::erase::<RedisBackupSchedule>(&()),
    );
    let s3 = |extra: Value| {
        let mut v = json!({"bucket": "backups", "credentials": {"secretName": "s3"}});
        if let (Some(o), Some(e)) = (v.as_object_mut(), extra.as_object()) {
            o.extend(e.clone());
        }
        v
    };
    let mut failures = Vec::new();
    let backup_cases: Vec<(&str, Value, Vec<&str>)> = vec![
        (
            "bucket with capitals",
            json!({"redis": "c", "target": {"s3": s3(json!({"bucket": "My_Bucket"}))}}),
            vec!["bucket must be an S3 bucket name"],
        ),
        (
            "endpoint without scheme",
            json!({"redis": "c", "target": {"s3": s3(json!({"endpoint": "s3.example.com"}))}}),
            vec!["s3.endpoint must be an http:// or https:// URL"],
        ),
        (
            "prefix with leading slash",
            json!({"redis": "c", "target": {"s3": s3(json!({"prefix": "/x"}))}}),
            vec!["prefix must not start with '/'"],
        ),
        (
            "no target",
            json!({"redis": "c"}),
            vec!["spec.target", "Required value"],
        ),
        (
            "redis not a name",
            json!({"redis": "Not_A_Name", "target": {"s3": s3(json!({}))}}),
            vec!["spec.redis must be the name of a Redis"],
        ),
        (
            "deletion policy Maybe",
            json!({"redis": "c", "target": {"s3": s3(json!({}))}, "deletionPolicy": "Maybe"}),
            vec!["spec.deletionPolicy", "Unsupported value"],
        ),
    ];
    for (i, (case, spec, fragments)) in backup_cases.iter().enumerate() {
        let result = backups
            .create(
                &dry_run_post(),
                &object("RedisBackup", &format!("bad-{i}"), spec.clone()),
            )
            .await;
        failures.extend(check_rejection(case, result, fragments));
    }
    let bad_crons = [
        "* * * *",
        "60 * * * *",
        "* 24 * * *",
        "* * 0 * *",
        "* * * 13 *",
        "* * * * 8",
        "*/0 * * * *",
        "@every 5m",
        "0 3 * * * *",
        "a b c d e",
    ];
    for (i, cron) in bad_crons.iter().enumerate() {
        let spec = json!({"redis": "c", "schedule": cron, "target": {"s3": s3(json!({}))}});
        let result = schedules
            .create(
                &dry_run_post(),
                &object("RedisBackupSchedule", &format!("bad-cron-{i}"), spec),
            )
            .await;
        failures.extend(check_rejection(
            &format!("schedule {cron:?}"),
            result,
            &["spec.schedule", "is not a cron expression"],
        ));
    }
    for (case, extra, fragments) in [
        (
            "time zone with spaces",
            json!({"timeZone": "Europe Paris"}),
            vec!["spec.timeZone must be an IANA time zone name"],
        ),
        (
            "max age in weeks",
            json!({"retention": {"maxAge": "2w"}}),
            vec!["spec.retention.maxAge must be days, hours and minutes"],
        ),
        (
            "keep none",
            json!({"retention": {"keepLast": 0}}),
            vec!["spec.retention.keepLast", "greater than or equal to 1"],
        ),
    ] {
        let mut spec = json!({"redis": "c", "schedule": "@daily", "target": {"s3": s3(json!({}))}});
        if let (Some(o), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
            o.extend(e.clone());
        }
        let result = schedules
            .create(
                &dry_run_post(),
                &object("RedisBackupSchedule", "bad-other", spec),
            )
            .await;
        failures.extend(check_rejection(case, result, &fragments));
    }
    let good_crons = [
        "0 3 * * *",
        "*/15 * * * *",
        "0 0-6/2 1,15 * mon-fri",
        "5 4 * * sun",
        "0 0 1 1 *",
        "@hourly",
        "@daily",
        "@weekly",
        "@monthly",
        "@yearly",
        "59 23 31 12 6",
    ];
    for (i, cron) in good_crons.iter().enumerate() {
        let spec = json!({"redis": "c", "schedule": cron, "timeZone": "Europe/Paris", "target": {"s3": s3(json!({}))},
                          "retention": {"keepLast": 7, "maxAge": "30d"}});
        if let Err(e) = schedules
            .create(
                &dry_run_post(),
                &object("RedisBackupSchedule", &format!("good-{i}"), spec),
            )
            .await
        {
            failures.push(format!("schedule {cron:?} refused: {e}"));
        }
        let tz = redpilot::controller::schedule::plan::time_zone(Some("Europe/Paris")).expect("tz");
        if let Err(e) =
            redpilot::controller::schedule::plan::next_after(cron, tz, chrono::Utc::now())
        {
            failures.push(format!(
                "schedule {cron:?} admitted but the operator cannot read it: {e}"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    println!(
        "{} bad backup specs, {} bad and {} good cron expressions checked",
        backup_cases.len(),
        bad_crons.len(),
        good_crons.len()
    );
}

/// A name its children cannot carry is refused at creation, naming
/// `metadata.name` and the limit, for the three kinds: a Redis (its
/// StatefulSet's `controller-revision-hash` label is the name plus up to 11
/// characters), a RedisBackup (a label value on its Job's pods) and a
/// RedisBackupSchedule (its runs are `<name>-<YYYYmmddHHMM>` RedisBackups).
/// A name at the limit is accepted.
#[tokio::test]
async fn names_longer_than_the_children_allow_are_refused() {
    use redpilot::api::v1alpha1::{
        MAX_BACKUP_NAME, MAX_REDIS_NAME, MAX_SCHEDULE_NAME, RedisBackup, RedisBackupSchedule,
    };
    let client = client().await;
    install_crds(&client).await;
    let ns = TestNamespace::new(&client, "crd-names", &[]).await;
    assert_eq!(
        (MAX_REDIS_NAME, MAX_BACKUP_NAME, MAX_SCHEDULE_NAME),
        (52, 63, 50)
    );
    let api = |kind: &str| -> Api<DynamicObject> {
        let ar = match kind {
            "Redis" => ApiResource::erase::<Redis>(&()),
            "RedisBackup" => ApiResource::erase::<RedisBackup>(&()),
            _ => ApiResource::erase::<RedisBackupSchedule>(&()),
        };
        Api::namespaced_with(client.clone(), &ns.name, &ar)
    };
    let target = json!({"s3": {"bucket": "backups", "credentials": {"secretName": "s3"}}});
    let cases = [
        ("Redis", MAX_REDIS_NAME, json!({"mode": "Standalone"})),
        (
            "RedisBackup",
            MAX_BACKUP_NAME,
            json!({"redis": "c", "target": target}),
        ),
        (
            "RedisBackupSchedule",
            MAX_SCHEDULE_NAME,
            json!({"redis": "c", "schedule": "@daily", "target": target}),
        ),
    ];
    // A DNS label of `len` characters.
    let name = |len: usize| {
        let mut n: String = "n".repeat(len);
        n.replace_range(len / 2..len / 2 + 1, "-");
        n
    };
    let mut failures = Vec::new();
    for (kind, max, spec) in cases {
        let at_limit = name(max);
        if let Err(e) = api(kind)
            .create(&dry_run_post(), &object(kind, &at_limit, spec.clone()))
            .await
        {
            failures.push(format!("{kind} named with {max} characters refused: {e}"));
        }
        let over = name(max + 1);
        let result = api(kind)
            .create(&dry_run_post(), &object(kind, &over, spec.clone()))
            .await;
        let limit = format!("metadata.name: a {kind} name is at most {max} characters");
        failures.extend(check_rejection(
            &format!("{kind} named with {} characters", max + 1),
            result,
            &[&over, &limit],
        ));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Cluster mode at admission: `shards` only and always there, in range,
/// and what Cluster mode does not support yet refused, naming the field;
/// on update, what cannot change yet.
#[tokio::test]
async fn cluster_specs_are_checked_at_admission() {
    let client = client().await;
    install_crds(&client).await;
    let ns = TestNamespace::new(&client, "crd-cluster", &[]).await;
    let api = dynamic_api(&client, &ns.name);
    let cluster = |extra: Value| {
        let mut spec =
            json!({"mode": "Cluster", "shards": 3, "engine": "Valkey", "version": "8.1"});
        if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
            for (k, v) in e {
                s.insert(k.clone(), v.clone());
            }
        }
        spec
    };
    let cases: Vec<(&str, Value, Vec<&str>)> = vec![
        (
            "Cluster without shards",
            json!({"mode": "Cluster"}),
            vec!["spec.shards", "in mode Cluster"],
        ),
        (
            "shards in Replication mode",
            json!({"mode": "Replication", "shards": 3}),
            vec!["spec.shards", "only there"],
        ),
        (
            "2 shards",
            cluster(json!({"shards": 2})),
            vec!["spec.shards", "greater than or equal to 3"],
        ),
        (
            "101 shards",
            cluster(json!({"shards": 101})),
            vec!["spec.shards", "less than or equal to 100"],
        ),
        (
            "Redis 6.2 in Cluster mode",
            cluster(json!({"engine": "Redis", "version": "6.2"})),
            vec!["spec.version", "ADDSLOTSRANGE"],
        ),
        (
            "bootstrap from a bucket key",
            cluster(json!({"bootstrap": {"fromBackup": {"key": "k.rdb",
                "s3": {"bucket": "b", "credentials": {"secretName": "s"}}}}})),
            vec![
                "spec.bootstrap.fromBackup",
                "RedisBackup of a Cluster Redis",
            ],
        ),
        (
            "cluster-node-timeout in spec.config",
            cluster(json!({"config": {"cluster-node-timeout": "5000"}})),
            vec![
                "spec.config.cluster-node-timeout",
                "managed by the operator",
            ],
        ),
    ];
    let mut failures = Vec::new();
    for (case, spec, fragments) in &cases {
        let r = api
            .create(&dry_run_post(), &redis_object("c", spec.clone()))
            .await;
        failures.extend(check_rejection(case, r, fragments));
    }
    // The memory autopilot runs in Cluster mode (every shard, one limit).
    if let Err(e) = api
        .create(
            &dry_run_post(),
            &redis_object(
                "c",
                cluster(json!({"resources": {"limits": {"memory": "1Gi"}},
                               "autopilot": {"memory": {"maxMemory": "2Gi"}}})),
            ),
        )
        .await
    {
        failures.push(format!(
            "the memory autopilot in Cluster mode: refused, expected to be allowed: {e}"
        ));
    }
    // A Cluster Redis with volumes hibernates.
    if let Err(e) = api
        .create(
            &dry_run_post(),
            &redis_object(
                "c",
                cluster(json!({"hibernate": true, "storage": {"size": "1Gi"}})),
            ),
        )
        .await
    {
        failures.push(format!(
            "a hibernating Cluster Redis with volumes: refused, expected to be allowed: {e}"
        ));
    }
    // A Cluster Redis is restored from a RedisBackup by name.
    if let Err(e) = api
        .create(
            &dry_run_post(),
            &redis_object(
                "c",
                cluster(json!({"bootstrap": {"fromBackup": {"backup": "b1"}}})),
            ),
        )
        .await
    {
        failures.push(format!(
            "a Cluster Redis bootstrapped from a RedisBackup: refused, expected to be allowed: {e}"
        ));
    }
    let r = api
        .create(
            &dry_run_post(),
            &redis_object(
                "r",
                json!({"mode": "Replication", "autopilot": {"shards": {"maxShards": 5}}}),
            ),
        )
        .await;
    failures.extend(check_rejection(
        "a shard autopilot outside Cluster mode",
        r,
        &["spec.autopilot.shards", "mode Cluster"],
    ));
    let long = "c".repeat(49);
    let r = api
        .create(&dry_run_post(), &redis_object(&long, cluster(json!({}))))
        .await;
    failures.extend(check_rejection(
        "a 49-character Cluster name",
        r,
        &["at most 48 characters"],
    ));

    api.create(
        &PostParams::default(),
        &redis_object("sharded", cluster(json!({}))),
    )
    .await
    .expect("creating a valid Cluster Redis");
    let dry_run = PatchParams {
        dry_run: true,
        ..Default::default()
    };
    let updates: Vec<(&str, Value, Vec<&str>)> = vec![
        (
            "more shards than 100",
            json!({"spec": {"shards": 101}}),
            vec!["spec.shards", "100"],
        ),
        (
            "a shard autopilot with minShards over maxShards",
            json!({"spec": {"autopilot": {"shards": {"minShards": 6, "maxShards": 5}}}}),
            vec!["minShards", "maxShards"],
        ),
        (
            "a shard autopilot that removes at the level it adds",
            json!({"spec": {"autopilot": {"shards": {"maxShards": 5, "scaleUpPercent": 50, "scaleDownPercent": 50}}}}),
            vec!["scaleDownPercent", "scaleUpPercent"],
        ),
        (
            "more instances",
            json!({"spec": {"instances": 3}}),
            vec!["spec.instances", "Cluster mode"],
        ),
        (
            "to Replication",
            json!({"spec": {"mode": "Replication", "shards": null}}),
            vec!["spec.mode", "immutable"],
        ),
    ];
    for (case, patch, fragments) in &updates {
        let r = api.patch("sharded", &dry_run, &Patch::Merge(patch)).await;
        failures.extend(check_rejection(case, r, fragments));
    }
    if let Err(e) = api
        .patch(
            "sharded",
            &dry_run,
            &Patch::Merge(json!({"spec": {"config": {"maxmemory-policy": "allkeys-lru"}}})),
        )
        .await
    {
        failures.push(format!(
            "a config change: refused, expected to be allowed: {e}"
        ));
    }
    if let Err(e) = api
        .patch(
            "sharded",
            &dry_run,
            &Patch::Merge(json!({"spec": {"version": "9.1"}})),
        )
        .await
    {
        failures.push(format!(
            "an upgrade of a Cluster Redis: refused, expected to be allowed: {e}"
        ));
    }
    // Resharding: the shard count changes either way, by hand or by the
    // shard autopilot.
    for (case, patch) in [
        (
            "more shards (online resharding)",
            json!({"spec": {"shards": 5}}),
        ),
        ("fewer shards", json!({"spec": {"shards": 3}})),
        (
            "a shard autopilot",
            json!({"spec": {"autopilot": {"shards": {"minShards": 3, "maxShards": 8}}}}),
        ),
    ] {
        if let Err(e) = api.patch("sharded", &dry_run, &Patch::Merge(&patch)).await {
            failures.push(format!("{case}: refused, expected to be allowed: {e}"));
        }
    }
    if let Err(e) = api
        .patch(
            "sharded",
            &dry_run,
            &Patch::Merge(json!({"spec": {"failover": {"switchoverTo": "sharded-s1-1"}}})),
        )
        .await
    {
        failures.push(format!(
            "a planned failover of a shard (switchoverTo): refused, expected to be allowed: {e}"
        ));
    }
    assert!(
        failures.is_empty(),
        "Cluster specs not handled as expected:\n{}",
        failures.join("\n")
    );
    let _ = api.delete("sharded", &DeleteParams::default()).await;
}
