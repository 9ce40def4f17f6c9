//! `tachyon-bpf top`: a live table of the hottest functions across the profiled processes,
//! refreshed every second over a sliding window of the last ten seconds. Keys: `s`/`t`/`g` sort
//! by self time, total time or time waiting for the GIL; `p` cycles the process filter; `q`
//! (or Ctrl-C) quits.

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

/// One refresh interval, aggregated: (process, function label) -> times; per process, its time.
#[derive(Default)]
struct Interval {
    cells: HashMap<(String, String), Cell>,
    process_ms: HashMap<String, f64>,
}

pub struct View {
    intervals: VecDeque<Interval>,
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

/// A function as the table names it.
fn label(p: &Profile, func: usize) -> String {
    let f = &p.funcs[func];
    match (&f.file, f.lib) {
        (Some(file), _) => format!(
            "{} ({}:{})",
            f.name,
            file.rsplit('/').next().unwrap_or(file),
            f.line.unwrap_or(0)
        ),
        (None, Some(l)) => format!("{} [{}]", f.name, p.libs[l].name),
        _ => f.name.to_string(),
    }
}

impl View {
    pub fn new() -> View {
        View {
            intervals: VecDeque::new(),
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
        for st in stack_totals(p) {
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

    /// The table rows: (function, process count, self %, total %, GIL wait %), sorted.
    pub fn rows(&self) -> Vec<(String, usize, f64, f64, f64)> {
        let mut sum: HashMap<&String, (Cell, HashSet<&String>)> = HashMap::new();
        let mut all = 0.0;
        for iv in &self.intervals {
            for (p, t) in &iv.process_ms {
                if self.process.as_ref().is_none_or(|f| f == p) {
                    all += t;
                }
            }
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

    pub fn draw(&self, term: &mut Terminal<CrosstermBackend<Stdout>>) -> std::io::Result<()> {
        let rows = self.rows();
        term.draw(|f| {
            let [head, body, foot] = Layout::vertical([
                Constraint::Length(1),
                Constraint::Min(3),
                Constraint::Length(1),
            ])
            .areas(f.area());
            let sort = match self.sort {
                SortBy::SelfTime => "self",
                SortBy::Total => "total",
                SortBy::GilWait => "GIL wait",
            };
            let filter = self.process.as_deref().unwrap_or("all processes");
            f.render_widget(
                Paragraph::new(format!("{}  |  {filter}  |  sorted by {sort}", self.status)),
                head,
            );
            let table_rows = rows.iter().take(body.height as usize).map(|r| {
                Row::new(vec![
                    format!("{:6.1}", r.2),
                    format!("{:6.1}", r.3),
                    format!("{:6.1}", r.4),
                    format!("{:3}", r.1),
                    r.0.clone(),
                ])
            });
            let table = Table::new(
                table_rows,
                [
                    Constraint::Length(7),
                    Constraint::Length(7),
                    Constraint::Length(7),
                    Constraint::Length(5),
                    Constraint::Min(20),
                ],
            )
            .header(
                Row::new(vec!["%self", "%total", "%GILw", "proc", "function"])
                    .style(Style::default().add_modifier(Modifier::BOLD)),
            )
            .block(Block::default());
            f.render_widget(table, body);
            f.render_widget(
                Paragraph::new(
                    "q quit  s/t/g sort by self/total/GIL wait  p next process (last 10 s)",
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
}
