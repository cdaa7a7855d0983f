//! The plan as plain values: an observation in, status, Events, label
//! repairs and requeue out. The wire (which requests carry them, in which
//! order) is checked once in `super::super::tests`.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

use super::super::{FINALIZER, INVALID_REQUEUE, STORE_ERROR_REQUEUE};
use super::*;
use crate::candidate::CandidatePod;
use crate::stores::SINGLE_STORE;
use crate::testing::{conditions, lease, pod};
use leasehold_core::lease::holder::LiveHolder;
use leasehold_core::lease::{FencingToken, LeaseRecord, LeaseStore, StoreTime};
use leasehold_core::store::memory::{Faults, MemoryStore};
use leasehold_kubernetes::api::contract::TIMING_CONDITION;
use leasehold_kubernetes::api::validate;

/// The resource of the fixtures, with `spec` over the defaults and `status` as
/// the last status.
fn resource(spec: Value, status: Option<Value>) -> DistributedLease {
    leasehold_kubernetes::api::client::object_from_value(&lease(spec, &[FINALIZER], status)).unwrap()
}

/// The candidates as the pod cache keeps them.
fn pods(pods: Vec<Value>) -> Vec<Arc<CandidatePod>> {
    pods.into_iter()
        .map(|pod| {
            Arc::new(CandidatePod::from(
                &leasehold_kubernetes::api::client::object_from_value::<Pod>(&pod).unwrap(),
            ))
        })
        .collect()
}

/// A valid `resource` seeing `candidates` and `read`, not readiness-gated.
fn seen(resource: &DistributedLease, candidates: Vec<Value>, read: Result<Read, StoreError>) -> Found {
    gated(resource, candidates, None, read)
}

/// As [`seen`], with the Deployments a readiness-gated lease reads.
fn gated(
    resource: &DistributedLease,
    candidates: Vec<Value>,
    owners: Option<Result<Vec<Deployment>, kube::Error>>,
    read: Result<Read, StoreError>,
) -> Found {
    Found::Valid(Box::new(Seen {
        valid: validate(resource).unwrap(),
        candidates: pods(candidates),
        owners,
        store: Some(StoreSeen {
            identity: StoreIdentity::new(SINGLE_STORE),
            elsewhere: None,
        }),
        read,
        held_off: None,
    }))
}

fn now() -> Time {
    Time("2026-11-25T12:00:00Z".parse().unwrap())
}

/// The plan of `resource` in a cluster without a name.
fn plan_of(resource: &DistributedLease, found: Found) -> Plan {
    plan(resource, None, &now(), found)
}

/// The status the plan writes, as the API server receives it.
fn written(plan: &Plan) -> Value {
    serde_json::to_value(plan.status.as_ref().expect("a status write")).unwrap()
}

/// `(kind, reason, note)` of the plan's Events.
fn events(plan: &Plan) -> Vec<(EventType, &'static str, String)> {
    plan.events.iter().map(|e| (e.kind, e.reason, e.note.clone())).collect()
}

/// The row `holder` holds on `store` for 15 s, read back.
async fn held(store: &MemoryStore, lock: &str, holder: &str) -> Observation {
    store.acquire(lock, holder, Duration::from_secs(15)).await.unwrap();
    store.observe(lock).await.unwrap()
}

#[test]
fn an_invalid_spec_is_valid_false_naming_the_field_with_one_event_and_a_slow_requeue() {
    let resource = resource(json!({"retryPeriod": "10s"}), None);
    let message = validate(&resource).unwrap_err().to_string();
    let plan = plan_of(&resource, Found::Invalid(message));
    assert_eq!(plan.requeue, Action::requeue(INVALID_REQUEUE));
    assert_eq!(plan.outcome, Outcome::Invalid);
    assert!(plan.repairs.is_empty());
    let status = written(&plan);
    let conditions = conditions(&status);
    let says = "spec.retryPeriod (10s) must be shorter than renewDeadline (10s), or the leader cannot renew in time";
    assert_eq!(conditions["Valid"], ("False".into(), "InvalidSpec".into(), says.into()));
    assert_eq!(conditions["StoreReady"].0, "Unknown");
    assert_eq!(conditions["Ready"].0, "False");
    assert_eq!(status.get("holder"), None);
    assert_eq!(events(&plan), [(EventType::Warning, "InvalidSpec", says.to_string())]);
}

