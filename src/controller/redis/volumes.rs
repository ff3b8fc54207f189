//! Volume growth: `spec.storage.size` may grow (the API server refuses a
//! shrink). A StatefulSet cannot change its claim template, so for each
//! StatefulSet whose template asks for less than the spec:
//!
//! 1. every claim of its pods is asked for the new size (server-side
//!    apply of the claim's storage request); a StorageClass without
//!    `allowVolumeExpansion` refuses, and the operator says so (event
//!    `VolumeGrowthRefused`, Degraded) and changes nothing else;
//! 2. while any claim reports less capacity than asked, the StatefulSet
//!    keeps its old claim template (every other change still goes
//!    through) and the status says which claims are growing;
//! 3. once every claim has the new capacity, the StatefulSet is deleted
//!    with its pods and claims orphaned (they keep running: no restart,
//!    no data moved) and applied anew with the new template at the next
//!    pass; its pods and claims are adopted by it.
//!
//! A claim not made yet (a pod still to come) is made by the new template
//! at the new size.

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions, PropagationPolicy};
use kube::runtime::events::EventType;
use serde_json::json;

use super::facts::quantity_bytes;
use super::{Error, Reconciler};

/// The claim template every Redis StatefulSet carries.
const CLAIM: &str = "data";

/// How soon a pass looks again while claims grow.
const RECHECK: std::time::Duration = std::time::Duration::from_secs(2);

/// The storage a StatefulSet's `data` claim template asks for.
pub fn template_size(sts: &StatefulSet) -> Option<Quantity> {
    sts.spec
        .volume_claim_templates
        .as_ref()?
        .iter()
        .find(|c| c.metadata.name.as_deref() == Some(CLAIM))?
        .spec
        .as_ref()?
        .resources
        .as_ref()?
        .requests
        .as_ref()?
        .get("storage")
        .cloned()
}

/// The claim of pod `ordinal` of StatefulSet `sts`.
pub fn claim_name(sts: &str, ordinal: i32) -> String {
    format!("{CLAIM}-{sts}-{ordinal}")
}

/// The ordinal of the pod of StatefulSet `sts` whose claim is `claim`.
fn claim_ordinal(sts: &str, claim: &str) -> Option<i32> {
    let ordinal = claim
        .strip_prefix(CLAIM)?
        .strip_prefix('-')?
        .strip_prefix(sts)?
        .strip_prefix('-')?;
    ordinal
        .bytes()
        .all(|b| b.is_ascii_digit())
        .then(|| ordinal.parse().ok())
        .flatten()
}

fn requested(c: &PersistentVolumeClaim) -> Option<u64> {
    quantity_bytes(
        c.spec
            .as_ref()?
            .resources
            .as_ref()?
            .requests
            .as_ref()?
            .get("storage")?,
    )
}

fn capacity(c: &PersistentVolumeClaim) -> Option<u64> {
    quantity_bytes(c.status.as_ref()?.capacity.as_ref()?.get("storage")?)
}

/// What a claim's growth is waiting on, for the status (`FileSystemResizePending`...).
fn waiting_on(c: &PersistentVolumeClaim) -> String {
    let conds: Vec<String> = c
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .map(|cs| {
            cs.iter()
                .filter(|c| c.status == "True")
                .map(|c| c.type_.clone())
                .collect()
        })
        .unwrap_or_default();
    if conds.is_empty() {
        String::new()
    } else {
        format!(" ({})", conds.join(", "))
    }
}

/// What the StatefulSet's apply does this pass.
#[derive(Debug, PartialEq, Eq)]
pub enum Growth {
    /// Apply as built (no growth, or nothing live yet).
    Apply,
    /// Apply with the live claim template: claims are growing, or were
    /// refused.
    KeepClaims,
    /// Do not apply: the StatefulSet is being re-created.
    Hold,
}

