//! A step-by-step model of a Deployment rollout with only the leader Ready,
//! for checking [`super::rollout_completes`]. It follows the Kubernetes code
//! it names: `rolloutRolling` (`reconcileNewReplicaSet`, then
//! `reconcileOldReplicaSets` with `cleanupUnhealthyReplicas` and
//! `scaleDownOldReplicaSetsForRollingUpdate`) in
//! `pkg/controller/deployment/rolling.go`, `NewRSNewReplicas` in
//! `pkg/controller/deployment/util/deployment_util.go`, `rolloutRecreate` in
//! `recreate.go`, and the ReplicaSet controller deleting not-ready pods
//! before ready ones (`getPodsToDelete`, `controller.ActivePods` ordering).
//! One old ReplicaSet, minReadySeconds 0 (available = Ready).

use super::Strategy;

/// One ReplicaSet: desired replicas and its pods (ids).
#[derive(Debug, Default)]
struct ReplicaSet {
    spec: i32,
    pods: Vec<u32>,
}

#[derive(Debug)]
pub(super) struct Rollout {
    replicas: i32,
    strategy: Strategy,
    leader_moves_to_new: bool,
    old: ReplicaSet,
    new: ReplicaSet,
    leader: Option<u32>,
    next_pod: u32,
    rounds: u32,
}

impl Rollout {
    /// A Deployment at `replicas` on the old template, one old pod leading,
    /// whose template just changed.
    pub(super) fn new(replicas: i32, strategy: Strategy, leader_moves_to_new: bool) -> Self {
        let mut rollout = Rollout {
            replicas,
            strategy,
            leader_moves_to_new,
            old: ReplicaSet {
                spec: replicas,
                pods: Vec::new(),
            },
            new: ReplicaSet::default(),
            leader: None,
            next_pod: 0,
            rounds: 0,
        };
        rollout.replica_set_controllers();
        rollout.elect();
        rollout
    }

    /// Runs the controllers until nothing changes (a fixed point: done or stalled).
    pub(super) fn run(mut self) -> Self {
        loop {
            self.rounds += 1;
            assert!(self.rounds < 1000, "no fixed point: {self:?}");
            let before = (
                self.old.spec,
                self.new.spec,
                self.old.pods.clone(),
                self.new.pods.clone(),
                self.leader,
            );
            self.deployment_controller();
            self.replica_set_controllers();
            self.elect();
            if before
                == (
                    self.old.spec,
                    self.new.spec,
                    self.old.pods.clone(),
                    self.new.pods.clone(),
                    self.leader,
                )
            {
                return self;
            }
        }
    }

    pub(super) fn completed(&self) -> bool {
        self.old.spec == 0
            && self.old.pods.is_empty()
            && self.new.spec == self.replicas
            && self.new.pods.len() as i32 == self.replicas
    }

    pub(super) fn old_pods(&self) -> usize {
        self.old.pods.len()
    }

    fn available(&self, rs: &ReplicaSet) -> i32 {
        rs.pods.iter().filter(|p| Some(**p) == self.leader).count() as i32
    }

    /// Each ReplicaSet controller creates or deletes pods to match its spec,
    /// deleting not-ready pods (standbys) before the ready leader.
    fn replica_set_controllers(&mut self) {
        let leader = self.leader;
        for rs in [&mut self.old, &mut self.new] {
            while (rs.pods.len() as i32) < rs.spec {
                rs.pods.push(self.next_pod);
                self.next_pod += 1;
            }
            while (rs.pods.len() as i32) > rs.spec {
                let victim = rs.pods.iter().position(|p| Some(*p) != leader).unwrap_or(0);
                rs.pods.remove(victim);
            }
        }
    }

    /// The lease: a gone leader is replaced (by an old pod first, the worst
    /// case for a rollout, unless leadership moves to new pods); with
    /// `leader_moves_to_new` a leader on an old pod hands over to a new one.
    fn elect(&mut self) {
        let alive = |pods: &[u32], p: u32| pods.contains(&p);
        let on_old = self.leader.is_some_and(|l| alive(&self.old.pods, l));
        let on_new = self.leader.is_some_and(|l| alive(&self.new.pods, l));
        if self.leader_moves_to_new && !on_new && !self.new.pods.is_empty() {
            self.leader = self.new.pods.first().copied();
        } else if !on_old && !on_new {
            self.leader = self.old.pods.first().or(self.new.pods.first()).copied();
        }
    }

    fn deployment_controller(&mut self) {
        match self.strategy {
            // rolloutRecreate: scale old down to zero, wait until no old pod
            // runs, then scale the new ReplicaSet up.
            Strategy::Recreate => {
                if self.old.spec > 0 {
                    self.old.spec = 0;
                } else if self.old.pods.is_empty() {
                    self.new.spec = self.replicas;
                }
            }
            Strategy::RollingUpdate {
                max_surge,
                max_unavailable,
            } => {
                if !self.reconcile_new_replica_set(max_surge) {
                    self.reconcile_old_replica_sets(max_unavailable);
                }
            }
        }
    }

    /// `reconcileNewReplicaSet` with `NewRSNewReplicas`; true when it scaled.
    fn reconcile_new_replica_set(&mut self, max_surge: i32) -> bool {
        if self.new.spec == self.replicas {
            return false;
        }
        if self.new.spec > self.replicas {
            self.new.spec = self.replicas;
            return true;
        }
        let current = self.old.spec + self.new.spec;
        let max_total = self.replicas + max_surge;
        if current >= max_total {
            return false;
        }
        let up = (max_total - current).min(self.replicas - self.new.spec);
        self.new.spec += up;
        up > 0
    }

    /// `reconcileOldReplicaSets`: `cleanupUnhealthyReplicas`, then
    /// `scaleDownOldReplicaSetsForRollingUpdate`.
    fn reconcile_old_replica_sets(&mut self, max_unavailable: i32) {
        if self.old.spec == 0 {
            return;
        }
        let all = self.old.spec + self.new.spec;
        let min_available = self.replicas - max_unavailable;
        let new_unavailable = self.new.spec - self.available(&self.new);
        let max_scaled_down = all - min_available - new_unavailable;
        if max_scaled_down <= 0 {
            return;
        }
        let old_available = self.available(&self.old);
        if self.old.spec != old_available {
            let cleanup = max_scaled_down.min(self.old.spec - old_available);
            self.old.spec -= cleanup;
        }
        let available = old_available + self.available(&self.new);
        if available > min_available {
            let down = self.old.spec.min(available - min_available);
            self.old.spec -= down;
        }
    }
}
