//! Publishing leadership on the pod: the leader label, the readiness-gate
//! condition, Events, and the peer watch that makes handover fast.
//!
//! A new leader first sets "false" on every other candidate pod still
//! labelled "true", then "true" on its own; a leader that stops claiming
//! first sets its condition False, then its label "false". Writes retry with
//! backoff; none of this ever touches the lease.

use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::watcher;
use serde_json::json;
use tokio::sync::{broadcast, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::config::{PodRef, Publishing};
use super::health::AppHealth;
use crate::lease::{Change, ElectorControl, LeaderState};

/// The readiness-gate condition type.
pub const LEADER_CONDITION: &str = "leasehold.dev/leader";
const FIELD_MANAGER: &str = "leasehold-sidecar";

pub struct Publisher {
    pods: Api<Pod>,
    pod: PodRef,
    publishing: Publishing,
    recorder: Recorder,
}

impl Publisher {
    pub fn new(client: kube::Client, pod: PodRef, publishing: Publishing) -> Self {
        let reporter = Reporter {
            controller: FIELD_MANAGER.into(),
            instance: Some(pod.name.clone()),
        };
        Publisher {
            pods: Api::namespaced(client.clone(), &pod.namespace),
            recorder: Recorder::new(client, reporter),
            pod,
            publishing,
        }
    }

    /// Publishes every change of `state` until the elector is gone, then
    /// leaves the pod labelled "false" and not ready.
    pub async fn run(
        self,
        mut state: watch::Receiver<LeaderState>,
        mut transitions: broadcast::Receiver<LeaderState>,
        mut app: watch::Receiver<AppHealth>,
        control: ElectorControl,
        shutdown: CancellationToken,
    ) {
        let gated = self.readiness_gated(&shutdown).await;
        if let Some(selector) = self.publishing.selector.clone() {
            tokio::spawn(watch_peers(
                self.pods.clone(),
                self.pod.name.clone(),
                self.publishing.label_key.clone(),
                selector,
                state.clone(),
                move || control.nudge(),
            ));
        }
        let mut published: Option<bool> = None;
        loop {
            let current = state.borrow_and_update().clone();
            let leads = current.is_leader_at(Instant::now());
            if published != Some(leads) {
                self.publish(leads, gated).await;
                published = Some(leads);
            }
            // A stalled elector does not publish its own deadline passing.
            let deadline = current.deadline.filter(|_| leads);
            tokio::select! {
                changed = state.changed() => if changed.is_err() { break },
                Ok(transition) = transitions.recv() => self.announce(&transition).await,
                Ok(()) = app.changed() => {
                    let health = app.borrow_and_update().clone();
                    self.announce_app_health(&health).await;
                }
                _ = sleep_until(deadline) => {}
            }
        }
        while let Ok(transition) = transitions.try_recv() {
            self.announce(&transition).await;
        }
        if published != Some(false) {
            self.publish(false, gated).await;
        }
    }

    /// Whether our pod lists the leader condition as a readiness gate.
    async fn readiness_gated(&self, shutdown: &CancellationToken) -> bool {
        let get = || self.pods.get(&self.pod.name);
        let pod = tokio::select! {
            pod = get.retry(backoff()).notify(|e, d| warn!(error = %e, retry_in = ?d, "cannot read our own pod")) => pod,
            _ = shutdown.cancelled() => return false,
        };
        match pod {
            Ok(pod) => pod
                .spec
                .and_then(|s| s.readiness_gates)
                .is_some_and(|gates| gates.iter().any(|g| g.condition_type == LEADER_CONDITION)),
            Err(e) => {
                warn!(error = %e, "cannot read our own pod; not publishing a readiness condition");
                false
            }
        }
    }

    async fn publish(&self, leads: bool, gated: bool) {
        if leads {
            self.clear_other_leaders().await;
            self.set_label(&self.pod.name, true).await;
            if gated {
                self.set_condition(true).await;
            }
        } else {
            // Stop claiming first: readiness, then the label.
            if gated {
                self.set_condition(false).await;
            }
            self.set_label(&self.pod.name, false).await;
        }
    }

    /// Sets "false" on every other candidate still labelled "true".
    async fn clear_other_leaders(&self) {
        let key = &self.publishing.label_key;
        let selector = match &self.publishing.selector {
            Some(s) if !s.is_empty() => format!("{s},{key}=true"),
            _ => format!("{key}=true"),
        };
        let params = ListParams::default().labels(&selector);
        let list = || self.pods.list(&params);
        match list.retry(backoff()).await {
            Ok(pods) => {
                for other in pods
                    .items
                    .iter()
                    .filter_map(|p| p.metadata.name.as_deref())
                    .filter(|n| *n != self.pod.name)
                {
                    info!(pod = other, "clearing a stale leader label");
                    self.set_label(other, false).await;
                }
            }
            Err(e) => warn!(error = %e, "cannot list candidate pods to clear stale leader labels"),
        }
    }

    async fn set_label(&self, pod: &str, leader: bool) {
        let patch =
            Patch::Merge(json!({"metadata": {"labels": {self.publishing.label_key.clone(): leader.to_string()}}}));
        let params = PatchParams::default();
        let write = || self.pods.patch(pod, &params, &patch);
        match write
            .retry(backoff())
            .notify(|e, d| debug!(error = %e, retry_in = ?d, "label write failed"))
            .await
        {
            Ok(_) => debug!(pod, leader, "label set"),
            Err(e) => warn!(pod, leader, error = %e, "cannot set the leader label"),
        }
    }

    async fn set_condition(&self, leader: bool) {
        let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now());
        let (status, reason) = if leader {
            ("True", "Leader")
        } else {
            ("False", "Follower")
        };
        let patch = Patch::Strategic(json!({"status": {"conditions": [{
            "type": LEADER_CONDITION,
            "status": status,
            "reason": reason,
            "lastTransitionTime": now,
        }]}}));
        // Strategic merge: the API server merges conditions by type.
        let params = PatchParams::default();
        let write = || self.pods.patch_status(&self.pod.name, &params, &patch);
        if let Err(e) = write.retry(backoff()).await {
            warn!(leader, error = %e, "cannot set the readiness condition");
        }
    }

    async fn announce(&self, transition: &LeaderState) {
        let (type_, reason, note) = match &transition.change {
            Change::Acquired => (
                EventType::Normal,
                "Acquired",
                format!("leads term {} with token {}", transition.term, token(transition)),
            ),
            Change::Lost(why) => (
                EventType::Warning,
                "Lost",
                format!("lost term {}: {why}", transition.term),
            ),
            Change::DeadlineMissed => (
                EventType::Warning,
                "Lost",
                format!(
                    "no renewal within the renew deadline; stopped claiming term {}",
                    transition.term
                ),
            ),
            Change::Released => (
                EventType::Normal,
                "Released",
                format!("released term {}", transition.term),
            ),
            Change::ReleaseFailed(e) => (
                EventType::Warning,
                "ReleaseFailed",
                format!("term {}: {e}; the lease will expire", transition.term),
            ),
            _ => return,
        };
        let event = Event {
            type_,
            reason: reason.into(),
            note: Some(note),
            action: "Elect".into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, &self.pod_reference()).await {
            warn!(error = %e, reason, "cannot publish an Event");
        }
    }
}

