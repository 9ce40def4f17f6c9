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

pub mod state;

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
/// `PySetObject`'s `used`, `mask` and `table` (3.11-3.15); a table entry is a key and a hash.
const SET_USED: usize = 24;
const SET_MASK: usize = 32;
const SET_TABLE: usize = 40;
/// `PyLongObject`'s `lv_tag` and first 30-bit digit (3.12+).
const LONG_TAG: usize = 16;
const LONG_DIGITS: usize = 24;
/// `PyTypeObject`'s `tp_name`, `tp_basicsize` and (3.11-3.13) `tp_base`.
const TP_NAME: u64 = 24;
const TP_BASICSIZE: u64 = 32;
const TP_BASE: u64 = 256;
/// Base types followed to find a type's name among asyncio's (a subclass of `Task`).
const MAX_BASES: usize = 8;
/// `PyTupleObject`'s and `PyListObject`'s size, a tuple's items, a list's item array.
const VAR_SIZE: u64 = 16;
const TUPLE_ITEMS: u64 = 24;
const LIST_ITEMS: u64 = 24;
/// `PyCFunctionObject::m_self` and `PyMethodObject::im_self`; `PyFunctionObject::func_closure`
/// (3.11-3.13); `PyCellObject::ob_ref`.
const CFUNC_SELF: u64 = 24;
const METHOD_SELF: u64 = 24;
const FUNC_CLOSURE: u64 = 72;
const CELL_REF: u64 = 16;
/// Done callbacks of one future looked at, closure cells of one callback, and attribute values
/// of one object, at most.
const MAX_CALLBACKS: usize = 16;
const MAX_CELLS: usize = 16;
const MAX_VALUES: usize = 16;
/// `PyHeapTypeObject::ht_module` (3.12, 3.13) and `PyModuleObject::md_state`.
const HT_MODULE: u64 = 888;
const MD_STATE: u64 = 32;
/// Words of `_asyncio`'s module state (3.12, 3.13), or bytes of its static data (3.11), looked
/// through for its set of every task.
const STATE_WORDS: usize = 64;
const MAX_STATIC: u64 = 64 << 10;
/// `PyWeakReference::wr_object`.
const WR_OBJECT: u64 = 16;
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

/// The name and base of each type object read (3.11-3.13 tell asyncio's objects by their
/// types' names): a type lives as long as objects of it, and the same few are met again and
/// again. Shared by the copies of a layout; not part of what a layout is.
#[derive(Clone, Debug, Default)]
struct TypeCache(std::sync::Arc<std::sync::Mutex<Caches>>);

#[derive(Debug, Default)]
struct Caches {
    types: HashMap<u64, TypeEntry>,
    /// The tasks each done callback leads to, by the callback's address, for one pass or
    /// chain read (`TypeCache::new_read`): a `gather` adds one callback to all its children.
    woken: HashMap<u64, Vec<u64>>,
}

/// A type's name (its first `TYPE_NAME_LEN` bytes) and its base type's address.
type TypeEntry = (Vec<u8>, u64);

/// Tasks as listed for a pass of `all`: each one's address and object bytes.
pub type TaskBytes = Vec<(u64, Vec<u8>)>;

impl PartialEq for TypeCache {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for TypeCache {}

/// Types kept in a `TypeCache` at most.
const MAX_TYPES: usize = 4096;
/// Bytes of a type's name read: the longest name looked for, with its terminator.
const TYPE_NAME_LEN: usize = 32;

impl TypeCache {
    /// A new pass or chain read: what callbacks led to is read again.
    fn new_read(&self) {
        if let Ok(mut c) = self.0.lock() {
            c.woken.clear();
        }
    }

    fn woken(&self, cb: u64) -> Option<Vec<u64>> {
        self.0.lock().ok()?.woken.get(&cb).cloned()
    }

    fn set_woken(&self, cb: u64, tasks: &[u64]) {
        if let Ok(mut c) = self.0.lock() {
            c.woken.insert(cb, tasks.to_vec());
        }
    }

    /// Which of `names` type `ty` is named, or derives from a type so named (3.11-3.13's
    /// asyncio types have no flag to tell them by; a subclass of `Task` derives from it).
    fn named(&self, r: &Remote, mut ty: u64, names: &[&[u8]]) -> Option<usize> {
        for _ in 0..MAX_BASES {
            if !plausible(ty) {
                return None;
            }
            let known = self.0.lock().ok()?.types.get(&ty).cloned();
            let (name, base) = match known {
                Some(k) => k,
                None => {
                    let name = r
                        .u64(ty + TP_NAME)
                        .and_then(|p| r.read(p, TYPE_NAME_LEN))
                        .unwrap_or_default();
                    let base = r.u64(ty + TP_BASE)?;
                    let cache = &mut self.0.lock().ok()?.types;
                    if cache.len() >= MAX_TYPES {
                        cache.clear();
                    }
                    cache.insert(ty, (name.clone(), base));
                    (name, base)
                }
            };
            let found = names
                .iter()
                .position(|n| name.get(..n.len()) == Some(n) && name.get(n.len()) == Some(&0));
            if found.is_some() {
                return found;
            }
            ty = base;
        }
        None
    }
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

/// The words of `.AsyncioDebug` (`_Py_AsyncioModuleDebugOffsets`, 3.14 and 3.15): the task
/// object's size, name, awaited_by, is_task, awaited_by_is_set, coro and node; the interpreter
/// state's size and task list; the thread state's size, running loop, running task and list.
const SECTION_WORDS: usize = 13;

impl AsyncLayout {
    /// Finds the `.AsyncioDebug` section among `proc`'s mapped files (the interpreter's when
    /// `_asyncio` is built in, else the `_asyncio` extension, mapped once asyncio is imported)
    /// and reads it. `None` before asyncio is imported, for versions before 3.14, and for
    /// offsets that do not make sense.
    pub fn find(
        proc: &Process,
        remote: &Remote,
        layout: &Layout,
        str_type: u64,
        long_type: u64,
    ) -> Option<AsyncLayout> {
        let (created, await_slot) = match layout.minor {
            14 => (0xfd, 1), // FRAME_CREATED is -3; the awaited object on the stack's top.
            15 => (0, 2),    // renumbered from 0; the awaited object under the value sent.
            _ => return None,
        };
        let (gen_iframe, gen_frame_state, frame_stackpointer) = (
            layout.gen_iframe?,
            layout.gen_frame_state?,
            layout.frame_stackpointer?,
        );
        for m in &proc.modules {
            let Some(elf) = &m.elf else { continue };
            let file = m.path.rsplit('/').next().unwrap_or("");
            if !file.contains("python") && !file.starts_with("_asyncio") {
                continue;
            }
            let Some(svma) = elf.section_address(".AsyncioDebug") else {
                continue;
            };
            let b = remote.read(svma.wrapping_add(m.bias), SECTION_WORDS * 8)?;
            let w = |i: usize| le_u64(&b, i * 8).unwrap_or(u64::MAX);
            let l = AsyncLayout {
                task_size: w(0),
                task_name: w(1),
                task_coro: w(5),
                tasks: TaskLinks::Recorded {
                    is_task: w(3),
                    awaited_by: w(2),
                    awaited_by_is_set: w(4),
                    node: w(6),
                    tstate_running_task: w(11),
                    tstate_tasks_head: w(12),
                },
                gen_iframe,
                gen_frame_state,
                frame_code: layout.frame_code as u64,
                frame_instr: layout.frame_instr as u64,
                frame_owner: layout.frame_owner as u64,
                stack: StackTop::Pointer(frame_stackpointer),
                code_mask: layout.code_mask,
                code_adaptive: layout.code_adaptive as u64,
                created,
                awaiting: 2,
                await_slot,
                str_type,
                long_type,
                types: TypeCache::default(),
            };
            return l.sane(w(9)).then_some(l);
        }
        None
    }

