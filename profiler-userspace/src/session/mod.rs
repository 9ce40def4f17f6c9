//! A profiling session: what it profiles (its scope), how Python processes are found and the BPF
//! side's view of them kept current, and how records read from the ring reach the collector.
//!
//! Owns the policy of a run (how often every process is scanned, when thread maps are re-read,
//! when dead processes are swept). The event loop (the binary's `run.rs`) only says when a
//! tick or a drain happens, and hands finished profiles to its sinks.
//!
//! May import `capture` (the records and the `Targets` seam, which `Capture` implements),
//! `collect`, `process` and `python`. Never `output` or `top`: where samples go is the sinks'
//! business.

use std::time::{Duration, Instant};

use profiler_common::PyProcConfig;

use crate::capture::record::{Record, RecordError};
use crate::capture::ring::RecordSource;
use crate::capture::{Capture, CaptureError};
use crate::collect::Collector;
use crate::process::procfs;

/// What a session tells the BPF side about its targets: the seam between the session's policy
/// and the kernel, so the policy is tested without loading programs.
pub trait Targets {
    /// Samples `pid` (all its threads).
    fn add_target(&mut self, pid: u32) -> Result<(), CaptureError>;
    fn set_py_proc(&mut self, pid: u32, cfg: &PyProcConfig) -> Result<(), CaptureError>;
    fn remove_py_proc(&mut self, pid: u32);
    fn set_py_thread(&mut self, pid: u32, tid: u32, tstate: u64) -> Result<(), CaptureError>;
    fn remove_py_thread(&mut self, pid: u32, tid: u32);
    /// Where a thread's stack mapping ends: its copies step over untouched pages below that.
    fn set_stack_top(&mut self, pid: u32, tid: u32, top: u64) -> Result<(), CaptureError>;
    /// Code objects user space has read (`profiler_common::known_code_word`s): the frame walk
    /// stops copying their heads.
    fn set_known_codes(&mut self, _words: &[u64]) {}
    /// Code objects found freed or replaced (`known_code_word`s): the frame walk copies what
    /// runs at their addresses again.
    fn forget_known_codes(&mut self, _words: &[u64]) {}
    /// What the scheduler program holds and has not sent yet, by `thread_key`.
    fn sched_snapshot(&self) -> Vec<(u64, profiler_common::ThreadSched)> {
        Vec::new()
    }
}

impl Targets for Capture {
    fn add_target(&mut self, pid: u32) -> Result<(), CaptureError> {
        Capture::add_target(self, pid)
    }
    fn set_py_proc(&mut self, pid: u32, cfg: &PyProcConfig) -> Result<(), CaptureError> {
        Capture::set_py_proc(self, pid, cfg)
    }
    fn remove_py_proc(&mut self, pid: u32) {
        Capture::remove_py_proc(self, pid)
    }
    fn set_py_thread(&mut self, pid: u32, tid: u32, tstate: u64) -> Result<(), CaptureError> {
        Capture::set_py_thread(self, pid, tid, tstate)
    }
    fn remove_py_thread(&mut self, pid: u32, tid: u32) {
        Capture::remove_py_thread(self, pid, tid)
    }
    fn set_stack_top(&mut self, pid: u32, tid: u32, top: u64) -> Result<(), CaptureError> {
        Capture::set_stack_top(self, pid, tid, top)
    }
    fn set_known_codes(&mut self, words: &[u64]) {
        Capture::set_known_codes(self, words)
    }
    fn forget_known_codes(&mut self, words: &[u64]) {
        Capture::forget_known_codes(self, words)
    }
    fn sched_snapshot(&self) -> Vec<(u64, profiler_common::ThreadSched)> {
        Capture::sched_snapshot(self)
    }
}

/// What the session profiles.
#[derive(Clone, Debug, Default)]
pub struct Scope {
    /// Every process (`--all`).
    pub all: bool,
    /// Every Python process (`--all-pythons`).
    pub all_pythons: bool,
    /// Children of explicit targets become explicit targets (`--subprocesses`).
    pub subprocesses: bool,
    /// `--pid` targets and the launched command.
    pub explicit: Vec<u32>,
}

