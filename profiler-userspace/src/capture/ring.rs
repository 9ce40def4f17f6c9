//! Reading records out of the BPF ring buffer: one record at a time, each released back to the
//! kernel as soon as it is decoded (a record is only borrowed from the ring's memory).

use aya::maps::{MapData, RingBuf};

/// Where records come from: the BPF ring buffer, or a queue of byte records in tests.
pub trait RecordSource {
    /// Calls `f` with the next record's bytes, which are released once `f` returns; `None` when
    /// no record is waiting.
    fn next_record<R>(&mut self, f: impl FnOnce(&[u8]) -> R) -> Option<R>;
}

impl RecordSource for RingBuf<MapData> {
    fn next_record<R>(&mut self, f: impl FnOnce(&[u8]) -> R) -> Option<R> {
        let item = self.next()?;
        Some(f(&item))
    }
}

impl RecordSource for std::collections::VecDeque<Vec<u8>> {
    fn next_record<R>(&mut self, f: impl FnOnce(&[u8]) -> R) -> Option<R> {
        let item = self.pop_front()?;
        Some(f(&item))
    }
}
