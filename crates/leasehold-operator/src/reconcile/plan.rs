//! The pure half of a reconcile: from what was observed (the resource, its
//! candidate pods, their Deployments, the store's answer) to what to do
//! (status, Events, label repairs, requeue). No I/O, no clock: the
//! executor ([`super::apply`]) applies the plan.

use std::sync::Arc;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::ResourceExt;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;

use super::{INVALID_REQUEUE, OBSERVED_REQUEUE, ROLLED_OUT, STORE_ERROR_REQUEUE};
use crate::candidate::CandidatePod;
use crate::metrics::Outcome;
use crate::{partitions, rollout};
use leasehold_core::lease::holder::HolderPod;
use leasehold_core::lease::partitions::PartitionView;
use leasehold_core::lease::{Observation, StoreError, StoreIdentity};
use leasehold_kubernetes::api::history::{self, HistoryEntry};
use leasehold_kubernetes::api::{DistributedLease, DistributedLeaseStatus, PartitionsStatus, ValidLease};

/// What a reconcile of a live resource found, in the order it looked.
#[derive(Debug)]
pub(crate) enum Found {
    /// The spec failed validation (the message names the field): nothing
    /// else was read.
    Invalid(String),
    Valid(Box<Seen>),
}

/// What a reconcile of a valid resource found.
#[derive(Debug)]
pub(crate) struct Seen {
    pub valid: ValidLease,
    /// The candidate pods, taken from the pod watch before the store read
    /// (see the module's order of work).
    pub candidates: Vec<Arc<CandidatePod>>,
    /// Readiness-gated leases only: the candidates' Deployments.
    pub owners: Option<Result<Vec<Deployment>, kube::Error>>,
    /// The store the read went to, when it could be told
    /// ([`super::context::Target`]).
    pub store: Option<StoreSeen>,
    /// The store's answer.
    pub read: Result<Read, StoreError>,
    /// Why the preferred candidate waits after failed transfers to it
    /// (`PreferenceHeldOff`), from [`super::prefer`].
    pub held_off: Option<String>,
}

impl Found {
    /// Notes why the preferred candidate waits, if it does.
    pub(crate) fn held_off(&mut self, why: Option<String>) {
        if let Found::Valid(seen) = self {
            seen.held_off = why;
        }
    }
}

/// Which store a reconcile read.
#[derive(Debug, Clone)]
pub(crate) struct StoreSeen {
    /// Recorded as `status.storeIdentity` when none is yet.
    pub identity: StoreIdentity,
    /// The Secret reaches another store (the read went to the recorded
    /// one): `StoreReady` says so.
    pub elsewhere: Option<String>,
}

/// What a reconcile read from the store.
#[derive(Debug)]
pub(crate) enum Read {
    Lease(Observation),
    Partitions(PartitionView),
}

/// The condition shown while a preferred candidate waits out the backoff
/// after failed transfers to it (issue 54).
pub(crate) const PREFERENCE_HELD_OFF: &str = "PreferenceHeldOff";

/// What to do about one observation.
#[derive(Debug)]
pub(crate) struct Plan {
    /// The status to apply; `None` when nothing users see changed:
    /// `renewedAt` alone moves on every renewal and is refreshed only with
    /// another change, so a steady lease costs no writes (and no watch
    /// event, so no extra reconcile).
    pub status: Option<DistributedLeaseStatus>,
    /// Events to publish, in order, after the repairs.
    pub events: Vec<Note>,
    /// Candidates whose leader label goes back to `"false"`.
    pub repairs: Vec<Repair>,
    pub requeue: Action,
    pub outcome: Outcome,
}

/// One Event about the resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Note {
    pub kind: EventType,
    pub reason: &'static str,
    pub action: &'static str,
    pub note: String,
}

/// A candidate showing `label_key: "true"` that holds nothing (a sidecar
/// that died before clearing it). The patch is guarded by
/// `resource_version`: a pod that changed since the list conflicts, and the
/// next reconcile decides again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Repair {
    pub pod: String,
    pub resource_version: Option<String>,
    pub label_key: String,
}

