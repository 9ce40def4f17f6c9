//! `tachyon-bpf dump --pid P`: every thread's stack once, on every interpreter, while the process
//! keeps running. A thread that runs is sampled by the BPF program; threads blocked throughout
//! are read from outside, and must come out as whole as samples do: Python frames merged into
//! native frames down to the thread's root, and the kernel frames it waits in.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use tachyon_bpf_tests::*;

/// The main thread sleeps in `sleeper`, one thread waits on an event in `waiter`, one spins in
/// `spin`. It says "ready" once every thread is where it stays.
const PROGRAM: &str = r#"
import sys, threading, time

ev = threading.Event()
started = threading.Barrier(3)

def waiter():
    started.wait()
    ev.wait()

def spin():
    started.wait()
    n = 0
    while not ev.is_set():
        n += sum(i * i for i in range(50))

def sleeper():
    started.wait()
    time.sleep(0.3)
    print("ready", flush=True)
    time.sleep(120)

threading.Thread(target=waiter, name="the-waiter", daemon=True).start()
threading.Thread(target=spin, name="the-spinner", daemon=True).start()
sleeper()
"#;

fn start(py: &std::path::Path, script: &std::path::Path) -> Child {
    let mut child = Command::new(py)
        .arg(script)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready");
    child
}

