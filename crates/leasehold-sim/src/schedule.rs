//! The elector schedule: 2–5 candidates on paused tokio time, each behind
//! its own link to the faulty memory store (or, with `kubernetes`, to the
//! simulated API server of [`super::kubernetes`]), and the faults injected
//! between them (module docs of [`super`]).

use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::{RngExt, SeedableRng, rngs::StdRng};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::checker::{Belief, FencedRegister, Finished, Log, Write};
use super::kubernetes::{ApiServer, CandidateClock, KubeClient};
use super::link::{Link, LinkFaults, LinkStats};
use super::mutants::Mutant;
use super::pause::Pause;
use super::report::{Counts, Report, Violation};
use super::session_stores::{SessionSemantics, SessionServer};
use leasehold_core::lease::seams::SimHooks;
use leasehold_core::lease::{
    Elector, ElectorHandle, FencingToken, Identity, LeaderContext, LeaderState, LeaseStore, StoreTime, Timing,
};
use leasehold_core::store::memory::{Faults, MemoryStore};

/// How to run a schedule.
#[derive(Debug, Clone)]
pub struct Setup {
    /// Simulated time per schedule.
    pub length: Duration,
    /// The store clock's rate excess, drawn from this range times what R/D
    /// tolerates (negative: slow). Above 1.0 safety is not promised, which
    /// shows the checker can see a violation.
    pub drift: Range<f64>,
    pub mutant: Option<Mutant>,
    /// Elector schedules on the Kubernetes store's semantics; the drift
    /// range then applies to each candidate's monotonic clock, times what
    /// D/R tolerates between two candidates.
    pub kubernetes: bool,
    /// Session schedules on this store's semantics instead of the seed's turn.
    pub sessions_on: Option<SessionSemantics>,
    /// Elector schedules whose candidates run in two clusters sharing the
    /// store, pods of the same names in both, each cluster with an
    /// operator that releases the lock on a pod's deletion ([`clusters`]).
    pub two_clusters: bool,
}

impl Default for Setup {
    fn default() -> Self {
        Setup {
            length: Duration::from_secs(60),
            drift: -0.5..0.6,
            mutant: None,
            kubernetes: false,
            sessions_on: None,
            two_clusters: false,
        }
    }
}

pub(super) const LOCK: &str = "simulated";

pub(super) struct Candidate {
    /// Its clocks, on the Kubernetes store's semantics.
    pub(super) clock: Option<Arc<CandidateClock>>,
    pub(super) name: String,
    /// Its identity, as beliefs and acquisitions name it.
    pub(super) who: String,
    pub(super) version: leasehold_core::lease::Version,
    pub(super) handle: ElectorHandle,
    pub(super) pause: Pause,
    pub(super) link: Arc<Mutex<LinkFaults>>,
    pub(super) shutdown: CancellationToken,
}

pub(super) struct Schedule {
    pub(super) seed: u64,
    pub(super) rng: StdRng,
    pub(super) store: MemoryStore,
    /// The API server, when the schedule runs on the Kubernetes store's semantics.
    pub(super) kube: Option<ApiServer>,
    /// The PostgreSQL or Redis model a session schedule runs on, if not the memory store.
    pub(super) session_server: Option<SessionServer>,
    /// The session semantics the setup asks for.
    pub(super) sessions_on: Option<SessionSemantics>,
    pub(super) mutant: Option<Mutant>,
    /// The clock rate excesses drawn from (module docs of [`Setup`]).
    pub(super) drift: Range<f64>,
    pub(super) clock_rate: f64,
    pub(super) timing: Timing,
    /// The largest forward jump of the store clock, in store time.
    pub(super) max_jump: Duration,
    pub(super) last_forward_jump: Option<Instant>,
    /// Local time from a leader's deadline to the earliest commit of the
    /// next term, whatever the clock faults do: what stale writes must beat.
    pub(super) margin: Duration,
    pub(super) start: Instant,
    pub(super) log: Arc<Mutex<Log>>,
    pub(super) register: Arc<Mutex<FencedRegister>>,
    pub(super) links: Arc<Mutex<StdRng>>,
    pub(super) stats: Arc<Mutex<LinkStats>>,
    /// Tokens of terms whose row was deleted while their lease was live.
    pub(super) deleted_tokens: HashSet<Option<FencingToken>>,
    /// When the Kubernetes Lease was deleted: the record (term, version
    /// fence) starts again after it.
    pub(super) term_resets: Vec<Instant>,
    pub(super) restarts: u64,
    /// The version fence is on in this schedule.
    pub(super) fence: bool,
    /// Two clusters share the store: whether they name themselves (their
    /// identities carry `west/`, `east/`), or `None` for one cluster.
    pub(super) clusters: Option<bool>,
    /// Two clusters: each slot's pod UID, kept across its process's
    /// restarts and replaced when its pod is deleted.
    pub(super) pod_uids: HashMap<usize, String>,
    /// Two clusters: whether each pod (by UID) shows the leader label.
    pub(super) labels: Arc<Mutex<HashMap<String, bool>>>,
    /// The newest revision so far: a rollout raises it; candidates start
    /// under it or one below (an old pod still around).
    pub(super) revision: u64,
    /// The operator reading the lock and folding `status.history`, from the
    /// schedule's start.
    pub(super) history: Option<super::history::Observer>,
    pub(super) report: Report,
}

