//! Recordings (`tachyon-bpf record`): the finished, symbolized profile of a run with its run
//! information, as gzipped JSON in a versioned schema of its own (`docs/recording.md`). Everything a format needs is resolved before it is stored
//! (native symbols, Python names and lines, process and thread names), so `convert` needs
//! neither root nor the processes, and writes with the same code as a live run.

use std::io::{BufReader, Read, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};

use std::sync::Arc;

use super::{Error, ErrorKind, RunInfo};
use crate::aggregate::identity::{Identity, ServiceSource};
use crate::aggregate::{
    Category, Counters, Frame, Func, Lib, Marker, Mode, Opcode, ProcessData, Profile,
    RecordingError, Sample, ThreadData, MARKER_NAMES,
};

const FORMAT: &str = "tachyon-bpf recording";
/// The version written. Version 1 (the first release's recordings, a dump of the profiler's
/// internal profile), version 2 (version 3's schema without the `Exception` category and
/// markers) and version 3 (version 4's without processes' identities, the host and the run's
/// labels) are still read; see `docs/recording.md`.
const VERSION: u32 = 4;

// ---- Version 2: the recording's own schema (docs/recording.md). Tables are columns; ids are
// indexes into them; categories and marker names are stored by their display names. Nothing
// here is an internal type, so the profiler's own structures can change without changing it.

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct V2 {
    format: String,
    version: u32,
    run: V2Run,
    mode: String,
    interval_ms: f64,
    end_ms: f64,
    /// The profile's counters by name (unknown names are ignored on reading).
    counters: std::collections::BTreeMap<String, f64>,
    libs: Vec<V2Lib>,
    funcs: V2Funcs,
    frames: V2Frames,
    stacks: V2Stacks,
    processes: Vec<V2Process>,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct V2Run {
    run_id: String,
    start_epoch_ms: f64,
    interval_ms: f64,
    duration_ms: f64,
    mode: String,
    rate_hz: u64,
    command: String,
    lost: u64,
    cpus: u32,
    #[serde(default)]
    cost: Option<V2Cost>,
    #[serde(default)]
    kernel: Option<V2Kernel>,
    #[serde(default)]
    bpf_counters: Vec<(String, u64)>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    async_aware: Option<String>,
    /// Version 4: the host's name and the run's own labels (`--label`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    host: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    labels: Vec<(String, String)>,
}

/// Version 4: who a process is in a fleet (`aggregate::identity::Identity`).
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct V4Identity {
    service: String,
    /// otel, pyroscope, systemd, container or program.
    service_source: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    container_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pod_uid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    systemd_unit: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cgroup: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ns_pid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    executable: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    env: Vec<(String, String)>,
}

impl V4Identity {
    fn from(i: &Identity) -> V4Identity {
        V4Identity {
            service: i.service.clone(),
            service_source: i.service_source.name().into(),
            container_id: i.container_id.clone(),
            pod_uid: i.pod_uid.clone(),
            systemd_unit: i.systemd_unit.clone(),
            cgroup: i.cgroup.clone(),
            ns_pid: i.ns_pid,
            executable: i.executable.clone(),
            env: i.env.clone(),
        }
    }

    fn into_identity(self) -> Identity {
        Identity {
            service: self.service,
            service_source: ServiceSource::from_name(&self.service_source),
            container_id: self.container_id,
            pod_uid: self.pod_uid,
            systemd_unit: self.systemd_unit,
            cgroup: self.cgroup,
            ns_pid: self.ns_pid,
            executable: self.executable,
            env: self.env,
        }
    }
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct V2Cost {
    user_cpu_ms: f64,
    bpf_ms: Option<f64>,
    bpf_runs: u64,
    peak_rss_kib: u64,
}

#[derive(Serialize, Deserialize)]
struct V2Kernel {
    release: String,
    programs: String,
}

#[derive(Serialize, Deserialize)]
struct V2Lib {
    name: String,
    path: String,
    /// Version 4: its GNU build id in hex.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    build_id: Option<String>,
    /// Version 4: the Python interpreter's own code (absent: by the name rule of older
    /// versions, `interpreter_by_name`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    interpreter: Option<bool>,
}

/// How recordings before version 4 (which did not store it) tell the interpreter's own code:
/// libpython, or a statically linked `python3.X`, by file name. Frozen with those versions.
fn interpreter_by_name(name: &str) -> bool {
    name.starts_with("libpython") || name.starts_with("python")
}

#[derive(Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct V2Funcs {
    name: Vec<String>,
    file: Vec<Option<String>>,
    line: Vec<Option<u32>>,
    lib: Vec<Option<usize>>,
    category: Vec<String>,
    is_python: Vec<bool>,
}

#[derive(Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct V2Frames {
    func: Vec<usize>,
    line: Vec<Option<u32>>,
    address: Vec<Option<u64>>,
    symbol_address: Vec<Option<u64>>,
    category: Vec<String>,
    /// With `--opcodes`: each frame's instruction and, for a specialized one, its base
    /// instruction. Absent from recordings made without it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    opcode: Vec<Option<String>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    opcode_base: Vec<Option<String>>,
}

