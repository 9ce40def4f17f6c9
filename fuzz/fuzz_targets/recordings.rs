//! Recordings given to `convert`: any JSON is refused or yields a profile every writer can
//! render (indices checked, stack walks end).
#![no_main]
use libfuzzer_sys::fuzz_target;
use tachyon_bpf::output::{recording, Format};

fuzz_target!(|data: &[u8]| {
    if let Ok((p, run)) = recording::from_json(data) {
        for f in [
            Format::Collapsed,
            Format::Jsonl,
            Format::Pprof,
            Format::Gecko,
        ] {
            let _ = f.render(&p, &run);
        }
    }
});
