//! Per-version CPython layouts (x86-64 Linux, default GIL builds), as data. 3.13+ layouts are
//! checked against, and overridden by, the target's own `_Py_DebugOffsets`.
//!
//! Numbers: see docs in the project's shared notes; they were compiled against each version's
//! headers and read live.

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
    pub frame_read: u32,
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
}

/// The built-in layout of `3.minor`.
pub fn builtin(minor: u32) -> Option<Layout> {
    let legacy = |minor: u32| Layout {
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
        frame_read: 112,
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
    };
    let modern = Layout {
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
        frame_read: 72,
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
    };
    Some(match minor {
        8..=10 => legacy(minor),
        11 => modern,
        12 => Layout {
            interp_threads_head: 72,
            cframe_frame: 0,
            thread_id: 136,
            native_thread_id: Some(144),
            frame_code: 0,
            frame_previous: 8,
            frame_owner: 70,
            code_firstlineno: 68,
            code_adaptive: 192,
            unicode_ascii_data: 40,
            unicode_compact_data: 56,
            gil_in_runtime: None,
            interp_gil_ptr: Some(384),
            gc_collecting_interp: Some(312),
            activations: Activations::Shim,
            tstate_exc_info: 104,
            ..modern
        },
        13 | 14 => Layout {
            interp_head: if minor == 13 { 632 } else { 808 },
            interp_next: 7264,
            interp_threads_head: 7344,
            tstate_frame: 72,
            cframe_frame: NO_OFFSET,
            thread_id: 152,
            native_thread_id: Some(160),
            frame_code: 0,
            frame_previous: 8,
            frame_owner: if minor == 13 { 70 } else { 74 },
            frame_read: if minor == 13 { 72 } else { 80 },
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
            ..modern
        },
        _ => return None,
    })
}

/// What `_Py_DebugOffsets` (3.13+) says, where it differs from or confirms the built-in layout.
#[derive(Debug)]
pub struct DebugOffsets {
    pub free_threaded: bool,
}

pub const DEBUG_COOKIE: &[u8; 8] = b"xdebugpy";

/// Reads `_Py_DebugOffsets` at the start of `_PyRuntime` and applies the 3.13 groups to
/// `layout` (3.14's groups move, so only the runtime group is applied there).
pub fn apply_debug_offsets(
    remote: &Remote,
    runtime: u64,
    layout: &mut Layout,
) -> Option<DebugOffsets> {
    let b = remote.read(runtime, 352)?;
    if &b[0..8] != DEBUG_COOKIE {
        return None;
    }
    let version = le_u64(&b, 8)?;
    let free_threaded = le_u64(&b, 16)? != 0;
    let f = |off: usize| le_u64(&b, off);
    // Sanity bounds: untrusted numbers never become huge offsets.
    let ok = |v: u64| v < (1 << 20);
    if let Some(v) = f(40).filter(|v| ok(*v)) {
        layout.interp_head = v;
    }
    if (version >> 16) & 0xff == 13 {
        let get = |off: usize, slot: &mut u64| {
            if let Some(v) = f(off).filter(|v| ok(*v)) {
                *slot = v;
            }
        };
        // Positions of the 3.13 struct's fields, in bytes from its start.
        get(64, &mut layout.interp_next);
        get(72, &mut layout.interp_threads_head);
        get(168, &mut layout.tstate_next);
        get(176, &mut layout.tstate_interp);
        get(192, &mut layout.thread_id);
        let mut native = layout.native_thread_id.unwrap_or(0);
        get(200, &mut native);
        layout.native_thread_id = Some(native);
        let mut u32s: [(usize, &mut u32); 6] = [
            (184, &mut layout.tstate_frame),
            (232, &mut layout.frame_previous),
            (240, &mut layout.frame_code),
            (248, &mut layout.frame_instr),
            (264, &mut layout.frame_owner),
            (344, &mut layout.code_adaptive),
        ];
        for (off, slot) in u32s.iter_mut() {
            let mut v = **slot as u64;
            get(*off, &mut v);
            **slot = v as u32;
        }
        let mut usizes: [(usize, &mut usize); 4] = [
            (280, &mut layout.code_filename),
            (288, &mut layout.code_name),
            (304, &mut layout.code_linetable),
            (312, &mut layout.code_firstlineno),
        ];
        for (off, slot) in usizes.iter_mut() {
            let mut v = **slot as u64;
            get(*off, &mut v);
            **slot = v as usize;
        }
        let mut q = layout.code_qualname.unwrap_or(0) as u64;
        get(296, &mut q);
        layout.code_qualname = Some(q as usize);
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

    #[test]
    fn every_supported_version_has_a_layout() {
        for minor in 8..=14 {
            let l = builtin(minor).unwrap();
            assert!(l.frame_read as usize <= profiler_common::FRAME_BUF);
            assert!((l.frame_owner == NO_OFFSET) || l.frame_owner < l.frame_read);
            assert!(l.frame_instr < l.frame_read && l.frame_previous < l.frame_read);
        }
        assert!(builtin(7).is_none() && builtin(15).is_none());
        assert_eq!(builtin(12).unwrap().interp_threads_head, 72);
        assert_eq!(builtin(14).unwrap().code_mask, !3);
    }
}