#[tokio::test]
async fn a_renewal_alone_writes_no_status() {
    let store = MemoryStore::new(7);
    let first = held(&store, "prod/web", "prod/web-0#n1").await;
    let candidates = || vec![pod("web-0", Some("true"), true)];
    let resource_then = resource(json!({}), None);
    let plan = plan_of(
        &resource_then,
        seen(&resource_then, candidates(), Ok(Read::Lease(first.clone()))),
    );
    let applied = written(&plan);

    // The holder renewed (renewedAt moved) and nothing users see changed:
    // no status write, so no watch event and no extra reconcile per renewal.
    let token = first.record.as_ref().unwrap().token.unwrap();
    let mut renewed = first.clone();
    let record = renewed.record.as_mut().unwrap();
    record.renewed_at = record.renewed_at.map(|t| t.saturating_add(Duration::from_secs(2)));
    renewed.now = renewed.now.saturating_add(Duration::from_secs(2));
    assert_eq!(renewed.live_holder(), Some("prod/web-0#n1"));
    assert_eq!(renewed.record.as_ref().unwrap().token, Some(token));
    let resource_now = resource(json!({}), Some(applied));
    let plan = plan_of(
        &resource_now,
        seen(&resource_now, candidates(), Ok(Read::Lease(renewed))),
    );
    assert!(plan.status.is_none(), "{:?}", plan.status);
    assert!(plan.events.is_empty(), "{:?}", plan.events);
    assert!(plan.repairs.is_empty());
    assert_eq!(plan.requeue, Action::requeue(OBSERVED_REQUEUE));
}

#[tokio::test]
async fn an_unreachable_store_shows_in_conditions_and_one_event() {
    let store = MemoryStore::new(7);
    store.set_faults(Faults {
        down: true,
        ..Faults::default()
    });
    let down = || store.observe("prod/web");
    let candidates = || vec![pod("web-0", Some("true"), true)];
    let first = resource(json!({}), None);
    let plan = plan_of(&first, seen(&first, candidates(), down().await.map(Read::Lease)));
    assert_eq!(plan.requeue, Action::requeue(STORE_ERROR_REQUEUE));
    assert_eq!(plan.outcome, Outcome::StoreError);
    let events = events(&plan);
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!((events[0].0, events[0].1), (EventType::Warning, "StoreUnavailable"));
    assert!(
        events[0].2.contains("store projects/p/instances/i/databases/d"),
        "{}",
        events[0].2
    );
    let status = written(&plan);
    let conditions = conditions(&status);
    assert_eq!(conditions["Valid"].0, "True");
    assert_eq!(conditions["StoreReady"].0, "False");
    assert_eq!(conditions["StoreReady"].1, "StoreUnavailable");
    assert_eq!(conditions["Ready"].1, "StoreNotReady");
    assert_eq!(status["candidates"], json!(1));

    // The same problem again: no second Event, no status write, and the
    // label is not touched while the holder is unknown.
    let again = resource(json!({}), Some(status));
    let plan = plan_of(&again, seen(&again, candidates(), down().await.map(Read::Lease)));
    assert_eq!(plan.requeue, Action::requeue(STORE_ERROR_REQUEUE));
    assert!(plan.status.is_none(), "{:?}", plan.status);
    assert!(plan.events.is_empty(), "{:?}", plan.events);
    assert!(plan.repairs.is_empty(), "{:?}", plan.repairs);
}

