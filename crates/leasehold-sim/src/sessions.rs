//! The sessions-and-lock-sets schedule: 2–5 processes, each holding a
//! [`Session`] over its own faulty link to one memory store, try batches of
//! a few shared locks, release some, and claim what they hold every 50 ms
//! (the way leader work checks [`HeldSet::token_at`] before each write).
//! The faults are the elector schedule's (pauses past D, late and
//! duplicated requests, outages, lost replies, clock drift and jumps) plus
//! crashes and garbage collections run by an outsider (the operator).
//!
//! Seeds take turns in threes ([`SessionSemantics::of_seed`]) on three
//! stores' semantics: the memory store's (Spanner's commit timestamps),
//! PostgreSQL's and Redis's ([`super::session_stores`]: rows judged by the
//! server's wall clock, stamps above the last renewal and token, and on
//! PostgreSQL serialization failures retried).
//!
//! One seed in three runs the processes as members of a partitioned lock
//! instead ([`Partitioner`]: six partitions, claimed through
//! [`Assigned::token_at`]), with a drain of up to P before each handover.
//!
//! The checker compares every claim with the store's record of lock
//! acquisitions (their commit instants on the simulated clock):
//! 1. per lock, tokens strictly increase in commit order;
//! 2. every claimed (session, lock, token) was granted by the store to that
//!    session with that token;
//! 3. every claim was made no later than the commit of the lock's next
//!    acquisition: no lock is held by two live sessions at one instant, and
//!    a paused session's locks are not claimed past its deadline (the claim
//!    and its clock reading are one step, so no pause falls between them).
//!
//! Partition schedules also check convergence: once the faults stop, within
//! 2 D + 8 P every process is a member, every partition has an owner and
//! shares differ by at most one.

use std::collections::BTreeMap;

use tokio_util::task::AbortOnDropHandle;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::{RngExt, SeedableRng, rngs::StdRng};
use tokio::time::Instant;

use super::link::{Link, LinkFaults};
use super::mutants::Mutant;
use super::pause::{Pause, paused_runtime};
use super::report::{Report, Violation};
use super::schedule::{Schedule, Setup};
use super::session_stores::{SessionSemantics, SessionServer};
use leasehold_core::lease::lock_set::{HeldSet, Session};
use leasehold_core::lease::partitions::{Assigned, PartitionView, Partitioner, partition_lock};
use leasehold_core::lease::seams::PartitionFlaw;
use leasehold_core::lease::seams::SimHooks;
use leasehold_core::lease::session::{Collected, LockBatch, LocksObservation, SessionObservation, SessionStore};
use leasehold_core::lease::{FencingToken, Identity, StoreError, StoreTime};
use leasehold_core::store::memory::{LockAcquisition, SessionFlaw};

/// The locks every process competes for.
const LOCKS: [&str; 6] = ["lock-a", "lock-b", "lock-c", "lock-d", "lock-e", "lock-f"];

/// The partitioned lock of partition schedules, and its partition count.
const PARTITIONED: &str = "jobs";
const PARTITIONS: u32 = 6;

/// Whether `mutant` is caught by session schedules.
pub(super) fn is_session_mutant(mutant: Mutant) -> bool {
    flaw(mutant).is_some() || partition_flaw(Some(mutant)).is_some()
}

fn partition_flaw(mutant: Option<Mutant>) -> Option<PartitionFlaw> {
    (mutant == Some(Mutant::PartitionExtrasKept)).then_some(PartitionFlaw::ExtrasKept)
}

/// The store-side bug of a session mutant.
fn flaw(mutant: Mutant) -> Option<SessionFlaw> {
    match mutant {
        Mutant::SessionRenewWithoutCas => Some(SessionFlaw::RenewWithoutCas),
        Mutant::SessionRenewedAfterExpiry => Some(SessionFlaw::RenewExpired),
        Mutant::LockTakenFromLiveSession => Some(SessionFlaw::TakeByLockAge),
        _ => None,
    }
}

/// Runs one seeded schedule of sessions and lock sets.
pub fn simulate_sessions(seed: u64, length: Duration) -> Result<Report, Violation> {
    let setup = Setup {
        length,
        ..Setup::default()
    };
    paused_runtime().block_on(async move { Schedule::new(seed, &setup).run_sessions(length).await })
}

