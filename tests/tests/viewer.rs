//! What a user sees of a profile in the Firefox Profiler: threads by the names Python gave them,
//! markers with colours and fields, colours that say GIL and Python rather than "native", and
//! libc named from its debug file. Read back through the profiler's own loader (its CLI); what
//! the CLI does not report (marker colours) is read from the profile it loaded.

use std::collections::{HashMap, HashSet};

use serde_json::Value;
use tachyon_bpf_tests::*;

/// Three threads fight for the GIL with pure-Python loops (each waits for it about two thirds of
/// the time on two CPUs), one sleeps, one is left unnamed.
const PROGRAM: &str = r#"
import threading, time

def spin(stop):
    n = 0
    while time.time() < stop:
        n += sum(i * i for i in range(100))

def nap(stop):
    while time.time() < stop:
        time.sleep(0.05)

stop = time.time() + 3.0
threads = [threading.Thread(target=spin, args=(stop,), name=f"contender-{i}") for i in range(3)]
threads.append(threading.Thread(target=nap, args=(stop,), name="sleeper"))
threads.append(threading.Thread(target=nap, args=(stop,)))
for t in threads:
    t.start()
for t in threads:
    t.join()
"#;

/// A category's share (0-1) of a thread's samples, and the share of one of its subcategories.
fn category_share(v: &Viewer, thread: &str, category: &str, sub: Option<&str>) -> f64 {
    let s = v
        .json(&["thread", "samples", "--thread", thread, "--include-idle"])
        .unwrap();
    let cats = s["categoryBreakdown"]["categories"].as_array().unwrap();
    let total: f64 = cats.iter().map(|c| c["samples"].as_f64().unwrap()).sum();
    let Some(c) = cats.iter().find(|c| c["name"] == category) else {
        return 0.0;
    };
    let n = match sub {
        None => c["samples"].as_f64().unwrap(),
        Some(sub) => c["subcategories"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["name"] == sub)
            .map_or(0.0, |x| x["samples"].as_f64().unwrap()),
    };
    n / total
}

