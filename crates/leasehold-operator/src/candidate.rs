//! What the operator reads of a candidate pod, and the one place that reads
//! it from a `Pod`. The pod watch's cache keeps this instead of the pod: a
//! `Pod` takes 2.4 KiB before any of its strings, and at 30,000 pods the
//! cache held the operator over its memory budget (BENCHMARKS.md, "The
//! operator at many leases"). A reconcile reading something new of a pod
//! adds it here, where the test that converts a full pod shows it kept.

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt as _;
use kube::runtime::reflector::Lookup;

use leasehold_kubernetes::api::contract::{
    TIMING_CONDITION, containers_ready_since, injected_container, store_reachable,
};
use leasehold_kubernetes::api::preference::{self, PriorityError};

/// A candidate pod as reconciles see it: found by labels, counted by
/// conditions and phase, repaired by name and resourceVersion, mapped to a
/// Deployment by its ReplicaSet, ranked by priority and zone.
#[derive(Debug, Clone, PartialEq)]
pub struct CandidatePod {
    pub(crate) name: String,
    pub(crate) namespace: String,
    pub(crate) uid: Option<String>,
    pub(crate) resource_version: Option<String>,
    pub(crate) labels: BTreeMap<String, String>,
    /// The name of the ReplicaSet controlling the pod.
    pub(crate) replica_set: Option<String>,
    /// Exists but has finished (phase Succeeded or Failed).
    pub(crate) finished: bool,
    /// Being deleted.
    pub(crate) terminating: bool,
    /// Its `Ready` condition is True.
    pub(crate) ready: bool,
    /// See [`containers_ready_since`].
    pub(crate) containers_ready_since: Option<Timestamp>,
    /// The message of its sidecar's [`TIMING_CONDITION`] while True.
    pub(crate) timing_at_risk: Option<String>,
    /// Its sidecar reports reaching its store ([`store_reachable`]).
    pub(crate) store_reachable: bool,
    /// Carries the injected sidecar or `leasehold run`'s installer.
    pub(crate) has_sidecar: bool,
    /// From its `leasehold.dev/priority` label or annotation.
    pub priority: Result<i64, PriorityError>,
}

impl From<&Pod> for CandidatePod {
    fn from(pod: &Pod) -> Self {
        let status = pod.status.as_ref();
        let condition = |kind: &str| {
            status
                .and_then(|s| s.conditions.as_ref())
                .and_then(|conditions| conditions.iter().find(|c| c.type_ == kind && c.status == "True"))
        };
        CandidatePod {
            name: pod.name_any(),
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            uid: pod.metadata.uid.clone(),
            resource_version: pod.metadata.resource_version.clone(),
            labels: pod.labels().clone(),
            replica_set: pod
                .owner_references()
                .iter()
                .find(|o| o.kind == "ReplicaSet" && o.controller == Some(true))
                .map(|o| o.name.clone()),
            finished: finished(pod),
            terminating: pod.metadata.deletion_timestamp.is_some(),
            ready: condition("Ready").is_some(),
            containers_ready_since: containers_ready_since(pod),
            timing_at_risk: condition(TIMING_CONDITION).map(|c| c.message.clone().unwrap_or_default()),
            store_reachable: store_reachable(pod),
            has_sidecar: pod.spec.as_ref().and_then(injected_container).is_some(),
            priority: preference::priority_of(pod),
        }
    }
}

/// Whether the pod has finished (phase Succeeded or Failed): it exists but
/// no longer runs.
pub(crate) fn finished(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    matches!(phase, Some("Succeeded" | "Failed"))
}

impl CandidatePod {
    /// Its zone label, if it has one.
    pub fn zone(&self) -> Option<&str> {
        preference::zone_of(&self.labels)
    }
}

/// Lets kube's reflector store keep candidate pods, keyed as the pods are.
impl Lookup for CandidatePod {
    type DynamicType = ();

    fn kind(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("Pod")
    }

    fn group(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("")
    }

    fn version(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("v1")
    }

    fn plural(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("pods")
    }

    fn name(&self) -> Option<Cow<'_, str>> {
        Some(Cow::Borrowed(&self.name))
    }

    fn namespace(&self) -> Option<Cow<'_, str>> {
        Some(Cow::Borrowed(&self.namespace))
    }

    fn resource_version(&self) -> Option<Cow<'_, str>> {
        self.resource_version.as_deref().map(Cow::Borrowed)
    }

    fn uid(&self) -> Option<Cow<'_, str>> {
        self.uid.as_deref().map(Cow::Borrowed)
    }
}

#[cfg(test)]
mod tests;
