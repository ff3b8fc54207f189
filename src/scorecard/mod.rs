//! `redpilot scorecard-test <test>`: Redpilot's own scorecard suite
//! (`suite: redpilot` in the bundle's scorecard configuration), one test per
//! capability level the CSV can claim. `operator-sdk scorecard` runs each as a
//! pod of the operator's own image against a cluster where Redpilot is
//! installed; the test drives a real Redis there through the API and the
//! servers, and prints one scorecard `TestStatus` as JSON on standard output
//! (the only thing it prints: the scorecard parses the pod's log).
//!
//! The pod runs in the scorecard's namespace (`SCORECARD_NAMESPACE`) as the
//! ServiceAccount given with `--service-account`; `scorecard/rbac.yaml` grants
//! what the tests touch. Every object a test creates is named
//! `sc-<level>-<suffix>` and deleted when the test ends, pass or fail.

mod cluster;
mod levels;
mod memory;
mod shards;
mod writer;

use std::future::Future;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Secret};
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde::Serialize;
use serde_json::Value;

use crate::api::v1alpha1::{Phase, Redis, RedisBackup};
use crate::redis::{ConnectOptions, Endpoint, Node};

/// Field manager of the objects a scorecard test applies.
const MANAGER: &str = "redpilot-scorecard";

/// One test of the suite: its name (as the scorecard reports it), the
/// capability level it checks (as the CSV's `capabilities` annotation names
/// it) and what it does.
#[derive(Clone, Copy, Debug)]
pub struct TestDef {
    pub name: &'static str,
    pub level: &'static str,
    pub summary: &'static str,
}

/// The suite, in capability order: a CSV may claim a level only when its
/// tests and those of every lower level pass.
pub const TESTS: [TestDef; 8] = [
    TestDef {
        name: "redpilot-basic-install",
        level: "Basic Install",
        summary: "a Replication Redis becomes Ready; a write on the primary reaches the replica",
    },
    TestDef {
        name: "redpilot-cluster-install",
        level: "Basic Install",
        summary: "a Cluster Redis of 3 shards x 2 becomes Ready with every slot served; each shard's writes reach its replica and a primary redirects another shard's key",
    },
    TestDef {
        name: "redpilot-seamless-upgrades",
        level: "Seamless Upgrades",
        summary: "a Replication Redis moves from Redis 6.2 to 7.0 under a writing client: every key kept, no write lost, no gap over 1 s",
    },
    TestDef {
        name: "redpilot-full-lifecycle",
        level: "Full Lifecycle",
        summary: "a backup to a volume completes and a new Redis restored from it has every key",
    },
    TestDef {
        name: "redpilot-deep-insights",
        level: "Deep Insights",
        summary: "the metrics sidecar serves the server's metrics; status reports memory and conditions",
    },
    TestDef {
        name: "redpilot-auto-pilot",
        level: "Auto Pilot",
        summary: "the primary's pod deleted, a replica is promoted and every acknowledged key is kept",
    },
    TestDef {
        name: "redpilot-memory-autopilot",
        level: "Auto Pilot",
        summary: "a Redis filled past its scale-up level is grown in place with every key kept",
    },
    TestDef {
        name: "redpilot-shard-autopilot",
        level: "Auto Pilot",
        summary: "a Cluster Redis filled past its shard autopilot's level gets a fourth shard, the slots rebalanced online, with every key kept",
    },
];

/// The highest capability level whose test passed together with the tests
/// of every lower level (`passed` holds the names of the tests that
/// passed): the most a CSV may claim.
pub fn highest_level(passed: &[&str]) -> Option<&'static str> {
    let mut levels: Vec<&'static str> = TESTS.iter().map(|t| t.level).collect();
    levels.dedup();
    let mut earned = None;
    for level in levels {
        let all = TESTS
            .iter()
            .filter(|t| t.level == level)
            .all(|t| passed.contains(&t.name));
        if !all {
            break;
        }
        earned = Some(level);
    }
    earned
}