#[derive(Default, Serialize, Deserialize)]
struct V2Stacks {
    frame: Vec<usize>,
    prefix: Vec<Option<usize>>,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct V2Process {
    pid: u32,
    name: String,
    python: Option<String>,
    first_ms: f64,
    last_ms: f64,
    start_ms: Option<f64>,
    end_ms: Option<f64>,
    generation: u32,
    /// Ended by an exec, or its pid was reused, during the run.
    retired: bool,
    /// Version 4.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    identity: Option<V4Identity>,
    threads: Vec<V2Thread>,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct V2Thread {
    tid: u32,
    name: String,
    /// `threading.Thread.name` (absent in recordings that did not read it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    python_name: Option<String>,
    first_ms: f64,
    last_ms: f64,
    start_ms: Option<f64>,
    end_ms: Option<f64>,
    samples: V2Samples,
    markers: V2Markers,
}

#[derive(Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct V2Samples {
    time_ms: Vec<f64>,
    stack: Vec<Option<usize>>,
    state: Vec<u8>,
    weight_ms: Vec<f64>,
    in_mode: Vec<bool>,
    cpu_delta_us: Vec<f64>,
}

#[derive(Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct V2Markers {
    name: Vec<String>,
    category: Vec<String>,
    start_ms: Vec<f64>,
    end_ms: Vec<f64>,
}

fn category_name(c: Category) -> String {
    Category::ALL
        .iter()
        .find(|e| e.0 == c)
        .map_or("Other", |e| e.1)
        .to_string()
}

fn category_of(name: &str) -> Result<Category, RecordingError> {
    Category::ALL
        .iter()
        .find(|e| e.1 == name)
        .map(|e| e.0)
        .ok_or_else(|| RecordingError::Unknown("category", name.to_string()))
}

/// The counters a recording stores, by name: (name, getter, setter) over `Counters`.
macro_rules! counter_fields {
    ($($f:ident),*; $($opt:ident),*) => {
        fn counters_out(c: &Counters) -> std::collections::BTreeMap<String, f64> {
            let mut m = std::collections::BTreeMap::new();
            $( m.insert(stringify!($f).to_string(), c.$f as f64); )*
            // Counters added after version 3: written when they counted something, so that
            // recordings of runs without them are what version 3 always wrote.
            $( if c.$opt != 0 { m.insert(stringify!($opt).to_string(), c.$opt as f64); } )*
            m
        }
        fn counters_in(m: &std::collections::BTreeMap<String, f64>) -> Counters {
            let mut c = Counters::default();
            $( if let Some(&v) = m.get(stringify!($f)) { c.$f = v as _; } )*
            $( if let Some(&v) = m.get(stringify!($opt)) { c.$opt = v as _; } )*
            c
        }
    };
}
counter_fields!(
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
    max_lag_ms,
    last_lag_ms;
    py_async_samples,
    py_async_mismatch,
    py_async_cut,
    py_async_suspended,
    maps_read_on_load
);

