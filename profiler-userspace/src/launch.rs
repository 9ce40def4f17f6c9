//! `-- COMMAND`: the launched command, held before `exec` until sampling is on and at its
//! program's entry point until its Python runtime is known, and ended with the run; and the
//! signal handling around it.

use std::time::Duration;

use crate::error::{other, usage, AppError};

/// written to a temporary name and renamed, so no partial file is left under its name.
pub fn exit_on_second_interrupt() {
    extern "C" fn on_sigint(_: libc::c_int) {
        const MSG: &[u8] = b"tachyon-bpf: interrupted again, exiting without writing\n";
        // SAFETY: write and _exit are async-signal-safe.
        unsafe {
            libc::write(2, MSG.as_ptr() as *const libc::c_void, MSG.len());
            libc::_exit(130);
        }
    }
    // SAFETY: an all-zero sigaction is valid; the handler only calls async-signal-safe
    // functions.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sigint as *const () as usize;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGINT, &sa, std::ptr::null_mut());
    }
}

/// Ends a launched command that is still running: SIGTERM, then SIGKILL after a second.
pub async fn end_command(pid: u32, exited: &mut tokio::sync::oneshot::Receiver<i32>) {
    let pid = nix::unistd::Pid::from_raw(pid as i32);
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
    if tokio::time::timeout(Duration::from_secs(1), exited)
        .await
        .is_err()
    {
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
    }
}

/// A launched command, held before `exec` until the profiler is attached.
pub struct Launched {
    pub pid: u32,
    go: std::os::fd::OwnedFd,
    /// Carries one byte (whether the child is traced, `T` or `N`), then the errno of a failed
    /// exec; closes on a successful one.
    exec_err: std::os::fd::OwnedFd,
}

/// A launched command after its `exec`: stopped at its program's entry point when `held`
/// (see `Launched::release`), its exit status sent on `tx` once `run` lets it go on.
pub struct Started {
    pub pid: u32,
    held: bool,
    tx: Option<tokio::sync::oneshot::Sender<i32>>,
    /// A signal the command got while stopped for the last time under tracing: delivered when
    /// it is let go.
    pending: Option<nix::sys::signal::Signal>,
}

impl Launched {
    /// Lets the command exec, and returns once it has (or failed to).
    ///
    /// The command is traced (`PTRACE_TRACEME`) from before its `exec` to its program's entry
    /// point: the dynamic loader has mapped its libraries there (libpython among them), and
    /// not one of its own instructions has run. The caller finds its Python runtime then, so
    /// that the first Python frame the program runs is sampled with its name, before calling
    /// `Started::run`. A command that could not be traced (a seccomp policy, a container
    /// without ptrace) runs untraced and is found while it starts, as any other process.
    pub fn release(self, tx: tokio::sync::oneshot::Sender<i32>) -> std::io::Result<Started> {
        let _ = nix::unistd::write(&self.go, b"g");
        drop(self.go);
        let mut traced = [0u8; 1];
        let traced =
            matches!(nix::unistd::read(&self.exec_err, &mut traced), Ok(1)) && traced[0] == b'T';
        let mut b = [0u8; 4];
        if let Ok(4) = nix::unistd::read(&self.exec_err, &mut b) {
            return Err(std::io::Error::from_raw_os_error(i32::from_ne_bytes(b)));
        }
        let mut started = Started {
            pid: self.pid,
            held: false,
            tx: Some(tx),
            pending: None,
        };
        if traced {
            started.hold_at_entry();
        }
        Ok(started)
    }
}

/// How often `Started::follow_exec` hands over while it waits for a wrapper's exec.
const MEANWHILE_EVERY: std::time::Duration = std::time::Duration::from_millis(20);

impl Started {
    /// Whether the command is stopped at its entry point.
    pub fn held(&self) -> bool {
        self.held
    }

