//! Least privilege: an unprivileged user holding exactly the documented capabilities profiles
//! another user's (root's) Python process fully: native frames from binaries it cannot read by
//! path, Python frames, named kernel frames. Without any one of them, the error names it.
//! Files are 0600 unless --file-mode says otherwise; under sudo they and the launched command
//! belong to the user who ran it.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use tachyon_bpf_tests::*;

fn root_target(dir: &Path) -> KillOnDrop {
    let script = dir.join("root_app.py");
    std::fs::write(
        &script,
        "import os, time\ndef root_busy():\n    t0 = time.monotonic()\n    while time.monotonic() - t0 < 30:\n        sum(range(2000))\n        os.stat('/')\nroot_busy()\n",
    )
    .unwrap();
    let py = python("3.12.1");
    // The interpreter lives under /root, which nobody may not even list.
    assert_eq!(
        std::fs::metadata("/root").unwrap().permissions().mode() & 0o005,
        0,
        "/root is closed to other users on these machines"
    );
    assert!(py.starts_with("/root"));
    KillOnDrop(Command::new(py).arg(&script).spawn().unwrap())
}

#[test]
fn the_documented_capabilities_are_enough_and_each_is_needed() {
    require_root();
    let dir = scratch("privilege");
    // Writable by nobody, and sticky as /tmp is (a non-sticky directory others can write to is
    // refused as an output directory).
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let target = root_target(&dir);
    std::thread::sleep(Duration::from_millis(300));
    let pid = target.0.id().to_string();
    let out = dir.join("p.folded");
    let args = |extra: &[&str]| -> Vec<String> {
        let mut a: Vec<String> = ["-p", &pid, "-d", "2", "-f", "collapsed", "-o"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        a.push(out.display().to_string());
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    let o = as_nobody_with(&CAPS, &args(&[]));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "with the five capabilities: {err}");
    let text = std::fs::read_to_string(&out).unwrap();
    let total: u64 = text
        .lines()
        .map(|l| l.rsplit_once(' ').unwrap().1.parse::<u64>().unwrap())
        .sum();
    let count = |f: &dyn Fn(&str) -> bool| -> u64 {
        text.lines()
            .filter(|l| f(l))
            .map(|l| l.rsplit_once(' ').unwrap().1.parse::<u64>().unwrap())
            .sum()
    };
    assert!(total > 1500, "2 s of a busy thread: {total}");
    let py = count(&|l| l.contains("root_app.py:root_busy:"));
    assert!(
        py as f64 > 0.9 * total as f64,
        "Python frames: {py} of {total}"
    );
    let rooted = count(&|l| l.contains(";_start;") && l.contains("Py_BytesMain"));
    assert!(
        rooted as f64 > 0.9 * total as f64,
        "native frames from root's binaries: {rooted} of {total}"
    );
    let kernel = count(&|l| l.contains("_[k]"));
    let unnamed = count(&|l| l.contains(";0xffff"));
    assert!(kernel > 0, "os.stat reaches the kernel");
    assert_eq!(unnamed, 0, "kernel frames are named");
    let mode = std::fs::metadata(&out).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "private by default");

    // --file-mode, and its old name.
    for (flag, want) in [("--file-mode", 0o640), ("--output-mode", 0o644)] {
        let o = as_nobody_with(&CAPS, &args(&[flag, &format!("{want:o}")]));
        assert!(o.status.success());
        let mode = std::fs::metadata(&out).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, want, "{flag}");
    }

    for drop in CAPS {
        let fewer: Vec<&str> = CAPS.iter().copied().filter(|c| *c != drop).collect();
        let o = as_nobody_with(&fewer, &args(&[]));
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(3), "without {drop}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        let named = format!("missing: {}", drop.to_uppercase());
        assert!(err.contains(&named), "without {drop}: {err}");
    }
}

/// Under `sudo` (SUDO_UID and SUDO_GID, as sudo sets them), the profile belongs to the user who
/// ran it, still private, and the launched command runs as that user with their groups; with
/// --run-as-root it runs as root, as before.
#[test]
fn under_sudo_the_profile_and_the_command_belong_to_the_user() {
    require_root();
    let dir = scratch("sudo");
    let out = dir.join("profile");
    let probe = "import os; print(os.getuid(), os.getgid(), os.environ.get('USER'))";
    let run = |extra: &[&str]| {
        let mut args = vec!["-o", out.to_str().unwrap(), "-f", "gecko,heatmap"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--", "/usr/bin/python3.11", "-c", probe]);
        let o = Command::new(profiler_bin())
            .args(&args)
            .env("SUDO_UID", "65534")
            .env("SUDO_GID", "65534")
            .env("SUDO_USER", "nobody")
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    };
    // -o with two formats: the base name, each format adding its extension.
    let said = run(&[]);
    assert_eq!(
        said, "65534 65534 nobody",
        "the command ran as the sudo user"
    );
    let gecko = PathBuf::from(format!("{}.json", out.display()));
    let m = std::fs::metadata(&gecko).unwrap();
    assert_eq!(
        (m.uid(), m.gid()),
        (65534, 65534),
        "the profile is the user's"
    );
    assert_eq!(m.permissions().mode() & 0o777, 0o600, "and still private");
    let pages = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .find(|e| e.path().is_dir())
        .expect("the heatmap's directory");
    assert_eq!(
        pages.metadata().unwrap().uid(),
        65534,
        "{}",
        pages.path().display()
    );
    for page in std::fs::read_dir(pages.path()).unwrap().flatten() {
        assert_eq!(
            page.metadata().unwrap().uid(),
            65534,
            "{}",
            page.path().display()
        );
    }
    // The directory itself is left as it was.
    assert_eq!(std::fs::metadata(&dir).unwrap().uid(), 0);

    let said = run(&["--run-as-root"]);
    assert!(said.starts_with("0 0"), "--run-as-root: {said}");
}
