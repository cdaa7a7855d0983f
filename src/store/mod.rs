//! The lease stores: the database backends are the `leasehold-stores`
//! crate's, the memory store the core's, both re-exported here under the
//! paths the library has always had; the Kubernetes store (Leases) is this
//! package's, with the resource it serves. The conformance suite every
//! backend must pass is test support (`testing::conformance`).

#[cfg(feature = "kubernetes")]
pub mod kubernetes;

pub use leasehold_core::store::memory;
pub use leasehold_stores::*;
pub use memory::{Faults, MemoryStore};
