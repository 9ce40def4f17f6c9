//! `/proc`, as the profiler reads it about processes and threads: the one parser of `stat`, the
//! listings of processes and of a process's tasks, and the small files, each read with a bound.
//! Every file here is the kernel's: what a process controls in them is its command name, which
//! `stat` puts in parentheses and may hold anything (the fields after its last `)` are parsed).

use std::io::Read;

/// Largest `/proc` file of a process or thread read whole.
const PROC_FILE_MAX: u64 = 64 * 1024;
/// `PF_KTHREAD`, in `stat`'s flags.
const PF_KTHREAD: u64 = 0x0020_0000;

/// What the profiler reads of `/proc/PID/stat` (or a task's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stat {
    /// The scheduler state letter (`R`, `S`, `D`, `Z`, ...).
    pub state: char,
    pub ppid: u32,
    /// The task's `PF_*` flags.
    pub flags: u64,
    /// When the process started, in clock ticks since boot.
    pub start_time: u64,
}

impl Stat {
    pub fn is_kernel_thread(&self) -> bool {
        self.flags & PF_KTHREAD != 0
    }

    /// Exited: a zombie its parent has not reaped yet, or dead.
    pub fn exited(&self) -> bool {
        matches!(self.state, 'Z' | 'X')
    }
}

/// Fields 3 on of `stat`, after the command name: state, ppid (4), flags (9), starttime (22).
fn parse_stat(text: &str) -> Option<Stat> {
    let mut f = text.rsplit_once(')')?.1.split_whitespace();
    let state = f.next()?.chars().next()?;
    let ppid = f.next()?.parse().ok()?;
    let flags = f.nth(4)?.parse().ok()?;
    let start_time = f.nth(12)?.parse().ok()?;
    Some(Stat {
        state,
        ppid,
        flags,
        start_time,
    })
}

/// `/proc/PID/stat`.
pub fn stat(pid: u32) -> Option<Stat> {
    parse_stat(&read(&format!("/proc/{pid}/stat"))?)
}

/// `/proc/PID/task/TID/stat`.
pub fn task_stat(pid: u32, tid: u32) -> Option<Stat> {
    parse_stat(&read(&format!("/proc/{pid}/task/{tid}/stat"))?)
}

/// A `/proc` file, at most `PROC_FILE_MAX` bytes of it.
pub fn read(path: &str) -> Option<String> {
    let mut s = String::new();
    std::fs::File::open(path)
        .ok()?
        .take(PROC_FILE_MAX)
        .read_to_string(&mut s)
        .ok()?;
    Some(s)
}

/// A file of thread `tid` of process `pid` (`status`, `syscall`, `comm`), bounded as `read`.
pub fn task_file(pid: u32, tid: u32, name: &str) -> Option<String> {
    read(&format!("/proc/{pid}/task/{tid}/{name}"))
}

/// The path of the process's executable, as the kernel names it (`/proc/PID/exe`).
pub fn exe(pid: u32) -> Option<std::path::PathBuf> {
    std::fs::read_link(format!("/proc/{pid}/exe")).ok()
}

/// Whether thread `tid` of process `pid` exists (its `/proc` entry; a zombie's included).
pub fn task_exists(pid: u32, tid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}/task/{tid}")).exists()
}

/// Whether process `pid` exists (its `/proc` entry; a zombie's included).
pub fn exists(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

fn numbered(dir: &str) -> Vec<u32> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Every process of the host (as `/proc` lists them).
pub fn pids() -> Vec<u32> {
    numbered("/proc")
}

/// The tasks (threads) of process `pid`.
pub fn tids(pid: u32) -> Vec<u32> {
    numbered(&format!("/proc/{pid}/task"))
}

/// The start time of a process, to tell reused pids apart.
pub fn start_time(pid: u32) -> Option<u64> {
    stat(pid).map(|s| s.start_time)
}

/// How long ago the process started (or exec'd), from its start time and the uptime.
pub fn process_age(pid: u32) -> Option<std::time::Duration> {
    let start_ticks = start_time(pid)?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let uptime: f64 = read("/proc/uptime")?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    let age = uptime - start_ticks as f64 / hz.max(1) as f64;
    Some(std::time::Duration::from_secs_f64(age.max(0.0)))
}

/// CPU time a thread has used so far, in ns (the scheduler's `sum_exec_runtime`: the first
/// field of `/proc/PID/task/TID/schedstat`).
pub fn thread_cpu_ns(pid: u32, tid: u32) -> Option<u64> {
    read(&format!("/proc/{pid}/task/{tid}/schedstat"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_come_after_the_last_parenthesis() {
        // A command name may hold spaces and parentheses.
        let line = "4242 (a) b (c) S 1 4242 4242 0 -1 4194560 1 0 0 0 2 3 0 0 20 0 3 0 \
                    123456 1 2 3";
        assert_eq!(
            parse_stat(line),
            Some(Stat {
                state: 'S',
                ppid: 1,
                flags: 4194560,
                start_time: 123456,
            })
        );
        assert_eq!(parse_stat("1 (x"), None);
        let me = stat(std::process::id()).unwrap();
        assert!(!me.is_kernel_thread() && !me.exited());
        assert_eq!(me.ppid, std::os::unix::process::parent_id());
        assert!(stat(2).is_some_and(|s| s.is_kernel_thread()), "kthreadd");
    }
}
