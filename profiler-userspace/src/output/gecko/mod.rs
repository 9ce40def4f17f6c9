//! Firefox Profiler output: the processed profile format, version 57 (per-thread tables, strings
//! in `shared.stringArray`), which the profiler upgrades on load. Python frames are funcs with a
//! file name and line and are marked `isJS`/`relevantForJS`, so the profiler's "JavaScript only"
//! view becomes a Python-only view; native frames keep their library and symbol.

use std::borrow::Cow;
use std::rc::Rc;

use rustc_hash::FxHashMap;

use serde_json::{json, Value};

use super::RunInfo;
use crate::aggregate::identity::ServiceSource;
use crate::aggregate::{
    Category, FrameId, FuncId, Marker, ProcessData, Profile, Sample, StackId, ThreadData,
};

const PREPROCESSED_VERSION: u32 = 57;
const GECKO_VERSION: u32 = 32;
const RESOURCE_LIBRARY: u32 = 1;

#[derive(Default)]
struct Strings {
    list: Vec<String>,
    ids: FxHashMap<String, usize>,
}

impl Strings {
    fn id(&mut self, s: &str) -> usize {
        if let Some(&i) = self.ids.get(s) {
            return i;
        }
        let i = self.list.len();
        self.list.push(s.to_string());
        self.ids.insert(s.to_string(), i);
        i
    }
}

/// The subcategory of Python for the interpreter's own C code under a Python frame (its index in
/// the category's `subcategories`).
const SUB_INTERPRETER: u32 = 1;

/// What a stack node's ancestors make of its frames' colours: under a Python frame, in the GIL
/// hand-off, in the garbage collector.
#[derive(Clone, Copy, Default)]
struct Context {
    under_python: bool,
    gil: bool,
    gc: bool,
}

/// Per-thread tables built from the profile's shared ones, holding only what the thread uses.
#[derive(Default)]
struct ThreadTables {
    /// Native frames that are not in a Python process are "User", as perf calls them.
    python_process: bool,
    stack_map: FxHashMap<StackId, usize>,
    stack_ctx: Vec<Context>,
    /// A frame of the profile gets one row per colour it is drawn in (the same function is
    /// interpreter work under a Python frame and plain native code at startup); the rows share
    /// the function, so the call tree is not split.
    frame_map: FxHashMap<(FrameId, u32, u32), usize>,
    func_map: FxHashMap<FuncId, usize>,
    res_map: FxHashMap<(Option<usize>, Option<String>), usize>,
    sym_map: FxHashMap<(usize, u64), usize>,
    stack_frame: Vec<usize>,
    stack_prefix: Vec<Option<usize>>,
    stack_cat: Vec<u32>,
    stack_subcat: Vec<u32>,
    fr_address: Vec<i64>,
    fr_cat: Vec<u32>,
    fr_subcat: Vec<u32>,
    fr_func: Vec<usize>,
    fr_line: Vec<Option<u32>>,
    fr_sym: Vec<Option<usize>>,
    fn_name: Vec<usize>,
    fn_is_js: Vec<bool>,
    fn_resource: Vec<i64>,
    fn_file: Vec<Option<usize>>,
    fn_line: Vec<Option<u32>>,
    res_lib: Vec<Option<usize>>,
    res_name: Vec<usize>,
    sym_lib: Vec<usize>,
    sym_addr: Vec<u64>,
    sym_name: Vec<usize>,
}

impl ThreadTables {
    fn resource(&mut self, p: &Profile, strings: &mut Strings, func: FuncId) -> i64 {
        let f = &p.funcs[func];
        let key = (
            f.lib,
            if f.lib.is_none() {
                f.file.as_deref().map(str::to_string)
            } else {
                None
            },
        );
        if key.0.is_none() && key.1.is_none() {
            return -1;
        }
        if let Some(&r) = self.res_map.get(&key) {
            return r as i64;
        }
        let name = match (f.lib, &f.file) {
            (Some(l), _) => p.libs[l].name.to_string(),
            (None, Some(file)) => file.rsplit('/').next().unwrap_or(file).to_string(),
            _ => String::new(),
        };
        let r = self.res_lib.len();
        self.res_lib.push(f.lib);
        self.res_name.push(strings.id(&name));
        self.res_map.insert(key, r);
        r as i64
    }

