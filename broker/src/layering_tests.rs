//! The rooms of the broker, checked: no module of `broker/src` imports one
//! that leads back to it (no import cycle of any length, so the modules
//! stand in layers: listener → service → {coordinator runtime, groups,
//! replica} → shard → storage, with leaf modules of plain types — errors,
//! answers, state — beside them). Read from the source text (`use` lines and
//! paths written in code, test modules left out), so it needs no tool
//! beyond the test suite: `cargo test -p weir-broker --lib layering`.
//!
//! A cycle fails the test with the imports that make it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Module path (`a/b`) → file, for every file of the library.
fn modules(src: &Path) -> BTreeMap<Vec<String>, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("read src") {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let rel = path.strip_prefix(src).expect("under src");
            let rel = rel.to_string_lossy().replace('\\', "/");
            let Some(stem) = rel.strip_suffix(".rs") else {
                continue;
            };
            if rel == "main.rs" {
                continue; // the binary: a crate of its own
            }
            let mut parts: Vec<String> = stem.split('/').map(str::to_string).collect();
            if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
                parts.pop();
            }
            out.insert(parts, rel);
        }
    }
    out
}

/// The code of a file without comments and without its test module.
fn code(text: &str) -> String {
    let text = text.split("#[cfg(test)]\nmod ").next().unwrap_or("");
    text.lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The flat paths of one `use` tree (`a::{b, c::{d, e}}` → `a::b`, …).
fn flatten(tree: &str, out: &mut Vec<String>) {
    // Without whitespace and renames (`x as y`: the path is `x`).
    let mut tokens = tree.split_whitespace();
    let mut flat = String::new();
    while let Some(t) = tokens.next() {
        if t == "as" {
            let renamed = tokens.next().unwrap_or("");
            flat.push_str(renamed.trim_start_matches(|c: char| c.is_alphanumeric() || c == '_'));
        } else {
            flat.push_str(t);
        }
    }
    flatten_flat(&flat, out);
}

fn flatten_flat(tree: &str, out: &mut Vec<String>) {
    let Some(open) = tree.find('{') else {
        out.push(tree.to_string());
        return;
    };
    let prefix = tree[..open].trim_end_matches("::");
    let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
    let (mut depth, mut start) = (0, 0);
    let mut items = Vec::new();
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&inner[start..]);
    for item in items.into_iter().filter(|i| !i.is_empty()) {
        flatten_flat(&format!("{prefix}::{item}"), out);
    }
}

/// Every path a file names: its `use` trees, and `a::b` paths in its code.
fn paths(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    for stmt in code.split(';') {
        let s = stmt.trim_start();
        let s = s.strip_prefix("pub(super) ").unwrap_or(s);
        let s = s.strip_prefix("pub(crate) ").unwrap_or(s);
        let s = s.strip_prefix("pub ").unwrap_or(s);
        if let Some(tree) = s.strip_prefix("use ") {
            flatten(tree, &mut out);
        }
    }
    let bytes = code.as_bytes();
    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let mut i = 0;
    while i < bytes.len() {
        if word(bytes[i]) && (i == 0 || !(word(bytes[i - 1]) || bytes[i - 1] == b':')) {
            let mut j = i;
            while j < bytes.len()
                && (word(bytes[j]) || (bytes[j] == b':' && bytes.get(j + 1) == Some(&b':')))
            {
                j += if bytes[j] == b':' { 2 } else { 1 };
            }
            let path = &code[i..j];
            if path.contains("::") {
                out.push(path.trim_end_matches("::").to_string());
            }
            i = j.max(i + 1);
        } else {
            i += 1;
        }
    }
    out
}

/// The library's modules a file's paths resolve to (the longest module
/// prefix of each path), without the file itself and the crate root.
fn imports(
    module: &[String],
    code: &str,
    files: &BTreeMap<Vec<String>, String>,
) -> BTreeMap<Vec<String>, String> {
    let mut out = BTreeMap::new();
    for path in paths(code) {
        let mut segs: Vec<&str> = path.split("::").filter(|s| *s != "*").collect();
        let mut base: Vec<String> = match segs.first().copied() {
            Some("crate") => {
                segs.remove(0);
                Vec::new()
            }
            Some("super") => {
                let mut b = module.to_vec();
                while segs.first() == Some(&"super") {
                    segs.remove(0);
                    b.pop();
                }
                b
            }
            Some("self") => {
                segs.remove(0);
                module.to_vec()
            }
            Some(first) => {
                let mut child = module.to_vec();
                child.push(first.to_string());
                if !files.contains_key(&child) {
                    continue;
                }
                module.to_vec()
            }
            None => continue,
        };
        base.extend(segs.iter().map(|s| s.to_string()));
        let target = (0..=base.len())
            .rev()
            .map(|k| base[..k].to_vec())
            .find(|m| files.contains_key(m));
        if let Some(t) = target.filter(|t| !t.is_empty() && t.as_slice() != module) {
            out.entry(t).or_insert(path);
        }
    }
    out
}