/// The session's clock: one tick every `TICK` at the highest rates, and every `tick_for(rate)`.
pub const TICK: Duration = Duration::from_millis(20);
/// The longest tick, at the lowest rates.
const LONGEST_TICK: Duration = Duration::from_millis(100);

/// How often the session ticks at `rate_hz`: about every 5 sampling periods, between `TICK` and
/// `LONGEST_TICK`. Each tick wakes the reader (a timer, the runtime's turn, the drain and the
/// bookkeeping: about 100 µs of CPU even with nothing to read), and at the always-on rate
/// (49 Hz) 50 ticks a second cost more than all the samples of an idle host. The records that
/// must be read at once (a Python program's exec, a Python process's fork, a ring a quarter
/// full) wake the reader themselves, so a longer tick only batches samples.
pub fn tick_for(rate_hz: u64) -> Duration {
    (Duration::from_secs(5) / rate_hz.clamp(1, u32::MAX as u64) as u32).clamp(TICK, LONGEST_TICK)
}
/// `--async-aware all`: the mean spacing of passes over the suspended tasks, and how many
/// times a pass's own duration they are at least apart.
const TASK_PASS: Duration = Duration::from_millis(100);
const TASK_PASS_SHARE: u32 = 20;
/// While a process that has just started (launched, exec'd or forked) is not yet found to be
/// Python, or known not to be, it is looked at this often: Python's startup imports run
/// within its first few ms, and every sample taken before its runtime is known has native
/// frames only.
pub const YOUNG_TICK: Duration = Duration::from_millis(1);
/// How long a process counts as just started.
const YOUNG: Duration = Duration::from_secs(1);
/// Every process is scanned once a second: new programs are found through exec
/// events and new processes of Python programs through fork events; the scan is the safety net
/// (reading every process's files each time is most of an idle profiler's own CPU use).
const SCAN_EVERY: Duration = Duration::from_secs(1);
/// Python thread maps are re-read every 100 ms (or every tick, if longer).
const THREADS_EVERY: Duration = Duration::from_millis(100);
/// Dead processes are forgotten every 5 s.
const SWEEP_EVERY: Duration = Duration::from_secs(5);
/// New processes watched at most (a fork storm waits for the periodic scan). A process that is
/// not Python costs only its few looks (`Pending::due`), so this can cover a host that starts
/// hundreds of programs a second.
const MAX_PENDING: usize = 1024;
/// A process watched for 2 s is left to the periodic scan.
const PENDING_FOR: Duration = Duration::from_secs(2);
/// The first gap between two looks at a watched process that is not named like a Python
/// interpreter; each gap doubles (looks at about 0, 10, 30, 70, 150, 310, 630 and 1270 ms).
/// Such a program becomes Python only by mapping libpython: its dynamic loader does that before
/// the program's first instruction, or the program loads it later. Every look reads the
/// process's whole mappings, and most programs a host starts are not Python (shell commands,
/// health checks): looking at each one on every tick for 2 s was the profiler's main cost on
/// such a host.
const FIRST_GAP: Duration = Duration::from_millis(10);

/// A process that has just started (exec'd or forked during an --all/--all-pythons run, or the
/// launched command), watched until it is found to be Python, known not to be, gone, or
/// `PENDING_FOR` old.
#[derive(Clone, Copy, Debug)]
struct Pending {
    pid: u32,
    since: Instant,
    /// Looked at every `YOUNG_TICK` while young (see `awaiting_young`): named like a Python
    /// interpreter, or the launched command.
    fast: bool,
    /// When it is looked at next (not `fast`: see `FIRST_GAP`).
    next: Instant,
    gap: Duration,
    /// Looked at on its first sample with Python frames (see `Session::adopt`).
    adopted: bool,
    /// The process that forked it, for a fork.
    parent: Option<u32>,
}

impl Pending {
    fn new(pid: u32, fast: bool) -> Pending {
        let now = Instant::now();
        Pending {
            pid,
            since: now,
            fast,
            next: now,
            gap: FIRST_GAP,
            adopted: false,
            parent: None,
        }
    }

    fn young(&self) -> bool {
        self.since.elapsed() < YOUNG
    }

