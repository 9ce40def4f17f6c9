//! Mapped ELF files: symbols, unwind sections and load segments, cached per file so every process
//! that maps the same library shares one copy.

use std::collections::HashMap;
use std::fs::File;
use std::ops::{Deref, Range};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

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
    /// Built on first use (`symbols`): finding a new process's runtime needs a few of them
    /// only, and a large library's table takes milliseconds while its first samples wait.
    symbols: OnceLock<SymbolTable>,
    /// The functions whose unwind rules are evaluated here rather than by framehop
    /// (`process::unwind::cfi::own_rule_ranges`), found on first use.
    pub(crate) own_rules: OnceLock<Vec<(u64, u64)>>,
    /// Functions whose split-off parts are named (see `from_mmap`).
    split: &'static [&'static str],
    /// A separate debug file opened for this one (see `debug_file`), read with the symbols.
    debug: Mutex<Option<File>>,
    /// `find_symbols`' answers, by the names asked. A process that maps a runtime and has not
    /// started it (a debugger, an editor's plugin host) is looked at again on every scan, and
    /// a search of a large `.symtab` takes about a millisecond.
    found: Mutex<Vec<(Vec<String>, FoundSymbols)>>,
    /// The ELF entry point (SVMA): where a program, or the dynamic loader, starts.
    pub entry: u64,
    /// (p_vaddr, p_offset, p_filesz) of each segment.
    pub segments: Vec<(u64, u64, u64)>,
    sections: HashMap<&'static str, SectionRef>,
    /// How a stripped file (no `.symtab` of its own) names its separate debug file: its GNU build
    /// id and its `.gnu_debuglink` (file name and CRC-32).
    stripped: Option<DebugLinks>,
    /// Its GNU build id in hex, for the formats that carry one (pprof, OTLP).
    pub build_id: Option<Arc<str>>,
}

const UNWIND_SECTIONS: [&str; 5] = [
    ".text",
    ".eh_frame",
    ".eh_frame_hdr",
    ".got",
    ".debug_frame",
];

/// SVMAs by symbol name, as `find_symbols` answers.
type FoundSymbols = HashMap<String, u64>;

/// `find_symbols` answers kept per file.
const FOUND_MEMO: usize = 8;

/// Largest file mapped for symbols and unwind tables (a target could name anything).
const MAX_ELF_BYTES: u64 = 4 << 30;

/// Opens `rel` inside the directory `root` as if `root` were `/` (`openat2` with
/// `RESOLVE_IN_ROOT`: absolute symlinks and `..` stay inside), never following a final link or
/// a /proc magic link, without blocking (a FIFO planted at the path cannot hang the profiler).
fn open_in_root(root: &File, rel: &Path) -> std::io::Result<File> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(rel.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::other("NUL in path"))?;
    // SAFETY: an all-zero open_how is valid; the fields are set below.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOFOLLOW | libc::O_CLOEXEC) as u64;
    how.resolve = libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS;
    // SAFETY: openat2 reads the path and the open_how of the size given; the descriptor it
    // returns is owned below.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            root.as_raw_fd(),
            c.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor that nothing else owns.
    Ok(File::from(unsafe { OwnedFd::from_raw_fd(fd as i32) }))
}

/// Whether an opened file is a regular file of a sane size and, when `want` is given, the
/// inode a maps line names. Only the inode is compared: overlay file systems show the underlying
/// device in the maps and their own in `stat`, and the path was resolved inside the process's
/// own root, so it cannot name a host file whatever the device.
fn plausible(f: &File, inode: Option<u64>) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(m) = f.metadata() else {
        return false;
    };
    m.file_type().is_file() && m.len() <= MAX_ELF_BYTES && inode.is_none_or(|i| m.ino() == i)
}

/// Opens the file behind a mapping of `pid`, as safely as a target allows: first
/// `/proc/PID/map_files/START-END`, the mapped file itself whatever its path now names (needs
/// CAP_SYS_ADMIN); else the path the maps give, resolved inside the process's root (containers)
/// and checked to be the mapped inode. Never the host's file at the same path, never through a
/// final symlink, never a FIFO or device, and never a blocking open.
pub fn open_mapped(pid: u32, inode: u64, path: &Path, map_range: (u64, u64)) -> Option<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let exact = format!("/proc/{pid}/map_files/{:x}-{:x}", map_range.0, map_range.1);
    if let Ok(f) = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&exact)
    {
        if plausible(&f, None) {
            return Some(f);
        }
    }
    let root = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY)
        .open(format!("/proc/{pid}/root"))
        .ok()?;
    let rel = path.strip_prefix("/").unwrap_or(path);
    let f = open_in_root(&root, rel).ok()?;
    plausible(&f, Some(inode)).then_some(f)
}

