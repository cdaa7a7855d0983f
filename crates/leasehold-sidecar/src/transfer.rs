//! Transfers (issue 35, docs/transfer.md): the leader's sidecar acts on the
//! `LeaseTransfer`s naming its lease, one at a time, oldest first.
//!
//! A request whose target is a ready candidate that does not lead makes the
//! leader hand over ([`ElectorControl::hand_over`]): it stops claiming,
//! drains as on termination, and releases with a reservation for the
//! target's pod UID, which the store enforces. The leader stays aside until
//! the target leads or the reservation has ended, then reports the outcome
//! in the request's status and, for a failure, in an Event. Any other
//! target is refused with one reason. Level-triggered: every look compares
//! the requests with what the leader knows; a request the previous leader
//! left `Transferring` is finished by whoever leads now: `Transferred` by
//! the target, `TargetDidNotAcquire` by anyone else (never handed over
//! again).

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{ListParams, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Api, Resource, ResourceExt};
use tokio::sync::{broadcast, watch};
use tracing::{info, warn};

use leasehold_core::lease::{Change, ElectorControl, Handoff, Identity, LeaderState, Release};
use leasehold_kubernetes::api::contract::{
    SIDECAR_CONTAINER, STORE_CONDITION, containers_ready_since, store_reachable,
};
use leasehold_kubernetes::api::transfer::{
    LeaseTransfer, LeaseTransferStatus, TransferOrigin, TransferPhase, TransferRefusal,
};

use super::pod::PodRef;

/// The field manager of the sidecar's status patches.
const FIELD_MANAGER: &str = "leasehold-sidecar";

/// What the leader's sidecar needs to judge and carry out transfers.
pub(crate) struct Transfers {
    pub transfers: Api<LeaseTransfer>,
    pub pods: Api<Pod>,
    /// The DistributedLease this sidecar campaigns for.
    pub lease: String,
    /// Its candidates, as a label selector.
    pub selector: String,
    pub me: PodRef,
    /// How long the store keeps the lease for the target after the
    /// release: the lease duration (the store caps it there anyway).
    pub window: Duration,
    /// Bounds the wait for the release, which follows the drain.
    pub drain: Duration,
    pub recorder: Recorder,
}

/// A transfer's target, once judged a ready candidate.
struct Target {
    uid: String,
}

/// Why a target was not judged a ready candidate.
enum Judged {
    /// It is not one: the request's final answer.
    Refused(TransferRefusal, String),
    /// The API could not say (an error reading the pod or the candidates):
    /// no answer, the next look judges again (issue 54).
    Unread(String),
}

impl Transfers {
    /// Watches the namespace's LeaseTransfers and acts on this lease's for
    /// as long as the sidecar runs. `transitions` is the elector's stream of
    /// every change (`ElectorHandle::transitions`), which says how a
    /// release ended: `state` keeps only the latest value, and the next
    /// observation replaces `Released` at once on a store that answers
    /// from a watch (the Kubernetes store).
    pub(crate) async fn follow(
        self,
        control: ElectorControl,
        mut state: watch::Receiver<LeaderState>,
        transitions: broadcast::Receiver<LeaderState>,
    ) {
        let (reader, writer) = reflector::store();
        let stream = reflector(writer, watcher(self.transfers.clone(), watcher::Config::default()))
            .default_backoff()
            .applied_objects();
        tokio::pin!(stream);
        loop {
            // Each wake-up is a new look at every request (level-triggered).
            tokio::select! {
                event = stream.next() => match event {
                    Some(Ok(_)) => {}
                    Some(Err(e)) => warn!(error = %e, "watching LeaseTransfers"),
                    None => return,
                },
                changed = state.changed() => if changed.is_err() { return },
            }
            let leading = state.borrow().leader;
            if !leading {
                continue;
            }
            let mut pending: Vec<_> = reader
                .state()
                .into_iter()
                .filter(|t| t.spec.lease == self.lease && !phase(t).is_some_and(TransferPhase::is_final))
                .collect();
            pending.sort_by_key(|t| (t.metadata.creation_timestamp.clone().map(|t| t.0), t.name_any()));
            if let Some(request) = pending.first() {
                self.act_on(request, &control, &mut state, &transitions).await;
            }
        }
    }

