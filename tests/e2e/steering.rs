//! Steering leadership on the real cluster (issue 35), each with the
//! leadership watcher on: `leasehold transfer` to a named pod, refused, and
//! with its target deleted mid-flight; a higher-priority pod joining (and an
//! equal one that does not move leadership); a zone preference once the
//! node carries a zone; a preferred pod cut off from the store, never
//! offered leadership until it reaches the store again (issue 54); and
//! `status.history` across an operator downtime.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use leasehold::api::DistributedLease;
use leasehold::api::contract::{STORE_CONDITION, containers_ready_since};
use leasehold::api::history::{HistoryEntry, TermEnd};
use leasehold::api::preference::{PRIORITY_KEY, ZONE_LABEL};
use leasehold::api::transfer::{LeaseTransfer, TransferOrigin, TransferPhase};
use serde_json::{Value, json};

use crate::e2e::cluster::{Env, POLL, Scenario, scenario, wait_for};
use crate::e2e::faults::{converges, converges_past, lease_timing, token};
use crate::e2e::fixtures::{
    APP, FIRST_LEADER, LEASE, SUCCESSOR, a_follower, delete_now, leader_only_service, transfer,
};
use crate::e2e::node::Partition;
use crate::e2e::watcher::{Claim, LeadershipWatcher};

/// The operator writes what it reads into the status: a reconcile follows
/// each change of the lease or its pods (and requeues within P).
const STATUS_WITHIN: Duration = Duration::from_secs(60);
/// The stabilisation period of the preference scenarios: short, so a move
/// is quick, and above P (2 s) as validation requires.
const STABILIZATION: Duration = Duration::from_secs(5);
/// How long a preferred candidate stays cut off from the store after it
/// outranks the leader: many stabilization periods, so a transfer the
/// operator should not ask for would be asked for (and answered) within it.
const CUT_OFF_WINDOW: Duration = Duration::from_secs(60);
/// Generous: beyond the stabilization period, the operator's next look
/// (within P), the leader's drain and the target's acquire.
const HANDOVER_WITHIN: Duration = Duration::from_secs(60);

/// The LeaseTransfer the command said it created (`leasetransfer/NAME created: ...`).
async fn created_request(s: &Scenario, stdout: &str) -> LeaseTransfer {
    let name = stdout
        .lines()
        .find_map(|line| line.strip_prefix("leasetransfer/")?.split_once(" created"))
        .map(|(name, _)| name.to_string())
        .unwrap_or_else(|| panic!("leasehold transfer names the request it created: {stdout:?}"));
    s.api::<LeaseTransfer>()
        .get(&name)
        .await
        .unwrap_or_else(|e| panic!("LeaseTransfer {name}: {e}"))
}

/// Waits until `pod`'s containers are ready (a transfer's target must be).
async fn containers_ready(s: &Scenario, pod: &str) {
    let pods = s.api::<Pod>();
    wait_for(&format!("{pod}'s containers ready"), FIRST_LEADER, || async {
        let pod = pods.get(pod).await.ok()?;
        containers_ready_since(&pod).map(|_| ())
    })
    .await;
}

