//! The documentation's links hold: every relative link of the README, the project's pages and
//! `docs/` names a file that exists, and a `#anchor` one of its headings (as GitHub makes an
//! anchor of a heading). Pages moved or renamed leave no dangling link behind.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn pages(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            pages(&p, out);
        } else if p.extension().is_some_and(|x| x == "md") {
            out.push(p);
        }
    }
}

/// GitHub's anchor for a heading: lower case, spaces to `-`, punctuation other than `-` and
/// `_` dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

fn anchors(text: &str) -> BTreeSet<String> {
    let mut fenced = false;
    let mut out = BTreeSet::new();
    for l in text.lines() {
        if l.starts_with("```") {
            fenced = !fenced;
        } else if !fenced && l.starts_with('#') {
            out.insert(anchor(l.trim_start_matches('#')));
        }
    }
    out
}

/// The targets of `[text](target)` links, outside code blocks.
fn links(text: &str) -> Vec<String> {
    let mut fenced = false;
    let mut out = Vec::new();
    for l in text.lines() {
        if l.starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let mut rest = l;
        while let Some(i) = rest.find("](") {
            rest = &rest[i + 2..];
            let Some(end) = rest.find(')') else { break };
            out.push(rest[..end].to_string());
            rest = &rest[end..];
        }
    }
    out
}

#[test]
fn every_relative_link_of_the_docs_resolves() {
    let ws = workspace();
    let mut files: Vec<PathBuf> = ["README.md", "CONTRIBUTING.md", "CHANGELOG.md"]
        .iter()
        .map(|f| ws.join(f))
        .collect();
    pages(&ws.join("docs"), &mut files);
    assert!(files.len() > 20, "{} pages", files.len());
    let mut checked = 0;
    let mut bad = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        for link in links(&text) {
            if link.contains("://") || link.starts_with("mailto:") {
                continue;
            }
            let (path, anchor) = link.split_once('#').unwrap_or((&link, ""));
            let target = match path {
                "" => f.clone(),
                p => f.parent().unwrap().join(p),
            };
            checked += 1;
            if !target.exists() {
                bad.push(format!("{}: {link}: no such file", f.display()));
            } else if !anchor.is_empty()
                && target.extension().is_some_and(|x| x == "md")
                && !anchors(&std::fs::read_to_string(&target).unwrap()).contains(anchor)
            {
                bad.push(format!("{}: {link}: no such heading", f.display()));
            }
        }
    }
    assert!(checked > 50, "{checked} links");
    assert!(bad.is_empty(), "dangling links:\n{}", bad.join("\n"));
}

#[test]
fn anchors_are_made_as_github_makes_them() {
    assert_eq!(
        anchor(" Fleet identity: services, containers, labels"),
        "fleet-identity-services-containers-labels"
    );
    assert_eq!(anchor("The systemd service"), "the-systemd-service");
    assert_eq!(
        links("see [a](b.md#c) and [d](https://e) `x`"),
        ["b.md#c", "https://e"]
    );
}
