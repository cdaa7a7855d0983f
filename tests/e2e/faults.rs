//! Faults with the watcher on: each ends with exactly one leader again
//! within a generous liveness bound (how fast is the benchmark's).

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::DeleteParams;
use serde_json::json;

use crate::cluster::{Scenario, scenario, wait_for};
use crate::fixtures::{FIRST_LEADER, SIDECAR, SUCCESSOR, delete_now, leader_only_service, leader_only_service_on};
use crate::node::{kill_and_await_restart, signal_container};
use crate::watcher::LeadershipWatcher;

/// After a fault: one leader, the one ready endpoint, and (once the status
/// caught up) the DistributedLease naming that pod as holder.
async fn converges(s: &Scenario, watcher: &LeadershipWatcher, other_than: Option<&str>, within: Duration) -> String {
    let leader = watcher.one_leader(other_than, within).await;
    let leases: kube::Api<leasehold::api::DistributedLease> = s.api();
    wait_for("the status naming the labelled leader", within, || async {
        let status = leases.get("scheduler").await.ok()?.status?;
        status.holder?.contains(&format!("/{leader}#")).then_some(())
    })
    .await;
    leader
}

#[tokio::test]
async fn the_leaders_sidecar_killed() {
    scenario("e2e-fault-sidecar", |s| sidecar_killed(s, "postgres")).await;
}

#[tokio::test]
async fn the_leaders_sidecar_killed_on_the_kubernetes_store() {
    scenario("e2e-fault-k8s-sidecar", |s| sidecar_killed(s, "kubernetes")).await;
}

async fn sidecar_killed(s: Scenario, store: &str) {
    let (_store, watcher) = leader_only_service_on(&s, store).await;
    let leader = watcher.one_leader(None, FIRST_LEADER).await;
    kill_and_await_restart(&s, &leader, SIDECAR).await;
    converges(&s, &watcher, None, SUCCESSOR).await;
    watcher.finish();
}

#[tokio::test]
async fn the_leader_pod_deleted_gracefully_and_at_once() {
    scenario("e2e-fault-delete", |s| pod_deleted(s, "postgres")).await;
}

#[tokio::test]
async fn the_leader_pod_deleted_gracefully_and_at_once_on_the_kubernetes_store() {
    scenario("e2e-fault-k8s-delete", |s| pod_deleted(s, "kubernetes")).await;
}

async fn pod_deleted(s: Scenario, store: &str) {
    let (_store, watcher) = leader_only_service_on(&s, store).await;
    let leader = watcher.one_leader(None, FIRST_LEADER).await;
    // Graceful: the app ignores SIGTERM, so the pod takes its whole
    // 30 s grace period; the successor must not wait for more than that + D.
    s.api::<Pod>()
        .delete(&leader, &DeleteParams::default())
        .await
        .expect("graceful delete");
    let second = converges(&s, &watcher, Some(&leader), SUCCESSOR + Duration::from_secs(30)).await;
    delete_now(&s, &second).await;
    converges(&s, &watcher, Some(&second), SUCCESSOR).await;
    watcher.finish();
}

#[tokio::test]
async fn the_leaders_app_container_killed() {
    scenario("e2e-fault-app", |s| app_killed(s, "postgres")).await;
}

#[tokio::test]
async fn the_leaders_app_container_killed_on_the_kubernetes_store() {
    scenario("e2e-fault-k8s-app", |s| app_killed(s, "kubernetes")).await;
}

async fn app_killed(s: Scenario, store: &str) {
    let (_store, watcher) = leader_only_service_on(&s, store).await;
    let leader = watcher.one_leader(None, FIRST_LEADER).await;
    kill_and_await_restart(&s, &leader, "app").await;
    converges(&s, &watcher, None, SUCCESSOR).await;
    watcher.finish();
}

#[tokio::test]
async fn the_leaders_sidecar_frozen_past_the_lease_duration() {
    scenario("e2e-fault-freeze", |s| sidecar_frozen(s, "postgres")).await;
}

#[tokio::test]
async fn the_leaders_sidecar_frozen_past_the_lease_duration_on_the_kubernetes_store() {
    scenario("e2e-fault-k8s-freeze", |s| sidecar_frozen(s, "kubernetes")).await;
}

