//! The await chain of a running task: the tasks awaiting it out to the outermost, each task's
//! name and its coroutine chain at its suspension point.

use super::*;

impl AsyncLayout {
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
    pub(super) fn walk_chain(
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
                    l => r.u64(l.wrapping_add(VAR.size)).unwrap_or(0),
                };
                word(callback0)? ^ list.rotate_left(32) ^ len.rotate_left(48)
            }
        };
        Some([word(self.task_coro)?, word(self.task_name)?, links])
    }

    /// Reads a task object: `None` for anything that does not say it is a task.
    pub(super) fn task(&self, r: &Remote, layout: &Layout, addr: u64) -> Option<TaskObj> {
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
    pub(super) fn is_task(&self, r: &Remote, b: &[u8]) -> bool {
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
    pub(super) fn parse_task(
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

    /// A task's name object: a `str`, or an `int` N (a task not named yet shows `Task-N`).
    pub(super) fn name(&self, r: &Remote, layout: &Layout, obj: u64) -> Option<String> {
        let head = r.read(obj, LONG.digits + 8)?;
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
            let tag = le_u64(&head, LONG.tag)?;
            let (digits, sign) = (tag >> 3, tag & 3);
            let n: u64 = match (digits, sign) {
                (_, 1) => 0,
                (1, 0) => le_u64(&head, LONG.digits)? & 0x3fff_ffff,
                (2, 0) => {
                    let d = r.read(obj + LONG.digits as u64, 8)?;
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
    pub(super) fn coro_len(&self) -> usize {
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
    pub(super) fn parse_coro(&self, addr: u64, g: &[u8]) -> Option<((u64, i32), u64, u8, u64)> {
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
    pub(super) fn coro_frame(&self, r: &Remote, coro: u64) -> Option<((u64, i32), u64, u8, u64)> {
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
    /// 1024 coroutines): `all` mode reads every suspended task's chain on each pass.
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
            let heads = r.read_many(&cur.iter().map(|&(_, c)| (c, len)).collect::<Vec<_>>());
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
            let next = r.read_many(&slots.iter().map(|&(_, a)| (a, 8)).collect::<Vec<_>>());
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
}
