//! The elector: a Follower/Leader state machine over a [`LeaseStore`].
//!
//! Safety rules (design.md, "The elector"):
//! * the leader's deadline is `t_send + R`, where `t_send` is when the last
//!   successful acquire or renew was *sent*, on the monotonic clock;
//! * past the deadline without a renewal it stops claiming at once;
//! * it publishes "not leader" and cancels the leader context *before*
//!   anything else, waits for the leader work to finish, and only then
//!   releases the lease by check-and-set;
//! * an unknown outcome is never success: the follower observes first (S9);
//! * leadership is never resumed from cache, only from a fresh grant (S11).

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use backon::{BackoffBuilder, ExponentialBuilder};
use tokio::sync::{Notify, broadcast, watch};
use tokio::task::JoinHandle;
use tokio::time::{sleep_until, timeout_at};
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;
use tracing::{debug, info, warn};

use super::clock::{Instant, Jitter, now};
use super::record::{EndReason, FencingToken, Grant, Handoff, Held, Identity, Observation, Release};
use super::seams::{Flaw, SimHooks};
use super::store::{LeaseStore, StoreError};
use super::timing::Timing;
use super::version::{Claim, Version};

/// Why the state last changed, for Events, logs and metrics.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "camelCase", tag = "kind", content = "detail")]
pub enum Change {
    #[default]
    Starting,
    /// A fresh observation of the store (holder may have changed).
    Observed,
    Acquired,
    Renewed,
    /// The store says the lease is no longer ours.
    Lost(String),
    /// No successful renewal within R.
    DeadlineMissed,
    /// Stopped claiming on purpose (shutdown or campaign stopped); releases
    /// once the leader work has finished.
    SteppingDown,
    /// Stepped down on purpose and released.
    Released,
    /// Stepped down on purpose; the release itself failed (the lease will expire).
    ReleaseFailed(String),
    /// The store could not be read.
    StoreError(String),
    /// The lease is free, but the version fence keeps this candidate out:
    /// it could only lead by moving leadership back to an older version.
    Fenced(String),
}

/// What the elector believes, published on a watch channel.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct LeaderState {
    /// This candidate claims leadership. Check [`LeaderState::is_leader_at`]
    /// too: a process paused past its deadline must not act on a stale `true`.
    pub leader: bool,
    /// Our identity.
    pub identity: String,
    /// The holder as last seen (ourselves when leader).
    pub holder: Option<String>,
    pub term: u64,
    pub token: Option<FencingToken>,
    /// Local wall-clock time when the current holder was first seen or we acquired.
    pub since: Option<SystemTime>,
    /// Leader only: when we stop claiming unless a renewal succeeds.
    pub deadline: Option<Instant>,
    /// Leader only: when the last successful acquire or renew was sent.
    pub renewed: Option<Instant>,
    /// Whether this candidate is campaigning at all.
    pub campaigning: bool,
    /// Why this candidate stands aside for another version's candidate
    /// (the lease prefers the newest or the oldest), if it does.
    pub standing_aside: Option<String>,
    /// The version this candidate runs, when it advertises one.
    pub version: Option<Version>,
    /// The version the row records for the holder (ourselves when leader).
    pub holder_version: Option<Version>,
    /// Why this candidate's last term ended on purpose (set when it steps
    /// down, kept through the release, cleared by the next acquisition):
    /// the reason its release records in the store.
    pub ending: Option<EndReason>,
    pub change: Change,
}

impl LeaderState {
    /// Leader and still within the deadline at `at`.
    pub fn is_leader_at(&self, at: Instant) -> bool {
        self.leader && self.deadline.is_some_and(|d| at < d)
    }

    /// Time left before the deadline, for leaders.
    pub fn expires_in(&self, at: Instant) -> Option<Duration> {
        self.deadline
            .filter(|_| self.leader)
            .map(|d| d.saturating_duration_since(at))
    }
}

/// What leader work receives: its term, its fencing token, and a token that
/// is cancelled the moment the elector stops claiming.
#[derive(Debug, Clone)]
pub struct LeaderContext {
    pub term: u64,
    pub token: FencingToken,
    pub cancelled: CancellationToken,
    pub state: watch::Receiver<LeaderState>,
}

