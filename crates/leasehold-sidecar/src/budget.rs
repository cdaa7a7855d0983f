//! Watches how much of the renewal budget R − P the store's renewals use: a
//! leader whose renewals take a large share of it has little room left for
//! a slow or failed one before its deadline. Exposed as the gauge
//! `leasehold_renew_budget_used` (p99 of the last renewals ÷ (R − P)), a
//! warning when it crosses [`AT_RISK_SHARE`], the same margin
//! `leasehold advise` keeps when it suggests a timing, and a
//! [`BudgetVerdict`] on each crossing, which `timing_risk` turns into a pod
//! condition and an Event.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{info, warn};

use leasehold_core::lease::budget::{AT_RISK_SHARE, Latencies};
use leasehold_core::lease::session::{Collected, LockBatch, LocksObservation, SessionObservation};
use leasehold_core::lease::store::Result;
use leasehold_core::lease::{
    Claim, FencingToken, Grant, Held, LeaseStore, Observation, Release, SessionStore, StoreTime, Timing,
};

/// Renewals the p99 is taken over.
const WINDOW: usize = 100;
/// Renewals needed before judging.
const MIN_SAMPLES: usize = 20;

/// Where the renewals stand against the budget, as of the last crossing.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BudgetVerdict {
    /// p99 above [`AT_RISK_SHARE`] of the budget.
    pub at_risk: bool,
    /// The share of the budget the p99 renewal used.
    pub used: f64,
    /// R − P.
    pub budget: Duration,
}

impl BudgetVerdict {
    /// One line for a condition, an Event and a log.
    pub(crate) fn describe(&self) -> String {
        let share = format!("{:.0} %", self.used * 100.0);
        match self.at_risk {
            true => format!(
                "renewal p99 uses {share} of R - P ({:?}), over {:.0} %: a slow renewal may miss the deadline; \
                 run `leasehold advise` against this store and raise R (and D)",
                self.budget,
                AT_RISK_SHARE * 100.0
            ),
            false => format!("renewal p99 uses {share} of R - P ({:?})", self.budget),
        }
    }
}

/// The renewal budget: the latencies of the last renewals, the gauge, and
/// the verdicts. Registered once at start; [`RenewBudget::time`] wraps
/// whichever store the candidate renews through once it is connected.
#[derive(Clone)]
pub struct RenewBudget {
    shared: Arc<Shared>,
}

struct Shared {
    budget: Duration,
    samples: Mutex<VecDeque<Duration>>,
    used: Gauge<f64, AtomicU64>,
    at_risk: AtomicBool,
    verdict: watch::Sender<Option<BudgetVerdict>>,
}

impl RenewBudget {
    pub fn new(timing: &Timing, registry: &mut Registry) -> Self {
        let used = Gauge::<f64, AtomicU64>::default();
        registry.sub_registry_with_prefix("leasehold").register(
            "renew_budget_used",
            "p99 of the last 100 renewals as a share of R - P; above 0.25 the timing is at risk",
            used.clone(),
        );
        let shared = Shared {
            budget: timing.renew_deadline.saturating_sub(timing.retry_period),
            samples: Mutex::new(VecDeque::with_capacity(WINDOW)),
            used,
            at_risk: AtomicBool::new(false),
            verdict: watch::Sender::new(None),
        };
        RenewBudget {
            shared: Arc::new(shared),
        }
    }

    /// `store` with its renewals (of a lease, or of a session) timed against this budget.
    pub fn time<S: ?Sized>(&self, store: Arc<S>) -> Timed<S> {
        Timed {
            store,
            budget: self.clone(),
        }
    }

    /// The verdict on each crossing of [`AT_RISK_SHARE`] (the first one
    /// included); `None` until enough renewals were seen.
    pub fn verdicts(&self) -> watch::Receiver<Option<BudgetVerdict>> {
        self.shared.verdict.subscribe()
    }

