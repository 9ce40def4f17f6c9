//! `-- COMMAND`: the launched command, held before `exec` until sampling is on, and ended with
//! the run; and the signal handling around it.

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
    /// Carries the errno of a failed exec; closes on a successful one.
    exec_err: std::os::fd::OwnedFd,
}

impl Launched {
    /// Lets the command exec and returns once it has (or failed to); its exit status is sent
    /// on `tx` when it ends.
    pub fn release(self, tx: tokio::sync::oneshot::Sender<i32>) -> std::io::Result<()> {
        let _ = nix::unistd::write(&self.go, b"g");
        drop(self.go);
        let mut b = [0u8; 4];
        if let Ok(4) = nix::unistd::read(&self.exec_err, &mut b) {
            return Err(std::io::Error::from_raw_os_error(i32::from_ne_bytes(b)));
        }
        let pid = nix::unistd::Pid::from_raw(self.pid as i32);
        std::thread::spawn(move || {
            use nix::sys::wait::{waitpid, WaitStatus};
            loop {
                match waitpid(pid, None) {
                    Ok(WaitStatus::Exited(_, code)) => {
                        let _ = tx.send(code);
                        return;
                    }
                    Ok(WaitStatus::Signaled(_, sig, _)) => {
                        let _ = tx.send(128 + sig as i32);
                        return;
                    }
                    Ok(_) => continue,
                    Err(_) => return,
                }
            }
        });
        Ok(())
    }
}

/// Forks the command and holds it before `exec` on a pipe, so its first instruction is sampled.
/// `std::process::Command` cannot do this: `spawn` itself waits for the `exec`.
pub fn launch(command: &[String]) -> Result<Launched, AppError> {
    use std::ffi::CString;
    use std::os::fd::{FromRawFd, OwnedFd};
    let args: Vec<CString> = command
        .iter()
        .map(|a| CString::new(a.as_bytes()))
        .collect::<Result<_, _>>()
        .map_err(|_| usage("command arguments cannot contain NUL bytes"))?;
    let mut argv: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
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
            let mut b = 0u8;
            libc::read(go[0], &mut b as *mut u8 as *mut libc::c_void, 1);
            libc::execvp(argv[0], argv.as_ptr());
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
