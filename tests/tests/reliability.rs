//! Reliability: a target that corrupts its own interpreter while profiled, process churn under
//! --all-pythons, overload at the highest rate, and every way of stopping (SIGINT, SIGTERM, a
//! second SIGINT, SIGKILL) keeping the profile whole and releasing the BPF programs.

use std::collections::HashMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use tachyon_bpf_tests::*;

/// Corrupts its own interpreter through ctypes (CPython 3.12 layouts) and repairs it after
/// each phase, so the target survives: a frame whose `previous` points to itself, a code object
/// whose name claims 2**40 characters, a line table cut to one byte.
const HOSTILE: &str = r#"
import ctypes, sys, time

def spin(secs):
    t0 = time.perf_counter()
    x = 0
    while time.perf_counter() - t0 < secs:
        x += 1
    return x

def normal_work(secs):
    t0 = time.perf_counter()
    x = 0
    while time.perf_counter() - t0 < secs:
        x += 1
    return x

def caller_interp_frame():
    f = sys._getframe(1)
    # PyFrameObject: ob_refcnt, ob_type, f_back, f_frame
    return ctypes.c_void_p.from_address(id(f) + 24).value

def looping_chain(secs):
    addr = caller_interp_frame()
    previous = ctypes.c_void_p.from_address(addr + 8)  # _PyInterpreterFrame.previous
    saved = previous.value
    previous.value = addr
    t0 = time.perf_counter()
    x = 0
    while time.perf_counter() - t0 < secs:
        x += 1
    previous.value = saved
    return x

def with_code(fn, **changes):
    return type(fn)(fn.__code__.replace(**changes), fn.__globals__, fn.__name__)

def main():
    normal_work(0.7)
    looping_chain(0.7)
    huge = with_code(spin, co_name="".join(["huge", "_name"]), co_qualname="".join(["huge", "_q"]))
    n1 = ctypes.c_ssize_t.from_address(id(huge.__code__.co_name) + 16)
    n2 = ctypes.c_ssize_t.from_address(id(huge.__code__.co_qualname) + 16)
    saved = (n1.value, n2.value)
    n1.value = n2.value = 1 << 40
    huge(0.7)
    n1.value, n2.value = saved
    table = bytes(bytearray(spin.__code__.co_linetable))
    cut = with_code(spin, co_linetable=table, co_qualname="cut_table")
    size = ctypes.c_ssize_t.from_address(id(cut.__code__.co_linetable) + 16)
    saved = size.value
    size.value = 1
    cut(0.7)
    size.value = saved
    normal_work(0.7)
    print("survived")

main()
"#;

#[test]
fn a_target_corrupting_its_interpreter() {
    require_root();
    let dir = scratch("hostile");
    let script = dir.join("hostile.py");
    std::fs::write(&script, HOSTILE).unwrap();
    let out = dir.join("hostile.json");
    let o = profile_command(
        &out,
        &[],
        &[python("3.12.1").to_str().unwrap(), script.to_str().unwrap()],
    );
    let err = stderr_of(&o);
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("survived"),
        "the target ran to its end"
    );
    assert!(
        err.contains("unreadable target data"),
        "the summary counts it: {err}"
    );
    assert!(
        !err.contains("tachyon-bpf: bpf:"),
        "the BPF programs log nothing without --debug-bpf: {err}"
    );
    let p: Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    let t = &p["meta"]["tachyon"];
    let n = |k: &str| t[k].as_u64().unwrap_or(0);
    // Each phase lasts 0.7 s at 1 kHz: most of its samples are counted as what they were.
    assert!(n("pythonCycles") >= 400, "looping chains counted: {t}");
    assert!(
        n("pythonUnresolvedFrames") >= 400,
        "unreadable names counted: {t}"
    );
    assert!(
        n("pythonBadLineTables") >= 400,
        "cut line tables counted: {t}"
    );

    // The rest of the profile is right.
    let v = Viewer::load(&out).unwrap();
    let (_, c) = v
        .processes()
        .unwrap()
        .into_iter()
        .flat_map(|p| p.threads)
        .map(|t| {
            let c = v.call_paths(&t.handle).unwrap();
            (t, c)
        })
        .max_by_key(|(_, c)| c.total)
        .unwrap();
    let normal = c.with_sequence(&["main", "normal_work"]);
    assert!(
        (1200..=1600).contains(&normal),
        "normal_work under main for 1.4 s: {normal}"
    );
    let looping = c.count(|n| n.iter().any(|f| f == "looping_chain"));
    assert!(
        looping >= 500,
        "the looping frame itself is shown: {looping}"
    );
    let cut = c.count(|n| {
        n.last().is_some_and(|f| f == "cut_table") || n.iter().any(|f| f == "cut_table")
    });
    assert!(
        cut >= 500,
        "the function with a cut line table is named: {cut}"
    );
}

