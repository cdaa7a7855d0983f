//! Lease store backends: one file per backend, plus the conformance suite
//! every backend must pass (compiled for tests only).

#[cfg(feature = "testing")]
pub mod conformance;
pub mod memory;
#[cfg(feature = "spanner")]
pub mod spanner;

pub use crate::lease::store::{LeaseStore, Result, StoreError};
pub use memory::{Faults, MemoryStore};
