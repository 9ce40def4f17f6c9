//! Loading and attaching the BPF program, the maps userspace feeds it, and the ring buffer of
//! sample records.

pub mod btf;
pub mod record;

use aya::maps::{Array, HashMap as BpfHashMap, MapData, PerCpuArray, RingBuf};
use aya::programs::perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent};
use aya::programs::{BtfTracePoint, PerfEvent, ProgramError};
use aya::{Btf, Ebpf, EbpfLoader};
use profiler_common::{
    thread_key, Config, PyProcConfig, MAX_USTACK, OFFCPU_NONE, STAT_COUNT, USTACK_CHUNK,
};

static BPF_OBJECT: &[u8] = aya::include_bytes_aligned!(env!("TACHYON_BPF_OBJECT"));

#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    #[error("loading the BPF program failed: {0}")]
    Load(String),
    #[error("attaching to the cpu-clock perf event on CPU {cpu} failed: {source}")]
    Attach {
        cpu: u32,
        #[source]
        source: ProgramError,
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
    /// The sampling rate, which also limits full off-CPU captures per thread.
    pub rate_hz: u64,
}

/// The scheduler and lifetime programs: (program name, tracepoint).
const TRACEPOINTS: [(&str, &str); 4] = [
    ("tachyon_switch", "sched_switch"),
    ("tachyon_fork", "sched_process_fork"),
    ("tachyon_exec", "sched_process_exec"),
    ("tachyon_exit", "sched_process_exit"),
];

pub struct Capture {
    bpf: Ebpf,
    attached: Vec<aya::programs::perf_event::PerfEventLinkId>,
    tracepoints: Vec<(&'static str, aya::programs::tp_btf::BtfTracePointLinkId)>,
    offcpu: u32,
    pub cpus: Vec<u32>,
    /// Holds the kernel's BPF run-time statistics on while it lives (None without
    /// CAP_SYS_ADMIN): the time the programs take is part of the profiler's cost.
    stats: Option<std::os::fd::OwnedFd>,
}

fn map_err<E: std::fmt::Display>(name: &'static str) -> impl Fn(E) -> CaptureError {
    move |e| CaptureError::Map(name, e.to_string())
}

/// Rounds a requested stack size to whole chunks within the supported range.
pub fn clamp_stack_size(bytes: usize) -> usize {
    let b = bytes.clamp(USTACK_CHUNK, MAX_USTACK);
    b / USTACK_CHUNK * USTACK_CHUNK
}

impl Capture {
    pub fn load(opts: &CaptureOptions) -> Result<Capture, CaptureError> {
        let ring = opts.ring_bytes.next_power_of_two().max(1 << 20);
        let possible =
            aya::util::nr_cpus().map_err(|(s, e)| CaptureError::Cpus(format!("{s}: {e}")))?;
        // Parsed once, for the loader and the tracepoints (it is most of the load's CPU time).
        let kernel_btf = Btf::from_sys_fs().map_err(|e| CaptureError::Load(e.to_string()))?;
        let mut bpf = EbpfLoader::new()
            .btf(Some(&kernel_btf))
            .map_max_entries("SAMPLES", ring)
            .map_max_entries("SCRATCH", possible as u32)
            .load(BPF_OBJECT)
            .map_err(|e| CaptureError::Load(format!("{e:#}")))?;
        let (task_pid_off, task_tgid_off, task_flags_off) =
            btf::task_offsets().map_err(CaptureError::Load)?;
        let cfg = Config {
            all: opts.all as u32,
            ustack_size: clamp_stack_size(opts.stack_size) as u32,
            self_tgid: std::process::id(),
            offcpu: opts.offcpu,
            follow_children: opts.follow_children as u32,
            task_pid_off,
            task_tgid_off,
            task_flags_off,
            exec_all: opts.exec_all as u32,
            wakeup_bytes: ring / 4,
            offcpu_min_gap_ns: 1_000_000_000 / opts.rate_hz.max(1),
        };
        let mut arr: Array<_, Config> = Array::try_from(bpf.map_mut("CONFIG").expect("CONFIG map"))
            .map_err(map_err("CONFIG"))?;
        arr.set(0, cfg, 0).map_err(map_err("CONFIG"))?;
        let prog: &mut PerfEvent = bpf
            .program_mut("tachyon_sample")
            .expect("program tachyon_sample")
            .try_into()
            .map_err(|e: ProgramError| CaptureError::Load(e.to_string()))?;
        prog.load()
            .map_err(|e| CaptureError::Load(verifier_text(&e)))?;
        for (name, tp) in TRACEPOINTS {
            if name == "tachyon_switch" && opts.offcpu == OFFCPU_NONE {
                continue;
            }
            let prog: &mut BtfTracePoint = bpf
                .program_mut(name)
                .expect("tracepoint program")
                .try_into()
                .map_err(|e: ProgramError| CaptureError::Load(e.to_string()))?;
            prog.load(tp, &kernel_btf)
                .map_err(|e| CaptureError::Load(format!("{name}: {}", verifier_text(&e))))?;
        }
        let cpus =
            aya::util::online_cpus().map_err(|(s, e)| CaptureError::Cpus(format!("{s}: {e}")))?;
        Ok(Capture {
            bpf,
            attached: Vec::new(),
            tracepoints: Vec::new(),
            offcpu: opts.offcpu,
            cpus,
            stats: aya::sys::enable_stats(aya::sys::Stats::RunTime).ok(),
        })
    }