    /// Whether it is to be looked at now; if so, when next.
    fn due(&mut self, now: Instant) -> bool {
        if self.fast && self.young() {
            return true;
        }
        if now < self.next {
            return false;
        }
        self.next = now + self.gap;
        self.gap *= 2;
        true
    }
}
/// A process the scan found not to be Python is looked at again every this many scans (30 s),
/// not on every one: a program changes by exec (which the BPF side reports at once) and rarely
/// loads Python later (an application embedding it). So the scan's cost follows the processes
/// that are new, not every idle process on the host.
const RECHECK_SCANS: u64 = 30;
/// Records per code-object validation epoch: about 100 ms of samples at 1 kHz on 2 CPUs.
const EPOCH_RECORDS: u32 = 256;
/// The longest a validation epoch lasts, whatever the rate: at a low rate (49 Hz, always on)
/// the reader drains a few records at a time, and an epoch per drain had each sample's code
/// objects read again (a quarter of the profiler's CPU on a threaded service); an epoch of the
/// same length at every rate validates the code the threads share once.
const EPOCH_SPAN: Duration = Duration::from_millis(100);
/// The longest one drain reads for. A ring that refills as fast as it is read (an overload)
/// would otherwise hold the reader in one drain for good: `-d`, Ctrl-C and the ticks' work
/// would never come.
const DRAIN_BUDGET: Duration = Duration::from_millis(100);
/// Records between two looks at the clock during a drain: few enough that a reader starved of
/// CPU (a host saturated by busy threads) still ends its drain near `DRAIN_BUDGET`.
const BUDGET_RECORDS: u32 = 32;

pub struct Session<T: Targets> {
    targets: T,
    collector: Collector,
    scope: Scope,
    /// Processes that exec'd or forked during an --all/--all-pythons run, and the launched
    /// command, looked at often for a while.
    pending: Vec<Pending>,
    /// Looks at watched processes so far (each reads the process's mappings).
    looks: u64,
    /// Processes the scan found not to be Python, with the scan that looked.
    not_python: std::collections::HashMap<u32, u64>,
    scans: u64,
    ticks: u64,
    /// How long a tick is (`tick_for`).
    tick: Duration,
    /// `--async-aware all`: when the next pass over the suspended tasks is due, and the state
    /// of the generator that spaces them.
    task_pass_at: Instant,
    task_rng: u64,
    /// When a drain last found no record waiting.
    emptied: Option<Instant>,
    /// When `read_ahead` last ran.
    read_ahead_at: Instant,
    /// When the current validation epoch began.
    epoch_at: Instant,
    /// Processes found dead, and since when: what is known of one is kept until no record of
    /// its can be waiting (`gone`).
    dead: std::collections::HashMap<u32, Instant>,
}

/// While a drain goes on for longer than `READ_AHEAD_EVERY` (the reader is behind), the code
/// that threads run now is read from outside that often (`PythonRegistry::read_ahead`), for
/// `READ_AHEAD_THREADS` threads at a time (a few hundred small reads at most); the clock is
/// looked at every `READ_AHEAD_RECORDS` records.
const READ_AHEAD_EVERY: Duration = Duration::from_millis(50);
const READ_AHEAD_THREADS: usize = 16;
const READ_AHEAD_RECORDS: u32 = 16;

/// How long what is known of a dead process is kept at most while its records may still be
/// waiting (a reader that never catches up).
const DEAD_KEPT: Duration = Duration::from_secs(30);

/// Whether a process (or thread) `pid` exists: signal 0 tests for it without a path lookup in
/// /proc (ten times the cost, paid for every program a host starts while it is watched).
fn alive(pid: u32) -> bool {
    let Ok(pid) = i32::try_from(pid) else {
        return false;
    };
    // 0 would mean this process group. EPERM: it exists (root is not refused; a capability-
    // limited profiler may be).
    pid > 0
        && !matches!(
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None),
            Err(nix::errno::Errno::ESRCH)
        )
}

