//! The kernel matrix: Debian's kernels that fleets run, booted under qemu (TCG) with this
//! machine's root file system shared read-only over 9p, so the real binary, the real
//! interpreters and the real tests run on each of them.
//!
//! `setup` fetches each kernel package through a private apt configuration (the system's apt
//! state is untouched, as for Debian's interpreters in `pythons.rs`) and builds a small
//! initramfs per kernel: Debian's static busybox, the kernel's own virtio/9p modules
//! (decompressed here, since busybox's insmod takes plain `.ko` files) and an `/init` that mounts
//! the host's root, a writable results share and the kernel file systems, then runs the guest
//! script the test wrote and powers off. No disk image and no network device.
//!
//! The boot itself is `tachyon_bpf_tests::kernels::boot`, used by `tests/tests/kernels.rs`.

use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context, Result};

use super::{output_of, private_apt_opts, run};

/// (label, Debian suite): the kernels of Debian 11, 12 and 13, and unstable's newest.
pub const KERNELS: [(&str, &str); 4] = [
    ("5.10", "bullseye"),
    ("6.1", "bookworm"),
    ("6.12", "trixie"),
    ("unstable", "sid"),
];

/// Debian's archive, as this machine's apt reaches it.
pub const MIRROR: &str = "http://deb.debian.org/debian";

fn sources() -> String {
    ["bullseye", "bookworm", "trixie", "sid"]
        .iter()
        .map(|s| format!("deb {MIRROR} {s} main\n"))
        .collect()
}

/// The arm64 guest's trees (see `setup_arm64`): (suite, directory under the root, packages,
/// the package that must be among their dependencies). Debian 12's python3 (3.11) is the root;
/// Debian 13's python3.13, with its own C library, is a tree of its own under `/trixie`, run
/// there by `chroot` as a container's process is.
const ARM64_TREES: [(&str, &str, &[&str], &str); 2] = [
    (
        "bookworm",
        "",
        &["python3", "busybox-static"],
        "python3.11-minimal",
    ),
    ("trixie", "trixie", &["python3.13"], "python3.13-minimal"),
];

/// The arm64 guest's kernels, `.tools/arm64/LABEL`: Debian 12's (the modern program set) and
/// Debian 11's 5.10 (the compat set; Amazon Linux 2 on Graviton runs 5.10 too).
pub const ARM64_KERNELS: [(&str, &str); 2] = [("6.1", "bookworm"), ("5.10", "bullseye")];

/// Dependencies left out of the trees: what only maintainer scripts and installers run (the
/// scripts are not run).
const ARM64_LEFT_OUT: [&str; 11] = [
    "perl",
    "dpkg",
    "tar",
    "install-info",
    "mailcap",
    "mime-support",
    "libperl",
    "debconf",
    "cdebconf",
    "libdebian-installer",
    "libnewt",
];

/// busybox applets the guest script calls, linked in the arm64 root's `/bin`.
const ARM64_APPLETS: [&str; 12] = [
    "sh", "sleep", "uname", "cat", "kill", "ls", "mkdir", "env", "true", "grep", "mount", "chroot",
];

/// Modules the guest needs to reach its 9p shares; their dependencies come from `modules.dep`.
const MODULES: [&str; 3] = ["virtio_pci", "9pnet_virtio", "9p"];

const INIT: &str = r#"#!/bin/busybox sh
B=/bin/busybox
$B mkdir -p /proc /sys /dev /newroot
$B mount -t proc proc /proc
$B mount -t devtmpfs dev /dev
for m in $($B cat /modules/order); do
  $B insmod /modules/$m || echo "tachyon-guest: insmod $m failed"
done
$B mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=262144 hostroot /newroot \
  || echo "tachyon-guest: mounting the host's root failed"
$B mount -t tmpfs tmp /newroot/tmp
$B mkdir -p /newroot/tmp/results
$B mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 results /newroot/tmp/results
$B mount -t proc proc /newroot/proc
$B mount -t sysfs sys /newroot/sys
$B mount -t devtmpfs dev /newroot/dev
$B mount -t tmpfs run /newroot/run
$B mount -t tracefs tracefs /newroot/sys/kernel/tracing 2>/dev/null
$B mount -t bpf bpf /newroot/sys/fs/bpf
$B chroot /newroot /bin/sh -c 'cd /tmp/results && HOME=/tmp PATH=/usr/local/bin:/usr/bin:/bin /bin/sh /tmp/results/guest.sh > /tmp/results/guest.log 2>&1; echo $? > /tmp/results/guest.rc'
$B sync
$B umount /newroot/tmp/results
echo "tachyon-guest: done"
$B poweroff -f
"#;

