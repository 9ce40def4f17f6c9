//! The command line: clap's derive structs and the value parsers. The domain types (`Mode`,
//! `Format`) know nothing of clap; their names are offered here.

use std::path::PathBuf;
use std::time::Duration;

use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::Parser;
use tachyon_bpf::aggregate::Mode;
use tachyon_bpf::output::Format;

fn mode_parser() -> impl TypedValueParser<Value = Mode> {
    PossibleValuesParser::new(Mode::ALL.map(Mode::name))
        .map(|s| Mode::from_name(&s).expect("a possible value"))
}

fn format_parser() -> impl TypedValueParser<Value = Format> {
    PossibleValuesParser::new(Format::ALL.map(Format::name))
        .map(|s| Format::from_name(&s).expect("a possible value"))
}

/// `--version`: the build, and what it runs on (`-V` says the version alone).
const LONG_VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    "\ncommit ",
    env!("TACHYON_BPF_COMMIT"),
    ", built for ",
    env!("TACHYON_BPF_TARGET"),
    "\nkernels: Linux 5.10 or newer with BTF, x86_64 and aarch64",
    "\nPython: CPython 3.8 to 3.15 (free-threaded builds: native stacks only)"
);

/// `--help`'s closing: examples, then where to read more.
const MAIN_EXAMPLES: &str = "\
Examples:
  sudo tachyon-bpf -- python3 app.py             profile a command until it exits: profile.json
  sudo tachyon-bpf -p PID -d 30 -f flamegraph    a running process for 30 s: profile.svg
  sudo tachyon-bpf --all-pythons -d 10 --open    every Python process, opened in the Firefox Profiler
  sudo tachyon-bpf -m cpu -p PID -d 30s          on-CPU time only (wall, the default, counts idle
                                                 threads too)
  sudo tachyon-bpf -p PID -f pprof,flamegraph -o out -d 1m
                                                 out.pb.gz and out.svg
  sudo tachyon-bpf --all-pythons --continuous --output-dir /var/lib/tachyon -f pprof \\
      --push http://pyroscope:4040 --label cluster=eu-1
                                                 always on: one profile a minute, pushed

Every option can also be set by its TACHYON_BPF_* variable; the command line wins.
Needs Linux 5.10 or newer with BTF, and root or the capabilities CAP_BPF, CAP_PERFMON,
CAP_SYS_PTRACE, CAP_DAC_READ_SEARCH and CAP_SYSLOG. Under sudo, the files written and
-- COMMAND belong to the user who ran it (--run-as-root keeps root for the command).
Exit codes: 0 written, 2 bad command line, 3 privilege, 4 kernel, 5 target, 6 output,
7 recording, 1 anything else.
More: man tachyon-bpf, and the guide: docs/ in the tarball, /usr/share/doc/tachyon-bpf/docs
from the package.";

const RECORD_EXAMPLES: &str = "\
Examples:
  sudo tachyon-bpf record -o run.tbpf -- python3 app.py
  sudo tachyon-bpf record -m all -p PID -d 30 -o run.tbpf
  tachyon-bpf convert run.tbpf -f pprof,flamegraph     later, anywhere, without root";

const CONVERT_EXAMPLES: &str = "\
Examples:
  tachyon-bpf convert run.tbpf                       run.json, for the Firefox Profiler
  tachyon-bpf convert run.tbpf -f pprof -m cpu       on-CPU time of a wall recording
  tachyon-bpf convert new.tbpf --diff-against old.tbpf
                                                     new.diff.svg: red grew, blue shrank";

const TOP_EXAMPLES: &str = "\
Examples:
  sudo tachyon-bpf top --all-pythons
  sudo tachyon-bpf top -p PID -m cpu

Keys: n switches between Python functions and every function (native and kernel), up/down
and Enter show the native code a row runs, s/t/g sort by self/total/GIL wait, p cycles the
process filter, q quits.";

const DUMP_EXAMPLES: &str = "\
Examples:
  sudo tachyon-bpf dump -p PID
  sudo tachyon-bpf dump -p PID --json
  sudo tachyon-bpf dump -p PID --async-aware all     also every asyncio task where it waits";