/// Whether `pid` is gone, and no record of its can still be waiting to be read: it was found
/// dead (now or before, as `dead` notes) before a drain that `emptied` the ring, or long ago.
/// Its last records, read late by a reader behind, need what is known of it.
fn gone(
    dead: &mut std::collections::HashMap<u32, Instant>,
    emptied: Option<Instant>,
    pid: u32,
) -> bool {
    if alive(pid) {
        return false;
    }
    let since = *dead.entry(pid).or_insert_with(Instant::now);
    emptied.is_some_and(|e| e > since) || since.elapsed() >= DEAD_KEPT
}

/// Whether `pid` has exited: gone, or a zombie its parent has not reaped yet.
fn exited(pid: u32) -> bool {
    procfs::stat(pid).is_none_or(|s| s.exited())
}

impl<T: Targets> Session<T> {
    /// A session over `scope`, with every Python process it already covers found and installed.
    pub fn new(targets: T, collector: Collector, scope: Scope) -> Session<T> {
        let mut s = Session {
            targets,
            collector,
            scope,
            pending: Vec::new(),
            looks: 0,
            not_python: std::collections::HashMap::new(),
            scans: 0,
            ticks: 0,
            tick: TICK,
            task_pass_at: Instant::now(),
            task_rng: 0x9e37_79b9_7f4a_7c15,
            emptied: None,
            read_ahead_at: Instant::now(),
            epoch_at: Instant::now(),
            dead: std::collections::HashMap::new(),
        };
        s.discover(true, true);
        s
    }

    /// The kernel side the session drives (the BPF programs and maps).
    pub fn targets(&self) -> &T {
        &self.targets
    }

    pub fn targets_mut(&mut self) -> &mut T {
        &mut self.targets
    }

    /// The profile being written.
    pub fn profile(&self) -> &crate::aggregate::Profile {
        &self.collector.profile
    }

    /// Where kernel symbols were read again during the run (an address in kernel code made
    /// since boot), if they were.
    pub fn kernel_reread_at(&self) -> Option<u64> {
        self.collector.kernel_reread_at
    }

    /// Ticks every `tick` from now on (`tick_for` the run's rate).
    pub fn set_tick(&mut self, tick: Duration) {
        self.tick = tick.max(Duration::from_millis(1));
    }

    /// How long a tick is.
    pub fn tick_length(&self) -> Duration {
        self.tick
    }

    /// How many ticks make `every` (at least one).
    pub fn ticks_in(&self, every: Duration) -> u64 {
        (every.as_nanos() / self.tick.as_nanos()).max(1) as u64
    }

    pub fn scope(&self) -> &Scope {
        &self.scope
    }

    /// Whether the run names its processes (`--pid`, not --all/--all-pythons) and every one of
    /// them has exited.
    pub fn targets_gone(&self) -> bool {
        let s = &self.scope;
        !s.all && !s.all_pythons && !s.explicit.is_empty() && s.explicit.iter().all(|&p| exited(p))
    }

    /// One tick of the session's clock (every `tick_length`): records, new processes, thread maps,
    /// and now and then the sweep of dead processes.
    pub fn tick(&mut self, source: &mut impl RecordSource) {
        self.ticks += 1;
        // Records do not wake the reader until the buffer fills up a good part: poll.
        self.drain(source);
        self.discover(
            self.ticks.is_multiple_of(self.ticks_in(SCAN_EVERY)),
            self.ticks.is_multiple_of(self.ticks_in(THREADS_EVERY)),
        );
        if self.collector.python.options().tasks.all() && Instant::now() >= self.task_pass_at {
            self.pass_over_tasks();
        }
        if self.ticks.is_multiple_of(self.ticks_in(SWEEP_EVERY)) {
            let (mut dead, emptied) = (std::mem::take(&mut self.dead), self.emptied);
            self.collector
                .sweep(&mut |pid| gone(&mut dead, emptied, pid));
            // Those forgotten everywhere now, and those alive again (a pid reused), are dropped.
            dead.retain(|&pid, &mut since| {
                !alive(pid) && emptied.is_none_or(|e| e <= since) && since.elapsed() < DEAD_KEPT
            });
            self.dead = dead;
        }
    }

