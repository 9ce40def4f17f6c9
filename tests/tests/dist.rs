//! The release artifacts of `cargo xtask dist` (`TACHYON_DIST`), as their users' tools read them:
//! the binaries' C library versions and debug files (llvm's readers and symbolizer), the
//! checksums (`sha256sum -c`), the Debian package (`dpkg-deb`, `man`, bash, `systemd-analyze`)
//! and the wheels (`pip`, into fresh virtual environments of pyenv's 3.8 and of Debian 11's own
//! python3, whose C library is 2.31). Installing and running them on each release's own
//! userland and kernel is the distribution matrix (`kernels.rs`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use tachyon_bpf_tests::*;

const ARCHES: [&str; 2] = ["x86_64", "aarch64"];
/// manylinux2014.
const GLIBC_MAX: (u32, u32) = (2, 17);
const MAX_BINARY: u64 = 15_000_000;

fn version() -> String {
    let toml = std::fs::read_to_string(workspace().join("Cargo.toml")).unwrap();
    toml.lines()
        .find_map(|l| l.strip_prefix("version = \""))
        .and_then(|v| v.strip_suffix('"'))
        .expect("the workspace's version")
        .to_string()
}

fn ok(cmd: &mut Command) -> Output {
    let o = cmd
        .output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    assert!(
        o.status.success(),
        "{cmd:?} failed ({}): {}{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

fn text(cmd: &mut Command) -> String {
    String::from_utf8_lossy(&ok(cmd).stdout).into_owned()
}

fn llvm(tool: &str) -> Command {
    Command::new(format!("/usr/lib/llvm-22/bin/llvm-{tool}"))
}

fn build_id(file: &Path) -> String {
    let notes = text(llvm("readelf").arg("-n").arg(file));
    notes
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: "))
        .unwrap_or_else(|| panic!("{} has no build id: {notes}", file.display()))
        .trim()
        .to_string()
}

fn sections(file: &Path) -> String {
    text(llvm("readelf").args(["-S", "-W"]).arg(file))
}

/// The tarball of `arch` unpacked into `dir`: its top directory.
fn unpack_tarball(arch: &str, dir: &Path) -> PathBuf {
    let name = format!("tachyon-bpf-{}-{arch}-linux", version());
    let tarball = dist_file(&name, ".tar.gz");
    ok(Command::new("tar")
        .arg("-x")
        .arg("-z")
        .arg("-f")
        .arg(&tarball)
        .arg("-C")
        .arg(dir));
    dir.join(name)
}

#[test]
fn binaries_need_glibc_2_17_at_most_are_stripped_and_their_debug_files_symbolize_them() {
    let dir = scratch("dist_binaries");
    for arch in ARCHES {
        let top = unpack_tarball(arch, &dir);
        let bin = top.join("tachyon-bpf");
        let size = std::fs::metadata(&bin).unwrap().len();
        assert!(
            size <= MAX_BINARY,
            "{arch}: the binary is {size} bytes, over {MAX_BINARY}"
        );
        // Every versioned C library symbol it needs, the newest at most 2.17.
        let dynsyms = text(llvm("objdump").arg("-T").arg(&bin));
        let mut versions: Vec<(u32, u32)> = dynsyms
            .split(|c: char| c.is_whitespace() || c == '(' || c == ')')
            .filter_map(|w| w.strip_prefix("GLIBC_"))
            .filter_map(|v| {
                let mut p = v.split('.').map(|n| n.parse::<u32>().ok());
                Some((p.next()??, p.next().flatten().unwrap_or(0)))
            })
            .collect();
        versions.sort();
        versions.dedup();
        let newest = *versions
            .last()
            .unwrap_or_else(|| panic!("{arch}: no GLIBC_ symbol versions read: {dynsyms}"));
        assert!(
            newest <= GLIBC_MAX,
            "{arch}: needs GLIBC_{}.{} (every version: {versions:?})",
            newest.0,
            newest.1
        );
        // Stripped, with a debuglink and a build id that the debug file shares.
        let secs = sections(&bin);
        assert!(
            !secs.contains(".debug_info") && !secs.contains(".symtab"),
            "{arch}: not stripped: {secs}"
        );
        assert!(secs.contains(".gnu_debuglink"), "{arch}: no debuglink");
        let debug = dist_file(&format!("tachyon-bpf-{}-{arch}-linux", version()), ".debug");
        assert!(
            sections(&debug).contains(".debug_info"),
            "{arch}: {debug:?}"
        );
        let id = build_id(&bin);
        assert_eq!(id, build_id(&debug), "{arch}: build ids");
        // A crash report's address in the stripped binary is named through the debug file,
        // found by build id as debuggers and symbolizers look it up.
        let store = dir.join(format!("debug-{arch}"));
        let by_id = store.join(".build-id").join(&id[..2]);
        std::fs::create_dir_all(&by_id).unwrap();
        std::fs::copy(&debug, by_id.join(format!("{}.debug", &id[2..]))).unwrap();
        let nm = text(llvm("nm").arg("--demangle").arg(&debug));
        let main = nm
            .lines()
            .find(|l| {
                let name = l.splitn(3, ' ').nth(2).unwrap_or("");
                name == "tachyon_bpf::main" || name.starts_with("tachyon_bpf::main::h")
            })
            .and_then(|l| l.split_whitespace().next())
            .unwrap_or_else(|| panic!("{arch}: no tachyon_bpf::main in the debug file's symbols"));
        let symbolize = |with_debug: bool| {
            let mut cmd = llvm("symbolizer");
            cmd.arg(format!("--obj={}", bin.display()));
            if with_debug {
                cmd.arg(format!("--debug-file-directory={}", store.display()));
            }
            text(cmd.arg(format!("0x{main}")))
        };
        let named = symbolize(true);
        assert!(
            named.starts_with("tachyon_bpf::main") && named.contains("src/main.rs:"),
            "{arch}: tachyon_bpf::main's address symbolized as {named:?}"
        );
        // And the name came from the debug file: the binary alone has none.
        let bare = symbolize(false);
        assert!(
            bare.starts_with("??"),
            "{arch}: without the debug file: {bare:?}"
        );
        // What the tarball holds besides the binary.
        for f in [
            "tachyon-bpf.1",
            "completions/tachyon-bpf.bash",
            "completions/_tachyon-bpf",
            "completions/tachyon-bpf.fish",
            "systemd/tachyon-bpf.service",
            "systemd/tachyon-bpf.default",
            "LICENSE-MIT",
            "LICENSE-APACHE",
            "README.md",
            "docs/cli.md",
            "docs/install.md",
        ] {
            assert!(top.join(f).is_file(), "{arch}: the tarball has no {f}");
        }
    }
    // This machine's binary starts (a foreign one is run by the arm64 guests).
    let top = dir.join(format!(
        "tachyon-bpf-{}-{}-linux",
        version(),
        std::env::consts::ARCH
    ));
    check_version(&top.join("tachyon-bpf"));
}

#[test]
fn checksums_cover_every_artifact() {
    let dir = dist_dir();
    let sums = std::fs::read_to_string(dir.join("SHA256SUMS")).unwrap();
    let listed: Vec<&str> = sums
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .collect();
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .filter(|e| e.path().is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != "SHA256SUMS")
        .collect();
    files.sort();
    assert_eq!(listed, files, "SHA256SUMS lists every artifact");
    // Per architecture: the tarball, the package, the wheel and the debug file.
    assert_eq!(files.len(), 4 * ARCHES.len(), "{files:?}");
    ok(Command::new("sha256sum")
        .current_dir(&dir)
        .args(["--check", "--strict", "SHA256SUMS"]));
}

#[test]
fn debian_package_holds_the_binary_man_page_completions_unit_and_licences() {
    let dir = scratch("dist_deb");
    for arch in ARCHES {
        let deb = dist_deb(arch);
        let fields = text(Command::new("dpkg-deb").arg("--field").arg(&deb).args([
            "Package",
            "Version",
            "Architecture",
            "Depends",
        ]));
        for want in [
            "Package: tachyon-bpf".to_string(),
            format!("Version: {}-1", version()),
            format!("Architecture: {}", deb_arch(arch)),
            "Depends: libc6 (>= 2.17)".to_string(),
        ] {
            assert!(fields.contains(&want), "{arch}: {want:?} in {fields}");
        }
        let contents = text(Command::new("dpkg-deb").arg("--contents").arg(&deb));
        for path in [
            "./usr/bin/tachyon-bpf",
            "./usr/share/man/man1/tachyon-bpf.1.gz",
            "./usr/share/bash-completion/completions/tachyon-bpf",
            "./usr/share/zsh/vendor-completions/_tachyon-bpf",
            "./usr/share/fish/vendor_completions.d/tachyon-bpf.fish",
            "./usr/lib/systemd/system/tachyon-bpf.service",
            "./etc/default/tachyon-bpf",
            "./usr/share/doc/tachyon-bpf/copyright",
            "./usr/share/doc/tachyon-bpf/LICENSE-MIT",
            "./usr/share/doc/tachyon-bpf/LICENSE-APACHE",
            "./usr/share/doc/tachyon-bpf/docs/cli.md",
            "./usr/share/doc/tachyon-bpf/docs/troubleshooting.md",
        ] {
            assert!(
                contents.lines().any(|l| l.ends_with(path)),
                "{arch}: no {path} in the package:\n{contents}"
            );
        }
        // The options file is the administrator's: a conffile, kept across upgrades.
        let conffiles = text(
            Command::new("dpkg-deb")
                .arg("--info")
                .arg(&deb)
                .arg("conffiles"),
        );
        assert_eq!(conffiles.trim(), "/etc/default/tachyon-bpf", "{arch}");
    }

    // What the package installs, read by the tools that use it.
    let root = dir.join("root");
    ok(Command::new("dpkg-deb")
        .arg("--extract")
        .arg(dist_deb(std::env::consts::ARCH))
        .arg(&root));
    // man's text without its overstrike (bold) formatting.
    let man = text(Command::new("sh").arg("-c").arg(format!(
        "MANWIDTH=100 man -l {} | col -b",
        root.join("usr/share/man/man1/tachyon-bpf.1.gz").display()
    )));
    for want in [
        "tachyon-bpf",
        "--all-pythons",
        "--continuous",
        "record",
        "top",
    ] {
        assert!(man.contains(want), "the man page has no {want:?}:\n{man}");
    }
    let completion = root.join("usr/share/bash-completion/completions/tachyon-bpf");
    let complete = text(Command::new("bash").arg("-c").arg(format!(
        "source {} && complete -p tachyon-bpf",
        completion.display()
    )));
    assert!(complete.contains("tachyon-bpf"), "{complete}");
    // The unit as shipped is the one in contrib/systemd/, and systemd finds nothing wrong in it,
    // with the package's binary where its ExecStart says.
    let unit = root.join("usr/lib/systemd/system/tachyon-bpf.service");
    assert_eq!(
        std::fs::read_to_string(&unit).unwrap(),
        std::fs::read_to_string(workspace().join("contrib/systemd/tachyon-bpf.service")).unwrap()
    );
    let doc = std::fs::read_to_string(workspace().join("docs/continuous.md")).unwrap();
    assert!(
        doc.contains(&std::fs::read_to_string(&unit).unwrap()),
        "docs/continuous.md shows the unit the package installs"
    );
    // systemd-analyze checks that ExecStart's program exists: the package's, where it was
    // unpacked here (the one change to the unit verified).
    let verified = dir.join("tachyon-bpf.service");
    std::fs::write(
        &verified,
        std::fs::read_to_string(&unit).unwrap().replace(
            "ExecStart=/usr/bin/tachyon-bpf",
            &format!("ExecStart={}", root.join("usr/bin/tachyon-bpf").display()),
        ),
    )
    .unwrap();
    let o = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(&verified)
        .output()
        .expect("systemd-analyze");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        o.status.success() && !said.contains("tachyon-bpf.service"),
        "systemd-analyze verify: {said}"
    );
}

/// `python -m venv DIR` and `pip install` of `wheel` there, offline.
fn venv_with_wheel(python: &Path, venv: &Path, wheel: &Path) {
    ok(Command::new(python).args(["-m", "venv"]).arg(venv));
    ok(Command::new(venv.join("bin/pip"))
        .args(["install", "--no-index", "--disable-pip-version-check"])
        .arg(wheel));
}

const BUSY: &str = "
import time

def busy():
    t = time.time()
    while time.time() - t < 2.0:
        sum(range(1000))

busy()
";

/// Samples of `busy()` in a profile, as the Firefox Profiler reads it.
fn busy_samples(profile: &Path) -> u64 {
    let v = Viewer::load(profile).unwrap();
    v.processes()
        .unwrap()
        .iter()
        .flat_map(|p| &p.threads)
        .map(|t| {
            v.call_paths(&t.handle)
                .unwrap()
                .count(|n| n.iter().any(|f| f == "busy"))
        })
        .sum()
}

#[test]
fn wheel_installs_with_pip_and_profiles_on_pyenv_3_8_and_debian_11() {
    require_root();
    let dir = scratch("dist_wheel");
    let wheel = dist_wheel(std::env::consts::ARCH);
    std::fs::write(dir.join("busy.py"), BUSY).unwrap();

    // pyenv's 3.8: the oldest Python we support.
    let venv = dir.join("venv38");
    venv_with_wheel(&python("3.8.18"), &venv, &wheel);
    let bin = venv.join("bin/tachyon-bpf");
    check_version(&bin);
    let profile = dir.join("venv38.json");
    let o = Command::new(&bin)
        .args(["-q", "-o"])
        .arg(&profile)
        .arg("--")
        .arg(venv.join("bin/python"))
        .arg(dir.join("busy.py"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr_of(&o));
    let n = busy_samples(&profile);
    assert!(n >= 1000, "the pip-installed binary: {n} ms of busy()");

    // Debian 11's own python3 and C library (2.31), in a mount namespace of this test's own:
    // the release's root with this machine's /proc and /sys, and a scratch /tmp.
    let root = tools_dir().join("releases/bullseye");
    assert!(
        root.join(".complete").exists(),
        "{} is missing: run the tests with `cargo xtask test`",
        root.display()
    );
    let name = wheel.file_name().unwrap().to_string_lossy().into_owned();
    std::fs::copy(&wheel, dir.join(&name)).unwrap();
    let inside = format!(
        "set -e
python3 -m venv /tmp/v
/tmp/v/bin/pip install -q --no-index --disable-pip-version-check /tmp/out/{name}
/tmp/v/bin/tachyon-bpf -q -o /tmp/out/debian11.json -- python3 /tmp/out/busy.py
ldd --version | head -1 > /tmp/out/glibc"
    );
    std::fs::write(dir.join("inside.sh"), inside).unwrap();
    let r = root.display();
    let script = format!(
        "set -e
mount -t tmpfs tmp {r}/tmp
mkdir {r}/tmp/out
mount --bind {d} {r}/tmp/out
mount --bind /proc {r}/proc
mount --rbind /sys {r}/sys
mount -t tmpfs dev {r}/dev
chroot {r} /bin/sh /tmp/out/inside.sh",
        d = dir.display()
    );
    let mut child = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_timeout(&mut child, Duration::from_secs(180));
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "in Debian 11's root: {}", stderr_of(&o));
    let glibc = std::fs::read_to_string(dir.join("glibc")).unwrap();
    assert!(glibc.contains("2.31"), "Debian 11's C library: {glibc}");
    let n = busy_samples(&dir.join("debian11.json"));
    assert!(n >= 1000, "on Debian 11's python3: {n} ms of busy()");
}

#[test]
fn wheels_are_tagged_for_their_architecture() {
    let dir = scratch("dist_wheel_tags");
    let py = python("3.11.7");
    for arch in ARCHES {
        let wheel = dist_wheel(arch);
        // pip takes each wheel for its platform, and only for it.
        for (platform, fits) in [
            (format!("manylinux2014_{arch}"), true),
            (format!("manylinux2010_{arch}"), false),
        ] {
            let o = Command::new(&py)
                .args(["-m", "pip", "install", "--no-index", "--no-deps"])
                .args(["--disable-pip-version-check", "--only-binary=:all:"])
                .args(["--platform", &platform, "--target"])
                .arg(dir.join(&platform))
                .arg(&wheel)
                .output()
                .unwrap();
            assert_eq!(
                o.status.success(),
                fits,
                "{} on {platform}: {}",
                wheel.display(),
                stderr_of(&o)
            );
        }
        let script = dir.join(format!("manylinux2014_{arch}/bin/tachyon-bpf"));
        let data = dir.join(format!("manylinux2014_{arch}"));
        let found = std::fs::read_dir(&data).map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect::<Vec<_>>()
        });
        assert!(
            script.exists(),
            "{arch}: {script:?} not installed: {found:?}"
        );
    }
}

/// `-V` is the version alone; `--version` adds the commit, the target, the kernels and the
/// Python versions.
fn check_version(bin: &Path) {
    let v = text(Command::new(bin).arg("-V"));
    assert_eq!(v.trim(), format!("tachyon-bpf {}", version()));
    let long = text(Command::new(bin).arg("--version"));
    assert!(
        long.starts_with(&format!("tachyon-bpf {}\ncommit ", version()))
            && long.contains(&format!(
                "built for {}-unknown-linux-gnu",
                std::env::consts::ARCH
            ))
            && long.contains("kernels: Linux 5.10")
            && long.contains("CPython 3.8 to 3.15"),
        "{long}"
    );
}
