//! Plain-data records that cross between the tachyon-bpf BPF program and its userspace.
//!
//! Everything here is `#[repr(C)]` with explicit padding and sizes asserted at compile time, so
//! both sides agree byte for byte. The BPF side writes one variable-length sample record per
//! perf event into a ring buffer:
//!
//! ```text
//! SampleHeader | PyFrame * header.py_len | user stack bytes * header.ustack_len
//! ```
//!
//! The BPF program records raw values only (addresses, offsets, words); userspace resolves names,
//! lines and symbols.
#![no_std]

/// Kernel frames kept per sample (`bpf_get_stack` depth).
pub const MAX_KSTACK: usize = 64;
/// Interpreter frames walked per sample. CPython's default recursion limit is 1000 and a 300-deep
/// recursion must come through whole; 512 frames keep the walk under ~50 µs in the worst case
/// (one 112-byte read per frame) and the BPF verifier's work bounded. Deeper chains are flagged
/// [`SAMPLE_PY_TRUNCATED`] and keep their innermost 512 frames.
pub const MAX_PY_FRAMES: usize = 512;
/// The user stack is copied in chunks of this size; the copy stops at the first chunk that faults.
pub const USTACK_CHUNK: usize = 4096;
/// Largest user-stack copy (`--stack-size` is clamped to it).
pub const MAX_USTACK: usize = 16 * USTACK_CHUNK;
/// Bytes of one interpreter frame read in one go (covers `PyFrameObject` up to `f_lasti` on 3.8-3.10
/// and `_PyInterpreterFrame` on 3.11+).
pub const FRAME_BUF: usize = 128;
/// An offset that a layout does not have.
pub const NO_OFFSET: u32 = u32::MAX;

/// Record kinds. A record starts with its kind (u32).
/// A timer sample of a thread on a CPU: a [`SampleHeader`] record.
pub const RECORD_SAMPLE: u32 = 1;
/// A thread left the CPU to block (`sched_switch`) at a point where it had not blocked before:
/// the full capture, a [`SampleHeader`] record whose `sched_state` is the thread's state as it
/// left. Its `time_ns` identifies it: [`SchedRecord`]s charge off-CPU time to it by that time.
pub const RECORD_SWITCH_OUT: u32 = 2;
/// A thread's scheduler accounting: a [`SchedRecord`].
pub const RECORD_SCHED: u32 = 3;
/// Kind 4 is retired: a thread's return to a CPU, sent per switch until the scheduler
/// accounting moved into BPF (`SchedRecord`). Nothing sends it now.
pub const RECORD_RETIRED_SWITCH_IN: u32 = 4;
/// A task was created: an [`EventRecord`] from the parent, `arg0` = child tgid, `arg1` = child tid.
pub const RECORD_FORK: u32 = 5;
/// A process replaced its program (`execve`): an [`EventRecord`] with the new comm.
pub const RECORD_EXEC: u32 = 6;
/// A thread exited: an [`EventRecord`], `arg0` = 1 when it was the last thread of its process.
pub const RECORD_EXIT: u32 = 7;
/// What the scheduler program held of a thread as it exited: an [`ExitSchedRecord`], sent just
/// before the thread's `RECORD_EXIT`. User space closes its last intervals.
pub const RECORD_EXIT_SCHED: u32 = 8;

/// The sample interrupted the thread in kernel mode; the user registers came from the task.
pub const SAMPLE_KERNEL_MODE: u32 = 1 << 0;
/// The user stack copy stopped before `--stack-size` because a chunk faulted (normal near the
/// top of the stack).
pub const SAMPLE_USTACK_SHORT: u32 = 1 << 1;
/// No user registers could be read (kernel thread, or the task's registers were unreadable).
pub const SAMPLE_NO_USER: u32 = 1 << 2;
/// The process is a known Python process and the thread has a thread state.
pub const SAMPLE_PY_THREAD: u32 = 1 << 3;
/// The process is a known Python process but the thread was not (yet) in the thread map.
pub const SAMPLE_PY_MISS: u32 = 1 << 4;
/// The interpreter frame chain was longer than [`MAX_PY_FRAMES`].
pub const SAMPLE_PY_TRUNCATED: u32 = 1 << 5;
/// A read of the thread state or a frame failed; the frames recorded are the ones before it.
pub const SAMPLE_PY_READ_FAILED: u32 = 1 << 6;
/// The Python thread has an exception being raised or handled.
pub const SAMPLE_PY_EXCEPTION: u32 = 1 << 7;
/// A frame's `previous` pointed back at the frame itself: the walk stopped there (a corrupt or
/// hostile interpreter; longer cycles end at [`MAX_PY_FRAMES`] as truncated).
pub const SAMPLE_PY_CYCLE: u32 = 1 << 8;
/// The user stack copy stepped over pages that were never touched (a function reserved a
/// large buffer it did not fill, such as OpenBLAS's kernels): they read as zeros.
pub const SAMPLE_USTACK_HOLE: u32 = 1 << 9;
/// The process's executable mappings changed since its previous record (or this is its first):
/// it loaded or unloaded code (an import `dlopen`ed an extension). User space reads its mappings
/// again as it reads the record, while the process most likely still lives: a library whose code
/// first runs as the process ends (an extension module's traverse function, called by the last
/// collection) is otherwise first seen in a record read after the process is gone.
pub const SAMPLE_MAPS_CHANGED: u32 = 1 << 10;

