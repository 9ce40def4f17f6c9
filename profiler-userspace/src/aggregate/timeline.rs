//! Per-thread scheduler timelines: exact on-CPU intervals from `sched_switch`, off-CPU samples
//! weighted by how long the thread stayed off, CPU use per sample, and On CPU / Off CPU markers.

use super::{state, Category, Marker, Mode, Sample, StackId};
/// Which earlier stack an off-CPU interval without its own capture is charged to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reuse {
    /// None (times only).
    Nothing,
    /// The thread's last off-CPU capture.
    LastOffCpu,
    /// The thread's latest sample or capture.
    Latest,
}

/// What the scheduler told us about one thread so far.
#[derive(Clone, Debug, Default)]
pub struct SchedState {
    /// Closed on-CPU intervals (ms), in time order.
    pub oncpu: Vec<(f64, f64)>,
    /// On CPU since this time.
    on_since: Option<f64>,
    /// The off-CPU sample whose end (the next switch-in) is not known yet.
    pending_off: Option<usize>,
    /// Stack and state of the last full off-CPU capture, for switches that reuse it.
    last_off: Option<(Option<StackId>, u8)>,
    /// Stack and state of the latest sample or capture, for preemptions.
    latest: Option<(Option<StackId>, u8)>,
    /// Any scheduler event seen for this thread.
    seen: bool,
    exited: bool,
}

impl SchedState {
    /// An on-CPU sample was taken.
    pub fn note_sample(&mut self, stack: Option<StackId>, st: u8) {
        self.latest = Some((stack, st));
    }

    /// The thread came back on a CPU at `t`: the pending off-CPU sample gets its length.
    pub fn switch_in(&mut self, samples: &mut [Sample], t: f64) {
        self.seen = true;
        self.close_pending(samples, t);
        if self.on_since.is_none() {
            self.on_since = Some(t);
        }
    }

    /// The thread left the CPU at `t`. `capture` is the stack and state of that moment; without
    /// one, `reuse` says which earlier stack applies, if any.
    /// `start` is when the thread was first known to run (the profile start or its creation).
    pub fn switch_out(
        &mut self,
        samples: &mut Vec<Sample>,
        t: f64,
        start: f64,
        capture: Option<(Option<StackId>, u8)>,
        reuse: Reuse,
        mode: Mode,
    ) {
        // A first event that is a switch-out: the thread was running since the start.
        let since = self
            .on_since
            .take()
            .or(if self.seen { None } else { Some(start) });
        self.seen = true;
        if let Some(s) = since {
            if t > s {
                self.oncpu.push((s, t));
            }
        }
        self.close_pending(samples, t);
        if self.exited {
            return; // the final switch of an exiting thread
        }
        let cap = match (capture, reuse) {
            (Some(c), _) => {
                self.last_off = Some(c);
                self.latest = Some(c);
                Some(c)
            }
            (None, Reuse::LastOffCpu) => self.last_off,
            (None, Reuse::Latest) => self.latest,
            (None, Reuse::Nothing) => None,
        };
        if let Some((stack, st)) = cap {
            let st = st & !state::ON_CPU;
            samples.push(Sample {
                time_ms: t,
                stack,
                state: st,
                weight_ms: 0.0,
                in_mode: mode.keeps(st),
                cpu_delta_us: 0.0,
            });
            self.pending_off = Some(samples.len() - 1);
        }
    }

    /// The thread exited (or its process exec'd) at `t`.
    pub fn exit(&mut self, t: f64) {
        if let Some(s) = self.on_since.take() {
            if t > s {
                self.oncpu.push((s, t));
            }
        }
        self.seen = true;
        self.exited = true;
    }

    fn close_pending(&mut self, samples: &mut [Sample], t: f64) {
        if let Some(i) = self.pending_off.take() {
            if let Some(s) = samples.get_mut(i) {
                s.weight_ms = (t - s.time_ms).max(0.0);
            }
        }
    }

    /// What a thread carries into the next profile of a continuous run (which starts at 0): on
    /// CPU still, or off CPU with the capture of its switch-out, returned as the new profile's
    /// first sample. `import` moves stacks into the new profile.
    pub fn continuation(
        &self,
        samples: &[Sample],
        mut import: impl FnMut(Option<StackId>) -> Option<StackId>,
    ) -> (SchedState, Option<Sample>) {
        let mut next = SchedState {
            seen: self.seen,
            on_since: self.on_since.map(|_| 0.0),
            ..Default::default()
        };
        next.last_off = self.last_off.map(|(s, st)| (import(s), st));
        next.latest = self.latest.map(|(s, st)| (import(s), st));
        let pending = self
            .pending_off
            .and_then(|i| samples.get(i))
            .map(|s| Sample {
                time_ms: 0.0,
                stack: import(s.stack),
                weight_ms: 0.0,
                cpu_delta_us: 0.0,
                ..*s
            });
        if pending.is_some() {
            next.pending_off = Some(0);
        }
        (next, pending)
    }

