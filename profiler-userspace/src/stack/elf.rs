//! Mapped ELF files: symbols, unwind sections and load segments, cached per file so every process
//! that maps the same library shares one copy.

use std::collections::HashMap;
use std::fs::File;
use std::ops::{Deref, Range};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;
use object::{Object, ObjectSection};

use super::symbols::{load_segments, section_range, SymbolTable};

/// A byte range of a mapped file, the section data type handed to framehop.
#[derive(Clone)]
pub struct FileBytes {
    map: Arc<Mmap>,
    range: Range<usize>,
}

impl Deref for FileBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.map[self.range.clone()]
    }
}

/// Where a section lives in the file, by SVMA and by file bytes.
#[derive(Clone, Debug)]
pub struct SectionRef {
    pub svma: Range<u64>,
    pub file: Range<usize>,
}

pub struct ElfFile {
    pub path: PathBuf,
    map: Arc<Mmap>,
    pub symbols: SymbolTable,
    /// (p_vaddr, p_offset, p_filesz) of each segment.
    pub segments: Vec<(u64, u64, u64)>,
    sections: HashMap<&'static str, SectionRef>,
}

const UNWIND_SECTIONS: [&str; 5] = [
    ".text",
    ".eh_frame",
    ".eh_frame_hdr",
    ".got",
    ".debug_frame",
];

impl ElfFile {
    pub fn open(path: &Path) -> Option<ElfFile> {
        let f = File::open(path).ok()?;
        // SAFETY: the file is mapped read-only; a concurrent truncation by another process could
        // fault, the same risk every symbolizer that maps libraries takes.
        let map = unsafe { Mmap::map(&f) }.ok()?;
        ElfFile::from_mmap(path.to_path_buf(), Arc::new(map))
    }

    pub fn from_mmap(path: PathBuf, map: Arc<Mmap>) -> Option<ElfFile> {
        let file = object::File::parse(&map[..]).ok()?;
        let symbols = SymbolTable::from_elf(&file);
        let segments = load_segments(&file);
        let mut sections = HashMap::new();
        for name in UNWIND_SECTIONS {
            if let Some(s) = file.section_by_name(name) {
                let svma = section_range(&file, name).unwrap_or(0..0);
                let file_range = s
                    .file_range()
                    .map(|(o, n)| o as usize..(o + n) as usize)
                    .filter(|r| r.end <= map.len());
                if let Some(fr) = file_range {
                    sections.insert(name, SectionRef { svma, file: fr });
                }
            }
        }
        Some(ElfFile {
            path,
            map,
            symbols,
            segments,
            sections,
        })
    }

    fn bytes(&self, name: &str) -> Option<FileBytes> {
        self.sections.get(name).map(|s| FileBytes {
            map: self.map.clone(),
            range: s.file.clone(),
        })
    }

    /// The SVMA at which file offset `offset` is loaded.
    pub fn offset_to_svma(&self, offset: u64) -> Option<u64> {
        self.segments
            .iter()
            .find(|(_, off, size)| offset >= *off && offset < off + size.max(&1))
            .map(|(vaddr, off, _)| vaddr + (offset - off))
    }

    /// What framehop needs to unwind through this file.
    pub fn unwind_info(&self) -> framehop::ExplicitModuleSectionInfo<FileBytes> {
        let r = |n: &str| self.sections.get(n).map(|s| s.svma.clone());
        framehop::ExplicitModuleSectionInfo {
            base_svma: 0,
            text_svma: r(".text"),
            text: self.bytes(".text"),
            got_svma: r(".got"),
            eh_frame_svma: r(".eh_frame"),
            eh_frame: self.bytes(".eh_frame"),
            eh_frame_hdr_svma: r(".eh_frame_hdr"),
            eh_frame_hdr: self.bytes(".eh_frame_hdr"),
            debug_frame: self.bytes(".debug_frame"),
            stubs_svma: None,
            stub_helper_svma: None,
            unwind_info: None,
            text_segment_svma: None,
            text_segment: None,
        }
    }

    /// SVMAs of the named symbols (any kind), from `.symtab` and `.dynsym`.
    pub fn find_symbols(&self, names: &[&str]) -> HashMap<String, u64> {
        use object::ObjectSymbol;
        let mut out = HashMap::new();
        let Ok(file) = object::File::parse(&self.map[..]) else {
            return out;
        };
        for sym in file.symbols().chain(file.dynamic_symbols()) {
            if let Ok(n) = sym.name() {
                if sym.address() != 0 && names.contains(&n) {
                    out.entry(n.to_string()).or_insert(sym.address());
                }
            }
        }
        out
    }

    /// The SVMA of a section, if present (e.g. `.PyRuntime`).
    pub fn section_address(&self, name: &str) -> Option<u64> {
        let file = object::File::parse(&self.map[..]).ok()?;
        file.section_by_name(name).map(|s| s.address())
    }
}

/// Files keyed by (device, inode) as `/proc/PID/maps` reports them, so a path that names a
/// different file in another mount namespace is never confused with ours.
/// The kernel's vDSO image, as mapped into this process: every 64-bit process on the host maps
/// the same image, so it symbolizes and unwinds (`clock_gettime`, `gettimeofday`) for targets too.
pub fn vdso() -> Option<Arc<ElfFile>> {
    static VDSO: std::sync::OnceLock<Option<Arc<ElfFile>>> = std::sync::OnceLock::new();
    VDSO.get_or_init(|| {
        let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
        let m = super::super::process::maps::parse_maps(&maps)
            .into_iter()
            .find(|m| m.path == "[vdso]")?;
        let len = usize::try_from(m.end.checked_sub(m.start)?).ok()?;
        let mut copy = memmap2::MmapMut::map_anon(len).ok()?;
        // SAFETY: the [vdso] mapping of this process is readable for its whole length, which
        // /proc/self/maps just gave; it never changes or goes away.
        copy.copy_from_slice(unsafe { std::slice::from_raw_parts(m.start as *const u8, len) });
        let map = copy.make_read_only().ok()?;
        ElfFile::from_mmap(PathBuf::from("[vdso]"), Arc::new(map)).map(Arc::new)
    })
    .clone()
}

#[derive(Default)]
pub struct ElfCache {
    files: HashMap<(String, u64), Option<Arc<ElfFile>>>,
}

impl ElfCache {
    /// Opens the file a mapping of `pid` names, through the process's root so files inside
    /// containers are found, falling back to `map_files` for deleted files.
    pub fn get(
        &mut self,
        pid: u32,
        dev: &str,
        inode: u64,
        path: &Path,
        map_range: (u64, u64),
    ) -> Option<Arc<ElfFile>> {
        let key = (dev.to_string(), inode);
        if let Some(f) = self.files.get(&key) {
            return f.clone();
        }
        let rel = path.strip_prefix("/").unwrap_or(path);
        let candidates = [
            PathBuf::from(format!("/proc/{pid}/root")).join(rel),
            PathBuf::from(format!(
                "/proc/{pid}/map_files/{:x}-{:x}",
                map_range.0, map_range.1
            )),
            path.to_path_buf(),
        ];
        let file = candidates.iter().find_map(|p| {
            let mut f = ElfFile::open(p)?;
            f.path = path.to_path_buf();
            Some(Arc::new(f))
        });
        self.files.insert(key, file.clone());
        file
    }
}
