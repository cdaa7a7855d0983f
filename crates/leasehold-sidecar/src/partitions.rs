//! The partitioned sidecar (`--partitions N`, or `spec.partitions`): instead
//! of one elector, a [`Session`] and a [`Partitioner`] share the lock's N
//! partitions with the other candidates (docs/partitions.md).
//!
//! What stays as in the single-lock sidecar: the HTTP API starts before the
//! store is reached (connecting, creating the tables with `--create-table`
//! and opening the session are retried with capped backoff, and the problem
//! is on `/healthz` and `/partitions`); one cancellation token owns
//! shutdown: SIGTERM stops claiming every partition at once, waits the
//! drain, closes the session (which frees them all) and exits 0.
//!
//! App health: a candidate whose app is unhealthy holds no partition. It
//! leaves as on SIGTERM (stop claiming, drain, close the session, so the
//! others pick its partitions up at their next poll, without waiting for an
//! expiry), and joins again with a new session once the app is healthy.
//!
//! Published: `/partitions`, `/watch`, the token file and the metrics. Not
//! the pod label or the readiness-gate condition: they say "this pod is the
//! leader", which no candidate of a partitioned lock is, and the publisher
//! clears them on every other candidate.

use std::sync::Arc;

use backon::BackoffBuilder;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use std::time::Duration;

use super::http::{PartitionsApi, PartitionsSetup};
use super::metrics::{MeteredStore, Metrics};
use super::starting::{CONNECT_TIMEOUT, Report};
use super::{Mode, Start, capped_backoff};
use leasehold_core::lease::{Assigned, Identity, Partitioner, Session, SessionStore, StoreError, Timing};
use leasehold_runtime::StoreConfig;

/// Starts the HTTP API's `/partitions`, the metrics and the token file of
/// the partitioned lock; the mode runs until its last session is closed.
pub(super) fn start(start: Start<'_>, count: u32) -> Mode {
    let Start {
        args,
        settings,
        kube: _,
        metrics,
        budget,
        starting,
        own,
        signalled: _,
        shutdown,
        bound: _,
        recorded,
    } = start;
    let report = Report::new(args.election.create_table, starting.sender);
    let (assigned_tx, assigned) = watch::channel(Assigned::default());
    // Kept here as well, so that without health sources it never closes.
    let campaigning_tx = Arc::new(watch::channel(true).0);
    let campaigning = campaigning_tx.subscribe();
    let follower = campaigning_tx.clone();
    // Partitions are held by a session, which records no end reasons.
    let app = super::campaign::start(args, own, metrics.clone(), move |stop| {
        follower.send_replace(stop.is_none());
    });
    let api = PartitionsApi {
        assigned: assigned.clone(),
        setup: PartitionsSetup {
            count,
            identity: settings.identity.to_string(),
            renew_deadline: settings.timing.renew_deadline,
        },
        app,
        starting: starting.problem,
    };
    let healthz = axum::Router::new()
        .route("/healthz", axum::routing::get(super::http::partitions_healthz))
        .with_state(api.clone());
    tokio::spawn(metrics.clone().follow_partitions(assigned.clone()));
    if let Some(path) = args.election.token_file.clone() {
        tokio::spawn(super::token_file::follow_partitions(path, assigned, api.setup.clone()));
    }

    let (choice, create_table, shutdown) = (settings.store.clone(), args.election.create_table, shutdown.clone());
    let member = Member {
        lock: settings.lock.clone(),
        count,
        identity: settings.identity.clone(),
        timing: settings.timing,
        drain: args.drain,
    };
    let running = async move {
        // The renewal budget watches the session's renewals, once connected.
        let connecting = connect(&choice, recorded.as_ref(), create_table, metrics, &report);
        let store = tokio::select! {
            store = connecting => Some(budget.time(store)),
            _ = shutdown.cancelled() => None,
        };
        if let Some(store) = store {
            member
                .take_part(Arc::new(store), &report, campaigning, &assigned_tx, &shutdown)
                .await;
        }
        info!("partitioned run stopped");
        drop((assigned_tx, campaigning_tx));
    };
    Mode {
        api: super::http::partitions_router(api),
        healthz,
        set_timing: Box::new(|_| {
            warn!("the lease's timing changed; a partitioned sidecar applies it after a restart");
        }),
        running: Box::pin(running),
    }
}

