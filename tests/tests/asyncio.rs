//! `--async-aware`: asyncio programs profiled for real and read back through the Firefox
//! Profiler CLI. Samples of an event loop's thread show the running task's coroutine frames
//! under `<task> NAME` frames of that task and of each task awaiting it, outermost first, in
//! place of the loop's machinery: on 3.14+ from asyncio's debug offsets, on 3.11-3.13 from
//! tables and the loop's `Handle._run`. Earlier versions say so and are shown as they run.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use tachyon_bpf_tests::*;

/// `gather` of three named tasks; each awaits a sub-task of its own that burns CPU in
/// `burn_cpu`, yielding to the loop between bursts. Argument: seconds per round.
const GATHER: &str = r#"
import asyncio, sys, time

def burn_cpu(n):
    x = 0
    for i in range(n):
        x += i * i
    return x

async def leaf_work(secs):
    end = time.monotonic() + secs
    while time.monotonic() < end:
        burn_cpu(20000)
        await asyncio.sleep(0)

async def child(k, secs):
    sub = asyncio.create_task(leaf_work(secs), name=f"sub-{k}")
    await sub

async def main(secs):
    for _ in range(3):
        await asyncio.gather(*(asyncio.create_task(child(k, secs), name=f"child-{k}")
                               for k in range(3)))

if __name__ == "__main__":
    secs = float(sys.argv[1])
    if len(sys.argv) > 2:
        sys.path.insert(0, sys.argv[2])
        import uvloop
        uvloop.run(main(secs))
    else:
        asyncio.run(main(secs))
"#;

/// Task groups nested three deep: `level-3` burns CPU in `burn_cpu`.
const GROUPS: &str = r#"
import asyncio, sys, time

def burn_cpu(n):
    x = 0
    for i in range(n):
        x += i * i
    return x

async def level(depth, secs):
    if depth == 3:
        end = time.monotonic() + secs
        while time.monotonic() < end:
            burn_cpu(20000)
            await asyncio.sleep(0)
        return
    async with asyncio.TaskGroup() as tg:
        tg.create_task(level(depth + 1, secs), name=f"level-{depth + 1}")

async def main(secs):
    async with asyncio.TaskGroup() as tg:
        tg.create_task(level(1, secs), name="level-1")

asyncio.run(main(float(sys.argv[1])))
"#;

/// 1000 tasks, each sleeping in `wait_a`, `wait_b` and `wait_c` in turn for random times
/// (about 3:2:1), out of step with each other; the time each function was awaited in, summed
/// over the tasks, is written to the file named by the third argument.
const MANY: &str = r#"
import asyncio, json, random, sys, time

spent = {"wait_a": 0.0, "wait_b": 0.0, "wait_c": 0.0}

async def wait_a(r):
    await asyncio.sleep(r.uniform(0.02, 0.04))

async def wait_b(r):
    await asyncio.sleep(r.uniform(0.01, 0.03))

async def wait_c(r):
    await asyncio.sleep(r.uniform(0.005, 0.015))

async def worker(i, end):
    r = random.Random(i)
    await asyncio.sleep(r.uniform(0, 0.06))
    while time.monotonic() < end:
        for f in (wait_a, wait_b, wait_c):
            t = time.monotonic()
            await f(r)
            spent[f.__name__] += time.monotonic() - t

async def main(n, secs, out):
    end = time.monotonic() + secs
    await asyncio.gather(*(asyncio.create_task(worker(i, end), name=f"w{i}") for i in range(n)))
    with open(out, "w") as f:
        json.dump(spent, f)

asyncio.run(main(int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]))
"#;

/// Loop machinery a task's samples must not show.
const LOOP_FRAMES: [&str; 3] = [
    "BaseEventLoop._run_once",
    "BaseEventLoop.run_forever",
    "Handle._run",
];

/// Profiles `py script args...` into `out` with `flags` (the run must succeed).
fn profile_script(
    out: &Path,
    flags: &[&str],
    py: &Path,
    script: &Path,
    args: &[&str],
) -> std::process::Output {
    let mut command = vec![py.to_str().unwrap(), script.to_str().unwrap()];
    command.extend_from_slice(args);
    profile_command(out, flags, &command)
}

fn main_paths(out: &Path, script: &str) -> CallPaths {
    let v = Viewer::load(out).unwrap();
    let procs = v.processes().unwrap();
    let p = procs
        .iter()
        .find(|p| p.name.contains(script))
        .unwrap_or_else(|| panic!("no process {script}"));
    let t = p
        .threads
        .iter()
        .find(|t| t.tid.to_string() == p.pid)
        .expect("main thread");
    v.call_paths(&t.handle).unwrap()
}

