//! Which thread state each thread of a Python process has: the interpreters' thread lists
//! matched to the process's tasks in `/proc` (in its own pid namespace, for containers), kept
//! per process and refreshed when signs say its threads changed, with the threads' names.

use std::collections::{HashMap, HashSet};

use rustc_hash::FxHashSet;

use super::discover::Runtime;
use super::registry::PythonRegistry;
use super::remote::{self, le_u64};
use super::{thread_names, ThreadChanges};
use crate::process::procfs;

/// Bounds on walks of target lists (untrusted memory).
const MAX_INTERPRETERS: usize = 64;
const MAX_THREADS: usize = 4096;
/// Reads of a thread's name tried before giving up (a thread seen before its bootstrap frame
/// is pushed gets another try at the next look; one started from C never has a name).
const NAME_TRIES: u8 = 4;
/// A process's thread map is read again at least this often when nothing says its threads
/// changed (`PythonRegistry::threads_due`).
const THREADS_QUIET: std::time::Duration = std::time::Duration::from_secs(1);

/// A process's threads and their thread states.
#[derive(Default)]
pub struct ThreadMap {
    /// Host tid -> thread state, as last pushed to the BPF map.
    pub(super) states: HashMap<u32, u64>,
    /// When `threads` was last read, and whether a thread has started or ended since, or ran
    /// Python code without being in it (`PythonRegistry::threads_due`).
    pub(super) read_at: Option<std::time::Instant>,
    pub(super) changed: bool,
    /// The tids `/proc` listed for it at that read.
    pub(super) listed: FxHashSet<u32>,
    /// Reads of `threading` names tried, by host tid (`NAME_TRIES` once named or given up).
    pub(super) name_tries: HashMap<u32, u8>,
    /// Offset of the kernel tid in the C library's thread struct (found once, <= 3.10).
    pub(super) pthread_tid_offset: Option<u64>,
    /// Its threads' tids in its own pid namespace (`task_ids`).
    pub(super) ns_tids: NsTids,
}

/// What is known of a process's pid namespace: whether it is the one `/proc` shows (then a
/// thread's tid is the same in both), and otherwise each listed thread's tid in its own.
#[derive(Default)]
pub(super) struct NsTids {
    same: Option<bool>,
    known: HashMap<u32, u32>,
}

impl ThreadMap {
    /// Thread states of every interpreter: (tstate, pthread id, native thread id), and whether
    /// a list was longer than the walk's bound (`MAX_THREADS`).
    fn thread_states(&self, rt: &Runtime) -> (Vec<(u64, u64, u64)>, bool) {
        let l = &rt.layout;
        let mut out = Vec::new();
        let mut cut = false;
        let mut interp = rt.remote.u64(rt.addr + l.interp_head).unwrap_or(0);
        let mut seen = HashSet::new();
        for _ in 0..MAX_INTERPRETERS {
            if interp == 0 || !seen.insert(interp) {
                break;
            }
            let mut t = rt.remote.u64(interp + l.interp_threads_head).unwrap_or(0);
            for i in 0..=MAX_THREADS {
                if t == 0 || !seen.insert(t) {
                    break;
                }
                if i == MAX_THREADS {
                    cut = true;
                    break;
                }
                let Some(b) = rt.remote.read(
                    t,
                    176.max(l.thread_id as usize + 8)
                        .max(l.native_thread_id.unwrap_or(0) as usize + 8),
                ) else {
                    break;
                };
                // A thread state belongs to its interpreter; anything else is not a list we trust.
                if le_u64(&b, l.tstate_interp as usize) != Some(interp) {
                    break;
                }
                let ptid = le_u64(&b, l.thread_id as usize).unwrap_or(0);
                let ntid = l
                    .native_thread_id
                    .and_then(|o| le_u64(&b, o as usize))
                    .unwrap_or(0)
                    & 0xffff_ffff;
                out.push((t, ptid, ntid));
                t = le_u64(&b, l.tstate_next as usize).unwrap_or(0);
            }
            interp = rt.remote.u64(interp + l.interp_next).unwrap_or(0);
        }
        (out, cut)
    }

