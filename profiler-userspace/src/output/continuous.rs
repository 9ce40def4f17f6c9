//! Continuous profiling: one profile per interval in a directory (each file atomic, oldest
//! intervals removed beyond `--keep`), and pushing each interval's pprof to a Pyroscope-style
//! ingest endpoint from a worker thread that retries with back-off and never blocks sampling:
//! one series per service and container (`series`), each with its own processes' samples.

use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::{write_outputs, Format, RunInfo};
use crate::aggregate::{ProcessData, Profile};

const PREFIX: &str = "tachyon-";

/// The file stem of an interval that started at `start_epoch_ms`: `tachyon-20261122T162000Z`.
pub fn stem(start_epoch_ms: f64) -> String {
    let t = UNIX_EPOCH + Duration::from_millis(start_epoch_ms.max(0.0) as u64);
    let s = humantime::format_rfc3339_seconds(t).to_string();
    format!("{PREFIX}{}", s.replace(['-', ':'], ""))
}

/// Writes an interval's formats into `dir`, then removes the oldest intervals beyond `keep`.
pub fn write_interval(
    dir: &Path,
    p: &Profile,
    run: &RunInfo,
    formats: &[Format],
    keep: Option<usize>,
    write: super::WriteOptions,
) -> Result<Vec<PathBuf>, super::Error> {
    let base = dir.join(stem(run.start_epoch_ms));
    let mut formats = formats.to_vec();
    if formats.is_empty() {
        formats.push(Format::Gecko);
    }
    formats.sort();
    formats.dedup();
    let outputs: Vec<(Format, PathBuf)> = formats
        .iter()
        .map(|f| {
            (
                *f,
                PathBuf::from(format!("{}.{}", base.display(), f.extension())),
            )
        })
        .collect();
    // Room first, so the directory never holds more than `keep` intervals.
    if let Some(keep) = keep {
        prune(dir, keep.saturating_sub(1));
    }
    write_outputs(p, run, &outputs, write)?;
    Ok(outputs.into_iter().map(|(_, p)| p).collect())
}

/// Removes every file of the oldest intervals so that `keep` remain.
fn prune(dir: &Path, keep: usize) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut files: Vec<(String, PathBuf)> = entries
        .filter_map(|e| {
            let e = e.ok()?;
            let name = e.file_name().to_string_lossy().into_owned();
            let stem = name.strip_prefix(PREFIX)?.split('.').next()?.to_string();
            Some((stem, e.path()))
        })
        .collect();
    let mut stems: Vec<String> = files.iter().map(|(s, _)| s.clone()).collect();
    stems.sort();
    stems.dedup();
    if stems.len() <= keep {
        return;
    }
    let old: Vec<String> = stems[..stems.len() - keep].to_vec();
    files.retain(|(s, _)| old.contains(s));
    for (_, path) in files {
        let _ = std::fs::remove_file(path);
    }
}

/// Counts of the push worker, shown in the summary.
#[derive(Default)]
pub struct PushStats {
    counts: std::sync::Mutex<PushCounts>,
}

/// What became of each interval: every one is counted exactly once, in one of the four.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PushCounts {
    pub sent: u64,
    pub failed: u64,
    /// The queue was full (the endpoint too slow).
    pub dropped: u64,
    /// Still queued or being sent when the run ended.
    pub abandoned: u64,
    pending: u64,
    /// The run has ended: what completes after this was already counted as abandoned.
    closed: bool,
}

impl PushStats {
    fn with<R>(&self, f: impl FnOnce(&mut PushCounts) -> R) -> R {
        let mut c = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut c)
    }

    pub fn counts(&self) -> PushCounts {
        self.with(|c| *c)
    }

    /// An upload finished: sent or failed, unless the run already gave up on it.
    fn finished(&self, ok: bool) {
        self.with(|c| {
            if c.closed {
                return;
            }
            c.pending = c.pending.saturating_sub(1);
            if ok {
                c.sent += 1;
            } else {
                c.failed += 1;
            }
        });
    }
}

