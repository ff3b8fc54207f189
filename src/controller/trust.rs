//! What a tenant may make the operator send out of the cluster.
//!
//! A RedisBackup (or a Redis restored from a bucket) names a Secret and an
//! S3 endpoint; the agent the operator runs sends that Secret's values to
//! that endpoint. Someone who may create a RedisBackup but not read Secrets
//! could otherwise point it at any Secret of the namespace and at a host of
//! their own. Two checks close that, both before any Job or pod exists:
//!
//! - **The mark**: a Secret is handed to an agent only if it carries the
//!   label `redpilot.io/allow-use: "true"`. Labelling needs write access to
//!   the Secret, so only someone who owns it can lend it. A Secret's key
//!   names are not enough: they say what a Secret is, not who may use it.
//! - **The endpoint allow-list** (`--s3-endpoints`, empty by default: any
//!   `http`/`https` endpoint): entries `[scheme://]host[:port]`, where host
//!   may start with `*.` (any subdomain) and a missing scheme means
//!   `https` only, a missing port any port. An endpoint with user
//!   information (`user:pass@host`) is always refused. A bucket with no
//!   endpoint is AWS S3, `https://s3.<region>.amazonaws.com`.

use k8s_openapi::api::core::v1::Secret;

use crate::api::v1alpha1::S3Location;

/// The label that lends a Secret to the agents the operator runs.
pub const ALLOW_USE_LABEL: &str = "redpilot.io/allow-use";
/// Its value.
pub const ALLOW_USE_VALUE: &str = "true";

/// A bad `--s3-endpoints` entry (the operator does not start).
#[derive(Debug, thiserror::Error)]
#[error("--s3-endpoints: entry {entry:?}: {reason}")]
pub struct PolicyError {
    entry: String,
    reason: &'static str,
}

/// One allowed endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Allowed {
    scheme: String,
    /// Lowercase; `*.example.com` matches any subdomain of example.com.
    host: String,
    port: Option<u16>,
}

/// The S3 endpoints agents may reach (any when empty).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EndpointPolicy {
    allowed: Vec<Allowed>,
}

/// Why a reference is refused: a bounded reason (a status reason and an
/// event) and a message naming the field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// `CredentialsNotFound`, `CredentialsNotAllowed` or
    /// `EndpointNotAllowed`.
    pub reason: &'static str,
    /// What is wrong and how to fix it; never a Secret's value.
    pub message: String,
}

/// The parts of an endpoint URL the policy looks at.
#[derive(Debug, PartialEq, Eq)]
struct Parsed {
    scheme: String,
    host: String,
    port: u16,
}

fn parse_url(s: &str) -> Result<Parsed, &'static str> {
    let u = url::Url::parse(s).map_err(|_| "not a URL")?;
    if u.scheme() != "http" && u.scheme() != "https" {
        return Err("the scheme is neither http nor https");
    }
    if !u.username().is_empty() || u.password().is_some() {
        return Err("it carries user information (user@host)");
    }
    let host = u.host_str().ok_or("it has no host")?.to_ascii_lowercase();
    let port = u.port_or_known_default().ok_or("it has no port")?;
    Ok(Parsed {
        scheme: u.scheme().to_string(),
        host,
        port,
    })
}