    /// One request, while leading: finish it, refuse it or hand over.
    async fn act_on(
        &self,
        request: &LeaseTransfer,
        control: &ElectorControl,
        state: &mut watch::Receiver<LeaderState>,
        transitions: &broadcast::Receiver<LeaderState>,
    ) {
        // The watch may not show the latest answer yet (this sidecar's own
        // of a moment ago, when it leads again right after a handover that
        // failed): judge the request as the API server has it now, or a
        // final answer would be overwritten by a judgement of a stale copy.
        let request = match self.transfers.get_opt(&request.name_any()).await {
            Ok(Some(request)) if !phase(&request).is_some_and(TransferPhase::is_final) => request,
            Ok(_) => return,
            Err(e) => {
                warn!(transfer = %request.name_any(), error = %e, "cannot read the transfer");
                return;
            }
        };
        let request = &request;
        let led = state.borrow().clone();
        let status = request.status.clone().unwrap_or_default();
        let my_uid = self.me.uid.as_deref();
        if status.phase == Some(TransferPhase::Transferring)
            && status.target_uid.as_deref() == my_uid
            && my_uid.is_some()
        {
            // Handed to us (the previous leader may be gone before it saw it).
            self.finish(request, status, &led).await;
            return;
        }
        if status.phase == Some(TransferPhase::Transferring)
            && let Some(from) = status.from_term.filter(|&from| from < led.term)
        {
            // An earlier term's handover, and the term after it is not the
            // target's: it is over. Judging it again would hand over once
            // more to a target that may never acquire, and a leader after
            // that again (while the answer of the one before is on its way).
            let message = format!(
                "term {from} handed over to pod {}, which did not lead the term after it; term {} is {}'s",
                request.spec.to, led.term, self.me.name
            );
            self.fail(request, status, TransferRefusal::TargetDidNotAcquire, message)
                .await;
            return;
        }
        let target = match self.judge(&request.spec.to, &led).await {
            Ok(target) => target,
            Err(Judged::Refused(refusal, message)) => {
                self.fail(request, status, refusal, message).await;
                return;
            }
            Err(Judged::Unread(why)) => {
                // A fault of the API, not an answer about the target: the
                // next look (at the next renewal at the latest) judges again.
                warn!(transfer = %request.name_any(), %why, "cannot judge the target yet; trying again");
                return;
            }
        };
        let handoff = match Handoff::new(&target.uid, self.window) {
            Ok(handoff) => handoff,
            Err(e) => {
                let message = format!(
                    "pod {}: {}",
                    request.spec.to,
                    leasehold_kubernetes::api::errors::chain(&e)
                );
                self.fail(request, status, TransferRefusal::NotACandidate, message)
                    .await;
                return;
            }
        };
        let started = LeaseTransferStatus {
            phase: Some(TransferPhase::Transferring),
            reason: Some("StandingAside".into()),
            message: Some(format!(
                "term {} stops claiming, drains and releases with a reservation for pod {} ({})",
                led.term, request.spec.to, target.uid
            )),
            target_uid: Some(target.uid.clone()),
            from_holder: led.holder.clone(),
            from_term: Some(led.term),
            term: None,
            started_at: Some(now()),
            completed_at: None,
        };
        let Some(request) = self.write(request, &started).await else {
            // Not recorded: do not start what nobody could follow.
            return;
        };
        let request = &request;
        info!(transfer = %request.name_any(), to = %request.spec.to, uid = %target.uid, "handing over");
        let preempted = request.spec.origin == Some(TransferOrigin::Preference);
        // Subscribed before the hand-over starts: it sees every change after.
        let mut changes = transitions.resubscribe();
        control.hand_over(Some(Release::handing_over(handoff, preempted)));
        let outcome = self.hand_over(&target.uid, led.term, state, &mut changes).await;
        control.hand_over(None);
        match outcome {
            Ok(state) => self.finish(request, started, &state).await,
            Err((refusal, message)) => self.fail(request, started, refusal, message).await,
        }
    }

