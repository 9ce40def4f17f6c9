//! `/proc/PID/maps` parsing.

use std::path::PathBuf;
use std::sync::Arc;

use crate::stack::elf::ElfFile;

/// One line of `/proc/PID/maps`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    pub offset: u64,
    pub exec: bool,
    pub inode: u64,
    pub dev: String,
    /// The path as the target sees it (`[vdso]`, `[stack]` and empty for anonymous mappings).
    pub path: String,
}

impl Mapping {
    pub fn is_file(&self) -> bool {
        self.inode != 0 && self.path.starts_with('/')
    }

    /// The file without a `(deleted)` suffix.
    pub fn file_path(&self) -> PathBuf {
        PathBuf::from(self.path.trim_end_matches(" (deleted)"))
    }
}

pub fn parse_maps(text: &str) -> Vec<Mapping> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<Mapping> {
    let mut it = line.splitn(6, ' ');
    let range = it.next()?;
    let perms = it.next()?;
    let offset = u64::from_str_radix(it.next()?, 16).ok()?;
    let dev = it.next()?.to_string();
    let inode = it.next()?.parse().ok()?;
    let path = it.next().unwrap_or("").trim_start().to_string();
    let (s, e) = range.split_once('-')?;
    Some(Mapping {
        start: u64::from_str_radix(s, 16).ok()?,
        end: u64::from_str_radix(e, 16).ok()?,
        offset,
        exec: perms.as_bytes().get(2) == Some(&b'x'),
        inode,
        dev,
        path,
    })
}

/// The most of a process's `maps` read: 65,530 mappings (the kernel's default limit) of
/// about 150 bytes each, with room; past it the rest is left unread.
pub const MAPS_MAX: u64 = 16 << 20;

/// The process's mappings (at most `MAPS_MAX` bytes of its `maps`).
pub fn read_maps(pid: u32) -> std::io::Result<Vec<Mapping>> {
    Ok(parse_maps(&maps_text(pid)?))
}

/// The process's `maps` as text, at most `MAPS_MAX` bytes of it.
pub fn maps_text(pid: u32) -> std::io::Result<String> {
    use std::io::Read;
    let mut s = String::new();
    std::fs::File::open(format!("/proc/{pid}/maps"))?
        .take(MAPS_MAX)
        .read_to_string(&mut s)?;
    Ok(s)
}

/// The kernel's vDSO image, as mapped into this process: every 64-bit process on the host maps
/// the same image, so it symbolizes and unwinds (`clock_gettime`, `gettimeofday`) for targets too.
pub fn vdso() -> Option<Arc<ElfFile>> {
    static VDSO: std::sync::OnceLock<Option<Arc<ElfFile>>> = std::sync::OnceLock::new();
    VDSO.get_or_init(|| {
        let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
        let m = parse_maps(&maps).into_iter().find(|m| m.path == "[vdso]")?;
        let len = usize::try_from(m.end.checked_sub(m.start)?).ok()?;
        let mut copy = memmap2::MmapMut::map_anon(len).ok()?;
        // SAFETY: the [vdso] mapping of this process is readable for its whole length, which
        // /proc/self/maps just gave; it never changes or goes away.
        copy.copy_from_slice(unsafe { std::slice::from_raw_parts(m.start as *const u8, len) });
        let map = copy.make_read_only().ok()?;
        ElfFile::from_mmap(PathBuf::from("[vdso]"), Arc::new(map), &[]).map(Arc::new)
    })
    .clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_lines() {
        let m = parse_maps(
            "55d0c0a00000-55d0c0a01000 r--p 00000000 fe:01 1234 /usr/bin/python3.11\n\
             7f0000001000-7f0000002000 r-xp 00001000 fe:01 99 /lib/x86_64-linux-gnu/libc.so.6 (deleted)\n\
             7ffd1000-7ffd2000 rw-p 00000000 00:00 0                          [stack]\n",
        );
        assert_eq!(m.len(), 3);
        assert!(!m[0].exec && m[1].exec);
        assert_eq!(m[1].offset, 0x1000);
        assert_eq!(
            m[1].file_path(),
            PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6")
        );
        assert_eq!(m[2].path, "[stack]");
        assert!(!m[2].is_file());
    }
}
