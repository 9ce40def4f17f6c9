//! `heatmap`: a directory of self-contained HTML pages (no script or style from elsewhere: they
//! open offline): `index.html`, the Python source files sampled, hottest first, each linking
//! to its page `fN.html`, where each line is shaded by its samples: self (the line is the
//! innermost Python frame's) and total (the line is on the stack). The directory is written
//! atomically by the same safe path as every other output (`files::write_dir_atomic`).
//!
//! Source text is read when the file is written, from the process's own root
//! (`/proc/PID/root`, for containers) while it runs, else from this machine. A file named by a
//! profiled process is untrusted: it is opened without following a final link and without
//! blocking, taken only if it is a regular file of at most `MAX_SOURCE` bytes, and, when the
//! profiler runs as root, only if everyone may read it (a process could name any file as its
//! code's file, and the heatmap would show it to whoever reads the profile). Without its text a
//! page still lists the lines sampled.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};

use super::{stack_totals, RunInfo, StackTotal};
use crate::aggregate::Profile;

/// The largest source file shown.
const MAX_SOURCE: u64 = 4 << 20;
/// The hottest files (with at least 1% of the time on the stack) are shown whole; the others by
/// their sampled lines only (a run that imports much would otherwise carry the whole standard
/// library).
const WHOLE_FILES: usize = 25;

/// Milliseconds of one line or file: (self, total).
#[derive(Clone, Copy, Default)]
struct Time {
    own: f64,
    total: f64,
}

#[derive(Default)]
struct File {
    /// A process that ran the file (its root holds the file).
    pid: u32,
    time: Time,
    lines: BTreeMap<u32, Time>,
}

fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c if c.is_control() && c != '\t' => out.push('\u{fffd}'),
            c => out.push(c),
        }
    }
    out
}

/// Reads a source file a profiled process named (see the module's rules).
fn read_source(path: &str, pid: u32) -> Result<String, &'static str> {
    if !path.starts_with('/') {
        return Err("not a file path");
    }
    let root = format!("/proc/{pid}/root{path}");
    let open = |p: &str| {
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY)
            .open(p)
    };
    let f = open(&root)
        .or_else(|_| open(path))
        .map_err(|_| "not readable here")?;
    let meta = f.metadata().map_err(|_| "not readable here")?;
    if !meta.file_type().is_file() {
        return Err("not a regular file");
    }
    if meta.len() > MAX_SOURCE {
        return Err("larger than 4 MiB");
    }
    // SAFETY: no preconditions.
    if unsafe { libc::geteuid() } == 0 && meta.mode() & 0o004 == 0 {
        return Err("not readable by every user (the profiler runs as root)");
    }
    let mut bytes = Vec::new();
    f.take(MAX_SOURCE)
        .read_to_end(&mut bytes)
        .map_err(|_| "not readable here")?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// Per source file, its lines' samples.