/// One interval's requests: each URL, content type and body.
struct Upload {
    requests: Vec<(String, &'static str, Vec<u8>)>,
}

/// Where a pusher sends each interval.
#[derive(Clone, Debug)]
pub enum Destination {
    /// A Pyroscope-style `/ingest`: one pprof per series, or every process as the one series
    /// of this name (`--push-name`).
    Pyroscope { name: Option<String> },
    /// An OTLP/HTTP receiver of the profiles signal: one request per interval.
    Otlp,
}

/// A Pyroscope application name's part: letters, digits, `.`, `-` and `_`, others replaced by
/// `_`.
fn app_name_part(s: &str) -> String {
    let out: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if out.is_empty() {
        "unknown".into()
    } else {
        out
    }
}

/// A label value inside a Pyroscope name's braces: without `,`, `=`, `{`, `}`, quotes and
/// blanks, which its syntax gives a meaning.
fn label_value(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_whitespace() || c.is_control() || ",={}\"'\\".contains(c) {
                '_'
            } else {
                c
            }
        })
        .collect()
}

/// The series an interval is pushed as: one per service and container, each named
/// `SERVICE.MODE{host=HOST,container_id=...,pod_uid=...,LABELS}` as Pyroscope expects, with
/// the (pid, generation) of the processes whose samples it carries. Processes without an
/// identity (none are, in a live run) go to `tachyon-bpf`'s series.
pub fn series(p: &Profile, run: &RunInfo) -> Vec<(String, Vec<(u32, u32)>)> {
    let mut out: std::collections::BTreeMap<String, Vec<(u32, u32)>> = Default::default();
    for proc in p.all_processes() {
        let id = proc.identity.as_ref();
        let service = id.map_or("tachyon-bpf", |i| i.service.as_str());
        let mut labels = vec![("host".to_string(), run.host.clone())];
        for (k, v) in super::process_labels(proc, run) {
            // The service is the application's name; `systemd_unit` says no more than it.
            if k != "service_name" && k != "systemd_unit" {
                labels.push((k, v));
            }
        }
        let name = format!(
            "{}.{}{{{}}}",
            app_name_part(service),
            run.mode,
            labels
                .iter()
                .map(|(k, v)| format!("{k}={}", label_value(v)))
                .collect::<Vec<_>>()
                .join(",")
        );
        out.entry(name)
            .or_default()
            .push((proc.pid, proc.generation));
    }
    out.into_iter().collect()
}

/// Sends interval profiles to a Pyroscope-style `{url}/ingest` or an OTLP receiver from its
/// own thread.
pub struct Pusher {
    tx: Option<SyncSender<Upload>>,
    thread: Option<std::thread::JoinHandle<()>>,
    pub stats: Arc<PushStats>,
    endpoint: String,
    to: Destination,
}

impl Pusher {
    /// `url`: the server's base URL (for OTLP, the profiles path is added unless it is there).
    pub fn start(url: &str, to: Destination) -> Pusher {
        // A few intervals may queue while the endpoint is slow; beyond that the newest wait
        // for nobody: they are dropped (and counted), sampling goes on.
        let (tx, rx) = sync_channel::<Upload>(4);
        let stats = Arc::new(PushStats::default());
        let st = stats.clone();
        let endpoint = match to {
            Destination::Pyroscope { .. } => format!("{}/ingest", url.trim_end_matches('/')),
            Destination::Otlp => super::otlp::endpoint(url),
        };
        let ep = endpoint.clone();
        let thread = std::thread::spawn(move || push_loop(rx, &ep, &st));
        Pusher {
            tx: Some(tx),
            thread: Some(thread),
            stats,
            endpoint,
            to,
        }
    }

