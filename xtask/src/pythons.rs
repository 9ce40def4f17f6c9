//! Interpreters the pyenv set lacks, as Debian itself builds them: 3.14 (supported) and 3.15
//! (newer than the profiler knows, so native stacks only) from Debian unstable, unpacked under
//! `.tools/debian-python` with the C library they were built against. The system's own apt
//! state is left alone: the package lists live under `.tools/debian-python-apt`.
//!
//! The binaries are patched (patchelf) to use the unpacked loader and libraries, so they run
//! from the host's file system like any other interpreter and find their standard library next
//! to themselves. Debian's builds are stripped and profile-guided, which is what production
//! hosts run and what the pyenv builds are not.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Result};

use super::{private_apt_opts, quiet_ok, run};

const SUITE: &str = "deb http://deb.debian.org/debian sid main\n";
const PACKAGES: [&str; 13] = [
    "libc6",
    // `ssl` (uvloop imports it): unstable's `_ssl` needs unstable's libcrypto.
    "libssl3t64",
    "libgcc-s1",
    "zlib1g",
    "libexpat1",
    "libffi8",
    "libzstd1",
    "python3.14-minimal",
    "libpython3.14-minimal",
    "libpython3.14-stdlib",
    "python3.15-minimal",
    "libpython3.15-minimal",
    "libpython3.15-stdlib",
];
pub const VERSIONS: [&str; 2] = ["3.14", "3.15"];

/// `.tools/debian-python`, set up if needed (idempotent; a few seconds the first time).
pub fn setup(tools: &Path) -> Result<PathBuf> {
    let root = tools.join("debian-python");
    let works = |v: &str| {
        quiet_ok(
            Command::new(root.join(format!("usr/bin/python{v}")))
                .args(["-c", "import ctypes, threading, ssl"]),
        )
    };
    // `.complete` lists what was unpacked: a new package list unpacks again.
    let complete = std::fs::read_to_string(root.join(".complete")).unwrap_or_default();
    if complete == PACKAGES.join("\n") && VERSIONS.iter().all(|v| works(v)) {
        return Ok(root);
    }
    eprintln!("xtask: unpacking Debian's python 3.14 and 3.15 into .tools/debian-python");
    let apt = tools.join("debian-python-apt");
    let _ = std::fs::remove_dir_all(&root);
    let _ = std::fs::remove_dir_all(&apt);
    for d in ["lists/partial", "cache/archives/partial", "debs"] {
        std::fs::create_dir_all(apt.join(d))?;
    }
    std::fs::create_dir_all(&root)?;
    std::fs::write(apt.join("sources.list"), SUITE)?;
    std::fs::write(apt.join("status"), "")?;
    let opts = private_apt_opts(&apt);
    run(Command::new("apt-get").args(&opts).args(["update", "-q"]))?;
    run(Command::new("apt-get")
        .current_dir(apt.join("debs"))
        .args(&opts)
        .args(["download", "-q"])
        .args(PACKAGES))?;
    for deb in std::fs::read_dir(apt.join("debs"))? {
        run(Command::new("dpkg-deb")
            .arg("-x")
            .arg(deb?.path())
            .arg(&root))?;
    }
    for (link, target) in [
        ("lib", "usr/lib"),
        ("lib64", "usr/lib64"),
        ("bin", "usr/bin"),
    ] {
        let _ = std::os::unix::fs::symlink(target, root.join(link));
    }
    let libdir = root.join("usr/lib/x86_64-linux-gnu");
    for v in VERSIONS {
        run(Command::new("patchelf")
            .arg("--set-interpreter")
            .arg(libdir.join("ld-linux-x86-64.so.2"))
            .args(["--force-rpath", "--set-rpath"])
            .arg(&libdir)
            .arg(root.join(format!("usr/bin/python{v}"))))?;
        if !works(v) {
            bail!("Debian's python{v} does not run from .tools/debian-python");
        }
    }
    std::fs::write(root.join(".complete"), PACKAGES.join("\n"))?;
    Ok(root)
}
