//! The aggregated profile: interned functions, frames and stacks shared by every thread, and per
//! process/thread sample timelines and markers. Every output format is written from this.
//!
//! The data model: may import nothing else of the crate (the capture's words, such as which
//! earlier stack an off-CPU interval reuses, are translated by `collect`).

/// The deepest stack a run can record: kernel frames, native frames and Python frames, with room.
pub const MAX_STACK_DEPTH: usize = 4096;
/// Frames a recording's distinct stacks may add up to (each stack-per-line output writes that
/// many frames): about 20 times what a long 10 kHz run of deep stacks produces.
pub const MAX_EXPANDED_FRAMES: u64 = 200_000_000;

mod counters;
mod error;
pub mod identity;
pub mod markers;
pub mod timeline;

pub use counters::Counters;
pub use error::RecordingError;

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// Profile categories, in the order the Gecko writer lists them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
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
    /// Markers of the time a Python thread has an exception raised or being handled.
    Exception = 9,
    /// Markers of the bytecode instruction a thread's innermost Python frame runs (`--opcodes`).
    Opcodes = 10,
}

impl Category {
    pub const ALL: [(Category, &'static str, &'static str); 11] = [
        (Category::Other, "Other", "grey"),
        (Category::Python, "Python", "yellow"),
        (Category::Native, "Native", "blue"),
        (Category::Kernel, "Kernel", "orange"),
        (Category::User, "User", "lightblue"),
        (Category::Gil, "GIL", "green"),
        (Category::Cpu, "CPU", "purple"),
        (Category::Gc, "GC", "magenta"),
        (Category::CodeType, "Code Type", "red"),
        (Category::Exception, "Exception", "brown"),
        (Category::Opcodes, "Opcodes", "magenta"),
    ];
}

pub type LibId = usize;
pub type FuncId = usize;
pub type FrameId = usize;
pub type StackId = usize;

/// Memos of `Profile::stack_near`: groups of `RECENT_WAYS` stacks, one group per thread (by its
/// tid: the threads of a busy host rarely share a group).
const RECENT_STACKS: usize = 256;
const RECENT_WAYS: usize = 8;

/// The last stack interned for one hint: its frames root first, and the stack id of each prefix.
#[derive(Default)]
struct RecentStack {
    frames: Vec<FrameId>,
    ids: Vec<StackId>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Lib {
    pub name: Arc<str>,
    pub path: Arc<str>,
    /// Its GNU build id, in hex, when it has one.
    #[serde(default)]
    pub build_id: Option<Arc<str>>,
    /// The Python interpreter's own code (libpython, or a statically linked `python3.X`), as
    /// `collect` found it (`python::is_interpreter_file`); the outputs colour by it.
    #[serde(default)]
    pub interpreter: bool,
}

impl Lib {
    pub fn is_interpreter(&self) -> bool {
        self.interpreter
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
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

#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Frame {
    pub func: FuncId,
    /// Python: the line executing; none for native frames.
    pub line: Option<u32>,
    /// Native: the SVMA of the instruction in its library.
    pub address: Option<u64>,
    /// Native: the SVMA of the function's symbol.
    pub symbol_address: Option<u64>,
    pub category: Category,
    /// Python, with `--opcodes`: the instruction the innermost Python frame ran.
    #[serde(default)]
    pub opcode: Option<Opcode>,
}

/// A bytecode instruction as the interpreter's `dis` names it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Opcode {
    /// Specialized form included (`LOAD_ATTR_INSTANCE_VALUE`).
    pub name: Arc<str>,
    /// For a specialized form, the instruction it specializes (`LOAD_ATTR`).
    pub base: Option<Arc<str>>,
}

/// The most CPU time a program may have used before its exec for it to be folded into the program
/// it execs (`Profile::exec`).
const PRE_EXEC_MOMENT_MS: f64 = 50.0;

/// Thread states recorded with each sample (bit set).
pub mod state {
    pub const HAS_GIL: u8 = 1 << 0;
    pub const ON_CPU: u8 = 1 << 1;
    pub const GIL_WAIT: u8 = 1 << 2;
    pub const GC: u8 = 1 << 3;
    pub const PYTHON: u8 = 1 << 4;
    pub const MAIN_THREAD: u8 = 1 << 5;
    /// An exception is being raised or handled.
    pub const EXCEPTION: u8 = 1 << 6;
}

/// What a profile counts (`--mode`), with the semantics of CPython's sampler.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// On- and off-CPU time of every thread.
    Wall,
    /// On-CPU time only.
    Cpu,
    /// Time the thread holds the GIL.
    Gil,
    /// Time with an exception being raised or handled.
    Exception,
    /// Everything, with thread state.
    All,
}

