//! Preferred candidates (issue 35, docs/design.md "Preferred candidates"):
//! when leadership should move to a candidate that outranks the leader.
//!
//! [`decide`] is pure: from the candidates, the leader and what was pending
//! at the last look to what is pending now and whether to ask for a
//! transfer. The reconcile keeps the pending step in memory per lease and
//! carries out a transfer by creating a `LeaseTransfer` with origin
//! `Preference`; the leader's sidecar then hands over through the store's
//! reservation, the one path by which leadership moves on request.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

use crate::candidate::CandidatePod;
use leasehold_core::lease::Prefer;
use leasehold_kubernetes::api::preference::{PriorityError, Rank, rank};
use leasehold_kubernetes::api::transfer::{LeaseTransfer, TransferOrigin, TransferPhase};

/// What one candidate looks like to the decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Candidate {
    pub name: String,
    pub uid: String,
    pub rank: Result<Rank, PriorityError>,
    /// Since when the pod's containers are ready
    /// ([`containers_ready_since`](leasehold_kubernetes::api::contract::containers_ready_since));
    /// `None` when they are not.
    pub ready_since: Option<Timestamp>,
    pub terminating: bool,
    /// Its sidecar reports reaching the store: a candidate that cannot
    /// would not acquire the lease handed to it (issue 54).
    pub store_reachable: bool,
    /// The pod's template (`pod-template-hash`, or a StatefulSet's
    /// `controller-revision-hash`): more than one among the candidates
    /// means a rollout is under way.
    pub template: Option<String>,
}

impl Candidate {
    /// The candidate as the decision sees `pod` under `prefer_zones`.
    pub(crate) fn of(pod: &CandidatePod, prefer_zones: &[String]) -> Self {
        Candidate {
            name: pod.name.clone(),
            uid: pod.uid.clone().unwrap_or_default(),
            rank: pod
                .priority
                .clone()
                .map(|priority| rank(priority, pod.zone(), prefer_zones)),
            ready_since: pod.containers_ready_since,
            terminating: pod.terminating,
            store_reachable: pod.store_reachable,
            template: pod
                .labels
                .get("pod-template-hash")
                .or_else(|| pod.labels.get("controller-revision-hash"))
                .cloned(),
        }
    }
}

/// What the decision looks at.
#[derive(Debug, Clone)]
pub(crate) struct Input<'a> {
    pub candidates: &'a [Candidate],
    /// The live holder's identity and its pod, when that pod is one of the
    /// candidates in this cluster; `None` otherwise (no leader, or one this
    /// operator cannot see: nothing to compare).
    pub leader: Option<(&'a str, &'a str)>,
    /// The term the leader holds: a new term restarts the clock.
    pub term: u64,
    pub prefer: Prefer,
    pub stabilization: Duration,
    /// A transfer of this lease is still open (not Transferred or
    /// TransferFailed), whoever asked for it, or one already handed over
    /// the term the read shows (the read predates the handover).
    pub transfer_open: bool,
}

/// A candidate that outranks the leader, and since when without a break.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Pending {
    pub leader: String,
    pub term: u64,
    pub target_uid: String,
    pub since: Timestamp,
}

/// What to do now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Step {
    /// Nothing outranks the leader, or the decision holds off (reason in
    /// the [`Decision`]).
    Stay,
    /// `target` outranks the leader; look again in `after`.
    Wait { target: String, after: Duration },
    /// `target` has outranked the leader, ready, for the whole period: ask
    /// the leader to hand over to it.
    Transfer { target: String },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Decision {
    pub step: Step,
    /// What to remember until the next look.
    pub pending: Option<Pending>,
}

impl Decision {
    fn stay() -> Self {
        Decision {
            step: Step::Stay,
            pending: None,
        }
    }
}

