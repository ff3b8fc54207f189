//! A real S3 server for the backup suites: versitygw (built by `make
//! tools-versitygw` into bin/) with its posix backend in a temporary
//! directory, on a free loopback port. Killed when dropped.

#![allow(dead_code)]

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The root user's access key id.
pub const ACCESS_KEY: &str = "redpilot-test-access";
/// The root user's secret key.
pub const SECRET_KEY: &str = "redpilot-test-secret-0123456789";

/// One request in the server's access log.
#[derive(Debug, Clone)]
pub struct Request {
    /// The client's address.
    pub remote: String,
    /// `s3_PutObject`, `s3_DeleteObject`, ...
    pub operation: String,
    /// The object key (`-` when none).
    pub key: String,
}

/// A running versitygw.
pub struct S3Server {
    child: Option<Child>,
    host: String,
    port: u16,
    root: tempfile::TempDir,
    log: PathBuf,
}

fn binary() -> PathBuf {
    let bin = Path::new(env!("CARGO_MANIFEST_DIR")).join("bin/versitygw");
    assert!(
        bin.exists(),
        "bin/versitygw is missing: run `make tools-versitygw` (or `make tools`)"
    );
    bin
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    l.local_addr().expect("local addr").port()
}

impl S3Server {
    /// Starts a server with one bucket per name in `buckets`.
    pub fn start(buckets: &[&str]) -> Self {
        Self::start_on("127.0.0.1", buckets)
    }

    /// The same, listening on `host` (the local node's bridge address,
    /// 10.244.0.1, for agents running in pods).
    pub fn start_on(host: &str, buckets: &[&str]) -> Self {
        let root = tempfile::Builder::new()
            .prefix("redpilot-s3-")
            .tempdir()
            .expect("temp dir");
        for b in buckets {
            std::fs::create_dir_all(root.path().join("data").join(b)).expect("bucket dir");
        }
        std::fs::create_dir_all(root.path().join("meta")).expect("sidecar dir");
        let log = root.path().join("versitygw.log");
        let mut s = S3Server {
            child: None,
            host: host.to_string(),
            port: free_port(),
            root,
            log,
        };
        s.launch();
        s
    }

    fn launch(&mut self) {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("log file");
        let err = out.try_clone().expect("log file");
        let child = Command::new(binary())
            .args([
                "--access",
                ACCESS_KEY,
                "--secret",
                SECRET_KEY,
                "--port",
                &format!("{}:{}", self.host, self.port),
                "--access-log",
            ])
            .arg(self.root.path().join("access.log"))
            .args(["posix", "--sidecar"])
            .arg(self.root.path().join("meta"))
            .arg(self.root.path().join("data"))
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .expect("starting versitygw");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect((self.host.as_str(), self.port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "versitygw did not listen on {} within 20 s:\n{}",
                self.port,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `http://<host>:<port>`.
    pub fn endpoint(&self) -> String {
        format!("http://{}:{}", self.host, self.port)
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The directory holding bucket `b`'s objects.
    pub fn bucket_dir(&self, b: &str) -> PathBuf {
        self.root.path().join("data").join(b)
    }

    /// Files under bucket `b` (relative paths), excluding hidden ones.
    pub fn files(&self, b: &str) -> Vec<String> {
        fn walk(dir: &Path, base: &Path, out: &mut Vec<String>) {
            let Ok(rd) = std::fs::read_dir(dir) else {
                return;
            };
            for e in rd.flatten() {
                let p = e.path();
                let rel = p
                    .strip_prefix(base)
                    .unwrap_or(&p)
                    .to_string_lossy()
                    .to_string();
                if rel.split('/').any(|c| c.starts_with('.')) {
                    continue;
                }
                if p.is_dir() {
                    walk(&p, base, out);
                } else {
                    out.push(rel);
                }
            }
        }
        let base = self.bucket_dir(b);
        let mut out = Vec::new();
        walk(&base, &base, &mut out);
        out.sort();
        out
    }

    /// The server's log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Every request the server received, from its access log: one
    /// [`Request`] per line, oldest first.
    pub fn requests(&self) -> Vec<Request> {
        let text = std::fs::read_to_string(self.root.path().join("access.log")).unwrap_or_default();
        text.lines()
            .filter_map(|line| {
                // `<owner> <bucket> [<time>] <remote> <requester> <id> <operation> <key> ...`;
                // the time holds one space.
                let (_, after) = line.split_once("] ")?;
                let mut w = after.split_whitespace();
                let remote = w.next()?.to_string();
                let _requester = w.next()?;
                let _id = w.next()?;
                let operation = w.next()?.to_string();
                let key = w.next()?.to_string();
                Some(Request {
                    remote,
                    operation,
                    key,
                })
            })
            .collect()
    }

    /// The access log's text.
    pub fn access_log(&self) -> String {
        std::fs::read_to_string(self.root.path().join("access.log")).unwrap_or_default()
    }

    /// Kills the server (SIGKILL).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on the same port and directory.
    pub fn restart(&mut self) {
        self.kill();
        self.launch();
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        self.kill();
    }
}
