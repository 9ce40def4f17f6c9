//! The kernel side seen from user space: probing the running kernel (BTF), loading and
//! attaching the BPF programs that fit it, the maps user space feeds them, the ring buffer and
//! the decoding of its records, and the programs' counters.
//!
//! The lowest layer: may import nothing else of the crate. What the records mean for a profile
//! is `collect`'s business.

pub mod btf;
pub mod record;
pub mod ring;
mod sizing;

use sizing::host_threads;
pub use sizing::{clamp_stack_size, default_ring_mb, sampling_period_ns, sched_entries};
#[cfg(test)]
use sizing::{parse_loadavg_threads, MIN_PHASE_STEP_NS, TIMER_GRID_NS};

use std::os::fd::{AsFd, AsRawFd};

use aya::maps::{Array, HashMap as BpfHashMap, MapData, PerCpuArray, RingBuf};
use aya::programs::perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent};
use aya::programs::{BtfTracePoint, KProbe, PerfEvent, ProgramError};
use aya::{Btf, Ebpf, EbpfLoader, VerifierLogLevel};
use profiler_common::{
    names, thread_key, Config, PyProcConfig, ThreadSched, OFFCPU_NONE, OFFCPU_STACKS, STAT_COUNT,
};

static BPF_OBJECT: &[u8] = aya::include_bytes_aligned!(env!("TACHYON_BPF_OBJECT"));

/// The oldest kernel the programs are built and tested for (docs/compatibility.md, "Kernels").
pub const MIN_KERNEL: &str = "5.10";

/// What kind of failure a `CaptureError` is, set where it happens (from the OS error, never
/// from message text): the binary's exit code follows from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// Not enough privilege (EPERM/EACCES from the kernel).
    Permission,
    /// The kernel cannot run the programs (too old, a feature missing, the verifier refused).
    Kernel,
    /// Anything else.
    Other,
}

#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    #[error("loading the BPF programs failed: {message}")]
    Load {
        message: String,
        /// The kernel said EPERM or EACCES.
        permission: bool,
    },
    /// The kernel's verifier refused a program: `reason` is the log's conclusion, `log` the
    /// whole verifier log (shown with `--verbose`).
    #[error("kernel {kernel} refused the BPF program {program} ({purpose}): {reason}")]
    Refused {
        program: &'static str,
        purpose: &'static str,
        kernel: String,
        reason: String,
        log: String,
        /// The load failed with EPERM/EACCES before any verification (not enough privilege).
        permission: bool,
    },
    /// The running kernel lacks something no program variant can do without.
    #[error(
        "kernel {kernel} lacks {feature}: tachyon-bpf needs Linux {MIN_KERNEL} or newer with it"
    )]
    Missing { kernel: String, feature: String },
    #[error("attaching to the cpu-clock perf event on CPU {cpu} failed: {source}")]
    Attach {
        cpu: u32,
        #[source]
        source: ProgramError,
    },
    /// Neither `sched_exit_tp` nor a kprobe on `finish_task_switch` can be attached: `source`,
    /// the kprobe's refusal, if it was tried.
    #[error("the kernel has no sched_exit_tp (6.16+) and {}", match .symbol {
        None => "no finish_task_switch to probe".to_string(),
        Some(s) => format!("refused a kprobe on {s}"),
    })]
    NoSwitchIn {
        symbol: Option<String>,
        #[source]
        source: Option<ProgramError>,
    },
    #[error("attaching to the {name} tracepoint failed: {source}")]
    Tracepoint {
        name: &'static str,
        #[source]
        source: ProgramError,
    },
    #[error("BPF map {0}: {1}")]
    Map(&'static str, String),
    #[error("listing online CPUs failed: {0}")]
    Cpus(String),
    #[error(transparent)]
    Btf(#[from] btf::BtfError),
}

/// The CPUs online now (1 if that cannot be read: the error comes again, with its reason, when
/// the programs attach to them).
pub fn online_cpu_count() -> usize {
    aya::util::online_cpus().map_or(1, |c| c.len())
}

pub struct CaptureOptions {
    pub all: bool,
    pub stack_size: usize,
    pub ring_bytes: u32,
    /// `OFFCPU_*`: what the scheduler program records.
    pub offcpu: u32,
    /// Children of targets become targets.
    pub follow_children: bool,
    /// Report every `execve` on the host (to find new Python processes at once).
    pub exec_all: bool,
    /// New processes forked by Python processes become targets (`--all-pythons`).
    pub follow_python_forks: bool,
    /// The sampling rate, which also limits full off-CPU captures per thread.
    pub rate_hz: u64,
    /// Load the compat program set even where the modern one fits (`--compat-programs`).
    pub force_compat: bool,
    /// Keep the verifier's instruction-level log of a refused program (`--verbose`): it is
    /// loaded again with that log (see `Capture::load`); otherwise only the verifier's messages
    /// and statistics, which keep the error and fit the log buffer however large the program.
    pub full_verifier_log: bool,
    /// Enable the programs' failure logs (`--debug-bpf`, see `take_logs`).
    pub debug_bpf: bool,
}

/// aya-log's level for warnings (`aya_log_common::Level::Warn`): the programs log failures at
/// it. 0 turns their logging off, and the verifier drops the code (see the BPF crate's `log`).
const AYA_LOG_WARN: u8 = 2;

/// The lifetime programs: (program name, tracepoint). The scheduler program is chosen per kernel.
const LIFETIMES: [(&str, &str); 3] = [
    (names::PROG_FORK, "sched_process_fork"),
    (names::PROG_EXEC, "sched_process_exec"),
    (names::PROG_EXIT, "sched_process_exit"),
];

/// The scheduler program's tracepoint.
const SWITCH: &str = "sched_switch";

/// Every raw tracepoint a program attaches to.
const TRACEPOINTS: [&str; 4] = [LIFETIMES[0].1, LIFETIMES[1].1, LIFETIMES[2].1, SWITCH];

/// One set of programs that fits a kernel (see the BPF crate's documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProgramSet {
    pub sample: &'static str,
    /// The scheduler's accounting (`sched_switch`), and the capture of blocked threads as they
    /// come back (`finish_task_switch`, `OFFCPU_STACKS` only).
    pub switch: &'static str,
    pub switch_in: &'static str,
    /// `switch_in` is a tracepoint program (`sched_exit_tp`), not a kprobe.
    pub switch_in_tracepoint: bool,
}

