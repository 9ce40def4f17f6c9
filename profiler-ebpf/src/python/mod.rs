//! Python: the thread state of the current thread (`thread_state`), the walk of its frame chain
//! (`walk`), and the copies of code heads user space may not get to read (`code_heads`).

use core::ffi::c_void;

use aya_ebpf::helpers::generated::bpf_probe_read_user;
use profiler_common::*;

pub(crate) mod code_heads;
pub(crate) mod thread_state;
pub(crate) mod walk;

#[inline(always)]
pub(crate) fn frame_u64(buf: &[u8; FRAME_BUF], off: u32) -> u64 {
    // The mask (FRAME_BUF is a power of two) keeps o + 8 within the buffer and o 8-aligned.
    let o = (off as usize) & (FRAME_BUF - 8);
    // SAFETY: o + 8 <= FRAME_BUF, and the buffer is a map value (8-aligned), so the read is
    // aligned. (An unaligned read compiles to eight byte loads, which the verifier pays for in
    // every step of the frame loop.)
    unsafe { core::ptr::read(buf.as_ptr().add(o) as *const u64) }
}

#[inline(always)]
pub(crate) fn frame_i32(buf: &[u8; FRAME_BUF], off: u32) -> i32 {
    let o = (off as usize) & (FRAME_BUF - 4);
    // SAFETY: o + 4 <= FRAME_BUF and o is 4-aligned in an 8-aligned map value.
    unsafe { core::ptr::read(buf.as_ptr().add(o) as *const i32) }
}

/// Reads the first `size` bytes (all of the buffer when 0 or too large) of the interpreter frame
/// at `frame` into `fbuf`, in one read. Whether it succeeded.
#[inline(always)]
pub(crate) fn read_frame(fbuf: &mut [u8; FRAME_BUF], size: u32, frame: u64) -> bool {
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
