//! Python processes of every installed CPython (pyenv 3.8-3.13, Debian's python3.11 and 3.14),
//! profiled for real and read back through the Firefox Profiler CLI.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use tachyon_bpf_tests::*;

const NESTED: &str = r#"
import sys, time

class Klass:
    def méthode(self, n):
        x = 0
        for i in range(n):
            x += i * i  # HOT
        return x

def leaf_fn(n):
    return Klass().méthode(n)

def middle_fn(n):
    return leaf_fn(n)

def outer_fn(n):
    return middle_fn(n)

def recurse(depth, n):
    if depth == 0:
        return outer_fn(n)
    return recurse(depth - 1, n)

def main():
    t0 = time.time()
    deep = len(sys.argv) > 2
    while time.time() - t0 < float(sys.argv[1]):
        if deep:
            recurse(300, 200000)
        else:
            outer_fn(200000)

main()
"#;

fn hot_line(src: &str) -> u64 {
    src.lines().position(|l| l.contains("# HOT")).unwrap() as u64 + 1
}

/// Share of frames of `func` (in the written profile) that are at `line`, weighted by samples.
fn line_share(profile: &Path, func: &str, line: u64) -> f64 {
    let p: serde_json::Value = serde_json::from_slice(&std::fs::read(profile).unwrap()).unwrap();
    let strings = p["shared"]["stringArray"].as_array().unwrap();
    let (mut at, mut all) = (0u64, 0u64);
    for t in p["threads"].as_array().unwrap() {
        let ft = &t["funcTable"];
        let fr = &t["frameTable"];
        let st = &t["stackTable"];
        for s in t["samples"]["stack"].as_array().unwrap() {
            let Some(mut si) = s.as_u64() else { continue };
            loop {
                let f = st["frame"][si as usize].as_u64().unwrap() as usize;
                let func_i = fr["func"][f].as_u64().unwrap() as usize;
                let name = strings[ft["name"][func_i].as_u64().unwrap() as usize]
                    .as_str()
                    .unwrap();
                if name == func {
                    all += 1;
                    if fr["line"][f].as_u64() == Some(line) {
                        at += 1;
                    }
                    break;
                }
                match st["prefix"][si as usize].as_u64() {
                    Some(p) => si = p,
                    None => break,
                }
            }
        }
    }
    if all == 0 {
        0.0
    } else {
        at as f64 / all as f64
    }
}

/// Share of samples whose stack holds exactly `depth` frames of `func`.
fn recursion_share(profile: &Path, func: &str, depth: usize) -> f64 {
    let p: serde_json::Value = serde_json::from_slice(&std::fs::read(profile).unwrap()).unwrap();
    let strings = p["shared"]["stringArray"].as_array().unwrap();
    let (mut ok, mut all) = (0u64, 0u64);
    for t in p["threads"].as_array().unwrap() {
        let (ft, fr, st) = (&t["funcTable"], &t["frameTable"], &t["stackTable"]);
        for s in t["samples"]["stack"].as_array().unwrap() {
            let (mut n, mut init) = (0, false);
            let mut cur = s.as_u64();
            while let Some(si) = cur {
                let f = st["frame"][si as usize].as_u64().unwrap() as usize;
                let fi = fr["func"][f].as_u64().unwrap() as usize;
                let name = &strings[ft["name"][fi].as_u64().unwrap() as usize];
                if name == func {
                    n += 1;
                }
                init |= name == "pymain_init";
                cur = st["prefix"][si as usize].as_u64();
            }
            // Interpreter initialization runs before the script can recurse (see the chain
            // share below): it is left out of the denominator too.
            if init {
                continue;
            }
            all += 1;
            if n == depth {
                ok += 1;
            }
        }
    }
    ok as f64 / all.max(1) as f64
}

