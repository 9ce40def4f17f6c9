//! The Python-first view of a profile, which the summary and `top` show: per Python function,
//! its self time (its own code, with the native and kernel code it runs) and total time, each
//! split into on CPU, off CPU (sleeping, I/O, locks) and waiting for the GIL; for the native
//! code no Python frame is above (processes that are not Python, threads without Python
//! frames), per native function labelled with its process. The hottest native code run by each
//! Python function is kept too.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::process_label;
use crate::aggregate::{state, Category, FuncId, ProcessData, Profile, StackId};

/// Milliseconds by what the thread was doing.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Split {
    pub on_cpu: f64,
    pub off_cpu: f64,
    pub gil_wait: f64,
}

impl Split {
    pub fn total(&self) -> f64 {
        self.on_cpu + self.off_cpu + self.gil_wait
    }

    /// Adds a sample of state `st` (`aggregate::state`) weighing `ms`.
    pub fn add(&mut self, st: u8, ms: f64) {
        if st & state::GIL_WAIT != 0 {
            self.gil_wait += ms;
        } else if st & state::ON_CPU != 0 {
            self.on_cpu += ms;
        } else {
            self.off_cpu += ms;
        }
    }

    pub fn merge(&mut self, o: &Split) {
        self.on_cpu += o.on_cpu;
        self.off_cpu += o.off_cpu;
        self.gil_wait += o.gil_wait;
    }

    /// Each part as a percentage of this split's total: (on CPU, off CPU, GIL wait).
    pub fn shares(&self) -> (f64, f64, f64) {
        let t = self.total();
        if t <= 0.0 {
            return (0.0, 0.0, 0.0);
        }
        (
            100.0 * self.on_cpu / t,
            100.0 * self.off_cpu / t,
            100.0 * self.gil_wait / t,
        )
    }
}

/// One row of the view.
#[derive(Clone, Debug, Default)]
pub struct Row {
    /// `name (file:line)` for Python, `name [library]` for native code.
    pub label: String,
    pub python: bool,
    /// The process of a native row, or of a Python row kept per process (`view`).
    pub process: Option<String>,
    pub self_time: Split,
    pub total: Split,
    /// Native functions this Python function ran (innermost native frame under it), by label:
    /// ms on CPU. Empty for native rows.
    pub native_callees: HashMap<String, f64>,
}

/// The view of one profile.
#[derive(Default)]
pub struct View {
    pub rows: Vec<Row>,
    /// All the time of the profile's mode (of samples with a stack).
    pub all: Split,
    /// (pid, tid) of the threads sampled.
    pub threads: HashSet<(u32, u32)>,
    /// Native functions by self time on CPU (the innermost frame that is not the kernel's),
    /// over every sample: (label, ms).
    pub native_self: Vec<(String, f64)>,
}

/// A function as the views name it.
pub fn label(p: &Profile, func: FuncId) -> String {
    let f = &p.funcs[func];
    match (&f.file, f.lib) {
        (Some(file), _) => format!(
            "{} ({}:{})",
            f.name,
            file.rsplit('/').next().unwrap_or(file),
            f.line.unwrap_or(0)
        ),
        (None, Some(l)) => format!("{} [{}]", f.name, p.libs[l].name),
        _ => f.name.to_string(),
    }
}

/// What a stack says for the view.
struct Facts {
    /// Distinct Python functions, innermost first.
    python: Vec<FuncId>,
    /// The innermost frame that is neither Python nor the kernel's.
    native_leaf: Option<FuncId>,
    /// Distinct native functions (no kernel), for stacks without Python.
    native: Vec<FuncId>,
    /// The innermost frame (the kernel's, when it is there).
    leaf: FuncId,
}

fn facts(p: &Profile, stack: StackId) -> Facts {
    let frames = p.stack_root_first(stack);
    let mut python = Vec::new();
    let mut native = Vec::new();
    let mut native_leaf = None;
    for &f in frames.iter().rev() {
        let fr = &p.frames[f];
        let func = &p.funcs[fr.func];
        if func.is_python {
            if !python.contains(&fr.func) {
                python.push(fr.func);
            }
        } else if fr.category != Category::Kernel {
            if python.is_empty() && native_leaf.is_none() {
                native_leaf = Some(fr.func);
            }
            if !native.contains(&fr.func) {
                native.push(fr.func);
            }
        }
    }
    Facts {
        python,
        native_leaf,
        native,
        leaf: p.frames[*frames.last().expect("a stack has a frame")].func,
    }
}

/// The view of a profile's samples in its mode; `by_process` keeps each process's Python rows
/// apart (their `process` is set) rather than adding them up.
pub fn view(p: &Profile, by_process: bool) -> View {
    view_of(p, by_process, |_| true)
}