/// `leasehold status --history LEASE -o json`: the lease's history as a user reads it.
fn history(s: &Scenario) -> Vec<HistoryEntry> {
    let out = s
        .env
        .leasehold()
        .args(["status", "-n", &s.ns, "--history", LEASE, "-o", "json"])
        .output()
        .expect("running leasehold status --history");
    assert!(
        out.status.success(),
        "leasehold status --history: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("leasehold status --history -o json prints the entries")
}

/// Waits until the history holds an entry for `term` that `done` accepts.
async fn history_entry(s: &Scenario, term: u64, what: &str, done: impl Fn(&HistoryEntry) -> bool) -> Vec<HistoryEntry> {
    wait_for(
        &format!("status.history: term {term} {what}"),
        STATUS_WITHIN,
        || async {
            let history = history(s);
            history
                .iter()
                .any(|e| e.term == term && !e.is_gap() && done(e))
                .then_some(history)
        },
    )
    .await
}

/// The example's candidate pod template as a bare pod named `name`, with
/// `labels` added: a candidate that joins beside the Deployment's (no
/// `pod-template-hash`, so its ReplicaSet does not adopt it).
fn candidate_pod(s: &Scenario, name: &str, labels: Value) -> Value {
    let deployment = s
        .example("leader-only-service.yaml")
        .into_iter()
        .find(|o| o["kind"] == "Deployment")
        .expect("the example's Deployment");
    let template = &deployment["spec"]["template"];
    let mut metadata = template["metadata"].clone();
    metadata["name"] = json!(name);
    let all = metadata["labels"].as_object_mut().expect("the template's labels");
    all.extend(labels.as_object().cloned().unwrap_or_default());
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": template["spec"]})
}

/// The LeaseTransfers of the scenario's lease.
async fn requests(s: &Scenario) -> Vec<LeaseTransfer> {
    let list = s.api::<LeaseTransfer>().list(&ListParams::default()).await;
    let list = list.expect("listing LeaseTransfers");
    list.items.into_iter().filter(|t| t.spec.lease == LEASE).collect()
}

/// A pod's UID.
async fn uid_of(s: &Scenario, pod: &str) -> String {
    let pod_object = s
        .api::<Pod>()
        .get(pod)
        .await
        .unwrap_or_else(|e| panic!("pod {pod}: {e}"));
    pod_object.metadata.uid.expect("a pod has a UID")
}

/// Item 1: the leader hands over to the named follower; the command's
/// `--wait` exits 0, leadership moves once, to it, with the next term and a
/// higher token, the request says Transferred and the history records the
/// old term as transferred (the release wrote it in the store).
#[tokio::test]
async fn a_transfer_to_a_named_pod_moves_leadership_once_to_it() {
    scenario("e2e-transfer", |s| async move {
        let (_store, watcher) = leader_only_service(&s, json!({})).await;
        let (leader, was) = converges(&s, &watcher, None, FIRST_LEADER).await;
        let target = a_follower(&s, &leader).await;
        containers_ready(&s, &target).await;
        let moves = watcher.moves();

        let (code, out, err) = transfer(&s, &target).await;
        assert_eq!(
            code, 0,
            "leasehold transfer --wait exits 0 once the target leads: {out}{err}"
        );
        let (now, is) = converges_past(&s, &watcher, Some(&leader), Some(&was), SUCCESSOR).await;
        assert_eq!(now, target, "the named pod leads");
        assert_eq!(is.term, was.term + 1, "the next term: {was:?} then {is:?}");
        assert!(token(&is) > token(&was), "a higher token: {was:?} then {is:?}");

        let request = created_request(&s, &out).await;
        let status = request.status.clone().expect("the leader answered");
        assert_eq!(status.phase, Some(TransferPhase::Transferred), "{status:?}");
        assert_eq!(status.reason.as_deref(), Some("TargetLeads"), "{status:?}");
        assert_eq!(status.target_uid, Some(uid_of(&s, &target).await), "reserved by UID");
        assert_eq!(status.from_holder.as_deref(), Some(was.holder.as_str()));
        assert_eq!((status.from_term, status.term), (Some(was.term), Some(is.term)));
        assert_eq!(request.spec.origin, Some(TransferOrigin::Manual));

        let history = history_entry(&s, was.term, "ended", |e| e.ended.is_some()).await;
        let ended = history.iter().find(|e| e.term == was.term).expect("the entry");
        assert_eq!(ended.ended, Some(TermEnd::Transferred), "{history:?}");
        assert_eq!(ended.holder.as_deref(), Some(was.holder.as_str()), "{history:?}");
        assert_eq!(watcher.moves() - moves, 1, "leadership moved exactly once");
        watcher.finish();
    })
    .await;
}

/// Item 2: a transfer to a pod that is not a candidate (no sidecar), to a
/// pod that does not exist and to the leader itself: each exits 1 with one
/// line naming the reason and the pod, the request says TransferFailed
/// with that reason (and a Warning Event), and leadership never moves: the
/// same term throughout and the leader Service never without its endpoint.
#[tokio::test]
async fn a_refused_transfer_names_its_reason_and_leadership_stays() {
    scenario("e2e-transfer-refused", |s| async move {
        let (_store, watcher) = leader_only_service(&s, json!({})).await;
        let (leader, was) = converges(&s, &watcher, None, FIRST_LEADER).await;
        // Selected by the lease (app=scheduler) but without the lease
        // annotation, so the webhook adds no sidecar: it never campaigns.
        let mut plain = candidate_pod(&s, "plain", json!({}));
        plain["metadata"]
            .as_object_mut()
            .expect("metadata")
            .remove("annotations");
        s.apply(vec![plain]).await;
        containers_ready(&s, "plain").await;
        let (moves, since) = (watcher.moves(), Instant::now());

        for (to, reason) in [
            ("plain", "NotACandidate"),
            ("nobody", "TargetNotFound"),
            (leader.as_str(), "AlreadyLeads"),
        ] {
            let (code, out, err) = transfer(&s, to).await;
            assert_eq!(code, 1, "to {to}: exit 1 when refused: {out}{err}");
            let lines: Vec<&str> = err.lines().collect();
            assert!(
                matches!(lines.as_slice(), [line] if line.starts_with(&format!("transfer failed: {reason}: ")) && line.contains(to)),
                "to {to}: one line naming {reason} and the pod: {err:?}"
            );
            let request = created_request(&s, &out).await;
            let status = request.status.clone().expect("the leader answered");
            assert_eq!(status.phase, Some(TransferPhase::TransferFailed), "to {to}: {status:?}");
            assert_eq!(status.reason.as_deref(), Some(reason), "to {to}: {status:?}");
            let name = kube::ResourceExt::name_any(&request);
            let events = s.api::<Event>();
            wait_for(&format!("a Warning Event {reason} on {name}"), STATUS_WITHIN, || async {
                let list = events.list(&ListParams::default()).await.ok()?;
                list.items
                    .iter()
                    .any(|e| {
                        e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name.as_str())
                            && e.reason.as_deref() == Some(reason)
                            && e.type_.as_deref() == Some("Warning")
                    })
                    .then_some(())
            })
            .await;
        }

        let now = watcher.one_leader(None, SUCCESSOR).await;
        assert_eq!(now, leader, "the leader stays");
        let claim = watcher.claim_of(&leader).expect("the leader's claim");
        assert_eq!((claim.term, &claim.token), (was.term, &was.token), "the same term throughout");
        assert_eq!(watcher.moves(), moves, "leadership never moved");
        let idle = watcher.leaderless_between(since, Instant::now());
        assert_eq!(idle, Duration::ZERO, "the leader Service lost its endpoint for {idle:?}");
        watcher.finish();
    })
    .await;
}