/// Frame layout families (see `PyProcConfig::layout`).
pub const PY_LAYOUT_FRAMEOBJECT: u32 = 1; // 3.8-3.10: PyFrameObject chain, f_lasti
pub const PY_LAYOUT_INTERP: u32 = 2; // 3.11+: _PyInterpreterFrame chain, instruction pointer

/// The names both sides of the BPF boundary use: the object file's maps and programs. The BPF
/// crate names its statics and functions after them (an identifier cannot come from a
/// constant); user space loads by these, and a test checks the object has exactly these.
pub mod names {
    pub const MAP_CONFIG: &str = "CONFIG";
    pub const MAP_TARGETS: &str = "TARGETS";
    pub const MAP_PY_PROCS: &str = "PY_PROCS";
    pub const MAP_PY_THREADS: &str = "PY_THREADS";
    pub const MAP_STATS: &str = "STATS";
    pub const MAP_SCRATCH: &str = "SCRATCH";
    pub const MAP_FRAME: &str = "FRAME";
    pub const MAP_WALK: &str = "WALK";
    pub const MAP_SCHED: &str = "SCHED";
    pub const MAP_SCHED_NEW: &str = "SCHED_NEW";
    pub const MAP_CAPTURING: &str = "CAPTURING";
    pub const MAP_SAMPLES: &str = "SAMPLES";
    pub const MAP_STACK_TOPS: &str = "STACK_TOPS";
    pub const MAP_EXEC_VM: &str = "EXEC_VM";
    pub const MAP_KNOWN_CODES: &str = "KNOWN_CODES";
    pub const MAP_LOG_BUDGET: &str = "LOG_BUDGET";
    pub const MAP_BLOCK_DEADLINES: &str = "BLOCK_DEADLINES";
    /// aya-log's ring of log records (`--debug-bpf`), and the global that sets its level.
    pub const MAP_AYA_LOGS: &str = "AYA_LOGS";
    pub const GLOBAL_AYA_LOG_LEVEL: &str = "AYA_LOG_LEVEL";
    pub const MAPS: [&str; 18] = [
        MAP_CONFIG,
        MAP_TARGETS,
        MAP_PY_PROCS,
        MAP_PY_THREADS,
        MAP_STATS,
        MAP_SCRATCH,
        MAP_FRAME,
        MAP_WALK,
        MAP_SCHED,
        MAP_SCHED_NEW,
        MAP_CAPTURING,
        MAP_SAMPLES,
        MAP_STACK_TOPS,
        MAP_EXEC_VM,
        MAP_KNOWN_CODES,
        MAP_LOG_BUDGET,
        MAP_AYA_LOGS,
        MAP_BLOCK_DEADLINES,
    ];

    /// The sampler: modern kernels (bpf_loop, bpf_task_pt_regs), and compat (5.10 on).
    pub const PROG_SAMPLE: &str = "tachyon_sample";
    pub const PROG_SAMPLE_COMPAT: &str = "tachyon_sample_compat";
    /// `sched_switch`: modern (the `prev_state` argument) and compat.
    pub const PROG_SWITCH: &str = "tachyon_switch";
    pub const PROG_SWITCH_COMPAT: &str = "tachyon_switch_compat";
    /// In the thread coming back on the CPU, where a blocked thread's interval is known and its
    /// capture decided (`OFFCPU_STACKS`): the `sched_exit_tp` tracepoint (6.16+), else a kprobe
    /// on the kernel's `finish_task_switch` (modern and compat).
    pub const PROG_SWITCH_IN: &str = "tachyon_switch_in";
    pub const PROG_SWITCH_IN_KPROBE: &str = "tachyon_switch_in_kprobe";
    pub const PROG_SWITCH_IN_COMPAT: &str = "tachyon_switch_in_compat";
    pub const PROG_FORK: &str = "tachyon_fork";
    pub const PROG_EXEC: &str = "tachyon_exec";
    pub const PROG_EXIT: &str = "tachyon_exit";
    pub const PROGRAMS: [&str; 10] = [
        PROG_SAMPLE,
        PROG_SAMPLE_COMPAT,
        PROG_SWITCH,
        PROG_SWITCH_COMPAT,
        PROG_SWITCH_IN,
        PROG_SWITCH_IN_KPROBE,
        PROG_SWITCH_IN_COMPAT,
        PROG_FORK,
        PROG_EXEC,
        PROG_EXIT,
    ];
}

/// Per-CPU counters in the `STATS` map, by index.
/// Samples and off-CPU captures written to the ring buffer.
pub const STAT_SAMPLES: u32 = 0;
/// Records that could not be written to the ring buffer (it was full): lost samples.
pub const STAT_LOST: u32 = 1;
/// The scratch buffer could not be had (should never happen).
pub const STAT_SCRATCH_FAIL: u32 = 2;
/// Samples whose kernel stack could not be read.
pub const STAT_KSTACK_FAIL: u32 = 3;
/// Samples of a Python process whose thread was not in the thread map.
pub const STAT_PY_MISS: u32 = 4;
/// Samples whose interpreter frame walk hit a failed read.
pub const STAT_PY_READ_FAIL: u32 = 5;
/// Samples whose interpreter frame chain was truncated at `MAX_PY_FRAMES`.
pub const STAT_PY_TRUNCATED: u32 = 6;
/// Scheduler and lifetime events that could not be written to the ring buffer.
pub const STAT_EVENTS_LOST: u32 = 7;
/// Off-CPU captures written with their stacks.
pub const STAT_SWITCH_CAPTURES: u32 = 8;
/// Samples in kernel mode whose user registers could not be read from the task.
pub const STAT_UREGS_FAIL: u32 = 9;
/// Scheduler accounting records written (`RECORD_SCHED`).
pub const STAT_SCHED_RECORDS: u32 = 10;
/// Off-CPU intervals at a new blocking point that got no capture (budget spent, ring full, or
/// the thread's switch-in not seen).
pub const STAT_OFF_UNCAPTURED: u32 = 11;
/// Threads the scheduler map had no room for (their times are not accounted).
pub const STAT_SCHED_FULL: u32 = 12;
/// Off-CPU intervals shorter than a sampling period that the sampling left out (see
/// `ATTR_NONE`): their time is charged to the next one kept.
pub const STAT_OFF_SAMPLED_OUT: u32 = 13;
/// Samples skipped because they interrupted an off-CPU capture on their CPU (its buffers in use).
pub const STAT_SAMPLE_NESTED: u32 = 14;
pub const STAT_COUNT: u32 = 15;

