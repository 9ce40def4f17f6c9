//! The session's policy through a fake capture: real (unprivileged) Python processes, fake BPF
//! maps, records fed as bytes. No root needed.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use profiler_common::{
    EventRecord, PyProcConfig, SampleHeader, MAX_KSTACK, RECORD_EXEC, RECORD_FORK, RECORD_SAMPLE,
    SAMPLE_PY_THREAD,
};

use super::*;
use crate::aggregate::Mode;
use crate::python::PythonRegistry;

/// The BPF maps a session writes, as sets.
#[derive(Default)]
struct FakeTargets {
    targets: BTreeSet<u32>,
    procs: BTreeSet<u32>,
    threads: BTreeMap<(u32, u32), u64>,
}

impl Targets for FakeTargets {
    fn add_target(&mut self, pid: u32) -> Result<(), CaptureError> {
        self.targets.insert(pid);
        Ok(())
    }
    fn set_py_proc(&mut self, pid: u32, _cfg: &PyProcConfig) -> Result<(), CaptureError> {
        self.procs.insert(pid);
        Ok(())
    }
    fn remove_py_proc(&mut self, pid: u32) {
        self.procs.remove(&pid);
    }
    fn set_py_thread(&mut self, pid: u32, tid: u32, tstate: u64) -> Result<(), CaptureError> {
        self.threads.insert((pid, tid), tstate);
        Ok(())
    }
    fn remove_py_thread(&mut self, pid: u32, tid: u32) {
        self.threads.remove(&(pid, tid));
    }
    fn set_stack_top(&mut self, _pid: u32, _tid: u32, _top: u64) -> Result<(), CaptureError> {
        Ok(())
    }
}

impl FakeTargets {
    fn threads_of(&self, pid: u32) -> Vec<u32> {
        self.threads
            .keys()
            .filter(|k| k.0 == pid)
            .map(|k| k.1)
            .collect()
    }
}

/// A Python process with a second thread, once both are running; killed when dropped.
struct Py(Child);

