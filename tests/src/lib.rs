//! Helpers for the end-to-end tests: run the real `tachyon-bpf` binary as root against real
//! processes, and read the profiles back with the real Firefox Profiler CLI.
//!
//! Preconditions (root, the built binary, the profiler CLI) are checked loudly: a test that
//! cannot run fails with the reason; it never passes by skipping.

pub mod folded;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::Value;

pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Panics unless running as root: these tests load BPF programs for real.
pub fn require_root() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "end-to-end tests load BPF programs and must run as root"
    );
}

/// The `tachyon-bpf` binary under test (`cargo xtask test` builds it and sets TACHYON_BPF_BIN).
pub fn profiler_bin() -> PathBuf {
    let p = std::env::var_os("TACHYON_BPF_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target/release/tachyon-bpf"));
    assert!(
        p.exists(),
        "{} is missing: run the tests with `cargo xtask test`",
        p.display()
    );
    p
}

/// A scratch directory for one test.
pub fn scratch(name: &str) -> PathBuf {
    let d = workspace().join("target/e2e").join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Compiles a C program with gcc.
pub fn compile_c(dir: &Path, name: &str, source: &str, flags: &[&str]) -> PathBuf {
    let src = dir.join(format!("{name}.c"));
    std::fs::write(&src, source).unwrap();
    let out = dir.join(name);
    let st = Command::new("gcc")
        .args(flags)
        .arg("-o")
        .arg(&out)
        .arg(&src)
        .status()
        .expect("gcc");
    assert!(st.success(), "gcc failed for {name}");
    out
}

/// Runs the profiler to completion with a timeout; returns its output.
pub fn run_profiler(args: &[&str], timeout: Duration) -> Output {
    let mut child = Command::new(profiler_bin())
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn tachyon-bpf");
    wait_timeout(&mut child, timeout);
    child.wait_with_output().unwrap()
}

/// Profiles `command` into `out` with the `extra` options, and fails the test (with the
/// profiler's stderr) unless the profiler succeeds. The command's stdout is in the output.
pub fn profile_command(out: &Path, extra: &[&str], command: &[&str]) -> Output {
    let mut args = vec!["-o", out.to_str().expect("UTF-8 path")];
    args.extend_from_slice(extra);
    args.push("--");
    args.extend_from_slice(command);
    let o = run_profiler(&args, Duration::from_secs(90));
    assert!(
        o.status.success(),
        "tachyon-bpf {args:?} failed: {}",
        stderr_of(&o)
    );
    o
}

/// Waits for `child`, killing it (and failing) after `timeout`.
pub fn wait_timeout(child: &mut Child, timeout: Duration) {
    let t0 = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            return;
        }
        if t0.elapsed() > timeout {
            let _ = child.kill();
            panic!("process {} did not finish within {timeout:?}", child.id());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn stderr_of(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The `.tools` directory `cargo xtask` sets up.
pub fn tools_dir() -> PathBuf {
    std::env::var_os("TACHYON_TOOLS")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join(".tools"))
}

/// `go tool pprof ARGS`: its output (it must succeed).
pub fn go_pprof(args: &[&str]) -> String {
    let o = Command::new("go")
        .args(["tool", "pprof"])
        .args(args)
        .env("HOME", std::env::temp_dir())
        .output()
        .expect("`go` (Debian's golang-go; `cargo xtask setup` installs it)");
    assert!(
        o.status.success(),
        "go tool pprof {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// `go tool pprof -top` of a file: its text.
pub fn pprof_top(path: &Path) -> String {
    go_pprof(&["-top", "-sample_index=samples", path.to_str().unwrap()])
}

/// This host's name, as the profiler reads it.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap()
        .trim()
        .to_string()
}

/// The first line a child prints on its piped standard output, trimmed.
pub fn first_line(child: &mut Child) -> String {
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    line.trim().to_string()
}

/// The release artifacts of `cargo xtask dist` (`TACHYON_DIST`, which `cargo xtask test` sets
/// after making them).
pub fn dist_dir() -> PathBuf {
    std::env::var_os("TACHYON_DIST")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target/dist"))
}

/// The one artifact in `dist_dir()` whose name starts with `prefix` and ends with `suffix`.
pub fn dist_file(prefix: &str, suffix: &str) -> PathBuf {
    let dir = dist_dir();
    let found: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| {
            panic!(
                "{}: {e}: run the tests with `cargo xtask test`, which makes the artifacts",
                dir.display()
            )
        })
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let n = p.file_name().unwrap().to_string_lossy();
            n.starts_with(prefix) && n.ends_with(suffix)
        })
        .collect();
    match found.as_slice() {
        [one] => one.clone(),
        _ => panic!(
            "want one {prefix}*{suffix} in {}, found {found:?}",
            dir.display()
        ),
    }
}

