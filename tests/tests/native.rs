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

const JUNK_C: &str = r#"
#include <stdlib.h>
#include <time.h>
volatile unsigned long sink;
double secs;
__attribute__((noinline)) void spin_for(double s) {
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do {
        for (int i = 0; i < 100000; i++) sink += i;
        clock_gettime(CLOCK_MONOTONIC, &t);
    } while ((t.tv_sec - t0.tv_sec) + (t.tv_nsec - t0.tv_nsec) / 1e9 < s);
}
__attribute__((noinline)) void spin(void) { spin_for(secs); sink++; }
__attribute__((noinline)) void spin_deep(void) { spin_for(secs); sink++; }
/* Hand-written functions without unwind information, as in assembly kernels (OpenBLAS).
   junk_frame's frame pointer points at junk. big_frame reserves 160 KiB below its return
   address, more than any stack copy holds, and touches none of it. */
__attribute__((used)) unsigned long junk[4] = {
    0x3fc33c32a4c4e434UL, 0x3fc33c32a4c4e434UL, 0x3fc33c32a4c4e434UL, 0};
void junk_frame(void);
void big_frame(void);
__asm__(".text\n.globl junk_frame\n.type junk_frame,@function\njunk_frame:\n"
        "  push %rbp\n  push %rbx\n  sub $8, %rsp\n"
        "  lea junk(%rip), %rbp\n  call spin\n"
        "  add $8, %rsp\n  pop %rbx\n  pop %rbp\n  ret\n"
        ".size junk_frame, .-junk_frame\n"
        ".globl big_frame\n.type big_frame,@function\nbig_frame:\n"
        "  push %rbp\n  sub $163840, %rsp\n  lea junk(%rip), %rbp\n  call spin_deep\n"
        "  add $163840, %rsp\n  pop %rbp\n  ret\n"
        ".size big_frame, .-big_frame\n");
int main(int argc, char **argv) {
    secs = argc > 1 ? atof(argv[1]) : 2.0;
    junk_frame();
    big_frame();
    return 0;
}
"#;

/// A native frame without unwind information (hand-written assembly with junk in its frame
/// pointer) is stepped over by a scan for its return address, checked to follow a call to it:
/// the stack is whole, and no frame is made from the junk. One whose caller is beyond the
/// stack copy cannot be stepped over: its stack is marked `[truncated]` at its root.
#[test]
fn frames_without_unwind_information_are_stepped_over_or_marked_truncated() {
    require_root();
    let dir = scratch("native_junk");
    let prog = compile_c(&dir, "junk", JUNK_C, &["-O2"]);
    let out = dir.join("junk.json");
    profile_command(&out, &["-m", "cpu"], &[prog.to_str().unwrap(), "1.5"]);
    let v = Viewer::load(&out).unwrap();
    let procs = v.processes().unwrap();
    let p = procs
        .iter()
        .find(|p| p.name == "junk")
        .expect("process junk");
    let paths = v.call_paths(&p.threads[0].handle).unwrap();
    let in_spin = paths.count(|n| n.iter().any(|f| f == "spin"));
    let whole = paths.count(|n| {
        n.first().is_some_and(|f| f == "_start")
            && n.windows(3).any(|w| w == ["main", "junk_frame", "spin"])
    });
    assert!(in_spin > 700, "{in_spin} samples in spin");
    assert!(
        whole as f64 >= 0.95 * in_spin as f64,
        "{whole} of {in_spin} samples in spin are _start;...;main;junk_frame;spin"
    );
    let deep = paths.count(|n| n.iter().any(|f| f == "spin_deep"));
    let marked = paths.count(|n| {
        n.first().is_some_and(|f| f == "[truncated]")
            && n.get(1).is_some_and(|f| f == "big_frame")
            && n.iter().any(|f| f == "spin_deep")
    });
    assert!(deep > 700, "{deep} samples in spin_deep");
    assert!(
        marked as f64 >= 0.95 * deep as f64,
        "{marked} of {deep} samples in spin_deep are [truncated];big_frame;...;spin_deep"
    );
    let junk = paths.count(|n| n.iter().any(|f| f.contains("3fc33c32")));
    assert_eq!(junk, 0, "frames made of junk");
}

const STRIPPED_LIB_C: &str = r#"
#include <time.h>
volatile unsigned long sink;
static __attribute__((noinline)) void hidden_spin(double secs) {
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do {
        for (int i = 0; i < 100000; i++) sink += i;
        clock_gettime(CLOCK_MONOTONIC, &t);
    } while ((t.tv_sec - t0.tv_sec) + (t.tv_nsec - t0.tv_nsec) / 1e9 < secs);
}
void run_stripped(double secs) { hidden_spin(secs); sink++; }
"#;