    /// `--async-aware all`: one pass over every suspended task, and when the next is due. Passes
    /// are spaced at random around `TASK_PASS` (so they cannot keep step with a program's own
    /// period), and further apart when a pass takes long (thousands of tasks): a pass costs at
    /// most about 1/`TASK_PASS_SHARE` of a CPU. Each pass's samples weigh the time since the
    /// previous one, so the totals stay right whatever the spacing.
    fn pass_over_tasks(&mut self) {
        let start = Instant::now();
        self.collector.sample_tasks(crate::process::monotonic_ns());
        let took = start.elapsed();
        // xorshift64: a jitter of 0.5 to 1.5 times the spacing.
        self.task_rng ^= self.task_rng << 13;
        self.task_rng ^= self.task_rng >> 7;
        self.task_rng ^= self.task_rng << 17;
        let jitter = 0.5 + (self.task_rng >> 11) as f64 / (1u64 << 53) as f64;
        let spacing = TASK_PASS.max(took * TASK_PASS_SHARE);
        self.task_pass_at = start + spacing.mul_f64(jitter);
    }

    /// Hands the waiting records to the collector, for `DRAIN_BUDGET` at most, then acts on
    /// the execs and forks among them. Returns the number of records read.
    pub fn drain(&mut self, source: &mut impl RecordSource) -> u32 {
        self.drain_until(source, Some(Instant::now() + DRAIN_BUDGET))
    }

    /// Hands every waiting record to the collector: at the end of a run, when the programs are
    /// detached and nothing refills the ring.
    pub fn drain_all(&mut self, source: &mut impl RecordSource) -> u32 {
        self.drain_until(source, None)
    }

    fn new_epoch(&mut self, now: Instant) {
        self.collector.python.new_epoch();
        self.epoch_at = now;
    }

    fn drain_until(&mut self, source: &mut impl RecordSource, until: Option<Instant>) -> u32 {
        let mut n = 0u32;
        let start = Instant::now();
        if start - self.epoch_at >= EPOCH_SPAN || until.is_none() {
            self.new_epoch(start);
        }
        let mut emptied = true;
        // Each record is handled where it lies in the ring (its stack is not copied out).
        while source
            .next_record(|bytes| self.handle(Record::parse(bytes)))
            .is_some()
        {
            n += 1;
            // A drain that goes on is behind: the code threads run now is read while they run.
            if n.is_multiple_of(READ_AHEAD_RECORDS) {
                let now = Instant::now();
                if now - start >= READ_AHEAD_EVERY && now - self.read_ahead_at >= READ_AHEAD_EVERY {
                    self.collector.python.read_ahead(READ_AHEAD_THREADS);
                    self.read_ahead_at = now;
                }
            }
            if n.is_multiple_of(EPOCH_RECORDS) {
                self.new_epoch(Instant::now());
            }
            if n.is_multiple_of(BUDGET_RECORDS) && until.is_some_and(|t| Instant::now() >= t) {
                emptied = false;
                break;
            }
        }
        if emptied {
            self.emptied = Some(Instant::now());
        }

        let gone = self.collector.python.take_forgotten_codes();
        if !gone.is_empty() {
            self.targets.forget_known_codes(&gone);
        }
        let known = self.collector.python.take_known_codes();
        if !known.is_empty() {
            self.targets.set_known_codes(&known);
        }
        self.follow_lifetimes();
        n
    }

    fn handle(&mut self, record: Result<Record<'_>, RecordError>) {
        match record {
            Ok(Record::Sample(s)) => {
                if s.flags & profiler_common::SAMPLE_PY_THREAD != 0
                    && !self.collector.python.contains(s.pid)
                {
                    self.adopt(s.pid);
                }
                self.collector.handle(s)
            }
            Ok(Record::Sched(r)) => self.collector.handle_sched(&r),
            Ok(Record::ExitSched(r)) => self.collector.handle_exit_sched(&r),
            Ok(Record::Event(e)) => {
                self.collector.handle_event(e);
                // At once: the records after it may be the new process's (`adopt`).
                self.follow_lifetimes();
            }
            Err(e) => {
                log::debug!("bad record: {e}");
                self.collector.bad_record();
            }
        }
    }

    /// Charges what the scheduler program holds and has not sent (each thread's open span and
    /// the interval in progress) to the profile, up to `now_ns`: at the end of a run (after the
    /// programs are detached and the ring drained) and of a continuous interval. Parts of records
    /// sent later that fall before `now_ns` are then dropped, so nothing counts twice.
    pub fn settle_sched(&mut self, now_ns: u64) {
        let snapshot = self.targets.sched_snapshot();
        self.collector.settle_sched(&snapshot, now_ns);
    }

