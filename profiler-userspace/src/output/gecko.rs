//! Firefox Profiler output: the processed profile format, version 57 (per-thread tables, strings
//! in `shared.stringArray`), which the profiler upgrades on load. Python frames are funcs with a
//! file name and line and are marked `isJS`/`relevantForJS`, so the profiler's "JavaScript only"
//! view becomes a Python-only view; native frames keep their library and symbol.

use std::collections::HashMap;

use serde_json::{json, Value};

use super::RunInfo;
use crate::aggregate::{Category, FrameId, FuncId, ProcessData, Profile, StackId, ThreadData};

const PREPROCESSED_VERSION: u32 = 57;
const GECKO_VERSION: u32 = 32;
const RESOURCE_LIBRARY: u32 = 1;

#[derive(Default)]
struct Strings {
    list: Vec<String>,
    ids: HashMap<String, usize>,
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

/// Per-thread tables built from the profile's shared ones, holding only what the thread uses.
#[derive(Default)]
struct ThreadTables {
    stack_map: HashMap<StackId, usize>,
    frame_map: HashMap<FrameId, usize>,
    func_map: HashMap<FuncId, usize>,
    res_map: HashMap<(Option<usize>, Option<String>), usize>,
    sym_map: HashMap<(usize, u64), usize>,
    stack_frame: Vec<usize>,
    stack_prefix: Vec<Option<usize>>,
    stack_cat: Vec<u32>,
    fr_address: Vec<i64>,
    fr_cat: Vec<u32>,
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

    fn frame(&mut self, p: &Profile, strings: &mut Strings, frame: FrameId) -> usize {
        if let Some(&i) = self.frame_map.get(&frame) {
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
        self.fr_cat.push(fr.category as u32);
        self.fr_func.push(func);
        self.fr_line.push(fr.line);
        self.fr_sym.push(sym);
        self.frame_map.insert(frame, i);
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
            let frame = self.frame(p, strings, p.stacks[s].0);
            let i = self.stack_frame.len();
            self.stack_frame.push(frame);
            self.stack_prefix.push(prefix);
            self.stack_cat.push(self.fr_cat[frame]);
            self.stack_map.insert(s, i);
            prefix = Some(i);
        }
        self.stack_map[&stack]
    }
}

fn marker_schema() -> Value {
    let names = [
        ("HasGIL", "Has GIL", "The thread holds the GIL"),
        ("NoGIL", "No GIL", "The thread does not hold the GIL"),
        (
            "WaitingforGIL",
            "Waiting for GIL",
            "The thread waits to take the GIL",
        ),
        ("OnCPU", "On CPU", "The thread runs on a CPU"),
        ("OffCPU", "Off CPU", "The thread is not running"),
        (
            "Switching",
            "Switching",
            "The thread goes on and off CPUs faster than the sampling period (the CPU graph shows its share)",
        ),
        (
            "PythonCode",
            "Python Code",
            "The thread runs Python code (holds the GIL)",
        ),
        (
            "NativeCode",
            "Native Code",
            "The thread runs native code without the GIL",
        ),
        (
            "GCCollecting",
            "GC Collecting",
            "The interpreter's garbage collector runs",
        ),
    ];
    Value::Array(
        names
            .iter()
            .map(|(ty, label, desc)| {
                json!({
                    "name": ty,
                    "display": ["marker-chart", "marker-table", "timeline-overview"],
                    "chartLabel": label,
                    "tooltipLabel": label,
                    "tableLabel": label,
                    "description": desc,
                    "fields": [],
                })
            })
            .collect(),
    )
}

fn thread_json(p: &Profile, strings: &mut Strings, proc: &ProcessData, t: &ThreadData) -> Value {
    let mut tt = ThreadTables::default();
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
    let pid = proc.pid;
    let proc_name = proc.name.as_str();
    let mut m_name = Vec::new();
    let mut m_start = Vec::new();
    let mut m_end = Vec::new();
    let mut m_cat = Vec::new();
    let mut m_data = Vec::new();
    for m in &t.markers {
        m_name.push(strings.id(m.name));
        m_start.push(m.start_ms);
        m_end.push(m.end_ms);
        m_cat.push(m.category as u32);
        m_data.push(json!({"type": m.name.replace(' ', ""), "tid": t.tid}));
    }
    let n_markers = m_name.len();
    let is_main = t.tid == pid;
    json!({
        "processType": "default",
        "processName": proc_name,
        "processStartupTime": proc.start_ms.unwrap_or(0.0),
        "processShutdownTime": proc.end_ms,
        "registerTime": t.start_ms.or(proc.start_ms).unwrap_or(0.0),
        "unregisterTime": t.end_ms.or(proc.end_ms),
        "pausedRanges": [],
        "name": if is_main { proc_name.to_string() } else { t.name.clone() },
        "isMainThread": is_main,
        // Earlier programs of a pid are separate processes in the viewer.
        "pid": if proc.generation == 0 { pid.to_string() } else { format!("{pid}.{}", proc.generation) },
        "tid": t.tid,
        "showMarkersInTimeline": true,
        "samples": {
            "weightType": "tracing-ms",
            "weight": s_weight,
            "stack": s_stack,
            "time": s_time,
            "threadCPUDelta": s_cpu,
            "length": s_time.len(),
        },
        "markers": {
            "data": m_data,
            "name": m_name,
            "startTime": m_start,
            "endTime": m_end,
            "phase": vec![1; n_markers],
            "category": m_cat,
            "length": n_markers,
        },
        "stackTable": {
            "frame": tt.stack_frame,
            "prefix": tt.stack_prefix,
            "category": tt.stack_cat,
            "subcategory": vec![0; tt.stack_frame.len()],
            "length": tt.stack_frame.len(),
        },
        "frameTable": {
            "address": tt.fr_address,
            "inlineDepth": vec![0; tt.fr_func.len()],
            "category": tt.fr_cat,
            "subcategory": vec![0; tt.fr_func.len()],
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

/// Builds the whole profile as JSON.
pub fn to_json(p: &Profile, run: &RunInfo) -> Value {
    let mut strings = Strings::default();
    let mut threads = Vec::new();
    for proc in p.all_processes() {
        for t in proc.threads.values() {
            threads.push(thread_json(p, &mut strings, proc, t));
        }
    }
    let categories: Vec<Value> = Category::ALL
        .iter()
        .map(|(_, name, color)| json!({"name": name, "color": color, "subcategories": ["Other"]}))
        .collect();
    let libs: Vec<Value> = p
        .libs
        .iter()
        .map(|l| {
            json!({
                "arch": "x86_64",
                "name": l.name.as_ref(),
                "path": l.path.as_ref(),
                "debugName": l.name.as_ref(),
                "debugPath": l.path.as_ref(),
                "breakpadId": "",
                "codeId": null,
            })
        })
        .collect();
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
        "maxReaderLagMs": c.max_lag_ms,
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
    if let Some(k) = &run.kernel {
        tachyon["kernel"] = json!({"release": k.release, "programs": k.programs});
    }
    let oscpu = match &run.kernel {
        Some(k) => format!("Linux {} x86_64", k.release),
        None => "Linux x86_64".into(),
    };
    json!({
        "meta": {
            "interval": run.interval_ms,
            "sampleUnits": {"time": "ms", "eventDelay": "ms", "threadCPUDelta": "µs"},
            "startTime": run.start_epoch_ms,
            "abi": "x86_64-gcc3",
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
        "threads": threads,
        "pages": [],
        "counters": [],
        "shared": {"stringArray": strings.list},
    })
}
