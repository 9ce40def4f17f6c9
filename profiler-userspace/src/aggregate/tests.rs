//! Unit tests of the profile model.

use super::*;

#[test]
fn a_wait_across_a_rotation_continues_in_the_next_profile() {
    use crate::aggregate::timeline::Window;
    let mut p = Profile::new(Mode::Wall, 1.0);
    let func = p.func(Func {
        name: Arc::from("poll"),
        file: Some(Arc::from("/srv/app.py")),
        line: Some(3),
        lib: None,
        category: Category::Python,
        is_python: true,
    });
    let f = p.frame(Frame {
        func,
        line: Some(4),
        address: None,
        symbol_address: None,
        category: Category::Python,
        opcode: None,
    });
    let stack = p.stack(&[f]);
    let t = p.thread_mut(7, "app", 7, "app", 1.0);
    let st = state::PYTHON;
    // On CPU 1..2, then blocks at 2 ms (captured); still asleep when the interval ends at
    // 10 ms, where the collector settles it from the BPF side's snapshot.
    let on = Window {
        t0: Some(1.0),
        t1: 2.0,
        on_ms: 1.0,
        ..Default::default()
    };
    t.sched
        .account(&mut t.samples, &on, 0.0, Mode::Wall, true, None);
    t.sched.note_capture(2_000_000, 2.0, stack, st);
    let mut off = Window {
        t0: Some(2.0),
        t1: 10.0,
        attr: 0,
        ..Default::default()
    };
    off.slot_cap[0] = 2_000_000;
    off.off_ms[0] = 8.0;
    t.sched
        .account(&mut t.samples, &off, 0.0, Mode::Wall, true, None);
    t.sched.settle(10.0);
    let mut next = p.successor(10.0);
    p.finish(10.0);
    let old = &p.processes[&7].threads[&7];
    assert_eq!(old.samples.last().unwrap().weight_ms, 8.0);
    let nt = next
        .processes
        .get_mut(&7)
        .unwrap()
        .threads
        .get_mut(&7)
        .unwrap();
    assert!(nt.samples.is_empty());
    // It wakes 5 ms into the next interval: the whole block (2..15 in the old profile's
    // time, -8..5 in the new one's) arrives then, and the new profile keeps its own part.
    off.t0 = Some(-8.0);
    off.t1 = 5.0;
    off.off_ms[0] = 13.0;
    nt.sched
        .account(&mut nt.samples, &off, 0.0, Mode::Wall, true, None);
    let first = nt.samples[0];
    assert_eq!((first.time_ms, first.weight_ms), (0.0, 5.0));
    let frames = next.stack_frames(first.stack);
    assert_eq!(
        next.funcs[next.frames[frames[0]].func].name.as_ref(),
        "poll"
    );
    assert_eq!(next.frames[frames[0]].line, Some(4));
}

#[test]
fn a_blocked_thread_read_from_outside_is_off_cpu_in_the_mode_filter_too() {
    let mut p = Profile::new(Mode::Cpu, 1.0);
    p.add_sample(7, "python3", 8, "worker", 1.0, None, state::PYTHON);
    p.add_sample(7, "python3", 7, "python3", 1.0, None, state::ON_CPU);
    let proc_ = &p.processes[&7];
    let blocked = &proc_.threads[&8].samples[0];
    assert_eq!(blocked.state & state::ON_CPU, 0);
    assert!(
        !blocked.in_mode,
        "cpu mode keeps no blocked thread's sample"
    );
    assert!(proc_.threads[&7].samples[0].in_mode);
}

fn on_cpu(p: &mut Profile, pid: u32, name: &str, t: f64) {
    p.add_sample(pid, name, pid, name, t, None, state::ON_CPU);
}

