//! The certificate Secret's files, checked, pure: [`read`] finds a
//! certificate, its key and the CA that signed it in a Secret (`spec.tls`'s
//! own, or the one cert-manager or the namespace CA fills) and says what
//! the operator's connections may trust and present; [`files_hash`] is
//! what the server-auth Secret records once every instance serves them.
//! The `tls` step decides which Secret a pass serves and reloads the
//! servers; `certmanager` and `issuer` fill Secrets.

use k8s_openapi::api::core::v1::Secret;

use crate::controller::error::Error;
use crate::controller::layout::{CA_FILE, CERT_FILE, KEY_FILE};
use crate::controller::names::stable_hash;
use crate::redis::TlsOptions;

/// A usable certificate Secret.
#[derive(Clone, Debug)]
pub struct TlsMaterial {
    /// The Secret's name.
    pub secret: String,
    /// Every certificate of `tls.crt` (DER, leaf first).
    pub chain: Vec<Vec<u8>>,
    /// A hash of `tls.crt` and `ca.crt`: recorded once every instance
    /// serves them (see the `tls` step's `reload_certificates`).
    pub files_hash: String,
    /// The Secret's CA bundle (PEM).
    pub ca_pem: String,
    /// How the operator connects: the Secret's CA bundle and the one of
    /// the certificate the instances last served, no name check.
    pub options: TlsOptions,
}

/// The non-empty value of `key` in `secret`.
pub fn file<'a>(secret: &'a Secret, key: &str) -> Option<&'a [u8]> {
    secret
        .data
        .as_ref()?
        .get(key)
        .map(|b| b.0.as_slice())
        .filter(|b| !b.is_empty())
}

/// Checks the Secret `name` holds a certificate, its key and the CA that
/// signed it, valid now; `applied_ca` (the CA bundle of what the instances
/// last served) is trusted too. For the Cluster bus, and when the
/// servers ask clients for a certificate, it must also authenticate its
/// holder as a client. When it can, the operator presents it on its own
/// connections. The error names the Secret, the field (`field`: where the
/// Secret comes from) and the file, never a key's bytes.
pub fn read(
    name: &str,
    secret: Option<&Secret>,
    applied_ca: Option<&str>,
    field: &str,
    uses: Uses,
) -> Result<TlsMaterial, Error> {
    let fail = |reason: String| Error::Secret {
        name: name.to_string(),
        reason: format!("{reason} ({field})"),
    };
    let secret = secret.ok_or_else(|| fail("not found".into()))?;
    let mut files = Vec::new();
    for key in [CERT_FILE, KEY_FILE, CA_FILE] {
        files.push(file(secret, key).ok_or_else(|| fail(format!("has no {key}")))?);
    }
    let (cert, key, ca) = (files[0], files[1], files[2]);
    let chain = crate::redis::certs::check_server_certificate(
        cert,
        key,
        ca,
        rustls::pki_types::UnixTime::now(),
    )
    .map_err(|p| fail(format!("{p}")))?;
    // The operator presents the certificate wherever it may, whatever
    // `clientAuth` says: while a change of it rolls the pods, instances
    // that still ask for one must keep answering the operator.
    let client_use =
        crate::redis::certs::check_client_use(cert, ca, rustls::pki_types::UnixTime::now());
    if let Err(p) = &client_use
        && (uses.bus || uses.client_auth)
    {
        let needs = if uses.client_auth {
            "spec.tls.clientAuth has the operator's processes present it"
        } else {
            "the Cluster bus asks every node for it"
        };
        return Err(fail(format!("{p}: {needs}")));
    }
    let ca_pem = String::from_utf8_lossy(ca).into_owned();
    let mut trusted = ca_pem.clone();
    if let Some(applied) = applied_ca.filter(|a| *a != ca_pem)
        && crate::redis::certs::roots(applied.as_bytes()).is_ok()
    {
        trusted.push('\n');
        trusted.push_str(applied);
    }
    let mut options = TlsOptions::servers_of_ca(trusted.into_bytes());
    if client_use.is_ok() {
        options.client_cert_pem = Some(cert.to_vec());
        options.client_key_pem = Some(key.to_vec());
    }
    Ok(TlsMaterial {
        secret: name.to_string(),
        chain,
        files_hash: files_hash(cert, ca),
        ca_pem,
        options,
    })
}

/// The hash of a certificate Secret's `tls.crt` and `ca.crt` as recorded
/// once every instance serves them.
pub fn files_hash(cert: &[u8], ca: &[u8]) -> String {
    stable_hash(&[&String::from_utf8_lossy(cert), &String::from_utf8_lossy(ca)])
}

/// What a certificate is used for besides serving clients.
#[derive(Clone, Copy, Debug, Default)]
pub struct Uses {
    /// The Cluster bus: each node presents it to its peers.
    pub bus: bool,
    /// `spec.tls.clientAuth` asks clients for one.
    pub client_auth: bool,
}
