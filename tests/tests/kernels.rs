//! The kernel and distribution matrix: the released binaries on the kernels fleets run, each
//! booted under qemu (TCG). Debian 11's 5.10, 12's 6.1 and 13's 6.12 boot a copy of their
//! release's own userland (`.tools/releases`, made by `cargo xtask setup` with debootstrap),
//! where the guest installs the `.deb` (dpkg) and the wheel (pip, into a venv of the release's
//! python3) of `cargo xtask dist`; unstable's newest kernel boots with this machine's root
//! shared read-only (see `xtask/src/kernels.rs`).
//!
//! In each guest: `--all-pythons` in cpu mode over two running interpreters (the scheduler's
//! accounting alone), `--pid` in wall mode on sleeping threads (the kernel's switch-in capture:
//! `sched_exit_tp` or the `finish_task_switch` kprobe), and `-- COMMAND` on a
//! script that times its own sleeps (the wheel's binary, on the releases). Back on the host,
//! every profile is read through the Firefox Profiler CLI: Python frames merged into the native
//! stacks, off-CPU time where and as long as it happened, no BPF program left behind, and the
//! program set each kernel got is the one the kernel table of docs/compatibility.md promises. On unstable's
//! kernel, a container made as a runtime makes one (Debian 13's root, its own pid and mount
//! namespaces, a `docker-<id>.scope` cgroup, `OTEL_SERVICE_NAME`) is profiled from the guest's
//! host with `--all-pythons`: its frames, its container id, service and namespace pid
//! (`container_script`). On the releases,
//! the service then runs as its unit would (`release_script`), and its pprof is read back by
//! `go tool pprof`.
//!
//! The arm64 guests (`arm64_guest_profiles_python`) run the same script and checks under
//! `qemu-system-aarch64` with the released aarch64 binary (`TACHYON_BPF_BIN_AARCH64`, which
//! `cargo xtask test` passes): Debian 12's arm64 kernel with Debian 12's own arm64 userland and
//! packages, and Debian 11's 5.10 with an arm64 tree of Debian 12's python3 and 13's
//! python3.13.

#[path = "kernels/container.rs"]
mod container;
use container::{check_container, container_script};

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tachyon_bpf_tests::*;

const WORK: &str = r#"
import sys, threading, time

def leaf(n):
    s = 0
    for i in range(n):
        s += i
    return s

def busy(secs):
    end = time.time() + secs
    while time.time() < end:
        leaf(2000)

def nap(t):
    time.sleep(t)

def napper(end):
    while time.time() < end:
        nap(0.1)

def burn(secs):
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < secs:
        leaf(200)

mode, secs = sys.argv[1], float(sys.argv[2])
if mode == "busy":
    busy(secs)
