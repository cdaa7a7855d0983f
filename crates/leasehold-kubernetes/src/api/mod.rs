//! The `DistributedLease` custom resource: one lock, where it is stored, its
//! timing, which pods are its candidates and how leadership is published.
//!
//! The CRDs are generated from these types (`leasehold crd`); `crds/` holds a
//! copy that a test keeps equal to the code. The schema rejects what it can
//! (duration syntax, D > R > P in CEL); [`validate`] checks everything again,
//! because a CRD installed from an older chart may not carry every rule.

// kube's `KubeSchema` derive builds each schema from a copy of the struct,
// `pub` as the original, declared inside its `JsonSchema::json_schema` (kube-
// derive 5.0 `cel_schema`); the copy is unreachable, `unreachable_pub`
// reports it at the original's name, and an allow on the struct does not
// reach the generated impl. Here for this module and `transfer`.
#![allow(unreachable_pub)]

pub mod client;
pub mod contract;
pub mod errors;
pub mod gate;
pub mod history;
pub mod preference;
pub mod transfer;
mod validate;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::{CustomResource, CustomResourceExt, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use leasehold_core::lease::timing;

pub use validate::Preference;
pub use validate::ValidationError;
pub use validate::{ValidLease, ValidStore, validate};

/// The label key leaders are published under unless the resource says otherwise.
pub const DEFAULT_LABEL_KEY: &str = "leasehold.dev/leader";

/// The CEL messages refusing a change of `spec.store` and `spec.partitions`:
/// they name the way to move a lease (docs/migrating-stores.md).
pub const STORE_IMMUTABLE: &str = "store is immutable: to move the lease to another store, delete the \
     DistributedLease, wait until it is gone (its candidates stop claiming and release first), then create it \
     with the new store; see docs/migrating-stores.md";
pub const PARTITIONS_IMMUTABLE: &str = "partitions is immutable: to change it, delete the DistributedLease, wait \
     until it is gone (its candidates stop claiming and release first), then create it with the new partitions; \
     see docs/migrating-stores.md";
/// The CEL message refusing a change of `status.storeIdentity`.
pub const STORE_IDENTITY_IMMUTABLE: &str = "storeIdentity is recorded once: the candidates campaign only on that \
     store; to move the lease, delete and re-create it (docs/migrating-stores.md)";
pub use leasehold_stores::DEFAULT_TABLE;

/// Go-style durations that both the API server's CEL `duration()` and
/// `humantime` accept: integer amounts with units, e.g. `15s`, `1m30s`, `1500ms`.
const DURATION_PATTERN: &str = r"^([0-9]+(ns|us|ms|s|m|h))+$";

/// A lock elected among the pods the selector matches, stored in Cloud Spanner, PostgreSQL or Redis.
// Two printer columns of type string are not a duplicated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Debug, Clone, PartialEq)]
#[kube(
    group = "leasehold.dev",
    version = "v1alpha1",
    kind = "DistributedLease",
    shortname = "dlease",
    namespaced,
    status = "DistributedLeaseStatus",
    printcolumn(name = "Holder", type_ = "string", json_path = ".status.holder"),
    printcolumn(name = "Cluster", type_ = "string", json_path = ".status.holderCluster"),
    printcolumn(name = "Term", type_ = "integer", json_path = ".status.term"),
    printcolumn(name = "Version", type_ = "string", json_path = ".status.leaderVersion"),
    printcolumn(name = "Members", type_ = "integer", json_path = ".status.partitions.members"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[x_kube(
    validation = Rule::new("duration(self.renewDeadline) < duration(self.leaseDuration)")
        .message("renewDeadline must be shorter than leaseDuration: the difference is the safety gap")
        .field_path(".renewDeadline"),
    validation = Rule::new("duration(self.retryPeriod) < duration(self.renewDeadline)")
        .message("retryPeriod must be shorter than renewDeadline, or the leader cannot renew in time")
        .field_path(".retryPeriod"),
    validation = Rule::new("duration(self.retryPeriod) > duration('0s')")
        .message("retryPeriod must be greater than zero")
        .field_path(".retryPeriod"),
    // The field's own `self == oldSelf` runs only when both versions have
    // it; this transition rule on the parent catches adding and removing.
    validation = Rule::new("has(self.lockName) == has(oldSelf.lockName)")
        .message("lockName cannot be added or removed: create a new resource for another lock")
        .field_path(".lockName"),
    // What a candidate campaigns on never changes under it (issue 40): a
    // running sidecar cannot move its lease, and one that restarted would
    // campaign on the new store while the others still claim on the old.
    // Moving is a delete and a re-create, which the operator's finalizer
    // orders (operator::reconcile::delete).
    validation = Rule::new("self.store == oldSelf.store")
        .message(STORE_IMMUTABLE)
        .field_path(".store"),
    validation = Rule::new(
        "has(self.partitions) == has(oldSelf.partitions) && (!has(self.partitions) || self.partitions == oldSelf.partitions)"
    )
        .message(PARTITIONS_IMMUTABLE)
        .field_path(".partitions"),
)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = unsigned_as_int64)]
pub struct DistributedLeaseSpec {
    /// The lock's name in the store. Resources in different clusters that
    /// name the same lock and database elect one leader across all of them.
    /// Defaults to `<namespace>/<name>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    // lease::MAX_LOCK_NAME_BYTES; the API server counts characters, the
    // validator bytes, so the validator has the last word.
    #[schemars(length(min = 1, max = 512))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("lockName is immutable: create a new resource for another lock"))]
    pub lock_name: Option<String>,
    /// Where the lease row lives.
    pub store: LeaseStoreSpec,
    /// How long the store considers a lease valid after its last renewal (D).
    #[serde(default = "default_lease_duration")]
    #[schemars(length(min = 2, max = 32), regex(pattern = DURATION_PATTERN))]
    pub lease_duration: String,
    /// How long a leader keeps claiming without a successful renewal (R < D).
    #[serde(default = "default_renew_deadline")]
    #[schemars(length(min = 2, max = 32), regex(pattern = DURATION_PATTERN))]
    pub renew_deadline: String,
    /// How often the leader renews and followers poll (P < R).
    #[serde(default = "default_retry_period")]
    #[schemars(length(min = 2, max = 32), regex(pattern = DURATION_PATTERN))]
    pub retry_period: String,
    /// The candidate pods, in the resource's namespace. Must not be empty:
    /// the operator rewrites the leader label on the pods it selects.
    pub selector: LabelSelector,
    /// How leadership is published on the candidate pods.
    #[serde(default)]
    pub publishing: PublishingSpec,
    /// Which version of the candidates leads during a rolling update.
    #[serde(default)]
    pub leadership: LeadershipSpec,
    /// Zones in order of preference, matched against each candidate's
    /// `topology.kubernetes.io/zone` label: leadership moves, by a transfer,
    /// to a ready candidate that outranks the leader (priority first, from
    /// the pod's `leasehold.dev/priority`, then zone) for longer than
    /// `preferenceStabilization` (docs/design.md, "Preferred candidates").
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), inner(length(min = 1, max = 63)))]
    pub prefer_zones: Vec<String>,
    /// How long a candidate must outrank the leader, ready all the time,
    /// before leadership moves to it (default 30s; at least retryPeriod).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 2, max = 32), regex(pattern = DURATION_PATTERN))]
    pub preference_stabilization: Option<String>,
    /// Share the work as this many partitions instead of electing one
    /// leader: every candidate holds about N/M of them (M live candidates),
    /// each with its own fencing token (docs/partitions.md). Needs a store
    /// with sessions: Spanner, PostgreSQL or Redis. Absent: a plain single
    /// lock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    // lease::MAX_PARTITIONS
    #[schemars(range(min = 1, max = 1024))]
    pub partitions: Option<u32>,
    /// How many entries `status.history` keeps (the newest terms and gaps).
    #[serde(default = "default_history_limit")]
    // history::MAX_HISTORY_LIMIT
    #[schemars(range(max = 100))]
    pub history_limit: u32,
}

