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
//!    interleaved rounds; the profiler's own CPU use and peak RSS while it runs.
//! 7. **A mixed host**: busy processes beside processes whose threads sleep and wake thousands of
//!    times a second, 20 s at 1 kHz: the profiler's CPU per sample, all included.
//! 8. **Idle processes**: the profiler's CPU with 500 idle processes on the host, against none.
//! 9. **CPython's own sampler** (`python3.15 -m profiling.sampling`, the closest peer) on Debian's
//!    3.15: the workload's slowdown under it (`--pstats`, `--native --gecko`) and under
//!    tachyon-bpf (cpu and wall), the samples each delivers per second, how far their top-10
//!    function shares are apart, and whether the two JSONL files have one schema.
//!    `cargo xtask bench cpython` runs this section alone.
//!
//! The targets from the issue are printed beside each number.

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

const WORKLOAD: &str = r#"
import hashlib, json, os, sys, time, zlib

def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)

def squares(n):
    s = 0
    for i in range(n):
        s += i * i
    return s

DOC = {"items": [{"id": i, "name": "item-%d" % i, "tags": ["a", "b", "c"], "price": i * 0.5}
                 for i in range(400)]}

def c_heavy():
    text = json.dumps(DOC)
    blob = zlib.compress(text.encode() * 4, 6)
    digest = hashlib.sha256(blob * 8).hexdigest()
    order = sorted(DOC["items"], key=lambda d: (d["price"] % 7, d["id"]))
    return len(json.loads(text)["items"]) + len(digest) + order[0]["id"]

def work():
    return squares(60000) + fib(16) + c_heavy()

def main():
    if len(sys.argv) > 2:
        os.sched_setaffinity(0, {int(sys.argv[2])})
    t0 = time.perf_counter()
    for _ in range(int(sys.argv[1])):
        work()
    print(time.perf_counter() - t0)

if __name__ == "__main__":
    main()
"#;

/// A Python process that keeps one CPU busy in Python code for `argv[1]` seconds.
const BUSY: &str = r#"
import sys, time
def busy_loop():
    t0 = time.time()
    x = 0
    while time.time() - t0 < float(sys.argv[1]):
        for i in range(1000):
            x += i
busy_loop()
"#;

/// Two threads passing a token through two queues for `argv[1]` seconds; prints round trips per
/// second.
const PINGPONG: &str = r#"
import queue, sys, threading, time
def ponger(a, b):
    while a.get() is not None:
        b.put(1)
def main():
    secs = float(sys.argv[1])
    a, b = queue.Queue(), queue.Queue()
    t = threading.Thread(target=ponger, args=(a, b))
    t.start()
    n = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < secs:
        a.put(1)
        b.get()
        n += 1
    a.put(None)
    t.join()
    print(n / (time.perf_counter() - t0))
main()
"#;

/// A process of 4 threads that each sleep 500 µs in a loop for `argv[1]` seconds (thousands of
/// wake-ups a second, little CPU).
const SLEEPY: &str = r#"
import sys, threading, time
def napper(secs):
    t0 = time.time()
    while time.time() - t0 < secs:
        time.sleep(0.0005)
ts = [threading.Thread(target=napper, args=(float(sys.argv[1]),)) for _ in range(4)]
for t in ts: t.start()
for t in ts: t.join()
"#;

/// Ping-pong rounds (median reported) and their length in seconds.
const PP_ROUNDS: usize = 5;
const PP_SECS: &str = "5";

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
fn finish_measured(mut child: Child) -> Result<f64> {
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
    Ok(ms(ru.ru_utime) + ms(ru.ru_stime))
}