impl ElfFile {
    /// Whether `svma` is among the first instructions at the file's entry point, where a
    /// program (or the dynamic loader, while it relocates) starts: code with no CFI and, in a
    /// stripped ld.so, no symbol (its `_start` calls `_dl_start` 3 bytes in).
    pub fn at_entry(&self, svma: u64) -> bool {
        self.entry != 0 && svma >= self.entry && svma < self.entry + 16
    }

    /// An ELF file from an open descriptor (`path` names it in the profile); `split` as in
    /// `from_mmap`.
    pub fn from_file(path: &Path, f: File, split: &'static [&'static str]) -> Option<ElfFile> {
        use std::os::unix::fs::MetadataExt;
        let m = f.metadata().ok()?;
        let map = if m.uid() == 0 && m.mode() & 0o022 == 0 {
            // SAFETY: the file is mapped read-only, and only root can write it: no other user
            // can truncate it under the mapping (which would fault this process).
            unsafe { Mmap::map(&f) }.ok()?
        } else {
            // Someone else may write this file (a target's own library): a copy, so that a
            // truncation cannot fault the profiler.
            let len = usize::try_from(m.len()).ok()?.min(MAX_ELF_BYTES as usize);
            let mut copy = memmap2::MmapMut::map_anon(len.max(1)).ok()?;
            let mut f = f;
            std::io::Read::read_exact(&mut f, &mut copy[..len]).ok()?;
            copy.make_read_only().ok()?
        };
        ElfFile::from_mmap(path.to_path_buf(), Arc::new(map), split)
    }

    /// Parses a mapped ELF file; the parts of the functions named `split` that the compiler
    /// moved out of them are named too (`split::split_parts`).
    pub fn from_mmap(
        path: PathBuf,
        map: Arc<Mmap>,
        split: &'static [&'static str],
    ) -> Option<ElfFile> {
        let file = object::File::parse(&map[..]).ok()?;
        let segments = load_segments(&file);
        let entry = object::Object::entry(&file);
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
        let build_id: Option<Arc<str>> = file.build_id().ok().flatten().map(|b| {
            b.iter()
                .map(|x| format!("{x:02x}"))
                .collect::<String>()
                .into()
        });
        let stripped =
            file.section_by_name(".symtab")
                .is_none()
                .then(|| DebugLinks {
                    build_id: file.build_id().ok().flatten().map(<[u8]>::to_vec),
                    debuglink: file.gnu_debuglink().ok().flatten().and_then(|(name, crc)| {
                        Some((String::from_utf8(name.to_vec()).ok()?, crc))
                    }),
                });
        Some(ElfFile {
            path,
            map,
            symbols: OnceLock::new(),
            own_rules: OnceLock::new(),
            split,
            debug: Mutex::new(None),
            found: Mutex::new(Vec::new()),
            entry,
            segments,
            sections,
            stripped,
            build_id,
        })
    }

    /// The file's symbols (with those of its separate debug file, if one was found).
    pub fn symbols(&self) -> &SymbolTable {
        self.symbols.get_or_init(|| {
            let Ok(file) = object::File::parse(&self.map[..]) else {
                return SymbolTable::default();
            };
            let symbols = SymbolTable::from_elf(&file);
            let parts = super::split::split_parts(&file, &symbols, self.split);
            let symbols = symbols.with_parts(parts);
            let debug = self.debug.lock().ok().and_then(|mut d| d.take());
            let symbols = match (debug, &self.stripped) {
                (Some(f), Some(links)) => match debug_symbols(f, links) {
                    Some(d) => symbols.merged(d),
                    None => symbols,
                },
                _ => symbols,
            };
            match self
                .stripped
                .is_some()
                .then(|| mini_debug_info(&file))
                .flatten()
            {
                Some(d) => symbols.merged(d),
                None => symbols,
            }
        })
    }

    fn bytes(&self, name: &str) -> Option<FileBytes> {
        self.sections.get(name).map(|s| FileBytes {
            map: self.map.clone(),
            range: s.file.clone(),
        })
    }

    /// A section's bytes and SVMA, for the unwind sections this file keeps (`UNWIND_SECTIONS`).
    pub(crate) fn section_data(&self, name: &str) -> Option<(&[u8], u64)> {
        let s = self.sections.get(name)?;
        Some((self.map.get(s.file.clone())?, s.svma.start))
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

    /// SVMAs of the named symbols (any kind), from `.dynsym`, then `.symtab` for those missing.
    pub fn find_symbols(&self, names: &[&str]) -> HashMap<String, u64> {
        let mut found = self.found.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, out)) = found
            .iter()
            .find(|(asked, _)| asked.iter().eq(names.iter()))
        {
            return out.clone();
        }
        let out = self.search_symbols(names);
        // A handful of distinct questions are ever asked of one file.
        if found.len() < FOUND_MEMO {
            found.push((names.iter().map(|n| n.to_string()).collect(), out.clone()));
        }
        out
    }

    /// `find_symbols` without the memo.
    fn search_symbols(&self, names: &[&str]) -> HashMap<String, u64> {
        use object::ObjectSymbol;
        let mut out = HashMap::new();
        let Ok(file) = object::File::parse(&self.map[..]) else {
            return out;
        };
        // The exported symbols first: a runtime's are there, and `.dynsym` is a fraction of
        // `.symtab` (which a new process's discovery would otherwise wait for).
        for sym in file.dynamic_symbols() {
            if let Ok(n) = sym.name() {
                if sym.address() != 0 && names.contains(&n) {
                    out.entry(n.to_string()).or_insert(sym.address());
                }
            }
        }
        if out.len() == names.len() {
            return out;
        }
        for sym in file.symbols() {
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
        self.section_range(name).map(|r| r.0)
    }

    /// The address and size of section `name`, as linked.
    pub fn section_range(&self, name: &str) -> Option<(u64, u64)> {
        let file = object::File::parse(&self.map[..]).ok()?;
        file.section_by_name(name).map(|s| (s.address(), s.size()))
    }
}

