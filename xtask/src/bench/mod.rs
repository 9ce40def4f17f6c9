//! `cargo xtask bench`: tachyon-bpf against the profilers users run today (py-spy from PyPI,
//! Linux perf from Debian), on this machine, in one run. It prints one report and writes it to
//! `bench/results.md` (and the raw numbers to `target/bench/results.json`):
//!
//! 1. **Target slowdown**: the wall time of a fixed CPU-bound workload (pure-Python loops and a
//!    C-heavy part: json, zlib, hashlib, sorting) alone and under each profiler at 1 kHz, as a
//!    ratio to the unprofiled run. Configurations are interleaved round by round and the median
//!    of the rounds is taken, so drift of the machine hits every configuration alike.
//! 2. **Profiler cost**: the profiler's CPU time per 1,000 samples, user space plus the BPF
//!    programs' own run time (the kernel's BPF statistics), at 1 and 10 kHz per CPU with 1 and 8
//!    busy Python processes: all included (start-up too) over 12 s, and the marginal cost per
//!    sample from 4 s and 12 s runs; medians of 3.
//! 3. **Headroom**: the highest per-CPU rate sustained for 10 s with both CPUs busy, with under
//!    0.1% of samples lost.
//! 4. **Memory**: peak RSS of `--all-pythons` runs of 30, 60 and 120 s with 8 busy processes.
//! 5. **Accuracy**: the share of samples running Python code whose stack is fully merged, per
//!    interpreter (rooted at `_start`, Python frames spliced in, no eval frame left over).
//! 6. **Thread ping-pong**: two threads passing a token through two `queue.Queue`s (tens of
//!    thousands of context switches a second), throughput alone and under each profiler at 1 kHz,
//!    interleaved rounds; the profiler's own CPU use (with start-up, and steady: while the
//!    ping-pong runs) and peak RSS.
//! 7. **A mixed host**: busy processes beside processes whose threads sleep and wake thousands of
//!    times a second, 20 s at 1 kHz: the profiler's CPU per sample, all included and steady.
//! 8. **Idle processes**: the profiler's CPU with 500 idle processes on the host, against none.
//! 9. **CPython's own sampler** (`python3.15 -m profiling.sampling`, the closest peer) on Debian's
//!    3.15: the workload's slowdown under it (`--pstats`, `--native --gecko`) and under
//!    tachyon-bpf (cpu and wall), the samples each delivers per second, how far their top-10
//!    function shares are apart, and whether the two JSONL files have one schema.
//!    `cargo xtask bench cpython` runs this section alone.
//! 10. **asyncio with many tasks**: a service of 10,000 tasks on Debian's 3.15, its throughput
//!     alone and under tachyon-bpf and CPython's sampler with `--async-aware`, and tachyon-bpf's
//!     CPU per sample. `cargo xtask bench asyncio` runs it alone.
//! 11. **Instructions per sample**: user space's instructions per sample, counted by callgrind
//!     (no load on the machine moves the count), on the CPU loop with sleeping threads and on
//!     section 12's web service. `cargo xtask bench callgrind` runs it alone.
//! 12. **A web service, always on**: gunicorn `gthread` (2 x 8 threads, Flask) under `wrk`,
//!     alone and under tachyon-bpf (wall and cpu, 49 Hz and 1 kHz) and py-spy, interleaved
//!     rounds: throughput, the profiler's steady CPU (user + BPF), `tachyon_sample`'s run time,
//!     off-CPU captures and scheduler records a second, context switches a second and the BPF
//!     time a switch. `cargo xtask bench service` runs it alone.
//! 13. **Staying on for 10 minutes**: the same service, and tachyon-bpf with the systemd unit's
//!     options (continuous, 49 Hz, a pprof profile a minute) in wall and cpu mode: its CPU over
//!     the whole run, all included, minute by minute, and its memory every second. `cargo xtask
//!     bench always-on` runs it alone.
//!
//! The targets from the issues are printed beside each number. Sections 1-5 are in `load.rs`,
//! 6 in `pingpong.rs`, 7 and 8 in `host.rs`, 9 in `cpython.rs`, 10 in `asyncio.rs`, 11 in
//! `callgrind.rs`, 12 in `service.rs` and 13 in `always_on.rs`; the Python workloads are the
//! files under `workloads/`.

mod always_on;
mod asyncio;
mod callgrind;
mod cpython;
mod host;
mod load;
mod pingpong;
mod service;

