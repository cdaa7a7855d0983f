//! The deterministic safety simulation: seeded schedules on paused tokio time,
//! several electors on a faulty memory store, and a checker.
//!
//! Faults per schedule: a store clock running fast within the drift R/D
//! tolerates (S3), store outages, latency spikes longer than R (late
//! replies, S2), lost replies after commit and unknown outcomes (S9),
//! process pauses longer than the safety gap (S1), crashes with a restart
//! under a new identity (S12, S13), and campaigns stopped and resumed.
//!
//! The checker asserts:
//! 1. no two candidates believe they lead at the same simulated instant,
//!    where "believe" is [`LeaderState::is_leader_at`] (leader flag and
//!    within the local deadline) — strict, with no exception;
//! 2. the fenced register never accepts a token lower than one it already
//!    accepted, and every write it rejected came from a worker that was
//!    paused between its last check and the write (the documented pause
//!    case the fencing token exists for);
//! 3. tokens strictly increase with the term, and a term has one holder.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use rand::{RngExt, SeedableRng, rngs::StdRng};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::lease::{
    Elector, ElectorHandle, FencingToken, Grant, Identity, LeaderContext, LeaseStore, Observation, StoreError,
    StoreTime, Timing,
};
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
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let mut totals = Summary::default();
    let mut failed = Vec::new();
    for seed in args.first_seed..args.first_seed + args.seeds {
        match simulate(seed, Duration::from_secs(args.seconds)) {
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
    println!(
        "{} seeds, {} failed; {} terms, {} writes accepted, {} stale writes fenced off, {} crashes, {} pauses past the gap",
        args.seeds,
        failed.len(),
        totals.terms,
        totals.accepted,
        totals.fenced,
        totals.crashes,
        totals.long_pauses
    );
    if !failed.is_empty() {
        anyhow::bail!("safety violated for seeds {failed:?}; replay one with --first-seed N --seeds 1 --verbose");
    }
    Ok(())
}

/// What one schedule did.
#[derive(Debug, Default, Clone)]
pub struct Report {
    pub seed: u64,
    pub terms: u64,
    pub accepted: u64,
    pub fenced: u64,
    pub crashes: u64,
    pub long_pauses: u64,
    pub events: Vec<String>,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for e in &self.events {
            writeln!(f, "{e}")?;
        }
        write!(
            f,
            "seed {}: {} terms, {} writes accepted, {} fenced off, {} crashes, {} long pauses",
            self.seed, self.terms, self.accepted, self.fenced, self.crashes, self.long_pauses
        )
    }
}

/// Totals over many seeds.
#[derive(Debug, Default, Clone, Copy)]
pub struct Summary {
    pub seeds: u64,
    pub terms: u64,
    pub accepted: u64,
    pub fenced: u64,
    pub crashes: u64,
    pub long_pauses: u64,
}

impl Summary {
    pub fn add(&mut self, r: &Report) {
        self.seeds += 1;
        self.terms += r.terms;
        self.accepted += r.accepted;
        self.fenced += r.fenced;
        self.crashes += r.crashes;
        self.long_pauses += r.long_pauses;
    }
}

/// A broken safety property, with the seed that replays it.
#[derive(Debug, Clone)]
pub struct Violation {
    pub seed: u64,
    pub what: String,
    pub events: Vec<String>,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let tail = self.events.len().saturating_sub(40);
        for e in &self.events[tail..] {
            writeln!(f, "  {e}")?;
        }
        write!(
            f,
            "seed {}: {} (replay: leasehold simulate --first-seed {} --seeds 1 --verbose)",
            self.seed, self.what, self.seed
        )
    }
}

impl std::error::Error for Violation {}

const LOCK: &str = "simulated";

/// Runs one seeded schedule on its own paused current-thread runtime.
pub fn simulate(seed: u64, length: Duration) -> Result<Report, Violation> {
    simulate_with_drift(seed, length, 0.0..0.9)
}

