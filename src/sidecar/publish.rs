//! Publishing leadership on the pod: the leader label, the readiness-gate
//! condition, Events, and the peer watch that makes handover fast.
//!
//! Level-triggered: the desired state (this pod leads or not, from the
//! elector) is compared with the observed state (our pod and the other
//! candidates, from two pod watches and the answers to our own writes), and
//! the first difference is written, one write at a time, until they match,
//! for as long as the sidecar runs. A failed write is retried with capped
//! backoff; a write counts only by the object the API server returns, never
//! because it was sent. Whatever else changes our label or condition, the
//! watch shows it and it is written back.
//!
//! Order: a leader first sets the condition False and the label "false" on
//! every other candidate still claiming, then its own label "true", then
//! (readiness-gated pods) its own condition True; a pod that stops leading
//! first sets its condition False, then its label "false". When the desired
//! state flips, the write in flight and any backoff are dropped at once, so
//! stopping to claim never waits behind retries of another write.
//!
//! Every write carries the `resourceVersion` we observed as a precondition
//! (409 Conflict when the pod changed since): a late "false" from a brief
//! leader cannot undo the real leader's "true", and a late "true" from a
//! deposed one cannot undo a clear. On a conflict we read the pod again and
//! decide anew. None of this ever touches the lease.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::watcher;
use serde_json::json;
use tokio::sync::{broadcast, watch};
use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::config::Publishing;
use super::health::AppHealth;
use super::pod::{PodRef, pod_recorder, watch_backoff};
use super::starting::Throttle;
use crate::api::contract::{GATE_PROBE_PATH, LEADER_CONDITION, SIDECAR_CONTAINER};
use crate::lease::{Change, ElectorControl, LeaderState};

pub use super::BACKOFF_CAP;
/// How long a sidecar whose elector has ended keeps trying to leave its pod
/// labelled "false" and not ready.
const FINAL_WRITES_WITHIN: Duration = Duration::from_secs(5);
/// How often a write that keeps failing is logged again.
const REPORT_EVERY: Duration = Duration::from_secs(30);

pub struct Publisher {
    pods: Api<Pod>,
    pod: PodRef,
    publishing: Publishing,
    announcer: Announcer,
}

/// What the pods look like: from the watches and the answers to our writes.
#[derive(Debug, Default)]
struct Observed {
    own: Option<Pod>,
    /// The candidates the selector matches (our own pod among them, maybe).
    peers: BTreeMap<String, Pod>,
    /// The peer list is complete (the watch's initial list arrived).
    peers_listed: bool,
    /// The initial list being received, while the watch (re)starts.
    relisting: Option<BTreeMap<String, Pod>>,
}

impl Observed {
    fn apply(&mut self, me: &str, pod: Pod) {
        let name = pod.metadata.name.clone().unwrap_or_default();
        if name == me {
            self.own = Some(pod.clone());
        }
        if self.peers.contains_key(&name) || name != me {
            self.peers.insert(name, pod);
        }
    }

    fn peer_event(&mut self, event: watcher::Event<Pod>) {
        let name = |p: &Pod| p.metadata.name.clone().unwrap_or_default();
        match event {
            watcher::Event::Init => self.relisting = Some(BTreeMap::new()),
            watcher::Event::InitApply(pod) => {
                self.relisting.get_or_insert_default().insert(name(&pod), pod);
            }
            watcher::Event::InitDone => {
                self.peers = self.relisting.take().unwrap_or_default();
                self.peers_listed = true;
            }
            watcher::Event::Apply(pod) => {
                self.peers.insert(name(&pod), pod);
            }
            watcher::Event::Delete(pod) => {
                self.peers.remove(&name(&pod));
            }
        }
    }
}

/// One write towards the desired state.
#[derive(Debug, Clone, PartialEq)]
enum Write {
    /// `leader` on `pod`'s label (and, for our own pod, the candidate labels).
    Label { pod: String, leader: bool, version: String },
    /// `leader` as `pod`'s leader condition.
    Condition { pod: String, leader: bool, version: String },
    /// Our own leader condition False, saying we released `term`: peers
    /// watching it look at the store at once (the label turned "false"
    /// already when we stopped claiming, before the drain).
    Released { pod: String, term: u64, version: String },
}

impl Write {
    fn pod(&self) -> &str {
        match self {
            Write::Label { pod, .. } | Write::Condition { pod, .. } | Write::Released { pod, .. } => pod,
        }
    }
}

fn label<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata.labels.as_ref()?.get(key).map(String::as_str)
}

fn leader_condition(pod: &Pod) -> Option<&k8s_openapi::api::core::v1::PodCondition> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == LEADER_CONDITION)
}

fn condition(pod: &Pod) -> Option<&str> {
    leader_condition(pod).map(|c| c.status.as_str())
}

/// The reason of the leader condition that says a pod released its term.
const RELEASED_REASON: &str = "Released";

fn released_message(term: u64) -> String {
    format!("released term {term}")
}

/// The term a pod's leader condition says it released, as its message.
fn released_mark(pod: &Pod) -> Option<&str> {
    leader_condition(pod)
        .filter(|c| c.reason.as_deref() == Some(RELEASED_REASON))
        .and_then(|c| c.message.as_deref())
}

fn version(pod: &Pod) -> String {
    pod.metadata.resource_version.clone().unwrap_or_default()
}

/// Whether the pod lists the leader condition as a readiness gate.
fn readiness_gated(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.readiness_gates.as_ref())
        .is_some_and(|gates| gates.iter().any(|g| g.condition_type == LEADER_CONDITION))
}

