//! The tachyon-bpf sampling program.
//!
//! A `perf_event` program on the software `cpu-clock` event of every CPU. For the interrupted
//! thread it assembles one record in a per-CPU scratch buffer and sends it through a ring buffer:
//! pid/tid/cpu/time/comm, the kernel callchain, the user registers (from the task when the sample
//! hit kernel mode), for Python threads the interpreter frame chain and the GIL/GC words, and a
//! copy of the user stack for DWARF unwinding in userspace. Everything is read while the sampled
//! thread is stopped, so all parts of a record describe the same instant.
//!
//! A `sched_switch` BTF tracepoint program accounts each profiled thread's on- and off-CPU time
//! in a map and sends it at sampling granularity, never per switch (see `ThreadSched`). It runs
//! for the thread leaving the CPU only: the thread's CPU time since its previous switch-out says
//! when it came back. When a thread leaves to block at a point it has not blocked at recently,
//! it captures the same record as a sample (the thread is current, so its stacks and Python
//! frames are those of the moment it stopped running).
//! `sched_process_fork`/`exec`/`exit` programs report lifetimes and follow children.
//!
//! One object for every kernel from 5.10 (ring buffers 5.8, BTF tracepoints 5.5, bounded loops
//! 5.3). Where kernels differ, the object holds two variants of a program, built from the same
//! code by a const parameter, and userspace loads the one the running kernel's BTF says fits:
//! - `tachyon_sample` walks Python frames and copies the user stack with `bpf_loop` (5.17+), and
//!   reads the user registers of a task in kernel mode with `bpf_task_pt_regs` (5.15+);
//!   `tachyon_sample_compat` walks and copies with bounded loops and finds the registers at the
//!   top of the task's kernel stack.
//! - `tachyon_switch` takes the task state from `sched_switch`'s `prev_state` argument (5.18+);
//!   `tachyon_switch_compat` reads it from the task, as those kernels' own tracepoint did. Its
//!   off-CPU capture is the compat sampler's, and it reads the user registers from the kernel
//!   stack where the modern one reads them through `bpf_task_pt_regs`'s typed pointer.
//!
//! So there are two sets: the modern one where the kernel has all three (5.18+), the compat one
//! everywhere else. Both produce the same records.
//! - `tachyon_exit` reads no argument that differs between kernels: `group_dead` (an argument
//!   only since 6.16) is derived from `signal->live`, which `do_exit` has already decremented.
#![no_std]
#![no_main]

use core::ffi::c_void;

use aya_ebpf::{
    bindings::{BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP},
    helpers::{
        bpf_get_current_pid_tgid, bpf_get_smp_processor_id, bpf_ktime_get_ns,
        bpf_probe_read_kernel,
        generated::{
            bpf_get_current_comm, bpf_get_current_task, bpf_get_current_task_btf, bpf_get_stack,
            bpf_loop, bpf_probe_read_user, bpf_task_pt_regs,
        },
    },
    macros::{btf_tracepoint, map, perf_event},
    maps::{Array, HashMap, LruHashMap, PerCpuArray, RingBuf},
    programs::{BtfTracePointContext, PerfEventContext},
    EbpfContext,
};
use profiler_common::*;

/// The user registers a record carries.
#[derive(Clone, Copy)]
pub struct UserRegs {
    pub ip: u64,
    pub sp: u64,
    /// The frame pointer: x86_64's `rbp`, arm64's `x29`.
    pub bp: u64,
    /// arm64's link register, `x30` (0 on x86_64).
    pub lr: u64,
}

/// What differs between the architectures the object is built for (`--cfg bpf_target_arch`,
/// chosen by the build): the layout of the saved user registers.
#[cfg(not(bpf_target_arch = "aarch64"))]
mod arch {
    pub use aya_ebpf::bindings::pt_regs as Regs;

    use super::UserRegs;

    /// The registers, when they were saved in user mode (the code segment's privilege level).
    #[inline(always)]
    pub fn user(r: &Regs) -> Option<UserRegs> {
        (r.cs & 3 == 3).then_some(UserRegs {
            ip: r.rip,
            sp: r.rsp,
            bp: r.rbp,
            lr: 0,
        })
    }

    /// Reads the user registers saved at `addr` (a `struct pt_regs`): `Err` when the read
    /// fails, `Ok(None)` when they were not saved in user mode.
    #[inline(always)]
    pub fn read_user(addr: u64) -> Result<Option<UserRegs>, ()> {
        super::read_kernel::<Regs>(addr).map(|r| user(&r)).ok_or(())
    }

    pub const IP_OFFSET: usize = core::mem::offset_of!(Regs, rip);
    pub const SP_OFFSET: usize = core::mem::offset_of!(Regs, rsp);
}

/// arm64: `struct pt_regs` begins with `struct user_pt_regs` (x0-x30, sp, pc, pstate), which is
/// also what a perf event's context holds.
#[cfg(bpf_target_arch = "aarch64")]
mod arch {
    pub use aya_ebpf::bindings::user_pt_regs as Regs;

    use super::UserRegs;

    /// `PSR_MODE_MASK` and the 32-bit bit: EL0 in AArch64 state is 0 under both.
    const MODE_MASK: u64 = 0x1f;

    #[inline(always)]
    pub fn user(r: &Regs) -> Option<UserRegs> {
        (r.pstate & MODE_MASK == 0).then_some(UserRegs {
            ip: r.pc,
            sp: r.sp,
            bp: r.regs[29],
            lr: r.regs[30],
        })
    }

    /// Reads x29, x30, sp, pc and pstate (contiguous) from the `pt_regs` at `addr`: 40 bytes
    /// of BPF stack, not the whole 272.
    #[inline(always)]
    pub fn read_user(addr: u64) -> Result<Option<UserRegs>, ()> {
        let tail = super::read_kernel::<[u64; 5]>(addr + X29_OFFSET as u64).ok_or(())?;
        Ok((tail[4] & MODE_MASK == 0).then_some(UserRegs {
            ip: tail[3],
            sp: tail[2],
            bp: tail[0],
            lr: tail[1],
        }))
    }

    const X29_OFFSET: usize = core::mem::offset_of!(Regs, regs) + 29 * 8;
    pub const IP_OFFSET: usize = core::mem::offset_of!(Regs, pc);
    pub const SP_OFFSET: usize = core::mem::offset_of!(Regs, sp);
}

#[map]
static CONFIG: Array<Config> = Array::with_max_entries(1, 0);
/// Processes to sample when `Config::all` is zero.
#[map]
static TARGETS: HashMap<u32, u32> = HashMap::with_max_entries(8192, 0);
/// Python processes: what the frame walk needs.
#[map]
static PY_PROCS: HashMap<u32, PyProcConfig> = HashMap::with_max_entries(8192, 0);
/// `thread_key(pid, tid)` -> thread state address. At its largest (5 MiB): a thread missing
/// here is found only by a short scan of its interpreter's thread list.
#[map]
static PY_THREADS: HashMap<u64, u64> = HashMap::with_max_entries(65536, 0);
#[map]
static STATS: PerCpuArray<u64> = PerCpuArray::with_max_entries(STAT_COUNT, 0);
/// One record buffer per CPU, indexed by CPU id: per-CPU maps cap values at 32 KiB, less than a
/// record. A perf_event program never nests on one CPU, so a CPU's slot has one user at a time.
/// Userspace sizes it to the number of possible CPUs.
#[map]
static SCRATCH: Array<[u8; SCRATCH_SIZE]> = Array::with_max_entries(1, 0);
#[map]
static FRAME: PerCpuArray<[u8; FRAME_BUF]> = PerCpuArray::with_max_entries(1, 0);
/// The state of this CPU's frame walk. In a map rather than on the stack: what the verifier
/// learns from a branch on a value it read from the stack stays attached to that stack slot, so
/// steps that branched differently on the process's layout would never look alike again, and
/// the bounded loop of the compat set would be verified many times over.
#[map]
static WALK: PerCpuArray<Walk> = PerCpuArray::with_max_entries(1, 0);
/// The code objects user space has read, as `known_code_word`s at their `known_code_slot`s:
/// the walk copies the head of any other frame's code (see `step`).
#[map]
static KNOWN_CODES: Array<u64> = Array::with_max_entries(profiler_common::KNOWN_CODES as u32, 0);
/// `thread_key(pid, tid)` -> the thread's scheduler accounting (see `ThreadSched`). A plain hash
/// map, not an LRU one: an entry is updated through a pointer across helper calls, which an
/// eviction on another CPU would silently void. `tachyon_exit` and a dead task's last switch
/// remove entries; user space removes those of processes it stops profiling. Declared at its
/// largest; user space sizes it to the host at load time (see `capture::sched_entries`).
#[map]
static SCHED: HashMap<u64, ThreadSched> =
    HashMap::with_max_entries(profiler_common::MAX_SCHED_ENTRIES, 0);
/// Where a new `SCHED` entry is built, one per CPU (it does not fit on the BPF stack beside the
/// rest of the switch program).
#[map]
static SCHED_NEW: PerCpuArray<ThreadSched> = PerCpuArray::with_max_entries(1, 0);
/// `thread_key(pid, tid)` -> the end of the thread's stack mapping, for the threads whose copy
/// stopped at a page never touched below their frames (see the copy in `finish_sample`); user
/// space adds them.
#[map]
static STACK_TOPS: LruHashMap<u64, u64> =
    LruHashMap::with_max_entries(profiler_common::MAX_STACK_TOP_ENTRIES, 0);
/// Each profiled process's pages mapped executable (`mm->exec_vm`) at its latest record: a
/// change marks the record `SAMPLE_MAPS_CHANGED`.
#[map]
static EXEC_VM: LruHashMap<u32, u64> = LruHashMap::with_max_entries(16384, 0);
/// Sample records. Userspace sets the size at load time.
#[map]
static SAMPLES: RingBuf = RingBuf::with_byte_size(1 << 24, 0);

/// The sampler for kernels with `bpf_loop` and `bpf_task_pt_regs` (5.17+).
#[perf_event]
pub fn tachyon_sample(ctx: PerfEventContext) -> u32 {
    sample::<true>(ctx)
}

/// The sampler for older kernels (5.10+): a bounded frame loop, registers from the kernel stack.
#[perf_event]
pub fn tachyon_sample_compat(ctx: PerfEventContext) -> u32 {
    sample::<false>(ctx)
}

#[inline(always)]
fn sample<const MODERN: bool>(ctx: PerfEventContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let pid = (pid_tgid >> 32) as u32;
    let tid = pid_tgid as u32;
    if tid == 0 {
        return 0; // the idle task
    }
    let Some(cfg) = CONFIG.get(0) else {
        return 0;
    };
    if !targeted(cfg, pid) {
        return 0;
    }
    // SAFETY: the context of a perf_event program is a bpf_perf_event_data.
    let regs: &arch::Regs = unsafe { &(*ctx.ctx).regs };
    // SAFETY: helper without preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    capture::<MODERN>(
        ctx.as_ptr(),
        cfg,
        RECORD_SAMPLE,
        pid,
        tid,
        now,
        Some(regs),
        0,
    );
    0
}