impl LeaderContext {
    /// True while this term still leads by the elector's deadline.
    pub fn still_leading(&self) -> bool {
        let state = self.state.borrow();
        !self.cancelled.is_cancelled() && state.token == Some(self.token) && state.is_leader_at(now())
    }
}

/// Whether the elector campaigns: switched on (the app is healthy), not
/// standing aside for another version's candidate and not handing over.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Campaign {
    on: bool,
    /// Why the host switched the campaign off (when `on` is false).
    off_because: EndReason,
    aside: Option<String>,
    /// A transfer: stand aside, and release with this reservation and
    /// reason. Its own field, so that the version steering (which sets
    /// `aside`) cannot end a handover.
    handoff: Option<Release>,
}

impl Campaign {
    fn active(&self) -> bool {
        self.on && self.aside.is_none() && self.handoff.is_none()
    }

    /// Why this candidate stands aside, if it does.
    fn why_aside(&self) -> Option<String> {
        self.aside.clone().or_else(|| {
            self.handoff
                .as_ref()
                .and_then(|r| r.handoff.as_ref())
                .map(|h| format!("handing over to pod {}", h.pod_uid()))
        })
    }

    /// Why a leader that stops claiming under this campaign ends its term:
    /// a handover's reason, a stand-aside (preempted), the reason the host
    /// switched it off, or else a shutdown (released).
    fn end_reason(&self) -> EndReason {
        match (&self.handoff, &self.aside, self.on) {
            (Some(release), _, _) => release.reason,
            (None, Some(_), _) => EndReason::Preempted,
            (None, None, false) => self.off_because,
            (None, None, true) => EndReason::Released,
        }
    }
}

/// The configuration of one candidate for one lock.
#[derive(Debug, Clone)]
pub struct Elector {
    lock: String,
    identity: Identity,
    timing: Timing,
    version: Option<Version>,
    fence: bool,
    seed: Option<u64>,
    sim: SimHooks,
    /// Created here so callers can subscribe before the first acquisition.
    transitions: broadcast::Sender<LeaderState>,
}

/// Steers a running elector; cheap to clone into other tasks.
#[derive(Debug, Clone)]
pub struct ElectorControl {
    campaign: Arc<watch::Sender<Campaign>>,
    timing: Arc<watch::Sender<Timing>>,
    nudge: Arc<Notify>,
}

impl ElectorControl {
    /// `false`: a leader steps down and releases, a follower stops trying.
    pub fn set_campaigning(&self, campaigning: bool) {
        self.campaign_unless((!campaigning).then_some(EndReason::Released));
    }

    /// `Some(reason)`: as `set_campaigning(false)`, and a leader's release
    /// records `reason` as the end of its term (the pod terminating, the
    /// app unhealthy). `None`: campaign (as `set_campaigning(true)`).
    pub fn campaign_unless(&self, stop: Option<EndReason>) {
        self.campaign.send_if_modified(|c| {
            let (on, off_because) = (stop.is_none(), stop.unwrap_or(c.off_because));
            let changed = (c.on, c.off_because) != (on, off_because);
            (c.on, c.off_because) = (on, off_because);
            changed
        });
    }

    /// `Some(why)`: stand aside for a candidate of another version (the
    /// lease prefers it): a leader steps down and releases as on
    /// `set_campaigning(false)`, a follower does not campaign. `None`:
    /// campaign again (when switched on).
    pub fn stand_aside(&self, why: Option<String>) {
        self.campaign
            .send_if_modified(|c| std::mem::replace(&mut c.aside, why.clone()) != why);
    }

    /// `Some(release)`: hand over (a transfer): a leader stops claiming,
    /// drains as on `set_campaigning(false)` and releases with the
    /// release's reservation and reason; a follower does not campaign. Keep it set
    /// until the target leads or the reservation has ended: a leader that
    /// campaigned while its release was in flight could confirm its own
    /// term by a renewal and lead beside the target (docs/design.md,
    /// "Transfer"). `None`: campaign again (when switched on).
    pub fn hand_over(&self, handoff: Option<Release>) {
        self.campaign
            .send_if_modified(|c| std::mem::replace(&mut c.handoff, handoff.clone()) != handoff);
    }

