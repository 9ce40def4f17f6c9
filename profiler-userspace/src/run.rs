//! One profiling run, top to bottom: check the request, load and attach the programs, start
//! the session, then loop (ticks, ring wake-ups, the sink's intervals and keys, signals) until
//! the run ends, and hand the result to the sink.

use std::time::{Duration, Instant};

use tokio::io::unix::AsyncFd;
use tokio::signal::unix::{signal, SignalKind};

use tachyon_bpf::aggregate::Profile;
use tachyon_bpf::capture::{self, Capture, CaptureOptions};
use tachyon_bpf::collect::{monotonic_ns, Collector, Kernel};
use tachyon_bpf::output::{self, Format, RunInfo};
use tachyon_bpf::session::{tick_for, Scope, Session, YOUNG_TICK};
use tachyon_bpf::{process, python};

use crate::cli::RunArgs;
use crate::error::{check_environment, other, target, usage, AppError};
use crate::launch;
use crate::sinks::{self, Sink};

/// Which sink the command line asked for.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// The main command: profile files, or --continuous intervals.
    Profile,
    /// `record`.
    Record,
    /// `top`.
    Top,
    /// `dump`: each thread's stack once, as text or JSON.
    Dump { json: bool },
}

/// Checks what the command line asks to profile.
fn check_targets(cli: &RunArgs) -> Result<(), AppError> {
    if !cli.target.all
        && !cli.target.all_pythons
        && cli.target.pid.is_empty()
        && cli.target.command.is_empty()
    {
        return Err(usage(
            "nothing to profile: give --all, --all-pythons, --pid PID or -- COMMAND",
        ));
    }
    if !cli.target.command.is_empty()
        && (cli.target.all || cli.target.all_pythons || !cli.target.pid.is_empty())
    {
        return Err(usage(
            "-- COMMAND cannot be combined with --all, --all-pythons or --pid",
        ));
    }
    if cli.target.subprocesses && cli.target.pid.is_empty() && cli.target.command.is_empty() {
        return Err(usage("--subprocesses needs --pid PID or -- COMMAND"));
    }
    Ok(())
}

fn check_pids(pids: &[u32]) -> Result<(), AppError> {
    for &pid in pids {
        if pid == 0 || !tachyon_bpf::process::procfs::exists(pid) {
            return Err(target(format!("no process with pid {pid}")));
        }
        if process::is_kernel_thread(pid) {
            return Err(target(format!(
                "pid {pid} is a kernel thread: tachyon-bpf profiles user processes (--all \
                 shows kernel time too)"
            )));
        }
        if pid == std::process::id() {
            return Err(target(format!("pid {pid} is tachyon-bpf itself")));
        }
    }
    Ok(())
}

fn sink_for(cli: &RunArgs, command: Command) -> Result<Box<dyn Sink>, AppError> {
    Ok(match command {
        Command::Top => Box::new(sinks::Top::new()),
        Command::Dump { json } => Box::new(sinks::Dump::new(json)),
        Command::Record => Box::new(sinks::Recording::new(cli)?),
        Command::Profile if cli.continuous.continuous => Box::new(sinks::Continuous::new(cli)?),
        Command::Profile => Box::new(sinks::Files::new(cli)?),
    })
}

fn epoch_ms() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64() * 1000.0)
        .unwrap_or(0.0)
}

pub async fn run(cli: RunArgs, command: Command) -> Result<i32, AppError> {
    sinks::check_usage(&cli, command == Command::Top)?;
    check_targets(&cli)?;
    check_environment()?;
    check_pids(&cli.target.pid)?;
    let sink = sink_for(&cli, command)?;
    let rate = cli
        .sampling
        .rate
        .unwrap_or(if cli.continuous.continuous { 49 } else { 1000 });
    let mut capture = load(&cli, rate, sink.shows_cpu_use())?;
    let bpf_logs = bpf_logs(&cli, &mut capture)?;
    capture.attach_lifetimes()?;
    let launched = if cli.target.command.is_empty() {
        None
    } else {
        // Run by sudo: the command runs as the user who ran it, as it would without the
        // profiler (unless --run-as-root).
        let run_as = launch::sudo_user()
            .filter(|_| !cli.target.run_as_root)
            .map(|(uid, gid)| launch::RunAs::new(uid, gid));
        Some(launch::launch(&cli.target.command, run_as.as_ref())?)
    };
    let explicit = targets(&cli, &mut capture, launched.as_ref())?;
    let mut run = Running::start(&cli, command, rate, sink, capture, explicit, bpf_logs)?;
    let (child_pid, mut child_rx) = run.release(launched)?;
    let child_status = run.event_loop(&mut child_rx).await?;
    log::debug!("run: sampling ends at {:?}", run.started.elapsed());
    // A second Ctrl-C while the profile is written exits at once. A plain signal handler, not
    // a task: the writing below holds this (single-threaded) runtime until it is done.
    launch::exit_on_second_interrupt();
    // The command tachyon-bpf started ends with the profiling (-d, Ctrl-C, SIGTERM), as perf
    // ends its workload: SIGTERM, then SIGKILL after a second.
    if let (Some(pid), None) = (child_pid, child_status) {
        launch::end_command(pid, &mut child_rx).await;
    }
    run.finish(child_status).await
}

