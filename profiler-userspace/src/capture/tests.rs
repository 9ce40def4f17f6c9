//! Unit tests of the capture: the ring's and scheduler map's sizes, the BPF object's contract.

use super::{
    default_ring_mb, parse_loadavg_threads, sampling_period_ns, sched_entries, MIN_PHASE_STEP_NS,
    TIMER_GRID_NS,
};
use object::{Object, ObjectSection, ObjectSymbol, SymbolKind, SymbolSection};
use profiler_common::MAX_SCHED_ENTRIES;
use std::collections::BTreeSet;

#[test]
fn the_default_ring_holds_a_second_of_samples_between_8_and_32_mib() {
    // The always-on rate on a small host: 0.8 MiB a second, 8 at least.
    assert_eq!(default_ring_mb(49, 2), 8);
    assert_eq!(default_ring_mb(99, 8), 8);
    // 15.6 MiB a second, to the next power of two.
    assert_eq!(default_ring_mb(1000, 2), 16);
    assert_eq!(default_ring_mb(1000, 4), 32);
    // A large host at the always-on rate, and absurd inputs: 32 at most.
    assert_eq!(default_ring_mb(49, 128), 32);
    assert_eq!(default_ring_mb(u64::MAX, usize::MAX), 32);
    assert_eq!(default_ring_mb(0, 0), 8);
}

#[test]
fn the_scheduler_map_is_sized_to_the_host() {
    assert_eq!(
        parse_loadavg_threads("0.52 0.58 0.59 3/871 12345\n"),
        Some(871)
    );
    assert_eq!(parse_loadavg_threads("0.52 0.58 0.59 garbage 1"), None);
    assert_eq!(parse_loadavg_threads(""), None);
    // A small host: the floor.
    assert_eq!(sched_entries(Some(300)), 4096);
    assert_eq!(sched_entries(Some(0)), 4096);
    // Room for four times the threads, in powers of two.
    assert_eq!(sched_entries(Some(1025)), 8192);
    assert_eq!(sched_entries(Some(3000)), 16384);
    // Never past what the object declares, whatever the count says.
    assert_eq!(sched_entries(Some(40_000)), MAX_SCHED_ENTRIES);
    assert_eq!(sched_entries(Some(u32::MAX)), MAX_SCHED_ENTRIES);
    assert_eq!(sched_entries(None), MAX_SCHED_ENTRIES);
}

/// The object the BPF crate built has exactly the maps and programs of the contract in
/// `profiler_common::names`: a rename on either side fails here, not at load time.
#[test]
fn the_bpf_object_matches_the_contract() {
    let file = object::File::parse(super::BPF_OBJECT).unwrap();
    let (mut maps, mut programs) = (BTreeSet::new(), BTreeSet::new());
    for sym in file.symbols() {
        let SymbolSection::Section(idx) = sym.section() else {
            continue;
        };
        let section = file.section_by_index(idx).unwrap();
        let (Ok(name), Ok(sname)) = (sym.name(), section.name()) else {
            continue;
        };
        if sname == "maps" || sname == ".maps" {
            maps.insert(name.to_string());
        } else if sym.kind() == SymbolKind::Text && sym.is_global() && sname != ".text" {
            programs.insert(name.to_string());
        }
    }
    let want = |names: &[&str]| names.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
    assert_eq!(maps, want(&profiler_common::names::MAPS));
    assert_eq!(programs, want(&profiler_common::names::PROGRAMS));
}

#[test]
fn every_counter_is_named_at_its_index() {
    for (i, (index, name, meaning)) in profiler_common::STATS.iter().enumerate() {
        assert_eq!(*index as usize, i);
        assert!(!name.is_empty() && !meaning.is_empty());
    }
}

/// A blocked thread's deadline word holds for its own tid only, before the deadline by a whole
/// unit, and across the wrap of its 42-bit time.
#[test]
fn a_deadline_word_is_its_threads_until_the_deadline() {
    use profiler_common::{
        before_deadline, deadline_word, idle_word, DEADLINE_TID_SHIFT, DEADLINE_UNIT_SHIFT,
    };
    let tid = (1 << 22) - 1;
    let unit = 1u64 << DEADLINE_UNIT_SHIFT;
    for base in [
        0,
        5 << 40,
        (1u64 << (DEADLINE_TID_SHIFT + DEADLINE_UNIT_SHIFT)) - 3 * unit,
    ] {
        let deadline = base + 10 * unit;
        let w = deadline_word(tid, deadline);
        assert!(before_deadline(w, tid, base), "{base}");
        assert!(before_deadline(w, tid, deadline - 2 * unit), "{base}");
        // Within the deadline's own unit, or past it: the long way.
        assert!(!before_deadline(w, tid, deadline), "{base}");
        assert!(!before_deadline(w, tid, deadline + 5 * unit), "{base}");
        assert!(!before_deadline(w, tid, deadline + (1 << 40)), "{base}");
        // Another thread's word, or none.
        assert!(!before_deadline(w, tid - 1, base), "{base}");
        assert!(!before_deadline(0, tid, base), "{base}");
        // A blocked thread's word is never its idle word, even where the deadline's units wrap.
        assert_ne!(w, idle_word(tid), "{base}");
    }
    let wrapped = 1u64 << (DEADLINE_TID_SHIFT + DEADLINE_UNIT_SHIFT);
    assert_ne!(deadline_word(tid, wrapped), idle_word(tid));
    assert_ne!(deadline_word(tid, 0), idle_word(tid));
    assert_ne!(idle_word(tid), idle_word(tid - 1));
}

/// Round rates are moved off the millisecond grid; rates whose period already moves along it
/// keep `1/rate`; no period moves by more than a grid step and 1/64 of itself.
#[test]
fn sampling_periods_do_not_keep_step_with_the_millisecond_grid() {
    assert_eq!(sampling_period_ns(1000), 1_015_625);
    assert_eq!(sampling_period_ns(100), 10_015_625);
    assert_eq!(sampling_period_ns(2000), 507_812);
    assert_eq!(sampling_period_ns(10_000), 101_562);
    assert_eq!(sampling_period_ns(100_000), 10_025);
    // 997 Hz: 1.003 ms moves 3 µs a period, 333 periods round the grid.
    assert_eq!(sampling_period_ns(997), 1_015_625);
    // 1/49 s and 1/99 s move along the grid already.
    assert_eq!(sampling_period_ns(49), 1_000_000_000 / 49);
    assert_eq!(sampling_period_ns(99), 1_000_000_000 / 99);
    for rate in 1..=100_000u64 {
        let nominal = 1_000_000_000 / rate;
        let p = sampling_period_ns(rate);
        assert!(
            p.abs_diff(nominal) <= nominal / 64 + 2 * MIN_PHASE_STEP_NS,
            "{rate} Hz: {p} ns for {nominal}"
        );
        // How far the samples' phase against the grid moves: each period, or each `n` periods
        // for `n` samples a millisecond (less what integer division rounds off).
        let (moved, wanted, slack) = if p >= TIMER_GRID_NS {
            let r = p % TIMER_GRID_NS;
            (r.min(TIMER_GRID_NS - r), MIN_PHASE_STEP_NS, 1)
        } else {
            let r = TIMER_GRID_NS % p;
            let n = TIMER_GRID_NS / p + 1;
            (r.min(p - r), MIN_PHASE_STEP_NS.min(nominal / 4), n)
        };
        assert!(
            moved + slack >= wanted,
            "{rate} Hz: {p} ns moves {moved} ns against the grid"
        );
    }
}
