//! One frame's unwind rule read straight from a file's `.eh_frame`, for the frames framehop
//! gives up on, and the check that an address follows a call instruction.
//!
//! framehop evaluates CFA expressions without memory reads, so it stops at every function
//! that realigns its stack (GCC's `CFA = *(rbp - 24)`: numpy's AVX sorts and much vectorized
//! C++). gimli reads and evaluates those rules; this module feeds it the copied stack.

use gimli::{
    BaseAddresses, CfaRule, EhFrame, EhFrameHdr, EndianSlice, Evaluation, EvaluationResult,
    LittleEndian, Location, RegisterRule, UnwindContext, UnwindSection, Value,
};

#[cfg(target_arch = "aarch64")]
use aarch64 as isa;
use isa::{FP, RA, SP};
#[cfg(not(target_arch = "aarch64"))]
use x86_64 as isa;

use crate::stack::elf::{eh_frame, ElfFile};

type Slice<'a> = EndianSlice<'a, LittleEndian>;

/// DWARF expression steps evaluated per rule: a target's file is untrusted input.
const MAX_EXPRESSION_STEPS: u32 = 64;
/// FDEs and instructions per FDE read when a file's own-rule ranges are found.
const MAX_FDES: usize = 1 << 20;
const MAX_INSTRUCTIONS: usize = 4096;

/// The registers an unwind step knows: the instruction, stack and frame pointers, and on
/// aarch64 the link register (0 where unknown: in every frame but the sampled one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Regs {
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
    pub lr: u64,
}

/// x86_64: DWARF's registers, and call instructions of 2 to 8 bytes. Both architectures'
/// modules are built (and tested) everywhere; the one of the target is used.
#[cfg_attr(target_arch = "aarch64", allow(dead_code))]
mod x86_64 {
    use gimli::X86_64;
    use iced_x86::{Decoder, DecoderOptions, Mnemonic, OpKind};

    pub const SP: gimli::Register = X86_64::RSP;
    pub const FP: gimli::Register = X86_64::RBP;
    /// The return address column.
    pub const RA: gimli::Register = X86_64::RA;

    /// The value of the return address column where no rule moved it: none (it is on the
    /// stack from the call on).
    pub fn ra_in_register(_regs: &super::Regs) -> Option<u64> {
        None
    }

    /// `ElfFile::call_before` over the bytes of a text section loaded at `text_svma`.
    pub fn call_before(text: &[u8], text_svma: u64, svma: u64) -> Option<Option<u64>> {
        let end = usize::try_from(svma.checked_sub(text_svma)?).ok()?;
        if end > text.len() {
            return None;
        }
        // x86 call instructions are 2 (`call *%rax`) to 7 bytes long (with a prefix, 8).
        (2..=8.min(end)).find_map(|len| {
            let from = svma - len as u64;
            let mut d = Decoder::with_ip(64, &text[end - len..end], from, DecoderOptions::NONE);
            let insn = d.decode();
            (!insn.is_invalid() && insn.len() == len && insn.mnemonic() == Mnemonic::Call).then(
                || (insn.op0_kind() == OpKind::NearBranch64).then(|| insn.near_branch_target()),
            )
        })
    }
}

/// aarch64: the return address is `x30` (the link register), and calls are 4-byte `bl`
/// (direct) or `blr`/`blraa`... (indirect), so the test needs no decoder crate.
#[cfg_attr(not(target_arch = "aarch64"), allow(dead_code))]
mod aarch64 {
    use gimli::AArch64;

    pub const SP: gimli::Register = AArch64::SP;
    pub const FP: gimli::Register = AArch64::X29;
    pub const RA: gimli::Register = AArch64::X30;

    /// A leaf function keeps its return address in `x30` until it saves it, if ever.
    pub fn ra_in_register(regs: &super::Regs) -> Option<u64> {
        (regs.lr != 0).then_some(regs.lr)
    }

    pub fn call_before(text: &[u8], text_svma: u64, svma: u64) -> Option<Option<u64>> {
        let end = usize::try_from(svma.checked_sub(text_svma)?).ok()?;
        if end < 4 || end > text.len() || end % 4 != 0 {
            return None;
        }
        let insn = u32::from_le_bytes(text[end - 4..end].try_into().ok()?);
        let at = svma - 4;
        if insn & 0xfc00_0000 == 0x9400_0000 {
            // BL imm26: a signed word offset from the instruction.
            let off = (((insn & 0x03ff_ffff) << 6) as i32 >> 6) as i64 * 4;
            return Some(Some(at.wrapping_add_signed(off)));
        }
        // BLR Xn; BLRAA/BLRAB Xn, Xm; BLRAAZ/BLRABZ Xn.
        let indirect = insn & 0xffff_fc1f == 0xd63f_0000
            || insn & 0xffff_f800 == 0xd73f_0800
            || insn & 0xffff_f81f == 0xd63f_081f;
        indirect.then_some(None)
    }

