//! asyncio's tasks, read from outside (`--async-aware`): the task a thread's event loop runs,
//! the tasks that await it, and each one's name and coroutine chain.
//!
//! 3.14+: the `_asyncio` module publishes the layout of its tasks and where the thread state
//! keeps the running one in an `.AsyncioDebug` section, for remote readers, as
//! `_Py_DebugOffsets` does for the interpreter; the generator and frame fields a coroutine
//! chain needs come from `_Py_DebugOffsets` (`Layout::gen_iframe` and the rest). Each task
//! records who awaits it, and each thread state lists its loop's tasks.
//!
//! 3.11-3.13 (`AsyncLayout::legacy`): the layouts are tables here (measured on each version),
//! no thread state says which task runs, and no task says who awaits it. The running task is
//! the one whose step the innermost `Handle._run` frame calls (the BPF program reads it at the
//! sample, see `PyProcConfig::handle_run_code`). Who awaits a task is who its completion
//! wakes: its done callbacks are followed to a task's wakeup (`await task`), through a
//! closure's future (`gather`, `shield`, `wait`), or to the task a bound method's object holds
//! (a `TaskGroup`'s parent task). For `all`, every task is read from the `WeakSet` of tasks
//! `_asyncio` keeps (`find_task_set`, `set_tasks`), and given to the thread its loop runs in.
//!
//! The BPF program copies the running task's address at the sampled instant; the task objects
//! are read when the sample is resolved, milliseconds later. The tasks that await the running
//! one are suspended in that `await` for as long as it runs, so what they show is what they
//! were at the sample, unless the running task finished within those milliseconds; the running
//! task itself is checked against the sample (its coroutine's code must be one of the sampled
//! frames) before anything of it is believed.
//!
//! Target memory is untrusted: every chain is bounded, a cycle or a freed task ends a walk, and
//! names are decoded with the same checks as code-object names.

mod all_tasks;
mod chain;
mod layout;
pub mod state;
mod wakeups;

pub use layout::TaskBytes;
use layout::TypeCache;
use wakeups::set_members;

use super::objects::{
    CELL_REF, CFUNCTION_SELF, FUNCTION_CLOSURE, HEAP_TYPE_MODULE, LONG, METHOD_SELF, MODULE_STATE,
    SET, TYPE, VAR, WEAKREF_OBJECT,
};
use std::collections::{HashMap, HashSet};

use super::code::read_unicode;
use super::layout::Layout;
use super::remote::{le_u64, Remote};
use crate::process::Process;

/// Tasks followed from the running one out through the tasks awaiting it.
pub const MAX_TASK_DEPTH: usize = 64;
/// Coroutines followed down one suspended task's await chain.
pub const MAX_CORO_DEPTH: usize = 64;
/// Largest table of an awaited-by set read (its `mask + 1`).
const MAX_SET_TABLE: u64 = 4096;
/// Tasks listed per thread on a pass of `all` mode at most.
pub const MAX_TASKS: usize = 20_000;
/// Longest task name kept (characters).
const MAX_NAME: usize = 200;
/// A frame's owner byte when a generator or coroutine owns it (3.14, 3.15).
const FRAME_OWNED_BY_GENERATOR: u8 = 1;
/// Base types followed to find a type's name among asyncio's (a subclass of `Task`).
const MAX_BASES: usize = 8;
/// Done callbacks of one future looked at, closure cells of one callback, and attribute values
/// of one object, at most.
const MAX_CALLBACKS: usize = 16;
const MAX_CELLS: usize = 16;
const MAX_VALUES: usize = 16;
/// Words of `_asyncio`'s module state (3.12, 3.13), or bytes of its static data (3.11), looked
/// through for its set of every task.
const STATE_WORDS: usize = 64;
const MAX_STATIC: u64 = 64 << 10;
/// Largest table of the set of every task read (its `mask + 1`): room for `MAX_TASKS`.
const MAX_TASK_TABLE: u64 = 1 << 17;
/// Futures followed from a task's callbacks to the task its completion wakes (a `gather`'s
/// outer future is one).
const MAX_FUTURE_HOPS: usize = 2;

