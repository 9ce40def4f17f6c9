//! Collapsed profiles read as a user reads them: which samples run Python code, how many are
//! fully merged, and which frames name nothing or the wrong thing.

use std::collections::BTreeMap;
use std::path::Path;

/// What the samples of one profile that run Python code are made of.
#[derive(Debug, Default)]
pub struct Fidelity {
    pub python: u64,
    pub merged: u64,
    /// Problem -> (samples, an example stack).
    pub problems: BTreeMap<&'static str, (u64, String)>,
}

/// Reads a collapsed profile: `process;thread;frame;...;frame count` per line.
pub fn fidelity(folded: &Path) -> Fidelity {
    let text = std::fs::read(folded).unwrap();
    let text = String::from_utf8(text).expect("the collapsed output is UTF-8 text");
    let mut f = Fidelity::default();
    for line in text.lines() {
        let (stack, n) = line.rsplit_once(' ').unwrap();
        let n: u64 = n.parse().unwrap();
        let frames: Vec<&str> = stack.split(';').skip(2).collect();
        let is_python = |fr: &&str| {
            fr.starts_with("<unresolved")
                || fr
                    .rsplit_once(':')
                    .is_some_and(|(a, l)| a.contains(':') && l.parse::<u32>().is_ok())
        };
        // An eval-loop frame stays in a merged stack only as its innermost one, with no Python
        // frame after it: a call into Python whose frame the eval loop has not linked yet.
        let evals: Vec<usize> = frames
            .iter()
            .enumerate()
            .filter(|(_, fr)| fr.starts_with("_PyEval_EvalFrameDefault"))
            .map(|(i, _)| i)
            .collect();
        let leftover = evals.len() > 1
            || evals
                .first()
                .is_some_and(|&i| frames[i..].iter().any(is_python));
        if !frames.iter().any(is_python) && !leftover {
            continue;
        }
        f.python += n;
        let mut problems = Vec::new();
        if leftover {
            problems.push("an eval-loop frame left without its Python frames");
        }
        if frames.iter().any(|fr| fr.starts_with("<unresolved")) {
            problems.push("an unresolved Python frame");
        }
        // A Python frame's file is a source file or a `<...>` pseudo-file (`<string>`,
        // `<frozen importlib._bootstrap>`): never a string that happened to be at a freed file
        // name's address (a docstring, a directory, a message).
        let files = frames
            .iter()
            .filter(|fr| is_python(fr) && !fr.starts_with("<unresolved"))
            .map(|fr| fr.split(':').next().unwrap_or(""));
        for file in files {
            if file == "<unknown>" {
                problems.push("a Python frame with an unknown file");
            } else if !(file.ends_with(".py") || file.starts_with('<')) {
                problems.push("a Python frame with a wrong file");
            }
        }
        if frames
            .iter()
            .any(|fr| fr.chars().any(|c| c.is_control() || c == '\u{fffd}'))
        {
            problems.push("a garbage name");
        }
        if frames.iter().any(|fr| {
            fr.strip_prefix("0x")
                .is_some_and(|h| h.chars().all(|c| c.is_ascii_hexdigit()))
        }) {
            problems.push("a bare address");
        }
        match frames.first() {
            Some(&"[truncated]") => problems.push("a truncated stack"),
            Some(&("_start" | "clone3" | "clone" | "start_thread")) => {}
            _ => problems.push("a stack not rooted where its thread starts"),
        }
        problems.sort_unstable();
        problems.dedup();
        if problems.is_empty() {
            f.merged += n;
        }
        for p in problems {
            let e = f.problems.entry(p).or_insert((0, stack.to_string()));
            e.0 += n;
        }
    }
    f
}

/// Frames that name nothing, or the wrong thing, are never shown.
pub fn no_wrong_names(label: &str, f: &Fidelity) {
    for p in [
        "a garbage name",
        "a bare address",
        "a Python frame with a wrong file",
        "an unresolved Python frame",
    ] {
        assert!(
            !f.problems.contains_key(p),
            "{label}: {p}: {:?}",
            f.problems[p]
        );
    }
}
