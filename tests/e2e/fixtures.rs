//! What the scenarios (and the benchmark's kubernetes part) share: the
//! leader-only-service example on a store, and what a client reads of it.

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, ListParams};
use leasehold::api::DistributedLease;
use leasehold::testing::servers::PostgresServer;
use serde_json::{Value, json};

use crate::e2e::cluster::{Scenario, wait_for};
use crate::e2e::stores::{lease, postgres_lease};
use crate::e2e::watcher::{LeadershipWatcher, Watched};

pub const APP: &str = "app=scheduler";
pub const LEASE: &str = "scheduler";
/// The example's Deployment of candidates.
pub const DEPLOYMENT: &str = "scheduler";
pub const SERVICE: &str = "scheduler-leader";
/// The sidecar's container name in an injected pod.
pub const SIDECAR: &str = "leasehold";
/// Generous: the pods start (a couple of seconds here), the operator makes
/// the table, one candidate takes the free lease.
pub const FIRST_LEADER: Duration = Duration::from_secs(120);
/// A successor once the old leader is gone: D (15 s) + P, with room.
pub const SUCCESSOR: Duration = Duration::from_secs(60);

/// The leader-only-service example on PostgreSQL with the watcher on it.
/// The watcher is running before the scenario's first change.
pub async fn leader_only_service(s: &Scenario, lease_spec: Value) -> (PostgresServer, LeadershipWatcher) {
    let watcher = watch_example(s, true);
    let (server, lease) = postgres_lease(s, LEASE, lease_spec);
    s.apply(lease).await;
    s.apply(s.example("leader-only-service.yaml")).await;
    (server, watcher)
}

/// The example's lease on `store` (`postgres` or `kubernetes`), with `spec`
/// merged over its spec; the PostgreSQL server it runs on, if any.
pub async fn lease_on(s: &Scenario, store: &str, spec: Value) -> Option<PostgresServer> {
    match store {
        "postgres" => {
            let (server, objects) = postgres_lease(s, LEASE, spec);
            s.apply(objects).await;
            Some(server)
        }
        "kubernetes" => {
            s.apply(vec![lease(s, LEASE, json!({"kubernetes": {}}), spec)]).await;
            None
        }
        other => panic!("the store is postgres or kubernetes, not {other:?}"),
    }
}

/// The leader-only-service example with its lease on `store` (see
/// [`lease_on`]) and the watcher on it.
pub async fn leader_only_service_on(s: &Scenario, store: &str) -> (Option<PostgresServer>, LeadershipWatcher) {
    let watcher = watch_example(s, true);
    let server = lease_on(s, store, json!({})).await;
    s.apply(s.example("leader-only-service.yaml")).await;
    (server, watcher)
}

/// The watcher on the examples' candidates, their lease and (with
/// `service`) the leader-only Service.
pub fn watch_example(s: &Scenario, service: bool) -> LeadershipWatcher {
    let watched = Watched {
        ns: &s.ns,
        pods: APP,
        service: service.then_some(SERVICE),
        lease: Some(LEASE),
    };
    LeadershipWatcher::start(&s.client, watched)
}

/// A candidate pod other than `leader`.
pub async fn a_follower(s: &Scenario, leader: &str) -> String {
    let pods = s.pods(APP).await;
    pods.into_iter()
        .filter_map(|p| p.metadata.name)
        .find(|p| p != leader)
        .expect("a follower")
}

