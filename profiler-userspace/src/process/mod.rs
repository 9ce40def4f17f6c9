//! Per-process state: name, mappings, the ELF files behind them and a framehop unwinder over
//! them, and the unwinding of a sample's copied user stack (`unwind`, with the unwind rules
//! it evaluates itself in `unwind::cfi`). Mappings are re-read when a sample's address falls
//! outside every known module (`dlopen`): at once when they were read before the sample was
//! taken, otherwise at most every `REFRESH_MIN`.
//!
//! `procfs` is the one reader of `/proc`'s process and thread files (`stat` parsed once).
//!
//! May import `stack` (ELF files) and `capture` (the raw sample it unwinds); nothing above.

pub mod identity;
pub mod maps;
pub mod procfs;
pub mod remote;
pub mod unwind;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use framehop::Unwinder;

use crate::stack::elf::{ElfCache, ElfFile};
use maps::Mapping;

const REFRESH_MIN: Duration = Duration::from_millis(200);

/// One file mapped into a process (all its mappings together).
#[derive(Clone)]
pub struct Module {
    pub start: u64,
    pub end: u64,
    /// AVMA - SVMA.
    pub bias: u64,
    pub path: Arc<str>,
    pub elf: Option<Arc<ElfFile>>,
}

pub struct Process {
    pub pid: u32,
    /// Which reading of the mappings `modules` comes from: unique among every process's
    /// readings, so a cache of what an address is in this process (`Collector`'s frames) is
    /// valid while it stays the same.
    pub modules_gen: u64,
    /// `comm` of the process (its main thread).
    pub comm: String,
    pub cmdline: Vec<String>,
    pub modules: Vec<Module>,
    pub mappings: Vec<Mapping>,
    pub unwinder: unwind::NativeUnwinder,
    pub cache: unwind::banks::RuleCaches,
    /// framehop's rules for interrupted instructions, apart from `cache`'s for return
    /// addresses: each sample's leaf is an instruction of its own (a hot loop has thousands),
    /// which in one cache took the slot of a return address every stack has.
    pub leaf_cache: unwind::banks::RuleCaches,
    /// Addresses whose CFI marks them as a thread's outermost frame (`unwind::Walker::walk`
    /// checks each end of an unwind once); emptied when the modules change.
    pub roots: rustc_hash::FxHashSet<u64>,
    /// Stack pointer -> where the scan for a return address above it last succeeded
    /// (`unwind::Walker::scan`): a loop calls the same kernel from the same depth again and
    /// again, and the first guess tried is then the right one. A hint only: each is checked.
    pub scan_hints: rustc_hash::FxHashMap<u64, u64>,
    /// gimli's working space for the unwind rules evaluated here (`unwind::Walker::cfi_step`),
    /// kept so that a step allocates nothing.
    pub cfi_context: Box<gimli::UnwindContext<usize>>,
    /// Threads whose stack end the BPF side was given (`Collector::take_stack_tops`).
    pub stack_tops: rustc_hash::FxHashSet<u32>,
    /// Per thread, the stack beyond a copy as read for the last unwinds the interpreter's
    /// frames confirmed, oldest first (`unwind::LateMemo`).
    pub late_memos: rustc_hash::FxHashMap<u32, Vec<unwind::LateMemo>>,
    /// Per thread, its last unwind that rules alone took to the root (`unwind::SuffixMemo`);
    /// emptied when the modules change, and a thread's dropped when it exits.
    pub suffixes: rustc_hash::FxHashMap<u32, unwind::SuffixMemo>,
    maps_read_at: Option<Instant>,
    /// `CLOCK_MONOTONIC` ns of the last read of the mappings (samples carry the same clock).
    maps_read_ns: u64,
    /// The process could not be read (it exited, or is a kernel thread).
    pub unreadable: bool,
}

/// Whether `pid` is a kernel thread (`PF_KTHREAD` in the flags of `/proc/PID/stat`).
pub fn is_kernel_thread(pid: u32) -> bool {
    procfs::stat(pid).is_some_and(|s| s.is_kernel_thread())
}

/// The parent of `pid` (field 4 of `/proc/PID/stat`).
fn parent_of(pid: u32) -> Option<u32> {
    procfs::stat(pid).map(|s| s.ppid)
}

/// Processes look at most this many levels down for descendants.
const MAX_GENERATIONS: usize = 64;

/// Every process descending from `root` now (children, their children, ...), from the host's
/// (pid, parent) pairs.
pub fn descendants(root: u32) -> Vec<u32> {
    let pairs: Vec<(u32, u32)> = procfs::pids()
        .into_iter()
        .filter_map(|pid| Some((pid, parent_of(pid)?)))
        .collect();
    descendants_in(&pairs, root)
}

