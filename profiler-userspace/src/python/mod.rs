//! Python support, and the one place that knows CPython: finding 3.8-3.15 runtimes, feeding
//! the BPF frame walk (per-process layout and the thread -> thread-state map), resolving code
//! objects to names and lines, merging Python frames into native stacks, and the interpreter's
//! native functions other layers ask about (`SPLIT_FUNCTIONS`, `is_gil_function`,
//! `is_gc_function`).
//!
//! May import `process`, `stack` and `capture` (the raw sample); never `aggregate`. Resolved
//! frames and counted events go to the caller through `ProfileSink`, which `collect`
//! implements over its profile: this module hands over what it knows and gets ids back.

pub mod asyncio;
pub mod code;
pub mod layout;
pub mod merge;
pub mod opcodes;
/// Reads of the target's memory (the process layer's, used throughout this module).
pub use crate::process::remote;
pub mod threads;

use std::collections::{HashMap, HashSet};

use rustc_hash::{FxHashMap, FxHashSet};
use std::sync::Arc;

use profiler_common::{
    PyProcConfig, PY_FRAME_SNAP_SHIFT, SAMPLE_PY_CYCLE, SAMPLE_PY_MISS, SAMPLE_PY_READ_FAILED,
    SAMPLE_PY_THREAD, SAMPLE_PY_TRUNCATED,
};

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
use crate::capture::record::RawSample;
use crate::process::Process;
use code::CodeInfo;
use layout::{Activations, Layout};
use remote::{le_u64, Remote};

/// Bounds on walks of target lists (untrusted memory).
const MAX_INTERPRETERS: usize = 64;
const MAX_THREADS: usize = 4096;
/// Code objects cached per process before the cache is cleared.
const MAX_CODES: usize = 200_000;
/// How long a code object is seen at its address (sample time) before the frame walk stops
/// copying its head (`PyProcess::settled`): a function lives as long as the program, while code
/// run by `exec` in a loop lives milliseconds, and its address goes to the next one.
const SETTLED_NS: u64 = 1_000_000_000;
/// A process with no runtime is looked at this many times, this far apart, before it is
/// taken to be something else (its libraries may still be loading).
const NO_RUNTIME_ATTEMPTS: u32 = 20;
const NO_RUNTIME_RETRY: std::time::Duration = std::time::Duration::from_millis(50);

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

/// A cached await chain (`PyProcess::await_chains`).
struct AwaitEntry {
    epoch: u64,
    key: Option<[u64; 3]>,
    chain: Option<Arc<asyncio::AwaitChain>>,
    /// The chain's frames once resolved (`PyProcess::task_prefix`).
    prefix: Option<Arc<Vec<FrameRef>>>,
}

/// How a sample is shown from its running asyncio task (`PythonFrames::tasks`).
pub struct TaskSplice {
    /// The outermost frame of the running task's coroutine: it and everything leafward stay.
    pub from: FrameRef,
    /// Root first: the outermost awaiting task's `<task>` frame and coroutine chain, and so on
    /// to the running task's `<task>` frame.
    pub prefix: Arc<Vec<FrameRef>>,
}

/// Threads of a process whose frames are walked for their event loops (3.11-3.13, `all`), and
/// locals of each frame looked at for a task.
const MAX_LOOP_THREADS: usize = 256;
const LOCALS_SCANNED: usize = 8;
/// Passes of `all` (3.11-3.13) between walks of a process's threads for their loops.
const LOOP_WALK_EVERY: u32 = 10;

/// How often a process that has not imported asyncio (or not yet) is looked at again: often
/// for its first `ASYNCIO_EARLY_LOOKS` looks (a program imports asyncio as it starts), then
/// seldom.
const ASYNCIO_EARLY_RETRY: std::time::Duration = std::time::Duration::from_millis(50);
const ASYNCIO_EARLY_LOOKS: u32 = 100;
const ASYNCIO_RETRY: std::time::Duration = std::time::Duration::from_secs(1);

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

pub struct PyProcess {
    pub pid: u32,
    pub layout: Layout,
    pub version: String,
    remote: Remote,
    runtime: u64,
    none_addr: u64,
    code_type: u64,
    /// Address of `PyUnicode_Type` (0 if unknown): a string read from the target must be one.
    str_type: u64,
    /// Address of `PyLong_Type` (0 if unknown): a task not named yet is named by its number.
    long_type: u64,
    /// asyncio's layout once found (`--async-aware`), and when it was last looked for.
    asyncio: Option<asyncio::AsyncLayout>,
    asyncio_looked: Option<std::time::Instant>,
    asyncio_looks: u32,
    /// 3.11-3.13, `--async-aware`: asyncio's `Handle._run` code object is looked for among
    /// the code objects samples name, and its address once seen (see
    /// `PyProcConfig::handle_run_code`).
    handle_run_wanted: bool,
    handle_run: u64,
    /// 3.11-3.13, `all`: the set of every task once found, a task seen running (to find it
    /// from), and the thread each event loop was seen running a task in.
    task_set: u64,
    seen_task: u64,
    loop_threads: FxHashMap<u64, u32>,
    /// Passes of `all` since the threads were last walked for their loops.
    loop_passes: u32,
    /// Await chains by running task, with the epoch they were last checked in and what they
    /// were read from (`AsyncLayout::task_key`).
    await_chains: FxHashMap<u64, AwaitEntry>,
    /// `<task>` frames by task name.
    task_frames: FxHashMap<String, FrameRef>,
    /// `--async-aware all`: task names kept between passes.
    task_names: asyncio::NameCache,
    pub config: PyProcConfig,
    /// Whether the runtime had its interpreter (and GIL) when last looked at. Until then the
    /// BPF side finds the interpreter itself (`PyProcConfig::interp_head`) and no GIL is read.
    pub ready: bool,
    /// Host tid -> thread state, as last pushed to the BPF map.
    pub threads: HashMap<u32, u64>,
    /// When `threads` was last read, and whether a thread has started or ended since, or ran
    /// Python code without being in it (`PythonRegistry::threads_due`).
    threads_read: Option<std::time::Instant>,
    threads_changed: bool,
    /// The tids `/proc` listed for it at that read.
    listed: FxHashSet<u32>,
    /// Code objects by address, with the epoch they were last validated in.
    codes: FxHashMap<u64, (Arc<CodeInfo>, u64)>,
    /// Code objects that were at an address before another took it, by address and identity: a
    /// sample's copy of a code head with that identity names its frame with them (line table
    /// included) after the object itself is gone.
    retired: FxHashMap<(u64, [u64; 3]), Arc<CodeInfo>>,
    /// Code objects the frame walk copied, by address, with the time of the first sample that
    /// showed that object there (`settled`).
    young: FxHashMap<u64, (u64, Arc<CodeInfo>)>,
    /// Addresses whose code object was found freed or replaced since the BPF side was last told
    /// (`PythonRegistry::take_forgotten_codes`).
    gone: Vec<u64>,
    /// Functions by code address and identity, with the name and file they were made for: an
    /// object made where a freed one was, with its strings where the freed one's were, has the
    /// same identity and other names.
    funcs: FxHashMap<(u64, [u64; 3]), MadeFunction>,
    /// Frames by function, line and (innermost frames with `--opcodes`) opcode byte.
    frames: FxHashMap<(FrameRef, u32, Option<u8>), FrameRef>,
    /// Reads of `threading` names tried, by host tid (`NAME_TRIES` once named or given up).
    name_tries: HashMap<u32, u8>,
    /// Offset of the kernel tid in the C library's thread struct (found once, <= 3.10).
    pthread_tid_offset: Option<u64>,
    /// Its threads' tids in its own pid namespace (`task_ids`).
    ns_tids: NsTids,
    pub label: String,
}

/// What is known of a process's pid namespace: whether it is the one `/proc` shows (then a
/// thread's tid is the same in both), and otherwise each listed thread's tid in its own.
#[derive(Default)]
struct NsTids {
    same: Option<bool>,
    known: HashMap<u32, u32>,
}

fn parse_minor_from_path(path: &str) -> Option<u32> {
    let file = path.rsplit('/').next()?;
    let rest = file
        .strip_prefix("libpython3.")
        .or_else(|| file.strip_prefix("python3."))?;
    let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
    digits.parse().ok()
}

/// A name for the process that shows the script: `app.py`, `-m module` or `-c`.
fn script_label(cmdline: &[String], fallback: &str) -> String {
    let mut it = cmdline.iter().skip(1);
    while let Some(a) = it.next() {
        if a == "-m" {
            return format!("-m {}", it.next().map(String::as_str).unwrap_or(""));
        }
        if a == "-c" {
            return "-c".into();
        }
        if a.starts_with('-') {
            if matches!(a.as_str(), "-W" | "-X" | "--check-hash-based-pycs") {
                it.next();
            }
            continue;
        }
        return a.rsplit('/').next().unwrap_or(a).to_string();
    }
    fallback.to_string()
}

/// arm64: how far below the thread pointer glibc keeps a thread's descriptor, which is what
/// `pthread_self` returns (`TLS_DTV_AT_TP`: the descriptor sits just below the TCB the thread
/// pointer addresses). glibc exports its size for debuggers as `_thread_db_sizeof_pthread`; it
/// is read from the process's own C library, whatever its version. `None` without glibc.
fn thread_descriptor_size(proc: &Process, remote: &Remote) -> Option<u32> {
    proc.modules.iter().find_map(|m| {
        let file_name = m.path.rsplit('/').next().unwrap_or("");
        if !file_name.starts_with("libc.so") && !file_name.starts_with("libc-") {
            return None;
        }
        let elf = m.elf.as_ref()?;
        let at = *elf
            .find_symbols(&["_thread_db_sizeof_pthread"])
            .get("_thread_db_sizeof_pthread")?;
        // A descriptor is some hundreds of bytes to a few KiB: anything else is not glibc's.
        remote
            .u32(at.wrapping_add(m.bias))
            .filter(|&n| (256..=16384).contains(&n))
    })
}

