//! The walk of a thread's interpreter frame chain, one frame a step, into the record.

use core::ffi::c_void;

use aya_ebpf::{bindings::BPF_RB_AVAIL_DATA, helpers::generated::bpf_loop};
use profiler_common::*;

use super::{code_heads::*, frame_i32, frame_u64, read_frame, thread_state::caller_frame};
use crate::{maps::*, mem::*};

/// The thread's innermost frame, with on 3.11 and 3.12 its current `_PyCFrame` (or 0) and the
/// frame the one before that runs, which the chain must reach (`Walk::expect`; 0: unchecked):
/// declares `frame`, `cframe` and `expect`; returns with the record's flag set when the
/// thread state cannot be read.
/// A macro, not a function, as the steps of `sample::capture` (see `start_header` there).
macro_rules! first_frame {
    ($hdr:ident, $pc:ident, $tstate:ident, $frame:ident, $cframe:ident, $expect:ident) => {
        let Some(mut $frame) = read_user::<u64>($tstate + $pc.tstate_frame as u64) else {
            $hdr.flags |= SAMPLE_PY_READ_FAILED;
            return;
        };
        // The current `_PyCFrame` (3.11, 3.12), or 0, and the frame of the one before it.
        let mut $cframe = 0u64;
        let mut $expect = 0u64;
        if $pc.cframe_frame != NO_OFFSET && $frame != 0 {
            $cframe = $frame;
            // `current_frame` and `previous` in one read: `previous` follows it on both versions
            // (`PyProcConfig::cframe_previous`).
            let Some([current, previous]) =
                read_user::<[u64; 2]>($cframe + $pc.cframe_frame as u64)
            else {
                $hdr.flags |= SAMPLE_PY_READ_FAILED;
                return;
            };
            let before = || {
                if previous == 0 {
                    return 0;
                }
                read_user::<u64>(previous + $pc.cframe_frame as u64).unwrap_or(0)
            };
            if current == 0 {
                $frame = before();
            } else {
                $frame = current;
                if MODERN {
                    // Checked by the walk (`Walk::expect`): kernels with `bpf_loop` only, where the
                    // walk can be done again; the unrolled walk of older ones has no room for it.
                    $expect = before();
                }
            }
        }
    };
}

/// The frame loop: `bpf_loop` of `walk_step`, walked again from the caller's frames when the
/// chain missed the previous `_PyCFrame`'s frame; without `bpf_loop`, a bounded loop.
/// A macro, not a function, as the steps of `sample::capture` (see `start_header` there).
macro_rules! walk_frames {
    ($hdr:ident, $w:ident, $pc:ident, $cframe:ident) => {
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
                    core::ptr::read_volatile(&$hdr.flags),
                    core::ptr::read_volatile(&(*$w).expect),
                )
            };
            if $cframe != 0 && expect != 0 && flags & SAMPLE_PY_TRUNCATED == 0 {
                let caller = caller_frame($pc, $cframe);
                if caller != 0 {
                    $hdr.flags = flags & !(SAMPLE_PY_READ_FAILED | SAMPLE_PY_CYCLE);
                    $hdr.py_len = 0;
                    // SAFETY: as above.
                    unsafe {
                        let $w = &mut *$w;
                        $w.frame = caller;
                        $w.expect = 0;
                        $w.walks = $w.walks.wrapping_add(1);
                        $w.snaps = 0;
                        $w.callee = 0;
                        $w.handle = 0;
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
                if walk_frame::<false>(i as u64) != 0 {
                    break;
                }
            }
        }
    };
}