fn v2_process(p: &ProcessData, retired: bool) -> V2Process {
    V2Process {
        pid: p.pid,
        name: p.name.clone(),
        python: p.python.clone(),
        first_ms: p.first_ms,
        last_ms: p.last_ms,
        start_ms: p.start_ms,
        end_ms: p.end_ms,
        generation: p.generation,
        retired,
        identity: p.identity.as_ref().map(V4Identity::from),
        threads: p
            .threads
            .values()
            .map(|t| {
                let mut samples = V2Samples::default();
                for s in &t.samples {
                    samples.time_ms.push(s.time_ms);
                    samples.stack.push(s.stack);
                    samples.state.push(s.state);
                    samples.weight_ms.push(s.weight_ms);
                    samples.in_mode.push(s.in_mode);
                    samples.cpu_delta_us.push(s.cpu_delta_us);
                }
                let mut markers = V2Markers::default();
                for m in &t.markers {
                    markers.name.push(m.name.to_string());
                    markers.category.push(category_name(m.category));
                    markers.start_ms.push(m.start_ms);
                    markers.end_ms.push(m.end_ms);
                }
                V2Thread {
                    tid: t.tid,
                    name: t.name.clone(),
                    python_name: t.python_name.clone(),
                    first_ms: t.first_ms,
                    last_ms: t.last_ms,
                    start_ms: t.start_ms,
                    end_ms: t.end_ms,
                    samples,
                    markers,
                }
            })
            .collect(),
    }
}

fn to_v2(p: &Profile, run: &RunInfo) -> V2 {
    let mut funcs = V2Funcs::default();
    for f in &p.funcs {
        funcs.name.push(f.name.to_string());
        funcs.file.push(f.file.as_deref().map(str::to_string));
        funcs.line.push(f.line);
        funcs.lib.push(f.lib);
        funcs.category.push(category_name(f.category));
        funcs.is_python.push(f.is_python);
    }
    let mut frames = V2Frames::default();
    for f in &p.frames {
        frames.func.push(f.func);
        frames.line.push(f.line);
        frames.address.push(f.address);
        frames.symbol_address.push(f.symbol_address);
        frames.category.push(category_name(f.category));
    }
    if p.frames.iter().any(|f| f.opcode.is_some()) {
        for f in &p.frames {
            let op = f.opcode.as_ref();
            frames.opcode.push(op.map(|o| o.name.to_string()));
            frames
                .opcode_base
                .push(op.and_then(|o| o.base.as_deref().map(str::to_string)));
        }
    }
    let mut stacks = V2Stacks::default();
    for &(frame, prefix) in &p.stacks {
        stacks.frame.push(frame);
        stacks.prefix.push(prefix);
    }
    V2 {
        format: FORMAT.into(),
        version: VERSION,
        run: V2Run {
            run_id: run.run_id.clone(),
            start_epoch_ms: run.start_epoch_ms,
            interval_ms: run.interval_ms,
            duration_ms: run.duration_ms,
            mode: run.mode.clone(),
            rate_hz: run.rate_hz,
            command: run.command.clone(),
            lost: run.lost,
            cpus: run.cpus,
            cost: run.cost.map(|c| V2Cost {
                user_cpu_ms: c.user_cpu_ms,
                bpf_ms: c.bpf_ms,
                bpf_runs: c.bpf_runs,
                peak_rss_kib: c.peak_rss_kib,
            }),
            kernel: run.kernel.as_ref().map(|k| V2Kernel {
                release: k.release.clone(),
                programs: k.programs.clone(),
            }),
            bpf_counters: run.bpf_counters.clone(),
            async_aware: run.async_aware.clone(),
            host: run.host.clone(),
            labels: run.labels.clone(),
        },
        mode: p.mode.name().into(),
        interval_ms: p.interval_ms,
        end_ms: p.end_ms,
        counters: counters_out(&p.counters),
        libs: p
            .libs
            .iter()
            .map(|l| V2Lib {
                name: l.name.to_string(),
                path: l.path.to_string(),
                build_id: l.build_id.as_deref().map(str::to_string),
                interpreter: Some(l.interpreter),
            })
            .collect(),
        funcs,
        frames,
        stacks,
        processes: p
            .processes
            .values()
            .map(|q| v2_process(q, false))
            .chain(p.retired.iter().map(|q| v2_process(q, true)))
            .collect(),
    }
}

