//! Output writers, one per format, all written from the aggregated profile: the live run and
//! `convert` (from a recording) call the same `render`. Files are written atomically and
//! safely (the crate's `files`), with the permissions `WriteOptions` says.
//!
//! Formats: `gecko/` (Firefox Profiler; its markers in `gecko/markers.rs`), `pprof`, `collapsed`,
//! `jsonl`, `pstats`, `heatmap`, `diff`; `recording` (the `.tbpf` format, docs/recording.md);
//! `dump` (`tachyon-bpf dump`'s text and JSON); `summary` and `functions` (the end-of-run lines
//! and `top`'s view); `continuous` (intervals and the push); `serve` (`--open`).
//!
//! May import `aggregate` and `files` only: formats know profiles, not how they were captured.

pub mod collapsed;
pub mod continuous;
pub mod diff;
pub mod dump;
pub mod functions;
pub mod gecko;
pub mod heatmap;
pub mod jsonl;
pub mod otlp;
pub mod pprof;
pub mod pstats;
pub mod recording;
pub mod serve;
pub mod summary;

use crate::files;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::aggregate::{Category, FrameId, ProcessData, Profile, StackId, ThreadData};

/// What kind of failure an output `Error` is, set where it happens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// A file could not be written, or the profile could not be served.
    Output,
    /// An input file (a recording) is unreadable, damaged, or of an unknown version.
    Input,
    /// The input cannot give what was asked (another mode from a cpu recording).
    Usage,
    /// A format could not be encoded.
    Encode,
}

/// An error of the output layer: its kind, one line for the user, and the error it came from
/// (`source()`), kept for `-v`'s chain of causes.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Error {
    pub kind: ErrorKind,
    pub message: String,
    #[source]
    pub source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
}

impl Error {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Error {
        Error {
            kind,
            message: message.into(),
            source: None,
        }
    }

    /// An error caused by `source`: the message says what failed; the cause stays reachable.
    pub fn caused(
        kind: ErrorKind,
        message: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Error {
        Error {
            kind,
            message: message.into(),
            source: Some(Box::new(source)),
        }
    }

    /// A format that could not be encoded, and why.
    pub fn encode(what: &str, source: impl std::error::Error + Send + Sync + 'static) -> Error {
        let message = format!("{what}: {source}");
        Error::caused(ErrorKind::Encode, message, source)
    }
}

/// What the run was: stored in recordings and written into each format's metadata.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunInfo {
    /// Unique id of the run (uuid4, hex).
    pub run_id: String,
    pub start_epoch_ms: f64,
    pub interval_ms: f64,
    pub duration_ms: f64,
    pub mode: String,
    pub rate_hz: u64,
    pub command: String,
    pub lost: u64,
    /// CPUs of the host the run was on.
    pub cpus: u32,
    /// What the profiler itself cost (absent in recordings made before it was measured).
    #[serde(default)]
    pub cost: Option<Cost>,
    /// The kernel the run was on and the BPF program set it got (absent in older recordings).
    #[serde(default)]
    pub kernel: Option<KernelMeta>,
    /// Every BPF counter at the end of the run, by its name in `profiler_common::STATS`
    /// (absent in older recordings).
    #[serde(default)]
    pub bpf_counters: Vec<(String, u64)>,
    /// `--async-aware`'s setting (`running` or `all`), if given.
    #[serde(default)]
    pub async_aware: Option<String>,
    /// Each BPF program's run time (ms) and runs, when the kernel's statistics were on (not
    /// kept in recordings).
    #[serde(default)]
    pub bpf_programs: Vec<(String, f64, u64)>,
    /// The host's name (empty in recordings made before it was kept).
    #[serde(default)]
    pub host: String,
    /// The run's own labels (`--label NAME=VALUE`), given to every process's.
    #[serde(default)]
    pub labels: Vec<(String, String)>,
}

