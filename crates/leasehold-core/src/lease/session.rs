//! Sessions: many locks per process run for the price of one renewal per P.
//!
//! A process run opens one *session* row and renews it by check-and-set
//! every P; each *lock* row names the session holding it. A lock is free
//! when it was released, or when its session is absent or expired by the
//! store's clock, judged inside the acquiring transaction. So a process
//! holding a thousand locks writes one row per P, not a thousand (the
//! heartbeat table of the ScyllaDB write-up; the sessions of etcd and Chubby).
//!
//! Why these rules (design chosen for sessions):
//! * A renewal checks, by the store's clock, that the session has not
//!   expired, and never creates a row: an expired session is dead for good,
//!   since others may have taken its locks while it was expired. Its owner
//!   opens a new session (a new id) and holds nothing from the old one.
//! * Taking locks is one transaction per batch that also checks, by the
//!   store's clock, that the caller's session is live, and then renews it
//!   (a successful batch is as good a proof of life as a renewal, and a
//!   process taking locks back to back must not starve its own renewals:
//!   on the emulator, which runs one read-write transaction at a time,
//!   it did, and the session expired); a lock already held
//!   by the caller's session is reported taken with its token (so a batch
//!   whose reply was lost can be confirmed by asking again, S9).
//! * Every lock keeps its own fencing token: the commit timestamp of its
//!   acquisition, so tokens strictly increase per lock, also across a row
//!   deleted by the garbage collector and written again.
//! * The local deadline of every lock of a session is the session's:
//!   `t_send + R` from the send time of the last successful renewal, as the
//!   elector's; the store keeps the session until `t_commit + D`.
//! * Single-lock leader election keeps its own row (`LeaseStore`): its
//!   failover and handover need no extra read of a session row.
//!
//! The port is a trait of its own, [`SessionStore`], so stores that do not
//! offer sessions (yet) keep implementing [`LeaseStore`](super::LeaseStore)
//! alone.

use std::future::Future;
use std::time::Duration;

use async_trait::async_trait;

use super::record::{FencingToken, Identity, LockNameError, StoreTime, validate_lock_name};
use super::store::{Result, StoreError};

/// The most locks one store call takes, releases or observes. Spanner
/// allows 80,000 mutations per commit and a taken lock writes 5 columns;
/// callers with more split them into several calls
/// ([`Session`](super::Session) does).
pub const MAX_LOCKS_PER_CALL: usize = 5_000;

/// The most rows of each table one garbage-collection transaction deletes:
/// `collect_garbage` runs as many transactions as it takes, so that none
/// locks an unbounded number of rows (or, on Spanner, passes the mutation
/// limit).
pub const GARBAGE_BATCH: usize = 1_000;

/// A new session id for `owner`: the owner's identity (unique per process
/// run) and a random `nonce`, since one run may open several sessions one
/// after the other. Ids are never reused.
pub fn new_session_id(owner: &Identity, nonce: u64) -> String {
    format!("{owner}~{nonce:016x}")
}

/// The owner of a session id made by [`new_session_id`], so people see the
/// pod behind a session; `None` for an id of another form.
pub fn session_owner(session: &str) -> Option<Identity> {
    let (owner, nonce) = session.rsplit_once('~')?;
    if nonce.len() != 16 || !nonce.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    owner.parse().ok()
}

/// One session's row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionRecord {
    pub id: String,
    /// The identity of the process run that opened it, for people.
    pub owner: String,
    /// Commit timestamp of the opening or the last renewal.
    pub renewed_at: StoreTime,
    /// The session's lease duration D: it expires at `renewed_at + D`.
    pub lease_duration: Duration,
}

impl SessionRecord {
    pub fn expires_at(&self) -> StoreTime {
        self.renewed_at.saturating_add(self.lease_duration)
    }

    /// Live at store time `now`: the same rule as a lease's
    /// ([`LeaseRecord::live_holder`](super::LeaseRecord::live_holder)).
    pub fn is_live_at(&self, now: StoreTime) -> bool {
        now <= self.expires_at()
    }
}

/// What `observe_session` returns: the row (absent once closed or collected)
/// and the store's clock at the read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionObservation {
    pub record: Option<SessionRecord>,
    pub now: StoreTime,
}

impl SessionObservation {
    pub fn is_live(&self) -> bool {
        self.record.as_ref().is_some_and(|r| r.is_live_at(self.now))
    }
}

/// One lock as observed: who holds it, judged by the store's clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObservedLock {
    pub name: String,
    /// The session holding it, when that session is live; `None` when the
    /// lock is free (never taken, released, or its session expired or gone).
    pub holder: Option<String>,
    /// The token of the last acquisition, also when free; `None` when the
    /// lock has no row.
    pub token: Option<FencingToken>,
}

