//! The bytecode instruction a Python frame runs (`--opcodes`): the opcode byte read from the
//! code object's bytecode at the frame's instruction offset, named by that version's own `dis`
//! (specialized forms included, each with the instruction it specializes). The tables are data
//! generated from each interpreter by `opcodes_gen.py`; the opcodes test
//! (`tests/tests/python.rs`) checks every name given in a profile against the `dis` of the
//! interpreter that ran it, on every installed version.
//!
//! The byte is read when the sample is resolved, a few milliseconds after it was taken: 3.11+
//! rewrites an instruction in place when it specializes or deoptimizes it, so a sample taken
//! just before such a rewrite can be named with the new form (of the same base instruction).

use super::layout::Layout;
use super::objects::BYTES;
use super::remote::{le_u64, Remote};

#[rustfmt::skip]
#[path = "opcodes_table.rs"]
mod table;

/// 3.8-3.10: `co_code` (a `bytes` object) in `PyCodeObject`, after the eight `int` fields.
const LEGACY_CO_CODE: u64 = 48;
/// The most code units an instruction offset is believed to have (a code object's bytecode is
/// far smaller; a larger offset is a torn or garbage read).
const MAX_INSTR: i32 = 1 << 22;

/// A named instruction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Opcode {
    /// As `dis` names it, specialized form included (`LOAD_ATTR_INSTANCE_VALUE`).
    pub name: &'static str,
    /// For a specialized form, the instruction it specializes (`LOAD_ATTR`).
    pub base: Option<&'static str>,
}

/// The name of opcode `byte` in Python `3.minor`, if that version has one by that number.
pub fn name(minor: u32, byte: u8) -> Option<Opcode> {
    let (name, base) = table::table(minor)?[byte as usize];
    (!name.is_empty()).then_some(Opcode {
        name,
        base: (!base.is_empty()).then_some(base),
    })
}

/// Reads the opcode of the instruction at `instr` (as the BPF walk reports it: bytes for 3.8
/// and 3.9, code units from 3.10) of the code object at `code`.
pub fn read(remote: &Remote, layout: &Layout, code: u64, instr: i32) -> Option<u8> {
    if !(0..MAX_INSTR).contains(&instr) {
        return None;
    }
    let instr = instr as u64;
    if layout.minor >= 11 {
        // The adaptive bytecode is inline in the code object; a code unit is (opcode, oparg).
        let at = code
            .checked_add(layout.code_adaptive as u64)?
            .checked_add(2 * instr)?;
        return remote.read(at, 1)?.first().copied();
    }
    let bytes = remote.u64(code.checked_add(LEGACY_CO_CODE)?)?;
    let head = remote.read(bytes, (BYTES.data) as usize)?;
    let size = le_u64(&head, BYTES.size as usize)?;
    let offset = if layout.minor == 10 { 2 * instr } else { instr };
    if offset >= size {
        return None;
    }
    remote
        .read(bytes.checked_add(BYTES.data + offset)?, 1)?
        .first()
        .copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_come_from_each_versions_table() {
        // 3.8's BINARY_ADD is 23; 3.11 numbers its specialized forms into free slots.
        assert_eq!(name(8, 23).unwrap().name, "BINARY_ADD");
        assert_eq!(name(8, 0), None);
        let spec = (0..=255u8)
            .filter_map(|b| name(12, b))
            .find(|o| o.name == "LOAD_ATTR_INSTANCE_VALUE")
            .unwrap();
        assert_eq!(spec.base, Some("LOAD_ATTR"));
        assert!((8..=15).all(|m| table::table(m).is_some()));
        assert!(table::table(16).is_none());
    }
}
