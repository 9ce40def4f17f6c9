//! The tachyon-bpf sampling program.
//!
//! A `perf_event` program on the software `cpu-clock` event of every CPU. For the interrupted
//! thread it assembles one record in a per-CPU scratch buffer and sends it through a ring buffer:
//! pid/tid/cpu/time/comm, the kernel callchain, the user registers (from the task when the sample
//! hit kernel mode), for Python threads the interpreter frame chain and the GIL/GC words, and a
//! copy of the user stack for DWARF unwinding in userspace. Everything is read while the sampled
//! thread is stopped, so all parts of a record describe the same instant.
//!
//! A `sched_switch` BTF tracepoint program accounts each profiled thread's on- and off-CPU time
//! in a map and sends it at sampling granularity, never per switch (see `ThreadSched`). It runs
//! for the thread leaving the CPU only: the thread's CPU time since its previous switch-out says
//! when it came back. A thread that leaves to block is decided on when it comes back, in its own
//! context (its stacks and Python frames are still those of the moment it stopped running, and
//! the interval's length is known): on the `sched_exit_tp` tracepoint (6.16+), else in a kprobe
//! on `finish_task_switch`. An interval of a sampling period or more is always charged; shorter
//! ones are sampled by their time (see `sched::block_attr`). A point the thread blocked at
//! recently is charged to that point's capture; a new one is captured, as a sample is.
//! `sched_process_fork`/`exec`/`exit` programs report lifetimes and follow children.
//!
//! One object for every kernel from 5.10 (ring buffers 5.8, BTF tracepoints 5.5, bounded loops
//! 5.3). Where kernels differ, the object holds two variants of a program, built from the same
//! code by a const parameter, and userspace loads the one the running kernel's BTF says fits:
//! - `tachyon_sample` walks Python frames and copies the user stack with `bpf_loop` (5.17+), and
//!   reads the user registers of a task in kernel mode with `bpf_task_pt_regs` (5.15+);
//!   `tachyon_sample_compat` walks and copies with bounded loops and finds the registers at the
//!   top of the task's kernel stack.
//! - `tachyon_switch` takes the task state from `sched_switch`'s `prev_state` argument (5.18+);
//!   `tachyon_switch_compat` reads it from the task, as those kernels' own tracepoint did.
//! - `tachyon_switch_in_compat`'s capture is the compat sampler's, and it reads the user
//!   registers from the kernel stack where `tachyon_switch_in` reads them through
//!   `bpf_task_pt_regs`'s typed pointer.
//!
//! So there are two sets: the modern one where the kernel has all three (5.18+), the compat one
//! everywhere else. Both produce the same records.
//! - `tachyon_exit` reads no argument that differs between kernels: `group_dead` (an argument
//!   only since 6.16) is derived from `signal->live`, which `do_exit` has already decremented.
//!
//! Where things live:
//! - `maps`: the maps, the per-CPU walk and copy state, statistics and ring wake-ups;
//! - `arch`, `task`, `mem`: registers per architecture, the current task, checked reads;
//! - `sample`: the sample record (`capture`), used by the sampler and by `sched`'s captures;
//! - `sched`: `sched_switch` accounting and the capture of blocking threads;
//! - `lifecycle`: fork, exec and exit;
//! - `ustack`: the user stack copy;
//! - `python`: thread states, the frame walk and the code-head copies.

#![no_std]
#![no_main]

use aya_ebpf::{
    macros::{btf_tracepoint, kprobe, perf_event},
    programs::{BtfTracePointContext, PerfEventContext, ProbeContext},
    EbpfContext,
};

mod arch;
mod lifecycle;
mod log;
mod maps;
mod mem;
mod python;
mod sample;
mod sched;
mod task;
mod ustack;

use sched::switch;

/// The sampler for kernels with `bpf_loop` and `bpf_task_pt_regs` (5.17+).
#[perf_event]
pub fn tachyon_sample(ctx: PerfEventContext) -> u32 {
    sample::sample::<true>(ctx)
}

/// The sampler for older kernels (5.10+): a bounded frame loop, registers from the kernel stack.
#[perf_event]
pub fn tachyon_sample_compat(ctx: PerfEventContext) -> u32 {
    sample::sample::<false>(ctx)
}

/// `sched_switch(preempt, prev, next, prev_state)` (5.18+): runs on the CPU switching, with `prev`
/// current. The modern set. Accounting only: no capture (see `tachyon_switch_in`).
#[btf_tracepoint(function = "sched_switch")]
pub fn tachyon_switch(ctx: BtfTracePointContext) -> u32 {
    switch::<true>(&ctx);
    0
}

/// `sched_switch(preempt, prev, next)` (before 5.18): the state is read from `prev`.
#[btf_tracepoint(function = "sched_switch")]
pub fn tachyon_switch_compat(ctx: BtfTracePointContext) -> u32 {
    switch::<false>(&ctx);
    0
}

/// `sched_exit_tp(is_switch, ...)` (6.16+): the end of `__schedule`, in the thread coming back
/// on the CPU (preemption off, interrupts on): the capture of a thread that blocked, decided now
/// that its interval's length is known (`OFFCPU_STACKS`). The modern set.
#[btf_tracepoint(function = "sched_exit_tp")]
pub fn tachyon_switch_in(ctx: BtfTracePointContext) -> u32 {
    sched::switch_in::<true>(ctx.as_ptr());
    0
}

/// `tachyon_switch_in` where the kernel has no `sched_exit_tp`: a kprobe on `finish_task_switch`
/// (static, often a `.isra` clone: no fentry), in the thread coming back, interrupts off.
#[kprobe]
pub fn tachyon_switch_in_kprobe(ctx: ProbeContext) -> u32 {
    sched::switch_in::<true>(ctx.as_ptr());
    0
}

/// `tachyon_switch_in_kprobe` for older kernels: the compat sampler's capture.
#[kprobe]
pub fn tachyon_switch_in_compat(ctx: ProbeContext) -> u32 {
    sched::switch_in::<false>(ctx.as_ptr());
    0
}

/// `sched_process_fork(parent, child)`, in the parent.
#[btf_tracepoint(function = "sched_process_fork")]
pub fn tachyon_fork(ctx: BtfTracePointContext) -> u32 {
    lifecycle::fork(&ctx);
    0
}

/// `sched_process_exec(p, old_pid, bprm)`, in the process after the new program is loaded.
#[btf_tracepoint(function = "sched_process_exec")]
pub fn tachyon_exec(_ctx: BtfTracePointContext) -> u32 {
    lifecycle::exec()
}

/// `sched_process_exit(p)` (`p, group_dead` since 6.16), in the exiting thread.
#[btf_tracepoint(function = "sched_process_exit")]
pub fn tachyon_exit(_ctx: BtfTracePointContext) -> u32 {
    lifecycle::exit()
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
