//! Ring-buffer records as the BPF program would write them: any bytes parse or fail cleanly,
//! and a parsed sample's stack reads stay inside its copy.
#![no_main]
use libfuzzer_sys::fuzz_target;
use tachyon_bpf::capture::record::Record;

fuzz_target!(|data: &[u8]| {
    if let Ok(Record::Sample(s)) = Record::parse(data) {
        for k in 0..64u64 {
            let _ = s.read_stack(s.sp.wrapping_add(k * 8));
        }
    }
});
