// The one definition of how the BPF object is built, shared by `cargo xtask build-ebpf` and by
// profiler-userspace's build script (which `include!`s this file). See docs/dev/building.md, "Toolchain".

/// Debian's compiler that can build `core` for bpfel-unknown-none (rustup's toolchains here
/// lack rust-src).
pub const BPF_RUSTC: &str = "/usr/bin/rustc";
pub const BPF_CARGO: &str = "/usr/bin/cargo";

/// The BPF target directory for an architecture the user space runs on (`x86_64`, `aarch64`):
/// the object reads that architecture's saved user registers.
pub fn bpf_target_dir(arch: &str) -> String {
    if arch == "x86_64" {
        "target/ebpf".into()
    } else {
        format!("target/ebpf-{arch}")
    }
}

/// Where the object for `arch` lands, relative to the workspace root.
pub fn bpf_object(arch: &str) -> String {
    format!("{}/bpfel-unknown-none/release/profiler-ebpf", bpf_target_dir(arch))
}

/// `cargo build` of profiler-ebpf for user space on `arch` with Debian's toolchain, with the
/// environment of any enclosing cargo invocation removed.
pub fn ebpf_build_command(workspace: &std::path::Path, arch: &str) -> std::process::Command {
    let mut cmd = std::process::Command::new(BPF_CARGO);
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy().into_owned();
        let inherited = (k.starts_with("CARGO") && k != "CARGO_HOME")
            || k.starts_with("RUSTC")
            || k.starts_with("RUSTUP")
            || k.starts_with("RUSTDOC")
            || k.starts_with("DEP_")
            || k.starts_with("AYA_")
            || matches!(
                k.as_str(),
                "RUSTFLAGS" | "TARGET" | "HOST" | "OPT_LEVEL" | "PROFILE" | "DEBUG" | "NUM_JOBS" | "OUT_DIR"
            );
        if inherited {
            cmd.env_remove(&k);
        }
    }
    // The architecture's register layout, for aya's bindings and this crate alike (the
    // config's own rustflags are repeated: the variable replaces them).
    cmd.current_dir(workspace.join("profiler-ebpf"))
        .env("RUSTC", BPF_RUSTC)
        .env("RUSTC_BOOTSTRAP", "1")
        .env(
            "CARGO_ENCODED_RUSTFLAGS",
            ["-C", "link-arg=--btf", "--cfg", &format!("bpf_target_arch=\"{arch}\"")].join("\x1f"),
        )
        .args([
            "build",
            "--release",
            "--target",
            "bpfel-unknown-none",
            "-Z",
            "build-std=core",
            "--target-dir",
        ])
        .arg(workspace.join(bpf_target_dir(arch)));
    cmd
}
