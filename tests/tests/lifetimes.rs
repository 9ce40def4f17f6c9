//! Processes and threads as they come and go: a process whose records are read after it exited
//! keeps its frames, a `--pid` run ends with its process, and more threads than the maps were
//! sized for are all accounted.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use tachyon_bpf_tests::*;

/// Loads a library, then sleeps and burns CPU by turns once `go` exists, and exits while
/// burning.
const LATE_READ: &str = r#"
import os, sys, time

def leaf(n):
    s = 0
    for i in range(n):
        s += i
    return s

def burn(secs):
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < secs:
        leaf(200)

def nap(t):
    time.sleep(t)

while not os.path.exists(sys.argv[1]):
    time.sleep(0.01)
import _decimal  # a library mapped now: the records after it say the mappings changed
for _ in range(3):
    nap(0.5)
    burn(0.4)
"#;

/// A CPU quota on one process, as a container's CPU limit: a cgroup of the `cpu` controller
/// (v1 here; v2's `cpu.max` where that is the hierarchy).
struct CpuQuota(std::path::PathBuf, bool);

impl CpuQuota {
    fn new(name: &str) -> CpuQuota {
        let v1 = Path::new("/sys/fs/cgroup/cpu");
        let (dir, v1) = if v1.join("cgroup.procs").exists() {
            (v1.join(name), true)
        } else {
            let v2 = Path::new("/sys/fs/cgroup");
            assert!(
                v2.join("cgroup.controllers").exists(),
                "no cgroup cpu controller to throttle the profiler with"
            );
            (v2.join(name), false)
        };
        let _ = std::fs::create_dir(&dir);
        let q = CpuQuota(dir, v1);
        q.set(None);
        q
    }

    /// Microseconds of CPU per second, or none.
    fn set(&self, us: Option<u64>) {
        let w = |f: &str, v: String| {
            std::fs::write(self.0.join(f), &v).unwrap_or_else(|e| panic!("{f} <- {v}: {e}"))
        };
        if self.1 {
            w("cpu.cfs_period_us", "1000000".into());
            w(
                "cpu.cfs_quota_us",
                us.map_or("-1".into(), |u| u.to_string()),
            );
        } else {
            w(
                "cpu.max",
                format!("{} 1000000", us.map_or("max".into(), |u| u.to_string())),
            );
        }
    }

    fn procs(&self) -> std::path::PathBuf {
        self.0.join("cgroup.procs")
    }
}

