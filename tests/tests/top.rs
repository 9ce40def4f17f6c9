//! `tachyon-bpf top` driven through tmux: the hottest function of a known script reaches the
//! first row within 3 s, the process filter and sort keys work, and `q` exits 0.

use std::process::Command;
use std::time::{Duration, Instant};

use tachyon_bpf_tests::*;

fn tmux(args: &[&str]) -> String {
    let o = Command::new("tmux")
        .args(["-L", "tachyon-top-test"])
        .args(args)
        .output()
        .expect("tmux");
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn screen() -> Vec<String> {
    tmux(&["capture-pane", "-p", "-t", "top"])
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn top_shows_the_hottest_function_first_and_quits_on_q() {
    require_root();
    let dir = scratch("top");
    let script = dir.join("hot.py");
    std::fs::write(
        &script,
        "import time\ndef hottest_here():\n    t0 = time.monotonic()\n    items = [0] * 1000\n    while time.monotonic() - t0 < 30:\n        for v in items:\n            y = v\nhottest_here()\n",
    )
    .unwrap();
    let mut target = Command::new(python("3.12.1")).arg(&script).spawn().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let _ = tmux(&["kill-server"]);
    let cmd = format!(
        "{} top -p {}; echo EXIT=$?; sleep 30",
        profiler_bin().display(),
        target.id()
    );
    tmux(&[
        "new-session",
        "-d",
        "-s",
        "top",
        "-x",
        "180",
        "-y",
        "30",
        &cmd,
    ]);
    let t0 = Instant::now();
    let mut first = String::new();
    while t0.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(200));
        let s = screen();
        if let Some(row) = s.get(2) {
            first = row.clone();
            if first.contains("hottest_here (hot.py:2)") {
                break;
            }
        }
    }
    let at = t0.elapsed();
    assert!(
        first.contains("hottest_here (hot.py:2)"),
        "first row after {at:?}: {first:?}\n{}",
        screen().join("\n")
    );
    let s = screen();
    assert!(
        s[0].contains("tachyon-bpf top:") && s[0].contains("sorted by self"),
        "{s:?}"
    );
    assert!(s[1].contains("%self") && s[1].contains("%GILw"), "{s:?}");
    // Sort by total time, then filter to the one process.
    tmux(&["send-keys", "-t", "top", "t"]);
    std::thread::sleep(Duration::from_millis(300));
    assert!(screen()[0].contains("sorted by total"));
    tmux(&["send-keys", "-t", "top", "p"]);
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        screen()[0].contains("hot.py (Python 3.12.1)"),
        "{:?}",
        screen()[0]
    );
    tmux(&["send-keys", "-t", "top", "q"]);
    let t1 = Instant::now();
    let mut exited = String::new();
    while t1.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(100));
        if let Some(l) = screen().into_iter().find(|l| l.starts_with("EXIT=")) {
            exited = l;
            break;
        }
    }
    let _ = tmux(&["kill-server"]);
    let _ = target.kill();
    let _ = target.wait();
    assert_eq!(exited, "EXIT=0", "q quits cleanly");
}
