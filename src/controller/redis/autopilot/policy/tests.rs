//! Table tests of the memory decision, including inputs that flap around
//! both thresholds.

use super::*;

const MI: u64 = 1 << 20;

/// 80 % up, 30 % down, 50 % step, 64Mi..512Mi, 600 s cooldown, 60 s
/// lookahead.
fn policy() -> Policy {
    Policy {
        up: 0.8,
        down: 0.3,
        step: 0.5,
        min: 64 * MI,
        max: 512 * MI,
        cooldown: 600,
        lookahead: 60,
    }
}

fn at(limit: u64, used: u64) -> Observed {
    Observed {
        used,
        rate: Some(0.0),
        limit,
        now: 10_000,
        below_since: None,
        last_change: None,
        bound: None,
    }
}

/// The decision's kind and size, for tables.
fn short(d: &Decision) -> (&'static str, u64) {
    match d {
        Decision::Keep => ("keep", 0),
        Decision::Grow { to, .. } => ("grow", *to),
        Decision::Shrink { to, .. } => ("shrink", *to),
        Decision::AtMaximum { wanted, .. } => ("max", *wanted),
        Decision::Bounded { wanted, .. } => ("bounded", *wanted),
    }
}

#[test]
fn table() {
    // maxmemory of 64Mi is 48Mi; 80 % of it is 38.4Mi.
    let p = policy();
    let cases: Vec<(&str, Observed, (&str, u64))> = vec![
        ("idle", at(64 * MI, 10 * MI), ("keep", 0)),
        ("just below up", at(64 * MI, 38 * MI), ("keep", 0)),
        // 39Mi at 80 %: 50 % step gives 96Mi; the band's middle (55 %)
        // needs 39/0.55*4/3 = 94.5Mi → 95Mi; the step wins.
        ("at up: one step", at(64 * MI, 39 * MI), ("grow", 96 * MI)),
        (
            "fast fill: sized by the rate",
            Observed {
                rate: Some(MI as f64),
                ..at(64 * MI, 30 * MI)
            },
            // (30 + 60) / 0.55 * 4/3 = 218.2Mi → 219Mi
            ("grow", 219 * MI),
        ),
        (
            "slow fill far from the limit: keep",
            Observed {
                rate: Some(1024.0),
                ..at(64 * MI, 20 * MI)
            },
            ("keep", 0),
        ),
        (
            "shrinking dataset above up still grows (it is above now)",
            Observed {
                rate: Some(-(MI as f64)),
                ..at(64 * MI, 40 * MI)
            },
            // 40 / 0.55 * 4/3 = 97.0Mi: the band's middle wins over the step.
            ("grow", 97 * MI),
        ),
        ("capped at max", at(400 * MI, 260 * MI), ("grow", 512 * MI)),
        ("at max", at(512 * MI, 400 * MI), ("max", 970 * MI)),
        (
            "quota bound below the step",
            Observed {
                bound: Some((80 * MI, Bound::Quota)),
                ..at(64 * MI, 39 * MI)
            },
            ("grow", 80 * MI),
        ),
        (
            "quota bound at the limit",
            Observed {
                bound: Some((64 * MI, Bound::Quota)),
                ..at(64 * MI, 39 * MI)
            },
            ("bounded", 96 * MI),
        ),
        ("below min grows to min", at(32 * MI, MI), ("grow", 64 * MI)),
        (
            "shrink after the cooldown to the band's middle",
            Observed {
                below_since: Some(10_000 - 600),
                last_change: Some(10_000 - 700),
                ..at(512 * MI, 100 * MI)
            },
            // 100 / 0.55 * 4/3 = 242.4Mi → 243Mi
            ("shrink", 243 * MI),
        ),
        (
            "no shrink before the cooldown",
            Observed {
                below_since: Some(10_000 - 599),
                ..at(512 * MI, 100 * MI)
            },
            ("keep", 0),
        ),
        (
            "no shrink soon after a grow",
            Observed {
                below_since: Some(10_000 - 900),
                last_change: Some(10_000 - 100),
                ..at(512 * MI, 100 * MI)
            },
            ("keep", 0),
        ),
        (
            "no shrink while growing toward the threshold",
            Observed {
                below_since: Some(10_000 - 900),
                rate: Some(MI as f64),
                ..at(512 * MI, 100 * MI)
            },
            ("keep", 0),
        ),
        (
            "shrink never below min",
            Observed {
                below_since: Some(0),
                ..at(512 * MI, MI)
            },
            ("shrink", 64 * MI),
        ),
        (
            "no shrink by less than a tenth",
            Observed {
                below_since: Some(0),
                ..at(70 * MI, MI)
            },
            ("keep", 0),
        ),
        (
            "limit above a lowered max shrinks to max when the data fits",
            at(1024 * MI, 100 * MI),
            ("shrink", 512 * MI),
        ),
    ];
    for (name, o, want) in cases {
        let d = decide(&p, &o);
        assert_eq!(short(&d), want, "{name}: {d:?}");
    }
}

