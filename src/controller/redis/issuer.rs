//! Certificates the operator issues, for `spec.tls` without a `secretName`:
//! a CA per namespace (Secret [`NAMESPACE_CA_SECRET`]: `ca.crt`, `ca.key`,
//! shared by every Redis there, so owned by none), and per Redis a server
//! certificate (`<name>-tls`, owned by it) for its Services, signed by that
//! CA. It is issued again when it is missing, was signed by another CA, or
//! expires within [`CertPolicy::renew_before`]; the servers then read it
//! live (see [`super::tls`]).

use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::events::EventType;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use std::collections::BTreeMap;

use super::Reconciler;
use super::build::{
    self, ISSUER_ANNOTATION, MANAGED_BY, MANAGED_BY_LABEL, NAMESPACE_CA_SECRET,
    NOT_AFTER_ANNOTATION,
};
use super::tls::{CA_FILE, CERT_FILE, KEY_FILE};
use crate::controller::{Error, FIELD_MANAGER};

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
    let names = build::Names::new(name);
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
    super::tls::file(secret, key).map(|b| String::from_utf8_lossy(b).into_owned())
}

fn annotation<'a>(secret: &'a Secret, key: &str) -> Option<&'a str> {
    secret
        .metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
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
        let name = format!("redpilot CA {}", self.ns);
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
        self.wrote = true;
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
    /// issued again (not while paused). Writes nothing when it is current.
    /// Returns the Secret as it stands (none while paused before the first).
    pub(super) async fn ensure_issued(&mut self, paused: bool) -> Result<Option<Secret>, Error> {
        let secret_name = self.names.issued_tls();
        let live: Option<Secret> = self.fetch(&secret_name).await?;
        if let Some(e) = self.foreign("Secret", live.as_ref().map(|s| &s.metadata)) {
            return Err(e);
        }
        let (ca_cert, ca_key, ca_name) = self.namespace_ca().await?;
        let ca_hash = build::stable_hash(&[&ca_cert]);
        let policy = self.ctx.settings.certs;
        let wait = due_in(
            live.as_ref(),
            &ca_hash,
            policy.renew_before,
            chrono::Utc::now(),
        );
        if paused || !wait.is_zero() {
            // Renewed on time, not at the periodic pass after.
            if !wait.is_zero() && wait < super::status::STEADY_REQUEUE {
                self.recheck_in = Some(wait + Duration::from_secs(1));
            }
            return Ok(live);
        }
        let names = names_for(&self.redis.name_any(), &self.ns);
        let (cert, key, not_after) = issue(&ca_name, &ca_key, &names, policy.validity)?;
        let mut meta = build::meta(&self.redis, secret_name.clone());
        meta.annotations = Some(BTreeMap::from([
            (NOT_AFTER_ANNOTATION.into(), not_after.clone()),
            (ISSUER_ANNOTATION.into(), ca_hash),
        ]));
        let secret = Secret {
            metadata: meta,
            data: Some(BTreeMap::from([
                (CERT_FILE.into(), ByteString(cert.into_bytes())),
                (KEY_FILE.into(), ByteString(key.into_bytes())),
                (CA_FILE.into(), ByteString(ca_cert.into_bytes())),
            ])),
            type_: Some("kubernetes.io/tls".into()),
            ..Default::default()
        };
        self.ctx.metrics.kube("apply");
        self.wrote = true;
        let applied = self
            .api::<Secret>()
            .patch(
                &secret_name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&secret),
            )
            .await?;
        let why = if live.is_some() { "renewed" } else { "issued" };
        let note = format!(
            "{why} the certificate in Secret {secret_name} from the namespace's CA, valid until {not_after}"
        );
        self.event(EventType::Normal, "CertificateIssued", "Issue", note)
            .await;
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

    #[test]
    fn the_policy_refuses_a_renewal_window_as_long_as_the_lifetime() {
        let d = |s| Duration::from_secs(s);
        assert!(CertPolicy::new(d(120), d(90)).is_ok());
        assert!(CertPolicy::new(d(120), d(120)).is_err());
        assert!(CertPolicy::new(d(30), d(10)).is_err());
    }
}
