//! Where a run's samples go. Each way of running (profile files, a recording, continuous
//! intervals, the live `top` table) is one `Sink`; the event loop (`run.rs`) knows none of them.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use tachyon_bpf::aggregate::{Counters, Mode, Profile};
use tachyon_bpf::output::{self, Format, RunInfo};
use tachyon_bpf::top;

use crate::cli::RunArgs;
use crate::error::{other, output as output_err, usage, AppError, Kind};

/// A key typed in `top`.
pub type Key = (top::KeyCode, top::KeyModifiers);

pub trait Sink {
    /// How often the sink wants the samples so far as a finished profile (`None`: only the
    /// whole run, at the end).
    fn interval(&self) -> Option<Duration> {
        None
    }
    /// A finished interval (every `interval()`). `run` describes the run so far (`lost`
    /// counts from its start); `elapsed` is the time since sampling started.
    fn take_interval(&mut self, _p: &Profile, _run: &RunInfo, _elapsed: Duration) {}
    /// Sampling starts: the sink may take over the terminal, and hands out the user's key
    /// presses if it reads them (only `top` does).
    fn start(&mut self) -> Result<Option<tokio::sync::mpsc::UnboundedReceiver<Key>>, AppError> {
        Ok(None)
    }
    /// A key press: true ends the run.
    fn key(&mut self, _key: Key) -> bool {
        false
    }
    /// Whether the run ends with a written profile and a summary (`top` ends with neither).
    fn writes(&self) -> bool {
        true
    }
    /// Whether what the sink writes shows each thread's CPU use over time (the Firefox
    /// Profiler's CPU graph and its On/Off CPU markers): in cpu mode, nothing else needs the
    /// scheduler's accounting, whose program runs on every context switch of the host.
    fn shows_cpu_use(&self) -> bool {
        true
    }
    /// Whether stderr may carry the live status line.
    fn status_line(&self) -> bool {
        true
    }
    /// Writes the run (what is left of it, for interval sinks).
    fn finish(&mut self, p: &Profile, run: &RunInfo) -> Result<(), AppError>;
    /// The summary's first line is about these many samples (the run's, or every interval's).
    fn samples(&self, p: &Profile) -> u64 {
        p.counters.samples
    }
    /// The run's counters, for the summary: `p`'s, or every interval's together.
    fn counters(&self, p: &Profile) -> Counters {
        p.counters.clone()
    }
    /// Intervals written, for the summary (`None`: not an interval sink).
    fn intervals(&self) -> Option<u64> {
        None
    }
    /// Says what was written (unless --quiet), and ends anything still running (uploads).
    fn report(self: Box<Self>, quiet: bool) -> Result<(), AppError>;
    /// `dump`: the threads that were read from outside rather than sampled.
    fn read_from_memory(&mut self, _tids: std::collections::HashSet<u32>) {}
}

/// `dump`: prints each thread's stack once on standard output.
pub struct Dump {
    json: bool,
    from_memory: std::collections::HashSet<u32>,
}

impl Dump {
    pub fn new(json: bool) -> Dump {
        Dump {
            json,
            from_memory: Default::default(),
        }
    }
}

impl Sink for Dump {
    fn status_line(&self) -> bool {
        false
    }
    fn read_from_memory(&mut self, tids: std::collections::HashSet<u32>) {
        self.from_memory.extend(tids);
    }
    fn finish(&mut self, p: &Profile, _run: &RunInfo) -> Result<(), AppError> {
        use std::io::Write;
        let text = if self.json {
            serde_json::to_string_pretty(&tachyon_bpf::output::dump::json(p, &self.from_memory))
                .map_err(|e| other(e.to_string()))?
                + "\n"
        } else {
            tachyon_bpf::output::dump::text(p, &self.from_memory)
        };
        std::io::stdout()
            .write_all(text.as_bytes())
            .map_err(|e| output_err(format!("standard output: {e}")))
    }
    fn report(self: Box<Self>, _quiet: bool) -> Result<(), AppError> {
        Ok(())
    }
}

