//! Continuous mode: one profile per interval, each complete under its final name and readable
//! by its consumer, never more than --keep of them, nothing partial after kill -9, and --push
//! delivering each interval's pprof to an HTTP endpoint without costing samples when that
//! endpoint is down or slow.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tachyon_bpf_tests::*;

/// A busy interpreter whose one function is `busy_fn`, for `secs` seconds.
fn busy(dir: &Path, secs: u32) -> KillOnDrop {
    let script = dir.join("busy.py");
    std::fs::write(
        &script,
        format!(
            "import time\ndef busy_fn():\n    t0 = time.monotonic()\n    while time.monotonic() - t0 < {secs}:\n        sum(range(500))\nbusy_fn()\n"
        ),
    )
    .unwrap();
    KillOnDrop(Command::new(python("3.12.1")).arg(&script).spawn().unwrap())
}

/// The intervals in `dir` by stem, with their files' extensions (files starting with `.` are
/// temporary and not counted).
fn intervals(dir: &Path) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue;
        }
        let (stem, ext) = name.split_once('.').unwrap();
        out.entry(stem.to_string())
            .or_default()
            .push(ext.to_string());
    }
    out
}

/// A complete gzip stream, decompressed.
fn gunzip(path: &Path) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(std::fs::File::open(path).unwrap())
        .read_to_end(&mut out)
        .unwrap_or_else(|e| panic!("{} is not a complete gzip file: {e}", path.display()));
    out
}

/// Total samples of a folded file; every line must be whole.
fn folded_total(path: &Path) -> u64 {
    let text = std::fs::read_to_string(path).unwrap();
    assert!(
        text.is_empty() || text.ends_with('\n'),
        "{}",
        path.display()
    );
    text.lines()
        .map(|l| l.rsplit_once(' ').unwrap().1.parse::<u64>().unwrap())
        .sum()
}

fn continuous_args<'a>(dir: &'a str, rotate: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec![
        "--all-pythons",
        "--continuous",
        "--rotate",
        rotate,
        "--output-dir",
        dir,
        "-f",
        "pprof,collapsed",
        "-r",
        "199",
    ];
    a.extend_from_slice(extra);
    a
}

