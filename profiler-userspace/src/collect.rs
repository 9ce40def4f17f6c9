//! Turns raw samples into profile samples: unwinds the user stack, symbolizes native and kernel
//! frames, splices in Python frames, and files the result under its process and thread.

use rustc_hash::FxHashMap;
use std::sync::Arc;

use profiler_common::{thread_key, ExitSchedRecord, SchedRecord, ThreadSched, ATTR_UNKNOWN};

use crate::aggregate::timeline::Window;
use crate::aggregate::{
    state, Category, Frame, FrameId, Func, LibId, Mode, Opcode, Profile, StackId,
};
use crate::capture::record::{Event, EventKind, RawSample};
use crate::process::unwind::{unwind_user, LateMemo, Unwound, UserFrame, SCAN_FRAMES};
use crate::process::Process;
use crate::python::merge::FrameClass;
use crate::python::{
    self, FrameRef, ProfileSink, PyEvent, PyThreadState, PythonFrames, PythonRegistry,
};
use crate::stack::elf::ElfCache;
use crate::stack::symbols::KernelSymbols;

const KERNEL_LIB: &str = "[kernel.kallsyms]";
/// The root frame of a stack whose native part was not unwound to its end.
pub const TRUNCATED: &str = "[truncated]";
/// The stack of off-CPU time whose stack could not be captured (see `ATTR_UNCAPTURED`).
pub const UNCAPTURED: &str = "[off-CPU, stack not captured]";

pub struct Collector {
    pub profile: Profile,
    pub procs: FxHashMap<u32, Process>,
    pub elves: ElfCache,
    kernel: KernelSymbols,
    /// Where `kernel` came from at start (`-v` says).
    pub kernel_source: crate::ksyms_cache::Source,
    /// The address that had the whole kernel table read again mid-run, if one did (`-v` says).
    pub kernel_reread_at: Option<u64>,
    kernel_lib: LibId,
    native_frames: FxHashMap<(Arc<str>, u64, Category), FrameId>,
    /// Each process's frames by address, for the mappings it was filled from
    /// (`Process::modules_gen`): a sample's native frames are found by one lookup each, without
    /// the module search and the hashing of its file's path `native_frames` needs (it is shared
    /// by every process that maps the file).
    proc_frames: FxHashMap<u32, ProcFrames>,
    /// `merge`'s class of each native frame, by frame id (`class_of`); frame ids start again
    /// with each profile, and so does this.
    frame_classes: Vec<Option<FrameClass>>,
    /// Names Python gave threads, by (pid, tid), given to the profile's threads as they end.
    thread_names: FxHashMap<(u32, u32), String>,
    kernel_frames: FxHashMap<u64, FrameId>,
    pub python: PythonRegistry,
    start_ns: u64,
    /// Processes that exec'd since the caller last looked (their Python state is stale).
    /// The command this run launched (`Session::started`).
    pub launched: Option<u32>,
    /// With each, whether the new program is named like a Python interpreter.
    execs: Vec<(u32, bool)>,
    /// New child processes of targets since the caller last looked.
    children: Vec<u32>,
    /// (pid, tid, end of the stack mapping) of threads whose stack copy stopped at a page never
    /// touched, below frames it should have reached (`take_stack_tops`).
    stack_tops: Vec<(u32, u32, u64)>,
    /// `uncaptured_stack` of the current profile, once interned.
    uncaptured: Option<Option<StackId>>,
    /// `--async-aware all`: when each process's tasks were last looked at.
    task_passes: FxHashMap<u32, u64>,
}

/// The time the first pass over a process's tasks stands for (later ones: the time since the
/// previous pass; `Session::pass_over_tasks` spaces them).
const TASK_PASS_MS: f64 = 100.0;
/// Unwinds one sample may take again while the interpreter's frames refute each chain found
/// (`Collector::reunwind`).
const REUNWINDS: usize = 16;

/// An unwind's native frames, root first, their classes and how many are eval-loop frames.
struct NativeStack {
    frames: Vec<(FrameId, Arc<str>)>,
    classes: Vec<FrameClass>,
    evals: usize,
}

/// Whether an unwind holds a return address in no module of the process (junk read where a
/// frame kept none).
fn has_junk(proc: &crate::process::Process, u: &Unwound) -> bool {
    u.frames
        .iter()
        .skip(1)
        .any(|f| proc.module_for(f.addr).is_none())
}

/// Python resolution's output, interned into the profile and counted in its counters.
struct PySink<'a>(&'a mut Profile);

impl PySink<'_> {
    /// A Python frame that is a name alone (no file, no line).
    fn named_python_frame(&mut self, name: Arc<str>) -> FrameRef {
        let func = self.0.func(Func {
            name,
            file: None,
            line: None,
            lib: None,
            category: Category::Python,
            is_python: true,
        });
        self.0.frame(Frame {
            func,
            line: None,
            address: None,
            symbol_address: None,
            category: Category::Python,
            opcode: None,
        })
    }
}