/// Where each name is in `names`, in order, each after the previous one; `None` when one is
/// missing.
fn positions(names: &[String], want: &[&str]) -> Option<Vec<usize>> {
    let mut from = 0;
    let mut out = Vec::new();
    for w in want {
        let i = from + names[from..].iter().position(|n| n == w)?;
        out.push(i);
        from = i + 1;
    }
    Some(out)
}

/// Of the samples in `burn_cpu`: those whose stack is `<task> Task-1`, main, `<task>
/// child-K`, child, `<task> sub-K`, leaf_work, burn_cpu (the same K), rooted at the outermost
/// task, with no loop machinery; and the number of each child.
fn gather_shares(paths: &CallPaths) -> (u64, u64, [u64; 3]) {
    let burn = paths.count(|n| n.iter().any(|f| f == "burn_cpu"));
    let mut per_child = [0u64; 3];
    for p in &paths.paths {
        let n = &p.names;
        if !n.iter().any(|f| f == "burn_cpu")
            || n.first().map(String::as_str) != Some("<task> Task-1")
        {
            continue;
        }
        if n.iter().any(|f| LOOP_FRAMES.contains(&f.as_str())) {
            continue;
        }
        for (k, c) in per_child.iter_mut().enumerate() {
            let child = format!("<task> child-{k}");
            let sub = format!("<task> sub-{k}");
            let want = [
                "<task> Task-1",
                "main",
                &child,
                "child",
                &sub,
                "leaf_work",
                "burn_cpu",
            ];
            if let Some(at) = positions(n, &want) {
                // Nothing between a task and its coroutine's frame (uvloop.run wraps main in a
                // coroutine of its own).
                if at[3] == at[2] + 1 && at[5] == at[4] + 1 {
                    *c += p.self_samples;
                }
            }
        }
    }
    (burn, per_child.iter().sum(), per_child)
}

/// uvloop (from PyPI) runs asyncio's tasks on a loop of its own, in C: the same chains, with
/// none of uvloop's machinery above the outermost task.
#[test]
fn uvloop_tasks_show_the_same_chains() {
    require_root();
    let dir = scratch("async_uvloop");
    let script = dir.join("gather_app.py");
    std::fs::write(&script, GATHER).unwrap();
    let uvloop = tools_dir().join("uvloop");
    assert!(
        uvloop.join("uvloop/__init__.py").exists(),
        "uvloop is missing: run the tests with `cargo xtask test`"
    );
    let out = dir.join("uvloop.json");
    let o = profile_script(
        &out,
        &["-m", "cpu", "--async-aware", "running"],
        &debian_python(14),
        &script,
        &["0.7", uvloop.to_str().unwrap()],
    );
    let paths = main_paths(&out, "gather_app.py");
    let (burn, chained, per_child) = gather_shares(&paths);
    eprintln!("uvloop: {chained} of {burn} burn_cpu samples chained, per child {per_child:?}");
    assert!(burn >= 500, "only {burn} samples\n{}", stderr_of(&o));
    assert!(
        chained as f64 >= 0.9 * burn as f64,
        "{chained} of {burn} burn_cpu samples show the task chain\n{}",
        stderr_of(&o)
    );
    let uvloop_above = paths.count(|n| {
        n.first().is_some_and(|f| f.starts_with("<task>"))
            && n.iter().any(|f| f == "burn_cpu")
            && n.iter().any(|f| f.contains("uvloop"))
    });
    assert_eq!(uvloop_above, 0, "uvloop frames in task stacks");
}

/// The versions with async-aware stacks: pyenv's 3.11-3.13 and Debian's 3.11 (tables), Debian's
/// 3.14 and 3.15 (debug offsets).
const ASYNC_PYTHONS: [&str; 6] = [
    "3.11.7",
    "debian-3.11",
    "3.12.1",
    "3.13.0",
    "debian-3.14",
    "debian-3.15",
];