    /// New timing, applied from the next term (a running term keeps the
    /// deadline rules it was granted under).
    pub fn set_timing(&self, timing: Timing) {
        self.timing.send_replace(timing);
    }

    /// Look at the store now instead of at the next poll (graceful handover).
    pub fn nudge(&self) {
        self.nudge.notify_one();
    }
}

/// A running elector: its state, its controls, its task.
#[derive(Debug)]
pub struct ElectorHandle {
    state: watch::Receiver<LeaderState>,
    transitions: broadcast::Sender<LeaderState>,
    control: ElectorControl,
    task: JoinHandle<()>,
}

impl ElectorHandle {
    pub fn subscribe(&self) -> watch::Receiver<LeaderState> {
        self.state.clone()
    }

    /// Every acquisition, loss and release, none coalesced (unlike the
    /// state channel): for Events, metrics and tests.
    pub fn transitions(&self) -> broadcast::Receiver<LeaderState> {
        self.transitions.subscribe()
    }

    pub fn state(&self) -> LeaderState {
        self.state.borrow().clone()
    }

    pub fn control(&self) -> ElectorControl {
        self.control.clone()
    }

    /// See [`ElectorControl::set_campaigning`].
    pub fn set_campaigning(&self, campaigning: bool) {
        self.control.set_campaigning(campaigning);
    }

    /// See [`ElectorControl::set_timing`].
    pub fn set_timing(&self, timing: Timing) {
        self.control.set_timing(timing);
    }

    /// See [`ElectorControl::nudge`].
    pub fn nudge(&self) {
        self.control.nudge();
    }

    /// Waits for the elector to finish (after shutdown, the release is done).
    pub async fn join(self) {
        if let Err(e) = self.task.await
            && e.is_panic()
        {
            std::panic::resume_unwind(e.into_panic());
        }
    }

    /// Stops at once without releasing, as a crash would (simulations, S13).
    pub fn abort(&self) {
        self.task.abort();
    }
}

type Work = Box<dyn FnMut(LeaderContext) -> futures::future::BoxFuture<'static, ()> + Send>;

struct Running {
    elector: Elector,
    store: Arc<dyn LeaseStore>,
    shutdown: CancellationToken,
    state: watch::Sender<LeaderState>,
    transitions: broadcast::Sender<LeaderState>,
    campaign: watch::Receiver<Campaign>,
    timing_updates: watch::Receiver<Timing>,
    nudge: Arc<Notify>,
    jitter: Jitter,
    /// Quick re-polls after a nudge; see [`Hurry`].
    hurry: Option<Hurry>,
    /// In a mutex only to make `Running` Sync; it is never contended.
    work: std::sync::Mutex<Work>,
}

/// After a nudge (the holder's pod says it stopped claiming) a follower
/// that still finds the lease held re-observes quickly for one retry period
/// instead of waiting a whole poll: the holder stops claiming (and its
/// label turns) before its release commits, so the first look after the
/// nudge can miss the release by about a store round trip. The gap starts
/// at the round trip just measured and doubles, so one nudge costs at most
/// about log2(P / round trip) extra observations. Only the observation is
/// hurried: the lease is still taken only by the store's check-and-set
/// when it is seen free or expired. Keeping the label "true" until the
/// release commits instead would publish a claim the leader no longer makes.
#[derive(Debug, Clone, Copy)]
struct Hurry {
    until: Instant,
    gap: Option<Duration>,
}

/// How a term ended.
enum Ended {
    /// Stop claiming and do not release (lost, or deadline passed).
    Lost(Change),
    /// Stop claiming, then release.
    Release,
}

impl Elector {
    pub fn new(lock: impl Into<String>, identity: Identity, timing: Timing) -> Self {
        Elector {
            lock: lock.into(),
            identity,
            timing,
            version: None,
            fence: false,
            seed: None,
            sim: SimHooks::default(),
            transitions: broadcast::channel(64).0,
        }
    }

    /// The simulation's task wrapper and mutant flaw ([`super::seams`]).
    #[doc(hidden)]
    pub fn with_sim_hooks(mut self, hooks: SimHooks) -> Self {
        self.sim = hooks;
        self
    }

