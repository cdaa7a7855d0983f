//! The port every lease store implements (Spanner, memory, …).
//!
//! All expiry judgements happen inside the store, on the store's clock.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::record::{EndReason, FencingToken, Grant, Held, Observation, Release};
use super::version::Claim;

/// The underlying error a store failure came from, kept for `{:#}` and logs.
pub type Cause = Arc<dyn std::error::Error + Send + Sync + 'static>;

/// Why a store operation did not succeed. The elector treats each kind
/// differently, so stores must classify carefully. `context` says what was
/// being done; `source`, when there is one, is the error underneath.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// Someone else holds a valid lease (acquire), or our token was
    /// superseded or released (renew, release). Not retried.
    #[error("lease {lock} is not ours: {reason}")]
    Lost { lock: String, reason: String },
    /// The store could not be reached or refused service; nothing happened.
    #[error("store unavailable: {context}")]
    Unavailable {
        context: String,
        #[source]
        source: Option<Cause>,
    },
    /// The write may or may not have committed (commit deadline exceeded,
    /// connection lost after sending). Never treated as success (S9).
    #[error("outcome unknown: {context}")]
    OutcomeUnknown {
        context: String,
        #[source]
        source: Option<Cause>,
    },
    /// Bad input or a missing table/database: retrying will not help.
    #[error("invalid: {context}")]
    Invalid {
        context: String,
        #[source]
        source: Option<Cause>,
    },
}

impl StoreError {
    pub fn unavailable(context: impl Into<String>) -> Self {
        StoreError::Unavailable {
            context: context.into(),
            source: None,
        }
    }

    pub fn outcome_unknown(context: impl Into<String>) -> Self {
        StoreError::OutcomeUnknown {
            context: context.into(),
            source: None,
        }
    }

    pub fn invalid(context: impl Into<String>) -> Self {
        StoreError::Invalid {
            context: context.into(),
            source: None,
        }
    }

    /// The same kind of failure, keeping `source` as its cause.
    pub fn caused_by(self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        let cause: Option<Cause> = Some(Arc::new(source));
        match self {
            StoreError::Unavailable { context, .. } => StoreError::Unavailable { context, source: cause },
            StoreError::OutcomeUnknown { context, .. } => StoreError::OutcomeUnknown { context, source: cause },
            StoreError::Invalid { context, .. } => StoreError::Invalid { context, source: cause },
            lost @ StoreError::Lost { .. } => lost,
        }
    }

