//! The copy of the user stack, for DWARF unwinding in user space: from the stack pointer to
//! where the stack in use ends, a page at a time.

use core::ffi::c_void;

use aya_ebpf::helpers::generated::{bpf_get_current_task, bpf_loop, bpf_probe_read_user};
use profiler_common::*;

use crate::{maps::*, mem::*};

/// Where the stack the current thread uses ends, or 0 when not known (its copy then goes on to
/// the end of its mapping or its size limit): for a process's main thread, a little above
/// `mm->start_stack`, the stack pointer the program started with (its outermost frame is below
/// it; above it are only the program's arguments, environment and auxiliary vector, 4-12 KiB);
/// for another thread, its thread pointer (glibc puts the thread's control block there, and its
/// thread-local storage beside it, above the thread's frames), when that is above the stack
/// pointer and within a copy's reach. A subprogram: it returns one word.
#[inline(never)]
pub(crate) fn stack_in_use_end(cfg: &Config, pid: u32, tid: u32, sp: u64) -> u64 {
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
pub(crate) const STACK_END_SLACK: u64 = 64;

/// The user stack copy of the modern set: `sp`'s stack, `want` bytes at most, into this CPU's
/// scratch buffer after its first `area` bytes, one chunk a `bpf_loop` step (`copy_step`, the
/// unrolled loop's steps). Returns the bytes copied; adds `SAMPLE_USTACK_*` to `flags`.
#[inline(always)]
pub(crate) fn copy_stack(
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
pub(crate) const COPY_AREA_MAX: usize = SampleHeader::SIZE
    + MAX_PY_FRAMES * core::mem::size_of::<PyFrame>()
    + PY_CODE_SNAPS * CodeSnap::SIZE;

/// One chunk of `copy_stack`: to the next page boundary first, then whole pages. 1 ends the
/// loop: the copy has what it wants, or met the top of the stack.
pub(crate) extern "C" fn copy_step(index: u64, _ctx: *mut c_void) -> i64 {
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
    match copy_chunk::<true>(
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
/// thread's (`key`) known stack top, looked up on first need (0: not yet). `PARTIAL`: the last
/// chunk is what is left of `want` (a `bpf_loop` step, verified once whatever its length);
/// without it the copy ends at the last whole chunk that fits (the unrolled loop, whose steps a
/// chunk of any length would have the verifier walk many times over).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(crate) fn copy_chunk<const PARTIAL: bool>(
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
    let mut chunk = if index == 0 {
        USTACK_CHUNK - (sp as usize & (USTACK_CHUNK - 1))
    } else {
        USTACK_CHUNK
    };
    if PARTIAL && copied < want && copied + chunk > want {
        chunk = want - copied;
    }
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