/// Debian's name of an architecture (x86_64, aarch64).
pub fn deb_arch(arch: &str) -> &'static str {
    if arch == "aarch64" {
        "arm64"
    } else {
        "amd64"
    }
}

/// The Debian package of `cargo xtask dist` for `arch`.
pub fn dist_deb(arch: &str) -> PathBuf {
    dist_file("tachyon-bpf_", &format!("_{}.deb", deb_arch(arch)))
}

/// The wheel of `cargo xtask dist` for `arch`.
pub fn dist_wheel(arch: &str) -> PathBuf {
    dist_file("tachyon_bpf-", &format!("manylinux_2_17_{arch}.whl"))
}

/// Debian's build of `python3.MINOR` that `cargo xtask` unpacks (3.14 and 3.15).
pub fn debian_python(minor: u32) -> PathBuf {
    let p = tools_dir().join(format!("debian-python/usr/bin/python3.{minor}"));
    assert!(
        p.exists(),
        "{} is missing: run the tests with `cargo xtask test`",
        p.display()
    );
    p
}

/// Every CPython the tests run: (label, interpreter path), pyenv 3.8-3.13, Debian's 3.11 and
/// Debian's (unstable) 3.14 and 3.15. A missing one fails the test (the machine is not set up
/// as CI's).
pub fn interpreters() -> Vec<(String, PathBuf)> {
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    let mut out = Vec::new();
    for v in ["3.8.18", "3.9.18", "3.10.13", "3.11.7", "3.12.1", "3.13.0"] {
        let p = PathBuf::from(format!("{home}/.pyenv/versions/{v}/bin/python3"));
        assert!(p.exists(), "interpreter {} is missing", p.display());
        out.push((v.to_string(), p));
    }
    let debian = PathBuf::from("/usr/bin/python3.11");
    assert!(debian.exists(), "Debian's python3.11 is missing");
    out.push(("debian-3.11".into(), debian));
    out.push(("debian-3.14".into(), debian_python(14)));
    out.push(("debian-3.15".into(), debian_python(15)));
    out
}

/// The interpreter with this label (see `interpreters`).
pub fn python(label: &str) -> PathBuf {
    interpreters()
        .into_iter()
        .find(|(l, _)| l == label)
        .map(|(_, p)| p)
        .unwrap_or_else(|| panic!("no interpreter {label}"))
}

static SESSION: AtomicU32 = AtomicU32::new(0);

/// What `profiler-cli load` prints when its daemon has not answered within its startup window.
const STILL_STARTING: &str = "daemon did not become ready";

/// A loaded profile in the Firefox Profiler CLI (`@firefox-devtools/profiler-cli`), which runs
/// the profiler web app's own import and processing pipeline.
pub struct Viewer {
    session: String,
    home: PathBuf,
    tools: PathBuf,
}

