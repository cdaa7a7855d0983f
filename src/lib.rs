//! leasehold: leader election for Kubernetes pods on Cloud Spanner, with
//! fencing tokens.
//!
//! Arrows point inward: `sidecar` and `operator` use `lease`, `store` and
//! `api`; `lease` uses none of them.

pub mod advise;
pub mod api;
pub mod cli;
pub mod demo;
pub mod lease;
pub mod operator;
pub mod rbac;
pub mod shutdown;
pub mod sidecar;
pub mod sim;
pub mod store;
#[doc(hidden)]
pub mod testing;