/// This candidate's part in the partitioned lock.
struct Member {
    lock: String,
    count: u32,
    identity: Identity,
    timing: Timing,
    drain: Duration,
}

impl Member {
    /// Takes part until `shutdown`, through one session per stretch of app
    /// health, publishing what may be worked on into `published`.
    async fn take_part(
        &self,
        store: Arc<dyn SessionStore>,
        report: &Report,
        mut campaigning: watch::Receiver<bool>,
        published: &watch::Sender<Assigned>,
        shutdown: &CancellationToken,
    ) {
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                healthy = campaigning.wait_for(|on| *on) => if healthy.is_err() { return },
            }
            let Some(session) = self.open_session(&store, report, shutdown).await else {
                return;
            };
            info!(lock = %self.lock, partitions = self.count, session = %session.id(), "taking part");
            let partitioner = Partitioner::new(session, &self.lock, self.count, self.drain);
            let mut assigned = partitioner.assigned();
            // Leaving (SIGTERM or the app turning unhealthy) stops claiming,
            // drains and closes the session: Partitioner::run does all three.
            let leave = shutdown.child_token();
            let run = partitioner.run(leave.clone());
            let mut run = std::pin::pin!(run);
            let mut following = true;
            let ended = loop {
                tokio::select! {
                    ended = &mut run => break ended,
                    changed = assigned.changed(), if following => match changed {
                        Ok(()) => {
                            published.send_replace(assigned.borrow_and_update().clone());
                        }
                        Err(_) => following = false,
                    },
                    unhealthy = campaigning.wait_for(|on| !*on), if !leave.is_cancelled() => if unhealthy.is_ok() {
                        warn!(drain = ?self.drain, "the app is unhealthy: handing every partition over");
                        leave.cancel();
                    },
                }
            };
            // The session is closed (or its closing failed): nothing is held.
            let session = published.borrow().session.clone();
            published.send_modify(|a| {
                a.partitions.clear();
                a.deadline = None;
            });
            match ended {
                Ok(()) => info!("session closed: every partition is free"),
                Err(e) => close_again(&*store, &session, self.timing.lease_duration, e).await,
            }
        }
    }

    /// Opens a session, retrying with capped backoff; `None` on shutdown.
    async fn open_session(
        &self,
        store: &Arc<dyn SessionStore>,
        report: &Report,
        shutdown: &CancellationToken,
    ) -> Option<Session> {
        let mut backoff = capped_backoff().build();
        loop {
            let opened = tokio::select! {
                opened = Session::open(store.clone(), self.identity.clone(), self.timing) => opened,
                _ = shutdown.cancelled() => return None,
            };
            match opened {
                Ok(session) => {
                    report.answered();
                    return Some(session);
                }
                Err(e) => {
                    report.failed(&e);
                    tokio::select! {
                        _ = tokio::time::sleep(backoff.next().unwrap_or(super::BACKOFF_CAP)) => {}
                        _ = shutdown.cancelled() => return None,
                    }
                }
            }
        }
    }
}

/// Closing the session failed (on the Spanner emulator, often cut short by
/// another transaction): it is no longer renewed, so its partitions come
/// free when it expires, but the others need not wait for that. Retries
/// with capped backoff until closed (`Lost`: gone already) or `lease` has
/// passed, by which time it has expired anyway.
async fn close_again(store: &dyn SessionStore, session: &str, lease: Duration, first: StoreError) {
    let give_up = tokio::time::Instant::now() + lease;
    let mut backoff = capped_backoff().build();
    let mut result = Err(first);
    loop {
        let error = match result {
            Ok(()) | Err(StoreError::Lost { .. }) => {
                info!(%session, "session closed: every partition is free");
                return;
            }
            Err(e) => e,
        };
        let delay = backoff.next().unwrap_or(super::BACKOFF_CAP);
        if tokio::time::Instant::now() + delay >= give_up {
            warn!(%session, error = %error.chain(), "closing the session failed; its partitions come free when it expires");
            return;
        }
        tokio::time::sleep(delay).await;
        result = store.close_session(session).await;
    }
}

