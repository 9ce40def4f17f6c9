//! Wall-clock time from the scheduler, profiling modes, GIL waits, GC, CPU use and lifetimes:
//! real interpreters, profiled for real, read back through the Firefox Profiler CLI and compared
//! with what each script measures about itself.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tachyon_bpf_tests::*;

/// Runs the profiler on `python script args` and returns (profile path, script stdout).
fn profile_script(
    dir: &Path,
    name: &str,
    py: &Path,
    script: &str,
    extra: &[&str],
) -> (PathBuf, String) {
    let file = dir.join(format!("{name}.py"));
    std::fs::write(&file, script).unwrap();
    let out = dir.join(format!("{name}.json"));
    let o = profile_command(&out, extra, &[py.to_str().unwrap(), file.to_str().unwrap()]);
    (out, String::from_utf8_lossy(&o.stdout).into_owned())
}

/// The one thread of `v` whose call tree contains `func`, with its call paths.
fn thread_with(v: &Viewer, func: &str) -> (ThreadInfo, CallPaths) {
    let mut found = Vec::new();
    for p in v.processes().unwrap() {
        for t in p.threads {
            let c = v.call_paths(&t.handle).unwrap();
            if c.count(|n| n.iter().any(|f| f == func)) > 0 {
                found.push((t, c));
            }
        }
    }
    assert_eq!(found.len(), 1, "one thread runs {func}");
    found.pop().unwrap()
}

/// Every thread of every process of a profile.
fn all_threads(v: &Viewer) -> Vec<ThreadInfo> {
    v.processes()
        .unwrap()
        .into_iter()
        .flat_map(|p| p.threads)
        .collect()
}

/// The thread with OS id `tid` (as the script printed it).
fn thread_by_tid<'a>(threads: &'a [ThreadInfo], tid: u64, label: &str) -> &'a ThreadInfo {
    threads
        .iter()
        .find(|t| t.tid == tid)
        .unwrap_or_else(|| panic!("{label}: thread {tid} is in the profile"))
}

const SLEEPER: &str = r#"
import time

def burn(secs):
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < secs:
        pass

def nap():
    time.sleep(1.0)

def main():
    slept = 0.0
    t0 = time.perf_counter()
    for _ in range(3):
        burn(0.5)
        s = time.perf_counter()
        nap()
        slept += time.perf_counter() - s
    print(slept, time.perf_counter() - t0)

main()
"#;

