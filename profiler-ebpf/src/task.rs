//! The current task: whether it is profiled, its ids and kind, and where its user registers are.

use aya_ebpf::helpers::{
    bpf_probe_read_kernel,
    generated::{bpf_get_current_task, bpf_get_current_task_btf, bpf_task_pt_regs},
};
use profiler_common::*;

use crate::{maps::TARGETS, mem::read_kernel};

#[inline(always)]
pub(crate) fn targeted(cfg: &Config, pid: u32) -> bool {
    // SAFETY: plain lookup; the value is only tested for presence.
    pid != cfg.self_tgid && (cfg.all != 0 || unsafe { TARGETS.get(pid) }.is_some())
}

/// (tgid, pid) of a task, from the `task_struct` offsets userspace found in the kernel's BTF.
#[inline(always)]
pub(crate) fn task_ids(cfg: &Config, task: u64) -> Option<(u32, u32)> {
    if task == 0 {
        return None;
    }
    // SAFETY: kernel reads through the checked helper.
    let tgid =
        unsafe { bpf_probe_read_kernel((task + cfg.task_tgid_off as u64) as *const u32) }.ok()?;
    // SAFETY: as above.
    let pid =
        unsafe { bpf_probe_read_kernel((task + cfg.task_pid_off as u64) as *const u32) }.ok()?;
    Some((tgid, pid))
}

#[inline(always)]
pub(crate) fn is_kthread(cfg: &Config, task: u64) -> bool {
    // SAFETY: kernel read through the checked helper.
    match unsafe { bpf_probe_read_kernel((task + cfg.task_flags_off as u64) as *const u32) } {
        Ok(f) => f & PF_KTHREAD != 0,
        Err(_) => true,
    }
}

/// Address of the current task's saved user registers (`task_pt_regs`). Without
/// `bpf_task_pt_regs` it is computed as `task_pt_regs()` does on x86_64 and arm64: the
/// `pt_regs` sit at the very top of the task's kernel stack (`TOP_OF_KERNEL_STACK_PADDING` is 0
/// on x86_64). The caller checks the mode the registers were saved in, so a wrong guess gives no
/// user stack, never a wrong one.
#[inline(always)]
pub(crate) fn user_regs<const MODERN: bool>(cfg: &Config) -> u64 {
    if MODERN {
        // SAFETY: BTF task pointer of the current task; bpf_task_pt_regs returns its user regs.
        return unsafe { bpf_task_pt_regs(bpf_get_current_task_btf()) } as u64;
    }
    // SAFETY: helper without preconditions.
    let task = unsafe { bpf_get_current_task() };
    match read_kernel::<u64>(task + cfg.task_stack_off as u64) {
        Some(stack) if stack != 0 => stack + cfg.thread_size as u64 - cfg.pt_regs_size as u64,
        _ => 0,
    }
}
