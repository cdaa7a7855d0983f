//! What a user installs, runs first and reads: the image, the manifests and chart, the README's commands, the generated reference, the monitoring rules, `demo`, `advise` and the installer.

mod advise;
mod cli_errors;
mod demo;
mod dockerfile;
mod docs_reference;
mod error_sources;
mod install_self;
mod layout;
mod manifests;
mod monitoring;
mod readme;

/// The `src/` folder of every crate of the workspace: the `leasehold`
/// package's and each one under `crates/` (docs/design.md, "The house as
/// crates"), for the checks that read the code.
fn crate_sources() -> Vec<std::path::PathBuf> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut sources = vec![root.join("src")];
    let crates = std::fs::read_dir(root.join("crates")).expect("the crates folder");
    let mut more: Vec<_> = crates.map(|entry| entry.expect("a crate").path().join("src")).collect();
    more.sort();
    sources.extend(more);
    sources
}
