//! Splicing Python frames into native stacks: each interpreter activation replaces the native
//! eval-loop frame that runs it. Interpreter call machinery under a Python frame is hidden
//! unless asked for (wherever real code follows it, so one call path has one shape); mismatches
//! are counted, and no Python frame is dropped but those of a chain the eval loop's entry left
//! stale (`merge`).

use std::sync::Arc;

use super::{FrameRef as FrameId, PyEvent};

/// Native functions that run one interpreter activation.
pub fn is_eval_frame(name: &str) -> bool {
    name == "_PyEval_EvalFrameDefault"
        || name.starts_with("_PyEval_EvalFrameDefault.")
        || name == "PyEval_EvalFrameEx"
}

/// The eval loop clearing and popping a frame that has returned (it is no longer the thread's).
fn is_frame_teardown(name: &str) -> bool {
    const PREFIXES: [&str; 5] = [
        "_PyEvalFrameClearAndPop",
        "_PyEval_FrameClearAndPop",
        "clear_thread_frame",
        "_PyThreadState_PopFrame",
        "_PyFrame_Clear",
    ];
    PREFIXES.iter().any(|p| name.starts_with(p))
}

/// Interpreter call machinery: hidden between Python frames by default.
pub fn is_internal(name: &str) -> bool {
    const PREFIXES: [&str; 29] = [
        "_PyEval_",
        "_PyFunction_",
        "PyObject_Vectorcall",
        "_PyObject_Vectorcall",
        "PyObject_Call",
        "_PyObject_Call",
        "_PyObject_MakeTpCall",
        "PyVectorcall_",
        "_PyVectorcall",
        "method_vectorcall",
        "cfunction_",
        "vectorcall_",
        "slot_tp_call",
        "call_function",
        "function_code_fastcall",
        "_PyObject_FastCall",
        "PyEval_EvalCode",
        "do_call_core",
        "_TAIL_CALL_",
        "_PyCFunction",
        "PyCFunction_Call",
        "_Py_HandlePending",
        "object_vacall",
        "PyObject_VectorcallMethod",
        // Attribute access reaching a property or descriptor: a specialized instruction calls
        // the getter from the eval loop directly, the generic one through these.
        "PyObject_GetAttr",
        "_PyObject_GenericGetAttrWithDict",
        "PyObject_GenericGetAttr",
        "property_descr_get",
        "slot_tp_getattr_hook",
    ];
    PREFIXES.iter().any(|p| name.starts_with(p))
}

/// What `merge` needs to know of a native frame's name, found once per frame (the caller
/// keeps it by frame id) rather than by matching prefixes on every frame of every sample.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FrameClass(u8);

impl FrameClass {
    const EVAL: u8 = 1;
    const INTERNAL: u8 = 2;
    const TEARDOWN: u8 = 4;

    pub fn of(name: &str) -> FrameClass {
        let mut c = 0;
        if is_eval_frame(name) {
            c |= Self::EVAL;
        }
        if is_internal(name) {
            c |= Self::INTERNAL;
        }
        if is_frame_teardown(name) {
            c |= Self::TEARDOWN;
        }
        FrameClass(c)
    }

    pub fn is_eval(self) -> bool {
        self.0 & Self::EVAL != 0
    }

    fn is_internal(self) -> bool {
        self.0 & Self::INTERNAL != 0
    }

    fn is_teardown(self) -> bool {
        self.0 & Self::TEARDOWN != 0
    }
}

