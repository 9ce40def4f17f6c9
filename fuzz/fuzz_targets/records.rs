//! Ring-buffer records as the BPF program would write them: any bytes parse or fail cleanly,
//! a parsed record never claims more than the bytes hold, and a parsed sample's stack reads
//! stay inside its copy and return its bytes.
#![no_main]
use libfuzzer_sys::fuzz_target;
use profiler_common::{MAX_KSTACK, MAX_PY_FRAMES, MAX_USTACK};
use tachyon_bpf::capture::record::Record;

fuzz_target!(|data: &[u8]| {
    let Ok(Record::Sample(s)) = Record::parse(data) else {
        return;
    };
    assert!(s.stack.len() <= MAX_USTACK && s.stack.len() <= data.len());
    assert!(s.kstack.len() <= MAX_KSTACK);
    assert!(s.py_frames.len() <= MAX_PY_FRAMES);
    // Around the copy and inside it, including addresses that wrap.
    for k in -8i64..72 {
        let addr =
            s.sp.wrapping_add((k * 8) as u64)
                .wrapping_sub(k.rem_euclid(3) as u64);
        let inside = addr
            .checked_sub(s.sp)
            .and_then(|off| Some((off as usize, (off as usize).checked_add(8)?)))
            .filter(|&(_, end)| end <= s.stack.len());
        match (s.read_stack(addr), inside) {
            (Some(v), Some((off, end))) => {
                assert_eq!(v.to_le_bytes(), s.stack[off..end], "read_stack({addr:#x})")
            }
            (None, None) => {}
            (got, _) => panic!(
                "read_stack({addr:#x}) = {got:?} with sp {:#x} and {} bytes",
                s.sp,
                s.stack.len()
            ),
        }
    }
});
