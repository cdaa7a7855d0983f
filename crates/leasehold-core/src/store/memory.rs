//! An in-memory store for tests and the demo, judged by its own clock, with
//! fault injection: added latency, outages, replies dropped after commit,
//! unknown outcomes, a clock that runs fast or slow and jumps, and rows
//! deleted or written behind the elector's back. Seeded, so a simulation
//! replays exactly.
//!
//! Two expiry semantics: the SQL stores' (the row stays; expiry is judged
//! when it is read or taken, so a renewal after expiry that nobody took over
//! still succeeds) and, [`with_ttl_expiry`](MemoryStore::with_ttl_expiry),
//! Redis's (the lease key vanishes when its TTL runs out on the store clock,
//! so a late renewal finds nothing; the counter keeps term and token).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use rand::{RngExt, SeedableRng, rngs::StdRng};
use tokio::time::Instant;

pub mod session;

#[doc(hidden)]
pub use session::{LockAcquisition, SessionFlaw};

use crate::lease::store::Result;
use crate::lease::{
    Claim, EndReason, Ended, FencingToken, Grant, Held, LeaseRecord, LeaseStore, Observation, Release, StoreError,
    StoreTime, lease_to_millis, validate_lock_name,
};

/// Faults applied to every call. Probabilities are in [0, 1].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Faults {
    /// Added before the operation takes effect and again before the reply.
    pub latency: Duration,
    /// Every call fails as unavailable; nothing is written.
    pub down: bool,
    /// Probability that a call fails as unavailable without effect.
    pub unavailable: f64,
    /// Probability that a write commits but its reply is lost (S9).
    pub drop_reply_after_commit: f64,
    /// Probability that a write does not commit and reports an unknown outcome.
    pub unknown_without_commit: f64,
}

#[derive(Debug)]
struct State {
    rows: HashMap<String, LeaseRecord>,
    /// What a deleted row left behind: its term and token, so a recreated
    /// row continues the term count instead of starting again at 1.
    deleted: HashMap<String, LeaseRecord>,
    /// Sum of the clock jumps so far, in nanoseconds (negative: backwards).
    clock_jumps: i64,
    acquisitions: Vec<Acquisition>,
    /// Highest commit timestamp handed out: commit timestamps strictly
    /// increase, as Spanner's do for transactions touching the same row.
    last_commit: i64,
    faults: Faults,
    rng: StdRng,
    calls: StoreCalls,
    /// Leases that vanished at their TTL (Redis semantics).
    ttl_expiries: u64,
    /// Session and lock rows (`memory/session.rs`).
    sessions: session::Tables,
}

/// One acquisition as the store committed it, with the instant on the
/// candidates' (tokio) clock: the simulation's checker compares every
/// leader's claims with the commit of the next term.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acquisition {
    pub lock: String,
    pub term: u64,
    pub holder: String,
    pub token: Option<FencingToken>,
    /// The revision the acquirer recorded, if any.
    pub revision: Option<u64>,
    pub at: Instant,
}

/// Counts of calls that reached the store, by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreCalls {
    pub reads: u64,
    pub writes: u64,
}

/// The memory store. Cheap to clone; clones share the rows.
#[derive(Debug, Clone)]
pub struct MemoryStore {
    state: Arc<Mutex<State>>,
    /// The store clock: wall time at creation plus tokio time elapsed since,
    /// so paused-time tests drive it and it never goes backwards.
    epoch_nanos: i64,
    started: Instant,
    /// Store seconds per candidate second: clock-rate drift between the
    /// store and the candidates (S3).
    rate: f64,
    /// Redis semantics: a lease vanishes at its TTL.
    ttl_expiry: bool,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new(rand::random())
    }
}

enum Effect {
    Commit,
    CommitThenDropReply,
    UnknownWithoutCommit,
}