    /// The version this candidate advertises and records when it acquires;
    /// with `fence`, it never acquires where that would move leadership to
    /// an older version (checked by the store in the acquiring transaction).
    pub fn with_version(mut self, version: Option<Version>, fence: bool) -> Self {
        self.version = version;
        self.fence = fence;
        self
    }

    /// Seeds jitter and backoff, so a simulation replays exactly.
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    pub fn lock(&self) -> &str {
        &self.lock
    }

    /// Subscribes to transitions before the elector runs, so none is missed.
    pub fn transitions(&self) -> broadcast::Receiver<LeaderState> {
        self.transitions.subscribe()
    }

    pub fn identity(&self) -> &Identity {
        &self.identity
    }

    pub fn timing(&self) -> &Timing {
        &self.timing
    }

    /// Runs the elector with no leader work of its own: callers follow the
    /// state channel.
    pub fn spawn(self, store: Arc<dyn LeaseStore>, shutdown: CancellationToken) -> ElectorHandle {
        self.spawn_with_work(store, shutdown, |_ctx| async {})
    }

    /// Runs the elector; `work` is started on every acquisition and must
    /// return soon after `ctx.cancelled` fires. The lease is released only
    /// after it has returned.
    pub fn spawn_with_work<W, F>(
        self,
        store: Arc<dyn LeaseStore>,
        shutdown: CancellationToken,
        mut work: W,
    ) -> ElectorHandle
    where
        W: FnMut(LeaderContext) -> F + Send + 'static,
        F: Future<Output = ()> + Send + 'static,
    {
        let initial = LeaderState {
            identity: self.identity.to_string(),
            campaigning: true,
            version: self.version.clone(),
            ..Default::default()
        };
        let (state_tx, state_rx) = watch::channel(initial);
        let (campaign_tx, campaign_rx) = watch::channel(Campaign {
            on: true,
            ..Campaign::default()
        });
        let (timing_tx, timing_rx) = watch::channel(self.timing);
        let nudge = Arc::new(Notify::new());
        let transitions = self.transitions.clone();
        let jitter = Jitter::new(self.timing.jitter, self.seed);
        let sim = self.sim.clone();
        let running = Running {
            elector: self,
            store,
            shutdown,
            state: state_tx,
            transitions: transitions.clone(),
            campaign: campaign_rx,
            timing_updates: timing_rx,
            nudge: nudge.clone(),
            jitter,
            hurry: None,
            work: std::sync::Mutex::new(Box::new(move |ctx| Box::pin(work(ctx)))),
        };
        let task = sim.spawn(running.run());
        ElectorHandle {
            state: state_rx,
            transitions,
            control: ElectorControl {
                campaign: Arc::new(campaign_tx),
                timing: Arc::new(timing_tx),
                nudge,
            },
            task,
        }
    }
}

impl Running {
    /// Publishes a leadership transition on both channels.
    fn transition(&self, change: impl FnOnce(&mut LeaderState)) {
        self.state.send_modify(change);
        // Nobody listening is fine.
        let _ = self.transitions.send(self.state.borrow().clone());
    }

    fn me(&self) -> String {
        self.elector.identity.to_string()
    }

    fn timing(&self) -> Timing {
        self.elector.timing
    }

    fn flaw(&self, flaw: Flaw) -> bool {
        self.elector.sim.flaw == Some(flaw)
    }

    /// When a leader stops claiming after a grant sent at `sent` and
    /// answered at `replied`: `sent + R` (the mutants aside).
    fn deadline(&self, sent: Instant, replied: Instant) -> Instant {
        let timing = self.timing();
        match self.elector.sim.flaw {
            Some(Flaw::DeadlineFromReply) => replied + timing.renew_deadline,
            Some(Flaw::DeadlineFromLeaseDuration) => sent + timing.lease_duration,
            _ => sent + timing.renew_deadline,
        }
    }

    fn backoff(&mut self) -> impl Iterator<Item = Duration> + use<> {
        let p = self.timing().retry_period;
        ExponentialBuilder::default()
            .with_min_delay((p / 8).max(Duration::from_millis(10)))
            .with_max_delay(p)
            .with_jitter()
            .with_jitter_seed(self.jitter.seed())
            .without_max_times()
            .build()
    }

