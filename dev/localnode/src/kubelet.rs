//! The kubelet's HTTPS endpoint, as far as the local node serves it:
//! `GET /containerLogs/{namespace}/{pod}/{container}` (what the API server
//! proxies `pods/log` to, so `kubectl logs` works) and `GET /healthz`.
//!
//! It listens on a loopback address (default `127.0.0.1:10250`, another
//! free port when that one is taken) with a self-signed certificate made at
//! start: the API server does not check the kubelet's certificate unless it
//! runs with `--kubelet-certificate-authority`, which the dev cluster does
//! not. The Node advertises the port in
//! `status.daemonEndpoints.kubeletEndpoint.Port` and the address as its
//! `Hostname` address, the type the API server tries first. No client
//! authentication or authorisation: anything on the machine that reaches
//! the port may read pod logs (the kubelet would ask the API server).

use std::convert::Infallible;
use std::io::{Read, Seek, SeekFrom};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Bytes, Frame, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use tokio::io::{AsyncReadExt, AsyncSeekExt};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls;

use crate::error::{Error, Result};
use crate::logs::{self, LogError, LogOptions};
use crate::pod::NodeCtx;

type Body = BoxBody<Bytes, std::io::Error>;

/// How often a followed log is checked for more output.
const FOLLOW_POLL: Duration = Duration::from_millis(200);
const READ_CHUNK: u64 = 64 * 1024;

/// The bound listener and its TLS setup, before the node exists.
pub struct Listener {
    listener: TcpListener,
    acceptor: TlsAcceptor,
    pub addr: SocketAddr,
}

/// Binds `address:port` (another free port when `port` is taken, e.g. by a
/// second local node) and makes a self-signed certificate for it.
pub async fn bind(address: IpAddr, port: u16, node_name: &str) -> Result<Listener> {
    let listener = match TcpListener::bind((address, port)).await {
        Ok(l) => l,
        Err(e) if port != 0 && e.kind() == std::io::ErrorKind::AddrInUse => {
            tracing::warn!(%address, port, "kubelet port in use; taking a free one");
            TcpListener::bind((address, 0))
                .await
                .map_err(|e| Error::Setup(format!("kubelet API: bind {address}:0: {e}")))?
        }
        Err(e) => {
            return Err(Error::Setup(format!(
                "kubelet API: bind {address}:{port}: {e}"
            )));
        }
    };
    let addr = listener
        .local_addr()
        .map_err(|e| Error::Setup(format!("kubelet API: local address: {e}")))?;
    let names = vec![
        address.to_string(),
        "localhost".to_string(),
        node_name.to_string(),
    ];
    let key = rcgen::generate_simple_self_signed(names)
        .map_err(|e| Error::Setup(format!("kubelet API: certificate: {e}")))?;
    let cert = key.cert.der().clone();
    let key_der = rustls::pki_types::PrivateKeyDer::Pkcs8(
        rustls::pki_types::PrivatePkcs8KeyDer::from(key.signing_key.serialize_der()),
    );
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| Error::Setup(format!("kubelet API: TLS: {e}")))?
    .with_no_client_auth()
    .with_single_cert(vec![cert], key_der)
    .map_err(|e| Error::Setup(format!("kubelet API: TLS: {e}")))?;
    Ok(Listener {
        listener,
        acceptor: TlsAcceptor::from(Arc::new(config)),
        addr,
    })
}

/// Serves connections until the node stops.
pub async fn serve(l: Listener, ctx: Arc<NodeCtx>) {
    loop {
        let (tcp, peer) = match l.listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "kubelet API: accept");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let acceptor = l.acceptor.clone();
        let ctx = ctx.clone();
        tokio::spawn(async move {
            let tls =
                match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)).await {
                    Ok(Ok(s)) => s,
                    Ok(Err(e)) => {
                        tracing::debug!(%peer, error = %e, "kubelet API: TLS handshake");
                        return;
                    }
                    Err(_) => return,
                };
            let service = hyper::service::service_fn(move |req| handle(req, ctx.clone()));
            if let Err(e) = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tls), service)
                .await
            {
                tracing::debug!(%peer, error = %e, "kubelet API: connection");
            }
        });
    }
}