/// `sched_switch(preempt, prev, next, prev_state)` (5.18+): runs on the CPU switching, with `prev`
/// current. The modern set: captures use `bpf_loop` and `bpf_task_pt_regs` too.
#[btf_tracepoint(function = "sched_switch")]
pub fn tachyon_switch(ctx: BtfTracePointContext) -> u32 {
    switch::<true, true>(&ctx);
    0
}

/// `sched_switch(preempt, prev, next)` (before 5.18): the state is read from `prev`.
#[btf_tracepoint(function = "sched_switch")]
pub fn tachyon_switch_compat(ctx: BtfTracePointContext) -> u32 {
    switch::<false, true>(&ctx);
    0
}

/// `tachyon_switch` for times only (`OFFCPU_TIMES`, cpu mode): the same accounting, and no
/// capture of the threads that block, so that the verifier does not walk one at start-up (it
/// took 60% of the start-up's CPU time).
#[btf_tracepoint(function = "sched_switch")]
pub fn tachyon_switch_times(ctx: BtfTracePointContext) -> u32 {
    switch::<true, false>(&ctx);
    0
}

/// `tachyon_switch_compat` for times only.
#[btf_tracepoint(function = "sched_switch")]
pub fn tachyon_switch_times_compat(ctx: BtfTracePointContext) -> u32 {
    switch::<false, false>(&ctx);
    0
}

/// The state `prev` leaves the CPU in: 0 when preempted (still runnable), else its sleep state.
#[inline(always)]
fn prev_state<const ARG: bool>(ctx: &BtfTracePointContext, cfg: &Config, prev: u64) -> u64 {
    if ARG {
        return ctx.arg::<u64>(3) & 0xffff_ffff;
    }
    // What the tracepoint itself reported on these kernels: a preempted task is runnable
    // whatever its state word says; otherwise the state word (a u32 `__state` from 5.14, a long
    // `state` before it; little-endian, so its low 32 bits are at the same address).
    if ctx.arg::<u64>(0) & 0xff != 0 {
        return 0;
    }
    // SAFETY: kernel read through the checked helper.
    unsafe { bpf_probe_read_kernel((prev + cfg.task_state_off as u64) as *const u32) }
        .map(|s| s as u64)
        .unwrap_or(0)
}

/// `TASK_DEAD`: the state of a task's very last switch, after `sched_process_exit`.
const TASK_DEAD: u64 = 0x80;

/// Accounts the thread leaving the CPU (`prev`, current here). Nothing is sent per switch: each
/// thread's intervals are summed in `SCHED` and sent at sampling granularity (see
/// `ThreadSched`). Only the leaving side is traced: since its previous switch-out the thread was
/// off CPU, then on CPU for the CPU time it used meanwhile, so this one event closes both
/// intervals (and the program does nothing for the thread coming in). A thread that leaves to
/// block is captured only where it blocks at a point it has not blocked at recently (see
/// `block_attr`).
/// `STACKS`: blocked threads may be captured (`OFFCPU_STACKS`); without it, times only.
#[inline(always)]
fn switch<const MODERN: bool, const STACKS: bool>(ctx: &BtfTracePointContext) -> Option<()> {
    let cfg = CONFIG.get(0)?;
    let pid_tgid = bpf_get_current_pid_tgid();
    let pid = (pid_tgid >> 32) as u32;
    let tid = pid_tgid as u32;
    if tid == 0 || !targeted(cfg, pid) {
        return None;
    }
    let prev = ctx.arg::<u64>(1);
    // Only `--all` can target a kernel thread (a process's tgid is never a kernel thread's).
    if cfg.all != 0 && is_kthread(cfg, prev) {
        return None;
    }
    // SAFETY: helper without preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    let prev_state = prev_state::<MODERN>(ctx, cfg, prev);
    let key = thread_key(pid, tid);
    if prev_state & TASK_DEAD != 0 {
        // Its exit was accounted by `tachyon_exit`.
        let _ = SCHED.remove(key);
        return None;
    }
    let sum = read_kernel::<u64>(prev + cfg.task_sum_exec_off as u64)?;
    let st = match SCHED.get_ptr_mut(key) {
        // SAFETY: a live map value; one switch of a thread runs at a time.
        Some(p) => unsafe { &mut *p },
        None => {
            // First seen: it came on the CPU when it last got one; before that is not known.
            let slice = read_kernel::<u64>(prev + cfg.task_prev_sum_exec_off as u64)
                .map(|p| sum.saturating_sub(p))
                .unwrap_or(0);
            let fresh = SCHED_NEW.get_ptr_mut(0)?;
            // SAFETY: this CPU's slot; `sched_switch` runs with interrupts off, so nothing else
            // on this CPU uses it meanwhile.
            let fresh = unsafe { &mut *fresh };
            fresh.since_ns = now.saturating_sub(slice);
            fresh.last_sum = sum;
            fresh.attr = ATTR_UNKNOWN;
            zero(&mut fresh.span_start);
            zero(&mut fresh.span_end);
            zero(&mut fresh.on_ns);
            zero_all(&mut fresh.off_ns);
            zero(&mut fresh.switches);
            zero(&mut fresh.next_slot);
            zero_all(&mut fresh.slot_sig);
            zero_all(&mut fresh.slot_cap);
            zero(&mut fresh.tat);
            // By reference: a copy by value would land on the stack this map slot avoids.
            #[allow(clippy::needless_borrows_for_generic_args)]
            let inserted = SCHED.insert(key, &*fresh, 0);
            if inserted.is_err() {
                count(STAT_SCHED_FULL);
                return None;
            }
            // SAFETY: as above.
            unsafe { &mut *SCHED.get_ptr_mut(key)? }
        }
    };
    close_intervals(st, key, now, sum);
    st.attr = if !STACKS || cfg.offcpu != OFFCPU_STACKS {
        ATTR_NONE
    } else if prev_state == 0 {
        // Preempted while runnable: it stopped where it ran.
        ATTR_LATEST
    } else {
        block_attr::<MODERN>(ctx.as_ptr(), cfg, st, pid, tid, now, prev_state)
    };
    st.since_ns = now;
    st.last_sum = sum;
    Some(())
}

/// The thread, last seen leaving at `st.since_ns`, is leaving again at `now` with CPU time
/// `sum`: it was off CPU, then on CPU for the CPU time it used meanwhile.
#[inline(always)]
fn close_intervals(st: &mut ThreadSched, key: u64, now: u64, sum: u64) {
    let since = st.since_ns;
    let mut on = sum.saturating_sub(st.last_sum);
    if on > now.saturating_sub(since) {
        on = now.saturating_sub(since);
    }
    let back = now - on;
    if st.attr != ATTR_UNKNOWN && back > since {
        interval(st, key, since, back, 0);
    }
    if on > 0 {
        interval(st, key, back, now, 1);
    }
}

/// `add_interval`, then what it says to send. The sending is a subprogram of its own, called
/// from here rather than from `add_interval`: three frames deep (the switch program's, then
/// two), the 5.10 verifier's rounding of each frame's stack takes the chain past its 512 bytes.
#[inline(always)]
fn interval(st: &mut ThreadSched, key: u64, t0: u64, t1: u64, on: u64) {
    let send = add_interval(st, key, t0, t1, on);
    if send != SEND_NONE {
        emit(st, key, t0, t1, send | on);
    }
}

/// What `add_interval` leaves to send: nothing, the open span, or the open span and then the
/// interval alone (or'ed with `on`, the low bit, for `emit`).
const SEND_NONE: u64 = 0;
const SEND_SPAN: u64 = 2;
const SEND_ALONE: u64 = 4;

/// One interval of the thread (`key`), `t0..t1`, on CPU (`on` 1) or off (charged to
/// `st.attr`): a long one (a sampling period or more) is sent alone, after the open span; a
/// short one joins the span, which is sent once it covers a sampling period. Returns what to
/// send (`SEND_*`). A subprogram, not inlined: its two call sites would otherwise multiply the
/// paths the verifier walks (and its time at start-up) in every program that closes intervals.
#[inline(never)]
fn add_interval(st: &mut ThreadSched, _key: u64, t0: u64, t1: u64, on: u64) -> u64 {
    let Some(cfg) = CONFIG.get(0) else {
        return SEND_NONE;
    };
    let d = t1.saturating_sub(t0);
    if d >= cfg.sched_span_ns {
        return SEND_ALONE;
    }
    if st.span_start == 0 {
        st.span_start = t0;
    }
    st.span_end = t1;
    st.switches += 1;
    if on != 0 {
        st.on_ns += d;
    } else if let Some(o) = st.off_ns.get_mut(st.attr as usize) {
        *o += d;
    }
    if t1.saturating_sub(st.span_start) >= cfg.sched_span_ns {
        return SEND_SPAN;
    }
    SEND_NONE
}

/// Sends the thread's open span, if any (and empties it), then with `SEND_ALONE` in `what` the
/// interval `t0..t1` alone (on CPU when `what`'s low bit is set). One subprogram for every
/// record the accounting sends: the verifier walks its ring-buffer code once a call site, not
/// once per path of its callers.
#[inline(never)]
fn emit(st: &mut ThreadSched, key: u64, t0: u64, t1: u64, what: u64) {
    let (pid, tid) = ((key >> 32) as u32, key as u32);
    flush(st, pid, tid);
    if what & SEND_ALONE != 0 {
        send_interval(st, pid, tid, t0, t1, what & 1 != 0);
    }
}

/// Sends the open span of short intervals, if any, and empties it.
#[inline(always)]
fn flush(st: &mut ThreadSched, pid: u32, tid: u32) {
    if st.span_start == 0 {
        return;
    }
    if let Some(mut e) = SAMPLES.reserve::<SchedRecord>(0) {
        let r = e.as_mut_ptr();
        // SAFETY: a reserved ring-buffer entry of the record's size, written whole below.
        unsafe {
            sched_header(r, pid, tid, st.span_start, st.span_end);
            (*r).on_ns = st.on_ns;
            (*r).off_ns = st.off_ns;
            (*r).slot_cap = st.slot_cap;
            (*r).switches = st.switches;
            (*r).attr = 0;
        }
        e.submit(wake_flags());
        count(STAT_SCHED_RECORDS);
    } else {
        count(STAT_EVENTS_LOST);
    }
    zero(&mut st.span_start);
    zero(&mut st.span_end);
    zero(&mut st.on_ns);
    zero_all(&mut st.off_ns);
    zero(&mut st.switches);
}

/// Zeroes `place` with one store. Plain stores of zero side by side are merged into a call to
/// `memset`, which this target builds as a byte loop: run byte by byte on every record, and
/// walked byte by byte by the verifier at start-up (a 160-byte one was 800 instructions).
#[inline(always)]
fn zero<T: Copy + Default>(place: &mut T) {
    // SAFETY: a valid place, by its reference.
    unsafe { core::ptr::write_volatile(place, T::default()) }
}