/// Failure kinds the BPF programs log with `--debug-bpf` (aya-log), each at most
/// [`LOG_FIRST`] times per CPU; `LOG_BUDGET` counts every occurrence per CPU, so user space
/// reports how many were not logged.
/// The user stack could not be read at the stack pointer (nothing copied).
pub const LOG_USTACK: u32 = 0;
/// A kernel-mode sample's saved user registers could not be read.
pub const LOG_UREGS: u32 = 1;
/// A Python thread's state was not found (not in `PY_THREADS`, not found by its thread pointer).
pub const LOG_TSTATE: u32 = 2;
/// The frame chain was cut by a failed read.
pub const LOG_FRAME_READ: u32 = 3;
/// The frame chain loops (a frame's `previous` is itself).
pub const LOG_FRAME_CYCLE: u32 = 4;
/// A record was dropped: the ring buffer was full (or kept its room for captures).
pub const LOG_DROPPED: u32 = 5;
pub const LOG_KINDS: u32 = 6;
/// Occurrences of a kind logged per CPU; the rest are counted.
pub const LOG_FIRST: u32 = 4;
/// The kinds' names, by index, as the summary reports what was not logged.
pub const LOG_KIND_NAMES: [&str; LOG_KINDS as usize] = [
    "user stack unreadable",
    "user registers unreadable",
    "thread state not found",
    "frame chain cut by a failed read",
    "frame chain loops",
    "record dropped",
];

/// Every counter of the `STATS` map: (index, name, meaning). The summary and each profile's
/// `meta.tachyon.bpfCounters` show them all by these names.
pub const STATS: [(u32, &str, &str); STAT_COUNT as usize] = [
    (
        STAT_SAMPLES,
        "records",
        "samples and off-CPU captures written to the ring buffer",
    ),
    (
        STAT_LOST,
        "lost",
        "samples dropped: the ring buffer was full",
    ),
    (
        STAT_SCRATCH_FAIL,
        "scratchFail",
        "samples without a scratch buffer (never expected)",
    ),
    (
        STAT_KSTACK_FAIL,
        "kstackFail",
        "samples whose kernel stack could not be read",
    ),
    (
        STAT_PY_MISS,
        "pyThreadMiss",
        "Python process samples of a thread not in the thread map",
    ),
    (
        STAT_PY_READ_FAIL,
        "pyReadFail",
        "interpreter frame walks that hit a failed read",
    ),
    (
        STAT_PY_TRUNCATED,
        "pyTruncated",
        "interpreter frame chains cut at MAX_PY_FRAMES",
    ),
    (
        STAT_EVENTS_LOST,
        "eventsLost",
        "scheduler and lifetime events dropped: ring buffer full",
    ),
    (
        STAT_SWITCH_CAPTURES,
        "switchCaptures",
        "off-CPU captures written with their stacks",
    ),
    (
        STAT_UREGS_FAIL,
        "uregsFail",
        "kernel-mode samples whose user registers were unreadable",
    ),
    (
        STAT_SCHED_RECORDS,
        "schedRecords",
        "scheduler accounting records written (a span of short intervals, or one long one)",
    ),
    (
        STAT_OFF_UNCAPTURED,
        "offUncaptured",
        "blocks at a new point that got no stack (capture budget spent, or ring full)",
    ),
    (
        STAT_SCHED_FULL,
        "schedMapFull",
        "threads without scheduler accounting: the thread map was full",
    ),
    (
        STAT_OFF_SAMPLED_OUT,
        "offSampledOut",
        "off-CPU intervals shorter than a sampling period left out by the sampling",
    ),
    (
        STAT_SAMPLE_NESTED,
        "sampleNested",
        "samples skipped: they interrupted an off-CPU capture on their CPU",
    ),
];

/// What the `sched_switch` program records (`Config::offcpu`).
/// Nothing: the program is not attached.
pub const OFFCPU_NONE: u32 = 0;
/// Scheduler accounting only (on/off-CPU timelines and CPU use), no stacks.
pub const OFFCPU_TIMES: u32 = 1;
/// Times plus a full capture (stacks, Python frames, state) when a thread leaves the CPU.
pub const OFFCPU_STACKS: u32 = 2;