impl PyProcess {
    /// Finds the CPython runtime of `proc` (its mappings must be loaded).
    pub fn discover(proc: &Process) -> Result<PyProcess, NotPython> {
        let remote = Remote { pid: proc.pid };
        let wanted = [
            "_PyRuntime",
            "Py_Version",
            "_Py_NoneStruct",
            "PyCode_Type",
            "PyUnicode_Type",
            "PyLong_Type",
        ];
        for m in &proc.modules {
            let Some(elf) = &m.elf else { continue };
            let file_name = m.path.rsplit('/').next().unwrap_or("");
            if !file_name.contains("python") {
                continue;
            }
            let syms = elf.find_symbols(&wanted);
            let runtime_svma = syms
                .get("_PyRuntime")
                .copied()
                .or_else(|| elf.section_address(".PyRuntime"));
            let Some(runtime_svma) = runtime_svma else {
                continue;
            };
            let runtime = runtime_svma.wrapping_add(m.bias);
            let addr = |n: &str| syms.get(n).map(|a| a.wrapping_add(m.bias)).unwrap_or(0);

            // Version: debug offsets (3.13+), Py_Version (3.11+), the file name.
            let head = remote.read(runtime, 24);
            let mut hex = head
                .as_ref()
                .filter(|h| &h[..8] == layout::DEBUG_COOKIE)
                .and_then(|h| le_u64(h, 8));
            if hex.is_none() && addr("Py_Version") != 0 {
                hex = remote.u32(addr("Py_Version")).map(|v| v as u64);
            }
            let (major, minor, micro) = match hex {
                Some(v) => ((v >> 24) & 0xff, ((v >> 16) & 0xff) as u32, (v >> 8) & 0xff),
                None => match parse_minor_from_path(&m.path) {
                    Some(minor) => (3, minor, 0),
                    None => continue,
                },
            };
            let version = if hex.is_some() {
                format!("{major}.{minor}.{micro}")
            } else {
                format!("{major}.{minor}")
            };
            if major != 3 {
                return Err(NotPython::Unsupported(format!("Python {version}")));
            }
            let Some(mut layout) = layout::builtin(minor) else {
                return Err(NotPython::Unsupported(format!("Python {version}")));
            };
            if minor >= 13 {
                match layout::apply_debug_offsets(&remote, runtime, &mut layout) {
                    Some(d) if d.free_threaded => {
                        return Err(NotPython::Unsupported(format!(
                            "free-threaded Python {version}"
                        )))
                    }
                    Some(_) => {}
                    None => {
                        return Err(NotPython::Unsupported(format!(
                            "Python {version} without debug offsets"
                        )))
                    }
                }
            }
            // A runtime still starting (no interpreter or GIL yet) is profiled already: the BPF
            // side reads the interpreter from the runtime until it is looked at again.
            let interp = remote.u64(runtime + layout.interp_head).unwrap_or(0);
            let gil = match interp {
                0 => Err(NotPython::NotReady),
                _ => gil_words(&layout, runtime, interp, |a| remote.u64(a)),
            };
            let ready = gil.is_ok();
            let gil = match gil {
                Ok(g) => g,
                Err(NotPython::NotReady) => None,
                Err(e) => return Err(e),
            };
            let gc = layout.gc_collecting_runtime.map(|o| runtime + o).or(layout
                .gc_collecting_interp
                .filter(|_| interp != 0)
                .map(|o| interp + o));
            let mut config = layout.proc_config(gil, gc, addr("_Py_NoneStruct"), interp);
            if cfg!(target_arch = "aarch64") {
                config.thread_id_below_tp =
                    thread_descriptor_size(proc, &remote).unwrap_or(profiler_common::NO_OFFSET);
            }
            if !ready {
                config.interp = 0;
                config.interp_head = runtime + layout.interp_head;
            }
            return Ok(PyProcess {
                pid: proc.pid,
                label: format!(
                    "{} (Python {version})",
                    script_label(&proc.cmdline, &proc.comm)
                ),
                layout,
                version,
                remote,
                runtime,
                none_addr: addr("_Py_NoneStruct"),
                code_type: addr("PyCode_Type"),
                str_type: addr("PyUnicode_Type"),
                long_type: addr("PyLong_Type"),
                asyncio: None,
                asyncio_looked: None,
                asyncio_looks: 0,
                handle_run_wanted: false,
                handle_run: 0,
                task_set: 0,
                seen_task: 0,
                loop_threads: FxHashMap::default(),
                loop_passes: 0,
                await_chains: FxHashMap::default(),
                task_frames: FxHashMap::default(),
                task_names: asyncio::NameCache::new(),
                config,
                ready,
                threads: HashMap::new(),
                threads_read: None,
                threads_changed: false,
                listed: FxHashSet::default(),
                codes: FxHashMap::default(),
                retired: FxHashMap::default(),
                young: FxHashMap::default(),
                gone: Vec::new(),
                funcs: FxHashMap::default(),
                frames: FxHashMap::default(),
                pthread_tid_offset: None,
                ns_tids: NsTids::default(),
                name_tries: HashMap::new(),
            });
        }
        Err(NotPython::NoRuntime)
    }

    /// Looks for asyncio's layout in the mapped files (3.11-3.13: takes it from the tables
    /// once the `_asyncio` extension is mapped or `Handle._run` was seen); true when it is
    /// newly found, or (3.11-3.13) `Handle._run` was seen since: the BPF config changed.
    fn look_for_asyncio(&mut self, proc: &Process) -> bool {
        if self.asyncio.is_some() {
            let news = self.handle_run != 0 && self.config.handle_run_code == 0;
            self.async_config();
            return news;
        }
        self.asyncio_looked = Some(std::time::Instant::now());
        self.asyncio_looks = self.asyncio_looks.saturating_add(1);
        let legacy_seen = || {
            self.handle_run != 0
                || proc.modules.iter().any(|m| {
                    m.path
                        .rsplit('/')
                        .next()
                        .is_some_and(|f| f.starts_with("_asyncio"))
                })
        };
        let found = match self.handle_run_wanted {
            true if legacy_seen() => {
                asyncio::AsyncLayout::legacy(&self.layout, self.str_type, self.long_type)
            }
            true => None,
            false => asyncio::AsyncLayout::find(
                proc,
                &self.remote,
                &self.layout,
                self.str_type,
                self.long_type,
            ),
        };
        let Some(a) = found else { return false };
        log::info!("pid {}: asyncio found", self.pid);
        self.asyncio = Some(a);
        self.async_config();
        true
    }

    /// Sets what the BPF side reads of asyncio at a sample into `config` (again after the
    /// rest of it was taken anew: `PythonRegistry::refresh`).
    fn async_config(&mut self) {
        let Some(a) = &self.asyncio else { return };
        let c = &mut self.config;
        if let Some(off) = a.tstate_running_task() {
            c.tstate_running_task = off as u32;
        } else if self.handle_run != 0 {
            c.handle_run_code = self.handle_run;
            c.frame_self = self.layout.frame_localsplus;
            c.handle_callback = asyncio::HANDLE_CALLBACK;
            c.step_task = asyncio::STEP_TASK;
            c.frame_read_size = c.frame_read_size.max(c.frame_self + 8);
        }
    }

    /// The await chain of the running task `task`: checked once per epoch (one read of the
    /// task), read again when the task's own words changed.
    fn await_chain(&mut self, task: u64, tid: u32, epoch: u64) -> Option<Arc<asyncio::AwaitChain>> {
        let a = self.asyncio.as_ref()?;
        if self.await_chains.len() > 4096 {
            self.await_chains.clear();
        }
        let entry = self.await_chains.get_mut(&task);
        if let Some(e) = &entry {
            if e.epoch == epoch {
                return e.chain.clone();
            }
        }
        let key = a.task_key(&self.remote, task);
        if let Some(e) = entry {
            if key.is_some() && e.key == key {
                e.epoch = epoch;
                return e.chain.clone();
            }
        }
        let chain = key
            .and_then(|_| a.await_chain(&self.remote, &self.layout, task))
            .map(Arc::new);
        if chain.is_some() && !a.lists_tasks() {
            // 3.11-3.13: which thread runs the task's loop (`all` mode's passes).
            if let Some(l) = self.remote.u64(task + 16) {
                if self.loop_threads.len() > 1024 {
                    self.loop_threads.clear();
                }
                self.loop_threads.insert(l, tid);
            }
            self.seen_task = task;
        }
        self.await_chains.insert(
            task,
            AwaitEntry {
                epoch,
                key,
                chain: chain.clone(),
                prefix: None,
            },
        );
        chain
    }

    /// The frames that stand for running task `task`'s await chain `c`, root first: resolved
    /// once per chain read, not per sample.
    fn task_prefix(
        &mut self,
        out: &mut impl ProfileSink,
        task: u64,
        c: &asyncio::AwaitChain,
        epoch: u64,
    ) -> Arc<Vec<FrameRef>> {
        if let Some(p) = self.await_chains.get(&task).and_then(|e| e.prefix.clone()) {
            return p;
        }
        let mut prefix = Vec::new();
        for t in c.tasks.iter().rev() {
            prefix.push(self.task_frame(out, &t.name));
            prefix.extend(self.chain_frames(out, &t.frames, epoch));
        }
        let prefix = Arc::new(prefix);
        if let Some(e) = self.await_chains.get_mut(&task) {
            e.prefix = Some(prefix.clone());
        }
        prefix
    }