    /// 3.11-3.13's layouts (the same in every build of a version: measured on pyenv's 3.11.7,
    /// 3.12.1 and 3.13.0 and Debian's 3.11.2). `None` for other versions.
    pub fn legacy(layout: &Layout, str_type: u64, long_type: u64) -> Option<AsyncLayout> {
        // (task size read, name, coro; generator iframe, frame state; the frame's owner byte;
        // FRAME_CREATED and what `state - created` a suspension in an `await` has; values).
        let (task_size, task_name, task_coro, gen_iframe, gen_frame_state, frame_owner) =
            match layout.minor {
                11 => (152, 144, 136, 80, 75, 69),
                12 => (152, 144, 136, 72, 67, 70),
                13 => (136, 128, 120, 72, 67, 70),
                _ => return None,
            };
        let (created, awaiting, values) = match layout.minor {
            11 => (0xfe, 1, Values::Before),
            12 => (0xfe, 1, Values::Tagged),
            _ => (0xfd, 2, Values::Inline),
        };
        Some(AsyncLayout {
            task_size,
            task_name,
            task_coro,
            tasks: TaskLinks::Callbacks {
                callback0: 24,
                callbacks: 40,
                values,
            },
            gen_iframe,
            gen_frame_state,
            frame_code: layout.frame_code as u64,
            frame_instr: layout.frame_instr as u64,
            frame_owner,
            // `_PyInterpreterFrame::stacktop`, right before the locals at 72 (3.11-3.13).
            stack: StackTop::Index {
                at: 64,
                localsplus: layout.frame_localsplus as u64,
            },
            code_mask: layout.code_mask,
            code_adaptive: layout.code_adaptive as u64,
            created,
            awaiting,
            await_slot: 1,
            str_type,
            long_type,
            types: TypeCache::default(),
        })
    }

    /// Offset in the thread state of the task its event loop runs (3.14+:
    /// `asyncio_running_task`); `None` where the thread state has none (3.11-3.13).
    pub fn tstate_running_task(&self) -> Option<u64> {
        match self.tasks {
            TaskLinks::Recorded {
                tstate_running_task,
                ..
            } => Some(tstate_running_task),
            TaskLinks::Callbacks { .. } => None,
        }
    }

    /// Whether thread states list their loop's tasks (3.14+: `thread_tasks`); before, `all`
    /// reads `_asyncio`'s set of every task (`set_tasks`).
    pub fn lists_tasks(&self) -> bool {
        matches!(self.tasks, TaskLinks::Recorded { .. })
    }

    /// Whether the offsets fit the objects they are in (`tstate_size`: the thread state's).
    fn sane(&self, tstate_size: u64) -> bool {
        let in_task =
            |off: u64, len: u64| off.checked_add(len).is_some_and(|e| e <= self.task_size);
        let stack = match self.stack {
            StackTop::Pointer(at) => at,
            StackTop::Index { at, localsplus } => at.max(localsplus),
        };
        let frame_end = [self.frame_code, self.frame_instr, stack]
            .into_iter()
            .max()
            .unwrap_or(0)
            .max(self.frame_owner)
            + 8;
        let tasks = match self.tasks {
            TaskLinks::Recorded {
                is_task,
                awaited_by,
                awaited_by_is_set,
                node,
                tstate_running_task,
                tstate_tasks_head,
            } => {
                in_task(awaited_by, 8)
                    && in_task(is_task, 1)
                    && in_task(awaited_by_is_set, 1)
                    && in_task(node, 16)
                    && tstate_tasks_head + 16 <= tstate_size
                    && tstate_size <= 1 << 16
                    && tstate_running_task + 8 <= tstate_size
                    && tstate_running_task <= u32::MAX as u64
            }
            TaskLinks::Callbacks {
                callback0,
                callbacks,
                ..
            } => in_task(callback0, 8) && in_task(callbacks, 8),
        };
        (32..=4096).contains(&self.task_size)
            && in_task(self.task_name, 8)
            && in_task(self.task_coro, 8)
            && tasks
            && self.gen_frame_state < 4096
            && self.gen_iframe < 4096
            && frame_end < 4096
    }

    /// The running task `running` (as the sample copied it) and the tasks awaiting it. `None`
    /// when it does not read as a task with a coroutine.
    pub fn await_chain(&self, r: &Remote, layout: &Layout, running: u64) -> Option<AwaitChain> {
        self.types.new_read();
        let first = self.task(r, layout, running)?;
        let (coro_code, _) = self.coro_frame(r, first.coro)?.0;
        // The running task's frames are the sample's; the others are at their `await`.
        let (tasks, cut) = self.walk_chain(
            running,
            first,
            |a| self.task(r, layout, a),
            |a, t| match a == running {
                true => Vec::new(),
                false => self.coro_chain(r, t.coro),
            },
        );
        Some(AwaitChain {
            coro_code,
            tasks,
            cut,
        })
    }

    /// An await chain from task `first` (at `first_addr`) out through the tasks awaiting each
    /// one, as `lookup` finds them (only tasks: a set also holds the dummies of removed
    /// entries), each with the coroutine frames `frames` gives it; and whether it was cut (a
    /// cycle, an awaiter that is no task found, or `MAX_TASK_DEPTH`).
    fn walk_chain(
        &self,
        first_addr: u64,
        first: TaskObj,
        lookup: impl Fn(u64) -> Option<TaskObj>,
        frames: impl Fn(u64, &TaskObj) -> Vec<(u64, i32)>,
    ) -> (Vec<TaskLink>, bool) {
        let mut out = Vec::new();
        let mut seen = HashSet::from([first_addr]);
        let (mut addr, mut task) = (first_addr, first);
        loop {
            let mut parents: Vec<(u64, TaskObj)> = task
                .parents
                .iter()
                .take(MAX_TASK_DEPTH)
                .filter_map(|&a| Some((a, lookup(a)?)))
                .collect();
            parents.sort_by_key(|p| p.0);
            let count = parents.len();
            let mut name = task.name.clone();
            if count > 1 {
                name = format!("{name} ({count} parents)");
            }
            out.push(TaskLink {
                name,
                frames: frames(addr, &task),
            });
            if count == 0 {
                // Awaited by something that is no task found here: said, not hidden.
                return (out, !task.parents.is_empty());
            }
            let (parent, t) = parents.swap_remove(0);
            if out.len() >= MAX_TASK_DEPTH || !seen.insert(parent) {
                return (out, true);
            }
            (addr, task) = (parent, t);
        }
    }

    /// What a task's await chain is read from, in the task itself: its coroutine, name and
    /// awaited-by words (3.11-3.13: its done callbacks), or `None` when it does not read as a
    /// task. A chain read before is still the task's while these are the same: the tasks
    /// awaiting it stay suspended where they were while it runs.
    pub fn task_key(&self, r: &Remote, addr: u64) -> Option<[u64; 3]> {
        if !plausible(addr) {
            return None;
        }
        let b = r.read(addr, self.task_size as usize)?;
        let word = |off: u64| le_u64(&b, off as usize);
        let links = match self.tasks {
            TaskLinks::Recorded {
                is_task,
                awaited_by,
                ..
            } => {
                if b.get(is_task as usize) != Some(&1) {
                    return None;
                }
                word(awaited_by)?
            }
            TaskLinks::Callbacks {
                callback0,
                callbacks,
                ..
            } => {
                // The type is checked when the chain is read; a key that stays is the same
                // object's (a new task at the address has another coroutine). A callback
                // appended to the list keeps the list where it was: its length is read too.
                let list = word(callbacks)?;
                let len = match list {
                    0 => 0,
                    l => r.u64(l.wrapping_add(VAR_SIZE)).unwrap_or(0),
                };
                word(callback0)? ^ list.rotate_left(32) ^ len.rotate_left(48)
            }
        };
        Some([word(self.task_coro)?, word(self.task_name)?, links])
    }

