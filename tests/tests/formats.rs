//! One recorded run, converted without root after its process is gone into every format, each
//! read back by the tool people open it with: the Firefox Profiler CLI (Gecko), `go tool pprof`
//! (pprof), inferno (folded stacks, and the SVG it draws), Python's `pstats` (the statistics
//! file), and a reader of CPython's JSONL schema that enforces its rules. All must agree on the
//! total and on the hottest functions.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use serde_json::Value;
use tachyon_bpf_tests::*;

const WORK: &str = r#"
import hashlib, time
def heavy(n):
    s = 0
    for i in range(n):
        s += i * i
    return s
def medium(n):
    return sorted(str(i) for i in range(n))
def light(n):
    h = hashlib.sha256()
    for _ in range(n):
        h.update(b"y" * 4096)
    return h.hexdigest()
def main():
    t0 = time.time()
    while time.time() - t0 < 3.0:
        heavy(60000)
        medium(20000)
        light(300)
main()
"#;

/// Self samples per function name, and the total.
#[derive(Debug, Default)]
struct Tally {
    total: f64,
    by_func: HashMap<String, f64>,
}

impl Tally {
    fn top(&self, n: usize) -> Vec<(String, f64)> {
        let mut v: Vec<(String, f64)> = self.by_func.iter().map(|(k, v)| (k.clone(), *v)).collect();
        v.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        v.truncate(n);
        v
    }
}

/// Runs a command as the unprivileged user `nobody`.
fn as_nobody(args: &[&str]) -> Command {
    let mut c = Command::new("setpriv");
    c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(profiler_bin())
        .args(args);
    c
}

/// Records WORK once (root), then converts it as `nobody` into every format.
fn record_and_convert(dir: &Path) -> PathBuf {
    let script = dir.join("work.py");
    std::fs::write(&script, WORK).unwrap();
    let rec = dir.join("run.tbpf");
    let py = python("3.12.1");
    let o = run_profiler(
        &[
            "record",
            "-o",
            rec.to_str().unwrap(),
            "--",
            py.to_str().unwrap(),
            script.to_str().unwrap(),
        ],
        Duration::from_secs(60),
    );
    assert!(o.status.success(), "record: {}", stderr_of(&o));
    let meta = std::fs::metadata(&rec).unwrap();
    assert_eq!(
        meta.permissions().mode() & 0o777,
        0o600,
        "recordings are private to their owner"
    );
    // The recorded process is gone; hand the file to an unprivileged user.
    std::fs::set_permissions(&rec, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = dir.join("out");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o1777)).unwrap();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let base = out.join("run");
    let o = as_nobody(&[
        "convert",
        rec.to_str().unwrap(),
        "--format",
        "gecko,collapsed,jsonl,pprof,flamegraph,pstats,heatmap",
        "-o",
        base.to_str().unwrap(),
    ])
    .output()
    .unwrap();
    assert!(
        o.status.success(),
        "convert as nobody: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    for ext in [
        "json",
        "folded",
        "jsonl",
        "pb.gz",
        "svg",
        "pstats",
        "heatmap/index.html",
    ] {
        assert!(
            out.join(format!("run.{ext}")).exists(),
            "run.{ext} was not written"
        );
    }
    base
}

fn gecko_tally(path: &Path) -> Tally {
    let v = Viewer::load(path).unwrap();
    let mut t = Tally::default();
    for p in v.processes().unwrap() {
        for th in &p.threads {
            let cp = v.call_paths(&th.handle).unwrap();
            t.total += cp.total as f64;
            for path in &cp.paths {
                let leaf = path.names.last().unwrap().clone();
                *t.by_func.entry(leaf).or_default() += path.self_samples as f64;
            }
        }
    }
    t
}

/// A folded frame's function: `file.py:func:line` -> func, `name_[k]` -> name.
fn folded_func(frame: &str) -> String {
    if let Some(k) = frame.strip_suffix("_[k]") {
        return k.to_string();
    }
    let parts: Vec<&str> = frame.split(':').collect();
    if parts.len() >= 3 && parts[0].ends_with(".py") && parts.last().unwrap().parse::<u32>().is_ok()
    {
        return parts[1..parts.len() - 1].join(":");
    }
    frame.to_string()
}