    #[cfg(test)]
    mod tests {
        use super::call_before;

        #[test]
        fn a_return_address_follows_a_branch_with_link() {
            let text: Vec<u8> = [
                0x9400_0040u32, // 0x1000 bl 0x1100
                0xaa0103e0,     // 0x1004 mov x0, x1
                0xd63f0020,     // 0x1008 blr x1
                0xd63f083f,     // 0x100c blraaz x1
            ]
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .collect();
            assert_eq!(call_before(&text, 0x1000, 0x1004), Some(Some(0x1100)));
            assert_eq!(call_before(&text, 0x1000, 0x1008), None);
            assert_eq!(call_before(&text, 0x1000, 0x100c), Some(None));
            assert_eq!(call_before(&text, 0x1000, 0x1010), Some(None));
            assert_eq!(call_before(&text, 0x1000, 0x1006), None);
            assert_eq!(call_before(&text, 0x1000, 0x2000), None);
        }
    }
}

/// A user return address without the pointer-authentication code arm64 may sign it with (the
/// bits above the 48-bit user address space). Nothing to strip on x86_64.
pub fn strip_pac(addr: u64) -> u64 {
    if cfg!(target_arch = "aarch64") {
        addr & 0x0000_ffff_ffff_ffff
    } else {
        addr
    }
}

/// What a file's CFI says of one frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// No FDE covers the address (or the file has no `.eh_frame`).
    NoInfo,
    /// The rule marks the outermost frame: the return address is undefined (`_start`, `clone3`).
    Root,
    /// The caller's registers: `ip` is its return address.
    Caller(Regs),
    /// An FDE covers the address, but its rule names a register this step does not know or
    /// reads outside the copied stack.
    Unknown,
}

/// The SVMA ranges of the functions whose CFA rule framehop cannot follow: a DWARF expression
/// (the CFA read from memory after a realignment) or a register other than the stack and frame
/// pointers.
/// framehop answers those with a frame-pointer guess, which gets the return address right
/// (a realigning function copies it above its frame pointer) and the caller's stack pointer
/// wrong, so every frame above it is junk: they are unwound here instead. Sorted, from one
/// pass over `.eh_frame` (a few ms for the largest library) the first time a frame of the file
/// is unwound.
pub fn own_rule_ranges(eh_bytes: &[u8], eh_svma: u64, text_svma: Option<u64>) -> Vec<(u64, u64)> {
    let eh = eh_frame(eh_bytes);
    let mut bases = BaseAddresses::default().set_eh_frame(eh_svma);
    if let Some(text) = text_svma {
        bases = bases.set_text(text);
    }
    let mut out = Vec::new();
    let mut entries = eh.entries(&bases);
    for _ in 0..MAX_FDES {
        let Ok(Some(entry)) = entries.next() else {
            break;
        };
        let gimli::CieOrFde::Fde(partial) = entry else {
            continue;
        };
        let Ok(fde) = partial.parse(EhFrame::cie_from_offset) else {
            continue;
        };
        let mut insns = fde.instructions(&eh, &bases);
        for _ in 0..MAX_INSTRUCTIONS {
            let Ok(Some(insn)) = insns.next() else {
                break;
            };
            use gimli::CallFrameInstruction as I;
            let own = match insn {
                I::DefCfaExpression { .. } => true,
                // arm64's return-address signing (pointer authentication): framehop parses
                // `.eh_frame` as generic DWARF, where this opcode is unknown, and gives up on
                // the whole function.
                I::NegateRaState => true,
                I::DefCfa { register, .. }
                | I::DefCfaSf { register, .. }
                | I::DefCfaRegister { register } => register != SP && register != FP,
                _ => false,
            };
            if own {
                let start = fde.initial_address();
                out.push((start, start.saturating_add(fde.len())));
                break;
            }
        }
    }
    out.sort_unstable();
    out
}