    /// 3.11-3.13 (`all`): the event loop each thread runs, from its `BaseEventLoop.run_forever`
    /// frame's `self`; and a task found among the first locals of the frames rootward of it
    /// (from which `_asyncio`'s set of tasks is found, before a sample has shown one running).
    /// Code objects named on the way are learnt as a sample's are (`Handle._run` among them).
    fn loops_of_threads(&mut self, epoch: u64) {
        let Some(a) = self.asyncio.clone() else {
            return;
        };
        let c = self.config;
        let mut threads: Vec<(u32, u64)> = self.threads.iter().map(|(&t, &s)| (t, s)).collect();
        threads.sort_unstable();
        for (tid, tstate) in threads.into_iter().take(MAX_LOOP_THREADS) {
            let mut frame = self.remote.u64(tstate + c.tstate_frame as u64).unwrap_or(0);
            if c.cframe_frame != profiler_common::NO_OFFSET && frame != 0 {
                frame = self.remote.u64(frame + c.cframe_frame as u64).unwrap_or(0);
            }
            let len = self.layout.frame_localsplus as usize + 8 * LOCALS_SCANNED;
            let mut seen = HashSet::new();
            // Locals are looked at rootward of the loop (`run_until_complete` holds the main
            // task), not in every frame of every thread.
            let mut in_loop = false;
            while frame != 0 && seen.len() < profiler_common::MAX_PY_FRAMES && seen.insert(frame) {
                let Some(buf) = self.remote.read(frame, len) else {
                    break;
                };
                let code = le_u64(&buf, c.frame_code as usize).unwrap_or(0) & c.code_mask;
                let owner = buf.get(c.frame_owner as usize).copied().unwrap_or(0);
                let info = match self.layout.is_shim(owner, code, self.none_addr) {
                    true => None,
                    false => self.code(&[code], epoch).pop().flatten(),
                };
                let locals: Vec<u64> = buf[self.layout.frame_localsplus as usize..]
                    .chunks_exact(8)
                    .filter_map(|w| le_u64(w, 0))
                    .collect();
                if info.is_some_and(|i| &*i.name == "BaseEventLoop.run_forever") {
                    if let Some(&l) = locals.first() {
                        self.loop_threads.insert(l, tid);
                        in_loop = true;
                    }
                }
                if in_loop && self.seen_task == 0 {
                    if let Some(&t) = locals.iter().find(|&&t| a.is_task_at(&self.remote, t)) {
                        self.seen_task = t;
                    }
                }
                frame = le_u64(&buf, c.frame_previous as usize).unwrap_or(0);
            }
        }
    }

    /// The `<task> NAME` frame of a task.
    fn task_frame(&mut self, out: &mut impl ProfileSink, name: &str) -> FrameRef {
        if self.task_frames.len() > 100_000 {
            self.task_frames.clear();
        }
        if let Some(&f) = self.task_frames.get(name) {
            return f;
        }
        let f = out.task_frame(name);
        self.task_frames.insert(name.to_string(), f);
        f
    }

    /// The frames of a suspended task's coroutine chain (outermost first).
    fn chain_frames(
        &mut self,
        out: &mut impl ProfileSink,
        frames: &[(u64, i32)],
        epoch: u64,
    ) -> Vec<FrameRef> {
        let codes: Vec<u64> = frames.iter().map(|f| f.0).collect();
        let infos = self.code(&codes, epoch);
        frames
            .iter()
            .zip(infos)
            .map(|(&(code, instr), info)| match info {
                Some(ci) => self.frame_for(out, code, &ci, instr, false),
                None => {
                    out.count(PyEvent::Unresolved);
                    out.unresolved_frame()
                }
            })
            .collect()
    }

    /// Thread states of every interpreter: (tstate, pthread id, native thread id), and whether
    /// a list was longer than the walk's bound (`MAX_THREADS`).
    fn thread_states(&self) -> (Vec<(u64, u64, u64)>, bool) {
        let l = &self.layout;
        let mut out = Vec::new();
        let mut cut = false;
        let mut interp = self.remote.u64(self.runtime + l.interp_head).unwrap_or(0);
        let mut seen = HashSet::new();
        for _ in 0..MAX_INTERPRETERS {
            if interp == 0 || !seen.insert(interp) {
                break;
            }
            let mut t = self.remote.u64(interp + l.interp_threads_head).unwrap_or(0);
            for i in 0..=MAX_THREADS {
                if t == 0 || !seen.insert(t) {
                    break;
                }
                if i == MAX_THREADS {
                    cut = true;
                    break;
                }
                let Some(b) = self.remote.read(
                    t,
                    176.max(l.thread_id as usize + 8)
                        .max(l.native_thread_id.unwrap_or(0) as usize + 8),
                ) else {
                    break;
                };
                // A thread state belongs to its interpreter; anything else is not a list we trust.
                if le_u64(&b, l.tstate_interp as usize) != Some(interp) {
                    break;
                }
                let ptid = le_u64(&b, l.thread_id as usize).unwrap_or(0);
                let ntid = l
                    .native_thread_id
                    .and_then(|o| le_u64(&b, o as usize))
                    .unwrap_or(0)
                    & 0xffff_ffff;
                out.push((t, ptid, ntid));
                t = le_u64(&b, l.tstate_next as usize).unwrap_or(0);
            }
            interp = self.remote.u64(interp + l.interp_next).unwrap_or(0);
        }
        (out, cut)
    }

    /// The thread -> thread-state map as it is now: host tids as keys.
    pub fn current_threads(&mut self) -> HashMap<u32, u64> {
        let tasks = task_ids(self.pid, &mut self.ns_tids);
        self.listed = tasks.iter().map(|&(host, _)| host).collect();
        let ns_to_host: HashMap<u32, u32> = tasks.iter().map(|&(host, ns)| (ns, host)).collect();
        let (states, cut) = self.thread_states();
        let mut candidates: HashMap<u32, Vec<u64>> = HashMap::new();
        for (tstate, ptid, ntid) in states {
            let mut ns_tid = ntid as u32;
            if ns_tid == 0 && ptid != 0 {
                ns_tid = self.tid_from_pthread(ptid, &ns_to_host).unwrap_or(0);
            }
            if let Some(&host) = ns_to_host.get(&ns_tid) {
                candidates.entry(host).or_default().push(tstate);
            }
        }
        // Up to 3.11 a thread state made for a new thread carries its creator's `thread_id`
        // until the new thread starts: two states then name one thread. The one known before
        // stays; a thread first seen that way waits for the next read.
        let mut out = HashMap::new();
        for (host, states) in candidates {
            match states[..] {
                [one] => {
                    out.insert(host, one);
                }
                _ => {
                    if let Some(&known) = self.threads.get(&host).filter(|k| states.contains(k)) {
                        out.insert(host, known);
                    }
                }
            }
        }
        if cut {
            // The walk stopped at its bound. A new thread's state goes at the head of its
            // interpreter's list, so those past the bound are the oldest, the main thread
            // among them: each keeps the state known for it while the thread lives (a reused
            // tid is a new thread, whose state is at the head).
            for (&tid, &tstate) in &self.threads {
                if self.listed.contains(&tid) {
                    out.entry(tid).or_insert(tstate);
                }
            }
        }
        out
    }

    /// The kernel tid stored in the C library's thread struct at `pthread` (<= 3.10 keep only
    /// `pthread_self()`). The offset is found once by looking for a value that is one of the
    /// process's tids (glibc x86-64 keeps it at 0x2d0).
    fn tid_from_pthread(&mut self, pthread: u64, tids: &HashMap<u32, u32>) -> Option<u32> {
        if let Some(off) = self.pthread_tid_offset {
            return self
                .remote
                .u32(pthread + off)
                .filter(|t| tids.contains_key(t));
        }
        let b = self.remote.read(pthread, 2048)?;
        let mut candidates: Vec<u64> = vec![0x2d0];
        candidates.extend((0..2048u64).step_by(4));
        for off in candidates {
            if let Some(v) = remote::le_u32(&b, off as usize) {
                if v != 0 && tids.contains_key(&v) {
                    self.pthread_tid_offset = Some(off);
                    return Some(v);
                }
            }
        }
        None
    }

