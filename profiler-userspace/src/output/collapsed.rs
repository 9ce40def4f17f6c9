//! Folded stacks (Brendan Gregg's `frame;frame;frame count`), with the process and the thread
//! as the two root frames, and the SVG flame graph drawn from them by inferno.

use std::collections::HashMap;

use super::{frame_label, periods, process_label, stack_totals, thread_label, RunInfo};
use crate::aggregate::Profile;

/// `;` separates frames and the last space the count: frame text keeps neither ambiguous.
fn clean(s: &str) -> String {
    s.replace(';', ":").replace(['\n', '\r'], " ")
}

/// The folded lines, hottest first (ties by text), counts in sampling periods.
pub fn lines(p: &Profile) -> Vec<(String, u64)> {
    let mut labels: HashMap<usize, String> = HashMap::new();
    let mut per: HashMap<String, f64> = HashMap::new();
    for st in stack_totals(p) {
        let mut text = clean(&process_label(st.process));
        text.push(';');
        text.push_str(&clean(&thread_label(st.thread)));
        for f in p.stack_root_first(st.stack) {
            text.push(';');
            let l = labels.entry(f).or_insert_with(|| clean(&frame_label(p, f)));
            text.push_str(l);
        }
        *per.entry(text).or_default() += st.ms;
    }
    let mut out: Vec<(String, u64)> = per
        .into_iter()
        .map(|(t, ms)| (t, periods(ms, p.interval_ms)))
        .filter(|(_, n)| *n > 0)
        .collect();
    out.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    out
}

pub fn to_text(p: &Profile) -> String {
    let mut s = String::new();
    for (text, n) in lines(p) {
        s.push_str(&text);
        s.push(' ');
        s.push_str(&n.to_string());
        s.push('\n');
    }
    s
}

/// An interactive SVG flame graph (search, zoom; scripts inline, so it opens offline).
pub fn flamegraph(p: &Profile, run: &RunInfo) -> Result<Vec<u8>, super::Error> {
    let text = to_text(p);
    let mut opts = inferno::flamegraph::Options::default();
    opts.title = format!("tachyon-bpf: {} ({} mode)", run.command, run.mode);
    opts.subtitle = Some(format!(
        "{:.1} s at {} Hz per CPU; one sample = {} ms",
        run.duration_ms / 1000.0,
        run.rate_hz,
        run.interval_ms
    ));
    draw(opts, &text, "no samples 0")
}

/// Draws folded `text` with inferno. Counts are samples, colours come from the frame names (the
/// same profile always draws the same picture), and an empty profile still gets a valid
/// picture: inferno refuses an empty input, so it draws `empty` (a line of the input's kind).
pub fn draw(
    mut opts: inferno::flamegraph::Options<'_>,
    text: &str,
    empty: &str,
) -> Result<Vec<u8>, super::Error> {
    opts.count_name = "samples".into();
    opts.deterministic = true;
    let mut out = Vec::new();
    let result = if text.is_empty() {
        opts.title.push_str(": no samples");
        inferno::flamegraph::from_lines(&mut opts, [empty], &mut out)
    } else {
        inferno::flamegraph::from_lines(&mut opts, text.lines(), &mut out)
    };
    result.map_err(|e| super::Error::encode("flame graph", e))?;
    Ok(out)
}