/// A scorecard test result (`scorecard.operatorframework.io/v1alpha3`
/// `TestResult`).
#[derive(Serialize, Debug, Clone, PartialEq)]
pub struct TestResult {
    pub name: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub log: String,
    pub state: &'static str,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub suggestions: Vec<String>,
}

/// What the scorecard reads from the test pod's log (`TestStatus`).
#[derive(Serialize, Debug, Clone, PartialEq)]
pub struct TestStatus {
    pub results: Vec<TestResult>,
}

/// Why a test failed: what did not happen, and what to look at.
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    pub error: String,
    pub suggestion: String,
}

impl Failure {
    pub fn new(error: impl Into<String>, suggestion: impl Into<String>) -> Self {
        Failure {
            error: error.into(),
            suggestion: suggestion.into(),
        }
    }
}

/// The result of running test `name` in namespace `namespace` (or the
/// scorecard's namespace), each step bounded by `timeout`.
pub async fn run(name: &str, namespace: Option<String>, timeout: Duration) -> TestStatus {
    let result = match TESTS.iter().find(|t| t.name == name) {
        None => TestResult {
            name: name.to_string(),
            log: String::new(),
            state: "error",
            errors: vec![format!(
                "no scorecard test {name:?}; the redpilot suite has {}",
                TESTS.iter().map(|t| t.name).collect::<Vec<_>>().join(", ")
            )],
            suggestions: vec![],
        },
        Some(def) => run_one(def, namespace, timeout).await,
    };
    TestStatus {
        results: vec![result],
    }
}

async fn run_one(def: &TestDef, namespace: Option<String>, timeout: Duration) -> TestResult {
    let started = Instant::now();
    let client = match Client::try_default().await {
        Ok(c) => c,
        Err(e) => {
            return TestResult {
                name: def.name.to_string(),
                log: String::new(),
                state: "error",
                errors: vec![format!("cannot reach the Kubernetes API: {e}")],
                suggestions: vec!["run the test as a scorecard pod (operator-sdk scorecard), or with a kubeconfig".into()],
            };
        }
    };
    let ns = namespace
        .or_else(|| std::env::var("SCORECARD_NAMESPACE").ok())
        .unwrap_or_else(|| client.default_namespace().to_string());
    let mut ctx = Ctx {
        client,
        ns,
        timeout,
        log: Vec::new(),
        created: Vec::new(),
        suffix: suffix(),
    };
    ctx.note(format!(
        "{} ({}): {} — namespace {}",
        def.name, def.level, def.summary, ctx.ns
    ));
    let outcome = match def.name {
        "redpilot-basic-install" => levels::basic_install(&mut ctx).await,
        "redpilot-cluster-install" => cluster::cluster_install(&mut ctx).await,
        "redpilot-seamless-upgrades" => levels::seamless_upgrades(&mut ctx).await,
        "redpilot-full-lifecycle" => levels::full_lifecycle(&mut ctx).await,
        "redpilot-deep-insights" => levels::deep_insights(&mut ctx).await,
        "redpilot-auto-pilot" => levels::auto_pilot(&mut ctx).await,
        "redpilot-memory-autopilot" => memory::memory_autopilot(&mut ctx).await,
        _ => shards::shard_autopilot(&mut ctx).await,
    };
    ctx.cleanup().await;
    ctx.note(format!("took {:.1}s", started.elapsed().as_secs_f64()));
    let (state, errors, suggestions) = match outcome {
        Ok(()) => ("pass", vec![], vec![]),
        Err(f) => (
            "fail",
            vec![format!("{}: {}", def.level, f.error)],
            vec![f.suggestion],
        ),
    };
    TestResult {
        name: def.name.to_string(),
        log: ctx.log.join("\n"),
        state,
        errors,
        suggestions,
    }
}

/// A short random suffix that keeps object names of concurrent runs apart.
fn suffix() -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut bytes = [0u8; 5];
    if getrandom::fill(&mut bytes).is_err() {
        // No randomness: the clock's nanoseconds still separate runs.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        bytes = nanos.wrapping_mul(2_654_435_761).to_le_bytes().repeat(2)[..5]
            .try_into()
            .unwrap_or([0; 5]);
    }
    bytes
        .iter()
        .map(|b| ALPHABET[*b as usize % ALPHABET.len()] as char)
        .collect()
}