impl ProfileSink for PySink<'_> {
    fn python_function(&mut self, name: &Arc<str>, file: &Arc<str>, first_line: u32) -> FrameRef {
        self.0.func(Func {
            name: name.clone(),
            file: Some(file.clone()),
            line: Some(first_line),
            lib: None,
            category: Category::Python,
            is_python: true,
        })
    }

    fn python_frame(
        &mut self,
        func: FrameRef,
        line: u32,
        opcode: Option<python::opcodes::Opcode>,
    ) -> FrameRef {
        self.0.frame(Frame {
            func,
            line: Some(line),
            address: None,
            symbol_address: None,
            category: Category::Python,
            opcode: opcode.map(|o| Opcode {
                name: Arc::from(o.name),
                base: o.base.map(Arc::from),
            }),
        })
    }

    fn task_frame(&mut self, name: &str) -> FrameRef {
        self.named_python_frame(Arc::from(format!("<task> {name}")))
    }

    fn unresolved_frame(&mut self) -> FrameRef {
        self.named_python_frame(Arc::from("<unresolved Python frame>"))
    }

    fn count(&mut self, event: PyEvent) {
        let c = &mut self.0.counters;
        *match event {
            PyEvent::Record => &mut c.py_samples,
            PyEvent::ThreadMiss => &mut c.py_thread_miss,
            PyEvent::ReadFailed => &mut c.py_read_failed,
            PyEvent::Truncated => &mut c.py_truncated,
            PyEvent::Cycle => &mut c.py_cycles,
            PyEvent::Unresolved => &mut c.py_unresolved_frames,
            PyEvent::BadLineTable => &mut c.py_bad_line_tables,
            PyEvent::Merged => &mut c.py_merged,
            PyEvent::MergeMismatch => &mut c.py_merge_mismatch,
            PyEvent::AsyncTask => &mut c.py_async_samples,
            PyEvent::AsyncMismatch => &mut c.py_async_mismatch,
            PyEvent::AsyncCut => &mut c.py_async_cut,
            PyEvent::AsyncSuspended => &mut c.py_async_suspended,
        } += 1;
    }
}

/// A Python thread's state as the profile's state bits.
fn state_bits(s: PyThreadState) -> u8 {
    let mut st = state::PYTHON;
    if s.has_gil {
        st |= state::HAS_GIL;
    }
    if s.gc {
        st |= state::GC;
    }
    if s.main_thread {
        st |= state::MAIN_THREAD;
    }
    st
}

/// Makes sure the profile has process `pid`, named by its Python label when it is a Python
/// process (else by `comm`). Called for every sample and event: allocates only on a (re)name.
fn ensure_process(profile: &mut Profile, python: &PythonRegistry, pid: u32, comm: &str, t_ms: f64) {
    match python.labels(pid) {
        Some((label, version)) => {
            let p = profile.process_mut(pid, label, t_ms);
            // A process first made under this label (by the first sample of a process known as
            // Python) has its version set here too.
            if p.name != label || p.python.is_none() {
                p.name = label.to_string();
                p.python = Some(version.to_string());
            }
        }
        None => {
            let p = profile.process_mut(pid, comm, t_ms);
            if p.name.is_empty() && !comm.is_empty() {
                p.name = comm.to_string();
            }
        }
    }
}

pub use crate::process::monotonic_ns;

fn alive_task(pid: u32, tid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}/task/{tid}")).exists()
}

/// One process's entry of `Collector::proc_frames`.
#[derive(Default)]
struct ProcFrames {
    modules_gen: u64,
    frames: FxHashMap<(u64, Category), FrameId>,
}

impl Collector {
    pub fn new(start_ns: u64, python: PythonRegistry, mode: Mode, interval_ms: f64) -> Collector {
        let mut profile = Profile::new(mode, interval_ms);
        let kernel_lib = profile.lib(&Arc::from(KERNEL_LIB));
        let (kernel, kernel_source) = crate::ksyms_cache::load();
        Collector {
            profile,
            procs: FxHashMap::default(),
            elves: ElfCache::new(crate::python::SPLIT_FUNCTIONS),
            kernel,
            kernel_source,
            kernel_reread_at: None,
            kernel_lib,
            native_frames: FxHashMap::default(),
            proc_frames: FxHashMap::default(),
            frame_classes: Vec::new(),
            thread_names: FxHashMap::default(),
            kernel_frames: FxHashMap::default(),
            python,
            start_ns,
            launched: None,
            execs: Vec::new(),
            children: Vec::new(),
            stack_tops: Vec::new(),
            uncaptured: None,
            task_passes: FxHashMap::default(),
        }
    }

    /// Names kernel code made since boot that the caller knows of (the profiler's own BPF
    /// programs), where the kernel's table does not.
    pub fn add_kernel_code(&mut self, code: Vec<(u64, u64, String)>) {
        self.kernel.add_code(code);
    }

    pub fn time_ms(&self, ns: u64) -> f64 {
        (ns as i64 - self.start_ns as i64) as f64 / 1e6
    }

    /// The frame at the root of a stack whose native part could not be unwound to its end.
    fn truncated_frame(&mut self) -> FrameId {
        self.marker_frame(TRUNCATED)
    }

    /// A frame that stands for what a stack could not show.
    fn marker_frame(&mut self, name: &str) -> FrameId {
        let func = self.profile.func(Func {
            name: Arc::from(name),
            file: None,
            line: None,
            lib: None,
            category: Category::Other,
            is_python: false,
        });
        self.profile.frame(Frame {
            func,
            line: None,
            address: None,
            symbol_address: None,
            category: Category::Other,
            opcode: None,
        })
    }

    fn kernel_frame(&mut self, addr: u64) -> FrameId {
        if let Some(&f) = self.kernel_frames.get(&addr) {
            return f;
        }
        if !self.kernel.knows(addr) {
            // Kernel code made since boot that the boot's copy does not hold (someone else's
            // BPF program, a trampoline): the whole table, once.
            self.kernel = KernelSymbols::load();
            self.kernel_reread_at = Some(addr);
        }
        let (name, sym) = match self.kernel.lookup(addr) {
            Some((start, name)) => (name, Some(start)),
            None => (Arc::from(format!("0x{addr:x}").as_str()), None),
        };
        let func = self.profile.func(Func {
            name,
            file: None,
            line: None,
            lib: Some(self.kernel_lib),
            category: Category::Kernel,
            is_python: false,
        });
        let f = self.profile.frame(Frame {
            func,
            line: None,
            address: Some(addr),
            symbol_address: sym,
            category: Category::Kernel,
            opcode: None,
        });
        self.kernel_frames.insert(addr, f);
        f
    }

