//! Fleet identity: two Python services on one host, each named by the variable its framework
//! sets, profiled in one run with the run's own `--label` and an `--env-label`. Every format
//! says which service each sample came from, read back by its consumer: `go tool pprof` (sample
//! labels, and a focus on one service's label), the Firefox Profiler CLI (process tracks), and
//! the JSONL meta record; a recording keeps it all through `convert`. Nothing else of the
//! targets' environments is read into any of them.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use tachyon_bpf_tests::*;

const SECRET: &str = "hunter2-never-read";

/// A busy Python service whose one hot function is `{name}_work`, with `env` set.
fn service(dir: &Path, name: &str, env: &[(&str, &str)]) -> KillOnDrop {
    let script = dir.join(format!("{name}_app.py"));
    std::fs::write(
        &script,
        format!(
            "import time\ndef {name}_work():\n    t0 = time.monotonic()\n    while time.monotonic() - t0 < 30:\n        sum(range(500))\n{name}_work()\n"
        ),
    )
    .unwrap();
    let mut c = Command::new(python("3.12.1"));
    c.arg(&script)
        .env("SECRET_TOKEN", SECRET)
        .stdout(Stdio::null());
    for (k, v) in env {
        c.env(k, v);
    }
    KillOnDrop(c.spawn().unwrap())
}

/// Checks one profile's pprof, Gecko and JSONL files (`base.pb.gz`, `.json`, `.jsonl`).
fn check_formats(base: &Path, host: &str) {
    let with = |ext: &str| PathBuf::from(format!("{}.{ext}", base.display()));
    for ext in ["pb.gz", "json", "jsonl"] {
        let bytes = std::fs::read(with(ext)).unwrap();
        let text = if ext == "pb.gz" {
            let mut s = Vec::new();
            std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&bytes[..]), &mut s)
                .unwrap();
            s
        } else {
            bytes
        };
        assert!(
            !String::from_utf8_lossy(&text).contains(SECRET),
            "{ext}: a variable that was not asked for was read"
        );
    }

    // pprof: every sample carries its service, the run's label and the variable asked for.
    let pb = with("pb.gz");
    let pb = pb.to_str().unwrap();
    let tags = go_pprof(&["-tags", "-sample_index=samples", pb]);
    for want in [
        "service_name",
        "checkout",
        "search",
        "cluster",
        "eu-test",
        "DEPLOY_ENV",
    ] {
        assert!(tags.contains(want), "pprof tags lack {want}:\n{tags}");
    }
    for (service, own, other) in [
        ("checkout", "checkout_work", "search_work"),
        ("search", "search_work", "checkout_work"),
    ] {
        let top = go_pprof(&[
            "-top",
            "-sample_index=samples",
            &format!("-tagfocus=service_name={service}"),
            pb,
        ]);
        assert!(top.contains(own), "{service}'s samples name {own}:\n{top}");
        assert!(
            !top.contains(other),
            "{service}'s samples are its own:\n{top}"
        );
    }
    // The variable is the checkout service's alone; the run's label is on every sample.
    let canary = go_pprof(&[
        "-top",
        "-sample_index=samples",
        "-tagfocus=DEPLOY_ENV=canary",
        pb,
    ]);
    assert!(canary.contains("checkout_work") && !canary.contains("search_work"));
    let raw = go_pprof(&["-raw", "-sample_index=samples", pb]);
    let samples = raw.matches("cluster:[eu-test]").count();
    let services = raw.matches("service_name:[").count();
    assert!(
        samples > 10 && samples == services,
        "{samples} vs {services}"
    );

    // Gecko, through the Firefox Profiler CLI: the process tracks name their services.
    let v = Viewer::load(&with("json")).unwrap();
    let names: Vec<String> = v.processes().unwrap().into_iter().map(|p| p.name).collect();
    for (script, service) in [
        ("checkout_app.py", "service checkout"),
        ("search_app.py", "service search"),
    ] {
        assert!(
            names
                .iter()
                .any(|n| n.contains(script) && n.contains(service)),
            "{script} [{service}] in {names:?}"
        );
    }
    let g: Value = serde_json::from_slice(&std::fs::read(with("json")).unwrap()).unwrap();
    let t = &g["meta"]["tachyon"];
    assert_eq!(t["host"], host);
    assert_eq!(t["labels"]["cluster"], "eu-test");
    let procs = t["processes"].as_array().unwrap();
    let checkout = procs
        .iter()
        .find(|p| p["service"] == "checkout")
        .unwrap_or_else(|| panic!("{procs:?}"));
    assert_eq!(checkout["serviceSource"], "otel");
    assert_eq!(checkout["labels"]["DEPLOY_ENV"], "canary");
    assert!(checkout["nsPid"].is_null(), "a host process: {checkout}");
    let search = procs.iter().find(|p| p["service"] == "search").unwrap();
    assert_eq!(search["serviceSource"], "pyroscope");
    assert!(search["labels"].get("DEPLOY_ENV").is_none(), "{search}");

    // JSONL: the meta record.
    let text = std::fs::read_to_string(with("jsonl")).unwrap();
    let meta: Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    assert_eq!(meta["type"], "meta");
    assert_eq!(meta["host"], host);
    let services: Vec<&str> = meta["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["labels"]["service_name"].as_str())
        .collect();
    assert!(
        services.contains(&"checkout") && services.contains(&"search"),
        "{services:?}"
    );
}