    /// The code objects at `addrs`, validated against the target's memory once per `epoch`
    /// (one batch of samples read from the ring buffer, at most a few ms of samples): an address
    /// can be reused after its code object is freed, so a cached entry is believed only after
    /// its type, name and file have been read again in this epoch. One read validates every
    /// address of the sample that needs it; misses are resolved in full.
    fn code(&mut self, addrs: &[u64], epoch: u64) -> Vec<Option<Arc<CodeInfo>>> {
        if self.codes.len() > MAX_CODES {
            self.codes.clear();
        }
        let mut out: Vec<Option<Arc<CodeInfo>>> = vec![None; addrs.len()];
        let mut stale = Vec::new();
        for (i, a) in addrs.iter().enumerate() {
            match self.codes.get(a) {
                Some((c, e)) if *e == epoch => out[i] = Some(c.clone()),
                _ => stale.push(i),
            }
        }
        if stale.is_empty() {
            return out;
        }
        let len = code::header_len(&self.layout);
        let mut ranges: Vec<(u64, usize)> = stale.iter().map(|&i| (addrs[i], len)).collect();
        // The strings of each cached entry are read with the heads, where they were: an entry
        // whose head still points there (nearly every one) is checked with this one read.
        let mut guessed: FxHashMap<usize, ([u64; 2], usize)> = FxHashMap::default();
        for &i in &stale {
            if let Some((c, _)) = self.codes.get(&addrs[i]) {
                // Where its pair lands among the reads after the heads.
                guessed.insert(i, ([c.name_ptr, c.ident[1]], ranges.len() - stale.len()));
                ranges.push((c.name_ptr, profiler_common::PY_NAME_SNAP));
                ranges.push((c.ident[1], profiler_common::PY_FILE_SNAP));
            }
        }
        let mut read_now = self.remote.read_many(&ranges);
        let mut guesses = read_now.split_off(stale.len());
        let mut heads = read_now;
        if heads.iter().any(Option::is_none) {
            heads = ranges[..stale.len()]
                .iter()
                .map(|r| self.remote.read(r.0, r.1))
                .collect();
        }
        // Entries whose identity (type, name and file addresses) still holds, and the head that
        // showed it: their strings are read again before they are believed (below).
        let mut same: Vec<(usize, Vec<u8>, [u64; 2])> = Vec::new();
        // Heads that need a code object read in full.
        let mut read: Vec<(usize, Vec<u8>)> = Vec::new();
        for (&i, head) in stale.iter().zip(heads) {
            let a = addrs[i];
            let code_type = self.code_type;
            let Some(head) = head.filter(|h| {
                !code::freed(&self.layout, h)
                    && (code_type == 0
                        || code::ident(&self.layout, h).is_some_and(|id| id[0] == code_type))
            }) else {
                // Nothing can be read there now, or no code object: the memory went back to
                // the system or the allocator, or holds another kind of object now, or the
                // process has exited (its last records are read after it). The last code
                // object known at the address is what ran there (a module body that ended
                // moments ago); a copy of the head taken at the sample, where there is one, is
                // checked against it. Only another code object there ends what is known.
                // The frame walk must copy what runs there next: another code object may get
                // the address.
                out[i] = self.codes.get(&a).map(|(c, _)| {
                    self.gone.push(a);
                    c.clone()
                });
                continue;
            };
            let known = code::ident(&self.layout, &head)
                .is_some_and(|id| self.codes.get(&a).is_some_and(|(c, _)| c.ident == id));
            if known {
                let name = code::name_ptr(&self.layout, &head).unwrap_or(0);
                let file = le_u64(&head, self.layout.code_filename).unwrap_or(0);
                same.push((i, head, [name, file]));
            } else {
                read.push((i, head));
            }
        }
        // The same identity is not the same object: code made and freed over and over (`exec`
        // in a loop) gets the same memory, its strings included, with other contents. One read
        // of the name and file strings of every such entry tells.
        let mut copies: Vec<Option<Vec<u8>>> = Vec::with_capacity(same.len() * 2);
        let mut unread = Vec::new();
        for (k, &(i, _, pointers)) in same.iter().enumerate() {
            let guess = guessed
                .get(&i)
                .filter(|(at, _)| *at == pointers)
                // Each pair is used once: moved out, not copied.
                .and_then(|&(_, g)| {
                    let name = guesses.get_mut(g)?.take()?;
                    Some((name, guesses.get_mut(g + 1)?.take()?))
                });
            match guess {
                Some((name, file)) => copies.extend([Some(name), Some(file)]),
                None => {
                    copies.extend([None, None]);
                    unread.push(k);
                }
            }
        }
        if !unread.is_empty() {
            let strings: Vec<(u64, usize)> = unread
                .iter()
                .flat_map(|&k| {
                    let [name, file] = same[k].2;
                    [
                        (name, profiler_common::PY_NAME_SNAP),
                        (file, profiler_common::PY_FILE_SNAP),
                    ]
                })
                .collect();
            let mut more = self.remote.read_many(&strings);
            if more.iter().any(Option::is_none) {
                more = strings.iter().map(|r| self.remote.read(r.0, r.1)).collect();
            }
            for (&k, pair) in unread.iter().zip(more.chunks(2)) {
                copies[2 * k] = pair[0].clone();
                copies[2 * k + 1] = pair.get(1).cloned().flatten();
            }
        }
        for ((i, head, [name, file]), pair) in same.into_iter().zip(copies.chunks(2)) {
            let a = addrs[i];
            let Some((c, e)) = self.codes.get_mut(&a) else {
                continue;
            };
            let l = &self.layout;
            let agrees = |ptr: u64, copy: &Option<Vec<u8>>, known: &str| {
                copy.as_deref()
                    .is_none_or(|b| code::copy_agrees(l, ptr, b, self.str_type, known))
            };
            if agrees(name, &pair[0], &c.name) && agrees(file, &pair[1], &c.file) {
                *e = epoch;
                out[i] = Some(c.clone());
            } else {
                self.retire(a);
                read.push((i, head));
            }
        }
        for (i, head) in read {
            let a = addrs[i];
            out[i] = (|| {
                let c = Arc::new(code::read_code(
                    &self.remote,
                    &self.layout,
                    &head,
                    code::Types {
                        code: self.code_type,
                        str: self.str_type,
                    },
                    code::StringCopies::default(),
                )?);
                self.retire(a);
                if self.handle_run_wanted && self.handle_run == 0 && is_handle_run(&c) {
                    self.handle_run = a;
                }
                self.codes.insert(a, (c.clone(), epoch));
                Some(c)
            })();
            if out[i].is_none() {
                self.retire(a);
            }
        }
        out
    }

    /// Whether code object `info` at `addr`, as the frame walk copied it at a sample at
    /// `time_ns`, can go into the BPF side's `KNOWN_CODES` (which stops the copies): it is what
    /// is at the address now (validated in `epoch`), and it has been there, the same object,
    /// for `SETTLED_NS` of samples. Code made and freed over and over (`exec` in a loop) gets
    /// the same addresses, its strings' included, and only a copy taken at the sample tells
    /// one of these objects from the next: it is copied as long as it lives.
    fn settled(&mut self, addr: u64, info: &Arc<CodeInfo>, time_ns: u64, epoch: u64) -> bool {
        if !matches!(self.codes.get(&addr), Some((c, e)) if *e == epoch && Arc::ptr_eq(c, info)) {
            return false;
        }
        if self.young.len() >= MAX_CODES {
            self.young.clear();
        }
        match self.young.get(&addr) {
            Some((t, c)) if Arc::ptr_eq(c, info) => time_ns.saturating_sub(*t) >= SETTLED_NS,
            _ => {
                self.young.insert(addr, (time_ns, info.clone()));
                false
            }
        }
    }

    /// Moves what was known at `a` to the retired code objects.
    fn retire(&mut self, a: u64) {
        self.young.remove(&a);
        if let Some((c, _)) = self.codes.remove(&a) {
            self.gone.push(a);
            if self.retired.len() >= MAX_CODES / 4 {
                self.retired.clear();
            }
            self.retired.insert((a, c.ident), c);
        }
    }

    /// The code object a frame ran at the sampled instant, from the head the BPF program
    /// copied then (`snap`) and what was read at its address since (`now`): `now` when it is the
    /// same object; otherwise (freed, or its memory reused by another code object) the copy,
    /// with its name and file from the copies of their strings taken with it, else read from
    /// the target and checked against those copies.
    fn sampled_code(
        &self,
        addr: u64,
        snap: &profiler_common::CodeSnap,
        now: Option<Arc<CodeInfo>>,
    ) -> Option<Arc<CodeInfo>> {
        let head = &snap.head[..code::header_len(&self.layout).min(profiler_common::PY_CODE_SNAP)];
        let Some(id) = code::ident(&self.layout, head) else {
            return now;
        };
        if let Some(ci) = &now {
            if ci.ident == id && self.copies_agree(ci, head, snap) {
                return now;
            }
        }
        // A failed copy has a zero type word: nothing to go by but what is there now.
        if id[0] == 0 || (self.code_type != 0 && id[0] != self.code_type) {
            return now;
        }
        if let Some(c) = self.retired.get(&(addr, id)) {
            if self.copies_agree(c, head, snap) {
                return Some(c.clone());
            }
        }
        let mut c = code::read_code(
            &self.remote,
            &self.layout,
            head,
            code::Types {
                code: self.code_type,
                str: self.str_type,
            },
            code::StringCopies {
                name: Some(&snap.name),
                file: Some(&snap.file),
            },
        )?;
        // The line table went with the code object: its bytes may be anything now. The frame
        // shows the function's first line.
        c.linetable.clear();
        Some(Arc::new(c))
    }

    /// Whether what is known of a code object agrees with the copies of its name and file name
    /// taken at a sample (those that were copied whole). The same address, type and string
    /// addresses are not enough: a program that makes and frees alike code objects over and
    /// over (modules run by `exec`) gets the same memory, its strings included, each time.
    fn copies_agree(&self, ci: &CodeInfo, head: &[u8], snap: &profiler_common::CodeSnap) -> bool {
        let l = &self.layout;
        let (Some(name_ptr), Some(file_ptr)) =
            (code::name_ptr(l, head), le_u64(head, l.code_filename))
        else {
            return true;
        };
        code::copy_agrees(l, name_ptr, &snap.name, self.str_type, &ci.name)
            && code::copy_agrees(l, file_ptr, &snap.file, self.str_type, &ci.file)
    }

    /// Whether frame `f`'s code, as copied at the sample (if it was), was an object of another
    /// type than code: the frame was not one (a chain read while it was being linked).
    fn snap_not_code(
        &self,
        f: &profiler_common::PyFrame,
        snaps: &[profiler_common::CodeSnap],
    ) -> bool {
        let Some(snap) = ((f.flags >> PY_FRAME_SNAP_SHIFT) as usize & 0xff)
            .checked_sub(1)
            .and_then(|k| snaps.get(k))
        else {
            return false;
        };
        let head = &snap.head[..code::header_len(&self.layout).min(profiler_common::PY_CODE_SNAP)];
        // A failed copy has a zero type word.
        code::ident(&self.layout, head)
            .is_some_and(|id| id[0] != 0 && self.code_type != 0 && id[0] != self.code_type)
    }