    /// The native frames of an unwind, root first, their classes and its eval-loop frames.
    fn unwound_frames(&mut self, pid: u32, u: &Unwound, cat: Category) -> NativeStack {
        let native: Vec<(FrameId, Arc<str>)> = u
            .frames
            .iter()
            .rev()
            .map(|uf| self.native_frame(pid, *uf, cat))
            .collect();
        let classes = self.classes_of(&native);
        let evals = classes.iter().filter(|c| c.is_eval()).count();
        NativeStack {
            frames: native,
            classes,
            evals,
        }
    }

    /// Other unwinds of sample `s` than `first`, whose eval-loop frames do not pair with the
    /// interpreter's `want` activations; the first that does is returned. Two things go wrong
    /// past a frame without unwind information whose caller's frame is larger than the copy
    /// (OpenBLAS's kernels under `dgetrf_parallel`):
    /// - the scan takes a stale return address, left by an earlier call in the buffer the
    ///   kernel reserved, whose chain still reaches the root: its next candidates are taken in
    ///   turn;
    /// - the stack beyond the copy, read late, is no longer the sample's (nor are the chains
    ///   the scan's candidates lead to): it is taken from the memos of the thread's last
    ///   confirmed unwinds instead (`unwind::LateMemo`), each of which counts only where the
    ///   unwind leaves the copy at the frame it was taken at.
    ///
    /// At most `REUNWINDS` unwinds in all, whose scans walk `SCAN_FRAMES` frames in all (one
    /// unwind's). A chain that is not rooted, or holds an address in no module, is never
    /// taken.
    fn reunwind(
        &mut self,
        pid: u32,
        s: &RawSample,
        first: &Unwound,
        want: usize,
        cat: Category,
    ) -> Option<(Unwound, NativeStack)> {
        let memos: Vec<LateMemo> = if first.late_read.is_some() {
            self.procs.get(&pid)?.late_memos_of(s.tid)
        } else {
            Vec::new()
        };
        let mut budget = REUNWINDS;
        let mut scan_frames = SCAN_FRAMES;
        // The live thread's stack first (the first unwind's scan went on), then each memo.
        for (i, memo) in std::iter::once(None)
            .chain(memos.iter().map(Some))
            .enumerate()
        {
            let mut skip = Vec::new();
            if i == 0 {
                match first.scanned_from.and(first.scan_slot) {
                    Some(at) => skip.push(at),
                    None => continue,
                }
            }
            while budget > 0 && scan_frames > 0 {
                budget -= 1;
                let proc = self.procs.get_mut(&pid)?;
                let again = unwind_user(proc, s, &skip, memo, &mut scan_frames);
                if has_junk(proc, &again) {
                    break;
                }
                if again.rooted {
                    let stack = self.unwound_frames(pid, &again, cat);
                    if stack.evals == want {
                        return Some((again, stack));
                    }
                }
                match again.scanned_from.and(again.scan_slot) {
                    Some(at) => skip.push(at),
                    None => break,
                }
            }
        }
        None
    }

    /// The classes `merge` needs of a sample's native frames, each found from its name once per
    /// frame id.
    fn classes_of(&mut self, native: &[(FrameId, Arc<str>)]) -> Vec<FrameClass> {
        native.iter().map(|f| self.class_of(f)).collect()
    }

    fn class_of(&mut self, (f, name): &(FrameId, Arc<str>)) -> FrameClass {
        if let Some(Some(c)) = self.frame_classes.get(*f) {
            return *c;
        }
        let c = FrameClass::of(name);
        if self.frame_classes.len() <= *f {
            self.frame_classes.resize(*f + 1, None);
        }
        self.frame_classes[*f] = Some(c);
        c
    }

    /// Where an anonymous function of the Python runtime waits on a condition variable or mutex
    /// straight from the runtime, which in CPython's glibc builds only the GIL does (its own
    /// locks use semaphores): `take_gil` or `drop_gil` in an interpreter without a symbol table.
    fn anonymous_gil_frame(&self, native: &[(FrameId, Arc<str>)]) -> Option<usize> {
        native.windows(2).position(|w| {
            let (caller, callee) = (&w[0], &w[1]);
            matches!(
                callee.1.as_ref(),
                "pthread_cond_wait" | "pthread_cond_timedwait" | "pthread_mutex_lock"
            ) && caller.1.contains("+0x")
                && self.profile.funcs[self.profile.frames[caller.0].func]
                    .lib
                    .is_some_and(|l| self.profile.libs[l].is_interpreter())
        })
    }

    /// Whether a kernel frame is in an exec, which replaces the process's memory.
    fn is_exec_point(&self, f: FrameId) -> bool {
        let name = self.profile.funcs[self.profile.frames[f].func]
            .name
            .as_ref();
        name.starts_with("__x64_sys_execve")
            || name.starts_with("__ia32_sys_execve")
            || name.starts_with("__arm64_sys_execve")
            || name == "begin_new_exec"
            || name == "bprm_execve"
    }

    /// Whether a kernel frame is in BPF program or tracepoint-dispatch code (by its symbol, from
    /// the kernel frame cache: no symbol lookup per sample).
    fn is_tracing_frame(&mut self, addr: u64) -> bool {
        let f = self.kernel_frame(addr);
        let name = &self.profile.funcs[self.profile.frames[f].func].name;
        [
            "bpf_prog_",
            "bpf_trace_run",
            "__bpf_trace_",
            "__traceiter_",
            "bpf_trampoline_",
        ]
        .iter()
        .any(|p| name.starts_with(p))
    }

