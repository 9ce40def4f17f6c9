//! Per-thread state markers from the samples' states: Has GIL / No GIL, Waiting for GIL,
//! Python Code / Native Code (the names CPython's own sampler writes), GC Collecting, On CPU.
//! An interval runs from a sample to the next one; a gap longer than a few sampling intervals
//! (the thread was off CPU) ends it.

use super::{state, Category, Marker, Sample};

struct Track {
    name: &'static str,
    category: Category,
    test: fn(u8) -> bool,
}

const TRACKS: [Track; 7] = [
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
        name: "On CPU",
        category: Category::Cpu,
        test: |s| s & state::ON_CPU != 0,
    },
];

pub fn build(samples: &[Sample], interval_ms: f64) -> Vec<Marker> {
    let mut out = Vec::new();
    let gap = interval_ms * 3.0;
    for track in &TRACKS {
        let mut open: Option<f64> = None;
        let mut last_end = 0.0;
        for (i, s) in samples.iter().enumerate() {
            let end = samples
                .get(i + 1)
                .map(|n| {
                    if n.time_ms - s.time_ms <= gap {
                        n.time_ms
                    } else {
                        s.time_ms + interval_ms
                    }
                })
                .unwrap_or(s.time_ms + interval_ms);
            let on = (track.test)(s.state);
            match (open, on) {
                (None, true) => open = Some(s.time_ms),
                (Some(start), true) if s.time_ms - last_end > 1e-9 => {
                    // A gap: close the interval at the end of the previous sample's slot.
                    out.push(Marker {
                        name: track.name,
                        category: track.category,
                        start_ms: start,
                        end_ms: last_end,
                    });
                    open = Some(s.time_ms);
                }
                (Some(start), false) => {
                    out.push(Marker {
                        name: track.name,
                        category: track.category,
                        start_ms: start,
                        end_ms: s.time_ms.min(last_end.max(start)),
                    });
                    open = None;
                }
                _ => {}
            }
            last_end = end;
        }
        if let Some(start) = open {
            out.push(Marker {
                name: track.name,
                category: track.category,
                start_ms: start,
                end_ms: last_end,
            });
        }
    }
    out.sort_by(|a, b| {
        a.start_ms
            .partial_cmp(&b.start_ms)
            .unwrap_or(std::cmp::Ordering::Equal)
    });
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
        }
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
