//! Our own pod, as the sidecar acts on it: whether Kubernetes is deleting
//! it (and by when the kubelet may kill us), and the app container's state.
//! One watch of the pod feeds the app's health ([`super::health`]), the
//! campaign ([`steer_campaign`]) and the drain before a release
//! ([`super::single::drain_on_step_down`]).
//!
//! Kubernetes announces a graceful deletion before it acts: the API server
//! sets `metadata.deletionTimestamp` to the deletion time plus the grace
//! period and `deletionGracePeriodSeconds` to that period ("the time at
//! which this resource will be deleted", core/v1 ObjectMeta;
//! apiserver/pkg/registry/rest/delete.go `BeforeDelete`), and the kubelet
//! kills whatever still runs when the grace period is over.

use std::time::{Duration, SystemTime};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{info, warn};

use super::health::{AppHealth, Verdict, container_verdict};
use leasehold_core::lease::EndReason;
use leasehold_kubernetes::api::contract::SIDECAR_CONTAINER;
use tokio_util::sync::CancellationToken;

/// What the pod watch last showed.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct OwnPod {
    /// Set once the pod is being deleted.
    pub terminating: Option<Termination>,
    /// The app container (`--app-container`) as the pod's status lists it.
    pub app: Option<AppProcess>,
    /// The app container's readiness, for the health source.
    pub app_verdict: Verdict,
    /// We run as a native sidecar (an init container named
    /// [`SIDECAR_CONTAINER`] with `restartPolicy: Always`): the kubelet
    /// sends us SIGTERM only once every app container has exited.
    pub native_sidecar: bool,
}

impl Default for OwnPod {
    fn default() -> Self {
        OwnPod {
            terminating: None,
            app: None,
            app_verdict: Verdict::Unknown("pod not read yet".into()),
            native_sidecar: false,
        }
    }
}

/// A pod being deleted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Termination {
    /// The earliest moment the kubelet may kill us: the deletion's grace
    /// period counted from when we saw it, or the `deletionTimestamp` read
    /// on our wall clock, whichever is sooner.
    pub grace_ends: Instant,
}

/// One run of the app container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AppProcess {
    /// `state.running` is set: the run counted by `restarts` is alive.
    pub running: bool,
    pub restarts: i32,
}

impl AppProcess {
    /// Whether the run seen as `before` has ended: the container stopped,
    /// or the kubelet started another run since.
    pub(crate) fn ended_since(now: Option<AppProcess>, before: Option<AppProcess>) -> bool {
        match (now, before) {
            (Some(now), Some(before)) => !now.running || now.restarts != before.restarts,
            (Some(now), None) => !now.running,
            (None, _) => false,
        }
    }
}

impl OwnPod {
    /// What `pod` shows, keeping the earliest grace end seen so far
    /// (`earlier`): a later look must never push it back, and a second
    /// deletion with a shorter grace period brings it forward.
    pub(crate) fn read(pod: &Pod, app_container: Option<&str>, earlier: Option<Termination>, at: Instant) -> OwnPod {
        let terminating = termination(pod, at).map(|t| match earlier {
            Some(e) if e.grace_ends <= t.grace_ends => e,
            _ => t,
        });
        let app = app_container.and_then(|name| {
            let status = pod
                .status
                .as_ref()?
                .container_statuses
                .as_ref()?
                .iter()
                .find(|c| c.name == name)?;
            Some(AppProcess {
                running: status.state.as_ref().is_some_and(|s| s.running.is_some()),
                restarts: status.restart_count,
            })
        });
        let app_verdict = match app_container {
            Some(name) => container_verdict(pod, name),
            None => Verdict::Unknown("no app container to follow".into()),
        };
        let native_sidecar = pod
            .spec
            .iter()
            .flat_map(|s| s.init_containers.iter().flatten())
            .any(|c| c.name == SIDECAR_CONTAINER && c.restart_policy.as_deref() == Some("Always"));
        OwnPod {
            terminating,
            app,
            app_verdict,
            native_sidecar,
        }
    }
}

