//! The memory store's sessions and lock sets ([`SessionStore`]), with the
//! same faults as its lease rows. Write operations judge expiry at their
//! commit timestamp, which never goes backwards even when the store clock
//! is made to jump (Spanner's commit timestamps of transactions touching
//! the same rows strictly increase, too).

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use super::{Effect, MemoryStore, checked_lease};
use crate::lease::session::{
    Collected, LockBatch, LocksObservation, ObservedLock, SessionObservation, SessionRecord, SessionStore,
    session_lost, validate_lock_names, validate_session_id,
};
use crate::lease::store::Result;
use crate::lease::{FencingToken, StoreError, StoreTime};

/// A deliberate session bug, for the simulation's mutants only (hidden,
/// like the core's `lease::seams`: it plants a safety bug).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionFlaw {
    /// Renewal writes the session row whatever is there: a closed, collected
    /// or expired session comes back.
    RenewWithoutCas,
    /// Renewal checks the row exists, not that it is still live.
    RenewExpired,
    /// A lock counts as free once it is older than its holder session's
    /// lease, whatever that session's renewals say.
    TakeByLockAge,
}

/// One lock row.
#[derive(Debug, Clone)]
struct LockRow {
    /// `None` once released.
    session: Option<String>,
    token: FencingToken,
    acquired_at: StoreTime,
}

/// One lock acquisition as the store committed it, with the instant on the
/// candidates' (tokio) clock, for the simulation's checker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockAcquisition {
    pub lock: String,
    pub session: String,
    pub token: FencingToken,
    pub at: Instant,
}

#[derive(Debug, Default)]
pub struct Tables {
    sessions: HashMap<String, SessionRecord>,
    /// Sessions deleted (closed or collected): their ids are never reused.
    gone: HashMap<String, SessionRecord>,
    locks: HashMap<String, LockRow>,
    acquisitions: Vec<LockAcquisition>,
    flaw: Option<SessionFlaw>,
}

impl Tables {
    /// The session holding `row` at `now`, if it is live.
    fn live_holder(&self, row: &LockRow, now: StoreTime) -> Option<&str> {
        let holder = self.sessions.get(row.session.as_deref()?)?;
        let live = match self.flaw {
            Some(SessionFlaw::TakeByLockAge) => now <= row.acquired_at.saturating_add(holder.lease_duration),
            _ => holder.is_live_at(now),
        };
        live.then_some(holder.id.as_str())
    }

    fn live_session(&self, session: &str, now: StoreTime) -> Result<&SessionRecord> {
        match self.sessions.get(session) {
            Some(record) if record.is_live_at(now) => Ok(record),
            Some(_) => Err(session_lost(session, "expired by the store's clock")),
            None => Err(session_lost(session, "no such session (closed or collected)")),
        }
    }

    fn delete_session(&mut self, session: &str) {
        if let Some(record) = self.sessions.remove(session) {
            self.gone.insert(session.to_string(), record);
        }
    }
}

impl MemoryStore {
    /// Every lock acquisition committed so far, in commit order.
    #[doc(hidden)]
    pub fn lock_acquisitions(&self) -> Vec<LockAcquisition> {
        self.lock().sessions.acquisitions.clone()
    }

    /// Makes the session operations deliberately wrong (simulation mutants).
    #[doc(hidden)]
    pub fn set_session_flaw(&self, flaw: Option<SessionFlaw>) {
        self.lock().sessions.flaw = flaw;
    }

    /// Runs `body` atomically with the faults of every call. A write's body
    /// gets the commit timestamp (strictly increasing) and must change
    /// nothing when it fails; a read's gets the store clock.
    async fn session_call<T>(&self, write: bool, body: impl FnOnce(&mut Tables, StoreTime) -> Result<T>) -> Result<T> {
        self.delay().await;
        let outcome = {
            let mut state = self.lock();
            let effect = Self::admit(&mut state, write)?;
            if matches!(effect, Effect::UnknownWithoutCommit) {
                Err(StoreError::outcome_unknown(
                    "commit reply lost before commit (injected)",
                ))
            } else {
                let now = self.clock(&state);
                let at = if write {
                    StoreTime(now.0.max(state.last_commit + 1))
                } else {
                    now
                };
                let value = body(&mut state.sessions, at);
                if write && value.is_ok() {
                    state.last_commit = at.0;
                }
                match (effect, value) {
                    (Effect::CommitThenDropReply, Ok(_)) => {
                        Err(StoreError::outcome_unknown("commit reply lost after commit (injected)"))
                    }
                    (_, value) => value,
                }
            }
        };
        self.delay().await;
        outcome
    }
}

#[async_trait]
impl SessionStore for MemoryStore {
    async fn ensure_session_schema(&self) -> Result<()> {
        Ok(())
    }