/// Like [`simulate`], with the store clock's excess rate drawn from
/// `drift` times what R/D tolerates; above 1.0 safety is not promised, which
/// shows the checker can see a violation.
pub fn simulate_with_drift(seed: u64, length: Duration, drift: std::ops::Range<f64>) -> Result<Report, Violation> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime builds");
    // Built inside the runtime so every instant is on the paused clock.
    runtime.block_on(async move { Schedule::new(seed, drift).run(length).await })
}

/// A process-pause switch shared by a candidate's store connection and its
/// worker: while paused, neither gets anything done.
#[derive(Clone)]
struct Pause(watch::Sender<bool>);

impl Pause {
    fn new() -> Self {
        Pause(watch::channel(false).0)
    }

    /// Waits while paused; true when it had to wait.
    async fn wait_resumed(&self) -> bool {
        let mut rx = self.0.subscribe();
        let was_paused = *rx.borrow();
        let _ = rx.wait_for(|paused| !paused).await;
        was_paused
    }
}

/// The candidate's view of the store: a paused process neither sends nor
/// reads replies, so every call waits on both sides of the store.
struct PausableStore {
    inner: MemoryStore,
    pause: Pause,
}

#[async_trait]
impl LeaseStore for PausableStore {
    fn kind(&self) -> &'static str {
        "simulated"
    }
    async fn ensure_schema(&self) -> Result<(), StoreError> {
        Ok(())
    }
    async fn observe(&self, lock: &str) -> Result<Observation, StoreError> {
        self.pause.wait_resumed().await;
        let r = self.inner.observe(lock).await;
        self.pause.wait_resumed().await;
        r
    }
    async fn acquire(&self, lock: &str, holder: &str, lease: Duration) -> Result<Grant, StoreError> {
        self.pause.wait_resumed().await;
        let r = self.inner.acquire(lock, holder, lease).await;
        self.pause.wait_resumed().await;
        r
    }
    async fn renew(&self, lock: &str, holder: &str, token: FencingToken, lease: Duration) -> Result<Grant, StoreError> {
        self.pause.wait_resumed().await;
        let r = self.inner.renew(lock, holder, token, lease).await;
        self.pause.wait_resumed().await;
        r
    }
    async fn release(&self, lock: &str, holder: &str, token: FencingToken) -> Result<(), StoreError> {
        self.pause.wait_resumed().await;
        let r = self.inner.release(lock, holder, token).await;
        self.pause.wait_resumed().await;
        r
    }
}

/// The downstream system leaders write to, guarded by the fencing token.
#[derive(Default)]
struct FencedRegister {
    highest: Option<FencingToken>,
    accepted: u64,
    rejected: Vec<(String, FencingToken, bool)>,
    violations: Vec<String>,
}