    fn func(&mut self, p: &Profile, strings: &mut Strings, func: FuncId) -> usize {
        if let Some(&i) = self.func_map.get(&func) {
            return i;
        }
        let f = &p.funcs[func];
        let res = self.resource(p, strings, func);
        let i = self.fn_name.len();
        self.fn_name.push(strings.id(&f.name));
        self.fn_is_js.push(f.is_python);
        self.fn_resource.push(res);
        self.fn_file.push(f.file.as_deref().map(|s| strings.id(s)));
        self.fn_line.push(f.line);
        self.func_map.insert(func, i);
        i
    }

    /// The colour of `frame` below ancestors `ctx`, and the context it makes for its callees.
    fn colour(&self, p: &Profile, frame: FrameId, ctx: Context) -> (Category, u32, Context) {
        let fr = &p.frames[frame];
        let func = &p.funcs[fr.func];
        if func.is_python {
            let ctx = Context {
                under_python: true,
                gil: false,
                gc: false,
            };
            return (Category::Python, 0, ctx);
        }
        // The GIL hand-off and the collector are named as such when frames are made (`collect`):
        // what they call is theirs too.
        let is_kernel = fr.category == Category::Kernel;
        let ctx = Context {
            under_python: ctx.under_python,
            gil: ctx.gil || fr.category == Category::Gil,
            gc: ctx.gc || fr.category == Category::Gc,
        };
        let in_interpreter = func.lib.is_some_and(|l| p.libs[l].is_interpreter());
        let (cat, sub) = if ctx.gil {
            (Category::Gil, 0)
        } else if ctx.gc {
            (Category::Gc, 0)
        } else if is_kernel || fr.category == Category::Other {
            (fr.category, 0)
        } else if ctx.under_python && in_interpreter {
            (Category::Python, SUB_INTERPRETER)
        } else if self.python_process {
            (Category::Native, 0)
        } else {
            (Category::User, 0)
        };
        (cat, sub, ctx)
    }

    fn frame(
        &mut self,
        p: &Profile,
        strings: &mut Strings,
        frame: FrameId,
        cat: Category,
        sub: u32,
    ) -> usize {
        let key = (frame, cat as u32, sub);
        if let Some(&i) = self.frame_map.get(&key) {
            return i;
        }
        let fr = &p.frames[frame];
        let func = self.func(p, strings, fr.func);
        let lib = p.funcs[fr.func].lib;
        let sym = match (lib, fr.symbol_address) {
            (Some(l), Some(a)) => Some(*self.sym_map.entry((l, a)).or_insert_with(|| {
                let i = self.sym_lib.len();
                self.sym_lib.push(l);
                self.sym_addr.push(a);
                self.sym_name.push(strings.id(&p.funcs[fr.func].name));
                i
            })),
            _ => None,
        };
        let i = self.fr_func.len();
        self.fr_address
            .push(fr.address.map(|a| a as i64).unwrap_or(-1));
        self.fr_cat.push(cat as u32);
        self.fr_subcat.push(sub);
        self.fr_func.push(func);
        self.fr_line.push(fr.line);
        self.fr_sym.push(sym);
        self.frame_map.insert(key, i);
        i
    }

    fn stack(&mut self, p: &Profile, strings: &mut Strings, stack: StackId) -> usize {
        if let Some(&i) = self.stack_map.get(&stack) {
            return i;
        }
        // Walk to the first already-mapped ancestor, then map root-first.
        let mut chain = Vec::new();
        let mut cur = Some(stack);
        while let Some(s) = cur {
            if self.stack_map.contains_key(&s) {
                break;
            }
            chain.push(s);
            cur = p.stacks[s].1;
        }
        let mut prefix = cur.map(|s| self.stack_map[&s]);
        for &s in chain.iter().rev() {
            let ctx = prefix.map(|i| self.stack_ctx[i]).unwrap_or_default();
            let (cat, sub, ctx) = self.colour(p, p.stacks[s].0, ctx);
            let frame = self.frame(p, strings, p.stacks[s].0, cat, sub);
            let i = self.stack_frame.len();
            self.stack_frame.push(frame);
            self.stack_prefix.push(prefix);
            self.stack_cat.push(cat as u32);
            self.stack_subcat.push(sub);
            self.stack_ctx.push(ctx);
            self.stack_map.insert(s, i);
            prefix = Some(i);
        }
        self.stack_map[&stack]
    }
}

mod markers;

use markers::{marker_data, marker_schema, opcode_markers, MarkerOut};

