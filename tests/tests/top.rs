//! `tachyon-bpf top` driven through tmux: the hottest function of a known script reaches the
//! first row within 3 s, the process filter and sort keys work, and `q` exits 0; on a known
//! mix of work, the Python view's first rows are its Python functions, each split into on CPU,
//! off CPU and waiting for the GIL as they really are.

use std::process::Command;
use std::time::{Duration, Instant};

use tachyon_bpf_tests::*;

fn tmux(args: &[&str]) -> String {
    let o = Command::new("tmux")
        .args(["-L", "tachyon-top-test"])
        .args(args)
        .output()
        .expect("tmux");
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Runs `cmd` in a detached tmux session `top` of `width` columns and 30 rows.
fn start_top(cmd: &str, width: u32) {
    let width = width.to_string();
    tmux(&[
        "new-session",
        "-d",
        "-s",
        "top",
        "-x",
        &width,
        "-y",
        "30",
        cmd,
    ]);
}

fn screen() -> Vec<String> {
    tmux(&["capture-pane", "-p", "-t", "top"])
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn top_shows_the_hottest_function_first_and_quits_on_q() {
    require_root();
    let dir = scratch("top");
    let script = dir.join("hot.py");
    std::fs::write(
        &script,
        "import time\ndef hottest_here():\n    t0 = time.monotonic()\n    items = [0] * 1000\n    while time.monotonic() - t0 < 30:\n        for v in items:\n            y = v\nhottest_here()\n",
    )
    .unwrap();
    let mut target = Command::new(python("3.12.1")).arg(&script).spawn().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let _ = tmux(&["kill-server"]);
    let cmd = format!(
        "{} top -p {}; echo EXIT=$?; sleep 30",
        profiler_bin().display(),
        target.id()
    );
    start_top(&cmd, 180);
    let t0 = Instant::now();
    let mut first = String::new();
    while t0.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(200));
        let s = screen();
        if let Some(row) = s.get(2) {
            first = row.clone();
            if first.contains("hottest_here (hot.py:2)") {
                break;
            }
        }
    }
    let at = t0.elapsed();
    assert!(
        first.contains("hottest_here (hot.py:2)"),
        "first row after {at:?}: {first:?}\n{}",
        screen().join("\n")
    );
    let s = screen();
    assert!(
        s[0].contains("tachyon-bpf top:") && s[0].contains("sorted by self"),
        "{s:?}"
    );
    assert!(
        s[1].contains("%self") && s[1].contains("%cpu") && s[1].contains("%GIL"),
        "{s:?}"
    );
    assert!(s[0].contains("1 processes, 1 threads"), "{s:?}");
    // Sort by total time, then filter to the one process.
    tmux(&["send-keys", "-t", "top", "t"]);
    std::thread::sleep(Duration::from_millis(300));
    assert!(screen()[0].contains("sorted by total"));
    tmux(&["send-keys", "-t", "top", "p"]);
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        screen()[0].contains("hot.py (Python 3.12.1)"),
        "{:?}",
        screen()[0]
    );
    tmux(&["send-keys", "-t", "top", "q"]);
    let t1 = Instant::now();
    let mut exited = String::new();
    while t1.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(100));
        if let Some(l) = screen().into_iter().find(|l| l.starts_with("EXIT=")) {
            exited = l;
            break;
        }
    }
    let _ = tmux(&["kill-server"]);
    let _ = target.kill();
    let _ = target.wait();
    assert_eq!(exited, "EXIT=0", "q quits cleanly");
}

/// Three processes: one computing, one sleeping, and one whose two threads take turns on the
/// GIL (each holds it about half the time).
const MIX: [(&str, &str); 3] = [
    (
        "compute.py",
        "import time\ndef compute_bound():\n    t0 = time.monotonic()\n    x = 0\n    while time.monotonic() - t0 < 60:\n        for i in range(1000):\n            x += i * i\ncompute_bound()\n",
    ),
    (
        "nap.py",
        "import time\ndef sleepy_wait():\n    t0 = time.monotonic()\n    while time.monotonic() - t0 < 60:\n        time.sleep(0.2)\nsleepy_wait()\n",
    ),
    (
        "contend.py",
        "import threading, time\ndef gil_contender():\n    t0 = time.monotonic()\n    x = 0\n    while time.monotonic() - t0 < 60:\n        for i in range(1000):\n            x += i * i\nt = threading.Thread(target=gil_contender)\nt.start()\ngil_contender()\nt.join()\n",
    ),
];

