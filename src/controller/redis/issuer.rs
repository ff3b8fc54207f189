//! Certificates the operator issues, for `spec.tls` without a `secretName`:
//! a CA per namespace (Secret [`NAMESPACE_CA_SECRET`]: `ca.crt`, `ca.key`,
//! shared by every Redis there, so owned by none), and per Redis a server
//! certificate (`<name>-tls`, owned by it) for its Services, signed by that
//! CA. It is issued again when it is missing, was signed by another CA, or
//! expires within [`CertPolicy::renew_before`]; the servers then read it
//! live (see the `tls` step).
//!
//! A new CA (`redpilot-ca` deleted) is taken on in three steps, each once
//! every instance serves the files of the one before (the hash the
//! reload step records, [`super::material::files_hash`]). The servers read their
//! mounted files when told to, and the kubelet refreshes each pod's at its
//! own moment, so for a while instances hold different versions of the
//! Secret; on the Cluster bus each node checks every peer's certificate
//! against its own `ca.crt`, and a node that trusted only the new CA while
//! a peer served the old one could not link to it (with a one-second node
//! timeout, a failover). So:
//! 1. `ca.crt` holds the old CAs and the new one, the certificate stays;
//! 2. a certificate of the new CA, `ca.crt` kept;
//! 3. the old CAs leave `ca.crt`.
//!
//! Any two adjacent versions trust each other's certificates. Which version
//! a server loaded shows in what it presents (see
//! [`crate::redis::certs::serves`]): steps 1 and 2 end `tls.crt` with a mark
//! after the certificate, a CA certificate no peer needs for its path (1: the
//! new CA after the old certificate; 2: the old CAs after the new one), and
//! step 3 drops it.

use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::events::EventType;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use std::collections::BTreeMap;

use super::Reconciler;
use crate::controller::base::FIELD_MANAGER;
use crate::controller::error::Error;
use crate::controller::layout::{CA_FILE, CERT_FILE, KEY_FILE};
use crate::controller::names::{
    self, ISSUER_ANNOTATION, MANAGED_BY, MANAGED_BY_LABEL, NAMESPACE_CA_SECRET,
    NOT_AFTER_ANNOTATION,
};

/// The CA's private key in [`NAMESPACE_CA_SECRET`].
pub const CA_KEY_FILE: &str = "ca.key";
/// Annotation of the CA's Secret: its subject's common name (the issuer
/// name of every certificate it signs).
const CA_NAME_ANNOTATION: &str = "redpilot.io/ca-name";
/// How long the namespace's CA lasts.
const CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// How long issued certificates last and how early they are renewed
/// (`--tls-cert-validity-seconds`, `--tls-renew-before-seconds`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CertPolicy {
    /// Lifetime of a server certificate.
    pub validity: Duration,
    /// A certificate expiring within this is issued again.
    pub renew_before: Duration,
}

impl Default for CertPolicy {
    /// 90 days, renewed 30 days ahead (as cert-manager does by default
    /// with Let's Encrypt's lifetime).
    fn default() -> Self {
        Self {
            validity: Duration::from_secs(90 * 24 * 3600),
            renew_before: Duration::from_secs(30 * 24 * 3600),
        }
    }
}

impl CertPolicy {
    /// `Err` names what is wrong (a renewal window as long as the lifetime
    /// would issue on every pass).
    pub fn new(validity: Duration, renew_before: Duration) -> Result<Self, String> {
        if validity < Duration::from_secs(60) {
            return Err("--tls-cert-validity-seconds: at least 60".into());
        }
        if renew_before >= validity {
            return Err(format!(
                "--tls-renew-before-seconds ({}) must be shorter than --tls-cert-validity-seconds ({})",
                renew_before.as_secs(),
                validity.as_secs()
            ));
        }
        Ok(Self {
            validity,
            renew_before,
        })
    }
}

fn internal(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Certificate(format!("{what}: {e}"))
}