/// `gather` of named tasks on every version from 3.11: at least 90% of the samples in the
/// burner read `<task> Task-1` > main > `<task> child-K` > child > `<task> sub-K` > leaf_work >
/// burn_cpu with the same K, each child about a third; without the flag, no `<task>` frame.
#[test]
fn gather_samples_show_their_task_and_those_awaiting_it() {
    require_root();
    let dir = scratch("async_gather");
    let script = dir.join("gather_app.py");
    std::fs::write(&script, GATHER).unwrap();
    for minor in ASYNC_PYTHONS {
        let py = python(minor);
        let out = dir.join(format!("{minor}.json"));
        let o = profile_script(
            &out,
            &["-m", "cpu", "--async-aware", "running"],
            &py,
            &script,
            &["0.7"],
        );
        let err = stderr_of(&o);
        let paths = main_paths(&out, "gather_app.py");
        let (burn, chained, per_child) = gather_shares(&paths);
        eprintln!("{minor}: {chained} of {burn} burn_cpu samples chained, per child {per_child:?}");
        assert!(
            burn >= 500,
            "{minor}: only {burn} samples in burn_cpu\n{err}"
        );
        assert!(
            chained as f64 >= 0.9 * burn as f64,
            "{minor}: {chained} of {burn} burn_cpu samples show the task chain\n{err}"
        );
        for (k, c) in per_child.iter().enumerate() {
            let share = *c as f64 / chained as f64;
            assert!(
                (0.2..0.47).contains(&share),
                "{minor}: child-{k} has {share:.2} of the chained samples (three equal children)"
            );
        }
        assert!(
            err.contains("samples shown from their running task"),
            "{minor}: the summary counts async-aware samples\n{err}"
        );
    }
    // Without the flag: the loop's machinery, no task frames.
    let out = dir.join("plain.json");
    profile_script(&out, &["-m", "cpu"], &debian_python(14), &script, &["0.3"]);
    let paths = main_paths(&out, "gather_app.py");
    let tasks = paths.count(|n| n.iter().any(|f| f.starts_with("<task>")));
    let under_loop = paths.count(|n| {
        n.iter().any(|f| f == "burn_cpu") && n.iter().any(|f| f == "BaseEventLoop._run_once")
    });
    assert_eq!(tasks, 0, "task frames without --async-aware");
    assert!(
        under_loop > 100,
        "plain stacks run under the loop: {under_loop}"
    );
}

/// Task groups nested three deep, on every version from 3.11: the burner's samples read
/// `level-1` > `level-2` > `level-3` under the main task, each task's group exit between them.
#[test]
fn nested_task_groups_show_each_level() {
    require_root();
    let dir = scratch("async_groups");
    let script = dir.join("groups_app.py");
    std::fs::write(&script, GROUPS).unwrap();
    for minor in ASYNC_PYTHONS {
        let py = python(minor);
        let out = dir.join(format!("{minor}.json"));
        let o = profile_script(
            &out,
            &["-m", "cpu", "--async-aware", "running"],
            &py,
            &script,
            &["2"],
        );
        let paths = main_paths(&out, "groups_app.py");
        let burn = paths.count(|n| n.iter().any(|f| f == "burn_cpu"));
        let want = [
            "<task> Task-1",
            "main",
            "TaskGroup.__aexit__",
            "<task> level-1",
            "level",
            "TaskGroup.__aexit__",
            "<task> level-2",
            "level",
            "TaskGroup.__aexit__",
            "<task> level-3",
            "level",
            "burn_cpu",
        ];
        let nested = paths.count(|n| {
            n.first().map(String::as_str) == Some("<task> Task-1")
                && positions(n, &want).is_some()
                && !n.iter().any(|f| LOOP_FRAMES.contains(&f.as_str()))
        });
        eprintln!("{minor}: {nested} of {burn} burn_cpu samples nested");
        assert!(
            burn >= 500,
            "{minor}: only {burn} samples\n{}",
            stderr_of(&o)
        );
        assert!(
            nested as f64 >= 0.9 * burn as f64,
            "{minor}: {nested} of {burn} burn_cpu samples show the three levels\n{}",
            stderr_of(&o)
        );
    }
}

/// Versions before 3.11 (no asyncio tables) are said once on stderr and shown as they run.
#[test]
fn older_pythons_are_said_and_shown_plain() {
    require_root();
    let dir = scratch("async_older");
    let script = dir.join("gather_app.py");
    std::fs::write(&script, GATHER).unwrap();
    let out = dir.join("3.10.json");
    let o = profile_script(
        &out,
        &["-m", "cpu", "--async-aware", "running"],
        &python("3.10.13"),
        &script,
        &["0.3"],
    );
    let err = stderr_of(&o);
    assert_eq!(
        err.matches("async-aware stacks need Python 3.11").count(),
        1,
        "said once:\n{err}"
    );
    let paths = main_paths(&out, "gather_app.py");
    assert_eq!(
        paths.count(|n| n.iter().any(|f| f.starts_with("<task>"))),
        0
    );
    // 3.10's code objects have no qualified names.
    assert!(paths.count(|n| n.iter().any(|f| f == "_run_once")) > 100);
}