/// Global settings, index 0 of the `CONFIG` array.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Config {
    /// Non-zero: sample every process; zero: only those in `TARGETS`.
    pub all: u32,
    /// Bytes of user stack to copy, a multiple of `USTACK_CHUNK`, at most `MAX_USTACK`.
    pub ustack_size: u32,
    /// The profiler's own process, never sampled.
    pub self_tgid: u32,
    /// `OFFCPU_*`.
    pub offcpu: u32,
    /// Non-zero: processes created by a target become targets (`--subprocesses`).
    pub follow_children: u32,
    /// Byte offsets of `pid` and `tgid` in the kernel's `task_struct` (from its BTF).
    pub task_pid_off: u32,
    pub task_tgid_off: u32,
    /// Byte offset of `flags` in `task_struct` (kernel threads are skipped off CPU).
    pub task_flags_off: u32,
    /// Non-zero: report `execve` of every process (to find new Python processes at once).
    pub exec_all: u32,
    /// Records do not wake the reader (it polls) until this many bytes wait in the ring buffer.
    pub wakeup_bytes: u32,
    /// The sampling period in nanoseconds: on- and off-CPU intervals shorter than this are
    /// summed into spans of about this length (see `ThreadSched`), and new off-CPU captures of
    /// one thread are limited to 16 per period.
    pub sched_span_ns: u64,
    /// Byte offset of the task state in `task_struct` (`__state` since 5.14, `state` before; the
    /// low 32 bits are read). Used where `sched_switch` does not pass `prev_state` (before 5.18).
    pub task_state_off: u32,
    /// Byte offset of `stack` (the kernel stack page) in `task_struct`. Used where
    /// `bpf_task_pt_regs` is missing (before 5.15): the user registers sit at the top of it.
    pub task_stack_off: u32,
    /// Byte offsets of `signal` in `task_struct` and of `live` (threads not yet exited) in
    /// `signal_struct`: a process's last thread is exiting when `live` has reached 0.
    pub task_signal_off: u32,
    pub signal_live_off: u32,
    /// Size of a task's kernel stack (`THREAD_SIZE`: 16 KiB on x86_64 and arm64 without KASAN).
    pub thread_size: u32,
    /// Size of the kernel's `struct pt_regs` (from its BTF): the user registers sit that far
    /// below the top of the kernel stack.
    pub pt_regs_size: u32,
    /// Byte offset in `task_struct` of the user thread pointer (x86_64's `thread.fsbase`, which
    /// glibc's `pthread_self` returns and CPython stores as a thread state's `thread_id`;
    /// arm64's `thread.uw.tp_value`, `PyProcConfig::thread_id_below_tp` above it), or 0.
    pub task_fsbase_off: u32,
    /// Byte offsets in `task_struct` of `se.sum_exec_runtime` (the thread's CPU time so far, in
    /// ns, brought up to date before `sched_switch` runs) and `se.prev_sum_exec_runtime` (its
    /// value when the thread last got a CPU). The scheduler program runs for the thread leaving
    /// only: the CPU time since its previous switch-out says when it came back.
    pub task_sum_exec_off: u32,
    pub task_prev_sum_exec_off: u32,
    /// Byte offsets of `mm` in `task_struct` and of `exec_vm` (pages mapped executable) in
    /// `mm_struct`; 0: not watched. A record whose process's `exec_vm` changed since its previous
    /// record carries `SAMPLE_MAPS_CHANGED`.
    pub task_mm_off: u32,
    pub mm_exec_vm_off: u32,
    /// On-CPU samples are not sent while this many bytes wait in the ring buffer (0: no limit):
    /// the rest is kept for records that no later one stands in for (an off-CPU capture is a
    /// whole blocked interval's stack, an exec or exit event a process's life). Each sample
    /// not sent counts as lost.
    pub sample_stop_bytes: u32,
    /// Byte offset of `start_stack` in `mm_struct` (where the main thread's stack began: its
    /// outermost frame is below it, and only the program's arguments, environment and auxiliary
    /// vector are above), or 0: a main thread's copy then goes on to the end of its mapping.
    pub mm_start_stack_off: u32,
    /// Non-zero: a new process forked by a Python process becomes a target (`--all-pythons`: a
    /// server's or a pool's workers are Python without an exec).
    pub follow_python_forks: u32,
}