fn collapsed_tally(path: &Path) -> Tally {
    let text = std::fs::read_to_string(path).unwrap();
    let mut t = Tally::default();
    for line in text.lines() {
        let (stack, n) = line.rsplit_once(' ').expect("`stack count` lines");
        let n: f64 = n.parse().expect("integer count");
        let frames: Vec<&str> = stack.split(';').collect();
        assert!(
            frames.len() >= 3,
            "process and thread root frames, then the stack: {line}"
        );
        assert!(frames[0].contains("[pid "), "process root: {line}");
        assert!(frames[1].contains("[tid "), "thread root: {line}");
        t.total += n;
        *t.by_func
            .entry(folded_func(frames.last().unwrap()))
            .or_default() += n;
    }
    // inferno must take the file as it is, and count the same total.
    let mut opts = inferno::flamegraph::Options::default();
    let mut svg = Vec::new();
    inferno::flamegraph::from_reader(&mut opts, std::fs::File::open(path).unwrap(), &mut svg)
        .expect("inferno reads the folded stacks");
    let svg = String::from_utf8(svg).unwrap();
    let all = svg_total(&svg);
    assert_eq!(all, t.total, "inferno's total");
    t
}

/// Per Python function of a collapsed file (`file.py:func:line` frames): samples where it is
/// the innermost Python frame, and samples it is on the stack in; and the total of samples
/// with a Python frame.
fn collapsed_python(path: &Path) -> (HashMap<String, (f64, f64)>, f64) {
    let text = std::fs::read_to_string(path).unwrap();
    let mut out: HashMap<String, (f64, f64)> = HashMap::new();
    let mut total = 0.0;
    for line in text.lines() {
        let (stack, n) = line.rsplit_once(' ').unwrap();
        let n: f64 = n.parse().unwrap();
        let python: Vec<String> = stack
            .split(';')
            .skip(2)
            .filter(|f| f.contains(".py:") || f.starts_with('<'))
            .map(folded_func)
            .collect();
        let Some(leaf) = python.last() else { continue };
        total += n;
        out.entry(leaf.clone()).or_default().0 += n;
        let distinct: HashSet<&String> = python.iter().collect();
        for f in distinct {
            out.entry(f.clone()).or_default().1 += n;
        }
    }
    (out, total)
}