/// Every column of a table has the table's length.
fn same_len(what: &'static str, lens: &[usize]) -> Result<(), RecordingError> {
    if lens.windows(2).all(|w| w[0] == w[1]) {
        Ok(())
    } else {
        Err(RecordingError::Columns(what))
    }
}

fn from_v2(r: V2) -> Result<(Profile, RunInfo), RecordingError> {
    let Some(mode) = Mode::from_name(&r.mode) else {
        return Err(RecordingError::Unknown("mode", r.mode));
    };
    let mut p = Profile::new(mode, r.interval_ms);
    p.end_ms = r.end_ms;
    p.counters = counters_in(&r.counters);
    p.libs = r
        .libs
        .into_iter()
        .map(|l| Lib {
            interpreter: l
                .interpreter
                .unwrap_or_else(|| interpreter_by_name(&l.name)),
            name: Arc::from(l.name),
            path: Arc::from(l.path),
            build_id: l.build_id.map(Arc::from),
        })
        .collect();
    p.funcs = funcs_from_v2(r.funcs)?;
    p.frames = frames_from_v2(r.frames)?;
    same_len("stack", &[r.stacks.frame.len(), r.stacks.prefix.len()])?;
    p.stacks = r.stacks.frame.into_iter().zip(r.stacks.prefix).collect();
    for q in r.processes {
        let retired = q.retired;
        let data = process_from_v2(q)?;
        if retired {
            p.retired.push(data);
        } else {
            p.processes.insert(data.pid, data);
        }
    }
    Ok((p, run_from_v2(r.run)))
}

fn funcs_from_v2(f: V2Funcs) -> Result<Vec<Func>, RecordingError> {
    let mut funcs = Vec::with_capacity(f.name.len());
    same_len(
        "function",
        &[
            f.name.len(),
            f.file.len(),
            f.line.len(),
            f.lib.len(),
            f.category.len(),
            f.is_python.len(),
        ],
    )?;
    for i in 0..f.name.len() {
        funcs.push(Func {
            name: Arc::from(f.name[i].as_str()),
            file: f.file[i].as_deref().map(Arc::from),
            line: f.line[i],
            lib: f.lib[i],
            category: category_of(&f.category[i])?,
            is_python: f.is_python[i],
        });
    }
    Ok(funcs)
}

fn frames_from_v2(fr: V2Frames) -> Result<Vec<Frame>, RecordingError> {
    let mut frames = Vec::with_capacity(fr.func.len());
    same_len(
        "frame",
        &[
            fr.func.len(),
            fr.line.len(),
            fr.address.len(),
            fr.symbol_address.len(),
            fr.category.len(),
        ],
    )?;
    let opcodes = !fr.opcode.is_empty();
    if opcodes {
        same_len(
            "frame",
            &[fr.func.len(), fr.opcode.len(), fr.opcode_base.len()],
        )?;
    }
    for i in 0..fr.func.len() {
        frames.push(Frame {
            func: fr.func[i],
            line: fr.line[i],
            address: fr.address[i],
            symbol_address: fr.symbol_address[i],
            category: category_of(&fr.category[i])?,
            opcode: opcodes
                .then(|| {
                    fr.opcode[i].as_deref().map(|name| Opcode {
                        name: Arc::from(name),
                        base: fr.opcode_base[i].as_deref().map(Arc::from),
                    })
                })
                .flatten(),
        });
    }
    Ok(frames)
}