    /// The share of the budget the p99 renewal uses, once there are enough renewals.
    pub(crate) fn used(&self) -> Option<f64> {
        let shared = &self.shared;
        let samples = shared.samples.lock().unwrap_or_else(|e| e.into_inner());
        if samples.len() < MIN_SAMPLES || shared.budget.is_zero() {
            return None;
        }
        let p99 = Latencies::new(samples.iter().copied().collect()).quantile(0.99);
        Some(p99.as_secs_f64() / shared.budget.as_secs_f64())
    }

    fn record(&self, latency: Duration) {
        let shared = &self.shared;
        {
            let mut samples = shared.samples.lock().unwrap_or_else(|e| e.into_inner());
            if samples.len() == WINDOW {
                samples.pop_front();
            }
            samples.push_back(latency);
        }
        let Some(used) = self.used() else { return };
        shared.used.set(used);
        let at_risk = used > AT_RISK_SHARE;
        let first = shared.verdict.borrow().is_none();
        if at_risk != shared.at_risk.swap(at_risk, std::sync::atomic::Ordering::Relaxed) || first {
            let verdict = BudgetVerdict {
                at_risk,
                used,
                budget: shared.budget,
            };
            if at_risk {
                warn!("{}", verdict.describe());
            } else {
                info!("{}", verdict.describe());
            }
            shared.verdict.send_replace(Some(verdict));
        }
    }

    /// Records how long `renewal`, sent now, took when it succeeded.
    async fn timed<T>(&self, renewal: impl Future<Output = Result<T>>) -> Result<T> {
        let sent = Instant::now();
        let renewed = renewal.await;
        if renewed.is_ok() {
            self.record(sent.elapsed());
        }
        renewed
    }
}

/// A store decorator that times renewals against a [`RenewBudget`]: a lease
/// store's `renew` or, partitioned, a session store's `renew_session`.
pub struct Timed<S: ?Sized> {
    store: Arc<S>,
    budget: RenewBudget,
}

#[async_trait]
impl<S: LeaseStore + ?Sized> LeaseStore for Timed<S> {
    fn kind(&self) -> &'static str {
        self.store.kind()
    }

    async fn ensure_schema(&self) -> Result<()> {
        self.store.ensure_schema().await
    }

    async fn observe(&self, lock: &str) -> Result<Observation> {
        self.store.observe(lock).await
    }

    async fn observe_followed(&self, lock: &str) -> Result<Observation> {
        self.store.observe_followed(lock).await
    }

    async fn changed(&self, lock: &str, seen: &Observation) {
        self.store.changed(lock, seen).await
    }

    async fn acquire_as(&self, lock: &str, claim: &Claim<'_>, lease: Duration) -> Result<Grant> {
        self.store.acquire_as(lock, claim, lease).await
    }

    async fn take_over(&self, lock: &str, claim: &Claim<'_>, from: Held<'_>, lease: Duration) -> Result<Grant> {
        self.store.take_over(lock, claim, from, lease).await
    }

    async fn renew(&self, lock: &str, holder: &str, token: FencingToken, lease: Duration) -> Result<Grant> {
        self.budget.timed(self.store.renew(lock, holder, token, lease)).await
    }

    async fn release_for(&self, lock: &str, holder: &str, token: FencingToken, release: &Release) -> Result<()> {
        self.store.release_for(lock, holder, token, release).await
    }
}

#[async_trait]
impl<S: SessionStore + ?Sized> SessionStore for Timed<S> {
    async fn ensure_session_schema(&self) -> Result<()> {
        self.store.ensure_session_schema().await
    }

    async fn open_session(&self, session: &str, owner: &str, lease: Duration) -> Result<StoreTime> {
        self.store.open_session(session, owner, lease).await
    }

    async fn renew_session(&self, session: &str) -> Result<StoreTime> {
        self.budget.timed(self.store.renew_session(session)).await
    }

    async fn close_session(&self, session: &str) -> Result<()> {
        self.store.close_session(session).await
    }

    async fn observe_session(&self, session: &str) -> Result<SessionObservation> {
        self.store.observe_session(session).await
    }