/// Whether the kubelet keeps `pod` unready whatever its leader condition
/// says: its sidecar has the gate probe, which passes only while that
/// sidecar holds a valid claim, and the pod is not Ready. A new leader need
/// not clear such a peer's stale True (a stalled sidecar cannot, and the
/// admission policy lets no other pod's sidecar) before marking itself: that
/// peer's claim lapsed before ours began, so it cannot turn Ready again.
fn kept_unready(pod: &Pod) -> bool {
    let probed = pod.spec.as_ref().is_some_and(|spec| {
        spec.init_containers
            .iter()
            .flatten()
            .chain(&spec.containers)
            .filter(|c| c.name == SIDECAR_CONTAINER)
            .filter_map(|c| c.readiness_probe.as_ref()?.http_get.as_ref()?.path.as_deref())
            .any(|path| path == GATE_PROBE_PATH)
    });
    let ready = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|conditions| conditions.iter().find(|c| c.type_ == "Ready"))
        .map(|c| c.status.as_str());
    probed && ready == Some("False")
}

impl Publisher {
    pub fn new(client: kube::Client, pod: PodRef, publishing: Publishing) -> Self {
        let (recorder, reference) = pod_recorder(client.clone(), &pod);
        Publisher {
            pods: Api::namespaced(client, &pod.namespace),
            announcer: Announcer {
                recorder,
                pod: reference,
            },
            pod,
            publishing,
        }
    }

    /// The next write towards `leads`, or `None` when the pods match it
    /// (or cannot be judged yet: our pod not seen, or, to claim, the other
    /// candidates not listed).
    fn next_write(&self, leads: bool, released: Option<u64>, observed: &Observed) -> Option<Write> {
        let me = &self.pod.name;
        let own = observed.own.as_ref()?;
        let gated = readiness_gated(own);
        let key = &self.publishing.label_key;
        let own_labels_are = |leader: bool| {
            label(own, key) == Some(if leader { "true" } else { "false" })
                && self
                    .publishing
                    .candidate_labels
                    .iter()
                    .all(|(k, v)| label(own, k) == Some(v.as_str()))
        };
        let own_label = |leader| Write::Label {
            pod: me.clone(),
            leader,
            version: version(own),
        };
        let own_condition = |leader| Write::Condition {
            pod: me.clone(),
            leader,
            version: version(own),
        };
        if !leads {
            if gated && condition(own) != Some("False") {
                return Some(own_condition(false));
            }
            if !own_labels_are(false) {
                return Some(own_label(false));
            }
            return released
                .filter(|term| released_mark(own) != Some(released_message(*term).as_str()))
                .map(|term| Write::Released {
                    pod: me.clone(),
                    term,
                    version: version(own),
                });
        }
        if !observed.peers_listed {
            return None;
        }
        let others = || {
            observed
                .peers
                .values()
                .filter(|p| p.metadata.name.as_deref() != Some(me))
        };
        if let Some(peer) = others().find(|p| condition(p) == Some("True") && !kept_unready(p)) {
            return Some(Write::Condition {
                pod: peer.metadata.name.clone().unwrap_or_default(),
                leader: false,
                version: version(peer),
            });
        }
        if let Some(peer) = others().find(|p| label(p, key) == Some("true")) {
            return Some(Write::Label {
                pod: peer.metadata.name.clone().unwrap_or_default(),
                leader: false,
                version: version(peer),
            });
        }
        if !own_labels_are(true) {
            return Some(own_label(true));
        }
        (gated && condition(own) != Some("True")).then(|| own_condition(true))
    }

