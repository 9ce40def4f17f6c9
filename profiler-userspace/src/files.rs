//! Writing files as root in directories other users may control.
//!
//! The profiler runs as root beside other users, and its output directory may belong to one of
//! them (or be `/tmp`). So:
//! - a file is written under a temporary name nobody can guess (128 random bits), created with
//!   `O_CREAT|O_EXCL|O_NOFOLLOW` relative to a descriptor of its directory, so nothing planted
//!   there (a symlink, a file of someone else's) is ever opened; then it is renamed over the
//!   final name, which replaces whatever entry is there and never writes through it;
//! - an existing final name that is not a regular file is refused: a device (`-o /dev/null`), a
//!   FIFO, a socket, a directory, and a symbolic link (the rule: tachyon-bpf does not write
//!   through links; name the file itself, or `-o -` for standard output);
//! - a directory that other users can write to is refused unless it is sticky (as `/tmp` is);
//! - writability is probed with an unnamed `O_TMPFILE`, never a named file;
//! - temporary files a killed run left behind (its pid is in their name and gone) are removed by
//!   the next run that writes the same name, if they are regular files owned by this user;
//! - run by `sudo`, what is written belongs to the user who ran it (`SUDO_UID`, `SUDO_GID`:
//!   `set_owner`), still with the mode asked for, so that they can open their profile.

use std::ffi::{CString, OsStr};
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Who the files written belong to, when not this process's user (`set_owner`).
static OWNER: std::sync::OnceLock<(u32, u32)> = std::sync::OnceLock::new();

/// From now on, files and directories written belong to `uid`:`gid` (once per process).
pub fn set_owner(uid: u32, gid: u32) {
    let _ = OWNER.set((uid, gid));
}