#[test]
fn an_expired_lease_clears_every_true_label_and_counts_transitions() {
    // Term 3 now, its holder's lease over by the store's clock; the status
    // last showed term 1, so two acquisitions happened.
    let record = LeaseRecord {
        name: "prod/web".into(),
        holder: Some("prod/web-0#c".into()),
        term: 3,
        token: Some(FencingToken(30)),
        renewed_at: Some(StoreTime(1_000_000_000)),
        lease_duration: Duration::from_millis(10),
        version: None,
        reservation: None,
        ended: None,
    };
    let expired = Observation {
        now: record.expires_at().unwrap().saturating_add(Duration::from_millis(2)),
        record: Some(record),
    };
    let old = json!({"holder": "prod/web-0#a", "term": 1, "transitions": 4, "conditions": []});
    let resource = resource(json!({}), Some(old));
    let candidates = vec![pod("web-0", Some("true"), true)];
    let plan = plan_of(&resource, seen(&resource, candidates, Ok(Read::Lease(expired))));
    assert_eq!(
        plan.repairs,
        [Repair {
            pod: "web-0".into(),
            resource_version: Some("rv-web-0".into()),
            label_key: "leasehold.dev/leader".into(),
        }]
    );
    assert_eq!(
        events(&plan),
        [(
            EventType::Normal,
            "HolderChanged",
            "lock prod/web has no live holder".to_string()
        )]
    );
    let status = written(&plan);
    assert_eq!(status.get("holder"), None);
    assert_eq!(status["term"], json!(3));
    assert_eq!(status["transitions"], json!(6));
    let conditions = conditions(&status);
    assert_eq!(conditions["Ready"].1, "NoLeader");
    assert!(
        conditions["Ready"].2.contains("prod/web-0#c expired"),
        "{:?}",
        conditions["Ready"]
    );
}

/// The gated lease's candidate `web-7d9f-a`, labelled leader, of
/// ReplicaSet `web-7d9f`.
fn gated_leader(ready: bool) -> Value {
    let mut gated = pod("web-7d9f-a", Some("true"), ready);
    gated["metadata"]["labels"]["pod-template-hash"] = json!("7d9f");
    gated["metadata"]["ownerReferences"] =
        json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-7d9f", "uid": "rs", "controller": true}]);
    gated
}

/// The plan of a readiness-gated lease whose leader `web-7d9f-a` (Ready or
/// not) belongs to `deployment`.
async fn gated_plan(deployment: Value, leader_ready: bool) -> Plan {
    let store = MemoryStore::new(7);
    let observed = held(&store, "prod/web", "prod/web-7d9f-a#n").await;
    let resource = resource(json!({"publishing": {"readinessGate": true}}), None);
    let deployment: Deployment = leasehold_kubernetes::api::client::object_from_value(&deployment).unwrap();
    let found = gated(
        &resource,
        vec![gated_leader(leader_ready)],
        Some(Ok(vec![deployment])),
        Ok(Read::Lease(observed)),
    );
    plan_of(&resource, found)
}

#[tokio::test]
async fn a_readiness_gated_lease_warns_when_the_deployment_would_stall_rollouts() {
    let plan = gated_plan(
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": "prod"},
               "spec": {"replicas": 3, "strategy": {"rollingUpdate": {"maxUnavailable": 1}},
                        "selector": {"matchLabels": {"app": "web"}}, "template": {}}}),
        true,
    )
    .await;
    let events = events(&plan);
    assert_eq!(
        events.iter().map(|e| e.1).collect::<Vec<_>>(),
        ["RolloutWouldStall", "HolderChanged"]
    );
    assert_eq!(events[0].0, EventType::Warning);
    assert!(
        events[0].2.contains("maxUnavailable resolves to 1 of 3"),
        "{}",
        events[0].2
    );
    assert!(events[1].2.contains("prod/web-7d9f-a#n"), "{}", events[1].2);
    let status = written(&plan);
    let conditions = conditions(&status);
    assert_eq!(conditions["RolloutSafe"].0, "False");
    assert_eq!(conditions["RolloutSafe"].1, "RolloutWouldStall");
    assert_eq!(conditions["Ready"].0, "True");
    assert_eq!(
        conditions[ROLLED_OUT],
        (
            "False".into(),
            "RolloutInProgress".into(),
            "deployment web: 0 of 3 pods run the current revision".into()
        )
    );
    // Issue 39: its Deployments come from a watch whose changes reconcile
    // it, so it rests like a plain lease instead of looking again every P.
    assert_eq!(plan.requeue, Action::requeue(OBSERVED_REQUEUE));
}