    /// Reads a task object: `None` for anything that does not say it is a task.
    fn task(&self, r: &Remote, layout: &Layout, addr: u64) -> Option<TaskObj> {
        if !plausible(addr) {
            return None;
        }
        let b = r.read(addr, self.task_size as usize)?;
        self.parse_task(r, layout, addr, &b, None)
    }

    /// Whether the object at `addr` is a task.
    pub fn is_task_at(&self, r: &Remote, addr: u64) -> bool {
        plausible(addr)
            && r.read(addr, self.task_size as usize)
                .is_some_and(|b| self.is_task(r, &b))
    }

    /// Whether the object whose bytes start with `b` is a task.
    fn is_task(&self, r: &Remote, b: &[u8]) -> bool {
        match self.tasks {
            TaskLinks::Recorded { is_task, .. } => b.get(is_task as usize) == Some(&1),
            TaskLinks::Callbacks { .. } => {
                le_u64(b, 8).and_then(|ty| self.types.named(r, ty, &[b"_asyncio.Task"])) == Some(0)
            }
        }
    }

    /// A task object from its bytes `b` (read at `addr`): `None` for anything that does not
    /// say it is a task, or has no coroutine. `names`: names known from before, by task and
    /// name object (`all` mode's passes).
    fn parse_task(
        &self,
        r: &Remote,
        layout: &Layout,
        addr: u64,
        b: &[u8],
        names: Option<&mut NameCache>,
    ) -> Option<TaskObj> {
        if !self.is_task(r, b) {
            return None;
        }
        let word = |off: u64| le_u64(b, off as usize).map(|v| v & self.code_mask);
        let coro = word(self.task_coro).filter(|&c| c != 0)?;
        let parents = match self.tasks {
            TaskLinks::Recorded {
                awaited_by,
                awaited_by_is_set,
                ..
            } => match (
                word(awaited_by).unwrap_or(0),
                b.get(awaited_by_is_set as usize),
            ) {
                (0, _) => Vec::new(),
                (set, Some(&1)) => set_members(r, set, MAX_SET_TABLE),
                (one, _) => vec![one],
            },
            // A callback's object may hold the task itself: not its own awaiter.
            TaskLinks::Callbacks { .. } => {
                let mut woken = self.woken_by(r, b, 0);
                woken.retain(|&t| t != addr);
                woken
            }
        };
        let name_obj = word(self.task_name).unwrap_or(0);
        let read_name = || {
            self.name(r, layout, name_obj)
                .unwrap_or_else(|| "Task".into())
        };
        let name = match names {
            Some(names) => names
                .entry((addr, name_obj))
                .or_insert_with(read_name)
                .clone(),
            None => read_name(),
        };
        Some(TaskObj {
            name,
            coro,
            parents,
        })
    }

    /// 3.11-3.13: the tasks the completion of a future (its bytes `b`) wakes, found from its
    /// done callbacks: a task's wakeup (a built-in method bound to the task: `await`), a
    /// function whose closure holds a future whose completion wakes a task (`gather`,
    /// `shield`, `wait`; `hops` of them followed so far), a bound method of an object that
    /// holds a task among its attributes (a `TaskGroup`'s `_on_task_done`: its parent task).
    fn woken_by(&self, r: &Remote, b: &[u8], hops: usize) -> Vec<u64> {
        let TaskLinks::Callbacks {
            callback0,
            callbacks,
            values,
        } = self.tasks
        else {
            return Vec::new();
        };
        let mut cbs: Vec<u64> = le_u64(b, callback0 as usize)
            .filter(|&c| c != 0)
            .into_iter()
            .collect();
        if let Some(list) = le_u64(b, callbacks as usize).filter(|&l| plausible(l)) {
            for item in var_items(r, list, LIST_ITEMS, true, MAX_CALLBACKS) {
                // Each a (callback, context) tuple.
                if let Some(cb) = var_items(r, item, TUPLE_ITEMS, false, 1).first() {
                    cbs.push(*cb);
                }
            }
        }
        let mut out = Vec::new();
        for cb in cbs.into_iter().take(MAX_CALLBACKS) {
            if let Some(known) = self.types.woken(cb).filter(|_| hops == 0) {
                for t in known {
                    if !out.contains(&t) {
                        out.push(t);
                    }
                }
                continue;
            }
            let Some(ty) = plausible(cb).then(|| r.u64(cb + 8)).flatten() else {
                continue;
            };
            const KINDS: [&[u8]; 3] = [b"builtin_function_or_method", b"method", b"function"];
            let found: Vec<u64> = match self.types.named(r, ty, &KINDS) {
                Some(0) => r.u64(cb + CFUNC_SELF).into_iter().collect(),
                Some(1) => r
                    .u64(cb + METHOD_SELF)
                    .map(|o| self.values_of(r, o, values))
                    .unwrap_or_default(),
                Some(2) if hops < MAX_FUTURE_HOPS => {
                    let closure = r.u64(cb + FUNC_CLOSURE).filter(|&c| plausible(c));
                    let cells = closure
                        .map(|c| var_items(r, c, TUPLE_ITEMS, false, MAX_CELLS))
                        .unwrap_or_default();
                    let mut via = Vec::new();
                    for cell in cells {
                        let Some(v) = r.u64(cell + CELL_REF).filter(|&v| plausible(v)) else {
                            continue;
                        };
                        let Some(fb) = r.read(v, self.task_size as usize) else {
                            continue;
                        };
                        let future = le_u64(&fb, 8)
                            .and_then(|ty| self.types.named(r, ty, &[b"_asyncio.Future"]));
                        if future == Some(0) {
                            via.extend(self.woken_by(r, &fb, hops + 1));
                        }
                    }
                    via
                }
                _ => Vec::new(),
            };
            let mut tasks: Vec<u64> = Vec::new();
            for t in found {
                let is_task = plausible(t)
                    && !tasks.contains(&t)
                    && r.read(t, 16).is_some_and(|tb| self.is_task(r, &tb));
                if is_task {
                    tasks.push(t);
                }
            }
            // What a callback leads to depends on the hops left: kept from the first only.
            if hops == 0 {
                self.types.set_woken(cb, &tasks);
            }
            for t in tasks {
                if !out.contains(&t) {
                    out.push(t);
                }
            }
        }
        out
    }

    /// The attribute values of a plain object (at most `MAX_VALUES`; none when its values are
    /// in a dict of their own: its `__dict__` was asked for).
    fn values_of(&self, r: &Remote, obj: u64, values: Values) -> Vec<u64> {
        if !plausible(obj) {
            return Vec::new();
        }
        let at = match values {
            Values::Before => r.u64(obj - 32).filter(|&v| v != 0),
            Values::Tagged => r
                .u64(obj - 24)
                .filter(|v| v & 1 == 1)
                .map(|v| v.wrapping_add(1)),
            Values::Inline => r
                .u64(obj + 8)
                .and_then(|ty| r.u64(ty + TP_BASICSIZE))
                .filter(|&size| (16..4096).contains(&size))
                .and_then(|size| {
                    let head = r.read(obj + size, 8)?;
                    (head[3] != 0).then_some(obj + size + 8)
                }),
        };
        let Some(at) = at.filter(|&a| plausible(a)) else {
            return Vec::new();
        };
        r.read(at, MAX_VALUES * 8)
            .map(|b| b.chunks_exact(8).filter_map(|w| le_u64(w, 0)).collect())
            .unwrap_or_default()
    }

