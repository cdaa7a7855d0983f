//! PostgreSQL's and Redis's semantics for the sessions schedule (issue 28),
//! modelled on `src/store/postgres/session.rs` and `src/store/redis/session.rs`,
//! with the memory store's faults (outages, latency, replies lost after
//! commit, unknown outcomes, a store clock that drifts and steps) and the
//! session mutants' bugs. What both share:
//!
//! * Expiry is judged by the server's wall clock (`clock_timestamp()`,
//!   Redis's `TIME`), in microseconds, in the step that acts on it; that
//!   clock steps back and forth with the store clock's faults, unlike the
//!   memory store's commit timestamps. Session and lock rows stay until
//!   deleted: nothing vanishes by itself.
//! * A renewal stamps `max(now, renewed_at + 1 µs)`; a batch stamps
//!   `max(now, renewed_at + 1 µs, highest token read + 1 µs)`, the
//!   session's new `renewed_at` and the token of every lock it takes. A
//!   batch deletes every expired holder session it finds on a wanted lock,
//!   so that a racing renewal of it fails.
//! * Garbage collection deletes at most [`GC_BATCH`] expired sessions and
//!   [`GC_BATCH`] lock rows (released or of a dead session, and older than
//!   the clock) per transaction.
//!
//! PostgreSQL's write transactions may abort with a serialization failure
//! (SQLSTATE 40001; nothing written) and are run again with jittered
//! exponential backoff until the call timeout, then reported unavailable.
//! Redis's scripts are atomic and never retried.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use rand::{RngExt, SeedableRng, rngs::StdRng};
use tokio::time::Instant;

use leasehold_core::lease::session::{
    Collected, LockBatch, LocksObservation, ObservedLock, SessionObservation, SessionRecord, SessionStore,
    session_lost, validate_lock_names, validate_session_id,
};
use leasehold_core::lease::{FencingToken, StoreError, StoreTime};
use leasehold_core::store::memory::Faults;
use leasehold_core::store::memory::{LockAcquisition, SessionFlaw};

/// Rows one garbage collection deletes at most, per kind.
const GC_BATCH: usize = 4;

/// One microsecond, the stores' resolution, in nanoseconds.
const MICROSECOND: i64 = 1_000;

/// Which store's semantics a session schedule runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionSemantics {
    /// The memory store's: commit timestamps that never go back (as Spanner's).
    Spanner,
    Postgres,
    Redis,
}

impl SessionSemantics {
    /// Seeds take turns, in threes, so partition seeds (every third) run on each.
    pub(crate) fn of_seed(seed: u64) -> Self {
        match (seed / 3) % 3 {
            0 => SessionSemantics::Spanner,
            1 => SessionSemantics::Postgres,
            _ => SessionSemantics::Redis,
        }
    }
}

#[derive(Debug, Clone)]
struct LockRow {
    /// `None` once released.
    session: Option<String>,
    token: FencingToken,
    acquired_at: StoreTime,
}

struct State {
    /// Session rows, expired ones until deleted.
    sessions: BTreeMap<String, SessionRecord>,
    /// Every session ever opened: ids are never reused.
    opened: BTreeMap<String, SessionRecord>,
    locks: BTreeMap<String, LockRow>,
    acquisitions: Vec<LockAcquisition>,
    flaw: Option<SessionFlaw>,
    faults: Faults,
    /// Probability that a PostgreSQL write transaction aborts with 40001.
    contention: f64,
    rng: StdRng,
    clock_jumps: i64,
    serialization_failures: u64,
}

/// A PostgreSQL or Redis session store. Cheap to clone; clones share it.
#[derive(Clone)]
pub(super) struct SessionServer {
    semantics: SessionSemantics,
    state: Arc<Mutex<State>>,
    epoch: i64,
    started: Instant,
    rate: f64,
    /// How long the client retries serialization failures (PostgreSQL).
    call_timeout: Duration,
}

