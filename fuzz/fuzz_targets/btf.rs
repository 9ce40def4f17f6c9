//! Kernel BTF: the struct-member walk never reads out of bounds or loops.
#![no_main]
use libfuzzer_sys::fuzz_target;
use tachyon_bpf::capture::btf::struct_offsets;

fuzz_target!(|data: &[u8]| {
    let _ = struct_offsets(data, "task_struct", &["pid", "tgid", "flags"]);
    if let Ok(btf) = tachyon_bpf::capture::btf::Btf::parse(data) {
        let _ = btf.tracepoint_args("sched_switch");
        let _ = btf.has_enumerator("bpf_func_id", "BPF_FUNC_loop");
        let _ = tachyon_bpf::capture::btf::KernelInfo::from_btf(&btf, String::new());
    }
});
