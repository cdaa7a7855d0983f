//! leasehold: leader election for Kubernetes pods on Cloud Spanner, with
//! fencing tokens.
//!
//! Arrows point inward: `sidecar`, `run` and `operator` use `lease`, `store` and
//! `api`; `lease` uses none of them.
//!
//! Cargo features pick the parts: the lease core and the memory store are
//! always there; `spanner` adds the Cloud Spanner store, `kubernetes` the
//! `DistributedLease` resource, `sidecar`, `operator` and `cli` the roles and
//! the binary (default), `simulate` the safety simulation.

#[cfg(feature = "cli")]
pub mod advise;
#[cfg(feature = "kubernetes")]
pub mod api;
#[cfg(feature = "operator")]
pub mod check;
#[cfg(feature = "cli")]
pub mod cli;
#[cfg(feature = "cli")]
pub mod demo;
#[cfg(feature = "operator")]
pub mod inject;
#[cfg(feature = "operator")]
pub mod install_self;
pub mod lease;
#[cfg(feature = "operator")]
pub mod operator;
#[cfg(feature = "kubernetes")]
pub mod rbac;
#[cfg(feature = "sidecar")]
pub mod run;
#[cfg(any(feature = "sidecar", feature = "operator"))]
pub mod shutdown;
#[cfg(feature = "sidecar")]
pub mod sidecar;
#[cfg(feature = "simulate")]
pub mod sim;
#[cfg(feature = "cli")]
pub mod status;
pub mod store;
#[cfg(feature = "testing")]
#[doc(hidden)]
pub mod testing;