#[test]
fn rotation_keeps_complete_files_and_no_more_than_keep() {
    require_root();
    let dir = scratch("continuous_rotate");
    let out = dir.join("out");
    let target = busy(&dir, 30);
    let pid = format!("[pid {}]", target.0.id());
    let out_s = out.to_str().unwrap().to_string();
    let mut prof = Command::new(profiler_bin())
        .args(continuous_args(&out_s, "2s", &["--keep", "4", "-d", "20"]))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    let mut most = 0;
    while prof.try_wait().unwrap().is_none() {
        assert!(t0.elapsed() < Duration::from_secs(60), "the run ends");
        let now = intervals(&out);
        most = most.max(now.len());
        assert!(now.len() <= 4, "never more than --keep intervals: {now:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let o = prof.wait_with_output().unwrap();
    drop(target);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    let written: u64 = err
        .lines()
        .find_map(|l| {
            l.split_once(" interval profiles")?
                .0
                .rsplit(' ')
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("the summary counts the intervals: {err}"));
    assert!(
        (10..=11).contains(&written),
        "20 s in 2 s intervals: {written}"
    );
    // The summary speaks of the whole run, not of its last interval: the busy thread's records
    // of at least 8 whole intervals (330 or more each, as checked below), where one interval
    // holds at most 440.
    let python: u64 = err
        .lines()
        .find_map(|l| {
            l.strip_prefix("tachyon-bpf: python: ")?
                .split_once(' ')?
                .0
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("the summary's python line: {err}"));
    assert!(
        python >= 8 * 330,
        "the summary's Python records are the run's: {python}\n{err}"
    );
    let left = intervals(&out);
    assert_eq!(left.len(), 4, "--keep 4: {left:?}");
    assert_eq!(most, 4);
    for (stem, exts) in &left {
        let mut exts = exts.clone();
        exts.sort();
        assert_eq!(exts, vec!["folded", "pb.gz"], "{stem}: both formats");
        let folded = out.join(format!("{stem}.folded"));
        folded_total(&folded);
        let text = std::fs::read_to_string(&folded).unwrap();
        let n: u64 = text
            .lines()
            .filter(|l| l.contains(&pid))
            .map(|l| l.rsplit_once(' ').unwrap().1.parse::<u64>().unwrap())
            .sum();
        assert!(
            text.contains("busy.py:busy_fn:"),
            "{stem}: the busy function"
        );
        let pprof = out.join(format!("{stem}.pb.gz"));
        let top = pprof_top(&pprof);
        assert!(top.contains("busy_fn"), "{stem}: {top}");
        // 199 Hz, one busy thread, 2 s (the last interval is the partial end).
        if stem != left.keys().last().unwrap() {
            assert!(
                (330..=440).contains(&n),
                "{stem}: {n} samples in 2 s at 199 Hz"
            );
        }
    }
}

#[test]
fn kill_9_leaves_only_complete_interval_files() {
    require_root();
    let dir = scratch("continuous_kill");
    let out = dir.join("out");
    let target = busy(&dir, 30);
    let out_s = out.to_str().unwrap().to_string();
    let mut prof = Command::new(profiler_bin())
        .args(continuous_args(&out_s, "1s", &[]))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(5500));
    // SAFETY: signalling our own child.
    unsafe { libc::kill(prof.id() as i32, libc::SIGKILL) };
    let _ = prof.wait();
    drop(target);
    let left = intervals(&out);
    assert!(
        left.len() >= 4,
        "intervals written before the kill: {left:?}"
    );
    for stem in left.keys() {
        for ext in ["pb.gz", "folded"] {
            let f = out.join(format!("{stem}.{ext}"));
            if !f.exists() {
                continue; // the kill came between the two formats of the last interval
            }
            if ext == "pb.gz" {
                gunzip(&f);
                assert!(pprof_top(&f).contains("busy_fn"));
            } else {
                folded_total(&f);
            }
        }
    }
}

/// The requests an ingest server received: (target, body).
type Received = Arc<Mutex<Vec<(String, Vec<u8>)>>>;

/// A minimal HTTP server recording each request's target and body, answering after `delay`.
/// Reads one HTTP request: (request target, body).
fn read_request(s: &std::net::TcpStream) -> Option<(String, Vec<u8>)> {
    let mut r = BufReader::new(s.try_clone().ok()?);
    let mut line = String::new();
    r.read_line(&mut line).ok()?;
    let target = line.split_whitespace().nth(1).unwrap_or("").to_string();
    let mut len = 0usize;
    loop {
        let mut h = String::new();
        if r.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
            break;
        }
        if let Some(v) = h.to_ascii_lowercase().strip_prefix("content-length:") {
            len = v.trim().parse().unwrap_or(0);
        }
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).ok()?;
    Some((target, body))
}

fn ingest_server(delay: Duration) -> (u16, Received) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let got = Arc::new(Mutex::new(Vec::new()));
    let g = got.clone();
    std::thread::spawn(move || {
        for conn in l.incoming() {
            let Ok(mut s) = conn else { continue };
            let g = g.clone();
            std::thread::spawn(move || {
                let Some((target, body)) = read_request(&s) else {
                    return;
                };
                std::thread::sleep(delay);
                g.lock().unwrap().push((target, body));
                let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
            });
        }
    });
    (port, got)
}

/// Samples of a continuous run of `secs` with `extra` options, from its summary.
fn run_samples(dir: &Path, name: &str, extra: &[&str]) -> (u64, Duration) {
    let out: PathBuf = dir.join(name);
    let out_s = out.to_str().unwrap().to_string();
    let mut args = continuous_args(&out_s, "1s", &["-d", "6"]);
    args.extend_from_slice(extra);
    let t0 = Instant::now();
    let o = run_profiler(&args, Duration::from_secs(60));
    let took = t0.elapsed();
    let err = stderr_of(&o);
    assert!(o.status.success(), "{err}");
    let samples = err
        .lines()
        .find_map(|l| {
            let (_, rest) = l.split_once(" interval profiles in ")?;
            rest.rsplit_once(" (")?
                .1
                .strip_suffix(" samples)")?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("a summary with the samples: {err}"));
    assert!(err.contains("lost 0 "), "{err}");
    (samples, took)
}

#[test]
fn push_delivers_each_interval_and_a_bad_endpoint_costs_nothing() {
    require_root();
    let dir = scratch("continuous_push");
    let _target = busy(&dir, 60);
    let (port, got) = ingest_server(Duration::ZERO);
    let url = format!("http://127.0.0.1:{port}");
    let (base, _) = run_samples(
        &dir,
        "pushed",
        &["--push", &url, "--push-name", "shop.cpu{env=test}"],
    );
    let reqs = got.lock().unwrap().clone();
    assert!(reqs.len() >= 6, "one push per interval: {}", reqs.len());
    for (i, (target_url, body)) in reqs.iter().enumerate() {
        let (path, query) = target_url.split_once('?').unwrap();
        assert_eq!(path, "/ingest");
        let q: BTreeMap<&str, &str> = query
            .split('&')
            .filter_map(|kv| kv.split_once('='))
            .collect();
        assert_eq!(q["name"], "shop.cpu%7Benv%3Dtest%7D");
        assert_eq!(q["format"], "pprof");
        let (from, until): (u64, u64) = (q["from"].parse().unwrap(), q["until"].parse().unwrap());
        assert!(from < until && until - from <= 3, "{from}..{until}");
        let f = dir.join(format!("push{i}.pb.gz"));
        std::fs::write(&f, body).unwrap();
        let top = pprof_top(&f);
        assert!(top.contains("busy_fn"), "{top}");
    }

    // Nothing listening, and an endpoint that takes 30 s per request: the same samples, and
    // the run still ends promptly.
    let closed = TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = format!("http://127.0.0.1:{}", closed.local_addr().unwrap().port());
    drop(closed);
    let (slow_port, _) = ingest_server(Duration::from_secs(30));
    let slow = format!("http://127.0.0.1:{slow_port}");
    for (name, url) in [("down", dead), ("slow", slow)] {
        let (n, took) = run_samples(&dir, name, &["--push", &url]);
        assert!(
            (n as f64 - base as f64).abs() <= 0.1 * base as f64,
            "{name} endpoint: {n} samples vs {base}"
        );
        assert!(took < Duration::from_secs(20), "{name}: ended in {took:?}");
    }
}

/// An endpoint that answers every request with a redirect to `to`.
fn redirecting_server(to: &str) -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let reply = format!("HTTP/1.1 302 Found\r\nLocation: {to}\r\nContent-Length: 0\r\n\r\n");
    std::thread::spawn(move || {
        for conn in l.incoming() {
            let Ok(mut s) = conn else { continue };
            let reply = reply.clone();
            std::thread::spawn(move || {
                let _ = read_request(&s);
                let _ = s.write_all(reply.as_bytes());
            });
        }
    });
    port
}

/// (sent, failed, dropped, not sent by exit) from the summary's push line.
fn push_counts(err: &str) -> [u64; 4] {
    let line = err
        .lines()
        .find(|l| l.contains("tachyon-bpf: pushed "))
        .unwrap_or_else(|| panic!("a push line: {err}"));
    let nums: Vec<u64> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|w| w.parse().ok())
        .collect();
    [nums[0], nums[1], nums[2], nums[3]]
}

