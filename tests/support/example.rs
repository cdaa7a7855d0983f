//! A built example binary, for tests that run one as its users do.

use std::path::{Path, PathBuf};

/// `target/<profile>/examples/<name>`, checked to be newer than its source.
/// Cargo does not build examples for tests: `cargo build --examples` does
/// (scripts/test.sh runs it before the tests), into the `examples` folder
/// beside the test binary's `deps`.
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
                "{}: {e}; build it with `cargo build --example {name}`",
                example.display()
            )
        });
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("examples/{name}.rs"));
    assert!(
        built >= std::fs::metadata(&source).unwrap().modified().unwrap(),
        "{} is older than {}; build it with `cargo build --example {name}`",
        example.display(),
        source.display()
    );
    example
}