/// `NAME MS ms (RUNS runs, US µs each)` per program, comma-separated.
pub fn bpf_programs_line(programs: &[(String, f64, u64)]) -> String {
    programs
        .iter()
        .map(|(name, ms, runs)| {
            format!(
                "{name} {ms:.1} ms ({runs} runs, {:.2} µs each)",
                ms * 1000.0 / (*runs).max(1) as f64
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The kernel of a run, as the profile's `meta.tachyon.kernel` reports it.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct KernelMeta {
    /// `uname -r`.
    pub release: String,
    /// `modern` or `compat` (docs/compatibility.md, "Kernels").
    pub programs: String,
}

/// This process's peak resident memory (`VmHWM`, in KiB). Not `getrusage`'s `ru_maxrss`: that
/// keeps the high-water mark of the program that exec'd this one (the parent's, after a fork).
fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

/// The profiler's own cost over a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Cost {
    /// User-space CPU time (user + system) of the profiler, start-up included.
    pub user_cpu_ms: f64,
    /// Time spent in the BPF programs, and their runs, when the kernel's run-time statistics
    /// could be enabled (CAP_SYS_ADMIN).
    pub bpf_ms: Option<f64>,
    pub bpf_runs: u64,
    /// Peak resident memory of the profiler.
    pub peak_rss_kib: u64,
}

impl Cost {
    /// CPU time of the profiler per sample, in µs, everything included.
    pub fn us_per_sample(&self, samples: u64) -> f64 {
        (self.user_cpu_ms + self.bpf_ms.unwrap_or(0.0)) * 1000.0 / samples.max(1) as f64
    }

    /// This process's CPU time and peak RSS so far, with the BPF time given.
    pub fn measure(bpf: Option<(std::time::Duration, u64)>) -> Cost {
        let r = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF).ok();
        let ms = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 * 1e3 + t.tv_usec() as f64 / 1e3;
        Cost {
            user_cpu_ms: r
                .as_ref()
                .map(|r| ms(r.user_time()) + ms(r.system_time()))
                .unwrap_or(0.0),
            bpf_ms: bpf.map(|(d, _)| d.as_secs_f64() * 1e3),
            bpf_runs: bpf.map(|(_, n)| n).unwrap_or(0),
            peak_rss_kib: peak_rss_kib(),
        }
    }

    /// One line for the summary.
    pub fn line(&self, samples: u64) -> String {
        if samples == 0 {
            return format!(
                "profiler cost: {:.0} ms CPU, peak RSS {:.1} MiB",
                self.user_cpu_ms + self.bpf_ms.unwrap_or(0.0),
                self.peak_rss_kib as f64 / 1024.0
            );
        }
        let bpf = match self.bpf_ms {
            Some(b) => format!(
                "{:.1} user space, {:.1} BPF",
                self.user_cpu_ms * 1000.0 / samples.max(1) as f64,
                b * 1000.0 / samples.max(1) as f64
            ),
            None => "BPF time not measured: it needs CAP_SYS_ADMIN".into(),
        };
        format!(
            "profiler cost: {:.1} µs CPU per sample ({bpf}), {:.0} ms CPU in all, peak RSS {:.1} MiB",
            self.us_per_sample(samples),
            self.user_cpu_ms + self.bpf_ms.unwrap_or(0.0),
            self.peak_rss_kib as f64 / 1024.0
        )
    }
}

/// The output formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Format {
    /// Firefox Profiler (processed profile JSON).
    Gecko,
    /// Folded stacks (`frame;frame;frame count`), for inferno, speedscope, flamegraph.pl.
    Collapsed,
    /// CPython sampler's JSON Lines, schema version 0.
    Jsonl,
    /// Gzipped pprof profile.proto, for `go tool pprof` and continuous-profiling backends.
    Pprof,
    /// A self-contained interactive SVG flame graph.
    Flamegraph,
    /// Python's `pstats` statistics (marshalled), for `pstats.Stats`, snakeviz and the like.
    Pstats,
    /// A self-contained HTML page of Python source files with each line shaded by its samples.
    Heatmap,
}