/// `--async-aware all` on every version from 3.11: 1000 tasks suspended in three functions.
/// Their pseudo-thread's suspended time per function is within 5 points of what the tasks
/// measured themselves; each stack reads `<task> Task-1` > main > `<task> wN` > worker > the function > `sleep`; the
/// profile says the view is wall time.
#[test]
fn all_tasks_suspended_time_matches_what_tasks_measured() {
    require_root();
    let dir = scratch("async_all");
    let script = dir.join("many_app.py");
    std::fs::write(&script, MANY).unwrap();
    for minor in ASYNC_PYTHONS {
        let out = dir.join(format!("{minor}.json"));
        let truth_file = dir.join(format!("{minor}.truth.json"));
        let o = profile_script(
            &out,
            &["--async-aware", "all"],
            &python(minor),
            &script,
            &["1000", "3", truth_file.to_str().unwrap()],
        );
        let truth: std::collections::HashMap<String, f64> =
            serde_json::from_str(&std::fs::read_to_string(&truth_file).unwrap()).unwrap();
        let truth_total: f64 = truth.values().sum();
        let v = Viewer::load(&out).unwrap();
        let procs = v.processes().unwrap();
        let p = procs
            .iter()
            .find(|p| p.name.contains("many_app.py"))
            .unwrap();
        let loop_name = format!("asyncio tasks (loop in thread {})", p.pid);
        let t = p
            .threads
            .iter()
            .find(|t| t.name == loop_name)
            .unwrap_or_else(|| panic!("{minor}: no thread {loop_name}\n{}", stderr_of(&o)));
        // The shape, on the paths the viewer lists (it lists 100 children of a node).
        let paths = v.call_paths(&t.handle).unwrap();
        let in_waits = |n: &[String]| n.iter().any(|x| x.starts_with("wait_"));
        let well_formed = |n: &[String]| {
            n.len() == 6
                && n[0] == "<task> Task-1"
                && n[1] == "main"
                && n[2].starts_with("<task> w")
                && n[3] == "worker"
                && n[4].starts_with("wait_")
                && n[5] == "sleep"
        };
        let listed = paths.count(in_waits);
        assert!(listed > 0, "{minor}: no path through the wait functions");
        // Tasks are read while the loop runs them: one that resumes during the read may show
        // part of its chain (0.1% of the time, measured).
        let good = paths.count(|n| in_waits(n) && well_formed(n));
        assert!(
            good as f64 >= 0.97 * listed as f64,
            "{minor}: {good} of {listed} ms of suspended tasks read as the task chain, its \
             worker, the function, sleep"
        );
        // The shares, from each function's total.
        let totals = v.function_totals(&t.handle).unwrap();
        let mut shown = std::collections::HashMap::new();
        for f in ["wait_a", "wait_b", "wait_c"] {
            shown.insert(
                f,
                totals
                    .get(&format!("many_app.py!{f}"))
                    .copied()
                    .unwrap_or(0.0),
            );
        }
        let shown_total: f64 = shown.values().sum();
        let profile: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
        // The time the passes covered, measured in this run. A pass's samples share its time
        // and weigh the time since the previous pass, so the covered time is the sum of one
        // weight a pass. It ends at the last pass before the program's end: passes are spaced
        // further apart on a slow machine, so what follows the last one (up to 1.5 spacings,
        // lost with the process) is no fixed share of the 3 s.
        let thread = profile["threads"]
            .as_array()
            .unwrap()
            .iter()
            .find(|th| th["name"] == loop_name.as_str())
            .unwrap();
        let passes = pass_weights(thread);
        let covered: f64 = passes.values().sum();
        // Each task is in one of them but while it starts and ends: most of 1000 tasks x the
        // covered time.
        assert!(
            shown_total >= 0.8 * 1000.0 * covered,
            "{minor}: {shown_total:.0} ms of suspended time in the three functions, over {} \
             passes covering {covered:.0} ms",
            passes.len()
        );
        for f in ["wait_a", "wait_b", "wait_c"] {
            let got = 100.0 * shown[f] / shown_total;
            let want = 100.0 * truth[f] / truth_total;
            eprintln!("{minor}: {f}: {got:.1}% shown, {want:.1}% measured by the tasks");
            assert!(
                (got - want).abs() <= 5.0,
                "{minor}: {f} has {got:.1}% of the suspended time, the tasks measured {want:.1}%"
            );
        }
        assert_eq!(profile["meta"]["tachyon"]["asyncAware"]["setting"], "all");
        // Passes are spaced at least 20 times their own length, so their number follows the
        // machine's load: 10-12 passes over the 1000 tasks here, fewer under CI's load (one run
        // counted under 10,000). Five passes at least.
        let suspended = profile["meta"]["tachyon"]["asyncSuspendedSamples"]
            .as_u64()
            .unwrap();
        assert!(
            suspended >= 5_000,
            "{minor}: {suspended} samples of suspended tasks"
        );
    }
}