/// Version-aware leadership (docs/versions.md). A candidate's version is its
/// ReplicaSet's `deployment.kubernetes.io/revision` (or `--revision`); the
/// defaults keep leadership version-blind.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LeadershipSpec {
    /// `None`: any candidate may lead. `Newest`: a leader hands over once to
    /// a healthy candidate of a newer revision, and older candidates do not
    /// campaign while a newer one is live. `Oldest`: the mirror image.
    #[serde(default)]
    pub prefer: leasehold_core::lease::Prefer,
    /// Once a revision has led, a lower revision never acquires the lease
    /// again (checked by the store in the acquiring transaction).
    #[serde(default)]
    pub version_fence: bool,
}

/// The lease store: exactly one of Cloud Spanner, PostgreSQL (or
/// CockroachDB), Redis and Kubernetes Leases. Credentials for PostgreSQL and
/// Redis come from a Secret the resource names, never from the resource itself.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, KubeSchema)]
#[x_kube(
    validation = Rule::new("[has(self.spanner), has(self.postgres), has(self.redis), has(self.kubernetes)].filter(x, x).size() == 1")
        .message("set exactly one of spanner, postgres, redis and kubernetes"),
)]
#[serde(rename_all = "camelCase")]
pub struct LeaseStoreSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spanner: Option<SpannerStoreSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub postgres: Option<PostgresStoreSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redis: Option<RedisStoreSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes: Option<KubernetesStoreSpec>,
}