pub use always_on::always_on;
pub use asyncio::asyncio_tasks;
pub use callgrind::callgrind;
pub use cpython::cpython_sampler;
pub use pingpong::pingpong;
pub use service::service;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

const PY_SPY: &str = "py-spy==0.4.3";
/// Rounds of the slowdown comparison (median reported).
const ROUNDS: usize = 9;
/// Runs of each cost configuration (median reported), and their two lengths in seconds.
const COST_RUNS: usize = 3;
const SHORT: u64 = 4;
const LONG: u64 = 12;

const WORKLOAD: &str = include_str!("workloads/work.py");

/// A Python process that keeps one CPU busy in Python code for `argv[1]` seconds.
const BUSY: &str = include_str!("workloads/busy.py");

/// A process of 4 threads that each sleep 500 µs in a loop for `argv[1]` seconds (thousands of
/// wake-ups a second, little CPU).
const SLEEPY: &str = include_str!("workloads/sleepy.py");

/// py-spy from PyPI under `.tools/pyspy` (idempotent).
pub fn setup_py_spy(tools: &Path) -> Result<PathBuf> {
    let dir = tools.join("pyspy");
    let bin = dir.join("bin/py-spy");
    let ok = Command::new(&bin)
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("0.4.3"))
        .unwrap_or(false);
    if !ok {
        eprintln!("xtask: installing {PY_SPY} into .tools/pyspy");
        crate::run(
            Command::new("python3")
                .args(["-m", "pip", "install", "-q", "--upgrade", "--target"])
                .arg(&dir)
                .arg(PY_SPY),
        )?;
    }
    Ok(bin)
}

/// Installs Debian's `package` if `command --version` does not run (idempotent).
fn install_missing(command: &str, package: &str) -> Result<()> {
    if !crate::quiet_ok(Command::new(command).arg("--version")) {
        eprintln!("xtask: installing {package}");
        crate::run(
            Command::new("apt-get")
                .env("DEBIAN_FRONTEND", "noninteractive")
                .args(["install", "-y", "-q", "--no-install-recommends", package]),
        )?;
    }
    Ok(())
}

/// Runs a command whose stdout ends with the workload's elapsed seconds on a line of its own.
fn timed(cmd: &mut Command) -> Result<f64> {
    let o = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    if !o.status.success() {
        bail!("{cmd:?} failed: {}", String::from_utf8_lossy(&o.stderr));
    }
    let out = String::from_utf8_lossy(&o.stdout);
    out.lines()
        .rev()
        .find_map(|l| l.trim().parse().ok())
        .with_context(|| format!("{cmd:?} printed no time: {out}"))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// A process's user and system CPU so far (ms), from `/proc/PID/stat`.
pub(super) fn cpu_ms(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let rest = stat.rsplit_once(')').context("stat")?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f[11].parse::<f64>()? + f[12].parse::<f64>()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Ok(ticks * 1000.0 / hz)
}

/// tachyon-bpf running in the background until `stop`: the way it runs on a host.
struct Background {
    child: Child,
}

impl Background {
    fn start(bin: &Path, args: &[&str], out: &Path) -> Result<Background> {
        let child = Command::new(bin)
            .args(args)
            .arg("-q")
            .arg("-o")
            .arg(out)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting tachyon-bpf")?;
        // Loaded, attached and discovering well within this.
        std::thread::sleep(Duration::from_millis(1500));
        Ok(Background { child })
    }

    /// Its process CPU so far, and now (`reading`).
    fn reading(&self) -> Result<Reading> {
        reading(self.child.id())
    }

    /// Stops the run (SIGINT, as Ctrl-C) and waits for its end: the CPU it used (ms).
    fn stop(self) -> Result<f64> {
        crate::run(Command::new("kill").args(["-INT", &self.child.id().to_string()]))?;
        finish_measured(self.child)
    }
}

/// Waits for a tachyon-bpf run to end and returns the CPU (user and system, ms) its process
/// used from start to end, as `wait4` reports it: start-up, sampling and the writing of the
/// profile. (`meta.profilerCost.userCpuMs` is read before the profile is written, so it cannot
/// hold the writing.) Fails with its stderr unless it succeeded.
fn finish_measured(child: Child) -> Result<f64> {
    Ok(finish_measured_with_stderr(child)?.0)
}

/// `finish_measured`, with what the profiler printed on stderr (its summary).
fn finish_measured_with_stderr(mut child: Child) -> Result<(f64, String)> {
    use std::io::Read;
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        e.read_to_string(&mut err)?;
    }
    let mut status = 0;
    // SAFETY: plain-old-data out-parameters of `wait4`.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: our own child, not yet waited for; the pointers are to locals.
    let r = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut ru) };
    if r < 0 {
        bail!(
            "waiting for tachyon-bpf: {}",
            std::io::Error::last_os_error()
        );
    }
    if !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) {
        bail!("tachyon-bpf failed (status {status:#x}): {err}");
    }
    let ms = |t: libc::timeval| t.tv_sec as f64 * 1e3 + t.tv_usec as f64 / 1e3;
    Ok((ms(ru.ru_utime) + ms(ru.ru_stime), err))
}

