//! Operator upgrades restart no instance: when a new operator release
//! builds a different pod template for a spec that did not change (a probe,
//! a start script, a label), the running instances keep the template an
//! earlier release gave them, and take the new one when they are next
//! re-created (a failover, a deleted pod, the next roll the spec asks for).
//!
//! The StatefulSet records, in annotations the operator owns:
//! - [`GENERATION_ANNOTATION`]: the Redis generation its template was built
//!   for (a StatefulSet written by a release before 0.2.0 has none; the
//!   Redis's `status.observedGeneration` stands in for it);
//! - [`TEMPLATE_HASH_ANNOTATION`]: a hash of the template as built;
//! - [`KEPT_ANNOTATION`]: the template revisions that count as current.
//!
//! A template that differs while the generation is the same, with the same
//! server image, is the operator's change: the revision the instances run
//! is kept. A spec change (a new generation) that changes the template
//! clears the list, and every instance rolls, as before. A changed server
//! image is never the operator's alone to skip: it always rolls (the
//! upgrade module's switchover rules apply). Nor is a template that mounts
//! the TLS files where the running one does not, or the other way round:
//! turning TLS off ends with such a change in the same generation (the
//! files are kept until no instance listens with TLS), and it must roll.
//! Nor one whose server starts listening otherwise (a Cluster Redis that
//! turned TLS on or off live rolls onto the template that starts it so).

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::StatefulSet;

use crate::controller::layout::{self, sts_observed};
use crate::controller::names;

/// The Redis generation the StatefulSet's template was built for.
pub const GENERATION_ANNOTATION: &str = "redpilot.io/generation";
/// A hash of the pod template as the operator built it.
pub const TEMPLATE_HASH_ANNOTATION: &str = "redpilot.io/template-hash";
/// Template revisions (comma-separated) that count as current.
pub const KEPT_ANNOTATION: &str = "redpilot.io/kept-revisions";

/// At most this many kept revisions are remembered.
const MAX_KEPT: usize = 5;

/// What the annotations say, and what to write.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Kept {
    /// The revisions that count as current.
    pub revisions: Vec<String>,
    /// A revision kept by this pass (an operator upgrade was noticed).
    pub newly: Option<String>,
}

fn annotation<'a>(sts: &'a StatefulSet, key: &str) -> Option<&'a str> {
    sts.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

/// The server container in the StatefulSet's template.
fn server_container(sts: &StatefulSet) -> Option<&k8s_openapi::api::core::v1::Container> {
    sts.spec
        .template
        .spec
        .as_ref()?
        .containers
        .iter()
        .find(|c| c.name == names::SERVER_CONTAINER)
}

/// Whether the StatefulSet's template mounts the servers' TLS files.
fn mounts_tls(sts: &StatefulSet) -> bool {
    sts.spec
        .template
        .spec
        .as_ref()
        .and_then(|p| p.volumes.as_ref())
        .is_some_and(|vs| {
            vs.iter()
                .any(|v| v.name == crate::controller::layout::TLS_VOLUME)
        })
}

/// How the template's server starts listening (TLS or not), and whether
/// its probe answers either way (a Cluster Redis turning TLS on or off).
pub(super) fn listens_as(sts: &StatefulSet) -> (bool, bool) {
    server_container(sts).map_or((false, false), |c| {
        (layout::probes_tls(c), layout::probes_either(c))
    })
}

/// The server container's image in the StatefulSet's template.
pub fn server_image(sts: &StatefulSet) -> Option<&str> {
    server_container(sts)?.image.as_deref()
}

/// The server container's resources in the StatefulSet's template.
pub fn server_resources(
    sts: &StatefulSet,
) -> Option<&k8s_openapi::api::core::v1::ResourceRequirements> {
    server_container(sts)?.resources.as_ref()
}

/// The revisions the live StatefulSet keeps.
pub fn kept_revisions(live: Option<&StatefulSet>) -> Vec<String> {
    live.and_then(|s| annotation(s, KEPT_ANNOTATION))
        .map(|v| {
            v.split(',')
                .filter(|r| !r.is_empty())
                .map(String::from)
                .collect()
        })
        .unwrap_or_default()
}

