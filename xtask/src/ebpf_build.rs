// The one definition of how the BPF object is built, shared by `cargo xtask build-ebpf` and by
// profiler-userspace's build script (which `include!`s this file). See README "Toolchain".

/// Debian's compiler that can build `core` for bpfel-unknown-none (rustup's toolchains here
/// lack rust-src).
pub const BPF_RUSTC: &str = "/usr/bin/rustc";
pub const BPF_CARGO: &str = "/usr/bin/cargo";

/// Where the object lands, relative to the workspace root.
pub const BPF_OBJECT: &str = "target/ebpf/bpfel-unknown-none/release/profiler-ebpf";

/// `cargo build` of profiler-ebpf with Debian's toolchain, with the environment of any
/// enclosing cargo invocation removed.
pub fn ebpf_build_command(workspace: &std::path::Path) -> std::process::Command {
    let mut cmd = std::process::Command::new(BPF_CARGO);
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy().into_owned();
        let inherited = (k.starts_with("CARGO") && k != "CARGO_HOME")
            || k.starts_with("RUSTC")
            || k.starts_with("RUSTUP")
            || k.starts_with("RUSTDOC")
            || k.starts_with("DEP_")
            || matches!(
                k.as_str(),
                "RUSTFLAGS" | "TARGET" | "HOST" | "OPT_LEVEL" | "PROFILE" | "DEBUG" | "NUM_JOBS" | "OUT_DIR"
            );
        if inherited {
            cmd.env_remove(&k);
        }
    }
    cmd.current_dir(workspace.join("profiler-ebpf"))
        .env("RUSTC", BPF_RUSTC)
        .env("RUSTC_BOOTSTRAP", "1")
        .args([
            "build",
            "--release",
            "--target",
            "bpfel-unknown-none",
            "-Z",
            "build-std=core",
            "--target-dir",
        ])
        .arg(workspace.join("target/ebpf"));
    cmd
}
