//! What is known of one Python process's asyncio (`--async-aware`): its layout once found, the
//! await chains of running tasks, the event loops' threads and the `<task>` frames, and the
//! passes of `all` over every suspended task.

use std::sync::Arc;

use rustc_hash::FxHashMap;

use profiler_common::PyProcConfig;

use super::{AsyncLayout, AwaitChain, NameCache, TaskBytes, HANDLE_CALLBACK, STEP_TASK};
use crate::process::Process;
use crate::python::discover::PyProcess;
use crate::python::frame_chain::FrameChain;
use crate::python::registry::PythonRegistry;
use crate::python::remote::le_u64;
use crate::python::{FrameRef, ProfileSink, PyEvent};

/// A cached await chain (`PyProcess::await_chains`).
pub(in crate::python) struct AwaitEntry {
    epoch: u64,
    key: Option<[u64; 3]>,
    chain: Option<Arc<AwaitChain>>,
    /// The chain's frames once resolved (`PyProcess::task_prefix`).
    prefix: Option<Arc<Vec<FrameRef>>>,
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

/// One process's asyncio state.
#[derive(Default)]
pub struct AsyncState {
    /// asyncio's layout once found (`--async-aware`), and when it was last looked for.
    pub(in crate::python) layout: Option<AsyncLayout>,
    pub(in crate::python) looked: Option<std::time::Instant>,
    pub(in crate::python) looks: u32,
    /// 3.11-3.13, `--async-aware`: asyncio's `Handle._run` code object is looked for among
    /// the code objects samples name, and its address once seen (see
    /// `PyProcConfig::handle_run_code`).
    pub(in crate::python) handle_run_wanted: bool,
    pub(in crate::python) handle_run: u64,
    /// 3.11-3.13, `all`: the set of every task once found, a task seen running (to find it
    /// from), and the thread each event loop was seen running a task in.
    pub(in crate::python) task_set: u64,
    pub(in crate::python) seen_task: u64,
    pub(in crate::python) loop_threads: FxHashMap<u64, u32>,
    /// Passes of `all` since the threads were last walked for their loops.
    pub(in crate::python) loop_passes: u32,
    /// Await chains by running task, with the epoch they were last checked in and what they
    /// were read from (`AsyncLayout::task_key`).
    pub(in crate::python) await_chains: FxHashMap<u64, AwaitEntry>,
    /// `<task>` frames by task name.
    pub(in crate::python) task_frames: FxHashMap<String, FrameRef>,
    /// `--async-aware all`: task names kept between passes.
    pub(in crate::python) task_names: NameCache,
}

impl AsyncState {
    /// Forgets the frame ids (a new profile started: the old ones are void).
    pub fn new_profile(&mut self) {
        self.task_frames.clear();
        self.await_chains.clear();
    }
}

impl PyProcess {
    /// Looks for asyncio's layout in the mapped files (3.11-3.13: takes it from the tables
    /// once the `_asyncio` extension is mapped or `Handle._run` was seen); true when it is
    /// newly found, or (3.11-3.13) `Handle._run` was seen since: the BPF config changed.
    pub(in crate::python) fn look_for_asyncio(&mut self, proc: &Process) -> bool {
        if self.asyncio.layout.is_some() {
            let news = self.asyncio.handle_run != 0 && self.config.handle_run_code == 0;
            self.async_config();
            return news;
        }
        self.asyncio.looked = Some(std::time::Instant::now());
        self.asyncio.looks = self.asyncio.looks.saturating_add(1);
        let legacy_seen = || {
            self.asyncio.handle_run != 0
                || proc.modules.iter().any(|m| {
                    m.path
                        .rsplit('/')
                        .next()
                        .is_some_and(|f| f.starts_with("_asyncio"))
                })
        };
        let found = match self.asyncio.handle_run_wanted {
            true if legacy_seen() => {
                AsyncLayout::legacy(&self.rt.layout, self.rt.str_type, self.rt.long_type)
            }
            true => None,
            false => AsyncLayout::find(
                proc,
                &self.rt.remote,
                &self.rt.layout,
                self.rt.str_type,
                self.rt.long_type,
            ),
        };
        let Some(a) = found else { return false };
        log::info!("pid {}: asyncio found", self.pid);
        self.asyncio.layout = Some(a);
        self.async_config();
        true
    }

    /// Sets what the BPF side reads of asyncio at a sample into `config` (again after the
    /// rest of it was taken anew: `PythonRegistry::refresh`).
    pub(in crate::python) fn async_config(&mut self) {
        let Some(a) = &self.asyncio.layout else {
            return;
        };
        let c = &mut self.config;
        if let Some(off) = a.tstate_running_task() {
            c.tstate_running_task = off as u32;
        } else if self.asyncio.handle_run != 0 {
            c.handle_run_code = self.asyncio.handle_run;
            c.frame_self = self.rt.layout.frame_localsplus;
            c.handle_callback = HANDLE_CALLBACK;
            c.step_task = STEP_TASK;
            c.frame_read_size = c.frame_read_size.max(c.frame_self + 8);
        }
    }