    /// Symbolizes one user frame of `pid`. Returns the frame and the symbol name.
    fn native_frame(&mut self, pid: u32, uf: UserFrame, cat: Category) -> (FrameId, Arc<str>) {
        let addr = uf.lookup_addr();
        let gen = self.procs.get(&pid).map_or(0, |p| p.modules_gen);
        let cached = self.proc_frames.get(&pid).and_then(|c| {
            (c.modules_gen == gen)
                .then(|| c.frames.get(&(addr, cat)).copied())
                .flatten()
        });
        if let Some(f) = cached {
            let name = self.profile.funcs[self.profile.frames[f].func].name.clone();
            return (f, name);
        }
        let (f, name) = self.native_frame_uncached(pid, addr, cat);
        let c = self.proc_frames.entry(pid).or_default();
        if c.modules_gen != gen {
            c.modules_gen = gen;
            c.frames.clear();
        }
        c.frames.insert((addr, cat), f);
        (f, name)
    }

    /// `native_frame` for an address of `pid` not looked up since its mappings were read.
    fn native_frame_uncached(&mut self, pid: u32, addr: u64, cat: Category) -> (FrameId, Arc<str>) {
        let proc = self.procs.get(&pid);
        let module = proc.and_then(|p| p.module_for(addr)).cloned();
        let Some(m) = module else {
            let name: Arc<str> = Arc::from(format!("0x{addr:x}").as_str());
            let func = self.profile.func(Func {
                name: name.clone(),
                file: None,
                line: None,
                lib: None,
                category: cat,
                is_python: false,
            });
            let f = self.profile.frame(Frame {
                func,
                line: None,
                address: None,
                symbol_address: None,
                category: cat,
                opcode: None,
            });
            return (f, name);
        };
        let svma = addr.wrapping_sub(m.bias);
        let key = (m.path.clone(), svma, cat);
        if let Some(&f) = self.native_frames.get(&key) {
            let name = self.profile.funcs[self.profile.frames[f].func].name.clone();
            return (f, name);
        }
        let lib = self.profile.lib(&m.path);
        let (name, sym) = match m.elf.as_ref().and_then(|e| e.symbols().lookup(svma)) {
            Some((start, name)) => (name, Some(start)),
            // Unnamed in a stripped dynamic loader: where the process started.
            None if m.elf.as_ref().is_some_and(|e| e.at_entry(svma)) => {
                (Arc::from("_start"), m.elf.as_ref().map(|e| e.entry))
            }
            // No symbol (a stripped library): named by library and offset, as perf does.
            None => (
                Arc::from(format!("{}+0x{svma:x}", self.profile.libs[lib].name).as_str()),
                None,
            ),
        };
        // The GIL hand-off and the garbage collector are named for what they are, in every
        // stack they are in (the Gecko output colours what they call the same way).
        let cat = if crate::python::is_gil_function(&name) {
            Category::Gil
        } else if crate::python::is_gc_function(&name) && self.profile.libs[lib].is_interpreter() {
            Category::Gc
        } else {
            cat
        };
        let func = self.profile.func(Func {
            name: name.clone(),
            file: None,
            line: None,
            lib: Some(lib),
            category: cat,
            is_python: false,
        });
        let f = self.profile.frame(Frame {
            func,
            line: None,
            address: Some(svma),
            symbol_address: sym,
            category: cat,
            opcode: None,
        });
        self.native_frames.insert(key, f);
        (f, name)
    }

    pub fn handle(&mut self, s: RawSample<'_>) {
        self.handle_in(s, false);
    }