async fn sidecar_frozen(s: Scenario, store: &str) {
    let (_store, watcher) = leader_only_service_on(&s, store).await;
    let leader = watcher.one_leader(None, FIRST_LEADER).await;
    signal_container(&s, &leader, SIDECAR, "STOP").await;
    // D is 15 s: past it, another candidate takes the expired lease.
    let successor = converges(&s, &watcher, Some(&leader), SUCCESSOR).await;
    signal_container(&s, &leader, SIDECAR, "CONT").await;
    // The resumed sidecar finds its lease lost and stays a follower.
    let after = converges(&s, &watcher, None, SUCCESSOR).await;
    assert_eq!(
        after, successor,
        "leadership stays with the successor after the old leader resumes"
    );
    watcher.finish();
}

#[tokio::test]
async fn the_api_server_stopped_for_30_seconds() {
    scenario("e2e-fault-apiserver", api_server_stopped).await;
}

async fn api_server_stopped(s: Scenario) {
    let (_store, watcher) = leader_only_service(&s, json!({})).await;
    watcher.one_leader(None, FIRST_LEADER).await;
    s.env.component("kube-apiserver", "stop");
    tokio::time::sleep(Duration::from_secs(30)).await;
    s.env.component("kube-apiserver", "start");
    // Labels, endpoints and status converge once the API answers again,
    // and the webhook injects again (the next scenario needs it). Only on
    // PostgreSQL: on the Kubernetes store the outage is also the store's,
    // and a second API server restart in a row left the cluster's informers
    // behind for the scenarios after it (seen in CI), so that combination
    // is not run here.
    converges(&s, &watcher, None, Duration::from_secs(120)).await;
    crate::cluster::injection_reaches(&s.env, &s.client, &s.ns).await;
    watcher.finish();
}

#[tokio::test]
async fn the_store_restarted() {
    scenario("e2e-fault-store", |s| async move {
        let (mut store, watcher) = leader_only_service(&s, json!({})).await;
        watcher.one_leader(None, FIRST_LEADER).await;
        store.restart();
        converges(&s, &watcher, None, SUCCESSOR).await;
        watcher.finish();
    })
    .await;
}

/// Issue 25: the leader's sidecar killed; the kubelet restarts it in the
/// same pod, whose new process takes its own pod's lease over (a new term,
/// the holder naming the same pod UID) instead of waiting for it to expire,
/// so leadership never leaves the pod. Needs an image with the takeover.
#[tokio::test]
async fn the_leaders_sidecar_killed_resumes_its_own_pods_lease() {
    scenario("e2e-fault-resume", |s| sidecar_resumes(s, "postgres")).await;
}

#[tokio::test]
async fn the_leaders_sidecar_killed_resumes_its_own_pods_lease_on_the_kubernetes_store() {
    scenario("e2e-fault-k8s-resume", |s| sidecar_resumes(s, "kubernetes")).await;
}

async fn sidecar_resumes(s: Scenario, store: &str) {
    let (_store, watcher) = leader_only_service_on(&s, store).await;
    let leader = watcher.one_leader(None, FIRST_LEADER).await;
    let uid = s.api::<Pod>().get(&leader).await.unwrap().metadata.uid.unwrap();
    let leases: kube::Api<leasehold::api::DistributedLease> = s.api();
    let held = |status: &leasehold::api::DistributedLeaseStatus| {
        status
            .holder
            .as_ref()
            .is_some_and(|h| h.contains(&format!("/{leader}#")) && h.ends_with(&format!("@{uid}")))
    };
    let before = wait_for("the status naming the leader's process", SUCCESSOR, || async {
        let status = leases.get("scheduler").await.ok()?.status?;
        held(&status).then_some(status)
    })
    .await;
    let moves = watcher.moves();
    kill_and_await_restart(&s, &leader, SIDECAR).await;
    wait_for("the next term held by the same pod", SUCCESSOR, || async {
        let status = leases.get("scheduler").await.ok()?.status?;
        (held(&status) && status.term == before.term.map(|t| t + 1) && status.holder != before.holder).then_some(())
    })
    .await;
    assert_eq!(watcher.one_leader(None, SUCCESSOR).await, leader, "the same pod leads");
    assert_eq!(watcher.moves(), moves, "leadership never left the pod");
    watcher.finish();
}