impl MemoryStore {
    /// A store whose random faults are drawn from `seed`.
    pub fn new(seed: u64) -> Self {
        let epoch_nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as i64)
            .unwrap_or_default();
        MemoryStore {
            state: Arc::new(Mutex::new(State {
                rows: HashMap::new(),
                deleted: HashMap::new(),
                clock_jumps: 0,
                acquisitions: Vec::new(),
                last_commit: 0,
                faults: Faults::default(),
                rng: StdRng::seed_from_u64(seed),
                calls: StoreCalls::default(),
                ttl_expiries: 0,
                sessions: session::Tables::default(),
            })),
            epoch_nanos,
            started: Instant::now(),
            rate: 1.0,
            ttl_expiry: false,
        }
    }

    /// With `ttl`, Redis's expiry: a lease whose TTL (renewed_at + lease on
    /// the store clock) has run out is gone before the next call sees it,
    /// as Redis deletes an expired key (`PEXPIRE`); the never-expiring
    /// counter keeps its term, token and duration. Otherwise the SQL
    /// stores' expiry, judged on the row that stays.
    #[doc(hidden)]
    pub fn with_ttl_expiry(mut self, ttl: bool) -> Self {
        self.ttl_expiry = ttl;
        self
    }

    /// Leases that vanished at their TTL so far.
    pub fn ttl_expiries(&self) -> u64 {
        self.lock().ttl_expiries
    }

    /// Redis semantics: removes the lease of `lock` if its TTL ran out by `now`.
    fn expire_by_ttl(&self, state: &mut State, lock: &str, now: StoreTime) {
        if !self.ttl_expiry {
            return;
        }
        if let Some(row) = state.rows.get_mut(lock)
            && row.holder.is_some()
            && row.live_holder(now).is_none()
        {
            row.holder = None;
            row.renewed_at = None;
            state.ttl_expiries += 1;
        }
    }

    /// Starts the store clock at `start` instead of the wall clock, so
    /// simulations print the same tokens on every replay.
    #[doc(hidden)]
    pub fn with_clock_start(mut self, start: StoreTime) -> Self {
        self.epoch_nanos = start.0;
        self
    }

    /// Runs the store clock `rate` times as fast as the candidates' clock.
    /// The elector tolerates rates below D / R (design.md: R/D bounds drift).
    #[doc(hidden)]
    pub fn with_clock_rate(mut self, rate: f64) -> Self {
        self.rate = rate;
        self
    }

    pub fn set_faults(&self, faults: Faults) {
        self.lock().faults = faults;
    }

    pub fn faults(&self) -> Faults {
        self.lock().faults.clone()
    }

    pub fn calls(&self) -> StoreCalls {
        self.lock().calls
    }

    /// Moves the store clock by `nanos` (negative: backwards), as an NTP
    /// step would. Commit timestamps still strictly increase.
    #[doc(hidden)]
    pub fn jump_clock(&self, nanos: i64) {
        self.lock().clock_jumps += nanos;
    }

    /// Deletes a row outright, as an operator or a person with SQL access
    /// could, returning what it was at the store time of deletion. Its term
    /// is remembered: a recreated row continues from it.
    pub fn delete_row(&self, lock: &str) -> Observation {
        let mut state = self.lock();
        let now = self.clock(&state);
        let record = state.rows.remove(lock);
        if let Some(row) = &record {
            let remains = LeaseRecord {
                holder: None,
                ..row.clone()
            };
            state.deleted.insert(lock.to_string(), remains);
        }
        Observation { record, now }
    }

    /// The row as a strongly consistent read would see it now, without the
    /// injected faults (the simulation's operator reads through it, so the
    /// schedule's fault draws stay what they were without it).
    #[doc(hidden)]
    pub fn peek(&self, lock: &str) -> Observation {
        let state = self.lock();
        Observation {
            record: state.rows.get(lock).cloned(),
            now: self.clock(&state),
        }
    }

    /// Writes a row outright, as a person with SQL access could (tests of
    /// what the store does with a row it would never write itself).
    #[cfg(test)]
    pub fn put_row(&self, row: LeaseRecord) {
        self.lock().rows.insert(row.name.clone(), row);
    }

    /// Every acquisition committed so far, in commit order.
    pub fn acquisitions(&self) -> Vec<Acquisition> {
        self.lock().acquisitions.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock leaves plain data behind; keep going.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn clock(&self, state: &State) -> StoreTime {
        StoreTime(self.epoch_nanos + state.clock_jumps + self.started.elapsed().mul_f64(self.rate).as_nanos() as i64)
    }

    async fn delay(&self) {
        let latency = self.lock().faults.latency;
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
    }

    /// Checks outages and draws the fate of this call.
    fn admit(state: &mut State, write: bool) -> Result<Effect> {
        let faults = state.faults.clone();
        if faults.down || (faults.unavailable > 0.0 && state.rng.random_bool(faults.unavailable)) {
            return Err(StoreError::unavailable("memory store outage (injected)"));
        }
        if write {
            state.calls.writes += 1;
            if faults.drop_reply_after_commit > 0.0 && state.rng.random_bool(faults.drop_reply_after_commit) {
                return Ok(Effect::CommitThenDropReply);
            }
            if faults.unknown_without_commit > 0.0 && state.rng.random_bool(faults.unknown_without_commit) {
                return Ok(Effect::UnknownWithoutCommit);
            }
        } else {
            state.calls.reads += 1;
        }
        Ok(Effect::Commit)
    }

    /// Runs one read-write transaction atomically under the lock.
    async fn transact<T>(
        &self,
        lock: &str,
        body: impl FnOnce(Option<&LeaseRecord>, StoreTime) -> Result<(Option<LeaseRecord>, T)>,
    ) -> Result<T> {
        checked_lock(lock)?;
        self.transact_unchecked(lock, |row, commit| {
            row.map(checked_row).transpose()?;
            body(row, commit)
        })
        .await
    }

    /// A transaction running any `body`, even one that ignores the lease
    /// rules: how the simulation's mutant stores write. Faults apply as to
    /// every transaction. A deleted row's remains are passed as a free row.
    pub async fn transact_unchecked<T>(
        &self,
        lock: &str,
        body: impl FnOnce(Option<&LeaseRecord>, StoreTime) -> Result<(Option<LeaseRecord>, T)>,
    ) -> Result<T> {
        self.delay().await;
        let outcome = {
            let mut state = self.lock();
            let effect = Self::admit(&mut state, true)?;
            if matches!(effect, Effect::UnknownWithoutCommit) {
                Err(StoreError::outcome_unknown(
                    "commit reply lost before commit (injected)",
                ))
            } else {
                let commit = StoreTime(self.clock(&state).0.max(state.last_commit + 1));
                self.expire_by_ttl(&mut state, lock, commit);
                let before = state.rows.get(lock).or_else(|| state.deleted.get(lock));
                let before_term = before.map(|r| r.term);
                let (row, value) = body(before, commit)?;
                if let Some(row) = row {
                    if before_term != Some(row.term) {
                        state.acquisitions.push(Acquisition {
                            lock: lock.to_string(),
                            term: row.term,
                            holder: row.holder.clone().unwrap_or_default(),
                            token: row.token,
                            revision: row.version.as_ref().map(|v| v.revision),
                            at: Instant::now(),
                        });
                    }
                    state.last_commit = commit.0;
                    state.rows.insert(lock.to_string(), row);
                }
                match effect {
                    Effect::CommitThenDropReply => {
                        Err(StoreError::outcome_unknown("commit reply lost after commit (injected)"))
                    }
                    _ => Ok(value),
                }
            }
        };
        self.delay().await;
        outcome
    }
}