/// A Python thread whose innermost frame is its own `previous` (CPython 3.12), for 1.5 s of CPU.
/// It prints its pid and that frame's address first.
const LOOPING_CHAIN: &str = r#"
import ctypes, os, sys, time

def looping_chain(secs):
    f = sys._getframe()
    addr = ctypes.c_void_p.from_address(id(f) + 24).value  # PyFrameObject.f_frame
    previous = ctypes.c_void_p.from_address(addr + 8)  # _PyInterpreterFrame.previous
    saved = previous.value
    print(os.getpid(), format(addr, "x"), flush=True)
    previous.value = addr
    t0 = time.perf_counter()
    x = 0
    while time.perf_counter() - t0 < secs:
        x += 1
    previous.value = saved
    return x

looping_chain(1.5)
"#;

/// `--debug-bpf`: the sampler logs, through aya-log, the thread and the frame at which the
/// chain loops, the first few times on each CPU, and the summary counts the rest.
#[test]
fn bpf_logs_name_the_frame_where_a_chain_loops() {
    require_root();
    let dir = scratch("bpf_logs");
    let script = dir.join("looping.py");
    std::fs::write(&script, LOOPING_CHAIN).unwrap();
    let out = dir.join("looping.json");
    let o = profile_command(
        &out,
        &["--debug-bpf"],
        &[python("3.12.1").to_str().unwrap(), script.to_str().unwrap()],
    );
    let err = stderr_of(&o);
    let stdout = String::from_utf8_lossy(&o.stdout);
    let (pid, addr) = stdout
        .split_whitespace()
        .collect::<Vec<_>>()
        .get(..2)
        .map(|w| (w[0].to_string(), w[1].to_string()))
        .expect("the target prints its pid and frame");
    let want = format!(
        "tachyon-bpf: bpf: pid {pid} tid {pid}: Python frame chain loops at frame 0 ({addr})"
    );
    let logged = err.lines().filter(|l| *l == want).count();
    let cpus = std::thread::available_parallelism().unwrap().get();
    assert!(
        (1..=4 * cpus).contains(&logged),
        "the loop is logged with its frame, at most 4 times a CPU ({logged}): {err}"
    );
    let unlogged: u64 = err
        .lines()
        .find_map(|l| {
            l.strip_prefix(
                "tachyon-bpf: bpf: not logged (beyond the first 4 of each kind per CPU): ",
            )
        })
        .and_then(|rest| {
            rest.split(", ")
                .find_map(|k| k.strip_prefix("frame chain loops "))
                .and_then(|n| n.parse().ok())
        })
        .unwrap_or_else(|| panic!("the rest are counted: {err}"));
    let p: Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    let cycles = p["meta"]["tachyon"]["pythonCycles"].as_u64().unwrap_or(0);
    assert!(
        cycles >= 1000,
        "1.5 s of samples at 1 kHz saw the loop: {cycles}"
    );
    // Every record of the loop is either logged or counted as not logged; records the full
    // ring refused (`lost`) were logged or counted but never read.
    let lost = p["meta"]["tachyon"]["lost"].as_u64().unwrap_or(0);
    let seen = logged as u64 + unlogged;
    assert!(
        cycles <= seen && seen <= cycles + lost,
        "logged {logged} + not logged {unlogged} against {cycles} records with the loop and \
         {lost} lost: {err}"
    );
}

