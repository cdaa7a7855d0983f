//! The leadership watcher the scenarios run: it follows the candidate
//! pods' leader labels, the leader-only Service's EndpointSlices and the
//! DistributedLease's status through watches, as a client of the cluster
//! sees them, and what each candidate's app sees (its sidecar's `/leader`),
//! and records every moment that breaks the promise: two pods labelled
//! leader, two endpoints behind the leader Service that get traffic, a token
//! that goes backwards, two candidates claiming leadership at once.
//!
//! A watch delivers one resource's changes in resourceVersion order, so the
//! state it rebuilds is a state the cluster really passed through; each
//! promise is judged within one stream. A watch that fails or relists may
//! skip states (an overlap among them): each is recorded as a gap, and a
//! scenario that expects none fails on one. The claims are read from inside
//! each pod's network namespace (the sidecar's API listens on 127.0.0.1
//! only), so they go on through an API-server outage.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, ResourceExt};
use leasehold::api::{DEFAULT_LABEL_KEY, DistributedLease};

use crate::e2e::fixtures::SIDECAR;
use tokio::task::JoinHandle;

/// What the watcher is told to follow.
pub struct Watched<'a> {
    pub ns: &'a str,
    /// The candidate pods' label selector, e.g. `app=scheduler`.
    pub pods: &'a str,
    /// The leader-only Service, if the scenario has one.
    pub service: Option<&'a str>,
    /// The DistributedLease, if the scenario follows its status.
    pub lease: Option<&'a str>,
}

#[derive(Default)]
struct State {
    /// Pod name -> labelled leader.
    labels: BTreeMap<String, bool>,
    /// Pod name -> its running containers, for the claim readers.
    containers: BTreeMap<String, Running>,
    /// Slice name -> its endpoints' pod names: (ready, serving while terminating).
    endpoints: BTreeMap<String, (Vec<String>, Vec<String>)>,
    /// Each watch that failed or relisted, when and why.
    gaps: Vec<String>,
    /// What the candidates' `/leader` said.
    claims: Claims,
    /// The highest token the status showed, with its holder.
    token: Option<(u128, String)>,
    violations: Vec<String>,
    /// When the leader Service's ready endpoints changed, and to how many.
    endpoint_history: Vec<(Instant, usize)>,
    /// The pod labelled leader last, and how often that changed.
    last_leader: Option<String>,
    moves: usize,
}

/// The pods whose candidates claim to lead, read afresh on each call.
pub type ClaimsNow = Box<dyn Fn() -> Vec<String> + Send + Sync>;

pub struct LeadershipWatcher {
    state: Arc<Mutex<State>>,
    follows_service: bool,
    tasks: Vec<JoinHandle<()>>,
    /// Tells the claim readers (threads) to stop.
    stopped: Arc<AtomicBool>,
    started: Instant,
}