/// Item 3: the target is deleted at once while the transfer is in flight
/// (the leader accepted it and drains). What docs/design.md ("The target
/// dies mid-transfer") and docs/transfer.md promise: nobody acquires until
/// the reservation's window (D after the release) ends, then anyone may;
/// the request ends TransferFailed (`TargetDidNotAcquire`). Asserted: that
/// reason (exit 1), one leader again that is not the deleted pod, with a
/// later term and a higher token, and its first claim at least D after the
/// old leader's last certain claim (the release came after that).
#[tokio::test]
async fn a_transfer_whose_target_is_deleted_fails_and_the_reservation_lapses() {
    scenario("e2e-transfer-target-gone", |s| async move {
        let (_store, watcher) = leader_only_service(&s, json!({})).await;
        let (leader, was) = converges(&s, &watcher, None, FIRST_LEADER).await;
        let target = a_follower(&s, &leader).await;
        containers_ready(&s, &target).await;

        let delete_when_accepted = async {
            wait_for(
                "the leader accepting the transfer (Transferring)",
                SUCCESSOR,
                || async {
                    let open = requests(&s).await;
                    open.iter()
                        .any(|t| t.status.as_ref().and_then(|st| st.phase) == Some(TransferPhase::Transferring))
                        .then_some(())
                },
            )
            .await;
            delete_now(&s, &target).await;
        };
        let ((code, out, err), ()) = tokio::join!(transfer(&s, &target), delete_when_accepted);
        assert_eq!(code, 1, "the transfer failed: {out}{err}");
        assert!(
            err.starts_with("transfer failed: TargetDidNotAcquire: "),
            "the reservation lapsed: {err:?}"
        );
        let request = created_request(&s, &out).await;
        let status = request.status.clone().expect("the leader answered");
        assert_eq!(status.phase, Some(TransferPhase::TransferFailed), "{status:?}");
        assert_eq!(status.from_term, Some(was.term), "{status:?}");

        let (now, is) = converges_past(&s, &watcher, None, Some(&was), SUCCESSOR).await;
        assert_ne!(now, target, "the deleted target never leads");
        assert!(is.term > was.term && token(&is) > token(&was), "{was:?} then {is:?}");
        assert!(
            !watcher.claimants().contains(&target),
            "the deleted target never claimed: {:?}",
            watcher.claimants()
        );
        // Whoever leads next (the old leader too) answers the request no
        // more: it keeps the reason the handover ended with.
        let request = s
            .api::<LeaseTransfer>()
            .get(&kube::ResourceExt::name_any(&request))
            .await;
        let status = request.expect("the request").status.expect("its status");
        assert_eq!(status.reason.as_deref(), Some("TargetDidNotAcquire"), "{status:?}");
        // The store refuses everyone but the target until the release + D
        // on its clock; the release came after the old leader's last
        // certain claim, the acquire before the new leader's first. The
        // store (PostgreSQL) and the watcher share this machine's clock:
        // the margin covers its rate (slewing) only.
        let (duration, _, _) = lease_timing(&s).await;
        let (_, stopped) = watcher.claim_span(&leader, &was.token).expect("the old leader's claim");
        let (claimed, _) = watcher.claim_span(&now, &is.token).expect("the new leader's claim");
        let waited = claimed.saturating_duration_since(stopped);
        assert!(
            waited + Duration::from_millis(50) >= duration,
            "{now} claimed {waited:?} after the old leader last claimed: inside the reservation's window ({duration:?})"
        );
        eprintln!("target deleted mid-transfer: {now} led {waited:?} after the old leader stopped (D {duration:?})");
        watcher.finish();
    })
    .await;
}