/// `coordination.k8s.io/v1` Leases in the resource's namespace, one per
/// lock: nothing to provision (docs/design.md, "The Kubernetes store").
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq, JsonSchema)]
pub struct KubernetesStoreSpec {}

/// A key of a Secret in the resource's namespace.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeyRef {
    /// The Secret's name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// The key holding the URL.
    #[serde(default = "default_url_key")]
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
}

/// PostgreSQL or CockroachDB; the URL (`postgres://user:password@host/db`)
/// is read from a Secret mounted into the sidecar.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PostgresStoreSpec {
    pub url_secret_ref: SecretKeyRef,
    /// The lease table; `--create-table` on a sidecar creates it when missing.
    #[serde(default = "default_table")]
    #[schemars(length(min = 1, max = 48), regex(pattern = r"^[A-Za-z][A-Za-z0-9_]*$"))]
    pub table: String,
}

/// Redis; the URL (`redis://:password@host:6379/0`) is read from a Secret
/// mounted into the sidecar.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RedisStoreSpec {
    pub url_secret_ref: SecretKeyRef,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SpannerStoreSpec {
    /// `projects/<project>/instances/<instance>/databases/<database>`.
    #[schemars(length(min = 1, max = 1024))]
    pub database: String,
    /// The lease table; the operator creates it when it is missing.
    #[serde(default = "default_table")]
    #[schemars(length(min = 1, max = 128), regex(pattern = r"^[A-Za-z][A-Za-z0-9_]*$"))]
    pub table: String,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PublishingSpec {
    /// The pod label set to `"true"` on the leader and `"false"` on the others.
    #[serde(default = "default_label_key")]
    #[schemars(length(min = 1, max = 317))]
    pub label_key: String,
    /// Also publish a `leasehold.dev/leader` pod condition for pods that list
    /// it as a readiness gate, so that only the leader is Ready. Standbys then
    /// count as unavailable in rollouts.
    #[serde(default)]
    pub readiness_gate: bool,
}

impl Default for PublishingSpec {
    fn default() -> Self {
        PublishingSpec {
            label_key: default_label_key(),
            readiness_gate: false,
        }
    }
}

fn default_lease_duration() -> String {
    humantime::format_duration(timing::DEFAULT_LEASE_DURATION).to_string()
}
fn default_renew_deadline() -> String {
    humantime::format_duration(timing::DEFAULT_RENEW_DEADLINE).to_string()
}
fn default_retry_period() -> String {
    humantime::format_duration(timing::DEFAULT_RETRY_PERIOD).to_string()
}
fn default_table() -> String {
    DEFAULT_TABLE.into()
}
fn default_url_key() -> String {
    "url".into()
}
fn default_history_limit() -> u32 {
    history::DEFAULT_HISTORY_LIMIT
}
fn default_label_key() -> String {
    DEFAULT_LABEL_KEY.into()
}

/// What the operator last saw; written by server-side apply.
#[derive(KubeSchema, Serialize, Deserialize, Debug, Clone, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = unsigned_as_int64)]
// Recorded once: the candidates campaign only on the store it names, so
// changing it would let a candidate on another store lead beside them.
#[x_kube(
    validation = Rule::new("!has(oldSelf.storeIdentity) || (has(self.storeIdentity) && self.storeIdentity == oldSelf.storeIdentity)")
        .message(STORE_IDENTITY_IMMUTABLE)
        .field_path(".storeIdentity"),
)]
pub struct DistributedLeaseStatus {
    /// `Valid`, `StoreReady`, `Ready`, `TimingAtRisk`, `RolloutSafe` and `RolledOut` (docs/operator.md).
    #[serde(default)]
    #[x_kube(merge_strategy = ListMerge::Map(vec!["type".into()]))]
    pub conditions: Vec<Condition>,
    /// The store the candidates campaign on, as the store itself names it
    /// (`postgres:<system identifier>/<database>/<schema>`, `redis:<marker>`,
    /// `spanner:<database>`, `kubernetes:<namespace>`): recorded by the
    /// operator at its first read of the store and never changed. A sidecar
    /// campaigns only when the store its URL reaches has this identity, so a
    /// Secret edited to reach another store elects nobody there
    /// (docs/migrating-stores.md, "The store's identity").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store_identity: Option<String>,
    /// The identity (`[cluster/]namespace/pod#nonce@uid`) holding a valid lease; absent when free or expired.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
    /// The cluster the holder runs in, when its identity names one (the
    /// sidecars' `--cluster-name`): where to route to the leader when it is
    /// not in this cluster (`Ready` reason `LeaderInOtherCluster`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder_cluster: Option<String>,
    /// Acquisitions of this lock so far; never reset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub term: Option<u64>,
    /// The fencing token of the current (or last) term, strictly increasing
    /// per lock (what it is depends on the store: Spanner's commit timestamp
    /// in ns, a sequence or counter on PostgreSQL and Redis, the replaced
    /// resourceVersion on Kubernetes), as a decimal string so that JSON
    /// readers with 53-bit numbers keep it exact.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// The store's commit time of the last acquisition or renewal (RFC 3339, nanoseconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renewed_at: Option<String>,
    /// The version the holder (or the last holder) recorded: `<name> (revision <n>)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader_version: Option<String>,
    /// The revision of `leaderVersion`, the number versions are ordered by.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader_revision: Option<u64>,
    /// Acquisitions the operator has counted since it first observed the lock.
    #[serde(default)]
    pub transitions: u64,
    /// Pods the selector matches.
    #[serde(default)]
    pub candidates: u32,
    /// Candidate pods that are Ready.
    #[serde(default)]
    pub ready_candidates: u32,
    /// Candidate pods with no leasehold sidecar, which never campaign:
    /// created while the injection webhook was down (its failurePolicy lets
    /// them through) or before their namespace opted in. Recreate them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub candidates_without_sidecar: Vec<String>,
    /// The resource generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// With `spec.partitions`: who holds which partition, from one
    /// consistent read of the store (the single-lock fields stay empty).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partitions: Option<PartitionsStatus>,
    /// The last terms, oldest first, with gap entries for terms no read saw
    /// (docs/design.md, "Leadership history"); single locks only.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<history::HistoryEntry>,
}