/// A thread's `markers` table.
#[derive(serde::Serialize)]
struct MarkersOut {
    category: Vec<u32>,
    data: Vec<MarkerOut>,
    #[serde(rename = "endTime")]
    end_time: Vec<f64>,
    length: usize,
    name: Vec<usize>,
    phase: Vec<u32>,
    #[serde(rename = "startTime")]
    start_time: Vec<f64>,
}

/// A thread's `samples` table.
#[derive(serde::Serialize)]
struct SamplesOut {
    length: usize,
    stack: Vec<Option<usize>>,
    #[serde(rename = "threadCPUDelta")]
    thread_cpu_delta: Vec<u64>,
    time: Vec<f64>,
    weight: Vec<f64>,
    #[serde(rename = "weightType")]
    weight_type: &'static str,
}

/// Writes `head`'s entries (a `Value` map, whose keys come sorted) with the entries `extras`
/// names written by `extra` among them, every key in the same order.
fn write_merged<S: serde::Serializer>(
    ser: S,
    head: &Value,
    extras: &[&'static str],
    extra: impl Fn(&mut S::SerializeMap, &'static str) -> Result<(), S::Error>,
) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeMap;
    let empty = serde_json::Map::new();
    let head = head.as_object().unwrap_or(&empty);
    let mut map = ser.serialize_map(Some(head.len() + extras.len()))?;
    let mut pending = extras.iter().copied().peekable();
    for (k, v) in head {
        while let Some(e) = pending.next_if(|e| *e < k.as_str()) {
            extra(&mut map, e)?;
        }
        map.serialize_entry(k, v)?;
    }
    for e in pending {
        extra(&mut map, e)?;
    }
    map.end()
}

/// One thread of the output: its tables, the two that grow with the run written directly.
struct ThreadOut {
    head: Value,
    markers: MarkersOut,
    samples: SamplesOut,
}

impl serde::Serialize for ThreadOut {
    fn serialize<S: serde::Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        write_merged(ser, &self.head, &["markers", "samples"], |map, key| {
            if key == "markers" {
                map.serialize_entry(key, &self.markers)
            } else {
                map.serialize_entry(key, &self.samples)
            }
        })
    }
}

/// The whole output.
pub struct GeckoOut {
    head: Value,
    threads: Vec<ThreadOut>,
}

impl serde::Serialize for GeckoOut {
    fn serialize<S: serde::Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        write_merged(ser, &self.head, &["threads"], |map, key| {
            map.serialize_entry(key, &self.threads)
        })
    }
}

/// A thread's track name: the name it was given (a Python thread's, or one set with
/// `pthread_setname_np`, which Python 3.14's threading does), or its program's with its tid.
pub fn thread_name(proc: &ProcessData, t: &ThreadData) -> String {
    if let Some(name) = &t.python_name {
        return name.clone();
    }
    let program = proc.threads.get(&proc.pid).map(|m| m.name.as_str());
    if t.name.is_empty() || Some(t.name.as_str()) == program {
        let comm = if t.name.is_empty() { "thread" } else { &t.name };
        format!("{comm} (tid {})", t.tid)
    } else {
        t.name.clone()
    }
}

/// `opcodes`: whether the profile names any instruction (`--opcodes`); without, no thread looks
/// for opcode markers.
fn thread_json(
    p: &Profile,
    strings: &mut Strings,
    proc: &ProcessData,
    t: &ThreadData,
    opcodes: bool,
) -> ThreadOut {
    let mut tt = ThreadTables {
        python_process: proc.python.is_some(),
        ..ThreadTables::default()
    };
    let samples = samples_out(p, strings, &mut tt, t);
    let markers = markers_out(p, strings, t, opcodes);
    ThreadOut {
        head: thread_head(proc, t, tt),
        markers,
        samples,
    }
}

