//! Reads of another process's memory with `process_vm_readv`. Target memory is untrusted: every
//! read has a caller-chosen bound, and failures are values, not panics.

use std::io::IoSliceMut;

use nix::sys::uio::{process_vm_readv, RemoteIoVec};
use nix::unistd::Pid;

/// Largest single read (strings, line tables).
pub const MAX_READ: usize = 1 << 20;
/// The page size ranges are joined by (the smallest any target has).
const PAGE: u64 = 4096;
/// The longest span `read_many` makes of several ranges.
const MAX_SPAN: usize = 64 << 10;
/// The kernel's limit on ranges per call (`IOV_MAX`).
const IOV_MAX: usize = 1024;

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

    /// Reads several ranges, each result `None` if not read whole: in one system call (one per
    /// `IOV_MAX` spans). Ranges that overlap or lie on the same or the next page are read as one
    /// span: the kernel pins a range's pages anew for each range, and what is read together
    /// (code objects, their names, the file name many of them share) lies many to a page. A
    /// span never covers a page that none of its ranges touches, so it fails only where one of
    /// its ranges would fail alone.
    pub fn read_many(&self, ranges: &[(u64, usize)]) -> Vec<Option<Vec<u8>>> {
        let len = |i: usize| ranges[i].1.min(MAX_READ);
        let mut order: Vec<usize> = (0..ranges.len())
            .filter(|&i| ranges[i].0 != 0 && len(i) > 0)
            .collect();
        order.sort_unstable_by_key(|&i| ranges[i].0);
        // (start, end) of each span, and the span each range is read in.
        let mut spans: Vec<(u64, u64)> = Vec::new();
        let mut span_of = vec![usize::MAX; ranges.len()];
        for &i in &order {
            let start = ranges[i].0;
            let end = start.saturating_add(len(i) as u64);
            match spans.last_mut() {
                Some((s, e))
                    if start / PAGE <= (*e - 1) / PAGE + 1
                        && end.max(*e) - *s <= MAX_SPAN.max(len(i)) as u64 =>
                {
                    *e = (*e).max(end)
                }
                _ => spans.push((start, end)),
            }
            span_of[i] = spans.len() - 1;
        }
        let mut data: Vec<Vec<u8>> = spans
            .iter()
            .map(|(s, e)| vec![0u8; (e - s) as usize])
            .collect();
        // Bytes of each span read. The kernel stops at the first span it cannot read whole:
        // the call goes on from the span after it (each call settles one span at least).
        let mut got = vec![0usize; spans.len()];
        let mut first = 0;
        while first < spans.len() {
            let end = spans.len().min(first + IOV_MAX);
            let remote: Vec<RemoteIoVec> = spans[first..end]
                .iter()
                .map(|(s, e)| RemoteIoVec {
                    base: *s as usize,
                    len: (e - s) as usize,
                })
                .collect();
            let mut left = {
                let mut local: Vec<IoSliceMut> = data[first..end]
                    .iter_mut()
                    .map(|b| IoSliceMut::new(b))
                    .collect();
                process_vm_readv(Pid::from_raw(self.pid as i32), &mut local, &remote).unwrap_or(0)
            };
            let mut next = end;
            for j in first..end {
                got[j] = left.min(data[j].len());
                left -= got[j];
                if got[j] < data[j].len() {
                    next = j + 1;
                    break;
                }
            }
            first = next;
        }
        (0..ranges.len())
            .map(|i| {
                let j = *span_of.get(i).filter(|&&j| j != usize::MAX)?;
                let off = (ranges[i].0 - spans[j].0) as usize;
                (off + len(i) <= got[j]).then(|| data[j][off..off + len(i)].to_vec())
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Joined or not, in any order, each range reads what a read of it alone reads; one that
    /// cannot be read fails alone.
    #[test]
    fn read_many_reads_each_range_as_alone() {
        let me = Remote {
            pid: std::process::id(),
        };
        let block: Vec<u8> = (0..3 * 4096 + 100).map(|i| (i * 7 % 251) as u8).collect();
        let a = block.as_ptr() as u64;
        let other = [9u8; 64];
        let b = other.as_ptr() as u64;
        let ranges = [
            (a + 4096, 200),
            (a, 64),
            (a + 10, 20),
            (a, 64),
            (8, 16),
            (b, 64),
            (a + 3 * 4096, 100),
            (a + 40, 0),
            (0, 8),
            (a + 4000, 300),
        ];
        let got = me.read_many(&ranges);
        for (r, g) in ranges.iter().zip(&got) {
            assert_eq!(g, &me.read(r.0, r.1), "{r:?}");
        }
        assert!(got[4].is_none() && got[7].is_none() && got[8].is_none());
        assert_eq!(got[9].as_deref(), Some(&block[4000..4300]));
        // More spans than one call takes.
        let many: Vec<(u64, usize)> = (0..3000).map(|i| (a + (i % 3) * 4096, 8)).collect();
        let page_apart: Vec<Vec<u8>> = (0..3000)
            .map(|i| block[(i % 3) * 4096..][..8].to_vec())
            .collect();
        let got: Vec<Vec<u8>> = me
            .read_many(&many)
            .into_iter()
            .map(Option::unwrap)
            .collect();
        assert_eq!(got, page_apart);
    }
}
