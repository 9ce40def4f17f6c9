//! Copies of code-object heads (with the starts of their name strings) into the record, for
//! code user space may not get to read: code run once, its callees, and code not yet known.

use core::ffi::c_void;

use aya_ebpf::helpers::generated::bpf_probe_read_user;
use profiler_common::*;

use crate::maps::{copied_slot, KNOWN_CODES, SCRATCH, WALK};

pub(crate) extern "C" fn copy_head_step(index: u64, _ctx: *mut c_void) -> i64 {
    copy_code_head(index)
}

pub(crate) extern "C" fn copy_unknown_head_step(index: u64, _ctx: *mut c_void) -> i64 {
    let Some(w) = WALK.get_ptr_mut(0) else {
        return 1;
    };
    // SAFETY: this CPU's walk state, written by `walk_python`.
    let from = unsafe { core::ptr::read_volatile(&(*w).snap_from) } as u64;
    copy_code_head(from + index)
}

pub(crate) extern "C" fn choose_unknown_step(index: u64, _ctx: *mut c_void) -> i64 {
    choose_unknown_code(index)
}

/// Chooses frame `i` for a copy of its code head if user space has not read that code (it is
/// not in `KNOWN_CODES`): it may be freed, or its process gone, before user space gets to it (a
/// module's functions run by `exec`; start-up code such as `<frozen getpath>`). A code several
/// frames run is copied once: the others point to that copy. Runs after the first copies
/// (their frames know their copy's index), innermost first. Returns 1 to stop.
#[inline(always)]
pub(crate) fn choose_unknown_code(i: u64) -> i64 {
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
pub(crate) fn copy_code_head(k: u64) -> i64 {
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
pub(crate) fn copy_string<const N: usize>(to: &mut [u8; N], addr: u64) {
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
