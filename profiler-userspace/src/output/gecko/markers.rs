//! The Gecko markers: their types and schema (GIL, off-CPU, GC, exceptions, opcodes), each
//! marker's data, and the opcode markers of `--opcodes`.

use super::*;

/// Marker types: (type, label, description, colour, drawn in the timeline overview, has the
/// off-CPU fields). Colours are the Firefox Profiler's graph colours.
pub(super) const MARKER_TYPES: [(&str, &str, &str, &str, bool, bool); 11] = [
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
pub(super) fn opcode_schema() -> Value {
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
pub(super) fn opcode_markers(p: &Profile, t: &ThreadData) -> Vec<(String, f64, f64, Value)> {
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

pub(super) fn marker_schema() -> Value {
    let mut schema = marker_types_schema();
    if let Value::Array(a) = &mut schema {
        a.push(opcode_schema());
    }
    schema
}

pub(super) fn marker_types_schema() -> Value {
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
pub(super) fn wait_of(p: &Profile, stack: StackId) -> Option<(Rc<str>, &'static str)> {
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
pub(super) fn python_function(p: &Profile, stack: StackId) -> Option<Rc<str>> {
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
pub(super) fn marker_data(
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
pub(super) struct MarkerData {
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
pub(super) enum MarkerOut {
    Known(MarkerData),
    Other(Value),
}
