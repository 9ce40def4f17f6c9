//! `dump`'s threads that stay blocked: read from outside and handled as samples.
//!
//! The dump is a short wall-mode run on the process: a thread that runs is sampled by the BPF
//! program at its next tick, and one that blocks during the run is captured as it leaves the
//! CPU. A thread blocked for the whole run is read from outside instead (`blocked_sample`):
//! its user registers from `/proc/PID/task/TID/syscall`, its stack and Python frames with
//! `process_vm_readv`, its kernel stack from `/proc/PID/task/TID/stack`. A blocked thread's
//! stack does not change until it wakes, so that is its stack at one instant too; it is
//! checked by the thread's context-switch counts, read before and after, and read again if
//! the thread ran in between. Those samples go through the same unwinding, Python resolution
//! and merging as the BPF program's.

use profiler_common::{SAMPLE_PY_READ_FAILED, SAMPLE_PY_THREAD, SAMPLE_USTACK_SHORT};

use super::monotonic_ns;
use crate::capture::record::RawSample;
use crate::process::procfs;
use crate::process::remote::Remote;
use crate::python::PythonRegistry;
use crate::stack::symbols::KernelSymbols;

/// Bytes of a blocked thread's stack copied from its stack pointer (the unwinder reads on
/// beyond it when a frame needs more).
const STACK_COPY: usize = 64 * 1024;
/// Tries to read a blocked thread while it stays blocked.
const TRIES: usize = 3;

/// A thread's scheduler state letter and its voluntary and involuntary context switches.
fn thread_activity(pid: u32, tid: u32) -> Option<(char, u64)> {
    let state = procfs::task_stat(pid, tid)?.state;
    let status = procfs::task_file(pid, tid, "status")?;
    let switches = status
        .lines()
        .filter(|l| l.contains("ctxt_switches:"))
        .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .sum();
    Some((state, switches))
}

/// The sample of a thread that is blocked now, read from outside, or `None` if it runs (or
/// ran during every try), or is gone.
pub fn blocked_sample(
    python: &PythonRegistry,
    kernel: &KernelSymbols,
    pid: u32,
    tid: u32,
    time_ns: u64,
) -> Option<RawSample<'static>> {
    for _ in 0..TRIES {
        let (state, before) = thread_activity(pid, tid)?;
        if state == 'R' {
            return None;
        }
        let sample = read_blocked(python, kernel, pid, tid, time_ns);
        let (state, after) = thread_activity(pid, tid)?;
        if state != 'R' && after == before {
            return sample;
        }
    }
    None
}

fn read_blocked(
    python: &PythonRegistry,
    kernel: &KernelSymbols,
    pid: u32,
    tid: u32,
    time_ns: u64,
) -> Option<RawSample<'static>> {
    // "NR ARG1..ARG6 SP PC" in a system call, "-1 SP PC" blocked elsewhere, "running".
    let syscall = procfs::task_file(pid, tid, "syscall")?;
    let words: Vec<&str> = syscall.split_whitespace().collect();
    if words.len() < 3 {
        return None;
    }
    let hex = |w: &str| u64::from_str_radix(w.trim_start_matches("0x"), 16).ok();
    let sp = hex(words[words.len() - 2])?;
    let ip = hex(words[words.len() - 1])?;
    let comm = procfs::task_file(pid, tid, "comm").unwrap_or_default();
    let remote = Remote { pid };
    // Page by page up to the copy's size: the stack's end stops it early.
    let mut stack = Vec::with_capacity(STACK_COPY);
    let mut flags = 0;
    let mut at = sp;
    while stack.len() < STACK_COPY {
        let page_end = (at | 4095) + 1;
        let len = ((page_end - at) as usize).min(STACK_COPY - stack.len());
        match remote.read(at, len) {
            Some(b) => stack.extend_from_slice(&b),
            None => {
                flags |= SAMPLE_USTACK_SHORT;
                break;
            }
        }
        at += len as u64;
    }
    // Kernel frames, innermost first: "[<0>] name+0xoff/0xsize".
    let kstack = procfs::task_file(pid, tid, "stack")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let sym = l.split_whitespace().nth(1)?;
            let (name, rest) = sym.split_once('+')?;
            let off = hex(rest.split('/').next()?)?;
            Some(kernel.address_of(name)? + off)
        })
        .collect();
    let mut s = RawSample {
        off_cpu: true,
        flags,
        pid,
        tid,
        time_ns,
        comm: comm.trim().to_string(),
        ip,
        sp,
        bp: 0,
        lr: 0,
        kstack,
        py_frames: Vec::new(),
        py_tstate: 0,
        py_gil_holder: 0,
        py_gil_locked: 0,
        py_gc_collecting: 0,
        py_task: 0,
        code_snaps: Vec::new(),
        stack: std::borrow::Cow::Owned(stack),
    };
    if let Some(w) = python.walk_thread(pid, tid) {
        s.flags |= SAMPLE_PY_THREAD;
        if w.read_failed {
            s.flags |= SAMPLE_PY_READ_FAILED;
        }
        s.py_tstate = w.tstate;
        s.py_frames = w.frames;
        s.py_gil_holder = w.gil_holder;
        s.py_gil_locked = w.gil_locked;
        s.py_gc_collecting = w.gc_collecting;
        s.py_task = w.running_task;
    }
    Some(s)
}

impl super::Collector {
    /// `dump`: the threads of `pid` without a sample yet, read from outside while they stay
    /// blocked (`dump::blocked_sample`) and handled as samples; returns their tids.
    pub fn sample_blocked_threads(&mut self, pid: u32) -> std::collections::HashSet<u32> {
        let mut done = std::collections::HashSet::new();
        for (tid, name) in self.python.thread_names_now(pid) {
            self.name_thread(pid, tid, name);
        }
        for tid in procfs::tids(pid) {
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
            if let Some(mut s) = blocked_sample(&self.python, &self.kernel, pid, tid, now) {
                // Kept as a sample of its own, not as an off-CPU capture waiting for the
                // scheduler's accounting to charge it.
                s.off_cpu = false;
                self.handle_in(s, true);
                done.insert(tid);
            }
        }
        done
    }
}
