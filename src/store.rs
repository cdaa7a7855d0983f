//! The lease stores under the paths the library has always had: the memory
//! store is the core's (`leasehold-core`), the database backends are
//! `leasehold-stores`' and the Kubernetes store (Leases) is
//! `leasehold-kubernetes`', beside the resource it serves. The conformance
//! suite every backend must pass is test support (`testing::conformance`).

#[cfg(feature = "kubernetes")]
pub use leasehold_kubernetes::store as kubernetes;

pub use leasehold_core::store::memory;
pub use leasehold_stores::*;
pub use memory::{Faults, MemoryStore};