/// `RolledOut` on a gated lease whose Deployment (generation 5) reports
/// `status`, its one candidate `web-7d9f-a` leading and Ready or not.
async fn rolled_out(status: Value, leader_ready: bool) -> (String, String, String) {
    let plan = gated_plan(
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
               "metadata": {"name": "web", "namespace": "prod", "generation": 5},
               "spec": {"replicas": 3, "strategy": {"type": "Recreate"},
                        "selector": {"matchLabels": {"app": "web"}}, "template": {}},
               "status": status}),
        leader_ready,
    )
    .await;
    assert_eq!(events(&plan).iter().map(|e| e.1).collect::<Vec<_>>(), ["HolderChanged"]);
    conditions(&written(&plan))
        .remove(ROLLED_OUT)
        .expect("a RolledOut condition")
}

#[tokio::test]
async fn a_gated_lease_says_rolled_out_once_every_pod_is_current_and_the_leader_ready() {
    let done = json!({"observedGeneration": 5, "replicas": 3, "updatedReplicas": 3, "availableReplicas": 1});
    let (status, reason, message) = rolled_out(done.clone(), true).await;
    assert_eq!((status.as_str(), reason.as_str()), ("True", "RolloutComplete"));
    assert!(message.contains("web-7d9f-a leads"), "{message}");
    assert_eq!(rolled_out(done, false).await.1, "LeaderNotReady");
    let cases = [
        (
            json!({"observedGeneration": 4, "replicas": 3, "updatedReplicas": 3}),
            "deployment web: the Deployment controller has not yet seen generation 5",
        ),
        (
            json!({"observedGeneration": 5, "replicas": 4, "updatedReplicas": 3}),
            "deployment web: 1 pods of an older revision remain",
        ),
        (
            json!({"observedGeneration": 5, "replicas": 3, "updatedReplicas": 2}),
            "deployment web: 2 of 3 pods run the current revision",
        ),
    ];
    for (status, expected) in cases {
        let (status, reason, message) = rolled_out(status, true).await;
        assert_eq!((status.as_str(), reason.as_str()), ("False", "RolloutInProgress"));
        assert_eq!(message, expected);
    }
}

#[tokio::test]
async fn a_stale_label_on_a_local_pod_named_like_a_remote_holder_is_cleared() {
    let store = MemoryStore::new(5);
    let observed = held(&store, "global/web", "us/prod/web-0#n").await;
    let resource = resource(json!({"lockName": "global/web"}), None);
    let found = seen(
        &resource,
        vec![pod("web-0", Some("true"), true)],
        Ok(Read::Lease(observed)),
    );
    let plan = plan(&resource, Some("eu"), &now(), found);
    assert_eq!(
        plan.repairs.iter().map(|r| r.pod.as_str()).collect::<Vec<_>>(),
        ["web-0"]
    );
    let events = events(&plan);
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].1, "HolderChanged");
    assert!(events[0].2.contains("us/prod/web-0#n"), "{}", events[0].2);
    assert_eq!(written(&plan)["holder"], json!("us/prod/web-0#n"));
}