/// Checks that `path` can be written, before anything is loaded.
fn writable(path: &std::path::Path) -> Result<(), AppError> {
    output::check_writable(path)
        .map_err(|e| output_err(format!("cannot write {}: {e}", path.display())))
}

pub fn report_written(paths: &[PathBuf]) {
    for p in paths {
        let hint = match p.extension().and_then(|e| e.to_str()) {
            Some("json") => " (open it at https://profiler.firefox.com/, or with --open)",
            Some("tbpf") => " (tachyon-bpf convert it to any format)",
            _ => "",
        };
        eprintln!("tachyon-bpf: wrote {}{hint}", p.display());
    }
}

/// The chosen formats, written once at the end.
pub struct Files {
    outputs: Vec<(Format, PathBuf)>,
    write: output::WriteOptions,
}

/// The command line's choices that no sink can take, checked before anything else.
pub fn check_usage(cli: &RunArgs, top: bool) -> Result<(), AppError> {
    // What `top` and `record` do not take, clap refuses: they have no such options.
    if top {
        if !std::io::IsTerminal::is_terminal(&std::io::stdout()) {
            return Err(usage("top needs a terminal"));
        }
    } else if !cli.continuous.continuous
        && cli
            .file
            .output
            .as_deref()
            .is_some_and(tachyon_bpf::files::is_stdout)
        && output::output_paths(cli.file.output.as_deref(), &cli.formats.format).len() > 1
    {
        return Err(usage(
            "-o - writes one format to standard output: give one --format",
        ));
    } else if !cli.continuous.continuous
        && cli
            .file
            .output
            .as_deref()
            .is_some_and(tachyon_bpf::files::is_stdout)
        && cli.formats.format.iter().any(|f| f.is_directory())
    {
        // Said before profiling, not after: the run's profile would be lost.
        return Err(usage(
            "-o -: heatmap is a directory of pages and cannot go to standard output",
        ));
    }
    Ok(())
}

impl Files {
    pub fn new(cli: &RunArgs) -> Result<Files, AppError> {
        let outputs = output::output_paths(cli.file.output.as_deref(), &cli.formats.format);
        for (f, p) in &outputs {
            if f.is_directory() {
                output::check_dir_writable(p)
                    .map_err(|e| output_err(format!("cannot write {}: {e}", p.display())))?;
            } else {
                writable(p)?;
            }
        }
        Ok(Files {
            outputs,
            write: output::WriteOptions::with_mode(cli.file.file_mode),
        })
    }
}

impl Sink for Files {
    fn shows_cpu_use(&self) -> bool {
        self.outputs.iter().any(|(f, _)| *f == Format::Gecko)
    }
    fn finish(&mut self, p: &Profile, run: &RunInfo) -> Result<(), AppError> {
        Ok(output::write_outputs(p, run, &self.outputs, self.write)?)
    }
    fn report(self: Box<Self>, quiet: bool) -> Result<(), AppError> {
        if !quiet {
            let paths: Vec<PathBuf> = self.outputs.into_iter().map(|(_, p)| p).collect();
            report_written(&paths);
        }
        Ok(())
    }
}

/// One recording (`record`).
pub struct Recording {
    path: PathBuf,
    write: output::WriteOptions,
}

impl Recording {
    pub fn new(cli: &RunArgs) -> Result<Recording, AppError> {
        let path = cli
            .file
            .output
            .clone()
            .unwrap_or_else(|| PathBuf::from("profile.tbpf"));
        writable(&path)?;
        Ok(Recording {
            path,
            write: output::WriteOptions::with_mode(cli.file.file_mode),
        })
    }
}

impl Sink for Recording {
    fn finish(&mut self, p: &Profile, run: &RunInfo) -> Result<(), AppError> {
        let bytes = output::recording::to_bytes(p, run)?;
        output::write_atomic(&self.path, &bytes, self.write)
            .map_err(|e| output_err(format!("cannot write {}: {e}", self.path.display())))
    }
    fn report(self: Box<Self>, quiet: bool) -> Result<(), AppError> {
        if !quiet {
            report_written(&[self.path]);
        }
        Ok(())
    }
}