    async fn try_lock(&self, session: &str, names: &[String]) -> Result<LockBatch> {
        self.store.try_lock(session, names).await
    }

    async fn unlock(&self, session: &str, locks: &[(String, FencingToken)]) -> Result<Vec<String>> {
        self.store.unlock(session, locks).await
    }

    async fn observe_locks(&self, names: &[String]) -> Result<LocksObservation> {
        self.store.observe_locks(names).await
    }

    async fn collect_garbage(&self) -> Result<Collected> {
        self.store.collect_garbage().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold_core::store::memory::{Faults, MemoryStore};

    /// A memory store answering after `latency`, and the budget of R − P = 400 ms.
    fn slow_store(latency: Duration) -> (MemoryStore, RenewBudget, Registry) {
        let memory = MemoryStore::new(1);
        memory.set_faults(Faults {
            latency,
            ..Default::default()
        });
        let mut registry = Registry::default();
        let timing = Timing::parse("2s", "600ms", "200ms", 0.1).unwrap();
        let budget = RenewBudget::new(&timing, &mut registry);
        (memory, budget, registry)
    }

    async fn renewals(latency: Duration) -> (RenewBudget, Registry) {
        let (memory, budget, registry) = slow_store(latency);
        let store = budget.time(Arc::new(memory));
        let lease = Duration::from_secs(30);
        let grant = store.acquire("l", "a", lease).await.unwrap();
        for _ in 0..MIN_SAMPLES {
            store.renew("l", "a", grant.token, lease).await.unwrap();
        }
        (budget, registry)
    }

    #[tokio::test(start_paused = true)]
    async fn slow_renewals_are_reported_as_a_share_of_r_minus_p() {
        // 2 × 60 ms per call against R − P = 400 ms: 30 %.
        let (budget, registry) = renewals(Duration::from_millis(60)).await;
        let used = budget.used().unwrap();
        assert!((used - 0.3).abs() < 0.01, "{used}");
        assert!(budget.shared.at_risk.load(std::sync::atomic::Ordering::Relaxed));
        let verdict = budget.verdicts().borrow().expect("a verdict once judged");
        assert!(verdict.at_risk && (verdict.used - 0.3).abs() < 0.01, "{verdict:?}");
        assert_eq!(verdict.budget, Duration::from_millis(400));
        assert!(
            verdict.describe().contains("uses 30 % of R - P (400ms)"),
            "{}",
            verdict.describe()
        );
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(text.contains("leasehold_renew_budget_used 0.3"), "{text}");
    }

    #[tokio::test(start_paused = true)]
    async fn fast_renewals_are_not_at_risk() {
        let (budget, _) = renewals(Duration::from_millis(5)).await;
        assert!(budget.used().unwrap() < AT_RISK_SHARE);
        assert!(!budget.shared.at_risk.load(std::sync::atomic::Ordering::Relaxed));
        let verdict = budget
            .verdicts()
            .borrow()
            .expect("the first judgement is published too");
        assert!(!verdict.at_risk, "{verdict:?}");
    }

    /// Issue 38: a partitioned candidate renews a session, not a lease; its
    /// renewals count against the same budget, so `LeaseholdTimingAtRisk`
    /// and the pod's timing condition cover it too.
    #[tokio::test(start_paused = true)]
    async fn session_renewals_are_timed_against_the_budget() {
        let (memory, budget, registry) = slow_store(Duration::from_millis(60));
        let store = budget.time(Arc::new(memory));
        let timing = Timing::parse("2s", "600ms", "200ms", 0.1).unwrap();
        store.open_session("s", "a", timing.lease_duration).await.unwrap();
        for _ in 0..MIN_SAMPLES {
            store.renew_session("s").await.unwrap();
        }
        let verdict = budget.verdicts().borrow().expect("judged after the session's renewals");
        assert!(verdict.at_risk && (verdict.used - 0.3).abs() < 0.01, "{verdict:?}");
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(text.contains("leasehold_renew_budget_used 0.3"), "{text}");
    }
}