/// A profiler held to a few ms of CPU a second (a container's CPU limit) reads the samples of a
/// process long after it exited: they keep their Python frames, and each sleep is where it
/// slept. (What was known of a dead process was forgotten by the next thread-map refresh, while
/// its last seconds of records still waited in the ring.)
#[test]
fn a_process_read_after_it_exited_keeps_its_frames() {
    require_root();
    let dir = scratch("late-read");
    let script = dir.join("late.py");
    std::fs::write(&script, LATE_READ).unwrap();
    let go = dir.join("go");
    let mut target = Command::new(python("3.11.7"))
        .arg(&script)
        .arg(&go)
        .spawn()
        .unwrap();
    let quota = CpuQuota::new("tachyon-bpf-late-read");
    let out = dir.join("late.json");
    // 10 kHz: more records wait when the target exits than one drain reads; a ring large enough
    // to keep most of them (what a full ring drops is lost to every function alike).
    let mut profiler = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "echo $$ > {} && exec {} -v -r 10000 --ring-mb 256 -p {} -d 12 -o {}",
            quota.procs().display(),
            profiler_bin().display(),
            target.id(),
            out.display()
        ))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = profiler.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        use std::io::BufRead;
        let mut all = String::new();
        for line in std::io::BufReader::new(&mut err)
            .lines()
            .map_while(Result::ok)
        {
            if line.contains("kernel symbols") {
                let _ = tx.send(());
            }
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    // Held back once attached (`-v` then says where kernel symbols came from) and the target
    // found (at the start, in well under a second).
    let attached = rx.recv_timeout(Duration::from_secs(30));
    std::thread::sleep(Duration::from_secs(1));
    quota.set(Some(3000));
    std::fs::write(&go, "").unwrap();
    let _ = target.wait();
    // Its records are read at the profiler's pace, after it exited.
    std::thread::sleep(Duration::from_secs(2));
    quota.set(None);
    wait_timeout(&mut profiler, Duration::from_secs(120));
    let status = profiler.wait().unwrap();
    let err = reader.join().unwrap();
    let _ = std::fs::remove_dir(&quota.0);
    assert!(attached.is_ok(), "the profiler did not attach: {err}");
    assert!(status.success(), "{err}");
    let p: Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    let lag = p["meta"]["tachyon"]["maxReaderLagMs"].as_f64().unwrap();
    assert!(
        lag > 1000.0,
        "the throttled reader was not behind: {lag} ms\n{err}"
    );
    let v = Viewer::load(&out).unwrap();
    let procs = v.processes().unwrap();
    let t = &process_named(&procs, "late.py").threads[0];
    let c = v.call_paths(&t.handle).unwrap();
    let burn = c.count(|n| n.iter().any(|f| f == "burn"));
    // Samples in the interpreter without a Python frame, or with one not named: what was lost.
    let bare = c.count(|n| {
        let eval = n.iter().any(|f| f.contains("_PyEval_EvalFrame"));
        let named = n.iter().any(|f| f == "<module>");
        eval && (!named || n.iter().any(|f| f.contains("<unresolved")))
    });
    let nap = c.count(|n| {
        let py = n.iter().position(|f| f == "nap");
        let k = n.iter().position(|f| f == "do_nanosleep");
        matches!((py, k), (Some(a), Some(b)) if a < b)
    });
    // Native stacks unwound with the mappings read while it ran, not cut short.
    let truncated = c.count(|n| n.first().is_some_and(|f| f == "[truncated]"));
    let lost = p["meta"]["tachyon"]["lost"].as_u64().unwrap();
    eprintln!(
        "reader {lag:.0} ms behind ({lost} samples lost): burn {burn} ms, {bare} ms in the \
         interpreter without its frames, {truncated} ms truncated, nap -> do_nanosleep {nap} ms"
    );
    // Samples the full ring refused are lost to every function alike; those kept are whole.
    assert!(
        burn > 300 && bare * 100 <= burn && truncated * 100 <= burn && nap >= 1450,
        "reader {lag:.0} ms behind ({lost} samples lost): {burn} ms in burn, {bare} ms in the \
         interpreter without its frames, {truncated} ms truncated, {nap} ms in nap -> \
         do_nanosleep (of 1500)\n{err}"
    );
}

/// A --pid run ends when its process exits, as a run of a command does: with what it collected
/// written, not at -d or Ctrl-C.
#[test]
fn a_pid_run_ends_when_its_process_exits() {
    require_root();
    let dir = scratch("pid-exit");
    let mut target = Command::new(python("3.12.1"))
        .args([
            "-c",
            "import time\ndef spin():\n    t = time.time()\n    while time.time() - t < 2.5: pass\nspin()\n",
        ])
        .spawn()
        .unwrap();
    let out = dir.join("pid-exit.json");
    let t0 = Instant::now();
    let o = run_profiler(
        &[
            "-p",
            &target.id().to_string(),
            "-d",
            "60",
            "-o",
            out.to_str().unwrap(),
        ],
        Duration::from_secs(90),
    );
    let took = t0.elapsed();
    let _ = target.wait();
    let err = stderr_of(&o);
    assert!(o.status.success(), "{err}");
    assert!(
        took < Duration::from_secs(20),
        "the run lasted {took:?} after its process exited at 2.5 s: {err}"
    );
    assert!(err.contains("the profiled processes have exited"), "{err}");
    let v = Viewer::load(&out).unwrap();
    let procs = v.processes().unwrap();
    let t = &procs
        .iter()
        .find(|p| p.name.contains("Python 3.12"))
        .unwrap_or_else(|| panic!("no Python process in the profile: {err}"))
        .threads[0];
    let c = v.call_paths(&t.handle).unwrap();
    assert!(c.with_sequence(&["spin"]) > 1000, "{err}");
}