impl Schedule {
    pub(super) fn new(seed: u64, setup: &Setup) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        let lease = Duration::from_millis(rng.random_range(800..=2000));
        let renew = lease.mul_f64(rng.random_range(0.5..0.85));
        let retry = renew.mul_f64(rng.random_range(0.1..0.3));
        let timing = Timing::new(lease, renew, retry, rng.random_range(0.0..0.3)).expect("valid generated timing");
        // The store's clock runs slow or fast (S3): fast, leases expire
        // sooner than the candidates' own clocks say. R/D bounds the
        // tolerated drift.
        let tolerated = lease.as_secs_f64() / renew.as_secs_f64() - 1.0;
        let clock_rate = 1.0 + rng.random_range(setup.drift.clone()) * tolerated;
        // Within one lease the store clock advances at most R × rate + one
        // forward jump (jumps are 4 D apart); what is left of D is the
        // margin, half of it given to jumps.
        let left = (lease.as_secs_f64() - renew.as_secs_f64() * clock_rate).max(0.0);
        let mut max_jump = Duration::from_secs_f64(left / 2.0);
        let mut margin = Duration::from_secs_f64(left / 2.0 / clock_rate);
        let kubernetes = setup.kubernetes || setup.mutant.is_some_and(Mutant::is_kubernetes);
        let two_clusters = setup.two_clusters || setup.mutant.and_then(Mutant::locality_flaw).is_some();
        if kubernetes {
            // No store clock: a follower takes over no earlier than D by its
            // own clock after it saw the last renewal commit; the leader
            // stops at its send + R. With the fastest candidate clock at
            // rate q that leaves D / q − R.
            let fastest = 1.0 + setup.drift.end * tolerated;
            margin = Duration::from_secs_f64((lease.as_secs_f64() / fastest - renew.as_secs_f64()).max(0.0));
            max_jump = Duration::ZERO;
        }
        Schedule {
            seed,
            store: MemoryStore::new(rng.random())
                .with_clock_start(StoreTime(1_700_000_000_000_000_000))
                .with_clock_rate(clock_rate)
                .with_ttl_expiry(seed % 2 == 1),
            kube: kubernetes.then(|| ApiServer::new(seed, LOCK)),
            session_server: None,
            sessions_on: setup.sessions_on,
            mutant: setup.mutant,
            drift: setup.drift.clone(),
            clock_rate,
            links: Arc::new(Mutex::new(StdRng::seed_from_u64(rng.random()))),
            rng,
            timing,
            max_jump,
            last_forward_jump: None,
            margin,
            start: Instant::now(),
            log: Arc::default(),
            register: Arc::default(),
            stats: Arc::default(),
            deleted_tokens: HashSet::new(),
            term_resets: Vec::new(),
            restarts: 0,
            fence: false,
            // Half the two-cluster schedules without names (seed / 2, so
            // not in step with the TTL seeds).
            clusters: two_clusters.then_some((seed / 2).is_multiple_of(2)),
            pod_uids: HashMap::new(),
            labels: Arc::default(),
            revision: 2,
            history: None,
            report: Report {
                seed,
                counts: Counts {
                    ttl_seeds: if kubernetes { 0 } else { seed % 2 },
                    kubernetes_schedules: u64::from(kubernetes),
                    two_cluster_schedules: u64::from(two_clusters),
                    ..Counts::default()
                },
                ..Default::default()
            },
        }
    }

    pub(super) fn note(&self, what: String) {
        let at = self.start.elapsed().as_millis();
        self.log.lock().unwrap().events.push(format!("{at:>7}ms {what}"));
    }

    pub(super) fn start_candidate(&mut self, slot: usize) -> Candidate {
        self.start_candidate_at(slot, None)
    }

    /// A candidate in `slot`, of `revision` or (`None`) the newest so far or
    /// one below.
    pub(super) fn start_candidate_at(&mut self, slot: usize, revision: Option<u64>) -> Candidate {
        self.restarts += 1;
        let (name, identity) = match self.clusters {
            None => {
                let name = format!("c{slot}");
                let identity = Identity::with_nonce(&name, format!("run{}", self.restarts));
                (name, identity)
            }
            Some(named) => self.cluster_identity(slot, named),
        };
        let who = identity.to_string();
        let pause = Pause::new();
        let shutdown = CancellationToken::new();
        let link_faults = Arc::new(Mutex::new(LinkFaults::default()));
        // Pod clocks are off by up to ± 2 D (only the token mutant reads them).
        let skew = self.timing.lease_duration.as_nanos() as i64 * self.rng.random_range(-2_000..=2_000) / 1_000;
        let (store, clock): (Arc<dyn LeaseStore>, _) = match &self.kube {
            None => (
                Arc::new(Link {
                    store: self.store.clone(),
                    faults: link_faults.clone(),
                    rng: self.links.clone(),
                    stats: self.stats.clone(),
                    duplicates: true,
                    mutant: self.mutant,
                    local_clock: StoreTime(1_700_000_000_000_000_000 + skew),
                    started: self.start,
                }),
                None,
            ),
            Some(server) => {
                // Its monotonic clock's rate; its wall clock is skewed by as
                // much as the pod clocks above (only the renewTime mutant reads it).
                let tolerated =
                    self.timing.lease_duration.as_secs_f64() / self.timing.renew_deadline.as_secs_f64() - 1.0;
                let rate = 1.0 + self.rng.random_range(self.drift.clone()) * tolerated;
                let clock = Arc::new(CandidateClock::new(rate, self.start, skew));
                self.note(format!(
                    "c{slot} clock rate {rate:.3}, wall clock off by {}ms",
                    skew / 1_000_000
                ));
                let link = Link {
                    store: server.clone(),
                    faults: link_faults.clone(),
                    rng: self.links.clone(),
                    stats: self.stats.clone(),
                    // HTTP requests are not delivered twice.
                    duplicates: false,
                    mutant: self.mutant,
                    local_clock: StoreTime(0),
                    started: self.start,
                };
                // The store's call timeout, shorter than R as the default 5 s is than 10 s.
                let client = KubeClient::new(
                    link,
                    clock.clone(),
                    self.timing.renew_deadline / 2,
                    self.mutant,
                    pause.clone(),
                );
                (Arc::new(client), Some(clock))
            }
        };
        let register = self.register.clone();
        // Each write takes up to an eighth of the margin by itself.
        let write_latency = self.margin / 8;
        let writer = who.clone();
        let hooks = SimHooks {
            flaw: self.mutant.and_then(Mutant::flaw),
            wrap: Some(pause.wrapper()),
        };
        let revision = revision.unwrap_or_else(|| self.revision - u64::from(self.rng.random_bool(0.4)));
        let version = leasehold_core::lease::Version {
            revision,
            name: format!("v{revision}"),
        };
        let handle = Elector::new(LOCK, identity, self.timing)
            .with_version(Some(version.clone()), self.fence)
            .with_seed(self.rng.random())
            .with_sim_hooks(hooks)
            .spawn_with_work(store, shutdown.clone(), move |ctx: LeaderContext| {
                let (register, writer) = (register.clone(), writer.clone());
                async move {
                    // Leader work: check, then write with the token, every 50 ms.
                    loop {
                        let checked = Instant::now();
                        if !ctx.still_leading() {
                            break;
                        }
                        // A pause can strike between the check and the write.
                        tokio::time::sleep(write_latency).await;
                        register.lock().unwrap().write(Write {
                            writer: writer.clone(),
                            token: ctx.token,
                            checked,
                            latency: write_latency,
                            issued: Instant::now(),
                        });
                        tokio::select! {
                            _ = ctx.cancelled.cancelled() => break,
                            _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                        }
                    }
                }
            });
        self.watch_beliefs(who.clone(), handle.subscribe());
        if self.clusters.is_some() {
            self.follow_label(slot, handle.subscribe());
        }
        self.note(format!("start {who} at revision {revision}"));
        Candidate {
            clock,
            name,
            who,
            version,
            handle,
            pause,
            link: link_faults,
            shutdown,
        }
    }

    /// Records every interval during which a candidate believed it led.
    pub(super) fn watch_beliefs(&self, who: String, mut rx: watch::Receiver<LeaderState>) {
        let log = self.log.clone();
        let start = self.start;
        tokio::spawn(async move {
            let mut last_term = 0;
            loop {
                let state = rx.borrow_and_update().clone();
                let now = Instant::now();
                {
                    let mut entries = log.lock().unwrap();
                    if state.term != last_term && state.leader {
                        last_term = state.term;
                        let at = start.elapsed().as_millis();
                        entries.events.push(format!(
                            "{at:>7}ms {who} leads term {} token {:?}",
                            state.term, state.token
                        ));
                    }
                    // A later publication cuts any earlier belief short.
                    entries.end_beliefs(&who, now);
                    if let Some(deadline) = state.deadline.filter(|_| state.leader) {
                        entries.beliefs.push(Belief {
                            who: who.clone(),
                            from: now,
                            until: deadline,
                            term: state.term,
                            token: state.token,
                        });
                    }
                }
                if rx.changed().await.is_err() {
                    // The elector is gone (crash or shutdown): it believes nothing.
                    log.lock().unwrap().end_beliefs(&who, Instant::now());
                    break;
                }
            }
        });
    }

    pub(super) async fn run(mut self, length: Duration) -> Result<Report, Violation> {
        let slots = self.rng.random_range(2..=5);
        self.fence = self.rng.random_bool(0.5);
        self.report.counts.fenced_schedules = u64::from(self.fence);
        self.note(format!(
            "{slots} candidates{}{}, {:?}, store clock rate {:.3}, forward jumps up to {:?}, margin {:?}, fence {}, mutant {:?}",
            if self.kube.is_some() {
                " on the Kubernetes store's semantics"
            } else {
                ""
            },
            match self.clusters {
                Some(true) => " in two named clusters",
                Some(false) => " in two unnamed clusters",
                None => "",
            },
            self.timing,
            self.clock_rate,
            self.max_jump,
            self.margin,
            self.fence,
            self.mutant
        ));
        let read: super::history::Read = match &self.kube {
            Some(server) => {
                let (server, clock) = (server.clone(), CandidateClock::new(1.0, self.start, 0));
                Arc::new(move || server.peek(LOCK, &clock))
            }
            None => {
                let store = self.store.clone();
                Arc::new(move || store.peek(LOCK))
            }
        };
        self.history = Some(super::history::Observer::start(read, self.seed, self.mutant));
        let mut candidates: Vec<Candidate> = (0..slots).map(|i| self.start_candidate(i)).collect();
        let end = self.start + length;
        while Instant::now() < end {
            tokio::time::sleep(Duration::from_millis(self.rng.random_range(100..1500))).await;
            self.inject(&mut candidates).await;
        }
        self.set_store_faults(Faults::default());
        for c in &candidates {
            *c.link.lock().unwrap() = LinkFaults::default();
            c.pause.set(false);
            c.shutdown.cancel();
        }
        for c in candidates {
            c.handle.join().await;
        }
        // Let the belief watchers and requests in flight finish.
        tokio::time::sleep(self.timing.lease_duration * 2).await;
        self.check()
    }

    /// One random fault or repair.
    pub(super) async fn inject(&mut self, candidates: &mut [Candidate]) {
        let i = self.rng.random_range(0..candidates.len());
        let arm = self.rng.random_range(0..14);
        let links: Vec<_> = candidates.iter().map(|c| c.link.clone()).collect();
        let (name, pause) = (candidates[i].name.clone(), candidates[i].pause.clone());
        if self.kube.is_some() && self.inject_kubernetes(arm, &candidates[i]) {
            return;
        }
        if self.inject_fault(arm, &name, &pause, &links, i) {
            return;
        }
        match arm {
            7 => {
                self.note(format!("crash {} (kill -9)", candidates[i].name));
                self.report.counts.crashes += 1;
                candidates[i].handle.abort();
                candidates[i].pause.set(false);
                let restart = self.timing.retry_period.mul_f64(self.rng.random_range(0.0..5.0));
                tokio::time::sleep(restart).await;
                candidates[i] = self.start_candidate(i);
            }
            8 => {
                let on = !candidates[i].handle.state().campaigning;
                self.note(format!(
                    "{} campaign {}",
                    candidates[i].name,
                    if on { "resumes" } else { "stops" }
                ));
                candidates[i].handle.set_campaigning(on);
            }
            11 => {
                // A rollout: newer candidates from now on (restarts below
                // may still bring back the previous revision).
                self.revision += 1;
                self.note(format!("rollout to revision {}", self.revision));
            }
            12 if self.clusters.is_some() => self.label_step(candidates, i).await,
            13 if self.clusters.is_some() => self.delete_pod(candidates, i).await,
            // Rare: it exempts the term it cuts short from the checker.
            10 if self.rng.random_bool(0.25) => {
                let deleted = self.store.delete_row(LOCK);
                match deleted.live_holder().and(deleted.record.as_ref()) {
                    Some(record) => {
                        let term = record.term;
                        self.deleted_tokens.insert(record.token);
                        self.report.counts.deleted_live += 1;
                        self.note(format!("row deleted under the live lease of term {term}"));
                    }
                    None => self.note("row deleted".into()),
                }
            }
            _ => {}
        }
    }

    /// The Kubernetes schedule's own faults, by `arm`: a step of the wall
    /// clock of `candidate`, the Lease deleted by hand, the watch cache
    /// lagging. False for any other arm.
    fn inject_kubernetes(&mut self, arm: u32, candidate: &Candidate) -> bool {
        let (Some(server), Some(clock)) = (self.kube.clone(), candidate.clock.as_ref()) else {
            return false;
        };
        let lease = self.timing.lease_duration;
        match arm {
            9 => {
                let step = lease.as_nanos() as i64 * self.rng.random_range(-2_000..=2_000) / 1_000;
                self.note(format!("{} wall clock steps by {}ms", candidate.name, step / 1_000_000));
                self.report.counts.clock_jumps += 1;
                clock.step(step);
            }
            10 => match server.delete(lease) {
                Some(deleted) => {
                    self.term_resets.push(Instant::now());
                    match deleted.live {
                        Some((term, token)) => {
                            self.deleted_tokens.insert(Some(token));
                            self.report.counts.deleted_live += 1;
                            self.note(format!(
                                "Lease deleted under the live lease of term {term} token {token}"
                            ));
                        }
                        None => self.note("Lease deleted".into()),
                    }
                }
                None => self.note("Lease already absent".into()),
            },
            12 => {
                let lag = match self.rng.random_bool(0.5) {
                    true => lease.mul_f64(self.rng.random_range(0.0..1.5)),
                    false => Duration::ZERO,
                };
                self.note(format!("watch cache lags {lag:?}"));
                server.set_watch_lag(lag);
            }
            _ => return false,
        }
        true
    }

    /// Sets the faults of the store the schedule runs on.
    pub(super) fn set_store_faults(&self, faults: Faults) {
        if let Some(server) = &self.kube {
            server.set_faults(faults.clone());
        }
        if let Some(server) = &self.session_server {
            server.set_faults(faults.clone());
        }
        self.store.set_faults(faults);
    }

    /// The faults every schedule shares, by `arm`: store outages, latency
    /// and flakiness, a repair, the link of process `i` (named `name`,
    /// paused by `pause`; `links` are everyone's), a pause, a store clock
    /// jump. False for any other arm.
    pub(super) fn inject_fault(
        &mut self,
        arm: u32,
        name: &str,
        pause: &Pause,
        links: &[Arc<Mutex<LinkFaults>>],
        i: usize,
    ) -> bool {
        let (lease, renew) = (self.timing.lease_duration, self.timing.renew_deadline);
        match arm {
            0 => {
                self.note("store outage".into());
                self.set_store_faults(Faults {
                    down: true,
                    ..Default::default()
                });
            }
            1 => {
                let latency = renew.mul_f64(self.rng.random_range(0.1..0.8));
                self.note(format!("store latency {latency:?} each way"));
                self.set_store_faults(Faults {
                    latency,
                    ..Default::default()
                });
            }
            2 => {
                let faults = Faults {
                    unavailable: self.rng.random_range(0.0..0.3),
                    drop_reply_after_commit: self.rng.random_range(0.0..0.3),
                    unknown_without_commit: self.rng.random_range(0.0..0.2),
                    ..Default::default()
                };
                self.note(format!("flaky store {faults:?}"));
                self.set_store_faults(faults);
            }
            3 => {
                self.note("store and links healthy".into());
                self.set_store_faults(Faults::default());
                for link in links {
                    *link.lock().unwrap() = LinkFaults::default();
                }
            }
            4 => {
                // Asymmetric, per candidate; past R the client gives up and
                // the request commits later anyway.
                let mut draw = || match self.rng.random_range(0..4) {
                    0 => renew.mul_f64(self.rng.random_range(0.5..2.0)),
                    _ => renew.mul_f64(self.rng.random_range(0.0..0.3)),
                };
                let (to_store, from_store) = (draw(), draw());
                let duplicate = if self.rng.random_bool(0.3) { 0.3 } else { 0.0 };
                self.note(format!(
                    "{} link: {to_store:?} to the store, {from_store:?} back, duplicates {duplicate}",
                    name
                ));
                *links[i].lock().unwrap() = LinkFaults {
                    to_store,
                    from_store,
                    duplicate,
                };
            }
            5 | 6 => {
                // Paused (GC, SIGSTOP) for up to twice the lease, often past the gap.
                let length = lease.mul_f64(self.rng.random_range(0.1..2.0));
                if length > self.timing.safety_gap() {
                    self.report.counts.long_pauses += 1;
                }
                self.note(format!("pause {} for {length:?}", name));
                pause.set(true);
                let pause = pause.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(length).await;
                    pause.set(false);
                });
            }
            9 => {
                let now = Instant::now();
                let forward_allowed = self.last_forward_jump.is_none_or(|at| now - at > lease * 4);
                let (nanos, direction) = if forward_allowed && self.rng.random_bool(0.5) {
                    self.last_forward_jump = Some(now);
                    (
                        self.max_jump.mul_f64(self.rng.random_range(0.0..=1.0)).as_nanos() as i64,
                        1,
                    )
                } else {
                    (lease.mul_f64(self.rng.random_range(0.0..1.0)).as_nanos() as i64, -1)
                };
                self.note(format!("store clock jumps by {}ms", direction * nanos / 1_000_000));
                self.report.counts.clock_jumps += 1;
                self.store.jump_clock(direction * nanos);
                if let Some(server) = &self.session_server {
                    server.jump_clock(direction * nanos);
                }
            }
            _ => return false,
        }
        true
    }
}