#[test]
fn wall_mode_shows_sleep_and_cpu_mode_does_not() {
    require_root();
    let dir = scratch("offcpu_sleep");
    let py = python("3.12.1");
    let (wall, out) = profile_script(&dir, "sleeper", &py, SLEEPER, &["-m", "wall"]);
    let (slept, elapsed) = match out
        .split_whitespace()
        .map(|x| {
            x.parse::<f64>()
                .expect("the script prints its sleep and run times")
        })
        .collect::<Vec<_>>()[..]
    {
        [a, b] => (a * 1000.0, b * 1000.0),
        _ => panic!("the script prints two times: {out}"),
    };
    // The counts reconcile: every record of a Python thread is a sample on a CPU or an off-CPU
    // capture (the summary once printed 69 samples beside 1838 Python ones).
    let meta: serde_json::Value = serde_json::from_slice(&std::fs::read(&wall).unwrap()).unwrap();
    let t = &meta["meta"]["tachyon"];
    let n = |k: &str| {
        t[k].as_u64()
            .unwrap_or_else(|| panic!("meta.tachyon.{k}: {t}"))
    };
    // The nap's blocking point is captured; later naps at the same point reuse that capture.
    assert!(
        n("offCpuCaptures") >= 1,
        "the nap is captured as it starts: {t}"
    );
    assert!(
        n("pythonSamples") <= n("samples") + n("offCpuCaptures"),
        "Python records are samples or captures: {t}"
    );
    // Every BPF counter is in the profile by its contract name, and agrees with what was read.
    let bpf = &t["bpfCounters"];
    let names: Vec<&str> = bpf
        .as_object()
        .unwrap()
        .keys()
        .map(|k| k.as_str())
        .collect();
    for want in [
        "records",
        "lost",
        "scratchFail",
        "kstackFail",
        "pyThreadMiss",
        "pyReadFail",
        "pyTruncated",
        "eventsLost",
        "switchCaptures",
        "uregsFail",
    ] {
        assert!(names.contains(&want), "bpfCounters lacks {want}: {bpf}");
    }
    let b = |k: &str| bpf[k].as_u64().unwrap();
    assert_eq!(
        b("records"),
        n("samples") + n("offCpuCaptures") + n("badRecords"),
        "every record written was read: {t}"
    );
    assert!(b("switchCaptures") >= n("offCpuCaptures"), "{t}");
    // The BPF time by program: the sampler and the switch program both ran, and their times add
    // up to the total.
    let progs = t["bpfPrograms"].as_object().expect("bpfPrograms");
    for want in ["tachyon_sample", "tachyon_switch"] {
        assert!(
            progs
                .get(want)
                .is_some_and(|p| p["runs"].as_u64() > Some(0)),
            "bpfPrograms lacks {want}: {progs:?}"
        );
    }
    let by_program: f64 = progs.values().map(|p| p["ms"].as_f64().unwrap()).sum();
    let total = t["profilerCost"]["bpfMs"].as_f64().unwrap();
    assert!(
        (by_program - total).abs() <= 0.01 * total.max(0.1),
        "programs {by_program} ms, total {total} ms"
    );
    let v = Viewer::load(&wall).unwrap();
    let (_, c) = thread_with(&v, "nap");
    // Python frame, the C function, down to the kernel's sleep.
    let sleeping = c.count(|n| {
        let py = n.iter().position(|f| f == "nap");
        let k = n.iter().position(|f| f == "do_nanosleep");
        matches!((py, k), (Some(a), Some(b)) if a < b && n[a..b].iter().any(|f| f == "time_sleep"))
    }) as f64;
    // Wall mode weighs each sleep by exactly how long it lasted.
    assert!(
        (sleeping - slept).abs() <= 0.03 * slept,
        "wall mode: {sleeping:.0} ms in time.sleep, the script slept {slept:.0} ms \
         (thread total {} ms, script run {elapsed:.0} ms)",
        c.total
    );
    assert!(
        c.total as f64 >= 0.98 * elapsed,
        "the thread's wall time {} covers the script's {elapsed:.0} ms",
        c.total
    );
    assert!(
        c.count(|n| n.iter().any(|f| f == "burn")) as f64 / c.total as f64 > 0.25,
        "wall mode keeps the CPU time too"
    );

    let (cpu, _) = profile_script(&dir, "sleeper_cpu", &py, SLEEPER, &["-m", "cpu"]);
    let v = Viewer::load(&cpu).unwrap();
    let (_, c) = thread_with(&v, "burn");
    let sleeping = c.count(|n| n.iter().any(|f| f == "do_nanosleep"));
    assert!(
        (sleeping as f64) < 0.01 * c.total as f64,
        "cpu mode: {sleeping} of {} ms asleep",
        c.total
    );
    assert!(c.count(|n| n.iter().any(|f| f == "burn")) as f64 / c.total as f64 > 0.9);
}

const SHORT_THEN_LONG: &str = r#"
import threading, time

def burn(stop):
    while time.time() < stop:
        pass

def short_wait():
    time.sleep(0.001)   # then waits for the GIL the burner holds

def long_wait():
    time.sleep(1.0)

threading.Thread(target=burn, args=(time.time() + 8,), daemon=True).start()
long_total = 0.0
for i in range(5):
    short_wait()
    t0 = time.perf_counter()
    long_wait()
    long_total += time.perf_counter() - t0
print(long_total)
"#;