/// The code heads, in a pass of their own: a step that also copied them would need more
/// stack than a `bpf_loop` callback has room for under the switch program.
/// A macro, not a function, as the steps of `sample::capture` (see `start_header` there).
macro_rules! copy_code_heads {
    ($w:ident) => {
        if MODERN {
            // SAFETY: as above.
            unsafe {
                bpf_loop(
                    PY_CODE_SNAPS as u32,
                    copy_head_step as *mut c_void,
                    core::ptr::null_mut(),
                    0,
                );
                // Then the heads of code user space has not read (`choose_unknown_code`), after those; not while
                // the ring holds more than its wake-up mark: a reader that falls behind has not
                // read the code either, and larger records would only put it further behind.
                let $w = &mut *$w;
                $w.snap_from = core::ptr::read_volatile(&$w.snaps);
                let behind = CONFIG
                    .get(0)
                    .is_none_or(|c| SAMPLES.query(BPF_RB_AVAIL_DATA as u64) >= c.wakeup_bytes as u64);
                if !behind {
                    bpf_loop(
                        MAX_PY_FRAMES as u32,
                        choose_unknown_step as *mut c_void,
                        core::ptr::null_mut(),
                        0,
                    );
                    bpf_loop(
                        PY_CODE_SNAPS as u32,
                        copy_unknown_head_step as *mut c_void,
                        core::ptr::null_mut(),
                        0,
                    );
                }
            }
        } else {
            for k in 0..PY_CODE_SNAPS {
                if copy_code_head(k as u64) != 0 {
                    break;
                }
            }
        }
    };
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
pub(crate) fn walk_python<const MODERN: bool>(cpu: u32, pc: &PyProcConfig, tstate: u64) {
    let Some(scratch) = SCRATCH.get_ptr_mut(cpu) else {
        return;
    };
    // SAFETY: the scratch buffer starts with the header (see `capture`).
    let hdr = unsafe { &mut *(scratch as *mut SampleHeader) };
    first_frame!(hdr, pc, tstate, frame, cframe, expect);
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
    walk_frames!(hdr, w, pc, cframe);
    copy_code_heads!(w);
    // `--async-aware` on 3.11-3.13: the task whose step the innermost `Handle._run` calls.
    // SAFETY: this CPU's walk state, written by the steps above.
    let handle = unsafe { core::ptr::read_volatile(&(*w).handle) };
    if handle != 0 {
        if let Some(cb) = read_user::<u64>(handle.wrapping_add(pc.handle_callback as u64)) {
            hdr.py_task = read_user::<u64>(cb.wrapping_add(pc.step_task as u64)).unwrap_or(0);
        }
    }
}

/// One step of the frame walk: reads the frame, records it, moves to the previous one.
/// Returns 1 to stop.
pub(crate) extern "C" fn walk_step(index: u64, _ctx: *mut c_void) -> i64 {
    walk_frame::<true>(index)
}

/// What the frame says goes to memory as soon as it is known, and is read back (volatile)
/// where it is used again: few values live at once, so the step fits the 32 bytes of stack
/// a `bpf_loop` callback has under the switch program.
///
/// A macro, not a function: the steps of the frame loop are the body they always were. (A
/// function, even inlined, lets the compiler assume that its reference parameters do not alias;
/// the code it then made took the compat sampler past 5.10's verifier limit of 8,192 pending
/// branches.)
macro_rules! record_frame {
    ($w:ident, $f:ident, $i:ident) => {
        {
            let fbuf = &$w.fbuf;
            let pc = &$w.pc;
            let code = frame_u64(fbuf, pc.frame_code) & pc.code_mask;
            $f.code = code;
            $f.instr = if pc.layout == PY_LAYOUT_FRAMEOBJECT {
                frame_i32(fbuf, pc.frame_instr)
            } else {
                let ip = frame_u64(fbuf, pc.frame_instr);
                interp_instruction(ip, code, pc.code_adaptive)
            };
            $f.flags = if pc.frame_owner != NO_OFFSET {
                fbuf[(pc.frame_owner as usize) & (FRAME_BUF - 1)] as u32
            } else {
                0
            };
            // The code head is copied for frames with locals of their own (module and class
            // bodies, `exec`): their code runs once and may be freed before user space reads it,
            // while a function's code lives as long as the function. Without the offset, the
            // innermost frames are copied. Without `bpf_loop`, so is the innermost frame's; with
            // it, any code user space has not settled (`choose_unknown_code`), the innermost frame's included.
            $w.once = if pc.frame_locals != NO_OFFSET {
                (frame_u64(fbuf, pc.frame_locals) != 0) as u32
            } else {
                ($i < PY_CODE_SNAPS) as u32
            };
            $w.next = frame_u64(fbuf, pc.frame_previous);
            if pc.handle_run_code != 0 && code == pc.handle_run_code && $w.handle == 0 {
                $w.handle = frame_u64(fbuf, pc.frame_self);
            }
            let mark = fbuf[(pc.frame_owner as usize) & (FRAME_BUF - 1)] as u32;
            if CALLEES && $w.expect != 0 && pc.entry_mark != 0 && mark == pc.entry_mark {
                $w.expect = ($w.next != $w.expect) as u64;
            }
        }
    };
}

/// Chooses the frame's code for a head copy (see `copy_code_head`): a code run once, and the
/// function it calls, or without `bpf_loop` the innermost frame's. A macro, as `record_frame`.
macro_rules! note_code_head {
    ($w:ident, $f:ident, $i:ident) => {
        {
            // SAFETY: reads of fields written above.
            let (code, owner, once) = unsafe {
                (
                    core::ptr::read_volatile(&$f.code),
                    core::ptr::read_volatile(&$f.flags),
                    core::ptr::read_volatile(&$w.once),
                )
            };
            // A C-stack shim frame (owner 3 and up, 3.12+) has no code of its own, and its other
            // fields are left as they were.
            let shim = code == 0 || ($w.pc.frame_owner != NO_OFFSET && owner >= 3);
            if !shim {
                // A function that code run once calls may be freed with it (a module body calling
                // a helper it deletes after, as `hashlib` does): its head is copied too, unless
                // the caller is the outermost frame (a program's main module, which outlives it).
                // Copied once the walk is done; frames learn their copy's index there (`copy_code_head`).
                // SAFETY: reads of fields written by earlier steps.
                let (callee, outer) = unsafe {
                    (
                        core::ptr::read_volatile(&$w.callee),
                        core::ptr::read_volatile(&$w.next) == 0,
                    )
                };
                let k = $w.snaps as usize;
                if CALLEES && once != 0 && callee != 0 && !outer && k < PY_CODE_SNAPS {
                    $w.snap_code[k & (PY_CODE_SNAPS - 1)] = callee;
                    $w.snap_at[k & (PY_CODE_SNAPS - 1)] = $w.callee_at;
                    $w.snaps = k as u32 + 1;
                }
                // Read back from memory: a count carried over in a register lets the compiler join
                // the two tests in a way older verifiers follow into impossible bounds.
                // SAFETY: a read of the field written above.
                let k = unsafe { core::ptr::read_volatile(&$w.snaps) } as usize;
                // The innermost frame's is copied here only without `bpf_loop`: with it, `choose_unknown_code`
                // copies it unless user space has settled that code (`KNOWN_CODES`).
                if ((k == 0 && !CALLEES) || once != 0) && k < PY_CODE_SNAPS {
                    $w.snap_code[k & (PY_CODE_SNAPS - 1)] = code;
                    $w.snap_at[k & (PY_CODE_SNAPS - 1)] = $i as u32;
                    $w.snaps = k as u32 + 1;
                    $w.callee = 0;
                } else {
                    $w.callee = code;
                    $w.callee_at = $i as u32;
                }
            }
        }
    };
}

/// `CALLEES`: also copy the head of a function that code run once calls (see below). Not in
/// the compat set: its 512 steps are verified one by one, and the branch multiplies its states.
#[inline(always)]
pub(crate) fn walk_frame<const CALLEES: bool>(index: u64) -> i64 {
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
    record_frame!(w, f, i);
    hdr.py_len = i as u32 + 1;
    note_code_head!(w, f, i);
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