/// `meta` with `profilerCost.processCpuMs`, the run's whole-process CPU (`finish_measured`).
fn with_process_cpu(mut m: Value, cpu_ms: f64) -> Value {
    m["profilerCost"]["processCpuMs"] = json!(cpu_ms);
    m
}

/// The profiler's process CPU (`cpu_ms`) and the time at one end of a steady window.
type Reading = (f64, Instant);

/// A reading of `pid` now, kept as a result: a profiler that failed meanwhile is reported by
/// `finish_measured`, with what it printed, before the reading's error.
fn reading(pid: u32) -> Result<Reading> {
    Ok((cpu_ms(pid)?, Instant::now()))
}

/// `meta` with `profilerCost.steadyCpuMs` and `steadyMs`: the profiler's process CPU between two
/// readings, and the time between them.
fn with_steady(mut m: Value, from: Result<Reading>, to: Result<Reading>) -> Result<Value> {
    let ((c0, t0), (c1, t1)) = (from?, to?);
    m["profilerCost"]["steadyCpuMs"] = json!(c1 - c0);
    m["profilerCost"]["steadyMs"] = json!(t1.duration_since(t0).as_secs_f64() * 1e3);
    Ok(m)
}

fn spawn_busy(py: &Path, script: &Path, n: usize, secs: u64) -> Result<Vec<Child>> {
    (0..n)
        .map(|_| {
            Command::new(py)
                .arg(script)
                .arg(secs.to_string())
                .stdout(Stdio::null())
                .spawn()
                .context("starting a busy Python process")
        })
        .collect()
}

fn reap(kids: Vec<Child>) {
    for mut k in kids {
        let _ = k.kill();
        let _ = k.wait();
    }
}

/// `meta.tachyon` of a Gecko profile.
fn meta(profile: &Path) -> Result<Value> {
    let p: Value = serde_json::from_slice(&std::fs::read(profile)?)?;
    Ok(p["meta"]["tachyon"].clone())
}

/// One `--all-pythons` run of `secs` with `procs` busy processes: its `meta.tachyon`.
fn all_pythons_run(
    bin: &Path,
    py: &Path,
    busy: &Path,
    out: &Path,
    procs: usize,
    rate: u64,
    secs: u64,
) -> Result<Value> {
    let kids = spawn_busy(py, busy, procs, secs + 5)?;
    std::thread::sleep(Duration::from_millis(300));
    let child = Command::new(bin)
        .args(["--all-pythons", "-q", "-r", &rate.to_string(), "-d"])
        .arg(secs.to_string())
        .arg("-o")
        .arg(out)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("running tachyon-bpf")?;
    let cpu = finish_measured(child);
    reap(kids);
    Ok(with_process_cpu(meta(out)?, cpu?))
}

