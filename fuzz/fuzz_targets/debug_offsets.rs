//! CPython 3.13+ `_Py_DebugOffsets`, read from a target's runtime: any contents are refused or
//! give bounded offsets.
#![no_main]
use libfuzzer_sys::fuzz_target;
use tachyon_bpf::python::layout::{apply_debug_offsets, builtin, DEBUG_COOKIE};
use tachyon_bpf::python::remote::Remote;

fuzz_target!(|data: &[u8]| {
    let me = Remote {
        pid: std::process::id(),
    };
    let mut buf = DEBUG_COOKIE.to_vec();
    buf.extend_from_slice(data);
    buf.resize(buf.len().max(1024), 0);
    let mut l = builtin(13).expect("3.13 layout");
    let _ = apply_debug_offsets(&me, buf.as_ptr() as u64, &mut l);
});
