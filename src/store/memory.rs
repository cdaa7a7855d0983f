//! An in-memory store for tests and the demo, judged by its own clock, with
//! fault injection: added latency, outages, replies dropped after commit and
//! unknown outcomes. Seeded, so a simulation replays exactly.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use rand::{RngExt, SeedableRng, rngs::StdRng};
use tokio::time::Instant;

use crate::lease::store::Result;
use crate::lease::{FencingToken, Grant, LeaseRecord, LeaseStore, Observation, StoreError, StoreTime};

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
    /// Highest commit timestamp handed out: commit timestamps strictly
    /// increase, as Spanner's do for transactions touching the same row.
    last_commit: i64,
    faults: Faults,
    rng: StdRng,
    calls: StoreCalls,
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
                last_commit: 0,
                faults: Faults::default(),
                rng: StdRng::seed_from_u64(seed),
                calls: StoreCalls::default(),
            })),
            epoch_nanos,
            started: Instant::now(),
            rate: 1.0,
        }
    }

    /// Starts the store clock at `start` instead of the wall clock, so
    /// simulations print the same tokens on every replay.
    pub fn with_clock_start(mut self, start: StoreTime) -> Self {
        self.epoch_nanos = start.0;
        self
    }

    /// Runs the store clock `rate` times as fast as the candidates' clock.
    /// The elector tolerates rates below D / R (design.md: R/D bounds drift).
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

    /// Deletes a row outright, as an operator or a person with SQL access could.
    pub fn delete_row(&self, lock: &str) {
        self.lock().rows.remove(lock);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock leaves plain data behind; keep going.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn clock(&self) -> StoreTime {
        StoreTime(self.epoch_nanos + self.started.elapsed().mul_f64(self.rate).as_nanos() as i64)
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
        self.delay().await;
        let outcome = {
            let mut state = self.lock();
            let effect = Self::admit(&mut state, true)?;
            if matches!(effect, Effect::UnknownWithoutCommit) {
                Err(StoreError::outcome_unknown(
                    "commit reply lost before commit (injected)",
                ))
            } else {
                let commit = StoreTime(self.clock().0.max(state.last_commit + 1));
                let (row, value) = body(state.rows.get(lock), commit)?;
                if let Some(row) = row {
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
        self.delay().await;
        let observation = {
            let mut state = self.lock();
            Self::admit(&mut state, false)?;
            Observation {
                record: state.rows.get(lock).cloned(),
                now: self.clock(),
            }
        };
        self.delay().await;
        Ok(observation)
    }

    async fn acquire(&self, lock: &str, holder: &str, lease: Duration) -> Result<Grant> {
        self.transact(lock, |row, commit| {
            if let Some(current) = row.and_then(|r| r.live_holder(commit)) {
                return Err(StoreError::Lost {
                    lock: lock.to_string(),
                    reason: format!("held by {current}"),
                });
            }
            let term = row.map_or(0, |r| r.term) + 1;
            let grant = Grant {
                term,
                token: FencingToken(commit.0),
                committed_at: commit,
            };
            let row = LeaseRecord {
                name: lock.to_string(),
                holder: Some(holder.to_string()),
                term,
                token: Some(grant.token),
                renewed_at: Some(commit),
                lease_duration: lease,
            };
            Ok((Some(row), grant))
        })
        .await
    }

    async fn renew(&self, lock: &str, holder: &str, token: FencingToken, lease: Duration) -> Result<Grant> {
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

    async fn release(&self, lock: &str, holder: &str, token: FencingToken) -> Result<()> {
        self.transact(lock, |row, _commit| {
            let current = check_ours(lock, row, holder, token)?;
            Ok((
                Some(LeaseRecord {
                    holder: None,
                    ..current.clone()
                }),
                (),
            ))
        })
        .await
    }
}
