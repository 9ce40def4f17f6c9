//! tachyon-bpf: a system-wide eBPF sampling profiler for Python (and everything else) on Linux.

use tachyon_bpf::{aggregate, capture, collect, output, process, python, top};

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Parser;
use tokio::io::unix::AsyncFd;
use tokio::signal::unix::{signal, SignalKind};

use aggregate::Mode;
use capture::record::Record;
use capture::{Capture, CaptureError, CaptureOptions};
use collect::{monotonic_ns, Collector};
use output::{Format, RunInfo};

/// Sample every CPU and write where processes spend their time: Python, native and kernel
/// frames, GIL and CPU state, as a Firefox Profiler profile or any other format.
#[derive(Parser, Debug)]
#[command(
    name = "tachyon-bpf",
    version,
    about,
    after_help = "Needs Linux 5.10 or newer with BTF (README: Kernels), and root or the \
                  capabilities of README: Least privilege.",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    cmd: Option<Cmd>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(clap::Subcommand, Debug)]
enum Cmd {
    /// Profile as the main command does, and store the run in one file (-o, default
    /// profile.tbpf) that `convert` writes in any format later.
    Record(RunArgs),
    /// Write a recording in other formats: no root needed, its processes may be gone.
    Convert(ConvertArgs),
    /// A live table of the hottest functions (last 10 s), with GIL waits; q quits.
    Top(RunArgs),
}

#[derive(clap::Args, Debug)]
struct RunArgs {
    /// Profile every process on the host.
    #[arg(long, conflicts_with_all = ["pid", "all_pythons"])]
    all: bool,
    /// Profile every Python process on the host, including ones started during the run.
    #[arg(long, conflicts_with = "pid")]
    all_pythons: bool,
    /// Profile this process, all its threads (repeatable).
    #[arg(short, long = "pid", value_name = "PID")]
    pid: Vec<u32>,
    /// Samples per second on each CPU [default: 1000, or 49 with --continuous].
    #[arg(short, long, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    rate: Option<u64>,
    /// Stop after this many seconds (default: until Ctrl-C or the command exits).
    #[arg(short, long, value_name = "SECS", value_parser = parse_secs)]
    duration: Option<f64>,
    /// Output file (default profile.json, or profile.<ext> for another format); with several
    /// formats, the base name each format adds its extension to.
    #[arg(short, long)]
    output: Option<PathBuf>,
    /// Output formats, comma-separated: gecko (Firefox Profiler), collapsed (folded stacks),
    /// jsonl (CPython sampler JSONL), pprof, flamegraph (SVG).
    #[arg(short, long, value_enum, value_delimiter = ',')]
    format: Vec<Format>,
    /// Serve the profile to profiler.firefox.com from 127.0.0.1 and print its link (until Ctrl-C).
    #[arg(long)]
    open: bool,
    /// Permissions of the files written, in octal (profiles name every user's code paths).
    #[arg(long, value_name = "OCTAL", default_value = "600", value_parser = parse_mode)]
    output_mode: u32,
    /// Profile until stopped, writing one profile per --rotate interval into --output-dir.
    #[arg(long, requires = "output_dir", conflicts_with_all = ["output", "open", "command"])]
    continuous: bool,
    /// With --continuous: the length of each profile (e.g. 60s, 5m).
    #[arg(long, value_parser = parse_rotate, default_value = "60s", requires = "continuous")]
    rotate: Duration,
    /// With --continuous: the directory the interval profiles go to (created if missing).
    #[arg(long, value_name = "DIR")]
    output_dir: Option<PathBuf>,
    /// With --continuous: keep only the newest N intervals' files.
    #[arg(long, value_name = "N", requires = "continuous", value_parser = clap::value_parser!(u64).range(1..))]
    keep: Option<u64>,
    /// With --continuous: send each interval's pprof to this Pyroscope-compatible server
    /// (POST URL/ingest?name=...&from=...&until=...&format=pprof), retrying with back-off.
    #[arg(long, value_name = "URL", requires = "continuous", value_parser = parse_push_url)]
    push: Option<String>,
    /// The application name pushed (default tachyon-bpf.MODE{host=HOSTNAME}).
    #[arg(long, value_name = "NAME", requires = "push")]
    push_name: Option<String>,
    /// Bytes of user stack copied per sample for DWARF unwinding (4096-32768).
    #[arg(long, default_value_t = 32768, value_parser = clap::value_parser!(u64).range(4096..=32768))]
    stack_size: u64,
    /// Ring buffer size in MiB.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=1024))]
    ring_mb: u32,
    /// What to count: wall (on- and off-CPU time of every thread), cpu (on-CPU time), gil (time
    /// holding the GIL), exception (time with an exception raised or handled), all.
    #[arg(short, long, value_enum, default_value_t = Mode::Wall)]
    mode: Mode,
    /// With --pid or -- COMMAND: also profile the processes they start, and theirs.
    #[arg(long)]
    subprocesses: bool,
    /// Show interpreter-internal native frames between Python frames.
    #[arg(long)]
    show_internal: bool,
    /// No summary on stderr.
    #[arg(short, long)]
    quiet: bool,
    /// Load the BPF programs made for kernels older than 5.18 even on a newer one (the kernel's
    /// BTF chooses otherwise; this is for comparing the two, and for kernels that misreport).
    #[arg(long, hide = true)]
    compat_programs: bool,
    /// Print more: the kernel's whole verifier log when it refuses a program.
    #[arg(short, long)]
    verbose: bool,
    /// Command to launch and profile until it exits.
    #[arg(last = true, value_name = "CMD")]
    command: Vec<String>,
}

