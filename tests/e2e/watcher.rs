//! The leadership watcher every scenario runs: it follows the candidate
//! pods' leader labels, the leader-only Service's EndpointSlices and the
//! DistributedLease's status through watches, as a client of the cluster
//! sees them, and records every moment that breaks the promise: two pods
//! labelled leader, two ready endpoints behind the leader Service, a token
//! that goes backwards.
//!
//! A watch delivers one resource's changes in resourceVersion order, so the
//! state it rebuilds is a state the cluster really passed through; each
//! promise is judged within one stream.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, ResourceExt};
use leasehold::api::{DEFAULT_LABEL_KEY, DistributedLease};
use tokio::task::JoinHandle;

use crate::cluster::wait_for;

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
    /// Slice name -> its ready endpoints' pod names.
    endpoints: BTreeMap<String, Vec<String>>,
    /// The highest token the status showed, with its holder.
    token: Option<(u128, String)>,
    violations: Vec<String>,
    /// When the leader Service's ready endpoints changed, and to how many.
    endpoint_history: Vec<(Instant, usize)>,
    /// The pod labelled leader last, and how often that changed.
    last_leader: Option<String>,
    moves: usize,
}

pub struct LeadershipWatcher {
    state: Arc<Mutex<State>>,
    follows_service: bool,
    tasks: Vec<JoinHandle<()>>,
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
            watcher::watcher(pods, config),
            state.clone(),
            started,
            apply_pod,
        ));
        if let Some(service) = watched.service {
            let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), watched.ns);
            let config = watcher::Config::default().labels(&format!("kubernetes.io/service-name={service}"));
            tasks.push(follow(
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

    /// The pods behind the leader Service's ready endpoints now.
    pub fn ready_endpoints(&self) -> Vec<String> {
        let state = self.state.lock().unwrap();
        state.endpoints.values().flatten().cloned().collect()
    }

    /// Waits until exactly one pod is labelled leader and (with a Service)
    /// it is the one ready endpoint; returns it.
    pub async fn one_leader(&self, other_than: Option<&str>, within: Duration) -> String {
        let what = match other_than {
            Some(old) => format!("one leader other than {old}, the leader Service's one endpoint"),
            None => "one leader, the leader Service's one endpoint".to_string(),
        };
        wait_for(&what, within, || async {
            let leaders = self.leaders();
            let [leader] = leaders.as_slice() else { return None };
            if other_than == Some(leader.as_str()) {
                return None;
            }
            (!self.follows_service || self.ready_endpoints() == [leader.clone()]).then(|| leader.clone())
        })
        .await
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
        for task in &self.tasks {
            task.abort();
        }
    }

    /// Stops watching and fails the test on any violation.
    pub fn finish(self) {
        self.stop();
        let state = self.state.lock().unwrap();
        assert!(
            state.violations.is_empty(),
            "the leadership watcher saw {} violation(s) in {:?}:\n{}",
            state.violations.len(),
            self.started.elapsed(),
            state.violations.join("\n")
        );
    }
}

/// Feeds a watch into the state; an error (API server away) is retried by
/// the watcher's backoff, and the relist after it rebuilds the state.
fn follow<K, S>(
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
        while let Some(event) = stream.next().await {
            let Ok(event) = event else { continue };
            let at = started.elapsed();
            let mut state = state.lock().unwrap();
            match event {
                Event::Init => relisted.clear(),
                Event::InitApply(object) => relisted.push(object),
                Event::InitDone => apply(&mut state, Change::Relisted(std::mem::take(&mut relisted)), at),
                Event::Apply(object) => apply(&mut state, Change::Applied(object), at),
                Event::Delete(object) => apply(&mut state, Change::Deleted(object), at),
            }
        }
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
        }
        Change::Applied(pod) => {
            state.labels.insert(pod.name_any(), labelled(&pod));
        }
        Change::Deleted(pod) => {
            state.labels.remove(&pod.name_any());
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
        slice
            .endpoints
            .iter()
            .flatten()
            .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) == Some(true))
            .map(|e| {
                e.target_ref
                    .as_ref()
                    .and_then(|t| t.name.clone())
                    .unwrap_or_else(|| e.addresses.join(","))
            })
            .collect::<Vec<_>>()
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
    let ready_now = state.endpoints.values().map(Vec::len).sum();
    state.endpoint_history.push((Instant::now(), ready_now));
    let endpoints: Vec<&String> = state.endpoints.values().flatten().collect();
    if endpoints.len() > 1 {
        let names: Vec<&str> = endpoints.iter().map(|s| s.as_str()).collect();
        state.violations.push(format!(
            "{at:?}: {} ready leader endpoints: {}",
            names.len(),
            names.join(", ")
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
