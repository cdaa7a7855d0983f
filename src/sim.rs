//! The deterministic safety simulation: seeded schedules on paused tokio time,
//! several electors on a faulty memory store, a checker, and mutants the
//! checker must catch.
//!
//! Faults per schedule (design.md's scenarios in brackets):
//! * whole-process pauses: the elector's task, its timers and its leader
//!   work stop, often for longer than the safety gap (S1);
//! * per-candidate links with asymmetric latency, sometimes longer than R,
//!   so replies come late (S2) and requests the client gave up on still
//!   commit later (S9, S13); requests delivered twice;
//! * the store clock runs slow or fast within what R/D tolerates, and jumps
//!   backwards and forwards within the safety gap (S3);
//! * store outages, flaky calls, lost replies after commit and unknown
//!   outcomes (S4, S9);
//! * crashes (kill -9: the elector and its leader work stop at once, its
//!   requests in flight may still commit) and a restart under a new
//!   identity (S12, S13); campaigns stopped and resumed (S8);
//! * the lease row deleted under a live lease;
//! * odd seeds run on Redis's expiry semantics (the lease key vanishes at its
//!   TTL, the counter keeping term and token survives), even seeds on the
//!   SQL stores' (the row stays, expiry judged when read or taken).
//!
//! The checker compares what every process believed and wrote with the
//! store's own record of acquisitions (their commit instants on the
//! simulated clock):
//! 1. acquisitions commit with strictly increasing terms and tokens, and
//!    every term a process believed it led was granted to it, with that token;
//! 2. every interval in which a process believes it leads
//!    ([`LeaderState::is_leader_at`](crate::lease::LeaderState::is_leader_at))
//!    ends no later than the commit of the next term;
//! 3. every write the fenced register accepted was issued no later than
//!    the commit of the next term, unless its writer was paused between its
//!    leadership check and the write for longer than the margin (the
//!    documented pause case fencing tokens exist for). Writes the register
//!    rejected did no harm.
//!
//! 4. in schedules with the version fence (half of them), leadership never
//!    moves back: the revisions of acquisitions never decrease in commit
//!    order, while candidates restart under older and newer revisions, as
//!    pods of two ReplicaSets do during a rollout.
//!
//! The only excuse besides that pause: a term whose row was deleted under
//! its live lease (an operator overriding the store) is exempt from 2 and 3.
//!
//! Sessions and lock sets have a schedule of their own ([`sessions`]), and
//! so do rolling updates with a version preference ([`rollout`]).

mod rollout;
mod sessions;

pub use rollout::simulate_rollouts;
pub use sessions::simulate_sessions;

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::future::Future;
use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use futures::future::BoxFuture;
use rand::{RngExt, SeedableRng, rngs::StdRng};
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::lease::elector::{Flaw, SimHooks, TaskWrapper};
use crate::lease::{
    Claim, Elector, ElectorHandle, FencingToken, Grant, Identity, LeaderContext, LeaderState, LeaseStore, Observation,
    StoreError, StoreTime, Timing,
};
use crate::store::memory::{Acquisition, grant};
use crate::store::{Faults, MemoryStore};

/// `leasehold simulate`: run many seeds, print failures with their seed.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Number of seeds to run.
    #[arg(long, env = "LEASEHOLD_SIM_SEEDS", default_value_t = 1000)]
    pub seeds: u64,
    /// First seed.
    #[arg(long, env = "LEASEHOLD_SIM_FIRST_SEED", default_value_t = 0)]
    pub first_seed: u64,
    /// Simulated seconds per schedule.
    #[arg(long, env = "LEASEHOLD_SIM_SECONDS", default_value_t = 60)]
    pub seconds: u64,
    /// Print every event of each schedule (use with a single seed to replay).
    #[arg(long, env = "LEASEHOLD_SIM_VERBOSE")]
    pub verbose: bool,
    /// Run the sessions-and-lock-sets schedule instead of the elector's.
    #[arg(long, env = "LEASEHOLD_SIM_SESSIONS", conflicts_with = "rollouts")]
    pub sessions: bool,
    /// Run the rolling-update schedule (versions and `Newest`/`Oldest`)
    /// instead of the elector's.
    #[arg(long, env = "LEASEHOLD_SIM_ROLLOUTS")]
    pub rollouts: bool,
    /// Run a deliberately broken elector or store instead, stopping at the
    /// first seed that catches it; `list` names them.
    #[arg(long, env = "LEASEHOLD_SIM_MUTANT")]
    pub mutant: Option<String>,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let length = Duration::from_secs(args.seconds);
    let seeds = args.first_seed..args.first_seed + args.seeds;
    if let Some(name) = &args.mutant {
        if name == "list" {
            for mutant in Mutant::ALL {
                println!("{:<38} {}", mutant.name(), mutant.describe());
            }
            return Ok(());
        }
        let mutant: Mutant = name.parse()?;
        return match hunt(mutant, seeds, length) {
            Some(violation) => {
                println!("{violation}");
                println!("mutant {} caught by seed {}", mutant.name(), violation.seed);
                Ok(())
            }
            None => anyhow::bail!("mutant {} survived {} seeds", mutant.name(), args.seeds),
        };
    }
    let mut totals = Summary::default();
    let mut failed = Vec::new();
    for seed in seeds {
        let outcome = if args.sessions {
            simulate_sessions(seed, length)
        } else if args.rollouts {
            simulate_rollouts(seed, length)
        } else {
            simulate(seed, length)
        };
        match outcome {
            Ok(report) => {
                if args.verbose {
                    println!("{report}");
                }
                totals.add(&report);
            }
            Err(violation) => {
                println!("{violation}");
                failed.push(seed);
            }
        }
    }
    println!("{} seeds, {} failed; {totals}", args.seeds, failed.len());
    if !failed.is_empty() {
        anyhow::bail!("safety violated for seeds {failed:?}; replay one with --first-seed N --seeds 1 --verbose");
    }
    Ok(())
}

