//! The end-of-run summary: hottest functions by self and total time, and each process's CPU and
//! GIL split; and the live status line shown while recording on a terminal.

use std::collections::{HashMap, HashSet};

use super::stack_totals;
use crate::aggregate::{state, FuncId, Profile};

/// How a function is named in the summary: `name (file:line)` for Python, `name (library)`
/// for native code.
fn func_label(p: &Profile, f: FuncId) -> String {
    let func = &p.funcs[f];
    match (&func.file, func.lib) {
        (Some(file), _) => {
            let base = file.rsplit('/').next().unwrap_or(file);
            format!("{} ({base}:{})", func.name, func.line.unwrap_or(0))
        }
        (None, Some(l)) => format!("{} ({})", func.name, p.libs[l].name),
        _ => func.name.to_string(),
    }
}

/// (function, self ms, total ms) for every function, hottest self first.
pub fn function_times(p: &Profile) -> (Vec<(FuncId, f64, f64)>, f64) {
    let mut self_ms: HashMap<FuncId, f64> = HashMap::new();
    let mut total_ms: HashMap<FuncId, f64> = HashMap::new();
    let mut all = 0.0;
    let mut seen = HashSet::new();
    for st in stack_totals(p) {
        all += st.ms;
        let frames = p.stack_root_first(st.stack);
        if let Some(&leaf) = frames.last() {
            *self_ms.entry(p.frames[leaf].func).or_default() += st.ms;
        }
        seen.clear();
        for f in frames {
            let func = p.frames[f].func;
            if seen.insert(func) {
                *total_ms.entry(func).or_default() += st.ms;
            }
        }
    }
    let mut v: Vec<(FuncId, f64, f64)> = total_ms
        .into_iter()
        .map(|(f, t)| (f, self_ms.get(&f).copied().unwrap_or(0.0), t))
        .collect();
    v.sort_by(|a, b| {
        b.1.total_cmp(&a.1)
            .then(b.2.total_cmp(&a.2))
            .then(a.0.cmp(&b.0))
    });
    (v, all)
}

/// Summary lines. With Python in the profile: the top Python functions by self and by total
/// time, each with its on-CPU, off-CPU and GIL-wait split, then the top native functions by
/// on-CPU self time (native scaffolding, on every stack, never shows). Without: the top functions
/// by self and total time. Then per process (busiest first) its share on CPU and, for Python,
/// holding and waiting for the GIL.
pub fn lines(p: &Profile, top: usize) -> Vec<String> {
    let mut out = Vec::new();
    // Threads only: an event loop's suspended tasks (`--async-aware all`) are a view of their
    // own, of wall time that no thread spent.
    let v = super::functions::view_of(p, false, |t| !t.is_task_view());
    let all = v.all.total();
    if all <= 0.0 {
        return out;
    }
    if v.rows.iter().any(|r| r.python) {
        python_lines(p, &v, all, top, &mut out);
    } else {
        function_lines(p, all, top, &mut out);
    }
    process_lines(p, top, &mut out);
    unnamed_line(p, top, &mut out);
    out
}

/// The top Python functions by self and total time, with their on-CPU, off-CPU and GIL-wait
/// split, then the top native functions by on-CPU self time.
fn python_lines(
    p: &Profile,
    v: &super::functions::View,
    all: f64,
    top: usize,
    out: &mut Vec<String>,
) {
    let pct = |ms: f64| 100.0 * ms / all;
    let split = |s: &super::functions::Split| {
        let (on, off, gil) = s.shares();
        format!("on CPU {on:.0}%, off CPU {off:.0}%, waiting for the GIL {gil:.0}%")
    };
    let mut rows: Vec<&super::functions::Row> = v.rows.iter().filter(|r| r.python).collect();
    out.push(format!(
        "top {top} Python functions by self time ({} mode; self includes the native code they run):",
        p.mode.name()
    ));
    for r in rows.iter().take(top) {
        out.push(format!(
            "  {:5.1}%  {}  ({})",
            pct(r.self_time.total()),
            r.label,
            split(&r.self_time)
        ));
    }
    rows.sort_by(|a, b| {
        b.total
            .total()
            .total_cmp(&a.total.total())
            .then_with(|| a.label.cmp(&b.label))
    });
    out.push(format!("top {top} Python functions by total time:"));
    // Pass-through roots (the main module, a thread's bootstrap: in nearly every stack of
    // theirs, no time of their own) tell nothing.
    for r in rows
        .iter()
        .filter(|r| pct(r.total.total()) < 95.0 || r.self_time.total() > 0.005 * r.total.total())
        .take(top)
    {
        out.push(format!(
            "  {:5.1}%  {}  ({})",
            pct(r.total.total()),
            r.label,
            split(&r.total)
        ));
    }
    out.push(format!("top {top} native functions by self time on CPU:"));
    for (label, ms) in v.native_self.iter().take(top) {
        out.push(format!("  {:5.1}%  {label}", pct(*ms)));
    }
}

