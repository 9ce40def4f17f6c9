//! The distribution matrix's root file systems: Debian 11, 12 and 13 for x86_64 and Debian 12
//! for arm64, each its release's own userland (C library, `python3`, `dpkg`, `capsh`), made by
//! `debootstrap --variant=minbase` under `.tools/releases/NAME`. The kernel guests of the tests
//! boot each on its release's kernel with a copy of it as their root, install the `.deb` and the
//! wheel of `cargo xtask dist` there and profile the release's own `/usr/bin/python3`.
//!
//! An arm64 root cannot be configured on this machine (its maintainer scripts are arm64
//! programs): `debootstrap --foreign` unpacks it here, and its second stage runs once in the arm64
//! guest under emulation (a few minutes), with the root shared writable.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

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

/// `.tools/releases/NAME` for every release, made if missing (idempotent; about 6 minutes and
/// 250 MB of downloads the first time, most of it the arm64 second stage under emulation).
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
    for (name, suite, arch) in missing {
        let dir = base.join(name);
        eprintln!("xtask: making Debian {suite} ({arch}) with python3 in .tools/releases/{name}");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let foreign = *arch != "amd64";
        let mut cmd = Command::new("debootstrap");
        cmd.args(["--variant=minbase", &format!("--include={INCLUDE}")])
            .arg(format!("--arch={arch}"));
        if foreign {
            cmd.arg("--foreign");
        }
        run(cmd.arg(suite).arg(&dir).arg(MIRROR))?;
        if foreign {
            second_stage(tools, &dir).with_context(|| format!("{name}: the second stage"))?;
        }
        // The downloaded packages are not needed again.
        if let Ok(rd) = std::fs::read_dir(dir.join("var/cache/apt/archives")) {
            for e in rd.flatten() {
                if e.path().extension().is_some_and(|x| x == "deb") {
                    std::fs::remove_file(e.path())?;
                }
            }
        }
        std::fs::write(dir.join(".complete"), &stamp)?;
    }
    Ok(())
}

/// Runs debootstrap's second stage in `root` inside the arm64 guest (Debian 12's kernel from
/// `kernels::setup_arm64`), with the root shared writable.
fn second_stage(tools: &Path, root: &Path) -> Result<()> {
    let kernel = tools.join("arm64/6.1");
    let results = root.join("../.second-stage");
    let _ = std::fs::remove_dir_all(&results);
    std::fs::create_dir_all(&results)?;
    std::fs::write(
        results.join("guest.sh"),
        // As in a container: debootstrap's test of device nodes on the root would make one on
        // the 9p share, whose server refuses to open it (the guest's /dev is its own).
        "container=lxc /debootstrap/debootstrap --second-stage\n",
    )?;
    let console = results.join("console.log");
    let mut child = Command::new("qemu-system-aarch64")
        .args(["-M", "virt", "-accel", "tcg,thread=single", "-cpu", "max"])
        .args(["-smp", "2", "-m", "3G", "-nodefaults", "-display", "none"])
        .args(["-monitor", "none", "-no-reboot", "-serial"])
        .arg(format!("file:{}", console.display()))
        .arg("-kernel")
        .arg(kernel.join("vmlinuz"))
        .arg("-initrd")
        .arg(kernel.join("initrd-rw"))
        .args(["-append", "console=ttyAMA0 panic=-1 quiet"])
        .arg("-virtfs")
        .arg(format!(
            "local,path={},mount_tag=hostroot,security_model=passthrough,multidevs=remap",
            root.display()
        ))
        .arg("-virtfs")
        .arg(format!(
            "local,path={},mount_tag=results,security_model=passthrough,multidevs=remap",
            results.display()
        ))
        .stdin(Stdio::null())
        .spawn()
        .context("qemu-system-aarch64")?;
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait()? {
            break s;
        }
        if t0.elapsed() > Duration::from_secs(1800) {
            let _ = child.kill();
            let _ = child.wait();
            bail!("the arm64 guest did not finish within 30 minutes");
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    let rc = std::fs::read_to_string(results.join("guest.rc")).unwrap_or_default();
    if !status.success() || rc.trim() != "0" {
        bail!(
            "exit {status}, script rc {rc:?}:\n{}\n{}",
            std::fs::read_to_string(results.join("guest.log")).unwrap_or_default(),
            std::fs::read_to_string(&console).unwrap_or_default()
        );
    }
    eprintln!(
        "xtask: the arm64 second stage took {:.0} s",
        t0.elapsed().as_secs_f64()
    );
    std::fs::remove_dir_all(&results)?;
    Ok(())
}