impl Mode {
    pub const ALL: [Mode; 5] = [Mode::Wall, Mode::Cpu, Mode::Gil, Mode::Exception, Mode::All];

    /// The mode named `name` (as `name()` spells it).
    pub fn from_name(name: &str) -> Option<Mode> {
        Mode::ALL.into_iter().find(|m| m.name() == name)
    }

    pub fn name(self) -> &'static str {
        match self {
            Mode::Wall => "wall",
            Mode::Cpu => "cpu",
            Mode::Gil => "gil",
            Mode::Exception => "exception",
            Mode::All => "all",
        }
    }

    /// Whether a sample in this state counts in this mode.
    pub fn keeps(self, st: u8) -> bool {
        match self {
            Mode::Wall | Mode::All => true,
            Mode::Cpu => st & state::ON_CPU != 0,
            Mode::Gil => st & state::HAS_GIL != 0,
            Mode::Exception => st & state::EXCEPTION != 0,
        }
    }

    /// Whether off-CPU time needs stacks (otherwise only its times are recorded).
    pub fn needs_offcpu_stacks(self) -> bool {
        self != Mode::Cpu
    }
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct Sample {
    /// Milliseconds since the profile start.
    pub time_ms: f64,
    pub stack: Option<StackId>,
    /// `state::*` bits; an off-CPU sample lacks `ON_CPU`.
    pub state: u8,
    /// The time this sample stands for: one sampling period on CPU, the exact off-CPU interval
    /// (from the scheduler) off CPU.
    pub weight_ms: f64,
    /// Counted in the profile's mode (samples outside it still shape the state timelines).
    pub in_mode: bool,
    /// CPU time the thread used since its previous sample, in microseconds.
    pub cpu_delta_us: f64,
}

/// `--async-aware all`: the pseudo-thread of an event loop's suspended tasks has the loop
/// thread's id with this bit set (thread ids stay below 2^22).
pub const TASK_THREAD_BIT: u32 = 1 << 30;

/// Every marker name the profiler writes (markers name themselves with these statics).
pub const MARKER_NAMES: [&str; 11] = [
    "Has GIL",
    "No GIL",
    "Waiting for GIL",
    "Python Code",
    "Native Code",
    "GC Collecting",
    "Has Exception",
    "No Exception",
    "On CPU",
    "Off CPU",
    "Switching",
];

/// Markers by start, then in the order of `MARKER_NAMES`: one order however they were made.
fn sort_markers(markers: &mut [Marker]) {
    let rank = |m: &Marker| MARKER_NAMES.iter().position(|n| *n == m.name);
    markers.sort_by(|a, b| {
        a.start_ms
            .total_cmp(&b.start_ms)
            .then_with(|| rank(a).cmp(&rank(b)))
    });
}

/// A marker as stored in a recording.
#[derive(Deserialize)]
struct StoredMarker {
    name: String,
    category: Category,
    start_ms: f64,
    end_ms: f64,
}