    async fn run(mut self) {
        let mut errors = self.backoff();
        loop {
            if self.shutdown.is_cancelled() {
                break;
            }
            if self.timing_updates.has_changed().unwrap_or(false) {
                let timing = *self.timing_updates.borrow_and_update();
                info!(lock = %self.elector.lock, ?timing, "new timing, from this term on");
                self.elector.timing = timing;
                self.jitter.set_fraction(timing.jitter);
            }
            let campaign = self.campaign.borrow_and_update().clone();
            let active = campaign.active();
            let aside = campaign.why_aside();
            let newly_aside = self.state.send_if_modified(|s| {
                let changed = s.standing_aside != aside || s.campaigning != active;
                s.standing_aside.clone_from(&aside);
                s.campaigning = active;
                changed
            });
            if campaign.on && !active {
                if newly_aside && let Some(why) = &aside {
                    info!(lock = %self.elector.lock, %why, "standing aside");
                }
                // Standing aside, keep reading the row each poll as a
                // follower does: its recorded version tells the peer watch
                // which peers the version fence still lets lead.
                self.observe_aside().await;
                continue;
            }
            if !active {
                tokio::select! {
                    _ = self.shutdown.cancelled() => break,
                    _ = self.campaign.changed() => {}
                }
                continue;
            }
            match self.follow_once().await {
                Ok(Some((t_send, grant))) => {
                    errors = self.backoff();
                    self.lead(t_send, grant).await;
                }
                Ok(None) => errors = self.backoff(),
                Err(e) => {
                    let delay = errors.next().unwrap_or(self.timing().retry_period);
                    let change = Change::StoreError(e.to_string());
                    // Log each distinct failure once, not every retry.
                    if self.state.borrow().change != change {
                        warn!(lock = %self.elector.lock, error = %e, ?delay, "store error while following; observing again after a backoff");
                    }
                    self.state
                        .send_if_modified(|s| std::mem::replace(&mut s.change, change.clone()) != change);
                    self.wait(delay).await;
                }
            }
        }
        self.state.send_modify(|s| {
            s.leader = false;
            s.deadline = None;
        });
    }

    /// One round of a candidate standing aside: observe, never acquire,
    /// then wait a poll (a campaign change ends the wait).
    async fn observe_aside(&mut self) {
        let lock = self.elector.lock.clone();
        let poll = self.jitter.apply(self.timing().retry_period);
        match self.bounded(self.store.observe_followed(&lock)).await {
            Ok(observed) => {
                self.publish_observation(&observed, Change::Observed);
                self.wait_or_change(poll, &observed).await;
            }
            Err(e) => {
                debug!(%lock, error = %e, "store error while standing aside");
                self.wait(poll).await;
            }
        }
    }

