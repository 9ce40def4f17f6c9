//! The interpreter's native functions and the Python functions of its machinery that other
//! layers ask about: the eval loop (split in parts by the compiler), the GIL's and the garbage
//! collector's entry points, asyncio's `Handle._run`.

use super::code::CodeInfo;

/// Whether a file is the Python interpreter's own code, by its name: libpython, or a statically
/// linked `python3.X`.
pub fn is_interpreter_file(file_name: &str) -> bool {
    file_name.starts_with("libpython") || file_name.starts_with("python")
}

/// Whether a call from the interpreter's unnamed code (`caller`, named `file+0x...` for want of
/// a symbol table) to `callee` waits for the GIL: in CPython's glibc builds only the GIL waits on
/// a condition variable or mutex straight from the runtime (its own locks use semaphores), in
/// `take_gil` or `drop_gil`.
pub fn is_anonymous_gil_wait(caller: &str, caller_in_interpreter: bool, callee: &str) -> bool {
    matches!(
        callee,
        "pthread_cond_wait" | "pthread_cond_timedwait" | "pthread_mutex_lock"
    ) && caller.contains("+0x")
        && caller_in_interpreter
}

/// Functions the compiler may split into parts in stripped builds (GCC's hot/cold partitioning
/// in distribution builds), named so that an eval-loop frame in either part is recognized as
/// one when Python frames are merged into the native stack.
pub const SPLIT_FUNCTIONS: &[&str] = &["_PyEval_EvalFrameDefault"];

/// Whether `c` is asyncio's `Handle._run` (3.11+: the name is the qualified name), which calls
/// the step of the task an event loop runs.
pub(super) fn is_handle_run(c: &CodeInfo) -> bool {
    &*c.name == "Handle._run"
        && (c.file.ends_with("/asyncio/events.py") || &*c.file == "asyncio/events.py")
}

/// Native functions on the path that takes the GIL, and `drop_gil`, which on a forced switch
/// waits until the requesting thread has taken the GIL before this thread queues for it again.
pub fn is_gil_function(name: &str) -> bool {
    matches!(
        name,
        "take_gil"
            | "drop_gil"
            | "PyEval_RestoreThread"
            | "PyEval_AcquireThread"
            | "PyEval_AcquireLock"
            | "PyGILState_Ensure"
            | "_PyThreadState_Attach"
            | "_PyEval_AcquireLock"
            | "_PyEval_TakeGIL"
    ) || name.starts_with("take_gil.")
        || name.starts_with("drop_gil.")
}

/// The garbage collector's entry points in CPython 3.8-3.15 (`collect` and
/// `collect_with_callback` in 3.8-3.10, `gc_collect_main` in 3.11-3.13, `gc_collect_region` and
/// its callers in 3.14): what runs under them is the collector's work.
pub fn is_gc_function(name: &str) -> bool {
    name.starts_with("gc_collect")
        || name.starts_with("_PyGC_Collect")
        || matches!(
            name,
            "collect" | "collect_with_callback" | "collect_generations"
        )
        || name.starts_with("collect.")
}
