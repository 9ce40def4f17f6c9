//! Code objects and str objects read from a target: the fuzz input is laid out in this
//! process's memory as the object (its pointers go anywhere), and read back through the same
//! remote-read path used on real targets, and names and files from copies taken at the sample.
//! Lengths are bounded and bad reads fail cleanly.
#![no_main]
use libfuzzer_sys::fuzz_target;
use tachyon_bpf::python::code::{
    header_len, read_code, read_unicode, unicode_from_copy, StringCopies,
};
use tachyon_bpf::python::layout;
use tachyon_bpf::python::remote::Remote;

fuzz_target!(|data: &[u8]| {
    let me = Remote {
        pid: std::process::id(),
    };
    let mut buf = data.to_vec();
    buf.resize(buf.len().max(512), 0);
    let addr = buf.as_ptr() as u64;
    for minor in 8..=14 {
        let l = layout::builtin(minor).expect("a built-in layout for every supported version");
        if let Some(s) = read_unicode(&me, &l, addr, 0) {
            assert!(s.chars().count() <= 4096);
        }
        let head = &buf[..header_len(&l).min(buf.len())];
        if let Some(c) = read_code(&me, &l, head, Default::default(), StringCopies::default()) {
            assert!(tachyon_bpf::python::code::plausible_name(&c.name));
        }
        // A copy of a name's start taken at the sample: decoded from the copy alone.
        let copy = &buf[buf.len() - 96..];
        if let Some(s) = unicode_from_copy(&l, addr, copy, 0) {
            assert!(s.len() <= 4 * 96);
        }
        // The file's copy may hold only the start of a longer string: then what is read now
        // is checked against it.
        let copies = StringCopies {
            name: Some(copy),
            file: Some(&buf[buf.len() - 192..]),
        };
        if let Some(c) = read_code(&me, &l, head, Default::default(), copies) {
            assert!(tachyon_bpf::python::code::plausible_name(&c.name));
        }
    }
});
