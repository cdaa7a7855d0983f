use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use serde_json::json;

use super::*;
use crate::preferred::Candidate;
use crate::reconcile;
use leasehold_kubernetes::api::contract::{SIDECAR_CONTAINER, STORE_CONDITION};
use leasehold_kubernetes::api::preference::{PRIORITY_KEY, ZONE_LABEL};

fn pod(value: serde_json::Value) -> Pod {
    leasehold_kubernetes::api::client::object_from_value(&value).unwrap()
}

/// A full pod becomes what reconciles read of it, annotations' priority
/// included: the pod cache used to drop annotations, so a priority set
/// there (the only place a negative one can go) ranked as 0.
#[test]
fn a_pod_becomes_its_names_labels_owner_conditions_sidecar_and_priority() {
    let full = pod(json!({
        "metadata": {"name": "web-0", "namespace": "prod", "uid": "u-0", "resourceVersion": "7",
                     "deletionTimestamp": "2026-11-27T10:00:00Z",
                     "labels": {"app": "web", "pod-template-hash": "5c2a", ZONE_LABEL: "z1"},
                     "annotations": {PRIORITY_KEY: "-3", "big": "x"},
                     "ownerReferences": [
                         {"apiVersion": "v1", "kind": "Node", "name": "n", "uid": "n"},
                         {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-5c2a", "uid": "r",
                          "controller": true}]},
        "spec": {"containers": [{"name": "app", "image": "i", "env": [{"name": "A", "value": "b"}]}],
                 "initContainers": [{"name": SIDECAR_CONTAINER, "image": "s", "restartPolicy": "Always"}],
                 "nodeName": "n"},
        "status": {"phase": "Running", "podIP": "10.0.0.1",
                   "conditions": [
                       {"type": "Ready", "status": "True"},
                       {"type": "ContainersReady", "status": "True", "lastTransitionTime": "2026-11-27T09:00:00Z"},
                       {"type": TIMING_CONDITION, "status": "True", "message": "renewal p99 uses 80 %"},
                       {"type": STORE_CONDITION, "status": "True"}]},
    }));
    let expected = CandidatePod {
        name: "web-0".into(),
        namespace: "prod".into(),
        uid: Some("u-0".into()),
        resource_version: Some("7".into()),
        labels: [("app", "web"), ("pod-template-hash", "5c2a"), (ZONE_LABEL, "z1")]
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .into(),
        replica_set: Some("web-5c2a".into()),
        finished: false,
        terminating: true,
        ready: true,
        containers_ready_since: Some("2026-11-27T09:00:00Z".parse::<Timestamp>().unwrap()),
        timing_at_risk: Some("renewal p99 uses 80 %".into()),
        store_reachable: true,
        has_sidecar: true,
        priority: Ok(-3),
    };
    let candidate = CandidatePod::from(&full);
    assert_eq!(candidate, expected);
    assert_eq!(candidate.zone(), Some("z1"));
    let ranked = Candidate::of(&candidate, &["z0".to_string(), "z1".to_string()]);
    assert_eq!(ranked.rank.map(|r| (r.priority, r.zone_place)), Ok((-3, 1)));
}

/// What is absent reads as absent: no phase is not finished, a condition
/// False is not ready, a bad priority stays an error for the reconcile to
/// report.
#[test]
fn a_bare_pod_is_not_ready_not_finished_and_keeps_a_bad_priority_as_an_error() {
    let bare = CandidatePod::from(&pod(json!({"metadata": {"name": "a", "namespace": "prod",
        "labels": {PRIORITY_KEY: "high"}},
        "status": {"conditions": [{"type": "Ready", "status": "False"}]}})));
    assert!(!bare.ready && !bare.finished && !bare.terminating && !bare.has_sidecar);
    assert_eq!(
        (bare.replica_set, bare.containers_ready_since, bare.timing_at_risk),
        (None, None, None)
    );
    assert!(bare.priority.is_err());
    for phase in ["Succeeded", "Failed"] {
        let done = pod(json!({"metadata": {"name": "b", "namespace": "prod"}, "status": {"phase": phase}}));
        assert!(CandidatePod::from(&done).finished, "{phase}");
    }
}

/// `status.candidatesWithoutSidecar` reads the cached pods: an injected
/// candidate (the webhook's native sidecar, or `leasehold run`'s installer)
/// is not listed; one without either is.
#[test]
fn a_cached_injected_candidate_is_not_listed_as_without_the_sidecar() {
    let cached = |name: &str, init_containers: serde_json::Value| {
        Arc::new(CandidatePod::from(&pod(json!({
            "metadata": {"name": name, "namespace": "prod", "labels": {"app": "web"}},
            "spec": {"containers": [{"name": "app", "image": "i"}], "initContainers": init_containers},
        }))))
    };
    let candidates = [
        cached(
            "injected",
            json!([{"name": SIDECAR_CONTAINER, "restartPolicy": "Always"}]),
        ),
        cached(
            "installed",
            json!([{"name": leasehold_kubernetes::api::contract::INSTALLER_NAME}]),
        ),
        cached("plain", json!([{"name": "migrate"}])),
    ];
    assert_eq!(reconcile::without_sidecar(&candidates), ["plain"]);
}