#[test]
fn two_services_are_told_apart_in_every_format_and_through_a_recording() {
    require_root();
    let dir = scratch("identity");
    let a = service(
        &dir,
        "checkout",
        &[("OTEL_SERVICE_NAME", "checkout"), ("DEPLOY_ENV", "canary")],
    );
    let b = service(&dir, "search", &[("PYROSCOPE_APPLICATION_NAME", "search")]);
    std::thread::sleep(Duration::from_millis(300));
    let (pa, pb) = (a.0.id().to_string(), b.0.id().to_string());
    let host = hostname();
    let common = [
        "-p",
        &pa,
        "-p",
        &pb,
        "-d",
        "2",
        "--label",
        "cluster=eu-test",
        "--env-label",
        "DEPLOY_ENV",
    ];

    // A live run.
    let base = dir.join("live");
    let mut args = vec!["-f", "gecko,pprof,jsonl", "-o", base.to_str().unwrap()];
    args.extend_from_slice(&common);
    let o = run_profiler(&args, Duration::from_secs(60));
    assert!(o.status.success(), "{}", stderr_of(&o));
    check_formats(&base, &host);

    // A recording, converted after the processes are gone.
    let rec = dir.join("run.tbpf");
    let mut args = vec!["record", "-o", rec.to_str().unwrap()];
    args.extend_from_slice(&common);
    let o = run_profiler(&args, Duration::from_secs(60));
    assert!(o.status.success(), "record: {}", stderr_of(&o));
    drop((a, b));
    let conv = dir.join("conv");
    let o = run_profiler(
        &[
            "convert",
            rec.to_str().unwrap(),
            "-f",
            "gecko,pprof,jsonl",
            "-o",
            conv.to_str().unwrap(),
        ],
        Duration::from_secs(60),
    );
    assert!(o.status.success(), "convert: {}", stderr_of(&o));
    check_formats(&conv, &host);
}

#[test]
fn bad_labels_are_refused_before_anything_starts() {
    for (args, says) in [
        (&["--label", "cluster"][..], "is not NAME=VALUE"),
        (&["--label", "9x=1"][..], "is not a label name"),
        (&["--label", "a-b=1"][..], "is not a label name"),
        (&["--label", "service_name=x"][..], "sets itself"),
        (&["--label", "x="][..], "must be 1 to 256 bytes"),
        (&["--env-label", "A=B"][..], "environment variable"),
    ] {
        let mut all = vec!["-d", "1"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["--", "true"]);
        let o = run_profiler(&all, Duration::from_secs(10));
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr_of(&o));
        assert!(stderr_of(&o).contains(says), "{args:?}: {}", stderr_of(&o));
    }
}

/// The receiver, running, with the file its summaries go to.
fn otlp_receiver(dir: &Path) -> (KillOnDrop, u16, PathBuf) {
    let script = dir.join("receiver.py");
    std::fs::write(&script, OTLP_RECEIVER).unwrap();
    let log = dir.join("received.jsonl");
    let python = tools_dir().join("otlp/venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: `cargo xtask setup` installs it",
        python.display()
    );
    let mut child = Command::new(python)
        .arg(&script)
        .arg(&log)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let port = first_line(&mut child).parse().expect("the receiver's port");
    (KillOnDrop(child), port, log)
}

fn received(log: &Path) -> Vec<Value> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Total of a pprof's second value (the mode's time, ns), from `go tool pprof -raw`.
fn pprof_time_total(path: &Path) -> i64 {
    let raw = go_pprof(&["-raw", path.to_str().unwrap()]);
    raw.lines()
        .filter_map(|l| {
            let (values, _) = l.split_once(':')?;
            let v: Vec<i64> = values
                .split_whitespace()
                .map(|x| x.parse().ok())
                .collect::<Option<_>>()?;
            (v.len() == 2).then(|| v[1])
        })
        .sum()
}

