//! The start of a Python process, profiled whole: an interpreter started or forked during an
//! `--all-pythons` run, one started through wrappers, and the interpreter's own start-up, each
//! with its Python frames merged from its first samples.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use tachyon_bpf_tests::folded::{fidelity, no_wrong_names};
use tachyon_bpf_tests::*;

/// The start-up samples of a collapsed profile (under the interpreter's main, before it runs
/// the program), checked: at least 10 with Python frames, 95% of them fully merged, nothing
/// garbage.
fn check_startup(label: &str, folded: &Path) {
    let text = std::fs::read_to_string(folded).unwrap();
    let startup: String = text
        .lines()
        // Under the interpreter's main, before it runs the program (Debian's build names no
        // static function, `pymain_init` among them).
        .filter(|l| l.contains(";Py_BytesMain;") && !l.contains(";Py_RunMain;"))
        .map(|l| format!("{l}\n"))
        .collect();
    let only = folded.with_extension("startup.folded");
    std::fs::write(&only, startup).unwrap();
    let f = fidelity(&only);
    eprintln!(
        "{label}: startup: {} of {} Python samples fully merged; {:?}",
        f.merged,
        f.python,
        f.problems.iter().map(|(k, v)| (k, v.0)).collect::<Vec<_>>()
    );
    assert!(
        f.python >= 10,
        "{label}: only {} Python samples while the interpreter starts",
        f.python
    );
    assert!(
        f.merged as f64 >= 0.95 * f.python as f64,
        "{label}: {} of {} startup samples fully merged: {:#?}",
        f.merged,
        f.python,
        f.problems
    );
    no_wrong_names(label, &f);
}

/// `--all-pythons`: an interpreter started during the run is found while it starts (its exec
/// wakes the reader at once), so its start-up is sampled, with its Python frames. Before, the
/// exec was read at the next poll, up to a tick later, and most launches had no start-up
/// samples at all: the whole start-up (20-30 ms) was over before the process was a target.
#[test]
fn a_python_started_during_an_all_pythons_run_has_its_start() {
    require_root();
    let dir = scratch("fidelity_all_pythons_start");
    let out = dir.join("all.folded");
    let mut prof = Command::new(profiler_bin())
        .args(["--all-pythons", "-m", "cpu", "-r", "10000", "-d", "6"])
        .args(["-f", "collapsed", "-q", "-o", out.to_str().unwrap()])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let py = python("3.12.1");
    let pids: Vec<u32> = (0..3)
        .map(|_| {
            let mut c = Command::new(&py)
                .args(["-c", "import json, email.parser"])
                .spawn()
                .unwrap();
            let pid = c.id();
            assert!(c.wait().unwrap().success());
            std::thread::sleep(Duration::from_millis(200));
            pid
        })
        .collect();
    wait_timeout(&mut prof, Duration::from_secs(60));
    let text = std::fs::read_to_string(&out).unwrap();
    for pid in pids {
        let label = format!("launch {pid}");
        let own: String = text
            .lines()
            .filter(|l| {
                l.split(';')
                    .next()
                    .unwrap_or("")
                    .ends_with(&format!("[pid {pid}]"))
            })
            .map(|l| format!("{l}\n"))
            .collect();
        let path = dir.join(format!("{pid}.folded"));
        std::fs::write(&path, own).unwrap();
        check_startup(&label, &path);
    }
}

const FORKS: &str = r#"
import os, sys, time
def forked_child_work():
    t0 = time.process_time()
    while time.process_time() - t0 < 0.04:
        pass
t0 = time.monotonic()
while not os.path.exists(sys.argv[1]) and time.monotonic() - t0 < 60:
    time.sleep(0.01)
for i in range(20):
    pid = os.fork()
    if pid == 0:
        forked_child_work()
        os._exit(0)
    os.waitpid(pid, 0)
    time.sleep(0.02)
"#;

/// Whether `pid` samples: one perf event link a CPU (a `bpf_link` whose fdinfo says so).
fn sampling_started(pid: u32) -> bool {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return false;
    };
    fds.filter_map(|e| std::fs::read_to_string(e.ok()?.path()).ok())
        .filter(|info| info.lines().any(|l| l == "link_type:\tperf"))
        .count()
        >= cpus
}