#[test]
fn python_frames_names_lines_and_order_every_version() {
    require_root();
    let dir = scratch("py_nested");
    let script = dir.join("nested_app.py");
    std::fs::write(&script, NESTED).unwrap();
    let hot = hot_line(NESTED);
    for (label, py) in interpreters() {
        let minor = minor_of(&label);
        let method = if minor >= 11 {
            "Klass.méthode"
        } else {
            "méthode"
        };
        for deep in [false, true] {
            let out = dir.join(format!("{label}-{deep}.json"));
            let mut args = vec![
                "-o",
                out.to_str().unwrap(),
                "--",
                py.to_str().unwrap(),
                script.to_str().unwrap(),
                "2",
            ];
            if deep {
                args.push("deep");
            }
            let o = run_profiler(&args, Duration::from_secs(60));
            assert!(o.status.success(), "{label}: {}", stderr_of(&o));
            let v = Viewer::load(&out).unwrap();
            let procs = v.processes().unwrap();
            let t = main_thread(&procs, "nested_app.py");
            let paths = if deep {
                // The profiler cuts call trees at depth 200: merge the recursion away there, and
                // check its depth in the written profile.
                let rec = v.function_handle(&t.handle, "recurse").unwrap();
                v.call_paths_with(&t.handle, &["--merge", &rec]).unwrap()
            } else {
                v.call_paths(&t.handle).unwrap()
            };
            assert!(paths.total > 1000, "{label}: {} samples", paths.total);
            let chain = ["outer_fn", "middle_fn", "leaf_fn", method];
            if deep {
                let depth_ok = recursion_share(&out, "recurse", 301);
                assert!(
                    depth_ok >= 0.95,
                    "{label}: only {depth_ok:.3} of samples 301 recurse frames deep"
                );
            }
            // Counted among the samples of the script's evaluation only (below), as the
            // share's denominator is.
            let in_script = |n: &[String]| {
                n.iter().any(|f| f == "Py_RunMain") && n.iter().any(|f| f == "PyEval_EvalCode")
            };
            let has_chain = |n: &[String]| n.windows(5).any(|w| w[0] == "main" && w[1..] == chain);
            let good = paths.count(|n| in_script(n) && has_chain(n));
            // The share is of the samples of the script's evaluation: `PyEval_EvalCode` under
            // `Py_RunMain`, the native frames that run the module's code, whatever the Python
            // frames above them are (a sample whose Python chain was lost stays in). The rest of
            // the process's life cannot have the chain: the launch holds the command stopped
            // while the profiler starts, the loader faults the interpreter's pages in from disk,
            // initialization imports `site`, `Py_RunMain` reads and compiles the script before
            // it runs it and finalizes the interpreter after. On a slow machine these took
            // 60-110 ms of a 2 s run, once 700 ms; and once, inside `Py_RunMain`, 189 ms (the
            // chain had 1,993 samples, the 2 s of `main`'s loop), which tipped a share of the
            // whole `Py_RunMain` below 95%.
            let run = paths.count(in_script);
            assert!(
                run > 1000,
                "{label}: {run} of {} samples in the script's evaluation (PyEval_EvalCode)",
                paths.total
            );
            let frac = good as f64 / run as f64;
            assert!(
                frac >= 0.95,
                "{label} deep={deep}: only {good}/{run} samples of the script's evaluation (of \
                 {} in all) have the full Python chain; the commonest others:\n{}",
                paths.total,
                paths.commonest(|n| in_script(n) && !has_chain(n), 8)
            );
            // The loop's body is most of the method's time: 59-73% of its samples on 3.13
            // (measured; the split moves between runs with how the interpreter specializes the
            // multiplication of growing ints), the rest on the `for` line.
            let share = line_share(&out, method, hot);
            assert!(
                share >= 0.5,
                "{label}: only {share:.2} of {method} samples at line {hot}"
            );
            // Native frames under Python and Python under the native entry.
            // Of the samples in the script's `main`, wherever they are: a sample whose native
            // frames were lost is not in the run's count above, and must fail here.
            let py_main = |n: &[String]| n.windows(2).any(|w| w[0] == "main" && w[1] == "outer_fn");
            let in_main = paths.count(py_main);
            let native_root = paths.count(|n| in_script(n) && py_main(n));
            assert!(
                native_root as f64 >= 0.9 * in_main as f64 || deep,
                "{label}: Python frames not under the interpreter's native frames \
                 ({native_root}/{in_main} samples in main)"
            );
            let cats = v.categories(&t.handle).unwrap();
            assert!(
                cats.iter().any(|c| c.0 == "Python" && c.1 > 0),
                "{label}: {cats:?}"
            );
            // A Python process's C code is Native; User is for processes that are not Python
            // (a launched Python found before its first sample was once left without its
            // version, so its C code showed as User).
            assert!(
                !cats.iter().any(|c| c.0 == "User" && c.1 > 0),
                "{label}: {cats:?}"
            );
            if minor >= 11 {
                let merged = paths.count(|n| {
                    n.first().map(|f| f == "_start").unwrap_or(false)
                        && n.windows(4).any(|w| w == chain)
                });
                // Native unwinds that stop before _start (e.g. samples in the vDSO, which is not
                // unwound yet) keep their Python frames at the root instead. Of the samples with
                // the chain: the others (a launch held stopped, page faults before the
                // interpreter runs) have none to merge.
                let with_chain = paths.count(|n| n.windows(4).any(|w| w == chain));
                assert!(
                    merged as f64 >= 0.85 * with_chain as f64,
                    "{label} deep={deep}: {merged}/{with_chain} samples with the chain fully \
                     merged (native root + Python)"
                );
            }
        }
    }
}

