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
    a.set(name, LONG.tag as u64, 1 << 3);
    a.set(name, LONG.digits as u64, number);
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
    a.set(set, SET.used as u64, 3);
    a.set(set, SET.mask as u64, 7);
    a.set(set, SET.table as u64, ta);
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
        a.set(t, TYPE.name, n);
        a.set(t, TYPE.basicsize, 16);
        a.set(t, TYPE.base, base);
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
            self.a.set(name, LONG.tag as u64, 1 << 3);
            self.a.set(name, LONG.digits as u64, number);
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
            self.a.set(t, VAR.size, 2);
            self.a.set(t, VAR.tuple_items, cb);
            let t = self.a.addr(t);
            let items = self.a.obj(1);
            self.a.set(items, 0, t);
            let items = self.a.addr(items);
            let list_type = ty(&mut self.a, "list", 0);
            let list = object(&mut self.a, list_type, 5);
            self.a.set(list, VAR.size, 1);
            self.a.set(list, VAR.list_items, items);
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
            self.a.set(closure, VAR.size, values.len() as u64);
            for (k, &v) in values.iter().enumerate() {
                let cell = self.holding("cell", 3, CELL_REF, v);
                self.a.set(closure, VAR.tuple_items + 8 * k as u64, cell);
            }
            let closure = self.a.addr(closure);
            self.holding("function", 12, FUNCTION_CLOSURE, closure)
        }
        /// A task's wakeup: a built-in method bound to `task`.
        fn wakeup(&mut self, task: u64) -> u64 {
            self.holding("builtin_function_or_method", 6, CFUNCTION_SELF, task)
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
        w.a.set(list, VAR.size, 2);
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
