//! The store as the sidecar opens it: connected (and, with `--create-table`,
//! its table created) by a task of its own that retries with capped backoff,
//! so an unreachable store or a missing table at start delays leadership
//! instead of ending the process, and a slow connection never counts against
//! the elector's renew deadline. Until the store has answered once, the
//! latest failure, with what to fix, is the sidecar's start-up problem:
//! `/healthz` answers 503 with it, `/leader` shows it as `storeError`, and it
//! is logged at once and then at most once per [`REPORT_EVERY`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use backon::BackoffBuilder;
use futures::future::BoxFuture;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{info, warn};

use leasehold_core::lease::{Claim, FencingToken, Grant, Held, LeaseStore, Observation, Release, StoreError};

/// How often a start-up problem that persists is logged again.
pub const REPORT_EVERY: Duration = Duration::from_secs(30);
/// How long one connection attempt may take.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

pub(crate) struct StartingStore {
    store: watch::Receiver<Option<Arc<dyn LeaseStore>>>,
    reached: AtomicBool,
    report: Arc<Report>,
}

/// The start-up problem, as `/healthz` shows it and the log says it; the
/// partitioned sidecar ([`super::partitions`]) reports through it too.
pub(crate) struct Report {
    fix: &'static str,
    problem: watch::Sender<Option<String>>,
    throttle: Mutex<Throttle>,
}

impl Report {
    pub(crate) fn new(create_table: bool, problem: watch::Sender<Option<String>>) -> Self {
        let fix = if create_table {
            "check the database name, the credentials and the network to the store"
        } else {
            "check the database name, the credentials and the network to the store; \
             a missing table is created by the operator, or by the sidecar with --create-table"
        };
        Report {
            fix,
            problem,
            throttle: Mutex::new(Throttle::new(REPORT_EVERY)),
        }
    }

    /// A failure before the store first answered: nothing was written, so it
    /// is reported as unavailable, with the fix, and logged at a bounded rate.
    pub(crate) fn failed(&self, error: &StoreError) -> StoreError {
        let problem = format!(
            "the store has not answered since start: {}; fix: {}",
            error.chain(),
            self.fix
        );
        let due = self
            .throttle
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .due(Instant::now());
        if let Some(attempts) = due {
            warn!(%problem, attempts, "retrying with backoff");
        }
        self.problem.send_replace(Some(problem.clone()));
        StoreError::unavailable(problem)
    }

    /// The store answered: the start-up problem, if any, is over.
    pub(crate) fn answered(&self) {
        if self.problem.send_replace(None).is_some() {
            info!("the store answers now");
        }
    }
}

impl StartingStore {
    /// Starts connecting with `connect`; `problem` carries the start-up problem.
    pub(crate) fn spawn(
        connect: impl Fn() -> BoxFuture<'static, Result<Arc<dyn LeaseStore>, StoreError>> + Send + Sync + 'static,
        create_table: bool,
        problem: watch::Sender<Option<String>>,
    ) -> Self {
        let report = Arc::new(Report::new(create_table, problem));
        let (store_tx, store) = watch::channel(None);
        tokio::spawn(open(connect, create_table, report.clone(), store_tx));
        StartingStore {
            store,
            reached: AtomicBool::new(false),
            report,
        }
    }

    fn ready(&self) -> Result<Arc<dyn LeaseStore>, StoreError> {
        self.store.borrow().clone().ok_or_else(|| {
            let problem = self.report.problem.borrow().clone();
            StoreError::unavailable(problem.unwrap_or_else(|| "connecting to the store".into()))
        })
    }

    fn answered(&self) {
        if !self.reached.swap(true, Ordering::SeqCst) {
            self.report.answered();
        }
    }

    /// A read's answer, reported until the store first answers.
    fn read_reported(&self, read: Result<Observation, StoreError>) -> Result<Observation, StoreError> {
        match read {
            Ok(observation) => {
                self.answered();
                Ok(observation)
            }
            // A read: nothing written whatever the kind (a missing table, say).
            Err(e) if !self.reached.load(Ordering::SeqCst) => Err(self.report.failed(&e)),
            Err(e) => Err(e),
        }
    }
}

/// Connects, creates the table when asked, and hands the store over;
/// retries each step with capped backoff until it succeeds.
async fn open(
    connect: impl Fn() -> BoxFuture<'static, Result<Arc<dyn LeaseStore>, StoreError>>,
    create_table: bool,
    report: Arc<Report>,
    store: watch::Sender<Option<Arc<dyn LeaseStore>>>,
) {
    let mut backoff = super::capped_backoff().build();
    let timed_out = || StoreError::unavailable(format!("no answer within {CONNECT_TIMEOUT:?}"));
    loop {
        let attempt = async {
            let opened = tokio::time::timeout(CONNECT_TIMEOUT, connect())
                .await
                .map_err(|_| timed_out())??;
            if create_table {
                tokio::time::timeout(CONNECT_TIMEOUT, opened.ensure_schema())
                    .await
                    .map_err(|_| timed_out())??;
            }
            Ok::<_, StoreError>(opened)
        };
        match attempt.await {
            Ok(opened) => {
                store.send_replace(Some(opened));
                return;
            }
            Err(e) => {
                report.failed(&e);
                tokio::time::sleep(backoff.next().unwrap_or(super::BACKOFF_CAP)).await;
            }
        }
    }
}