/// A hash of the desired StatefulSet's pod template.
pub fn template_hash(desired: &StatefulSet) -> String {
    let tpl = serde_json::to_string(&desired.spec.template).unwrap_or_default();
    names::stable_hash(&[&tpl])
}

/// Decides the kept revisions (pure). `generation` is the Redis's;
/// `observed` its `status.observedGeneration` (for a StatefulSet written
/// before the generation was recorded on it); `in_use` the revisions the
/// pods run.
pub fn decide(
    live: Option<&StatefulSet>,
    desired: &StatefulSet,
    generation: Option<i64>,
    observed: Option<i64>,
    in_use: &[String],
) -> Kept {
    let Some(live) = live else {
        return Kept::default();
    };
    let mut revisions: Vec<String> = kept_revisions(Some(live))
        .into_iter()
        .filter(|r| in_use.contains(r))
        .collect();
    let same_template = annotation(live, TEMPLATE_HASH_ANNOTATION) == Some(&template_hash(desired));
    if same_template {
        return Kept {
            revisions,
            newly: None,
        };
    }
    let built_for = match annotation(live, GENERATION_ANNOTATION) {
        Some(g) => g.parse::<i64>().ok(),
        None => observed,
    };
    let operators_change = generation.is_some()
        && built_for == generation
        && server_image(live).is_some()
        && server_image(live) == server_image(desired)
        && mounts_tls(live) == mounts_tls(desired)
        && listens_as(live) == listens_as(desired);
    if !operators_change {
        return Kept::default();
    }
    let running = live
        .status
        .as_ref()
        .filter(|_| sts_observed(live))
        .and_then(|s| s.update_revision.clone())
        .filter(|r| in_use.contains(r));
    let mut newly = None;
    if let Some(r) = running
        && !revisions.contains(&r)
    {
        revisions.push(r.clone());
        newly = Some(r);
    }
    let skip = revisions.len().saturating_sub(MAX_KEPT);
    Kept {
        revisions: revisions.into_iter().skip(skip).collect(),
        newly,
    }
}

