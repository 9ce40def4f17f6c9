//! The library's layers depend on each other one way. Each module may import only the modules
//! listed for it here (and its own), read from the `crate::` and `super::` paths in its source; the table
//! itself must have no cycle. Each folder's `mod.rs` says the same in its opening comment.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use syn::visit::Visit;

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

/// The module path of a source file under `src/` (`stack/elf.rs`: `stack::elf`; a `mod.rs`
/// is its folder's module).
fn module_path(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    parts
}

/// The top-level module a path names from module `at` (the file's module path and the inline
/// modules around the path): `crate::x` names `x`; each `super` steps out once, and a path that
/// steps out to the crate's root names its next segment. `None`: it stays inside.
fn top_level_named(segments: &[String], at: &[String]) -> Option<String> {
    let mut depth = at.len();
    let mut rest = segments;
    match rest.first().map(String::as_str) {
        Some("crate") => return rest.get(1).cloned(),
        Some("super") => {
            while rest.first().is_some_and(|s| s == "super") {
                depth = depth.checked_sub(1)?;
                rest = &rest[1..];
            }
        }
        _ => return None,
    }
    if depth == 0 {
        rest.first().cloned()
    } else {
        None
    }
}

/// Every `crate::` and `super::` path of a file (in `use` trees, expressions and types), each
/// with the module it is written in.
struct Paths {
    at: Vec<String>,
    named: BTreeSet<String>,
}

impl Paths {
    fn note(&mut self, segments: Vec<String>) {
        if let Some(n) = top_level_named(&segments, &self.at) {
            self.named.insert(n);
        }
    }

    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree);
                prefix.pop();
            }
            syn::UseTree::Name(n) => {
                let mut v = prefix.clone();
                v.push(n.ident.to_string());
                self.note(v);
            }
            syn::UseTree::Rename(n) => {
                let mut v = prefix.clone();
                v.push(n.ident.to_string());
                self.note(v);
            }
            syn::UseTree::Glob(_) => {
                let mut v = prefix.clone();
                v.push("*".into());
                self.note(v);
            }
            syn::UseTree::Group(g) => {
                for t in &g.items {
                    self.use_tree(prefix, t);
                }
            }
        }
    }
}

impl<'ast> Visit<'ast> for Paths {
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        self.at.push(m.ident.to_string());
        syn::visit::visit_item_mod(self, m);
        self.at.pop();
    }
    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        self.use_tree(&mut Vec::new(), &u.tree);
    }
    fn visit_path(&mut self, p: &'ast syn::Path) {
        self.note(p.segments.iter().map(|s| s.ident.to_string()).collect());
        syn::visit::visit_path(self, p);
    }
}

/// The crate's top-level modules each file of `module` names (`crate::x`, or `super::x` that
/// reaches the crate's root), with the files that name them.
fn imports(module: &str) -> BTreeMap<String, BTreeSet<String>> {
    let dir = src().join(module);
    let mut files = Vec::new();
    if dir.is_dir() {
        rust_files(&dir, &mut files);
    } else {
        files.push(src().join(format!("{module}.rs")));
    }
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        let rel = f.strip_prefix(src()).unwrap();
        let file = syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", rel.display()));
        let mut v = Paths {
            at: module_path(rel),
            named: BTreeSet::new(),
        };
        v.visit_file(&file);
        for name in v.named {
            if name != module && name != "*" {
                out.entry(name)
                    .or_default()
                    .insert(rel.display().to_string());
            }
        }
    }
    out
}

#[test]
fn paths_are_resolved_to_the_top_level_module_they_name() {
    let seg = |s: &str| s.split("::").map(String::from).collect::<Vec<_>>();
    let elf = module_path(Path::new("stack/elf.rs"));
    assert_eq!(elf, ["stack", "elf"]);
    assert_eq!(module_path(Path::new("stack/mod.rs")), ["stack"]);
    let named = |text: &str, path: &[String]| {
        let mut v = Paths {
            at: path.to_vec(),
            named: BTreeSet::new(),
        };
        v.visit_file(&syn::parse_file(text).unwrap());
        v.named
    };
    assert_eq!(
        top_level_named(&seg("super::super::process::maps"), &elf).as_deref(),
        Some("process")
    );
    assert_eq!(top_level_named(&seg("super::cfi"), &elf), None);
    assert_eq!(
        top_level_named(&seg("crate::aggregate::X"), &elf).as_deref(),
        Some("aggregate")
    );
    // In an expression, in a `use` group; and an inline module is one level deeper.
    let text = "fn f() { super::super::process::maps::parse_maps(); }\n\
                use super::super::{output::X, stack::Y};\n\
                mod tests { use super::super::super::capture::Z; use super::super::W; }";
    assert_eq!(
        named(text, &elf),
        ["capture", "output", "process", "stack"]
            .map(String::from)
            .into()
    );
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