fn files(p: &Profile, totals: &[StackTotal<'_>]) -> BTreeMap<String, File> {
    let mut files: BTreeMap<String, File> = BTreeMap::new();
    for st in totals {
        let mut innermost = true;
        let mut seen_lines: HashSet<(&str, u32)> = HashSet::new();
        let mut seen_files: HashSet<&str> = HashSet::new();
        for &f in p.stack_root_first(st.stack).iter().rev() {
            let fr = &p.frames[f];
            let func = &p.funcs[fr.func];
            let (Some(file), true) = (func.file.as_deref(), func.is_python) else {
                continue;
            };
            let line = fr.line.or(func.line).unwrap_or(0);
            let entry = files.entry(file.to_string()).or_insert_with(|| File {
                pid: st.process.pid,
                ..File::default()
            });
            if innermost {
                entry.time.own += st.ms;
                entry.lines.entry(line).or_default().own += st.ms;
                innermost = false;
            }
            if seen_lines.insert((file, line)) {
                entry.lines.entry(line).or_default().total += st.ms;
            }
            if seen_files.insert(file) {
                entry.time.total += st.ms;
            }
        }
    }
    files
}

/// A cell's background: red by its share of the hottest line's time.
fn shade(ms: f64, max: f64) -> String {
    if ms <= 0.0 || max <= 0.0 {
        return String::new();
    }
    let a = (ms / max).sqrt().clamp(0.05, 1.0);
    format!(" style=\"background:rgba(220,40,30,{a:.2})\"")
}

const STYLE: &str = "body{font:14px system-ui,sans-serif;margin:1.5em}\
table{border-collapse:collapse}td,th{padding:1px 8px;text-align:right}\
th{position:sticky;top:0;background:#eee}td.code{text-align:left;white-space:pre;\
font:13px ui-monospace,monospace}td.path{text-align:left}.note{color:#777}";

/// The start of a page, titled `title`.
fn head(title: &str) -> String {
    format!(
        "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>{}</title><style>{STYLE}\
         </style></head><body>",
        escape(title)
    )
}

/// The pages: `index.html` first, then one `fN.html` per file.
pub fn pages(p: &Profile, run: &RunInfo) -> Vec<(String, String)> {
    let totals = stack_totals(p);
    let files = files(p, &totals);
    let all: f64 = totals.iter().map(|s| s.ms).sum();
    let pct = |ms: f64| 100.0 * ms / all.max(1e-9);
    let mut order: Vec<(&String, &File)> = files.iter().collect();
    order.sort_by(|a, b| b.1.time.total.total_cmp(&a.1.time.total).then(a.0.cmp(b.0)));
    let title = format!("tachyon-bpf heatmap: {}", run.command);
    let mut out = Vec::new();
    let mut index = head(&title);
    index.push_str(&format!(
        "<h1>Python source heatmap</h1><p>{} ({} mode, {:.1} s at {} Hz; \
         {:.0} ms sampled). Files by total time: self is time on one of the file's lines as the \
         innermost Python frame (the native code it runs included), total is time with the \
         file on the stack.</p><table><tr><th>self</th><th>total</th><th class=\"path\">file\
         </th></tr>",
        escape(&run.command),
        escape(&run.mode),
        run.duration_ms / 1000.0,
        run.rate_hz,
        all
    ));
    let ids: HashMap<&String, usize> = order.iter().enumerate().map(|(i, f)| (f.0, i)).collect();
    for (path, file) in &order {
        let id = ids[path];
        index.push_str(&format!(
            "<tr data-file=\"{}\" data-self-ms=\"{:.3}\" data-total-ms=\"{:.3}\"><td>{:.1}%</td>\
             <td>{:.1}%</td><td class=\"path\"><a href=\"f{id}.html\">{}</a></td></tr>",
            escape(path),
            file.time.own,
            file.time.total,
            pct(file.time.own),
            pct(file.time.total),
            escape(path)
        ));
        let source = read_source(path, file.pid);
        let max_own = file.lines.values().map(|t| t.own).fold(0.0, f64::max);
        let mut page = head(&format!("{path}: {title}"));
        page.push_str(&format!(
            "<p><a href=\"index.html\">index</a></p><h2>{}</h2><p>self {:.1}%, \
             total {:.1}%</p>",
            escape(path),
            pct(file.time.own),
            pct(file.time.total)
        ));
        let text: Vec<&str> = match &source {
            Ok(s) => s.lines().collect(),
            Err(why) => {
                page.push_str(&format!(
                    "<p class=\"note\">The source is not shown: {why}. Lines sampled:</p>"
                ));
                Vec::new()
            }
        };
        page.push_str("<table><tr><th>line</th><th>self</th><th>total</th><th></th></tr>");
        let mut row = |n: u32, code: &str| {
            let t = file.lines.get(&n).copied().unwrap_or_default();
            page.push_str(&format!(
                "<tr data-line=\"{n}\" data-self-ms=\"{:.3}\" data-total-ms=\"{:.3}\"><td>{n}</td>\
                 <td{}>{}</td><td>{}</td><td class=\"code\"{}>{}</td></tr>",
                t.own,
                t.total,
                shade(t.own, max_own),
                if t.own > 0.0 {
                    format!("{:.1}%", pct(t.own))
                } else {
                    String::new()
                },
                if t.total > 0.0 {
                    format!("{:.1}%", pct(t.total))
                } else {
                    String::new()
                },
                shade(t.own, max_own),
                escape(code)
            ));
        };
        if text.is_empty() {
            for &n in file.lines.keys() {
                row(n, "");
            }
        } else if id >= WHOLE_FILES || pct(file.time.total) < 1.0 {
            for &n in file.lines.keys() {
                let code = (n as usize).checked_sub(1).and_then(|i| text.get(i));
                row(n, code.copied().unwrap_or(""));
            }
        } else {
            for (i, code) in text.iter().enumerate() {
                row(i as u32 + 1, code);
            }
            // Lines the profile has beyond the text (the file changed since it ran).
            for &n in file.lines.keys().filter(|&&n| n as usize > text.len()) {
                row(n, "");
            }
        }
        page.push_str("</table></body></html>\n");
        out.push((format!("f{id}.html"), page));
    }
    index.push_str("</table></body></html>\n");
    out.insert(0, ("index.html".to_string(), index));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_from_a_target_is_escaped() {
        assert_eq!(
            escape("<script>a&b\"'</script>\u{1b}"),
            "&lt;script&gt;a&amp;b&quot;&#39;&lt;/script&gt;\u{fffd}"
        );
    }

    #[test]
    fn only_regular_files_are_read() {
        assert!(read_source("relative.py", 1).is_err());
        assert_eq!(
            read_source("/dev/null", std::process::id()),
            Err("not a regular file")
        );
        let dir = std::env::temp_dir().join(format!("tachyon-heatmap-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let real = dir.join("real.py");
        std::fs::write(&real, "x = 1\n").unwrap();
        let link = dir.join("link.py");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&real, &link).unwrap();
        assert!(
            read_source(link.to_str().unwrap(), 0).is_err(),
            "a link is not followed"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