/// Deletes a pod without grace, as `kubectl delete pod --grace-period=0` does.
pub async fn delete_now(s: &Scenario, pod: &str) {
    s.api::<Pod>()
        .delete(pod, &DeleteParams::default().grace_period(0))
        .await
        .unwrap_or_else(|e| panic!("deleting {pod}: {e}"));
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

/// Generous: a rollout restart replaces the example's three pods one after
/// another (the Deployment's default maxSurge 25 % rounds up to 1,
/// maxUnavailable 25 % down to 0), each new one started and ready first.
const ROLLOUT: Duration = Duration::from_secs(180);

/// `kubectl rollout restart deployment/scheduler`, as docs/readiness-gate.md
/// shows it, waited out: every pod from before gone, the controller having
/// seen the restart, and every replica updated with `ready` of them Ready
/// (all, or the one leader under a readiness gate). Not blocking: the
/// watchers run on the test's thread.
///
/// The wait is `kubectl rollout status`'s (kubectl's
/// pkg/polymorphichelpers/rollout_status.go: observed generation, updated
/// and total replicas) made strict: the old pods gone, not only scaled
/// away, so the old leader's term has ended. kubectl's restart is a changed
/// `kubectl.kubernetes.io/restartedAt` template annotation
/// (pkg/polymorphichelpers/objectrestarter.go), applied when kubectl
/// returns: the Deployment read after it is at the restart's generation or
/// later.
pub async fn rollout_restart(s: &Scenario, ready: i32) {
    // Listed before the restart: listed after it, new pods could be among
    // them and "replaced" would never hold (seen in CI).
    let old: Vec<String> = s.pods(APP).await.into_iter().filter_map(|p| p.metadata.name).collect();
    let mut kubectl = tokio::process::Command::from(s.env.kubectl());
    let deployment = format!("deployment/{DEPLOYMENT}");
    kubectl.args(["-n", &s.ns, "rollout", "restart", &deployment]);
    let out = kubectl.output().await.expect("running kubectl");
    assert!(
        out.status.success(),
        "kubectl rollout restart {deployment}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let deployments = s.api::<Deployment>();
    let restarted = deployments.get(DEPLOYMENT).await.expect("the restarted Deployment");
    let generation = restarted.metadata.generation;
    wait_for("the rollout restart complete, every pod replaced", ROLLOUT, || async {
        let deployment = deployments.get(DEPLOYMENT).await.ok()?;
        let status = deployment.status?;
        let replicas = deployment.spec.replicas.unwrap_or(1);
        let pods = s.pods(APP).await;
        let replaced = pods
            .iter()
            .all(|p| p.metadata.name.as_ref().is_some_and(|n| !old.contains(n)));
        (replaced
            && pods.len() == replicas as usize
            && status.observed_generation >= generation
            && status.updated_replicas == Some(replicas)
            && status.replicas == Some(replicas)
            && status.ready_replicas == Some(ready))
        .then_some(())
    })
    .await;
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

/// Waits until DistributedLease `lease` has condition `type_` with
/// `status`; the condition's message.
pub async fn lease_condition(s: &Scenario, lease: &str, type_: &str, status: &str, within: Duration) -> String {
    let leases: Api<DistributedLease> = s.api();
    wait_for(&format!("{lease}: {type_}={status}"), within, || async {
        let found = leases
            .get(lease)
            .await
            .ok()?
            .status?
            .conditions
            .into_iter()
            .find(|c| c.type_ == type_)?;
        (found.status == status).then_some(found.message)
    })
    .await
}

/// `leasehold transfer LEASE --to POD -n NS --wait` as a user runs it, on
/// the cluster's kubeconfig: (exit code, stdout, stderr). It waits 90 s for
/// the leader's answer: the drain (5 s), the window (D, 15 s at most here)
/// and the target's acquire, with room. Not blocking: the watchers run on
/// the test's thread.
pub async fn transfer(s: &Scenario, to: &str) -> (i32, String, String) {
    let mut command = tokio::process::Command::from(s.env.leasehold());
    command.args(["transfer", LEASE, "--to", to, "-n", &s.ns, "--wait", "--timeout", "90s"]);
    let out = command.output().await.expect("running leasehold transfer");
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    let code = out
        .status
        .code()
        .expect("leasehold transfer exited, not killed by a signal");
    (code, text(&out.stdout), text(&out.stderr))
}

/// A candidate other than `leader` the operator accepts as a transfer's
/// target: not being deleted, its containers ready and its sidecar
/// reporting its store reached (else `TargetCannotReachStore`; a pod just
/// started, restarted or healed from a cut shows False until its next
/// store call answers).
pub async fn transferable_follower(s: &Scenario, leader: &str) -> Option<String> {
    use leasehold::api::contract::{containers_ready_since, store_reachable};
    s.pods(APP)
        .await
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| containers_ready_since(p).is_some() && store_reachable(p))
        .filter_map(|p| p.metadata.name)
        .find(|p| p != leader)
}
