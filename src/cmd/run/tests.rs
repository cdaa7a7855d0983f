//! The runner on paused time: the elector, the runner's leader work and the
//! watchdog's supervision loop, with a fake command whose process group
//! records what it received. A checker looks at the store every time a
//! command dies or starts: a command still alive when its lease may have
//! expired, or while another command runs, is a violation.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use futures::future::BoxFuture;
use rustix::process::Signal;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::launch::{Launcher, Supervised};
use super::watchdog::{Heartbeat, ProcessGroup, supervise};
use super::*;
use crate::lease::{
    Claim, ElectorHandle, FencingToken, Grant, Identity, LeaseStore, Observation, Release, StoreError, Timing,
};
use crate::store::MemoryStore;

const LOCK: &str = "run-test";

fn timing() -> Timing {
    Timing::new(
        Duration::from_secs(10),
        Duration::from_secs(7),
        Duration::from_secs(1),
        0.0,
    )
    .unwrap()
}

/// How a fake command behaves.
#[derive(Debug, Clone, Copy)]
struct Behaviour {
    /// Exits by itself after this long, with this code.
    exits: Option<(Duration, i32)>,
    /// Exits this long after SIGTERM; `None`: ignores SIGTERM.
    on_term: Option<Duration>,
}

const IGNORES_TERM: Behaviour = Behaviour {
    exits: None,
    on_term: None,
};

#[derive(Debug, Default)]
struct Log {
    /// Commands alive now, by token.
    alive: HashMap<FencingToken, Instant>,
    /// (token, started, died, signals received).
    finished: Vec<(FencingToken, Instant, Instant, Vec<i32>)>,
    violations: Vec<String>,
}

/// The store as the checker sees it, and the shared log.
#[derive(Clone)]
struct Checker {
    store: MemoryStore,
    log: Arc<Mutex<Log>>,
}

impl Checker {
    fn started(&self, token: FencingToken) {
        let mut log = self.log.lock().unwrap();
        if let Some(other) = log.alive.keys().next() {
            let violation = format!("command {token} started while command {other} was alive");
            log.violations.push(violation);
        }
        log.alive.insert(token, Instant::now());
    }

    /// At the instant a command dies: was its lease still ours and unexpired?
    async fn died(&self, token: FencingToken, signals: Vec<i32>) {
        let seen = self.store.observe(LOCK).await.expect("the checker reads the store");
        let record = seen.record.expect("a lease row");
        let mut log = self.log.lock().unwrap();
        if record.token != Some(token) {
            log.violations
                .push(format!("command {token} was alive when term {} began", record.term));
        } else if record.expires_at().is_none_or(|end| seen.now > end) {
            log.violations
                .push(format!("command {token} was alive after its lease may have expired"));
        }
        let started = log.alive.remove(&token).expect("it had started");
        log.finished.push((token, started, Instant::now(), signals));
    }

    fn violations(&self) -> Vec<String> {
        self.log.lock().unwrap().violations.clone()
    }
}

/// A fake command's process group.
struct FakeGroup {
    exit: watch::Sender<Option<i32>>,
    signals: Arc<Mutex<Vec<i32>>>,
    behaviour: Behaviour,
}

impl FakeGroup {
    fn exit_after(&self, delay: Duration, code: i32) {
        let exit = self.exit.clone();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            exit.send_if_modified(|e| e.is_none() && e.replace(code).is_none());
        });
    }
}

impl ProcessGroup for FakeGroup {
    fn signal(&mut self, signal: i32) {
        self.signals.lock().unwrap().push(signal);
        match (signal, self.behaviour.on_term) {
            (kill, _) if kill == Signal::KILL.as_raw() => self.exit_after(Duration::ZERO, 128 + signal),
            (_, Some(delay)) => self.exit_after(delay, 128 + signal),
            (_, None) => {}
        }
    }

    fn exited(&mut self) -> BoxFuture<'_, i32> {
        let mut exit = self.exit.subscribe();
        Box::pin(async move { exit.wait_for(|e| e.is_some()).await.unwrap().unwrap() })
    }
}

/// Runs the watchdog's loop in-process around a fake command.
struct FakeLauncher {
    checker: Checker,
    grace: Duration,
    behaviour: Behaviour,
    /// The runner is stopped: nothing it sends reaches the watchdog, and the
    /// pipe stays open.
    frozen: Arc<AtomicBool>,
    /// The environment of every start, in order.
    envs: Arc<Mutex<Vec<HashMap<String, String>>>>,
}

