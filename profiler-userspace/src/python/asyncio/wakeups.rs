//! 3.11-3.13: who awaits a task is who its completion wakes, found from its done callbacks
//! (a task's wakeup, a closure's future, a bound method's object), through sets, tuples, lists
//! and cells.

use super::*;

impl AsyncLayout {
    /// 3.11-3.13: the tasks the completion of a future (its bytes `b`) wakes, found from its
    /// done callbacks: a task's wakeup (a built-in method bound to the task: `await`), a
    /// function whose closure holds a future whose completion wakes a task (`gather`,
    /// `shield`, `wait`; `hops` of them followed so far), a bound method of an object that
    /// holds a task among its attributes (a `TaskGroup`'s `_on_task_done`: its parent task).
    pub(super) fn woken_by(&self, r: &Remote, b: &[u8], hops: usize) -> Vec<u64> {
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
            for item in var_items(r, list, VAR.list_items, true, MAX_CALLBACKS) {
                // Each a (callback, context) tuple.
                if let Some(cb) = var_items(r, item, VAR.tuple_items, false, 1).first() {
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
                Some(0) => r.u64(cb + CFUNCTION_SELF).into_iter().collect(),
                Some(1) => r
                    .u64(cb + METHOD_SELF)
                    .map(|o| self.values_of(r, o, values))
                    .unwrap_or_default(),
                Some(2) if hops < MAX_FUTURE_HOPS => {
                    let closure = r.u64(cb + FUNCTION_CLOSURE).filter(|&c| plausible(c));
                    let cells = closure
                        .map(|c| var_items(r, c, VAR.tuple_items, false, MAX_CELLS))
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
    pub(super) fn values_of(&self, r: &Remote, obj: u64, values: Values) -> Vec<u64> {
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
                .and_then(|ty| r.u64(ty + TYPE.basicsize))
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
}

/// The members of a set (a table of at most `max_table` entries read; the dummy entries of
/// deleted keys are among them, and are not what the set holds).
pub(super) fn set_members(r: &Remote, set: u64, max_table: u64) -> Vec<u64> {
    let Some(head) = r.read(set, SET.table + 8) else {
        return Vec::new();
    };
    let (Some(used), Some(mask), Some(table)) = (
        le_u64(&head, SET.used),
        le_u64(&head, SET.mask),
        le_u64(&head, SET.table),
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
pub(super) fn var_items(r: &Remote, obj: u64, items: u64, list: bool, max: usize) -> Vec<u64> {
    let Some(n) = r.u64(obj + VAR.size).filter(|&n| n <= 1 << 20) else {
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