const STRIPPED_MAIN_C: &str = r#"
#include <dlfcn.h>
#include <stdlib.h>
int main(int argc, char **argv) {
    void *h = dlopen(argv[1], RTLD_NOW);
    if (!h) return 2;
    void (*run)(double) = (void (*)(double))dlsym(h, "run_stripped");
    run(atof(argv[2]));
    return 0;
}
"#;

/// A function without a symbol (a stripped library's static function) is named by its library
/// and offset, `libname+0xoffset`, as perf does, never a bare address.
#[test]
fn functions_without_symbols_are_named_by_library_and_offset() {
    require_root();
    let dir = scratch("native_stripped");
    let lib = compile_c(
        &dir,
        "libstripped.so",
        STRIPPED_LIB_C,
        &["-O2", "-shared", "-fPIC"],
    );
    assert!(Command::new("strip")
        .arg(&lib)
        .status()
        .expect("strip")
        .success());
    let prog = compile_c(&dir, "stripped_main", STRIPPED_MAIN_C, &["-O2", "-ldl"]);
    let out = dir.join("stripped.json");
    profile_command(
        &out,
        &["-m", "cpu"],
        &[prog.to_str().unwrap(), lib.to_str().unwrap(), "2"],
    );
    let v = Viewer::load(&out).unwrap();
    let procs = v.processes().unwrap();
    let p = procs
        .iter()
        .find(|p| p.name == "stripped_main")
        .expect("process stripped_main");
    let paths = v.call_paths(&p.threads[0].handle).unwrap();
    let named = |f: &str| {
        f.strip_prefix("libstripped.so+0x")
            .is_some_and(|h| !h.is_empty() && h.chars().all(|c| c.is_ascii_hexdigit()))
    };
    let hidden = paths.count(|n| {
        let i = n.iter().position(|f| f == "run_stripped");
        let j = n.iter().position(|f| named(f));
        matches!((i, j), (Some(i), Some(j)) if i < j)
    });
    assert!(
        hidden as f64 >= 0.8 * paths.total as f64,
        "{hidden} of {} samples in run_stripped > libstripped.so+0x...",
        paths.total
    );
    let bare = paths.count(|n| n.iter().any(|f| f.starts_with("0x")));
    assert!(
        (bare as f64) < 0.01 * paths.total as f64,
        "{bare} samples with a bare address"
    );
}

const TWO_THREADS: &str = r#"
import threading, time
def spin():
    t = time.time()
    while time.time() - t < 1.5:
        pass
ts = [threading.Thread(target=spin) for _ in range(2)]
for t in ts: t.start()
for t in ts: t.join()
"#;

/// Debian's C library is stripped: its internal functions (the thread entry `start_thread`,
/// `__libc_start_call_main`) are named from its separate debug file
/// (`/usr/lib/debug/.build-id/`, package libc6-dbg, which `cargo xtask setup` installs), found by
/// build id as perf and samply do. Without it they were `libc.so.6+0x...`.
#[test]
fn stripped_libraries_are_named_from_their_debug_files() {
    require_root();
    let libc = std::path::Path::new("/lib/x86_64-linux-gnu/libc.so.6");
    let notes = Command::new("readelf")
        .args(["-S", "-n"])
        .arg(libc)
        .output()
        .unwrap();
    let notes = String::from_utf8_lossy(&notes.stdout);
    assert!(
        !notes.contains(".symtab"),
        "the host's C library is not stripped: this test needs Debian's"
    );
    let id = notes
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: "))
        .expect("the C library has a build id");
    let debug = format!("/usr/lib/debug/.build-id/{}/{}.debug", &id[..2], &id[2..]);
    assert!(
        std::path::Path::new(&debug).exists(),
        "{debug} is missing: run the tests with `cargo xtask test` (it installs libc6-dbg)"
    );
    let dir = scratch("native_debug_files");
    let script = dir.join("two_threads.py");
    std::fs::write(&script, TWO_THREADS).unwrap();
    let out = dir.join("threads.folded");
    let py = python("3.12.1");
    profile_command(
        &out,
        &["-m", "cpu", "-f", "collapsed", "-q"],
        &[py.to_str().unwrap(), script.to_str().unwrap()],
    );
    let text = std::fs::read_to_string(&out).unwrap();
    let (mut spin, mut named) = (0u64, 0u64);
    for line in text.lines() {
        let (stack, n) = line.rsplit_once(' ').unwrap();
        let n: u64 = n.parse().unwrap();
        if stack.contains(":spin:") {
            spin += n;
            let frames: Vec<&str> = stack.split(';').skip(2).collect();
            if frames.len() > 2 && frames[1] == "start_thread" && frames[0].ends_with("clone3") {
                named += n;
            }
        }
        assert!(
            !stack.contains("libc.so.6+0x"),
            "a C library function without its name: {stack}"
        );
    }
    // Two threads taking turns on the GIL for 1.5 s each.
    assert!(spin >= 1200, "{spin} samples in spin");
    assert!(
        named as f64 >= 0.99 * spin as f64,
        "{named} of {spin} samples in spin start at clone3;start_thread"
    );
}

