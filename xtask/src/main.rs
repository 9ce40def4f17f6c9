//! Developer tasks: `cargo xtask setup | build-ebpf | build [--arch aarch64] | dist | run -- ARGS | test | kernels [--arch aarch64] | bench`.
//!
//! Every task first runs `setup`, which is idempotent and fast when nothing is missing: Debian's
//! BPF-capable Rust toolchain, bpf-linker, and the Firefox Profiler CLI (with Node 24) that the
//! tests read profiles back with.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

include!("ebpf_build.rs");

mod bench;
mod cross;
mod dist;
mod kernels;
mod pypi;
mod pythons;
mod releases;
mod soak;

// golang-go: `go tool pprof`, the consumer the pprof tests read profiles back with.
// patchelf: Debian's python3.14/3.15 run from `.tools` with their own C library (pythons.rs).
// qemu-system-x86, kmod (depmod): the kernel matrix (kernels.rs); qemu-system-arm: its arm64
// guest.
// libc6-dbg: the C library's separate debug file, which names its internal functions in
// stacks (a test checks that they are named).
const APT_PACKAGES: [&str; 10] = [
    "rustc-web",
    "cargo-web",
    "rust-web-src",
    "llvm-22-dev",
    "golang-go",
    "patchelf",
    "qemu-system-x86",
    "qemu-system-arm",
    "kmod",
    "libc6-dbg",
];
const BPF_LINKER_VERSION: &str = "0.13.0";
const NODE_PACKAGES: [&str; 2] = ["node@24", "@firefox-devtools/profiler-cli@0.10.0"];

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd.status().with_context(|| format!("running {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed with {status}");
    }
    Ok(())
}

/// apt-get options for a package list of our own under `apt` (sources.list, lists, cache and
/// an empty status there), so the system's apt state is never touched.
fn private_apt_opts(apt: &Path) -> Vec<String> {
    [
        ("Dir::Etc::sourcelist", apt.join("sources.list")),
        ("Dir::Etc::sourceparts", PathBuf::from("-")),
        ("Dir::State::Lists", apt.join("lists")),
        ("Dir::Cache", apt.join("cache")),
        ("Dir::State::status", apt.join("status")),
    ]
    .iter()
    .flat_map(|(k, v)| ["-o".to_string(), format!("{k}={}", v.display())])
    .collect()
}

fn quiet_ok(cmd: &mut Command) -> bool {
    cmd.output().map(|o| o.status.success()).unwrap_or(false)
}

