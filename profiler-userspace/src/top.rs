//! `tachyon-bpf top`: a live table of the hottest functions across the profiled processes,
//! refreshed every second over a sliding window of the last ten seconds. It opens on Python
//! functions (`output::functions`): self and total time, and how the total splits into on CPU,
//! off CPU and waiting for the GIL; native code no Python frame is above keeps native rows,
//! labelled with its process. Keys: `n` switches to every function (native and kernel
//! included) and back; up/down select a row and Enter shows the native code it runs most;
//! `s`/`t`/`g` sort by self time, total time or time waiting for the GIL; `p` cycles the process
//! filter; `q` (or Ctrl-C) quits.

use std::collections::{HashMap, HashSet, VecDeque};
use std::io::Stdout;

use ratatui::backend::CrosstermBackend;
use ratatui::crossterm::event::{self, Event, KeyEventKind};
pub use ratatui::crossterm::event::{KeyCode, KeyModifiers};
use ratatui::crossterm::terminal;
use ratatui::crossterm::ExecutableCommand;
use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Modifier, Style};
use ratatui::widgets::{Block, Paragraph, Row, Table};
use ratatui::Terminal;

use crate::aggregate::{state, Profile};
use crate::output::functions::{self, Split};
use crate::output::{process_label, stack_totals};

/// Seconds of history the table shows.
const WINDOW: usize = 10;
/// Functions kept per interval (the rest are summed as a remainder, so memory stays bounded).
const PER_INTERVAL: usize = 2000;

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum SortBy {
    SelfTime,
    Total,
    GilWait,
}

/// What one interval says about one function in one process.
#[derive(Clone, Default)]
struct Cell {
    self_ms: f64,
    total_ms: f64,
    gil_wait_ms: f64,
}

/// A row of the Python view in one interval and process.
#[derive(Clone, Default)]
struct PyCell {
    python: bool,
    self_time: Split,
    total: Split,
    /// The native code it ran most (innermost native frame under it): label -> ms on CPU.
    callees: Vec<(String, f64)>,
}

/// Native callees kept per row and interval.
const CALLEES: usize = 5;

/// One refresh interval, aggregated: (process, function label) -> times; per process, its time.
#[derive(Default)]
struct Interval {
    cells: HashMap<(String, String), Cell>,
    /// The Python view: (process, row label) -> times.
    py: HashMap<(String, String), PyCell>,
    process_ms: HashMap<String, f64>,
    /// Threads sampled: (pid, tid).
    threads: HashSet<(u32, u32)>,
}

/// A row of the Python view, over the window.
#[derive(Clone, Debug, Default)]
pub struct PyRow {
    pub label: String,
    pub python: bool,
    /// Percentages of all the window's time.
    pub self_pct: f64,
    pub total_pct: f64,
    /// The total's split, in percent of the row's total: on CPU, off CPU, waiting for the GIL.
    pub on: f64,
    pub off: f64,
    pub gil: f64,
    /// The native code it ran most, with its share of the row's time on CPU.
    pub callees: Vec<(String, f64)>,
}

pub struct View {
    intervals: VecDeque<Interval>,
    /// The Python view (else every function, native and kernel included).
    pub python: bool,
    /// The selected row of the table, and whether its detail line is shown.
    pub selected: usize,
    pub detail: bool,
    pub sort: SortBy,
    /// None: every process; Some(label): that one.
    pub process: Option<String>,
    pub quit: bool,
    status: String,
}

impl Default for View {
    fn default() -> Self {
        View::new()
    }
}

use functions::label;

impl View {
    pub fn new() -> View {
        View {
            intervals: VecDeque::new(),
            python: true,
            selected: 0,
            detail: false,
            sort: SortBy::SelfTime,
            process: None,
            quit: false,
            status: String::new(),
        }
    }

