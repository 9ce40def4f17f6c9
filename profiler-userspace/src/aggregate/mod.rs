//! The aggregated profile: interned functions, frames and stacks shared by every thread, and per
//! process/thread sample timelines and markers. Every output format is written from this.

pub mod markers;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// Profile categories, in the order the Gecko writer lists them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Category {
    Other = 0,
    Python = 1,
    Native = 2,
    Kernel = 3,
    User = 4,
    Gil = 5,
    Cpu = 6,
    Gc = 7,
    CodeType = 8,
}

impl Category {
    pub const ALL: [(Category, &'static str, &'static str); 9] = [
        (Category::Other, "Other", "grey"),
        (Category::Python, "Python", "yellow"),
        (Category::Native, "Native", "blue"),
        (Category::Kernel, "Kernel", "orange"),
        (Category::User, "User", "lightblue"),
        (Category::Gil, "GIL", "green"),
        (Category::Cpu, "CPU", "purple"),
        (Category::Gc, "GC", "magenta"),
        (Category::CodeType, "Code Type", "red"),
    ];
}

pub type LibId = usize;
pub type FuncId = usize;
pub type FrameId = usize;
pub type StackId = usize;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Lib {
    pub name: Arc<str>,
    pub path: Arc<str>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Func {
    pub name: Arc<str>,
    /// Python: the source file; native: none (the library says where it is).
    pub file: Option<Arc<str>>,
    /// Python: the first line of the function.
    pub line: Option<u32>,
    pub lib: Option<LibId>,
    pub category: Category,
    /// Python frames are marked as the profiler's JS-like frames.
    pub is_python: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Frame {
    pub func: FuncId,
    /// Python: the line executing; none for native frames.
    pub line: Option<u32>,
    /// Native: the SVMA of the instruction in its library.
    pub address: Option<u64>,
    /// Native: the SVMA of the function's symbol.
    pub symbol_address: Option<u64>,
    pub category: Category,
}

/// Thread states recorded with each sample (bit set).
pub mod state {
    pub const HAS_GIL: u8 = 1 << 0;
    pub const ON_CPU: u8 = 1 << 1;
    pub const GIL_WAIT: u8 = 1 << 2;
    pub const GC: u8 = 1 << 3;
    pub const PYTHON: u8 = 1 << 4;
    pub const MAIN_THREAD: u8 = 1 << 5;
}

#[derive(Clone, Copy, Debug)]
pub struct Sample {
    /// Milliseconds since the profile start.
    pub time_ms: f64,
    pub stack: Option<StackId>,
    /// `state::*` bits.
    pub state: u8,
}

#[derive(Clone, Debug)]
pub struct Marker {
    pub name: &'static str,
    pub category: Category,
    pub start_ms: f64,
    pub end_ms: f64,
}

#[derive(Clone, Debug)]
pub struct ThreadData {
    pub tid: u32,
    pub name: String,
    pub samples: Vec<Sample>,
    pub markers: Vec<Marker>,
    pub first_ms: f64,
    pub last_ms: f64,
}

#[derive(Clone, Debug)]
pub struct ProcessData {
    pub pid: u32,
    pub name: String,
    /// The Python version when the process is a Python process.
    pub python: Option<String>,
    pub threads: BTreeMap<u32, ThreadData>,
    pub first_ms: f64,
    pub last_ms: f64,
}

/// Counters shown in the summary and stored in the profile's metadata.
#[derive(Clone, Debug, Default)]
pub struct Counters {
    pub samples: u64,
    pub bad_records: u64,
    pub native_truncated: u64,
    pub kernel_only: u64,
    pub py_samples: u64,
    pub py_merged: u64,
    pub py_merge_mismatch: u64,
    pub py_unresolved_frames: u64,
    pub py_thread_miss: u64,
    pub py_read_failed: u64,
    pub py_truncated: u64,
}

#[derive(Default)]
pub struct Profile {
    pub libs: Vec<Lib>,
    lib_ids: HashMap<Arc<str>, LibId>,
    pub funcs: Vec<Func>,
    func_ids: HashMap<Func, FuncId>,
    pub frames: Vec<Frame>,
    frame_ids: HashMap<Frame, FrameId>,
    /// (frame, prefix)
    pub stacks: Vec<(FrameId, Option<StackId>)>,
    stack_ids: HashMap<(FrameId, Option<StackId>), StackId>,
    pub processes: BTreeMap<u32, ProcessData>,
    pub counters: Counters,
}

impl Profile {
    pub fn lib(&mut self, path: &Arc<str>) -> LibId {
        if let Some(&id) = self.lib_ids.get(path) {
            return id;
        }
        let name: Arc<str> = Arc::from(path.rsplit('/').next().unwrap_or(path));
        let id = self.libs.len();
        self.libs.push(Lib {
            name,
            path: path.clone(),
        });
        self.lib_ids.insert(path.clone(), id);
        id
    }

    pub fn func(&mut self, f: Func) -> FuncId {
        if let Some(&id) = self.func_ids.get(&f) {
            return id;
        }
        let id = self.funcs.len();
        self.funcs.push(f.clone());
        self.func_ids.insert(f, id);
        id
    }

    pub fn frame(&mut self, f: Frame) -> FrameId {
        if let Some(&id) = self.frame_ids.get(&f) {
            return id;
        }
        let id = self.frames.len();
        self.frames.push(f.clone());
        self.frame_ids.insert(f, id);
        id
    }

    /// Interns a stack given root-first frames.
    pub fn stack(&mut self, root_first: &[FrameId]) -> Option<StackId> {
        let mut prefix = None;
        for &f in root_first {
            let key = (f, prefix);
            let id = match self.stack_ids.get(&key) {
                Some(&id) => id,
                None => {
                    let id = self.stacks.len();
                    self.stacks.push(key);
                    self.stack_ids.insert(key, id);
                    id
                }
            };
            prefix = Some(id);
        }
        prefix
    }

    /// Frames of a stack, leaf first.
    #[cfg(test)]
    pub fn stack_frames(&self, mut stack: Option<StackId>) -> Vec<FrameId> {
        let mut out = Vec::new();
        while let Some(s) = stack {
            out.push(self.stacks[s].0);
            stack = self.stacks[s].1;
        }
        out
    }

    pub fn process_mut(&mut self, pid: u32, name: &str, t_ms: f64) -> &mut ProcessData {
        self.processes.entry(pid).or_insert_with(|| ProcessData {
            pid,
            name: name.to_string(),
            python: None,
            threads: BTreeMap::new(),
            first_ms: t_ms,
            last_ms: t_ms,
        })
    }

    pub fn add_sample(
        &mut self,
        pid: u32,
        proc_name: &str,
        tid: u32,
        thread_name: &str,
        s: Sample,
    ) {
        self.counters.samples += 1;
        let p = self.process_mut(pid, proc_name, s.time_ms);
        p.last_ms = p.last_ms.max(s.time_ms);
        let t = p.threads.entry(tid).or_insert_with(|| ThreadData {
            tid,
            name: thread_name.to_string(),
            samples: Vec::new(),
            markers: Vec::new(),
            first_ms: s.time_ms,
            last_ms: s.time_ms,
        });
        t.last_ms = t.last_ms.max(s.time_ms);
        t.samples.push(s);
    }

    /// Builds every thread's state markers from its (time-sorted) samples.
    pub fn build_markers(&mut self, interval_ms: f64) {
        for p in self.processes.values_mut() {
            for t in p.threads.values_mut() {
                t.markers = markers::build(&t.samples, interval_ms);
            }
        }
    }

    pub fn thread_count(&self) -> usize {
        self.processes.values().map(|p| p.threads.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stacks_share_prefixes() {
        let mut p = Profile::default();
        let f = |p: &mut Profile, n: &str| {
            let func = p.func(Func {
                name: Arc::from(n),
                file: None,
                line: None,
                lib: None,
                category: Category::User,
                is_python: false,
            });
            p.frame(Frame {
                func,
                line: None,
                address: None,
                symbol_address: None,
                category: Category::User,
            })
        };
        let (a, b, c) = (f(&mut p, "a"), f(&mut p, "b"), f(&mut p, "c"));
        let s1 = p.stack(&[a, b]).unwrap();
        let s2 = p.stack(&[a, c]).unwrap();
        assert_ne!(s1, s2);
        assert_eq!(p.stacks.len(), 3);
        assert_eq!(p.stack_frames(Some(s2)), vec![c, a]);
        assert_eq!(f(&mut p, "a"), a);
    }
}