/// Whether to move leadership, given what was pending at the last look.
///
/// A candidate moves leadership only when it strictly outranks the leader
/// (equal ranks stay), has its containers ready, reports reaching the store
/// and is not terminating, and has been so, and
/// the best such candidate, at every look for a whole `stabilization`
/// period under the same leader and term. Any break (not ready, outranked
/// no more, another target, a new leader or term) forgets the pending step,
/// so the clock starts again (hysteresis against toggling health). It holds
/// off entirely while a transfer is open (a manual one wins, and only one
/// handover runs at a time) and, with `prefer: Newest|Oldest`, while the
/// candidates run more than one template: during a rollout, the version
/// decides who leads.
pub(crate) fn decide(input: &Input<'_>, previous: Option<&Pending>, now: Timestamp) -> Decision {
    let Some((holder, leader_pod)) = input.leader else {
        return Decision::stay();
    };
    if input.transfer_open || (input.prefer != Prefer::None && rolling_out(input.candidates)) {
        return Decision::stay();
    }
    let Some(leader) = input.candidates.iter().find(|c| c.name == leader_pod) else {
        return Decision::stay();
    };
    // A leader whose priority does not parse cannot be compared: it stays
    // (the check and the Warning name the value to fix).
    let Ok(leader_rank) = leader.rank else {
        return Decision::stay();
    };
    let best = input
        .candidates
        .iter()
        .filter(|c| c.name != leader_pod && !c.terminating && c.ready_since.is_some() && c.store_reachable)
        .filter_map(|c| Some((*c.rank.as_ref().ok()?, c)))
        .filter(|(rank, _)| *rank > leader_rank)
        // The best rank; among equals the first name, so the choice is stable.
        .max_by(|(a, x), (b, y)| a.cmp(b).then(y.name.cmp(&x.name)));
    let Some((_, target)) = best else {
        return Decision::stay();
    };
    let continued = previous
        .filter(|p| p.leader == holder && p.term == input.term && p.target_uid == target.uid)
        .map_or(now, |p| p.since);
    let since = continued.max(target.ready_since.unwrap_or(now));
    let pending = Pending {
        leader: holder.to_string(),
        term: input.term,
        target_uid: target.uid.clone(),
        since: continued,
    };
    let waited = now.duration_since(since);
    let waited = Duration::try_from(waited).unwrap_or(Duration::ZERO);
    let step = match input.stabilization.checked_sub(waited) {
        Some(left) if !left.is_zero() => Step::Wait {
            target: target.name.clone(),
            after: left,
        },
        _ => Step::Transfer {
            target: target.name.clone(),
        },
    };
    Decision {
        step,
        pending: Some(pending),
    }
}

/// The longest a target whose preference transfers failed waits before it
/// is offered leadership again.
pub(crate) const BACKOFF_MAX: Duration = Duration::from_secs(600);

/// Preference transfers to one target that failed since the lease last
/// handed over (issue 54): each may have left the lease reserved for a
/// target that did not acquire, leaderless for up to D, so the next offer
/// to it waits longer each time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Backoff {
    pub failures: u32,
    /// When the last of them ended.
    pub last: Timestamp,
    /// Its reason word (`TargetDidNotAcquire`, `TargetCannotReachStore`, …).
    pub reason: String,
}

impl Backoff {
    /// When the target may be offered leadership again: the stabilization
    /// period after the first failure, doubling with each failure after
    /// it, at most [`BACKOFF_MAX`].
    pub(crate) fn until(&self, stabilization: Duration) -> Timestamp {
        let doublings = self.failures.saturating_sub(1).min(16);
        let wait = stabilization.saturating_mul(1 << doublings).min(BACKOFF_MAX);
        self.last.checked_add(wait).unwrap_or(Timestamp::MAX)
    }
}

/// The failed preference transfers of `lease` to the pod `target` (by UID
/// where the leader recorded it, else by name) since the lease's last
/// completed handover, from the `LeaseTransfer` objects themselves, so an
/// operator that restarts backs off just the same.
pub(crate) fn backoff(transfers: &[LeaseTransfer], lease: &str, target: &Candidate) -> Option<Backoff> {
    let mut ended: Vec<(&LeaseTransfer, Timestamp)> = transfers
        .iter()
        .filter(|t| t.spec.lease == lease)
        .filter_map(|t| Some((t, t.status.as_ref()?.completed_at.as_ref()?.0)))
        .collect();
    ended.sort_by_key(|(_, at)| *at);
    let since_handover = ended
        .iter()
        .rposition(|(t, _)| phase(t) == Some(TransferPhase::Transferred))
        .map_or(0, |i| i + 1);
    let failed: Vec<&(&LeaseTransfer, Timestamp)> = ended[since_handover..]
        .iter()
        .filter(|(t, _)| {
            t.spec.origin == Some(TransferOrigin::Preference)
                && phase(t) == Some(TransferPhase::TransferFailed)
                && aimed_at(t, target)
        })
        .collect();
    let (last, at) = failed.last()?;
    Some(Backoff {
        failures: u32::try_from(failed.len()).unwrap_or(u32::MAX),
        last: *at,
        reason: last.status.as_ref().and_then(|s| s.reason.clone()).unwrap_or_default(),
    })
}

fn phase(transfer: &LeaseTransfer) -> Option<TransferPhase> {
    transfer.status.as_ref().and_then(|s| s.phase)
}

/// Whether `transfer` named `target`: its recorded UID, or its name where
/// the leader refused before recording one.
fn aimed_at(transfer: &LeaseTransfer, target: &Candidate) -> bool {
    match transfer.status.as_ref().and_then(|s| s.target_uid.as_deref()) {
        Some(uid) => uid == target.uid,
        None => transfer.spec.to == target.name,
    }
}

/// More than one template among the candidates: a rollout is under way.
fn rolling_out(candidates: &[Candidate]) -> bool {
    let mut templates = candidates.iter().filter_map(|c| c.template.as_deref());
    templates
        .next()
        .is_some_and(|first| templates.any(|other| other != first))
}

#[cfg(test)]
mod tests;