#[test]
fn every_grow_and_shrink_lands_between_the_thresholds() {
    let p = policy();
    for used_mi in 1..400u64 {
        for limit_mi in [64u64, 96, 128, 200, 256, 384, 512] {
            let o = Observed {
                below_since: Some(0),
                ..at(limit_mi * MI, used_mi * MI)
            };
            let to = match decide(&p, &o) {
                Decision::Grow { to, .. } | Decision::Shrink { to, .. } => to,
                _ => continue,
            };
            if to == p.max || to == p.min {
                continue;
            }
            let after = Observed {
                limit: to,
                last_change: None,
                ..o
            };
            assert_eq!(
                decide(&p, &after),
                Decision::Keep,
                "used {used_mi}Mi at {limit_mi}Mi went to {}Mi and would move again",
                to / MI
            );
        }
    }
}

/// Runs the decision over a series of used sizes, one sample every 30 s,
/// applying each change and keeping `below_since` as the module does.
fn run(p: &Policy, start: u64, series: &[u64]) -> Vec<(&'static str, u64)> {
    let mut limit = start;
    let mut below_since = None;
    let mut last_change = None;
    let mut out = Vec::new();
    for (i, used) in series.iter().enumerate() {
        let now = 1_000 + 30 * i as i64;
        if below_down(p, *used, limit) {
            below_since.get_or_insert(now);
        } else {
            below_since = None;
        }
        let d = decide(
            p,
            &Observed {
                used: *used,
                rate: None,
                limit,
                now,
                below_since,
                last_change,
                bound: None,
            },
        );
        match d {
            Decision::Grow { to, .. } | Decision::Shrink { to, .. } => {
                out.push((short(&d).0, to));
                limit = to;
                last_change = Some(now);
                below_since = None;
            }
            Decision::Keep => {}
            other => out.push((short(&other).0, 0)),
        }
    }
    out
}

#[test]
fn flapping_around_the_upper_threshold_grows_once() {
    let p = policy();
    // 38.4Mi is 80 % of 48Mi: alternate just above and below it.
    let series: Vec<u64> = (0..60)
        .map(|i| if i % 2 == 0 { 39 * MI } else { 37 * MI })
        .collect();
    assert_eq!(run(&p, 64 * MI, &series), vec![("grow", 96 * MI)]);
}

#[test]
fn flapping_around_the_lower_threshold_never_shrinks() {
    let p = policy();
    // At 512Mi maxmemory is 384Mi; 30 % is 115.2Mi: cross it every minute
    // for an hour (longer than the cooldown in all).
    let series: Vec<u64> = (0..120)
        .map(|i| if i % 4 < 2 { 114 * MI } else { 117 * MI })
        .collect();
    assert_eq!(run(&p, 512 * MI, &series), vec![]);
}

#[test]
fn a_steady_drop_shrinks_once_after_the_cooldown() {
    let p = policy();
    let series: Vec<u64> = std::iter::repeat_n(300 * MI, 5)
        .chain(std::iter::repeat_n(20 * MI, 60))
        .collect();
    let got = run(&p, 512 * MI, &series);
    // 20Mi / 0.55 * 4/3 = 48.5 → 49Mi, under the 64Mi minimum.
    assert_eq!(got, vec![("shrink", 64 * MI)]);
}

#[test]
fn a_fill_to_three_times_grows_in_few_steps_and_stops_at_max() {
    let p = policy();
    let series: Vec<u64> = (0..400).map(|i| (i as u64) * MI).collect();
    let got = run(&p, 64 * MI, &series);
    let grows: Vec<u64> = got
        .iter()
        .filter(|(k, _)| *k == "grow")
        .map(|(_, to)| to / MI)
        .collect();
    assert_eq!(grows, vec![96, 144, 216, 324, 486, 512]);
    assert!(got.contains(&("max", 0)), "{got:?}");
    assert!(!got.iter().any(|(k, _)| *k == "shrink"), "{got:?}");
}

#[test]
fn policy_from_spec_defaults_min_to_the_base() {
    let spec = crate::api::v1alpha1::MemoryAutopilotSpec::with_max("1Gi");
    let p = Policy::from_spec(&spec, 64 * MI).unwrap();
    assert_eq!((p.min, p.max), (64 * MI, 1 << 30));
    assert_eq!((p.up, p.down, p.step), (0.8, 0.3, 0.5));
    let mut bad = spec.clone();
    bad.max_memory = k8s_openapi::apimachinery::pkg::api::resource::Quantity("lots".into());
    assert!(Policy::from_spec(&bad, 64 * MI).is_none());
}

#[test]
fn sizes_read_for_people() {
    assert_eq!(human(96 * MI), "96Mi");
    assert_eq!(human(1536 * MI), "1.5Gi");
    assert_eq!(human(512), "512");
    assert_eq!(quantity(96 * MI), "96Mi");
    assert_eq!(quantity(96 * MI + 1), format!("{}", 96 * MI + 1));
}
