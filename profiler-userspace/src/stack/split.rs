//! Functions the compiler split into parts. GCC's hot/cold partitioning (used by distribution
//! builds with profile-guided optimisation) moves part of a function into `.text.unlikely` as
//! `foo.cold`; a stripped binary names only the entry part, so samples in the other part would
//! be anonymous. For CPython's eval loop that part can be most of the function (Debian's 3.14:
//! 84 KiB of dispatch code against a 1 KiB entry), and an anonymous eval frame cannot be paired
//! with its Python frames.
//!
//! The parts are found from the code: the entry part's direct jumps that leave it land in the
//! other parts, and each part has its own unwind (FDE) entry, which gives its extent. Nothing in
//! the ELF links the parts otherwise, and no crate does this, hence this module; x86 decoding is
//! iced-x86's, arm64's branches (fixed 4-byte words) are decoded here, and `.eh_frame` parsing
//! is gimli's.

use std::sync::Arc;

use gimli::{BaseAddresses, CieOrFde, EhFrame, UnwindSection};
use iced_x86::{Decoder, DecoderOptions, FlowControl, OpKind};
use object::{Object, ObjectSection};

use super::symbols::SymbolTable;

/// Bounds on untrusted files: bytes decoded per function, targets followed, FDEs walked.
const MAX_FUNCTION: u64 = 1 << 20;
const MAX_TARGETS: usize = 64;
const MAX_FDES: usize = 4_000_000;

/// `(start, size, "name.cold")` for every unnamed part of the functions named `candidates`
/// (the interpreter support says which: they are the functions whose frames it looks for).
pub fn split_parts(
    file: &object::File,
    table: &SymbolTable,
    candidates: &[&str],
) -> Vec<(u64, u64, Arc<str>)> {
    if !matches!(
        file.architecture(),
        object::Architecture::X86_64 | object::Architecture::Aarch64
    ) {
        return Vec::new();
    }
    let mut wanted: Vec<(u64, Arc<str>)> = Vec::new();
    for &name in candidates {
        let Some((start, size)) = table.find(name) else {
            continue;
        };
        if size == 0 || size > MAX_FUNCTION {
            continue;
        }
        let part_name: Arc<str> = Arc::from(format!("{name}.cold"));
        for target in outside_jumps(file, start, size) {
            if table.lookup(target).is_none() && wanted.len() < MAX_TARGETS {
                wanted.push((target, part_name.clone()));
            }
        }
    }
    if wanted.is_empty() {
        return Vec::new();
    }
    let mut parts: Vec<(u64, u64, Arc<str>)> = Vec::new();
    for (start, len) in fde_ranges_containing(file, wanted.iter().map(|w| w.0)) {
        if parts.iter().any(|p| p.0 == start) {
            continue;
        }
        if let Some((_, name)) = wanted.iter().find(|(t, _)| *t >= start && *t < start + len) {
            parts.push((start, len, name.clone()));
        }
    }
    parts
}

/// Targets of the direct jumps (not calls) in `[start, start+size)` that land outside it.
fn outside_jumps(file: &object::File, start: u64, size: u64) -> Vec<u64> {
    let Some(code) = bytes_at(file, start, size) else {
        return Vec::new();
    };
    if file.architecture() == object::Architecture::Aarch64 {
        return outside_branches_aarch64(code, start);
    }
    let mut out = Vec::new();
    let mut decoder = Decoder::with_ip(64, code, start, DecoderOptions::NONE);
    for insn in &mut decoder {
        if insn.is_invalid() {
            continue;
        }
        let jump = matches!(
            insn.flow_control(),
            FlowControl::UnconditionalBranch | FlowControl::ConditionalBranch
        );
        if jump && insn.op0_kind() == OpKind::NearBranch64 {
            let t = insn.near_branch_target();
            if (t < start || t >= start + size) && !out.contains(&t) {
                out.push(t);
                if out.len() >= MAX_TARGETS {
                    break;
                }
            }
        }
    }
    out
}

/// arm64's `outside_jumps`: `b`, `b.cond`, `cbz`/`cbnz` and `tbz`/`tbnz` (not `bl`, a call),
/// whose targets are signed word offsets from the instruction.
fn outside_branches_aarch64(code: &[u8], start: u64) -> Vec<u64> {
    let size = code.len() as u64;
    let mut out = Vec::new();
    for (i, w) in code.chunks_exact(4).enumerate() {
        let insn = u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
        // (offset field's low bit, its width in bits)
        let field = if insn & 0xfc00_0000 == 0x1400_0000 {
            Some((0, 26)) // B
        } else if insn & 0xff00_0010 == 0x5400_0000 || insn & 0x7e00_0000 == 0x3400_0000 {
            Some((5, 19)) // B.cond, CBZ/CBNZ
        } else if insn & 0x7e00_0000 == 0x3600_0000 {
            Some((5, 14)) // TBZ/TBNZ
        } else {
            None
        };
        let Some((lo, bits)) = field else {
            continue;
        };
        let raw = (insn >> lo) & ((1u32 << bits) - 1);
        // Sign-extend the word offset.
        let words = ((raw << (32 - bits)) as i32 >> (32 - bits)) as i64;
        let pc = start + 4 * i as u64;
        let t = pc.wrapping_add_signed(words * 4);
        if (t < start || t >= start + size) && !out.contains(&t) {
            out.push(t);
            if out.len() >= MAX_TARGETS {
                break;
            }
        }
    }
    out
}

