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

/// Summary lines: the top functions by self and by total time, then per process (busiest
/// first) its share on CPU and, for Python, holding and waiting for the GIL.
pub fn lines(p: &Profile, top: usize) -> Vec<String> {
    let mut out = Vec::new();
    let (funcs, all) = function_times(p);
    if all <= 0.0 {
        return out;
    }
    let pct = |ms: f64| 100.0 * ms / all;
    out.push(format!("top {top} by self time ({} mode):", p.mode.name()));
    for (f, s, _) in funcs.iter().take(top) {
        out.push(format!("  {:5.1}%  {}", pct(*s), func_label(p, *f)));
    }
    let mut by_total = funcs.clone();
    by_total.sort_by(|a, b| b.2.total_cmp(&a.2).then(a.0.cmp(&b.0)));
    // With Python in the profile, its functions are what a user scans the totals for (the
    // native scaffolding under them, _start to the eval loop, is in every stack).
    let python = by_total.iter().any(|(f, _, _)| p.funcs[*f].is_python);
    // Pass-through roots (_start, the main module: in nearly every stack, no time of their own)
    // tell nothing.
    let informative: Vec<_> = by_total
        .iter()
        .filter(|(f, _, _)| !python || p.funcs[*f].is_python)
        .filter(|(_, s, t)| pct(*t) < 95.0 || *s > 0.005 * t)
        .take(top)
        .collect();
    out.push(if python {
        format!("top {top} Python functions by total time:")
    } else {
        format!("top {top} by total time:")
    });
    for (f, _, t) in informative {
        out.push(format!("  {:5.1}%  {}", pct(*t), func_label(p, *f)));
    }
    let mut procs: Vec<(String, f64, f64, f64, f64, bool)> = Vec::new();
    for proc_ in p.all_processes() {
        let (mut ms, mut on, mut gil, mut wait) = (0.0, 0.0, 0.0, 0.0);
        let mut python = false;
        for t in proc_.threads.values() {
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
    out
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
        // 28 ms in all: the 14 ms of sleeping end in the kernel's schedule.
        assert_eq!(l[0], "top 3 by self time (wall mode):");
        assert!(
            l[1].contains("50.0%  schedule ([kernel.kallsyms])"),
            "{text}"
        );
        assert!(l[2].contains("32.1%  work (app.py:20)"), "{text}");
        // Totals list Python functions only: no native scaffolding such as `_start`.
        let i = l
            .iter()
            .position(|x| x == "top 3 Python functions by total time:")
            .unwrap_or_else(|| panic!("{text}"));
        assert_eq!(l[i + 1], "   82.1%  main (app.py:10)", "{text}");
        assert_eq!(l[i + 2], "   32.1%  work (app.py:20)", "{text}");
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
