//! `tachyon-bpf dump --pid P` as text and JSON: every thread's merged stack once, with its GIL
//! and CPU state, and the threads read from outside while they stayed blocked said so.

use std::collections::HashSet;
use std::fmt::Write as _;

use serde_json::{json, Value};

use super::{frame_label, gecko::thread_name};
use crate::aggregate::{state, Category, FrameId, Profile, Sample, ThreadData};

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
