//! The port every lease store implements (Spanner, memory, …).
//!
//! All expiry judgements happen inside the store, on the store's clock.

use std::time::Duration;

use async_trait::async_trait;

use super::record::{FencingToken, Grant, Observation};

/// Why a store operation did not succeed. The elector treats each kind
/// differently, so stores must classify carefully.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// Someone else holds a valid lease (acquire), or our token was
    /// superseded or released (renew, release). Not retried.
    #[error("lease {lock} is not ours: {reason}")]
    Lost { lock: String, reason: String },
    /// The store could not be reached or refused service; nothing happened.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The write may or may not have committed (commit deadline exceeded,
    /// connection lost after sending). Never treated as success (S9).
    #[error("outcome unknown: {0}")]
    OutcomeUnknown(String),
    /// Bad input or a missing table/database: retrying will not help.
    #[error("invalid: {0}")]
    Invalid(String),
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// One lock row per name; every write is a single atomic transaction.
#[async_trait]
pub trait LeaseStore: Send + Sync + 'static {
    /// A short name for logs and metrics ("memory", "spanner").
    fn kind(&self) -> &'static str;

    /// Creates the table when it is missing. Idempotent.
    async fn ensure_schema(&self) -> Result<()>;

    /// A strongly consistent, lock-free read of the row and the store's clock.
    async fn observe(&self, lock: &str) -> Result<Observation>;

    /// Takes the lease when the row is absent, free, or expired by the store's
    /// clock: term + 1, token = renewed_at = commit timestamp.
    async fn acquire(&self, lock: &str, holder: &str, lease: Duration) -> Result<Grant>;

    /// Check-and-set: only while `holder` and `token` are still the row's;
    /// sets renewed_at to the commit timestamp.
    async fn renew(&self, lock: &str, holder: &str, token: FencingToken, lease: Duration) -> Result<Grant>;

    /// Check-and-set like renew; frees the row, keeping term and token.
    async fn release(&self, lock: &str, holder: &str, token: FencingToken) -> Result<()>;
}
