//! The thread state of the current thread, and the per-thread words a record carries from it.

use aya_ebpf::helpers::generated::bpf_get_current_task;
use profiler_common::*;

use crate::{maps::PY_THREADS, mem::*};

/// The frame of the `_PyCFrame` before `cframe` (3.11, 3.12), or 0.
#[inline(always)]
pub(crate) fn caller_frame(pc: &PyProcConfig, cframe: u64) -> u64 {
    read_user::<u64>(cframe + pc.cframe_previous as u64)
        .filter(|&p| p != 0)
        .and_then(|p| read_user::<u64>(p + pc.cframe_frame as u64))
        .unwrap_or(0)
}

/// Thread states looked at when a thread is missing from `PY_THREADS`.
pub(crate) const MAX_TSTATE_SCAN: usize = 32;

/// The thread state of the current thread of Python process `pid`: from `PY_THREADS`, or for a
/// thread user space has not seen yet (it started moments ago, and may block at once for a long
/// time), from the main interpreter's thread list, where its `thread_id` is its thread pointer
/// (`fsbase`). A state found that way is added to `PY_THREADS`; `tachyon_exit` removes it.
#[inline(always)]
pub(crate) fn thread_state(cfg: &Config, pc: &PyProcConfig, pid: u32, tid: u32) -> Option<u64> {
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
pub(crate) fn thread_state_by_fsbase(cfg: &Config, pc: &PyProcConfig, key: u64) -> u64 {
    thread_state_scan(cfg, pc, key).unwrap_or(0)
}

#[inline(always)]
pub(crate) fn thread_state_scan(cfg: &Config, pc: &PyProcConfig, key: u64) -> Option<u64> {
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

/// Whether the thread has an exception being raised (`curexc_type` / `current_exception`) or
/// being handled (an `exc_info` item whose value is neither NULL nor None; items of generators
/// not handling anything are skipped, as `_PyErr_GetTopmostException` does, up to 4 deep).
#[inline(always)]
pub(crate) fn has_exception(pc: &PyProcConfig, tstate: u64) -> bool {
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
