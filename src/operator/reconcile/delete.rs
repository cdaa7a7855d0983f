//! A delete: release the row by check-and-set only when its holder is
//! gone, then (in the caller) drop the finalizer.

use std::time::Duration;

use kube::Resource;
use kube::runtime::events::EventType;
use tracing::{info, warn};

use super::holder::HolderPod;
use super::{Context, Error, RELEASE_PATIENCE, Result};
use crate::api::{DistributedLease, ValidStore, validate};
use crate::lease::StoreError;

/// On delete: frees the row by check-and-set with the holder and token just
/// read, so a new resource with the same lock starts clean, but only when
/// the holder is gone: a live holder whose pod still runs keeps its lease
/// (its sidecar still believes it leads, and releases on its own shutdown
/// after its work stopped, S8); deleting the resource then just drops the
/// finalizer.
///
/// A live holder outside this namespace is left alone too: another
/// cluster's or namespace's resource may name the same lock, and its leader
/// is not ours to depose. An invalid spec or a store that cannot hold the
/// table has nothing to release; an unreachable store keeps the finalizer
/// until it answers, for [`RELEASE_PATIENCE`] after the delete.
pub(super) async fn release_on_delete(lease: &DistributedLease, namespace: &str, ctx: &Context) -> Result<()> {
    match try_release_on_delete(lease, namespace, ctx).await {
        Err(Error::Release { lock, source }) if deleted_for(lease) >= RELEASE_PATIENCE => {
            warn!(%lock, error = %source.chain(), "store unreachable since the delete; the row expires after D");
            ctx.publish(
                lease,
                EventType::Warning,
                "ReleaseSkipped",
                "Release",
                format!(
                    "could not release lock {lock} for {}: {source}; it expires by itself after the lease duration",
                    humantime::format_duration(RELEASE_PATIENCE)
                ),
            )
            .await;
            Ok(())
        }
        other => other,
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

async fn try_release_on_delete(lease: &DistributedLease, namespace: &str, ctx: &Context) -> Result<()> {
    let Ok(valid) = validate(lease) else {
        info!("invalid spec: no lock row to release");
        return Ok(());
    };
    if valid.partitions.is_some() {
        // Each candidate frees its partitions when it stops (closing its
        // session); a dead candidate's expire with its session and are
        // collected. There is no row of the resource's own to release.
        info!("partitioned: the candidates' sessions free the partitions");
        return Ok(());
    }
    if valid.store == ValidStore::Kubernetes {
        // The operator only reads Leases (operator::rbac::STORE_RULES); a
        // dead holder's Lease expires D after its last renewal.
        info!("Kubernetes store: the operator does not write Leases; a dead holder's expires by itself");
        return Ok(());
    }
    let observed = async {
        let (_, store) = ctx.store_of(&valid, namespace).await?;
        let observed = store.observe(&valid.lock).await?;
        Ok((store, observed))
    }
    .await;
    let (store, observed) = match observed {
        Ok(found) => found,
        Err(e @ StoreError::Invalid { .. }) => {
            warn!(error = %e.chain(), "store cannot hold the lock; nothing to release");
            return Ok(());
        }
        Err(source) => {
            return Err(Error::Release {
                lock: valid.lock,
                source,
            });
        }
    };
    let Some((holder, token)) = observed
        .record
        .as_ref()
        .and_then(|record| Some((record.holder.clone()?, record.token?)))
    else {
        return Ok(());
    };
    if observed.live_holder().is_some() {
        let pod = HolderPod::parse(&holder);
        if !pod.is_local(ctx.cluster.as_deref(), namespace) {
            info!(%holder, "holder belongs to another namespace or cluster; not releasing");
            return Ok(());
        }
        if let Some(name) = pod.pod()
            && ctx.pod_runs(namespace, name).await?
        {
            info!(%holder, "the holder's pod still runs; its sidecar releases the lease itself");
            return Ok(());
        }
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
            Ok(())
        }
        Err(source) => Err(Error::Release {
            lock: valid.lock,
            source,
        }),
    }
}
