//! Reads of another process's memory with `process_vm_readv`. Target memory is untrusted: every
//! read has a caller-chosen bound, and failures are values, not panics.

use std::io::IoSliceMut;

use nix::sys::uio::{process_vm_readv, RemoteIoVec};
use nix::unistd::Pid;

/// Largest single read (strings, line tables).
pub const MAX_READ: usize = 1 << 20;

#[derive(Clone, Copy, Debug)]
pub struct Remote {
    pub pid: u32,
}

impl Remote {
    pub fn read(&self, addr: u64, len: usize) -> Option<Vec<u8>> {
        if len == 0 || len > MAX_READ || addr == 0 {
            return None;
        }
        let mut buf = vec![0u8; len];
        let n = process_vm_readv(
            Pid::from_raw(self.pid as i32),
            &mut [IoSliceMut::new(&mut buf)],
            &[RemoteIoVec {
                base: addr as usize,
                len,
            }],
        )
        .ok()?;
        (n == len).then_some(buf)
    }

    /// Reads several ranges in one system call; each result is `None` if not read whole.
    pub fn read_many(&self, ranges: &[(u64, usize)]) -> Vec<Option<Vec<u8>>> {
        let mut bufs: Vec<Vec<u8>> = ranges
            .iter()
            .map(|r| vec![0u8; r.1.min(MAX_READ)])
            .collect();
        let remote: Vec<RemoteIoVec> = ranges
            .iter()
            .map(|r| RemoteIoVec {
                base: r.0 as usize,
                len: r.1.min(MAX_READ),
            })
            .collect();
        let n = {
            let mut local: Vec<IoSliceMut> = bufs.iter_mut().map(|b| IoSliceMut::new(b)).collect();
            process_vm_readv(Pid::from_raw(self.pid as i32), &mut local, &remote).unwrap_or(0)
        };
        // process_vm_readv stops at the first failing remote range: everything before it is whole.
        let mut left = n;
        bufs.into_iter()
            .map(|b| {
                if left >= b.len() && !b.is_empty() {
                    left -= b.len();
                    Some(b)
                } else {
                    left = 0;
                    None
                }
            })
            .collect()
    }

    pub fn u64(&self, addr: u64) -> Option<u64> {
        self.read(addr, 8)
            .map(|b| u64::from_le_bytes(b[..8].try_into().unwrap()))
    }

    pub fn u32(&self, addr: u64) -> Option<u32> {
        self.read(addr, 4)
            .map(|b| u32::from_le_bytes(b[..4].try_into().unwrap()))
    }
}

pub fn le_u64(b: &[u8], off: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(off..off + 8)?.try_into().ok()?))
}

pub fn le_u32(b: &[u8], off: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(off..off + 4)?.try_into().ok()?))
}