/// Loads the programs that fit the kernel (`-v`: which, and what the verifier went through).
/// `cpu_use`: the outputs show each thread's CPU use over time; without it, cpu mode attaches
/// no scheduler program.
fn load(cli: &RunArgs, rate: u64, cpu_use: bool) -> Result<Capture, AppError> {
    let capture = Capture::load(&CaptureOptions {
        all: cli.target.all,
        stack_size: cli.sampling.stack_size as usize,
        ring_bytes: cli
            .sampling
            .ring_mb
            .unwrap_or_else(|| capture::default_ring_mb(rate, capture::online_cpu_count()))
            << 20,
        offcpu: if cli.sampling.mode.needs_offcpu_stacks() {
            profiler_common::OFFCPU_STACKS
        } else if cpu_use || cli.formats.open {
            profiler_common::OFFCPU_TIMES
        } else {
            profiler_common::OFFCPU_NONE
        },
        follow_children: cli.target.subprocesses,
        exec_all: cli.target.all_pythons,
        follow_python_forks: cli.target.all_pythons,
        rate_hz: rate,
        force_compat: cli.sampling.compat_programs,
        debug_bpf: cli.sampling.debug_bpf,
        full_verifier_log: cli.general.verbose,
    })
    .inspect_err(|e| {
        if let capture::CaptureError::Refused { log, .. } = e {
            if cli.general.verbose {
                eprintln!("tachyon-bpf: the verifier's log:\n{log}");
            }
        }
    })?;
    if cli.general.verbose {
        eprintln!(
            "tachyon-bpf: kernel {}: {} BPF programs",
            capture.kernel.release,
            capture.kernel.variant()
        );
        for (name, n) in capture.verified_insns() {
            eprintln!("tachyon-bpf: {name}: {n} instructions verified");
        }
    }
    Ok(capture)
}

/// `--debug-bpf`: the reader of the programs' failure logs, printed as they arrive and at the
/// end.
fn bpf_logs(
    cli: &RunArgs,
    capture: &mut Capture,
) -> Result<Option<AsyncFd<capture::BpfLogs>>, AppError> {
    Ok(
        match cli
            .sampling
            .debug_bpf
            .then(|| capture.take_logs())
            .flatten()
        {
            // SAFETY: the logger owns its map fd and neither replaces nor closes it while the
            // AsyncFd holds it.
            Some(logs) => Some(
                unsafe { AsyncFd::register_with_interest(logs, tokio::io::Interest::READABLE) }
                    .map_err(|e| other(format!("BPF logs: {e}")))?,
            ),
            None if cli.sampling.debug_bpf => {
                return Err(other("BPF logs: the object has no log ring".to_string()))
            }
            None => None,
        },
    )
}

/// The processes the command line names (`--pid`, with `--subprocesses` their running
/// descendants, and the launched command), made targets of the programs.
fn targets(
    cli: &RunArgs,
    capture: &mut Capture,
    launched: Option<&launch::Launched>,
) -> Result<Vec<u32>, AppError> {
    let mut explicit = cli.target.pid.clone();
    if cli.target.subprocesses {
        // The processes a --pid target has started already are profiled too; new ones are
        // followed through fork events.
        for &pid in &cli.target.pid {
            let found: Vec<u32> = process::descendants(pid)
                .into_iter()
                .filter(|p| !explicit.contains(p) && *p != std::process::id())
                .collect();
            if !cli.general.quiet {
                eprintln!(
                    "tachyon-bpf: --pid {pid} --subprocesses: {} running descendants profiled too",
                    found.len()
                );
            }
            explicit.extend(found);
        }
    }
    explicit.extend(launched.map(|l| l.pid));
    for &pid in &explicit {
        capture.add_target(pid)?;
    }
    Ok(explicit)
}

