//! The `LeaseTransfer` custom resource: a request that the leader of a
//! `DistributedLease` hand over to a named pod (docs/design.md, "Transfer").
//!
//! It is an object of its own so that RBAC can grant the request apart from
//! the lease (RBAC cannot grant one field of a DistributedLease). The
//! leader's sidecar acts on it and reports in its status; the store holds
//! the reservation that makes the handover safe, not this object.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Ask the leader of a DistributedLease in this namespace to hand over to one of its candidate pods.
// Two printer columns of type string are not a duplicated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[kube(
    group = "leasehold.dev",
    version = "v1alpha1",
    kind = "LeaseTransfer",
    shortname = "ltransfer",
    namespaced,
    status = "LeaseTransferStatus",
    printcolumn(name = "Lease", type_ = "string", json_path = ".spec.lease"),
    printcolumn(name = "To", type_ = "string", json_path = ".spec.to"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Reason", type_ = "string", json_path = ".status.reason"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
// A request is answered once: changing it under the leader would make its
// status describe another request.
#[x_kube(validation = Rule::new("self == oldSelf").message("a LeaseTransfer cannot be changed: create a new one"))]
#[serde(rename_all = "camelCase")]
pub struct LeaseTransferSpec {
    /// The DistributedLease, in this namespace.
    #[schemars(length(min = 1, max = 253))]
    pub lease: String,
    /// The pod to hand leadership to: a ready candidate of the lease, in this namespace.
    #[schemars(length(min = 1, max = 253))]
    pub to: String,
    /// Who asked: a person (`Manual`, the default) or the operator, because
    /// the target outranks the leader (`Preference`, docs/design.md
    /// "Preferred candidates"). The leader treats both alike, except that
    /// its release records the term's end as `Preempted` for a
    /// `Preference` and `Transferred` otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<TransferOrigin>,
}

/// Who asked for a transfer.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, JsonSchema)]
pub enum TransferOrigin {
    /// `leasehold transfer` or any other client.
    Manual,
    /// The operator: the target outranked the leader for the lease's
    /// stabilisation period.
    Preference,
}

/// Where a transfer stands.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, JsonSchema)]
pub enum TransferPhase {
    /// The leader accepted it: it stopped claiming and drains, then
    /// releases with a reservation for the target.
    Transferring,
    /// The target leads.
    Transferred,
    /// Refused, or the target did not take over; `reason` says why.
    TransferFailed,
}

impl TransferPhase {
    /// Nothing more happens to a transfer in this phase.
    pub fn is_final(self) -> bool {
        matches!(self, TransferPhase::Transferred | TransferPhase::TransferFailed)
    }
}

/// What the leader's sidecar reports.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = super::unsigned_as_int64)]
pub struct LeaseTransferStatus {
    /// Absent until a leader has looked at the request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<TransferPhase>,
    /// One CamelCase word: why the transfer failed, or how it is going.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The reason in a sentence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The target pod's UID: the store reserves the lease for this pod,
    /// never for a later pod of the same name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_uid: Option<String>,
    /// The holder that handed over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_holder: Option<String>,
    /// The term handed over from; the target leads a later one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_term: Option<u64>,
    /// The term the target leads, once it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub term: Option<u64>,
    /// When the leader accepted the request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    /// When the transfer ended (Transferred or TransferFailed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<Time>,
}

/// Why a transfer is refused or fails: the `reason` word and the Event's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransferRefusal {
    /// No pod of that name in the namespace.
    TargetNotFound,
    /// The pod is not selected by the lease, or runs no leasehold sidecar.
    NotACandidate,
    /// The pod is being deleted.
    TargetTerminating,
    /// The pod's containers are not all ready.
    TargetNotReady,
    /// The pod's sidecar does not report reaching the store, so it could
    /// not acquire the lease reserved for it.
    TargetCannotReachStore,
    /// The target already holds the lease.
    AlreadyLeads,
    /// The leader lost its lease before it could hand over.
    LeadershipLost,
    /// The leader's release failed: no reservation was written.
    ReleaseFailed,
    /// The reservation ended without the target acquiring.
    TargetDidNotAcquire,
}

impl TransferRefusal {
    pub fn reason(self) -> &'static str {
        match self {
            TransferRefusal::TargetNotFound => "TargetNotFound",
            TransferRefusal::NotACandidate => "NotACandidate",
            TransferRefusal::TargetTerminating => "TargetTerminating",
            TransferRefusal::TargetNotReady => "TargetNotReady",
            TransferRefusal::TargetCannotReachStore => "TargetCannotReachStore",
            TransferRefusal::AlreadyLeads => "AlreadyLeads",
            TransferRefusal::LeadershipLost => "LeadershipLost",
            TransferRefusal::ReleaseFailed => "ReleaseFailed",
            TransferRefusal::TargetDidNotAcquire => "TargetDidNotAcquire",
        }
    }
}
