//! Whole `leasehold` processes against real stores, each behind a TCP proxy the test controls: failover, handover, health, publishing, `leasehold run`, rollouts, partitions, transfers and the candidate build.

mod candidate;
mod health;
mod panic;
mod partitions;
mod publish;
mod retire;
mod rollout;
mod run;
mod sidecar;
mod stores;
mod transfer;