impl FencedRegister {
    fn write(&mut self, writer: &str, token: FencingToken, paused_before_write: bool) {
        match self.highest {
            Some(highest) if token < highest => self.rejected.push((writer.to_string(), token, paused_before_write)),
            _ => {
                if self.highest.is_some_and(|h| token < h) {
                    self.violations
                        .push(format!("register accepted {token} after {:?}", self.highest));
                }
                self.highest = Some(token);
                self.accepted += 1;
            }
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
    handle: ElectorHandle,
    pause: Pause,
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
    clock_rate: f64,
    timing: Timing,
    start: Instant,
    log: Arc<Mutex<Log>>,
    register: Arc<Mutex<FencedRegister>>,
    restarts: u64,
    report: Report,
}

impl Schedule {
    fn new(seed: u64, drift: std::ops::Range<f64>) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        let lease = Duration::from_millis(rng.random_range(800..=2000));
        let renew = lease.mul_f64(rng.random_range(0.5..0.85));
        let retry = renew.mul_f64(rng.random_range(0.1..0.3));
        let timing = Timing::new(lease, renew, retry, rng.random_range(0.0..0.3)).expect("valid generated timing");
        // The store's clock runs fast (S3): leases expire sooner than the
        // candidates' own clocks say. R/D bounds the tolerated drift.
        let tolerated = lease.as_secs_f64() / renew.as_secs_f64() - 1.0;
        let clock_rate = 1.0 + rng.random_range(drift) * tolerated;
        Schedule {
            seed,
            store: MemoryStore::new(rng.random())
                .with_clock_start(StoreTime(1_700_000_000_000_000_000))
                .with_clock_rate(clock_rate),
            clock_rate,
            rng,
            timing,
            start: Instant::now(),
            log: Arc::default(),
            register: Arc::default(),
            restarts: 0,
            report: Report {
                seed,
                ..Default::default()
            },
        }
    }

    fn note(&self, what: String) {
        let at = self.start.elapsed().as_millis();
        self.log.lock().unwrap().events.push(format!("{at:>7}ms {what}"));
    }

    fn start_candidate(&mut self, slot: usize) -> Candidate {
        self.restarts += 1;
        let name = format!("c{slot}");
        let identity = Identity::with_nonce(&name, format!("run{}", self.restarts));
        let who = identity.to_string();
        let pause = Pause::new();
        let shutdown = CancellationToken::new();
        let store = Arc::new(PausableStore {
            inner: self.store.clone(),
            pause: pause.clone(),
        });
        let register = self.register.clone();
        let worker_pause = pause.clone();
        let writer = who.clone();
        let handle = Elector::new(LOCK, identity, self.timing)
            .with_seed(self.rng.random())
            .spawn_with_work(store, shutdown.clone(), move |ctx: LeaderContext| {
                let (register, pause, writer) = (register.clone(), worker_pause.clone(), writer.clone());
                async move {
                    // Leader work: check, then write with the token, every 50 ms.
                    while ctx.still_leading() {
                        let paused = pause.wait_resumed().await;
                        register.lock().unwrap().write(&writer, ctx.token, paused);
                        tokio::select! {
                            _ = ctx.cancelled.cancelled() => break,
                            _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                        }
                    }
                }
            });
        self.watch_beliefs(who.clone(), handle.subscribe());
        self.note(format!("start {who}"));
        Candidate {
            name,
            handle,
            pause,
            shutdown,
        }
    }

    /// Records every interval during which a candidate believed it led.
    fn watch_beliefs(&self, who: String, mut rx: watch::Receiver<crate::lease::LeaderState>) {
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
                    if let Some(deadline) = state.deadline.filter(|_| state.leader) {
                        // Believes it leads from now until its deadline, unless a
                        // later publication cuts the belief short.
                        entries.beliefs.push(Belief {
                            who: who.clone(),
                            from: now,
                            until: deadline,
                            term: state.term,
                            token: state.token,
                        });
                    } else {
                        entries.end_beliefs(&who, now);
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
        self.note(format!(
            "{slots} candidates, {:?}, store clock rate {:.3}",
            self.timing, self.clock_rate
        ));
        let mut candidates: Vec<Candidate> = (0..slots).map(|i| self.start_candidate(i)).collect();
        let end = self.start + length;
        while Instant::now() < end {
            tokio::time::sleep(Duration::from_millis(self.rng.random_range(100..1500))).await;
            self.inject(&mut candidates).await;
        }
        self.store.set_faults(Faults::default());
        for c in &candidates {
            c.pause.0.send_replace(false);
            c.shutdown.cancel();
        }
        for c in candidates {
            c.handle.join().await;
        }
        // Let the belief watchers see the final states.
        tokio::time::sleep(Duration::from_millis(1)).await;
        self.check()
    }

    /// One random fault or repair.
    async fn inject(&mut self, candidates: &mut [Candidate]) {
        let i = self.rng.random_range(0..candidates.len());
        let gap = self.timing.safety_gap();
        match self.rng.random_range(0..10) {
            0 => {
                let faults = Faults {
                    down: true,
                    ..Default::default()
                };
                self.note("store outage".into());
                self.store.set_faults(faults);
            }
            1 => {
                let latency = self.timing.renew_deadline.mul_f64(self.rng.random_range(0.1..0.8));
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
            3 | 4 => {
                self.note("store healthy".into());
                self.store.set_faults(Faults::default());
            }
            5 => {
                // Paused (GC, SIGSTOP) for up to twice the lease, often past the gap.
                let length = self.timing.lease_duration.mul_f64(self.rng.random_range(0.1..2.0));
                if length > gap {
                    self.report.long_pauses += 1;
                }
                self.note(format!("pause {} for {length:?}", candidates[i].name));
                candidates[i].pause.0.send_replace(true);
                let pause = candidates[i].pause.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(length).await;
                    pause.0.send_replace(false);
                });
            }
            6 => {
                self.note(format!("crash {} (kill -9)", candidates[i].name));
                self.report.crashes += 1;
                candidates[i].handle.abort();
                candidates[i].pause.0.send_replace(false);
                let restart = self.timing.retry_period.mul_f64(self.rng.random_range(0.0..5.0));
                tokio::time::sleep(restart).await;
                candidates[i] = self.start_candidate(i);
            }
            7 => {
                let on = !candidates[i].handle.state().campaigning;
                self.note(format!(
                    "{} campaign {}",
                    candidates[i].name,
                    if on { "resumes" } else { "stops" }
                ));
                candidates[i].handle.set_campaigning(on);
            }
            _ => {}
        }
    }

    fn check(mut self) -> Result<Report, Violation> {
        let log = std::mem::take(&mut *self.log.lock().unwrap());
        let fail = |what: String| Violation {
            seed: self.seed,
            what,
            events: log.events.clone(),
        };
        // 1. No two beliefs overlap.
        let mut beliefs = log.beliefs.clone();
        beliefs.retain(|b| b.until > b.from);
        beliefs.sort_by_key(|b| b.from);
        for (i, a) in beliefs.iter().enumerate() {
            for b in beliefs[i + 1..].iter().take_while(|b| b.from < a.until) {
                if b.who != a.who {
                    return Err(fail(format!(
                        "{} (term {}) and {} (term {}) both believed they led at {}ms",
                        a.who,
                        a.term,
                        b.who,
                        b.term,
                        (b.from - self.start).as_millis()
                    )));
                }
            }
        }
        // 2. The fenced register.
        let register = self.register.lock().unwrap();
        if let Some(v) = register.violations.first() {
            return Err(fail(v.clone()));
        }
        if let Some((who, token, _)) = register.rejected.iter().find(|(_, _, paused)| !paused) {
            return Err(fail(format!(
                "{who} wrote with stale token {token} without having been paused"
            )));
        }
        // 3. Terms and tokens.
        let mut terms: BTreeMap<u64, (String, Option<FencingToken>)> = BTreeMap::new();
        for b in &beliefs {
            match terms.get(&b.term) {
                Some((who, token)) if who != &b.who || token != &b.token => {
                    return Err(fail(format!("term {} claimed by {who} and {}", b.term, b.who)));
                }
                _ => {
                    terms.insert(b.term, (b.who.clone(), b.token));
                }
            }
        }
        let tokens: Vec<_> = terms.values().map(|(_, t)| *t).collect();
        if let Some(w) = tokens.windows(2).find(|w| w[0] >= w[1]) {
            return Err(fail(format!(
                "tokens did not increase with the term: {:?} then {:?}",
                w[0], w[1]
            )));
        }
        if terms.is_empty() {
            return Err(fail("nobody ever led: the schedule tested nothing".into()));
        }
        self.report.terms = terms.len() as u64;
        self.report.accepted = register.accepted;
        self.report.fenced = register.rejected.len() as u64;
        self.report.events = log.events;
        drop(register);
        Ok(self.report)
    }
}
