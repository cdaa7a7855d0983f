//! The rolling-update schedule (issue 16): 2–4 pods of a Deployment, each a
//! versioned candidate with the sidecar's peer decision ([`PeerWatch`]),
//! under a lease that prefers `Newest` or `Oldest`, half the schedules with
//! the version fence. The Deployment surges a pod of the newest revision
//! (its app not ready yet), the app turns ready (it campaigns from then),
//! and an old pod is terminated (gracefully or kill -9; the old leader
//! first when one leads, the order that costs most); rollouts (or
//! rollbacks, which count as newer) start at any time, apps turn unready
//! and ready again, pods crash and restart unready; the store has outages,
//! latency, flaky calls and clock jumps. Links stay fast and processes are
//! never paused: the peer view reaches every pod at once, so the bounds
//! below hold without excuses (pauses and late commits are the elector
//! schedule's, and the fence's property there needs no such bound).
//!
//! On top of the elector schedule's checks (terms, tokens, beliefs, fenced
//! writes, and with the fence: revisions never decrease), the checker asks:
//! 5. a candidate never leads, nor commits an acquisition, while a peer of
//!    the version the lease prefers (with `Newest` a newer one, with
//!    `Oldest` an older one) that could lead (with the fence: no newer
//!    revision has committed since) has been live and healthy for longer
//!    than `2 R`: a leader stands aside within its renewal in flight (≤ R),
//!    a follower's acquisition sent before it heard commits within an
//!    observation and the store's latency (≤ R + 0.8 R). With `Newest` this
//!    is "never from a newer version to an older one while the newer one is
//!    healthy", with `Oldest` "not to a newer one while an old one is";
//! 6. once the store heals and every pod's app is ready, leadership settles
//!    on the preferred version within `3 D`: the live holder's revision is
//!    the newest (`Newest`) or oldest (`Oldest`) of the live pods' that
//!    could lead (with the fence: not below the newest that led). Without
//!    the fence filter in [`PeerWatch`], `Oldest` with the fence fails
//!    here: an old pod ready again after a newer version led held every
//!    newer candidate back while itself fenced out, and nobody led (the
//!    mutant `stand-aside-for-fenced-peers`).
//!
//! The stand-aside decision is not re-implemented here: every pod's
//! [`PeerWatch`] (the sidecar's own, `sidecar::versions::follow_peers`)
//! is told its live, healthy peers after every step and steers the real
//! elector.

use std::time::Duration;

use rand::RngExt;
use tokio::time::Instant;

use super::mutants::Mutant;
use super::pause::{Pause, paused_runtime};
use super::report::{Report, Violation};
use super::schedule::{Candidate, LOCK, Schedule, Setup};
use leasehold_core::lease::version::PeerWatch;
use leasehold_core::lease::{LeaseStore, Prefer, Version};
use leasehold_core::store::memory::Faults;

/// Runs one seeded rolling-update schedule.
pub fn simulate_rollouts(seed: u64, length: Duration) -> Result<Report, Violation> {
    let setup = Setup {
        length,
        ..Setup::default()
    };
    paused_runtime().block_on(async move { Schedule::new(seed, &setup).run_rollout(length).await })
}

/// One pod: its candidate, its peer decision, whether its app is ready.
struct Pod {
    candidate: Candidate,
    watch: PeerWatch,
    ready: bool,
}

/// A stretch of time in which a candidate was live and its app healthy.
#[derive(Debug, Clone)]
struct Healthy {
    who: String,
    revision: u64,
    from: Instant,
    until: Option<Instant>,
}

/// The Deployment: its pods and the health history the checker reads.
struct Deployment {
    prefer: Prefer,
    replicas: usize,
    pods: Vec<Pod>,
    healthy: Vec<Healthy>,
    next_slot: usize,
}

impl Deployment {
    fn set_ready(&mut self, i: usize, ready: bool) {
        let pod = &mut self.pods[i];
        if pod.ready == ready {
            return;
        }
        pod.ready = ready;
        pod.candidate.handle.set_campaigning(ready);
        if ready {
            self.healthy.push(Healthy {
                who: pod.candidate.who.clone(),
                revision: pod.candidate.version.revision,
                from: Instant::now(),
                until: None,
            });
        } else {
            end_health(&mut self.healthy, &pod.candidate.who);
        }
    }

