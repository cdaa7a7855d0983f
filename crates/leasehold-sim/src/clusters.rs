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
//!
//! Each pod shows a leader label: its sidecar publishes what its elector
//! believes, a killed process leaves the label as it was, and labels are
//! also set by hand (or by an earlier sidecar) on pods that do not lead.
//! Each cluster's operator repairs its own pods' labels with the real
//! operator's judgement ([`HolderPod::keeps_label`]); property 5 of the
//! checker: a repair never takes the label of the pod whose process holds
//! the lock, and never keeps one on a pod that is certainly not the
//! holder's because the holder names the other cluster.

use rand::RngExt;
use tokio::sync::watch;

use super::schedule::{Candidate, LOCK, Schedule};
use crate::Mutant;
use leasehold_core::lease::holder::{HolderPod, LiveHolder};
use leasehold_core::lease::{Identity, LeaderState, LeaseStore};

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
            let flaw = self.mutant.and_then(Mutant::locality_flaw);
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

    /// The leader label of `slot`'s current pod follows what its process
    /// publishes (`rx`), as the sidecar labels its own pod; when the process
    /// is killed the label stays as it was, and when the pod is deleted its
    /// label goes with it.
    pub(super) fn follow_label(&self, slot: usize, mut rx: watch::Receiver<LeaderState>) {
        let Some(uid) = self.pod_uids.get(&slot).cloned() else {
            return;
        };
        let labels = self.labels.clone();
        labels.lock().unwrap().entry(uid.clone()).or_insert(false);
        tokio::spawn(async move {
            loop {
                let leader = rx.borrow_and_update().leader;
                if let Some(shown) = labels.lock().unwrap().get_mut(&uid) {
                    *shown = leader;
                }
                if rx.changed().await.is_err() {
                    break;
                }
            }
        });
    }

    /// A label step in `slot`'s cluster: a leader label set by hand on
    /// `slot`'s pod, or that cluster's operator repairing its pods' labels
    /// against the live holder it reads from the store.
    pub(super) async fn label_step(&mut self, candidates: &[Candidate], slot: usize) {
        let named = self.clusters.expect("a two-cluster schedule");
        let cluster = cluster_of(slot);
        if self.rng.random_bool(0.3) {
            if let Some(uid) = self.pod_uids.get(&slot) {
                self.labels.lock().unwrap().insert(uid.clone(), true);
                self.report.counts.labels_set_by_hand += 1;
                self.note(format!("{cluster}/{} labelled leader by hand", pod_of(slot)));
            }
            return;
        }
        // A store fault fails the read: the operator repairs at its next reconcile.
        let Ok(observed) = self.store.observe(LOCK).await else {
            return;
        };
        let holder = observed.live_holder().map(str::to_string);
        let judged = holder.as_deref().map(HolderPod::parse);
        let ours = named.then_some(cluster);
        let flaw = self.mutant.and_then(Mutant::locality_flaw);
        let labels = self.labels.clone();
        let mut labels = labels.lock().unwrap();
        for other in (0..candidates.len()).filter(|&other| cluster_of(other) == cluster) {
            let Some(uid) = self.pod_uids.get(&other) else { continue };
            if labels.get(uid) != Some(&true) {
                continue;
            }
            let pod = pod_of(other);
            // The holder is this pod's process, or an earlier process of this pod.
            let holds = holder.as_deref().is_some_and(|holder| {
                let who = &candidates[other].who;
                holder == who || who.parse::<Identity>().is_ok_and(|process| process.succeeds(holder))
            });
            let holder = holder.as_deref().unwrap_or("nobody");
            match judged
                .as_ref()
                .is_some_and(|h| h.keeps_label(&pod, None, ours, NAMESPACE, flaw))
            {
                true => {
                    if let Some(elsewhere) = judged.as_ref().and_then(|h| h.cluster_elsewhere(ours))
                        && !holds
                    {
                        self.log.lock().unwrap().label_faults.push(format!(
                            "{cluster}'s operator kept the leader label of {cluster}/{pod} for {holder}, which \
                             runs in {elsewhere}"
                        ));
                    }
                }
                false => {
                    if holds {
                        self.log.lock().unwrap().label_faults.push(format!(
                            "{cluster}'s operator took the leader label off {cluster}/{pod}, whose process holds \
                             the lock ({holder})"
                        ));
                    }
                    labels.insert(uid.clone(), false);
                    self.report.counts.label_repairs += 1;
                    self.note(format!(
                        "{cluster}'s operator takes the leader label off {cluster}/{pod} (holder {holder})"
                    ));
                }
            }
        }
    }
}