/// A lock name the store accepts, or an invalid-input error.
fn checked_lock(lock: &str) -> Result<()> {
    validate_lock_name("lock", lock).map_err(|e| StoreError::invalid("bad lock name").caused_by(e))
}

/// A lease duration the store can keep, or an invalid-input error.
fn checked_lease(lease: Duration) -> Result<()> {
    lease_to_millis("lease duration", lease)
        .map(drop)
        .map_err(|e| StoreError::invalid("bad requested lease duration").caused_by(e))
}

/// A stored row whose lease duration is out of range is refused: read as
/// zero it would look expired and let a second leader in.
fn checked_row(row: &LeaseRecord) -> Result<&LeaseRecord> {
    lease_to_millis("stored lease duration", row.lease_duration)
        .map(|_| row)
        .map_err(|e| StoreError::invalid(format!("row {}", row.name)).caused_by(e))
}

/// The body of an acquisition: when `row` (as the transaction read it) has
/// no live holder at `commit`, the next term for `holder` with `token`. The
/// simulation's mutants call it with a stale row or a wrong token.
pub fn grant(
    lock: &str,
    claim: &Claim<'_>,
    lease: Duration,
    row: Option<&LeaseRecord>,
    commit: StoreTime,
    token: FencingToken,
) -> Result<(Option<LeaseRecord>, Grant)> {
    if let Some(current) = row.and_then(|r| r.live_holder(commit)) {
        return Err(StoreError::Lost {
            lock: lock.to_string(),
            reason: format!("held by {current}"),
        });
    }
    if let Some(reason) = row.and_then(|r| r.reservation_refuses(claim.holder, commit)) {
        return Err(StoreError::Lost {
            lock: lock.to_string(),
            reason,
        });
    }
    let ended = row.and_then(LeaseRecord::ended_by_acquire);
    next_term(lock, claim, lease, row, commit, token, ended)
}