/// Copies an array word by word (as a whole, it may be a byte loop: see `zero`).
#[inline(always)]
fn copy_all<const N: usize>(dst: &mut [u64; N], src: &[u64; N]) {
    for (d, s) in dst.iter_mut().zip(src.iter()) {
        // SAFETY: a valid place, by its reference.
        unsafe { core::ptr::write_volatile(d, *s) }
    }
}

/// `zero` for each word of an array.
#[inline(always)]
fn zero_all<const N: usize>(words: &mut [u64; N]) {
    for w in words.iter_mut() {
        zero(w);
    }
}

/// Sends one interval, `t0..t1`, alone.
#[inline(always)]
fn send_interval(st: &ThreadSched, pid: u32, tid: u32, t0: u64, t1: u64, on: bool) {
    let Some(mut e) = SAMPLES.reserve::<SchedRecord>(0) else {
        count(STAT_EVENTS_LOST);
        return;
    };
    let r = e.as_mut_ptr();
    let d = t1.saturating_sub(t0);
    // SAFETY: a reserved ring-buffer entry of the record's size, written whole below.
    unsafe {
        sched_header(r, pid, tid, t0, t1);
        (*r).on_ns = if on { d } else { 0 };
        zero_all(&mut (*r).off_ns);
        if !on {
            if let Some(o) = (*r).off_ns.get_mut(st.attr as usize) {
                *o = d;
            }
        }
        copy_all(&mut (*r).slot_cap, &st.slot_cap);
        (*r).switches = 0;
        (*r).attr = st.attr;
    }
    e.submit(wake_flags());
    count(STAT_SCHED_RECORDS);
}

/// # Safety
/// `r` points to a writable `SchedRecord`.
#[inline(always)]
unsafe fn sched_header(r: *mut SchedRecord, pid: u32, tid: u32, t0: u64, t1: u64) {
    (*r).kind = RECORD_SCHED;
    (*r).cpu = bpf_get_smp_processor_id();
    (*r).pid = pid;
    (*r).tid = tid;
    (*r).t0_ns = t0;
    (*r).t1_ns = t1;
}

/// Where the off-CPU interval of a thread that blocks now is charged. A blocking point is known
/// by its signature (`block_signature`); the thread keeps its last `SCHED_SLOTS` points, each with
/// the capture taken there. A point it blocked at recently has the same stack: its capture
/// applies, and nothing is copied. Only a new point is captured (a thread that ran in between
/// and blocks elsewhere is never charged to an older stack), at most 16 times a sampling period
/// per thread with bursts of 16 (a cell-rate limiter: `tat` is when the next is due). A new point
/// beyond that budget, or whose capture the full ring refused, is time without a stack.
#[inline(always)]
fn block_attr<const MODERN: bool>(
    ctx: *mut c_void,
    cfg: &Config,
    st: &mut ThreadSched,
    pid: u32,
    tid: u32,
    now: u64,
    prev_state: u64,
) -> u32 {
    let sig = block_signature::<MODERN>(cfg, pid, tid);
    for i in 0..SCHED_SLOTS {
        if st.slot_cap[i] != 0 && st.slot_sig[i] == sig {
            return i as u32;
        }
    }
    let gap = cfg.sched_span_ns;
    if st.tat > now.saturating_add(gap) {
        count(STAT_OFF_UNCAPTURED);
        return ATTR_UNCAPTURED;
    }
    let slot = (st.next_slot as usize) % SCHED_SLOTS;
    if st.off_ns[slot] != 0 {
        // The open span charges time to the capture this slot is about to forget.
        emit(st, thread_key(pid, tid), 0, 0, SEND_SPAN);
    }
    if !capture::<MODERN>(ctx, cfg, RECORD_SWITCH_OUT, pid, tid, now, None, prev_state) {
        count(STAT_OFF_UNCAPTURED);
        return ATTR_UNCAPTURED;
    }
    st.slot_sig[slot] = sig;
    st.slot_cap[slot] = now;
    st.next_slot = (slot + 1) as u32;
    st.tat = if st.tat > now { st.tat } else { now } + gap / 16;
    count(STAT_SWITCH_CAPTURES);
    slot as u32
}

/// `sched_process_fork(parent, child)`, in the parent.
#[btf_tracepoint(function = "sched_process_fork")]
pub fn tachyon_fork(ctx: BtfTracePointContext) -> u32 {
    fork(&ctx);
    0
}

fn fork(ctx: &BtfTracePointContext) -> Option<()> {
    let cfg = CONFIG.get(0)?;
    let pid_tgid = bpf_get_current_pid_tgid();
    let pid = (pid_tgid >> 32) as u32;
    if !targeted(cfg, pid) {
        return None;
    }
    let (cpid, ctid) = task_ids(cfg, ctx.arg::<u64>(1))?;
    let mut wake = wake_flags();
    if cpid == ctid && cpid != pid {
        // A new process. Forked by a Python process, it runs the same interpreter at the same
        // addresses: it is walked as its parent is from its first sample, and the reader is
        // woken to name it (a pool's worker may live a few ms).
        let python = PY_PROCS.get_ptr(pid);
        let follow = cfg.follow_children != 0 || (cfg.follow_python_forks != 0 && python.is_some());
        if follow {
            let _ = TARGETS.insert(cpid, 1, 0);
        }
        if let Some(pc) = python.filter(|_| follow || cfg.all != 0) {
            // By reference to the map value: a copy by value would take 176 bytes of stack.
            // SAFETY: a live map value, copied at once by the helper.
            #[allow(clippy::needless_borrows_for_generic_args)]
            let _ = PY_PROCS.insert(cpid, unsafe { &*pc }, 0);
            wake = BPF_RB_FORCE_WAKEUP as u64;
        }
    }
    // SAFETY: helper without preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    event(
        RECORD_FORK,
        pid,
        pid_tgid as u32,
        now,
        cpid as u64,
        ctid as u64,
        wake,
    );
    Some(())
}

/// A name that starts with `python`, as its first word (little-endian) shows.
const PYTHON_NAME: u64 = u64::from_le_bytes(*b"python\0\0");
const PYTHON_MASK: u64 = 0xffff_ffff_ffff;

/// `sched_process_exec(p, old_pid, bprm)`, in the process after the new program is loaded.
#[btf_tracepoint(function = "sched_process_exec")]
pub fn tachyon_exec(_ctx: BtfTracePointContext) -> u32 {
    let Some(cfg) = CONFIG.get(0) else {
        return 0;
    };
    let pid_tgid = bpf_get_current_pid_tgid();
    let pid = (pid_tgid >> 32) as u32;
    // A new program: never walked with the old one's layout, from its first sample (user space
    // installs the new one's, if it is Python).
    let _ = PY_PROCS.remove(pid);
    if cfg.exec_all != 0 || targeted(cfg, pid) {
        // SAFETY: helper without preconditions.
        let now = unsafe { bpf_ktime_get_ns() };
        // A Python interpreter that starts now is looked at at once: a polled read came up to
        // a tick later, when its start-up (20-30 ms) was often over. Other programs wait for
        // the poll: a host may start hundreds a second (shell commands, health checks), and a
        // wakeup each would cost the reader more than all it does for them. The name is the
        // one the program was started by (a script's interpreter's, after `#!`): the exec
        // record's `comm`, which user space tests alike (`python::python_name`).
        // Not zeroed first: zeroing is a call to `memset` (see `zero`), and the helper
        // writes every byte (zeroes when it fails).
        let mut comm = core::mem::MaybeUninit::<[u64; 2]>::uninit();
        // SAFETY: 16 writable bytes, all written by the helper.
        let first = unsafe {
            bpf_get_current_comm(comm.as_mut_ptr() as *mut c_void, 16);
            comm.assume_init()[0]
        };
        let wake = if first & PYTHON_MASK == PYTHON_NAME {
            BPF_RB_FORCE_WAKEUP as u64
        } else {
            wake_flags()
        };
        event(RECORD_EXEC, pid, pid_tgid as u32, now, 0, 0, wake);
    }
    0
}

/// `sched_process_exit(p)` (`p, group_dead` since 6.16), in the exiting thread.
#[btf_tracepoint(function = "sched_process_exit")]
pub fn tachyon_exit(_ctx: BtfTracePointContext) -> u32 {
    let Some(cfg) = CONFIG.get(0) else {
        return 0;
    };
    let pid_tgid = bpf_get_current_pid_tgid();
    let pid = (pid_tgid >> 32) as u32;
    let tid = pid_tgid as u32;
    if !targeted(cfg, pid) {
        return 0;
    }
    // `do_exit` decrements `signal->live` before this tracepoint: 0 means the last thread.
    // (Two threads exiting at once may both see 0; the process is ending either way.)
    // SAFETY: helper without preconditions.
    let task = unsafe { bpf_get_current_task() };
    let live = read_kernel::<u64>(task + cfg.task_signal_off as u64)
        .and_then(|signal| read_kernel::<u32>(signal + cfg.signal_live_off as u64));
    let group_dead = matches!(live, Some(0)) as u64;
    // SAFETY: helper without preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    let key = thread_key(pid, tid);
    // What it holds (its open span; off CPU since its last switch-out, then on CPU until now)
    // is sent before its exit, for user space to close: straight-line code, so the verifier
    // walks it at once.
    // SAFETY: a live map value, removed right after.
    if let Some(st) = unsafe { SCHED.get_ptr(key).map(|p| &*p) } {
        if let Some(mut e) = SAMPLES.reserve::<ExitSchedRecord>(0) {
            let r = e.as_mut_ptr();
            let sum = read_kernel::<u64>(task + cfg.task_sum_exec_off as u64);
            // SAFETY: a reserved ring-buffer entry of the record's size, written whole here.
            unsafe {
                (*r).kind = RECORD_EXIT_SCHED;
                (*r).cpu = bpf_get_smp_processor_id();
                (*r).pid = pid;
                (*r).tid = tid;
                (*r).time_ns = now;
                (*r).sum_ns = sum.unwrap_or(0);
                // One helper call: a struct assignment compiles to a byte loop here, which the
                // verifier walked byte by byte. A map value always reads.
                let size = core::mem::size_of::<ThreadSched>() as u32;
                let dst = core::ptr::addr_of_mut!((*r).sched);
                if aya_ebpf::helpers::generated::bpf_probe_read_kernel(
                    dst as *mut c_void,
                    size,
                    st as *const ThreadSched as *const c_void,
                ) != 0
                    || sum.is_none()
                {
                    // Nothing to close: the span only (if the copy failed, not even that).
                    (*r).sched.since_ns = 0;
                }
            }
            e.submit(wake_flags());
            count(STAT_SCHED_RECORDS);
        } else {
            count(STAT_EVENTS_LOST);
        }
    }
    let _ = SCHED.remove(key);
    event(RECORD_EXIT, pid, tid, now, group_dead, 0, wake_flags());
    // A thread state the BPF side found itself (`thread_state`) is not user space's to remove.
    let _ = PY_THREADS.remove(thread_key(pid, tid));
    let _ = STACK_TOPS.remove(key);
    if group_dead != 0 {
        let _ = EXEC_VM.remove(pid);
    }
    if group_dead != 0 && cfg.all == 0 {
        // The pid may be reused by an unrelated program.
        let _ = TARGETS.remove(pid);
    }
    0
}

