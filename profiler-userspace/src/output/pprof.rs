//! pprof: a gzipped `profile.proto`. The messages are declared here with prost's derive (the
//! schema is small and stable, and this spares the build a protoc step). One pprof sample per
//! thread and stack, labelled with pid, tid, process and thread, the process's identity
//! (`service_name`, `container_id`, `pod_uid`, `systemd_unit`, `--env-label` variables) and the
//! run's `--label`s; values are the sample count (sampling periods) and the time in nanoseconds
//! of the profile's mode.

use std::collections::HashMap;
use std::io::Write;

use prost::Message;

use super::{periods, process_label, stack_totals, RunInfo};
use crate::aggregate::{ProcessData, Profile};

#[derive(Clone, PartialEq, Message)]
pub struct PProfile {
    #[prost(message, repeated, tag = "1")]
    pub sample_type: Vec<ValueType>,
    #[prost(message, repeated, tag = "2")]
    pub sample: Vec<PSample>,
    #[prost(message, repeated, tag = "3")]
    pub mapping: Vec<Mapping>,
    #[prost(message, repeated, tag = "4")]
    pub location: Vec<Location>,
    #[prost(message, repeated, tag = "5")]
    pub function: Vec<Function>,
    #[prost(string, repeated, tag = "6")]
    pub string_table: Vec<String>,
    #[prost(int64, tag = "9")]
    pub time_nanos: i64,
    #[prost(int64, tag = "10")]
    pub duration_nanos: i64,
    #[prost(message, optional, tag = "11")]
    pub period_type: Option<ValueType>,
    #[prost(int64, tag = "12")]
    pub period: i64,
    #[prost(int64, repeated, tag = "13")]
    pub comment: Vec<i64>,
    #[prost(int64, tag = "14")]
    pub default_sample_type: i64,
}

#[derive(Clone, PartialEq, Message)]
pub struct ValueType {
    #[prost(int64, tag = "1")]
    pub r#type: i64,
    #[prost(int64, tag = "2")]
    pub unit: i64,
}

#[derive(Clone, PartialEq, Message)]
pub struct PSample {
    #[prost(uint64, repeated, tag = "1")]
    pub location_id: Vec<u64>,
    #[prost(int64, repeated, tag = "2")]
    pub value: Vec<i64>,
    #[prost(message, repeated, tag = "3")]
    pub label: Vec<Label>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Label {
    #[prost(int64, tag = "1")]
    pub key: i64,
    #[prost(int64, tag = "2")]
    pub str: i64,
    #[prost(int64, tag = "3")]
    pub num: i64,
    #[prost(int64, tag = "4")]
    pub num_unit: i64,
}

#[derive(Clone, PartialEq, Message)]
pub struct Mapping {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(uint64, tag = "2")]
    pub memory_start: u64,
    #[prost(uint64, tag = "3")]
    pub memory_limit: u64,
    #[prost(uint64, tag = "4")]
    pub file_offset: u64,
    #[prost(int64, tag = "5")]
    pub filename: i64,
    #[prost(int64, tag = "6")]
    pub build_id: i64,
    #[prost(bool, tag = "7")]
    pub has_functions: bool,
    #[prost(bool, tag = "8")]
    pub has_filenames: bool,
    #[prost(bool, tag = "9")]
    pub has_line_numbers: bool,
    #[prost(bool, tag = "10")]
    pub has_inline_frames: bool,
}

#[derive(Clone, PartialEq, Message)]
pub struct Location {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(uint64, tag = "2")]
    pub mapping_id: u64,
    #[prost(uint64, tag = "3")]
    pub address: u64,
    #[prost(message, repeated, tag = "4")]
    pub line: Vec<Line>,
    #[prost(bool, tag = "5")]
    pub is_folded: bool,
}

#[derive(Clone, PartialEq, Message)]
pub struct Line {
    #[prost(uint64, tag = "1")]
    pub function_id: u64,
    #[prost(int64, tag = "2")]
    pub line: i64,
}

#[derive(Clone, PartialEq, Message)]
pub struct Function {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(int64, tag = "2")]
    pub name: i64,
    #[prost(int64, tag = "3")]
    pub system_name: i64,
    #[prost(int64, tag = "4")]
    pub filename: i64,
    #[prost(int64, tag = "5")]
    pub start_line: i64,
}

#[derive(Default)]
struct Strings {
    list: Vec<String>,
    ids: HashMap<String, i64>,
}

impl Strings {
    fn new() -> Strings {
        let mut s = Strings::default();
        s.id("");
        s
    }

    fn id(&mut self, v: &str) -> i64 {
        if let Some(&i) = self.ids.get(v) {
            return i;
        }
        let i = self.list.len() as i64;
        self.list.push(v.to_string());
        self.ids.insert(v.to_string(), i);
        i
    }
}

/// The sample value names of a mode: a count, and the time the mode measures.
pub fn time_kind(mode: &str) -> &'static str {
    match mode {
        "cpu" => "cpu",
        "gil" => "gil",
        "exception" => "exception",
        _ => "wall",
    }
}

/// The profile message (tests decode and compare it).
pub fn build(p: &Profile, run: &RunInfo) -> PProfile {
    build_of(p, run, &|_| true)
}

