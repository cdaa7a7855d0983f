//! Many locks through sessions: N locks held by 3 sessions, each on its own
//! store client (its own connection, as 3 processes would have), on one
//! emulator database, one private PostgreSQL server or one private Redis
//! server.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use leasehold::lease::session::{Collected, LockBatch, LocksObservation, SessionObservation};
use leasehold::lease::{FencingToken, Identity, Session, SessionStore, StoreError, StoreTime, Timing};
use leasehold::store::StoreUrl;
use leasehold::store::postgres::{PostgresConfig, PostgresStore};
use leasehold::store::redis::{DEFAULT_PREFIX, RedisConfig, RedisStore};
use leasehold::store::spanner::{DEFAULT_CALL_TIMEOUT, SpannerConfig, SpannerStore};
use leasehold::testing::Emulator;
use leasehold::testing::servers::{PostgresServer, RedisServer};

use super::quantile;

/// Counts every store call (each is one transaction or one read) and times
/// the session renewals.
struct Counted {
    inner: Arc<dyn SessionStore>,
    calls: AtomicU64,
    renewals: Mutex<Vec<Duration>>,
}

impl Counted {
    fn count(&self) {
        self.calls.fetch_add(1, Ordering::Relaxed);
    }
}

#[async_trait]
impl SessionStore for Counted {
    async fn ensure_session_schema(&self) -> Result<(), StoreError> {
        self.inner.ensure_session_schema().await
    }
    async fn open_session(&self, session: &str, owner: &str, lease: Duration) -> Result<StoreTime, StoreError> {
        self.count();
        self.inner.open_session(session, owner, lease).await
    }
    async fn renew_session(&self, session: &str) -> Result<StoreTime, StoreError> {
        self.count();
        let timed = Instant::now();
        let renewed = self.inner.renew_session(session).await;
        self.renewals.lock().unwrap().push(timed.elapsed());
        renewed
    }
    async fn close_session(&self, session: &str) -> Result<(), StoreError> {
        self.count();
        self.inner.close_session(session).await
    }
    async fn observe_session(&self, session: &str) -> Result<SessionObservation, StoreError> {
        self.count();
        self.inner.observe_session(session).await
    }
    async fn try_lock(&self, session: &str, names: &[String]) -> Result<LockBatch, StoreError> {
        self.count();
        self.inner.try_lock(session, names).await
    }
    async fn unlock(&self, session: &str, locks: &[(String, FencingToken)]) -> Result<Vec<String>, StoreError> {
        self.count();
        self.inner.unlock(session, locks).await
    }
    async fn observe_locks(&self, names: &[String]) -> Result<LocksObservation, StoreError> {
        self.count();
        self.inner.observe_locks(names).await
    }
    async fn collect_garbage(&self) -> Result<Collected, StoreError> {
        self.count();
        self.inner.collect_garbage().await
    }
}

/// Locks per `try_lock_many` while taking the shares
/// (LEASEHOLD_BENCH_BATCH, default 100).
fn batch() -> usize {
    std::env::var("LEASEHOLD_BENCH_BATCH")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100)
}

/// The store the sessions part runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Spanner,
    Postgres,
    Redis,
}

/// A server of `Backend`, kept running while the part runs.
enum Server {
    Spanner(Emulator, SpannerConfig),
    Postgres(PostgresServer),
    Redis(RedisServer),
}

impl Server {
    async fn start(backend: Backend) -> Server {
        match backend {
            Backend::Spanner => {
                let emulator = Emulator::start_or_connect();
                let config = emulator.create_database("leasehold_leases").await;
                Server::Spanner(emulator, config)
            }
            Backend::Postgres => Server::Postgres(PostgresServer::start()),
            Backend::Redis => Server::Redis(RedisServer::start()),
        }
    }

    /// A store client of its own, with the session tables.
    async fn client(&self) -> Arc<dyn SessionStore> {
        let store: Arc<dyn SessionStore> = match self {
            Server::Spanner(emulator, config) => Arc::new(
                SpannerStore::connect_to(config.clone(), emulator.endpoints(), DEFAULT_CALL_TIMEOUT)
                    .await
                    .unwrap(),
            ),
            Server::Postgres(server) => Arc::new(
                PostgresStore::connect(PostgresConfig {
                    url: StoreUrl::new(server.url()),
                    table: "leasehold_leases".into(),
                })
                .unwrap(),
            ),
            Server::Redis(server) => Arc::new(
                RedisStore::connect(RedisConfig {
                    url: StoreUrl::new(server.url()),
                    prefix: DEFAULT_PREFIX.into(),
                })
                .unwrap(),
            ),
        };
        store.ensure_session_schema().await.unwrap();
        store
    }
}