/// Where a Python process keeps what the frame walk needs. Offsets are byte offsets into the
/// named struct; addresses are absolute in the target.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PyProcConfig {
    /// `PY_LAYOUT_*`.
    pub layout: u32,
    /// Offset in the thread state of the frame pointer (3.8-3.10 `frame`, 3.13+ `current_frame`)
    /// or of the `cframe` pointer (3.11, 3.12).
    pub tstate_frame: u32,
    /// Offset of `current_frame` in `_PyCFrame` (3.11: 8, 3.12: 0), or `NO_OFFSET`.
    pub cframe_frame: u32,
    /// Offset of the code object (`f_code` / `f_executable`) in a frame.
    pub frame_code: u32,
    /// Offset of the previous frame (`f_back` / `previous`).
    pub frame_previous: u32,
    /// Offset of `f_lasti` (i32, FRAMEOBJECT layout) or of the instruction pointer (INTERP).
    pub frame_instr: u32,
    /// Offset of the `owner` byte (3.12+) or of `is_entry` (3.11), or `NO_OFFSET`.
    pub frame_owner: u32,
    /// Offset of `co_code_adaptive` in a code object (INTERP layout).
    pub code_adaptive: u32,
    /// Offset in the thread state of a status word copied into the sample (3.12/3.13 `_status`,
    /// 3.14 `holds_gil`), or `NO_OFFSET`.
    pub tstate_status: u32,
    /// Bytes of a frame to read (<= `FRAME_BUF`): enough to cover every offset above.
    pub frame_read_size: u32,
    /// Mask applied to the code pointer (clears `_PyStackRef` tag bits on 3.14+).
    pub code_mask: u64,
    /// Address of the GIL's `last_holder` word, or 0.
    pub gil_last_holder: u64,
    /// Address of the GIL's `locked` int, or 0.
    pub gil_locked: u64,
    /// Address of the interpreter's `gc.collecting` int, or 0.
    pub gc_collecting: u64,
    /// Offset in the thread state of the exception being raised (`curexc_type` up to 3.11,
    /// `current_exception` after), or `NO_OFFSET`.
    pub tstate_cur_exc: u32,
    /// Offset in the thread state of `exc_info` (the top `_PyErr_StackItem`), or `NO_OFFSET`.
    pub tstate_exc_info: u32,
    /// Offsets in a `_PyErr_StackItem` of `exc_value` and `previous_item`.
    pub err_exc_value: u32,
    pub err_previous: u32,
    /// Address of `_Py_NoneStruct` (an `exc_value` of None means no exception), or 0.
    pub none_addr: u64,
    /// Address of the main interpreter state, and offsets of its thread list's head, of a
    /// thread state's `next` and `thread_id`: a thread missing from `PY_THREADS` (it started
    /// moments ago) is found by its thread pointer there.
    pub interp: u64,
    pub interp_threads_head: u32,
    pub tstate_next: u32,
    pub tstate_thread_id: u32,
    /// Bytes of a code object's head copied into `SampleHeader::code_snaps` (<= PY_CODE_SNAP).
    pub code_head_len: u32,
    /// Offset of `f_locals` in a frame, or `NO_OFFSET`. A frame with locals of its own runs code
    /// that is not a function's (a module or class body, `exec`): code that runs once and is
    /// freed when it ends, so its head is copied wherever it is on the stack.
    pub frame_locals: u32,
    /// Offset in a code object of the name shown (`co_qualname`, else `co_name`): the start of
    /// that string is copied with the head of the innermost frame's code and of code that runs
    /// once (`CodeSnap::name`).
    pub code_qualname: u32,
    /// Offset in a code object of `co_filename`: the start of that string is copied with the
    /// head of code that runs once (`CodeSnap::file`).
    pub code_filename: u32,
    /// Offset in the thread state of the task its event loop runs (3.14+
    /// `asyncio_running_task`, from the `_asyncio` module's debug offsets), copied into
    /// `SampleHeader::py_task`; `NO_OFFSET` unless async-aware stacks are asked for.
    pub tstate_running_task: u32,
    /// Address of the runtime's interpreter list head, for a process whose runtime is still
    /// starting (`interp` 0): its first Python code runs within moments of the interpreter's
    /// creation, before user space can look again.
    pub interp_head: u64,
    /// 3.11-3.13, `--async-aware`: the code object of asyncio's `Handle._run`, or 0. These
    /// versions keep no running task in the thread state; the task an event loop runs is the
    /// one whose step the innermost `Handle._run` frame calls: that frame's first local (`self`,
    /// at `frame_self`), its `_callback` (a step wrapper, at `handle_callback`) and the
    /// wrapper's task (at `step_task`) are read at the sample into `SampleHeader::py_task`.
    pub handle_run_code: u64,
    pub frame_self: u32,
    pub handle_callback: u32,
    pub step_task: u32,
    /// Offset of `previous` in `_PyCFrame` (3.11: 16, 3.12: 8), or `NO_OFFSET`. These versions
    /// make a new `_PyCFrame` current as the eval loop starts, before they set its frame: a
    /// sample in that window finds garbage there, and the thread's frames are the caller's, in
    /// the previous `_PyCFrame`.
    pub cframe_previous: u32,
    /// The owner byte of the frame an eval loop was entered with (3.11: `is_entry` 1, 3.12: the
    /// C-stack shim, 3), or 0: that frame's `previous` is the previous `_PyCFrame`'s frame, which
    /// tells a chain of this instant from the garbage of that window.
    pub entry_mark: u32,
    /// How far below the thread pointer the C library's thread descriptor (`pthread_self`,
    /// CPython's `thread_id`) is: 0 on x86_64; on arm64 glibc's `sizeof(struct pthread)`, or
    /// `NO_OFFSET` where it is unknown (no thread is looked up by its pointer then).
    pub thread_id_below_tp: u32,
}

/// One interpreter frame as read at the sampled instant.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PyFrame {
    /// Code object address (tag bits cleared).
    pub code: u64,
    /// FRAMEOBJECT layout: the raw `f_lasti`. INTERP layout: the instruction offset in code
    /// units, `(instr_ptr - code - co_code_adaptive) / 2` (-1 for a frame that has not started).
    pub instr: i32,
    /// Low byte: the raw `owner` (3.12+) or `is_entry` (3.11) byte. Bits 8-15: 1 + the index
    /// among the record's `CodeSnap`s of this frame's code head, or 0 when it was not copied.
    pub flags: u32,
}

