//! The maps the programs share with user space, the per-CPU state of a capture, and the two
//! operations every program does on them: counting a statistic and deciding a ring wake-up.

use aya_ebpf::{
    bindings::{BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP},
    macros::map,
    maps::{Array, HashMap, LruHashMap, PerCpuArray, RingBuf},
};
use profiler_common::*;

#[map]
pub(crate) static CONFIG: Array<Config> = Array::with_max_entries(1, 0);
/// Processes to sample when `Config::all` is zero.
#[map]
pub(crate) static TARGETS: HashMap<u32, u32> = HashMap::with_max_entries(8192, 0);
/// Python processes: what the frame walk needs.
#[map]
pub(crate) static PY_PROCS: HashMap<u32, PyProcConfig> = HashMap::with_max_entries(8192, 0);
/// `thread_key(pid, tid)` -> thread state address. At its largest (5 MiB): a thread missing
/// here is found only by a short scan of its interpreter's thread list.
#[map]
pub(crate) static PY_THREADS: HashMap<u64, u64> = HashMap::with_max_entries(65536, 0);
#[map]
pub(crate) static STATS: PerCpuArray<u64> = PerCpuArray::with_max_entries(STAT_COUNT, 0);
/// One record buffer per CPU, indexed by CPU id: per-CPU maps cap values at 32 KiB, less than a
/// record. A perf_event program never nests on one CPU, so a CPU's slot has one user at a time.
/// Userspace sizes it to the number of possible CPUs.
#[map]
pub(crate) static SCRATCH: Array<[u8; SCRATCH_SIZE]> = Array::with_max_entries(1, 0);
/// 1 while this CPU's `tachyon_switch_in` (`sched_exit_tp`, interrupts on) captures: a sample
/// that interrupts it is skipped (`STAT_SAMPLE_NESTED`), as it would reuse the buffers in use.
#[map]
pub(crate) static CAPTURING: PerCpuArray<u32> = PerCpuArray::with_max_entries(1, 0);
#[map]
pub(crate) static FRAME: PerCpuArray<[u8; FRAME_BUF]> = PerCpuArray::with_max_entries(1, 0);
/// The state of this CPU's frame walk. In a map rather than on the stack: what the verifier
/// learns from a branch on a value it read from the stack stays attached to that stack slot, so
/// steps that branched differently on the process's layout would never look alike again, and
/// the bounded loop of the compat set would be verified many times over.
#[map]
pub(crate) static WALK: PerCpuArray<Walk> = PerCpuArray::with_max_entries(1, 0);
/// The code objects user space has read, as `known_code_word`s at their `known_code_slot`s:
/// the walk copies the head of any other frame's code (see `walk_frame`).
#[map]
pub(crate) static KNOWN_CODES: Array<u64> =
    Array::with_max_entries(profiler_common::KNOWN_CODES as u32, 0);
/// `thread_key(pid, tid)` -> the thread's scheduler accounting (see `ThreadSched`). A plain hash
/// map, not an LRU one: an entry is updated through a pointer across helper calls, which an
/// eviction on another CPU would silently void. `tachyon_exit` and a dead task's last switch
/// remove entries; user space removes those of processes it stops profiling. Declared at its
/// largest; user space sizes it to the host at load time (see `capture::sched_entries`).
#[map]
pub(crate) static SCHED: HashMap<u64, ThreadSched> =
    HashMap::with_max_entries(profiler_common::MAX_SCHED_ENTRIES, 0);
/// What each thread's switch-in has to decide, as of its last switch-out, at its slot
/// (`tid & (BLOCK_DEADLINE_SLOTS - 1)`): nothing (`idle_word`: it did not block, or is not
/// profiled), or, for a profiled thread that blocked, when its interval would be long enough to
/// be kept (`deadline_word`; see `sched::block_attr`). Its switch-in reads this word, not
/// `TARGETS` and its `SCHED` entry (hash look-ups, most of the program's cost): with nothing to
/// decide, or before the deadline (the interval is left to the sampling, `ATTR_NONE`, by its
/// next switch-out), it stops there. Another thread's word in the slot only sends the switch-in
/// the long way.
#[map]
pub(crate) static BLOCK_DEADLINES: Array<u64> =
    Array::with_max_entries(profiler_common::BLOCK_DEADLINE_SLOTS, 0);
/// Where a new `SCHED` entry is built, one per CPU (it does not fit on the BPF stack beside the
/// rest of the switch program).
#[map]
pub(crate) static SCHED_NEW: PerCpuArray<ThreadSched> = PerCpuArray::with_max_entries(1, 0);
/// `thread_key(pid, tid)` -> the end of the thread's stack mapping, for the threads whose copy
/// stopped at a page never touched below their frames (see `ustack::copy_chunk`); user
/// space adds them.
#[map]
pub(crate) static STACK_TOPS: LruHashMap<u64, u64> =
    LruHashMap::with_max_entries(profiler_common::MAX_STACK_TOP_ENTRIES, 0);
