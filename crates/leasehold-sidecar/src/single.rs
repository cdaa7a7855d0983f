//! The single-lease mode of the sidecar: one [`Elector`] on the lock, and
//! what follows its state (the HTTP API's `/leader` and `/watch`, the gate
//! probe, the metrics, the token file, the peers' versions and, inside
//! Kubernetes, the pod label, the readiness condition and Events).
//!
//! Ordering: on loss or deadline the sidecar stops claiming first (HTTP 503
//! and the watch event come from the elector's state at once; then the
//! readiness condition) and only then fixes labels. On SIGTERM it stops
//! claiming, waits the drain window, releases and exits 0.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::info;

use super::metrics::MeteredStore;
use super::{
    Mode, Start, campaign, config, drained, footprint, http, own_pod, pod, publish, starting, store_reach, token_file,
    transfer, versions,
};
use leasehold_core::lease::{Change, Elector, LeaderContext, LeaseStore};

/// Starts the elector and what follows it.
pub(super) async fn start(start: Start<'_>) -> super::Result<Mode> {
    let Start {
        args,
        settings,
        kube,
        metrics,
        budget,
        starting,
        own,
        signalled,
        shutdown,
        bound,
        recorded,
    } = start;
    let (starting_tx, starting) = (starting.sender, starting.problem);
    let (choice, metered) = (settings.store.clone(), metrics.clone());
    let create_table = args.election.create_table;
    let starting_store: Arc<dyn LeaseStore> = Arc::new(starting::StartingStore::spawn(
        move || {
            let (choice, metrics, recorded) = (choice.clone(), metered.clone(), recorded.clone());
            Box::pin(async move {
                if let Some(recorded) = &recorded {
                    super::lease_store::admit(&choice, recorded).await?;
                }
                let store: Arc<dyn LeaseStore> =
                    Arc::new(MeteredStore::new(choice.connect(create_table).await?, metrics));
                Ok(store)
            })
        },
        create_table,
        starting_tx,
    ));
    // The renewal budget watches what the elector sees: every call, once connected.
    let store: Arc<dyn LeaseStore> = Arc::new(budget.time(starting_store));

    let version = match (kube, &settings.pod) {
        (Some(client), Some(pod)) => {
            let pods = ::kube::Api::namespaced(client.clone(), &pod.namespace);
            let mut revisions = versions::Revisions::new(::kube::Api::namespaced(client.clone(), &pod.namespace));
            let flags = settings.version.clone();
            versions::own_version(&pods, &mut revisions, &pod.name, args.app_container.as_deref(), flags).await
        }
        _ => settings.version.clone(),
    };
    info!(version = version.as_ref().map(ToString::to_string), policy = ?settings.versions, "version");
    // The holder carries the pod UID, so that the next process of this pod
    // (the kubelet restarting this container) takes the lease over at once
    // instead of waiting D. Only the sidecar: a `leasehold run` command may
    // outlive its dead runner by the watchdog's grace period.
    let identity = match args.election.pod_uid.as_deref() {
        Some(uid) => settings.identity.clone().in_pod(uid).map_err(config::Error::PodUid)?,
        None => settings.identity.clone(),
    };
    let elector = Elector::new(settings.lock.clone(), identity, settings.timing)
        .with_version(version.clone(), settings.versions.fence);
    let transitions = elector.transitions();
    // Leader work here is the drain window: when stepping down on purpose
    // (SIGTERM, the pod deleted, the app turned unhealthy) the main
    // container sees 503 first and gets time to finish before we release.
    let reserve = own_pod::release_reserve(&settings.timing);
    let (drained, acked) = tokio::sync::watch::channel(None);
    let drain = Drain {
        most: args.drain,
        renew_deadline: settings.timing.renew_deadline,
    };
    let work = drain_on_step_down(drain, reserve, own.clone(), signalled.clone(), acked);
    let handle = elector.spawn_with_work(store, shutdown.clone(), work);
    let state = handle.subscribe();
    tokio::spawn(footprint::release_start_up_pages(
        state.clone(),
        settings.timing.retry_period,
    ));
    let control = handle.control();
    let app = campaign::start(args, own, metrics.clone(), move |stop| control.campaign_unless(stop));
    let api = http::ApiState {
        leader: state.clone(),
        app: app.clone(),
        starting,
    };
    let healthz = axum::Router::new()
        .route("/healthz", axum::routing::get(http::healthz))
        .route(
            leasehold_kubernetes::api::contract::GATE_PROBE_PATH,
            axum::routing::get(http::gate),
        )
        .with_state(api.clone());
    tokio::spawn(metrics.follow(settings.lock.clone(), state.clone()));
    if let (Some(client), Some(pod)) = (kube.clone(), settings.pod.clone()) {
        tokio::spawn(store_reach::publish(client, pod, state.clone()));
    }
    if let Some(path) = args.election.token_file.clone() {
        tokio::spawn(token_file::follow(path, state.clone()));
    }
    if let (Some(client), Some(pod)) = (kube.clone(), settings.pod.clone())
        && settings.versions.prefer != leasehold_core::lease::Prefer::None
    {
        tokio::spawn(versions::follow_peers(
            ::kube::Api::namespaced(client.clone(), &pod.namespace),
            versions::Revisions::new(::kube::Api::namespaced(client, &pod.namespace)),
            versions::Candidate {
                me: pod.name,
                selector: settings.publishing.selector.clone(),
                app_container: args.app_container.clone(),
                mine: version,
                prefer: settings.versions.prefer,
                fence: settings.versions.fence,
            },
            handle.control(),
            handle.subscribe(),
        ));
    }
    if let Some(((client, pod), lease)) = bound.clone() {
        let transfers = transfer::Transfers {
            transfers: ::kube::Api::namespaced(client.clone(), &pod.namespace),
            pods: ::kube::Api::namespaced(client.clone(), &pod.namespace),
            lease: lease.name,
            selector: settings.publishing.selector.clone(),
            window: settings.timing.lease_duration,
            drain: args.drain,
            recorder: pod::pod_recorder(client, &pod).0,
            me: pod,
        };
        tokio::spawn(transfers.follow(handle.control(), handle.subscribe(), handle.transitions()));
    }
    let publisher = kube.clone().zip(settings.pod.clone()).map(|(client, pod)| {
        let publisher = publish::Publisher::new(client, pod, settings.publishing.clone());
        tokio::spawn(publisher.run(state.clone(), transitions, app.clone(), handle.control()))
    });
    let control = handle.control();
    let running = async move {
        handle.join().await;
        info!("elector stopped");
        if let Some(publisher) = publisher
            && let Err(e) = publisher.await
        {
            tracing::warn!(error = %e, "the Kubernetes publisher ended abnormally");
        }
    };
    // The drain acknowledgement, on the local API only (never the metrics port).
    let acks = drained::Acks {
        leader: state.clone(),
        drained,
    };
    Ok(Mode {
        api: http::router(api).merge(drained::router(acks)),
        healthz,
        set_timing: Box::new(move |t| control.set_timing(t)),
        running: Box::pin(running),
    })
}