/// Sample every CPU and write where processes spend their time: Python, native and kernel
/// frames, GIL and CPU state, as a Firefox Profiler profile or any other format.
#[derive(Parser, Debug)]
#[command(
    name = "tachyon-bpf",
    version,
    long_version = LONG_VERSION,
    about,
    after_help = "More with --help: examples, every option's TACHYON_BPF_* variable.",
    after_long_help = MAIN_EXAMPLES,
    args_conflicts_with_subcommands = true,
    mut_subcommand("record", |c| c.mut_arg("output", |a| a
        .help("The recording's file (default profile.tbpf)")
        .long_help("The recording's file (default profile.tbpf); `convert` writes it in any \
                    format later"))),
)]
pub struct Cli {
    /// For packagers: write the man page (`man`) or a shell's completion script (`bash`, `zsh`,
    /// `fish`) to standard output.
    #[arg(long, hide = true, value_name = "WHAT", exclusive = true,
          value_parser = ["man", "bash", "zsh", "fish"])]
    pub generate: Option<String>,
    #[command(subcommand)]
    pub cmd: Option<Cmd>,
    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(clap::Subcommand, Debug)]
pub enum Cmd {
    /// Profile as the main command does, and store the run in one file (-o, default
    /// profile.tbpf) that `convert` writes in any format later.
    #[command(after_long_help = RECORD_EXAMPLES)]
    Record(RecordArgs),
    /// Write a recording in other formats: no root needed, its processes may be gone.
    #[command(after_long_help = CONVERT_EXAMPLES)]
    Convert(ConvertArgs),
    /// A live table of the hottest functions (last 10 s), with GIL waits; q quits.
    #[command(after_long_help = TOP_EXAMPLES)]
    Top(TopArgs),
    /// Print every thread's merged Python, native and kernel stack once, with its GIL and CPU
    /// state, without pausing the process.
    #[command(after_long_help = DUMP_EXAMPLES)]
    Dump(DumpArgs),
}

#[derive(clap::Args, Debug)]
pub struct DumpArgs {
    /// The process.
    #[arg(short, long = "pid", value_name = "PID")]
    pub pid: u32,
    /// JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// running (the default when no value is given): show each thread that runs an asyncio
    /// event loop from the task it runs. all: that, and every suspended task of the process's
    /// event loops, each with its await chain (Python 3.11+).
    #[arg(long, value_name = "WHICH", num_args = 0..=1, default_missing_value = "running",
          require_equals = false, value_parser = ["running", "all"])]
    pub async_aware: Option<String>,
}

