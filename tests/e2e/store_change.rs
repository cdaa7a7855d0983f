//! Issue 40 on a real cluster: the walkthrough's lease on PostgreSQL with
//! three candidates, then (a) the Kubernetes-store spec applied over it,
//! refused by the CRD with the message naming the migration, and (b) the
//! documented move (docs/migrating-stores.md): delete, wait until gone,
//! create on the Kubernetes store; then back to PostgreSQL the same way.
//!
//! A claim poller reads every candidate pod's claim, every 100 ms, from its
//! sidecar's metrics port (`leasehold_is_leader`, which the sidecar sets
//! from the same state and at the same moment as its local `/leader`
//! answer; `/leader` itself listens on the pod's loopback only), and the
//! leadership watcher follows labels and the leader Service's endpoints.
//! Asserted: no poll with two claimants, no moment with two labelled
//! leaders, and after each move exactly one claimant, the holder of the
//! lock on the new store.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, Patch, PatchParams};
use leasehold::api::{DistributedLease, STORE_IMMUTABLE};
use leasehold::sidecar::publish::holder_pod;
use leasehold::store::kubernetes::lease_name;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::e2e::cluster::{Scenario, scenario, wait_for};
use crate::e2e::fixtures::{APP, FIRST_LEADER, LEASE, SERVICE};
use crate::e2e::stores::{lease, postgres_lease};
use crate::e2e::watcher::{LeadershipWatcher, Watched};

const METRICS_PORT: u16 = 4041;
const POLL_EVERY: Duration = Duration::from_millis(100);
/// A move: the sidecars see the delete at once, drain and release; the
/// operator's gate reads them; the new lease is created and the sidecars
/// re-execute onto it. Generous.
const MOVE_WITHIN: Duration = Duration::from_secs(120);

/// What the claim poller saw.
#[derive(Default)]
struct Claims {
    polls: usize,
    /// The claimants of the last poll.
    last: BTreeSet<String>,
    /// Polls that found two or more claimants, with who.
    overlaps: Vec<String>,
}

