//! The tachyon-bpf sampling program.
//!
//! A `perf_event` program on the software `cpu-clock` event of every CPU. For the interrupted
//! thread it assembles one record in a per-CPU scratch buffer and sends it through a ring buffer:
//! pid/tid/cpu/time/comm, the kernel callchain, the user registers (from the task when the sample
//! hit kernel mode), for Python threads the interpreter frame chain and the GIL/GC words, and a
//! copy of the user stack for DWARF unwinding in userspace. Everything is read while the sampled
//! thread is stopped, so all parts of a record describe the same instant.
//!
//! Needs kernel 5.15+ (`bpf_task_pt_regs`, ring buffers, bounded loops).
#![no_std]
#![no_main]

use core::ffi::c_void;

use aya_ebpf::{
    bindings::pt_regs,
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_get_smp_processor_id,
        bpf_ktime_get_ns, bpf_probe_read_kernel,
        generated::{
            bpf_get_current_task_btf, bpf_get_stack, bpf_loop, bpf_probe_read_user, bpf_task_pt_regs,
        },
    },
    macros::{map, perf_event},
    maps::{Array, HashMap, PerCpuArray, RingBuf},
    programs::PerfEventContext,
    EbpfContext,
};
use profiler_common::*;

#[map]
static CONFIG: Array<Config> = Array::with_max_entries(1, 0);
/// Processes to sample when `Config::all` is zero.
#[map]
static TARGETS: HashMap<u32, u32> = HashMap::with_max_entries(8192, 0);
/// Python processes: what the frame walk needs.
#[map]
static PY_PROCS: HashMap<u32, PyProcConfig> = HashMap::with_max_entries(8192, 0);
/// `thread_key(pid, tid)` -> thread state address.
#[map]
static PY_THREADS: HashMap<u64, u64> = HashMap::with_max_entries(65536, 0);
#[map]
static STATS: PerCpuArray<u64> = PerCpuArray::with_max_entries(STAT_COUNT, 0);
/// One record buffer per CPU, indexed by CPU id: per-CPU maps cap values at 32 KiB, less than a
/// record. A perf_event program never nests on one CPU, so a CPU's slot has one user at a time.
/// Userspace sizes it to the number of possible CPUs.
#[map]
static SCRATCH: Array<[u8; SCRATCH_SIZE]> = Array::with_max_entries(1, 0);
#[map]
static FRAME: PerCpuArray<[u8; FRAME_BUF]> = PerCpuArray::with_max_entries(1, 0);
/// Sample records. Userspace sets the size at load time.
#[map]
static SAMPLES: RingBuf = RingBuf::with_byte_size(1 << 24, 0);

#[perf_event]
pub fn tachyon_sample(ctx: PerfEventContext) -> u32 {
    sample(&ctx);
    0
}

#[inline(always)]
fn count(stat: u32) {
    if let Some(p) = STATS.get_ptr_mut(stat) {
        // SAFETY: a per-CPU slot that only this CPU's program instance touches.
        unsafe { *p += 1 };
    }
}

#[inline(always)]
fn read_user<T>(addr: u64) -> Option<T> {
    // SAFETY: bpf_probe_read_user checks the address; a fault is an error, not a crash.
    unsafe { aya_ebpf::helpers::bpf_probe_read_user(addr as *const T) }.ok()
}

#[inline(always)]
fn frame_u64(buf: &[u8; FRAME_BUF], off: u32) -> u64 {
    let o = (off as usize) & (FRAME_BUF - 8);
    // SAFETY: o + 8 <= FRAME_BUF by the mask.
    unsafe { core::ptr::read_unaligned(buf.as_ptr().add(o) as *const u64) }
}

#[inline(always)]
fn frame_i32(buf: &[u8; FRAME_BUF], off: u32) -> i32 {
    let o = (off as usize) & (FRAME_BUF - 4);
    // SAFETY: o + 4 <= FRAME_BUF by the mask.
    unsafe { core::ptr::read_unaligned(buf.as_ptr().add(o) as *const i32) }
}

