//! DWARF CFI unwinding of a copied user stack with framehop.

use framehop::x86_64::UnwindRegsX86_64;
use framehop::{FrameAddress, Unwinder};

use super::Process;
use crate::capture::record::RawSample;

/// Native frames deeper than this are cut (and the stack marked truncated).
pub const MAX_NATIVE_FRAMES: usize = 1024;

/// A user-space frame address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UserFrame {
    pub addr: u64,
    /// A return address (symbolize `addr - 1`), not the interrupted instruction.
    pub is_return: bool,
}

impl UserFrame {
    pub fn lookup_addr(&self) -> u64 {
        if self.is_return {
            self.addr.saturating_sub(1)
        } else {
            self.addr
        }
    }
}

pub struct Unwound {
    /// Innermost first.
    pub frames: Vec<UserFrame>,
    /// The unwind stopped before reaching the root (stack copy too short, no unwind info, ...).
    pub truncated: bool,
}

pub fn unwind_user(process: &mut Process, s: &RawSample) -> Unwound {
    let mut frames = Vec::new();
    if s.ip == 0 {
        return Unwound {
            frames,
            truncated: false,
        };
    }
    let regs = UnwindRegsX86_64::new(s.ip, s.sp, s.bp);
    let mut read = |addr: u64| s.read_stack(addr).ok_or(());
    let mut it = process
        .unwinder
        .iter_frames(s.ip, regs, &mut process.cache, &mut read);
    let truncated = loop {
        match it.next() {
            Ok(Some(FrameAddress::InstructionPointer(a))) => frames.push(UserFrame {
                addr: a,
                is_return: false,
            }),
            Ok(Some(FrameAddress::ReturnAddress(a))) => frames.push(UserFrame {
                addr: a.get(),
                is_return: true,
            }),
            Ok(None) => break false,
            Err(_) => break true,
        }
        if frames.len() >= MAX_NATIVE_FRAMES {
            break true;
        }
    };
    Unwound { frames, truncated }
}
