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
