//! Per-version CPython layouts (x86-64 Linux, default GIL builds), as data. 3.13+ layouts are
//! checked against, and overridden by, the target's own `_Py_DebugOffsets`.
//!
//! The numbers were compiled against each version's headers and checked on live interpreters
//! (the end-to-end tests walk every supported version).

use profiler_common::{PyProcConfig, NO_OFFSET, PY_LAYOUT_FRAMEOBJECT, PY_LAYOUT_INTERP};

use super::remote::{le_u64, Remote};

/// Which frame-chain conventions a version uses for activations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activations {
    /// 3.8-3.10: every frame is its own `_PyEval_EvalFrameDefault` call.
    PerFrame,
    /// 3.11: the first frame of an activation has `is_entry`.
    EntryFlag,
    /// 3.12+: a shim frame (owner >= 3 or a non-code executable) sits below each activation.
    Shim,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    pub minor: u32,
    pub interp_head: u64,
    pub interp_next: u64,
    pub interp_threads_head: u64,
    pub tstate_next: u64,
    pub tstate_interp: u64,
    pub tstate_frame: u32,
    pub cframe_frame: u32,
    pub thread_id: u64,
    pub native_thread_id: Option<u64>,
    pub frame_code: u32,
    pub frame_previous: u32,
    pub frame_instr: u32,
    pub frame_owner: u32,
    /// `f_locals`: set only in frames of code that is not a function's (module and class bodies).
    pub frame_locals: u32,
    pub frame_read: u32,
    /// The frame's first local (`f_localsplus` / `localsplus`).
    pub frame_localsplus: u32,
    pub code_firstlineno: usize,
    pub code_filename: usize,
    pub code_name: usize,
    pub code_qualname: Option<usize>,
    pub code_linetable: usize,
    pub code_adaptive: u32,
    pub unicode_ascii_data: usize,
    pub unicode_compact_data: usize,
    /// Runtime-relative `last_holder` (<= 3.11), or the interpreter's `ceval.gil` pointer (3.12+).
    pub gil_in_runtime: Option<u64>,
    pub interp_gil_ptr: Option<u64>,
    /// `gc.collecting`: runtime-relative (3.8) or interpreter-relative.
    pub gc_collecting_runtime: Option<u64>,
    pub gc_collecting_interp: Option<u64>,
    pub code_mask: u64,
    pub activations: Activations,
    /// Thread-state offsets of the exception being raised (`curexc_type` / `current_exception`)
    /// and of `exc_info`; `_PyErr_StackItem` offsets of `exc_value` and `previous_item`.
    pub tstate_cur_exc: u32,
    pub tstate_exc_info: u32,
    pub err_exc_value: u32,
    pub err_previous: u32,
    /// 3.14+, from `_Py_DebugOffsets` (asyncio's coroutine chains): a generator's embedded
    /// frame and state byte, and a frame's `stackpointer`.
    pub gen_iframe: Option<u64>,
    pub gen_frame_state: Option<u64>,
    pub frame_stackpointer: Option<u64>,
}

/// The built-in layout of `3.minor`.
pub fn builtin(minor: u32) -> Option<Layout> {
    Some(match minor {
        8..=10 => legacy(minor),
        11 => modern(minor),
        12 => layout_312(),
        13 | 14 => layout_313_314(minor),
        15 => layout_315(),
        _ => return None,
    })
}

/// 3.8-3.10: frame objects.
fn legacy(minor: u32) -> Layout {
    Layout {
        minor,
        interp_head: 32,
        interp_next: 0,
        interp_threads_head: 8,
        tstate_next: 8,
        tstate_interp: 16,
        tstate_frame: 24,
        cframe_frame: NO_OFFSET,
        thread_id: 176,
        native_thread_id: None,
        frame_code: 32,
        frame_previous: 24,
        frame_instr: if minor == 10 { 96 } else { 104 },
        frame_owner: NO_OFFSET,
        frame_locals: 56,
        frame_read: 112,
        frame_localsplus: if minor == 10 { 352 } else { 360 },
        code_firstlineno: 40,
        code_filename: 104,
        code_name: 112,
        code_qualname: None,
        code_linetable: 120,
        code_adaptive: 0,
        unicode_ascii_data: 48,
        unicode_compact_data: 72,
        gil_in_runtime: Some(if minor == 8 { 1160 } else { 360 }),
        interp_gil_ptr: None,
        gc_collecting_runtime: (minor == 8).then_some(544),
        gc_collecting_interp: (minor != 8).then_some(816),
        code_mask: !0,
        activations: Activations::PerFrame,
        tstate_cur_exc: 88,
        tstate_exc_info: 144,
        err_exc_value: 8,
        err_previous: 24,
        gen_iframe: None,
        gen_frame_state: None,
        frame_stackpointer: None,
    }
}

