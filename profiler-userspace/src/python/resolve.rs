//! A sample's Python frames: its code objects named (from what was read, or the copies the
//! frame walk took), grouped into interpreter activations, and merged into its native stack.

use std::sync::Arc;

use rustc_hash::FxHashMap;

use profiler_common::{
    PY_FRAME_SNAP_SHIFT, SAMPLE_PY_CYCLE, SAMPLE_PY_MISS, SAMPLE_PY_READ_FAILED, SAMPLE_PY_THREAD,
    SAMPLE_PY_TRUNCATED,
};

use super::code::CodeInfo;
use super::discover::PyProcess;
use super::frame_chain::FrameChain;
use super::layout::Activations;
use super::registry::PythonRegistry;
use super::remote::{self, le_u64};
use super::{
    merge, plausible_object, FrameRef, ProfileSink, PyEvent, PyThreadState, PythonFrames,
    TaskSplice, WalkedThread,
};
use crate::capture::record::RawSample;

impl PythonRegistry {
    /// The Python frames of a sample of a known Python process (`None` for other processes);
    /// frames are interned and events counted through `out`.
    pub fn resolve(&mut self, s: &RawSample, out: &mut impl ProfileSink) -> Option<PythonFrames> {
        let (epoch, opts) = (self.epoch, self.opts);
        let p = self.procs.get_mut(&s.pid)?;
        note_thread_map(p, s, out);
        if s.flags & SAMPLE_PY_THREAD == 0 {
            return Some(PythonFrames {
                activations: Vec::new(),
                state: None,
                tasks: None,
            });
        }
        out.count(PyEvent::Record);
        for (flag, event) in [
            (SAMPLE_PY_READ_FAILED, PyEvent::ReadFailed),
            (SAMPLE_PY_TRUNCATED, PyEvent::Truncated),
            (SAMPLE_PY_CYCLE, PyEvent::Cycle),
        ] {
            if s.flags & flag != 0 {
                out.count(event);
            }
        }
        let has_gil = s.py_gil_locked != 0 && s.py_gil_holder == s.py_tstate && s.py_tstate != 0;
        let st = PyThreadState {
            has_gil,
            gc: has_gil && s.py_gc_collecting != 0,
            main_thread: s.tid == s.pid,
        };
        let frames = p.believed_frames(s, epoch, out);
        // `--async-aware`: the running task's await chain, and (found below) the outermost
        // frame of its coroutine in the sample.
        let chain = match s.py_task {
            0 => None,
            task if opts.tasks.aware() => p.await_chain(task, s.tid, epoch),
            _ => None,
        };
        let coro_code = chain.as_ref().map(|c| c.coro_code);
        let mut walk = Activation {
            epoch,
            leaf: opts.opcodes,
            coro_code,
            task_from: None,
            known: &mut self.known,
        };
        let activations = p.activations(s, frames, &mut walk, out);
        let tasks = match (chain, walk.task_from) {
            (Some(c), Some(from)) => {
                out.count(PyEvent::AsyncTask);
                if c.cut {
                    out.count(PyEvent::AsyncCut);
                }
                let prefix = p.task_prefix(out, s.py_task, &c, epoch);
                Some(TaskSplice { from, prefix })
            }
            (Some(_), None) => {
                out.count(PyEvent::AsyncMismatch);
                None
            }
            _ => None,
        };
        Some(PythonFrames {
            activations,
            state: Some(st),
            tasks,
        })
    }

    /// Merges a sample's activations into its native frames (root first) at the eval-loop
    /// frames, counting whether they paired up.
    pub fn merge(
        &self,
        native: &[(FrameRef, Arc<str>)],
        classes: &[merge::FrameClass],
        activations: &[Vec<FrameRef>],
        truncated: bool,
        out: &mut impl ProfileSink,
    ) -> Vec<FrameRef> {
        let (frames, outcome) = merge::merge(
            native,
            classes,
            activations,
            truncated,
            self.opts.show_internal,
        );
        if let Some(e) = outcome {
            if e == PyEvent::MergeMismatch && log::log_enabled!(log::Level::Debug) {
                let names: Vec<&str> = native.iter().map(|(_, n)| n.as_ref()).collect();
                let sizes: Vec<usize> = activations.iter().map(Vec::len).collect();
                log::debug!(
                    "merge mismatch: activations of {sizes:?} frames, native (truncated {truncated}): {}",
                    names.join(";")
                );
            }
            out.count(e);
        }
        frames
    }