/// The preference scenarios' lease: the example's, stabilising for
/// [`STABILIZATION`], with `spec` merged over it.
fn preferring(spec: Value) -> Value {
    let mut lease = json!({"preferenceStabilization": format!("{}s", STABILIZATION.as_secs())});
    if let (Some(target), Some(extra)) = (lease.as_object_mut(), spec.as_object()) {
        target.extend(extra.clone());
    }
    lease
}

/// Waits until `pod` leads by a transfer the operator asked for (origin
/// Preference, Transferred), the one open or finished request of the
/// lease; returns it.
async fn moved_by_preference(s: &Scenario, watcher: &LeadershipWatcher, old: &str, pod: &str) -> LeaseTransfer {
    let now = watcher.one_leader(Some(old), SUCCESSOR + STABILIZATION).await;
    assert_eq!(now, pod, "leadership moved to the preferred candidate");
    let done = wait_for("the operator's transfer Transferred", STATUS_WITHIN, || async {
        let all = requests(s).await;
        let [request] = all.as_slice() else {
            panic!("one transfer, the operator's: {all:?}")
        };
        let phase = request.status.as_ref().and_then(|st| st.phase);
        (phase == Some(TransferPhase::Transferred)).then(|| request.clone())
    })
    .await;
    assert_eq!(done.spec.origin, Some(TransferOrigin::Preference), "{done:?}");
    assert_eq!(done.spec.to, pod, "{done:?}");
    done
}

/// Item 4: a candidate with a higher `leasehold.dev/priority` joins:
/// leadership moves to it once, by the operator's transfer (origin
/// Preference), and the old term ends `Preempted`; then a candidate of the
/// same priority joins, and over a whole stabilisation period plus two P
/// after it is ready (the operator looks again within P) no transfer is
/// asked for and leadership stays: equal ranks never move it.
#[tokio::test]
async fn a_higher_priority_pod_joining_takes_over_once_and_an_equal_one_does_not() {
    scenario("e2e-prefer-priority", |s| async move {
        let (_store, watcher) = leader_only_service(&s, preferring(json!({}))).await;
        let (leader, was) = converges(&s, &watcher, None, FIRST_LEADER).await;
        let moves = watcher.moves();

        s.apply(vec![candidate_pod(&s, "senior", json!({PRIORITY_KEY: "10"}))])
            .await;
        moved_by_preference(&s, &watcher, &leader, "senior").await;
        let (_, is) = converges_past(&s, &watcher, None, Some(&was), SUCCESSOR).await;
        assert_eq!(is.term, was.term + 1, "{was:?} then {is:?}");
        assert_eq!(watcher.moves() - moves, 1, "leadership moved exactly once");
        let history = history_entry(&s, was.term, "ended", |e| e.ended.is_some()).await;
        let ended = history.iter().find(|e| e.term == was.term).expect("the entry");
        assert_eq!(ended.ended, Some(TermEnd::Preempted), "{history:?}");

        s.apply(vec![candidate_pod(&s, "peer", json!({PRIORITY_KEY: "10"}))])
            .await;
        containers_ready(&s, "peer").await;
        let (_, _, retry) = lease_timing(&s).await;
        let window = STABILIZATION + 2 * retry;
        let until = Instant::now() + window;
        while Instant::now() < until {
            let all = requests(&s).await;
            assert_eq!(all.len(), 1, "no transfer to an equal-rank candidate: {all:?}");
            tokio::time::sleep(POLL).await;
        }
        assert_eq!(watcher.one_leader(None, SUCCESSOR).await, "senior");
        let claim = watcher.claim_of("senior").expect("senior's claim");
        assert_eq!(claim.term, is.term, "the same term over {window:?}");
        assert_eq!(watcher.moves() - moves, 1, "no move to an equal rank");
        watcher.finish();
    })
    .await;
}