/// The top functions by self and total time (a profile without Python).
fn function_lines(p: &Profile, all: f64, top: usize, out: &mut Vec<String>) {
    let pct = |ms: f64| 100.0 * ms / all;
    let (funcs, _) = function_times(p);
    out.push(format!("top {top} by self time ({} mode):", p.mode.name()));
    for (f, s, _) in funcs.iter().take(top) {
        out.push(format!("  {:5.1}%  {}", pct(*s), func_label(p, *f)));
    }
    let mut by_total = funcs.clone();
    by_total.sort_by(|a, b| b.2.total_cmp(&a.2).then(a.0.cmp(&b.0)));
    out.push(format!("top {top} by total time:"));
    for (f, _, t) in by_total
        .iter()
        .filter(|(_, s, t)| pct(*t) < 95.0 || *s > 0.005 * t)
        .take(top)
    {
        out.push(format!("  {:5.1}%  {}", pct(*t), func_label(p, *f)));
    }
}

/// Per process, busiest first: its share on CPU and, for Python, holding and waiting for the
/// GIL.
fn process_lines(p: &Profile, top: usize, out: &mut Vec<String>) {
    let mut procs: Vec<(String, f64, f64, f64, f64, bool)> = Vec::new();
    for proc_ in p.all_processes() {
        let (mut ms, mut on, mut gil, mut wait) = (0.0, 0.0, 0.0, 0.0);
        let mut python = false;
        for t in proc_.threads.values().filter(|t| !t.is_task_view()) {
            for s in &t.samples {
                ms += s.weight_ms;
                if s.state & state::ON_CPU != 0 {
                    on += s.weight_ms;
                }
                if s.state & state::PYTHON != 0 {
                    python = true;
                }
                if s.state & state::HAS_GIL != 0 {
                    gil += s.weight_ms;
                }
                if s.state & state::GIL_WAIT != 0 {
                    wait += s.weight_ms;
                }
            }
        }
        if ms > 0.0 {
            procs.push((super::process_label(proc_), ms, on, gil, wait, python));
        }
    }
    procs.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    if !procs.is_empty() {
        out.push("per process (share of its threads' time):".into());
    }
    for (label, ms, on, gil, wait, python) in procs.iter().take(top) {
        let share = |x: f64| 100.0 * x / ms;
        if *python {
            out.push(format!(
                "  {label}: on CPU {:.0}%, holding the GIL {:.0}%, waiting for it {:.0}%",
                share(*on),
                share(*gil),
                share(*wait)
            ));
        } else {
            out.push(format!("  {label}: on CPU {:.0}%", share(*on)));
        }
    }
    if procs.len() > top {
        out.push(format!("  ... and {} more", procs.len() - top));
    }
}

/// How many native frames no symbol named, and in which files.
fn unnamed_line(p: &Profile, top: usize, out: &mut Vec<String>) {
    let unnamed = unnamed_frames(p);
    if !unnamed.is_empty() {
        let n: usize = unnamed.iter().map(|u| u.1).sum();
        let files: Vec<String> = unnamed
            .iter()
            .take(top)
            .map(|(file, k)| format!("{file} ({k})"))
            .collect();
        let more = if unnamed.len() > top {
            format!(" and {} more files", unnamed.len() - top)
        } else {
            String::new()
        };
        out.push(format!(
            "native frames without a symbol (shown as file+offset; a debug file would name them): {n}, in {}{more}",
            files.join(", ")
        ));
    }
}

