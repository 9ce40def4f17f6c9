//! The scheduler's accounting records: each thread's on- and off-CPU intervals charged to its
//! timeline, and what the BPF side still held at the end of an interval or of a thread.

use profiler_common::{
    thread_key, ExitSchedRecord, SchedRecord, ThreadSched, ATTR_NONE, ATTR_PENDING,
    ATTR_UNCAPTURED, ATTR_UNKNOWN,
};

use super::{ensure_process, Collector};
use crate::aggregate::timeline::Window;

impl Collector {
    /// A thread's scheduler accounting record.
    pub fn handle_sched(&mut self, r: &SchedRecord) {
        let w = Window {
            t0: (r.t0_ns != 0).then(|| self.time_ms(r.t0_ns)),
            t1: self.time_ms(r.t1_ns),
            on_ms: r.on_ns as f64 / 1e6,
            off_ms: r.off_ns.map(|n| n as f64 / 1e6),
            slot_cap: r.slot_cap,
            switches: r.switches,
            attr: r.attr,
        };
        self.account(r.pid, r.tid, &w);
    }

    pub(super) fn account(&mut self, pid: u32, tid: u32, w: &Window) {
        let uncaptured = self.uncaptured_stack();
        ensure_process(
            &mut self.profile,
            &self.python,
            &self.env_labels,
            pid,
            "",
            w.t1,
        );
        let (mode, timeline) = (self.profile.mode, self.profile.timeline);
        let t = self
            .profile
            .thread_mut(pid, "", tid, "", w.t0.unwrap_or(w.t1));
        let start = t.start_ms.unwrap_or(0.0);
        t.sched
            .account(&mut t.samples, w, start, mode, timeline, uncaptured);
    }

    /// Charges what the BPF side held and had not sent at `now_ns` (see
    /// `Session::settle_sched`): each thread's open span, and its intervals since its last
    /// switch-out up to `now_ns`. Only threads the profile knows: the BPF side also holds threads of processes
    /// that are not profiled any more, or that never had a sample.
    pub fn settle_sched(&mut self, snapshot: &[(u64, ThreadSched)], now_ns: u64) {
        let now = self.time_ms(now_ns);
        for &(key, st) in snapshot {
            let (pid, tid) = ((key >> 32) as u32, key as u32);
            debug_assert_eq!(thread_key(pid, tid), key);
            let known = self
                .profile
                .processes
                .get(&pid)
                .is_some_and(|p| p.threads.contains_key(&tid));
            if !known {
                continue;
            }
            // On CPU since its last switch-out for the CPU time it has used since, as the BPF
            // side would count it at its next switch-out.
            let used = match st.since_ns {
                0 => 0,
                _ => crate::process::procfs::thread_cpu_ns(pid, tid)
                    .map_or(0, |s| s.saturating_sub(st.last_sum)),
            };
            let mut st = st;
            if st.attr == ATTR_PENDING {
                if self.short_so_far(&st, now_ns, used) {
                    // Back since, before its deadline: its switch-in left the interval to
                    // the sampling, which its next switch-out would have accounted.
                    st.attr = ATTR_NONE;
                } else {
                    self.settle_blocked(pid, tid, &mut st, now_ns);
                }
            }
            self.close_sched(pid, tid, &st, now_ns, used);
            if let Some(t) = self
                .profile
                .processes
                .get_mut(&pid)
                .and_then(|p| p.threads.get_mut(&tid))
            {
                t.sched.settle(now);
            }
        }
    }

