//! Where a holder identity runs: which pod, and whether in this cluster's
//! namespace. The operator's repairs and releases judge holders by it, and
//! the simulation's operator (`sim`, two clusters on one store) by the same
//! code.

use crate::lease::Identity;
use crate::lease::seams::LocalityFlaw;
use crate::lease::session::session_owner;

/// Where a holder identity `[cluster/][namespace/]pod#nonce` runs; a
/// holder that is not such an identity (another tool's row) runs nowhere we
/// know of.
#[derive(Debug, PartialEq, Eq)]
pub struct HolderPod(Option<Identity>);

impl HolderPod {
    pub fn parse(holder: &str) -> Self {
        HolderPod(holder.parse().ok())
    }

    /// The owner of a session id ([`session_owner`]).
    pub fn of_session(session: &str) -> Self {
        HolderPod(session_owner(session))
    }

    /// The holder's pod name, when the holder is an identity.
    pub fn pod(&self) -> Option<&str> {
        self.0.as_ref().map(Identity::name)
    }

    /// The UID of the holder's pod, when its identity carries one (`…@uid`):
    /// a pod of the same name with another UID is another pod (issue 54).
    pub fn pod_uid(&self) -> Option<&str> {
        self.0.as_ref().and_then(Identity::pod_uid)
    }

    /// Whether the pod named `name` with UID `uid` is the holder's: the
    /// name, and the UID wherever the holder's identity carries one.
    pub fn is_pod(&self, name: &str, uid: Option<&str>) -> bool {
        self.pod() == Some(name) && self.pod_uid().is_none_or(|holder| uid == Some(holder))
    }

    /// The cluster the holder's identity names, if any.
    pub fn cluster(&self) -> Option<&str> {
        self.0.as_ref().and_then(Identity::cluster)
    }

    /// Could be a pod in `namespace` of this cluster: when either side does
    /// not name its cluster, assume it is. Used before clearing a label, where
    /// the cautious answer is "maybe the holder".
    pub fn may_be_local(&self, cluster: Option<&str>, namespace: &str) -> bool {
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
    fn is_local(&self, cluster: Option<&str>, namespace: &str, flaw: Option<LocalityFlaw>) -> bool {
        self.0.as_ref().is_some_and(|identity| {
            let named = identity.cluster().is_some() || flaw == Some(LocalityFlaw::UnnamedClustersMatch);
            named && identity.cluster() == cluster && identity.namespace().is_none_or(|ns| ns == namespace)
        })
    }

    /// Whether a pod named `pod` (with UID `pod_uid`, when known) in
    /// `namespace` of this cluster keeps its leader label for this holder
    /// (label repairs): the holder's pod by name, and by UID where both
    /// sides carry one (a namesake with another UID is another pod), that
    /// [may be local](Self::may_be_local). Cautious both ways: a
    /// holder not proven elsewhere keeps its label (taking a live leader's
    /// label moves its traffic away), and a pod of the same name in a
    /// cluster the holder certainly is not in loses one. `flaw` is the
    /// simulation's mutant, `None` everywhere else.
    pub fn keeps_label(
        &self,
        pod: &str,
        pod_uid: Option<&str>,
        cluster: Option<&str>,
        namespace: &str,
        flaw: Option<LocalityFlaw>,
    ) -> bool {
        let same_pod = match (self.pod_uid(), pod_uid) {
            (Some(holder), Some(pod)) => holder == pod,
            _ => true,
        };
        self.pod() == Some(pod)
            && same_pod
            && match flaw {
                Some(LocalityFlaw::LabelByNameAlone) => true,
                Some(LocalityFlaw::LabelNeedsProof) => self.is_local(cluster, namespace, None),
                _ => self.may_be_local(cluster, namespace),
            }
    }

    /// What the operator of `cluster` may do about this live holder of a
    /// deleted lease's lock in `namespace` (release-on-delete), where
    /// `runs_here` says whether a pod of the holder's name runs in this
    /// namespace (asked only when the holder [may be local](Self::may_be_local)).
    /// `flaw` is the simulation's mutant, `None` everywhere else.
    pub fn judge_live(
        &self,
        cluster: Option<&str>,
        namespace: &str,
        runs_here: impl FnOnce(&str) -> bool,
        flaw: Option<LocalityFlaw>,
    ) -> LiveHolder {
        if !self.may_be_local(cluster, namespace) {
            return LiveHolder::NotOurs;
        }
        if let Some(name) = self.pod()
            && runs_here(name)
        {
            return LiveHolder::Runs(name.to_string());
        }
        match self.is_local(cluster, namespace, flaw) {
            true => LiveHolder::Gone,
            false => LiveHolder::Unproven,
        }
    }

    /// Certainly a pod of another cluster: both sides name their cluster and
    /// the names differ. What status reports as `LeaderInOtherCluster`.
    pub fn cluster_elsewhere(&self, cluster: Option<&str>) -> Option<&str> {
        self.0.as_ref()?.cluster_other_than(cluster)
    }
}

/// A live holder of a deleted lease's lock, as the operator judges it
/// ([`HolderPod::judge_live`]).
#[derive(Debug, PartialEq, Eq)]
pub enum LiveHolder {
    /// Certainly of another namespace or cluster: not this resource's.
    NotOurs,
    /// Its pod still runs here: it releases when it retires.
    Runs(String),
    /// Maybe this cluster's (a name missing on either side), its pod not
    /// here: never released, it expires after D.
    Unproven,
    /// Certainly this cluster's, and its pod is gone: released by
    /// check-and-set.
    Gone,
}