/// A Python process forks 20 children during an `--all-pythons` run, each running 40 ms of
/// CPU in `forked_child_work`, once the profiler samples. With `stop_reader`, the profiler is
/// stopped (SIGSTOP) from before the first fork until the parent has reaped the last child: every
/// child is gone before the reader reads any of its records. Checks that the children's samples
/// in `forked_child_work` come to their 800 ms (in the profile's interval: 1 kHz is moved off
/// the millisecond grid), in all 20 children, merged whole and named right.
fn forked_children(name: &str, stop_reader: bool) {
    let dir = scratch(name);
    let script = dir.join("forks.py");
    std::fs::write(&script, FORKS).unwrap();
    let go = dir.join("go");
    let out = dir.join("forks.folded");
    let mut parent = Command::new(python("3.12.1"))
        .args([script.to_str().unwrap(), go.to_str().unwrap()])
        .spawn()
        .unwrap();
    let prof = Command::new(profiler_bin())
        .args(["--all-pythons", "-m", "cpu", "-r", "1000", "-d", "60"])
        .args(["-f", "collapsed,gecko", "-q", "-o", out.to_str().unwrap()])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = std::time::Instant::now();
    while !sampling_started(prof.id()) {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the profiler never sampled"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(200));
    let signal = |sig: i32| {
        // SAFETY: kill(2) on the profiler's own pid, a child of this test not yet reaped.
        assert_eq!(unsafe { libc::kill(prof.id() as i32, sig) }, 0);
    };
    if stop_reader {
        signal(libc::SIGSTOP);
    }
    std::fs::write(&go, "").unwrap();
    // The run ends once the parent has reaped its last child, however long the forks took on
    // a loaded machine (Ctrl-C writes what was collected).
    wait_timeout(&mut parent, Duration::from_secs(50));
    assert!(parent.wait().unwrap().success());
    if stop_reader {
        signal(libc::SIGCONT);
    }
    signal(libc::SIGINT);
    let o = prof.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = std::fs::read_to_string(&out).unwrap();
    let gecko: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("forks.json")).unwrap()).unwrap();
    let interval_ms = gecko["meta"]["interval"].as_f64().unwrap();
    assert!((0.9..=1.1).contains(&interval_ms), "{interval_ms} ms");
    let parent_root = format!("[pid {}]", parent.id());
    let children: String = text
        .lines()
        .filter(|l| {
            let root = l.split(';').next().unwrap_or("");
            root.starts_with("forks.py") && !root.ends_with(&parent_root)
        })
        .map(|l| format!("{l}\n"))
        .collect();
    // 1 kHz of CPU time, cpu mode: a sample per period the children ran.
    let work: u64 = children
        .lines()
        .filter(|l| l.contains(";forks.py:forked_child_work:"))
        .map(|l| l.rsplit_once(' ').unwrap().1.parse::<u64>().unwrap())
        .sum();
    let work_ms = work as f64 * interval_ms;
    let pids: std::collections::BTreeSet<&str> = children
        .lines()
        .filter(|l| l.contains(";forks.py:forked_child_work:"))
        .filter_map(|l| l.split(';').next())
        .collect();
    eprintln!(
        "{name}: {work} samples ({work_ms:.0} ms) of 800 ms in forked_child_work, in {} children",
        pids.len()
    );
    let path = dir.join("children.folded");
    std::fs::write(&path, &children).unwrap();
    let f = fidelity(&path);
    assert!(
        f.merged as f64 >= 0.98 * f.python as f64,
        "{name}: {} of {} children's samples fully merged: {:#?}",
        f.merged,
        f.python,
        f.problems
    );
    no_wrong_names(name, &f);
    assert!(
        work_ms >= 760.0,
        "{name}: {work_ms:.0} ms of samples in the children's 800 ms of work"
    );
    assert_eq!(pids.len(), 20, "{name}: children sampled");
}