/// One claim: at `at`, the process checked its held set and found `lock`
/// held through `session` with `token`.
#[derive(Debug, Clone)]
struct Claim {
    session: String,
    lock: String,
    token: FencingToken,
    at: Instant,
}

/// What the processes share with the schedule.
#[derive(Default)]
struct Shared {
    claims: Mutex<Vec<Claim>>,
    replaced: Mutex<u64>,
    /// The processes share the partitions of [`PARTITIONED`].
    partitioned: bool,
}

struct Process {
    name: String,
    pause: Pause,
    link: Arc<Mutex<LinkFaults>>,
    task: tokio::task::JoinHandle<()>,
}

impl Schedule {
    fn start_process(&mut self, slot: usize, shared: &Arc<Shared>) -> Process {
        self.restarts += 1;
        let name = format!("p{slot}");
        let identity = Identity::with_nonce(&name, format!("run{}", self.restarts));
        let pause = Pause::new();
        let link = Arc::new(Mutex::new(LinkFaults::default()));
        let store: Arc<dyn SessionStore> = match &self.session_server {
            Some(server) => Arc::new(self.session_link(server.clone(), &link)),
            None => Arc::new(self.session_link(self.store.clone(), &link)),
        };
        let hooks = SimHooks {
            flaw: None,
            wrap: Some(pause.wrapper()),
        };
        let (timing, seed, shared) = (self.timing, self.rng.random::<u64>(), shared.clone());
        let flaw = partition_flaw(self.mutant);
        let spawner = hooks.clone();
        let work = async move {
            let mut rng = StdRng::seed_from_u64(seed);
            let session = loop {
                let opened = Session::open_with(
                    store.clone(),
                    identity.clone(),
                    timing,
                    Some(rng.random()),
                    hooks.clone(),
                );
                match opened.await {
                    Ok(session) => break session,
                    Err(_) => tokio::time::sleep(timing.retry_period).await,
                }
            };
            if shared.partitioned {
                let drain = timing.retry_period.mul_f64(rng.random_range(0.0..1.0));
                let member = Partitioner::new(session, PARTITIONED, PARTITIONS, drain).simulated(rng.random(), flaw);
                let _claims = AbortOnDropHandle::new(hooks.spawn(claim_partitions(member.assigned(), shared)));
                // Runs until the process is aborted (a crash, or the end).
                let _ = member.run(tokio_util::sync::CancellationToken::new()).await;
                return;
            }
            // Aborted with the process.
            let _claims = AbortOnDropHandle::new(hooks.spawn(claim(session.held(), shared)));
            loop {
                tokio::time::sleep(Duration::from_millis(rng.random_range(100..600))).await;
                match rng.random_range(0..10) {
                    0..6 => {
                        let mut wanted: Vec<&str> = LOCKS.to_vec();
                        let keep = rng.random_range(1..=3);
                        while wanted.len() > keep {
                            wanted.swap_remove(rng.random_range(0..wanted.len()));
                        }
                        let _ = session.try_lock_many(&wanted).await;
                    }
                    6..8 => {
                        let held: Vec<String> = session.held().borrow().locks.keys().cloned().collect();
                        if !held.is_empty() {
                            let one = held[rng.random_range(0..held.len())].clone();
                            let _ = session.release(&[one]).await;
                        }
                    }
                    _ => {}
                }
            }
        };
        let task = spawner.spawn(work);
        self.note(format!("start {name}"));
        Process {
            name,
            pause,
            link,
            task,
        }
    }

    /// A process's link to `store`.
    fn session_link<S>(&self, store: S, faults: &Arc<Mutex<LinkFaults>>) -> Link<S> {
        Link {
            store,
            faults: faults.clone(),
            rng: self.links.clone(),
            stats: self.stats.clone(),
            duplicates: true,
            mutant: self.mutant,
            local_clock: StoreTime(0),
            started: self.start,
        }
    }

    /// The session store the schedule runs on.
    fn session_store(&self) -> &dyn SessionStore {
        match &self.session_server {
            Some(server) => server,
            None => &self.store,
        }
    }

