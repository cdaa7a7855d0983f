//! The Kubernetes store's semantics (`crates/leasehold-kubernetes/src/store.rs`) for the
//! elector schedule (`leasehold simulate --kubernetes`): a simulated API
//! server holding the lock's Lease, and each candidate's client, modelled
//! step by step on `KubernetesStore`:
//!
//! * every write is check-and-set on the `resourceVersion` it was judged on
//!   (a replace), or a create of an absent Lease; 409 Conflict (or 404 for a
//!   replace of a deleted Lease) is lost, with a fresh read for the next try;
//! * a call without an answer within the call timeout is an unknown outcome
//!   (a write) or unavailable (a read), and the request still lands later;
//! * expiry by observed change: the Lease is expired for a candidate once
//!   the `resourceVersion` it holds has stood unchanged for D on *that
//!   candidate's* monotonic clock since it first saw it;
//! * the token is the `resourceVersion` the write was judged on; the record
//!   (holder, term, token, lease, version) is kept in an annotation;
//! * a create grants no token: the created Lease's own `resourceVersion` is
//!   written as its token by a check-and-set, and that write grants. This is
//!   where the model departs from the store, which takes a consistent
//!   list's `resourceVersion` for a create: a create landing after another
//!   create and a deletion then repeats a token (mutant
//!   `create-token-from-list`);
//! * followers answer from a watch, which lags: the API server's watch cache
//!   behind etcd, and the link's latency;
//! * the Lease is deleted and created again, by hand.
//!
//! Every candidate's clock runs at its own rate; wall clocks are skewed and
//! step, which only the `renewTime` mutant reads.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use rand::{RngExt, SeedableRng, rngs::StdRng};
use tokio::time::Instant;
use tokio_util::task::AbortOnDropHandle;

use super::link::Link;
use super::mutants::Mutant;
use super::pause::Pause;
use super::signal::Signal;
use leasehold_core::lease::{
    Claim, Ended, FencingToken, Grant, LeaseRecord, LeaseStore, Observation, Release, Reservation, StoreError,
    StoreTime, Version,
};
use leasehold_core::store::memory::Acquisition;
use leasehold_core::store::memory::Faults;

/// Wall time at the schedule's start, in nanoseconds (as the memory store's clock).
const EPOCH: i64 = 1_700_000_000_000_000_000;

/// The record annotation of the Lease (`leasehold.dev/record`).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Record {
    holder: Option<String>,
    term: u64,
    /// `None` while a create waits for its token (see [`KubeClient::acquire_as`]).
    token: Option<i64>,
    lease: Duration,
    version: Option<Version>,
    /// A transfer's reservation: the pod UID and its window, lasting from
    /// when each candidate first saw the releasing version.
    reserved: Option<(String, Duration)>,
    /// The last end a write recorded (`LeaseRecord::ended`).
    ended: Option<Ended>,
}

/// The Lease as the API server stores it.
#[derive(Debug, Clone)]
struct LeaseObject {
    resource_version: u64,
    holder_identity: Option<String>,
    /// `leaseDurationSeconds`: D rounded up.
    lease_duration_seconds: u64,
    /// `renewTime`, from the writer's wall clock: for people, never read
    /// except by the mutant that judges expiry by it.
    renew_time: StoreTime,
    lease_transitions: u64,
    record: Option<Record>,
}

/// One change of the Lease, as a watch replays it.
#[derive(Debug, Clone)]
struct Change {
    resource_version: u64,
    /// `None`: deleted.
    object: Option<LeaseObject>,
    at: Instant,
}

/// What a client asks the API server.
#[derive(Debug, Clone)]
enum Request {
    /// A consistent GET.
    Get,
    /// A consistent LIST by name: the Lease if any, and the list's resourceVersion.
    List,
    Create {
        body: LeaseObject,
        acquisition: bool,
    },
    /// PUT; `precondition` is the body's `resourceVersion` (`None`: none sent).
    Replace {
        body: LeaseObject,
        precondition: Option<u64>,
        acquisition: bool,
    },
}

#[derive(Debug, Clone)]
enum Reply {
    Found(Option<LeaseObject>),
    Listed(Option<LeaseObject>, u64),
    Written(LeaseObject),
    /// 409: the precondition failed, or a create found the Lease.
    Conflict,
    /// 404: a replace of an absent Lease.
    NotFound,
}

