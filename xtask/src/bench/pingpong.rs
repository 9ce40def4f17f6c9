//! Section 6: two threads passing a token through two queues (tens of thousands of context
//! switches a second), alone and under each profiler.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::Result;
use serde_json::{json, Value};

use super::*;

/// Two threads passing a token through two queues for `argv[1]` seconds; prints round trips per
/// second.
const PINGPONG: &str = include_str!("workloads/pingpong.py");

/// Ping-pong rounds (median reported) and their length in seconds.
pub(super) const PP_ROUNDS: usize = 5;
pub(super) const PP_SECS: &str = "5";

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
            // Its CPU while the ping-pong runs: what it costs once started.
            let from = bg.reading();
            let t = timed(&mut pp_cmd());
            let to = bg.reading();
            let cpu = bg.stop()?;
            let m = with_steady(with_process_cpu(meta(&pp_out(mode))?, cpu), from, to)?;
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
    let tput = interleaved("ping-pong", &pp_configs, PP_ROUNDS, |(_, run)| run())?;
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
    let pp_cost_raw = cost_table(&mut md, &pp_cost);
    Ok((md, json!({"throughput": pp_raw, "cost": pp_cost_raw})))
}

/// The profiler's own cost in the tachyon-bpf runs (`meta.tachyon` of each, wall then cpu).
fn cost_table(md: &mut Vec<String>, pp_cost: &[Vec<Value>; 2]) -> Vec<Value> {
    md.push(
        "\nThe profiler's own cost in those runs (the whole process from start to end, start-up \
         included, over the run's duration; BPF from the kernel's statistics). *Steady*: what it \
         costs once started, as when it is left on: its process CPU while the ping-pong ran (from \
         `/proc`, in 10 ms ticks) plus the run's BPF time, over the ping-pong's duration (the \
         programs have next to nothing to do before and after it).\n"
            .into(),
    );
    md.push(
        "| mode | CPU % of one CPU | user % | BPF % | steady % (user + BPF) | samples | µs per sample | peak RSS MiB |\n|---|---|---|---|---|---|---|---|"
            .into(),
    );
    let mut pp_cost_raw = Vec::new();
    for (mode, runs) in ["wall", "cpu"].iter().zip(pp_cost) {
        let pct = |k: &str| {
            median(
                runs.iter()
                    .map(|m| 100.0 * f(&m["profilerCost"][k]) / f(&m["durationMs"]))
                    .collect(),
            )
        };
        let (user, bpf) = (pct("processCpuMs"), pct("bpfMs"));
        let steady_part = |k: &str| {
            median(
                runs.iter()
                    .map(|m| 100.0 * f(&m["profilerCost"][k]) / f(&m["profilerCost"]["steadyMs"]))
                    .collect(),
            )
        };
        let (steady_user, steady_bpf) = (steady_part("steadyCpuMs"), steady_part("bpfMs"));
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
            "| {mode} | {:.1} | {user:.1} | {bpf:.1} | {:.1} ({steady_user:.1} + {steady_bpf:.1}) | {samples:.0} | {per:.1} | {rss:.1} |",
            user + bpf,
            steady_user + steady_bpf
        ));
        pp_cost_raw.push(json!({"mode": mode, "user_pct": user, "bpf_pct": bpf, "steady_user_pct": steady_user, "steady_bpf_pct": steady_bpf, "us_per_sample": per, "peak_rss_mib": rss, "runs": runs}));
    }
    pp_cost_raw
}
