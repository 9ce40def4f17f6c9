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
}