    /// Runs the traced command to its entry point with a breakpoint there. Anything unexpected
    /// lets it go untraced (`run` detaches it), and a command that ends meanwhile has its
    /// status sent.
    fn hold_at_entry(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.pid as i32);
        // The stop that follows the exec of a traced process.
        if !self.wait_for_trap(pid) || !cfg!(any(target_arch = "x86_64", target_arch = "aarch64")) {
            return;
        }
        self.run_to_entry(pid);
    }

    /// From a stop right after an exec: to the new program's entry point, held there.
    fn run_to_entry(&mut self, pid: nix::unistd::Pid) {
        use nix::sys::ptrace;
        let held = entry_point(self.pid).and_then(|entry| {
            let addr = entry as ptrace::AddressType;
            let word = ptrace::read(pid, addr).ok()?;
            let trap = (word & !BREAKPOINT_MASK) | BREAKPOINT;
            ptrace::write(pid, addr, trap).ok()?;
            let reached = ptrace::cont(pid, None).is_ok() && self.wait_for_trap(pid);
            // Gone before its entry point: nothing to restore.
            self.tx.as_ref()?;
            let restored = ptrace::write(pid, addr, word).is_ok();
            (reached && restored && back_to_entry(pid, entry)).then_some(())
        });
        // Stopped either way (unless it is gone): `run` detaches it.
        self.held = held.is_some();
        if self.tx.is_some() && !self.held {
            log::debug!("pid {}: not held at its entry point", self.pid);
        } else if self.held {
            log::debug!(
                "pid {}: held at the entry point of {:?}",
                self.pid,
                std::fs::read_link(format!("/proc/{}/exe", self.pid)).unwrap_or_default()
            );
        }
    }

    /// The command held at its entry point is not the program to find (a wrapper: `env`, a
    /// shell, pyenv's shims): lets it run until it execs another program, and holds that one
    /// at its entry point. A wrapper that has not exec'd within `within` (a shell that runs
    /// its program as a child, or stays) is let go untraced. `meanwhile` is called every
    /// `MEANWHILE_EVERY` while it runs (the profiler reads its ring). True when held again.
    pub fn follow_exec(
        &mut self,
        within: std::time::Duration,
        meanwhile: &mut dyn FnMut(),
    ) -> bool {
        use nix::sys::ptrace;
        use nix::sys::signal::Signal;
        use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
        if !self.held {
            return false;
        }
        self.held = false;
        let pid = nix::unistd::Pid::from_raw(self.pid as i32);
        if ptrace::setoptions(pid, ptrace::Options::PTRACE_O_TRACEEXEC).is_err()
            || ptrace::cont(pid, None).is_err()
        {
            return false;
        }
        let deadline = std::time::Instant::now() + within;
        let mut next_meanwhile = std::time::Instant::now() + MEANWHILE_EVERY;
        while std::time::Instant::now() < deadline {
            match waitpid(pid, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::PtraceEvent(_, Signal::SIGTRAP, libc::PTRACE_EVENT_EXEC)) => {
                    self.run_to_entry(pid);
                    return self.held;
                }
                Ok(WaitStatus::Stopped(_, sig)) => {
                    if ptrace::cont(pid, sig).is_err() {
                        return false;
                    }
                }
                Ok(st) if exit_code(st).is_some() => {
                    self.ended(exit_code(st).unwrap_or(0));
                    return false;
                }
                Ok(_) => {
                    if std::time::Instant::now() >= next_meanwhile {
                        meanwhile();
                        next_meanwhile = std::time::Instant::now() + MEANWHILE_EVERY;
                    }
                    std::thread::sleep(std::time::Duration::from_micros(200))
                }
                Err(_) => return false,
            }
        }
        // No exec in time: stopped, so that it can be detached, and let go without the stop.
        let _ = nix::sys::signal::kill(pid, Signal::SIGSTOP);
        for _ in 0..64 {
            match waitpid(pid, None) {
                Ok(WaitStatus::Stopped(_, Signal::SIGSTOP)) => {
                    let _ = ptrace::detach(pid, None);
                    return false;
                }
                Ok(WaitStatus::Stopped(_, sig)) => {
                    let _ = ptrace::cont(pid, sig);
                }
                Ok(WaitStatus::PtraceEvent(..)) => {
                    let _ = ptrace::cont(pid, None);
                }
                Ok(st) if exit_code(st).is_some() => {
                    self.ended(exit_code(st).unwrap_or(0));
                    return false;
                }
                _ => return false,
            }
        }
        false
    }

    /// Waits for the traced command's next SIGTRAP stop, passing on every other signal it
    /// gets meanwhile (a Ctrl-C from its terminal). False if it ended (its status is sent) or
    /// cannot be waited for.
    fn wait_for_trap(&mut self, pid: nix::unistd::Pid) -> bool {
        use nix::sys::signal::Signal;
        use nix::sys::wait::{waitpid, WaitStatus};
        // Bounded: each pass is a signal the command got while it loads. A command that gets
        // this many stays stopped (so that a breakpoint can still be taken out) and has the
        // last one delivered when it is let go untraced.
        for pass in 0..64 {
            match waitpid(pid, None) {
                Ok(WaitStatus::Stopped(_, Signal::SIGTRAP)) => return true,
                Ok(WaitStatus::Stopped(_, sig)) if pass == 63 => {
                    self.pending = Some(sig);
                    return false;
                }
                Ok(WaitStatus::Stopped(_, sig)) => {
                    if nix::sys::ptrace::cont(pid, sig).is_err() {
                        return false;
                    }
                }
                Ok(st) if exit_code(st).is_some() => {
                    self.ended(exit_code(st).unwrap_or(0));
                    return false;
                }
                Ok(_) => continue,
                Err(_) => return false,
            }
        }
        false
    }

    fn ended(&mut self, code: i32) {
        if let Some(tx) = self.tx.take() {
            let _ = tx.send(code);
        }
    }

    /// Lets the command go on, untraced; its exit status is sent when it ends.
    pub fn run(mut self) {
        let Some(tx) = self.tx.take() else {
            return;
        };
        let pid = nix::unistd::Pid::from_raw(self.pid as i32);
        // `PTRACE_DETACH` of a stopped command cannot fail but for a vanished process; one that
        // is not traced (or no longer) refuses it, harmlessly.
        let _ = nix::sys::ptrace::detach(pid, self.pending.take());
        std::thread::spawn(move || {
            use nix::sys::wait::waitpid;
            loop {
                match waitpid(pid, None) {
                    Ok(st) => {
                        if let Some(code) = exit_code(st) {
                            let _ = tx.send(code);
                            return;
                        }
                    }
                    Err(_) => return,
                }
            }
        });
    }
}