#[derive(clap::Args, Debug)]
struct ConvertArgs {
    /// A recording made by `tachyon-bpf record`.
    input: PathBuf,
    /// Output formats, comma-separated (default gecko).
    #[arg(short, long, value_enum, value_delimiter = ',')]
    format: Vec<Format>,
    /// Output file, or with several formats the base name (default: the recording's name).
    #[arg(short, long)]
    output: Option<PathBuf>,
    /// Count another mode than the recording's (from a wall or all recording).
    #[arg(short, long, value_enum)]
    mode: Option<Mode>,
    /// Serve the Gecko profile to profiler.firefox.com from 127.0.0.1 (until Ctrl-C).
    #[arg(long)]
    open: bool,
    /// Permissions of the files written, in octal.
    #[arg(long, value_name = "OCTAL", default_value = "600", value_parser = parse_mode)]
    output_mode: u32,
    /// Nothing on stderr but errors.
    #[arg(short, long)]
    quiet: bool,
}

/// The longest `-d`: a year (longer is a typo, and would overflow the timers).
const MAX_SECS: f64 = 365.0 * 24.0 * 3600.0;

fn parse_secs(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v <= MAX_SECS => Ok(v),
        _ => Err(format!(
            "{s:?} is not a duration: give seconds, more than 0 and at most {MAX_SECS}"
        )),
    }
}

fn parse_rotate(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| format!("{s:?}: {e}"))?;
    if d < Duration::from_secs(1) || d.as_secs_f64() > MAX_SECS {
        return Err(format!(
            "{s:?}: an interval is at least 1s and at most a year"
        ));
    }
    Ok(d)
}

/// `--push`: an http or https URL with a host; checked before anything starts.
fn parse_push_url(s: &str) -> Result<String, String> {
    let uri: ureq::http::Uri = s.parse().map_err(|e| format!("{s:?} is not a URL: {e}"))?;
    match (uri.scheme_str(), uri.host()) {
        (Some("http" | "https"), Some(h)) if !h.is_empty() => Ok(s.trim_end_matches('/').into()),
        _ => Err(format!(
            "{s:?} is not an http:// or https:// URL with a host"
        )),
    }
}

fn parse_mode(s: &str) -> Result<u32, String> {
    u32::from_str_radix(s, 8)
        .ok()
        .filter(|m| *m <= 0o777)
        .ok_or_else(|| format!("{s:?} is not an octal file mode such as 600 or 640"))
}

/// Errors a user can hit, each with its exit code (documented in the README).
#[derive(Debug, thiserror::Error)]
enum AppError {
    #[error("{0}")]
    Permission(String),
    #[error("{0}")]
    Kernel(String),
    #[error("{0}")]
    Target(String),
    #[error("{0}")]
    Output(String),
    #[error("{0}")]
    Usage(String),
    #[error("{0}")]
    Input(String),
    #[error("{0}")]
    Other(String),
}

impl AppError {
    fn code(&self) -> i32 {
        match self {
            AppError::Other(_) => 1,
            AppError::Usage(_) => 2,
            AppError::Permission(_) => 3,
            AppError::Kernel(_) => 4,
            AppError::Target(_) => 5,
            AppError::Output(_) => 6,
            AppError::Input(_) => 7,
        }
    }
}

impl From<CaptureError> for AppError {
    fn from(e: CaptureError) -> Self {
        match e {
            CaptureError::Load(ref m) if m.contains("Operation not permitted") => AppError::Permission(format!(
                "{e}: needs root, or CAP_BPF, CAP_PERFMON, CAP_SYS_PTRACE, CAP_DAC_READ_SEARCH and CAP_SYSLOG"
            )),
            CaptureError::Refused { permission: true, .. } => AppError::Permission(format!(
                "{e}: needs root, or CAP_BPF, CAP_PERFMON, CAP_SYS_PTRACE, CAP_DAC_READ_SEARCH and CAP_SYSLOG"
            )),
            CaptureError::Refused { .. } => AppError::Kernel(format!(
                "{e} (run with --verbose for the verifier's log; tachyon-bpf needs Linux {} or newer with BTF)",
                capture::MIN_KERNEL
            )),
            CaptureError::Missing { .. } => AppError::Kernel(e.to_string()),
            CaptureError::Load(_) | CaptureError::Attach { .. } => AppError::Kernel(format!(
                "{e} (tachyon-bpf needs Linux {} or newer with BTF, BPF ring buffers and perf_event BPF programs)",
                capture::MIN_KERNEL
            )),
            other => AppError::Other(other.to_string()),
        }
    }
}

/// Effective capabilities of this process.
fn cap_eff() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .unwrap_or(0)
}

const CAP_DAC_READ_SEARCH: u32 = 2;
const CAP_SYS_PTRACE: u32 = 19;
const CAP_SYS_ADMIN: u32 = 21;
const CAP_SYSLOG: u32 = 34;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// The capabilities tachyon-bpf needs instead of root, and what each is for (README: "Least
/// privilege"). CAP_SYS_ADMIN stands in for CAP_BPF and CAP_PERFMON, as the kernel allows.
const NEEDED: [(u32, &str, bool); 5] = [
    (CAP_BPF, "CAP_BPF", true),
    (CAP_PERFMON, "CAP_PERFMON", true),
    (CAP_SYS_PTRACE, "CAP_SYS_PTRACE", false),
    (CAP_DAC_READ_SEARCH, "CAP_DAC_READ_SEARCH", false),
    (CAP_SYSLOG, "CAP_SYSLOG", false),
];