/// What to profile (every subcommand that samples takes it).
#[derive(clap::Args, Debug, Default)]
#[command(next_help_heading = "Target")]
pub struct TargetArgs {
    /// Profile every process on the host.
    #[arg(long, conflicts_with_all = ["pid", "all_pythons"], env = "TACHYON_BPF_ALL")]
    pub all: bool,
    /// Profile every Python process on the host, including ones started during the run.
    #[arg(long, conflicts_with = "pid", env = "TACHYON_BPF_ALL_PYTHONS")]
    pub all_pythons: bool,
    /// Profile this process, all its threads (repeatable).
    #[arg(
        short,
        long = "pid",
        value_name = "PID",
        env = "TACHYON_BPF_PID",
        value_delimiter = ','
    )]
    pub pid: Vec<u32>,
    /// With --pid or -- COMMAND: also profile the processes they start, and theirs.
    #[arg(long, env = "TACHYON_BPF_SUBPROCESSES")]
    pub subprocesses: bool,
    /// Run -- COMMAND as root under sudo.
    ///
    /// By default a command launched under sudo runs as the user who ran sudo (SUDO_UID,
    /// SUDO_GID), with their groups and home, as it would without the profiler.
    #[arg(long, env = "TACHYON_BPF_RUN_AS_ROOT")]
    pub run_as_root: bool,
    /// Command to launch and profile until it exits.
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// How and what to sample.
#[derive(clap::Args, Debug)]
#[command(next_help_heading = "Sampling")]
pub struct SamplingArgs {
    /// Samples per second on each CPU [default: 1000, or 49 with --continuous].
    ///
    /// A rate whose period is a whole number of milliseconds, or divides one, would sample in
    /// step with the kernel's tick: its period is made 1/64 ms longer (1000 Hz samples every
    /// 1.015625 ms). The profile's interval is the period used.
    #[arg(short, long, value_parser = clap::value_parser!(u64).range(1..=100_000), env = "TACHYON_BPF_RATE")]
    pub rate: Option<u64>,
    /// Stop after this long: 30, 30s, 5m.
    ///
    /// Seconds, or with a unit. Without it the run lasts until Ctrl-C or SIGTERM, the
    /// command's exit, or the exit of every --pid process.
    #[arg(short, long, value_name = "DURATION", value_parser = parse_secs, env = "TACHYON_BPF_DURATION")]
    pub duration: Option<f64>,
    /// What to count: wall (every thread, idle ones included), cpu, gil, exception, all.
    ///
    /// wall: on- and off-CPU time of every thread, idle ones included. cpu: on-CPU time.
    /// gil: time holding the GIL. exception: time with an exception raised or handled. all:
    /// the same samples as wall, each with all its states. A wall or all recording converts to
    /// any other mode (`convert -m`).
    #[arg(short, long, value_parser = mode_parser(), default_value = "wall", env = "TACHYON_BPF_MODE")]
    pub mode: Mode,
    /// Bytes of user stack copied per sample for DWARF unwinding (4096-65536).
    ///
    /// Only the part in use is copied, so the limit costs only the deep stacks that need it
    /// (nested imports under Python 3.12 go past 32 KiB).
    #[arg(hide_short_help = true, long, default_value_t = 65536, value_parser = clap::value_parser!(u64).range(4096..=65536), env = "TACHYON_BPF_STACK_SIZE")]
    pub stack_size: u64,
    /// Ring buffer size in MiB [default: 8 to 32, by rate and CPUs].
    ///
    /// By default, room for a second of samples of 8 KiB each (the average record on a web
    /// service's stacks) on every CPU, at least 8 MiB (off-CPU captures come in bursts) and at
    /// most 32: 8 MiB at 49 Hz on a small host, 16 at 1 kHz on 2 CPUs, 32 on 4 or more. The
    /// ring is kernel memory, locked, and counted twice in the profiler's RSS (it is mapped
    /// twice).
    #[arg(hide_short_help = true, long, value_parser = clap::value_parser!(u32).range(1..=1024), env = "TACHYON_BPF_RING_MB")]
    pub ring_mb: Option<u32>,
    /// Log failures inside the BPF programs.
    ///
    /// A user stack or registers unreadable, a Python thread state not found, a frame chain
    /// cut or looping, a record dropped, each with the pid, tid and address involved. The
    /// first 4 of each kind per CPU are logged, the rest counted.
    #[arg(hide_short_help = true, long, env = "TACHYON_BPF_DEBUG_BPF")]
    pub debug_bpf: bool,
    /// Load the BPF programs made for kernels older than 5.18 even on a newer one (the kernel's
    /// BTF chooses otherwise; this is for comparing the two, and for kernels that misreport).
    #[arg(long, hide = true)]
    pub compat_programs: bool,
}

/// What to show of Python.
#[derive(clap::Args, Debug, Default)]
#[command(next_help_heading = "Python")]
pub struct PythonArgs {
    /// Show interpreter-internal native frames between Python frames.
    #[arg(long, env = "TACHYON_BPF_SHOW_INTERNAL")]
    pub show_internal: bool,
    /// Name the bytecode instruction each sample's innermost Python frame runs.
    ///
    /// The specialized form included: Opcode markers in the Firefox Profiler,
    /// `file:func:line:OPNAME` in collapsed stacks, an opcode per frame in JSONL.
    #[arg(long, env = "TACHYON_BPF_OPCODES")]
    pub opcodes: bool,
    /// asyncio (3.11+): show samples from the task the loop runs (running, the default), or
    /// also every suspended task (all).
    ///
    /// running: show each sample of a thread that runs an asyncio event loop from the task it
    /// runs, under `<task> NAME` frames of that task and of each task awaiting it, outermost
    /// first, instead of under the loop's machinery (Python 3.11+; others are shown plain).
    /// all: that, and every suspended task's await chain, sampled every 100 ms on a
    /// pseudo-thread of its loop, weighted with the time it stood for (a wall-time view).
    #[arg(long, value_name = "WHICH", num_args = 0..=1, default_missing_value = "running", value_parser = ["running", "all"], env = "TACHYON_BPF_ASYNC_AWARE")]
    pub async_aware: Option<String>,
}