/// Moves a command stopped by the breakpoint at `entry` back onto it: the trap has executed,
/// so its instruction pointer is one byte past it.
#[cfg(target_arch = "x86_64")]
fn back_to_entry(pid: nix::unistd::Pid, entry: u64) -> bool {
    use nix::sys::ptrace;
    ptrace::getregs(pid).is_ok_and(|mut regs| {
        regs.rip == entry + 1 && {
            regs.rip = entry;
            ptrace::setregs(pid, regs).is_ok()
        }
    })
}

/// arm64: `brk` traps with the program counter still on it.
#[cfg(target_arch = "aarch64")]
fn back_to_entry(pid: nix::unistd::Pid, entry: u64) -> bool {
    nix::sys::ptrace::getregs(pid).is_ok_and(|regs| regs.pc == entry)
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn back_to_entry(_pid: nix::unistd::Pid, _entry: u64) -> bool {
    false
}

/// A command's exit status as the profiler reports it (128 + the signal that killed it), if the
/// wait status is its end.
fn exit_code(st: nix::sys::wait::WaitStatus) -> Option<i32> {
    use nix::sys::wait::WaitStatus;
    match st {
        WaitStatus::Exited(_, code) => Some(code),
        WaitStatus::Signaled(_, sig, _) => Some(128 + sig as i32),
        _ => None,
    }
}

/// The breakpoint instruction written over the entry point's first bytes (a word is written
/// back whole): x86_64's one-byte `int3`, arm64's `brk #0`.
#[cfg(not(target_arch = "aarch64"))]
const BREAKPOINT: libc::c_long = 0xcc;
#[cfg(not(target_arch = "aarch64"))]
const BREAKPOINT_MASK: libc::c_long = 0xff;
#[cfg(target_arch = "aarch64")]
const BREAKPOINT: libc::c_long = 0xd420_0000;
#[cfg(target_arch = "aarch64")]
const BREAKPOINT_MASK: libc::c_long = 0xffff_ffff;

/// The entry point of the program `pid` has just exec'd (`AT_ENTRY` of its auxiliary vector).
/// `pid` is the profiler's own stopped child: the read is of its procfs file, bounded.
fn entry_point(pid: u32) -> Option<u64> {
    use std::io::Read;
    const AT_ENTRY: u64 = 9;
    let mut buf = Vec::new();
    std::fs::File::open(format!("/proc/{pid}/auxv"))
        .ok()?
        .take(8192)
        .read_to_end(&mut buf)
        .ok()?;
    buf.chunks_exact(16)
        .map(|c| {
            (
                u64::from_ne_bytes(c[..8].try_into().unwrap_or_default()),
                u64::from_ne_bytes(c[8..].try_into().unwrap_or_default()),
            )
        })
        .take_while(|&(key, _)| key != 0)
        .find(|&(key, _)| key == AT_ENTRY)
        .map(|(_, v)| v)
        .filter(|&v| v != 0)
}

/// The user a launched command runs as instead of root: who ran `sudo` (`SUDO_UID`,
/// `SUDO_GID`), with their groups and their `HOME`, `USER` and `LOGNAME`.
pub struct RunAs {
    pub uid: u32,
    pub gid: u32,
    groups: Vec<libc::gid_t>,
    /// The environment the command gets (this one's, with the user's own names and home).
    env: Vec<std::ffi::CString>,
}

/// Who ran `sudo`, when this process is root by `sudo`: `SUDO_UID` and `SUDO_GID` (root's own
/// `sudo` is not a user to drop to).
pub fn sudo_user() -> Option<(u32, u32)> {
    // SAFETY: no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    let uid: u32 = std::env::var("SUDO_UID").ok()?.parse().ok()?;
    let gid: u32 = std::env::var("SUDO_GID").ok()?.parse().ok()?;
    (uid != 0).then_some((uid, gid))
}

impl RunAs {
    /// The user `uid`:`gid`: their groups and home from the user database when it has them.
    pub fn new(uid: u32, gid: u32) -> RunAs {
        use std::os::unix::ffi::OsStrExt;
        let user = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
            .ok()
            .flatten();
        let groups = user
            .as_ref()
            .and_then(|u| {
                let name = std::ffi::CString::new(u.name.as_bytes()).ok()?;
                nix::unistd::getgrouplist(&name, nix::unistd::Gid::from_raw(gid)).ok()
            })
            .map(|g| g.into_iter().map(|g| g.as_raw()).collect())
            .unwrap_or_else(|| vec![gid]);
        let mut env: Vec<(std::ffi::OsString, std::ffi::OsString)> = std::env::vars_os()
            .filter(|(k, _)| !matches!(k.to_str(), Some("HOME" | "USER" | "LOGNAME" | "MAIL")))
            .collect();
        if let Some(u) = &user {
            env.push(("HOME".into(), u.dir.clone().into_os_string()));
            env.push(("USER".into(), u.name.clone().into()));
            env.push(("LOGNAME".into(), u.name.clone().into()));
        }
        let env = env
            .into_iter()
            .filter_map(|(k, v)| {
                let mut b = k.as_bytes().to_vec();
                b.push(b'=');
                b.extend_from_slice(v.as_bytes());
                std::ffi::CString::new(b).ok()
            })
            .collect();
        RunAs {
            uid,
            gid,
            groups,
            env,
        }
    }
}

/// Forks the command and holds it before `exec` on a pipe, so its first instruction is sampled;
/// as `run_as` when given. `std::process::Command` cannot do this: `spawn` itself waits for the
/// `exec`.
pub fn launch(command: &[String], run_as: Option<&RunAs>) -> Result<Launched, AppError> {
    use std::ffi::CString;
    use std::os::fd::{FromRawFd, OwnedFd};
    let args: Vec<CString> = command
        .iter()
        .map(|a| CString::new(a.as_bytes()))
        .collect::<Result<_, _>>()
        .map_err(|_| usage("command arguments cannot contain NUL bytes"))?;
    let mut argv: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    let mut envp: Vec<*const libc::c_char> = run_as
        .map(|r| r.env.iter().map(|e| e.as_ptr()).collect())
        .unwrap_or_default();
    envp.push(std::ptr::null());
    // The error pipe reports a failed exec (errno) back; it closes on a successful exec.
    let mut go = [0i32; 2];
    let mut err = [0i32; 2];
    // SAFETY: pipe2 fills the two-element arrays.
    let (r1, r2) = unsafe {
        (
            libc::pipe2(go.as_mut_ptr(), libc::O_CLOEXEC),
            libc::pipe2(err.as_mut_ptr(), libc::O_CLOEXEC),
        )
    };
    if r1 != 0 || r2 != 0 {
        return Err(other(format!("pipe: {}", std::io::Error::last_os_error())));
    }
    // SAFETY: fork in a process whose other threads (none that hold locks we use) are not
    // touched by the child, which only calls async-signal-safe read/write/execvp/_exit.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(other(format!("fork: {}", std::io::Error::last_os_error())));
    }
    if pid == 0 {
        // SAFETY: async-signal-safe calls only, on descriptors and strings prepared before fork.
        unsafe {
            libc::close(go[1]);
            libc::close(err[0]);
            // Traced until its entry point (see `Launched::release`); the parent learns
            // whether, before anything else on this pipe.
            let traced: u8 = if libc::ptrace(libc::PTRACE_TRACEME, 0, 0, 0) == 0 {
                b'T'
            } else {
                b'N'
            };
            libc::write(err[1], &traced as *const u8 as *const libc::c_void, 1);
            let mut b = 0u8;
            libc::read(go[0], &mut b as *mut u8 as *mut libc::c_void, 1);
            if let Some(r) = run_as {
                // Groups, then group, then user: once the user is dropped, nothing else can be.
                if libc::setgroups(r.groups.len(), r.groups.as_ptr()) != 0
                    || libc::setgid(r.gid) != 0
                    || libc::setuid(r.uid) != 0
                {
                    let e = *libc::__errno_location();
                    libc::write(err[1], &e as *const i32 as *const libc::c_void, 4);
                    libc::_exit(127);
                }
                libc::execvpe(argv[0], argv.as_ptr(), envp.as_ptr());
            } else {
                libc::execvp(argv[0], argv.as_ptr());
            }
            let e = *libc::__errno_location();
            libc::write(err[1], &e as *const i32 as *const libc::c_void, 4);
            libc::_exit(127);
        }
    }
    // SAFETY: the descriptors came from pipe2 above and are owned here from now on.
    let (go_rd, go_wr, err_rd, err_wr) = unsafe {
        (
            OwnedFd::from_raw_fd(go[0]),
            OwnedFd::from_raw_fd(go[1]),
            OwnedFd::from_raw_fd(err[0]),
            OwnedFd::from_raw_fd(err[1]),
        )
    };
    drop(go_rd);
    drop(err_wr);
    Ok(Launched {
        pid: pid as u32,
        go: go_wr,
        exec_err: err_rd,
    })
}