    /// Waits for the release, then for the target to lead or the
    /// reservation to end; the elector stays aside all along.
    async fn hand_over(
        &self,
        target_uid: &str,
        term: u64,
        state: &mut watch::Receiver<LeaderState>,
        changes: &mut broadcast::Receiver<LeaderState>,
    ) -> Result<LeaderState, (TransferRefusal, String)> {
        // The release follows the drain and is bounded by the renew
        // deadline (< window), so this bound is never the usual end.
        let released = tokio::time::timeout(self.drain + self.window, async {
            loop {
                match changes.recv().await {
                    Ok(s)
                        if !s.leader
                            && matches!(
                                s.change,
                                Change::Released | Change::ReleaseFailed(_) | Change::Lost(_) | Change::DeadlineMissed
                            ) =>
                    {
                        return Some(s.change);
                    }
                    // A hand-over is a handful of changes in a channel of
                    // 64: a lag is not expected, and then the bound ends
                    // the wait as a failed release (never taken as success).
                    Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                    Err(broadcast::error::RecvError::Closed) => return None,
                }
            }
        })
        .await;
        let change = match released {
            Ok(Some(change)) => change,
            Ok(None) => return Err((TransferRefusal::LeadershipLost, "the elector stopped".into())),
            Err(_) => return Err((TransferRefusal::ReleaseFailed, "the release did not end in time".into())),
        };
        let leads = |s: &LeaderState| {
            s.term > term && s.holder.as_deref().and_then(Identity::pod_uid_of).as_deref() == Some(target_uid)
        };
        match change {
            Change::Released => {}
            Change::ReleaseFailed(e) => {
                // Stay aside while a release in flight could still land.
                tokio::time::sleep(self.window).await;
                return Err((TransferRefusal::ReleaseFailed, format!("term {term}: {e}")));
            }
            other => {
                return Err((
                    TransferRefusal::LeadershipLost,
                    format!("term {term} ended before the handover: {other:?}"),
                ));
            }
        }
        // The store refuses everyone else until the window ends, on its
        // own clock; ours only says when to stop waiting.
        match tokio::time::timeout(self.window, state.wait_for(|s| leads(s))).await {
            Ok(Ok(state)) => Ok(state.clone()),
            _ => Err((
                TransferRefusal::TargetDidNotAcquire,
                format!(
                    "released term {term} reserved for pod {target_uid}, which did not acquire within {:?}; anyone may now",
                    self.window
                ),
            )),
        }
    }

    /// Whether `to` is a ready candidate of this lease that does not lead.
    async fn judge(&self, to: &str, led: &LeaderState) -> Result<Target, Judged> {
        let pod = match self.pods.get_opt(to).await {
            Ok(Some(pod)) => pod,
            Ok(None) => {
                return Err(Judged::Refused(
                    TransferRefusal::TargetNotFound,
                    format!("no pod {to} in namespace {}", self.me.namespace),
                ));
            }
            Err(e) => return Err(Judged::Unread(format!("reading pod {to}: {e}"))),
        };
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let leader_uid = led.holder.as_deref().and_then(Identity::pod_uid_of);
        if to == self.me.name || leader_uid.as_deref() == Some(uid.as_str()) {
            return Err(Judged::Refused(
                TransferRefusal::AlreadyLeads,
                format!("pod {to} already leads term {}", led.term),
            ));
        }
        let selected = self
            .pods
            .list(
                &ListParams::default()
                    .labels(&self.selector)
                    .fields(&format!("metadata.name={to}")),
            )
            .await;
        match selected {
            Ok(list) if !list.items.is_empty() => {}
            Ok(_) => {
                return Err(Judged::Refused(
                    TransferRefusal::NotACandidate,
                    format!("pod {to} is not selected by lease {} ({})", self.lease, self.selector),
                ));
            }
            Err(e) => return Err(Judged::Unread(format!("listing candidates: {e}"))),
        }
        judge_pod(to, &pod).map_err(|(refusal, message)| Judged::Refused(refusal, message))?;
        Ok(Target { uid })
    }

    async fn finish(&self, request: &LeaseTransfer, mut status: LeaseTransferStatus, led: &LeaderState) {
        status.phase = Some(TransferPhase::Transferred);
        status.reason = Some("TargetLeads".into());
        status.message = Some(format!("pod {} leads term {}", request.spec.to, led.term));
        status.term = Some(led.term);
        status.completed_at = Some(now());
        if self.write_final(request, &status).await {
            info!(transfer = %request.name_any(), term = led.term, "transferred");
        }
    }