/// Native code addresses in sampled stacks that no symbol table named (shown as
/// `file+0xoffset`, or `0xaddress` outside any file): (file, distinct addresses), most first.
pub fn unnamed_frames(p: &Profile) -> Vec<(String, usize)> {
    let mut seen = HashSet::new();
    for st in stack_totals(p) {
        for f in p.stack_root_first(st.stack) {
            let fr = &p.frames[f];
            let func = &p.funcs[fr.func];
            if func.is_python || fr.category == crate::aggregate::Category::Kernel {
                continue;
            }
            let unnamed = match func.lib {
                Some(l) => {
                    fr.symbol_address.is_none()
                        && func
                            .name
                            .strip_prefix(p.libs[l].name.as_ref())
                            .is_some_and(|rest| rest.starts_with("+0x"))
                }
                None => func.name.starts_with("0x"),
            };
            if unnamed {
                seen.insert(f);
            }
        }
    }
    let mut by_file: HashMap<String, usize> = HashMap::new();
    for f in seen {
        let file = p.funcs[p.frames[f].func]
            .lib
            .map_or("anonymous memory".to_string(), |l| {
                p.libs[l].name.to_string()
            });
        *by_file.entry(file).or_default() += 1;
    }
    let mut v: Vec<(String, usize)> = by_file.into_iter().collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    v
}

/// A reader this far behind the samples is reported (ms).
pub const LAG_WARN_MS: f64 = 1000.0;

/// The live status line: elapsed time, samples and achieved rate, loss, what was seen.
pub fn status_line(p: &Profile, elapsed_s: f64, lost: u64, cpus: usize, rate_hz: u64) -> String {
    let n = p.counters.samples;
    let mut line = format!(
        "tachyon-bpf: {elapsed_s:6.1} s  {n} samples ({:.0}/s, at most {}/s)  lost {lost}  {} processes  {} threads",
        n as f64 / elapsed_s.max(1e-3),
        rate_hz * cpus as u64,
        p.all_processes().count(),
        p.thread_count(),
    );
    if p.counters.last_lag_ms > LAG_WARN_MS {
        line.push_str(&format!(
            "  reader behind by {:.1} s",
            p.counters.last_lag_ms / 1000.0
        ));
    }
    line
}

/// What a run's summary says beside its profile: the run's counters (a continuous run's,
/// added up over its intervals), samples and intervals, and the capture's CPUs and losses.
pub struct RunTotals {
    pub counters: crate::aggregate::Counters,
    pub samples: u64,
    /// A continuous run's intervals (`None`: one profile).
    pub intervals: Option<u64>,
    pub cpus: usize,
    pub lost_per_cpu: Vec<(u32, u64)>,
    pub elapsed: std::time::Duration,
}