fn sample(ctx: &PerfEventContext) -> Option<()> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let pid = (pid_tgid >> 32) as u32;
    let tid = pid_tgid as u32;
    if tid == 0 {
        return None; // the idle task
    }
    let cfg = CONFIG.get(0)?;
    if pid == cfg.self_tgid {
        return None;
    }
    // SAFETY: plain lookup; the value is only tested for presence.
    if cfg.all == 0 && unsafe { TARGETS.get(&pid) }.is_none() {
        return None;
    }
    // SAFETY: helper without preconditions.
    let cpu = unsafe { bpf_get_smp_processor_id() };
    let Some(scratch) = SCRATCH.get_ptr_mut(cpu) else {
        count(STAT_SCRATCH_FAIL);
        return None;
    };
    let base = scratch as *mut u8;
    // SAFETY: the scratch buffer is SCRATCH_SIZE bytes, larger than the header, 8-aligned (map
    // values are), and only this CPU's program instance uses it.
    let hdr = unsafe { &mut *(base as *mut SampleHeader) };
    let mut flags = 0u32;
    hdr.kind = RECORD_SAMPLE;
    hdr.pid = pid;
    hdr.tid = tid;
    // SAFETY: helper without preconditions.
    hdr.time_ns = unsafe { bpf_ktime_get_ns() };
    hdr.cpu = cpu;
    hdr.comm = bpf_get_current_comm().unwrap_or([0; 16]);
    hdr.kstack_len = 0;
    hdr.py_len = 0;
    hdr.ustack_len = 0;
    hdr.py_tstate = 0;
    hdr.py_gil_holder = 0;
    hdr.py_gil_locked = 0;
    hdr.py_status = 0;
    hdr.py_gc_collecting = 0;
    hdr.ip = 0;
    hdr.sp = 0;
    hdr.bp = 0;

    // SAFETY: the context of a perf_event program is a bpf_perf_event_data.
    let regs: &pt_regs = unsafe { &(*ctx.ctx).regs };
    if regs.cs & 3 == 3 {
        hdr.ip = regs.rip;
        hdr.sp = regs.rsp;
        hdr.bp = regs.rbp;
    } else {
        flags |= SAMPLE_KERNEL_MODE;
        // SAFETY: BTF task pointer of the current task; bpf_task_pt_regs returns its user regs.
        let uregs = unsafe { bpf_task_pt_regs(bpf_get_current_task_btf()) } as *const pt_regs;
        // SAFETY: a kernel pointer read through the checked helper.
        match unsafe { bpf_probe_read_kernel(uregs) } {
            Ok(u) if u.cs & 3 == 3 => {
                hdr.ip = u.rip;
                hdr.sp = u.rsp;
                hdr.bp = u.rbp;
            }
            _ => flags |= SAMPLE_NO_USER,
        }
        // SAFETY: the buffer is the header's kstack array of MAX_KSTACK u64.
        let n = unsafe {
            bpf_get_stack(
                ctx.as_ptr(),
                hdr.kstack.as_mut_ptr() as *mut c_void,
                (MAX_KSTACK * 8) as u32,
                0,
            )
        };
        if n > 0 {
            hdr.kstack_len = (n / 8) as u32;
        } else {
            count(STAT_KSTACK_FAIL);
        }
    }

    // Python: the frame chain and the GIL/GC words of the same instant.
    let mut py_len: usize = 0;
    // SAFETY: the value is copied out at once.
    if let Some(pc) = unsafe { PY_PROCS.get(&pid) } {
        let pc = *pc;
        // SAFETY: as above.
        match unsafe { PY_THREADS.get(&thread_key(pid, tid)) } {
            None => {
                flags |= SAMPLE_PY_MISS;
                count(STAT_PY_MISS);
            }
            Some(&tstate) => {
                flags |= SAMPLE_PY_THREAD;
                hdr.py_tstate = tstate;
                let (n, f) = walk_python(cpu, &pc, tstate);
                py_len = n;
                flags |= f;
            }
        }
        if pc.gil_locked != 0 {
            hdr.py_gil_locked = read_user::<u32>(pc.gil_locked).unwrap_or(0);
            hdr.py_gil_holder = read_user::<u64>(pc.gil_last_holder).unwrap_or(0);
        }
        if pc.gc_collecting != 0 {
            hdr.py_gc_collecting = read_user::<u32>(pc.gc_collecting).unwrap_or(0);
        }
        if pc.tstate_status != NO_OFFSET && hdr.py_tstate != 0 {
            hdr.py_status = read_user::<u32>(hdr.py_tstate + pc.tstate_status as u64).unwrap_or(0);
        }
    }
    if py_len > MAX_PY_FRAMES {
        py_len = MAX_PY_FRAMES;
    }
    hdr.py_len = py_len as u32;

    // The user stack: first up to the next page boundary, then whole pages, so the copy ends
    // exactly where the stack mapping ends.
    let mut copied: usize = 0;
    if flags & SAMPLE_NO_USER == 0 && hdr.sp != 0 {
        let want = cfg.ustack_size as usize;
        let sp = hdr.sp;
        let area = SampleHeader::SIZE + py_len * core::mem::size_of::<PyFrame>();
        for k in 0..(MAX_USTACK / USTACK_CHUNK) {
            let chunk = if k == 0 {
                USTACK_CHUNK - (sp as usize & (USTACK_CHUNK - 1))
            } else {
                USTACK_CHUNK
            };
            if copied + chunk > want || copied > MAX_USTACK - USTACK_CHUNK || chunk > USTACK_CHUNK
            {
                break;
            }
            // SAFETY: area + copied + chunk <= SCRATCH_SIZE (bounded above); the source is a
            // user address read through the checked helper.
            let r = unsafe {
                bpf_probe_read_user(
                    base.add(area + copied) as *mut c_void,
                    chunk as u32,
                    (sp + copied as u64) as *const c_void,
                )
            };
            if r != 0 {
                flags |= SAMPLE_USTACK_SHORT;
                break;
            }
            copied += chunk;
        }
    }
    hdr.ustack_len = copied as u32;
    hdr.flags = flags;

    let mut total = SampleHeader::SIZE + py_len * core::mem::size_of::<PyFrame>() + copied;
    if total > SCRATCH_SIZE {
        total = SCRATCH_SIZE;
    }
    // SAFETY: total <= SCRATCH_SIZE, the size of the buffer behind base.
    let record = unsafe { core::slice::from_raw_parts(base as *const u8, total) };
    if SAMPLES.output::<[u8]>(record, 0).is_ok() {
        count(STAT_SAMPLES);
    } else {
        count(STAT_LOST);
    }
    Some(())
}