impl Viewer {
    fn cli(&self) -> Command {
        let node_bin = self.tools.join("node_modules/node/bin");
        let path = format!(
            "{}:{}",
            node_bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut c = Command::new(self.tools.join("node_modules/.bin/profiler-cli"));
        c.env("PATH", path).env("HOME", &self.home);
        c
    }

    pub fn load(profile: &Path) -> Result<Viewer> {
        let tools = tools_dir();
        if !tools.join("node_modules/.bin/profiler-cli").exists() {
            bail!(
                "the Firefox Profiler CLI is missing under {}: run the tests with `cargo xtask test`",
                tools.display()
            );
        }
        let n = SESSION.fetch_add(1, Ordering::SeqCst);
        let session = format!("t{}-{n}", std::process::id());
        let home = workspace().join("target/e2e/.viewer-home");
        std::fs::create_dir_all(&home)?;
        let v = Viewer {
            session,
            home,
            tools,
        };
        let out = v
            .cli()
            .arg("load")
            .arg(profile)
            .args([
                "--session",
                &v.session,
                "--symbol-server",
                "http://127.0.0.1:9/",
            ])
            .output()
            .context("running profiler-cli")?;
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr);
            // `load` gives its daemon a fixed half second to start, which node can exceed on a
            // loaded machine; the daemon keeps starting and loading the profile, so wait for it.
            if stderr.contains(STILL_STARTING) {
                v.wait_until_loaded().with_context(|| {
                    format!(
                        "the Firefox Profiler could not load {} (its daemon was slow to start: \
                         {stderr})",
                        profile.display()
                    )
                })?;
                return Ok(v);
            }
            bail!(
                "the Firefox Profiler could not load {}: {}{stderr}",
                profile.display(),
                String::from_utf8_lossy(&out.stdout),
            );
        }
        Ok(v)
    }

    /// Waits (two minutes at most) until the session's daemon answers `status`, that is, until
    /// it has loaded the profile; a failed load is an error at once.
    fn wait_until_loaded(&self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let out = self
                .cli()
                .args(["status", "--session", &self.session])
                .output()?;
            if out.status.success() {
                return Ok(());
            }
            let stderr = String::from_utf8_lossy(&out.stderr);
            if stderr.contains("Profile load failed") || Instant::now() > deadline {
                bail!("profiler-cli status: {stderr}");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Runs a query with `--json` and parses its output.
    pub fn json(&self, args: &[&str]) -> Result<Value> {
        // Node truncates large output written to a pipe when the CLI exits; a file gets all.
        let n = SESSION.fetch_add(1, Ordering::SeqCst);
        let path = self.home.join(format!("out-{}-{n}.json", self.session));
        let file = std::fs::File::create(&path)?;
        let out = self
            .cli()
            .args(args)
            .args(["--json", "--session", &self.session])
            .stdout(file)
            .output()?;
        let text = std::fs::read(&path).unwrap_or_default();
        let _ = std::fs::remove_file(&path);
        if !out.status.success() {
            bail!(
                "profiler-cli {args:?} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        // Call trees nest two JSON levels per frame: deeper than serde_json's default limit.
        let mut de = serde_json::Deserializer::from_slice(&text);
        de.disable_recursion_limit();
        serde::Deserialize::deserialize(&mut de)
            .with_context(|| format!("profiler-cli {args:?} printed no JSON"))
    }

    /// Processes as the profiler lists them: (pid, name, [(thread handle, thread name, tid)]).
    pub fn processes(&self) -> Result<Vec<ProcessInfo>> {
        let info = self.json(&["profile", "info", "--all"])?;
        let mut out = Vec::new();
        for p in info["processes"].as_array().context("processes")? {
            out.push(ProcessInfo {
                pid: p["pid"].as_str().unwrap_or_default().to_string(),
                name: p["name"].as_str().unwrap_or_default().to_string(),
                start_ms: p["startTime"].as_f64().unwrap_or(0.0),
                end_ms: p["endTime"].as_f64(),
                threads: p["threads"]
                    .as_array()
                    .map(|ts| {
                        ts.iter()
                            .map(|t| ThreadInfo {
                                handle: t["threadHandle"].as_str().unwrap_or_default().into(),
                                name: t["name"].as_str().unwrap_or_default().into(),
                                tid: t["tid"].as_u64().unwrap_or(0),
                                cpu_ms: t["cpuMs"].as_f64().unwrap_or(0.0),
                            })
                            .collect()
                    })
                    .unwrap_or_default(),
            });
        }
        Ok(out)
    }

    /// The top-down call tree of a thread, flattened to (root-first path, self samples).
    pub fn call_paths(&self, thread: &str) -> Result<CallPaths> {
        self.call_paths_with(thread, &[])
    }

    /// A thread's `thread samples` summary (every function, idle samples included).
    fn top_functions(&self, thread: &str) -> Result<Value> {
        self.json(&[
            "thread",
            "samples",
            "--thread",
            thread,
            "--include-idle",
            "--limit",
            "100000",
        ])
    }

    /// Each function's total (samples, or milliseconds in a weighted profile) in a thread, by
    /// its name as the viewer shows it (`file.py!function` for Python functions).
    pub fn function_totals(&self, thread: &str) -> Result<HashMap<String, f64>> {
        let v = self.top_functions(thread)?;
        Ok(v["topFunctionsByTotal"]
            .as_array()
            .context("topFunctionsByTotal")?
            .iter()
            .filter_map(|f| Some((f["name"].as_str()?.to_string(), f["totalSamples"].as_f64()?)))
            .collect())
    }

    /// The handle (`f-N`) of a function of a thread, by name.
    pub fn function_handle(&self, thread: &str, name: &str) -> Result<String> {
        let v = self.top_functions(thread)?;
        v["topFunctionsByTotal"]
            .as_array()
            .and_then(|fs| {
                fs.iter().find(|f| {
                    let n = f["name"].as_str().unwrap_or_default();
                    n == name || n.rsplit_once('!').map(|(_, s)| s == name).unwrap_or(false)
                })
            })
            .and_then(|f| f["functionHandle"].as_str())
            .map(str::to_string)
            .with_context(|| format!("no function {name} in {thread}"))
    }

    /// Like `call_paths`, with extra transforms (e.g. `--merge f-N`). The profiler cuts call
    /// trees at depth 200.
    pub fn call_paths_with(&self, thread: &str, extra: &[&str]) -> Result<CallPaths> {
        let mut args = vec![
            "thread",
            "samples-top-down",
            "--thread",
            thread,
            "--include-idle",
            "--max-lines",
            "1000000",
        ];
        args.extend_from_slice(extra);
        let v = self.json(&args)?;
        let root = &v["regularCallTree"];
        // Samples are weighted in milliseconds (an on-CPU sample weighs one sampling period).
        let total = root["totalSamples"].as_f64().unwrap_or(0.0).round() as u64;
        let mut paths = Vec::new();
        let mut stack = Vec::new();
        flatten(root, &mut stack, &mut paths);
        Ok(CallPaths { total, paths })
    }

    /// Samples per category name for a thread.
    pub fn categories(&self, thread: &str) -> Result<Vec<(String, u64)>> {
        let v = self.json(&["thread", "samples", "--thread", thread, "--include-idle"])?;
        Ok(v["categoryBreakdown"]["categories"]
            .as_array()
            .map(|cs| {
                cs.iter()
                    .map(|c| {
                        (
                            c["name"].as_str().unwrap_or_default().to_string(),
                            c["samples"].as_f64().unwrap_or(0.0).round() as u64,
                        )
                    })
                    .collect()
            })
            .unwrap_or_default())
    }

    pub fn markers(&self, thread: &str) -> Result<Value> {
        self.json(&["thread", "markers", "--thread", thread])
    }

    /// Per marker name: (count, summed duration in ms) of a thread's interval markers.
    pub fn marker_totals(&self, thread: &str) -> Result<HashMap<String, (u64, f64)>> {
        let m = self.markers(thread)?;
        let mut out = HashMap::new();
        for t in m["byType"].as_array().into_iter().flatten() {
            let n = t["count"].as_u64().unwrap_or(0);
            let avg = t["durationStats"]["avg"].as_f64().unwrap_or(0.0);
            out.insert(
                t["markerName"].as_str().unwrap_or_default().to_string(),
                (n, avg * n as f64),
            );
        }
        Ok(out)
    }
}

impl Drop for Viewer {
    fn drop(&mut self) {
        let _ = self
            .cli()
            .args(["stop", &self.session])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// The process whose name contains `part` (a script's name); panics listing the names otherwise.
pub fn process_named<'a>(procs: &'a [ProcessInfo], part: &str) -> &'a ProcessInfo {
    procs
        .iter()
        .find(|p| p.name.contains(part))
        .unwrap_or_else(|| {
            let names: Vec<_> = procs.iter().map(|p| &p.name).collect();
            panic!("no process named after {part}: {names:?}")
        })
}

pub struct ProcessInfo {
    pub pid: String,
    pub name: String,
    pub threads: Vec<ThreadInfo>,
    /// Start and end in ms from the profile start, as the profiler shows them.
    pub start_ms: f64,
    pub end_ms: Option<f64>,
}

pub struct ThreadInfo {
    pub handle: String,
    pub name: String,
    pub tid: u64,
    /// CPU time the profiler shows for the thread (from the samples' CPU deltas).
    pub cpu_ms: f64,
}

/// One call-tree node: its root-first path of `nameWithLibrary` and plain names, and its self
/// samples.
pub struct CallPath {
    pub names: Vec<String>,
    pub self_samples: u64,
}

pub struct CallPaths {
    pub total: u64,
    pub paths: Vec<CallPath>,
}

fn flatten(node: &Value, stack: &mut Vec<String>, out: &mut Vec<CallPath>) {
    let is_root = node.get("callNodeIndex").is_none();
    if !is_root {
        stack.push(node["name"].as_str().unwrap_or_default().to_string());
        let own = node["selfSamples"].as_f64().unwrap_or(0.0).round() as u64;
        if own > 0 {
            out.push(CallPath {
                names: stack.clone(),
                self_samples: own,
            });
        }
    }
    if let Some(children) = node["children"].as_array() {
        for c in children {
            flatten(c, stack, out);
        }
    }
    if !is_root {
        stack.pop();
    }
}

impl CallPaths {
    /// Samples whose stack contains `seq` as consecutive frames, root-first.
    pub fn with_sequence(&self, seq: &[&str]) -> u64 {
        self.paths
            .iter()
            .filter(|p| {
                p.names
                    .windows(seq.len())
                    .any(|w| w.iter().zip(seq).all(|(a, b)| a == b))
            })
            .map(|p| p.self_samples)
            .sum()
    }

    /// Samples whose stack satisfies `f`.
    pub fn count(&self, f: impl Fn(&[String]) -> bool) -> u64 {
        self.paths
            .iter()
            .filter(|p| f(&p.names))
            .map(|p| p.self_samples)
            .sum()
    }

    /// The `n` heaviest stacks that satisfy `f`, one a line with its samples, leaf first and
    /// cut to 12 frames: for a failure's message.
    pub fn commonest(&self, f: impl Fn(&[String]) -> bool, n: usize) -> String {
        let mut found: Vec<&CallPath> = self.paths.iter().filter(|p| f(&p.names)).collect();
        found.sort_by_key(|p| std::cmp::Reverse(p.self_samples));
        found
            .iter()
            .take(n)
            .map(|p| {
                let tail: Vec<&str> = p.names.iter().rev().take(12).map(|s| s.as_str()).collect();
                format!("  {}: {}", p.self_samples, tail.join(" <- "))
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// How many BPF programs the kernel holds now (all users), by walking program ids.
pub fn bpf_program_count() -> usize {
    const BPF_PROG_GET_NEXT_ID: libc::c_long = 11;
    #[repr(C)]
    struct NextId {
        start_id: u32,
        next_id: u32,
        open_flags: u32,
    }
    let mut n = 0;
    let mut id = 0u32;
    loop {
        let mut attr = NextId {
            start_id: id,
            next_id: 0,
            open_flags: 0,
        };
        // SAFETY: the bpf syscall reads and writes the attribute struct of the size given.
        let r = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_PROG_GET_NEXT_ID,
                &mut attr as *mut NextId,
                std::mem::size_of::<NextId>(),
            )
        };
        if r != 0 {
            return n;
        }
        n += 1;
        id = attr.next_id;
    }
}

/// Waits up to `timeout` for the kernel's program count to drop back to `baseline` (programs are
/// freed once their last reference, a file descriptor or a link, goes).
pub fn bpf_programs_back_to(baseline: usize, timeout: Duration) -> usize {
    let t0 = Instant::now();
    loop {
        let n = bpf_program_count();
        if n <= baseline || t0.elapsed() > timeout {
            return n;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A child process killed (and reaped) when the test ends, however it ends.
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The capabilities docs/permissions.md documents.
pub const CAPS: [&str; 5] = [
    "cap_bpf",
    "cap_perfmon",
    "cap_sys_ptrace",
    "cap_dac_read_search",
    "cap_syslog",
];

/// Runs `tachyon-bpf args` as user nobody with exactly `caps` (ambient, so they survive exec).
pub fn as_nobody_with(caps: &[&str], args: &[String]) -> Output {
    let list = caps.join(",");
    let cmd = std::iter::once(profiler_bin().display().to_string())
        .chain(args.iter().cloned())
        .collect::<Vec<_>>()
        .join(" ");
    let mut child = Command::new("capsh")
        .arg(format!(
            "--caps={list}+eip cap_setpcap,cap_setuid,cap_setgid+ep"
        ))
        .args(["--keep=1", "--user=nobody"])
        .arg(format!("--addamb={list}"))
        .args(["--", "-c", &cmd])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("capsh (libcap2-bin)");
    wait_timeout(&mut child, Duration::from_secs(60));
    child.wait_with_output().unwrap()
}

/// Starts `tachyon-bpf convert REC --open -o OUT` and returns it with the first line it printed
/// (the from-url link).
pub fn serve_recording(rec: &Path, out: &Path) -> (Child, String) {
    let mut child = Command::new(profiler_bin())
        .args(["convert", rec.to_str().unwrap(), "--open", "-o"])
        .arg(out)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let line = first_line(&mut child);
    (child, line)
}

/// An OTLP/HTTP receiver of the profiles signal, in Python with the official generated code
/// (PyPI's `opentelemetry-proto`): each request decoded, summed up as one JSON line in the
/// file given, answered with an empty `ExportProfilesServiceResponse`. Prints its port.
pub const OTLP_RECEIVER: &str = r#"
import http.server, json, sys
from opentelemetry.proto.collector.profiles.v1development import profiles_service_pb2 as svc

out = open(sys.argv[1], "a")

def value(v):
    k = v.WhichOneof("value")
    return getattr(v, k) if k else None

class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        req = svc.ExportProfilesServiceRequest()
        req.ParseFromString(body)
        d = req.dictionary
        s = d.string_table
        procs = []
        for rp in req.resource_profiles:
            attrs = {a.key: value(a.value) for a in rp.resource.attributes}
            total, n, frames, threads, build_ids = 0, 0, set(), set(), {}
            for sp in rp.scope_profiles:
                for p in sp.profiles:
                    kind = s[p.sample_type.type_strindex] + "/" + s[p.sample_type.unit_strindex]
                    for smp in p.samples:
                        n += 1
                        total += sum(smp.values)
                        for i in smp.attribute_indices:
                            kv = d.attribute_table[i]
                            if s[kv.key_strindex] == "thread.name":
                                threads.add(value(kv.value))
                        for li in d.stack_table[smp.stack_index].location_indices:
                            loc = d.location_table[li]
                            m = d.mapping_table[loc.mapping_index]
                            for i in m.attribute_indices:
                                kv = d.attribute_table[i]
                                if s[kv.key_strindex] == "process.executable.build_id.gnu":
                                    build_ids[s[m.filename_strindex]] = value(kv.value)
                            for line in loc.lines:
                                f = d.function_table[line.function_index]
                                frames.add((s[f.name_strindex], s[f.filename_strindex], line.line,
                                            s[d.mapping_table[loc.mapping_index].filename_strindex]))
            procs.append({"attrs": attrs, "kind": kind, "samples": n, "total": total,
                          "frames": sorted(frames), "threads": sorted(threads),
                          "build_ids": build_ids})
        out.write(json.dumps({"path": self.path, "type": self.headers["Content-Type"],
                              "processes": procs}) + "\n")
        out.flush()
        reply = svc.ExportProfilesServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *a):
        pass

srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
print(srv.server_address[1], flush=True)
srv.serve_forever()
"#;

/// The minor version of an interpreter's label (`3.12.1`, `debian-3.11`).
pub fn minor_of(label: &str) -> u32 {
    label
        .trim_start_matches("debian-")
        .split('.')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap()
}

/// The main thread of the process running `script`.
pub fn main_thread<'a>(procs: &'a [ProcessInfo], script: &str) -> &'a ThreadInfo {
    let p = process_named(procs, script);
    p.threads
        .iter()
        .find(|t| t.tid.to_string() == p.pid)
        .expect("main thread")
}