/// A main thread that works for 2 s beside `argv[1]` threads that wait for it.
const MANY_THREADS: &str = r#"
import sys, threading, time
threading.stack_size(256 * 1024)
stop = threading.Event()
def idler():
    stop.wait()
def busy_main(secs):
    t0 = time.time()
    x = 0
    while time.time() - t0 < secs:
        x += 1
ts = [threading.Thread(target=idler) for _ in range(int(sys.argv[1]))]
for t in ts:
    t.start()
busy_main(2.0)
stop.set()
for t in ts:
    t.join()
"#;

/// The scheduler accounting's BPF map has room for four times the threads the host had when the
/// profiler started (4096 at least). A process that starts a thousand threads more than that is
/// profiled whole: the threads past the room are counted (`schedMapFull`), and those with room
/// keep their off-CPU time. Its main thread's work keeps its Python frames, although the
/// thread is past the bound of the walk of the interpreter's thread list (4096: new threads go
/// at its head), which used to drop its thread state.
#[test]
fn more_threads_than_the_maps_were_sized_for() {
    require_root();
    let dir = scratch("many-threads");
    let script = dir.join("threads.py");
    std::fs::write(&script, MANY_THREADS).unwrap();
    let loadavg = std::fs::read_to_string("/proc/loadavg").unwrap();
    let host: u32 = loadavg
        .split_whitespace()
        .nth(3)
        .and_then(|f| f.split_once('/'))
        .and_then(|(_, n)| n.parse().ok())
        .expect("the host's thread count in /proc/loadavg");
    let room = (host * 4).next_power_of_two().max(4096);
    assert!(
        room < 65536,
        "this host has too many threads for the test: {host}"
    );
    let threads = (room + 1000).to_string();
    let base = dir.join("many");
    let o = profile_command(
        &base,
        &["-r", "1000", "-f", "gecko,collapsed"],
        &[
            python("3.12.1").to_str().unwrap(),
            script.to_str().unwrap(),
            &threads,
        ],
    );
    let err = stderr_of(&o);
    let p: Value = serde_json::from_slice(&std::fs::read(dir.join("many.json")).unwrap()).unwrap();
    let full = p["meta"]["tachyon"]["bpfCounters"]["schedMapFull"]
        .as_u64()
        .unwrap();
    let folded = std::fs::read_to_string(dir.join("many.folded")).unwrap();
    let (mut busy, mut idlers) = (0u64, 0u64);
    let mut idler_threads = std::collections::HashSet::new();
    for line in folded.lines() {
        let (stack, n) = line.rsplit_once(' ').unwrap();
        let n: u64 = n.parse().unwrap();
        // Python frames read `file:function:line`.
        if stack.contains("threads.py:busy_main:") {
            busy += n;
        }
        if stack.contains("threads.py:idler:") {
            idlers += n;
            idler_threads.insert(stack.split(';').nth(1).unwrap_or("").to_string());
        }
    }
    eprintln!(
        "{threads} threads, room {room}: schedMapFull {full}, busy_main {busy} samples, \
         idlers {idlers} ms over {} threads",
        idler_threads.len()
    );
    assert!(
        full > 0,
        "no thread was counted past the maps' room ({room} for {host} threads at start)\n{err}"
    );
    assert!(
        busy >= 1000,
        "the main thread's 2 s of work has {busy} samples in busy_main\n{err}"
    );
    // Threads with room keep their off-CPU time (wall mode) on their Python stack.
    assert!(
        idler_threads.len() as u32 >= room / 2,
        "off-CPU time of {} idle threads only\n{err}",
        idler_threads.len()
    );
}
