//! Decoding of the BPF program's sample records: the one place bytes become `RawSample`s.
//!
//! A record is `SampleHeader | PyFrame * py_len | CodeSnap * py_snaps | user stack bytes *
//! ustack_len` (see `profiler-common`). Lengths come from the kernel side and are checked against the record size.

use std::borrow::Cow;

use profiler_common::{
    CodeSnap, EventRecord, ExitSchedRecord, PyFrame, SampleHeader, SchedRecord, MAX_KSTACK,
    MAX_PY_FRAMES, MAX_USTACK, PY_CODE_SNAPS, RECORD_EXEC, RECORD_EXIT, RECORD_EXIT_SCHED,
    RECORD_FORK, RECORD_SAMPLE, RECORD_SCHED, RECORD_SWITCH_OUT,
};

/// One ring-buffer record.
#[derive(Clone, Debug)]
pub enum Record<'a> {
    Sample(RawSample<'a>),
    /// A thread's scheduler accounting over a window (see `profiler_common::SchedRecord`).
    Sched(SchedRecord),
    /// What the BPF side held of a thread as it exited (see `profiler_common::ExitSchedRecord`).
    ExitSched(ExitSchedRecord),
    Event(Event),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    Fork { child_pid: u32, child_tid: u32 },
    Exec,
    Exit { group_dead: bool },
}

/// A lifetime event.
#[derive(Clone, Debug)]
pub struct Event {
    pub kind: EventKind,
    pub pid: u32,
    pub tid: u32,
    pub time_ns: u64,
    pub comm: String,
}

impl<'a> Record<'a> {
    /// Decodes one ring-buffer record.
    pub fn parse(bytes: &'a [u8]) -> Result<Record<'a>, RecordError> {
        let kind = bytes
            .get(0..4)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
            .ok_or(RecordError::Short(bytes.len()))?;
        if kind == RECORD_SAMPLE || kind == RECORD_SWITCH_OUT {
            return RawSample::parse(bytes).map(Record::Sample);
        }
        if kind == RECORD_SCHED {
            // SAFETY: SchedRecord is plain old data, valid for any bytes.
            return unsafe { read_record(bytes) }.map(Record::Sched);
        }
        if kind == RECORD_EXIT_SCHED {
            // SAFETY: ExitSchedRecord is plain old data, valid for any bytes.
            return unsafe { read_record(bytes) }.map(Record::ExitSched);
        }
        // SAFETY: EventRecord is plain old data, valid for any bytes.
        let e: EventRecord = unsafe { read_record(bytes) }?;
        let kind = match kind {
            RECORD_FORK => EventKind::Fork {
                child_pid: e.arg0 as u32,
                child_tid: e.arg1 as u32,
            },
            RECORD_EXEC => EventKind::Exec,
            RECORD_EXIT => EventKind::Exit {
                group_dead: e.arg0 != 0,
            },
            k => return Err(RecordError::Kind(k)),
        };
        Ok(Record::Event(Event {
            kind,
            pid: e.pid,
            tid: e.tid,
            time_ns: e.time_ns,
            comm: comm_string(&e.comm),
        }))
    }
}

/// A fixed-size record read from the start of `bytes`, which must hold it whole.
///
/// # Safety
/// `T` is plain old data (`repr(C)` integers and arrays): every bit pattern is a valid `T`.
unsafe fn read_record<T: Copy>(bytes: &[u8]) -> Result<T, RecordError> {
    if bytes.len() < std::mem::size_of::<T>() {
        return Err(RecordError::Short(bytes.len()));
    }
    // SAFETY: the length was checked; the caller vouches that any bytes are a valid `T`.
    Ok(unsafe { std::ptr::read_unaligned(bytes.as_ptr() as *const T) })
}

/// One sample as the BPF program captured it. Its user stack is borrowed from the record
/// (the ring buffer's memory, valid while the record is handled): copying it, up to 64 KiB a
/// sample, was a third of user space's instructions per sample.
#[derive(Clone, Debug)]
pub struct RawSample<'a> {
    /// Taken as the thread left the CPU (`sched_switch`), not by the sampling timer.
    pub off_cpu: bool,
    pub flags: u32,
    pub pid: u32,
    pub tid: u32,
    pub time_ns: u64,
    pub comm: String,
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
    /// aarch64's link register (0 on x86_64).
    pub lr: u64,
    pub kstack: Vec<u64>,
    pub py_frames: Vec<PyFrame>,
    pub py_tstate: u64,
    pub py_gil_holder: u64,
    pub py_gil_locked: u32,
    pub py_gc_collecting: u32,
    /// The asyncio task the thread's event loop ran at the sampled instant, or 0.
    pub py_task: u64,
    /// The heads of some Python frames' code objects at the sampled instant, with the starts
    /// of their name and file strings (`CodeSnap`; `PyFrame::flags` says which frame each
    /// belongs to).
    pub code_snaps: Vec<CodeSnap>,
    /// The user stack from `sp` upwards.
    pub stack: Cow<'a, [u8]>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RecordError {
    #[error("record of {0} bytes is shorter than a sample header")]
    Short(usize),
    #[error("unknown record kind {0}")]
    Kind(u32),
    #[error("record lengths do not add up (py {py}, stack {stack}, record {len})")]
    Lengths { py: u32, stack: u32, len: usize },
}