/// Where asyncio keeps what async-aware stacks read, in one process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AsyncLayout {
    task_size: u64,
    task_name: u64,
    task_coro: u64,
    tasks: TaskLinks,
    gen_iframe: u64,
    gen_frame_state: u64,
    frame_code: u64,
    frame_instr: u64,
    frame_owner: u64,
    stack: StackTop,
    code_mask: u64,
    code_adaptive: u64,
    /// The state byte of a coroutine not started yet (`FRAME_CREATED`); the states after it
    /// up to `created + awaiting` are suspended ones.
    created: u8,
    /// `state - created` of a coroutine suspended in an `await` (3.13+:
    /// `FRAME_SUSPENDED_YIELD_FROM`, 2; before: `FRAME_SUSPENDED`, 1, in an `await` or not).
    awaiting: u8,
    /// Words below a suspended frame's stack pointer where the object it awaits is.
    await_slot: u64,
    str_type: u64,
    long_type: u64,
    /// 3.11-3.13: type objects read, by address (see `TypeCache`).
    types: TypeCache,
}

/// How tasks are told from other objects, and how the tasks awaiting one are found.
#[derive(Clone, Debug, PartialEq, Eq)]
enum TaskLinks {
    /// 3.14+ (`.AsyncioDebug`): a task says it is one and records who awaits it; each thread
    /// state keeps its running task and a list of its loop's tasks.
    Recorded {
        is_task: u64,
        awaited_by: u64,
        awaited_by_is_set: u64,
        node: u64,
        tstate_running_task: u64,
        tstate_tasks_head: u64,
    },
    /// 3.11-3.13: a task is an object whose type is (or derives from) `_asyncio.Task`; the
    /// tasks awaiting it are found from its done callbacks (`callback0` and the `callbacks`
    /// list of (callback, context) tuples).
    Callbacks {
        callback0: u64,
        callbacks: u64,
        /// Where an object keeps its attribute values, for a bound method's object.
        values: Values,
    },
}

/// Where a plain object's attribute values are while its `__dict__` was never asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Values {
    /// 3.11: a pointer to them 4 words before the object.
    Before,
    /// 3.12: 3 words before the object, minus one (the low bit set says values, not a dict).
    Tagged,
    /// 3.13: inline after the object's `tp_basicsize`, after a word of sizes and flags whose
    /// fourth byte says they are valid.
    Inline,
}

/// Where a suspended frame's stack ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum StackTop {
    /// 3.14+: the frame's `stackpointer`, at this offset.
    Pointer(u64),
    /// 3.11-3.13: the frame's `stacktop` (an i32 index into its locals and stack) at `at`;
    /// the locals start at `localsplus`.
    Index { at: u64, localsplus: u64 },
}

/// The running task's step wrapper in a `Handle` (3.11-3.13): `Handle._callback` (slots are
/// laid out in sorted order: `_args`, `_callback`, ...) and `TaskStepMethWrapper::sw_task`.
pub const HANDLE_CALLBACK: u32 = 24;
pub const STEP_TASK: u32 = 16;

/// One task of an await chain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskLink {
    /// The name shown: what `create_task(name=...)` or `set_name` gave, else `Task-N`, with
    /// ` (N parents)` when several tasks await it (the one at the lowest address is followed,
    /// as CPython's sampler does).
    pub name: String,
    /// Its coroutine chain at its suspension point, outermost first, as (code object,
    /// instruction offset); empty for the running task (its frames are the sample's).
    pub frames: Vec<(u64, i32)>,
}

/// The running task and the tasks awaiting it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AwaitChain {
    /// The code object of the running task's coroutine: its outermost frame in the sample is
    /// where the task's own frames start.
    pub coro_code: u64,
    /// The running task first, then each task awaiting the previous one.
    pub tasks: Vec<TaskLink>,
    /// The chain ended early: a cycle, a task that did not read, or `MAX_TASK_DEPTH`.
    pub cut: bool,
}

/// A task object as read.
#[derive(Clone)]
struct TaskObj {
    name: String,
    coro: u64,
    /// The tasks awaiting it (or futures: only tasks are followed).
    parents: Vec<u64>,
}

/// Task names kept between passes of `all` mode, by task and name object.
pub type NameCache = std::collections::HashMap<(u64, u64), String>;

/// A user-space address an object can have.
fn plausible(a: u64) -> bool {
    super::plausible_object(a)
}

#[cfg(test)]
mod tests;