    fn frame_for(
        &mut self,
        out: &mut impl ProfileSink,
        addr: u64,
        c: &CodeInfo,
        instr: i32,
        with_opcode: bool,
    ) -> FrameRef {
        let func = match self.funcs.get(&(addr, c.ident)) {
            Some((f, name, file)) if *name == c.name && *file == c.file => *f,
            _ => {
                let f = out.python_function(&c.name, &c.file, c.firstlineno);
                self.funcs
                    .insert((addr, c.ident), (f, c.name.clone(), c.file.clone()));
                f
            }
        };
        let (line, corrupt) = code::line_of(self.layout.minor, c, instr);
        if corrupt {
            out.count(PyEvent::BadLineTable);
        }
        let byte = with_opcode
            .then(|| opcodes::read(&self.remote, &self.layout, addr, instr))
            .flatten();
        let minor = self.layout.minor;
        *self.frames.entry((func, line, byte)).or_insert_with(|| {
            out.python_frame(func, line, byte.and_then(|b| opcodes::name(minor, b)))
        })
    }
}

/// The addresses of the GIL's `last_holder` and `locked` words. From 3.12 the interpreter points
/// to its GIL, and that pointer is set a little after the interpreter is linked into the runtime:
/// a process caught in between is not ready yet (taking it then would leave it without GIL state
/// for the whole run).
fn gil_words(
    layout: &Layout,
    runtime: u64,
    interp: u64,
    read_u64: impl Fn(u64) -> Option<u64>,
) -> Result<Option<(u64, u64)>, NotPython> {
    if let Some(off) = layout.gil_in_runtime {
        return Ok(Some((runtime + off, runtime + off + 8)));
    }
    let Some(off) = layout.interp_gil_ptr else {
        return Ok(None);
    };
    match read_u64(interp + off) {
        Some(g) if g != 0 => Ok(Some((g + 8, g + 16))),
        _ => Err(NotPython::NotReady),
    }
}

/// (host tid, tid in the process's own pid namespace) of every thread.
fn task_ids(pid: u32, ns: &mut NsTids) -> Vec<(u32, u32)> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    let hosts: Vec<u32> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    // `NSpid` lists a task's ids from `/proc`'s pid namespace down to its own: one entry means
    // they are the same namespace, for every thread of the process. Read once per process; the
    // threads' status files (the costly part of a thread-map refresh, made every 100 ms) are
    // then read only for processes in other namespaces (containers), once per thread.
    let nspid = |tid: u32| -> Option<Vec<u32>> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).ok()?;
        let line = status.lines().find_map(|l| l.strip_prefix("NSpid:"))?;
        Some(
            line.split_whitespace()
                .filter_map(|v| v.parse().ok())
                .collect(),
        )
    };
    if ns.same.is_none() {
        ns.same = nspid(pid)
            .filter(|ids| !ids.is_empty())
            .map(|ids| ids.len() == 1);
    }
    if ns.same == Some(true) {
        return hosts.into_iter().map(|h| (h, h)).collect();
    }
    // A tid that left the listing is forgotten: if it comes back, it is another thread.
    let listed: std::collections::HashSet<u32> = hosts.iter().copied().collect();
    ns.known.retain(|h, _| listed.contains(h));
    hosts
        .into_iter()
        .map(|h| {
            if let Some(&n) = ns.known.get(&h) {
                return (h, n);
            }
            match nspid(h).and_then(|ids| ids.last().copied()) {
                Some(n) => {
                    ns.known.insert(h, n);
                    (h, n)
                }
                // Exiting: its status is gone; not kept.
                None => (h, h),
            }
        })
        .collect()
}

/// Functions the compiler may split into parts in stripped builds (GCC's hot/cold partitioning
/// in distribution builds), named so that an eval-loop frame in either part is recognized as
/// one when Python frames are merged into the native stack.
pub const SPLIT_FUNCTIONS: &[&str] = &["_PyEval_EvalFrameDefault"];

/// Whether `c` is asyncio's `Handle._run` (3.11+: the name is the qualified name), which calls
/// the step of the task an event loop runs.
fn is_handle_run(c: &CodeInfo) -> bool {
    &*c.name == "Handle._run"
        && (c.file.ends_with("/asyncio/events.py") || &*c.file == "asyncio/events.py")
}

/// Native functions on the path that takes the GIL, and `drop_gil`, which on a forced switch
/// waits until the requesting thread has taken the GIL before this thread queues for it again.
pub fn is_gil_function(name: &str) -> bool {
    matches!(
        name,
        "take_gil"
            | "drop_gil"
            | "PyEval_RestoreThread"
            | "PyEval_AcquireThread"
            | "PyEval_AcquireLock"
            | "PyGILState_Ensure"
            | "_PyThreadState_Attach"
            | "_PyEval_AcquireLock"
            | "_PyEval_TakeGIL"
    ) || name.starts_with("take_gil.")
        || name.starts_with("drop_gil.")
}

/// The garbage collector's entry points in CPython 3.8-3.15 (`collect` and
/// `collect_with_callback` in 3.8-3.10, `gc_collect_main` in 3.11-3.13, `gc_collect_region` and
/// its callers in 3.14): what runs under them is the collector's work.
pub fn is_gc_function(name: &str) -> bool {
    name.starts_with("gc_collect")
        || name.starts_with("_PyGC_Collect")
        || matches!(
            name,
            "collect" | "collect_with_callback" | "collect_generations"
        )
        || name.starts_with("collect.")
}

/// What changed in a Python process's threads: (tid, thread state) to install, tids to remove.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ThreadChanges {
    pub set: Vec<(u32, u64)>,
    pub gone: Vec<u32>,
    /// Threads whose `threading` name was read since the last call: (tid, name).
    pub named: Vec<(u32, String)>,
}

/// Reads of a thread's name tried before giving up (a thread seen before its bootstrap frame
/// is pushed gets another try at the next look; one started from C never has a name).
const NAME_TRIES: u8 = 4;
/// A process's thread map is read again at least this often when nothing says its threads
/// changed (`PythonRegistry::threads_due`).
const THREADS_QUIET: std::time::Duration = std::time::Duration::from_secs(1);

/// A function frame made for a code object, with the name and file it was made for.
type MadeFunction = (FrameRef, Arc<str>, Arc<str>);

/// Everything the profiler knows about Python processes.
#[derive(Default)]
pub struct PythonRegistry {
    procs: HashMap<u32, PyProcess>,
    /// Processes found not to be Python, by pid: the process as it was then (`process_key`: a
    /// reused pid or an exec is looked at again), attempts so far and when the last one was; a
    /// process that is still loading its libraries is looked at again a few times. By pid
    /// first, so that asking about a process never looked at reads nothing.
    not_python: HashMap<u32, ((u64, String), u32, std::time::Instant)>,
    reported: HashSet<u32>,
    pub show_internal: bool,
    /// Name the instruction of each sample's innermost Python frame (`--opcodes`).
    pub opcodes: bool,
    /// Show samples of asyncio event loops from their running task (`--async-aware`).
    pub async_aware: bool,
    /// And every suspended task at each pass (`--async-aware all`).
    pub async_all: bool,
    /// Code objects are validated once per epoch: one batch of records read from the ring.
    epoch: u64,
    /// Code objects read since the BPF side was last told (`take_known_codes`), as
    /// `profiler_common::known_code_word`s.
    known: Vec<u64>,
    /// The last thread `read_ahead` walked: the next call goes on after it.
    ahead: (u32, u32),
}

/// The start time of a process (field 22 of /proc/PID/stat), to tell reused pids apart.
pub fn start_time(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = s.rsplit_once(')')?.1;
    after.split_whitespace().nth(19)?.parse().ok()
}

/// How long ago the process started (or exec'd), from its start time and the uptime.
pub fn process_age(pid: u32) -> Option<std::time::Duration> {
    let start_ticks = start_time(pid)?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let uptime: f64 = std::fs::read_to_string("/proc/uptime")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    let age = uptime - start_ticks as f64 / hz.max(1) as f64;
    Some(std::time::Duration::from_secs_f64(age.max(0.0)))
}

/// The process `pid` is now: its start time and executable.
fn process_key(pid: u32) -> (u64, String) {
    let exe = std::fs::read_link(format!("/proc/{pid}/exe"))
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    (start_time(pid).unwrap_or(0), exe)
}

impl PythonRegistry {
    /// Starts a new validation epoch (see `PyProcess::code`).
    pub fn new_epoch(&mut self) {
        self.epoch += 1;
    }

    /// The code objects named from samples since the last call, whose heads the frame walk
    /// copied (it does for code it does not know user space has read): for the BPF side's
    /// `KNOWN_CODES`, so that it stops copying them.
    pub fn take_known_codes(&mut self) -> Vec<u64> {
        let mut k = std::mem::take(&mut self.known);
        k.sort_unstable();
        k.dedup();
        k
    }

    /// Code objects found freed or replaced since the last call, as `known_code_word`s: the BPF
    /// side's `KNOWN_CODES` must stop naming them known, or the next code object at the address
    /// is taken for them.
    pub fn take_forgotten_codes(&mut self) -> Vec<u64> {
        let mut k: Vec<u64> = self
            .procs
            .values_mut()
            .flat_map(|p| {
                let pid = p.pid;
                std::mem::take(&mut p.gone)
                    .into_iter()
                    .map(move |a| profiler_common::known_code_word(pid, a))
            })
            .collect();
        k.sort_unstable();
        k.dedup();
        k
    }

