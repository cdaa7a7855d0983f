//! docs/design.md, "Layout": arrows point inward and no two modules use
//! each other. One node per module file of `src/`, an edge for every
//! `crate::`, `super::` or `self::` path, and every bare path whose first
//! segment is a child module (`plan::plan(…)`, `use certs::…`), in `use`
//! items and inline, that names an item of another module file; edges to a module's own ancestors
//! (a parent holds its children's shared vocabulary, `Error` and `Result`)
//! are left out, and unit-test modules are not read. Any cycle fails,
//! naming its modules and edges, and so does any edge from a product module
//! to test support (`testing/`, `tests`, `fixtures`): the one arrow that may
//! not run back up.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Module = Vec<String>;

/// Every module file under `src`, by module path.
fn modules(src: &Path) -> BTreeMap<Module, PathBuf> {
    fn walk(dir: &Path, found: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("a readable folder") {
            let path = entry.expect("a folder entry").path();
            if path.is_dir() {
                walk(&path, found);
            } else if path.extension().is_some_and(|e| e == "rs") {
                found.push(path);
            }
        }
    }
    let mut files = Vec::new();
    walk(src, &mut files);
    files
        .into_iter()
        .map(|file| {
            let relative = file.strip_prefix(src).unwrap().with_extension("");
            let mut module: Module = relative.iter().map(|p| p.to_string_lossy().into_owned()).collect();
            if matches!(module.last().map(String::as_str), Some("mod" | "lib" | "main")) {
                module.pop();
            }
            (module, file)
        })
        .collect()
}

fn is_test_support(module: &Module) -> bool {
    module
        .iter()
        .any(|part| matches!(part.as_str(), "tests" | "fixtures" | "testing") || part.ends_with("_tests"))
}