/// A deliberately broken elector or store: each breaks one safety rule,
/// and the checker must catch every one (tests/lease/simulation.rs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mutant {
    DeadlineFromReply,
    DeadlineDInsteadOfR,
    RenewWithoutCas,
    UnknownOutcomeAsSuccess,
    FollowerAcquiresOnOwnObservation,
    ReleaseBeforeWorkStopped,
    TokenFromLocalClock,
    SessionRenewWithoutCas,
    SessionRenewedAfterExpiry,
    LockTakenFromLiveSession,
    FenceOnlyInTheElector,
    PartitionExtrasKept,
    LeaderIgnoresStandAside,
    StandAsideForFencedPeers,
}

impl Mutant {
    pub const ALL: [Mutant; 14] = [
        Mutant::DeadlineFromReply,
        Mutant::DeadlineDInsteadOfR,
        Mutant::RenewWithoutCas,
        Mutant::UnknownOutcomeAsSuccess,
        Mutant::FollowerAcquiresOnOwnObservation,
        Mutant::ReleaseBeforeWorkStopped,
        Mutant::TokenFromLocalClock,
        Mutant::SessionRenewWithoutCas,
        Mutant::SessionRenewedAfterExpiry,
        Mutant::LockTakenFromLiveSession,
        Mutant::FenceOnlyInTheElector,
        Mutant::PartitionExtrasKept,
        Mutant::LeaderIgnoresStandAside,
        Mutant::StandAsideForFencedPeers,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Mutant::DeadlineFromReply => "deadline-from-reply",
            Mutant::DeadlineDInsteadOfR => "deadline-D-instead-of-R",
            Mutant::RenewWithoutCas => "renew-without-CAS",
            Mutant::UnknownOutcomeAsSuccess => "unknown-outcome-as-success",
            Mutant::FollowerAcquiresOnOwnObservation => "follower-acquires-on-own-observation",
            Mutant::ReleaseBeforeWorkStopped => "release-before-work-stopped",
            Mutant::TokenFromLocalClock => "token-from-local-clock",
            Mutant::SessionRenewWithoutCas => "session-renew-without-CAS",
            Mutant::SessionRenewedAfterExpiry => "session-renewed-after-expiry",
            Mutant::LockTakenFromLiveSession => "lock-taken-from-live-session",
            Mutant::FenceOnlyInTheElector => "fence-only-in-the-elector",
            Mutant::PartitionExtrasKept => "partition-extras-kept",
            Mutant::LeaderIgnoresStandAside => "leader-ignores-stand-aside",
            Mutant::StandAsideForFencedPeers => "stand-aside-for-fenced-peers",
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            Mutant::DeadlineFromReply => "the leader's deadline is reply + R, not send + R",
            Mutant::DeadlineDInsteadOfR => "the leader's deadline is send + D, not send + R",
            Mutant::RenewWithoutCas => "renew updates the row without checking holder and token",
            Mutant::UnknownOutcomeAsSuccess => "an unknown acquire or renew outcome counts as success",
            Mutant::FollowerAcquiresOnOwnObservation => {
                "acquire writes when the follower's own earlier read looked expired"
            }
            Mutant::ReleaseBeforeWorkStopped => "release before the leader work has stopped",
            Mutant::TokenFromLocalClock => "the fencing token comes from the candidate's clock",
            Mutant::SessionRenewWithoutCas => {
                "session renewal writes the row whatever is there (closed, collected or expired)"
            }
            Mutant::SessionRenewedAfterExpiry => {
                "session renewal does not check expiry: an expired session lives again"
            }
            Mutant::LockTakenFromLiveSession => {
                "a lock is judged free by its own age, while its holder session is still live"
            }
            Mutant::FenceOnlyInTheElector => {
                "the version fence is judged on the follower's own read, not in the acquiring transaction"
            }
            Mutant::PartitionExtrasKept => "a partition member never hands extra partitions over to a new member",
            Mutant::LeaderIgnoresStandAside => {
                "a leader told to stand aside for a preferred version keeps leading; only followers stop"
            }
            Mutant::StandAsideForFencedPeers => {
                "candidates stand aside for a peer of the preferred version that the version fence refuses"
            }
        }
    }

    /// The elector-side bug, when the mutant is one.
    fn flaw(self) -> Option<Flaw> {
        match self {
            Mutant::DeadlineFromReply => Some(Flaw::DeadlineFromReply),
            Mutant::DeadlineDInsteadOfR => Some(Flaw::DeadlineFromLeaseDuration),
            Mutant::UnknownOutcomeAsSuccess => Some(Flaw::UnknownOutcomeAsSuccess),
            Mutant::ReleaseBeforeWorkStopped => Some(Flaw::ReleaseBeforeWorkStopped),
            Mutant::LeaderIgnoresStandAside => Some(Flaw::LeaderIgnoresStandAside),
            Mutant::RenewWithoutCas
            | Mutant::FollowerAcquiresOnOwnObservation
            | Mutant::TokenFromLocalClock
            | Mutant::SessionRenewWithoutCas
            | Mutant::SessionRenewedAfterExpiry
            | Mutant::LockTakenFromLiveSession
            | Mutant::FenceOnlyInTheElector
            | Mutant::PartitionExtrasKept
            | Mutant::StandAsideForFencedPeers => None,
        }
    }
}