/// A busy Python process for the stop tests, and the profiler on it (`scope`: what to profile
/// instead of its pid).
fn start_on_busy(dir: &Path, name: &str, scope: &[&str]) -> (Child, Child, std::path::PathBuf) {
    let script = dir.join("busy.py");
    std::fs::write(
        &script,
        "import time\ndef busy_loop():\n    while True:\n        sum(range(1000))\nbusy_loop()\n",
    )
    .unwrap();
    let target = Command::new(python("3.11.7"))
        .arg(&script)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let out = dir.join(format!("{name}.json"));
    let pid = target.id().to_string();
    let mut args = if scope.is_empty() {
        vec!["-p", pid.as_str()]
    } else {
        scope.to_vec()
    };
    args.push("-q");
    if !args.contains(&"-o") {
        args.extend(["-o", out.to_str().unwrap()]);
    }
    let prof = Command::new(profiler_bin())
        .args(&args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    (target, prof, out)
}

fn signal(child: &Child, sig: i32) {
    // SAFETY: signalling a child process of this test.
    unsafe { libc::kill(child.id() as i32, sig) };
}

/// Whatever exists under the output name is a complete profile.
fn whole_or_absent(out: &Path) -> Option<Value> {
    let bytes = std::fs::read(out).ok()?;
    Some(serde_json::from_slice(&bytes).expect("a file under the output name is complete"))
}

#[test]
fn sigint_and_sigterm_write_the_whole_profile() {
    require_root();
    let dir = scratch("stop_signals");
    let baseline = bpf_program_count();
    for (name, sig) in [("int", libc::SIGINT), ("term", libc::SIGTERM)] {
        let (mut target, mut prof, out) = start_on_busy(&dir, name, &[]);
        std::thread::sleep(Duration::from_secs(2));
        assert!(
            bpf_program_count() > baseline,
            "the profiler's programs are loaded"
        );
        signal(&prof, sig);
        wait_timeout(&mut prof, Duration::from_secs(20));
        let st = prof.wait().unwrap();
        let _ = target.kill();
        let _ = target.wait();
        assert_eq!(st.code(), Some(0), "{name}: a clean stop");
        let p = whole_or_absent(&out).expect("the profile is written");
        assert!(p["meta"]["tachyon"]["samples"].as_u64().unwrap() > 1000);
        let v = Viewer::load(&out).unwrap();
        let t = v
            .processes()
            .unwrap()
            .into_iter()
            .flat_map(|p| p.threads)
            .next()
            .unwrap();
        let c = v.call_paths(&t.handle).unwrap();
        assert!(c.with_sequence(&["busy_loop"]) as f64 > 0.8 * c.total as f64);
        let left = bpf_programs_back_to(baseline, Duration::from_secs(5));
        assert_eq!(left, baseline, "{name}: every BPF program released");
    }
}

#[test]
fn a_second_sigint_and_sigkill_never_leave_a_partial_file() {
    require_root();
    let dir = scratch("stop_hard");
    let baseline = bpf_program_count();
    // A second Ctrl-C right after the first: out at once (130), or done (0), never stuck.
    for delay_ms in [0u64, 20, 100] {
        let name = format!("twice{delay_ms}");
        let (mut target, mut prof, out) = start_on_busy(&dir, &name, &["--all"]);
        std::thread::sleep(Duration::from_secs(2));
        signal(&prof, libc::SIGINT);
        std::thread::sleep(Duration::from_millis(delay_ms));
        signal(&prof, libc::SIGINT);
        let t0 = Instant::now();
        wait_timeout(&mut prof, Duration::from_secs(20));
        let st = prof.wait().unwrap();
        let _ = target.kill();
        let _ = target.wait();
        assert!(
            matches!(st.code(), Some(0) | Some(130)),
            "second SIGINT: {st:?}"
        );
        if st.code() == Some(130) {
            assert!(t0.elapsed() < Duration::from_secs(2), "exits at once");
            whole_or_absent(&out);
        } else {
            // Done before the second signal: then the profile is there, whole.
            assert!(whole_or_absent(&out).is_some(), "exit 0 wrote the profile");
        }
    }
    // SIGKILL at points through the stop and the write: nothing partial under the final name.
    for delay_ms in [0u64, 30, 80, 150, 300] {
        let name = format!("kill{delay_ms}");
        let (mut target, mut prof, out) = start_on_busy(&dir, &name, &["--all"]);
        std::thread::sleep(Duration::from_secs(2));
        signal(&prof, libc::SIGINT);
        std::thread::sleep(Duration::from_millis(delay_ms));
        signal(&prof, libc::SIGKILL);
        let _ = prof.wait();
        let _ = target.kill();
        let _ = target.wait();
        whole_or_absent(&out);
    }
    let left = bpf_programs_back_to(baseline, Duration::from_secs(5));
    assert_eq!(left, baseline, "every BPF program released after kills");
}

/// Each churn child: its own script and function, which runs `secs` seconds, half busy, half
/// asleep, and prints how long it ran (the time the profile must cover; the process's life
/// adds its start-up and exit).
fn churn_script(i: usize) -> String {
    format!(
        "import sys, time\n\
         def fn_{i}(secs):\n    \
             t0 = time.monotonic()\n    \
             while time.monotonic() - t0 < secs:\n        \
                 t1 = time.monotonic()\n        \
                 while time.monotonic() - t1 < 0.005: pass\n        \
                 time.sleep(0.005)\n    \
             return time.monotonic() - t0\n\
         print(fn_{i}(float(sys.argv[1])))\n"
    )
}

#[test]
fn churn_of_short_lived_interpreters() {
    require_root();
    let dir = scratch("churn");
    const N: usize = 300;
    for i in 0..N {
        std::fs::write(dir.join(format!("churn_{i}.py")), churn_script(i)).unwrap();
    }
    let out = dir.join("churn.json");
    let folded = dir.join("churn.folded");
    let log_file = dir.join("churn.log");
    let mut prof = Command::new(profiler_bin())
        .args(["--all-pythons", "-d", "20", "-f", "gecko,collapsed", "-o"])
        .arg(dir.join("churn"))
        // Kept for a failure's message: when each process was found.
        .env(
            "RUST_LOG",
            "tachyon_bpf::python::registry=debug,tachyon_bpf::session=debug",
        )
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log_file).unwrap())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let py = python("3.12.1");
    // 300 interpreters over about 16 s, each 50-200 ms, at most a few at a time.
    let mut running: Vec<(usize, Child)> = Vec::new();
    // Per pid: its script, and how long its function ran.
    let mut ran: HashMap<u32, (usize, Duration)> = HashMap::new();
    let mut finish = |i: usize, c: Child| {
        let pid = c.id();
        let o = c.wait_with_output().unwrap();
        assert!(o.status.success(), "churn_{i}.py: {}", stderr_of(&o));
        let secs: f64 = String::from_utf8_lossy(&o.stdout).trim().parse().unwrap();
        ran.insert(pid, (i, Duration::from_secs_f64(secs)));
    };
    for i in 0..N {
        let secs = 0.05 + 0.15 * ((i * 37) % 100) as f64 / 100.0;
        let c = Command::new(&py)
            .arg(dir.join(format!("churn_{i}.py")))
            .arg(format!("{secs}"))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        running.push((i, c));
        std::thread::sleep(Duration::from_millis(52));
        let mut still = Vec::new();
        for (i, mut c) in running.drain(..) {
            match c.try_wait().unwrap() {
                Some(_) => finish(i, c),
                None => still.push((i, c)),
            }
        }
        running = still;
    }
    for (i, c) in running {
        finish(i, c);
    }
    wait_timeout(&mut prof, Duration::from_secs(60));
    let o = prof.wait_with_output().unwrap();
    let log = std::fs::read_to_string(&log_file).unwrap_or_default();
    assert!(o.status.success(), "{log}");
    assert!(out.exists());
    let text = std::fs::read_to_string(&folded).unwrap();
    // Per pid: the churn functions seen in its stacks.
    let mut seen: HashMap<u32, HashMap<usize, u64>> = HashMap::new();
    for line in text.lines() {
        let (stack, n) = line.rsplit_once(' ').unwrap();
        let n: u64 = n.parse().unwrap();
        let root = stack.split(';').next().unwrap();
        let Some(pid) = root
            .rsplit_once("[pid ")
            .and_then(|(_, r)| r.trim_end_matches(']').parse::<u32>().ok())
        else {
            continue;
        };
        for f in stack.split(';') {
            if let Some(rest) = f.split(":fn_").nth(1) {
                let j: usize = rest.split(':').next().unwrap().parse().unwrap();
                *seen.entry(pid).or_default().entry(j).or_default() += n;
            }
        }
    }
    // A function that ran 100 ms or more (100 samples and more at 1 kHz) is in the profile:
    // the process is found at its exec, before its start-up imports are done.
    let mut missing = Vec::new();
    for (pid, (i, took)) in &ran {
        let funcs = seen.get(pid);
        if let Some(f) = funcs {
            let others: Vec<&usize> = f.keys().filter(|j| *j != i).collect();
            assert!(
                others.is_empty(),
                "pid {pid} ran churn_{i}.py but shows fn_{others:?}"
            );
        }
        if *took >= Duration::from_millis(100) && !funcs.is_some_and(|f| f.contains_key(i)) {
            missing.push((*pid, *i, *took));
        }
    }
    let shown: Vec<&str> = text
        .lines()
        .filter(|l| {
            missing
                .iter()
                .any(|(pid, _, _)| l.contains(&format!("[pid {pid}]")))
        })
        .take(20)
        .collect();
    let about_missing: Vec<&str> = log
        .lines()
        .filter(|l| {
            l.starts_with("tachyon-bpf: ")
                || missing
                    .iter()
                    .any(|(pid, _, _)| l.contains(&format!("pid {pid}:")))
        })
        .take(40)
        .collect();
    let lag = std::fs::read_to_string(&out)
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .map(|p| p["meta"]["tachyon"]["maxReaderLagMs"].clone());
    assert!(
        missing.is_empty(),
        "functions that ran 100 ms or more and are not in the profile: {missing:?}; the \
         reader was behind by up to {lag:?} ms; their processes' stacks:\n{}\nthe \
         profiler's log of them:\n{}",
        shown.join("\n"),
        about_missing.join("\n")
    );
    assert!(
        seen.len() >= N / 2,
        "most interpreters were profiled with their functions: {}",
        seen.len()
    );
}

