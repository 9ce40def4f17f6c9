//! OTLP profiles: an `ExportProfilesServiceRequest` of the OpenTelemetry profiles signal
//! (`v1development`, the version the specification publishes), with the messages of the
//! `opentelemetry-proto` crate. One resource per process, its attributes by OpenTelemetry's
//! semantic conventions (`service.name`, `host.name`, `container.id`, `k8s.pod.uid`,
//! `process.pid`, `process.executable.name` and `.path`, `process.runtime.name` and
//! `.version`) and its labels; one profile each, whose samples are the process's stacks per
//! thread (`thread.name`, `thread.id`), valued in nanoseconds of the mode's time. The
//! dictionary is shared by the whole request: index 0 of each table is its zero value.

use std::collections::HashMap;

use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::profiles::v1development as pp;
use opentelemetry_proto::tonic::resource::v1::Resource;
use prost::Message;

use super::{process_labels, stack_totals, RunInfo};
use crate::aggregate::{FrameId, ProcessData, Profile};

/// The OTLP/HTTP path of the profiles signal, after the collector's base URL.
pub const PATH: &str = "/v1development/profiles";

/// The URL a request goes to: `url` as given when it names the profiles path already, else
/// the signal's path after it (as `OTEL_EXPORTER_OTLP_ENDPOINT` is read).
pub fn endpoint(url: &str) -> String {
    let url = url.trim_end_matches('/');
    if url.ends_with("/profiles") {
        url.to_string()
    } else {
        format!("{url}{PATH}")
    }
}

#[derive(Default)]
struct Dictionary {
    d: pp::ProfilesDictionary,
    strings: HashMap<String, i32>,
    mappings: HashMap<usize, i32>,
    functions: HashMap<usize, i32>,
    locations: HashMap<FrameId, i32>,
    stacks: HashMap<Vec<i32>, i32>,
    attributes: HashMap<(i32, String), i32>,
}

impl Dictionary {
    fn new() -> Dictionary {
        let mut d = Dictionary::default();
        // Each table's zero value first: an index of 0 means "none".
        d.d.string_table.push(String::new());
        d.strings.insert(String::new(), 0);
        d.d.mapping_table.push(pp::Mapping::default());
        d.d.location_table.push(pp::Location::default());
        d.d.function_table.push(pp::Function::default());
        d.d.link_table.push(pp::Link::default());
        d.d.attribute_table.push(pp::KeyValueAndUnit::default());
        d.d.stack_table.push(pp::Stack::default());
        d
    }

    fn string(&mut self, s: &str) -> i32 {
        if let Some(&i) = self.strings.get(s) {
            return i;
        }
        let i = self.d.string_table.len() as i32;
        self.d.string_table.push(s.to_string());
        self.strings.insert(s.to_string(), i);
        i
    }

    fn attribute(&mut self, key: &str, value: &str) -> i32 {
        let k = self.string(key);
        if let Some(&i) = self.attributes.get(&(k, value.to_string())) {
            return i;
        }
        let i = self.d.attribute_table.len() as i32;
        self.d.attribute_table.push(pp::KeyValueAndUnit {
            key_strindex: k,
            value: Some(string_value(value)),
            unit_strindex: 0,
        });
        self.attributes.insert((k, value.to_string()), i);
        i
    }

    fn mapping(&mut self, p: &Profile, lib: usize) -> i32 {
        if let Some(&i) = self.mappings.get(&lib) {
            return i;
        }
        let filename_strindex = self.string(&p.libs[lib].path);
        let attribute_indices = match &p.libs[lib].build_id {
            Some(b) => vec![self.attribute("process.executable.build_id.gnu", b)],
            None => Vec::new(),
        };
        let i = self.d.mapping_table.len() as i32;
        self.d.mapping_table.push(pp::Mapping {
            filename_strindex,
            attribute_indices,
            ..Default::default()
        });
        self.mappings.insert(lib, i);
        i
    }

    fn function(&mut self, p: &Profile, func: usize) -> i32 {
        if let Some(&i) = self.functions.get(&func) {
            return i;
        }
        let f = &p.funcs[func];
        let name = self.string(&f.name);
        let filename_strindex = match &f.file {
            Some(file) => self.string(file),
            None => 0,
        };
        let i = self.d.function_table.len() as i32;
        self.d.function_table.push(pp::Function {
            name_strindex: name,
            system_name_strindex: name,
            filename_strindex,
            start_line: f.line.unwrap_or(0) as i64,
        });
        self.functions.insert(func, i);
        i
    }