    /// Closes the profile of a continuous run's interval at `now_ns` and starts the next: the
    /// ring read, the scheduler's accounting settled, the suspended tasks' time
    /// (`--async-aware all`) sampled to the end. Returns the closed profile.
    pub fn rotate(
        &mut self,
        source: &mut impl RecordSource,
        now_ns: u64,
    ) -> crate::aggregate::Profile {
        self.drain(source);
        self.settle_sched(now_ns);
        self.collector.sample_tasks(now_ns);
        self.collector.rotate(now_ns)
    }

    /// Closes the run's profile at `now_ns`, once the programs are detached: the ring read to
    /// its end, the scheduler's accounting settled, the suspended tasks' time sampled, and
    /// before it is finished, `read_blocked` (`dump`: the threads of a process read from its
    /// memory) given its say. Returns the profile.
    pub fn finish(
        &mut self,
        source: &mut impl RecordSource,
        now_ns: u64,
        read_blocked: impl FnOnce(&mut Collector),
    ) -> &crate::aggregate::Profile {
        self.drain_all(source);
        log::debug!("session: ring drained");
        self.settle_sched(now_ns);
        self.collector.sample_tasks(now_ns);
        read_blocked(&mut self.collector);
        self.collector.finish(now_ns);
        &self.collector.profile
    }

    /// Whether a process that has just started is still waiting to be found (see `YOUNG_TICK`):
    /// the launched command, and a process that exec'd a Python interpreter. Not forks: a fork
    /// of a Python process is found whole at once, and one of anything else is not Python.
    pub fn awaiting_young(&self) -> bool {
        let python = &self.collector.python;
        let waiting = |pid: u32| {
            (!python.contains(pid) || python.starting(pid))
                && !python.known_not_python(pid)
                && alive(pid)
        };
        self.pending
            .iter()
            .any(|p| p.fast && p.young() && waiting(p.pid))
    }

    /// A process started now (the launched command, released to exec): looked at at once
    /// when it is `held` at its entry point (its libraries are mapped, and none of its code has
    /// run), then every `YOUNG_TICK` until found.
    pub fn started(&mut self, pid: u32, held: bool) {
        // Again after a wrapper's exec: young from now.
        self.watch(Pending::new(pid, true), true);
        self.collector.launched = Some(pid);
        if held {
            self.discover_among(false, false, true);
        }
    }

    /// Whether `pid` is a Python process the BPF side knows.
    pub fn is_python(&self, pid: u32) -> bool {
        self.collector.python.contains(pid)
    }

    /// Looks at the processes that have just started, then reads the records waiting (exec
    /// and fork events add to them): between two ticks, while `awaiting_young`.
    pub fn tick_young(&mut self, source: &mut impl RecordSource) {
        // Found first: the records of a new process are the slowest to handle (its libraries'
        // unwind tables and symbols are loaded), and those taken after it is found carry
        // Python frames.
        self.discover_among(false, false, true);
        self.drain(source);
    }

    /// A process that exec'd loses its Python state (the BPF side must not walk the old
    /// program's layout) and is looked at again; with --subprocesses, children become explicit
    /// targets; with --all/--all-pythons, forked children (a Python server's workers are Python
    /// without an exec) are looked at soon.
    fn follow_lifetimes(&mut self) {
        for (pid, tid, top) in self.collector.take_stack_tops() {
            let _ = self.targets.set_stack_top(pid, tid, top);
        }
        let (execs, children) = self.collector.take_lifetimes();
        let everything = self.scope.all_pythons || self.scope.all;
        for (pid, python_name) in execs {
            self.forget_python(pid);
            self.not_python.remove(&pid);
            if everything && !self.scope.explicit.contains(&pid) {
                self.watch(Pending::new(pid, python_name), false);
            }
        }
        for (pid, parent) in children {
            let follow = self.scope.subprocesses && !self.scope.explicit.contains(&pid);
            if follow {
                self.scope.explicit.push(pid);
            }
            // A followed child is looked at on every tick as an explicit target; watched too,
            // to be named at its first sample with Python frames (`adopt`).
            if follow || everything {
                self.watch(
                    Pending {
                        parent: Some(parent),
                        ..Pending::new(pid, false)
                    },
                    false,
                );
            }
        }
    }

