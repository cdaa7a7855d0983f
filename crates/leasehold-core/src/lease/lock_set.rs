//! The library's handle on many locks: a [`Session`] renews one session row
//! every P and holds any number of locks through it.
//!
//! * `try_lock_many` takes what is free in one transaction per batch and
//!   reports the rest busy, without waiting; `lock` waits for one lock with
//!   jittered exponential backoff. A successful batch also renews the
//!   session (the store proved it live), so it moves the deadline like a
//!   renewal sent at the same instant.
//! * The held set is published on a `watch` channel with the session's
//!   deadline, `t_send + R` from the send time of the last successful
//!   renewal (the elector's rule). At the deadline the set is published
//!   empty, also while a store call of the session hangs;
//!   [`HeldSet::token_at`] also checks the deadline, so a process paused
//!   past it claims nothing when it wakes.
//! * A session makes one store call at a time: a renewal waits for a batch
//!   in flight (which renews the session itself) instead of racing it for
//!   the session row.
//! * A renewal the store refuses means the session expired (or was closed):
//!   every lock of it is gone for good, and the handle opens a new session
//!   that holds nothing. A renewal that merely failed (store unreachable) is
//!   retried; if one succeeds after the deadline, the store has just proved
//!   the session never expired, so its locks were never anyone else's and are
//!   claimed again until the new deadline.
//! * Releasing stops claiming first, then frees the rows by check-and-set;
//!   a release the store did not confirm is retried after each renewal.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tokio::time::{sleep_until, timeout_at};
use tracing::{debug, info, warn};

use super::clock::{Instant, Jitter, now};
use super::record::{FencingToken, Identity};
use super::seams::SimHooks;
use super::session::{LocksObservation, MAX_LOCKS_PER_CALL, SessionStore, new_session_id};
use super::store::{Result, StoreError};
use super::timing::Timing;

/// The locks a session holds, as published.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HeldSet {
    /// The session they are held through.
    pub session: String,
    /// Every held lock with its fencing token. Empty past the deadline.
    pub locks: BTreeMap<String, FencingToken>,
    /// When the session stops claiming unless a renewal succeeds.
    pub deadline: Option<Instant>,
}

impl HeldSet {
    /// The token of `name` if it is held and the deadline has not passed at
    /// `at`: what leader work checks before each write.
    pub fn token_at(&self, name: &str, at: Instant) -> Option<FencingToken> {
        self.deadline
            .filter(|deadline| at < *deadline)
            .and(self.locks.get(name).copied())
    }
}

/// One lock taken by [`Session::try_lock_many`] or [`Session::lock`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldLock {
    pub name: String,
    pub token: FencingToken,
}

/// What [`Session::try_lock_many`] got.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TryLocked {
    pub taken: Vec<HeldLock>,
    /// Held by another live session.
    pub busy: Vec<String>,
}

/// What the session knows, behind one mutex.
#[derive(Debug, Default)]
struct Known {
    session: String,
    deadline: Option<Instant>,
    /// The session's locks by the store's record: claimed while the
    /// deadline holds, kept through a missed deadline until the store says
    /// whether the session lived on.
    locks: BTreeMap<String, FencingToken>,
    /// Released locally, not yet confirmed freed in the store.
    unreleased: Vec<(String, FencingToken)>,
}

struct Shared {
    store: Arc<dyn SessionStore>,
    owner: Identity,
    timing: Timing,
    known: Mutex<Known>,
    held: watch::Sender<HeldSet>,
    jitter: Mutex<Jitter>,
    /// Wakes the renewal task early (a store call saw the session lost).
    wake: Notify,
    /// One store call of the session at a time: a release in flight must
    /// not free a lock that a concurrent `try_lock` just confirmed as held
    /// (both name the same session and token), and a renewal beside a batch
    /// would race it for the session row.
    serial: tokio::sync::Mutex<()>,
}

/// A session and the locks held through it. Dropping it stops renewing at
/// once, as a crash would: the locks are free for others once the session
/// expires by the store's clock. [`Session::close`] frees them at once.
pub struct Session {
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("owner", &self.shared.owner)
            .field("held", &*self.shared.held.borrow())
            .finish_non_exhaustive()
    }
}