/// A thread that blocks again right after a short block (here a 1 ms sleep and its GIL wait)
/// gets the stack it blocks in, not the earlier one: captures are rate-limited per thread, and
/// a rate-limited block used to be charged to the last capture, so the 1 s sleeps were shown
/// under `short_wait` and as "Waiting for GIL".
#[test]
fn a_block_right_after_another_gets_its_own_stack() {
    require_root();
    let dir = scratch("offcpu_short_then_long");
    for label in ["3.8.18", "3.12.1"] {
        let py = python(label);
        let (wall, out) = profile_script(&dir, "short_long", &py, SHORT_THEN_LONG, &["-m", "wall"]);
        let long_ms: f64 = out
            .trim()
            .parse::<f64>()
            .expect("the script prints its sleep time")
            * 1000.0;
        let v = Viewer::load(&wall).unwrap();
        let (t, c) = thread_with(&v, "long_wait");
        let long = c.count(|n| n.iter().any(|f| f == "long_wait")) as f64;
        let short = c.count(|n| n.iter().any(|f| f == "short_wait")) as f64;
        assert!(
            (long - long_ms).abs() <= 0.03 * long_ms,
            "{label}: {long:.0} ms under long_wait, the script slept {long_ms:.0} ms there \
             ({short:.0} ms under short_wait)"
        );
        // Five 1 ms sleeps and GIL waits of at most a switch interval (5 ms) each.
        assert!(short < 200.0, "{label}: {short:.0} ms under short_wait");
        // The GIL waits are the short ones only.
        let gil = v
            .marker_totals(&t.handle)
            .unwrap()
            .get("Waiting for GIL")
            .map_or(0.0, |m| m.1);
        assert!(
            gil < 200.0,
            "{label}: {gil:.0} ms of Waiting for GIL markers"
        );
    }
}

const TWO_CALLERS: &str = r#"
import time

def wait():
    time.sleep(0.02)

def step():
    wait()

def route_a():
    step()

def route_b():
    step()

a = b = 0.0
for _ in range(50):
    t0 = time.perf_counter()
    route_a()
    t1 = time.perf_counter()
    route_b()
    a += t1 - t0
    b += time.perf_counter() - t1
print(a, b)
"#;

/// One function blocking at one line, reached from two callers of the same shape through a
/// function between: the frames it blocks in are at the same addresses under either caller
/// (the same depth; on 3.8 each code object's reused frame), and the thread at the same C
/// stack depth. Each caller's share is the time the script slept under it: a blocking point is
/// known by its callers too, so the second caller's blocks are never charged to the capture
/// taken under the first.
#[test]
fn a_function_blocking_under_two_callers_is_charged_to_each() {
    require_root();
    let dir = scratch("offcpu_two_callers");
    for label in ["3.8.18", "3.12.1"] {
        let py = python(label);
        let (wall, out) = profile_script(&dir, "two_callers", &py, TWO_CALLERS, &["-m", "wall"]);
        let measured: Vec<f64> = out
            .split_whitespace()
            .map(|x| x.parse::<f64>().expect("the script prints its sleep times") * 1000.0)
            .collect();
        let v = Viewer::load(&wall).unwrap();
        let (_, c) = thread_with(&v, "wait");
        for (caller, ms) in ["route_a", "route_b"].iter().zip(measured) {
            let under =
                c.count(|n| n.iter().any(|f| f == caller) && n.iter().any(|f| f == "wait")) as f64;
            assert!(
                (under - ms).abs() <= 0.05 * ms,
                "{label}: {under:.0} ms under {caller} -> step -> wait, the script slept {ms:.0} \
                 ms there"
            );
        }
    }
}

const POOL: &str = r#"
import multiprocessing as mp, time

def work(n):
    t = time.time()
    while time.time() - t < 0.5:
        pass
    return n

def run_map(pool):
    return pool.map(work, range(8))

if __name__ == "__main__":
    t0 = time.perf_counter()
    pool = mp.Pool(2)
    t1 = time.perf_counter()
    run_map(pool)
    t2 = time.perf_counter()
    pool.close()
    pool.join()
    print(t1 - t0, t2 - t1)
"#;

