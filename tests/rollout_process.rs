//! Issue 16 across whole processes: a Deployment rollout of three
//! `leasehold sidecar` processes on the Cloud Spanner emulator, each with the
//! Kubernetes API on (publisher, peer watch, version from its ReplicaSet,
//! the app-health source `--app-container app`), talking to the API server
//! model (`ApiServer::serve_http`) through a kubeconfig. Old pods, of
//! revision 1, are replaced one at a time in the order a Deployment with
//! maxSurge 1 / maxUnavailable 0 uses: a new pod (revision 2) starts, its
//! app turns ready, then one old pod is terminated (SIGTERM, then deleted),
//! the old leader first (the Deployment controller does not know which old
//! pod leads, and this order costs the most). `support::rollout` runs the
//! same scenario in one process on paused time.
//!
//! Leadership is read from the lease row: its term is +1 on every
//! acquisition (`LeaseRecord::term`), so the term's growth counts every
//! handover, however short; the row's version says which revision holds
//! each term, sampled every 20 ms.

mod support;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use leasehold::api::DEFAULT_LABEL_KEY;
use leasehold::lease::LeaseStore;
use leasehold::sidecar::publish::{LOCK_LABEL, lock_label_value};
use leasehold::store::spanner::{SpannerConfig, SpannerStore};
use leasehold::testing::api::{ApiServer, pods};
use leasehold::testing::{Emulator, TcpProxy};
use serde_json::json;
use support::rollout::{NAMESPACE, insert_replica_sets, pod_json, update};
use support::*;

const LOCK: &str = "web";

/// The lease row at one moment: (term, revision of its holder's version).
type Sample = (u64, Option<u64>);

struct Rollout {
    runtime: tokio::runtime::Runtime,
    emulator: Emulator,
    config: SpannerConfig,
    api: ApiServer,
    kubeconfig: PathBuf,
    prefer: &'static str,
    /// Every distinct (term, revision) the lease row showed, in order.
    samples: Arc<Mutex<Vec<Sample>>>,
}