/// Where the stack the current thread uses ends, or 0 when not known (its copy then goes on to
/// the end of its mapping or its size limit): for a process's main thread, a little above
/// `mm->start_stack`, the stack pointer the program started with (its outermost frame is below
/// it; above it are only the program's arguments, environment and auxiliary vector, 4-12 KiB);
/// for another thread, its thread pointer (glibc puts the thread's control block there, and its
/// thread-local storage beside it, above the thread's frames), when that is above the stack
/// pointer and within a copy's reach. A subprogram: it returns one word.
#[inline(never)]
fn stack_in_use_end(cfg: &Config, pid: u32, tid: u32, sp: u64) -> u64 {
    // SAFETY: helper without preconditions.
    let task = unsafe { bpf_get_current_task() };
    let end = if pid == tid {
        if cfg.task_mm_off == 0 || cfg.mm_start_stack_off == 0 {
            return 0;
        }
        let Some(mm) = read_kernel::<u64>(task + cfg.task_mm_off as u64).filter(|&m| m != 0) else {
            return 0;
        };
        // `argc` and the first argument pointers too: no unwind reads above them.
        read_kernel::<u64>(mm + cfg.mm_start_stack_off as u64).unwrap_or(0) + STACK_END_SLACK
    } else {
        if cfg.task_fsbase_off == 0 {
            return 0;
        }
        read_kernel::<u64>(task + cfg.task_fsbase_off as u64).unwrap_or(0)
    };
    if end <= sp || end - sp > MAX_USTACK as u64 {
        return 0;
    }
    end
}

/// Bytes of a main thread's stack copied above `mm->start_stack`.
const STACK_END_SLACK: u64 = 64;

/// Whether the current process's executable mappings changed since its previous record (or it
/// has none): `mm->exec_vm` counts the pages mapped executable, so a library loaded or unloaded
/// changes it, and anonymous memory (the allocators' arenas) does not.
#[inline(never)]
fn maps_changed(cfg: &Config, pid: u32) -> bool {
    if cfg.mm_exec_vm_off == 0 {
        return false;
    }
    // SAFETY: helper without preconditions.
    let task = unsafe { bpf_get_current_task() };
    let Some(mm) = read_kernel::<u64>(task + cfg.task_mm_off as u64) else {
        return false;
    };
    if mm == 0 {
        return false;
    }
    let Some(exec_vm) = read_kernel::<u64>(mm + cfg.mm_exec_vm_off as u64) else {
        return false;
    };
    // SAFETY: plain lookup, the value copied out at once.
    if unsafe { EXEC_VM.get(pid) }.is_some_and(|&v| v == exec_vm) {
        return false;
    }
    let _ = EXEC_VM.insert(pid, exec_vm, 0);
    true
}

#[inline(always)]
fn count(stat: u32) {
    if let Some(p) = STATS.get_ptr_mut(stat) {
        // SAFETY: a per-CPU slot that only this CPU's program instance touches.
        unsafe { *p += 1 };
    }
}

#[inline(always)]
fn read_kernel<T>(addr: u64) -> Option<T> {
    // SAFETY: bpf_probe_read_kernel checks the address; a fault is an error, not a crash.
    unsafe { bpf_probe_read_kernel(addr as *const T) }.ok()
}

#[inline(always)]
fn read_user<T>(addr: u64) -> Option<T> {
    // SAFETY: bpf_probe_read_user checks the address; a fault is an error, not a crash.
    unsafe { aya_ebpf::helpers::bpf_probe_read_user(addr as *const T) }.ok()
}

#[inline(always)]
fn frame_u64(buf: &[u8; FRAME_BUF], off: u32) -> u64 {
    // The mask (FRAME_BUF is a power of two) keeps o + 8 within the buffer and o 8-aligned.
    let o = (off as usize) & (FRAME_BUF - 8);
    // SAFETY: o + 8 <= FRAME_BUF, and the buffer is a map value (8-aligned), so the read is
    // aligned. (An unaligned read compiles to eight byte loads, which the verifier pays for in
    // every step of the frame loop.)
    unsafe { core::ptr::read(buf.as_ptr().add(o) as *const u64) }
}

#[inline(always)]
fn frame_i32(buf: &[u8; FRAME_BUF], off: u32) -> i32 {
    let o = (off as usize) & (FRAME_BUF - 4);
    // SAFETY: o + 4 <= FRAME_BUF and o is 4-aligned in an 8-aligned map value.
    unsafe { core::ptr::read(buf.as_ptr().add(o) as *const i32) }
}

/// Reads the first `size` bytes (all of the buffer when 0 or too large) of the interpreter frame
/// at `frame` into `fbuf`, in one read. Whether it succeeded.
#[inline(always)]
fn read_frame(fbuf: &mut [u8; FRAME_BUF], size: u32, frame: u64) -> bool {
    let mut n = size as usize;
    if n == 0 || n > FRAME_BUF {
        n = FRAME_BUF;
    }
    // SAFETY: n <= FRAME_BUF; the source is a user address read through the checked helper.
    let r = unsafe {
        bpf_probe_read_user(
            fbuf.as_mut_ptr() as *mut c_void,
            n as u32,
            frame as *const c_void,
        )
    };
    r == 0
}

/// Ring-buffer notification: the reader polls, and is woken only when a good part of the buffer
/// is waiting (a wakeup per record would have the reader preempt the threads it profiles).
#[inline(always)]
fn wake_flags() -> u64 {
    let threshold = CONFIG.get(0).map(|c| c.wakeup_bytes as u64).unwrap_or(0);
    if SAMPLES.query(BPF_RB_AVAIL_DATA as u64) >= threshold {
        BPF_RB_FORCE_WAKEUP as u64
    } else {
        BPF_RB_NO_WAKEUP as u64
    }
}

/// Where the current thread blocks, as one word: its user-mode instruction and stack pointers
/// (the syscall site and C stack depth) and, for a Python thread, its innermost interpreter
/// frame, that frame's code object and instruction. Equal words: the same blocking point, so
/// the same stack. A few reads: no walk, no copy. A subprogram: it returns one word, so the
/// verifier walks what follows once, not once per way through it.
#[inline(never)]
fn block_signature<const MODERN: bool>(cfg: &Config, pid: u32, tid: u32) -> u64 {
    let mut sig = 0u64;
    if MODERN {
        // A typed pointer (BTF): its fields are read directly, without a probe read.
        // SAFETY: the current task's saved user registers, a `struct pt_regs` the verifier
        // knows; the loads are checked against its type.
        let regs = unsafe { bpf_task_pt_regs(bpf_get_current_task_btf()) } as *const u8;
        if !regs.is_null() {
            // SAFETY: as above; the offsets are those of fields of the kernel's `pt_regs`.
            sig = unsafe {
                *(regs.add(arch::IP_OFFSET) as *const u64)
                    ^ (*(regs.add(arch::SP_OFFSET) as *const u64)).rotate_left(17)
            };
        }
    } else {
        // Two words, not the whole `pt_regs`: this subprogram's stack adds to its caller's.
        let regs = user_regs::<MODERN>(cfg);
        let ip = read_kernel::<u64>(regs + arch::IP_OFFSET as u64);
        let sp = read_kernel::<u64>(regs + arch::SP_OFFSET as u64);
        if let (Some(ip), Some(sp)) = (ip, sp) {
            sig = ip ^ sp.rotate_left(17);
        }
    }
    // SAFETY: the values are copied out at once.
    let Some(pc) = (unsafe { PY_PROCS.get(pid) }) else {
        return sig;
    };
    let Some(tstate) = thread_state(cfg, pc, pid, tid) else {
        return sig ^ 1;
    };
    let Some(mut frame) = read_user::<u64>(tstate + pc.tstate_frame as u64) else {
        return sig;
    };
    if pc.cframe_frame != NO_OFFSET && frame != 0 {
        frame = read_user::<u64>(frame + pc.cframe_frame as u64).unwrap_or(0);
    }
    if frame == 0 {
        return sig ^ 2;
    }
    // The frame's code and instruction words in one read (each read is the costly part).
    let Some(fbuf) = FRAME.get_ptr_mut(0) else {
        return sig;
    };
    // SAFETY: this CPU's frame buffer: `sched_switch` runs with interrupts off, and the frame
    // walk of a capture, its other user, runs after this.
    let fbuf = unsafe { &mut *fbuf };
    if !read_frame(fbuf, pc.frame_read_size, frame) {
        return sig ^ 3;
    }
    let code = frame_u64(fbuf, pc.frame_code) & pc.code_mask;
    let instr = frame_u64(fbuf, pc.frame_instr);
    sig ^ frame.rotate_left(7) ^ code.rotate_left(29) ^ instr.rotate_left(43)
}

/// The frame of the `_PyCFrame` before `cframe` (3.11, 3.12), or 0.
#[inline(always)]
fn caller_frame(pc: &PyProcConfig, cframe: u64) -> u64 {
    read_user::<u64>(cframe + pc.cframe_previous as u64)
        .filter(|&p| p != 0)
        .and_then(|p| read_user::<u64>(p + pc.cframe_frame as u64))
        .unwrap_or(0)
}

/// Thread states looked at when a thread is missing from `PY_THREADS`.
const MAX_TSTATE_SCAN: usize = 32;

/// The thread state of the current thread of Python process `pid`: from `PY_THREADS`, or for a
/// thread user space has not seen yet (it started moments ago, and may block at once for a long
/// time), from the main interpreter's thread list, where its `thread_id` is its thread pointer
/// (`fsbase`). A state found that way is added to `PY_THREADS`; `tachyon_exit` removes it.
#[inline(always)]
fn thread_state(cfg: &Config, pc: &PyProcConfig, pid: u32, tid: u32) -> Option<u64> {
    let key = thread_key(pid, tid);
    // SAFETY: the value is copied out at once.
    if let Some(&t) = unsafe { PY_THREADS.get(key) } {
        return Some(t);
    }
    match thread_state_by_fsbase(cfg, pc, key) {
        0 => None,
        t => Some(t),
    }
}

/// `thread_state`'s search of the interpreter's thread list (0: not found). A function of its
/// own, not inlined: its values then take stack of their own instead of the switch program's
/// frame, which 5.10 and 6.1 count at their 512-byte limit.
#[inline(never)]
fn thread_state_by_fsbase(cfg: &Config, pc: &PyProcConfig, key: u64) -> u64 {
    thread_state_scan(cfg, pc, key).unwrap_or(0)
}

