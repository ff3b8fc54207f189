//! Server certificates: checking a certificate, its key and its CA before
//! they are handed to servers, and a verifier for connections that reach
//! servers by address, so check the chain and the dates but not the name.

use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The CA certificates of a PEM bundle as a trust store; `Err` says what is
/// wrong with it.
pub fn roots(ca_pem: &[u8]) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem) {
        let cert = cert.map_err(|e| format!("not a PEM certificate bundle ({e})"))?;
        roots
            .add(cert)
            .map_err(|e| format!("holds an unusable CA certificate ({e})"))?;
    }
    if roots.is_empty() {
        return Err("holds no certificate".into());
    }
    Ok(roots)
}

/// Checks the certificate chain and the signatures against the trust
/// store, at the time of the handshake, but accepts any name: servers are
/// reached by pod address, which their certificates do not name.
#[derive(Debug)]
pub struct ChainOnly {
    inner: Arc<WebPkiServerVerifier>,
}

impl ChainOnly {
    /// A verifier trusting `roots`.
    pub fn new(roots: RootCertStore) -> Result<Self, String> {
        let inner = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider())
            .build()
            .map_err(|e| e.to_string())?;
        Ok(Self { inner })
    }
}

fn name_only(e: &rustls::Error) -> bool {
    matches!(
        e,
        rustls::Error::InvalidCertificate(
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. }
        )
    )
}

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self.inner.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        ) {
            Err(e) if name_only(&e) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// What is wrong with a server certificate, its key or its CA, naming the
/// file (`tls.crt`, `tls.key`, `ca.crt`) and never a key's bytes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file} {reason}")]
pub struct CertProblem {
    /// The file at fault.
    pub file: &'static str,
    /// Why.
    pub reason: String,
}

fn problem(file: &'static str, reason: impl Into<String>) -> CertProblem {
    CertProblem {
        file,
        reason: reason.into(),
    }
}

/// The certificates of `tls.crt`, the leaf first; never empty.
fn chain_of(cert_pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, CertProblem> {
    let chain = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| problem("tls.crt", format!("is not a PEM certificate ({e})")))?;
    if chain.is_empty() {
        return Err(problem("tls.crt", "holds no certificate"));
    }
    Ok(chain)
}

/// The certificates (DER) of a PEM bundle, in order; what does not parse is
/// left out.
pub fn ders(pem: &[u8]) -> Vec<Vec<u8>> {
    CertificateDer::pem_slice_iter(pem)
        .filter_map(Result::ok)
        .map(|c| c.to_vec())
        .collect()
}

/// Whether a server presenting `served` (leaf first) has loaded the
/// certificate file `chain` (its certificates, leaf first) beside the CA
/// bundle `ca_pem`. A file of the leaf alone lets the server add the CAs it
/// trusts after it (OpenSSL builds the chain from its store when the file
/// holds none), so only those may follow; a file with a chain is presented
/// as it is.
pub fn serves(served: &[Vec<u8>], chain: &[Vec<u8>], ca_pem: &[u8]) -> bool {
    if served.is_empty() || served.first() != chain.first() {
        return false;
    }
    if chain.len() > 1 {
        return served == chain;
    }
    let bundle = ders(ca_pem);
    served[1..].iter().all(|c| bundle.contains(c))
}

/// Checks what a server would load: `cert_pem` (the certificate, then its
/// intermediates) parses, `key_pem` is its private key, and the chain leads
/// to a CA of `ca_pem` and is valid at `now` (not expired, not yet valid,
/// not signed by another CA). The certificate's names are not checked.
/// Returns the file's certificates (DER, leaf first).
pub fn check_server_certificate(
    cert_pem: &[u8],
    key_pem: &[u8],
    ca_pem: &[u8],
    now: UnixTime,
) -> Result<Vec<Vec<u8>>, CertProblem> {
    let roots = roots(ca_pem).map_err(|r| problem("ca.crt", r))?;
    let chain = chain_of(cert_pem)?;
    let (leaf, intermediates) = (&chain[0], &chain[1..]);
    let key = PrivateKeyDer::from_pem_slice(key_pem)
        .map_err(|_| problem("tls.key", "is not a PEM private key"))?;
    rustls::sign::CertifiedKey::from_der(chain.clone(), key, &provider()).map_err(|e| match e {
        rustls::Error::InconsistentKeys(_) => problem("tls.key", "does not match tls.crt"),
        other => problem("tls.key", format!("cannot be used ({other})")),
    })?;
    let verifier = ChainOnly::new(roots).map_err(|r| problem("ca.crt", r))?;
    let name =
        ServerName::try_from("redis.invalid").map_err(|e| problem("tls.crt", e.to_string()))?;
    verifier
        .verify_server_cert(leaf, intermediates, &name, &[], now)
        .map(|_| chain.iter().map(|c| c.to_vec()).collect())
        .map_err(|e| {
            let reason = match e {
                rustls::Error::InvalidCertificate(CertificateError::Expired)
                | rustls::Error::InvalidCertificate(CertificateError::ExpiredContext { .. }) => {
                    "has expired".to_string()
                }
                rustls::Error::InvalidCertificate(CertificateError::NotValidYet)
                | rustls::Error::InvalidCertificate(CertificateError::NotValidYetContext {
                    ..
                }) => "is not valid yet".to_string(),
                rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer) => {
                    "is not signed by a CA of ca.crt".to_string()
                }
                other => format!("is not accepted ({other})"),
            };
            problem("tls.crt", reason)
        })
}