    pub(super) async fn run_sessions(mut self, length: Duration) -> Result<Report, Violation> {
        let semantics = self.sessions_on.unwrap_or(SessionSemantics::of_seed(self.seed));
        if semantics != SessionSemantics::Spanner {
            // Seeded apart from the schedule, so the memory store's seeds replay as before.
            let server = SessionServer::new(
                semantics,
                self.seed ^ 0x5e55_1045,
                StoreTime(1_700_000_000_000_000_000),
                self.clock_rate,
                self.timing.renew_deadline / 2,
            );
            self.session_server = Some(server);
        }
        self.report.counts.redis_schedules = u64::from(semantics == SessionSemantics::Redis);
        self.report.counts.postgres_schedules = u64::from(semantics == SessionSemantics::Postgres);
        if let Some(flaw) = self.mutant.and_then(flaw) {
            match &self.session_server {
                Some(server) => server.set_flaw(Some(flaw)),
                None => self.store.set_session_flaw(Some(flaw)),
            }
        }
        let partitioned = self.seed % 3 == 2 || partition_flaw(self.mutant).is_some();
        let shared = Arc::new(Shared {
            partitioned,
            ..Shared::default()
        });
        let slots = self.rng.random_range(2..=5);
        self.note(format!(
            "{slots} processes with sessions{} on {semantics:?}'s semantics, {:?}, store clock rate {:.3}, forward jumps up to {:?}, mutant {:?}",
            if partitioned {
                format!(" sharing {PARTITIONS} partitions")
            } else {
                String::new()
            },
            self.timing,
            self.clock_rate,
            self.max_jump,
            self.mutant
        ));
        let mut processes: Vec<Process> = (0..slots).map(|i| self.start_process(i, &shared)).collect();
        let end = self.start + length;
        while Instant::now() < end {
            tokio::time::sleep(Duration::from_millis(self.rng.random_range(100..1500))).await;
            self.inject_sessions(&mut processes, &shared).await;
        }
        self.set_store_faults(Default::default());
        let unbalanced = match partitioned {
            true => self.converge_partitions(&processes).await,
            false => None,
        };
        for p in &processes {
            p.task.abort();
        }
        tokio::time::sleep(self.timing.lease_duration * 2).await;
        self.report.counts.partition_schedules = u64::from(partitioned);
        self.check_sessions(&shared, unbalanced)
    }

    /// Lifts every fault, waits 2 D + 8 P and reads the partitions: what is
    /// wrong with them, if anything.
    async fn converge_partitions(&mut self, processes: &[Process]) -> Option<String> {
        for p in processes {
            *p.link.lock().unwrap() = LinkFaults::default();
            p.pause.set(false);
        }
        self.note("faults lifted: the partitions must converge".into());
        let p = self.timing.retry_period;
        tokio::time::sleep(self.timing.lease_duration * 2 + p.mul_f64(8.0 * (1.0 + self.timing.jitter))).await;
        let view = match PartitionView::observe(self.session_store(), PARTITIONED, PARTITIONS).await {
            Ok(view) => view,
            Err(e) => return Some(format!("reading the partitions failed: {e}")),
        };
        let held = view.held_by_member();
        let members = processes.len().min(PARTITIONS as usize);
        let fine = view.members.len() == members && view.unowned() == 0 && view.balance() <= 1;
        (!fine).then(|| {
            format!(
                "partitions did not converge within 2 D + 8 P of the faults stopping: {} members of {members} expected, {} unowned, shares {:?}",
                view.members.len(),
                view.unowned(),
                held
            )
        })
    }

