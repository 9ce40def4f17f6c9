//! The distribution matrix's root file systems: Debian 11, 12 and 13 for x86_64 and Debian 12
//! for arm64, each its release's own userland (C library, `python3`, `dpkg`, `capsh`), made by
//! `debootstrap --variant=minbase` under `.tools/releases/NAME`. The kernel guests of the tests
//! boot each on its release's kernel with a copy of it as their root, install the `.deb` and the
//! wheel of `cargo xtask dist` there and profile the release's own `/usr/bin/python3`.
//!
//! An arm64 root's maintainer scripts are arm64 programs: `debootstrap --foreign` unpacks it,
//! and its second stage runs here under qemu's user-mode emulator (Debian's
//! `qemu-user-static`, unpacked under `.tools/qemu-user`, not installed), registered with a
//! binfmt_misc instance of a user namespace of our own (Linux 6.7 and newer mount one per user
//! namespace), so this machine's own binfmt_misc is never touched. In a guest under full-system
//! emulation the same stage took over an hour.

use std::ffi::CString;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};

use super::kernels::MIRROR;
use super::{apt_install, run};

/// (name under `.tools/releases`, Debian suite, architecture).
pub const RELEASES: [(&str, &str, &str); 4] = [
    ("bullseye", "bullseye", "amd64"),
    ("bookworm", "bookworm", "amd64"),
    ("trixie", "trixie", "amd64"),
    ("bookworm-arm64", "bookworm", "arm64"),
];

/// What each root holds besides minbase: the interpreter, `venv` for the wheel's test, and
/// `capsh` to run the unit's command with only its capabilities.
const INCLUDE: &str = "python3,python3-venv,libcap2-bin";

/// `.tools/releases/NAME` for every release, made if missing (idempotent; about 10 minutes and
/// 250 MB of downloads the first time, half of it the arm64 second stage under emulation).
pub fn setup(tools: &Path) -> Result<()> {
    let base = tools.join("releases");
    let stamp = format!("{INCLUDE}\n");
    let missing: Vec<_> = RELEASES
        .iter()
        .filter(|(name, ..)| {
            std::fs::read_to_string(base.join(name).join(".complete"))
                .ok()
                .as_deref()
                != Some(stamp.as_str())
        })
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    apt_install(&["debootstrap"])?;
    // The emulator is fetched before the threads start (apt is not to be run twice at once).
    if missing.iter().any(|(_, _, arch)| *arch != "amd64") {
        qemu_user(tools)?;
    }
    // One thread each: debootstrap waits on downloads and dpkg more than on the CPU.
    let results: Vec<Result<()>> = std::thread::scope(|scope| {
        let handles: Vec<_> = missing
            .iter()
            .map(|&&(name, suite, arch)| {
                let dir = base.join(name);
                let stamp = &stamp;
                scope.spawn(move || {
                    make_root(tools, &dir, suite, arch, stamp)
                        .with_context(|| format!("Debian {suite} ({arch}) in {}", dir.display()))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| bail!("a debootstrap thread panicked"))
            })
            .collect()
    });
    results.into_iter().collect()
}

/// One release's root in `dir`, made anew; `.complete` holds `stamp` when it is done.
fn make_root(tools: &Path, dir: &Path, suite: &str, arch: &str, stamp: &str) -> Result<()> {
    eprintln!(
        "xtask: making Debian {suite} ({arch}) with python3 in {}",
        dir.display()
    );
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir)?;
    let foreign = arch != "amd64";
    let mut cmd = Command::new("debootstrap");
    cmd.args(["--variant=minbase", &format!("--include={INCLUDE}")])
        .arg(format!("--arch={arch}"));
    if foreign {
        cmd.arg("--foreign");
    }
    // Quiet unless it fails: four run at once.
    let out = cmd.arg(suite).arg(dir).arg(MIRROR).output()?;
    if !out.status.success() {
        bail!(
            "debootstrap failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    if foreign {
        second_stage(tools, dir).context("the second stage")?;
    }
    // The downloaded packages are not needed again.
    if let Ok(rd) = std::fs::read_dir(dir.join("var/cache/apt/archives")) {
        for e in rd.flatten() {
            if e.path().extension().is_some_and(|x| x == "deb") {
                std::fs::remove_file(e.path())?;
            }
        }
    }
    std::fs::write(dir.join(".complete"), stamp)?;
    Ok(())
}

/// The arm64 ELF header pattern and mask of qemu's binfmt_misc registration, as the kernel's
/// `register` file parses them (`\xHH` escapes).
const AARCH64_MAGIC: &str =
    r"\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xb7\x00";
const AARCH64_MASK: &str =
    r"\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff";

/// `qemu-aarch64-static`, unpacked from Debian's package under `.tools/qemu-user`.
fn qemu_user(tools: &Path) -> Result<std::path::PathBuf> {
    let dir = tools.join("qemu-user");
    let bin = dir.join("usr/bin/qemu-aarch64-static");
    if bin.exists() {
        return Ok(bin);
    }
    let work = tools.join("qemu-user-deb");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work)?;
    run(Command::new("apt-get")
        .current_dir(&work)
        .args(["download", "-q", "qemu-user-static"]))?;
    for deb in std::fs::read_dir(&work)? {
        run(Command::new("dpkg-deb")
            .arg("-x")
            .arg(deb?.path())
            .arg(&dir))?;
    }
    std::fs::remove_dir_all(&work)?;
    bin.exists()
        .then_some(bin)
        .context("qemu-user-static has no qemu-aarch64-static")
}