/// Makes `params` valid from five minutes ago (clocks differ) for `d`;
/// the end in RFC 3339.
fn set_validity(params: &mut CertificateParams, d: Duration) -> Result<String, Error> {
    let now = time::OffsetDateTime::now_utc();
    let at = now + time::Duration::try_from(d).map_err(|e| internal("validity", e))?;
    params.not_before = now - time::Duration::minutes(5);
    params.not_after = at;
    chrono::DateTime::<chrono::Utc>::from_timestamp(at.unix_timestamp(), 0)
        .map(|t| t.to_rfc3339())
        .ok_or_else(|| internal("validity", "out of range"))
}

fn ca_params(name: &str) -> CertificateParams {
    let mut params = CertificateParams::default();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params
}

/// A new CA named `name`: (ca.crt, ca.key, not-after).
pub fn new_ca(name: &str) -> Result<(String, String, String), Error> {
    let key = KeyPair::generate().map_err(|e| internal("generating the CA key", e))?;
    let mut params = ca_params(name);
    let text = set_validity(&mut params, CA_VALIDITY)?;
    let cert = params
        .self_signed(&key)
        .map_err(|e| internal("signing the CA", e))?;
    Ok((cert.pem(), key.serialize_pem(), text))
}

/// A server certificate for `names` (DNS names and addresses) signed by the
/// CA `ca_name` with key `ca_key`: (tls.crt, tls.key, not-after).
pub fn issue(
    ca_name: &str,
    ca_key: &str,
    names: &[String],
    validity: Duration,
) -> Result<(String, String, String), Error> {
    let ca_key = KeyPair::from_pem(ca_key).map_err(|e| internal("reading ca.key", e))?;
    let issuer = Issuer::new(ca_params(ca_name), ca_key);
    let key = KeyPair::generate().map_err(|e| internal("generating a key", e))?;
    let mut params = CertificateParams::new(names.to_vec()).map_err(|e| internal("names", e))?;
    params.distinguished_name.push(
        DnType::CommonName,
        names.first().map(String::as_str).unwrap_or("redis"),
    );
    let text = set_validity(&mut params, validity)?;
    let cert = params
        .signed_by(&key, &issuer)
        .map_err(|e| internal("signing the certificate", e))?;
    Ok((cert.pem(), key.serialize_pem(), text))
}

/// The names a Redis's certificate carries: its Services (read-write,
/// read-only, and every pod under the headless one), in the namespace's
/// short and full forms, and the loopback.
pub fn names_for(name: &str, ns: &str) -> Vec<String> {
    let names = names::Names::new(name);
    let mut out = Vec::new();
    for svc in [names.write_service(), names.read_service()] {
        out.push(svc.clone());
        for suffix in ["", ".svc", ".svc.cluster.local"] {
            out.push(format!("{svc}.{ns}{suffix}"));
        }
    }
    let headless = names.headless();
    for suffix in ["", ".svc", ".svc.cluster.local"] {
        out.push(format!("*.{headless}.{ns}{suffix}"));
    }
    out.push("localhost".into());
    out.push("127.0.0.1".into());
    out
}

fn text(secret: &Secret, key: &str) -> Option<String> {
    super::material::file(secret, key).map(|b| String::from_utf8_lossy(b).into_owned())
}

fn annotation<'a>(secret: &'a Secret, key: &str) -> Option<&'a str> {
    secret
        .metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

/// The PEM blocks of a file, in order, each line trimmed.
fn pem_blocks(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut block: Option<String> = None;
    for line in text.lines().map(str::trim) {
        if line.starts_with("-----BEGIN ") {
            block = Some(String::new());
        }
        if let Some(b) = block.as_mut() {
            b.push_str(line);
            b.push('\n');
        }
        if line.starts_with("-----END ")
            && let Some(b) = block.take()
        {
            out.push(b);
        }
    }
    out
}

/// What [`Reconciler::ensure_issued`] does next with `<name>-tls`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Current: looked at again after this long.
    Keep(Duration),
    /// A certificate of the namespace's CA, trusted by that CA alone.
    Issue,
    /// The CA changed, step 1: the certificate kept, `tls.crt` marked
    /// (`cert`), `ca.crt` the old CAs and the new one (`ca`).
    TrustBoth { cert: String, ca: String },
    /// Step 2: a certificate of the new CA, `tls.crt` marked with the old
    /// CAs (`mark`), `ca.crt` kept.
    Switch { mark: String },
    /// Step 3: the old CAs leave `ca.crt` and the mark `tls.crt` (`cert`).
    DropOld { cert: String },
    /// The instances do not all serve the current version yet.
    Wait(&'static str),
}