impl Reply {
    /// Whether the request took effect.
    fn is_written(&self) -> bool {
        matches!(self, Reply::Written(_))
    }
}

struct ServerState {
    lock: String,
    object: Option<LeaseObject>,
    /// etcd's revision: every write and every delete takes the next one.
    revision: u64,
    history: Vec<Change>,
    /// When the Lease was last written, for telling a deletion under a live lease.
    written_at: Option<Instant>,
    faults: Faults,
    /// How far the watch cache lags behind etcd.
    watch_lag: Duration,
    rng: StdRng,
    /// Every write that began a term, in commit order: the acquisitions
    /// (with their token), and creates, whose term is granted only by the
    /// check-and-set after them (no token; a created Lease shows its holder
    /// and term meanwhile).
    claims: Vec<Acquisition>,
    stale_conflicts: u64,
    recreated: u64,
    deleted: bool,
}

/// The simulated API server. Cheap to clone; clones share the Lease.
#[derive(Clone)]
pub(super) struct ApiServer {
    state: Arc<Mutex<ServerState>>,
    /// The length of the history: watches wait on it.
    changes: Arc<Signal<usize>>,
}

/// What a deletion by hand removed.
pub(super) struct Deleted {
    /// The term and token of a lease whose holder may still believe it
    /// leads (written less than D ago, not released).
    pub live: Option<(u64, FencingToken)>,
}

