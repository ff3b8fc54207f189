//! `spec.tls.issuerRef`: cert-manager issues the servers' certificate. The
//! operator writes one `Certificate` (cert-manager.io/v1) per Redis,
//! `<name>-server`, owned by it, for the names an operator-issued
//! certificate carries ([`super::issuer::names_for`]), and serves the
//! Secret cert-manager fills (`<name>-server-tls`) as it serves a user's:
//! checked on every pass, renewals read live (the `tls` step).
//!
//! Whether the cluster serves the kind is looked up through discovery (at
//! most every 10 s, so cert-manager installed later is picked up); without
//! it the Redis is Degraded with a reason naming `spec.tls.issuerRef`.
//! Until the Secret holds a certificate the pass waits (Progressing, with
//! the Certificate's own condition as the message); an issuance
//! cert-manager reports failed is a Degraded reason.

use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::json;

use super::Reconciler;
use crate::api::v1alpha1::{IssuerRef, Redis};
use crate::controller::base::FIELD_MANAGER;
use crate::controller::error::Error;
use crate::controller::names;
use crate::controller::names::controlled_by;
use crate::controller::served::Served;

/// The API group and version of cert-manager's `Certificate`.
pub const GROUP_VERSION: &str = "cert-manager.io/v1";
const RECHECK: Duration = Duration::from_secs(10);
/// The field the user's errors name.
pub const FIELD: &str = "spec.tls.issuerRef";

fn resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("cert-manager.io", "v1", "Certificate"),
        "certificates",
    )
}

/// Whether the cluster serves cert-manager's `Certificate` (looked up
/// again after [`RECHECK`]), for the operator's context.
pub fn discovery() -> Served {
    Served::new(GROUP_VERSION, &["certificates"], RECHECK)
}

/// The `Certificate` of `redis` for `issuer`, owned by it and stamped with
/// its hash: DNS names and addresses split as cert-manager wants them, a
/// new ECDSA key on every issuance, usable by servers and clients.
pub fn desired(redis: &Redis, issuer: &IssuerRef) -> DynamicObject {
    let ns = redis.namespace().unwrap_or_default();
    let names = names::Names::new(&redis.name_any());
    let (ips, dns): (Vec<String>, Vec<String>) = super::issuer::names_for(&redis.name_any(), &ns)
        .into_iter()
        .partition(|n| n.parse::<std::net::IpAddr>().is_ok());
    let mut obj = DynamicObject::new(&names.certificate(), &resource()).within(&ns);
    obj.metadata.labels = Some(names::labels(redis));
    obj.metadata.owner_references = names::owner_reference(redis).map(|o| vec![o]);
    obj.data = json!({
        "spec": {
            "secretName": names.certificate_secret(),
            "dnsNames": dns,
            "ipAddresses": ips,
            "usages": ["server auth", "client auth", "digital signature", "key encipherment"],
            "privateKey": {"algorithm": "ECDSA", "size": 256, "rotationPolicy": "Always"},
            "issuerRef": {
                "name": issuer.name,
                "kind": issuer.kind(),
                "group": issuer.group(),
            },
        }
    });
    names::stamp_hash(obj)
}

/// The condition `type_` of a `Certificate`: (status, reason, message).
fn condition(cert: &DynamicObject, type_: &str) -> Option<(String, String, String)> {
    let conds = cert.data.get("status")?.get("conditions")?.as_array()?;
    let c = conds
        .iter()
        .find(|c| c.get("type") == Some(&json!(type_)))?;
    let text = |k: &str| {
        c.get(k)
            .and_then(|v| v.as_str())
            .unwrap_or_default()
            .to_string()
    };
    Some((text("status"), text("reason"), text("message")))
}

/// What a `Certificate` says while its Secret holds no certificate yet:
/// `Err` when cert-manager reports the issuance failed.
pub fn issuance(cert: Option<&DynamicObject>, name: &str) -> Result<String, String> {
    let Some(cert) = cert else {
        return Ok(format!(
            "waiting for cert-manager: Certificate {name} was just written"
        ));
    };
    if let Some((status, reason, message)) = condition(cert, "Issuing")
        && status == "False"
        && reason == "Failed"
    {
        return Err(format!(
            "cert-manager could not issue Certificate {name}: {message} ({FIELD})"
        ));
    }
    Ok(match condition(cert, "Ready") {
        Some((_, reason, message)) if !message.is_empty() => {
            format!("waiting for cert-manager to issue Certificate {name}: {reason}: {message}")
        }
        _ => format!("waiting for cert-manager to issue Certificate {name}"),
    })
}

/// Where `spec.tls.issuerRef` stands this pass.
pub enum Issued {
    /// The Secret to serve (it holds files; [`super::material::read`] checks
    /// them).
    Secret(Box<Secret>),
    /// Not yet: what the pass is waiting for.
    Waiting(String),
}