/// 3.11: interpreter frames, the base of the layouts after it.
fn modern(minor: u32) -> Layout {
    Layout {
        minor,
        interp_head: 40,
        interp_next: 0,
        interp_threads_head: 16,
        tstate_next: 8,
        tstate_interp: 16,
        tstate_frame: 56,
        cframe_frame: 8,
        thread_id: 152,
        native_thread_id: Some(160),
        frame_code: 32,
        frame_previous: 48,
        frame_instr: 56,
        frame_owner: 68,
        frame_locals: 24,
        frame_read: 72,
        frame_localsplus: 72,
        code_firstlineno: 72,
        code_filename: 112,
        code_name: 120,
        code_qualname: Some(128),
        code_linetable: 136,
        code_adaptive: 184,
        unicode_ascii_data: 48,
        unicode_compact_data: 72,
        gil_in_runtime: Some(368),
        interp_gil_ptr: None,
        gc_collecting_runtime: None,
        gc_collecting_interp: Some(848),
        code_mask: !0,
        activations: Activations::EntryFlag,
        tstate_cur_exc: 96,
        tstate_exc_info: 120,
        err_exc_value: 0,
        err_previous: 8,
        gen_iframe: None,
        gen_frame_state: None,
        frame_stackpointer: None,
    }
}

fn layout_312() -> Layout {
    Layout {
        interp_threads_head: 72,
        cframe_frame: 0,
        thread_id: 136,
        native_thread_id: Some(144),
        frame_code: 0,
        frame_previous: 8,
        frame_owner: 70,
        frame_locals: 40,
        code_firstlineno: 68,
        code_adaptive: 192,
        unicode_ascii_data: 40,
        unicode_compact_data: 56,
        gil_in_runtime: None,
        interp_gil_ptr: Some(384),
        gc_collecting_interp: Some(312),
        activations: Activations::Shim,
        tstate_exc_info: 104,
        ..modern(12)
    }
}

fn layout_313_314(minor: u32) -> Layout {
    Layout {
        interp_head: if minor == 13 { 632 } else { 808 },
        interp_next: if minor == 13 { 7264 } else { 7272 },
        interp_threads_head: 7344,
        tstate_frame: 72,
        cframe_frame: NO_OFFSET,
        thread_id: 152,
        native_thread_id: Some(160),
        frame_code: 0,
        frame_previous: 8,
        frame_owner: if minor == 13 { 70 } else { 74 },
        frame_locals: 40,
        frame_read: if minor == 13 { 72 } else { 80 },
        frame_localsplus: if minor == 13 { 72 } else { 80 },
        code_firstlineno: 68,
        code_adaptive: if minor == 13 { 200 } else { 208 },
        unicode_ascii_data: 40,
        unicode_compact_data: 56,
        gil_in_runtime: None,
        interp_gil_ptr: Some(16),
        gc_collecting_interp: Some(7600),
        code_mask: if minor == 13 { !0 } else { !3 },
        activations: Activations::Shim,
        tstate_cur_exc: 112,
        ..modern(minor)
    }
}

// 3.15: 3.14's frames and code objects; the thread state gained the GIL flags and the
// base frame before `thread_id`, the interpreter lost a word before its thread list,
// and the GC's state shrank. Read off Debian's 3.15.2 (its debug offsets, and live).
fn layout_315() -> Layout {
    Layout {
        interp_head: 936,
        interp_next: 7264,
        interp_threads_head: 7336,
        tstate_frame: 72,
        cframe_frame: NO_OFFSET,
        thread_id: 176,
        native_thread_id: Some(184),
        frame_code: 0,
        frame_previous: 8,
        frame_owner: 74,
        frame_locals: 40,
        frame_read: 80,
        frame_localsplus: 80,
        code_firstlineno: 68,
        code_adaptive: 208,
        unicode_ascii_data: 40,
        unicode_compact_data: 56,
        gil_in_runtime: None,
        interp_gil_ptr: Some(16),
        gc_collecting_interp: Some(7512),
        code_mask: !3,
        activations: Activations::Shim,
        tstate_cur_exc: 136,
        tstate_exc_info: 144,
        ..modern(15)
    }
}