/// The bytes of the section that holds `[addr, addr+size)`.
fn bytes_at<'a>(file: &'a object::File, addr: u64, size: u64) -> Option<&'a [u8]> {
    let end = addr.checked_add(size)?;
    let s = file
        .sections()
        .find(|s| addr >= s.address() && end <= s.address().saturating_add(s.size()))?;
    let data = s.data().ok()?;
    let off = (addr - s.address()) as usize;
    data.get(off..off + size as usize)
}

/// The `(start, len)` of each `.eh_frame` FDE that contains one of `addrs`.
fn fde_ranges_containing(
    file: &object::File,
    addrs: impl Iterator<Item = u64> + Clone,
) -> Vec<(u64, u64)> {
    let Some(section) = file.section_by_name(".eh_frame") else {
        return Vec::new();
    };
    let Ok(data) = section.data() else {
        return Vec::new();
    };
    let eh = super::elf::eh_frame(data);
    let mut bases = BaseAddresses::default().set_eh_frame(section.address());
    if let Some(text) = file.section_by_name(".text") {
        bases = bases.set_text(text.address());
    }
    let mut out = Vec::new();
    let mut entries = eh.entries(&bases);
    for _ in 0..MAX_FDES {
        let Ok(Some(entry)) = entries.next() else {
            break;
        };
        let CieOrFde::Fde(partial) = entry else {
            continue;
        };
        let Ok(fde) = partial.parse(EhFrame::cie_from_offset) else {
            continue;
        };
        let (start, len) = (fde.initial_address(), fde.len());
        if addrs
            .clone()
            .any(|a| a >= start && a < start.saturating_add(len))
        {
            out.push((start, len));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    #[test]
    fn arm64_branches_that_leave_a_function_are_found() {
        let words: [u32; 6] = [
            0x1400_0010, // 0x1000 b 0x1040 (outside)
            0x5400_0040, // 0x1004 b.eq 0x100c (inside)
            0x54ff_ff80, // 0x1008 b.eq 0x0ff8 (outside, backwards)
            0xb400_0080, // 0x100c cbz x0, 0x101c (outside)
            0x9400_0100, // 0x1010 bl 0x1410 (a call: not a jump)
            0x3607_ffe0, // 0x1014 tbz w0, #0, 0x1010 (inside)
        ];
        let code: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        assert_eq!(
            outside_branches_aarch64(&code, 0x1000),
            vec![0x1040, 0x0ff8, 0x101c]
        );
    }

    /// GCC moves the path to a cold function's calls into `fn.cold`; once stripped (dynamic
    /// symbols only), that part must still be named after its function.
    #[test]
    fn names_the_cold_part_of_a_stripped_function() {
        let dir = std::env::temp_dir().join(format!("tachyon-split-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let src = dir.join("eval.c");
        std::fs::write(
            &src,
            r#"#include <stdio.h>
__attribute__((cold, noinline)) void report(long i) { fprintf(stderr, "bad %ld\n", i); }
long _PyEval_EvalFrameDefault(long n) {
    long s = 0;
    for (long i = 0; i < n; i++) {
        if (i == 123456789) { report(i); report(s); s = -s * 3; }
        s += i * i;
    }
    return s;
}
int main(int argc, char **argv) { return (int)_PyEval_EvalFrameDefault(argc) & 1; }
"#,
        )
        .unwrap();
        let full = dir.join("eval");
        let stripped = dir.join("eval.stripped");
        let ok = Command::new("gcc")
            .args(["-O2", "-rdynamic", "-o"])
            .arg(&full)
            .arg(&src)
            .status()
            .expect("gcc is needed for this test");
        assert!(ok.success());
        assert!(Command::new("strip")
            .arg("-o")
            .arg(&stripped)
            .arg(&full)
            .status()
            .unwrap()
            .success());

        let full_bytes = std::fs::read(&full).unwrap();
        let full_file = object::File::parse(&full_bytes[..]).unwrap();
        let cold = object::Object::symbols(&full_file)
            .find(|s| object::ObjectSymbol::name(s) == Ok("_PyEval_EvalFrameDefault.cold"))
            .map(|s| object::ObjectSymbol::address(&s))
            .expect("gcc -O2 made a .cold part");

        let bytes = std::fs::read(&stripped).unwrap();
        let file = object::File::parse(&bytes[..]).unwrap();
        assert!(object::Object::symbols(&file).next().is_none(), "stripped");
        let table = SymbolTable::from_elf(&file);
        let parts = split_parts(&file, &table, &["_PyEval_EvalFrameDefault"]);
        let table = table.with_parts(parts);
        let (start, name) = table.lookup(cold + 1).expect("cold part is named");
        assert_eq!(name.as_ref(), "_PyEval_EvalFrameDefault.cold");
        assert_eq!(start, cold);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