fn check_environment() -> Result<(), AppError> {
    let caps = cap_eff();
    let has = |c: u32| caps & (1u64 << c) != 0;
    let missing: Vec<&str> = NEEDED
        .iter()
        .filter(|(c, _, admin_ok)| !(has(*c) || (*admin_ok && has(CAP_SYS_ADMIN))))
        .map(|(_, name, _)| *name)
        .collect();
    if !missing.is_empty() {
        return Err(AppError::Permission(format!(
            "tachyon-bpf needs root, or the capabilities CAP_BPF, CAP_PERFMON, CAP_SYS_PTRACE, \
             CAP_DAC_READ_SEARCH and CAP_SYSLOG; missing: {}",
            missing.join(", ")
        )));
    }
    if !std::path::Path::new("/sys/kernel/btf/vmlinux").exists() {
        return Err(AppError::Kernel(
            "this kernel has no BTF (/sys/kernel/btf/vmlinux is missing): tachyon-bpf needs CONFIG_DEBUG_INFO_BTF=y".into(),
        ));
    }
    Ok(())
}

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) if e.use_stderr() => {
            // One line, as every other error: clap's first, without its usage block.
            let text = e.to_string();
            let first = text.lines().next().unwrap_or("bad command line");
            let first = first.strip_prefix("error: ").unwrap_or(first);
            eprintln!("tachyon-bpf: error: {first} (see --help)");
            std::process::exit(2);
        }
        Err(e) => {
            let _ = e.print();
            std::process::exit(0);
        }
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let result = rt.block_on(async {
        match cli.cmd {
            None => run(cli.run, Sink::Files).await,
            Some(Cmd::Record(args)) => run(args, Sink::Recording).await,
            Some(Cmd::Top(args)) => run(args, Sink::Top).await,
            Some(Cmd::Convert(args)) => convert(args).await,
        }
    });
    match result {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("tachyon-bpf: error: {e}");
            std::process::exit(e.code());
        }
    }
}

/// From now on SIGINT exits at once (exit code 130), writing nothing more: the output is
/// written to a temporary name and renamed, so no partial file is left under its name.
fn exit_on_second_interrupt() {
    extern "C" fn on_sigint(_: libc::c_int) {
        const MSG: &[u8] = b"tachyon-bpf: interrupted again, exiting without writing\n";
        // SAFETY: write and _exit are async-signal-safe.
        unsafe {
            libc::write(2, MSG.as_ptr() as *const libc::c_void, MSG.len());
            libc::_exit(130);
        }
    }
    // SAFETY: an all-zero sigaction is valid; the handler only calls async-signal-safe
    // functions.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sigint as *const () as usize;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGINT, &sa, std::ptr::null_mut());
    }
}

/// Ends a launched command that is still running: SIGTERM, then SIGKILL after a second.
async fn end_command(pid: u32, exited: &mut tokio::sync::oneshot::Receiver<i32>) {
    let pid = nix::unistd::Pid::from_raw(pid as i32);
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
    if tokio::time::timeout(Duration::from_secs(1), exited)
        .await
        .is_err()
    {
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
    }
}

/// A launched command, held before `exec` until the profiler is attached.
struct Launched {
    pid: u32,
    go: std::os::fd::OwnedFd,
    /// Carries the errno of a failed exec; closes on a successful one.
    exec_err: std::os::fd::OwnedFd,
}

impl Launched {
    /// Lets the command exec and returns once it has (or failed to); its exit status is sent
    /// on `tx` when it ends.
    fn release(self, tx: tokio::sync::oneshot::Sender<i32>) -> std::io::Result<()> {
        let _ = nix::unistd::write(&self.go, b"g");
        drop(self.go);
        let mut b = [0u8; 4];
        if let Ok(4) = nix::unistd::read(&self.exec_err, &mut b) {
            return Err(std::io::Error::from_raw_os_error(i32::from_ne_bytes(b)));
        }
        let pid = nix::unistd::Pid::from_raw(self.pid as i32);
        std::thread::spawn(move || {
            use nix::sys::wait::{waitpid, WaitStatus};
            loop {
                match waitpid(pid, None) {
                    Ok(WaitStatus::Exited(_, code)) => {
                        let _ = tx.send(code);
                        return;
                    }
                    Ok(WaitStatus::Signaled(_, sig, _)) => {
                        let _ = tx.send(128 + sig as i32);
                        return;
                    }
                    Ok(_) => continue,
                    Err(_) => return,
                }
            }
        });
        Ok(())
    }
}

/// Forks the command and holds it before `exec` on a pipe, so its first instruction is sampled.
/// `std::process::Command` cannot do this: `spawn` itself waits for the `exec`.
fn launch(command: &[String]) -> Result<Launched, AppError> {
    use std::ffi::CString;
    use std::os::fd::{FromRawFd, OwnedFd};
    let args: Vec<CString> = command
        .iter()
        .map(|a| CString::new(a.as_bytes()))
        .collect::<Result<_, _>>()
        .map_err(|_| AppError::Usage("command arguments cannot contain NUL bytes".into()))?;
    let mut argv: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    // The error pipe reports a failed exec (errno) back; it closes on a successful exec.
    let mut go = [0i32; 2];
    let mut err = [0i32; 2];
    // SAFETY: pipe2 fills the two-element arrays.
    let (r1, r2) = unsafe {
        (
            libc::pipe2(go.as_mut_ptr(), libc::O_CLOEXEC),
            libc::pipe2(err.as_mut_ptr(), libc::O_CLOEXEC),
        )
    };
    if r1 != 0 || r2 != 0 {
        return Err(AppError::Other(format!(
            "pipe: {}",
            std::io::Error::last_os_error()
        )));
    }
    // SAFETY: fork in a process whose other threads (none that hold locks we use) are not
    // touched by the child, which only calls async-signal-safe read/write/execvp/_exit.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(AppError::Other(format!(
            "fork: {}",
            std::io::Error::last_os_error()
        )));
    }
    if pid == 0 {
        // SAFETY: async-signal-safe calls only, on descriptors and strings prepared before fork.
        unsafe {
            libc::close(go[1]);
            libc::close(err[0]);
            let mut b = 0u8;
            libc::read(go[0], &mut b as *mut u8 as *mut libc::c_void, 1);
            libc::execvp(argv[0], argv.as_ptr());
            let e = *libc::__errno_location();
            libc::write(err[1], &e as *const i32 as *const libc::c_void, 4);
            libc::_exit(127);
        }
    }
    // SAFETY: the descriptors came from pipe2 above and are owned here from now on.
    let (go_rd, go_wr, err_rd, err_wr) = unsafe {
        (
            OwnedFd::from_raw_fd(go[0]),
            OwnedFd::from_raw_fd(go[1]),
            OwnedFd::from_raw_fd(err[0]),
            OwnedFd::from_raw_fd(err[1]),
        )
    };
    drop(go_rd);
    drop(err_wr);
    Ok(Launched {
        pid: pid as u32,
        go: go_wr,
        exec_err: err_rd,
    })
}

