//! Native and kernel sampling of real C programs, read back through the Firefox Profiler CLI.

use std::process::{Command, Stdio};
use std::time::Duration;

use tachyon_bpf_tests::*;

const CHAIN_C: &str = r#"
#include <stdlib.h>
#include <time.h>
volatile unsigned long sink;
__attribute__((noinline)) unsigned long leaf_spin(unsigned long n) {
    unsigned long x = 0;
    for (unsigned long i = 0; i < n; i++) { x += i * i ^ (x >> 3); }
    sink = x;
    return x;
}
__attribute__((noinline)) unsigned long middle(unsigned long n) { unsigned long r = leaf_spin(n); sink += r; return r + 1; }
__attribute__((noinline)) unsigned long outer(unsigned long n) { unsigned long r = middle(n); sink += r; return r + 2; }
int main(int argc, char **argv) {
    double secs = argc > 1 ? atof(argv[1]) : 2.0;
    struct timespec t0, t; clock_gettime(CLOCK_MONOTONIC, &t0);
    do { outer(2000000); clock_gettime(CLOCK_MONOTONIC, &t); }
    while ((t.tv_sec - t0.tv_sec) + (t.tv_nsec - t0.tv_nsec) / 1e9 < secs);
    return 0;
}
"#;

const SYSCALL_C: &str = r#"
#include <fcntl.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
static char buf[1 << 16];
__attribute__((noinline)) void syscall_loop(int fd, int zero) {
    for (int i = 0; i < 2000; i++) { if (read(zero, buf, sizeof buf) < 0) abort(); if (write(fd, buf, sizeof buf) < 0) abort(); }
}
int main(int argc, char **argv) {
    double secs = argc > 1 ? atof(argv[1]) : 2.0;
    int fd = open("/dev/null", O_WRONLY), zero = open("/dev/zero", O_RDONLY);
    struct timespec t0, t; clock_gettime(CLOCK_MONOTONIC, &t0);
    do { syscall_loop(fd, zero); clock_gettime(CLOCK_MONOTONIC, &t); }
    while ((t.tv_sec - t0.tv_sec) + (t.tv_nsec - t0.tv_nsec) / 1e9 < secs);
    return 0;
}
"#;

#[test]
fn native_chain_without_frame_pointers() {
    require_root();
    let dir = scratch("native_chain");
    let prog = compile_c(&dir, "chain", CHAIN_C, &["-O2", "-fomit-frame-pointer"]);
    let out = dir.join("chain.json");
    let o = profile_command(&out, &[], &[prog.to_str().unwrap(), "3"]);
    let v = Viewer::load(&out).unwrap();
    let procs = v.processes().unwrap();
    let p = procs
        .iter()
        .find(|p| p.name == "chain")
        .expect("process chain");
    assert_eq!(p.threads.len(), 1);
    assert_eq!(p.threads[0].name, "chain");
    let paths = v.call_paths(&p.threads[0].handle).unwrap();
    assert!(
        paths.total >= 2000,
        "expected ~3000 samples at 1 kHz, got {}",
        paths.total
    );
    let full = paths.with_sequence(&["main", "outer", "middle", "leaf_spin"]);
    let rooted = paths.count(|n| {
        n.first().map(|s| s.as_str()) == Some("_start")
            && n.ends_with(&[
                "main".into(),
                "outer".into(),
                "middle".into(),
                "leaf_spin".into(),
            ])
    });
    let frac = full as f64 / paths.total as f64;
    assert!(
        frac >= 0.90,
        "only {full}/{} samples carry main > outer > middle > leaf_spin",
        paths.total
    );
    assert!(
        rooted as f64 >= 0.90 * paths.total as f64,
        "unwinding did not reach _start: {rooted}/{}",
        paths.total
    );
    let cats = v.categories(&p.threads[0].handle).unwrap();
    let user = cats
        .iter()
        .find(|c| c.0 == "User")
        .map(|c| c.1)
        .unwrap_or(0);
    assert!(
        user as f64 >= 0.9 * paths.total as f64,
        "categories: {cats:?}"
    );
    let err = stderr_of(&o);
    assert!(
        err.contains("samples") && err.contains("lost 0"),
        "summary: {err}"
    );
}