#[test]
fn overload_at_the_highest_rate() {
    require_root();
    let dir = scratch("overload");
    let script = dir.join("threads.py");
    std::fs::write(
        &script,
        "import threading, time\n\
         def hot():\n    t0 = time.monotonic()\n    while time.monotonic() - t0 < 30: pass\n\
         ts = [threading.Thread(target=hot) for _ in range(2)]\n\
         [t.start() for t in ts]\n[t.join() for t in ts]\n",
    )
    .unwrap();
    let procs: Vec<Child> = (0..8)
        .map(|_| Command::new(python("3.12.1")).arg(&script).spawn().unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let out = dir.join("overload.json");
    let t0 = Instant::now();
    let o = run_profiler(
        &[
            "--all-pythons",
            "-r",
            "100000",
            "-d",
            "4",
            "--ring-mb",
            "1",
            "-o",
            out.to_str().unwrap(),
        ],
        Duration::from_secs(120),
    );
    let took = t0.elapsed();
    // Ctrl-C is heard under the same overload.
    let sigint_out = dir.join("overload_sigint.json");
    let mut prof = Command::new(profiler_bin())
        .args([
            "--all-pythons",
            "-r",
            "100000",
            "--ring-mb",
            "1",
            "-q",
            "-o",
        ])
        .arg(&sigint_out)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(3));
    let t1 = Instant::now();
    signal(&prof, libc::SIGINT);
    wait_timeout(&mut prof, Duration::from_secs(60));
    let heard = t1.elapsed();
    // The threads (30 s) outlive both runs: the profile holds their busy phase, not their
    // interpreters' shutdown.
    for mut p in procs {
        let _ = p.kill();
        let _ = p.wait();
    }
    let err = stderr_of(&o);
    assert!(o.status.success(), "{err}");
    // `-d 4` ends the run near 4 s however full the ring stays: the runtime's timers and
    // signals were held back by an always-readable ring until the threads ended (30 s).
    assert!(took < Duration::from_secs(15), "-d 4 took {took:?}");
    assert!(
        prof.wait().unwrap().success() && whole_or_absent(&sigint_out).is_some(),
        "a clean stop on SIGINT, with its profile"
    );
    assert!(
        heard < Duration::from_secs(10),
        "SIGINT heard after {heard:?}"
    );
    eprintln!("overload: -d 4 took {took:?}, SIGINT ended the run in {heard:?}");
    // The summary reports the loss, per CPU.
    let lost_line = err
        .lines()
        .find(|l| l.contains(" lost "))
        .unwrap_or_else(|| panic!("a summary with the loss: {err}"));
    assert!(lost_line.contains("cpu0 "), "loss per CPU: {lost_line}");
    let p: Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    // A reader that fell behind says so.
    let lag = p["meta"]["tachyon"]["maxReaderLagMs"].as_f64().unwrap();
    assert_eq!(
        lag > 1000.0,
        err.contains("the reader fell behind by up to"),
        "lag {lag} ms and the summary: {err}"
    );
    let lost = p["meta"]["tachyon"]["lost"].as_u64().unwrap();
    let samples = p["meta"]["tachyon"]["samples"].as_u64().unwrap();
    assert!(samples > 0);
    eprintln!("overload: {samples} samples kept, {lost} lost");
    let v = Viewer::load(&out).unwrap();
    let threads: Vec<ThreadInfo> = v
        .processes()
        .unwrap()
        .into_iter()
        .filter(|p| p.name.contains("threads.py"))
        .flat_map(|p| p.threads)
        .collect();
    assert!(
        threads.len() >= 16,
        "16 busy threads in the profile: {}",
        threads.len()
    );
    // Whatever was kept is whole: Python frames under the busy threads' native stacks. Blocks
    // (GIL waits) whose capture the full ring refused are time without a stack, said as such
    // and counted, never an older stack: they are not part of what was kept.
    let (mut hot, mut total, mut uncaptured) = (0, 0, 0);
    for t in &threads {
        let c = v.call_paths(&t.handle).unwrap();
        hot += c.with_sequence(&["hot"]);
        uncaptured += c.with_sequence(&["[off-CPU, stack not captured]"]);
        total += c.total;
    }
    let counted = p["meta"]["tachyon"]["bpfCounters"]["offUncaptured"]
        .as_u64()
        .unwrap();
    assert!(
        uncaptured == 0 || counted > 0,
        "{uncaptured} ms without a stack, none counted"
    );
    let kept = total - uncaptured;
    eprintln!("overload: {uncaptured} of {total} ms without a stack ({counted} blocks counted)");
    // Samples stop at three quarters of the ring, so captures of blocks find room: time without
    // a stack stays small. What is left of it is the reader's: a capture needs a record read,
    // and the reader has a 1/17 share of the CPUs here (0.5-9% measured with 16 threads; with
    // 64, a 1/65 share, 2-57%).
    assert!(
        uncaptured * 5 <= total,
        "{uncaptured} of {total} ms without a stack under overload"
    );
    assert!(
        hot as f64 > 0.5 * kept as f64,
        "Python frames under load: {hot} of {kept} ({uncaptured} ms without a stack)"
    );
}

