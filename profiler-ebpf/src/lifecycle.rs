//! Process lifetimes: fork (and following children), exec, exit.

use core::ffi::c_void;

use aya_ebpf::{
    bindings::BPF_RB_FORCE_WAKEUP,
    helpers::{
        bpf_get_current_pid_tgid, bpf_get_smp_processor_id, bpf_ktime_get_ns,
        generated::{bpf_get_current_comm, bpf_get_current_task},
    },
    programs::BtfTracePointContext,
};
use profiler_common::*;

use crate::{maps::*, mem::*, task::*};

pub(crate) fn fork(ctx: &BtfTracePointContext) -> Option<()> {
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
pub(crate) const PYTHON_NAME: u64 = u64::from_le_bytes(*b"python\0\0");
pub(crate) const PYTHON_MASK: u64 = 0xffff_ffff_ffff;

#[inline(always)]
pub(crate) fn event(kind: u32, pid: u32, tid: u32, now: u64, arg0: u64, arg1: u64, wake: u64) {
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

/// `tachyon_exec`: drops the old program's Python layout and reports the exec.
#[inline(always)]
pub(crate) fn exec() -> u32 {
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

/// `tachyon_exit`: sends what the thread's scheduler accounting holds, then its exit, and
/// forgets the thread (and the process, with its last thread).
#[inline(always)]
pub(crate) fn exit() -> u32 {
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
