//! The wire of preferred candidates: feeds [`preferred::decide`] from a
//! reconcile's look, remembers the pending step per lease, and carries out
//! a move by creating a `LeaseTransfer` with origin `Preference` (the
//! leader's sidecar does the handover, through the store's reservation).

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::api::{ObjectMeta, PostParams};
use kube::runtime::events::EventType;
use kube::{Api, Resource, ResourceExt};
use tracing::info;

use super::plan::{Found, Read};
use super::{Context, MIN_REQUEUE, Result};
use crate::preferred::{self, Candidate, Input, Step};
use leasehold_core::lease::holder::HolderPod;
use leasehold_kubernetes::api::DistributedLease;
use leasehold_kubernetes::api::transfer::{LeaseTransfer, LeaseTransferSpec, TransferOrigin, TransferPhase};

/// What the reconcile does about preference.
#[derive(Debug, Default)]
pub(super) struct Preferred {
    /// `Some(after)` when a move is pending or was asked for and the look
    /// must come again by then (no sooner than the plan's own requeue would
    /// be needed: at most P).
    pub wake: Option<Duration>,
    /// Why the preferred candidate is not offered leadership yet after
    /// failed transfers to it, for the `PreferenceHeldOff` condition.
    pub held_off: Option<String>,
}

pub(super) async fn act(lease: &DistributedLease, ctx: &Context, found: &Found, now: Timestamp) -> Result<Preferred> {
    let key = format!("{}/{}", lease.namespace().unwrap_or_default(), lease.name_any());
    let Found::Valid(seen) = found else {
        ctx.forget_preference(&key);
        return Ok(Preferred::default());
    };
    let Ok(Read::Lease(observed)) = &seen.read else {
        ctx.forget_preference(&key);
        return Ok(Preferred::default());
    };
    let namespace = lease.namespace().unwrap_or_default();
    let zones = &seen.valid.preference.zones;
    let candidates: Vec<Candidate> = seen.candidates.iter().map(|pod| Candidate::of(pod, zones)).collect();
    warn_unparsable(lease, ctx, &key, &candidates).await;
    let holder = observed.live_holder();
    let holder_pod = holder.map(HolderPod::parse);
    // The leader among the candidates: by name, and by UID where the
    // holder's identity carries one (a namesake is another pod).
    let leader = holder
        .zip(holder_pod.as_ref())
        .filter(|(_, pod)| pod.may_be_local(ctx.cluster.as_deref(), &namespace))
        .filter(|(_, pod)| {
            pod.pod_uid()
                .is_none_or(|_| candidates.iter().any(|c| pod.is_pod(&c.name, Some(&c.uid))))
        })
        .and_then(|(holder, pod)| Some((holder, pod.pod()?)));
    let mut input = Input {
        candidates: &candidates,
        leader,
        term: observed.record.as_ref().map_or(0, |r| r.term),
        prefer: seen.valid.versions.prefer,
        stabilization: seen.valid.preference.stabilization,
        transfer_open: false,
    };
    let previous = ctx.preference(&key);
    let mut decision = preferred::decide(&input, previous.as_ref(), now);
    let transfers: Api<LeaseTransfer> = Api::namespaced(ctx.client.clone(), &namespace);
    let mut held_off = None;
    if let Step::Transfer { .. } = decision.step {
        // Only now are the transfers worth an API call: a manual transfer
        // in flight wins, one handover runs at a time, and a target whose
        // transfers failed waits its backoff.
        let name = lease.name_any();
        let term = input.term;
        let listed = transfers.list(&Default::default()).await?.items;
        input.transfer_open = listed.iter().any(|t| t.spec.lease == name && holds_off(t, term));
        decision = preferred::decide(&input, previous.as_ref(), now);
        if let Step::Transfer { target } = &decision.step
            && let Some(candidate) = candidates.iter().find(|c| &c.name == target)
            && let Some(backoff) = preferred::backoff(&listed, &name, candidate)
        {
            let stabilization = seen.valid.preference.stabilization;
            let until = backoff.until(stabilization);
            if let Ok(left) = Duration::try_from(until.duration_since(now))
                && !left.is_zero()
            {
                held_off = Some(format!(
                    "{target} is preferred, but {} preference transfer(s) to it failed since the lease last handed \
                     over (the last: {} at {}); it is offered leadership again at {until}: the wait doubles from \
                     preferenceStabilization ({}) up to {}, and each failed offer can leave the lease without a \
                     leader for at most one reservation (leaseDuration, {})",
                    backoff.failures,
                    backoff.reason,
                    backoff.last,
                    humantime::format_duration(stabilization),
                    humantime::format_duration(preferred::BACKOFF_MAX),
                    humantime::format_duration(seen.valid.timing.lease_duration),
                ));
                decision.step = Step::Wait {
                    target: target.clone(),
                    after: left,
                };
            }
        }
    }
    ctx.remember_preference(&key, decision.pending.clone());
    let wake = |after: Duration| Some(after.min(seen.valid.timing.retry_period).max(MIN_REQUEUE));
    match decision.step {
        Step::Stay => Ok(Preferred::default()),
        // Never later than the plan's own requeue, which is P at the soonest.
        Step::Wait { after, .. } => Ok(Preferred {
            wake: wake(after),
            held_off,
        }),
        Step::Transfer { target } => {
            let request = preference_transfer(lease, &target);
            transfers.create(&PostParams::default(), &request).await?;
            let note = format!(
                "{target} has outranked the leader for {:?}: asked the leader to hand over (LeaseTransfer, origin Preference)",
                seen.valid.preference.stabilization
            );
            info!(%target, "preferred candidate: transfer requested");
            ctx.publish(lease, EventType::Normal, "PreferredCandidate", "Transfer", note)
                .await;
            // Forget the step: the open transfer holds the next looks off,
            // and a failed one starts a new period.
            ctx.remember_preference(&key, None);
            Ok(Preferred {
                wake: Some(MIN_REQUEUE),
                held_off: None,
            })
        }
    }
}