impl LeadershipWatcher {
    pub fn start(client: &Client, watched: Watched<'_>) -> LeadershipWatcher {
        let state = Arc::new(Mutex::new(State::default()));
        let started = Instant::now();
        let mut tasks = Vec::new();
        let pods: Api<Pod> = Api::namespaced(client.clone(), watched.ns);
        let config = watcher::Config::default().labels(watched.pods);
        tasks.push(follow(
            "pods",
            watcher::watcher(pods, config),
            state.clone(),
            started,
            apply_pod,
        ));
        let stopped = Arc::new(AtomicBool::new(false));
        tasks.push(read_claims(state.clone(), started, stopped.clone()));
        if let Some(service) = watched.service {
            let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), watched.ns);
            let config = watcher::Config::default().labels(&format!("kubernetes.io/service-name={service}"));
            tasks.push(follow(
                "EndpointSlices",
                watcher::watcher(slices, config),
                state.clone(),
                started,
                apply_slice,
            ));
        }
        if let Some(lease) = watched.lease {
            let leases: Api<DistributedLease> = Api::namespaced(client.clone(), watched.ns);
            let config = watcher::Config::default().fields(&format!("metadata.name={lease}"));
            tasks.push(follow(
                "DistributedLease",
                watcher::watcher(leases, config),
                state.clone(),
                started,
                apply_lease,
            ));
        }
        LeadershipWatcher {
            state,
            follows_service: watched.service.is_some(),
            tasks,
            stopped,
            started,
        }
    }

    /// The pods labelled leader now.
    pub fn leaders(&self) -> Vec<String> {
        let state = self.state.lock().unwrap();
        state
            .labels
            .iter()
            .filter(|(_, leads)| **leads)
            .map(|(p, _)| p.clone())
            .collect()
    }

    /// Who claims to lead now, as the claim readers last read it, for a
    /// watcher that runs beside this one (the two-cluster scenarios).
    pub fn claims_now(&self) -> ClaimsNow {
        let state = self.state.clone();
        Box::new(move || state.lock().unwrap().claims.latest.keys().cloned().collect())
    }

    /// The pods behind the leader Service's endpoints that get traffic now.
    pub fn ready_endpoints(&self) -> Vec<String> {
        self.state.lock().unwrap().served()
    }

    /// What `pod`'s sidecar last answered on `/leader` while it led.
    pub fn claim_of(&self, pod: &str) -> Option<Claim> {
        self.state.lock().unwrap().claims.latest.get(pod).cloned()
    }

    /// When `pod`'s sidecar was first seen claiming a term after `after`.
    pub fn claimed_after(&self, pod: &str, after: Instant) -> Option<Instant> {
        let state = self.state.lock().unwrap();
        let spans = state.claims.spans.iter().filter(|((p, _), _)| p == pod);
        spans.map(|(_, span)| span.from).filter(|from| *from >= after).min()
    }

    /// `pod`'s claim of the term with `token`: the arrival of the first
    /// answer saying it leads (it claimed before that instant) and the
    /// sending of the last request it answered leading (it stopped after).
    pub fn claim_span(&self, pod: &str, token: &str) -> Option<(Instant, Instant)> {
        let state = self.state.lock().unwrap();
        let span = state.claims.spans.get(&(pod.to_string(), token.to_string()));
        span.map(|span| (span.from, span.to))
    }

    /// The pods whose sidecar claimed a term on `/leader` so far.
    pub fn claimants(&self) -> BTreeSet<String> {
        let state = self.state.lock().unwrap();
        state.claims.spans.keys().map(|(pod, _)| pod.clone()).collect()
    }

    /// The gaps (watches that failed or relisted) so far.
    pub fn gaps(&self) -> Vec<String> {
        self.state.lock().unwrap().gaps.clone()
    }

    /// Waits until exactly one pod is labelled leader, (with a Service) it
    /// is the one endpoint that gets traffic, and its sidecar claims the
    /// lease on `/leader`; returns it.
    pub async fn one_leader(&self, other_than: Option<&str>, within: Duration) -> String {
        let what = match other_than {
            Some(old) => format!("one leader other than {old}, the leader Service's one endpoint"),
            None => "one leader, the leader Service's one endpoint".to_string(),
        };
        let started = Instant::now();
        loop {
            let leaders = self.leaders();
            if let [leader] = leaders.as_slice()
                && other_than != Some(leader.as_str())
            {
                let claims = self.state.lock().unwrap().claims.latest.contains_key(leader);
                if claims && (!self.follows_service || self.ready_endpoints() == [leader.clone()]) {
                    return leader.clone();
                }
            }
            // Which of the three was missing is what a failed run needs.
            assert!(
                started.elapsed() < within,
                "{what}: not within {within:?}; the watcher saw {}",
                self.state.lock().unwrap().describe()
            );
            tokio::time::sleep(crate::e2e::cluster::POLL).await;
        }
    }

    /// How many times the leader label moved to another pod.
    pub fn moves(&self) -> usize {
        self.state.lock().unwrap().moves
    }

    /// How long the leader Service had no ready endpoint between `from` and
    /// `to`, as a client watching its EndpointSlices saw it.
    pub fn leaderless_between(&self, from: Instant, to: Instant) -> Duration {
        let state = self.state.lock().unwrap();
        let mut count_at_from = 0;
        let mut changes = Vec::new();
        for (at, count) in &state.endpoint_history {
            if *at <= from {
                count_at_from = *count;
            } else if *at < to {
                changes.push((*at, *count));
            }
        }
        let (mut total, mut since, mut count) = (Duration::ZERO, from, count_at_from);
        for (at, next) in changes {
            if count == 0 {
                total += at - since;
            }
            (since, count) = (at, next);
        }
        if count == 0 {
            total += to - since;
        }
        total
    }

    /// The violations seen so far.
    pub fn violations(&self) -> Vec<String> {
        self.state.lock().unwrap().violations.clone()
    }

    /// Stops watching (the benchmark counts the violations instead).
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::Relaxed);
        for task in &self.tasks {
            task.abort();
        }
    }

    /// The highest status token shown so far.
    pub fn highest_token(&self) -> Option<u128> {
        self.state.lock().unwrap().token.as_ref().map(|(token, _)| *token)
    }

    /// Stops watching and fails the test on any violation, or on any gap
    /// (a watch failed or relisted: what it skipped went unchecked).
    pub fn finish(self) {
        self.stop();
        self.assert_no_violations();
        let gaps = self.gaps();
        assert!(
            gaps.is_empty(),
            "the leadership watcher's view has {} gap(s) in a scenario that expects none:\n{}",
            gaps.len(),
            gaps.join("\n")
        );
        self.assert_claims_read();
    }

    /// Stops watching, fails the test on any violation, and returns the
    /// gaps, for a scenario that expects some (the API server stopped) and
    /// checks across them from the store's own record.
    pub fn finish_across_gaps(self) -> Vec<String> {
        self.stop();
        self.assert_no_violations();
        self.assert_claims_read();
        self.gaps()
    }

    fn assert_no_violations(&self) {
        let state = self.state.lock().unwrap();
        assert!(
            state.violations.is_empty(),
            "the leadership watcher saw {} violation(s) in {:?}:\n{}",
            state.violations.len(),
            self.started.elapsed(),
            state.violations.join("\n")
        );
    }

    /// The claims were read at all: a watcher that cannot enter the pods'
    /// network namespaces must not pass for one that saw no overlap.
    fn assert_claims_read(&self) {
        assert!(
            self.state.lock().unwrap().claims.answers > 0,
            "no candidate's /leader ever answered the watcher: it reads them inside the pods' network \
             namespaces, as root on the node's machine"
        );
    }
}