/// Programs a launched command may exec through before Python (`env`, a shell, pyenv's shim
/// and `pyenv exec`), and how long each may take to exec the next. pyenv's take 10-20 ms each
/// here, but far longer on a loaded host (they run a few subprocesses each); a wrapper that
/// does not exec in time is let go and runs on. `env PYENV_VERSION=X shim` alone is seven
/// programs before Python: `env`, then the shim, `pyenv` and `pyenv-exec`, each a
/// `#!/usr/bin/env bash` script (`env`, then `bash`). A chain longer than this is let go at its
/// end, and its Python is found as it starts, some of its start-up sampled without names.
const MAX_WRAPPERS: usize = 16;
const WRAPPER_EXEC_WITHIN: Duration = Duration::from_secs(1);

/// A run once its programs are attached: its session, ring and sink, and what each format's
/// metadata says of it.
struct Running<'a> {
    cli: &'a RunArgs,
    command: Command,
    rate: u64,
    sink: Box<dyn Sink>,
    session: Session<Capture>,
    ring: AsyncFd<aya::maps::RingBuf<aya::maps::MapData>>,
    bpf_logs: Option<AsyncFd<capture::BpfLogs>>,
    started: Instant,
    start_epoch_ms: f64,
    interval_ms: f64,
}

impl<'a> Running<'a> {
    /// Starts the session over the loaded programs and attaches the sampler.
    fn start(
        cli: &'a RunArgs,
        command: Command,
        rate: u64,
        sink: Box<dyn Sink>,
        mut capture: Capture,
        explicit: Vec<u32>,
        bpf_logs: Option<AsyncFd<capture::BpfLogs>>,
    ) -> Result<Running<'a>, AppError> {
        let start_ns = monotonic_ns();
        let start_epoch_ms = epoch_ms();
        // The period the samples are taken at, which is not always `1/rate`.
        let interval_ms = capture::sampling_period_ns(rate) as f64 / 1e6;
        let registry = python::PythonRegistry::new(python::PythonOptions {
            show_internal: cli.python.show_internal,
            opcodes: cli.python.opcodes,
            tasks: match cli.python.async_aware.as_deref() {
                None => python::AsyncTasks::Off,
                Some("all") => python::AsyncTasks::All,
                Some(_) => python::AsyncTasks::Running,
            },
        });
        let mut collector = Collector::new(
            start_ns,
            registry,
            cli.sampling.mode,
            interval_ms,
            Kernel::load(),
        );
        collector.add_kernel_code(capture.program_code());
        collector.env_labels = cli.file.env_labels.clone();
        collector.profile.timeline = sink.shows_cpu_use();
        if cli.general.verbose {
            eprintln!("tachyon-bpf: kernel symbols {}", collector.kernel_source);
        }
        let ring = capture.take_ring();
        let mut session = Session::new(
            capture,
            collector,
            Scope {
                all: cli.target.all,
                all_pythons: cli.target.all_pythons,
                subprocesses: cli.target.subprocesses,
                explicit,
            },
        );
        // SAFETY: the ring buffer owns its map fd and neither replaces nor closes it while the
        // AsyncFd holds it.
        let ring = unsafe { AsyncFd::register_with_interest(ring, tokio::io::Interest::READABLE) }
            .map_err(|e| other(format!("ring buffer: {e}")))?;
        session.set_tick(tick_for(rate));
        session.targets_mut().attach(rate)?;
        if let Some(why) = &session.targets().switch_in_refused {
            let cause = std::error::Error::source(why)
                .map(|c| format!(": {c}"))
                .unwrap_or_default();
            eprintln!(
                "tachyon-bpf: warning: no off-CPU stacks: {why}{cause}; blocked time is shown \
                 as [off-CPU, stack not captured]"
            );
        }
        Ok(Running {
            cli,
            command,
            rate,
            sink,
            session,
            ring,
            bpf_logs,
            started: Instant::now(),
            start_epoch_ms,
            interval_ms,
        })
    }

    /// What the run is, as each format's metadata and the sink's intervals see it.
    fn info(&self, duration: Duration) -> RunInfo {
        let cli = self.cli;
        let capture = self.session.targets();
        RunInfo {
            run_id: uuid::Uuid::new_v4().simple().to_string(),
            start_epoch_ms: self.start_epoch_ms,
            interval_ms: self.interval_ms,
            duration_ms: duration.as_secs_f64() * 1000.0,
            mode: cli.sampling.mode.name().into(),
            rate_hz: self.rate,
            command: std::env::args().collect::<Vec<_>>().join(" "),
            lost: capture.stats().0[profiler_common::STAT_LOST as usize],
            cpus: capture.cpus.len() as u32,
            cost: None,
            kernel: Some(output::KernelMeta {
                release: capture.kernel.release.clone(),
                programs: capture.kernel.programs().into(),
            }),
            bpf_counters: capture
                .counters()
                .into_iter()
                .map(|(n, v)| (n.to_string(), v))
                .collect(),
            async_aware: cli.python.async_aware.clone(),
            bpf_programs: Vec::new(),
            host: output::continuous::hostname(),
            labels: cli.file.labels.clone(),
        }
    }

    /// Lets the launched command run now that sampling is on (a wrapper it starts through is
    /// followed to the program it execs). Returns its pid and where its exit status arrives.
    fn release(
        &mut self,
        launched: Option<launch::Launched>,
    ) -> Result<(Option<u32>, tokio::sync::oneshot::Receiver<i32>), AppError> {
        let (child_tx, child_rx) = tokio::sync::oneshot::channel::<i32>();
        let Some(l) = launched else {
            drop(child_tx);
            return Ok((None, child_rx));
        };
        let child_pid = l.pid;
        let cli = self.cli;
        let session = &mut self.session;
        let ring = &mut self.ring;
        let mut started = l
            .release(child_tx)
            .map_err(|e| target(format!("cannot start {}: {e}", cli.target.command[0])))?;
        session.started(started.pid, started.held());
        // A wrapper (`env`, a shell, a shim) held instead of Python: followed through its
        // execs, a few, each briefly.
        for _ in 0..MAX_WRAPPERS {
            if !started.held() || session.is_python(started.pid) {
                break;
            }
            // The ring is read meanwhile: a launched program that is not Python runs on until
            // the time is up, and its samples would otherwise fill the ring.
            if started.follow_exec(WRAPPER_EXEC_WITHIN, &mut || {
                session.drain(ring.get_mut());
            }) {
                session.started(started.pid, true);
            }
        }
        started.run();
        Ok((Some(child_pid), child_rx))
    }

    /// Samples until the run ends: `-d`, a signal, the command's exit, the profiled processes'
    /// exit, or the sink's key. Returns the command's exit status if it exited.
    async fn event_loop(
        &mut self,
        child_rx: &mut tokio::sync::oneshot::Receiver<i32>,
    ) -> Result<Option<i32>, AppError> {
        let cli = self.cli;
        let mut sigint = signal(SignalKind::interrupt()).map_err(|e| other(e.to_string()))?;
        let mut sigterm = signal(SignalKind::terminate()).map_err(|e| other(e.to_string()))?;
        let deadline = cli
            .sampling
            .duration
            .map(|d| tokio::time::Instant::now() + Duration::from_secs_f64(d.max(0.0)));
        let sleep = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(sleep);
        let has_child = !cli.target.command.is_empty();
        let mut child_status = None;
        let mut tick = tokio::time::interval(self.session.tick_length());
        let mut ticks: u64 = 0;
        // Whether the named processes are gone: every 100 ms; the status line: 4 times a second.
        let gone_ticks = self.session.ticks_in(Duration::from_millis(100));
        let status_ticks = self.session.ticks_in(Duration::from_millis(240));
        let mut young_tick = tokio::time::interval(YOUNG_TICK);
        young_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        // The live status line: on a terminal only, never with --quiet.
        let status = !cli.general.quiet
            && self.sink.status_line()
            && std::io::IsTerminal::is_terminal(&std::io::stderr());
        let every = self.sink.interval();
        let mut intervals = tokio::time::interval_at(
            tokio::time::Instant::now() + every.unwrap_or(Duration::MAX / 4),
            every.unwrap_or(Duration::MAX / 4),
        );
        let mut keys = self.sink.start()?;
        log::debug!("run: sampling from {:?}", self.started.elapsed());
        loop {
            tokio::select! {
                // In this order: what ends the run first, so that a ring that is always readable
                // (an overload) never wins over `-d` or a signal.
                biased;
                _ = &mut sleep => break,
                _ = sigint.recv() => break,
                _ = sigterm.recv() => break,
                st = &mut *child_rx, if has_child && child_status.is_none() => {
                    child_status = st.ok();
                    break;
                }
                _ = intervals.tick(), if every.is_some() => {
                    let finished = self.session.rotate(self.ring.get_mut(), monotonic_ns());
                    let info = self.info(self.started.elapsed());
                    self.sink.take_interval(&finished, &info, self.started.elapsed());
                    drop(finished);
                    release_free_memory();
                }
                Some(key) = async {
                    match keys.as_mut() {
                        Some(k) => k.recv().await,
                        None => std::future::pending().await,
                    }
                } => {
                    if self.sink.key(key) {
                        break;
                    }
                }
                _ = tick.tick() => {
                    ticks += 1;
                    self.session.tick(self.ring.get_mut());
                    // --pid: the run ends when every process it names (and, with --subprocesses,
                    // every child that joined them) has exited, as it does with a command.
                    if !has_child && ticks.is_multiple_of(gone_ticks) && self.session.targets_gone() {
                        if !cli.general.quiet {
                            eprintln!("tachyon-bpf: the profiled processes have exited");
                        }
                        break;
                    }
                    if status && ticks.is_multiple_of(status_ticks) {
                        eprint!("\r\x1b[2K{}", self.status_line());
                    }
                }
                _ = young_tick.tick(), if self.session.awaiting_young() => {
                    self.session.tick_young(self.ring.get_mut());
                }
                guard = async {
                    match self.bpf_logs.as_mut() {
                        Some(l) => l.readable_mut().await,
                        None => std::future::pending().await,
                    }
                } => {
                    let mut guard = guard.map_err(|e| other(format!("BPF logs: {e}")))?;
                    guard.get_inner_mut().flush();
                    guard.clear_ready();
                }
                guard = self.ring.readable_mut() => {
                    let mut guard = guard.map_err(|e| other(format!("ring buffer: {e}")))?;
                    self.session.drain(guard.get_inner_mut());
                    guard.clear_ready();
                }
            }
            // Back to the runtime after every turn. Timers, signals and the child's exit are seen
            // only when its driver runs, and a ring that refills as fast as it is read (an
            // overload) keeps a branch ready at every turn: without this, the runtime's
            // cooperative budget (128 turns of up to `DRAIN_BUDGET` each) held `-d` and Ctrl-C back
            // for as long as the overload lasted.
            tokio::task::yield_now().await;
        }
        drop(sigint);
        if status {
            eprint!("\r\x1b[2K");
        }
        Ok(child_status)
    }

    /// The live status line: the profile so far, the time, the samples lost.
    fn status_line(&self) -> String {
        let lost = self.session.targets().stats().0[profiler_common::STAT_LOST as usize];
        output::summary::status_line(
            self.session.profile(),
            self.started.elapsed().as_secs_f64(),
            lost,
            self.session.targets().cpus.len(),
            self.rate,
        )
    }

    /// Ends the run: detaches the programs, reads what the ring still holds, settles the
    /// scheduler's accounting, and hands the profile to the sink (with the summary).
    async fn finish(mut self, child_status: Option<i32>) -> Result<i32, AppError> {
        let cli = self.cli;
        self.session.targets_mut().detach();
        log::debug!("run: programs detached at {:?}", self.started.elapsed());
        if let Some(logs) = self.bpf_logs.as_mut() {
            logs.get_mut().flush();
            let unlogged = self.session.targets().unlogged_failures();
            if !unlogged.is_empty() {
                let kinds: Vec<String> = unlogged.iter().map(|(k, n)| format!("{k} {n}")).collect();
                eprintln!(
                    "tachyon-bpf: bpf: not logged (beyond the first {} of each kind per CPU): {}",
                    profiler_common::LOG_FIRST,
                    kinds.join(", ")
                );
            }
        }
        if !self.sink.writes() {
            // `top`: the terminal is restored; nothing is written.
            self.sink.report(true)?;
            return Ok(0);
        }
        let elapsed = self.started.elapsed();
        let dump = matches!(self.command, Command::Dump { .. });
        let sink = &mut self.sink;
        self.session
            .finish(self.ring.get_mut(), monotonic_ns(), |collector| {
                if dump {
                    for &pid in &cli.target.pid {
                        sink.read_from_memory(collector.sample_blocked_threads(pid));
                    }
                }
            });
        if let (true, Some(addr)) = (cli.general.verbose, self.session.kernel_reread_at()) {
            eprintln!(
                "tachyon-bpf: kernel symbols read again mid-run: {addr:#x} is kernel code made since boot"
            );
        }
        let capture = self.session.targets();
        // One read of the kernel's statistics: the total is the programs' sum.
        let programs = capture.bpf_programs();
        let bpf = programs.as_ref().map(|v| {
            let ms: f64 = v.iter().map(|p| p.1).sum();
            (
                Duration::from_secs_f64(ms / 1e3),
                v.iter().map(|p| p.2).sum(),
            )
        });
        let run = RunInfo {
            cost: Some(output::Cost::measure(bpf)),
            bpf_programs: programs.unwrap_or_default(),
            ..self.info(elapsed)
        };
        self.sink.finish(self.session.profile(), &run)?;
        // --otlp without --continuous: the run's profile, once, after the files are written.
        let otlp = match (&cli.file.otlp, cli.continuous.continuous) {
            (Some(url), false) => {
                let p =
                    output::continuous::Pusher::start(url, output::continuous::Destination::Otlp);
                p.push(self.session.profile(), &run);
                Some(p)
            }
            _ => None,
        };
        if !cli.general.quiet {
            summary(
                self.session.profile(),
                &run,
                capture,
                self.sink.as_ref(),
                elapsed,
            );
        }
        if let Some(p) = otlp {
            crate::sinks::report_otlp(p, cli.general.quiet);
        }
        self.sink.report(cli.general.quiet)?;
        if let Some(code) = child_status {
            if code != 0 && !cli.general.quiet {
                eprintln!("tachyon-bpf: the command exited with status {code}");
            }
        }
        if cli.formats.open {
            open_in_browser(self.session.profile(), &run).await?;
        }
        Ok(0)
    }
}