const CALLBACK: &str = r#"
import sys, time
def py_key(x):
    s = 0
    for i in range(60):
        s += i ^ x
    return s
def caller():
    data = list(range(3000))
    return sorted(data, key=py_key)
t0 = time.time()
while time.time() - t0 < float(sys.argv[1]):
    caller()
"#;

#[test]
fn python_calls_c_calls_python() {
    require_root();
    let dir = scratch("py_callback");
    let script = dir.join("callback_app.py");
    std::fs::write(&script, CALLBACK).unwrap();
    for (label, py) in interpreters() {
        let out = dir.join(format!("{label}.json"));
        profile_command(
            &out,
            &[],
            &[py.to_str().unwrap(), script.to_str().unwrap(), "2"],
        );
        let v = Viewer::load(&out).unwrap();
        let procs = v.processes().unwrap();
        let t = main_thread(&procs, "callback_app.py");
        let paths = v.call_paths(&t.handle).unwrap();
        let through_c = paths.count(|n| {
            let (Some(c), Some(k)) = (
                n.iter().position(|f| f == "caller"),
                n.iter().position(|f| f == "py_key"),
            ) else {
                return false;
            };
            // Debian's python3.11 has no .symtab: its static sort functions have no names.
            c < k
                && if label.starts_with("debian") {
                    k > c + 1
                } else {
                    n[c + 1..k].iter().any(|f| f.contains("sort"))
                }
        });
        assert!(
            through_c as f64 >= 0.5 * paths.total as f64,
            "{label}: only {through_c}/{} samples read caller > native sort > py_key",
            paths.total
        );
    }
}

fn spawn_py(py: &Path, script: &Path, secs: &str) -> std::process::Child {
    Command::new(py)
        .arg(script)
        .arg(secs)
        .stdout(Stdio::null())
        .spawn()
        .unwrap()
}

#[test]
fn all_pythons_finds_running_and_new_interpreters() {
    require_root();
    let dir = scratch("py_all");
    let interp = interpreters();
    let pick = |l: &str| interp.iter().find(|(x, _)| x == l).unwrap().1.clone();
    let mut kids = Vec::new();
    let mut scripts = Vec::new();
    // The last one starts 1 s into the run.
    for (i, label) in ["3.9.18", "3.12.1", "debian-3.11", "debian-3.14", "3.13.0"]
        .iter()
        .enumerate()
    {
        let name = format!("fleet_{i}.py");
        let src = format!(
            "import sys, time\ndef unique_work_{i}():\n    x = 0\n    for k in range(10000):\n        x += k\n    return x\nt0 = time.time()\nwhile time.time() - t0 < float(sys.argv[1]):\n    unique_work_{i}()\n"
        );
        let path = dir.join(&name);
        std::fs::write(&path, src).unwrap();
        scripts.push((label.to_string(), name, path));
    }
    let (late, running) = scripts.split_last().unwrap();
    for (label, _, path) in running {
        kids.push(spawn_py(&pick(label), path, "8"));
    }
    std::thread::sleep(Duration::from_millis(300));
    let out = dir.join("all.json");
    let prof = Command::new(profiler_bin())
        .args(["--all-pythons", "-d", "4", "-o", out.to_str().unwrap()])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(1));
    let (label, _, path) = late;
    kids.push(spawn_py(&pick(label), path, "6"));
    let o = prof.wait_with_output().unwrap();
    for mut k in kids {
        let _ = k.kill();
        let _ = k.wait();
    }
    assert!(o.status.success(), "{}", stderr_of(&o));
    // A look while the dynamic loader maps libpython reads its data at the wrong offset: the
    // interpreter must be looked at again, never written off.
    assert!(
        !stderr_of(&o).contains("not supported"),
        "{}",
        stderr_of(&o)
    );
    let v = Viewer::load(&out).unwrap();
    let procs = v.processes().unwrap();
    for (_, name, _) in &scripts {
        let names: Vec<&str> = procs.iter().map(|p| p.name.as_str()).collect();
        assert!(
            names.iter().any(|n| n.contains(name.as_str())),
            "{name} was not found: {names:?}\n{}",
            stderr_of(&o)
        );
    }
    for (i, (label, name, _)) in scripts.iter().enumerate() {
        let t = main_thread(&procs, name);
        let paths = v.call_paths(&t.handle).unwrap();
        let with_py = paths.count(|n| n.iter().any(|f| f == &format!("unique_work_{i}")));
        assert!(
            with_py as f64 >= 0.8 * paths.total as f64 && paths.total > 200,
            "{label} {name}: {with_py}/{} samples in unique_work_{i}",
            paths.total
        );
        // No other script's functions in this process.
        for j in 0..scripts.len() {
            if j != i {
                assert_eq!(
                    paths.count(|n| n.iter().any(|f| f == &format!("unique_work_{j}"))),
                    0
                );
            }
        }
    }
}