/// The plan for `lease`, which `found` describes, at `now`; `cluster` is
/// this cluster's name (see the sidecar's cluster name).
pub(crate) fn plan(lease: &DistributedLease, cluster: Option<&str>, now: &Time, found: Found) -> Plan {
    let old = lease.status.clone().unwrap_or_default();
    let at = Conditions {
        old: &old,
        generation: lease.metadata.generation,
        now,
    };
    match found {
        Found::Invalid(message) => invalid(&at, &message),
        Found::Valid(seen) => {
            let namespace = lease.namespace().unwrap_or_default();
            observed(&at, cluster, &namespace, *seen)
        }
    }
}

/// An invalid spec is a status, not an error (no crash loop), with a slow
/// requeue: it only changes when someone edits it, which triggers a
/// reconcile anyway.
fn invalid(at: &Conditions<'_>, message: &str) -> Plan {
    let mut events = Vec::new();
    if at.changed_message("Valid", "False", message) {
        events.push(Note::warning("InvalidSpec", "Validate", message.to_string()));
    }
    let status = DistributedLeaseStatus {
        conditions: vec![
            at.condition("Valid", "False", "InvalidSpec", message),
            at.condition("StoreReady", "Unknown", "InvalidSpec", "the spec is invalid"),
            at.condition("Ready", "False", "InvalidSpec", "the spec is invalid"),
        ],
        observed_generation: at.generation,
        ..at.old.clone()
    };
    Plan {
        status: at.changed(status),
        events,
        repairs: Vec::new(),
        requeue: Action::requeue(INVALID_REQUEUE),
        outcome: Outcome::Invalid,
    }
}