/// `meta` with `profilerCost.processCpuMs`, the run's whole-process CPU (`finish_measured`).
fn with_process_cpu(mut m: Value, cpu_ms: f64) -> Value {
    m["profilerCost"]["processCpuMs"] = json!(cpu_ms);
    m
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

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or(f64::NAN)
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
    md.push("# tachyon-bpf benchmark\n".to_string());
    md.push(format!(
        "Measured by `cargo xtask bench` on this machine ({cpus} CPUs, kernel {}), every peer in \
         the same run. Workload interpreter: pyenv CPython 3.12.1, pinned to the last CPU.\n",
        crate::output_of(Command::new("uname").arg("-r")).trim()
    ));

    // 1. Slowdown.
    let iters = "500";
    let perf_data = dir.join("perf.data");
    let spy_out = dir.join("pyspy.txt");
    let tach_out = dir.join("slowdown.json");
    // The workload is pinned to the last CPU in every configuration (the profilers are not):
    // this machine's scheduling noise is otherwise larger than the overheads measured.
    let pin = format!("{}", cpus - 1);
    let workload = || {
        let mut c = Command::new(&py);
        c.arg(&script).arg(iters).arg(&pin);
        c
    };
    // A peer that launches the workload itself: `PEER ARGS OUT -- python script iters cpu`.
    let launch = |peer: &Path, args: &[&str], out: &Path| -> Box<dyn Fn() -> Result<f64>> {
        let (peer, out) = (peer.to_path_buf(), out.to_path_buf());
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        let workload = workload();
        Box::new(move || {
            let mut cmd = Command::new(&peer);
            cmd.args(&args)
                .arg(&out)
                .arg("--")
                .arg(workload.get_program())
                .args(workload.get_args());
            timed(&mut cmd)
        })
    };
    let configs: Vec<Config> = vec![
        ("alone", Box::new(|| timed(&mut workload()))),
        (
            "tachyon-bpf --all-pythons (1 kHz per CPU, native + Python, wall mode)",
            Box::new(|| {
                let bg = Background::start(tachyon, &["--all-pythons", "-r", "1000"], &tach_out)?;
                let t = timed(&mut workload());
                bg.stop()?;
                t
            }),
        ),
        (
            "py-spy record -r 1000",
            launch(
                &py_spy,
                &["record", "-r", "1000", "-f", "raw", "-o"],
                &spy_out,
            ),
        ),
        (
            "py-spy record -r 1000 --native",
            launch(
                &py_spy,
                &["record", "-r", "1000", "--native", "-f", "raw", "-o"],
                &spy_out,
            ),
        ),
        (
            "perf record --call-graph dwarf -F 1000",
            launch(
                Path::new("perf"),
                &["record", "-q", "--call-graph", "dwarf", "-F", "1000", "-o"],
                &perf_data,
            ),
        ),
    ];
    eprintln!(
        "bench: slowdown, {ROUNDS} rounds of {} configurations",
        configs.len()
    );
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); configs.len()];
    for round in 0..ROUNDS {
        for (i, (_, run)) in configs.iter().enumerate() {
            times[i].push(run()?);
        }
        eprintln!("bench: round {} of {ROUNDS} done", round + 1);
    }
    let meds: Vec<f64> = times.iter().map(|t| median(t.clone())).collect();
    let base = meds[0];
    let tach_ovh = meds[1] / base - 1.0;
    let native_ovh = meds[3] / base - 1.0;
    md.push("## 1. Target slowdown (1 kHz)\n".into());
    md.push(format!(
        "Workload alone: {base:.3} s (median of {ROUNDS} interleaved rounds). Target: at most \
         1.02x, and an overhead at least 5x smaller than py-spy --native's.\n"
    ));
    md.push("| profiler | median s | slowdown | runs (s) |\n|---|---|---|---|".into());
    let mut slow_raw = Vec::new();
    for (i, (name, _)) in configs.iter().enumerate() {
        let runs: Vec<String> = times[i].iter().map(|t| format!("{t:.3}")).collect();
        md.push(format!(
            "| {name} | {:.3} | {:.3}x | {} |",
            meds[i],
            meds[i] / base,
            runs.join(" ")
        ));
        slow_raw.push(json!({"profiler": name, "median_s": meds[i], "slowdown": meds[i] / base, "runs": times[i]}));
    }
    let ratio = native_ovh / tach_ovh.max(1e-4);
    md.push(format!(
        "\ntachyon-bpf's overhead: {:.2}%; py-spy --native's: {:.2}%; ratio {}.\n",
        tach_ovh * 100.0,
        native_ovh * 100.0,
        if tach_ovh <= 1e-4 {
            "unbounded (tachyon-bpf's overhead is within noise of zero)".to_string()
        } else {
            format!("{ratio:.1}x")
        }
    ));
    raw.insert("slowdown".into(), json!(slow_raw));

    // 2. Cost per sample.
    md.push("## 2. Profiler cost per 1,000 samples\n".into());
    md.push(format!(
        "CPU time of tachyon-bpf (user space: its whole process; BPF: the programs' run time from \
         the kernel's statistics), `--all-pythons`, median of {COST_RUNS} runs. *All included* is a \
         {LONG} s run, start-up (BPF verification, kernel symbols, BTF) included; *marginal* is the \
         extra cost per extra sample between {SHORT} s and {LONG} s runs, i.e. without start-up. \
         Target: at most 10 µs per sample (10 ms per 1,000).\n"
    ));
    md.push(
        "| rate per CPU | busy processes | samples | user ms/1k | BPF ms/1k | all included ms/1k | marginal ms/1k | start-up ms |\n|---|---|---|---|---|---|---|---|"
            .into(),
    );
    let mut cost_raw = Vec::new();
    let total_ms =
        |m: &Value| f(&m["profilerCost"]["processCpuMs"]) + f(&m["profilerCost"]["bpfMs"]);
    for rate in [1000u64, 10000] {
        for procs in [1usize, 8] {
            eprintln!("bench: cost at {rate} Hz with {procs} processes");
            let (mut long, mut marginal, mut startup) = (Vec::new(), Vec::new(), Vec::new());
            for _ in 0..COST_RUNS {
                let out = dir.join("cost.json");
                let short = all_pythons_run(tachyon, &py, &busy, &out, procs, rate, SHORT)?;
                let m = all_pythons_run(tachyon, &py, &busy, &out, procs, rate, LONG)?;
                let per = (total_ms(&m) - total_ms(&short))
                    / (f(&m["samples"]) - f(&short["samples"])).max(1.0);
                marginal.push(per * 1000.0);
                startup.push(total_ms(&m) - per * f(&m["samples"]));
                long.push(m);
            }
            let per_k = |key: &str, m: &Value| {
                f(&m["profilerCost"][key]) * 1000.0 / f(&m["samples"]).max(1.0)
            };
            let user = median(long.iter().map(|m| per_k("processCpuMs", m)).collect());
            let bpf = median(long.iter().map(|m| per_k("bpfMs", m)).collect());
            let samples = median(long.iter().map(|m| f(&m["samples"])).collect());
            let marginal = median(marginal);
            let startup = median(startup);
            md.push(format!(
                "| {rate} Hz | {procs} | {samples:.0} | {user:.2} | {bpf:.2} | {:.2} | {marginal:.2} | {startup:.0} |",
                user + bpf,
            ));
            cost_raw.push(
                json!({"rate_hz": rate, "processes": procs, "samples": samples,
                "user_ms_per_1k": user, "bpf_ms_per_1k": bpf, "marginal_ms_per_1k": marginal,
                "startup_ms": startup, "runs": long}),
            );
        }
    }
    raw.insert("cost".into(), json!(cost_raw));

    // 3. Headroom.
    md.push("\n## 3. Headroom\n".into());
    md.push(format!(
        "{cpus} busy Python processes (every CPU busy), 10 s per rate, `--all-pythons`. A rate is \
         sustained when under 0.1% of samples are lost. Samples/s counts the Python processes' \
         samples only (the profiler's own share of the CPUs is not sampled). Target: at least \
         10 kHz per CPU.\n"
    ));
    md.push(
        "| rate per CPU | samples/s per CPU | lost | lost % | sustained |\n|---|---|---|---|---|"
            .into(),
    );
    let mut best = 0;
    let mut head_raw = Vec::new();
    for rate in [5000u64, 10000, 20000, 30000, 40000, 50000] {
        eprintln!("bench: headroom at {rate} Hz");
        let m = all_pythons_run(
            tachyon,
            &py,
            &busy,
            &dir.join("headroom.json"),
            cpus,
            rate,
            10,
        )?;
        let samples = f(&m["samples"]);
        let lost = f(&m["lost"]);
        let secs = f(&m["durationMs"]) / 1000.0;
        let per_cpu = samples / secs / cpus as f64;
        let lost_pct = 100.0 * lost / (samples + lost).max(1.0);
        let ok = lost_pct < 0.1;
        if ok {
            best = best.max(rate);
        }
        md.push(format!(
            "| {rate} Hz | {per_cpu:.0} | {lost:.0} | {lost_pct:.3} | {} |",
            if ok { "yes" } else { "no" }
        ));
        head_raw.push(json!({"rate_hz": rate, "per_cpu_per_s": per_cpu, "lost": lost, "meta": m}));
        if !ok {
            break;
        }
    }
    md.push(format!("\nHighest sustained rate: {best} Hz per CPU.\n"));
    raw.insert("headroom".into(), json!(head_raw));

    // 4. Memory.
    md.push("## 4. Memory\n".into());
    md.push(
        "Peak RSS of tachyon-bpf, `--all-pythons` at 1 kHz per CPU with 8 busy processes. \
         Target: under 150 MB, growing with distinct stacks rather than run length.\n"
            .into(),
    );
    md.push("| run | samples | peak RSS MiB |\n|---|---|---|".into());
    let mut mem_raw = Vec::new();
    for secs in [30u64, 60, 120] {
        eprintln!("bench: memory over {secs} s");
        let m = all_pythons_run(tachyon, &py, &busy, &dir.join("memory.json"), 8, 1000, secs)?;
        let rss = f(&m["profilerCost"]["peakRssKiB"]) / 1024.0;
        md.push(format!("| {secs} s | {} | {rss:.1} |", m["samples"]));
        mem_raw.push(json!({"secs": secs, "peak_rss_mib": rss, "samples": m["samples"]}));
    }
    raw.insert("memory".into(), json!(mem_raw));

    // 5. Accuracy.
    md.push("\n## 5. Accuracy: fully merged stacks\n".into());
    md.push(
        "Samples of the workload running Python code whose stack is rooted at `_start`, with \
         Python frames spliced in and no eval frame left over (1 kHz, 600 iterations, about 3.5 s on 3.12; the first tens of ms of a process, before its thread state is known to the BPF side, are part of it). Target: at \
         least 99% on 3.11-3.13.\n"
            .into(),
    );
    md.push("| interpreter | samples | merged | merged % |\n|---|---|---|---|".into());
    let mut acc_raw = Vec::new();
    for (label, interp) in &pythons {
        let out = dir.join(format!("accuracy-{label}.json"));
        let o = Command::new(tachyon)
            .args(["-q", "-r", "1000", "-o"])
            .arg(&out)
            .arg("--")
            .arg(interp)
            .arg(&script)
            .arg("600")
            .stdout(Stdio::null())
            .output()?;
        if !o.status.success() {
            bail!(
                "tachyon-bpf on {label}: {}",
                String::from_utf8_lossy(&o.stderr)
            );
        }
        let (all, good) = merged(&out, "bench_work")?;
        let pct = 100.0 * good as f64 / all.max(1) as f64;
        md.push(format!("| {label} | {all} | {good} | {pct:.2} |"));
        acc_raw.push(json!({"python": label, "samples": all, "merged": good, "pct": pct}));
    }
    raw.insert("accuracy".into(), json!(acc_raw));

    // 6. Thread ping-pong.
    let (pp_md, pp_raw) = pingpong(tachyon, &py, &py_spy, &dir)?;
    md.extend(pp_md);
    raw.insert("pingpong".into(), pp_raw);

    // 7. A mixed host.
    let sleepy = dir.join("bench_sleepy.py");
    std::fs::write(&sleepy, SLEEPY)?;
    md.push("\n## 7. A mixed host (1 kHz, 20 s)\n".into());
    md.push(
        "2 busy Python processes and 2 processes of 4 threads that each sleep 500 µs in a loop \
         (about 7,000 wake-ups a second per process), `--all-pythons` for 20 s at 1 kHz, median of \
         3. CPU per sample, all included: the profiler's whole process from start to end plus the \
         BPF programs' run time. Targets: at most 10 µs per sample, BPF at most 3 µs of it.\n"
            .into(),
    );
    md.push(
        "| samples | user µs/sample | BPF µs/sample | all µs/sample | scheduler records | peak RSS MiB |\n|---|---|---|---|---|---|"
            .into(),
    );
    let mut mixed = Vec::new();
    for _ in 0..3 {
        eprintln!("bench: mixed host");
        let mut kids = spawn_busy(&py, &busy, 2, 26)?;
        kids.extend(spawn_busy(&py, &sleepy, 2, 26)?);
        std::thread::sleep(Duration::from_millis(500));
        let out = dir.join("mixed.json");
        let child = Command::new(tachyon)
            .args(["--all-pythons", "-q", "-r", "1000", "-d", "20", "-o"])
            .arg(&out)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()?;
        let cpu = finish_measured(child);
        reap(kids);
        mixed.push(with_process_cpu(meta(&out)?, cpu?));
    }
    let per = |k: &str| {
        median(
            mixed
                .iter()
                .map(|m| 1000.0 * f(&m["profilerCost"][k]) / f(&m["samples"]).max(1.0))
                .collect(),
        )
    };
    let (mu, mb) = (per("processCpuMs"), per("bpfMs"));
    let counter = |m: &Value, name: &str| f(&m["bpfCounters"][name]);
    md.push(format!(
        "| {:.0} | {mu:.2} | {mb:.2} | {:.2} | {:.0} | {:.1} |",
        median(mixed.iter().map(|m| f(&m["samples"])).collect()),
        mu + mb,
        median(mixed.iter().map(|m| counter(m, "schedRecords")).collect()),
        median(
            mixed
                .iter()
                .map(|m| f(&m["profilerCost"]["peakRssKiB"]) / 1024.0)
                .collect()
        ),
    ));
    // Where the BPF time goes: per program, per sample and per run (medians of the runs).
    let mut names: Vec<String> = mixed
        .iter()
        .filter_map(|m| m["bpfPrograms"].as_object())
        .flat_map(|o| o.keys().cloned())
        .collect();
    names.sort();
    names.dedup();
    let mut by_program = Vec::new();
    for name in &names {
        let (mut per_sample, mut per_run, mut runs) = (Vec::new(), Vec::new(), Vec::new());
        for m in &mixed {
            // A program that did not run in a run (a fork in one of them) counts as 0 there.
            let p = &m["bpfPrograms"][name.as_str()];
            let (ms, n) = (
                p["ms"].as_f64().unwrap_or(0.0),
                p["runs"].as_f64().unwrap_or(0.0),
            );
            per_sample.push(1000.0 * ms / f(&m["samples"]).max(1.0));
            if n > 0.0 {
                per_run.push(1000.0 * ms / n);
            }
            runs.push(n);
        }
        // Programs that ran now and then (forks, execs) are not where the time goes.
        if median(per_sample.clone()) < 0.01 {
            continue;
        }
        by_program.push(format!(
            "`{name}` {:.2} µs per sample ({:.0} runs, {:.2} µs each)",
            median(per_sample),
            median(runs),
            median(per_run)
        ));
    }
    if !by_program.is_empty() {
        md.push(format!("\nBPF time by program: {}.", by_program.join("; ")));
    }
    raw.insert("mixed".into(), json!(mixed));

    // 8. Idle processes, and programs started.
    md.push("\n## 8. Idle processes and programs started\n".into());
    md.push(format!(
        "`--all-pythons` beside one busy Python process, with nothing else, with 500 idle \
         processes (`sleep`), and with a shell starting programs in a loop (`/bin/true`, then \
         `sleep 0.005`: shell commands, health checks) on the host: the profiler's CPU (user \
         space and BPF) per second of run, start-up excluded (the difference between {SHORT} s \
         and {LONG} s runs), median of 3. Forks a second: the kernel's count over the runs. \
         Target: no growth with idle processes; programs started cost what looking at each \
         one a few times costs.\n"
    ));
    md.push("| on the host | forks a second | profiler ms CPU per s |\n|---|---|---|".into());
    let mut idle_raw = Vec::new();
    for (label, idle_n, churn) in [
        ("nothing else", 0usize, false),
        ("500 idle processes", 500, false),
        ("a shell starting programs", 0, true),
    ] {
        eprintln!("bench: {label}");
        let idle: Vec<Child> = (0..idle_n)
            .map(|_| {
                Command::new("sleep")
                    .arg("600")
                    .spawn()
                    .context("starting an idle process")
            })
            .collect::<Result<_>>()?;
        let churner = churn
            .then(|| {
                Command::new("sh")
                    .args(["-c", "while :; do /bin/true; sleep 0.005; done"])
                    .spawn()
                    .context("starting the shell loop")
            })
            .transpose()?;
        let out = dir.join("idle.json");
        let mut per_s = Vec::new();
        let (forks0, t0) = (forks_so_far()?, Instant::now());
        for _ in 0..3 {
            let short = all_pythons_run(tachyon, &py, &busy, &out, 1, 1000, SHORT)?;
            let long = all_pythons_run(tachyon, &py, &busy, &out, 1, 1000, LONG)?;
            per_s.push(
                (total_ms(&long) - total_ms(&short))
                    / ((f(&long["durationMs"]) - f(&short["durationMs"])) / 1000.0),
            );
        }
        let forks = (forks_so_far()? - forks0) as f64 / t0.elapsed().as_secs_f64();
        reap(idle);
        if let Some(c) = churner {
            reap(vec![c]);
        }
        let v = median(per_s.clone());
        md.push(format!("| {label} | {forks:.0} | {v:.1} |"));
        idle_raw.push(json!({"host": label, "idle": idle_n, "forks_per_s": forks, "ms_per_s": v, "runs": per_s}));
    }
    raw.insert("idle".into(), json!(idle_raw));

    // 9. CPython's own sampler.
    let (cp_md, cp_raw) = cpython_sampler(tachyon, tools, &dir, &pin)?;
    md.extend(cp_md);
    raw.insert("cpython_sampler".into(), cp_raw);

    // 10. asyncio with many tasks.
    let (a_md, a_raw) = asyncio_tasks(tachyon, tools, &dir)?;
    md.extend(a_md);
    raw.insert("asyncio".into(), a_raw);

    // 11. Instructions per sample.
    let (c_md, c_raw) = callgrind(tachyon, &py, &dir)?;
    md.extend(c_md);
    raw.insert("callgrind".into(), c_raw);

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