const SPLIT: &str = r#"
import sys, time
def spend(seconds):
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass
def heavy_three_quarters():
    spend(0.003)
def light_one_quarter():
    spend(0.001)
t0 = time.time()
while time.time() - t0 < float(sys.argv[1]):
    heavy_three_quarters()
    light_one_quarter()
"#;

#[test]
fn ground_truth_cpu_split() {
    require_root();
    let dir = scratch("py_split");
    let script = dir.join("split_app.py");
    std::fs::write(&script, SPLIT).unwrap();
    let py = python("3.12.1");
    let out = dir.join("split.json");
    profile_command(
        &out,
        &[],
        &[py.to_str().unwrap(), script.to_str().unwrap(), "5"],
    );
    let v = Viewer::load(&out).unwrap();
    let procs = v.processes().unwrap();
    let t = main_thread(&procs, "split_app.py");
    let paths = v.call_paths(&t.handle).unwrap();
    let a = paths.count(|n| n.iter().any(|f| f == "heavy_three_quarters")) as f64;
    let b = paths.count(|n| n.iter().any(|f| f == "light_one_quarter")) as f64;
    let share = a / (a + b);
    assert!(
        (share - 0.75).abs() <= 0.03,
        "heavy share {share:.3} (a={a}, b={b})"
    );
}

const CONTEND: &str = r#"
import sys, threading, time
def spin_worker():
    t0 = time.time()
    x = 0
    while time.time() - t0 < float(sys.argv[1]):
        x += 1
ts = [threading.Thread(target=spin_worker) for _ in range(2)]
for t in ts: t.start()
for t in ts: t.join()
"#;

#[test]
fn gil_state_of_contending_threads() {
    require_root();
    let dir = scratch("py_gil");
    let script = dir.join("gil_app.py");
    std::fs::write(&script, CONTEND).unwrap();
    for label in ["3.10.13", "3.12.1", "3.13.0", "debian-3.14", "debian-3.15"] {
        let py = python(label);
        let out = dir.join(format!("{label}.json"));
        profile_command(
            &out,
            &[],
            &[py.to_str().unwrap(), script.to_str().unwrap(), "3"],
        );
        let v = Viewer::load(&out).unwrap();
        let procs = v.processes().unwrap();
        let p = procs
            .iter()
            .find(|p| p.name.contains("gil_app.py"))
            .unwrap();
        let workers: Vec<&ThreadInfo> = p
            .threads
            .iter()
            .filter(|t| {
                v.call_paths(&t.handle)
                    .map(|c| c.count(|n| n.iter().any(|f| f == "spin_worker")) > 100)
                    .unwrap_or(false)
            })
            .collect();
        assert_eq!(
            workers.len(),
            2,
            "{label}: two worker threads with spin_worker samples"
        );
        for w in workers {
            let m = v.markers(&w.handle).unwrap();
            let text = m.to_string();
            assert!(
                text.contains("Has GIL"),
                "{label}: no Has GIL markers on {}: {text:.400}",
                w.name
            );
            assert!(
                text.contains("Python Code"),
                "{label}: no Python Code markers"
            );
        }
    }
}