impl Drop for LeadershipWatcher {
    fn drop(&mut self) {
        self.stop();
    }
}

impl State {
    /// What the watcher holds now, for a failure's message.
    fn describe(&self) -> String {
        let labelled: Vec<&String> = self.labels.iter().filter(|(_, l)| **l).map(|(p, _)| p).collect();
        let claiming: Vec<&String> = self.claims.latest.keys().collect();
        let read: Vec<String> = (self.containers.iter())
            .map(|(pod, running)| format!("{pod} ({} running containers)", running.ids.len()))
            .collect();
        format!(
            "pods {:?}, labelled leader {labelled:?}, claiming on /leader {claiming:?} ({} answers in all), \
             ready leader endpoints {:?}, pods whose claims are read {read:?}, gaps {:?}",
            self.labels.keys().collect::<Vec<_>>(),
            self.claims.answers,
            self.served(),
            self.gaps,
        )
    }

    /// The endpoints that get traffic: the ready ones, or, while there is
    /// none, the terminating ones still serving (kube-proxy falls back to
    /// those: KEP-1669, "Proxy Terminating Endpoints").
    fn served(&self) -> Vec<String> {
        let ready: Vec<String> = self.endpoints.values().flat_map(|(r, _)| r.clone()).collect();
        if ready.is_empty() {
            self.endpoints.values().flat_map(|(_, t)| t.clone()).collect()
        } else {
            ready
        }
    }
}

