//! The kernel's symbols, kept for the boot: reading `/proc/kallsyms` has the kernel format every
//! symbol it has (120k-200k lines), about 40 ms of CPU at each start, for a table that does not
//! change until the next boot or a module load. So the first run of a boot keeps the stable part
//! of it (`KernelSymbols::stable`: the kernel's and its modules' text) in a root-only file, and
//! later runs load that instead, while the boot id and `/proc/modules` are what they were then.
//! An address outside that part (a BPF program, an ftrace trampoline: code made since boot) has
//! the whole table read again (`Collector::kernel_frame`).
//!
//! The file is root's, in a directory of root's (`/run/tachyon-bpf`, a tmpfs gone at reboot):
//! both are opened without following links, and used only when they belong to this user and
//! nobody else can write to them; the file is read with a bound and checked whole
//! (`KernelSymbols::from_bytes`). Anything else is ignored, and the table comes from the kernel.

use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::stack::symbols::KernelSymbols;

/// The directory of the cache (`TACHYON_BPF_CACHE_DIR` moves it: tests use it).
pub const DEFAULT_DIR: &str = "/run/tachyon-bpf";
const FILE: &str = "kallsyms";
/// Far above any kernel's table (about 5 MiB for 120k symbols).
const MAX_FILE: u64 = 128 << 20;
const MAX_MODULES: u64 = 16 << 20;
/// A table with fewer symbols than this is not a kernel's (`kptr_restrict` hid the addresses).
const MIN_SYMBOLS: usize = 1000;

/// Where a run's kernel symbols came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The boot's cache.
    Cache,
    /// `/proc/kallsyms`, and the cache was written from it.
    KallsymsCached,
    /// `/proc/kallsyms` (no cache could be read or written; why is in the string).
    Kallsyms(&'static str),
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Cache => write!(f, "from the boot's cache"),
            Source::KallsymsCached => write!(f, "from /proc/kallsyms (cached for this boot)"),
            Source::Kallsyms(why) => write!(f, "from /proc/kallsyms ({why})"),
        }
    }
}

pub fn cache_dir() -> PathBuf {
    std::env::var_os("TACHYON_BPF_CACHE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_DIR))
}

/// The kernel's symbols: from the boot's cache when it is there and valid, else from
/// `/proc/kallsyms` (and then the cache is written).
pub fn load() -> (KernelSymbols, Source) {
    load_in(&cache_dir())
}

pub fn load_in(dir: &Path) -> (KernelSymbols, Source) {
    // No module support: no file, and nothing can change.
    let modules = read_bounded(Path::new("/proc/modules"), MAX_MODULES).unwrap_or_default();
    let Some(key) = boot_key(&modules) else {
        return (KernelSymbols::load(), Source::Kallsyms("no boot id"));
    };
    let dirfd = match open_own_dir(dir, true) {
        Ok(d) => d,
        Err(why) => return (KernelSymbols::load(), Source::Kallsyms(why)),
    };
    if let Some(bytes) = read_own_file(&dirfd) {
        if let Some(k) = KernelSymbols::from_bytes(&bytes, &key) {
            if k.len() >= MIN_SYMBOLS {
                return (k, Source::Cache);
            }
        }
    }
    let whole = KernelSymbols::load();
    if whole.len() < MIN_SYMBOLS {
        return (whole, Source::Kallsyms("too few symbols to keep"));
    }
    let Some(stable) = whole.stable(&String::from_utf8_lossy(&modules)) else {
        return (whole, Source::Kallsyms("no kernel text bounds"));
    };
    let path = dir.join(FILE);
    match crate::files::write_atomic(&path, &stable.to_bytes(&key), 0o600) {
        Ok(()) => (whole, Source::KallsymsCached),
        Err(_) => (whole, Source::Kallsyms("the cache could not be written")),
    }
}

/// What a cached table is valid for: this boot, with these modules at these addresses.
fn boot_key(modules: &[u8]) -> Option<Vec<u8>> {
    let boot = read_bounded(Path::new("/proc/sys/kernel/random/boot_id"), 4096)?;
    if boot.len() < 16 {
        return None;
    }
    let mut key = boot;
    key.push(b'\n');
    key.extend_from_slice(modules);
    Some(key)
}

fn read_bounded(path: &Path, max: u64) -> Option<Vec<u8>> {
    let f = std::fs::File::open(path).ok()?;
    let mut out = Vec::new();
    f.take(max).read_to_end(&mut out).ok()?;
    Some(out)
}

/// Whether a file or directory is this user's and nobody else can write to it.
fn own(st: &std::fs::Metadata) -> bool {
    // SAFETY: no preconditions.
    let euid = unsafe { libc::geteuid() };
    st.uid() == euid && st.mode() & 0o022 == 0
}

/// The cache's directory, opened without following a link, and only if it is this user's and
/// private (`create`: made, mode 0700, when it is not there).
fn open_own_dir(dir: &Path, create: bool) -> Result<OwnedFd, &'static str> {
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).map_err(|_| "a bad cache path")?;
    let open = || {
        // SAFETY: a NUL-terminated path; the returned descriptor is owned below.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        };
        // SAFETY: a fresh descriptor that nothing else owns.
        (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) })
    };
    let fd = match open() {
        Some(fd) => fd,
        None if create => {
            // SAFETY: a NUL-terminated path.
            if unsafe { libc::mkdir(c.as_ptr(), 0o700) } != 0 {
                return Err("no cache directory");
            }
            open().ok_or("no cache directory")?
        }
        None => return Err("no cache directory"),
    };
    let st = std::fs::File::from(fd.try_clone().map_err(|_| "no cache directory")?)
        .metadata()
        .map_err(|_| "no cache directory")?;
    if !own(&st) {
        return Err("the cache directory is not root's alone");
    }
    Ok(fd)
}