    async fn fail(
        &self,
        request: &LeaseTransfer,
        mut status: LeaseTransferStatus,
        refusal: TransferRefusal,
        message: String,
    ) {
        warn!(transfer = %request.name_any(), reason = refusal.reason(), %message, "transfer failed");
        status.phase = Some(TransferPhase::TransferFailed);
        status.reason = Some(refusal.reason().into());
        status.message = Some(message.clone());
        status.completed_at = Some(now());
        if self.write_final(request, &status).await {
            let event = Event {
                type_: EventType::Warning,
                reason: refusal.reason().into(),
                note: Some(message),
                action: "Transfer".into(),
                secondary: None,
            };
            if let Err(e) = self.recorder.publish(&event, &reference(request)).await {
                warn!(error = %e, "cannot record the transfer's Event");
            }
        }
    }

    /// Writes `status` when it differs from the request's (JSON merge patch
    /// of the status subresource), only over the copy `request` is: the
    /// patch carries its resourceVersion, which the API server takes as a
    /// precondition and answers 409 when the object changed since
    /// (kubernetes/kubernetes#63104: a patch's resourceVersion becomes the
    /// update's precondition in GuaranteedUpdate). The request as
    /// written, or `None` when the write failed and the next look decides
    /// again.
    async fn write(&self, request: &LeaseTransfer, status: &LeaseTransferStatus) -> Option<LeaseTransfer> {
        if request.status.as_ref() == Some(status) {
            return Some(request.clone());
        }
        // The precondition holds for the status subresource too (checked on
        // the test cluster: a merge patch of status naming an older
        // resourceVersion answers 409 Conflict).
        let patch = serde_json::json!({
            "metadata": {"resourceVersion": request.resource_version()},
            "status": status,
        });
        let written = self
            .transfers
            .patch_status(
                &request.name_any(),
                &PatchParams::apply(FIELD_MANAGER).validation_strict(),
                &Patch::Merge(&patch),
            )
            .await;
        match written {
            Ok(written) => Some(written),
            Err(kube::Error::Api(status)) if status.code == 409 => {
                info!(transfer = %request.name_any(), "the transfer changed since it was read; looking again");
                None
            }
            Err(e) => {
                warn!(transfer = %request.name_any(), error = %e, "cannot write the transfer's status");
                None
            }
        }
    }

    /// Writes a final `status` over the request as it is now: a request
    /// someone answered meanwhile (the target writes `Transferred` once it
    /// leads, maybe after a release that failed here but committed) keeps
    /// its answer (issue 54). True when this write is the answer.
    async fn write_final(&self, request: &LeaseTransfer, status: &LeaseTransferStatus) -> bool {
        let mut current = request.clone();
        // A conflict is another writer's change: read it and judge once more.
        for _ in 0..3 {
            if self.write(&current, status).await.is_some() {
                return true;
            }
            current = match self.transfers.get_opt(&request.name_any()).await {
                Ok(Some(fresh)) if !phase(&fresh).is_some_and(TransferPhase::is_final) => fresh,
                Ok(_) => return false,
                Err(e) => {
                    warn!(transfer = %request.name_any(), error = %e, "cannot read the transfer");
                    return false;
                }
            };
        }
        false
    }
}

/// A pod that can take over: not being deleted, running the sidecar, all
/// containers ready.
fn judge_pod(to: &str, pod: &Pod) -> Result<(), (TransferRefusal, String)> {
    if pod.metadata.deletion_timestamp.is_some() {
        return Err((TransferRefusal::TargetTerminating, format!("pod {to} is being deleted")));
    }
    let spec = pod.spec.as_ref();
    let has_sidecar = spec.is_some_and(|s| {
        (s.containers.iter().chain(s.init_containers.iter().flatten())).any(|c| c.name == SIDECAR_CONTAINER)
    });
    if !has_sidecar {
        return Err((
            TransferRefusal::NotACandidate,
            format!("pod {to} runs no {SIDECAR_CONTAINER} sidecar container, so it never campaigns"),
        ));
    }
    if containers_ready_since(pod).is_none() {
        return Err((
            TransferRefusal::TargetNotReady,
            format!("pod {to} is not ready (ContainersReady is not True)"),
        ));
    }
    // Standing aside for a target that cannot acquire leaves the lease
    // leaderless for the whole reservation (issue 54): only one whose
    // sidecar proves it reaches the store is handed the lease.
    if !store_reachable(pod) {
        return Err((
            TransferRefusal::TargetCannotReachStore,
            format!(
                "pod {to}'s sidecar does not report reaching the store (pod condition {STORE_CONDITION} is not \
                 True), so it could not acquire the lease reserved for it"
            ),
        ));
    }
    Ok(())
}