/// Rounds of the CPython-sampler comparison (median reported).
const CP_ROUNDS: usize = 5;
/// Profiled runs of each whose function shares are compared (their medians).
const SHARE_ROUNDS: usize = 5;

/// Self samples per Python function (`file:func`, the innermost `file:func:line` frame of each
/// folded line), and the total of lines that have one, over the lines with a frame of `under`
/// (`file:func`): the part of a run both profilers see alike.
fn python_self(
    folded: &Path,
    under: &str,
) -> Result<(std::collections::HashMap<String, f64>, f64)> {
    let text = read_lossy(folded)?;
    let mut by = std::collections::HashMap::new();
    let mut total = 0.0;
    for line in text.lines() {
        let Some((stack, n)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(n) = n.parse::<f64>() else { continue };
        if !stack
            .split(';')
            .any(|f| f.starts_with(&format!("{under}:")))
        {
            continue;
        }
        let leaf = stack.split(';').rev().find_map(|f| {
            let (rest, line) = f.rsplit_once(':')?;
            line.parse::<u32>().ok()?;
            let (file, func) = rest.split_once(':')?;
            (file.ends_with(".py") || file.starts_with('<')).then(|| format!("{file}:{func}"))
        });
        if let Some(leaf) = leaf {
            total += n;
            *by.entry(leaf).or_insert(0.0) += n;
        }
    }
    Ok((by, total))
}

/// The workload's three parts timed from inside (thread CPU time around each call): what a
/// profile's shares of them should be. Prints `{"squares": %, "fib": %, "c_heavy": %}`.
const TRUTH: &str = r#"
import json, os, sys, time
script, iters, cpu = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
# The workload as a module (its main() runs only as a script): its functions, timed one by one.
g = {"__name__": "bench_work"}
exec(compile(open(script).read(), script, "exec"), g)
squares, fib, c_heavy = g["squares"], g["fib"], g["c_heavy"]
os.sched_setaffinity(0, {cpu})
tt = {"squares": 0.0, "fib": 0.0, "c_heavy": 0.0}
for _ in range(iters):
    t = time.thread_time(); squares(60000); tt["squares"] += time.thread_time() - t
    t = time.thread_time(); fib(16); tt["fib"] += time.thread_time() - t
    t = time.thread_time(); c_heavy(); tt["c_heavy"] += time.thread_time() - t
total = sum(tt.values())
print(json.dumps({k: 100 * v / total for k, v in tt.items()}))
"#;

/// Samples of a folded file with a frame of `file:func` for each of `funcs`, over those with a
/// frame of `under`, in percent.
fn total_shares(folded: &Path, under: &str, funcs: &[&str]) -> Result<Vec<f64>> {
    let text = read_lossy(folded)?;
    let mut n = vec![0.0; funcs.len()];
    let mut all = 0.0;
    let has = |stack: &str, f: &str| stack.split(';').any(|x| x.starts_with(&format!("{f}:")));
    for line in text.lines() {
        let Some((stack, c)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(c) = c.parse::<f64>() else { continue };
        if !has(stack, under) {
            continue;
        }
        all += c;
        for (i, f) in funcs.iter().enumerate() {
            if has(stack, f) {
                n[i] += c;
            }
        }
    }
    Ok(n.into_iter()
        .map(|x| 100.0 * x / f64::max(all, 1.0))
        .collect())
}

/// Record types and each type's keys, of a JSONL file.
fn jsonl_shape(path: &Path) -> Result<std::collections::BTreeMap<String, Vec<String>>> {
    let mut out = std::collections::BTreeMap::new();
    for line in read_lossy(path)?.lines() {
        let v: Value = serde_json::from_str(line)?;
        let ty = v["type"].as_str().unwrap_or("?").to_string();
        let mut keys: Vec<String> = v
            .as_object()
            .map_or(Vec::new(), |o| o.keys().cloned().collect());
        keys.sort();
        out.entry(ty).or_insert(keys);
    }
    Ok(out)
}

/// Section 6: two threads passing a token through queues, alone, under a bare timer, under
/// tachyon-bpf in wall and cpu mode and under py-spy; the report's lines and raw numbers.
pub fn pingpong(
    tachyon: &Path,
    py: &Path,
    py_spy: &Path,
    dir: &Path,
) -> Result<(Vec<String>, Value)> {
    let mut md = Vec::new();
    let spy_out = dir.join("pyspy-pingpong.txt");
    let pp = dir.join("bench_pingpong.py");
    std::fs::write(&pp, PINGPONG)?;
    let pp_cmd = || {
        let mut c = Command::new(py);
        c.arg(&pp).arg(PP_SECS);
        c
    };
    let pp_out = |mode: &str| dir.join(format!("pingpong-{mode}.json"));
    // Each tachyon-bpf run's `meta.tachyon`, wall runs then cpu runs.
    let pp_cost_cell: std::cell::RefCell<[Vec<Value>; 2]> = Default::default();
    let pp_cost_ref = &pp_cost_cell;
    let under_tachyon = |mode: &'static str| -> Box<dyn Fn() -> Result<f64> + '_> {
        Box::new(move || {
            let bg = Background::start(
                tachyon,
                &["--all-pythons", "-r", "1000", "-m", mode],
                &pp_out(mode),
            )?;
            let t = timed(&mut pp_cmd());
            let cpu = bg.stop()?;
            let m = with_process_cpu(meta(&pp_out(mode))?, cpu);
            pp_cost_ref.borrow_mut()[usize::from(mode == "cpu")].push(m);
            t
        })
    };
    let spy_pp = || -> Result<f64> {
        timed(
            Command::new(py_spy)
                .args(["record", "-r", "1000", "--nonblocking", "-f", "raw", "-o"])
                .arg(&spy_out)
                .arg("--")
                .arg(py)
                .arg(&pp)
                .arg(PP_SECS),
        )
    };
    // On this virtual machine, a bare timer interrupt on every CPU alone speeds the hand-off up
    // by about a quarter (most likely, a waiting CPU that takes interrupts is woken sooner than a
    // halted one),
    // so a profiler's ratio against `alone` mixes its cost with that gain. The timer's row is the
    // baseline that separates them.
    let timer_data = dir.join("pingpong-timer.data");
    let bare_timer = || -> Result<f64> {
        let mut perf = Command::new("perf")
            .args(["record", "-q", "-a", "-F", "1000", "-e", "cpu-clock", "-o"])
            .arg(&timer_data)
            .args(["--", "sleep"])
            .arg(format!("{}", PP_SECS.parse::<u64>()? + 2))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        std::thread::sleep(Duration::from_millis(500));
        let t = timed(&mut pp_cmd());
        let _ = perf.wait();
        t
    };
    let pp_configs: Vec<Config> = vec![
        ("alone", Box::new(|| timed(&mut pp_cmd()))),
        (
            "a bare 1 kHz timer on every CPU (perf record -a -e cpu-clock, no stacks)",
            Box::new(bare_timer),
        ),
        (
            "tachyon-bpf --all-pythons -m wall (1 kHz)",
            under_tachyon("wall"),
        ),
        (
            "tachyon-bpf --all-pythons -m cpu (1 kHz)",
            under_tachyon("cpu"),
        ),
        ("py-spy record -r 1000 --nonblocking", Box::new(spy_pp)),
    ];
    eprintln!("bench: ping-pong, {PP_ROUNDS} rounds");
    let mut tput: Vec<Vec<f64>> = vec![Vec::new(); pp_configs.len()];
    for _ in 0..PP_ROUNDS {
        for (i, (_, run)) in pp_configs.iter().enumerate() {
            tput[i].push(run()?);
        }
    }
    let pp_cost = pp_cost_cell.borrow().clone();
    let pp_meds: Vec<f64> = tput.iter().map(|t| median(t.clone())).collect();
    md.push("\n## 6. Thread ping-pong (1 kHz)\n".into());
    md.push(format!(
        "Two threads of one pyenv 3.12 process pass a token through two `queue.Queue`s for \
         {PP_SECS} s; round trips per second, median of {PP_ROUNDS} interleaved rounds. Targets: \
         at least 0.97x of alone in wall mode and 0.98x in cpu mode; the profiler under 5% of one \
         CPU; peak RSS under 150 MB. On this virtual machine a bare timer interrupt on every CPU \
         (no profiler) speeds the hand-off up by itself (most likely, a waiting CPU that takes \
         interrupts wakes sooner than a halted one): *vs timer* is each row against that baseline, the \
         profiler's own cost.\n"
    ));
    md.push("| profiler | round trips/s | ratio | vs timer | runs |\n|---|---|---|---|---|".into());
    let mut pp_raw = Vec::new();
    for (i, (name, _)) in pp_configs.iter().enumerate() {
        let runs: Vec<String> = tput[i].iter().map(|t| format!("{t:.0}")).collect();
        md.push(format!(
            "| {name} | {:.0} | {:.3}x | {:.3}x | {} |",
            pp_meds[i],
            pp_meds[i] / pp_meds[0],
            pp_meds[i] / pp_meds[1],
            runs.join(" ")
        ));
        pp_raw.push(json!({"profiler": name, "median": pp_meds[i], "ratio": pp_meds[i] / pp_meds[0], "vs_timer": pp_meds[i] / pp_meds[1], "runs": tput[i]}));
    }
    md.push(
        "\nThe profiler's own cost in those runs (the whole process from start to end, start-up \
         included, over the run's duration; BPF from the kernel's statistics):\n"
            .into(),
    );
    md.push(
        "| mode | CPU % of one CPU | user % | BPF % | samples | µs per sample | peak RSS MiB |\n|---|---|---|---|---|---|---|"
            .into(),
    );
    let mut pp_cost_raw = Vec::new();
    for (mode, runs) in ["wall", "cpu"].iter().zip(&pp_cost) {
        let pct = |k: &str| {
            median(
                runs.iter()
                    .map(|m| 100.0 * f(&m["profilerCost"][k]) / f(&m["durationMs"]))
                    .collect(),
            )
        };
        let (user, bpf) = (pct("processCpuMs"), pct("bpfMs"));
        let per = median(
            runs.iter()
                .map(|m| {
                    1000.0
                        * (f(&m["profilerCost"]["processCpuMs"]) + f(&m["profilerCost"]["bpfMs"]))
                        / f(&m["samples"]).max(1.0)
                })
                .collect(),
        );
        let samples = median(runs.iter().map(|m| f(&m["samples"])).collect());
        let rss = median(
            runs.iter()
                .map(|m| f(&m["profilerCost"]["peakRssKiB"]) / 1024.0)
                .collect(),
        );
        md.push(format!(
            "| {mode} | {:.1} | {user:.1} | {bpf:.1} | {samples:.0} | {per:.1} | {rss:.1} |",
            user + bpf
        ));
        pp_cost_raw.push(json!({"mode": mode, "user_pct": user, "bpf_pct": bpf, "us_per_sample": per, "peak_rss_mib": rss, "runs": runs}));
    }
    Ok((md, json!({"throughput": pp_raw, "cost": pp_cost_raw})))
}

/// Section 9: CPython's own sampler on Debian's 3.15, beside tachyon-bpf, on the section-1
/// workload pinned to one CPU.
pub fn cpython_sampler(
    tachyon: &Path,
    tools: &Path,
    dir: &Path,
    pin: &str,
) -> Result<(Vec<String>, Value)> {
    let py = tools.join("debian-python/usr/bin/python3.15");
    if !py.exists() {
        bail!("{} is missing: run `cargo xtask setup`", py.display());
    }
    let script = dir.join("bench_work.py");
    std::fs::write(&script, WORKLOAD)?;
    let iters = "300";
    let target = |c: &mut Command| {
        c.arg(&script).arg(iters).arg(pin);
    };
    let sampler = |args: &[&str], out: &Path| -> Result<f64> {
        let mut c = Command::new(&py);
        c.args(["-m", "profiling.sampling", "run", "-r", "1khz"])
            .args(args)
            .arg("-o")
            .arg(out);
        target(&mut c);
        timed(&mut c)
    };
    let ours = |mode: &str, format: &str, out: &Path| -> Result<f64> {
        let mut c = Command::new(tachyon);
        c.args(["-m", mode, "-r", "1000", "-q", "-f", format, "-o"])
            .arg(out)
            .arg("--")
            .arg(&py);
        target(&mut c);
        timed(&mut c)
    };
    let cp_pstats = dir.join("cpython.pstats");
    let cp_gecko = dir.join("cpython-gecko.json");
    let cp_folded = dir.join("cpython.folded");
    let our_cpu = dir.join("tachyon-cpu.folded");
    let our_wall = dir.join("tachyon-wall.folded");
    type Run<'a> = (&'a str, Box<dyn Fn() -> Result<f64> + 'a>);
    let configs: Vec<Run> = vec![
        (
            "alone",
            Box::new(|| {
                let mut c = Command::new(&py);
                target(&mut c);
                timed(&mut c)
            }),
        ),
        (
            "CPython sampler --pstats",
            Box::new(|| sampler(&["--pstats"], &cp_pstats)),
        ),
        (
            "CPython sampler --native --gecko",
            Box::new(|| sampler(&["--native", "--gecko"], &cp_gecko)),
        ),
        (
            "tachyon-bpf -m cpu (native + Python + kernel)",
            Box::new(|| ours("cpu", "collapsed", &our_cpu)),
        ),
        (
            "tachyon-bpf -m wall (native + Python + kernel)",
            Box::new(|| ours("wall", "collapsed", &our_wall)),
        ),
    ];
    eprintln!(
        "bench: CPython's sampler, {CP_ROUNDS} rounds of {} configurations",
        configs.len()
    );
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); configs.len()];
    for round in 0..CP_ROUNDS {
        for (i, (_, run)) in configs.iter().enumerate() {
            times[i].push(run()?);
        }
        eprintln!("bench: round {} of {CP_ROUNDS} done", round + 1);
    }
    let meds: Vec<f64> = times.iter().map(|t| median(t.clone())).collect();
    let mut md = vec![
        "\n## 9. CPython's own sampler on Python 3.15 (1 kHz)\n".to_string(),
        format!(
            "The section-1 workload ({iters} iterations) on Debian's python3.15, pinned to one \
             CPU, alone and under `python3.15 -m profiling.sampling run -r 1khz` and tachyon-bpf \
             (launching it, `-r 1000`), interleaved, median of {CP_ROUNDS} rounds.\n"
        ),
        "| profiler | median s | slowdown | runs (s) |\n|---|---|---|---|".to_string(),
    ];
    let mut rows = Vec::new();
    for (i, (name, _)) in configs.iter().enumerate() {
        let runs: Vec<String> = times[i].iter().map(|t| format!("{t:.3}")).collect();
        md.push(format!(
            "| {name} | {:.3} | {:.3}x | {} |",
            meds[i],
            meds[i] / meds[0],
            runs.join(" ")
        ));
        rows.push(json!({"profiler": name, "median_s": meds[i], "slowdown": meds[i] / meds[0], "runs": times[i]}));
    }

    // The samples each delivers, and their function shares, from more runs of each in cpu mode
    // with folded stacks, interleaved: one run's shares move by a few points with the
    // workload's own timing (its garbage collections, the CPU it shares), so each function's
    // median share over the runs is compared.
    type Shares = std::collections::HashMap<String, Vec<f64>>;
    let (mut cp_shares, mut our_shares): (Shares, Shares) = Default::default();
    let (mut cp_rates, mut our_rates) = (Vec::new(), Vec::new());
    for round in 0..SHARE_ROUNDS {
        let cp_secs = sampler(&["--mode", "cpu", "--collapsed"], &cp_folded)?;
        let our_secs = ours("cpu", "collapsed", &our_cpu)?;
        // The timed part of the workload: under `main` (what runs before it, the interpreter's
        // start and imports, tachyon-bpf sees from the first instruction and the CPython
        // sampler not).
        for (folded, secs, shares, rates) in [
            (&cp_folded, cp_secs, &mut cp_shares, &mut cp_rates),
            (&our_cpu, our_secs, &mut our_shares, &mut our_rates),
        ] {
            let (by, total) = python_self(folded, "bench_work.py:main")?;
            rates.push(total / secs);
            // A function missing from a run has a share of 0 there.
            for v in shares.values_mut() {
                v.resize(round, 0.0);
            }
            for (func, n) in by {
                let v = shares.entry(func).or_default();
                v.resize(round, 0.0);
                v.push(100.0 * n / total.max(1.0));
            }
            for v in shares.values_mut() {
                v.resize(round + 1, 0.0);
            }
        }
        eprintln!("bench: share round {} of {SHARE_ROUNDS} done", round + 1);
    }
    let med_share = |s: &Shares, f: &str| s.get(f).map_or(0.0, |v| median(v.clone()));
    let mut top: Vec<(String, f64)> = cp_shares
        .keys()
        .map(|f| (f.clone(), med_share(&cp_shares, f)))
        .collect();
    top.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let (cp_rate, our_rate) = (median(cp_rates), median(our_rates));
    md.push(format!(
        "\nSamples under the workload's `main` per second of it, cpu mode (1,000 asked), median \
         of {SHARE_ROUNDS} runs each: CPython sampler {cp_rate:.0}, tachyon-bpf {our_rate:.0}.\n"
    ));
    md.push(format!(
        "Top-10 Python functions by self share (the innermost Python frame) under `main`, \
         median of {SHARE_ROUNDS} interleaved runs each, in the CPython sampler's order. \
         Target: within 3 points.\n"
    ));
    md.push("| function | CPython sampler | tachyon-bpf | apart |\n|---|---|---|---|".into());
    let mut worst: f64 = 0.0;
    let mut shares = Vec::new();
    for (func, a) in top.iter().take(10) {
        let a = *a;
        let b = med_share(&our_shares, func);
        worst = worst.max((a - b).abs());
        md.push(format!(
            "| `{func}` | {a:.1}% | {b:.1}% | {:.1} |",
            (a - b).abs()
        ));
        shares.push(json!({"function": func, "cpython": a, "tachyon": b}));
    }
    md.push(format!("\nLargest difference: {worst:.1} points.\n"));

    // Against the truth: the three parts of `work` timed from inside.
    let truth_py = dir.join("bench_truth.py");
    std::fs::write(&truth_py, TRUTH)?;
    let o = Command::new(&py)
        .arg(&truth_py)
        .arg(&script)
        .arg(iters)
        .arg(pin)
        .output()?;
    let truth: Value = serde_json::from_slice(&o.stdout)
        .with_context(|| format!("the timed workload: {}", String::from_utf8_lossy(&o.stderr)))?;
    let parts = ["squares", "fib", "c_heavy"];
    let qualified: Vec<String> = parts.iter().map(|p| format!("bench_work.py:{p}")).collect();
    let qualified: Vec<&str> = qualified.iter().map(String::as_str).collect();
    let cp_parts = total_shares(&cp_folded, "bench_work.py:work", &qualified)?;
    let our_parts = total_shares(&our_cpu, "bench_work.py:work", &qualified)?;
    md.push(
        "Each part of `work` as a share of `work`'s samples (total, callees included), against \
         the truth: the same calls timed from inside with `time.thread_time()`.\n"
            .into(),
    );
    md.push("| part | truth | CPython sampler | tachyon-bpf |\n|---|---|---|---|".into());
    let mut truth_rows = Vec::new();
    let (mut cp_err, mut our_err): (f64, f64) = (0.0, 0.0);
    for (i, part) in parts.iter().enumerate() {
        let t = f(&truth[part]);
        cp_err = cp_err.max((cp_parts[i] - t).abs());
        our_err = our_err.max((our_parts[i] - t).abs());
        md.push(format!(
            "| `{part}` | {t:.1}% | {:.1}% | {:.1}% |",
            cp_parts[i], our_parts[i]
        ));
        truth_rows.push(
            json!({"part": part, "truth": t, "cpython": cp_parts[i], "tachyon": our_parts[i]}),
        );
    }
    md.push(format!(
        "\nLargest error against the truth: CPython sampler {cp_err:.1} points, tachyon-bpf \
         {our_err:.1} points.\n"
    ));

    // The JSONL of each: record types and their keys.
    let cp_jsonl = dir.join("cpython.jsonl");
    let our_jsonl = dir.join("tachyon.jsonl");
    sampler(&["--jsonl"], &cp_jsonl)?;
    ours("wall", "jsonl", &our_jsonl)?;
    let (cs, os) = (jsonl_shape(&cp_jsonl)?, jsonl_shape(&our_jsonl)?);
    let same = cs == os;
    md.push(format!(
        "JSONL of one run each: record types {:?} (CPython sampler) and {:?} (tachyon-bpf); \
         every type's keys {}.\n",
        cs.keys().collect::<Vec<_>>(),
        os.keys().collect::<Vec<_>>(),
        if same {
            "are the same".to_string()
        } else {
            format!("differ: {cs:?} against {os:?}")
        }
    ));
    Ok((
        md,
        json!({"slowdown": rows, "samples_per_s": {"cpython": cp_rate, "tachyon": our_rate}, "top10": shares, "worst_points": worst, "truth": truth_rows, "jsonl_same_shape": same}),
    ))
}