/// Builds the whole profile, ready to be written as JSON.
pub fn to_json(p: &Profile, run: &RunInfo) -> GeckoOut {
    let mut strings = Strings::default();
    let mut threads = Vec::new();
    let opcodes = p.frames.iter().any(|f| f.opcode.is_some());
    for proc in p.all_processes() {
        // The main thread first, then the busiest: the viewer keeps this order for its tracks.
        let mut order: Vec<(&ThreadData, f64)> = proc
            .threads
            .values()
            .map(|t| {
                let busy: f64 = t.samples.iter().map(|s| s.cpu_delta_us).sum();
                (t, busy)
            })
            .collect();
        order.sort_by(|a, b| {
            (b.0.tid == proc.pid)
                .cmp(&(a.0.tid == proc.pid))
                .then(b.1.total_cmp(&a.1))
                .then(a.0.tid.cmp(&b.0.tid))
        });
        for (t, _) in order {
            threads.push(thread_json(p, &mut strings, proc, t, opcodes));
        }
    }
    let categories = categories_json();
    let libs = libs_json(p);
    let tachyon = tachyon_meta(p, run);
    let oscpu = match &run.kernel {
        Some(k) => format!("Linux {} {}", k.release, std::env::consts::ARCH),
        None => format!("Linux {}", std::env::consts::ARCH),
    };
    let head = json!({
        "meta": {
            "interval": run.interval_ms,
            "sampleUnits": {"time": "ms", "eventDelay": "ms", "threadCPUDelta": "µs"},
            "startTime": run.start_epoch_ms,
            "abi": format!("{}-gcc3", std::env::consts::ARCH),
            "misc": format!("mode={} rate={}Hz", run.mode, run.rate_hz),
            "oscpu": oscpu,
            "platform": "Linux",
            "processType": 0,
            "categories": categories,
            "stackwalk": 1,
            "toolkit": "",
            "version": GECKO_VERSION,
            "preprocessedProfileVersion": PREPROCESSED_VERSION,
            "appBuildID": "",
            "physicalCPUs": run.cpus,
            "logicalCPUs": run.cpus,
            "CPUName": "",
            "product": "tachyon-bpf",
            "symbolicated": true,
            "markerSchema": marker_schema(),
            "importedFrom": "tachyon-bpf",
            "arguments": run.command,
            "extensions": {"id": [], "name": [], "baseURL": [], "length": 0},
            "tachyon": tachyon,
        },
        "libs": libs,
        "pages": [],
        "counters": [],
        "shared": {"stringArray": strings.list},
    });
    GeckoOut { head, threads }
}

/// The thread's samples in its mode, with their stacks interned into its tables.
fn samples_out(
    p: &Profile,
    strings: &mut Strings,
    tt: &mut ThreadTables,
    t: &ThreadData,
) -> SamplesOut {
    let mut s_stack = Vec::with_capacity(t.samples.len());
    let mut s_time = Vec::with_capacity(t.samples.len());
    let mut s_weight = Vec::with_capacity(t.samples.len());
    let mut s_cpu = Vec::with_capacity(t.samples.len());
    // CPU use of samples outside the mode goes to the next kept one.
    let mut carried_cpu = 0.0;
    for s in &t.samples {
        if !s.in_mode {
            carried_cpu += s.cpu_delta_us;
            continue;
        }
        s_stack.push(s.stack.map(|st| tt.stack(p, strings, st)));
        s_time.push(s.time_ms);
        s_weight.push(s.weight_ms);
        s_cpu.push((s.cpu_delta_us + carried_cpu).round() as u64);
        carried_cpu = 0.0;
    }
    SamplesOut {
        length: s_time.len(),
        stack: s_stack,
        thread_cpu_delta: s_cpu,
        time: s_time,
        weight: s_weight,
        weight_type: "tracing-ms",
    }
}

/// The thread's markers, and with `opcodes` its opcode markers.
fn markers_out(p: &Profile, strings: &mut Strings, t: &ThreadData, opcodes: bool) -> MarkersOut {
    let n = t.markers.len();
    let mut m_name = Vec::with_capacity(n);
    let mut m_start = Vec::with_capacity(n);
    let mut m_end = Vec::with_capacity(n);
    let mut m_cat = Vec::with_capacity(n);
    let mut m_data = Vec::with_capacity(n);
    let mut marker_cache = FxHashMap::default();
    for m in &t.markers {
        m_name.push(strings.id(m.name));
        m_start.push(m.start_ms);
        m_end.push(m.end_ms);
        m_cat.push(m.category as u32);
        m_data.push(marker_data(p, t, m, &mut marker_cache));
    }
    let op_markers = if opcodes {
        opcode_markers(p, t)
    } else {
        Vec::new()
    };
    for (name, start, end, data) in op_markers {
        m_name.push(strings.id(&name));
        m_start.push(start);
        m_end.push(end);
        m_cat.push(Category::Opcodes as u32);
        m_data.push(MarkerOut::Other(data));
    }
    let n_markers = m_name.len();
    MarkersOut {
        category: m_cat,
        data: m_data,
        end_time: m_end,
        length: n_markers,
        name: m_name,
        phase: vec![1; n_markers],
        start_time: m_start,
    }
}

