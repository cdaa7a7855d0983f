//! What the scenarios (and the benchmark's kubernetes part) share: the
//! leader-only-service example on a store, and what a client reads of it.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use serde_json::Value;

use crate::cluster::Scenario;
use crate::stores::postgres_lease;
use crate::watcher::{LeadershipWatcher, Watched};

pub const APP: &str = "app=scheduler";
pub const LEASE: &str = "scheduler";
pub const SERVICE: &str = "scheduler-leader";
/// Generous: the pods start (a couple of seconds here), the operator makes
/// the table, one candidate takes the free lease.
pub const FIRST_LEADER: Duration = Duration::from_secs(120);
/// A successor once the old leader is gone: D (15 s) + P, with room.
pub const SUCCESSOR: Duration = Duration::from_secs(60);

/// The leader-only-service example on PostgreSQL with the watcher on it.
pub async fn leader_only_service(
    s: &Scenario,
    lease_spec: Value,
) -> (leasehold::testing::servers::PostgresServer, LeadershipWatcher) {
    let (server, lease) = postgres_lease(s, LEASE, lease_spec);
    s.apply(lease).await;
    s.apply(s.example("leader-only-service.yaml")).await;
    let watcher = LeadershipWatcher::start(
        &s.client,
        Watched {
            ns: &s.ns,
            pods: APP,
            service: Some(SERVICE),
            lease: Some(LEASE),
        },
    );
    (server, watcher)
}

/// The leader-only-service example with `annotations` added to its pods.
pub fn example_with_pod_annotations(s: &Scenario, annotations: Value) -> Vec<Value> {
    let mut example = s.example("leader-only-service.yaml");
    for object in &mut example {
        if let Some(target) = object
            .pointer_mut("/spec/template/metadata/annotations")
            .and_then(Value::as_object_mut)
        {
            target.extend(annotations.as_object().cloned().unwrap_or_default());
        }
    }
    example
}

/// `kubectl exec` into a pod's app container.
pub fn exec_app(s: &Scenario, pod: &str, command: &[&str]) -> String {
    let mut args = vec!["exec", pod, "-c", "app", "--"];
    args.extend_from_slice(command);
    s.kubectl_ns(&args)
}

/// The pods whose Ready condition is True.
pub async fn ready_pods(s: &Scenario) -> Vec<String> {
    let pods = s
        .api::<Pod>()
        .list(&ListParams::default().labels(APP))
        .await
        .expect("pods");
    pods.items
        .into_iter()
        .filter(|p| {
            p.status
                .as_ref()
                .and_then(|st| st.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        })
        .filter_map(|p| p.metadata.name)
        .collect()
}