/// What `_Py_DebugOffsets` (3.13+) says, where it differs from or confirms the built-in layout.
#[derive(Debug)]
pub struct DebugOffsets {
    pub free_threaded: bool,
}

pub const DEBUG_COOKIE: &[u8; 8] = b"xdebugpy";

/// Where each field a stack walker needs sits in `_Py_DebugOffsets`, in bytes from its start.
/// The struct grows between minor versions (3.14 adds `threads_main`, `stackpointer`, `co_tlbc`
/// and more), so each version has its own table; 3.14's was read off Debian's 3.14.10 and
/// checked against the values the built-in layout has.
struct DebugPositions {
    interp_next: usize,
    interp_threads_head: usize,
    interp_gc: usize,
    tstate_next: usize,
    tstate_interp: usize,
    tstate_frame: usize,
    thread_id: usize,
    native_thread_id: usize,
    frame_previous: usize,
    frame_code: usize,
    frame_instr: usize,
    frame_owner: usize,
    code_filename: usize,
    code_name: usize,
    code_qualname: usize,
    code_linetable: usize,
    code_firstlineno: usize,
    code_adaptive: usize,
    gc_collecting: usize,
    /// `gen_object.gi_iframe` and `gi_frame_state`, and `interpreter_frame.stackpointer`
    /// (3.14+).
    gen_iframe: Option<usize>,
    gen_frame_state: Option<usize>,
    frame_stackpointer: Option<usize>,
    /// Bytes of the struct to read.
    len: usize,
}

const DEBUG_POSITIONS_313: DebugPositions = DebugPositions {
    interp_next: 64,
    interp_threads_head: 72,
    interp_gc: 80,
    tstate_next: 168,
    tstate_interp: 176,
    tstate_frame: 184,
    thread_id: 192,
    native_thread_id: 200,
    frame_previous: 232,
    frame_code: 240,
    frame_instr: 248,
    frame_owner: 264,
    code_filename: 280,
    code_name: 288,
    code_qualname: 296,
    code_linetable: 304,
    code_firstlineno: 312,
    code_adaptive: 344,
    gc_collecting: 576,
    gen_iframe: None,
    gen_frame_state: None,
    frame_stackpointer: None,
    len: 584,
};

const DEBUG_POSITIONS_314: DebugPositions = DebugPositions {
    interp_next: 64,
    interp_threads_head: 72,
    interp_gc: 88,
    tstate_next: 192,
    tstate_interp: 200,
    tstate_frame: 208,
    thread_id: 216,
    native_thread_id: 224,
    frame_previous: 256,
    frame_code: 264,
    frame_instr: 272,
    frame_owner: 288,
    code_filename: 320,
    code_name: 328,
    code_qualname: 336,
    code_linetable: 344,
    code_firstlineno: 352,
    code_adaptive: 384,
    gc_collecting: 656,
    gen_iframe: Some(680),
    gen_frame_state: Some(688),
    frame_stackpointer: Some(296),
    len: 696,
};

/// 3.15 adds the thread state's `holds_gil`, `gil_requested`, `current_exception`,
/// `exc_state`, three frame pointers (`base_frame` among them) and an `err_stackitem` group, and
/// the GC's `frame`; read off Debian's 3.15.2 and checked against the thread and frame it
/// describes, live (`thread_id` against `pthread_self`, `holds_gil` and the GC's `collecting`
/// while they are set).
const DEBUG_POSITIONS_315: DebugPositions = DebugPositions {
    interp_next: 64,
    interp_threads_head: 72,
    interp_gc: 88,
    tstate_next: 192,
    tstate_interp: 200,
    tstate_frame: 208,
    thread_id: 240,
    native_thread_id: 248,
    frame_previous: 320,
    frame_code: 328,
    frame_instr: 336,
    frame_owner: 352,
    code_filename: 384,
    code_name: 392,
    code_qualname: 400,
    code_linetable: 408,
    code_firstlineno: 416,
    code_adaptive: 448,
    gc_collecting: 760,
    gen_iframe: Some(808),
    gen_frame_state: Some(816),
    frame_stackpointer: Some(360),
    len: 824,
};

