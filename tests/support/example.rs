//! A built example binary, for tests that run one as its users do.

use std::path::{Path, PathBuf};

/// `target/<profile>/examples/<name>`, checked to be newer than its source
/// (`crates/<crate>/examples/<name>.rs`: examples live with the crate they
/// show). Cargo does not build examples for tests: `cargo build --workspace
/// --examples` does (scripts/test.sh runs it before the tests), into the
/// `examples` folder beside the test binary's `deps`.
pub fn built_example(name: &str) -> PathBuf {
    let test = std::env::current_exe().unwrap();
    let example = test
        .parent()
        .and_then(Path::parent)
        .unwrap()
        .join("examples")
        .join(name);
    let built = std::fs::metadata(&example)
        .and_then(|m| m.modified())
        .unwrap_or_else(|e| {
            panic!(
                "{}: {e}; build it with `cargo build --workspace --example {name}`",
                example.display()
            )
        });
    let source = example_source(name);
    assert!(
        built >= std::fs::metadata(&source).unwrap().modified().unwrap(),
        "{} is older than {}; build it with `cargo build --workspace --example {name}`",
        example.display(),
        source.display()
    );
    example
}

/// The one crate's `examples/<name>.rs`.
fn example_source(name: &str) -> PathBuf {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("crates");
    let found: Vec<PathBuf> = std::fs::read_dir(&crates)
        .unwrap_or_else(|e| panic!("{}: {e}", crates.display()))
        .map(|entry| entry.unwrap().path().join(format!("examples/{name}.rs")))
        .filter(|path| path.is_file())
        .collect();
    match found.as_slice() {
        [one] => one.clone(),
        _ => panic!("examples/{name}.rs is in {} crates, not one: {found:?}", found.len()),
    }
}