    /// Queues an interval's requests; never waits (their bodies are made here, on the
    /// caller's thread, from the interval's profile).
    pub fn push(&self, p: &Profile, run: &RunInfo) {
        let requests = match &self.to {
            Destination::Otlp => vec![(
                self.endpoint.clone(),
                "application/x-protobuf",
                super::otlp::to_bytes(p, run),
            )],
            Destination::Pyroscope { name } => {
                let (from_s, until_s) = (
                    (run.start_epoch_ms / 1000.0) as u64,
                    ((run.start_epoch_ms + run.duration_ms) / 1000.0).ceil() as u64,
                );
                self.pprof_series(p, run, name.as_deref())
                    .into_iter()
                    .map(|(name, body)| {
                        let url = format!(
                            "{}?name={}&from={from_s}&until={until_s}&format=pprof\
                             &spyName=tachyon-bpf&sampleRate=100",
                            self.endpoint,
                            super::percent_encode(&name),
                        );
                        (url, "application/octet-stream", body)
                    })
                    .collect()
            }
        };
        if requests.is_empty() {
            return;
        }
        let u = Upload { requests };
        if let Some(tx) = &self.tx {
            self.stats.with(|c| c.pending += 1);
            match tx.try_send(u) {
                Ok(()) => {}
                Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                    self.stats.with(|c| {
                        c.pending -= 1;
                        c.dropped += 1;
                    });
                }
            }
        }
    }

    /// Each series' name and gzipped pprof (`name`: all processes as one series).
    fn pprof_series(
        &self,
        p: &Profile,
        run: &RunInfo,
        name: Option<&str>,
    ) -> Vec<(String, Vec<u8>)> {
        match name {
            Some(name) => match super::pprof::to_bytes(p, run) {
                Ok(body) => vec![(name.to_string(), body)],
                Err(e) => {
                    log::warn!("pprof for {name}: {e}");
                    Vec::new()
                }
            },
            None => series(p, run)
                .into_iter()
                .filter_map(|(name, procs)| {
                    let keep = |q: &ProcessData| procs.contains(&(q.pid, q.generation));
                    match super::pprof::to_bytes_of(p, run, &keep) {
                        Ok(body) => Some((name, body)),
                        Err(e) => {
                            log::warn!("pprof for {name}: {e}");
                            None
                        }
                    }
                })
                .collect(),
        }
    }

    /// Lets queued uploads go out for at most `grace`, then gives up on them.
    pub fn finish(mut self, grace: Duration) {
        drop(self.tx.take());
        if let Some(t) = self.thread.take() {
            let t0 = std::time::Instant::now();
            while !t.is_finished() && t0.elapsed() < grace {
                std::thread::sleep(Duration::from_millis(20));
            }
            if t.is_finished() {
                let _ = t.join();
            }
        }
        // What the worker did not get to (the thread is left to the process's exit).
        self.stats.with(|c| {
            c.closed = true;
            c.abandoned += c.pending;
            c.pending = 0;
        });
    }
}

fn push_loop(rx: Receiver<Upload>, endpoint: &str, stats: &PushStats) {
    // No redirects: a profile goes to the host it was told to, or nowhere. Only a 2xx answer
    // counts as sent.
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(15)))
        .max_redirects(0)
        .http_status_as_error(false)
        .build()
        .into();
    while let Ok(u) = rx.recv() {
        // The interval counts as sent when every one of its requests was.
        let mut all = true;
        for (url, content_type, body) in &u.requests {
            all &= send(&agent, endpoint, url, content_type, body);
        }
        stats.finished(all);
    }
}

/// Sends one request, retrying with back-off; whether the server took it.
fn send(agent: &ureq::Agent, endpoint: &str, url: &str, content_type: &str, body: &[u8]) -> bool {
    let mut delay = Duration::from_millis(500);
    for attempt in 0..4 {
        match agent
            .post(url)
            .header("Content-Type", content_type)
            .send(body)
        {
            Ok(r) if r.status().is_success() => return true,
            Ok(r) if r.status().is_redirection() => {
                log::warn!(
                    "push to {endpoint}: the server redirects ({}), which is not followed",
                    r.status()
                );
                return false;
            }
            Ok(r) => {
                log::warn!(
                    "push to {endpoint} failed (attempt {}): {}",
                    attempt + 1,
                    r.status()
                );
            }
            Err(e) => {
                log::warn!("push to {endpoint} failed (attempt {}): {e}", attempt + 1);
            }
        }
        std::thread::sleep(delay);
        delay *= 2;
    }
    false
}

/// This host's name, for the default application name.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "localhost".into())
}

/// Milliseconds since the epoch, now.
pub fn epoch_ms() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64() * 1000.0)
        .unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stems_sort_by_time_and_pruning_keeps_the_newest() {
        assert_eq!(stem(1_795_000_000_000.0), "tachyon-20261118T110640Z");
        let dir = std::env::temp_dir().join(format!("tbpf-prune-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for s in ["20260101T000000Z", "20260101T000002Z", "20260101T000004Z"] {
            for ext in ["pb.gz", "folded"] {
                std::fs::write(dir.join(format!("{PREFIX}{s}.{ext}")), b"x").unwrap();
            }
        }
        std::fs::write(dir.join("other.txt"), b"x").unwrap();
        prune(&dir, 2);
        let mut left: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(
            left,
            vec![
                "other.txt",
                "tachyon-20260101T000002Z.folded",
                "tachyon-20260101T000002Z.pb.gz",
                "tachyon-20260101T000004Z.folded",
                "tachyon-20260101T000004Z.pb.gz"
            ]
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
