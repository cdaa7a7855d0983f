//! Lease store backends: one file per backend, plus the conformance suite
//! every backend must pass.

pub mod conformance;
pub mod memory;
pub mod spanner;

pub use crate::lease::store::{LeaseStore, Result, StoreError};
pub use memory::{Faults, MemoryStore};
