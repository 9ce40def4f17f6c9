//! Differential views of two profiles (`convert NEW --diff-against BASELINE`): which call paths
//! grew or shrank in share between a baseline and a new run.
//!
//! Call paths are matched by what stays the same between two runs of a program: the process
//! and thread names without their ids, Python frames by file and function without the line
//! (an edit elsewhere in a file moves every line below it), native and kernel frames by symbol.
//! The baseline's counts are scaled to the new profile's total, so the colours show a change of
//! share, not of load. A frame no call path of the baseline has is marked ` (new)`; call paths
//! of the baseline that the new run lacks cannot be drawn at the new run's widths, and are
//! summed up in the flame graph's subtitle instead (and by `gone`).

use std::collections::{BTreeMap, HashSet};

use super::{periods, stack_totals, RunInfo};
use crate::aggregate::Profile;

/// The mark on a frame that no call path of the baseline has.
pub const NEW: &str = " (new)";

/// `;` separates frames and the last space the count.
fn clean(s: &str) -> String {
    s.replace(';', ":").replace(['\n', '\r'], " ")
}

/// Call paths of a profile, as the diff matches them, with their sample counts.
fn paths(p: &Profile) -> BTreeMap<Vec<String>, u64> {
    let mut ms: BTreeMap<Vec<String>, f64> = BTreeMap::new();
    for st in stack_totals(p) {
        let mut path = vec![
            clean(&st.process.name),
            clean(st.thread.python_name.as_ref().unwrap_or(&st.thread.name)),
        ];
        for f in p.stack_root_first(st.stack) {
            let fr = &p.frames[f];
            let func = &p.funcs[fr.func];
            path.push(clean(&match &func.file {
                Some(file) if func.is_python => {
                    format!("{}:{}", file.rsplit('/').next().unwrap_or(file), func.name)
                }
                _ => super::frame_label(p, f),
            }));
        }
        *ms.entry(path).or_default() += st.ms;
    }
    ms.into_iter()
        .map(|(k, v)| (k, periods(v, p.interval_ms)))
        .filter(|(_, n)| *n > 0)
        .collect()
}

/// The two profiles side by side.
pub struct Diff {
    /// Each call path of either: (frames, baseline count scaled to the new total, new count).
    /// Frames of the new profile that no baseline path has carry the ` (new)` mark.
    pub lines: Vec<(Vec<String>, u64, u64)>,
    /// Samples of each profile.
    pub totals: (u64, u64),
    /// Call paths of the baseline the new profile lacks: (frames, their share of the baseline).
    pub gone: Vec<(Vec<String>, f64)>,
}

pub fn diff(baseline: &Profile, new: &Profile) -> Diff {
    let before = paths(baseline);
    let after = paths(new);
    let total_before: u64 = before.values().sum();
    let total_after: u64 = after.values().sum();
    let scale = if total_before == 0 {
        0.0
    } else {
        total_after as f64 / total_before as f64
    };
    let prefixes: HashSet<&[String]> = before
        .keys()
        .flat_map(|k| (1..=k.len()).map(move |n| &k[..n]))
        .collect();
    let mut lines = Vec::new();
    for (path, &n) in &after {
        let b = before.get(path).copied().unwrap_or(0);
        let marked = path
            .iter()
            .enumerate()
            .map(|(i, f)| {
                if prefixes.contains(&path[..=i]) {
                    f.clone()
                } else {
                    format!("{f}{NEW}")
                }
            })
            .collect();
        lines.push((marked, (b as f64 * scale).round() as u64, n));
    }
    let mut gone: Vec<(Vec<String>, f64)> = before
        .iter()
        .filter(|(k, _)| !after.contains_key(*k))
        .map(|(k, &n)| (k.clone(), n as f64 / total_before.max(1) as f64))
        .collect();
    gone.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    Diff {
        lines,
        totals: (total_before, total_after),
        gone,
    }
}

impl Diff {
    /// Folded lines with both counts (`frame;...;frame BASELINE NEW`), as inferno's
    /// differential flame graph reads them.
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        for (path, b, n) in &self.lines {
            s.push_str(&path.join(";"));
            s.push_str(&format!(" {b} {n}\n"));
        }
        s
    }

    /// Frames (by name, without the ` (new)` mark) whose total share changed most: (name,
    /// share in the baseline, share now), by the size of the change. A frame counts once per
    /// call path however often it recurses in it; the process and thread roots are left out.
    pub fn changes(&self) -> Vec<(String, f64, f64)> {
        let mut shares: BTreeMap<String, (f64, f64)> = BTreeMap::new();
        // The baseline's counts are scaled to the new total: both are shares of it.
        let total = self.totals.1.max(1) as f64;
        let mut add = |path: &[String], b: f64, a: f64| {
            let mut seen = HashSet::new();
            for f in path.iter().skip(2) {
                let name = f.strip_suffix(NEW).unwrap_or(f);
                if seen.insert(name) {
                    let e = shares.entry(name.to_string()).or_default();
                    e.0 += b;
                    e.1 += a;
                }
            }
        };
        for (path, b, a) in &self.lines {
            add(path, *b as f64 / total, *a as f64 / total);
        }
        for (path, share) in &self.gone {
            add(path, *share, 0.0);
        }
        let mut out: Vec<(String, f64, f64)> =
            shares.into_iter().map(|(k, (b, a))| (k, b, a)).collect();
        out.sort_by(|x, y| {
            (y.2 - y.1)
                .abs()
                .total_cmp(&(x.2 - x.1).abs())
                .then_with(|| x.0.cmp(&y.0))
        });
        out
    }

    /// The share of the baseline whose call paths are gone.
    pub fn gone_share(&self) -> f64 {
        self.gone.iter().map(|g| g.1).sum()
    }

    /// A differential flame graph: widths are the new profile's samples; red frames grew in
    /// share since the baseline, blue ones shrank.
    pub fn flamegraph(&self, run: &RunInfo) -> Result<Vec<u8>, super::Error> {
        let mut opts = inferno::flamegraph::Options::default();
        opts.title = format!(
            "tachyon-bpf: {} ({} mode), against a baseline",
            run.command, run.mode
        );
        let gone = match self.gone.first() {
            Some((path, share)) => format!(
                "; {:.1}% of the baseline is on call paths that are gone (largest: {}, {:.1}%)",
                100.0 * self.gone_share(),
                path.last().map_or("", String::as_str),
                100.0 * share
            ),
            None => String::new(),
        };
        opts.subtitle = Some(format!(
            "red: a larger share than in the baseline ({} samples, scaled to {}), blue: a smaller \
             one; frames marked{NEW} are not in the baseline{gone}",
            self.totals.0, self.totals.1
        ));
        super::collapsed::draw(opts, &self.to_text(), "no samples 0 0")
    }
}
