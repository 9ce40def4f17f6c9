//! Reads through the checked helpers, and stores the compiler must not merge into byte loops.

use aya_ebpf::helpers::bpf_probe_read_kernel;

/// Zeroes `place` with one store. Plain stores of zero side by side are merged into a call to
/// `memset`, which this target builds as a byte loop: run byte by byte on every record, and
/// walked byte by byte by the verifier at start-up (a 160-byte one was 800 instructions).
#[inline(always)]
pub(crate) fn zero<T: Copy + Default>(place: &mut T) {
    // SAFETY: a valid place, by its reference.
    unsafe { core::ptr::write_volatile(place, T::default()) }
}

/// Copies an array word by word (as a whole, it may be a byte loop: see `zero`).
#[inline(always)]
pub(crate) fn copy_all<const N: usize>(dst: &mut [u64; N], src: &[u64; N]) {
    for (d, s) in dst.iter_mut().zip(src.iter()) {
        // SAFETY: a valid place, by its reference.
        unsafe { core::ptr::write_volatile(d, *s) }
    }
}

/// `zero` for each word of an array.
#[inline(always)]
pub(crate) fn zero_all<const N: usize>(words: &mut [u64; N]) {
    for w in words.iter_mut() {
        zero(w);
    }
}

#[inline(always)]
pub(crate) fn read_kernel<T>(addr: u64) -> Option<T> {
    // SAFETY: bpf_probe_read_kernel checks the address; a fault is an error, not a crash.
    unsafe { bpf_probe_read_kernel(addr as *const T) }.ok()
}

#[inline(always)]
pub(crate) fn read_user<T>(addr: u64) -> Option<T> {
    // SAFETY: bpf_probe_read_user checks the address; a fault is an error, not a crash.
    unsafe { aya_ebpf::helpers::bpf_probe_read_user(addr as *const T) }.ok()
}