impl Reconciler {
    /// Writes the `Certificate` when it differs from the desired one (not
    /// when paused) and reads the Secret it fills.
    pub(super) async fn ensure_certificate(
        &mut self,
        issuer: &IssuerRef,
        paused: bool,
    ) -> Result<Issued, Error> {
        if !self.ctx.cert_manager.check(&self.ctx.client).await {
            return Err(Error::Certificate(format!(
                "{FIELD}: the cluster does not serve cert-manager's Certificate ({GROUP_VERSION}); install cert-manager, or leave issuerRef out to have the operator issue the certificate"
            )));
        }
        let name = self.names.certificate();
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.ctx.client.clone(), &self.ns, &resource());
        self.ctx.metrics.kube("get");
        let mut live = api.get_opt(&name).await?;
        if let Some(l) = &live
            && !controlled_by(&l.metadata, self.uid())
        {
            return Err(Error::Conflict {
                kind: "Certificate",
                name,
                owner: crate::controller::error::holder(&l.metadata),
            });
        }
        let want = desired(&self.redis, issuer);
        let stale = live.as_ref().and_then(names::stamped_hash) != names::stamped_hash(&want);
        if stale && !paused {
            self.ctx.metrics.kube("apply");
            let pp = PatchParams::apply(FIELD_MANAGER).force();
            live = Some(api.patch(&name, &pp, &Patch::Apply(&want)).await?);
            self.report.wrote();
        }
        let secret_name = self.names.certificate_secret();
        let secret: Option<Secret> = self.fetch(&secret_name).await?;
        if let Some(s) = secret
            && super::material::file(&s, crate::controller::layout::CERT_FILE).is_some()
            && super::material::file(&s, crate::controller::layout::KEY_FILE).is_some()
        {
            return Ok(Issued::Secret(Box::new(s)));
        }
        match issuance(live.as_ref(), &name) {
            Ok(waiting) => Ok(Issued::Waiting(waiting)),
            Err(failed) => Err(Error::Certificate(failed)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::v1alpha1::{RedisSpec, TlsSpec};

    fn redis() -> Redis {
        let mut r = Redis::new(
            "cache",
            RedisSpec {
                tls: Some(TlsSpec {
                    issuer_ref: Some(IssuerRef {
                        name: "ca".into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            },
        );
        r.metadata.namespace = Some("shop".into());
        r.metadata.uid = Some("u-1".into());
        r
    }

    #[test]
    fn the_certificate_is_owned_names_the_services_and_the_issuer() {
        let issuer = IssuerRef {
            name: "ca".into(),
            ..Default::default()
        };
        let v = serde_json::to_value(desired(&redis(), &issuer)).expect("json");
        assert_eq!(v["apiVersion"], GROUP_VERSION);
        assert_eq!(v["kind"], "Certificate");
        assert_eq!(v["metadata"]["name"], "cache-server");
        assert_eq!(v["metadata"]["namespace"], "shop");
        assert_eq!(v["metadata"]["ownerReferences"][0]["uid"], "u-1");
        assert_eq!(v["metadata"]["ownerReferences"][0]["controller"], true);
        let spec = &v["spec"];
        assert_eq!(spec["secretName"], "cache-server-tls");
        assert_eq!(
            spec["issuerRef"],
            json!({"name": "ca", "kind": "Issuer", "group": "cert-manager.io"})
        );
        assert_eq!(spec["ipAddresses"], json!(["127.0.0.1"]));
        let dns: Vec<&str> = spec["dnsNames"]
            .as_array()
            .expect("dnsNames")
            .iter()
            .filter_map(|d| d.as_str())
            .collect();
        assert!(dns.contains(&"cache.shop.svc.cluster.local"), "{dns:?}");
        assert!(dns.contains(&"*.cache-headless.shop.svc"), "{dns:?}");
        assert!(!dns.contains(&"127.0.0.1"), "{dns:?}");
        // Another issuer is another object (a new hash).
        let other = IssuerRef {
            name: "vault".into(),
            kind: Some("ClusterIssuer".into()),
            ..Default::default()
        };
        assert_ne!(
            names::stamped_hash(&desired(&redis(), &issuer)),
            names::stamped_hash(&desired(&redis(), &other))
        );
    }

    fn cert(conditions: serde_json::Value) -> DynamicObject {
        let mut c = DynamicObject::new("cache-server", &resource());
        c.data = json!({"status": {"conditions": conditions}});
        c
    }

    #[test]
    fn a_failed_issuance_is_an_error_and_a_pending_one_says_what_it_waits_for() {
        let failed = cert(json!([
            {"type": "Ready", "status": "False", "reason": "DoesNotExist", "message": "Issuing certificate as Secret does not exist"},
            {"type": "Issuing", "status": "False", "reason": "Failed", "message": "The certificate request has failed to complete and will be retried: issuer ca not found"},
        ]));
        let e = issuance(Some(&failed), "cache-server").expect_err("failed");
        assert_eq!(
            e,
            "cert-manager could not issue Certificate cache-server: The certificate request has failed to complete and will be retried: issuer ca not found (spec.tls.issuerRef)"
        );
        let pending = cert(json!([
            {"type": "Ready", "status": "False", "reason": "DoesNotExist", "message": "Issuing certificate as Secret does not exist"},
            {"type": "Issuing", "status": "True", "reason": "DoesNotExist", "message": "Issuing certificate as Secret does not exist"},
        ]));
        assert_eq!(
            issuance(Some(&pending), "cache-server").expect("waiting"),
            "waiting for cert-manager to issue Certificate cache-server: DoesNotExist: Issuing certificate as Secret does not exist"
        );
        assert_eq!(
            issuance(Some(&cert(json!([]))), "cache-server").expect("waiting"),
            "waiting for cert-manager to issue Certificate cache-server"
        );
    }
}