    fn location(&mut self, p: &Profile, frame: FrameId) -> i32 {
        if let Some(&i) = self.locations.get(&frame) {
            return i;
        }
        let fr = &p.frames[frame];
        let func = &p.funcs[fr.func];
        let mapping_index = func.lib.map_or(0, |l| self.mapping(p, l));
        let function_index = self.function(p, fr.func);
        let i = self.d.location_table.len() as i32;
        self.d.location_table.push(pp::Location {
            mapping_index,
            address: fr.address.unwrap_or(0),
            lines: vec![pp::Line {
                function_index,
                line: fr
                    .line
                    .or(if func.is_python { func.line } else { None })
                    .unwrap_or(0) as i64,
                column: 0,
            }],
            attribute_indices: Vec::new(),
        });
        self.locations.insert(frame, i);
        i
    }

    fn stack(&mut self, locations: Vec<i32>) -> i32 {
        if let Some(&i) = self.stacks.get(&locations) {
            return i;
        }
        let i = self.d.stack_table.len() as i32;
        self.d.stack_table.push(pp::Stack {
            location_indices: locations.clone(),
        });
        self.stacks.insert(locations, i);
        i
    }
}

fn string_value(s: &str) -> AnyValue {
    AnyValue {
        value: Some(any_value::Value::StringValue(s.to_string())),
    }
}

fn kv(key: &str, value: AnyValue) -> KeyValue {
    KeyValue {
        key: key.to_string(),
        value: Some(value),
        ..Default::default()
    }
}

/// A process's resource attributes (see the module's documentation).
fn resource(proc: &ProcessData, run: &RunInfo) -> Resource {
    let mut attrs = Vec::new();
    let s = |k: &str, v: &str| kv(k, string_value(v));
    let id = proc.identity.as_ref();
    attrs.push(s(
        "service.name",
        id.map_or(proc.name.as_str(), |i| i.service.as_str()),
    ));
    if !run.host.is_empty() {
        attrs.push(s("host.name", &run.host));
    }
    attrs.push(kv(
        "process.pid",
        AnyValue {
            value: Some(any_value::Value::IntValue(proc.pid as i64)),
        },
    ));
    if let Some(i) = id {
        if let Some(exe) = &i.executable {
            attrs.push(s(
                "process.executable.name",
                exe.rsplit('/').next().unwrap_or(exe),
            ));
            attrs.push(s("process.executable.path", exe));
        }
        if let Some(c) = &i.container_id {
            attrs.push(s("container.id", c));
        }
        if let Some(u) = &i.pod_uid {
            attrs.push(s("k8s.pod.uid", u));
        }
    }
    if let Some(v) = &proc.python {
        attrs.push(s("process.runtime.name", "cpython"));
        attrs.push(s("process.runtime.version", v));
    }
    // The labels that are not said above already.
    for (k, v) in process_labels(proc, run) {
        if !matches!(k.as_str(), "service_name" | "container_id" | "pod_uid") {
            attrs.push(s(&k, &v));
        }
    }
    Resource {
        attributes: attrs,
        ..Default::default()
    }
}