/// The descendants of `root` among (pid, parent) pairs, nearest first; bounded, and a loop in
/// the pairs (pid reuse between reads) ends.
fn descendants_in(pairs: &[(u32, u32)], root: u32) -> Vec<u32> {
    let mut out: Vec<u32> = Vec::new();
    let mut level = vec![root];
    for _ in 0..MAX_GENERATIONS {
        let next: Vec<u32> = pairs
            .iter()
            .filter(|(pid, parent)| level.contains(parent) && *pid != root && !out.contains(pid))
            .map(|p| p.0)
            .collect();
        if next.is_empty() {
            break;
        }
        out.extend(&next);
        level = next;
    }
    out
}

pub fn read_comm(pid: u32) -> Option<String> {
    procfs::read(&format!("/proc/{pid}/comm")).map(|s| s.trim_end().to_string())
}

pub fn read_cmdline(pid: u32) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| {
            b.split(|&c| c == 0)
                .filter(|s| !s.is_empty())
                .map(|s| String::from_utf8_lossy(s).into_owned())
                .collect()
        })
        .unwrap_or_default()
}

impl Process {
    /// The `unwind::LateMemo`s kept for thread `tid`, newest first.
    pub fn late_memos_of(&self, tid: u32) -> Vec<unwind::LateMemo> {
        self.late_memos
            .get(&tid)
            .map(|v| v.iter().rev().cloned().collect())
            .unwrap_or_default()
    }

    pub fn new(pid: u32, fallback_comm: &str) -> Process {
        Process {
            pid,
            comm: read_comm(pid).unwrap_or_else(|| fallback_comm.to_string()),
            cmdline: read_cmdline(pid),
            modules: Vec::new(),
            modules_gen: next_modules_gen(),
            mappings: Vec::new(),
            unwinder: unwind::NativeUnwinder::new(),
            cache: unwind::banks::RuleCaches::new(),
            leaf_cache: unwind::banks::RuleCaches::new(),
            roots: Default::default(),
            stack_tops: Default::default(),
            late_memos: Default::default(),
            suffixes: Default::default(),
            scan_hints: Default::default(),
            cfi_context: Box::new(gimli::UnwindContext::new()),
            maps_read_at: None,
            maps_read_ns: 0,
            unreadable: false,
        }
    }

    /// A child `pid` of `parent` that is gone (its mappings no longer read): its address space
    /// was its parent's at the fork, so its samples are unwound and named with the parent's
    /// mappings. It is not read again (`unreadable`).
    pub fn forked_from(parent: &Process, pid: u32) -> Process {
        let mut p = Process::new(pid, &parent.comm);
        p.comm = parent.comm.clone();
        p.cmdline = parent.cmdline.clone();
        add_unwind_modules(&mut p.unwinder, &parent.modules);
        p.modules = parent.modules.clone();
        p.mappings = parent.mappings.clone();
        p.maps_read_at = Some(Instant::now());
        p.maps_read_ns = parent.maps_read_ns;
        p.unreadable = true;
        p
    }

    /// Re-reads the mappings if they were never read, or if `addr` is in no known module and
    /// they may not show it yet: read before the sample (`sample_ns`) was taken when `addr` is in
    /// no mapping at all or in one that was not executable (something was mapped since),
    /// `REFRESH_MIN` ago when it is in an anonymous one (JIT code).
    pub fn ensure_maps(&mut self, addr: u64, sample_ns: u64, elf_files: &mut ElfCache) {
        let stale = match self.maps_read_at {
            None => true,
            Some(t) if self.module_for(addr).is_none() => {
                let mapping = self
                    .mappings
                    .iter()
                    .find(|m| m.start <= addr && addr < m.end);
                if let Some(m) = mapping {
                    // Code runs from an executable mapping: one that was not when read is a
                    // library the loader was still mapping (it maps the whole file first,
                    // then its segments).
                    t.elapsed() >= REFRESH_MIN || (!m.exec && self.maps_read_ns < sample_ns)
                } else {
                    // In no mapping read so far: a library loaded since (an import that
                    // `dlopen`s an extension), if the mappings were read before the sample was
                    // taken. Samples are read in time order, so this re-reads them about once
                    // per library loaded, and at most once per batch for an address in no
                    // mapping at all.
                    self.maps_read_ns < sample_ns
                }
            }
            Some(_) => false,
        };
        if stale && !(self.unreadable && self.maps_read_at.is_some()) {
            self.reload_maps(elf_files);
        }
    }

    /// When the mappings were last read (`CLOCK_MONOTONIC` ns, 0: never).
    pub fn maps_read_ns(&self) -> u64 {
        self.maps_read_ns
    }