    /// One follower round: observe; acquire if the lease is free or expired.
    /// `Ok(Some)` means we now lead; `Ok(None)` that we waited a poll.
    async fn follow_once(&mut self) -> Result<Option<(Instant, Grant)>, StoreError> {
        let timing = self.timing();
        let lock = self.elector.lock.clone();
        let me = self.me();
        let asked = now();
        let observed = self.bounded(self.store.observe_followed(&lock)).await?;
        let round_trip = now().saturating_duration_since(asked);
        let claim = Claim {
            holder: &me,
            version: self.elector.version.as_ref(),
            fence: self.elector.fence,
        };
        let recorded = observed.record.as_ref().and_then(|r| r.version.as_ref());
        // Free, but only ours by moving leadership back to an older version.
        let fenced = claim.fenced_by(recorded).filter(|_| observed.live_holder().is_none());
        if let Some(why) = &fenced
            && self.state.borrow().change != Change::Fenced(why.clone())
        {
            warn!(%lock, %why, "staying a follower");
        }
        self.publish_observation(&observed, fenced.clone().map_or(Change::Observed, Change::Fenced));
        if fenced.is_some() {
            // Keep watching: a newer candidate may take it.
            let poll = self.jitter.apply(timing.retry_period);
            self.wait_or_change(poll, &observed).await;
            return Ok(None);
        }
        let predecessor = observed
            .live_holder()
            .filter(|holder| self.elector.identity.succeeds(holder))
            .zip(observed.record.as_ref().and_then(|r| r.token))
            .map(|(holder, token)| Held { holder, token });
        let t_send = now();
        let attempt = match (observed.live_holder(), predecessor) {
            // Our own earlier commit whose reply was lost (S9): confirm it by
            // check-and-set before claiming anything.
            (Some(holder), _) if holder == me => {
                let token = observed
                    .record
                    .as_ref()
                    .and_then(|r| r.token)
                    .ok_or_else(|| StoreError::invalid(format!("lease {lock} is held by us but has no token")))?;
                self.bounded(self.store.renew(&lock, &me, token, timing.lease_duration))
                    .await
            }
            // An earlier process of our own pod, which is gone (the kubelet
            // restarted us): take its lease over by check-and-set on its
            // exact holder and token, for a new term with a higher token.
            (Some(_), Some(from)) => {
                info!(%lock, previous = %from.holder, "taking over the lease of this pod's previous process");
                self.bounded(self.store.take_over(&lock, &claim, from, timing.lease_duration))
                    .await
            }
            (Some(_), None) => {
                // Wake when the lease could expire if that is before the next poll.
                let poll = self.jitter.apply(timing.retry_period);
                let until_expiry = observed
                    .remaining()
                    .map(|r| self.jitter.apply(r + Duration::from_millis(1)));
                let wait = until_expiry.map_or(poll, |e| e.min(poll));
                let wait = self.hurried(round_trip).map_or(wait, |gap| gap.min(wait));
                self.wait_or_change(wait, &observed).await;
                return Ok(None);
            }
            (None, _) => {
                self.bounded(self.store.acquire_as(&lock, &claim, timing.lease_duration))
                    .await
            }
        };
        match attempt {
            Ok(grant) => Ok(Some((t_send, grant))),
            Err(StoreError::OutcomeUnknown { .. }) if self.flaw(Flaw::UnknownOutcomeAsSuccess) => {
                let grant = Grant {
                    term: observed.record.as_ref().map_or(0, |r| r.term) + 1,
                    token: FencingToken(observed.now.0),
                    committed_at: observed.now,
                };
                Ok(Some((t_send, grant)))
            }
            Err(StoreError::Lost { reason, .. }) => {
                debug!(%lock, %reason, "lost the race to acquire");
                let retry = self.jitter.apply(timing.retry_period / 4);
                self.wait(retry).await;
                Ok(None)
            }
            // Maybe we hold it now: back off, then observe before anything else.
            Err(e) => Err(e),
        }
    }

    /// A store call bounded by the retry period, so a hung store cannot
    /// stall a follower forever. Timing out is an unknown outcome.
    async fn bounded<T>(&self, call: impl Future<Output = Result<T, StoreError>>) -> Result<T, StoreError> {
        let limit = now() + self.timing().renew_deadline;
        timeout_at(limit, call)
            .await
            .unwrap_or_else(|_| Err(StoreError::outcome_unknown("store call timed out")))
    }

    fn publish_observation(&self, observed: &Observation, change: Change) {
        let record = observed.record.as_ref();
        let holder = observed.live_holder().map(str::to_string);
        let term = record.map_or(0, |r| r.term);
        let token = record.and_then(|r| r.token);
        let holder_version = record.and_then(|r| r.version.clone());
        self.state.send_if_modified(|s| {
            let same = s.holder == holder
                && s.term == term
                && s.token == token
                && s.holder_version == holder_version
                && !s.leader;
            if !same {
                s.since = holder.as_ref().map(|_| SystemTime::now());
            }
            let modified = !same || s.change != change;
            *s = LeaderState {
                leader: false,
                holder,
                term,
                token,
                holder_version,
                deadline: None,
                renewed: None,
                change: change.clone(),
                ..s.clone()
            };
            modified
        });
    }

