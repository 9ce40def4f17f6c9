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

/// The kernel's text symbols, from `/proc/kallsyms` or from a copy of the part of it that stays
/// put for a boot (see `KernelSymbols::stable`).
///
/// One buffer of names and two arrays rather than a string per symbol: a kernel has 100k-200k of
/// them, and a table that loads from a copy should cost a copy, not 200k allocations.
#[derive(Default)]
pub struct KernelSymbols {
    /// Start addresses, sorted.
    addrs: Vec<u64>,
    /// Where each name ends in `names` (the next one starts there).
    ends: Vec<u32>,
    names: String,
    /// `None`: the whole table, as read from `/proc/kallsyms`. `Some`: only the kernel's and its
    /// modules' text is known (these ranges); code the kernel made since it booted (BPF
    /// programs, ftrace trampolines) is not, and an address there has the table read again.
    known: Option<Vec<(u64, u64)>>,
    /// Code the caller knows of besides (`add_code`): start, end, name.
    extra: Vec<(u64, u64, Arc<str>)>,
    /// The first and last of the kernel's own text symbols (those of no module), in a whole
    /// table.
    core: Option<(u64, u64)>,
}

/// How far past its last text symbol the kernel's own text is taken to go: inside the kernel's
/// image, far from where modules and BPF programs are put on x86_64 and arm64.
const CORE_TEXT_SLACK: u64 = 2 << 20;

/// The magic that starts `KernelSymbols::to_bytes`'s format (its version in it).
const KSYMS_MAGIC: &[u8] = b"tachyon-bpf kernel symbols 2\n";

/// Bounds of a table read from bytes, far above any kernel's.
const MAX_KSYMS: usize = 4_000_000;
const MAX_KSYM_NAMES: usize = 256 << 20;
const MAX_KSYM_RANGES: usize = 100_000;

impl KernelSymbols {
    /// The whole table, from `/proc/kallsyms` (empty when it cannot be read).
    pub fn load() -> KernelSymbols {
        let text = std::fs::read_to_string("/proc/kallsyms").unwrap_or_default();
        KernelSymbols::parse(&text)
    }