    /// A thread still blocked at `now_ns`, whose interval its switch-in would have charged: one
    /// that has been away a sampling period or more is read from outside as `dump` reads a
    /// blocked thread (its stack does not change until it wakes), and its interval so far is
    /// charged to that read; a shorter one is left to the sampling (`ATTR_NONE`), as its
    /// switch-in would most often have done.
    fn settle_blocked(&mut self, pid: u32, tid: u32, st: &mut ThreadSched, now_ns: u64) {
        let away_ms = (now_ns.saturating_sub(st.since_ns)) as f64 / 1e6;
        if away_ms < self.profile.interval_ms {
            st.attr = ATTR_NONE;
            return;
        }
        let Some(s) = super::blocked::blocked_sample(&self.python, &self.kernel, pid, tid, now_ns)
        else {
            st.attr = ATTR_UNCAPTURED;
            return;
        };
        // An off-CPU capture (`off_cpu` is set) taken at `now_ns`, in a slot of its own: the
        // open span's slots keep their captures.
        self.handle_in(s, false);
        let slot = st.next_slot as usize % st.slot_cap.len();
        if st.off_ns[slot] != 0 && st.span_start != 0 {
            // The span still charges that slot's capture: charge it first.
            let span = ThreadSched { since_ns: 0, ..*st };
            self.close_sched(pid, tid, &span, now_ns, 0);
            st.span_start = 0;
        }
        st.slot_cap[slot] = now_ns;
        st.attr = slot as u32;
    }

    /// A thread exited: what the BPF side held of it, closed at its exit with its exact CPU
    /// time (its `RECORD_EXIT` follows).
    pub fn handle_exit_sched(&mut self, r: &ExitSchedRecord) {
        let used = r.sum_ns.saturating_sub(r.sched.last_sum);
        let mut st = r.sched;
        if st.attr == ATTR_PENDING {
            // It ran since it blocked (to exit): a short interval its switch-in left to the
            // sampling, or one whose switch-in was not seen (time without a stack).
            st.attr = if self.short_so_far(&st, r.time_ns, used) {
                ATTR_NONE
            } else {
                ATTR_UNCAPTURED
            };
        }
        self.close_sched(r.pid, r.tid, &st, r.time_ns, used);
    }

    /// Whether a thread that blocked (`ATTR_PENDING`) has been off CPU for less than a sampling
    /// period, as the BPF side's `close_intervals` tells: from its switch-out until `now_ns`,
    /// less the CPU time it `used` since (a short interval its switch-in left to the sampling,
    /// or one still under way).
    fn short_so_far(&self, st: &ThreadSched, now_ns: u64, used: u64) -> bool {
        let period_ns = (self.profile.interval_ms * 1e6) as u64;
        let back = now_ns.saturating_sub(used.min(now_ns.saturating_sub(st.since_ns)));
        back.saturating_sub(st.since_ns) < period_ns
    }

    /// Charges a thread's open span in `st`, then its intervals since its last switch-out up to
    /// `now_ns`: off CPU, then on CPU for the `used` nanoseconds of CPU time it had meanwhile
    /// (the BPF side's `close_intervals`, with the same clamping).
    pub(super) fn close_sched(
        &mut self,
        pid: u32,
        tid: u32,
        st: &ThreadSched,
        now_ns: u64,
        used: u64,
    ) {
        let now = self.time_ms(now_ns);
        if st.span_start != 0 {
            let w = Window {
                t0: Some(self.time_ms(st.span_start)),
                t1: self.time_ms(st.span_end),
                on_ms: st.on_ns as f64 / 1e6,
                off_ms: st.off_ns.map(|n| n as f64 / 1e6),
                slot_cap: st.slot_cap,
                switches: st.switches.max(1),
                attr: 0,
            };
            self.account(pid, tid, &w);
        }
        if st.since_ns == 0 {
            return;
        }
        let since = self.time_ms(st.since_ns);
        let on_ms = (used as f64 / 1e6).clamp(0.0, (now - since).max(0.0));
        let back = now - on_ms;
        let base = Window {
            slot_cap: st.slot_cap,
            attr: st.attr,
            ..Default::default()
        };
        if st.attr != ATTR_UNKNOWN && back > since {
            let mut w = Window {
                t0: Some(since),
                t1: back,
                ..base
            };
            if let Some(o) = w.off_ms.get_mut(st.attr as usize) {
                *o = back - since;
            }
            self.account(pid, tid, &w);
        }
        if on_ms > 0.0 {
            let w = Window {
                t0: Some(back),
                t1: now,
                on_ms,
                ..base
            };
            self.account(pid, tid, &w);
        }
    }
}