    /// Walks the Python frames of a thread from outside, as the BPF program does at a sample
    /// (`dump`, for a thread that is blocked: its frames do not change while it is), with the
    /// thread state and the GIL and GC words. `None` when the process is not a known Python
    /// process or the thread has no thread state.
    pub fn walk_thread(&self, pid: u32, tid: u32) -> Option<WalkedThread> {
        let p = self.procs.get(&pid)?;
        let tstate = *p.threads.states.get(&tid)?;
        let c = &p.config;
        let r = &p.rt.remote;
        let mut out = WalkedThread {
            tstate,
            frames: Vec::new(),
            gil_holder: r.u64(c.gil_last_holder).unwrap_or(0),
            gil_locked: r.u32(c.gil_locked).unwrap_or(0),
            gc_collecting: r.u32(c.gc_collecting).unwrap_or(0),
            running_task: match c.tstate_running_task {
                profiler_common::NO_OFFSET => 0,
                off => r.u64(tstate + off as u64).unwrap_or(0),
            },
            read_failed: false,
        };
        let mut frame = r.u64(tstate + c.tstate_frame as u64)?;
        if c.cframe_frame != profiler_common::NO_OFFSET && frame != 0 {
            let cframe = frame;
            frame = r.u64(cframe + c.cframe_frame as u64)?;
            // As the BPF walk: a `_PyCFrame` whose frame is not set yet stands for its caller's.
            if frame == 0 || r.u64(frame + c.frame_code as u64).is_none() {
                frame = r
                    .u64(cframe + c.cframe_previous as u64)
                    .filter(|&p| p != 0)
                    .and_then(|p| r.u64(p + c.cframe_frame as u64))
                    .unwrap_or(0);
            }
        }
        let read = (c.frame_read_size as usize).clamp(8, profiler_common::FRAME_BUF);
        let mut chain = FrameChain::new(r, frame, c.frame_previous, read);
        for (_, buf) in chain.by_ref() {
            let u64_at = |off: u32| le_u64(&buf, off as usize);
            let code = u64_at(c.frame_code).unwrap_or(0) & c.code_mask;
            let instr = if c.layout == profiler_common::PY_LAYOUT_FRAMEOBJECT {
                remote::le_u32(&buf, c.frame_instr as usize).unwrap_or(0) as i32
            } else {
                let ip = u64_at(c.frame_instr).unwrap_or(0);
                profiler_common::interp_instruction(ip, code, c.code_adaptive)
            };
            let flags = if c.frame_owner != profiler_common::NO_OFFSET {
                buf.get(c.frame_owner as usize).copied().unwrap_or(0) as u32
            } else {
                0
            };
            out.frames
                .push(profiler_common::PyFrame { code, instr, flags });
            // 3.11-3.13: the running task from the innermost `Handle._run`, as at a sample.
            if c.handle_run_code != 0 && code == c.handle_run_code && out.running_task == 0 {
                out.running_task = u64_at(c.frame_self)
                    .and_then(|h| r.u64(h.wrapping_add(c.handle_callback as u64)))
                    .and_then(|cb| r.u64(cb.wrapping_add(c.step_task as u64)))
                    .unwrap_or(0);
            }
        }
        out.read_failed = chain.read_failed;
        Some(out)
    }
}

/// Counts a thread missing from the BPF thread map, and notes signs that the process's thread
/// map is behind (`threads_due`): a thread state the BPF side found by itself, or a thread with
/// none that the last read did not list (a thread listed then without one is a native thread,
/// and stays one until the next quiet read).
fn note_thread_map(p: &mut PyProcess, s: &RawSample, out: &mut impl ProfileSink) {
    if s.flags & SAMPLE_PY_MISS != 0 {
        out.count(PyEvent::ThreadMiss);
    }
    let unknown = !p.threads.states.contains_key(&s.tid);
    if (s.flags & SAMPLE_PY_THREAD != 0 && unknown)
        || (s.flags & SAMPLE_PY_MISS != 0 && unknown && !p.threads.listed.contains(&s.tid))
    {
        p.threads.changed = true;
    }
}

/// What grouping a sample's frames into activations carries from frame to frame.
struct Activation<'a> {
    epoch: u64,
    /// The next frame named is the innermost one, and is named with its instruction
    /// (`--opcodes`).
    leaf: bool,
    /// The running task's coroutine (`--async-aware`), and the frame found running it.
    coro_code: Option<u64>,
    task_from: Option<FrameRef>,
    /// Code objects settled since the BPF side was last told (`PythonRegistry::known`).
    known: &'a mut Vec<u64>,
}

/// A sample's frames as believed: each with whether it is a shim (no code of its own), and the
/// code object of each other frame, read once per distinct address.
struct TrustedFrames<'s> {
    frames: &'s [profiler_common::PyFrame],
    shims: Vec<bool>,
    codes: FxHashMap<u64, Option<Arc<CodeInfo>>>,
}