impl Format {
    pub const ALL: [Format; 7] = [
        Format::Gecko,
        Format::Collapsed,
        Format::Jsonl,
        Format::Pprof,
        Format::Flamegraph,
        Format::Pstats,
        Format::Heatmap,
    ];

    /// The name `--format` takes.
    pub fn name(self) -> &'static str {
        match self {
            Format::Gecko => "gecko",
            Format::Collapsed => "collapsed",
            Format::Jsonl => "jsonl",
            Format::Pprof => "pprof",
            Format::Flamegraph => "flamegraph",
            Format::Pstats => "pstats",
            Format::Heatmap => "heatmap",
        }
    }

    pub fn from_name(name: &str) -> Option<Format> {
        Format::ALL.into_iter().find(|f| f.name() == name)
    }

    pub fn extension(self) -> &'static str {
        match self {
            Format::Gecko => "json",
            Format::Collapsed => "folded",
            Format::Jsonl => "jsonl",
            Format::Pprof => "pb.gz",
            Format::Flamegraph => "svg",
            Format::Pstats => "pstats",
            Format::Heatmap => "heatmap",
        }
    }

    /// Written as a directory of files rather than one file.
    pub fn is_directory(self) -> bool {
        self == Format::Heatmap
    }

    pub fn render(self, p: &Profile, run: &RunInfo) -> Result<Vec<u8>, Error> {
        match self {
            Format::Gecko => {
                serde_json::to_vec(&gecko::to_json(p, run)).map_err(|e| Error::encode("Gecko", e))
            }
            Format::Collapsed => Ok(collapsed::to_text(p).into_bytes()),
            Format::Jsonl => Ok(jsonl::to_text(p, run).into_bytes()),
            Format::Pprof => pprof::to_bytes(p, run),
            Format::Flamegraph => collapsed::flamegraph(p, run),
            Format::Pstats => Ok(pstats::to_bytes(p)),
            // A directory of pages (`write_outputs`); here, in one stream, for comparisons.
            Format::Heatmap => Ok(heatmap::pages(p, run)
                .into_iter()
                .flat_map(|(name, page)| format!("<!-- {name} -->\n{page}").into_bytes())
                .collect()),
        }
    }
}

/// Where each format goes. One format: `output` as given (default `profile.<ext>`). Several:
/// `output` is a base name; a known extension on it is dropped and each format adds its own.
pub fn output_paths(output: Option<&Path>, formats: &[Format]) -> Vec<(Format, PathBuf)> {
    let mut formats = formats.to_vec();
    formats.sort();
    formats.dedup();
    if formats.is_empty() {
        formats.push(Format::Gecko);
    }
    if let ([f], Some(o)) = (formats.as_slice(), output) {
        return vec![(*f, o.to_path_buf())];
    }
    let base = output
        .map(|o| {
            let s = o.to_string_lossy();
            let known = [
                ".json", ".folded", ".jsonl", ".pb.gz", ".svg", ".tbpf", ".txt", ".pprof",
                ".pstats", ".heatmap",
            ];
            known
                .iter()
                .find_map(|e| s.strip_suffix(e))
                .unwrap_or(&s)
                .to_string()
        })
        .unwrap_or_else(|| "profile".to_string());
    formats
        .into_iter()
        .map(|f| (f, PathBuf::from(format!("{base}.{}", f.extension()))))
        .collect()
}

/// Renders every format and writes each file atomically.
pub fn write_outputs(
    p: &Profile,
    run: &RunInfo,
    outputs: &[(Format, PathBuf)],
    opts: WriteOptions,
) -> Result<(), Error> {
    for (format, path) in outputs {
        let written = if format.is_directory() {
            let pages: Vec<(String, Vec<u8>)> = heatmap::pages(p, run)
                .into_iter()
                .map(|(n, page)| (n, page.into_bytes()))
                .collect();
            files::write_dir_atomic(path, &pages, opts.mode)
        } else {
            write_atomic(path, &format.render(p, run)?, opts)
        };
        written.map_err(|e| {
            let message = format!("cannot write {}: {e}", path.display());
            Error::caused(ErrorKind::Output, message, e)
        })?;
    }
    Ok(())
}

