//! The layers of emulator/src, checked from the source: every `crate::` path in a file
//! must name a layer its own layer may import (docs/architecture.md draws the same
//! table). A new import that points up or sideways fails here with the file and line.

use std::path::{Path, PathBuf};

/// Layer → the layers (or `layer::module`) it may import, besides itself.
const ALLOWED: &[(&str, &[&str])] = &[
    // Poison-tolerant locking (sync.rs): below everything, usable by every layer.
    ("sync", &[]),
    // Rate-limited log lines for hostile input (ratelimit.rs, its macro
    // `crate::warn_ratelimited!`): likewise.
    ("ratelimit", &[]),
    ("wire", &[]),
    ("model", &["wire"]),
    ("device", &["wire", "model"]),
    ("vhost", &["wire", "model", "device"]),
    ("traffic", &["wire", "model", "device"]),
    // The report schema embeds the counter structs of the layers below; the tables,
    // chart and compare read the schema. Nothing of report/ knows the runner.
    ("report", &["wire", "model", "device", "traffic"]),
    // The runner writes the typed report: it may use report::schema, not the tables.
    ("runner", &["wire", "model", "device", "vhost", "traffic", "report::schema"]),
    // Model mode: the twin reads scenarios and profiles through the runner and writes
    // the typed report; it runs the device model, never the vhost or traffic layers.
    ("twin", &["wire", "model", "report::schema", "runner"]),
    ("cli", &["wire", "model", "device", "vhost", "traffic", "report", "runner", "twin"]),
];

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

/// The `crate::` paths of one line (`crate::a::b`, and each item of `crate::{a::x, b}`),
/// as (first, second) segments.
fn crate_paths(line: &str) -> Vec<(String, String)> {
    let ident = |s: &str| s.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect::<String>();
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for item in group[..end].split(',') {
                let item = item.trim();
                let first = ident(item);
                let second = item.strip_prefix(&format!("{first}::")).map(ident).unwrap_or_default();
                out.push((first, second));
            }
        } else {
            let first = ident(rest);
            let second = rest[first.len()..].strip_prefix("::").map(ident).unwrap_or_default();
            out.push((first, second));
        }
    }
    out
}

#[test]
fn every_import_points_down() {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut bad = Vec::new();
    let mut checked = 0;
    for f in &files {
        let rel = f.strip_prefix(&src).unwrap();
        let top = rel.components().next().unwrap().as_os_str().to_string_lossy().trim_end_matches(".rs").to_string();
        if top == "lib" || top == "main" {
            continue;
        }
        let Some((_, allowed)) = ALLOWED.iter().find(|(l, _)| *l == top) else {
            bad.push(format!("{}: top-level module {top:?} has no layer in tests/layers.rs", rel.display()));
            continue;
        };
        for (n, line) in std::fs::read_to_string(f).unwrap().lines().enumerate() {
            let code = line.split("//").next().unwrap_or_default();
            for (first, second) in crate_paths(code) {
                checked += 1;
                let ok = first == top
                    || ["sync", "ratelimit", "warn_ratelimited"].contains(&first.as_str())
                    || allowed.iter().any(|a| match a.split_once("::") {
                        Some((l, m)) => first == l && second == m,
                        None => first == *a,
                    });
                if !ok {
                    bad.push(format!("{}:{}: layer {top} imports crate::{first}::{second}", rel.display(), n + 1));
                }
            }
        }
    }
    assert!(checked > 50, "found only {checked} crate:: paths: is the parser broken?");
    assert!(bad.is_empty(), "imports against the layering:\n{}", bad.join("\n"));
}

#[test]
fn the_parser_sees_grouped_and_nested_paths() {
    assert_eq!(
        crate_paths("use crate::{wire::MacAddr, model};  let x = crate::device::nic::f();"),
        vec![
            ("wire".to_string(), "MacAddr".to_string()),
            ("model".to_string(), String::new()),
            ("device".to_string(), "nic".to_string())
        ]
    );
}