/// Gives `fd` (a file or directory just made) to the owner `set_owner` named, if any.
fn give(fd: &impl AsRawFd) -> std::io::Result<()> {
    if let Some(&(uid, gid)) = OWNER.get() {
        // SAFETY: a valid descriptor.
        if unsafe { libc::fchown(fd.as_raw_fd(), uid, gid) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// `-o -`: the profile goes to standard output.
pub fn is_stdout(path: &Path) -> bool {
    path.as_os_str() == "-"
}

fn cstr(s: &OsStr) -> std::io::Result<CString> {
    CString::new(s.as_bytes()).map_err(|_| std::io::Error::other("the name contains a NUL byte"))
}

/// The directory of `path` and the file's name in it.
fn split(path: &Path) -> std::io::Result<(&Path, &OsStr)> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::other("names no file"))?;
    Ok((dir, name))
}

/// Opens a directory (the path to it is the user's choice, symlinks included).
fn open_dir(dir: &Path) -> std::io::Result<OwnedFd> {
    let c = cstr(dir.as_os_str())?;
    // SAFETY: a NUL-terminated path; the returned descriptor is owned below.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn fstatat(dirfd: &OwnedFd, name: &CString) -> std::io::Result<Option<libc::stat>> {
    // SAFETY: an all-zero stat is a valid value for fstatat to fill.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid descriptor, NUL-terminated name, and a stat buffer of the right type.
    let r = unsafe {
        libc::fstatat(
            dirfd.as_raw_fd(),
            name.as_ptr(),
            &mut st,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if r == 0 {
        return Ok(Some(st));
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::ENOENT) {
        Ok(None)
    } else {
        Err(e)
    }
}

/// Refuses a directory that other users may write to, unless it is sticky.
fn check_dir(dirfd: &OwnedFd) -> std::io::Result<()> {
    // SAFETY: as in `fstatat`.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a valid descriptor and stat buffer.
    if unsafe { libc::fstat(dirfd.as_raw_fd(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if st.st_mode & 0o022 != 0 && st.st_mode & libc::S_ISVTX == 0 {
        return Err(std::io::Error::other(format!(
            "its directory is writable by other users and not sticky (mode {:o}): choose a \
             directory only you can write to",
            st.st_mode & 0o7777
        )));
    }
    Ok(())
}

/// Refuses an existing entry at the final name that is not a regular file.
fn check_target(dirfd: &OwnedFd, name: &CString) -> std::io::Result<()> {
    let Some(st) = fstatat(dirfd, name)? else {
        return Ok(());
    };
    match st.st_mode & libc::S_IFMT {
        libc::S_IFREG => Ok(()),
        libc::S_IFDIR => Err(std::io::Error::other("is a directory")),
        libc::S_IFLNK => Err(std::io::Error::other(
            "is a symbolic link, and tachyon-bpf does not write through links: name the file \
             itself (or -o - for standard output)",
        )),
        _ => Err(std::io::Error::other(
            "is not a regular file (a device, FIFO or socket), and tachyon-bpf only replaces \
             regular files (-o - writes to standard output)",
        )),
    }
}

/// Checks early that `path` can be written, so a long run never ends in a lost profile. Creates
/// no named file.
pub fn check_writable(path: &Path) -> std::io::Result<()> {
    if is_stdout(path) {
        return Ok(());
    }
    let (dir, name) = split(path)?;
    let dirfd = open_dir(dir)?;
    check_target(&dirfd, &cstr(name)?)?;
    check_dir(&dirfd)?;
    let dot = cstr(OsStr::new("."))?;
    // SAFETY: valid descriptor and name; O_TMPFILE creates an unnamed file, closed at once.
    let fd = unsafe {
        libc::openat(
            dirfd.as_raw_fd(),
            dot.as_ptr(),
            libc::O_TMPFILE | libc::O_WRONLY | libc::O_CLOEXEC,
            0o600,
        )
    };
    if fd >= 0 {
        // SAFETY: a fresh descriptor that nothing else owns.
        drop(unsafe { OwnedFd::from_raw_fd(fd) });
        return Ok(());
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        // File systems without O_TMPFILE: ask the kernel instead.
        Some(libc::EOPNOTSUPP) | Some(libc::EISDIR) | Some(libc::EINVAL) => {
            // SAFETY: valid descriptor and name.
            let r = unsafe {
                libc::faccessat(
                    dirfd.as_raw_fd(),
                    dot.as_ptr(),
                    libc::W_OK | libc::X_OK,
                    libc::AT_EACCESS,
                )
            };
            if r == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        }
        _ => Err(e),
    }
}

/// Writes `bytes` to `path` atomically with permissions `mode` (see the module's rules), or to
/// standard output for `-`.
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    if is_stdout(path) {
        let mut out = std::io::stdout().lock();
        out.write_all(bytes)?;
        return out.flush();
    }
    let (dir, name) = split(path)?;
    let dirfd = open_dir(dir)?;
    let cname = cstr(name)?;
    check_target(&dirfd, &cname)?;
    check_dir(&dirfd)?;
    remove_stale(&dirfd, name);
    let tmp = cstr(OsStr::new(&format!(
        ".{}.{}.{}.tmp",
        name.to_string_lossy(),
        std::process::id(),
        uuid::Uuid::new_v4().simple()
    )))?;
    // SAFETY: valid descriptor and name; the descriptor is owned below.
    let fd = unsafe {
        libc::openat(
            dirfd.as_raw_fd(),
            tmp.as_ptr(),
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            0o600,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor that nothing else owns.
    let mut f = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    let result = (|| {
        f.write_all(bytes)?;
        give(&f)?;
        f.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(mode & 0o777))?;
        f.sync_all()?;
        // SAFETY: valid descriptors and names.
        if unsafe {
            libc::renameat(
                dirfd.as_raw_fd(),
                tmp.as_ptr(),
                dirfd.as_raw_fd(),
                cname.as_ptr(),
            )
        } != 0
        {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    })();
    if result.is_err() {
        // SAFETY: valid descriptor and name; unlinkat never follows a link.
        unsafe { libc::unlinkat(dirfd.as_raw_fd(), tmp.as_ptr(), 0) };
    }
    result
}

/// The most files `write_dir_atomic` removes from the directory it replaces.
const MAX_OLD_FILES: usize = 100_000;

/// Checks early that the directory `path` can be written by `write_dir_atomic`.
pub fn check_dir_writable(path: &Path) -> std::io::Result<()> {
    let (dir, name) = split(path)?;
    let dirfd = open_dir(dir)?;
    check_dir_target(&dirfd, &cstr(name)?)?;
    check_dir(&dirfd)?;
    // The directory is created in `dir`: the same question as for a file.
    check_writable(&dir.join(".tachyon-bpf-probe"))
}

/// Refuses an existing entry at a directory output's name that is not a directory.
fn check_dir_target(dirfd: &OwnedFd, name: &CString) -> std::io::Result<()> {
    match fstatat(dirfd, name)? {
        Some(st) if st.st_mode & libc::S_IFMT == libc::S_IFLNK => Err(std::io::Error::other(
            "is a symbolic link, and tachyon-bpf does not write through links: name the              directory itself",
        )),
        Some(st) if st.st_mode & libc::S_IFMT != libc::S_IFDIR => {
            Err(std::io::Error::other("exists and is not a directory"))
        }
        _ => Ok(()),
    }
}

/// Writes `files` (plain names) as the directory `path`, atomically, by the module's rules: the
/// files go into a new directory under a temporary name (made with `mkdirat`, which fails
/// rather than use anything planted), which then takes the final name: renamed to it if it is
/// free, else exchanged with the directory there (`RENAME_EXCHANGE`), whose regular files are
/// then removed (never following a link) and the directory with them if that empties it.
/// Directories get `mode` with search bits where it has read bits.
pub fn write_dir_atomic(
    path: &Path,
    files: &[(String, Vec<u8>)],
    mode: u32,
) -> std::io::Result<()> {
    if is_stdout(path) {
        return Err(std::io::Error::other(
            "this format is a directory of pages and cannot go to standard output",
        ));
    }
    let (dir, name) = split(path)?;
    let dirfd = open_dir(dir)?;
    let cname = cstr(name)?;
    check_dir_target(&dirfd, &cname)?;
    check_dir(&dirfd)?;
    let tmp = cstr(OsStr::new(&format!(
        ".{}.{}.{}.tmp",
        name.to_string_lossy(),
        std::process::id(),
        uuid::Uuid::new_v4().simple()
    )))?;
    let mode = mode & 0o777;
    let dir_mode = mode | ((mode & 0o444) >> 2);
    // SAFETY: valid descriptor and name.
    if unsafe { libc::mkdirat(dirfd.as_raw_fd(), tmp.as_ptr(), 0o700) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let result = (|| {
        let sub = open_subdir(&dirfd, &tmp)?;
        for (file, bytes) in files {
            if file.contains('/') || file.starts_with('.') || file.is_empty() {
                return Err(std::io::Error::other(format!("bad page name {file:?}")));
            }
            let c = cstr(OsStr::new(file))?;
            // SAFETY: valid descriptor and name; the descriptor is owned below.
            let fd = unsafe {
                libc::openat(
                    sub.as_raw_fd(),
                    c.as_ptr(),
                    libc::O_WRONLY
                        | libc::O_CREAT
                        | libc::O_EXCL
                        | libc::O_NOFOLLOW
                        | libc::O_CLOEXEC,
                    0o600,
                )
            };
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            // SAFETY: a fresh descriptor that nothing else owns.
            let mut f = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
            f.write_all(bytes)?;
            give(&f)?;
            f.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(mode))?;
            f.sync_all()?;
        }
        give(&sub)?;
        // SAFETY: a valid descriptor.
        if unsafe { libc::fchmod(sub.as_raw_fd(), dir_mode) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let renamed = renameat2(&dirfd, &tmp, &cname, libc::RENAME_NOREPLACE);
        if renamed == 0 {
            return Ok(false);
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EEXIST) {
            return Err(e);
        }
        // An earlier directory of that name: checked again (it may have been swapped for a
        // link meanwhile; the exchange itself never follows one), then exchanged.
        check_dir_target(&dirfd, &cname)?;
        if renameat2(&dirfd, &tmp, &cname, libc::RENAME_EXCHANGE) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(true)
    })();
    // What is under the temporary name now (the new pages after a failure, the old directory
    // after an exchange) is removed: its regular files, then itself if that empties it.
    if !matches!(result, Ok(false)) {
        remove_flat_dir(&dirfd, &tmp);
    }
    result.map(|_| ())
}

/// `renameat2(2)` within one directory, by its system call: the C library's wrapper came in
/// glibc 2.28, and the released binary needs no glibc newer than 2.17 (the kernel has had the
/// call since 3.15). Safe: the descriptor is open and the names are NUL-terminated.
fn renameat2(dirfd: &OwnedFd, from: &CString, to: &CString, flags: libc::c_uint) -> libc::c_int {
    // SAFETY: a valid descriptor, two NUL-terminated names and the flags, as the call takes
    // them; it returns -1 with errno set on failure, as the wrapper does.
    unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            dirfd.as_raw_fd(),
            from.as_ptr(),
            dirfd.as_raw_fd(),
            to.as_ptr(),
            flags,
        ) as libc::c_int
    }
}

/// Opens the directory `name` in `dirfd`, never through a link.
fn open_subdir(dirfd: &OwnedFd, name: &CString) -> std::io::Result<OwnedFd> {
    // SAFETY: valid descriptor and name; the descriptor is owned below.
    let fd = unsafe {
        libc::openat(
            dirfd.as_raw_fd(),
            name.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Removes the regular files of the directory `name` in `dirfd`, then the directory if empty;
/// links are removed as links, subdirectories are left (and so is the directory then).
fn remove_flat_dir(dirfd: &OwnedFd, name: &CString) {
    let Ok(sub) = open_subdir(dirfd, name) else {
        return;
    };
    if let Ok(rd) = std::fs::read_dir(format!("/proc/self/fd/{}", sub.as_raw_fd())) {
        for e in rd.flatten().take(MAX_OLD_FILES) {
            let Ok(c) = cstr(&e.file_name()) else {
                continue;
            };
            // SAFETY: valid descriptor and name; without AT_REMOVEDIR, unlinkat removes
            // files and links only (a link itself, never its target).
            unsafe { libc::unlinkat(sub.as_raw_fd(), c.as_ptr(), 0) };
        }
    }
    // SAFETY: valid descriptor and name; fails harmlessly if the directory is not empty.
    unsafe { libc::unlinkat(dirfd.as_raw_fd(), name.as_ptr(), libc::AT_REMOVEDIR) };
}

/// Removes `.NAME.PID.*.tmp` files of runs that are gone (SIGKILL leaves them): regular files
/// owned by this user only, never following links.
fn remove_stale(dirfd: &OwnedFd, name: &OsStr) {
    let prefix = format!(".{}.", name.to_string_lossy());
    // Read the directory through its descriptor's /proc link, which names this very directory.
    let Ok(rd) = std::fs::read_dir(format!("/proc/self/fd/{}", dirfd.as_raw_fd())) else {
        return;
    };
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    for e in rd.flatten().take(100_000) {
        let entry = e.file_name().to_string_lossy().into_owned();
        let Some(rest) = entry.strip_prefix(&prefix) else {
            continue;
        };
        let Some(pid) = rest
            .strip_suffix(".tmp")
            .and_then(|r| r.split('.').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let Ok(c) = cstr(e.file_name().as_os_str()) else {
            continue;
        };
        if let Ok(Some(st)) = fstatat(dirfd, &c) {
            if st.st_mode & libc::S_IFMT == libc::S_IFREG && st.st_uid == me {
                // SAFETY: valid descriptor and name; unlinkat never follows a link.
                unsafe { libc::unlinkat(dirfd.as_raw_fd(), c.as_ptr(), 0) };
            }
        }
    }
}

/// Creates `--output-dir` (0700, or with the group/other read and search bits that `mode`
/// grants for the files) unless it exists; an existing one must not be writable by others unless
/// it is sticky.
pub fn prepare_output_dir(dir: &Path, mode: u32) -> std::io::Result<()> {
    let mut dmode = 0o700;
    if mode & 0o040 != 0 {
        dmode |= 0o050;
    }
    if mode & 0o004 != 0 {
        dmode |= 0o005;
    }
    match std::fs::symlink_metadata(dir) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
                std::fs::create_dir_all(parent)?;
            }
            let c = cstr(dir.as_os_str())?;
            // SAFETY: a NUL-terminated path.
            if unsafe { libc::mkdir(c.as_ptr(), 0o700) } != 0 {
                let e = std::io::Error::last_os_error();
                if e.raw_os_error() != Some(libc::EEXIST) {
                    return Err(e);
                }
            } else {
                give(&open_dir(dir)?)?;
                // The umask only takes bits away; set exactly what was asked.
                std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(dmode))?;
            }
        }
        Err(e) => return Err(e),
    }
    check_dir(&open_dir(dir)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    fn dir(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("tachyon-files-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
        d
    }

    #[test]
    fn a_directory_is_written_whole_and_replaced_whole() {
        let d = dir("pages");
        let out = d.join("run.heatmap");
        let page = |n: &str| (n.to_string(), n.as_bytes().to_vec());
        write_dir_atomic(&out, &[page("index.html"), page("f0.html")], 0o640).unwrap();
        let names = |p: &Path| {
            let mut v: Vec<String> = std::fs::read_dir(p)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            v.sort();
            v
        };
        assert_eq!(names(&out), ["f0.html", "index.html"]);
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&out), 0o750);
        assert_eq!(mode(&out.join("f0.html")), 0o640);
        // Replaced: the earlier directory's pages go with it, and nothing is left beside it.
        write_dir_atomic(&out, &[page("index.html")], 0o600).unwrap();
        assert_eq!(names(&out), ["index.html"]);
        assert_eq!(names(&d), ["run.heatmap"]);
        // A link or a file at the name is refused; page names cannot leave the directory.
        let link = d.join("link.heatmap");
        std::os::unix::fs::symlink(&out, &link).unwrap();
        assert!(write_dir_atomic(&link, &[page("index.html")], 0o600).is_err());
        std::fs::write(d.join("file.heatmap"), "x").unwrap();
        assert!(write_dir_atomic(&d.join("file.heatmap"), &[page("index.html")], 0o600).is_err());
        assert!(write_dir_atomic(&d.join("x.heatmap"), &[page("../escape")], 0o600).is_err());
        assert!(!d.join("escape").exists() && !d.join("x.heatmap").exists());
        assert!(write_dir_atomic(Path::new("-"), &[page("index.html")], 0o600).is_err());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn writes_atomically_with_the_mode_and_leaves_nothing_else() {
        let d = dir("write");
        let p = d.join("p.json");
        write_atomic(&p, b"one", 0o640).unwrap();
        write_atomic(&p, b"two", 0o600).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        assert_eq!(std::fs::metadata(&p).unwrap().mode() & 0o777, 0o600);
        assert_eq!(std::fs::read_dir(&d).unwrap().count(), 1);
        check_writable(&p).unwrap();
        assert_eq!(
            std::fs::read_dir(&d).unwrap().count(),
            1,
            "the probe names no file"
        );
    }

    #[test]
    fn refuses_links_devices_and_open_directories() {
        let d = dir("refuse");
        let victim = d.join("victim");
        std::fs::write(&victim, b"keep").unwrap();
        let link = d.join("link.json");
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        for p in [link.as_path(), Path::new("/dev/null"), d.as_path()] {
            assert!(check_writable(p).is_err(), "{}", p.display());
            assert!(write_atomic(p, b"x", 0o600).is_err(), "{}", p.display());
        }
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
        assert!(std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = write_atomic(&d.join("p.json"), b"x", 0o600).unwrap_err();
        assert!(e.to_string().contains("writable by other users"), "{e}");
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o1777)).unwrap();
        write_atomic(&d.join("p.json"), b"x", 0o600).unwrap();
    }

    #[test]
    fn stale_temporaries_of_dead_runs_are_removed() {
        let d = dir("stale");
        // pid 4194304 is above pid_max's ceiling: no such process can exist.
        let stale = d.join(".p.json.4194304.0123.tmp");
        let live = d.join(format!(".p.json.{}.0123.tmp", std::process::id()));
        std::fs::write(&stale, b"old").unwrap();
        std::fs::write(&live, b"mine").unwrap();
        write_atomic(&d.join("p.json"), b"x", 0o600).unwrap();
        assert!(!stale.exists());
        assert!(live.exists());
    }
}
