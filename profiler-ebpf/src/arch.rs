//! The saved user registers, per architecture (`--cfg bpf_target_arch`, chosen by the build).

/// The user registers a record carries.
#[derive(Clone, Copy)]
pub struct UserRegs {
    pub ip: u64,
    pub sp: u64,
    /// The frame pointer: x86_64's `rbp`, arm64's `x29`.
    pub bp: u64,
    /// arm64's link register, `x30` (0 on x86_64).
    pub lr: u64,
}

/// What differs between the architectures the object is built for (`--cfg bpf_target_arch`,
/// chosen by the build): the layout of the saved user registers.
#[cfg(not(bpf_target_arch = "aarch64"))]
mod imp {
    pub use aya_ebpf::bindings::pt_regs as Regs;

    use super::UserRegs;

    /// The registers, when they were saved in user mode (the code segment's privilege level).
    #[inline(always)]
    pub fn user(r: &Regs) -> Option<UserRegs> {
        (r.cs & 3 == 3).then_some(UserRegs {
            ip: r.rip,
            sp: r.rsp,
            bp: r.rbp,
            lr: 0,
        })
    }

    /// Reads the user registers saved at `addr` (a `struct pt_regs`): `Err` when the read
    /// fails, `Ok(None)` when they were not saved in user mode.
    #[inline(always)]
    pub fn read_user(addr: u64) -> Result<Option<UserRegs>, ()> {
        crate::mem::read_kernel::<Regs>(addr)
            .map(|r| user(&r))
            .ok_or(())
    }

    pub const IP_OFFSET: usize = core::mem::offset_of!(Regs, rip);
    pub const SP_OFFSET: usize = core::mem::offset_of!(Regs, rsp);
}

/// arm64: `struct pt_regs` begins with `struct user_pt_regs` (x0-x30, sp, pc, pstate), which is
/// also what a perf event's context holds.
#[cfg(bpf_target_arch = "aarch64")]
mod imp {
    pub use aya_ebpf::bindings::user_pt_regs as Regs;

    use super::UserRegs;

    /// `PSR_MODE_MASK` and the 32-bit bit: EL0 in AArch64 state is 0 under both.
    const MODE_MASK: u64 = 0x1f;

    #[inline(always)]
    pub fn user(r: &Regs) -> Option<UserRegs> {
        (r.pstate & MODE_MASK == 0).then_some(UserRegs {
            ip: r.pc,
            sp: r.sp,
            bp: r.regs[29],
            lr: r.regs[30],
        })
    }

    /// Reads x29, x30, sp, pc and pstate (contiguous) from the `pt_regs` at `addr`: 40 bytes
    /// of BPF stack, not the whole 272.
    #[inline(always)]
    pub fn read_user(addr: u64) -> Result<Option<UserRegs>, ()> {
        let tail = crate::mem::read_kernel::<[u64; 5]>(addr + X29_OFFSET as u64).ok_or(())?;
        Ok((tail[4] & MODE_MASK == 0).then_some(UserRegs {
            ip: tail[3],
            sp: tail[2],
            bp: tail[0],
            lr: tail[1],
        }))
    }

    const X29_OFFSET: usize = core::mem::offset_of!(Regs, regs) + 29 * 8;
    pub const IP_OFFSET: usize = core::mem::offset_of!(Regs, pc);
    pub const SP_OFFSET: usize = core::mem::offset_of!(Regs, sp);
}

pub(crate) use imp::{read_user, user, Regs, IP_OFFSET, SP_OFFSET};
