//! tachyon-bpf as a library: the whole pipeline the `tachyon-bpf` binary drives (capture,
//! unwinding and symbols, Python resolution, aggregation, output formats), and the decoders of
//! untrusted input the fuzz targets (`fuzz/`) exercise.

pub mod aggregate;
pub mod capture;
pub mod collect;
pub mod files;
pub mod ksyms_cache;
pub mod output;
pub mod process;
pub mod python;
pub mod session;
pub mod stack;
pub mod top;