/// `--all-pythons`: a process forked by a Python process (a pool's worker, a pre-fork server's)
/// runs Python from its first instruction, and is profiled from it: the BPF side walks it as it
/// walks its parent, and user space names it at its first sample with Python frames. Before, it
/// was found at the next tick: of 20 children that each ran 20 ms of CPU, about half of their
/// samples were in the profile (203-211 of 400). On a CPU shared with others a child's samples
/// are off by up to one at each time slice: 800 ms in all read 787-822 ms with three busy loops
/// beside them.
#[test]
fn a_process_forked_by_python_during_an_all_pythons_run_is_profiled_from_its_start() {
    require_root();
    forked_children("fidelity_all_pythons_fork", false);
}

/// A forked child that exits before the reader has read its first records (a reader busy with
/// the libraries of what it found, a pool's worker that ran a short task) can no longer be read:
/// it is named from its parent, whose memory it was at the fork. Before, such a child's
/// samples had no Python frame and no native name: `python3 [pid N]` > `[truncated]` > an
/// address (1-3 children of 20 when the machine was loaded).
#[test]
fn a_forked_child_gone_before_its_records_are_read_is_named_from_its_parent() {
    require_root();
    forked_children("fidelity_gone_fork", true);
}

/// The interpreter's own start (its `encodings` and `site` imports, before `Py_RunMain`)
/// is Python code too. A launched command is held at its program's entry point until its
/// runtime is known, so those samples have their Python frames. Before, the first 5-10 ms of
/// every program were sampled before the profiler had found the runtime: 56-66 of about 80
/// startup samples at 10 kHz on 3.12 had eval-loop frames and no Python frame.
#[test]
fn the_interpreters_start_has_its_python_frames() {
    require_root();
    let dir = scratch("fidelity_startup");
    for (label, py) in interpreters() {
        let out = dir.join(format!("{label}.folded"));
        profile_command(
            &out,
            &["-m", "cpu", "-r", "10000", "-f", "collapsed", "-q"],
            &[py.to_str().unwrap(), "-c", "import json, email.parser"],
        );
        check_startup(&label, &out);
    }
}

/// Python started through wrappers that exec it: a script's `#!/usr/bin/env` line, a shell's
/// `exec`, and pyenv's shim (a shell script that execs `pyenv exec`, which execs Python). The
/// launched command is followed through each exec to Python's entry point, so its start has
/// its Python frames too. A wrapper that does not exec (a shell that runs its commands as
/// children) is let go within a moment and runs to its end.
#[test]
fn a_python_started_through_wrappers_has_its_start() {
    require_root();
    let dir = scratch("fidelity_wrappers");
    let py = python("3.12.1");
    let script = dir.join("env_script.py");
    std::fs::write(
        &script,
        format!(
            "#!/usr/bin/env {}\nimport json, email.parser\n",
            py.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    let shim = format!("{home}/.pyenv/shims/python3.12");
    let exec_line = format!("exec {} -c 'import json, email.parser'", py.display());
    let cases: [(&str, Vec<&str>); 3] = [
        ("env shebang", vec![script.to_str().unwrap()]),
        ("sh -c exec", vec!["sh", "-c", &exec_line]),
        (
            "pyenv shim",
            vec![
                "env",
                "PYENV_VERSION=3.12.1",
                &shim,
                "-c",
                "import json, email.parser",
            ],
        ),
    ];
    for (label, command) in cases {
        let out = dir.join(format!("{}.folded", label.replace(' ', "_")));
        profile_command(
            &out,
            &["-m", "cpu", "-r", "10000", "-f", "collapsed", "-q"],
            &command,
        );
        check_startup(label, &out);
    }
    // A shell that stays: let go, it runs to its end.
    let t0 = std::time::Instant::now();
    let out = dir.join("stays.folded");
    let o = profile_command(
        &out,
        &["-f", "collapsed"],
        &["sh", "-c", "sleep 1; echo ran-to-the-end"],
    );
    assert!(String::from_utf8_lossy(&o.stdout).contains("ran-to-the-end"));
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
}
