//! `--opcodes`: the instruction each sample of a Python thread runs, on every installed
//! CPython, as markers, in recordings, collapsed stacks and JSONL.

use std::time::Duration;

use tachyon_bpf_tests::*;

/// A loop whose lines run different instructions (attribute loads that 3.11+ specializes,
/// arithmetic, a call), then the function's own instructions as `dis` lists them, by line.
const OPCODES: &str = r#"
import dis, json, sys, time

class P:
    def __init__(self, x):
        self.x = x

def hot(items):
    total = 0
    for p in items:
        a = p.x
        b = a * 3 + 1
        total += abs(b)
    return total

items = [P(i) for i in range(2000)]
stop = time.time() + float(sys.argv[2])
while time.time() < stop:
    hot(items)

line = None
ops = []
for ins in dis.get_instructions(hot):
    pos = getattr(ins, "positions", None)
    if pos is not None and pos.lineno is not None:
        line = pos.lineno
    elif pos is None and ins.starts_line:
        line = ins.starts_line
    ops.append([line, ins.opname])
with open(sys.argv[1], "w") as f:
    json.dump(ops, f)
"#;

/// `--opcodes`: every Opcode marker of `hot` names an instruction that `dis` lists on the
/// marker's line (its base instruction, for a specialized form), on every version; 3.11+ shows
/// specialized forms. A recording keeps the opcodes, and collapsed stacks and JSONL show them.
#[test]
fn opcodes_name_the_instruction_each_sample_runs() {
    require_root();
    let dir = scratch("py_opcodes");
    let script = dir.join("opcodes.py");
    std::fs::write(&script, OPCODES).unwrap();
    for (label, py) in interpreters() {
        let minor = minor_of(&label);
        let out = dir.join(format!("{label}.json"));
        let ops_file = dir.join(format!("{label}.ops.json"));
        profile_command(
            &out,
            &["-m", "cpu", "--opcodes"],
            &[
                py.to_str().unwrap(),
                script.to_str().unwrap(),
                ops_file.to_str().unwrap(),
                "1.5",
            ],
        );
        let ops: Vec<(Option<u64>, String)> =
            serde_json::from_str(&std::fs::read_to_string(&ops_file).unwrap()).unwrap();
        let on_line =
            |line: u64, name: &str| ops.iter().any(|(l, n)| *l == Some(line) && n == name);
        // The viewer loads the markers under their opcode names.
        let v = Viewer::load(&out).unwrap();
        let procs = v.processes().unwrap();
        let t = main_thread(&procs, "opcodes.py");
        let shown = v.marker_totals(&t.handle).unwrap();
        // Their fields, read from the profile the viewer loaded.
        let profile: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
        let strings = profile["shared"]["stringArray"].as_array().unwrap();
        let thread = profile["threads"]
            .as_array()
            .unwrap()
            .iter()
            .find(|th| th["tid"].as_u64() == Some(t.tid))
            .unwrap();
        let m = &thread["markers"];
        let (mut in_hot, mut agree, mut specialized) = (0, 0, 0);
        let mut names = std::collections::HashSet::new();
        let mut wrong = Vec::new();
        for (i, d) in m["data"].as_array().unwrap().iter().enumerate() {
            if d["type"] != "Opcode" || d["function"] != "hot" {
                continue;
            }
            in_hot += 1;
            let name = strings[m["name"][i].as_u64().unwrap() as usize]
                .as_str()
                .unwrap();
            assert_eq!(
                d["opname"], name,
                "{label}: the marker is named by its opcode"
            );
            assert!(
                shown.contains_key(name),
                "{label}: the viewer has no {name} marker"
            );
            let base = d["base_opname"].as_str().unwrap();
            let line = d["line"].as_u64().unwrap();
            if on_line(line, base) || on_line(line, name) {
                agree += 1;
            } else if wrong.len() < 5 {
                wrong.push(format!("{name} ({base}) at line {line}"));
            }
            if d["is_specialized"] == "yes" {
                specialized += 1;
            }
            names.insert(name.to_string());
        }
        eprintln!("{label}: {agree} of {in_hot} opcode markers in hot agree with dis; {specialized} specialized; {names:?}");
        assert!(in_hot >= 100, "{label}: {in_hot} opcode markers in hot");
        assert!(
            agree as f64 >= 0.99 * in_hot as f64,
            "{label}: {agree} of {in_hot} markers name an instruction of their line; not: {wrong:?}; dis: {ops:?}"
        );
        assert!(names.len() >= 4, "{label}: only {names:?}");
        if minor >= 11 {
            assert!(
                specialized > 0,
                "{label}: no specialized form among {names:?}"
            );
        }
    }

    // A recording keeps them; collapsed stacks end in `hot:LINE:OPNAME`, JSONL names them.
    let rec = dir.join("run.tbpf");
    let o = run_profiler(
        &[
            "record",
            "-m",
            "cpu",
            "--opcodes",
            "-o",
            rec.to_str().unwrap(),
            "--",
            python("3.12.1").to_str().unwrap(),
            script.to_str().unwrap(),
            dir.join("rec.ops.json").to_str().unwrap(),
            "1",
        ],
        Duration::from_secs(60),
    );
    assert!(o.status.success(), "record: {}", stderr_of(&o));
    let folded = dir.join("run.folded");
    let jsonl = dir.join("run.jsonl");
    for (f, path) in [("collapsed", &folded), ("jsonl", &jsonl)] {
        let o = run_profiler(
            &[
                "convert",
                rec.to_str().unwrap(),
                "-f",
                f,
                "-o",
                path.to_str().unwrap(),
            ],
            Duration::from_secs(60),
        );
        assert!(o.status.success(), "convert -f {f}: {}", stderr_of(&o));
    }
    let text = std::fs::read_to_string(&folded).unwrap();
    let hot_leaves = text
        .lines()
        .filter_map(|l| {
            l.rsplit_once(' ')?
                .0
                .rsplit(';')
                .find(|f| f.contains(":hot:"))
        })
        .filter(|leaf| {
            let parts: Vec<&str> = leaf.split(':').collect();
            parts.len() == 4 && parts[3].chars().all(|c| c.is_ascii_uppercase() || c == '_')
        })
        .count();
    assert!(
        hot_leaves >= 5,
        "collapsed: {hot_leaves} hot:LINE:OPNAME frames:\n{text}"
    );
    let lines = std::fs::read_to_string(&jsonl).unwrap();
    let named = lines
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .flat_map(|r| r["frames"].as_array().cloned().unwrap_or_default())
        .filter(|f| f.get("opcode_str_id").is_some())
        .count();
    assert!(named >= 5, "jsonl: {named} frames with an opcode");
}
