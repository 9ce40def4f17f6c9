//! Section 13: staying on for 10 minutes, as a fleet host runs the profiler. Section 12's web
//! service under load, and tachyon-bpf with the systemd unit's own options
//! (`contrib/systemd/tachyon-bpf.default`: `--all-pythons --continuous --rotate 60s ... -f
//! pprof`), one run in wall mode (the unit's) and one in cpu mode: its whole process's CPU and
//! its BPF programs' run time over the whole run (start-up and every interval's profile
//! written included), the CPU of each minute, and its resident memory every second.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use super::service::{self, Service};
use super::*;

/// The unit's options file, whose `TACHYON_BPF_OPTS` the runs use.
const UNIT_DEFAULT: &str = include_str!("../../../contrib/systemd/tachyon-bpf.default");

/// A run's length, seconds: the "steady state over 10 minutes". `TACHYON_BENCH_ALWAYS_ON_S`
/// shortens it to try the section out (the report says the length used).
const SECS: u64 = 600;

/// The unit's options, with the output directory replaced by `out` and without `-q` (the run's
/// numbers are its summary's).
fn unit_options(out: &Path) -> Result<Vec<String>> {
    let line = UNIT_DEFAULT
        .lines()
        .find_map(|l| l.trim().strip_prefix("TACHYON_BPF_OPTS="))
        .context("no TACHYON_BPF_OPTS in the unit's options file")?;
    let mut opts: Vec<String> = line
        .trim_matches('"')
        .split_whitespace()
        .filter(|o| *o != "-q" && *o != "--quiet")
        .map(String::from)
        .collect();
    let at = opts
        .iter()
        .position(|o| o == "--output-dir")
        .context("the unit's options name no --output-dir")?;
    let Some(dir) = opts.get_mut(at + 1) else {
        bail!("the unit's --output-dir has no value");
    };
    *dir = out.to_string_lossy().into_owned();
    if !opts.iter().any(|o| o == "--continuous") {
        bail!("the unit's options are not a continuous run: {opts:?}");
    }
    Ok(opts)
}

/// One run's numbers.
struct Run {
    mode: &'static str,
    secs: f64,
    rps: f64,
    /// Process CPU (wait4) plus BPF run time over the run, % of one CPU.
    all_pct: f64,
    bpf_pct: f64,
    /// The process's CPU in each whole minute (% of one CPU), BPF not included.
    minutes: Vec<f64>,
    /// RSS each second (MiB).
    rss: Vec<f64>,
    intervals: usize,
    meta: Value,
}

/// `wrk` loading the service; stopped if the run fails before the load ends.
struct Load(std::process::Child);

impl Load {
    /// Waits for the load's end: its requests a second.
    fn rate(mut self) -> Result<f64> {
        let mut out = String::new();
        if let Some(mut o) = self.0.stdout.take() {
            o.read_to_string(&mut out)?;
        }
        self.0.wait()?;
        service::wrk_rate(&out)
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One run of `secs` in `mode` on a service started for it.
fn run(tachyon: &Path, gunicorn: &Path, dir: &Path, mode: &'static str, secs: u64) -> Result<Run> {
    let _svc = Service::start(gunicorn, dir)?;
    let out = dir.join(format!("always-on-{mode}"));
    let _ = std::fs::remove_dir_all(&out);
    let wrk = Load(
        service::wrk(secs + 2)
            .stdout(Stdio::piped())
            .spawn()
            .context("running wrk")?,
    );
    let t_start = Instant::now();
    let child = Command::new(tachyon)
        .args(unit_options(&out)?)
        .args(["-m", mode])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting tachyon-bpf")?;
    let pid = child.id();
    // Read every second; a profiler that fails meanwhile is reported with what it printed.
    let watch = || -> Result<(Vec<f64>, Vec<f64>)> {
        let (mut rss, mut minutes) = (Vec::new(), Vec::new());
        let mut minute_start = reading(pid)?;
        for s in 1..=secs {
            let next = t_start + Duration::from_secs(s);
            std::thread::sleep(next.saturating_duration_since(Instant::now()));
            rss.push(crate::soak::rss_mib(pid).context("the profiler's RSS")?);
            if s % 60 == 0 {
                let now = reading(pid)?;
                minutes.push(
                    100.0 * (now.0 - minute_start.0)
                        / now.1.duration_since(minute_start.1).as_secs_f64()
                        / 1e3,
                );
                minute_start = now;
            }
        }
        Ok((rss, minutes))
    };
    let watched = watch();
    crate::run(Command::new("kill").args(["-INT", &pid.to_string()]))?;
    let ended = finish_measured_with_stderr(child);
    let run_ms = t_start.elapsed().as_secs_f64() * 1e3;
    // A failed run ends here, its load stopped (`Load`'s drop), not waited for.
    let (all_cpu_ms, stderr) = ended?;
    let (rss, minutes) = watched?;
    let rps = wrk.rate()?;
    let meta = service::summary_meta(&stderr)?;
    let bpf_ms = f(&meta["profilerCost"]["bpfMs"]);
    let intervals = std::fs::read_dir(&out)
        .with_context(|| format!("reading {}", out.display()))?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".pb.gz"))
        .count();
    if intervals == 0 {
        bail!(
            "the {mode} run wrote no interval profile into {}",
            out.display()
        );
    }
    Ok(Run {
        mode,
        secs: run_ms / 1e3,
        rps,
        all_pct: 100.0 * (all_cpu_ms + bpf_ms) / run_ms,
        bpf_pct: 100.0 * bpf_ms / run_ms,
        minutes,
        rss,
        intervals,
        meta,
    })
}