    /// The thread -> thread-state map as it is now: host tids as keys.
    pub fn current_threads(&mut self, pid: u32, rt: &Runtime) -> HashMap<u32, u64> {
        let tasks = task_ids(pid, &mut self.ns_tids);
        self.listed = tasks.iter().map(|&(host, _)| host).collect();
        let ns_to_host: HashMap<u32, u32> = tasks.iter().map(|&(host, ns)| (ns, host)).collect();
        let (states, cut) = self.thread_states(rt);
        let mut candidates: HashMap<u32, Vec<u64>> = HashMap::new();
        for (tstate, ptid, ntid) in states {
            let mut ns_tid = ntid as u32;
            if ns_tid == 0 && ptid != 0 {
                ns_tid = self.tid_from_pthread(rt, ptid, &ns_to_host).unwrap_or(0);
            }
            if let Some(&host) = ns_to_host.get(&ns_tid) {
                candidates.entry(host).or_default().push(tstate);
            }
        }
        // Up to 3.11 a thread state made for a new thread carries its creator's `thread_id`
        // until the new thread starts: two states then name one thread. The one known before
        // stays; a thread first seen that way waits for the next read.
        let mut out = HashMap::new();
        for (host, states) in candidates {
            match states[..] {
                [one] => {
                    out.insert(host, one);
                }
                _ => {
                    if let Some(&known) = self.states.get(&host).filter(|k| states.contains(k)) {
                        out.insert(host, known);
                    }
                }
            }
        }
        if cut {
            // The walk stopped at its bound. A new thread's state goes at the head of its
            // interpreter's list, so those past the bound are the oldest, the main thread
            // among them: each keeps the state known for it while the thread lives (a reused
            // tid is a new thread, whose state is at the head).
            for (&tid, &tstate) in &self.states {
                if self.listed.contains(&tid) {
                    out.entry(tid).or_insert(tstate);
                }
            }
        }
        out
    }

    /// The kernel tid stored in the C library's thread struct at `pthread` (<= 3.10 keep only
    /// `pthread_self()`). The offset is found once by looking for a value that is one of the
    /// process's tids (glibc x86-64 keeps it at 0x2d0).
    fn tid_from_pthread(
        &mut self,
        rt: &Runtime,
        pthread: u64,
        tids: &HashMap<u32, u32>,
    ) -> Option<u32> {
        if let Some(off) = self.pthread_tid_offset {
            return rt
                .remote
                .u32(pthread + off)
                .filter(|t| tids.contains_key(t));
        }
        let b = rt.remote.read(pthread, 2048)?;
        let mut candidates: Vec<u64> = vec![0x2d0];
        candidates.extend((0..2048u64).step_by(4));
        for off in candidates {
            if let Some(v) = remote::le_u32(&b, off as usize) {
                if v != 0 && tids.contains_key(&v) {
                    self.pthread_tid_offset = Some(off);
                    return Some(v);
                }
            }
        }
        None
    }
}

/// (host tid, tid in the process's own pid namespace) of every thread.
fn task_ids(pid: u32, ns: &mut NsTids) -> Vec<(u32, u32)> {
    let hosts = procfs::tids(pid);
    // `NSpid` lists a task's ids from `/proc`'s pid namespace down to its own: one entry means
    // they are the same namespace, for every thread of the process. Read once per process; the
    // threads' status files (the costly part of a thread-map refresh, made every 100 ms) are
    // then read only for processes in other namespaces (containers), once per thread.
    let nspid = |tid: u32| -> Option<Vec<u32>> {
        let status = procfs::task_file(pid, tid, "status")?;
        let line = status.lines().find_map(|l| l.strip_prefix("NSpid:"))?;
        Some(
            line.split_whitespace()
                .filter_map(|v| v.parse().ok())
                .collect(),
        )
    };
    if ns.same.is_none() {
        ns.same = nspid(pid)
            .filter(|ids| !ids.is_empty())
            .map(|ids| ids.len() == 1);
    }
    if ns.same == Some(true) {
        return hosts.into_iter().map(|h| (h, h)).collect();
    }
    // A tid that left the listing is forgotten: if it comes back, it is another thread.
    let listed: std::collections::HashSet<u32> = hosts.iter().copied().collect();
    ns.known.retain(|h, _| listed.contains(h));
    hosts
        .into_iter()
        .map(|h| {
            if let Some(&n) = ns.known.get(&h) {
                return (h, n);
            }
            match nspid(h).and_then(|ids| ids.last().copied()) {
                Some(n) => {
                    ns.known.insert(h, n);
                    (h, n)
                }
                // Exiting: its status is gone; not kept.
                None => (h, h),
            }
        })
        .collect()
}

