//! Faults with the watcher on: each ends with exactly one leader again
//! within a generous liveness bound (how fast is the benchmark's).

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::DeleteParams;
use leasehold::lease::LeaseRecord;
use leasehold::store::StoreUrl;
use leasehold::store::postgres::{PostgresConfig, PostgresStore};
use leasehold::testing::servers::PostgresServer;
use serde_json::json;

use crate::e2e::cluster::{Scenario, scenario, wait_for};
use crate::e2e::fixtures::{
    FIRST_LEADER, LEASE, SIDECAR, SUCCESSOR, delete_now, exec_app, leader_only_service, leader_only_service_on,
};
use crate::e2e::node::{Partition, kill_and_await_restart, signal_container};
use crate::e2e::watcher::{CLAIM_PERIOD, Claim, LeadershipWatcher};

/// After a fault: one leader, the one endpoint, its sidecar claiming the
/// lease on `/leader`, and the DistributedLease status naming that claim's
/// full identity (pod, nonce, pod UID) and token; returns the leader and
/// its claim.
pub async fn converges(
    s: &Scenario,
    watcher: &LeadershipWatcher,
    other_than: Option<&str>,
    within: Duration,
) -> (String, Claim) {
    converges_past(s, watcher, other_than, None, within).await
}

/// [`converges`] to a claim other than `past` (another holder or term).
pub async fn converges_past(
    s: &Scenario,
    watcher: &LeadershipWatcher,
    other_than: Option<&str>,
    past: Option<&Claim>,
    within: Duration,
) -> (String, Claim) {
    let started = std::time::Instant::now();
    let leases: kube::Api<leasehold::api::DistributedLease> = s.api();
    loop {
        let leader = watcher.one_leader(other_than, within).await;
        let uid = s.api::<Pod>().get(&leader).await.ok().and_then(|p| p.metadata.uid);
        let status = leases.get("scheduler").await.ok().and_then(|l| l.status);
        let claim = watcher.claim_of(&leader);
        if let (Some(uid), Some(status), Some(claim)) = (uid, status, claim) {
            let whole = claim.holder.contains(&format!("/{leader}#")) && claim.holder.ends_with(&format!("@{uid}"));
            let named = status.holder.as_deref() == Some(claim.holder.as_str())
                && status.token.as_deref() == Some(claim.token.as_str());
            let new = past.is_none_or(|p| p.holder != claim.holder || p.term != claim.term);
            if whole && named && new {
                return (leader, claim);
            }
        }
        assert!(
            started.elapsed() < within,
            "one leader whose /leader claim, pod UID and lease status agree{}: not within {within:?}",
            if past.is_some() { ", past the fault" } else { "" }
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The lease's D (leaseDuration), R (renewDeadline) and P (retryPeriod),
/// as its spec has them.
pub async fn lease_timing(s: &Scenario) -> (Duration, Duration, Duration) {
    let lease = s
        .api::<leasehold::api::DistributedLease>()
        .get(LEASE)
        .await
        .expect("the lease");
    let parse = |field: &'static str, text: &str| {
        leasehold::lease::timing::parse_duration(field, text).unwrap_or_else(|e| panic!("the lease's {field}: {e}"))
    };
    (
        parse("leaseDuration", &lease.spec.lease_duration),
        parse("renewDeadline", &lease.spec.renew_deadline),
        parse("retryPeriod", &lease.spec.retry_period),
    )
}

pub fn token(claim: &Claim) -> u128 {
    claim
        .token
        .parse()
        .unwrap_or_else(|e| panic!("token {:?}: {e}", claim.token))
}

/// What the design allows after the leader's process or app failed: the
/// same pod took its lease over or acquired it again (the next term), or
/// another pod leads; either way with a higher token.
fn released_taken_over_or_moved(before: (&str, &Claim), after: (&str, &Claim)) {
    let ((old, was), (new, is)) = (before, after);
    assert!(token(is) > token(was), "the token rose: {was:?} then {is:?}");
    if old == new {
        assert_eq!(
            is.term,
            was.term + 1,
            "the same pod leads the next term: {was:?} then {is:?}"
        );
    }
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
    let (leader, was) = converges(&s, &watcher, None, FIRST_LEADER).await;
    kill_and_await_restart(&s, &leader, SIDECAR).await;
    let (now, is) = converges_past(&s, &watcher, None, Some(&was), SUCCESSOR).await;
    released_taken_over_or_moved((&leader, &was), (&now, &is));
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
    let (second, _) = converges(&s, &watcher, Some(&leader), SUCCESSOR + Duration::from_secs(30)).await;
    // At once: the README's promise, another leads within D + P of the
    // delete (the lease expires at most D after the last renewal, which
    // came before the delete, and a follower polls every P). The margin
    // covers reading the claim (the watcher reads /leader every
    // CLAIM_PERIOD) and the follower's acquire round trip to the store.
    let (duration, _, retry) = lease_timing(&s).await;
    let bound = duration + retry + CLAIM_PERIOD + Duration::from_secs(1);
    let deleted = std::time::Instant::now();
    delete_now(&s, &second).await;
    let (third, _) = converges(&s, &watcher, Some(&second), SUCCESSOR).await;
    let claimed = watcher.claimed_after(&third, deleted).expect("the successor's claim");
    let took = claimed - deleted;
    assert!(
        took <= bound,
        "{third} claimed the lease {took:?} after the leader was deleted at once: more than D + P \
         ({duration:?} + {retry:?}) with its margin ({bound:?})"
    );
    eprintln!("deleted at once: {third} led {took:?} later (bound {bound:?})");
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
    let (leader, was) = converges(&s, &watcher, None, FIRST_LEADER).await;
    kill_and_await_restart(&s, &leader, "app").await;
    let (now, is) = converges_past(&s, &watcher, None, Some(&was), SUCCESSOR).await;
    released_taken_over_or_moved((&leader, &was), (&now, &is));
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
    let (successor, _) = converges(&s, &watcher, Some(&leader), SUCCESSOR).await;
    signal_container(&s, &leader, SIDECAR, "CONT").await;
    // The resumed sidecar finds its lease lost and stays a follower.
    let (after, _) = converges(&s, &watcher, None, SUCCESSOR).await;
    assert_eq!(
        after, successor,
        "leadership stays with the successor after the old leader resumes"
    );
    watcher.finish();
}

/// Scenarios that disturb the whole cluster (the API server stopped):
/// nextest runs them alone, where no other test uses the cluster.
mod disruptive {
    use super::*;

    #[tokio::test]
    async fn the_api_server_stopped_for_30_seconds() {
        scenario("e2e-fault-apiserver", api_server_stopped).await;
    }

    #[tokio::test]
    async fn the_kubelet_stopped_for_60_seconds() {
        scenario("e2e-fault-kubelet", kubelet_stopped).await;
    }
}

/// The kubelet stopped: the pods keep running (their containers are
/// containerd's, not the kubelet's) and keep electing through the store,
/// while nothing of the node is reported (the node controller marks its
/// pods not ready after its grace period: kube-controller-manager
/// `--node-monitor-grace-period`). No second leader meanwhile, and once it
/// returns one leader with a consistent label, endpoint and status, the
/// same pods as before.
async fn kubelet_stopped(s: Scenario) {
    let (_store, watcher) = leader_only_service(&s, json!({})).await;
    converges(&s, &watcher, None, FIRST_LEADER).await;
    let pods = |list: Vec<Pod>| list.into_iter().filter_map(|p| p.metadata.uid).collect::<Vec<_>>();
    let before = pods(s.pods(crate::e2e::fixtures::APP).await);
    let stopped = s.env.stop_component("kubelet");
    // The fault took effect: `kubectl exec` goes through the kubelet.
    let leader = watcher.leaders().pop().expect("a leader");
    let exec = s
        .env
        .kubectl()
        .args(["-n", &s.ns, "exec", &leader, "-c", "app", "--", "/bin/busybox", "true"])
        .output()
        .expect("running kubectl");
    assert!(!exec.status.success(), "kubectl exec answered with the kubelet stopped");
    tokio::time::sleep(Duration::from_secs(60)).await;
    stopped.start();
    converges(&s, &watcher, None, Duration::from_secs(120)).await;
    assert_eq!(
        pods(s.pods(crate::e2e::fixtures::APP).await),
        before,
        "the same pods ran throughout"
    );
    watcher.finish();
}

/// The API server stopped: the watches fail (gaps the watcher records),
/// while the claim readers (inside the pods) and the store's own record
/// check leadership across them.
async fn api_server_stopped(s: Scenario) {
    let (store, watcher) = leader_only_service(&s, json!({})).await;
    let (_, was) = converges(&s, &watcher, None, FIRST_LEADER).await;
    let before = store_record(&s, &store).await;
    let stopped = s.env.stop_component("kube-apiserver");
    // The fault took effect: a request fails.
    wait_for(
        "a request to the stopped API server failing",
        Duration::from_secs(20),
        || async { s.api::<Pod>().get_opt("any").await.is_err().then_some(()) },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    stopped.start();
    // Labels, endpoints and status converge once the API answers again,
    // and the webhook injects again (the next scenario needs it). Only on
    // PostgreSQL: on the Kubernetes store the outage is also the store's,
    // and a second API server restart in a row left the cluster's informers
    // behind for the scenarios after it (seen in CI), so that combination
    // is not run here.
    let (_, is) = converges(&s, &watcher, None, Duration::from_secs(120)).await;
    crate::e2e::cluster::injection_reaches(&s.env, &s.client, &s.ns).await;
    let after = store_record(&s, &store).await;
    let gaps = watcher.finish_across_gaps();
    assert!(!gaps.is_empty(), "the watches saw the API server stop");
    // Across the gap, from the store: the same term held all along, or a
    // later term with a higher token (PostgreSQL stayed reachable, so the
    // leader had no reason to lose it).
    let (b, a) = (&before, &after);
    assert!(
        (a.holder == b.holder && a.term == b.term && a.token == b.token) || (a.term > b.term && a.token > b.token),
        "the store's record across the outage: {b:?} then {a:?}"
    );
    if a.term == b.term {
        assert_eq!(is.holder, was.holder, "the same claim as before the outage");
    }
}

/// The lease's record as the store itself has it.
async fn store_record(s: &Scenario, store: &PostgresServer) -> LeaseRecord {
    use leasehold::store::LeaseStore;
    let config = PostgresConfig {
        url: StoreUrl::new(store.url()),
        table: leasehold::store::DEFAULT_TABLE.to_string(),
    };
    let postgres = PostgresStore::connect(config).expect("connecting to the lease's PostgreSQL");
    let observed = postgres
        .observe(&format!("{}/{LEASE}", s.ns))
        .await
        .expect("the store's record");
    observed.record.expect("a record: the lease was held")
}

/// The sum of a sidecar's `leasehold_store_failures_total` series.
fn store_failures(s: &Scenario, pod: &str) -> f64 {
    let metrics = exec_app(
        s,
        pod,
        &["/bin/busybox", "wget", "-qO-", "http://127.0.0.1:4041/metrics"],
    );
    metrics
        .lines()
        .filter(|l| l.starts_with("leasehold_store_failures_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test]
async fn the_store_restarted() {
    scenario("e2e-fault-store", |s| async move {
        let (mut store, watcher) = leader_only_service(&s, json!({})).await;
        let (leader, was) = converges(&s, &watcher, None, FIRST_LEADER).await;
        let failures = store_failures(&s, &leader);
        // Down for two of P: each sidecar calls the store meanwhile (a
        // restart at once is absorbed by the connection pool's reconnect,
        // and the sidecars see no failure), well within R.
        let (_, _, retry) = lease_timing(&s).await;
        store.restart_after(2 * retry);
        // The sidecars saw the store fail; leadership afterwards is the
        // same term, or a move with a higher token (the design's choices).
        wait_for(
            "the leader's sidecar counting the store's failure",
            SUCCESSOR,
            || async { (store_failures(&s, &leader) > failures).then_some(()) },
        )
        .await;
        let (now, is) = converges(&s, &watcher, None, SUCCESSOR).await;
        if is.term == was.term {
            assert_eq!(
                (&now, &is.holder, &is.token),
                (&leader, &was.holder, &was.token),
                "the same term"
            );
        } else {
            assert!(
                token(&is) > token(&was),
                "a later term with a higher token: {was:?} then {is:?}"
            );
        }
        watcher.finish();
    })
    .await;
}

/// The leader cut off from its PostgreSQL (its packets to the server
/// dropped inside its pod) for longer than D, the API server still
/// reachable: it stops claiming and unlabels itself by R (its deadline runs
/// from the send time of its last renewal), another leads with a higher
/// token, and after healing the old leader stays a follower. The watcher's
/// claim check covers "never two" throughout.
#[tokio::test]
async fn the_leader_cut_off_from_its_store() {
    scenario("e2e-fault-partition", |s| async move {
        let (store, watcher) = leader_only_service(&s, json!({})).await;
        let (leader, was) = converges(&s, &watcher, None, FIRST_LEADER).await;
        let (duration, renew, _) = lease_timing(&s).await;
        let partition = Partition::start(&s, &leader, (s.env.host_ip, store.port).into()).await;
        let cut = std::time::Instant::now();
        // The margin covers the label's patch and its watch event.
        wait_for(
            "the cut-off leader unlabelling itself by R",
            renew + Duration::from_secs(3),
            || async { (!watcher.leaders().contains(&leader)).then_some(()) },
        )
        .await;
        let (successor, is) = converges(&s, &watcher, Some(&leader), SUCCESSOR).await;
        assert!(token(&is) > token(&was), "a higher token: {was:?} then {is:?}");
        tokio::time::sleep((duration + Duration::from_secs(5)).saturating_sub(cut.elapsed())).await;
        partition.heal();
        let (after, _) = converges(&s, &watcher, None, SUCCESSOR).await;
        assert_eq!(after, successor, "the healed old leader stays a follower");
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