fn process_from_v2(q: V2Process) -> Result<ProcessData, RecordingError> {
    let mut threads = std::collections::BTreeMap::new();
    for t in q.threads {
        let data = thread_from_v2(t)?;
        threads.insert(data.tid, data);
    }
    Ok(ProcessData {
        pid: q.pid,
        name: q.name,
        python: q.python,
        threads,
        first_ms: q.first_ms,
        last_ms: q.last_ms,
        start_ms: q.start_ms,
        end_ms: q.end_ms,
        generation: q.generation,
        identity: q.identity.map(V4Identity::into_identity),
    })
}

fn thread_from_v2(t: V2Thread) -> Result<ThreadData, RecordingError> {
    let s = t.samples;
    same_len(
        "sample",
        &[
            s.time_ms.len(),
            s.stack.len(),
            s.state.len(),
            s.weight_ms.len(),
            s.in_mode.len(),
            s.cpu_delta_us.len(),
        ],
    )?;
    let samples = (0..s.time_ms.len())
        .map(|i| Sample {
            time_ms: s.time_ms[i],
            stack: s.stack[i],
            state: s.state[i],
            weight_ms: s.weight_ms[i],
            in_mode: s.in_mode[i],
            cpu_delta_us: s.cpu_delta_us[i],
        })
        .collect();
    let m = t.markers;
    same_len(
        "marker",
        &[
            m.name.len(),
            m.category.len(),
            m.start_ms.len(),
            m.end_ms.len(),
        ],
    )?;
    let mut markers = Vec::with_capacity(m.name.len());
    for i in 0..m.name.len() {
        let name = MARKER_NAMES
            .iter()
            .find(|n| **n == m.name[i])
            .ok_or_else(|| RecordingError::Unknown("marker", m.name[i].clone()))?;
        markers.push(Marker {
            name,
            category: category_of(&m.category[i])?,
            start_ms: m.start_ms[i],
            end_ms: m.end_ms[i],
        });
    }
    Ok(ThreadData {
        tid: t.tid,
        name: t.name,
        python_name: t.python_name,
        samples,
        markers,
        first_ms: t.first_ms,
        last_ms: t.last_ms,
        start_ms: t.start_ms,
        end_ms: t.end_ms,
        sched: Default::default(),
    })
}

fn run_from_v2(k: V2Run) -> RunInfo {
    RunInfo {
        run_id: k.run_id,
        start_epoch_ms: k.start_epoch_ms,
        interval_ms: k.interval_ms,
        duration_ms: k.duration_ms,
        mode: k.mode,
        rate_hz: k.rate_hz,
        command: k.command,
        lost: k.lost,
        cpus: k.cpus,
        cost: k.cost.map(|c| super::Cost {
            user_cpu_ms: c.user_cpu_ms,
            bpf_ms: c.bpf_ms,
            bpf_runs: c.bpf_runs,
            peak_rss_kib: c.peak_rss_kib,
        }),
        kernel: k.kernel.map(|k| super::KernelMeta {
            release: k.release,
            programs: k.programs,
        }),
        bpf_counters: k.bpf_counters,
        async_aware: k.async_aware,
        host: k.host,
        labels: k.labels,
        // Not recorded: the profile made from a recording says nothing of what it cost.
        bpf_programs: Vec::new(),
    }
}

// ---- Version 1: the first release's recordings, a dump of the internal profile of then.

#[derive(Deserialize)]
struct Header {
    format: String,
    version: u32,
}

#[derive(Deserialize)]
struct V1 {
    run: RunInfo,
    profile: Profile,
}

fn input(message: String) -> Error {
    Error::new(ErrorKind::Input, message)
}

pub fn to_bytes(p: &Profile, run: &RunInfo) -> Result<Vec<u8>, Error> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    serde_json::to_writer(&mut gz, &to_v2(p, run)).map_err(|e| Error::encode("recording", e))?;
    gz.flush().map_err(|e| Error::encode("recording", e))?;
    gz.finish().map_err(|e| Error::encode("recording", e))
}