impl PythonRegistry {
    /// Whether `pid`'s thread map is due to be read again. Each read lists its tasks in `/proc`
    /// and walks its interpreter's thread states (about 20 system calls), so a process whose
    /// threads keep running is not read on every look: only when a thread started or ended in
    /// it, or ran Python code without being in the map (`threads_changed`), while a thread's
    /// name is still being read, or once every `THREADS_QUIET` (a thread state that changed
    /// under a thread that stays: C code calling into Python from its own threads). The BPF
    /// side finds a thread missing from the map by itself meanwhile (`thread_state`).
    pub fn threads_due(&self, pid: u32) -> bool {
        self.procs.get(&pid).is_some_and(|p| {
            p.threads.changed
                || p.threads.name_tries.values().any(|&n| n < NAME_TRIES)
                || p.threads
                    .read_at
                    .is_none_or(|t| t.elapsed() >= THREADS_QUIET)
        })
    }

    /// A sign that `pid`'s threads changed (see `threads_due`).
    pub fn threads_changed(&mut self, pid: u32) {
        if let Some(p) = self.procs.get_mut(&pid) {
            p.threads.changed = true;
        }
    }

    /// Reads `pid`'s threads again: the threads whose thread state is new or changed, and the
    /// threads that are gone, since the last call. `None` for an unknown process.
    pub fn sync_threads(&mut self, pid: u32) -> Option<ThreadChanges> {
        let p = self.procs.get_mut(&pid).filter(|p| p.gone_fork.is_none())?;
        let now = p.threads.current_threads(p.pid, &p.rt);
        p.threads.read_at = Some(std::time::Instant::now());
        p.threads.changed = false;
        let set = now
            .iter()
            .filter(|(tid, ts)| p.threads.states.get(tid) != Some(ts))
            .map(|(&tid, &ts)| (tid, ts))
            .collect();
        let gone = p
            .threads
            .states
            .keys()
            .filter(|tid| !now.contains_key(tid))
            .copied()
            .collect();
        let mut named = Vec::new();
        p.threads.name_tries.retain(|tid, _| now.contains_key(tid));
        for (&tid, &tstate) in &now {
            let tries = p.threads.name_tries.entry(tid).or_insert(0);
            if *tries >= NAME_TRIES {
                continue;
            }
            *tries += 1;
            if let Some(name) =
                thread_names::thread_name(&p.rt.remote, &p.rt.layout, p.rt.str_type, tstate)
            {
                *tries = NAME_TRIES;
                named.push((tid, name));
            }
        }
        p.threads.states = now;
        Some(ThreadChanges { set, gone, named })
    }

    /// The names of the threads of `pid`, read now, each tried a few times (a running thread's
    /// frames move under the read): `dump` names its threads once, at its end.
    pub fn thread_names_now(&mut self, pid: u32) -> Vec<(u32, String)> {
        const TRIES_NOW: usize = 16;
        let Some(p) = self.procs.get_mut(&pid) else {
            return Vec::new();
        };
        let now = p.threads.current_threads(p.pid, &p.rt);
        now.iter()
            .filter_map(|(&tid, &tstate)| {
                (0..TRIES_NOW)
                    .find_map(|_| {
                        thread_names::thread_name(&p.rt.remote, &p.rt.layout, p.rt.str_type, tstate)
                    })
                    .map(|name| (tid, name))
            })
            .collect()
    }
}
