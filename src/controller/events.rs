//! Events: one recorder per term, one way to publish. Imports nothing of
//! the controller.

use std::sync::Mutex;
use std::time::Duration;

use kube::Client;
use kube::runtime::events::{Recorder, Reporter};

use crate::telemetry::Metrics;

/// The event recorder of every controller: reported as `redpilot`, the
/// instance being the operator's pod.
pub fn recorder(client: &Client) -> Recorder {
    Recorder::new(
        client.clone(),
        Reporter {
            controller: "redpilot".into(),
            instance: std::env::var("POD_NAME").ok(),
        },
    )
}

/// How long one [`Recorder`] serves before [`Events`] starts a new one:
/// its cache's time to live (kube-runtime keeps an event for six minutes,
/// to fold a repeat into a series).
const RECORDER_TERM: Duration = Duration::from_secs(6 * 60);

/// The Redis controller's event recorder: the first event published more
/// than [`RECORDER_TERM`] after the current recorder was made gets a new
/// one. A recorder's cache forgets events after six minutes but keeps the
/// room they took: with 1,100 Redis starting at once it held 7.4 MB
/// (`heaptrack`, `make bench`) for the life of the process. A new
/// recorder starts with an empty cache; a repeat that falls across the
/// change starts a new event instead of counting on in the old one's
/// series.
pub struct Events {
    client: Client,
    current: Mutex<(Recorder, std::time::Instant)>,
}

impl Events {
    /// A recorder for `client`.
    pub fn new(client: &Client) -> Self {
        Events {
            client: client.clone(),
            current: Mutex::new((recorder(client), std::time::Instant::now())),
        }
    }

    /// The recorder to publish with now.
    pub fn recorder(&self) -> Recorder {
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        if current.1.elapsed() >= RECORDER_TERM {
            *current = (recorder(&self.client), std::time::Instant::now());
        }
        current.0.clone()
    }
}

/// Publishes one event about `obj` (its note cut to the API's bound);
/// a failure to publish is logged, never fatal.
pub async fn publish_event(
    recorder: &Recorder,
    metrics: &Metrics,
    obj: &k8s_openapi::api::core::v1::ObjectReference,
    type_: kube::runtime::events::EventType,
    reason: &str,
    action: &str,
    note: String,
) {
    metrics.kube("create_event");
    // Every event is also a log line (inside a reconcile: with its trace id).
    let object = format!(
        "{}/{}/{}",
        obj.kind.as_deref().unwrap_or(""),
        obj.namespace.as_deref().unwrap_or(""),
        obj.name.as_deref().unwrap_or("")
    );
    match type_ {
        kube::runtime::events::EventType::Warning => {
            tracing::warn!(reason, object, note = %note, "event")
        }
        kube::runtime::events::EventType::Normal => {
            tracing::info!(reason, object, note = %note, "event")
        }
    }
    let ev = kube::runtime::events::Event {
        type_,
        reason: reason.into(),
        note: Some(event_note(note)),
        action: action.into(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&ev, obj).await {
        tracing::warn!(error = %e, reason, "publishing an event failed");
    }
}

/// An event's note within the API's bound (1,024 characters).
pub fn event_note(note: String) -> String {
    const MAX: usize = 1000;
    if note.chars().count() <= MAX {
        return note;
    }
    let mut n: String = note.chars().take(MAX - 1).collect();
    n.push('…');
    n
}