/// The plan for a valid spec, whatever the store answered.
fn observed(at: &Conditions<'_>, cluster: Option<&str>, namespace: &str, seen: Seen) -> Plan {
    let Seen {
        valid,
        candidates,
        owners,
        store,
        read,
        held_off,
    } = seen;
    let mut events = Vec::new();
    let ready = candidates.iter().filter(|pod| pod.ready).count();
    let rollout = owners.as_ref().map(|owners| {
        let (condition, stall) = rollout_condition(at, owners, rollout::leader_moves_to_new(&valid));
        events.extend(stall);
        condition
    });
    let timing = timing_condition(at, &candidates);
    let valid_condition = at.condition("Valid", "True", "SpecValid", "the spec is valid");
    let counts = DistributedLeaseStatus {
        candidates: u32::try_from(candidates.len()).unwrap_or(u32::MAX),
        ready_candidates: u32::try_from(ready).unwrap_or(u32::MAX),
        candidates_without_sidecar: without_sidecar(&candidates),
        observed_generation: at.generation,
        // Recorded once (the CRD refuses a change): a Secret reaching
        // another store later is not followed (`StoreSeen::elsewhere`).
        store_identity: at
            .old
            .store_identity
            .clone()
            .or_else(|| store.as_ref().map(|s| s.identity.to_string())),
        ..at.old.clone()
    };
    let elsewhere = store.and_then(|s| s.elsewhere);
    if let Some(message) = &elsewhere
        && at.changed_message("StoreReady", "False", message)
    {
        events.push(Note::warning("SecretPointsElsewhere", "ReadLease", message.clone()));
    }
    // The store observer reconciles a lease when its lock (or a partitioned
    // lease's assignment) changes, and the pod and Deployment watches when
    // its candidates or their Deployments do.
    let requeue = Action::requeue(OBSERVED_REQUEUE);
    let read = match read {
        Ok(read) => read,
        Err(e) => {
            let (reason, message) = store_problem(&valid, &e);
            if at.changed_message("StoreReady", "False", &message) {
                events.push(Note::warning(reason, "ReadLease", message.clone()));
            }
            let status = DistributedLeaseStatus {
                conditions: [
                    valid_condition,
                    at.condition("StoreReady", "False", reason, &message),
                    at.condition("Ready", "False", "StoreNotReady", &message),
                ]
                .into_iter()
                .chain(rollout)
                .chain(owners.as_ref().map(|_| {
                    at.condition(
                        ROLLED_OUT,
                        "Unknown",
                        "StoreNotReady",
                        "the store does not say who leads",
                    )
                }))
                .chain([timing])
                .collect(),
                ..counts
            };
            // The label is not touched while the holder is unknown.
            return Plan {
                status: at.changed(status),
                events,
                repairs: Vec::new(),
                requeue: Action::requeue(STORE_ERROR_REQUEUE),
                outcome: Outcome::StoreError,
            };
        }
    };

    let observed = match read {
        Read::Lease(observed) => observed,
        Read::Partitions(view) => {
            let members: Vec<HolderPod> = view.members.iter().map(|m| HolderPod::of_session(m)).collect();
            let repairs = repairs(cluster, namespace, &candidates, &valid.label_key, &members);
            let shown = partitions::partitions_status(&view);
            if let Some(note) = partitions::assignment_change(at.old.partitions.as_ref(), &shown, &valid.lock) {
                events.push(Note::normal("PartitionsChanged", "ReadPartitions", note));
            }
            let mut status = partitioned_status(at, &valid, shown, valid_condition, counts);
            store_elsewhere(at, &mut status, elsewhere.as_deref());
            status.conditions.extend(rollout);
            status.conditions.push(timing);
            return Plan {
                status: at.changed(status),
                events,
                repairs,
                requeue,
                outcome: Outcome::Ok,
            };
        }
    };
    let holder: Vec<HolderPod> = observed.live_holder().map(HolderPod::parse).into_iter().collect();
    let repairs = repairs(cluster, namespace, &candidates, &valid.label_key, &holder);

    let mut status = observed_status(at, cluster, &valid, &observed, valid_condition, counts);
    store_elsewhere(at, &mut status, elsewhere.as_deref());
    status.conditions.extend(rollout);
    if let Some(why) = &held_off {
        // Present only while a preferred target waits out its backoff.
        status
            .conditions
            .push(at.condition(PREFERENCE_HELD_OFF, "True", "TransfersFailed", why));
    }
    if let Some(owners) = &owners {
        let leader = holder
            .first()
            // A status condition, not a release: "maybe ours" is enough,
            // and the pod must also be among this cluster's candidates.
            .filter(|h| h.may_be_local(cluster, namespace))
            .and_then(HolderPod::pod);
        status
            .conditions
            .push(rolled_out_condition(at, owners, &candidates, leader));
    }
    status.conditions.push(timing);
    if status.holder != at.old.holder {
        let note = match &status.holder {
            Some(holder) => format!(
                "lock {} is held by {holder} (term {})",
                valid.lock,
                status.term.unwrap_or(0)
            ),
            None => format!("lock {} has no live holder", valid.lock),
        };
        events.push(Note::normal("HolderChanged", "ReadLease", note));
    }
    if let Some((kind, note)) = version_move(at.old, &status, &valid.lock) {
        events.push(Note {
            kind,
            reason: "LeaderVersionChanged",
            action: "ReadLease",
            note,
        });
    }
    Plan {
        status: at.changed(status),
        events,
        repairs,
        requeue,
        outcome: Outcome::Ok,
    }
}

impl Note {
    fn normal(reason: &'static str, action: &'static str, note: String) -> Self {
        Note {
            kind: EventType::Normal,
            reason,
            action,
            note,
        }
    }

    fn warning(reason: &'static str, action: &'static str, note: String) -> Self {
        Note {
            kind: EventType::Warning,
            reason,
            action,
            note,
        }
    }
}

/// The candidates to set back to `"false"`: those that show `"true"` but are
/// none of `holders`, the lease's live holder, or for a partitioned lease
/// its members (a member may label itself while it holds partitions, and
/// one holding none yet is left alone rather than raced).
fn repairs(
    cluster: Option<&str>,
    namespace: &str,
    candidates: &[Arc<CandidatePod>],
    label_key: &str,
    holders: &[HolderPod],
) -> Vec<Repair> {
    candidates
        .iter()
        .filter(|pod| pod.labels.get(label_key).is_some_and(|v| v == "true"))
        .filter(|pod| {
            !holders
                .iter()
                .any(|holder| holder.keeps_label(&pod.name, pod.uid.as_deref(), cluster, namespace, None))
        })
        .map(|pod| Repair {
            pod: pod.name.clone(),
            resource_version: pod.resource_version.clone(),
            label_key: label_key.to_string(),
        })
        .collect()
}

