//! Every test across modules, in one test binary with a module per layer.
//!
//! One binary, not one per layer: each test binary links the whole library
//! and its dependencies, so every change to `src/` relinked five of them
//! (docs/design.md, "The house, measured"). Select a layer by its module:
//! `cargo nextest run --test suite -E 'test(/^e2e::/)'`.

mod support;

mod e2e;
mod install;
mod lease;
mod processes;
mod stores;