impl std::str::FromStr for Mutant {
    type Err = anyhow::Error;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Mutant::ALL
            .into_iter()
            .find(|m| m.name().eq_ignore_ascii_case(name))
            .ok_or_else(|| anyhow::anyhow!("--mutant {name:?} is not one of: list, {}", names()))
    }
}

fn names() -> String {
    Mutant::ALL.map(Mutant::name).join(", ")
}

/// The first seed in `seeds` on which the checker catches `mutant`.
pub fn hunt(mutant: Mutant, seeds: Range<u64>, length: Duration) -> Option<Violation> {
    let setup = Setup {
        length,
        mutant: Some(mutant),
        ..Setup::default()
    };
    seeds.into_iter().find_map(|seed| simulate_with(seed, &setup).err())
}

/// What one schedule did.
#[derive(Debug, Default, Clone)]
pub struct Report {
    pub seed: u64,
    pub counts: Counts,
    pub events: Vec<String>,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for e in &self.events {
            writeln!(f, "{e}")?;
        }
        write!(f, "seed {}: {}", self.seed, self.counts)
    }
}

/// Totals over many seeds.
#[derive(Debug, Default, Clone, Copy)]
pub struct Summary {
    pub seeds: u64,
    pub counts: Counts,
}

impl Summary {
    pub fn add(&mut self, r: &Report) {
        self.seeds += 1;
        self.counts.add(&r.counts);
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.counts.fmt(f)
    }
}

/// What happened in one schedule, or in many added up.
#[derive(Debug, Default, Clone, Copy)]
pub struct Counts {
    pub terms: u64,
    pub accepted: u64,
    pub fenced: u64,
    pub crashes: u64,
    pub long_pauses: u64,
    /// Stale writes accepted from a writer paused past the margin.
    pub excused: u64,
    /// Requests that committed after their client had given up on them.
    pub late_commits: u64,
    pub duplicates: u64,
    pub clock_jumps: u64,
    pub deleted_live: u64,
    /// Schedules run on Redis's TTL expiry (1 or 0 for one schedule).
    pub ttl_seeds: u64,
    /// Leases that vanished at their TTL.
    pub ttl_expiries: u64,
    /// Sessions that expired and were replaced by a new one (sessions schedule).
    pub sessions_replaced: u64,
    /// Schedules run with the version fence (1 or 0 for one schedule).
    pub fenced_schedules: u64,
    /// Acquisitions that moved leadership to a newer revision.
    pub version_moves: u64,
    /// Session schedules whose processes share partitions (1 or 0 for one schedule).
    pub partition_schedules: u64,
    /// Leaders told to stand aside for a preferred version (rollout schedule).
    pub stand_asides: u64,
    /// Rollout schedules whose lease prefers `Newest` (the rest `Oldest`).
    pub newest_schedules: u64,
}

impl Counts {
    fn add(&mut self, r: &Counts) {
        self.terms += r.terms;
        self.accepted += r.accepted;
        self.fenced += r.fenced;
        self.crashes += r.crashes;
        self.long_pauses += r.long_pauses;
        self.excused += r.excused;
        self.late_commits += r.late_commits;
        self.duplicates += r.duplicates;
        self.clock_jumps += r.clock_jumps;
        self.deleted_live += r.deleted_live;
        self.ttl_seeds += r.ttl_seeds;
        self.ttl_expiries += r.ttl_expiries;
        self.sessions_replaced += r.sessions_replaced;
        self.fenced_schedules += r.fenced_schedules;
        self.version_moves += r.version_moves;
        self.partition_schedules += r.partition_schedules;
        self.stand_asides += r.stand_asides;
        self.newest_schedules += r.newest_schedules;
    }
}