fn names(t: &Value, kind: &str) -> Vec<String> {
    t["frames"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["kind"] == kind)
        .map(|f| f["name"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn dump_shows_every_threads_stack_without_stopping_it() {
    require_root();
    let dir = scratch("dump");
    let script = dir.join("threads.py");
    std::fs::write(&script, PROGRAM).unwrap();
    for (label, py) in interpreters() {
        let mut child = start(&py, &script);
        let pid = child.id().to_string();
        let o = run_profiler(&["dump", "--pid", &pid, "--json"], Duration::from_secs(60));
        let text = run_profiler(&["dump", "--pid", &pid], Duration::from_secs(60));
        let _ = child.kill();
        let _ = child.wait();
        assert!(
            o.status.success(),
            "{label}: dump failed: {}",
            stderr_of(&o)
        );
        let v: Value = serde_json::from_slice(&o.stdout).unwrap();
        let procs = v["processes"].as_array().unwrap();
        assert_eq!(procs.len(), 1, "{label}: {v}");
        assert!(
            procs[0]["python"]
                .as_str()
                .is_some_and(|p| p.starts_with("3.")),
            "{label}: the process's Python version: {}",
            procs[0]["python"]
        );
        let threads = procs[0]["threads"].as_array().unwrap();
        let by_name = |n: &str| {
            threads
                .iter()
                .find(|t| t["name"].as_str().is_some_and(|x| x.contains(n)))
                .unwrap_or_else(|| panic!("{label}: no thread {n} in {v:#}"))
        };
        let main = threads
            .iter()
            .find(|t| t["main_thread"] == true)
            .unwrap_or_else(|| panic!("{label}: no main thread in {v:#}"));
        let waiter = by_name("the-waiter");
        let spinner = by_name("the-spinner");
        for (t, func) in [(main, "sleeper"), (waiter, "waiter")] {
            let python = names(t, "python");
            let native = names(t, "native");
            let kernel = names(t, "kernel");
            assert_eq!(t["captured"], "memory", "{label}: {func}'s thread: {t:#}");
            assert_eq!(t["on_cpu"], false, "{label}: {t:#}");
            assert!(
                python.iter().any(|n| n == func),
                "{label}: {func} missing: {python:?}"
            );
            // Merged down to the thread's root: its start function is the outermost frame (the
            // C library Debian's 3.14 and 3.15 bring under .tools has no symbols: there, its
            // address in libc).
            let root = t["frames"].as_array().unwrap().last().unwrap()["name"].clone();
            assert!(
                matches!(
                    root.as_str(),
                    Some("_start" | "__clone3" | "clone3" | "__clone" | "clone")
                ) || root.as_str().is_some_and(|r| r.starts_with("libc.so.6+0x")),
                "{label}: {func}'s stack ends at {root}: {native:?}"
            );
            // Python frames replace the eval-loop frames they ran in: the interpreter's native
            // entry is below the outermost one.
            let kinds: Vec<&str> = t["frames"]
                .as_array()
                .unwrap()
                .iter()
                .map(|f| f["kind"].as_str().unwrap())
                .collect();
            let last_py = kinds.iter().rposition(|k| *k == "python").unwrap();
            assert!(
                kinds[last_py + 1..].iter().all(|k| *k == "native") && last_py + 3 < kinds.len(),
                "{label}: {func}: Python frames not merged into {native:?}"
            );
            assert!(!kernel.is_empty(), "{label}: {func}: no kernel frames");
        }
        // Python frames innermost first: sleeper under <module>, waiter under the thread's run.
        let mp = names(main, "python");
        assert_eq!(
            mp.last().map(String::as_str),
            Some("<module>"),
            "{label}: {mp:?}"
        );
        let wp = names(waiter, "python");
        assert!(
            wp.iter().any(|n| n.ends_with("wait")),
            "{label}: the waiter waits in Event.wait: {wp:?}"
        );
        // The spinner runs: a BPF sample of it, in spin (or waiting for the GIL there).
        let sp = names(spinner, "python");
        assert!(
            sp.iter().any(|n| n == "spin" || n == "<genexpr>"),
            "{label}: spinner: {sp:?}"
        );
        assert_eq!(spinner["captured"], "bpf", "{label}: {spinner:#}");
        // The text form says the same.
        assert!(text.status.success(), "{label}: {}", stderr_of(&text));
        let t = String::from_utf8_lossy(&text.stdout);
        for needle in ["the-waiter", "the-spinner", "sleeper", "waiter", "spin"] {
            assert!(
                t.contains(needle),
                "{label}: text dump lacks {needle}:\n{t}"
            );
        }
    }
}

#[test]
fn dump_of_a_missing_process_is_one_line_and_an_error() {
    require_root();
    let o = run_profiler(&["dump", "--pid", "999999999"], Duration::from_secs(30));
    assert!(!o.status.success());
    let err = stderr_of(&o);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("999999999"), "{err}");
}

/// An asyncio service at rest: a task per kind of wait, named, each awaited by the main task.
const ASYNC_PROGRAM: &str = r#"
import asyncio

async def wait_for_client(ev):
    await ev.wait()

async def pause():
    await asyncio.sleep(120)

async def handler(ev):
    await wait_for_client(ev)

async def main():
    ev = asyncio.Event()
    tasks = [asyncio.create_task(handler(ev), name=f"handler-{i}") for i in range(3)]
    tasks.append(asyncio.create_task(pause(), name="the-pause"))
    await asyncio.sleep(0.3)
    print("ready", flush=True)
    await asyncio.gather(*tasks)

asyncio.run(main())
"#;

/// `dump --async-aware all` on 3.11 to 3.15: every suspended task, by name, with its
/// await chain (the task awaiting it, its coroutines down to where it waits).
#[test]
fn dump_async_aware_lists_every_task_where_it_waits() {
    require_root();
    let dir = scratch("dump_async");
    let script = dir.join("service.py");
    std::fs::write(&script, ASYNC_PROGRAM).unwrap();
    for minor in ["3.11.7", "3.12.1", "3.13.0", "debian-3.14", "debian-3.15"] {
        let mut child = start(&python(minor), &script);
        let pid = child.id().to_string();
        let o = run_profiler(
            &["dump", "--pid", &pid, "--json", "--async-aware", "all"],
            Duration::from_secs(60),
        );
        let text = run_profiler(
            &["dump", "--pid", &pid, "--async-aware=all"],
            Duration::from_secs(60),
        );
        // A bare --async-aware is `running`, as on the main command: no suspended tasks.
        let running = run_profiler(
            &["dump", "--pid", &pid, "--json", "--async-aware"],
            Duration::from_secs(60),
        );
        let _ = child.kill();
        let _ = child.wait();
        assert!(o.status.success(), "{minor}: {}", stderr_of(&o));
        assert!(running.status.success(), "{minor}: {}", stderr_of(&running));
        let r: Value = serde_json::from_slice(&running.stdout).unwrap();
        let suspended = r["processes"][0]["event_loops"].as_array().map_or(0, |l| {
            l.iter()
                .map(|lp| lp["suspended_tasks"].as_array().map_or(0, Vec::len))
                .sum()
        });
        assert_eq!(
            suspended, 0,
            "{minor}: running lists no suspended task: {r:#}"
        );
        let v: Value = serde_json::from_slice(&o.stdout).unwrap();
        let loops = v["processes"][0]["event_loops"].as_array().unwrap();
        assert_eq!(loops.len(), 1, "{minor}: one event loop: {v:#}");
        assert_eq!(loops[0]["thread"].as_u64(), Some(child.id() as u64));
        let tasks = loops[0]["suspended_tasks"].as_array().unwrap();
        let find = |n: &str| {
            tasks
                .iter()
                .find(|t| t["name"] == n)
                .unwrap_or_else(|| panic!("{minor}: no task {n}: {v:#}"))
        };
        let chain = |t: &Value| -> Vec<String> {
            t["frames"]
                .as_array()
                .unwrap()
                .iter()
                .map(|f| f["name"].as_str().unwrap().to_string())
                .collect()
        };
        for i in 0..3 {
            let c = chain(find(&format!("handler-{i}")));
            // Innermost first: Event.wait, our two coroutines, the task, main, its task.
            let at = |n: &str| c.iter().position(|x| x == n);
            let (w, wf, h, t, m, root) = (
                at("Event.wait"),
                at("wait_for_client"),
                at("handler"),
                at(&format!("<task> handler-{i}")),
                at("main"),
                at("<task> Task-1"),
            );
            assert!(
                w < wf && wf < h && h < t && t < m && m < root && w.is_some(),
                "{minor}: handler-{i}'s chain: {c:?}"
            );
        }
        let c = chain(find("the-pause"));
        assert_eq!(&c[..3], ["sleep", "pause", "<task> the-pause"], "{minor}");
        let text = String::from_utf8_lossy(&text.stdout).to_string();
        assert!(
            text.contains("asyncio tasks of the event loop in thread")
                && text.contains("Task \"handler-2\"")
                && text.contains("service.py:wait_for_client:"),
            "{minor}: {text}"
        );
    }
}