impl Reconciler {
    /// Grows the claims of `live` when `desired` asks for more storage;
    /// says how `desired` may be applied, and adjusts it when the live
    /// claim template must stay.
    pub(super) async fn grow_volumes(
        &mut self,
        desired: &mut StatefulSet,
        live: Option<&StatefulSet>,
    ) -> Result<Growth, Error> {
        let Some(live) = live else {
            return Ok(Growth::Apply);
        };
        let name = live.metadata.name.clone().unwrap_or_default();
        if live.metadata.deletion_timestamp.is_some() {
            self.recreating(&name);
            return Ok(Growth::Hold);
        }
        let (Some(want_q), Some(have_q)) = (template_size(desired), template_size(live)) else {
            return Ok(Growth::Apply);
        };
        let (Some(want), Some(have)) = (quantity_bytes(&want_q), quantity_bytes(&have_q)) else {
            return Ok(Growth::Apply);
        };
        if want <= have {
            // Equal, or a shrink the API server refused at admission (a
            // template made before that rule): the live one stays.
            if want < have {
                keep_claims(desired, live);
                return Ok(Growth::KeepClaims);
            }
            return Ok(Growth::Apply);
        }
        // Every claim of the StatefulSet's pods, whatever runs now: a
        // hibernating Redis runs no pod, and claims kept after a scale-down
        // (`retainOnDelete`) are bound again by a later scale-up, which
        // must find them grown.
        self.ctx.metrics.kube("list");
        let mut claims: Vec<(i32, PersistentVolumeClaim)> = self
            .api::<PersistentVolumeClaim>()
            .list(&Default::default())
            .await?
            .items
            .into_iter()
            .filter_map(|c| Some((claim_ordinal(&name, c.metadata.name.as_deref()?)?, c)))
            .collect();
        claims.sort_by_key(|(i, _)| *i);
        let mut growing = Vec::new();
        let mut asked = Vec::new();
        for (_, pvc) in claims {
            let claim = pvc.metadata.name.clone().unwrap_or_default();
            if requested(&pvc).is_some_and(|r| r < want) {
                let patch = json!({
                    "apiVersion": "v1", "kind": "PersistentVolumeClaim",
                    "metadata": {"name": claim},
                    "spec": {"resources": {"requests": {"storage": want_q}}},
                });
                self.ctx.metrics.kube("patch");
                let applied = self
                    .api::<PersistentVolumeClaim>()
                    .patch(
                        &claim,
                        &PatchParams::apply(crate::controller::base::FIELD_MANAGER).force(),
                        &Patch::Apply(&patch),
                    )
                    .await;
                match applied {
                    Ok(_) => {
                        self.report.wrote();
                        asked.push(claim.clone());
                    }
                    Err(kube::Error::Api(s)) if matches!(s.code, 403 | 422) => {
                        let msg = format!(
                            "spec.storage.size {}: claim {claim} cannot grow from {}: {}; \
                             the volumes keep {} (a StorageClass with allowVolumeExpansion \
                             can grow them)",
                            want_q.0, have_q.0, s.message, have_q.0
                        );
                        self.event(
                            EventType::Warning,
                            "VolumeGrowthRefused",
                            "Grow",
                            msg.clone(),
                        )
                        .await;
                        self.report.note(msg);
                        keep_claims(desired, live);
                        return Ok(Growth::KeepClaims);
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            if capacity(&pvc).is_none_or(|c| c < want) {
                growing.push(format!(
                    "{claim} {} of {}{}",
                    pvc.status
                        .as_ref()
                        .and_then(|s| s.capacity.as_ref())
                        .and_then(|c| c.get("storage"))
                        .map_or("?", |q| q.0.as_str()),
                    want_q.0,
                    waiting_on(&pvc)
                ));
            }
        }
        if !asked.is_empty() {
            self.event(
                EventType::Normal,
                "VolumeGrowth",
                "Grow",
                format!(
                    "spec.storage.size grew from {} to {}: asked {} for the new size",
                    have_q.0,
                    want_q.0,
                    asked.join(", ")
                ),
            )
            .await;
        }
        if !growing.is_empty() {
            self.report
                .progress(format!("volumes growing: {}", growing.join("; ")));
            self.report.recheck_within(RECHECK);
            keep_claims(desired, live);
            return Ok(Growth::KeepClaims);
        }
        // Every claim has the new size: the StatefulSet is made anew with
        // the new template; its pods and claims stay, orphaned until then.
        self.event(
            EventType::Normal,
            "VolumesGrown",
            "Grow",
            format!(
                "every claim of StatefulSet {name} has {}; re-creating the StatefulSet with \
                 the new claim size (its pods and claims are kept, nothing restarts)",
                want_q.0
            ),
        )
        .await;
        let dp = DeleteParams {
            propagation_policy: Some(PropagationPolicy::Orphan),
            preconditions: live.metadata.uid.clone().map(|uid| Preconditions {
                uid: Some(uid),
                resource_version: None,
            }),
            ..Default::default()
        };
        self.ctx.metrics.kube("delete");
        match self.api::<StatefulSet>().delete(&name, &dp).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
        self.report.wrote();
        // The StatefulSet is gone, its pods and claims orphaned: the next
        // operator must make it anew and adopt them.
        crate::failpoint::hit("volumes-orphaned");
        self.recreating(&name);
        Ok(Growth::Hold)
    }

    /// Says the StatefulSet `name` is being made anew, and looks again soon.
    fn recreating(&mut self, name: &str) {
        self.report.progress(format!(
            "StatefulSet {name} is being re-created with its grown volumes"
        ));
        self.report.recheck_within(RECHECK);
    }
}

/// Puts `live`'s claim templates into `desired` (and stamps it again).
fn keep_claims(desired: &mut StatefulSet, live: &StatefulSet) {
    desired.spec.volume_claim_templates = live.spec.volume_claim_templates.clone();
    let stamped = crate::controller::names::stamp_hash(std::mem::take(desired));
    *desired = stamped;
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::StatefulSetSpec;
    use k8s_openapi::api::core::v1::{PersistentVolumeClaimSpec, VolumeResourceRequirements};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use std::collections::BTreeMap;

    fn sts(size: &str) -> StatefulSet {
        StatefulSet {
            metadata: ObjectMeta {
                name: Some("cache".into()),
                ..Default::default()
            },
            spec: StatefulSetSpec {
                volume_claim_templates: Some(vec![PersistentVolumeClaim {
                    metadata: ObjectMeta {
                        name: Some("data".into()),
                        ..Default::default()
                    },
                    spec: Some(PersistentVolumeClaimSpec {
                        resources: Some(VolumeResourceRequirements {
                            requests: Some(BTreeMap::from([(
                                "storage".into(),
                                Quantity(size.into()),
                            )])),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                }]),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn a_claim_belongs_to_a_statefulset_by_its_name_and_ordinal() {
        assert_eq!(claim_ordinal("cache", "data-cache-2"), Some(2));
        assert_eq!(claim_ordinal("cache", &claim_name("cache", 11)), Some(11));
        assert_eq!(
            claim_ordinal("cache", "data-cache-s0-1"),
            None,
            "another StatefulSet"
        );
        assert_eq!(claim_ordinal("cache-s0", "data-cache-s0-1"), Some(1));
        assert_eq!(claim_ordinal("cache", "data-cache-"), None);
        assert_eq!(claim_ordinal("cache", "data-cache-+1"), None);
        assert_eq!(claim_ordinal("cache", "logs-cache-0"), None);
    }

    #[test]
    fn the_template_size_and_the_claim_names() {
        assert_eq!(template_size(&sts("64Mi")), Some(Quantity("64Mi".into())));
        assert_eq!(template_size(&StatefulSet::default()), None);
        assert_eq!(claim_name("cache-s1", 2), "data-cache-s1-2");
    }

    #[test]
    fn a_kept_claim_template_is_the_live_one_and_stamped_the_same_each_pass() {
        let live = sts("64Mi");
        let mut a = crate::controller::names::stamp_hash(sts("128Mi"));
        keep_claims(&mut a, &live);
        assert_eq!(template_size(&a), Some(Quantity("64Mi".into())));
        let mut b = crate::controller::names::stamp_hash(sts("128Mi"));
        keep_claims(&mut b, &live);
        assert_eq!(
            crate::controller::names::stamped_hash(&a),
            crate::controller::names::stamped_hash(&b),
            "a pass with nothing new writes nothing"
        );
    }
}