impl fmt::Display for Counts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} terms, {} writes accepted, {} stale writes fenced off, {} accepted from writers paused past the margin, \
             {} crashes, {} pauses past the gap, {} late commits, {} duplicated requests, {} store clock jumps, \
             {} rows deleted under a live lease, {} seeds on TTL expiry with {} leases vanished at their TTL, \
             {} sessions replaced after expiry, \
             {} schedules with the version fence, {} moves to a newer version, {} leaders stood aside, \
             {} rollout schedules preferring Newest, {} session schedules sharing partitions",
            self.terms,
            self.accepted,
            self.fenced,
            self.excused,
            self.crashes,
            self.long_pauses,
            self.late_commits,
            self.duplicates,
            self.clock_jumps,
            self.deleted_live,
            self.ttl_seeds,
            self.ttl_expiries,
            self.sessions_replaced,
            self.fenced_schedules,
            self.version_moves,
            self.stand_asides,
            self.newest_schedules,
            self.partition_schedules
        )
    }
}

/// A broken safety property, with the seed that replays it.
#[derive(Debug, Clone)]
pub struct Violation {
    pub seed: u64,
    pub mutant: Option<Mutant>,
    pub what: String,
    pub events: Vec<String>,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let tail = self.events.len().saturating_sub(40);
        for e in &self.events[tail..] {
            writeln!(f, "  {e}")?;
        }
        let mutant = self
            .mutant
            .map(|m| format!(" --mutant {}", m.name()))
            .unwrap_or_default();
        write!(
            f,
            "seed {}: {} (replay: leasehold simulate --first-seed {} --seeds 1 --verbose{mutant})",
            self.seed, self.what, self.seed
        )
    }
}

impl std::error::Error for Violation {}

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
}

impl Default for Setup {
    fn default() -> Self {
        Setup {
            length: Duration::from_secs(60),
            drift: -0.5..0.6,
            mutant: None,
        }
    }
}

const LOCK: &str = "simulated";

/// Runs one seeded schedule of the correct elector.
pub fn simulate(seed: u64, length: Duration) -> Result<Report, Violation> {
    simulate_with(
        seed,
        &Setup {
            length,
            ..Setup::default()
        },
    )
}

/// Runs one seeded schedule on its own paused current-thread runtime.
pub fn simulate_with(seed: u64, setup: &Setup) -> Result<Report, Violation> {
    let runtime = paused_runtime();
    let setup = setup.clone();
    // Built inside the runtime so every instant is on the paused clock.
    runtime.block_on(async move {
        let schedule = Schedule::new(seed, &setup);
        match setup.mutant {
            Some(mutant) if sessions::is_session_mutant(mutant) => schedule.run_sessions(setup.length).await,
            Some(Mutant::LeaderIgnoresStandAside | Mutant::StandAsideForFencedPeers) => {
                schedule.run_rollout(setup.length).await
            }
            _ => schedule.run(setup.length).await,
        }
    })
}

/// A current-thread runtime on paused time: schedules replay exactly.
fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime builds")
}

/// A process-pause switch: while on, none of the process's tasks run.
#[derive(Clone)]
struct Pause(watch::Sender<bool>);

impl Pause {
    fn new() -> Self {
        Pause(watch::channel(false).0)
    }

    /// `task`, polled only while the process is not paused: its timers fire
    /// late and it sees the time jump, as after SIGSTOP/SIGCONT.
    async fn pausable(self, task: impl Future<Output = ()>) {
        let mut task = std::pin::pin!(task);
        let mut paused = self.0.subscribe();
        loop {
            let _ = paused.wait_for(|p| !p).await;
            tokio::select! {
                biased;
                _ = paused.wait_for(|p| *p) => {}
                () = &mut task => return,
            }
        }
    }

