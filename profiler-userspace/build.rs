//! Builds the BPF program with Debian's toolchain and hands its path to the crate, so a plain
//! `cargo build` always embeds a BPF object built from the current sources.

use std::path::PathBuf;

include!("../xtask/src/ebpf_build.rs");

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let ws = manifest.parent().unwrap().to_path_buf();
    for p in [
        "profiler-ebpf/src",
        "profiler-ebpf/Cargo.toml",
        "profiler-ebpf/Cargo.lock",
        "profiler-common/src",
        "xtask/src/ebpf_build.rs",
    ] {
        println!("cargo:rerun-if-changed={}", ws.join(p).display());
    }
    if !std::path::Path::new(BPF_RUSTC).exists() {
        panic!(
            "{BPF_RUSTC} is missing: the BPF toolchain is not set up. Run `cargo xtask setup` (or any `cargo xtask` command)."
        );
    }
    // The architecture the user space is built for: the object reads its register layout.
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap();
    let out = ebpf_build_command(&ws, &arch)
        .output()
        .expect("running the BPF build");
    if !out.status.success() {
        panic!(
            "building profiler-ebpf failed:\n{}\n(run `cargo xtask setup` if the toolchain is missing)",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    println!(
        "cargo:rustc-env=TACHYON_BPF_OBJECT={}",
        ws.join(bpf_object(&arch)).display()
    );
    // `--version`: the commit and the target it was built from (a build outside a git checkout
    // says `unknown`).
    let commit = std::process::Command::new("git")
        .current_dir(&ws)
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|c| !c.is_empty())
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=TACHYON_BPF_COMMIT={commit}");
    println!(
        "cargo:rustc-env=TACHYON_BPF_TARGET={}",
        std::env::var("TARGET").unwrap_or_default()
    );
    // Built again when the commit changes: HEAD, the branch it names, and packed refs.
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .current_dir(&ws)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    if let Some(dir) = git(&["rev-parse", "--git-dir"]) {
        let dir = PathBuf::from(dir);
        let dir = if dir.is_absolute() { dir } else { ws.join(dir) };
        let common = git(&["rev-parse", "--git-common-dir"])
            .map(PathBuf::from)
            .map(|d| if d.is_absolute() { d } else { ws.join(d) })
            .unwrap_or_else(|| dir.clone());
        println!("cargo:rerun-if-changed={}", dir.join("HEAD").display());
        println!(
            "cargo:rerun-if-changed={}",
            common.join("packed-refs").display()
        );
        if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
            println!("cargo:rerun-if-changed={}", common.join(branch).display());
        }
    }
}
