//! Container logs as the kubelet serves them (`GET /containerLogs/…`, what
//! `kubectl logs` reaches through the API server).
//!
//! A container's stdout and stderr go straight to
//! `<state>/pods/<ns>_<pod>/<container>.log`, appended across restarts and
//! re-created pods of the same name. The node remembers where each run of a
//! container (one container ID) starts and ends in that file, so a request
//! gets the run the kubelet would pick: the current one, or with
//! `previous=true` the last terminated one.

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use k8s_openapi::jiff::Timestamp;

/// One run of a container: its part of the log file.
#[derive(Debug, Clone, PartialEq)]
pub struct LogRun {
    /// The pod's UID.
    pub uid: String,
    pub path: PathBuf,
    /// Length of the file when the run started.
    pub start: u64,
    /// Length of the file when the run ended; `None` while it runs.
    pub end: Option<u64>,
    pub started_at: Timestamp,
    pub finished_at: Option<Timestamp>,
}

/// The runs of the containers of the pods this node runs, by container ID.
#[derive(Debug, Default)]
pub struct LogIndex {
    runs: Mutex<BTreeMap<String, LogRun>>,
}

impl LogIndex {
    pub fn started(&self, container_id: &str, uid: &str, path: &Path, start: u64) {
        if let Ok(mut m) = self.runs.lock() {
            m.insert(
                container_id.to_string(),
                LogRun {
                    uid: uid.to_string(),
                    path: path.to_path_buf(),
                    start,
                    end: None,
                    started_at: Timestamp::now(),
                    finished_at: None,
                },
            );
        }
    }

    /// The run's process exited: its part of the file ends here.
    pub fn finished(&self, container_id: &str) {
        if let Ok(mut m) = self.runs.lock()
            && let Some(r) = m.get_mut(container_id)
            && r.end.is_none()
        {
            let len = std::fs::metadata(&r.path)
                .map(|m| m.len())
                .unwrap_or(r.start);
            r.end = Some(len.max(r.start));
            r.finished_at = Some(Timestamp::now());
        }
    }

    /// The pod is gone: its runs are forgotten (the files stay).
    pub fn forget_pod(&self, uid: &str) {
        if let Ok(mut m) = self.runs.lock() {
            m.retain(|_, r| r.uid != uid);
        }
    }

    pub fn get(&self, container_id: &str) -> Option<LogRun> {
        self.runs.lock().ok()?.get(container_id).cloned()
    }
}

/// A request the node answers with an HTTP error, as the kubelet does.
#[derive(Debug, Clone, PartialEq)]
pub struct LogError {
    pub status: u16,
    pub message: String,
}

fn bad(message: impl Into<String>) -> LogError {
    LogError {
        status: 400,
        message: message.into(),
    }
}

/// The query of `/containerLogs` (the API server passes `PodLogOptions`).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct LogOptions {
    pub follow: bool,
    pub previous: bool,
    pub timestamps: bool,
    pub tail_lines: Option<u64>,
    pub limit_bytes: Option<u64>,
    pub since_seconds: Option<i64>,
    pub since_time: Option<Timestamp>,
    pub stream: Option<String>,
}

/// Go's strconv.ParseBool, which the kubelet's query decoding uses.
fn parse_bool(key: &str, v: &str) -> Result<bool, LogError> {
    match v {
        "1" | "t" | "T" | "true" | "TRUE" | "True" | "" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        _ => Err(bad(format!("{key}: invalid boolean {v:?}"))),
    }
}

