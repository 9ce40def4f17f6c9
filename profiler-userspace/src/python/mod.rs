//! Python support, and the one place that knows CPython: finding 3.8-3.15 runtimes, feeding
//! the BPF frame walk (per-process layout and the thread -> thread-state map), resolving code
//! objects to names and lines, merging Python frames into native stacks, and the interpreter's
//! native functions other layers ask about (`SPLIT_FUNCTIONS`, `is_gil_function`,
//! `is_gc_function`).
//!
//! Where things live:
//! - `registry`: the Python processes (`PythonRegistry`, `PythonOptions`), verdicts on others;
//! - `discover`: finding a runtime (`PyProcess`, its `Runtime`), its version and layout;
//! - `layout`: per-version layouts; `objects`: CPython object offsets beyond them;
//! - `code_cache`, `code`: code objects (read, validated per epoch, retired), line tables;
//! - `thread_states`, `thread_names`: threads' thread states and `threading` names;
//! - `resolve`: a sample's frames grouped into activations; `merge`: into the native stack;
//! - `frame_chain`: the one walk of a frame chain from outside;
//! - `asyncio/`: tasks, await chains and per-process asyncio state (`--async-aware`);
//! - `native_names`: the interpreter's functions other layers ask about; `opcodes`.
//!
//! May import `process`, `stack` and `capture` (the raw sample); never `aggregate`. Resolved
//! frames and counted events go to the caller through `ProfileSink`, which `collect`
//! implements over its profile: this module hands over what it knows and gets ids back.

pub mod asyncio;
pub mod code;
pub mod code_cache;
pub mod discover;
pub mod frame_chain;
pub mod layout;
pub mod merge;
pub mod native_names;
pub mod objects;
pub mod opcodes;
pub mod registry;
pub mod resolve;
pub mod thread_names;
pub mod thread_states;

/// Reads of the target's memory (the process layer's, used throughout this module).
pub use crate::process::remote;

pub use discover::{maps_mention_python, python_name};
pub use native_names::{
    is_anonymous_gil_wait, is_gc_function, is_gil_function, is_interpreter_file, SPLIT_FUNCTIONS,
};
pub use registry::{AsyncTasks, PythonOptions, PythonRegistry};

use std::sync::Arc;

/// An id the caller's `ProfileSink` gave a function or a frame.
pub type FrameRef = usize;

/// What Python resolution counts, one event at a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PyEvent {
    /// A record of a Python thread (a sample or an off-CPU capture).
    Record,
    /// A thread of a Python process missing from the BPF thread map.
    ThreadMiss,
    /// The BPF frame walk hit a failed read.
    ReadFailed,
    /// The frame chain was longer than the BPF side walks.
    Truncated,
    /// The frame chain looped back on itself.
    Cycle,
    /// A code object that could not be read.
    Unresolved,
    /// A corrupt line table (the frame shows the function's first line).
    BadLineTable,
    /// Every activation paired with an eval-loop frame of the native stack.
    Merged,
    /// Activations and eval-loop frames did not pair up.
    MergeMismatch,
    /// A sample shown from its running asyncio task (`--async-aware`).
    AsyncTask,
    /// A running task whose coroutine is none of the sample's frames (shown plain).
    AsyncMismatch,
    /// An await chain cut short (a cycle, a task that did not read, or the depth bound), or a
    /// task list (`--async-aware all`).
    AsyncCut,
    /// A suspended task's sample (`--async-aware all`).
    AsyncSuspended,
}

/// Where resolved Python frames and counted events go: `collect` implements it over its
/// profile. The ids it returns are opaque here.
pub trait ProfileSink {
    /// A Python function: its code object's name, file and first line.
    fn python_function(&mut self, name: &Arc<str>, file: &Arc<str>, first_line: u32) -> FrameRef;
    /// A frame of function `func` (an id from `python_function`) at `line`, running `opcode`
    /// (only with `--opcodes`, for the innermost Python frame).
    fn python_frame(
        &mut self,
        func: FrameRef,
        line: u32,
        opcode: Option<opcodes::Opcode>,
    ) -> FrameRef;
    /// The frame of an asyncio task (`<task> NAME`, `--async-aware`).
    fn task_frame(&mut self, name: &str) -> FrameRef;
    /// The frame shown for a code object that could not be read.
    fn unresolved_frame(&mut self) -> FrameRef;
    fn count(&mut self, event: PyEvent);
}

/// A thread's Python frames and interpreter words read from outside (`walk_thread`).
pub struct WalkedThread {
    pub tstate: u64,
    /// Innermost first, as the BPF walk records them.
    pub frames: Vec<profiler_common::PyFrame>,
    pub gil_holder: u64,
    pub gil_locked: u32,
    pub gc_collecting: u32,
    /// The asyncio task its event loop runs (`--async-aware`), or 0.
    pub running_task: u64,
    pub read_failed: bool,
}

/// The interpreter's state of a thread at a sample.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PyThreadState {
    /// The thread holds the GIL.
    pub has_gil: bool,
    /// The thread runs the garbage collector (and holds the GIL).
    pub gc: bool,
    /// The process's main thread.
    pub main_thread: bool,
}

/// The Python frames of one sample, grouped by interpreter activation.
pub struct PythonFrames {
    /// Outermost activation first; frames inside one activation root-first.
    pub activations: Vec<Vec<FrameRef>>,
    /// `None` for a thread without a Python thread state.
    pub state: Option<PyThreadState>,
    /// `--async-aware`: where the sample's running asyncio task starts, and the task frames
    /// that replace what is rootward of it (the event loop's machinery).
    pub tasks: Option<TaskSplice>,
}

/// How a sample is shown from its running asyncio task (`PythonFrames::tasks`).
pub struct TaskSplice {
    /// The outermost frame of the running task's coroutine: it and everything leafward stay.
    pub from: FrameRef,
    /// Root first: the outermost awaiting task's `<task>` frame and coroutine chain, and so on
    /// to the running task's `<task>` frame.
    pub prefix: Arc<Vec<FrameRef>>,
}

/// Why a process is not profiled as Python.
#[derive(Debug)]
pub enum NotPython {
    /// No CPython runtime in its executable or libraries.
    NoRuntime,
    /// A runtime that is not initialised yet (try again later).
    NotReady,
    /// A version or build this profiler does not support.
    Unsupported(String),
}

/// What changed in a Python process's threads: (tid, thread state) to install, tids to remove.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ThreadChanges {
    pub set: Vec<(u32, u64)>,
    pub gone: Vec<u32>,
    /// Threads whose `threading` name was read since the last call: (tid, name).
    pub named: Vec<(u32, String)>,
}

/// Bits of a user-space address: x86_64's lower half is 47 bits; arm64's is 48 (its
/// `mmap` base sits just below 2^48).
const USER_ADDR_BITS: u32 = if cfg!(target_arch = "aarch64") {
    48
} else {
    47
};

/// An address a Python object of the target can have: 8-aligned, above the first pages, in
/// the user half.
pub(crate) fn plausible_object(a: u64) -> bool {
    a & 7 == 0 && a >= 0x10000 && a >> USER_ADDR_BITS == 0
}