    async fn inject_sessions(&mut self, processes: &mut [Process], shared: &Arc<Shared>) {
        let i = self.rng.random_range(0..processes.len());
        let arm = self.rng.random_range(0..12);
        let links: Vec<_> = processes.iter().map(|p| p.link.clone()).collect();
        let (name, pause) = (processes[i].name.clone(), processes[i].pause.clone());
        if self.inject_fault(arm, &name, &pause, &links, i) {
            return;
        }
        match arm {
            7 => {
                self.note(format!("crash {name} (kill -9)"));
                self.report.counts.crashes += 1;
                processes[i].task.abort();
                processes[i].pause.set(false);
                let restart = self.timing.retry_period.mul_f64(self.rng.random_range(0.0..5.0));
                tokio::time::sleep(restart).await;
                processes[i] = self.start_process(i, shared);
            }
            8 | 10 => {
                // The operator collects dead sessions and free rows.
                let collected: Result<Collected, StoreError> = self.session_store().collect_garbage().await;
                self.note(format!("garbage collection: {collected:?}"));
            }
            11 if self
                .session_server
                .as_ref()
                .is_some_and(|s| s.semantics() == SessionSemantics::Postgres) =>
            {
                let share = match self.rng.random_bool(0.5) {
                    true => self.rng.random_range(0.0..0.5),
                    false => 0.0,
                };
                self.note(format!("PostgreSQL: {share:.2} of write transactions abort with 40001"));
                if let Some(server) = &self.session_server {
                    server.set_contention(share);
                }
            }
            _ => {}
        }
    }

    fn check_sessions(mut self, shared: &Shared, unbalanced: Option<String>) -> Result<Report, Violation> {
        let mut log = std::mem::take(&mut *self.log.lock().unwrap());
        let acquisitions: Vec<LockAcquisition> = match &self.session_server {
            Some(server) => server.lock_acquisitions(),
            None => self.store.lock_acquisitions(),
        };
        let start = self.start;
        let at = |instant: Instant| (instant - start).as_millis();
        log.events.extend(acquisitions.iter().map(|a| {
            format!(
                "{:>7}ms store committed {} to {} token {}",
                at(a.at),
                a.lock,
                a.session,
                a.token
            )
        }));
        // The schedule's notes and the store's commits, in time order (a
        // stable sort: notes of one instant keep their order).
        log.events
            .sort_by_key(|e| e.trim_start().split("ms").next().and_then(|ms| ms.parse::<u128>().ok()));
        let (seed, mutant) = (self.seed, self.mutant);
        let fail = |what: String| Violation {
            seed,
            mutant,
            what: format!("{what} [session schedule: replay with --sessions]"),
            events: log.events.clone(),
        };
        // Per lock, its acquisitions in commit order.
        let mut by_lock: BTreeMap<&str, Vec<&LockAcquisition>> = BTreeMap::new();
        for a in &acquisitions {
            by_lock.entry(a.lock.as_str()).or_default().push(a);
        }
        // 1. Tokens strictly increase per lock.
        for (lock, list) in &by_lock {
            for pair in list.windows(2) {
                if pair[1].token <= pair[0].token {
                    return Err(fail(format!(
                        "{lock}: token {} committed at {}ms after token {}: tokens must strictly increase",
                        pair[1].token,
                        at(pair[1].at),
                        pair[0].token
                    )));
                }
            }
        }
        // 2. and 3. Every claim was granted, and made before the next acquisition.
        let claims = shared.claims.lock().unwrap();
        for c in claims.iter() {
            let list = by_lock.get(c.lock.as_str()).map(Vec::as_slice).unwrap_or_default();
            let Some(i) = list.iter().position(|a| a.token == c.token && a.session == c.session) else {
                return Err(fail(format!(
                    "{} claimed {} with token {} at {}ms, which the store never granted to it",
                    c.session,
                    c.lock,
                    c.token,
                    at(c.at)
                )));
            };
            if let Some(next) = list.get(i + 1)
                && c.at > next.at
            {
                return Err(fail(format!(
                    "{} claimed {} (token {}) at {}ms, after {} took it at {}ms with token {}",
                    c.session,
                    c.lock,
                    c.token,
                    at(c.at),
                    next.session,
                    at(next.at),
                    next.token
                )));
            }
        }
        if claims.is_empty() {
            return Err(fail("nobody ever held a lock: the schedule tested nothing".into()));
        }
        if let Some(what) = unbalanced {
            return Err(fail(what));
        }
        let stats = self.stats.lock().unwrap();
        self.report.counts.terms = acquisitions.len() as u64;
        self.report.counts.accepted = claims.len() as u64;
        self.report.counts.late_commits = stats.late_commits;
        self.report.counts.duplicates = stats.duplicates;
        self.report.counts.sessions_replaced = *shared.replaced.lock().unwrap();
        if let Some(server) = &self.session_server {
            self.report.counts.serialization_failures = server.serialization_failures();
        }
        self.report.events = log.events;
        drop(stats);
        Ok(self.report)
    }
}

