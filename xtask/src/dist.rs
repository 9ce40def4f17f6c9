//! `cargo xtask dist`: the release artifacts, for x86_64 and aarch64, in `target/dist/`:
//!
//! - `tachyon-bpf-VERSION-ARCH-linux.tar.gz`: the binary, its man page, shell completions, the
//!   systemd unit with its options file, the licences, the README and the user's guide (docs/*.md);
//! - `tachyon-bpf_VERSION-1_DEBARCH.deb`: the same files where Debian puts them (cargo-deb);
//! - `tachyon_bpf-VERSION-py3-none-manylinux_2_17_ARCH.manylinux2014_ARCH.whl`: the binary as a
//!   script of a wheel, for `pip install` / `pipx install` (the wheel carries no Python code);
//! - `tachyon-bpf-VERSION-ARCH-linux.debug`: the binary's debug information, found by its build
//!   id (and debuglink) to symbolize a crash report of the stripped binary;
//! - `SHA256SUMS`.
//!
//! The binary is built once per architecture by cargo-zigbuild for `ARCH-unknown-linux-gnu.2.17`:
//! zig links it against glibc 2.17's symbol versions (manylinux2014, as Debian 8, RHEL 7 and
//! Amazon Linux 2 have), so one binary starts on every glibc-based distribution of the last ten
//! years, with the host's stable toolchain for x86_64 and Debian's rustc-web (`-Z build-std`) for
//! aarch64, as `cross.rs` builds it. Every artifact carries that same stripped binary, whose build
//! id is the debug file's. The wheel is therefore packed from the built files by the `wheel`
//! tool (PyPI) rather than by maturin, which would build and strip a second binary of its own.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use super::{output_of, run, workspace, BPF_CARGO, BPF_RUSTC};

/// The architectures released.
pub const ARCHES: [&str; 2] = ["x86_64", "aarch64"];
/// The glibc whose symbol versions the binaries may use at most (manylinux2014).
pub const GLIBC: &str = "2.17";
/// Tools, pinned: zig (the linker, from PyPI's `ziglang`) and `wheel` in `.tools/dist/venv`,
/// cargo-zigbuild and cargo-deb from crates.io.
const PYPI: &str = "ziglang==0.17.1\nwheel==0.48.0\n";
const ZIGBUILD: &str = "0.24.1";
const CARGO_DEB: &str = "3.8.0";

pub fn version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}

/// Debian's name of an architecture.
pub fn deb_arch(arch: &str) -> &'static str {
    if arch == "aarch64" {
        "arm64"
    } else {
        "amd64"
    }
}

/// Where the artifacts go.
pub fn dist_dir() -> PathBuf {
    workspace().join("target/dist")
}

/// The cargo target directory of the release builds (kept apart from `target/`'s own builds,
/// which link with the host's C library).
fn build_dir() -> PathBuf {
    workspace().join("target/dist-build")
}

/// The artifacts of one architecture, by file name.
pub struct Artifacts {
    /// The stripped binary every artifact carries.
    pub binary: PathBuf,
    pub tarball: PathBuf,
    pub deb: PathBuf,
    pub wheel: PathBuf,
    pub debug: PathBuf,
}

/// The dist tools, installed if missing (idempotent): returns the venv's `bin` directory.
fn setup(tools: &Path) -> Result<PathBuf> {
    let venv = super::pypi::pinned_venv(
        &tools.join("dist"),
        PYPI,
        &["-m", "ziglang", "version"],
        "ziglang and wheel",
    )?;
    for (krate, version) in [("cargo-zigbuild", ZIGBUILD), ("cargo-deb", CARGO_DEB)] {
        if !output_of(Command::new(krate).arg("--version")).contains(version) {
            eprintln!("xtask: installing {krate} {version}");
            run(Command::new("cargo").args(["install", "--locked", krate, "--version", version]))?;
        }
    }
    Ok(venv.join("bin"))
}