    /// Known not to be Python (as the process is now).
    pub fn known_not_python(&self, pid: u32) -> bool {
        match self.not_python.get(&pid) {
            Some((key, n, at)) if *key == process_key(pid) => {
                *n >= NO_RUNTIME_ATTEMPTS || at.elapsed() < NO_RUNTIME_RETRY
            }
            _ => false,
        }
    }

    /// Known for good not to be Python (as the process is now): no more attempts.
    pub fn finally_not_python(&self, pid: u32) -> bool {
        self.not_python
            .get(&pid)
            .is_some_and(|(key, n, _)| *n >= NO_RUNTIME_ATTEMPTS && *key == process_key(pid))
    }

    fn not_python_again(&mut self, pid: u32, key: (u64, String), final_: bool) {
        let now = std::time::Instant::now();
        let e = self.not_python.entry(pid).or_insert((key.clone(), 0, now));
        if e.0 != key {
            // Another program (an exec, a reused pid) since: its own attempts.
            *e = (key, 0, now);
        }
        e.1 = if final_ { NO_RUNTIME_ATTEMPTS } else { e.1 + 1 };
        e.2 = now;
    }
}

/// Whether any mapping of the process names a python binary or libpython (a cheap pre-check).
pub fn maps_mention_python(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .map(|m| {
            m.lines().any(|l| {
                l.rsplit('/')
                    .next()
                    .map(|f| f.starts_with("python") || f.starts_with("libpython"))
                    .unwrap_or(false)
            })
        })
        .unwrap_or(false)
}

/// Whether a program that has just exec'd is named like a Python interpreter, by the name it
/// was started by (its exec record's `comm`: the executable's file name, or a script's
/// interpreter's): it decides whether the process is watched closely, and the BPF side woke the
/// reader for it by the same test. Nothing is read: a host may exec hundreds of programs a
/// second. An interpreter started by another name (a link named otherwise) is found at the
/// first regular look instead, within a tick.
pub fn python_name(comm: &str) -> bool {
    comm.starts_with("python")
}

impl PythonRegistry {
    pub fn new(show_internal: bool) -> PythonRegistry {
        PythonRegistry {
            show_internal,
            ..Default::default()
        }
    }

    /// Tries to set up `proc` as a Python process. Returns the BPF config to install when it is
    /// newly found.
    /// `young`: the process exec'd moments ago, so a missing runtime may just not be loaded yet.
    pub fn try_add(&mut self, proc: &Process, young: bool) -> Option<PyProcConfig> {
        if self.procs.contains_key(&proc.pid) {
            return None;
        }
        if self.known_not_python(proc.pid) {
            return None;
        }
        // Before the look: a verdict is about the program looked at.
        let key = process_key(proc.pid);
        match PyProcess::discover(proc) {
            Ok(mut p) => {
                if self.async_aware && p.layout.minor >= 14 {
                    p.look_for_asyncio(proc);
                } else if self.async_aware && p.layout.minor >= 11 {
                    p.handle_run_wanted = true;
                } else if self.async_aware {
                    eprintln!(
                        "tachyon-bpf: pid {} runs Python {}: async-aware stacks need Python \
                         3.11 or newer, so its stacks are shown as they run",
                        proc.pid, p.version
                    );
                }
                let cfg = p.config;
                log::info!("pid {}: Python {} ({})", proc.pid, p.version, p.label);
                self.procs.insert(proc.pid, p);
                Some(cfg)
            }
            Err(NotPython::NotReady) => {
                log::debug!("pid {}: Python runtime not initialised yet", proc.pid);
                None
            }
            Err(NotPython::NoRuntime) if young => {
                // Just exec'd: the dynamic loader may not have mapped libpython yet.
                log::debug!("pid {}: no Python runtime yet (young process)", proc.pid);
                None
            }
            Err(NotPython::NoRuntime) => {
                log::debug!(
                    "pid {}: no Python runtime in {} modules",
                    proc.pid,
                    proc.modules.len()
                );
                self.not_python_again(proc.pid, key, false);
                None
            }
            Err(NotPython::Unsupported(what)) => {
                if self.reported.insert(proc.pid) {
                    eprintln!(
                        "tachyon-bpf: pid {} runs {what}, which is not supported: native stacks only",
                        proc.pid
                    );
                }
                self.not_python_again(proc.pid, key, true);
                None
            }
        }
    }

    /// Forgets the not-Python verdicts of processes that are gone.
    pub fn sweep(&mut self, gone: &mut impl FnMut(u32) -> bool) {
        self.not_python.retain(|&pid, _| !gone(pid));
        self.reported.retain(|&pid| !gone(pid));
    }

    /// A new profile started (continuous runs): function and frame ids of the old one are void.
    pub fn new_profile(&mut self) {
        for p in self.procs.values_mut() {
            p.funcs.clear();
            p.frames.clear();
            p.task_frames.clear();
            p.await_chains.clear();
        }
    }

    /// Forgets a process (gone, or exec'd into another program); returns the threads the BPF
    /// side knew of it.
    pub fn forget(&mut self, pid: u32) -> Vec<u32> {
        self.procs
            .remove(&pid)
            .map(|p| p.threads.into_keys().collect())
            .unwrap_or_default()
    }

    /// Whether `pid` is a known Python process.
    pub fn contains(&self, pid: u32) -> bool {
        self.procs.contains_key(&pid)
    }

    /// Whether `pid` is profiled with the runtime still starting (see `PyProcess::ready`).
    pub fn starting(&self, pid: u32) -> bool {
        self.procs.get(&pid).is_some_and(|p| !p.ready)
    }

    /// Looks again at a process whose runtime was still starting: its configuration once the
    /// runtime has its interpreter and GIL (what was learnt of its code stays).
    pub fn refresh(&mut self, proc: &Process) -> Option<PyProcConfig> {
        let p = self.procs.get_mut(&proc.pid).filter(|p| !p.ready)?;
        let now = PyProcess::discover(proc).ok().filter(|n| n.ready)?;
        log::info!("pid {}: Python {} runtime ready", proc.pid, p.version);
        p.config = now.config;
        p.async_config();
        p.ready = true;
        Some(p.config)
    }

    /// Whether `pid` is a Python process whose asyncio is still to be found
    /// (`--async-aware`), and it is time to look again (its mappings are read for it).
    pub fn asyncio_due(&self, pid: u32) -> bool {
        self.async_aware
            && self.procs.get(&pid).is_some_and(|p| {
                let every = if p.asyncio_looks < ASYNCIO_EARLY_LOOKS {
                    ASYNCIO_EARLY_RETRY
                } else {
                    ASYNCIO_RETRY
                };
                // 3.11-3.13: also once `Handle._run` has been seen, for the BPF side.
                let handle_news = p.handle_run != 0 && p.config.handle_run_code == 0;
                let looks = p.asyncio.is_none()
                    && (p.handle_run_wanted || p.layout.minor >= 14)
                    && p.asyncio_looked.is_none_or(|t| t.elapsed() >= every);
                looks || (p.asyncio.is_some() && handle_news)
            })
    }

    /// Looks for asyncio in `proc` (its mappings read just now): the BPF config to install
    /// when it is found, for the BPF side to copy each sample's running task.
    pub fn find_asyncio(&mut self, proc: &Process) -> Option<PyProcConfig> {
        let p = self.procs.get_mut(&proc.pid)?;
        p.look_for_asyncio(proc).then_some(p.config)
    }

    /// `--async-aware all`: the stacks of every suspended task of `pid`'s event loops, by the
    /// loop's thread, root first (the outermost task awaiting it, down to the task and its
    /// coroutine chain at its suspension point).
    pub fn suspended_tasks(
        &mut self,
        pid: u32,
        proc: Option<&Process>,
        out: &mut impl ProfileSink,
    ) -> Vec<(u32, Vec<Vec<FrameRef>>)> {
        let epoch = self.epoch;
        let Some(p) = self.procs.get_mut(&pid) else {
            return Vec::new();
        };
        let Some(a) = p.asyncio.clone() else {
            return Vec::new();
        };
        // Each loop thread's tasks, and the task it runs now (where the thread state says).
        let mut per_thread: Vec<(u32, asyncio::TaskBytes, u64)> = Vec::new();
        if a.lists_tasks() {
            let mut threads: Vec<(u32, u64)> = p.threads.iter().map(|(&t, &s)| (t, s)).collect();
            threads.sort_unstable();
            for (tid, tstate) in threads {
                let (tasks, list_cut) = a.thread_tasks(&p.remote, tstate);
                if list_cut {
                    out.count(PyEvent::AsyncCut);
                }
                let running = a
                    .tstate_running_task()
                    .and_then(|off| p.remote.u64(tstate + off))
                    .unwrap_or(0);
                per_thread.push((tid, tasks, running));
            }
        } else {
            // 3.11-3.13: every task of the process, by the thread its loop was seen running
            // in (a loop not seen running yet is left for a later pass); a running task's
            // coroutine is not suspended, so it shows no chain.
            // While no loop is known, on every pass: its tasks' time is lost until then (a walk
            // every 10 passes only lost a second of a 3 s test).
            if p.loop_threads.is_empty() || p.loop_passes >= LOOP_WALK_EVERY {
                p.loop_passes = 0;
                p.loop_threads.clear();
                p.loops_of_threads(epoch);
            }
            p.loop_passes += 1;
            if let Some(proc) = proc.filter(|_| p.task_set == 0 && p.seen_task != 0) {
                p.task_set = a
                    .find_task_set(&p.remote, proc, p.layout.minor, p.seen_task)
                    .unwrap_or(0);
            }
            if p.task_set == 0 {
                return Vec::new();
            }
            let (tasks, cut) = a.set_tasks(&p.remote, p.task_set);
            if cut {
                out.count(PyEvent::AsyncCut);
            }
            let mut by_thread: std::collections::BTreeMap<u32, Vec<(u64, Vec<u8>)>> =
                Default::default();
            for (t, b) in tasks {
                let tid = asyncio::AsyncLayout::task_loop(&b)
                    .and_then(|l| p.loop_threads.get(&l).copied());
                if let Some(tid) = tid {
                    by_thread.entry(tid).or_default().push((t, b));
                }
            }
            per_thread.extend(by_thread.into_iter().map(|(tid, t)| (tid, t, 0)));
        }
        let mut result = Vec::new();
        for (tid, tasks, running) in per_thread {
            if tasks.is_empty() {
                continue;
            }
            let chains = a.suspended(&p.remote, &p.layout, &tasks, running, &mut p.task_names);
            let mut stacks = Vec::with_capacity(chains.len());
            for c in chains {
                out.count(PyEvent::AsyncSuspended);
                if c.cut {
                    out.count(PyEvent::AsyncCut);
                }
                let mut frames = Vec::new();
                for t in c.tasks.iter().rev() {
                    frames.push(p.task_frame(out, &t.name));
                    frames.extend(p.chain_frames(out, &t.frames, epoch));
                }
                stacks.push(frames);
            }
            result.push((tid, stacks));
        }
        result
    }