    /// Sends one write; the pod as the API server answers it.
    fn perform(&self, write: &Write) -> BoxFuture<'static, Result<Pod, kube::Error>> {
        let pods = self.pods.clone();
        let params = PatchParams::default();
        match write.clone() {
            Write::Label { pod, leader, version } => {
                let mut labels = serde_json::Map::new();
                labels.insert(self.publishing.label_key.clone(), json!(leader.to_string()));
                if pod == self.pod.name {
                    for (k, v) in &self.publishing.candidate_labels {
                        labels.insert(k.clone(), json!(v));
                    }
                }
                let patch = Patch::Merge(json!({"metadata": {"resourceVersion": version, "labels": labels}}));
                Box::pin(async move { pods.patch(&pod, &params, &patch).await })
            }
            Write::Condition { .. } | Write::Released { .. } => {
                let (pod, version, status, reason, message) = match write.clone() {
                    Write::Released { pod, term, version } => {
                        (pod, version, "False", RELEASED_REASON, released_message(term))
                    }
                    Write::Condition { pod, leader, version } => {
                        let (status, reason, message) = match (leader, pod == self.pod.name) {
                            (true, _) => ("True", "Leader", "this pod holds the lease"),
                            (false, true) => ("False", "Follower", "this pod does not hold the lease"),
                            (false, false) => ("False", "NotLeader", "cleared by the new leader"),
                        };
                        (pod, version, status, reason, message.to_string())
                    }
                    Write::Label { .. } => unreachable!("matched above"),
                };
                let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now());
                // Strategic merge: the API server merges conditions by type.
                let patch = Patch::Strategic(json!({
                    "metadata": {"resourceVersion": version},
                    "status": {"conditions": [{
                        "type": LEADER_CONDITION,
                        "status": status,
                        "reason": reason,
                        "message": message,
                        "lastTransitionTime": now,
                    }]}
                }));
                Box::pin(async move { pods.patch_status(&pod, &params, &patch).await })
            }
        }
    }

    /// Publishes until the elector is gone, then leaves the pod labelled
    /// "false" and not ready (bounded by [`FINAL_WRITES_WITHIN`]).
    pub async fn run(
        self,
        mut state: watch::Receiver<LeaderState>,
        transitions: broadcast::Receiver<LeaderState>,
        app: watch::Receiver<AppHealth>,
        control: ElectorControl,
    ) {
        let announcer = tokio::spawn(self.announcer.clone().run(transitions, app));
        let me = self.pod.name.clone();
        let own_config = watcher::Config::default().fields(&format!("metadata.name={me}"));
        let mut own_events = std::pin::pin!(watcher(self.pods.clone(), own_config).backoff(watch_backoff()));
        let peer_config = watcher::Config::default().labels(&self.publishing.selector);
        let mut peer_events = std::pin::pin!(watcher(self.pods.clone(), peer_config).backoff(watch_backoff()));

        let mut observed = Observed::default();
        let mut in_flight: Option<(Write, BoxFuture<'static, Result<Pod, kube::Error>>)> = None;
        let mut refresh: Option<BoxFuture<'static, Result<Pod, kube::Error>>> = None;
        let mut backoff = write_backoff();
        let mut retry_at: Option<Instant> = None;
        let mut report = Throttle::new(REPORT_EVERY);
        let mut desired = false;
        // The term we last released, to say so on our pod until we lead again.
        let mut released: Option<u64> = None;
        let mut ending: Option<Instant> = None;
        loop {
            let current = state.borrow().clone();
            let leads = ending.is_none() && current.is_leader_at(Instant::now());
            if leads != desired {
                // Stop (or start) claiming now: nothing waits behind a
                // write towards the old state or its backoff.
                desired = leads;
                in_flight = None;
                retry_at = None;
                backoff = write_backoff();
            }
            if current.change == Change::Released {
                released = Some(current.term);
            } else if desired {
                released = None;
            }
            let next = self.next_write(desired, released, &observed);
            if in_flight.as_ref().is_some_and(|(w, _)| Some(w) != next.as_ref()) {
                in_flight = None;
            }
            if let Some(end) = ending
                && (next.is_none() || Instant::now() >= end)
            {
                break;
            }
            if in_flight.is_none() && refresh.is_none() && retry_at.is_none_or(|at| Instant::now() >= at) {
                retry_at = None;
                in_flight = next.map(|write| {
                    let future = self.perform(&write);
                    (write, future)
                });
            }
            // A stalled elector does not publish its own deadline passing.
            let deadline = current.deadline.filter(|_| desired);
            tokio::select! {
                changed = state.changed(), if ending.is_none() => if changed.is_err() {
                    ending = Some(Instant::now() + FINAL_WRITES_WITHIN);
                },
                _ = sleep_until(deadline) => {}
                _ = sleep_until(ending) => {}
                _ = sleep_until(retry_at) => {}
                Some(event) = own_events.next() => match event {
                    Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) => observed.own = Some(pod),
                    Ok(watcher::Event::Delete(_)) => observed.own = None,
                    // The watch (re)connected: the API server answers again.
                    Ok(watcher::Event::InitDone) => retry_at = None,
                    Ok(watcher::Event::Init) => {}
                    Err(e) => debug!(error = %e, "our pod's watch failed; it retries with backoff"),
                },
                Some(event) = peer_events.next() => match event {
                    Ok(event) => {
                        if let watcher::Event::Apply(pod) | watcher::Event::InitApply(pod) = &event {
                            let before = observed.peers.get(pod.metadata.name.as_deref().unwrap_or_default());
                            self.nudge_on_release(pod, before, &current, &control);
                        }
                        observed.peer_event(event);
                    }
                    Err(e) => debug!(error = %e, "the candidates' watch failed; it retries with backoff"),
                },
                Some((write, result)) = next_result(&mut in_flight) => match result {
                    Ok(pod) => {
                        debug!(?write, "written");
                        observed.apply(&me, pod);
                        backoff = write_backoff();
                        report.reset();
                    }
                    Err(kube::Error::Api(e)) if e.code == 409 => {
                        debug!(?write, "the pod changed since we read it; reading it again");
                        let (pods, name) = (self.pods.clone(), write.pod().to_string());
                        refresh = Some(Box::pin(async move { pods.get(&name).await }));
                    }
                    Err(e) => {
                        let delay = backoff.next().unwrap_or(BACKOFF_CAP);
                        if let Some(failures) = report.due(Instant::now()) {
                            warn!(?write, error = %e, failures, retry_in = ?delay, "cannot publish leadership on the pod; retrying");
                        }
                        retry_at = Some(Instant::now() + delay);
                    }
                },
                Some(read) = next_refresh(&mut refresh) => match read {
                    Ok(pod) => observed.apply(&me, pod),
                    Err(e) => {
                        debug!(error = %e, "cannot read the pod again");
                        retry_at = Some(Instant::now() + backoff.next().unwrap_or(BACKOFF_CAP));
                    }
                },
            }
        }
        if ending.is_some_and(|end| Instant::now() >= end) {
            warn!("the elector has stopped; giving up leaving the pod labelled false and not ready");
        }
        // Events still queued (the release) get a moment to go out.
        let _ = tokio::time::timeout(Duration::from_secs(2), announcer).await;
    }

    /// The current holder's pod turned its label to "false" (it stopped
    /// claiming), or changed again while labelled so (its app exited, or it
    /// marked its leader condition `Released` after its drain): it has
    /// released or is about to, so look at the store now instead of at the
    /// next poll. Also when a pod labelled
    /// "true" (`before`) turns "false" while we do not know the holder yet:
    /// a candidate that has just started campaigning (its app turned ready,
    /// the moment `Newest` makes the old leader stand aside) has not
    /// finished its first observation. A nudge only makes the elector look.
    fn nudge_on_release(&self, pod: &Pod, before: Option<&Pod>, state: &LeaderState, control: &ElectorControl) {
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        let key = &self.publishing.label_key;
        let released = label(pod, key) == Some("false");
        let was_leader = before.is_some_and(|p| label(p, key) == Some("true"));
        let held = state.holder.as_deref().and_then(holder_pod).as_deref() == Some(name);
        if name != self.pod.name && released && (held || was_leader) {
            info!(pod = %name, "the leader's pod turned its label to false; trying to acquire now");
            control.nudge();
        }
    }
}