#[test]
fn otlp_export_is_read_by_the_official_generated_code() {
    require_root();
    let dir = scratch("otlp");
    let (_rx, port, log) = otlp_receiver(&dir);
    let url = format!("http://127.0.0.1:{port}");
    let a = service(&dir, "checkout", &[("OTEL_SERVICE_NAME", "checkout")]);
    let b = service(&dir, "search", &[("OTEL_SERVICE_NAME", "search")]);
    std::thread::sleep(Duration::from_millis(300));
    let (pa, pb) = (a.0.id().to_string(), b.0.id().to_string());
    let host = hostname();

    // One run: its pprof file, and the same profile sent once at its end.
    let pprof = dir.join("run.pb.gz");
    let o = run_profiler(
        &[
            "-p",
            &pa,
            "-p",
            &pb,
            "-d",
            "2",
            "-m",
            "cpu",
            "-f",
            "pprof",
            "-o",
            pprof.to_str().unwrap(),
            "--otlp",
            &url,
            "--label",
            "cluster=eu-test",
        ],
        Duration::from_secs(60),
    );
    let err = stderr_of(&o);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("OTLP: sent 1 profiles, 0 failed"), "{err}");
    let reqs = received(&log);
    assert_eq!(reqs.len(), 1, "{reqs:?}");
    let r = &reqs[0];
    assert_eq!(r["path"], "/v1development/profiles");
    assert_eq!(r["type"], "application/x-protobuf");
    let procs = r["processes"].as_array().unwrap();
    assert_eq!(procs.len(), 2, "{procs:?}");
    let mut total = 0;
    for (service, pid, own) in [
        ("checkout", &pa, "checkout_work"),
        ("search", &pb, "search_work"),
    ] {
        let p = procs
            .iter()
            .find(|p| p["attrs"]["service.name"] == service)
            .unwrap_or_else(|| panic!("{service}: {procs:?}"));
        let at = &p["attrs"];
        assert_eq!(at["host.name"], host.as_str());
        assert_eq!(at["process.pid"].as_i64().unwrap().to_string(), *pid);
        assert_eq!(at["process.runtime.name"], "cpython");
        assert_eq!(at["process.runtime.version"], "3.12.1");
        assert_eq!(at["cluster"], "eu-test");
        assert!(at["process.executable.name"]
            .as_str()
            .unwrap()
            .starts_with("python3"));
        assert_eq!(p["kind"], "cpu/nanoseconds");
        assert!(p["threads"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t == "python3"));
        // Python frames with their file and line; native ones with their mapping.
        let frames = p["frames"].as_array().unwrap();
        let py = frames
            .iter()
            .find(|f| f[0] == own)
            .unwrap_or_else(|| panic!("{own} in {frames:?}"));
        assert!(py[1]
            .as_str()
            .unwrap()
            .ends_with(&format!("{service}_app.py")));
        assert!(py[2].as_i64().unwrap() >= 2, "{py}");
        assert!(
            frames
                .iter()
                .any(|f| f[3].as_str().unwrap().contains("libpython3.12")),
            "native frames carry their mapping: {frames:?}"
        );
        // Native mappings carry their GNU build id, as the file has it.
        let libpython = python("3.12.1")
            .parent()
            .unwrap()
            .join("../lib/libpython3.12.so.1.0")
            .canonicalize()
            .unwrap();
        let notes = Command::new("readelf")
            .arg("-n")
            .arg(&libpython)
            .output()
            .expect("readelf");
        let want_id = String::from_utf8_lossy(&notes.stdout)
            .lines()
            .find_map(|l| l.trim().strip_prefix("Build ID: ").map(str::to_string))
            .expect("libpython has a build id");
        let ids = &p["build_ids"];
        let got_id = ids
            .as_object()
            .unwrap()
            .iter()
            .find(|(path, _)| path.contains("libpython3.12.so"))
            .map(|(_, id)| id.clone());
        assert_eq!(got_id, Some(serde_json::json!(want_id)), "{ids}");
        let other = if service == "checkout" {
            "search_work"
        } else {
            "checkout_work"
        };
        assert!(
            !frames.iter().any(|f| f[0] == other),
            "{service}: {frames:?}"
        );
        total += p["total"].as_i64().unwrap();
    }
    // The same time as the run's pprof, to the nanosecond.
    let want = pprof_time_total(&pprof);
    assert!(want > 1_000_000_000, "{want}");
    assert_eq!(total, want);

    // Continuous: each interval is a request.
    let before = received(&log).len();
    let out = dir.join("intervals");
    let o = run_profiler(
        &[
            "-p",
            &pa,
            "--continuous",
            "--rotate",
            "1s",
            "--output-dir",
            out.to_str().unwrap(),
            "-f",
            "pprof",
            "-d",
            "3",
            "--otlp",
            &url,
        ],
        Duration::from_secs(60),
    );
    let err = stderr_of(&o);
    assert!(o.status.success(), "{err}");
    let reqs = received(&log).split_off(before);
    let files = std::fs::read_dir(&out).unwrap().count();
    assert!(
        reqs.len() >= 2 && reqs.len() == files,
        "{} requests, {files} files",
        reqs.len()
    );
    for r in &reqs {
        assert_eq!(r["processes"][0]["attrs"]["service.name"], "checkout");
    }
}