#[test]
fn layering_no_module_imports_one_that_leads_back_to_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let files = modules(&src);
    let mut edges = BTreeMap::new();
    for (module, rel) in &files {
        let text = std::fs::read_to_string(src.join(rel)).expect("read a source file");
        edges.insert(module.clone(), imports(module, &code(&text), &files));
    }
    let found = cycles(&edges);
    let mut why = Vec::new();
    for c in &found {
        for (a, targets) in &edges {
            for (b, path) in targets {
                if c.contains(&a.join("/")) && c.contains(&b.join("/")) {
                    why.push(format!("{} names `{path}`", a.join("/")));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "import cycles in broker/src: {found:?}\n{}",
        why.join("\n")
    );
}

#[test]
fn layering_finds_cycles_of_any_length() {
    let m = |s: &str| vec![s.to_string()];
    let mut edges: BTreeMap<Vec<String>, BTreeMap<Vec<String>, String>> = BTreeMap::new();
    for (a, b) in [("a", "b"), ("b", "c"), ("c", "a"), ("c", "d"), ("d", "e")] {
        edges.entry(m(a)).or_default().insert(m(b), String::new());
        edges.entry(m(b)).or_default();
    }
    assert_eq!(cycles(&edges), [vec!["a", "b", "c"]]);
    edges.get_mut(&m("c")).unwrap().remove(&m("a"));
    assert!(cycles(&edges).is_empty());
}

#[test]
fn layering_reads_use_trees_and_paths() {
    let mut out = Vec::new();
    flatten("crate::a::{b, c::{d, e as f}, g::*}", &mut out);
    assert_eq!(
        out,
        [
            "crate::a::b",
            "crate::a::c::d",
            "crate::a::c::e",
            "crate::a::g::*"
        ]
    );
    let p = paths("use super::x::Y;\nfn f() { crate::shard::mesh::send(); a.b::<u8>(); }");
    assert!(p.contains(&"super::x::Y".to_string()), "{p:?}");
    assert!(p.contains(&"crate::shard::mesh::send".to_string()), "{p:?}");
}

/// The strongly connected components of more than one module: the import
/// cycles of any length.
fn cycles(edges: &BTreeMap<Vec<String>, BTreeMap<Vec<String>, String>>) -> Vec<Vec<String>> {
    // Kosaraju: finish order on the graph, then components on its reverse.
    let nodes: Vec<&Vec<String>> = edges.keys().collect();
    let mut seen = BTreeSet::new();
    let mut order = Vec::new();
    for n in &nodes {
        let mut stack = vec![(*n, false)];
        while let Some((m, done)) = stack.pop() {
            if done {
                order.push(m);
                continue;
            }
            if !seen.insert(m) {
                continue;
            }
            stack.push((m, true));
            for t in edges.get(m).into_iter().flat_map(|t| t.keys()) {
                if !seen.contains(t) {
                    stack.push((t, false));
                }
            }
        }
    }
    let mut reverse: BTreeMap<&Vec<String>, Vec<&Vec<String>>> = BTreeMap::new();
    for (a, targets) in edges {
        for b in targets.keys() {
            reverse.entry(b).or_default().push(a);
        }
    }
    let mut assigned = BTreeSet::new();
    let mut out = Vec::new();
    for n in order.into_iter().rev() {
        if assigned.contains(n) {
            continue;
        }
        let mut component = Vec::new();
        let mut stack = vec![n];
        assigned.insert(n);
        while let Some(m) = stack.pop() {
            component.push(m.join("/"));
            for s in reverse.get(m).into_iter().flatten() {
                if assigned.insert(*s) {
                    stack.push(s);
                }
            }
        }
        if component.len() > 1 {
            component.sort();
            out.push(component);
        }
    }
    out
}
