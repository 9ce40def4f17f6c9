//! Turns raw samples into profile samples: unwinds the user stack, symbolizes native and kernel
//! frames, splices in Python frames, and files the result under its process and thread.
//!
//! - `sample`: one sample, in stages (kernel frames, mappings, unwind, Python frames,
//!   reconcile, assemble, file);
//! - `frames`: the profile's kernel, native and marker frames, each symbolized once;
//! - `sched`: the scheduler's accounting records, charged to threads' timelines;
//! - `events`: forks, execs and exits;
//! - `blocked`: `dump`'s threads that stay blocked, read from outside as samples.
//!
//! May import `capture`, `process`, `stack`, `python`, `aggregate` and `ksyms_cache`.

use rustc_hash::FxHashMap;
use std::sync::Arc;

use crate::aggregate::identity::{Identity, ServiceSource};
use crate::aggregate::{
    state, Category, Frame, FrameId, Func, LibId, Mode, Opcode, Profile, StackId,
};
use crate::capture::record::RawSample;
use crate::process::unwind::Unwound;
use crate::process::Process;
use crate::python::merge::FrameClass;
use crate::python::{self, FrameRef, ProfileSink, PyEvent, PyThreadState, PythonRegistry};
use crate::stack::elf::ElfCache;
use crate::stack::symbols::KernelSymbols;

mod blocked;
mod events;
mod frames;
mod sample;
mod sched;

use frames::ProcFrames;

pub(super) const KERNEL_LIB: &str = "[kernel.kallsyms]";
/// The root frame of a stack whose native part was not unwound to its end.
pub const TRUNCATED: &str = "[truncated]";
/// The stack of off-CPU time whose stack could not be captured (see `ATTR_UNCAPTURED`).
pub const UNCAPTURED: &str = "[off-CPU, stack not captured]";

/// A new process: (its pid, its parent's).
pub type Child = (u32, u32);

pub struct Collector {
    pub profile: Profile,
    pub procs: FxHashMap<u32, Process>,
    pub elf_files: ElfCache,
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
    /// The command this run launched (`Session::started`).
    pub launched: Option<u32>,
    /// Processes that exec'd since the caller last looked (their Python state is stale), each
    /// with whether the new program is named like a Python interpreter.
    execs: Vec<(u32, bool)>,
    /// New child processes of targets since the caller last looked.
    children: Vec<Child>,
    /// (pid, tid, end of the stack mapping) of threads whose stack copy stopped at a page never
    /// touched, below frames it should have reached (`take_stack_tops`).
    stack_tops: Vec<(u32, u32, u64)>,
    /// `uncaptured_stack` of the current profile, once interned.
    uncaptured: Option<Option<StackId>>,
    /// `--async-aware all`: when each process's tasks were last looked at, or before its
    /// first pass, when it was found (the first pass stands for the time since).
    task_passes: FxHashMap<u32, u64>,
    /// `--env-label`: the environment variables copied into each process's labels.
    pub env_labels: Vec<String>,
}

/// Unwinds one sample may take again while the interpreter's frames refute each chain found
/// (`Collector::reunwind`).
const REUNWINDS: usize = 16;