/// `/init` for a guest whose root is a copy of its own, shared writable: a release's root file
/// system (`releases.rs`), where the tests install packages.
pub fn rw_init() -> String {
    let init = INIT.replace(",ro,cache=loose,", ",");
    assert_ne!(init, INIT, "the root's mount options in INIT");
    init
}

/// `initrd-rw` beside each guest kernel's `initrd`: the same archive followed by one holding the
/// writable root's `/init` (the kernel unpacks both in order, and the later file wins).
pub fn setup_rw_initrds(tools: &Path) -> Result<()> {
    let tail = newc(&[("init".into(), rw_init().into_bytes(), 0o755)]);
    let x86 = KERNELS.iter().map(|(l, _)| tools.join("kernels").join(l));
    let arm64 = ARM64_KERNELS
        .iter()
        .map(|(l, _)| tools.join("arm64").join(l));
    for d in x86.chain(arm64) {
        let mut bytes = std::fs::read(d.join("initrd"))
            .with_context(|| format!("{}", d.join("initrd").display()))?;
        bytes.extend_from_slice(&tail);
        if std::fs::read(d.join("initrd-rw")).ok().as_ref() != Some(&bytes) {
            std::fs::write(d.join("initrd-rw"), &bytes)?;
        }
    }
    Ok(())
}

/// Unpacks every package in `debs` into `dest` (no maintainer scripts).
fn unpack(debs: &Path, dest: &Path) -> Result<()> {
    for deb in std::fs::read_dir(debs)? {
        run(Command::new("dpkg-deb")
            .arg("-x")
            .arg(deb?.path())
            .arg(dest))?;
    }
    Ok(())
}

/// Downloads `pkgs` with the private apt options `opts` into a fresh `work` directory,
/// unpacks them into `dest`, and removes `work`.
fn fetch_unpack(opts: &[String], pkgs: &[String], work: &Path, dest: &Path) -> Result<()> {
    let _ = std::fs::remove_dir_all(work);
    std::fs::create_dir_all(work)?;
    run(Command::new("apt-get")
        .current_dir(work)
        .args(opts)
        .args(["download", "-q"])
        .args(pkgs))?;
    unpack(work, dest)?;
    std::fs::remove_dir_all(work)?;
    Ok(())
}

