//! One sample, from its record to the profile, in stages: its kernel frames, its process's
//! mappings, the unwind of its user stack, its Python frames, the reconciling of the unwind
//! with the interpreter's frames, the assembled stack and its state bits, and the filing
//! under its process and thread.

use std::sync::Arc;

use super::{
    ensure_process, has_stray_address, monotonic_ns, state_bits, Collector, PySink, REUNWINDS,
};
use crate::aggregate::{state, Category, FrameId};
use crate::capture::record::RawSample;
use crate::process::unwind::{unwind_user, LateMemo, Unwound, SCAN_FRAMES};
use crate::process::Process;
use crate::python::merge::FrameClass;
use crate::python::PythonFrames;

/// An unwind's native frames, root first, their classes and how many are eval-loop frames.
pub(super) struct NativeStack {
    pub frames: Vec<(FrameId, Arc<str>)>,
    pub classes: Vec<FrameClass>,
    pub evals: usize,
}

impl NativeStack {
    /// Frames whose classes are not needed (not a Python sample's, or nothing to pair).
    fn unclassed(frames: Vec<(FrameId, Arc<str>)>) -> NativeStack {
        NativeStack {
            frames,
            classes: Vec::new(),
            evals: 0,
        }
    }
}

impl Collector {
    /// `blocked`: a sample of a thread read from outside while it stayed blocked (`dump`),
    /// kept as a sample of its own and off CPU.
    pub(super) fn handle_in(&mut self, s: RawSample<'_>, blocked: bool) {
        let t_ms = self.time_ms(s.time_ns);
        self.note_lag(s.time_ns);
        let kernel = self.kernel_stack(&s);
        let replaced = self.mappings(&s, &kernel);
        let unwound = self.unwind(&s, replaced);
        // Python frames of this instant, resolved to names and lines.
        let py = self.python.resolve(&s, &mut PySink(&mut self.profile));
        let cat = if py.is_some() {
            Category::Native
        } else {
            Category::User
        };
        let (unwound, native) = self.reconcile(&s, py.as_ref(), unwound, cat);
        if unwound.truncated {
            self.profile.counters.native_truncated += 1;
        }
        let (root_first, st) = self.assemble(&s, py, &unwound, native, kernel);
        self.add_to_profile(&s, t_ms, &root_first, st, blocked);
    }

    /// How long the sample waited in the ring buffer before being read.
    fn note_lag(&mut self, time_ns: u64) {
        let lag_ms = monotonic_ns().saturating_sub(time_ns) as f64 / 1e6;
        let c = &mut self.profile.counters;
        c.last_lag_ms = lag_ms;
        c.max_lag_ms = c.max_lag_ms.max(lag_ms);
    }

    /// Kernel frames, root first. The innermost ones of an off-CPU capture are the profiler's
    /// own BPF program and the tracepoint that ran it; the thread's stack ends at the scheduler.
    fn kernel_stack(&mut self, s: &RawSample) -> Vec<FrameId> {
        let mut kstack: &[u64] = &s.kstack;
        while let Some((&k, rest)) = kstack.split_first() {
            if !self.is_tracing_frame(k) {
                break;
            }
            kstack = rest;
        }
        kstack.iter().rev().map(|&k| self.kernel_frame(k)).collect()
    }

    /// The sample's process, with its mappings read as its record needs them. Returns whether
    /// the sample's user registers are another program's than the mappings show (`replaced`):
    /// then there is nothing to unwind.
    fn mappings(&mut self, s: &RawSample, kernel: &[FrameId]) -> bool {
        let pid = s.pid;
        // A sample inside an exec: the user registers are the old program's, whose mappings
        // are gone or going (the maps read now are the new program's); its kernel stack says it.
        let replaced = kernel.iter().any(|&f| self.is_exec_point(f));
        let elf_files = &mut self.elf_files;
        let proc = self
            .procs
            .entry(pid)
            .or_insert_with(|| Process::new(pid, &s.comm));
        // A main-thread sample named otherwise than the process is now: it ran the program the
        // process exec'd away from since (a launcher's child waiting for its start), whose code
        // the mappings read now do not show. The name is read again to be sure (a process may
        // rename itself; its later samples then match).
        let foreign = s.tid == pid
            && !s.comm.is_empty()
            && s.comm != proc.comm
            && crate::process::read_comm(pid).is_some_and(|c| {
                let differs = c != s.comm;
                proc.comm = c;
                differs
            });
        let replaced = replaced || foreign;
        // The process loaded code since its previous record: read its mappings now, while it
        // most likely lives (see `SAMPLE_MAPS_CHANGED`). Records are read in time order, so the
        // libraries one import loads cost one read.
        if s.flags & profiler_common::SAMPLE_MAPS_CHANGED != 0
            && !replaced
            && proc.maps_read_ns() != 0
            && proc.maps_read_ns() < s.time_ns
        {
            proc.reload_maps(elf_files);
            self.profile.counters.maps_read_on_load += 1;
        }
        if s.ip != 0 && !replaced {
            proc.ensure_maps(s.ip, s.time_ns, elf_files);
        }
        replaced
    }