    /// `blocked`: a sample of a thread read from outside while it stayed blocked (`dump`),
    /// kept as a sample of its own and off CPU.
    fn handle_in(&mut self, s: RawSample<'_>, blocked: bool) {
        let t_ms = self.time_ms(s.time_ns);
        // How long the sample waited in the ring buffer before being read.
        let lag_ms = monotonic_ns().saturating_sub(s.time_ns) as f64 / 1e6;
        let c = &mut self.profile.counters;
        c.last_lag_ms = lag_ms;
        c.max_lag_ms = c.max_lag_ms.max(lag_ms);
        let pid = s.pid;
        // Kernel frames, root first. The innermost ones of an off-CPU capture are the
        // profiler's own BPF program and the tracepoint that ran it; the thread's stack ends at
        // the scheduler.
        let mut kstack: &[u64] = &s.kstack;
        while let Some((&k, rest)) = kstack.split_first() {
            if !self.is_tracing_frame(k) {
                break;
            }
            kstack = rest;
        }
        let kernel: Vec<FrameId> = kstack.iter().rev().map(|&k| self.kernel_frame(k)).collect();
        // A sample inside an exec: the user registers are the old program's, whose mappings
        // are gone or going (the maps read now are the new program's); its kernel stack says it.
        let replaced = kernel.iter().any(|&f| self.is_exec_point(f));
        let elves = &mut self.elves;
        let proc = self
            .procs
            .entry(pid)
            .or_insert_with(|| Process::new(pid, &s.comm));
        // A main-thread sample named otherwise than the process is now: it ran the program the
        // process exec'd away from since (a launcher's child waiting for its start), whose code
        // the mappings read now do not show. The name is read again to be sure (a process may
        // rename itself; its later samples then match).
        let foreign = s.tid == pid
            && !s.comm.is_empty()
            && s.comm != proc.comm
            && crate::process::read_comm(pid).is_some_and(|c| {
                let differs = c != s.comm;
                proc.comm = c;
                differs
            });
        let replaced = replaced || foreign;
        // The process loaded code since its previous record: read its mappings now, while it
        // most likely lives (see `SAMPLE_MAPS_CHANGED`). Records are read in time order, so the
        // libraries one import loads cost one read.
        if s.flags & profiler_common::SAMPLE_MAPS_CHANGED != 0
            && !replaced
            && proc.maps_read_ns() != 0
            && proc.maps_read_ns() < s.time_ns
        {
            proc.reload_maps(elves);
            self.profile.counters.maps_read_on_load += 1;
        }
        if s.ip != 0 && !replaced {
            proc.ensure_maps(s.ip, s.time_ns, elves);
        }
        let mut unwound = if s.flags & profiler_common::SAMPLE_NO_USER == 0 && !replaced {
            let mut u = unwind_user(proc, &s, &[], None, &mut { SCAN_FRAMES });
            // A return address outside every known module: a library mapped since the maps
            // were read. Re-read them (rate-limited) and unwind again.
            if let Some(f) = u.frames.iter().find(|f| proc.module_for(f.addr).is_none()) {
                let before = proc.modules.len();
                proc.ensure_maps(f.addr, s.time_ns, elves);
                if proc.modules.len() != before {
                    u = unwind_user(proc, &s, &[], None, &mut { SCAN_FRAMES });
                }
            }
            // A return address in no module is junk the unwinder read where a frame without
            // unwind information (hand-written assembly, such as OpenBLAS kernels) kept no
            // return address: the stack ends before it, truncated, rather than with invented
            // frames. The interrupted instruction itself may be in anonymous code (a JIT).
            if let Some(i) = u
                .frames
                .iter()
                .skip(1)
                .position(|f| proc.module_for(f.addr).is_none())
            {
                u.frames.truncate(i + 1);
                u.truncated = true;
            }
            // The copy ended at a fault below the end of the thread's stack: a page the thread
            // never touched (a large buffer a function reserved and did not fill). Later copies
            // of this thread step over such pages up to the stack's end.
            if u.truncated && s.flags & profiler_common::SAMPLE_USTACK_SHORT != 0 {
                let copied_to = s.sp + s.stack.len() as u64;
                if let Some(end) = proc.stack_mapping(s.sp).map(|m| m.end) {
                    if end > copied_to && proc.stack_tops.insert(s.tid) {
                        self.stack_tops.push((pid, s.tid, end));
                    }
                }
            }
            u
        } else {
            crate::process::unwind::Unwound::empty()
        };
        // Python frames of this instant, resolved to names and lines.
        let py = self.python.resolve(&s, &mut PySink(&mut self.profile));

        let is_python_proc = py.is_some();
        let native_cat = if is_python_proc {
            Category::Native
        } else {
            Category::User
        };

        // Native frames, root first, and their classes once a Python sample needs them.
        let mut native: Vec<(FrameId, Arc<str>)> = Vec::with_capacity(unwound.frames.len());
        let mut classes: Vec<FrameClass> = Vec::new();
        for uf in unwound.frames.iter().rev() {
            native.push(self.native_frame(pid, *uf, native_cat));
        }
        // Fewer eval-loop frames than interpreter activations: each activation runs in an eval
        // frame below it, so the native stack ends early. The unwinder stopped without an error
        // at a frame without unwind information whose frame pointer was not one (OpenBLAS's
        // assembly kernels): a truncated stack, said so, not a whole one.
        if let Some(PythonFrames { activations, .. }) = &py {
            if !activations.is_empty() && s.flags & profiler_common::SAMPLE_NO_USER == 0 {
                classes = self.classes_of(&native);
                let mut evals = classes.iter().filter(|c| c.is_eval()).count();
                // The interpreter's frames refute the unwind: other unwinds of the sample are
                // tried (`Collector::reunwind`).
                if evals != activations.len() {
                    if let Some((again, stack)) =
                        self.reunwind(pid, &s, &unwound, activations.len(), native_cat)
                    {
                        unwound = again;
                        (native, classes, evals) = (stack.frames, stack.classes, stack.evals);
                    }
                }
                if evals == activations.len() {
                    if let Some(proc) = self.procs.get_mut(&pid) {
                        unwound.keep_late(proc, s.tid);
                    }
                }
                // A stack scan that skipped eval-loop frames (it found a stale return address
                // that still leads to the root), or frames read after the sample that are not
                // the sample's (the eval-loop frames do not pair with the activations), are
                // refuted by the interpreter's own frames: only what the rules unwound from
                // the copy is kept.
                // A rooted unwind without them went through a guess at a frame without
                // unwind information (`Unwound::refute_guesses`): what follows it is stale.
                let late_wrong = unwound.late_from.is_some() && evals != activations.len();
                let scan_wrong = evals < activations.len() && unwound.scanned_from.is_some();
                let guess_wrong = evals < activations.len() && unwound.rooted;
                if late_wrong || scan_wrong || guess_wrong {
                    if late_wrong {
                        unwound.refute_late();
                    } else if scan_wrong {
                        unwound.refute_scan();
                    }
                    if guess_wrong {
                        if let Some(proc) = self.procs.get_mut(&pid) {
                            unwound.refute_guesses(proc);
                        }
                    }
                    let stack = self.unwound_frames(pid, &unwound, native_cat);
                    (native, classes, evals) = (stack.frames, stack.classes, stack.evals);
                }
                unwound.truncated |= evals < activations.len();
                if evals != activations.len() && log::log_enabled!(log::Level::Debug) {
                    let addrs: Vec<String> = unwound
                        .frames
                        .iter()
                        .map(|f| format!("{:#x}{}", f.addr, if f.is_return { "" } else { "!" }))
                        .collect();
                    log::debug!(
                        "eval frames {evals}, activations {}: scanned from {:?}, late from {:?}, \
                         ip {:#x} sp {:#x} bp {:#x} lr {:#x}, flags {:#x}, stack {} bytes \
                         {:x?}: {}",
                        activations.len(),
                        unwound.scanned_from,
                        unwound.late_from,
                        s.ip,
                        s.sp,
                        s.bp,
                        s.lr,
                        s.flags,
                        s.stack.len(),
                        (0..6)
                            .map(|i| s.read_stack(s.sp + 8 * i))
                            .collect::<Vec<_>>(),
                        addrs.join(" ")
                    );
                }
            }
        }
        if unwound.truncated {
            self.profile.counters.native_truncated += 1;
        }
        // The GIL hand-off of an interpreter without a symbol table is the GIL's, as a named
        // `take_gil` is (`native_frame`): its frame says so, for what it calls to be coloured so.
        if py.is_some() {
            if let Some(i) = self.anonymous_gil_frame(&native) {
                let mut fr = self.profile.frames[native[i].0].clone();
                fr.category = Category::Gil;
                native[i].0 = self.profile.frame(fr);
            }
        }
        // Waiting for the GIL: a frame of the GIL hand-off is on the stack.
        let in_gil_handoff = native
            .iter()
            .any(|(f, _)| self.profile.frames[*f].category == Category::Gil);
        let mut root_first: Vec<FrameId> = match py {
            Some(PythonFrames {
                ref activations, ..
            }) if !activations.is_empty() => {
                if classes.len() != native.len() {
                    classes = self.classes_of(&native);
                }
                self.python.merge(
                    &native,
                    &classes,
                    activations,
                    unwound.truncated,
                    &mut PySink(&mut self.profile),
                )
            }
            _ => native.iter().map(|(f, _)| *f).collect(),
        };
        // `--async-aware`: what is rootward of the running task's coroutine (the event loop's
        // machinery, Python and native) gives way to the task and those awaiting it.
        let spliced = match py.as_ref().and_then(|p| p.tasks.as_ref()) {
            Some(t) => match root_first.iter().position(|&f| f == t.from) {
                Some(i) => {
                    root_first.splice(..i, t.prefix.iter().copied());
                    true
                }
                None => false,
            },
            None => false,
        };
        if unwound.truncated && !spliced {
            // The native stack's root part is missing: said at the root, so such stacks are
            // not mistaken for whole ones (and do not root at a Python or library frame).
            root_first.insert(0, self.truncated_frame());
        }
        root_first.extend_from_slice(&kernel);
        if root_first.is_empty() {
            self.profile.counters.kernel_only += 1;
        }
        let stack = self.profile.stack(&root_first);
        let mut st = 0u8;
        if let Some(py_state) = py.as_ref().and_then(|p| p.state) {
            st = state_bits(py_state);
            // Waiting for the GIL: in the GIL hand-off path. A thread inside `drop_gil` may still
            // be the recorded holder while it blocks on the GIL's mutex to release it; it is
            // giving the GIL up (3.13+ clears `holds_gil` on entry), so it does not hold it.
            if in_gil_handoff {
                st &= !state::HAS_GIL;
                st |= state::GIL_WAIT;
            }
        }
        if s.flags & profiler_common::SAMPLE_PY_EXCEPTION != 0 {
            st |= state::EXCEPTION;
        }
        let comm = self.procs.get(&pid).map_or("", |p| p.comm.as_str());
        ensure_process(&mut self.profile, &self.python, pid, comm, t_ms);
        if s.off_cpu {
            // Charged by the accounting records that name it.
            self.profile.counters.offcpu_captures += 1;
            let t = self.profile.thread_mut(pid, "", s.tid, &s.comm, t_ms);
            t.sched.note_capture(s.time_ns, stack, st);
        } else {
            if !blocked {
                st |= state::ON_CPU;
            }
            self.profile
                .add_sample(pid, "", s.tid, &s.comm, t_ms, stack, st);
        }
    }

