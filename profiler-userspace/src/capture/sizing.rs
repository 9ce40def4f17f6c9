//! How big the capture is made: the sampling period, the ring buffer, the scheduler map and
//! the stack copies, from the rate, the CPUs and the host's threads.

use profiler_common::{MAX_USTACK, USTACK_CHUNK};

/// The grid that periodic activity on a host keeps step with: kernel ticks (1, 4 or 10 ms) and
/// programs' timers are multiples of a millisecond.
pub(super) const TIMER_GRID_NS: u64 = 1_000_000;
/// How far the samples' phase against that grid moves at least each period: 1/64 of it, so the
/// samples of a thread go once round the grid in at most 64 periods.
pub(super) const MIN_PHASE_STEP_NS: u64 = TIMER_GRID_NS / 64;

/// The sampling period for `rate_hz`, in ns: `1/rate_hz`, unless that keeps step with the
/// millisecond grid (a period that is a multiple of a millisecond, or divides one, within
/// `MIN_PHASE_STEP_NS`): it is then moved to step `MIN_PHASE_STEP_NS` past it.
///
/// A period in step with the kernel's tick samples threads at the same point of every time
/// slice: at 1000 Hz, processes sharing their CPU with others were given 75-80% of their CPU
/// time in one run and 125% in another, as the phase of each run fell (20 processes of 20 ms
/// each: 314 or 499 samples of 400 ms; at 1013 Hz, 394-417 of 405). Hence the rates of 99 or 49 Hz that
/// are usual with sampling profilers; this keeps the round rates users ask for (1000 Hz:
/// every 1.015625 ms, 1.6% fewer samples) from being in step. The profile's interval is
/// the period used, so its times stay right.
pub fn sampling_period_ns(rate_hz: u64) -> u64 {
    let nominal = (1_000_000_000 / rate_hz.max(1)).max(1);
    if nominal >= TIMER_GRID_NS {
        // Its phase moves by its remainder each period (or by the remainder less the grid).
        let r = nominal % TIMER_GRID_NS;
        if r < MIN_PHASE_STEP_NS {
            return nominal - r + MIN_PHASE_STEP_NS;
        }
        if TIMER_GRID_NS - r < MIN_PHASE_STEP_NS {
            return nominal + (TIMER_GRID_NS - r) + MIN_PHASE_STEP_NS;
        }
        return nominal;
    }
    // Several samples a millisecond: `n` of them span about one, and the next `n` are moved by
    // what they miss (a quarter period at most: more would only bring another sample near).
    let step = MIN_PHASE_STEP_NS.min(nominal / 4);
    let n = (TIMER_GRID_NS + nominal / 2) / nominal;
    if (n * nominal).abs_diff(TIMER_GRID_NS) < step {
        return (TIMER_GRID_NS + step) / n;
    }
    nominal
}

/// The ring buffer's size when `--ring-mb` does not set it, in MiB: a second of samples of
/// 8 KiB on every CPU (the average record on a gunicorn service at 1 kHz, measured: 8 KB in cpu
/// mode, 1.8 KB in wall mode with its scheduler records; a deep stack's is up to 64 KiB, so a
/// quarter of a second of those), so that a reader that stalls for a moment, on a large
/// process's first symbols, loses nothing; a power of two between 8 MiB (off-CPU captures come
/// in bursts, whatever the rate) and 32 MiB. The ring is locked kernel memory, and mapped
/// twice: at 32 MiB it was two thirds of the profiler's RSS.
pub fn default_ring_mb(rate_hz: u64, cpus: usize) -> u32 {
    let bytes = (cpus.max(1) as u64)
        .saturating_mul(rate_hz)
        .saturating_mul(8 << 10);
    (bytes.div_ceil(1 << 20).clamp(8, 32) as u32).next_power_of_two()
}

/// At least this many entries in `SCHED`: a small host's threads can grow past their number at
/// start (a thread pool started later), and this many cost about 1 MiB of kernel memory.
const MIN_SCHED: u32 = 4096;

/// How many entries `SCHED` (each thread's scheduler accounting, 240 bytes an entry) and the
/// LRU map `STACK_TOPS` get. The kernel allocates and zeroes a hash map's every entry when it is
/// created (the programs that use them cannot allocate as they run): `SCHED` at its declared
/// size was 16 MiB of locked kernel memory on every host, and about 5% of start-up. It is made
/// with room for four times the threads on the host at start instead (`None`: not known, the
/// declared size). A host whose threads grow past that while profiled counts the threads that
/// found no room (`schedMapFull`): their samples are kept, their scheduler times are not. The
/// Python maps keep their declared sizes: a thread or process missing from them would lose its
/// Python frames, and they are small (5 and 2 MiB).
pub fn sched_entries(host_threads: Option<u32>) -> u32 {
    let Some(n) = host_threads else {
        return profiler_common::MAX_SCHED_ENTRIES;
    };
    let room = n.saturating_mul(4).checked_next_power_of_two();
    room.unwrap_or(u32::MAX)
        .clamp(MIN_SCHED, profiler_common::MAX_SCHED_ENTRIES)
}

/// The threads on the host now: the kernel's count of scheduling entities, the fourth field of
/// `/proc/loadavg` (`running/total`).
pub(super) fn host_threads() -> Option<u32> {
    let s = std::fs::read_to_string("/proc/loadavg").ok()?;
    parse_loadavg_threads(&s)
}

pub(super) fn parse_loadavg_threads(s: &str) -> Option<u32> {
    s.split_whitespace().nth(3)?.split_once('/')?.1.parse().ok()
}

/// Rounds a requested stack size to whole chunks within the supported range.
pub fn clamp_stack_size(bytes: usize) -> usize {
    let b = bytes.clamp(USTACK_CHUNK, MAX_USTACK);
    b / USTACK_CHUNK * USTACK_CHUNK
}