#[test]
fn threads_markers_and_colours_read_as_a_python_user_expects() {
    require_root();
    let debug = std::path::Path::new("/usr/lib/debug/.build-id");
    assert!(
        debug.is_dir(),
        "{} is missing: run the tests with `cargo xtask test` (it installs libc6-dbg)",
        debug.display()
    );
    let dir = scratch("viewer_threads");
    let script = dir.join("contend.py");
    std::fs::write(&script, PROGRAM).unwrap();
    let out = dir.join("contend.json");
    // Python's thread names are read from each version's own object layout. Debian's stripped
    // python3.11 names neither take_gil nor its callers: its GIL waits are found by shape.
    for label in ["3.9.18", "3.11.7", "3.12.1", "3.13.0", "debian-3.11"] {
        let py = python(label);
        let o = profile_command(
            &out,
            &["-m", "wall"],
            &[py.to_str().unwrap(), script.to_str().unwrap()],
        );
        assert!(o.status.success(), "{label}: {}", stderr_of(&o));
        let v = Viewer::load(&out).unwrap();
        let procs = v.processes().unwrap();
        // One process: the launcher's moment before the exec is not a track of its own.
        assert_eq!(
            procs.len(),
            1,
            "{label}: one process: {:?}",
            procs.iter().map(|p| &p.name).collect::<Vec<_>>()
        );
        let threads = &procs[0].threads;
        let names: HashSet<&str> = threads.iter().map(|t| t.name.as_str()).collect();
        for want in ["contender-0", "contender-1", "contender-2", "sleeper"] {
            assert!(
                names.contains(want),
                "{label}: a thread named {want}: {names:?}"
            );
        }
        // The unnamed thread has Python's default name (Thread-N (nap) from 3.10, Thread-N
        // before); the main thread is the process's track.
        assert!(
            names.iter().any(|n| n.starts_with("Thread-")),
            "{label}: the unnamed thread by its default name: {names:?}"
        );
        assert!(
            names.contains(procs[0].name.as_str()),
            "{label}: the main thread is named for its process: {names:?}"
        );
        let by_name: HashMap<&str, &str> = threads
            .iter()
            .map(|t| (t.name.as_str(), t.handle.as_str()))
            .collect();

        // Waiting for the GIL is coloured as such, and the interpreter's own C code under a
        // Python frame is Python work.
        let gil = category_share(&v, by_name["contender-0"], "GIL", None);
        assert!(gil >= 0.5, "{label}: GIL share of a contender: {gil:.3}");
        let interp = category_share(&v, by_name["contender-0"], "Python", Some("interpreter"));
        assert!(
            interp > 0.05,
            "{label}: the interpreter's C code as Python: {interp:.3}"
        );
        let native = category_share(&v, by_name["contender-0"], "Native", None);
        assert!(
            native < 0.15,
            "{label}: a pure-Python thread is not mostly native: {native:.3}"
        );

        // The sleeper's off-CPU markers say what it waited in, and in which Python function.
        let m = v.markers(by_name["sleeper"]).unwrap();
        let off = m["byType"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["markerName"] == "Off CPU")
            .unwrap_or_else(|| panic!("{label}: Off CPU markers on the sleeper: {m}"));
        let handles: Vec<&str> = off["topMarkers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x["handle"].as_str().unwrap())
            .collect();
        let mut naps = 0;
        for h in &handles {
            let info = v.json(&["marker", "info", h]).unwrap();
            let field = |k: &str| {
                info["fields"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|f| f["key"] == k)
                    .and_then(|f| f["value"].as_str().map(str::to_string))
            };
            assert!(
                info["fields"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|f| f["key"] == "duration"),
                "{label}: a duration field: {info}"
            );
            if field("reason").as_deref() == Some("sleep")
                // `time.sleep` waits in `select` (pselect6) before 3.11.
                && matches!(field("waitedOn").as_deref(), Some("clock_nanosleep" | "select" | "pselect6"))
                && field("function").as_deref() == Some("nap")
            {
                naps += 1;
            }
        }
        assert!(
            naps * 2 >= handles.len(),
            "{label}: most of the sleeper's longest Off CPU markers are naps: {naps} of {}",
            handles.len()
        );

        // The markers' reasons filter the call tree: the sleeper's samples during its sleeps
        // are most of its time, and in `nap`.
        let samples = |extra: &[&str]| {
            let mut args = vec![
                "thread",
                "samples",
                "--thread",
                by_name["sleeper"],
                "--include-idle",
            ];
            args.extend_from_slice(extra);
            v.json(&args).unwrap()
        };
        let all = samples(&[]);
        let during = samples(&["--during-marker", "--search", "sleep"]);
        // The search is over markers, not frames: a frame's name finds no marker.
        let by_frame_name = samples(&["--during-marker", "--search", "time_sleep"]);
        let total = |x: &Value| x["categoryBreakdown"]["totalSamples"].as_f64().unwrap();
        assert!(
            total(&by_frame_name) == 0.0,
            "{label}: a frame name matches no marker: {}",
            total(&by_frame_name)
        );
        assert!(
            total(&during) >= 0.5 * total(&all),
            "{label}: samples during sleep markers: {} of {}",
            total(&during),
            total(&all)
        );
        assert!(
            during["topFunctionsByTotal"]
                .as_array()
                .unwrap()
                .iter()
                .any(|f| f["name"].as_str().is_some_and(|n| n.ends_with("!nap"))),
            "{label}: the sleeps are in nap: {during}"
        );

        // No libc frame is a bare address: its debug file names its internals (the threads'
        // start routine among them).
        let mut roots = HashSet::new();
        for t in threads {
            let paths = v.call_paths(&t.handle).unwrap();
            for p in &paths.paths {
                for f in &p.names {
                    assert!(
                        !f.starts_with("0x") && !f.starts_with("libc.so.6+0x"),
                        "{label}: an unnamed libc frame {f} in {:?}",
                        p.names
                    );
                }
                if let Some(r) = p.names.first() {
                    roots.insert(r.clone());
                }
            }
        }
        assert!(
            roots.contains("__clone3") || roots.contains("clone3"),
            "{label}: threads root at libc's clone3: {roots:?}"
        );

        // Each marker type has its own colour, named in the schema and carried by each marker.
        let json: Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
        let schema = json["meta"]["markerSchema"].as_array().unwrap();
        for s in schema {
            assert_eq!(s["colorField"], "color", "{label}: {s}");
        }
        let overview: Vec<&str> = schema
            .iter()
            .filter(|s| {
                s["display"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|d| d == "timeline-overview")
            })
            .map(|s| s["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            overview,
            ["WaitingforGIL", "GCCollecting"],
            "{label}: only GIL waits and GC in the overview"
        );
        let strings = json["shared"]["stringArray"].as_array().unwrap();
        let mut colours: HashMap<String, HashSet<String>> = HashMap::new();
        for t in json["threads"].as_array().unwrap() {
            let m = &t["markers"];
            for (n, d) in m["name"]
                .as_array()
                .unwrap()
                .iter()
                .zip(m["data"].as_array().unwrap())
            {
                let name = strings[n.as_u64().unwrap() as usize].as_str().unwrap();
                colours
                    .entry(name.to_string())
                    .or_default()
                    .insert(d["color"].as_str().unwrap_or("none").to_string());
            }
        }
        let one = |name: &str| -> String {
            let c = &colours[name];
            assert_eq!(c.len(), 1, "{label}: one colour for {name}: {c:?}");
            c.iter().next().unwrap().clone()
        };
        assert_eq!(one("Waiting for GIL"), "red", "{label}");
        let distinct: HashSet<String> = ["Has GIL", "Waiting for GIL", "On CPU", "Off CPU"]
            .iter()
            .map(|n| one(n))
            .collect();
        assert_eq!(distinct.len(), 4, "{label}: {colours:?}");
    }
}