/// Each profiled process's pages mapped executable (`mm->exec_vm`) at its latest record: a
/// change marks the record `SAMPLE_MAPS_CHANGED`.
#[map]
pub(crate) static EXEC_VM: LruHashMap<u32, u64> = LruHashMap::with_max_entries(16384, 0);
/// Sample records. Userspace sets the size at load time.
#[map]
pub(crate) static SAMPLES: RingBuf = RingBuf::with_byte_size(1 << 24, 0);

#[inline(always)]
pub(crate) fn count(stat: u32) {
    if let Some(p) = STATS.get_ptr_mut(stat) {
        // SAFETY: a per-CPU slot that only this CPU's program instance touches.
        unsafe { *p += 1 };
    }
}

/// Ring-buffer notification: the reader polls, and is woken only when a good part of the buffer
/// is waiting (a wakeup per record would have the reader preempt the threads it profiles).
#[inline(always)]
pub(crate) fn wake_flags() -> u64 {
    let threshold = CONFIG.get(0).map(|c| c.wakeup_bytes as u64).unwrap_or(0);
    if SAMPLES.query(BPF_RB_AVAIL_DATA as u64) >= threshold {
        BPF_RB_FORCE_WAKEUP as u64
    } else {
        BPF_RB_NO_WAKEUP as u64
    }
}

/// State of one frame walk (in the `WALK` map). Scalars only: a step looks the buffers up
/// itself.
#[repr(C)]
pub(crate) struct Walk {
    pub(crate) pc: PyProcConfig,
    pub(crate) frame: u64,
    pub(crate) cpu: u32,
    pub(crate) pid: u32,
    /// Code heads to copy once the walk is done: their code objects and frames' indexes.
    pub(crate) snaps: u32,
    pub(crate) snap_code: [u64; PY_CODE_SNAPS],
    pub(crate) snap_at: [u32; PY_CODE_SNAPS],
    /// Scratch of one step: whether the frame runs code that runs once, and the next frame.
    pub(crate) once: u32,
    pub(crate) next: u64,
    /// The last frame read whose head was not copied (its code, 0 if none, and its index).
    pub(crate) callee: u64,
    pub(crate) callee_at: u32,
    /// The frame being read (here rather than in `FRAME`: one map lookup, and one stack slot,
    /// fewer in a callback that has 32 bytes of stack under the switch program).
    pub(crate) fbuf: [u8; FRAME_BUF],
    /// The first local of the innermost `Handle._run` frame (`PyProcConfig::handle_run_code`),
    /// or 0.
    pub(crate) handle: u64,
    /// 3.11, 3.12: the frame the first frame entered with must link to (the previous
    /// `_PyCFrame`'s), 0 once it did (or when there is none to check), 1 when it did not.
    pub(crate) expect: u64,
    /// The code heads chosen so far in this walk, by `copied_slot` of their code: a code that
    /// several frames run (the import machinery of a nested import) is copied once, and each of
    /// its frames points to that copy. `copied_walk` says which walk wrote a slot (`walks`).
    pub(crate) copied_code: [u64; COPIED_SLOTS],
    pub(crate) copied_k: [u32; COPIED_SLOTS],
    pub(crate) copied_walk: [u32; COPIED_SLOTS],
    pub(crate) walks: u32,
    /// The first copy `copy_unknown_head_step` takes (those `choose_unknown_code` chose).
    pub(crate) snap_from: u32,
    /// `copy_stack`'s state: the thread, its stack pointer, the top of its stack once looked
    /// up (0: not yet), where the copy goes, how much it wants and has, and its flags.
    pub(crate) copy_tid: u32,
    pub(crate) copy_sp: u64,
    pub(crate) copy_top: u64,
    pub(crate) copy_area: u32,
    pub(crate) copy_want: u32,
    pub(crate) copy_done: u32,
    pub(crate) copy_flags: u32,
}

/// Slots of `Walk::copied_code` (a power of two).
pub(crate) const COPIED_SLOTS: usize = 64;

#[inline(always)]
pub(crate) fn copied_slot(code: u64) -> usize {
    ((code >> 4) ^ (code >> 11)) as usize & (COPIED_SLOTS - 1)
}

/// Occurrences of each failure kind (`LOG_*`) on this CPU, for `--debug-bpf` (see `log`).
#[map]
pub(crate) static LOG_BUDGET: PerCpuArray<u32> = PerCpuArray::with_max_entries(LOG_KINDS, 0);