    pub fn reload_maps(&mut self, elf_files: &mut ElfCache) {
        self.maps_read_at = Some(Instant::now());
        self.maps_read_ns = monotonic_ns();
        // A process that has exited (a zombie's mappings read empty) keeps what was read while
        // it ran, name included: a reader behind handles its last records after it is gone.
        let mappings = match maps::read_maps(self.pid) {
            Ok(m) if !m.is_empty() => m,
            _ => {
                self.unreadable = true;
                return;
            }
        };
        self.unreadable = false;
        // After an exec the name and arguments change with the mappings.
        if let Some(c) = read_comm(self.pid) {
            self.comm = c;
            self.cmdline = read_cmdline(self.pid);
        }
        let mut by_file: HashMap<(String, u64), Vec<&Mapping>> = HashMap::new();
        let mut order = Vec::new();
        for m in &mappings {
            if !m.is_file() {
                continue;
            }
            let key = (m.dev.clone(), m.inode);
            if !by_file.contains_key(&key) {
                order.push(key.clone());
            }
            by_file.entry(key).or_default().push(m);
        }
        let mut modules = Vec::new();
        for key in order {
            let ms = &by_file[&key];
            if !ms.iter().any(|m| m.exec) {
                continue;
            }
            let first = ms[0];
            let elf = elf_files.get(
                self.pid,
                &first.dev,
                first.inode,
                &first.file_path(),
                (first.start, first.end),
            );
            let start = ms.iter().map(|m| m.start).min().unwrap_or(0);
            let end = ms.iter().map(|m| m.end).max().unwrap_or(0);
            let bias = elf
                .as_ref()
                .and_then(|e| {
                    ms.iter().find_map(|m| {
                        e.offset_to_svma(m.offset)
                            .map(|svma| m.start.wrapping_sub(svma))
                    })
                })
                .unwrap_or(start.wrapping_sub(first.offset));
            modules.push(Module {
                start,
                end,
                bias,
                path: Arc::from(first.file_path().to_string_lossy().as_ref()),
                elf,
            });
        }
        // The vDSO has no file; it is the same image as this process's own.
        if let Some(m) = mappings.iter().find(|m| m.path == "[vdso]") {
            if let Some(elf) = maps::vdso() {
                let bias = elf
                    .offset_to_svma(0)
                    .map(|svma| m.start.wrapping_sub(svma))
                    .unwrap_or(m.start);
                modules.push(Module {
                    start: m.start,
                    end: m.end,
                    bias,
                    path: Arc::from("[vdso]"),
                    elf: Some(elf),
                });
            }
        }
        modules.sort_by_key(|m| m.start);
        for m in &self.modules {
            self.unwinder.remove_module(m.start);
        }
        add_unwind_modules(&mut self.unwinder, &modules);
        self.modules = modules;
        self.modules_gen = next_modules_gen();
        self.roots.clear();
        self.scan_hints.clear();
        self.suffixes.clear();
        self.mappings = mappings;
    }

    /// The mapping of the stack `sp` is in. The main thread's stack grows down past where
    /// the mappings last saw it start.
    pub fn stack_mapping(&self, sp: u64) -> Option<&Mapping> {
        self.mappings
            .iter()
            .find(|m| sp < m.end && (m.start <= sp || m.path == "[stack]"))
    }

    pub fn module_for(&self, addr: u64) -> Option<&Module> {
        module_at(&self.modules, addr)
    }
}

/// Gives `unwinder` the unwind tables of `modules` that have an ELF file.
fn add_unwind_modules(unwinder: &mut unwind::NativeUnwinder, modules: &[Module]) {
    for m in modules {
        if let Some(elf) = &m.elf {
            unwinder.add_module(framehop::Module::new(
                m.path.to_string(),
                m.start..m.end,
                m.bias,
                elf.unwind_info(),
            ));
        }
    }
}

/// A `Process::modules_gen` no other reading of any process's mappings has had.
fn next_modules_gen() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// The module of `modules` (sorted by start) that contains `addr`.
pub fn module_at(modules: &[Module], addr: u64) -> Option<&Module> {
    let i = modules
        .partition_point(|m| m.start <= addr)
        .checked_sub(1)?;
    let m = &modules[i];
    (addr < m.end).then_some(m)
}

/// `CLOCK_MONOTONIC` in nanoseconds, the clock of the BPF program's timestamps.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descendants_of_a_process_tree() {
        // 1 -> 10 -> {11, 12}; 12 -> 13; 20 is unrelated; 30 <-> 31 loop.
        let pairs = [
            (10, 1),
            (11, 10),
            (12, 10),
            (13, 12),
            (20, 1),
            (30, 31),
            (31, 30),
        ];
        assert_eq!(descendants_in(&pairs, 10), vec![11, 12, 13]);
        assert_eq!(descendants_in(&pairs, 13), Vec::<u32>::new());
        assert_eq!(descendants_in(&pairs, 30), vec![31]);
    }

    #[test]
    fn descendants_of_this_process() {
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        assert!(descendants(std::process::id()).contains(&child.id()));
        child.kill().unwrap();
        child.wait().unwrap();
    }
}
