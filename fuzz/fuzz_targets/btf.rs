//! Kernel BTF: the struct-member walk never reads out of bounds or loops.
#![no_main]
use libfuzzer_sys::fuzz_target;
use tachyon_bpf::capture::btf::struct_offsets;

fuzz_target!(|data: &[u8]| {
    let _ = struct_offsets(data, "task_struct", &["pid", "tgid", "flags"]);
});