/// Issue 37: the leader runs in another cluster. Status names it, its
/// cluster, term and token; `Ready` is True (a leader is elected, alerts on
/// Ready stay quiet in the standby cluster) with reason
/// `LeaderInOtherCluster`; no local pod is labelled leader (a stale label
/// is repaired, a pod named like the holder included).
#[tokio::test]
async fn a_leader_in_another_cluster_is_ready_elsewhere_and_no_local_pod_leads() {
    let store = MemoryStore::new(5);
    let observed = held(&store, "prod/web", "us/prod/web-0#n@uid-1").await;
    let resource = resource(json!({}), None);
    let found = seen(
        &resource,
        vec![pod("web-0", Some("true"), true), pod("web-1", Some("false"), true)],
        Ok(Read::Lease(observed)),
    );
    let standby = plan(&resource, Some("eu"), &now(), found);
    let status = written(&standby);
    assert_eq!(status["holder"], json!("us/prod/web-0#n@uid-1"));
    assert_eq!(status["holderCluster"], json!("us"));
    assert_eq!(status["term"], json!(1));
    assert!(status["token"].is_string(), "{status}");
    let ready = status["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Ready")
        .unwrap();
    assert_eq!(
        (&ready["status"], &ready["reason"]),
        (&json!("True"), &json!("LeaderInOtherCluster"))
    );
    assert!(
        ready["message"].as_str().unwrap().contains("leads in cluster us"),
        "{ready}"
    );
    assert_eq!(
        standby.repairs.iter().map(|r| r.pod.as_str()).collect::<Vec<_>>(),
        ["web-0"]
    );

    // The same holder seen from cluster us is a local leader.
    let observed = held(&MemoryStore::new(5), "prod/web", "us/prod/web-0#n@uid-1").await;
    let found = seen(
        &resource,
        vec![pod("web-0", Some("true"), true)],
        Ok(Read::Lease(observed)),
    );
    let leading = plan(&resource, Some("us"), &now(), found);
    let status = written(&leading);
    assert!(
        status["conditions"].to_string().contains("\"LeaderElected\""),
        "{status}"
    );
    assert!(leading.repairs.is_empty());
}

/// A candidate whose sidecar reports slow renewals (its pod condition) makes
/// the lease's TimingAtRisk True, naming the pod and its measurement.
#[tokio::test]
async fn a_candidate_reporting_slow_renewals_sets_timing_at_risk() {
    let store = MemoryStore::new(7);
    let observed = held(&store, "prod/web", "prod/web-0#n1").await;
    let mut slow = pod("web-0", Some("true"), true);
    slow["status"]["conditions"].as_array_mut().unwrap().push(json!({
        "type": TIMING_CONDITION, "status": "True",
        "message": "renewal p99 uses 30 % of R - P (8s)"
    }));
    let mut fine = pod("web-1", Some("false"), true);
    fine["status"]["conditions"]
        .as_array_mut()
        .unwrap()
        .push(json!({"type": TIMING_CONDITION, "status": "False", "message": "renewal p99 uses 2 % of R - P (8s)"}));
    let resource = resource(json!({}), None);
    let plan = plan_of(&resource, seen(&resource, vec![slow, fine], Ok(Read::Lease(observed))));
    assert_eq!(
        conditions(&written(&plan))["TimingAtRisk"],
        (
            "True".into(),
            "RenewalsSlow".into(),
            "web-0: renewal p99 uses 30 % of R - P (8s)".into()
        )
    );
}

/// Issue 16: status shows the leader's recorded version and revision, and a
/// move to another version is an Event (a Warning when it went to a lower
/// revision, which only a lease without the fence allows).
#[tokio::test]
async fn a_new_leader_version_shows_in_status_and_as_an_event() {
    let store = MemoryStore::new(7);
    let new = leasehold_core::lease::Version {
        revision: 3,
        name: "7d9f/web:3".into(),
    };
    let claim = leasehold_core::lease::Claim {
        holder: "prod/web-7d9f-a#n",
        version: Some(&new),
        fence: true,
    };
    store
        .acquire_as("prod/web", &claim, Duration::from_secs(15))
        .await
        .unwrap();
    let observed = store.observe("prod/web").await.unwrap();
    let old = json!({"holder": "prod/web-5c4b-a#m", "term": 0, "transitions": 0, "conditions": [],
                     "leaderVersion": "5c4b/web:2 (revision 2)", "leaderRevision": 2});
    let resource = resource(json!({}), Some(old));
    let candidates = vec![pod("web-7d9f-a", Some("true"), true)];
    let plan = plan_of(&resource, seen(&resource, candidates, Ok(Read::Lease(observed))));
    let events = events(&plan);
    assert_eq!(
        events.iter().map(|e| (e.0, e.1)).collect::<Vec<_>>(),
        [
            (EventType::Normal, "HolderChanged"),
            (EventType::Normal, "LeaderVersionChanged")
        ]
    );
    assert!(events[0].2.contains("prod/web-7d9f-a#n"), "{}", events[0].2);
    assert!(
        events[1]
            .2
            .contains("moved from 5c4b/web:2 (revision 2) to 7d9f/web:3 (revision 3)"),
        "{}",
        events[1].2
    );
    let status = written(&plan);
    assert_eq!(status["leaderVersion"], json!("7d9f/web:3 (revision 3)"));
    assert_eq!(status["leaderRevision"], json!(3));
}