/// What the scheduler says of a process's threads, summed (`/proc/PID/task/TID/schedstat`):
/// seconds on a CPU, seconds runnable but waiting for one, and the thread count.
fn sched(pid: &str) -> (f64, f64, f64) {
    let (mut run, mut wait, mut threads) = (0.0, 0.0, 0.0);
    for e in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let stat = std::fs::read_to_string(e.unwrap().path().join("schedstat")).unwrap_or_default();
        let f: Vec<f64> = stat
            .split_whitespace()
            .map(|x| x.parse().unwrap_or(0.0))
            .collect();
        run += f.first().copied().unwrap_or(0.0) / 1e9;
        wait += f.get(1).copied().unwrap_or(0.0) / 1e9;
        threads += 1.0;
    }
    (run, wait, threads)
}

/// A row of the Python view: (%self, %total, %cpu, %off, %GIL, function).
fn parse_row(line: &str) -> Option<(f64, f64, f64, f64, f64, String)> {
    let mut it = line.split_whitespace();
    let mut num = || it.next()?.parse::<f64>().ok();
    let (a, b, c, d, e) = (num()?, num()?, num()?, num()?, num()?);
    let rest: Vec<&str> = line.split_whitespace().skip(5).collect();
    Some((a, b, c, d, e, rest.join(" ")))
}