/// What `observe_locks` returns, in the order asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocksObservation {
    pub locks: Vec<ObservedLock>,
    pub now: StoreTime,
}

/// What `try_lock` returns: which locks the session now holds, with their
/// tokens, and which are held by another live session. Every name asked is
/// in exactly one of the two.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LockBatch {
    pub taken: Vec<(String, FencingToken)>,
    pub busy: Vec<String>,
}

/// What a garbage collection removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Collected {
    /// Expired session rows deleted.
    pub sessions: u64,
    /// Lock rows deleted: released, or naming an expired or absent session.
    pub locks: u64,
}

impl Collected {
    /// Whether one batch deleted a full [`GARBAGE_BATCH`] of either table,
    /// so that more may be left.
    pub fn is_full_batch(&self) -> bool {
        self.sessions >= GARBAGE_BATCH as u64 || self.locks >= GARBAGE_BATCH as u64
    }

    fn add(&mut self, batch: Collected) {
        self.sessions += batch.sessions;
        self.locks += batch.locks;
    }
}

/// Runs `batch` (one bounded garbage-collection transaction) until one
/// comes back short of a full batch; the total of all.
pub async fn collect_in_batches<Fut>(mut batch: impl FnMut() -> Fut) -> Result<Collected>
where
    Fut: Future<Output = Result<Collected>>,
{
    let mut total = Collected::default();
    loop {
        let collected = batch().await?;
        total.add(collected);
        if !collected.is_full_batch() {
            return Ok(total);
        }
    }
}

/// The store port for sessions and lock sets. Every operation is one
/// transaction; every expiry judgement is the store's, on its own clock.
#[async_trait]
pub trait SessionStore: Send + Sync + 'static {
    /// Creates the session and lock tables when missing. Idempotent.
    async fn ensure_session_schema(&self) -> Result<()>;

    /// Creates the session row `session` for `owner`, valid for `lease`
    /// from the commit. Returns the commit timestamp. An id already in use
    /// is refused (ids are never reused).
    async fn open_session(&self, session: &str, owner: &str, lease: Duration) -> Result<StoreTime>;

    /// Check-and-set: only while the row exists and has not expired by the
    /// store's clock; sets `renewed_at` to the commit timestamp, which it
    /// returns. Otherwise `Lost`: the session is dead for good.
    async fn renew_session(&self, session: &str) -> Result<StoreTime>;

    /// Deletes the session row: every lock it held is free at once.
    /// `Lost` when the row is gone already.
    async fn close_session(&self, session: &str) -> Result<()>;

    /// A strongly consistent read of the session row and the store's clock.
    async fn observe_session(&self, session: &str) -> Result<SessionObservation>;

    /// In one transaction, while `session` is live by the store's clock:
    /// takes every lock in `names` that is free (no row, released, or held
    /// by an expired or absent session), each with a token above its last;
    /// reports the ones the session already holds as taken with their
    /// token, and the rest as busy; and renews the session (`renewed_at` =
    /// the commit timestamp), so a process busy taking locks keeps its
    /// session even when its renewals lose every race for the row. `Lost`
    /// when the session is not live.
    async fn try_lock(&self, session: &str, names: &[String]) -> Result<LockBatch>;

    /// Check-and-set per lock: frees each of `locks` still held by
    /// `session` with that token. Returns the names it freed; the others
    /// were not (or no longer) the session's.
    async fn unlock(&self, session: &str, locks: &[(String, FencingToken)]) -> Result<Vec<String>>;

    /// A strongly consistent read of the locks and the store's clock.
    async fn observe_locks(&self, names: &[String]) -> Result<LocksObservation>;

    /// Several [`observe_locks`](Self::observe_locks) in one read: one
    /// answer per set, in the order given, each lock in its set's order,
    /// all at one store time; a lock in several sets is read once and
    /// answered in each. At most [`MAX_LOCKS_PER_CALL`] distinct names in
    /// all. The operator reads every partitioned lease of one table this
    /// way, so its reads do not grow with the number of leases. Every
    /// store's `observe_locks` is one statement or script, so the default
    /// (the distinct names in one `observe_locks`) is that store's batch.
    async fn observe_lock_sets(&self, sets: &[Vec<String>]) -> Result<Vec<LocksObservation>> {
        if sets.is_empty() {
            return Ok(Vec::new());
        }
        let mut distinct = Vec::new();
        let mut index = std::collections::HashMap::new();
        for name in sets.iter().flatten() {
            index.entry(name.as_str()).or_insert_with(|| {
                distinct.push(name.clone());
                distinct.len() - 1
            });
        }
        let observed = self.observe_locks(&distinct).await?;
        if observed.locks.len() != distinct.len() {
            return Err(StoreError::invalid(format!(
                "observe locks answered {} of the {} locks asked",
                observed.locks.len(),
                distinct.len()
            )));
        }
        Ok(sets
            .iter()
            .map(|set| LocksObservation {
                locks: set
                    .iter()
                    .map(|name| observed.locks[index[name.as_str()]].clone())
                    .collect(),
                now: observed.now,
            })
            .collect())
    }

    /// Deletes expired session rows and the lock rows that are free
    /// (released, or naming an expired or absent session), judged by the
    /// store's clock, in transactions of at most [`GARBAGE_BATCH`] rows per
    /// table (as many as it takes); a live session and its locks are never
    /// touched.
    async fn collect_garbage(&self) -> Result<Collected>;
}