/// The live table (`top`): refreshed every second from that second's samples; nothing is
/// written.
pub struct Top {
    /// Entered when sampling starts (`start`): errors before it print on a plain terminal.
    screen: Option<top::Screen>,
    view: top::View,
}

impl Top {
    pub fn new() -> Top {
        Top {
            screen: None,
            view: top::View::new(),
        }
    }

    fn draw(&mut self) {
        if let Some(screen) = self.screen.as_mut() {
            let _ = self.view.draw(&mut screen.term);
        }
    }
}

impl Sink for Top {
    fn shows_cpu_use(&self) -> bool {
        false
    }
    fn interval(&self) -> Option<Duration> {
        Some(Duration::from_secs(1))
    }
    fn take_interval(&mut self, p: &Profile, run: &RunInfo, elapsed: Duration) {
        // The view adds the processes and threads sampled in its window.
        let line = format!(
            "tachyon-bpf top: {:.0} s, {} samples in the last second, lost {}",
            elapsed.as_secs_f64(),
            p.counters.samples,
            run.lost,
        );
        self.view.add(p, line);
        self.draw();
    }
    fn start(&mut self) -> Result<Option<tokio::sync::mpsc::UnboundedReceiver<Key>>, AppError> {
        self.screen = Some(top::Screen::enter().map_err(|e| other(format!("terminal: {e}")))?);
        Ok(Some(top::keys()))
    }
    fn key(&mut self, (code, mods): Key) -> bool {
        self.view.key(code, mods);
        if !self.view.quit {
            self.draw();
        }
        self.view.quit
    }
    fn writes(&self) -> bool {
        false
    }
    fn status_line(&self) -> bool {
        false
    }
    fn finish(&mut self, _p: &Profile, _run: &RunInfo) -> Result<(), AppError> {
        Ok(())
    }
    fn report(self: Box<Self>, _quiet: bool) -> Result<(), AppError> {
        // Dropping the screen restores the terminal.
        Ok(())
    }
}

/// Lets an OTLP pusher's queue go out (5 s at most), then says what became of it.
pub fn report_otlp(p: output::continuous::Pusher, quiet: bool) {
    let stats = p.stats.clone();
    p.finish(Duration::from_secs(5));
    if !quiet {
        let k = stats.counts();
        eprintln!(
            "tachyon-bpf: OTLP: sent {} profiles, {} failed, {} dropped (receiver too slow), {} \
             not sent by exit",
            k.sent, k.failed, k.dropped, k.abandoned
        );
    }
}

/// A continuous run: one profile per --rotate interval into --output-dir, optionally pushed.
pub struct Continuous {
    dir: PathBuf,
    write: output::WriteOptions,
    formats: Vec<Format>,
    keep: Option<usize>,
    rotate: Duration,
    pusher: Option<output::continuous::Pusher>,
    /// `--otlp`: each interval to an OTLP receiver too.
    otlp: Option<output::continuous::Pusher>,
    quiet: bool,
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
    /// Every interval's counters together (each profile's start again from zero), written or
    /// not: what the summary says of the run.
    counters: Counters,
    mode: Mode,
}

impl Continuous {
    pub fn new(cli: &RunArgs) -> Result<Continuous, AppError> {
        let dir = cli
            .continuous
            .output_dir
            .clone()
            .ok_or_else(|| usage("--continuous needs --output-dir"))?;
        tachyon_bpf::files::prepare_output_dir(&dir, cli.file.file_mode)
            .map_err(|e| output_err(format!("cannot use {}: {e}", dir.display())))?;
        writable(&dir.join("tachyon-probe"))?;
        Ok(Continuous {
            write: output::WriteOptions::with_mode(cli.file.file_mode),
            dir,
            formats: cli.formats.format.clone(),
            keep: cli.continuous.keep.map(|k| k as usize),
            rotate: cli.continuous.rotate,
            pusher: cli.continuous.push.as_deref().map(|url| {
                output::continuous::Pusher::start(
                    url,
                    output::continuous::Destination::Pyroscope {
                        name: cli.continuous.push_name.clone(),
                    },
                )
            }),
            otlp: cli.file.otlp.as_deref().map(|url| {
                output::continuous::Pusher::start(url, output::continuous::Destination::Otlp)
            }),
            quiet: cli.general.quiet,
            start_epoch_ms: output::continuous::epoch_ms(),
            started: Instant::now(),
            lost_before: 0,
            intervals: 0,
            write_failures: 0,
            samples: 0,
            counters: Counters::default(),
            mode: cli.sampling.mode,
        })
    }

