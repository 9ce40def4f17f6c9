//! Root among strangers: each attack a local user could mount against a root tachyon-bpf, run
//! for real by an unprivileged user that the test creates (and removes).

use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tachyon_bpf_tests::*;

/// A local user without privileges, removed (with its processes) when the test ends.
struct Attacker {
    name: String,
    uid: u32,
    gid: u32,
}

impl Attacker {
    fn new(tag: &str) -> Attacker {
        let name = format!("tbpf-{tag}-{}", std::process::id() % 100_000);
        let _ = Command::new("userdel").arg(&name).output();
        let st = Command::new("useradd")
            .args(["--system", "--no-create-home", "--user-group"])
            .args(["--shell", "/bin/sh"])
            .arg(&name)
            .status()
            .expect("useradd");
        assert!(st.success(), "useradd {name}");
        let id = |flag: &str| -> u32 {
            let o = Command::new("id").arg(flag).arg(&name).output().unwrap();
            String::from_utf8_lossy(&o.stdout).trim().parse().unwrap()
        };
        Attacker {
            uid: id("-u"),
            gid: id("-g"),
            name,
        }
    }

    /// `sh -c script` as this user.
    fn sh(&self, script: &str) -> Command {
        let mut c = Command::new("setpriv");
        c.args([
            &format!("--reuid={}", self.uid),
            &format!("--regid={}", self.gid),
            "--clear-groups",
            "--",
            "sh",
            "-c",
            script,
        ]);
        c
    }

    /// A directory of this user's own (mode 0755) for the test.
    fn dir(&self, name: &str) -> PathBuf {
        let d = scratch(name);
        std::os::unix::fs::chown(&d, Some(self.uid), Some(self.gid)).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        d
    }
}

impl Drop for Attacker {
    fn drop(&mut self) {
        let _ = Command::new("pkill")
            .args(["-KILL", "-u", &self.uid.to_string()])
            .status();
        std::thread::sleep(Duration::from_millis(100));
        let _ = Command::new("userdel").arg(&self.name).output();
    }
}

/// A root-owned file in a directory only root can enter: what an attacker aims at.
fn victim(name: &str) -> PathBuf {
    let d = scratch(name);
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o711)).unwrap();
    let v = d.join("precious");
    std::fs::write(&v, b"precious").unwrap();
    std::fs::set_permissions(&v, std::fs::Permissions::from_mode(0o644)).unwrap();
    v
}

fn assert_untouched(v: &Path) {
    let m = std::fs::symlink_metadata(v).unwrap();
    assert!(m.file_type().is_file());
    assert_eq!(
        std::fs::read(v).unwrap(),
        b"precious",
        "{} overwritten",
        v.display()
    );
    assert_eq!(m.mode() & 0o7777, 0o644, "{} chmod'ed", v.display());
}

/// The pid the next process will get (pids are handed out in order until they wrap).
fn next_pid() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/ns_last_pid")
        .unwrap()
        .trim()
        .parse::<u32>()
        .unwrap()
        + 1
}

/// A recording of a short run (`record -- sleep 0.3`) in `dir`.
fn short_recording(dir: &Path) -> PathBuf {
    let rec = dir.join("run.tbpf");
    let o = run_profiler(
        &[
            "record",
            "-q",
            "-o",
            rec.to_str().unwrap(),
            "--",
            "sleep",
            "0.3",
        ],
        Duration::from_secs(30),
    );
    assert!(o.status.success(), "{}", stderr_of(&o));
    rec
}

fn one_line_error(o: &std::process::Output, code: i32, needle: &str) {
    let err = stderr_of(o);
    assert_eq!(o.status.code(), Some(code), "{err}");
    assert!(err.contains(needle), "{needle:?} in {err}");
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
}

