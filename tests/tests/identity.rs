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

fn go_pprof(args: &[&str]) -> String {
    let o = Command::new("go")
        .args(["tool", "pprof"])
        .args(args)
        .env("HOME", std::env::temp_dir())
        .output()
        .expect("`go` (Debian's golang-go; `cargo xtask setup` installs it)");
    assert!(
        o.status.success(),
        "go tool pprof {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
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
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap()
        .trim()
        .to_string();
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
