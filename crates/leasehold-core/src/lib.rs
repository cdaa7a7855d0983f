//! leasehold's core: the lease record and identity, timing, the store
//! ports (`LeaseStore`, `SessionStore`), the elector, partitions, versions,
//! the error chain, and the memory store. No Kubernetes, no database
//! client, no command line: every backend, role and command sits in a
//! crate above this one (docs/design.md, "The house as crates"); the
//! `leasehold` package re-exports it under the same paths.

#![warn(unreachable_pub)]

pub mod errors;
pub mod lease;
pub mod store;
/// Log events as a log pipeline reads them, for tests here and above.
#[cfg(feature = "testing")]
#[doc(hidden)]
pub mod testing_logs;