impl ApiServer {
    pub(super) fn new(seed: u64, lock: &str) -> Self {
        ApiServer {
            state: Arc::new(Mutex::new(ServerState {
                lock: lock.to_string(),
                object: None,
                revision: 1_000,
                history: Vec::new(),
                written_at: None,
                faults: Faults::default(),
                watch_lag: Duration::ZERO,
                rng: StdRng::seed_from_u64(seed),
                claims: Vec::new(),
                stale_conflicts: 0,
                recreated: 0,
                deleted: false,
            })),
            changes: Arc::new(Signal::new(0)),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ServerState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn set_faults(&self, faults: Faults) {
        self.lock().faults = faults;
    }

    pub(super) fn set_watch_lag(&self, lag: Duration) {
        self.lock().watch_lag = lag;
    }

    pub(super) fn acquisitions(&self) -> Vec<Acquisition> {
        let state = self.lock();
        state.claims.iter().filter(|c| c.token.is_some()).cloned().collect()
    }

    /// Every write that began a term (see [`ServerState::claims`]).
    pub(super) fn claims(&self) -> Vec<Acquisition> {
        self.lock().claims.clone()
    }

    /// Writes refused (409) because the writer judged on a version that was
    /// no longer current, and Leases created again after a deletion.
    pub(super) fn stats(&self) -> (u64, u64) {
        let state = self.lock();
        (state.stale_conflicts, state.recreated)
    }

    /// The Lease as stored, read as the operator reads it (a consistent GET),
    /// without the injected faults or a link, so the schedule's own draws
    /// are as without the reader; its times judged on `clock` from the last
    /// write.
    pub(super) fn peek(&self, lock: &str, clock: &CandidateClock) -> Observation {
        let state = self.lock();
        let seen = match (&state.object, state.written_at) {
            (Some(object), Some(at)) => Seen::Present {
                object: Box::new(object.clone()),
                version: object.resource_version,
                at,
            },
            _ => Seen::Absent { after: state.revision },
        };
        drop(state);
        Observation {
            record: record_of(lock, &seen, clock, None),
            now: clock.store_time(Instant::now()),
        }
    }

    /// Deletes the Lease, as `kubectl delete lease` would; `lease` is D.
    pub(super) fn delete(&self, lease: Duration) -> Option<Deleted> {
        let mut state = self.lock();
        let object = state.object.take()?;
        state.revision += 1;
        let resource_version = state.revision;
        state.history.push(Change {
            resource_version,
            object: None,
            at: Instant::now(),
        });
        state.deleted = true;
        let recent = state.written_at.is_some_and(|at| at.elapsed() <= lease);
        let live = object
            .record
            .filter(|r| recent && r.holder.is_some() && object.holder_identity.is_some())
            .and_then(|r| Some((r.term, FencingToken(r.token?))));
        let len = state.history.len();
        drop(state);
        self.changes.set(len);
        Some(Deleted { live })
    }

    /// Serves one request with the injected faults, atomically.
    async fn handle(&self, request: Request) -> Result<Reply, StoreError> {
        let write = matches!(request, Request::Create { .. } | Request::Replace { .. });
        let latency = self.lock().faults.latency;
        tokio::time::sleep(latency).await;
        let outcome = self.serve(write, request);
        tokio::time::sleep(latency).await;
        outcome
    }

    fn serve(&self, write: bool, request: Request) -> Result<Reply, StoreError> {
        let mut state = self.lock();
        let faults = state.faults.clone();
        if faults.down || (faults.unavailable > 0.0 && state.rng.random_bool(faults.unavailable)) {
            return Err(StoreError::unavailable("API server unavailable (injected)"));
        }
        let drop_reply =
            write && faults.drop_reply_after_commit > 0.0 && state.rng.random_bool(faults.drop_reply_after_commit);
        if write && faults.unknown_without_commit > 0.0 && state.rng.random_bool(faults.unknown_without_commit) {
            return Err(StoreError::outcome_unknown(
                "API server timeout before etcd committed (injected)",
            ));
        }
        let reply = match request {
            Request::Get => Reply::Found(state.object.clone()),
            Request::List => Reply::Listed(state.object.clone(), state.revision),
            Request::Create { .. } if state.object.is_some() => Reply::Conflict,
            Request::Create { body, acquisition } => {
                if state.deleted {
                    state.deleted = false;
                    state.recreated += 1;
                }
                self.commit(&mut state, body, acquisition, true)
            }
            Request::Replace {
                body,
                precondition,
                acquisition,
            } => match state.object.as_ref().map(|o| o.resource_version) {
                None => Reply::NotFound,
                Some(current) if precondition.is_some_and(|v| v != current) => {
                    state.stale_conflicts += 1;
                    Reply::Conflict
                }
                Some(_) => self.commit(&mut state, body, acquisition, false),
            },
        };
        if drop_reply && matches!(reply, Reply::Written(_)) {
            return Err(StoreError::outcome_unknown(
                "reply lost after etcd committed (injected)",
            ));
        }
        Ok(reply)
    }

    /// Stores `body` at the next revision; records an acquisition, and a
    /// create's claim.
    fn commit(&self, state: &mut ServerState, mut body: LeaseObject, acquisition: bool, create: bool) -> Reply {
        state.revision += 1;
        body.resource_version = state.revision;
        if (acquisition || create)
            && let Some(record) = &body.record
        {
            state.claims.push(Acquisition {
                lock: state.lock.clone(),
                term: record.term,
                holder: record.holder.clone().unwrap_or_default(),
                token: record.token.map(FencingToken).filter(|_| acquisition),
                revision: record.version.as_ref().map(|v| v.revision),
                at: Instant::now(),
            });
        }
        state.object = Some(body.clone());
        state.written_at = Some(Instant::now());
        state.history.push(Change {
            resource_version: body.resource_version,
            object: Some(body.clone()),
            at: Instant::now(),
        });
        self.changes.set(state.history.len());
        Reply::Written(body)
    }
}

/// A candidate's clocks: its monotonic clock runs at `rate` (within the
/// bound the store's safety rests on, unless the setup says otherwise); its
/// wall clock is skewed and steps.
pub(super) struct CandidateClock {
    rate: f64,
    origin: Instant,
    wall_skew: AtomicI64,
}

impl CandidateClock {
    pub(super) fn new(rate: f64, origin: Instant, wall_skew: i64) -> Self {
        CandidateClock {
            rate,
            origin,
            wall_skew: AtomicI64::new(wall_skew),
        }
    }

    /// An NTP step of the wall clock.
    pub(super) fn step(&self, nanos: i64) {
        self.wall_skew.fetch_add(nanos, Ordering::Relaxed);
    }

    /// The monotonic clock at `at`, as time since the start.
    fn monotonic(&self, at: Instant) -> Duration {
        at.saturating_duration_since(self.origin).mul_f64(self.rate)
    }

    /// The monotonic clock at `at` shown as wall time, as the store's
    /// [`Observation::now`] is.
    fn store_time(&self, at: Instant) -> StoreTime {
        StoreTime(EPOCH + self.monotonic(at).as_nanos() as i64)
    }

    fn wall_now(&self) -> StoreTime {
        StoreTime(EPOCH + self.wall_skew.load(Ordering::Relaxed) + self.monotonic(Instant::now()).as_nanos() as i64)
    }
}

/// What this candidate has seen of the Lease (`KubernetesStore`'s `Seen`).
#[derive(Debug, Clone)]
enum Seen {
    Unknown,
    Absent {
        after: u64,
    },
    /// `at`: when this candidate first saw `version` (client-go's observedTime).
    Present {
        object: Box<LeaseObject>,
        version: u64,
        at: Instant,
    },
}

impl Seen {
    fn version(&self) -> Option<u64> {
        match self {
            Seen::Unknown => None,
            Seen::Absent { after } => Some(*after),
            Seen::Present { version, .. } => Some(*version),
        }
    }
}

/// The candidate's view of the Lease, shared by its calls and its watch.
struct View {
    seen: Mutex<Seen>,
    changes: Signal<u64>,
}

impl View {
    /// A newer view is taken; an older one dropped; a version seen before keeps its time.
    fn learn(&self, object: Option<LeaseObject>, at: Instant) -> Seen {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let known = seen.version();
        let next = match object {
            Some(object) => {
                let version = object.resource_version;
                if known.is_some_and(|k| k >= version) {
                    return seen.clone();
                }
                Seen::Present {
                    object: Box::new(object),
                    version,
                    at,
                }
            }
            None => Seen::Absent {
                after: known.unwrap_or(0),
            },
        };
        *seen = next.clone();
        drop(seen);
        self.changes.modify(|n| *n += 1);
        next
    }

    fn deleted(&self, version: u64) {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        if seen.version().is_none_or(|k| k < version) {
            *seen = Seen::Absent { after: version };
            drop(seen);
            self.changes.modify(|n| *n += 1);
        }
    }

    fn current(&self) -> Seen {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// The record a [`Seen`] stands for, its times judged on `clock`.
fn record_of(lock: &str, seen: &Seen, clock: &CandidateClock, mutant: Option<Mutant>) -> Option<LeaseRecord> {
    let Seen::Present { object, at, .. } = seen else {
        return None;
    };
    let holder = object.holder_identity.clone();
    let record = object.record.as_ref();
    let ours = record.filter(|r| r.holder == holder);
    let lease_duration = match (ours, &holder) {
        (Some(r), _) => r.lease,
        (None, Some(_)) => Duration::from_secs(object.lease_duration_seconds),
        (None, None) => record.map_or(Duration::ZERO, |r| r.lease),
    };
    // The mutant reads renewTime, the holder's wall clock at its write.
    let renewed_at = match mutant {
        Some(Mutant::ExpiryFromRenewTime) => object.renew_time,
        _ => clock.store_time(*at),
    };
    let reservation = ours
        .and_then(|r| r.reserved.clone())
        .map(|(pod_uid, window)| Reservation {
            pod_uid,
            until: clock.store_time(*at).saturating_add(window),
        });
    Some(LeaseRecord {
        name: lock.to_string(),
        reservation,
        ended: record.and_then(|r| r.ended),
        renewed_at: holder.as_ref().map(|_| renewed_at),
        token: ours.and_then(|r| r.token).map(FencingToken),
        version: ours.and_then(|r| r.version.clone()),
        holder,
        term: record.map_or(object.lease_transitions, |r| r.term),
        lease_duration,
    })
}

/// One candidate's `KubernetesStore`, over its faulty link.
pub(super) struct KubeClient {
    link: Link<ApiServer>,
    view: Arc<View>,
    clock: Arc<CandidateClock>,
    call_timeout: Duration,
    mutant: Option<Mutant>,
    /// The candidate's process: its watch stops while it is paused.
    pause: Pause,
    watching: Mutex<Option<AbortOnDropHandle<()>>>,
}

fn lost(lock: &str, reason: &str) -> StoreError {
    StoreError::Lost {
        lock: lock.to_string(),
        reason: reason.to_string(),
    }
}

impl KubeClient {
    pub(super) fn new(
        link: Link<ApiServer>,
        clock: Arc<CandidateClock>,
        call_timeout: Duration,
        mutant: Option<Mutant>,
        pause: Pause,
    ) -> Self {
        KubeClient {
            link,
            view: Arc::new(View {
                seen: Mutex::new(Seen::Unknown),
                changes: Signal::new(0),
            }),
            clock,
            call_timeout,
            mutant,
            pause,
            watching: Mutex::new(None),
        }
    }

    /// One API call over the link, abandoned after the call timeout (the
    /// request goes on and may still land).
    async fn call(&self, request: Request) -> Result<Reply, StoreError> {
        let write = matches!(request, Request::Create { .. } | Request::Replace { .. });
        let sent = self
            .link
            .send_judged(write, Reply::is_written, move |server: ApiServer| {
                let request = request.clone();
                Box::pin(async move { server.handle(request).await })
            });
        match tokio::time::timeout(self.call_timeout, sent).await {
            Ok(reply) => reply,
            Err(_) if write => Err(StoreError::outcome_unknown("no answer within the call timeout")),
            Err(_) => Err(StoreError::unavailable("no answer within the call timeout")),
        }
    }

    /// A consistent read, learned.
    async fn read(&self) -> Result<Seen, StoreError> {
        match self.call(Request::Get).await? {
            Reply::Found(object) => Ok(self.view.learn(object, Instant::now())),
            other => Err(StoreError::unavailable(format!("unexpected reply {other:?}"))),
        }
    }

    /// The record a [`Seen`] stands for.
    fn record(&self, lock: &str, seen: &Seen) -> Option<LeaseRecord> {
        record_of(lock, seen, &self.clock, self.mutant)
    }

    fn observation(&self, lock: &str, seen: &Seen) -> Observation {
        let now = match self.mutant {
            Some(Mutant::ExpiryFromRenewTime) => self.clock.wall_now(),
            _ => self.clock.store_time(Instant::now()),
        };
        Observation {
            record: self.record(lock, seen),
            now,
        }
    }

    /// Starts the watch unless it runs: a list, then every change in order,
    /// each delivered after the watch cache's lag and the link's latency.
    fn follow(&self) {
        let mut watching = self.watching.lock().unwrap_or_else(|e| e.into_inner());
        if watching.is_some() {
            return;
        }
        let (server, view, link) = (
            self.link.store().clone(),
            Arc::downgrade(&self.view),
            self.link.faults(),
        );
        let task = async move {
            let mut next = {
                let state = server.lock();
                if let Some(view) = view.upgrade() {
                    view.learn(state.object.clone(), Instant::now());
                }
                state.history.len()
            };
            let mut delivered = Instant::now();
            loop {
                server.changes.wait_for(|len| *len > next).await;
                let (change, lag) = {
                    let state = server.lock();
                    (state.history[next].clone(), state.watch_lag)
                };
                next += 1;
                delivered = delivered.max(change.at + lag + link.lock().unwrap().from_store);
                tokio::time::sleep_until(delivered).await;
                let Some(view) = view.upgrade() else { return };
                match change.object {
                    Some(object) => {
                        view.learn(Some(object), Instant::now());
                    }
                    None => view.deleted(change.resource_version),
                }
            }
        };
        *watching = Some(AbortOnDropHandle::new(tokio::spawn(self.pause.clone().pausable(task))));
    }

    /// The Lease to write: `base` with the record, holder and stamps given.
    fn body(
        &self,
        base: Option<&LeaseObject>,
        holder: Option<String>,
        record: Record,
        lease: Duration,
        transitions: u64,
    ) -> LeaseObject {
        LeaseObject {
            resource_version: base.map_or(0, |b| b.resource_version),
            holder_identity: holder,
            lease_duration_seconds: lease.as_millis().div_ceil(1000) as u64,
            renew_time: self.clock.wall_now(),
            lease_transitions: transitions,
            record: Some(record),
        }
    }

    /// Replaces the Lease by check-and-set on the body's version (the mutant
    /// sends none); the written Lease is learned.
    async fn replace(
        &self,
        lock: &str,
        body: LeaseObject,
        acquisition: bool,
    ) -> Result<(LeaseObject, Instant), StoreError> {
        let precondition = match self.mutant {
            Some(Mutant::WriteWithoutResourceVersion) => None,
            _ => Some(body.resource_version),
        };
        match self
            .call(Request::Replace {
                body,
                precondition,
                acquisition,
            })
            .await?
        {
            Reply::Written(written) => {
                let at = Instant::now();
                self.view.learn(Some(written.clone()), at);
                Ok((written, at))
            }
            Reply::Conflict | Reply::NotFound => {
                let _ = self.read().await;
                Err(lost(lock, "another writer changed the Lease first (409 Conflict)"))
            }
            other => Err(StoreError::unavailable(format!("unexpected reply {other:?}"))),
        }
    }

    /// The current Lease when `holder` holds it with `token`, read afresh
    /// when the view says otherwise.
    async fn ours(&self, lock: &str, holder: &str, token: FencingToken) -> Result<LeaseObject, StoreError> {
        let mut seen = self.view.current();
        for fresh in [false, true] {
            if fresh {
                seen = self.read().await?;
            }
            let record = self.record(lock, &seen);
            let reason = match (&seen, &record) {
                (Seen::Present { object, .. }, Some(r))
                    if r.holder.as_deref() == Some(holder) && r.token == Some(token) =>
                {
                    return Ok(LeaseObject::clone(object));
                }
                (_, Some(r)) => match &r.holder {
                    Some(other) if other != holder => format!("held by {other}"),
                    Some(_) => format!("token {token} superseded by {:?}", r.token),
                    None => "released".to_string(),
                },
                (_, None) => "no such lease".to_string(),
            };
            if fresh {
                return Err(lost(lock, &reason));
            }
        }
        unreachable!("the second pass returns")
    }

    /// A check-and-set write of our own Lease, once more from a fresh read
    /// after a conflict.
    async fn rewrite(
        &self,
        lock: &str,
        holder: &str,
        token: FencingToken,
        change: impl Fn(&LeaseObject) -> Result<LeaseObject, StoreError>,
    ) -> Result<(LeaseObject, Instant), StoreError> {
        let mut attempt = 0;
        loop {
            let current = self.ours(lock, holder, token).await?;
            match self.replace(lock, change(&current)?, false).await {
                Err(StoreError::Lost { .. }) if attempt == 0 => attempt += 1,
                other => return other,
            }
        }
    }

    /// Whether the lease `row` (as seen) still runs: by observed change on
    /// this candidate's monotonic clock; the mutant compares `renewTime`
    /// with its own wall clock.
    fn still_held(&self, row: &LeaseRecord, seen: &Seen) -> bool {
        let Seen::Present { object, at, .. } = seen else {
            return false;
        };
        match self.mutant {
            Some(Mutant::ExpiryFromRenewTime) => {
                let lease = Duration::from_secs(object.lease_duration_seconds);
                self.clock.wall_now() <= object.renew_time.saturating_add(lease)
            }
            _ => {
                let now = self.clock.monotonic(Instant::now());
                now.saturating_sub(self.clock.monotonic(*at)) <= row.lease_duration
            }
        }
    }
}

#[async_trait]
impl LeaseStore for KubeClient {
    fn kind(&self) -> &'static str {
        "simulated kubernetes"
    }

    async fn ensure_schema(&self) -> Result<(), StoreError> {
        Ok(())
    }

    async fn observe(&self, lock: &str) -> Result<Observation, StoreError> {
        let seen = self.read().await?;
        Ok(self.observation(lock, &seen))
    }

    async fn observe_followed(&self, lock: &str) -> Result<Observation, StoreError> {
        self.follow();
        match self.view.current() {
            Seen::Unknown => self.observe(lock).await,
            seen => Ok(self.observation(lock, &seen)),
        }
    }

    async fn changed(&self, lock: &str, seen: &Observation) {
        self.follow();
        loop {
            // The count before the look, so a change after it ends the wait.
            let count = self.view.changes.get();
            if self.record(lock, &self.view.current()) != seen.record {
                return;
            }
            self.view.changes.wait_for(|n| *n != count).await;
        }
    }

    async fn acquire_as(&self, lock: &str, claim: &Claim<'_>, lease: Duration) -> Result<Grant, StoreError> {
        let seen = match self.view.current() {
            Seen::Unknown => self.read().await?,
            seen => seen,
        };
        let current = self.record(lock, &seen);
        if let Some(row) = &current
            && let Some(holder) = &row.holder
            && self.still_held(row, &seen)
        {
            return Err(lost(lock, &format!("held by {holder}")));
        }
        if let Some(why) = claim.fenced_by(current.as_ref().and_then(|r| r.version.as_ref())) {
            return Err(lost(lock, &why));
        }
        let judged_at = self.clock.store_time(Instant::now());
        if let Some(why) = current
            .as_ref()
            .and_then(|r| r.reservation_refuses(claim.holder, judged_at))
        {
            return Err(lost(lock, &why));
        }
        let term = current.as_ref().map_or(0, |r| r.term) + 1;
        let (base, version) = match &seen {
            Seen::Present { object, version, .. } => (Some(LeaseObject::clone(object)), *version),
            // Absent: the token is the version of a consistent list.
            _ => match self.call(Request::List).await? {
                Reply::Listed(Some(found), _) => {
                    self.view.learn(Some(found), Instant::now());
                    return Err(lost(lock, "the Lease appeared since it was read"));
                }
                Reply::Listed(None, version) => (None, version),
                other => return Err(StoreError::unavailable(format!("unexpected reply {other:?}"))),
            },
        };
        let transitions = base.as_ref().map_or(0, |b| b.lease_transitions + 1);
        let token_of = |version: u64| match self.mutant {
            Some(Mutant::TokenFromLeaseTransitions) => transitions as i64,
            _ => version as i64,
        };
        let record = Record {
            holder: Some(claim.holder.to_string()),
            term,
            token: None,
            lease,
            version: claim.version.cloned(),
            reserved: None,
            ended: current.as_ref().and_then(LeaseRecord::ended_by_acquire),
        };
        let holder = Some(claim.holder.to_string());
        let (token, at) = match base {
            Some(base) => {
                let token = token_of(version);
                let record = Record {
                    token: Some(token),
                    ..record
                };
                let body = self.body(Some(&base), holder, record, lease, transitions);
                (token, self.replace(lock, body, true).await?.1)
            }
            None => {
                // The list's version is no token: a create and a delete can
                // land between the list and this create, leaving it behind
                // a token already granted. The token is the created Lease's
                // own version, written by a check-and-set on it; only that
                // write grants. The mutant keeps the list's version.
                let listed = (self.mutant == Some(Mutant::CreateTokenFromList)).then(|| token_of(version));
                let record = Record {
                    token: listed,
                    ..record
                };
                let body = self.body(None, holder.clone(), record.clone(), lease, transitions);
                let created = match self
                    .call(Request::Create {
                        body,
                        acquisition: listed.is_some(),
                    })
                    .await?
                {
                    Reply::Written(created) => created,
                    Reply::Conflict => {
                        let _ = self.read().await;
                        return Err(lost(lock, "another candidate created the Lease first"));
                    }
                    other => return Err(StoreError::unavailable(format!("unexpected reply {other:?}"))),
                };
                let at = Instant::now();
                self.view.learn(Some(created.clone()), at);
                match listed {
                    Some(token) => (token, at),
                    None => {
                        let token = token_of(created.resource_version);
                        let record = Record {
                            token: Some(token),
                            ..record
                        };
                        let body = self.body(Some(&created), holder, record, lease, transitions);
                        (token, self.replace(lock, body, true).await?.1)
                    }
                }
            }
        };
        Ok(Grant {
            term,
            token: FencingToken(token),
            committed_at: self.clock.store_time(at),
        })
    }

    async fn renew(&self, lock: &str, holder: &str, token: FencingToken, lease: Duration) -> Result<Grant, StoreError> {
        let (written, at) = self
            .rewrite(lock, holder, token, |current| {
                let record = current.record.clone().ok_or_else(|| lost(lock, "no record"))?;
                let record = Record { lease, ..record };
                Ok(self.body(
                    Some(current),
                    current.holder_identity.clone(),
                    record,
                    lease,
                    current.lease_transitions,
                ))
            })
            .await?;
        Ok(Grant {
            term: written.record.map_or(0, |r| r.term),
            token,
            committed_at: self.clock.store_time(at),
        })
    }

    async fn release_for(
        &self,
        lock: &str,
        holder: &str,
        token: FencingToken,
        release: &Release,
    ) -> Result<(), StoreError> {
        self.rewrite(lock, holder, token, |current| {
            let record = current.record.clone().ok_or_else(|| lost(lock, "no record"))?;
            let lease = record.lease;
            let reserved = (release.handoff.as_ref()).map(|h| (h.pod_uid().to_string(), h.window_within(lease)));
            let record = Record {
                holder: None,
                reserved,
                ended: Some(Ended {
                    term: record.term,
                    reason: release.reason,
                }),
                ..record
            };
            let mut body = self.body(Some(current), None, record, lease, current.lease_transitions);
            body.lease_duration_seconds = current.lease_duration_seconds;
            Ok(body)
        })
        .await
        .map(drop)
    }
}