    /// A task's name object: a `str`, or an `int` N (a task not named yet shows `Task-N`).
    fn name(&self, r: &Remote, layout: &Layout, obj: u64) -> Option<String> {
        let head = r.read(obj, LONG_DIGITS + 8)?;
        let ty = le_u64(&head, 8)?;
        if ty == self.str_type && ty != 0 {
            let s = read_unicode(r, layout, obj, self.str_type)?;
            let clean: String = s
                .chars()
                .filter(|c| !c.is_control())
                .take(MAX_NAME)
                .collect();
            return (!clean.is_empty()).then_some(clean);
        }
        if ty == self.long_type && ty != 0 {
            let tag = le_u64(&head, LONG_TAG)?;
            let (digits, sign) = (tag >> 3, tag & 3);
            let n: u64 = match (digits, sign) {
                (_, 1) => 0,
                (1, 0) => le_u64(&head, LONG_DIGITS)? & 0x3fff_ffff,
                (2, 0) => {
                    let d = r.read(obj + LONG_DIGITS as u64, 8)?;
                    let lo = u32::from_le_bytes(d[0..4].try_into().ok()?) as u64 & 0x3fff_ffff;
                    let hi = u32::from_le_bytes(d[4..8].try_into().ok()?) as u64 & 0x3fff_ffff;
                    lo | hi << 30
                }
                _ => return None,
            };
            return Some(format!("Task-{n}"));
        }
        None
    }

    /// Bytes of a coroutine object read to parse its frame (`parse_coro`).
    fn coro_len(&self) -> usize {
        let stack = match self.stack {
            StackTop::Pointer(at) => at,
            StackTop::Index { at, .. } => at,
        };
        let frame_len = [self.frame_code, self.frame_instr, stack, self.frame_owner]
            .into_iter()
            .max()
            .unwrap_or(0)
            + 8;
        (self.gen_iframe + frame_len).max(self.gen_frame_state + 1) as usize
    }

    /// A coroutine's own frame from the start of its object `g` (at `addr`): (code object,
    /// instruction offset), with its type, its state and the stack pointer of its frame.
    fn parse_coro(&self, addr: u64, g: &[u8]) -> Option<((u64, i32), u64, u8, u64)> {
        let ty = le_u64(g, 8)?;
        let state = *g.get(self.gen_frame_state as usize)?;
        let f = g.get(self.gen_iframe as usize..)?;
        if f.get(self.frame_owner as usize) != Some(&FRAME_OWNED_BY_GENERATOR) {
            return None;
        }
        let code = le_u64(f, self.frame_code as usize)? & self.code_mask;
        let ip = le_u64(f, self.frame_instr as usize)?;
        let off = ip.checked_sub(code.checked_add(self.code_adaptive)?)?;
        if !plausible(code) || off >= 1 << 24 {
            return None;
        }
        let sp = match self.stack {
            StackTop::Pointer(at) => le_u64(f, at as usize)?,
            StackTop::Index { at, localsplus } => {
                let top = u32::from_le_bytes(f.get(at as usize..at as usize + 4)?.try_into().ok()?);
                (addr + self.gen_iframe + localsplus)
                    .checked_add(u64::from(top).min(1 << 16) * 8)?
            }
        };
        Some(((code, (off / 2) as i32), ty, state, sp))
    }

    /// A coroutine's own frame (see `parse_coro`).
    fn coro_frame(&self, r: &Remote, coro: u64) -> Option<((u64, i32), u64, u8, u64)> {
        if !plausible(coro) {
            return None;
        }
        self.parse_coro(coro, &r.read(coro, self.coro_len())?)
    }

    /// A suspended coroutine's await chain, outermost first: the coroutine, then each
    /// coroutine it awaits, down to the first awaited object that is not a coroutine (a
    /// future, a task, an `__await__` iterator).
    pub fn coro_chain(&self, r: &Remote, coro: u64) -> Vec<(u64, i32)> {
        self.coro_chains(r, &[coro]).pop().unwrap_or_default()
    }

    /// `coro_chain` of many coroutines, read a level at a time (one system call for up to
    /// `BATCH` coroutines): `all` mode reads every suspended task's chain on each pass.
    pub fn coro_chains(&self, r: &Remote, coros: &[u64]) -> Vec<Vec<(u64, i32)>> {
        let mut out = vec![Vec::new(); coros.len()];
        let mut seen: Vec<Vec<u64>> = vec![Vec::new(); coros.len()];
        let mut types: Vec<Option<u64>> = vec![None; coros.len()];
        let mut cur: Vec<(usize, u64)> = coros
            .iter()
            .copied()
            .enumerate()
            .filter(|&(_, c)| plausible(c))
            .collect();
        let len = self.coro_len();
        let below = self.await_slot * 8;
        for _ in 0..MAX_CORO_DEPTH {
            if cur.is_empty() {
                break;
            }
            let heads = read_batch(r, &cur.iter().map(|&(_, c)| (c, len)).collect::<Vec<_>>());
            let mut slots: Vec<(usize, u64)> = Vec::new();
            for (&(i, c), head) in cur.iter().zip(heads) {
                seen[i].push(c);
                let Some((frame, ty, state, sp)) = head.and_then(|h| self.parse_coro(c, &h)) else {
                    continue;
                };
                // Only what is suspended (or not started): a finished coroutine's frame is
                // gone, and a running one's stack pointer is stale.
                let suspended = state.wrapping_sub(self.created);
                if *types[i].get_or_insert(ty) != ty || suspended > self.awaiting {
                    continue;
                }
                out[i].push(frame);
                // The stack of a suspended frame lies inside its coroutine object.
                let inside = sp >= c + self.gen_iframe + below && sp <= c + (1 << 20);
                if suspended == self.awaiting && inside {
                    slots.push((i, sp - below));
                }
            }
            let next = read_batch(r, &slots.iter().map(|&(_, a)| (a, 8)).collect::<Vec<_>>());
            cur = slots
                .iter()
                .zip(next)
                .filter_map(|(&(i, _), v)| {
                    let c = le_u64(&v?, 0)? & self.code_mask;
                    (plausible(c) && !seen[i].contains(&c)).then_some((i, c))
                })
                .collect();
        }
        out
    }

    /// The tasks a thread's event loop created that still exist (its thread state's task
    /// list), each with its object's bytes; and whether the list was cut (`MAX_TASKS`, a read
    /// that failed, or a list that does not come back to its head). Empty where the tasks
    /// are not listed (3.11-3.13).
    pub fn thread_tasks(&self, r: &Remote, tstate: u64) -> (Vec<(u64, Vec<u8>)>, bool) {
        let mut out = Vec::new();
        let TaskLinks::Recorded {
            is_task,
            node: task_node,
            tstate_tasks_head,
            ..
        } = self.tasks
        else {
            return (out, false);
        };
        let head = tstate + tstate_tasks_head;
        let Some(mut node) = r.u64(head) else {
            return (out, true);
        };
        let mut seen = HashSet::new();
        while node != head {
            if out.len() >= MAX_TASKS || !seen.insert(node) {
                return (out, true);
            }
            let Some(task) = node.checked_sub(task_node).filter(|&t| plausible(t)) else {
                return (out, true);
            };
            let Some(b) = r.read(task, self.task_size as usize) else {
                return (out, true);
            };
            let Some(next) = le_u64(&b, task_node as usize) else {
                return (out, true);
            };
            if b.get(is_task as usize) == Some(&1) {
                out.push((task, b));
            }
            node = next;
        }
        (out, false)
    }