    /// The unwind of the sample's user stack (none without user registers, or when they are
    /// another program's).
    fn unwind(&mut self, s: &RawSample, replaced: bool) -> Unwound {
        let pid = s.pid;
        if s.flags & profiler_common::SAMPLE_NO_USER != 0 || replaced {
            return Unwound::empty();
        }
        let elf_files = &mut self.elf_files;
        let Some(proc) = self.procs.get_mut(&pid) else {
            return Unwound::empty();
        };
        let mut u = unwind_user(proc, s, &[], None, &mut { SCAN_FRAMES });
        // A return address outside every known module: a library mapped since the maps
        // were read. Re-read them (rate-limited) and unwind again.
        if let Some(f) = u.frames.iter().find(|f| proc.module_for(f.addr).is_none()) {
            let before = proc.modules.len();
            proc.ensure_maps(f.addr, s.time_ns, elf_files);
            if proc.modules.len() != before {
                u = unwind_user(proc, s, &[], None, &mut { SCAN_FRAMES });
            }
        }
        // A return address in no module is junk the unwinder read where a frame without
        // unwind information (hand-written assembly, such as OpenBLAS kernels) kept no
        // return address: the stack ends before it, truncated, rather than with invented
        // frames. The interrupted instruction itself may be in anonymous code (a JIT).
        if let Some(i) = u
            .frames
            .iter()
            .skip(1)
            .position(|f| proc.module_for(f.addr).is_none())
        {
            u.frames.truncate(i + 1);
            u.truncated = true;
        }
        // The copy ended at a fault below the end of the thread's stack: a page the thread
        // never touched (a large buffer a function reserved and did not fill). Later copies
        // of this thread step over such pages up to the stack's end.
        if u.truncated && s.flags & profiler_common::SAMPLE_USTACK_SHORT != 0 {
            let copied_to = s.sp + s.stack.len() as u64;
            if let Some(end) = proc.stack_mapping(s.sp).map(|m| m.end) {
                if end > copied_to && proc.stack_tops.insert(s.tid) {
                    self.stack_tops.push((pid, s.tid, end));
                }
            }
        }
        u
    }

    /// The native frames of the unwind, root first, with their classes once a Python sample
    /// needs them; a Python sample's unwind is checked against the interpreter's activations.
    ///
    /// Fewer eval-loop frames than interpreter activations: each activation runs in an eval
    /// frame below it, so the native stack ends early. The unwinder stopped without an error
    /// at a frame without unwind information whose frame pointer was not one (OpenBLAS's
    /// assembly kernels): a truncated stack, said so, not a whole one.
    fn reconcile(
        &mut self,
        s: &RawSample,
        py: Option<&PythonFrames>,
        mut unwound: Unwound,
        cat: Category,
    ) -> (Unwound, NativeStack) {
        let pid = s.pid;
        let mut native = self.native_frames(pid, unwound.frames.iter().rev(), cat);
        let activations = match py {
            Some(p) if !p.activations.is_empty() => p.activations.len(),
            _ => 0,
        };
        if activations == 0 || s.flags & profiler_common::SAMPLE_NO_USER != 0 {
            return (unwound, NativeStack::unclassed(native));
        }
        let mut classes = self.classes_of(&native);
        let mut evals = classes.iter().filter(|c| c.is_eval()).count();
        // The interpreter's frames refute the unwind: other unwinds of the sample are
        // tried (`Collector::reunwind`).
        if evals != activations {
            if let Some((again, stack)) = self.reunwind(pid, s, &unwound, activations, cat) {
                unwound = again;
                (native, classes, evals) = (stack.frames, stack.classes, stack.evals);
            }
        }
        if evals == activations {
            if let Some(proc) = self.procs.get_mut(&pid) {
                unwound.keep_late(proc, s.tid);
            }
        }
        // A stack scan that skipped eval-loop frames (it found a stale return address
        // that still leads to the root), or frames read after the sample that are not
        // the sample's (the eval-loop frames do not pair with the activations), are
        // refuted by the interpreter's own frames: only what the rules unwound from
        // the copy is kept.
        // A rooted unwind without them went through a guess at a frame without
        // unwind information (`Unwound::refute_guesses`): what follows it is stale.
        let late_wrong = unwound.late_from.is_some() && evals != activations;
        let scan_wrong = evals < activations && unwound.scanned_from.is_some();
        let guess_wrong = evals < activations && unwound.rooted;
        if late_wrong || scan_wrong || guess_wrong {
            if late_wrong {
                unwound.refute_late();
            } else if scan_wrong {
                unwound.refute_scan();
            }
            if guess_wrong {
                if let Some(proc) = self.procs.get_mut(&pid) {
                    unwound.refute_guesses(proc);
                }
            }
            let stack = self.unwound_frames(pid, &unwound, cat);
            (native, classes, evals) = (stack.frames, stack.classes, stack.evals);
        }
        unwound.truncated |= evals < activations;
        if evals != activations {
            log_mismatch(s, &unwound, evals, activations);
        }
        (
            unwound,
            NativeStack {
                frames: native,
                classes,
                evals,
            },
        )
    }