    /// Takes in a finished interval profile.
    pub fn add(&mut self, p: &Profile, status: String) {
        let mut iv = Interval::default();
        // Time waiting for the GIL per stack, from the samples' states.
        let mut waits: HashMap<(u32, u32, usize), f64> = HashMap::new();
        for proc_ in p.all_processes() {
            for t in proc_.threads.values() {
                for s in t.samples.iter().filter(|s| s.in_mode) {
                    if let (Some(st), true) = (s.stack, s.state & state::GIL_WAIT != 0) {
                        *waits.entry((proc_.pid, t.tid, st)).or_default() += s.weight_ms;
                    }
                }
            }
        }
        let mut seen = HashSet::new();
        let mut labels: HashMap<usize, String> = HashMap::new();
        // Threads only: an event loop's suspended tasks (`--async-aware all`) are wall time
        // no thread spent, which the columns' split would misstate.
        for st in stack_totals(p)
            .into_iter()
            .filter(|st| !st.thread.is_task_view())
        {
            let proc_label = process_label(st.process);
            *iv.process_ms.entry(proc_label.clone()).or_default() += st.ms;
            let wait = waits
                .get(&(st.process.pid, st.thread.tid, st.stack))
                .copied()
                .unwrap_or(0.0);
            let frames = p.stack_root_first(st.stack);
            seen.clear();
            for (i, &f) in frames.iter().enumerate() {
                let func = p.frames[f].func;
                if !seen.insert(func) {
                    continue;
                }
                let name = labels.entry(func).or_insert_with(|| label(p, func));
                let c = iv
                    .cells
                    .entry((proc_label.clone(), name.clone()))
                    .or_default();
                c.total_ms += st.ms;
                c.gil_wait_ms += wait;
                if i + 1 == frames.len() {
                    c.self_ms += st.ms;
                }
            }
        }
        // Per process, for the process filter; rows add up over processes when drawn.
        let fv = functions::view_of(p, true, |t| !t.is_task_view());
        iv.threads = fv.threads;
        for r in fv.rows {
            let mut callees: Vec<(String, f64)> = r.native_callees.into_iter().collect();
            callees.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
            callees.truncate(CALLEES);
            let c = iv
                .py
                .entry((r.process.unwrap_or_default(), r.label))
                .or_default();
            c.python = r.python;
            c.self_time.merge(&r.self_time);
            c.total.merge(&r.total);
            c.callees = callees;
        }
        if iv.py.len() > PER_INTERVAL {
            let mut v: Vec<_> = iv.py.into_iter().collect();
            v.sort_by(|a, b| b.1.total.total().total_cmp(&a.1.total.total()));
            v.truncate(PER_INTERVAL);
            iv.py = v.into_iter().collect();
        }
        if iv.cells.len() > PER_INTERVAL {
            let mut v: Vec<_> = iv.cells.into_iter().collect();
            v.sort_by(|a, b| b.1.total_ms.total_cmp(&a.1.total_ms));
            v.truncate(PER_INTERVAL);
            iv.cells = v.into_iter().collect();
        }
        self.intervals.push_back(iv);
        while self.intervals.len() > WINDOW {
            self.intervals.pop_front();
        }
        self.status = status;
    }