/// When the grace period of a deletion shown on `pod` ends, from `at`.
fn termination(pod: &Pod, at: Instant) -> Option<Termination> {
    let deleted_at = pod.metadata.deletion_timestamp.as_ref()?;
    let grace = Duration::from_secs(
        pod.metadata
            .deletion_grace_period_seconds
            .unwrap_or(0)
            .try_into()
            .unwrap_or(0),
    );
    let by_timestamp = SystemTime::from(deleted_at.0)
        .duration_since(SystemTime::now())
        .unwrap_or(Duration::ZERO);
    Some(Termination {
        grace_ends: at + grace.min(by_timestamp),
    })
}

/// Watches our own pod and publishes what it shows; `app_container` is the
/// container leadership follows, if any.
pub(crate) async fn watch(pods: Api<Pod>, pod: String, app_container: Option<String>, own: watch::Sender<OwnPod>) {
    let config = watcher::Config::default().fields(&format!("metadata.name={pod}"));
    let events = watcher(pods, config).backoff(super::pod::watch_backoff());
    let mut events = std::pin::pin!(events);
    while let Some(event) = events.next().await {
        let earlier = own.borrow().terminating;
        let next = match event {
            Ok(watcher::Event::Apply(p)) | Ok(watcher::Event::InitApply(p)) => {
                OwnPod::read(&p, app_container.as_deref(), earlier, Instant::now())
            }
            Ok(_) => continue,
            Err(e) => OwnPod {
                app_verdict: Verdict::Unknown(format!("cannot watch our pod: {e}")),
                ..own.borrow().clone()
            },
        };
        own.send_if_modified(|o| std::mem::replace(o, next.clone()) != next);
    }
}

/// The app container's verdict, as a health source of its own.
pub(crate) async fn follow_app_verdict(mut own: watch::Receiver<OwnPod>, verdict: watch::Sender<Verdict>) {
    loop {
        let next = own.borrow_and_update().app_verdict.clone();
        verdict.send_if_modified(|v| std::mem::replace(v, next.clone()) != next);
        if own.changed().await.is_err() {
            return;
        }
    }
}

/// Campaigns while the app is healthy and the pod is not being deleted: a
/// terminating pod stops claiming at once and never campaigns again (its
/// leader releases after the drain, see [`super::single::drain_on_step_down`]).
/// While no health source can tell, the campaign stays as it is.
/// `campaign_unless` gets `None` to campaign, or why not: the reason a
/// leader's release records.
pub(crate) async fn steer_campaign(
    mut health: watch::Receiver<AppHealth>,
    mut own: Option<watch::Receiver<OwnPod>>,
    campaign_unless: impl Fn(Option<EndReason>),
) {
    let (mut told, mut health_open) = (None, true);
    loop {
        let terminating = own
            .as_mut()
            .is_some_and(|o| o.borrow_and_update().terminating.is_some());
        let healthy = health.borrow_and_update().healthy;
        let campaign = match (terminating, healthy) {
            (true, _) => Some(Some(EndReason::PodTerminating)),
            (false, Some(true)) => Some(None),
            (false, Some(false)) => Some(Some(EndReason::AppUnhealthy)),
            (false, None) => None,
        };
        if terminating && told != Some(Some(EndReason::PodTerminating)) {
            warn!("the pod is being deleted: stopped claiming, releasing after the drain");
        }
        if let Some(stop) = campaign.filter(|stop| told != Some(*stop)) {
            campaign_unless(stop);
            told = Some(stop);
        }
        let pod_changed = async {
            match own.as_mut() {
                Some(o) => o.changed().await,
                None => std::future::pending().await,
            }
        };
        let health_changed = async {
            match health_open {
                true => health.changed().await,
                false => std::future::pending().await,
            }
        };
        tokio::select! {
            changed = health_changed => health_open = changed.is_ok(),
            changed = pod_changed => if changed.is_err() { own = None },
        }
        if !health_open && own.is_none() {
            return;
        }
    }
}

/// How long before the grace period ends the release must start: the
/// release is one store call, and the timing rules already ask that a store
/// call fit well within the retry period (`leasehold advise` suggests
/// P ≥ 20 × the renewal p99).
pub(crate) fn release_reserve(timing: &leasehold_core::lease::Timing) -> Duration {
    timing.retry_period
}

