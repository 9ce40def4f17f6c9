//! Section 11: the instructions user space executes per sample, counted by callgrind.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use super::*;

/// Section 11's workload: the benchmark's work (`WORKLOAD`, imported from `bench_work.py` beside
/// it) in the main thread, beside two threads that sleep 2 ms and compute a little, as a
/// service's threads do (their off-CPU captures and scheduler records are handled too).
/// `python callgrind_work.py SECONDS CPU`.
const CALLGRIND_WORKLOAD: &str = include_str!("workloads/callgrind_work.py");

/// Section 11: the instructions user space executes per sample, counted by callgrind (no other
/// load on the machine moves the count, unlike its time): `-p` on the workload at 1 kHz in wall
/// mode for 8 s and for 16 s, the whole process and the record handler within it; the
/// difference over the difference of samples is the cost of one more sample, without start-up
/// and the first reads of each library's symbols and unwind tables.
pub fn callgrind(
    tachyon: &Path,
    tools: &Path,
    py: &Path,
    dir: &Path,
) -> Result<(Vec<String>, Value)> {
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
        let pid = work.id().to_string();
        let counted = under_callgrind(
            tachyon,
            &[
                "-p",
                &pid,
                "-d",
                &secs.to_string(),
                "-m",
                "wall",
                "-r",
                "1000",
                "-q",
                "-o",
                &out.to_string_lossy(),
            ],
            dir,
            &secs.to_string(),
        );
        let _ = work.kill();
        let _ = work.wait();
        let (instructions, handler, _) = counted?;
        let samples = f(&meta(&out)?["samples"]);
        runs.push((samples, instructions, handler));
    }
    let service = super::service::callgrind_service(tachyon, tools, dir)?;
    let one_more = |runs: &[(f64, f64, f64)]| {
        let ((s0, i0, h0), (s1, i1, h1)) = (runs[0], runs[1]);
        let more = (s1 - s0).max(1.0);
        ((i1 - i0) / more, (h1 - h0) / more)
    };
    let rows = |md: &mut Vec<String>, runs: &[(f64, f64, f64)], secs: [u64; 2]| {
        md.push(
            "| run | samples | instructions, whole process | of which handling records |\n|---|---|---|---|"
                .to_string(),
        );
        for ((s, i, h), t) in runs.iter().zip(secs) {
            md.push(format!("| {t} s | {s:.0} | {i:.0} | {h:.0} |"));
        }
        let (marginal, handler) = one_more(runs);
        md.push(format!(
            "| one more sample | | **{marginal:.0}** | **{handler:.0}** |"
        ));
    };
    let mut md = vec![
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
    ];
    rows(&mut md, &runs, [8, 16]);
    md.push(
        "\nThe web service of section 12 under its load, `--all-pythons -m cpu -r 49 -f pprof` \
         (the always-on rate), 15 s and 45 s on a service started for each: its deeper and more \
         varied stacks (16 Python frames, thousands of native return addresses) are what a \
         fleet's samples are like. The whole process here includes the writing of the profile, \
         which grows with the run.\n"
            .to_string(),
    );
    rows(&mut md, &service, [15, 45]);
    let json_runs = |runs: &[(f64, f64, f64)]| {
        runs.iter()
            .map(|(s, i, h)| json!({"samples": s, "instructions": i, "handler": h}))
            .collect::<Vec<_>>()
    };
    let (marginal, handler) = one_more(&runs);
    let (s_marginal, s_handler) = one_more(&service);
    let raw = json!({
        "runs": json_runs(&runs),
        "per_sample": marginal,
        "handler_per_sample": handler,
        "service": {
            "runs": json_runs(&service),
            "per_sample": s_marginal,
            "handler_per_sample": s_handler,
        },
    });
    Ok((md, raw))
}

/// Runs tachyon-bpf with `args` under callgrind (its count in `dir/callgrind-NAME.out`): the
/// instructions of the whole process, those of the record handler (`Collector::handle_in`,
/// inclusive) within them, and what tachyon-bpf printed.
pub(super) fn under_callgrind(
    tachyon: &Path,
    args: &[&str],
    dir: &Path,
    name: &str,
) -> Result<(f64, f64, String)> {
    let counts = dir.join(format!("callgrind-{name}.out"));
    let o = Command::new("valgrind")
        .arg("--tool=callgrind")
        .arg(format!("--callgrind-out-file={}", counts.display()))
        .arg(tachyon)
        .args(args)
        .output()
        .context("running valgrind")?;
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
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
            .arg(&counts),
    );
    let handler: f64 = annotated
        .lines()
        // The method is `collect::sample::<impl ...::Collector>::handle_in`.
        .find(|l| l.contains("Collector") && l.contains("::handle_in ["))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.replace(',', "").parse().ok())
        .with_context(|| "callgrind_annotate shows no Collector::handle_in")?;
    Ok((instructions, handler, err))
}