    /// The processes seen in the window, busiest first.
    fn processes(&self) -> Vec<String> {
        let mut ms: HashMap<&String, f64> = HashMap::new();
        for iv in &self.intervals {
            for (p, t) in &iv.process_ms {
                *ms.entry(p).or_default() += t;
            }
        }
        let mut v: Vec<(&String, f64)> = ms.into_iter().collect();
        v.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(b.0)));
        v.into_iter().map(|(p, _)| p.clone()).collect()
    }

    /// Processes and threads sampled in the window.
    pub fn sampled(&self) -> (usize, usize) {
        let threads: HashSet<&(u32, u32)> =
            self.intervals.iter().flat_map(|i| &i.threads).collect();
        let pids: HashSet<u32> = threads.iter().map(|t| t.0).collect();
        (pids.len(), threads.len())
    }

    /// The window's time, of the filtered process or of all.
    fn window_ms(&self) -> f64 {
        self.intervals
            .iter()
            .flat_map(|iv| &iv.process_ms)
            .filter(|(p, _)| self.process.as_ref().is_none_or(|f| f == *p))
            .map(|(_, t)| t)
            .sum()
    }

    /// The Python view's rows, sorted.
    pub fn python_rows(&self) -> Vec<PyRow> {
        struct Acc<'a> {
            python: bool,
            self_time: Split,
            total: Split,
            procs: HashSet<&'a String>,
            callees: HashMap<&'a String, f64>,
        }
        let mut sum: HashMap<&String, Acc> = HashMap::new();
        let all = self.window_ms();
        for iv in &self.intervals {
            for ((p, f), c) in &iv.py {
                if self.process.as_ref().is_some_and(|want| want != p) {
                    continue;
                }
                let e = sum.entry(f).or_insert_with(|| Acc {
                    python: c.python,
                    self_time: Split::default(),
                    total: Split::default(),
                    procs: HashSet::new(),
                    callees: HashMap::new(),
                });
                e.self_time.merge(&c.self_time);
                e.total.merge(&c.total);
                e.procs.insert(p);
                for (l, ms) in &c.callees {
                    *e.callees.entry(l).or_default() += ms;
                }
            }
        }
        if all <= 0.0 {
            return Vec::new();
        }
        let pct = |x: f64| 100.0 * x / all;
        let mut rows: Vec<PyRow> = sum
            .into_iter()
            .map(|(label, a)| {
                let (on, off, gil) = a.total.shares();
                let on_cpu = a.total.on_cpu.max(1e-9);
                let mut callees: Vec<(String, f64)> = a
                    .callees
                    .into_iter()
                    .map(|(l, ms)| (l.clone(), 100.0 * ms / on_cpu))
                    .collect();
                callees.sort_by(|x, y| y.1.total_cmp(&x.1).then_with(|| x.0.cmp(&y.0)));
                callees.truncate(3);
                // A native row names its process (there is one unless filtered otherwise).
                let label = match (a.python, a.procs.iter().next()) {
                    (false, Some(p)) if a.procs.len() == 1 && self.process.is_none() => {
                        format!("{label} in {p}")
                    }
                    _ => label.clone(),
                };
                PyRow {
                    label,
                    python: a.python,
                    self_pct: pct(a.self_time.total()),
                    total_pct: pct(a.total.total()),
                    on,
                    off,
                    gil,
                    callees,
                }
            })
            .collect();
        let key = |r: &PyRow| match self.sort {
            SortBy::SelfTime => r.self_pct,
            SortBy::Total => r.total_pct,
            SortBy::GilWait => r.gil * r.total_pct,
        };
        rows.sort_by(|a, b| {
            key(b)
                .total_cmp(&key(a))
                .then_with(|| a.label.cmp(&b.label))
        });
        rows
    }

    /// The table rows: (function, process count, self %, total %, GIL wait %), sorted.
    pub fn rows(&self) -> Vec<(String, usize, f64, f64, f64)> {
        let mut sum: HashMap<&String, (Cell, HashSet<&String>)> = HashMap::new();
        let all = self.window_ms();
        for iv in &self.intervals {
            for ((p, f), c) in &iv.cells {
                if self.process.as_ref().is_some_and(|want| want != p) {
                    continue;
                }
                let e = sum.entry(f).or_default();
                e.0.self_ms += c.self_ms;
                e.0.total_ms += c.total_ms;
                e.0.gil_wait_ms += c.gil_wait_ms;
                e.1.insert(p);
            }
        }
        if all <= 0.0 {
            return Vec::new();
        }
        let pct = |x: f64| 100.0 * x / all;
        let mut rows: Vec<(String, usize, f64, f64, f64)> = sum
            .into_iter()
            .map(|(f, (c, ps))| {
                (
                    f.clone(),
                    ps.len(),
                    pct(c.self_ms),
                    pct(c.total_ms),
                    pct(c.gil_wait_ms),
                )
            })
            .collect();
        let key = |r: &(String, usize, f64, f64, f64)| match self.sort {
            SortBy::SelfTime => r.2,
            SortBy::Total => r.3,
            SortBy::GilWait => r.4,
        };
        rows.sort_by(|a, b| key(b).total_cmp(&key(a)).then_with(|| a.0.cmp(&b.0)));
        rows
    }

    pub fn key(&mut self, code: KeyCode, modifiers: KeyModifiers) {
        match code {
            KeyCode::Char('q') | KeyCode::Esc => self.quit = true,
            KeyCode::Char('c') if modifiers.contains(KeyModifiers::CONTROL) => self.quit = true,
            KeyCode::Char('n') => {
                self.python = !self.python;
                self.selected = 0;
            }
            KeyCode::Down => self.selected = self.selected.saturating_add(1),
            KeyCode::Up => self.selected = self.selected.saturating_sub(1),
            KeyCode::Enter => self.detail = !self.detail,
            KeyCode::Char('s') => self.sort = SortBy::SelfTime,
            KeyCode::Char('t') => self.sort = SortBy::Total,
            KeyCode::Char('g') => self.sort = SortBy::GilWait,
            KeyCode::Char('p') => {
                let procs = self.processes();
                self.process = match &self.process {
                    None => procs.first().cloned(),
                    Some(cur) => {
                        let i = procs.iter().position(|p| p == cur);
                        i.and_then(|i| procs.get(i + 1).cloned())
                    }
                };
            }
            _ => {}
        }
    }

    /// The lines of the table as drawn: the header line, then one line per row (the detail
    /// line of the selected row, when shown, is the last).
    fn table(&self) -> (Vec<&'static str>, Vec<Vec<String>>, Option<String>) {
        if !self.python {
            let rows = self
                .rows()
                .into_iter()
                .map(|r| {
                    vec![
                        format!("{:6.1}", r.2),
                        format!("{:6.1}", r.3),
                        format!("{:6.1}", r.4),
                        format!("{:3}", r.1),
                        r.0,
                    ]
                })
                .collect();
            return (
                vec!["%self", "%total", "%GILw", "proc", "function"],
                rows,
                None,
            );
        }
        let rows = self.python_rows();
        let detail = rows.get(self.selected).filter(|_| self.detail).map(|r| {
            if r.callees.is_empty() {
                format!("{}: no native code of its own on CPU", r.label)
            } else {
                let c: Vec<String> = r
                    .callees
                    .iter()
                    .map(|(l, share)| format!("{l} {share:.0}%"))
                    .collect();
                format!("{} runs on CPU: {}", r.label, c.join(", "))
            }
        });
        let lines = rows
            .into_iter()
            .map(|r| {
                vec![
                    format!("{:6.1}", r.self_pct),
                    format!("{:6.1}", r.total_pct),
                    format!("{:5.0}", r.on),
                    format!("{:5.0}", r.off),
                    format!("{:5.0}", r.gil),
                    r.label,
                ]
            })
            .collect();
        (
            vec![
                "%self",
                "%total",
                "%cpu",
                "%off",
                "%GIL",
                "function (%cpu/%off/%GIL of its total)",
            ],
            lines,
            detail,
        )
    }

    pub fn draw(&self, term: &mut Terminal<CrosstermBackend<Stdout>>) -> std::io::Result<()> {
        let (header, rows, detail) = self.table();
        let (procs, threads) = self.sampled();
        term.draw(|f| {
            let [head, body, info, foot] = Layout::vertical([
                Constraint::Length(1),
                Constraint::Min(3),
                Constraint::Length(u16::from(detail.is_some())),
                Constraint::Length(1),
            ])
            .areas(f.area());
            let sort = match self.sort {
                SortBy::SelfTime => "self",
                SortBy::Total => "total",
                SortBy::GilWait => "GIL wait",
            };
            let filter = self.process.as_deref().unwrap_or("all processes");
            let view = if self.python { "Python" } else { "all functions" };
            f.render_widget(
                Paragraph::new(format!(
                    "{}, {procs} processes, {threads} threads  |  {view}  |  {filter}  |  sorted by {sort}",
                    self.status
                )),
                head,
            );
            let widths: Vec<Constraint> = header
                .iter()
                .enumerate()
                .map(|(i, _)| {
                    if i + 1 == header.len() {
                        Constraint::Min(20)
                    } else {
                        Constraint::Length(7)
                    }
                })
                .collect();
            let selected = self.selected.min(rows.len().saturating_sub(1));
            let table_rows = rows
                .into_iter()
                .enumerate()
                .take(body.height as usize)
                .map(|(i, r)| {
                    let row = Row::new(r);
                    if i == selected {
                        row.style(Style::default().add_modifier(Modifier::REVERSED))
                    } else {
                        row
                    }
                });
            let table = Table::new(table_rows, widths)
                .header(Row::new(header).style(Style::default().add_modifier(Modifier::BOLD)))
                .block(Block::default());
            f.render_widget(table, body);
            if let Some(d) = &detail {
                f.render_widget(Paragraph::new(d.as_str()), info);
            }
            f.render_widget(
                Paragraph::new(
                    "q quit  n Python/all functions  up/down/Enter native code of a row  \
                     s/t/g sort by self/total/GIL wait  p next process (last 10 s)",
                ),
                foot,
            );
        })?;
        Ok(())
    }
}