    /// The known Python processes.
    pub fn pids(&self) -> Vec<u32> {
        self.procs.keys().copied().collect()
    }

    /// Whether `pid`'s thread map is due to be read again. Each read lists its tasks in `/proc`
    /// and walks its interpreter's thread states (about 20 system calls), so a process whose
    /// threads keep running is not read on every look: only when a thread started or ended in
    /// it, or ran Python code without being in the map (`threads_changed`), while a thread's
    /// name is still being read, or once every `THREADS_QUIET` (a thread state that changed
    /// under a thread that stays: C code calling into Python from its own threads). The BPF
    /// side finds a thread missing from the map by itself meanwhile (`thread_state`).
    pub fn threads_due(&self, pid: u32) -> bool {
        self.procs.get(&pid).is_some_and(|p| {
            p.threads_changed
                || p.name_tries.values().any(|&n| n < NAME_TRIES)
                || p.threads_read.is_none_or(|t| t.elapsed() >= THREADS_QUIET)
        })
    }

    /// A sign that `pid`'s threads changed (see `threads_due`).
    pub fn threads_changed(&mut self, pid: u32) {
        if let Some(p) = self.procs.get_mut(&pid) {
            p.threads_changed = true;
        }
    }

    /// Reads `pid`'s threads again: the threads whose thread state is new or changed, and the
    /// threads that are gone, since the last call. `None` for an unknown process.
    pub fn sync_threads(&mut self, pid: u32) -> Option<ThreadChanges> {
        let p = self.procs.get_mut(&pid)?;
        let now = p.current_threads();
        p.threads_read = Some(std::time::Instant::now());
        p.threads_changed = false;
        let set = now
            .iter()
            .filter(|(tid, ts)| p.threads.get(tid) != Some(ts))
            .map(|(&tid, &ts)| (tid, ts))
            .collect();
        let gone = p
            .threads
            .keys()
            .filter(|tid| !now.contains_key(tid))
            .copied()
            .collect();
        let mut named = Vec::new();
        p.name_tries.retain(|tid, _| now.contains_key(tid));
        for (&tid, &tstate) in &now {
            let tries = p.name_tries.entry(tid).or_insert(0);
            if *tries >= NAME_TRIES {
                continue;
            }
            *tries += 1;
            if let Some(name) = threads::thread_name(&p.remote, &p.layout, p.str_type, tstate) {
                *tries = NAME_TRIES;
                named.push((tid, name));
            }
        }
        p.threads = now;
        Some(ThreadChanges { set, gone, named })
    }

    /// The names of the threads of `pid`, read now, each tried a few times (a running thread's
    /// frames move under the read): `dump` names its threads once, at its end.
    pub fn thread_names_now(&mut self, pid: u32) -> Vec<(u32, String)> {
        const TRIES_NOW: usize = 16;
        let Some(p) = self.procs.get_mut(&pid) else {
            return Vec::new();
        };
        let now = p.current_threads();
        now.iter()
            .filter_map(|(&tid, &tstate)| {
                (0..TRIES_NOW)
                    .find_map(|_| threads::thread_name(&p.remote, &p.layout, p.str_type, tstate))
                    .map(|name| (tid, name))
            })
            .collect()
    }

    /// The Python frames of a sample of a known Python process (`None` for other processes);
    /// frames are interned and events counted through `out`.
    pub fn resolve(&mut self, s: &RawSample, out: &mut impl ProfileSink) -> Option<PythonFrames> {
        let p = self.procs.get_mut(&s.pid)?;
        if s.flags & SAMPLE_PY_MISS != 0 {
            out.count(PyEvent::ThreadMiss);
        }
        // Signs that the thread map is behind (`threads_due`): a thread state the BPF side
        // found by itself, or a thread with none that the last read did not list (a thread
        // listed then without one is a native thread, and stays one until the next quiet read).
        let unknown = !p.threads.contains_key(&s.tid);
        if (s.flags & SAMPLE_PY_THREAD != 0 && unknown)
            || (s.flags & SAMPLE_PY_MISS != 0 && unknown && !p.listed.contains(&s.tid))
        {
            p.threads_changed = true;
        }
        if s.flags & SAMPLE_PY_THREAD == 0 {
            return Some(PythonFrames {
                activations: Vec::new(),
                state: None,
                tasks: None,
            });
        }
        out.count(PyEvent::Record);
        for (flag, event) in [
            (SAMPLE_PY_READ_FAILED, PyEvent::ReadFailed),
            (SAMPLE_PY_TRUNCATED, PyEvent::Truncated),
            (SAMPLE_PY_CYCLE, PyEvent::Cycle),
        ] {
            if s.flags & flag != 0 {
                out.count(event);
            }
        }
        let has_gil = s.py_gil_locked != 0 && s.py_gil_holder == s.py_tstate && s.py_tstate != 0;
        let st = PyThreadState {
            has_gil,
            gc: has_gil && s.py_gc_collecting != 0,
            main_thread: s.tid == s.pid,
        };

        // Innermost first from BPF: group into activations (shims and entry flags delimit).
        let activation_rule = p.layout.activations;
        // A chain read while the eval loop links a new frame may run into stack garbage (3.11
        // and 3.12 make a new `_PyCFrame` current before they set its frame): a code pointer no
        // object can have ends the chain there, and nothing after it is believed.
        // So does a frame whose code, copied at the sample, was another kind of object then.
        let torn = s.py_frames.iter().position(|f| {
            !p.layout.is_shim(f.flags as u8, f.code, p.none_addr)
                && (!plausible_object(f.code) || p.snap_not_code(f, &s.code_snaps))
        });
        if torn.is_some() {
            out.count(PyEvent::ReadFailed);
        }
        let py_frames = &s.py_frames[..torn.unwrap_or(s.py_frames.len())];
        let real: Vec<(usize, bool)> = py_frames
            .iter()
            .enumerate()
            .map(|(i, f)| (i, p.layout.is_shim(f.flags as u8, f.code, p.none_addr)))
            .collect();
        let addrs: Vec<u64> = py_frames
            .iter()
            .zip(&real)
            .filter(|(_, r)| !r.1)
            .map(|(f, _)| f.code)
            .collect();
        let mut uniq = addrs.clone();
        uniq.sort_unstable();
        uniq.dedup();
        let infos: rustc_hash::FxHashMap<u64, Option<Arc<CodeInfo>>> = uniq
            .iter()
            .copied()
            .zip(p.code(&uniq, self.epoch))
            .collect();

        // `--async-aware`: the running task's await chain, and (found below) the outermost
        // frame of its coroutine in the sample.
        let chain = match s.py_task {
            0 => None,
            task if self.async_aware => p.await_chain(task, s.tid, self.epoch),
            _ => None,
        };
        let coro_code = chain.as_ref().map(|c| c.coro_code);
        let mut task_from = None;

        // Sized up front: grown from empty, they were reallocated two or three times a sample.
        let mut activations: Vec<Vec<FrameRef>> = Vec::with_capacity(8);
        let mut cur: Vec<FrameRef> = Vec::with_capacity(py_frames.len()); // innermost first
        let mut leaf = self.opcodes;
        for (f, (_, shim)) in py_frames.iter().zip(&real) {
            if *shim {
                if !cur.is_empty() {
                    activations.push(std::mem::take(&mut cur));
                }
                continue;
            }
            let now = infos.get(&f.code).cloned().flatten();
            let snap = (f.flags >> PY_FRAME_SNAP_SHIFT) as usize & 0xff;
            let info = match snap.checked_sub(1) {
                Some(k) if k < s.code_snaps.len() => {
                    let info = p.sampled_code(f.code, &s.code_snaps[k], now);
                    if info
                        .as_ref()
                        .is_some_and(|c| p.settled(f.code, c, s.time_ns, self.epoch))
                    {
                        self.known
                            .push(profiler_common::known_code_word(s.pid, f.code));
                    }
                    info
                }
                _ => now,
            };
            // 3.13+ runs a class's Python `__init__` under a frame of the interpreter's own
            // (`_Py_InitCleanup`: it checks that `__init__` returned None), in the same eval
            // loop: no code of the program, and no activation boundary.
            if info.as_deref().is_some_and(CodeInfo::is_init_cleanup) {
                continue;
            }
            // The eval loop's entry frame, its owner byte not written yet (its first
            // instructions): an activation boundary, as a shim, never a frame of the program.
            if info.as_deref().is_some_and(CodeInfo::is_trampoline) {
                if !cur.is_empty() {
                    activations.push(std::mem::take(&mut cur));
                }
                continue;
            }
            // Only the innermost frame runs an instruction of its own (the others are at their
            // call), even when that frame's code could not be read.
            let innermost = std::mem::take(&mut leaf);
            let frame = match info {
                Some(ci) => p.frame_for(out, f.code, &ci, f.instr, innermost),
                None => {
                    out.count(PyEvent::Unresolved);
                    out.unresolved_frame()
                }
            };
            cur.push(frame);
            if Some(f.code) == coro_code {
                task_from = Some(frame);
            }
            let ends = match activation_rule {
                Activations::PerFrame => true,
                Activations::EntryFlag => f.flags & 0xff != 0,
                Activations::Shim => false,
            };
            if ends {
                activations.push(std::mem::take(&mut cur));
            }
        }
        if !cur.is_empty() {
            activations.push(cur);
        }
        // Built innermost first at both levels: flip to outermost activation first, root-first.
        activations.reverse();
        for a in &mut activations {
            a.reverse();
        }
        let tasks = match (chain, task_from) {
            (Some(c), Some(from)) => {
                out.count(PyEvent::AsyncTask);
                if c.cut {
                    out.count(PyEvent::AsyncCut);
                }
                let prefix = p.task_prefix(out, s.py_task, &c, self.epoch);
                Some(TaskSplice { from, prefix })
            }
            (Some(_), None) => {
                out.count(PyEvent::AsyncMismatch);
                None
            }
            _ => None,
        };
        Some(PythonFrames {
            activations,
            state: Some(st),
            tasks,
        })
    }

