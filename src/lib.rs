//! leasehold: leader election for Kubernetes pods on Cloud Spanner,
//! PostgreSQL, Redis or Kubernetes Leases, with fencing tokens.
//!
//! Arrows point inward: the commands (`cmd`) use the roles (`sidecar`,
//! `operator`), which use `lease`, `store` and `api`; `lease` uses none of
//! them.
//!
//! Cargo features pick the parts: the lease core and the memory store are
//! always there; `spanner` adds the Cloud Spanner store, `kubernetes` the
//! `DistributedLease` resource, `sidecar`, `operator` and `cli` the roles and
//! the binary (default), `candidate` the binary with only a candidate pod's
//! commands, `simulate` the safety simulation.
//!
//! The core (`lease`, `errors`, the memory store) is the crate
//! `leasehold-core` and the database stores with their fence helpers the
//! crate `leasehold-stores`, re-exported here under the same paths.

#![warn(unreachable_pub)]

pub use leasehold_core::{errors, lease};
pub use leasehold_stores::fence;

#[cfg(feature = "kubernetes")]
pub mod api;
#[cfg(feature = "candidate")]
pub mod cmd;
#[cfg(feature = "operator")]
pub mod operator;
#[cfg(feature = "kubernetes")]
pub mod rbac;
#[cfg(any(feature = "sidecar", feature = "operator"))]
pub mod runtime;
#[cfg(any(feature = "sidecar", feature = "operator"))]
pub mod shutdown;
#[cfg(feature = "sidecar")]
pub mod sidecar;
#[cfg(feature = "simulate")]
pub mod sim;
pub mod store;
#[cfg(feature = "testing")]
#[doc(hidden)]
pub mod testing;