fn text(status: u16, body: impl Into<String>) -> Response<Body> {
    let mut body: String = body.into();
    if !body.is_empty() && !body.ends_with('\n') {
        body.push('\n');
    }
    let mut r = Response::new(Full::new(Bytes::from(body)).map_err(|e| match e {}).boxed());
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

async fn handle(req: Request<Incoming>, ctx: Arc<NodeCtx>) -> Result<Response<Body>, Infallible> {
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    let parts: Vec<String> = path
        .trim_start_matches('/')
        .split('/')
        .map(logs::percent_decode)
        .collect();
    let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
    tracing::debug!(method = %req.method(), %path, %query, "kubelet API request");
    let resp = match (req.method(), parts.as_slice()) {
        (&Method::GET, ["healthz"]) => text(200, "ok"),
        (&Method::GET, ["containerLogs", ns, pod, container]) => {
            match container_logs(&ctx, ns, pod, container, &query).await {
                Ok(r) => r,
                Err(e) => text(e.status, e.message),
            }
        }
        (_, [op @ ("exec" | "attach" | "portForward" | "run"), ..]) => text(
            404,
            format!("localnode does not implement the kubelet's /{op} (see dev/README.md)"),
        ),
        _ => text(
            404,
            format!(
                "localnode serves only /containerLogs/{{namespace}}/{{pod}}/{{container}} and /healthz, not {path}"
            ),
        ),
    };
    Ok(resp)
}

async fn container_logs(
    ctx: &Arc<NodeCtx>,
    ns: &str,
    pod_name: &str,
    container: &str,
    query: &str,
) -> Result<Response<Body>, LogError> {
    let opts = LogOptions::parse(query)?;
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let pod = api.get_opt(pod_name).await.map_err(|e| LogError {
        status: 500,
        message: format!("localnode: reading pod {ns}/{pod_name}: {e}"),
    })?;
    let not_found = || LogError {
        status: 404,
        message: format!("pod \"{pod_name}\" does not exist"),
    };
    let pod = pod.ok_or_else(not_found)?;
    if pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) != Some(ctx.node_name.as_str()) {
        return Err(not_found());
    }
    let spec = pod.spec.clone().unwrap_or_default();
    let in_spec = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .any(|c| c.name == container)
        || spec
            .ephemeral_containers
            .iter()
            .flatten()
            .any(|c| c.name == container);
    if !in_spec {
        return Err(LogError {
            status: 404,
            message: format!("container \"{container}\" not found in pod \"{pod_name}\""),
        });
    }
    let id = logs::container_id_for(&pod, container, opts.previous)?;
    let io_err = |e: std::io::Error| LogError {
        status: 500,
        message: format!("localnode: reading the log of {ns}/{pod_name}/{container}: {e}"),
    };
    let run = ctx.logs.get(&id);
    // A run from before this node started (the node restarted): the whole
    // file, as there is no record of where that run began.
    let path = match &run {
        Some(r) => r.path.clone(),
        None => ctx
            .state_dir
            .join("pods")
            .join(format!("{ns}_{pod_name}"))
            .join(format!("{container}.log")),
    };
    let mut file = match std::fs::File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(text(200, "")),
        Err(e) => return Err(io_err(e)),
    };
    let len = file.metadata().map_err(io_err)?.len();
    let (run_start, run_end, finished_at, running) = match &run {
        Some(r) => (
            r.start.min(len),
            r.end.unwrap_or(len).min(len),
            r.finished_at,
            r.end.is_none(),
        ),
        None => (0, len, None, false),
    };
    let (begin, limit) = logs::select_range(
        &mut file,
        run_start,
        run_end,
        finished_at,
        &opts,
        Timestamp::now(),
    )
    .map_err(io_err)?;
    if opts.follow && running {
        let follow = Follow {
            ctx: ctx.clone(),
            id,
            file: tokio::fs::File::from_std(file),
            pos: begin,
            limit,
        };
        let stream = futures::stream::unfold(follow, |mut f| async move {
            f.next().await.map(|r| (r.map(Frame::data), f))
        });
        let mut r = Response::new(StreamBody::new(stream).boxed());
        r.headers_mut().insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        return Ok(r);
    }
    let end = limit.map_or(run_end, |l| l.min(run_end));
    let mut buf = vec![0u8; end.saturating_sub(begin) as usize];
    file.seek(SeekFrom::Start(begin)).map_err(io_err)?;
    file.read_exact(&mut buf).map_err(io_err)?;
    let mut r = Response::new(Full::new(Bytes::from(buf)).map_err(|e| match e {}).boxed());
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    Ok(r)
}

/// A followed log: what the run writes, until it ends (or the pod is gone,
/// or `limitBytes` is reached).
struct Follow {
    ctx: Arc<NodeCtx>,
    id: String,
    file: tokio::fs::File,
    pos: u64,
    limit: Option<u64>,
}

impl Follow {
    async fn next(&mut self) -> Option<std::io::Result<Bytes>> {
        loop {
            let len = match self.file.metadata().await {
                Ok(m) => m.len(),
                Err(e) => return Some(Err(e)),
            };
            // The run's end once it has exited; the file's end while it
            // runs; the pod forgotten: whatever is there.
            let ended = self.ctx.logs.get(&self.id).map_or(Some(len), |r| r.end);
            let stop = ended
                .unwrap_or(len)
                .min(len)
                .min(self.limit.unwrap_or(u64::MAX));
            if self.pos < stop {
                let n = (stop - self.pos).min(READ_CHUNK) as usize;
                let mut buf = vec![0u8; n];
                if let Err(e) = self.file.seek(SeekFrom::Start(self.pos)).await {
                    return Some(Err(e));
                }
                if let Err(e) = self.file.read_exact(&mut buf).await {
                    return Some(Err(e));
                }
                self.pos += n as u64;
                return Some(Ok(Bytes::from(buf)));
            }
            if ended.is_some() || self.limit.is_some_and(|l| self.pos >= l) {
                return None;
            }
            tokio::time::sleep(FOLLOW_POLL).await;
        }
    }
}