/// The profile message of the processes `keep` takes (a push series' own).
pub fn build_of(p: &Profile, run: &RunInfo, keep: &dyn Fn(&ProcessData) -> bool) -> PProfile {
    let mut s = Strings::new();
    let mut out = header(p, run, &mut s);
    // Each process's labels, as string-table ids (its identity's, then the run's).
    let mut proc_labels: HashMap<(u32, u32), Vec<(i64, i64)>> = HashMap::new();
    let mut ids = Ids::default();
    let (k_pid, k_tid, k_proc, k_thread) =
        (s.id("pid"), s.id("tid"), s.id("process"), s.id("thread"));
    for st in stack_totals(p) {
        let n = periods(st.ms, p.interval_ms);
        if n == 0 || !keep(st.process) {
            continue;
        }
        let locs: Vec<u64> = p
            .stack_root_first(st.stack)
            .into_iter()
            .rev()
            .map(|f| ids.location(&mut out, &mut s, p, f))
            .collect();
        let label = |key: i64, str: i64, num: i64| Label {
            key,
            str,
            num,
            num_unit: 0,
        };
        let proc_name = s.id(&process_label(st.process));
        let thread_name = s.id(st.thread.python_name.as_ref().unwrap_or(&st.thread.name));
        let mut labels = vec![
            label(k_pid, 0, st.process.pid as i64),
            label(k_tid, 0, st.thread.tid as i64),
            label(k_proc, proc_name, 0),
            label(k_thread, thread_name, 0),
        ];
        let process = st.process;
        let own = proc_labels
            .entry((process.pid, process.generation))
            .or_insert_with(|| {
                super::process_labels(process, run)
                    .iter()
                    .map(|(k, v)| (s.id(k), s.id(v)))
                    .collect()
            });
        labels.extend(own.iter().map(|&(k, v)| label(k, v, 0)));
        out.sample.push(PSample {
            location_id: locs,
            value: vec![n as i64, (st.ms * 1e6).round() as i64],
            label: labels,
        });
    }
    out.string_table = s.list;
    out
}

/// The profile's sample types, period, times, comments and mappings (one per library, ids
/// from 1).
fn header(p: &Profile, run: &RunInfo, s: &mut Strings) -> PProfile {
    let kind = time_kind(&run.mode);
    let (samples, count, ns) = (s.id("samples"), s.id("count"), s.id("nanoseconds"));
    let time = s.id(kind);
    let mut out = PProfile {
        sample_type: vec![
            ValueType {
                r#type: samples,
                unit: count,
            },
            ValueType {
                r#type: time,
                unit: ns,
            },
        ],
        time_nanos: (run.start_epoch_ms * 1e6) as i64,
        duration_nanos: (run.duration_ms * 1e6) as i64,
        period_type: Some(ValueType {
            r#type: time,
            unit: ns,
        }),
        period: (p.interval_ms * 1e6).round() as i64,
        default_sample_type: time,
        ..Default::default()
    };
    out.comment = vec![
        s.id(&format!("tachyon-bpf {}", env!("CARGO_PKG_VERSION"))),
        s.id(&format!("mode={} rate={}Hz", run.mode, run.rate_hz)),
        s.id(&run.command),
    ];
    if !run.host.is_empty() {
        out.comment.push(s.id(&format!("host={}", run.host)));
    }
    // Mappings: one per library, ids from 1.
    for (i, lib) in p.libs.iter().enumerate() {
        out.mapping.push(Mapping {
            id: i as u64 + 1,
            filename: s.id(&lib.path),
            build_id: lib.build_id.as_deref().map_or(0, |b| s.id(b)),
            has_functions: true,
            ..Default::default()
        });
    }
    out
}

/// Functions and locations: ids from 1, only those samples use.
#[derive(Default)]
struct Ids {
    funcs: HashMap<usize, u64>,
    locs: HashMap<usize, u64>,
}

impl Ids {
    /// The location id of frame `f`, added (with its function) on first use.
    fn location(&mut self, out: &mut PProfile, s: &mut Strings, p: &Profile, f: usize) -> u64 {
        if let Some(&id) = self.locs.get(&f) {
            return id;
        }
        let fr = &p.frames[f];
        let func = &p.funcs[fr.func];
        let fid = match self.funcs.get(&fr.func) {
            Some(&id) => id,
            None => {
                let id = out.function.len() as u64 + 1;
                let name = s.id(&func.name);
                out.function.push(Function {
                    id,
                    name,
                    system_name: name,
                    filename: func.file.as_deref().map(|f| s.id(f)).unwrap_or(0),
                    start_line: func.line.unwrap_or(0) as i64,
                });
                self.funcs.insert(fr.func, id);
                id
            }
        };
        let id = out.location.len() as u64 + 1;
        out.location.push(Location {
            id,
            mapping_id: func.lib.map(|l| l as u64 + 1).unwrap_or(0),
            address: fr.address.unwrap_or(0),
            line: vec![Line {
                function_id: fid,
                line: fr.line.unwrap_or(0) as i64,
            }],
            is_folded: false,
        });
        self.locs.insert(f, id);
        id
    }
}

pub fn to_bytes(p: &Profile, run: &RunInfo) -> Result<Vec<u8>, super::Error> {
    gzipped(&build(p, run))
}

/// The gzipped pprof of the processes `keep` takes.
pub fn to_bytes_of(
    p: &Profile,
    run: &RunInfo,
    keep: &dyn Fn(&ProcessData) -> bool,
) -> Result<Vec<u8>, super::Error> {
    gzipped(&build_of(p, run, keep))
}

fn gzipped(m: &PProfile) -> Result<Vec<u8>, super::Error> {
    let raw = m.encode_to_vec();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&raw)
        .map_err(|e| super::Error::encode("pprof", e))?;
    gz.finish().map_err(|e| super::Error::encode("pprof", e))
}