impl ElfFile {
    /// Whether the function at `svma` has a CFA rule framehop cannot follow
    /// (`own_rule_ranges`).
    pub fn needs_own_rule(&self, svma: u64) -> bool {
        let ranges = self
            .own_rules
            .get_or_init(|| match self.section_data(".eh_frame") {
                Some((bytes, at)) => {
                    own_rule_ranges(bytes, at, self.section_data(".text").map(|(_, t)| t))
                }
                None => Vec::new(),
            });
        let i = ranges.partition_point(|r| r.0 <= svma);
        i > 0 && svma < ranges[i - 1].1
    }

    /// Unwinds the frame at `svma` (already the lookup address: a return address minus one)
    /// with the registers `regs` valid there. `read` reads a word of the copied stack; `ctx` is
    /// gimli's working space, kept by the caller so that a step allocates nothing.
    pub fn cfi_step(
        &self,
        svma: u64,
        regs: Regs,
        read: &mut dyn FnMut(u64) -> Option<u64>,
        ctx: &mut UnwindContext<usize>,
    ) -> Step {
        let Some((eh_bytes, eh_svma)) = self.section_data(".eh_frame") else {
            return Step::NoInfo;
        };
        let eh = eh_frame(eh_bytes);
        let mut bases = BaseAddresses::default().set_eh_frame(eh_svma);
        if let Some((_, text)) = self.section_data(".text") {
            bases = bases.set_text(text);
        }
        let hdr = self.section_data(".eh_frame_hdr").and_then(|(bytes, at)| {
            bases = bases.clone().set_eh_frame_hdr(at);
            EhFrameHdr::new(bytes, LittleEndian).parse(&bases, 8).ok()
        });
        // The sorted table of `.eh_frame_hdr` when there is one; a walk of the FDEs otherwise.
        let fde = match hdr.as_ref().and_then(|h| h.table()) {
            Some(table) => table.fde_for_address(&eh, &bases, svma, EhFrame::cie_from_offset),
            None => eh.fde_for_address(&bases, svma, EhFrame::cie_from_offset),
        };
        let Ok(fde) = fde else {
            return Step::NoInfo;
        };
        let Ok(row) = fde.unwind_info_for_address(&eh, &bases, ctx, svma) else {
            return Step::Unknown;
        };
        let encoding = fde.cie().encoding();
        // arm64: at a function's first instructions (and in a leaf) the return address is
        // still in the link register.
        let in_lr = isa::ra_in_register(&regs);
        let get = |r: gimli::Register| match r {
            SP => Some(regs.sp),
            FP => Some(regs.bp),
            RA => in_lr.or(Some(regs.ip)),
            _ => None,
        };
        let eval = |expr: gimli::UnwindExpression<usize>,
                    read: &mut dyn FnMut(u64) -> Option<u64>|
         -> Option<u64> {
            let expr = expr.get(&eh).ok()?;
            evaluate(expr.0, encoding, &get, read)
        };
        let cfa = match row.cfa() {
            CfaRule::RegisterAndOffset { register, offset } => {
                get(*register).and_then(|v| v.checked_add_signed(*offset))
            }
            CfaRule::Expression(e) => eval(*e, read),
        };
        let Some(cfa) = cfa else {
            return Step::Unknown;
        };
        // A return address still in the link register: the CFA may be the stack pointer itself.
        let mut ra_in_lr = false;
        let ra = match row.register(RA) {
            Some(RegisterRule::Undefined) => return Step::Root,
            None | Some(RegisterRule::SameValue) if in_lr.is_some() => {
                ra_in_lr = true;
                in_lr
            }
            None => return Step::Root,
            Some(RegisterRule::Offset(o)) => cfa.checked_add_signed(o).and_then(&mut *read),
            Some(RegisterRule::Expression(e)) => eval(e, read).and_then(&mut *read),
            _ => None,
        };
        let bp = match row.register(FP) {
            None | Some(RegisterRule::Undefined | RegisterRule::SameValue) => Some(regs.bp),
            Some(RegisterRule::Offset(o)) => cfa.checked_add_signed(o).and_then(&mut *read),
            Some(RegisterRule::ValOffset(o)) => cfa.checked_add_signed(o),
            Some(RegisterRule::Expression(e)) => eval(e, read).and_then(&mut *read),
            Some(RegisterRule::ValExpression(e)) => eval(e, read),
            _ => None,
        };
        match (ra, bp) {
            // The caller's frame is above this one's: a CFA below the stack pointer is a rule
            // misread, and a zero return address ends nothing.
            (Some(ip), Some(bp)) if ip != 0 && (cfa > regs.sp || ra_in_lr && cfa == regs.sp) => {
                Step::Caller(Regs {
                    ip: strip_pac(ip),
                    sp: cfa,
                    bp,
                    lr: 0,
                })
            }
            _ => Step::Unknown,
        }
    }

