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
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher;
use serde_json::json;
use tokio::sync::{broadcast, watch};
use tokio::time::Instant;
use tracing::{debug, info, warn};

mod announce;

use super::config::Publishing;
use super::health::AppHealth;
use super::pod::{PodRef, pod_recorder, watch_backoff};
use super::starting::Throttle;
use announce::Announcer;
use leasehold_core::lease::{Change, ElectorControl, LeaderState};
use leasehold_kubernetes::api::contract::{GATE_PROBE_PATH, LEADER_CONDITION, SIDECAR_CONTAINER};

pub(crate) use super::BACKOFF_CAP;
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
        .parse::<leasehold_core::lease::Identity>()
        .ok()
        .map(|identity| identity.name().to_string())
}

#[cfg(test)]
mod tests;
