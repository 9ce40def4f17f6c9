//! Bad input and bad environments: one clear line on stderr and a distinct exit code each.

use std::process::{Command, Output};
use std::time::Duration;

use tachyon_bpf_tests::*;

fn check(o: &Output, code: i32, needle: &str) {
    let err = stderr_of(o);
    assert_eq!(o.status.code(), Some(code), "exit code; stderr: {err}");
    assert!(err.contains(needle), "expected {needle:?} in stderr: {err}");
    assert!(!err.contains("panicked"), "panic: {err}");
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "expected one line: {err}");
}

fn run_wrapped(wrapper: &[&str], args: &[&str]) -> Output {
    let mut child = Command::new(wrapper[0])
        .args(&wrapper[1..])
        .arg(profiler_bin())
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_timeout(&mut child, Duration::from_secs(30));
    child.wait_with_output().unwrap()
}

#[test]
fn not_root() {
    require_root();
    let o = run_wrapped(
        &[
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
        ],
        &["--all", "-d", "1", "-o", "/tmp/never.json"],
    );
    check(&o, 3, "needs root");
}

#[test]
fn missing_bpf_capabilities_are_named() {
    require_root();
    let o = run_wrapped(
        &["setpriv", "--bounding-set=-bpf,-perfmon,-sys_admin"],
        &["--all", "-d", "1", "-o", "/tmp/never.json"],
    );
    check(&o, 3, "CAP_BPF, CAP_PERFMON");
}

#[test]
fn kernel_without_btf() {
    require_root();
    // A mount namespace in which /sys/kernel/btf is empty, as on a kernel built without BTF.
    let dir = scratch("no_btf");
    let out = dir.join("p.json");
    let script = format!(
        "mount -t tmpfs none /sys/kernel/btf && exec {} --all -d 1 -o {}",
        profiler_bin().display(),
        out.display()
    );
    let mut child = Command::new("unshare")
        .args(["-m", "sh", "-c", &script])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_timeout(&mut child, Duration::from_secs(30));
    let o = child.wait_with_output().unwrap();
    check(&o, 4, "no BTF");
}

#[test]
fn unknown_pid() {
    require_root();
    let o = run_profiler(
        &["--pid", "3999999", "-d", "1", "-o", "/tmp/never.json"],
        Duration::from_secs(30),
    );
    check(&o, 5, "no process with pid 3999999");
}

#[test]
fn command_that_cannot_start() {
    require_root();
    let dir = scratch("bad_command");
    let out = dir.join("p.json");
    let o = run_profiler(
        &["-o", out.to_str().unwrap(), "--", "/nonexistent/program"],
        Duration::from_secs(30),
    );
    check(&o, 5, "cannot start /nonexistent/program");
    assert!(!out.exists());
}

#[test]
fn unwritable_output() {
    require_root();
    let o = run_profiler(
        &["--all", "-d", "1", "-o", "/nonexistent-dir/p.json"],
        Duration::from_secs(30),
    );
    check(&o, 6, "cannot write /nonexistent-dir/p.json");
    let dir = scratch("out_is_dir");
    let o = run_profiler(
        &["--all", "-d", "1", "-o", dir.to_str().unwrap()],
        Duration::from_secs(30),
    );
    check(&o, 6, "is a directory");
}

#[test]
fn nothing_to_profile() {
    require_root();
    let o = run_profiler(&["-d", "1"], Duration::from_secs(30));
    check(&o, 2, "nothing to profile");
    let o = run_profiler(&["--rate", "0", "--all"], Duration::from_secs(30));
    assert_eq!(o.status.code(), Some(2), "{}", stderr_of(&o));
}

#[test]
fn impossible_values_are_refused_before_anything_starts() {
    require_root();
    let dir = scratch("bad_values");
    let out = dir.join("p.json");
    let o_ = out.to_str().unwrap();
    // Durations that are not a time (these panicked, or ran with an empty profile).
    for d in ["inf", "1e20", "nan", "-5", "0"] {
        let o = run_profiler(
            &["--all", &format!("--duration={d}"), "-o", o_],
            Duration::from_secs(30),
        );
        check(&o, 2, "is not a duration");
    }
    // With a command, nothing is launched (an infinite -d left it running as an orphan).
    let marker = format!("never-launched-{}", std::process::id());
    let o = run_profiler(
        &[
            "-d",
            "inf",
            "-o",
            o_,
            "--",
            "sh",
            "-c",
            &format!("sleep 5 # {marker}"),
        ],
        Duration::from_secs(30),
    );
    check(&o, 2, "is not a duration");
    assert!(!Command::new("pgrep")
        .args(["-f", &marker])
        .status()
        .unwrap()
        .success());
    let cont = |extra: &[&str]| {
        let mut a = vec![
            "--all",
            "--continuous",
            "--output-dir",
            dir.to_str().unwrap(),
        ];
        a.extend_from_slice(extra);
        run_profiler(&a, Duration::from_secs(30))
    };
    check(&cont(&["--rotate", "0s"]), 2, "at least 1s");
    check(&cont(&["--push", "not a url"]), 2, "is not a URL");
    check(&cont(&["--push", "ftp://host/x"]), 2, "http:// or https://");
    // A kernel thread has no user stack to profile.
    let o = run_profiler(
        &["--pid", "2", "-d", "1", "-o", o_],
        Duration::from_secs(30),
    );
    check(&o, 5, "is a kernel thread");
    assert!(!out.exists());
}

/// A bare `tachyon-bpf` prints the help (and exits as a usage error does).
#[test]
fn a_bare_invocation_prints_the_help() {
    let mut c = std::process::Command::new(profiler_bin());
    for (k, _) in std::env::vars() {
        if k.starts_with("TACHYON_BPF_") {
            c.env_remove(k);
        }
    }
    let o = c.output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("Usage:") && out.contains("--all-pythons") && out.contains("record"),
        "{out}"
    );
}