/// Whether an unwind holds a return address in no module of the process (junk read where a
/// frame kept none).
fn has_stray_address(proc: &crate::process::Process, u: &Unwound) -> bool {
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
fn ensure_process(
    profile: &mut Profile,
    python: &PythonRegistry,
    env_labels: &[String],
    pid: u32,
    comm: &str,
    t_ms: f64,
) {
    let p = match python.labels(pid) {
        Some((label, version)) => {
            let p = profile.process_mut(pid, label, t_ms);
            // A process first made under this label (by the first sample of a process known as
            // Python) has its version set here too.
            if p.name != label || p.python.is_none() {
                p.name = label.to_string();
                p.python = Some(version.to_string());
                // Named after its program until now: after its script from now on.
                if let Some(id) = p.identity.as_mut() {
                    if id.service_source == ServiceSource::Program {
                        id.service = python.program(pid).unwrap_or(comm).to_string();
                    }
                }
            }
            p
        }
        None => {
            let p = profile.process_mut(pid, comm, t_ms);
            if p.name.is_empty() && !comm.is_empty() {
                p.name = comm.to_string();
            }
            p
        }
    };
    if p.identity.is_none() {
        // Once per process (per program: an exec starts a new one), at its first sample.
        let mut program = python.program(pid).unwrap_or(&p.name).to_string();
        let raw = crate::process::identity::read(pid, env_labels);
        if program.is_empty() {
            let exe = raw.executable.as_deref().unwrap_or_default();
            program = exe.rsplit('/').next().unwrap_or_default().to_string();
        }
        p.identity = Some(Identity::from_parts(
            &raw.cgroup,
            &raw.status,
            &raw.env,
            raw.executable,
            &program,
            env_labels,
        ));
    }
}

pub use crate::process::monotonic_ns;

fn alive_task(pid: u32, tid: u32) -> bool {
    crate::process::procfs::task_exists(pid, tid)
}

/// The kernel's symbols a collector names kernel frames with, and where they came from (`-v`
/// says).
pub struct Kernel {
    pub symbols: KernelSymbols,
    pub source: crate::ksyms_cache::Source,
}

impl Kernel {
    /// The boot's copy of the kernel's symbols (`ksyms_cache`).
    pub fn load() -> Kernel {
        let (symbols, source) = crate::ksyms_cache::load();
        Kernel { symbols, source }
    }

    /// No symbols: for records without kernel stacks (the session's tests).
    pub fn none() -> Kernel {
        Kernel {
            symbols: KernelSymbols::parse(""),
            source: crate::ksyms_cache::Source::Kallsyms("not read"),
        }
    }
}

impl Collector {
    /// A collector over the kernel's symbols as `kernel` holds them.
    pub fn new(
        start_ns: u64,
        python: PythonRegistry,
        mode: Mode,
        interval_ms: f64,
        kernel: Kernel,
    ) -> Collector {
        let Kernel {
            symbols: kernel,
            source: kernel_source,
        } = kernel;
        let mut profile = Profile::new(mode, interval_ms);
        let kernel_lib = profile.lib(&Arc::from(KERNEL_LIB));
        Collector {
            profile,
            procs: FxHashMap::default(),
            elf_files: ElfCache::new(crate::python::SPLIT_FUNCTIONS),
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
            env_labels: Vec::new(),
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

    pub fn handle(&mut self, s: RawSample<'_>) {
        self.handle_in(s, false);
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

    /// Processes that exec'd, and new children of targets (with their parents), since the last
    /// call.
    pub fn take_lifetimes(&mut self) -> (Vec<(u32, bool)>, Vec<Child>) {
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

    /// A record that did not decode.
    pub fn bad_record(&mut self) {
        self.profile.counters.bad_records += 1;
    }

    /// Reads `pid`'s mappings (again) and tries to set it up as a Python process: the BPF config
    /// to install when it is newly found. `young`: see `PythonRegistry::try_add`.
    pub fn try_python(&mut self, pid: u32, young: bool) -> Option<profiler_common::PyProcConfig> {
        let elf_files = &mut self.elf_files;
        let proc = self
            .procs
            .entry(pid)
            .or_insert_with(|| Process::new(pid, ""));
        proc.reload_maps(elf_files);
        let found = self.python.try_add(proc, young);
        if found.is_some() && self.python.options().tasks.all() {
            // Its tasks' first pass stands for the time since.
            self.task_passes.insert(pid, crate::process::monotonic_ns());
        }
        found
    }

    /// A child of Python process `parent` found gone at its first sample with Python frames
    /// (`try_python` could not read its mappings): named from its parent's mappings and runtime
    /// (`Process::forked_from`, `PythonRegistry::add_gone_fork`). Returns whether it was.
    pub fn add_gone_fork(&mut self, parent: u32, child: u32) -> bool {
        if self.procs.get(&child).is_some_and(|c| !c.unreadable) {
            return false;
        }
        let Some(p) = self.procs.get(&parent).filter(|p| !p.modules.is_empty()) else {
            return false;
        };
        let copy = Process::forked_from(p, child);
        if !self.python.add_gone_fork(parent, child) {
            return false;
        }
        self.procs.insert(child, copy);
        self.proc_frames.remove(&child);
        true
    }

    /// Whether `pid` was looked at (its mappings read) after `ns`.
    fn known_since(&self, pid: u32, ns: u64) -> bool {
        self.procs.get(&pid).is_some_and(|p| p.maps_read_ns() > ns)
    }

    /// `--async-aware all`: a pass over every suspended asyncio task, at `now_ns`. Each one is a
    /// sample of its await chain on a pseudo-thread of its event loop, weighted with the time
    /// since the previous pass (the first: since the process was found, or the profile
    /// started): the profile reads as the time tasks spent suspended where they are. The
    /// session passes at random spacings, and once more when a profile ends (`-d`, Ctrl-C, a
    /// continuous interval), so that the time after the last spaced pass is charged too.
    pub fn sample_tasks(&mut self, now_ns: u64) {
        if !self.python.options().tasks.all() {
            return;
        }
        let t_ms = self.time_ms(now_ns);
        let pids = self.python.pids();
        // Processes gone since: forgotten (a host's processes come and go for weeks).
        self.task_passes.retain(|p, _| pids.contains(p));
        for pid in pids {
            // A process found before this profile started (a continuous run's earlier
            // interval) is charged from the profile's start.
            let since = self
                .task_passes
                .insert(pid, now_ns)
                .unwrap_or(self.start_ns)
                .max(self.start_ns);
            let weight_ms = now_ns.saturating_sub(since) as f64 / 1e6;
            if weight_ms <= 0.0 {
                continue;
            }
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
            ensure_process(
                &mut self.profile,
                &self.python,
                &self.env_labels,
                pid,
                &comm,
                t_ms,
            );
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
        proc.reload_maps(&mut self.elf_files);
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
