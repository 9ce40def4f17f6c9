//! The library's layers depend on each other one way. Each module may import only the modules
//! listed for it here (and its own), read from the `crate::` paths in its source; the table
//! itself must have no cycle. Each folder's `mod.rs` says the same in its opening comment.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Module -> the modules it may import.
const ALLOWED: &[(&str, &[&str])] = &[
    ("capture", &[]),
    ("stack", &[]),
    ("aggregate", &[]),
    // Writing files safely as root among other users' directories.
    ("files", &[]),
    ("process", &["stack", "capture"]),
    // Resolved frames go back through `python::ProfileSink`, never into the profile directly.
    ("python", &["process", "stack", "capture"]),
    ("output", &["aggregate", "files"]),
    // The boot's copy of the kernel's symbols: a `stack` table, written as `output` writes.
    ("ksyms_cache", &["stack", "files"]),
    (
        "collect",
        &[
            "capture",
            "process",
            "stack",
            "python",
            "aggregate",
            "ksyms_cache",
        ],
    ),
    ("top", &["aggregate", "output"]),
    (
        "session",
        &["capture", "collect", "python", "process", "aggregate"],
    ),
];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The crate's top-level modules each file of `module` names (`crate::x`, or `super::x` from
/// a top-level file).
fn imports(module: &str) -> BTreeMap<String, BTreeSet<String>> {
    let dir = src().join(module);
    let mut files = Vec::new();
    let top_level = !dir.is_dir();
    if top_level {
        files.push(src().join(format!("{module}.rs")));
    } else {
        rust_files(&dir, &mut files);
    }
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        let mut prefixes = vec!["crate::"];
        if top_level {
            prefixes.push("super::");
        }
        for prefix in prefixes {
            for (i, _) in text.match_indices(prefix) {
                let rest = &text[i + prefix.len()..];
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() && name != module {
                    out.entry(name)
                        .or_default()
                        .insert(f.strip_prefix(src()).unwrap().display().to_string());
                }
            }
        }
    }
    out
}

#[test]
fn every_module_is_in_the_table() {
    let lib = std::fs::read_to_string(src().join("lib.rs")).unwrap();
    let declared: BTreeSet<&str> = lib
        .lines()
        .filter_map(|l| l.strip_prefix("pub mod "))
        .map(|l| l.trim_end_matches(';'))
        .collect();
    let table: BTreeSet<&str> = ALLOWED.iter().map(|(m, _)| *m).collect();
    assert_eq!(declared, table);
}

#[test]
fn layers_import_only_what_they_may() {
    let mut bad = Vec::new();
    for (module, allowed) in ALLOWED {
        for (name, files) in imports(module) {
            if !allowed.contains(&name.as_str()) {
                bad.push(format!("{module} imports {name} in {files:?}"));
            }
        }
    }
    assert!(
        bad.is_empty(),
        "imports against the layering:\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_table_has_no_cycle() {
    // Depth-first search over the allowed imports.
    fn visit<'a>(
        m: &'a str,
        table: &BTreeMap<&'a str, &'a [&'a str]>,
        path: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
    ) {
        if done.contains(m) {
            return;
        }
        assert!(!path.contains(&m), "cycle: {path:?} -> {m}");
        path.push(m);
        for dep in table[m] {
            visit(dep, table, path, done);
        }
        path.pop();
        done.insert(m);
    }
    let table: BTreeMap<&str, &[&str]> = ALLOWED.iter().copied().collect();
    let mut done = BTreeSet::new();
    for m in table.keys() {
        visit(m, &table, &mut Vec::new(), &mut done);
    }
}

#[test]
fn each_folder_says_what_it_owns_and_may_import() {
    for (module, _) in ALLOWED {
        let m = src().join(module).join("mod.rs");
        if !m.exists() {
            continue;
        }
        let text = std::fs::read_to_string(&m).unwrap();
        let head: String = text
            .lines()
            .take_while(|l| l.starts_with("//!"))
            .collect::<Vec<_>>()
            .join("\n");
        assert!(
            head.contains("May import") || head.contains("may import"),
            "{module}/mod.rs does not say what it may import:\n{head}"
        );
    }
}
