//! The registry of Python processes: which processes are Python (and which were found not
//! to be), their configuration for the BPF side, and the validation epochs of their code.

use std::collections::{HashMap, HashSet};

use profiler_common::PyProcConfig;

use super::discover::{PyProcess, Runtime};
use super::{plausible_object, NotPython};
use crate::process::remote::Remote;
use crate::process::{procfs, Process};

/// What the registry shows of Python, from the command line.
#[derive(Clone, Copy, Debug, Default)]
pub struct PythonOptions {
    /// Keep the interpreter's own frames (`--show-internal`).
    pub show_internal: bool,
    /// Name the instruction of each sample's innermost Python frame (`--opcodes`).
    pub opcodes: bool,
    /// What asyncio's tasks show (`--async-aware`).
    pub tasks: AsyncTasks,
}

/// What `--async-aware` asks of asyncio's tasks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AsyncTasks {
    /// Event loops' samples are their threads' stacks, as of any thread.
    #[default]
    Off,
    /// Event loops' samples show their running task's await chain (`--async-aware`).
    Running,
    /// And every suspended task is sampled at each pass (`--async-aware all`).
    All,
}

impl AsyncTasks {
    /// Whether running tasks' await chains are shown.
    pub fn aware(self) -> bool {
        self != AsyncTasks::Off
    }

    /// Whether suspended tasks are sampled.
    pub fn all(self) -> bool {
        self == AsyncTasks::All
    }
}

/// A process with no runtime is looked at this many times, this far apart, before it is
/// taken to be something else (its libraries may still be loading).
const NO_RUNTIME_ATTEMPTS: u32 = 20;
const NO_RUNTIME_RETRY: std::time::Duration = std::time::Duration::from_millis(50);

/// Everything the profiler knows about Python processes.
#[derive(Default)]
pub struct PythonRegistry {
    pub(super) procs: HashMap<u32, PyProcess>,
    /// Processes found not to be Python, by pid: the process as it was then (`process_key`: a
    /// reused pid or an exec is looked at again), attempts so far and when the last one was; a
    /// process that is still loading its libraries is looked at again a few times. By pid
    /// first, so that asking about a process never looked at reads nothing.
    not_python: HashMap<u32, ((u64, String), u32, std::time::Instant)>,
    reported: HashSet<u32>,
    pub(super) opts: PythonOptions,
    /// Code objects are validated once per epoch: one batch of records read from the ring.
    pub(super) epoch: u64,
    /// Code objects read since the BPF side was last told (`take_known_codes`), as
    /// `profiler_common::known_code_word`s.
    pub(super) known: Vec<u64>,
    /// The last thread `read_ahead` walked: the next call goes on after it.
    ahead: (u32, u32),
}

/// The process `pid` is now: its start time and executable.
fn process_key(pid: u32) -> (u64, String) {
    let exe = procfs::exe(pid)
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    (procfs::start_time(pid).unwrap_or(0), exe)
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
                std::mem::take(&mut p.cache.gone)
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

    /// What it was made with.
    pub fn options(&self) -> PythonOptions {
        self.opts
    }

    pub fn new(opts: PythonOptions) -> PythonRegistry {
        PythonRegistry {
            opts,
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
                if self.opts.tasks.aware() && p.rt.layout.minor >= 14 {
                    p.look_for_asyncio(proc);
                } else if self.opts.tasks.aware() && p.rt.layout.minor >= 11 {
                    p.asyncio.handle_run_wanted = true;
                } else if self.opts.tasks.aware() {
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
            Err(NotPython::Unsupported(what)) if young => {
                // Just exec'd: the dynamic loader may be mapping libpython's segments one by
                // one, and a look between two reads the runtime's data at the wrong offset (a
                // 3.13 runtime then seems to have no debug offsets). Looked at again, as a
                // missing runtime is, until it is no longer young.
                log::debug!("pid {}: {what} (young process, looked at again)", proc.pid);
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

    /// A child of Python process `parent` forked moments ago, already gone when its first
    /// sample with Python frames was read (a pool's worker that ran a short task): its memory
    /// was its parent's at the fork, and the frame walk copied the head of each code object it
    /// ran (none is known in the child), so its frames are named from those copies, checked
    /// against the parent's memory (`sampled_code`). Code the child made after the fork is
    /// named only from what was copied of it. Returns whether it was added.
    pub fn add_gone_fork(&mut self, parent: u32, child: u32) -> bool {
        if self.procs.contains_key(&child) {
            return false;
        }
        let Some(p) = self.procs.get(&parent).filter(|p| p.gone_fork.is_none()) else {
            return false;
        };
        let copy = PyProcess {
            pid: child,
            label: p.label.clone(),
            program: p.program.clone(),
            version: p.version.clone(),
            rt: p.rt.clone(),
            config: p.config,
            ready: p.ready,
            cache: Default::default(),
            threads: Default::default(),
            asyncio: Default::default(),
            gone_fork: Some(Box::new(Runtime {
                remote: Remote { pid: child },
                ..p.rt.clone()
            })),
        };
        log::debug!("pid {child}: gone before it was read, named from its parent {parent}");
        self.procs.insert(child, copy);
        true
    }

    /// Forgets the not-Python verdicts of processes that are gone.
    pub fn sweep(&mut self, gone: &mut impl FnMut(u32) -> bool) {
        self.not_python.retain(|&pid, _| !gone(pid));
        self.reported.retain(|&pid| !gone(pid));
    }

    /// A new profile started (continuous runs): function and frame ids of the old one are void.
    pub fn new_profile(&mut self) {
        for p in self.procs.values_mut() {
            p.cache.new_profile();
            p.asyncio.new_profile();
        }
    }

    /// Forgets a process (gone, or exec'd into another program); returns the threads the BPF
    /// side knew of it.
    pub fn forget(&mut self, pid: u32) -> Vec<u32> {
        self.procs
            .remove(&pid)
            .map(|p| p.threads.states.into_keys().collect())
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

    /// The known Python processes.
    pub fn pids(&self) -> Vec<u32> {
        self.procs.keys().copied().collect()
    }

    /// The process's label and Python version, if it is a Python process.
    pub fn labels(&self, pid: u32) -> Option<(&str, &str)> {
        self.procs
            .get(&pid)
            .map(|p| (p.label.as_str(), p.version.as_str()))
    }

    /// What process `pid` runs (`PyProcess::program`), if it is a known Python process.
    pub fn program(&self, pid: u32) -> Option<&str> {
        self.procs.get(&pid).map(|p| p.program.as_str())
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
            .flat_map(|(&pid, p)| p.threads.states.keys().map(move |&tid| (pid, tid)))
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
                    !p.rt.layout.is_shim(f.flags as u8, f.code, p.rt.none_addr)
                        && plausible_object(f.code)
                        && !p.cache.codes.contains_key(&f.code)
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
}