/// Runs debootstrap's second stage in the arm64 `root`: in new user and mount namespaces (root
/// mapped to root, so files keep their owners), with a binfmt_misc of their own that runs arm64
/// programs by `qemu-aarch64-static` (flag F: the emulator is opened at registration, so it
/// works in the chroot), this machine's /proc and /sys bound into the root.
fn second_stage(tools: &Path, root: &Path) -> Result<()> {
    let qemu = qemu_user(tools)?;
    let r = root.display();
    let script = format!(
        "set -e
mount --make-rprivate /
mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
printf '%s' ':tachyon-aarch64:M::{AARCH64_MAGIC}:{AARCH64_MASK}:{q}:F' > /proc/sys/fs/binfmt_misc/register
rm -f {r}/proc && mkdir -p {r}/proc
mount --rbind /proc {r}/proc
mount --rbind /sys {r}/sys
container=lxc chroot {r} /debootstrap/debootstrap --second-stage
",
        q = qemu.display()
    );
    let t0 = Instant::now();
    in_user_namespace(&script)?;
    eprintln!(
        "xtask: the arm64 second stage took {:.0} s",
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Runs `sh -c script` in new user and mount namespaces whose root is this machine's (ids 0 to
/// 65535 mapped to themselves). util-linux's `unshare --map-users` would need /etc/subuid
/// entries for root; the maps are written here by the parent, as root may.
fn in_user_namespace(script: &str) -> Result<()> {
    let sh = CString::new("/bin/sh")?;
    let args = [sh.clone(), CString::new("-c")?, CString::new(script)?];
    let mut argv: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    let (mut up, mut go) = ([0i32; 2], [0i32; 2]);
    // SAFETY: pipe fills the two-element arrays it is given.
    if unsafe { libc::pipe(up.as_mut_ptr()) } != 0 || unsafe { libc::pipe(go.as_mut_ptr()) } != 0 {
        bail!("pipe: {}", std::io::Error::last_os_error());
    }
    // SAFETY: the child calls only async-signal-safe functions (unshare, read, write, execv,
    // _exit) on memory made before the fork, so other threads of this process cannot leave it
    // a lock held.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        bail!("fork: {}", std::io::Error::last_os_error());
    }
    if pid == 0 {
        // SAFETY: plain system calls on this process's own descriptors and memory.
        unsafe {
            let ok = libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS) == 0;
            let byte = [u8::from(ok)];
            libc::write(up[1], byte.as_ptr().cast(), 1);
            let mut b = [0u8];
            if ok && libc::read(go[0], b.as_mut_ptr().cast(), 1) == 1 && b[0] == 1 {
                libc::execv(sh.as_ptr(), argv.as_ptr());
            }
            libc::_exit(127);
        }
    }
    let mut b = [0u8];
    // SAFETY: reads one byte into a one-byte buffer.
    let unshared = unsafe { libc::read(up[0], b.as_mut_ptr().cast(), 1) } == 1 && b[0] == 1;
    let mapped = unshared
        && ["uid_map", "gid_map"]
            .iter()
            .all(|m| std::fs::write(format!("/proc/{pid}/{m}"), "0 0 65536\n").is_ok());
    let byte = [u8::from(mapped)];
    let mut status = 0;
    // SAFETY: writes one byte, then waits for the child this function forked.
    unsafe {
        libc::write(go[1], byte.as_ptr().cast(), 1);
        libc::waitpid(pid, &mut status, 0);
        for fd in [up[0], up[1], go[0], go[1]] {
            libc::close(fd);
        }
    }
    if !mapped {
        bail!("could not make a user namespace (unshare, or writing its id maps, failed)");
    }
    if !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
        bail!("the script in the user namespace failed (wait status {status:#x})");
    }
    Ok(())
}