/// A thread's counted samples summed per stack: what the stack-aggregating formats write.
pub struct StackTotal<'a> {
    pub process: &'a ProcessData,
    pub thread: &'a ThreadData,
    pub stack: StackId,
    /// Milliseconds of the profile's mode this stack stands for.
    pub ms: f64,
}

/// Every thread's in-mode samples with a stack, summed per stack, in a stable order (processes
/// as listed, threads by tid, stacks by id).
pub fn stack_totals(p: &Profile) -> Vec<StackTotal<'_>> {
    let mut out = Vec::new();
    for proc_ in p.all_processes() {
        for t in proc_.threads.values() {
            let mut per: BTreeMap<StackId, f64> = BTreeMap::new();
            for s in t.samples.iter().filter(|s| s.in_mode) {
                if let Some(st) = s.stack {
                    *per.entry(st).or_default() += s.weight_ms;
                }
            }
            out.extend(per.into_iter().map(|(stack, ms)| StackTotal {
                process: proc_,
                thread: t,
                stack,
                ms,
            }));
        }
    }
    out
}

/// Percent-encodes everything but RFC 3986 unreserved characters (for URL paths and queries).
pub fn percent_encode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A time in sampling periods, as the integer sample count the counting formats use.
pub fn periods(ms: f64, interval_ms: f64) -> u64 {
    (ms / interval_ms).round().max(0.0) as u64
}

/// How a process is named as a root frame: its label and pid (`pid.N` for an earlier program
/// of the same pid).
pub fn process_label(p: &ProcessData) -> String {
    if p.generation > 0 {
        format!("{} [pid {}.{}]", p.name, p.pid, p.generation)
    } else {
        format!("{} [pid {}]", p.name, p.pid)
    }
}

/// A process's labels in every format: its identity's (`service_name` first), then the run's
/// own (`--label`). A process read before identities were (an older recording) has the run's
/// alone.
pub fn process_labels(p: &ProcessData, run: &RunInfo) -> Vec<(String, String)> {
    let mut out = p.identity.as_ref().map(|i| i.labels()).unwrap_or_default();
    for (k, v) in &run.labels {
        if !out.iter().any(|(n, _)| n == k) {
            out.push((k.clone(), v.clone()));
        }
    }
    out
}

/// How a thread is named as a root frame: the name Python gave it, else its `comm`, with its tid.
pub fn thread_label(t: &ThreadData) -> String {
    if t.is_task_view() {
        // An event loop's suspended tasks: its name says which thread's.
        return t.name.clone();
    }
    format!(
        "{} [tid {}]",
        t.python_name.as_ref().unwrap_or(&t.name),
        t.tid
    )
}

/// One frame as text, in the conventions of folded stacks: Python frames as CPython's sampler
/// writes them (`file.py:function:line`), kernel frames with the `_[k]` suffix flame graph tools
/// colour, native frames by symbol.
pub fn frame_label(p: &Profile, frame: FrameId) -> String {
    let fr = &p.frames[frame];
    let func = &p.funcs[fr.func];
    match (&func.file, fr.category) {
        (Some(file), _) if func.is_python => {
            let base = file.rsplit('/').next().unwrap_or(file);
            let line = fr.line.or(func.line).unwrap_or(0);
            match &fr.opcode {
                Some(op) => format!("{base}:{}:{line}:{}", func.name, op.name),
                None => format!("{base}:{}:{line}", func.name),
            }
        }
        (_, Category::Kernel) => format!("{}_[k]", func.name),
        _ => func.name.to_string(),
    }
}

/// How output files are written: the permissions they get (`--output-mode`), whatever the
/// umask.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WriteOptions {
    pub mode: u32,
}