/// Feeds a watch into the state; an error (API server away) is retried by
/// the watcher's backoff, and the relist after it rebuilds the state. Both
/// are gaps: what happened meanwhile was not seen.
fn follow<K, S>(
    what: &'static str,
    stream: S,
    state: Arc<Mutex<State>>,
    started: Instant,
    apply: fn(&mut State, Change<K>, Duration),
) -> JoinHandle<()>
where
    K: Send + 'static,
    S: Stream<Item = Result<Event<K>, watcher::Error>> + Send + 'static,
{
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream.default_backoff());
        let mut relisted: Vec<K> = Vec::new();
        let mut listed = false;
        while let Some(event) = stream.next().await {
            let at = started.elapsed();
            let mut state = state.lock().unwrap();
            let event = match event {
                Ok(event) => event,
                Err(e) => {
                    state.gaps.push(format!("{at:?}: the {what} watch failed: {e}"));
                    continue;
                }
            };
            match event {
                Event::Init => {
                    if listed {
                        state.gaps.push(format!("{at:?}: the {what} watch relisted"));
                    }
                    relisted.clear();
                }
                Event::InitApply(object) => relisted.push(object),
                Event::InitDone => {
                    listed = true;
                    apply(&mut state, Change::Relisted(std::mem::take(&mut relisted)), at);
                }
                Event::Apply(object) => apply(&mut state, Change::Applied(object), at),
                Event::Delete(object) => apply(&mut state, Change::Deleted(object), at),
            }
        }
        let at = started.elapsed();
        state
            .lock()
            .unwrap()
            .gaps
            .push(format!("{at:?}: the {what} watch ended"));
    })
}

enum Change<K> {
    /// A complete list, replacing what was known.
    Relisted(Vec<K>),
    Applied(K),
    Deleted(K),
}

fn apply_pod(state: &mut State, change: Change<Pod>, at: Duration) {
    let labelled = |pod: &Pod| pod.labels().get(DEFAULT_LABEL_KEY).is_some_and(|v| v == "true");
    match change {
        Change::Relisted(pods) => {
            state.labels = pods.iter().map(|p| (p.name_any(), labelled(p))).collect();
            state.containers = pods
                .iter()
                .filter_map(|p| Some((p.name_any(), running_containers(p)?)))
                .collect();
        }
        Change::Applied(pod) => {
            state.labels.insert(pod.name_any(), labelled(&pod));
            if let Some(running) = running_containers(&pod) {
                state.containers.insert(pod.name_any(), running);
            }
        }
        Change::Deleted(pod) => {
            state.labels.remove(&pod.name_any());
            state.containers.remove(&pod.name_any());
        }
    }
    let leaders: Vec<String> = state
        .labels
        .iter()
        .filter(|(_, l)| **l)
        .map(|(p, _)| p.clone())
        .collect();
    if leaders.len() > 1 {
        state.violations.push(format!(
            "{at:?}: {} pods labelled leader: {}",
            leaders.len(),
            leaders.join(", ")
        ));
    }
    if let [leader] = leaders.as_slice()
        && state.last_leader.as_ref() != Some(leader)
    {
        if state.last_leader.is_some() {
            state.moves += 1;
        }
        state.last_leader = Some(leader.clone());
    }
}

fn apply_slice(state: &mut State, change: Change<EndpointSlice>, at: Duration) {
    let ready = |slice: &EndpointSlice| {
        let (mut ready, mut terminating) = (Vec::new(), Vec::new());
        for endpoint in slice.endpoints.iter().flatten() {
            let name = endpoint
                .target_ref
                .as_ref()
                .and_then(|t| t.name.clone())
                .unwrap_or_else(|| endpoint.addresses.join(","));
            let conditions = endpoint.conditions.clone().unwrap_or_default();
            if conditions.ready == Some(true) {
                ready.push(name);
            } else if conditions.serving == Some(true) && conditions.terminating == Some(true) {
                terminating.push(name);
            }
        }
        (ready, terminating)
    };
    match change {
        Change::Relisted(slices) => {
            state.endpoints = slices.iter().map(|s| (s.name_any(), ready(s))).collect();
        }
        Change::Applied(slice) => {
            state.endpoints.insert(slice.name_any(), ready(&slice));
        }
        Change::Deleted(slice) => {
            state.endpoints.remove(&slice.name_any());
        }
    }
    let served = state.served();
    state.endpoint_history.push((Instant::now(), served.len()));
    if served.len() > 1 {
        state.violations.push(format!(
            "{at:?}: {} ready leader endpoints: {}",
            served.len(),
            served.join(", ")
        ));
    }
}