/// The terminal in raw mode on the alternate screen, restored when dropped (also on errors).
pub struct Screen {
    pub term: Terminal<CrosstermBackend<Stdout>>,
}

impl Screen {
    pub fn enter() -> std::io::Result<Screen> {
        terminal::enable_raw_mode()?;
        let mut out = std::io::stdout();
        out.execute(terminal::EnterAlternateScreen)?;
        let term = Terminal::new(CrosstermBackend::new(out))?;
        Ok(Screen { term })
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        let _ = terminal::disable_raw_mode();
        let _ = std::io::stdout().execute(terminal::LeaveAlternateScreen);
    }
}

/// Reads key presses on a thread of its own and sends them on.
pub fn keys() -> tokio::sync::mpsc::UnboundedReceiver<(KeyCode, KeyModifiers)> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || loop {
        match event::read() {
            Ok(Event::Key(k)) if k.kind == KeyEventKind::Press => {
                if tx.send((k.code, k.modifiers)).is_err() {
                    return;
                }
            }
            Ok(_) => {}
            Err(_) => return,
        }
    });
    rx
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::Mode;
    use crate::output::fixture;

    #[test]
    fn rows_sort_and_filter() {
        let (p, _) = fixture::profile(Mode::Wall);
        let mut v = View::new();
        v.add(&p, String::new());
        let rows = v.rows();
        assert_eq!(rows[0].0, "schedule [[kernel.kallsyms]]");
        assert!((rows[0].2 - 50.0).abs() < 0.01);
        v.key(KeyCode::Char('t'), KeyModifiers::NONE);
        let rows = v.rows();
        assert_eq!(rows[0].0, "_start [libpython3.12.so.1.0]");
        v.key(KeyCode::Char('p'), KeyModifiers::NONE);
        assert_eq!(
            v.process.as_deref(),
            Some("app.py (Python 3.12.1) [pid 100]")
        );
        assert!(v.rows().iter().all(|r| r.0 != "crunch;loop [app]"));
        v.key(KeyCode::Char('q'), KeyModifiers::NONE);
        assert!(v.quit);
    }

    #[test]
    fn the_python_view_comes_first_with_each_rows_split() {
        let (p, _) = fixture::profile(Mode::Wall);
        let mut v = View::new();
        v.add(&p, String::new());
        assert!(v.python);
        assert_eq!(v.sampled(), (2, 3));
        let rows = v.python_rows();
        let labels: Vec<&str> = rows.iter().map(|r| r.label.as_str()).take(3).collect();
        assert_eq!(
            labels,
            [
                "main (app.py:10)",
                "work (app.py:20)",
                "crunch;loop [app] in app [pid 200]"
            ]
        );
        let main = &rows[0];
        assert!((main.self_pct - 50.0).abs() < 0.01);
        assert!((main.total_pct - 82.14).abs() < 0.01);
        assert!((main.on - 39.13).abs() < 0.01 && (main.off - 60.87).abs() < 0.01);
        assert_eq!(main.gil, 0.0);
        // Enter shows the selected row's native code; `n` switches to every function.
        v.key(KeyCode::Down, KeyModifiers::NONE);
        v.key(KeyCode::Enter, KeyModifiers::NONE);
        let (_, _, detail) = v.table();
        assert_eq!(
            detail.as_deref(),
            Some("work (app.py:20): no native code of its own on CPU")
        );
        v.key(KeyCode::Char('n'), KeyModifiers::NONE);
        let (header, rows, _) = v.table();
        assert_eq!(header[2], "%GILw");
        assert_eq!(rows[0][4], "schedule [[kernel.kallsyms]]");
    }
}
