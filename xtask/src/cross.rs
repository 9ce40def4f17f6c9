//! `cargo xtask build --arch aarch64`: the whole profiler for arm64 hosts, cross-built here.
//!
//! rustup's toolchains here have no aarch64 standard library and no `rust-src`, so the user space
//! is built with Debian's rustc-web (the compiler that builds the BPF object), whose
//! `rust-web-src` lets cargo build `std` for the target (`-Z build-std`); bookworm's
//! `gcc-aarch64-linux-gnu` links it and compiles the C that some crates carry. The BPF object is
//! built for the target's register layout by the user space's build script.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{bail, Result};

use super::{apt_install, run, workspace, BPF_CARGO, BPF_RUSTC};

/// Architectures `--arch` takes besides the host's.
pub const ARCHES: [&str; 1] = ["aarch64"];

/// Debian packages the cross build needs.
const APT_PACKAGES: [&str; 2] = ["gcc-aarch64-linux-gnu", "libc6-dev-arm64-cross"];

/// `--arch ARCH` from a task's arguments: the host's architecture without it.
pub fn arch_arg(args: &[String]) -> Result<String> {
    let host = std::env::consts::ARCH;
    match args.iter().position(|a| a == "--arch") {
        None => Ok(host.into()),
        Some(i) => match args.get(i + 1).map(String::as_str) {
            Some(a) if a == host || ARCHES.contains(&a) => Ok(a.into()),
            Some(a) => bail!(
                "--arch {a}: this build knows {host} and {}",
                ARCHES.join(", ")
            ),
            None => bail!("--arch needs an architecture: {}", ARCHES.join(", ")),
        },
    }
}

/// Builds `target/ARCH-unknown-linux-gnu/release/tachyon-bpf` and returns its path.
pub fn build(arch: &str) -> Result<PathBuf> {
    run(&mut cargo(arch, &["build", "--release"])?)?;
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(|d| workspace().join(d))
        .unwrap_or_else(|| workspace().join("target"));
    Ok(target
        .join(format!("{arch}-unknown-linux-gnu"))
        .join("release/tachyon-bpf"))
}

/// `cargo SUBCOMMAND` of the user space for `arch` with Debian's toolchain.
fn cargo(arch: &str, subcommand: &[&str]) -> Result<Command> {
    apt_install(&APT_PACKAGES)?;
    let triple = format!("{arch}-unknown-linux-gnu");
    let upper = triple.to_uppercase().replace('-', "_");
    let lower = triple.replace('-', "_");
    let gcc = format!("{arch}-linux-gnu-gcc");
    let mut cmd = Command::new(BPF_CARGO);
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy().into_owned();
        if (k.starts_with("CARGO") && k != "CARGO_HOME" && k != "CARGO_TARGET_DIR")
            || k.starts_with("RUSTUP")
            || k.starts_with("RUSTC")
            || k == "RUSTFLAGS"
        {
            cmd.env_remove(&k);
        }
    }
    cmd.current_dir(workspace())
        .env("RUSTC", BPF_RUSTC)
        .env("RUSTC_BOOTSTRAP", "1")
        .env(format!("CARGO_TARGET_{upper}_LINKER"), &gcc)
        .env(format!("CC_{lower}"), &gcc)
        .env(format!("AR_{lower}"), format!("{arch}-linux-gnu-ar"))
        .args(subcommand)
        .args(["-p", "tachyon-bpf", "--target", &triple])
        .args(["-Z", "build-std=std,panic_abort"]);
    Ok(cmd)
}