/// Where a run's samples go.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Sink {
    /// The chosen formats (or continuous intervals).
    Files,
    /// One recording (`record`).
    Recording,
    /// The live table (`top`): nothing is written.
    Top,
}

/// Where a run writes: its formats, or with `record` the recording.
fn run_outputs(cli: &RunArgs, sink: Sink) -> Result<Vec<(Format, PathBuf)>, AppError> {
    if sink == Sink::Top {
        if cli.continuous || cli.open || !cli.format.is_empty() || cli.output.is_some() {
            return Err(AppError::Usage(
                "top shows a live table: --continuous, --open, --format and -o do not apply".into(),
            ));
        }
        if !std::io::IsTerminal::is_terminal(&std::io::stdout()) {
            return Err(AppError::Usage("top needs a terminal".into()));
        }
        return Ok(Vec::new());
    }
    let record = sink == Sink::Recording;
    if record {
        if cli.continuous {
            return Err(AppError::Usage(
                "record writes one recording: --continuous is for the main command".into(),
            ));
        }
        if !cli.format.is_empty() || cli.open {
            return Err(AppError::Usage(
                "record writes a recording: give --format and --open to convert".into(),
            ));
        }
        return Ok(Vec::new());
    }
    if cli.continuous {
        return Ok(Vec::new());
    }
    let paths = output::output_paths(cli.output.as_deref(), &cli.format);
    if cli.output.as_deref().is_some_and(output::files::is_stdout) && paths.len() > 1 {
        return Err(AppError::Usage(
            "-o - writes one format to standard output: give one --format".into(),
        ));
    }
    Ok(paths)
}