elif mode == "sleepy":
    end = time.time() + secs
    ts = [threading.Thread(target=napper, args=(end,), name=f"napper-{i}") for i in range(3)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
elif mode == "sleeper":
    # The time in nap(), and of it the time off CPU: less the thread's CPU time there, the
    # same split of its time as the kernel's accounting makes (an emulated CPU that its host
    # preempts runs on in the guest's time, and the kernel's return from the sleep with it).
    slept, blocked = 0.0, 0.0
    t0 = time.perf_counter()
    for _ in range(3):
        burn(secs)
        s, c = time.perf_counter(), time.thread_time()
        nap(0.5)
        d = time.perf_counter() - s
        slept += d
        blocked += d - (time.thread_time() - c)
    print(slept, time.perf_counter() - t0, blocked)
"#;

/// Counts the kernel's BPF programs (BPF_PROG_GET_NEXT_ID), as `bpf_program_count` does here.
const BPF_COUNT: &str = r#"
import ctypes, platform, struct
libc = ctypes.CDLL(None, use_errno=True)
NR_BPF = {"x86_64": 321, "aarch64": 280}[platform.machine()]
n, pid = 0, 0
while True:
    buf = ctypes.create_string_buffer(struct.pack("III", pid, 0, 0), 12)
    if libc.syscall(NR_BPF, 11, buf, 12) != 0:
        break
    n += 1
    pid = struct.unpack("III", buf.raw)[1]
print(n)
"#;

struct Guest {
    label: String,
    kernel_release: String,
    vmlinuz: PathBuf,
    initrd: PathBuf,
    /// The guest's root: this machine's, the arm64 tree, or a copy of a release's own.
    root: PathBuf,
    arm64: bool,
    /// The Debian release whose userland is the root (`.tools/releases/NAME`), with the
    /// packages of `cargo xtask dist` installed in the guest; `None`: this machine's root.
    release: Option<&'static str>,
}

/// Each kernel with its release's own userland (Debian 11, 12, 13), and unstable's newest
/// kernel, which has no release, with this machine's root.
const KERNELS: [(&str, Option<&str>); 4] = [
    ("5.10", Some("bullseye")),
    ("6.1", Some("bookworm")),
    ("6.12", Some("trixie")),
    ("unstable", None),
];

/// The kernels `cargo xtask setup` prepared, in the order of docs/compatibility.md's table (only those named
/// in `TACHYON_KERNELS`, comma-separated, when it is set: a developer's shortcut).
fn guests() -> Vec<Guest> {
    let root = tools_dir().join("kernels");
    let only = std::env::var("TACHYON_KERNELS").ok();
    KERNELS
        .iter()
        .filter(|(l, _)| only.as_ref().is_none_or(|o| o.split(',').any(|x| x == *l)))
        .map(|(label, release)| {
            let d = root.join(label);
            let kernel_release = std::fs::read_to_string(d.join("release")).unwrap_or_else(|_| {
                panic!(
                    "kernel {label} is missing under {}: run the tests with `cargo xtask test`",
                    root.display()
                )
            });
            Guest {
                label: label.to_string(),
                kernel_release: kernel_release.trim().to_string(),
                vmlinuz: d.join("vmlinuz"),
                initrd: d.join(if release.is_some() {
                    "initrd-rw"
                } else {
                    "initrd"
                }),
                root: PathBuf::from("/"),
                arm64: false,
                release: *release,
            }
        })
        .collect()
}

/// Boots `guest` with `results` as its writable share (holding `guest.sh`) and waits for it to
/// power off; returns the serial console's text.
fn boot(guest: &Guest, results: &Path, timeout: Duration) -> String {
    let console = results.join("console.log");
    // Two vCPUs (per-CPU perf events and rings are part of what is tested), run by one TCG
    // thread: with a thread per vCPU, a guest kernel that patches its own code (static keys
    // toggled when the profiler's probes go away at its exit) can still run the old
    // translation on the other vCPU and take an int3 it no longer expects (6.12 oopsed so in
    // do_exit once in CI). One thread keeps that coherent, as real hardware does.
    let (qemu, machine, tty) = if guest.arm64 {
        ("qemu-system-aarch64", ["-M", "virt"], "ttyAMA0")
    } else {
        ("qemu-system-x86_64", ["-M", "pc"], "ttyS0")
    };
    let mut child = Command::new(qemu)
        .args(machine)
        .args([
            "-accel",
            "tcg,thread=single",
            "-cpu",
            "max",
            "-smp",
            "2",
            "-m",
            "3G",
        ])
        .args([
            "-nodefaults",
            "-display",
            "none",
            "-monitor",
            "none",
            "-no-reboot",
        ])
        .arg("-serial")
        .arg(format!("file:{}", console.display()))
        .arg("-kernel")
        .arg(&guest.vmlinuz)
        .arg("-initrd")
        .arg(&guest.initrd)
        .args(["-append", &format!("console={tty} panic=-1 quiet")])
        .arg("-virtfs")
        .arg(format!(
            "local,path={},mount_tag=hostroot,security_model=passthrough{},multidevs=remap",
            guest.root.display(),
            // A release's root is a copy of its own, which the guest installs into.
            if guest.release.is_some() {
                ""
            } else {
                ",readonly=on"
            }
        ))
        .arg("-virtfs")
        .arg(format!(
            "local,path={},mount_tag=results,security_model=passthrough,multidevs=remap",
            results.display()
        ))
        .stdin(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("{qemu} (installed by `cargo xtask setup`): {e}"));
    let t0 = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let text = std::fs::read_to_string(&console).unwrap_or_default();
            assert!(status.success(), "qemu exited with {status}:\n{text}");
            return text;
        }
        if t0.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            let text = std::fs::read_to_string(&console).unwrap_or_default();
            panic!(
                "kernel {} did not power off within {timeout:?}:\n{text}",
                guest.label
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Samples per second in the guests. Emulation runs the guest's code 50 to 300 times slower
/// than this machine (the profiler's own work per sample included: 1.5 ms under x86_64 TCG, 4 to
/// 9 ms under arm64's), so the default 1 kHz there is, in work per sample, 50 kHz or more on a
/// real host: the reader falls seconds behind and the ring drops samples, and the checks would
/// measure the emulator. A lower rate keeps the guest's load near a real host's at 1 kHz.
/// (Reading far behind is tested on the host: `reliability.rs`.)
const GUEST_RATE: u32 = 200;

/// The guest's script: three runs of the real binary (`cmd_bin` for `-- COMMAND`) and the BPF
/// program counts around them. The two interpreters run `secs` at most (they are killed after
/// the second run): longer than both runs with their start-ups, which verification makes long
/// under emulation.
fn guest_script(bin: &Path, cmd_bin: &Path, py: &Path, secs: u32) -> String {
    let (bin, cmd_bin, py) = (bin.display(), cmd_bin.display(), py.display());
    format!(
        r#"R=/tmp/results
RATE={GUEST_RATE}
uname -r > $R/uname
python3 $R/bpf_count.py > $R/bpf_before
{py} $R/work.py busy {secs} & W1=$!
{py} $R/work.py sleepy {secs} & W2=$!
sleep 2
{bin} -v -r $RATE --all-pythons -m cpu -d 4 -o $R/all.json 2> $R/all.err; echo $? > $R/all.rc
{bin} -v -r $RATE -p $W2 -m wall -d 3 -o $R/pid.json 2> $R/pid.err; echo $? > $R/pid.rc
kill $W1 $W2
wait
{cmd_bin} -v -r $RATE -o $R/cmd.json -- {py} $R/work.py sleeper 0.4 > $R/cmd.out 2> $R/cmd.err; echo $? > $R/cmd.rc
python3 $R/bpf_count.py > $R/bpf_after
"#
    )
}

/// Where a release guest finds what it installs: `tachyon-bpf.deb` and the wheel (by its own
/// name, which pip reads the tags from) in the results share.
fn stage_packages(dir: &Path, arch: &str) -> String {
    std::fs::copy(dist_deb(arch), dir.join("tachyon-bpf.deb")).unwrap();
    let wheel = dist_wheel(arch);
    let name = wheel.file_name().unwrap().to_string_lossy().into_owned();
    std::fs::copy(&wheel, dir.join(&name)).unwrap();
    name
}

/// A release guest's script: the `.deb` installed by dpkg and the wheel by pip into a venv of
/// the release's python3 (both offline; the release's own pip, run from the wheel its
/// python3-venv installs it from with the wheels Debian 11's pip takes its dependencies from,
/// since installing pip into the venv first takes minutes under emulation), the three runs of `guest_script` on the release's own
/// `/usr/bin/python3` (the package's binary, and the wheel's for `-- COMMAND`), then the
/// service as its unit runs it: the unit's `ExecStart` with its `EnvironmentFile` and
/// `LimitMEMLOCK`, as a user that is not root, with only the unit's `AmbientCapabilities`
/// (capsh, as systemd would set them), into the state directory, for 8 s.
fn release_script(wheel: &str, secs: u32) -> String {
    let mut s = format!(
        r#"R=/tmp/results
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
dpkg -i $R/tachyon-bpf.deb > $R/dpkg.log 2>&1; echo $? > $R/dpkg.rc
mount -t tmpfs venv /opt
python3 -m venv --without-pip /opt/wheel > $R/wheel.log 2>&1 && mkdir /opt/wheel/share && cp -r /usr/share/python-wheels /opt/wheel/share/ && /opt/wheel/bin/python $(ls /usr/share/python-wheels/pip-*.whl)/pip install --no-index --no-compile --disable-pip-version-check $R/{wheel} >> $R/wheel.log 2>&1; echo $? > $R/wheel.rc
cmp /usr/bin/tachyon-bpf /opt/wheel/bin/tachyon-bpf > $R/cmp.log 2>&1; echo $? > $R/cmp.rc
python3 -c 'import sys; print(sys.version.split()[0])' > $R/python.version
"#
    );
    s.push_str(&guest_script(
        Path::new("/usr/bin/tachyon-bpf"),
        Path::new("/opt/wheel/bin/tachyon-bpf"),
        Path::new("/usr/bin/python3"),
        secs,
    ));
    s.push_str(
        r#"UNIT=/usr/lib/systemd/system/tachyon-bpf.service
EXEC=$(sed -n 's/^ExecStart=//p' $UNIT)
CAPS=$(sed -n 's/^AmbientCapabilities=//p' $UNIT | tr 'A-Z ' 'a-z,')
STATE=/var/lib/$(sed -n 's/^StateDirectory=//p' $UNIT)
mkdir -p $STATE && chown 61000:61000 $STATE && chmod 700 $STATE
python3 $R/work.py busy 300 & W3=$!
touch $R/unit.caps && chown 61000 $R/unit.caps
sleep 1
set -a; . /etc/default/tachyon-bpf; set +a
[ "$(sed -n 's/^LimitMEMLOCK=//p' $UNIT)" = infinity ] && ulimit -l unlimited
# Debian's kernels default to perf_event_paranoid 3, where only CAP_SYS_ADMIN opens perf events:
# docs/permissions.md's step for them.
cat /proc/sys/kernel/perf_event_paranoid > $R/unit.paranoid
[ "$(cat /proc/sys/kernel/perf_event_paranoid)" -gt 2 ] && echo 2 > /proc/sys/kernel/perf_event_paranoid
capsh --caps="$CAPS+eip cap_setpcap,cap_setuid,cap_setgid+ep" --keep=1 --gid=61000 --groups=61000 --uid=61000 --addamb=$CAPS -- -c "grep ^Cap /proc/self/status > $R/unit.caps; id -u >> $R/unit.caps; exec $EXEC -d 8" > $R/unit.out 2> $R/unit.err; echo $? > $R/unit.rc
kill $W3
wait
mkdir -p $R/unit
ls -ln $STATE > $R/unit.ls
cp -r $STATE/. $R/unit/
"#,
    );
    s
}

/// What is wrong with a release guest's installs and its service run (`release_script`).
fn check_release(g: &Guest, dir: &Path) -> Vec<String> {
    let mut errors = Vec::new();
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap_or_default();
    let mut fail = |e: String| {
        errors.push(format!(
            "kernel {} with Debian {} ({}): {e}",
            g.label,
            g.release.unwrap_or("?"),
            g.kernel_release
        ))
    };
    for (step, log) in [
        ("dpkg", "dpkg.log"),
        ("wheel", "wheel.log"),
        ("cmp", "cmp.log"),
    ] {
        if read(&format!("{step}.rc")).trim() != "0" {
            fail(format!("{step} failed: {}", read(log)));
        }
    }
    let rc = read("unit.rc");
    if rc.trim() != "0" {
        fail(format!(
            "the unit's command failed ({}): {}",
            rc.trim(),
            read("unit.err")
        ));
        return errors;
    }
    // It ran as the service's user, with the unit's five capabilities and no others.
    let caps = read("unit.caps");
    let eff = caps
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .map(|v| u64::from_str_radix(v.trim(), 16).unwrap_or(0));
    // CAP_DAC_READ_SEARCH 2, CAP_SYS_PTRACE 19, CAP_SYSLOG 34, CAP_PERFMON 38, CAP_BPF 39.
    let want = [2u32, 19, 34, 38, 39].iter().fold(0u64, |m, b| m | 1 << b);
    if eff != Some(want) || caps.lines().last() != Some("61000") {
        fail(format!("the unit's command ran with {caps:?}"));
    }
    let profiles: Vec<PathBuf> = std::fs::read_dir(dir.join("unit"))
        .map(|rd| rd.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    let pprof = profiles
        .iter()
        .find(|p| p.to_string_lossy().ends_with(".pb.gz"));
    match pprof {
        None => fail(format!(
            "no pprof profile in the state directory: {}",
            read("unit.ls")
        )),
        Some(p) => {
            let top = pprof_top(p);
            if !top.contains("busy") {
                fail(format!(
                    "the service's profile {} has no busy(): {top}",
                    p.display()
                ));
            }
        }
    }
    if !read("unit.ls").contains(" 61000 ") {
        fail(format!(
            "the service's files are not its user's: {}",
            read("unit.ls")
        ));
    }
    errors
}

/// A fresh copy of a release's root (`.tools/releases/NAME`) for one guest to install into.
fn release_root(name: &str, dir: &Path) -> PathBuf {
    let src = tools_dir().join("releases").join(name);
    assert!(
        src.join(".complete").exists(),
        "{} is missing: run the tests with `cargo xtask test`",
        src.display()
    );
    let root = dir.join("root");
    let st = Command::new("cp")
        .arg("-a")
        .arg(&src)
        .arg(&root)
        .status()
        .unwrap();
    assert!(st.success(), "copying {}", src.display());
    root
}

/// The program set each kernel gets, from the kernel table of docs/compatibility.md
/// (`| label | set | ...`).
fn documented_sets() -> Vec<(String, String)> {
    let readme = std::fs::read_to_string(workspace().join("docs/compatibility.md")).unwrap();
    let start = readme
        .find("## Kernels")
        .expect("docs/compatibility.md has a Kernels section");
    readme[start..]
        .lines()
        .skip_while(|l| !l.starts_with("| kernel "))
        .skip(2)
        .take_while(|l| l.starts_with("| "))
        .map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            (cells[1].to_string(), cells[3].to_string())
        })
        .collect()
}

/// The kernel functions `time.sleep` blocks in: `clock_nanosleep(2)`, and `select(2)` before
/// Python 3.11 (Debian 11's 3.9).
const SLEEPS_IN: [&str; 2] = ["do_nanosleep", "do_select"];

/// Samples of `paths` running `func` that are fully merged: rooted at the native `_start`, with
/// the interpreter's native frames above the Python ones.
fn merged_share(paths: &CallPaths, func: &str) -> (u64, u64) {
    let with = paths.count(|n| n.iter().any(|f| f == func));
    let merged = paths.count(|n| {
        n.first()
            .is_some_and(|f| f == "_start" || f == "clone" || f == "clone3")
            && n.iter().any(|f| f == func)
            && n.iter()
                .position(|f| f.contains("_PyEval_EvalFrame") || f == "PyEval_EvalCode")
                < n.iter().position(|f| f == func)
    });
    (merged, with)
}

/// Why the thread of `procs` with the most samples of `func` falls short: fewer than 200 ms of
/// `func`, or under 95% of them fully merged (`merged_share`); `None` when it does not.
fn short_of_merged(v: &Viewer, procs: &[ProcessInfo], func: &str, run: &str) -> Option<String> {
    let (merged, with) = procs
        .iter()
        .flat_map(|p| &p.threads)
        .map(|t| merged_share(&v.call_paths(&t.handle).unwrap(), func))
        .fold((0, 0), |best, m| if m.1 > best.1 { m } else { best });
    (with < 200 || (merged as f64) < 0.95 * with as f64).then(|| {
        format!("{run}: {merged}/{with} ms of {func}() fully merged (want at least 95% of 200+)")
    })
}

fn check_guest(g: &Guest, dir: &Path, expected_set: &str) -> Vec<String> {
    let mut errors = Vec::new();
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap_or_default();
    let mut fail =
        |e: String| errors.push(format!("kernel {} ({}): {e}", g.label, g.kernel_release));
    if read("guest.rc").trim() != "0" || read("uname").trim() != g.kernel_release {
        fail(format!(
            "the guest script did not finish on {}: uname {:?}, rc {:?}\n{}",
            g.kernel_release,
            read("uname"),
            read("guest.rc"),
            read("guest.log")
        ));
        return errors;
    }
    for run in ["all", "pid", "cmd"] {
        let err = read(&format!("{run}.err"));
        if read(&format!("{run}.rc")).trim() != "0" {
            fail(format!("the {run} run failed: {err}"));
            continue;
        }
        let set_line = err
            .lines()
            .find(|l| l.contains("BPF programs"))
            .unwrap_or("");
        if !set_line.contains(&format!("{expected_set} (")) {
            fail(format!(
                "docs/compatibility.md says {expected_set:?}, the {run} run loaded: {set_line:?}"
            ));
        }
    }
    if read("bpf_before").trim() != read("bpf_after").trim() {
        fail(format!(
            "BPF programs left behind: {} before, {} after",
            read("bpf_before").trim(),
            read("bpf_after").trim()
        ));
    }

    // The profile says which kernel it was taken on and which programs ran.
    let meta: serde_json::Value =
        serde_json::from_str(&read("all.json")).unwrap_or(serde_json::Value::Null);
    let kernel = &meta["meta"]["tachyon"]["kernel"];
    if kernel["release"] != g.kernel_release.as_str() || kernel["programs"] != expected_set {
        fail(format!("meta.tachyon.kernel is {kernel}"));
    }
    // Cpu mode ran the kernel's set's accounting alone: no switch-in capture program.
    let (times, captures): (&str, &[&str]) = match expected_set {
        "modern" => (
            "tachyon_switch",
            &["tachyon_switch_in", "tachyon_switch_in_kprobe"],
        ),
        _ => ("tachyon_switch_compat", &["tachyon_switch_in_compat"]),
    };
    let programs = &meta["meta"]["tachyon"]["bpfPrograms"];
    let captured = captures.iter().any(|p| !programs[p].is_null());
    if programs[times]["runs"].as_u64().unwrap_or(0) == 0 || captured {
        fail(format!(
            "--all-pythons -m cpu: {times} did not run alone: {programs}"
        ));
    }

    // --all-pythons: both interpreters, the busy one's Python frames merged.
    if let Ok(v) = Viewer::load(&dir.join("all.json")) {
        let procs = v.processes().unwrap();
        let pythons = procs.iter().filter(|p| p.name.contains("work.py")).count();
        if pythons < 2 {
            fail(format!(
                "--all-pythons found {pythons} of the 2 running interpreters: {:?}",
                procs.iter().map(|p| &p.name).collect::<Vec<_>>()
            ));
        }
        if let Some(e) = short_of_merged(&v, &procs, "busy", "--all-pythons") {
            fail(e);
        }
    } else {
        fail(format!("all.json does not load: {}", read("all.err")));
    }

    // Wall mode captured blocked threads as they came back: the kernel's switch-in program
    // (the `sched_exit_tp` tracepoint where the kernel has it, else the kprobe) ran.
    let wall: serde_json::Value =
        serde_json::from_str(&read("pid.json")).unwrap_or(serde_json::Value::Null);
    let wall_programs = &wall["meta"]["tachyon"]["bpfPrograms"];
    let switch_in_ran = captures
        .iter()
        .any(|p| wall_programs[p]["runs"].as_u64().unwrap_or(0) > 0);
    if !switch_in_ran {
        fail(format!(
            "-p PID -m wall: no switch-in program ({captures:?}) ran: {wall_programs}"
        ));
    }

    errors.extend(check_sleeps(g, dir));
    errors
}

/// The wall-mode runs of a guest: `--pid` on sleeping threads, and `-- COMMAND` on a script
/// that times its own sleeps, against the profiles' off-CPU time.
fn check_sleeps(g: &Guest, dir: &Path) -> Vec<String> {
    let mut errors = Vec::new();
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap_or_default();
    let mut fail =
        |e: String| errors.push(format!("kernel {} ({}): {e}", g.label, g.kernel_release));
    // --pid in wall mode: each sleeping thread's time is in nap() -> time.sleep -> the kernel.
    match Viewer::load(&dir.join("pid.json")) {
        Ok(v) => {
            let mut nappers = 0;
            for p in v.processes().unwrap() {
                for t in &p.threads {
                    let c = v.call_paths(&t.handle).unwrap();
                    let asleep = c.count(|n| {
                        let py = n.iter().position(|f| f == "nap");
                        let k = n.iter().position(|f| f == "schedule" || f == "__schedule");
                        matches!((py, k), (Some(a), Some(b)) if a < b)
                    });
                    if c.count(|n| n.iter().any(|f| f == "napper")) == 0 {
                        continue;
                    }
                    nappers += 1;
                    if asleep < 2000 || (asleep as f64) < 0.85 * c.total as f64 {
                        fail(format!(
                            "--pid wall mode: thread {} shows {asleep} of {} ms asleep in nap() \
                             (it slept nearly all of the 3 s)",
                            t.name, c.total
                        ));
                    }
                }
            }
            if nappers != 3 {
                fail(format!("--pid: {nappers} of the 3 sleeping threads"));
            }
        }
        Err(e) => fail(format!("pid.json does not load: {e}")),
    }

    // -- COMMAND: the script's own measure of its time off CPU in nap() against the profile's
    // time there. (Its time in nap() is longer by the CPU time around the sleep: under
    // emulation, tens of ms a sleep when the emulator's own thread is preempted on the host.)
    match Viewer::load(&dir.join("cmd.json")) {
        Ok(v) => {
            let out = read("cmd.out");
            let field = |i: usize| {
                out.split_whitespace()
                    .nth(i)
                    .and_then(|s| s.parse::<f64>().ok())
                    .map(|s| s * 1000.0)
            };
            let blocked_ms = field(2);
            let mut found = false;
            for p in v.processes().unwrap() {
                for t in &p.threads {
                    let c = v.call_paths(&t.handle).unwrap();
                    if c.count(|n| n.iter().any(|f| f == "burn")) == 0 {
                        continue;
                    }
                    found = true;
                    let asleep = c.count(|n| {
                        let py = n.iter().position(|f| f == "nap");
                        let k = n.iter().position(|f| SLEEPS_IN.contains(&f.as_str()));
                        matches!((py, k), (Some(a), Some(b)) if a < b)
                    }) as f64;
                    match blocked_ms {
                        Some(s) if (asleep - s).abs() <= 0.05 * s => {}
                        _ => {
                            // Where the rest of the sleep went: the heaviest sleeps not under
                            // nap().
                            let shown = c.commonest(
                                |n| {
                                    n.iter().any(|f| SLEEPS_IN.contains(&f.as_str()))
                                        && !n.iter().any(|f| f == "nap")
                                },
                                3,
                            );
                            let in_nap = c.count(|n| n.iter().any(|f| f == "nap"));
                            fail(format!(
                                "-- COMMAND: {asleep:.0} ms in nap() -> {SLEEPS_IN:?} ({in_nap} \
                                 ms in nap() in all), the script says it was off CPU {:.0} ms \
                                 there, and in nap() {:.0} ms (its output: {out:?}); asleep \
                                 elsewhere (ms):\n{shown}",
                                blocked_ms.unwrap_or(f64::NAN),
                                field(0).unwrap_or(f64::NAN),
                            ))
                        }
                    }
                    let (m, w) = merged_share(&c, "burn");
                    if w < 200 || (m as f64) < 0.95 * w as f64 {
                        fail(format!("-- COMMAND: {m}/{w} ms of burn() fully merged"));
                    }
                }
            }
            if !found {
                fail("-- COMMAND: no thread runs burn()".into());
            }
        }
        Err(e) => fail(format!("cmd.json does not load: {e}")),
    }
    errors
}

#[test]
fn fleet_kernels_load_sample_and_merge() {
    require_root();
    let sets = documented_sets();
    let bin = profiler_bin();
    let py = python("3.12.1");
    let mut errors = Vec::new();
    let mut seen = Vec::new();
    for g in guests() {
        let expected = sets
            .iter()
            .find(|(label, _)| label.split_whitespace().next() == Some(g.label.as_str()))
            .map(|(_, set)| set.clone())
            .unwrap_or_else(|| {
                panic!(
                    "docs/compatibility.md's kernel table has no row for {}",
                    g.label
                )
            });
        let dir = scratch(&format!("kernel-{}", g.label));
        std::fs::write(dir.join("work.py"), WORK).unwrap();
        std::fs::write(dir.join("bpf_count.py"), BPF_COUNT).unwrap();
        // 5.10's compat set verifies slowly under emulation, more so on a loaded host: a run
        // whose sleepers ended 120 s in saw them end during the --pid run.
        let mut g = g;
        let script = match g.release {
            Some(name) => {
                g.root = release_root(name, &dir);
                release_script(&stage_packages(&dir, "x86_64"), 300)
            }
            None => {
                std::fs::write(dir.join("receiver.py"), OTLP_RECEIVER).unwrap();
                guest_script(&bin, &bin, &py, 300) + &container_script(&bin)
            }
        };
        std::fs::write(dir.join("guest.sh"), script).unwrap();
        let t0 = Instant::now();
        let console = boot(&g, &dir, Duration::from_secs(600));
        let mut errs = check_guest(&g, &dir, &expected);
        if g.release.is_none() {
            errs.extend(check_container(&g, &dir));
        }
        if g.release.is_some() {
            errs.extend(check_release(&g, &dir));
            let _ = std::fs::remove_dir_all(&g.root);
        }
        eprintln!(
            "kernel {} ({}), {}: {} in {:.0} s, {}",
            g.label,
            g.kernel_release,
            match g.release {
                Some(r) => format!(
                    "Debian {r}'s own userland, python {}, the .deb and the wheel",
                    std::fs::read_to_string(dir.join("python.version"))
                        .unwrap_or_default()
                        .trim()
                ),
                None => "this machine's root".into(),
            },
            expected,
            t0.elapsed().as_secs_f64(),
            if errs.is_empty() { "ok" } else { "FAILED" }
        );
        if !errs.is_empty() {
            // The runs' summaries, for a failure seen only in CI.
            for run in ["all", "pid", "cmd", "unit"] {
                for l in std::fs::read_to_string(dir.join(format!("{run}.err")))
                    .unwrap_or_default()
                    .lines()
                    .filter(|l| !l.starts_with("  ") && !l.contains("instructions verified"))
                    .take(10)
                {
                    eprintln!("kernel {} {run}: {l}", g.label);
                }
            }
            if console.contains("Kernel panic") {
                errors.push(format!("kernel {} panicked:\n{console}", g.label));
            }
        }
        errors.extend(errs);
        seen.push(g.label);
    }
    if std::env::var_os("TACHYON_KERNELS").is_none() {
        assert_eq!(seen, KERNELS.map(|k| k.0));
    }
    assert!(errors.is_empty(), "{}", errors.join("\n\n"));
}

/// The released aarch64 binary, under emulation: the same runs and checks as on the x86_64
/// kernels, on Debian 12's arm64 kernel (the modern program set) with Debian 12's own arm64
/// userland, where the `.deb` and the wheel are installed as on the x86_64 releases, and on
/// Debian 11's 5.10 (the compat set) with an arm64 tree of Debian 12's python3 (3.11) and
/// Debian 13's python3.13 (a tree of its own, entered as a container's process is).
#[test]
fn arm64_guest_profiles_python() {
    require_root();
    let bin = std::env::var_os("TACHYON_BPF_BIN_AARCH64")
        .map(PathBuf::from)
        .filter(|p| p.exists())
        .expect("TACHYON_BPF_BIN_AARCH64 names no binary: run the tests with `cargo xtask test`");
    let mut errors = Vec::new();
    // `TACHYON_KERNELS` names them `arm64-6.1` and `arm64-5.10` (a developer's shortcut).
    let only = std::env::var("TACHYON_KERNELS").ok();
    for (label, set) in [("6.1", "modern"), ("5.10", "compat")] {
        let name = format!("arm64-{label}");
        if only
            .as_ref()
            .is_none_or(|o| o.split(',').any(|x| x == name))
        {
            errors.extend(arm64_guest(&bin, label, set));
        }
    }
    assert!(errors.is_empty(), "{}", errors.join("\n\n"));
}

/// One arm64 kernel's runs; the errors found.
fn arm64_guest(bin: &Path, label: &str, set: &str) -> Vec<String> {
    let d = tools_dir().join("arm64");
    let kernel_release =
        std::fs::read_to_string(d.join(label).join("release")).unwrap_or_else(|_| {
            panic!(
                "the arm64 guest {label} is missing under {}: run the tests with `cargo xtask test`",
                d.display()
            )
        });
    let release = (label == "6.1").then_some("bookworm-arm64");
    let mut g = Guest {
        label: format!("arm64 {label}"),
        kernel_release: kernel_release.trim().to_string(),
        vmlinuz: d.join(label).join("vmlinuz"),
        initrd: d.join(label).join(if release.is_some() {
            "initrd-rw"
        } else {
            "initrd"
        }),
        root: d.join("root"),
        arm64: true,
        release,
    };
    let dir = scratch(&format!("kernel-arm64-{label}"));
    std::fs::write(dir.join("work.py"), WORK).unwrap();
    std::fs::write(dir.join("bpf_count.py"), BPF_COUNT).unwrap();
    // arm64's compat set takes about 40 s to verify under emulation, per run.
    let script = if let Some(name) = release {
        g.root = release_root(name, &dir);
        release_script(&stage_packages(&dir, "aarch64"), 600)
    } else {
        std::fs::copy(bin, dir.join("tachyon-bpf")).unwrap();
        // Paths as the guest sees them: its root is the arm64 tree, the results share is
        // /tmp/results.
        let b = Path::new("/tmp/results/tachyon-bpf");
        let mut script = guest_script(b, b, Path::new("/usr/bin/python3"), 600);
        // Debian 13's python3.13 in a tree of its own (its own C library), entered by chroot
        // as a container's process: the profiler reads its files through /proc/PID/root.
        script.push_str(
            "mount --bind $R /trixie/tmp
/tmp/results/tachyon-bpf -v -r $RATE -o $R/py313.json -- chroot /trixie /usr/bin/python3.13 /tmp/work.py sleeper 0.4 > $R/py313.out 2> $R/py313.err; echo $? > $R/py313.rc
",
        );
        script
    };
    std::fs::write(dir.join("guest.sh"), script).unwrap();
    let t0 = Instant::now();
    let console = boot(&g, &dir, Duration::from_secs(900));
    let mut errors = check_guest(&g, &dir, set);
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap_or_default();
    if release.is_some() {
        errors.extend(check_release(&g, &dir));
        let _ = std::fs::remove_dir_all(&g.root);
    }
    // The python3.13 tree is the 5.10 guest's.
    let extra_runs: &[&str] = if release.is_some() { &[] } else { &["py313"] };
    errors.extend(check_arm64_runs(&g, &dir, extra_runs));
    eprintln!(
        "kernel {} ({}), {}: {set} in {:.0} s, {}",
        g.label,
        g.kernel_release,
        match release {
            Some(r) => format!(
                "Debian {r}'s own userland, python {}, the .deb and the wheel",
                read("python.version").trim()
            ),
            None => "an arm64 tree of Debian 12's python3 and 13's python3.13".into(),
        },
        t0.elapsed().as_secs_f64(),
        if errors.is_empty() { "ok" } else { "FAILED" }
    );
    for run in ["all", "pid", "cmd", "py313", "unit"] {
        for l in read(&format!("{run}.err"))
            .lines()
            .filter(|l| !l.starts_with("  ") && !l.contains("instructions verified"))
            .take(8)
        {
            eprintln!("arm64 {label} {run}: {l}");
        }
    }
    if !errors.is_empty() && console.contains("Kernel panic") {
        errors.push(format!("kernel {} panicked:\n{console}", g.label));
    }
    errors
}

/// The arm64 guest's own checks: its python3.13 run (`extra_runs`, in the 5.10 guest) and the
/// Python records of its `-- COMMAND` runs merged.
fn check_arm64_runs(g: &Guest, dir: &Path, extra_runs: &[&str]) -> Vec<String> {
    let mut errors = Vec::new();
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap_or_default();
    let mut fail =
        |e: String| errors.push(format!("kernel {} ({}): {e}", g.label, g.kernel_release));
    if extra_runs.is_empty() {
        // No python3.13 run in this guest.
    } else if read("py313.rc").trim() != "0" {
        fail(format!("the python3.13 run failed: {}", read("py313.err")));
    } else {
        match Viewer::load(&dir.join("py313.json")) {
            Ok(v) => {
                let procs = v.processes().unwrap();
                let label = procs
                    .iter()
                    .map(|p| p.name.clone())
                    .find(|n| n.contains("work.py"));
                if !label.as_ref().is_some_and(|l| l.contains("3.13")) {
                    fail(format!(
                        "python3.13: no work.py process labelled 3.13: {:?}",
                        procs.iter().map(|p| &p.name).collect::<Vec<_>>()
                    ));
                }
                if let Some(e) = short_of_merged(&v, &procs, "burn", "python3.13") {
                    fail(e);
                }
            }
            Err(e) => fail(format!("py313.json does not load: {e}")),
        }
    }
    // Every Python record pairs its activations with eval-loop frames: Debian 13 signs return
    // addresses (pointer authentication), and a function whose unwind rule says so must still
    // be unwound by its rule, not guessed past.
    for run in ["cmd"].iter().chain(extra_runs) {
        let err = read(&format!("{run}.err"));
        let counts = err
            .lines()
            .find(|l| l.contains("records of Python threads"))
            .map(|l| {
                let n = |word: &str| {
                    l.split(',')
                        .find(|p| p.contains(word))
                        .and_then(|p| p.split_whitespace().find_map(|w| w.parse::<u64>().ok()))
                };
                (n("records"), n("merge mismatches"))
            });
        match counts {
            Some((Some(records), Some(mismatches))) if mismatches * 100 <= records => {}
            _ => fail(format!(
                "{run}: merge mismatches over 1% of Python records: {:?}",
                err.lines()
                    .find(|l| l.contains("records of Python threads"))
            )),
        }
    }
    errors
}