/// The main thread of a `multiprocessing.Pool` user waits in `pool.map` while the workers
/// compute: that wait is charged to `pool.map`, as long as the script measures it, and not to
/// where the thread blocked before (`Pool.__init__` starting its handler threads), nor shown as
/// waiting for the GIL.
#[test]
fn a_pool_map_wait_is_charged_to_pool_map() {
    require_root();
    let dir = scratch("offcpu_pool");
    for label in ["3.8.18", "3.12.1"] {
        let (profile, out) = profile_script(&dir, "pool", &python(label), POOL, &["-m", "wall"]);
        let times: Vec<f64> = out
            .split_whitespace()
            .map(|t| t.parse::<f64>().expect("the script prints its times") * 1000.0)
            .collect();
        let (init_ms, map_ms) = (times[0], times[1]);
        let v = Viewer::load(&profile).unwrap();
        let (t, c) = thread_with(&v, "run_map");
        let under_map = c.count(|n| n.iter().any(|f| f == "run_map")) as f64;
        let under_init = c.count(|n| n.iter().any(|f| f == "__init__" || f == "Pool.__init__"));
        assert!(
            (under_map - map_ms).abs() <= 0.03 * map_ms,
            "{label}: {under_map:.0} ms under run_map, the script spent {map_ms:.0} ms there"
        );
        assert!(
            (under_init as f64) <= init_ms + 50.0,
            "{label}: {under_init} ms under Pool.__init__, the script spent {init_ms:.0} ms there"
        );
        let gil = v
            .marker_totals(&t.handle)
            .unwrap()
            .get("Waiting for GIL")
            .map_or(0.0, |m| m.1);
        assert!(
            gil < 100.0,
            "{label}: {gil:.0} ms of Waiting for GIL markers"
        );
    }
}

const WAITERS: &str = r#"
import threading, time

ev = threading.Event()

def waiter():
    ev.wait()

ts = [threading.Thread(target=waiter) for _ in range(4)]
for t in ts:
    t.start()
time.sleep(2.0)
ev.set()
for t in ts:
    t.join()
print(" ".join(str(t.native_id) for t in ts))
"#;

/// Threads that block right after they start (before the profiler has read the interpreter's
/// thread list) keep their Python frames for the whole block: the BPF side finds a thread's
/// state itself when it is not in the map yet.
#[test]
fn threads_that_block_at_once_keep_their_python_frames() {
    require_root();
    let dir = scratch("offcpu_waiters");
    for label in ["3.8.18", "3.12.1", "3.13.0", "debian-3.15"] {
        let (profile, out) = profile_script(&dir, "waiters", &python(label), WAITERS, &[]);
        let tids: Vec<u64> = out
            .split_whitespace()
            .map(|t| t.parse().expect("the script prints its threads"))
            .collect();
        assert_eq!(tids.len(), 4, "{label}: {out}");
        let v = Viewer::load(&profile).unwrap();
        let threads = all_threads(&v);
        for tid in tids {
            let t = thread_by_tid(&threads, tid, label);
            let c = v.call_paths(&t.handle).unwrap();
            // `wait` before 3.11, `Event.wait` (its qualified name) after.
            let with_frames = c.count(|n| {
                n.iter().any(|f| f == "waiter")
                    && n.iter().any(|f| f == "wait" || f == "Event.wait")
            });
            assert!(
                c.total >= 1900 && with_frames as f64 >= 0.97 * c.total as f64,
                "{label} thread {tid}: {with_frames} of {} ms under waiter and Event.wait",
                c.total
            );
        }
    }
}

const CONTEND: &str = r#"
import json, threading, time

def run_delay():
    # The time this thread has spent runnable but not running, in s (`schedstat`).
    with open("/proc/thread-self/schedstat") as f:
        return int(f.read().split()[1]) / 1e9

def spin_worker(secs, out):
    w0, c0, d0 = time.monotonic(), time.thread_time(), run_delay()
    x = 0
    while time.monotonic() - w0 < secs:
        x += 1
    out.append((threading.get_native_id(), time.monotonic() - w0, time.thread_time() - c0,
                run_delay() - d0))

res = []
ts = [threading.Thread(target=spin_worker, args=(2.5, res)) for _ in range(2)]
for t in ts: t.start()
for t in ts: t.join()
print(json.dumps(res))
"#;