    fn wrapper(&self) -> TaskWrapper {
        let pause = self.clone();
        Arc::new(move |task: BoxFuture<'static, ()>| Box::pin(pause.clone().pausable(task)))
    }
}

/// One candidate's network link: latency each way, duplicated requests.
#[derive(Debug, Clone, Copy, Default)]
struct LinkFaults {
    to_store: Duration,
    from_store: Duration,
    duplicate: f64,
}

/// Counters the links share with the schedule.
#[derive(Default)]
struct LinkStats {
    late_commits: u64,
    duplicates: u64,
}

/// The candidate's connection to the store. A request, once sent, is on its
/// own: it reaches the store and commits even if the client gave up or
/// crashed meanwhile; the client sees the reply `from_store` later. The
/// mutant stores live here too, since they are wrong ways to talk to it.
struct Link {
    store: MemoryStore,
    faults: Arc<Mutex<LinkFaults>>,
    rng: Arc<Mutex<StdRng>>,
    stats: Arc<Mutex<LinkStats>>,
    mutant: Option<Mutant>,
    /// The candidate's wall clock, for the token-from-local-clock mutant.
    local_clock: StoreTime,
    started: Instant,
}

impl Link {
    async fn send<T: Send + 'static>(
        &self,
        write: bool,
        request: impl Fn(MemoryStore) -> BoxFuture<'static, Result<T, StoreError>> + Send + Sync + 'static,
    ) -> Result<T, StoreError> {
        let faults = *self.faults.lock().unwrap();
        let (reply_tx, reply_rx) = oneshot::channel();
        let request = Arc::new(request);
        let (store, stats, first) = (self.store.clone(), self.stats.clone(), request.clone());
        tokio::spawn(async move {
            tokio::time::sleep(faults.to_store).await;
            let outcome = first(store).await;
            let committed = outcome.is_ok();
            if reply_tx.send(outcome).is_err() && write && committed {
                stats.lock().unwrap().late_commits += 1;
            }
        });
        if faults.duplicate > 0.0 && self.rng.lock().unwrap().random_bool(faults.duplicate) {
            self.stats.lock().unwrap().duplicates += 1;
            let again = faults.to_store * 2 + Duration::from_millis(self.rng.lock().unwrap().random_range(0..200));
            let store = self.store.clone();
            tokio::spawn(async move {
                tokio::time::sleep(again).await;
                let _ = request(store).await;
            });
        }
        let reply = reply_rx
            .await
            .unwrap_or_else(|_| Err(StoreError::outcome_unknown("request lost")));
        tokio::time::sleep(faults.from_store).await;
        reply
    }

    fn local_now(&self) -> FencingToken {
        FencingToken(self.local_clock.saturating_add(self.started.elapsed()).0)
    }
}

#[async_trait]
impl LeaseStore for Link {
    fn kind(&self) -> &'static str {
        "simulated"
    }

    async fn ensure_schema(&self) -> Result<(), StoreError> {
        Ok(())
    }

    async fn observe(&self, lock: &str) -> Result<Observation, StoreError> {
        let lock = lock.to_string();
        self.send(false, move |store| {
            let lock = lock.clone();
            Box::pin(async move { store.observe(&lock).await })
        })
        .await
    }

    async fn acquire_as(&self, lock: &str, claim: &Claim<'_>, lease: Duration) -> Result<Grant, StoreError> {
        let (lock, holder) = (lock.to_string(), claim.holder.to_string());
        // The mutant leaves the fence to the elector's own earlier read.
        let fence = claim.fence && self.mutant != Some(Mutant::FenceOnlyInTheElector);
        let version = claim.version.cloned();
        match self.mutant {
            Some(Mutant::FollowerAcquiresOnOwnObservation) => {
                // Judges expiry on its own read, then writes blindly.
                let seen = self.observe(&lock).await?;
                if let Some(current) = seen.live_holder() {
                    return Err(StoreError::Lost {
                        lock,
                        reason: format!("held by {current}"),
                    });
                }
                self.send(true, move |store| {
                    let (lock, holder, seen, version) = (lock.clone(), holder.clone(), seen.clone(), version.clone());
                    Box::pin(async move {
                        let claim = Claim {
                            holder: &holder,
                            version: version.as_ref(),
                            fence,
                        };
                        store
                            .transact_unchecked(&lock, |_row, commit| {
                                grant(
                                    &lock,
                                    &claim,
                                    lease,
                                    seen.record.as_ref(),
                                    seen.now,
                                    FencingToken(commit.0),
                                )
                            })
                            .await
                    })
                })
                .await
            }
            Some(Mutant::TokenFromLocalClock) => {
                let token = self.local_now();
                self.send(true, move |store| {
                    let (lock, holder, version) = (lock.clone(), holder.clone(), version.clone());
                    Box::pin(async move {
                        let claim = Claim {
                            holder: &holder,
                            version: version.as_ref(),
                            fence,
                        };
                        store
                            .transact_unchecked(&lock, |row, commit| grant(&lock, &claim, lease, row, commit, token))
                            .await
                    })
                })
                .await
            }
            _ => {
                self.send(true, move |store| {
                    let (lock, holder, version) = (lock.clone(), holder.clone(), version.clone());
                    Box::pin(async move {
                        let claim = Claim {
                            holder: &holder,
                            version: version.as_ref(),
                            fence,
                        };
                        store.acquire_as(&lock, &claim, lease).await
                    })
                })
                .await
            }
        }
    }

    async fn renew(&self, lock: &str, holder: &str, token: FencingToken, lease: Duration) -> Result<Grant, StoreError> {
        let (lock, holder) = (lock.to_string(), holder.to_string());
        if self.mutant == Some(Mutant::RenewWithoutCas) {
            return self
                .send(true, move |store| {
                    let lock = lock.clone();
                    Box::pin(async move {
                        store
                            .transact_unchecked(&lock, |row, commit| {
                                let row = row.cloned().ok_or_else(|| StoreError::Lost {
                                    lock: lock.clone(),
                                    reason: "no such lease".into(),
                                })?;
                                let term = row.term;
                                let renewed = crate::lease::LeaseRecord {
                                    renewed_at: Some(commit),
                                    lease_duration: lease,
                                    ..row
                                };
                                Ok((
                                    Some(renewed),
                                    Grant {
                                        term,
                                        token,
                                        committed_at: commit,
                                    },
                                ))
                            })
                            .await
                    })
                })
                .await;
        }
        self.send(true, move |store| {
            let (lock, holder) = (lock.clone(), holder.clone());
            Box::pin(async move { store.renew(&lock, &holder, token, lease).await })
        })
        .await
    }

    async fn release(&self, lock: &str, holder: &str, token: FencingToken) -> Result<(), StoreError> {
        let (lock, holder) = (lock.to_string(), holder.to_string());
        self.send(true, move |store| {
            let (lock, holder) = (lock.clone(), holder.clone());
            Box::pin(async move { store.release(&lock, &holder, token).await })
        })
        .await
    }
}