impl<'de> Deserialize<'de> for Marker {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Marker, D::Error> {
        let m = StoredMarker::deserialize(d)?;
        let name = MARKER_NAMES
            .iter()
            .find(|n| **n == m.name)
            .copied()
            .ok_or_else(|| serde::de::Error::custom(format!("unknown marker {:?}", m.name)))?;
        Ok(Marker {
            name,
            category: m.category,
            start_ms: m.start_ms,
            end_ms: m.end_ms,
        })
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct Marker {
    pub name: &'static str,
    pub category: Category,
    pub start_ms: f64,
    pub end_ms: f64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ThreadData {
    pub tid: u32,
    /// The thread's `comm` (its OS name).
    pub name: String,
    /// The name Python gave the thread (`threading.Thread.name`), where it was read.
    #[serde(default)]
    pub python_name: Option<String>,
    pub samples: Vec<Sample>,
    pub markers: Vec<Marker>,
    pub first_ms: f64,
    pub last_ms: f64,
    /// Created during the run (exact, from the scheduler).
    pub start_ms: Option<f64>,
    /// Exited during the run.
    pub end_ms: Option<f64>,
    /// Scheduler bookkeeping while collecting (its results are in the samples and markers).
    #[serde(skip)]
    pub sched: timeline::SchedState,
}

impl ThreadData {
    /// The pseudo-thread of an event loop's suspended tasks (`--async-aware all`), not a
    /// thread of the process.
    pub fn is_task_view(&self) -> bool {
        self.tid & TASK_THREAD_BIT != 0
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ProcessData {
    pub pid: u32,
    pub name: String,
    /// The Python version when the process is a Python process.
    pub python: Option<String>,
    pub threads: BTreeMap<u32, ThreadData>,
    pub first_ms: f64,
    pub last_ms: f64,
    /// Started (fork or exec) during the run.
    pub start_ms: Option<f64>,
    /// Ended (last thread exit, or exec into another program) during the run.
    pub end_ms: Option<f64>,
    /// 0 for the program a pid runs at the end of the run; 1, 2, ... for earlier programs of the
    /// same pid (before an exec, or before the pid was reused), in order.
    pub generation: u32,
    /// Its service, container and labels (read at its first sample; absent in recordings made
    /// before they were read).
    pub identity: Option<identity::Identity>,
}

/// Read back from version-1 recordings, which were this structure's serde dump (today's
/// recordings have their own schema, `output::recording`); the index maps are rebuilt on load
/// (`reindex`).
#[derive(Deserialize)]
pub struct Profile {
    pub libs: Vec<Lib>,
    #[serde(skip)]
    lib_ids: FxHashMap<Arc<str>, LibId>,
    pub funcs: Vec<Func>,
    #[serde(skip)]
    func_ids: FxHashMap<Func, FuncId>,
    pub frames: Vec<Frame>,
    #[serde(skip)]
    frame_ids: FxHashMap<Frame, FrameId>,
    /// (frame, prefix)
    pub stacks: Vec<(FrameId, Option<StackId>)>,
    #[serde(skip)]
    stack_ids: FxHashMap<(FrameId, Option<StackId>), StackId>,
    /// The last stacks interned by `stack_near`, by hint (see there).
    #[serde(skip)]
    recent_stacks: Vec<RecentStack>,
    /// The way of each group of `recent_stacks` the next stack takes.
    #[serde(skip)]
    recent_next: Vec<u8>,
    /// Live processes by pid.
    pub processes: BTreeMap<u32, ProcessData>,
    /// Processes that ended by exec or whose pid was reused during the run.
    pub retired: Vec<ProcessData>,
    /// Creation times of tasks not yet seen, by (pid, tid).
    #[serde(skip)]
    births: FxHashMap<(u32, u32), f64>,
    pub counters: Counters,
    pub mode: Mode,
    /// One sampling period.
    pub interval_ms: f64,
    /// Milliseconds from the profile start to its end, set by `finish`.
    pub end_ms: f64,
    /// Whether threads keep their exact on-CPU intervals and spans (`SchedState::oncpu` and
    /// `spans`): only the Firefox Profiler's CPU graph and CPU markers show them, and in wall
    /// mode they grow by a scheduler record's worth on every switch. A profile read back from a
    /// recording keeps them (a recording holds what any format needs).
    #[serde(skip, default = "keeps_timeline")]
    pub timeline: bool,
}

fn keeps_timeline() -> bool {
    true
}

impl Profile {
    pub fn new(mode: Mode, interval_ms: f64) -> Profile {
        Profile {
            libs: Vec::new(),
            lib_ids: FxHashMap::default(),
            funcs: Vec::new(),
            func_ids: FxHashMap::default(),
            frames: Vec::new(),
            frame_ids: FxHashMap::default(),
            stacks: Vec::new(),
            stack_ids: FxHashMap::default(),
            recent_stacks: Vec::new(),
            recent_next: Vec::new(),
            processes: BTreeMap::new(),
            retired: Vec::new(),
            births: FxHashMap::default(),
            counters: Counters::default(),
            mode,
            interval_ms,
            end_ms: 0.0,
            timeline: true,
        }
    }

    /// Rebuilds the interning maps of a profile read back from a recording, and checks that
    /// every index in it is in range (a recording is input like any other).
    pub fn reindex(&mut self) -> Result<(), RecordingError> {
        let bad = RecordingError::OutOfRange;
        for (i, f) in self.funcs.iter().enumerate() {
            if f.lib.is_some_and(|l| l >= self.libs.len()) {
                return Err(bad("function", i));
            }
        }
        for (i, f) in self.frames.iter().enumerate() {
            if f.func >= self.funcs.len() {
                return Err(bad("frame", i));
            }
        }
        for (i, &(f, prefix)) in self.stacks.iter().enumerate() {
            // Prefixes come first, so every walk to the root ends.
            if f >= self.frames.len() || prefix.is_some_and(|p| p >= i) {
                return Err(bad("stack", i));
            }
        }
        // Depths, linear since prefixes come first. A stack-per-line format writes each distinct
        // sampled stack whole, so what the writers would produce is bounded here, before they
        // run: no stack deeper than a run can record, and no more frames in all than a budget.
        let mut depth = vec![0u32; self.stacks.len()];
        for (i, &(_, prefix)) in self.stacks.iter().enumerate() {
            depth[i] = prefix.map_or(1, |p| depth[p] + 1);
            if depth[i] as usize > MAX_STACK_DEPTH {
                return Err(RecordingError::TooDeep(MAX_STACK_DEPTH));
            }
        }
        let mut expanded: u64 = 0;
        for p in self.all_processes() {
            for t in p.threads.values() {
                if t.samples
                    .iter()
                    .any(|s| s.stack.is_some_and(|st| st >= self.stacks.len()))
                {
                    return Err(RecordingError::SampleOutOfRange(t.tid));
                }
                let mut distinct: Vec<StackId> = t.samples.iter().filter_map(|s| s.stack).collect();
                distinct.sort_unstable();
                distinct.dedup();
                expanded += distinct.iter().map(|&s| depth[s] as u64).sum::<u64>();
            }
        }
        if expanded > MAX_EXPANDED_FRAMES {
            return Err(RecordingError::TooManyFrames(expanded, MAX_EXPANDED_FRAMES));
        }
        if !self.interval_ms.is_finite() || self.interval_ms <= 0.0 {
            return Err(RecordingError::Interval);
        }
        self.lib_ids = self
            .libs
            .iter()
            .enumerate()
            .map(|(i, l)| (l.path.clone(), i))
            .collect();
        self.func_ids = self.funcs.iter().cloned().zip(0..).collect();
        self.frame_ids = self.frames.iter().cloned().zip(0..).collect();
        self.stack_ids = self.stacks.iter().copied().zip(0..).collect();
        Ok(())
    }

    /// Frames of a stack, root first.
    pub fn stack_root_first(&self, stack: StackId) -> Vec<FrameId> {
        let mut out = Vec::with_capacity(64);
        let mut s = Some(stack);
        while let Some(i) = s {
            out.push(self.stacks[i].0);
            s = self.stacks[i].1;
        }
        out.reverse();
        out
    }

    /// Every process of the run, live and retired.
    pub fn all_processes(&self) -> impl Iterator<Item = &ProcessData> {
        self.retired.iter().chain(self.processes.values())
    }

    pub fn lib(&mut self, path: &Arc<str>) -> LibId {
        if let Some(&id) = self.lib_ids.get(path) {
            return id;
        }
        let name: Arc<str> = Arc::from(path.rsplit('/').next().unwrap_or(path));
        let id = self.libs.len();
        self.libs.push(Lib {
            name,
            path: path.clone(),
            build_id: None,
            interpreter: false,
        });
        self.lib_ids.insert(path.clone(), id);
        id
    }

    /// Marks library `lib` as the interpreter's own code (`Lib::interpreter`).
    pub fn set_interpreter(&mut self, lib: LibId, interpreter: bool) {
        self.libs[lib].interpreter |= interpreter;
    }

    /// Library `lib`'s build id, once known.
    pub fn set_build_id(&mut self, lib: LibId, build_id: Option<&Arc<str>>) {
        if self.libs[lib].build_id.is_none() {
            self.libs[lib].build_id = build_id.cloned();
        }
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
            prefix = Some(self.intern_stack(f, prefix));
        }
        prefix
    }

    /// The stack of `frame` called from `prefix`.
    fn intern_stack(&mut self, frame: FrameId, prefix: Option<StackId>) -> StackId {
        let key = (frame, prefix);
        let next = self.stacks.len();
        let id = *self.stack_ids.entry(key).or_insert(next);
        if id == next {
            self.stacks.push(key);
        }
        id
    }

    /// `stack`, for the samples of one thread (`hint`, its tid): a thread's samples share
    /// most of their frames with one of its recent ones (the same request handler, the same
    /// wait), so the ids of the frames a recent stack of that hint shares from the root are
    /// taken from it, with a comparison each instead of a hash lookup (the lookups were a tenth
    /// of the profiler's own CPU on a threaded service: each is a cache miss or two in a table
    /// of every stack prefix of the run). The `RECENT_WAYS` latest stacks of the hint are
    /// compared, and the one sharing the most is used. The same ids as `stack`'s: the memos
    /// are checked frame by frame, so a hint shared by two threads costs only lookups.
    pub fn stack_near(&mut self, root_first: &[FrameId], hint: u32) -> Option<StackId> {
        if self.recent_stacks.is_empty() {
            self.recent_stacks
                .resize_with(RECENT_STACKS * RECENT_WAYS, RecentStack::default);
            self.recent_next = vec![0; RECENT_STACKS];
        }
        let group = hint as usize % RECENT_STACKS;
        let ways = &self.recent_stacks[group * RECENT_WAYS..(group + 1) * RECENT_WAYS];
        let (best, shared) = ways
            .iter()
            .map(|m| {
                m.frames
                    .iter()
                    .zip(root_first)
                    .take_while(|(a, b)| a == b)
                    .count()
            })
            .enumerate()
            .max_by_key(|&(_, n)| n)
            .unwrap_or((0, 0));
        // The new stack takes the oldest way, with the shared part of the best one's ids.
        let way = self.recent_next[group] as usize % RECENT_WAYS;
        self.recent_next[group] = ((way + 1) % RECENT_WAYS) as u8;
        let (slot, from) = (group * RECENT_WAYS + way, group * RECENT_WAYS + best);
        let mut memo = std::mem::take(&mut self.recent_stacks[slot]);
        if slot != from {
            let src = &self.recent_stacks[from];
            memo.frames.clear();
            memo.frames.extend_from_slice(&src.frames[..shared]);
            memo.ids.clear();
            memo.ids.extend_from_slice(&src.ids[..shared]);
        }
        memo.frames.truncate(shared);
        memo.ids.truncate(shared);
        let mut prefix = memo.ids.last().copied();
        for &f in &root_first[shared..] {
            let id = self.intern_stack(f, prefix);
            memo.frames.push(f);
            memo.ids.push(id);
            prefix = Some(id);
        }
        self.recent_stacks[slot] = memo;
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
        let births = &mut self.births;
        let p = self.processes.entry(pid).or_insert_with(|| ProcessData {
            pid,
            name: name.to_string(),
            python: None,
            threads: BTreeMap::new(),
            first_ms: t_ms,
            last_ms: t_ms,
            start_ms: births.remove(&(pid, 0)),
            end_ms: None,
            generation: 0,
            identity: None,
        });
        // Named again after an exec folded the moment before it in (`exec`).
        if p.name.is_empty() {
            p.name = name.to_string();
        }
        p
    }

    /// The thread, created on first sight.
    pub fn thread_mut(
        &mut self,
        pid: u32,
        proc_name: &str,
        tid: u32,
        thread_name: &str,
        t_ms: f64,
    ) -> &mut ThreadData {
        let born = self.births.remove(&(pid, tid));
        let p = self.process_mut(pid, proc_name, t_ms);
        // A thread whose creation was not seen is as old as what is known of its process.
        let born = born.or(p.start_ms);
        p.first_ms = p.first_ms.min(t_ms);
        p.last_ms = p.last_ms.max(t_ms);
        let t = p.threads.entry(tid).or_insert_with(|| ThreadData {
            tid,
            name: thread_name.to_string(),
            python_name: None,
            samples: Vec::new(),
            markers: Vec::new(),
            first_ms: t_ms,
            last_ms: t_ms,
            start_ms: born,
            end_ms: None,
            sched: timeline::SchedState::default(),
        });
        t.first_ms = t.first_ms.min(t_ms);
        t.last_ms = t.last_ms.max(t_ms);
        if t.name.is_empty() {
            t.name = thread_name.to_string();
        }
        t
    }

    /// A sample in state `st`: on CPU (the sampling timer's, `st` with `ON_CPU`), or of a
    /// blocked thread read from outside (`dump`), without it.
    #[allow(clippy::too_many_arguments)]
    pub fn add_sample(
        &mut self,
        pid: u32,
        proc_name: &str,
        tid: u32,
        thread_name: &str,
        time_ms: f64,
        stack: Option<StackId>,
        st: u8,
    ) {
        self.counters.samples += 1;
        let s = Sample {
            time_ms,
            stack,
            state: st,
            weight_ms: self.interval_ms,
            in_mode: self.mode.keeps(st),
            cpu_delta_us: 0.0,
        };
        let t = self.thread_mut(pid, proc_name, tid, thread_name, time_ms);
        t.sched.note_sample(time_ms, stack, s.state);
        t.samples.push(s);
    }

    /// A sample of a suspended asyncio task (`--async-aware all`), on the pseudo-thread of the
    /// event loop of thread `tid`: off CPU, standing for `weight_ms` of suspended time, in
    /// every mode (the view is a wall-time one).
    pub fn add_task_sample(
        &mut self,
        pid: u32,
        loop_tid: u32,
        thread_name: &str,
        time_ms: f64,
        stack: Option<StackId>,
        weight_ms: f64,
    ) {
        let s = Sample {
            time_ms,
            stack,
            state: 0,
            weight_ms,
            in_mode: true,
            cpu_delta_us: 0.0,
        };
        let t = self.thread_mut(pid, "", loop_tid | TASK_THREAD_BIT, thread_name, time_ms);
        t.samples.push(s);
    }

    /// A task was created during the run (`tid == pid`: a new process).
    pub fn task_born(&mut self, pid: u32, tid: u32, t_ms: f64) {
        if pid == tid {
            // A pid seen before is being reused: the old process is over.
            self.retire(pid, t_ms);
            self.births.insert((pid, 0), t_ms);
        }
        self.births.insert((pid, tid), t_ms);
    }

    /// A thread exited; `group_dead` when its process is over.
    pub fn task_exit(&mut self, pid: u32, tid: u32, t_ms: f64, group_dead: bool) {
        self.births.remove(&(pid, tid));
        if let Some(p) = self.processes.get_mut(&pid) {
            if let Some(t) = p.threads.get_mut(&tid) {
                t.end_ms = Some(t_ms);
                t.last_ms = t.last_ms.max(t_ms);
                t.sched.exit(t_ms);
            }
            if group_dead {
                p.end_ms = Some(t_ms);
                p.last_ms = p.last_ms.max(t_ms);
            }
        }
        if group_dead {
            self.births.remove(&(pid, 0));
        }
    }

    /// The process `pid` replaced its program: what came before is a finished process, and the
    /// new program starts now.
    pub fn exec(&mut self, pid: u32, t_ms: f64) {
        // A program that ran for moments before its exec (a launcher's or a shell's child between
        // fork and exec) is not a process of its own in the profile: its time is the new
        // program's start, on the same track.
        let interval = self.interval_ms;
        if let Some(p) = self.processes.get_mut(&pid) {
            let on_cpu = p
                .threads
                .values()
                .flat_map(|t| &t.samples)
                .filter(|s| s.state & state::ON_CPU != 0)
                .count();
            if on_cpu as f64 * interval <= PRE_EXEC_MOMENT_MS {
                // Named again by the new program's first sample.
                p.name.clear();
                p.python = None;
                if let Some(t) = p.threads.get_mut(&pid) {
                    t.name.clear();
                }
                return;
            }
        }
        self.retire(pid, t_ms);
        self.births.insert((pid, 0), t_ms);
        self.births.insert((pid, pid), t_ms);
    }

    fn retire(&mut self, pid: u32, t_ms: f64) {
        if let Some(mut p) = self.processes.remove(&pid) {
            if p.threads.values().all(|t| t.samples.is_empty()) {
                // Nothing ran worth showing (a launched command held before its exec).
                return;
            }
            p.generation = self.retired.iter().filter(|r| r.pid == pid).count() as u32 + 1;
            p.end_ms.get_or_insert(t_ms);
            for t in p.threads.values_mut() {
                t.end_ms.get_or_insert(t_ms);
                t.sched.exit(t_ms);
            }
            self.retired.push(p);
        }
    }

    /// Copies a stack of `from` into this profile.
    pub fn import_stack(&mut self, from: &Profile, stack: StackId) -> Option<StackId> {
        let frames: Vec<FrameId> = from
            .stack_root_first(stack)
            .into_iter()
            .map(|f| {
                let fr = &from.frames[f];
                let mut func = from.funcs[fr.func].clone();
                func.lib = func.lib.map(|l| {
                    let id = self.lib(&from.libs[l].path);
                    self.set_build_id(id, from.libs[l].build_id.as_ref());
                    self.set_interpreter(id, from.libs[l].interpreter);
                    id
                });
                let func = self.func(func);
                self.frame(Frame { func, ..fr.clone() })
            })
            .collect();
        self.stack(&frames)
    }

    /// The next profile of a continuous run, starting at `end_ms` of this one (its 0): the
    /// processes and threads alive now, each with its scheduler state (on CPU, or off CPU in the
    /// stack it left with). Call before `finish`.
    pub fn successor(&self, end_ms: f64) -> Profile {
        let mut next = Profile::new(self.mode, self.interval_ms);
        next.timeline = self.timeline;
        for p in self.processes.values().filter(|p| p.end_ms.is_none()) {
            let mut threads = BTreeMap::new();
            for t in p.threads.values().filter(|t| t.end_ms.is_none()) {
                let sched = t
                    .sched
                    .continuation(|s| s.and_then(|s| next.import_stack(self, s)));
                threads.insert(
                    t.tid,
                    ThreadData {
                        tid: t.tid,
                        name: t.name.clone(),
                        python_name: t.python_name.clone(),
                        samples: Vec::new(),
                        markers: Vec::new(),
                        first_ms: 0.0,
                        last_ms: 0.0,
                        start_ms: None,
                        end_ms: None,
                        sched,
                    },
                );
            }
            next.processes.insert(
                p.pid,
                ProcessData {
                    pid: p.pid,
                    name: p.name.clone(),
                    python: p.python.clone(),
                    threads,
                    first_ms: 0.0,
                    last_ms: 0.0,
                    start_ms: None,
                    end_ms: None,
                    generation: 0,
                    identity: p.identity.clone(),
                },
            );
        }
        // Tasks born but not seen yet are born at the start of the next profile at the latest.
        next.births = self
            .births
            .iter()
            .map(|(&k, &t)| (k, (t - end_ms).max(0.0)))
            .collect();
        next
    }

    /// Ends the run at `end_ms`: closes open intervals, sorts samples, computes CPU deltas and
    /// Recordings made before the exception markers existed get them from their samples'
    /// states (which have the exception bit), so that they convert as a run does today.
    pub fn add_missing_exception_markers(&mut self) {
        let interval = self.interval_ms;
        for p in self.retired.iter_mut().chain(self.processes.values_mut()) {
            for t in p.threads.values_mut() {
                if t.markers.iter().any(|m| m.category == Category::Exception) {
                    continue;
                }
                let built = markers::build(&t.samples, interval);
                t.markers.extend(
                    built
                        .into_iter()
                        .filter(|m| m.category == Category::Exception),
                );
                sort_markers(&mut t.markers);
            }
        }
    }

    /// builds the state markers.
    pub fn finish(&mut self, end_ms: f64) {
        self.end_ms = end_ms;
        let interval = self.interval_ms;
        for p in self.retired.iter_mut().chain(self.processes.values_mut()) {
            for t in p.threads.values_mut() {
                let end = t.end_ms.unwrap_or(end_ms);
                let start = t.start_ms.unwrap_or(0.0);
                t.sched.finish(&t.samples, start, end);
                t.samples.sort_by(|a, b| a.time_ms.total_cmp(&b.time_ms));
                timeline::cpu_deltas(&mut t.samples, &t.sched, start);
                t.markers = markers::build(&t.samples, interval);
                t.markers
                    .extend(timeline::cpu_markers(&t.sched, start, end));
                sort_markers(&mut t.markers);
                if let Some(last) = t.samples.last() {
                    t.last_ms = t.last_ms.max(last.time_ms + last.weight_ms);
                }
                p.last_ms = p.last_ms.max(t.last_ms);
            }
        }
    }

    pub fn thread_count(&self) -> usize {
        self.all_processes().map(|p| p.threads.len()).sum()
    }
}

#[cfg(test)]
mod tests;
