//! `tachyon-bpf dump --pid P`: every thread's merged Python, native and kernel stack once, with
//! its GIL and CPU state, without pausing the process.
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

use std::collections::HashSet;
use std::fmt::Write as _;

use profiler_common::{SAMPLE_PY_READ_FAILED, SAMPLE_PY_THREAD, SAMPLE_USTACK_SHORT};
use serde_json::{json, Value};

use crate::aggregate::{state, Category, FrameId, Profile, Sample, ThreadData};
use crate::capture::record::RawSample;
use crate::output::{frame_label, gecko::thread_name};
use crate::process::remote::Remote;
use crate::python::PythonRegistry;
use crate::stack::symbols::KernelSymbols;

/// Bytes of a blocked thread's stack copied from its stack pointer (the unwinder reads on
/// beyond it when a frame needs more).
const STACK_COPY: usize = 64 * 1024;
/// Largest /proc file of a thread read here.
const PROC_FILE_MAX: usize = 64 * 1024;
/// Tries to read a blocked thread while it stays blocked.
const TRIES: usize = 3;

/// A thread's scheduler state letter and its voluntary and involuntary context switches.
pub fn thread_activity(pid: u32, tid: u32) -> Option<(char, u64)> {
    let dir = format!("/proc/{pid}/task/{tid}");
    let stat = read_proc(&format!("{dir}/stat"))?;
    let state = stat
        .rsplit_once(')')?
        .1
        .split_whitespace()
        .next()?
        .chars()
        .next()?;
    let status = read_proc(&format!("{dir}/status"))?;
    let switches = status
        .lines()
        .filter(|l| l.contains("ctxt_switches:"))
        .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .sum();
    Some((state, switches))
}

fn read_proc(path: &str) -> Option<String> {
    use std::io::Read;
    let mut s = String::new();
    std::fs::File::open(path)
        .ok()?
        .take(PROC_FILE_MAX as u64)
        .read_to_string(&mut s)
        .ok()?;
    Some(s)
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
    let dir = format!("/proc/{pid}/task/{tid}");
    // "NR ARG1..ARG6 SP PC" in a system call, "-1 SP PC" blocked elsewhere, "running".
    let syscall = read_proc(&format!("{dir}/syscall"))?;
    let words: Vec<&str> = syscall.split_whitespace().collect();
    if words.len() < 3 {
        return None;
    }
    let hex = |w: &str| u64::from_str_radix(w.trim_start_matches("0x"), 16).ok();
    let sp = hex(words[words.len() - 2])?;
    let ip = hex(words[words.len() - 1])?;
    let comm = read_proc(&format!("{dir}/comm")).unwrap_or_default();
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
    let kstack = read_proc(&format!("{dir}/stack"))
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

/// The sample a thread is shown with: its first with a stack.
fn shown(t: &ThreadData) -> Option<&Sample> {
    t.samples.iter().find(|s| s.stack.is_some())
}

fn states(s: &Sample, from_memory: bool) -> Vec<&'static str> {
    let mut out = Vec::new();
    if s.state & state::MAIN_THREAD != 0 {
        out.push("main thread");
    }
    out.push(if s.state & state::ON_CPU != 0 {
        "on CPU"
    } else {
        "off CPU"
    });
    if s.state & state::HAS_GIL != 0 {
        out.push("holds the GIL");
    } else if s.state & state::GIL_WAIT != 0 {
        out.push("waits for the GIL");
    }
    if s.state & state::GC != 0 {
        out.push("collecting garbage");
    }
    if s.state & state::EXCEPTION != 0 {
        out.push("has an exception");
    }
    out.push(if from_memory {
        "blocked throughout, read from memory"
    } else {
        "sampled"
    });
    out
}

/// An event loop's suspended tasks (`--async-aware`), as its pseudo-thread's last pass saw
/// them: each one's stack, root first, in task-name order.
fn tasks_of(p: &Profile, t: &ThreadData) -> Vec<Vec<FrameId>> {
    let last = t.samples.iter().map(|s| s.time_ms).fold(f64::MIN, f64::max);
    let mut stacks: Vec<Vec<FrameId>> = t
        .samples
        .iter()
        .filter(|s| s.time_ms == last)
        .filter_map(|s| s.stack)
        .map(|st| p.stack_root_first(st))
        .collect();
    stacks.sort_by_cached_key(|s| task_name(p, s));
    stacks
}

/// The task a suspended task's stack is of: its innermost `<task>` frame's name.
fn task_name(p: &Profile, stack: &[FrameId]) -> String {
    stack
        .iter()
        .rev()
        .map(|&f| p.funcs[p.frames[f].func].name.as_ref())
        .find_map(|n| n.strip_prefix("<task> "))
        .unwrap_or("?")
        .to_string()
}

