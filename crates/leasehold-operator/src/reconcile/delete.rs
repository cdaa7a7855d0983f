//! A delete: the finalizer's gate. The finalizer goes (in the caller) only
//! once nothing can still claim under the deleted resource, so that a
//! resource of the same name created afterwards, on another store maybe,
//! cannot get a second leader while the old one still claims (issue 40).
//!
//! The gate opens when both hold:
//! 1. every candidate pod whose sidecar container is running, or that
//!    carries [`CAMPAIGNS_FOR_ANNOTATION`] naming this resource, carries
//!    [`RETIRED_FROM_ANNOTATION`] naming this resource's uid: its sidecar
//!    saw the deletion, stopped claiming and released before writing it
//!    (`sidecar::retire`). A sidecar writes the first annotation before it
//!    reads the lease, so one that read it before the deletion is in a
//!    list taken after it, even before the kubelet reports its container
//!    running; one whose annotation the list misses read the lease after
//!    the deletion and never campaigns. So a list taken after the deletion
//!    covers every candidate that could still claim;
//! 2. the store shows no live holder of the lock: released, or expired by
//!    the store's clock. A dead holder whose pod is gone is released by
//!    check-and-set (not on the Kubernetes store, whose Leases the
//!    operator only reads: there it expires). A partitioned lease: no live
//!    session of this namespace holds a member slot or a partition.
//!
//! It cannot deadlock: sidecars retire on their own as soon as their lease
//! watch sees the deletion. A sidecar that cannot see it (cut off from the
//! API server) may be leading, so waiting is the safe outcome; it converges
//! once it reconnects or its pod goes. Whoever must override it removes the
//! finalizer by hand, which is unsafe: docs/migrating-stores.md.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::runtime::events::EventType;
use kube::{Api, Resource, ResourceExt};
use tokio::time::Instant;
use tracing::{info, warn};

use super::{Context, Error, RELEASE_PATIENCE, Result};
use crate::candidate;
use leasehold_core::lease::StoreError;
use leasehold_core::lease::holder::{HolderPod, LiveHolder};
use leasehold_kubernetes::api::contract::{CAMPAIGNS_FOR_ANNOTATION, RETIRED_FROM_ANNOTATION, SIDECAR_CONTAINER};
use leasehold_kubernetes::api::{DistributedLease, ValidLease, ValidStore, validate};

/// What a deleted resource's finalizer waits for.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Gate {
    /// Nothing can claim under the resource any more: drop the finalizer.
    Open,
    /// What it waits for, for the status and the Event.
    Waiting(String),
}

/// How to override the gate, in every message that says it waits.
pub(super) const OVERRIDE: &str = "removing the finalizer leasehold.dev/release by hand skips this check and is \
                                   unsafe (docs/migrating-stores.md)";

/// The gate of a deleted resource, releasing a dead holder's row on the way.
/// An unreachable store keeps the finalizer until it answers, for
/// [`RELEASE_PATIENCE`] after the delete, and only once every candidate has
/// retired: then no live process campaigns under the old settings, and an
/// unreleased row expires by the store's clock after D.
pub(super) async fn release_on_delete(lease: &DistributedLease, namespace: &str, ctx: &Context) -> Result<Gate> {
    let Ok(valid) = validate(lease) else {
        // No candidate can have started on an invalid spec, and the fields
        // it campaigns on are immutable.
        info!("invalid spec: no lock row to release");
        return Ok(Gate::Open);
    };
    let candidates = candidates_now(&valid, namespace, ctx).await?;
    let uid = lease.uid().unwrap_or_default();
    let name = lease.name_any();
    let bound: Vec<String> = candidates
        .iter()
        .filter(|pod| (sidecar_running(pod) || campaigns_for(pod, &name)) && !retired_from(pod, &uid))
        .map(ResourceExt::name_any)
        .collect();
    if !bound.is_empty() {
        return Ok(Gate::Waiting(format!(
            "waiting for the sidecars of {} to retire from this lease (they stop claiming and release, then \
             annotate their pod {RETIRED_FROM_ANNOTATION}={uid})",
            bound.join(", ")
        )));
    }
    match holders(&valid, namespace, &candidates, lease, ctx).await {
        Err(Error::Release { lock, source }) if deleted_for(lease) >= RELEASE_PATIENCE => {
            warn!(%lock, error = %source.chain(), "store unreachable since the delete; every candidate retired, the row expires after D");
            ctx.publish(
                lease,
                EventType::Warning,
                "ReleaseSkipped",
                "Release",
                format!(
                    "could not release lock {lock} for {}: {source}; every candidate has retired, and it \
                     expires by itself after the lease duration",
                    humantime::format_duration(RELEASE_PATIENCE)
                ),
            )
            .await;
            Ok(Gate::Open)
        }
        other => other,
    }
}

