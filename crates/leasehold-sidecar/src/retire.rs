//! Retiring from a `DistributedLease` the sidecar no longer campaigns on
//! (issue 40): deleted, being deleted, recreated with another uid, or moved
//! to another lock, store or partition count ([`config::watch_lease`]).
//!
//! The order is what makes a store change safe:
//! 1. stop claiming at once and release what is held (the lease by
//!    check-and-set, or the partitions' session): the shutdown token's
//!    path, as on SIGTERM, drain included ([`super::run`]);
//! 2. only then say so: the [`RETIRED_FROM_ANNOTATION`] on our own pod,
//!    naming the uid retired from. The operator keeps that lease's
//!    finalizer until every running candidate carries it, so a resource of
//!    the same name (on another store, maybe) cannot exist while any
//!    candidate still claims under the old one;
//! 3. wait until a resource of that name with another uid exists, then
//!    re-execute this binary with the same arguments and environment: a
//!    fresh process reads the new resource, without a container restart
//!    (and the kubelet's restart backoff).
//!
//! [`config::watch_lease`]: super::config::watch_lease

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::config::Retirement;
use super::pod::{PodRef, watch_backoff};
use super::{Error, Result, capped_backoff};
use leasehold_kubernetes::api::DistributedLease;
use leasehold_kubernetes::api::contract::RETIRED_FROM_ANNOTATION;

/// Steps 2 and 3 above, once nothing is claimed or held any more. Returns
/// (for a normal exit) when a signal ends the wait; re-executes otherwise.
pub(crate) async fn retire(
    client: kube::Client,
    pod: &PodRef,
    lease: &str,
    retirement: Retirement,
    signalled: &CancellationToken,
) -> Result<()> {
    warn!(%lease, uid = %retirement.uid, why = %retirement.why, "retired from the lease: nothing claimed, nothing held");
    let pods = Api::namespaced(client.clone(), &pod.namespace);
    let marked = tokio::select! {
        marked = mark(pods, &pod.name, RETIRED_FROM_ANNOTATION, &retirement.uid) => marked,
        _ = signalled.cancelled() => return Ok(()),
    };
    if marked {
        info!(annotation = RETIRED_FROM_ANNOTATION, uid = %retirement.uid, "marked our pod retired from the lease");
    }
    info!(%lease, "waiting for the lease to be recreated");
    let successor = tokio::select! {
        uid = successor(Api::namespaced(client, &pod.namespace), lease, &retirement.uid) => uid,
        _ = signalled.cancelled() => return Ok(()),
    };
    info!(%lease, uid = %successor, "the lease was recreated: re-executing onto it");
    Err(Error::Reexec(reexec()))
}

/// Writes `annotation: value` on our own pod until the API server takes
/// it; `false` when the pod is gone (nothing left to mark).
pub(crate) async fn mark(pods: Api<Pod>, name: &str, annotation: &str, value: &str) -> bool {
    use backon::BackoffBuilder;
    let patch = Patch::Merge(json!({"metadata": {"annotations": {annotation: value}}}));
    let mut backoff = capped_backoff().build();
    loop {
        match pods.patch(name, &PatchParams::default(), &patch).await {
            Ok(_) => return true,
            Err(kube::Error::Api(status)) if status.code == 404 => return false,
            Err(e) => {
                warn!(error = %e, %annotation, "could not annotate our pod; trying again");
                tokio::time::sleep(backoff.next().unwrap_or(super::BACKOFF_CAP)).await;
            }
        }
    }
}

/// Waits until a resource named `lease` with another uid than `retired`
/// exists, and returns its uid. It can only be created once the retired
/// one is gone (names are unique).
async fn successor(leases: Api<DistributedLease>, lease: &str, retired: &str) -> String {
    let config = watcher::Config::default().fields(&format!("metadata.name={lease}"));
    let events = watcher(leases, config).backoff(watch_backoff()).applied_objects();
    let mut events = std::pin::pin!(events);
    while let Some(event) = events.next().await {
        if let Ok(resource) = event
            && let Some(uid) = resource.uid()
            && uid != retired
        {
            return uid;
        }
    }
    // The watcher retries for ever; its stream does not end.
    std::future::pending().await
}

/// This binary again, with the same arguments and environment, in this
/// process (the pod's container keeps running). Returns only on failure.
fn reexec() -> std::io::Error {
    use std::os::unix::process::CommandExt;
    let mut args = std::env::args_os();
    let arg0 = args.next().unwrap_or_else(|| "leasehold".into());
    // Open sockets (the HTTP listeners) are close-on-exec in Rust's std and
    // in tokio, so the new process can bind the same ports.
    std::process::Command::new("/proc/self/exe")
        .arg0(arg0)
        .args(args)
        .exec()
}
