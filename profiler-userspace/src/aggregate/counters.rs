//! The profile's counters: what the summary shows and the profile's metadata stores.

use serde::{Deserialize, Serialize};

/// Counters shown in the summary and stored in the profile's metadata.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Counters {
    /// Timer samples of threads on a CPU.
    pub samples: u64,
    /// Records a thread sent as it left the CPU (its stack at the moment it blocked): not
    /// samples, but each stands for the off-CPU time until the thread ran again.
    pub offcpu_captures: u64,
    pub bad_records: u64,
    pub native_truncated: u64,
    pub kernel_only: u64,
    /// Records (timer samples and off-CPU captures) of threads with a Python thread state.
    pub py_samples: u64,
    pub py_merged: u64,
    pub py_merge_mismatch: u64,
    pub py_unresolved_frames: u64,
    pub py_thread_miss: u64,
    pub py_read_failed: u64,
    pub py_truncated: u64,
    /// Samples whose frame chain looped back on itself (a corrupt interpreter).
    pub py_cycles: u64,
    /// Python frames whose line table was corrupt (shown at the function's first line).
    pub py_bad_line_tables: u64,
    /// `--async-aware`: samples shown from the running asyncio task, samples whose running
    /// task did not match their frames (shown plain), and await chains cut short (a cycle, a
    /// task that did not read, or the depth bound).
    pub py_async_samples: u64,
    pub py_async_mismatch: u64,
    pub py_async_cut: u64,
    /// `--async-aware all`: samples of suspended tasks.
    pub py_async_suspended: u64,
    /// Reads of a process's mappings made because its executable pages changed (a library
    /// loaded: `SAMPLE_MAPS_CHANGED`).
    pub maps_read_on_load: u64,
    /// The longest and the latest wait of a sample in the ring buffer before it was read (ms):
    /// how far the reader fell behind.
    pub max_lag_ms: f64,
    pub last_lag_ms: f64,
}

impl Counters {
    /// Adds `other`'s counts, a later part of the same run (a continuous run's next interval):
    /// the longest wait is the longer one, the latest is `other`'s. Every field is named, so a
    /// new counter cannot be left out.
    pub fn add(&mut self, other: &Counters) {
        let Counters {
            samples,
            offcpu_captures,
            bad_records,
            native_truncated,
            kernel_only,
            py_samples,
            py_merged,
            py_merge_mismatch,
            py_unresolved_frames,
            py_thread_miss,
            py_read_failed,
            py_truncated,
            py_cycles,
            py_bad_line_tables,
            py_async_samples,
            py_async_mismatch,
            py_async_cut,
            py_async_suspended,
            maps_read_on_load,
            max_lag_ms,
            last_lag_ms,
        } = other;
        self.samples += samples;
        self.offcpu_captures += offcpu_captures;
        self.bad_records += bad_records;
        self.native_truncated += native_truncated;
        self.kernel_only += kernel_only;
        self.py_samples += py_samples;
        self.py_merged += py_merged;
        self.py_merge_mismatch += py_merge_mismatch;
        self.py_unresolved_frames += py_unresolved_frames;
        self.py_thread_miss += py_thread_miss;
        self.py_read_failed += py_read_failed;
        self.py_truncated += py_truncated;
        self.py_cycles += py_cycles;
        self.py_bad_line_tables += py_bad_line_tables;
        self.py_async_samples += py_async_samples;
        self.py_async_mismatch += py_async_mismatch;
        self.py_async_cut += py_async_cut;
        self.py_async_suspended += py_async_suspended;
        self.maps_read_on_load += maps_read_on_load;
        self.max_lag_ms = self.max_lag_ms.max(*max_lag_ms);
        self.last_lag_ms = *last_lag_ms;
    }
}