/// `a::{b, c::{d, e}}` as `a::b`, `a::c::d`, `a::c::e`.
fn expand(tree: &str) -> Vec<String> {
    let tree: String = tree.chars().filter(|c| !c.is_whitespace()).collect();
    let Some(open) = tree.find('{') else {
        return vec![tree];
    };
    let (prefix, inner) = (&tree[..open], &tree[open + 1..tree.len() - 1]);
    let (mut parts, mut depth, mut current) = (Vec::new(), 0, String::new());
    for c in inner.chars() {
        match c {
            ',' if depth == 0 => parts.push(std::mem::take(&mut current)),
            '{' => {
                depth += 1;
                current.push(c)
            }
            '}' => {
                depth -= 1;
                current.push(c)
            }
            _ => current.push(c),
        }
    }
    parts.push(current);
    parts
        .into_iter()
        .filter(|p| !p.is_empty())
        .flat_map(|p| {
            expand(&p)
                .into_iter()
                .map(|q| format!("{prefix}{q}"))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The paths a module's code names: its `use` trees and every inline path
/// (`a::b`) that does not continue another (`::a::b`, `x::a::b`).
fn paths(code: &str) -> Vec<String> {
    // Unit tests are left out: an inline test module ends the module's code,
    // an out-of-line one (`#[cfg(test)] mod tests;`) is only skipped.
    let mut kept = Vec::new();
    let mut lines = code.lines().filter(|line| !line.trim_start().starts_with("//"));
    while let Some(line) = lines.next() {
        if line.starts_with("#[cfg(test)]") || line.starts_with("#[cfg(all(test,") {
            match lines.next() {
                Some(item) if item.starts_with("mod ") && item.ends_with(';') => continue,
                _ => break,
            }
        }
        kept.push(line);
    }
    let code = kept.join("\n");
    let mut found = Vec::new();
    for (at, _) in code.match_indices("use ") {
        if at > 0 && code[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_') {
            continue;
        }
        if let Some(end) = code[at..].find(';') {
            let tree = code[at + 4..at + end].split(" as ").next().unwrap_or_default();
            found.extend(expand(tree));
        }
    }
    let bytes = code.as_bytes();
    for (separator, _) in code.match_indices("::") {
        // The first segment: the word before the separator.
        let at = code[..separator]
            .rfind(|c: char| !(c.is_alphanumeric() || c == '_'))
            .map_or(0, |n| n + 1);
        let after_word = at > 0 && (bytes[at - 1].is_ascii_alphanumeric() || matches!(bytes[at - 1], b'_' | b':'));
        if at == separator || after_word {
            continue;
        }
        let end = code[at..]
            .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
            .map_or(code.len(), |n| at + n);
        found.push(code[at..end].trim_end_matches(':').to_string());
    }
    found
}

/// The module files each module file uses, by the rules of the module docs.
fn edges(modules: &BTreeMap<Module, PathBuf>) -> BTreeMap<Module, BTreeSet<Module>> {
    let owner = |path: &[String]| -> Module {
        let mut path = path.to_vec();
        while !path.is_empty() && !modules.contains_key(&path) {
            path.pop();
        }
        path
    };
    let mut edges = BTreeMap::new();
    for (module, file) in modules {
        let mut uses = BTreeSet::new();
        if !is_test_support(module) {
            let code = std::fs::read_to_string(file).expect("a readable source file");
            for path in paths(&code) {
                if path.starts_with("::") {
                    continue;
                }
                let mut segments = path.split("::").filter(|s| !s.is_empty()).map(String::from);
                let first = segments.next();
                let absolute: Module = match first.as_deref() {
                    Some("crate") => segments.collect(),
                    Some("super" | "self") => {
                        let mut base = module.clone();
                        let mut rest: Vec<String> = segments.collect();
                        if path.starts_with("super") {
                            base.pop();
                        }
                        while rest.first().is_some_and(|s| s == "super") {
                            base.pop();
                            rest.remove(0);
                        }
                        base.extend(rest.into_iter().filter(|s| s != "self"));
                        base
                    }
                    // A bare path through a child module (`plan::plan`).
                    Some(child) if modules.contains_key(&[module.as_slice(), &[child.to_string()]].concat()) => {
                        let mut base = module.clone();
                        base.push(child.to_string());
                        base.extend(segments);
                        base
                    }
                    _ => continue,
                };
                let target = owner(&absolute);
                let ancestor = module.starts_with(&target);
                if !ancestor {
                    uses.insert(target);
                }
            }
        }
        edges.insert(module.clone(), uses);
    }
    edges
}

/// The cycles of `edges`: its strongly connected components of more than
/// one module (Tarjan).
fn cycles(edges: &BTreeMap<Module, BTreeSet<Module>>) -> Vec<Vec<Module>> {
    struct Walk<'a> {
        edges: &'a BTreeMap<Module, BTreeSet<Module>>,
        index: BTreeMap<&'a Module, usize>,
        low: BTreeMap<&'a Module, usize>,
        stack: Vec<&'a Module>,
        found: Vec<Vec<Module>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, v: &'a Module) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            for w in self.edges.get(v).into_iter().flatten() {
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v, low);
                } else if self.stack.contains(&w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = Vec::new();
                while let Some(w) = self.stack.pop() {
                    component.push(w.clone());
                    if w == v {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.found.push(component);
                }
            }
        }
    }
    let mut walk = Walk {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        found: Vec::new(),
    };
    for v in edges.keys() {
        if !walk.index.contains_key(v) {
            walk.visit(v);
        }
    }
    walk.found
}

/// The cycles among the module files under `src`, each as its edges.
fn import_cycles(src: &Path) -> Vec<String> {
    let edges = edges(&modules(src));
    cycles(&edges)
        .into_iter()
        .map(|cycle| {
            let mut lines = Vec::new();
            for a in &cycle {
                for b in edges[a].iter().filter(|b| cycle.contains(b)) {
                    lines.push(format!("{} -> {}", a.join("::"), b.join("::")));
                }
            }
            lines.join(", ")
        })
        .collect()
}

/// Every use of test support by a product module, as `module -> support`.
fn uses_of_test_support(src: &Path) -> Vec<String> {
    edges(&modules(src))
        .into_iter()
        .flat_map(|(module, uses)| {
            uses.into_iter()
                .filter(is_test_support)
                .map(move |support| format!("{} -> {}", module.join("::"), support.join("::")))
        })
        .collect()
}

#[test]
fn no_product_module_uses_test_support() {
    let uses: Vec<String> = super::crate_sources()
        .iter()
        .flat_map(|src| uses_of_test_support(src))
        .collect();
    assert!(uses.is_empty(), "product modules using test support: {uses:#?}");
}