impl Schedule {
    /// Hands what the run left behind to the checker.
    pub(super) fn check(mut self) -> Result<Report, Violation> {
        let (acquisitions, claims) = match &self.kube {
            Some(server) => (server.acquisitions(), server.claims()),
            None => {
                let acquisitions = self.store.acquisitions();
                (acquisitions.clone(), acquisitions)
            }
        };
        let counts = &mut self.report.counts;
        let stats = self.stats.lock().unwrap();
        (counts.late_commits, counts.duplicates) = (stats.late_commits, stats.duplicates);
        drop(stats);
        counts.ttl_expiries = self.store.ttl_expiries();
        if let Some(server) = &self.kube {
            (counts.stale_conflicts, counts.recreated) = server.stats();
        }
        Finished {
            seed: self.seed,
            mutant: self.mutant,
            kubernetes: self.kube.is_some(),
            start: self.start,
            log: std::mem::take(&mut *self.log.lock().unwrap()),
            acquisitions,
            claims,
            register: std::mem::take(&mut *self.register.lock().unwrap()),
            margin: self.margin,
            deleted_tokens: self.deleted_tokens,
            term_resets: self.term_resets,
            fence: self.fence,
            history: self.history.map(|h| h.finish()),
            report: self.report,
        }
        .check()
    }
}
