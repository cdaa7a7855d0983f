//! leasehold: leader election for Kubernetes pods on Cloud Spanner,
//! PostgreSQL, Redis or Kubernetes Leases, with fencing tokens.
//!
//! This package is the command line (`cmd`) and a facade over the crates
//! that are the layers (docs/design.md, "The house as crates"), each under
//! the path the library has always had:
//!
//! | path | crate | feature |
//! |---|---|---|
//! | `lease`, `errors`, `store::memory` | `leasehold-core` | always |
//! | `store::{spanner, postgres, redis}`, `fence` | `leasehold-stores` | `spanner`, `postgres`, `redis` |
//! | `api`, `rbac`, `store::kubernetes` | `leasehold-kubernetes` | `kubernetes` |
//! | `runtime`, `shutdown` | `leasehold-runtime` | `sidecar` or `operator` |
//! | `sidecar` | `leasehold-sidecar` | `sidecar` |
//! | `operator` | `leasehold-operator` | `operator` |
//! | `sim` | `leasehold-sim` | `simulate` |
//! | `testing` | `leasehold-testkit` | `testing` |
//!
//! Arrows point inward: the commands use the roles, which use the runtime,
//! the Kubernetes layer, the stores and the core; the core uses none of
//! them. `cli` (default) builds the binary with every role, `candidate`
//! with only a candidate pod's commands.

#![warn(unreachable_pub)]

pub use leasehold_core::{errors, lease};
pub use leasehold_stores::fence;

#[cfg(feature = "kubernetes")]
pub use leasehold_kubernetes::{api, rbac};
#[cfg(feature = "candidate")]
pub mod cmd;
#[cfg(feature = "operator")]
pub use leasehold_operator as operator;
#[cfg(any(feature = "sidecar", feature = "operator"))]
pub use leasehold_runtime::{self as runtime, shutdown};
#[cfg(feature = "sidecar")]
pub use leasehold_sidecar as sidecar;
#[cfg(feature = "simulate")]
pub use leasehold_sim as sim;
pub mod store;
#[cfg(feature = "testing")]
#[doc(hidden)]
pub use leasehold_testkit::{self as testing, conformance_tests, session_conformance_tests};