    /// The sample's stack, root first (native frames merged with the Python ones, the running
    /// asyncio task spliced in, a root marker when truncated, then the kernel's), and its
    /// state bits.
    fn assemble(
        &mut self,
        s: &RawSample,
        py: Option<PythonFrames>,
        unwound: &Unwound,
        native: NativeStack,
        kernel: Vec<FrameId>,
    ) -> (Vec<FrameId>, u8) {
        let NativeStack {
            frames: mut native,
            mut classes,
            ..
        } = native;
        // The GIL hand-off of an interpreter without a symbol table is the GIL's, as a named
        // `take_gil` is (`native_frame`): its frame says so, for what it calls to be coloured so.
        if py.is_some() {
            if let Some(i) = self.anonymous_gil_frame(&native) {
                let mut fr = self.profile.frames[native[i].0].clone();
                fr.category = Category::Gil;
                native[i].0 = self.profile.frame(fr);
            }
        }
        // Waiting for the GIL: a frame of the GIL hand-off is on the stack.
        let in_gil_handoff = native
            .iter()
            .any(|(f, _)| self.profile.frames[*f].category == Category::Gil);
        let mut root_first: Vec<FrameId> = match py {
            Some(PythonFrames {
                ref activations, ..
            }) if !activations.is_empty() => {
                if classes.len() != native.len() {
                    classes = self.classes_of(&native);
                }
                self.python.merge(
                    &native,
                    &classes,
                    activations,
                    unwound.truncated,
                    &mut PySink(&mut self.profile),
                )
            }
            _ => native.iter().map(|(f, _)| *f).collect(),
        };
        // `--async-aware`: what is rootward of the running task's coroutine (the event loop's
        // machinery, Python and native) gives way to the task and those awaiting it.
        let spliced = match py.as_ref().and_then(|p| p.tasks.as_ref()) {
            Some(t) => match root_first.iter().position(|&f| f == t.from) {
                Some(i) => {
                    root_first.splice(..i, t.prefix.iter().copied());
                    true
                }
                None => false,
            },
            None => false,
        };
        if unwound.truncated && !spliced {
            // The native stack's root part is missing: said at the root, so such stacks are
            // not mistaken for whole ones (and do not root at a Python or library frame).
            root_first.insert(0, self.truncated_frame());
        }
        root_first.extend_from_slice(&kernel);
        let mut st = 0u8;
        if let Some(py_state) = py.as_ref().and_then(|p| p.state) {
            st = state_bits(py_state);
            // Waiting for the GIL: in the GIL hand-off path. A thread inside `drop_gil` may still
            // be the recorded holder while it blocks on the GIL's mutex to release it; it is
            // giving the GIL up (3.13+ clears `holds_gil` on entry), so it does not hold it.
            if in_gil_handoff {
                st &= !state::HAS_GIL;
                st |= state::GIL_WAIT;
            }
        }
        if s.flags & profiler_common::SAMPLE_PY_EXCEPTION != 0 {
            st |= state::EXCEPTION;
        }
        (root_first, st)
    }

    /// Files the sample's stack under its process and thread: an on-CPU sample (or `dump`'s
    /// read of a blocked thread), or an off-CPU capture the scheduler's accounting charges.
    fn add_to_profile(
        &mut self,
        s: &RawSample,
        t_ms: f64,
        root_first: &[FrameId],
        mut st: u8,
        blocked: bool,
    ) {
        let pid = s.pid;
        if root_first.is_empty() {
            self.profile.counters.kernel_only += 1;
        }
        let stack = self.profile.stack_near(root_first, s.tid);
        let comm = self.procs.get(&pid).map_or("", |p| p.comm.as_str());
        ensure_process(
            &mut self.profile,
            &self.python,
            &self.env_labels,
            pid,
            comm,
            t_ms,
        );
        if s.off_cpu {
            // Charged by the accounting records that name it.
            self.profile.counters.offcpu_captures += 1;
            let t = self.profile.thread_mut(pid, "", s.tid, &s.comm, t_ms);
            t.sched.note_capture(s.time_ns, t_ms, stack, st);
        } else {
            if !blocked {
                st |= state::ON_CPU;
            }
            self.profile
                .add_sample(pid, "", s.tid, &s.comm, t_ms, stack, st);
        }
    }