    /// The process's name in the profile: the script for Python processes, else its comm.
    /// A scheduler or lifetime event.
    pub fn handle_event(&mut self, e: Event) {
        let t_ms = self.time_ms(e.time_ns);
        match e.kind {
            EventKind::Fork {
                child_pid,
                child_tid,
            } => {
                self.profile.task_born(child_pid, child_tid, t_ms);
                if child_pid == e.pid {
                    self.python.threads_changed(e.pid);
                }
                if child_pid == child_tid && child_pid != e.pid {
                    // A new process: nothing known about the pid before is valid.
                    self.forget_process(child_pid);
                    self.children.push(child_pid);
                }
            }
            EventKind::Exec => {
                self.profile.exec(e.pid, t_ms);
                // The launched command is looked at before its first records are read: if that
                // was after this exec, it is known as the new program already.
                if self.launched != Some(e.pid) || !self.known_since(e.pid, e.time_ns) {
                    self.forget_process(e.pid);
                    self.execs
                        .push((e.pid, crate::python::python_name(&e.comm)));
                }
            }
            EventKind::Exit { group_dead } => {
                if let Some(t) = self
                    .profile
                    .processes
                    .get_mut(&e.pid)
                    .and_then(|p| p.threads.get_mut(&e.tid))
                {
                    if t.name.is_empty() {
                        t.name = e.comm.clone();
                    }
                }
                self.profile.task_exit(e.pid, e.tid, t_ms, group_dead);
                self.python.threads_changed(e.pid);
                if let Some(p) = self.procs.get_mut(&e.pid) {
                    p.suffixes.remove(&e.tid);
                }
            }
        }
    }

    /// A thread's scheduler accounting record.
    pub fn handle_sched(&mut self, r: &SchedRecord) {
        let w = Window {
            t0: (r.t0_ns != 0).then(|| self.time_ms(r.t0_ns)),
            t1: self.time_ms(r.t1_ns),
            on_ms: r.on_ns as f64 / 1e6,
            off_ms: r.off_ns.map(|n| n as f64 / 1e6),
            slot_cap: r.slot_cap,
            switches: r.switches,
            attr: r.attr,
        };
        self.account(r.pid, r.tid, &w);
    }

