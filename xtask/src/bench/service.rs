//! Section 12: the cost of staying on, on what a fleet runs: a threaded WSGI service (gunicorn
//! `gthread`, 2 workers x 8 threads, Flask, pyenv 3.12) under HTTP load from `wrk` on loopback,
//! alone and under tachyon-bpf `--all-pythons` (wall and cpu mode, at the continuous default of
//! 49 Hz and at 1 kHz) and py-spy at its default rate, in interleaved rounds.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use super::*;

/// The service: JSON rendering, hashing, a lock and a 2 ms sleep per request.
const APP: &str = include_str!("workloads/service_app.py");
/// What the service's virtual environment holds, pinned.
const PACKAGES: [&str; 2] = ["flask==3.1.3", "gunicorn==27.0.1"];
const PORT: &str = "18765";
/// Rounds (medians reported) and the load's length in each run, in seconds.
const ROUNDS: usize = 5;
const SECS: u64 = 20;
/// A run's first seconds are start-up (the BPF programs' verification, discovery, kernel
/// symbols): the steady-state cost is measured after them.
const WARM: Duration = Duration::from_secs(3);

/// The service's venv under `.tools/service-venv` (idempotent) and `wrk` (Debian's package).
pub(super) fn setup(tools: &Path) -> Result<PathBuf> {
    let venv = tools.join("service-venv");
    let gunicorn = venv.join("bin/gunicorn");
    let want = PACKAGES.join(" ");
    let stamp = venv.join("tachyon-packages");
    if std::fs::read_to_string(&stamp).ok().as_deref() != Some(want.as_str()) {
        eprintln!("xtask: creating {} ({want})", venv.display());
        crate::run(
            Command::new(workload_python(tools)?)
                .args(["-m", "venv", "--clear"])
                .arg(&venv),
        )?;
        crate::run(
            Command::new(venv.join("bin/pip"))
                .args(["install", "-q", "--disable-pip-version-check"])
                .args(PACKAGES),
        )?;
        std::fs::write(&stamp, &want)?;
    }
    let has_wrk = Command::new("dpkg")
        .args(["-s", "wrk"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !has_wrk {
        eprintln!("xtask: installing wrk");
        crate::run(
            Command::new("apt-get")
                .env("DEBIAN_FRONTEND", "noninteractive")
                .args(["install", "-y", "-q", "--no-install-recommends", "wrk"]),
        )?;
    }
    Ok(gunicorn)
}

/// The service's application, where `Service::start` runs it from.
pub(super) fn write_app(dir: &Path) -> Result<()> {
    Ok(std::fs::write(dir.join("bench_service_app.py"), APP)?)
}

/// The service, up and answering.
pub(super) struct Service {
    child: Child,
}

impl Service {
    pub(super) fn start(gunicorn: &Path, dir: &Path) -> Result<Service> {
        let child = Command::new(gunicorn)
            .args(["-k", "gthread", "-w", "2", "--threads", "8", "-b"])
            .arg(format!("127.0.0.1:{PORT}"))
            .arg("--chdir")
            .arg(dir)
            .args(["--log-level", "warning", "bench_service_app:app"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting gunicorn")?;
        let s = Service { child };
        let t0 = Instant::now();
        while std::net::TcpStream::connect(format!("127.0.0.1:{PORT}")).is_err() {
            if t0.elapsed() > Duration::from_secs(20) {
                bail!("the service did not answer within 20 s");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        // Both workers booted.
        std::thread::sleep(Duration::from_secs(2));
        Ok(s)
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        // SIGTERM: gunicorn stops its workers.
        // SAFETY: our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}

/// The service's load: `wrk` on 2 threads with 32 connections for `secs`.
pub(super) fn wrk(secs: u64) -> Command {
    let mut c = Command::new("wrk");
    c.args(["-t2", "-c32"])
        .arg(format!("-d{secs}s"))
        .arg(format!("http://127.0.0.1:{PORT}/"));
    c
}

/// The requests a second `wrk` printed.
pub(super) fn wrk_rate(out: &str) -> Result<f64> {
    out.lines()
        .find_map(|l| l.strip_prefix("Requests/sec:"))
        .and_then(|v| v.trim().parse().ok())
        .with_context(|| format!("wrk printed no rate: {out}"))
}

/// Requests per second under `wrk` for `SECS`.
fn load() -> Result<f64> {
    let o = wrk(SECS).output().context("running wrk")?;
    wrk_rate(&String::from_utf8_lossy(&o.stdout))
}

/// One profiled run's numbers.
#[derive(Default, Clone)]
struct Cost {
    /// The profiler's process CPU after start-up, over the load (% of one CPU).
    steady_pct: f64,
    /// BPF run time over the run (% of one CPU; nothing runs before the programs attach).
    bpf_pct: f64,
    /// Start to end, start-up and the writing of the profile included (% of one CPU).
    all_pct: f64,
    meta: Value,
}

/// The run's numbers as tachyon-bpf's summary prints them, under the names of the profile's
/// `meta.tachyon` (a pprof profile carries none): its duration, samples, BPF time by program,
/// BPF counters and peak RSS. A run to a file and a continuous run (whose first line counts
/// the intervals' samples) alike.
pub(super) fn summary_meta(stderr: &str) -> Result<Value> {
    let line = |prefix: &str| {
        stderr
            .lines()
            .find_map(|l| l.strip_prefix("tachyon-bpf: ")?.strip_prefix(prefix))
            .with_context(|| format!("no `{prefix}` in the summary: {stderr}"))
    };
    let num = |s: &str| -> Result<f64> {
        s.trim()
            .parse::<f64>()
            .with_context(|| format!("{s:?} in the summary"))
    };
    // "24.00 s, 1667 samples on CPU ..." or, continuous, "600.00 s, 48123 samples (80/s ...)
    // in 11 intervals ..."
    let (secs, samples) = stderr
        .lines()
        .filter_map(|l| l.strip_prefix("tachyon-bpf: "))
        .filter(|l| l.contains(" samples on CPU ") || l.contains(" intervals, lost "))
        .find_map(|l| {
            let (secs, rest) = l.split_once(" s, ")?;
            Some((secs, rest.split_once(" samples ")?.0))
        })
        .with_context(|| format!("no duration and samples in the summary: {stderr}"))?;
    let duration_ms = num(secs)? * 1e3;
    // "tachyon_sample 39.1 ms (2028 runs, 19.30 µs each), ..."
    let mut programs = serde_json::Map::new();
    let mut bpf_ms = 0.0;
    for p in line("BPF time by program: ")?.split("), ") {
        let (name, rest) = p.split_once(' ').context("a program's time")?;
        let (ms, rest) = rest.split_once(" ms (").context("a program's ms")?;
        let runs = rest.split_once(" runs").context("a program's runs")?.0;
        let ms = num(ms)?;
        bpf_ms += ms;
        programs.insert(name.into(), json!({"ms": ms, "runs": num(runs)?}));
    }
    // "records 823, lost 0, ..."
    let mut counters = serde_json::Map::new();
    for c in line("BPF counters: ")?.split(", ") {
        let (name, n) = c.rsplit_once(' ').context("a counter")?;
        counters.insert(name.into(), json!(num(n)?));
    }
    // "... peak RSS 96.0 MiB"
    let rss = line("profiler cost: ")?
        .rsplit_once("peak RSS ")
        .and_then(|(_, r)| r.strip_suffix(" MiB"))
        .context("the summary's peak RSS")?;
    Ok(json!({
        "durationMs": duration_ms,
        "samples": num(samples)?,
        "profilerCost": {"bpfMs": bpf_ms, "peakRssKiB": num(rss)? * 1024.0},
        "bpfPrograms": programs,
        "bpfCounters": counters,
    }))
}

/// Runs the load with `profiler` (spawned, then stopped by SIGINT) beside it; `ours`: it is
/// tachyon-bpf, whose summary says its BPF part.
fn profiled(mut cmd: Command, ours: bool) -> Result<(f64, Cost)> {
    let t_start = Instant::now();
    let child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting the profiler")?;
    let pid = child.id();
    std::thread::sleep(WARM);
    let (c0, t0) = reading(pid)?;
    let rps = load()?;
    let (c1, t1) = reading(pid)?;
    crate::run(Command::new("kill").args(["-INT", &pid.to_string()]))?;
    let (all, stderr) = finish_measured_with_stderr(child)?;
    let run_ms = t_start.elapsed().as_secs_f64() * 1e3;
    let meta = if ours {
        summary_meta(&stderr)?
    } else {
        Value::Null
    };
    // py-spy has no BPF part.
    let bpf_ms = meta["profilerCost"]["bpfMs"].as_f64().unwrap_or(0.0);
    let duration = meta["durationMs"].as_f64().unwrap_or(run_ms).max(1.0);
    Ok((
        rps,
        Cost {
            steady_pct: 100.0 * (c1 - c0) / (t1 - t0).as_secs_f64() / 1e3,
            bpf_pct: 100.0 * bpf_ms / duration,
            all_pct: 100.0 * (all + bpf_ms) / run_ms,
            meta,
        },
    ))
}

/// Section 11's second workload: this section's service under load, `--all-pythons` in cpu mode
/// at the always-on rate (49 Hz) for 15 s and for 45 s under callgrind, each on a service
/// started for it: (samples, instructions of the whole process, of the record handler) a run.
pub fn callgrind_service(tachyon: &Path, tools: &Path, dir: &Path) -> Result<Vec<(f64, f64, f64)>> {
    let gunicorn = setup(tools)?;
    write_app(dir)?;
    let mut runs = Vec::new();
    for secs in [15u64, 45] {
        eprintln!("bench: callgrind, the service, {secs} s");
        let _svc = Service::start(&gunicorn, dir)?;
        // Load for longer than the run: start-up under callgrind takes some seconds more.
        let mut wrk = wrk(secs + 120)
            .stdout(Stdio::null())
            .spawn()
            .context("running wrk")?;
        let out = dir.join(format!("callgrind-service-{secs}.pb.gz"));
        let counted = super::callgrind::under_callgrind(
            tachyon,
            &[
                "--all-pythons",
                "-m",
                "cpu",
                "-r",
                "49",
                "-d",
                &secs.to_string(),
                "-f",
                "pprof",
                "-o",
                &out.to_string_lossy(),
            ],
            dir,
            &format!("service-{secs}"),
        );
        let _ = wrk.kill();
        let _ = wrk.wait();
        let (instructions, handler, stderr) = counted?;
        runs.push((f(&summary_meta(&stderr)?["samples"]), instructions, handler));
    }
    Ok(runs)
}

/// Section 12; the report's lines and raw numbers.
pub fn service(
    tachyon: &Path,
    tools: &Path,
    py_spy: &Path,
    dir: &Path,
) -> Result<(Vec<String>, Value)> {
    let gunicorn = setup(tools)?;
    write_app(dir)?;
    let out = |name: &str| dir.join(format!("service-{name}.pb.gz"));
    // Each run on a service started for it: one left running drifts between rounds (its
    // connections and threads settle differently, and its switch rate with them).
    let gunicorn = &gunicorn;
    let tachyon_run = |mode: &'static str, rate: &'static str| {
        let name = format!("{mode}-{rate}");
        move || -> Result<(f64, Cost)> {
            let _svc = Service::start(gunicorn, dir)?;
            let mut c = Command::new(tachyon);
            // pprof, what a fleet pushes (the systemd unit's and the DaemonSet's format); the
            // numbers come from the summary.
            c.args(["--all-pythons", "-f", "pprof", "-r", rate, "-m", mode, "-o"])
                .arg(out(&name));
            profiled(c, true)
        }
    };
    let spy = || -> Result<(f64, Cost)> {
        let svc = Service::start(gunicorn, dir)?;
        let mut c = Command::new(py_spy);
        c.args(["record", "--pid", &svc.pid().to_string()])
            .args([
                "--subprocesses",
                "--nonblocking",
                "--idle",
                "-f",
                "raw",
                "-o",
            ])
            .arg(dir.join("service-pyspy.txt"));
        profiled(c, false)
    };
    let alone = || -> Result<(f64, Cost)> {
        let _svc = Service::start(gunicorn, dir)?;
        std::thread::sleep(WARM);
        Ok((load()?, Cost::default()))
    };
    type Run<'a> = Box<dyn Fn() -> Result<(f64, Cost)> + 'a>;
    let configs: Vec<(&str, Run)> = vec![
        ("alone", Box::new(alone)),
        (
            "tachyon-bpf --all-pythons -m wall -r 49 (the continuous default)",
            Box::new(tachyon_run("wall", "49")),
        ),
        (
            "tachyon-bpf --all-pythons -m cpu -r 49",
            Box::new(tachyon_run("cpu", "49")),
        ),
        (
            "tachyon-bpf --all-pythons -m wall -r 1000",
            Box::new(tachyon_run("wall", "1000")),
        ),
        (
            "tachyon-bpf --all-pythons -m cpu -r 1000",
            Box::new(tachyon_run("cpu", "1000")),
        ),
        (
            "py-spy record --subprocesses --nonblocking --idle (100 Hz)",
            Box::new(spy),
        ),
    ];
    let runs = interleaved(
        &format!("web service, {SECS} s runs"),
        &configs,
        ROUNDS,
        |(_, run)| run(),
    )?;
    let mut md = vec![
        "\n## 12. A web service, always on\n".to_string(),
        format!(
            "A threaded WSGI service (gunicorn `gthread`, 2 workers x 8 threads, Flask; pyenv \
             3.12; each request renders JSON, hashes it, takes a lock and sleeps 2 ms) under \
             `wrk -t2 -c32` on loopback for {SECS} s, alone and under each profiler attached to \
             the running service (started anew for each run; tachyon-bpf writes pprof, the format a \
             fleet pushes, and its numbers are its summary's), {ROUNDS} interleaved rounds \
             (medians). *Steady* is the \
             profiler's process CPU after its first {} s plus its BPF programs' run time, as a \
             share of one CPU: what staying on costs. *All included* adds start-up and the \
             writing of the profile over the whole run. Targets (issue 45): at 49 Hz at most 2% \
             (wall) and 1% (cpu); at 1 kHz at most 8% and 4%; throughput at least 0.99x; \
             `tachyon_sample` at most 5 µs a run; off-CPU records a second at most threads x \
             rate; peak RSS under 100 MiB. *Switches/s*: the host's context switches, as the \
             program at each switch counted them (wall mode: cpu mode attaches none); *BPF µs a \
             switch*: the run time of both programs that run at a switch (switch-out \
             accounting, switch-in decision and captures) over them.\n",
            WARM.as_secs()
        ),
        "| profiler | requests/s | ratio | steady CPU % (user + BPF) | all included % | tachyon_sample µs | off-CPU captures/s | sched records/s | switches/s | BPF µs a switch | peak RSS MiB |\n|---|---|---|---|---|---|---|---|---|---|---|".to_string(),
    ];
    let names: Vec<&str> = configs.iter().map(|(n, _)| *n).collect();
    let raw = service_rows(&mut md, &names, &runs);
    Ok((md, Value::Array(raw)))
}

/// The context switches a run saw (the runs of the program at `sched_switch`) and the run time of
/// every program that runs at a switch (ms): the switch-out accounting and the switch-in
/// decision, of either program set.
fn switch_cost(meta: &Value) -> (f64, f64) {
    let Some(programs) = meta["bpfPrograms"].as_object() else {
        return (0.0, 0.0);
    };
    let mut runs = 0.0;
    let mut ms = 0.0;
    for (name, p) in programs {
        if !name.starts_with("tachyon_switch") {
            continue;
        }
        ms += f(&p["ms"]);
        if name == "tachyon_switch" || name == "tachyon_switch_compat" {
            runs += f(&p["runs"]);
        }
    }
    (runs, ms)
}

/// The section's rows: each configuration's throughput and, for the profilers, their cost.
fn service_rows(md: &mut Vec<String>, names: &[&str], runs: &[Vec<(f64, Cost)>]) -> Vec<Value> {
    let mut raw = Vec::new();
    let alone = median(runs[0].iter().map(|r| r.0).collect());
    for (i, name) in names.iter().enumerate() {
        let rs = &runs[i];
        let m = |g: &dyn Fn(&(f64, Cost)) -> f64| median(rs.iter().map(g).collect());
        let rps = m(&|r| r.0);
        let user = m(&|r| r.1.steady_pct);
        let bpf = m(&|r| r.1.bpf_pct);
        let all = m(&|r| r.1.all_pct);
        let per_s =
            |key: &str| {
                m(&|r| {
                    f(&r.1.meta["bpfCounters"][key]) / (f(&r.1.meta["durationMs"]) / 1e3).max(1e-3)
                })
            };
        let sample_us = m(&|r| {
            let p = &r.1.meta["bpfPrograms"]["tachyon_sample"];
            1000.0 * f(&p["ms"]) / f(&p["runs"]).max(1.0)
        });
        let rss = m(&|r| f(&r.1.meta["profilerCost"]["peakRssKiB"]) / 1024.0);
        // What wall mode pays at every context switch of the host (cpu mode attaches nothing).
        let switches_per_s =
            m(&|r| switch_cost(&r.1.meta).0 / (f(&r.1.meta["durationMs"]) / 1e3).max(1e-3));
        let switch_us = m(&|r| {
            let (runs, ms) = switch_cost(&r.1.meta);
            1000.0 * ms / runs.max(1.0)
        });
        let cell = |v: f64, digits: usize| {
            if i == 0 || (v == 0.0 && name.starts_with("py-spy")) {
                "".to_string()
            } else {
                format!("{v:.digits$}")
            }
        };
        let tachyon_only = |v: f64, d: usize| {
            if name.starts_with("tachyon") {
                cell(v, d)
            } else {
                String::new()
            }
        };
        md.push(format!(
            "| {name} | {rps:.0} | {:.3}x | {} | {} | {} | {} | {} | {} | {} | {} |",
            rps / alone,
            if i == 0 {
                String::new()
            } else if name.starts_with("py-spy") {
                format!("{user:.2}")
            } else {
                format!("{:.2} ({user:.2} + {bpf:.2})", user + bpf)
            },
            cell(all, 2),
            tachyon_only(sample_us, 2),
            tachyon_only(per_s("switchCaptures"), 0),
            tachyon_only(per_s("schedRecords"), 0),
            // cpu mode: no program ran at the switches, so none were counted.
            if switches_per_s > 0.0 {
                tachyon_only(switches_per_s, 0)
            } else {
                String::new()
            },
            if switches_per_s > 0.0 {
                tachyon_only(switch_us, 2)
            } else {
                String::new()
            },
            tachyon_only(rss, 1),
        ));
        raw.push(json!({
            "profiler": name, "requests_per_s": rps, "ratio": rps / alone,
            "steady_user_pct": user, "bpf_pct": bpf, "all_included_pct": all,
            "tachyon_sample_us": sample_us, "peak_rss_mib": rss,
            "switches_per_s": switches_per_s, "bpf_us_per_switch": switch_us,
            "runs": rs.iter().map(|r| json!({"rps": r.0, "steady_pct": r.1.steady_pct, "bpf_pct": r.1.bpf_pct, "all_pct": r.1.all_pct, "meta": r.1.meta})).collect::<Vec<_>>(),
        }));
    }
    raw
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_reads_as_meta() {
        let stderr = "tachyon-bpf: kernel symbols from /proc/kallsyms\n\
            tachyon-bpf: 24.00 s, 1667 samples on CPU (69/s at 49 Hz on 2 CPUs) and 0 off-CPU captures, lost 0\n\
            tachyon-bpf: profiler cost: 253.6 µs CPU per sample (230.0 user space, 23.5 BPF), 423 ms CPU in all, peak RSS 96.0 MiB\n\
            tachyon-bpf: BPF time by program: tachyon_sample 39.1 ms (2028 runs, 19.30 µs each), tachyon_fork 0.5 ms (19 runs, 1.85 µs each)\n\
            tachyon-bpf: BPF counters: records 1667, lost 0, switchCaptures 3, schedRecords 0\n";
        let m = summary_meta(stderr).unwrap();
        assert_eq!(m["durationMs"], json!(24000.0));
        assert_eq!(m["samples"], json!(1667.0));
        assert_eq!(m["profilerCost"]["bpfMs"], json!(39.6));
        assert_eq!(m["profilerCost"]["peakRssKiB"], json!(96.0 * 1024.0));
        assert_eq!(
            m["bpfPrograms"]["tachyon_sample"],
            json!({"ms": 39.1, "runs": 2028.0})
        );
        assert_eq!(m["bpfCounters"]["switchCaptures"], json!(3.0));
        assert!(summary_meta("tachyon-bpf: error: no such process\n").is_err());
        let continuous = "tachyon-bpf: 25.00 s, 2021 samples (81/s at 49 Hz on 2 CPUs) in 3 intervals, lost 0 (cpu0 0, cpu1 0)\n\
            tachyon-bpf: profiler cost: 342.4 µs CPU per sample (191.6 user space, 150.8 BPF), 692 ms CPU in all, peak RSS 53.2 MiB\n\
            tachyon-bpf: BPF time by program: tachyon_switch 172.4 ms (374097 runs, 0.46 µs each), tachyon_sample 28.8 ms (2276 runs, 12.66 µs each)\n\
            tachyon-bpf: BPF counters: records 2505, lost 0, switchCaptures 484\n\
            tachyon-bpf: 3 interval profiles in /tmp/x (2021 samples)\n";
        let m = summary_meta(continuous).unwrap();
        assert_eq!(m["durationMs"], json!(25000.0));
        assert_eq!(m["samples"], json!(2021.0));
        assert!((f(&m["profilerCost"]["bpfMs"]) - 201.2).abs() < 1e-9);
    }

    #[test]
    fn the_cost_of_a_switch_is_both_programs_over_the_switches() {
        let meta = json!({"bpfPrograms": {
            "tachyon_sample": {"ms": 30.0, "runs": 2000.0},
            "tachyon_switch": {"ms": 100.0, "runs": 200000.0},
            "tachyon_switch_in": {"ms": 80.0, "runs": 200010.0},
        }});
        assert_eq!(switch_cost(&meta), (200000.0, 180.0));
        let compat = json!({"bpfPrograms": {
            "tachyon_switch_compat": {"ms": 10.0, "runs": 1000.0},
            "tachyon_switch_in_compat": {"ms": 5.0, "runs": 1000.0},
        }});
        assert_eq!(switch_cost(&compat), (1000.0, 15.0));
        assert_eq!(
            switch_cost(&json!({"bpfPrograms": {"tachyon_sample": {"ms": 1.0, "runs": 1.0}}})),
            (0.0, 0.0)
        );
    }
}