    /// The run ended at `end` (or the thread at its exit): open intervals close there.
    pub fn finish(&mut self, samples: &mut [Sample], start: f64, end: f64) {
        self.close_pending(samples, end);
        if let Some(s) = self.on_since.take() {
            if end > s {
                self.oncpu.push((s, end));
            }
        } else if !self.seen && samples.iter().any(|s| s.state & state::ON_CPU != 0) {
            // Never switched during the run: on CPU throughout.
            self.oncpu.push((start, end));
        }
        self.oncpu.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
}

/// Sets each sample's CPU use since the previous sample (or `start`) from the on-CPU intervals.
/// `samples` and `oncpu` are in time order.
pub fn cpu_deltas(samples: &mut [Sample], oncpu: &[(f64, f64)], start: f64) {
    let mut prev = start;
    let mut k = 0;
    for s in samples.iter_mut() {
        let t = s.time_ms;
        let mut used = 0.0;
        while k < oncpu.len() && oncpu[k].1 <= prev {
            k += 1;
        }
        let mut j = k;
        while j < oncpu.len() && oncpu[j].0 < t {
            let (a, b) = oncpu[j];
            used += (b.min(t) - a.max(prev)).max(0.0);
            j += 1;
        }
        s.cpu_delta_us = used * 1000.0;
        prev = prev.max(t);
    }
}

/// On CPU and Off CPU interval markers of a thread living from `start` to `end`.
pub fn cpu_markers(sched: &SchedState, start: f64, end: f64) -> Vec<Marker> {
    let mut out = Vec::with_capacity(sched.oncpu.len() * 2 + 1);
    let off = |a: f64, b: f64| Marker {
        name: "Off CPU",
        category: Category::Cpu,
        start_ms: a,
        end_ms: b,
    };
    let mut last_end = start;
    for &(a, b) in &sched.oncpu {
        if a > last_end + 1e-6 {
            out.push(off(last_end, a));
        }
        out.push(Marker {
            name: "On CPU",
            category: Category::Cpu,
            start_ms: a,
            end_ms: b,
        });
        last_end = last_end.max(b);
    }
    if sched.seen && end > last_end + 1e-6 {
        out.push(off(last_end, end));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn off_cpu_samples_get_their_interval_and_reuse_stacks() {
        let mut st = SchedState::default();
        let mut samples = vec![on(1.0), on(2.0)];
        // Running since the start; leaves at 2.5 with a capture, back at 10.
        st.note_sample(Some(3), state::PYTHON | state::ON_CPU);
        st.switch_out(
            &mut samples,
            2.5,
            0.0,
            Some((Some(7), state::PYTHON)),
            Reuse::Nothing,
            Mode::Wall,
        );
        st.switch_in(&mut samples, 10.0);
        // Leaves again at 10.2 reusing the capture; the run ends at 20 while it is off.
        st.switch_out(&mut samples, 10.2, 0.0, None, Reuse::LastOffCpu, Mode::Wall);
        st.finish(&mut samples, 0.0, 20.0);
        assert_eq!(st.oncpu, vec![(0.0, 2.5), (10.0, 10.2)]);
        assert_eq!(samples.len(), 4);
        assert_eq!(samples[3].stack, Some(7));
        assert_eq!((samples[2].weight_ms, samples[2].stack), (7.5, Some(7)));
        assert_eq!(samples[2].state & state::ON_CPU, 0);
        assert!((samples[3].weight_ms - 9.8).abs() < 1e-9);
        // Off-CPU samples do not count in cpu mode.
        let mut st = SchedState::default();
        let mut s2 = Vec::new();
        st.switch_out(
            &mut s2,
            1.0,
            0.0,
            Some((None, 0)),
            Reuse::Nothing,
            Mode::Cpu,
        );
        assert!(!s2[0].in_mode);
        // A preemption reuses the latest sample, whatever it was.
        st.switch_in(&mut s2, 2.0);
        st.note_sample(Some(9), state::ON_CPU | state::HAS_GIL);
        st.switch_out(&mut s2, 3.0, 0.0, None, Reuse::Latest, Mode::Gil);
        assert_eq!(
            (s2[1].stack, s2[1].state, s2[1].in_mode),
            (Some(9), state::HAS_GIL, true)
        );
    }

    #[test]
    fn exiting_threads_get_no_off_cpu_time() {
        let mut st = SchedState::default();
        let mut samples = Vec::new();
        st.switch_in(&mut samples, 1.0);
        st.exit(3.0);
        st.switch_out(
            &mut samples,
            3.1,
            0.0,
            Some((None, 0)),
            Reuse::Nothing,
            Mode::Wall,
        );
        st.finish(&mut samples, 0.0, 3.0);
        assert!(samples.is_empty());
        assert_eq!(st.oncpu, vec![(1.0, 3.0)]);
    }

    #[test]
    fn cpu_deltas_and_markers_follow_intervals() {
        let mut samples = vec![on(1.0), on(2.0), on(5.0)];
        let oncpu = vec![(0.0, 1.5), (1.8, 2.2), (4.0, 6.0)];
        cpu_deltas(&mut samples, &oncpu, 0.0);
        let d: Vec<f64> = samples.iter().map(|s| s.cpu_delta_us.round()).collect();
        assert_eq!(d, vec![1000.0, 700.0, 1200.0]);
        let mut st = SchedState::default();
        let mut none = Vec::new();
        st.switch_in(&mut none, 1.0);
        st.switch_out(&mut none, 2.0, 0.0, None, Reuse::Nothing, Mode::Cpu);
        st.finish(&mut none, 0.0, 4.0);
        let m: Vec<(&str, f64, f64)> = cpu_markers(&st, 0.0, 4.0)
            .iter()
            .map(|m| (m.name, m.start_ms, m.end_ms))
            .collect();
        assert_eq!(
            m,
            vec![
                ("Off CPU", 0.0, 1.0),
                ("On CPU", 1.0, 2.0),
                ("Off CPU", 2.0, 4.0)
            ]
        );
    }
}
