//! leasehold's Kubernetes layer, above the core and the stores and below
//! the roles: the `DistributedLease` resource and the contract both roles
//! follow ([`api`]), the RBAC rules they need ([`rbac`]) and the Kubernetes
//! store, one `coordination.k8s.io/v1` Lease per lock ([`store`]).

#![warn(unreachable_pub)]

pub mod api;
pub mod rbac;
pub mod store;