    pub fn parse(text: &str) -> KernelSymbols {
        let mut syms: Vec<(u64, &str)> = Vec::new();
        let mut core: Option<(u64, u64)> = None;
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
            // No `[module]` after the name: the kernel's own.
            if it.next().is_none() {
                core = Some(core.map_or((addr, addr), |(lo, hi)| (lo.min(addr), hi.max(addr))));
            }
            syms.push((addr, name));
        }
        // Stable: of several names at one address, the first listed stays first.
        syms.sort_by_key(|s| s.0);
        KernelSymbols {
            core,
            ..KernelSymbols::from_sorted(syms.into_iter(), None)
        }
    }

    fn from_sorted<'a>(
        syms: impl Iterator<Item = (u64, &'a str)>,
        known: Option<Vec<(u64, u64)>>,
    ) -> KernelSymbols {
        let mut k = KernelSymbols {
            known,
            ..KernelSymbols::default()
        };
        for (addr, name) in syms {
            if k.names.len() + name.len() > MAX_KSYM_NAMES {
                break;
            }
            k.addrs.push(addr);
            k.names.push_str(name);
            k.ends.push(k.names.len() as u32);
        }
        k
    }

    pub fn len(&self) -> usize {
        self.addrs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.addrs.is_empty()
    }

    fn name(&self, i: usize) -> &str {
        let start = match i {
            0 => 0,
            _ => self.ends[i - 1] as usize,
        };
        &self.names[start..self.ends[i] as usize]
    }

    /// The address of the function `name` (the first of that name).
    pub fn address_of(&self, name: &str) -> Option<u64> {
        (0..self.addrs.len())
            .find(|&i| self.name(i) == name)
            .map(|i| self.addrs[i])
    }

    /// Names code the table does not know (`knows` is false there): the profiler's own BPF
    /// programs, for a table from the boot's cache.
    pub fn add_code(&mut self, code: impl IntoIterator<Item = (u64, u64, String)>) {
        for (start, len, name) in code {
            if !self.knows(start) {
                self.extra
                    .push((start, start.saturating_add(len), Arc::from(name)));
            }
        }
    }

    /// The symbol at or before `addr`: its start and name.
    pub fn lookup(&self, addr: u64) -> Option<(u64, Arc<str>)> {
        if let Some((s, _, n)) = self.extra.iter().find(|e| (e.0..e.1).contains(&addr)) {
            return Some((*s, n.clone()));
        }
        let i = self.addrs.partition_point(|&a| a <= addr).checked_sub(1)?;
        Some((self.addrs[i], Arc::from(self.name(i))))
    }

    /// Whether `lookup` names `addr` as the whole table would: always for the whole table; for
    /// the stable part, inside the kernel's or a module's text.
    pub fn knows(&self, addr: u64) -> bool {
        match &self.known {
            None => true,
            Some(ranges) => {
                ranges.iter().any(|&(s, e)| (s..e).contains(&addr))
                    || self.extra.iter().any(|e| (e.0..e.1).contains(&addr))
            }
        }
    }

    /// The part of the table that stays put while the kernel runs with the same modules at the
    /// same addresses: the kernel's own text (from its first text symbol of no module to a
    /// little past its last: section names such as `_etext` are typed differently across
    /// architectures and versions) and each module's (`modules`: the text of `/proc/modules`,
    /// whose lines end with the module's address, after its size). `None` when the table is
    /// not a whole one read from the kernel.
    pub fn stable(&self, modules: &str) -> Option<KernelSymbols> {
        if self.known.is_some() {
            return None;
        }
        let (lo, hi) = self.core?;
        let mut ranges = vec![(lo, hi.saturating_add(CORE_TEXT_SLACK))];
        // `name size refcount deps state address [taint]`
        for line in modules.lines().take(MAX_KSYM_RANGES) {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (Some(size), Some(addr)) = (f.get(1), f.get(5)) else {
                continue;
            };
            let (Ok(size), Some(Ok(addr))) = (
                size.parse::<u64>(),
                addr.strip_prefix("0x").map(|a| u64::from_str_radix(a, 16)),
            ) else {
                continue;
            };
            if addr != 0 && size != 0 {
                ranges.push((addr, addr.saturating_add(size)));
            }
        }
        ranges.sort_unstable();
        let inside = |a: u64| ranges.iter().any(|&(s, e)| (s..e).contains(&a));
        let syms = (0..self.addrs.len())
            .filter(|&i| inside(self.addrs[i]))
            .map(|i| (self.addrs[i], self.name(i)));
        let k = KernelSymbols::from_sorted(syms, None);
        Some(KernelSymbols {
            known: Some(ranges),
            core: None,
            ..k
        })
    }

    /// The table as bytes, after `key` (what the table is valid for), for `from_bytes`.
    pub fn to_bytes(&self, key: &[u8]) -> Vec<u8> {
        let ranges = self.known.as_deref().unwrap_or(&[]);
        let mut out = Vec::with_capacity(
            64 + key.len() + ranges.len() * 16 + self.addrs.len() * 12 + self.names.len(),
        );
        out.extend_from_slice(KSYMS_MAGIC);
        let u32le = |out: &mut Vec<u8>, v: usize| out.extend_from_slice(&(v as u32).to_le_bytes());
        u32le(&mut out, key.len());
        out.extend_from_slice(key);
        u32le(&mut out, ranges.len());
        for &(s, e) in ranges {
            out.extend_from_slice(&s.to_le_bytes());
            out.extend_from_slice(&e.to_le_bytes());
        }
        u32le(&mut out, self.addrs.len());
        for a in &self.addrs {
            out.extend_from_slice(&a.to_le_bytes());
        }
        for e in &self.ends {
            out.extend_from_slice(&e.to_le_bytes());
        }
        u32le(&mut out, self.names.len());
        out.extend_from_slice(self.names.as_bytes());
        out
    }

    /// A table written by `to_bytes` with this `key` (`None`: another key, or bytes that are
    /// not such a table: every length and order is checked).
    pub fn from_bytes(bytes: &[u8], key: &[u8]) -> Option<KernelSymbols> {
        let mut r = Reader(bytes);
        if r.take(KSYMS_MAGIC.len())? != KSYMS_MAGIC {
            return None;
        }
        let klen = r.u32()? as usize;
        if r.take(klen)? != key {
            return None;
        }
        let nranges = r.u32()? as usize;
        if nranges > MAX_KSYM_RANGES {
            return None;
        }
        let mut ranges = Vec::with_capacity(nranges);
        for _ in 0..nranges {
            ranges.push((r.u64()?, r.u64()?));
        }
        let n = r.u32()? as usize;
        if n > MAX_KSYMS || n.checked_mul(12)? > r.0.len() {
            return None;
        }
        let addrs: Vec<u64> = (0..n).map(|_| r.u64()).collect::<Option<_>>()?;
        let ends: Vec<u32> = (0..n).map(|_| r.u32()).collect::<Option<_>>()?;
        let names_len = r.u32()? as usize;
        let names = std::str::from_utf8(r.take(names_len)?).ok()?;
        let sorted = addrs.windows(2).all(|w| w[0] <= w[1]);
        let bounded = ends.windows(2).all(|w| w[0] <= w[1])
            && ends
                .last()
                .map_or(names_len == 0, |&e| e as usize == names_len)
            && ends.iter().all(|&e| names.is_char_boundary(e as usize));
        if !r.0.is_empty() || !sorted || !bounded || ranges.is_empty() {
            return None;
        }
        Some(KernelSymbols {
            addrs,
            ends,
            names: names.to_string(),
            known: Some(ranges),
            extra: Vec::new(),
            core: None,
        })
    }
}