/// Decodes `%XX` and `+` in a query or path component.
pub fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => {
                let hex = std::str::from_utf8(&b[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(v) => {
                        out.push(v);
                        i += 3;
                    }
                    None => {
                        out.push(b'%');
                        i += 1;
                    }
                }
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl LogOptions {
    pub fn parse(query: &str) -> Result<Self, LogError> {
        let mut o = LogOptions::default();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let v = percent_decode(v);
            let int = |v: &str| -> Result<i64, LogError> {
                v.parse::<i64>()
                    .map_err(|_| bad(format!("{k}: invalid integer {v:?}")))
            };
            match k {
                "follow" => o.follow = parse_bool(k, &v)?,
                "previous" => o.previous = parse_bool(k, &v)?,
                "timestamps" => o.timestamps = parse_bool(k, &v)?,
                "tailLines" => {
                    let n = int(&v)?;
                    // The kubelet treats a negative tail as "all".
                    o.tail_lines = (n >= 0).then_some(n as u64);
                }
                "limitBytes" => {
                    let n = int(&v)?;
                    if n < 1 {
                        return Err(bad("limitBytes: must be greater than 0"));
                    }
                    o.limit_bytes = Some(n as u64);
                }
                "sinceSeconds" => {
                    let n = int(&v)?;
                    if n < 1 {
                        return Err(bad("sinceSeconds: must be greater than 0"));
                    }
                    o.since_seconds = Some(n);
                }
                "sinceTime" => {
                    o.since_time = Some(
                        v.parse::<Timestamp>()
                            .map_err(|e| bad(format!("sinceTime: {v:?}: {e}")))?,
                    )
                }
                "stream" => o.stream = Some(v),
                // insecureSkipTLSVerifyBackend and the like are for the API server.
                _ => {}
            }
        }
        if o.timestamps {
            return Err(bad(
                "localnode does not support timestamps=true: container output goes straight to \
                 a file, without the time of each line (see dev/README.md)",
            ));
        }
        if let Some(s) = o.stream.as_deref()
            && s != "All"
        {
            return Err(bad(format!(
                "localnode does not support stream={s}: stdout and stderr share one log file \
                 (see dev/README.md)"
            )));
        }
        Ok(o)
    }

    /// The earliest time asked for, if any.
    pub fn since(&self, now: Timestamp) -> Option<Timestamp> {
        self.since_time.or_else(|| {
            self.since_seconds.and_then(|s| {
                now.checked_sub(k8s_openapi::jiff::SignedDuration::from_secs(s))
                    .ok()
            })
        })
    }
}

/// The container ID whose log a request gets: the kubelet's
/// `validateContainerLogStatus`, on the status this node reported.
pub fn container_id_for(pod: &Pod, container: &str, previous: bool) -> Result<String, LogError> {
    let pod_name = pod.metadata.name.clone().unwrap_or_default();
    let status = pod.status.as_ref();
    let all: Vec<&ContainerStatus> = status
        .into_iter()
        .flat_map(|s| {
            s.container_statuses
                .iter()
                .flatten()
                .chain(s.init_container_statuses.iter().flatten())
                .chain(s.ephemeral_container_statuses.iter().flatten())
        })
        .collect();
    let Some(cs) = all.iter().find(|c| c.name == container) else {
        return Err(bad(format!(
            "container {container:?} in pod {pod_name:?} is not available"
        )));
    };
    let state = cs.state.clone().unwrap_or_default();
    let last = cs.last_state.as_ref().and_then(|l| l.terminated.as_ref());
    let last_id = last
        .and_then(|t| t.container_id.clone())
        .filter(|s| !s.is_empty());
    let terminated = || {
        bad(format!(
            "container {container:?} in pod {pod_name:?} is terminated"
        ))
    };
    if previous {
        return last_id.ok_or_else(|| {
            bad(format!(
                "previous terminated container {container:?} in pod {pod_name:?} not found"
            ))
        });
    }
    if state.running.is_some() {
        return cs.container_id.clone().ok_or_else(terminated);
    }
    if let Some(t) = &state.terminated {
        return match cs.container_id.clone().or(t.container_id.clone()) {
            Some(id) if !id.is_empty() => Ok(id),
            _ => last_id.ok_or_else(terminated),
        };
    }
    if last.is_some() {
        return last_id.ok_or_else(terminated);
    }
    let reason = state
        .waiting
        .and_then(|w| w.reason)
        .unwrap_or_else(|| "ContainerCreating".into());
    let why = match reason.as_str() {
        "ErrImagePull" => "image can't be pulled".to_string(),
        "ImagePullBackOff" => "trying and failing to pull image".to_string(),
        other => other.to_string(),
    };
    Err(bad(format!(
        "container {container:?} in pod {pod_name:?} is waiting to start: {why}"
    )))
}

/// Where the output starts so that it holds the last `n` lines of
/// `[start, end)` (a final newline ends the last line, it does not start
/// another).
pub fn tail_start(file: &mut std::fs::File, start: u64, end: u64, n: u64) -> std::io::Result<u64> {
    if n == 0 {
        return Ok(end);
    }
    const CHUNK: u64 = 64 * 1024;
    let mut pos = end;
    let mut seen = 0u64;
    let mut skip_final = true;
    let mut buf = vec![0u8; CHUNK as usize];
    while pos > start {
        let from = pos.saturating_sub(CHUNK).max(start);
        let len = (pos - from) as usize;
        file.seek(SeekFrom::Start(from))?;
        file.read_exact(&mut buf[..len])?;
        for i in (0..len).rev() {
            if buf[i] != b'\n' {
                skip_final = false;
                continue;
            }
            if skip_final {
                skip_final = false;
                continue;
            }
            seen += 1;
            if seen == n {
                return Ok(from + i as u64 + 1);
            }
        }
        pos = from;
    }
    Ok(start)
}

/// The byte range of a run a (non-follow) request gets, and where a follow
/// may go on from: `(begin, end)`.
pub fn select_range(
    file: &mut std::fs::File,
    run_start: u64,
    run_end: u64,
    finished_at: Option<Timestamp>,
    opts: &LogOptions,
    now: Timestamp,
) -> std::io::Result<(u64, Option<u64>)> {
    // No per-line times: a run that ended before `since` gives nothing,
    // any other run all of its output.
    if let (Some(since), Some(done)) = (opts.since(now), finished_at)
        && done < since
    {
        return Ok((run_end, Some(run_end)));
    }
    let begin = match opts.tail_lines {
        Some(n) => tail_start(file, run_start, run_end, n)?,
        None => run_start,
    };
    let limit = opts.limit_bytes.map(|l| begin.saturating_add(l));
    Ok((begin, limit))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting,
        PodStatus,
    };

    fn file_with(content: &str) -> (PathBuf, std::fs::File) {
        let dir = std::env::temp_dir().join(format!(
            "localnode-logs-{}-{}",
            std::process::id(),
            Timestamp::now().as_nanosecond()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("c.log");
        std::fs::write(&p, content).unwrap();
        let f = std::fs::File::open(&p).unwrap();
        (dir, f)
    }

    fn read(f: &mut std::fs::File, from: u64, to: u64) -> String {
        let mut b = vec![0; (to - from) as usize];
        f.seek(SeekFrom::Start(from)).unwrap();
        f.read_exact(&mut b).unwrap();
        String::from_utf8(b).unwrap()
    }

    #[test]
    fn tails_lines_within_a_run() {
        let text = "old run\na\nb\nc\n";
        let (dir, mut f) = file_with(text);
        let end = text.len() as u64;
        let start = 8; // this run: "a\nb\nc\n"
        let at = |f: &mut std::fs::File, n| tail_start(f, start, end, n).unwrap();
        let t2 = at(&mut f, 2);
        assert_eq!(read(&mut f, t2, end), "b\nc\n");
        let t1 = at(&mut f, 1);
        assert_eq!(read(&mut f, t1, end), "c\n");
        let t9 = at(&mut f, 9);
        assert_eq!(read(&mut f, t9, end), "a\nb\nc\n");
        assert_eq!(at(&mut f, 0), end);
        // Without a final newline the last partial line counts as a line.
        let t1 = tail_start(&mut f, 0, end - 1, 1).unwrap();
        assert_eq!(read(&mut f, t1, end - 1), "c");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn parses_the_api_servers_query() {
        let o = LogOptions::parse(
            "follow=true&tailLines=10&limitBytes=5&sinceTime=2025-01-02T03%3A04%3A05Z&insecureSkipTLSVerifyBackend=true",
        )
        .unwrap();
        assert!(o.follow && !o.previous);
        assert_eq!(o.tail_lines, Some(10));
        assert_eq!(o.limit_bytes, Some(5));
        assert_eq!(
            o.since_time,
            Some("2025-01-02T03:04:05Z".parse::<Timestamp>().unwrap())
        );
        assert_eq!(LogOptions::parse("").unwrap(), LogOptions::default());
        assert!(LogOptions::parse("stream=All").is_ok());
        let e = LogOptions::parse("timestamps=true").unwrap_err();
        assert_eq!(e.status, 400);
        assert!(e.message.contains("timestamps"), "{}", e.message);
        assert!(LogOptions::parse("stream=Stderr").is_err());
        assert!(LogOptions::parse("tailLines=x").is_err());
        assert_eq!(percent_decode("a%2Fb+c%zz"), "a/b c%zz");
    }

    fn pod(status: ContainerStatus) -> Pod {
        Pod {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some("p".into()),
                ..Default::default()
            },
            spec: None,
            status: Some(PodStatus {
                container_statuses: Some(vec![status]),
                ..Default::default()
            }),
        }
    }

    fn terminated(id: &str) -> ContainerState {
        ContainerState {
            terminated: Some(ContainerStateTerminated {
                container_id: Some(id.into()),
                exit_code: 1,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn picks_the_run_the_kubelet_would() {
        let running = ContainerStatus {
            name: "c".into(),
            container_id: Some("id-2".into()),
            state: Some(ContainerState {
                running: Some(ContainerStateRunning::default()),
                ..Default::default()
            }),
            last_state: Some(terminated("id-1")),
            ..Default::default()
        };
        let p = pod(running.clone());
        assert_eq!(container_id_for(&p, "c", false).unwrap(), "id-2");
        assert_eq!(container_id_for(&p, "c", true).unwrap(), "id-1");
        assert!(
            container_id_for(&p, "x", false)
                .unwrap_err()
                .message
                .contains("is not available")
        );
        // Crash loop: the current log is the last run's.
        let backoff = ContainerStatus {
            container_id: None,
            state: Some(ContainerState {
                waiting: Some(ContainerStateWaiting {
                    reason: Some("CrashLoopBackOff".into()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..running.clone()
        };
        assert_eq!(container_id_for(&pod(backoff), "c", false).unwrap(), "id-1");
        let first = ContainerStatus {
            name: "c".into(),
            state: Some(ContainerState {
                running: Some(ContainerStateRunning::default()),
                ..Default::default()
            }),
            container_id: Some("id-1".into()),
            ..Default::default()
        };
        let e = container_id_for(&pod(first), "c", true).unwrap_err();
        assert_eq!(
            e.message,
            "previous terminated container \"c\" in pod \"p\" not found"
        );
        let pulling = ContainerStatus {
            name: "c".into(),
            state: Some(ContainerState {
                waiting: Some(ContainerStateWaiting {
                    reason: Some("ImagePullBackOff".into()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(
            container_id_for(&pod(pulling), "c", false)
                .unwrap_err()
                .message,
            "container \"c\" in pod \"p\" is waiting to start: trying and failing to pull image"
        );
    }
}