/// Files keyed by (device, inode) as `/proc/PID/maps` reports them, so a path that names a
/// different file in another mount namespace is never confused with ours.
pub struct ElfCache {
    files: HashMap<(String, u64), Option<Arc<ElfFile>>>,
    /// Functions whose split-off parts are named in every file (see `ElfFile::from_mmap`).
    split: &'static [&'static str],
}

impl ElfCache {
    pub fn new(split: &'static [&'static str]) -> ElfCache {
        ElfCache {
            files: HashMap::new(),
            split,
        }
    }

    /// Opens the file a mapping of `pid` names ([`open_mapped`]) and parses it, once per
    /// device and inode.
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
        let file = open_mapped(pid, inode, path, map_range)
            .and_then(|f| ElfFile::from_file(path, f, self.split))
            .map(|f| {
                // Opened now, while the process (and its root) is there; read with the symbols.
                if let Some(debug) = f
                    .stripped
                    .as_ref()
                    .and_then(|links| debug_file(pid, path, links))
                {
                    if let Ok(mut d) = f.debug.lock() {
                        *d = Some(debug);
                    }
                }
                Arc::new(f)
            });
        self.files.insert(key, file.clone());
        file
    }
}

/// Largest separate debug file read (they hold DWARF as well as the symbols).
const MAX_DEBUG_BYTES: u64 = 1 << 30;

/// How a stripped file names its separate debug file.
#[derive(Debug)]
struct DebugLinks {
    build_id: Option<Vec<u8>>,
    /// `.gnu_debuglink`: the debug file's name and the CRC-32 of its contents.
    debuglink: Option<(String, u32)>,
}

/// A stripped file's separate debug file, where distributions install them, looked up inside
/// the process's root like the file itself (a container's own debug files name its own
/// libraries): by build id (`/usr/lib/debug/.build-id/xx/yyyy.debug`, Debian's `*-dbg` and
/// `*-dbgsym` packages), then by `.gnu_debuglink` name in `/usr/lib/debug/DIR/`, `DIR/.debug/`
/// and `DIR/`, as GDB looks. Its symbols are used only when it is the file's (`debug_symbols`).
fn debug_file(pid: u32, path: &Path, links: &DebugLinks) -> Option<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut candidates = Vec::new();
    if let Some(id) = links.build_id.as_deref().filter(|b| b.len() >= 2) {
        let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
        candidates.push(format!(
            "usr/lib/debug/.build-id/{}/{}.debug",
            &hex[..2],
            &hex[2..]
        ));
    }
    if let Some((name, _)) = &links.debuglink {
        // A bare file name; anything else is not a link we follow.
        let dir = path.parent().and_then(Path::to_str).unwrap_or("/");
        let dir = dir.trim_start_matches('/');
        if !name.is_empty() && !name.contains('/') && name != ".." {
            candidates.push(format!("usr/lib/debug/{dir}/{name}"));
            candidates.push(format!("{dir}/.debug/{name}"));
            if Some(name.as_str()) != path.file_name().and_then(|n| n.to_str()) {
                candidates.push(format!("{dir}/{name}"));
            }
        }
    }
    let root = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY)
        .open(format!("/proc/{pid}/root"))
        .ok()?;
    candidates.into_iter().find_map(|rel| {
        let f = open_in_root(&root, Path::new(&rel)).ok()?;
        let m = f.metadata().ok()?;
        (m.file_type().is_file() && m.len() <= MAX_DEBUG_BYTES).then_some(f)
    })
}