/// The fixed part of a sample record.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SampleHeader {
    pub kind: u32,
    /// `SAMPLE_*` bits.
    pub flags: u32,
    /// Thread group id (the process id, as the host sees it).
    pub pid: u32,
    /// Thread id, as the host sees it.
    pub tid: u32,
    /// `CLOCK_MONOTONIC` nanoseconds.
    pub time_ns: u64,
    pub cpu: u32,
    /// Kernel frames in `kstack`.
    pub kstack_len: u32,
    /// Bytes of user stack after the Python frames.
    pub ustack_len: u32,
    /// Python frames after the header, innermost first.
    pub py_len: u32,
    pub comm: [u8; 16],
    /// User instruction pointer, stack pointer and frame pointer (x86_64's `rbp`, aarch64's
    /// `x29`).
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
    /// aarch64: the link register (`x30`), where a leaf function's return address may still
    /// be. 0 on x86_64.
    pub lr: u64,
    /// The Python thread state of the sampled thread, or 0.
    pub py_tstate: u64,
    /// The GIL's `last_holder` and `locked` words, read once at the sampled instant.
    pub py_gil_holder: u64,
    pub py_gil_locked: u32,
    /// The thread state's status word (see `PyProcConfig::tstate_status`).
    pub py_status: u32,
    /// The interpreter's `gc.collecting`.
    pub py_gc_collecting: u32,
    /// `CodeSnap`s in the record, after the Python frames.
    pub py_snaps: u32,
    /// `RECORD_SWITCH_OUT`: the task state the thread blocked in.
    pub sched_state: u64,
    /// The asyncio task the thread's event loop runs at the sampled instant (see
    /// `PyProcConfig::tstate_running_task`), or 0.
    pub py_task: u64,
    /// Kernel return addresses, innermost first.
    pub kstack: [u64; MAX_KSTACK],
}

/// The first bytes of the code object of a Python frame as they were at the sampled instant,
/// with the starts of its name and file strings. A record carries `SampleHeader::py_snaps` of
/// them after its Python frames: the innermost frame's, then those of frames with locals of
/// their own (module and class bodies), innermost first, up to `PY_CODE_SNAPS` (`PyFrame::flags`
/// says whose). Such code lives only moments (a module body run by an import) and may be freed,
/// its memory and its strings' reused, before user space reads it.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CodeSnap {
    /// `PyProcConfig::code_head_len` bytes; the type word zeroed where the read failed.
    pub head: [u8; PY_CODE_SNAP],
    /// The start of the name's string object (the type word zeroed where the read failed).
    pub name: [u8; PY_NAME_SNAP],
    /// The start of the file name's string object (as `name`).
    pub file: [u8; PY_FILE_SNAP],
}

impl CodeSnap {
    pub const SIZE: usize = core::mem::size_of::<CodeSnap>();
}

/// Code heads copied into a sample, at most (a power of two): an import nested 15 deep takes
/// 31 (each module body, and the function it calls).
pub const PY_CODE_SNAPS: usize = 32;
/// Bytes of a name's string object copied: a compact ASCII name of up to 88 characters (80
/// before 3.12) fits (qualified names of comprehensions in nested functions reach 60).
pub const PY_NAME_SNAP: usize = 128;
/// Bytes of a file name's string object copied: a compact ASCII path of up to 152 characters
/// (144 before 3.12) fits; of a longer one the length and start are checked against what is
/// read later.
pub const PY_FILE_SNAP: usize = 192;
/// Entries `SCHED` is declared with: user space makes it smaller on a host with fewer threads.
pub const MAX_SCHED_ENTRIES: u32 = 65536;
/// Slots of `BLOCK_DEADLINES` (a power of two): a thread's slot is its tid's low bits.
pub const BLOCK_DEADLINE_SLOTS: u32 = 1 << 14;
/// A `BLOCK_DEADLINES` word: the tid in its top 22 bits (tids stay below 2^22), the deadline in
/// its low 42, in units of 2^10 ns (52 days before they wrap; they are compared modulo that).
/// A deadline of 0 is the thread's `idle_word`.
pub const DEADLINE_TID_SHIFT: u32 = 42;
pub const DEADLINE_UNIT_SHIFT: u32 = 10;
pub const DEADLINE_MASK: u64 = (1 << DEADLINE_TID_SHIFT) - 1;

/// The `BLOCK_DEADLINES` word of thread `tid` that blocked with `deadline_ns` (a deadline whose
/// units wrap to 0 is moved a unit on: it would read as the `idle_word`).
pub const fn deadline_word(tid: u32, deadline_ns: u64) -> u64 {
    let units = (deadline_ns >> DEADLINE_UNIT_SHIFT) & DEADLINE_MASK;
    ((tid as u64) << DEADLINE_TID_SHIFT) | if units == 0 { 1 } else { units }
}

/// The `BLOCK_DEADLINES` word of thread `tid` whose switch-in has nothing to decide: it left the
/// CPU without blocking, or is not profiled. Its switch-in stops at this word.
pub const fn idle_word(tid: u32) -> u64 {
    (tid as u64) << DEADLINE_TID_SHIFT
}

/// Whether `word` is thread `tid`'s and its deadline is still ahead at `now_ns` (a whole unit
/// ahead: never a deadline that has passed).
pub const fn before_deadline(word: u64, tid: u32, now_ns: u64) -> bool {
    if word >> DEADLINE_TID_SHIFT != tid as u64 {
        return false;
    }
    let now = (now_ns >> DEADLINE_UNIT_SHIFT) & DEADLINE_MASK;
    let ahead = (word & DEADLINE_MASK).wrapping_sub(now) & DEADLINE_MASK;
    ahead != 0 && ahead < (1 << (DEADLINE_TID_SHIFT - 1))
}