/// The next step for the certificate Secret `live`, the namespace's CA
/// being `ca_cert` (hash `ca_hash`), `served` the hash of the files every
/// instance was last seen to serve (pure; table-tested).
pub fn next_issue(
    live: Option<&Secret>,
    ca_cert: &str,
    ca_hash: &str,
    served: Option<&str>,
    renew_before: Duration,
    now: chrono::DateTime<chrono::Utc>,
) -> Next {
    let Some(s) = live else {
        return Next::Issue;
    };
    let (Some(cert), Some(ca), Some(_)) = (text(s, CERT_FILE), text(s, CA_FILE), text(s, KEY_FILE))
    else {
        return Next::Issue;
    };
    let usable = annotation(s, NOT_AFTER_ANNOTATION)
        .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
        .is_some_and(|t| t.with_timezone(&chrono::Utc) > now);
    let (chain, bundle, new) = (pem_blocks(&cert), pem_blocks(&ca), pem_blocks(ca_cert));
    let Some(leaf) = chain.first().filter(|_| usable) else {
        // Nothing worth keeping: an expired certificate is refused anyway.
        return Next::Issue;
    };
    let everywhere =
        served == Some(super::material::files_hash(cert.as_bytes(), ca.as_bytes()).as_str());
    if annotation(s, ISSUER_ANNOTATION) == Some(ca_hash) {
        if chain.len() > 1 || bundle != new {
            return if everywhere {
                Next::DropOld { cert: leaf.clone() }
            } else {
                Next::Wait("every instance to serve the certificate of the new CA")
            };
        }
        let wait = due_in(live, ca_hash, renew_before, now);
        return if wait.is_zero() {
            Next::Issue
        } else {
            Next::Keep(wait)
        };
    }
    if !new.iter().all(|b| bundle.contains(b)) {
        let mut with_new = bundle.clone();
        with_new.extend(new.iter().filter(|b| !bundle.contains(b)).cloned());
        return Next::TrustBoth {
            cert: format!("{leaf}{}", new.concat()),
            ca: with_new.concat(),
        };
    }
    if everywhere {
        Next::Switch {
            mark: bundle
                .iter()
                .filter(|b| !new.contains(b))
                .cloned()
                .collect(),
        }
    } else {
        Next::Wait("every instance to trust the new CA beside the old one")
    }
}

/// How long until an issued certificate's Secret is due for a new one:
/// zero when files are missing, it was signed by another CA, or it expires
/// within `renew_before` of `now`.
pub fn due_in(
    secret: Option<&Secret>,
    ca_hash: &str,
    renew_before: Duration,
    now: chrono::DateTime<chrono::Utc>,
) -> Duration {
    let Some(s) = secret else {
        return Duration::ZERO;
    };
    if [CERT_FILE, KEY_FILE, CA_FILE]
        .iter()
        .any(|k| text(s, k).is_none())
        || annotation(s, ISSUER_ANNOTATION) != Some(ca_hash)
    {
        return Duration::ZERO;
    }
    let Some(not_after) = annotation(s, NOT_AFTER_ANNOTATION)
        .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
    else {
        return Duration::ZERO;
    };
    let margin = chrono::Duration::from_std(renew_before).unwrap_or(chrono::Duration::MAX);
    (not_after.with_timezone(&chrono::Utc) - margin - now)
        .to_std()
        .unwrap_or(Duration::ZERO)
}

