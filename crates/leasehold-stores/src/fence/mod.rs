//! The enforcing half of fencing: the resource a leader writes to refuses a
//! write that carries a fencing token lower than one it has already seen.
//!
//! A token alone fences nothing: a deposed leader (paused past its lease, a
//! long GC, a partition) resumes with its old token and writes. Here the
//! resource compares: every guarded write goes through a *fence*, a record
//! of the highest token seen for one lock, advanced in the same atomic step
//! (transaction, script) as the write itself. A lower token is refused
//! ([`FenceError::Stale`], naming both tokens) and nothing is written; an
//! equal token is the same leader writing again and passes.
//!
//! One file per resource, each under the crate feature that already brings
//! that store's client, so the core stays free of store clients:
//!
//! * [`postgres`] (feature `postgres`): a fence table, advanced by
//!   `INSERT … ON CONFLICT … DO UPDATE … WHERE` in the transaction that runs
//!   the guarded writes.
//! * [`spanner`] (feature `spanner`): a fence table, read, compared and
//!   written in the read-write transaction that buffers the guarded mutations.
//! * [`redis`] (feature `redis`): a Lua script that compares the fence key
//!   and sets the guarded keys in one atomic step.
//! * Kubernetes objects: the chart's admission policy (`fencing.enabled`,
//!   docs/fencing.md), enforced by the API server.
//! * Files and object stores: a documented pattern (docs/fencing.md), no
//!   helper.
//!
//! # A fence is keyed by lease store *and* lock
//!
//! Tokens are only ordered within the lease store that issued them: Spanner
//! and PostgreSQL tokens are commit times in nanoseconds, Redis tokens are
//! microseconds, the Kubernetes store's are resource versions. A Redis token
//! of today is far below a PostgreSQL token of last year, so comparing across
//! stores would refuse every write after a move from PostgreSQL to Redis and
//! accept a deposed leader's after a move the other way. A [`Fence`]
//! therefore names the *issuer* (the lease store, as `--store` names it) with
//! the lock, and each (issuer, lock) pair has a record of its own. When a
//! lease moves to another store, the new store's tokens start a new fence
//! record, which is only safe once no leader of the old store can write: the
//! same rule as for moving the lease itself (wait out the old store's lease
//! duration with no holder before the new store elects; docs/fencing.md).

#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "redis")]
pub mod redis;
#[cfg(feature = "spanner")]
pub mod spanner;

use crate::lease::{FencingToken, LockNameError, validate_lock_name};

/// The lease stores that issue tokens, as `--store` names them: a fence
/// record belongs to one of them.
pub const ISSUERS: [&str; 5] = ["spanner", "postgres", "redis", "kubernetes", "memory"];

/// One guarded write's claim: the token a leader holds for a lock, from the
/// lease store that issued it. Built by [`Fence::new`], which checks it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    issuer: String,
    lock: String,
    token: FencingToken,
}

impl Fence {
    /// `issuer` is the lease store that issued `token` (one of [`ISSUERS`]);
    /// `lock` the lock it was issued for. Tokens are never negative.
    pub fn new(issuer: &str, lock: &str, token: FencingToken) -> Result<Self, FenceError> {
        if !ISSUERS.contains(&issuer) {
            return Err(FenceError::UnknownIssuer(issuer.to_string()));
        }
        validate_lock_name("the fenced lock", lock)?;
        if token.0 < 0 {
            return Err(FenceError::NegativeToken(token));
        }
        Ok(Fence {
            issuer: issuer.to_string(),
            lock: lock.to_string(),
            token,
        })
    }

    #[cfg(test)]
    pub fn issuer(&self) -> &str {
        &self.issuer
    }

    pub fn lock(&self) -> &str {
        &self.lock
    }

    pub fn token(&self) -> FencingToken {
        self.token
    }

    /// What a store error happened doing.
    #[cfg(any(feature = "postgres", feature = "redis", feature = "spanner"))]
    fn context(&self) -> String {
        format!("the fenced write to lock {:?}", self.lock)
    }