    async fn open_session(&self, session: &str, owner: &str, lease: Duration) -> Result<StoreTime> {
        validate_session_id(session)?;
        checked_lease(lease)?;
        self.session_call(true, |tables, commit| {
            if tables.sessions.contains_key(session) || tables.gone.contains_key(session) {
                return Err(StoreError::invalid(format!(
                    "session id {session:?} was used before; ids are never reused"
                )));
            }
            let record = SessionRecord {
                id: session.to_string(),
                owner: owner.to_string(),
                renewed_at: commit,
                lease_duration: lease,
            };
            tables.sessions.insert(session.to_string(), record);
            Ok(commit)
        })
        .await
    }

    async fn renew_session(&self, session: &str) -> Result<StoreTime> {
        validate_session_id(session)?;
        self.session_call(true, |tables, commit| {
            let record = match tables.flaw {
                Some(SessionFlaw::RenewWithoutCas) => {
                    let known = tables.sessions.get(session).or_else(|| tables.gone.get(session));
                    let mut record = known.cloned().ok_or_else(|| session_lost(session, "never opened"))?;
                    record.renewed_at = commit;
                    record
                }
                Some(SessionFlaw::RenewExpired) => tables
                    .sessions
                    .get(session)
                    .cloned()
                    .ok_or_else(|| session_lost(session, "no such session"))?,
                _ => tables.live_session(session, commit)?.clone(),
            };
            tables.sessions.insert(
                session.to_string(),
                SessionRecord {
                    renewed_at: commit,
                    ..record
                },
            );
            Ok(commit)
        })
        .await
    }

    async fn close_session(&self, session: &str) -> Result<()> {
        validate_session_id(session)?;
        self.session_call(true, |tables, _commit| {
            if !tables.sessions.contains_key(session) {
                return Err(session_lost(session, "no such session (closed or collected)"));
            }
            tables.delete_session(session);
            Ok(())
        })
        .await
    }

    async fn observe_session(&self, session: &str) -> Result<SessionObservation> {
        validate_session_id(session)?;
        self.session_call(false, |tables, now| {
            Ok(SessionObservation {
                record: tables.sessions.get(session).cloned(),
                now,
            })
        })
        .await
    }

    async fn try_lock(&self, session: &str, names: &[String]) -> Result<LockBatch> {
        validate_session_id(session)?;
        validate_lock_names(names.iter().map(String::as_str))?;
        self.session_call(true, |tables, commit| {
            tables.live_session(session, commit)?;
            // Nothing fails from here on: the batch is all or nothing.
            // Proven live, the session is renewed by the same commit.
            if let Some(record) = tables.sessions.get_mut(session) {
                record.renewed_at = commit;
            }
            let mut batch = LockBatch::default();
            for name in names {
                let row = tables.locks.get(name);
                if let Some(row) = row.filter(|r| r.session.as_deref() == Some(session)) {
                    batch.taken.push((name.clone(), row.token));
                } else if row.is_some_and(|r| tables.live_holder(r, commit).is_some()) {
                    batch.busy.push(name.clone());
                } else {
                    let token = FencingToken(commit.0);
                    tables.locks.insert(
                        name.clone(),
                        LockRow {
                            session: Some(session.to_string()),
                            token,
                            acquired_at: commit,
                        },
                    );
                    tables.acquisitions.push(LockAcquisition {
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

    async fn unlock(&self, session: &str, locks: &[(String, FencingToken)]) -> Result<Vec<String>> {
        validate_session_id(session)?;
        validate_lock_names(locks.iter().map(|(name, _)| name.as_str()))?;
        self.session_call(true, |tables, _commit| {
            let mut freed = Vec::new();
            for (name, token) in locks {
                if let Some(row) = tables.locks.get_mut(name)
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

    async fn observe_locks(&self, names: &[String]) -> Result<LocksObservation> {
        validate_lock_names(names.iter().map(String::as_str))?;
        self.session_call(false, |tables, now| {
            let locks = names
                .iter()
                .map(|name| {
                    let row = tables.locks.get(name);
                    ObservedLock {
                        name: name.clone(),
                        holder: row.and_then(|r| tables.live_holder(r, now)).map(str::to_string),
                        token: row.map(|r| r.token),
                    }
                })
                .collect();
            Ok(LocksObservation { locks, now })
        })
        .await
    }

    async fn collect_garbage(&self) -> Result<Collected> {
        self.session_call(true, |tables, commit| {
            let free: Vec<String> = tables
                .locks
                .iter()
                .filter(|(_, row)| {
                    let holder = row.session.as_deref().and_then(|s| tables.sessions.get(s));
                    !holder.is_some_and(|s| s.is_live_at(commit))
                })
                .map(|(name, _)| name.clone())
                .collect();
            let expired: Vec<String> = tables
                .sessions
                .values()
                .filter(|s| !s.is_live_at(commit))
                .map(|s| s.id.clone())
                .collect();
            for name in &free {
                tables.locks.remove(name);
            }
            for session in &expired {
                tables.delete_session(session);
            }
            Ok(Collected {
                sessions: expired.len() as u64,
                locks: free.len() as u64,
            })
        })
        .await
    }
}