const NEWER: &str = r#"
import sys, time
def newer_work():
    x = 0
    for i in range(20000):
        x += i * i
    return x
t0 = time.time()
while time.time() - t0 < float(sys.argv[1]):
    newer_work()
"#;

/// A copy of Debian's python3.15 in `dir` that says it is 3.16 where a remote reader looks
/// first (its debug offsets' version), run with its own standard library.
fn python_3_16(dir: &Path) -> (PathBuf, String) {
    let mut bin = std::fs::read(debian_python(15)).unwrap();
    // The cookie, then the version: the struct's initial value in the file's data.
    let mut wanted = b"xdebugpy".to_vec();
    wanted.extend_from_slice(&0x030f_02f0u64.to_le_bytes());
    let at = bin
        .windows(16)
        .position(|w| w == wanted)
        .expect("python3.15 carries its debug offsets");
    bin[at + 8..at + 16].copy_from_slice(&0x0310_00a0u64.to_le_bytes());
    let py = dir.join("python3.16");
    std::fs::write(&py, bin).unwrap();
    std::fs::set_permissions(&py, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let home = tools_dir().join("debian-python/usr");
    (py, home.to_str().unwrap().to_string())
}

/// A CPython newer than the profiler knows (3.16, as a copy of 3.15 that says so) is named
/// once, as unsupported, and still profiled: native stacks from the interpreter's entry down to
/// its eval loop, no Python frames invented from layouts that may have moved.
#[test]
fn newer_python_is_reported_once_and_keeps_native_stacks() {
    require_root();
    let dir = scratch("py_newer");
    let script = dir.join("newer_app.py");
    std::fs::write(&script, NEWER).unwrap();
    let (py, home) = python_3_16(&dir);
    let out = dir.join("newer.json");
    let o = profile_command(
        &out,
        &[],
        &[
            "env",
            &format!("PYTHONHOME={home}"),
            py.to_str().unwrap(),
            script.to_str().unwrap(),
            "2",
        ],
    );
    let err = stderr_of(&o);
    assert_eq!(
        err.matches("which is not supported: native stacks only")
            .count(),
        1,
        "{err}"
    );
    assert!(err.contains("runs Python 3.16."), "{err}");
    let v = Viewer::load(&out).unwrap();
    let procs = v.processes().unwrap();
    let p = procs
        .iter()
        .find(|p| p.threads.iter().any(|t| t.name.contains("python3.16")))
        .unwrap_or_else(|| {
            panic!(
                "no python3.16 process: {:?}",
                procs.iter().map(|p| &p.name).collect::<Vec<_>>()
            )
        });
    let t = &p.threads[0];
    let paths = v.call_paths(&t.handle).unwrap();
    // Of the samples in the eval loop (an unwind cut short keeps its leaf side, so it stays in
    // the count), less the interpreter's initialization (its `site` import): the process's
    // launch, the script's compilation and the interpreter's finalization have no eval loop,
    // and on a slow machine they can be a tenth of the run.
    let in_eval = |n: &[String]| {
        n.iter().any(|f| f.starts_with("_PyEval_EvalFrameDefault"))
            && !n.iter().any(|f| f == "pymain_init")
    };
    let from_start = |n: &[String]| {
        n.first().map(|f| f == "_start").unwrap_or(false) && n.iter().any(|f| f == "Py_RunMain")
    };
    let native = paths.count(|n| in_eval(n) && from_start(n));
    let eval = paths.count(in_eval);
    assert!(
        native as f64 >= 0.9 * eval as f64 && eval > 1000,
        "only {native}/{eval} samples in the eval loop (of {} in all) run from _start through \
         Py_RunMain; the commonest others:\n{}",
        paths.total,
        paths.commonest(|n| in_eval(n) && !from_start(n), 5)
    );
    let cats = v.categories(&t.handle).unwrap();
    assert!(
        !cats.iter().any(|c| c.0 == "Python" && c.1 > 0),
        "Python frames on an unsupported version: {cats:?}"
    );
}

const PARENT_OF_WORKERS: &str = r#"
import subprocess, sys, time
CHILD = """
import time
def child_work():
    t0 = time.time()
    while time.time() - t0 < 30:
        sum(range(1000))
child_work()
"""
kids = [subprocess.Popen([sys.executable, "-c", CHILD]) for _ in range(2)]
print(" ".join(str(k.pid) for k in kids), flush=True)
time.sleep(30)
"#;

/// `--pid P --subprocesses` profiles the processes P started before the profiler did (a
/// server's workers, a pool's children), not only later ones.
#[test]
fn subprocesses_of_a_pid_include_running_children() {
    require_root();
    let dir = scratch("py_subprocesses");
    let script = dir.join("parent.py");
    std::fs::write(&script, PARENT_OF_WORKERS).unwrap();
    let mut parent = Command::new(python("3.12.1"))
        .arg(&script)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(parent.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    let kids: Vec<String> = line.split_whitespace().map(str::to_string).collect();
    assert_eq!(kids.len(), 2, "{line}");
    let out = dir.join("workers.json");
    let pid = parent.id().to_string();
    let o = run_profiler(
        &[
            "-o",
            out.to_str().unwrap(),
            "--pid",
            &pid,
            "--subprocesses",
            "-d",
            "2",
        ],
        Duration::from_secs(60),
    );
    let _ = parent.kill();
    for k in &kids {
        let _ = Command::new("kill").arg(k).status();
    }
    let _ = parent.wait();
    assert!(o.status.success(), "{}", stderr_of(&o));
    let err = stderr_of(&o);
    assert!(
        err.contains(&format!(
            "--pid {pid} --subprocesses: 2 running descendants"
        )),
        "{err}"
    );
    let v = Viewer::load(&out).unwrap();
    let procs = v.processes().unwrap();
    for k in &kids {
        let p = procs
            .iter()
            .find(|p| &p.pid == k)
            .unwrap_or_else(|| panic!("worker {k} is in the profile"));
        let c = v.call_paths(&p.threads[0].handle).unwrap();
        let work = c.count(|n| n.iter().any(|f| f == "child_work"));
        assert!(
            work as f64 >= 0.9 * c.total as f64 && c.total > 1000,
            "worker {k}: {work} of {} ms in child_work",
            c.total
        );
    }
}

/// Writes a package of `n` small modules, each doing a little work as it is imported, and a
/// driver that imports it in fresh interpreters `rounds` times (from `.pyc` after the first).
fn many_modules(dir: &Path, n: usize) -> std::path::PathBuf {
    let pkg = dir.join("manymods");
    std::fs::create_dir_all(&pkg).unwrap();
    let mut init = String::new();
    for i in 0..n {
        std::fs::write(
            pkg.join(format!("m{i}.py")),
            format!(
                "def build_{i}(k):\n    return sorted(str(x * {i}) for x in range(k))\n\
                 TABLE_{i} = build_{i}(300)\n"
            ),
        )
        .unwrap();
        init.push_str(&format!("from . import m{i}\n"));
    }
    std::fs::write(pkg.join("__init__.py"), init).unwrap();
    let driver = dir.join("import_many.py");
    std::fs::write(
        &driver,
        "import subprocess, sys\n\
         for _ in range(int(sys.argv[1])):\n\
         \x20   subprocess.run([sys.executable, '-c', 'import manymods'], check=True)\n",
    )
    .unwrap();
    driver
}

/// Import-heavy, short-lived code: code objects that live only while a module is imported.
/// Every Python name in the profile is a real one (no garbage from freed memory: strings are
/// checked against the target's str type, their flags and what a name can be).
#[test]
fn import_heavy_code_has_no_garbage_names() {
    require_root();
    let dir = scratch("py_imports");
    let driver = many_modules(&dir, 300);
    for label in ["3.12.1", "3.13.0"] {
        let out = dir.join(format!("imports-{label}.json"));
        let py = python(label);
        let o = Command::new(profiler_bin())
            .current_dir(&dir)
            .args([
                "-o",
                out.to_str().unwrap(),
                "-m",
                "cpu",
                "-r",
                "4000",
                "--subprocesses",
                "--",
            ])
            .arg(&py)
            .arg(&driver)
            // Ten fresh interpreters each importing the 300 modules take about 1.2 s of CPU
            // here: at 4 kHz, several thousand samples.
            .arg("10")
            .output()
            .unwrap();
        assert!(o.status.success(), "{label}: {}", stderr_of(&o));
        let p: serde_json::Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
        let strings = p["shared"]["stringArray"].as_array().unwrap();
        let (mut py_samples, mut unresolved) = (0u64, 0u64);
        for t in p["threads"].as_array().unwrap() {
            let (ft, fr, st) = (&t["funcTable"], &t["frameTable"], &t["stackTable"]);
            let is_js = ft["isJS"].as_array().unwrap();
            for (fi, js) in is_js.iter().enumerate() {
                let name = strings[ft["name"][fi].as_u64().unwrap() as usize]
                    .as_str()
                    .unwrap();
                if js.as_bool() == Some(true) && !name.starts_with("<unresolved") {
                    assert!(
                        !name.chars().any(|c| c.is_control() || c == '\u{fffd}')
                            && !name.contains(' ')
                            && !name.is_empty(),
                        "{label}: garbage Python name {name:?}"
                    );
                }
            }
            for s in t["samples"]["stack"].as_array().unwrap() {
                let (mut any_py, mut bad) = (false, false);
                let mut cur = s.as_u64();
                while let Some(si) = cur {
                    let f = st["frame"][si as usize].as_u64().unwrap() as usize;
                    let fi = fr["func"][f].as_u64().unwrap() as usize;
                    if is_js[fi].as_bool() == Some(true) {
                        any_py = true;
                        let name = strings[ft["name"][fi].as_u64().unwrap() as usize]
                            .as_str()
                            .unwrap();
                        bad |= name.starts_with("<unresolved");
                    }
                    cur = st["prefix"][si as usize].as_u64();
                }
                py_samples += any_py as u64;
                unresolved += bad as u64;
            }
        }
        assert!(
            py_samples > 500,
            "{label}: {py_samples} samples with Python frames"
        );
        // Code objects that live a few hundred microseconds (module bodies) are named from the
        // heads (and names) the BPF program copies: 15-20% of these samples were unresolved with
        // no copies, 8-13% with copies of the innermost 8 frames' heads and no names, 0.4-1.1%
        // now (measured). What is left is mostly samples of a process that had exited when they
        // were read, in code not seen before.
        assert!(
            (unresolved as f64) < 0.02 * py_samples as f64,
            "{label}: {unresolved} of {py_samples} samples have an unresolved Python frame"
        );
    }
}

const SORT_WITH_KEY: &str = r#"
import time
def key(x):
    return -x
def work():
    data = list(range(20000))
    sorted(data, key=key)
t0 = time.time()
while time.time() - t0 < 2:
    work()
"#;

/// One logical call, one node: `sorted` calling `list.sort` shows `builtin_sorted > list_sort`
/// whether the sample is in `key` (called back from C) or in the sort's own C code; the
/// interpreter's call machinery between them (`PyObject_Vectorcall`,
/// `cfunction_vectorcall_FASTCALL_KEYWORDS`) is hidden in both. It was kept where no Python
/// frame followed: two sibling nodes for one call, about 2:1.
#[test]
fn a_call_path_has_one_shape_whatever_runs_below() {
    require_root();
    let dir = scratch("py_one_shape");
    let script = dir.join("sort_key.py");
    std::fs::write(&script, SORT_WITH_KEY).unwrap();
    let out = dir.join("sort_key.json");
    profile_command(
        &out,
        &["-m", "cpu"],
        &[python("3.12.1").to_str().unwrap(), script.to_str().unwrap()],
    );
    let v = Viewer::load(&out).unwrap();
    let procs = v.processes().unwrap();
    let t = main_thread(&procs, "sort_key.py");
    let paths = v.call_paths(&t.handle).unwrap();
    let in_sort = paths.count(|n| n.iter().any(|f| f == "list_sort"));
    let direct = paths.count(|n| {
        n.windows(3)
            .any(|w| w[0] == "work" && w[1] == "builtin_sorted" && w[2] == "list_sort")
    });
    let in_key = paths.count(|n| n.iter().any(|f| f == "key"));
    assert!(
        in_sort > 1000 && in_key > 100,
        "{in_sort} in list.sort, {in_key} in key"
    );
    assert!(
        direct as f64 >= 0.97 * in_sort as f64,
        "{direct} of {in_sort} samples in list.sort have work > builtin_sorted > list_sort"
    );
}

const CONSTRUCT: &str = r#"
import sys, time

class Point:
    def __init__(self, n):
        x = 0
        for i in range(n):
            x += i * i
        self.x = x

def build(n):
    return Point(n)

t0 = time.time()
while time.time() - t0 < float(sys.argv[1]):
    build(5000)
"#;

/// 3.13+ runs a class's Python `__init__` under a frame of the interpreter's own (named
/// `__init__`, in a file `__init__`, line 0), in the same eval loop. It is no code of the
/// program: `build` calls `Point.__init__` directly, as the source says.
#[test]
fn a_constructor_is_called_by_its_caller() {
    require_root();
    let dir = scratch("py_construct");
    let script = dir.join("construct.py");
    std::fs::write(&script, CONSTRUCT).unwrap();
    for (label, py) in interpreters() {
        let minor = minor_of(&label);
        let init = if minor >= 11 {
            "Point.__init__"
        } else {
            "__init__"
        };
        let out = dir.join(format!("{label}.json"));
        profile_command(
            &out,
            &["-m", "cpu"],
            &[py.to_str().unwrap(), script.to_str().unwrap(), "1.5"],
        );
        let v = Viewer::load(&out).unwrap();
        let procs = v.processes().unwrap();
        let t = main_thread(&procs, "construct.py");
        let paths = v.call_paths(&t.handle).unwrap();
        let in_init = paths.count(|n| n.iter().any(|f| f == init));
        // Before 3.13 the call goes through the type's native `tp_init`, in an eval loop of
        // its own; from 3.13 on it stays in the caller's.
        let called = paths.count(|n| {
            if minor >= 13 {
                n.windows(2).any(|w| w[0] == "build" && w[1] == init)
            } else {
                let at = |name: &str| n.iter().position(|f| f == name);
                matches!((at("build"), at(init)), (Some(b), Some(i)) if b < i)
            }
        });
        assert!(in_init >= 500, "{label}: {in_init} samples in {init}");
        assert!(
            called as f64 >= 0.98 * in_init as f64,
            "{label}: {called} of {in_init} samples in {init} have it called by build"
        );
        if minor >= 11 {
            let shim = paths.count(|n| n.iter().any(|f| f == "__init__"));
            assert_eq!(
                shim, 0,
                "{label}: a frame of the interpreter's own is shown"
            );
        }
    }
}

const NAMESPACED: &str = r#"
import sys, threading, time
def ns_work(stop):
    while time.time() < stop:
        sum(i * i for i in range(200))
stop = time.time() + float(sys.argv[1])
ts = [threading.Thread(target=ns_work, args=(stop,), name=f"ns-worker-{i}") for i in range(3)]
for t in ts: t.start()
for t in ts: t.join()
"#;

/// A Python in a pid namespace of its own (a container): its thread states hold tids of that
/// namespace, which the profiler maps to the host's through each thread's `NSpid` (read once
/// per thread, not on every refresh of the thread map). Threads are named and their Python
/// frames merged.
#[test]
fn a_python_in_its_own_pid_namespace_has_named_threads_and_python_frames() {
    require_root();
    let dir = scratch("py_pidns");
    let script = dir.join("namespaced.py");
    std::fs::write(&script, NAMESPACED).unwrap();
    let py = python("3.12.1");
    let mut kid = KillOnDrop(
        Command::new("unshare")
            .args(["--pid", "--fork", "--mount-proc", "--kill-child"])
            .arg(&py)
            .arg(&script)
            .arg("6")
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    std::thread::sleep(Duration::from_millis(500));
    let out = dir.join("pidns.json");
    let o = run_profiler(
        &["--all-pythons", "-d", "3", "-o", out.to_str().unwrap()],
        Duration::from_secs(60),
    );
    let _ = kid.0.kill();
    let _ = kid.0.wait();
    assert!(o.status.success(), "{}", stderr_of(&o));
    let v = Viewer::load(&out).unwrap();
    let procs = v.processes().unwrap();
    let p = process_named(&procs, "namespaced.py");
    // The process is pid 1 in its namespace; the profile names it by its host pid.
    assert_ne!(p.pid, "1", "host pid: {}", p.pid);
    for i in 0..3 {
        let name = format!("ns-worker-{i}");
        let t = p
            .threads
            .iter()
            .find(|t| t.name == name)
            .unwrap_or_else(|| {
                let names: Vec<_> = p.threads.iter().map(|t| &t.name).collect();
                panic!("a thread named {name} among {names:?}")
            });
        let paths = v.call_paths(&t.handle).unwrap();
        let in_work = paths.count(|n| n.iter().any(|f| f == "ns_work"));
        assert!(
            paths.total > 100 && in_work as f64 >= 0.9 * paths.total as f64,
            "{name}: {in_work} of {} ms in ns_work",
            paths.total
        );
    }
}