    fn account(&mut self, pid: u32, tid: u32, w: &Window) {
        let uncaptured = self.uncaptured_stack();
        ensure_process(&mut self.profile, &self.python, pid, "", w.t1);
        let mode = self.profile.mode;
        let t = self
            .profile
            .thread_mut(pid, "", tid, "", w.t0.unwrap_or(w.t1));
        let start = t.start_ms.unwrap_or(0.0);
        t.sched.account(&mut t.samples, w, start, mode, uncaptured);
    }

    /// The stack of off-CPU time without a capture, interned once per profile.
    fn uncaptured_stack(&mut self) -> Option<StackId> {
        if let Some(s) = self.uncaptured {
            return s;
        }
        let f = self.marker_frame(UNCAPTURED);
        let s = self.profile.stack(&[f]);
        self.uncaptured = Some(s);
        s
    }

    /// Charges what the BPF side held and had not sent at `now_ns` (see
    /// `Session::settle_sched`): each thread's open span, and its intervals since its last
    /// switch-out up to `now_ns`. Only threads the profile knows: the BPF side also holds threads of processes
    /// that are not profiled any more, or that never had a sample.
    pub fn settle_sched(&mut self, snapshot: &[(u64, ThreadSched)], now_ns: u64) {
        let now = self.time_ms(now_ns);
        for &(key, st) in snapshot {
            let (pid, tid) = ((key >> 32) as u32, key as u32);
            debug_assert_eq!(thread_key(pid, tid), key);
            let known = self
                .profile
                .processes
                .get(&pid)
                .is_some_and(|p| p.threads.contains_key(&tid));
            if !known {
                continue;
            }
            // On CPU since its last switch-out for the CPU time it has used since, as the BPF
            // side would count it at its next switch-out.
            let used = match st.since_ns {
                0 => 0,
                _ => crate::process::thread_cpu_ns(pid, tid)
                    .map_or(0, |s| s.saturating_sub(st.last_sum)),
            };
            self.close_sched(pid, tid, &st, now_ns, used);
            if let Some(t) = self
                .profile
                .processes
                .get_mut(&pid)
                .and_then(|p| p.threads.get_mut(&tid))
            {
                t.sched.settle(now);
            }
        }
    }

    /// A thread exited: what the BPF side held of it, closed at its exit with its exact CPU
    /// time (its `RECORD_EXIT` follows).
    pub fn handle_exit_sched(&mut self, r: &ExitSchedRecord) {
        let used = r.sum_ns.saturating_sub(r.sched.last_sum);
        self.close_sched(r.pid, r.tid, &r.sched, r.time_ns, used);
    }

    /// Charges a thread's open span in `st`, then its intervals since its last switch-out up to
    /// `now_ns`: off CPU, then on CPU for the `used` nanoseconds of CPU time it had meanwhile
    /// (the BPF side's `close_intervals`, with the same clamping).
    fn close_sched(&mut self, pid: u32, tid: u32, st: &ThreadSched, now_ns: u64, used: u64) {
        let now = self.time_ms(now_ns);
        if st.span_start != 0 {
            let w = Window {
                t0: Some(self.time_ms(st.span_start)),
                t1: self.time_ms(st.span_end),
                on_ms: st.on_ns as f64 / 1e6,
                off_ms: st.off_ns.map(|n| n as f64 / 1e6),
                slot_cap: st.slot_cap,
                switches: st.switches.max(1),
                attr: 0,
            };
            self.account(pid, tid, &w);
        }
        if st.since_ns == 0 {
            return;
        }
        let since = self.time_ms(st.since_ns);
        let on_ms = (used as f64 / 1e6).clamp(0.0, (now - since).max(0.0));
        let back = now - on_ms;
        let base = Window {
            slot_cap: st.slot_cap,
            attr: st.attr,
            ..Default::default()
        };
        if st.attr != ATTR_UNKNOWN && back > since {
            let mut w = Window {
                t0: Some(since),
                t1: back,
                ..base
            };
            if let Some(o) = w.off_ms.get_mut(st.attr as usize) {
                *o = back - since;
            }
            self.account(pid, tid, &w);
        }
        if on_ms > 0.0 {
            let w = Window {
                t0: Some(back),
                t1: now,
                on_ms,
                ..base
            };
            self.account(pid, tid, &w);
        }
    }

    /// Drops the memory maps and symbol state of `pid` (it exec'd, or the pid was reused).
    fn forget_process(&mut self, pid: u32) {
        self.procs.remove(&pid);
        self.proc_frames.remove(&pid);
    }

    /// Ends the current profile of a continuous run at `now_ns` and starts the next one there;
    /// returns the finished profile. Caches of the old profile's ids are dropped; symbol and code
    /// caches stay.
    pub fn rotate(&mut self, now_ns: u64) -> Profile {
        let end = self.time_ms(now_ns);
        self.apply_thread_names();
        let mut next = self.profile.successor(end);
        self.profile.finish(end);
        self.kernel_lib = next.lib(&Arc::from(KERNEL_LIB));
        self.native_frames.clear();
        self.proc_frames.clear();
        self.frame_classes.clear();
        self.uncaptured = None;
        self.kernel_frames.clear();
        self.python.new_profile();
        self.start_ns = now_ns;
        std::mem::replace(&mut self.profile, next)
    }

    /// Drops what is kept about processes that are gone (long runs see many come and go):
    /// `gone` says which are, and have no record still waiting to be read (a reader behind
    /// reads a process's last samples after it has exited, and needs its maps and runtime then).
    pub fn sweep(&mut self, gone: &mut impl FnMut(u32) -> bool) {
        self.procs.retain(|&pid, _| !gone(pid));
        let procs = &self.procs;
        self.proc_frames.retain(|pid, _| procs.contains_key(pid));
        // Names are given before their threads' entries go with them.
        self.apply_thread_names();
        self.thread_names
            .retain(|&(pid, tid), _| !gone(pid) && alive_task(pid, tid));
        self.python.sweep(gone);
    }