fn phase(transfer: &LeaseTransfer) -> Option<TransferPhase> {
    transfer.status.as_ref().and_then(|s| s.phase)
}

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

fn reference(request: &LeaseTransfer) -> ObjectReference {
    let mut reference = request.object_ref(&());
    reference.field_path = None;
    reference
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use serde_json::{Value, json};
    use tokio::time::Instant;
    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::rbac;
    use leasehold_core::lease::{Elector, ElectorHandle, LeaseStore, Timing};
    use leasehold_core::store::memory::MemoryStore;
    use leasehold_testkit::api::{ApiServer, pods};

    const TRANSFERS: &str = "/apis/leasehold.dev/v1alpha1/namespaces/prod/leasetransfers";
    const LOCK: &str = "prod/web";

    fn timing() -> Timing {
        Timing::new(
            Duration::from_secs(15),
            Duration::from_secs(10),
            Duration::from_secs(2),
            0.0,
        )
        .unwrap()
    }

    /// A candidate pod of lease `web` (label app=web) running the sidecar,
    /// its containers `ready`, its sidecar reporting reaching the store
    /// when it `reaches`.
    fn candidate(name: &str, ready: bool, reaches: bool) -> Value {
        let mut pod = pods::pod(name, "prod", json!({"app": "web"}), None);
        pod["metadata"]["uid"] = json!(format!("uid-{name}"));
        pod["spec"]["initContainers"] = json!([{"name": SIDECAR_CONTAINER, "restartPolicy": "Always"}]);
        let word = |on: bool| if on { "True" } else { "False" };
        pod["status"]["conditions"] = json!([
            {"type": "ContainersReady", "status": word(ready)},
            {"type": STORE_CONDITION, "status": word(reaches)},
        ]);
        pod
    }

    /// What pod `name`'s sidecar acts on transfers with, on `api`.
    fn transfers_on(api: &ApiServer, name: &str) -> Transfers {
        let client = api.client("prod");
        let me = PodRef {
            name: name.into(),
            namespace: "prod".into(),
            uid: Some(format!("uid-{name}")),
        };
        Transfers {
            transfers: Api::namespaced(client.clone(), "prod"),
            pods: Api::namespaced(client.clone(), "prod"),
            lease: "web".into(),
            selector: "app=web".into(),
            window: timing().lease_duration,
            drain: Duration::from_secs(5),
            recorder: crate::pod::pod_recorder(client, &me).0,
            me,
        }
    }

    /// Issue 54: a final answer never replaces another. The target leads
    /// and answers `Transferred`; the old leader, whose release it took for
    /// failed (it committed), answers from the copy it read before: the
    /// precondition refuses that write, and the target's answer stays.
    #[tokio::test]
    async fn a_final_answer_over_a_stale_copy_keeps_the_answer_given_since() {
        let api = ApiServer::new(Some(rbac::allows_request));
        api.insert(
            TRANSFERS,
            json!({"apiVersion": "leasehold.dev/v1alpha1", "kind": "LeaseTransfer",
                   "metadata": {"name": "raced", "namespace": "prod", "uid": "t-1"},
                   "spec": {"lease": "web", "to": "web-1"},
                   "status": {"phase": "Transferring", "targetUid": "uid-web-1", "fromTerm": 7}}),
        );
        let (leader, target) = (transfers_on(&api, "web-0"), transfers_on(&api, "web-1"));
        let stale = leader.transfers.get("raced").await.unwrap();
        let handed = stale.status.clone().unwrap();
        let leads = LeaderState {
            leader: true,
            term: 8,
            ..LeaderState::default()
        };
        target.finish(&stale, handed.clone(), &leads).await;
        let message = "term 7: the release did not end in time".to_string();
        leader
            .fail(&stale, handed, TransferRefusal::ReleaseFailed, message)
            .await;
        let answered = leader.transfers.get("raced").await.unwrap().status.unwrap();
        assert_eq!(answered.phase, Some(TransferPhase::Transferred), "{answered:?}");
        assert_eq!(answered.term, Some(8));
        assert!(api.forbidden().is_empty(), "{:?}", api.forbidden());
    }

    /// Issue 54: an API that cannot say what the target is gives no answer
    /// (the next look judges again), never a final refusal such as
    /// `TargetNotFound` for a pod that exists.
    #[tokio::test]
    async fn a_target_the_api_cannot_read_is_judged_again_not_refused() {
        let api = ApiServer::new(Some(rbac::allows_request));
        api.insert(&pods::collection("prod"), candidate("web-1", true, true));
        let leader = transfers_on(&api, "web-0");
        let led = LeaderState {
            leader: true,
            term: 3,
            ..LeaderState::default()
        };
        api.set_down(true);
        match leader.judge("web-1", &led).await {
            Err(Judged::Unread(why)) => assert!(why.contains("reading pod web-1"), "{why}"),
            Err(Judged::Refused(refusal, message)) => panic!("refused for an API fault: {refusal:?}: {message}"),
            Ok(_) => panic!("judged while the API was down"),
        }
        api.set_down(false);
        assert!(leader.judge("web-1", &led).await.is_ok(), "judged once the API answers");
    }

    /// Pods web-0 (which leads), web-1 and web-2, each with its elector and
    /// its transfer watch, on the API server model (RBAC-checked against
    /// the sidecar's Role) and one memory store.
    struct Lease {
        api: ApiServer,
        store: MemoryStore,
        electors: Vec<(String, ElectorHandle)>,
        /// Every (time, pod, leader) change of every elector.
        claims: Arc<Mutex<Vec<(Instant, usize, bool)>>>,
    }

    impl Lease {
        async fn start(ready_target: bool) -> Lease {
            let api = ApiServer::new(Some(rbac::allows_request));
            for (name, ready) in [("web-0", true), ("web-1", ready_target), ("web-2", true)] {
                api.insert(&pods::collection("prod"), candidate(name, ready, true));
            }
            // Ready, but its sidecar cannot reach the store: no elector.
            api.insert(&pods::collection("prod"), candidate("web-3", true, false));
            let mut db = pods::pod("db-0", "prod", json!({"app": "db"}), None);
            db["metadata"]["uid"] = json!("uid-db-0");
            api.insert(&pods::collection("prod"), db);
            let store = MemoryStore::new(1);
            let shutdown = CancellationToken::new();
            let claims = Arc::new(Mutex::new(Vec::new()));
            let mut lease = Lease {
                api,
                store,
                electors: Vec::new(),
                claims,
            };
            for (index, name) in ["web-0", "web-1", "web-2"].into_iter().enumerate() {
                let uid = format!("uid-{name}");
                let identity = Identity::new(None, Some("prod".into()), name).in_pod(&uid).unwrap();
                let handle = Elector::new(LOCK, identity, timing())
                    .with_seed(index as u64)
                    .spawn(Arc::new(lease.store.clone()), shutdown.clone());
                if index == 0 {
                    handle.subscribe().wait_for(|s| s.leader).await.unwrap();
                }
                let transfers = lease.transfers_of(name);
                tokio::spawn(transfers.follow(handle.control(), handle.subscribe(), handle.transitions()));
                let (mut state, claims) = (handle.subscribe(), lease.claims.clone());
                tokio::spawn(async move {
                    loop {
                        let leader = state.borrow_and_update().leader;
                        claims.lock().unwrap().push((Instant::now(), index, leader));
                        if state.changed().await.is_err() {
                            return;
                        }
                    }
                });
                lease.electors.push((name.to_string(), handle));
            }
            // web-2 hears first that web-0 stopped claiming (its label
            // watch would nudge it) and races the target for the lease.
            let (mut first, eager) = (lease.electors[0].1.subscribe(), lease.electors[2].1.control());
            tokio::spawn(async move {
                if first.wait_for(|s| !s.leader).await.is_ok() {
                    eager.nudge();
                }
            });
            lease
        }

        /// What pod `name`'s sidecar acts on transfers with.
        fn transfers_of(&self, name: &str) -> Transfers {
            transfers_on(&self.api, name)
        }

        fn request(&self, name: &str, to: &str) {
            self.api.insert(
                TRANSFERS,
                json!({"apiVersion": "leasehold.dev/v1alpha1", "kind": "LeaseTransfer",
                    "metadata": {"name": name, "namespace": "prod", "creationTimestamp": "2026-11-26T10:00:00Z"},
                    "spec": {"lease": "web", "to": to}}),
            );
        }

        /// The request's status once final, within a bound of a few leases.
        async fn answer(&self, name: &str) -> LeaseTransferStatus {
            let api: Api<LeaseTransfer> = Api::namespaced(self.api.client("prod"), "prod");
            let done = |t: Option<&LeaseTransfer>| {
                t.and_then(|t| t.status.as_ref())
                    .and_then(|s| s.phase)
                    .is_some_and(TransferPhase::is_final)
            };
            let waited = tokio::time::timeout(
                timing().lease_duration * 4,
                kube::runtime::wait::await_condition(api, name, done),
            );
            let transfer = waited.await.expect("answered within 4 leases").unwrap().unwrap();
            transfer.status.unwrap()
        }

        /// At no instant did two electors claim.
        fn assert_one_claimant_at_a_time(&self) {
            let mut claims = self.claims.lock().unwrap().clone();
            claims.sort_by_key(|(at, _, _)| *at);
            let mut leading = [false; 3];
            for (at, index, leader) in claims {
                leading[index] = leader;
                let count = leading.iter().filter(|l| **l).count();
                assert!(count <= 1, "{count} claimants at {at:?}: {leading:?}");
            }
        }
    }

    /// The leader hands over to the named ready candidate: the target leads
    /// a later term with a higher token, nobody else acquired, and never
    /// did two claim at once; the status says Transferred with the target's UID.
    #[tokio::test(start_paused = true)]
    async fn the_leader_hands_over_to_a_ready_candidate() {
        let lease = Lease::start(true).await;
        let before = lease.store.observe(LOCK).await.unwrap().record.unwrap();
        lease.request("move", "web-1");
        let status = lease.answer("move").await;
        assert_eq!(status.phase, Some(TransferPhase::Transferred), "{status:?}");
        assert_eq!(status.target_uid.as_deref(), Some("uid-web-1"));
        assert_eq!(status.from_term, Some(before.term));
        let after = lease.store.observe(LOCK).await.unwrap().record.unwrap();
        assert_eq!(
            after.holder.as_deref().and_then(Identity::pod_uid_of).as_deref(),
            Some("uid-web-1")
        );
        assert!(
            after.term > before.term && after.token > before.token,
            "{after:?} after {before:?}"
        );
        assert_eq!(status.term, Some(after.term));
        let holders: Vec<_> = lease.store.acquisitions().into_iter().map(|a| a.holder).collect();
        assert_eq!(holders.len(), 2, "one acquisition after the first: {holders:?}");
        lease.assert_one_claimant_at_a_time();
        // Nothing more happens: the old leader campaigns again as a follower.
        tokio::time::sleep(timing().lease_duration * 2).await;
        assert!(lease.electors[1].1.state().leader);
        assert!(lease.electors[0].1.state().campaigning);
        assert_eq!(lease.store.acquisitions().len(), 2);
    }

    /// A leader whose watch still shows a request open that has been
    /// answered (its own answer of a moment ago, not yet delivered) judges
    /// it as the API server has it now: the answer stays, nothing is written.
    #[tokio::test(start_paused = true)]
    async fn a_stale_copy_of_an_answered_request_is_not_answered_again() {
        let lease = Lease::start(true).await;
        lease.request("gone", "web-9");
        let stale: LeaseTransfer =
            leasehold_kubernetes::api::client::object_from_value(&lease.api.get(TRANSFERS, "gone").unwrap()).unwrap();
        let answered = lease.answer("gone").await;
        assert_eq!(answered.reason.as_deref(), Some("TargetNotFound"), "{answered:?}");
        let mut object = lease.api.get(TRANSFERS, "gone").unwrap();
        object["status"]["reason"] = json!("TargetDidNotAcquire");
        lease.api.insert(TRANSFERS, object);
        let writes = || {
            let requests = lease.api.requests().into_iter();
            requests
                .filter(|r| r.method == "PATCH" && r.path().ends_with("/gone/status"))
                .count()
        };
        let before = writes();
        let web_0 = &lease.electors[0].1;
        let (control, mut state, transitions) = (web_0.control(), web_0.subscribe(), web_0.transitions());
        lease
            .transfers_of("web-0")
            .act_on(&stale, &control, &mut state, &transitions)
            .await;
        assert_eq!(writes(), before, "no answer written over the answer");
        let api: Api<LeaseTransfer> = Api::namespaced(lease.api.client("prod"), "prod");
        let kept = api.get("gone").await.unwrap().status.unwrap();
        assert_eq!(kept.reason.as_deref(), Some("TargetDidNotAcquire"), "{kept:?}");
    }

    /// A request an earlier term's leader left `Transferring` to another
    /// pod is over once someone else leads: the leader now answers
    /// TargetDidNotAcquire and hands over no second time (a target that is
    /// ready but cannot acquire would pass leadership round).
    #[tokio::test(start_paused = true)]
    async fn a_request_left_transferring_by_an_earlier_term_is_answered_not_handed_over_again() {
        let lease = Lease::start(true).await;
        lease.request("move", "web-1");
        assert_eq!(lease.answer("move").await.phase, Some(TransferPhase::Transferred));
        let term = lease.electors[1].1.state().term;
        let mut left = json!({"apiVersion": "leasehold.dev/v1alpha1", "kind": "LeaseTransfer",
            "metadata": {"name": "left", "namespace": "prod", "creationTimestamp": "2026-11-26T10:01:00Z"},
            "spec": {"lease": "web", "to": "web-2"}});
        left["status"] = json!({"phase": "Transferring", "reason": "StandingAside", "targetUid": "uid-web-2",
                                "fromTerm": term - 1});
        lease.api.insert(TRANSFERS, left);
        let status = lease.answer("left").await;
        assert_eq!(status.phase, Some(TransferPhase::TransferFailed), "{status:?}");
        assert_eq!(status.reason.as_deref(), Some("TargetDidNotAcquire"), "{status:?}");
        tokio::time::sleep(timing().lease_duration * 2).await;
        let state = lease.electors[1].1.state();
        assert!(
            state.leader && state.term == term,
            "web-1 still leads its term: {state:?}"
        );
        assert_eq!(lease.store.acquisitions().len(), 2, "no second handover");
    }

    /// Each refusal: TransferFailed with its reason, an Event, and the
    /// leader keeps leading its term.
    #[tokio::test(start_paused = true)]
    async fn refusals_name_their_reason_and_leadership_stays() {
        let lease = Lease::start(false).await;
        let term = lease.electors[0].1.state().term;
        for (name, to, reason) in [
            ("unready", "web-1", "TargetNotReady"),
            ("cut-off", "web-3", "TargetCannotReachStore"),
            ("elsewhere", "db-0", "NotACandidate"),
            ("self", "web-0", "AlreadyLeads"),
            ("missing", "web-9", "TargetNotFound"),
        ] {
            lease.request(name, to);
            let status = lease.answer(name).await;
            assert_eq!(status.phase, Some(TransferPhase::TransferFailed), "{name}: {status:?}");
            assert_eq!(status.reason.as_deref(), Some(reason), "{name}: {status:?}");
            assert!(
                status.message.as_deref().is_some_and(|m| m.contains(to)),
                "{name}: {status:?}"
            );
        }
        let events: Vec<_> = lease
            .api
            .requests()
            .into_iter()
            .filter(|r| r.method == "POST" && r.path().ends_with("/events"))
            .collect();
        assert_eq!(events.len(), 5, "one Event per refusal: {events:?}");
        let state = lease.electors[0].1.state();
        assert!(state.leader && state.term == term, "{state:?}");
        assert_eq!(lease.store.acquisitions().len(), 1);
        assert!(lease.api.forbidden().is_empty(), "{:?}", lease.api.forbidden());
    }
}