    /// 3.11-3.13 (`all`): the `WeakSet` of every task the `_asyncio` module keeps (3.11: its
    /// static `all_tasks`, found among the words of its data and bss sections; 3.12, 3.13:
    /// `scheduled_tasks` in its module state, found from `task`'s type, a task seen running).
    pub fn find_task_set(&self, r: &Remote, proc: &Process, minor: u32, task: u64) -> Option<u64> {
        let mut words: Vec<u64> = Vec::new();
        if minor == 11 {
            for m in &proc.modules {
                let file = m.path.rsplit('/').next().unwrap_or("");
                let Some(elf) = m.elf.as_ref().filter(|_| file.starts_with("_asyncio")) else {
                    continue;
                };
                for name in [".data", ".bss"] {
                    let Some((at, size)) = elf.section_range(name) else {
                        continue;
                    };
                    let at = at.wrapping_add(m.bias);
                    if let Some(b) = r.read(at, size.min(MAX_STATIC) as usize) {
                        words.extend(b.chunks_exact(8).filter_map(|w| le_u64(w, 0)));
                    }
                }
            }
        } else {
            let ty = r.u64(task + 8).filter(|&t| plausible(t))?;
            let module = r.u64(ty + HT_MODULE).filter(|&m| plausible(m))?;
            let state = r.u64(module + MD_STATE).filter(|&s| plausible(s))?;
            let b = r.read(state, STATE_WORDS * 8)?;
            words.extend(b.chunks_exact(8).filter_map(|w| le_u64(w, 0)));
        }
        words.into_iter().filter(|&w| plausible(w)).find(|&w| {
            r.u64(w + 8)
                .is_some_and(|ty| self.types.named(r, ty, &[b"WeakSet"]) == Some(0))
        })
    }

    /// 3.11-3.13 (`all`): the tasks in the `WeakSet` `set` (`find_task_set`), each with its
    /// object's bytes and its loop; and whether the list was cut (`MAX_TASKS`, or a set that
    /// did not read).
    pub fn set_tasks(&self, r: &Remote, set: u64) -> (Vec<(u64, Vec<u8>)>, bool) {
        let TaskLinks::Callbacks { values, .. } = self.tasks else {
            return (Vec::new(), true);
        };
        // `WeakSet.data` is its first attribute: a set of weak references.
        let Some(&data) = self.values_of(r, set, values).first() else {
            return (Vec::new(), true);
        };
        let is_set = plausible(data)
            && r.u64(data + 8)
                .is_some_and(|ty| self.types.named(r, ty, &[b"set"]) == Some(0));
        if !is_set {
            return (Vec::new(), true);
        }
        let refs = set_members(r, data, MAX_TASK_TABLE);
        let cut = refs.len() > MAX_TASKS;
        let refs: Vec<(u64, usize)> = refs
            .into_iter()
            .filter(|&w| plausible(w))
            .take(MAX_TASKS)
            .map(|w| (w, (WR_OBJECT + 8) as usize))
            .collect();
        let objs: Vec<(u64, usize)> = read_batch(r, &refs)
            .into_iter()
            .filter_map(|b| le_u64(&b?, WR_OBJECT as usize))
            .filter(|&t| plausible(t))
            .map(|t| (t, self.task_size as usize))
            .collect();
        let mut types: std::collections::HashMap<u64, bool> = std::collections::HashMap::new();
        let tasks = objs
            .iter()
            .zip(read_batch(r, &objs))
            .filter_map(|(&(t, _), b)| {
                let b = b?;
                let ty = le_u64(&b, 8)?;
                let task = *types
                    .entry(ty)
                    .or_insert_with(|| self.types.named(r, ty, &[b"_asyncio.Task"]) == Some(0));
                task.then_some((t, b))
            })
            .collect();
        (tasks, cut)
    }

    /// The loop of a task, from its bytes (`fut_loop`, the first field after the object
    /// header on every version).
    pub fn task_loop(b: &[u8]) -> Option<u64> {
        le_u64(b, 16)
    }