    /// Whether the instruction that ends just before `svma` is a call, the test that a word
    /// found on a stack is a return address: `Some(Some(target))` for a direct call (the SVMA
    /// it calls), `Some(None)` for an indirect one.
    pub fn call_before(&self, svma: u64) -> Option<Option<u64>> {
        let (text, at) = self.section_data(".text")?;
        isa::call_before(text, at, svma)
    }
}

/// Evaluates a DWARF expression whose registers come from `get` and whose memory reads come
/// from the copied stack.
fn evaluate(
    bytes: Slice<'_>,
    encoding: gimli::Encoding,
    get: &dyn Fn(gimli::Register) -> Option<u64>,
    read: &mut dyn FnMut(u64) -> Option<u64>,
) -> Option<u64> {
    let mut e = Evaluation::new(bytes, encoding);
    e.set_max_iterations(MAX_EXPRESSION_STEPS);
    let mut r = e.evaluate().ok()?;
    for _ in 0..MAX_EXPRESSION_STEPS {
        r = match r {
            EvaluationResult::Complete => break,
            EvaluationResult::RequiresRegister { register, .. } => e
                .resume_with_register(Value::Generic(get(register)?))
                .ok()?,
            EvaluationResult::RequiresMemory {
                address, size: 8, ..
            } => e.resume_with_memory(Value::Generic(read(address)?)).ok()?,
            _ => return None,
        };
    }
    match e.as_result().last()?.location {
        Location::Address { address } => Some(address),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gimli::X86_64;
    use x86_64::call_before;

    #[test]
    fn a_return_address_follows_a_call() {
        // At 0x1000: call 0x1100 (e8 rel32); mov %rax,%rbx; call *0x3e0(%r9); call *%rax;
        // then an add whose last bytes look like nothing callable.
        let text = [
            0xe8, 0xfb, 0x00, 0x00, 0x00, // 0x1000 call 0x1100
            0x48, 0x89, 0xc3, // 0x1005 mov %rax,%rbx
            0x41, 0xff, 0x91, 0xe0, 0x03, 0x00, 0x00, // 0x1008 call *0x3e0(%r9)
            0xff, 0xd0, // 0x100f call *%rax
            0x48, 0x83, 0xc0, 0x10, // 0x1011 add $0x10,%rax
        ];
        assert_eq!(call_before(&text, 0x1000, 0x1005), Some(Some(0x1100)));
        assert_eq!(call_before(&text, 0x1000, 0x100f), Some(None));
        assert_eq!(call_before(&text, 0x1000, 0x1011), Some(None));
        // After a mov and an add: not a return address.
        assert_eq!(call_before(&text, 0x1000, 0x1008), None);
        assert_eq!(call_before(&text, 0x1000, 0x1015), None);
        // Outside the section, or before its start.
        assert_eq!(call_before(&text, 0x1000, 0x2000), None);
        assert_eq!(call_before(&text, 0x1000, 0x0fff), None);
        assert_eq!(call_before(&text, 0x1000, 0x1001), None);
    }

    #[test]
    fn a_realigned_frame_reads_its_cfa_from_the_stack() {
        // GCC's rule for a function that realigned its stack: CFA = *(rbp - 24).
        let expr = [0x76u8, 0x68, 0x06]; // DW_OP_breg6 -24; DW_OP_deref
        let encoding = gimli::Encoding {
            address_size: 8,
            format: gimli::Format::Dwarf32,
            version: 4,
        };
        let get = |r: gimli::Register| (r == X86_64::RBP).then_some(0x7000_0100);
        let mut read = |a: u64| (a == 0x7000_0100 - 24).then_some(0x7000_0400);
        let cfa = evaluate(
            EndianSlice::new(&expr, LittleEndian),
            encoding,
            &get,
            &mut read,
        );
        assert_eq!(cfa, Some(0x7000_0400));
        // A read outside the copy ends the evaluation.
        let mut nothing = |_: u64| None;
        let none = evaluate(
            EndianSlice::new(&expr, LittleEndian),
            encoding,
            &get,
            &mut nothing,
        );
        assert_eq!(none, None);
    }
}
