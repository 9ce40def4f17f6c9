//! Per-thread state markers from the samples' states: Has GIL / No GIL, Waiting for GIL,
//! Python Code / Native Code (the names CPython's own sampler writes), GC Collecting and
//! Has Exception / No Exception (an exception raised or being handled, or none). (On CPU
//! / Off CPU come from the scheduler, in `timeline`.)
//!
//! Each sample covers a span: an off-CPU sample its exact off-CPU interval, an on-CPU sample the
//! time to the next sample (at most 1.5 periods, else one period). A track's interval runs over
//! consecutive matching samples whose spans meet within one period, and ends where a
//! non-matching sample starts.

use super::{state, Category, Marker, Sample};

struct Track {
    name: &'static str,
    category: Category,
    test: fn(u8) -> bool,
}

const TRACKS: [Track; 8] = [
    Track {
        name: "Has GIL",
        category: Category::Gil,
        test: |s| s & state::PYTHON != 0 && s & state::HAS_GIL != 0,
    },
    Track {
        name: "No GIL",
        category: Category::Gil,
        test: |s| s & state::PYTHON != 0 && s & state::HAS_GIL == 0,
    },
    Track {
        name: "Waiting for GIL",
        category: Category::Gil,
        test: |s| s & state::GIL_WAIT != 0,
    },
    Track {
        name: "Python Code",
        category: Category::CodeType,
        test: |s| s & state::PYTHON != 0 && s & state::HAS_GIL != 0,
    },
    Track {
        name: "Native Code",
        category: Category::CodeType,
        test: |s| {
            s & state::PYTHON != 0
                && s & state::HAS_GIL == 0
                && s & state::ON_CPU != 0
                && s & state::GIL_WAIT == 0
        },
    },
    Track {
        name: "GC Collecting",
        category: Category::Gc,
        test: |s| s & state::GC != 0,
    },
    Track {
        name: "Has Exception",
        category: Category::Exception,
        test: |s| s & state::PYTHON != 0 && s & state::EXCEPTION != 0,
    },
    Track {
        name: "No Exception",
        category: Category::Exception,
        test: |s| s & state::PYTHON != 0 && s & state::EXCEPTION == 0,
    },
];

/// The time span each (time-sorted) sample stands for.
fn spans(samples: &[Sample], interval_ms: f64) -> Vec<(f64, f64)> {
    samples
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let t = s.time_ms;
            if s.state & state::ON_CPU == 0 {
                return (t, t + s.weight_ms);
            }
            match samples.get(i + 1) {
                Some(n) if n.time_ms - t <= 1.5 * interval_ms => (t, n.time_ms.max(t)),
                _ => (t, t + interval_ms),
            }
        })
        .collect()
}

pub fn build(samples: &[Sample], interval_ms: f64) -> Vec<Marker> {
    let spans = spans(samples, interval_ms);
    let mut out = Vec::new();
    for track in &TRACKS {
        let mut push = |a: f64, b: f64| {
            out.push(Marker {
                name: track.name,
                category: track.category,
                start_ms: a,
                end_ms: b,
            })
        };
        let mut open: Option<(f64, f64)> = None;
        for (s, &(a, b)) in samples.iter().zip(&spans) {
            if (track.test)(s.state) {
                open = match open {
                    Some((start, end)) if a <= end + interval_ms => Some((start, end.max(b))),
                    Some((start, end)) => {
                        push(start, end);
                        Some((a, b))
                    }
                    None => Some((a, b)),
                };
            } else if let Some((start, end)) = open.take() {
                push(start, end.min(a).max(start));
            }
        }
        if let Some((start, end)) = open {
            push(start, end);
        }
    }
    out.sort_by(|a, b| a.start_ms.total_cmp(&b.start_ms));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(t: f64, st: u8) -> Sample {
        Sample {
            time_ms: t,
            stack: None,
            state: st,
            weight_ms: 1.0,
            in_mode: true,
            cpu_delta_us: 0.0,
        }
    }

    #[test]
    fn off_cpu_waits_join_across_short_runs() {
        let wait = state::PYTHON | state::GIL_WAIT;
        let mut a = s(0.0, wait);
        a.weight_ms = 5.0;
        let mut b = s(5.05, wait);
        b.weight_ms = 3.0;
        let c = s(8.5, state::PYTHON | state::HAS_GIL | state::ON_CPU);
        let m = build(&[a, b, c], 1.0);
        let w: Vec<(f64, f64)> = m
            .iter()
            .filter(|m| m.name == "Waiting for GIL")
            .map(|m| (m.start_ms, m.end_ms))
            .collect();
        assert_eq!(w, vec![(0.0, 8.05)]);
    }

    #[test]
    fn intervals_follow_state_changes_and_gaps() {
        let py_gil = state::PYTHON | state::HAS_GIL | state::ON_CPU;
        let py_nogil = state::PYTHON | state::ON_CPU;
        let samples = vec![
            s(0.0, py_gil),
            s(1.0, py_gil),
            s(2.0, py_nogil),
            s(3.0, py_gil),
            s(10.0, py_gil),
        ];
        let m = build(&samples, 1.0);
        let has: Vec<(f64, f64)> = m
            .iter()
            .filter(|m| m.name == "Has GIL")
            .map(|m| (m.start_ms, m.end_ms))
            .collect();
        assert_eq!(has, vec![(0.0, 2.0), (3.0, 4.0), (10.0, 11.0)]);
        let no: Vec<(f64, f64)> = m
            .iter()
            .filter(|m| m.name == "No GIL")
            .map(|m| (m.start_ms, m.end_ms))
            .collect();
        assert_eq!(no, vec![(2.0, 3.0)]);
        assert!(m
            .iter()
            .any(|m| m.name == "Native Code" && m.start_ms == 2.0));
    }
}