#[test]
fn planted_names_beside_the_output_are_never_followed() {
    require_root();
    let a = Attacker::new("plant");
    let d = a.dir("sec_plant");
    let v = victim("sec_plant_victim");
    // Every name the profiler could pick for its temporary and probe files, for the next pids,
    // as symlinks to the victim, and as files of the attacker's own.
    // (One process plants them all, so that planting does not use up the pids it predicts.)
    let first = next_pid();
    let script = format!(
        "exec /usr/bin/python3.11 -c 'import os\nfor p in range({first}, {}):\n    os.symlink(\"{v}\", \"{d}/.p.json.%d.tmp\" % p)\n    os.symlink(\"{v}\", \"{d}/.tachyon-bpf-probe.%d\" % p)'",
        first + 300,
        v = v.display(),
        d = d.display()
    );
    assert!(a.sh(&script).status().unwrap().success());
    assert!(std::fs::symlink_metadata(d.join(format!(".p.json.{}.tmp", first + 20))).is_ok());
    // A temporary file a killed run left behind (root's, its pid long gone) is cleaned up.
    let stale = d.join(".p.json.4194304.0123456789abcdef.tmp");
    std::fs::write(&stale, b"partial").unwrap();
    let out = d.join("p.json");
    profile_command(&out, &["-d", "1"], &["sleep", "3"]);
    assert_untouched(&v);
    let m = std::fs::symlink_metadata(&out).unwrap();
    assert!(m.file_type().is_file(), "the output is a regular file");
    assert_eq!((m.uid(), m.mode() & 0o777), (0, 0o600), "root's, private");
    let _: serde_json::Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    assert!(!stale.exists(), "the stale temporary was removed");

    // A symlink at the output name itself is refused, not written through nor replaced.
    let link = d.join("q.json");
    assert!(a
        .sh(&format!("ln -s {} {}", v.display(), link.display()))
        .status()
        .unwrap()
        .success());
    let o = run_profiler(
        &["--all", "-d", "1", "-o", link.to_str().unwrap()],
        Duration::from_secs(30),
    );
    one_line_error(&o, 6, "symbolic link");
    assert_untouched(&v);
    assert!(std::fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());

    // A device is refused (`-o /dev/null` would have replaced it for the whole host); `-o -`
    // writes to standard output.
    let o = run_profiler(
        &["--all", "-d", "1", "-o", "/dev/null"],
        Duration::from_secs(30),
    );
    one_line_error(&o, 6, "not a regular file");
    assert!(std::fs::metadata("/dev/null")
        .unwrap()
        .file_type()
        .is_char_device());
    let o = run_profiler(
        &["-f", "collapsed", "-o", "-", "-q", "--", "sleep", "0.5"],
        Duration::from_secs(30),
    );
    assert!(o.status.success(), "{}", stderr_of(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.lines()
            .any(|l| l.contains("[pid ") && l.contains("sleep")),
        "folded stacks on stdout: {text}"
    );
}

#[test]
fn output_directories_are_private_and_shared_ones_refused() {
    require_root();
    let a = Attacker::new("odir");
    let d = scratch("sec_odir");
    // Under umask 000 the new directory is still 0700, its files 0600.
    let new = d.join("intervals");
    let busy = Stdio::null();
    let sleeper = KillOnDrop(
        Command::new("sh")
            .args(["-c", "exec yes"])
            .stdout(busy)
            .spawn()
            .unwrap(),
    );
    let script = format!(
        "umask 000; exec {} --continuous --rotate 1s --output-dir {} -d 2.5 -q -p {}",
        profiler_bin().display(),
        new.display(),
        sleeper.0.id()
    );
    let st = Command::new("sh").args(["-c", &script]).status().unwrap();
    assert!(st.success());
    assert_eq!(std::fs::metadata(&new).unwrap().mode() & 0o7777, 0o700);
    let files: Vec<_> = std::fs::read_dir(&new).unwrap().flatten().collect();
    assert!(!files.is_empty(), "intervals were written");
    for f in &files {
        assert_eq!(f.metadata().unwrap().mode() & 0o777, 0o600);
    }
    // A directory the attacker can write to (not sticky) is refused before anything starts.
    let shared = a.dir("sec_odir_shared");
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
    let o = run_profiler(
        &[
            "--all",
            "--continuous",
            "--output-dir",
            shared.to_str().unwrap(),
            "-d",
            "1",
        ],
        Duration::from_secs(30),
    );
    one_line_error(&o, 6, "writable by other users");
    let o = run_profiler(
        &[
            "--all",
            "-d",
            "1",
            "-o",
            shared.join("p.json").to_str().unwrap(),
        ],
        Duration::from_secs(30),
    );
    one_line_error(&o, 6, "writable by other users");
}

/// Starts `script` (Python, Debian's interpreter, which every user may run) as the attacker, and
/// waits until it prints "ready".
fn attacker_python(a: &Attacker, dir: &Path, script: &str) -> KillOnDrop {
    let file = dir.join("attack.py");
    std::fs::write(&file, script).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut child = a
        .sh(&format!("exec /usr/bin/python3.11 {}", file.display()))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = child.stdout.take().unwrap();
    let mut buf = [0u8; 6];
    std::io::Read::read_exact(&mut out, &mut buf).unwrap();
    assert_eq!(&buf, b"ready\n");
    KillOnDrop(child)
}

#[test]
fn a_fifo_at_a_mapped_path_cannot_hang_the_profiler() {
    require_root();
    let a = Attacker::new("fifo");
    let d = a.dir("sec_fifo");
    // The attacker maps a library of its own, then puts a FIFO where it was.
    let script = format!(
        r#"
import ctypes, os, shutil, time
lib = "{d}/libevil.so"
shutil.copy("/usr/lib/x86_64-linux-gnu/libz.so.1", lib)
z = ctypes.CDLL(lib)
os.unlink(lib)
os.mkfifo(lib)
print("ready", flush=True)
def attacker_loop():
    t0 = time.time()
    while time.time() - t0 < 60:
        z.crc32(0, b"x" * 4096, 4096)
attacker_loop()
"#,
        d = d.display()
    );
    let _target = attacker_python(&a, &d, &script);
    let out = scratch("sec_fifo_out").join("p.json");
    let t0 = Instant::now();
    let o = run_profiler(
        &["--all-pythons", "-d", "3", "-o", out.to_str().unwrap()],
        Duration::from_secs(40),
    );
    assert!(o.status.success(), "{}", stderr_of(&o));
    assert!(
        t0.elapsed() < Duration::from_secs(25),
        "the run took {:?}",
        t0.elapsed()
    );
    let v = Viewer::load(&out).unwrap();
    let attacked = v
        .processes()
        .unwrap()
        .into_iter()
        .find(|p| p.name.contains("attack.py"))
        .expect("the attacker's process is profiled");
    let c = v.call_paths(&attacked.threads[0].handle).unwrap();
    assert!(
        c.count(|n| n.iter().any(|f| f == "attacker_loop")) > 500,
        "its Python frames are there"
    );
}

#[test]
fn a_library_swapped_for_a_link_keeps_its_own_symbols() {
    require_root();
    let a = Attacker::new("swap");
    let d = a.dir("sec_swap");
    let lib = compile_c(
        &d,
        "libattacker.so",
        "void attacker_spin(long n) { volatile long s = 0; for (long i = 0; i < n; i++) s += i; }\n",
        &["-shared", "-fPIC", "-O1"],
    );
    std::os::unix::fs::chown(&lib, Some(a.uid), Some(a.gid)).unwrap();
    // A root-owned library of the same code under another name: the same offsets, so a profiler
    // that follows the link names the attacker's frames after it.
    let decoy_dir = scratch("sec_swap_decoy");
    let decoy = compile_c(
        &decoy_dir,
        "libdecoy.so",
        "void decoy_spin___(long n) { volatile long s = 0; for (long i = 0; i < n; i++) s += i; }\n",
        &["-shared", "-fPIC", "-O1"],
    );
    // Loaded, then replaced by an absolute link to that host library: opened by path through
    // /proc/PID/root, the link resolves on the host.
    let script = format!(
        r#"
import ctypes, os, time
lib = "{lib}"
spin = ctypes.CDLL(lib).attacker_spin
os.unlink(lib)
os.symlink("{decoy}", lib)
print("ready", flush=True)
t0 = time.time()
while time.time() - t0 < 60:
    spin(200000)
"#,
        lib = lib.display(),
        decoy = decoy.display()
    );
    let target = attacker_python(&a, &d, &script);
    let outdir = scratch("sec_swap_out");
    std::fs::set_permissions(&outdir, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let pid = target.0.id().to_string();
    let args = |out: &Path| -> Vec<String> {
        [
            "-p",
            &pid,
            "-d",
            "2",
            "-f",
            "collapsed",
            "-o",
            out.to_str().unwrap(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    // With least privilege `map_files` is refused, so the path is all there is: the link must
    // not lead to the host's library (no names is right, the wrong names is not).
    let out = outdir.join("least.folded");
    let o = as_nobody_with(&CAPS, &args(&out));
    assert!(o.status.success(), "{}", stderr_of(&o));
    let text = std::fs::read_to_string(&out).unwrap();
    assert!(
        !text.contains("decoy_spin"),
        "the host library's names for the attacker's:\n{text}"
    );
    // As root, map_files gives the mapped file itself: its own names.
    let out = outdir.join("root.folded");
    let o = run_profiler(
        &args(&out).iter().map(String::as_str).collect::<Vec<_>>(),
        Duration::from_secs(40),
    );
    assert!(o.status.success(), "{}", stderr_of(&o));
    let text = std::fs::read_to_string(&out).unwrap();
    let count = |f: &dyn Fn(&str) -> bool| -> u64 {
        text.lines()
            .filter(|l| f(l))
            .map(|l| l.rsplit_once(' ').unwrap().1.parse::<u64>().unwrap())
            .sum()
    };
    let total = count(&|_| true);
    let own = count(&|l| l.contains(";attacker_spin"));
    let decoy_ms = count(&|l| l.contains("decoy_spin"));
    assert!(
        own as f64 > 0.5 * total as f64 && decoy_ms == 0,
        "attacker_spin in {own} of {total} ms, the host library's name in {decoy_ms}:\n{text}"
    );
}

#[test]
fn convert_of_a_gzip_bomb_is_refused_within_bounded_memory() {
    require_root();
    let a = Attacker::new("bomb");
    let d = a.dir("sec_bomb");
    // 700 MB of JSON in a few MB of gzip.
    let bomb = d.join("bomb.tbpf");
    {
        use std::io::Write;
        let f = std::fs::File::create(&bomb).unwrap();
        let mut gz = flate2::write::GzEncoder::new(f, flate2::Compression::fast());
        gz.write_all(br#"{"format":"tachyon-bpf recording","version":1,"run":{},"profile":{"x":""#)
            .unwrap();
        let chunk = vec![b'a'; 1 << 20];
        for _ in 0..700 {
            gz.write_all(&chunk).unwrap();
        }
        gz.write_all(br#""}}"#).unwrap();
        gz.finish().unwrap();
    }
    std::fs::set_permissions(&bomb, std::fs::Permissions::from_mode(0o644)).unwrap();
    let o = a
        .sh(&format!(
            "exec /usr/bin/time -f 'rss %M' {} convert {} -o {}/out.json",
            profiler_bin().display(),
            bomb.display(),
            d.display()
        ))
        .output()
        .unwrap();
    let err = stderr_of(&o);
    assert_eq!(o.status.code(), Some(7), "{err}");
    assert!(err.contains("more than 512 MiB"), "{err}");
    let rss_kib: u64 = err
        .lines()
        .find_map(|l| l.strip_prefix("rss "))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(rss_kib < 700 * 1024, "peak RSS {rss_kib} KiB");
}

#[test]
fn convert_of_an_impossibly_deep_recording_is_refused() {
    require_root();
    let a = Attacker::new("deep");
    let d = a.dir("sec_deep");
    // A real recording, then one stack deeper than any run records.
    let rec = short_recording(&d);
    let mut json: serde_json::Value = {
        let f = std::fs::File::open(&rec).unwrap();
        serde_json::from_reader(flate2::read::GzDecoder::new(f)).unwrap()
    };
    // The recording's stack table (docs/recording.md): a frame column and a prefix column.
    let base = json["stacks"]["frame"].as_array().unwrap().len();
    let frame = json["stacks"]["frame"][0].clone();
    for i in 0..5000 {
        let prefix = if i == 0 {
            serde_json::Value::Null
        } else {
            (base + i - 1).into()
        };
        json["stacks"]["frame"]
            .as_array_mut()
            .unwrap()
            .push(frame.clone());
        json["stacks"]["prefix"]
            .as_array_mut()
            .unwrap()
            .push(prefix);
    }
    let deep = d.join("deep.tbpf");
    {
        let f = std::fs::File::create(&deep).unwrap();
        let mut gz = flate2::write::GzEncoder::new(f, flate2::Compression::fast());
        serde_json::to_writer(&mut gz, &json).unwrap();
        gz.finish().unwrap();
    }
    std::fs::set_permissions(&deep, std::fs::Permissions::from_mode(0o644)).unwrap();
    let o = a
        .sh(&format!(
            "exec {} convert {} -f collapsed -o {}/out.folded",
            profiler_bin().display(),
            deep.display(),
            d.display()
        ))
        .output()
        .unwrap();
    one_line_error(&o, 7, "deeper than 4096");
}

#[test]
fn a_launched_command_ends_with_the_profiling() {
    require_root();
    let dir = scratch("sec_child");
    let marker = format!("launched-{}", std::process::id());
    let script = format!("import time\ntime.sleep(30)  # {marker}");
    let out = dir.join("p.json");
    let t0 = Instant::now();
    let o = run_profiler(
        &[
            "-d",
            "1",
            "-q",
            "-o",
            out.to_str().unwrap(),
            "--",
            "/usr/bin/python3.11",
            "-c",
            &script,
        ],
        Duration::from_secs(30),
    );
    assert!(o.status.success(), "{}", stderr_of(&o));
    assert!(t0.elapsed() < Duration::from_secs(10));
    let alive = Command::new("pgrep")
        .args(["-f", &marker])
        .output()
        .unwrap();
    assert!(
        !alive.status.success(),
        "the command is still running after the profiler exited"
    );
}

#[test]
fn idle_connections_cannot_exhaust_the_open_server() {
    require_root();
    let a = Attacker::new("open");
    let dir = scratch("sec_open");
    let rec = short_recording(&dir);
    let (mut server, line) = serve_recording(&rec, &dir.join("open.json"));
    let port: u16 = line
        .split("127.0.0.1%3A")
        .nth(1)
        .and_then(|r| r.split('%').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("a from-url link with a port: {line}"));
    let tasks = |pid: u32| {
        std::fs::read_dir(format!("/proc/{pid}/task"))
            .unwrap()
            .count()
    };
    let before = tasks(server.id());
    // The attacker opens many connections and sends nothing on them (tiny_http, used before,
    // started a thread for each: 4,000 made 2,800 threads).
    let flood = format!(
        "import socket, time\nss = []\nfor _ in range(150):\n    try:\n        s = socket.socket(); s.settimeout(0.05); s.connect_ex(('127.0.0.1', {port})); ss.append(s)\n    except OSError:\n        pass\nprint('ready', flush=True)\ntime.sleep(60)\n"
    );
    let fdir = a.dir("sec_open_flood");
    let _flood = attacker_python(&a, &fdir, &flood);
    std::thread::sleep(Duration::from_millis(500));
    let during = tasks(server.id());
    assert!(
        during <= before + 2,
        "{during} threads with 150 idle connections, {before} before"
    );
    // Ctrl-C still ends serving at once.
    // SAFETY: signalling our own child.
    unsafe { libc::kill(server.id() as i32, libc::SIGINT) };
    let t0 = Instant::now();
    wait_timeout(&mut server, Duration::from_secs(10));
    assert_eq!(server.wait().unwrap().code(), Some(0));
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
}

#[test]
fn a_continuous_run_that_can_write_nothing_fails() {
    require_root();
    // A directory on a file system too small for any interval profile (a full disk).
    let dir = scratch("sec_full_disk");
    let full = dir.join("full");
    std::fs::create_dir_all(&full).unwrap();
    let busy = KillOnDrop(
        Command::new("sh")
            .args(["-c", "exec yes"])
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let script = format!(
        "mount -t tmpfs -o size=4k,mode=0700 none {full} && exec {bin} --continuous --rotate 1s \
         --output-dir {full} -d 3 -q -p {pid}",
        full = full.display(),
        bin = profiler_bin().display(),
        pid = busy.0.id()
    );
    let mut child = Command::new("unshare")
        .args(["-m", "sh", "-c", &script])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_timeout(&mut child, Duration::from_secs(30));
    let o = child.wait_with_output().unwrap();
    let err = stderr_of(&o);
    assert_eq!(o.status.code(), Some(6), "{err}");
    assert!(err.contains("none of the"), "{err}");
}

/// A run with its kernel symbols kept in `cache` (`TACHYON_BPF_CACHE_DIR`): its stderr (`-v`)
/// and collapsed profile of `sleep 0.2`.
fn run_with_symbol_cache(cache: &Path, out: &Path) -> (String, String) {
    let mut child = Command::new(profiler_bin())
        .env("TACHYON_BPF_CACHE_DIR", cache)
        .args(["-v", "-d", "0.3", "-f", "collapsed", "-o"])
        .arg(out)
        .args(["--", "sleep", "0.2"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_timeout(&mut child, Duration::from_secs(60));
    let o = child.wait_with_output().unwrap();
    let err = stderr_of(&o);
    assert!(o.status.success(), "{err}");
    (err, std::fs::read_to_string(out).unwrap())
}

/// The kernel's symbols are kept for the boot in a file of root's, in a directory of root's.
/// Another user can forge such a table (the boot id and `/proc/modules` are readable to all):
/// one in a directory of theirs, or a file of theirs in root's directory, or a file that others
/// can write, is never believed; the kernel's own names are shown.
#[test]
fn a_forged_kernel_symbol_cache_is_never_believed() {
    require_root();
    let a = Attacker::new("ksyms");
    let d = scratch("sec_ksyms");
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = d.join("sleep.folded");
    // A real table, kept by a first run and used by the second.
    let own = d.join("root-cache");
    let (err, _) = run_with_symbol_cache(&own, &out);
    assert!(
        err.contains("kernel symbols from /proc/kallsyms (cached"),
        "{err}"
    );
    let (err, folded) = run_with_symbol_cache(&own, &out);
    assert!(
        err.contains("kernel symbols from the boot's cache"),
        "{err}"
    );
    assert!(folded.contains("do_nanosleep_[k]"), "{folded}");
    // The profiler's own programs are named without the whole table: their frames, innermost
    // in each off-CPU capture, are known and trimmed, and nothing is read again mid-run. A timer
    // sample may still interrupt one of its lifetime programs (the exec program as it wakes the
    // reader, the exit program as `sleep` exits: a few µs each, so now and then): it shows it,
    // under the system call that ran it, named from the program's own address range.
    assert!(!err.contains("read again mid-run"), "{err}");
    for line in folded.lines() {
        let stack = line.rsplit_once(' ').map_or(line, |l| l.0);
        let innermost = stack.rsplit(';').next().unwrap_or("");
        assert!(
            !innermost.starts_with("bpf_prog_"),
            "a stack ending in the profiler's program: {line}"
        );
        assert!(
            !(stack.contains("bpf_prog_") && stack.contains("__schedule")),
            "an off-CPU capture with the profiler's frames: {line}"
        );
        assert!(
            !stack.contains("bpf_prog_")
                || ["exec", "exit", "fork"]
                    .iter()
                    .any(|p| stack.contains(&format!("_tachyon_{p}_[k]"))),
            "{line}"
        );
    }
    assert!(
        folded.lines().any(|l| l.contains(";__schedule_[k] ")),
        "off-CPU stacks end at the scheduler: {folded}"
    );
    assert_eq!(
        std::fs::metadata(&own).unwrap().mode() & 0o777,
        0o700,
        "the cache directory is private"
    );
    // The forgery: the same table with the scheduler's sleep renamed (same length).
    let real = std::fs::read(own.join("kallsyms")).unwrap();
    let mut forged = real.clone();
    let mut at = 0;
    while let Some(i) = forged[at..].windows(12).position(|w| w == b"do_nanosleep") {
        forged[at + i..at + i + 12].copy_from_slice(b"EVIL_nanoslp");
        at += i + 12;
    }
    assert_eq!(forged.len(), real.len());
    assert_ne!(forged, real);
    let believed = |cache: &Path, why: &str| {
        let (err, folded) = run_with_symbol_cache(cache, &out);
        assert!(!folded.contains("EVIL"), "{why}: the forged table was used");
        assert!(folded.contains("do_nanosleep_[k]"), "{why}: {folded}");
        assert!(!err.contains("from the boot's cache"), "{why}: {err}");
        err
    };
    // In the attacker's own directory, written by the attacker.
    let theirs = a.dir("sec_ksyms_attacker").join("cache");
    let st = a
        .sh(&format!(
            "umask 077 && mkdir {0} && cat > {0}/kallsyms",
            theirs.display()
        ))
        .stdin(Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin.take().unwrap().write_all(&forged)?;
            c.wait()
        })
        .unwrap();
    assert!(st.success());
    assert_eq!(std::fs::metadata(&theirs).unwrap().uid(), a.uid);
    let err = believed(&theirs, "the attacker's directory");
    assert!(err.contains("not root's alone"), "{err}");
    assert_eq!(
        std::fs::read(theirs.join("kallsyms")).unwrap(),
        forged,
        "left alone"
    );
    // The attacker's file in root's directory; then root's file that anyone can write.
    std::fs::write(own.join("kallsyms"), &forged).unwrap();
    std::os::unix::fs::chown(own.join("kallsyms"), Some(a.uid), Some(a.gid)).unwrap();
    believed(&own, "the attacker's file");
    std::fs::write(own.join("kallsyms"), &forged).unwrap();
    std::fs::set_permissions(own.join("kallsyms"), std::fs::Permissions::from_mode(0o666)).unwrap();
    believed(&own, "a file anyone can write");
    // A link to the forged table in root's directory.
    std::fs::remove_file(own.join("kallsyms")).unwrap();
    std::os::unix::fs::symlink(theirs.join("kallsyms"), own.join("kallsyms")).unwrap();
    believed(&own, "a link");
}