impl WriteOptions {
    pub fn with_mode(mode: u32) -> WriteOptions {
        WriteOptions { mode: mode & 0o777 }
    }
}

impl Default for WriteOptions {
    /// 0600: profiles name every user's code paths.
    fn default() -> WriteOptions {
        WriteOptions { mode: 0o600 }
    }
}

/// Writes `bytes` to `path` atomically, with `opts`' permissions, by the rules of [`files`]
/// (no planted temporary, no writing through links or into devices); `-` is standard output.
pub fn write_atomic(path: &Path, bytes: &[u8], opts: WriteOptions) -> std::io::Result<()> {
    files::write_atomic(path, bytes, opts.mode)
}

/// Checks early that `path` can be written, so a long run never ends in a lost profile.
pub fn check_writable(path: &Path) -> std::io::Result<()> {
    files::check_writable(path)
}

/// The same for a format written as a directory (`Format::is_directory`).
pub fn check_dir_writable(path: &Path) -> std::io::Result<()> {
    files::check_dir_writable(path)
}

#[cfg(test)]
pub(crate) mod fixture {
    use std::sync::Arc;

    use super::RunInfo;
    use crate::aggregate::identity::Identity;
    use crate::aggregate::{state, Category, Frame, Func, Mode, Profile, Sample};

