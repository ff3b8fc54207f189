//! Drift detection (pure): does a live child still hold every field the
//! operator wants it to hold?
//!
//! The operator applies children with server-side apply and one field
//! manager, so the fields it owns are exactly the fields of the desired
//! object. A child has drifted when one of those fields differs on the live
//! object (a hand edit, another controller) or is missing. Fields only the
//! live object has — server defaults, a user's annotation, another
//! manager's list entries — are not drift: server-side apply leaves them
//! alone too, so treating them as drift would write on every pass.
//!
//! The comparison works on the JSON form of both objects:
//! - objects: every key of the desired object must be covered by the live
//!   one; an empty desired value (`{}`, `[]`, `null`) is covered by an absent
//!   key (the API server drops empty maps and lists);
//! - lists whose items all carry a merge key (`name`, `uid`, or for ports
//!   `containerPort`/`port`) are matched by that key, like a server-side
//!   apply map-list, so entries another manager added do not count;
//! - other lists (commands, access modes) are atomic: same length, item by
//!   item;
//! - strings that are Kubernetes quantities compare by value (`1Gi` and
//!   `1024Mi` are the same), since the API server rewrites them to their
//!   canonical form.

use serde_json::Value;

use super::facts::quantity_value;

/// Whether `live` holds every field of `desired` with the same value.
pub fn covers(live: &Value, desired: &Value) -> bool {
    match (live, desired) {
        (_, Value::Null) => true,
        (Value::Object(l), Value::Object(d)) => d.iter().all(|(k, dv)| match l.get(k) {
            Some(lv) => covers(lv, dv),
            None => is_empty(dv),
        }),
        (Value::Array(l), Value::Array(d)) => lists_cover(l, d),
        (Value::String(l), Value::String(d)) => l == d || same_quantity(l, d),
        (Value::Number(l), Value::Number(d)) => l.as_f64() == d.as_f64(),
        (l, d) => l == d,
    }
}

/// Absent on the live side is as good as empty on the desired side.
fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Object(m) => m.is_empty(),
        Value::Array(a) => a.is_empty(),
        _ => false,
    }
}

/// The merge key every item of `items` carries, if there is one.
fn merge_key(items: &[Value]) -> Option<&'static str> {
    ["name", "uid", "containerPort", "port"]
        .into_iter()
        .find(|k| !items.is_empty() && items.iter().all(|i| i.get(k).is_some()))
}

fn lists_cover(live: &[Value], desired: &[Value]) -> bool {
    match merge_key(desired) {
        Some(key) => desired.iter().all(|d| {
            live.iter()
                .find(|l| l.get(key) == d.get(key))
                .is_some_and(|l| covers(l, d))
        }),
        None => live.len() == desired.len() && live.iter().zip(desired).all(|(l, d)| covers(l, d)),
    }
}

/// Two spellings of the same quantity ("1Gi" and "1024Mi", "0.5" and "500m").
fn same_quantity(a: &str, b: &str) -> bool {
    let starts_numeric = |s: &str| s.starts_with(|c: char| c.is_ascii_digit() || c == '.');
    if !starts_numeric(a) || !starts_numeric(b) {
        return false;
    }
    match (quantity_value(a), quantity_value(b)) {
        (Some(x), Some(y)) => (x - y).abs() <= 1e-9 * x.abs().max(y.abs()),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn extra_live_fields_are_not_drift() {
        let desired =
            json!({"metadata": {"name": "a", "labels": {"x": "1"}}, "spec": {"replicas": 3}});
        let live = json!({
            "metadata": {"name": "a", "labels": {"x": "1"}, "annotations": {"user": "mine"},
                         "resourceVersion": "9"},
            "spec": {"replicas": 3, "revisionHistoryLimit": 10},
            "status": {"readyReplicas": 3}
        });
        assert!(covers(&live, &desired));
    }

    #[test]
    fn changed_or_missing_owned_fields_are_drift() {
        let desired = json!({"spec": {"replicas": 3, "selector": {"role": "primary"}}});
        assert!(!covers(
            &json!({"spec": {"replicas": 1, "selector": {"role": "primary"}}}),
            &desired
        ));
        assert!(!covers(
            &json!({"spec": {"replicas": 3, "selector": {"role": "replica"}}}),
            &desired
        ));
        assert!(!covers(&json!({"spec": {"replicas": 3}}), &desired));
        assert!(!covers(
            &json!({"spec": {"replicas": 3, "selector": {}}}),
            &desired
        ));
    }

    #[test]
    fn empty_desired_values_match_absent_ones() {
        let desired =
            json!({"metadata": {"annotations": {}}, "spec": {"tolerations": [], "x": null}});
        assert!(covers(&json!({"metadata": {}, "spec": {}}), &desired));
    }

    #[test]
    fn keyed_lists_match_by_key_and_allow_foreign_entries() {
        let desired = json!({"containers": [{"name": "redis", "image": "redis:7.0"}]});
        let with_sidecar = json!({"containers": [
            {"name": "debug", "image": "busybox"},
            {"name": "redis", "image": "redis:7.0", "terminationMessagePath": "/dev/termination-log"}
        ]});
        assert!(covers(&with_sidecar, &desired));
        let changed = json!({"containers": [{"name": "redis", "image": "redis:6.2"}]});
        assert!(!covers(&changed, &desired));
        let gone = json!({"containers": [{"name": "debug", "image": "busybox"}]});
        assert!(!covers(&gone, &desired));
    }

    #[test]
    fn atomic_lists_compare_item_by_item() {
        let desired = json!({"command": ["sh", "-c", "exec redis-server"]});
        assert!(covers(
            &json!({"command": ["sh", "-c", "exec redis-server"]}),
            &desired
        ));
        assert!(!covers(&json!({"command": ["sh", "-c"]}), &desired));
        assert!(!covers(
            &json!({"command": ["sh", "-c", "exec redis-server", "x"]}),
            &desired
        ));
        assert!(!covers(
            &json!({"command": ["sh", "-x", "exec redis-server"]}),
            &desired
        ));
    }

    #[test]
    fn quantities_compare_by_value() {
        let d = |q: &str| json!({"limits": {"memory": q}});
        assert!(covers(&d("1Gi"), &d("1024Mi")));
        assert!(covers(&d("1"), &d("1000m")));
        assert!(covers(&d("500m"), &d("0.5")));
        assert!(!covers(&d("100m"), &d("200m")));
        assert!(!covers(&d("1Gi"), &d("1G")));
        // Words are never quantities.
        assert!(!covers(
            &json!({"policy": "Retain"}),
            &json!({"policy": "Delete"})
        ));
        assert!(!covers(
            &json!({"name": "redis"}),
            &json!({"name": "redis-1"})
        ));
    }

    #[test]
    fn numbers_and_kinds() {
        assert!(covers(&json!({"port": 6379}), &json!({"port": 6379})));
        assert!(!covers(&json!({"port": 6380}), &json!({"port": 6379})));
        assert!(!covers(&json!({"port": "6379"}), &json!({"port": 6379})));
        assert!(!covers(&json!({"a": true}), &json!({"a": false})));
    }
}
