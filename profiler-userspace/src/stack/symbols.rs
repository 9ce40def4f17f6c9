//! Symbol tables: ELF `.symtab` + `.dynsym` (demangled) and the kernel's `/proc/kallsyms`.

use std::sync::Arc;

use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol, SymbolKind};

/// A sorted function-symbol table; addresses are SVMAs (file virtual addresses).
#[derive(Default)]
pub struct SymbolTable {
    /// (start, size, name), sorted by start.
    syms: Vec<(u64, u64, Arc<str>)>,
}

pub fn demangle(name: &str) -> String {
    if let Ok(d) = rustc_demangle::try_demangle(name) {
        return format!("{d:#}");
    }
    if name.starts_with("_Z") {
        if let Ok(sym) = cpp_demangle::Symbol::new(name) {
            let opts = cpp_demangle::DemangleOptions::new().no_params();
            if let Ok(s) = sym.demangle_with_options(&opts) {
                return s;
            }
        }
    }
    name.to_string()
}

impl SymbolTable {
    pub fn from_elf(file: &object::File) -> SymbolTable {
        let mut syms: Vec<(u64, u64, Arc<str>)> = Vec::new();
        for sym in file.symbols().chain(file.dynamic_symbols()) {
            if sym.kind() != SymbolKind::Text || sym.address() == 0 {
                continue;
            }
            if let Ok(name) = sym.name() {
                if !name.is_empty() {
                    syms.push((sym.address(), sym.size(), Arc::from(demangle(name))));
                }
            }
        }
        SymbolTable::from_entries(syms)
    }

    /// The table with more named ranges (`split::split_parts`).
    pub fn with_parts(self, parts: Vec<(u64, u64, Arc<str>)>) -> SymbolTable {
        if parts.is_empty() {
            return self;
        }
        let mut syms = self.syms;
        syms.extend(parts);
        SymbolTable::from_entries(syms)
    }

    /// This table with `other`'s symbols (a separate debug file's) added: functions it did not
    /// name get their names; where both name an address, this table's (exported) name is kept
    /// over the debug file's local aliases.
    pub fn merged(self, other: SymbolTable) -> SymbolTable {
        let mut syms = self.syms;
        syms.extend(other.syms);
        SymbolTable::from_entries(syms)
    }

    /// The start and size of the function named `name`.
    pub fn find(&self, name: &str) -> Option<(u64, u64)> {
        self.syms
            .iter()
            .find(|s| s.2.as_ref() == name)
            .map(|s| (s.0, s.1))
    }

    pub fn from_entries(mut syms: Vec<(u64, u64, Arc<str>)>) -> SymbolTable {
        // Prefer sized symbols and, among aliases, the one seen first (.symtab before .dynsym).
        syms.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
        syms.dedup_by(|b, a| a.0 == b.0);
        SymbolTable { syms }
    }

    /// The function containing `addr`: (start, name). A zero-size symbol covers up to the next.
    pub fn lookup(&self, addr: u64) -> Option<(u64, Arc<str>)> {
        let i = self.syms.partition_point(|s| s.0 <= addr).checked_sub(1)?;
        let (start, size, name) = &self.syms[i];
        if *size != 0 && addr >= start + size {
            return None;
        }
        if *size == 0 {
            if let Some(next) = self.syms.get(i + 1) {
                if addr >= next.0 {
                    return None;
                }
            }
        }
        Some((*start, name.clone()))
    }
}

/// The kernel's symbols from `/proc/kallsyms` (text symbols only). Module symbols carry their
/// module name.
pub struct KernelSymbols {
    syms: Vec<(u64, Arc<str>)>,
}

impl KernelSymbols {
    pub fn load() -> KernelSymbols {
        let text = std::fs::read_to_string("/proc/kallsyms").unwrap_or_default();
        KernelSymbols::parse(&text)
    }

    /// The address of the function `name` (the first of that name).
    pub fn address_of(&self, name: &str) -> Option<u64> {
        self.syms.iter().find(|s| &*s.1 == name).map(|s| s.0)
    }

    pub fn parse(text: &str) -> KernelSymbols {
        let mut syms = Vec::new();
        for line in text.lines() {
            let mut it = line.split_whitespace();
            let (Some(addr), Some(kind), Some(name)) = (it.next(), it.next(), it.next()) else {
                continue;
            };
            if !matches!(kind, "t" | "T" | "w" | "W") {
                continue;
            }
            let Ok(addr) = u64::from_str_radix(addr, 16) else {
                continue;
            };
            if addr == 0 {
                continue;
            }
            syms.push((addr, Arc::from(name)));
        }
        syms.sort_by_key(|s| s.0);
        KernelSymbols { syms }
    }

    pub fn lookup(&self, addr: u64) -> Option<(u64, Arc<str>)> {
        let i = self.syms.partition_point(|s| s.0 <= addr).checked_sub(1)?;
        Some((self.syms[i].0, self.syms[i].1.clone()))
    }
}

/// The first PT_LOAD's address and offset, to relate file offsets and SVMAs.
pub fn load_segments(file: &object::File) -> Vec<(u64, u64, u64)> {
    file.segments()
        .map(|s| {
            let (off, size) = s.file_range();
            (s.address(), off, size)
        })
        .collect()
}

/// The SVMA range of a section, if the file has it.
pub fn section_range(file: &object::File, name: &str) -> Option<std::ops::Range<u64>> {
    let s = file.section_by_name(name)?;
    Some(s.address()..s.address() + s.size())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_respects_sizes() {
        let t = SymbolTable::from_entries(vec![
            (0x100, 0x10, Arc::from("a")),
            (0x200, 0, Arc::from("b")),
            (0x300, 0x10, Arc::from("c")),
        ]);
        assert_eq!(t.lookup(0x105).unwrap().1.as_ref(), "a");
        assert!(t.lookup(0x110).is_none());
        assert_eq!(t.lookup(0x2ff).unwrap().1.as_ref(), "b");
        assert!(t.lookup(0x50).is_none());
    }

    #[test]
    fn demangles_rust_and_cpp() {
        assert_eq!(
            demangle("_ZN4core3fmt5write17h0123456789abcdefE"),
            "core::fmt::write"
        );
        assert_eq!(demangle("_ZN3foo3barEv"), "foo::bar");
        assert_eq!(demangle("PyObject_Call"), "PyObject_Call");
    }

    #[test]
    fn kallsyms_text_only() {
        let k = KernelSymbols::parse(
            "ffffffff81000000 T _stext\nffffffff81000100 t do_syscall_64\nffffffff82000000 D data\n",
        );
        assert_eq!(
            k.lookup(0xffffffff81000150).unwrap().1.as_ref(),
            "do_syscall_64"
        );
    }
}