impl Rollout {
    fn new(prefer: &'static str) -> Rollout {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let emulator = Emulator::start_or_connect();
        let api = ApiServer::new(Some(leasehold::sidecar::rbac::allows_request));
        insert_replica_sets(&api);
        let (config, store, addr) = runtime.block_on(async {
            let (config, store) = lease_database(&emulator).await;
            (config, store, api.serve_http().await)
        });
        let kubeconfig = std::env::temp_dir().join(format!("leasehold-rollout-{:08x}.yaml", rand::random::<u32>()));
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: model\n  cluster:\n    server: http://{addr}\n\
                 users:\n- name: anonymous\n  user: {{}}\ncontexts:\n- name: model\n  context:\n    cluster: model\n    \
                 user: anonymous\n    namespace: {NAMESPACE}\ncurrent-context: model\n"
            ),
        )
        .unwrap();
        let samples = Arc::new(Mutex::new(Vec::new()));
        runtime.spawn(sample_lease(store, samples.clone()));
        Rollout {
            runtime,
            emulator,
            config,
            api,
            kubeconfig,
            prefer,
            samples,
        }
    }

    /// A pod of `replica_set` in the model and its sidecar process.
    fn start(&self, name: &str, replica_set: &str, ready: bool) -> Sidecar {
        let mut pod = pod_json(name, replica_set, ready);
        pod["metadata"]["labels"][LOCK_LABEL] = json!(lock_label_value(LOCK));
        self.api.insert(&pods::collection(NAMESPACE), pod);
        let proxy = self
            .runtime
            .block_on(TcpProxy::start(self.emulator.host.parse().unwrap()));
        let (store, mut env) = spanner_store(&self.emulator, &self.config, &proxy);
        env.extend([
            ("LEASEHOLD_KUBERNETES".into(), "true".into()),
            ("POD_NAMESPACE".into(), NAMESPACE.into()),
            ("KUBECONFIG".into(), self.kubeconfig.display().to_string()),
        ]);
        let mut flags = vec![
            "--app-container".to_string(),
            "app".into(),
            "--prefer".into(),
            self.prefer.into(),
        ];
        if self.prefer != "none" {
            flags.push("--version-fence".into());
        }
        Sidecar::launch(name, proxy, LOCK, &store, &env, &flags)
    }

    fn samples(&self) -> Vec<Sample> {
        self.samples.lock().unwrap().clone()
    }

    /// The lease row's last sample; waits for the first.
    fn last(&self) -> Sample {
        let started = Instant::now();
        loop {
            if let Some(last) = self.samples().last() {
                return *last;
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "the lease row is never read"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Rollout {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.kubeconfig);
    }
}

/// Records the lease row's (term, revision) each time it changes.
async fn sample_lease(store: SpannerStore, samples: Arc<Mutex<Vec<Sample>>>) {
    loop {
        if let Ok(observation) = store.observe(LOCK).await
            && let Some(record) = observation.record
        {
            let sample = (record.term, record.version.map(|v| v.revision));
            let mut samples = samples.lock().unwrap();
            if samples.last() != Some(&sample) {
                samples.push(sample);
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// What one rollout did.
#[derive(Debug)]
struct Outcome {
    /// Acquisitions after the first old leader's.
    handovers: u64,
    /// The lease row's (term, revision) from the first old leader on.
    samples: Vec<Sample>,
}

/// Three old candidates, replaced one at a time. After every step a leader
/// is asserted within the crash failover bound (`failover_bound`: D +
/// P·(1 + J) + margin), which covers any graceful handover too: a yield or
/// a SIGTERM releases after the drain (200 ms < D), and a follower acquires
/// at its next poll.
fn rollout(prefer: &'static str) -> Outcome {
    let rollout = Rollout::new(prefer);
    let mut old: Vec<Sidecar> = (0..3)
        .map(|i| rollout.start(&format!("web-r1-{i}"), "web-r1", true))
        .collect();
    let all: Vec<&Sidecar> = old.iter().collect();
    // Start-up (process, store session, version lookup) is not bounded by D/R/P.
    wait_for_one_leader(&all, Duration::from_secs(20)).expect("an old leader");
    let (first_term, first_revision) = rollout.last();
    assert_eq!(first_revision, Some(1), "an old pod leads first");
    let mut new: Vec<Sidecar> = Vec::new();
    for i in 0..3 {
        let name = format!("web-r2-{i}");
        new.push(rollout.start(&name, "web-r2", false));
        // The app starts: its sidecar is up and the app not ready yet.
        let started = Instant::now();
        while new[i].leader().is_none() {
            assert!(started.elapsed() < Duration::from_secs(20), "{name} never answers");
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(P * 2);
        assert!(!new[i].leads(), "{name} leads before its app is ready");
        update(&rollout.api, &name, |pod| {
            pod["status"]["containerStatuses"][0]["ready"] = json!(true)
        });
        // The pod watch brings the ready app to the sidecar, which campaigns.
        if prefer == "newest" {
            // Before any old pod goes: an old leader sees a ready newer
            // peer, stands aside (drain, release) and a new pod acquires at
            // its next poll, within the failover bound.
            let bound = failover_bound();
            let started = Instant::now();
            while !new.iter().any(Sidecar::leads) {
                assert!(
                    started.elapsed() < bound,
                    "no new pod leads {bound:?} after {name} turned ready: {:?}",
                    rollout.samples()
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        } else {
            std::thread::sleep(P * 2);
        }
        // The new pod is available: one old pod goes, the leader if an old one leads.
        let victim = old.iter().position(Sidecar::leads).unwrap_or(0);
        let mut victim = old.remove(victim);
        update(&rollout.api, &victim.name, |pod| {
            pod["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z")
        });
        victim.signal("TERM");
        let status = victim.child.wait().unwrap();
        assert!(status.success(), "{} exits 0 on SIGTERM: {status}", victim.name);
        rollout.api.delete(&pods::collection(NAMESPACE), &victim.name);
        let live: Vec<&Sidecar> = old.iter().chain(&new).collect();
        let bound = failover_bound();
        wait_for_one_leader(&live, bound)
            .unwrap_or_else(|| panic!("no leader within {bound:?} after {} exited", victim.name));
    }
    // Settled: every later acquisition would show within a lease duration.
    std::thread::sleep(D);
    let live: Vec<&Sidecar> = new.iter().collect();
    let leader = wait_for_one_leader(&live, failover_bound()).expect("a new leader at the end");
    // The publishers reached the model over HTTP: the leader's pod alone is
    // labelled, once its publisher's patch lands (one API round trip).
    let labelled = || {
        let mut names: Vec<String> = new
            .iter()
            .filter(|s| {
                rollout
                    .api
                    .get(&pods::collection(NAMESPACE), &s.name)
                    .is_some_and(|pod| pods::label(&pod, DEFAULT_LABEL_KEY) == Some("true"))
            })
            .map(|s| s.name.clone())
            .collect();
        names.sort();
        names
    };
    let started = Instant::now();
    while labelled() != [new[leader].name.clone()] {
        assert!(
            started.elapsed() < P * 4,
            "only {} should be labelled leader: {:?}",
            new[leader].name,
            labelled()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let samples = rollout.samples();
    let (last_term, last_revision) = *samples.last().unwrap();
    assert_eq!(last_revision, Some(2), "a new pod leads at the end: {samples:?}");
    Outcome {
        handovers: last_term - first_term,
        samples: samples.into_iter().filter(|(term, _)| *term >= first_term).collect(),
    }
}

/// Terms whose holder had a lower revision than an earlier term's holder.
fn backwards(samples: &[Sample]) -> usize {
    samples.windows(2).filter(|w| w[1].1 < w[0].1).count()
}

/// Leadership moves to revision 2 once, when the first new pod turns
/// ready (before any old pod goes; with `--prefer none` in its place no new
/// pod leads then, which fails), and never back.
#[test]
fn newest_with_the_fence_hands_over_once_across_processes() {
    let outcome = rollout("newest");
    println!("newest + fence: {outcome:?}");
    assert_eq!(outcome.handovers, 1, "{outcome:?}");
    assert_eq!(backwards(&outcome.samples), 0, "{outcome:?}");
}

/// The baseline: every old leader replaced moves leadership, at most once
/// per old pod.
#[test]
fn none_still_ends_with_a_new_leader_across_processes() {
    let outcome = rollout("none");
    println!("none: {outcome:?}");
    assert!((1..=3).contains(&outcome.handovers), "{outcome:?}");
}

/// `Oldest`: leadership stays on revision 1 while an old pod is live (each
/// old leader replaced hands over to another old pod), and moves to
/// revision 2 once, when the last old pod goes.
#[test]
fn oldest_keeps_the_old_version_leading_until_none_is_left_across_processes() {
    let outcome = rollout("oldest");
    println!("oldest + fence: {outcome:?}");
    assert_eq!(outcome.handovers, 3, "{outcome:?}");
    assert_eq!(backwards(&outcome.samples), 0, "{outcome:?}");
    let (last_term, _) = *outcome.samples.last().unwrap();
    assert!(
        outcome
            .samples
            .iter()
            .all(|(term, revision)| (*revision == Some(2)) == (*term == last_term)),
        "only the last term is revision 2's: {outcome:?}"
    );
}