    /// The refusal of this fence's token, `seen` being the higher one the
    /// fence already holds.
    #[cfg(any(feature = "postgres", feature = "redis", feature = "spanner"))]
    fn stale(&self, seen: i64) -> FenceError {
        FenceError::Stale {
            issuer: self.issuer.clone(),
            lock: self.lock.clone(),
            offered: self.token,
            seen: FencingToken(seen),
        }
    }
}

/// Why a fenced write did not happen (or, for the store errors, may not
/// have: an error during the commit leaves its outcome unknown, as for any
/// write whose reply was lost).
#[derive(Debug, thiserror::Error)]
pub enum FenceError {
    /// The fence already holds a higher token: a newer leader wrote. Nothing
    /// of this write was applied.
    #[error(
        "fencing token {offered} is older than {seen} already seen for lock {lock:?} (tokens of the {issuer} store); the write was refused"
    )]
    Stale {
        issuer: String,
        lock: String,
        offered: FencingToken,
        seen: FencingToken,
    },
    #[error("fencing tokens are never negative, not {0}")]
    NegativeToken(FencingToken),
    #[error("{0:?} is not a lease store that issues tokens; one of spanner, postgres, redis, kubernetes, memory")]
    UnknownIssuer(String),
    #[error(transparent)]
    Lock(#[from] LockNameError),
    #[error("fence table {0:?} is not a valid identifier (a letter, then letters, digits or '_', at most 63)")]
    Table(String),
    /// A guarded Redis key outside the fence key's hash slot: Redis Cluster
    /// could not run the script over both.
    #[error("key {key:?} does not share the hash tag {{{tag}}} of the fence; put {{{tag}}} in it")]
    HashSlot { key: String, tag: String },
    #[cfg(feature = "postgres")]
    #[error("{context} failed in PostgreSQL")]
    Postgres {
        context: String,
        #[source]
        source: tokio_postgres::Error,
    },
    #[cfg(feature = "redis")]
    #[error("{context} failed in Redis")]
    Redis {
        context: String,
        #[source]
        source: ::redis::RedisError,
    },
    #[cfg(feature = "spanner")]
    #[error("{context} failed in Spanner")]
    Spanner {
        context: String,
        #[source]
        source: google_cloud_spanner::Error,
    },
}

/// The fence table's name in SQL text (it cannot be a parameter).
#[cfg(any(feature = "postgres", feature = "spanner"))]
fn check_table(table: &str) -> Result<(), FenceError> {
    if crate::is_sql_identifier(table, 63) {
        Ok(())
    } else {
        Err(FenceError::Table(table.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fence_names_a_known_issuer_a_valid_lock_and_a_token_that_is_not_negative() {
        let fence = Fence::new("postgres", "orders", FencingToken(7)).unwrap();
        assert_eq!(
            (fence.issuer(), fence.lock(), fence.token()),
            ("postgres", "orders", FencingToken(7))
        );
        let unknown = Fence::new("etcd", "orders", FencingToken(7)).unwrap_err();
        assert!(
            matches!(unknown, FenceError::UnknownIssuer(ref s) if s == "etcd"),
            "{unknown}"
        );
        let lock = Fence::new("redis", " orders", FencingToken(7)).unwrap_err();
        assert!(matches!(lock, FenceError::Lock(_)), "{lock}");
        let negative = Fence::new("redis", "orders", FencingToken(-1)).unwrap_err();
        assert_eq!(negative.to_string(), "fencing tokens are never negative, not -1");
    }

    #[test]
    fn a_stale_token_names_both_tokens_and_the_lock() {
        let fence = Fence::new("spanner", "orders", FencingToken(17)).unwrap();
        assert_eq!(
            fence.stale(42).to_string(),
            "fencing token 17 is older than 42 already seen for lock \"orders\" (tokens of the spanner store); \
             the write was refused"
        );
    }
}