/// `cargo zigbuild` of the profiler for `arch` against glibc 2.17; the unstripped binary.
fn build(arch: &str, venv_bin: &Path) -> Result<PathBuf> {
    let triple = format!("{arch}-unknown-linux-gnu");
    let path = format!(
        "{}:{}",
        venv_bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut cmd = if arch == std::env::consts::ARCH {
        let mut c = Command::new("cargo");
        c.arg("zigbuild");
        c
    } else {
        // No aarch64 standard library comes with rustup's toolchains here: Debian's compiler
        // builds it (as in `cross.rs`).
        let mut c = Command::new(BPF_CARGO);
        for (k, _) in std::env::vars_os() {
            let k = k.to_string_lossy().into_owned();
            if (k.starts_with("CARGO") && k != "CARGO_HOME")
                || k.starts_with("RUSTUP")
                || k.starts_with("RUSTC")
                || k == "RUSTFLAGS"
            {
                c.env_remove(&k);
            }
        }
        c.env("RUSTC", BPF_RUSTC)
            .env("RUSTC_BOOTSTRAP", "1")
            .env("CARGO", BPF_CARGO)
            .args(["zigbuild", "-Z", "build-std=std,panic_abort"]);
        c
    };
    let upper = triple.to_uppercase().replace('-', "_");
    cmd.current_dir(workspace())
        .env("PATH", path)
        // A build id, which the separate debug file is found by.
        .env(
            format!("CARGO_TARGET_{upper}_RUSTFLAGS"),
            "-C link-arg=-Wl,--build-id=sha1",
        )
        .args(["--release", "-p", "tachyon-bpf", "--target"])
        .arg(format!("{triple}.{GLIBC}"))
        .arg("--target-dir")
        .arg(build_dir());
    run(&mut cmd)?;
    Ok(build_dir().join(&triple).join("release/tachyon-bpf"))
}

fn llvm(tool: &str) -> String {
    format!("/usr/lib/llvm-22/bin/llvm-{tool}")
}

/// Every artifact for every architecture, in `target/dist/` (which is made anew).
pub fn dist(tools: &Path) -> Result<Vec<(String, Artifacts)>> {
    let venv_bin = setup(tools)?;
    let out = dist_dir();
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out)?;
    let built: Vec<(String, PathBuf)> = ARCHES
        .iter()
        .map(|a| build(a, &venv_bin).map(|b| (a.to_string(), b)))
        .collect::<Result<_>>()?;
    let host = &built
        .iter()
        .find(|(a, _)| a == std::env::consts::ARCH)
        .context("no build for this machine's architecture")?
        .1;
    // The man page and completions are the same for every architecture: written by the binary
    // that runs here, from its command line's definition.
    let generated = |what: &str| -> Result<Vec<u8>> {
        let o = Command::new(host).args(["--generate", what]).output()?;
        if !o.status.success() || o.stdout.is_empty() {
            bail!(
                "tachyon-bpf --generate {what} failed: {}",
                String::from_utf8_lossy(&o.stderr)
            );
        }
        Ok(o.stdout)
    };
    let man = generated("man")?;
    let completions = [
        ("bash", "tachyon-bpf.bash"),
        ("zsh", "_tachyon-bpf"),
        ("fish", "tachyon-bpf.fish"),
    ]
    .iter()
    .map(|(shell, file)| generated(shell).map(|text| (*file, text)))
    .collect::<Result<Vec<_>>>()?;
    let epoch =
        output_of(
            Command::new("git")
                .current_dir(workspace())
                .args(["log", "-1", "--format=%ct"]),
        )
        .trim()
        .to_string();
    let epoch = if epoch.is_empty() { "0".into() } else { epoch };
    let mut all = Vec::new();
    for (arch, bin) in &built {
        let v = version();
        let name = format!("tachyon-bpf-{v}-{arch}-linux");
        // The staging directory cargo-deb takes its assets from (`target/release/dist/...` in
        // the package's metadata, which cargo-deb maps to the target's directory).
        let stage = bin.parent().unwrap().join("dist");
        let _ = std::fs::remove_dir_all(&stage);
        std::fs::create_dir_all(stage.join("completions"))?;
        let debug = out.join(format!("{name}.debug"));
        let stripped = stage.join("tachyon-bpf");
        run(Command::new(llvm("objcopy"))
            .arg("--only-keep-debug")
            .arg(bin)
            .arg(&debug))?;
        // Data, not a program (objcopy keeps the binary's mode).
        std::fs::set_permissions(&debug, std::os::unix::fs::PermissionsExt::from_mode(0o644))?;
        run(Command::new(llvm("objcopy"))
            .arg("--strip-all")
            .arg(format!("--add-gnu-debuglink={}", debug.display()))
            .arg(bin)
            .arg(&stripped))?;
        std::fs::write(stage.join("tachyon-bpf.1"), &man)?;
        run(Command::new("gzip")
            .args(["-9", "-n", "-f", "-k"])
            .arg(stage.join("tachyon-bpf.1")))?;
        for (file, text) in &completions {
            std::fs::write(stage.join("completions").join(file), text)?;
        }
        let tarball = tarball(&out, &name, &stage, &epoch)?;
        let deb = deb(&out, arch, &epoch)?;
        let wheel = wheel(&out, arch, &stage, &venv_bin)?;
        all.push((
            arch.clone(),
            Artifacts {
                binary: stripped,
                tarball,
                deb,
                wheel,
                debug,
            },
        ));
    }
    let mut names: Vec<String> = std::fs::read_dir(&out)?
        .flatten()
        .filter(|e| e.path().is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let sums = Command::new("sha256sum")
        .current_dir(&out)
        .args(&names)
        .output()?;
    if !sums.status.success() {
        bail!("sha256sum failed");
    }
    std::fs::write(out.join("SHA256SUMS"), sums.stdout)?;
    Ok(all)
}

/// `NAME.tar.gz`: one directory `NAME/` holding the binary and its files, reproducible (sorted,
/// owned by root, dated at the last commit).
fn tarball(out: &Path, name: &str, stage: &Path, epoch: &str) -> Result<PathBuf> {
    let top = out.join(format!(".{name}"));
    let dir = top.join(name);
    let _ = std::fs::remove_dir_all(&top);
    for d in ["completions", "systemd", "docs"] {
        std::fs::create_dir_all(dir.join(d))?;
    }
    let ws = workspace();
    let copies = [
        (stage.join("tachyon-bpf"), dir.join("tachyon-bpf")),
        (stage.join("tachyon-bpf.1"), dir.join("tachyon-bpf.1")),
        (
            ws.join("contrib/systemd/tachyon-bpf.service"),
            dir.join("systemd/tachyon-bpf.service"),
        ),
        (
            ws.join("contrib/systemd/tachyon-bpf.default"),
            dir.join("systemd/tachyon-bpf.default"),
        ),
        (ws.join("LICENSE-MIT"), dir.join("LICENSE-MIT")),
        (ws.join("LICENSE-APACHE"), dir.join("LICENSE-APACHE")),
        (ws.join("README.md"), dir.join("README.md")),
    ];
    for (from, to) in copies {
        std::fs::copy(&from, &to).with_context(|| format!("copying {}", from.display()))?;
    }
    for e in std::fs::read_dir(stage.join("completions"))? {
        let e = e?;
        std::fs::copy(e.path(), dir.join("completions").join(e.file_name()))?;
    }
    // The user's guide (the pages of docs/ itself; internals/ and dev/ are for the source).
    for e in std::fs::read_dir(ws.join("docs"))? {
        let e = e?;
        if e.path().extension().is_some_and(|x| x == "md") {
            std::fs::copy(e.path(), dir.join("docs").join(e.file_name()))?;
        }
    }
    let tarball = out.join(format!("{name}.tar.gz"));
    run(Command::new("tar")
        .current_dir(&top)
        .args(["--sort=name", "--owner=0", "--group=0", "--numeric-owner"])
        .arg(format!("--mtime=@{epoch}"))
        .args(["-c", "-z", "-f"])
        .arg(&tarball)
        .arg(name))?;
    std::fs::remove_dir_all(&top)?;
    Ok(tarball)
}

/// The Debian package, by cargo-deb from the staged files (`[package.metadata.deb]`).
fn deb(out: &Path, arch: &str, epoch: &str) -> Result<PathBuf> {
    let deb = out.join(format!(
        "tachyon-bpf_{}-1_{}.deb",
        version(),
        deb_arch(arch)
    ));
    run(Command::new("cargo")
        .current_dir(workspace())
        .env("SOURCE_DATE_EPOCH", epoch)
        .args(["deb", "-p", "tachyon-bpf", "--no-build", "--no-strip"])
        .args(["--target", &format!("{arch}-unknown-linux-gnu")])
        .env("CARGO_TARGET_DIR", build_dir())
        .arg("--output")
        .arg(&deb))?;
    Ok(deb)
}

/// The wheel: the binary as the script `tachyon-bpf` (pip puts it in the environment's `bin`),
/// the man page under the environment's `share/man`, the licences in its metadata, tagged
/// manylinux2014 for `arch`. Packed by `wheel pack`, which writes RECORD and names the file.
fn wheel(out: &Path, arch: &str, stage: &Path, venv_bin: &Path) -> Result<PathBuf> {
    let v = version();
    let root = out.join(format!(".wheel-{arch}"));
    let _ = std::fs::remove_dir_all(&root);
    let data = root.join(format!("tachyon_bpf-{v}.data"));
    let info = root.join(format!("tachyon_bpf-{v}.dist-info"));
    for d in [
        data.join("scripts"),
        data.join("data/share/man/man1"),
        info.join("licenses"),
    ] {
        std::fs::create_dir_all(d)?;
    }
    std::fs::copy(stage.join("tachyon-bpf"), data.join("scripts/tachyon-bpf"))?;
    std::fs::copy(
        stage.join("tachyon-bpf.1"),
        data.join("data/share/man/man1/tachyon-bpf.1"),
    )?;
    let ws = workspace();
    for l in ["LICENSE-MIT", "LICENSE-APACHE"] {
        std::fs::copy(ws.join(l), info.join("licenses").join(l))?;
    }
    let readme = std::fs::read_to_string(ws.join("README.md"))?;
    std::fs::write(
        info.join("METADATA"),
        format!(
            "Metadata-Version: 2.4\n\
             Name: tachyon-bpf\n\
             Version: {v}\n\
             Summary: System-wide eBPF sampling profiler for Python: Python, native and kernel \
             frames with GIL and CPU state\n\
             License-Expression: MIT OR Apache-2.0\n\
             License-File: LICENSE-MIT\n\
             License-File: LICENSE-APACHE\n\
             Keywords: profiler,ebpf,python,sampling,flamegraph\n\
             Classifier: Environment :: Console\n\
             Classifier: Operating System :: POSIX :: Linux\n\
             Classifier: Topic :: Software Development :: Debuggers\n\
             Description-Content-Type: text/markdown\n\
             \n{readme}"
        ),
    )?;
    std::fs::write(
        info.join("WHEEL"),
        format!(
            "Wheel-Version: 1.0\n\
             Generator: tachyon-bpf xtask dist\n\
             Root-Is-Purelib: false\n\
             Tag: py3-none-manylinux_2_17_{arch}\n\
             Tag: py3-none-manylinux2014_{arch}\n"
        ),
    )?;
    let before: Vec<PathBuf> = wheels(out);
    run(Command::new(venv_bin.join("python"))
        .args(["-m", "wheel", "pack"])
        .arg(&root)
        .arg("--dest-dir")
        .arg(out))?;
    std::fs::remove_dir_all(&root)?;
    let made: Vec<PathBuf> = wheels(out)
        .into_iter()
        .filter(|w| !before.contains(w))
        .collect();
    match made.as_slice() {
        [w] => Ok(w.clone()),
        _ => bail!("wheel pack for {arch} made {made:?}"),
    }
}

fn wheels(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "whl"))
                .collect()
        })
        .unwrap_or_default()
}