/// The file a run writes, and what goes with it (the main command and `record`).
#[derive(clap::Args, Debug)]
#[command(next_help_heading = "Output")]
pub struct FileArgs {
    /// Output file (default profile.json, or profile.<ext> for another format).
    ///
    /// With several formats, the base name each format adds its extension to. `-o -` writes
    /// one format to standard output.
    #[arg(short, long, env = "TACHYON_BPF_OUTPUT")]
    pub output: Option<PathBuf>,
    /// Permissions of the files written, in octal (profiles name every user's code paths).
    #[arg(hide_short_help = true, long, alias = "output-mode", value_name = "OCTAL", default_value = DEFAULT_FILE_MODE, value_parser = parse_mode, env = "TACHYON_BPF_FILE_MODE")]
    pub file_mode: u32,
    /// Send the profile to this OpenTelemetry receiver as OTLP/HTTP.
    ///
    /// The profiles signal, at URL/v1development/profiles unless URL ends in /profiles: at
    /// the end of the run, or with --continuous each interval.
    #[arg(long, value_name = "URL", value_parser = parse_push_url, env = "TACHYON_BPF_OTLP")]
    pub otlp: Option<String>,
    /// A label given to every process's samples, e.g. cluster=eu-1 (repeatable).
    ///
    /// In every format and push. Names are letters, digits and _, not starting with a digit.
    #[arg(long = "label", value_name = "NAME=VALUE", value_parser = parse_label, env = "TACHYON_BPF_LABELS", value_delimiter = ',')]
    pub labels: Vec<(String, String)>,
    /// Copy this environment variable of each profiled process into its labels (repeatable).
    ///
    /// Only the variables named are read of a process's environment.
    #[arg(long = "env-label", value_name = "VAR", value_parser = parse_env_var, env = "TACHYON_BPF_ENV_LABELS", value_delimiter = ',')]
    pub env_labels: Vec<String>,
}

/// The formats a run writes (the main command only: `record` writes a recording).
#[derive(clap::Args, Debug, Default)]
#[command(next_help_heading = "Output")]
pub struct FormatArgs {
    /// Output formats, comma-separated: gecko (default), pprof, flamegraph, collapsed, jsonl,
    /// pstats, heatmap.
    ///
    /// gecko (Firefox Profiler), collapsed (folded stacks), jsonl (CPython sampler JSONL),
    /// pprof, flamegraph (SVG), pstats (Python's pstats.Stats), heatmap (HTML: Python source
    /// lines shaded by their samples).
    #[arg(short, long, value_parser = format_parser(), value_delimiter = ',', env = "TACHYON_BPF_FORMAT")]
    pub format: Vec<Format>,
    /// Serve the profile to profiler.firefox.com from 127.0.0.1 and print its link (until Ctrl-C).
    #[arg(long, env = "TACHYON_BPF_OPEN")]
    pub open: bool,
}

/// Profiling until stopped, one profile per interval (the main command only).
#[derive(clap::Args, Debug)]
#[command(next_help_heading = "Continuous")]
pub struct ContinuousArgs {
    /// Profile until stopped, writing one profile per --rotate interval into --output-dir.
    #[arg(long, requires = "output_dir", conflicts_with_all = ["output", "open", "command"], env = "TACHYON_BPF_CONTINUOUS")]
    pub continuous: bool,
    /// With --continuous: the length of each profile (60, 60s, 5m).
    #[arg(long, value_parser = parse_rotate, default_value = DEFAULT_ROTATE, requires = "continuous", env = "TACHYON_BPF_ROTATE")]
    pub rotate: Duration,
    /// With --continuous: the directory the interval profiles go to (created if missing).
    #[arg(long, value_name = "DIR", env = "TACHYON_BPF_OUTPUT_DIR")]
    pub output_dir: Option<PathBuf>,
    /// With --continuous: keep only the newest N intervals' files.
    #[arg(long, value_name = "N", requires = "continuous", value_parser = clap::value_parser!(u64).range(1..), env = "TACHYON_BPF_KEEP")]
    pub keep: Option<u64>,
    /// With --continuous: send each interval's pprof to this Pyroscope-compatible server.
    ///
    /// POST URL/ingest?name=...&from=...&until=...&format=pprof, one series per service and
    /// container, retrying with back-off.
    #[arg(long, value_name = "URL", requires = "continuous", value_parser = parse_push_url, env = "TACHYON_BPF_PUSH")]
    pub push: Option<String>,
    /// The application name pushed, for every process (default: one series per service,
    /// SERVICE.MODE{host=HOSTNAME,...}).
    #[arg(
        hide_short_help = true,
        long,
        value_name = "NAME",
        requires = "push",
        env = "TACHYON_BPF_PUSH_NAME"
    )]
    pub push_name: Option<String>,
}