impl Launcher for FakeLauncher {
    fn start(&self, env: Vec<(&'static str, String)>, deadline: Instant) -> std::io::Result<Supervised> {
        let env: HashMap<String, String> = env.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        let token = FencingToken(env["LEASEHOLD_TOKEN"].parse().unwrap());
        self.envs.lock().unwrap().push(env);
        let (heartbeats, mut from_runner) = mpsc::unbounded_channel();
        let (to_watchdog, watchdog_rx) = mpsc::unbounded_channel();
        let frozen = self.frozen.clone();
        tokio::spawn(async move {
            while let Some(heartbeat) = from_runner.recv().await {
                if frozen.load(Ordering::SeqCst) {
                    std::future::pending::<()>().await;
                }
                let _ = to_watchdog.send(heartbeat);
            }
        });
        let (exit, _) = watch::channel(None);
        let signals = Arc::new(Mutex::new(Vec::new()));
        let group = FakeGroup {
            exit,
            signals: signals.clone(),
            behaviour: self.behaviour,
        };
        if let Some((after, code)) = self.behaviour.exits {
            group.exit_after(after, code);
        }
        self.checker.started(token);
        let checker = self.checker.clone();
        let grace = self.grace;
        let exit = tokio::spawn(async move {
            let code = supervise(group, watchdog_rx, deadline, grace).await;
            let signals = signals.lock().unwrap().clone();
            checker.died(token, signals).await;
            code
        });
        Ok(Supervised { heartbeats, exit })
    }
}

/// The elector's view of the store, which the test can cut off.
struct Cuttable {
    store: MemoryStore,
    cut: Arc<AtomicBool>,
}

impl Cuttable {
    fn check(&self) -> Result<(), StoreError> {
        match self.cut.load(Ordering::SeqCst) {
            true => Err(StoreError::unavailable("cut off by the test")),
            false => Ok(()),
        }
    }
}

#[async_trait]
impl LeaseStore for Cuttable {
    fn kind(&self) -> &'static str {
        "cuttable"
    }
    async fn ensure_schema(&self) -> Result<(), StoreError> {
        Ok(())
    }
    async fn observe(&self, lock: &str) -> Result<Observation, StoreError> {
        self.check()?;
        self.store.observe(lock).await
    }
    async fn acquire_as(&self, lock: &str, claim: &Claim<'_>, lease: Duration) -> Result<Grant, StoreError> {
        self.check()?;
        self.store.acquire_as(lock, claim, lease).await
    }
    async fn renew(&self, lock: &str, holder: &str, token: FencingToken, lease: Duration) -> Result<Grant, StoreError> {
        self.check()?;
        self.store.renew(lock, holder, token, lease).await
    }
    async fn release_for(
        &self,
        lock: &str,
        holder: &str,
        token: FencingToken,
        release: &Release,
    ) -> Result<(), StoreError> {
        self.check()?;
        self.store.release_for(lock, holder, token, release).await
    }
}

struct Candidate {
    handle: ElectorHandle,
    runner: Arc<Runner>,
    cut: Arc<AtomicBool>,
    frozen: Arc<AtomicBool>,
    envs: Arc<Mutex<Vec<HashMap<String, String>>>>,
    shutdown: CancellationToken,
}

fn candidate(
    name: &str,
    checker: &Checker,
    grace: Duration,
    behaviour: Behaviour,
    restart: Option<Duration>,
) -> Candidate {
    let (cut, frozen) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
    let envs = Arc::new(Mutex::new(Vec::new()));
    let launcher = FakeLauncher {
        checker: checker.clone(),
        grace,
        behaviour,
        frozen: frozen.clone(),
        envs: envs.clone(),
    };
    let shutdown = CancellationToken::new();
    let runner = Runner::new(
        Arc::new(launcher),
        restart,
        shutdown.clone(),
        Arc::new(OnceLock::new()),
        None,
    );
    let store = Cuttable {
        store: checker.store.clone(),
        cut: cut.clone(),
    };
    let work = runner.clone();
    let handle = Elector::new(LOCK, Identity::with_nonce(name, "1"), timing())
        .with_seed(1)
        .spawn_with_work(Arc::new(store), shutdown.clone(), move |ctx| work.clone().lead(ctx));
    Candidate {
        handle,
        runner,
        cut,
        frozen,
        envs,
        shutdown,
    }
}

fn checker() -> Checker {
    Checker {
        store: MemoryStore::new(1),
        log: Arc::default(),
    }
}

