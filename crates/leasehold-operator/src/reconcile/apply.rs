//! The executor: applies a [`Plan`] (label repairs, Events, the status
//! write) and the finalizer patches. Every decision was made by the plan;
//! what is left here is the wire.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::{Api, Resource, ResourceExt};
use serde_json::json;
use tracing::{debug, info, warn};

use super::plan::{Note, Plan, Repair};
use super::{Context, FIELD_MANAGER, FINALIZER, RELEASED, Result};
use crate::metrics::Outcome;
use leasehold_kubernetes::api::{DistributedLease, DistributedLeaseStatus};

/// Applies `plan` to `lease`: the repairs first (each with its Event), then
/// the plan's Events, then the status. A failed repair or Event is reported
/// and left for the next reconcile; a failed status write is the
/// reconcile's error.
pub(super) async fn apply(lease: &DistributedLease, ctx: &Context, plan: Plan) -> Result<(Action, Outcome)> {
    let namespace = lease.namespace().unwrap_or_default();
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &namespace);
    for repair in &plan.repairs {
        repair_label(lease, ctx, &pods, repair).await;
    }
    for note in plan.events {
        match note.kind {
            EventType::Warning => warn!(reason = note.reason, note = %note.note, "publishing"),
            EventType::Normal => info!(reason = note.reason, note = %note.note, "publishing"),
        }
        ctx.publish(lease, note.kind, note.reason, note.action, note.note).await;
    }
    match plan.status {
        Some(status) => {
            let leases: Api<DistributedLease> = Api::namespaced(ctx.client.clone(), &namespace);
            write_status(&leases, &lease.name_any(), status).await?;
        }
        None => debug!("status unchanged"),
    }
    Ok((plan.requeue, plan.outcome))
}

impl Context {
    /// Publishes an Event; a failure is logged and counted, never fatal.
    pub(super) async fn publish(
        &self,
        lease: &DistributedLease,
        kind: EventType,
        reason: &'static str,
        action: &str,
        note: String,
    ) {
        let event = Event {
            type_: kind,
            reason: reason.into(),
            note: Some(leasehold_kubernetes::api::errors::bounded(&note)),
            action: action.into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, &lease.object_ref(&())).await {
            warn!(reason, error = %e, "could not publish event");
            self.metrics.event_failed(reason);
        }
    }
}

/// Sets a stale leader label back to `"false"`, guarded by the pod's
/// resource version: if the pod changed since the list, the patch
/// conflicts and the next reconcile decides again.
async fn repair_label(lease: &DistributedLease, ctx: &Context, pods: &Api<Pod>, repair: &Repair) {
    let Repair {
        pod,
        resource_version,
        label_key,
    } = repair;
    let patch = json!({
        "metadata": {
            "resourceVersion": resource_version,
            "labels": { label_key: "false" },
        }
    });
    let note = match pods.patch(pod, &PatchParams::default(), &Patch::Merge(&patch)).await {
        Ok(_) => {
            info!(%pod, "cleared a stale leader label");
            ctx.metrics.label_repaired();
            Note {
                kind: EventType::Normal,
                reason: "StaleLabelCleared",
                action: "RepairLabel",
                note: format!("pod {pod} had {label_key}=true without holding the lease"),
            }
        }
        Err(kube::Error::Api(status)) if status.code == 409 => {
            debug!(%pod, "pod changed since listed; deciding next time");
            return;
        }
        Err(e) => {
            let e = leasehold_kubernetes::api::errors::chain(&e);
            warn!(%pod, error = %e, "could not clear a stale leader label");
            Note {
                kind: EventType::Warning,
                reason: "LabelRepairFailed",
                action: "RepairLabel",
                note: format!("could not set {label_key}=false on pod {pod}: {e}"),
            }
        }
    };
    ctx.publish(lease, note.kind, note.reason, note.action, note.note).await;
}

/// Writes the status by server-side apply.
async fn write_status(leases: &Api<DistributedLease>, name: &str, status: DistributedLeaseStatus) -> Result<()> {
    let patch = json!({
        "apiVersion": DistributedLease::api_version(&()),
        "kind": DistributedLease::kind(&()),
        "status": status,
    });
    leases
        .patch_status(name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&patch))
        .await?;
    Ok(())
}

/// A deleted resource whose finalizer waits ([`super::delete`]): the
/// `Released=False` condition and a Warning Event say what for and how to
/// override, each once per new reason (the status is written only when the
/// condition's message changed).
pub(super) async fn deletion_waits(
    leases: &Api<DistributedLease>,
    lease: &DistributedLease,
    ctx: &Context,
    why: &str,
) -> Result<()> {
    let message = format!("{why}; {}", super::delete::OVERRIDE);
    let mut status = lease.status.clone().unwrap_or_default();
    let unchanged = status
        .conditions
        .iter()
        .any(|c| c.type_ == RELEASED && c.status == "False" && c.message == message);
    if unchanged {
        debug!(%why, "the delete still waits");
        return Ok(());
    }
    info!(%why, "the delete waits");
    status.conditions.retain(|c| c.type_ != RELEASED);
    status.conditions.push(Condition {
        type_: RELEASED.into(),
        status: "False".into(),
        reason: "Waiting".into(),
        message: message.clone(),
        last_transition_time: Time(k8s_openapi::jiff::Timestamp::now()),
        observed_generation: lease.metadata.generation,
    });
    ctx.publish(lease, EventType::Warning, "DeleteWaiting", "Release", message)
        .await;
    write_status(leases, &lease.name_any(), status).await
}

/// Adds the finalizer by merge patch, guarded by the resource version so a
/// concurrent finalizer change is not lost (the conflict retries).
pub(super) async fn add_finalizer(leases: &Api<DistributedLease>, lease: &DistributedLease) -> Result<()> {
    let mut finalizers = lease.finalizers().to_vec();
    finalizers.push(FINALIZER.into());
    patch_finalizers(leases, lease, finalizers).await
}

pub(super) async fn remove_finalizer(leases: &Api<DistributedLease>, lease: &DistributedLease) -> Result<()> {
    let finalizers: Vec<String> = lease.finalizers().iter().filter(|f| *f != FINALIZER).cloned().collect();
    patch_finalizers(leases, lease, finalizers).await
}

async fn patch_finalizers(
    leases: &Api<DistributedLease>,
    lease: &DistributedLease,
    finalizers: Vec<String>,
) -> Result<()> {
    let patch = json!({
        "metadata": {
            "resourceVersion": lease.resource_version(),
            "finalizers": finalizers,
        }
    });
    leases
        .patch(&lease.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}