fn apply_lease(state: &mut State, change: Change<DistributedLease>, at: Duration) {
    let leases = match change {
        Change::Relisted(leases) => leases,
        Change::Applied(lease) => vec![lease],
        Change::Deleted(_) => return,
    };
    for lease in leases {
        let Some(status) = lease.status else { continue };
        let Some(token) = status.token.as_deref() else { continue };
        let holder = status.holder.clone().unwrap_or_default();
        let Ok(value) = token.parse::<u128>() else {
            state
                .violations
                .push(format!("{at:?}: status token {token:?} is not a number"));
            continue;
        };
        match &state.token {
            Some((seen, seen_holder)) if value < *seen => state.violations.push(format!(
                "{at:?}: token went backwards: {seen} ({seen_holder}) then {value} ({holder})"
            )),
            Some((seen, seen_holder)) if value == *seen && holder != *seen_holder && !holder.is_empty() => {
                state.violations.push(format!(
                    "{at:?}: holder changed from {seen_holder} to {holder} with the same token {value}"
                ))
            }
            _ => state.token = Some((value, holder)),
        }
    }
}

/// A pod's running containers: any one leads into the pod's network
/// namespace; the sidecar's process tells a frozen sidecar from one that
/// fails to answer.
#[derive(Clone)]
struct Running {
    uid: String,
    ids: BTreeSet<String>,
    sidecar: Option<String>,
}