/// Reads `_Py_DebugOffsets` at the start of `_PyRuntime` and applies it to `layout` (3.13 to
/// 3.15; a later version keeps only the runtime group, which has not moved).
pub fn apply_debug_offsets(
    remote: &Remote,
    runtime: u64,
    layout: &mut Layout,
) -> Option<DebugOffsets> {
    let head = remote.read(runtime, 48)?;
    if &head[0..8] != DEBUG_COOKIE {
        return None;
    }
    let version = le_u64(&head, 8)?;
    let free_threaded = le_u64(&head, 16)? != 0;
    // Sanity bounds: untrusted numbers never become huge offsets.
    let ok = |v: &u64| *v < (1 << 20);
    if let Some(v) = le_u64(&head, 40).filter(ok) {
        layout.interp_head = v;
    }
    let pos = match (version >> 16) & 0xff {
        13 => &DEBUG_POSITIONS_313,
        14 => &DEBUG_POSITIONS_314,
        15 => &DEBUG_POSITIONS_315,
        _ => return Some(DebugOffsets { free_threaded }),
    };
    let b = remote.read(runtime, pos.len)?;
    let f = |off: usize| le_u64(&b, off).filter(ok);
    let builtin = layout.clone();
    let set64 = |off: usize, slot: &mut u64| *slot = f(off).unwrap_or(*slot);
    let set32 = |off: usize, slot: &mut u32| *slot = f(off).map_or(*slot, |v| v as u32);
    let setsz = |off: usize, slot: &mut usize| *slot = f(off).map_or(*slot, |v| v as usize);
    set64(pos.interp_next, &mut layout.interp_next);
    set64(pos.interp_threads_head, &mut layout.interp_threads_head);
    set64(pos.tstate_next, &mut layout.tstate_next);
    set64(pos.tstate_interp, &mut layout.tstate_interp);
    set64(pos.thread_id, &mut layout.thread_id);
    layout.native_thread_id = f(pos.native_thread_id).or(layout.native_thread_id);
    set32(pos.tstate_frame, &mut layout.tstate_frame);
    set32(pos.frame_previous, &mut layout.frame_previous);
    set32(pos.frame_code, &mut layout.frame_code);
    set32(pos.frame_instr, &mut layout.frame_instr);
    set32(pos.frame_owner, &mut layout.frame_owner);
    set32(pos.code_adaptive, &mut layout.code_adaptive);
    setsz(pos.code_filename, &mut layout.code_filename);
    setsz(pos.code_name, &mut layout.code_name);
    setsz(pos.code_linetable, &mut layout.code_linetable);
    setsz(pos.code_firstlineno, &mut layout.code_firstlineno);
    layout.code_qualname = f(pos.code_qualname)
        .map(|v| v as usize)
        .or(layout.code_qualname);
    let nonzero = |p: Option<usize>| p.and_then(f).filter(|&v| v > 0);
    layout.gen_iframe = nonzero(pos.gen_iframe);
    layout.gen_frame_state = nonzero(pos.gen_frame_state);
    layout.frame_stackpointer = nonzero(pos.frame_stackpointer);
    if let (Some(gc), Some(collecting)) = (f(pos.interp_gc), f(pos.gc_collecting)) {
        layout.gc_collecting_interp = Some(gc + collecting);
    }
    // Every field the frame walk reads must lie inside the bytes the BPF side reads of a frame;
    // offsets that do not fit are not believed (the built-in layout stays).
    let frame_end = [
        layout.frame_owner,
        layout.frame_instr + 7,
        layout.frame_previous + 7,
        layout.frame_code + 7,
    ]
    .into_iter()
    .max()
    .unwrap_or(0);
    if frame_end >= layout.frame_read {
        layout.frame_read = (frame_end + 1).next_multiple_of(8);
    }
    if layout.frame_read as usize > profiler_common::FRAME_BUF {
        *layout = builtin;
    }
    Some(DebugOffsets { free_threaded })
}

