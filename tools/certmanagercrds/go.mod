// Wrapper module that pins the cert-manager release whose cert-manager.io
// CRDs (Certificate, Issuer, ClusterIssuer, CertificateRequest) the TLS
// suite installs into the dev cluster. Nothing is built from it:
// tools/build.sh copies deploy/crds/ out of the downloaded module.
module redpilot.dev/tools/certmanagercrds

go 1.26.0

require github.com/cert-manager/cert-manager v1.21.2