#[inline(always)]
fn thread_state_scan(cfg: &Config, pc: &PyProcConfig, key: u64) -> Option<u64> {
    let interp = if pc.interp != 0 {
        pc.interp
    } else if pc.interp_head != 0 {
        read_user::<u64>(pc.interp_head)?
    } else {
        0
    };
    if interp == 0 || cfg.task_fsbase_off == 0 {
        return None;
    }
    // SAFETY: helper without preconditions.
    let task = unsafe { bpf_get_current_task() };
    let tp = read_kernel::<u64>(task + cfg.task_fsbase_off as u64)?;
    if tp == 0 || pc.thread_id_below_tp == NO_OFFSET {
        return None;
    }
    let thread_id = tp.wrapping_sub(pc.thread_id_below_tp as u64);
    let mut t = read_user::<u64>(interp + pc.interp_threads_head as u64)?;
    let mut found = 0u64;
    for _ in 0..MAX_TSTATE_SCAN {
        if t == 0 {
            break;
        }
        if read_user::<u64>(t + pc.tstate_thread_id as u64)? == thread_id {
            // Up to 3.11 a state made for a new thread carries its creator's id until the new
            // thread starts: two matches name no thread for sure.
            if found != 0 {
                return None;
            }
            found = t;
        }
        t = read_user::<u64>(t + pc.tstate_next as u64)?;
    }
    if found == 0 {
        return None;
    }
    let _ = PY_THREADS.insert(key, found, 0);
    Some(found)
}

#[inline(always)]
fn targeted(cfg: &Config, pid: u32) -> bool {
    // SAFETY: plain lookup; the value is only tested for presence.
    pid != cfg.self_tgid && (cfg.all != 0 || unsafe { TARGETS.get(pid) }.is_some())
}

/// (tgid, pid) of a task, from the `task_struct` offsets userspace found in the kernel's BTF.
#[inline(always)]
fn task_ids(cfg: &Config, task: u64) -> Option<(u32, u32)> {
    if task == 0 {
        return None;
    }
    // SAFETY: kernel reads through the checked helper.
    let tgid =
        unsafe { bpf_probe_read_kernel((task + cfg.task_tgid_off as u64) as *const u32) }.ok()?;
    // SAFETY: as above.
    let pid =
        unsafe { bpf_probe_read_kernel((task + cfg.task_pid_off as u64) as *const u32) }.ok()?;
    Some((tgid, pid))
}

#[inline(always)]
fn is_kthread(cfg: &Config, task: u64) -> bool {
    // SAFETY: kernel read through the checked helper.
    match unsafe { bpf_probe_read_kernel((task + cfg.task_flags_off as u64) as *const u32) } {
        Ok(f) => f & PF_KTHREAD != 0,
        Err(_) => true,
    }
}

#[inline(always)]
fn event(kind: u32, pid: u32, tid: u32, now: u64, arg0: u64, arg1: u64, wake: u64) {
    let mut rec = core::mem::MaybeUninit::<EventRecord>::uninit();
    let r = rec.as_mut_ptr();
    // SAFETY: every field is written (the record has no padding); `comm` by the helper, which
    // zeroes it when it fails. Not a struct literal: its `comm` would be zeroed by a byte loop
    // first (see `zero`).
    let rec = unsafe {
        (*r).kind = kind;
        (*r).cpu = bpf_get_smp_processor_id();
        (*r).pid = pid;
        (*r).tid = tid;
        (*r).time_ns = now;
        // Stored one by one: an exec's zeros would be merged into a byte loop (see `zero`).
        core::ptr::write_volatile(core::ptr::addr_of_mut!((*r).arg0), arg0);
        core::ptr::write_volatile(core::ptr::addr_of_mut!((*r).arg1), arg1);
        bpf_get_current_comm(core::ptr::addr_of_mut!((*r).comm) as *mut c_void, 16);
        rec.assume_init_ref()
    };
    if SAMPLES.output::<EventRecord>(rec, wake).is_err() {
        count(STAT_EVENTS_LOST);
    }
}

/// Assembles one sample record of the current thread and sends it. `regs`: the registers the
/// thread was interrupted with (a sample's); when they are not user mode's (or there are none,
/// a switch's), the user registers come from the task and the kernel stack is recorded.
/// Returns whether the record was written.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn capture<const MODERN: bool>(
    ctx: *mut c_void,
    cfg: &Config,
    kind: u32,
    pid: u32,
    tid: u32,
    now: u64,
    regs: Option<&arch::Regs>,
    sched_state: u64,
) -> bool {
    // SAFETY: helper without preconditions.
    let cpu = unsafe { bpf_get_smp_processor_id() };
    let Some(scratch) = SCRATCH.get_ptr_mut(cpu) else {
        count(STAT_SCRATCH_FAIL);
        return false;
    };
    let base = scratch as *mut u8;
    // SAFETY: the scratch buffer is SCRATCH_SIZE bytes, larger than the header, 8-aligned (map
    // values are), and one capture at a time uses a CPU's slot: the cpu-clock event arrives in a
    // timer interrupt, and `sched_switch` runs with interrupts disabled, so neither nests in the
    // other.
    let hdr = unsafe { &mut *(base as *mut SampleHeader) };
    hdr.kind = kind;
    hdr.pid = pid;
    hdr.tid = tid;
    hdr.time_ns = now;
    hdr.cpu = cpu;
    // Into the header: the helper zeroes the buffer when it fails.
    // SAFETY: the header's 16-byte field.
    unsafe { bpf_get_current_comm(hdr.comm.as_mut_ptr() as *mut c_void, hdr.comm.len() as u32) };
    zero(&mut hdr.kstack_len);
    zero(&mut hdr.py_len);
    zero(&mut hdr.flags);
    zero(&mut hdr.ustack_len);
    zero(&mut hdr.py_tstate);
    zero(&mut hdr.py_gil_holder);
    zero(&mut hdr.py_gil_locked);
    zero(&mut hdr.py_status);
    zero(&mut hdr.py_gc_collecting);
    zero(&mut hdr.py_snaps);
    zero(&mut hdr.py_task);
    hdr.sched_state = sched_state;
    zero(&mut hdr.ip);
    zero(&mut hdr.sp);
    zero(&mut hdr.bp);
    zero(&mut hdr.lr);

    // The registers are read from the context here, where they are used: read at the start
    // and kept on the stack, their words were written only when in user mode, and 6.1's
    // verifier (which did not carry what the first test of the mode proved to the second)
    // refused the read of them as a read of uninitialised stack.
    if let Some(u) = regs.and_then(arch::user) {
        hdr.ip = u.ip;
        hdr.sp = u.sp;
        hdr.bp = u.bp;
        hdr.lr = u.lr;
    } else {
        hdr.flags |= SAMPLE_KERNEL_MODE;
        match arch::read_user(user_regs::<MODERN>(cfg)) {
            Ok(Some(u)) => {
                hdr.ip = u.ip;
                hdr.sp = u.sp;
                hdr.bp = u.bp;
                hdr.lr = u.lr;
            }
            Ok(None) => hdr.flags |= SAMPLE_NO_USER,
            Err(()) => {
                hdr.flags |= SAMPLE_NO_USER;
                count(STAT_UREGS_FAIL);
            }
        }
        // SAFETY: the buffer is the header's kstack array of MAX_KSTACK u64.
        let n = unsafe {
            bpf_get_stack(
                ctx,
                hdr.kstack.as_mut_ptr() as *mut c_void,
                (MAX_KSTACK * 8) as u32,
                0,
            )
        };
        if n > 0 {
            hdr.kstack_len = (n / 8) as u32;
        } else {
            count(STAT_KSTACK_FAIL);
        }
    }

    if maps_changed(cfg, pid) {
        hdr.flags |= SAMPLE_MAPS_CHANGED;
    }

    // Python: the frame chain and the GIL/GC words of the same instant. Flags and the walk's
    // results are kept in the header (map memory) and read back from there: to the verifier, a
    // value read from a map is any value, so paths that differ only in them merge, and the
    // frame loop (512 steps without bpf_loop) and the rest of the program are verified once,
    // not once per flag combination or possible frame count.
    // SAFETY: the value is copied out at once.
    if let Some(pc) = unsafe { PY_PROCS.get(pid) } {
        let pc = *pc;
        match thread_state(cfg, &pc, pid, tid) {
            None => {
                hdr.flags |= SAMPLE_PY_MISS;
                count(STAT_PY_MISS);
            }
            Some(tstate) => {
                hdr.flags |= SAMPLE_PY_THREAD;
                hdr.py_tstate = tstate;
                walk_python::<MODERN>(cpu, &pc, tstate);
            }
        }
        if pc.gil_locked != 0 {
            hdr.py_gil_locked = read_user::<u32>(pc.gil_locked).unwrap_or(0);
            hdr.py_gil_holder = read_user::<u64>(pc.gil_last_holder).unwrap_or(0);
        }
        if pc.gc_collecting != 0 {
            hdr.py_gc_collecting = read_user::<u32>(pc.gc_collecting).unwrap_or(0);
        }
        if pc.tstate_status != NO_OFFSET && hdr.py_tstate != 0 {
            hdr.py_status = read_user::<u32>(hdr.py_tstate + pc.tstate_status as u64).unwrap_or(0);
        }
        if hdr.py_tstate != 0 && has_exception(&pc, hdr.py_tstate) {
            hdr.flags |= SAMPLE_PY_EXCEPTION;
        }
        // `--async-aware`: the task the thread's event loop runs.
        if pc.tstate_running_task != NO_OFFSET && hdr.py_tstate != 0 {
            hdr.py_task =
                read_user::<u64>(hdr.py_tstate + pc.tstate_running_task as u64).unwrap_or(0);
        }
    }
    // SAFETY: fields of the header written above; volatile so that the value comes from memory.
    let mut py_len = unsafe { core::ptr::read_volatile(&hdr.py_len) } as usize;
    // SAFETY: as above.
    let mut flags = unsafe { core::ptr::read_volatile(&hdr.flags) };
    if flags & SAMPLE_PY_TRUNCATED != 0 {
        count(STAT_PY_TRUNCATED);
    }
    if flags & SAMPLE_PY_READ_FAILED != 0 {
        count(STAT_PY_READ_FAIL);
    }
    if py_len > MAX_PY_FRAMES {
        py_len = MAX_PY_FRAMES;
    }
    hdr.py_len = py_len as u32;

    // The user stack: first up to the next page boundary, then whole pages, so the copy ends
    // exactly where the stack mapping ends.
    // The code heads follow the frames (see `snap`).
    // SAFETY: a field of the header; volatile as above.
    let mut snaps = unsafe { core::ptr::read_volatile(&hdr.py_snaps) } as usize;
    if snaps > PY_CODE_SNAPS {
        snaps = PY_CODE_SNAPS;
    }
    hdr.py_snaps = snaps as u32;
    let area =
        SampleHeader::SIZE + py_len * core::mem::size_of::<PyFrame>() + snaps * CodeSnap::SIZE;
    let mut copied_total: usize = 0;
    if flags & SAMPLE_NO_USER == 0 && hdr.sp != 0 {
        let sp = hdr.sp;
        let mut want = cfg.ustack_size as usize;
        // The stack in use ends below the thread's outermost frame: copied up to the page
        // boundary after that, not to the end of its mapping. (Whole pages: a last chunk of
        // any length would have the verifier walk each step of this loop many times over.)
        let end = stack_in_use_end(cfg, pid, tid, sp);
        if end > sp {
            let upto = ((end + USTACK_CHUNK as u64 - 1) & !(USTACK_CHUNK as u64 - 1)) - sp;
            if upto < want as u64 {
                want = upto as usize;
            }
        }
        if MODERN {
            // One chunk a `bpf_loop` step: the verifier walks the step once, where it walked
            // each of the unrolled loop's 16 steps (two-thirds of the sampler's instructions
            // verified, and of the scheduler program's capture).
            copied_total = copy_stack(cpu, pid, tid, sp, area, want, &mut flags);
        } else {
            let mut top: u64 = 0;
            let key = thread_key(pid, tid);
            for k in 0..(MAX_USTACK / USTACK_CHUNK) {
                // Read back through memory: LLVM would otherwise fold the offset into an induction
                // variable whose bounds the verifier cannot follow.
                // SAFETY: a local.
                let copied = unsafe { core::ptr::read_volatile(&copied_total) };
                let Some(next) = copy_chunk(
                    base, area, sp, k as u64, copied, want, key, &mut top, &mut flags,
                ) else {
                    break;
                };
                // SAFETY: a local.
                unsafe { core::ptr::write_volatile(&mut copied_total, next) };
            }
        }
    }
    // SAFETY: a local.
    let copied = unsafe { core::ptr::read_volatile(&copied_total) };
    hdr.ustack_len = copied as u32;
    hdr.flags = flags;

    let mut total = area + copied;
    if total > SCRATCH_SIZE {
        total = SCRATCH_SIZE;
    }
    // SAFETY: total <= SCRATCH_SIZE, the size of the buffer behind base.
    let record = unsafe { core::slice::from_raw_parts(base as *const u8, total) };
    // A ring this full keeps its room for off-CPU captures and events (`sample_stop_bytes`).
    if kind == RECORD_SAMPLE
        && cfg.sample_stop_bytes != 0
        && SAMPLES.query(BPF_RB_AVAIL_DATA as u64) >= cfg.sample_stop_bytes as u64
    {
        count(STAT_LOST);
        return false;
    }
    if SAMPLES.output::<[u8]>(record, wake_flags()).is_ok() {
        count(STAT_SAMPLES);
        true
    } else {
        count(STAT_LOST);
        false
    }
}

