//! Firefox Profiler output: the processed profile format, version 57 (per-thread tables, strings
//! in `shared.stringArray`), which the profiler upgrades on load. Python frames are funcs with a
//! file name and line and are marked `isJS`/`relevantForJS`, so the profiler's "JavaScript only"
//! view becomes a Python-only view; native frames keep their library and symbol.

use std::borrow::Cow;
use std::rc::Rc;

use rustc_hash::FxHashMap;

use serde_json::{json, Value};

use super::RunInfo;
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

/// Marker types: (type, label, description, colour, drawn in the timeline overview, has the
/// off-CPU fields). Colours are the Firefox Profiler's graph colours.
const MARKER_TYPES: [(&str, &str, &str, &str, bool, bool); 11] = [
    ("HasGIL", "Has GIL", "The thread holds the GIL", "green", false, false),
    ("NoGIL", "No GIL", "The thread does not hold the GIL", "grey", false, false),
    (
        "WaitingforGIL",
        "Waiting for GIL",
        "The thread waits to take the GIL",
        "red",
        true,
        false,
    ),
    ("OnCPU", "On CPU", "The thread runs on a CPU", "blue", false, false),
    (
        "OffCPU",
        "Off CPU",
        "The thread is not running: it sleeps, waits for I/O or a lock, or is preempted",
        "grey",
        false,
        true,
    ),
    (
        "Switching",
        "Switching",
        "The thread goes on and off CPUs faster than the sampling period (the CPU graph shows its share)",
        "orange",
        false,
        false,
    ),
    (
        "PythonCode",
        "Python Code",
        "The thread runs Python code (holds the GIL)",
        "yellow",
        false,
        false,
    ),
    (
        "NativeCode",
        "Native Code",
        "The thread runs native code without the GIL",
        "teal",
        false,
        false,
    ),
    (
        "GCCollecting",
        "GC Collecting",
        "The interpreter's garbage collector runs",
        "magenta",
        true,
        false,
    ),
    (
        "HasException",
        "Has Exception",
        "An exception is being raised or handled in the thread",
        "brown",
        false,
        false,
    ),
    (
        "NoException",
        "No Exception",
        "No exception is being raised or handled in the thread",
        "grey",
        false,
        false,
    ),
];

/// The schema of the `--opcodes` markers: one per run of samples whose innermost Python frame
/// ran the same instruction of the same line, as CPython's sampler writes them.
fn opcode_schema() -> Value {
    json!({
        "name": "Opcode",
        "display": ["marker-chart", "marker-table"],
        "chartLabel": "{marker.data.opname}",
        "tooltipLabel": "{marker.data.opname}",
        "tableLabel": "{marker.data.opname} at line {marker.data.line} in {marker.data.function}",
        "description": "The bytecode instruction the thread's innermost Python frame runs",
        "colorField": "color",
        "fields": [
            {"key": "opname", "label": "Opcode", "format": "string", "searchable": true},
            {"key": "base_opname", "label": "Base opcode", "format": "string", "searchable": true},
            {"key": "is_specialized", "label": "Specialized", "format": "string"},
            {"key": "line", "label": "Line", "format": "integer"},
            {"key": "function", "label": "Function", "format": "string", "searchable": true},
            {"key": "duration", "label": "Duration", "format": "duration"},
            {"key": "color", "label": "Colour", "format": "string", "hidden": true},
        ],
    })
}

/// The opcode markers of a thread (`--opcodes`): each run of kept samples whose innermost Python
/// frame has the same function, line and instruction, from its first sample to the next run's.
fn opcode_markers(p: &Profile, t: &ThreadData) -> Vec<(String, f64, f64, Value)> {
    let mut leaf: FxHashMap<StackId, Option<FrameId>> = FxHashMap::default();
    let mut out = Vec::new();
    let mut open: Option<(FrameId, f64)> = None;
    let mut last_end = 0.0;
    let close = |out: &mut Vec<_>, (f, start): (FrameId, f64), end: f64| {
        let fr: &crate::aggregate::Frame = &p.frames[f];
        let Some(op) = &fr.opcode else { return };
        let func = &p.funcs[fr.func];
        out.push((
            op.name.to_string(),
            start,
            end,
            json!({
                "type": "Opcode",
                "tid": t.tid,
                "opname": op.name.as_ref(),
                "base_opname": op.base.as_deref().unwrap_or(&op.name),
                "is_specialized": if op.base.is_some() { "yes" } else { "no" },
                "line": fr.line.or(func.line).unwrap_or(0),
                "function": func.name.as_ref(),
                "duration": end - start,
                // The Opcodes category's colour.
                "color": "magenta",
            }),
        ));
    };
    for s in t.samples.iter().filter(|s| s.in_mode) {
        let at = s.stack.and_then(|st| {
            *leaf.entry(st).or_insert_with(|| {
                let mut cur = Some(st);
                while let Some(i) = cur {
                    let f = p.stacks[i].0;
                    if p.funcs[p.frames[f].func].is_python {
                        return p.frames[f].opcode.is_some().then_some(f);
                    }
                    cur = p.stacks[i].1;
                }
                None
            })
        });
        if open.map(|o| o.0) != at {
            if let Some(o) = open.take() {
                close(&mut out, o, s.time_ms);
            }
            open = at.map(|f| (f, s.time_ms));
        }
        last_end = s.time_ms + s.weight_ms;
    }
    if let Some(o) = open {
        close(&mut out, o, last_end);
    }
    out
}