/// The row after `claim` takes `row` at `commit` with `token`, recording
/// `ended` for the term it replaces, once the caller has judged that it
/// may: the fence is judged here.
fn next_term(
    lock: &str,
    claim: &Claim<'_>,
    lease: Duration,
    row: Option<&LeaseRecord>,
    commit: StoreTime,
    token: FencingToken,
    ended: Option<Ended>,
) -> Result<(Option<LeaseRecord>, Grant)> {
    if let Some(reason) = claim.fenced_by(row.and_then(|r| r.version.as_ref())) {
        return Err(StoreError::Lost {
            lock: lock.to_string(),
            reason,
        });
    }
    let term = row.map_or(0, |r| r.term) + 1;
    let grant = Grant {
        term,
        token,
        committed_at: commit,
    };
    let row = LeaseRecord {
        name: lock.to_string(),
        holder: Some(claim.holder.to_string()),
        term,
        token: Some(token),
        renewed_at: Some(commit),
        lease_duration: lease,
        version: claim.version.cloned(),
        reservation: None,
        ended,
    };
    Ok((Some(row), grant))
}

/// The check-and-set both renew and release rely on.
fn check_ours<'a>(
    lock: &str,
    row: Option<&'a LeaseRecord>,
    holder: &str,
    token: FencingToken,
) -> Result<&'a LeaseRecord> {
    match row {
        Some(row) if row.holder.as_deref() == Some(holder) && row.token == Some(token) => Ok(row),
        Some(row) => Err(StoreError::Lost {
            lock: lock.to_string(),
            reason: match &row.holder {
                Some(other) if other != holder => format!("held by {other}"),
                Some(_) => format!("token {token} superseded by {:?}", row.token),
                None => "released".to_string(),
            },
        }),
        None => Err(StoreError::Lost {
            lock: lock.to_string(),
            reason: "no such lease".into(),
        }),
    }
}