/// Writes the annotations on the desired StatefulSet.
pub fn annotate(desired: &mut StatefulSet, generation: Option<i64>, kept: &Kept) {
    let hash = template_hash(desired);
    let a = desired
        .metadata
        .annotations
        .get_or_insert_with(BTreeMap::new);
    a.insert(TEMPLATE_HASH_ANNOTATION.into(), hash);
    if let Some(g) = generation {
        a.insert(GENERATION_ANNOTATION.into(), g.to_string());
    }
    if !kept.revisions.is_empty() {
        a.insert(KEPT_ANNOTATION.into(), kept.revisions.join(","));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::{StatefulSetSpec, StatefulSetStatus};
    use k8s_openapi::api::core::v1::{Container, PodSpec, PodTemplateSpec};

    fn sts(image: &str, probe: &str) -> StatefulSet {
        StatefulSet {
            spec: StatefulSetSpec {
                template: PodTemplateSpec {
                    spec: Some(PodSpec {
                        containers: vec![Container {
                            name: names::SERVER_CONTAINER.into(),
                            image: Some(image.into()),
                            args: Some(vec![probe.into()]),
                            ..Default::default()
                        }],
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                ..Default::default()
            },
            ..Default::default()
        }
    }

    /// A live StatefulSet as an operator wrote it for `generation` (None: a
    /// release that did not record it), settled at `revision`.
    fn live(image: &str, probe: &str, generation: Option<i64>, revision: &str) -> StatefulSet {
        let mut s = sts(image, probe);
        annotate(&mut s, generation, &Kept::default());
        if generation.is_none() {
            s.metadata.annotations = None;
        }
        s.metadata.generation = Some(4);
        s.status = Some(StatefulSetStatus {
            observed_generation: Some(4),
            update_revision: Some(revision.into()),
            ..Default::default()
        });
        s
    }

    fn revs(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn an_operator_upgrade_keeps_the_running_revision() {
        let old = live("redis:7.0", "old-probe", Some(3), "r1");
        let new = sts("redis:7.0", "new-probe");
        let k = decide(Some(&old), &new, Some(3), Some(3), &revs(&["r1"]));
        assert_eq!(k.revisions, revs(&["r1"]));
        assert_eq!(k.newly.as_deref(), Some("r1"));
    }

    #[test]
    fn a_statefulset_from_before_the_annotations_uses_the_observed_generation() {
        let old = live("redis:7.0", "old-probe", None, "r1");
        let new = sts("redis:7.0", "new-probe");
        let k = decide(Some(&old), &new, Some(3), Some(3), &revs(&["r1"]));
        assert_eq!(k.revisions, revs(&["r1"]));
        // The spec changed since that operator last saw it: everything rolls.
        let k = decide(Some(&old), &new, Some(4), Some(3), &revs(&["r1"]));
        assert_eq!(k, Kept::default());
    }

    /// Turning TLS off drops the files in the same generation: that rolls.
    #[test]
    fn dropping_the_tls_files_is_never_the_operators_change() {
        let mut old = live("redis:7.0", "probe", Some(3), "r1");
        if let Some(p) = old.spec.template.spec.as_mut() {
            p.volumes = Some(vec![k8s_openapi::api::core::v1::Volume {
                name: crate::controller::layout::TLS_VOLUME.into(),
                ..Default::default()
            }]);
        }
        let new = sts("redis:7.0", "probe");
        let k = decide(Some(&old), &new, Some(3), Some(3), &revs(&["r1"]));
        assert_eq!(k, Kept::default());
    }

    #[test]
    fn a_spec_change_that_changes_the_template_rolls_everything() {
        let mut old = live("redis:7.0", "old-probe", Some(3), "r2");
        old.metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(KEPT_ANNOTATION.into(), "r1".into());
        let new = sts("redis:7.0", "new-probe");
        let k = decide(Some(&old), &new, Some(4), Some(3), &revs(&["r1", "r2"]));
        assert_eq!(k, Kept::default());
    }

    #[test]
    fn a_spec_change_that_leaves_the_template_keeps_the_list() {
        let new = sts("redis:7.0", "new-probe");
        let mut old = live("redis:7.0", "new-probe", Some(3), "r2");
        old.metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(KEPT_ANNOTATION.into(), "r1,r0".into());
        // r0 is no longer run by any pod: forgotten.
        let k = decide(Some(&old), &new, Some(9), Some(9), &revs(&["r1", "r2"]));
        assert_eq!(k.revisions, revs(&["r1"]));
        assert_eq!(k.newly, None);
    }

    #[test]
    fn a_new_server_image_always_rolls() {
        let old = live("redis:7.0", "old-probe", Some(3), "r1");
        let new = sts("redis:7.0.15", "new-probe");
        let k = decide(Some(&old), &new, Some(3), Some(3), &revs(&["r1"]));
        assert_eq!(k, Kept::default());
    }

    #[test]
    fn only_revisions_pods_run_are_kept_and_the_list_is_bounded() {
        let mut old = live("redis:7.0", "p5", Some(3), "r5");
        old.metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(KEPT_ANNOTATION.into(), "r0,r1,r2,r3,r4".into());
        let new = sts("redis:7.0", "p6");
        let all = revs(&["r0", "r1", "r2", "r3", "r4", "r5"]);
        let k = decide(Some(&old), &new, Some(3), Some(3), &all);
        assert_eq!(k.revisions, revs(&["r1", "r2", "r3", "r4", "r5"]));
        // The StatefulSet controller has not seen its latest spec: its
        // revision says nothing yet, and nothing new is kept.
        old.metadata.generation = Some(5);
        let k = decide(Some(&old), &new, Some(3), Some(3), &all);
        assert_eq!(k.newly, None);
    }
}