    /// A sample with Python frames of a process user space has not found yet: a process forked
    /// by a Python process, which the BPF side walks as its parent from its start (see
    /// `Config::follow_python_forks`). It is looked at now, once, so that this sample and the
    /// next are named (a pool's worker may be gone before the next tick). Only on such a sample:
    /// a fork that execs at once (a subprocess) costs nothing. One that is gone already is
    /// named from its parent (`Collector::add_gone_fork`).
    fn adopt(&mut self, pid: u32) {
        let Some(p) = self.pending.iter_mut().find(|p| p.pid == pid && !p.adopted) else {
            return;
        };
        p.adopted = true;
        let parent = p.parent;
        self.looks += 1;
        let found = self.collector.try_python(pid, true);
        if found.is_none() {
            // Its mappings read empty or not at all: it has exited.
            if let Some(parent) = parent {
                self.collector.add_gone_fork(parent, pid);
            }
        }
        if let Some(cfg) = found {
            if let Err(e) = self.targets.set_py_proc(pid, &cfg) {
                log::warn!("pid {pid}: {e}");
            }
            if self.scope.all_pythons {
                let _ = self.targets.add_target(pid);
            }
            log::debug!("pid {pid}: found at its first Python sample");
        }
    }

    /// Watches a process that has just started (anew after another exec): up to `MAX_PENDING`,
    /// or `always` (the launched command).
    fn watch(&mut self, p: Pending, always: bool) {
        match self.pending.iter().position(|q| q.pid == p.pid) {
            Some(i) => self.pending[i] = p,
            None if always || self.pending.len() < MAX_PENDING => self.pending.push(p),
            None => {}
        }
    }

    fn forget_python(&mut self, pid: u32) {
        let known = self.collector.python.contains(pid);
        for tid in self.collector.python.forget(pid) {
            self.targets.remove_py_thread(pid, tid);
        }
        if known {
            self.targets.remove_py_proc(pid);
        }
    }

    /// Finds new Python processes (explicit and pending ones every call; with `scan`, every
    /// process for --all/--all-pythons), and with `refresh_threads` keeps each Python process's
    /// thread map in the BPF program current (new processes' maps are installed at once).
    fn discover(&mut self, scan: bool, refresh_threads: bool) {
        self.discover_among(scan, refresh_threads, false);
    }

    /// `discover`, over the processes `awaiting_young` watches only when `young_only`: the
    /// every-millisecond look reads the mappings of those alone.
    fn discover_among(&mut self, scan: bool, refresh_threads: bool, young_only: bool) {
        let candidates = self.candidates(scan, young_only);
        let found: Vec<u32> = candidates
            .into_iter()
            .filter(|&(pid, scanned)| self.look_at(pid, scanned, scan))
            .map(|(pid, _)| pid)
            .collect();
        let pids = if refresh_threads {
            self.collector.python.pids()
        } else {
            found.clone()
        };
        self.sync_threads(pids, &found);
    }