impl Layout {
    /// The BPF side of the layout, with the process's addresses filled in.
    pub fn proc_config(
        &self,
        gil: Option<(u64, u64)>,
        gc_collecting: Option<u64>,
        none_addr: u64,
        interp: u64,
    ) -> PyProcConfig {
        PyProcConfig {
            layout: if self.minor <= 10 {
                PY_LAYOUT_FRAMEOBJECT
            } else {
                PY_LAYOUT_INTERP
            },
            tstate_frame: self.tstate_frame,
            cframe_frame: self.cframe_frame,
            frame_code: self.frame_code,
            frame_previous: self.frame_previous,
            frame_instr: self.frame_instr,
            frame_owner: self.frame_owner,
            code_adaptive: self.code_adaptive,
            tstate_status: NO_OFFSET,
            frame_read_size: self.frame_read,
            code_mask: self.code_mask,
            gil_last_holder: gil.map(|g| g.0).unwrap_or(0),
            gil_locked: gil.map(|g| g.1).unwrap_or(0),
            gc_collecting: gc_collecting.unwrap_or(0),
            tstate_cur_exc: self.tstate_cur_exc,
            tstate_exc_info: self.tstate_exc_info,
            err_exc_value: self.err_exc_value,
            err_previous: self.err_previous,
            none_addr,
            interp,
            interp_threads_head: self.interp_threads_head as u32,
            tstate_next: self.tstate_next as u32,
            tstate_thread_id: self.thread_id as u32,
            code_head_len: super::code::header_len(self).min(profiler_common::PY_CODE_SNAP) as u32,
            frame_locals: if self.frame_locals < self.frame_read {
                self.frame_locals
            } else {
                NO_OFFSET
            },
            code_qualname: self.code_qualname.unwrap_or(self.code_name) as u32,
            code_filename: self.code_filename as u32,
            tstate_running_task: NO_OFFSET,
            interp_head: 0,
            handle_run_code: 0,
            frame_self: NO_OFFSET,
            handle_callback: NO_OFFSET,
            step_task: NO_OFFSET,
            cframe_previous: match self.cframe_frame {
                NO_OFFSET => NO_OFFSET,
                // `current_frame` then `previous` (3.11: after an int, 3.12: first).
                at => at + 8,
            },
            entry_mark: match (self.cframe_frame, self.minor) {
                (NO_OFFSET, _) => 0,
                (_, 11) => 1,
                _ => 3,
            },
            thread_id_below_tp: if cfg!(target_arch = "aarch64") {
                NO_OFFSET
            } else {
                0
            },
        }
    }