/// `view` over the threads `keep` keeps.
pub fn view_of(
    p: &Profile,
    by_process: bool,
    keep: impl Fn(&crate::aggregate::ThreadData) -> bool,
) -> View {
    let mut v = View::default();
    // First the time per process and stack, split by state; then each distinct stack once.
    let mut per: BTreeMap<(usize, StackId), Split> = BTreeMap::new();
    let procs: Vec<&ProcessData> = p.all_processes().collect();
    for (i, proc_) in procs.iter().enumerate() {
        for t in proc_.threads.values().filter(|t| keep(t)) {
            for s in t.samples.iter().filter(|s| s.in_mode) {
                let Some(stack) = s.stack else { continue };
                v.threads.insert((proc_.pid, t.tid));
                per.entry((i, stack)).or_default().add(s.state, s.weight_ms);
            }
        }
    }
    let mut rows: HashMap<(String, Option<String>), Row> = HashMap::new();
    let mut labels: HashMap<FuncId, String> = HashMap::new();
    let mut native_self: HashMap<String, f64> = HashMap::new();
    let mut name = |f: FuncId| labels.entry(f).or_insert_with(|| label(p, f)).clone();
    let mut proc_labels: HashMap<usize, String> = HashMap::new();
    for ((i, stack), split) in per {
        v.all.merge(&split);
        let proc_label = proc_labels
            .entry(i)
            .or_insert_with(|| process_label(procs[i]))
            .clone();
        let f = facts(p, stack);
        if let (Some(n), true) = (f.native_leaf, split.on_cpu > 0.0) {
            *native_self.entry(name(n)).or_default() += split.on_cpu;
        }
        if !f.python.is_empty() {
            let callee = f.native_leaf.map(&mut name);
            for (k, &func) in f.python.iter().enumerate() {
                let l = name(func);
                let process = by_process.then(|| proc_label.clone());
                let row = rows
                    .entry((l.clone(), process.clone()))
                    .or_insert_with(|| Row {
                        label: l,
                        python: true,
                        process,
                        ..Row::default()
                    });
                row.total.merge(&split);
                // The innermost is the function whose own time this is.
                if k == 0 {
                    row.self_time.merge(&split);
                    if let (Some(c), true) = (&callee, split.on_cpu > 0.0) {
                        *row.native_callees.entry(c.clone()).or_default() += split.on_cpu;
                    }
                }
            }
        } else {
            let own = f.native_leaf.unwrap_or(f.leaf);
            let mut funcs = f.native;
            if !funcs.contains(&own) {
                funcs.push(own);
            }
            for func in funcs {
                let l = name(func);
                let row = rows
                    .entry((l.clone(), Some(proc_label.clone())))
                    .or_insert_with(|| Row {
                        label: l,
                        python: false,
                        process: Some(proc_label.clone()),
                        ..Row::default()
                    });
                row.total.merge(&split);
                if func == own {
                    row.self_time.merge(&split);
                }
            }
        }
    }
    v.rows = rows.into_values().collect();
    v.rows.sort_by(|a, b| {
        b.self_time
            .total()
            .total_cmp(&a.self_time.total())
            .then_with(|| a.label.cmp(&b.label))
    });
    let mut ns: Vec<(String, f64)> = native_self.into_iter().collect();
    ns.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    v.native_self = ns;
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::Mode;
    use crate::output::fixture;

    #[test]
    fn python_functions_with_their_split_and_native_rows_by_process() {
        let (p, _) = fixture::profile(Mode::Wall);
        let v = view(&p, false);
        let row = |l: &str| {
            v.rows
                .iter()
                .find(|r| r.label == l)
                .unwrap_or_else(|| panic!("{l} in {:?}", v.rows))
        };
        // The fixture: `work` runs 9 ms on CPU; `main` sleeps 14 ms in `time_sleep` (off CPU)
        // and is on every Python stack; `crunch;loop` of a native process runs 5 ms.
        let work = row("work (app.py:20)");
        assert!(work.python && work.process.is_none());
        assert_eq!(work.self_time.on_cpu, 9.0);
        assert_eq!(work.self_time.off_cpu, 0.0);
        let main = row("main (app.py:10)");
        assert_eq!(main.self_time.off_cpu, 14.0);
        assert_eq!(main.total.total(), 23.0);
        assert_eq!(main.self_time.shares().1, 100.0);
        let crunch = row("crunch;loop [app]");
        assert!(!crunch.python);
        assert_eq!(crunch.process.as_deref(), Some("app [pid 200]"));
        assert_eq!(crunch.self_time.on_cpu, 5.0);
        // No native scaffolding among Python stacks' rows.
        assert!(v.rows.iter().all(|r| !r.label.starts_with("_start")));
        assert_eq!(v.threads.len(), 3);
    }
}