    /// Removes pod `i` (terminated or crashed): not healthy from now on.
    fn remove(&mut self, i: usize) -> Pod {
        let pod = self.pods.remove(i);
        end_health(&mut self.healthy, &pod.candidate.who);
        pod
    }

    fn leader(&self) -> Option<usize> {
        let now = Instant::now();
        self.pods
            .iter()
            .position(|p| p.candidate.handle.state().is_leader_at(now))
    }
}

fn end_health(healthy: &mut [Healthy], who: &str) {
    let now = Instant::now();
    for h in healthy.iter_mut().filter(|h| h.who == who && h.until.is_none()) {
        h.until = Some(now);
    }
}

impl Schedule {
    pub(super) async fn run_rollout(mut self, length: Duration) -> Result<Report, Violation> {
        let prefer = if self.rng.random_bool(0.5) {
            Prefer::Newest
        } else {
            Prefer::Oldest
        };
        self.fence = self.rng.random_bool(0.5);
        self.report.counts.fenced_schedules = u64::from(self.fence);
        self.report.counts.newest_schedules = u64::from(prefer == Prefer::Newest);
        self.revision = 1;
        let replicas = self.rng.random_range(2..=4);
        self.note(format!(
            "{replicas} replicas, prefer {prefer:?}, fence {}, {:?}, store clock rate {:.3}, mutant {:?}",
            self.fence, self.timing, self.clock_rate, self.mutant
        ));
        let mut deployment = Deployment {
            prefer,
            replicas,
            pods: Vec::new(),
            healthy: Vec::new(),
            next_slot: 0,
        };
        for _ in 0..replicas {
            self.add_pod(&mut deployment, true);
        }
        self.tell_peers(&mut deployment);
        let end = self.start + length;
        while Instant::now() < end {
            let gap = Duration::from_millis(self.rng.random_range(100..1500));
            self.idle(&mut deployment, gap).await;
            self.rollout_step(&mut deployment).await;
            self.tell_peers(&mut deployment);
        }
        // 6. Heal; leadership must settle on the preferred version.
        self.note("store healthy, every app ready".into());
        self.store.set_faults(Faults::default());
        for i in 0..deployment.pods.len() {
            deployment.set_ready(i, true);
        }
        self.tell_peers(&mut deployment);
        self.idle(&mut deployment, self.timing.lease_duration * 3).await;
        let settled = self.settled_on_the_preferred_version(&deployment).await;
        for pod in &deployment.pods {
            pod.candidate.shutdown.cancel();
        }
        for pod in std::mem::take(&mut deployment.pods) {
            end_health(&mut deployment.healthy, &pod.candidate.who);
            pod.candidate.handle.join().await;
        }
        tokio::time::sleep(self.timing.lease_duration * 2).await;
        if let Err(what) = settled.and_then(|()| self.preference_kept(&deployment)) {
            return Err(self.violation(what));
        }
        self.check()
    }

    /// A new pod of the newest revision, its app ready or not.
    fn add_pod(&mut self, deployment: &mut Deployment, ready: bool) {
        let slot = deployment.next_slot;
        deployment.next_slot += 1;
        let revision = self.revision;
        self.add_pod_at(deployment, slot, revision, ready);
    }

    fn add_pod_at(&mut self, deployment: &mut Deployment, slot: usize, revision: u64, ready: bool) {
        let candidate = self.start_candidate_at(slot, Some(revision));
        // The app-health source: no campaign before the app is ready.
        candidate.handle.set_campaigning(false);
        let watch = PeerWatch::new(
            deployment.prefer,
            Some(candidate.version.clone()),
            self.fence,
            candidate.handle.control(),
        );
        let watch = match self.mutant {
            Some(Mutant::StandAsideForFencedPeers) => watch.flawed(),
            _ => watch,
        };
        deployment.pods.push(Pod {
            candidate,
            watch,
            ready: false,
        });
        if ready {
            deployment.set_ready(deployment.pods.len() - 1, true);
        }
    }