    /// Time spent in this profiler's BPF programs and how many times they ran, when the
    /// kernel's statistics are on.
    pub fn bpf_cost(&self) -> Option<(std::time::Duration, u64)> {
        self.stats.as_ref()?;
        let mut total = (std::time::Duration::ZERO, 0);
        for (_, prog) in self.bpf.programs() {
            if let Ok(info) = prog.info() {
                total.0 += info.run_time();
                total.1 += info.run_count();
            }
        }
        Some(total)
    }

    /// Starts the lifetime programs (before the target starts, so its threads are seen born).
    pub fn attach_lifetimes(&mut self) -> Result<(), CaptureError> {
        for (name, tp) in TRACEPOINTS {
            if name == "tachyon_switch" {
                continue;
            }
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
            .map_err(|e: ProgramError| CaptureError::Load(e.to_string()))?;
        let link = prog
            .attach()
            .map_err(|source| CaptureError::Tracepoint { name: tp, source })?;
        self.tracepoints.push((name, link));
        Ok(())
    }

    /// Starts sampling: one software cpu-clock event per online CPU, every `1/rate` s of CPU time,
    /// and the scheduler program when off-CPU time is recorded.
    pub fn attach(&mut self, rate_hz: u64) -> Result<(), CaptureError> {
        if self.offcpu != OFFCPU_NONE {
            self.attach_tracepoint("tachyon_switch", "sched_switch")?;
        }
        let period_ns = (1_000_000_000 / rate_hz.max(1)).max(1);
        let prog: &mut PerfEvent = self
            .bpf
            .program_mut("tachyon_sample")
            .expect("program tachyon_sample")
            .try_into()
            .map_err(|e: ProgramError| CaptureError::Load(e.to_string()))?;
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

    /// Stops sampling (records already in the ring buffer stay readable).
    pub fn detach(&mut self) {
        for (name, link) in self.tracepoints.drain(..) {
            if let Some(Ok(prog)) = self
                .bpf
                .program_mut(name)
                .map(<&mut BtfTracePoint>::try_from)
            {
                let _ = prog.detach(link);
            }
        }
        if let Some(p) = self.bpf.program_mut("tachyon_sample") {
            if let Ok(prog) = <&mut PerfEvent>::try_from(p) {
                for link in self.attached.drain(..) {
                    let _ = prog.detach(link);
                }
            }
        }
    }

    pub fn take_ring(&mut self) -> RingBuf<MapData> {
        RingBuf::try_from(self.bpf.take_map("SAMPLES").expect("SAMPLES map")).expect("ring buffer")
    }

    pub fn add_target(&mut self, pid: u32) -> Result<(), CaptureError> {
        let mut m: BpfHashMap<_, u32, u32> =
            BpfHashMap::try_from(self.bpf.map_mut("TARGETS").expect("TARGETS"))
                .map_err(map_err("TARGETS"))?;
        m.insert(pid, 1, 0).map_err(map_err("TARGETS"))
    }

    pub fn set_py_proc(&mut self, pid: u32, cfg: &PyProcConfig) -> Result<(), CaptureError> {
        let mut m: BpfHashMap<_, u32, PyProcConfig> =
            BpfHashMap::try_from(self.bpf.map_mut("PY_PROCS").expect("PY_PROCS"))
                .map_err(map_err("PY_PROCS"))?;
        m.insert(pid, *cfg, 0).map_err(map_err("PY_PROCS"))
    }

    pub fn remove_py_proc(&mut self, pid: u32) {
        if let Ok(mut m) = BpfHashMap::<_, u32, PyProcConfig>::try_from(
            self.bpf.map_mut("PY_PROCS").expect("PY_PROCS"),
        ) {
            let _ = m.remove(&pid);
        }
    }

    pub fn set_py_thread(&mut self, pid: u32, tid: u32, tstate: u64) -> Result<(), CaptureError> {
        let mut m: BpfHashMap<_, u64, u64> =
            BpfHashMap::try_from(self.bpf.map_mut("PY_THREADS").expect("PY_THREADS"))
                .map_err(map_err("PY_THREADS"))?;
        m.insert(thread_key(pid, tid), tstate, 0)
            .map_err(map_err("PY_THREADS"))
    }

    pub fn remove_py_thread(&mut self, pid: u32, tid: u32) {
        if let Ok(mut m) =
            BpfHashMap::<_, u64, u64>::try_from(self.bpf.map_mut("PY_THREADS").expect("PY_THREADS"))
        {
            let _ = m.remove(&thread_key(pid, tid));
        }
    }

    /// The BPF program's counters, summed over CPUs, and the lost count per CPU.
    pub fn stats(&self) -> ([u64; STAT_COUNT as usize], Vec<(u32, u64)>) {
        let mut total = [0u64; STAT_COUNT as usize];
        let mut lost = Vec::new();
        let Some(map) = self.bpf.map("STATS") else {
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

fn verifier_text(e: &ProgramError) -> String {
    match e {
        ProgramError::LoadError {
            io_error,
            verifier_log,
        } => {
            let log = verifier_log.to_string();
            let tail: Vec<&str> = log.lines().rev().take(20).collect();
            format!(
                "{io_error}; verifier log (last lines):\n{}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            )
        }
        other => other.to_string(),
    }
}
