//! Sections 1-5: the target's slowdown, the profiler's cost per sample, its headroom, its
//! memory and the accuracy of its merged stacks.

use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{bail, Result};
use serde_json::{json, Value};

use super::*;

/// Section 1: the workload's wall time alone and under each profiler at 1 kHz, interleaved rounds.
pub(super) fn slowdown(b: &Bench) -> Result<Section> {
    let Bench {
        tachyon,
        dir,
        py,
        py_spy,
        script,
        pin,
        pythons: _,
        ..
    } = b;
    let mut md = Vec::new();
    let mut raw = serde_json::Map::new();
    let iters = "500";
    let perf_data = dir.join("perf.data");
    let spy_out = dir.join("pyspy.txt");
    let tach_out = dir.join("slowdown.json");
    // The workload is pinned to the last CPU in every configuration (the profilers are not):
    // this machine's scheduling noise is otherwise larger than the overheads measured.
    let workload = || {
        let mut c = Command::new(py);
        c.arg(script).arg(iters).arg(pin);
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
                py_spy,
                &["record", "-r", "1000", "-f", "raw", "-o"],
                &spy_out,
            ),
        ),
        (
            "py-spy record -r 1000 --native",
            launch(
                py_spy,
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
    let times = interleaved("slowdown", &configs, ROUNDS, |(_, run)| run())?;
    let meds: Vec<f64> = times.iter().map(|t| median(t.clone())).collect();
    let base = meds[0];
    let tach_ovh = meds[1] / base - 1.0;
    let native_ovh = meds[3] / base - 1.0;
    md.push("## 1. Target slowdown (1 kHz)\n".into());
    md.push(format!(
        "Workload alone: {base:.3} s (median of {ROUNDS} interleaved rounds). Target: at most \
         1.02x, and an overhead at least 5x smaller than py-spy --native's.\n"
    ));
    let names: Vec<&str> = configs.iter().map(|(n, _)| *n).collect();
    let slow_raw = time_table(&mut md, &names, &times);
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
    Ok((md, Value::Object(raw)))
}

/// Section 2: the profiler's CPU time per 1,000 samples, all included and marginal.
pub(super) fn cost(b: &Bench) -> Result<Section> {
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
    for rate in [1000u64, 10000] {
        for procs in [1usize, 8] {
            eprintln!("bench: cost at {rate} Hz with {procs} processes");
            let (mut long, mut marginal, mut startup) = (Vec::new(), Vec::new(), Vec::new());
            for _ in 0..COST_RUNS {
                let out = dir.join("cost.json");
                let short = all_pythons_run(tachyon, py, busy, &out, procs, rate, SHORT)?;
                let m = all_pythons_run(tachyon, py, busy, &out, procs, rate, LONG)?;
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
    Ok((md, Value::Object(raw)))
}

/// Section 3: the highest per-CPU rate sustained with every CPU busy.
pub(super) fn headroom(b: &Bench) -> Result<Section> {
    let Bench {
        tachyon,
        dir,
        py,
        busy,
        pythons: _,
        ..
    } = b;
    let cpus = b.cpus;
    let mut md = Vec::new();
    let mut raw = serde_json::Map::new();
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
            py,
            busy,
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
    Ok((md, Value::Object(raw)))
}

/// Section 4: peak RSS over runs of growing length.
pub(super) fn memory(b: &Bench) -> Result<Section> {
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
        let m = all_pythons_run(tachyon, py, busy, &dir.join("memory.json"), 8, 1000, secs)?;
        let rss = f(&m["profilerCost"]["peakRssKiB"]) / 1024.0;
        md.push(format!("| {secs} s | {} | {rss:.1} |", m["samples"]));
        mem_raw.push(json!({"secs": secs, "peak_rss_mib": rss, "samples": m["samples"]}));
    }
    raw.insert("memory".into(), json!(mem_raw));
    Ok((md, Value::Object(raw)))
}

/// Section 5: the share of fully merged stacks, per interpreter.
pub(super) fn accuracy(b: &Bench) -> Result<Section> {
    let Bench {
        tachyon,
        dir,
        script,
        pythons,
        ..
    } = b;
    let mut md = Vec::new();
    let mut raw = serde_json::Map::new();
    md.push("\n## 5. Accuracy: fully merged stacks\n".into());
    md.push(
        "Samples of the workload running Python code whose stack is rooted at `_start`, with \
         Python frames spliced in and no eval frame left over (1 kHz, 600 iterations, about 3.5 s on 3.12; the first tens of ms of a process, before its thread state is known to the BPF side, are part of it). Target: at \
         least 99% on 3.11-3.13.\n"
            .into(),
    );
    md.push("| interpreter | samples | merged | merged % |\n|---|---|---|---|".into());
    let mut acc_raw = Vec::new();
    for (label, interp) in pythons.iter() {
        let out = dir.join(format!("accuracy-{label}.json"));
        let o = Command::new(tachyon)
            .args(["-q", "-r", "1000", "-o"])
            .arg(&out)
            .arg("--")
            .arg(interp)
            .arg(script)
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
    Ok((md, Value::Object(raw)))
}