/// The loop thread of an event loop's pseudo-thread.
fn loop_thread(t: &ThreadData) -> u32 {
    t.tid & !crate::aggregate::TASK_THREAD_BIT
}

/// The dump as text: per process and thread, its state and its frames, innermost first; then
/// each event loop's suspended tasks (`--async-aware`).
pub fn text(p: &Profile, from_memory: &HashSet<u32>) -> String {
    let mut out = String::new();
    for proc in p.processes.values() {
        let _ = writeln!(out, "Process {}: {}", proc.pid, proc.name);
        for t in proc.threads.values().filter(|t| t.is_task_view()) {
            let tasks = tasks_of(p, t);
            let _ = writeln!(
                out,
                "\nasyncio tasks of the event loop in thread {}: {} suspended",
                loop_thread(t),
                tasks.len()
            );
            for stack in tasks {
                let _ = writeln!(out, "  Task \"{}\"", task_name(p, &stack));
                for &f in stack.iter().rev() {
                    let _ = writeln!(out, "      {}", frame_label(p, f));
                }
            }
        }
        for t in proc.threads.values().filter(|t| !t.is_task_view()) {
            let name = thread_name(proc, t);
            let Some(s) = shown(t) else {
                let _ = writeln!(
                    out,
                    "\nThread {} \"{name}\": no stack (it did not run, and could not be read)",
                    t.tid
                );
                continue;
            };
            let st = states(s, from_memory.contains(&t.tid)).join(", ");
            let _ = writeln!(out, "\nThread {} \"{name}\" ({st})", t.tid);
            if let Some(stack) = s.stack {
                for f in p.stack_root_first(stack).into_iter().rev() {
                    let _ = writeln!(out, "    {}", frame_label(p, f));
                }
            }
        }
    }
    out
}

/// The dump as JSON: processes, their threads' states and frames (innermost first).
pub fn json(p: &Profile, from_memory: &HashSet<u32>) -> Value {
    let processes: Vec<Value> = p
        .processes
        .values()
        .map(|proc| {
            let frames_json = |stack: &[FrameId]| -> Vec<Value> {
                stack
                    .iter()
                    .rev()
                    .map(|&f| {
                        let fr = &p.frames[f];
                        let func = &p.funcs[fr.func];
                        let kind = match fr.category {
                            _ if func.name.starts_with("<task> ") && func.file.is_none() => "task",
                            _ if func.is_python => "python",
                            Category::Kernel => "kernel",
                            _ => "native",
                        };
                        json!({
                            "kind": kind,
                            "name": func.name.as_ref(),
                            "file": func.file.as_deref(),
                            "line": if func.is_python { fr.line } else { None },
                            "library": func.lib.map(|l| p.libs[l].name.to_string()),
                        })
                    })
                    .collect()
            };
            let loops: Vec<Value> = proc
                .threads
                .values()
                .filter(|t| t.is_task_view())
                .map(|t| {
                    let tasks: Vec<Value> = tasks_of(p, t)
                        .iter()
                        .map(|s| json!({"name": task_name(p, s), "frames": frames_json(s)}))
                        .collect();
                    json!({"thread": loop_thread(t), "suspended_tasks": tasks})
                })
                .collect();
            let threads: Vec<Value> = proc
                .threads
                .values()
                .filter(|t| !t.is_task_view())
                .map(|t| {
                    let s = shown(t);
                    let frames = frames_json(
                        &s.and_then(|s| s.stack)
                            .map(|st| p.stack_root_first(st))
                            .unwrap_or_default(),
                    );
                    let bit = |b: u8| s.is_some_and(|s| s.state & b != 0);
                    json!({
                        "tid": t.tid,
                        "name": thread_name(proc, t),
                        "captured": match s {
                            None => "no",
                            Some(_) if from_memory.contains(&t.tid) => "memory",
                            Some(_) => "bpf",
                        },
                        "main_thread": bit(state::MAIN_THREAD),
                        "on_cpu": bit(state::ON_CPU),
                        "has_gil": bit(state::HAS_GIL),
                        "gil_wait": bit(state::GIL_WAIT),
                        "gc": bit(state::GC),
                        "exception": bit(state::EXCEPTION),
                        "frames": frames,
                    })
                })
                .collect();
            json!({
                "pid": proc.pid,
                "name": proc.name,
                "python": proc.python,
                "threads": threads,
                "event_loops": loops,
            })
        })
        .collect();
    json!({ "processes": processes })
}