/// Address of the current task's saved user registers (`task_pt_regs`). Without
/// `bpf_task_pt_regs` it is computed as `task_pt_regs()` does on x86_64 and arm64: the
/// `pt_regs` sit at the very top of the task's kernel stack (`TOP_OF_KERNEL_STACK_PADDING` is 0
/// on x86_64). The caller checks the mode the registers were saved in, so a wrong guess gives no
/// user stack, never a wrong one.
#[inline(always)]
fn user_regs<const MODERN: bool>(cfg: &Config) -> u64 {
    if MODERN {
        // SAFETY: BTF task pointer of the current task; bpf_task_pt_regs returns its user regs.
        return unsafe { bpf_task_pt_regs(bpf_get_current_task_btf()) } as u64;
    }
    // SAFETY: helper without preconditions.
    let task = unsafe { bpf_get_current_task() };
    match read_kernel::<u64>(task + cfg.task_stack_off as u64) {
        Some(stack) if stack != 0 => stack + cfg.thread_size as u64 - cfg.pt_regs_size as u64,
        _ => 0,
    }
}

/// Whether the thread has an exception being raised (`curexc_type` / `current_exception`) or
/// being handled (an `exc_info` item whose value is neither NULL nor None; items of generators
/// not handling anything are skipped, as `_PyErr_GetTopmostException` does, up to 4 deep).
#[inline(always)]
fn has_exception(pc: &PyProcConfig, tstate: u64) -> bool {
    if pc.tstate_cur_exc != NO_OFFSET
        && read_user::<u64>(tstate + pc.tstate_cur_exc as u64).unwrap_or(0) != 0
    {
        return true;
    }
    if pc.tstate_exc_info == NO_OFFSET {
        return false;
    }
    let mut item = read_user::<u64>(tstate + pc.tstate_exc_info as u64).unwrap_or(0);
    for _ in 0..4 {
        if item == 0 {
            return false;
        }
        let v = read_user::<u64>(item + pc.err_exc_value as u64).unwrap_or(0);
        if v != 0 && v != pc.none_addr {
            return true;
        }
        item = read_user::<u64>(item + pc.err_previous as u64).unwrap_or(0);
    }
    false
}

/// The user stack copy of the modern set: `sp`'s stack, `want` bytes at most, into this CPU's
/// scratch buffer after its first `area` bytes, one chunk a `bpf_loop` step (`copy_step`, the
/// unrolled loop's steps). Returns the bytes copied; adds `SAMPLE_USTACK_*` to `flags`.
#[inline(always)]
fn copy_stack(
    cpu: u32,
    pid: u32,
    tid: u32,
    sp: u64,
    area: usize,
    want: usize,
    flags: &mut u32,
) -> usize {
    let Some(w) = WALK.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: this CPU's walk state; the frame walk that also uses it is over (see `capture`).
    unsafe {
        let w = &mut *w;
        w.cpu = cpu;
        w.pid = pid;
        w.copy_tid = tid;
        w.copy_sp = sp;
        w.copy_top = 0;
        w.copy_area = area as u32;
        w.copy_want = want as u32;
        w.copy_done = 0;
        w.copy_flags = 0;
        // SAFETY: the callback has the signature bpf_loop expects; it takes no context.
        bpf_loop(
            (MAX_USTACK / USTACK_CHUNK) as u32,
            copy_step as *mut c_void,
            core::ptr::null_mut(),
            0,
        );
        *flags |= core::ptr::read_volatile(&w.copy_flags);
        core::ptr::read_volatile(&w.copy_done) as usize
    }
}

/// The most the header, Python frames and code heads take before the stack copy.
const COPY_AREA_MAX: usize = SampleHeader::SIZE
    + MAX_PY_FRAMES * core::mem::size_of::<PyFrame>()
    + PY_CODE_SNAPS * CodeSnap::SIZE;

/// One chunk of `copy_stack`: to the next page boundary first, then whole pages. 1 ends the
/// loop: the copy has what it wants, or met the top of the stack.
extern "C" fn copy_step(index: u64, _ctx: *mut c_void) -> i64 {
    let Some(w) = WALK.get_ptr_mut(0) else {
        return 1;
    };
    // SAFETY: this CPU's walk state (see `copy_stack`).
    let w = unsafe { &mut *w };
    let Some(scratch) = SCRATCH.get_ptr_mut(w.cpu) else {
        return 1;
    };
    let area = w.copy_area as usize;
    if area > COPY_AREA_MAX {
        return 1;
    }
    match copy_chunk(
        scratch as *mut u8,
        area,
        w.copy_sp,
        index,
        w.copy_done as usize,
        w.copy_want as usize,
        thread_key(w.pid, w.copy_tid),
        &mut w.copy_top,
        &mut w.copy_flags,
    ) {
        Some(next) => {
            w.copy_done = next as u32;
            0
        }
        None => 1,
    }
}

/// Chunk `index` of a user-stack copy: `sp`'s stack after the `copied` bytes already copied,
/// into `base + area + copied`; to the next page boundary first, then whole pages, `want` bytes
/// at most. Returns the bytes copied once it is done, or `None` when the copy ends: it has what
/// it wants, or met the top of the stack (`SAMPLE_USTACK_SHORT` in `flags`). `top` is the
/// thread's (`key`) known stack top, looked up on first need (0: not yet).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn copy_chunk(
    base: *mut u8,
    area: usize,
    sp: u64,
    index: u64,
    copied: usize,
    want: usize,
    key: u64,
    top: &mut u64,
    flags: &mut u32,
) -> Option<usize> {
    let chunk = if index == 0 {
        USTACK_CHUNK - (sp as usize & (USTACK_CHUNK - 1))
    } else {
        USTACK_CHUNK
    };
    if copied + chunk > want || copied > MAX_USTACK - USTACK_CHUNK || chunk > USTACK_CHUNK {
        return None;
    }
    // SAFETY: area + copied + chunk <= SCRATCH_SIZE (the callers bound `area`, and `copied` and
    // `chunk` are bounded above); the source is a user address read through the checked helper.
    let r = unsafe {
        bpf_probe_read_user(
            base.add(area + copied) as *mut c_void,
            chunk as u32,
            (sp + copied as u64) as *const c_void,
        )
    };
    if r != 0 {
        // A page never touched reads as zeros (the helper clears the chunk) when the thread's
        // stack is known to go on above it; anywhere else the copy ends.
        if *top == 0 {
            // SAFETY: a plain map lookup; the value is copied out at once.
            *top = unsafe { STACK_TOPS.get(key) }.copied().unwrap_or(1);
        }
        if sp + (copied + chunk) as u64 > *top {
            *flags |= SAMPLE_USTACK_SHORT;
            return None;
        }
        *flags |= SAMPLE_USTACK_HOLE;
    }
    Some(copied + chunk)
}

/// State of one frame walk (in the `WALK` map). Scalars only: a step looks the buffers up
/// itself.
#[repr(C)]
struct Walk {
    pc: PyProcConfig,
    frame: u64,
    cpu: u32,
    pid: u32,
    /// Code heads to copy once the walk is done: their code objects and frames' indexes.
    snaps: u32,
    snap_code: [u64; PY_CODE_SNAPS],
    snap_at: [u32; PY_CODE_SNAPS],
    /// Scratch of one step: whether the frame runs code that runs once, and the next frame.
    once: u32,
    next: u64,
    /// The last frame read whose head was not copied (its code, 0 if none, and its index).
    callee: u64,
    callee_at: u32,
    /// The frame being read (here rather than in `FRAME`: one map lookup, and one stack slot,
    /// fewer in a callback that has 32 bytes of stack under the switch program).
    fbuf: [u8; FRAME_BUF],
    /// The first local of the innermost `Handle._run` frame (`PyProcConfig::handle_run_code`),
    /// or 0.
    handle: u64,
    /// 3.11, 3.12: the frame the first frame entered with must link to (the previous
    /// `_PyCFrame`'s), 0 once it did (or when there is none to check), 1 when it did not.
    expect: u64,
    /// The code heads chosen so far in this walk, by `copied_slot` of their code: a code that
    /// several frames run (the import machinery of a nested import) is copied once, and each of
    /// its frames points to that copy. `copied_walk` says which walk wrote a slot (`walks`).
    copied_code: [u64; COPIED_SLOTS],
    copied_k: [u32; COPIED_SLOTS],
    copied_walk: [u32; COPIED_SLOTS],
    walks: u32,
    /// The first copy `snap_more_step` takes (those `unknown` chose).
    snap_from: u32,
    /// `copy_stack`'s state: the thread, its stack pointer, the top of its stack once looked
    /// up (0: not yet), where the copy goes, how much it wants and has, and its flags.
    copy_tid: u32,
    copy_sp: u64,
    copy_top: u64,
    copy_area: u32,
    copy_want: u32,
    copy_done: u32,
    copy_flags: u32,
}