impl SessionServer {
    pub(super) fn new(
        semantics: SessionSemantics,
        seed: u64,
        epoch: StoreTime,
        rate: f64,
        call_timeout: Duration,
    ) -> Self {
        SessionServer {
            semantics,
            state: Arc::new(Mutex::new(State {
                sessions: BTreeMap::new(),
                opened: BTreeMap::new(),
                locks: BTreeMap::new(),
                acquisitions: Vec::new(),
                flaw: None,
                faults: Faults::default(),
                contention: 0.0,
                rng: StdRng::seed_from_u64(seed),
                clock_jumps: 0,
                serialization_failures: 0,
            })),
            epoch: epoch.0,
            started: Instant::now(),
            rate,
            call_timeout,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn semantics(&self) -> SessionSemantics {
        self.semantics
    }

    pub(crate) fn set_flaw(&self, flaw: Option<SessionFlaw>) {
        self.lock().flaw = flaw;
    }

    pub(super) fn set_faults(&self, faults: Faults) {
        self.lock().faults = faults;
    }

    /// The share of PostgreSQL write transactions that abort with 40001.
    pub(super) fn set_contention(&self, share: f64) {
        self.lock().contention = share;
    }

    pub(super) fn jump_clock(&self, nanos: i64) {
        self.lock().clock_jumps += nanos;
    }

    pub(super) fn lock_acquisitions(&self) -> Vec<LockAcquisition> {
        self.lock().acquisitions.clone()
    }

    /// Transactions aborted with a serialization failure and retried (PostgreSQL).
    pub(super) fn serialization_failures(&self) -> u64 {
        self.lock().serialization_failures
    }

    /// The server's clock in whole microseconds: wall time, drifting and
    /// stepping with the faults.
    fn clock(&self, state: &State) -> StoreTime {
        let nanos = self.epoch + state.clock_jumps + self.started.elapsed().mul_f64(self.rate).as_nanos() as i64;
        StoreTime(nanos - nanos.rem_euclid(MICROSECOND))
    }

    /// One call: the latency, the outage and loss faults, and on PostgreSQL
    /// the retries of serialization failures. `body` must change nothing
    /// when it fails.
    async fn call<T>(
        &self,
        write: bool,
        body: impl Fn(&mut State, StoreTime) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let deadline = Instant::now() + self.call_timeout;
        let mut backoff = Duration::from_millis(5);
        loop {
            let latency = self.lock().faults.latency;
            tokio::time::sleep(latency).await;
            let attempt = self.attempt(write, &body);
            tokio::time::sleep(latency).await;
            match attempt {
                Attempt::Done(outcome) => return outcome,
                Attempt::Aborted if Instant::now() + backoff < deadline => {
                    let jitter = self.lock().rng.random_range(0.5..1.5);
                    tokio::time::sleep(backoff.mul_f64(jitter)).await;
                    backoff = (backoff * 2).min(Duration::from_millis(200));
                }
                Attempt::Aborted => {
                    return Err(StoreError::unavailable(
                        "serialization failures (SQLSTATE 40001) until the call timeout; nothing written",
                    ));
                }
            }
        }
    }

    fn attempt<T>(&self, write: bool, body: &impl Fn(&mut State, StoreTime) -> Result<T, StoreError>) -> Attempt<T> {
        let mut state = self.lock();
        let faults = state.faults.clone();
        if faults.down || (faults.unavailable > 0.0 && state.rng.random_bool(faults.unavailable)) {
            return Attempt::Done(Err(StoreError::unavailable("store outage (injected)")));
        }
        if !write {
            let now = self.clock(&state);
            return Attempt::Done(body(&mut state, now));
        }
        if self.semantics == SessionSemantics::Postgres && state.contention > 0.0 {
            let contention = state.contention;
            if state.rng.random_bool(contention) {
                state.serialization_failures += 1;
                return Attempt::Aborted;
            }
        }
        if faults.unknown_without_commit > 0.0 && state.rng.random_bool(faults.unknown_without_commit) {
            return Attempt::Done(Err(StoreError::outcome_unknown("reply lost before commit (injected)")));
        }
        let drop_reply = faults.drop_reply_after_commit > 0.0 && state.rng.random_bool(faults.drop_reply_after_commit);
        let now = self.clock(&state);
        match body(&mut state, now) {
            Ok(_) if drop_reply => {
                Attempt::Done(Err(StoreError::outcome_unknown("reply lost after commit (injected)")))
            }
            outcome => Attempt::Done(outcome),
        }
    }
}

enum Attempt<T> {
    Done(Result<T, StoreError>),
    /// Aborted with a serialization failure: nothing written.
    Aborted,
}

impl State {
    /// The session holding `row` at `now`, if live.
    fn live_holder<'a>(&self, row: &'a LockRow, now: StoreTime) -> Option<&'a str> {
        let session = row.session.as_deref()?;
        let live = match self.flaw {
            Some(SessionFlaw::TakeByLockAge) => self
                .opened
                .get(session)
                .is_some_and(|s| now <= row.acquired_at.saturating_add(s.lease_duration)),
            _ => self.sessions.get(session).is_some_and(|s| s.is_live_at(now)),
        };
        live.then_some(session)
    }