#[test]
fn kernel_frames_above_user_frames() {
    require_root();
    let dir = scratch("kernel_frames");
    let prog = compile_c(&dir, "sysloop", SYSCALL_C, &["-O2", "-fomit-frame-pointer"]);
    let out = dir.join("sys.json");
    profile_command(&out, &[], &[prog.to_str().unwrap(), "2"]);
    let v = Viewer::load(&out).unwrap();
    let procs = v.processes().unwrap();
    let p = procs
        .iter()
        .find(|p| p.name == "sysloop")
        .expect("process sysloop");
    let t = &p.threads[0].handle;
    let cats = v.categories(t).unwrap();
    let total: u64 = cats.iter().map(|c| c.1).sum();
    let kernel = cats
        .iter()
        .find(|c| c.0 == "Kernel")
        .map(|c| c.1)
        .unwrap_or(0);
    assert!(
        kernel as f64 >= 0.5 * total as f64,
        "kernel share too small: {cats:?}"
    );
    let paths = v.call_paths(t).unwrap();
    // A kernel entry point right above the program's own function, and a real kernel leaf.
    let through_syscall = paths.count(|n| {
        let Some(i) = n.iter().position(|f| f == "syscall_loop") else {
            return false;
        };
        n[i + 1..]
            .iter()
            .any(|f| f.contains("do_syscall_64") || f.starts_with("entry_SYSCALL"))
            && n.last().map(|l| !l.starts_with("0x")).unwrap_or(false)
    });
    assert!(
        through_syscall as f64 >= 0.4 * paths.total as f64,
        "only {through_syscall}/{} samples go syscall_loop > ... > do_syscall_64 > named kernel leaf",
        paths.total
    );
    let named_kernel_leaf = paths.count(|n| {
        n.last()
            .map(|l| {
                l.contains("read")
                    || l.contains("write")
                    || l.contains("clear")
                    || l.contains("copy")
                    || l.contains("iter")
            })
            .unwrap_or(false)
    });
    assert!(
        named_kernel_leaf > 0,
        "no read/write/copy kernel leaf in {} paths",
        paths.paths.len()
    );
}

#[test]
fn all_mode_sees_every_program() {
    require_root();
    let dir = scratch("all_mode");
    let src = compile_c(&dir, "chain", CHAIN_C, &["-O2"]);
    let mut children = Vec::new();
    for name in ["busy_alpha", "busy_beta", "busy_gamma"] {
        let p = dir.join(name);
        std::fs::copy(&src, &p).unwrap();
        children.push(
            Command::new(&p)
                .arg("8")
                .stdout(Stdio::null())
                .spawn()
                .unwrap(),
        );
    }
    std::thread::sleep(Duration::from_millis(200));
    let out = dir.join("all.json");
    let o = run_profiler(
        &["--all", "-d", "3", "-o", out.to_str().unwrap()],
        Duration::from_secs(60),
    );
    for mut c in children {
        let _ = c.kill();
        let _ = c.wait();
    }
    assert!(o.status.success(), "profiler failed: {}", stderr_of(&o));
    let err = stderr_of(&o);
    assert!(
        err.contains("lost ") && err.contains("cpu0 "),
        "no per-CPU lost count: {err}"
    );
    let v = Viewer::load(&out).unwrap();
    let procs = v.processes().unwrap();
    for name in ["busy_alpha", "busy_beta", "busy_gamma"] {
        let p = procs
            .iter()
            .find(|p| p.name == name)
            .unwrap_or_else(|| panic!("{name} missing from --all profile"));
        let paths = v.call_paths(&p.threads[0].handle).unwrap();
        assert!(paths.total > 300, "{name}: {} samples", paths.total);
        let chain = paths.with_sequence(&["main", "outer", "middle", "leaf_spin"]);
        assert!(
            chain as f64 >= 0.9 * paths.total as f64,
            "{name}: only {chain}/{} samples with main > outer > middle > leaf_spin",
            paths.total
        );
    }
}