/// The thread's description and its tables (everything but its samples and markers).
fn thread_head(proc: &ProcessData, t: &ThreadData, tt: ThreadTables) -> Value {
    let pid = proc.pid;
    let proc_name = proc.name.as_str();
    let is_main = t.tid == pid;
    json!({
        "processType": "default",
        "processName": process_track_name(proc),
        "processStartupTime": proc.start_ms.unwrap_or(0.0),
        "processShutdownTime": proc.end_ms,
        "registerTime": t.start_ms.or(proc.start_ms).unwrap_or(0.0),
        "unregisterTime": t.end_ms.or(proc.end_ms),
        "pausedRanges": [],
        "name": if is_main { proc_name.to_string() } else { thread_name(proc, t) },
        "isMainThread": is_main,
        // Earlier programs of a pid are separate processes in the viewer.
        "pid": if proc.generation == 0 { pid.to_string() } else { format!("{pid}.{}", proc.generation) },
        "tid": t.tid,
        "showMarkersInTimeline": true,
        "stackTable": {
            "frame": tt.stack_frame,
            "prefix": tt.stack_prefix,
            "category": tt.stack_cat,
            "subcategory": tt.stack_subcat,
            "length": tt.stack_frame.len(),
        },
        "frameTable": {
            "address": tt.fr_address,
            "inlineDepth": vec![0; tt.fr_func.len()],
            "category": tt.fr_cat,
            "subcategory": tt.fr_subcat,
            "func": tt.fr_func,
            "nativeSymbol": tt.fr_sym,
            "innerWindowID": vec![Value::Null; tt.fr_func.len()],
            "implementation": vec![Value::Null; tt.fr_func.len()],
            "line": tt.fr_line,
            "column": vec![Value::Null; tt.fr_func.len()],
            "length": tt.fr_func.len(),
        },
        "funcTable": {
            "isJS": tt.fn_is_js,
            "relevantForJS": tt.fn_is_js,
            "name": tt.fn_name,
            "resource": tt.fn_resource,
            "fileName": tt.fn_file,
            "lineNumber": tt.fn_line,
            "columnNumber": vec![Value::Null; tt.fn_name.len()],
            "length": tt.fn_name.len(),
        },
        "resourceTable": {
            "lib": tt.res_lib,
            "name": tt.res_name,
            "host": vec![Value::Null; tt.res_lib.len()],
            "type": vec![RESOURCE_LIBRARY; tt.res_lib.len()],
            "length": tt.res_lib.len(),
        },
        "nativeSymbols": {
            "libIndex": tt.sym_lib,
            "address": tt.sym_addr,
            "name": tt.sym_name,
            "functionSize": vec![Value::Null; tt.sym_lib.len()],
            "length": tt.sym_lib.len(),
        },
    })
}

/// The categories, in the profile's order, with their subcategories.
fn categories_json() -> Vec<Value> {
    Category::ALL
        .iter()
        .map(|(cat, name, color)| {
            let subcategories: &[&str] = match cat {
                Category::Python => &["Other", "interpreter"],
                _ => &["Other"],
            };
            json!({"name": name, "color": color, "subcategories": subcategories})
        })
        .collect()
}

/// The libraries frames were symbolized from.
fn libs_json(p: &Profile) -> Vec<Value> {
    p.libs
        .iter()
        .map(|l| {
            json!({
                "arch": std::env::consts::ARCH,
                "name": l.name.as_ref(),
                "path": l.path.as_ref(),
                "debugName": l.name.as_ref(),
                "debugPath": l.path.as_ref(),
                "breakpadId": "",
                "codeId": null,
            })
        })
        .collect()
}

/// A process's track name: its name, then the service it belongs to when something other than
/// its program named it, and its container (short id, as `docker ps` shows it).
fn process_track_name(proc: &ProcessData) -> String {
    let Some(id) = &proc.identity else {
        return proc.name.clone();
    };
    let mut extra = Vec::new();
    if id.service_source != ServiceSource::Program {
        extra.push(format!("service {}", id.service));
    }
    if let Some(c) = &id.container_id {
        extra.push(format!("container {}", &c[..c.len().min(12)]));
    }
    if extra.is_empty() {
        proc.name.clone()
    } else {
        format!("{} [{}]", proc.name, extra.join(", "))
    }
}

