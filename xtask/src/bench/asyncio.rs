//! Section 10: asyncio with 10,000 live tasks, under tachyon-bpf and CPython's sampler with
//! `--async-aware`.

use std::path::Path;
use std::process::Command;

use anyhow::{bail, Result};
use serde_json::{json, Value};

use super::*;

/// The asyncio service of section 10: `n` tasks (named `conn-N`), each handling "requests" in a
/// loop: a little CPU, then an I/O wait of 5-50 ms in `io_wait`. Prints requests per second.
const ASYNC_WORKLOAD: &str = include_str!("workloads/asyncio_service.py");

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
    let run_secs: f64 = secs.parse()?;
    let results = interleaved(
        &format!("asyncio with {tasks} tasks"),
        &configs,
        ASYNC_ROUNDS,
        |(name, run, is_ours)| {
            let rate = run()?;
            let (cost, stacks) = if *is_ours {
                let (cost, stacks) = our_cost(&out)?;
                (Some(cost), Some(stacks))
            } else if name.starts_with("CPython") {
                (None, Some(folded_count(&sampler_out)? / run_secs))
            } else {
                (None, None)
            };
            Ok((rate, cost, stacks))
        },
    )?;
    let names: Vec<(&str, bool)> = configs.iter().map(|(n, _, ours)| (*n, *ours)).collect();
    report(tasks, secs, &names, &results)
}

/// A tachyon-bpf run's own CPU (µs per sample, ms per second of the run) and the stacks it
/// recorded a second: timer samples, and with `all` the suspended tasks' stacks.
fn our_cost(out: &Path) -> Result<((f64, f64), f64)> {
    let m = meta(out)?;
    let cost = &m["profilerCost"];
    let cpu_ms = f(&cost["userCpuMs"]) + f(&cost["bpfMs"]);
    let dur_s = f(&m["durationMs"]) / 1000.0;
    Ok((
        (f(&cost["cpuUsPerSample"]), cpu_ms / dur_s),
        (f(&m["samples"]) + f(&m["asyncSuspendedSamples"])) / dur_s,
    ))
}

/// The stacks CPython's sampler wrote: the folded counts (in `all` mode, one per task per
/// sample).
fn folded_count(path: &Path) -> Result<f64> {
    Ok(read_lossy(path)?
        .lines()
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum())
}

/// One run: the requests a second, tachyon-bpf's cost (µs per sample, ms per second) and the
/// stacks recorded a second.
type AsyncRun = (f64, Option<(f64, f64)>, Option<f64>);

/// The section's text and table, and the raw numbers.
fn report(
    tasks: &str,
    secs: &str,
    names: &[(&str, bool)],
    results: &[Vec<AsyncRun>],
) -> Result<(Vec<String>, Value)> {
    let rates: Vec<Vec<f64>> = results
        .iter()
        .map(|r| r.iter().map(|x| x.0).collect())
        .collect();
    let costs: Vec<Vec<(f64, f64)>> = results
        .iter()
        .map(|r| r.iter().filter_map(|x| x.1).collect())
        .collect();
    let sample_rates: Vec<Vec<f64>> = results
        .iter()
        .map(|r| r.iter().filter_map(|x| x.2).collect())
        .collect();
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
    for (i, (name, is_ours)) in names.iter().enumerate() {
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