fn output_of(cmd: &mut Command) -> String {
    cmd.output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

/// Installs those of Debian's `packages` that are missing (the system's apt).
fn apt_install(packages: &[&str]) -> Result<()> {
    let missing: Vec<&str> = packages
        .iter()
        .copied()
        .filter(|p| !quiet_ok(Command::new("dpkg").args(["-s", p])))
        .collect();
    if !missing.is_empty() {
        eprintln!("xtask: installing {}", missing.join(" "));
        run(Command::new("apt-get").args(["update", "-q"]))?;
        run(Command::new("apt-get")
            .env("DEBIAN_FRONTEND", "noninteractive")
            .args(["install", "-y", "-q", "--no-install-recommends"])
            .args(&missing))?;
    }
    Ok(())
}

fn setup_toolchain() -> Result<()> {
    apt_install(&APT_PACKAGES)?;
    let vv = output_of(Command::new(BPF_RUSTC).arg("-vV"));
    if !vv.contains("LLVM version: 22.") {
        bail!("{BPF_RUSTC} is not the LLVM 22 rustc-web the BPF build needs:\n{vv}");
    }
    let linker = output_of(Command::new("bpf-linker").arg("--version"));
    if !linker.contains(BPF_LINKER_VERSION) {
        eprintln!("xtask: installing bpf-linker {BPF_LINKER_VERSION} (about 2 minutes)");
        run(Command::new("cargo")
            .env("LLVM_PREFIX", "/usr/lib/llvm-22")
            .args([
                "install",
                "--locked",
                "bpf-linker",
                "--version",
                BPF_LINKER_VERSION,
            ])
            .args(["--no-default-features", "--features", "llvm-22"]))?;
    }
    Ok(())
}

/// The Firefox Profiler CLI and Node 24, and Debian's newest interpreters, under `.tools/`.
fn setup_tools() -> Result<PathBuf> {
    let tools = workspace().join(".tools");
    let cli = tools.join("node_modules/.bin/profiler-cli");
    let node = tools.join("node_modules/node/bin/node");
    let node_ok = output_of(Command::new(&node).arg("--version")).starts_with("v24");
    if !cli.exists() || !node_ok {
        std::fs::create_dir_all(&tools)?;
        eprintln!("xtask: installing {} into .tools", NODE_PACKAGES.join(" "));
        run(Command::new("npm")
            .current_dir(&tools)
            .args(["install", "--no-save", "--no-audit", "--no-fund"])
            .args(NODE_PACKAGES))?;
    }
    pythons::setup(&tools)?;
    let venv = pypi::setup(&tools)?;
    pypi::uvloop(&tools, &venv)?;
    pypi::otlp(&tools)?;
    kernels::setup(&tools)?;
    kernels::setup_arm64(&tools)?;
    kernels::setup_rw_initrds(&tools)?;
    releases::setup(&tools)?;
    Ok(tools)
}

fn build_ebpf(arch: &str) -> Result<()> {
    run(&mut ebpf_build_command(&workspace(), arch))
}

fn build_release() -> Result<PathBuf> {
    run(Command::new("cargo").current_dir(workspace()).args([
        "build",
        "--release",
        "-p",
        "tachyon-bpf",
    ]))?;
    // Where cargo put it: a CARGO_TARGET_DIR of the caller's is cargo's too (the tests must run
    // what was just built, not an older binary under target/).
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(|d| workspace().join(d))
        .unwrap_or_else(|| workspace().join("target"));
    Ok(target.join("release/tachyon-bpf"))
}

/// The fuzz targets under `fuzz/` (one per decoder of untrusted input).
const FUZZ_TARGETS: [&str; 6] = [
    "records",
    "btf",
    "line_tables",
    "code_objects",
    "debug_offsets",
    "recordings",
];

/// Runs every fuzz target for `secs` seconds with cargo-fuzz (libFuzzer, AddressSanitizer) on
/// the nightly toolchain, installing what is missing; fails on the first crash.
fn fuzz(secs: u64) -> Result<()> {
    let nightly = output_of(Command::new("rustup").args(["toolchain", "list"]));
    if !nightly.contains("nightly") {
        run(Command::new("rustup").args([
            "toolchain",
            "install",
            "nightly",
            "--profile",
            "minimal",
        ]))?;
    }
    if !quiet_ok(Command::new("cargo").args(["fuzz", "--version"])) {
        eprintln!("xtask: installing cargo-fuzz");
        run(Command::new("cargo").args(["install", "--locked", "cargo-fuzz"]))?;
    }
    let dir = workspace().join("fuzz");
    let mut report = Vec::new();
    for t in FUZZ_TARGETS {
        std::fs::create_dir_all(dir.join("corpus").join(t))?;
        let out = Command::new("cargo")
            .current_dir(&dir)
            .args(["+nightly", "fuzz", "run", t, "--"])
            .arg(format!("-max_total_time={secs}"))
            // Recordings are what `convert` takes from anyone: held to a tighter memory bound
            // (a decompressed recording is capped at 512 MiB).
            .arg(if t == "recordings" {
                "-rss_limit_mb=1024"
            } else {
                "-rss_limit_mb=4096"
            })
            .arg("-print_final_stats=1")
            .output()?;
        let log = String::from_utf8_lossy(&out.stderr).into_owned();
        let runs = log
            .lines()
            .find_map(|l| l.strip_prefix("stat::number_of_executed_units:"))
            .map(|n| n.trim().to_string())
            .unwrap_or_else(|| "?".into());
        if !out.status.success() {
            eprintln!("{log}");
            bail!("fuzz target {t} failed (artifacts under fuzz/artifacts/{t})");
        }
        eprintln!("xtask: fuzz {t}: {runs} inputs in {secs} s, no failure");
        report.push(format!("| {t} | {secs} | {runs} |"));
    }
    println!(
        "| target | seconds | inputs |\n|---|---|---|\n{}",
        report.join("\n")
    );
    Ok(())
}

/// `cargo xtask test [FILTER]`: unit tests, the end-to-end tests one at a time, the kernel
/// and distribution matrix, and (unfiltered) the memory soak.
fn test_task(rest: &[String]) -> Result<()> {
    setup_toolchain()?;
    let tools = setup_tools()?;
    let bin = build_release()?;
    // The release artifacts, which the distribution matrix installs; the arm64 guests
    // run the released aarch64 binary.
    let dist = dist::dist(&tools)?;
    let bin_arm64 = &dist
        .iter()
        .find(|(arch, _)| arch == "aarch64")
        .context("no aarch64 artifacts")?
        .1
        .binary;
    // Unit tests of every crate, then the end-to-end tests one at a time: they profile
    // real processes on every CPU, and concurrent runs would disturb each other's counts.
    run(Command::new("cargo").current_dir(workspace()).args([
        "test",
        "--workspace",
        "--exclude",
        "tachyon-bpf-tests",
    ]))?;
    let e2e = || {
        let mut cmd = Command::new("cargo");
        cmd.current_dir(workspace())
            .env("TACHYON_BPF_BIN", &bin)
            .env("TACHYON_BPF_BIN_AARCH64", bin_arm64)
            .env("TACHYON_DIST", dist::dist_dir())
            .env("TACHYON_TOOLS", &tools)
            // Deep call trees (300-frame recursion) are walked recursively.
            .env("RUST_MIN_STACK", "67108864")
            .args(["test", "-p", "tachyon-bpf-tests"]);
        cmd
    };
    run(e2e()
        .arg("--")
        .arg("--test-threads=1")
        .args(["--skip", "fleet_kernels", "--skip", "arm64_guest"])
        .args(rest))?;
    // The kernel and distribution matrix last: its x86_64 and arm64 guests at once, each
    // an emulator on one core of its own (their checks are of what happened inside each
    // guest, not of this machine's timing).
    run(e2e()
        .args(["--test", "kernels", "--", "--test-threads=2"])
        .args(rest))?;
    // The whole suite ends with the 5-minute memory soak (a filtered run skips it;
    // `cargo xtask soak` runs longer ones).
    if rest.is_empty() {
        soak::soak(&bin, 300)?;
    }

    Ok(())
}

/// `cargo xtask dist`: the release artifacts (dist.rs) for every architecture, in target/dist.
fn dist_task() -> Result<()> {
    // The release artifacts (dist.rs) for every architecture, in target/dist.
    // Only the build's tools: the test tools are not needed to make a release.
    setup_toolchain()?;
    for (arch, a) in dist::dist(&workspace().join(".tools"))? {
        for f in [&a.tarball, &a.deb, &a.wheel, &a.debug] {
            let size = std::fs::metadata(f)?.len();
            eprintln!(
                "xtask: {arch}: {} ({:.1} MB)",
                f.display(),
                size as f64 / 1e6
            );
        }
    }
    eprintln!("xtask: {}", dist::dist_dir().join("SHA256SUMS").display());

    Ok(())
}

/// `cargo xtask kernels [--arch aarch64]`: the kernel matrix alone (it is also part of `test`).
fn kernels_task(rest: &[String]) -> Result<()> {
    // The kernel matrix alone (it is also part of `test`): the x86_64 kernels, or with
    // `--arch aarch64` the arm64 guest.
    setup_toolchain()?;
    let tools = setup_tools()?;
    let arch = cross::arch_arg(rest)?;
    let mut cmd = Command::new("cargo");
    // The release guests install the packages of `dist`.
    let dist = dist::dist(&tools)?;
    cmd.current_dir(workspace())
        .env("TACHYON_TOOLS", &tools)
        .env("TACHYON_DIST", dist::dist_dir());
    let (_, released) = dist
        .iter()
        .find(|(a, _)| *a == arch)
        .context("no artifacts")?;
    let filter = if arch == std::env::consts::ARCH {
        cmd.env("TACHYON_BPF_BIN", &released.binary);
        "fleet_kernels"
    } else {
        cmd.env("TACHYON_BPF_BIN_AARCH64", &released.binary);
        "arm64_guest"
    };
    run(cmd
        .args(["test", "-p", "tachyon-bpf-tests", "--test", "kernels", "--"])
        .args(["--test-threads=1", "--nocapture", filter]))?;

    Ok(())
}

/// `cargo xtask bench [SECTION]`: every section, written to bench/results.md, or one printed.
fn bench_task(rest: &[String]) -> Result<()> {
    setup_toolchain()?;
    let tools = setup_tools()?;
    let bin = build_release()?;
    let dir = workspace().join("target/bench");
    std::fs::create_dir_all(&dir)?;
    // One section alone (6, 9, 10, 11, 12 or 13) is printed, not written to bench/results.md.
    let md = match rest.first().map(String::as_str) {
        Some("pingpong") => {
            let py = bench::workload_python(&tools)?;
            bench::pingpong(&bin, &py, &bench::setup_py_spy(&tools)?, &dir)?.0
        }
        Some("cpython") => {
            let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
            bench::cpython_sampler(&bin, &tools, &dir, &(cpus - 1).to_string())?.0
        }
        Some("asyncio") => bench::asyncio_tasks(&bin, &tools, &dir)?.0,
        Some("callgrind") => {
            let py = bench::workload_python(&tools)?;
            bench::callgrind(&bin, &tools, &py, &dir)?.0
        }
        Some("service") => bench::service(&bin, &tools, &bench::setup_py_spy(&tools)?, &dir)?.0,
        Some("always-on") => bench::always_on(&bin, &tools, &dir)?.0,
        _ => return bench::bench(&bin, &tools),
    };
    println!("{}", md.join("\n"));

    Ok(())
}

fn main() -> Result<()> {
    // `sudo cargo xtask test` (the README's way): the profilers the tests and benchmarks start
    // are root, not run on a user's behalf. With SUDO_UID they would give their files to that
    // user and run launched commands as them (see `launch::sudo_user`); the tests that check
    // that set it themselves.
    for var in ["SUDO_UID", "SUDO_GID", "SUDO_USER", "SUDO_COMMAND"] {
        std::env::remove_var(var);
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let task = args.first().map(String::as_str).unwrap_or("help");
    let rest = if args.len() > 1 { &args[1..] } else { &[] };
    match task {
        "setup" => {
            setup_toolchain()?;
            setup_tools()?;
        }
        "build-ebpf" => {
            setup_toolchain()?;
            let arch = cross::arch_arg(rest)?;
            build_ebpf(&arch)?;
            eprintln!("xtask: {}", workspace().join(bpf_object(&arch)).display());
        }
        "build" => {
            setup_toolchain()?;
            let arch = cross::arch_arg(rest)?;
            let bin = if arch == std::env::consts::ARCH {
                build_release()?
            } else {
                cross::build(&arch)?
            };
            eprintln!("xtask: {}", bin.display());
        }
        "run" => {
            setup_toolchain()?;
            let bin = build_release()?;
            let rest: Vec<&String> = rest.iter().skip_while(|a| *a == "--").collect();
            let status = Command::new(bin).args(rest).status()?;
            std::process::exit(status.code().unwrap_or(1));
        }
        "test" => test_task(rest)?,
        "dist" => dist_task()?,
        "kernels" => kernels_task(rest)?,
        "soak" => {
            setup_toolchain()?;
            let bin = build_release()?;
            let secs: u64 = rest.first().and_then(|s| s.parse().ok()).unwrap_or(600);
            soak::soak(&bin, secs)?;
        }
        "fuzz" => {
            setup_toolchain()?;
            let secs: u64 = rest.first().and_then(|s| s.parse().ok()).unwrap_or(60);
            fuzz(secs)?;
        }
        "bench" => bench_task(rest)?,
        _ => {
            eprintln!(
                "usage: cargo xtask <setup | build-ebpf [--arch aarch64] | build [--arch aarch64] | dist | run -- ARGS | test [FILTER] | kernels [--arch aarch64] | bench [pingpong | cpython | asyncio | callgrind | service | always-on] | fuzz [SECONDS] | soak [SECONDS]>"
            );
            std::process::exit(2);
        }
    }
    Ok(())
}