    /// The processes to look at now, each with whether the scan of `/proc` listed it: the
    /// explicit targets (unless `young_only`), the pending processes that are due, and with
    /// `scan` under `--all` or `--all-pythons` every process not recently found not to be
    /// Python.
    fn candidates(&mut self, scan: bool, young_only: bool) -> Vec<(u32, bool)> {
        let me = std::process::id();
        let python = &self.collector.python;
        // Pending processes stay until found, known not to be Python, gone, or `PENDING_FOR` old
        // (the periodic scan looks at them from then on). Each is looked at when due only (see
        // `Pending::due`): between its looks it costs nothing, not even a read of its files.
        let mut candidates: Vec<(u32, bool)> = if young_only {
            Vec::new()
        } else {
            self.scope.explicit.iter().map(|&p| (p, false)).collect()
        };
        let now = Instant::now();
        let explicit = &self.scope.explicit;
        let mut looks = 0;
        self.pending.retain_mut(|p| {
            if p.since.elapsed() >= PENDING_FOR
                || (python.contains(p.pid) && !python.starting(p.pid))
            {
                return false;
            }
            let elsewhere = if young_only {
                !(p.fast && p.young())
            } else {
                explicit.contains(&p.pid)
            };
            if elsewhere || !p.due(now) {
                return true;
            }
            if !alive(p.pid) || python.finally_not_python(p.pid) {
                return false;
            }
            candidates.push((p.pid, false));
            looks += 1;
            true
        });
        self.looks += looks;
        if scan && (self.scope.all || self.scope.all_pythons) {
            self.scans += 1;
            let pids = procfs::pids();
            let listed: std::collections::HashSet<u32> = pids.iter().copied().collect();
            self.not_python.retain(|p, _| listed.contains(p));
            let scans = self.scans;
            let not_python = &self.not_python;
            candidates.extend(
                pids.into_iter()
                    .filter(|&p| p != me)
                    .filter(|p| {
                        not_python
                            .get(p)
                            .is_none_or(|&s| scans - s >= RECHECK_SCANS)
                    })
                    .map(|p| (p, true)),
            );
        }
        candidates
    }

    /// Looks at process `pid` (`scanned`: the scan listed it): whether it is newly found to be
    /// Python, or its runtime, profiled while starting, is now ready.
    fn look_at(&mut self, pid: u32, scanned: bool, scan: bool) -> bool {
        let python = &self.collector.python;
        if python.starting(pid) {
            // Profiled while its runtime starts: its full configuration once it has one
            // (looked for while it is young, then on each scan: an application may load
            // Python and start it much later).
            let due = scan
                || self.pending.iter().any(|p| p.pid == pid)
                || procfs::process_age(pid).is_some_and(|a| a < YOUNG);
            if !due {
                return false;
            }
            if let Some(cfg) = self.collector.refresh_python(pid) {
                if let Err(e) = self.targets.set_py_proc(pid, &cfg) {
                    log::warn!("pid {pid}: {e}");
                }
                return true;
            }
            return false;
        }
        if python.contains(pid) || python.known_not_python(pid) {
            return false;
        }
        if !crate::python::maps_mention_python(pid) {
            if scanned {
                self.not_python.insert(pid, self.scans);
            }
            return false;
        }
        // Just exec'd, forked or launched: its libraries may still be loading. By its age too:
        // a scan may find a program that exec'd before the run's exec events were on, or
        // before its exec event was read.
        let young = self.pending.iter().any(|p| p.pid == pid && p.young())
            || procfs::process_age(pid).is_some_and(|a| a < YOUNG);
        if let Some(cfg) = self.collector.try_python(pid, young) {
            if let Err(e) = self.targets.set_py_proc(pid, &cfg) {
                log::warn!("pid {pid}: {e}");
            }
            if self.scope.all_pythons {
                let _ = self.targets.add_target(pid);
            }
            return true;
        }
        false
    }

    /// Reads the thread maps of `pids` that are due (all of `found`, the processes just found)
    /// into the BPF side, with the names Python gave threads; forgets processes gone.
    fn sync_threads(&mut self, pids: Vec<u32>, found: &[u32]) {
        for pid in pids {
            if !alive(pid) {
                if gone(&mut self.dead, self.emptied, pid) {
                    self.dead.remove(&pid);
                    self.forget_python(pid);
                }
                continue;
            }
            if let Some(cfg) = self.collector.find_asyncio(pid) {
                if let Err(e) = self.targets.set_py_proc(pid, &cfg) {
                    log::warn!("pid {pid}: {e}");
                }
            }
            if !found.contains(&pid) && !self.collector.python.threads_due(pid) {
                continue;
            }
            let Some(changes) = self.collector.python.sync_threads(pid) else {
                continue;
            };
            for (tid, tstate) in changes.set {
                let _ = self.targets.set_py_thread(pid, tid, tstate);
            }
            for tid in changes.gone {
                self.targets.remove_py_thread(pid, tid);
            }
            for (tid, name) in changes.named {
                self.collector.name_thread(pid, tid, name);
            }
        }
    }
}

#[cfg(test)]
mod tests;
