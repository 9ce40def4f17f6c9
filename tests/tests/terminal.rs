//! At the terminal: the live status line under a pseudo-terminal, never when piped; the end
//! summary with the hottest functions and each process's CPU and GIL split; --quiet.

use std::process::Command;

use tachyon_bpf_tests::*;

const SCRIPT: &str = r#"
import time
def hottest(n):
    s = 0
    for i in range(n):
        s += i * i
    return s
t0 = time.time()
while time.time() - t0 < 2.0:
    hottest(50000)
"#;

#[test]
fn status_line_on_a_terminal_only_and_a_summary() {
    require_root();
    let dir = scratch("terminal");
    let script = dir.join("app.py");
    std::fs::write(&script, SCRIPT).unwrap();
    let py = python("3.12.1");
    let out = dir.join("t.json");
    let cmd = format!(
        "{} -o {} -- {} {}",
        profiler_bin().display(),
        out.display(),
        py.display(),
        script.display()
    );
    // `script` runs the profiler on a pseudo-terminal and copies what it shows.
    let o = Command::new("script")
        .args(["-qec", &cmd, "/dev/null"])
        .output()
        .expect("script (util-linux)");
    assert!(o.status.success());
    let shown = String::from_utf8_lossy(&o.stdout);
    let updates: Vec<&str> = shown
        .split("\r\x1b[2K")
        .filter_map(|s| s.split(['\r', '\n']).next())
        .filter(|s| s.starts_with("tachyon-bpf:") && s.contains("/s, at most"))
        .collect();
    assert!(
        updates.len() >= 4,
        "a status line refreshed while recording: {shown:.600}"
    );
    let last = updates.last().unwrap();
    for part in ["/s, at most 2000/s)", "lost 0"] {
        assert!(last.contains(part), "{part:?} in {last:?}");
    }
    // Processes and threads seen so far: the interpreter (and, when the launched command was
    // sampled before its exec, that earlier program too).
    let count = |what: &str| -> u64 {
        last.split(what)
            .next()
            .and_then(|s| s.rsplit(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    let (procs, threads) = (count(" processes"), count(" threads"));
    assert!((1..=2).contains(&procs), "processes in {last:?}");
    assert!((1..=2).contains(&threads), "threads in {last:?}");
    assert!(
        shown.contains("top 5 Python functions by self time (wall mode;"),
        "{shown}"
    );
    let total = shown
        .split("top 5 Python functions by total time:")
        .nth(1)
        .expect("a top of Python functions by total time");
    assert!(total.contains("hottest (app.py:3)"), "{shown}");
    // No native scaffolding among them.
    let listed = total.split("per process").next().unwrap_or(total);
    assert!(
        !listed.contains("_start") && !listed.contains("Py_RunMain"),
        "{listed}"
    );
    assert!(
        shown.contains("app.py (Python 3.12.1) [pid ") && shown.contains("holding the GIL"),
        "{shown}"
    );

    // Piped: the summary, no status line.
    let o = profile_command(&out, &[], &[py.to_str().unwrap(), script.to_str().unwrap()]);
    let err = stderr_of(&o);
    assert!(!err.contains('\r') && !err.contains("\x1b["), "{err}");
    assert!(err.contains("top 5 Python functions by self time"), "{err}");

    // --quiet on a terminal: nothing but the command's own output.
    let o = Command::new("script")
        .args([
            "-qec",
            &format!(
                "{} -q -o {} -- true",
                profiler_bin().display(),
                out.display()
            ),
            "/dev/null",
        ])
        .output()
        .unwrap();
    assert!(o.status.success());
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "", "--quiet");
}