impl ProgramSet {
    pub fn for_kernel(k: &btf::KernelInfo) -> ProgramSet {
        if k.modern {
            ProgramSet {
                sample: names::PROG_SAMPLE,
                switch: names::PROG_SWITCH,
                switch_in: if k.has_sched_exit_tp {
                    names::PROG_SWITCH_IN
                } else {
                    names::PROG_SWITCH_IN_KPROBE
                },
                switch_in_tracepoint: k.has_sched_exit_tp,
            }
        } else {
            ProgramSet {
                sample: names::PROG_SAMPLE_COMPAT,
                switch: names::PROG_SWITCH_COMPAT,
                switch_in: names::PROG_SWITCH_IN_COMPAT,
                switch_in_tracepoint: false,
            }
        }
    }
}

/// The kernel function a thread coming back on a CPU runs first, as `/proc/kallsyms` names it:
/// `finish_task_switch`, or the compiler's clone of it (`finish_task_switch.isra.0`).
fn switch_in_symbol() -> Option<String> {
    // The kernel's own file, not one a target controls. Read line by line, up to the name: the
    // whole table is megabytes.
    let file = std::fs::File::open("/proc/kallsyms").ok()?;
    for line in std::io::BufRead::lines(std::io::BufReader::new(file)).map_while(Result::ok) {
        let name = line.split_whitespace().nth(2)?;
        if name == "finish_task_switch" || name.starts_with("finish_task_switch.") {
            return Some(name.to_string());
        }
    }
    None
}