/// Loads a stats file with `python`'s own `pstats.Stats`: per function name of `work.py`,
/// (primitive calls, calls, tottime, cumtime, callers' names); under "" the primitive calls of
/// every function.
fn pstats_of(python: &Path, path: &Path) -> HashMap<String, (f64, f64, f64, f64, Vec<String>)> {
    let script = r#"
import json, pstats, sys
s = pstats.Stats(sys.argv[1])
out = {"": [sum(v[0] for v in s.stats.values()), 0, 0, 0, []]}
for (file, line, name), (cc, nc, tt, ct, callers) in s.stats.items():
    if file.endswith("work.py"):
        out[name] = [cc, nc, tt, ct, sorted(c[2] for c in callers)]
print(json.dumps(out))
"#;
    let o = Command::new(python)
        .args(["-c", script, path.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "pstats: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let v: HashMap<String, (f64, f64, f64, f64, Vec<String>)> =
        serde_json::from_slice(&o.stdout).unwrap();
    v
}

/// The `all (N samples, 100%)` total of an inferno SVG.
fn svg_total(svg: &str) -> f64 {
    let i = svg.find("<title>all (").expect("an `all` frame");
    let rest = &svg[i + "<title>all (".len()..];
    let n = rest.split(' ').next().unwrap().replace(',', "");
    n.parse().expect("total samples")
}

/// Reads JSONL enforcing the schema: record order, one meta first and one end last, the same
/// run id and version everywhere, chunks of at most 256 entries with explicit zero-based ids,
/// references in range, totals consistent.
fn jsonl_tally(path: &Path) -> Tally {
    let text = std::fs::read_to_string(path).unwrap();
    let recs: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect();
    assert!(recs.len() >= 2);
    let run_id = recs[0]["run_id"].as_str().expect("run_id").to_string();
    assert_eq!(run_id.len(), 32, "uuid4 hex run id");
    assert!(run_id.chars().all(|c| c.is_ascii_hexdigit()));
    let order = ["meta", "string_table", "frame_table", "agg", "end"];
    let mut last_rank = 0;
    let mut strings: Vec<String> = Vec::new();
    let mut frames: Vec<(usize, usize, u64)> = Vec::new();
    let mut entries: BTreeMap<usize, (f64, f64)> = BTreeMap::new();
    let mut total = None;
    for (i, r) in recs.iter().enumerate() {
        let ty = r["type"].as_str().expect("type");
        assert_eq!(r["v"], 0, "schema version 0");
        assert_eq!(r["run_id"], run_id.as_str(), "one run id");
        let Some(rank) = order.iter().position(|o| *o == ty) else {
            continue; // readers ignore unknown types
        };
        assert!(rank >= last_rank, "{ty} out of order at line {}", i + 1);
        last_rank = rank;
        match ty {
            "meta" => {
                assert_eq!(i, 0, "meta first, exactly once");
                assert!(r["sample_interval_usec"].as_u64().unwrap() > 0);
                assert_eq!(r["mode"], "wall");
            }
            "string_table" => {
                let chunk = r["strings"].as_array().unwrap();
                assert!(chunk.len() <= 256);
                for s in chunk {
                    assert_eq!(s["str_id"].as_u64().unwrap() as usize, strings.len());
                    strings.push(s["value"].as_str().unwrap().to_string());
                }
            }
            "frame_table" => {
                let chunk = r["frames"].as_array().unwrap();
                assert!(chunk.len() <= 256);
                for f in chunk {
                    assert_eq!(f["frame_id"].as_u64().unwrap() as usize, frames.len());
                    let p = f["path_str_id"].as_u64().unwrap() as usize;
                    let n = f["func_str_id"].as_u64().unwrap() as usize;
                    assert!(
                        p < strings.len() && n < strings.len(),
                        "string ids in range"
                    );
                    for k in ["end_line", "col", "end_col"] {
                        if let Some(v) = f.get(k) {
                            assert!(v.as_i64().is_some(), "{k} is a number when present");
                        }
                    }
                    frames.push((p, n, f["line"].as_u64().expect("line")));
                }
            }
            "agg" => {
                assert_eq!(r["kind"], "frame");
                assert_eq!(r["scope"], "final");
                let t = r["samples_total"].as_u64().unwrap();
                assert!(total.is_none_or(|x| x == t), "one total on every chunk");
                total = Some(t);
                let chunk = r["entries"].as_array().unwrap();
                assert!(chunk.len() <= 256);
                for e in chunk {
                    let id = e["frame_id"].as_u64().unwrap() as usize;
                    assert!(id < frames.len(), "frame ids in range");
                    let s = e["self"].as_f64().unwrap();
                    let c = e["cumulative"].as_f64().unwrap();
                    assert!(s <= c && c <= t as f64, "self <= cumulative <= total");
                    assert!(entries.insert(id, (s, c)).is_none(), "one entry per frame");
                }
            }
            "end" => {
                assert_eq!(i, recs.len() - 1, "end last, exactly once");
                assert_eq!(r["samples_total"].as_u64(), total, "end total");
            }
            _ => unreachable!(),
        }
    }
    assert_eq!(last_rank, 4, "an end record");
    assert!(
        frames
            .iter()
            .any(|(p, _, l)| strings[*p].ends_with("work.py") && *l > 0),
        "Python frames with their file and line"
    );
    let mut t = Tally {
        total: total.unwrap() as f64,
        ..Default::default()
    };
    for (id, (s, _)) in entries {
        let func = strings[frames[id].1].clone();
        *t.by_func.entry(func).or_default() += s;
    }
    t
}

fn pprof_tally(path: &Path) -> Tally {
    let p = path.to_str().unwrap();
    let top = go_pprof(&["-top", "-nodecount=100000", "-sample_index=samples", p]);
    let mut t = Tally::default();
    let mut rows = false;
    for line in top.lines() {
        if let Some(i) = line.find("% of ") {
            let n = line[i + 5..].split_whitespace().next().unwrap();
            t.total = n.parse().expect("pprof total");
        }
        if line.trim_start().starts_with("flat") {
            rows = true;
            continue;
        }
        if !rows {
            continue;
        }
        let cols: Vec<&str> = line.split_whitespace().collect();
        if cols.len() < 6 {
            continue;
        }
        let flat: f64 = cols[0].parse().expect("flat count");
        let name = cols[5..].join(" ");
        *t.by_func.entry(name).or_default() += flat;
    }
    // The traces carry the Python functions under their native callers, and the labels.
    let traces = go_pprof(&["-traces", "-sample_index=samples", p]);
    assert!(traces.contains("heavy"), "traces name Python functions");
    assert!(traces.contains("PyEval_EvalCode"), "and native frames");
    assert!(
        traces.contains("thread:") && traces.contains("process:") && traces.contains("pid:"),
        "traces carry thread and process labels"
    );
    t
}

#[test]
fn every_format_agrees_and_converts_without_root() {
    require_root();
    let dir = scratch("formats");
    let base = record_and_convert(&dir);
    let with = |ext: &str| PathBuf::from(format!("{}.{ext}", base.display()));

    // The viewer's totals are ms; the other formats count samples of the profile's interval.
    let meta: Value =
        serde_json::from_str(&std::fs::read_to_string(with("json")).unwrap()).unwrap();
    let interval_ms = meta["meta"]["interval"].as_f64().unwrap();
    let mut gecko = gecko_tally(&with("json"));
    gecko.total /= interval_ms;
    for n in gecko.by_func.values_mut() {
        *n /= interval_ms;
    }
    let tallies = [
        ("collapsed", collapsed_tally(&with("folded"))),
        ("jsonl", jsonl_tally(&with("jsonl"))),
        ("pprof", pprof_tally(&with("pb.gz"))),
    ];
    assert!(gecko.total > 1000.0, "3 s of samples: {}", gecko.total);
    let top = gecko.top(5);
    assert!(
        top.iter().any(|(f, _)| f == "heavy"),
        "heavy is among the hottest: {top:?}"
    );
    for (name, t) in &tallies {
        let slack = (gecko.total * 0.01).max(3.0);
        assert!(
            (t.total - gecko.total).abs() <= slack,
            "{name} total {} vs Gecko {}",
            t.total,
            gecko.total
        );
        for (func, n) in &top {
            let theirs = t.by_func.get(func).copied().unwrap_or(0.0);
            assert!(
                (theirs - n).abs() <= slack,
                "{name}: {func} self {theirs} vs Gecko {n}; their top: {:?}",
                t.top(8)
            );
        }
        let their_top: HashSet<String> = t.top(5).into_iter().map(|(f, _)| f).collect();
        assert_eq!(
            their_top.len(),
            5,
            "{name} has five functions with self time"
        );
        assert_eq!(
            t.top(1)[0].0,
            top[0].0,
            "{name} and Gecko agree on the hottest function"
        );
    }

    // The flame graph: a self-contained SVG of the same samples.
    let svg = std::fs::read_to_string(with("svg")).unwrap();
    assert!(svg.starts_with("<?xml") && svg.contains("<script"));
    assert!(
        svg.contains("work.py:heavy:"),
        "Python frames in the flame graph"
    );
    assert!(
        (svg_total(&svg) - gecko.total).abs() <= (gecko.total * 0.01).max(3.0),
        "flame graph total"
    );

    // The statistics file, as Python 3.8's and 3.12's `pstats` load it: the samples of each
    // function where it is the innermost Python frame (tottime) and where it is on the stack
    // (cumtime), as the folded stacks count them, and its caller.
    let (folded, python_total) = collapsed_python(&with("folded"));
    let interval_s = 0.001;
    for label in ["3.8.18", "3.12.1"] {
        let stats = pstats_of(&python(label), &with("pstats"));
        let direct = stats[""].0;
        assert!(
            (direct - python_total).abs() <= (python_total * 0.01).max(3.0),
            "{label}: pstats has {direct} samples, the folded stacks {python_total} with Python"
        );
        for func in ["heavy", "medium", "light", "main"] {
            let (cc, nc, tt, ct, callers) = &stats[func];
            let (own, on_stack) = folded[func];
            let slack = (on_stack * 0.01).max(3.0);
            assert!(
                (cc - own).abs() <= slack && (nc - on_stack).abs() <= slack,
                "{label}: {func}: pstats {cc}/{nc} samples, folded {own}/{on_stack}"
            );
            assert!(
                (tt - cc * interval_s).abs() < 0.05 && (ct - nc * interval_s).abs() < 0.05,
                "{label}: {func}: tottime {tt} s for {cc} samples, cumtime {ct} s for {nc}"
            );
            if func != "main" {
                assert_eq!(callers, &["main"], "{label}: {func} is called by main");
            }
        }
        assert!(stats["heavy"].2 > stats["light"].2, "{label}: {stats:?}");
    }

    // The recording converts to another mode: cpu drops the (few) off-CPU samples.
    let cpu = dir.join("out/cpu.folded");
    let o = as_nobody(&[
        "convert",
        dir.join("run.tbpf").to_str().unwrap(),
        "-f",
        "collapsed",
        "--mode",
        "cpu",
        "-o",
        cpu.to_str().unwrap(),
    ])
    .output()
    .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let cpu_total = collapsed_tally(&cpu).total;
    assert!(
        cpu_total <= gecko.total && cpu_total > gecko.total * 0.5,
        "cpu {cpu_total} of wall {}",
        gecko.total
    );
}

/// `--open`: the link points at profiler.firefox.com, the profile is served on 127.0.0.1 at an
/// unguessable path with CORS for that origin only, and Ctrl-C ends it cleanly.
#[test]
fn open_serves_the_profile_to_the_firefox_profiler() {
    require_root();
    let dir = scratch("formats_open");
    let script = dir.join("work.py");
    std::fs::write(&script, WORK.replace("3.0", "0.5")).unwrap();
    let rec = dir.join("run.tbpf");
    let o = run_profiler(
        &[
            "record",
            "-o",
            rec.to_str().unwrap(),
            "--",
            python("3.11.7").to_str().unwrap(),
            script.to_str().unwrap(),
        ],
        Duration::from_secs(60),
    );
    assert!(o.status.success(), "record: {}", stderr_of(&o));
    let (mut child, link) = serve_recording(&rec, &dir.join("open.json"));
    let link = link.as_str();
    let enc = link
        .strip_prefix("https://profiler.firefox.com/from-url/")
        .unwrap_or_else(|| panic!("a from-url link: {link}"))
        .trim_end_matches('/');
    let url = enc.replace("%3A", ":").replace("%2F", "/");
    let rest = url
        .strip_prefix("http://127.0.0.1:")
        .expect("served on 127.0.0.1");
    let (port, path) = rest.split_once('/').unwrap();
    let port: u16 = port.parse().unwrap();
    let get = |p: &str| -> String {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        write!(
            s,
            "GET {p} HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: https://profiler.firefox.com\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    };
    let ok = get(&format!("/{path}"));
    assert!(ok.starts_with("HTTP/1.1 200"), "{:.200}", ok);
    assert!(ok.contains("Access-Control-Allow-Origin: https://profiler.firefox.com\r\n"));
    let body = &ok[ok.find("\r\n\r\n").unwrap() + 4..];
    let v: Value = serde_json::from_str(body).expect("the Gecko profile");
    assert_eq!(v["meta"]["product"], "tachyon-bpf");
    assert!(path.len() >= 32, "an unguessable path: {path}");
    let guess = get("/profile.json");
    assert!(guess.starts_with("HTTP/1.1 404"), "{guess:.100}");
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    wait_timeout(&mut child, Duration::from_secs(10));
    let st = child.wait().unwrap();
    assert_eq!(st.code(), Some(0), "Ctrl-C ends serving cleanly");
}

fn check_error(o: &Output, code: i32, needle: &str) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(code), "exit code; stderr: {err}");
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    assert!(err.contains(needle), "{needle:?} in {err}");
}

#[test]
fn bad_recordings_and_format_misuse() {
    let dir = scratch("formats_bad");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let junk = dir.join("junk.tbpf");
    std::fs::write(&junk, b"not a recording at all").unwrap();
    std::fs::set_permissions(&junk, std::fs::Permissions::from_mode(0o644)).unwrap();
    let o = as_nobody(&["convert", junk.to_str().unwrap()])
        .output()
        .unwrap();
    check_error(&o, 7, "not a tachyon-bpf recording");
    let o = as_nobody(&["convert", dir.join("missing.tbpf").to_str().unwrap()])
        .output()
        .unwrap();
    check_error(&o, 7, "cannot read");
    let o = Command::new(profiler_bin())
        .args(["--all", "--format", "svg"])
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(2),
        "an unknown format is a usage error"
    );
    let o = Command::new(profiler_bin())
        .args(["record", "--all", "--format", "pprof"])
        .output()
        .unwrap();
    check_error(&o, 2, "record writes a recording");
    // A heatmap is a directory: refused on standard output before anything is profiled.
    let o = Command::new(profiler_bin())
        .args(["-f", "heatmap", "-o", "-", "--", "true"])
        .output()
        .unwrap();
    check_error(&o, 2, "cannot go to standard output");
}

const SHIFT: &str = r#"
import sys, time
def busy(n):
    x = 0
    for i in range(n):
        x += i
def alpha(): busy(30000)
def beta(): busy(10000)
def gamma(): busy(10000)
def delta(): busy(10000)
new = sys.argv[1] == "new"
t0 = time.time()
while time.time() - t0 < 2:
    if new:
        alpha(); beta(); beta(); beta(); gamma()
    else:
        alpha(); alpha(); alpha(); beta(); delta()
"#;

/// `convert NEW --diff-against BASELINE`: two runs of one program whose work moved from `alpha`
/// to `beta`, with `gamma` only in the new one and `delta` only in the baseline. The flame graph
/// colours what grew red and what shrank blue and marks `gamma` new; `delta` is reported gone;
/// the folded diff carries both counts, the baseline's scaled to the new total.
#[test]
fn a_diff_against_a_baseline_shows_what_moved() {
    require_root();
    let dir = scratch("formats_diff");
    let script = dir.join("shift.py");
    std::fs::write(&script, SHIFT).unwrap();
    let py = python("3.12.1");
    let record = |name: &str, arg: &str, mode: &str| {
        let rec = dir.join(format!("{name}.tbpf"));
        let o = run_profiler(
            &[
                "record",
                "-m",
                mode,
                "-o",
                rec.to_str().unwrap(),
                "--",
                py.to_str().unwrap(),
                script.to_str().unwrap(),
                arg,
            ],
            Duration::from_secs(60),
        );
        assert!(o.status.success(), "record: {}", stderr_of(&o));
        rec
    };
    let old = record("old", "old", "cpu");
    let new = record("new", "new", "cpu");
    let svg = dir.join("diff.svg");
    let o = run_profiler(
        &[
            "convert",
            new.to_str().unwrap(),
            "--diff-against",
            old.to_str().unwrap(),
            "-o",
            svg.to_str().unwrap(),
        ],
        Duration::from_secs(60),
    );
    assert!(o.status.success(), "convert: {}", stderr_of(&o));
    let err = stderr_of(&o);
    // `  -45.3   87.3% ->  42.0%  shift.py:alpha`
    let change = |func: &str| -> (f64, f64) {
        let line = err
            .lines()
            .find(|l| l.ends_with(&format!("shift.py:{func}")))
            .unwrap_or_else(|| panic!("no change line for {func}: {err}"));
        let nums: Vec<f64> = line
            .split_whitespace()
            .filter_map(|w| w.trim_end_matches('%').parse().ok())
            .collect();
        (nums[1], nums[2])
    };
    let (a0, a1) = change("alpha");
    let (b0, b1) = change("beta");
    let (g0, g1) = change("gamma");
    // Work units: baseline alpha 90k, beta 10k, delta 10k; now alpha 30k, beta 30k, gamma 10k.
    assert!(
        (a0 - 81.8).abs() < 8.0 && (a1 - 42.9).abs() < 8.0,
        "alpha {a0} -> {a1}: {err}"
    );
    assert!(
        (b0 - 9.1).abs() < 5.0 && (b1 - 42.9).abs() < 8.0,
        "beta {b0} -> {b1}: {err}"
    );
    assert!(
        g0 == 0.0 && (g1 - 14.3).abs() < 8.0,
        "gamma {g0} -> {g1}: {err}"
    );
    assert!(
        err.lines()
            .any(|l| l.contains("gone:") && l.contains("shift.py:delta")),
        "delta is gone: {err}"
    );

    // The SVG: `busy` under alpha shrank (blue), under beta grew (red), gamma is marked new.
    let text = std::fs::read_to_string(&svg).unwrap();
    let frames: Vec<(String, (u8, u8, u8))> = text
        .split("<g><title>")
        .skip(1)
        .filter_map(|g| {
            let (title, rest) = g.split_once("</title>")?;
            let fill = rest.split("fill=\"rgb(").nth(1)?.split(')').next()?;
            let c: Vec<u8> = fill.split(',').filter_map(|x| x.parse().ok()).collect();
            Some((title.to_string(), (c[0], c[1], c[2])))
        })
        .collect();
    let busy: Vec<&(String, (u8, u8, u8))> = frames
        .iter()
        .filter(|(t, _)| t.starts_with("shift.py:busy (") && t.contains("%; "))
        .collect();
    // `name (N samples, P%; +D%)`: the change of the frame's own samples.
    let delta = |t: &str| -> f64 {
        t.rsplit("%; ")
            .next()
            .and_then(|d| d.trim_end_matches("%)").parse().ok())
            .unwrap_or(0.0)
    };
    let shrank = busy
        .iter()
        .min_by(|a, b| delta(&a.0).total_cmp(&delta(&b.0)))
        .expect("busy frames");
    let grew = busy
        .iter()
        .max_by(|a, b| delta(&a.0).total_cmp(&delta(&b.0)))
        .expect("busy frames");
    assert!(delta(&shrank.0) < -2.0 && delta(&grew.0) > 2.0, "{busy:?}");
    // Shades of blue and red (white is no change).
    let (r, g, b) = shrank.1;
    assert!(b == 255 && r == g && r < 240, "blue: {shrank:?}");
    let (r, g, b) = grew.1;
    assert!(r == 255 && g == b && b < 240, "red: {grew:?}");
    assert!(
        frames
            .iter()
            .any(|(t, _)| t.starts_with("shift.py:gamma (new) (")),
        "gamma is marked new"
    );
    assert!(text.contains("of the baseline is on call paths that are gone"));

    // The folded diff: both counts per call path, the baseline's scaled to the new total.
    let folded = dir.join("diff.folded");
    let o = run_profiler(
        &[
            "convert",
            new.to_str().unwrap(),
            "--diff-against",
            old.to_str().unwrap(),
            "-f",
            "collapsed",
            "-o",
            folded.to_str().unwrap(),
            "-q",
        ],
        Duration::from_secs(60),
    );
    assert!(o.status.success(), "{}", stderr_of(&o));
    let (mut before, mut after, mut alpha_before, mut alpha_after) = (0.0, 0.0, 0.0, 0.0);
    for line in std::fs::read_to_string(&folded).unwrap().lines() {
        let mut it = line.rsplitn(3, ' ');
        let a: f64 = it.next().unwrap().parse().unwrap();
        let b: f64 = it.next().unwrap().parse().unwrap();
        let stack = it.next().unwrap();
        assert!(
            !stack.contains("[pid ") && !stack.contains("[tid "),
            "{stack}"
        );
        before += b;
        after += a;
        if stack.contains(";shift.py:alpha;") {
            alpha_before += b;
            alpha_after += a;
        }
    }
    assert!(after > 1000.0, "{after} samples");
    // Scaled to the new total, less the baseline's call paths that are gone (`delta`, ~9%).
    assert!(
        before <= 1.02 * after && before >= 0.8 * after,
        "baseline {before} scaled against {after}"
    );
    assert!(
        alpha_before > 1.5 * alpha_after,
        "alpha {alpha_before} -> {alpha_after}"
    );

    // Modes must match, and the diff is one format.
    let wall = record("wall", "old", "wall");
    let o = run_profiler(
        &[
            "convert",
            new.to_str().unwrap(),
            "--diff-against",
            wall.to_str().unwrap(),
        ],
        Duration::from_secs(60),
    );
    assert!(
        o.status.success(),
        "a wall baseline gives cpu mode: {}",
        stderr_of(&o)
    );
    let o = run_profiler(
        &[
            "convert",
            wall.to_str().unwrap(),
            "--diff-against",
            new.to_str().unwrap(),
        ],
        Duration::from_secs(60),
    );
    check_error(&o, 2, "pick a mode both give with --mode");
    let o = run_profiler(
        &[
            "convert",
            new.to_str().unwrap(),
            "--diff-against",
            old.to_str().unwrap(),
            "-f",
            "gecko",
        ],
        Duration::from_secs(60),
    );
    check_error(&o, 2, "--diff-against writes one format");
}