impl EndpointPolicy {
    /// Parses a comma-separated list (blank: no restriction).
    pub fn parse(list: &str) -> Result<Self, PolicyError> {
        let mut allowed = Vec::new();
        for entry in list.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let bad = |reason| PolicyError {
                entry: entry.to_string(),
                reason,
            };
            let (scheme, rest) = match entry.split_once("://") {
                Some((s, r)) => (s.to_ascii_lowercase(), r),
                None => ("https".to_string(), entry),
            };
            if scheme != "http" && scheme != "https" {
                return Err(bad("the scheme must be http or https"));
            }
            if rest.contains(['/', '@', '?', '#']) || rest.is_empty() {
                return Err(bad("expected [scheme://]host[:port], nothing else"));
            }
            // An IPv6 address is in brackets: its port follows the `]`.
            let split = match rest.find(']') {
                Some(end) if rest.starts_with('[') => {
                    let (h, tail) = rest.split_at(end + 1);
                    match tail.strip_prefix(':') {
                        Some(p) => Some((h, p)),
                        None if tail.is_empty() => None,
                        None => return Err(bad("expected [scheme://]host[:port], nothing else")),
                    }
                }
                _ => rest.rsplit_once(':'),
            };
            let (host, port) = match split {
                Some((h, p)) => {
                    let port = p
                        .parse::<u16>()
                        .map_err(|_| bad("the port is not a number"))?;
                    (h, Some(port))
                }
                None => (rest, None),
            };
            let wild = host.strip_prefix("*.");
            let check = wild.unwrap_or(host);
            if check.is_empty() || check.contains('*') {
                return Err(bad("a host may only start with `*.`"));
            }
            // The host must be one a URL can carry.
            parse_url(&format!("{scheme}://{check}"))
                .map_err(|_| bad("the host is not a valid host name or address"))?;
            allowed.push(Allowed {
                scheme,
                host: host.to_ascii_lowercase(),
                port,
            });
        }
        Ok(EndpointPolicy { allowed })
    }

    /// True when any endpoint is allowed.
    pub fn is_open(&self) -> bool {
        self.allowed.is_empty()
    }

    /// `Ok` when agents may send to `endpoint` (AWS S3 in `region` when
    /// absent); otherwise why not, for the field `field`.
    pub fn check(&self, field: &str, endpoint: Option<&str>, region: &str) -> Result<(), Refusal> {
        let url = match endpoint {
            Some(e) => e.to_string(),
            None => format!("https://s3.{region}.amazonaws.com"),
        };
        let refuse = |why: String| Refusal {
            reason: "EndpointNotAllowed",
            message: format!("{field}: {why}"),
        };
        let p =
            parse_url(&url).map_err(|why| refuse(format!("endpoint {url} is refused: {why}")))?;
        if self.is_open() {
            return Ok(());
        }
        let hit = self.allowed.iter().any(|a| {
            let host = match a.host.strip_prefix("*.") {
                Some(suffix) => p
                    .host
                    .strip_suffix(suffix)
                    .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
                None => p.host == a.host,
            };
            host && a.scheme == p.scheme && a.port.is_none_or(|port| port == p.port)
        });
        if hit {
            Ok(())
        } else {
            Err(refuse(format!(
                "endpoint {url} is not on the operator's allow-list (--s3-endpoints); ask the operator's administrator to add it"
            )))
        }
    }
}

/// Why the S3 credentials Secret `s3.credentials.secretName` cannot be
/// handed to an agent: it is missing, lacks a key, or is not marked with
/// [`ALLOW_USE_LABEL`]. `field` is where the reference is in the spec
/// (`spec.target.s3`).
pub fn credentials_refusal(
    secret: Option<&Secret>,
    s3: &S3Location,
    field: &str,
    ns: &str,
) -> Option<Refusal> {
    let c = &s3.credentials;
    let Some(secret) = secret else {
        return Some(Refusal {
            reason: "CredentialsNotFound",
            message: format!(
                "{field}.credentials.secretName: Secret {} does not exist in namespace {ns}",
                c.secret_name
            ),
        });
    };
    let marked = secret
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(ALLOW_USE_LABEL))
        .is_some_and(|v| v == ALLOW_USE_VALUE);
    if !marked {
        return Some(Refusal {
            reason: "CredentialsNotAllowed",
            message: format!(
                "{field}.credentials.secretName: Secret {} is not lent to Redpilot: label it {ALLOW_USE_LABEL}=\"{ALLOW_USE_VALUE}\" (only a Secret's owner can) to let backup and restore agents send it to the store",
                c.secret_name
            ),
        });
    }
    let empty = std::collections::BTreeMap::new();
    let data = secret.data.as_ref().unwrap_or(&empty);
    for key in [&c.access_key_id_key, &c.secret_access_key_key] {
        if data.get(key).is_none_or(|v| v.0.is_empty()) {
            return Some(Refusal {
                reason: "CredentialsNotFound",
                message: format!(
                    "{field}.credentials: Secret {} has no key {key}",
                    c.secret_name
                ),
            });
        }
    }
    None
}