/// The end-of-run summary on stderr.
fn summary(p: &Profile, run: &RunInfo, capture: &Capture, sink: &dyn Sink, elapsed: Duration) {
    let totals = output::summary::RunTotals {
        // A continuous run's profile holds only its last interval: the run's counts are the
        // sink's.
        counters: sink.counters(p),
        samples: sink.samples(p),
        intervals: sink.intervals(),
        cpus: capture.cpus.len(),
        lost_per_cpu: capture.stats().1,
        elapsed,
    };
    for line in output::summary::run_lines(p, run, &totals) {
        eprintln!("tachyon-bpf: {line}");
    }
}

/// Serves the Gecko profile to profiler.firefox.com until Ctrl-C or SIGTERM.
pub(crate) async fn open_in_browser(p: &Profile, run: &RunInfo) -> Result<(), AppError> {
    let bytes = Format::Gecko.render(p, run)?;
    let served = output::serve::start(bytes)?;
    println!("{}", served.link);
    eprintln!(
        "tachyon-bpf: serving the profile to profiler.firefox.com from 127.0.0.1; Ctrl-C stops"
    );
    output::serve::try_browser(&served.link);
    let mut sigint = signal(SignalKind::interrupt()).map_err(|e| other(e.to_string()))?;
    let mut sigterm = signal(SignalKind::terminate()).map_err(|e| other(e.to_string()))?;
    tokio::select! {
        _ = sigint.recv() => {}
        _ = sigterm.recv() => {}
    }
    drop(served);
    Ok(())
}

/// Gives the heap's free memory back to the system once an interval's tables are dropped: glibc
/// keeps what was freed in its arenas, so a continuous run's RSS would stay at its largest
/// interval's for good (the next interval reuses it, but a host's memory accounting does not
/// know that).
fn release_free_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: walks and trims the allocator's own free lists; no pointer is passed.
    unsafe {
        libc::malloc_trim(0);
    }
}
