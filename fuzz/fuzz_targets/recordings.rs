//! Recordings given to `convert`: any input is refused or yields a profile every writer can
//! render (indices checked, stack walks end, depth and expansion bounded). Inputs are tried
//! both as decompressed JSON and as the gzip file `convert` reads, whose decompression is
//! capped; `cargo xtask fuzz` runs this target under a 1 GiB RSS limit.
#![no_main]
use libfuzzer_sys::fuzz_target;
use tachyon_bpf::output::{recording, Format};

fuzz_target!(|data: &[u8]| {
    for (p, run) in [recording::from_json(data), recording::from_gzip(data)]
        .into_iter()
        .flatten()
    {
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