/// The assignment of a partitioned lease (docs/partitions.md).
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = unsigned_as_int64)]
pub struct PartitionsStatus {
    /// The number of partitions (N).
    pub count: u32,
    /// Live candidates holding a member slot (M): they share the partitions.
    pub members: u32,
    /// Partitions no live session holds.
    pub unowned: u32,
    /// The most partitions a member holds minus the fewest (0 without
    /// members); at most 1 once the members have shared them out.
    pub balance: u32,
    /// Per live session holding a member slot or a partition, by session id.
    #[serde(default)]
    pub assignment: Vec<PartitionHolder>,
}

/// What one live session holds.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = unsigned_as_int64)]
pub struct PartitionHolder {
    /// The session's pod, read from its id; absent for an id of another form.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
    /// The session id: `<identity>~<nonce>`.
    pub session: String,
    /// How many partitions it holds.
    pub count: u32,
    /// Which, as index ranges: `0-3,7`.
    pub partitions: String,
}

impl DistributedLease {
    /// The lock name in the store: `spec.lockName`, else `<namespace>/<name>`.
    pub fn lock_name(&self) -> String {
        match &self.spec.lock_name {
            Some(lock) => lock.clone(),
            None => format!(
                "{}/{}",
                self.metadata.namespace.as_deref().unwrap_or("default"),
                self.metadata.name.as_deref().unwrap_or_default()
            ),
        }
    }
}

/// schemars writes `format: uint32`/`uint64` for unsigned integers; the API
/// server knows only int32 and int64 and warns on every create of a CRD with
/// another format. int64 holds every u32 and every count we keep (`minimum: 0` stays).
fn unsigned_as_int64(schema: &mut schemars::Schema) {
    if let Some(format) = schema.get_mut("format")
        && matches!(format.as_str(), Some("uint32" | "uint64"))
    {
        *format = "int64".into();
    }
    if let Some(properties) = schema.get_mut("properties").and_then(|p| p.as_object_mut()) {
        for property in properties.values_mut() {
            if let Ok(property) = <&mut schemars::Schema>::try_from(property) {
                unsigned_as_int64(property);
            }
        }
    }
}

/// Every CustomResourceDefinition with the file in `crds/` that holds it.
pub fn crds() -> [(
    &'static str,
    k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
); 2] {
    [
        ("distributedlease.yaml", DistributedLease::crd()),
        ("leasetransfer.yaml", transfer::LeaseTransfer::crd()),
    ]
}

/// Every CustomResourceDefinition as YAML documents, as `leasehold crd` prints them.
pub fn crd_yaml() -> Result<String, serde_yaml::Error> {
    let documents = crds()
        .iter()
        .map(|(_, crd)| serde_yaml::to_string(crd))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(documents.join("---\n"))
}

#[cfg(test)]
mod tests;