#[test]
fn push_follows_no_redirect_and_counts_every_interval_once() {
    require_root();
    let dir = scratch("continuous_push_redirect");
    let _target = busy(&dir, 60);
    let (elsewhere, got) = ingest_server(Duration::ZERO);
    let redirect = redirecting_server(&format!("http://127.0.0.1:{elsewhere}/ingest"));
    let (slow_port, _) = ingest_server(Duration::from_secs(30));
    for (name, url) in [
        ("redirect", format!("http://127.0.0.1:{redirect}")),
        ("slow", format!("http://127.0.0.1:{slow_port}")),
    ] {
        let out = dir.join(name);
        let out_s = out.to_str().unwrap().to_string();
        let mut args = continuous_args(&out_s, "1s", &["-d", "5"]);
        args.extend_from_slice(&["--push", &url]);
        let o = run_profiler(&args, Duration::from_secs(60));
        let err = stderr_of(&o);
        assert!(o.status.success(), "{err}");
        let [sent, failed, dropped, left] = push_counts(&err);
        let intervals = intervals(&out).len() as u64;
        assert_eq!(
            sent + failed + dropped + left,
            intervals,
            "{name}: every interval counted once: {err}"
        );
        if name == "redirect" {
            assert_eq!(sent, 0, "a redirect is not a delivery: {err}");
            assert!(got.lock().unwrap().is_empty(), "the redirect was followed");
        }
    }
}

/// A busy interpreter whose one function is `{name}_fn`, named `name` by `OTEL_SERVICE_NAME`.
fn named_service(dir: &Path, name: &str) -> KillOnDrop {
    let script = dir.join(format!("{name}.py"));
    std::fs::write(
        &script,
        format!(
            "import time\ndef {name}_fn():\n    t0 = time.monotonic()\n    while time.monotonic() - t0 < 60:\n        sum(range(500))\n{name}_fn()\n"
        ),
    )
    .unwrap();
    KillOnDrop(
        Command::new(python("3.12.1"))
            .arg(&script)
            .env("OTEL_SERVICE_NAME", name)
            .spawn()
            .unwrap(),
    )
}