async fn next_result(
    in_flight: &mut Option<(Write, BoxFuture<'static, Result<Pod, kube::Error>>)>,
) -> Option<(Write, Result<Pod, kube::Error>)> {
    let (write, future) = in_flight.as_mut()?;
    let result = future.await;
    let write = write.clone();
    *in_flight = None;
    Some((write, result))
}

async fn next_refresh(
    refresh: &mut Option<BoxFuture<'static, Result<Pod, kube::Error>>>,
) -> Option<Result<Pod, kube::Error>> {
    let result = refresh.as_mut()?.await;
    *refresh = None;
    Some(result)
}

fn write_backoff() -> impl Iterator<Item = Duration> {
    use backon::BackoffBuilder;
    super::capped_backoff().build()
}

/// Events on the pod: acquisitions, losses, releases and the app's health;
/// a task of its own, so an Event never delays a label or condition.
#[derive(Clone)]
struct Announcer {
    recorder: Recorder,
    pod: ObjectReference,
}

impl Announcer {
    async fn run(self, mut transitions: broadcast::Receiver<LeaderState>, mut app: watch::Receiver<AppHealth>) {
        let mut app_open = true;
        loop {
            tokio::select! {
                transition = transitions.recv() => match transition {
                    Ok(transition) => self.announce(&transition).await,
                    Err(broadcast::error::RecvError::Lagged(missed)) => warn!(missed, "Events fell behind"),
                    Err(broadcast::error::RecvError::Closed) => return,
                },
                changed = app.changed(), if app_open => match changed {
                    Ok(()) => {
                        let health = app.borrow_and_update().clone();
                        self.announce_app_health(&health).await;
                    }
                    Err(_) => app_open = false,
                },
            }
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
        if let Err(e) = self.recorder.publish(&event, &self.pod).await {
            warn!(error = %e, reason, "cannot publish an Event");
        }
    }
}

impl Announcer {
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
        if let Err(e) = self.recorder.publish(&event, &self.pod).await {
            warn!(error = %e, reason, "cannot publish an Event");
        }
    }
}

fn token(state: &LeaderState) -> String {
    state.token.map(|t| t.to_string()).unwrap_or_default()
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The pod name in a holder identity `[cluster/]namespace/pod#nonce`;
/// `None` when the holder is not such an identity.
pub fn holder_pod(holder: &str) -> Option<String> {
    holder
        .parse::<crate::lease::Identity>()
        .ok()
        .map(|identity| identity.name().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::api::{ApiServer, Recorded, pods};
    use serde_json::Value;
    use tokio_util::sync::CancellationToken;

    const KEY: &str = "leasehold.dev/leader";

    fn api() -> ApiServer {
        ApiServer::new(Some(crate::sidecar::rbac::allows_request))
    }

    fn publisher(api: &ApiServer) -> Publisher {
        let pod = PodRef {
            name: "web-0".into(),
            namespace: "prod".into(),
            uid: Some("uid-0".into()),
        };
        let publishing = Publishing {
            label_key: KEY.into(),
            selector: "app=web".into(),
            candidate_labels: Default::default(),
        };
        Publisher::new(api.client("prod"), pod, publishing)
    }

    fn add_pod(api: &ApiServer, name: &str, leader: &str, condition: Option<&str>, gated: bool) {
        let mut pod = pods::pod(
            name,
            "prod",
            json!({"app": "web", KEY: leader}),
            gated.then_some(LEADER_CONDITION),
        );
        if let Some(status) = condition {
            pod["status"]["conditions"] = json!([{"type": LEADER_CONDITION, "status": status}]);
        }
        api.insert(&pods::collection("prod"), pod);
    }

    fn pod(api: &ApiServer, name: &str) -> Value {
        api.get(&pods::collection("prod"), name).unwrap()
    }

    fn leading() -> LeaderState {
        let now = Instant::now();
        LeaderState {
            leader: true,
            holder: Some("prod/web-0#abc".into()),
            deadline: Some(now + Duration::from_secs(3600)),
            renewed: Some(now),
            ..Default::default()
        }
    }

    /// Runs the publisher with `state`; the elector's controls come from a
    /// real elector that never acquires (its store is down).
    fn start(publisher: Publisher, state: watch::Receiver<LeaderState>) -> tokio::task::JoinHandle<()> {
        let store = crate::store::MemoryStore::new(1);
        store.set_faults(crate::store::Faults {
            down: true,
            ..Default::default()
        });
        let timing = crate::lease::Timing::default();
        let elector = crate::lease::Elector::new("idle", crate::lease::Identity::new(None, None, "x"), timing);
        let transitions = elector.transitions();
        let handle = elector.spawn(std::sync::Arc::new(store), CancellationToken::new());
        let app = watch::channel(AppHealth::default());
        tokio::spawn(async move {
            publisher.run(state, transitions, app.1, handle.control()).await;
            drop((app.0, handle));
        })
    }

    /// Waits (paused time) until `done` holds for the model, at most a minute.
    async fn until(api: &ApiServer, what: &str, done: impl Fn(&ApiServer) -> bool) {
        let started = Instant::now();
        while !done(api) {
            assert!(started.elapsed() < Duration::from_secs(60), "never: {what}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    fn patches(api: &ApiServer) -> Vec<Recorded> {
        api.requests().into_iter().filter(|r| r.method == "PATCH").collect()
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_leader_clears_other_leaders_then_labels_itself_then_becomes_ready() {
        let api = api();
        add_pod(&api, "web-0", "false", None, true);
        add_pod(&api, "web-1", "true", Some("True"), true);
        let stale = pod(&api, "web-1")["metadata"]["resourceVersion"].clone();
        let (_state, rx) = watch::channel(leading());
        start(publisher(&api), rx);
        until(&api, "ready", |api| {
            pods::condition(&pod(api, "web-0"), LEADER_CONDITION) == Some("True")
        })
        .await;

        let patches = patches(&api);
        let order: Vec<(&str, &str)> = patches
            .iter()
            .map(|r| (r.uri.as_str(), r.content_type.as_str()))
            .collect();
        assert_eq!(
            order,
            [
                (
                    "/api/v1/namespaces/prod/pods/web-1/status?",
                    "application/strategic-merge-patch+json"
                ),
                ("/api/v1/namespaces/prod/pods/web-1?", "application/merge-patch+json"),
                ("/api/v1/namespaces/prod/pods/web-0?", "application/merge-patch+json"),
                (
                    "/api/v1/namespaces/prod/pods/web-0/status?",
                    "application/strategic-merge-patch+json"
                ),
            ],
            "the stale leader's readiness, then its label, then ours, then our readiness"
        );
        let cleared = &patches[0].body;
        assert_eq!(cleared["metadata"]["resourceVersion"], stale, "guarded by what we saw");
        assert_eq!(cleared["status"]["conditions"][0]["type"], LEADER_CONDITION);
        assert_eq!(cleared["status"]["conditions"][0]["status"], "False");
        let unlabelled = &patches[1].body;
        assert_eq!(unlabelled["metadata"]["labels"], json!({KEY: "false"}));
        assert!(unlabelled["metadata"]["resourceVersion"].is_string());
        assert_eq!(patches[2].body["metadata"]["labels"], json!({KEY: "true"}));
        let condition = &patches[3].body["status"]["conditions"][0];
        assert_eq!(condition["status"], "True");
        assert_eq!(condition["reason"], "Leader");
        assert!(condition["lastTransitionTime"].is_string());
        // The watches: our pod by name, the candidates by the lease's selector.
        let watches: Vec<String> = api
            .requests()
            .into_iter()
            .filter(|r| r.method == "GET" && r.uri.contains("watch=true"))
            .map(|r| r.uri)
            .collect();
        assert!(
            watches
                .iter()
                .any(|u| u.contains("fieldSelector=metadata.name%3Dweb-0")),
            "{watches:?}"
        );
        assert!(
            watches.iter().any(|u| u.contains("labelSelector=app%3Dweb")),
            "{watches:?}"
        );
        assert!(api.forbidden().is_empty(), "{:?}", api.forbidden());
        assert_eq!(pods::label(&pod(&api, "web-1"), KEY), Some("false"));
    }

    /// A stalled old leader's pod: condition still True, but its sidecar
    /// has the gate probe and the kubelet has the pod unready (`ready`).
    fn add_stalled_peer(api: &ApiServer, ready: &str) {
        add_pod(api, "web-1", "true", Some("True"), true);
        let mut peer = pod(api, "web-1");
        peer["spec"]["initContainers"] = json!([{
            "name": SIDECAR_CONTAINER, "restartPolicy": "Always",
            "readinessProbe": {"httpGet": {"path": GATE_PROBE_PATH, "port": 4041}},
        }]);
        peer["status"]["conditions"]
            .as_array_mut()
            .unwrap()
            .push(json!({"type": "Ready", "status": ready}));
        api.insert(&pods::collection("prod"), peer);
    }

    /// web-0 leads beside the stalled peer (Ready `ready`) until web-0's
    /// own leader condition is True; the leader's state stays open with the
    /// sender returned.
    async fn lead_beside_a_stalled_peer(ready: &str) -> (ApiServer, watch::Sender<LeaderState>) {
        let api = api();
        add_pod(&api, "web-0", "false", None, true);
        add_stalled_peer(&api, ready);
        let (state, rx) = watch::channel(leading());
        start(publisher(&api), rx);
        until(&api, "ready", |api| {
            pods::condition(&pod(api, "web-0"), LEADER_CONDITION) == Some("True")
        })
        .await;
        (api, state)
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_leader_does_not_wait_on_a_stalled_peers_condition_the_kubelet_keeps_unready() {
        let (api, _state) = lead_beside_a_stalled_peer("False").await;
        let uris: Vec<String> = patches(&api).into_iter().map(|r| r.uri).collect();
        assert_eq!(
            uris,
            [
                "/api/v1/namespaces/prod/pods/web-1?",
                "/api/v1/namespaces/prod/pods/web-0?",
                "/api/v1/namespaces/prod/pods/web-0/status?",
            ],
            "the peer's label is cleared, its condition (which only its own sidecar may change) is not"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_probed_peer_that_is_still_ready_is_cleared_before_we_mark_ourselves() {
        let (api, _state) = lead_beside_a_stalled_peer("True").await;
        let first = &patches(&api)[0];
        assert_eq!(first.uri, "/api/v1/namespaces/prod/pods/web-1/status?");
        assert_eq!(first.body["status"]["conditions"][0]["status"], "False");
    }

    #[tokio::test(start_paused = true)]
    async fn a_leader_that_stops_claiming_turns_unready_before_relabelling() {
        let api = api();
        add_pod(&api, "web-0", "true", Some("True"), true);
        let (_state, rx) = watch::channel(LeaderState::default());
        start(publisher(&api), rx);
        until(&api, "labelled false", |api| {
            pods::label(&pod(api, "web-0"), KEY) == Some("false")
        })
        .await;
        let patches = patches(&api);
        assert_eq!(patches.len(), 2, "{patches:?}");
        assert_eq!(patches[0].uri, "/api/v1/namespaces/prod/pods/web-0/status?");
        assert_eq!(patches[0].body["status"]["conditions"][0]["status"], "False");
        assert_eq!(patches[0].body["status"]["conditions"][0]["reason"], "Follower");
        assert_eq!(patches[1].uri, "/api/v1/namespaces/prod/pods/web-0?");
        assert_eq!(patches[1].body["metadata"]["labels"], json!({KEY: "false"}));
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_readiness_gate_only_the_label_is_written() {
        let api = api();
        add_pod(&api, "web-0", "true", None, false);
        let (_state, rx) = watch::channel(LeaderState::default());
        start(publisher(&api), rx);
        until(&api, "labelled false", |api| {
            pods::label(&pod(api, "web-0"), KEY) == Some("false")
        })
        .await;
        tokio::time::sleep(Duration::from_secs(10)).await;
        let patches = patches(&api);
        assert_eq!(
            patches.len(),
            1,
            "no status patch for a pod without the gate: {patches:?}"
        );
    }

    /// A brief leader's late clear cannot undo the real leader's "true": the
    /// pod changed since the clear was decided, and the API server answers 409.
    #[tokio::test(start_paused = true)]
    async fn a_late_clear_fails_on_the_resource_version_it_saw() {
        let api = api();
        add_pod(&api, "web-1", "true", None, false);
        let seen = pod(&api, "web-1")["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .to_string();
        // The real leader re-labels its pod meanwhile (a new resourceVersion).
        let mut relabelled = pod(&api, "web-1");
        relabelled["metadata"]["labels"]["touched"] = json!("yes");
        api.insert(&pods::collection("prod"), relabelled);
        let late = publisher(&api).perform(&Write::Label {
            pod: "web-1".into(),
            leader: false,
            version: seen,
        });
        match late.await {
            Err(kube::Error::Api(e)) => assert_eq!(e.code, 409, "{e:?}"),
            other => panic!("a stale clear must conflict: {other:?}"),
        }
        assert_eq!(pods::label(&pod(&api, "web-1"), KEY), Some("true"));
    }

    /// Level-triggered: whatever else changes our label, the leader writes it back.
    #[tokio::test(start_paused = true)]
    async fn our_label_and_condition_are_reasserted_when_something_else_changes_them() {
        let api = api();
        add_pod(&api, "web-0", "false", None, true);
        let (_state, rx) = watch::channel(leading());
        start(publisher(&api), rx);
        let claims = |api: &ApiServer| {
            let p = pod(api, "web-0");
            pods::label(&p, KEY) == Some("true") && pods::condition(&p, LEADER_CONDITION) == Some("True")
        };
        until(&api, "claiming", claims).await;
        let mut changed = pod(&api, "web-0");
        changed["metadata"]["labels"][KEY] = json!("false");
        changed["status"]["conditions"][0]["status"] = json!("False");
        api.insert(&pods::collection("prod"), changed);
        assert!(!claims(&api));
        until(&api, "claiming again", claims).await;
    }

    /// Writes towards "leader" failing for a minute (backoff at its cap, the
    /// API server otherwise up) do not delay stopping to claim once that is
    /// what the elector says: no backoff and no write in flight stands between.
    #[tokio::test(start_paused = true)]
    async fn stopping_to_claim_never_waits_behind_retries_of_another_write() {
        let api = api();
        add_pod(&api, "web-0", "true", Some("True"), true);
        add_pod(&api, "web-1", "true", None, false);
        api.fail_when(Some(|method, path| method == "PATCH" && path.contains("/pods/web-1")));
        let (state, rx) = watch::channel(leading());
        start(publisher(&api), rx);
        tokio::time::sleep(Duration::from_secs(60)).await;
        let failed = patches(&api).iter().filter(|r| r.status == 500).count();
        assert!(
            (6..60).contains(&failed),
            "retried with capped backoff: {failed} attempts in a minute"
        );
        let before = api.requests().len();
        state.send_replace(LeaderState::default());
        let stopped = Instant::now();
        until(&api, "not ready", |api| {
            pods::condition(&pod(api, "web-0"), LEADER_CONDITION) == Some("False")
        })
        .await;
        assert!(
            stopped.elapsed() < Duration::from_millis(100),
            "{:?}",
            stopped.elapsed()
        );
        let after: Vec<Recorded> = api.requests()[before..]
            .iter()
            .filter(|r| r.method == "PATCH")
            .cloned()
            .collect();
        assert_eq!(after[0].uri, "/api/v1/namespaces/prod/pods/web-0/status?", "{after:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn acquisitions_losses_and_releases_become_events_on_the_pod() {
        let api = api();
        let publisher = publisher(&api);
        let state = |change: Change| LeaderState {
            term: 4,
            token: Some(crate::lease::FencingToken(9)),
            change,
            ..Default::default()
        };
        for change in [
            Change::Acquired,
            Change::Renewed,
            Change::DeadlineMissed,
            Change::Released,
        ] {
            publisher.announcer.announce(&state(change)).await;
        }
        let posts: Vec<Recorded> = api.requests().into_iter().filter(|r| r.method == "POST").collect();
        let reasons: Vec<(&str, &str)> = posts
            .iter()
            .map(|r| (r.body["reason"].as_str().unwrap(), r.body["type"].as_str().unwrap()))
            .collect();
        assert_eq!(
            reasons,
            [("Acquired", "Normal"), ("Lost", "Warning"), ("Released", "Normal")],
            "renewals are not news"
        );
        for post in &posts {
            assert_eq!(post.path(), "/apis/events.k8s.io/v1/namespaces/prod/events");
            assert_eq!(post.body["regarding"]["kind"], "Pod");
            assert_eq!(post.body["regarding"]["name"], "web-0");
            assert_eq!(post.body["regarding"]["uid"], "uid-0");
            assert_eq!(post.body["reportingController"], "leasehold-sidecar");
        }
        assert!(api.forbidden().is_empty(), "{:?}", api.forbidden());
    }

    /// An Event on each change of the app's health (docs/operator.md): the
    /// reason and type say which way it went, the note why. A change back
    /// to a reason already recorded is the same Event again: kube-runtime's
    /// `events::Recorder` records a repeat (same reason, type, action and
    /// pod) as the events API's series, a PATCH counting it
    /// (`series.count`), as client-go's `tools/events` does.
    #[tokio::test(start_paused = true)]
    async fn each_change_of_the_apps_health_becomes_an_event_on_the_pod() {
        let api = api();
        let publisher = publisher(&api);
        let (_transitions_tx, transitions) = broadcast::channel(4);
        let (app_tx, app) = watch::channel(AppHealth::default());
        let announcer = tokio::spawn(publisher.announcer.clone().run(transitions, app));
        let events = |api: &ApiServer| -> Vec<(String, String, String, u64)> {
            api.requests()
                .into_iter()
                .filter(|r| r.path().starts_with("/apis/events.k8s.io/v1/namespaces/prod/events"))
                .map(|r| {
                    assert_eq!(r.body["regarding"]["name"], "web-0");
                    let field = |name: &str| r.body[name].as_str().unwrap_or_default().to_string();
                    let count = r.body["series"]["count"].as_u64().unwrap_or(1);
                    (r.method.clone(), field("reason"), field("type"), count)
                })
                .collect()
        };
        let changes = [
            (Some(true), "url: answered 200"),
            (Some(false), "url: answered 500"),
            (None, "url: no answer yet"),
            (Some(true), "url: answered 204"),
        ];
        for (seen, (healthy, reason)) in changes.into_iter().enumerate() {
            app_tx.send_replace(AppHealth {
                healthy,
                reason: reason.into(),
            });
            until(&api, "an Event for the change", |api| events(api).len() > seen).await;
        }
        let expected = [
            ("POST", "AppHealthy", "Normal", 1),
            ("POST", "AppUnhealthy", "Warning", 1),
            ("POST", "AppHealthUnknown", "Warning", 1),
            ("PATCH", "AppHealthy", "Normal", 2),
        ]
        .map(|(method, reason, type_, count)| (method.to_string(), reason.to_string(), type_.to_string(), count));
        assert_eq!(events(&api), expected, "one Event per change");
        let notes: Vec<Value> = api.requests().iter().map(|r| r.body["note"].clone()).take(3).collect();
        assert_eq!(notes, ["url: answered 200", "url: answered 500", "url: no answer yet"]);
        announcer.abort();
    }

    /// web-0's elector and publisher, following a lease web-1 holds for an
    /// hour (P = 30 s), campaigning or not, with web-1 labelled "true".
    async fn follower_of_web1(
        api: &ApiServer,
        store: &crate::store::MemoryStore,
        campaigning: bool,
    ) -> (crate::lease::ElectorHandle, crate::lease::Grant) {
        use crate::lease::LeaseStore;
        add_pod(api, "web-0", "false", None, false);
        add_pod(api, "web-1", "true", None, false);
        let lease = Duration::from_secs(3600);
        let grant = store.acquire("web", "prod/web-1#abc", lease).await.unwrap();
        let timing = crate::lease::Timing::new(
            Duration::from_secs(120),
            Duration::from_secs(60),
            Duration::from_secs(30),
            0.0,
        )
        .unwrap();
        let elector = crate::lease::Elector::new(
            "web",
            crate::lease::Identity::new(None, Some("prod".into()), "web-0"),
            timing,
        );
        let transitions = elector.transitions();
        let handle = elector.spawn(std::sync::Arc::new(store.clone()), CancellationToken::new());
        handle.set_campaigning(campaigning);
        let app = watch::channel(AppHealth::default());
        tokio::spawn(publisher(api).run(handle.subscribe(), transitions, app.1, handle.control()));
        (handle, grant)
    }

    fn label_web1_false(api: &ApiServer) {
        let mut released = pod(api, "web-1");
        released["metadata"]["labels"][KEY] = json!("false");
        api.insert(&pods::collection("prod"), released);
    }

    /// The holder's pod turning its label to "false" makes a follower look
    /// at the store at once instead of at its next poll (P = 30 s here).
    #[tokio::test(start_paused = true)]
    async fn the_leaders_label_turning_false_makes_a_follower_acquire_at_once() {
        use crate::lease::LeaseStore;
        let api = api();
        let store = crate::store::MemoryStore::new(1);
        let (handle, grant) = follower_of_web1(&api, &store, true).await;
        let mut state = handle.subscribe();
        state
            .wait_for(|s| s.holder.as_deref() == Some("prod/web-1#abc"))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;

        store.release("web", "prod/web-1#abc", grant.token).await.unwrap();
        label_web1_false(&api);
        let at = Instant::now();
        state.wait_for(|s| s.leader).await.unwrap();
        assert!(
            at.elapsed() < Duration::from_secs(1),
            "acquired only after {:?}",
            at.elapsed()
        );
    }

    /// Issue 16: the old leader stands aside the moment the new pod's app
    /// turns ready, which is when the new pod starts campaigning, so its
    /// first observation is still in flight (it does not know the holder)
    /// when the leader's label turns "false", and that observation finds
    /// the lease still held (the release commits later). A pod labelled
    /// "true" turning "false" nudges it anyway: it leads in store round
    /// trips, not at its next poll (30 s).
    #[tokio::test(start_paused = true)]
    async fn a_leader_turning_false_nudges_a_follower_that_does_not_know_the_holder_yet() {
        use crate::lease::LeaseStore;
        let api = api();
        let store = crate::store::MemoryStore::new(1);
        let (handle, grant) = follower_of_web1(&api, &store, false).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(handle.state().holder, None, "not campaigning, never observed");
        store.set_faults(crate::store::Faults {
            latency: Duration::from_millis(5),
            ..Default::default()
        });
        let at = Instant::now();
        handle.set_campaigning(true);
        label_web1_false(&api);
        tokio::time::sleep(Duration::from_millis(1)).await;
        tokio::spawn(async move { store.release("web", "prod/web-1#abc", grant.token).await });
        let mut state = handle.subscribe();
        let first = state.wait_for(|s| s.holder.is_some()).await.unwrap().clone();
        assert_eq!(
            first.holder.as_deref(),
            Some("prod/web-1#abc"),
            "the first look missed the release"
        );
        state.wait_for(|s| s.leader).await.unwrap();
        assert!(
            at.elapsed() < Duration::from_secs(1),
            "acquired only after {:?}",
            at.elapsed()
        );
    }

    /// Issue 25: a leader's label turns "false" when it stops claiming, a
    /// drain before it releases. Once released it says so on its own leader
    /// condition (after the label), also on a pod without the readiness gate.
    #[tokio::test(start_paused = true)]
    async fn after_a_release_the_pod_says_so_on_its_leader_condition() {
        let api = api();
        add_pod(&api, "web-0", "true", None, false);
        let released = LeaderState {
            term: 4,
            change: Change::Released,
            ..Default::default()
        };
        let (_state, rx) = watch::channel(released);
        start(publisher(&api), rx);
        until(&api, "marked released", |api| {
            pods::condition(&pod(api, "web-0"), LEADER_CONDITION) == Some("False")
        })
        .await;
        let patches = patches(&api);
        assert_eq!(patches.len(), 2, "{patches:?}");
        assert_eq!(
            patches[0].body["metadata"]["labels"],
            json!({KEY: "false"}),
            "the label first"
        );
        assert_eq!(patches[1].uri, "/api/v1/namespaces/prod/pods/web-0/status?");
        let condition = &patches[1].body["status"]["conditions"][0];
        assert_eq!(condition["reason"], RELEASED_REASON);
        assert_eq!(condition["message"], "released term 4");
        assert!(api.forbidden().is_empty(), "{:?}", api.forbidden());
    }

    /// The holder's pod saying it released (its label turned "false" a
    /// drain earlier, longer than the hurry after that nudge) makes a
    /// follower acquire at once instead of at its next poll (P = 30 s):
    /// any change of the holder's pod while labelled "false" nudges it.
    #[tokio::test(start_paused = true)]
    async fn a_leader_saying_it_released_makes_a_follower_acquire_at_once() {
        use crate::lease::LeaseStore;
        let api = api();
        let store = crate::store::MemoryStore::new(1);
        let (handle, grant) = follower_of_web1(&api, &store, true).await;
        let mut state = handle.subscribe();
        state
            .wait_for(|s| s.holder.as_deref() == Some("prod/web-1#abc"))
            .await
            .unwrap();
        label_web1_false(&api);
        // Past the hurry that nudge started (one P), and just after a poll:
        // the next one is a whole P (30 s) away.
        tokio::time::sleep(Duration::from_secs(40)).await;
        let reads = store.calls().reads;
        while store.calls().reads == reads {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(!handle.state().leader, "web-1 drains, still holding the lease");

        store.release("web", "prod/web-1#abc", grant.token).await.unwrap();
        let mut released = pod(&api, "web-1");
        released["status"]["conditions"] = json!([{"type": LEADER_CONDITION, "status": "False",
            "reason": RELEASED_REASON, "message": released_message(grant.term)}]);
        api.insert(&pods::collection("prod"), released);
        let at = Instant::now();
        state.wait_for(|s| s.leader).await.unwrap();
        assert!(
            at.elapsed() < Duration::from_secs(1),
            "acquired only after {:?}",
            at.elapsed()
        );
    }

    #[test]
    fn holder_identities_name_their_pod() {
        assert_eq!(holder_pod("eu/prod/web-1#abc").as_deref(), Some("web-1"));
        assert_eq!(holder_pod("prod/web-1#abc").as_deref(), Some("web-1"));
        assert_eq!(holder_pod("web-1#abc").as_deref(), Some("web-1"));
        assert_eq!(holder_pod("not an identity"), None);
    }
}