    /// Whether a frame (by its owner byte and code address) is a shim/entry boundary, and
    /// whether it starts an activation (3.11 entry frames).
    pub fn is_shim(&self, owner: u8, code: u64, none_addr: u64) -> bool {
        self.activations == Activations::Shim
            && (owner >= 3 || code == 0 || (none_addr != 0 && code == none_addr))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The BPF walk reads a `_PyCFrame`'s `current_frame` and `previous` in one read.
    #[test]
    fn a_cframes_previous_follows_its_frame() {
        for minor in [11, 12] {
            let c = builtin(minor).unwrap().proc_config(None, None, 0, 0);
            assert_eq!(c.cframe_previous, c.cframe_frame + 8, "3.{minor}");
            assert_eq!(c.entry_mark, if minor == 11 { 1 } else { 3 });
        }
        let c = builtin(13).unwrap().proc_config(None, None, 0, 0);
        assert_eq!((c.cframe_previous, c.entry_mark), (NO_OFFSET, 0));
    }

    #[test]
    fn every_supported_version_has_a_layout() {
        for minor in 8..=14 {
            let l = builtin(minor).unwrap();
            assert!(l.frame_read as usize <= profiler_common::FRAME_BUF);
            assert!((l.frame_owner == NO_OFFSET) || l.frame_owner < l.frame_read);
            assert!(l.frame_instr < l.frame_read && l.frame_previous < l.frame_read);
        }
        assert!(builtin(7).is_none() && builtin(16).is_none());
        assert_eq!(builtin(15).unwrap().thread_id, 176);
        assert_eq!(builtin(12).unwrap().interp_threads_head, 72);
        assert_eq!(builtin(14).unwrap().code_mask, !3);
    }

    fn put(b: &mut [u8], off: usize, v: u64) {
        b[off..off + 8].copy_from_slice(&v.to_le_bytes());
    }

    /// A `_Py_DebugOffsets` of `version` with the interpreter list at `interp_head` and
    /// `fields` (position, value), laid out in this process's memory.
    fn debug_offsets(version: u64, interp_head: u64, fields: &[(usize, u64)]) -> Vec<u8> {
        let mut b = vec![0u8; 1024];
        b[..8].copy_from_slice(DEBUG_COOKIE);
        put(&mut b, 8, version);
        put(&mut b, 40, interp_head);
        for &(off, v) in fields {
            put(&mut b, off, v);
        }
        b
    }

    /// `minor`'s built-in layout with every field the debug offsets carry wrong, so that each
    /// must come from them.
    fn wrong_but_for_debug_offsets(minor: u32) -> Layout {
        Layout {
            interp_head: 1,
            interp_next: 1,
            interp_threads_head: 1,
            tstate_next: 1,
            tstate_interp: 1,
            tstate_frame: 1,
            thread_id: 1,
            native_thread_id: None,
            frame_code: 1,
            frame_previous: 1,
            frame_instr: 1,
            frame_owner: 1,
            code_firstlineno: 1,
            code_filename: 1,
            code_name: 1,
            code_qualname: None,
            code_linetable: 1,
            code_adaptive: 1,
            gc_collecting_interp: None,
            ..builtin(minor).unwrap()
        }
    }

    /// `_Py_DebugOffsets` as Debian's 3.15.2 has it (read live): applied over a layout with
    /// every such field wrong, it gives the built-in 3.15 layout field for field.
    #[test]
    fn debug_offsets_of_3_15() {
        let b = debug_offsets(
            0x030f_02f0,
            936,
            &[
                (64, 7264),
                (72, 7336),
                (88, 7400),
                (192, 8),
                (200, 16),
                (208, 72),
                (240, 176),
                (248, 184),
                (320, 8),
                (328, 0),
                (336, 56),
                (352, 74),
                (384, 112),
                (392, 120),
                (400, 128),
                (408, 136),
                (416, 68),
                (448, 208),
                (760, 112),
                (360, 64),
                (808, 72),
                (816, 67),
            ],
        );
        let remote = Remote {
            pid: std::process::id(),
        };
        let mut l = wrong_but_for_debug_offsets(15);
        apply_debug_offsets(&remote, b.as_ptr() as u64, &mut l).unwrap();
        assert_eq!(
            l,
            Layout {
                gen_iframe: Some(72),
                gen_frame_state: Some(67),
                frame_stackpointer: Some(64),
                ..builtin(15).unwrap()
            }
        );
    }

    /// `_Py_DebugOffsets` as Debian's 3.14.10 has it (read live), laid out in this process's
    /// memory: applied over a layout with every such field wrong, it must give the built-in 3.14
    /// layout field for field; and
    /// offsets that would not fit the BPF side's frame buffer are not taken.
    #[test]
    fn debug_offsets_of_3_14() {
        let mut b = debug_offsets(
            0x030e_0af0,
            808,
            &[
                (64, 7272),
                (72, 7344),
                (88, 7408),
                (192, 8),
                (200, 16),
                (208, 72),
                (216, 152),
                (224, 160),
                (256, 8),
                (264, 0),
                (272, 56),
                (288, 74),
                (320, 112),
                (328, 120),
                (336, 128),
                (344, 136),
                (352, 68),
                (384, 208),
                (656, 192),
                (296, 64),
                (680, 72),
                (688, 67),
            ],
        );
        let remote = Remote {
            pid: std::process::id(),
        };
        let wrong = wrong_but_for_debug_offsets(14);
        let mut l = wrong.clone();
        let d = apply_debug_offsets(&remote, b.as_ptr() as u64, &mut l).unwrap();
        assert!(!d.free_threaded);
        assert_eq!(
            l,
            Layout {
                gen_iframe: Some(72),
                gen_frame_state: Some(67),
                frame_stackpointer: Some(64),
                ..builtin(14).unwrap()
            }
        );

        // An owner offset past the frame buffer: none of the frame offsets is believed, and the
        // layout the caller had stays (here the wrong one, so a half-applied table shows),
        // but for the interpreter list's head, which is read before the frame offsets.
        put(&mut b, 288, 4096);
        let mut l = wrong.clone();
        apply_debug_offsets(&remote, b.as_ptr() as u64, &mut l).unwrap();
        assert_eq!(
            l,
            Layout {
                interp_head: 808,
                ..wrong
            }
        );
    }
}