/// Connects to the store (and, with `create_table`, creates the session
/// tables), retrying with capped backoff and reporting until it answers.
async fn connect(
    choice: &StoreConfig,
    recorded: Option<&super::lease_store::Recorded>,
    create_table: bool,
    metrics: Metrics,
    report: &Report,
) -> Arc<dyn SessionStore> {
    let mut backoff = capped_backoff().build();
    loop {
        let attempt = async {
            let timed_out = || StoreError::unavailable(format!("no answer within {CONNECT_TIMEOUT:?}"));
            if let Some(recorded) = recorded {
                tokio::time::timeout(CONNECT_TIMEOUT, super::lease_store::admit(choice, recorded))
                    .await
                    .map_err(|_| timed_out())??;
            }
            let store = tokio::time::timeout(CONNECT_TIMEOUT, choice.connect_sessions())
                .await
                .map_err(|_| timed_out())??;
            let store: Arc<dyn SessionStore> = Arc::new(MeteredStore::new(store, metrics.clone()));
            if create_table {
                tokio::time::timeout(CONNECT_TIMEOUT, store.ensure_session_schema())
                    .await
                    .map_err(|_| timed_out())??;
            }
            Ok::<_, StoreError>(store)
        };
        match attempt.await {
            Ok(store) => return store,
            Err(e) => {
                report.failed(&e);
                tokio::time::sleep(backoff.next().unwrap_or(super::BACKOFF_CAP)).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold_core::lease::partitions::PartitionView;
    use leasehold_core::store::memory::MemoryStore;

    async fn until(
        published: &mut watch::Receiver<Assigned>,
        what: &str,
        done: impl Fn(&Assigned) -> bool,
    ) -> Assigned {
        let found = tokio::time::timeout(Duration::from_secs(30), async {
            published.wait_for(|a| done(a)).await.unwrap().clone()
        })
        .await;
        found.unwrap_or_else(|_| panic!("never {what}: {:?}", *published.borrow()))
    }

    /// An unhealthy app's candidate holds no partition and no member slot:
    /// it stops claiming at once, closes its session after the drain (the
    /// partitions are free in the store then, not at an expiry), and joins
    /// again with a new session once the app is healthy. SIGTERM ends the
    /// same way.
    #[tokio::test(start_paused = true)]
    async fn an_unhealthy_app_leaves_its_partitions_and_a_healthy_one_rejoins() {
        let memory = MemoryStore::new(1);
        let store: Arc<dyn SessionStore> = Arc::new(memory.clone());
        let drain = Duration::from_secs(2);
        let member = Member {
            lock: "jobs".into(),
            count: 4,
            identity: Identity::new(None, None, "pod-0"),
            timing: Timing::default(),
            drain,
        };
        let report = Report::new(false, watch::channel(None).0);
        let (campaigning_tx, campaigning) = watch::channel(true);
        let (published_tx, mut published) = watch::channel(Assigned::default());
        let shutdown = CancellationToken::new();
        let task = {
            let (store, shutdown) = (store.clone(), shutdown.clone());
            tokio::spawn(async move {
                member
                    .take_part(store, &report, campaigning, &published_tx, &shutdown)
                    .await
            })
        };
        let first = until(&mut published, "holding all 4", |a| a.partitions.len() == 4).await;

        campaigning_tx.send_replace(false);
        let left = tokio::time::Instant::now();
        until(&mut published, "stopping to claim", |a| a.partitions.is_empty()).await;
        assert!(left.elapsed() < drain, "stops claiming before the drain");
        let view = PartitionView::observe(&*store, "jobs", 4).await.unwrap();
        assert_eq!(view.unowned(), 0, "still held in the store during the drain");
        tokio::time::sleep(drain + Duration::from_millis(100)).await;
        let view = PartitionView::observe(&*store, "jobs", 4).await.unwrap();
        assert_eq!(
            (view.members.len(), view.unowned()),
            (0, 4),
            "closed after the drain: {view:?}"
        );

        campaigning_tx.send_replace(true);
        let again = until(&mut published, "holding all 4 again", |a| a.partitions.len() == 4).await;
        assert_ne!(again.session, first.session, "a new session");

        shutdown.cancel();
        task.await.unwrap();
        assert!(published.borrow().partitions.is_empty());
        let view = PartitionView::observe(&*store, "jobs", 4).await.unwrap();
        assert_eq!((view.members.len(), view.unowned()), (0, 4), "closed on shutdown");
    }
}
