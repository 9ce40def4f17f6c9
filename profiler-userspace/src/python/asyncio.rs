//! asyncio's tasks, read from outside (`--async-aware`): the task a thread's event loop runs,
//! the tasks that await it, and each one's name and coroutine chain.
//!
//! 3.14+ only. Its `_asyncio` module publishes the layout of its tasks and where the thread
//! state keeps the running one in an `.AsyncioDebug` section, for remote readers, as
//! `_Py_DebugOffsets` does for the interpreter; the generator and frame fields a coroutine
//! chain needs come from `_Py_DebugOffsets` (`Layout::gen_iframe` and the rest). Earlier
//! versions keep no per-thread running task, and their tasks do not record who awaits them.
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

use std::collections::HashSet;

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
/// `PySetObject`'s `used`, `mask` and `table` (3.14, 3.15); a table entry is a key and a hash.
const SET_USED: usize = 24;
const SET_MASK: usize = 32;
const SET_TABLE: usize = 40;
/// `PyLongObject`'s `lv_tag` and first 30-bit digit (3.12+).
const LONG_TAG: usize = 16;
const LONG_DIGITS: usize = 24;

/// Where asyncio keeps what async-aware stacks read, in one process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AsyncLayout {
    task_size: u64,
    task_name: u64,
    task_awaited_by: u64,
    task_is_task: u64,
    task_awaited_by_is_set: u64,
    task_coro: u64,
    task_node: u64,
    /// Offset in the thread state of the task its event loop runs (`asyncio_running_task`).
    pub tstate_running_task: u64,
    /// Offset in the thread state of the list of its loop's tasks (`asyncio_tasks_head`).
    tstate_tasks_head: u64,
    gen_iframe: u64,
    gen_frame_state: u64,
    frame_code: u64,
    frame_instr: u64,
    frame_owner: u64,
    frame_stackpointer: u64,
    code_mask: u64,
    code_adaptive: u64,
    /// The state byte of a coroutine not started yet (`FRAME_CREATED`); the two after it are
    /// `FRAME_SUSPENDED` and, suspended in an `await`, `FRAME_SUSPENDED_YIELD_FROM`.
    created: u8,
    /// Words below a suspended frame's stack pointer where the object it awaits is.
    await_slot: u64,
    str_type: u64,
    long_type: u64,
}

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
                task_awaited_by: w(2),
                task_is_task: w(3),
                task_awaited_by_is_set: w(4),
                task_coro: w(5),
                task_node: w(6),
                tstate_running_task: w(11),
                tstate_tasks_head: w(12),
                gen_iframe,
                gen_frame_state,
                frame_code: layout.frame_code as u64,
                frame_instr: layout.frame_instr as u64,
                frame_owner: layout.frame_owner as u64,
                frame_stackpointer,
                code_mask: layout.code_mask,
                code_adaptive: layout.code_adaptive as u64,
                created,
                await_slot,
                str_type,
                long_type,
            };
            return l.sane(w(9)).then_some(l);
        }
        None
    }

    /// Whether the offsets fit the objects they are in (`tstate_size`: the thread state's).
    fn sane(&self, tstate_size: u64) -> bool {
        let in_task =
            |off: u64, len: u64| off.checked_add(len).is_some_and(|e| e <= self.task_size);
        let frame_end = [self.frame_code, self.frame_instr, self.frame_stackpointer]
            .into_iter()
            .max()
            .unwrap_or(0)
            .max(self.frame_owner)
            + 8;
        (32..=4096).contains(&self.task_size)
            && in_task(self.task_name, 8)
            && in_task(self.task_awaited_by, 8)
            && in_task(self.task_coro, 8)
            && in_task(self.task_is_task, 1)
            && in_task(self.task_awaited_by_is_set, 1)
            && in_task(self.task_node, 16)
            && self.tstate_tasks_head + 16 <= tstate_size
            && tstate_size <= 1 << 16
            && self.tstate_running_task + 8 <= tstate_size
            && self.gen_frame_state < 4096
            && self.gen_iframe < 4096
            && frame_end < 4096
            && self.tstate_running_task <= u32::MAX as u64
    }

    /// The running task `running` (as the sample copied it) and the tasks awaiting it. `None`
    /// when it does not read as a task with a coroutine.
    pub fn await_chain(&self, r: &Remote, layout: &Layout, running: u64) -> Option<AwaitChain> {
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
    /// awaited-by words (`None` when it does not read as a task). A chain read before is still
    /// the task's while these are the same: the tasks awaiting it stay suspended where they
    /// were while it runs.
    pub fn task_key(&self, r: &Remote, addr: u64) -> Option<[u64; 3]> {
        if addr & 7 != 0 || addr < 0x10000 || addr >> 47 != 0 {
            return None;
        }
        let b = r.read(addr, self.task_size as usize)?;
        if b.get(self.task_is_task as usize) != Some(&1) {
            return None;
        }
        let word = |off: u64| le_u64(&b, off as usize);
        Some([
            word(self.task_coro)?,
            word(self.task_name)?,
            word(self.task_awaited_by)?,
        ])
    }

    /// Reads a task object: `None` for anything that does not say it is a task.
    fn task(&self, r: &Remote, layout: &Layout, addr: u64) -> Option<TaskObj> {
        if !plausible(addr) {
            return None;
        }
        let b = r.read(addr, self.task_size as usize)?;
        self.parse_task(r, layout, addr, &b, None)
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
        if b.get(self.task_is_task as usize) != Some(&1) {
            return None;
        }
        let word = |off: u64| le_u64(b, off as usize).map(|v| v & self.code_mask);
        let coro = word(self.task_coro).filter(|&c| c != 0)?;
        let awaited_by = word(self.task_awaited_by).unwrap_or(0);
        let parents = match (awaited_by, b.get(self.task_awaited_by_is_set as usize)) {
            (0, _) => Vec::new(),
            (set, Some(&1)) => self.set_members(r, set),
            (one, _) => vec![one],
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

    /// The members of an awaited-by set (bounded; the dummy entries of deleted keys are
    /// among them, and are not tasks).
    fn set_members(&self, r: &Remote, set: u64) -> Vec<u64> {
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
        if mask >= MAX_SET_TABLE || used > mask + 1 {
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

    /// Bytes of a coroutine object read to parse its frame (`parse_coro`).
    fn coro_len(&self) -> usize {
        let frame_len = [
            self.frame_code,
            self.frame_instr,
            self.frame_stackpointer,
            self.frame_owner,
        ]
        .into_iter()
        .max()
        .unwrap_or(0)
            + 8;
        (self.gen_iframe + frame_len).max(self.gen_frame_state + 1) as usize
    }

    /// A coroutine's own frame from the start of its object: (code object, instruction
    /// offset), with its type, its state and the stack pointer of its frame.
    fn parse_coro(&self, g: &[u8]) -> Option<((u64, i32), u64, u8, u64)> {
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
        let sp = le_u64(f, self.frame_stackpointer as usize)?;
        Some(((code, (off / 2) as i32), ty, state, sp))
    }

    /// A coroutine's own frame (see `parse_coro`).
    fn coro_frame(&self, r: &Remote, coro: u64) -> Option<((u64, i32), u64, u8, u64)> {
        if !plausible(coro) {
            return None;
        }
        self.parse_coro(&r.read(coro, self.coro_len())?)
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
                let Some((frame, ty, state, sp)) = head.and_then(|h| self.parse_coro(&h)) else {
                    continue;
                };
                // Only what is suspended (or not started): a finished coroutine's frame is
                // gone, and a running one's stack pointer is stale.
                let suspended = state.wrapping_sub(self.created);
                if *types[i].get_or_insert(ty) != ty || suspended > 2 {
                    continue;
                }
                out[i].push(frame);
                // The stack of a suspended frame lies inside its coroutine object.
                if suspended == 2 && sp >= c + self.gen_iframe + below && sp <= c + (1 << 20) {
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
    /// that failed, or a list that does not come back to its head).
    pub fn thread_tasks(&self, r: &Remote, tstate: u64) -> (Vec<(u64, Vec<u8>)>, bool) {
        let head = tstate + self.tstate_tasks_head;
        let mut out = Vec::new();
        let Some(mut node) = r.u64(head) else {
            return (out, true);
        };
        let mut seen = HashSet::new();
        while node != head {
            if out.len() >= MAX_TASKS || !seen.insert(node) {
                return (out, true);
            }
            let Some(task) = node.checked_sub(self.task_node).filter(|&t| plausible(t)) else {
                return (out, true);
            };
            let Some(b) = r.read(task, self.task_size as usize) else {
                return (out, true);
            };
            let Some(next) = le_u64(&b, (self.task_node) as usize) else {
                return (out, true);
            };
            if b.get(self.task_is_task as usize) == Some(&1) {
                out.push((task, b));
            }
            node = next;
        }
        (out, false)
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
    a & 7 == 0 && a >= 0x10000 && a >> 47 == 0
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

    /// 3.14's offsets (Debian's 3.14.10), with type addresses this test makes up.
    fn layout_314() -> AsyncLayout {
        AsyncLayout {
            task_size: 168,
            task_name: 136,
            task_awaited_by: 96,
            task_is_task: 108,
            task_awaited_by_is_set: 109,
            task_coro: 128,
            task_node: 152,
            tstate_running_task: 872,
            tstate_tasks_head: 880,
            gen_iframe: 72,
            gen_frame_state: 67,
            frame_code: 0,
            frame_instr: 56,
            frame_owner: 74,
            frame_stackpointer: 64,
            code_mask: !3,
            code_adaptive: 208,
            created: 0xfd,
            await_slot: 1,
            str_type: 0,
            long_type: 0x5000,
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
        a.set_byte(t, l.task_is_task, 1);
        a.set(t, l.task_coro, coro);
        a.set(t, l.task_name, name);
        a.set(t, l.task_awaited_by, parent);
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
        a.set(x, l.task_awaited_by, ya);
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
        a.set_byte(t, l.task_is_task, 0);
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
            a.set(c, l.gen_iframe + l.frame_stackpointer, ca + 208);
        }
        assert_eq!(l.coro_chain(&me(), oa), [(code, 1), (code, 2)]);
        // inner awaits outer: a cycle ends the walk.
        a.set(inner, 200, oa);
        assert_eq!(l.coro_chain(&me(), oa), [(code, 1), (code, 2)]);
        // A stack pointer outside the coroutine is not followed.
        a.set(inner, 200, fa);
        a.set(outer, l.gen_iframe + l.frame_stackpointer, 0x10);
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
        a.set_byte(child, l.task_awaited_by_is_set, 1);
        let chain = l.await_chain(&me(), &any_layout(), a.addr(child)).unwrap();
        assert_eq!(chain.tasks[0].name, "Task-3 (2 parents)");
        let lowest = if p1a < p2a { "Task-1" } else { "Task-2" };
        assert_eq!(chain.tasks[1].name, lowest);
        assert!(!chain.cut);
    }

    #[test]
    fn task_lists_end_at_their_head_and_never_loop() {
        let (l, mut a, code, c) = fixture(4);
        let tstate = a.obj(l.tstate_tasks_head as usize / 8 + 2);
        let head = a.addr(tstate) + l.tstate_tasks_head;
        let t: Vec<usize> = (1..=3).map(|n| task(&mut a, &l, n, c, 0)).collect();
        let node = |a: &Arena, i: usize| a.addr(t[i]) + l.task_node;
        // head -> t0 -> t1 -> t2 -> head
        let (n0, n1, n2) = (node(&a, 0), node(&a, 1), node(&a, 2));
        a.set(tstate, l.tstate_tasks_head, n0);
        a.set(t[0], l.task_node, n1);
        a.set(t[1], l.task_node, n2);
        a.set(t[2], l.task_node, head);
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
        a.set(t[2], l.task_node, n1);
        let (tasks, cut) = l.thread_tasks(&me(), a.addr(tstate));
        assert!(cut);
        assert_eq!(tasks.len(), 3);
    }
}