/// State of one frame walk, shared with the `bpf_loop` callback. Scalars only: the callback
/// looks the buffers up itself.
#[repr(C)]
struct Walk {
    pc: PyProcConfig,
    frame: u64,
    n: u64,
    cpu: u32,
    flags: u32,
}

/// Walks the interpreter frame chain of `tstate`, writing frames after the header. Returns the
/// number of frames and `SAMPLE_PY_*` flags.
#[inline(always)]
fn walk_python(cpu: u32, pc: &PyProcConfig, tstate: u64) -> (usize, u32) {
    let Some(mut frame) = read_user::<u64>(tstate + pc.tstate_frame as u64) else {
        count(STAT_PY_READ_FAIL);
        return (0, SAMPLE_PY_READ_FAILED);
    };
    if pc.cframe_frame != NO_OFFSET && frame != 0 {
        match read_user::<u64>(frame + pc.cframe_frame as u64) {
            Some(f) => frame = f,
            None => {
                count(STAT_PY_READ_FAIL);
                return (0, SAMPLE_PY_READ_FAILED);
            }
        }
    }
    let mut w = Walk {
        pc: *pc,
        frame,
        n: 0,
        cpu,
        flags: 0,
    };
    // SAFETY: the callback has the signature bpf_loop expects; its context is `w`, alive for
    // the whole call.
    unsafe {
        bpf_loop(
            MAX_PY_FRAMES as u32,
            walk_step as *mut c_void,
            &mut w as *mut Walk as *mut c_void,
            0,
        );
    }
    let mut flags = w.flags;
    if w.frame != 0 && w.n as usize >= MAX_PY_FRAMES {
        flags |= SAMPLE_PY_TRUNCATED;
        count(STAT_PY_TRUNCATED);
    }
    if flags & SAMPLE_PY_READ_FAILED != 0 {
        count(STAT_PY_READ_FAIL);
    }
    (w.n as usize, flags)
}

/// One step of the frame walk: reads the frame, records it, moves to the previous one.
/// Returns 1 to stop.
extern "C" fn walk_step(index: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: bpf_loop passes the `Walk` given to it.
    let w = unsafe { &mut *(ctx as *mut Walk) };
    let i = index as usize;
    if w.frame == 0 || i >= MAX_PY_FRAMES {
        return 1;
    }
    let Some(fbuf) = FRAME.get_ptr_mut(0) else {
        return 1;
    };
    // SAFETY: per-CPU buffer of FRAME_BUF bytes used only by this walk.
    let fbuf = unsafe { &mut *fbuf };
    let Some(scratch) = SCRATCH.get_ptr_mut(w.cpu) else {
        return 1;
    };
    let mut read_size = w.pc.frame_read_size as usize;
    if read_size == 0 || read_size > FRAME_BUF {
        read_size = FRAME_BUF;
    }
    // SAFETY: read_size <= FRAME_BUF; the source is a user address.
    let r = unsafe {
        bpf_probe_read_user(
            fbuf.as_mut_ptr() as *mut c_void,
            read_size as u32,
            w.frame as *const c_void,
        )
    };
    if r != 0 {
        w.flags |= SAMPLE_PY_READ_FAILED;
        return 1;
    }
    let pc = &w.pc;
    let code = frame_u64(fbuf, pc.frame_code) & pc.code_mask;
    let instr = if pc.layout == PY_LAYOUT_FRAMEOBJECT {
        frame_i32(fbuf, pc.frame_instr)
    } else {
        let ip = frame_u64(fbuf, pc.frame_instr);
        (ip.wrapping_sub(code).wrapping_sub(pc.code_adaptive as u64) as i64 / 2) as i32
    };
    let owner = if pc.frame_owner != NO_OFFSET {
        fbuf[(pc.frame_owner as usize) & (FRAME_BUF - 1)] as u32
    } else {
        0
    };
    let frames = (scratch as *mut u8).wrapping_add(SampleHeader::SIZE) as *mut PyFrame;
    // SAFETY: i < MAX_PY_FRAMES and the scratch buffer holds MAX_PY_FRAMES frames after the
    // header.
    unsafe {
        *frames.add(i) = PyFrame {
            code,
            instr,
            flags: owner,
        };
    }
    w.n = i as u64 + 1;
    w.frame = frame_u64(fbuf, pc.frame_previous);
    0
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // SAFETY: the program has no reachable panics; BPF cannot unwind.
    unsafe { core::hint::unreachable_unchecked() }
}

#[link_section = "license"]
#[used]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