/// Options every sampling subcommand takes.
#[derive(clap::Args, Debug, Default)]
#[command(next_help_heading = "General")]
pub struct GeneralArgs {
    /// No summary on stderr.
    #[arg(short, long, env = "TACHYON_BPF_QUIET")]
    pub quiet: bool,
    /// Print more: the BPF program set loaded, and the kernel's whole verifier log when it
    /// refuses a program.
    #[arg(short, long, env = "TACHYON_BPF_VERBOSE")]
    pub verbose: bool,
}

/// `--file-mode`'s default, in octal.
const DEFAULT_FILE_MODE: &str = "600";
/// `--rotate`'s default.
const DEFAULT_ROTATE: &str = "60s";

impl Default for FileArgs {
    fn default() -> Self {
        FileArgs {
            output: None,
            file_mode: parse_mode(DEFAULT_FILE_MODE).expect("a valid default"),
            otlp: None,
            labels: Vec::new(),
            env_labels: Vec::new(),
        }
    }
}

impl Default for SamplingArgs {
    fn default() -> Self {
        SamplingArgs {
            rate: None,
            duration: None,
            mode: Mode::Wall,
            stack_size: 65536,
            ring_mb: None,
            debug_bpf: false,
            compat_programs: false,
        }
    }
}

impl Default for ContinuousArgs {
    fn default() -> Self {
        ContinuousArgs {
            continuous: false,
            rotate: parse_rotate(DEFAULT_ROTATE).expect("a valid default"),
            output_dir: None,
            keep: None,
            push: None,
            push_name: None,
        }
    }
}

/// The main command's options: every group. `top` and `record` take fewer groups (their
/// own structs, so clap refuses what they do not take), and become a `RunArgs` with the
/// others at their defaults.
#[derive(clap::Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub python: PythonArgs,
    #[command(flatten)]
    pub file: FileArgs,
    #[command(flatten)]
    pub formats: FormatArgs,
    #[command(flatten)]
    pub continuous: ContinuousArgs,
    #[command(flatten)]
    pub general: GeneralArgs,
}

/// `top`: a live table, so no files, formats or intervals.
#[derive(clap::Args, Debug)]
pub struct TopArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub python: PythonArgs,
    #[command(flatten)]
    pub general: GeneralArgs,
}

/// `record`: one recording file, which `convert` writes in formats.
#[derive(clap::Args, Debug)]
pub struct RecordArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub python: PythonArgs,
    #[command(flatten)]
    pub file: FileArgs,
    #[command(flatten)]
    pub general: GeneralArgs,
}

impl From<TopArgs> for RunArgs {
    fn from(a: TopArgs) -> RunArgs {
        RunArgs {
            target: a.target,
            sampling: a.sampling,
            python: a.python,
            file: FileArgs::default(),
            formats: FormatArgs::default(),
            continuous: ContinuousArgs::default(),
            general: a.general,
        }
    }
}

/// How long `dump` samples: every running thread is sampled within a few of its ticks.
pub const DUMP_WINDOW_SECS: f64 = 0.2;

impl From<&DumpArgs> for RunArgs {
    /// `dump`'s run: its process in wall mode for `DUMP_WINDOW_SECS`, quietly.
    fn from(a: &DumpArgs) -> RunArgs {
        let top = TopArgs {
            target: TargetArgs {
                pid: vec![a.pid],
                ..TargetArgs::default()
            },
            sampling: SamplingArgs {
                duration: Some(DUMP_WINDOW_SECS),
                mode: Mode::Wall,
                ..SamplingArgs::default()
            },
            python: PythonArgs {
                async_aware: a.async_aware.clone(),
                ..PythonArgs::default()
            },
            general: GeneralArgs {
                quiet: true,
                verbose: false,
            },
        };
        top.into()
    }
}

impl From<RecordArgs> for RunArgs {
    fn from(a: RecordArgs) -> RunArgs {
        let common = TopArgs {
            target: a.target,
            sampling: a.sampling,
            python: a.python,
            general: a.general,
        };
        RunArgs {
            file: a.file,
            ..common.into()
        }
    }
}