/// Whether `request` holds a preference move off, given the read's `term`:
/// it is still open, or it already handed that term over. The read comes
/// from the observer's cache, up to P old: right after a handover it can
/// still show the old leader, and asking again then only earns a refusal
/// (`AlreadyLeads`) and its Warning (seen on the real cluster:
/// tests/e2e/steering.rs).
fn holds_off(request: &LeaseTransfer, term: u64) -> bool {
    let status = request.status.as_ref();
    match status.and_then(|s| s.phase) {
        Some(TransferPhase::Transferred) => status.and_then(|s| s.from_term).is_some_and(|from| from >= term),
        Some(TransferPhase::TransferFailed) => false,
        Some(TransferPhase::Transferring) | None => true,
    }
}

/// The request: one object per move, owned by the lease so it goes with it.
fn preference_transfer(lease: &DistributedLease, target: &str) -> LeaseTransfer {
    LeaseTransfer {
        metadata: ObjectMeta {
            generate_name: Some(format!("{}-preferred-", lease.name_any())),
            owner_references: lease.controller_owner_ref(&()).map(|owner| vec![owner]),
            ..ObjectMeta::default()
        },
        spec: LeaseTransferSpec {
            lease: lease.name_any(),
            to: target.to_string(),
            origin: Some(TransferOrigin::Preference),
        },
        status: None,
    }
}

/// A Warning Event naming every candidate whose priority does not parse,
/// once per change of that list (such a candidate is never a target, and
/// such a leader is never moved).
async fn warn_unparsable(lease: &DistributedLease, ctx: &Context, key: &str, candidates: &[Candidate]) {
    let problems: Vec<String> = candidates
        .iter()
        .filter_map(|c| c.rank.as_ref().err().map(ToString::to_string))
        .collect();
    let message = problems.join("; ");
    if ctx.warned_priorities(key, &message) && !problems.is_empty() {
        ctx.publish(lease, EventType::Warning, "InvalidPriority", "RankCandidates", message)
            .await;
    }
}