impl Py {
    fn start() -> Py {
        let mut child = Command::new("python3")
            .args([
                "-c",
                "import threading, time\n\
                 threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n\
                 print('ready', flush=True)\n\
                 time.sleep(60)\n",
            ])
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 runs");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "ready");
        Py(child)
    }
    fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Py {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn session(scope: Scope) -> Session<FakeTargets> {
    // No kernel frames are looked up: the fake records have no kernel stacks.
    let collector = Collector::new(
        crate::collect::monotonic_ns(),
        PythonRegistry::new(Default::default()),
        Mode::Wall,
        1.0,
        crate::collect::Kernel::none(),
    );
    Session::new(FakeTargets::default(), collector, scope)
}

/// Ticks (as the event loop does, every `TICK`) until `done` holds, at most 5 s.
fn tick_until(s: &mut Session<FakeTargets>, what: &str, done: impl Fn(&FakeTargets) -> bool) {
    let t0 = Instant::now();
    while !done(&s.targets) {
        assert!(t0.elapsed() < Duration::from_secs(5), "never: {what}");
        s.tick(&mut VecDeque::new());
        std::thread::sleep(TICK);
    }
}

fn event(kind: u32, pid: u32, arg0: u64, arg1: u64) -> Vec<u8> {
    event_at(kind, pid, arg0, arg1, crate::collect::monotonic_ns())
}

fn event_at(kind: u32, pid: u32, arg0: u64, arg1: u64, time_ns: u64) -> Vec<u8> {
    event_of(
        kind,
        pid,
        arg0,
        arg1,
        time_ns,
        *b"python3\0\0\0\0\0\0\0\0\0",
    )
}

fn event_of(kind: u32, pid: u32, arg0: u64, arg1: u64, time_ns: u64, comm: [u8; 16]) -> Vec<u8> {
    let e = EventRecord {
        kind,
        cpu: 0,
        pid,
        tid: pid,
        time_ns,
        arg0,
        arg1,
        comm,
    };
    // SAFETY: viewing a repr(C) value as bytes.
    unsafe { std::slice::from_raw_parts(&e as *const _ as *const u8, EventRecord::SIZE).to_vec() }
}

#[test]
fn explicit_python_target_is_installed_with_its_threads_and_removed_when_gone() {
    let mut py = Py::start();
    let pid = py.pid();
    let mut s = session(Scope {
        explicit: vec![pid],
        ..Scope::default()
    });
    // Found at once, by the session's first discovery, with both threads.
    assert!(s.targets.procs.contains(&pid));
    let threads = s.targets.threads_of(pid);
    assert_eq!(threads.len(), 2, "threads {threads:?}");
    assert!(threads.contains(&pid));
    assert!(s.targets.threads.values().all(|&ts| ts != 0));
    // An explicit target is sampled through the targets map the launcher or --pid filled.
    assert!(s.targets.targets.is_empty());
    py.0.kill().unwrap();
    py.0.wait().unwrap();
    tick_until(&mut s, "the dead process is removed", |t| {
        !t.procs.contains(&pid) && t.threads_of(pid).is_empty()
    });
}

#[test]
fn a_process_that_is_not_python_is_left_alone() {
    let mut sleeper = Command::new("sleep").arg("30").spawn().unwrap();
    let mut s = session(Scope {
        explicit: vec![sleeper.id()],
        ..Scope::default()
    });
    for _ in 0..(s.ticks_in(THREADS_EVERY) * 2) {
        s.tick(&mut VecDeque::new());
    }
    assert!(s.targets.procs.is_empty() && s.targets.threads.is_empty());
    sleeper.kill().unwrap();
    sleeper.wait().unwrap();
}

/// A program started during an --all-pythons run that is not named like Python (most of what a
/// host starts) is looked at a few times, more and more apart, not on every tick; one named
/// like Python is watched closely.
#[test]
fn a_new_program_not_named_python_is_looked_at_a_few_times() {
    let mut sleeper = Command::new("sleep").arg("30").spawn().unwrap();
    let pid = sleeper.id();
    let mut s = session(Scope {
        all_pythons: true,
        ..Scope::default()
    });
    let now = crate::collect::monotonic_ns();
    s.drain(&mut VecDeque::from([event_of(
        RECORD_EXEC,
        pid,
        0,
        0,
        now,
        *b"sleep\0\0\0\0\0\0\0\0\0\0\0",
    )]));
    assert!(
        !s.awaiting_young(),
        "a program not named like Python is not watched closely"
    );
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_millis(400) {
        s.tick(&mut VecDeque::new());
        std::thread::sleep(TICK);
    }
    // Due at 0, 10, 30, 70, 150 and 310 ms, on 20 ticks or so.
    assert!((4..=6).contains(&s.looks), "{} looks in 400 ms", s.looks);
    // `--all-pythons` also finds the Python processes the host runs: only the sleeper is this
    // test's.
    assert!(!s.targets.procs.contains(&pid));
    // Named like Python: every young tick.
    s.drain(&mut VecDeque::from([event(RECORD_EXEC, pid, 0, 0)]));
    assert!(s.awaiting_young());
    let before = s.looks;
    for _ in 0..5 {
        s.tick_young(&mut VecDeque::new());
    }
    assert_eq!(s.looks - before, 5);
    sleeper.kill().unwrap();
    sleeper.wait().unwrap();
}

/// A sample record of `pid`'s main thread with no stack: with Python frames walked (`python`)
/// or not.
fn bare_sample(pid: u32, python: bool) -> Vec<u8> {
    let h = SampleHeader {
        kind: RECORD_SAMPLE,
        flags: if python { SAMPLE_PY_THREAD } else { 0 },
        pid,
        tid: pid,
        time_ns: crate::collect::monotonic_ns(),
        cpu: 0,
        kstack_len: 0,
        ustack_len: 0,
        py_len: 0,
        comm: *b"python3\0\0\0\0\0\0\0\0\0",
        ip: 0,
        sp: 0,
        bp: 0,
        lr: 0,
        py_tstate: 0,
        py_gil_holder: 0,
        py_gil_locked: 0,
        py_status: 0,
        py_gc_collecting: 0,
        py_snaps: 0,
        sched_state: 0,
        py_task: 0,
        kstack: [0; MAX_KSTACK],
    };
    // SAFETY: viewing a repr(C) value as bytes.
    unsafe { std::slice::from_raw_parts(&h as *const _ as *const u8, SampleHeader::SIZE).to_vec() }
}

/// `--all-pythons`: a process forked by a Python process, which the BPF side walks as its
/// parent, is looked at when its first sample with Python frames is read, before that sample
/// is handled (a pool's worker may be gone by the next tick); a fork that only ever has samples
/// without them (a subprocess about to exec) is not looked at then.
#[test]
fn a_fork_of_python_is_looked_at_on_its_first_python_sample() {
    let mut s = session(Scope {
        all_pythons: true,
        ..Scope::default()
    });
    // Started after the session's first scan: only the fork record tells of it.
    let py = Py::start();
    let child = py.pid();
    let parent = std::process::id();
    let fork = event(RECORD_FORK, parent, child as u64, child as u64);
    s.drain(&mut VecDeque::from([
        fork.clone(),
        bare_sample(child, false),
    ]));
    assert_eq!(s.looks, 0);
    assert!(!s.targets.procs.contains(&child));
    s.drain(&mut VecDeque::from([bare_sample(child, true)]));
    assert_eq!(s.looks, 1);
    assert!(s.targets.procs.contains(&child) && s.targets.targets.contains(&child));
    assert!(s.collector.python.contains(child));
    // Once: later samples are no news.
    s.drain(&mut VecDeque::from([bare_sample(child, true)]));
    assert_eq!(s.looks, 1);
}

/// `--all-pythons`: a child of a Python process that is gone when its first sample with
/// Python frames is read (a pool's worker that ran a short task) is named from its parent: its
/// mappings and runtime are the parent's; nothing of its threads is read (from the parent's
/// memory) or installed, and the BPF side is not configured for it. Once its records are read,
/// it is forgotten as other gone processes are.
#[test]
fn a_fork_of_python_gone_before_it_is_read_is_named_from_its_parent() {
    let py = Py::start();
    let parent = py.pid();
    let mut s = session(Scope {
        all_pythons: true,
        ..Scope::default()
    });
    assert!(s.collector.python.contains(parent));
    // A pid that was a process and has exited.
    let mut gone = Command::new("true").spawn().unwrap();
    let child = gone.id();
    gone.wait().unwrap();
    let fork = event(RECORD_FORK, parent, child as u64, child as u64);
    s.drain(&mut VecDeque::from([fork, bare_sample(child, true)]));
    assert_eq!(s.looks, 1);
    assert!(s.collector.python.contains(child));
    assert_eq!(
        s.collector.python.labels(child),
        s.collector.python.labels(parent)
    );
    let (mine, theirs) = (&s.collector.procs[&child], &s.collector.procs[&parent]);
    assert!(!theirs.modules.is_empty());
    assert_eq!(mine.modules.len(), theirs.modules.len());
    assert_eq!(mine.comm, theirs.comm);
    assert!(!s.targets.procs.contains(&child));
    assert!(s.collector.python.sync_threads(child).is_none());
    assert!(!s.collector.python.asyncio_due(child));
    // A fork of a process that is not Python, gone too, is not named so.
    let mut other = Command::new("true").spawn().unwrap();
    let orphan = other.id();
    other.wait().unwrap();
    s.drain(&mut VecDeque::from([
        event(RECORD_FORK, orphan, orphan as u64 + 1, orphan as u64 + 1),
        bare_sample(orphan + 1, true),
    ]));
    assert!(!s.collector.python.contains(orphan + 1));
    // Forgotten once its records are read and it is found gone.
    let t0 = Instant::now();
    while s.collector.python.contains(child) && t0.elapsed() < Duration::from_secs(5) {
        s.tick(&mut VecDeque::new());
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(!s.collector.python.contains(child));
    assert!(s.collector.python.contains(parent));
}

#[test]
fn exec_forgets_the_old_program_and_all_pythons_finds_it_again() {
    let py = Py::start();
    let pid = py.pid();
    let mut s = session(Scope {
        all_pythons: true,
        ..Scope::default()
    });
    // The first discovery scans every process.
    assert!(s.targets.procs.contains(&pid) && s.targets.targets.contains(&pid));
    // An exec: the BPF side must stop walking the old layout at once (in this drain)...
    let n = s.drain(&mut VecDeque::from([event(RECORD_EXEC, pid, 0, 0)]));
    assert_eq!(n, 1);
    assert!(!s.targets.procs.contains(&pid));
    assert!(s.targets.threads_of(pid).is_empty());
    // ... and the new program (Python again here) is looked at on the next ticks, not at the
    // next full scan a second later.
    for _ in 0..3 {
        s.tick(&mut VecDeque::new());
    }
    assert!(s.targets.procs.contains(&pid));
    assert_eq!(s.targets.threads_of(pid).len(), 2);
}

/// The launched command is looked at before the records waiting for it are read
/// (`Session::tick_young`): its own exec, read afterwards, is no news.
#[test]
fn an_exec_from_before_the_launched_command_was_looked_at_changes_nothing() {
    let exec_ns = crate::collect::monotonic_ns();
    let py = Py::start();
    let pid = py.pid();
    let mut s = session(Scope {
        explicit: vec![pid],
        ..Scope::default()
    });
    assert!(s.targets.procs.contains(&pid));
    s.started(pid, false);
    s.drain(&mut VecDeque::from([event_at(
        RECORD_EXEC,
        pid,
        0,
        0,
        exec_ns,
    )]));
    assert!(s.targets.procs.contains(&pid));
    assert_eq!(s.targets.threads_of(pid).len(), 2);
}

/// A launched command held at its entry point is looked at before it runs on: its runtime is
/// known to the BPF side before any tick.
#[test]
fn a_held_launched_command_is_found_at_once() {
    let py = Py::start();
    let pid = py.pid();
    let mut s = session(Scope::default());
    s.started(pid, true);
    assert!(s.targets.procs.contains(&pid));
    let mut other = session(Scope::default());
    other.started(pid, false);
    assert!(!other.targets.procs.contains(&pid));
}

#[test]
fn subprocesses_makes_children_explicit_targets() {
    let parent = std::process::id();
    let py = Py::start();
    let child = py.pid();
    let fork = || VecDeque::from([event(RECORD_FORK, parent, child as u64, child as u64)]);
    // Without --subprocesses, a child of an explicit target is not profiled as Python.
    let mut s = session(Scope {
        explicit: vec![parent],
        ..Scope::default()
    });
    s.drain(&mut fork());
    for _ in 0..3 {
        s.tick(&mut VecDeque::new());
    }
    assert!(s.targets.procs.is_empty());
    let mut s = session(Scope {
        explicit: vec![parent],
        subprocesses: true,
        ..Scope::default()
    });
    s.drain(&mut fork());
    assert_eq!(s.scope().explicit, vec![parent, child]);
    s.tick(&mut VecDeque::new());
    assert!(s.targets.procs.contains(&child));
}

/// A ring that refills as fast as it is read (an overload), for far longer than a drain may
/// take: a drain without a bound reads it all, for many seconds, and fails the test.
struct Endless(u32);

impl RecordSource for Endless {
    fn next_record<R>(&mut self, f: impl FnOnce(&[u8]) -> R) -> Option<R> {
        if self.0 == 50_000_000 {
            return None;
        }
        self.0 += 1;
        Some(f(&event(99, 1, 0, 0)))
    }
}

/// A drain of a ring that never empties returns within its budget, so the run's deadline and
/// signals are seen; the end of a run still reads everything left.
#[test]
fn a_drain_of_a_ring_that_never_empties_ends() {
    let mut s = session(Scope::default());
    let mut source = Endless(0);
    let t0 = Instant::now();
    let n = s.drain(&mut source);
    assert!(n > 0 && n == source.0, "{n} records read of {}", source.0);
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    let mut q = VecDeque::from(vec![event(99, 1, 0, 0); 5000]);
    assert_eq!(s.drain_all(&mut q), 5000);
    assert!(q.is_empty());
}

#[test]
fn records_that_do_not_decode_are_counted_and_skipped() {
    let mut s = session(Scope::default());
    let py = Py::start();
    let mut q = VecDeque::from([
        vec![],
        vec![0xff; 7],
        event(99, 1, 0, 0),
        event(
            RECORD_FORK,
            std::process::id(),
            py.pid() as u64,
            py.pid() as u64,
        ),
    ]);
    assert_eq!(s.drain(&mut q), 4);
    assert!(q.is_empty());
    assert_eq!(s.collector.profile.counters.bad_records, 3);
}

/// An exit record as the ring holds it.
fn exit_bytes(r: &profiler_common::ExitSchedRecord) -> Vec<u8> {
    // SAFETY: viewing a repr(C) value as bytes.
    unsafe {
        std::slice::from_raw_parts(
            r as *const _ as *const u8,
            profiler_common::ExitSchedRecord::SIZE,
        )
        .to_vec()
    }
}

/// A thread's exit closes what the BPF side held of it as the switch program would have: its
/// open span, then off CPU from its last switch-out and on CPU for the CPU time it used since,
/// up to the exit; the CPU time is clamped to the time that passed.
#[test]
fn an_exiting_threads_held_intervals_are_closed_at_its_exit() {
    use profiler_common::{
        ExitSchedRecord, ThreadSched, ATTR_UNCAPTURED, ATTR_UNKNOWN, RECORD_EXIT_SCHED,
    };
    let mut s = session(Scope::default());
    // Off-CPU time without a capture: a sample of its own.
    let t0 = crate::collect::monotonic_ns() + 10_000_000;
    let ms = 1_000_000;
    let (pid, tid) = (4_000_001, 4_000_002);
    let mut sched = ThreadSched {
        since_ns: t0 + 2 * ms,
        last_sum: 5 * ms,
        attr: ATTR_UNCAPTURED,
        span_start: t0,
        span_end: t0 + 2 * ms,
        on_ns: ms / 2,
        switches: 3,
        ..Default::default()
    };
    sched.off_ns[ATTR_UNCAPTURED as usize] = 3 * ms / 2;
    let exit = |sched, tid, at, sum| ExitSchedRecord {
        kind: RECORD_EXIT_SCHED,
        pid,
        tid,
        time_ns: at,
        sum_ns: sum,
        sched,
        ..Default::default()
    };
    // Exits at t0 + 5 ms, having used 1 ms of CPU since t0 + 2 ms.
    let mut q = VecDeque::from([
        exit_bytes(&exit(sched, tid, t0 + 5 * ms, 6 * ms)),
        // Its CPU time says more than the time that passed: all of it on CPU. Its interval
        // since an unknown switch-out (`ATTR_UNKNOWN`) is not charged off CPU.
        exit_bytes(&exit(
            ThreadSched {
                attr: ATTR_UNKNOWN,
                span_start: 0,
                ..sched
            },
            tid + 1,
            t0 + 5 * ms,
            50 * ms,
        )),
        // Its CPU time could not be read: the span only.
        exit_bytes(&exit(
            ThreadSched {
                since_ns: 0,
                ..sched
            },
            tid + 2,
            t0 + 5 * ms,
            0,
        )),
    ]);
    assert_eq!(s.drain(&mut q), 3);
    let p = &s.collector.profile.processes[&pid];
    let totals = |tid: u32| {
        let t = &p.threads[&tid];
        let off: f64 = t.samples.iter().map(|s| s.weight_ms).sum();
        let on: f64 = t.sched.oncpu.iter().map(|(a, b)| b - a).sum::<f64>()
            + t.sched
                .spans
                .iter()
                .map(|(a, b, f)| (b - a) * f)
                .sum::<f64>();
        (on, off)
    };
    let close = |a: (f64, f64), b: (f64, f64)| (a.0 - b.0).abs() < 1e-6 && (a.1 - b.1).abs() < 1e-6;
    // Span: 0.5 on, 1.5 off; then 2 off and 1 on.
    assert!(close(totals(tid), (1.5, 3.5)), "{:?}", totals(tid));
    assert!(close(totals(tid + 1), (3.0, 0.0)), "{:?}", totals(tid + 1));
    assert!(close(totals(tid + 2), (0.5, 1.5)), "{:?}", totals(tid + 2));
}

/// A thread that exits while its last interval is still `ATTR_PENDING` ran since it blocked: a
/// switch-in that was back before its deadline left that interval to the sampling (shorter
/// than a period: not charged), and one that was not seen leaves a longer interval without a
/// stack (charged, as off-CPU time without a capture).
#[test]
fn an_exit_after_a_short_block_leaves_it_to_the_sampling() {
    use profiler_common::{ExitSchedRecord, ThreadSched, ATTR_PENDING, RECORD_EXIT_SCHED};
    // A period of 1 ms (the session's rate is 1 kHz).
    let mut s = session(Scope::default());
    let t0 = crate::collect::monotonic_ns() + 10_000_000;
    let us = 1_000;
    let (pid, tid) = (4_000_011, 4_000_012);
    let exit = |tid, off_ns: u64| ExitSchedRecord {
        kind: RECORD_EXIT_SCHED,
        pid,
        tid,
        // Blocked at t0 for `off_ns`, then ran 300 µs to its exit.
        time_ns: t0 + off_ns + 300 * us,
        sum_ns: 10_000 * us + 300 * us,
        sched: ThreadSched {
            since_ns: t0,
            last_sum: 10_000 * us,
            attr: ATTR_PENDING,
            ..Default::default()
        },
        ..Default::default()
    };
    let mut q = VecDeque::from([
        exit_bytes(&exit(tid, 600 * us)),
        exit_bytes(&exit(tid + 1, 1_500 * us)),
    ]);
    assert_eq!(s.drain(&mut q), 2);
    let p = &s.collector.profile.processes[&pid];
    let off = |tid: u32| -> f64 { p.threads[&tid].samples.iter().map(|s| s.weight_ms).sum() };
    assert_eq!(off(tid), 0.0);
    assert!((off(tid + 1) - 1.5).abs() < 1e-6, "{}", off(tid + 1));
}
