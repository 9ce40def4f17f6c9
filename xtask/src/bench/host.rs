//! Sections 7 and 8: a mixed host, and idle processes and programs started beside the
//! profiled ones.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde_json::{json, Value};

use super::*;

/// Section 7: a host of busy processes beside processes that sleep and wake thousands of times a second.
pub(super) fn mixed(b: &Bench) -> Result<Section> {
    let Bench {
        tachyon,
        dir,
        py,
        busy,
        pythons: _,
        ..
    } = b;
    let mut md = Vec::new();
    let mut raw = serde_json::Map::new();
    let sleepy = dir.join("bench_sleepy.py");
    std::fs::write(&sleepy, SLEEPY)?;
    md.push("\n## 7. A mixed host (1 kHz, 20 s)\n".into());
    md.push(
        "2 busy Python processes and 2 processes of 4 threads that each sleep 500 µs in a loop \
         (about 7,000 wake-ups a second per process), `--all-pythons` for 20 s at 1 kHz, median of \
         3. CPU per sample, all included: the profiler's whole process from start to end plus the \
         BPF programs' run time. *Steady*: what it costs once started, as when it is left on: its \
         process CPU from 3 s to 18 s into the run (from `/proc`, in 10 ms ticks) at the run's \
         sample rate, plus the BPF time per sample. Targets: at most 10 µs per sample, BPF at most \
         3 µs of it.\n"
            .into(),
    );
    md.push(
        "| samples | user µs/sample | BPF µs/sample | all µs/sample | steady µs/sample (user + BPF) | scheduler records | peak RSS MiB |\n|---|---|---|---|---|---|---|"
            .into(),
    );
    let mut mixed = Vec::new();
    for _ in 0..3 {
        eprintln!("bench: mixed host");
        let mut kids = spawn_busy(py, busy, 2, 26)?;
        kids.extend(spawn_busy(py, &sleepy, 2, 26)?);
        std::thread::sleep(Duration::from_millis(500));
        let out = dir.join("mixed.json");
        let child = Command::new(tachyon)
            .args(["--all-pythons", "-q", "-r", "1000", "-d", "20", "-o"])
            .arg(&out)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()?;
        // Start-up is over well within 3 s, and the profile is written after 20.
        std::thread::sleep(Duration::from_secs(3));
        let from = reading(child.id());
        std::thread::sleep(Duration::from_secs(15));
        let to = reading(child.id());
        let cpu = finish_measured(child);
        reap(kids);
        mixed.push(with_steady(with_process_cpu(meta(&out)?, cpu?), from, to)?);
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
    // The steady CPU rate over the run's sample rate.
    let steady_user = median(
        mixed
            .iter()
            .map(|m| {
                let cpu_share = f(&m["profilerCost"]["steadyCpuMs"])
                    / f(&m["profilerCost"]["steadyMs"]).max(1.0);
                let samples_per_ms = f(&m["samples"]) / f(&m["durationMs"]).max(1.0);
                1000.0 * cpu_share / samples_per_ms.max(1e-9)
            })
            .collect(),
    );
    let counter = |m: &Value, name: &str| f(&m["bpfCounters"][name]);
    md.push(format!(
        "| {:.0} | {mu:.2} | {mb:.2} | {:.2} | {:.2} ({steady_user:.2} + {mb:.2}) | {:.0} | {:.1} |",
        median(mixed.iter().map(|m| f(&m["samples"])).collect()),
        mu + mb,
        steady_user + mb,
        median(mixed.iter().map(|m| counter(m, "schedRecords")).collect()),
        median(
            mixed
                .iter()
                .map(|m| f(&m["profilerCost"]["peakRssKiB"]) / 1024.0)
                .collect()
        ),
    ));
    if let Some(line) = bpf_by_program(&mixed) {
        md.push(line);
    }
    raw.insert("mixed".into(), json!(mixed));
    Ok((md, Value::Object(raw)))
}

/// Where the BPF time of the runs goes: per program, per sample and per run (medians of the runs).
fn bpf_by_program(mixed: &[Value]) -> Option<String> {
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
        for m in mixed {
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
    (!by_program.is_empty()).then(|| format!("\nBPF time by program: {}.", by_program.join("; ")))
}

/// Section 8: the profiler's CPU beside idle processes and a shell starting programs.
pub(super) fn idle(b: &Bench) -> Result<Section> {
    let Bench {
        tachyon,
        dir,
        py,
        busy,
        pythons: _,
        ..
    } = b;
    let mut md = Vec::new();
    let mut raw = serde_json::Map::new();
    let total_ms =
        |m: &Value| f(&m["profilerCost"]["processCpuMs"]) + f(&m["profilerCost"]["bpfMs"]);
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
            let short = all_pythons_run(tachyon, py, busy, &out, 1, 1000, SHORT)?;
            let long = all_pythons_run(tachyon, py, busy, &out, 1, 1000, LONG)?;
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
    Ok((md, Value::Object(raw)))
}