/// Every 50 ms, records each lock the held set says is held now; counts
/// sessions replaced (a new id in the held set).
async fn claim(held: tokio::sync::watch::Receiver<HeldSet>, shared: Arc<Shared>) {
    let mut last = String::new();
    loop {
        let set = held.borrow().clone();
        if set.session != last {
            if !last.is_empty() {
                *shared.replaced.lock().unwrap() += 1;
            }
            last = set.session.clone();
        }
        let now = Instant::now();
        let claimed = set.locks.keys().filter_map(|name| {
            set.token_at(name, now).map(|token| Claim {
                session: set.session.clone(),
                lock: name.clone(),
                token,
                at: now,
            })
        });
        shared.claims.lock().unwrap().extend(claimed);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Every 50 ms, records each partition the member may work on now.
async fn claim_partitions(assigned: tokio::sync::watch::Receiver<Assigned>, shared: Arc<Shared>) {
    loop {
        let set = assigned.borrow().clone();
        let now = Instant::now();
        let claimed = set.partitions.keys().filter_map(|index| {
            set.token_at(*index, now).map(|token| Claim {
                session: set.session.clone(),
                lock: partition_lock(PARTITIONED, *index),
                token,
                at: now,
            })
        });
        shared.claims.lock().unwrap().extend(claimed);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The processes reach the store through their links, like the electors.
#[async_trait::async_trait]
impl<S: SessionStore + Clone> SessionStore for Link<S> {
    async fn ensure_session_schema(&self) -> Result<(), StoreError> {
        Ok(())
    }

    async fn open_session(&self, session: &str, owner: &str, lease: Duration) -> Result<StoreTime, StoreError> {
        let (session, owner) = (session.to_string(), owner.to_string());
        self.send(true, move |store| {
            let (session, owner) = (session.clone(), owner.clone());
            Box::pin(async move { store.open_session(&session, &owner, lease).await })
        })
        .await
    }

    async fn renew_session(&self, session: &str) -> Result<StoreTime, StoreError> {
        let session = session.to_string();
        self.send(true, move |store| {
            let session = session.clone();
            Box::pin(async move { store.renew_session(&session).await })
        })
        .await
    }

    async fn close_session(&self, session: &str) -> Result<(), StoreError> {
        let session = session.to_string();
        self.send(true, move |store| {
            let session = session.clone();
            Box::pin(async move { store.close_session(&session).await })
        })
        .await
    }

    async fn observe_session(&self, session: &str) -> Result<SessionObservation, StoreError> {
        let session = session.to_string();
        self.send(false, move |store| {
            let session = session.clone();
            Box::pin(async move { store.observe_session(&session).await })
        })
        .await
    }

    async fn try_lock(&self, session: &str, names: &[String]) -> Result<LockBatch, StoreError> {
        let (session, names) = (session.to_string(), names.to_vec());
        self.send(true, move |store| {
            let (session, names) = (session.clone(), names.clone());
            Box::pin(async move { store.try_lock(&session, &names).await })
        })
        .await
    }

    async fn unlock(&self, session: &str, locks: &[(String, FencingToken)]) -> Result<Vec<String>, StoreError> {
        let (session, locks) = (session.to_string(), locks.to_vec());
        self.send(true, move |store| {
            let (session, locks) = (session.clone(), locks.clone());
            Box::pin(async move { store.unlock(&session, &locks).await })
        })
        .await
    }

    async fn observe_locks(&self, names: &[String]) -> Result<LocksObservation, StoreError> {
        let names = names.to_vec();
        self.send(false, move |store| {
            let names = names.clone();
            Box::pin(async move { store.observe_locks(&names).await })
        })
        .await
    }

    async fn collect_garbage(&self) -> Result<Collected, StoreError> {
        self.send(true, |store| Box::pin(async move { store.collect_garbage().await }))
            .await
    }
}