/// The check finds the form `store::conformance` had (a product module
/// naming `crate::testing::TcpProxy`) and leaves test support's own uses of
/// the product and a unit-test module's uses of test support alone.
#[test]
fn the_test_support_check_finds_a_planted_use() {
    let src = std::env::temp_dir().join(format!("leasehold-layout-support-{:08x}", std::process::id()));
    let write = |file: &str, code: &str| {
        let path = src.join(file);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, code).unwrap();
    };
    write(
        "lib.rs",
        "pub mod store;
pub mod testing;
",
    );
    write(
        "store/mod.rs",
        "pub mod conformance;
pub mod memory;
",
    );
    write(
        "store/conformance.rs",
        "pub fn lose_replies(proxy: &crate::testing::TcpProxy) {}
",
    );
    write(
        "store/memory.rs",
        "pub struct MemoryStore;
#[cfg(test)]
mod tests {
    use crate::testing::TcpProxy;
}
",
    );
    write(
        "testing.rs",
        "use crate::store::memory::MemoryStore;
pub struct TcpProxy;
",
    );
    let uses = uses_of_test_support(&src);
    std::fs::remove_dir_all(&src).unwrap();
    assert_eq!(uses, ["store::conformance -> testing"], "{uses:?}");
}

#[test]
fn no_module_uses_a_module_that_uses_it() {
    // Per crate: cargo refuses cycles between crates itself.
    let sources = super::crate_sources();
    assert!(sources.len() > 1, "the walk found the crates");
    for src in &sources {
        assert!(
            !modules(src).is_empty(),
            "the walk found the modules of {}",
            src.display()
        );
    }
    let all: usize = sources.iter().map(|src| modules(src).len()).sum();
    assert!(all > 150, "the walk found {all} modules in all");
    let cycles: Vec<String> = sources.iter().flat_map(|src| import_cycles(src)).collect();
    assert!(cycles.is_empty(), "import cycles: {cycles:#?}");
}

/// The check finds a planted cycle, through an inline path and a nested
/// `use` tree, and leaves a child's use of its parent alone.
#[test]
fn the_cycle_check_finds_a_planted_cycle() {
    let src = std::env::temp_dir().join(format!("leasehold-layout-{:08x}", std::process::id()));
    let write = |file: &str, code: &str| {
        let path = src.join(file);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, code).unwrap();
    };
    write("lib.rs", "pub mod a;\npub mod b;\n");
    write(
        "a/mod.rs",
        "pub mod child;\npub fn f() { crate::b::g() }\npub struct Error;\n",
    );
    write("a/child.rs", "use super::Error;\n");
    write("b.rs", "use crate::{a::{f, child}, lib};\npub fn g() {}\n");
    let cycles = import_cycles(&src);
    std::fs::remove_dir_all(&src).unwrap();
    assert_eq!(cycles, ["a -> b, b -> a"], "{cycles:?}");
}

/// The check finds a cycle that closes only through bare child paths
/// (`plan::plan()` in the parent, `use certs::…` in the other parent, after
/// an out-of-line `#[cfg(test)] mod tests;`), the form
/// `operator::reconcile` ↔ `operator::webhook` had through
/// `injected_container` and `FIELD_MANAGER`.
#[test]
fn the_cycle_check_follows_bare_child_paths() {
    let src = std::env::temp_dir().join(format!("leasehold-layout-bare-{:08x}", std::process::id()));
    let write = |file: &str, code: &str| {
        let path = src.join(file);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, code).unwrap();
    };
    write("lib.rs", "pub mod op;\n");
    write("op/mod.rs", "pub mod reconcile;\npub mod webhook;\n");
    write(
        "op/reconcile.rs",
        "mod plan;\npub const FIELD_MANAGER: &str = \"m\";\npub fn run() { plan::plan() }\n",
    );
    write(
        "op/reconcile/plan.rs",
        "use crate::op::webhook;\npub fn plan() { webhook::injected() }\n",
    );
    write(
        "op/webhook.rs",
        "mod certs;\n#[cfg(test)]\nmod tests;\nuse certs::renew;\npub fn injected() {}\n",
    );
    write(
        "op/webhook/certs.rs",
        "pub fn renew() -> &'static str { crate::op::reconcile::FIELD_MANAGER }\n",
    );
    let cycles = import_cycles(&src);
    std::fs::remove_dir_all(&src).unwrap();
    assert_eq!(
        cycles,
        [
            "op::reconcile -> op::reconcile::plan, op::reconcile::plan -> op::webhook, \
          op::webhook -> op::webhook::certs, op::webhook::certs -> op::reconcile"
        ],
        "{cycles:?}"
    );
}

