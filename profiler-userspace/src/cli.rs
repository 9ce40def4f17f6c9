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

/// The run options `top` refuses or has no use for (it draws a live table: no files, no
/// intervals, no export): left out of its help.
pub const TOP_REFUSES: &[&str] = &[
    "output",
    "format",
    "open",
    "file_mode",
    "continuous",
    "rotate",
    "output_dir",
    "keep",
    "push",
    "push_name",
    "otlp",
    "labels",
    "env_labels",
];

/// The run options `record` refuses or has no use for (it writes one recording, which
/// `convert` writes in formats): left out of its help.
pub const RECORD_REFUSES: &[&str] = &[
    "format",
    "open",
    "continuous",
    "rotate",
    "output_dir",
    "keep",
    "push",
    "push_name",
];

fn hide_all(mut c: clap::Command, ids: &[&str]) -> clap::Command {
    for id in ids {
        c = c.mut_arg(*id, |a| a.hide(true));
    }
    c
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

/// Sample every CPU and write where processes spend their time: Python, native and kernel
/// frames, GIL and CPU state, as a Firefox Profiler profile or any other format.
#[derive(Parser, Debug)]
#[command(
    name = "tachyon-bpf",
    version,
    long_version = LONG_VERSION,
    about,
    after_help = "Needs Linux 5.10 or newer with BTF, and root or the capabilities CAP_BPF, \
                  CAP_PERFMON, CAP_SYS_PTRACE, CAP_DAC_READ_SEARCH and CAP_SYSLOG. Under sudo, \
                  the files written and -- COMMAND belong to the user who ran it. More: \
                  man tachyon-bpf.",
    args_conflicts_with_subcommands = true,
    mut_subcommand("top", |c| hide_all(c, TOP_REFUSES)),
    mut_subcommand("record", |c| hide_all(c, RECORD_REFUSES)
        .mut_arg("output", |a| a.help("The recording's file (default profile.tbpf)"))),
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
    Record(RunArgs),
    /// Write a recording in other formats: no root needed, its processes may be gone.
    Convert(ConvertArgs),
    /// A live table of the hottest functions (last 10 s), with GIL waits; q quits.
    Top(RunArgs),
    /// Print every thread's merged Python, native and kernel stack once, with its GIL and CPU
    /// state, without pausing the process.
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

#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// Profile every process on the host.
    #[arg(help_heading = "Target", long, conflicts_with_all = ["pid", "all_pythons"], env = "TACHYON_BPF_ALL")]
    pub all: bool,
    /// Profile every Python process on the host, including ones started during the run.
    #[arg(
        help_heading = "Target",
        long,
        conflicts_with = "pid",
        env = "TACHYON_BPF_ALL_PYTHONS"
    )]
    pub all_pythons: bool,
    /// Profile this process, all its threads (repeatable).
    #[arg(
        help_heading = "Target",
        short,
        long = "pid",
        value_name = "PID",
        env = "TACHYON_BPF_PID",
        value_delimiter = ','
    )]
    pub pid: Vec<u32>,
    /// Samples per second on each CPU [default: 1000, or 49 with --continuous].
    #[arg(help_heading = "Sampling", short, long, value_parser = clap::value_parser!(u64).range(1..=100_000), env = "TACHYON_BPF_RATE")]
    pub rate: Option<u64>,
    /// Stop after this long: seconds, or with a unit (30, 30s, 5m; default: until Ctrl-C, the
    /// command exits, or every --pid process has exited).
    #[arg(help_heading = "Sampling", short, long, value_name = "DURATION", value_parser = parse_secs, env = "TACHYON_BPF_DURATION")]
    pub duration: Option<f64>,
    /// Output file (default profile.json, or profile.<ext> for another format); with several
    /// formats, the base name each format adds its extension to.
    #[arg(help_heading = "Output", short, long, env = "TACHYON_BPF_OUTPUT")]
    pub output: Option<PathBuf>,
    /// Output formats, comma-separated: gecko (Firefox Profiler), collapsed (folded stacks),
    /// jsonl (CPython sampler JSONL), pprof, flamegraph (SVG), pstats (Python's pstats.Stats),
    /// heatmap (HTML: Python source lines shaded by their samples).
    #[arg(help_heading = "Output", short, long, value_parser = format_parser(), value_delimiter = ',', env = "TACHYON_BPF_FORMAT")]
    pub format: Vec<Format>,
    /// Serve the profile to profiler.firefox.com from 127.0.0.1 and print its link (until Ctrl-C).
    #[arg(help_heading = "Output", long, env = "TACHYON_BPF_OPEN")]
    pub open: bool,
    /// Permissions of the files written, in octal (profiles name every user's code paths).
    #[arg(help_heading = "Output", long, alias = "output-mode", value_name = "OCTAL", default_value = "600", value_parser = parse_mode, env = "TACHYON_BPF_FILE_MODE")]
    pub file_mode: u32,
    /// Profile until stopped, writing one profile per --rotate interval into --output-dir.
    #[arg(help_heading = "Continuous", long, requires = "output_dir", conflicts_with_all = ["output", "open", "command"], env = "TACHYON_BPF_CONTINUOUS")]
    pub continuous: bool,
    /// With --continuous: the length of each profile (60, 60s, 5m).
    #[arg(help_heading = "Continuous", long, value_parser = parse_rotate, default_value = "60s", requires = "continuous", env = "TACHYON_BPF_ROTATE")]
    pub rotate: Duration,
    /// With --continuous: the directory the interval profiles go to (created if missing).
    #[arg(
        help_heading = "Continuous",
        long,
        value_name = "DIR",
        env = "TACHYON_BPF_OUTPUT_DIR"
    )]
    pub output_dir: Option<PathBuf>,
    /// With --continuous: keep only the newest N intervals' files.
    #[arg(help_heading = "Continuous", long, value_name = "N", requires = "continuous", value_parser = clap::value_parser!(u64).range(1..), env = "TACHYON_BPF_KEEP")]
    pub keep: Option<u64>,
    /// With --continuous: send each interval's pprof to this Pyroscope-compatible server
    /// (POST URL/ingest?name=...&from=...&until=...&format=pprof), retrying with back-off.
    #[arg(help_heading = "Continuous", long, value_name = "URL", requires = "continuous", value_parser = parse_push_url, env = "TACHYON_BPF_PUSH")]
    pub push: Option<String>,
    /// The application name pushed (default tachyon-bpf.MODE{host=HOSTNAME}).
    #[arg(
        help_heading = "Continuous",
        long,
        value_name = "NAME",
        requires = "push",
        env = "TACHYON_BPF_PUSH_NAME"
    )]
    pub push_name: Option<String>,
    /// Send the profile to this OpenTelemetry receiver as OTLP/HTTP (the profiles signal, at
    /// URL/v1development/profiles unless URL ends in /profiles): at the end of the run, or with
    /// --continuous each interval.
    #[arg(help_heading = "Output", long, value_name = "URL", value_parser = parse_push_url, env = "TACHYON_BPF_OTLP")]
    pub otlp: Option<String>,
    /// A label given to every process's samples (e.g. cluster=eu-1), in every format and push
    /// (repeatable). Names are letters, digits and _, not starting with a digit.
    #[arg(help_heading = "Output", long = "label", value_name = "NAME=VALUE", value_parser = parse_label, env = "TACHYON_BPF_LABELS", value_delimiter = ',')]
    pub labels: Vec<(String, String)>,
    /// Copy this environment variable of each profiled process into its labels, when it has it
    /// (repeatable). Only the variables named are read of a process's environment.
    #[arg(help_heading = "Output", long = "env-label", value_name = "VAR", value_parser = parse_env_var, env = "TACHYON_BPF_ENV_LABELS", value_delimiter = ',')]
    pub env_labels: Vec<String>,
    /// Bytes of user stack copied per sample for DWARF unwinding (4096-65536): only the part in
    /// use is copied, so the limit costs only the deep stacks that need it (nested imports
    /// under Python 3.12 go past 32 KiB).
    #[arg(help_heading = "Sampling", long, default_value_t = 65536, value_parser = clap::value_parser!(u64).range(4096..=65536), env = "TACHYON_BPF_STACK_SIZE")]
    pub stack_size: u64,
    /// Ring buffer size in MiB.
    #[arg(help_heading = "Sampling", long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=1024), env = "TACHYON_BPF_RING_MB")]
    pub ring_mb: u32,
    /// What to count: wall (on- and off-CPU time of every thread, idle ones included), cpu
    /// (on-CPU time), gil (time holding the GIL), exception (time with an exception raised or
    /// handled), all (the same samples as wall, each with all its states). A wall or all
    /// recording converts to any other mode (`convert -m`).
    #[arg(help_heading = "Sampling", short, long, value_parser = mode_parser(), default_value = "wall", env = "TACHYON_BPF_MODE")]
    pub mode: Mode,
    /// With --pid or -- COMMAND: also profile the processes they start, and theirs.
    #[arg(help_heading = "Target", long, env = "TACHYON_BPF_SUBPROCESSES")]
    pub subprocesses: bool,
    /// Show interpreter-internal native frames between Python frames.
    #[arg(help_heading = "Python", long, env = "TACHYON_BPF_SHOW_INTERNAL")]
    pub show_internal: bool,
    /// Name the bytecode instruction each sample's innermost Python frame runs (specialized
    /// form included): Opcode markers in the Firefox Profiler, `file:func:line:OPNAME` in
    /// collapsed stacks, an opcode per frame in JSONL.
    #[arg(help_heading = "Python", long, env = "TACHYON_BPF_OPCODES")]
    pub opcodes: bool,
    /// running (the default when no value is given): show each sample of a thread that runs an asyncio event loop from the task it
    /// runs, under `<task> NAME` frames of that task and of each task awaiting it, outermost
    /// first, instead of under the loop's machinery (Python 3.11+; others are shown plain).
    /// all: that, and every suspended task's await chain, sampled every 100 ms on a
    /// pseudo-thread of its loop, weighted with the time it stood for (a wall-time view).
    #[arg(help_heading = "Python", long, value_name = "WHICH", num_args = 0..=1, default_missing_value = "running", value_parser = ["running", "all"], env = "TACHYON_BPF_ASYNC_AWARE")]
    pub async_aware: Option<String>,
    /// No summary on stderr.
    #[arg(help_heading = "General", short, long, env = "TACHYON_BPF_QUIET")]
    pub quiet: bool,
    /// Load the BPF programs made for kernels older than 5.18 even on a newer one (the kernel's
    /// BTF chooses otherwise; this is for comparing the two, and for kernels that misreport).
    #[arg(long, hide = true)]
    pub compat_programs: bool,
    /// Log failures inside the BPF programs, with the pid, tid and address involved: a user
    /// stack or registers unreadable, a Python thread state not found, a frame chain cut or
    /// looping, a record dropped. The first 4 of each kind per CPU are logged, the rest counted.
    #[arg(help_heading = "Sampling", long, env = "TACHYON_BPF_DEBUG_BPF")]
    pub debug_bpf: bool,
    /// Print more: the kernel's whole verifier log when it refuses a program.
    #[arg(help_heading = "General", short, long, env = "TACHYON_BPF_VERBOSE")]
    pub verbose: bool,
    /// Run -- COMMAND as root under sudo. By default it runs as the user who ran sudo
    /// (SUDO_UID, SUDO_GID), with their groups and home, as it would without the profiler.
    #[arg(help_heading = "Target", long, env = "TACHYON_BPF_RUN_AS_ROOT")]
    pub run_as_root: bool,
    /// Command to launch and profile until it exits.
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<String>,
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
    #[arg(long, alias = "output-mode", value_name = "OCTAL", default_value = "600", value_parser = parse_mode)]
    pub file_mode: u32,
    /// Nothing on stderr but errors.
    #[arg(short, long)]
    pub quiet: bool,
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
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, String> {
        Cli::try_parse_from(std::iter::once("tachyon-bpf").chain(args.iter().copied()))
            .map_err(|e| e.to_string())
    }

    #[test]
    fn every_run_option_has_its_variable_and_the_help_names_it() {
        use clap::CommandFactory;
        let mut cmd = Cli::command();
        let help = cmd.render_long_help().to_string();
        let mut n = 0;
        for a in cmd.get_arguments() {
            let id = a.get_id().as_str();
            if a.is_hide_set() || a.is_positional() || matches!(id, "help" | "version") {
                continue;
            }
            let want = format!("TACHYON_BPF_{}", id.to_ascii_uppercase());
            let env = a.get_env().map(|e| e.to_string_lossy().into_owned());
            assert_eq!(env.as_deref(), Some(want.as_str()), "--{id}");
            assert!(
                help.contains(&format!("[env: {want}")),
                "--help names {want}"
            );
            n += 1;
        }
        assert!(n >= 25, "{n} options");
    }

    #[test]
    fn each_subcommand_lists_only_what_it_takes() {
        use clap::CommandFactory;
        let mut cmd = Cli::command();
        let long = |id: &str| format!("--{}", id.replace('_', "-"));
        for (sub, refused) in [("top", TOP_REFUSES), ("record", RECORD_REFUSES)] {
            let help = cmd
                .find_subcommand_mut(sub)
                .unwrap()
                .render_long_help()
                .to_string();
            for id in refused {
                let flag = long(id);
                // An option's own line: its names, before its value and description.
                let listed = help.lines().any(|l| {
                    let l = l.trim_start();
                    l.starts_with('-')
                        && l.split("  ")
                            .next()
                            .unwrap_or("")
                            .split([' ', ','])
                            .any(|w| w == flag)
                });
                assert!(!listed, "{sub} --help lists {flag}:\n{help}");
            }
            for shown in ["--pid", "--all-pythons", "--rate", "--duration", "--mode"] {
                assert!(help.contains(shown), "{sub} --help lacks {shown}");
            }
            // Grouped under headings.
            for h in ["Target:", "Sampling:", "Python:"] {
                assert!(help.contains(h), "{sub} --help has no {h} heading:\n{help}");
            }
        }
        let record = cmd
            .find_subcommand_mut("record")
            .unwrap()
            .render_long_help()
            .to_string();
        assert!(record.contains("profile.tbpf") && !record.contains("profile.json"));
        // The main command lists everything, grouped.
        let main = cmd.render_long_help().to_string();
        for h in [
            "Target:",
            "Sampling:",
            "Python:",
            "Output:",
            "Continuous:",
            "General:",
        ] {
            assert!(main.contains(h), "no {h}");
        }
        assert!(main.contains("--continuous") && main.contains("--format"));
    }

    /// The DaemonSet under `contrib/` configures the profiler by variables alone: each must be
    /// an option's, with a value the option takes.
    #[test]
    fn the_daemonset_sets_only_variables_the_options_take() {
        use clap::CommandFactory;
        let yaml = include_str!("../../contrib/kubernetes/tachyon-bpf.yaml");
        let cmd = Cli::command();
        let mut args = vec!["tachyon-bpf".to_string()];
        let mut n = 0;
        for line in yaml.lines() {
            let Some(rest) = line.trim().strip_prefix("- {name: TACHYON_BPF_") else {
                continue;
            };
            let (name, value) = rest.split_once(", value: ").expect("name and value");
            let value = value.trim_end_matches('}').trim_matches('"');
            let var = format!("TACHYON_BPF_{name}");
            let arg = cmd
                .get_arguments()
                .find(|a| a.get_env().is_some_and(|e| e == var.as_str()))
                .unwrap_or_else(|| panic!("{var} is no option's variable"));
            let long = format!("--{}", arg.get_long().unwrap());
            if !arg.get_action().takes_values() {
                assert_eq!(value, "true", "{var}");
                args.push(long);
            } else {
                args.push(format!("{long}={value}"));
            }
            n += 1;
        }
        assert!(n >= 8, "{n} variables");
        // The same settings given as options parse, as the variables would.
        Cli::try_parse_from(&args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
    }

    #[test]
    fn durations_take_seconds_or_units_alike() {
        for (d, secs) in [
            ("30", 30.0),
            ("30s", 30.0),
            ("0.5", 0.5),
            ("5m", 300.0),
            ("1h", 3600.0),
        ] {
            let c = parse(&["--all", "-d", d]).unwrap();
            assert_eq!(c.run.duration, Some(secs), "-d {d}");
        }
        for (r, secs) in [("60", 60), ("60s", 60), ("5m", 300)] {
            let c = parse(&[
                "--all-pythons",
                "--continuous",
                "--output-dir",
                "/tmp/x",
                "--rotate",
                r,
            ])
            .unwrap();
            assert_eq!(c.run.rotate, Duration::from_secs(secs), "--rotate {r}");
        }
        for bad in ["0", "0s", "abc", "2y", "nan", "inf"] {
            let e = parse(&["--all", "-d", bad]).unwrap_err();
            assert!(e.contains("is not a duration"), "{bad}: {e}");
        }
        let e = parse(&[
            "--all-pythons",
            "--continuous",
            "--output-dir",
            "x",
            "--rotate",
            "0.5",
        ])
        .unwrap_err();
        assert!(e.contains("at least 1s"), "{e}");
    }

    #[test]
    fn async_aware_takes_the_same_values_everywhere() {
        let c = parse(&["--all-pythons", "--async-aware"]).unwrap();
        assert_eq!(c.run.async_aware.as_deref(), Some("running"));
        let c = parse(&["--all-pythons", "--async-aware", "all"]).unwrap();
        assert_eq!(c.run.async_aware.as_deref(), Some("all"));
        let c = parse(&["--async-aware", "--", "python3", "app.py"]).unwrap();
        assert_eq!(c.run.async_aware.as_deref(), Some("running"));
        assert_eq!(c.run.command, ["python3", "app.py"]);
        for (args, want) in [
            (&["dump", "-p", "1", "--async-aware"][..], "running"),
            (&["dump", "-p", "1", "--async-aware", "all"][..], "all"),
            (&["dump", "--async-aware", "-p", "1"][..], "running"),
        ] {
            let Some(Cmd::Dump(d)) = parse(args).unwrap().cmd else {
                panic!("dump")
            };
            assert_eq!(d.async_aware.as_deref(), Some(want), "{args:?}");
        }
    }

    #[test]
    fn file_mode_keeps_its_old_name() {
        assert_eq!(
            parse(&["--all", "--file-mode", "640"])
                .unwrap()
                .run
                .file_mode,
            0o640
        );
        assert_eq!(
            parse(&["--all", "--output-mode", "644"])
                .unwrap()
                .run
                .file_mode,
            0o644
        );
    }

    #[test]
    fn modes_and_formats_by_name() {
        let c = parse(&["--all", "-m", "cpu", "-f", "gecko,pprof"]).unwrap();
        assert_eq!(c.run.mode, Mode::Cpu);
        assert_eq!(c.run.format, vec![Format::Gecko, Format::Pprof]);
        assert_eq!(parse(&["--all"]).unwrap().run.mode, Mode::Wall);
        let e = parse(&["--all", "-m", "walls"]).unwrap_err();
        assert!(
            e.contains("possible values: wall, cpu, gil, exception, all"),
            "{e}"
        );
        assert!(parse(&["--all", "-f", "svg"]).is_err());
        let Some(Cmd::Convert(c)) = parse(&["convert", "x.tbpf", "-m", "gil"]).unwrap().cmd else {
            panic!("not convert")
        };
        assert_eq!(c.mode, Some(Mode::Gil));
    }

    #[test]
    fn values_out_of_range_are_refused() {
        assert!(parse_secs("-1").is_err());
        assert!(parse_secs("NaN").is_err());
        assert!(parse_secs("1e12").is_err());
        assert_eq!(parse_secs("2.5"), Ok(2.5));
        assert!(parse_rotate("0s").is_err());
        assert_eq!(parse_rotate("5m"), Ok(Duration::from_secs(300)));
        assert!(parse_push_url("file:///etc/passwd").is_err());
        assert!(parse_push_url("http://").is_err());
        assert!(parse_push_url("https://pyroscope.example:4040").is_ok());
        assert_eq!(parse_mode("640"), Ok(0o640));
        assert!(parse_mode("1777").is_err() && parse_mode("9").is_err());
        assert!(parse(&["--all", "-r", "0"]).is_err());
        assert!(parse(&["--all", "--stack-size", "100"]).is_err());
    }
}