#[test]
fn top_opens_on_python_functions_split_into_cpu_off_cpu_and_gil() {
    require_root();
    let dir = scratch("top_python");
    let mut targets = Vec::new();
    let mut pids = Vec::new();
    for (name, text) in MIX {
        let script = dir.join(name);
        std::fs::write(&script, text).unwrap();
        let child = Command::new(python("3.12.1")).arg(&script).spawn().unwrap();
        pids.push(child.id().to_string());
        targets.push(child);
    }
    std::thread::sleep(Duration::from_millis(500));
    let _ = tmux(&["kill-server"]);
    let cmd = format!(
        "{} top -p {} -p {} -p {}; echo EXIT=$?; sleep 30",
        profiler_bin().display(),
        pids[0],
        pids[1],
        pids[2]
    );
    start_top(&cmd, 200);
    // Six seconds of the window, then the rows; the truth of the same time from the kernel.
    let before: Vec<(f64, f64, f64)> = pids.iter().map(|p| sched(p)).collect();
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs(7));
    let s = screen();
    let wall = t0.elapsed().as_secs_f64();
    let after: Vec<(f64, f64, f64)> = pids.iter().map(|p| sched(p)).collect();
    // Per process, in percent of its threads' time: on a CPU, runnable (off CPU, preempted),
    // blocked (off CPU, or waiting for the GIL).
    let truth: Vec<(f64, f64, f64)> = before
        .iter()
        .zip(&after)
        .map(|(a, b)| {
            let all = wall * b.2.max(1.0);
            let run = 100.0 * (b.0 - a.0) / all;
            let wait = 100.0 * (b.1 - a.1) / all;
            (run, wait, 100.0 - run - wait)
        })
        .collect();
    // The busiest process (the contenders'), and the native code of its first row.
    let _ = tmux(&["send-keys", "-t", "top", "p"]);
    let _ = tmux(&["send-keys", "-t", "top", "Enter"]);
    std::thread::sleep(Duration::from_millis(400));
    let with_detail = screen();
    tmux(&["send-keys", "-t", "top", "q"]);
    std::thread::sleep(Duration::from_millis(500));
    let _ = tmux(&["kill-server"]);
    // The same workload's end-of-run summary lists the same functions first.
    let out = dir.join("summary.json");
    let o = run_profiler(
        &[
            "-p",
            &pids[0],
            "-p",
            &pids[1],
            "-p",
            &pids[2],
            "-d",
            "3",
            "-o",
            out.to_str().unwrap(),
        ],
        Duration::from_secs(60),
    );
    for mut t in targets {
        let _ = t.kill();
        let _ = t.wait();
    }
    let summary = stderr_of(&o);
    let by_self: Vec<&str> = summary
        .split("Python functions by self time")
        .nth(1)
        .unwrap_or_else(|| panic!("a top of Python functions by self time: {summary}"))
        .lines()
        .skip(1)
        .take(3)
        .collect();
    // (on CPU, off CPU, waiting for the GIL) of a function's line.
    let split = |want: &str| -> (f64, f64, f64) {
        let line = by_self
            .iter()
            .find(|l| l.contains(want))
            .unwrap_or_else(|| panic!("{want} among the summary's first rows: {summary}"));
        let n = |key: &str| -> f64 {
            line.split(key)
                .nth(1)
                .and_then(|r| r.trim_start().split('%').next())
                .and_then(|x| x.parse().ok())
                .unwrap_or_else(|| panic!("{key} in {line}"))
        };
        (n("on CPU"), n("off CPU"), n("waiting for the GIL"))
    };
    let (on, _, _) = split("compute_bound (compute.py:2)");
    assert!(on >= 80.0, "computing on CPU: {summary}");
    let (_, off, _) = split("sleepy_wait (nap.py:2)");
    assert!(off >= 90.0, "sleeping off CPU: {summary}");
    let (_, _, gil) = split("gil_contender (contend.py:2)");
    assert!(gil >= 15.0, "contenders waiting for the GIL: {summary}");
    let shown = s.join("\n");
    assert!(
        s[0].contains("3 processes, 4 threads") && s[0].contains("Python"),
        "{shown}"
    );
    let rows: Vec<(f64, f64, f64, f64, f64, String)> =
        s[2..].iter().filter_map(|l| parse_row(l)).collect();
    let first: Vec<&str> = rows.iter().take(3).map(|r| r.5.as_str()).collect();
    for want in [
        "gil_contender (contend.py:2)",
        "compute_bound (compute.py:2)",
        "sleepy_wait (nap.py:2)",
    ] {
        assert!(
            first.contains(&want),
            "{want} among the first rows: {shown}"
        );
    }
    let row = |f: &str| rows.iter().find(|r| r.5 == f).unwrap();
    // The truth, from the scheduler: a computer runs (or waits for a CPU), a sleeper is
    // blocked, and each contender is blocked while it waits for the GIL the other holds.
    // Runnable time is off CPU, except a contender's in the GIL hand-off (woken by the
    // holder's drop, not yet on a CPU): that is waiting for the GIL too, so a contender's
    // GIL share lies between its blocked share and its blocked plus runnable share.
    let close = |a: f64, b: f64| (a - b).abs() <= 10.0;
    let (_, _, cpu, off, gil, _) = row("compute_bound (compute.py:2)").clone();
    let (run, runnable, blocked) = truth[0];
    assert!(
        close(cpu, run) && close(off, runnable + blocked) && gil <= 5.0,
        "computing: {cpu} {off} {gil} (truth: {run:.0} {runnable:.0} {blocked:.0}): {shown}"
    );
    let (_, _, cpu, off, gil, _) = row("sleepy_wait (nap.py:2)").clone();
    let (run, runnable, blocked) = truth[1];
    assert!(
        close(cpu, run) && close(off, runnable + blocked) && gil <= 5.0,
        "sleeping: {cpu} {off} {gil} (truth: {run:.0} {runnable:.0} {blocked:.0}): {shown}"
    );
    let (_, _, cpu, off, gil, _) = row("gil_contender (contend.py:2)").clone();
    let (run, runnable, blocked) = truth[2];
    assert!(
        close(cpu, run)
            && close(off + gil, runnable + blocked)
            && gil >= blocked - 10.0
            && gil <= blocked + runnable + 10.0,
        "contending: {cpu} {off} {gil} (truth: {run:.0} {runnable:.0} {blocked:.0}): {shown}"
    );
    // Enter on the selected row names the native code it runs.
    let detail = with_detail.join("\n");
    assert!(
        detail.contains("gil_contender (contend.py:2) runs on CPU: ")
            && detail.contains("libpython3.12"),
        "{detail}"
    );
}
