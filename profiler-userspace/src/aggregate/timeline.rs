//! Per-thread scheduler timelines, from the BPF program's accounting records: exact on- and
//! off-CPU intervals where they last a sampling period or more, spans of shorter ones with their
//! on-CPU share and their off-CPU time per stack, off-CPU samples weighted by the time they stand
//! for, CPU use per sample, and On CPU / Off CPU / Switching markers.

use std::collections::VecDeque;

use profiler_common::{ATTR_COUNT, ATTR_LATEST, ATTR_NONE, SCHED_SLOTS};

use super::{state, Category, Marker, Mode, Sample, StackId};

/// Off-CPU captures a thread remembers (the BPF side keeps `SCHED_SLOTS` blocking points; a few
/// more cover records still on their way).
const CAPTURES_KEPT: usize = 2 * SCHED_SLOTS;

/// One scheduler accounting record, in profile time (ms): see `profiler_common::SchedRecord`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Window {
    /// `None`: since before the thread was first seen.
    pub t0: Option<f64>,
    pub t1: f64,
    pub on_ms: f64,
    pub off_ms: [f64; ATTR_COUNT],
    /// Capture time (ns) of each slot's capture.
    pub slot_cap: [u64; SCHED_SLOTS],
    /// 0: one exact interval (`attr` says where it is charged when off CPU).
    pub switches: u32,
    pub attr: u32,
}

/// What the scheduler told us about one thread so far.
#[derive(Clone, Debug, Default)]
pub struct SchedState {
    /// Exact on-CPU intervals (ms).
    pub oncpu: Vec<(f64, f64)>,
    /// Spans of short on- and off-CPU intervals: (start, end, on-CPU share).
    pub spans: Vec<(f64, f64, f64)>,
    /// The newest off-CPU captures: (capture time in ns, stack, state).
    captures: VecDeque<(u64, Option<StackId>, u8)>,
    /// Time (ms), stack and state of where the thread was last seen: its latest sample,
    /// capture, or return from a blocking point (`account`), for preemptions.
    latest: Option<(f64, Option<StackId>, u8)>,
    /// Time before which records are already accounted (see `settle`).
    accounted_to: f64,
    /// Any scheduler record seen for this thread.
    seen: bool,
    exited: bool,
}

impl SchedState {
    /// An on-CPU sample was taken at `t_ms`.
    pub fn note_sample(&mut self, t_ms: f64, stack: Option<StackId>, st: u8) {
        self.note_latest(t_ms, stack, st);
    }

    /// The thread was seen at `t_ms` with `stack`: the latest unless something later was seen
    /// already (records come in the order they were sent, and the record of a blocked interval
    /// is sent after the samples taken once the thread was back).
    fn note_latest(&mut self, t_ms: f64, stack: Option<StackId>, st: u8) {
        if self.latest.is_none_or(|(t, ..)| t <= t_ms) {
            self.latest = Some((t_ms, stack, st));
        }
    }

    /// An off-CPU capture, taken at `time_ns` (`t_ms` in the profile's time) as the thread
    /// came back from a new blocking point: the stack that accounting records charge by that
    /// time.
    pub fn note_capture(&mut self, time_ns: u64, t_ms: f64, stack: Option<StackId>, st: u8) {
        if self.captures.len() == CAPTURES_KEPT {
            self.captures.pop_front();
        }
        self.captures.push_back((time_ns, stack, st));
        self.note_latest(t_ms, stack, st);
    }