/// The cache file in `dir`, if it is a regular file of this user's that nobody else can write,
/// read without following a link, without blocking, and with a bound.
fn read_own_file(dir: &OwnedFd) -> Option<Vec<u8>> {
    let name = std::ffi::CString::new(FILE).ok()?;
    // SAFETY: valid descriptor and name; the descriptor is owned below.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            name.as_ptr(),
            libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return None;
    }
    // SAFETY: a fresh descriptor that nothing else owns.
    let f = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    let st = f.metadata().ok()?;
    if !st.file_type().is_file() || !own(&st) || st.len() > MAX_FILE {
        return None;
    }
    let mut out = Vec::with_capacity(st.len() as usize);
    f.take(MAX_FILE).read_to_end(&mut out).ok()?;
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A second load in the same directory comes from the cache and names what the first did;
    /// a file that is not a table for this boot is ignored and replaced.
    #[test]
    fn the_second_load_of_a_boot_comes_from_the_cache() {
        // SAFETY: no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            panic!("this test reads /proc/kallsyms's addresses: run it as root");
        }
        let dir = std::env::temp_dir().join(format!("ksyms-cache-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (first, s1) = load_in(&dir);
        assert_eq!(s1, Source::KallsymsCached);
        let (second, s2) = load_in(&dir);
        assert_eq!(s2, Source::Cache);
        // Every text symbol of the kernel's own (no `[module]` after it) is known to the copy,
        // and named as the whole table names it.
        let text = std::fs::read_to_string("/proc/kallsyms").unwrap();
        let mut checked = 0;
        for line in text.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() != 3 || !matches!(f[1], "t" | "T" | "w" | "W") {
                continue;
            }
            let addr = u64::from_str_radix(f[0], 16).unwrap();
            assert!(second.knows(addr), "{line}");
            assert_eq!(second.lookup(addr), first.lookup(addr), "{line}");
            checked += 1;
        }
        assert!(checked >= MIN_SYMBOLS, "{checked} kernel text symbols");
        // The cache directory is private.
        let st = std::fs::metadata(&dir).unwrap();
        assert_eq!(st.mode() & 0o777, 0o700);
        // A file that is not a table: read from the kernel again, and the file replaced.
        std::fs::write(dir.join(FILE), b"not a table").unwrap();
        assert_eq!(load_in(&dir).1, Source::KallsymsCached);
        assert_eq!(load_in(&dir).1, Source::Cache);
        // A link in the file's place is not followed.
        let real = dir.join("real");
        std::fs::rename(dir.join(FILE), &real).unwrap();
        std::os::unix::fs::symlink(&real, dir.join(FILE)).unwrap();
        assert_ne!(load_in(&dir).1, Source::Cache);
        // A directory others can write to is not used.
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o777))
            .unwrap();
        assert_eq!(
            load_in(&dir).1,
            Source::Kallsyms("the cache directory is not root's alone")
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
