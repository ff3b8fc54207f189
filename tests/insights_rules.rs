//! The shipped alert rules and dashboards, checked without a cluster:
//! `redpilot rules` matches `config/prometheus/rules.yaml`, promtool accepts
//! the rules and passes every alert's unit test
//! (`config/prometheus/tests/`), the operator's PrometheusRule carries the
//! same operator group, and every dashboard query uses only the variables
//! the dashboard test substitutes.

mod support;

use std::path::PathBuf;
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn promtool() -> PathBuf {
    let p = root().join("bin/promtool");
    assert!(
        p.exists(),
        "bin/promtool is missing: build it with `make tools-prometheus` (tools/build.sh prometheus)"
    );
    p
}

fn rules_text() -> String {
    std::fs::read_to_string(root().join("config/prometheus/rules.yaml")).expect("rules.yaml")
}

#[test]
fn the_checked_in_rules_are_what_the_operator_generates() {
    let out = Command::new(env!("CARGO_BIN_EXE_redpilot"))
        .arg("rules")
        .output()
        .expect("run redpilot rules");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        rules_text(),
        "config/prometheus/rules.yaml is stale: run `redpilot rules --output config/prometheus/rules.yaml`"
    );
}

#[test]
fn promtool_accepts_the_rules_and_every_alert_passes_its_unit_tests() {
    let check = Command::new(promtool())
        .args(["check", "rules"])
        .arg(root().join("config/prometheus/rules.yaml"))
        .output()
        .expect("promtool check rules");
    let text = String::from_utf8_lossy(&check.stdout).to_string()
        + &String::from_utf8_lossy(&check.stderr);
    assert!(check.status.success(), "{text}");
    assert!(text.contains("SUCCESS: 21 rules found"), "{text}");

    let tests = root().join("config/prometheus/tests");
    let files: Vec<PathBuf> = std::fs::read_dir(&tests)
        .expect("tests dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.to_string_lossy().ends_with(".test.yaml"))
        .collect();
    assert!(!files.is_empty(), "no rule tests in {}", tests.display());
    let run = Command::new(promtool())
        .current_dir(&tests)
        .args(["test", "rules"])
        .args(&files)
        .output()
        .expect("promtool test rules");
    let text =
        String::from_utf8_lossy(&run.stdout).to_string() + &String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{text}");
    // Every alert of the rules file has a test that expects it to fire.
    let tested: String = files
        .iter()
        .map(|f| std::fs::read_to_string(f).unwrap_or_default())
        .collect();
    let rules: serde_yaml::Value = serde_yaml::from_str(&rules_text()).expect("yaml");
    let mut alerts = 0;
    for g in rules["groups"].as_sequence().expect("groups") {
        for r in g["rules"].as_sequence().expect("rules") {
            let name = r["alert"].as_str().expect("alert");
            alerts += 1;
            assert!(
                tested.contains(&format!("alertname: {name}")),
                "alert {name} has no promtool test"
            );
        }
    }
    assert_eq!(alerts, 21);
}

#[test]
fn the_operator_prometheus_rule_carries_the_operator_group() {
    let text = std::fs::read_to_string(root().join("config/prometheus/podmonitor-operator.yaml"))
        .expect("podmonitor-operator.yaml");
    let docs: Vec<serde_yaml::Value> = serde_yaml::Deserializer::from_str(&text)
        .map(|d| serde::Deserialize::deserialize(d).expect("yaml"))
        .collect();
    let rule = docs
        .iter()
        .find(|d| d["kind"] == "PrometheusRule")
        .expect("a PrometheusRule");
    let rules: serde_yaml::Value = serde_yaml::from_str(&rules_text()).expect("yaml");
    let want = rules["groups"]
        .as_sequence()
        .and_then(|g| g.iter().find(|g| g["name"] == "redpilot.operator"))
        .expect("operator group");
    assert_eq!(
        &rule["spec"]["groups"][0], want,
        "the operator's PrometheusRule is stale"
    );
    let monitor = docs
        .iter()
        .find(|d| d["kind"] == "PodMonitor")
        .expect("a PodMonitor");
    assert_eq!(
        monitor["spec"]["podMetricsEndpoints"][0]["honorLabels"],
        true
    );
}

#[test]
fn dashboards_query_only_what_the_scrape_provides() {
    for file in ["redpilot-fleet.json", "redpilot-redis.json"] {
        let mut exprs = support::prometheus::dashboard_exprs(file);
        assert!(exprs.len() >= 20, "{file}: {} queries", exprs.len());
        for row in support::prometheus::dashboard_collapsed_rows(file) {
            let inside = support::prometheus::dashboard_row_exprs(file, &row);
            assert!(!inside.is_empty(), "{file}: row {row} has no query");
            exprs.extend(inside);
        }
        for e in &exprs {
            let vars: Vec<&str> = e
                .match_indices('$')
                .map(|(i, _)| {
                    let rest = &e[i + 1..];
                    let end = rest
                        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                        .unwrap_or(rest.len());
                    &rest[..end]
                })
                .collect();
            for v in vars {
                assert!(
                    ["namespace", "redis", "__rate_interval"].contains(&v),
                    "{file}: ${v} in {e}"
                );
            }
        }
    }
}