#[tokio::test]
async fn without_members_every_partition_is_unowned_and_not_ready() {
    let store = MemoryStore::new(4);
    let resource = resource(json!({"partitions": 8}), None);
    let view = PartitionView::observe(&store, "prod/web", 8).await.unwrap();
    let found = seen(&resource, vec![pod("web-0", None, true)], Ok(Read::Partitions(view)));
    let status = written(&plan_of(&resource, found));
    assert_eq!(
        status["partitions"],
        json!({"count": 8, "members": 0, "unowned": 8, "balance": 0, "assignment": []})
    );
    assert_eq!(
        conditions(&status)["Ready"],
        (
            "False".into(),
            "NoMembers".into(),
            "no live candidate is a member; 8 of 8 partitions are unowned".into()
        )
    );
}

#[test]
fn a_move_to_a_lower_revision_is_a_warning_and_the_first_sighting_no_move() {
    let at = |term: Option<u64>, revision: u64| DistributedLeaseStatus {
        term,
        leader_version: Some(format!("r{revision}")),
        leader_revision: Some(revision),
        ..Default::default()
    };
    let (kind, note) = version_move(&at(Some(4), 3), &at(Some(5), 2), "l").unwrap();
    assert_eq!(kind, EventType::Warning);
    assert_eq!(note, "leadership of lock l moved from r3 to r2, an older revision");
    assert_eq!(version_move(&at(None, 1), &at(Some(1), 2), "l"), None);
    assert_eq!(version_move(&at(Some(1), 2), &at(Some(2), 2), "l"), None);
}

#[test]
fn holder_identities_map_to_cluster_namespace_and_pod() {
    // Released on delete when its pod is gone: certainly local.
    let released = |holder: &HolderPod, cluster: Option<&str>| {
        holder.judge_live(cluster, "prod", |_| false, None) == LiveHolder::Gone
    };
    assert_eq!(HolderPod::parse("eu/prod/web-0#ab12").pod(), Some("web-0"));
    assert_eq!(HolderPod::parse("web-0#ab12").pod(), Some("web-0"));
    // Not an identity (another tool's row): no pod of ours, maybe local for
    // a label repair, never certainly local for a release.
    let foreign = HolderPod::parse("web-0");
    assert_eq!(foreign.pod(), None);
    assert!(foreign.may_be_local(None, "prod"));
    assert!(!released(&foreign, None));

    let eu = HolderPod::parse("eu/prod/web-0#n");
    assert!(eu.may_be_local(None, "prod"), "an unnamed cluster may be eu");
    assert!(!released(&eu, None), "but release needs certainty");
    assert!(released(&eu, Some("eu")));
    assert!(!eu.may_be_local(Some("us"), "prod"));
    assert!(!eu.may_be_local(Some("eu"), "staging"));
    // Issue 37: no name on either side proves nothing: another cluster
    // applying the same manifest holds the same default lock.
    assert!(HolderPod::parse("prod/web-0#n").may_be_local(None, "prod"));
    assert!(!released(&HolderPod::parse("prod/web-0#n"), None));
    assert!(!released(&HolderPod::parse("prod/web-0#n"), Some("eu")));
    assert!(!released(&eu, Some("us")));
    assert_eq!(eu.cluster_elsewhere(Some("us")), Some("eu"));
    assert_eq!(eu.cluster_elsewhere(Some("eu")), None);
    assert_eq!(eu.cluster_elsewhere(None), None, "an unnamed cluster may be eu");
    assert_eq!(HolderPod::parse("prod/web-0#n").cluster_elsewhere(Some("us")), None);
}