    /// The await chain of the running task `task`: checked once per epoch (one read of the
    /// task), read again when the task's own words changed.
    pub(in crate::python) fn await_chain(
        &mut self,
        task: u64,
        tid: u32,
        epoch: u64,
    ) -> Option<Arc<AwaitChain>> {
        let a = self.asyncio.layout.as_ref()?;
        if self.asyncio.await_chains.len() > 4096 {
            self.asyncio.await_chains.clear();
        }
        let entry = self.asyncio.await_chains.get_mut(&task);
        if let Some(e) = &entry {
            if e.epoch == epoch {
                return e.chain.clone();
            }
        }
        let key = a.task_key(&self.rt.remote, task);
        if let Some(e) = entry {
            if key.is_some() && e.key == key {
                e.epoch = epoch;
                return e.chain.clone();
            }
        }
        let chain = key
            .and_then(|_| a.await_chain(&self.rt.remote, &self.rt.layout, task))
            .map(Arc::new);
        if chain.is_some() && !a.lists_tasks() {
            // 3.11-3.13: which thread runs the task's loop (`all` mode's passes).
            if let Some(l) = self.rt.remote.u64(task + 16) {
                if self.asyncio.loop_threads.len() > 1024 {
                    self.asyncio.loop_threads.clear();
                }
                self.asyncio.loop_threads.insert(l, tid);
            }
            self.asyncio.seen_task = task;
        }
        self.asyncio.await_chains.insert(
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
    pub(in crate::python) fn task_prefix(
        &mut self,
        out: &mut impl ProfileSink,
        task: u64,
        c: &AwaitChain,
        epoch: u64,
    ) -> Arc<Vec<FrameRef>> {
        if let Some(p) = self
            .asyncio
            .await_chains
            .get(&task)
            .and_then(|e| e.prefix.clone())
        {
            return p;
        }
        let mut prefix = Vec::new();
        for t in c.tasks.iter().rev() {
            prefix.push(self.task_frame(out, &t.name));
            prefix.extend(self.chain_frames(out, &t.frames, epoch));
        }
        let prefix = Arc::new(prefix);
        if let Some(e) = self.asyncio.await_chains.get_mut(&task) {
            e.prefix = Some(prefix.clone());
        }
        prefix
    }

    /// 3.11-3.13 (`all`): the event loop each thread runs, from its `BaseEventLoop.run_forever`
    /// frame's `self`; and a task found among the first locals of the frames rootward of it
    /// (from which `_asyncio`'s set of tasks is found, before a sample has shown one running).
    /// Code objects named on the way are learnt as a sample's are (`Handle._run` among them).
    fn loops_of_threads(&mut self, epoch: u64) {
        let Some(a) = self.asyncio.layout.clone() else {
            return;
        };
        let c = self.config;
        let mut threads: Vec<(u32, u64)> =
            self.threads.states.iter().map(|(&t, &s)| (t, s)).collect();
        threads.sort_unstable();
        for (tid, tstate) in threads.into_iter().take(MAX_LOOP_THREADS) {
            let mut frame = self
                .rt
                .remote
                .u64(tstate + c.tstate_frame as u64)
                .unwrap_or(0);
            if c.cframe_frame != profiler_common::NO_OFFSET && frame != 0 {
                frame = self
                    .rt
                    .remote
                    .u64(frame + c.cframe_frame as u64)
                    .unwrap_or(0);
            }
            let len = self.rt.layout.frame_localsplus as usize + 8 * LOCALS_SCANNED;
            // Locals are looked at rootward of the loop (`run_until_complete` holds the main
            // task), not in every frame of every thread.
            let mut in_loop = false;
            let chain = FrameChain::new(&self.rt.remote, frame, c.frame_previous, len);
            for (_, buf) in chain {
                let code = le_u64(&buf, c.frame_code as usize).unwrap_or(0) & c.code_mask;
                let owner = buf.get(c.frame_owner as usize).copied().unwrap_or(0);
                let info = match self.rt.layout.is_shim(owner, code, self.rt.none_addr) {
                    true => None,
                    false => self.code(&[code], epoch).pop().flatten(),
                };
                let locals: Vec<u64> = buf[self.rt.layout.frame_localsplus as usize..]
                    .chunks_exact(8)
                    .filter_map(|w| le_u64(w, 0))
                    .collect();
                if info.is_some_and(|i| &*i.name == "BaseEventLoop.run_forever") {
                    if let Some(&l) = locals.first() {
                        self.asyncio.loop_threads.insert(l, tid);
                        in_loop = true;
                    }
                }
                if in_loop && self.asyncio.seen_task == 0 {
                    if let Some(&t) = locals.iter().find(|&&t| a.is_task_at(&self.rt.remote, t)) {
                        self.asyncio.seen_task = t;
                    }
                }
            }
        }
    }

    /// The `<task> NAME` frame of a task.
    fn task_frame(&mut self, out: &mut impl ProfileSink, name: &str) -> FrameRef {
        if self.asyncio.task_frames.len() > 100_000 {
            self.asyncio.task_frames.clear();
        }
        if let Some(&f) = self.asyncio.task_frames.get(name) {
            return f;
        }
        let f = out.task_frame(name);
        self.asyncio.task_frames.insert(name.to_string(), f);
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
                Some(ci) => self.cache.frame_for(&self.rt, out, code, &ci, instr, false),
                None => {
                    out.count(PyEvent::Unresolved);
                    out.unresolved_frame()
                }
            })
            .collect()
    }
}

impl PythonRegistry {
    /// Whether `pid` is a Python process whose asyncio is still to be found
    /// (`--async-aware`), and it is time to look again (its mappings are read for it).
    pub fn asyncio_due(&self, pid: u32) -> bool {
        self.opts.tasks.aware()
            && self.procs.get(&pid).is_some_and(|p| {
                if p.gone_fork.is_some() {
                    return false;
                }
                let every = if p.asyncio.looks < ASYNCIO_EARLY_LOOKS {
                    ASYNCIO_EARLY_RETRY
                } else {
                    ASYNCIO_RETRY
                };
                // 3.11-3.13: also once `Handle._run` has been seen, for the BPF side.
                let handle_news = p.asyncio.handle_run != 0 && p.config.handle_run_code == 0;
                let looks = p.asyncio.layout.is_none()
                    && (p.asyncio.handle_run_wanted || p.rt.layout.minor >= 14)
                    && p.asyncio.looked.is_none_or(|t| t.elapsed() >= every);
                looks || (p.asyncio.layout.is_some() && handle_news)
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
        let Some(p) = self.procs.get_mut(&pid).filter(|p| p.gone_fork.is_none()) else {
            return Vec::new();
        };
        let Some(a) = p.asyncio.layout.clone() else {
            return Vec::new();
        };
        // Each loop thread's tasks, and the task it runs now (where the thread state says).
        let mut per_thread: Vec<(u32, TaskBytes, u64)> = Vec::new();
        if a.lists_tasks() {
            let mut threads: Vec<(u32, u64)> =
                p.threads.states.iter().map(|(&t, &s)| (t, s)).collect();
            threads.sort_unstable();
            for (tid, tstate) in threads {
                let (tasks, list_cut) = a.thread_tasks(&p.rt.remote, tstate);
                if list_cut {
                    out.count(PyEvent::AsyncCut);
                }
                let running = a
                    .tstate_running_task()
                    .and_then(|off| p.rt.remote.u64(tstate + off))
                    .unwrap_or(0);
                per_thread.push((tid, tasks, running));
            }
        } else {
            // 3.11-3.13: every task of the process, by the thread its loop was seen running
            // in (a loop not seen running yet is left for a later pass); a running task's
            // coroutine is not suspended, so it shows no chain.
            // While no loop is known, on every pass: its tasks' time is lost until then (a walk
            // every 10 passes only lost a second of a 3 s test).
            if p.asyncio.loop_threads.is_empty() || p.asyncio.loop_passes >= LOOP_WALK_EVERY {
                p.asyncio.loop_passes = 0;
                p.asyncio.loop_threads.clear();
                p.loops_of_threads(epoch);
            }
            p.asyncio.loop_passes += 1;
            if let Some(proc) = proc.filter(|_| p.asyncio.task_set == 0 && p.asyncio.seen_task != 0)
            {
                p.asyncio.task_set = a
                    .find_task_set(&p.rt.remote, proc, p.rt.layout.minor, p.asyncio.seen_task)
                    .unwrap_or(0);
            }
            if p.asyncio.task_set == 0 {
                return Vec::new();
            }
            let (tasks, cut) = a.set_tasks(&p.rt.remote, p.asyncio.task_set);
            if cut {
                out.count(PyEvent::AsyncCut);
            }
            let mut by_thread: std::collections::BTreeMap<u32, Vec<(u64, Vec<u8>)>> =
                Default::default();
            for (t, b) in tasks {
                let tid = AsyncLayout::task_loop(&b)
                    .and_then(|l| p.asyncio.loop_threads.get(&l).copied());
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
            let chains = a.suspended(
                &p.rt.remote,
                &p.rt.layout,
                &tasks,
                running,
                &mut p.asyncio.task_names,
            );
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
}
