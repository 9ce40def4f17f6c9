//! Symbol tables: ELF `.symtab` + `.dynsym` (demangled) and the kernel's `/proc/kallsyms`.

use std::sync::Arc;

use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol, ObjectSymbolTable, SymbolKind};

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
        syms.extend(plt_symbols(file));
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

/// x86_64 PLT stubs, named `NAME@plt` as perf and objdump name them (`.plt`, `.plt.sec`,
/// `.plt.got`). Each stub jumps through a GOT slot (`jmp *disp(%rip)`, after an `endbr64` and a
/// `bnd` prefix in IBT builds); the dynamic relocation that fills that slot names it. Without
/// them a stub takes the name of the symbol before it (`_init`, which has no size). What stays
/// unnamed of those sections (a lazy binder's first entry, `ifunc` slots) is `[plt]`.
fn plt_symbols(file: &object::File) -> Vec<(u64, u64, Arc<str>)> {
    let mut out = Vec::new();
    if file.architecture() != object::Architecture::X86_64 {
        return out;
    }
    let (Some(dynsyms), Some(relocs)) = (file.dynamic_symbol_table(), file.dynamic_relocations())
    else {
        return out;
    };
    let slots: std::collections::HashMap<u64, String> = relocs
        .filter_map(|(at, r)| {
            let object::RelocationTarget::Symbol(i) = r.target() else {
                return None;
            };
            let name = dynsyms.symbol_by_index(i).ok()?.name().ok()?;
            (!name.is_empty()).then(|| (at, name.to_string()))
        })
        .collect();
    for name in [".plt", ".plt.sec", ".plt.got"] {
        let Some(section) = file.section_by_name(name) else {
            continue;
        };
        let (at, Ok(code)) = (section.address(), section.data()) else {
            continue;
        };
        if code.is_empty() {
            continue;
        }
        // `.plt.got` stubs are 8 bytes (`jmp *disp(%rip); xchg %ax,%ax`) unless IBT's
        // `endbr64` starts them; the others are 16.
        const ENDBR64: [u8; 4] = [0xf3, 0x0f, 0x1e, 0xfa];
        let stride = if name == ".plt.got" && !code.starts_with(&ENDBR64) {
            8
        } else {
            16
        };
        for (k, stub) in code.chunks_exact(stride).enumerate() {
            let body = stub.strip_prefix(&ENDBR64).unwrap_or(stub);
            let body = body.strip_prefix(&[0xf2]).unwrap_or(body);
            let disp = body
                .strip_prefix(&[0xff, 0x25])
                .and_then(|d| d.get(..4))
                .map(|d| i32::from_le_bytes([d[0], d[1], d[2], d[3]]));
            let stub_at = at + (k * stride) as u64;
            // The displacement counts from the end of the jump instruction (6 bytes).
            let got = disp.map(|d| {
                let end = stub_at + (stub.len() - body.len()) as u64 + 6;
                end.wrapping_add(d as i64 as u64)
            });
            let name = match got.and_then(|g| slots.get(&g)) {
                Some(sym) => format!("{}@plt", demangle(sym)),
                None => "[plt]".to_string(),
            };
            out.push((stub_at, stride as u64, Arc::from(name)));
        }
    }
    out
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

    /// PLT stubs are named as objdump names them, in the host's own libraries.
    #[test]
    fn plt_stubs_are_named_as_objdump_names_them() {
        let mut checked = 0;
        for lib in [
            "/lib/x86_64-linux-gnu/libz.so.1",
            "/lib/x86_64-linux-gnu/libstdc++.so.6",
            "/lib/x86_64-linux-gnu/libc.so.6",
        ] {
            let data = std::fs::read(lib).unwrap();
            let table = SymbolTable::from_elf(&object::File::parse(&*data).unwrap());
            let dump = std::process::Command::new("objdump")
                .args(["-d", "-j", ".plt", "-j", ".plt.sec", "-j", ".plt.got", lib])
                .output()
                .expect("objdump (binutils)");
            for line in String::from_utf8_lossy(&dump.stdout).lines() {
                // `0000000000026030 <realloc@plt>:`
                let Some((addr, rest)) = line.split_once(" <") else {
                    continue;
                };
                let Some(name) = rest.strip_suffix("@plt>:") else {
                    continue;
                };
                if name.starts_with("*ABS*") {
                    continue; // an ifunc slot: no symbol
                }
                let addr = u64::from_str_radix(addr, 16).unwrap();
                let want = format!("{}@plt", demangle(name));
                let got = table.lookup(addr).map(|s| s.1.to_string());
                assert_eq!(got.as_deref(), Some(want.as_str()), "{lib} at {addr:#x}");
                // The whole stub, not only its first byte.
                let inside = table.lookup(addr + 7).map(|s| s.1.to_string());
                assert_eq!(
                    inside.as_deref(),
                    Some(want.as_str()),
                    "{lib} at {addr:#x}+7"
                );
                checked += 1;
            }
        }
        assert!(checked >= 100, "only {checked} stubs checked");
    }

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
