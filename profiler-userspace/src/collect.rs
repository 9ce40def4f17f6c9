//! Turns raw samples into profile samples: unwinds the user stack, symbolizes native and kernel
//! frames, splices in Python frames, and files the result under its process and thread.

use std::collections::HashMap;
use std::sync::Arc;

use crate::aggregate::{state, Category, Frame, FrameId, Func, LibId, Profile, Sample};
use crate::capture::record::RawSample;
use crate::process::Process;
use crate::python::{PythonFrames, PythonRegistry};
use crate::stack::elf::ElfCache;
use crate::stack::symbols::KernelSymbols;
use crate::stack::unwind::{unwind_user, UserFrame};

const KERNEL_LIB: &str = "[kernel.kallsyms]";

pub struct Collector {
    pub profile: Profile,
    pub procs: HashMap<u32, Process>,
    pub elves: ElfCache,
    kernel: KernelSymbols,
    kernel_lib: LibId,
    native_frames: HashMap<(Arc<str>, u64, Category), FrameId>,
    kernel_frames: HashMap<u64, FrameId>,
    pub python: PythonRegistry,
    start_ns: u64,
}

/// Native functions on the path that takes the GIL.
fn is_gil_acquire(name: &str) -> bool {
    matches!(
        name,
        "take_gil"
            | "PyEval_RestoreThread"
            | "PyEval_AcquireThread"
            | "PyEval_AcquireLock"
            | "PyGILState_Ensure"
            | "_PyThreadState_Attach"
            | "_PyEval_AcquireLock"
            | "_PyEval_TakeGIL"
    ) || name.starts_with("take_gil.")
}

pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

impl Collector {
    pub fn new(start_ns: u64, python: PythonRegistry) -> Collector {
        let mut profile = Profile::default();
        let kernel_lib = profile.lib(&Arc::from(KERNEL_LIB));
        Collector {
            profile,
            procs: HashMap::new(),
            elves: ElfCache::default(),
            kernel: KernelSymbols::load(),
            kernel_lib,
            native_frames: HashMap::new(),
            kernel_frames: HashMap::new(),
            python,
            start_ns,
        }
    }

    pub fn time_ms(&self, ns: u64) -> f64 {
        (ns as i64 - self.start_ns as i64) as f64 / 1e6
    }

    fn kernel_frame(&mut self, addr: u64) -> FrameId {
        if let Some(&f) = self.kernel_frames.get(&addr) {
            return f;
        }
        let (name, sym) = match self.kernel.lookup(addr) {
            Some((start, name)) => (name, Some(start)),
            None => (Arc::from(format!("0x{addr:x}").as_str()), None),
        };
        let func = self.profile.func(Func {
            name,
            file: None,
            line: None,
            lib: Some(self.kernel_lib),
            category: Category::Kernel,
            is_python: false,
        });
        let f = self.profile.frame(Frame {
            func,
            line: None,
            address: Some(addr),
            symbol_address: sym,
            category: Category::Kernel,
        });
        self.kernel_frames.insert(addr, f);
        f
    }

    /// Symbolizes one user frame of `pid`. Returns the frame and the symbol name.
    fn native_frame(&mut self, pid: u32, uf: UserFrame, cat: Category) -> (FrameId, Arc<str>) {
        let addr = uf.lookup_addr();
        let proc = self.procs.get(&pid);
        let module = proc.and_then(|p| p.module_for(addr)).cloned();
        let Some(m) = module else {
            let name: Arc<str> = Arc::from(format!("0x{addr:x}").as_str());
            let func = self.profile.func(Func {
                name: name.clone(),
                file: None,
                line: None,
                lib: None,
                category: cat,
                is_python: false,
            });
            let f = self.profile.frame(Frame {
                func,
                line: None,
                address: None,
                symbol_address: None,
                category: cat,
            });
            return (f, name);
        };
        let svma = addr.wrapping_sub(m.bias);
        let key = (m.path.clone(), svma, cat);
        if let Some(&f) = self.native_frames.get(&key) {
            let name = self.profile.funcs[self.profile.frames[f].func].name.clone();
            return (f, name);
        }
        let lib = self.profile.lib(&m.path);
        let (name, sym) = match m.elf.as_ref().and_then(|e| e.symbols.lookup(svma)) {
            Some((start, name)) => (name, Some(start)),
            None => (Arc::from(format!("0x{svma:x}").as_str()), None),
        };
        let func = self.profile.func(Func {
            name: name.clone(),
            file: None,
            line: None,
            lib: Some(lib),
            category: cat,
            is_python: false,
        });
        let f = self.profile.frame(Frame {
            func,
            line: None,
            address: Some(svma),
            symbol_address: sym,
            category: cat,
        });
        self.native_frames.insert(key, f);
        (f, name)
    }