/// The old status, the resource's generation and the time: what every
/// condition is built from.
struct Conditions<'a> {
    old: &'a DistributedLeaseStatus,
    generation: Option<i64>,
    now: &'a Time,
}

impl Conditions<'_> {
    /// A condition, keeping its last transition time while its status stays the same.
    fn condition(&self, kind: &str, status: &str, reason: &str, message: &str) -> Condition {
        let last_transition_time = self
            .old
            .conditions
            .iter()
            .find(|c| c.type_ == kind && c.status == status)
            .map_or_else(|| self.now.clone(), |c| c.last_transition_time.clone());
        Condition {
            type_: kind.into(),
            status: status.into(),
            reason: reason.into(),
            message: leasehold_kubernetes::api::errors::bounded(message),
            last_transition_time,
            observed_generation: self.generation,
        }
    }

    /// True unless the old status already carried this exact condition: Events
    /// for a persisting problem are published once, not on every requeue.
    fn changed_message(&self, kind: &str, status: &str, message: &str) -> bool {
        !self.old.conditions.iter().any(|c| {
            c.type_ == kind && c.status == status && c.message == leasehold_kubernetes::api::errors::bounded(message)
        })
    }

    /// `status`, when something users see differs from the old status.
    fn changed(&self, status: DistributedLeaseStatus) -> Option<DistributedLeaseStatus> {
        let visible = |s: &DistributedLeaseStatus| DistributedLeaseStatus {
            renewed_at: None,
            ..s.clone()
        };
        (visible(self.old) != visible(&status)).then_some(status)
    }
}

/// Reason and message for a store that could not be used, naming what to fix.
fn store_problem(valid: &ValidLease, error: &StoreError) -> (&'static str, String) {
    let place = valid.store.to_string();
    match error {
        StoreError::Invalid { .. } => (
            "StoreMisconfigured",
            format!("store {place} cannot be used: {}", error.chain()),
        ),
        StoreError::Unavailable { .. } | StoreError::OutcomeUnknown { .. } => {
            ("StoreUnavailable", format!("store {place}: {}", error.chain()))
        }
        StoreError::Lost { reason, .. } => ("StoreUnavailable", format!("store {place}: {reason}")),
    }
}

/// The names of the candidates that cannot campaign, sorted.
pub fn without_sidecar(candidates: &[Arc<CandidatePod>]) -> Vec<String> {
    let mut names: Vec<String> = candidates
        .iter()
        .filter(|pod| !pod.has_sidecar)
        .map(|pod| pod.name.clone())
        .collect();
    names.sort();
    names
}

/// `TimingAtRisk`: True while a candidate's sidecar reports (in its pod
/// condition [`TIMING_CONDITION`](leasehold_kubernetes::api::contract::TIMING_CONDITION)) that its renewals use more than their
/// share of R − P, naming the pods and what they measured. The sidecar
/// changes that condition only when the verdict crosses the threshold, so
/// this costs no status writes while it holds.
fn timing_condition(at: &Conditions<'_>, candidates: &[Arc<CandidatePod>]) -> Condition {
    let at_risk: Vec<String> = candidates
        .iter()
        .filter_map(|pod| Some(format!("{}: {}", pod.name, pod.timing_at_risk.as_ref()?)))
        .collect();
    match at_risk.is_empty() {
        true => at.condition(
            "TimingAtRisk",
            "False",
            "RenewalsWithinBudget",
            "no candidate reports renewals over their share of R - P",
        ),
        false => at.condition("TimingAtRisk", "True", "RenewalsSlow", &at_risk.join("; ")),
    }
}