/// What a running test holds: the client, its namespace, its log and the
/// objects to delete at the end.
pub(crate) struct Ctx {
    client: Client,
    ns: String,
    timeout: Duration,
    log: Vec<String>,
    /// (kind, name), deleted in reverse order.
    created: Vec<(String, String)>,
    suffix: String,
}

impl Ctx {
    fn note(&mut self, line: impl Into<String>) {
        self.log.push(line.into());
    }

    fn name(&self, base: &str) -> String {
        format!("sc-{base}-{}", self.suffix)
    }

    fn redis_api(&self) -> Api<Redis> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    fn backups(&self) -> Api<RedisBackup> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// The API of `kind`, one of the kinds a test creates.
    fn api_of(&self, kind: &str) -> Option<Api<DynamicObject>> {
        let ar = match kind {
            "Redis" => ApiResource::erase::<Redis>(&()),
            "RedisBackup" => ApiResource::erase::<RedisBackup>(&()),
            "PersistentVolumeClaim" => ApiResource::erase::<PersistentVolumeClaim>(&()),
            _ => return None,
        };
        Some(Api::namespaced_with(self.client.clone(), &self.ns, &ar))
    }

    /// Server-side applies `object` (its `kind` one of those of
    /// [`Ctx::api_of`]) and remembers it for cleanup.
    async fn apply(&mut self, object: Value) -> Result<(), Failure> {
        let kind = object["kind"].as_str().unwrap_or_default().to_string();
        let name = object["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let api = self.api_of(&kind).ok_or_else(|| {
            Failure::new(
                format!("the scorecard does not create {kind:?} objects"),
                "a test may create Redis, RedisBackup and PersistentVolumeClaim objects",
            )
        })?;
        let pp = PatchParams::apply(MANAGER).force();
        let res = api.patch(&name, &pp, &Patch::Apply(&object)).await;
        if !self.created.iter().any(|(k, n)| *k == kind && *n == name) {
            self.created.push((kind.clone(), name.clone()));
        }
        res.map(|_| ()).map_err(|e| {
            Failure::new(
                format!("creating {kind} {name} was refused: {e}"),
                "check that the Redpilot CRDs are installed and that the scorecard's ServiceAccount has scorecard/rbac.yaml's Role",
            )
        })
    }

    async fn cleanup(&mut self) {
        let dp = DeleteParams::background();
        while let Some((kind, name)) = self.created.pop() {
            let Some(api) = self.api_of(&kind) else {
                continue;
            };
            if let Err(e) = api.delete(&name, &dp).await {
                self.note(format!("cleanup: deleting {kind} {name}: {e}"));
            }
        }
    }

    /// Polls `probe` once a second until it gives a value, for at most
    /// `within`; on timeout the failure names `what` and the last state
    /// `probe` described.
    async fn wait<T, F, Fut>(
        &mut self,
        what: &str,
        within: Duration,
        suggestion: &str,
        mut probe: F,
    ) -> Result<(T, Duration), Failure>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, String>>,
    {
        let started = Instant::now();
        let mut last = String::from("not checked yet");
        while started.elapsed() < within {
            match probe().await {
                Ok(v) => {
                    let took = started.elapsed();
                    self.note(format!("{what}: {:.1}s", took.as_secs_f64()));
                    return Ok((v, took));
                }
                Err(state) => last = state,
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        Err(Failure::new(
            format!(
                "{what} did not happen within {}; last seen: {last}",
                seconds(within)
            ),
            suggestion,
        ))
    }

    /// Waits until Redis `name` passes `check` (which gives what it wants
    /// from the Redis, or says what is missing), for at most `within`
    /// (default: the test's bound); `what` and `suggestion` word the failure.
    async fn wait_redis<T>(
        &mut self,
        name: &str,
        within: Option<Duration>,
        what: &str,
        suggestion: &str,
        check: impl Fn(Redis) -> Result<T, String>,
    ) -> Result<(T, Duration), Failure> {
        let api = self.redis_api();
        let within = within.unwrap_or(self.timeout);
        let check = &check;
        self.wait(what, within, suggestion, || {
            let api = api.clone();
            let name = name.to_string();
            async move {
                let r = api
                    .get(&name)
                    .await
                    .map_err(|e| format!("reading it: {e}"))?;
                check(r)
            }
        })
        .await
    }

    /// Waits until Redis `name` is Ready for its current generation.
    async fn wait_ready(&mut self, name: &str) -> Result<(Redis, Duration), Failure> {
        self.wait_redis(
            name,
            None,
            &format!("Redis {name} Ready"),
            "is the Redpilot operator running and watching this namespace? See `kubectl describe redis` and the operator's log",
            |r| if ready(&r) { Ok(r) } else { Err(describe(&r)) },
        )
        .await
    }

    /// The password of Redis `r` (never logged).
    async fn password(&self, r: &Redis) -> Result<String, Failure> {
        let secret_name = r
            .status
            .as_ref()
            .and_then(|s| s.auth_secret.clone())
            .ok_or_else(|| {
                Failure::new(
                    format!("Redis {} reports no status.authSecret", r.name_any()),
                    "the operator publishes the password Secret's name in status.authSecret",
                )
            })?;
        let secret = Api::<Secret>::namespaced(self.client.clone(), &self.ns)
            .get(&secret_name)
            .await
            .map_err(|e| {
                Failure::new(
                    format!("reading Secret {secret_name}: {e}"),
                    "grant the scorecard's ServiceAccount `get` on secrets (scorecard/rbac.yaml)",
                )
            })?;
        secret
            .data
            .as_ref()
            .and_then(|d| d.get("password"))
            .and_then(|b| String::from_utf8(b.0.clone()).ok())
            .ok_or_else(|| {
                Failure::new(
                    format!("Secret {secret_name} has no `password` key"),
                    "the operator writes the password under the key `password`",
                )
            })
    }

    /// The IP of pod `pod`.
    async fn pod_ip(&self, pod: &str) -> Result<String, Failure> {
        self.pods()
            .get(pod)
            .await
            .ok()
            .and_then(|p| p.status?.pod_ip)
            .filter(|ip| !ip.is_empty())
            .ok_or_else(|| {
                Failure::new(
                    format!("pod {pod} has no IP"),
                    "check the pod with `kubectl describe pod`",
                )
            })
    }

    /// Connects to the server of pod `pod`.
    async fn connect(&self, pod: &str, password: &str) -> Result<Node, Failure> {
        let ip = self.pod_ip(pod).await?;
        Node::connect(
            &Endpoint::new(&ip, 6379),
            &ConnectOptions::default()
                .with_password(password)
                .with_timeouts(Duration::from_secs(5), Duration::from_secs(10)),
        )
        .await
        .map_err(|e| {
            Failure::new(
                format!("connecting to the server of pod {pod} ({ip}:6379): {e}"),
                "the scorecard pod must reach the Redis pods on port 6379 (check NetworkPolicies)",
            )
        })
    }
}

/// `30s`, or `0.3s` for a bound below a whole second.
fn seconds(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{:.1}s", d.as_secs_f64())
    }
}