/// The status `plan` writes after `resource` (with `status` as the last
/// one) reads `observed`; the last status again when nothing changed.
fn history_after(status: Option<Value>, observed: Observation) -> (Value, Vec<HistoryEntry>) {
    let resource = resource(json!({}), status.clone());
    let plan = plan_of(
        &resource,
        seen(&resource, vec![pod("web-0", None, true)], Ok(Read::Lease(observed))),
    );
    let status = plan
        .status
        .map_or_else(|| status.unwrap(), |s| serde_json::to_value(s).unwrap());
    let history = leasehold_kubernetes::api::client::object_from_value(&status["history"]).unwrap();
    (status, history)
}

#[tokio::test]
async fn terms_that_passed_while_the_operator_was_down_are_a_gap_and_a_release_is_recorded() {
    use leasehold_core::lease::{EndReason, Release};
    use leasehold_kubernetes::api::history::TermEnd;
    let store = MemoryStore::new(7);
    let lock = "prod/web";
    let (status, history) = history_after(None, held(&store, lock, "prod/web-0#n1").await);
    assert_eq!(history.len(), 1);
    assert_eq!(
        (history[0].term, history[0].holder.as_deref()),
        (1, Some("prod/web-0#n1"))
    );

    // The operator is down: web-0 and web-1 lead and release, each for its
    // own reason, web-2 leads and releases, web-3 acquires.
    let mut observed = store.observe(lock).await.unwrap();
    let steps = [
        ("prod/web-0#n1", EndReason::PodTerminating, "prod/web-1#n1"),
        ("prod/web-1#n1", EndReason::Released, "prod/web-2#n1"),
        ("prod/web-2#n1", EndReason::AppUnhealthy, "prod/web-3#n1"),
    ];
    for (holder, reason, next) in steps {
        let token = observed.record.as_ref().unwrap().token.unwrap();
        store
            .release_for(lock, holder, token, &Release::because(reason))
            .await
            .unwrap();
        observed = held(&store, lock, next).await;
    }
    let token = observed.record.as_ref().unwrap().token.unwrap();
    let (status, history) = history_after(Some(status), observed);
    let shown: Vec<(u64, Option<u64>)> = history.iter().map(|e| (e.term, e.missing_through)).collect();
    assert_eq!(
        shown,
        [(1, None), (2, Some(2)), (3, None), (4, None)],
        "term 2 is a gap, not invented; term 3's end is in the record"
    );
    assert_eq!(history[0].ended, None, "term 1's end was overwritten before any read");
    assert_eq!(
        (history[2].ended, &history[2].holder),
        (Some(TermEnd::AppUnhealthy), &None),
        "why term 3 ended, though no read saw it"
    );
    assert_eq!(history[3].token, Some(token.to_string()));

    // web-3 is deleted: the store says so, and history keeps who held it.
    store
        .release_for(
            lock,
            "prod/web-3#n1",
            token,
            &Release::because(EndReason::PodTerminating),
        )
        .await
        .unwrap();
    let (status, history) = history_after(Some(status), store.observe(lock).await.unwrap());
    assert_eq!(history.len(), 4, "term 4 once, not again");
    assert_eq!(history[3].ended, Some(TermEnd::PodTerminating));
    assert_eq!(history[3].holder.as_deref(), Some("prod/web-3#n1"));
    assert_eq!(status["history"][3]["ended"], json!("PodTerminating"));
}

/// `seen`, the read having gone to the store `identity`, with the Secret
/// reaching another store when `elsewhere` says so.
fn seen_at(resource: &DistributedLease, read: Observation, identity: &str, elsewhere: Option<&str>) -> Found {
    let Found::Valid(mut seen) = seen(resource, vec![pod("web-0", Some("true"), true)], Ok(Read::Lease(read))) else {
        unreachable!("a valid resource")
    };
    seen.store = Some(StoreSeen {
        identity: StoreIdentity::new(identity),
        elsewhere: elsewhere.map(str::to_string),
    });
    Found::Valid(seen)
}

