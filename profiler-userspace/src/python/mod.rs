//! Python support: finding CPython runtimes, feeding the BPF frame walk, resolving code objects
//! and merging Python frames into native stacks.

use std::collections::HashMap;

use crate::aggregate::{Counters, FrameId, Profile};
use crate::capture::record::RawSample;

/// The Python frames of one sample, grouped by interpreter activation.
pub struct PythonFrames {
    /// Outermost activation first; frames inside one activation root-first.
    pub activations: Vec<Vec<FrameId>>,
    /// `aggregate::state` bits.
    pub state: u8,
}

#[derive(Default)]
pub struct PythonRegistry {
    labels: HashMap<u32, String>,
}

impl PythonRegistry {
    pub fn resolve(&mut self, _s: &RawSample, _profile: &mut Profile) -> Option<PythonFrames> {
        None
    }

    pub fn merge(
        &self,
        native: &[(FrameId, std::sync::Arc<str>)],
        _activations: &[Vec<FrameId>],
        _truncated: bool,
        _counters: &mut Counters,
    ) -> Vec<FrameId> {
        native.iter().map(|(f, _)| *f).collect()
    }

    pub fn process_label(&self, pid: u32) -> Option<String> {
        self.labels.get(&pid).cloned()
    }

    pub fn version_label(&self, _pid: u32) -> Option<String> {
        None
    }
}