    /// Every pod's peer watch sees the live pods whose apps are ready, as
    /// the sidecar's pod watch would (here at once), and the row's recorded
    /// version from its elector's latest read.
    fn tell_peers(&mut self, deployment: &mut Deployment) {
        let live: Vec<(String, Version)> = deployment
            .pods
            .iter()
            .filter(|p| p.ready)
            .map(|p| (p.candidate.name.clone(), p.candidate.version.clone()))
            .collect();
        let leader = deployment.leader();
        for (i, pod) in deployment.pods.iter_mut().enumerate() {
            let me = &pod.candidate.name;
            let peers = live
                .iter()
                .filter(|(n, _)| n != me)
                .map(|(n, v)| (n.clone(), Some(v.clone())))
                .collect();
            let recorded = pod.candidate.handle.state().holder_version;
            let changed = pod.watch.peers(peers) | pod.watch.recorded(recorded.as_ref());
            if changed {
                let standing = pod.watch.standing();
                if standing.is_some() && leader == Some(i) {
                    self.report.counts.stand_asides += 1;
                }
                self.note(format!(
                    "{} {}",
                    pod.candidate.who,
                    standing.unwrap_or("campaigns: no peer of a preferred version can lead")
                ));
            }
        }
    }

    /// Waits `length`, passing the electors' reads of the row to the peer
    /// watches as they come (the sidecar's watch reacts at once; here
    /// within 10 ms).
    async fn idle(&mut self, deployment: &mut Deployment, length: Duration) {
        let end = Instant::now() + length;
        while Instant::now() < end {
            tokio::time::sleep((end - Instant::now()).min(Duration::from_millis(10))).await;
            self.tell_peers(deployment);
        }
    }

    /// One step of the Deployment, or a store fault.
    async fn rollout_step(&mut self, deployment: &mut Deployment) {
        let surged = deployment.pods.len() > deployment.replicas;
        match self.rng.random_range(0..10) {
            // Store faults and repairs, store clock jumps.
            0 => {
                let arm = [0, 1, 2, 3, 9][self.rng.random_range(0..5)];
                self.inject_fault(arm, "", &Pause::new(), &[], 0);
            }
            // Surge: a pod of the newest revision, while an older one is left.
            1 | 2
                if !surged
                    && deployment
                        .pods
                        .iter()
                        .any(|p| p.candidate.version.revision < self.revision) =>
            {
                self.note(format!("surge a pod of revision {}", self.revision));
                self.add_pod(deployment, false);
            }
            // An app turns ready.
            3 | 4 => {
                if let Some(i) = deployment.pods.iter().position(|p| !p.ready) {
                    self.note(format!("{} app ready", deployment.pods[i].candidate.who));
                    deployment.set_ready(i, true);
                }
            }
            // A pod of the newest revision is available (maxUnavailable 0):
            // an old pod goes, the leader first.
            5 | 6
                if surged
                    && deployment
                        .pods
                        .iter()
                        .any(|p| p.ready && p.candidate.version.revision == self.revision) =>
            {
                let old = |p: &Pod| p.candidate.version.revision < self.revision;
                let victim = deployment
                    .leader()
                    .filter(|&i| old(&deployment.pods[i]))
                    .or_else(|| deployment.pods.iter().position(old));
                if let Some(i) = victim {
                    let pod = deployment.remove(i);
                    if self.rng.random_bool(0.7) {
                        self.note(format!("terminate {} (SIGTERM)", pod.candidate.who));
                        pod.candidate.shutdown.cancel();
                        pod.candidate.handle.join().await;
                    } else {
                        self.note(format!("terminate {} (kill -9)", pod.candidate.who));
                        self.report.counts.crashes += 1;
                        pod.candidate.handle.abort();
                    }
                }
            }
            // An app turns unready for a while.
            7 => {
                let i = self.rng.random_range(0..deployment.pods.len());
                if deployment.pods[i].ready {
                    self.note(format!("{} app unready", deployment.pods[i].candidate.who));
                    deployment.set_ready(i, false);
                }
            }
            // A pod crashes and restarts (same revision), its app not ready.
            8 => {
                let i = self.rng.random_range(0..deployment.pods.len());
                let pod = deployment.remove(i);
                self.note(format!("crash {} (kill -9), restarts", pod.candidate.who));
                self.report.counts.crashes += 1;
                pod.candidate.handle.abort();
                let (slot, revision) = (slot_of(&pod.candidate), pod.candidate.version.revision);
                self.add_pod_at(deployment, slot, revision, false);
            }
            // A new rollout (or a rollback: a newer revision too).
            9 if self.rng.random_bool(0.3) => {
                self.revision += 1;
                self.note(format!("rollout to revision {}", self.revision));
            }
            _ => {}
        }
    }