    /// Sleeps, waking early for shutdown, a nudge or a campaign change. A
    /// nudge starts a [`Hurry`] window of one retry period.
    async fn wait(&mut self, delay: Duration) {
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = self.shutdown.cancelled() => {}
            _ = self.nudge.notified() => {
                self.hurry = Some(Hurry {
                    until: now() + self.timing().retry_period,
                    gap: None,
                });
            }
            _ = self.campaign.changed() => {}
        }
    }

    /// [`wait`](Self::wait), also ending when the store reports that the
    /// row may differ from `seen` (stores that watch their rows).
    async fn wait_or_change(&mut self, delay: Duration, seen: &Observation) {
        let (store, lock) = (self.store.clone(), self.elector.lock.clone());
        tokio::select! {
            () = self.wait(delay) => {}
            () = store.changed(&lock, seen) => {}
        }
    }

    /// Within a [`Hurry`] window: the next quick re-poll's gap, from one
    /// store round trip (at least 1 ms), doubling.
    fn hurried(&mut self, round_trip: Duration) -> Option<Duration> {
        let hurry = self.hurry.as_mut().filter(|h| now() < h.until);
        let Some(hurry) = hurry else {
            self.hurry = None;
            return None;
        };
        let gap = hurry.gap.map_or(round_trip.max(Duration::from_millis(1)), |g| g * 2);
        hurry.gap = Some(gap);
        Some(gap)
    }

    /// Leads one term: renew every P until lost, deadline, shutdown or campaign end.
    async fn lead(&mut self, t_send: Instant, grant: Grant) {
        let timing = self.timing();
        let lock = self.elector.lock.clone();
        let me = self.me();
        let mut deadline = self.deadline(t_send, now());
        if now() >= deadline {
            // The grant arrived after its own deadline (a late reply, S2).
            warn!(%lock, term = grant.term, "grant arrived after its deadline; not claiming");
            return;
        }
        let cancelled = self.shutdown.child_token();
        self.transition(|s| {
            *s = LeaderState {
                leader: true,
                holder: Some(me.clone()),
                term: grant.term,
                token: Some(grant.token),
                since: Some(SystemTime::now()),
                deadline: Some(deadline),
                renewed: Some(t_send),
                holder_version: self.elector.version.clone(),
                ending: None,
                change: Change::Acquired,
                ..s.clone()
            }
        });
        info!(%lock, term = grant.term, token = %grant.token, "acquired leadership");
        let ctx = LeaderContext {
            term: grant.term,
            token: grant.token,
            cancelled: cancelled.clone(),
            state: self.state.subscribe(),
        };
        // Aborted with the elector (a crash ends the process's work too).
        let work = AbortOnDropHandle::new(
            self.elector
                .sim
                .spawn((self.work.get_mut().unwrap_or_else(|e| e.into_inner()))(ctx)),
        );
        let mut next_renew = t_send + self.jitter.apply(timing.retry_period);
        let mut errors = self.backoff();

        let keeps_term_aside = self.flaw(Flaw::LeaderIgnoresStandAside);
        let ended = loop {
            tokio::select! {
                biased;
                _ = self.shutdown.cancelled() => break Ended::Release,
                _ = self.campaign.wait_for(|c| if keeps_term_aside { !c.on } else { !c.active() }) => break Ended::Release,
                _ = sleep_until(next_renew.min(deadline)) => {}
            }
            if now() >= deadline {
                break Ended::Lost(Change::DeadlineMissed);
            }
            let sent = now();
            let renewed = timeout_at(
                deadline,
                self.store.renew(&lock, &me, grant.token, timing.lease_duration),
            )
            .await;
            let renewed = match renewed {
                Ok(Err(StoreError::OutcomeUnknown { .. })) if self.flaw(Flaw::UnknownOutcomeAsSuccess) => Ok(Ok(grant)),
                other => other,
            };
            match renewed {
                Err(_elapsed) => break Ended::Lost(Change::DeadlineMissed),
                Ok(Ok(_)) if now() >= self.deadline(sent, now()) => {
                    break Ended::Lost(Change::DeadlineMissed);
                }
                Ok(Ok(_)) => {
                    deadline = self.deadline(sent, now());
                    next_renew = sent + self.jitter.apply(timing.retry_period);
                    errors = self.backoff();
                    self.state.send_modify(|s| {
                        s.deadline = Some(deadline);
                        s.renewed = Some(sent);
                        s.change = Change::Renewed;
                    });
                }
                Ok(Err(StoreError::Lost { reason, .. })) => {
                    break Ended::Lost(Change::Lost(reason));
                }
                Ok(Err(e @ StoreError::Invalid { .. })) => break Ended::Lost(Change::Lost(e.chain())),
                Ok(Err(e)) => {
                    // Keep trying until the deadline.
                    let delay = errors.next().unwrap_or(timing.retry_period);
                    warn!(%lock, error = %e, ?delay, "renewal failed; retrying until the deadline");
                    next_renew = now() + delay;
                }
            }
        };

        // Stop claiming first, then wait for the leader work, then release.
        let (change, ending) = match ended {
            Ended::Lost(change) => (change, None),
            Ended::Release => (Change::SteppingDown, Some(self.campaign.borrow().end_reason())),
        };
        let release = ending.is_some();
        let flawed_release = release && self.flaw(Flaw::ReleaseBeforeWorkStopped);
        let mut released = None;
        if let Some(reason) = ending.filter(|_| flawed_release) {
            released = Some(self.release(&lock, &me, grant, reason).await);
        }
        self.transition(|s| {
            s.leader = false;
            s.deadline = None;
            s.ending = ending;
            s.change = change.clone();
        });
        cancelled.cancel();
        if let Err(e) = work.await {
            warn!(%lock, error = %e, "leader work ended abnormally");
        }
        if !release {
            warn!(%lock, term = grant.term, reason = ?change, "stepped down");
        }
        if let Some(reason) = ending.filter(|_| !flawed_release) {
            released = Some(self.release(&lock, &me, grant, reason).await);
        }
        if let Some(outcome) = released {
            self.transition(|s| {
                s.holder = None;
                s.change = outcome;
            });
        }
    }

    /// Releases by check-and-set, recording `reason` (the one it stepped
    /// down for), or with the reservation and reason of a handover asked
    /// for by then; a failure only means the lease expires by itself.
    async fn release(&self, lock: &str, me: &str, grant: Grant, reason: EndReason) -> Change {
        let release = (self.campaign.borrow().handoff.clone()).unwrap_or(Release::because(reason));
        let released = timeout_at(
            now() + self.timing().renew_deadline,
            self.store.release_for(lock, me, grant.token, &release),
        )
        .await;
        let outcome = match released {
            Ok(Ok(())) => {
                let reserved_for = release.handoff.as_ref().map(Handoff::pod_uid);
                let reason = release.reason.as_str();
                info!(%lock, term = grant.term, reserved_for, reason, "released leadership");
                Change::Released
            }
            Ok(Err(e)) => Change::ReleaseFailed(e.to_string()),
            Err(_) => Change::ReleaseFailed("release timed out".into()),
        };
        if let Change::ReleaseFailed(e) = &outcome {
            warn!(%lock, error = %e, "release failed; the lease will expire by itself");
        }
        outcome
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemoryStore;
    use crate::testing_logs::{debug_forms, event, json_events};

    /// Issue 57: a handover's release is logged with the reserved pod's UID
    /// as a value a log pipeline can match, not the Debug form of an Option.
    #[tokio::test(start_paused = true)]
    async fn a_handover_release_is_logged_with_plain_fields() {
        let ((), events) = json_events(async {
            let elector = Elector::new("web", Identity::new(None, None, "web-0"), Timing::default());
            let mut changes = elector.transitions();
            let shutdown = CancellationToken::new();
            let handle = elector.spawn(Arc::new(MemoryStore::new(1)), shutdown.clone());
            let mut state = handle.subscribe();
            state.wait_for(|s| s.leader).await.unwrap();
            let handoff = Handoff::new("uid-target", Duration::from_secs(15)).unwrap();
            handle.control().hand_over(Some(Release::handing_over(handoff, false)));
            // Every change: standing aside, it observes again at once after
            // the release, which `state` (the latest only) may not show.
            while changes.recv().await.unwrap().change != Change::Released {}
            shutdown.cancel();
            handle.join().await;
        })
        .await;
        assert_eq!(event(&events, "released leadership")["reserved_for"], "uid-target");
        assert_eq!(debug_forms(&events), Vec::<String>::new());
    }
}
