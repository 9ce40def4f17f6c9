//! The house's size limits, kept by a test so that they stop creeping back: no source file of
//! the project (the user-space library, the BPF programs, xtask, the end-to-end tests) passes
//! `MAX_FILE_LINES` lines, and no function outside tests passes `MAX_FN_LINES` lines.
//! Functions are found by parsing each file with `syn` (line numbers from `proc-macro2`'s span
//! locations): a function is a `fn` item, an `impl` or trait method, at any depth; `#[test]`
//! functions and everything inside a `#[cfg(test)]` module are tests.

use std::path::{Path, PathBuf};

use syn::visit::Visit;

const MAX_FILE_LINES: usize = 1000;
const MAX_FN_LINES: usize = 120;

/// Generated tables, which are data and not read as code.
const GENERATED: &[&str] = &["profiler-userspace/src/python/opcodes_table.rs"];

/// The folders the limits hold in, from the workspace root.
const TREES: &[&str] = &[
    "profiler-userspace/src",
    "profiler-ebpf/src",
    "xtask/src",
    "tests/src",
    "tests/tests",
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for e in entries {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

fn files() -> Vec<(String, String)> {
    let root = root();
    let mut paths = Vec::new();
    for t in TREES {
        rust_files(&root.join(t), &mut paths);
    }
    paths.sort();
    assert!(paths.len() > 50, "only {} source files found", paths.len());
    paths
        .into_iter()
        .map(|p| {
            let rel = p.strip_prefix(&root).unwrap().display().to_string();
            (rel, std::fs::read_to_string(&p).unwrap())
        })
        .filter(|(rel, _)| !GENERATED.contains(&rel.as_str()))
        .collect()
}

fn has_attr(attrs: &[syn::Attribute], path: &str, arg: Option<&str>) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident(path)
            && arg.is_none_or(|arg| {
                a.parse_args::<syn::Meta>()
                    .is_ok_and(|m| m.path().is_ident(arg))
            })
    })
}

/// Each non-test function's name, first line and length in lines.
#[derive(Default)]
struct Functions {
    found: Vec<(String, usize, usize)>,
}

impl Functions {
    fn note(&mut self, name: &syn::Ident, span: proc_macro2::Span) {
        let (a, b) = (span.start().line, span.end().line);
        self.found.push((name.to_string(), a, b + 1 - a));
    }
}

impl<'ast> Visit<'ast> for Functions {
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if !has_attr(&m.attrs, "cfg", Some("test")) {
            syn::visit::visit_item_mod(self, m);
        }
    }
    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        if has_attr(&f.attrs, "test", None) {
            return;
        }
        let span = syn::spanned::Spanned::span(f);
        self.note(&f.sig.ident, span);
        syn::visit::visit_item_fn(self, f);
    }
    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        let span = syn::spanned::Spanned::span(f);
        self.note(&f.sig.ident, span);
        syn::visit::visit_impl_item_fn(self, f);
    }
    fn visit_trait_item_fn(&mut self, f: &'ast syn::TraitItemFn) {
        if f.default.is_some() {
            let span = syn::spanned::Spanned::span(f);
            self.note(&f.sig.ident, span);
        }
        syn::visit::visit_trait_item_fn(self, f);
    }
}

#[test]
fn no_source_file_passes_the_line_limit() {
    let long: Vec<String> = files()
        .iter()
        .map(|(rel, text)| (rel, text.lines().count()))
        .filter(|(_, n)| *n > MAX_FILE_LINES)
        .map(|(rel, n)| format!("{rel}: {n} lines"))
        .collect();
    assert!(
        long.is_empty(),
        "files over {MAX_FILE_LINES} lines (split them by topic):\n{}",
        long.join("\n")
    );
}

#[test]
fn no_function_passes_the_line_limit() {
    let mut long = Vec::new();
    let mut seen = 0;
    for (rel, text) in files() {
        let file = syn::parse_file(&text).unwrap_or_else(|e| panic!("{rel}: {e}"));
        let mut v = Functions::default();
        v.visit_file(&file);
        seen += v.found.len();
        for (name, line, n) in v.found {
            if n > MAX_FN_LINES {
                long.push(format!("{rel}:{line}: {name}, {n} lines"));
            }
        }
    }
    assert!(
        seen > 500,
        "only {seen} functions found: is the parse right?"
    );
    assert!(
        long.is_empty(),
        "functions over {MAX_FN_LINES} lines (outside tests):\n{}",
        long.join("\n")
    );
}

/// The test's own measure, checked on a known input: a function's lines are counted from its
/// signature to its closing brace, tests and `#[cfg(test)]` modules are left out.
#[test]
fn functions_are_measured_as_written() {
    let text = "fn a() {\n    1;\n}\n\n#[test]\nfn t() {}\n\n#[cfg(test)]\nmod tests {\n    fn h() {}\n}\n\nimpl X {\n    fn m(&self) {\n    }\n}\n";
    let mut v = Functions::default();
    v.visit_file(&syn::parse_file(text).unwrap());
    assert_eq!(
        v.found,
        vec![("a".to_string(), 1, 3), ("m".to_string(), 14, 2)]
    );
}
