//! Every CPython line-table format (3.8-3.9 lnotab, 3.10 linetable, 3.11+ location tables)
//! decodes any bytes to some line, for any instruction offset.
#![no_main]
use std::sync::Arc;

use libfuzzer_sys::fuzz_target;
use tachyon_bpf::python::code::{line_lookup, line_of, CodeInfo};

fuzz_target!(|data: &[u8]| {
    if data.len() < 6 {
        return;
    }
    let instr = i32::from_le_bytes([data[0], data[1], data[2], data[3]]);
    let first = u16::from_le_bytes([data[4], data[5]]) as u32;
    let code = CodeInfo {
        name: Arc::from("f"),
        file: Arc::from("f.py"),
        firstlineno: first,
        linetable: data[6..].to_vec(),
        ident: [0; 3],
        name_ptr: 0,
        lines: Default::default(),
    };
    for minor in [8, 9, 10, 11, 12, 13, 14] {
        let _ = line_lookup(minor, &code, instr);
        let _ = line_of(minor, &code, instr);
    }
});