/// The checks of a batch of lock names every store makes before touching a
/// row: each name valid, no name twice, at most [`MAX_LOCKS_PER_CALL`].
pub fn validate_lock_names<'a>(names: impl IntoIterator<Item = &'a str>) -> Result<(), LockBatchError> {
    let mut seen = std::collections::HashSet::new();
    for name in names {
        validate_lock_name("lock name", name)?;
        if !seen.insert(name) {
            return Err(LockBatchError::Duplicate(name.to_string()));
        }
        if seen.len() > MAX_LOCKS_PER_CALL {
            return Err(LockBatchError::TooMany);
        }
    }
    Ok(())
}

/// A session id no store should see.
pub fn validate_session_id(session: &str) -> Result<()> {
    validate_lock_name("session id", session).map_err(|e| StoreError::invalid("session id").caused_by(e))
}

/// A batch of lock names that no store should see.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LockBatchError {
    #[error(transparent)]
    Name(#[from] LockNameError),
    #[error("lock name {0:?} is given twice in one call")]
    Duplicate(String),
    #[error("more than {MAX_LOCKS_PER_CALL} locks in one call: split them")]
    TooMany,
}

impl From<LockBatchError> for StoreError {
    fn from(e: LockBatchError) -> Self {
        StoreError::invalid("lock names").caused_by(e)
    }
}

/// The `Lost` error of a session that is expired, closed or collected.
pub fn session_lost(session: &str, reason: impl Into<String>) -> StoreError {
    StoreError::Lost {
        lock: format!("session {session}"),
        reason: reason.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_lives_until_renewed_at_plus_d_by_the_store_clock() {
        let record = SessionRecord {
            id: "s".into(),
            owner: "o".into(),
            renewed_at: StoreTime(1_000_000_000),
            lease_duration: Duration::from_secs(10),
        };
        assert!(record.is_live_at(StoreTime(11_000_000_000)));
        assert!(!record.is_live_at(StoreTime(11_000_000_001)));
        let observed = SessionObservation {
            record: None,
            now: StoreTime(0),
        };
        assert!(!observed.is_live(), "an absent session is not live");
    }

    #[test]
    fn session_ids_are_unique_and_name_their_owner() {
        let owner = Identity::with_nonce("pod-0", "n");
        let (a, b) = (new_session_id(&owner, 1), new_session_id(&owner, 2));
        assert!(a.starts_with("pod-0#n~"), "{a}");
        assert_ne!(a, b);
        validate_session_id(&a).unwrap();
    }

    #[test]
    fn a_session_id_names_its_owner_and_pod() {
        let owner = Identity::new(Some("east".into()), Some("prod".into()), "web-0");
        let id = new_session_id(&owner, 0xab);
        assert_eq!(session_owner(&id), Some(owner.clone()));
        assert_eq!(session_owner(&id).unwrap().name(), "web-0");
        // An id of another form names nobody, even when it looks close.
        for other in [
            "web-0",
            "web-0#n",
            "web-0#n~ab",
            "web-0#n~00000000000000zz",
            "~00000000000000ab",
        ] {
            assert_eq!(session_owner(other), None, "{other}");
        }
    }

    #[test]
    fn a_bad_batch_is_refused_naming_what_is_wrong() {
        validate_lock_names(["a", "b"]).unwrap();
        let err = |names: Vec<String>| {
            StoreError::from(validate_lock_names(names.iter().map(String::as_str)).unwrap_err()).chain()
        };
        assert!(
            err(vec!["a".into(), "a".into()]).contains("lock name \"a\" is given twice"),
            "{}",
            err(vec!["a".into(), "a".into()])
        );
        assert!(err(vec!["".into()]).contains("lock name must not be empty"));
        let many: Vec<String> = (0..=MAX_LOCKS_PER_CALL).map(|i| format!("l{i}")).collect();
        assert!(err(many).contains("more than 5000 locks in one call"));
    }
}