/// `locks` locks over 3 sessions on `backend` at the default timings for `seconds`.
pub fn many_locks_in_sessions(backend: Backend, locks: usize, seconds: u64) -> String {
    const SESSIONS: usize = 3;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let server = Server::start(backend).await;
        let timing = Timing::default();
        let mut stores = Vec::new();
        let mut sessions = Vec::new();
        for i in 0..SESSIONS {
            let counted = Arc::new(Counted {
                inner: server.client().await,
                calls: AtomicU64::new(0),
                renewals: Mutex::default(),
            });
            stores.push(counted.clone());
            let owner = Identity::new(None, None, format!("bench-{i}"));
            sessions.push(Session::open(counted, owner, timing).await.unwrap());
        }
        // Each session takes its share in batches (the emulator runs
        // one read-write transaction at a time, so a huge batch would hold
        // up every renewal); retried until all are held.
        let names: Vec<String> = (0..locks).map(|i| format!("lock/{i:05}")).collect();
        let warm = Instant::now();
        for (i, session) in sessions.iter().enumerate() {
            let share: Vec<&String> = names.iter().skip(i).step_by(SESSIONS).collect();
            while session.held().borrow().locks.len() < share.len() {
                let pass = Instant::now();
                let missing: Vec<&String> = {
                    let held = session.held().borrow().clone();
                    share.iter().copied().filter(|n| !held.locks.contains_key(*n)).collect()
                };
                for batch in missing.chunks(batch()) {
                    if let Err(e) = session.try_lock_many(batch).await {
                        eprintln!("session {i}: taking its share: {}", e.chain());
                    }
                }
                println!(
                    "session {i}: {} of {} held after a pass of {:?}",
                    session.held().borrow().locks.len(),
                    share.len(),
                    pass.elapsed()
                );
            }
        }
        let warm_up = warm.elapsed();
        let held = |sessions: &[Session]| sessions.iter().map(|s| s.held().borrow().locks.len()).sum::<usize>();
        println!("{locks} locks held by {SESSIONS} sessions after {warm_up:?}");
        let calls_before: Vec<u64> = stores.iter().map(|s| s.calls.load(Ordering::Relaxed)).collect();
        for store in &stores {
            store.renewals.lock().unwrap().clear();
        }
        let ids: Vec<String> = sessions.iter().map(Session::id).collect();
        let mut watches: Vec<_> = sessions.iter().map(Session::held).collect();
        let started = Instant::now();
        let (mut min_held, mut lost) = (locks, 0);
        let mut last: Vec<usize> = watches.iter_mut().map(|w| w.borrow_and_update().locks.len()).collect();
        while started.elapsed() < Duration::from_secs(seconds) {
            tokio::time::sleep(Duration::from_millis(250)).await;
            for (w, previous) in watches.iter_mut().zip(last.iter_mut()) {
                let now = w.borrow_and_update().locks.len();
                lost += previous.saturating_sub(now);
                *previous = now;
            }
            min_held = min_held.min(held(&sessions));
        }
        let elapsed = started.elapsed();
        let replaced = sessions.iter().zip(&ids).filter(|(s, id)| s.id() != **id).count();
        let periods = elapsed.as_secs_f64() / timing.retry_period.as_secs_f64();
        let per_period: Vec<String> = stores
            .iter()
            .zip(&calls_before)
            .map(|(s, before)| format!("{:.2}", (s.calls.load(Ordering::Relaxed) - before) as f64 / periods))
            .collect();
        let mut renewals: Vec<Duration> = stores
            .iter()
            .flat_map(|s| s.renewals.lock().unwrap().clone())
            .collect();
        renewals.sort();
        for session in sessions {
            let _ = session.close().await;
        }
        let line = format!(
            "{backend:?}: {locks} locks, {SESSIONS} sessions (own clients), D/R/P 15s/10s/2s, {:.0} s: locks lost {lost} \
             (held at least {min_held} of {locks} throughout; {replaced} sessions replaced), store transactions per P \
             per session [{}], renew latency p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms (n={}); taking all locks ({} per call) took {:.1} s",
            elapsed.as_secs_f64(),
            per_period.join(", "),
            quantile(&renewals, 0.5),
            quantile(&renewals, 0.99),
            quantile(&renewals, 1.0),
            renewals.len(),
            batch(),
            warm_up.as_secs_f64()
        );
        println!("{line}");
        line
    })
}
