//! Recordings (`tachyon-bpf record`): the finished, symbolized profile of a run with its run
//! information, as gzipped JSON. Everything a format needs is resolved before it is stored
//! (native symbols, Python names and lines, process and thread names), so `convert` needs
//! neither root nor the processes, and writes with the same code as a live run.

use std::io::{BufReader, Read, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::RunInfo;
use crate::aggregate::{Mode, Profile};

const FORMAT: &str = "tachyon-bpf recording";
const VERSION: u32 = 1;

#[derive(Serialize)]
struct RecordingRef<'a> {
    format: &'static str,
    version: u32,
    run: &'a RunInfo,
    profile: &'a Profile,
}

#[derive(Deserialize)]
struct Header {
    format: String,
    version: u32,
}

#[derive(Deserialize)]
struct Recording {
    run: RunInfo,
    profile: Profile,
}

pub fn to_bytes(p: &Profile, run: &RunInfo) -> Result<Vec<u8>, String> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    serde_json::to_writer(
        &mut gz,
        &RecordingRef {
            format: FORMAT,
            version: VERSION,
            run,
            profile: p,
        },
    )
    .map_err(|e| e.to_string())?;
    gz.flush().map_err(|e| e.to_string())?;
    gz.finish().map_err(|e| e.to_string())
}

/// Reads a recording back; any problem is one line naming the file.
pub fn load(path: &Path) -> Result<(Profile, RunInfo), String> {
    let what = path.display();
    let f = std::fs::File::open(path).map_err(|e| format!("cannot read {what}: {e}"))?;
    let mut r = BufReader::new(f);
    let mut magic = [0u8; 2];
    if r.read_exact(&mut magic).is_err() || magic != [0x1f, 0x8b] {
        return Err(format!("{what} is not a tachyon-bpf recording"));
    }
    let f = std::fs::File::open(path).map_err(|e| format!("cannot read {what}: {e}"))?;
    // Decompressed size is capped (a gzip bomb expands a thousandfold), as is the size of the
    // file itself.
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    if len > MAX_DECOMPRESSED {
        return Err(format!(
            "{what} is larger than a recording can be ({} MiB)",
            MAX_DECOMPRESSED >> 20
        ));
    }
    from_gzip(BufReader::new(f)).map_err(|e| format!("{what} {e}"))
}

/// A recording from its gzipped bytes, decompressing at most [`MAX_DECOMPRESSED`] (what `load`
/// does after opening the file; the fuzz targets feed this directly).
pub fn from_gzip(r: impl Read) -> Result<(Profile, RunInfo), String> {
    let mut text = Vec::new();
    flate2::read::GzDecoder::new(r)
        .take(MAX_DECOMPRESSED + 1)
        .read_to_end(&mut text)
        .map_err(|e| format!("is damaged: {e}"))?;
    if text.len() as u64 > MAX_DECOMPRESSED {
        return Err(format!(
            "decompresses to more than {} MiB, the limit of a recording",
            MAX_DECOMPRESSED >> 20
        ));
    }
    from_json(&text)
}

/// The most a recording may decompress to: about 2.3 million samples (a recording takes about
/// 225 bytes a sample, measured on a 3.12 workload with 60-deep Python stacks), e.g. 20 minutes
/// at 1 kHz on two busy CPUs. Longer runs are what `--continuous` is for.
pub const MAX_DECOMPRESSED: u64 = 512 << 20;

/// A recording's decompressed JSON, checked (the fuzz targets feed this directly).
pub fn from_json(text: &[u8]) -> Result<(Profile, RunInfo), String> {
    let h: Header =
        serde_json::from_slice(text).map_err(|_| "is not a tachyon-bpf recording".to_string())?;
    if h.format != FORMAT {
        return Err("is not a tachyon-bpf recording".into());
    }
    if h.version != VERSION {
        return Err(format!(
            "is a version {} recording; this tachyon-bpf reads version {VERSION}",
            h.version
        ));
    }
    let mut rec: Recording =
        serde_json::from_slice(text).map_err(|e| format!("is damaged: {e}"))?;
    rec.profile
        .reindex()
        .map_err(|e| format!("is damaged: {e}"))?;
    Ok((rec.profile, rec.run))
}

/// Re-selects the samples of a recording for another mode. Wall and all recordings hold every
/// sample with its stack and state, so any mode can be taken from them; the others only hold
/// what their mode kept.
pub fn select_mode(p: &mut Profile, run: &mut RunInfo, mode: Mode) -> Result<(), String> {
    if mode == p.mode {
        return Ok(());
    }
    if !matches!(p.mode, Mode::Wall | Mode::All) {
        return Err(format!(
            "this recording was made in {} mode; only wall and all recordings convert to other modes",
            p.mode.name()
        ));
    }
    p.mode = mode;
    run.mode = mode.name().to_string();
    for proc_ in p.processes.values_mut().chain(p.retired.iter_mut()) {
        for t in proc_.threads.values_mut() {
            for s in &mut t.samples {
                s.in_mode = mode.keeps(s.state);
            }
        }
    }
    Ok(())
}
