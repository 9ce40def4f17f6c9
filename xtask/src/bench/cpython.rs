//! Section 9: CPython's own sampler on Debian's 3.15, against tachyon-bpf on the same workload.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use super::*;

/// The workload's three parts timed from inside (thread CPU time around each call): what a
/// profile's shares of them should be. Prints `{"squares": %, "fib": %, "c_heavy": %}`.
const TRUTH: &str = include_str!("workloads/truth.py");

/// Rounds of the CPython-sampler comparison (median reported).
const CP_ROUNDS: usize = 5;

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

/// The section's runs of the workload: alone, under CPython's sampler, under tachyon-bpf.
struct Runs<'a> {
    py: PathBuf,
    tachyon: &'a Path,
    script: PathBuf,
    pin: &'a str,
}

impl Runs<'_> {
    fn target(&self, c: &mut Command) {
        c.arg(&self.script).arg(ITERS).arg(self.pin);
    }

    fn alone(&self) -> Result<f64> {
        let mut c = Command::new(&self.py);
        self.target(&mut c);
        timed(&mut c)
    }

    fn sampler(&self, args: &[&str], out: &Path) -> Result<f64> {
        let mut c = Command::new(&self.py);
        c.args(["-m", "profiling.sampling", "run", "-r", "1khz"])
            .args(args)
            .arg("-o")
            .arg(out);
        self.target(&mut c);
        timed(&mut c)
    }

    fn ours(&self, mode: &str, format: &str, out: &Path) -> Result<f64> {
        let mut c = Command::new(self.tachyon);
        c.args(["-m", mode, "-r", "1000", "-q", "-f", format, "-o"])
            .arg(out)
            .arg("--")
            .arg(&self.py);
        self.target(&mut c);
        timed(&mut c)
    }
}

/// The workload's iterations in this section.
const ITERS: &str = "300";

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
    let r = Runs {
        py,
        tachyon,
        script,
        pin,
    };
    let mut md = Vec::new();
    let rows = slowdowns(&r, dir, &mut md)?;
    let (rates, shares, worst) = sample_shares(&r, dir, &mut md)?;
    let truth_rows = against_truth(&r, dir, &mut md)?;
    let same = jsonl_shapes(&r, dir, &mut md)?;
    Ok((
        md,
        json!({"slowdown": rows, "samples_per_s": rates, "top10": shares, "worst_points": worst, "truth": truth_rows, "jsonl_same_shape": same}),
    ))
}

/// The slowdown of each configuration, interleaved rounds.
fn slowdowns(r: &Runs, dir: &Path, md: &mut Vec<String>) -> Result<Vec<Value>> {
    let cp_pstats = dir.join("cpython.pstats");
    let cp_gecko = dir.join("cpython-gecko.json");
    let our_cpu = dir.join("tachyon-cpu.folded");
    let our_wall = dir.join("tachyon-wall.folded");
    type Run<'a> = (&'a str, Box<dyn Fn() -> Result<f64> + 'a>);
    let configs: Vec<Run> = vec![
        ("alone", Box::new(|| r.alone())),
        (
            "CPython sampler --pstats",
            Box::new(|| r.sampler(&["--pstats"], &cp_pstats)),
        ),
        (
            "CPython sampler --native --gecko",
            Box::new(|| r.sampler(&["--native", "--gecko"], &cp_gecko)),
        ),
        (
            "tachyon-bpf -m cpu (native + Python + kernel)",
            Box::new(|| r.ours("cpu", "collapsed", &our_cpu)),
        ),
        (
            "tachyon-bpf -m wall (native + Python + kernel)",
            Box::new(|| r.ours("wall", "collapsed", &our_wall)),
        ),
    ];
    let times = interleaved("CPython's sampler", &configs, CP_ROUNDS, |(_, run)| run())?;
    md.extend([
        "\n## 9. CPython's own sampler on Python 3.15 (1 kHz)\n".to_string(),
        format!(
            "The section-1 workload ({ITERS} iterations) on Debian's python3.15, pinned to one \
             CPU, alone and under `python3.15 -m profiling.sampling run -r 1khz` and tachyon-bpf \
             (launching it, `-r 1000`), interleaved, median of {CP_ROUNDS} rounds.\n"
        ),
    ]);
    let names: Vec<&str> = configs.iter().map(|(n, _)| *n).collect();
    let rows = time_table(md, &names, &times);
    Ok(rows)
}

/// The samples each delivers and the top functions' shares, from more runs of each in cpu
/// mode: (samples per second of each, the top 10's shares, their largest difference).
fn sample_shares(r: &Runs, dir: &Path, md: &mut Vec<String>) -> Result<(Value, Vec<Value>, f64)> {
    let cp_folded = dir.join("cpython.folded");
    let our_cpu = dir.join("tachyon-cpu.folded");
    // The samples each delivers, and their function shares, from more runs of each in cpu mode
    // with folded stacks, interleaved: one run's shares move by a few points with the
    // workload's own timing (its garbage collections, the CPU it shares), so each function's
    // median share over the runs is compared.
    type Shares = std::collections::HashMap<String, Vec<f64>>;
    let (mut cp_shares, mut our_shares): (Shares, Shares) = Default::default();
    let (mut cp_rates, mut our_rates) = (Vec::new(), Vec::new());
    for round in 0..SHARE_ROUNDS {
        let cp_secs = r.sampler(&["--mode", "cpu", "--collapsed"], &cp_folded)?;
        let our_secs = r.ours("cpu", "collapsed", &our_cpu)?;
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

    Ok((
        json!({"cpython": cp_rate, "tachyon": our_rate}),
        shares,
        worst,
    ))
}

/// Each part of `work` against the same calls timed from inside.
fn against_truth(r: &Runs, dir: &Path, md: &mut Vec<String>) -> Result<Vec<Value>> {
    let cp_folded = dir.join("cpython.folded");
    let our_cpu = dir.join("tachyon-cpu.folded");
    // Against the truth: the three parts of `work` timed from inside.
    let truth_py = dir.join("bench_truth.py");
    std::fs::write(&truth_py, TRUTH)?;
    let o = Command::new(&r.py)
        .arg(&truth_py)
        .arg(&r.script)
        .arg(ITERS)
        .arg(r.pin)
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

    Ok(truth_rows)
}

/// The JSONL of one run each: whether every record type has the same keys.
fn jsonl_shapes(r: &Runs, dir: &Path, md: &mut Vec<String>) -> Result<bool> {
    // The JSONL of each: record types and their keys.
    let cp_jsonl = dir.join("cpython.jsonl");
    let our_jsonl = dir.join("tachyon.jsonl");
    r.sampler(&["--jsonl"], &cp_jsonl)?;
    r.ours("wall", "jsonl", &our_jsonl)?;
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
    Ok(same)
}