#[derive(clap::Args, Debug)]
pub struct ConvertArgs {
    /// A recording made by `tachyon-bpf record`.
    pub input: PathBuf,
    /// Output formats, comma-separated (default gecko).
    #[arg(short, long, value_parser = format_parser(), value_delimiter = ',')]
    pub format: Vec<Format>,
    /// Output file, or with several formats the base name (default: the recording's name).
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    /// Count another mode than the recording's (from a wall or all recording).
    #[arg(short, long, value_parser = mode_parser())]
    pub mode: Option<Mode>,
    /// Compare with an earlier recording: a differential flame graph (red: a larger share than
    /// in the baseline, blue: a smaller one) or folded stacks with both counts (`-f collapsed`).
    #[arg(long, value_name = "BASELINE.tbpf")]
    pub diff_against: Option<PathBuf>,
    /// Serve the Gecko profile to profiler.firefox.com from 127.0.0.1 (until Ctrl-C).
    #[arg(long)]
    pub open: bool,
    /// Permissions of the files written, in octal.
    #[arg(long, alias = "output-mode", value_name = "OCTAL", default_value = DEFAULT_FILE_MODE, value_parser = parse_mode)]
    pub file_mode: u32,
    /// Nothing on stderr but errors.
    #[arg(short, long)]
    pub quiet: bool,
}

/// The command line as clap reads it. `-h` (before any `--`) shows the short help: the
/// common options, without each one's variable, which `--help` names with the rest.
pub fn parse() -> Result<Cli, clap::Error> {
    use clap::{CommandFactory, FromArgMatches};
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let short = args
        .iter()
        .skip(1)
        .take_while(|a| *a != "--")
        .any(|a| a == "-h");
    let mut cmd = Cli::command();
    if short {
        cmd = without_env(cmd);
    }
    Cli::from_arg_matches(&cmd.try_get_matches_from(args)?)
}

fn without_env(c: clap::Command) -> clap::Command {
    c.mut_args(|a| a.hide_env(true))
        .mut_subcommands(without_env)
}

/// The longest `-d`: a year (longer is a typo, and would overflow the timers).
pub const MAX_SECS: f64 = 365.0 * 24.0 * 3600.0;

/// A duration as `-d` and `--rotate` take it: seconds (`30`, `0.5`) or with a unit (`30s`,
/// `5m`, `1h 30m`); each caller bounds it.
fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    match t.parse::<f64>() {
        Ok(v) if v.is_finite() && (0.0..=MAX_SECS).contains(&v) => Ok(Duration::from_secs_f64(v)),
        Ok(_) => Err(format!(
            "{s:?} is not a duration: more than 0 and at most a year, in seconds or with a unit \
             (30s, 5m)"
        )),
        Err(_) => humantime::parse_duration(t)
            .map_err(|e| format!("{s:?} is not a duration ({e}): give 30, 30s, 5m or 1h")),
    }
}

fn parse_secs(s: &str) -> Result<f64, String> {
    let d = parse_duration(s)?;
    if d.is_zero() || d.as_secs_f64() > MAX_SECS {
        return Err(format!(
            "{s:?} is not a duration: more than 0 and at most a year"
        ));
    }
    Ok(d.as_secs_f64())
}

fn parse_rotate(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
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

/// A label name as backends accept it (Pyroscope's and Prometheus's rule).
fn valid_label_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 128
        && !n.starts_with(|c: char| c.is_ascii_digit())
        && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Labels the profiler sets itself: `--label` cannot replace them.
const OWN_LABELS: &[&str] = &[
    "pid",
    "tid",
    "process",
    "thread",
    "service_name",
    "container_id",
    "pod_uid",
    "systemd_unit",
    "host",
];

/// `--label NAME=VALUE`.
fn parse_label(s: &str) -> Result<(String, String), String> {
    let (n, v) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?} is not NAME=VALUE"))?;
    if !valid_label_name(n) {
        return Err(format!(
            "{n:?} is not a label name: letters, digits and _, not starting with a digit"
        ));
    }
    if OWN_LABELS.contains(&n) {
        return Err(format!("{n:?} is a label tachyon-bpf sets itself"));
    }
    if v.is_empty() || v.len() > 256 || v.chars().any(char::is_control) {
        return Err(format!(
            "the value of {n:?} must be 1 to 256 bytes without control characters"
        ));
    }
    Ok((n.to_string(), v.to_string()))
}

/// `--env-label VAR`: an environment variable's name.
fn parse_env_var(s: &str) -> Result<String, String> {
    if s.is_empty() || s.len() > 128 || s.contains('=') || s.chars().any(|c| c.is_control()) {
        return Err(format!("{s:?} is not an environment variable's name"));
    }
    Ok(s.to_string())
}

fn parse_mode(s: &str) -> Result<u32, String> {
    u32::from_str_radix(s, 8)
        .ok()
        .filter(|m| *m <= 0o777)
        .ok_or_else(|| format!("{s:?} is not an octal file mode such as 600 or 640"))
}

#[cfg(test)]
mod tests;