/// Ready for the current generation.
fn ready(r: &Redis) -> bool {
    let Some(status) = r.status.as_ref() else {
        return false;
    };
    status.observed_generation.is_some()
        && status.observed_generation == r.metadata.generation
        && status.phase == Some(Phase::Ready)
        && status.ready()
}

/// A one-line picture of a Redis for failure messages.
fn describe(r: &Redis) -> String {
    let Some(s) = r.status.as_ref() else {
        return "no status yet (no operator has reconciled it)".into();
    };
    let conds: Vec<String> = s
        .conditions
        .iter()
        .filter(|c| c.status != "True" || c.type_ == "Ready")
        .map(|c| format!("{}={} {}: {}", c.type_, c.status, c.reason, c.message))
        .collect();
    format!(
        "phase {:?}, ready {}, primary {}, generation {:?} observed {:?}; {}",
        s.phase,
        s.ready.clone().unwrap_or_default(),
        s.primary.clone().unwrap_or_default(),
        r.metadata.generation,
        s.observed_generation,
        conds.join("; ")
    )
}

pub(super) fn redis_failed(what: &str, e: impl std::fmt::Display) -> Failure {
    Failure::new(
        format!("{what}: {e}"),
        "see the server's log (`kubectl logs <pod> -c redis`) and the Redis's events",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_serialize_as_the_scorecard_reads_them() {
        let s = TestStatus {
            results: vec![TestResult {
                name: "redpilot-basic-install".into(),
                log: "a\nb".into(),
                state: "fail",
                errors: vec!["Basic Install: x".into()],
                suggestions: vec!["y".into()],
            }],
        };
        let v: Value = serde_json::to_value(&s).unwrap_or_default();
        assert_eq!(v["results"][0]["state"], "fail");
        assert_eq!(v["results"][0]["errors"][0], "Basic Install: x");
        assert_eq!(v["results"][0]["suggestions"][0], "y");
        assert_eq!(v["results"][0]["log"], "a\nb");
        let pass = TestResult {
            name: "n".into(),
            log: String::new(),
            state: "pass",
            errors: vec![],
            suggestions: vec![],
        };
        let v = serde_json::to_value(&pass).unwrap_or_default();
        assert_eq!(v, serde_json::json!({"name": "n", "state": "pass"}));
    }

    #[test]
    fn levels_are_in_capability_order_and_names_unique() {
        let levels: Vec<&str> = TESTS.iter().map(|t| t.level).collect();
        assert_eq!(
            levels,
            [
                "Basic Install",
                "Basic Install",
                "Seamless Upgrades",
                "Full Lifecycle",
                "Deep Insights",
                "Auto Pilot",
                "Auto Pilot",
                "Auto Pilot"
            ]
        );
        let names: std::collections::BTreeSet<&str> = TESTS.iter().map(|t| t.name).collect();
        assert_eq!(names.len(), TESTS.len());
    }

    #[test]
    fn the_claimable_level_needs_every_lower_level() {
        assert_eq!(highest_level(&[]), None);
        assert_eq!(
            highest_level(&["redpilot-basic-install", "redpilot-cluster-install"]),
            Some("Basic Install")
        );
        // Basic Install needs its Cluster test too.
        assert_eq!(highest_level(&["redpilot-basic-install"]), None);
        let all: Vec<&str> = TESTS.iter().map(|t| t.name).collect();
        assert_eq!(highest_level(&all), Some("Auto Pilot"));
        // A gap stops the climb: failover passing does not lift a Redis
        // whose backups fail above Seamless Upgrades.
        let gap = [
            "redpilot-basic-install",
            "redpilot-cluster-install",
            "redpilot-seamless-upgrades",
            "redpilot-deep-insights",
            "redpilot-auto-pilot",
        ];
        assert_eq!(highest_level(&gap), Some("Seamless Upgrades"));
        assert_eq!(highest_level(&["redpilot-auto-pilot"]), None);
        // Auto Pilot needs both of its tests: failover alone earns only
        // the level below.
        let no_memory: Vec<&str> = all
            .iter()
            .copied()
            .filter(|n| *n != "redpilot-memory-autopilot")
            .collect();
        assert_eq!(highest_level(&no_memory), Some("Deep Insights"));
        let no_failover: Vec<&str> = all
            .iter()
            .copied()
            .filter(|n| *n != "redpilot-auto-pilot")
            .collect();
        assert_eq!(highest_level(&no_failover), Some("Deep Insights"));
        // Nor without Cluster mode's shard autopilot.
        let no_shards: Vec<&str> = all
            .iter()
            .copied()
            .filter(|n| *n != "redpilot-shard-autopilot")
            .collect();
        assert_eq!(highest_level(&no_shards), Some("Deep Insights"));
    }

    #[test]
    fn suffixes_are_name_safe() {
        let s = suffix();
        assert_eq!(s.len(), 5);
        assert!(
            s.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        );
    }
}