async fn run(cli: RunArgs, sink: Sink) -> Result<i32, AppError> {
    output::set_file_mode(cli.output_mode);
    let outputs = run_outputs(&cli, sink)?;
    let record = sink == Sink::Recording;
    if !cli.all && !cli.all_pythons && cli.pid.is_empty() && cli.command.is_empty() {
        return Err(AppError::Usage(
            "nothing to profile: give --all, --all-pythons, --pid PID or -- COMMAND".into(),
        ));
    }
    if !cli.command.is_empty() && (cli.all || cli.all_pythons || !cli.pid.is_empty()) {
        return Err(AppError::Usage(
            "-- COMMAND cannot be combined with --all, --all-pythons or --pid".into(),
        ));
    }
    if cli.subprocesses && cli.pid.is_empty() && cli.command.is_empty() {
        return Err(AppError::Usage(
            "--subprocesses needs --pid PID or -- COMMAND".into(),
        ));
    }
    check_environment()?;
    let rate = cli.rate.unwrap_or(if cli.continuous { 49 } else { 1000 });
    for &pid in &cli.pid {
        if pid == 0 || !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            return Err(AppError::Target(format!("no process with pid {pid}")));
        }
        if process::is_kernel_thread(pid) {
            return Err(AppError::Target(format!(
                "pid {pid} is a kernel thread: tachyon-bpf profiles user processes (--all \
                 shows kernel time too)"
            )));
        }
        if pid == std::process::id() {
            return Err(AppError::Target(format!("pid {pid} is tachyon-bpf itself")));
        }
    }
    let record_path = cli
        .output
        .clone()
        .unwrap_or_else(|| PathBuf::from("profile.tbpf"));
    let written: Vec<PathBuf> = if sink == Sink::Top {
        Vec::new()
    } else if record {
        vec![record_path.clone()]
    } else if let (true, Some(dir)) = (cli.continuous, &cli.output_dir) {
        output::files::prepare_output_dir(dir, cli.output_mode)
            .map_err(|e| AppError::Output(format!("cannot use {}: {e}", dir.display())))?;
        vec![dir.join("tachyon-probe")]
    } else {
        outputs.iter().map(|(_, p)| p.clone()).collect()
    };
    for path in &written {
        output::check_writable(path)
            .map_err(|e| AppError::Output(format!("cannot write {}: {e}", path.display())))?;
    }

    let mut capture = Capture::load(&CaptureOptions {
        all: cli.all,
        stack_size: cli.stack_size as usize,
        ring_bytes: cli.ring_mb << 20,
        offcpu: if cli.mode.needs_offcpu_stacks() {
            profiler_common::OFFCPU_STACKS
        } else {
            profiler_common::OFFCPU_TIMES
        },
        follow_children: cli.subprocesses,
        exec_all: cli.all_pythons,
        rate_hz: rate,
        force_compat: cli.compat_programs,
        full_verifier_log: cli.verbose,
    })
    .inspect_err(|e| {
        if let capture::CaptureError::Refused { log, .. } = e {
            if cli.verbose {
                eprintln!("tachyon-bpf: the verifier's log:\n{log}");
            }
        }
    })?;
    if cli.verbose {
        eprintln!(
            "tachyon-bpf: kernel {}: {} BPF programs",
            capture.kernel.release,
            capture.kernel.variant()
        );
        for (name, n) in capture.verified_insns() {
            eprintln!("tachyon-bpf: {name}: {n} instructions verified");
        }
    }
    capture.attach_lifetimes()?;
    let mut launched = if cli.command.is_empty() {
        None
    } else {
        Some(launch(&cli.command)?)
    };
    for &pid in &cli.pid {
        capture.add_target(pid)?;
    }
    if let Some(l) = &launched {
        capture.add_target(l.pid)?;
    }
    let start_ns = monotonic_ns();
    let start_epoch_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64() * 1000.0)
        .unwrap_or(0.0);
    let interval_ms = 1000.0 / rate as f64;
    let mut collector = Collector::new(
        start_ns,
        python::PythonRegistry::new(cli.show_internal),
        cli.mode,
        interval_ms,
    );
    let mut explicit: Vec<u32> = cli.pid.clone();
    if let Some(l) = &launched {
        explicit.push(l.pid);
    }
    let mut scope = Scope {
        all: cli.all,
        all_pythons: cli.all_pythons,
        explicit,
        pending: Vec::new(),
    };
    python_tick(&mut collector, &mut capture, &mut scope, true, true);
    let ring = capture.take_ring();
    // SAFETY: the ring buffer owns its map fd and neither replaces nor closes it while the
    // AsyncFd holds it.
    let mut ring = unsafe { AsyncFd::register_with_interest(ring, tokio::io::Interest::READABLE) }
        .map_err(|e| AppError::Other(format!("ring buffer: {e}")))?;
    capture.attach(rate)?;
    let started = Instant::now();

    // Let the launched command run now that sampling is on.
    let (child_tx, mut child_rx) = tokio::sync::oneshot::channel::<i32>();
    let child_pid = launched.as_ref().map(|l| l.pid);
    if let Some(l) = launched.take() {
        l.release(child_tx)
            .map_err(|e| AppError::Target(format!("cannot start {}: {e}", cli.command[0])))?;
    } else {
        drop(child_tx);
    }

    let mut sigint = signal(SignalKind::interrupt()).map_err(|e| AppError::Other(e.to_string()))?;
    let mut sigterm =
        signal(SignalKind::terminate()).map_err(|e| AppError::Other(e.to_string()))?;
    let deadline = cli
        .duration
        .map(|d| tokio::time::Instant::now() + Duration::from_secs_f64(d.max(0.0)));
    let sleep = async {
        match deadline {
            Some(d) => tokio::time::sleep_until(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(sleep);
    let has_child = !cli.command.is_empty();
    let mut child_status = None;
    // Discovery of explicit targets every 20 ms (a launched interpreter is found as soon as its
    // runtime exists), thread maps every 100 ms, a scan of every process every 240 ms.
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    let mut ticks: u64 = 0;
    // The live status line: on a terminal only, never with --quiet.
    let status =
        !cli.quiet && sink != Sink::Top && std::io::IsTerminal::is_terminal(&std::io::stderr());
    let mut continuous = match (&cli.output_dir, cli.continuous) {
        (Some(dir), true) => Some(Continuous {
            dir: dir.clone(),
            formats: cli.format.clone(),
            keep: cli.keep.map(|k| k as usize),
            pusher: cli.push.as_deref().map(|url| {
                let name = cli.push_name.clone().unwrap_or_else(|| {
                    format!(
                        "tachyon-bpf.{}{{host={}}}",
                        cli.mode.name(),
                        output::continuous::hostname()
                    )
                });
                output::continuous::Pusher::start(url, name)
            }),
            start_epoch_ms,
            started: Instant::now(),
            lost_before: 0,
            intervals: 0,
            write_failures: 0,
            samples: 0,
            kernel: capture.kernel.meta(),
            rate,
            cpus: capture.cpus.len() as u32,
            mode: cli.mode,
        }),
        _ => None,
    };
    let mut rotate_timer =
        tokio::time::interval_at(tokio::time::Instant::now() + cli.rotate, cli.rotate);
    // `top`: the live table, refreshed every second from that second's samples.
    let mut live = if sink == Sink::Top {
        let screen = top::Screen::enter().map_err(|e| AppError::Other(format!("terminal: {e}")))?;
        Some((screen, top::View::new(), top::keys()))
    } else {
        None
    };
    let mut refresh = tokio::time::interval_at(
        tokio::time::Instant::now() + Duration::from_millis(500),
        Duration::from_secs(1),
    );
    loop {
        tokio::select! {
            _ = refresh.tick(), if live.is_some() => {
                drain(ring.get_mut(), &mut collector);
                let finished = collector.rotate(monotonic_ns());
                let lost = capture.stats().0[profiler_common::STAT_LOST as usize];
                if let Some((screen, view, _)) = live.as_mut() {
                    let line = format!(
                        "tachyon-bpf top: {:.0} s, {} samples in the last second, lost {lost}, \
                         {} processes, {} threads",
                        started.elapsed().as_secs_f64(),
                        finished.counters.samples,
                        finished.all_processes().count(),
                        finished.thread_count(),
                    );
                    view.add(&finished, line);
                    let _ = view.draw(&mut screen.term);
                }
            }
            Some((code, mods)) = async {
                match live.as_mut() {
                    Some((_, _, keys)) => keys.recv().await,
                    None => std::future::pending().await,
                }
            } => {
                if let Some((screen, view, _)) = live.as_mut() {
                    view.key(code, mods);
                    if view.quit {
                        break;
                    }
                    let _ = view.draw(&mut screen.term);
                }
            }
            _ = rotate_timer.tick(), if continuous.is_some() => {
                drain(ring.get_mut(), &mut collector);
                let now_ns = monotonic_ns();
                let finished = collector.rotate(now_ns);
                let lost = capture.stats().0[profiler_common::STAT_LOST as usize];
                if let Some(c) = continuous.as_mut() {
                    c.end_interval(&finished, lost, cli.quiet);
                }
            }
            _ = tick.tick() => {
                ticks += 1;
                // Records do not wake the reader until the buffer fills up a good part: poll.
                drain(ring.get_mut(), &mut collector);
                follow_lifetimes(&mut collector, &mut capture, &mut scope, cli.subprocesses);
                // New programs are found through exec events and new processes of Python
                // programs through fork events (`follow_lifetimes`); the scan of every process
                // is the safety net, once a second (reading every process's files each time is
                // most of an idle profiler's own CPU use).
                python_tick(
                    &mut collector,
                    &mut capture,
                    &mut scope,
                    ticks.is_multiple_of(50),
                    ticks.is_multiple_of(5),
                );
                if ticks.is_multiple_of(250) {
                    collector.sweep();
                }
                if status && ticks.is_multiple_of(12) {
                    let lost = capture.stats().0[profiler_common::STAT_LOST as usize];
                    let line = output::summary::status_line(
                        &collector.profile,
                        started.elapsed().as_secs_f64(),
                        lost,
                        capture.cpus.len(),
                        rate,
                    );
                    eprint!("\r\x1b[2K{line}");
                }
            }
            guard = ring.readable_mut() => {
                let mut guard = guard.map_err(|e| AppError::Other(format!("ring buffer: {e}")))?;
                drain(guard.get_inner_mut(), &mut collector);
                guard.clear_ready();
                follow_lifetimes(&mut collector, &mut capture, &mut scope, cli.subprocesses);
            }
            _ = &mut sleep => break,
            _ = sigint.recv() => break,
            _ = sigterm.recv() => break,
            st = &mut child_rx, if has_child && child_status.is_none() => {
                child_status = st.ok();
                break;
            }
        }
    }
    // A second Ctrl-C while the profile is written exits at once. A plain signal handler, not
    // a task: the writing below holds this (single-threaded) runtime until it is done.
    drop(sigint);
    exit_on_second_interrupt();
    // The command tachyon-bpf started ends with the profiling (-d, Ctrl-C, SIGTERM), as perf
    // ends its workload: SIGTERM, then SIGKILL after a second.
    if let (Some(pid), None) = (child_pid, child_status) {
        end_command(pid, &mut child_rx).await;
    }
    if status {
        eprint!("\r\x1b[2K");
    }
    if live.take().is_some() {
        // The terminal is restored; nothing is written.
        capture.detach();
        return Ok(0);
    }
    capture.detach();
    let elapsed = started.elapsed();
    let end_ns = monotonic_ns();
    drain(ring.get_mut(), &mut collector);
    collector.finish(end_ns);
    let (stats, lost_per_cpu) = capture.stats();
    let lost = stats[profiler_common::STAT_LOST as usize];

    let run = RunInfo {
        run_id: uuid::Uuid::new_v4().simple().to_string(),
        start_epoch_ms,
        interval_ms,
        duration_ms: elapsed.as_secs_f64() * 1000.0,
        mode: cli.mode.name().into(),
        rate_hz: rate,
        command: std::env::args().collect::<Vec<_>>().join(" "),
        lost,
        cpus: capture.cpus.len() as u32,
        cost: Some(output::Cost::measure(capture.bpf_cost())),
        kernel: Some(capture.kernel.meta()),
    };
    if let Some(c) = continuous.as_mut() {
        // The last, partial interval is written too: nothing collected is lost.
        c.end_interval(&collector.profile, lost, cli.quiet);
    } else if record {
        let bytes =
            output::recording::to_bytes(&collector.profile, &run).map_err(AppError::Other)?;
        output::write_atomic(&record_path, &bytes).map_err(|e| {
            AppError::Output(format!("cannot write {}: {e}", record_path.display()))
        })?;
    } else {
        output::write_outputs(&collector.profile, &run, &outputs).map_err(AppError::Output)?;
    }
    if !cli.quiet {
        let c = &collector.profile.counters;
        let secs = elapsed.as_secs_f64().max(1e-9);
        let lost_str: Vec<String> = lost_per_cpu
            .iter()
            .map(|(cpu, n)| format!("cpu{cpu} {n}"))
            .collect();
        if let Some(k) = &continuous {
            // The counters start again each interval: the run's totals are the intervals'.
            eprintln!(
                "tachyon-bpf: {secs:.2} s, {} samples ({:.0}/s at {} Hz on {} CPUs) in {} \
                 intervals, lost {} ({})",
                k.samples,
                k.samples as f64 / secs,
                rate,
                capture.cpus.len(),
                k.intervals,
                lost,
                lost_str.join(", "),
            );
        } else {
            eprintln!(
                "tachyon-bpf: {secs:.2} s, {} samples on CPU ({:.0}/s at {} Hz on {} CPUs) and \
                 {} off-CPU captures, lost {} ({}), truncated {}, bad records {}, {} processes, \
                 {} threads",
                c.samples,
                c.samples as f64 / secs,
                rate,
                capture.cpus.len(),
                c.offcpu_captures,
                lost,
                lost_str.join(", "),
                c.native_truncated,
                c.bad_records,
                collector.profile.all_processes().count(),
                collector.profile.thread_count(),
            );
        }
        if let Some(cost) = &run.cost {
            let n = continuous.as_ref().map_or(c.samples, |k| k.samples);
            eprintln!("tachyon-bpf: {}", cost.line(n));
        }
        if c.max_lag_ms > output::summary::LAG_WARN_MS {
            eprintln!(
                "tachyon-bpf: warning: the reader fell behind by up to {:.1} s (samples were \
                 processed late: a larger --ring-mb or a lower --rate keeps up)",
                c.max_lag_ms / 1000.0
            );
        }
        if c.py_samples > 0 {
            eprintln!(
                "tachyon-bpf: python: {} records of Python threads (samples and off-CPU captures), {} merged, {} merge mismatches, {} thread misses, {} read failures, {} truncated",
                c.py_samples, c.py_merged, c.py_merge_mismatch, c.py_thread_miss, c.py_read_failed, c.py_truncated
            );
            let bad = c.py_unresolved_frames + c.py_cycles + c.py_bad_line_tables;
            if bad > 0 {
                eprintln!(
                    "tachyon-bpf: python: unreadable target data: {} unresolved code objects, {} looping frame chains, {} corrupt line tables",
                    c.py_unresolved_frames, c.py_cycles, c.py_bad_line_tables
                );
            }
        }
        if continuous.is_none() {
            for l in output::summary::lines(&collector.profile, 5) {
                eprintln!("tachyon-bpf: {l}");
            }
        }
        if let Some(c) = &continuous {
            eprintln!(
                "tachyon-bpf: {} interval profiles in {} ({} samples)",
                c.intervals,
                c.dir.display(),
                c.samples
            );
        } else {
            report_written(&written);
        }
    }
    let continuous_done = continuous
        .as_ref()
        .map(|c| (c.intervals, c.write_failures, c.dir.clone()));
    if let Some(p) = continuous.and_then(|c| c.pusher) {
        let stats = p.stats.clone();
        p.finish(Duration::from_secs(5));
        if !cli.quiet {
            let k = stats.counts();
            eprintln!(
                "tachyon-bpf: pushed {} intervals, {} failed, {} dropped (endpoint too slow), \
                 {} not sent by exit",
                k.sent, k.failed, k.dropped, k.abandoned
            );
        }
    }
    if let Some(c) = &continuous_done {
        if c.0 == 0 && c.1 > 0 {
            return Err(AppError::Output(format!(
                "none of the {} interval profiles could be written to {}",
                c.1,
                c.2.display()
            )));
        }
    }
    if let Some(code) = child_status {
        if code != 0 && !cli.quiet {
            eprintln!("tachyon-bpf: the command exited with status {code}");
        }
    }
    if cli.open {
        open_in_browser(&collector.profile, &run).await?;
    }
    Ok(0)
}

/// A continuous run: where intervals go and what has been written.
struct Continuous {
    dir: PathBuf,
    formats: Vec<Format>,
    keep: Option<usize>,
    pusher: Option<output::continuous::Pusher>,
    /// When the current interval started.
    start_epoch_ms: f64,
    started: Instant,
    /// Samples lost before the current interval (the kernel counts from the start).
    lost_before: u64,
    intervals: u64,
    /// Intervals that could not be written.
    write_failures: u64,
    /// Samples of every interval.
    samples: u64,
    rate: u64,
    cpus: u32,
    mode: Mode,
    kernel: output::KernelMeta,
}

impl Continuous {
    /// Writes a finished interval (and queues its push), then starts the next one. A failed
    /// write is reported and profiling goes on.
    fn end_interval(&mut self, p: &aggregate::Profile, lost_total: u64, quiet: bool) {
        if p.counters.samples == 0 {
            // Nothing sampled (an idle host, or the sliver of an interval at the end).
            self.start_epoch_ms = output::continuous::epoch_ms();
            self.started = Instant::now();
            self.lost_before = lost_total;
            return;
        }
        let run = RunInfo {
            run_id: uuid::Uuid::new_v4().simple().to_string(),
            start_epoch_ms: self.start_epoch_ms,
            interval_ms: 1000.0 / self.rate as f64,
            duration_ms: self.started.elapsed().as_secs_f64() * 1000.0,
            mode: self.mode.name().into(),
            rate_hz: self.rate,
            command: std::env::args().collect::<Vec<_>>().join(" "),
            lost: lost_total.saturating_sub(self.lost_before),
            cpus: self.cpus,
            cost: None,
            kernel: Some(self.kernel.clone()),
        };
        match output::continuous::write_interval(&self.dir, p, &run, &self.formats, self.keep) {
            Ok(_) => {
                self.intervals += 1;
                self.samples += p.counters.samples;
            }
            Err(e) => {
                self.write_failures += 1;
                eprintln!("tachyon-bpf: {e}");
            }
        }
        if let Some(pusher) = &self.pusher {
            match Format::Pprof.render(p, &run) {
                Ok(bytes) => pusher.push(
                    bytes,
                    run.start_epoch_ms,
                    run.start_epoch_ms + run.duration_ms,
                ),
                Err(e) => eprintln!("tachyon-bpf: pprof for {}: {e}", pusher.name()),
            }
        }
        if !quiet {
            log::info!("interval written: {} samples", p.counters.samples);
        }
        self.start_epoch_ms = output::continuous::epoch_ms();
        self.started = Instant::now();
        self.lost_before = lost_total;
    }
}

fn report_written(paths: &[PathBuf]) {
    for p in paths {
        let hint = match p.extension().and_then(|e| e.to_str()) {
            Some("json") => " (open it at https://profiler.firefox.com/, or with --open)",
            Some("tbpf") => " (tachyon-bpf convert it to any format)",
            _ => "",
        };
        eprintln!("tachyon-bpf: wrote {}{hint}", p.display());
    }
}

/// Serves the Gecko profile to profiler.firefox.com until Ctrl-C or SIGTERM.
async fn open_in_browser(p: &aggregate::Profile, run: &RunInfo) -> Result<(), AppError> {
    let bytes = Format::Gecko.render(p, run).map_err(AppError::Other)?;
    let served = output::serve::start(bytes).map_err(AppError::Output)?;
    println!("{}", served.link);
    eprintln!(
        "tachyon-bpf: serving the profile to profiler.firefox.com from 127.0.0.1; Ctrl-C stops"
    );
    output::serve::try_browser(&served.link);
    let mut sigint = signal(SignalKind::interrupt()).map_err(|e| AppError::Other(e.to_string()))?;
    let mut sigterm =
        signal(SignalKind::terminate()).map_err(|e| AppError::Other(e.to_string()))?;
    tokio::select! {
        _ = sigint.recv() => {}
        _ = sigterm.recv() => {}
    }
    drop(served);
    Ok(())
}

async fn convert(args: ConvertArgs) -> Result<i32, AppError> {
    output::set_file_mode(args.output_mode);
    let (mut profile, mut run) = output::recording::load(&args.input).map_err(AppError::Input)?;
    if let Some(mode) = args.mode {
        output::recording::select_mode(&mut profile, &mut run, mode).map_err(AppError::Usage)?;
    }
    let base = args.output.clone().unwrap_or_else(|| {
        let s = args.input.to_string_lossy();
        PathBuf::from(s.strip_suffix(".tbpf").unwrap_or(&s).to_string())
    });
    let outputs = if args.output.is_none() && args.format.len() <= 1 {
        // One format, no -o: the recording's name with the format's extension.
        let f = args.format.first().copied().unwrap_or(Format::Gecko);
        vec![(
            f,
            PathBuf::from(format!("{}.{}", base.display(), f.extension())),
        )]
    } else {
        output::output_paths(Some(&base), &args.format)
    };
    output::write_outputs(&profile, &run, &outputs).map_err(AppError::Output)?;
    if !args.quiet {
        let paths: Vec<PathBuf> = outputs.into_iter().map(|(_, p)| p).collect();
        report_written(&paths);
    }
    if args.open {
        open_in_browser(&profile, &run).await?;
    }
    Ok(0)
}

/// What the run profiles, for Python discovery.
struct Scope {
    all: bool,
    all_pythons: bool,
    explicit: Vec<u32>,
    /// Processes that exec'd during an --all-pythons run, looked at on every tick for a while.
    pending: Vec<(u32, Instant)>,
}

fn list_pids() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Finds new Python processes (every call for explicit targets; with `scan`, every process for
/// --all/--all-pythons), and keeps each Python process's thread map in the BPF program current.
fn python_tick(
    collector: &mut Collector,
    capture: &mut Capture,
    scope: &mut Scope,
    scan: bool,
    refresh_threads: bool,
) {
    let me = std::process::id();
    // Exec'd processes stay pending until found, known not to be Python, gone, or two seconds
    // old (the periodic scan looks at them from then on).
    scope.pending.retain(|&(pid, since)| {
        !collector.python.procs.contains_key(&pid)
            && !collector.python.finally_not_python(pid)
            && since.elapsed() < Duration::from_secs(2)
            && std::path::Path::new(&format!("/proc/{pid}")).exists()
    });
    let mut candidates: Vec<u32> = scope.explicit.clone();
    candidates.extend(scope.pending.iter().map(|p| p.0));
    if scan && (scope.all || scope.all_pythons) {
        candidates.extend(list_pids().into_iter().filter(|&p| p != me));
    }
    let mut found = Vec::new();
    for pid in candidates {
        if collector.python.procs.contains_key(&pid) || collector.python.known_not_python(pid) {
            continue;
        }
        if !python::maps_mention_python(pid) {
            continue;
        }
        let elves = &mut collector.elves;
        let proc = collector
            .procs
            .entry(pid)
            .or_insert_with(|| process::Process::new(pid, ""));
        proc.reload_maps(elves);
        // Just exec'd (or launched): its libraries may still be loading.
        let young = scope
            .pending
            .iter()
            .any(|&(p, since)| p == pid && since.elapsed() < Duration::from_secs(1))
            || (scope.explicit.contains(&pid)
                && python::process_age(pid).is_some_and(|a| a < Duration::from_secs(1)));
        if let Some(cfg) = collector.python.try_add(proc, young) {
            if let Err(e) = capture.set_py_proc(pid, &cfg) {
                log::warn!("pid {pid}: {e}");
            }
            if scope.all_pythons {
                let _ = capture.add_target(pid);
            }
            found.push(pid);
        }
    }
    // Thread maps (at once for new processes), and processes that are gone.
    let pids: Vec<u32> = if refresh_threads {
        collector.python.procs.keys().copied().collect()
    } else {
        found
    };
    for pid in pids {
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            if let Some(p) = collector.python.procs.get(&pid) {
                for &tid in p.threads.keys() {
                    capture.remove_py_thread(pid, tid);
                }
            }
            capture.remove_py_proc(pid);
            collector.python.forget(pid);
            continue;
        }
        let Some(p) = collector.python.procs.get_mut(&pid) else {
            continue;
        };
        let now = p.current_threads();
        for (&tid, &ts) in &now {
            if p.threads.get(&tid) != Some(&ts) {
                let _ = capture.set_py_thread(pid, tid, ts);
            }
        }
        for &tid in p.threads.keys() {
            if !now.contains_key(&tid) {
                capture.remove_py_thread(pid, tid);
            }
        }
        p.threads = now;
    }
}

/// New processes looked at on every tick at most (a fork storm waits for the periodic scan).
const MAX_PENDING: usize = 256;

/// Acts on execs and new children the collector saw: a process that exec'd loses its Python
/// state (the BPF side must not walk the old program's layout) and is looked at again; with
/// --subprocesses, children become explicit targets.
fn follow_lifetimes(
    collector: &mut Collector,
    capture: &mut Capture,
    scope: &mut Scope,
    subprocesses: bool,
) {
    for pid in std::mem::take(&mut collector.execs) {
        if let Some(p) = collector.python.procs.get(&pid) {
            for &tid in p.threads.keys() {
                capture.remove_py_thread(pid, tid);
            }
            capture.remove_py_proc(pid);
        }
        collector.python.forget(pid);
        if (scope.all_pythons || scope.all)
            && !scope.explicit.contains(&pid)
            && scope.pending.len() < MAX_PENDING
        {
            // Looked at on every tick until its runtime shows up (or it proves not Python).
            scope.pending.push((pid, Instant::now()));
        }
    }
    for pid in std::mem::take(&mut collector.children) {
        if subprocesses && !scope.explicit.contains(&pid) {
            scope.explicit.push(pid);
        } else if (scope.all_pythons || scope.all) && scope.pending.len() < MAX_PENDING {
            // A forked worker of a Python server is Python without an exec.
            scope.pending.push((pid, Instant::now()));
        }
    }
}

/// Records per code-object validation epoch (a few ms of samples at high rates).
const EPOCH_RECORDS: u32 = 256;

fn drain(ring: &mut aya::maps::RingBuf<aya::maps::MapData>, collector: &mut Collector) {
    let mut n = 0u32;
    collector.python.new_epoch();
    while let Some(item) = ring.next() {
        n += 1;
        if n.is_multiple_of(EPOCH_RECORDS) {
            collector.python.new_epoch();
        }
        match Record::parse(&item) {
            Ok(Record::Sample(s)) => {
                drop(item);
                collector.handle(s);
            }
            Ok(Record::Event(e)) => {
                drop(item);
                collector.handle_event(e);
            }
            Err(e) => {
                log::debug!("bad record: {e}");
                collector.profile.counters.bad_records += 1;
            }
        }
    }
}