/// Entries `STACK_TOPS` (an LRU map) is declared with.
pub const MAX_STACK_TOP_ENTRIES: u32 = 16384;

/// Slots of the table of code objects user space has read (`KNOWN_CODES`, a power of two): the
/// frame walk copies the head of a frame's code that is not in it, since user space may not get
/// to read that code before it is freed or its process exits (start-up code such as
/// `<frozen getpath>` is both, within milliseconds).
pub const KNOWN_CODES: usize = 1 << 16;

/// The word that stands for code object `code` of process `pid` in `KNOWN_CODES`, never 0: its
/// slot is `known_code_slot` of it. A slot holds one word; another code that maps to the same
/// slot replaces it (its code is then copied again until user space puts it back).
#[inline(always)]
pub const fn known_code_word(pid: u32, code: u64) -> u64 {
    (code ^ ((pid as u64) << 40) ^ (pid as u64)).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1
}

/// The slot of `word` (see `known_code_word`).
#[inline(always)]
pub const fn known_code_slot(word: u64) -> u32 {
    (word >> 40) as u32 & (KNOWN_CODES as u32 - 1)
}

/// Where `PyFrame::flags` keeps 1 + the frame's index among the record's `CodeSnap`s.
pub const PY_FRAME_SNAP_SHIFT: u32 = 8;
/// Bytes of a code object's head copied (covers type, names, first line and line table
/// pointers on every supported version).
pub const PY_CODE_SNAP: usize = 192;

impl SampleHeader {
    pub const SIZE: usize = core::mem::size_of::<SampleHeader>();
}

/// A lifetime event (`RECORD_FORK`, `RECORD_EXEC`, `RECORD_EXIT`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct EventRecord {
    pub kind: u32,
    pub cpu: u32,
    pub pid: u32,
    pub tid: u32,
    /// `CLOCK_MONOTONIC` nanoseconds.
    pub time_ns: u64,
    pub arg0: u64,
    pub arg1: u64,
    pub comm: [u8; 16],
}

impl EventRecord {
    pub const SIZE: usize = core::mem::size_of::<EventRecord>();
}

/// Capture slots a thread keeps: the blocking points it blocked at most recently, each with the
/// capture taken there. A block at one of them is charged to its capture without a new one.
/// A web service's worker blocks at a dozen points and more over a few requests (waiting for
/// work, the socket, a lock, a sleep, the GIL at a few places), two or three of them in every
/// request: with 4 slots the ones it blocks at every time were pushed out by the others before
/// they came round again, and 95% of its captures were of stacks it had been captured at
/// before (the web service of the benchmark: 916 captures of 46 stacks in 20 s). With 16, its
/// captures fell by three quarters.
pub const SCHED_SLOTS: usize = 16;
/// Where an off-CPU interval is charged (`SchedRecord::off_ns` index): slots `0..SCHED_SLOTS`
/// are the thread's captures, then these.
/// Preempted while runnable: it stopped where it ran, so its latest sample or capture applies.
pub const ATTR_LATEST: u32 = SCHED_SLOTS as u32;
/// Blocked where no capture could be taken (the ring buffer was full, or more new blocking
/// points than the capture budget): time without a stack.
pub const ATTR_UNCAPTURED: u32 = SCHED_SLOTS as u32 + 1;
/// No stack is charged: times only (`OFFCPU_TIMES`), or a short interval the sampling left out
/// (`OFFCPU_STACKS`). Off-CPU intervals shorter than a sampling period `P` are sampled by their
/// time, as on-CPU time is: their lengths add up in `ThreadSched::short_ns`, and the interval
/// that brings the sum to `P` is kept and charged with the whole sum (its slot's `off_ns` gets
/// the others' share). So each stack's off-CPU time is sampled in proportion to it, and every
/// thread's total stays exact. The thread's Off CPU markers count every interval exactly.
pub const ATTR_NONE: u32 = SCHED_SLOTS as u32 + 2;
pub const ATTR_COUNT: usize = SCHED_SLOTS + 3;
/// (`ThreadSched::attr` only.) A thread first seen as it left the CPU: what it did before it
/// last came on is not known, so no off-CPU interval is charged before that.
pub const ATTR_UNKNOWN: u32 = u32::MAX;
/// (`ThreadSched::attr` only.) The thread blocked and has not come back yet: where its interval
/// is charged is decided when it does (`tachyon_switch_in`), once its length is known. Still
/// pending at its next switch-out (its switch-in was not seen), it is `ATTR_UNCAPTURED`.
pub const ATTR_PENDING: u32 = u32::MAX - 1;