#[test]
fn a_second_sigint_while_writing_exits_at_once() {
    require_root();
    let dir = scratch("stop_while_writing");
    // Five formats are written one after another: once the first is in place, the others are
    // still being rendered, so a second Ctrl-C then lands in the middle of the writing.
    let base = dir.join("run");
    let base_s = base.to_str().unwrap().to_string();
    let (mut target, mut prof, _) = start_on_busy(
        &dir,
        "unused",
        &[
            "--all",
            "-r",
            "4000",
            "-f",
            "gecko,collapsed,jsonl,pprof,flamegraph",
            "-o",
            &base_s,
        ],
    );
    std::thread::sleep(Duration::from_secs(3));
    signal(&prof, libc::SIGINT);
    let first = dir.join("run.json");
    let t0 = Instant::now();
    while !first.exists() && t0.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_micros(200));
    }
    assert!(first.exists(), "the first format was written");
    signal(&prof, libc::SIGINT);
    let t1 = Instant::now();
    wait_timeout(&mut prof, Duration::from_secs(20));
    let st = prof.wait().unwrap();
    let took = t1.elapsed();
    let _ = target.kill();
    let _ = target.wait();
    assert_eq!(
        st.code(),
        Some(130),
        "the second Ctrl-C interrupts the writing"
    );
    assert!(took < Duration::from_millis(500), "at once: {took:?}");
    assert!(
        !dir.join("run.svg").exists(),
        "the last format was not written after the second Ctrl-C"
    );
    // Whatever is under a final name is whole.
    let _: Value = serde_json::from_slice(&std::fs::read(&first).unwrap()).unwrap();
}