/// Two CPU-bound threads contend for the GIL: each holds it about half the time, the other
/// waits, and the waits add up to what each thread measures itself (wall time not on a CPU).
/// That measure also holds the time a thread waited for a CPU (preempted holding the GIL, or
/// woken and not yet running), which the thread reads too: on a machine busy with other work
/// (the profiler's own start), the two may differ by that much more (1,217 ms of GIL wait
/// against 1,375 ms off CPU once).
#[test]
fn gil_waits_match_what_threads_measure() {
    require_root();
    let dir = scratch("offcpu_gil");
    for label in [
        "3.8.18",
        "3.11.7",
        "3.12.1",
        "3.13.0",
        "debian-3.11",
        "debian-3.15",
    ] {
        let (profile, out) = profile_script(&dir, "contend", &python(label), CONTEND, &[]);
        let res: Vec<(u64, f64, f64, f64)> = serde_json::from_str(out.trim()).unwrap();
        let v = Viewer::load(&profile).unwrap();
        let threads = all_threads(&v);
        for (tid, wall, cpu, run_delay) in res {
            let t = thread_by_tid(&threads, tid, label);
            let m = v.marker_totals(&t.handle).unwrap();
            let total = |n: &str| m.get(n).map(|x| x.1).unwrap_or(0.0);
            let waited_ms = (wall - cpu) * 1000.0;
            let wait = total("Waiting for GIL");
            let delay_ms = run_delay * 1000.0;
            assert!(
                (wait - waited_ms).abs() <= 0.10 * waited_ms + delay_ms,
                "{label} thread {tid}: Waiting for GIL {wait:.0} ms, measured {waited_ms:.0} ms \
                 off CPU ({delay_ms:.0} ms of it waiting for a CPU)"
            );
            let has = total("Has GIL") / (wall * 1000.0);
            assert!(
                (0.35..=0.65).contains(&has),
                "{label} thread {tid}: holds the GIL {has:.2} of its time"
            );
            // The CPU graph follows the thread's own CPU time.
            assert!(
                (t.cpu_ms - cpu * 1000.0).abs() <= 0.05 * cpu * 1000.0,
                "{label} thread {tid}: CPU {:.0} ms in the profile, {:.0} ms measured",
                t.cpu_ms,
                cpu * 1000.0
            );
        }
    }
}

const GC_LOOP: &str = r#"
import gc, time

class Node:
    def __init__(self, prev):
        self.prev = prev
        self.cycle = self

def build(n):
    head = None
    for _ in range(n):
        head = Node(head)
    return head

gc.disable()  # only the explicit collections below
keep = build(300000)
in_gc = 0.0
t0 = time.perf_counter()
while time.perf_counter() - t0 < 2.5:
    s = time.perf_counter()
    gc.collect()
    in_gc += time.perf_counter() - s
print(in_gc)
"#;

#[test]
fn gc_collecting_markers_cover_collections() {
    require_root();
    let dir = scratch("offcpu_gc");
    for label in ["3.9.18", "3.12.1", "3.13.0", "debian-3.15"] {
        let (profile, out) = profile_script(&dir, "gc_loop", &python(label), GC_LOOP, &[]);
        let in_gc_ms: f64 = out.trim().parse::<f64>().unwrap() * 1000.0;
        let v = Viewer::load(&profile).unwrap();
        let (t, _) = thread_with(&v, "<module>");
        let m = v.marker_totals(&t.handle).unwrap();
        let gc = m.get("GC Collecting").map(|x| x.1).unwrap_or(0.0);
        assert!(
            gc >= 0.8 * in_gc_ms && gc <= 1.1 * in_gc_ms,
            "{label}: GC Collecting covers {gc:.0} ms of {in_gc_ms:.0} ms in gc.collect"
        );
    }
}

const EXCEPTIONS: &str = r#"
import time

def busy(secs):
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < secs:
        pass

def handler_work():
    try:
        raise ValueError("x")
    except ValueError:
        busy(0.05)

def plain_work():
    busy(0.05)

t0 = time.perf_counter()
while time.perf_counter() - t0 < 2.0:
    handler_work()
    plain_work()
"#;

#[test]
fn exception_mode_keeps_only_time_with_an_exception() {
    require_root();
    let dir = scratch("offcpu_exc");
    for label in [
        "3.8.18",
        "3.10.13",
        "3.11.7",
        "3.12.1",
        "3.13.0",
        "debian-3.15",
    ] {
        let (profile, _) = profile_script(
            &dir,
            "exceptions",
            &python(label),
            EXCEPTIONS,
            &["-m", "exception"],
        );
        let v = Viewer::load(&profile).unwrap();
        let (_, c) = thread_with(&v, "handler_work");
        let handler = c.count(|n| n.iter().any(|f| f == "handler_work"));
        let plain = c.count(|n| n.iter().any(|f| f == "plain_work"));
        assert!(
            handler >= 800,
            "{label}: {handler} ms inside the except block"
        );
        assert!(
            plain as f64 <= 0.02 * handler as f64,
            "{label}: {plain} ms without an exception kept (vs {handler})"
        );
        // The Exception track, as CPython's sampler draws it: about half the run (the except
        // block) has an exception, the other half (`plain_work`) none.
        let (t, _) = thread_with(&v, "handler_work");
        let m = v.marker_totals(&t.handle).unwrap();
        let with = m.get("Has Exception").map_or(0.0, |x| x.1);
        let without = m.get("No Exception").map_or(0.0, |x| x.1);
        let share = with / (with + without).max(1.0);
        assert!(
            (0.4..=0.6).contains(&share) && with >= 0.9 * handler as f64,
            "{label}: Has Exception {with:.0} ms, No Exception {without:.0} ms, \
             {handler} ms sampled in the except block"
        );
    }
}

