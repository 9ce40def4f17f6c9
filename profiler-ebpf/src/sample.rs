//! The sample record: what the interrupted (or blocking) thread is doing at one instant, from
//! its registers and kernel stack to its Python frames and user stack, assembled in this CPU's
//! scratch buffer and sent whole.

use core::ffi::c_void;

use aya_ebpf::{
    bindings::BPF_RB_AVAIL_DATA,
    helpers::{
        bpf_get_current_pid_tgid, bpf_get_smp_processor_id, bpf_ktime_get_ns,
        generated::{bpf_get_current_comm, bpf_get_current_task, bpf_get_stack},
    },
    programs::PerfEventContext,
    EbpfContext,
};
use profiler_common::*;

use crate::{
    arch, log,
    maps::*,
    mem::*,
    python::{thread_state::*, walk::walk_python},
    task::*,
    ustack::*,
};

#[inline(always)]
pub(crate) fn sample<const MODERN: bool>(ctx: PerfEventContext) -> u32 {
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
    if CAPTURING.get(0).is_some_and(|&b| b != 0) {
        count(STAT_SAMPLE_NESTED);
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

/// Whether the current process's executable mappings changed since its previous record (or it
/// has none): `mm->exec_vm` counts the pages mapped executable, so a library loaded or unloaded
/// changes it, and anonymous memory (the allocators' arenas) does not.
#[inline(never)]
pub(crate) fn maps_changed(cfg: &Config, pid: u32) -> bool {
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

/// The header's identity of the record, every other field zeroed (the buffer is reused).
/// A macro, not a function, as every step of `capture`: the program is the body it always
/// was. (As functions, even inlined, the steps let the compiler assume that their reference
/// parameters do not alias; the code it then made took the compat sampler past 5.10's verifier
/// limit of 8,192 pending branches.)
macro_rules! start_header {
    ($hdr:ident, $kind:ident, $pid:ident, $tid:ident, $now:ident, $cpu:ident, $sched_state:ident) => {
        $hdr.kind = $kind;
        $hdr.pid = $pid;
        $hdr.tid = $tid;
        $hdr.time_ns = $now;
        $hdr.cpu = $cpu;
        // Into the header: the helper zeroes the buffer when it fails.
        // SAFETY: the header's 16-byte field.
        unsafe {
            bpf_get_current_comm(
                $hdr.comm.as_mut_ptr() as *mut c_void,
                $hdr.comm.len() as u32,
            )
        };
        zero(&mut $hdr.kstack_len);
        zero(&mut $hdr.py_len);
        zero(&mut $hdr.flags);
        zero(&mut $hdr.ustack_len);
        zero(&mut $hdr.py_tstate);
        zero(&mut $hdr.py_gil_holder);
        zero(&mut $hdr.py_gil_locked);
        zero(&mut $hdr.py_status);
        zero(&mut $hdr.py_gc_collecting);
        zero(&mut $hdr.py_snaps);
        zero(&mut $hdr.py_task);
        $hdr.sched_state = $sched_state;
        zero(&mut $hdr.ip);
        zero(&mut $hdr.sp);
        zero(&mut $hdr.bp);
        zero(&mut $hdr.lr);
    };
}

/// The user registers, from `regs` when they are user mode's, else from the task, with the
/// kernel stack of the instant. A macro, as `start_header`.
macro_rules! record_registers {
    ($ctx:ident, $cfg:ident, $hdr:ident, $regs:ident, $pid:ident, $tid:ident) => {
        // The registers are read from the context here, where they are used: read at the start
        // and kept on the stack, their words were written only when in user mode, and 6.1's
        // verifier (which did not carry what the first test of the mode proved to the second)
        // refused the read of them as a read of uninitialised stack.
        if let Some(u) = $regs.and_then(arch::user) {
            $hdr.ip = u.ip;
            $hdr.sp = u.sp;
            $hdr.bp = u.bp;
            $hdr.lr = u.lr;
        } else {
            $hdr.flags |= SAMPLE_KERNEL_MODE;
            match arch::read_user(user_regs::<MODERN>($cfg)) {
                Ok(Some(u)) => {
                    $hdr.ip = u.ip;
                    $hdr.sp = u.sp;
                    $hdr.bp = u.bp;
                    $hdr.lr = u.lr;
                }
                Ok(None) => $hdr.flags |= SAMPLE_NO_USER,
                Err(()) => {
                    $hdr.flags |= SAMPLE_NO_USER;
                    count(STAT_UREGS_FAIL);
                    if MODERN {
                        // The modern set's address is a typed pointer, which a log may not format.
                        log::failure(LOG_UREGS, $pid, $tid, 0, 0);
                    }
                }
            }
            // SAFETY: the buffer is the header's kstack array of MAX_KSTACK u64.
            let n = unsafe {
                bpf_get_stack(
                    $ctx,
                    $hdr.kstack.as_mut_ptr() as *mut c_void,
                    (MAX_KSTACK * 8) as u32,
                    0,
                )
            };
            if n > 0 {
                $hdr.kstack_len = (n / 8) as u32;
            } else {
                count(STAT_KSTACK_FAIL);
            }
        }
    };
}

/// Python: the frame chain and the GIL/GC words of the same instant. Flags and the walk's
/// results are kept in the header (map memory) and read back from there: to the verifier, a
/// value read from a map is any value, so paths that differ only in them merge, and the
/// frame loop (512 steps without bpf_loop) and the rest of the program are verified once,
/// not once per flag combination or possible frame count.
/// A macro, as `start_header`.
macro_rules! record_python {
    ($cfg:ident, $hdr:ident, $cpu:ident, $pid:ident, $tid:ident) => {
        // SAFETY: the value is copied out at once.
        if let Some(pc) = unsafe { PY_PROCS.get($pid) } {
            let pc = *pc;
            match thread_state($cfg, &pc, $pid, $tid) {
                None => {
                    $hdr.flags |= SAMPLE_PY_MISS;
                    count(STAT_PY_MISS);
                    if MODERN {
                        log::failure(LOG_TSTATE, $pid, $tid, 0, 0);
                    }
                }
                Some(tstate) => {
                    $hdr.flags |= SAMPLE_PY_THREAD;
                    $hdr.py_tstate = tstate;
                    walk_python::<MODERN>($cpu, &pc, tstate);
                }
            }
            if pc.gil_locked != 0 {
                $hdr.py_gil_locked = read_user::<u32>(pc.gil_locked).unwrap_or(0);
                $hdr.py_gil_holder = read_user::<u64>(pc.gil_last_holder).unwrap_or(0);
            }
            if pc.gc_collecting != 0 {
                $hdr.py_gc_collecting = read_user::<u32>(pc.gc_collecting).unwrap_or(0);
            }
            if pc.tstate_status != NO_OFFSET && $hdr.py_tstate != 0 {
                $hdr.py_status =
                    read_user::<u32>($hdr.py_tstate + pc.tstate_status as u64).unwrap_or(0);
            }
            if $hdr.py_tstate != 0 && has_exception(&pc, $hdr.py_tstate) {
                $hdr.flags |= SAMPLE_PY_EXCEPTION;
            }
            // `--async-aware`: the task the thread's event loop runs.
            if pc.tstate_running_task != NO_OFFSET && $hdr.py_tstate != 0 {
                $hdr.py_task =
                    read_user::<u64>($hdr.py_tstate + pc.tstate_running_task as u64).unwrap_or(0);
            }
        }
    };
}

/// Counts (and with `--debug-bpf` logs) what the walk reported, bounds the frame and code-head
/// counts, and declares `flags`, the record's flags so far, and `area`, where the user stack
/// goes (after the frames and the code heads). A macro, as `start_header`.
macro_rules! settle_python_part {
    ($hdr:ident, $pid:ident, $tid:ident, $flags:ident, $area:ident) => {
        // SAFETY: fields of the header written above; volatile so that the value comes from memory.
        let mut py_len = unsafe { core::ptr::read_volatile(&$hdr.py_len) } as usize;
        // SAFETY: as above.
        let mut $flags = unsafe { core::ptr::read_volatile(&$hdr.flags) };
        if $flags & SAMPLE_PY_TRUNCATED != 0 {
            count(STAT_PY_TRUNCATED);
        }
        if $flags & SAMPLE_PY_READ_FAILED != 0 {
            count(STAT_PY_READ_FAIL);
        }
        if MODERN && $flags & (SAMPLE_PY_READ_FAILED | SAMPLE_PY_CYCLE) != 0 {
            log_frame_chain($pid, $tid, $flags, py_len as u64);
        }
        if py_len > MAX_PY_FRAMES {
            py_len = MAX_PY_FRAMES;
        }
        $hdr.py_len = py_len as u32;

        // SAFETY: a field of the header; volatile as above.
        let mut snaps = unsafe { core::ptr::read_volatile(&$hdr.py_snaps) } as usize;
        if snaps > PY_CODE_SNAPS {
            snaps = PY_CODE_SNAPS;
        }
        $hdr.py_snaps = snaps as u32;
        let $area =
            SampleHeader::SIZE + py_len * core::mem::size_of::<PyFrame>() + snaps * CodeSnap::SIZE;
    };
}

/// The user stack, copied after `area`: first up to the next page boundary, then whole pages,
/// so the copy ends exactly where the stack mapping ends; declares `copied`, the bytes copied.
/// A macro, as `start_header`.
macro_rules! copy_user_stack {
    ($cfg:ident, $base:ident, $hdr:ident, $cpu:ident, $pid:ident, $tid:ident, $area:ident, $flags:ident, $copied:ident) => {
        let mut copied_total: usize = 0;
        if $flags & SAMPLE_NO_USER == 0 && $hdr.sp != 0 {
            let sp = $hdr.sp;
            let mut want = $cfg.ustack_size as usize;
            // The stack in use ends below the thread's outermost frame: copied up to there
            // (the thread's control block, or the main thread's arguments), not to the end of
            // its mapping. Without `bpf_loop`, up to the page boundary after it: a last chunk of
            // any length would have the verifier walk each step of the unrolled loop many times
            // over. (Exactly there, a thread's copy is 2.3 KiB shorter: glibc's thread
            // descriptor above its thread pointer is not copied.)
            let end = stack_in_use_end($cfg, $pid, $tid, sp);
            if end > sp {
                let upto = if MODERN {
                    end - sp
                } else {
                    ((end + USTACK_CHUNK as u64 - 1) & !(USTACK_CHUNK as u64 - 1)) - sp
                };
                if upto < want as u64 {
                    want = upto as usize;
                }
            }
            if MODERN {
                // One chunk a `bpf_loop` step: the verifier walks the step once, where it walked
                // each of the unrolled loop's 16 steps (two-thirds of the sampler's instructions
                // verified, and of the scheduler program's capture).
                copied_total = copy_stack($cpu, $pid, $tid, sp, $area, want, &mut $flags);
            } else {
                let mut top: u64 = 0;
                let key = thread_key($pid, $tid);
                for k in 0..(MAX_USTACK / USTACK_CHUNK) {
                    // Read back through memory: LLVM would otherwise fold the offset into an induction
                    // variable whose bounds the verifier cannot follow.
                    // SAFETY: a local.
                    let copied = unsafe { core::ptr::read_volatile(&copied_total) };
                    let Some(next) = copy_chunk::<false>(
                        $base, $area, sp, k as u64, copied, want, key, &mut top, &mut $flags,
                    ) else {
                        break;
                    };
                    // SAFETY: a local.
                    unsafe { core::ptr::write_volatile(&mut copied_total, next) };
                }
            }
        }
        // SAFETY: a local.
        let $copied = unsafe { core::ptr::read_volatile(&copied_total) };
    };
}

/// Assembles one sample record of the current thread and sends it. `regs`: the registers the
/// thread was interrupted with (a sample's); when they are not user mode's (or there are none,
/// a switch's), the user registers come from the task and the kernel stack is recorded.
/// Returns whether the record was written.
///
/// Its steps, in the record's order (each a macro above): `start_header`, `record_registers`,
/// `record_python`, `settle_python_part`, `copy_user_stack`, then the send. The compiled
/// program is the same, instruction for instruction, as the one body it was before the steps
/// were named.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn capture<const MODERN: bool>(
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
    // timer interrupt; the switch-in's kprobe runs with interrupts disabled, and its tracepoint
    // (`sched_exit_tp`, interrupts on, preemption off) raises `CAPTURING`, which the sampler
    // respects.
    let hdr = unsafe { &mut *(base as *mut SampleHeader) };
    start_header!(hdr, kind, pid, tid, now, cpu, sched_state);

    record_registers!(ctx, cfg, hdr, regs, pid, tid);

    if maps_changed(cfg, pid) {
        hdr.flags |= SAMPLE_MAPS_CHANGED;
    }

    record_python!(cfg, hdr, cpu, pid, tid);
    settle_python_part!(hdr, pid, tid, flags, area);

    copy_user_stack!(cfg, base, hdr, cpu, pid, tid, area, flags, copied);
    hdr.ustack_len = copied as u32;
    hdr.flags = flags;
    if MODERN && copied == 0 && flags & SAMPLE_NO_USER == 0 {
        log::failure(LOG_USTACK, pid, tid, hdr.sp, 0);
    }

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
        if MODERN {
            log::failure(LOG_DROPPED, pid, tid, total as u64, 0);
        }
        return false;
    }
    if SAMPLES.output::<[u8]>(record, wake_flags()).is_ok() {
        count(STAT_SAMPLES);
        true
    } else {
        count(STAT_LOST);
        if MODERN {
            log::failure(LOG_DROPPED, pid, tid, total as u64, 0);
        }
        false
    }
}

/// `--debug-bpf`: where the walk stopped, as the walk state left it (the frame it could not
/// read, or the one that is its own previous); with no frame recorded, the thread state.
#[inline(always)]
fn log_frame_chain(pid: u32, tid: u32, flags: u32, py_len: u64) {
    if !log::enabled() {
        return;
    }
    let frame = WALK
        .get_ptr(0)
        // SAFETY: this CPU's walk state, a field read once.
        .map(|w| unsafe { core::ptr::read_volatile(&(*w).frame) })
        .unwrap_or(0);
    if flags & SAMPLE_PY_CYCLE != 0 {
        log::failure(LOG_FRAME_CYCLE, pid, tid, frame, py_len.saturating_sub(1));
    } else {
        log::failure(LOG_FRAME_READ, pid, tid, frame, py_len);
    }
}