#[async_trait]
impl LeaseStore for MemoryStore {
    fn kind(&self) -> &'static str {
        "memory"
    }

    async fn ensure_schema(&self) -> Result<()> {
        Ok(())
    }

    async fn observe(&self, lock: &str) -> Result<Observation> {
        let mut observed = self.observe_many(&[lock.to_string()]).await?;
        Ok(observed.remove(0))
    }

    /// Every row under one hold of the state, at one reading of the clock.
    async fn observe_many(&self, locks: &[String]) -> Result<Vec<Observation>> {
        locks.iter().try_for_each(|lock| checked_lock(lock))?;
        self.delay().await;
        let observed = {
            let mut state = self.lock();
            Self::admit(&mut state, false)?;
            let now = self.clock(&state);
            locks
                .iter()
                .map(|lock| {
                    self.expire_by_ttl(&mut state, lock, now);
                    let record = state.rows.get(lock).map(checked_row).transpose()?.cloned();
                    Ok(Observation { record, now })
                })
                .collect::<Result<Vec<_>>>()?
        };
        self.delay().await;
        Ok(observed)
    }

    async fn acquire_as(&self, lock: &str, claim: &Claim<'_>, lease: Duration) -> Result<Grant> {
        checked_lease(lease)?;
        self.transact(lock, |row, commit| {
            grant(lock, claim, lease, row, commit, FencingToken(commit.0))
        })
        .await
    }

    async fn take_over(&self, lock: &str, claim: &Claim<'_>, from: Held<'_>, lease: Duration) -> Result<Grant> {
        checked_lease(lease)?;
        self.transact(lock, |row, commit| {
            let current = check_ours(lock, row, from.holder, from.token)?;
            let ended = Some(Ended {
                term: current.term,
                reason: EndReason::Restarted,
            });
            next_term(lock, claim, lease, Some(current), commit, FencingToken(commit.0), ended)
        })
        .await
    }

    async fn renew(&self, lock: &str, holder: &str, token: FencingToken, lease: Duration) -> Result<Grant> {
        checked_lease(lease)?;
        self.transact(lock, |row, commit| {
            let current = check_ours(lock, row, holder, token)?;
            let row = LeaseRecord {
                renewed_at: Some(commit),
                lease_duration: lease,
                ..current.clone()
            };
            Ok((
                Some(row),
                Grant {
                    term: current.term,
                    token,
                    committed_at: commit,
                },
            ))
        })
        .await
    }

    async fn release_for(&self, lock: &str, holder: &str, token: FencingToken, release: &Release) -> Result<()> {
        self.transact(lock, |row, commit| {
            let current = check_ours(lock, row, holder, token)?;
            Ok((
                Some(LeaseRecord {
                    holder: None,
                    reservation: (release.handoff.as_ref()).map(|h| h.reservation(commit, current.lease_duration)),
                    ended: Some(Ended {
                        term: current.term,
                        reason: release.reason,
                    }),
                    ..current.clone()
                }),
                (),
            ))
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Redis's TTL semantics against the SQL stores': after expiry (nobody
    /// took over) the SQL row still renews, the TTL key is gone, keeping the
    /// counter's term and token; both hand the next term a larger token.
    #[tokio::test(start_paused = true)]
    async fn ttl_expiry_removes_the_lease_and_keeps_the_counter() {
        let lease = Duration::from_millis(500);
        for ttl in [false, true] {
            let store = MemoryStore::new(1).with_ttl_expiry(ttl);
            let first = store.acquire("l", "a", lease).await.unwrap();
            tokio::time::sleep(lease * 2).await;
            let row = store.observe("l").await.unwrap().record.unwrap();
            let renewed = store.renew("l", "a", first.token, lease).await;
            if ttl {
                assert_eq!((row.holder, row.renewed_at), (None, None), "the key is gone");
                assert_eq!((row.term, row.token), (1, Some(first.token)), "the counter stays");
                assert!(matches!(renewed, Err(StoreError::Lost { .. })), "{renewed:?}");
                assert_eq!(store.ttl_expiries(), 1);
            } else {
                assert_eq!(row.holder.as_deref(), Some("a"), "the row stays, judged expired");
                renewed.expect("an expired row nobody took over renews");
                tokio::time::sleep(lease * 2).await;
                assert_eq!(store.ttl_expiries(), 0);
            }
            let next = store.acquire("l", "b", lease).await.unwrap();
            assert_eq!(next.term, 2);
            assert!(next.token > first.token);
        }
    }

    fn kind_and_chain(e: StoreError) -> (bool, String) {
        (matches!(e, StoreError::Invalid { .. }), e.chain())
    }

    #[tokio::test]
    async fn out_of_range_durations_and_bad_lock_names_are_refused_naming_the_field() {
        let store = MemoryStore::new(1);
        let huge = Duration::from_secs(31_557_600 * 1_000_000_000);
        let (invalid, chain) = kind_and_chain(store.acquire("l", "a", huge).await.unwrap_err());
        assert!(
            invalid && chain.contains("lease duration (31557600000000000s) must be between"),
            "{chain}"
        );
        let (invalid, chain) = kind_and_chain(store.observe("").await.unwrap_err());
        assert!(invalid && chain.contains("lock must not be empty"), "{chain}");
        assert_eq!(store.calls(), StoreCalls::default(), "refused before reaching the rows");

        let grant = store.acquire("l", "a", Duration::from_secs(10)).await.unwrap();
        let (invalid, chain) = kind_and_chain(store.renew("l", "a", grant.token, Duration::ZERO).await.unwrap_err());
        assert!(
            invalid && chain.contains("lease duration (0ns) must be between"),
            "{chain}"
        );
    }

    #[tokio::test]
    async fn a_stored_row_with_an_out_of_range_duration_is_refused_not_read_as_expired() {
        let store = MemoryStore::new(1);
        let grant = store.acquire("l", "a", Duration::from_secs(10)).await.unwrap();
        let mut row = store.observe("l").await.unwrap().record.unwrap();
        row.lease_duration = Duration::ZERO;
        store.put_row(row);
        for result in [
            store.observe("l").await.map(drop),
            store.acquire("l", "b", Duration::from_secs(10)).await.map(drop),
            store
                .renew("l", "a", grant.token, Duration::from_secs(10))
                .await
                .map(drop),
        ] {
            let (invalid, chain) = kind_and_chain(result.unwrap_err());
            assert!(
                invalid && chain.contains("stored lease duration (0ns) must be between"),
                "{chain}"
            );
        }
    }

    #[tokio::test]
    async fn a_deleted_and_recreated_row_continues_the_term_and_the_token() {
        let store = MemoryStore::new(1);
        let first = store.acquire("l", "a", Duration::from_secs(10)).await.unwrap();
        store.delete_row("l");
        assert_eq!(store.observe("l").await.unwrap().record, None);
        let second = store.acquire("l", "b", Duration::from_secs(10)).await.unwrap();
        assert_eq!(second.term, first.term + 1);
        assert!(second.token > first.token);
        let terms: Vec<_> = store
            .acquisitions()
            .iter()
            .map(|a| (a.term, a.holder.clone()))
            .collect();
        assert_eq!(terms, [(1, "a".to_string()), (2, "b".to_string())]);
    }
}