/// Checks that a server certificate (checked first with
/// [`check_server_certificate`]) may also authenticate its holder as a
/// client, as the Cluster bus asks of every node (it presents its
/// `tls-cert-file` to its peers whatever `tls-auth-clients` says) and
/// `tls-auth-clients` of every client: a peer refuses a certificate
/// whose extended key usage lacks `clientAuth`.
pub fn check_client_use(cert_pem: &[u8], ca_pem: &[u8], now: UnixTime) -> Result<(), CertProblem> {
    let roots = roots(ca_pem).map_err(|r| problem("ca.crt", r))?;
    let chain = chain_of(cert_pem)?;
    let (leaf, intermediates) = (&chain[0], &chain[1..]);
    let verifier =
        rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
            .build()
            .map_err(|e| problem("ca.crt", e.to_string()))?;
    verifier
        .verify_client_cert(leaf, intermediates, now)
        .map(|_| ())
        .map_err(|e| match e {
            rustls::Error::InvalidCertificate(
                CertificateError::InvalidPurpose | CertificateError::InvalidPurposeContext { .. },
            ) => problem(
                "tls.crt",
                "cannot authenticate a client (its extended key usage has no clientAuth)",
            ),
            other => problem(
                "tls.crt",
                format!("is not accepted from a client ({other})"),
            ),
        })
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_server_serves_a_file_when_it_presents_it_or_its_leaf_with_trusted_cas_after() {
        use super::*;
        let ca = |name: &str| {
            let key = rcgen::KeyPair::generate().expect("key");
            let mut p = rcgen::CertificateParams::default();
            p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
            p.distinguished_name.push(rcgen::DnType::CommonName, name);
            p.self_signed(&key).expect("CA").pem()
        };
        let (bundle, other) = (ca("trusted"), ca("other"));
        let (leaf, ca, other) = (
            vec![1u8],
            ders(bundle.as_bytes())[0].clone(),
            ders(other.as_bytes())[0].clone(),
        );
        let bundle = bundle.as_bytes();
        // A file of the leaf alone: the server may add CAs it trusts after it.
        assert!(serves(
            std::slice::from_ref(&leaf),
            std::slice::from_ref(&leaf),
            bundle
        ));
        assert!(serves(
            &[leaf.clone(), ca.clone()],
            std::slice::from_ref(&leaf),
            bundle
        ));
        assert!(
            !serves(
                &[leaf.clone(), other.clone()],
                std::slice::from_ref(&leaf),
                bundle
            ),
            "a mark of another version"
        );
        assert!(!serves(
            std::slice::from_ref(&other),
            std::slice::from_ref(&leaf),
            bundle
        ));
        assert!(!serves(&[], std::slice::from_ref(&leaf), bundle));
        // A file with a chain is presented as it is.
        let file = [leaf.clone(), other.clone()];
        assert!(serves(&file, &file, bundle));
        assert!(!serves(std::slice::from_ref(&leaf), &file, bundle));
        assert!(!serves(&[leaf.clone(), ca.clone()], &file, bundle));
    }

    use super::*;
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};

    struct Ca {
        pem: String,
        issuer: Issuer<'static, KeyPair>,
    }

    fn ca(name: &str) -> Ca {
        let key = KeyPair::generate().expect("key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        let cert = params.self_signed(&key).expect("CA");
        Ca {
            pem: cert.pem(),
            issuer: Issuer::new(params, key),
        }
    }

    /// A server certificate signed by `ca`, valid from `from` to `to` (Unix
    /// seconds), and its key.
    fn leaf(ca: &Ca, from: i64, to: i64) -> (String, String) {
        let key = KeyPair::generate().expect("key");
        let mut params = CertificateParams::new(vec!["cache.ns.svc".to_string()]).expect("params");
        params.not_before = time::OffsetDateTime::from_unix_timestamp(from).expect("from");
        params.not_after = time::OffsetDateTime::from_unix_timestamp(to).expect("to");
        let cert = params.signed_by(&key, &ca.issuer).expect("leaf");
        (cert.pem(), key.serialize_pem())
    }

    const NOW: u64 = 1_800_000_000;

    fn at(secs: u64) -> UnixTime {
        UnixTime::since_unix_epoch(std::time::Duration::from_secs(secs))
    }

    fn check(cert: &str, key: &str, ca: &str) -> Result<(), CertProblem> {
        check_server_certificate(cert.as_bytes(), key.as_bytes(), ca.as_bytes(), at(NOW))
            .map(|_| ())
    }

    #[test]
    fn a_certificate_its_key_and_its_ca_are_accepted_whatever_the_name() {
        let a = ca("a");
        let (cert, key) = leaf(&a, NOW as i64 - 3600, NOW as i64 + 3600);
        assert_eq!(check(&cert, &key, &a.pem), Ok(()));
        // A bundle with another CA besides still trusts it.
        let b = ca("b");
        assert_eq!(check(&cert, &key, &(b.pem.clone() + &a.pem)), Ok(()));
    }

    #[test]
    fn each_problem_names_its_file() {
        let a = ca("a");
        let b = ca("b");
        let (cert, key) = leaf(&a, NOW as i64 - 3600, NOW as i64 + 3600);
        let (_, other_key) = leaf(&a, NOW as i64 - 3600, NOW as i64 + 3600);
        let (old, old_key) = leaf(&a, NOW as i64 - 7200, NOW as i64 - 3600);
        let (early, early_key) = leaf(&a, NOW as i64 + 3600, NOW as i64 + 7200);
        let cases = [
            (
                check(&cert, &key, &b.pem),
                "tls.crt",
                "is not signed by a CA of ca.crt",
            ),
            (
                check(&cert, &other_key, &a.pem),
                "tls.key",
                "does not match tls.crt",
            ),
            (check(&old, &old_key, &a.pem), "tls.crt", "has expired"),
            (
                check(&early, &early_key, &a.pem),
                "tls.crt",
                "is not valid yet",
            ),
            (check("", &key, &a.pem), "tls.crt", "holds no certificate"),
            (
                check(&cert, "nonsense", &a.pem),
                "tls.key",
                "is not a PEM private key",
            ),
            (check(&cert, &key, ""), "ca.crt", "holds no certificate"),
        ];
        for (got, file, reason) in cases {
            let p = got.expect_err(reason);
            assert_eq!((p.file, p.reason.as_str()), (file, reason));
        }
    }

    #[test]
    fn a_certificate_for_servers_only_cannot_serve_the_cluster_bus() {
        use rcgen::ExtendedKeyUsagePurpose::{ClientAuth, ServerAuth};
        let a = ca("a");
        let with = |usages: Vec<rcgen::ExtendedKeyUsagePurpose>| {
            let key = KeyPair::generate().expect("key");
            let mut params =
                CertificateParams::new(vec!["cache.ns.svc".to_string()]).expect("params");
            params.not_before =
                time::OffsetDateTime::from_unix_timestamp(NOW as i64 - 3600).expect("from");
            params.not_after =
                time::OffsetDateTime::from_unix_timestamp(NOW as i64 + 3600).expect("to");
            params.extended_key_usages = usages;
            params.signed_by(&key, &a.issuer).expect("leaf").pem()
        };
        let client_use = |cert: &str| check_client_use(cert.as_bytes(), a.pem.as_bytes(), at(NOW));
        // No extended key usage (the operator's own), or both.
        assert_eq!(client_use(&with(vec![])), Ok(()));
        assert_eq!(client_use(&with(vec![ServerAuth, ClientAuth])), Ok(()));
        let p = client_use(&with(vec![ServerAuth])).expect_err("server only");
        assert_eq!(p.file, "tls.crt");
        assert!(p.reason.contains("no clientAuth"), "{p}");
        // Another CA is still reported as such.
        let b = ca("b");
        let p = check_client_use(with(vec![]).as_bytes(), b.pem.as_bytes(), at(NOW))
            .expect_err("another CA");
        assert!(p.reason.contains("not accepted from a client"), "{p}");
    }

    #[test]
    fn a_problem_never_shows_the_key() {
        let a = ca("a");
        let (cert, _) = leaf(&a, NOW as i64 - 3600, NOW as i64 + 3600);
        let garbage = "-----BEGIN PRIVATE KEY-----\nc2VjcmV0LWJ5dGVz\n-----END PRIVATE KEY-----\n";
        let p = check(&cert, garbage, &a.pem).expect_err("bad key");
        assert_eq!(p.file, "tls.key");
        assert!(!p.to_string().contains("c2VjcmV0"), "{p}");
    }
}