impl Session {
    /// Opens a session for `owner` with `timing` (D is the session's lease,
    /// R its local deadline, P its renewal period) and starts renewing it.
    pub async fn open(store: Arc<dyn SessionStore>, owner: Identity, timing: Timing) -> Result<Session> {
        Self::open_with(store, owner, timing, None, SimHooks::default()).await
    }

    /// Seeds jitter and backoff, so a simulation replays exactly.
    pub async fn open_with(
        store: Arc<dyn SessionStore>,
        owner: Identity,
        timing: Timing,
        seed: Option<u64>,
        sim: SimHooks,
    ) -> Result<Session> {
        let shared = Arc::new(Shared {
            store,
            owner,
            timing,
            known: Mutex::default(),
            held: watch::channel(HeldSet::default()).0,
            jitter: Mutex::new(Jitter::new(timing.jitter, seed)),
            wake: Notify::new(),
            serial: tokio::sync::Mutex::new(()),
        });
        shared.open_new().await?;
        let task = sim.spawn(shared.clone().renew_forever());
        Ok(Session { shared, task })
    }

    /// The current session id (a new one after the session expired).
    pub fn id(&self) -> String {
        self.shared.known().session.clone()
    }

    /// The timing the session renews with.
    pub fn timing(&self) -> Timing {
        self.shared.timing
    }

    /// The held set, updated on every change and emptied at the deadline.
    pub fn held(&self) -> watch::Receiver<HeldSet> {
        self.shared.held.subscribe()
    }

    /// The token of `name` if held now.
    pub fn token(&self, name: &str) -> Option<FencingToken> {
        self.shared.held.borrow().token_at(name, now())
    }

    /// Takes every lock of `names` that is free, without waiting: one store
    /// transaction per [`MAX_LOCKS_PER_CALL`] names. A lock this session
    /// already holds is reported taken with its token, except one whose
    /// release is not yet confirmed: that is busy until the release is,
    /// since the unlock may still arrive and free it. A batch whose
    /// outcome is unknown may have taken its locks: asking again tells.
    pub async fn try_lock_many<S: AsRef<str>>(&self, names: &[S]) -> Result<TryLocked> {
        let names: Vec<String> = names.iter().map(|n| n.as_ref().to_string()).collect();
        let mut result = TryLocked::default();
        for chunk in names.chunks(MAX_LOCKS_PER_CALL) {
            let _serial = self.shared.serial.lock().await;
            let session = self.id();
            let sent = now();
            let batch = self.shared.bounded(self.shared.store.try_lock(&session, chunk)).await;
            let mut batch = match batch {
                Err(lost @ StoreError::Lost { .. }) => {
                    self.shared.wake.notify_one();
                    return Err(lost);
                }
                other => other?,
            };
            {
                let mut known = self.shared.known();
                if known.session != session {
                    // Replaced meanwhile: the old session is dead, and with
                    // it whatever this batch took.
                    return Err(super::session::session_lost(&session, "expired while locking"));
                }
                // A hold whose release is still unconfirmed is never claimed
                // again, even when the store reports it ours under the same
                // token: the unlock (or a duplicate of it) may still arrive
                // and free it by check-and-set on that very token, after
                // which another session takes the lock while we claim it. It
                // stays to be released, and is busy to the caller until the
                // release is confirmed and a new acquisition gives a new
                // token.
                let (stale, fresh): (Vec<_>, Vec<_>) = batch
                    .taken
                    .into_iter()
                    .partition(|held| known.unreleased.contains(held));
                // A new token under a name still listed is a new hold: the
                // old one was freed, and its unlock can no longer match.
                known
                    .unreleased
                    .retain(|(name, _)| !fresh.iter().any(|(taken, _)| taken == name));
                known.locks.extend(fresh.iter().cloned());
                batch.taken = fresh;
                batch.busy.extend(stale.into_iter().map(|(name, _)| name));
            }
            // The batch renewed the session too (and publishes).
            self.shared.renewed(&session, sent);
            result
                .taken
                .extend(batch.taken.into_iter().map(|(name, token)| HeldLock { name, token }));
            result.busy.extend(batch.busy);
        }
        Ok(result)
    }