impl Publisher {
    /// An Event on each change of the app's health.
    async fn announce_app_health(&self, health: &AppHealth) {
        let (type_, reason) = match health.healthy {
            Some(true) => (EventType::Normal, "AppHealthy"),
            Some(false) => (EventType::Warning, "AppUnhealthy"),
            None => (EventType::Warning, "AppHealthUnknown"),
        };
        let event = Event {
            type_,
            reason: reason.into(),
            note: Some(health.reason.clone()),
            action: "Campaign".into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, &self.pod_reference()).await {
            warn!(error = %e, reason, "cannot publish an Event");
        }
    }

    fn pod_reference(&self) -> ObjectReference {
        ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: Some(self.pod.name.clone()),
            namespace: Some(self.pod.namespace.clone()),
            uid: self.pod.uid.clone(),
            ..Default::default()
        }
    }
}

fn token(state: &LeaderState) -> String {
    state.token.map(|t| t.to_string()).unwrap_or_default()
}

fn backoff() -> ExponentialBuilder {
    ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(100))
        .with_max_delay(Duration::from_secs(5))
        .with_max_times(6)
        .with_jitter()
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The pod name in a holder identity `[cluster/]namespace/pod#nonce`.
pub fn holder_pod(holder: &str) -> &str {
    let without_nonce = holder.rsplit_once('#').map_or(holder, |(pod, _)| pod);
    without_nonce.rsplit('/').next().unwrap_or(without_nonce)
}