/// How long a step-down drains: `most` (`--drain`), and never past R after
/// the term's last renewal was sent.
#[derive(Debug, Clone, Copy)]
struct Drain {
    most: Duration,
    renew_deadline: Duration,
}

impl Drain {
    /// The drain left at `now` for a term last renewed (sent) at `renewed`.
    fn left(self, renewed: Option<tokio::time::Instant>, now: tokio::time::Instant) -> Duration {
        let lapses = renewed.map_or(Duration::ZERO, |sent| {
            (sent + self.renew_deadline).saturating_duration_since(now)
        });
        self.most.min(lapses)
    }
}

/// The sidecar's leader work: when the term ends on purpose (SIGTERM, the
/// pod deleted, the app turned unhealthy) drain before the elector releases:
/// `drain` at most, over as soon as the app container run that led has
/// exited, and never past `reserve` before the pod's grace period ends
/// ([`own_pod::drain`]), or as soon as the app acknowledges the term's
/// drain ([`drained`]); a lost term ends at once. `signalled`: a signal
/// came (not a retirement, which drains like any step-down).
///
/// Nothing renews while the leader drains, so the drain also ends at R
/// after the last renewal was sent (issue 54): the release, which carries a
/// transfer's reservation, then still lands before the store can let the
/// lease expire (D > R), instead of after another candidate acquired (on
/// Redis the key is gone at its TTL).
fn drain_on_step_down(
    drain: Drain,
    reserve: Duration,
    own: Option<tokio::sync::watch::Receiver<own_pod::OwnPod>>,
    signalled: CancellationToken,
    acked: tokio::sync::watch::Receiver<Option<leasehold_core::lease::FencingToken>>,
) -> impl FnMut(LeaderContext) -> futures::future::BoxFuture<'static, ()> {
    move |ctx: LeaderContext| {
        let (own, signalled, acked) = (own.clone(), signalled.clone(), acked.clone());
        // The app run this term leads for: its end ends the drain.
        let led = own.as_ref().and_then(|o| o.borrow().app);
        Box::pin(async move {
            ctx.cancelled.cancelled().await;
            // The cancellation can arrive (it follows the shutdown token)
            // before the elector publishes why the term ended: read the
            // reason only once the state no longer claims.
            let mut state = ctx.state.clone();
            let ended = state
                .wait_for(|s| !s.leader)
                .await
                .map(|s| (s.change.clone(), s.renewed));
            if let Ok((Change::SteppingDown, renewed)) = ended {
                let drain = drain.left(renewed, tokio::time::Instant::now());
                info!(?drain, "stopped claiming; draining before the release");
                tokio::select! {
                    () = own_pod::drain(drain, reserve, own, led, signalled) => {}
                    () = drained::acknowledged(acked, ctx.token) => info!("the app acknowledged the drain; releasing"),
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Args, metrics::Metrics, pod, rbac, watch_own_pod};
    use super::*;
    use leasehold_core::lease::{Identity, Timing};
    use leasehold_core::store::memory::MemoryStore;
    use prometheus_client::registry::Registry;

    /// SIGTERM: 503 at once, the drain, then the release. On a current-thread
    /// runtime with paused time the leader work wakes on shutdown in the same
    /// turn as the elector, so a check made before the elector says
    /// "stepping down" would skip the drain.
    #[tokio::test(start_paused = true)]
    async fn shutdown_stops_claiming_then_drains_then_releases() {
        let drain = Duration::from_secs(5);
        let store = MemoryStore::new(1);
        let timing = Timing::default();
        let elector = Elector::new("drain", Identity::new(None, None, "pod-0"), timing);
        let shutdown = CancellationToken::new();
        let handle = elector.spawn_with_work(
            Arc::new(store.clone()),
            shutdown.clone(),
            drain_on_step_down(at_most(drain), Duration::ZERO, None, shutdown.clone(), never_acked()),
        );
        let mut state = handle.subscribe();
        state.wait_for(|s| s.leader).await.unwrap();
        shutdown.cancel();
        state.wait_for(|s| !s.leader).await.unwrap();
        let stopped = tokio::time::Instant::now();
        let joined = tokio::spawn(handle.join());
        tokio::time::sleep(drain - Duration::from_millis(1)).await;
        let held = store.observe("drain").await.unwrap();
        assert!(
            held.live_holder().is_some(),
            "released {:?} into a {drain:?} drain",
            stopped.elapsed()
        );
        joined.await.unwrap();
        assert!(stopped.elapsed() >= drain);
        assert_eq!(
            store.observe("drain").await.unwrap().live_holder(),
            None,
            "released after the drain"
        );
    }

    /// A drain of `most` under the default timing.
    fn at_most(most: Duration) -> Drain {
        Drain {
            most,
            renew_deadline: Timing::default().renew_deadline,
        }
    }

    /// Issue 54: a drain longer than the lease ends at R after the last
    /// renewal (nothing renews while draining), so the release lands while
    /// the row is still ours: released, not expired and not taken.
    #[tokio::test(start_paused = true)]
    async fn a_drain_longer_than_the_lease_ends_before_the_lease_can_expire() {
        let timing = Timing::default();
        let store = MemoryStore::new(1);
        let elector = Elector::new("drain", Identity::new(None, None, "pod-0"), timing);
        let shutdown = CancellationToken::new();
        let handle = elector.spawn_with_work(
            Arc::new(store.clone()),
            shutdown.clone(),
            drain_on_step_down(
                at_most(timing.lease_duration * 4),
                Duration::ZERO,
                None,
                shutdown.clone(),
                never_acked(),
            ),
        );
        let mut state = handle.subscribe();
        let renewed = state.wait_for(|s| s.leader).await.unwrap().renewed.unwrap();
        shutdown.cancel();
        let mut changes = handle.subscribe();
        handle.join().await;
        let released_at = tokio::time::Instant::now();
        assert!(
            released_at <= renewed + timing.renew_deadline + Duration::from_millis(100),
            "released {:?} after the last renewal, past R = {:?}",
            released_at - renewed,
            timing.renew_deadline
        );
        assert_eq!(
            changes.borrow_and_update().change,
            Change::Released,
            "the release itself succeeded"
        );
        let row = store.observe("drain").await.unwrap();
        assert_eq!(row.live_holder(), None, "released");
    }

    /// A drain no app acknowledges.
    fn never_acked() -> tokio::sync::watch::Receiver<Option<leasehold_core::lease::FencingToken>> {
        tokio::sync::watch::channel(None).1
    }

    /// Issue 35: the app's acknowledgement of the term it stood aside from
    /// ends the drain at once; the release follows.
    #[tokio::test(start_paused = true)]
    async fn an_acknowledged_drain_releases_at_once() {
        let drain = Duration::from_secs(60);
        let store = MemoryStore::new(1);
        let elector = Elector::new("drain", Identity::new(None, None, "pod-0"), Timing::default());
        let shutdown = CancellationToken::new();
        let (drained, acked) = tokio::sync::watch::channel(None);
        let handle = elector.spawn_with_work(
            Arc::new(store.clone()),
            shutdown.clone(),
            drain_on_step_down(at_most(drain), Duration::ZERO, None, shutdown.clone(), acked),
        );
        let mut state = handle.subscribe();
        let token = state.wait_for(|s| s.leader).await.unwrap().token;
        shutdown.cancel();
        state.wait_for(|s| !s.leader).await.unwrap();
        let stopped = tokio::time::Instant::now();
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(
            store.observe("drain").await.unwrap().live_holder().is_some(),
            "draining"
        );
        drained.send_replace(token);
        handle.join().await;
        assert!(
            stopped.elapsed() < drain / 10,
            "released {:?} after stopping",
            stopped.elapsed()
        );
        assert_eq!(store.observe("drain").await.unwrap().live_holder(), None);
    }

    /// The metrics port, which listens on every address, has no drain
    /// acknowledgement.
    #[tokio::test]
    async fn the_metrics_port_serves_no_drain_acknowledgement() {
        use tower::ServiceExt;
        let router = super::super::metrics_router(Registry::default(), axum::Router::new());
        let request = axum::http::Request::post(format!("{}?token=1", drained::PATH))
            .body(axum::body::Body::empty())
            .unwrap();
        let response = router.oneshot(request).await.unwrap();
        assert_eq!(response.status(), axum::http::StatusCode::NOT_FOUND);
    }

    /// web-0's sidecar as `run` wires it (own-pod watch, health, campaign,
    /// drain), on the API server model and a memory store, leading with
    /// its app container running: the store, the model and the elector.
    struct LeaderPod {
        api: leasehold_testkit::api::ApiServer,
        store: MemoryStore,
        handle: leasehold_core::lease::ElectorHandle,
        /// SIGTERM.
        shutdown: CancellationToken,
    }

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: Args,
    }

    /// The app container's status: running (and ready) or terminated.
    fn app_status(running: bool, restarts: i32) -> serde_json::Value {
        let state = match running {
            true => serde_json::json!({"running": {"startedAt": "2026-11-25T09:00:00Z"}}),
            false => serde_json::json!({"terminated": {"exitCode": 137, "reason": "Error",
                "startedAt": "2026-11-25T09:00:00Z", "finishedAt": "2026-11-25T09:01:00Z"}}),
        };
        serde_json::json!({"name": "app", "ready": running, "restartCount": restarts,
            "image": "app", "imageID": "", "state": state})
    }

    /// A lease that outlasts the drains and grace periods here (D = 2 min,
    /// P = 2 s): an undrained lease must not simply expire under the test.
    fn long_lease() -> Timing {
        Timing::new(
            Duration::from_secs(120),
            Duration::from_secs(60),
            Duration::from_secs(2),
            0.0,
        )
        .unwrap()
    }

    impl LeaderPod {
        /// `native`: the sidecar is an init container with `restartPolicy: Always`.
        async fn start(drain: &str, native: bool) -> LeaderPod {
            use clap::Parser;
            use leasehold_testkit::api::{ApiServer, pods};
            let api = ApiServer::new(Some(rbac::allows_request));
            let mut pod = pods::pod("web-0", "prod", serde_json::json!({"app": "web"}), None);
            pod["status"]["containerStatuses"] = serde_json::json!([app_status(true, 0)]);
            if native {
                pod["spec"]["initContainers"] = serde_json::json!([{"name": leasehold_kubernetes::api::contract::SIDECAR_CONTAINER, "restartPolicy": "Always"}]);
            }
            api.insert(&pods::collection("prod"), pod);
            let cli = Cli::parse_from(["sidecar", "--app-container", "app", "--drain", drain]);
            let pod = pod::PodRef {
                name: "web-0".into(),
                namespace: "prod".into(),
                uid: Some("uid-0".into()),
            };
            let timing = long_lease();
            let own = watch_own_pod(Some(api.client("prod")), Some(&pod), cli.args.app_container.clone());
            let store = MemoryStore::new(1);
            let elector = Elector::new("web", Identity::new(None, Some("prod".into()), "web-0"), timing);
            let shutdown = CancellationToken::new();
            let reserve = own_pod::release_reserve(&timing);
            let drain = Drain {
                most: cli.args.drain,
                renew_deadline: timing.renew_deadline,
            };
            let work = drain_on_step_down(drain, reserve, own.clone(), shutdown.clone(), never_acked());
            let handle = elector.spawn_with_work(Arc::new(store.clone()), shutdown.clone(), work);
            let control = handle.control();
            let metrics = Metrics::new(&mut Registry::default());
            campaign::start(&cli.args, own, metrics, move |stop| control.campaign_unless(stop));
            handle.subscribe().wait_for(|s| s.leader).await.unwrap();
            LeaderPod {
                api,
                store,
                handle,
                shutdown,
            }
        }

        fn update(&self, change: impl FnOnce(&mut serde_json::Value)) {
            use leasehold_testkit::api::pods;
            let mut pod = self.api.get(&pods::collection("prod"), "web-0").unwrap();
            change(&mut pod);
            self.api.insert(&pods::collection("prod"), pod);
        }

        /// Marks the pod deleted with `grace`, as the API server does.
        fn delete(&self, grace: Duration) {
            let at = humantime::format_rfc3339_seconds(std::time::SystemTime::now() + grace).to_string();
            self.update(|pod| {
                pod["metadata"]["deletionTimestamp"] = serde_json::json!(at);
                pod["metadata"]["deletionGracePeriodSeconds"] = serde_json::json!(grace.as_secs());
            });
        }

        fn app(&self, running: bool, restarts: i32) {
            self.update(|pod| pod["status"]["containerStatuses"] = serde_json::json!([app_status(running, restarts)]));
        }

        async fn held(&self) -> bool {
            self.store.observe("web").await.unwrap().live_holder().is_some()
        }

        /// Waits (paused time) for the release; how long it took.
        async fn released(&self) -> Duration {
            let started = tokio::time::Instant::now();
            while self.held().await {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            started.elapsed()
        }
    }

    /// Item 1 of issue 25: the pod deleted while its app ignores SIGTERM.
    /// The leader stops claiming at once, keeps the lease through the drain
    /// (60 s here), and releases before the grace period (30 s) runs out,
    /// leaving the release its reserve (P): a sidecar is never killed
    /// holding a lease it could have released.
    #[tokio::test(start_paused = true)]
    async fn a_deleted_leader_pod_stops_claiming_at_once_and_releases_before_its_grace_period_ends() {
        let pod = LeaderPod::start("60s", false).await;
        let grace = Duration::from_secs(30);
        let reserve = own_pod::release_reserve(&long_lease());
        pod.delete(grace);
        let mut state = pod.handle.subscribe();
        state.wait_for(|s| !s.leader).await.unwrap();
        assert!(pod.held().await, "stopped claiming, still holding the lease to drain");
        // The deletion timestamp has whole seconds, as the API server's.
        tokio::time::sleep(grace - reserve - Duration::from_secs(2)).await;
        assert!(pod.held().await, "the app still runs: the drain goes on");
        let released = pod.released().await;
        assert!(
            released <= Duration::from_secs(2),
            "released {released:?} after the reserve began: the grace period ends {reserve:?} later"
        );
        assert_eq!(pod.handle.state().change, Change::Released);
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(!pod.held().await, "a terminating pod never campaigns again");
        assert!(!pod.handle.state().campaigning);
    }

    /// With the app container gone there is nothing left to drain: a
    /// deleted pod releases as soon as its status shows the app exited.
    #[tokio::test(start_paused = true)]
    async fn a_deleted_leader_pod_releases_as_soon_as_its_app_has_exited() {
        let pod = LeaderPod::start("60s", false).await;
        pod.delete(Duration::from_secs(30));
        pod.handle.subscribe().wait_for(|s| !s.leader).await.unwrap();
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(pod.held().await, "the app still runs: draining");
        pod.app(false, 0);
        let released = pod.released().await;
        assert!(
            released < Duration::from_secs(1),
            "released {released:?} after the app exited"
        );
    }

    /// Item 3 of issue 25: an app container that terminated releases at
    /// once, without the drain (60 s here); restarted and ready, it leads again.
    #[tokio::test(start_paused = true)]
    async fn an_app_container_that_exited_releases_at_once_and_campaigns_again_when_restarted() {
        let pod = LeaderPod::start("60s", false).await;
        pod.app(false, 0);
        let released = pod.released().await;
        assert!(
            released < Duration::from_secs(1),
            "released {released:?} after the app exited"
        );
        pod.app(true, 1);
        pod.handle.subscribe().wait_for(|s| s.leader).await.unwrap();
    }

    /// The drain ends when the run of the app that led has ended, also when
    /// the kubelet has already restarted it (running again, one more restart).
    #[tokio::test(start_paused = true)]
    async fn an_app_restarted_between_two_looks_ends_the_drain() {
        let pod = LeaderPod::start("60s", false).await;
        pod.update(|p| {
            let mut restarted = app_status(true, 1);
            restarted["ready"] = serde_json::json!(false);
            p["status"]["containerStatuses"] = serde_json::json!([restarted]);
        });
        let released = pod.released().await;
        assert!(
            released < Duration::from_secs(1),
            "released {released:?} after the restart"
        );
    }

    /// A native sidecar gets SIGTERM only once the app containers have
    /// exited, while the pod's status still shows the app running (the
    /// kubelet writes it once the whole pod has stopped): the SIGTERM ends
    /// the drain.
    #[tokio::test(start_paused = true)]
    async fn sigterm_to_a_native_sidecar_of_a_deleted_pod_ends_the_drain() {
        let pod = LeaderPod::start("60s", true).await;
        pod.delete(Duration::from_secs(30));
        pod.handle.subscribe().wait_for(|s| !s.leader).await.unwrap();
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(pod.held().await, "the app still runs: draining");
        pod.shutdown.cancel();
        let released = pod.released().await;
        assert!(released < Duration::from_secs(1), "released {released:?} after SIGTERM");
    }

    /// A sidecar that is a regular container gets SIGTERM together with the
    /// app: the app may still be running, so the drain goes on.
    #[tokio::test(start_paused = true)]
    async fn sigterm_to_a_sidecar_container_keeps_the_drain() {
        let pod = LeaderPod::start("60s", false).await;
        pod.delete(Duration::from_secs(30));
        pod.shutdown.cancel();
        pod.handle.subscribe().wait_for(|s| !s.leader).await.unwrap();
        tokio::time::sleep(Duration::from_secs(20)).await;
        assert!(pod.held().await, "the app may still run: draining");
    }
}