/// The end-of-run summary's lines (without the program's prefix).
pub fn run_lines(p: &Profile, run: &super::RunInfo, t: &RunTotals) -> Vec<String> {
    let mut out = Vec::new();
    let c = &t.counters;
    let secs = t.elapsed.as_secs_f64().max(1e-9);
    let lost_str: Vec<String> = t
        .lost_per_cpu
        .iter()
        .map(|(cpu, n)| format!("cpu{cpu} {n}"))
        .collect();
    let (samples, cpus) = (t.samples, t.cpus);
    if let Some(intervals) = t.intervals {
        // The counters start again each interval: the run's totals are the intervals'.
        out.push(format!(
            "{secs:.2} s, {samples} samples ({:.0}/s at {} Hz on {cpus} CPUs) in \
             {intervals} intervals, lost {} ({})",
            samples as f64 / secs,
            run.rate_hz,
            run.lost,
            lost_str.join(", "),
        ));
    } else {
        out.push(format!(
            "{secs:.2} s, {samples} samples on CPU ({:.0}/s at {} Hz on {cpus} \
             CPUs) and {} off-CPU captures, lost {} ({}), truncated {}, bad records {}, {} \
             processes, {} threads",
            samples as f64 / secs,
            run.rate_hz,
            c.offcpu_captures,
            run.lost,
            lost_str.join(", "),
            c.native_truncated,
            c.bad_records,
            p.all_processes().count(),
            p.thread_count(),
        ));
    }
    if let Some(cost) = &run.cost {
        out.push(cost.line(samples));
    }
    if !run.bpf_programs.is_empty() {
        out.push(format!(
            "BPF time by program: {}",
            super::bpf_programs_line(&run.bpf_programs)
        ));
    }
    let counters: Vec<String> = run
        .bpf_counters
        .iter()
        .map(|(n, v)| format!("{n} {v}"))
        .collect();
    out.push(format!("BPF counters: {}", counters.join(", ")));
    if c.max_lag_ms > LAG_WARN_MS {
        out.push(format!(
            "warning: the reader fell behind by up to {:.1} s (samples were \
             processed late: a larger --ring-mb or a lower --rate keeps up)",
            c.max_lag_ms / 1000.0
        ));
    }
    if c.py_samples > 0 {
        out.push(format!(
            "python: {} records of Python threads (samples and off-CPU captures), \
             {} merged, {} merge mismatches, {} thread misses, {} read failures, {} truncated",
            c.py_samples,
            c.py_merged,
            c.py_merge_mismatch,
            c.py_thread_miss,
            c.py_read_failed,
            c.py_truncated
        ));
        if c.py_async_samples + c.py_async_mismatch + c.py_async_suspended > 0 {
            out.push(format!(
                "asyncio: {} samples shown from their running task, {} whose task \
                 did not match their frames (shown plain), {} await chains cut short",
                c.py_async_samples, c.py_async_mismatch, c.py_async_cut
            ));
        }
        if c.py_async_suspended > 0 {
            out.push(format!(
                "asyncio: {} samples of suspended tasks, on a pseudo-thread per \
                 event loop (\"asyncio tasks (loop in thread T)\"; wall time, not in the lines \
                 below)",
                c.py_async_suspended
            ));
        }
        let bad = c.py_unresolved_frames + c.py_cycles + c.py_bad_line_tables;
        if bad > 0 {
            out.push(format!(
                "python: unreadable target data: {} unresolved code objects, {} \
                 looping frame chains, {} corrupt line tables",
                c.py_unresolved_frames, c.py_cycles, c.py_bad_line_tables
            ));
        }
    }
    if t.intervals.is_none() {
        out.extend(lines(p, 5));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::Mode;
    use crate::output::fixture;

    #[test]
    fn summary_of_the_fixture() {
        let (p, _) = fixture::profile(Mode::Wall);
        let l = lines(&p, 3);
        let text = l.join("\n");
        // 28 ms in all. Python functions by self time: `main` sleeps 14 ms in `time_sleep` (its
        // own self time, off CPU), `work` runs 9 ms.
        assert_eq!(
            l[0],
            "top 3 Python functions by self time (wall mode; self includes the native code they run):"
        );
        assert_eq!(
            l[1], "   50.0%  main (app.py:10)  (on CPU 0%, off CPU 100%, waiting for the GIL 0%)",
            "{text}"
        );
        assert_eq!(
            l[2], "   32.1%  work (app.py:20)  (on CPU 100%, off CPU 0%, waiting for the GIL 0%)",
            "{text}"
        );
        // Totals list Python functions only: no native scaffolding such as `_start`.
        let i = l
            .iter()
            .position(|x| x == "top 3 Python functions by total time:")
            .unwrap_or_else(|| panic!("{text}"));
        assert_eq!(
            l[i + 1],
            "   82.1%  main (app.py:10)  (on CPU 39%, off CPU 61%, waiting for the GIL 0%)",
            "{text}"
        );
        assert!(l[i + 2].starts_with("   32.1%  work (app.py:20)"), "{text}");
        // Native code by its own CPU time, never the kernel's scheduler.
        assert_eq!(l[i + 3], "top 3 native functions by self time on CPU:");
        assert_eq!(l[i + 4], "   17.9%  crunch;loop [app]", "{text}");
        assert!(!text.contains("schedule"), "{text}");
        let i = i + 2;
        assert!(l[i + 3].starts_with("per process"), "{text}");
        assert!(
            text.contains(
                "app.py (Python 3.12.1) [pid 100]: on CPU 39%, holding the GIL 39%, waiting for it 0%"
            ),
            "{text}"
        );
        assert!(text.contains("app [pid 200]: on CPU 100%"), "{text}");
    }
}
