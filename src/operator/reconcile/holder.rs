//! Where a holder identity runs: which pod, and whether in this cluster's
//! namespace.

use crate::lease::Identity;
use crate::lease::session::session_owner;

/// Where a holder identity `[cluster/][namespace/]pod#nonce` runs; a
/// holder that is not such an identity (another tool's row) runs nowhere we
/// know of.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct HolderPod(Option<Identity>);

impl HolderPod {
    pub(super) fn parse(holder: &str) -> Self {
        HolderPod(holder.parse().ok())
    }

    /// The owner of a session id ([`session_owner`]).
    pub(super) fn of_session(session: &str) -> Self {
        HolderPod(session_owner(session))
    }

    /// The holder's pod name, when the holder is an identity.
    pub(super) fn pod(&self) -> Option<&str> {
        self.0.as_ref().map(Identity::name)
    }

    /// The cluster the holder's identity names, if any.
    pub(super) fn cluster(&self) -> Option<&str> {
        self.0.as_ref().and_then(Identity::cluster)
    }

    /// Could be a pod in `namespace` of this cluster: when either side does
    /// not name its cluster, assume it is. Used before clearing a label, where
    /// the cautious answer is "maybe the holder".
    pub(super) fn may_be_local(&self, cluster: Option<&str>, namespace: &str) -> bool {
        let Some(identity) = &self.0 else { return true };
        let cluster_matches = match (identity.cluster(), cluster) {
            (Some(theirs), Some(ours)) => theirs == ours,
            _ => true,
        };
        cluster_matches && identity.namespace().is_none_or(|ns| ns == namespace)
    }

    /// Certainly a pod in `namespace` of this cluster. Used before releasing,
    /// where the cautious answer is "not ours": an unreleased lease expires.
    ///
    /// Only a cluster name on both sides proves it. Two clusters without
    /// names look alike: the default lock `<namespace>/<name>` is the same in
    /// every cluster that applies one manifest, so on a shared store a holder
    /// `prod/web-0#…` may be another cluster's live leader, and "no local pod
    /// of that name" (a StatefulSet's names repeat in every cluster) proves
    /// nothing (issue 37).
    pub(super) fn is_local(&self, cluster: Option<&str>, namespace: &str) -> bool {
        self.0.as_ref().is_some_and(|identity| {
            identity.cluster().is_some()
                && identity.cluster() == cluster
                && identity.namespace().is_none_or(|ns| ns == namespace)
        })
    }

    /// Certainly a pod of another cluster: both sides name their cluster and
    /// the names differ. What status reports as `LeaderInOtherCluster`.
    pub(super) fn cluster_elsewhere(&self, cluster: Option<&str>) -> Option<&str> {
        let theirs = self.cluster()?;
        (cluster.is_some_and(|ours| ours != theirs)).then_some(theirs)
    }
}