/// Nudges the elector when the current holder's pod turns its label to
/// "false": it released, so acquire now instead of at the next poll.
async fn watch_peers(
    pods: Api<Pod>,
    me: String,
    label_key: String,
    selector: String,
    state: watch::Receiver<LeaderState>,
    nudge: impl Fn() + Send + 'static,
) {
    let config = watcher::Config::default().labels(&selector);
    let mut events = std::pin::pin!(watcher::watcher(pods, config));
    while let Some(event) = events.next().await {
        let pod = match event {
            Ok(watcher::Event::Apply(pod)) | Ok(watcher::Event::InitApply(pod)) => pod,
            Ok(_) => continue,
            Err(e) => {
                debug!(error = %e, "pod watch error; the watcher retries");
                continue;
            }
        };
        let name = pod.metadata.name.clone().unwrap_or_default();
        let released = pod
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(&label_key))
            .is_some_and(|v| v == "false");
        let holder = state.borrow().holder.clone();
        if name != me && released && holder.as_deref().map(holder_pod) == Some(name.as_str()) {
            info!(pod = %name, "the leader's pod turned its label to false; trying to acquire now");
            nudge();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{Request, Response};
    use kube::client::Body;
    use serde_json::Value;
    use std::sync::Arc;
    use tokio::sync::Notify;
    use tower_test::mock::Handle;

    type Server = Handle<Request<Body>, Response<Body>>;

    fn publisher() -> (Publisher, Server) {
        let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let client = kube::Client::new(service, "prod");
        let pod = PodRef {
            name: "web-0".into(),
            namespace: "prod".into(),
            uid: Some("uid-0".into()),
        };
        let publishing = Publishing {
            label_key: "leasehold.dev/leader".into(),
            selector: Some("app=web".into()),
        };
        (Publisher::new(client, pod, publishing), handle)
    }

    fn pod_json(name: &str, leader: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "namespace": "prod", "resourceVersion": "1",
                            "labels": {"app": "web", "leasehold.dev/leader": leader}}})
    }

    fn respond(send: tower_test::mock::SendResponse<Response<Body>>, body: Value) {
        send.send_response(Response::new(Body::from(serde_json::to_vec(&body).unwrap())));
    }

    /// Takes the next request: (method, path?query, content type, JSON body).
    async fn next(
        server: &mut Server,
    ) -> (
        String,
        String,
        String,
        Value,
        tower_test::mock::SendResponse<Response<Body>>,
    ) {
        let (request, send) = server.next_request().await.expect("a request");
        let method = request.method().to_string();
        let uri = request.uri().to_string();
        let watch = request.uri().query().is_some_and(|q| q.contains("watch=true"));
        assert!(
            super::super::rbac::allows_request(&method, request.uri().path(), watch),
            "{method} {uri} is not in the sidecar's Role"
        );
        let content_type = request
            .headers()
            .get("content-type")
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default();
        let bytes = request.into_body().collect_bytes().await.unwrap();
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap()
        };
        (method, uri, content_type, body, send)
    }

    #[tokio::test]
    async fn a_new_leader_clears_other_leaders_then_labels_itself_then_becomes_ready() {
        let (publisher, mut server) = publisher();
        let api_server = tokio::spawn(async move {
            let (method, uri, _, _, send) = next(&mut server).await;
            assert_eq!(method, "GET");
            assert_eq!(
                uri,
                "/api/v1/namespaces/prod/pods?&labelSelector=app%3Dweb%2Cleasehold.dev%2Fleader%3Dtrue"
            );
            respond(
                send,
                json!({"apiVersion": "v1", "kind": "PodList", "metadata": {},
                                 "items": [pod_json("web-0", "true"), pod_json("web-1", "true")]}),
            );

            let (method, uri, content_type, body, send) = next(&mut server).await;
            assert_eq!(
                (method.as_str(), uri.as_str()),
                ("PATCH", "/api/v1/namespaces/prod/pods/web-1?"),
                "the stale leader first"
            );
            assert_eq!(content_type, "application/merge-patch+json");
            assert_eq!(body, json!({"metadata": {"labels": {"leasehold.dev/leader": "false"}}}));
            respond(send, pod_json("web-1", "false"));

            let (method, uri, content_type, body, send) = next(&mut server).await;
            assert_eq!(
                (method.as_str(), uri.as_str()),
                ("PATCH", "/api/v1/namespaces/prod/pods/web-0?"),
                "then our own"
            );
            assert_eq!(content_type, "application/merge-patch+json");
            assert_eq!(body, json!({"metadata": {"labels": {"leasehold.dev/leader": "true"}}}));
            respond(send, pod_json("web-0", "true"));

            let (method, uri, content_type, body, send) = next(&mut server).await;
            assert_eq!(
                (method.as_str(), uri.as_str()),
                ("PATCH", "/api/v1/namespaces/prod/pods/web-0/status?")
            );
            assert_eq!(content_type, "application/strategic-merge-patch+json");
            let condition = &body["status"]["conditions"][0];
            assert_eq!(condition["type"], "leasehold.dev/leader");
            assert_eq!(condition["status"], "True");
            assert_eq!(condition["reason"], "Leader");
            assert!(condition["lastTransitionTime"].is_string());
            respond(send, pod_json("web-0", "true"));
        });
        publisher.publish(true, true).await;
        api_server.await.unwrap();
    }

    #[tokio::test]
    async fn a_leader_that_stops_claiming_turns_unready_before_relabelling() {
        let (publisher, mut server) = publisher();
        let api_server = tokio::spawn(async move {
            let (method, uri, content_type, body, send) = next(&mut server).await;
            assert_eq!(
                (method.as_str(), uri.as_str()),
                ("PATCH", "/api/v1/namespaces/prod/pods/web-0/status?")
            );
            assert_eq!(content_type, "application/strategic-merge-patch+json");
            assert_eq!(body["status"]["conditions"][0]["status"], "False");
            respond(send, pod_json("web-0", "true"));
            let (method, uri, _, body, send) = next(&mut server).await;
            assert_eq!(
                (method.as_str(), uri.as_str()),
                ("PATCH", "/api/v1/namespaces/prod/pods/web-0?")
            );
            assert_eq!(body, json!({"metadata": {"labels": {"leasehold.dev/leader": "false"}}}));
            respond(send, pod_json("web-0", "false"));
        });
        publisher.publish(false, true).await;
        api_server.await.unwrap();
    }

    #[tokio::test]
    async fn without_a_readiness_gate_only_the_label_is_written() {
        let (publisher, mut server) = publisher();
        let api_server = tokio::spawn(async move {
            let (method, uri, _, _, send) = next(&mut server).await;
            assert_eq!(
                (method.as_str(), uri.as_str()),
                ("PATCH", "/api/v1/namespaces/prod/pods/web-0?")
            );
            respond(send, pod_json("web-0", "false"));
            assert!(
                tokio::time::timeout(Duration::from_millis(100), server.next_request())
                    .await
                    .is_err(),
                "no status patch for a pod without the gate"
            );
        });
        publisher.publish(false, false).await;
        api_server.await.unwrap();
    }

    #[tokio::test]
    async fn the_readiness_gate_is_read_from_our_own_pod() {
        let (publisher, mut server) = publisher();
        let api_server = tokio::spawn(async move {
            let (method, uri, _, _, send) = next(&mut server).await;
            assert_eq!(
                (method.as_str(), uri.as_str()),
                ("GET", "/api/v1/namespaces/prod/pods/web-0")
            );
            let mut pod = pod_json("web-0", "false");
            pod["spec"] =
                json!({"containers": [{"name": "app"}], "readinessGates": [{"conditionType": LEADER_CONDITION}]});
            respond(send, pod);
        });
        assert!(publisher.readiness_gated(&CancellationToken::new()).await);
        api_server.await.unwrap();
    }

    #[tokio::test]
    async fn acquisitions_losses_and_releases_become_events_on_the_pod() {
        let (publisher, mut server) = publisher();
        let api_server = tokio::spawn(async move {
            let mut reasons = Vec::new();
            for _ in 0..3 {
                let (method, uri, _, body, send) = next(&mut server).await;
                assert_eq!(
                    (method.as_str(), uri.as_str()),
                    ("POST", "/apis/events.k8s.io/v1/namespaces/prod/events?")
                );
                assert_eq!(body["regarding"]["kind"], "Pod");
                assert_eq!(body["regarding"]["name"], "web-0");
                assert_eq!(body["regarding"]["uid"], "uid-0");
                assert_eq!(body["reportingController"], "leasehold-sidecar");
                reasons.push((
                    body["reason"].as_str().unwrap().to_string(),
                    body["type"].as_str().unwrap().to_string(),
                ));
                respond(send, body);
            }
            reasons
        });
        let state = |change: Change| LeaderState {
            term: 4,
            token: Some(crate::lease::FencingToken(9)),
            change,
            ..Default::default()
        };
        publisher.announce(&state(Change::Acquired)).await;
        publisher.announce(&state(Change::Renewed)).await; // not news: no request
        publisher.announce(&state(Change::DeadlineMissed)).await;
        publisher.announce(&state(Change::Released)).await;
        let reasons = api_server.await.unwrap();
        assert_eq!(
            reasons,
            [
                ("Acquired".into(), "Normal".into()),
                ("Lost".into(), "Warning".into()),
                ("Released".into(), "Normal".into())
            ]
        );
    }

    #[tokio::test]
    async fn the_leaders_label_turning_false_nudges_the_elector() {
        let (service, mut server) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let pods: Api<Pod> = Api::namespaced(kube::Client::new(service, "prod"), "prod");
        let state = watch::channel(LeaderState {
            holder: Some("prod/web-1#abc".into()),
            ..Default::default()
        })
        .1;
        let nudge = Arc::new(Notify::new());
        tokio::spawn(watch_peers(
            pods,
            "web-0".into(),
            "leasehold.dev/leader".into(),
            "app=web".into(),
            state,
            {
                let nudge = nudge.clone();
                move || nudge.notify_one()
            },
        ));
        let (method, uri, _, _, send) = next(&mut server).await;
        assert_eq!(method, "GET");
        assert!(
            uri.starts_with("/api/v1/namespaces/prod/pods?") && uri.contains("labelSelector=app%3Dweb"),
            "{uri}"
        );
        // The initial list shows the leader's pod with its label already "false".
        respond(
            send,
            json!({"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "5"},
                             "items": [pod_json("web-1", "false")]}),
        );
        tokio::time::timeout(Duration::from_secs(5), nudge.notified())
            .await
            .expect("nudged");
    }

    #[test]
    fn holder_identities_name_their_pod() {
        assert_eq!(holder_pod("eu/prod/web-1#abc"), "web-1");
        assert_eq!(holder_pod("prod/web-1#abc"), "web-1");
        assert_eq!(holder_pod("web-1#abc"), "web-1");
    }
}
