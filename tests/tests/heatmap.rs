//! `-f heatmap`: the program's sources shown by their samples, line by line, read back as a user
//! opens the page.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use tachyon_bpf_tests::*;

const HEAT_MAIN: &str = r#"
import time, secret_helper
def hot(n):
    s = 0
    for i in range(n):
        s += i * i  # HOT
    return s
def cool(n):
    return sum(range(n))
t0 = time.time()
while time.time() - t0 < 2:
    hot(50000)
    cool(50000)
    secret_helper.private_work(20000)
"#;

const HEAT_HELPER: &str = r#"
def private_work(n):
    x = 0
    for i in range(n):
        x += i
    return x
"#;

/// Parses a heatmap directory with Python's `html.parser` (no browser): the index rows
/// `[file, self_ms, total_ms]` and links, and per page (`fN`) its rows
/// `[line, self_ms, total_ms, code]` and its note (why the source is not shown).
fn parse_heatmap(path: &Path) -> Value {
    let script = r#"
import json, sys
from html.parser import HTMLParser
class P(HTMLParser):
    def __init__(self):
        super().__init__()
        self.index, self.pages, self.sec, self.row, self.cell, self.note = [], {}, None, None, None, False
        self.links = []
    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "a" and self.sec is None:
            self.links.append(a["href"])
        elif tag == "tr" and "data-file" in a:
            self.index.append([a["data-file"], float(a["data-self-ms"]), float(a["data-total-ms"])])
        elif tag == "tr" and "data-line" in a:
            self.row = [int(a["data-line"]), float(a["data-self-ms"]), float(a["data-total-ms"]), ""]
            self.pages[self.sec]["rows"].append(self.row)
        elif tag == "td" and a.get("class") == "code":
            self.cell = True
        elif tag == "p" and a.get("class") == "note":
            self.note = True
    def handle_endtag(self, tag):
        if tag == "td":
            self.cell = False
        if tag == "p":
            self.note = False
    def handle_data(self, d):
        if self.cell and self.row is not None:
            self.row[3] += d
        if self.note:
            self.pages[self.sec]["note"] += d
import os
p = P()
p.feed(open(os.path.join(sys.argv[1], "index.html"), encoding="utf-8").read())
for name in sorted(os.listdir(sys.argv[1])):
    if name != "index.html":
        p.sec = name[:-len(".html")]
        p.pages[p.sec] = {"rows": [], "note": ""}
        p.feed(open(os.path.join(sys.argv[1], name), encoding="utf-8").read())
print(json.dumps({"index": p.index, "links": p.links, "pages": p.pages}))
"#;
    let o = Command::new("python3")
        .args(["-c", script, path.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "html.parser: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).unwrap()
}

/// `-f heatmap`: a directory of HTML pages that open offline, read back with an HTML parser,
/// replaced whole by a later run and never written through a link. The index puts
/// the script first; its page shows its source with the `# HOT` line hottest, and its lines'
/// self time adds up to the folded stacks' time in its functions. A module only root may read
/// (mode 0600) is profiled, but its source is not put into the page: root would otherwise show
/// any file a process names as its code.
#[test]
fn heatmap_shows_sources_by_their_samples() {
    require_root();
    let dir = scratch("formats_heatmap");
    let main = dir.join("heat_main.py");
    std::fs::write(&main, HEAT_MAIN).unwrap();
    std::fs::set_permissions(&main, std::fs::Permissions::from_mode(0o644)).unwrap();
    let helper = dir.join("secret_helper.py");
    std::fs::write(&helper, HEAT_HELPER).unwrap();
    std::fs::set_permissions(&helper, std::fs::Permissions::from_mode(0o600)).unwrap();
    let base = dir.join("run");
    let py = python("3.12.1");
    profile_command(
        &base,
        &["-m", "cpu", "-f", "heatmap,collapsed,gecko", "-q"],
        &[py.to_str().unwrap(), main.to_str().unwrap()],
    );
    // A folded sample stands for the profile's interval (1000 Hz: 1.015625 ms).
    let gecko: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("run.json")).unwrap()).unwrap();
    let interval_ms = gecko["meta"]["interval"].as_f64().unwrap();
    let page = dir.join("run.heatmap");
    let mut html = String::new();
    for e in std::fs::read_dir(&page).unwrap() {
        let e = e.unwrap();
        assert_eq!(
            e.metadata().unwrap().permissions().mode() & 0o777,
            0o600,
            "pages are private to their owner"
        );
        html += &std::fs::read_to_string(e.path()).unwrap();
    }
    assert_eq!(
        std::fs::metadata(&page).unwrap().permissions().mode() & 0o777,
        0o700
    );
    assert!(
        !html.contains("<script src") && !html.contains("<link") && !html.contains("http"),
        "self-contained"
    );
    let v = parse_heatmap(&page);
    let index = v["index"].as_array().unwrap();
    // Each index row links to its page, and each page exists.
    let links = v["links"].as_array().unwrap();
    assert_eq!(links.len(), index.len());
    for (i, l) in links.iter().enumerate() {
        assert_eq!(l.as_str().unwrap(), format!("f{i}.html"));
        assert!(page.join(l.as_str().unwrap()).is_file(), "{l}");
    }
    let main_path = main.to_str().unwrap();
    assert_eq!(
        index[0][0], main_path,
        "the script is the hottest file: {index:?}"
    );
    let pages = v["pages"].as_object().unwrap();
    let rows = pages["f0"]["rows"].as_array().unwrap();
    assert_eq!(
        rows.len(),
        HEAT_MAIN.lines().count(),
        "the whole file: {rows:?}"
    );
    let hottest = rows
        .iter()
        .max_by(|a, b| a[1].as_f64().unwrap().total_cmp(&b[1].as_f64().unwrap()))
        .unwrap();
    assert!(
        hottest[3].as_str().unwrap().contains("# HOT"),
        "the hottest line: {hottest:?}"
    );
    // The script's own lines' self time is the folded stacks' self time in its functions.
    let folded = std::fs::read_to_string(dir.join("run.folded")).unwrap();
    let mut in_main = 0.0;
    for line in folded.lines() {
        let (stack, n) = line.rsplit_once(' ').unwrap();
        let leaf = stack
            .split(';')
            .rev()
            .find(|f| f.contains(".py:") || f.starts_with('<'))
            .unwrap_or("");
        if leaf.starts_with("heat_main.py:") {
            in_main += n.parse::<f64>().unwrap();
        }
    }
    let self_ms: f64 = rows.iter().map(|r| r[1].as_f64().unwrap()).sum();
    let in_main_ms = in_main * interval_ms;
    assert!(
        (self_ms - in_main_ms).abs() <= (in_main_ms * 0.01).max(3.0),
        "heatmap {self_ms} ms vs folded {in_main} samples of {interval_ms} ms"
    );
    // The private module: sampled, its lines listed, its text not shown.
    let secret = index
        .iter()
        .position(|r| r[0] == helper.to_str().unwrap())
        .expect("the helper is in the index");
    let sp = &pages[&format!("f{secret}")];
    assert!(
        sp["note"]
            .as_str()
            .unwrap()
            .contains("not readable by every user"),
        "{sp:?}"
    );
    assert!(!html.contains("x += i\n") && !html.contains("def private_work"));
    assert!(
        sp["rows"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r[1].as_f64().unwrap() > 100.0),
        "its hot line is listed: {sp:?}"
    );

    // A later run replaces the whole directory: a page it does not write is gone.
    std::fs::write(page.join("f999.html"), "stale").unwrap();
    profile_command(
        &page,
        &["-m", "cpu", "-f", "heatmap", "-q"],
        &[py.to_str().unwrap(), main.to_str().unwrap()],
    );
    assert!(page.join("index.html").is_file());
    assert!(
        !page.join("f999.html").exists(),
        "the earlier directory is replaced"
    );
    let leftovers: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    // A link at the directory's name is refused, before profiling, and left as it is.
    let elsewhere = dir.join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    let linked = dir.join("linked.heatmap");
    std::os::unix::fs::symlink(&elsewhere, &linked).unwrap();
    let o = run_profiler(
        &[
            "-o",
            linked.to_str().unwrap(),
            "-f",
            "heatmap",
            "-q",
            "--",
            py.to_str().unwrap(),
            "-c",
            "pass",
        ],
        Duration::from_secs(60),
    );
    assert!(!o.status.success());
    assert!(stderr_of(&o).contains("symbolic link"), "{}", stderr_of(&o));
    assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);
}