/// Slots of `Walk::copied_code` (a power of two).
const COPIED_SLOTS: usize = 64;

#[inline(always)]
fn copied_slot(code: u64) -> usize {
    ((code >> 4) ^ (code >> 11)) as usize & (COPIED_SLOTS - 1)
}

/// Walks the interpreter frame chain of `tstate`, writing frames after the header, the count of
/// frames into `py_len` and `SAMPLE_PY_*` flags into `flags` of the header (which start at 0).
///
/// Everything a step finds goes to the record in memory at once, and nothing in registers or on
/// the stack outlives the loop: every way out of the loop (end of chain, failed read, cycle, the
/// frame limit) then reaches the code after it in the same verifier state, which the verifier
/// checks once instead of once per step. This matters for the bounded loop of the compat set:
/// it brought that program from about 500,000 verified instructions to a few tens of thousands.
#[inline(always)]
fn walk_python<const MODERN: bool>(cpu: u32, pc: &PyProcConfig, tstate: u64) {
    let Some(scratch) = SCRATCH.get_ptr_mut(cpu) else {
        return;
    };
    // SAFETY: the scratch buffer starts with the header (see `capture`).
    let hdr = unsafe { &mut *(scratch as *mut SampleHeader) };
    let Some(mut frame) = read_user::<u64>(tstate + pc.tstate_frame as u64) else {
        hdr.flags |= SAMPLE_PY_READ_FAILED;
        return;
    };
    // The current `_PyCFrame` (3.11, 3.12), or 0, and the frame of the one before it.
    let mut cframe = 0u64;
    let mut expect = 0u64;
    if pc.cframe_frame != NO_OFFSET && frame != 0 {
        cframe = frame;
        // `current_frame` and `previous` in one read: `previous` follows it on both versions
        // (`PyProcConfig::cframe_previous`).
        let Some([current, previous]) = read_user::<[u64; 2]>(cframe + pc.cframe_frame as u64)
        else {
            hdr.flags |= SAMPLE_PY_READ_FAILED;
            return;
        };
        let before = || {
            if previous == 0 {
                return 0;
            }
            read_user::<u64>(previous + pc.cframe_frame as u64).unwrap_or(0)
        };
        if current == 0 {
            frame = before();
        } else {
            frame = current;
            if MODERN {
                // Checked by the walk (`Walk::expect`): kernels with `bpf_loop` only, where the
                // walk can be done again; the unrolled walk of older ones has no room for it.
                expect = before();
            }
        }
    }
    let Some(w) = WALK.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: this CPU's walk state; one walk at a time runs on a CPU (see `capture`).
    unsafe {
        // Field by field: the buffers need no clearing (each entry is written before it is
        // read), and a whole struct built here would take the program's stack.
        let w = &mut *w;
        w.pc = *pc;
        w.frame = frame;
        w.cpu = cpu;
        w.pid = hdr.pid;
        w.walks = w.walks.wrapping_add(1);
        zero(&mut w.snaps);
        zero(&mut w.callee);
        zero(&mut w.handle);
        w.expect = expect;
    }
    if MODERN {
        // SAFETY: the callback has the signature bpf_loop expects; it takes no context.
        unsafe {
            bpf_loop(
                MAX_PY_FRAMES as u32,
                walk_step as *mut c_void,
                core::ptr::null_mut(),
                0,
            );
        }
        // In the eval loop's first instructions (3.11, 3.12) the current `_PyCFrame` is new and
        // its frame not set yet: what is there is the last call's, a chain that does not reach
        // the previous `_PyCFrame`'s frame (`Walk::expect`), or breaks off. The thread then runs
        // its caller's frames, in the previous `_PyCFrame` (the callee has not started): walked
        // again from there. (Kernels without `bpf_loop` keep such a sample as it was read.)
        // SAFETY: fields written by the walk.
        let (flags, expect) = unsafe {
            (
                core::ptr::read_volatile(&hdr.flags),
                core::ptr::read_volatile(&(*w).expect),
            )
        };
        if cframe != 0 && expect != 0 && flags & SAMPLE_PY_TRUNCATED == 0 {
            let caller = caller_frame(pc, cframe);
            if caller != 0 {
                hdr.flags = flags & !(SAMPLE_PY_READ_FAILED | SAMPLE_PY_CYCLE);
                hdr.py_len = 0;
                // SAFETY: as above.
                unsafe {
                    let w = &mut *w;
                    w.frame = caller;
                    w.expect = 0;
                    w.walks = w.walks.wrapping_add(1);
                    w.snaps = 0;
                    w.callee = 0;
                    w.handle = 0;
                    bpf_loop(
                        MAX_PY_FRAMES as u32,
                        walk_step as *mut c_void,
                        core::ptr::null_mut(),
                        0,
                    );
                }
            }
        }
    } else {
        for i in 0..MAX_PY_FRAMES {
            if step::<false>(i as u64) != 0 {
                break;
            }
        }
    }
    // The code heads, in a pass of their own: a step that also copied them would need more
    // stack than a `bpf_loop` callback has room for under the switch program.
    if MODERN {
        // SAFETY: as above.
        unsafe {
            bpf_loop(
                PY_CODE_SNAPS as u32,
                snap_step as *mut c_void,
                core::ptr::null_mut(),
                0,
            );
            // Then the heads of code user space has not read (`unknown`), after those; not while
            // the ring holds more than its wake-up mark: a reader that falls behind has not
            // read the code either, and larger records would only put it further behind.
            let w = &mut *w;
            w.snap_from = core::ptr::read_volatile(&w.snaps);
            let behind = CONFIG
                .get(0)
                .is_none_or(|c| SAMPLES.query(BPF_RB_AVAIL_DATA as u64) >= c.wakeup_bytes as u64);
            if !behind {
                bpf_loop(
                    MAX_PY_FRAMES as u32,
                    unknown_step as *mut c_void,
                    core::ptr::null_mut(),
                    0,
                );
                bpf_loop(
                    PY_CODE_SNAPS as u32,
                    snap_more_step as *mut c_void,
                    core::ptr::null_mut(),
                    0,
                );
            }
        }
    } else {
        for k in 0..PY_CODE_SNAPS {
            if snap(k as u64) != 0 {
                break;
            }
        }
    }
    // `--async-aware` on 3.11-3.13: the task whose step the innermost `Handle._run` calls.
    // SAFETY: this CPU's walk state, written by the steps above.
    let handle = unsafe { core::ptr::read_volatile(&(*w).handle) };
    if handle != 0 {
        if let Some(cb) = read_user::<u64>(handle.wrapping_add(pc.handle_callback as u64)) {
            hdr.py_task = read_user::<u64>(cb.wrapping_add(pc.step_task as u64)).unwrap_or(0);
        }
    }
}

extern "C" fn snap_step(index: u64, _ctx: *mut c_void) -> i64 {
    snap(index)
}

extern "C" fn snap_more_step(index: u64, _ctx: *mut c_void) -> i64 {
    let Some(w) = WALK.get_ptr_mut(0) else {
        return 1;
    };
    // SAFETY: this CPU's walk state, written by `walk_python`.
    let from = unsafe { core::ptr::read_volatile(&(*w).snap_from) } as u64;
    snap(from + index)
}

extern "C" fn unknown_step(index: u64, _ctx: *mut c_void) -> i64 {
    unknown(index)
}

/// Chooses frame `i` for a copy of its code head if user space has not read that code (it is
/// not in `KNOWN_CODES`): it may be freed, or its process gone, before user space gets to it (a
/// module's functions run by `exec`; start-up code such as `<frozen getpath>`). A code several
/// frames run is copied once: the others point to that copy. Runs after the first copies
/// (their frames know their copy's index), innermost first. Returns 1 to stop.
#[inline(always)]
fn unknown(i: u64) -> i64 {
    let i = i as usize;
    let Some(w) = WALK.get_ptr_mut(0) else {
        return 1;
    };
    // SAFETY: this CPU's walk state, written by `walk_python`.
    let w = unsafe { &mut *w };
    let Some(scratch) = SCRATCH.get_ptr_mut(w.cpu) else {
        return 1;
    };
    // SAFETY: the scratch buffer starts with the header (see `capture`).
    let hdr = unsafe { &*(scratch as *const SampleHeader) };
    // SAFETY: a field of the header, written by the walk.
    let py_len = unsafe { core::ptr::read_volatile(&hdr.py_len) } as usize;
    if i >= py_len || i >= MAX_PY_FRAMES {
        return 1;
    }
    let frames = (scratch as *mut u8).wrapping_add(SampleHeader::SIZE) as *mut PyFrame;
    // SAFETY: i < MAX_PY_FRAMES and the scratch buffer holds MAX_PY_FRAMES frames after the
    // header.
    let f = unsafe { &mut *frames.add(i) };
    let code = f.code;
    if code == 0 || (w.pc.frame_owner != NO_OFFSET && f.flags & 0xff >= 3) {
        // A C-stack shim frame: no code.
        return 0;
    }
    let slot = copied_slot(code);
    let copy = (f.flags >> PY_FRAME_SNAP_SHIFT) & 0xff;
    if copy != 0 {
        w.copied_code[slot] = code;
        w.copied_k[slot] = copy - 1;
        w.copied_walk[slot] = w.walks;
        return 0;
    }
    if w.copied_walk[slot] == w.walks && w.copied_code[slot] == code {
        let k = w.copied_k[slot] & (PY_CODE_SNAPS as u32 - 1);
        f.flags |= (k + 1) << PY_FRAME_SNAP_SHIFT;
        return 0;
    }
    let word = known_code_word(w.pid, code);
    if KNOWN_CODES.get(known_code_slot(word)).copied() == Some(word) {
        return 0;
    }
    let k = w.snaps as usize;
    if k >= PY_CODE_SNAPS {
        return 1;
    }
    w.snap_code[k] = code;
    w.snap_at[k] = i as u32;
    w.snaps = k as u32 + 1;
    f.flags |= (k as u32 + 1) << PY_FRAME_SNAP_SHIFT;
    w.copied_code[slot] = code;
    w.copied_k[slot] = k as u32;
    w.copied_walk[slot] = w.walks;
    0
}