#[test]
fn push_sends_one_series_per_service_with_its_own_samples() {
    require_root();
    let dir = scratch("continuous_push_series");
    let a = named_service(&dir, "alpha");
    let b = named_service(&dir, "beta");
    let (pa, pb) = (a.0.id().to_string(), b.0.id().to_string());
    let (port, got) = ingest_server(Duration::ZERO);
    let url = format!("http://127.0.0.1:{port}");
    let out = dir.join("out");
    let o = run_profiler(
        &[
            "-p",
            &pa,
            "-p",
            &pb,
            "--continuous",
            "--rotate",
            "1s",
            "--output-dir",
            out.to_str().unwrap(),
            "-f",
            "pprof",
            "-r",
            "199",
            "-d",
            "4",
            "--push",
            &url,
            "--label",
            "region=test-1",
        ],
        Duration::from_secs(60),
    );
    let err = stderr_of(&o);
    assert!(o.status.success(), "{err}");
    let host = hostname();
    let reqs = got.lock().unwrap().clone();
    let mut per_series: BTreeMap<String, usize> = BTreeMap::new();
    for (i, (target_url, body)) in reqs.iter().enumerate() {
        let query = target_url.split_once('?').unwrap().1;
        let q: BTreeMap<&str, &str> = query
            .split('&')
            .filter_map(|kv| kv.split_once('='))
            .collect();
        let name = percent_decode(q["name"]);
        let f = dir.join(format!("push{i}.pb.gz"));
        std::fs::write(&f, body).unwrap();
        let top = pprof_top(&f);
        // Pyroscope's `APP.MODE{labels}`: the service is the application.
        let (own, other) = if name.starts_with("alpha.wall{") {
            ("alpha_fn", "beta_fn")
        } else if name.starts_with("beta.wall{") {
            ("beta_fn", "alpha_fn")
        } else {
            panic!("a series of another name: {name}");
        };
        assert!(
            name.contains(&format!("host={host}")) && name.contains("region=test-1"),
            "{name}"
        );
        assert!(top.contains(own) && !top.contains(other), "{name}:\n{top}");
        *per_series.entry(name).or_default() += 1;
    }
    assert_eq!(per_series.len(), 2, "{per_series:?}");
    let [sent, failed, dropped, left] = push_counts(&err);
    assert!(sent >= 3 && failed + dropped + left == 0, "{err}");
    // Each interval was pushed as one request per service it has samples of: as many as the
    // interval files written with that service's samples (the last, short interval may hold
    // one service's alone).
    let files = intervals(&out);
    assert_eq!(files.len() as u64, sent, "{files:?}\n{err}");
    for service in ["alpha", "beta"] {
        let with = files
            .keys()
            .filter(|stem| {
                let f = out.join(format!("{stem}.pb.gz"));
                go_pprof(&["-raw", f.to_str().unwrap()])
                    .contains(&format!("service_name:[{service}]"))
            })
            .count();
        let pushed = per_series
            .iter()
            .find(|(n, _)| n.starts_with(&format!("{service}.")))
            .map_or(0, |(_, &n)| n);
        assert_eq!(pushed, with, "{service}: {per_series:?}");
    }
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() + 1 {
            out.push(u8::from_str_radix(&s[i + 1..i + 3], 16).unwrap());
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).unwrap()
}

/// How systemd's `EnvironmentFile=` and Kubernetes' `env:` configure the daemon: no argument,
/// every option a `TACHYON_BPF_*` variable.
#[test]
fn a_continuous_run_configured_by_its_environment_alone() {
    require_root();
    let dir = scratch("continuous_env");
    let target = named_service(&dir, "gamma");
    let out = dir.join("out");
    let mut child = Command::new(profiler_bin())
        .env("TACHYON_BPF_PID", target.0.id().to_string())
        .env("TACHYON_BPF_CONTINUOUS", "true")
        .env("TACHYON_BPF_OUTPUT_DIR", &out)
        .env("TACHYON_BPF_ROTATE", "1s")
        .env("TACHYON_BPF_DURATION", "3")
        .env("TACHYON_BPF_FORMAT", "pprof,collapsed")
        .env("TACHYON_BPF_MODE", "cpu")
        .env("TACHYON_BPF_RATE", "99")
        .env("TACHYON_BPF_LABELS", "zone=z1,tier=web")
        .env("TACHYON_BPF_QUIET", "true")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while child.try_wait().unwrap().is_none() && t0.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(100));
    }
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", stderr_of(&o));
    assert!(o.stderr.is_empty(), "quiet: {}", stderr_of(&o));
    let files = intervals(&out);
    assert!(files.len() >= 2, "{files:?}");
    for (stem, exts) in &files {
        let mut exts = exts.clone();
        exts.sort();
        assert_eq!(exts, ["folded", "pb.gz"], "{stem}");
        let f = out.join(format!("{stem}.pb.gz"));
        let raw = go_pprof(&["-raw", f.to_str().unwrap()]);
        // The mode, the rate and the labels came from the environment.
        assert!(raw.contains("cpu/nanoseconds"), "{raw}");
        assert!(raw.contains("Period: 10101010"), "99 Hz: {raw}");
        assert!(
            raw.contains("zone:[z1]") && raw.contains("tier:[web]"),
            "{raw}"
        );
        assert!(raw.contains("gamma_fn"), "{raw}");
    }
}
