//! A thread's interpreter frame chain read from outside, one frame at a time: the one walk of
//! the chain user space does (`dump`'s frames of a blocked thread, the event loops of
//! `--async-aware all`, a thread's `threading` bootstrap). Target memory is untrusted: the walk
//! is bounded by `MAX_PY_FRAMES` and ends at a cycle or at a frame that does not read.

use std::collections::HashSet;

use super::remote::{le_u64, Remote};

/// The frames from `first` outward: each frame's address and its first bytes.
pub struct FrameChain {
    remote: Remote,
    next: u64,
    /// Where a frame keeps its caller's (`frame_previous`).
    previous: usize,
    /// Bytes of each frame read.
    len: usize,
    seen: HashSet<u64>,
    /// The walk ended at a frame that could not be read.
    pub read_failed: bool,
}

impl FrameChain {
    /// The chain from frame `first` (0: none), reading `len` bytes of each frame (at least up
    /// to its `previous` word, at offset `previous`).
    pub fn new(remote: &Remote, first: u64, previous: u32, len: usize) -> FrameChain {
        FrameChain {
            remote: *remote,
            next: first,
            previous: previous as usize,
            len: len.max(previous as usize + 8),
            seen: HashSet::new(),
            read_failed: false,
        }
    }
}

impl Iterator for FrameChain {
    type Item = (u64, Vec<u8>);

    fn next(&mut self) -> Option<(u64, Vec<u8>)> {
        let frame = self.next;
        if frame == 0
            || self.seen.len() >= profiler_common::MAX_PY_FRAMES
            || !self.seen.insert(frame)
        {
            return None;
        }
        let Some(buf) = self.remote.read(frame, self.len) else {
            self.read_failed = true;
            return None;
        };
        self.next = le_u64(&buf, self.previous).unwrap_or(0);
        Some((frame, buf))
    }
}