/// `leasehold_is_leader` of the sidecar at `ip`, if it answers.
async fn claims(ip: &str) -> Option<bool> {
    let read = async {
        let mut stream = tokio::net::TcpStream::connect((ip, METRICS_PORT)).await.ok()?;
        let request = format!("GET /metrics HTTP/1.1\r\nHost: {ip}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut response = String::new();
        stream.read_to_string(&mut response).await.ok()?;
        let line = response.lines().find(|l| l.starts_with("leasehold_is_leader "))?;
        Some(line.trim_end().ends_with(" 1"))
    };
    tokio::time::timeout(Duration::from_millis(500), read)
        .await
        .ok()
        .flatten()
}

/// Polls every candidate pod's claim until the returned task is aborted.
fn poll_claims(s: &Scenario, seen: Arc<Mutex<Claims>>) -> tokio::task::JoinHandle<()> {
    let pods = s.api::<Pod>();
    tokio::spawn(async move {
        loop {
            let listed = pods.list(&kube::api::ListParams::default().labels(APP)).await;
            if let Ok(listed) = listed {
                let reads = listed.items.into_iter().filter_map(|pod| {
                    let ip = pod.status.as_ref()?.pod_ip.clone()?;
                    let name = pod.metadata.name.clone()?;
                    Some(async move { (name, claims(&ip).await) })
                });
                let answers = futures::future::join_all(reads).await;
                let claimants: BTreeSet<String> = answers
                    .into_iter()
                    .filter(|(_, claim)| *claim == Some(true))
                    .map(|(name, _)| name)
                    .collect();
                let mut seen = seen.lock().unwrap();
                seen.polls += 1;
                if claimants.len() > 1 {
                    let at = seen.polls;
                    seen.overlaps.push(format!("poll {at}: {claimants:?}"));
                }
                seen.last = claimants;
            }
            tokio::time::sleep(POLL_EVERY).await;
        }
    })
}

/// Waits until one pod claims and `holder` (the pod holding the lock on the
/// new store) names it; returns it.
async fn one_claimant<F, Fut>(seen: &Arc<Mutex<Claims>>, what: &str, holder: F) -> String
where
    F: Fn() -> Fut,
    Fut: Future<Output = Option<String>>,
{
    wait_for(what, MOVE_WITHIN, || async {
        let last = seen.lock().unwrap().last.clone();
        let [claimant] = last.iter().collect::<Vec<_>>()[..] else {
            return None;
        };
        (holder().await.as_deref() == Some(claimant.as_str())).then(|| claimant.clone())
    })
    .await
}

/// Deletes the lease and waits until it is gone (its finalizer's gate
/// passed); how long that took.
async fn delete_and_wait(s: &Scenario) -> Duration {
    let leases = s.api::<DistributedLease>();
    let started = Instant::now();
    leases
        .delete(LEASE, &DeleteParams::default())
        .await
        .expect("deleting the lease");
    wait_for("the deleted lease gone", MOVE_WITHIN, || async {
        matches!(leases.get_opt(LEASE).await, Ok(None)).then_some(())
    })
    .await;
    started.elapsed()
}

#[tokio::test]
async fn moving_a_lease_between_stores_never_has_two_claimants() {
    scenario("e2e-store-change", |s| async move {
        let (_server, postgres) = postgres_lease(&s, LEASE, json!({}));
        s.apply(postgres.clone()).await;
        s.apply(s.example("leader-only-service.yaml")).await;
        // Labels and endpoints; not the lease's status, whose token starts
        // over with each new incarnation of the lease (another store).
        let watched = Watched {
            ns: &s.ns,
            pods: APP,
            service: Some(SERVICE),
            lease: None,
        };
        let watcher = LeadershipWatcher::start(&s.client, watched);
        let first = watcher.one_leader(None, FIRST_LEADER).await;
        let seen = Arc::new(Mutex::new(Claims::default()));
        let poller = poll_claims(&s, seen.clone());
        let leases = s.api::<DistributedLease>();
        let status_holder = || async {
            let lease = leases.get_opt(LEASE).await.ok()??;
            holder_pod(lease.status?.holder.as_deref()?)
        };
        let on_postgres = one_claimant(&seen, "one claimant on PostgreSQL", status_holder).await;
        assert_eq!(on_postgres, first);

        // (a) The Kubernetes-store spec over it: refused, naming the way.
        let over = json!({"spec": {"store": {"postgres": null, "kubernetes": {}}}});
        let refused = leases
            .patch(LEASE, &PatchParams::default(), &Patch::Merge(&over))
            .await
            .expect_err("changing the store in place is refused");
        assert!(refused.to_string().contains(STORE_IMMUTABLE), "{refused}");

        // (b) The documented move onto the Kubernetes store.
        let took = delete_and_wait(&s).await;
        s.apply(vec![lease(&s, LEASE, json!({"kubernetes": {}}), json!({}))])
            .await;
        let lock = format!("{}/{LEASE}", s.ns);
        let kube_leases = s.api::<Lease>();
        let lease_holder = || async {
            let held = kube_leases.get_opt(&lease_name(&lock)).await.ok()??;
            holder_pod(held.spec?.holder_identity.as_deref()?)
        };
        let on_kubernetes =
            one_claimant(&seen, "one claimant holding the Kubernetes store's Lease", lease_holder).await;
        println!("moved to the Kubernetes store: delete took {took:?}, {first} -> {on_kubernetes}");

        // And back to PostgreSQL.
        let took = delete_and_wait(&s).await;
        s.apply(postgres).await;
        let back = one_claimant(&seen, "one claimant on PostgreSQL again", status_holder).await;
        println!("moved back to PostgreSQL: delete took {took:?}, {on_kubernetes} -> {back}");

        poller.abort();
        let seen = seen.lock().unwrap();
        println!(
            "claim polls: {}, polls with two claimants: {}",
            seen.polls,
            seen.overlaps.len()
        );
        assert!(seen.polls > 0);
        assert_eq!(seen.overlaps, Vec::<String>::new(), "polls with two claimants");
        watcher.finish();
    })
    .await;
}