impl PyProcess {
    /// The frames of sample `s` up to where its chain stops being believable, with their code
    /// objects. A chain read while the eval loop links a new frame may run into stack garbage
    /// (3.11 and 3.12 make a new `_PyCFrame` current before they set its frame): a code pointer
    /// no object can have ends the chain there, and nothing after it is believed. So does a
    /// frame whose code, copied at the sample, was another kind of object then.
    fn believed_frames<'s>(
        &mut self,
        s: &'s RawSample,
        epoch: u64,
        out: &mut impl ProfileSink,
    ) -> TrustedFrames<'s> {
        let (layout, none) = (&self.rt.layout, self.rt.none_addr);
        let torn = s.py_frames.iter().position(|f| {
            !layout.is_shim(f.flags as u8, f.code, none)
                && (!plausible_object(f.code)
                    || self.cache.snap_not_code(&self.rt, f, &s.code_snaps))
        });
        if torn.is_some() {
            out.count(PyEvent::ReadFailed);
        }
        let frames = &s.py_frames[..torn.unwrap_or(s.py_frames.len())];
        let shims: Vec<bool> = frames
            .iter()
            .map(|f| layout.is_shim(f.flags as u8, f.code, none))
            .collect();
        let mut uniq: Vec<u64> = frames
            .iter()
            .zip(&shims)
            .filter(|(_, shim)| !**shim)
            .map(|(f, _)| f.code)
            .collect();
        uniq.sort_unstable();
        uniq.dedup();
        let codes = uniq.iter().copied().zip(self.code(&uniq, epoch)).collect();
        TrustedFrames {
            frames,
            shims,
            codes,
        }
    }

    /// The believed frames of `s` grouped into interpreter activations, outermost first, each
    /// root first: shims and entry flags delimit them.
    fn activations(
        &mut self,
        s: &RawSample,
        b: TrustedFrames,
        walk: &mut Activation,
        out: &mut impl ProfileSink,
    ) -> Vec<Vec<FrameRef>> {
        let rule = self.rt.layout.activations;
        // Sized up front: grown from empty, they were reallocated two or three times a sample.
        let mut activations: Vec<Vec<FrameRef>> = Vec::with_capacity(8);
        let mut cur: Vec<FrameRef> = Vec::with_capacity(b.frames.len()); // innermost first
        for (f, shim) in b.frames.iter().zip(&b.shims) {
            if *shim {
                if !cur.is_empty() {
                    activations.push(std::mem::take(&mut cur));
                }
                continue;
            }
            let now = b.codes.get(&f.code).cloned().flatten();
            let info = self.code_at_sample(s, f, now, walk);
            // 3.13+ runs a class's Python `__init__` under a frame of the interpreter's own
            // (`_Py_InitCleanup`: it checks that `__init__` returned None), in the same eval
            // loop: no code of the program, and no activation boundary.
            if info.as_deref().is_some_and(CodeInfo::is_init_cleanup) {
                continue;
            }
            // The eval loop's entry frame, its owner byte not written yet (its first
            // instructions): an activation boundary, as a shim, never a frame of the program.
            if info.as_deref().is_some_and(CodeInfo::is_trampoline) {
                if !cur.is_empty() {
                    activations.push(std::mem::take(&mut cur));
                }
                continue;
            }
            // Only the innermost frame runs an instruction of its own (the others are at their
            // call), even when that frame's code could not be read.
            let innermost = std::mem::take(&mut walk.leaf);
            let frame = match info {
                Some(ci) => self
                    .cache
                    .frame_for(&self.rt, out, f.code, &ci, f.instr, innermost),
                None => {
                    out.count(PyEvent::Unresolved);
                    out.unresolved_frame()
                }
            };
            cur.push(frame);
            if Some(f.code) == walk.coro_code {
                walk.task_from = Some(frame);
            }
            let ends = match rule {
                Activations::PerFrame => true,
                Activations::EntryFlag => f.flags & 0xff != 0,
                Activations::Shim => false,
            };
            if ends {
                activations.push(std::mem::take(&mut cur));
            }
        }
        if !cur.is_empty() {
            activations.push(cur);
        }
        // Built innermost first at both levels: flip to outermost activation first, root-first.
        activations.reverse();
        for a in &mut activations {
            a.reverse();
        }
        activations
    }

    /// The code object frame `f` ran at the sample: what is at its address now (`now`), or the
    /// copy of its head the frame walk took then (`CodeCache::sampled_code`). A copied code
    /// object seen long enough at its address is settled: the BPF side stops copying it.
    fn code_at_sample(
        &mut self,
        s: &RawSample,
        f: &profiler_common::PyFrame,
        now: Option<Arc<CodeInfo>>,
        walk: &mut Activation,
    ) -> Option<Arc<CodeInfo>> {
        let snap = (f.flags >> PY_FRAME_SNAP_SHIFT) as usize & 0xff;
        match snap.checked_sub(1) {
            Some(k) if k < s.code_snaps.len() => {
                // A gone fork's memory is read from its parent: code that is not the parent's
                // too (made after the fork) is named only from what was copied with it.
                let rt = self.gone_fork.as_deref().unwrap_or(&self.rt);
                let info = self.cache.sampled_code(rt, f.code, &s.code_snaps[k], now);
                if info
                    .as_ref()
                    .is_some_and(|c| self.cache.settled(f.code, c, s.time_ns, walk.epoch))
                {
                    walk.known
                        .push(profiler_common::known_code_word(s.pid, f.code));
                }
                info
            }
            _ => now,
        }
    }
}