    /// Accounts one record. `start` is when the thread was first known to run (the profile
    /// start or its creation); `timeline`: whether the exact on-CPU intervals and spans are kept
    /// (`Profile::timeline`); `uncaptured` the stack of off-CPU time without its own.
    pub fn account(
        &mut self,
        samples: &mut Vec<Sample>,
        w: &Window,
        start: f64,
        mode: Mode,
        timeline: bool,
        uncaptured: Option<StackId>,
    ) {
        self.seen = true;
        if self.exited {
            return;
        }
        let mut a = w.t0.unwrap_or(start).max(start);
        let b = w.t1;
        if b <= a || b <= self.accounted_to {
            return;
        }
        // The part before `accounted_to` was counted from a snapshot: keep the rest, in
        // proportion for a span.
        let mut scale = 1.0;
        if a < self.accounted_to {
            scale = (b - self.accounted_to) / (b - a);
            a = self.accounted_to;
        }
        if w.switches == 0 {
            if w.on_ms > 0.0 {
                if timeline {
                    self.oncpu.push((a, b));
                }
            } else {
                self.off_sample(samples, a, b - a, w.attr, w, mode, uncaptured);
                // Back at `b` from that blocking point: where it stands until sampled again.
                // A slot's capture was reused without a new one (it blocked there before),
                // so without this a preemption right after it came back was charged to a
                // sample taken before it blocked.
                if let Some((stack, st)) = self.slot_capture(w, w.attr) {
                    self.note_latest(b, stack, st);
                }
            }
            return;
        }
        if timeline {
            self.spans
                .push((a, b, (w.on_ms * scale / (b - a)).clamp(0.0, 1.0)));
        }
        let mut t = a;
        for (k, &ms) in w.off_ms.iter().enumerate() {
            let ms = ms * scale;
            if ms > 0.0 {
                self.off_sample(samples, t, ms, k as u32, w, mode, uncaptured);
                t += ms;
            }
        }
    }

    /// An off-CPU sample of `ms` at `t`, with the stack `attr` names.
    #[allow(clippy::too_many_arguments)]
    fn off_sample(
        &self,
        samples: &mut Vec<Sample>,
        t: f64,
        ms: f64,
        attr: u32,
        w: &Window,
        mode: Mode,
        uncaptured: Option<StackId>,
    ) {
        let cap = match attr {
            ATTR_NONE => return,
            ATTR_LATEST => self.latest.map(|(_, stack, st)| (stack, st)),
            a => self.slot_capture(w, a),
        };
        let (stack, st) = cap.unwrap_or((uncaptured, 0));
        let st = st & !state::ON_CPU;
        samples.push(Sample {
            time_ms: t,
            stack,
            state: st,
            weight_ms: ms,
            in_mode: mode.keeps(st),
            cpu_delta_us: 0.0,
        });
    }

    /// The capture a record's slot `attr` names (`None`: not a slot, or its capture never
    /// arrived).
    fn slot_capture(&self, w: &Window, attr: u32) -> Option<(Option<StackId>, u8)> {
        let c = *w.slot_cap.get(attr as usize)?;
        self.captures
            .iter()
            .rev()
            .find(|x| x.0 == c && c != 0)
            .map(|x| (x.1, x.2))
    }

    /// Records ending by `t` are accounted already (a snapshot of what the BPF side held).
    pub fn settle(&mut self, t: f64) {
        self.accounted_to = self.accounted_to.max(t);
    }

    /// The thread exited (or its process exec'd): its last records came before.
    pub fn exit(&mut self, _t: f64) {
        self.seen = true;
        self.exited = true;
    }

    /// What a thread carries into the next profile of a continuous run (which starts at 0, the
    /// moment it was settled): its captures and latest stack. `import` moves stacks into the
    /// new profile.
    pub fn continuation(
        &self,
        mut import: impl FnMut(Option<StackId>) -> Option<StackId>,
    ) -> SchedState {
        SchedState {
            seen: self.seen,
            captures: self
                .captures
                .iter()
                .map(|&(t, s, st)| (t, import(s), st))
                .collect(),
            // The next profile starts at 0, the moment this one was settled.
            latest: self.latest.map(|(_, s, st)| (0.0, import(s), st)),
            accounted_to: 0.0,
            ..Default::default()
        }
    }

    /// The run ended at `end` (or the thread at its exit).
    pub fn finish(&mut self, samples: &[Sample], start: f64, end: f64) {
        if !self.seen && samples.iter().any(|s| s.state & state::ON_CPU != 0) {
            // Never switched during the run: on CPU throughout.
            self.oncpu.push((start, end));
        }
        self.oncpu.sort_by(|a, b| a.0.total_cmp(&b.0));
        self.spans.sort_by(|a, b| a.0.total_cmp(&b.0));
    }

    /// Total on-CPU time (ms): exact intervals plus the spans' shares.
    pub fn on_cpu_ms(&self) -> f64 {
        self.oncpu.iter().map(|(a, b)| b - a).sum::<f64>()
            + self.spans.iter().map(|(a, b, f)| (b - a) * f).sum::<f64>()
    }
}