    /// A strongly consistent read of `names`, made as this session's one
    /// store call at the time (on the emulator, a read beside the session's
    /// own write transaction ends that transaction) and bounded by R.
    pub async fn observe_locks(&self, names: &[String]) -> Result<LocksObservation> {
        let _serial = self.shared.serial.lock().await;
        self.shared.bounded(self.shared.store.observe_locks(names)).await
    }

    /// Waits until `name` is taken, retrying with jittered exponential
    /// backoff (P/8 up to P) while it is busy or the store fails. Only
    /// invalid input ends it with an error; wrap it in a timeout to bound it.
    pub async fn lock(&self, name: &str) -> Result<HeldLock> {
        let mut backoff = self.shared.backoff();
        loop {
            match self.try_lock_many(&[name]).await {
                Ok(got) => {
                    if let Some(held) = got.taken.into_iter().next() {
                        return Ok(held);
                    }
                }
                Err(e @ StoreError::Invalid { .. }) => return Err(e),
                Err(e) => debug!(lock = name, error = %e, "lock: retrying"),
            }
            let delay = backoff.next().unwrap_or(self.shared.timing.retry_period);
            tokio::time::sleep(delay).await;
        }
    }

    /// Stops claiming `names` at once, then frees them in the store by
    /// check-and-set. Returns the names freed now; any the store did not
    /// confirm are retried after each renewal.
    pub async fn release<S: AsRef<str>>(&self, names: &[S]) -> Result<Vec<String>> {
        let _serial = self.shared.serial.lock().await;
        let (session, locks) = {
            let mut known = self.shared.known();
            let locks: Vec<(String, FencingToken)> = names
                .iter()
                .filter_map(|n| known.locks.remove_entry(n.as_ref()))
                .collect();
            known.unreleased.extend(locks.iter().cloned());
            (known.session.clone(), locks)
        };
        self.shared.publish();
        self.shared.unlock(&session, locks).await
    }