    /// A small fixed profile: one Python process (two threads: Python over libpython over the
    /// kernel, and an off-CPU wait), one native process, and a sample outside the mode.
    pub fn profile(mode: Mode) -> (Profile, RunInfo) {
        let mut p = Profile::new(mode, 1.0);
        let libpy = p.lib(&Arc::from("/usr/lib/libpython3.12.so.1.0"));
        p.set_build_id(
            libpy,
            Some(&Arc::from("0123456789abcdef0123456789abcdef01234567")),
        );
        p.set_interpreter(libpy, true);
        let kernel = p.lib(&Arc::from("[kernel.kallsyms]"));
        let app = p.lib(&Arc::from("/usr/bin/app"));
        let frame = |p: &mut Profile, name: &str, py: Option<(&str, u32, u32)>, lib, cat| {
            let func = p.func(Func {
                name: Arc::from(name),
                file: py.map(|(f, _, _)| Arc::from(f)),
                line: py.map(|(_, first, _)| first),
                lib,
                category: cat,
                is_python: py.is_some(),
            });
            p.frame(Frame {
                func,
                line: py.map(|(_, _, l)| l),
                address: if py.is_some() {
                    None
                } else {
                    Some(0x1000 + func as u64 * 16)
                },
                symbol_address: if py.is_some() {
                    None
                } else {
                    Some(0x1000 + func as u64 * 16)
                },
                category: cat,
                opcode: None,
            })
        };
        let start = frame(&mut p, "_start", None, Some(libpy), Category::User);
        let main_py = frame(
            &mut p,
            "main",
            Some(("/srv/app.py", 10, 12)),
            None,
            Category::Python,
        );
        let work = frame(
            &mut p,
            "work",
            Some(("/srv/app.py", 20, 22)),
            None,
            Category::Python,
        );
        let work2 = frame(
            &mut p,
            "work",
            Some(("/srv/app.py", 20, 23)),
            None,
            Category::Python,
        );
        let sleep = frame(&mut p, "time_sleep", None, Some(libpy), Category::Native);
        let sched = frame(&mut p, "schedule", None, Some(kernel), Category::Kernel);
        let amain = frame(&mut p, "main", None, Some(app), Category::User);
        let crunch = frame(&mut p, "crunch;loop", None, Some(app), Category::User);
        let s_work = p.stack(&[start, main_py, work]);
        let s_work2 = p.stack(&[start, main_py, work2]);
        let s_sleep = p.stack(&[start, main_py, sleep, sched]);
        let s_crunch = p.stack(&[amain, crunch]);
        let on = state::ON_CPU | state::PYTHON | state::HAS_GIL;
        let add = |p: &mut Profile, pid, pname: &str, tid, tname: &str, t: f64, stack, st, w| {
            let th = p.thread_mut(pid, pname, tid, tname, t);
            th.samples.push(Sample {
                time_ms: t,
                stack,
                state: st,
                weight_ms: w,
                in_mode: mode.keeps(st),
                cpu_delta_us: 0.0,
            });
        };
        let py = "app.py (Python 3.12.1)";
        for i in 0..6 {
            add(&mut p, 100, py, 100, "python3", i as f64, s_work, on, 1.0);
        }
        for i in 6..9 {
            add(&mut p, 100, py, 100, "python3", i as f64, s_work2, on, 1.0);
        }
        add(
            &mut p,
            100,
            py,
            100,
            "python3",
            9.0,
            s_sleep,
            state::PYTHON,
            4.0,
        );
        add(
            &mut p,
            100,
            py,
            101,
            "worker",
            2.0,
            s_sleep,
            state::PYTHON,
            10.0,
        );
        for i in 0..5 {
            add(
                &mut p,
                200,
                "app",
                200,
                "app",
                i as f64,
                s_crunch,
                state::ON_CPU,
                1.0,
            );
        }
        p.finish(13.0);
        // The Python process in a container with a service name; the other one plain.
        let cgroup = format!("0::/system.slice/docker-{}.scope\n", "ab12".repeat(16));
        let env = [("OTEL_SERVICE_NAME".to_string(), "checkout".to_string())];
        p.processes.get_mut(&100).unwrap().identity = Some(Identity::from_parts(
            &cgroup,
            "NSpid:\t100\t7\n",
            &env,
            Some("/usr/bin/python3.12".into()),
            "app.py",
            &[],
        ));
        p.processes.get_mut(&200).unwrap().identity = Some(Identity::from_parts(
            "0::/user.slice\n",
            "",
            &[],
            None,
            "app",
            &[],
        ));
        let run = RunInfo {
            run_id: "0123456789abcdef0123456789abcdef".into(),
            start_epoch_ms: 1_700_000_000_000.0,
            interval_ms: 1.0,
            duration_ms: 13.0,
            mode: mode.name().into(),
            rate_hz: 1000,
            command: "tachyon-bpf --all".into(),
            lost: 0,
            cpus: 2,
            cost: None,
            kernel: None,
            bpf_counters: vec![("samples".into(), 13), ("lost".into(), 0)],
            async_aware: None,
            bpf_programs: Vec::new(),
            host: "testhost".into(),
            labels: vec![("cluster".into(), "eu-1".into())],
        };
        (p, run)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::Mode;

    fn render(f: Format, mode: Mode) -> String {
        let (p, run) = fixture::profile(mode);
        // Through a recording and back, as `convert` does.
        let bytes = recording::to_bytes(&p, &run).unwrap();
        let dir = std::env::temp_dir().join(format!("tbpf-snap-{}-{f:?}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("r.tbpf");
        write_atomic(&path, &bytes, WriteOptions::default()).unwrap();
        let (p2, run2) = recording::load(&path).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        let out = f.render(&p2, &run2).unwrap();
        assert!(
            out == f.render(&p, &run).unwrap(),
            "{f:?} differs after a recording"
        );
        match f {
            Format::Pprof => {
                use prost::Message;
                let mut raw = Vec::new();
                std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&out[..]), &mut raw)
                    .unwrap();
                format!("{:#?}", pprof::PProfile::decode(&raw[..]).unwrap())
            }
            Format::Gecko => {
                let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
                serde_json::to_string_pretty(&v).unwrap()
            }
            _ => String::from_utf8(out).unwrap(),
        }
    }

    #[test]
    fn snapshot_collapsed() {
        insta::assert_snapshot!(render(Format::Collapsed, Mode::Wall));
    }

    #[test]
    fn snapshot_jsonl() {
        insta::assert_snapshot!(render(Format::Jsonl, Mode::Wall));
    }

    #[test]
    fn snapshot_pprof() {
        insta::assert_snapshot!(render(Format::Pprof, Mode::Wall));
    }

    #[test]
    fn snapshot_gecko() {
        insta::assert_snapshot!(render(Format::Gecko, Mode::Wall));
    }

    #[test]
    fn snapshot_flamegraph() {
        let svg = render(Format::Flamegraph, Mode::Wall);
        assert!(svg.starts_with("<?xml") && svg.contains("<script"));
        // The frames and their counts, as the SVG's titles give them.
        let titles: Vec<&str> = svg
            .split("<title>")
            .skip(1)
            .filter_map(|t| t.split("</title>").next())
            .collect();
        insta::assert_snapshot!(titles.join("\n"));
    }

    #[test]
    fn cpu_mode_drops_off_cpu_time() {
        let text = render(Format::Collapsed, Mode::Cpu);
        assert!(!text.contains("schedule"), "{text}");
        assert!(text.contains("app.py:work:22 6"), "{text}");
    }

    #[test]
    fn a_wall_recording_converts_to_cpu_mode() {
        let (mut p, mut run) = fixture::profile(Mode::Wall);
        recording::select_mode(&mut p, &mut run, Mode::Cpu).unwrap();
        let (q, qrun) = fixture::profile(Mode::Cpu);
        assert_eq!(
            Format::Collapsed.render(&p, &run).unwrap(),
            Format::Collapsed.render(&q, &qrun).unwrap()
        );
        let (mut c, mut crun) = fixture::profile(Mode::Cpu);
        assert!(recording::select_mode(&mut c, &mut crun, Mode::Wall).is_err());
    }

    #[test]
    fn output_names() {
        let one = output_paths(Some(Path::new("x.svg")), &[Format::Flamegraph]);
        assert_eq!(one, vec![(Format::Flamegraph, PathBuf::from("x.svg"))]);
        let many = output_paths(
            Some(Path::new("out/run.json")),
            &[Format::Pprof, Format::Gecko],
        );
        assert_eq!(
            many,
            vec![
                (Format::Gecko, PathBuf::from("out/run.json")),
                (Format::Pprof, PathBuf::from("out/run.pb.gz"))
            ]
        );
        assert_eq!(
            output_paths(None, &[]),
            vec![(Format::Gecko, PathBuf::from("profile.json"))]
        );
    }

    /// Recordings of earlier releases stay readable: frozen files of each version, converted
    /// to every format, give what the same run gives today.
    #[test]
    fn recordings_of_every_version_still_convert() {
        let (p, run) = fixture::profile(Mode::Wall);
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src/output/testdata");
        // TACHYON_FREEZE_RECORDING=1 writes the frozen file of a new version.
        if std::env::var_os("TACHYON_FREEZE_RECORDING").is_some() {
            let b = recording::to_bytes(&p, &run).unwrap();
            std::fs::write(format!("{dir}/v4-wall.tbpf"), b).unwrap();
        }
        for v in [1, 2, 3, 4] {
            // Before version 4, recordings held no identities, host, labels or build ids.
            let (mut p, mut run) = fixture::profile(Mode::Wall);
            if v < 4 {
                for q in p.processes.values_mut() {
                    q.identity = None;
                }
                run.host.clear();
                run.labels.clear();
                for l in &mut p.libs {
                    l.build_id = None;
                }
            }
            let path = PathBuf::from(format!("{dir}/v{v}-wall.tbpf"));
            let (q, qrun) = recording::load(&path)
                .unwrap_or_else(|e| panic!("version {v}: {}: {e}", path.display()));
            for f in Format::ALL {
                let (want, got) = (f.render(&p, &run).unwrap(), f.render(&q, &qrun).unwrap());
                if f == Format::Gecko {
                    // Version 1 predates the BPF counters in the metadata.
                    let strip = |b: &[u8]| {
                        let mut v: serde_json::Value = serde_json::from_slice(b).unwrap();
                        v["meta"]["tachyon"]
                            .as_object_mut()
                            .unwrap()
                            .remove("bpfCounters");
                        v
                    };
                    assert_eq!(strip(&want), strip(&got), "version {v}, {f:?}");
                } else {
                    assert!(want == got, "version {v}, {f:?} differs");
                }
            }
        }
        // The current version is what is written: a change to the schema must add a version
        // (and a frozen file here), not rewrite this one.
        let v2 = std::fs::read(format!("{dir}/v4-wall.tbpf")).unwrap();
        let mut a = String::new();
        let mut b = String::new();
        std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(&v2[..]), &mut a).unwrap();
        let now = recording::to_bytes(&p, &run).unwrap();
        std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(&now[..]), &mut b).unwrap();
        assert_eq!(a, b, "the version-4 schema changed: add version 5 instead");
    }

    #[test]
    fn bpf_time_is_told_by_program() {
        let line = bpf_programs_line(&[
            ("tachyon_switch".into(), 129.6, 177_959),
            ("tachyon_sample".into(), 87.9, 19_993),
        ]);
        assert_eq!(
            line,
            "tachyon_switch 129.6 ms (177959 runs, 0.73 µs each), \
             tachyon_sample 87.9 ms (19993 runs, 4.40 µs each)"
        );
    }

    #[test]
    fn recordings_of_unknown_versions_are_refused() {
        let text = br#"{"format":"tachyon-bpf recording","version":9}"#;
        let e = recording::from_json(text).err().unwrap();
        assert!(
            e.message.contains("version 9 recording") && e.kind == ErrorKind::Input,
            "{e}"
        );
        // Version 2 refuses fields it does not know rather than dropping them.
        let (p, run) = fixture::profile(Mode::Wall);
        let mut v: serde_json::Value = {
            let b = recording::to_bytes(&p, &run).unwrap();
            serde_json::from_reader(flate2::read::GzDecoder::new(&b[..])).unwrap()
        };
        v["surprise"] = serde_json::json!(1);
        let e = recording::from_json(v.to_string().as_bytes())
            .err()
            .unwrap();
        assert!(
            e.message.contains("damaged") && e.kind == ErrorKind::Input,
            "{e}"
        );
        // Columns of one table must agree.
        v.as_object_mut().unwrap().remove("surprise");
        v["frames"]["line"].as_array_mut().unwrap().pop();
        let e = recording::from_json(v.to_string().as_bytes())
            .err()
            .unwrap();
        assert!(
            e.message.contains("frame table") && e.kind == ErrorKind::Input,
            "{e}"
        );
    }

    #[test]
    fn damaged_recordings_are_refused() {
        let dir = std::env::temp_dir().join(format!("tbpf-bad-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let plain = dir.join("plain.tbpf");
        std::fs::write(&plain, b"{\"format\":1}").unwrap();
        let e = recording::load(&plain).err().unwrap();
        assert!(
            e.message.contains("not a tachyon-bpf recording") && e.kind == ErrorKind::Input,
            "{e}"
        );
        // A stack whose prefix points forward (a cycle) is refused before any writer walks it.
        let (mut p, run) = fixture::profile(Mode::Wall);
        p.stacks[0].1 = Some(p.stacks.len() - 1);
        let cyc = dir.join("cycle.tbpf");
        std::fs::write(&cyc, recording::to_bytes(&p, &run).unwrap()).unwrap();
        let e = recording::load(&cyc).err().unwrap();
        assert!(
            e.message.contains("damaged") && e.kind == ErrorKind::Input,
            "{e}"
        );
        let cut = dir.join("cut.tbpf");
        let (p, run) = fixture::profile(Mode::Wall);
        let b = recording::to_bytes(&p, &run).unwrap();
        std::fs::write(&cut, &b[..b.len() / 2]).unwrap();
        let e = recording::load(&cut).err().unwrap();
        assert!(
            e.message.contains("damaged") && e.kind == ErrorKind::Input,
            "{e}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
