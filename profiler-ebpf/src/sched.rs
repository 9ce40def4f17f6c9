//! Scheduler accounting (`sched_switch`): each profiled thread's on- and off-CPU intervals,
//! summed per thread in `SCHED` and sent at sampling granularity; and when a thread that
//! blocked comes back (`sched_exit_tp`, or a kprobe on `finish_task_switch`), where its interval
//! is charged, with the capture of a new blocking point.

use core::ffi::c_void;

use aya_ebpf::{
    helpers::{
        bpf_get_current_pid_tgid, bpf_get_smp_processor_id, bpf_ktime_get_ns,
        bpf_probe_read_kernel,
        generated::{bpf_get_current_task_btf, bpf_get_prandom_u32, bpf_task_pt_regs},
    },
    programs::BtfTracePointContext,
};
use profiler_common::*;

use crate::{
    arch,
    maps::*,
    mem::*,
    python::{frame_u64, read_frame, thread_state::thread_state},
    sample::capture,
    task::*,
};

/// The state `prev` leaves the CPU in: 0 when preempted (still runnable), else its sleep state.
#[inline(always)]
pub(crate) fn prev_state<const ARG: bool>(
    ctx: &BtfTracePointContext,
    cfg: &Config,
    prev: u64,
) -> u64 {
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
pub(crate) const TASK_DEAD: u64 = 0x80;

/// Accounts the thread leaving the CPU (`prev`, current here). Nothing is sent per switch: each
/// thread's intervals are summed in `SCHED` and sent at sampling granularity (see
/// `ThreadSched`). Only the leaving side is traced: since its previous switch-out the thread was
/// off CPU, then on CPU for the CPU time it used meanwhile, so this one event closes both
/// intervals (and the program does nothing for the thread coming in). Where a thread that leaves
/// to block is charged is decided when it comes back (`switch_in`).
#[inline(always)]
pub(crate) fn switch<const MODERN: bool>(ctx: &BtfTracePointContext) -> Option<()> {
    let cfg = CONFIG.get(0)?;
    let pid_tgid = bpf_get_current_pid_tgid();
    let pid = (pid_tgid >> 32) as u32;
    let tid = pid_tgid as u32;
    if tid == 0 {
        return None;
    }
    if !targeted(cfg, pid) {
        note_idle::<MODERN>(cfg, tid);
        return None;
    }
    let prev = ctx.arg::<u64>(1);
    // Only `--all` can target a kernel thread (a process's tgid is never a kernel thread's).
    if cfg.all != 0 && is_kthread(cfg, prev) {
        note_idle::<MODERN>(cfg, tid);
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
            // A random phase: which short interval is kept does not depend on when the
            // thread was first seen.
            // SAFETY: helper without preconditions.
            fresh.short_ns = unsafe { bpf_get_prandom_u32() } as u64 % cfg.sched_span_ns.max(1);
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
    st.attr = if cfg.offcpu != OFFCPU_STACKS {
        ATTR_NONE
    } else if prev_state == 0 {
        // Preempted while runnable: it stopped where it ran.
        note_idle::<MODERN>(cfg, tid);
        ATTR_LATEST
    } else {
        // Decided when it comes back (`switch_in`), once the interval's length is known: left
        // to the sampling before this deadline (see `block_attr`).
        st.blocked_state = prev_state as u32;
        if MODERN {
            note_deadline(tid, now + cfg.sched_span_ns.saturating_sub(st.short_ns));
        }
        ATTR_PENDING
    };
    st.since_ns = now;
    st.last_sum = sum;
    Some(())
}

/// Notes when a thread that blocks now is back late enough for its interval to be kept, in its
/// `BLOCK_DEADLINES` slot.
#[inline(always)]
pub(crate) fn note_deadline(tid: u32, deadline_ns: u64) {
    let Some(slot) = BLOCK_DEADLINES.get_ptr_mut(tid & (BLOCK_DEADLINE_SLOTS - 1)) else {
        return;
    };
    // SAFETY: an array slot; a word written or read whole.
    unsafe { *slot = deadline_word(tid, deadline_ns) };
}

/// Notes that the thread leaving the CPU has nothing for its switch-in to decide (it is not
/// profiled, or did not block): its `idle_word`, which stops its switch-in at one array word
/// instead of the `TARGETS` and `SCHED` look-ups (most of that program's cost, and the
/// switch-ins of every thread on the host run it). Written only where it changes the slot: a
/// thread that keeps switching leaves the line shared. Another thread's word in the slot is
/// overwritten: its switch-in only takes the long way. A word of a thread that became
/// profiled since is harmless: its switch-in has nothing to decide before its first
/// switch-out as a profiled thread, which writes its word again.
#[inline(always)]
pub(crate) fn note_idle<const MODERN: bool>(cfg: &Config, tid: u32) {
    if !MODERN || cfg.offcpu != OFFCPU_STACKS {
        return;
    }
    let Some(slot) = BLOCK_DEADLINES.get_ptr_mut(tid & (BLOCK_DEADLINE_SLOTS - 1)) else {
        return;
    };
    let w = idle_word(tid);
    // SAFETY: an array slot; a word written or read whole.
    unsafe {
        if *slot != w {
            *slot = w;
        }
    }
}

/// The thread, last seen leaving at `st.since_ns`, is leaving again at `now` with CPU time
/// `sum`: it was off CPU, then on CPU for the CPU time it used meanwhile.
#[inline(always)]
pub(crate) fn close_intervals(st: &mut ThreadSched, key: u64, now: u64, sum: u64) {
    let since = st.since_ns;
    let mut on = sum.saturating_sub(st.last_sum);
    if on > now.saturating_sub(since) {
        on = now.saturating_sub(since);
    }
    let back = now - on;
    if st.attr == ATTR_PENDING {
        let period = CONFIG.get(0).map_or(0, |c| c.sched_span_ns);
        if back.saturating_sub(since) < period {
            // A short interval: back before its deadline (`note_deadline`), its switch-in left
            // it to the sampling, as `block_attr` would have (or missed it: the same then).
            // Against the period, not the deadline: the accounting's measure can be longer
            // than the switch-in's by the interrupts the thread ran meanwhile (not its CPU
            // time). Left-out time past the deadline makes the next interval a kept one.
            st.attr = ATTR_NONE;
        } else {
            // Its switch-in was not seen (a kprobe can miss): time without a stack.
            count(STAT_OFF_UNCAPTURED);
            st.attr = ATTR_UNCAPTURED;
        }
    }
    if st.attr != ATTR_UNKNOWN && back > since {
        if st.attr == ATTR_NONE {
            // Left out by the sampling (or times only): the next kept interval is charged with
            // it, as the accounting measures it (from the CPU time, which starts a little
            // before the thread is back: the switch-in's own measure runs longer).
            st.short_ns += back - since;
        }
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
pub(crate) fn interval(st: &mut ThreadSched, key: u64, t0: u64, t1: u64, on: u64) {
    let send = add_interval(st, t0, t1, on);
    if send != SEND_NONE {
        emit(st, key, t0, t1, send | on);
    }
}

/// What `add_interval` leaves to send: nothing, the open span, or the open span and then the
/// interval alone (or'ed with `on`, the low bit, for `emit`).
pub(crate) const SEND_NONE: u64 = 0;
pub(crate) const SEND_SPAN: u64 = 2;
pub(crate) const SEND_ALONE: u64 = 4;

/// One interval of the thread (`key`), `t0..t1`, on CPU (`on` 1) or off (charged to
/// `st.attr`): a long one (a sampling period or more) is sent alone, after the open span; a
/// short one joins the span, which is sent once it covers a sampling period. Returns what to
/// send (`SEND_*`). A subprogram, not inlined: its two call sites would otherwise multiply the
/// paths the verifier walks (and its time at start-up) in every program that closes intervals.
#[inline(never)]
pub(crate) fn add_interval(st: &mut ThreadSched, t0: u64, t1: u64, on: u64) -> u64 {
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
pub(crate) fn emit(st: &mut ThreadSched, key: u64, t0: u64, t1: u64, what: u64) {
    let (pid, tid) = ((key >> 32) as u32, key as u32);
    flush(st, pid, tid);
    if what & SEND_ALONE != 0 {
        send_interval(st, pid, tid, t0, t1, what & 1 != 0);
    }
}

/// Sends the open span of short intervals, if any, and empties it.
#[inline(always)]
pub(crate) fn flush(st: &mut ThreadSched, pid: u32, tid: u32) {
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

/// Sends one interval, `t0..t1`, alone.
#[inline(always)]
pub(crate) fn send_interval(st: &ThreadSched, pid: u32, tid: u32, t0: u64, t1: u64, on: bool) {
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
pub(crate) unsafe fn sched_header(r: *mut SchedRecord, pid: u32, tid: u32, t0: u64, t1: u64) {
    (*r).kind = RECORD_SCHED;
    (*r).cpu = bpf_get_smp_processor_id();
    (*r).pid = pid;
    (*r).tid = tid;
    (*r).t0_ns = t0;
    (*r).t1_ns = t1;
}

/// A profiled thread comes back on the CPU (`sched_exit_tp` or `finish_task_switch`, in its own
/// context: its user
/// registers, stacks and Python frames are still those of the point where it blocked). If it
/// blocked (`ATTR_PENDING`), decides where the interval it was away for is charged.
#[inline(always)]
pub(crate) fn switch_in<const MODERN: bool>(ctx: *mut c_void) -> Option<()> {
    let cfg = CONFIG.get(0)?;
    if cfg.offcpu != OFFCPU_STACKS {
        return None;
    }
    let pid_tgid = bpf_get_current_pid_tgid();
    let pid = (pid_tgid >> 32) as u32;
    let tid = pid_tgid as u32;
    if tid == 0 {
        return None;
    }
    if MODERN {
        // Its own word (see `note_idle`, `note_deadline`) decides most switch-ins with one
        // array word instead of the `TARGETS` and `SCHED` look-ups: nothing to decide, or back
        // before its deadline (a short interval the sampling leaves out, which its next
        // switch-out accounts: `close_intervals`). Another thread's word: the long way.
        if let Some(&w) = BLOCK_DEADLINES.get(tid & (BLOCK_DEADLINE_SLOTS - 1)) {
            if w == idle_word(tid) {
                return None;
            }
            // SAFETY: helper without preconditions.
            let now = unsafe { bpf_ktime_get_ns() };
            if before_deadline(w, tid, now) {
                count(STAT_OFF_SAMPLED_OUT);
                return None;
            }
        }
    }
    if !targeted(cfg, pid) {
        return None;
    }
    let key = thread_key(pid, tid);
    // SAFETY: a live map value; its switch-out ran before on some CPU, and its next runs after.
    let st = unsafe { &mut *SCHED.get_ptr_mut(key)? };
    if st.attr != ATTR_PENDING {
        return None;
    }
    // SAFETY: helper without preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    let len = now.saturating_sub(st.since_ns);
    let busy = CAPTURING.get_ptr_mut(0)?;
    // SAFETY: this CPU's flag; only an interrupting sample reads it meanwhile.
    unsafe { *busy = 1 };
    st.attr = block_attr::<MODERN>(ctx, cfg, st, pid, tid, now, len);
    // SAFETY: as above.
    unsafe { *busy = 0 };
    Some(())
}

/// Where the off-CPU interval of a thread that blocked, and is back after `len` ns, is charged.
/// An interval shorter than a sampling period `P` is sampled by its time (see `ATTR_NONE`):
/// kept when the short time summed since the last kept one reaches `P`, and charged with that
/// sum; so a thread is looked at about once a period, however often it blocks, and its total
/// stays exact. A kept or long interval is charged by its blocking point, known by its
/// signature (`block_signature`): the thread keeps its last `SCHED_SLOTS` points, each with the
/// capture taken there, and a point it blocked at recently has the same stack, so its capture
/// applies and nothing is copied. A new point is captured: at most twice a period per thread
/// (a long interval lasts a period; kept short ones come a period of off-CPU time apart). A
/// capture the full ring refused is time without a stack.
#[inline(always)]
pub(crate) fn block_attr<const MODERN: bool>(
    ctx: *mut c_void,
    cfg: &Config,
    st: &mut ThreadSched,
    pid: u32,
    tid: u32,
    now: u64,
    len: u64,
) -> u32 {
    let period = cfg.sched_span_ns;
    let mut extra = 0u64;
    if len < period {
        // `short_ns` holds the accounted length of those left out since the last one kept.
        if st.short_ns + len < period {
            count(STAT_OFF_SAMPLED_OUT);
            return ATTR_NONE;
        }
        extra = st.short_ns;
        st.short_ns = 0;
    }
    let sig = block_signature::<MODERN>(cfg, pid, tid);
    for i in 0..SCHED_SLOTS {
        if st.slot_cap[i] != 0 && st.slot_sig[i] == sig {
            add_extra(st, i, extra);
            return i as u32;
        }
    }
    let slot = (st.next_slot as usize) % SCHED_SLOTS;
    if st.off_ns[slot] != 0 {
        // The open span charges time to the capture this slot is about to forget.
        emit(st, thread_key(pid, tid), 0, 0, SEND_SPAN);
    }
    // Before the capture, so that no register holds `extra` through it: a value known on one
    // path (0) and not on the other would have the verifier walk the whole capture twice.
    add_extra(st, slot, extra);
    if !capture::<MODERN>(
        ctx,
        cfg,
        RECORD_SWITCH_OUT,
        pid,
        tid,
        now,
        None,
        st.blocked_state as u64,
    ) {
        // The slot keeps its older capture: the time goes without a stack.
        if let (Some(o), Some(u)) = (
            st.off_ns.get(slot).copied(),
            st.off_ns.get_mut(ATTR_UNCAPTURED as usize),
        ) {
            *u += o;
        }
        if let Some(o) = st.off_ns.get_mut(slot) {
            *o = 0;
        }
        count(STAT_OFF_UNCAPTURED);
        return ATTR_UNCAPTURED;
    }
    st.slot_sig[slot] = sig;
    st.slot_cap[slot] = now;
    st.next_slot = (slot + 1) as u32;
    count(STAT_SWITCH_CAPTURES);
    slot as u32
}

/// A kept short interval is charged with the short intervals left out before it: their time
/// goes to its slot in the open span (the interval itself joins the span at the next
/// switch-out).
#[inline(always)]
fn add_extra(st: &mut ThreadSched, slot: usize, extra: u64) {
    if let Some(o) = st.off_ns.get_mut(slot) {
        *o += extra;
    }
}

/// Where the current thread blocks, as one word: its user-mode instruction and stack pointers
/// (the syscall site and C stack depth) and, for a Python thread, its innermost interpreter
/// frame, and the code object and instruction of it and of its callers up to `SIG_FRAMES`
/// frames. Equal words: the same blocking point, so the same stack. A few reads: no copy. A
/// subprogram: it returns one word, so the verifier walks what follows once, not once per way
/// through it.
#[inline(never)]
pub(crate) fn block_signature<const MODERN: bool>(cfg: &Config, pid: u32, tid: u32) -> u64 {
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
    let mut sig = sig ^ frame.rotate_left(7);
    // The innermost frame and its callers, each its code object and instruction (a caller's is
    // its call site), mixed in by position.
    for k in 0..SIG_FRAMES {
        let code = frame_u64(fbuf, pc.frame_code) & pc.code_mask;
        let instr = frame_u64(fbuf, pc.frame_instr);
        sig = (sig ^ code ^ instr.rotate_left(32)).wrapping_mul(SIG_MIX);
        let caller = frame_u64(fbuf, pc.frame_previous);
        if k + 1 == SIG_FRAMES || caller == 0 || !read_frame(fbuf, pc.frame_read_size, caller) {
            break;
        }
    }
    sig
}

/// Python frames a blocking point's signature covers: the innermost and its callers. A function
/// called from two places has its frame at the same address under both when they are at the
/// same depth (and so, on 3.8-3.10, when they reuse the code object's frame), at the same C
/// stack depth: its callers tell the two apart. Each is one read of a few words, at a kept
/// interval only (a few hundred a second on a busy service).
const SIG_FRAMES: usize = 4;
/// An odd constant (2^64 over the golden ratio) that spreads each frame's words over the word.
const SIG_MIX: u64 = 0x9e37_79b9_7f4a_7c15;