/// The asyncio service of section 10: `n` tasks (named `conn-N`), each handling "requests" in a
/// loop: a little CPU, then an I/O wait of 5-50 ms in `io_wait`. Prints requests per second.
const ASYNC_WORKLOAD: &str = r#"
import asyncio, random, sys, time

done = 0

async def io_wait(r):
    await asyncio.sleep(r.uniform(0.005, 0.05))

async def handle(r):
    global done
    x = 0
    for i in range(200):
        x += i
    await io_wait(r)
    done += 1

async def worker(i, end):
    r = random.Random(i)
    while time.monotonic() < end:
        await handle(r)

async def main(n, secs):
    end = time.monotonic() + secs
    await asyncio.gather(*(asyncio.create_task(worker(i, end), name=f"conn-{i}")
                           for i in range(n)))
    print(done / secs)

asyncio.run(main(int(sys.argv[1]), float(sys.argv[2])))
"#;

/// Rounds of the asyncio comparison (median reported).
const ASYNC_ROUNDS: usize = 5;

/// Section 10, asyncio with 10,000 live tasks on Debian's 3.15: the service's throughput alone,
/// under tachyon-bpf without and with `--async-aware running|all`, and under CPython's sampler
/// with `--async-aware` (running and all), interleaved; and tachyon-bpf's own CPU per sample
/// (user space and BPF, from `meta.tachyon.profilerCost`) and per second of the run.
pub fn asyncio_tasks(tachyon: &Path, tools: &Path, dir: &Path) -> Result<(Vec<String>, Value)> {
    let py = tools.join("debian-python/usr/bin/python3.15");
    if !py.exists() {
        bail!("{} is missing: run `cargo xtask setup`", py.display());
    }
    let script = dir.join("bench_async.py");
    std::fs::write(&script, ASYNC_WORKLOAD)?;
    let (tasks, secs) = ("10000", "6");
    let out = dir.join("async.json");
    let sampler_out = dir.join("async-cpython.folded");
    let ours = |extra: &[&str]| -> Result<f64> {
        let mut c = Command::new(tachyon);
        c.args(["-r", "1000", "-q", "-o"])
            .arg(&out)
            .args(extra)
            .arg("--")
            .arg(&py)
            .arg(&script)
            .args([tasks, secs]);
        timed(&mut c)
    };
    let sampler = |extra: &[&str]| -> Result<f64> {
        let mut c = Command::new(&py);
        c.args([
            "-m",
            "profiling.sampling",
            "run",
            "-r",
            "1khz",
            "--collapsed",
        ])
        .args(extra)
        .arg("-o")
        .arg(&sampler_out)
        .arg(&script)
        .args([tasks, secs]);
        timed(&mut c)
    };
    type Run<'a> = (&'a str, Box<dyn Fn() -> Result<f64> + 'a>, bool);
    let configs: Vec<Run> = vec![
        (
            "alone",
            Box::new(|| timed(Command::new(&py).arg(&script).args([tasks, secs]))),
            false,
        ),
        ("tachyon-bpf (wall)", Box::new(|| ours(&[])), true),
        (
            "tachyon-bpf --async-aware running",
            Box::new(|| ours(&["--async-aware", "running"])),
            true,
        ),
        (
            "tachyon-bpf --async-aware all",
            Box::new(|| ours(&["--async-aware", "all"])),
            true,
        ),
        (
            "CPython sampler --async-aware",
            Box::new(|| sampler(&["--async-aware"])),
            false,
        ),
        (
            "CPython sampler --async-aware --async-mode all",
            Box::new(|| sampler(&["--async-aware", "--async-mode", "all"])),
            false,
        ),
    ];
    eprintln!(
        "bench: asyncio with {tasks} tasks, {ASYNC_ROUNDS} rounds of {} configurations",
        configs.len()
    );
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); configs.len()];
    let mut costs: Vec<Vec<(f64, f64)>> = vec![Vec::new(); configs.len()];
    let mut sample_rates: Vec<Vec<f64>> = vec![Vec::new(); configs.len()];
    let run_secs: f64 = secs.parse()?;
    for round in 0..ASYNC_ROUNDS {
        for (i, (name, run, is_ours)) in configs.iter().enumerate() {
            rates[i].push(run()?);
            if *is_ours {
                let m = meta(&out)?;
                let cost = &m["profilerCost"];
                let cpu_ms = f(&cost["userCpuMs"]) + f(&cost["bpfMs"]);
                let dur_s = f(&m["durationMs"]) / 1000.0;
                costs[i].push((f(&cost["cpuUsPerSample"]), cpu_ms / dur_s));
                // Timer samples, and with `all` the suspended tasks' stacks.
                sample_rates[i].push((f(&m["samples"]) + f(&m["asyncSuspendedSamples"])) / dur_s);
            } else if name.starts_with("CPython") {
                // The stacks it wrote: the folded counts (in `all` mode, one per task per
                // sample).
                let text = read_lossy(&sampler_out)?;
                let total: f64 = text
                    .lines()
                    .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
                    .sum();
                sample_rates[i].push(total / run_secs);
            }
        }
        eprintln!("bench: round {} of {ASYNC_ROUNDS} done", round + 1);
    }
    let base = median(rates[0].clone());
    let mut md = vec![
        format!("\n## 10. asyncio with {tasks} tasks on Python 3.15 (1 kHz)\n"),
        format!(
            "{tasks} tasks on one event loop, each handling requests in a loop (a little CPU, \
             then a 5-50 ms `asyncio.sleep`), {secs} s, launched by each profiler; requests per \
             second against the service alone, and tachyon-bpf's own CPU (user space and BPF), \
             interleaved, median of {ASYNC_ROUNDS} rounds (throughput moves by 30% between \
             identical runs here). Stacks recorded: samples, and with `all` one stack per \
             suspended task per pass (tachyon-bpf passes over every task about every 100 ms, or \
             20 times a pass's own duration apart when that is longer; CPython's sampler writes \
             a stack per leaf task on each of its samples).\n"
        ),
        "| profiler | requests/s | throughput | stacks/s recorded | CPU µs per sample | profiler CPU ms per s |\n|---|---|---|---|---|---|"
            .to_string(),
    ];
    let mut raw = Vec::new();
    for (i, (name, _, is_ours)) in configs.iter().enumerate() {
        let r = median(rates[i].clone());
        let (per_sample, per_s) = if *is_ours {
            (
                format!("{:.1}", median(costs[i].iter().map(|c| c.0).collect())),
                format!("{:.0}", median(costs[i].iter().map(|c| c.1).collect())),
            )
        } else {
            ("".to_string(), "".to_string())
        };
        let stacks = if sample_rates[i].is_empty() {
            String::new()
        } else {
            format!("{:.0}", median(sample_rates[i].clone()))
        };
        md.push(format!(
            "| {name} | {r:.0} | {:.3}x | {stacks} | {per_sample} | {per_s} |",
            r / base
        ));
        raw.push(json!({"profiler": name, "rates": rates[i], "costs": costs[i], "stacks_per_s": sample_rates[i]}));
    }
    Ok((md, json!(raw)))
}