/// One write a leader's work issued with its token.
#[derive(Debug, Clone)]
struct Write {
    writer: String,
    token: FencingToken,
    /// When the worker last checked it still led.
    checked: Instant,
    /// How long the write takes by itself, without pauses.
    latency: Duration,
    issued: Instant,
}

/// The downstream system leaders write to, guarded by the fencing token:
/// it accepts a token >= the highest it has seen.
#[derive(Default)]
struct FencedRegister {
    highest: Option<FencingToken>,
    accepted: Vec<Write>,
    rejected: u64,
}

impl FencedRegister {
    fn write(&mut self, write: Write) {
        if self.highest.is_some_and(|highest| write.token < highest) {
            self.rejected += 1;
        } else {
            self.highest = Some(write.token);
            self.accepted.push(write);
        }
    }
}

/// One published belief of one candidate.
#[derive(Debug, Clone)]
struct Belief {
    who: String,
    from: Instant,
    until: Instant,
    term: u64,
    token: Option<FencingToken>,
}

struct Candidate {
    name: String,
    /// Its identity, as beliefs and acquisitions name it.
    who: String,
    version: crate::lease::Version,
    handle: ElectorHandle,
    pause: Pause,
    link: Arc<Mutex<LinkFaults>>,
    shutdown: CancellationToken,
}

#[derive(Default)]
struct Log {
    events: Vec<String>,
    beliefs: Vec<Belief>,
}

impl Log {
    fn end_beliefs(&mut self, who: &str, at: Instant) {
        for belief in self.beliefs.iter_mut().filter(|b| b.who == who) {
            belief.until = belief.until.min(at);
        }
    }
}

struct Schedule {
    seed: u64,
    rng: StdRng,
    store: MemoryStore,
    mutant: Option<Mutant>,
    clock_rate: f64,
    timing: Timing,
    /// The largest forward jump of the store clock, in store time.
    max_jump: Duration,
    last_forward_jump: Option<Instant>,
    /// Local time from a leader's deadline to the earliest commit of the
    /// next term, whatever the clock faults do: what stale writes must beat.
    margin: Duration,
    start: Instant,
    log: Arc<Mutex<Log>>,
    register: Arc<Mutex<FencedRegister>>,
    links: Arc<Mutex<StdRng>>,
    stats: Arc<Mutex<LinkStats>>,
    /// Terms whose row was deleted while their lease was live.
    deleted_terms: HashSet<u64>,
    restarts: u64,
    /// The version fence is on in this schedule.
    fence: bool,
    /// The newest revision so far: a rollout raises it; candidates start
    /// under it or one below (an old pod still around).
    revision: u64,
    report: Report,
}

impl Schedule {
    fn new(seed: u64, setup: &Setup) -> Self {
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
        let max_jump = Duration::from_secs_f64(left / 2.0);
        let margin = Duration::from_secs_f64(left / 2.0 / clock_rate);
        Schedule {
            seed,
            store: MemoryStore::new(rng.random())
                .with_clock_start(StoreTime(1_700_000_000_000_000_000))
                .with_clock_rate(clock_rate)
                .with_ttl_expiry(seed % 2 == 1),
            mutant: setup.mutant,
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
            deleted_terms: HashSet::new(),
            restarts: 0,
            fence: false,
            revision: 2,
            report: Report {
                seed,
                counts: Counts {
                    ttl_seeds: seed % 2,
                    ..Counts::default()
                },
                ..Default::default()
            },
        }
    }

    fn note(&self, what: String) {
        let at = self.start.elapsed().as_millis();
        self.log.lock().unwrap().events.push(format!("{at:>7}ms {what}"));
    }

    fn start_candidate(&mut self, slot: usize) -> Candidate {
        self.start_candidate_at(slot, None)
    }