/// Issue 54: the first read records the store's identity; later reads keep
/// it whatever the store seen says; a Secret that reaches another store is
/// `StoreReady=False` with one Warning, while the rest of the status is the
/// recorded store's (its holder leads).
#[tokio::test]
async fn the_store_is_recorded_once_and_a_secret_reaching_elsewhere_is_shown() {
    let store = MemoryStore::new(7);
    let read = held(&store, "prod/web", "prod/web-0#n1").await;
    let fresh = resource(json!({}), None);
    let plan = plan_of(&fresh, seen_at(&fresh, read.clone(), "postgres:1/ours/public", None));
    let status = written(&plan);
    assert_eq!(status["storeIdentity"], json!("postgres:1/ours/public"));

    let recorded = resource(json!({}), Some(status));
    let plan = plan_of(
        &recorded,
        seen_at(&recorded, read.clone(), "postgres:1/other/public", None),
    );
    assert!(
        plan.status.is_none(),
        "the identity recorded never changes: {:?}",
        plan.status
    );

    let says = "the store's Secret now reaches store postgres:1/other/public";
    let plan = plan_of(
        &recorded,
        seen_at(&recorded, read, "postgres:1/ours/public", Some(says)),
    );
    let status = written(&plan);
    assert_eq!(status["storeIdentity"], json!("postgres:1/ours/public"));
    assert_eq!(status["holder"], json!("prod/web-0#n1"));
    let conditions = conditions(&status);
    assert_eq!(
        conditions["StoreReady"],
        ("False".into(), "SecretPointsElsewhere".into(), says.into())
    );
    assert_eq!(conditions["Ready"].1, "LeaderElected");
    assert_eq!(
        events(&plan),
        [(EventType::Warning, "SecretPointsElsewhere", says.to_string())]
    );
}

/// Issue 54: while a preferred target waits out its backoff, the status
/// says so in `PreferenceHeldOff` (present only then), naming the bound.
#[tokio::test]
async fn a_preferred_target_backing_off_is_shown_in_status() {
    let store = MemoryStore::new(7);
    let read = held(&store, "prod/web", "prod/web-0#n1").await;
    let fresh = resource(json!({}), None);
    let why = "web-1 is preferred, but 2 preference transfer(s) to it failed";
    let mut found = seen(
        &fresh,
        vec![pod("web-0", Some("true"), true)],
        Ok(Read::Lease(read.clone())),
    );
    found.held_off(Some(why.into()));
    let status = written(&plan_of(&fresh, found));
    assert_eq!(
        conditions(&status)[PREFERENCE_HELD_OFF],
        ("True".into(), "TransfersFailed".into(), why.into())
    );

    let shown = resource(json!({}), Some(status));
    let plan = plan_of(
        &shown,
        seen(&shown, vec![pod("web-0", Some("true"), true)], Ok(Read::Lease(read))),
    );
    let status = written(&plan);
    assert!(
        !conditions(&status).contains_key(PREFERENCE_HELD_OFF),
        "gone once over: {status}"
    );
}

/// Issue 54: a label repair judges the holder by pod UID where both sides
/// carry one: a namesake of the holder (another UID) showing `true` is
/// stale and set back; the holder's own pod keeps its label.
#[tokio::test]
async fn a_namesake_of_the_holder_with_another_uid_loses_its_label() {
    let store = MemoryStore::new(7);
    let read = held(&store, "prod/web", "prod/web-0#n1@uid-holder").await;
    let fresh = resource(json!({}), None);
    let with_uid = |uid: &str| {
        let mut web_0 = pod("web-0", Some("true"), true);
        web_0["metadata"]["uid"] = json!(uid);
        web_0
    };
    let plan = plan_of(
        &fresh,
        seen(&fresh, vec![with_uid("uid-namesake")], Ok(Read::Lease(read.clone()))),
    );
    assert_eq!(
        plan.repairs.iter().map(|r| r.pod.as_str()).collect::<Vec<_>>(),
        ["web-0"]
    );
    let plan = plan_of(
        &fresh,
        seen(&fresh, vec![with_uid("uid-holder")], Ok(Read::Lease(read))),
    );
    assert!(plan.repairs.is_empty(), "{:?}", plan.repairs);
}
