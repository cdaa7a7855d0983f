//! Two clusters sharing the store (issue 37): candidates in "west" and
//! "east" with pods of the same names in both (StatefulSet names repeat in
//! every cluster), and each cluster's operator releasing the lock when it
//! deletes one of its pods, judging the live holder with the real
//! operator's code ([`HolderPod::judge_live`]). Half the schedules name
//! their clusters in the identities (`west/prod/c0#run3@uid-…`), half do
//! not (`prod/c0#run3@uid-…`), where only the pod UID tells the two `c0`s
//! apart and no operator can prove a holder its own.
//!
//! A crashed candidate restarts in the same pod (same UID) and takes its
//! earlier process's lease over ([`Identity::succeeds`]); a deleted pod's
//! successor is a new pod of the same name, with a new UID.

use rand::RngExt;

use super::schedule::{Candidate, LOCK, Schedule};
use crate::lease::holder::{HolderPod, LiveHolder, LocalityFlaw};
use crate::lease::{Identity, LeaseStore};
use crate::sim::Mutant;

const CLUSTERS: [&str; 2] = ["west", "east"];
const NAMESPACE: &str = "prod";

/// Slot `slot`'s cluster: even slots in west, odd ones in east.
fn cluster_of(slot: usize) -> &'static str {
    CLUSTERS[slot % 2]
}

/// The pod of `slot` (slots 0 and 1 are both `c0`, in west and in east).
fn pod_of(slot: usize) -> String {
    format!("c{}", slot / 2)
}

impl Schedule {
    /// The name and identity of a process of `slot`'s current pod; its
    /// pod's UID stays until the pod is deleted ([`Schedule::delete_pod`]).
    pub(super) fn cluster_identity(&mut self, slot: usize, named: bool) -> (String, Identity) {
        let cluster = cluster_of(slot);
        let restarts = self.restarts;
        let uid = self
            .pod_uids
            .entry(slot)
            .or_insert_with(|| format!("uid-{cluster}-{slot}-{restarts}"))
            .clone();
        let prefix = if named { format!("{cluster}/") } else { String::new() };
        let pod = pod_of(slot);
        let identity = format!("{prefix}{NAMESPACE}/{pod}#run{restarts}@{uid}")
            .parse()
            .expect("a simulated identity parses");
        (format!("{cluster}/{pod}"), identity)
    }

    /// `slot`'s cluster deletes its pod: the process dies at once (kill -9,
    /// its requests in flight may still commit), and that cluster's operator
    /// releases the lock if the live holder is certainly its own and its
    /// pod no longer runs, as release-on-delete does. A new pod of the same
    /// name follows.
    pub(super) async fn delete_pod(&mut self, candidates: &mut [Candidate], slot: usize) {
        let named = self.clusters.expect("a two-cluster schedule");
        let cluster = cluster_of(slot);
        let pod = pod_of(slot);
        self.note(format!("{cluster} deletes pod {pod} ({})", candidates[slot].who));
        candidates[slot].handle.abort();
        candidates[slot].pause.set(false);
        self.pod_uids.remove(&slot);
        // A store fault fails the operator's read: it tries again at its
        // next reconcile, which this schedule leaves out.
        let observed = self.store.observe(LOCK).await;
        if let Ok(observed) = observed
            && let (Some(holder), Some(token)) = (
                observed.live_holder().map(str::to_string),
                observed.record.as_ref().and_then(|r| r.token),
            )
        {
            // Pods of this cluster that still run, by name (the deleted one is gone).
            let running: Vec<String> = (0..candidates.len())
                .filter(|&other| other != slot && cluster_of(other) == cluster)
                .map(pod_of)
                .collect();
            let flaw =
                (self.mutant == Some(Mutant::ReleaseAcrossClusters)).then_some(LocalityFlaw::UnnamedClustersMatch);
            let ours = named.then_some(cluster);
            let judged =
                HolderPod::parse(&holder).judge_live(ours, NAMESPACE, |name| running.iter().any(|r| r == name), flaw);
            let holders_slot = candidates.iter().position(|c| c.who == holder);
            let elsewhere = holders_slot.is_some_and(|h| cluster_of(h) != cluster);
            match judged {
                LiveHolder::Gone => {
                    self.report.counts.operator_releases += 1;
                    self.note(format!("{cluster}'s operator releases {holder}"));
                    let _ = self.store.release(LOCK, &holder, token).await;
                }
                _ if elsewhere => {
                    self.report.counts.left_to_other_cluster += 1;
                    self.note(format!("{cluster}'s operator leaves {holder} alone ({judged:?})"));
                }
                _ => self.note(format!("{cluster}'s operator leaves {holder} alone ({judged:?})")),
            }
        }
        let restart = self.timing.retry_period.mul_f64(self.rng.random_range(0.0..5.0));
        tokio::time::sleep(restart).await;
        candidates[slot] = self.start_candidate(slot);
    }
}