    /// A candidate in `slot`, of `revision` or (`None`) the newest so far or
    /// one below.
    fn start_candidate_at(&mut self, slot: usize, revision: Option<u64>) -> Candidate {
        self.restarts += 1;
        let name = format!("c{slot}");
        let identity = Identity::with_nonce(&name, format!("run{}", self.restarts));
        let who = identity.to_string();
        let pause = Pause::new();
        let shutdown = CancellationToken::new();
        let link_faults = Arc::new(Mutex::new(LinkFaults::default()));
        // Pod clocks are off by up to ± 2 D (only the token mutant reads them).
        let skew = self.timing.lease_duration.as_nanos() as i64 * self.rng.random_range(-2_000..=2_000) / 1_000;
        let store = Arc::new(Link {
            store: self.store.clone(),
            faults: link_faults.clone(),
            rng: self.links.clone(),
            stats: self.stats.clone(),
            mutant: self.mutant,
            local_clock: StoreTime(1_700_000_000_000_000_000 + skew),
            started: self.start,
        });
        let register = self.register.clone();
        // Each write takes up to an eighth of the margin by itself.
        let write_latency = self.margin / 8;
        let writer = who.clone();
        let hooks = SimHooks {
            flaw: self.mutant.and_then(Mutant::flaw),
            wrap: Some(pause.wrapper()),
        };
        let revision = revision.unwrap_or_else(|| self.revision - u64::from(self.rng.random_bool(0.4)));
        let version = crate::lease::Version {
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
        self.note(format!("start {who} at revision {revision}"));
        Candidate {
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
    fn watch_beliefs(&self, who: String, mut rx: watch::Receiver<LeaderState>) {
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

    async fn run(mut self, length: Duration) -> Result<Report, Violation> {
        let slots = self.rng.random_range(2..=5);
        self.fence = self.rng.random_bool(0.5);
        self.report.counts.fenced_schedules = u64::from(self.fence);
        self.note(format!(
            "{slots} candidates, {:?}, store clock rate {:.3}, forward jumps up to {:?}, margin {:?}, fence {}, mutant {:?}",
            self.timing, self.clock_rate, self.max_jump, self.margin, self.fence, self.mutant
        ));
        let mut candidates: Vec<Candidate> = (0..slots).map(|i| self.start_candidate(i)).collect();
        let end = self.start + length;
        while Instant::now() < end {
            tokio::time::sleep(Duration::from_millis(self.rng.random_range(100..1500))).await;
            self.inject(&mut candidates).await;
        }
        self.store.set_faults(Faults::default());
        for c in &candidates {
            *c.link.lock().unwrap() = LinkFaults::default();
            c.pause.0.send_replace(false);
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
    async fn inject(&mut self, candidates: &mut [Candidate]) {
        let i = self.rng.random_range(0..candidates.len());
        let arm = self.rng.random_range(0..14);
        let links: Vec<_> = candidates.iter().map(|c| c.link.clone()).collect();
        let (name, pause) = (candidates[i].name.clone(), candidates[i].pause.clone());
        if self.inject_fault(arm, &name, &pause, &links, i) {
            return;
        }
        match arm {
            7 => {
                self.note(format!("crash {} (kill -9)", candidates[i].name));
                self.report.counts.crashes += 1;
                candidates[i].handle.abort();
                candidates[i].pause.0.send_replace(false);
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
            // Rare: it exempts the term it cuts short from the checker.
            10 if self.rng.random_bool(0.25) => {
                let deleted = self.store.delete_row(LOCK);
                match deleted.live_holder().and(deleted.record.as_ref().map(|r| r.term)) {
                    Some(term) => {
                        self.deleted_terms.insert(term);
                        self.report.counts.deleted_live += 1;
                        self.note(format!("row deleted under the live lease of term {term}"));
                    }
                    None => self.note("row deleted".into()),
                }
            }
            _ => {}
        }
    }

    /// The faults every schedule shares, by `arm`: store outages, latency
    /// and flakiness, a repair, the link of process `i` (named `name`,
    /// paused by `pause`; `links` are everyone's), a pause, a store clock
    /// jump. False for any other arm.
    fn inject_fault(
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
                self.store.set_faults(Faults {
                    down: true,
                    ..Default::default()
                });
            }
            1 => {
                let latency = renew.mul_f64(self.rng.random_range(0.1..0.8));
                self.note(format!("store latency {latency:?} each way"));
                self.store.set_faults(Faults {
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
                self.store.set_faults(faults);
            }
            3 => {
                self.note("store and links healthy".into());
                self.store.set_faults(Faults::default());
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
                pause.0.send_replace(true);
                let pause = pause.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(length).await;
                    pause.0.send_replace(false);
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
            }
            _ => return false,
        }
        true
    }

    fn check(mut self) -> Result<Report, Violation> {
        let mut log = std::mem::take(&mut *self.log.lock().unwrap());
        let acquisitions: Vec<Acquisition> = self.store.acquisitions();
        log.events.extend(acquisitions.iter().map(|a| {
            format!(
                "{:>7}ms store committed term {} for {} token {:?}",
                (a.at - self.start).as_millis(),
                a.term,
                a.holder,
                a.token
            )
        }));
        let (seed, mutant) = (self.seed, self.mutant);
        let fail = |what: String| Violation {
            seed,
            mutant,
            what,
            events: log.events.clone(),
        };
        let start = self.start;
        let at = |instant: Instant| (instant - start).as_millis();
        // 1. Terms and tokens strictly increase in commit order.
        for pair in acquisitions.windows(2) {
            let (a, b) = (&pair[0], &pair[1]);
            if b.term <= a.term || b.token <= a.token {
                return Err(fail(format!(
                    "term {} (token {:?}, {}) committed at {}ms after term {} (token {:?}, {}): terms and tokens must strictly increase",
                    b.term,
                    b.token,
                    b.holder,
                    at(b.at),
                    a.term,
                    a.token,
                    a.holder
                )));
            }
        }
        // 4. With the fence, revisions never decrease in commit order.
        for pair in acquisitions.windows(2) {
            let (a, b) = (&pair[0], &pair[1]);
            if b.revision > a.revision {
                self.report.counts.version_moves += 1;
            }
            if self.fence && b.revision < a.revision {
                return Err(fail(format!(
                    "term {} ({}) at revision {:?} committed at {}ms after term {} ({}) at revision {:?}: with the \
                     version fence leadership must never move to an older version",
                    b.term,
                    b.holder,
                    b.revision,
                    at(b.at),
                    a.term,
                    a.holder,
                    a.revision
                )));
            }
        }
        let by_term: BTreeMap<u64, usize> = acquisitions.iter().enumerate().map(|(i, a)| (a.term, i)).collect();
        let next_commit = |i: usize| acquisitions.get(i + 1).map(|a| a.at);
        // 2. Every belief was granted, and ends by the next term's commit.
        let mut beliefs = log.beliefs.clone();
        beliefs.retain(|b| b.until > b.from);
        for b in &beliefs {
            let Some(&i) = by_term.get(&b.term) else {
                return Err(fail(format!(
                    "{} believed it led term {} from {}ms, which the store never granted",
                    b.who,
                    b.term,
                    at(b.from)
                )));
            };
            let granted = &acquisitions[i];
            if granted.holder != b.who || granted.token != b.token {
                return Err(fail(format!(
                    "{} believed it led term {} with token {:?}; the store granted it to {} with token {:?}",
                    b.who, b.term, b.token, granted.holder, granted.token
                )));
            }
            if let Some(next) = next_commit(i)
                && b.until > next
                && !self.deleted_terms.contains(&b.term)
            {
                return Err(fail(format!(
                    "{} believed it led term {} until {}ms, after term {} committed at {}ms",
                    b.who,
                    b.term,
                    at(b.until),
                    acquisitions[i + 1].term,
                    at(next)
                )));
            }
        }
        // 3. Accepted writes were issued by the next term's commit, or by a
        //    writer paused past the margin between its check and the write.
        let register = self.register.lock().unwrap();
        let token_index: BTreeMap<Option<FencingToken>, usize> =
            acquisitions.iter().enumerate().map(|(i, a)| (a.token, i)).collect();
        for w in &register.accepted {
            let Some(&i) = token_index.get(&Some(w.token)) else {
                return Err(fail(format!(
                    "{} wrote at {}ms with token {}, which the store never granted",
                    w.writer,
                    at(w.issued),
                    w.token
                )));
            };
            let Some(next) = next_commit(i) else { continue };
            if w.issued <= next || self.deleted_terms.contains(&acquisitions[i].term) {
                continue;
            }
            // Stale from a correct elector means issued − checked > margin,
            // so only a pause longer than margin − latency can explain it.
            let paused = (w.issued - w.checked).saturating_sub(w.latency);
            if paused > self.margin.saturating_sub(w.latency) {
                self.report.counts.excused += 1;
                continue;
            }
            return Err(fail(format!(
                "{} wrote with token {} (term {}) at {}ms, after term {} committed at {}ms; it checked at {}ms and was paused {paused:?} (margin {:?})",
                w.writer,
                w.token,
                acquisitions[i].term,
                at(w.issued),
                acquisitions[i + 1].term,
                at(next),
                at(w.checked),
                self.margin
            )));
        }
        if beliefs.is_empty() {
            return Err(fail("nobody ever led: the schedule tested nothing".into()));
        }
        let stats = self.stats.lock().unwrap();
        self.report.counts.terms = beliefs.iter().map(|b| b.term).collect::<HashSet<_>>().len() as u64;
        self.report.counts.accepted = register.accepted.len() as u64;
        self.report.counts.fenced = register.rejected;
        self.report.counts.late_commits = stats.late_commits;
        self.report.counts.duplicates = stats.duplicates;
        self.report.counts.ttl_expiries = self.store.ttl_expiries();
        self.report.events = log.events;
        drop(register);
        drop(stats);
        Ok(self.report)
    }
}