/// `Depends` of a package in a suite, as package names.
fn depends(opts: &[String], pkg: &str) -> Vec<String> {
    let text = output_of(Command::new("apt-cache").args(opts).args(["show", pkg]));
    text.lines()
        .find_map(|l| l.strip_prefix("Depends:"))
        .map(|d| {
            d.split(',')
                .flat_map(|alt| alt.split('|'))
                .filter_map(|p| p.split_whitespace().next())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// `.tools/kernels/LABEL/{vmlinuz,initrd,release}` for every kernel, set up if needed
/// (idempotent; about a minute and 250 MB of downloads the first time).
pub fn setup(tools: &Path) -> Result<()> {
    let root = tools.join("kernels");
    let ready = |label: &str| {
        ["vmlinuz", "initrd", "release"]
            .iter()
            .all(|f| root.join(label).join(f).exists())
    };
    if root.join(".complete").exists() && KERNELS.iter().all(|(l, _)| ready(l)) {
        return Ok(());
    }
    eprintln!(
        "xtask: fetching Debian's kernels 5.10, 6.1, 6.12 and unstable's into .tools/kernels"
    );
    let apt = tools.join("kernels-apt");
    for d in ["lists/partial", "cache/archives/partial"] {
        std::fs::create_dir_all(apt.join(d))?;
    }
    std::fs::write(apt.join("sources.list"), sources())?;
    std::fs::write(apt.join("status"), "")?;
    let opts = private_apt_opts(&apt);
    run(Command::new("apt-get").args(&opts).args(["update", "-q"]))?;
    let busybox_dir = apt.join("busybox");
    let _ = std::fs::remove_dir_all(&busybox_dir);
    fetch_unpack(
        &opts,
        &["busybox-static/bookworm".to_string()],
        &apt.join("debs"),
        &busybox_dir,
    )?;
    let busybox = std::fs::read(busybox_dir.join("bin/busybox")).context("busybox-static")?;
    for (label, suite) in KERNELS {
        // The suite's `linux-image-amd64` names the current image package; newer kernels split
        // it into a small image package plus `linux-binary-*` (vmlinuz) and `linux-modules-*`.
        let image = depends(&opts, &format!("linux-image-amd64/{suite}"))
            .into_iter()
            .find(|p| p.starts_with("linux-image-"))
            .with_context(|| format!("no linux-image-amd64 in Debian {suite}"))?;
        let mut pkgs = vec![format!("{image}/{suite}")];
        for d in depends(&opts, &format!("{image}/{suite}")) {
            if d.starts_with("linux-binary-") || d.starts_with("linux-modules-") {
                pkgs.push(format!("{d}/{suite}"));
            }
        }
        let unpacked = apt.join(format!("unpacked-{label}"));
        let _ = std::fs::remove_dir_all(&unpacked);
        fetch_unpack(&opts, &pkgs, &apt.join(format!("debs-{label}")), &unpacked)?;
        let dir = root.join(label);
        std::fs::create_dir_all(&dir)?;
        build_guest(&unpacked, &dir, &busybox).with_context(|| format!("kernel {label}"))?;
        std::fs::remove_dir_all(&unpacked)?;
    }
    std::fs::write(root.join(".complete"), "")?;
    Ok(())
}

/// Copies the kernel out of an unpacked package and writes the initramfs beside it.
fn build_guest(unpacked: &Path, dir: &Path, busybox: &[u8]) -> Result<()> {
    // `/boot/vmlinuz-RELEASE`, or (newer packages) `/usr/lib/modules/RELEASE/vmlinuz`.
    let mut found = None;
    if let Ok(rd) = std::fs::read_dir(unpacked.join("boot")) {
        for e in rd.flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            if let Some(r) = n.strip_prefix("vmlinuz-") {
                found = Some((e.path(), r.to_string()));
            }
        }
    }
    for base in ["usr/lib/modules", "lib/modules"] {
        if let Ok(rd) = std::fs::read_dir(unpacked.join(base)) {
            for e in rd.flatten() {
                if found.is_none() && e.path().join("vmlinuz").exists() {
                    found = Some((
                        e.path().join("vmlinuz"),
                        e.file_name().to_string_lossy().into_owned(),
                    ));
                }
            }
        }
    }
    let (vmlinuz, release) = found.context("no vmlinuz in the package")?;
    // Packages do not ship modules.dep (depmod writes it at install time): write it here. depmod
    // looks under BASE/lib/modules, which merged-/usr packages only have as usr/lib/modules.
    if !unpacked.join("lib/modules").exists() && unpacked.join("usr/lib/modules").exists() {
        std::os::unix::fs::symlink("usr/lib", unpacked.join("lib"))?;
    }
    run(Command::new("/sbin/depmod")
        .arg("-b")
        .arg(unpacked)
        .arg(&release))?;
    let moddir = unpacked.join("lib/modules").join(&release);
    let dep = std::fs::read_to_string(moddir.join("modules.dep"))?;
    let order = module_order(&dep, &MODULES)?;
    let mut files: Vec<(String, Vec<u8>, u32)> = vec![
        ("bin/busybox".into(), busybox.to_vec(), 0o755),
        ("init".into(), INIT.as_bytes().to_vec(), 0o755),
    ];
    let mut names = Vec::new();
    for rel in &order {
        let data = decompress(&moddir.join(rel))?;
        let name = Path::new(rel)
            .file_name()
            .unwrap()
            .to_string_lossy()
            .split(".ko")
            .next()
            .unwrap()
            .to_string()
            + ".ko";
        files.push((format!("modules/{name}"), data, 0o644));
        names.push(name);
    }
    files.push(("modules/order".into(), names.join("\n").into_bytes(), 0o644));
    std::fs::write(dir.join("initrd"), newc(&files))?;
    std::fs::copy(&vmlinuz, dir.join("vmlinuz"))?;
    std::fs::write(dir.join("release"), &release)?;
    Ok(())
}

/// Module paths (relative to the modules directory) in load order: dependencies first.
fn module_order(dep: &str, wanted: &[&str]) -> Result<Vec<String>> {
    let deps: std::collections::HashMap<&str, Vec<&str>> = dep
        .lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(m, d)| (m.trim(), d.split_whitespace().collect()))
        .collect();
    let by_name = |n: &str| {
        deps.keys()
            .find(|k| {
                Path::new(k)
                    .file_name()
                    .is_some_and(|f| f.to_string_lossy().split(".ko").next() == Some(n))
            })
            .copied()
    };
    let mut order: Vec<String> = Vec::new();
    for w in wanted {
        // Built into the kernel when modules.dep does not list it.
        let Some(m) = by_name(w) else { continue };
        // modules.dep lists every dependency, transitively, deepest last.
        for d in deps[m].iter().rev().chain(std::iter::once(&m)) {
            if !order.iter().any(|o| o == d) {
                order.push(d.to_string());
            }
        }
    }
    if order.is_empty() {
        bail!("none of {wanted:?} in modules.dep");
    }
    Ok(order)
}

fn decompress(path: &Path) -> Result<Vec<u8>> {
    let name = path.to_string_lossy();
    let tool = if name.ends_with(".xz") {
        Some("xz")
    } else if name.ends_with(".zst") {
        Some("zstd")
    } else if name.ends_with(".gz") {
        Some("gzip")
    } else {
        None
    };
    match tool {
        None => Ok(std::fs::read(path)?),
        Some(t) => {
            let out = Command::new(t).args(["-d", "-c"]).arg(path).output()?;
            if !out.status.success() {
                bail!(
                    "{t} -d {}: {}",
                    path.display(),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            Ok(out.stdout)
        }
    }
}

/// A `newc` cpio archive of regular files (and the directories above them). Written here
/// because it is a few lines and Debian's cpio is not on the machine.
pub fn newc(files: &[(String, Vec<u8>, u32)]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut ino = 1u32;
    let mut entry = |out: &mut Vec<u8>, name: &str, mode: u32, data: &[u8]| {
        let hdr = format!(
            "070701{ino:08x}{mode:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}",
            0,
            0,
            1,
            0,
            data.len(),
            0,
            0,
            0,
            0,
            name.len() + 1,
            0
        );
        ino += 1;
        out.extend_from_slice(hdr.as_bytes());
        out.extend_from_slice(name.as_bytes());
        out.push(0);
        while !out.len().is_multiple_of(4) {
            out.push(0);
        }
        out.extend_from_slice(data);
        while !out.len().is_multiple_of(4) {
            out.push(0);
        }
    };
    let mut dirs: Vec<String> = Vec::new();
    for (name, data, perm) in files {
        let mut prefix = String::new();
        for part in name
            .split('/')
            .rev()
            .skip(1)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
        {
            prefix = if prefix.is_empty() {
                part.to_string()
            } else {
                format!("{prefix}/{part}")
            };
            if !dirs.contains(&prefix) {
                entry(&mut out, &prefix, 0o040755, &[]);
                dirs.push(prefix.clone());
            }
        }
        entry(&mut out, name, 0o100000 | perm, data);
    }
    entry(&mut out, "TRAILER!!!", 0, &[]);
    out
}

/// `.tools/arm64/LABEL/{vmlinuz,initrd,release}` for each of `ARM64_KERNELS` (Debian's arm64
/// kernel and an initramfs of arm64 busybox and the kernel's virtio/9p modules), and
/// `.tools/arm64/root`, an arm64 Debian tree with python3 (3.11) unpacked from bookworm's
/// packages, which the guest mounts as its root, with Debian 13's python3.13 under its
/// `/trixie`. Maintainer scripts are not run: the interpreters need none, and `/bin/sh` and
/// the few tools the guest script calls are busybox's. Idempotent; about 150 MB of downloads
/// the first time.
pub fn setup_arm64(tools: &Path) -> Result<()> {
    let dir = tools.join("arm64");
    let ready = ARM64_KERNELS
        .iter()
        .all(|(label, _)| dir.join(label).join("release").exists());
    if dir.join(".complete").exists() && ready {
        return Ok(());
    }
    eprintln!(
        "xtask: fetching Debian's arm64 kernels (5.10, 6.1), python3 and python3.13 into .tools/arm64"
    );
    let _ = std::fs::remove_dir_all(&dir);
    let root = dir.join("root");
    for (suite, sub, pkgs, must) in ARM64_TREES {
        let (apt, opts) = arm64_apt(tools, suite)?;
        // The packages' closure: `apt-cache depends --recurse` lists virtual packages as
        // `<name>`.
        let closure = output_of(
            Command::new("apt-cache")
                .args(&opts)
                .args(["depends", "--recurse", "--no-recommends", "--no-suggests"])
                .args([
                    "--no-conflicts",
                    "--no-breaks",
                    "--no-replaces",
                    "--no-enhances",
                ])
                .args(pkgs),
        );
        let mut names: Vec<String> = closure
            .lines()
            .filter(|l| !l.starts_with(' ') && !l.starts_with('<') && !l.is_empty())
            .filter(|l| !ARM64_LEFT_OUT.iter().any(|x| l.starts_with(x)))
            .map(str::to_string)
            .collect();
        names.sort();
        names.dedup();
        if !names.iter().any(|p| p == must) {
            bail!("no {must} among Debian {suite}'s arm64 dependencies of {pkgs:?}: {names:?}");
        }
        let tree = root.join(sub);
        std::fs::create_dir_all(&tree)?;
        fetch_unpack(&opts, &names, &apt.join("debs"), &tree)?;
        // Merged /usr (Debian 13's packages ship under /usr only; base-files makes the links).
        for d in ["bin", "lib", "sbin"] {
            if !tree.join(d).exists() && tree.join("usr").join(d).exists() {
                std::os::unix::fs::symlink(format!("usr/{d}"), tree.join(d))?;
            }
        }
        for d in ["proc", "sys", "dev", "tmp", "run"] {
            std::fs::create_dir_all(tree.join(d))?;
        }
    }
    // What the guest's /init and script need in the root: busybox's applets.
    for applet in ARM64_APPLETS {
        let link = root.join("bin").join(applet);
        if !link.exists() {
            std::os::unix::fs::symlink("busybox", &link)?;
        }
    }
    let busybox = std::fs::read(root.join("bin/busybox")).context("arm64 busybox-static")?;
    for (label, suite) in ARM64_KERNELS {
        let (apt, opts) = arm64_apt(tools, suite)?;
        let image = depends(&opts, "linux-image-arm64")
            .into_iter()
            .find(|p| p.starts_with("linux-image-"))
            .with_context(|| format!("no linux-image-arm64 in Debian {suite}"))?;
        let unpacked = apt.join("unpacked-kernel");
        let _ = std::fs::remove_dir_all(&unpacked);
        fetch_unpack(&opts, &[image], &apt.join("debs-kernel"), &unpacked)?;
        let kdir = dir.join(label);
        std::fs::create_dir_all(&kdir)?;
        build_guest(&unpacked, &kdir, &busybox)
            .with_context(|| format!("the arm64 kernel {label}"))?;
        std::fs::remove_dir_all(&unpacked)?;
    }
    std::fs::write(dir.join(".complete"), "")?;
    Ok(())
}

/// A private arm64 package list of Debian `suite` under `.tools/arm64-apt-SUITE`, brought up to
/// date: its directory and the apt options that use it.
fn arm64_apt(tools: &Path, suite: &str) -> Result<(std::path::PathBuf, Vec<String>)> {
    let apt = tools.join(format!("arm64-apt-{suite}"));
    for d in ["lists/partial", "cache/archives/partial"] {
        std::fs::create_dir_all(apt.join(d))?;
    }
    std::fs::write(
        apt.join("sources.list"),
        format!("deb {MIRROR} {suite} main\n"),
    )?;
    std::fs::write(apt.join("status"), "")?;
    let mut opts = private_apt_opts(&apt);
    opts.extend(
        ["APT::Architecture=arm64", "APT::Architectures::=arm64"]
            .iter()
            .flat_map(|o| ["-o".to_string(), o.to_string()]),
    );
    run(Command::new("apt-get").args(&opts).args(["update", "-q"]))?;
    Ok((apt, opts))
}
