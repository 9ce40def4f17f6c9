//! Native stacks: ELF files and symbols, DWARF CFI unwinding of copied user stacks, kernel
//! symbols.

pub mod elf;
pub mod split;
pub mod symbols;
pub mod unwind;