    /// Every suspended task of a thread, as `all` mode shows it: the task's await chain from
    /// the outermost task awaiting it, each task with its coroutine chain at its suspension
    /// point. `running`: the thread's running task (sampled on CPU, not here). `names`: task
    /// names kept between passes, by task and name object.
    pub fn suspended(
        &self,
        r: &Remote,
        layout: &Layout,
        tasks: &[(u64, Vec<u8>)],
        running: u64,
        names: &mut NameCache,
    ) -> Vec<AwaitChain> {
        self.types.new_read();
        let listed: std::collections::HashMap<u64, TaskObj> = tasks
            .iter()
            .filter_map(|(addr, b)| {
                Some((
                    *addr,
                    self.parse_task(r, layout, *addr, b, Some(&mut *names))?,
                ))
            })
            .collect();
        let addrs: Vec<u64> = tasks
            .iter()
            .map(|t| t.0)
            .filter(|a| listed.contains_key(a))
            .collect();
        let coros: Vec<u64> = addrs.iter().map(|a| listed[a].coro).collect();
        let frames: std::collections::HashMap<u64, Vec<(u64, i32)>> = addrs
            .iter()
            .copied()
            .zip(self.coro_chains(r, &coros))
            .collect();
        let mut out = Vec::new();
        for addr in &addrs {
            let own = &frames[addr];
            // Running now, or finished (no frames left): not suspended.
            if *addr == running || own.is_empty() {
                continue;
            }
            let (chain, cut) = self.walk_chain(
                *addr,
                listed[addr].clone(),
                |a| listed.get(&a).cloned(),
                |a, _| frames[&a].clone(),
            );
            out.push(AwaitChain {
                coro_code: own[0].0,
                tasks: chain,
                cut,
            });
        }
        names.retain(|k, _| listed.contains_key(&k.0));
        out
    }
}

/// Task names kept between passes of `all` mode, by task and name object.
pub type NameCache = std::collections::HashMap<(u64, u64), String>;

/// A user-space address an object can have.
fn plausible(a: u64) -> bool {
    super::plausible_object(a)
}

/// The members of a set (a table of at most `max_table` entries read; the dummy entries of
/// deleted keys are among them, and are not what the set holds).
fn set_members(r: &Remote, set: u64, max_table: u64) -> Vec<u64> {
    let Some(head) = r.read(set, SET_TABLE + 8) else {
        return Vec::new();
    };
    let (Some(used), Some(mask), Some(table)) = (
        le_u64(&head, SET_USED),
        le_u64(&head, SET_MASK),
        le_u64(&head, SET_TABLE),
    ) else {
        return Vec::new();
    };
    if mask >= max_table || used > mask + 1 {
        return Vec::new();
    }
    let Some(t) = r.read(table, (mask as usize + 1) * 16) else {
        return Vec::new();
    };
    t.chunks_exact(16)
        .filter_map(|e| le_u64(e, 0))
        .filter(|&k| k != 0)
        .take(used as usize)
        .collect()
}

/// Up to `max` items of a tuple (items inline) or a list (`list`: a pointer to its items).
fn var_items(r: &Remote, obj: u64, items: u64, list: bool, max: usize) -> Vec<u64> {
    let Some(n) = r.u64(obj + VAR_SIZE).filter(|&n| n <= 1 << 20) else {
        return Vec::new();
    };
    let n = (n as usize).min(max);
    let at = match list {
        true => r.u64(obj + items).filter(|&a| plausible(a)),
        false => Some(obj + items),
    };
    at.and_then(|a| r.read(a, n * 8))
        .map(|b| b.chunks_exact(8).filter_map(|w| le_u64(w, 0)).collect())
        .unwrap_or_default()
}

/// Ranges read per system call (under the kernel's `IOV_MAX` of 1024).
const BATCH: usize = 512;

/// Reads `ranges` in as few system calls as it can: `BATCH` at a time, and again from the
/// range after one that did not read (a freed object among them).
fn read_batch(r: &Remote, ranges: &[(u64, usize)]) -> Vec<Option<Vec<u8>>> {
    let mut out = Vec::with_capacity(ranges.len());
    while out.len() < ranges.len() {
        let rest = &ranges[out.len()..(out.len() + BATCH).min(ranges.len())];
        let got = r.read_many(rest);
        let whole = got.iter().take_while(|g| g.is_some()).count();
        out.extend(got.into_iter().take(whole));
        if whole < rest.len() {
            // The range that failed; the ones after it are read by the next call.
            out.push(None);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Objects laid out in this process's memory, read back through `Remote` as a target's are.
    struct Arena {
        words: Vec<Vec<u64>>,
    }

    impl Arena {
        fn obj(&mut self, words: usize) -> usize {
            self.words.push(vec![0; words]);
            self.words.len() - 1
        }
        fn addr(&self, i: usize) -> u64 {
            self.words[i].as_ptr() as u64
        }
        fn set(&mut self, i: usize, off: u64, v: u64) {
            self.words[i][off as usize / 8] = v;
        }
        fn set_byte(&mut self, i: usize, off: u64, v: u8) {
            let w = &mut self.words[i][off as usize / 8];
            let shift = (off % 8) * 8;
            *w = (*w & !(0xff << shift)) | ((v as u64) << shift);
        }
    }

    /// 3.14's task offsets (Debian's 3.14.10) that only `TaskLinks::Recorded` has.
    const AWAITED_BY: u64 = 96;
    const IS_TASK: u64 = 108;
    const IS_SET: u64 = 109;
    const NODE: u64 = 152;
    const TASKS_HEAD: u64 = 880;

    /// 3.14's offsets (Debian's 3.14.10), with type addresses this test makes up.
    fn layout_314() -> AsyncLayout {
        AsyncLayout {
            task_size: 168,
            task_name: 136,
            task_coro: 128,
            tasks: TaskLinks::Recorded {
                is_task: IS_TASK,
                awaited_by: AWAITED_BY,
                awaited_by_is_set: IS_SET,
                node: NODE,
                tstate_running_task: 872,
                tstate_tasks_head: TASKS_HEAD,
            },
            gen_iframe: 72,
            gen_frame_state: 67,
            frame_code: 0,
            frame_instr: 56,
            frame_owner: 74,
            stack: StackTop::Pointer(64),
            code_mask: !3,
            code_adaptive: 208,
            created: 0xfd,
            awaiting: 2,
            await_slot: 1,
            str_type: 0,
            long_type: 0x5000,
            types: TypeCache::default(),
        }
    }

    /// A coroutine object of `coro_type` running `code` at instruction `instr`.
    fn coro(a: &mut Arena, l: &AsyncLayout, coro_type: u64, code: u64, instr: u64) -> usize {
        let c = a.obj(40);
        a.set(c, 8, coro_type);
        a.set(c, l.gen_iframe + l.frame_code, code);
        a.set(
            c,
            l.gen_iframe + l.frame_instr,
            code + l.code_adaptive + 2 * instr,
        );
        a.set_byte(c, l.gen_iframe + l.frame_owner, FRAME_OWNED_BY_GENERATOR);
        a.set_byte(c, l.gen_frame_state, l.created.wrapping_add(1)); // suspended
        c
    }

    /// A task named by the int `number`, running `coro`, awaited by `parent` (0: none).
    fn task(a: &mut Arena, l: &AsyncLayout, number: u64, coro: u64, parent: u64) -> usize {
        let name = a.obj(4);
        a.set(name, 8, l.long_type);
        a.set(name, LONG_TAG as u64, 1 << 3);
        a.set(name, LONG_DIGITS as u64, number);
        let name = a.addr(name);
        let t = a.obj(l.task_size as usize / 8);
        a.set_byte(t, IS_TASK, 1);
        a.set(t, l.task_coro, coro);
        a.set(t, l.task_name, name);
        a.set(t, AWAITED_BY, parent);
        t
    }

    /// 3.14's layout, an arena, a code object and a suspended coroutine running it at `instr`.
    fn fixture(instr: u64) -> (AsyncLayout, Arena, u64, u64) {
        let l = layout_314();
        let mut a = Arena { words: Vec::new() };
        let code = a.obj(64);
        let code = a.addr(code);
        let c = coro(&mut a, &l, 0x7000, code, instr);
        let c = a.addr(c);
        (l, a, code, c)
    }

    fn me() -> Remote {
        Remote {
            pid: std::process::id(),
        }
    }

    fn any_layout() -> Layout {
        super::super::layout::builtin(14).unwrap()
    }

    #[test]
    fn chain_names_tasks_and_ends_at_the_outermost() {
        let l = layout_314();
        let mut a = Arena { words: Vec::new() };
        let code = a.obj(64);
        let code = a.addr(code);
        let c1 = coro(&mut a, &l, 0x7000, code, 3);
        let c2 = coro(&mut a, &l, 0x7000, code, 5);
        let (c1, c2) = (a.addr(c1), a.addr(c2));
        let outer = task(&mut a, &l, 1, c1, 0);
        let outer = a.addr(outer);
        let inner = task(&mut a, &l, 7, c2, outer);
        let inner = a.addr(inner);
        let chain = l.await_chain(&me(), &any_layout(), inner).unwrap();
        assert_eq!(chain.coro_code, code);
        assert!(!chain.cut);
        let names: Vec<&str> = chain.tasks.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["Task-7", "Task-1"]);
        // The running task's frames are the sample's; the one awaiting it is at its await.
        assert!(chain.tasks[0].frames.is_empty());
        assert_eq!(chain.tasks[1].frames, [(code, 3)]);
    }

    #[test]
    fn cycles_and_long_chains_are_cut_and_said() {
        let (l, mut a, _, c) = fixture(0);
        // Two tasks awaiting each other.
        let x = task(&mut a, &l, 1, c, 0);
        let xa = a.addr(x);
        let y = task(&mut a, &l, 2, c, xa);
        let ya = a.addr(y);
        a.set(x, AWAITED_BY, ya);
        let chain = l.await_chain(&me(), &any_layout(), xa).unwrap();
        assert!(chain.cut);
        assert_eq!(chain.tasks.len(), 2);
        // A chain longer than the bound.
        let mut parent = 0;
        for n in 0..(MAX_TASK_DEPTH as u64 + 20) {
            let t = task(&mut a, &l, n, c, parent);
            parent = a.addr(t);
        }
        let chain = l.await_chain(&me(), &any_layout(), parent).unwrap();
        assert!(chain.cut);
        assert_eq!(chain.tasks.len(), MAX_TASK_DEPTH);
    }

    #[test]
    fn what_is_not_a_task_or_coroutine_is_not_believed() {
        let (l, mut a, code, c) = fixture(0);
        let t = task(&mut a, &l, 1, c, 0);
        a.set_byte(t, IS_TASK, 0);
        assert!(l.await_chain(&me(), &any_layout(), a.addr(t)).is_none());
        // Unaligned, null and unmapped addresses.
        for bad in [0, 1, 0x10, a.addr(t) + 4, 0x7fff_ffff_f000] {
            assert!(l.await_chain(&me(), &any_layout(), bad).is_none());
        }
        // A coroutine whose frame another owner holds.
        let ci = coro(&mut a, &l, 0x7000, code, 0);
        a.set_byte(ci, l.gen_iframe + l.frame_owner, 0);
        let ca = a.addr(ci);
        let t = task(&mut a, &l, 1, ca, 0);
        assert!(l.await_chain(&me(), &any_layout(), a.addr(t)).is_none());
    }

    #[test]
    fn await_chains_follow_coroutines_only_and_stop_at_cycles() {
        let l = layout_314();
        let mut a = Arena { words: Vec::new() };
        let code = a.obj(64);
        let code = a.addr(code);
        let outer = coro(&mut a, &l, 0x7000, code, 1);
        let inner = coro(&mut a, &l, 0x7000, code, 2);
        let future = coro(&mut a, &l, 0x9000, code, 9); // another type: not followed
        let (oa, ia, fa) = (a.addr(outer), a.addr(inner), a.addr(future));
        // outer awaits inner (its stack's top word, just under the stack pointer), inner awaits
        // something else.
        for (c, ca, next) in [(outer, oa, ia), (inner, ia, fa)] {
            a.set_byte(c, l.gen_frame_state, l.created + 2);
            a.set(c, 200, next);
            a.set(c, l.gen_iframe + 64, ca + 208);
        }
        assert_eq!(l.coro_chain(&me(), oa), [(code, 1), (code, 2)]);
        // inner awaits outer: a cycle ends the walk.
        a.set(inner, 200, oa);
        assert_eq!(l.coro_chain(&me(), oa), [(code, 1), (code, 2)]);
        // A stack pointer outside the coroutine is not followed.
        a.set(inner, 200, fa);
        a.set(outer, l.gen_iframe + 64, 0x10);
        assert_eq!(l.coro_chain(&me(), oa), [(code, 1)]);
    }

    #[test]
    fn awaited_by_sets_pick_the_lowest_task_and_count_parents() {
        let (l, mut a, _, c) = fixture(0);
        let p1 = task(&mut a, &l, 1, c, 0);
        let p2 = task(&mut a, &l, 2, c, 0);
        let (p1a, p2a) = (a.addr(p1), a.addr(p2));
        let table = a.obj(16);
        a.set(table, 16, p2a);
        a.set(table, 48, p1a);
        a.set(table, 80, 0x5_0000); // a removed entry's dummy: not a task
        let set = a.obj(8);
        let ta = a.addr(table);
        a.set(set, SET_USED as u64, 3);
        a.set(set, SET_MASK as u64, 7);
        a.set(set, SET_TABLE as u64, ta);
        let sa = a.addr(set);
        let child = task(&mut a, &l, 3, c, sa);
        a.set_byte(child, IS_SET, 1);
        let chain = l.await_chain(&me(), &any_layout(), a.addr(child)).unwrap();
        assert_eq!(chain.tasks[0].name, "Task-3 (2 parents)");
        let lowest = if p1a < p2a { "Task-1" } else { "Task-2" };
        assert_eq!(chain.tasks[1].name, lowest);
        assert!(!chain.cut);
    }

    #[test]
    fn task_lists_end_at_their_head_and_never_loop() {
        let (l, mut a, code, c) = fixture(4);
        let tstate = a.obj(TASKS_HEAD as usize / 8 + 2);
        let head = a.addr(tstate) + TASKS_HEAD;
        let t: Vec<usize> = (1..=3).map(|n| task(&mut a, &l, n, c, 0)).collect();
        let node = |a: &Arena, i: usize| a.addr(t[i]) + NODE;
        // head -> t0 -> t1 -> t2 -> head
        let (n0, n1, n2) = (node(&a, 0), node(&a, 1), node(&a, 2));
        a.set(tstate, TASKS_HEAD, n0);
        a.set(t[0], NODE, n1);
        a.set(t[1], NODE, n2);
        a.set(t[2], NODE, head);
        let (tasks, cut) = l.thread_tasks(&me(), a.addr(tstate));
        assert!(!cut);
        assert_eq!(tasks.len(), 3);
        let mut names = NameCache::new();
        let chains = l.suspended(&me(), &any_layout(), &tasks, a.addr(t[1]), &mut names);
        // The running task is not among the suspended ones.
        let shown: Vec<&str> = chains.iter().map(|c| c.tasks[0].name.as_str()).collect();
        assert_eq!(shown, ["Task-1", "Task-3"]);
        assert_eq!(chains[0].tasks[0].frames, [(code, 4)]);
        // A list that loops without coming back to its head is cut, not walked forever.
        a.set(t[2], NODE, n1);
        let (tasks, cut) = l.thread_tasks(&me(), a.addr(tstate));
        assert!(cut);
        assert_eq!(tasks.len(), 3);
    }

    /// 3.11-3.13: tasks told by their type's name, awaiters found from done callbacks.
    mod callbacks {
        use super::*;

        const LONG_TYPE: u64 = 0x5000;

        /// A C string in the arena.
        fn cstr(a: &mut Arena, s: &str) -> u64 {
            let mut b = s.as_bytes().to_vec();
            b.resize(b.len() / 8 * 8 + 8, 0);
            let o = a.obj(b.len() / 8);
            for (k, w) in b.chunks_exact(8).enumerate() {
                a.set(o, k as u64 * 8, u64::from_le_bytes(w.try_into().unwrap()));
            }
            a.addr(o)
        }

        /// A type object named `name`, derived from `base` (0: none).
        fn ty(a: &mut Arena, name: &str, base: u64) -> u64 {
            let n = cstr(a, name);
            let t = a.obj(40);
            a.set(t, TP_NAME, n);
            a.set(t, TP_BASICSIZE, 16);
            a.set(t, TP_BASE, base);
            a.addr(t)
        }

        /// An object of type `t` with `words` words.
        fn object(a: &mut Arena, t: u64, words: usize) -> usize {
            let o = a.obj(words);
            a.set(o, 8, t);
            o
        }

        struct World {
            l: AsyncLayout,
            a: Arena,
            task_type: u64,
            future_type: u64,
            code: u64,
        }

        fn world(minor: u32) -> World {
            let layout = super::super::super::layout::builtin(minor).unwrap();
            let l = AsyncLayout::legacy(&layout, 0, LONG_TYPE).unwrap();
            let mut a = Arena { words: Vec::new() };
            let future_type = ty(&mut a, "_asyncio.Future", 0);
            let task_type = ty(&mut a, "_asyncio.Task", future_type);
            let code = a.obj(64);
            let code = a.addr(code);
            World {
                l,
                a,
                task_type,
                future_type,
                code,
            }
        }

        impl World {
            /// A task of type `t` named by the int `number`, whose coroutine runs `instr`.
            fn task_of(&mut self, t: u64, number: u64, instr: u64) -> u64 {
                let c = coro(&mut self.a, &self.l, 0x7000, self.code, instr);
                let c = self.a.addr(c);
                let name = object(&mut self.a, LONG_TYPE, 4);
                self.a.set(name, LONG_TAG as u64, 1 << 3);
                self.a.set(name, LONG_DIGITS as u64, number);
                let name = self.a.addr(name);
                let task = object(&mut self.a, t, self.l.task_size as usize / 8);
                self.a.set(task, self.l.task_coro, c);
                self.a.set(task, self.l.task_name, name);
                self.a.addr(task)
            }
            fn task(&mut self, number: u64, instr: u64) -> u64 {
                self.task_of(self.task_type, number, instr)
            }
            /// A future of type `t` (a task or not).
            fn future(&mut self, t: u64) -> u64 {
                let f = object(&mut self.a, t, self.l.task_size as usize / 8);
                self.a.addr(f)
            }
            /// Sets the done callback of `fut` to `cb`: the first in `callback0`, the others
            /// in its list of (callback, context) tuples.
            fn add_callback(&mut self, fut: u64, cb: u64, first: bool) {
                let i = self.index(fut);
                if first {
                    self.a.set(i, 24, cb);
                    return;
                }
                let tuple_type = ty(&mut self.a, "tuple", 0);
                let t = object(&mut self.a, tuple_type, 5);
                self.a.set(t, VAR_SIZE, 2);
                self.a.set(t, TUPLE_ITEMS, cb);
                let t = self.a.addr(t);
                let items = self.a.obj(1);
                self.a.set(items, 0, t);
                let items = self.a.addr(items);
                let list_type = ty(&mut self.a, "list", 0);
                let list = object(&mut self.a, list_type, 5);
                self.a.set(list, VAR_SIZE, 1);
                self.a.set(list, LIST_ITEMS, items);
                let list = self.a.addr(list);
                self.a.set(i, 40, list);
            }
            fn index(&self, addr: u64) -> usize {
                (0..self.a.words.len())
                    .find(|&k| self.a.addr(k) == addr)
                    .unwrap()
            }
            /// An object of a new type named `type_name`, of `words` words, holding `value` at
            /// `field`.
            fn holding(&mut self, type_name: &str, words: usize, field: u64, value: u64) -> u64 {
                let t = ty(&mut self.a, type_name, 0);
                let o = object(&mut self.a, t, words);
                self.a.set(o, field, value);
                self.a.addr(o)
            }
            /// A function whose closure's cells hold `values`.
            fn closure_over(&mut self, values: &[u64]) -> u64 {
                let tuple_type = ty(&mut self.a, "tuple", 0);
                let closure = object(&mut self.a, tuple_type, 3 + values.len());
                self.a.set(closure, VAR_SIZE, values.len() as u64);
                for (k, &v) in values.iter().enumerate() {
                    let cell = self.holding("cell", 3, CELL_REF, v);
                    self.a.set(closure, TUPLE_ITEMS + 8 * k as u64, cell);
                }
                let closure = self.a.addr(closure);
                self.holding("function", 12, FUNC_CLOSURE, closure)
            }
            /// A task's wakeup: a built-in method bound to `task`.
            fn wakeup(&mut self, task: u64) -> u64 {
                self.holding("builtin_function_or_method", 6, CFUNC_SELF, task)
            }
            fn names(&self, task: u64) -> (Vec<String>, bool) {
                let chain = self.l.await_chain(&me(), &any_layout(), task).unwrap();
                let names = chain.tasks.iter().map(|t| t.name.clone()).collect();
                (names, chain.cut)
            }
        }

        #[test]
        fn awaiting_tasks_are_found_from_their_wakeups() {
            for minor in [11, 12, 13] {
                let mut w = world(minor);
                let outer = w.task(1, 3);
                let inner = w.task(7, 5);
                let wake = w.wakeup(outer);
                w.add_callback(inner, wake, true);
                assert_eq!(
                    w.names(inner),
                    (vec!["Task-7".into(), "Task-1".into()], false)
                );
                // The task awaiting it is shown at its await.
                let chain = w.l.await_chain(&me(), &any_layout(), inner).unwrap();
                assert_eq!(chain.tasks[1].frames, [(w.code, 3)]);
                // Listed after other callbacks too.
                let other = w.task(8, 5);
                let stranger = w.wakeup(w.code); // bound to something that is no task
                w.add_callback(other, stranger, true);
                w.add_callback(other, wake, false);
                assert_eq!(w.names(other).0, ["Task-8", "Task-1"], "3.{minor}");
            }
        }

        #[test]
        fn gather_and_task_groups_lead_to_the_task_they_wake() {
            for minor in [11, 12, 13] {
                let mut w = world(minor);
                let parent = w.task(1, 3);
                // gather: the child's callback is a closure over the outer future, whose
                // completion wakes the parent.
                let gathering = ty(&mut w.a, "_GatheringFuture", w.future_type);
                let outer = w.future(gathering);
                let wake = w.wakeup(parent);
                w.add_callback(outer, wake, true);
                let list_type = ty(&mut w.a, "list", 0);
                let not_future = object(&mut w.a, list_type, 5);
                let not_future = w.a.addr(not_future);
                let f = w.closure_over(&[not_future, outer]);
                let child = w.task(2, 5);
                w.add_callback(child, f, true);
                assert_eq!(w.names(child).0, ["Task-2", "Task-1"], "3.{minor}");

                // TaskGroup: a bound method of the group, which holds its parent task among
                // its attributes (the fifth, `_parent_task`).
                let group_type = ty(&mut w.a, "TaskGroup", 0);
                let g = w.a.obj(16);
                let base = w.a.addr(g);
                let (group, valid_at) = match minor {
                    11 | 12 => {
                        // A pointer to the values before the object (3.12: minus one).
                        let values = w.a.obj(MAX_VALUES);
                        w.a.set(values, 8 * 4, parent);
                        let at = w.a.addr(values);
                        match minor {
                            11 => w.a.set(g, 0, at),
                            _ => w.a.set(g, 8, at - 1),
                        }
                        w.a.set(g, 32 + 8, group_type);
                        (base + 32, None)
                    }
                    _ => {
                        // Inline after the object's `tp_basicsize` (16), behind a word whose
                        // fourth byte says they are valid.
                        w.a.set(g, 8, group_type);
                        w.a.set(g, 16, 1 << 24);
                        w.a.set(g, 24 + 8 * 4, parent);
                        (base, Some(16))
                    }
                };
                let m = w.holding("method", 5, METHOD_SELF, group);
                let member = w.task(3, 5);
                w.add_callback(member, m, true);
                assert_eq!(w.names(member).0, ["Task-3", "Task-1"], "3.{minor}");
                if let Some(at) = valid_at {
                    // Values no longer valid (moved to a dict): no parent found.
                    w.a.set(g, at, 0);
                    assert_eq!(w.names(member).0, ["Task-3"], "3.{minor}");
                }
            }
        }

        #[test]
        fn only_tasks_are_believed_and_future_hops_are_bounded() {
            let mut w = world(12);
            // A subclass of Task is a task; a future is not; garbage is not.
            let sub = ty(&mut w.a, "MyTask", w.task_type);
            let t = w.task_of(sub, 4, 1);
            assert_eq!(w.names(t).0, ["Task-4"]);
            let f = w.future(w.future_type);
            assert!(w.l.await_chain(&me(), &any_layout(), f).is_none());
            assert!(w.l.await_chain(&me(), &any_layout(), 0x10).is_none());
            assert!(w.l.task_key(&me(), 0x12345).is_none());
            // A closure over a future whose callback is the same closure: followed
            // `MAX_FUTURE_HOPS` times, then given up.
            let fut = w.future(w.future_type);
            let func = w.closure_over(&[fut]);
            w.add_callback(fut, func, true);
            let looping = w.task(5, 1);
            w.add_callback(looping, func, true);
            assert_eq!(w.names(looping).0, ["Task-5"]);
            // A key changes with the callbacks.
            let before = w.l.task_key(&me(), looping).unwrap();
            let wake = w.wakeup(t);
            w.add_callback(looping, wake, false);
            let with_list = w.l.task_key(&me(), looping).unwrap();
            assert_ne!(with_list, before);
            // A second awaiter appended to the same list: the list does not move, the key
            // changes all the same.
            let list = w.index(w.a.words[w.index(looping)][40 / 8]);
            w.a.set(list, VAR_SIZE, 2);
            assert_ne!(w.l.task_key(&me(), looping).unwrap(), with_list);
        }

        #[test]
        fn suspended_coroutine_chains_follow_the_stack_top() {
            for minor in [11, 12, 13] {
                let mut w = world(minor);
                let l = w.l.clone();
                let inner = coro(&mut w.a, &l, 0x7000, w.code, 9);
                let inner = w.a.addr(inner);
                let outer = coro(&mut w.a, &l, 0x7000, w.code, 2);
                // Suspended in an await: the awaited coroutine on top of the frame's stack.
                w.a.set_byte(outer, l.gen_frame_state, l.created.wrapping_add(l.awaiting));
                let (StackTop::Index { at, localsplus }, 0) = (l.stack, 0) else {
                    panic!("3.{minor} keeps a stack index");
                };
                // `stacktop` is an i32 sharing its word with the owner byte.
                w.a.set_byte(outer, l.gen_iframe + at, 2);
                w.a.set(outer, l.gen_iframe + localsplus + 8, inner);
                let outer = w.a.addr(outer);
                assert_eq!(
                    l.coro_chain(&me(), outer),
                    [(w.code, 2), (w.code, 9)],
                    "3.{minor}"
                );
                // A stack index past the coroutine is not followed.
                let i = w.index(outer);
                w.a.set_byte(i, l.gen_iframe + at + 2, 0x10);
                assert_eq!(l.coro_chain(&me(), outer), [(w.code, 2)], "3.{minor}");
            }
        }
    }
}