/// (samples of the workload's main thread running Python code, fully merged ones: rooted at
/// `_start`, with Python frames, and no interpreter eval frame left unreplaced).
fn merged(profile: &Path, process: &str) -> Result<(u64, u64)> {
    let p: Value = serde_json::from_slice(&std::fs::read(profile)?)?;
    let strings = p["shared"]["stringArray"].as_array().context("strings")?;
    let s = |i: &Value| {
        strings[i.as_u64().unwrap_or(0) as usize]
            .as_str()
            .unwrap_or("")
    };
    let t = p["threads"]
        .as_array()
        .context("threads")?
        .iter()
        .filter(|t| t["processName"].as_str().unwrap_or("").contains(process))
        .max_by_key(|t| t["samples"]["length"].as_u64().unwrap_or(0))
        .context("no workload thread in the profile")?;
    let (st, fr, func) = (&t["stackTable"], &t["frameTable"], &t["funcTable"]);
    let (mut all, mut good) = (0, 0);
    for stack in t["samples"]["stack"].as_array().context("samples")? {
        let mut names = Vec::new();
        let mut py = false;
        let mut cur = stack.as_u64();
        while let Some(i) = cur {
            let f = fr["func"][st["frame"][i as usize].as_u64().unwrap_or(0) as usize]
                .as_u64()
                .unwrap_or(0) as usize;
            py |= func["isJS"][f].as_bool().unwrap_or(false);
            names.push(s(&func["name"][f]));
            cur = st["prefix"][i as usize].as_u64();
        }
        let leftover = names
            .iter()
            .any(|n| n.starts_with("_PyEval_EvalFrameDefault"));
        // Samples where no Python code runs (the loader, interpreter start-up and shutdown)
        // have nothing to merge; they are not counted.
        if !py && !leftover {
            continue;
        }
        all += 1;
        if names.last() == Some(&"_start") && py && !leftover {
            good += 1;
        }
    }
    Ok((all, good))
}

/// Every interpreter of the accuracy table: (label, path).
/// The interpreter of the workloads: pyenv's 3.12.1.
pub fn workload_python(tools: &Path) -> Result<PathBuf> {
    interpreters(tools)?
        .into_iter()
        .find(|(l, _)| l == "3.12.1")
        .map(|(_, p)| p)
        .context("3.12.1")
}

pub fn interpreters(tools: &Path) -> Result<Vec<(String, PathBuf)>> {
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    let mut out = Vec::new();
    for v in ["3.8.18", "3.9.18", "3.10.13", "3.11.7", "3.12.1", "3.13.0"] {
        out.push((
            v.to_string(),
            PathBuf::from(format!("{home}/.pyenv/versions/{v}/bin/python3")),
        ));
    }
    out.push(("debian-3.11".into(), PathBuf::from("/usr/bin/python3.11")));
    for minor in [14, 15] {
        out.push((
            format!("debian-3.{minor}"),
            tools.join(format!("debian-python/usr/bin/python3.{minor}")),
        ));
    }
    for (l, p) in &out {
        if !p.exists() {
            bail!("interpreter {l} is missing at {}", p.display());
        }
    }
    Ok(out)
}

/// A configuration of a comparison: its label, and one run giving its measure.
type Config<'a> = (&'a str, Box<dyn Fn() -> Result<f64> + 'a>);

/// Runs every configuration once a round, `rounds` rounds interleaved, so that the machine's
/// drift falls on all of them alike; each configuration's results, in round order.
fn interleaved<C, R>(
    what: &str,
    configs: &[C],
    rounds: usize,
    mut run: impl FnMut(&C) -> Result<R>,
) -> Result<Vec<Vec<R>>> {
    eprintln!(
        "bench: {what}, {rounds} rounds of {} configurations",
        configs.len()
    );
    let mut out: Vec<Vec<R>> = configs.iter().map(|_| Vec::new()).collect();
    for round in 0..rounds {
        for (i, c) in configs.iter().enumerate() {
            out[i].push(run(c)?);
        }
        eprintln!("bench: {what}: round {} of {rounds} done", round + 1);
    }
    Ok(out)
}

/// The table of run times: each configuration's median, its slowdown against the first's,
/// and its runs; the same as raw numbers.
fn time_table(md: &mut Vec<String>, names: &[&str], times: &[Vec<f64>]) -> Vec<Value> {
    let meds: Vec<f64> = times.iter().map(|t| median(t.clone())).collect();
    md.push("| profiler | median s | slowdown | runs (s) |\n|---|---|---|---|".into());
    let mut raw = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let runs: Vec<String> = times[i].iter().map(|t| format!("{t:.3}")).collect();
        md.push(format!(
            "| {name} | {:.3} | {:.3}x | {} |",
            meds[i],
            meds[i] / meds[0],
            runs.join(" ")
        ));
        raw.push(json!({"profiler": name, "median_s": meds[i], "slowdown": meds[i] / meds[0], "runs": times[i]}));
    }
    raw
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or(f64::NAN)
}

/// A peer's output as text, whatever bytes it wrote: a name may be cut mid-character (the
/// CPython sampler's task names in `--async-aware all` once stopped a run).
fn read_lossy(path: &Path) -> Result<String> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// Processes and threads created since boot (`processes` in /proc/stat).
fn forks_so_far() -> Result<u64> {
    std::fs::read_to_string("/proc/stat")?
        .lines()
        .find_map(|l| l.strip_prefix("processes ")?.trim().parse().ok())
        .context("no `processes` line in /proc/stat")
}