/// What the scheduler program knows of one thread (the `SCHED` map, keyed by [`thread_key`]).
/// The thread's time is a sequence of on- and off-CPU intervals. One at least a sampling period
/// long is sent alone, with its exact bounds; shorter ones are summed into a span that is sent
/// once it covers a sampling period (or before a long interval, or at exit). So records follow
/// the sampling rate, not the thread's switch rate. Only switch-outs are traced: between two of
/// them a thread was off CPU, then on CPU for the CPU time it used (`sum_exec_runtime`), so one
/// switch-out closes both intervals. User space reads what is still here when the run (or a
/// continuous interval) ends.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ThreadSched {
    /// The thread's last switch-out: when (0: none seen yet) and its CPU time then.
    pub since_ns: u64,
    pub last_sum: u64,
    /// `ATTR_*` or a slot: where the off-CPU interval that began then is charged.
    pub attr: u32,
    /// The task state it blocked in (`ATTR_PENDING`), for the capture at its switch-in.
    pub blocked_state: u32,
    /// Off-CPU time of short intervals the sampling left out since the last one it kept, as
    /// the accounting closed them (see `ATTR_NONE`), which that next kept one is charged with;
    /// starts at a random share of a sampling period. Beside the fields every switch-out
    /// writes: these, up to `next_slot`, fill the first cache line of a `SCHED` entry (it
    /// spans eight); of the others a switch-out writes one word of `off_ns`, and the capture
    /// slots are read only when a thread comes back from a kept interval.
    pub short_ns: u64,
    /// The open span: its first interval's start (0: none) and last interval's end.
    pub span_start: u64,
    pub span_end: u64,
    pub on_ns: u64,
    /// Intervals summed into the span.
    pub switches: u32,
    /// The slot the next new capture takes.
    pub next_slot: u32,
    pub off_ns: [u64; ATTR_COUNT],
    /// Block signature and capture time of each slot (capture time 0: empty).
    pub slot_sig: [u64; SCHED_SLOTS],
    pub slot_cap: [u64; SCHED_SLOTS],
}

/// A thread's [`ThreadSched`] as it exited at `time_ns` with CPU time `sum_ns`
/// (`RECORD_EXIT_SCHED`): its open span, and since its last switch-out (`sched.since_ns`; 0 when
/// its CPU time could not be read) off CPU, then on CPU for `sum_ns - sched.last_sum`. Closed in
/// user space as at the end of a run: the exit program copies the state instead of closing the
/// intervals itself, which kept the verifier on it for a fifth of the BPF load at start-up.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ExitSchedRecord {
    pub kind: u32,
    pub cpu: u32,
    pub pid: u32,
    pub tid: u32,
    pub time_ns: u64,
    pub sum_ns: u64,
    pub sched: ThreadSched,
}

impl ExitSchedRecord {
    pub const SIZE: usize = core::mem::size_of::<ExitSchedRecord>();
}

/// One thread's scheduler accounting from `t0_ns` to `t1_ns` (`RECORD_SCHED`). With
/// `switches == 0` it is one interval, exact: on CPU when `on_ns` is its length, else off CPU
/// with its length in `off_ns[attr]`. Otherwise it sums `switches` short intervals in that
/// window: `on_ns` on CPU, `off_ns[a]` off CPU charged to `a` (a slot's capture is the one taken
/// at time `slot_cap[a]`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct SchedRecord {
    pub kind: u32,
    pub cpu: u32,
    pub pid: u32,
    pub tid: u32,
    /// `t0_ns` 0: since before the thread was first seen (its start, as user space knows it).
    pub t0_ns: u64,
    pub t1_ns: u64,
    pub on_ns: u64,
    pub off_ns: [u64; ATTR_COUNT],
    pub slot_cap: [u64; SCHED_SLOTS],
    pub switches: u32,
    pub attr: u32,
}

impl SchedRecord {
    pub const SIZE: usize = core::mem::size_of::<SchedRecord>();
}

/// Size of the per-CPU scratch buffer a record is assembled in.
pub const SCRATCH_SIZE: usize = SampleHeader::SIZE
    + MAX_PY_FRAMES * core::mem::size_of::<PyFrame>()
    + PY_CODE_SNAPS * CodeSnap::SIZE
    + MAX_USTACK;

/// `task_struct.flags` bit of kernel threads.
pub const PF_KTHREAD: u32 = 0x0020_0000;

/// Key of the thread map: `(pid << 32) | tid`.
pub const fn thread_key(pid: u32, tid: u32) -> u64 {
    ((pid as u64) << 32) | tid as u64
}

const _: () = assert!(core::mem::size_of::<Config>() == 104);
const _: () = assert!(core::mem::size_of::<PyProcConfig>() == 176);
const _: () = assert!(EventRecord::SIZE == 56);
const _: () = assert!(SchedRecord::SIZE == 328);
const _: () = assert!(core::mem::size_of::<ThreadSched>() == 472);
const _: () = assert!(core::mem::size_of::<PyFrame>() == 16);
// The BPF program bounds indexes by masking with these less one.
const _: () = assert!(MAX_PY_FRAMES.is_power_of_two() && PY_CODE_SNAPS.is_power_of_two());
const _: () = assert!(KNOWN_CODES.is_power_of_two());
const _: () = assert!(SampleHeader::SIZE == 136 + MAX_KSTACK * 8);
const _: () = assert!(SampleHeader::SIZE.is_multiple_of(8));
const _: () = assert!(CodeSnap::SIZE == PY_CODE_SNAP + PY_NAME_SNAP + PY_FILE_SNAP);
const _: () = assert!(CodeSnap::SIZE.is_multiple_of(8));

#[cfg(feature = "user")]
mod pod {
    // SAFETY: plain `#[repr(C)]` integers with explicit padding; every bit pattern is valid.
    unsafe impl aya::Pod for super::Config {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::PyProcConfig {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::ThreadSched {}
}

/// The instruction (in code units) a 3.11+ frame is at, from its instruction pointer word and its
/// code object's address: code units start `code_adaptive` bytes into the code object, 2 bytes
/// each. The BPF frame walk and user space's own walk compute it the same way.
#[inline(always)]
pub fn interp_instruction(ip: u64, code: u64, code_adaptive: u32) -> i32 {
    (ip.wrapping_sub(code).wrapping_sub(code_adaptive as u64) as i64 / 2) as i32
}
