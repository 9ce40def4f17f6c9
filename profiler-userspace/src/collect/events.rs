//! Lifetime events: forks (new threads and processes), execs and exits.

use super::Collector;
use crate::capture::record::{Event, EventKind};

impl Collector {
    /// A scheduler or lifetime event.
    pub fn handle_event(&mut self, e: Event) {
        let t_ms = self.time_ms(e.time_ns);
        match e.kind {
            EventKind::Fork {
                child_pid,
                child_tid,
            } => {
                self.profile.task_born(child_pid, child_tid, t_ms);
                if child_pid == e.pid {
                    self.python.threads_changed(e.pid);
                }
                if child_pid == child_tid && child_pid != e.pid {
                    // A new process: nothing known about the pid before is valid.
                    self.forget_process(child_pid);
                    self.children.push((child_pid, e.pid));
                }
            }
            EventKind::Exec => {
                self.profile.exec(e.pid, t_ms);
                // The launched command is looked at before its first records are read: if that
                // was after this exec, it is known as the new program already.
                if self.launched != Some(e.pid) || !self.known_since(e.pid, e.time_ns) {
                    self.forget_process(e.pid);
                    self.execs
                        .push((e.pid, crate::python::python_name(&e.comm)));
                }
            }
            EventKind::Exit { group_dead } => {
                if let Some(t) = self
                    .profile
                    .processes
                    .get_mut(&e.pid)
                    .and_then(|p| p.threads.get_mut(&e.tid))
                {
                    if t.name.is_empty() {
                        t.name = e.comm.clone();
                    }
                }
                self.profile.task_exit(e.pid, e.tid, t_ms, group_dead);
                self.python.threads_changed(e.pid);
                if let Some(p) = self.procs.get_mut(&e.pid) {
                    p.suffixes.remove(&e.tid);
                }
            }
        }
    }
}