/// Profiled runs of each whose function shares are compared (their medians).
const SHARE_ROUNDS: usize = 5;

/// What the sections of one run share: the profiler, where results go, the workload's
/// interpreter and scripts, and the machine.
pub(super) struct Bench {
    pub tachyon: PathBuf,
    pub dir: PathBuf,
    pub py: PathBuf,
    pub py_spy: PathBuf,
    /// The workload (`workloads/work.py`) and a busy process (`workloads/busy.py`).
    pub script: PathBuf,
    pub busy: PathBuf,
    pub cpus: usize,
    /// The CPU the workload is pinned to (the last).
    pub pin: String,
    pub pythons: Vec<(String, PathBuf)>,
}

/// A section's report lines and raw numbers (by section name).
pub(super) type Section = (Vec<String>, Value);

/// Adds a section's lines and numbers to the run's.
fn add(md: &mut Vec<String>, raw: &mut serde_json::Map<String, Value>, (lines, numbers): Section) {
    md.extend(lines);
    if let Value::Object(m) = numbers {
        raw.extend(m);
    }
}

pub fn bench(tachyon: &Path, tools: &Path) -> Result<()> {
    let py_spy = setup_py_spy(tools)?;
    install_missing("perf", "linux-perf")?;
    let dir = crate::workspace().join("target/bench");
    std::fs::create_dir_all(&dir)?;
    let script = dir.join("bench_work.py");
    std::fs::write(&script, WORKLOAD)?;
    let busy = dir.join("bench_busy.py");
    std::fs::write(&busy, BUSY)?;
    let pythons = interpreters(tools)?;
    let py = workload_python(tools)?;
    let mut md = Vec::new();
    let mut raw = serde_json::Map::new();
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let b = Bench {
        tachyon: tachyon.to_path_buf(),
        dir: dir.clone(),
        py: py.clone(),
        py_spy: py_spy.clone(),
        script: script.clone(),
        busy: busy.clone(),
        cpus,
        pin: format!("{}", cpus - 1),
        pythons,
    };
    md.push("# tachyon-bpf benchmark\n".to_string());
    md.push(format!(
        "Measured by `cargo xtask bench` on this machine ({cpus} CPUs, kernel {}), every peer in \
         the same run. Workload interpreter: pyenv CPython 3.12.1, pinned to the last CPU.\n",
        crate::output_of(Command::new("uname").arg("-r")).trim()
    ));

    for section in [
        load::slowdown,
        load::cost,
        load::headroom,
        load::memory,
        load::accuracy,
    ] {
        add(&mut md, &mut raw, section(&b)?);
    }
    let (pp_md, pp_raw) = pingpong::pingpong(tachyon, &py, &py_spy, &dir)?;
    md.extend(pp_md);
    raw.insert("pingpong".into(), pp_raw);
    for section in [host::mixed, host::idle] {
        add(&mut md, &mut raw, section(&b)?);
    }
    let (cp_md, cp_raw) = cpython::cpython_sampler(tachyon, tools, &dir, &b.pin)?;
    md.extend(cp_md);
    raw.insert("cpython_sampler".into(), cp_raw);
    let (a_md, a_raw) = asyncio::asyncio_tasks(tachyon, tools, &dir)?;
    md.extend(a_md);
    raw.insert("asyncio".into(), a_raw);
    let (c_md, c_raw) = callgrind::callgrind(tachyon, tools, &py, &dir)?;
    md.extend(c_md);
    raw.insert("callgrind".into(), c_raw);
    let (s_md, s_raw) = service::service(tachyon, tools, &py_spy, &dir)?;
    md.extend(s_md);
    raw.insert("service".into(), s_raw);
    let (l_md, l_raw) = always_on::always_on(tachyon, tools, &dir)?;
    md.extend(l_md);
    raw.insert("always_on".into(), l_raw);

    let text = md.join("\n") + "\n";
    print!("{text}");
    let results = crate::workspace().join("bench/results.md");
    std::fs::create_dir_all(results.parent().unwrap())?;
    std::fs::write(&results, &text)?;
    std::fs::write(
        dir.join("results.json"),
        serde_json::to_vec_pretty(&Value::Object(raw))?,
    )?;
    eprintln!("bench: wrote {}", results.display());
    Ok(())
}