/// Both checks for a bucket: the endpoint first (no API call), then the
/// credentials Secret (read by name).
pub async fn check_s3(
    client: &kube::Client,
    metrics: &crate::telemetry::Metrics,
    policy: &EndpointPolicy,
    ns: &str,
    s3: &S3Location,
    field: &str,
) -> Result<Option<Refusal>, kube::Error> {
    if let Err(r) = policy.check(field, s3.endpoint.as_deref(), &s3.region) {
        return Ok(Some(r));
    }
    metrics.kube("get_secret");
    let secret: Option<Secret> = kube::Api::namespaced(client.clone(), ns)
        .get_opt(&s3.credentials.secret_name)
        .await?;
    Ok(credentials_refusal(secret.as_ref(), s3, field, ns))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s3(endpoint: Option<&str>) -> S3Location {
        serde_json::from_value(serde_json::json!({
            "endpoint": endpoint, "bucket": "bk", "credentials": {"secretName": "s3"}
        }))
        .expect("s3")
    }

    fn secret(labels: &[(&str, &str)], keys: &[&str]) -> Secret {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "s3", "labels": labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<std::collections::BTreeMap<_, _>>()},
            "data": keys.iter().map(|k| (k.to_string(), "eA==")).collect::<std::collections::BTreeMap<_, _>>(),
        }))
        .expect("secret")
    }

    const KEYS: [&str; 2] = ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"];

    #[test]
    fn only_a_marked_secret_with_both_keys_is_lent() {
        let loc = s3(None);
        let f = "spec.target.s3";
        let r = credentials_refusal(None, &loc, f, "ns").expect("missing");
        assert_eq!(r.reason, "CredentialsNotFound");
        assert!(
            r.message.contains(
                "spec.target.s3.credentials.secretName: Secret s3 does not exist in namespace ns"
            ),
            "{}",
            r.message
        );

        let r = credentials_refusal(Some(&secret(&[], &KEYS)), &loc, f, "ns").expect("unmarked");
        assert_eq!(r.reason, "CredentialsNotAllowed");
        assert!(
            r.message.contains("redpilot.io/allow-use=\"true\""),
            "{}",
            r.message
        );
        let r = credentials_refusal(
            Some(&secret(&[(ALLOW_USE_LABEL, "yes")], &KEYS)),
            &loc,
            f,
            "ns",
        )
        .expect("another value");
        assert_eq!(r.reason, "CredentialsNotAllowed");

        let marked = [(ALLOW_USE_LABEL, ALLOW_USE_VALUE)];
        let r =
            credentials_refusal(Some(&secret(&marked, &KEYS[..1])), &loc, f, "ns").expect("key");
        assert_eq!(r.reason, "CredentialsNotFound");
        assert!(
            r.message.ends_with("has no key AWS_SECRET_ACCESS_KEY"),
            "{}",
            r.message
        );
        assert_eq!(
            credentials_refusal(Some(&secret(&marked, &KEYS)), &loc, f, "ns"),
            None
        );
    }

    #[test]
    fn an_open_policy_takes_any_http_endpoint_but_never_user_information() {
        let p = EndpointPolicy::parse(" ").expect("blank");
        assert!(p.is_open());
        assert!(
            p.check("f", Some("http://10.0.0.1:9000"), "us-east-1")
                .is_ok()
        );
        assert!(p.check("f", None, "eu-west-1").is_ok());
        let r = p
            .check("f", Some("https://a:b@evil.example"), "r")
            .expect_err("userinfo");
        assert_eq!(r.reason, "EndpointNotAllowed");
        assert!(
            r.message.starts_with(
                "f: endpoint https://a:b@evil.example is refused: it carries user information"
            ),
            "{}",
            r.message
        );
    }

    #[test]
    fn the_allow_list_matches_scheme_host_and_port() {
        let p = EndpointPolicy::parse(
            "s3.example.com, http://127.0.0.1:9000, *.amazonaws.com, https://[::1]:7000",
        )
        .expect("list");
        let ok = |e: Option<&str>| p.check("spec.target.s3", e, "us-east-1").is_ok();
        assert!(ok(Some("https://s3.example.com")));
        assert!(
            ok(Some("https://S3.Example.com:8443/base")),
            "any port, case"
        );
        assert!(
            !ok(Some("http://s3.example.com")),
            "no scheme means https only"
        );
        assert!(ok(Some("http://127.0.0.1:9000")));
        assert!(!ok(Some("http://127.0.0.1:9001")), "another port");
        assert!(!ok(Some("https://127.0.0.1:9000")), "another scheme");
        assert!(ok(None), "AWS S3 by its regional host");
        assert!(ok(Some("https://s3.eu-west-1.amazonaws.com")));
        assert!(
            !ok(Some("https://amazonaws.com")),
            "a wildcard needs a subdomain"
        );
        assert!(!ok(Some("https://evilamazonaws.com")));
        assert!(!ok(Some("https://s3.example.com.evil.io")));
        assert!(ok(Some("https://[::1]:7000")));
        let r = p
            .check("spec.target.s3", Some("https://evil.example"), "r")
            .expect_err("not listed");
        assert_eq!(r.reason, "EndpointNotAllowed");
        assert!(
            r.message
                .contains("not on the operator's allow-list (--s3-endpoints)"),
            "{}",
            r.message
        );
    }

    #[test]
    fn bad_entries_stop_the_operator_naming_them() {
        for (entry, why) in [
            ("ftp://x", "scheme"),
            ("https://x/path", "nothing else"),
            ("u@x", "nothing else"),
            ("x:port", "port"),
            ("a.*.com", "only start"),
            ("*.", "only start"),
            ("bad host", "valid host"),
        ] {
            let e = EndpointPolicy::parse(entry).expect_err(entry).to_string();
            assert!(
                e.contains(&format!("{entry:?}")) && e.contains(why),
                "{entry}: {e}"
            );
        }
    }
}
