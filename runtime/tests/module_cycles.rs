//! No cycle of more than three modules inside `runtime` (ARCHITECTURE.md):
//! the modules that name each other (`crate::x`, outside comments and
//! tests) are found from the sources, and every strongly connected set of
//! them is at most three.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The largest cycle the crate may hold.
const MOST_IN_A_CYCLE: usize = 3;

/// Each module's source (a folder's files together), without its tests and
/// comments.
fn modules(src: &Path) -> BTreeMap<String, String> {
    let mut found = BTreeMap::new();
    for entry in std::fs::read_dir(src).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_string_lossy().to_string();
        let text = match path.is_dir() {
            true => (std::fs::read_dir(&path).unwrap())
                .map(|f| std::fs::read_to_string(f.unwrap().path()).unwrap_or_default())
                .collect::<String>(),
            false => std::fs::read_to_string(&path).unwrap(),
        };
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        let code: Vec<&str> = (code.lines())
            .filter(|line| !line.trim_start().starts_with("//"))
            .collect();
        if name != "lib" {
            found.insert(name, code.join("\n"));
        }
    }
    found
}

/// Which modules each module names.
fn edges(modules: &BTreeMap<String, String>) -> BTreeMap<&str, BTreeSet<&str>> {
    let named = |code: &str, other: &str| {
        let path = format!("crate::{other}");
        (code.match_indices(&path)).any(|(at, _)| {
            let next = code[at + path.len()..].chars().next();
            !next.is_some_and(|c| c.is_alphanumeric() || c == '_')
        })
    };
    (modules.iter())
        .map(|(name, code)| {
            let to = (modules.keys())
                .filter(|other| *other != name && named(code, other))
                .map(String::as_str)
                .collect();
            (name.as_str(), to)
        })
        .collect()
}

/// The modules `from` reaches.
fn reach<'a>(from: &'a str, edges: &BTreeMap<&'a str, BTreeSet<&'a str>>) -> BTreeSet<&'a str> {
    let mut seen = BTreeSet::new();
    let mut next = vec![from];
    while let Some(module) = next.pop() {
        for to in &edges[module] {
            if seen.insert(*to) {
                next.push(to);
            }
        }
    }
    seen
}

#[test]
fn no_cycle_of_more_than_three_modules() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let modules = modules(&src);
    let edges = edges(&modules);
    assert!(edges["runner"].contains("session"), "the sources were read");
    let reached: BTreeMap<&str, BTreeSet<&str>> =
        edges.keys().map(|m| (*m, reach(m, &edges))).collect();
    for (module, reaches) in &reached {
        // Its cycle: what it reaches that reaches it back.
        let cycle: BTreeSet<&str> = (reaches.iter())
            .filter(|other| reached[*other].contains(module))
            .copied()
            .collect();
        assert!(
            cycle.len() <= MOST_IN_A_CYCLE,
            "{module} is in a cycle of {} modules: {cycle:?}",
            cycle.len()
        );
    }
}