/// A pod's UID and the IDs of its running containers, if one runs.
fn running_containers(pod: &Pod) -> Option<Running> {
    let uid = pod.metadata.uid.clone()?;
    let status = pod.status.as_ref()?;
    let statuses = status
        .container_statuses
        .iter()
        .flatten()
        .chain(status.init_container_statuses.iter().flatten());
    let running: Vec<(&str, String)> = statuses
        .filter(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
        .filter_map(|c| Some((c.name.as_str(), c.container_id.as_deref()?)))
        .map(|(name, id)| (name, id.rsplit("://").next().unwrap_or(id).to_string()))
        .collect();
    let sidecar = running
        .iter()
        .find(|(name, _)| *name == SIDECAR)
        .map(|(_, id)| id.clone());
    let ids: BTreeSet<String> = running.into_iter().map(|(_, id)| id).collect();
    (!ids.is_empty()).then_some(Running { uid, ids, sidecar })
}

/// What a leading candidate's `/leader` said.
#[derive(Clone, Debug)]
pub struct Claim {
    /// The full identity (pod, nonce, pod UID) the sidecar holds the lease as.
    pub holder: String,
    pub term: u64,
    pub token: String,
}

/// One term as one pod claimed it: the claim is certain from the first
/// answer's arrival to the last request's sending (a term is one
/// continuous holding), and each answer was true somewhen in its request.
struct Span {
    from: Instant,
    to: Instant,
}

#[derive(Default)]
struct Claims {
    /// (pod, token) -> when that pod certainly claimed that term.
    spans: BTreeMap<(String, String), Span>,
    /// Pod -> its latest claim while it led (removed when it answers "not leading").
    latest: BTreeMap<String, Claim>,
    /// How many answers came at all (the readers work).
    answers: usize,
    /// Pairs of claims already reported.
    reported: BTreeSet<(String, String)>,
}

/// The sidecar's local API, as the app container reaches it.
const SIDECAR_API: &str = "127.0.0.1:4040";
/// How often each candidate's claim is read: a claim that overlaps another
/// by more than two periods (and the readers' scheduling delay, which a
/// loaded machine stretches) is certain to be seen; watcher_catches prints
/// how long a planted overlap lasted before it was reported.
pub const CLAIM_PERIOD: Duration = Duration::from_millis(10);
/// How long one read may take: a sidecar slower than this is not answering.
/// Generous, as the read's length costs no soundness (a claim's certain
/// span runs from its first answer's receipt to its last one's send) and a
/// slow answer is the machine's: a 2 s bound once reported a running
/// sidecar as silent with clippy built beside two scenarios on the two
/// cores.
pub const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Starts a claim reader for each candidate pod as it appears.
fn read_claims(state: Arc<Mutex<State>>, started: Instant, stopped: Arc<AtomicBool>) -> JoinHandle<()> {
    tokio::spawn(async move {
        // Pod UIDs: one reader per pod, in its network namespace, which
        // outlives any one of its containers.
        let mut reading: BTreeSet<String> = BTreeSet::new();
        while !stopped.load(Ordering::Relaxed) {
            let containers = state.lock().unwrap().containers.clone();
            for (pod, running) in containers {
                if reading.insert(running.uid.clone()) {
                    let (state, stopped) = (state.clone(), stopped.clone());
                    std::thread::spawn(move || read_claim(&pod, &running.uid, &state, started, &stopped));
                }
            }
            tokio::time::sleep(crate::e2e::cluster::POLL).await;
        }
    })
}

/// Enters the pod's network namespace (this thread only) and reads its
/// sidecar's `/leader` until the watcher stops or the pod is gone.
fn read_claim(pod: &str, uid: &str, state: &Mutex<State>, started: Instant, stopped: &AtomicBool) {
    let running = || {
        let state = state.lock().unwrap();
        state.containers.get(pod).filter(|r| r.uid == uid).cloned()
    };
    // Any running container leads into the namespace; one that ended
    // between the pod's status and this look leaves it to the next.
    let netns = loop {
        if stopped.load(Ordering::Relaxed) {
            return;
        }
        let Some(now) = running() else { return };
        let found = (now.ids.iter())
            .filter_map(|id| crate::e2e::node::container_main_pid(id))
            .find_map(|pid| match std::fs::File::open(format!("/proc/{pid}/ns/net")) {
                Ok(netns) => Some(netns),
                // It ended between the two looks.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                Err(e) => panic!("the network namespace of {pod} (pid {pid}): {e}: the watcher runs as root"),
            });
        match found {
            Some(netns) => break netns,
            None => std::thread::sleep(crate::e2e::cluster::POLL),
        }
    };
    // setns(2) moves only this thread.
    rustix::thread::move_into_link_name_space(
        std::os::fd::AsFd::as_fd(&netns),
        Some(rustix::thread::LinkNameSpaceType::Network),
    )
    .unwrap_or_else(|e| panic!("entering {pod}'s network namespace: {e}"));
    let mut sidecar = SidecarProcess::default();
    // A run of failed reads is one gap, reported at its first failure.
    let mut in_gap = false;
    while !stopped.load(Ordering::Relaxed) {
        let Some(now) = running() else {
            // The pod is gone, and its claim with it.
            state.lock().unwrap().claims_nothing(pod);
            return;
        };
        let silent_before = sidecar.silent(now.sidecar.as_deref());
        let sent = Instant::now();
        let read = get_leader();
        let received = Instant::now();
        match read {
            Read::Answer(answer) => {
                in_gap = false;
                state.lock().unwrap().claim(pod, answer, sent, received, started);
            }
            // Nothing listens, or the listener closed with this connection
            // queued: the sidecar binds its API before its elector starts
            // and closes it after the elector stopped (sidecar::run), so it
            // claims nothing, to its app as to us.
            Read::Closed => {
                in_gap = false;
                state.lock().unwrap().claims_nothing(pod);
            }
            // A frozen or dying sidecar answers no one, its app included:
            // what it claims is read again when it (or its successor) runs.
            Read::Failed(_) if silent_before || sidecar.silent(now.sidecar.as_deref()) => {}
            Read::Failed(why) => {
                if !in_gap {
                    in_gap = true;
                    let at = sent - started;
                    state.lock().unwrap().gaps.push(format!(
                        "{at:?}: {pod}'s sidecar runs but did not answer /leader ({why}): \
                         what it claimed until its next answer is unknown"
                    ));
                }
            }
        }
        std::thread::sleep(CLAIM_PERIOD);
    }
}

/// The sidecar container's main process, found once per container.
#[derive(Default)]
struct SidecarProcess {
    found: Option<(String, Option<u32>)>,
}

impl SidecarProcess {
    /// The process of `container` answers no one: it is stopped (SIGSTOP,
    /// state `T`), or it exits or has (a zombie, or `PF_EXITING` set in its
    /// flags before its sockets close), or it is gone (proc(5); the flag:
    /// linux include/linux/sched.h). A reset from a dying sidecar is not a
    /// gap: a dead process claims nothing, and its successor is read anew.
    fn silent(&mut self, container: Option<&str>) -> bool {
        const PF_EXITING: u64 = 0x4;
        let Some(container) = container else { return false };
        if self.found.as_ref().is_none_or(|(id, _)| id != container) {
            self.found = Some((container.to_string(), crate::e2e::node::container_main_pid(container)));
        }
        let Some((_, Some(pid))) = &self.found else { return true };
        let fields = crate::e2e::node::stat_fields(*pid);
        let exiting = fields
            .get(6)
            .and_then(|f| f.parse::<u64>().ok())
            .is_some_and(|flags| flags & PF_EXITING != 0);
        !crate::e2e::node::in_container(*pid, container)
            || exiting
            || matches!(fields.first().map(String::as_str), None | Some("T" | "t" | "Z" | "X"))
    }
}

/// One read of `/leader`.
enum Read {
    Answer(serde_json::Value),
    /// The connection was refused or reset unanswered: the API's listener
    /// is closed or closing.
    Closed,
    /// Anything else: a timeout, a reset, an answer that is not a claim.
    Failed(String),
}

/// `GET /leader` on the sidecar's API.
fn get_leader() -> Read {
    use std::io::{Read as _, Write};
    let address = SIDECAR_API.parse().expect("the sidecar API's address");
    let mut stream = match std::net::TcpStream::connect_timeout(&address, READ_TIMEOUT) {
        Ok(stream) => stream,
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => return Read::Closed,
        Err(e) => return Read::Failed(format!("connecting: {e}")),
    };
    let mut response = String::new();
    let exchanged = stream
        .set_read_timeout(Some(READ_TIMEOUT))
        .and_then(|()| stream.write_all(b"GET /leader HTTP/1.0\r\nHost: localhost\r\n\r\n"))
        .and_then(|()| stream.read_to_string(&mut response));
    match exchanged {
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset && response.is_empty() => return Read::Closed,
        Err(e) => return Read::Failed(e.to_string()),
        Ok(_) => {}
    }
    let body = response.split_once("\r\n\r\n").map(|(_, body)| body);
    match body.and_then(|body| serde_json::from_str(body).ok()) {
        Some(answer) => Read::Answer(answer),
        None => Read::Failed(format!(
            "not a claim: {:?}",
            response.lines().next().unwrap_or_default()
        )),
    }
}

impl State {
    /// `pod` claims nothing now (its sidecar's API is closed, or the pod
    /// is gone): [`LeadershipWatcher::claims_now`] no longer names it.
    fn claims_nothing(&mut self, pod: &str) {
        self.claims.latest.remove(pod);
    }

    /// Records one `/leader` answer, sent and received at these instants,
    /// and reports a claim that certainly overlapped another pod's.
    fn claim(&mut self, pod: &str, answer: serde_json::Value, sent: Instant, received: Instant, started: Instant) {
        self.claims.answers += 1;
        if answer["leader"] != true {
            self.claims_nothing(pod);
            return;
        }
        let token = answer["token"].as_str().unwrap_or_default().to_string();
        let claim = Claim {
            holder: answer["holder"].as_str().unwrap_or_default().to_string(),
            term: answer["term"].as_u64().unwrap_or_default(),
            token: token.clone(),
        };
        self.claims.latest.insert(pod.to_string(), claim);
        let key = (pod.to_string(), token.clone());
        let span = self.claims.spans.entry(key.clone()).or_insert(Span {
            from: received,
            to: sent,
        });
        span.to = span.to.max(sent);
        let (from, to) = (span.from, span.to);
        let mut found = Vec::new();
        for ((other, other_token), span) in &self.claims.spans {
            if other == pod {
                continue;
            }
            let same_token = *other_token == token;
            // This answer fell within the other's certain claim, or the two
            // certain claims overlap.
            let inside = span.from <= sent && received <= span.to;
            let overlap = from <= to && span.from <= span.to && span.from < to && from < span.to;
            if same_token || inside || overlap {
                found.push((other.clone(), other_token.clone()));
            }
        }
        for (other, other_token) in found {
            let pair = (format!("{pod}#{token}"), format!("{other}#{other_token}"));
            if self.claims.reported.insert(pair) {
                let at = received - started;
                self.violations.push(format!(
                    "{at:?}: two candidates claim leadership on /leader: {pod} (token {token}) and {other} (token {other_token})"
                ));
            }
        }
    }
}
