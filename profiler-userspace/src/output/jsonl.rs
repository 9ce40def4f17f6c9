//! CPython's sampler JSON Lines (schema version 0): `meta`, `string_table`, `frame_table`, `agg`
//! and `end` records, tables in chunks of at most 256 entries with explicit ids. Native frames
//! carry their library as the path and their symbol as the function; counts are sampling
//! periods (an off-CPU wait counts for the periods it lasted).

use std::collections::{HashMap, HashSet};

use serde_json::{json, Value};

use super::{periods, stack_totals, RunInfo};
use crate::aggregate::{FrameId, Profile};

const CHUNK: usize = 256;
const SCHEMA: u32 = 0;

#[derive(Default)]
struct Tables {
    strings: Vec<String>,
    string_ids: HashMap<String, usize>,
    frames: Vec<Value>,
    frame_ids: HashMap<(usize, usize, u32, Option<usize>), usize>,
}

impl Tables {
    fn string(&mut self, s: &str) -> usize {
        if let Some(&i) = self.string_ids.get(s) {
            return i;
        }
        let i = self.strings.len();
        self.strings.push(s.to_string());
        self.string_ids.insert(s.to_string(), i);
        i
    }

    fn frame(&mut self, p: &Profile, frame: FrameId) -> usize {
        let fr = &p.frames[frame];
        let func = &p.funcs[fr.func];
        let path = match (&func.file, func.lib) {
            (Some(file), _) => file.to_string(),
            (None, Some(lib)) => p.libs[lib].path.to_string(),
            // A frame with no source or library: CPython's synthetic-frame path.
            (None, None) => "~".to_string(),
        };
        let line = if func.is_python {
            fr.line.or(func.line).unwrap_or(0)
        } else {
            0
        };
        let opcode = fr.opcode.as_ref().map(|o| self.string(&o.name));
        let key = (self.string(&path), self.string(&func.name), line, opcode);
        if let Some(&id) = self.frame_ids.get(&key) {
            return id;
        }
        let id = self.frames.len();
        let mut frame = json!({
            "frame_id": id,
            "path_str_id": key.0,
            "func_str_id": key.1,
            "line": line,
        });
        // With --opcodes, the innermost Python frame's instruction (an extension of the schema).
        if let Some(op) = opcode {
            frame["opcode_str_id"] = json!(op);
        }
        self.frames.push(frame);
        self.frame_ids.insert(key, id);
        id
    }
}

fn labels_object(labels: &[(String, String)]) -> Value {
    labels
        .iter()
        .map(|(k, v)| (k.clone(), json!(v)))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

pub fn to_text(p: &Profile, run: &RunInfo) -> String {
    let mut t = Tables::default();
    let mut self_ms: Vec<f64> = Vec::new();
    let mut cum_ms: Vec<f64> = Vec::new();
    let mut total_ms = 0.0;
    let mut ids: HashMap<FrameId, usize> = HashMap::new();
    let mut seen = HashSet::new();
    for st in stack_totals(p) {
        total_ms += st.ms;
        seen.clear();
        let frames = p.stack_root_first(st.stack);
        for (i, &f) in frames.iter().rev().enumerate() {
            let id = *ids.entry(f).or_insert_with(|| t.frame(p, f));
            if id >= self_ms.len() {
                self_ms.resize(id + 1, 0.0);
                cum_ms.resize(id + 1, 0.0);
            }
            if i == 0 {
                self_ms[id] += st.ms;
            }
            if seen.insert(id) {
                cum_ms[id] += st.ms;
            }
        }
    }
    let iv = p.interval_ms;
    let total = periods(total_ms, iv);
    let base = |kind: &str| json!({"type": kind, "v": SCHEMA, "run_id": run.run_id});
    let mut lines: Vec<Value> = Vec::new();
    let mut meta = base("meta");
    meta["sample_interval_usec"] = json!((iv * 1000.0).round() as u64);
    meta["mode"] = json!(run.mode);
    // Extensions of the schema: the host, the run's labels and who each process is.
    meta["host"] = json!(run.host);
    meta["labels"] = labels_object(&run.labels);
    meta["processes"] = p
        .processes
        .values()
        .chain(p.retired.iter())
        .map(|proc| {
            let id = proc.identity.as_ref();
            json!({
                "pid": proc.pid,
                "generation": proc.generation,
                "name": proc.name,
                "service": id.map(|i| i.service.as_str()),
                "container_id": id.and_then(|i| i.container_id.as_deref()),
                "ns_pid": id.and_then(|i| i.ns_pid),
                "labels": labels_object(&super::process_labels(proc, run)),
            })
        })
        .collect::<Vec<_>>()
        .into();
    lines.push(meta);
    let strings: Vec<Value> = t
        .strings
        .iter()
        .enumerate()
        .map(|(i, s)| json!({"str_id": i, "value": s}))
        .collect();
    for chunk in strings.chunks(CHUNK) {
        let mut r = base("string_table");
        r["strings"] = json!(chunk);
        lines.push(r);
    }
    for chunk in t.frames.chunks(CHUNK) {
        let mut r = base("frame_table");
        r["frames"] = json!(chunk);
        lines.push(r);
    }
    let entries: Vec<Value> = (0..t.frames.len())
        .map(|i| {
            json!({
                "frame_id": i,
                "self": periods(self_ms[i], iv),
                "cumulative": periods(cum_ms[i], iv),
            })
        })
        .collect();
    for chunk in entries.chunks(CHUNK) {
        let mut r = base("agg");
        r["kind"] = json!("frame");
        r["scope"] = json!("final");
        r["samples_total"] = json!(total);
        r["entries"] = json!(chunk);
        lines.push(r);
    }
    let mut end = base("end");
    end["samples_total"] = json!(total);
    lines.push(end);
    let mut out = String::new();
    for l in lines {
        out.push_str(&l.to_string());
        out.push('\n');
    }
    out
}
