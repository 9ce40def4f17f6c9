//! `cargo xtask bench`: tachyon-bpf against py-spy on the same machine, in the same run.
//!
//! For CPython 3.11, 3.12 and 3.13 it runs a fixed CPU-bound workload alone, under tachyon-bpf
//! (cpu mode, 1 kHz) and under py-spy (1 kHz, without and with `--native`), and prints:
//! - the workload's slowdown under each profiler (its own wall time over the baseline), and the
//!   ratio of the overheads;
//! - samples per second each profiler achieved on the workload;
//! - the share of tachyon-bpf samples running Python code whose stack is fully merged: rooted at
//!   `_start`, with Python frames spliced in and no interpreter eval frame left over (the accuracy
//!   bar is 99%); samples with no Python code running (loader, interpreter start-up) are left out.
//!
//! Results also go to `target/bench/results.json`.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

const PY_SPY: &str = "py-spy==0.4.3";
const VERSIONS: [&str; 3] = ["3.11.7", "3.12.1", "3.13.0"];
const RUNS: usize = 3;

const WORKLOAD: &str = r#"
import sys, time

def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)

def squares(n):
    s = 0
    for i in range(n):
        s += i * i
    return s

def work():
    return squares(100000) + fib(18)

def main():
    t0 = time.perf_counter()
    for _ in range(int(sys.argv[1])):
        work()
    print(time.perf_counter() - t0)

main()
"#;

/// py-spy from PyPI under `.tools/pyspy` (idempotent).
fn setup_py_spy(tools: &Path) -> Result<PathBuf> {
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

/// Runs a command whose stdout has the workload's elapsed seconds on a line of its own (py-spy
/// prints its own lines around it).
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

fn best(mut f: impl FnMut() -> Result<f64>) -> Result<f64> {
    let mut b = f64::MAX;
    for _ in 0..RUNS {
        b = b.min(f()?);
    }
    Ok(b)
}

/// (samples of the workload's main thread running Python code, fully merged ones: rooted at
/// `_start`, with Python frames, and no interpreter eval frame left unreplaced).
fn merged(profile: &Path) -> Result<(u64, u64)> {
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
        .filter(|t| {
            t["processName"]
                .as_str()
                .unwrap_or("")
                .contains("bench_work")
        })
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

/// Samples in a py-spy raw (collapsed) file.
fn collapsed_total(path: &Path) -> u64 {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.rsplit_once(' ').and_then(|(_, n)| n.parse::<u64>().ok()))
        .sum()
}

pub fn bench(tachyon: &Path, tools: &Path) -> Result<()> {
    let py_spy = setup_py_spy(tools)?;
    let dir = crate::workspace().join("target/bench");
    std::fs::create_dir_all(&dir)?;
    let script = dir.join("bench_work.py");
    std::fs::write(&script, WORKLOAD)?;
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    let mut results = Vec::new();
    println!(
        "{:<8} {:>8} {:>9} {:>10} {:>10} {:>12} {:>9} {:>11} {:>11}",
        "python",
        "base s",
        "merged %",
        "tachyon x",
        "py-spy x",
        "py-spy -n x",
        "ovh ratio",
        "tachyon/s",
        "py-spy/s"
    );
    for v in VERSIONS {
        let py = PathBuf::from(format!("{home}/.pyenv/versions/{v}/bin/python3"));
        if !py.exists() {
            bail!("{} is missing", py.display());
        }
        // About 2 s of work on this machine.
        let iters = "400";
        let base = best(|| timed(Command::new(&py).arg(&script).arg(iters)))?;
        let out = dir.join(format!("tachyon-{v}.json"));
        let spy_out = dir.join(format!("pyspy-{v}.txt"));
        // A profiler command line followed by the workload.
        let profiled = |profiler: &Path, args: &[&str], out: &Path| {
            let mut c = Command::new(profiler);
            c.args(args)
                .arg(out)
                .arg("--")
                .arg(&py)
                .arg(&script)
                .arg(iters);
            c
        };
        // Counts are kept from the fastest run, the one whose time is reported.
        let mut last_profile = (0, 0);
        let mut fastest = f64::MAX;
        let tach = best(|| {
            let t = timed(&mut profiled(
                tachyon,
                &["-m", "cpu", "-r", "1000", "-q", "-o"],
                &out,
            ))?;
            if t < fastest {
                fastest = t;
                last_profile = merged(&out)?;
            }
            Ok(t)
        })?;
        let mut spy_samples = 0;
        let mut fastest = f64::MAX;
        let spy = best(|| {
            let t = timed(&mut profiled(
                &py_spy,
                &["record", "-r", "1000", "-f", "raw", "-o"],
                &spy_out,
            ))?;
            if t < fastest {
                fastest = t;
                spy_samples = collapsed_total(&spy_out);
            }
            Ok(t)
        })?;
        let spy_native = best(|| {
            timed(&mut profiled(
                &py_spy,
                &["record", "-r", "1000", "--native", "-f", "raw", "-o"],
                &spy_out,
            ))
        })?;
        let (all, good) = last_profile;
        let merged_pct = 100.0 * good as f64 / all.max(1) as f64;
        let ratio = (tach / base - 1.0) / (spy / base - 1.0).max(1e-6);
        println!(
            "{:<8} {:>8.3} {:>9.2} {:>10.3} {:>10.3} {:>12.3} {:>9.2} {:>11.0} {:>11.0}",
            v,
            base,
            merged_pct,
            tach / base,
            spy / base,
            spy_native / base,
            ratio,
            all as f64 / tach,
            spy_samples as f64 / spy,
        );
        results.push(json!({
            "python": v, "baseline_s": base, "samples": all, "merged": good,
            "merged_pct": merged_pct, "tachyon_slowdown": tach / base,
            "pyspy_slowdown": spy / base, "pyspy_native_slowdown": spy_native / base,
            "overhead_ratio_vs_pyspy": ratio,
        }));
    }
    std::fs::write(
        dir.join("results.json"),
        serde_json::to_vec_pretty(&results)?,
    )?;
    println!("(x: workload wall time over its time alone, best of {RUNS}; ovh ratio: tachyon-bpf's overhead over py-spy's; merged %: tachyon-bpf samples running Python code that are rooted at _start with every eval frame replaced by Python frames)");
    Ok(())
}