fn marker_schema() -> Value {
    let mut schema = marker_types_schema();
    if let Value::Array(a) = &mut schema {
        a.push(opcode_schema());
    }
    schema
}

fn marker_types_schema() -> Value {
    Value::Array(
        MARKER_TYPES
            .iter()
            .map(|&(ty, label, desc, _, overview, waits)| {
                let mut display = vec!["marker-chart", "marker-table"];
                if overview {
                    display.push("timeline-overview");
                }
                // Searchable: a marker search ("I/O", "futex", a function) then filters the
                // call tree to the samples during the markers it finds.
                let mut fields = vec![
                    json!({"key": "duration", "label": "Duration", "format": "duration"}),
                    json!({"key": "function", "label": "Python function at the start", "format": "string", "searchable": true}),
                ];
                if waits {
                    fields.push(json!({"key": "reason", "label": "Reason", "format": "string", "searchable": true}));
                    fields.push(json!({"key": "waitedOn", "label": "Waited in", "format": "string", "searchable": true}));
                }
                fields.push(
                    json!({"key": "color", "label": "Colour", "format": "string", "hidden": true}),
                );
                let table = if waits {
                    format!("{label}: {{marker.data.reason}} in {{marker.data.function}}")
                } else {
                    format!("{label} in {{marker.data.function}}")
                };
                json!({
                    "name": ty,
                    "display": display,
                    "chartLabel": label,
                    "tooltipLabel": label,
                    "tableLabel": table,
                    "description": desc,
                    "colorField": "color",
                    "fields": fields,
                })
            })
            .collect(),
    )
}

/// Why a thread was off CPU, read from the stack it blocked in: the system call (or kernel path)
/// it waited in, and its kind.
fn wait_of(p: &Profile, stack: StackId) -> Option<(Rc<str>, &'static str)> {
    let frames = p.stack_root_first(stack);
    let names: Vec<&str> = frames
        .iter()
        .map(|&f| p.funcs[p.frames[f].func].name.as_ref())
        .collect();
    if frames
        .iter()
        .any(|&f| p.frames[f].category == Category::Gil)
    {
        return Some(("the GIL".into(), "GIL"));
    }
    let kernel = |f: &FrameId| p.frames[*f].category == Category::Kernel;
    let first_kernel = frames.iter().position(kernel)?;
    for n in &names[first_kernel..] {
        let call = [
            "__x64_sys_",
            "__ia32_sys_",
            "__se_sys_",
            "__do_sys_",
            "ksys_",
        ]
        .iter()
        .find_map(|pre| n.strip_prefix(pre));
        if let Some(call) = call {
            let kind = match call {
                "futex" | "futex_waitv" | "sched_yield" => "lock",
                "clock_nanosleep" | "nanosleep" | "pause" => "sleep",
                "wait4" | "waitid" => "child process",
                "read" | "write" | "readv" | "writev" | "pread64" | "pwrite64" | "recvfrom"
                | "recvmsg" | "recvmmsg" | "sendto" | "sendmsg" | "sendmmsg" | "accept"
                | "accept4" | "connect" | "epoll_wait" | "epoll_pwait" | "epoll_pwait2"
                | "select" | "pselect6" | "poll" | "ppoll" | "openat" | "fsync" | "fdatasync"
                | "sendfile64" | "splice" | "io_uring_enter" | "io_getevents" => "I/O",
                _ => "system call",
            };
            // `time.sleep` waits in `select` (glibc: pselect6) before 3.11.
            let sleeping = names[..first_kernel]
                .iter()
                .any(|n| matches!(*n, "time_sleep" | "pysleep"));
            return Some((call.into(), if sleeping { "sleep" } else { kind }));
        }
    }
    let path = &names[first_kernel..];
    if path
        .iter()
        .any(|n| n.contains("page_fault") || *n == "handle_mm_fault")
    {
        return Some(("a page fault".into(), "page fault"));
    }
    if path
        .iter()
        .any(|n| n.starts_with("irqentry_exit") || n.starts_with("preempt_schedule"))
    {
        return Some(("preemption".into(), "preempted"));
    }
    None
}