pub struct Capture {
    bpf: Ebpf,
    /// What the running kernel offers, and the programs chosen for it.
    pub kernel: btf::KernelInfo,
    programs: ProgramSet,
    attached: Vec<aya::programs::perf_event::PerfEventLinkId>,
    tracepoints: Vec<(&'static str, aya::programs::tp_btf::BtfTracePointLinkId)>,
    switch_in: Option<aya::programs::kprobe::KProbeLinkId>,
    /// Why blocked threads cannot be captured as they come back (wall mode then charges their
    /// time to `[off-CPU, stack not captured]`).
    pub switch_in_refused: Option<CaptureError>,
    offcpu: u32,
    pub cpus: Vec<u32>,
    /// Holds the kernel's BPF run-time statistics on while it lives (None without
    /// CAP_SYS_ADMIN): the time the programs take is part of the profiler's cost.
    stats: Option<std::os::fd::OwnedFd>,
    /// What `KNOWN_CODES` holds, slot by slot (empty until the first write): only changes are
    /// written.
    known_codes: Vec<u64>,
}

/// The errno of the first `std::io::Error` in an error's source chain.
fn os_error(e: &(dyn std::error::Error + 'static)) -> Option<i32> {
    let mut cur = Some(e);
    // Bounded: source chains are short, and a cycle must not hang.
    for _ in 0..16 {
        let err = cur?;
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            if let Some(n) = io.raw_os_error() {
                return Some(n);
            }
        }
        cur = err.source();
    }
    None
}

/// What the BPF programs read of the options and the kernel's layout.
fn bpf_config(opts: &CaptureOptions, kernel: &btf::KernelInfo, ring: u32) -> Config {
    Config {
        all: opts.all as u32,
        ustack_size: clamp_stack_size(opts.stack_size) as u32,
        self_tgid: std::process::id(),
        offcpu: opts.offcpu,
        follow_children: opts.follow_children as u32,
        task_pid_off: kernel.task_pid,
        task_tgid_off: kernel.task_tgid,
        task_flags_off: kernel.task_flags,
        exec_all: opts.exec_all as u32,
        follow_python_forks: opts.follow_python_forks as u32,
        wakeup_bytes: ring / 4,
        sample_stop_bytes: ring - ring / 4,
        sched_span_ns: sampling_period_ns(opts.rate_hz),
        task_state_off: kernel.task_state,
        task_stack_off: kernel.task_stack,
        task_signal_off: kernel.task_signal,
        signal_live_off: kernel.signal_live,
        // x86_64: PAGE_SIZE << THREAD_SIZE_ORDER (2); arm64: 16 KiB too (MIN_THREAD_SHIFT 14).
        // Distribution kernels build no KASAN.
        thread_size: 16384,
        pt_regs_size: kernel.pt_regs_size,
        task_fsbase_off: kernel.task_fsbase,
        task_sum_exec_off: kernel.task_sum_exec,
        task_prev_sum_exec_off: kernel.task_prev_sum_exec,
        task_mm_off: kernel.task_mm,
        mm_exec_vm_off: kernel.mm_exec_vm,
        mm_start_stack_off: kernel.mm_start_stack,
    }
}

/// Loads the program set's sampler, and the tracepoint and kprobe programs the options use;
/// a refusal names the program, what it is for and the kernel.
fn load_programs(
    bpf: &mut aya::Ebpf,
    opts: &CaptureOptions,
    kernel: &btf::KernelInfo,
    programs: &ProgramSet,
    tracepoint_btf: &Btf,
) -> Result<(), CaptureError> {
    let refused = |program: &'static str, purpose: &'static str| {
        let kernel = kernel.release.clone();
        move |e: ProgramError| refusal(program, purpose, kernel, e)
    };
    let prog: &mut PerfEvent = bpf
        .program_mut(programs.sample)
        .expect("sampling program")
        .try_into()
        .map_err(load_error)?;
    prog.load()
        .map_err(refused(programs.sample, "the sampler"))?;
    let mut tracepoints: Vec<(&'static str, &'static str, &'static str)> = LIFETIMES
        .iter()
        .map(|&(n, tp)| (n, tp, "process lifetimes"))
        .collect();
    if opts.offcpu != OFFCPU_NONE {
        tracepoints.push((programs.switch, SWITCH, "off-CPU time"));
    }
    if opts.offcpu == OFFCPU_STACKS && programs.switch_in_tracepoint {
        tracepoints.push((programs.switch_in, btf::SCHED_EXIT_TP, "off-CPU stacks"));
    }
    for (name, tp, purpose) in tracepoints {
        let prog: &mut BtfTracePoint = bpf
            .program_mut(name)
            .expect("tracepoint program")
            .try_into()
            .map_err(load_error)?;
        prog.load(tp, tracepoint_btf)
            .map_err(refused(name, purpose))?;
    }
    if opts.offcpu == OFFCPU_STACKS && !programs.switch_in_tracepoint {
        let prog: &mut KProbe = bpf
            .program_mut(programs.switch_in)
            .expect("switch-in program")
            .try_into()
            .map_err(load_error)?;
        prog.load()
            .map_err(refused(programs.switch_in, "off-CPU stacks"))?;
    }
    Ok(())
}

/// A failed load, with its kind taken from the OS error.
fn load_error(e: impl std::error::Error + 'static) -> CaptureError {
    CaptureError::Load {
        message: format!("{e:#}"),
        permission: matches!(os_error(&e), Some(libc::EPERM | libc::EACCES)),
    }
}

impl CaptureError {
    pub fn kind(&self) -> ErrorKind {
        match self {
            CaptureError::Load {
                permission: true, ..
            }
            | CaptureError::Refused {
                permission: true, ..
            } => ErrorKind::Permission,
            CaptureError::Load { .. }
            | CaptureError::Refused { .. }
            | CaptureError::Missing { .. }
            | CaptureError::NoSwitchIn { .. }
            | CaptureError::Attach { .. } => ErrorKind::Kernel,
            CaptureError::Tracepoint { source, .. } => match os_error(source) {
                Some(libc::EPERM | libc::EACCES) => ErrorKind::Permission,
                _ => ErrorKind::Kernel,
            },
            CaptureError::Btf(e) => match os_error(e) {
                Some(libc::EPERM | libc::EACCES) => ErrorKind::Permission,
                _ => ErrorKind::Kernel,
            },
            CaptureError::Map(..) | CaptureError::Cpus(_) => ErrorKind::Other,
        }
    }
}

fn map_err<E: std::fmt::Display>(name: &'static str) -> impl Fn(E) -> CaptureError {
    move |e| CaptureError::Map(name, e.to_string())
}

impl Capture {
    /// Loads the programs that fit the running kernel. The verifier is asked for its statistics
    /// only: its instruction-level log of a program that passes can outgrow any buffer (the
    /// compat set's on 5.10), and a full buffer fails the load with ENOSPC. With
    /// `full_verifier_log`, a refused program is loaded again with that log, for the user.
    pub fn load(opts: &CaptureOptions) -> Result<Capture, CaptureError> {
        match Capture::load_logged(opts, VerifierLogLevel::STATS) {
            Err(mut first @ CaptureError::Refused { .. }) if opts.full_verifier_log => {
                let again =
                    Capture::load_logged(opts, VerifierLogLevel::DEBUG | VerifierLogLevel::STATS);
                // The first refusal's reason stands (the second load may fail only because its
                // log filled the buffer); the second gives the log.
                if let (
                    Err(CaptureError::Refused { log, .. }),
                    CaptureError::Refused { log: first_log, .. },
                ) = (again, &mut first)
                {
                    *first_log = log;
                }
                Err(first)
            }
            loaded => loaded,
        }
    }

    fn load_logged(
        opts: &CaptureOptions,
        log_level: VerifierLogLevel,
    ) -> Result<Capture, CaptureError> {
        let ring = opts.ring_bytes.next_power_of_two().max(1 << 20);
        let possible =
            aya::util::nr_cpus().map_err(|(s, e)| CaptureError::Cpus(format!("{s}: {e}")))?;
        let (kernel, tracepoint_btf) = btf::KernelInfo::probe_with_tracepoints(&TRACEPOINTS)?;
        if !kernel.has_ringbuf {
            return Err(CaptureError::Missing {
                kernel: kernel.release.clone(),
                feature: "BPF ring buffers (5.8)".into(),
            });
        }
        let mut kernel = kernel;
        kernel.modern = kernel.modern && !opts.force_compat;
        let programs = ProgramSet::for_kernel(&kernel);
        // The loader parses the kernel's BTF itself; the tracepoints' loads need only their ids.
        let tracepoint_btf =
            Btf::parse(&tracepoint_btf, aya::Endianness::default()).map_err(load_error)?;
        let sched = sched_entries(host_threads());
        let mut bpf = EbpfLoader::new()
            .verifier_log_level(log_level)
            .map_max_entries(names::MAP_SAMPLES, ring)
            .map_max_entries(names::MAP_SCRATCH, possible as u32)
            .map_max_entries(names::MAP_SCHED, sched)
            .map_max_entries(
                names::MAP_STACK_TOPS,
                sched.min(profiler_common::MAX_STACK_TOP_ENTRIES),
            )
            .override_global(
                names::GLOBAL_AYA_LOG_LEVEL,
                &(if opts.debug_bpf { AYA_LOG_WARN } else { 0 }),
                true,
            )
            .load(BPF_OBJECT)
            .map_err(load_error)?;
        let cfg = bpf_config(opts, &kernel, ring);
        let mut arr: Array<_, Config> =
            Array::try_from(bpf.map_mut(names::MAP_CONFIG).expect("CONFIG map"))
                .map_err(map_err(names::MAP_CONFIG))?;
        arr.set(0, cfg, 0).map_err(map_err(names::MAP_CONFIG))?;
        load_programs(&mut bpf, opts, &kernel, &programs, &tracepoint_btf)?;
        let cpus =
            aya::util::online_cpus().map_err(|(s, e)| CaptureError::Cpus(format!("{s}: {e}")))?;
        Ok(Capture {
            bpf,
            kernel,
            programs,
            attached: Vec::new(),
            tracepoints: Vec::new(),
            switch_in: None,
            switch_in_refused: None,
            offcpu: opts.offcpu,
            cpus,
            stats: aya::sys::enable_stats(aya::sys::Stats::RunTime).ok(),
            known_codes: Vec::new(),
        })
    }

    /// The kernel's run time and runs of each BPF program that ran: (name, ms, runs), most
    /// costly first; `None` when the statistics could not be enabled (no CAP_SYS_ADMIN).
    pub fn bpf_programs(&self) -> Option<Vec<(String, f64, u64)>> {
        self.stats.as_ref()?;
        let mut v: Vec<(String, f64, u64)> = self
            .bpf
            .programs()
            .filter_map(|(name, prog)| {
                let info = prog.info().ok()?;
                let runs = info.run_count();
                (runs > 0).then(|| (name.to_string(), info.run_time().as_secs_f64() * 1e3, runs))
            })
            .collect();
        v.sort_by(|a, b| b.1.total_cmp(&a.1));
        Some(v)
    }

    /// Instructions the verifier went through for each loaded program (5.16+ kernels say).
    pub fn verified_insns(&self) -> Vec<(String, u32)> {
        self.bpf
            .programs()
            .filter_map(|(name, prog)| {
                let n = prog.info().ok()?.verified_instruction_count()?;
                Some((name.to_string(), n))
            })
            .collect()
    }

    /// Where the kernel put each loaded program's code (its own and its subprograms'): start,
    /// length and a name as the kernel's symbols say (`bpf_prog_<tag>_<name>`). Samples that
    /// interrupt a program of the profiler's, in a profiled thread's context, show it; the
    /// kernel lists it only in the whole `/proc/kallsyms`. Empty where the kernel hides its
    /// addresses (without CAP_SYSLOG).
    pub fn program_code(&self) -> Vec<(u64, u64, String)> {
        let mut out = Vec::new();
        for (_, prog) in self.bpf.programs() {
            let Ok(fd) = prog.fd() else {
                continue;
            };
            out.extend(jited_code(fd.as_fd().as_raw_fd()));
        }
        out
    }

    /// Starts the lifetime programs (before the target starts, so its threads are seen born).
    pub fn attach_lifetimes(&mut self) -> Result<(), CaptureError> {
        for (name, tp) in LIFETIMES {
            self.attach_tracepoint(name, tp)?;
        }
        Ok(())
    }

    fn attach_tracepoint(
        &mut self,
        name: &'static str,
        tp: &'static str,
    ) -> Result<(), CaptureError> {
        let prog: &mut BtfTracePoint = self
            .bpf
            .program_mut(name)
            .expect("tracepoint program")
            .try_into()
            .map_err(load_error)?;
        let link = prog
            .attach()
            .map_err(|source| CaptureError::Tracepoint { name: tp, source })?;
        self.tracepoints.push((name, link));
        Ok(())
    }

    /// Starts sampling: one software cpu-clock event per online CPU, every `1/rate` s of CPU time,
    /// and the scheduler program when off-CPU time is recorded.
    pub fn attach(&mut self, rate_hz: u64) -> Result<(), CaptureError> {
        if self.offcpu == OFFCPU_STACKS {
            // Before the accounting: a thread it marks blocked is then always seen back.
            if let Err(why) = self.attach_switch_in() {
                self.switch_in_refused = Some(why);
            }
        }
        if self.offcpu != OFFCPU_NONE {
            self.attach_tracepoint(self.programs.switch, SWITCH)?;
        }
        let period_ns = sampling_period_ns(rate_hz);
        let prog: &mut PerfEvent = self
            .bpf
            .program_mut(self.programs.sample)
            .expect("sampling program")
            .try_into()
            .map_err(load_error)?;
        for &cpu in &self.cpus {
            let link = prog
                .attach(
                    PerfEventConfig::Software(SoftwareEvent::CpuClock),
                    PerfEventScope::AllProcessesOneCpu { cpu },
                    SamplePolicy::Period(period_ns),
                    false,
                )
                .map_err(|source| CaptureError::Attach { cpu, source })?;
            self.attached.push(link);
        }
        Ok(())
    }

    /// Starts the capture of blocked threads as they come back: the `sched_exit_tp` tracepoint,
    /// else a kprobe on `finish_task_switch`. Without either (a kernel before 6.16 without
    /// kprobes, or one whose lockdown refuses them), wall mode goes on without off-CPU stacks:
    /// the reason, for a warning.
    fn attach_switch_in(&mut self) -> Result<(), CaptureError> {
        if self.programs.switch_in_tracepoint {
            return self.attach_tracepoint(self.programs.switch_in, btf::SCHED_EXIT_TP);
        }
        let symbol = switch_in_symbol().ok_or(CaptureError::NoSwitchIn {
            symbol: None,
            source: None,
        })?;
        let prog: &mut KProbe = self
            .bpf
            .program_mut(self.programs.switch_in)
            .expect("switch-in program")
            .try_into()
            .map_err(load_error)?;
        let link = prog
            .attach(symbol.as_str(), 0)
            .map_err(|source| CaptureError::NoSwitchIn {
                symbol: Some(symbol.clone()),
                source: Some(source),
            })?;
        self.switch_in = Some(link);
        Ok(())
    }

    /// Stops sampling (records already in the ring buffer stay readable).
    pub fn detach(&mut self) {
        if let Some(link) = self.switch_in.take() {
            if let Some(Ok(prog)) = self
                .bpf
                .program_mut(self.programs.switch_in)
                .map(<&mut KProbe>::try_from)
            {
                let _ = prog.detach(link);
            }
        }
        for (name, link) in self.tracepoints.drain(..) {
            if let Some(Ok(prog)) = self
                .bpf
                .program_mut(name)
                .map(<&mut BtfTracePoint>::try_from)
            {
                let _ = prog.detach(link);
            }
        }
        if let Some(p) = self.bpf.program_mut(self.programs.sample) {
            if let Ok(prog) = <&mut PerfEvent>::try_from(p) {
                for link in self.attached.drain(..) {
                    let _ = prog.detach(link);
                }
            }
        }
    }

    pub fn take_ring(&mut self) -> RingBuf<MapData> {
        RingBuf::try_from(self.bpf.take_map(names::MAP_SAMPLES).expect("SAMPLES map"))
            .expect("ring buffer")
    }

    /// Inserts `key -> value` into the hash map `name` (one of `names::MAPS`).
    fn insert<K: aya::Pod, V: aya::Pod>(
        &mut self,
        name: &'static str,
        key: K,
        value: V,
    ) -> Result<(), CaptureError> {
        let map = self.bpf.map_mut(name).expect("a map the object declares");
        let mut m: BpfHashMap<_, K, V> = BpfHashMap::try_from(map).map_err(map_err(name))?;
        m.insert(key, value, 0).map_err(map_err(name))
    }

    pub fn add_target(&mut self, pid: u32) -> Result<(), CaptureError> {
        self.insert(names::MAP_TARGETS, pid, 1u32)
    }

    pub fn set_py_proc(&mut self, pid: u32, cfg: &PyProcConfig) -> Result<(), CaptureError> {
        self.insert(names::MAP_PY_PROCS, pid, *cfg)
    }

    pub fn remove_py_proc(&mut self, pid: u32) {
        if let Ok(mut m) = BpfHashMap::<_, u32, PyProcConfig>::try_from(
            self.bpf.map_mut(names::MAP_PY_PROCS).expect("PY_PROCS"),
        ) {
            let _ = m.remove(&pid);
        }
    }

    pub fn set_py_thread(&mut self, pid: u32, tid: u32, tstate: u64) -> Result<(), CaptureError> {
        self.insert(names::MAP_PY_THREADS, thread_key(pid, tid), tstate)
    }

    /// Tells the frame walk that user space has settled these code objects (`known_code_word`s):
    /// it stops copying their heads. A word whose slot already holds it is not written again,
    /// and at most `KNOWN_WRITES` are written a call (one system call each: a process's start
    /// names thousands of code objects, and the reader must not stall on them). The compat set
    /// does not read the table: nothing is written for it.
    pub fn set_known_codes(&mut self, words: &[u64]) {
        /// Writes to `KNOWN_CODES` a call, at most.
        const KNOWN_WRITES: usize = 256;
        self.write_known_codes(words, false, KNOWN_WRITES);
    }

    /// Tells the frame walk that these code objects (`known_code_word`s) are gone: it copies
    /// the heads of code at their addresses again. Only slots that hold the word are cleared;
    /// there are as many as code objects found freed or replaced in one read of the ring, at
    /// most `MAX_FORGETS`.
    pub fn forget_known_codes(&mut self, words: &[u64]) {
        /// Slots cleared a call, at most (a bound on system calls; a slot left set names one
        /// frame's code from what user space knew of it, as before the table).
        const MAX_FORGETS: usize = 4096;
        self.write_known_codes(words, true, MAX_FORGETS);
    }

    /// Writes each word to its `KNOWN_CODES` slot (`forget`: clears the slot that holds it),
    /// where that changes the slot, `max` writes at most. `known_codes` mirrors the table.
    fn write_known_codes(&mut self, words: &[u64], forget: bool, max: usize) {
        if self.programs.sample != names::PROG_SAMPLE || (forget && self.known_codes.is_empty()) {
            return;
        }
        let Ok(mut m) = Array::<_, u64>::try_from(
            self.bpf
                .map_mut(names::MAP_KNOWN_CODES)
                .expect("a map the object declares"),
        ) else {
            return;
        };
        if self.known_codes.is_empty() {
            self.known_codes = vec![0; profiler_common::KNOWN_CODES];
        }
        let mut writes = 0;
        for &w in words {
            let slot = profiler_common::known_code_slot(w);
            let held = &mut self.known_codes[slot as usize];
            let value = if forget { 0 } else { w };
            if (*held == w) != forget {
                continue;
            }
            if writes == max {
                break;
            }
            writes += 1;
            if m.set(slot, value, 0).is_ok() {
                *held = value;
            }
        }
    }

    /// Where a thread's stack mapping ends: its copies step over untouched pages below it.
    pub fn set_stack_top(&mut self, pid: u32, tid: u32, top: u64) -> Result<(), CaptureError> {
        self.insert(names::MAP_STACK_TOPS, thread_key(pid, tid), top)
    }

    pub fn remove_py_thread(&mut self, pid: u32, tid: u32) {
        if let Ok(mut m) = BpfHashMap::<_, u64, u64>::try_from(
            self.bpf.map_mut(names::MAP_PY_THREADS).expect("PY_THREADS"),
        ) {
            let _ = m.remove(&thread_key(pid, tid));
        }
    }

    /// What the scheduler program holds of each thread that it has not sent yet (an open span,
    /// the interval in progress): read when a run or a continuous interval ends. Bounded by the
    /// map's size.
    pub fn sched_snapshot(&self) -> Vec<(u64, ThreadSched)> {
        let Some(map) = self.bpf.map(names::MAP_SCHED) else {
            return Vec::new();
        };
        let Ok(m) = BpfHashMap::<_, u64, ThreadSched>::try_from(map) else {
            return Vec::new();
        };
        m.iter().filter_map(Result::ok).collect()
    }

    /// Every BPF counter by its contract name (`profiler_common::STATS`), summed over CPUs.
    pub fn counters(&self) -> Vec<(&'static str, u64)> {
        let (total, _) = self.stats();
        profiler_common::STATS
            .iter()
            .map(|&(i, name, _)| (name, total[i as usize]))
            .collect()
    }

    /// The reader of the programs' failure logs, when `debug_bpf` enabled them: each record
    /// becomes one `tachyon-bpf: bpf: ...` line on stderr as `flush` reads it.
    pub fn take_logs(&mut self) -> Option<BpfLogs> {
        aya_log::EbpfLogger::init_with_logger(&mut self.bpf, &BPF_LOG_LINES as &dyn log::Log).ok()
    }

    /// `--debug-bpf`: the failures of each kind that were not logged (beyond the first
    /// `LOG_FIRST` on each CPU), by kind name; kinds with none are left out.
    pub fn unlogged_failures(&self) -> Vec<(&'static str, u64)> {
        let Some(arr) = self
            .bpf
            .map(names::MAP_LOG_BUDGET)
            .and_then(|m| PerCpuArray::<_, u32>::try_from(m).ok())
        else {
            return Vec::new();
        };
        let first = profiler_common::LOG_FIRST;
        profiler_common::LOG_KIND_NAMES
            .iter()
            .enumerate()
            .filter_map(|(kind, &name)| {
                let per_cpu = arr.get(&(kind as u32), 0).ok()?;
                let n: u64 = per_cpu
                    .iter()
                    .map(|&c| c.saturating_sub(first) as u64)
                    .sum();
                (n > 0).then_some((name, n))
            })
            .collect()
    }

    /// The BPF program's counters, summed over CPUs, and the lost count per CPU.
    pub fn stats(&self) -> ([u64; STAT_COUNT as usize], Vec<(u32, u64)>) {
        let mut total = [0u64; STAT_COUNT as usize];
        let mut lost = Vec::new();
        let Some(map) = self.bpf.map(names::MAP_STATS) else {
            return (total, lost);
        };
        let Ok(arr) = PerCpuArray::<_, u64>::try_from(map) else {
            return (total, lost);
        };
        for (i, slot) in total.iter_mut().enumerate() {
            if let Ok(per_cpu) = arr.get(&(i as u32), 0) {
                *slot = per_cpu.iter().sum();
                if i as u32 == profiler_common::STAT_LOST {
                    lost = self
                        .cpus
                        .iter()
                        .map(|&c| (c, per_cpu.get(c as usize).copied().unwrap_or(0)))
                        .collect();
                }
            }
        }
        (total, lost)
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        self.detach();
    }
}

/// A program the kernel would not load, as one line (the verifier's conclusion) plus its log.
fn refusal(
    program: &'static str,
    purpose: &'static str,
    kernel: String,
    e: ProgramError,
) -> CaptureError {
    match e {
        ProgramError::LoadError {
            io_error,
            verifier_log,
        } => {
            let log = verifier_log.to_string();
            let permission =
                matches!(io_error.raw_os_error(), Some(libc::EPERM)) && log.trim().is_empty();
            // The verifier's conclusion is its last line that says something (the final lines
            // are statistics: "processed N insns ...", "verification time ...").
            let reason = log
                .lines()
                .rev()
                .map(str::trim)
                .find(|l| {
                    !l.is_empty()
                        && !l.starts_with("processed ")
                        && !l.starts_with("verification time")
                        && !l.starts_with("stack depth")
                        && !l.starts_with("-- END PROG LOAD LOG --")
                })
                .map(|l| format!("{io_error}: {l}"))
                .unwrap_or_else(|| io_error.to_string());
            CaptureError::Refused {
                program,
                purpose,
                kernel,
                reason,
                log,
                permission,
            }
        }
        other => CaptureError::Refused {
            program,
            purpose,
            kernel,
            reason: other.to_string(),
            log: String::new(),
            permission: false,
        },
    }
}

/// `BPF_OBJ_GET_INFO_BY_FD` on program `fd`, asking for its code's addresses and lengths.
/// Hand-written: aya reads a program's information without them.
fn jited_code(fd: std::os::fd::RawFd) -> Vec<(u64, u64, String)> {
    use aya_obj::generated::{bpf_cmd, bpf_prog_info};
    /// The `info` member of `union bpf_attr` (the kernel zero-fills the rest).
    #[repr(C)]
    struct InfoAttr {
        bpf_fd: u32,
        info_len: u32,
        info: u64,
    }
    let get = |info: &mut bpf_prog_info| -> bool {
        let mut attr = InfoAttr {
            bpf_fd: fd as u32,
            info_len: std::mem::size_of::<bpf_prog_info>() as u32,
            info: info as *mut bpf_prog_info as u64,
        };
        // SAFETY: the attribute and the info buffer (and the arrays it points to, sized by
        // its counts) live across the call.
        let r = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                bpf_cmd::BPF_OBJ_GET_INFO_BY_FD as libc::c_int,
                &mut attr as *mut InfoAttr,
                std::mem::size_of::<InfoAttr>(),
            )
        };
        r == 0
    };
    // SAFETY: an all-zero bpf_prog_info is a valid value (integers and arrays).
    let mut info: bpf_prog_info = unsafe { std::mem::zeroed() };
    if !get(&mut info) {
        return Vec::new();
    }
    let n = (info.nr_jited_ksyms as usize).min(256);
    if n == 0 || info.nr_jited_func_lens as usize != info.nr_jited_ksyms as usize {
        return Vec::new();
    }
    let (tag, name) = (info.tag, info.name);
    let mut ksyms = vec![0u64; n];
    let mut lens = vec![0u32; n];
    // SAFETY: as above.
    let mut info: bpf_prog_info = unsafe { std::mem::zeroed() };
    info.nr_jited_ksyms = n as u32;
    info.jited_ksyms = ksyms.as_mut_ptr() as u64;
    info.nr_jited_func_lens = n as u32;
    info.jited_func_lens = lens.as_mut_ptr() as u64;
    if !get(&mut info) {
        return Vec::new();
    }
    let name: String = name
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8 as char)
        .collect();
    let tag: String = tag.iter().map(|b| format!("{b:02x}")).collect();
    ksyms
        .into_iter()
        .zip(lens)
        .filter(|&(a, l)| a != 0 && l != 0)
        .map(|(a, l)| (a, l as u64, format!("bpf_prog_{tag}_{name}")))
        .collect()
}

/// The reader of the programs' log ring (`Capture::take_logs`); `flush` prints what it holds.
pub type BpfLogs = aya_log::EbpfLogger<&'static dyn log::Log>;

/// Where the programs' log records go: one line each on stderr, whatever the `log` filter
/// (they are asked for by `--debug-bpf`, not by `RUST_LOG`).
struct BpfLogLines;

static BPF_LOG_LINES: BpfLogLines = BpfLogLines;

impl log::Log for BpfLogLines {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &log::Record<'_>) {
        eprintln!("tachyon-bpf: bpf: {}", record.args());
    }

    fn flush(&self) {}
}

#[cfg(test)]
mod tests;