#[async_trait]
impl LeaseStore for StartingStore {
    fn kind(&self) -> &'static str {
        self.store.borrow().as_ref().map_or("starting", |s| s.kind())
    }
    async fn ensure_schema(&self) -> Result<(), StoreError> {
        self.ready()?.ensure_schema().await
    }
    async fn observe(&self, lock: &str) -> Result<Observation, StoreError> {
        self.read_reported(self.ready()?.observe(lock).await)
    }
    async fn observe_followed(&self, lock: &str) -> Result<Observation, StoreError> {
        self.read_reported(self.ready()?.observe_followed(lock).await)
    }
    async fn changed(&self, lock: &str, seen: &Observation) {
        match self.ready() {
            Ok(store) => store.changed(lock, seen).await,
            Err(_) => futures::future::pending().await,
        }
    }
    // The elector observes before it writes, so the writes need no reporting.
    async fn acquire_as(&self, lock: &str, claim: &Claim<'_>, lease: Duration) -> Result<Grant, StoreError> {
        self.ready()?.acquire_as(lock, claim, lease).await
    }
    async fn take_over(
        &self,
        lock: &str,
        claim: &Claim<'_>,
        from: Held<'_>,
        lease: Duration,
    ) -> Result<Grant, StoreError> {
        self.ready()?.take_over(lock, claim, from, lease).await
    }
    async fn renew(&self, lock: &str, holder: &str, token: FencingToken, lease: Duration) -> Result<Grant, StoreError> {
        self.ready()?.renew(lock, holder, token, lease).await
    }
    async fn release_for(
        &self,
        lock: &str,
        holder: &str,
        token: FencingToken,
        release: &Release,
    ) -> Result<(), StoreError> {
        self.ready()?.release_for(lock, holder, token, release).await
    }
}

/// Says when a repeated condition is due to be logged again: at the first
/// occurrence, then at most once per `every`, with the count since.
#[derive(Debug)]
pub struct Throttle {
    every: Duration,
    last: Option<Instant>,
    suppressed: u64,
}

impl Throttle {
    pub fn new(every: Duration) -> Self {
        Throttle {
            every,
            last: None,
            suppressed: 0,
        }
    }

    /// `Some(occurrences since the last report, this one included)` when due.
    pub fn due(&mut self, now: Instant) -> Option<u64> {
        self.suppressed += 1;
        if self.last.is_some_and(|last| now < last + self.every) {
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.suppressed))
    }

    /// Starts over: the next occurrence is reported at once.
    pub(crate) fn reset(&mut self) {
        self.last = None;
        self.suppressed = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold_core::lease::{Elector, Identity, Timing};
    use leasehold_core::store::memory::{Faults, MemoryStore};
    use std::sync::atomic::AtomicU32;

    #[test]
    fn a_persisting_problem_is_reported_at_once_then_at_most_once_per_period() {
        let start = Instant::now();
        let mut throttle = Throttle::new(Duration::from_secs(30));
        let reports: Vec<(u64, u64)> = (0..600u64)
            .filter_map(|tenth| {
                throttle
                    .due(start + Duration::from_millis(100 * tenth))
                    .map(|n| (tenth, n))
            })
            .collect();
        // One attempt every 100 ms for a minute: two lines, not six hundred.
        assert_eq!(reports, [(0, 1), (300, 300)]);
        throttle.reset();
        assert_eq!(throttle.due(start + Duration::from_secs(61)), Some(1));
    }

    /// Store unreachable at start, then a missing table, then fine: the
    /// elector keeps trying at its capped backoff, the problem says what to
    /// fix, and it leads once the store answers.
    #[tokio::test(start_paused = true)]
    async fn an_unreachable_store_or_missing_table_at_start_is_retried_and_reported() {
        let memory = MemoryStore::new(1);
        memory.set_faults(Faults {
            down: true,
            ..Default::default()
        });
        let connects = Arc::new(AtomicU32::new(0));
        let (problem_tx, mut problem) = watch::channel(None);
        let store = {
            let (memory, connects) = (memory.clone(), connects.clone());
            StartingStore::spawn(
                move || {
                    let (memory, connects) = (memory.clone(), connects.clone());
                    Box::pin(async move {
                        match connects.fetch_add(1, Ordering::SeqCst) {
                            0..3 => Err(StoreError::unavailable("connection refused")),
                            _ => Ok(Arc::new(memory) as Arc<dyn LeaseStore>),
                        }
                    })
                },
                false,
                problem_tx,
            )
        };
        let timing = Timing::default();
        let elector = Elector::new("start", Identity::new(None, None, "pod-0"), timing);
        let handle = elector.spawn(Arc::new(store), tokio_util::sync::CancellationToken::new());
        let mut state = handle.subscribe();

        let first = problem.wait_for(|p| p.is_some()).await.unwrap().clone().unwrap();
        assert!(first.contains("connection refused"), "{first}");
        assert!(first.contains("fix: check the database name"), "{first}");
        assert!(first.contains("--create-table"), "{first}");
        // Connected, but the store (the table, say) still fails.
        tokio::time::sleep(Duration::from_secs(20)).await;
        assert!(connects.load(Ordering::SeqCst) >= 4, "retried the connection");
        let shown = state.borrow().clone();
        assert!(!shown.leader);
        match &shown.change {
            leasehold_core::lease::Change::StoreError(e) => assert!(e.contains("fix:"), "{e}"),
            other => panic!("/leader shows {other:?}"),
        }
        assert!(problem.borrow().as_ref().is_some_and(|p| p.contains("unavailable")));

        memory.set_faults(Faults::default());
        state.wait_for(|s| s.leader).await.unwrap();
        assert_eq!(
            *problem.borrow_and_update(),
            None,
            "the problem clears once the store answers"
        );
    }
}