/// The request for a profile (a run's, or a continuous interval's).
pub fn request(p: &Profile, run: &RunInfo) -> ExportProfilesServiceRequest {
    let mut dict = Dictionary::new();
    let kind = super::pprof::time_kind(&run.mode);
    let sample_type = pp::ValueType {
        type_strindex: dict.string(kind),
        unit_strindex: dict.string("nanoseconds"),
    };
    let (k_name, k_id) = ("thread.name", "thread.id");
    let mut by_process: Vec<(&ProcessData, Vec<pp::Sample>)> = Vec::new();
    for st in stack_totals(p) {
        let ns = (st.ms * 1e6).round() as i64;
        if ns <= 0 {
            continue;
        }
        let locations: Vec<i32> = p
            .stack_root_first(st.stack)
            .into_iter()
            .rev()
            .map(|f| dict.location(p, f))
            .collect();
        let stack_index = dict.stack(locations);
        let thread = st.thread.python_name.as_ref().unwrap_or(&st.thread.name);
        let attribute_indices = vec![
            dict.attribute(k_name, thread),
            dict.attribute(k_id, &st.thread.tid.to_string()),
        ];
        let sample = pp::Sample {
            stack_index,
            attribute_indices,
            link_index: 0,
            values: vec![ns],
            timestamps_unix_nano: Vec::new(),
        };
        let same = by_process
            .last()
            .is_some_and(|(q, _)| std::ptr::eq(*q, st.process));
        if same {
            by_process.last_mut().unwrap().1.push(sample);
        } else {
            by_process.push((st.process, vec![sample]));
        }
    }
    let time_unix_nano = (run.start_epoch_ms * 1e6) as u64;
    let duration_nano = (run.duration_ms * 1e6) as u64;
    let period = (p.interval_ms * 1e6).round() as i64;
    let scope = InstrumentationScope {
        name: "tachyon-bpf".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        ..Default::default()
    };
    let resource_profiles = by_process
        .into_iter()
        .map(|(proc, samples)| pp::ResourceProfiles {
            resource: Some(resource(proc, run)),
            scope_profiles: vec![pp::ScopeProfiles {
                scope: Some(scope.clone()),
                profiles: vec![pp::Profile {
                    sample_type: Some(sample_type),
                    samples,
                    time_unix_nano,
                    duration_nano,
                    period_type: Some(sample_type),
                    period,
                    ..Default::default()
                }],
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        })
        .collect();
    ExportProfilesServiceRequest {
        resource_profiles,
        dictionary: Some(dict.d),
    }
}

/// The request, encoded (OTLP/HTTP's `application/x-protobuf` body).
pub fn to_bytes(p: &Profile, run: &RunInfo) -> Vec<u8> {
    request(p, run).encode_to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::Mode;

    #[test]
    fn one_resource_per_process_and_values_add_up() {
        let (p, run) = super::super::fixture::profile(Mode::Wall);
        let r = request(&p, &run);
        let d = r.dictionary.as_ref().unwrap();
        assert_eq!(d.string_table[0], "");
        assert_eq!(d.stack_table[0], pp::Stack::default());
        assert_eq!(r.resource_profiles.len(), 2);
        let attr = |rp: &pp::ResourceProfiles, k: &str| {
            rp.resource
                .as_ref()
                .unwrap()
                .attributes
                .iter()
                .find(|a| a.key == k)
                .and_then(|a| match &a.value.as_ref()?.value {
                    Some(any_value::Value::StringValue(s)) => Some(s.clone()),
                    Some(any_value::Value::IntValue(i)) => Some(i.to_string()),
                    _ => None,
                })
        };
        let py = r
            .resource_profiles
            .iter()
            .find(|rp| attr(rp, "process.pid").as_deref() == Some("100"))
            .unwrap();
        assert_eq!(attr(py, "service.name").as_deref(), Some("checkout"));
        assert_eq!(attr(py, "host.name").as_deref(), Some("testhost"));
        assert_eq!(attr(py, "container.id").unwrap().len(), 64);
        assert_eq!(attr(py, "cluster").as_deref(), Some("eu-1"));
        // The values are the in-mode time of the profile's stacks.
        let total: i64 = r
            .resource_profiles
            .iter()
            .flat_map(|rp| &rp.scope_profiles[0].profiles[0].samples)
            .map(|s| s.values[0])
            .sum();
        let want: f64 = stack_totals(&p).iter().map(|s| s.ms).sum();
        assert_eq!(total, (want * 1e6).round() as i64);
        // Stacks are leaf first, and every index points into its table.
        let prof = &py.scope_profiles[0].profiles[0];
        for s in &prof.samples {
            let stack = &d.stack_table[s.stack_index as usize];
            let leaf = &d.location_table[stack.location_indices[0] as usize];
            let f = &d.function_table[leaf.lines[0].function_index as usize];
            assert!(
                ["work", "schedule"].contains(&d.string_table[f.name_strindex as usize].as_str())
            );
            for &a in &s.attribute_indices {
                assert!((a as usize) < d.attribute_table.len());
            }
        }
    }
}