    /// The message and every cause below it, each once (see [`crate::errors::chain`]).
    pub fn chain(&self) -> String {
        crate::errors::chain(self)
    }
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// Which store a lease lives in, as the store itself says, not as an
/// address reaches it: `postgres:<system identifier>/<database>/<schema>`,
/// `redis:<marker>`, `spanner:<database>`, `kubernetes:<namespace>`. Two
/// URLs that reach the same store (a rotated password, another host name)
/// give the same identity; a URL edited to reach another store gives
/// another, and candidates never campaign on a store whose identity is not
/// the one their lease recorded (docs/migrating-stores.md).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct StoreIdentity(String);

impl StoreIdentity {
    pub fn new(identity: impl Into<String>) -> Self {
        StoreIdentity(identity.into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for StoreIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// One lock row per name; every write is a single atomic transaction.
#[async_trait]
pub trait LeaseStore: Send + Sync + 'static {
    /// A short name for logs and metrics ("memory", "spanner").
    fn kind(&self) -> &'static str;

    /// Creates the table when it is missing. Idempotent.
    async fn ensure_schema(&self) -> Result<()>;

    /// A strongly consistent, lock-free read of the row and the store's clock.
    async fn observe(&self, lock: &str) -> Result<Observation>;

    /// The rows of `locks` in one read where the store can (one query, one
    /// script, one batched read), each with the store's clock at that read:
    /// one [`Observation`] per lock, in the order given (a lock named twice
    /// is answered twice). The operator observes every lease of one table
    /// this way, so its reads do not grow with the number of leases. The
    /// default reads the locks one by one: for a store without a batched read.
    async fn observe_many(&self, locks: &[String]) -> Result<Vec<Observation>> {
        let mut observed = Vec::with_capacity(locks.len());
        for lock in locks {
            observed.push(self.observe(lock).await?);
        }
        Ok(observed)
    }

    /// Resolves once some row of this store's table may have changed (a
    /// release the store announced), so an observer of many rows reads them
    /// at once instead of at its next period. Stores that cannot tell never
    /// resolve.
    async fn changed_any(&self) {
        futures::future::pending::<()>().await
    }

    /// What a follower between two attempts reads: [`observe`](Self::observe)
    /// for stores that are polled; a store that watches its rows (the
    /// Kubernetes store) answers from the watch, without a request. It may
    /// lag the store by the watch's delay; that costs only time, because
    /// every write is check-and-set on what the store itself finds.
    async fn observe_followed(&self, lock: &str) -> Result<Observation> {
        self.observe(lock).await
    }

    /// Resolves once the row may differ from `seen`, so a follower wakes for
    /// a release at once instead of at its next poll. Stores that cannot
    /// tell never resolve: their followers poll every retry period.
    async fn changed(&self, lock: &str, seen: &Observation) {
        let _ = (lock, seen);
        futures::future::pending::<()>().await
    }

    /// Takes the lease when the row is absent, free, or expired by the store's
    /// clock: term + 1, token = renewed_at = commit timestamp, and records
    /// the claim's version. With `claim.fence`, refuses (as `Lost`) in the
    /// same transaction when [`Claim::fenced_by`] says the row's recorded
    /// version forbids it, so racing candidates cannot pass the fence.
    async fn acquire_as(&self, lock: &str, claim: &Claim<'_>, lease: Duration) -> Result<Grant>;

    /// Check-and-set takeover: only while the row's holder is exactly
    /// `from.holder` with `from.token` (live, or expired where the store
    /// keeps expired leases; never once released or taken since), takes the
    /// row as
    /// [`acquire_as`](Self::acquire_as) would: term + 1, a token above every
    /// one handed out before, the claim's version recorded and the fence
    /// judged in the same transaction. Anything else is `Lost`. A sidecar
    /// restarted by the kubelet resumes its own pod's lease this way
    /// ([`Identity::succeeds`](super::Identity::succeeds)) instead of
    /// waiting D. A store that cannot do this refuses, and its candidates
    /// wait for the lease to expire.
    async fn take_over(&self, lock: &str, claim: &Claim<'_>, from: Held<'_>, lease: Duration) -> Result<Grant> {
        let _ = (claim, from, lease);
        Err(StoreError::Lost {
            lock: lock.to_string(),
            reason: format!("the {} store cannot take a lease over", self.kind()),
        })
    }

    /// [`acquire_as`](Self::acquire_as) without a version and without the fence.
    async fn acquire(&self, lock: &str, holder: &str, lease: Duration) -> Result<Grant> {
        self.acquire_as(lock, &Claim::unversioned(holder), lease).await
    }

    /// Check-and-set: only while `holder` and `token` are still the row's;
    /// sets renewed_at to the commit timestamp.
    async fn renew(&self, lock: &str, holder: &str, token: FencingToken, lease: Duration) -> Result<Grant>;

    /// Check-and-set like renew; frees the row, keeping term and token, and
    /// records the release's end for the term ([`Release::reason`], as
    /// [`LeaseRecord::ended`](super::LeaseRecord::ended)).
    /// With a handoff, the same write reserves the row for the handoff's pod
    /// until the commit's store time plus its window, capped at the row's
    /// lease duration ([`Handoff::reservation`](super::Handoff::reservation)); without, it clears any
    /// reservation. While a reservation lasts, [`acquire_as`](Self::acquire_as)
    /// refuses (as `Lost`) every claimant whose holder does not carry that
    /// pod UID ([`LeaseRecord::reserved_against`](super::LeaseRecord::reserved_against)),
    /// judged in its own transaction on the store's clock; an acquire
    /// clears it. A reservation only removes acquisitions, so it cannot
    /// make two holders or move a token back (docs/design.md, "Transfer").
    /// Acquires and takeovers record the end of the term they replace
    /// ([`LeaseRecord::ended_by_acquire`](super::LeaseRecord::ended_by_acquire),
    /// [`LeaseRecord::ended_by_take_over`](super::LeaseRecord::ended_by_take_over)); renewals keep it.
    async fn release_for(&self, lock: &str, holder: &str, token: FencingToken, release: &Release) -> Result<()>;

    /// [`release_for`](Self::release_for) without a reservation, as [`EndReason::Released`].
    async fn release(&self, lock: &str, holder: &str, token: FencingToken) -> Result<()> {
        self.release_for(lock, holder, token, &Release::because(EndReason::Released))
            .await
    }
}
