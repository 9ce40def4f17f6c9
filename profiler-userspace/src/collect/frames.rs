//! The profile's frames for what a sample shows: kernel and native frames, symbolized once per
//! address (per process's mappings, then per file), their classes for the merge with Python
//! frames, and the marker frames for what a stack could not show.

use std::sync::Arc;

use rustc_hash::FxHashMap;

use super::{Collector, TRUNCATED, UNCAPTURED};
use crate::aggregate::{Category, Frame, FrameId, Func, StackId};
use crate::process::unwind::UserFrame;
use crate::python::merge::FrameClass;
use crate::stack::symbols::KernelSymbols;

/// One process's entry of `Collector::proc_frames`.
#[derive(Default)]
pub(super) struct ProcFrames {
    modules_gen: u64,
    frames: FxHashMap<(u64, Category), FrameId>,
}

impl Collector {
    /// The frame at the root of a stack whose native part could not be unwound to its end.
    pub(super) fn truncated_frame(&mut self) -> FrameId {
        self.marker_frame(TRUNCATED)
    }

    /// A frame that stands for what a stack could not show.
    pub(super) fn marker_frame(&mut self, name: &str) -> FrameId {
        let func = self.profile.func(Func {
            name: Arc::from(name),
            file: None,
            line: None,
            lib: None,
            category: Category::Other,
            is_python: false,
        });
        self.profile.frame(Frame {
            func,
            line: None,
            address: None,
            symbol_address: None,
            category: Category::Other,
            opcode: None,
        })
    }

    pub(super) fn kernel_frame(&mut self, addr: u64) -> FrameId {
        if let Some(&f) = self.kernel_frames.get(&addr) {
            return f;
        }
        if !self.kernel.knows(addr) {
            // Kernel code made since boot that the boot's copy does not hold (someone else's
            // BPF program, a trampoline): the whole table, once.
            self.kernel = KernelSymbols::load();
            self.kernel_reread_at = Some(addr);
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
            opcode: None,
        });
        self.kernel_frames.insert(addr, f);
        f
    }

    /// Symbolizes user frames of `pid`, in the order given. Returns each frame with its symbol
    /// name. The process's frame cache is looked up once for all of them (a sample has dozens
    /// of native frames; two map lookups for each were a tenth of the profiler's own CPU).
    pub(super) fn native_frames<'a>(
        &mut self,
        pid: u32,
        frames: impl Iterator<Item = &'a UserFrame>,
        cat: Category,
    ) -> Vec<(FrameId, Arc<str>)> {
        let gen = self.procs.get(&pid).map_or(0, |p| p.modules_gen);
        let mut cache = self.proc_frames.remove(&pid).unwrap_or_default();
        if cache.modules_gen != gen {
            cache.modules_gen = gen;
            cache.frames.clear();
        }
        let out = frames
            .map(|uf| {
                let addr = uf.lookup_addr();
                if let Some(&f) = cache.frames.get(&(addr, cat)) {
                    let name = self.profile.funcs[self.profile.frames[f].func].name.clone();
                    return (f, name);
                }
                let (f, name) = self.native_frame_uncached(pid, addr, cat);
                cache.frames.insert((addr, cat), f);
                (f, name)
            })
            .collect();
        self.proc_frames.insert(pid, cache);
        out
    }

    /// `native_frames` for an address of `pid` not looked up since its mappings were read.
    pub(super) fn native_frame_uncached(
        &mut self,
        pid: u32,
        addr: u64,
        cat: Category,
    ) -> (FrameId, Arc<str>) {
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
                opcode: None,
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
        self.profile
            .set_build_id(lib, m.elf.as_ref().and_then(|e| e.build_id.as_ref()));
        let interpreter = crate::python::is_interpreter_file(&self.profile.libs[lib].name);
        self.profile.set_interpreter(lib, interpreter);
        let (name, sym) = match m.elf.as_ref().and_then(|e| e.symbols().lookup(svma)) {
            Some((start, name)) => (name, Some(start)),
            // Unnamed in a stripped dynamic loader: where the process started.
            None if m.elf.as_ref().is_some_and(|e| e.at_entry(svma)) => {
                (Arc::from("_start"), m.elf.as_ref().map(|e| e.entry))
            }
            // No symbol (a stripped library): named by library and offset, as perf does.
            None => (
                Arc::from(format!("{}+0x{svma:x}", self.profile.libs[lib].name).as_str()),
                None,
            ),
        };
        // The GIL hand-off and the garbage collector are named for what they are, in every
        // stack they are in (the Gecko output colours what they call the same way).
        let cat = if crate::python::is_gil_function(&name) {
            Category::Gil
        } else if crate::python::is_gc_function(&name) && self.profile.libs[lib].is_interpreter() {
            Category::Gc
        } else {
            cat
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
            opcode: None,
        });
        self.native_frames.insert(key, f);
        (f, name)
    }

    /// The classes `merge` needs of a sample's native frames, each found from its name once per
    /// frame id.
    pub(super) fn classes_of(&mut self, native: &[(FrameId, Arc<str>)]) -> Vec<FrameClass> {
        native.iter().map(|f| self.class_of(f)).collect()
    }

    pub(super) fn class_of(&mut self, (f, name): &(FrameId, Arc<str>)) -> FrameClass {
        if let Some(Some(c)) = self.frame_classes.get(*f) {
            return *c;
        }
        let c = FrameClass::of(name);
        if self.frame_classes.len() <= *f {
            self.frame_classes.resize(*f + 1, None);
        }
        self.frame_classes[*f] = Some(c);
        c
    }

    /// Whether a kernel frame is in an exec, which replaces the process's memory.
    pub(super) fn is_exec_point(&self, f: FrameId) -> bool {
        let name = self.profile.funcs[self.profile.frames[f].func]
            .name
            .as_ref();
        name.starts_with("__x64_sys_execve")
            || name.starts_with("__ia32_sys_execve")
            || name.starts_with("__arm64_sys_execve")
            || name == "begin_new_exec"
            || name == "bprm_execve"
    }

    /// Whether a kernel frame is in BPF program or tracepoint-dispatch code (by its symbol, from
    /// the kernel frame cache: no symbol lookup per sample).
    pub(super) fn is_tracing_frame(&mut self, addr: u64) -> bool {
        let f = self.kernel_frame(addr);
        let name = &self.profile.funcs[self.profile.frames[f].func].name;
        [
            "bpf_prog_",
            "bpf_trace_run",
            "__bpf_trace_",
            "__traceiter_",
            "bpf_trampoline_",
        ]
        .iter()
        .any(|p| name.starts_with(p))
    }

    /// The stack of off-CPU time without a capture, interned once per profile.
    pub(super) fn uncaptured_stack(&mut self) -> Option<StackId> {
        if let Some(s) = self.uncaptured {
            return s;
        }
        let f = self.marker_frame(UNCAPTURED);
        let s = self.profile.stack(&[f]);
        self.uncaptured = Some(s);
        s
    }
}