/// Sets each sample's CPU use since the previous sample (or `start`) from the thread's exact
/// on-CPU intervals and spans. `samples` are in time order.
pub fn cpu_deltas(samples: &mut [Sample], sched: &SchedState, start: f64) {
    let mut on: Vec<(f64, f64, f64)> = sched.oncpu.iter().map(|&(a, b)| (a, b, 1.0)).collect();
    on.extend(sched.spans.iter().copied());
    on.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut prev = start;
    let mut k = 0;
    for s in samples.iter_mut() {
        let t = s.time_ms;
        let mut used = 0.0;
        while k < on.len() && on[k].1 <= prev {
            k += 1;
        }
        let mut j = k;
        while j < on.len() && on[j].0 < t {
            let (a, b, f) = on[j];
            used += (b.min(t) - a.max(prev)).max(0.0) * f;
            j += 1;
        }
        s.cpu_delta_us = used * 1000.0;
        prev = prev.max(t);
    }
}

/// On CPU, Off CPU and Switching interval markers of a thread living from `start` to `end`.
/// Switching: a span of on- and off-CPU intervals each shorter than a sampling period (the CPU
/// graph shows its share).
pub fn cpu_markers(sched: &SchedState, start: f64, end: f64) -> Vec<Marker> {
    let mut known: Vec<(f64, f64, &'static str)> = sched
        .oncpu
        .iter()
        .map(|&(a, b)| (a, b, "On CPU"))
        .chain(sched.spans.iter().map(|&(a, b, _)| (a, b, "Switching")))
        .collect();
    known.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut out = Vec::with_capacity(known.len() * 2 + 1);
    let marker = |name: &'static str, a: f64, b: f64| Marker {
        name,
        category: Category::Cpu,
        start_ms: a,
        end_ms: b,
    };
    let mut last_end = start;
    for (a, b, name) in known {
        if a > last_end + 1e-6 {
            out.push(marker("Off CPU", last_end, a));
        }
        // Adjacent spans make one marker.
        match out.last_mut() {
            Some(m) if m.name == name && name == "Switching" && a <= m.end_ms + 1e-6 => {
                m.end_ms = m.end_ms.max(b)
            }
            _ => out.push(marker(name, a, b)),
        }
        last_end = last_end.max(b);
    }
    if sched.seen && end > last_end + 1e-6 {
        out.push(marker("Off CPU", last_end, end));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use profiler_common::ATTR_UNCAPTURED;

    fn on(t: f64) -> Sample {
        Sample {
            time_ms: t,
            stack: None,
            state: state::ON_CPU,
            weight_ms: 1.0,
            in_mode: true,
            cpu_delta_us: 0.0,
        }
    }

    fn interval(t0: Option<f64>, t1: f64, on: bool, attr: u32) -> Window {
        let mut w = Window {
            t0,
            t1,
            attr,
            ..Default::default()
        };
        let d = t1 - t0.unwrap_or(0.0);
        if on {
            w.on_ms = d;
        } else {
            w.off_ms[attr as usize] = d;
        }
        w
    }

    #[test]
    fn long_intervals_are_exact_and_carry_their_capture() {
        let mut st = SchedState::default();
        let mut samples = vec![on(1.0), on(2.0)];
        st.note_sample(2.0, Some(3), state::PYTHON | state::ON_CPU);
        // Running since before it was seen; blocks at 2.5 (captured in slot 1), back at 10.
        st.account(
            &mut samples,
            &interval(None, 2.5, true, 0),
            0.0,
            Mode::Wall,
            true,
            Some(99),
        );
        st.note_capture(2_500_000, 2.5, Some(7), state::PYTHON);
        let mut w = interval(Some(2.5), 10.0, false, 1);
        w.slot_cap[1] = 2_500_000;
        st.account(&mut samples, &w, 0.0, Mode::Wall, true, Some(99));
        // Preempted 12..15: the latest stack (the capture) applies.
        st.account(
            &mut samples,
            &interval(Some(12.0), 15.0, false, ATTR_LATEST),
            0.0,
            Mode::Wall,
            true,
            Some(99),
        );
        // A capture that never arrived: time without a stack.
        let mut w = interval(Some(16.0), 18.0, false, 2);
        w.slot_cap[2] = 16_000_000;
        st.account(&mut samples, &w, 0.0, Mode::Wall, true, Some(99));
        st.account(
            &mut samples,
            &interval(Some(18.0), 19.0, false, ATTR_UNCAPTURED),
            0.0,
            Mode::Wall,
            true,
            Some(99),
        );
        st.finish(&samples, 0.0, 20.0);
        assert_eq!(st.oncpu, vec![(0.0, 2.5)]);
        let off: Vec<(f64, f64, Option<StackId>)> = samples[2..]
            .iter()
            .map(|s| (s.time_ms, s.weight_ms, s.stack))
            .collect();
        assert_eq!(
            off,
            vec![
                (2.5, 7.5, Some(7)),
                (12.0, 3.0, Some(7)),
                (16.0, 2.0, Some(99)),
                (18.0, 1.0, Some(99))
            ]
        );
        assert!(samples[2..].iter().all(|s| s.state & state::ON_CPU == 0));
        // Times only: no sample.
        let mut none = Vec::new();
        st.account(
            &mut none,
            &interval(Some(19.0), 20.0, false, ATTR_NONE),
            0.0,
            Mode::Cpu,
            true,
            None,
        );
        assert!(none.is_empty());
    }

    #[test]
    fn without_a_timeline_off_cpu_time_is_charged_and_intervals_are_not_kept() {
        let (mut kept, mut not) = (SchedState::default(), SchedState::default());
        let (mut with, mut without) = (Vec::new(), Vec::new());
        let mut span = Window {
            t0: Some(3.0),
            t1: 5.0,
            on_ms: 0.5,
            switches: 9,
            ..Default::default()
        };
        span.off_ms[ATTR_LATEST as usize] = 1.5;
        for (st, samples, timeline) in [
            (&mut kept, &mut with, true),
            (&mut not, &mut without, false),
        ] {
            st.note_sample(0.5, Some(4), state::PYTHON | state::ON_CPU);
            st.account(
                samples,
                &interval(Some(0.0), 2.0, true, 0),
                0.0,
                Mode::Wall,
                timeline,
                None,
            );
            st.account(samples, &span, 0.0, Mode::Wall, timeline, None);
            st.finish(samples, 0.0, 5.0);
        }
        assert_eq!(kept.oncpu, vec![(0.0, 2.0)]);
        assert_eq!(kept.spans, vec![(3.0, 5.0, 0.25)]);
        assert!(not.oncpu.is_empty() && not.spans.is_empty());
        let charged = |v: &[Sample]| -> Vec<(f64, f64, Option<StackId>)> {
            v.iter()
                .map(|s| (s.time_ms, s.weight_ms, s.stack))
                .collect()
        };
        assert_eq!(charged(&without), charged(&with));
        assert_eq!(charged(&with), vec![(3.0, 1.5, Some(4))]);
    }

    #[test]
    fn spans_split_their_time_and_settled_parts_count_once() {
        let mut st = SchedState::default();
        let mut samples = Vec::new();
        st.note_capture(1_000_000, 1.0, Some(5), state::PYTHON | state::GIL_WAIT);
        let mut w = Window {
            t0: Some(1.0),
            t1: 3.0,
            on_ms: 0.5,
            switches: 40,
            ..Default::default()
        };
        w.slot_cap[0] = 1_000_000;
        w.off_ms[0] = 1.2;
        w.off_ms[ATTR_LATEST as usize] = 0.3;
        st.account(&mut samples, &w, 0.0, Mode::Wall, true, Some(99));
        assert_eq!(st.spans, vec![(1.0, 3.0, 0.25)]);
        let got: Vec<(f64, f64, Option<StackId>)> = samples
            .iter()
            .map(|s| (s.time_ms, s.weight_ms, s.stack))
            .collect();
        assert_eq!(got, vec![(1.0, 1.2, Some(5)), (2.2, 0.3, Some(5))]);
        assert_eq!(samples[0].state, state::PYTHON | state::GIL_WAIT);
        // Settled at 2.0: a span 1..3 sent later counts half.
        st.settle(2.0);
        let before = samples.len();
        st.account(&mut samples, &w, 0.0, Mode::Wall, true, Some(99));
        assert_eq!(st.spans[1], (2.0, 3.0, 0.25));
        assert!((samples[before].weight_ms - 0.6).abs() < 1e-9);
        // Entirely before: nothing.
        let n = samples.len();
        st.account(
            &mut samples,
            &interval(Some(0.5), 1.5, false, 0),
            0.0,
            Mode::Wall,
            true,
            None,
        );
        assert_eq!(samples.len(), n);
        assert!((st.on_cpu_ms() - 0.75).abs() < 1e-9);
    }

    #[test]
    fn exited_threads_account_nothing_more() {
        let mut st = SchedState::default();
        let mut samples = Vec::new();
        st.account(
            &mut samples,
            &interval(Some(1.0), 3.0, true, 0),
            0.0,
            Mode::Wall,
            true,
            None,
        );
        st.exit(3.0);
        st.account(
            &mut samples,
            &interval(Some(3.0), 4.0, false, ATTR_UNCAPTURED),
            0.0,
            Mode::Wall,
            true,
            None,
        );
        st.finish(&samples, 0.0, 3.0);
        assert!(samples.is_empty());
        assert_eq!(st.oncpu, vec![(1.0, 3.0)]);
    }

    #[test]
    fn cpu_deltas_and_markers_follow_intervals() {
        let mut samples = vec![on(1.0), on(2.0), on(5.0)];
        let mut st = SchedState::default();
        let mut none = Vec::new();
        for (a, b) in [(0.0, 1.5), (1.8, 2.2), (4.0, 6.0)] {
            st.account(
                &mut none,
                &interval(Some(a), b, true, 0),
                0.0,
                Mode::Cpu,
                true,
                None,
            );
        }
        cpu_deltas(&mut samples, &st, 0.0);
        let d: Vec<f64> = samples.iter().map(|s| s.cpu_delta_us.round()).collect();
        assert_eq!(d, vec![1000.0, 700.0, 1200.0]);
        // Spans count by their share.
        let mut st = SchedState::default();
        let w = Window {
            t0: Some(1.0),
            t1: 2.0,
            on_ms: 0.4,
            switches: 9,
            ..Default::default()
        };
        st.account(&mut none, &w, 0.0, Mode::Cpu, true, None);
        st.account(
            &mut none,
            &Window {
                t0: Some(2.0),
                t1: 3.0,
                ..w
            },
            0.0,
            Mode::Cpu,
            true,
            None,
        );
        st.account(
            &mut none,
            &interval(Some(3.5), 4.0, true, 0),
            0.0,
            Mode::Cpu,
            true,
            None,
        );
        st.finish(&none, 0.0, 5.0);
        let mut s = vec![on(2.5), on(5.0)];
        cpu_deltas(&mut s, &st, 0.0);
        assert_eq!(s[0].cpu_delta_us.round(), 600.0);
        assert_eq!(s[1].cpu_delta_us.round(), 700.0);
        let m: Vec<(&str, f64, f64)> = cpu_markers(&st, 0.0, 5.0)
            .iter()
            .map(|m| (m.name, m.start_ms, m.end_ms))
            .collect();
        assert_eq!(
            m,
            vec![
                ("Off CPU", 0.0, 1.0),
                ("Switching", 1.0, 3.0),
                ("Off CPU", 3.0, 3.5),
                ("On CPU", 3.5, 4.0),
                ("Off CPU", 4.0, 5.0)
            ]
        );
    }

    /// A thread back from a blocking point it was captured at before (no new capture) and
    /// preempted before its next sample: the preempted time is charged where it blocked, not to
    /// a sample taken before it blocked. A sample taken once it was back (read before the
    /// interval's record, which is sent at its next switch-out) stays the latest.
    #[test]
    fn a_preemption_after_a_known_block_is_charged_where_it_blocked() {
        let charged = |sample_after: Option<f64>| {
            let mut st = SchedState::default();
            let mut samples = Vec::new();
            // Captured blocking in slot 0 (stack 7) at 1 ms; sampled running elsewhere (stack
            // 3) at 100 ms.
            st.note_capture(1_000_000, 1.0, Some(7), state::PYTHON);
            st.note_sample(100.0, Some(3), state::PYTHON | state::ON_CPU);
            if let Some(t) = sample_after {
                st.note_sample(t, Some(4), state::PYTHON | state::ON_CPU);
            }
            // Blocks again at the same point 101..601, then preempted 602..640.
            let mut w = interval(Some(101.0), 601.0, false, 0);
            w.slot_cap[0] = 1_000_000;
            st.account(&mut samples, &w, 0.0, Mode::Wall, true, None);
            st.account(
                &mut samples,
                &interval(Some(602.0), 640.0, false, ATTR_LATEST),
                0.0,
                Mode::Wall,
                true,
                None,
            );
            let last = samples.last().unwrap();
            assert_eq!(last.weight_ms, 38.0);
            last.stack
        };
        assert_eq!(charged(None), Some(7));
        assert_eq!(charged(Some(601.5)), Some(4));
    }
}