    /// Property 6, checked after the heal.
    async fn settled_on_the_preferred_version(&self, deployment: &Deployment) -> Result<(), String> {
        // With the fence, only revisions at or above the newest that led can.
        let floor = self
            .store
            .acquisitions()
            .iter()
            .filter_map(|a| a.revision)
            .max()
            .filter(|_| self.fence)
            .unwrap_or(0);
        let revisions = deployment
            .pods
            .iter()
            .map(|p| p.candidate.version.revision)
            .filter(|&r| r >= floor);
        let wanted = match deployment.prefer {
            Prefer::Oldest => revisions.min(),
            _ => revisions.max(),
        }
        .expect("a pod of the newest revision that led is left: only older ones are terminated");
        let observed = self.store.observe(LOCK).await.map_err(|e| e.to_string())?;
        let holder = observed.live_holder();
        let holder_revision = deployment
            .pods
            .iter()
            .find(|p| Some(p.candidate.who.as_str()) == holder)
            .map(|p| p.candidate.version.revision);
        if holder_revision == Some(wanted) {
            return Ok(());
        }
        Err(format!(
            "{:?} after the store healed and every app was ready: the lease is held by {holder:?} (revision \
             {holder_revision:?}), not by a pod of revision {wanted}",
            self.timing.lease_duration * 3
        ))
    }

    /// Property 5 over every belief and acquisition.
    fn preference_kept(&self, deployment: &Deployment) -> Result<(), String> {
        let grace = self.timing.renew_deadline * 2;
        let healthy = &deployment.healthy;
        let acquisitions = self.store.acquisitions();
        let end = Instant::now();
        let prefers = |candidate: u64, peer: u64| match deployment.prefer {
            Prefer::Newest => peer > candidate,
            Prefer::Oldest => peer < candidate,
            Prefer::None => false,
        };
        // With the fence, a peer can lead until a newer revision commits.
        let fenced_from = |revision: u64| {
            acquisitions
                .iter()
                .find(|a| self.fence && a.revision.is_some_and(|r| r > revision))
                .map_or(end, |a| a.at)
        };
        let revision_of = |who: &str| healthy.iter().find(|h| h.who == who).map(|h| h.revision);
        // A peer `who` should stand aside for at some instant of [from,
        // until] (of (from, until) when `open`): preferred, live and healthy
        // for `grace` by then, and able to lead.
        let preferred = |who: &str, revision: u64, from: Instant, until: Instant, open: bool| {
            healthy.iter().find(|h| {
                let (counts, healthy_until) = ((h.from + grace).max(from), h.until.unwrap_or(end));
                let overlaps = if open {
                    counts < healthy_until.min(until).min(fenced_from(h.revision))
                } else {
                    counts <= until && counts < healthy_until && counts <= fenced_from(h.revision)
                };
                h.who != who && prefers(revision, h.revision) && overlaps
            })
        };
        let at = |i: Instant| (i - self.start).as_millis();
        let log = self.log.lock().unwrap();
        for belief in log.beliefs.iter().filter(|b| b.until > b.from) {
            let Some(revision) = revision_of(&belief.who) else {
                continue;
            };
            if let Some(peer) = preferred(&belief.who, revision, belief.from, belief.until, true) {
                return Err(format!(
                    "{} (revision {revision}) believed it led term {} from {}ms to {}ms, while {} (revision {}) was \
                     live and healthy from {}ms: with {:?} it must stand aside within {grace:?}",
                    belief.who,
                    belief.term,
                    at(belief.from),
                    at(belief.until),
                    peer.who,
                    peer.revision,
                    at(peer.from),
                    deployment.prefer
                ));
            }
        }
        for acquisition in &acquisitions {
            let Some(revision) = acquisition.revision else { continue };
            let t = acquisition.at;
            if let Some(peer) = preferred(&acquisition.holder, revision, t, t, false) {
                return Err(format!(
                    "{} (revision {revision}) acquired term {} at {}ms, while {} (revision {}) was live and healthy \
                     from {}ms: with {:?} it must not campaign",
                    acquisition.holder,
                    acquisition.term,
                    at(t),
                    peer.who,
                    peer.revision,
                    at(peer.from),
                    deployment.prefer
                ));
            }
        }
        Ok(())
    }

    fn violation(&self, what: String) -> Violation {
        Violation {
            seed: self.seed,
            mutant: self.mutant,
            what,
            events: self.log.lock().unwrap().events.clone(),
        }
    }
}

/// The slot a candidate was started in (its name is `c<slot>`).
fn slot_of(candidate: &Candidate) -> usize {
    candidate.name[1..].parse().expect("candidates are named c<slot>")
}