    /// Merges a sample's activations into its native frames (root first) at the eval-loop
    /// frames, counting whether they paired up.
    pub fn merge(
        &self,
        native: &[(FrameRef, Arc<str>)],
        classes: &[merge::FrameClass],
        activations: &[Vec<FrameRef>],
        truncated: bool,
        out: &mut impl ProfileSink,
    ) -> Vec<FrameRef> {
        let (frames, outcome) =
            merge::merge(native, classes, activations, truncated, self.show_internal);
        if let Some(e) = outcome {
            if e == PyEvent::MergeMismatch && log::log_enabled!(log::Level::Debug) {
                let names: Vec<&str> = native.iter().map(|(_, n)| n.as_ref()).collect();
                let sizes: Vec<usize> = activations.iter().map(Vec::len).collect();
                log::debug!(
                    "merge mismatch: activations of {sizes:?} frames, native (truncated {truncated}): {}",
                    names.join(";")
                );
            }
            out.count(e);
        }
        frames
    }

    /// While the reader is behind: reads the code objects that threads of Python processes run
    /// now, walking at most `threads` threads (in turn, after those of the previous call). A
    /// process that exits before its samples are read still has its frames named: the walk
    /// copies at a sample only code it expects to be freed soon or that user space has not
    /// read, and the compat programs copy only the first. Returns the code objects read.
    pub fn read_ahead(&mut self, threads: usize) -> usize {
        let mut all: Vec<(u32, u32)> = self
            .procs
            .iter()
            .flat_map(|(&pid, p)| p.threads.keys().map(move |&tid| (pid, tid)))
            .collect();
        if all.is_empty() || threads == 0 {
            return 0;
        }
        all.sort_unstable();
        let from = all.partition_point(|&k| k <= self.ahead);
        let mut read = 0;
        for i in 0..threads.min(all.len()) {
            let (pid, tid) = all[(from + i) % all.len()];
            self.ahead = (pid, tid);
            let Some(walked) = self.walk_thread(pid, tid) else {
                continue;
            };
            let epoch = self.epoch;
            let Some(p) = self.procs.get_mut(&pid) else {
                continue;
            };
            let mut missing: Vec<u64> = walked
                .frames
                .iter()
                .filter(|f| {
                    !p.layout.is_shim(f.flags as u8, f.code, p.none_addr)
                        && plausible_object(f.code)
                        && !p.codes.contains_key(&f.code)
                })
                .map(|f| f.code)
                .collect();
            missing.sort_unstable();
            missing.dedup();
            if !missing.is_empty() {
                read += p.code(&missing, epoch).iter().flatten().count();
            }
        }
        read
    }

    /// Walks the Python frames of a thread from outside, as the BPF program does at a sample
    /// (`dump`, for a thread that is blocked: its frames do not change while it is), with the
    /// thread state and the GIL and GC words. `None` when the process is not a known Python
    /// process or the thread has no thread state.
    pub fn walk_thread(&self, pid: u32, tid: u32) -> Option<WalkedThread> {
        let p = self.procs.get(&pid)?;
        let tstate = *p.threads.get(&tid)?;
        let c = &p.config;
        let r = &p.remote;
        let mut out = WalkedThread {
            tstate,
            frames: Vec::new(),
            gil_holder: r.u64(c.gil_last_holder).unwrap_or(0),
            gil_locked: r.u32(c.gil_locked).unwrap_or(0),
            gc_collecting: r.u32(c.gc_collecting).unwrap_or(0),
            running_task: match c.tstate_running_task {
                profiler_common::NO_OFFSET => 0,
                off => r.u64(tstate + off as u64).unwrap_or(0),
            },
            read_failed: false,
        };
        let mut frame = r.u64(tstate + c.tstate_frame as u64)?;
        if c.cframe_frame != profiler_common::NO_OFFSET && frame != 0 {
            let cframe = frame;
            frame = r.u64(cframe + c.cframe_frame as u64)?;
            // As the BPF walk: a `_PyCFrame` whose frame is not set yet stands for its caller's.
            if frame == 0 || r.u64(frame + c.frame_code as u64).is_none() {
                frame = r
                    .u64(cframe + c.cframe_previous as u64)
                    .filter(|&p| p != 0)
                    .and_then(|p| r.u64(p + c.cframe_frame as u64))
                    .unwrap_or(0);
            }
        }
        let read = (c.frame_read_size as usize).clamp(8, profiler_common::FRAME_BUF);
        let mut seen = HashSet::new();
        while frame != 0 && out.frames.len() < profiler_common::MAX_PY_FRAMES {
            if !seen.insert(frame) {
                break;
            }
            let Some(buf) = r.read(frame, read) else {
                out.read_failed = true;
                break;
            };
            let u64_at = |off: u32| le_u64(&buf, off as usize);
            let code = u64_at(c.frame_code).unwrap_or(0) & c.code_mask;
            let instr = if c.layout == profiler_common::PY_LAYOUT_FRAMEOBJECT {
                remote::le_u32(&buf, c.frame_instr as usize).unwrap_or(0) as i32
            } else {
                let ip = u64_at(c.frame_instr).unwrap_or(0);
                (ip.wrapping_sub(code).wrapping_sub(c.code_adaptive as u64) as i64 / 2) as i32
            };
            let flags = if c.frame_owner != profiler_common::NO_OFFSET {
                buf.get(c.frame_owner as usize).copied().unwrap_or(0) as u32
            } else {
                0
            };
            out.frames
                .push(profiler_common::PyFrame { code, instr, flags });
            // 3.11-3.13: the running task from the innermost `Handle._run`, as at a sample.
            if c.handle_run_code != 0 && code == c.handle_run_code && out.running_task == 0 {
                out.running_task = u64_at(c.frame_self)
                    .and_then(|h| r.u64(h.wrapping_add(c.handle_callback as u64)))
                    .and_then(|cb| r.u64(cb.wrapping_add(c.step_task as u64)))
                    .unwrap_or(0);
            }
            frame = u64_at(c.frame_previous).unwrap_or(0);
        }
        Some(out)
    }

    /// The process's label and Python version, if it is a Python process.
    pub fn labels(&self, pid: u32) -> Option<(&str, &str)> {
        self.procs
            .get(&pid)
            .map(|p| (p.label.as_str(), p.version.as_str()))
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_show_the_script() {
        let c = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            script_label(&c(&["python3", "-u", "/srv/app.py", "x"]), "p"),
            "app.py"
        );
        assert_eq!(
            script_label(&c(&["python3", "-m", "http.server"]), "p"),
            "-m http.server"
        );
        assert_eq!(
            script_label(&c(&["python3", "-X", "dev", "a.py"]), "p"),
            "a.py"
        );
        assert_eq!(script_label(&c(&["python3"]), "p"), "p");
    }

    #[test]
    fn gil_of_an_interpreter_still_starting_is_not_ready() {
        let l312 = layout::builtin(12).unwrap();
        let off = l312.interp_gil_ptr.unwrap();
        let interp = 0x7000_0000;
        let unset = gil_words(&l312, 0x1000, interp, |_| Some(0));
        assert!(matches!(unset, Err(NotPython::NotReady)));
        let unreadable = gil_words(&l312, 0x1000, interp, |_| None);
        assert!(matches!(unreadable, Err(NotPython::NotReady)));
        let set = gil_words(&l312, 0x1000, interp, |a| {
            (a == interp + off).then_some(0x5000)
        });
        assert_eq!(set.ok().flatten(), Some((0x5008, 0x5010)));
        // Up to 3.11 the GIL lives in the runtime: nothing to wait for.
        let l311 = layout::builtin(11).unwrap();
        let g = l311.gil_in_runtime.unwrap();
        let r = gil_words(&l311, 0x1000, interp, |_| None);
        assert_eq!(r.ok().flatten(), Some((0x1000 + g, 0x1000 + g + 8)));
    }

    #[test]
    fn version_from_file_names() {
        assert_eq!(
            parse_minor_from_path("/usr/lib/libpython3.11.so.1.0"),
            Some(11)
        );
        assert_eq!(parse_minor_from_path("/usr/bin/python3.9"), Some(9));
        assert_eq!(parse_minor_from_path("/usr/bin/python3"), None);
    }
}