/// Merges `activations` (outermost first, each root-first) into `native` (root-first), whose
/// frames' classes are `classes` (one each).
pub fn merge(
    native: &[(FrameId, Arc<str>)],
    classes: &[FrameClass],
    activations: &[Vec<FrameId>],
    native_truncated: bool,
    show_internal: bool,
) -> (Vec<FrameId>, Option<PyEvent>) {
    debug_assert_eq!(native.len(), classes.len());
    let class = |i: usize| classes.get(i).copied().unwrap_or_default();
    let evals: Vec<usize> = (0..native.len()).filter(|&i| class(i).is_eval()).collect();
    let (e, a) = (evals.len(), activations.len());
    // Pair eval frames with activations: from the root when the native stack is whole (an eval
    // frame whose activation already returned is then the innermost one), from the leaf when the
    // native unwind stopped early (the missing part is at the root).
    let pairs: Vec<(usize, usize)> = if native_truncated {
        evals
            .iter()
            .rev()
            .zip((0..a).rev())
            .map(|(&n, p)| (n, p))
            .collect()
    } else {
        evals.iter().zip(0..a).map(|(&n, p)| (n, p)).collect()
    };
    // One eval frame more than activations, innermost, with no real code above it but the eval
    // loop's own unlinking of a frame: a C function is entering a Python call (or returning
    // from one) and the eval loop has not linked the callee's frame yet (or has unlinked it,
    // and is clearing it). Every Python frame that exists is in place; the time is the eval
    // loop's own, under its caller.
    let last_real = (0..native.len()).rposition(|i| !class(i).is_internal());
    let entering = !native_truncated
        && e == a + 1
        && evals.last().is_some_and(|&l| {
            last_real.is_none_or(|r| r < l) || (l + 1 < native.len() && class(l + 1).is_teardown())
        });
    // The thread is in the eval loop's first instructions (its leaf), yet two or more of the
    // native stack's eval frames have no activation: the chain read is not this instant's. On
    // 3.11 and 3.12 the eval loop makes its new `_PyCFrame` current before it fills it in (3.12.1
    // stores `tstate->cframe` at +0x30 and the new `_PyCFrame`'s frame and `previous` at +0xa6),
    // so in between both are whatever an earlier call left at that stack address, and the chain
    // walked from them is an older call's: code since freed (unresolved) or a plausible, wrong
    // path. The walk cannot tell; the native stack can. The native frames are kept, without
    // Python frames placed where nothing says they belong.
    let stale =
        !native_truncated && e > a + 1 && !native.is_empty() && class(native.len() - 1).is_eval();
    if stale {
        return (
            native.iter().map(|(f, _)| *f).collect(),
            Some(PyEvent::MergeMismatch),
        );
    }
    let outcome = if (e == a || entering) && !native_truncated {
        Some(PyEvent::Merged)
    } else if (!native_truncated && e != a) || (native_truncated && e > a) {
        // A truncated native stack explains missing eval frames, never extra ones.
        Some(PyEvent::MergeMismatch)
    } else {
        None
    };
    // Each native frame's paired activation, by position (a few dozen frames: no hashing).
    let mut paired_act: Vec<Option<usize>> = vec![None; native.len()];
    for &(n, act) in &pairs {
        paired_act[n] = Some(act);
    }
    let min_act = pairs.iter().map(|p| p.1).min();
    let max_act = pairs.iter().map(|p| p.1).max();
    let first_eval = pairs.iter().map(|p| p.0).min();
    let last_eval = pairs.iter().map(|p| p.0).max();

    let mut out =
        Vec::with_capacity(native.len() + activations.iter().map(Vec::len).sum::<usize>());
    // Activations with no eval frame, outside the paired range at the root.
    let leading = min_act.unwrap_or(a);
    for act in &activations[..leading] {
        out.extend_from_slice(act);
    }
    for (i, (frame, _)) in native.iter().enumerate() {
        if let Some(act) = paired_act[i] {
            if show_internal {
                out.push(*frame);
            }
            out.extend_from_slice(&activations[act]);
            // Inner activations with no eval frame of their own go right after the last paired one.
            if Some(act) == max_act {
                for extra in &activations[act + 1..] {
                    out.extend_from_slice(extra);
                }
            }
            continue;
        }
        // Machinery under a Python frame is hidden wherever real code follows it: between two
        // Python frames, and above a native callee (a C function that may or may not call back
        // into Python). So a call path has one shape whatever runs below it. Machinery at the
        // leaf (the time spent in it) stays.
        let below_python = first_eval.is_some_and(|f| i > f) || leading > 0;
        let followed = last_eval.is_some_and(|l| i < l) || last_real.is_some_and(|r| i < r);
        if below_python && followed && !show_internal && class(i).is_internal() {
            continue;
        }
        out.push(*frame);
    }
    (out, outcome)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `merge` with each frame's class found from its name.
    fn merge(
        native: &[(FrameId, Arc<str>)],
        activations: &[Vec<FrameId>],
        native_truncated: bool,
        show_internal: bool,
    ) -> (Vec<FrameId>, Option<PyEvent>) {
        let classes: Vec<FrameClass> = native.iter().map(|(_, n)| FrameClass::of(n)).collect();
        super::merge(
            native,
            &classes,
            activations,
            native_truncated,
            show_internal,
        )
    }

    fn nat(names: &[&str]) -> Vec<(FrameId, Arc<str>)> {
        names
            .iter()
            .enumerate()
            .map(|(i, n)| (100 + i, Arc::from(*n)))
            .collect()
    }

    #[test]
    fn splices_each_activation_in_place() {
        let native = nat(&[
            "_start",
            "Py_RunMain",
            "_PyEval_EvalFrameDefault",
            "_PyEval_Vector",
            "list_sort_impl",
            "_PyObject_Call",
            "_PyEval_EvalFrameDefault",
            "leaf_c",
        ]);
        let acts = vec![vec![1, 2], vec![3]];
        let m = merge(&native, &acts, false, false);
        assert_eq!(
            m,
            (vec![100, 101, 1, 2, 104, 3, 107], Some(PyEvent::Merged))
        );
        let (m, _) = merge(&native, &acts, false, true);
        assert_eq!(m, vec![100, 101, 102, 1, 2, 103, 104, 105, 106, 3, 107]);
    }

    #[test]
    fn truncated_native_keeps_outer_python_at_root() {
        let native = nat(&["_PyEval_EvalFrameDefault", "leaf_c"]);
        let acts = vec![vec![1], vec![2], vec![3]];
        // Neither merged nor a mismatch: the truncation explains the unpaired activations.
        assert_eq!(
            merge(&native, &acts, true, false),
            (vec![1, 2, 3, 101], None)
        );
    }

    #[test]
    fn truncated_native_hides_machinery_below_the_first_paired_eval() {
        let native = nat(&[
            "function_code_fastcall",
            "_PyEval_EvalFrameDefault",
            "call_function",
            "_PyEval_EvalFrameDefault",
            "leaf_c",
        ]);
        let acts = vec![vec![1], vec![2], vec![3]];
        assert_eq!(merge(&native, &acts, true, false).0, vec![1, 2, 3, 104]);
    }

    #[test]
    fn no_eval_frames_keeps_every_python_frame() {
        let native = nat(&["a", "b"]);
        let acts = vec![vec![1, 2]];
        assert_eq!(
            merge(&native, &acts, false, false),
            (vec![1, 2, 100, 101], Some(PyEvent::MergeMismatch))
        );
    }

    #[test]
    fn extra_eval_frame_stays_native() {
        // The innermost eval frame at the leaf: a call into Python that has not linked its
        // frame yet. The sample is whole.
        let native = nat(&["_PyEval_EvalFrameDefault", "x", "_PyEval_EvalFrameDefault"]);
        let acts = vec![vec![1]];
        assert_eq!(
            merge(&native, &acts, false, false),
            (vec![1, 101, 102], Some(PyEvent::Merged))
        );
        // Real code above it, or two extra eval frames: the interpreter's frames were not all
        // read.
        let native = nat(&[
            "_PyEval_EvalFrameDefault",
            "x",
            "_PyEval_EvalFrameDefault",
            "y",
        ]);
        assert_eq!(
            merge(&native, &acts, false, false).1,
            Some(PyEvent::MergeMismatch)
        );
        let native = nat(&[
            "_PyEval_EvalFrameDefault",
            "x",
            "_PyEval_EvalFrameDefault",
            "_PyEval_EvalFrameDefault",
        ]);
        assert_eq!(
            merge(&native, &acts, false, false).1,
            Some(PyEvent::MergeMismatch)
        );
    }

    #[test]
    fn a_stale_chain_in_the_eval_loops_entry_is_not_spliced() {
        // Three eval frames (the sympy sample that showed it had sixteen), the leaf in the eval
        // loop's entry, and a chain of one frame an earlier call left there: the native stack
        // stays as it is, with no Python frame put at its root.
        let native = nat(&[
            "_start",
            "_PyEval_EvalFrameDefault",
            "type_call",
            "_PyEval_EvalFrameDefault",
            "slot_tp_hash",
            "_PyEval_EvalFrameDefault",
        ]);
        let acts = vec![vec![1]];
        assert_eq!(
            merge(&native, &acts, false, false),
            (
                vec![100, 101, 102, 103, 104, 105],
                Some(PyEvent::MergeMismatch)
            )
        );
        // The same chain with real code at the leaf is spliced as before (the walk may have
        // failed part way: the frames it read are the thread's).
        let mut leaf = native.clone();
        leaf.push((106, Arc::from("long_add")));
        assert_eq!(merge(&leaf, &acts, false, false).0[..2], [100, 1]);
        // One eval frame more than activations at the leaf is a call entering: merged.
        let acts = vec![vec![1], vec![2]];
        assert_eq!(merge(&native, &acts, false, false).1, Some(PyEvent::Merged));
    }

    #[test]
    fn an_eval_loop_clearing_a_returned_frame_is_whole() {
        // 3.12's `map(f, ...)`: `f` returned, its frame unlinked, and the eval loop that ran it
        // is clearing it. No Python frame is missing.
        let native = nat(&[
            "_PyEval_EvalFrameDefault",
            "map_next",
            "_PyEval_EvalFrameDefault",
            "_PyEvalFrameClearAndPop",
            "_PyFrame_ClearExceptCode",
        ]);
        let acts = vec![vec![1]];
        assert_eq!(
            merge(&native, &acts, false, false),
            (vec![1, 101, 103, 104], Some(PyEvent::Merged))
        );
        // Other real code there: frames were not all read.
        let native = nat(&[
            "_PyEval_EvalFrameDefault",
            "map_next",
            "_PyEval_EvalFrameDefault",
            "long_add",
        ]);
        assert_eq!(
            merge(&native, &acts, false, false).1,
            Some(PyEvent::MergeMismatch)
        );
    }

    /// The same call has one shape whether the C function under it calls back into Python
    /// (`sorted(key=...)` reaching `key`) or not (a comparison as the leaf).
    #[test]
    fn one_shape_whatever_runs_below() {
        let machinery = [
            "_start",
            "Py_RunMain",
            "_PyEval_EvalFrameDefault",
            "PyObject_Vectorcall",
            "cfunction_vectorcall_FASTCALL_KEYWORDS",
            "builtin_sorted",
            "list_sort_impl",
        ];
        let mut a = machinery.to_vec();
        a.push("_PyEval_EvalFrameDefault");
        let (with_key, _) = merge(&nat(&a), &[vec![1], vec![2]], false, false);
        let mut b = machinery.to_vec();
        b.push("unsafe_long_compare");
        let (with_leaf, _) = merge(&nat(&b), &[vec![1]], false, false);
        // _start, Py_RunMain, f, builtin_sorted, list_sort_impl in both.
        assert_eq!(with_key, vec![100, 101, 1, 105, 106, 2]);
        assert_eq!(with_leaf, vec![100, 101, 1, 105, 106, 107]);
        // Time spent in the machinery itself stays visible.
        let (leaf_machinery, _) = merge(&nat(&machinery[..5]), &[vec![1]], false, false);
        assert_eq!(leaf_machinery, vec![100, 101, 1, 103, 104]);
    }
}