#[test]
fn a_moment_before_an_exec_is_the_new_programs_start_and_a_program_is_not() {
    let mut p = Profile::new(Mode::Wall, 1.0);
    // A launcher's child: two samples between fork and exec.
    p.task_born(5, 5, 0.0);
    on_cpu(&mut p, 5, "launcher", 1.0);
    on_cpu(&mut p, 5, "launcher", 2.0);
    p.exec(5, 3.0);
    on_cpu(&mut p, 5, "python3", 4.0);
    assert!(
        p.retired.is_empty(),
        "no track for the moment before the exec"
    );
    let proc_ = &p.processes[&5];
    assert_eq!(proc_.name, "python3");
    assert_eq!(proc_.start_ms, Some(0.0), "the track starts at the fork");
    assert_eq!(proc_.threads[&5].name, "python3");
    assert_eq!(proc_.threads[&5].samples.len(), 3);
    // A program that ran for longer than moments before its exec stays a process of its own.
    for i in 0..100 {
        on_cpu(&mut p, 5, "python3", 5.0 + i as f64);
    }
    p.exec(5, 200.0);
    on_cpu(&mut p, 5, "sh", 201.0);
    assert_eq!(p.retired.len(), 1);
    assert_eq!(p.retired[0].name, "python3");
    assert_eq!(p.retired[0].generation, 1);
    assert_eq!(p.processes[&5].name, "sh");
}

/// A frame of its own named `n`.
fn named_frame(p: &mut Profile, n: &str) -> FrameId {
    let func = p.func(Func {
        name: Arc::from(n),
        file: None,
        line: None,
        lib: None,
        category: Category::User,
        is_python: false,
    });
    p.frame(Frame {
        func,
        line: None,
        address: None,
        symbol_address: None,
        category: Category::User,
        opcode: None,
    })
}

/// `stack_near` gives `stack`'s ids whatever its memo holds: the same thread's stacks growing,
/// shrinking and changing in the middle, and two threads sharing a memo slot.
#[test]
fn stacks_near_the_last_of_a_thread_are_the_same_stacks() {
    let mut near = Profile::new(Mode::Wall, 1.0);
    let mut plain = Profile::new(Mode::Wall, 1.0);
    let names = ["a", "b", "c", "d", "e"];
    let fs: Vec<FrameId> = names.iter().map(|n| named_frame(&mut near, n)).collect();
    for n in names {
        named_frame(&mut plain, n);
    }
    let (a, b, c, d, e) = (fs[0], fs[1], fs[2], fs[3], fs[4]);
    let stacks: [&[FrameId]; 9] = [
        &[a, b, c],
        &[a, b, c, d],
        &[a, b],
        &[a, d, c],
        &[],
        &[e],
        &[a, b, c, d, e],
        &[a, b, d, d, e],
        &[a, b, c],
    ];
    // Tids 7 and 7 + the table's size share a slot; 8 has one of its own.
    for tid in [7u32, 7 + RECENT_STACKS as u32, 8] {
        for (i, st) in stacks.iter().enumerate() {
            let hint = if i % 2 == 0 { tid } else { 7 };
            let got = near.stack_near(st, hint);
            assert_eq!(got, plain.stack(st), "stack {i} of tid {tid}");
            let mut leaf_first = st.to_vec();
            leaf_first.reverse();
            assert_eq!(near.stack_frames(got), leaf_first);
        }
    }
    assert_eq!(near.stacks, plain.stacks);
}

#[test]
fn stacks_share_prefixes() {
    let mut p = Profile::new(Mode::Wall, 1.0);
    let f = named_frame;
    let (a, b, c) = (f(&mut p, "a"), f(&mut p, "b"), f(&mut p, "c"));
    let s1 = p.stack(&[a, b]).unwrap();
    let s2 = p.stack(&[a, c]).unwrap();
    assert_ne!(s1, s2);
    assert_eq!(p.stacks.len(), 3);
    assert_eq!(p.stack_frames(Some(s2)), vec![c, a]);
    assert_eq!(f(&mut p, "a"), a);
}

#[test]
fn counters_of_intervals_add_up_to_the_run() {
    let mut run = Counters::default();
    let first = Counters {
        samples: 10,
        py_samples: 7,
        py_read_failed: 1,
        max_lag_ms: 30.0,
        last_lag_ms: 5.0,
        ..Counters::default()
    };
    let second = Counters {
        samples: 4,
        py_samples: 3,
        offcpu_captures: 2,
        max_lag_ms: 12.0,
        last_lag_ms: 2.0,
        ..Counters::default()
    };
    run.add(&first);
    run.add(&second);
    assert_eq!(
        (
            run.samples,
            run.py_samples,
            run.py_read_failed,
            run.offcpu_captures
        ),
        (14, 10, 1, 2)
    );
    assert_eq!((run.max_lag_ms, run.last_lag_ms), (30.0, 2.0));
}