/// The passes over the tasks on a loop's pseudo-thread of a Gecko profile: each pass's time
/// (as f64 bits, in order) and its weight (a pass's samples share its time and weigh the time
/// since the previous pass).
fn pass_weights(thread: &serde_json::Value) -> std::collections::BTreeMap<u64, f64> {
    let samples = &thread["samples"];
    samples["time"]
        .as_array()
        .unwrap()
        .iter()
        .zip(samples["weight"].as_array().unwrap())
        .map(|(t, w)| (t.as_f64().unwrap().to_bits(), w.as_f64().unwrap()))
        .collect()
}

/// `--async-aware all` on a running program for `-d 3`: the passes over its tasks cover the
/// whole run. 10,000 tasks space the passes out (each some tens of ms, at least 20 times that
/// apart), so the time after the last spaced pass is a large part of the run, and must be
/// charged by the pass that ends it; the first pass stands for the time since the process
/// was found. The truth is the span of the event loop thread's own samples in the same run.
#[test]
fn all_tasks_are_charged_from_the_start_to_the_end_of_a_run() {
    require_root();
    let dir = scratch("async_all_span");
    let script = dir.join("many_app.py");
    std::fs::write(&script, MANY).unwrap();
    let truth_file = dir.join("truth.json");
    let mut app = KillOnDrop(
        // 3.14+: each thread's tasks are listed by the interpreter, so every pass reads them
        // (3.11-3.13 must first see the loop run, and a pass before that charges nothing).
        Command::new(python("debian-3.14"))
            .arg(&script)
            .args(["10000", "30", truth_file.to_str().unwrap()])
            .spawn()
            .unwrap(),
    );
    let pid = app.0.id();
    // Its tasks are made and waiting.
    std::thread::sleep(Duration::from_secs(2));
    let out = dir.join("span.json");
    let o = run_profiler(
        &[
            "-p",
            &pid.to_string(),
            "-d",
            "3",
            "--async-aware",
            "all",
            "-o",
            out.to_str().unwrap(),
        ],
        Duration::from_secs(60),
    );
    let _ = app.0.kill();
    assert!(o.status.success(), "{}", stderr_of(&o));
    // Read by the viewer as a user would, then in its raw tables for the weights.
    let v = Viewer::load(&out).unwrap();
    let procs = v.processes().unwrap();
    assert!(
        procs.iter().any(|p| p.pid == pid.to_string()),
        "{}",
        stderr_of(&o)
    );
    let profile: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let threads = profile["threads"].as_array().unwrap();
    let loop_name = format!("asyncio tasks (loop in thread {pid})");
    let tasks = threads
        .iter()
        .find(|th| th["name"] == loop_name.as_str())
        .unwrap_or_else(|| panic!("no thread {loop_name}\n{}", stderr_of(&o)));
    let passes = pass_weights(tasks);
    let covered: f64 = passes.values().sum();
    // The loop's thread is sampled (on CPU) or charged (off CPU) all along the run.
    let main = threads
        .iter()
        .find(|th| th["tid"].as_u64() == Some(pid as u64) && th["name"] != loop_name.as_str())
        .unwrap();
    let times: Vec<f64> = main["samples"]["time"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_f64().unwrap())
        .collect();
    let last_sample = times.iter().cloned().fold(f64::MIN, f64::max);
    let span = last_sample - times.iter().cloned().fold(f64::MAX, f64::min);
    eprintln!(
        "{} passes cover {covered:.0} ms; the loop thread's samples span {span:.0} ms",
        passes.len()
    );
    assert!(
        (0.99 * span - 10.0..=1.05 * span + 50.0).contains(&covered),
        "{} passes over the tasks cover {covered:.0} ms; the loop thread's samples span \
         {span:.0} ms",
        passes.len()
    );
    assert!(passes.len() >= 2, "{} passes", passes.len());
    // The last pass is at the end: the run's last samples are not after it.
    let last_pass = passes
        .keys()
        .map(|&b| f64::from_bits(b))
        .fold(f64::MIN, f64::max);
    assert!(
        last_pass >= last_sample - 5.0,
        "the last pass over the tasks is at {last_pass:.0} ms, the last sample at \
         {last_sample:.0} ms"
    );
}
