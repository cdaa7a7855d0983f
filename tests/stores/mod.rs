//! The store conformance suite on every backend, each on a real server (memory, PostgreSQL, Redis, the Spanner emulator, a Kubernetes API server), plus each store's own behaviour.

mod fencing;
mod fencing_races;
mod kubernetes;
mod memory;
mod postgres;
mod postgres_sessions;
mod redis;
mod redis_sessions;
mod spanner;