    /// Processes that exec'd, and new children of targets, since the last call.
    pub fn take_lifetimes(&mut self) -> (Vec<(u32, bool)>, Vec<u32>) {
        (
            std::mem::take(&mut self.execs),
            std::mem::take(&mut self.children),
        )
    }

    /// Threads whose stack copies should step over untouched pages, up to the given end, since
    /// the last call.
    pub fn take_stack_tops(&mut self) -> Vec<(u32, u32, u64)> {
        std::mem::take(&mut self.stack_tops)
    }

    /// `dump`: the threads of `pid` without a sample yet, read from outside while they stay
    /// blocked (`dump::blocked_sample`) and handled as samples; returns their tids.
    pub fn sample_blocked_threads(&mut self, pid: u32) -> std::collections::HashSet<u32> {
        let mut done = std::collections::HashSet::new();
        for (tid, name) in self.python.thread_names_now(pid) {
            self.name_thread(pid, tid, name);
        }
        let tids: Vec<u32> = std::fs::read_dir(format!("/proc/{pid}/task"))
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .collect();
        for tid in tids {
            let sampled = self
                .profile
                .processes
                .get(&pid)
                .and_then(|p| p.threads.get(&tid))
                .is_some_and(|t| t.samples.iter().any(|s| s.stack.is_some()));
            if sampled {
                continue;
            }
            let now = monotonic_ns();
            if let Some(mut s) =
                crate::dump::blocked_sample(&self.python, &self.kernel, pid, tid, now)
            {
                // Kept as a sample of its own, not as an off-CPU capture waiting for the
                // scheduler's accounting to charge it.
                s.off_cpu = false;
                self.handle_in(s, true);
                done.insert(tid);
            }
        }
        done
    }

    /// A record that did not decode.
    pub fn bad_record(&mut self) {
        self.profile.counters.bad_records += 1;
    }

    /// Reads `pid`'s mappings (again) and tries to set it up as a Python process: the BPF config
    /// to install when it is newly found. `young`: see `PythonRegistry::try_add`.
    pub fn try_python(&mut self, pid: u32, young: bool) -> Option<profiler_common::PyProcConfig> {
        let elves = &mut self.elves;
        let proc = self
            .procs
            .entry(pid)
            .or_insert_with(|| Process::new(pid, ""));
        proc.reload_maps(elves);
        self.python.try_add(proc, young)
    }

    /// Whether `pid` was looked at (its mappings read) after `ns`.
    fn known_since(&self, pid: u32, ns: u64) -> bool {
        self.procs.get(&pid).is_some_and(|p| p.maps_read_ns() > ns)
    }

    /// `--async-aware all`: a pass over every suspended asyncio task, at `now_ns`. Each one is a
    /// sample of its await chain on a pseudo-thread of its event loop, weighted with the time
    /// since the previous pass: the profile reads as the time tasks spent suspended where they
    /// are.
    pub fn sample_tasks(&mut self, now_ns: u64) {
        if !self.python.options().async_all {
            return;
        }
        let t_ms = self.time_ms(now_ns);
        let pids = self.python.pids();
        // Processes gone since: forgotten (a host's processes come and go for weeks).
        self.task_passes.retain(|p, _| pids.contains(p));
        for pid in pids {
            let last = self.task_passes.insert(pid, now_ns);
            let weight_ms = match last {
                Some(l) => now_ns.saturating_sub(l) as f64 / 1e6,
                None => TASK_PASS_MS,
            };
            let loops = self.python.suspended_tasks(
                pid,
                self.procs.get(&pid),
                &mut PySink(&mut self.profile),
            );
            if loops.is_empty() {
                continue;
            }
            let comm = self
                .procs
                .get(&pid)
                .map_or("", |p| p.comm.as_str())
                .to_string();
            ensure_process(&mut self.profile, &self.python, pid, &comm, t_ms);
            for (tid, stacks) in loops {
                let name = format!("asyncio tasks (loop in thread {tid})");
                for frames in stacks {
                    let stack = self.profile.stack(&frames);
                    self.profile
                        .add_task_sample(pid, tid, &name, t_ms, stack, weight_ms);
                }
            }
        }
    }

    /// Looks for asyncio in a Python process that has not shown it yet, when it is time to
    /// (`PythonRegistry::asyncio_due`): the BPF config to install once found.
    pub fn find_asyncio(&mut self, pid: u32) -> Option<profiler_common::PyProcConfig> {
        if !self.python.asyncio_due(pid) {
            return None;
        }
        let proc = self.procs.get_mut(&pid)?;
        proc.reload_maps(&mut self.elves);
        self.python.find_asyncio(proc)
    }

    /// Looks again at a process profiled while its runtime was starting
    /// (`PythonRegistry::refresh`).
    pub fn refresh_python(&mut self, pid: u32) -> Option<profiler_common::PyProcConfig> {
        let proc = self.procs.get(&pid)?;
        self.python.refresh(proc)
    }

    /// Ends the run at `end_ns`: closes every timeline, sorts samples, builds markers.
    pub fn finish(&mut self, end_ns: u64) {
        let end = self.time_ms(end_ns);
        self.apply_thread_names();
        self.profile.finish(end);
    }

    /// The name Python gave a thread of `pid`.
    pub fn name_thread(&mut self, pid: u32, tid: u32, name: String) {
        self.thread_names.insert((pid, tid), name);
    }

    /// Gives the profile's threads the names Python gave them.
    fn apply_thread_names(&mut self) {
        for p in self.profile.processes.values_mut() {
            for t in p.threads.values_mut() {
                if let Some(name) = self.thread_names.get(&(p.pid, t.tid)) {
                    t.python_name = Some(name.clone());
                }
            }
        }
    }
}