/// The symbols of a debug file `debug_file` opened, if it is the one `links` names: the same
/// build id where the file has one, else the CRC-32 its debug link records.
fn debug_symbols(f: File, links: &DebugLinks) -> Option<SymbolTable> {
    let elf = ElfFile::from_file(Path::new("debug file"), f, &[])?;
    let parsed = object::File::parse(&elf.map[..]).ok()?;
    let matches = match (&links.build_id, &links.debuglink) {
        (Some(id), _) => parsed.build_id().ok().flatten() == Some(id.as_slice()),
        (None, Some((_, crc))) => crc32fast::hash(&elf.map[..]) == *crc,
        (None, None) => false,
    };
    matches.then(|| SymbolTable::from_elf(&parsed))
}

/// Largest decompressed MiniDebugInfo read (it holds a symbol table only).
const MAX_MINI_DEBUG_BYTES: u64 = 64 << 20;

/// The symbols of a file's MiniDebugInfo (`.gnu_debugdata`: an xz-compressed ELF holding the
/// `.symtab` of functions the stripped file no longer names), as Fedora and others ship it.
fn mini_debug_info(file: &object::File) -> Option<SymbolTable> {
    let data = file.section_by_name(".gnu_debugdata")?.data().ok()?;
    let mut out = Vec::new();
    // The decoder's window grows with what it writes, so bounding the output bounds it too.
    let mut limited = LimitedWriter {
        out: &mut out,
        left: MAX_MINI_DEBUG_BYTES,
    };
    lzma_rs::xz_decompress(&mut std::io::BufReader::new(data), &mut limited).ok()?;
    let inner = object::File::parse(&out[..]).ok()?;
    Some(SymbolTable::from_elf(&inner))
}

/// A writer that refuses to grow past a bound (a decompression bomb ends with an error).
struct LimitedWriter<'a> {
    out: &'a mut Vec<u8>,
    left: u64,
}

impl std::io::Write for LimitedWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if buf.len() as u64 > self.left {
            return Err(std::io::Error::other("MiniDebugInfo too large"));
        }
        self.left -= buf.len() as u64;
        self.out.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// `.eh_frame` as the target architecture's vendor extensions read it (arm64's
/// `DW_CFA_AARCH64_negate_ra_state` is an error otherwise).
pub fn eh_frame(bytes: &[u8]) -> gimli::EhFrame<gimli::EndianSlice<'_, gimli::LittleEndian>> {
    let mut eh = gimli::EhFrame::new(bytes, gimli::LittleEndian);
    if cfg!(target_arch = "aarch64") {
        eh.set_vendor(gimli::Vendor::AArch64);
    }
    eh
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn symbol_searches_are_remembered_by_the_names_asked() {
        let exe = std::env::current_exe().unwrap();
        let elf = ElfFile::from_file(&exe, File::open(&exe).unwrap(), &[]).unwrap();
        let first = elf.find_symbols(&["main", "no_such_symbol_here"]);
        assert!(first.get("main").is_some_and(|&a| a != 0), "{first:?}");
        assert!(!first.contains_key("no_such_symbol_here"));
        // Asked again: the same answer; other names: their own answer, not the one kept.
        assert_eq!(elf.find_symbols(&["main", "no_such_symbol_here"]), first);
        assert!(elf.find_symbols(&["no_such_symbol_here"]).is_empty());
        assert_eq!(elf.find_symbols(&["main"]), elf.search_symbols(&["main"]));
        assert_eq!(elf.found.lock().unwrap().len(), 3);
    }
}