    pub fn handle(&mut self, s: RawSample) {
        let t_ms = self.time_ms(s.time_ns);
        let pid = s.pid;
        let elves = &mut self.elves;
        let proc = self
            .procs
            .entry(pid)
            .or_insert_with(|| Process::new(pid, &s.comm));
        if s.ip != 0 {
            proc.ensure_maps(s.ip, elves);
        }
        let unwound = if s.flags & profiler_common::SAMPLE_NO_USER == 0 {
            let mut u = unwind_user(proc, &s);
            // A return address outside every known module: a library mapped since the maps
            // were read. Re-read them (rate-limited) and unwind again.
            if let Some(f) = u.frames.iter().find(|f| proc.module_for(f.addr).is_none()) {
                let before = proc.modules.len();
                proc.ensure_maps(f.addr, elves);
                if proc.modules.len() != before {
                    u = unwind_user(proc, &s);
                }
            }
            u
        } else {
            crate::stack::unwind::Unwound {
                frames: Vec::new(),
                truncated: false,
            }
        };
        let proc_name = proc.comm.clone();
        if unwound.truncated {
            self.profile.counters.native_truncated += 1;
        }

        // Python frames of this instant, resolved to names and lines.
        let py = self.python.resolve(&s, &mut self.profile);
        let is_python_proc = py.is_some();
        let native_cat = if is_python_proc {
            Category::Native
        } else {
            Category::User
        };

        // Native frames, root first.
        let mut native: Vec<(FrameId, Arc<str>)> = Vec::with_capacity(unwound.frames.len());
        for uf in unwound.frames.iter().rev() {
            native.push(self.native_frame(pid, *uf, native_cat));
        }
        let mut root_first: Vec<FrameId> = match py {
            Some(PythonFrames {
                ref activations, ..
            }) if !activations.is_empty() => self.python.merge(
                &native,
                activations,
                unwound.truncated,
                &mut self.profile.counters,
            ),
            _ => native.iter().map(|(f, _)| *f).collect(),
        };
        for &k in s.kstack.iter().rev() {
            root_first.push(self.kernel_frame(k));
        }
        if root_first.is_empty() {
            self.profile.counters.kernel_only += 1;
        }
        let stack = self.profile.stack(&root_first);
        let mut st = 0u8;
        if let Some(p) = &py {
            st = p.state;
            // Waiting for the GIL: not the holder, and in the GIL-acquire path.
            if st & state::PYTHON != 0
                && st & state::HAS_GIL == 0
                && native.iter().any(|(_, n)| is_gil_acquire(n))
            {
                st |= state::GIL_WAIT;
            }
        }
        let proc_label = match self.python.labels(pid) {
            Some((label, version)) => {
                let p = self.profile.process_mut(pid, label, t_ms);
                if p.name != label {
                    p.name = label.to_string();
                    p.python = Some(version.to_string());
                }
                label
            }
            None => proc_name.as_str(),
        };
        self.profile.add_sample(
            pid,
            proc_label,
            s.tid,
            &s.comm,
            Sample {
                time_ms: t_ms,
                stack,
                state: st | state::ON_CPU,
            },
        );
    }

    /// Sorts every thread's samples by time (the ring buffer interleaves CPUs).
    pub fn finish(&mut self) {
        for p in self.profile.processes.values_mut() {
            for t in p.threads.values_mut() {
                t.samples.sort_by(|a, b| {
                    a.time_ms
                        .partial_cmp(&b.time_ms)
                        .unwrap_or(std::cmp::Ordering::Equal)
                });
            }
        }
    }
}