fn sh(dir: &std::path::Path, script: &str) {
    let o = Command::new("sh")
        .args(["-euc", script])
        .current_dir(dir)
        .output()
        .expect("sh");
    assert!(
        o.status.success(),
        "{script}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// A stripped library's static function is named from the debug file its `.gnu_debuglink`
/// names (in `DIR/.debug/`, checked by its CRC-32; the library has no build id to look up), and
/// from its MiniDebugInfo (`.gnu_debugdata`, an xz-compressed symbol table, as Fedora ships
/// its libraries), each built here with binutils and xz the way distributions do it.
#[test]
fn stripped_libraries_are_named_from_debuglink_and_minidebuginfo() {
    require_root();
    let dir = scratch("native_debuglink");
    for (kind, recipe) in [
        (
            "debuglink",
            "mkdir -p .debug
             objcopy --only-keep-debug libdl_kind.so .debug/libdl_kind.so.debug
             strip libdl_kind.so
             objcopy --add-gnu-debuglink=.debug/libdl_kind.so.debug libdl_kind.so",
        ),
        (
            "minidebuginfo",
            "objcopy --only-keep-debug libdl_kind.so mini
             objcopy --strip-debug mini
             rm -f mini.xz && xz mini
             strip libdl_kind.so
             objcopy --add-section .gnu_debugdata=mini.xz libdl_kind.so",
        ),
    ] {
        let name = format!("libdl_{kind}.so");
        let lib = compile_c(
            &dir,
            &name,
            STRIPPED_LIB_C,
            &["-O2", "-shared", "-fPIC", "-g", "-Wl,--build-id=none"],
        );
        sh(&dir, &recipe.replace("libdl_kind.so", &name));
        let syms = Command::new("nm").arg(&lib).output().unwrap();
        assert!(
            String::from_utf8_lossy(&syms.stderr).contains("no symbols"),
            "{kind}: {name} is stripped"
        );
        let prog = compile_c(&dir, "debuglink_main", STRIPPED_MAIN_C, &["-O2", "-ldl"]);
        let out = dir.join(format!("{kind}.json"));
        profile_command(
            &out,
            &["-m", "cpu", "-q"],
            &[prog.to_str().unwrap(), lib.to_str().unwrap(), "1.5"],
        );
        let v = Viewer::load(&out).unwrap();
        let procs = v.processes().unwrap();
        let p = procs
            .iter()
            .find(|p| p.name == "debuglink_main")
            .expect("process debuglink_main");
        let paths = v.call_paths(&p.threads[0].handle).unwrap();
        let named = paths.with_sequence(&["run_stripped", "hidden_spin"]);
        assert!(
            named as f64 >= 0.8 * paths.total as f64,
            "{kind}: {named} of {} samples in run_stripped > hidden_spin",
            paths.total
        );
        let unnamed = paths.count(|n| n.iter().any(|f| f.contains(&format!("{name}+0x"))));
        assert_eq!(unnamed, 0, "{kind}: frames of {name} without a name");
    }
}

/// A function whose frame (512 KiB, every page touched) is far larger than the stack copy, and
/// a leaf it calls that spins.
const BIG_FRAME_C: &str = r#"
#include <stdlib.h>
#include <string.h>
#include <time.h>
volatile long sink;
__attribute__((noinline)) static void spin_in_big(long n) {
    for (long i = 0; i < n; i++) sink += i;
}
__attribute__((noinline)) static void big_frame(long n) {
    char buf[512 * 1024];
    memset(buf, 1, sizeof buf);
    __asm__ volatile("" : : "r"(buf) : "memory");
    spin_in_big(n);
    sink += buf[4096];
}
int main(int argc, char **argv) {
    time_t end = time(NULL) + atoi(argv[1]);
    while (time(NULL) < end) big_frame(20000000);
    return 0;
}
"#;

/// The callers of a frame larger than the stack copy are read from the live thread (the frame
/// has not returned, so they are the sample's): the stack reaches `_start`, not `[truncated]`.
#[test]
fn callers_beyond_a_frame_larger_than_the_copy_are_unwound() {
    require_root();
    let dir = scratch("native_big_frame");
    let prog = compile_c(&dir, "big_frame", BIG_FRAME_C, &["-O2"]);
    let out = dir.join("big.folded");
    profile_command(
        &out,
        &["-m", "cpu", "-f", "collapsed", "-q"],
        // Whole seconds of `time()`: 2 to 3 s of spinning (with 2, 1 to 2 s: 967 samples once).
        &[prog.to_str().unwrap(), "3"],
    );
    let text = std::fs::read_to_string(&out).unwrap();
    let (mut in_leaf, mut whole, mut truncated) = (0u64, 0u64, 0u64);
    for line in text.lines() {
        let (stack, n) = line.rsplit_once(' ').unwrap();
        let n: u64 = n.parse().unwrap();
        // Without the compiler's `.constprop.0` suffixes.
        let frames: Vec<&str> = stack
            .split(';')
            .skip(2)
            .map(|f| f.split('.').next().unwrap())
            .collect();
        if frames.last() != Some(&"spin_in_big") {
            continue;
        }
        in_leaf += n;
        if frames.first() == Some(&"_start")
            && frames.ends_with(&["main", "big_frame", "spin_in_big"])
        {
            whole += n;
        }
        if frames.first() == Some(&"[truncated]") {
            truncated += n;
        }
    }
    assert!(in_leaf >= 1000, "{in_leaf} samples in the leaf:\n{text}");
    assert!(
        whole as f64 >= 0.95 * in_leaf as f64,
        "{whole} of {in_leaf} leaf samples reach _start through main and big_frame \
         ({truncated} truncated):\n{text}"
    );
}

/// A library loaded long before its code first runs, which then runs only for the last few ms of
/// the process: an extension module's traverse function called by the final collection (a CI
/// failure: `module_traverse;0x7efd...`), here bz2 compressing just before `os._exit`. Its
/// samples are read after the process is gone, too late to read its mappings then; they are
/// read when the sampler sees the process's executable pages change (`SAMPLE_MAPS_CHANGED`).
/// Before, every round had about 20 samples with a bare address. The loop counts its own CPU
/// time: counted in wall time, a round whose process lost its CPU during those 5 ms (right after
/// the kernel matrix, in two full runs) had 1 ms of samples there.
const LATE_USE: &str = r#"
import bz2, os, time
data = os.urandom(1 << 16)
time.sleep(0.3)
t0 = time.process_time()
while time.process_time() - t0 < 0.005:
    bz2.compress(data, 1)
os._exit(0)
"#;

#[test]
fn a_library_loaded_early_and_first_run_as_the_process_ends_is_named() {
    require_root();
    let dir = scratch("native_late_use");
    let script = dir.join("late_use.py");
    std::fs::write(&script, LATE_USE).unwrap();
    let py = python("3.11.7");
    let out = dir.join("late_use.json");
    for round in 0..3 {
        // `-I -S`: no site, so nothing but the import loads libbz2.
        let o = profile_command(
            &out,
            &["-m", "cpu", "-r", "5000"],
            &[py.to_str().unwrap(), "-I", "-S", script.to_str().unwrap()],
        );
        assert!(o.status.success(), "{}", stderr_of(&o));
        let v = Viewer::load(&out).unwrap();
        let procs = v.processes().unwrap();
        let p = process_named(&procs, "late_use.py");
        let paths = v.call_paths(&p.threads[0].handle).unwrap();
        let in_bz2 = paths.count(|n| {
            n.iter()
                .any(|f| f.starts_with("BZ2_") || f.starts_with("libbz2.so"))
        });
        // In ms: a sample at 5 kHz weighs 0.2.
        assert!(
            in_bz2 >= 2,
            "round {round}: {in_bz2} ms in libbz2 of {}",
            paths.total
        );
        let bare: Vec<_> = paths
            .paths
            .iter()
            .filter(|p| p.names.iter().any(|f| f.starts_with("0x")))
            .map(|p| p.names.join(";"))
            .collect();
        assert!(
            bare.is_empty(),
            "round {round}: {} stacks with a bare address, as {:?}",
            bare.len(),
            bare.first()
        );
    }
}