    fn live_session(&self, session: &str, now: StoreTime) -> Result<&SessionRecord, StoreError> {
        match self.sessions.get(session) {
            Some(record) if record.is_live_at(now) => Ok(record),
            Some(_) => Err(session_lost(session, "expired by the store's clock")),
            None => Err(session_lost(session, "no such session (closed or collected)")),
        }
    }
}

/// `at` plus one microsecond.
fn after(at: StoreTime) -> StoreTime {
    StoreTime(at.0 + MICROSECOND)
}

#[async_trait]
impl SessionStore for SessionServer {
    async fn ensure_session_schema(&self) -> Result<(), StoreError> {
        Ok(())
    }

    async fn open_session(&self, session: &str, owner: &str, lease: Duration) -> Result<StoreTime, StoreError> {
        validate_session_id(session)?;
        self.call(true, |state, now| {
            if state.opened.contains_key(session) {
                return Err(StoreError::invalid(format!(
                    "session id {session:?} was used before; ids are never reused"
                )));
            }
            let record = SessionRecord {
                id: session.to_string(),
                owner: owner.to_string(),
                renewed_at: now,
                lease_duration: lease,
            };
            state.sessions.insert(session.to_string(), record.clone());
            state.opened.insert(session.to_string(), record);
            Ok(now)
        })
        .await
    }

    async fn renew_session(&self, session: &str) -> Result<StoreTime, StoreError> {
        validate_session_id(session)?;
        self.call(true, |state, now| {
            let record = match state.flaw {
                // Writes the row back whatever is there (an upsert).
                Some(SessionFlaw::RenewWithoutCas) => state
                    .opened
                    .get(session)
                    .cloned()
                    .ok_or_else(|| session_lost(session, "never opened"))?,
                // Checks that the row exists, not that it is live.
                Some(SessionFlaw::RenewExpired) => state
                    .sessions
                    .get(session)
                    .cloned()
                    .ok_or_else(|| session_lost(session, "no such session"))?,
                _ => state.live_session(session, now)?.clone(),
            };
            let renewed_at = now.max(after(record.renewed_at));
            state
                .sessions
                .insert(session.to_string(), SessionRecord { renewed_at, ..record });
            Ok(renewed_at)
        })
        .await
    }

    async fn close_session(&self, session: &str) -> Result<(), StoreError> {
        validate_session_id(session)?;
        self.call(true, |state, _now| match state.sessions.remove(session) {
            Some(_) => Ok(()),
            None => Err(session_lost(session, "no such session (closed or collected)")),
        })
        .await
    }

