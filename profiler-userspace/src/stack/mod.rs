//! Native code: ELF files (opened safely from a target's view of the file system), their
//! symbols and the parts the compiler split off functions, and kernel symbols.
//!
//! Owns no process state and knows no interpreter: which functions to look for in split parts
//! is the caller's (`python::SPLIT_FUNCTIONS`). May import nothing else of the crate.

pub mod elf;
pub mod split;
pub mod symbols;