    /// Writes a finished interval (and queues its push), then starts the next one. A failed
    /// write is reported and profiling goes on. `template` is the run so far.
    fn end_interval(&mut self, p: &Profile, template: &RunInfo) {
        self.counters.add(&p.counters);
        let lost_total = template.lost;
        if p.counters.samples > 0 {
            let run = RunInfo {
                run_id: uuid::Uuid::new_v4().simple().to_string(),
                start_epoch_ms: self.start_epoch_ms,
                duration_ms: self.started.elapsed().as_secs_f64() * 1000.0,
                mode: self.mode.name().into(),
                lost: lost_total.saturating_sub(self.lost_before),
                cost: None,
                ..template.clone()
            };
            match output::continuous::write_interval(
                &self.dir,
                p,
                &run,
                &self.formats,
                self.keep,
                self.write,
            ) {
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
                pusher.push(p, &run);
            }
            if let Some(otlp) = &self.otlp {
                otlp.push(p, &run);
            }
            if !self.quiet {
                log::info!("interval written: {} samples", p.counters.samples);
            }
        }
        // Nothing sampled (an idle host, or the sliver of an interval at the end): nothing
        // written, and the next interval starts now all the same.
        self.start_epoch_ms = output::continuous::epoch_ms();
        self.started = Instant::now();
        self.lost_before = lost_total;
    }
}

impl Sink for Continuous {
    fn shows_cpu_use(&self) -> bool {
        self.formats.is_empty() || self.formats.contains(&Format::Gecko)
    }
    fn interval(&self) -> Option<Duration> {
        Some(self.rotate)
    }
    fn take_interval(&mut self, p: &Profile, run: &RunInfo, _elapsed: Duration) {
        self.end_interval(p, run);
    }
    fn finish(&mut self, p: &Profile, run: &RunInfo) -> Result<(), AppError> {
        // The last, partial interval is written too: nothing collected is lost.
        self.end_interval(p, run);
        Ok(())
    }
    fn samples(&self, _p: &Profile) -> u64 {
        self.samples
    }
    fn counters(&self, _p: &Profile) -> Counters {
        self.counters.clone()
    }
    fn intervals(&self) -> Option<u64> {
        Some(self.intervals)
    }
    fn report(self: Box<Self>, quiet: bool) -> Result<(), AppError> {
        if !quiet {
            eprintln!(
                "tachyon-bpf: {} interval profiles in {} ({} samples)",
                self.intervals,
                self.dir.display(),
                self.samples
            );
        }
        if let Some(p) = self.pusher {
            let stats = p.stats.clone();
            p.finish(Duration::from_secs(5));
            if !quiet {
                let k = stats.counts();
                eprintln!(
                    "tachyon-bpf: pushed {} intervals, {} failed, {} dropped (endpoint too slow), \
                     {} not sent by exit",
                    k.sent, k.failed, k.dropped, k.abandoned
                );
            }
        }
        if let Some(p) = self.otlp {
            report_otlp(p, quiet);
        }
        if self.intervals == 0 && self.write_failures > 0 {
            return Err(AppError::new(
                Kind::Output,
                format!(
                    "none of the {} interval profiles could be written to {}",
                    self.write_failures,
                    self.dir.display()
                ),
            ));
        }
        Ok(())
    }
}