/// Little-endian fields from the front of a byte slice.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if n > self.0.len() {
            return None;
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Some(a)
    }

    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
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

    const KALLSYMS: &str = "ffffffff81000000 T _stext\n\
        ffffffff81000100 t do_syscall_64\n\
        ffffffff81000200 D _etext\n\
        ffffffff81000300 t __schedule\n\
        ffffffff82000000 D data\n\
        ffffffffc0001000 t ext4_lookup\t[ext4]\n\
        ffffffffc0009000 t bpf_prog_6deef7357e7b4530_tachyon_switch\t[bpf]\n\
        ffffffffc000a000 t ftrace_trampoline\t[__builtin__ftrace]\n";
    const MODULES: &str = "ext4 4096 1 - Live 0xffffffffc0001000\n";

    /// The stable part keeps the kernel's and its modules' text, and knows nothing else: an
    /// address in a BPF program is not named after the symbol before it.
    #[test]
    fn the_stable_part_knows_only_kernel_and_module_text() {
        let whole = KernelSymbols::parse(KALLSYMS);
        assert!(whole.knows(0xffffffffc0009010));
        assert_eq!(
            whole.lookup(0xffffffffc0009010).unwrap().1.as_ref(),
            "bpf_prog_6deef7357e7b4530_tachyon_switch"
        );
        let stable = whole.stable(MODULES).unwrap();
        assert_eq!(stable.len(), 4);
        for (addr, name) in [
            (0xffffffff81000150, "do_syscall_64"),
            // Past `_etext`, which is not a text symbol here (arm64 5.10 types it so).
            (0xffffffff81000310, "__schedule"),
            (0xffffffffc0001010, "ext4_lookup"),
        ] {
            assert!(stable.knows(addr), "{addr:#x}");
            assert_eq!(stable.lookup(addr).unwrap().1.as_ref(), name);
        }
        for addr in [0xffffffffc0009010, 0xffffffffc000a004, 0xffffffff84000000] {
            assert!(!stable.knows(addr), "{addr:#x}");
        }
        // Code named besides: known and named as given, where the table knew nothing.
        let mut stable = stable;
        stable.add_code([(
            0xffffffffc0009000,
            0x100,
            "bpf_prog_ab_tachyon_switch".into(),
        )]);
        assert!(stable.knows(0xffffffffc0009010));
        assert_eq!(
            stable.lookup(0xffffffffc0009010).unwrap().1.as_ref(),
            "bpf_prog_ab_tachyon_switch"
        );
        assert!(!stable.knows(0xffffffffc0009100));
        // Only a whole table has a stable part, and only one with text of the kernel's own.
        assert!(stable.stable(MODULES).is_none());
        assert!(KernelSymbols::parse("ffffffffc0001000 t f\t[m]\n")
            .stable("")
            .is_none());
    }

    /// The bytes of a table give it back for the same key only, and any damage is refused.
    #[test]
    fn a_table_in_bytes_reads_back_for_its_key_only() {
        let stable = KernelSymbols::parse(KALLSYMS).stable(MODULES).unwrap();
        let bytes = stable.to_bytes(b"boot-1");
        let back = KernelSymbols::from_bytes(&bytes, b"boot-1").unwrap();
        assert_eq!(back.addrs, stable.addrs);
        assert_eq!(back.names, stable.names);
        assert_eq!(back.known, stable.known);
        assert!(KernelSymbols::from_bytes(&bytes, b"boot-2").is_none());
        for n in 0..bytes.len() {
            assert!(
                KernelSymbols::from_bytes(&bytes[..n], b"boot-1").is_none(),
                "{n}"
            );
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(KernelSymbols::from_bytes(&longer, b"boot-1").is_none());
        // Name ends out of order or past the names.
        let ends_at = bytes.len() - 4 - stable.names.len() - 4 * stable.len();
        let mut bad = bytes.clone();
        bad[ends_at..ends_at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(KernelSymbols::from_bytes(&bad, b"boot-1").is_none());
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