/// The zone label on a node until [`remove`](Self::remove) or, when the
/// test fails first, until dropped: every scenario shares the one node.
struct ZoneOnNode {
    env: Env,
    node: String,
    removed: bool,
}

impl ZoneOnNode {
    fn set(env: &Env, node: &str, zone: &str) -> ZoneOnNode {
        env.kubectl_ok(&["label", "node", node, &format!("{ZONE_LABEL}={zone}"), "--overwrite"]);
        ZoneOnNode {
            env: env.clone(),
            node: node.to_string(),
            removed: false,
        }
    }

    fn remove(mut self) {
        self.removed = true;
        self.env
            .kubectl_ok(&["label", "node", &self.node, &format!("{ZONE_LABEL}-")]);
    }
}

impl Drop for ZoneOnNode {
    fn drop(&mut self) {
        if !self.removed {
            let removed = self
                .env
                .kubectl()
                .args(["label", "node", &self.node, &format!("{ZONE_LABEL}-")])
                .status();
            eprintln!(
                "the zone label taken off node {} after a failure: {removed:?}",
                self.node
            );
        }
    }
}

/// Item 5: `preferZones: [zone-a]`; the candidates start on a node without
/// a zone (none ranks above another), then the node is labelled zone-a and
/// one more candidate starts: the API server copies the zone onto it at
/// binding (the PodTopologyLabels admission plugin, KEP-4742, beta and on
/// by default since Kubernetes 1.35: kubernetes
/// plugin/pkg/admission/podtopologylabels copies the node's
/// topology.kubernetes.io/{zone,region} labels onto the pod through its
/// `pods/binding` request), it outranks the leader, and leadership moves to
/// it by the operator's transfer. The pods bound earlier keep no zone (the
/// plugin acts at binding only).
#[tokio::test]
async fn a_candidate_in_a_preferred_zone_takes_over() {
    scenario("e2e-prefer-zone", |s| async move {
        let (_store, watcher) = leader_only_service(&s, preferring(json!({"preferZones": ["zone-a"]}))).await;
        let (leader, was) = converges(&s, &watcher, None, FIRST_LEADER).await;
        let pods = s.api::<Pod>();
        let leader_pod = pods.get(&leader).await.expect("the leader's pod");
        let node = leader_pod
            .spec
            .and_then(|spec| spec.node_name)
            .expect("the leader is bound");
        let moves = watcher.moves();

        let zone = ZoneOnNode::set(&s.env, &node, "zone-a");
        s.apply(vec![candidate_pod(&s, "zoned", json!({}))]).await;
        let zoned = wait_for("the new candidate bound", FIRST_LEADER, || async {
            let pod = pods.get("zoned").await.ok()?;
            pod.spec.as_ref()?.node_name.as_ref()?;
            Some(pod)
        })
        .await;
        let zone_of = |pod: &Pod| leasehold::api::preference::zone_of(kube::ResourceExt::labels(pod)).map(String::from);
        assert_eq!(
            zone_of(&zoned).as_deref(),
            Some("zone-a"),
            "the API server copied the node's zone onto the pod at binding (PodTopologyLabels)"
        );
        let earlier = pods.get(&leader).await.expect("the leader's pod");
        assert_eq!(zone_of(&earlier), None, "a pod bound before keeps no zone");

        moved_by_preference(&s, &watcher, &leader, "zoned").await;
        let (_, is) = converges_past(&s, &watcher, None, Some(&was), SUCCESSOR).await;
        assert_eq!(is.term, was.term + 1, "{was:?} then {is:?}");
        assert_eq!(watcher.moves() - moves, 1, "leadership moved exactly once");
        zone.remove();
        let labels = s.env.kubectl_ok(&["get", "node", &node, "--show-labels"]);
        assert!(!labels.contains(ZONE_LABEL), "the node's zone label removed: {labels}");
        watcher.finish();
    })
    .await;
}

/// `pod`'s [`STORE_CONDITION`] as (status, reason, message), if it shows one.
async fn store_condition(s: &Scenario, pod: &str) -> Option<(String, String, String)> {
    let pod = s.api::<Pod>().get(pod).await.ok()?;
    let conditions = pod.status?.conditions?;
    let found = conditions.into_iter().find(|c| c.type_ == STORE_CONDITION)?;
    Some((
        found.status,
        found.reason.unwrap_or_default(),
        found.message.unwrap_or_default(),
    ))
}