/// Reads a recording back; any problem is one line naming the file.
pub fn load(path: &Path) -> Result<(Profile, RunInfo), Error> {
    let what = path.display();
    let f = std::fs::File::open(path).map_err(|e| input(format!("cannot read {what}: {e}")))?;
    let mut r = BufReader::new(f);
    let mut magic = [0u8; 2];
    if r.read_exact(&mut magic).is_err() || magic != [0x1f, 0x8b] {
        return Err(input(format!("{what} is not a tachyon-bpf recording")));
    }
    let f = std::fs::File::open(path).map_err(|e| input(format!("cannot read {what}: {e}")))?;
    // Decompressed size is capped (a gzip bomb expands a thousandfold), as is the size of the
    // file itself.
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    if len > MAX_DECOMPRESSED {
        return Err(input(format!(
            "{what} is larger than a recording can be ({} MiB)",
            MAX_DECOMPRESSED >> 20
        )));
    }
    from_gzip(BufReader::new(f)).map_err(|e| input(format!("{what} {e}")))
}

/// A recording from its gzipped bytes, decompressing at most [`MAX_DECOMPRESSED`] (what `load`
/// does after opening the file; the fuzz targets feed this directly).
pub fn from_gzip(r: impl Read) -> Result<(Profile, RunInfo), Error> {
    let mut text = Vec::new();
    flate2::read::GzDecoder::new(r)
        .take(MAX_DECOMPRESSED + 1)
        .read_to_end(&mut text)
        .map_err(|e| input(format!("is damaged: {e}")))?;
    if text.len() as u64 > MAX_DECOMPRESSED {
        return Err(input(format!(
            "decompresses to more than {} MiB, the limit of a recording",
            MAX_DECOMPRESSED >> 20
        )));
    }
    from_json(&text)
}

/// The most a recording may decompress to: about 2.3 million samples (a recording takes about
/// 225 bytes a sample, measured on a 3.12 workload with 60-deep Python stacks), e.g. 20 minutes
/// at 1 kHz on two busy CPUs. Longer runs are what `--continuous` is for.
pub const MAX_DECOMPRESSED: u64 = 512 << 20;

/// A recording's decompressed JSON, checked (the fuzz targets feed this directly).
pub fn from_json(text: &[u8]) -> Result<(Profile, RunInfo), Error> {
    checked(text).map_err(|e| input(e.to_string()))
}

fn checked(text: &[u8]) -> Result<(Profile, RunInfo), RecordingError> {
    let h: Header = serde_json::from_slice(text).map_err(|_| RecordingError::NotARecording)?;
    if h.format != FORMAT {
        return Err(RecordingError::NotARecording);
    }
    let (mut profile, run) = match h.version {
        1 => {
            let rec: V1 = serde_json::from_slice(text)
                .map_err(|e| RecordingError::Undecodable(e.to_string()))?;
            let mut profile = rec.profile;
            for l in &mut profile.libs {
                l.interpreter = interpreter_by_name(&l.name);
            }
            (profile, rec.run)
        }
        2 | 3 | VERSION => {
            let rec: V2 = serde_json::from_slice(text)
                .map_err(|e| RecordingError::Undecodable(e.to_string()))?;
            from_v2(rec)?
        }
        v => return Err(RecordingError::Version(v, VERSION)),
    };
    profile.reindex()?;
    profile.add_missing_exception_markers();
    Ok((profile, run))
}

/// Re-selects the samples of a recording for another mode. Wall and all recordings hold every
/// sample with its stack and state, so any mode can be taken from them; the others only hold
/// what their mode kept.
pub fn select_mode(p: &mut Profile, run: &mut RunInfo, mode: Mode) -> Result<(), Error> {
    if mode == p.mode {
        return Ok(());
    }
    if !matches!(p.mode, Mode::Wall | Mode::All) {
        return Err(Error::new(
            ErrorKind::Usage,
            format!(
                "this recording was made in {} mode; only wall and all recordings convert to \
                 other modes",
                p.mode.name()
            ),
        ));
    }
    p.mode = mode;
    run.mode = mode.name().to_string();
    for proc_ in p.processes.values_mut().chain(p.retired.iter_mut()) {
        for t in proc_.threads.values_mut() {
            for s in &mut t.samples {
                s.in_mode = mode.keeps(s.state);
            }
        }
    }
    Ok(())
}
