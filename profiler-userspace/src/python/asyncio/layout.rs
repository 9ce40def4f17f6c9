//! Finding asyncio's layout in a process: `.AsyncioDebug` (3.14+) or the tables of 3.11-3.13,
//! checked for sanity; and the cache of type objects 3.11-3.13 tell asyncio's objects by.

use super::*;

/// The name and base of each type object read (3.11-3.13 tell asyncio's objects by their
/// types' names): a type lives as long as objects of it, and the same few are met again and
/// again. Shared by the copies of a layout; not part of what a layout is.
#[derive(Clone, Debug, Default)]
pub(super) struct TypeCache(std::sync::Arc<std::sync::Mutex<Caches>>);

#[derive(Debug, Default)]
pub(super) struct Caches {
    types: HashMap<u64, TypeEntry>,
    /// The tasks each done callback leads to, by the callback's address, for one pass or
    /// chain read (`TypeCache::new_read`): a `gather` adds one callback to all its children.
    woken: HashMap<u64, Vec<u64>>,
}

/// A type's name (its first `TYPE_NAME_LEN` bytes) and its base type's address.
pub(super) type TypeEntry = (Vec<u8>, u64);

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
    pub(super) fn new_read(&self) {
        if let Ok(mut c) = self.0.lock() {
            c.woken.clear();
        }
    }

    pub(super) fn woken(&self, cb: u64) -> Option<Vec<u64>> {
        self.0.lock().ok()?.woken.get(&cb).cloned()
    }

    pub(super) fn set_woken(&self, cb: u64, tasks: &[u64]) {
        if let Ok(mut c) = self.0.lock() {
            c.woken.insert(cb, tasks.to_vec());
        }
    }

    /// Which of `names` type `ty` is named, or derives from a type so named (3.11-3.13's
    /// asyncio types have no flag to tell them by; a subclass of `Task` derives from it).
    pub(super) fn named(&self, r: &Remote, mut ty: u64, names: &[&[u8]]) -> Option<usize> {
        for _ in 0..MAX_BASES {
            if !plausible(ty) {
                return None;
            }
            let known = self.0.lock().ok()?.types.get(&ty).cloned();
            let (name, base) = match known {
                Some(k) => k,
                None => {
                    let name = r
                        .u64(ty + TYPE.name)
                        .and_then(|p| r.read(p, TYPE_NAME_LEN))
                        .unwrap_or_default();
                    let base = r.u64(ty + TYPE.base)?;
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

/// The words of `.AsyncioDebug` (`_Py_AsyncioModuleDebugOffsets`, 3.14 and 3.15): the task
/// object's size, name, awaited_by, is_task, awaited_by_is_set, coro and node; the interpreter
/// state's size and task list; the thread state's size, running loop, running task and list.
pub(super) const SECTION_WORDS: usize = 13;

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
    pub(super) fn sane(&self, tstate_size: u64) -> bool {
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
}