/// The candidate pods as they are now: a list from the API server, not the
/// pod watch's cache. A list without a resourceVersion is served from etcd
/// by a quorum read ("Most recent", Kubernetes API concepts, resource
/// versions), so it shows every annotation written before it; the cache
/// may lag behind a sidecar's retirement or its pod's creation.
async fn candidates_now(valid: &ValidLease, namespace: &str, ctx: &Context) -> Result<Vec<Pod>> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), namespace);
    let list = pods
        .list(&ListParams::default().labels(&valid.selector.to_string()))
        .await?;
    Ok(list.items)
}

/// Whether the pod's sidecar container runs (a native sidecar or a plain
/// container), by the kubelet's last status report. A sidecar that has not
/// started yet reads the deletion at start and never campaigns.
fn sidecar_running(pod: &Pod) -> bool {
    let Some(status) = &pod.status else { return false };
    let all = status.init_container_statuses.iter().flatten();
    all.chain(status.container_statuses.iter().flatten())
        .any(|c| c.name == SIDECAR_CONTAINER && c.state.as_ref().is_some_and(|s| s.running.is_some()))
}

/// Whether the pod's sidecar said, before reading it, that it campaigns
/// for the lease `name`.
fn campaigns_for(pod: &Pod, name: &str) -> bool {
    pod.annotations()
        .get(CAMPAIGNS_FOR_ANNOTATION)
        .is_some_and(|v| v == name)
}

fn retired_from(pod: &Pod, uid: &str) -> bool {
    pod.annotations().get(RETIRED_FROM_ANNOTATION).is_some_and(|v| v == uid)
}

/// Whether the holder's pod `name` exists and has not finished, judged by
/// [`HolderPod::is_pod`] (a pod of the same name with another UID is
/// another pod: this cluster's namesake of another cluster's leader, or a
/// StatefulSet pod re-created since; issue 54). In the fresh list, or in the
/// pod watch's cache (a holder's pod may carry other labels by now).
async fn runs(candidates: &[Pod], namespace: &str, name: &str, holder: &HolderPod, ctx: &Context) -> Result<bool> {
    let listed = candidates
        .iter()
        .any(|pod| holder.is_pod(&pod.name_any(), pod.metadata.uid.as_deref()) && !candidate::finished(pod));
    Ok(listed || ctx.pod_runs(namespace, name, holder).await?)
}