/// The status after a successful read of the row.
fn observed_status(
    at: &Conditions<'_>,
    cluster: Option<&str>,
    valid: &ValidLease,
    observed: &Observation,
    valid_condition: Condition,
    counts: DistributedLeaseStatus,
) -> DistributedLeaseStatus {
    let old = at.old;
    let record = observed.record.as_ref();
    // An absent row is term 0, so the very first acquisition counts as a transition.
    let term = record.map_or(0, |r| r.term);
    let transitions = match old.term {
        Some(old_term) => old.transitions + term.saturating_sub(old_term),
        None => old.transitions,
    };
    let holder = observed.live_holder().map(str::to_string);
    let holder_pod = holder.as_deref().map(HolderPod::parse);
    // Ready either way: a leader is elected, and alerting on Ready=False
    // must not fire in the clusters that stand by (issue 37).
    let ready = match (
        &holder,
        holder_pod.as_ref().and_then(|pod| pod.cluster_elsewhere(cluster)),
    ) {
        (Some(holder), Some(elsewhere)) => at.condition(
            "Ready",
            "True",
            "LeaderInOtherCluster",
            &format!(
                "{holder} leads in cluster {elsewhere}; no candidate of this cluster leads, and its leader-only \
                 Service stays empty (docs/multi-cluster.md routes to the leader's cluster)"
            ),
        ),
        (Some(holder), None) => at.condition("Ready", "True", "LeaderElected", &format!("{holder} leads")),
        (None, _) => {
            let message = match record.and_then(|r| r.holder.as_deref()) {
                Some(expired) => format!("the lease of {expired} expired and no candidate has taken it"),
                None => "no candidate holds the lease".to_string(),
            };
            at.condition("Ready", "False", "NoLeader", &message)
        }
    };
    DistributedLeaseStatus {
        conditions: read_conditions(at, valid, valid_condition, ready),
        holder_cluster: holder_pod.as_ref().and_then(HolderPod::cluster).map(str::to_string),
        holder,
        term: Some(term),
        token: record.and_then(|r| r.token).map(|t| t.to_string()),
        renewed_at: record.and_then(|r| r.renewed_at).map(|t| t.to_rfc3339()),
        leader_version: record.and_then(|r| r.version.as_ref()).map(ToString::to_string),
        leader_revision: record.and_then(|r| r.version.as_ref()).map(|v| v.revision),
        transitions,
        partitions: None,
        history: history::fold(&old.history, HistoryEntry::seen(observed), valid.history_limit),
        ..counts
    }
}

/// The conditions after a successful store read: valid, the store's tables
/// ready, and `ready` as the lease's kind judges it.
fn read_conditions(
    at: &Conditions<'_>,
    valid: &ValidLease,
    valid_condition: Condition,
    ready: Condition,
) -> Vec<Condition> {
    let store_ready = at.condition("StoreReady", "True", "TableReady", &tables_ready(valid));
    vec![valid_condition, store_ready, ready]
}

/// `StoreReady` False while the lease's Secret reaches another store than
/// the recorded one, which the read came from (the rest of the status is
/// that store's: the candidates campaign there).
fn store_elsewhere(at: &Conditions<'_>, status: &mut DistributedLeaseStatus, elsewhere: Option<&str>) {
    let Some(message) = elsewhere else { return };
    for condition in &mut status.conditions {
        if condition.type_ == "StoreReady" {
            *condition = at.condition("StoreReady", "False", "SecretPointsElsewhere", message);
        }
    }
}

/// The status after a read of a partitioned lease: the assignment `shown`,
/// and `Ready` while every partition has a live owner (work may be unevenly
/// shared for a while after a join, but none is left undone). The
/// single-lock fields stay empty: there is no one leader.
fn partitioned_status(
    at: &Conditions<'_>,
    valid: &ValidLease,
    shown: PartitionsStatus,
    valid_condition: Condition,
    counts: DistributedLeaseStatus,
) -> DistributedLeaseStatus {
    let ready = match (shown.unowned, shown.members) {
        (0, members) => at.condition(
            "Ready",
            "True",
            "PartitionsOwned",
            &format!(
                "all {} partitions are owned; {members} members, balance {}",
                shown.count, shown.balance
            ),
        ),
        (unowned, 0) => at.condition(
            "Ready",
            "False",
            "NoMembers",
            &format!(
                "no live candidate is a member; {unowned} of {} partitions are unowned",
                shown.count
            ),
        ),
        (unowned, members) => at.condition(
            "Ready",
            "False",
            "PartitionsUnowned",
            &format!(
                "{unowned} of {} partitions have no live owner; {members} members",
                shown.count
            ),
        ),
    };
    DistributedLeaseStatus {
        conditions: read_conditions(at, valid, valid_condition, ready),
        holder: None,
        term: None,
        token: None,
        renewed_at: None,
        leader_version: None,
        leader_revision: None,
        partitions: Some(shown),
        ..counts
    }
}