async fn until(what: impl Fn() -> bool) {
    let started = Instant::now();
    while !what() {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "not reached in 120 simulated seconds"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A leads, its store is cut (and, if `freeze`, its runner stops passing
/// anything on); B takes over. Returns the checker's log.
async fn failover(grace: Duration, freeze: bool) -> Checker {
    let checker = checker();
    let a = candidate("a", &checker, grace, IGNORES_TERM, None);
    until(|| a.handle.state().leader).await;
    let b = candidate("b", &checker, grace, IGNORES_TERM, None);
    until(|| checker.log.lock().unwrap().alive.len() == 1).await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    a.frozen.store(freeze, Ordering::SeqCst);
    a.cut.store(true, Ordering::SeqCst);
    until(|| b.handle.state().leader).await;
    until(|| !b.envs.lock().unwrap().is_empty()).await;
    for c in [&a, &b] {
        c.shutdown.cancel();
    }
    checker
}

#[tokio::test(start_paused = true)]
async fn a_command_is_gone_before_its_lease_can_expire() {
    let grace = grace_period(&timing(), None).unwrap();
    for freeze in [false, true] {
        let checker = failover(grace, freeze).await;
        assert_eq!(checker.violations(), Vec::<String>::new(), "frozen runner: {freeze}");
        let log = checker.log.lock().unwrap();
        let (_, _, _, signals) = &log.finished[0];
        assert_eq!(
            signals,
            &[Signal::TERM.as_raw(), Signal::KILL.as_raw()],
            "SIGTERM, then SIGKILL for a command that ignores it (frozen runner: {freeze})"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn the_checker_catches_a_grace_period_longer_than_the_gap() {
    // Planted bug: a grace period past D − R, as validation would refuse.
    let grace = timing().safety_gap() + Duration::from_secs(1);
    assert!(grace_period(&timing(), Some(grace)).is_err());
    let checker = failover(grace, true).await;
    let violations = checker.violations();
    assert!(violations.iter().any(|v| v.contains("was alive")), "{violations:?}");
}

#[tokio::test(start_paused = true)]
async fn the_grace_period_defaults_to_half_the_gap_and_must_fit_inside_it() {
    let t = timing();
    assert_eq!(grace_period(&t, None).unwrap(), Duration::from_millis(1500));
    assert_eq!(
        grace_period(&t, Some(Duration::from_millis(2999))).unwrap(),
        Duration::from_millis(2999)
    );
    let err = grace_period(&t, Some(Duration::from_secs(3))).unwrap_err().to_string();
    assert!(
        err.starts_with("--grace-period (3s) must be shorter than leaseDuration − renewDeadline (3s)"),
        "{err}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_command_that_exits_0_ends_the_runner_and_releases() {
    let checker = checker();
    let once = Behaviour {
        exits: Some((Duration::from_secs(30), 0)),
        on_term: Some(Duration::ZERO),
    };
    let a = candidate("a", &checker, Duration::from_secs(1), once, None);
    let runner = a.runner.clone();
    let started = Instant::now();
    a.handle.join().await;
    assert_eq!(runner.exit_code(), 0);
    assert!(
        started.elapsed() >= Duration::from_secs(30),
        "it ran to its end, renewing"
    );
    let row = checker.store.observe(LOCK).await.unwrap().record.unwrap();
    assert_eq!(row.holder, None, "released");
    let envs = a.envs.lock().unwrap();
    assert_eq!(envs.len(), 1, "ran once");
    assert_eq!(envs[0]["LEASEHOLD_TOKEN"], row.token.unwrap().to_string());
    assert_eq!(envs[0]["LEASEHOLD_TERM"], "1");
    assert_eq!(envs[0]["LEASEHOLD_HOLDER"], "a#1");
    assert!(checker.violations().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_failing_command_ends_the_runner_with_its_code_or_restarts_with_the_flag() {
    let fails = Behaviour {
        exits: Some((Duration::from_secs(2), 3)),
        on_term: Some(Duration::ZERO),
    };
    let checker = checker();
    let a = candidate("a", &checker, Duration::from_secs(1), fails, None);
    let runner = a.runner.clone();
    a.handle.join().await;
    assert_eq!(runner.exit_code(), 3);
    assert_eq!(a.envs.lock().unwrap().len(), 1);

    let checker = self::checker();
    let a = candidate(
        "a",
        &checker,
        Duration::from_secs(1),
        fails,
        Some(Duration::from_secs(1)),
    );
    // Starts at 0, 3 (2 + 1), 7 (5 + 2), 13 (9 + 4): backoff doubles.
    tokio::time::sleep(Duration::from_millis(13_500)).await;
    let envs = a.envs.lock().unwrap().clone();
    assert_eq!(envs.len(), 4, "restarted after 1 s, 2 s, 4 s");
    assert!(
        envs.iter().all(|e| e["LEASEHOLD_TOKEN"] == envs[0]["LEASEHOLD_TOKEN"]),
        "within one term"
    );
    assert!(a.handle.state().leader, "still leading");
    a.shutdown.cancel();
    let runner = a.runner.clone();
    a.handle.join().await;
    assert_eq!(
        runner.exit_code(),
        128 + Signal::TERM.as_raw(),
        "stopped by the runner's shutdown"
    );
    assert!(checker.violations().is_empty());
}

/// The watchdog's loop alone.
mod supervise_loop {
    use super::*;

    struct Supervising {
        task: tokio::task::JoinHandle<i32>,
        heartbeats: mpsc::UnboundedSender<Heartbeat>,
        signals: Arc<Mutex<Vec<i32>>>,
        start: Instant,
    }

    /// The loop around a fake command, deadline 5 s and grace 1 s from now.
    fn supervising(behaviour: Behaviour) -> Supervising {
        let signals = Arc::new(Mutex::new(Vec::new()));
        let group = FakeGroup {
            exit: watch::channel(None).0,
            signals: signals.clone(),
            behaviour,
        };
        let (heartbeats, rx) = mpsc::unbounded_channel();
        let start = Instant::now();
        let deadline = start + Duration::from_secs(5);
        let task = tokio::spawn(supervise(group, rx, deadline, Duration::from_secs(1)));
        Supervising {
            task,
            heartbeats,
            signals,
            start,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_later_deadline_postpones_the_stop_and_sigkill_follows_sigterm_by_grace() {
        let Supervising {
            task,
            heartbeats: tx,
            signals,
            start,
        } = supervising(IGNORES_TERM);
        tokio::time::sleep(Duration::from_secs(4)).await;
        tx.send(Heartbeat::Deadline(start + Duration::from_secs(9))).unwrap();
        // An older deadline arriving late does not bring the stop forward.
        tx.send(Heartbeat::Deadline(start + Duration::from_secs(6))).unwrap();
        tokio::time::sleep(Duration::from_millis(4_900)).await;
        assert!(signals.lock().unwrap().is_empty(), "nothing before the deadline");
        assert_eq!(task.await.unwrap(), 128 + Signal::KILL.as_raw());
        assert_eq!(start.elapsed(), Duration::from_secs(10), "deadline + grace");
        assert_eq!(*signals.lock().unwrap(), [Signal::TERM.as_raw(), Signal::KILL.as_raw()]);
    }

    #[tokio::test(start_paused = true)]
    async fn stop_passes_the_runners_signal_and_a_gone_runner_stops_the_command_at_once() {
        let polite = Behaviour {
            exits: None,
            on_term: Some(Duration::from_millis(100)),
        };
        let Supervising {
            task,
            heartbeats: tx,
            signals,
            start,
        } = supervising(polite);
        tx.send(Heartbeat::Stop(Signal::INT.as_raw())).unwrap();
        assert_eq!(task.await.unwrap(), 128 + Signal::INT.as_raw());
        assert_eq!(*signals.lock().unwrap(), [Signal::INT.as_raw()]);
        assert_eq!(start.elapsed(), Duration::from_millis(100));

        let Supervising {
            task,
            heartbeats: tx,
            signals,
            start,
        } = supervising(IGNORES_TERM);
        drop(tx);
        assert_eq!(task.await.unwrap(), 128 + Signal::KILL.as_raw());
        assert_eq!(
            start.elapsed(),
            Duration::from_secs(1),
            "SIGTERM at once, SIGKILL after grace"
        );
        assert_eq!(*signals.lock().unwrap(), [Signal::TERM.as_raw(), Signal::KILL.as_raw()]);
    }

    #[test]
    fn heartbeats_cross_the_pipe_as_absolute_monotonic_time() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async {
            let at = Instant::now() + Duration::from_millis(1500);
            let started = Instant::now();
            let Some(Heartbeat::Deadline(back)) = Heartbeat::decode(&Heartbeat::Deadline(at).encode()) else {
                panic!("a deadline decodes as a deadline");
            };
            let round_trip = started.elapsed();
            assert!(back <= at, "never later than sent");
            // Each conversion errs early by the time between its two clock
            // reads, both inside the round trip.
            assert!(
                at - back <= round_trip,
                "{:?} early, round trip {round_trip:?}",
                at - back
            );
            assert_eq!(Heartbeat::decode("stop 2\n"), Some(Heartbeat::Stop(2)));
            assert_eq!(Heartbeat::decode("garbage"), None);
        });
    }
}