/// Part 2 of the gate: the store's live holders.
async fn holders(
    valid: &ValidLease,
    namespace: &str,
    candidates: &[Pod],
    lease: &DistributedLease,
    ctx: &Context,
) -> Result<Gate> {
    let failed = |source| Error::Release {
        lock: valid.lock.clone(),
        source,
    };
    if let Some(n) = valid.partitions {
        // A read started now: the finalizer goes on what the store holds.
        let read = async {
            let target = ctx.target(lease, valid, namespace).await?;
            ctx.observe_partitions(lease, valid, namespace, &target.config, n, Some(Instant::now()))
                .await
        };
        let view = match read.await {
            Ok((view, _)) => view,
            Err(e @ StoreError::Invalid { .. }) => {
                warn!(error = %e.chain(), "store cannot hold the partitions; nothing to wait for");
                return Ok(Gate::Open);
            }
            Err(source) => return Err(failed(source)),
        };
        let mut live: Vec<&str> = view
            .members
            .iter()
            .chain(view.owners.iter().flatten())
            .map(String::as_str)
            .collect();
        live.sort_unstable();
        live.dedup();
        // Sessions of another namespace or cluster naming the same lock are
        // not bound to this resource.
        live.retain(|session| HolderPod::of_session(session).may_be_local(ctx.cluster.as_deref(), namespace));
        if live.is_empty() {
            return Ok(Gate::Open);
        }
        return Ok(Gate::Waiting(format!(
            "waiting for the sessions {} to close or expire by the store's clock: they hold partitions of lock {}",
            live.join(", "),
            valid.lock
        )));
    }
    let observed = async {
        let (_, store) = ctx.store_of(lease, valid, namespace).await?;
        let observed = store.observe(&valid.lock).await?;
        Ok((store, observed))
    }
    .await;
    let (store, observed) = match observed {
        Ok(found) => found,
        Err(e @ StoreError::Invalid { .. }) => {
            warn!(error = %e.chain(), "store cannot hold the lock; nothing to release");
            return Ok(Gate::Open);
        }
        Err(source) => return Err(failed(source)),
    };
    let Some((holder, token)) = observed
        .record
        .as_ref()
        .and_then(|record| Some((record.holder.clone()?, record.token?)))
    else {
        return Ok(Gate::Open);
    };
    let kubernetes = valid.store == ValidStore::Kubernetes;
    if observed.live_holder().is_some() {
        let pod = HolderPod::parse(&holder);
        let cluster = ctx.cluster.as_deref();
        // Asked only of a holder that may be local (judge_live's order).
        let runs_here = match pod.pod() {
            Some(name) if pod.may_be_local(cluster, namespace) => runs(candidates, namespace, name, &pod, ctx).await?,
            _ => false,
        };
        match pod.judge_live(cluster, namespace, |_| runs_here, None) {
            LiveHolder::NotOurs => {
                info!(%holder, "holder belongs to another namespace or cluster; not ours to wait for");
                return Ok(Gate::Open);
            }
            LiveHolder::Runs(name) => {
                return Ok(Gate::Waiting(format!(
                    "waiting for {holder} (pod {name}) to release lock {}: it still holds it",
                    valid.lock
                )));
            }
            // The operator only reads Leases (operator::rbac::STORE_RULES).
            LiveHolder::Unproven | LiveHolder::Gone if kubernetes => {
                return Ok(Gate::Waiting(format!(
                    "waiting for the Lease of lock {} to expire: its holder {holder} is gone, and the operator does \
                     not write Leases",
                    valid.lock
                )));
            }
            LiveHolder::Unproven => {
                info!(%holder, "holder may belong to another namespace or cluster; not releasing");
                return Ok(Gate::Open);
            }
            LiveHolder::Gone => {}
        }
    }
    if kubernetes {
        return Ok(Gate::Open);
    }
    match store.release(&valid.lock, &holder, token).await {
        Ok(()) | Err(StoreError::Lost { .. }) => {
            info!(lock = %valid.lock, %holder, "released the lock row");
            ctx.publish(
                lease,
                EventType::Normal,
                "Released",
                "Release",
                format!("released lock {} held by {holder}, whose pod is gone", valid.lock),
            )
            .await;
            Ok(Gate::Open)
        }
        Err(source) => Err(failed(source)),
    }
}

/// How long ago the resource was deleted (zero if it is not).
fn deleted_for(lease: &DistributedLease) -> Duration {
    let Some(deleted) = &lease.meta().deletion_timestamp else {
        return Duration::ZERO;
    };
    let age = k8s_openapi::jiff::Timestamp::now().duration_since(deleted.0);
    Duration::try_from(age).unwrap_or(Duration::ZERO)
}