/// Each package's `[dependencies]` on the workspace's crates, as
/// `(crate, dependency, optional)`: the root `Cargo.toml` and each
/// `crates/*/Cargo.toml`.
fn crate_dependencies() -> BTreeMap<String, Vec<(String, bool)>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut manifests = vec![root.join("Cargo.toml")];
    for entry in std::fs::read_dir(root.join("crates")).expect("the crates folder") {
        manifests.push(entry.expect("a crate").path().join("Cargo.toml"));
    }
    manifests
        .iter()
        .map(|manifest| {
            let text = std::fs::read_to_string(manifest).unwrap_or_else(|e| panic!("{}: {e}", manifest.display()));
            dependencies_of(&text)
        })
        .collect()
}

/// The package's name and its `[dependencies]` named `leasehold…`.
fn dependencies_of(manifest: &str) -> (String, Vec<(String, bool)>) {
    let mut name = String::new();
    let mut section = "";
    let mut dependencies = Vec::new();
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            section = line;
        } else if section == "[package]" && line.starts_with("name = ") {
            name = line.trim_start_matches("name = ").trim_matches('"').to_string();
        } else if section == "[dependencies]" && line.starts_with("leasehold") {
            let dependency = line.split(['.', ' ', '=']).next().unwrap();
            dependencies.push((dependency.to_string(), line.contains("optional = true")));
        }
    }
    dependencies.sort();
    (name, dependencies)
}

/// The crate graph docs/design.md draws, crate by crate.
fn documented_graph() -> BTreeMap<String, Vec<String>> {
    let design = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/design.md")).unwrap();
    let start = design
        .find("```text\nleasehold ")
        .expect("the crate graph in docs/design.md");
    let block = &design[start + 8..];
    block[..block.find("```").unwrap()]
        .lines()
        .map(|line| {
            let (name, uses) = line.split_once("->").expect("`crate -> dependencies`");
            let mut uses: Vec<String> = uses
                .split(',')
                .map(str::trim)
                .filter(|u| !u.is_empty())
                .map(String::from)
                .collect();
            uses.sort();
            (name.trim().to_string(), uses)
        })
        .collect()
}

/// The graph in docs/design.md is the manifests' own, and the test kit is
/// never a plain dependency of a product crate: only an optional one
/// behind a `testing` feature (or a dev-dependency, not read here).
#[test]
fn the_crate_graph_is_the_documented_one_and_test_support_stays_optional() {
    let actual = crate_dependencies();
    assert!(actual.len() >= 9, "the walk found the crates: {actual:?}");
    let names: BTreeMap<String, Vec<String>> = actual
        .iter()
        .map(|(name, uses)| {
            (
                name.clone(),
                uses.iter().map(|(dependency, _)| dependency.clone()).collect(),
            )
        })
        .collect();
    assert_eq!(
        names,
        documented_graph(),
        "docs/design.md's crate graph against the manifests"
    );
    let plain_test_kit: Vec<&String> = actual
        .iter()
        .filter(|(name, uses)| {
            name.as_str() != "leasehold-testkit" && uses.contains(&("leasehold-testkit".to_string(), false))
        })
        .map(|(name, _)| name)
        .collect();
    assert!(
        plain_test_kit.is_empty(),
        "a plain dependency on the test kit: {plain_test_kit:?}"
    );
}

/// The manifest reading sees a planted plain dependency on the test kit
/// and tells optional ones apart.
#[test]
fn the_crate_graph_check_reads_a_planted_dependency() {
    let (name, uses) = dependencies_of(
        "[package]\nname = \"leasehold-sidecar\"\n\n[dependencies]\nleasehold-core.workspace = true\nleasehold-testkit = { workspace = true }\nleasehold-runtime = { workspace = true, optional = true }\n\n[dev-dependencies]\nleasehold-stores.workspace = true\n",
    );
    assert_eq!(name, "leasehold-sidecar");
    assert_eq!(
        uses,
        [
            ("leasehold-core".to_string(), false),
            ("leasehold-runtime".to_string(), true),
            ("leasehold-testkit".to_string(), false)
        ]
    );
}