/// The innermost Python function of a stack.
fn python_function(p: &Profile, stack: StackId) -> Option<Rc<str>> {
    let mut cur = Some(stack);
    while let Some(s) = cur {
        let f = &p.funcs[p.frames[p.stacks[s].0].func];
        if f.is_python {
            return Some(f.name.as_ref().into());
        }
        cur = p.stacks[s].1;
    }
    None
}

/// What a marker says of the stack at its start: the Python function, and the wait. Shared by
/// the markers that start at one stack (most of a thread's), so that building them allocates
/// no string.
type StackFacts = (Option<Rc<str>>, Option<(Rc<str>, &'static str)>);

/// The fields of a marker, from the thread's sample at its start.
fn marker_data(
    p: &Profile,
    t: &ThreadData,
    m: &Marker,
    cache: &mut FxHashMap<StackId, StackFacts>,
) -> MarkerOut {
    let kind = MARKER_TYPES.iter().find(|k| k.1 == m.name);
    let mut data = MarkerData {
        kind: kind.map_or_else(
            || Cow::Owned(m.name.replace(' ', "")),
            |k| Cow::Borrowed(k.0),
        ),
        tid: t.tid,
        duration: m.end_ms - m.start_ms,
        color: kind.map_or("grey", |k| k.3),
        function: None,
        waited_on: None,
        reason: None,
    };
    let waits = kind.is_some_and(|k| k.5);
    // The sample at the start: an off-CPU marker's is the capture taken as the thread left the
    // CPU; others' the first sample in the marker.
    let from = t
        .samples
        .partition_point(|s: &Sample| s.time_ms < m.start_ms - 1e-3);
    let sample = t.samples[from..]
        .iter()
        .take_while(|s| s.time_ms <= m.end_ms.max(m.start_ms + 1e-3))
        .find(|s| !waits || s.state & crate::aggregate::state::ON_CPU == 0);
    if let Some(stack) = sample.and_then(|s| s.stack) {
        let (func, wait) = cache
            .entry(stack)
            .or_insert_with(|| (python_function(p, stack), wait_of(p, stack)));
        data.function = func.clone();
        if waits {
            if let Some((on, kind)) = wait {
                data.waited_on = Some(on.clone());
                data.reason = Some(kind);
            }
        }
    }
    MarkerOut::Known(data)
}

/// A marker's fields as the viewer reads them (keys in the order a `serde_json::Value` map
/// writes them, so the output is the same bytes): written straight to the output, as are the
/// samples and markers tables, without a `Value` per entry (building, writing and dropping those
/// was most of user space's work per sample of a run).
#[derive(serde::Serialize)]
struct MarkerData {
    color: &'static str,
    duration: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    function: Option<Rc<str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'static str>,
    tid: u32,
    #[serde(rename = "type")]
    kind: Cow<'static, str>,
    #[serde(rename = "waitedOn", skip_serializing_if = "Option::is_none")]
    waited_on: Option<Rc<str>>,
}

#[derive(serde::Serialize)]
#[serde(untagged)]
enum MarkerOut {
    Known(MarkerData),
    Other(Value),
}

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
    let is_main = t.tid == pid;
    let samples = SamplesOut {
        length: s_time.len(),
        stack: s_stack,
        thread_cpu_delta: s_cpu,
        time: s_time,
        weight: s_weight,
        weight_type: "tracing-ms",
    };
    let markers = MarkersOut {
        category: m_cat,
        data: m_data,
        end_time: m_end,
        length: n_markers,
        name: m_name,
        phase: vec![1; n_markers],
        start_time: m_start,
    };
    let head = json!({
        "processType": "default",
        "processName": proc_name,
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
    });
    ThreadOut {
        head,
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
    let categories: Vec<Value> = Category::ALL
        .iter()
        .map(|(cat, name, color)| {
            let subcategories: &[&str] = match cat {
                Category::Python => &["Other", "interpreter"],
                _ => &["Other"],
            };
            json!({"name": name, "color": color, "subcategories": subcategories})
        })
        .collect();
    let libs: Vec<Value> = p
        .libs
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
