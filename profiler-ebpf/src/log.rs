//! Failure diagnostics through aya-log (`--debug-bpf`): the first occurrences of each failure
//! kind on each CPU are logged with the pid, tid and the address involved; every occurrence is
//! counted in `LOG_BUDGET`, so user space says how many were not logged.
//!
//! The modern program set logs; the compat set (kernels before 5.18) only counts: on 5.10 the
//! logging code's branches took the compat sampler past the verifier's limit of pending
//! branches ("the sequence of 8193 jumps is too complex"), even when the level says off.
//!
//! Off by default: user space sets aya-log's level global to 0 in the object's read-only data,
//! which the kernel freezes, so the verifier knows the test below is false and drops the
//! logging code it guards. Sampling then costs nothing more than it did without it.

use aya_log_ebpf::{
    macro_support::{level_enabled, Level},
    warn,
};
use profiler_common::*;

use crate::maps::LOG_BUDGET;

/// Logs failure `kind` of thread `pid`/`tid` at `addr` (what the failure is about: a stack
/// pointer, a frame, a record's size) with `n` (a frame's index, a count), if this CPU has not
/// logged that kind `LOG_FIRST` times yet.
#[inline(always)]
pub(crate) fn failure(kind: u32, pid: u32, tid: u32, addr: u64, n: u64) {
    if !enabled() {
        return;
    }
    if logged(kind) {
        report(kind, pid, tid, addr, n);
    }
}

/// Whether `--debug-bpf` is on (a constant to the verifier: see above).
#[inline(always)]
pub(crate) fn enabled() -> bool {
    level_enabled(Level::Warn)
}

/// Counts one occurrence of `kind` on this CPU; whether it is among the first `LOG_FIRST`.
#[inline(always)]
fn logged(kind: u32) -> bool {
    let Some(c) = LOG_BUDGET.get_ptr_mut(kind) else {
        return false;
    };
    // SAFETY: a per-CPU slot that only this CPU's program instance touches (a perf event and
    // `sched_switch` never nest on one CPU).
    unsafe {
        *c += 1;
        *c <= LOG_FIRST
    }
}

/// The log line. A subprogram: the formatting takes stack of its own, not its callers'.
#[inline(never)]
fn report(kind: u32, pid: u32, tid: u32, addr: u64, n: u64) {
    // The macros take a context they do not use (records go to aya-log's ring buffer).
    let ctx = ();
    match kind {
        LOG_USTACK => warn!(
            &ctx,
            "pid {} tid {}: user stack unreadable at sp {:x}", pid, tid, addr
        ),
        LOG_UREGS => warn!(
            &ctx,
            "pid {} tid {}: user registers unreadable at {:x}", pid, tid, addr
        ),
        LOG_TSTATE => warn!(
            &ctx,
            "pid {} tid {}: Python thread state not found", pid, tid
        ),
        LOG_FRAME_READ if n == 0 => warn!(
            &ctx,
            "pid {} tid {}: Python frame chain cut: no frame readable", pid, tid
        ),
        LOG_FRAME_READ => warn!(
            &ctx,
            "pid {} tid {}: Python frame chain cut: frame {} at {:x} unreadable", pid, tid, n, addr
        ),
        LOG_FRAME_CYCLE => warn!(
            &ctx,
            "pid {} tid {}: Python frame chain loops at frame {} ({:x})", pid, tid, n, addr
        ),
        _ => warn!(
            &ctx,
            "pid {} tid {}: record of {} bytes dropped: ring buffer full", pid, tid, addr
        ),
    }
}