    /// Stops claiming everything, stops renewing and deletes the session
    /// row, which frees all its locks at once. Call it after the work the
    /// locks guard has stopped.
    pub async fn close(self) -> Result<()> {
        self.task.abort();
        let _serial = self.shared.serial.lock().await;
        let session = {
            let mut known = self.shared.known();
            known.deadline = None;
            known.locks.clear();
            known.session.clone()
        };
        self.shared.publish();
        self.shared.bounded(self.shared.store.close_session(&session)).await
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Shared {
    fn known(&self) -> std::sync::MutexGuard<'_, Known> {
        self.known.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Publishes what may be claimed: the locks while the deadline holds,
    /// nothing after.
    fn publish(&self) {
        let held = {
            let known = self.known();
            let live = known.deadline.filter(|d| now() < *d);
            HeldSet {
                session: known.session.clone(),
                locks: live.map(|_| known.locks.clone()).unwrap_or_default(),
                deadline: live,
            }
        };
        self.held
            .send_if_modified(|current| std::mem::replace(current, held.clone()) != held);
    }

    fn backoff(&self) -> impl Iterator<Item = Duration> + use<> {
        let p = self.timing.retry_period;
        let seed = self.jitter.lock().unwrap_or_else(|e| e.into_inner()).seed();
        ExponentialBuilder::default()
            .with_min_delay((p / 8).max(Duration::from_millis(10)))
            .with_max_delay(p)
            .with_jitter()
            .with_jitter_seed(seed)
            .without_max_times()
            .build()
    }

    /// A store call bounded by R, so a hung store cannot stall the session;
    /// timing out is an unknown outcome.
    async fn bounded<T>(&self, call: impl Future<Output = Result<T>>) -> Result<T> {
        timeout_at(now() + self.timing.renew_deadline, call)
            .await
            .unwrap_or_else(|_| Err(StoreError::outcome_unknown("store call timed out")))
    }

    /// Opens a fresh session (a new id: ids are never reused) holding nothing.
    async fn open_new(&self) -> Result<()> {
        let nonce = self.jitter.lock().unwrap_or_else(|e| e.into_inner()).seed();
        let session = new_session_id(&self.owner, nonce);
        {
            let mut known = self.known();
            *known = Known {
                session: session.clone(),
                ..Known::default()
            };
        }
        self.publish();
        let sent = now();
        let owner = self.owner.to_string();
        self.bounded(self.store.open_session(&session, &owner, self.timing.lease_duration))
            .await?;
        self.renewed(&session, sent);
        info!(%session, "session opened");
        Ok(())
    }

    /// A successful open, renewal or batch of `session` sent at `sent`:
    /// claims until `sent + R` (never moving a later proof's deadline back),
    /// unless that has passed already. Publishes.
    fn renewed(&self, session: &str, sent: Instant) {
        let deadline = sent + self.timing.renew_deadline;
        {
            let mut known = self.known();
            if known.session == session && now() < deadline {
                known.deadline = known.deadline.max(Some(deadline));
            }
        }
        self.publish();
    }

    /// Frees `locks` of `session` in the store; the caller holds `serial`.
    async fn unlock(&self, session: &str, locks: Vec<(String, FencingToken)>) -> Result<Vec<String>> {
        let mut freed = Vec::new();
        for chunk in locks.chunks(MAX_LOCKS_PER_CALL) {
            freed.extend(self.bounded(self.store.unlock(session, chunk)).await?);
            // Freed, or no longer ours: either way nothing is left to release.
            let mut known = self.known();
            known.unreleased.retain(|l| !chunk.contains(l));
        }
        Ok(freed)
    }

    /// Awaits `call` (a store call, or the turn to make one), publishing
    /// the held set empty meanwhile if the deadline passes: a hung call must
    /// not keep the locks published past it.
    async fn publishing_deadlines<T>(&self, call: impl Future<Output = T>) -> T {
        let mut call = std::pin::pin!(call);
        loop {
            let Some(deadline) = self.known().deadline.filter(|d| *d > now()) else {
                return call.await;
            };
            tokio::select! {
                biased;
                _ = sleep_until(deadline) => self.publish(),
                done = &mut call => return done,
            }
        }
    }

    /// Renews every P (jittered) until dropped; opens a new session when
    /// the store refuses a renewal.
    async fn renew_forever(self: Arc<Self>) {
        let p = self.timing.retry_period;
        let mut next = now() + self.jitter.lock().unwrap_or_else(|e| e.into_inner()).apply(p);
        let mut errors = self.backoff();
        loop {
            // Wake at the deadline too, if it is still ahead, to publish it.
            let deadline = self.known().deadline.filter(|d| *d > now());
            // Biased: an unbiased select draws from an unseeded random
            // source, and simulations must replay exactly.
            tokio::select! {
                biased;
                _ = sleep_until(deadline.map_or(next, |d| d.min(next))) => {}
                _ = self.wake.notified() => next = now(),
            }
            // At the deadline: stop claiming (publish re-reads the clock).
            self.publish();
            if now() < next {
                continue;
            }
            // One store call of this session at a time: a batch in flight
            // renews the session itself, and a renewal beside it would race
            // it for the session row (on the emulator, a second transaction
            // on the same client's session even ends the first).
            let _serial = self.publishing_deadlines(self.serial.lock()).await;
            let session = self.known().session.clone();
            let sent = now();
            match self
                .publishing_deadlines(self.bounded(self.store.renew_session(&session)))
                .await
            {
                Ok(_) => {
                    self.renewed(&session, sent);
                    errors = self.backoff();
                    next = sent + self.jitter.lock().unwrap_or_else(|e| e.into_inner()).apply(p);
                    let unreleased = self.known().unreleased.clone();
                    if !unreleased.is_empty()
                        && let Err(e) = self.publishing_deadlines(self.unlock(&session, unreleased)).await
                    {
                        debug!(%session, error = %e, "release still unconfirmed; retrying after the next renewal");
                    }
                }
                Err(StoreError::Lost { reason, .. }) => {
                    warn!(%session, %reason, "session lost: its locks are gone; opening a new one");
                    loop {
                        match self.open_new().await {
                            Ok(()) => break,
                            Err(e) => {
                                let delay = errors.next().unwrap_or(p);
                                warn!(error = %e, ?delay, "opening a new session failed; retrying");
                                tokio::time::sleep(delay).await;
                            }
                        }
                    }
                    errors = self.backoff();
                    next = now() + self.jitter.lock().unwrap_or_else(|e| e.into_inner()).apply(p);
                }
                Err(e) => {
                    let delay = errors.next().unwrap_or(p);
                    warn!(%session, error = %e, ?delay, "session renewal failed; retrying");
                    next = now() + delay;
                }
            }
        }
    }
}