/// The drain before a deliberate release: `drain` at most, over as soon as
/// the app run that led (`led`) has ended, and never later than `reserve`
/// before the pod's grace period ends. A native sidecar's SIGTERM
/// (`shutdown`) also ends it: the kubelet stops regular containers first
/// and sidecars only once they have all exited (KEP-753; seen on a 1.36
/// cluster: the sidecar's SIGTERM follows the app's exit by under a
/// second, while the pod's status shows the app terminated only after the
/// whole pod has stopped, too late to wait for).
pub(crate) async fn drain(
    drain: Duration,
    reserve: Duration,
    own: Option<watch::Receiver<OwnPod>>,
    led: Option<AppProcess>,
    shutdown: CancellationToken,
) {
    let until = Instant::now() + drain;
    let Some(mut own) = own else {
        tokio::time::sleep_until(until).await;
        return;
    };
    loop {
        let (ended, grace_ends, native) = {
            let pod = own.borrow_and_update();
            (
                AppProcess::ended_since(pod.app, led),
                pod.terminating.map(|t| t.grace_ends),
                pod.native_sidecar,
            )
        };
        if ended {
            info!("the app container has exited: nothing left to drain, releasing now");
            return;
        }
        if native && shutdown.is_cancelled() {
            info!("SIGTERM to a native sidecar: the app containers have exited, releasing now");
            return;
        }
        let end = grace_ends.map_or(until, |g| {
            until.min(g.checked_sub(reserve).unwrap_or_else(Instant::now))
        });
        tokio::select! {
            _ = tokio::time::sleep_until(end) => {
                if end < until {
                    info!(?reserve, "releasing before the pod's grace period runs out");
                }
                return;
            }
            _ = shutdown.cancelled(), if native => {}
            changed = own.changed() => if changed.is_err() {
                tokio::time::sleep_until(end).await;
                return;
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(value: serde_json::Value) -> Pod {
        leasehold_kubernetes::api::client::object_from_value(&value).unwrap()
    }

    #[test]
    fn the_grace_period_ends_at_the_sooner_of_grace_seconds_and_the_deletion_timestamp() {
        let at = Instant::now();
        let timestamp =
            |from_now: Duration| humantime::format_rfc3339_seconds(SystemTime::now() + from_now).to_string();
        let deleted = |grace: u64, from_now: Duration| {
            pod(serde_json::json!({"metadata": {"name": "web-0",
                "deletionTimestamp": timestamp(from_now), "deletionGracePeriodSeconds": grace}}))
        };
        let alive = pod(serde_json::json!({"metadata": {"name": "web-0"}}));
        assert_eq!(OwnPod::read(&alive, None, None, at).terminating, None);
        // Seen as soon as deleted: the grace period from now.
        let seen = OwnPod::read(&deleted(30, Duration::from_secs(40)), None, None, at);
        assert_eq!(seen.terminating.unwrap().grace_ends, at + Duration::from_secs(30));
        // Seen late (the timestamp is nearer than the grace period): the timestamp.
        let late = OwnPod::read(&deleted(30, Duration::from_secs(10)), None, None, at).terminating;
        let ends = late.unwrap().grace_ends;
        assert!(
            ends <= at + Duration::from_secs(10) && ends > at + Duration::from_secs(8),
            "{ends:?}"
        );
        // A second look never pushes it back; a shorter second deletion brings it forward.
        let earlier = Some(Termination {
            grace_ends: at + Duration::from_secs(5),
        });
        let again = OwnPod::read(&deleted(30, Duration::from_secs(30)), None, earlier, at);
        assert_eq!(again.terminating, earlier);
        let forced = OwnPod::read(&deleted(0, Duration::ZERO), None, earlier, at);
        assert_eq!(forced.terminating.unwrap().grace_ends, at);
    }

    #[test]
    fn the_app_run_ends_when_its_container_stops_or_restarts() {
        let run = |running, restarts| Some(AppProcess { running, restarts });
        assert!(!AppProcess::ended_since(run(true, 0), run(true, 0)));
        assert!(AppProcess::ended_since(run(false, 0), run(true, 0)), "terminated");
        assert!(AppProcess::ended_since(run(true, 1), run(true, 0)), "restarted since");
        assert!(
            AppProcess::ended_since(run(false, 0), None),
            "not running, nothing known before"
        );
        assert!(!AppProcess::ended_since(None, run(true, 0)), "no status: cannot tell");
        let status = pod(
            serde_json::json!({"metadata": {"name": "web-0"}, "status": {"containerStatuses": [
                {"name": "app", "ready": false, "restartCount": 2, "image": "a", "imageID": "",
                 "state": {"terminated": {"exitCode": 1}}},
            ]}}),
        );
        let own = OwnPod::read(&status, Some("app"), None, Instant::now());
        assert_eq!(own.app, run(false, 2));
    }

    #[tokio::test(start_paused = true)]
    async fn a_pod_event_with_the_main_container_not_ready_stops_the_campaign() {
        use super::super::health::follow;
        use leasehold_testkit::api::{ApiServer, pods};
        let api = ApiServer::new(Some(crate::rbac::allows_request));
        let mut pod = pods::pod("web-0", "prod", serde_json::json!({"app": "web"}), None);
        pod["status"]["containerStatuses"] = serde_json::json!([
            {"name": "app", "ready": true, "restartCount": 0, "image": "app", "imageID": ""},
            {"name": "leasehold", "ready": true, "restartCount": 0, "image": "lh", "imageID": ""},
        ]);
        api.insert(&pods::collection("prod"), pod.clone());
        api.insert(
            &pods::collection("prod"),
            pods::pod("web-1", "prod", serde_json::json!({"app": "web"}), None),
        );
        let pods_api: Api<Pod> = Api::namespaced(api.client("prod"), "prod");
        let (own_tx, own_rx) = watch::channel(OwnPod::default());
        tokio::spawn(watch(pods_api, "web-0".into(), Some("app".into()), own_tx));
        let (verdict_tx, verdict_rx) = watch::channel(Verdict::Unknown("pod not read yet".into()));
        tokio::spawn(follow_app_verdict(own_rx.clone(), verdict_tx));
        let (health_tx, mut health_rx) = watch::channel(AppHealth::default());
        tokio::spawn(follow(vec![("container", verdict_rx)], health_tx));
        let (campaign_tx, mut campaign_rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(steer_campaign(health_rx.clone(), Some(own_rx), move |on| {
            campaign_tx.send(on).unwrap()
        }));
        assert_eq!(campaign_rx.recv().await, Some(None), "ready: campaign");

        // The app container turns unready (restarted once).
        pod["status"]["containerStatuses"][0]["ready"] = serde_json::json!(false);
        pod["status"]["containerStatuses"][0]["restartCount"] = serde_json::json!(1);
        api.insert(&pods::collection("prod"), pod.clone());
        assert_eq!(
            campaign_rx.recv().await,
            Some(Some(EndReason::AppUnhealthy)),
            "not ready: stop campaigning (a leader releases, recording why)"
        );
        let health = health_rx.wait_for(|h| h.healthy == Some(false)).await.unwrap().clone();
        assert_eq!(health.reason, "container: container app is not ready (restarts: 1)");

        // Deleted: a terminating pod's release says so, whatever the app's health.
        pod["metadata"]["deletionTimestamp"] = serde_json::json!("2026-11-27T05:00:00Z");
        api.insert(&pods::collection("prod"), pod);
        assert_eq!(campaign_rx.recv().await, Some(Some(EndReason::PodTerminating)));

        let watch = api
            .requests()
            .into_iter()
            .find(|r| r.uri.contains("watch=true"))
            .expect("a watch of our pod");
        assert_eq!(watch.path(), "/api/v1/namespaces/prod/pods");
        assert!(
            watch.uri.contains("fieldSelector=metadata.name%3Dweb-0"),
            "{}",
            watch.uri
        );
        assert!(api.forbidden().is_empty(), "{:?}", api.forbidden());
    }
}