    async fn observe_session(&self, session: &str) -> Result<SessionObservation, StoreError> {
        validate_session_id(session)?;
        self.call(false, |state, now| {
            Ok(SessionObservation {
                record: state.sessions.get(session).cloned(),
                now,
            })
        })
        .await
    }

    async fn try_lock(&self, session: &str, names: &[String]) -> Result<LockBatch, StoreError> {
        validate_session_id(session)?;
        validate_lock_names(names.iter().map(String::as_str))?;
        self.call(true, |state, now| {
            let renewed_at = state.live_session(session, now)?.renewed_at;
            let highest = names
                .iter()
                .filter_map(|name| state.locks.get(name).map(|r| StoreTime(r.token.0)))
                .max();
            let stamp = now.max(after(renewed_at)).max(highest.map_or(now, after));
            if let Some(record) = state.sessions.get_mut(session) {
                record.renewed_at = stamp;
            }
            let mut batch = LockBatch::default();
            for name in names {
                let row = state.locks.get(name);
                if let Some(row) = row.filter(|r| r.session.as_deref() == Some(session)) {
                    batch.taken.push((name.clone(), row.token));
                } else if row.is_some_and(|r| state.live_holder(r, now).is_some()) {
                    batch.busy.push(name.clone());
                } else {
                    if let Some(holder) = row.and_then(|r| r.session.clone()) {
                        state.sessions.remove(&holder);
                    }
                    let token = FencingToken(stamp.0);
                    state.locks.insert(
                        name.clone(),
                        LockRow {
                            session: Some(session.to_string()),
                            token,
                            acquired_at: stamp,
                        },
                    );
                    state.acquisitions.push(LockAcquisition {
                        lock: name.clone(),
                        session: session.to_string(),
                        token,
                        at: Instant::now(),
                    });
                    batch.taken.push((name.clone(), token));
                }
            }
            Ok(batch)
        })
        .await
    }

    async fn unlock(&self, session: &str, locks: &[(String, FencingToken)]) -> Result<Vec<String>, StoreError> {
        validate_session_id(session)?;
        validate_lock_names(locks.iter().map(|(name, _)| name.as_str()))?;
        self.call(true, |state, _now| {
            let mut freed = Vec::new();
            for (name, token) in locks {
                if let Some(row) = state.locks.get_mut(name)
                    && row.session.as_deref() == Some(session)
                    && row.token == *token
                {
                    row.session = None;
                    freed.push(name.clone());
                }
            }
            Ok(freed)
        })
        .await
    }

    async fn observe_locks(&self, names: &[String]) -> Result<LocksObservation, StoreError> {
        validate_lock_names(names.iter().map(String::as_str))?;
        self.call(false, |state, now| {
            let locks = names
                .iter()
                .map(|name| {
                    let row = state.locks.get(name);
                    ObservedLock {
                        name: name.clone(),
                        holder: row.and_then(|r| state.live_holder(r, now)).map(str::to_string),
                        token: row.map(|r| r.token),
                    }
                })
                .collect();
            Ok(LocksObservation { locks, now })
        })
        .await
    }

    async fn collect_garbage(&self) -> Result<Collected, StoreError> {
        self.call(true, |state, now| {
            let dead: Vec<String> = state
                .sessions
                .values()
                .filter(|s| !s.is_live_at(now))
                .map(|s| s.id.clone())
                .take(GC_BATCH)
                .collect();
            for id in &dead {
                state.sessions.remove(id);
            }
            let free: Vec<String> = state
                .locks
                .iter()
                .filter(|(_, row)| {
                    let holder = row.session.as_deref().and_then(|s| state.sessions.get(s));
                    row.token.0 < now.0 && !holder.is_some_and(|s| s.is_live_at(now))
                })
                .map(|(name, _)| name.clone())
                .take(GC_BATCH)
                .collect();
            for name in &free {
                state.locks.remove(name);
            }
            Ok(Collected {
                sessions: dead.len() as u64,
                locks: free.len() as u64,
            })
        })
        .await
    }
}