/// Copies the `k`th code head the walk chose into the record, after its Python frames, with the
/// starts of its name and file name strings. Returns 1 to stop.
#[inline(always)]
fn snap(k: u64) -> i64 {
    let k = k as usize;
    let Some(w) = WALK.get_ptr_mut(0) else {
        return 1;
    };
    // SAFETY: this CPU's walk state, written by `walk_python`.
    let w = unsafe { &*w };
    if k >= w.snaps as usize || k >= PY_CODE_SNAPS {
        return 1;
    }
    let Some(scratch) = SCRATCH.get_ptr_mut(w.cpu) else {
        return 1;
    };
    let base = scratch as *mut u8;
    // SAFETY: the scratch buffer starts with the header (see `capture`).
    let hdr = unsafe { &mut *(base as *mut SampleHeader) };
    // SAFETY: a field of the header, written by the walk; volatile so that it comes from memory.
    let py_len = unsafe { core::ptr::read_volatile(&hdr.py_len) } as usize;
    if py_len > MAX_PY_FRAMES {
        return 1;
    }
    let k = k & (PY_CODE_SNAPS - 1);
    hdr.py_snaps = k as u32 + 1;
    // The frame the walk wrote at `snap_at[k]` (below `py_len`) learns its copy's index: masked
    // for the verifier (MAX_PY_FRAMES is a power of two).
    let at = w.snap_at[k] as usize & (MAX_PY_FRAMES - 1);
    let frames = base.wrapping_add(SampleHeader::SIZE) as *mut PyFrame;
    // SAFETY: at < MAX_PY_FRAMES, and the scratch buffer holds that many frames after the
    // header.
    let f = unsafe { &mut *frames.add(at) };
    f.flags |= ((k as u32) + 1) << PY_FRAME_SNAP_SHIFT;
    let off = SampleHeader::SIZE + py_len * core::mem::size_of::<PyFrame>() + k * CodeSnap::SIZE;
    // SAFETY: off + CodeSnap::SIZE <= SCRATCH_SIZE (py_len and k bounded above), 8-aligned (the
    // header, frames and snaps are multiples of 8 bytes).
    let snap = unsafe { &mut *(base.add(off) as *mut CodeSnap) };
    let mut n = w.pc.code_head_len as usize;
    if n > PY_CODE_SNAP {
        n = PY_CODE_SNAP;
    }
    // A zero type word marks a copy as failed (or not taken).
    // SAFETY: 16 <= PY_NAME_SNAP and PY_FILE_SNAP.
    unsafe {
        (snap.name.as_mut_ptr().add(8) as *mut u64).write_unaligned(0);
        (snap.file.as_mut_ptr().add(8) as *mut u64).write_unaligned(0);
    }
    // SAFETY: n <= PY_CODE_SNAP, the size of the destination; the source is a user address.
    let r = unsafe {
        bpf_probe_read_user(
            snap.head.as_mut_ptr() as *mut c_void,
            n as u32,
            w.snap_code[k] as *const c_void,
        )
    };
    if r != 0 {
        // SAFETY: 16 <= PY_CODE_SNAP.
        unsafe { (snap.head.as_mut_ptr().add(8) as *mut u64).write_unaligned(0) };
        return 0;
    }
    // The name and the file name may be freed with the code (the innermost frame's code may
    // also be a function's that was just deleted).
    let off = w.pc.code_qualname as usize;
    if off <= PY_CODE_SNAP - 8 {
        // SAFETY: off + 8 <= PY_CODE_SNAP, the size of the copy.
        let addr = unsafe { (snap.head.as_ptr().add(off) as *const u64).read_unaligned() };
        copy_string(&mut snap.name, addr);
    }
    let off = w.pc.code_filename as usize;
    if off <= PY_CODE_SNAP - 8 {
        // SAFETY: as above.
        let addr = unsafe { (snap.head.as_ptr().add(off) as *const u64).read_unaligned() };
        copy_string(&mut snap.file, addr);
    }
    0
}

/// Copies the start of the string object at user address `addr` into `to` (its type word
/// zeroed if the read failed). A short string may end a few bytes before an unmapped page (the
/// end of an allocator arena): then what is left of the page is copied.
#[inline(always)]
fn copy_string<const N: usize>(to: &mut [u8; N], addr: u64) {
    // SAFETY: N bytes into a buffer of that size; the source is a user address.
    let mut r = unsafe {
        bpf_probe_read_user(
            to.as_mut_ptr() as *mut c_void,
            N as u32,
            addr as *const c_void,
        )
    };
    let left = 4096 - (addr & 4095) as usize;
    if r != 0 && left < N {
        // SAFETY: left < N bytes into a buffer of N; the source is a user address.
        r = unsafe {
            bpf_probe_read_user(
                to.as_mut_ptr() as *mut c_void,
                left as u32,
                addr as *const c_void,
            )
        };
    }
    if r != 0 && N >= 16 {
        // SAFETY: 16 <= N.
        unsafe { (to.as_mut_ptr().add(8) as *mut u64).write_unaligned(0) };
    }
}

/// One step of the frame walk: reads the frame, records it, moves to the previous one.
/// Returns 1 to stop.
extern "C" fn walk_step(index: u64, _ctx: *mut c_void) -> i64 {
    step::<true>(index)
}

/// `CALLEES`: also copy the head of a function that code run once calls (see below). Not in
/// the compat set: its 512 steps are verified one by one, and the branch multiplies its states.
#[inline(always)]
fn step<const CALLEES: bool>(index: u64) -> i64 {
    let i = index as usize;
    let Some(w) = WALK.get_ptr_mut(0) else {
        return 1;
    };
    // SAFETY: this CPU's walk state, written by `walk_python`.
    let w = unsafe { &mut *w };
    if w.frame == 0 || i >= MAX_PY_FRAMES {
        return 1;
    }
    // The frame is read first, and the record looked up after: fewer values live across the
    // helper call, so the step fits the 32 bytes of stack a callback has under the switch
    // program.
    let ok = read_frame(&mut w.fbuf, w.pc.frame_read_size, w.frame);
    let Some(scratch) = SCRATCH.get_ptr_mut(w.cpu) else {
        return 1;
    };
    // SAFETY: the scratch buffer starts with the header (see `capture`).
    let hdr = unsafe { &mut *(scratch as *mut SampleHeader) };
    if !ok {
        hdr.flags |= SAMPLE_PY_READ_FAILED;
        return 1;
    }
    let frames = (scratch as *mut u8).wrapping_add(SampleHeader::SIZE) as *mut PyFrame;
    // SAFETY: i < MAX_PY_FRAMES and the scratch buffer holds MAX_PY_FRAMES frames after the
    // header.
    let f = unsafe { &mut *frames.add(i) };
    // What the frame says goes to memory as soon as it is known, and is read back (volatile)
    // where it is used again: few values live at once, so the step fits the 32 bytes of stack
    // a `bpf_loop` callback has under the switch program.
    {
        let fbuf = &w.fbuf;
        let pc = &w.pc;
        let code = frame_u64(fbuf, pc.frame_code) & pc.code_mask;
        f.code = code;
        f.instr = if pc.layout == PY_LAYOUT_FRAMEOBJECT {
            frame_i32(fbuf, pc.frame_instr)
        } else {
            let ip = frame_u64(fbuf, pc.frame_instr);
            (ip.wrapping_sub(code).wrapping_sub(pc.code_adaptive as u64) as i64 / 2) as i32
        };
        f.flags = if pc.frame_owner != NO_OFFSET {
            fbuf[(pc.frame_owner as usize) & (FRAME_BUF - 1)] as u32
        } else {
            0
        };
        // The code head is copied for frames with locals of their own (module and class
        // bodies, `exec`): their code runs once and may be freed before user space reads it,
        // while a function's code lives as long as the function. Without the offset, the
        // innermost frames are copied. Without `bpf_loop`, so is the innermost frame's; with
        // it, any code user space has not settled (`unknown`), the innermost frame's included.
        w.once = if pc.frame_locals != NO_OFFSET {
            (frame_u64(fbuf, pc.frame_locals) != 0) as u32
        } else {
            (i < PY_CODE_SNAPS) as u32
        };
        w.next = frame_u64(fbuf, pc.frame_previous);
        if pc.handle_run_code != 0 && code == pc.handle_run_code && w.handle == 0 {
            w.handle = frame_u64(fbuf, pc.frame_self);
        }
        let mark = fbuf[(pc.frame_owner as usize) & (FRAME_BUF - 1)] as u32;
        if CALLEES && w.expect != 0 && pc.entry_mark != 0 && mark == pc.entry_mark {
            w.expect = (w.next != w.expect) as u64;
        }
    }
    hdr.py_len = i as u32 + 1;
    {
        // SAFETY: reads of fields written above.
        let (code, owner, once) = unsafe {
            (
                core::ptr::read_volatile(&f.code),
                core::ptr::read_volatile(&f.flags),
                core::ptr::read_volatile(&w.once),
            )
        };
        // A C-stack shim frame (owner 3 and up, 3.12+) has no code of its own, and its other
        // fields are left as they were.
        let shim = code == 0 || (w.pc.frame_owner != NO_OFFSET && owner >= 3);
        if !shim {
            // A function that code run once calls may be freed with it (a module body calling
            // a helper it deletes after, as `hashlib` does): its head is copied too, unless
            // the caller is the outermost frame (a program's main module, which outlives it).
            // Copied once the walk is done; frames learn their copy's index there (`snap`).
            // SAFETY: reads of fields written by earlier steps.
            let (callee, outer) = unsafe {
                (
                    core::ptr::read_volatile(&w.callee),
                    core::ptr::read_volatile(&w.next) == 0,
                )
            };
            let k = w.snaps as usize;
            if CALLEES && once != 0 && callee != 0 && !outer && k < PY_CODE_SNAPS {
                w.snap_code[k & (PY_CODE_SNAPS - 1)] = callee;
                w.snap_at[k & (PY_CODE_SNAPS - 1)] = w.callee_at;
                w.snaps = k as u32 + 1;
            }
            // Read back from memory: a count carried over in a register lets the compiler join
            // the two tests in a way older verifiers follow into impossible bounds.
            // SAFETY: a read of the field written above.
            let k = unsafe { core::ptr::read_volatile(&w.snaps) } as usize;
            // The innermost frame's is copied here only without `bpf_loop`: with it, `unknown`
            // copies it unless user space has settled that code (`KNOWN_CODES`).
            if ((k == 0 && !CALLEES) || once != 0) && k < PY_CODE_SNAPS {
                w.snap_code[k & (PY_CODE_SNAPS - 1)] = code;
                w.snap_at[k & (PY_CODE_SNAPS - 1)] = i as u32;
                w.snaps = k as u32 + 1;
                w.callee = 0;
            } else {
                w.callee = code;
                w.callee_at = i as u32;
            }
        }
    }
    // SAFETY: a read of the field written above.
    let previous = unsafe { core::ptr::read_volatile(&w.next) };
    if previous == w.frame {
        hdr.flags |= SAMPLE_PY_CYCLE;
        return 1;
    }
    if previous != 0 && i + 1 >= MAX_PY_FRAMES {
        hdr.flags |= SAMPLE_PY_TRUNCATED;
        return 1;
    }
    w.frame = previous;
    0
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // SAFETY: the program has no reachable panics; BPF cannot unwind.
    unsafe { core::hint::unreachable_unchecked() }
}

#[link_section = "license"]
#[used]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