fn comm_string(comm: &[u8; 16]) -> String {
    let end = comm.iter().position(|&b| b == 0).unwrap_or(comm.len());
    String::from_utf8_lossy(&comm[..end]).into_owned()
}

impl<'a> RawSample<'a> {
    /// Decodes one ring-buffer record.
    pub fn parse(bytes: &'a [u8]) -> Result<RawSample<'a>, RecordError> {
        if bytes.len() < SampleHeader::SIZE {
            return Err(RecordError::Short(bytes.len()));
        }
        // SAFETY: the length was checked; SampleHeader is plain old data valid for any bytes,
        // and read_unaligned copes with the ring buffer's 8-byte alignment or worse.
        let h: SampleHeader =
            unsafe { std::ptr::read_unaligned(bytes.as_ptr() as *const SampleHeader) };
        if h.kind != RECORD_SAMPLE && h.kind != RECORD_SWITCH_OUT {
            return Err(RecordError::Kind(h.kind));
        }
        let py_bytes = h.py_len as usize * std::mem::size_of::<PyFrame>();
        let snap_bytes = h.py_snaps as usize * CodeSnap::SIZE;
        let stack_at = SampleHeader::SIZE + py_bytes + snap_bytes;
        let need = stack_at + h.ustack_len as usize;
        if h.py_len as usize > MAX_PY_FRAMES
            || h.py_snaps as usize > PY_CODE_SNAPS
            || h.ustack_len as usize > MAX_USTACK
            || need > bytes.len()
        {
            return Err(RecordError::Lengths {
                py: h.py_len,
                stack: h.ustack_len,
                len: bytes.len(),
            });
        }
        let py_area = &bytes[SampleHeader::SIZE..SampleHeader::SIZE + py_bytes];
        let py_frames = py_area
            .chunks_exact(std::mem::size_of::<PyFrame>())
            .map(|c| PyFrame {
                code: u64::from_le_bytes(c[0..8].try_into().unwrap()),
                instr: i32::from_le_bytes(c[8..12].try_into().unwrap()),
                flags: u32::from_le_bytes(c[12..16].try_into().unwrap()),
            })
            .collect();
        let klen = (h.kstack_len as usize).min(MAX_KSTACK);
        Ok(RawSample {
            off_cpu: h.kind == RECORD_SWITCH_OUT,
            flags: h.flags,
            pid: h.pid,
            tid: h.tid,
            time_ns: h.time_ns,
            comm: comm_string(&h.comm),
            ip: h.ip,
            sp: h.sp,
            bp: h.bp,
            lr: h.lr,
            kstack: h.kstack[..klen]
                .iter()
                .copied()
                .filter(|&a| a != 0)
                .collect(),
            py_frames,
            py_tstate: h.py_tstate,
            py_gil_holder: h.py_gil_holder,
            py_gil_locked: h.py_gil_locked,
            py_gc_collecting: h.py_gc_collecting,
            py_task: h.py_task,
            code_snaps: bytes[SampleHeader::SIZE + py_bytes..stack_at]
                .chunks_exact(CodeSnap::SIZE)
                // SAFETY: each chunk is CodeSnap::SIZE bytes; CodeSnap is plain old data valid
                // for any bytes, read unaligned.
                .map(|c| unsafe { std::ptr::read_unaligned(c.as_ptr() as *const CodeSnap) })
                .collect(),
            stack: Cow::Borrowed(&bytes[stack_at..need]),
        })
    }

    /// Reads a u64 from the copied user stack, if `addr` falls inside it.
    pub fn read_stack(&self, addr: u64) -> Option<u64> {
        let off = addr.checked_sub(self.sp)? as usize;
        let b = self.stack.get(off..off.checked_add(8)?)?;
        Some(u64::from_le_bytes(b.try_into().ok()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use profiler_common::{PY_CODE_SNAP, PY_FRAME_SNAP_SHIFT, PY_NAME_SNAP};

    fn header(py_len: u32, ustack_len: u32) -> Vec<u8> {
        header_snaps(py_len, 0, ustack_len)
    }

    fn header_snaps(py_len: u32, py_snaps: u32, ustack_len: u32) -> Vec<u8> {
        let h = SampleHeader {
            kind: RECORD_SAMPLE,
            flags: 0,
            pid: 10,
            tid: 11,
            time_ns: 5,
            cpu: 1,
            kstack_len: 2,
            ustack_len,
            py_len,
            comm: *b"python3\0\0\0\0\0\0\0\0\0",
            ip: 0x1000,
            sp: 0x7000,
            bp: 0,
            lr: 0,
            py_tstate: 0,
            py_gil_holder: 0,
            py_gil_locked: 0,
            py_status: 0,
            py_gc_collecting: 0,
            py_snaps,
            sched_state: 0,
            py_task: 0,
            kstack: [0xffff_ffff_8100_0000; MAX_KSTACK],
        };
        // SAFETY: viewing a repr(C) value as bytes.
        unsafe {
            std::slice::from_raw_parts(&h as *const _ as *const u8, SampleHeader::SIZE).to_vec()
        }
    }

    #[test]
    fn parses_frames_and_stack() {
        let mut b = header(1, 16);
        b.extend_from_slice(&0xabcdu64.to_le_bytes());
        b.extend_from_slice(&7i32.to_le_bytes());
        b.extend_from_slice(&3u32.to_le_bytes());
        b.extend_from_slice(&0x1111u64.to_le_bytes());
        b.extend_from_slice(&0x2222u64.to_le_bytes());
        let s = RawSample::parse(&b).unwrap();
        assert_eq!(s.comm, "python3");
        assert_eq!(s.kstack.len(), 2);
        assert_eq!(
            s.py_frames,
            vec![PyFrame {
                code: 0xabcd,
                instr: 7,
                flags: 3
            }]
        );
        assert_eq!(s.read_stack(0x7008), Some(0x2222));
        assert_eq!(s.read_stack(0x7009), None);
        assert_eq!(s.read_stack(0x6ff8), None);
    }

    #[test]
    fn code_heads_sit_between_frames_and_stack() {
        let mut b = header_snaps(1, 2, 8);
        b.extend_from_slice(&0xabcdu64.to_le_bytes());
        b.extend_from_slice(&0i32.to_le_bytes());
        b.extend_from_slice(&(2u32 << PY_FRAME_SNAP_SHIFT).to_le_bytes());
        for k in 0..2u8 {
            let mut snap = vec![0u8; CodeSnap::SIZE];
            snap[0] = 0x10 + k;
            snap[PY_CODE_SNAP] = 0x20 + k;
            snap[PY_CODE_SNAP + PY_NAME_SNAP] = 0x30 + k;
            b.extend_from_slice(&snap);
        }
        b.extend_from_slice(&0x3333u64.to_le_bytes());
        let s = RawSample::parse(&b).unwrap();
        assert_eq!(s.code_snaps.len(), 2);
        let firsts: Vec<_> = s
            .code_snaps
            .iter()
            .map(|c| (c.head[0], c.name[0], c.file[0]))
            .collect();
        assert_eq!(firsts, vec![(0x10, 0x20, 0x30), (0x11, 0x21, 0x31)]);
        assert_eq!(s.read_stack(0x7000), Some(0x3333));
        // A record one byte short of its heads and stack, or claiming more heads than a
        // sample holds, is refused.
        assert!(RawSample::parse(&b[..b.len() - 1]).is_err());
        let mut many = header_snaps(0, PY_CODE_SNAPS as u32 + 1, 0);
        many.resize(many.len() + (PY_CODE_SNAPS + 1) * CodeSnap::SIZE, 0);
        assert!(matches!(
            RawSample::parse(&many),
            Err(RecordError::Lengths { .. })
        ));
    }

    #[test]
    fn rejects_inconsistent_lengths() {
        let b = header(3, 0);
        assert!(matches!(
            RawSample::parse(&b),
            Err(RecordError::Lengths { .. })
        ));
        assert_eq!(
            RawSample::parse(&b[..10]).unwrap_err(),
            RecordError::Short(10)
        );
        assert_eq!(Record::parse(&[1, 0]).unwrap_err(), RecordError::Short(2));
        let mut e = vec![0u8; EventRecord::SIZE];
        e[0] = 99;
        assert_eq!(Record::parse(&e).unwrap_err(), RecordError::Kind(99));
        assert_eq!(Record::parse(&e[..20]).unwrap_err(), RecordError::Short(20));
    }

    #[test]
    fn parses_events() {
        let e = EventRecord {
            kind: RECORD_FORK,
            cpu: 0,
            pid: 5,
            tid: 6,
            time_ns: 9,
            arg0: 7,
            arg1: 8,
            comm: *b"sh\0\0\0\0\0\0\0\0\0\0\0\0\0\0",
        };
        // SAFETY: viewing a repr(C) value as bytes.
        let b = unsafe {
            std::slice::from_raw_parts(&e as *const _ as *const u8, EventRecord::SIZE).to_vec()
        };
        let Record::Event(ev) = Record::parse(&b).unwrap() else {
            panic!("not an event")
        };
        assert_eq!(
            ev.kind,
            EventKind::Fork {
                child_pid: 7,
                child_tid: 8
            }
        );
        assert_eq!(
            (ev.pid, ev.tid, ev.time_ns, ev.comm.as_str()),
            (5, 6, 9, "sh")
        );
        let r = SchedRecord {
            kind: RECORD_SCHED,
            pid: 5,
            tid: 6,
            t0_ns: 100,
            t1_ns: 900,
            on_ns: 300,
            switches: 4,
            ..Default::default()
        };
        // SAFETY: viewing a repr(C) value as bytes.
        let b2 = unsafe {
            std::slice::from_raw_parts(&r as *const _ as *const u8, SchedRecord::SIZE).to_vec()
        };
        let Record::Sched(s) = Record::parse(&b2).unwrap() else {
            panic!("not a scheduler record")
        };
        assert_eq!(
            (s.pid, s.tid, s.t0_ns, s.t1_ns, s.on_ns, s.switches),
            (5, 6, 100, 900, 300, 4)
        );
        assert_eq!(
            Record::parse(&b2[..SchedRecord::SIZE - 1]).unwrap_err(),
            RecordError::Short(SchedRecord::SIZE - 1)
        );
    }
}