fn epoch_ms() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
        * 1000.0
}

const THREADS: &str = r#"
import hashlib, json, threading, time

def hash_worker(out):
    c0 = time.thread_time()
    data = b"x" * (1 << 20)
    t0 = time.monotonic()
    while time.monotonic() - t0 < 5.0:
        hashlib.sha256(data).digest()
    out.append((threading.get_native_id(), time.thread_time() - c0))

res = []
ts = [threading.Thread(target=hash_worker, args=(res,)) for _ in range(8)]
for t in ts: t.start()
for t in ts: t.join()
print(json.dumps(res))
"#;

/// `--all-pythons` for 10 s: a short-lived interpreter has its true start and end times, and 8
/// busy threads (hashing without the GIL, so all 8 compete for 2 CPUs) have the CPU time they
/// measure themselves.
#[test]
fn lifetimes_and_cpu_use_in_all_pythons() {
    require_root();
    let dir = scratch("offcpu_all");
    let out = dir.join("all.json");
    let short = dir.join("short_lived.py");
    std::fs::write(
        &short,
        "import time\nt0 = time.monotonic()\nwhile time.monotonic() - t0 < 1.5: pass\n",
    )
    .unwrap();
    let busy = dir.join("threads8.py");
    std::fs::write(&busy, THREADS).unwrap();
    let mut prof = Command::new(profiler_bin())
        .args([
            "--all-pythons",
            "-d",
            "10",
            "-q",
            "-o",
            out.to_str().unwrap(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The profile's clock starts once the profiler is attached; give it time.
    std::thread::sleep(Duration::from_millis(1500));
    let py = python("3.12.1");
    let t_start = epoch_ms();
    let mut c = Command::new(&py).arg(&short).spawn().unwrap();
    c.wait().unwrap();
    let t_end = epoch_ms();
    let o = Command::new(python("3.11.7")).arg(&busy).output().unwrap();
    assert!(o.status.success());
    let res: Vec<(u64, f64)> = serde_json::from_slice(&o.stdout).unwrap();
    wait_timeout(&mut prof, Duration::from_secs(60));
    let p: serde_json::Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    let profile_epoch = p["meta"]["startTime"].as_f64().unwrap();

    let v = Viewer::load(&out).unwrap();
    let procs = v.processes().unwrap();
    let sp = procs
        .iter()
        .find(|p| p.name.contains("short_lived.py"))
        .expect("the short-lived interpreter is in the profile");
    let start = profile_epoch + sp.start_ms;
    let end = profile_epoch + sp.end_ms.expect("it ended during the run");
    assert!(
        (start - t_start).abs() <= 50.0,
        "start {start:.0} vs {t_start:.0}"
    );
    assert!((end - t_end).abs() <= 50.0, "end {end:.0} vs {t_end:.0}");

    let threads: Vec<&ThreadInfo> = procs.iter().flat_map(|p| &p.threads).collect();
    assert_eq!(res.len(), 8);
    for (tid, cpu) in res {
        let t = threads
            .iter()
            .find(|t| t.tid == tid)
            .unwrap_or_else(|| panic!("worker {tid} is in the profile"));
        let cpu_ms = cpu * 1000.0;
        assert!(
            (t.cpu_ms - cpu_ms).abs() <= 0.05 * cpu_ms,
            "thread {tid}: CPU {:.0} ms in the profile, {cpu_ms:.0} ms measured",
            t.cpu_ms
        );
    }
}

const SWITCHERS: &str = r#"
import json, queue, threading, time

out = {}

def measured(fn):
    def run(*args):
        t0 = time.monotonic()
        c0 = time.thread_time()
        fn(*args)
        out[threading.get_native_id()] = (fn.__name__, time.monotonic() - t0, time.thread_time() - c0)
    return run

@measured
def pinger(a, b, stop):
    while time.monotonic() < stop:
        a.put(1)
        b.get()
    a.put(None)

@measured
def ponger(a, b):
    while a.get() is not None:
        b.put(1)

@measured
def napper(stop):
    # Long intervals: 3 ms naps between 1 ms bursts.
    while time.monotonic() < stop:
        t = time.monotonic()
        while time.monotonic() - t < 0.001:
            pass
        time.sleep(0.003)

@measured
def dozer(stop):
    # Short intervals: naps of 100 µs, thousands a second.
    while time.monotonic() < stop:
        time.sleep(0.0001)

stop = time.monotonic() + 4.0
a, b = queue.Queue(), queue.Queue()
ts = [threading.Thread(target=pinger, args=(a, b, stop)),
      threading.Thread(target=ponger, args=(a, b)),
      threading.Thread(target=napper, args=(stop,)),
      threading.Thread(target=dozer, args=(stop,))]
for t in ts: t.start()
for t in ts: t.join()
print(json.dumps(out))
"#;

/// Threads that switch tens of thousands of times a second (a queue ping-pong, 100 µs naps) and
/// threads whose blocks each last longer than a sampling period: each thread's off-CPU time in
/// the profile (its wall-mode total less its cpu-mode total, the same recording converted twice)
/// is within 1% of the scheduler's (its lifetime less the CPU time it measures itself).
#[test]
fn off_cpu_time_matches_the_scheduler_at_any_switch_rate() {
    require_root();
    let dir = scratch("offcpu_switchers");
    let script = dir.join("switchers.py");
    std::fs::write(&script, SWITCHERS).unwrap();
    let rec = dir.join("run.tbpf");
    let py = python("3.12.1");
    let o = run_profiler(
        &[
            "record",
            "-q",
            "-o",
            rec.to_str().unwrap(),
            "--",
            py.to_str().unwrap(),
            script.to_str().unwrap(),
        ],
        Duration::from_secs(90),
    );
    assert!(o.status.success(), "{}", stderr_of(&o));
    let measured: std::collections::HashMap<String, (String, f64, f64)> =
        serde_json::from_slice(&o.stdout).expect("the script's measurements");
    assert_eq!(measured.len(), 4);
    let mut totals = Vec::new();
    for mode in ["wall", "cpu"] {
        let out = dir.join(format!("{mode}.json"));
        let c = run_profiler(
            &[
                "convert",
                rec.to_str().unwrap(),
                "-m",
                mode,
                "-o",
                out.to_str().unwrap(),
            ],
            Duration::from_secs(60),
        );
        assert!(c.status.success(), "{}", stderr_of(&c));
        let v = Viewer::load(&out).unwrap();
        let threads = all_threads(&v);
        let mut by_tid = std::collections::HashMap::new();
        for (tid, (name, _, _)) in &measured {
            let t = thread_by_tid(&threads, tid.parse().unwrap(), name);
            by_tid.insert(name.clone(), v.call_paths(&t.handle).unwrap().total as f64);
        }
        totals.push(by_tid);
    }
    for (name, life, cpu) in measured.values() {
        let truth = (life - cpu) * 1000.0;
        let got = totals[0][name] - totals[1][name];
        eprintln!("{name}: profile {got:.1} truth {truth:.1}");
        assert!(
            truth > 500.0,
            "{name}: off CPU for {truth:.0} ms of {:.0}",
            life * 1000.0
        );
        assert!(
            (got - truth).abs() <= 0.01 * truth,
            "{name}: {got:.0} ms off CPU in the profile, {truth:.0} ms by the scheduler \
             (lifetime {:.0} ms, CPU {:.0} ms)",
            life * 1000.0,
            cpu * 1000.0
        );
    }
}

const BLOCKER: &str = r#"
import time
t0 = time.monotonic()
for _ in range(20):
    time.sleep(0.05)
print(time.monotonic() - t0)
"#;

/// Wall mode's capture of blocked threads needs the kernel's `sched_exit_tp` or a kprobe. The
/// compat set always uses the kprobe: where the kernel has kprobes, the blocked time is charged
/// to `time.sleep`; where it has none (this CI's kernel), the run goes on with a warning and
/// charges the same time to `[off-CPU, stack not captured]`, never loses it.
#[test]
fn wall_mode_without_a_switch_in_probe_keeps_the_blocked_time() {
    require_root();
    let has_kprobes = Path::new("/sys/bus/event_source/devices/kprobe/type").exists();
    let dir = scratch("offcpu_no_switch_in");
    let py = python("3.12.1");
    let file = dir.join("blocker.py");
    std::fs::write(&file, BLOCKER).unwrap();
    let out = dir.join("blocker.json");
    let o = profile_command(
        &out,
        &["--compat-programs"],
        &[py.to_str().unwrap(), file.to_str().unwrap()],
    );
    let err = stderr_of(&o);
    let slept_ms: f64 = String::from_utf8_lossy(&o.stdout)
        .trim()
        .parse::<f64>()
        .expect("the script's time")
        * 1000.0;
    let warned = err.contains("warning: no off-CPU stacks");
    assert_eq!(
        warned, !has_kprobes,
        "kprobes {has_kprobes}, warning {warned}: {err}"
    );
    let v = Viewer::load(&out).unwrap();
    let (_, c) = thread_with(&v, "<module>");
    let asleep = c.count(|n| n.iter().any(|f| f == "sleep" || f.ends_with("time_sleep")));
    let uncaptured = c.count(|n| n.iter().any(|f| f == "[off-CPU, stack not captured]"));
    let blocked = if has_kprobes { asleep } else { uncaptured } as f64;
    assert!(
        (blocked - slept_ms).abs() <= 0.1 * slept_ms,
        "kprobes {has_kprobes}: {blocked:.0} ms of blocked time charged, the script slept \
         {slept_ms:.0} ms (asleep {asleep}, uncaptured {uncaptured})"
    );
}

/// The programs that ran, as the summary's "BPF time by program" names them.
fn programs_that_ran(stderr: &str) -> Vec<String> {
    let line = stderr
        .lines()
        .find_map(|l| l.strip_prefix("tachyon-bpf: BPF time by program: "))
        .unwrap_or_else(|| panic!("no BPF time by program in the summary:\n{stderr}"));
    line.split(", ")
        .filter_map(|p| p.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

/// In cpu mode, the scheduler's accounting (a program on every context switch of the host)
/// runs only when an output shows each thread's CPU use over time: the Firefox Profiler's
/// format does, folded stacks and pprof do not, and their samples are the same.
#[test]
fn cpu_mode_accounts_switches_only_for_outputs_that_show_cpu_use() {
    require_root();
    let dir = scratch("cpu_mode_switches");
    let script = dir.join("switcher.py");
    std::fs::write(
        &script,
        "import time\n\ndef work():\n    return sum(i * i for i in range(20000))\n\n\
         for _ in range(300):\n    work()\n    time.sleep(0.002)\n",
    )
    .unwrap();
    let py = python("3.12.1");
    let (py, script) = (py.to_str().unwrap(), script.to_str().unwrap());
    let folded = dir.join("cpu.folded");
    let o = profile_command(
        &folded,
        &["-m", "cpu", "-f", "collapsed", "-r", "1000"],
        &[py, script],
    );
    let ran = programs_that_ran(&stderr_of(&o));
    assert!(
        ran.iter().any(|p| p.starts_with("tachyon_sample")),
        "{ran:?}"
    );
    assert!(
        !ran.iter().any(|p| p.starts_with("tachyon_switch")),
        "folded stacks in cpu mode ran a switch program: {ran:?}"
    );
    let text = std::fs::read_to_string(&folded).unwrap();
    let in_work: u64 = text
        .lines()
        .filter(|l| l.contains("switcher.py:work"))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<u64>().ok())
        .sum();
    assert!(in_work > 0, "no samples in work():\n{text}");

    let gecko = dir.join("cpu.json");
    let o = profile_command(&gecko, &["-m", "cpu", "-r", "1000"], &[py, script]);
    let ran = programs_that_ran(&stderr_of(&o));
    assert!(
        ran.iter().any(|p| p.starts_with("tachyon_switch")),
        "the Firefox Profiler's format in cpu mode ran no switch program: {ran:?}"
    );
}