/// Section 13; the report's lines and raw numbers.
pub fn always_on(tachyon: &Path, tools: &Path, dir: &Path) -> Result<(Vec<String>, Value)> {
    let gunicorn = service::setup(tools)?;
    service::write_app(dir)?;
    let secs = std::env::var("TACHYON_BENCH_ALWAYS_ON_S")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(SECS);
    let opts = unit_options(Path::new("DIR"))?.join(" ");
    let mut runs = Vec::new();
    for mode in ["wall", "cpu"] {
        eprintln!("bench: always on, the unit's options in {mode} mode, {secs} s");
        runs.push(run(tachyon, &gunicorn, dir, mode, secs)?);
    }
    let mut md = vec![
        format!("\n## 13. The web service, {} minutes as the unit runs it\n", secs as f64 / 60.0),
        format!(
            "Section 12's service under the same load, and tachyon-bpf with the systemd unit's \
             options (`{opts} -m MODE`: the continuous default of 49 Hz, a pprof profile a \
             minute) for {secs} s, on a service started for each run; the peers are in section \
             12, of this same benchmark run. *All included*: the profiler's whole process CPU \
             (`wait4`: start-up and every interval's profile written) plus its BPF programs' \
             run time, over the run. *Minute by minute*: the process's CPU in each whole minute \
             (BPF not included), first minute, then the lowest and highest of the others. *RSS*: \
             read every second; *growth* from the end of the first minute to the end. Targets \
             (issue 45): all included at most 2% (wall) and 1% (cpu) of one CPU over 10 \
             minutes; peak RSS under 100 MiB, and flat.\n"
        ),
        "| mode | s | requests/s | intervals written | all included % (user + BPF) | minute by minute % | tachyon_sample µs | off-CPU captures/s | peak RSS MiB | RSS growth after minute 1, MiB |\n|---|---|---|---|---|---|---|---|---|---|".to_string(),
    ];
    let mut raw = Vec::new();
    for r in &runs {
        let p = &r.meta["bpfPrograms"]["tachyon_sample"];
        let sample_us = 1000.0 * f(&p["ms"]) / f(&p["runs"]).max(1.0);
        let captures = f(&r.meta["bpfCounters"]["switchCaptures"]) / r.secs.max(1e-3);
        let peak = r.rss.iter().copied().fold(0.0, f64::max);
        let after_first = r.rss.get(59).or(r.rss.first()).copied().unwrap_or(0.0);
        let growth = r.rss.last().copied().unwrap_or(0.0) - after_first;
        let minutes = match r.minutes.split_first() {
            None => String::new(),
            Some((first, [])) => format!("{first:.2}"),
            Some((first, rest)) => format!(
                "{first:.2}, then {:.2}-{:.2}",
                rest.iter().copied().fold(f64::INFINITY, f64::min),
                rest.iter().copied().fold(0.0, f64::max)
            ),
        };
        md.push(format!(
            "| {} | {:.0} | {:.0} | {} | {:.2} ({:.2} + {:.2}) | {minutes} | {sample_us:.2} | \
             {captures:.0} | {peak:.1} | {growth:.1} |",
            r.mode,
            r.secs,
            r.rps,
            r.intervals,
            r.all_pct,
            r.all_pct - r.bpf_pct,
            r.bpf_pct,
        ));
        raw.push(json!({
            "mode": r.mode, "secs": r.secs, "requests_per_s": r.rps, "intervals": r.intervals,
            "all_included_pct": r.all_pct, "bpf_pct": r.bpf_pct, "minutes_pct": r.minutes,
            "tachyon_sample_us": sample_us, "off_cpu_captures_per_s": captures,
            "peak_rss_mib": peak, "rss_growth_mib": growth, "rss_mib": r.rss, "meta": r.meta,
        }));
    }
    Ok((md, Value::Array(raw)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_runs_take_the_units_options() {
        let opts = unit_options(Path::new("/tmp/x")).unwrap();
        assert!(opts.contains(&"--continuous".to_string()), "{opts:?}");
        assert!(!opts.contains(&"-q".to_string()), "{opts:?}");
        let at = opts.iter().position(|o| o == "--output-dir").unwrap();
        assert_eq!(opts[at + 1], "/tmp/x");
        assert!(!opts.iter().any(|o| o.starts_with("/var/lib")), "{opts:?}");
    }
}
