//! `--async-aware all`: every task of a process, from each thread state's list (3.14+) or the
//! set of every task `_asyncio` keeps (3.11-3.13), read in batches, and each suspended task's
//! chain.

use super::*;

impl AsyncLayout {
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
            let module = r.u64(ty + HEAP_TYPE_MODULE).filter(|&m| plausible(m))?;
            let state = r.u64(module + MODULE_STATE).filter(|&s| plausible(s))?;
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
            .map(|w| (w, (WEAKREF_OBJECT + 8) as usize))
            .collect();
        let objs: Vec<(u64, usize)> = r
            .read_many(&refs)
            .into_iter()
            .filter_map(|b| le_u64(&b?, WEAKREF_OBJECT as usize))
            .filter(|&t| plausible(t))
            .map(|t| (t, self.task_size as usize))
            .collect();
        let mut types: std::collections::HashMap<u64, bool> = std::collections::HashMap::new();
        let tasks = objs
            .iter()
            .zip(r.read_many(&objs))
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