/// The `StoreReady` message of a store that answered.
fn tables_ready(valid: &ValidLease) -> String {
    match &valid.store {
        leasehold_kubernetes::api::ValidStore::Spanner(c) => format!("table {} in {} is ready", c.table, c.database),
        other => format!("{other} is ready"),
    }
}

/// The Event when the recorded leader version changed since the last
/// status (a new version acquired), or `None`. The first sighting is no move.
fn version_move(old: &DistributedLeaseStatus, new: &DistributedLeaseStatus, lock: &str) -> Option<(EventType, String)> {
    if new.leader_version == old.leader_version || old.term.is_none() {
        return None;
    }
    let shown = |v: &Option<String>| v.clone().unwrap_or_else(|| "no version".into());
    let backwards = matches!((old.leader_revision, new.leader_revision), (Some(o), Some(n)) if n < o);
    let kind = if backwards {
        EventType::Warning
    } else {
        EventType::Normal
    };
    let note = format!(
        "leadership of lock {lock} moved from {} to {}{}",
        shown(&old.leader_version),
        shown(&new.leader_version),
        if backwards { ", an older revision" } else { "" }
    );
    Some((kind, note))
}

/// `RolledOut`, for readiness-gated leases: every candidate's Deployment
/// runs only its current revision and a candidate pod leads and is Ready.
/// `kubectl rollout status` cannot say this: only one pod is ever Ready.
fn rolled_out_condition(
    at: &Conditions<'_>,
    owners: &Result<Vec<Deployment>, kube::Error>,
    candidates: &[Arc<CandidatePod>],
    leader: Option<&str>,
) -> Condition {
    let owners = match owners {
        Ok(owners) => owners,
        Err(e) => {
            let message = format!(
                "could not read the candidates' Deployments: {}",
                leasehold_kubernetes::api::errors::chain(e)
            );
            return at.condition(ROLLED_OUT, "Unknown", "CheckFailed", &message);
        }
    };
    let pending: Vec<String> = owners.iter().filter_map(rollout::pending_rollout).collect();
    if !pending.is_empty() {
        return at.condition(ROLLED_OUT, "False", "RolloutInProgress", &pending.join("; "));
    }
    let leader_pod = leader.and_then(|name| candidates.iter().find(|p| p.name == name));
    match leader_pod {
        Some(pod) if pod.ready => at.condition(
            ROLLED_OUT,
            "True",
            "RolloutComplete",
            &format!(
                "every candidate runs its Deployment's current revision and {} leads, Ready",
                pod.name
            ),
        ),
        Some(pod) => at.condition(
            ROLLED_OUT,
            "False",
            "LeaderNotReady",
            &format!("{} leads but is not Ready yet", pod.name),
        ),
        None => at.condition(ROLLED_OUT, "False", "NoLeader", "no candidate pod holds the lease"),
    }
}

/// `RolloutSafe`, for readiness-gated leases: whether a rolling update of the
/// candidates' Deployments can make progress while only the leader is
/// Ready; with the Event a new stall warrants.
fn rollout_condition(
    at: &Conditions<'_>,
    owners: &Result<Vec<Deployment>, kube::Error>,
    leader_moves_to_new: bool,
) -> (Condition, Option<Note>) {
    match owners
        .as_ref()
        .map(|owners| rollout::stall_reasons(owners, leader_moves_to_new))
    {
        Ok(reasons) if reasons.is_empty() => (
            at.condition(
                "RolloutSafe",
                "True",
                "NoStall",
                "rolling updates of the candidates' Deployments can proceed with only the leader Ready",
            ),
            None,
        ),
        Ok(reasons) => {
            let message = reasons.join("; ");
            let note = at
                .changed_message("RolloutSafe", "False", &message)
                .then(|| Note::warning("RolloutWouldStall", "CheckRollout", message.clone()));
            (
                at.condition("RolloutSafe", "False", "RolloutWouldStall", &message),
                note,
            )
        }
        Err(e) => {
            let message = format!(
                "could not read the candidates' Deployments: {}",
                leasehold_kubernetes::api::errors::chain(e)
            );
            (at.condition("RolloutSafe", "Unknown", "CheckFailed", &message), None)
        }
    }
}

#[cfg(test)]
mod tests;