/// Waits until `pod` shows [`STORE_CONDITION`] with `status` and returns
/// how long that took; fails naming what the pod showed last.
async fn store_condition_becomes(s: &Scenario, pod: &str, status: &str, within: Duration) -> Duration {
    let started = Instant::now();
    loop {
        let seen = store_condition(s, pod).await;
        if seen.as_ref().is_some_and(|(shown, _, _)| shown == status) {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < within,
            "{pod} showing {STORE_CONDITION}={status}: not within {within:?}; it showed {seen:?} \
             (status, reason, message) last"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Issue 54's defect 2, on the real cluster: a follower cut off from the
/// PostgreSQL server (iptables in its network namespace) keeps its
/// containers Ready, but its sidecar's store calls fail and it shows
/// `leasehold.dev/store-reachable=False`. Labelled `leasehold.dev/priority=10`
/// it outranks the leader; before the fix the operator offered it
/// leadership and the lease sat reserved for it, leaderless, transfer
/// after transfer. Asserted over 60 s after the label: the operator asks
/// for no transfer to it (or, if it does, each ends TransferFailed with
/// `TargetCannotReachStore`); once a second the original leader is the one
/// labelled leader, the leader Service's one endpoint, the only claimant on
/// `/leader` with the same term, and the lease's status names it; and its
/// claim of that term spans the whole window (one continuous holding, so
/// it never stood aside) with no moment without the leader endpoint. Then
/// the cut is healed: the condition turns True and, within the
/// stabilization period plus a generous bound, leadership moves to it
/// once, by one operator transfer (origin Preference, Transferred), the
/// next term with a higher token. Prints how long the condition took to
/// turn False and True and the handover took, for the record.
#[tokio::test]
async fn a_preferred_pod_cut_off_from_the_store_is_not_offered_leadership_until_it_reaches_it() {
    scenario("e2e-prefer-cut-off", |s| async move {
        let (store, watcher) = leader_only_service(&s, preferring(json!({}))).await;
        let (leader, was) = converges(&s, &watcher, None, FIRST_LEADER).await;
        let target = a_follower(&s, &leader).await;
        containers_ready(&s, &target).await;
        // Bounded: a fresh follower's first store call answers within P.
        store_condition_becomes(&s, &target, "True", STATUS_WITHIN).await;
        let (moves, claimants) = (watcher.moves(), watcher.claimants());

        let partition = Partition::start(&s, &target, (s.env.host_ip, store.port).into()).await;
        // The follower's next attempt (within P) runs into the call timeout.
        let to_false = store_condition_becomes(&s, &target, "False", SUCCESSOR).await;
        println!("{target} cut off from PostgreSQL: {STORE_CONDITION}=False {to_false:?} after the cut");

        let label = json!({"metadata": {"labels": {PRIORITY_KEY: "10"}}});
        s.api::<Pod>()
            .patch(&target, &PatchParams::default(), &Patch::Merge(&label))
            .await
            .unwrap_or_else(|e| panic!("labelling {target} {PRIORITY_KEY}=10: {e}"));
        let leases = s.api::<DistributedLease>();
        let window_start = Instant::now();
        let mut second = 0;
        while window_start.elapsed() < CUT_OFF_WINDOW {
            let at = window_start.elapsed();
            assert_eq!(
                watcher.leaders(),
                std::slice::from_ref(&leader),
                "{at:?} after the label: the one leader label"
            );
            assert_eq!(
                watcher.ready_endpoints(),
                std::slice::from_ref(&leader),
                "{at:?} after the label: the leader Service's one endpoint"
            );
            let claim = watcher.claim_of(&leader);
            assert!(
                claim
                    .as_ref()
                    .is_some_and(|c| (c.term, &c.token) == (was.term, &was.token)),
                "{at:?} after the label: {leader} claims term {} on /leader, it said {claim:?}",
                was.term
            );
            let pods = s.pods(APP).await;
            for pod in pods.iter().filter_map(|p| p.metadata.name.as_deref()) {
                if pod != leader {
                    let claim = watcher.claim_of(pod);
                    assert!(claim.is_none(), "{at:?} after the label: {pod} claims too: {claim:?}");
                }
            }
            let status = leases.get(LEASE).await.ok().and_then(|l| l.status);
            let named = status.as_ref().map(|st| (st.holder.as_deref(), st.term));
            assert_eq!(
                named,
                Some((Some(was.holder.as_str()), Some(was.term))),
                "{at:?} after the label: the lease's status names the leader's term"
            );
            second += 1;
            tokio::time::sleep(Duration::from_secs(1).saturating_sub(window_start.elapsed() - at)).await;
        }
        let window_end = Instant::now();
        // One token is one continuous holding: a claim read after the
        // window with the term's token means it was held throughout.
        let (from, _) = wait_for(
            "the leader's claim of its term read after the window",
            SUCCESSOR,
            || async {
                watcher
                    .claim_span(&leader, &was.token)
                    .filter(|(_, to)| *to >= window_end)
            },
        )
        .await;
        assert!(
            from <= window_start,
            "{leader}'s claim of term {} began before the window",
            was.term
        );
        let idle = watcher.leaderless_between(window_start, window_end);
        assert_eq!(
            idle,
            Duration::ZERO,
            "the leader Service lost its endpoint for {idle:?}"
        );
        assert_eq!(
            watcher.moves(),
            moves,
            "leadership never moved while {target} was cut off"
        );
        assert_eq!(
            watcher.claimants(),
            claimants,
            "no other pod claimed while {target} was cut off"
        );

        // Any transfer the operator asked for meanwhile was refused by the
        // leader before it stood aside (its claim above says it never did).
        let refused = wait_for("every transfer of the window answered", STATUS_WITHIN, || async {
            let all = requests(&s).await;
            let phase = |t: &LeaseTransfer| t.status.as_ref().and_then(|st| st.phase);
            let answered = |t: &LeaseTransfer| {
                matches!(
                    phase(t),
                    Some(TransferPhase::Transferred | TransferPhase::TransferFailed)
                )
            };
            all.iter().all(answered).then_some(all)
        })
        .await;
        let refused_names: Vec<String> = refused.iter().map(kube::ResourceExt::name_any).collect();
        for request in &refused {
            let status = request.status.clone().unwrap_or_default();
            assert_eq!(
                (request.spec.to.as_str(), status.phase, status.reason.as_deref()),
                (
                    target.as_str(),
                    Some(TransferPhase::TransferFailed),
                    Some("TargetCannotReachStore")
                ),
                "a transfer while {target} was cut off: {request:?}"
            );
        }
        println!(
            "{second} samples over {:?}: {} LeaseTransfer(s) to {target} while cut off: {:?}",
            window_end - window_start,
            refused.len(),
            refused_names
        );

        partition.heal();
        let healed = Instant::now();
        let to_true = store_condition_becomes(&s, &target, "True", SUCCESSOR).await;
        let reachable = Instant::now();
        println!("the cut removed: {STORE_CONDITION}=True {to_true:?} later");

        let now = watcher.one_leader(Some(&leader), STABILIZATION + HANDOVER_WITHIN).await;
        assert_eq!(now, target, "leadership moved to the preferred pod");
        let claimed = watcher
            .claimed_after(&target, healed)
            .expect("the preferred pod's claim");
        println!(
            "{target} led {:?} after the cut was removed ({:?} after it showed {STORE_CONDITION}=True; \
             stabilization {STABILIZATION:?})",
            claimed - healed,
            claimed.saturating_duration_since(reachable)
        );
        let (_, is) = converges_past(&s, &watcher, None, Some(&was), SUCCESSOR).await;
        assert_eq!(is.term, was.term + 1, "the next term: {was:?} then {is:?}");
        assert!(token(&is) > token(&was), "a higher token: {was:?} then {is:?}");
        let target_uid = uid_of(&s, &target).await;
        let done = wait_for("the operator's transfer Transferred", STATUS_WITHIN, || async {
            let all = requests(&s).await;
            let new: Vec<&LeaseTransfer> = (all.iter())
                .filter(|t| !refused_names.contains(&kube::ResourceExt::name_any(*t)))
                .collect();
            let [request] = new.as_slice() else {
                panic!("one transfer after the cut was removed, the operator's: {new:?}")
            };
            let phase = request.status.as_ref().and_then(|st| st.phase);
            (phase == Some(TransferPhase::Transferred)).then(|| (*request).clone())
        })
        .await;
        assert_eq!(done.spec.origin, Some(TransferOrigin::Preference), "{done:?}");
        assert_eq!(done.spec.to, target, "{done:?}");
        let status = done.status.clone().expect("the leader answered");
        assert_eq!(
            (status.from_term, status.term),
            (Some(was.term), Some(is.term)),
            "{done:?}"
        );
        assert_eq!(status.target_uid, Some(target_uid), "reserved by UID: {done:?}");
        assert_eq!(watcher.moves() - moves, 1, "leadership moved exactly once");
        watcher.finish();
    })
    .await;
}

/// The operator scaled to 0: only where no other test needs its webhook.
mod disruptive {
    use super::*;
    use crate::e2e::cluster::OperatorScaledDown;

    /// Item 6: with the operator down, two leadership changes (the leader
    /// pod deleted gracefully, twice); then it starts again. What
    /// docs/design.md ("Leadership history") promises: the store keeps the
    /// end its last releasing write recorded, so the term that came and
    /// went unseen is an entry with its term and end (`PodTerminating`)
    /// and nothing invented (no holder); the term before the downtime
    /// keeps its holder, the current one names the leader the watcher
    /// sees; the terms are in order, with no gap (none was skipped).
    /// One leader other than `old` whose claim is of a term after `term`,
    /// as the watcher sees it (the lease's status waits for the operator).
    async fn claims_after(watcher: &LeadershipWatcher, old: &str, term: u64, within: Duration) -> (String, Claim) {
        let started = Instant::now();
        loop {
            let leader = watcher.one_leader(Some(old), within).await;
            if let Some(claim) = watcher.claim_of(&leader).filter(|c| c.term > term) {
                return (leader, claim);
            }
            assert!(
                started.elapsed() < within,
                "a claim of a term after {term}: not within {within:?}"
            );
            tokio::time::sleep(POLL).await;
        }
    }

    #[tokio::test]
    async fn the_history_keeps_the_terms_that_ended_while_the_operator_was_down() {
        scenario("e2e-history-restart", |s| async move {
            let (_store, watcher) = leader_only_service(&s, json!({})).await;
            let (first, a) = converges(&s, &watcher, None, FIRST_LEADER).await;
            history_entry(&s, a.term, "held by the first leader", |e| {
                e.holder.as_deref() == Some(a.holder.as_str())
            })
            .await;

            let operator = OperatorScaledDown::start(&s).await;
            let mut seen = vec![a.clone()];
            let mut gone = first.clone();
            for _ in 0..2 {
                // Graceful: the sidecar releases writing PodTerminating;
                // the app ignores SIGTERM, so the pod takes its 30 s grace.
                s.api::<Pod>()
                    .delete(&gone, &DeleteParams::default())
                    .await
                    .expect("graceful delete");
                let past = seen.last().expect("the first claim").term;
                let (next, claim) = claims_after(&watcher, &gone, past, SUCCESSOR + Duration::from_secs(30)).await;
                seen.push(claim);
                gone = next;
            }
            operator.restore().await;

            let [a, b, c] = &seen[..] else {
                panic!("three terms: {seen:?}")
            };
            assert_eq!(
                (b.term, c.term),
                (a.term + 1, a.term + 2),
                "one term per change: {seen:?}"
            );
            let history = history_entry(&s, c.term, "held by the current leader", |e| {
                e.holder.as_deref() == Some(c.holder.as_str())
            })
            .await;
            let terms: Vec<u64> = history.iter().map(|e| e.term).collect();
            assert!(terms.windows(2).all(|w| w[0] < w[1]), "terms in order: {history:?}");
            assert!(history.iter().all(|e| !e.is_gap()), "no term skipped: {history:?}");
            let entry = |term: u64| history.iter().find(|e| e.term == term).cloned().unwrap_or_default();
            for e in &history {
                let claimed: Vec<&str> = seen
                    .iter()
                    .filter(|c| c.term == e.term)
                    .map(|c| c.holder.as_str())
                    .collect();
                assert!(
                    e.holder.is_none() || claimed == [e.holder.as_deref().unwrap()],
                    "term {}'s holder is the one that claimed it: {e:?}, claims {seen:?}",
                    e.term
                );
            }
            assert_eq!(entry(a.term).holder.as_deref(), Some(a.holder.as_str()), "{history:?}");
            assert!(
                matches!(entry(a.term).ended, None | Some(TermEnd::PodTerminating)),
                "the term before the downtime ends as last seen or as written: {history:?}"
            );
            let unseen = entry(b.term);
            assert_eq!(unseen.term, b.term, "the unseen term is listed: {history:?}");
            assert_eq!(
                unseen.ended,
                Some(TermEnd::PodTerminating),
                "its end, from the store: {history:?}"
            );
            assert_eq!(unseen.holder, None, "no invented holder: {history:?}");
            assert_eq!(entry(c.term).holder.as_deref(), Some(c.holder.as_str()), "{history:?}");
            assert_eq!(watcher.one_leader(None, SUCCESSOR).await, gone);
            let shown = serde_json::to_string_pretty(&history).expect("JSON");
            eprintln!("claims {seen:?}\nthe history after the restart: {shown}");
            watcher.finish();
        })
        .await;
    }
}
