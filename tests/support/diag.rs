//! What a timed-out wait prints besides its own message, so a failure in a
//! CI log explains itself: for every namespace the test created, each
//! Redis's phase, readiness, conditions and instances; each pod's readiness
//! with its last probe failure and its containers' states; the newest
//! events. (The last lines of every operator the test started are printed
//! when its handle drops during the panic.)
//!
//! The test body registers the namespaces it owns on its own thread
//! ([`TestNamespace`] does it); `#[tokio::test]` runs the body on the test's
//! thread, so parallel tests in one binary never see each other's objects.
//!
//! [`TestNamespace`]: super::TestNamespace

use std::cell::RefCell;
use std::fmt::Write as _;

use k8s_openapi::api::core::v1::{Event, Pod};
use kube::Api;
use kube::api::ListParams;
use redpilot::api::v1alpha1::Redis;

#[derive(Default)]
struct Scope {
    namespaces: Vec<String>,
}

thread_local! {
    static SCOPE: RefCell<Scope> = RefCell::new(Scope::default());
}

/// A namespace whose objects a timed-out wait on this thread describes.
pub fn track_namespace(ns: &str) {
    SCOPE.with(|s| s.borrow_mut().namespaces.push(ns.to_string()));
}

/// The namespace is gone: no longer described.
pub fn untrack_namespace(ns: &str) {
    SCOPE.with(|s| s.borrow_mut().namespaces.retain(|n| n != ns));
}

/// Events per namespace printed on a timeout.
const EVENTS: usize = 30;

/// The report of everything this thread tracks (empty when nothing is).
pub async fn report() -> String {
    let namespaces = SCOPE.with(|s| s.borrow().namespaces.clone());
    let mut out = String::new();
    if !namespaces.is_empty() {
        match super::try_client().await {
            Some(client) => {
                for ns in &namespaces {
                    out.push_str(&describe_namespace(&client, ns).await);
                }
            }
            None => out.push_str("\n(cannot reach the cluster to describe the test's objects)\n"),
        }
    }
    out
}

async fn describe_namespace(client: &kube::Client, ns: &str) -> String {
    let mut out = format!("\n--- namespace {ns} ---\n");
    let redis: Api<Redis> = Api::namespaced(client.clone(), ns);
    match redis.list(&ListParams::default()).await {
        Ok(list) => {
            for r in list.items {
                out.push_str(&describe_redis(&r));
            }
        }
        Err(e) => {
            let _ = writeln!(out, "(listing Redis: {e})");
        }
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let events: Vec<Event> = Api::<Event>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    match pods.list(&ListParams::default()).await {
        Ok(list) => {
            for p in list.items {
                out.push_str(&describe_pod(&p, &events));
            }
        }
        Err(e) => {
            let _ = writeln!(out, "(listing pods: {e})");
        }
    }
    let _ = writeln!(out, "newest events:");
    out.push_str(&super::operator::recent_events(client, ns, EVENTS).await);
    out.push('\n');
    out
}

fn describe_redis(r: &Redis) -> String {
    let name = r.metadata.name.as_deref().unwrap_or("?");
    let mut out = String::new();
    let Some(s) = &r.status else {
        let _ = writeln!(
            out,
            "Redis {name}: no status (generation {:?})",
            r.metadata.generation
        );
        return out;
    };
    let _ = writeln!(
        out,
        "Redis {name}: phase {:?}, ready {}, primary {}, generation {:?} (observed {:?})",
        s.phase,
        s.ready.as_deref().unwrap_or("?"),
        s.primary.as_deref().unwrap_or("-"),
        r.metadata.generation,
        s.observed_generation
    );
    for c in &s.conditions {
        let _ = writeln!(
            out,
            "  condition {}={} {}: {} (since {})",
            c.type_, c.status, c.reason, c.message, c.last_transition_time.0
        );
    }
    if let Some(c) = &s.cluster {
        let _ = writeln!(
            out,
            "  cluster state {}, {} slots assigned, {} ok, {} nodes known",
            c.state, c.slots_assigned, c.slots_ok, c.known_nodes
        );
    }
    for sh in &s.shards {
        let _ = writeln!(
            out,
            "  shard {} primary {} replicas [{}] slots {} ready {}",
            sh.index,
            sh.primary.as_deref().unwrap_or("-"),
            sh.replicas.join(", "),
            sh.slots.as_deref().unwrap_or("-"),
            sh.ready
        );
    }
    if let Some(r) = &s.resharding {
        let _ = writeln!(out, "  resharding {r:?}");
    }
    for i in &s.instances {
        let _ = writeln!(
            out,
            "  instance {} role {} ready {} link {:?} offset {:?} lag {:?}",
            i.name, i.role, i.ready, i.link_up, i.offset, i.lag_bytes
        );
    }
    out
}

fn describe_pod(p: &Pod, events: &[Event]) -> String {
    let name = p.metadata.name.as_deref().unwrap_or("?");
    let mut out = String::new();
    let status = p.status.clone().unwrap_or_default();
    let ready = status
        .conditions
        .as_deref()
        .unwrap_or(&[])
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| {
            format!(
                "{} {}{} (since {:?})",
                c.status,
                c.reason.as_deref().unwrap_or(""),
                c.message
                    .as_deref()
                    .map(|m| format!(": {m}"))
                    .unwrap_or_default(),
                c.last_transition_time.as_ref().map(|t| t.0)
            )
        })
        .unwrap_or_else(|| "no Ready condition".into());
    let _ = writeln!(
        out,
        "pod {name}: phase {}, ip {}, Ready {ready}{}",
        status.phase.as_deref().unwrap_or("?"),
        status.pod_ip.as_deref().unwrap_or("-"),
        if p.metadata.deletion_timestamp.is_some() {
            ", terminating"
        } else {
            ""
        }
    );
    for c in status.container_statuses.as_deref().unwrap_or(&[]) {
        let state = c
            .state
            .as_ref()
            .map(|s| {
                if let Some(r) = &s.running {
                    format!("running since {:?}", r.started_at.as_ref().map(|t| t.0))
                } else if let Some(w) = &s.waiting {
                    format!(
                        "waiting {} {}",
                        w.reason.as_deref().unwrap_or(""),
                        w.message.as_deref().unwrap_or("")
                    )
                } else if let Some(t) = &s.terminated {
                    format!(
                        "terminated {} ({})",
                        t.exit_code,
                        t.reason.as_deref().unwrap_or("")
                    )
                } else {
                    "unknown".into()
                }
            })
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "  container {}: ready {}, restarts {}, {state}",
            c.name, c.ready, c.restart_count
        );
    }
    // The newest probe failure the node reported for this pod.
    let probe = events
        .iter()
        .filter(|e| e.involved_object.name.as_deref() == Some(name))
        .filter(|e| e.reason.as_deref() == Some("Unhealthy"))
        .max_by_key(|e| {
            e.last_timestamp
                .as_ref()
                .map(|t| t.0)
                .or_else(|| e.event_time.as_ref().map(|t| t.0))
        });
    if let Some(e) = probe {
        let _ = writeln!(
            out,
            "  last probe failure ({:?}, x{}): {}",
            e.last_timestamp
                .as_ref()
                .map(|t| t.0)
                .or_else(|| e.event_time.as_ref().map(|t| t.0)),
            e.count.unwrap_or(1),
            e.message.as_deref().unwrap_or("")
        );
    }
    out
}