/// `meta.tachyon.processes`: who each process is (its identity and labels), by pid.
fn processes_meta(p: &Profile, run: &RunInfo) -> Value {
    let mut out = Vec::new();
    for proc in p.processes.values().chain(p.retired.iter()) {
        let labels: serde_json::Map<String, Value> = super::process_labels(proc, run)
            .into_iter()
            .map(|(k, v)| (k, json!(v)))
            .collect();
        let mut entry = json!({
            "pid": proc.pid,
            "generation": proc.generation,
            "name": proc.name,
            "labels": labels,
        });
        if let Some(id) = &proc.identity {
            entry["service"] = json!(id.service);
            entry["serviceSource"] = json!(id.service_source.name());
            entry["containerId"] = json!(id.container_id);
            entry["podUid"] = json!(id.pod_uid);
            entry["systemdUnit"] = json!(id.systemd_unit);
            entry["cgroup"] = json!(id.cgroup);
            entry["nsPid"] = json!(id.ns_pid);
            entry["executable"] = json!(id.executable);
        }
        out.push(entry);
    }
    Value::Array(out)
}

/// `meta.tachyon`: what the run was, what it counted, and what it cost.
fn tachyon_meta(p: &Profile, run: &RunInfo) -> Value {
    let c = &p.counters;
    let tachyon = json!({
        "runId": run.run_id,
        "mode": run.mode,
        "rateHz": run.rate_hz,
        "durationMs": run.duration_ms,
        "samples": c.samples,
        "offCpuCaptures": c.offcpu_captures,
        "lost": run.lost,
        "nativeTruncated": c.native_truncated,
        "badRecords": c.bad_records,
        "pythonSamples": c.py_samples,
        "pythonMerged": c.py_merged,
        "pythonMergeMismatch": c.py_merge_mismatch,
        "pythonThreadMiss": c.py_thread_miss,
        "pythonReadFailed": c.py_read_failed,
        "pythonTruncated": c.py_truncated,
        "pythonUnresolvedFrames": c.py_unresolved_frames,
        "pythonCycles": c.py_cycles,
        "pythonBadLineTables": c.py_bad_line_tables,
        "asyncAwareSamples": c.py_async_samples,
        "asyncTaskMismatch": c.py_async_mismatch,
        "asyncChainsCut": c.py_async_cut,
        "asyncSuspendedSamples": c.py_async_suspended,
        "mapsReadOnLibraryLoad": c.maps_read_on_load,
        // `all` adds suspended tasks' time on pseudo-threads: a wall-time view whatever the mode.
        "asyncAware": run.async_aware.as_deref().map(|w| json!({
            "setting": w,
            "suspendedTasks": if w == "all" { "wall time, on a pseudo-thread per event loop" } else { "not shown" },
        })),
        "maxReaderLagMs": c.max_lag_ms,
        // Native frames no symbol named, by file: the viewer cannot tell them from named ones.
        "unnamedFrames": super::summary::unnamed_frames(p)
            .into_iter()
            .map(|(file, n)| (file, json!(n)))
            .collect::<serde_json::Map<_, _>>(),
        "profilerCost": run.cost.map(|k| json!({
            "userCpuMs": k.user_cpu_ms,
            "bpfMs": k.bpf_ms,
            "bpfRuns": k.bpf_runs,
            "peakRssKiB": k.peak_rss_kib,
            "cpuUsPerSample": k.us_per_sample(c.samples),
        })),
    });
    let mut tachyon = tachyon;
    tachyon["bpfCounters"] = run
        .bpf_counters
        .iter()
        .map(|(n, v)| (n.clone(), json!(v)))
        .collect::<serde_json::Map<_, _>>()
        .into();
    if !run.bpf_programs.is_empty() {
        tachyon["bpfPrograms"] = run
            .bpf_programs
            .iter()
            .map(|(n, ms, runs)| (n.clone(), json!({"ms": ms, "runs": runs})))
            .collect::<serde_json::Map<_, _>>()
            .into();
    }
    if let Some(k) = &run.kernel {
        tachyon["kernel"] = json!({"release": k.release, "programs": k.programs});
    }
    tachyon["host"] = json!(run.host);
    tachyon["labels"] = run
        .labels
        .iter()
        .map(|(k, v)| (k.clone(), json!(v)))
        .collect::<serde_json::Map<_, _>>()
        .into();
    tachyon["processes"] = processes_meta(p, run);
    tachyon
}