/// Section 11's workload: the benchmark's work (`WORKLOAD`, imported from `bench_work.py` beside
/// it) in the main thread, beside two threads that sleep 2 ms and compute a little, as a
/// service's threads do (their off-CPU captures and scheduler records are handled too).
/// `python callgrind_work.py SECONDS CPU`.
const CALLGRIND_WORKLOAD: &str = r#"
import os, sys, threading, time
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_work import squares, work

def napper():
    while True:
        time.sleep(0.002)
        squares(2000)

os.sched_setaffinity(0, {int(sys.argv[2])})
for _ in range(2):
    threading.Thread(target=napper, daemon=True).start()
t0 = time.time()
while time.time() - t0 < float(sys.argv[1]):
    work()
"#;

/// Section 11: the instructions user space executes per sample, counted by callgrind (no other
/// load on the machine moves the count, unlike its time): `-p` on the workload at 1 kHz in wall
/// mode for 8 s and for 16 s, the whole process and the record handler within it; the
/// difference over the difference of samples is the cost of one more sample, without start-up
/// and the first reads of each library's symbols and unwind tables.
pub fn callgrind(tachyon: &Path, py: &Path, dir: &Path) -> Result<(Vec<String>, Value)> {
    install_missing("valgrind", "valgrind")?;
    std::fs::write(dir.join("bench_work.py"), WORKLOAD)?;
    let script = dir.join("callgrind_work.py");
    std::fs::write(&script, CALLGRIND_WORKLOAD)?;
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let pin = (cpus - 1).to_string();
    let mut runs = Vec::new();
    for secs in [8u64, 16] {
        eprintln!("bench: callgrind, {secs} s");
        let mut work = Command::new(py)
            .arg(&script)
            .arg((secs + 8).to_string())
            .arg(&pin)
            .spawn()
            .context("starting the callgrind workload")?;
        std::thread::sleep(Duration::from_millis(500));
        let out = dir.join(format!("callgrind-{secs}.json"));
        let o = Command::new("valgrind")
            .arg("--tool=callgrind")
            .arg(format!(
                "--callgrind-out-file={}",
                dir.join(format!("callgrind-{secs}.out")).display()
            ))
            .arg(tachyon)
            .args(["-p", &work.id().to_string(), "-d", &secs.to_string()])
            .args(["-m", "wall", "-r", "1000", "-q", "-o"])
            .arg(&out)
            .output()
            .context("running valgrind")?;
        let _ = work.kill();
        let _ = work.wait();
        let err = String::from_utf8_lossy(&o.stderr);
        if !o.status.success() {
            bail!("tachyon-bpf under callgrind failed: {err}");
        }
        let instructions: f64 = err
            .lines()
            .find_map(|l| {
                l.split_once("Collected :")
                    .map(|(_, n)| n.trim().to_string())
            })
            .and_then(|n| n.parse().ok())
            .with_context(|| format!("callgrind printed no count: {err}"))?;
        // The record handler's part (inclusive), from the same count.
        let annotated = crate::output_of(
            Command::new("callgrind_annotate")
                .args(["--inclusive=yes", "--threshold=100"])
                .arg(dir.join(format!("callgrind-{secs}.out"))),
        );
        let handler: f64 = annotated
            .lines()
            .find(|l| l.contains("Collector::handle_in ["))
            .and_then(|l| l.split_whitespace().next())
            .and_then(|n| n.replace(',', "").parse().ok())
            .with_context(|| "callgrind_annotate shows no Collector::handle_in")?;
        let samples = f(&meta(&out)?["samples"]);
        runs.push((samples, instructions, handler));
    }
    let (s0, i0, h0) = runs[0];
    let (s1, i1, h1) = runs[1];
    let more = (s1 - s0).max(1.0);
    let (marginal, handler) = ((i1 - i0) / more, (h1 - h0) / more);
    let md = vec![
        "\n## 11. User-space instructions per sample (callgrind)\n".to_string(),
        "`-p` on one 3.12 process (the benchmark's work in its main thread, two threads sleeping \
         2 ms at a time beside it), wall mode, 1 kHz, counted by `valgrind --tool=callgrind`: \
         the whole process, and the record handler (`Collector::handle_in`, inclusive) within \
         it. *One more sample* is the difference between a 16 s and an 8 s run over the \
         difference of their samples: start-up and the first reads of each library's symbols \
         and unwind tables cancel out. Counts, not times: no other load on the machine moves \
         them, but the samples themselves differ from run to run (their stacks, the sleeping \
         threads' captures), and so does the figure: by up to 15% between runs of one build.\n"
            .to_string(),
        "| run | samples | instructions, whole process | of which handling records |\n|---|---|---|---|"
            .to_string(),
        format!("| 8 s | {s0:.0} | {i0:.0} | {h0:.0} |"),
        format!("| 16 s | {s1:.0} | {i1:.0} | {h1:.0} |"),
        format!("| one more sample | | **{marginal:.0}** | **{handler:.0}** |"),
    ];
    let raw = json!({
        "runs": runs
            .iter()
            .map(|(s, i, h)| json!({"samples": s, "instructions": i, "handler": h}))
            .collect::<Vec<_>>(),
        "per_sample": marginal,
        "handler_per_sample": handler,
    });
    Ok((md, raw))
}