    /// The native frames of an unwind, root first, their classes and its eval-loop frames.
    pub(super) fn unwound_frames(&mut self, pid: u32, u: &Unwound, cat: Category) -> NativeStack {
        let native = self.native_frames(pid, u.frames.iter().rev(), cat);
        let classes = self.classes_of(&native);
        let evals = classes.iter().filter(|c| c.is_eval()).count();
        NativeStack {
            frames: native,
            classes,
            evals,
        }
    }

    /// Other unwinds of sample `s` than `first`, whose eval-loop frames do not pair with the
    /// interpreter's `want` activations; the first that does is returned. Two things go wrong
    /// past a frame without unwind information whose caller's frame is larger than the copy
    /// (OpenBLAS's kernels under `dgetrf_parallel`):
    /// - the scan takes a stale return address, left by an earlier call in the buffer the
    ///   kernel reserved, whose chain still reaches the root: its next candidates are taken in
    ///   turn;
    /// - the stack beyond the copy, read late, is no longer the sample's (nor are the chains
    ///   the scan's candidates lead to): it is taken from the memos of the thread's last
    ///   confirmed unwinds instead (`unwind::LateMemo`), each of which counts only where the
    ///   unwind leaves the copy at the frame it was taken at.
    ///
    /// At most `REUNWINDS` unwinds in all, whose scans walk `SCAN_FRAMES` frames in all (one
    /// unwind's). A chain that is not rooted, or holds an address in no module, is never
    /// taken.
    pub(super) fn reunwind(
        &mut self,
        pid: u32,
        s: &RawSample,
        first: &Unwound,
        want: usize,
        cat: Category,
    ) -> Option<(Unwound, NativeStack)> {
        let memos: Vec<LateMemo> = if first.late_read.is_some() {
            self.procs.get(&pid)?.late_memos_of(s.tid)
        } else {
            Vec::new()
        };
        let mut budget = REUNWINDS;
        let mut scan_frames = SCAN_FRAMES;
        // The live thread's stack first (the first unwind's scan went on), then each memo.
        for (i, memo) in std::iter::once(None)
            .chain(memos.iter().map(Some))
            .enumerate()
        {
            let mut skip = Vec::new();
            if i == 0 {
                match first.scanned_from.and(first.scan_slot) {
                    Some(at) => skip.push(at),
                    None => continue,
                }
            }
            while budget > 0 && scan_frames > 0 {
                budget -= 1;
                let proc = self.procs.get_mut(&pid)?;
                let again = unwind_user(proc, s, &skip, memo, &mut scan_frames);
                if has_stray_address(proc, &again) {
                    break;
                }
                if again.rooted {
                    let stack = self.unwound_frames(pid, &again, cat);
                    if stack.evals == want {
                        return Some((again, stack));
                    }
                }
                match again.scanned_from.and(again.scan_slot) {
                    Some(at) => skip.push(at),
                    None => break,
                }
            }
        }
        None
    }

    /// Where an anonymous function of the Python runtime waits for the GIL
    /// (`python::is_anonymous_gil_wait`): `take_gil` or `drop_gil` in an interpreter without a
    /// symbol table.
    pub(super) fn anonymous_gil_frame(&self, native: &[(FrameId, Arc<str>)]) -> Option<usize> {
        native.windows(2).position(|w| {
            let (caller, callee) = (&w[0], &w[1]);
            let in_interpreter = self.profile.funcs[self.profile.frames[caller.0].func]
                .lib
                .is_some_and(|l| self.profile.libs[l].is_interpreter());
            crate::python::is_anonymous_gil_wait(&caller.1, in_interpreter, &callee.1)
        })
    }
}

/// `-v -v` (debug): why a sample's eval-loop frames did not pair with its activations.
fn log_mismatch(s: &RawSample, unwound: &Unwound, evals: usize, activations: usize) {
    if !log::log_enabled!(log::Level::Debug) {
        return;
    }
    let addrs: Vec<String> = unwound
        .frames
        .iter()
        .map(|f| format!("{:#x}{}", f.addr, if f.is_return { "" } else { "!" }))
        .collect();
    log::debug!(
        "eval frames {evals}, activations {activations}: scanned from {:?}, late from {:?}, \
         ip {:#x} sp {:#x} bp {:#x} lr {:#x}, flags {:#x}, stack {} bytes {:x?}: {}",
        unwound.scanned_from,
        unwound.late_from,
        s.ip,
        s.sp,
        s.bp,
        s.lr,
        s.flags,
        s.stack.len(),
        (0..6)
            .map(|i| s.read_stack(s.sp + 8 * i))
            .collect::<Vec<_>>(),
        addrs.join(" ")
    );
}