impl Reconciler {
    /// The namespace's CA: (ca.crt, ca.key, its name), created the first
    /// time (a create, not an apply: two Redis starting together keep the
    /// first one's).
    async fn namespace_ca(&mut self) -> Result<(String, String, String), Error> {
        let read = |s: &Secret| {
            Some((
                text(s, CA_FILE)?,
                text(s, CA_KEY_FILE)?,
                annotation(s, CA_NAME_ANNOTATION)?.to_string(),
            ))
        };
        if let Some(s) = self.fetch::<Secret>(NAMESPACE_CA_SECRET).await? {
            return read(&s).ok_or_else(|| {
                Error::Certificate(format!(
                    "Secret {NAMESPACE_CA_SECRET} lacks {CA_FILE}, {CA_KEY_FILE} or its {CA_NAME_ANNOTATION} annotation; delete it to have a new CA made"
                ))
            });
        }
        // Named apart from the CAs before it: a peer trusting two CAs of one
        // name could pick the wrong one to check a certificate against.
        let name = format!(
            "redpilot CA {} {}",
            self.ns,
            chrono::Utc::now().format("%Y%m%dT%H%M%SZ")
        );
        let (cert, key, not_after) = new_ca(&name)?;
        let secret = Secret {
            metadata: kube::api::ObjectMeta {
                name: Some(NAMESPACE_CA_SECRET.into()),
                namespace: Some(self.ns.clone()),
                labels: Some(BTreeMap::from([(
                    MANAGED_BY_LABEL.into(),
                    MANAGED_BY.into(),
                )])),
                annotations: Some(BTreeMap::from([
                    (CA_NAME_ANNOTATION.into(), name.clone()),
                    (NOT_AFTER_ANNOTATION.into(), not_after),
                ])),
                ..Default::default()
            },
            data: Some(BTreeMap::from([
                (CA_FILE.into(), ByteString(cert.clone().into_bytes())),
                (CA_KEY_FILE.into(), ByteString(key.clone().into_bytes())),
            ])),
            type_: Some("Opaque".into()),
            ..Default::default()
        };
        self.ctx.metrics.kube("create");
        self.report.wrote();
        match self
            .api::<Secret>()
            .create(&PostParams::default(), &secret)
            .await
        {
            Ok(_) => {
                let note = format!("created the namespace's CA in Secret {NAMESPACE_CA_SECRET}");
                self.event(
                    EventType::Normal,
                    "CertificateAuthorityCreated",
                    "Issue",
                    note,
                )
                .await;
                Ok((cert, key, name))
            }
            // Another Redis's pass made it first: use that one.
            Err(kube::Error::Api(e)) if e.code == 409 => {
                let s = self.fetch::<Secret>(NAMESPACE_CA_SECRET).await?;
                s.as_ref().and_then(read).ok_or_else(|| {
                    Error::Certificate(format!("Secret {NAMESPACE_CA_SECRET} is incomplete"))
                })
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Step 1b for an operator-issued certificate: `<name>-tls` exists,
    /// was signed by the namespace's CA and is not due; otherwise it is
    /// issued again (not while paused), in steps when the CA changed (see
    /// the module's notes). `served` is the hash of the files every
    /// instance was last seen to serve. Writes nothing when it is current.
    /// Returns the Secret as it stands (none while paused before the first).
    pub(super) async fn ensure_issued(
        &mut self,
        paused: bool,
        served: Option<&str>,
    ) -> Result<Option<Secret>, Error> {
        let secret_name = self.names.issued_tls();
        let live: Option<Secret> = self.fetch(&secret_name).await?;
        if let Some(e) = self.foreign("Secret", live.as_ref().map(|s| &s.metadata)) {
            return Err(e);
        }
        let (ca_cert, ca_key, ca_name) = self.namespace_ca().await?;
        let ca_hash = names::stable_hash(&[&ca_cert]);
        let policy = self.ctx.settings.certs;
        let next = next_issue(
            live.as_ref(),
            &ca_cert,
            &ca_hash,
            served,
            policy.renew_before,
            chrono::Utc::now(),
        );
        let live_file = |k: &str| live.as_ref().and_then(|s| text(s, k)).unwrap_or_default();
        let live_note = |k: &str| {
            live.as_ref()
                .and_then(|s| annotation(s, k))
                .unwrap_or_default()
                .to_string()
        };
        // (tls.crt, tls.key, ca.crt, not-after, issuer hash, the event)
        let (cert, key, ca, not_after, issuer, event) = match next {
            Next::Keep(wait) => {
                // Renewed on time, not at the periodic pass after.
                if wait < crate::controller::queue::STEADY_REQUEUE {
                    self.report.recheck_in(wait + Duration::from_secs(1));
                }
                return Ok(live);
            }
            Next::Wait(what) => {
                self.report.progress(format!(
                    "taking on the namespace's new CA: waiting for {what} (Secret {secret_name})"
                ));
                return Ok(live);
            }
            _ if paused => return Ok(live),
            Next::Issue => {
                let names = names_for(&self.redis.name_any(), &self.ns);
                let (cert, key, not_after) = issue(&ca_name, &ca_key, &names, policy.validity)?;
                let why = if live.is_some() { "renewed" } else { "issued" };
                let note = format!(
                    "{why} the certificate in Secret {secret_name} from the namespace's CA, valid until {not_after}"
                );
                (
                    cert,
                    key,
                    ca_cert,
                    not_after,
                    ca_hash,
                    ("CertificateIssued", note),
                )
            }
            Next::TrustBoth { cert, ca } => {
                let note = format!(
                    "the namespace's CA changed: Secret {secret_name} carries the new CA beside the old one, its certificate kept until every instance trusts both (step 1 of 3)"
                );
                (
                    cert,
                    live_file(KEY_FILE),
                    ca,
                    live_note(NOT_AFTER_ANNOTATION),
                    live_note(ISSUER_ANNOTATION),
                    ("CertificateAuthorityAdded", note),
                )
            }
            Next::Switch { mark } => {
                let names = names_for(&self.redis.name_any(), &self.ns);
                let (cert, key, not_after) = issue(&ca_name, &ca_key, &names, policy.validity)?;
                let note = format!(
                    "every instance trusts the namespace's new CA: issued the certificate in Secret {secret_name} from it, valid until {not_after}; the old CA stays in ca.crt until every instance serves it (step 2 of 3)"
                );
                (
                    format!("{cert}{mark}"),
                    key,
                    live_file(CA_FILE),
                    not_after,
                    ca_hash,
                    ("CertificateIssued", note),
                )
            }
            Next::DropOld { cert } => {
                let note = format!(
                    "every instance serves the certificate of the namespace's new CA: the old CA left Secret {secret_name} (step 3 of 3)"
                );
                (
                    cert,
                    live_file(KEY_FILE),
                    ca_cert,
                    live_note(NOT_AFTER_ANNOTATION),
                    ca_hash,
                    ("CertificateAuthorityRetired", note),
                )
            }
        };
        let mut meta = names::meta(&self.redis, secret_name.clone());
        meta.annotations = Some(BTreeMap::from([
            (NOT_AFTER_ANNOTATION.into(), not_after),
            (ISSUER_ANNOTATION.into(), issuer),
        ]));
        let secret = Secret {
            metadata: meta,
            data: Some(BTreeMap::from([
                (CERT_FILE.into(), ByteString(cert.into_bytes())),
                (KEY_FILE.into(), ByteString(key.into_bytes())),
                (CA_FILE.into(), ByteString(ca.into_bytes())),
            ])),
            type_: Some("kubernetes.io/tls".into()),
            ..Default::default()
        };
        self.ctx.metrics.kube("apply");
        self.report.wrote();
        let applied = self
            .api::<Secret>()
            .patch(
                &secret_name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&secret),
            )
            .await?;
        let (reason, note) = event;
        self.event(EventType::Normal, reason, "Issue", note).await;
        Ok(Some(applied))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn issued(not_after: &str, issuer: &str) -> Secret {
        let b = |s: &str| ByteString(s.as_bytes().to_vec());
        Secret {
            metadata: kube::api::ObjectMeta {
                annotations: Some(BTreeMap::from([
                    (NOT_AFTER_ANNOTATION.to_string(), not_after.to_string()),
                    (ISSUER_ANNOTATION.to_string(), issuer.to_string()),
                ])),
                ..Default::default()
            },
            data: Some(BTreeMap::from([
                (CERT_FILE.to_string(), b("c")),
                (KEY_FILE.to_string(), b("k")),
                (CA_FILE.to_string(), b("a")),
            ])),
            ..Default::default()
        }
    }

    #[test]
    fn a_certificate_is_reissued_when_missing_foreign_or_close_to_expiry() {
        let now = chrono::DateTime::parse_from_rfc3339("2026-06-01T00:00:00Z")
            .expect("now")
            .with_timezone(&chrono::Utc);
        let day = 24 * 3600;
        let month = Duration::from_secs(30 * day);
        let due = |s: Option<&Secret>, ca: &str| due_in(s, ca, month, now);
        assert_eq!(due(None, "h"), Duration::ZERO, "missing");
        assert_eq!(
            due(Some(&issued("2026-08-01T00:00:00Z", "h")), "h"),
            Duration::from_secs(31 * day),
            "two months left: due in 31 days"
        );
        assert_eq!(
            due(Some(&issued("2026-06-20T00:00:00Z", "h")), "h"),
            Duration::ZERO,
            "within the margin"
        );
        assert_eq!(
            due(Some(&issued("2026-08-01T00:00:00Z", "old")), "h"),
            Duration::ZERO,
            "another CA"
        );
        assert_eq!(
            due(Some(&issued("soon", "h")), "h"),
            Duration::ZERO,
            "unreadable date"
        );
        let mut partial = issued("2026-08-01T00:00:00Z", "h");
        if let Some(d) = partial.data.as_mut() {
            d.remove(KEY_FILE);
        }
        assert_eq!(due(Some(&partial), "h"), Duration::ZERO, "a file missing");
    }

    #[test]
    fn an_issued_certificate_chains_to_its_ca_and_names_the_services() {
        let (ca, ca_key, _) = new_ca("redpilot CA shop").expect("CA");
        let names = names_for("cache", "shop");
        assert!(names.contains(&"cache.shop.svc".to_string()), "{names:?}");
        assert!(
            names.contains(&"cache-ro.shop.svc.cluster.local".to_string()),
            "{names:?}"
        );
        assert!(
            names.contains(&"*.cache-headless.shop.svc".to_string()),
            "{names:?}"
        );
        let (cert, key, not_after) = issue(
            "redpilot CA shop",
            &ca_key,
            &names,
            Duration::from_secs(3600),
        )
        .expect("leaf");
        crate::redis::certs::check_server_certificate(
            cert.as_bytes(),
            key.as_bytes(),
            ca.as_bytes(),
            rustls::pki_types::UnixTime::now(),
        )
        .expect("chains to the CA, valid now");
        assert!(chrono::DateTime::parse_from_rfc3339(&not_after).is_ok());
        // Signed under another CA name, the chain breaks: the name matters.
        let (other, other_key, _) =
            issue("another", &ca_key, &names, Duration::from_secs(3600)).expect("leaf");
        assert!(
            crate::redis::certs::check_server_certificate(
                other.as_bytes(),
                other_key.as_bytes(),
                ca.as_bytes(),
                rustls::pki_types::UnixTime::now(),
            )
            .is_err()
        );
    }

    /// A Secret of `files` (tls.crt, ca.crt), issued by the CA of hash
    /// `issuer`, valid until `not_after`.
    fn version(cert: &str, ca: &str, not_after: &str, issuer: &str) -> Secret {
        let mut s = issued(not_after, issuer);
        if let Some(d) = s.data.as_mut() {
            d.insert(CERT_FILE.into(), ByteString(cert.as_bytes().to_vec()));
            d.insert(CA_FILE.into(), ByteString(ca.as_bytes().to_vec()));
        }
        s
    }

    #[test]
    fn a_new_ca_is_taken_on_in_three_steps_each_once_every_instance_serves_the_last() {
        let now = chrono::DateTime::parse_from_rfc3339("2026-06-01T00:00:00Z")
            .expect("now")
            .with_timezone(&chrono::Utc);
        let later = "2026-08-01T00:00:00Z";
        let month = Duration::from_secs(30 * 24 * 3600);
        let (old_ca, old_key, _) = new_ca("old CA").expect("CA");
        let (new_ca_pem, _, _) = new_ca("new CA").expect("CA");
        let (old_hash, new_hash) = (
            names::stable_hash(&[&old_ca]),
            names::stable_hash(&[&new_ca_pem]),
        );
        let names = names_for("cache", "shop");
        let (leaf, _, _) =
            issue("old CA", &old_key, &names, Duration::from_secs(3600)).expect("leaf");
        let served = |s: &Secret| {
            Some(super::super::material::files_hash(
                text(s, CERT_FILE).unwrap_or_default().as_bytes(),
                text(s, CA_FILE).unwrap_or_default().as_bytes(),
            ))
        };
        let next = |s: &Secret, everywhere: bool| {
            let h = served(s);
            next_issue(
                Some(s),
                &new_ca_pem,
                &new_hash,
                if everywhere {
                    h.as_deref()
                } else {
                    Some("older")
                },
                month,
                now,
            )
        };
        // Steady under the old CA.
        let steady = version(&leaf, &old_ca, later, &old_hash);
        assert!(matches!(
            next_issue(Some(&steady), &old_ca, &old_hash, None, month, now),
            Next::Keep(_)
        ));
        // 1. The CA changed: both trusted, the certificate kept and marked
        //    with the new CA, whatever the instances serve.
        let Next::TrustBoth { cert, ca } = next(&steady, false) else {
            panic!("{:?}", next(&steady, false));
        };
        assert_eq!(
            pem_blocks(&cert),
            [pem_blocks(&leaf), pem_blocks(&new_ca_pem)].concat()
        );
        assert_eq!(
            pem_blocks(&ca),
            [pem_blocks(&old_ca), pem_blocks(&new_ca_pem)].concat()
        );
        let step1 = version(&cert, &ca, later, &old_hash);
        // Not before every instance serves step 1.
        assert!(matches!(next(&step1, false), Next::Wait(_)));
        let Next::Switch { mark } = next(&step1, true) else {
            panic!("{:?}", next(&step1, true));
        };
        assert_eq!(
            pem_blocks(&mark),
            pem_blocks(&old_ca),
            "the old CA marks step 2"
        );
        // 2. A certificate of the new CA, ca.crt kept.
        let step2 = version(
            &format!("{}{mark}", pem_blocks(&leaf).concat()),
            &ca,
            later,
            &new_hash,
        );
        assert!(matches!(next(&step2, false), Next::Wait(_)));
        let Next::DropOld { cert } = next(&step2, true) else {
            panic!("{:?}", next(&step2, true));
        };
        assert_eq!(pem_blocks(&cert), pem_blocks(&leaf), "the mark leaves");
        // 3. The new CA alone: steady.
        let step3 = version(&cert, &new_ca_pem, later, &new_hash);
        assert!(matches!(next(&step3, false), Next::Keep(_)));
        assert!(matches!(next(&step3, true), Next::Keep(_)));
        // A certificate already expired is not worth keeping.
        let expired = version(&leaf, &old_ca, "2026-05-01T00:00:00Z", &old_hash);
        assert_eq!(next(&expired, true), Next::Issue);
        // Another CA while step 2 waits: its CA is added beside both.
        let (third, _, _) = new_ca("third CA").expect("CA");
        let third_hash = names::stable_hash(&[&third]);
        let Next::TrustBoth { ca, .. } =
            next_issue(Some(&step2), &third, &third_hash, None, month, now)
        else {
            panic!("a third CA");
        };
        assert_eq!(pem_blocks(&ca).len(), 3);
        assert_eq!(
            next_issue(None, &third, &third_hash, None, month, now),
            Next::Issue
        );
    }

    #[test]
    fn the_policy_refuses_a_renewal_window_as_long_as_the_lifetime() {
        let d = |s| Duration::from_secs(s);
        assert!(CertPolicy::new(d(120), d(90)).is_ok());
        assert!(CertPolicy::new(d(120), d(120)).is_err());
        assert!(CertPolicy::new(d(30), d(10)).is_err());
    }
}
