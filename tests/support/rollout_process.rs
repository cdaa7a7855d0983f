//! Issue 16 across whole processes: a Deployment rollout of three
//! `leasehold sidecar` processes on the Cloud Spanner emulator, each with the
//! Kubernetes API on (publisher, peer watch, version from its ReplicaSet,
//! the app-health source `--app-container app`), talking to the API server
//! model (`ApiServer::serve_http`) through a kubeconfig. Old pods, of
//! revision 1, are replaced one at a time in the order a Deployment with
//! maxSurge 1 / maxUnavailable 0 uses: a new pod (revision 2) starts, its
//! app turns ready, then one old pod is terminated (SIGTERM, then deleted),
//! the old leader first (the Deployment controller does not know which old
//! pod leads, and this order costs the most). `super::rollout` runs the
//! same scenario in one process on paused time. `tests/processes/rollout.rs`
//! asserts on it; the bench part `rollout-process` measures it.
//!
//! Leadership is read from the lease row: its term is +1 on every
//! acquisition (`LeaseRecord::term`), so the term's growth counts every
//! handover, however short; the row's version says which revision holds
//! each term, sampled every 20 ms. Time without a leader is what the apps
//! see: no live sidecar answering 200 on `/leader`, polled every 20 ms.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use leasehold::api::DEFAULT_LABEL_KEY;
use leasehold::lease::LeaseStore;
use leasehold::sidecar::pod::{LOCK_LABEL, lock_label_value};
use leasehold::store::spanner::{SpannerConfig, SpannerStore};
use leasehold::testing::api::{ApiServer, pods};
use leasehold::testing::{Emulator, TcpProxy};
use serde_json::{Value, json};

use super::rollout::{NAMESPACE, insert_replica_sets, pod_json, update};
use super::*;

const LOCK: &str = "web";

/// The lease row at one moment: (term, revision of its holder's version).
pub type Sample = (u64, Option<u64>);

/// Which leadership setting the sidecars run with.
#[derive(Debug, Clone, Copy)]
pub struct Setting {
    /// `--prefer`'s value.
    pub prefer: &'static str,
    /// `--version-fence`.
    pub fence: bool,
}

struct Rollout<'a> {
    runtime: tokio::runtime::Runtime,
    emulator: &'a Emulator,
    config: SpannerConfig,
    api: ApiServer,
    kubeconfig: PathBuf,
    setting: Setting,
    /// Every distinct (term, revision) the lease row showed, in order.
    samples: Arc<Mutex<Vec<Sample>>>,
    /// The `/leader` ports of every sidecar started, for the leaderless poll.
    ports: Arc<Mutex<Vec<u16>>>,
}

impl<'a> Rollout<'a> {
    fn new(emulator: &'a Emulator, setting: Setting) -> Rollout<'a> {
        let runtime = proxy_runtime();
        let api = ApiServer::new(Some(leasehold::sidecar::rbac::allows_request));
        insert_replica_sets(&api);
        let (config, store, addr) = runtime.block_on(async {
            let (config, store) = lease_database(emulator).await;
            (config, store, api.serve_http().await)
        });
        let kubeconfig = model_kubeconfig(addr, NAMESPACE, "rollout");
        let samples = Arc::new(Mutex::new(Vec::new()));
        runtime.spawn(sample_lease(store, samples.clone()));
        Rollout {
            runtime,
            emulator,
            config,
            api,
            kubeconfig,
            setting,
            samples,
            ports: Arc::default(),
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
        let (store, mut env) = spanner_store(self.emulator, &self.config, &proxy);
        env.extend([
            ("LEASEHOLD_KUBERNETES".into(), "true".into()),
            ("POD_NAMESPACE".into(), NAMESPACE.into()),
            ("KUBECONFIG".into(), self.kubeconfig.display().to_string()),
        ]);
        let mut flags = vec![
            "--app-container".to_string(),
            "app".into(),
            "--prefer".into(),
            self.setting.prefer.into(),
        ];
        if self.setting.fence {
            flags.push("--version-fence".into());
        }
        let sidecar = Sidecar::launch(name, proxy, LOCK, &store, &env, &flags);
        self.ports.lock().unwrap().push(sidecar.http);
        sidecar
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

    /// Sums, from now until the returned guard's `stop`, the time no
    /// started sidecar answers 200 on `/leader`.
    fn time_without_a_leader(&self) -> Leaderless {
        let (ports, stop) = (self.ports.clone(), Arc::new(AtomicBool::new(false)));
        let stopped = stop.clone();
        let poller = std::thread::spawn(move || {
            let mut without = Duration::ZERO;
            let mut last = Instant::now();
            while !stopped.load(Ordering::Relaxed) {
                let ports = ports.lock().unwrap().clone();
                let led = ports
                    .into_iter()
                    .any(|port| get(port, "/leader").is_ok_and(|(status, _)| status == 200));
                let now = Instant::now();
                if !led {
                    without += now - last;
                }
                last = now;
                std::thread::sleep(Duration::from_millis(20));
            }
            without
        });
        Leaderless { stop, poller }
    }
}

impl Drop for Rollout<'_> {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.kubeconfig);
    }
}

/// The running leaderless poll of [`Rollout::time_without_a_leader`].
struct Leaderless {
    stop: Arc<AtomicBool>,
    poller: std::thread::JoinHandle<Duration>,
}

impl Leaderless {
    fn stop(self) -> Duration {
        self.stop.store(true, Ordering::Relaxed);
        self.poller.join().expect("the leaderless poll ends")
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
pub struct Outcome {
    /// Acquisitions after the first old leader's.
    pub handovers: u64,
    /// The lease row's (term, revision) from the first old leader on.
    pub samples: Vec<Sample>,
    /// Time no sidecar served 200 on `/leader`, from the first old leader
    /// until the rollout settled (20 ms polling).
    pub leaderless: Duration,
}

impl Outcome {
    /// Terms whose holder had a lower revision than the term before.
    pub fn backwards(&self) -> usize {
        self.samples.windows(2).filter(|w| w[1].1 < w[0].1).count()
    }
}

/// Three old candidates, replaced one at a time, on `emulator`. After every
/// step a leader is asserted within the crash failover bound
/// (`failover_bound`: D + P·(1 + J) + margin), which covers any graceful
/// handover too: a yield or a SIGTERM releases after the drain (200 ms <
/// D), and a follower acquires at its next poll.
pub fn rollout(emulator: &Emulator, setting: Setting) -> Outcome {
    let rollout = Rollout::new(emulator, setting);
    let newest = setting.prefer == "newest";
    let mut old: Vec<Sidecar> = (0..3)
        .map(|i| rollout.start(&format!("web-r1-{i}"), "web-r1", true))
        .collect();
    let all: Vec<&Sidecar> = old.iter().collect();
    // Start-up (process, store session, version lookup) is not bounded by D/R/P.
    wait_for_one_leader(&all, Duration::from_secs(20)).expect("an old leader");
    let leaderless = rollout.time_without_a_leader();
    let (first_term, first_revision) = rollout.last();
    assert_eq!(first_revision, Some(1), "an old pod leads first");
    let mut new: Vec<Sidecar> = Vec::new();
    for i in 0..3 {
        let name = format!("web-r2-{i}");
        new.push(rollout.start(&name, "web-r2", false));
        // The app starts: its sidecar is up (`start` waited for it) and
        // the app not ready yet.
        // Its sidecar has seen the unready app (from the pod watch) and does
        // not campaign.
        wait_for_view(&new[i], "sees its app unready", |view| {
            view["appHealthy"] == json!(false) && view["campaigning"] == json!(false)
        });
        // And the old sidecars' pod watches have brought them the new pod,
        // so none of them takes a lease its leader stands aside from for
        // it. No view shows what a sidecar knows of its peers: two polls
        // stand in for that (without them, CI saw an old follower take the
        // lease first: two handovers under Newest).
        std::thread::sleep(P * 2);
        assert!(!new[i].leads(), "{name} leads before its app is ready");
        update(&rollout.api, &name, |pod| {
            pod["status"]["containerStatuses"][0]["ready"] = json!(true)
        });
        // The pod watch brings the ready app to the sidecar, which campaigns.
        if newest {
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
            // Its sidecar has seen the ready app (it campaigns unless the
            // version rule holds it back).
            wait_for_view(&new[i], "sees its app ready", |view| view["appHealthy"] == json!(true));
        }
        // The new pod is available: one old pod goes, the leader if an old one leads.
        let victim = old.iter().position(Sidecar::leads).unwrap_or(0);
        let mut victim = old.remove(victim);
        update(&rollout.api, &victim.name, |pod| {
            pod["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z")
        });
        victim.signal("TERM");
        let status = victim.expect_gone(D);
        assert!(status.success(), "{} exits 0 on SIGTERM: {status}", victim.name);
        rollout.api.delete(&pods::collection(NAMESPACE), &victim.name);
        let live: Vec<&Sidecar> = old.iter().chain(&new).collect();
        let bound = failover_bound();
        wait_for_one_leader(&live, bound)
            .unwrap_or_else(|| panic!("no leader within {bound:?} after {} exited", victim.name));
    }
    // Settled: a new pod leads, by the row and by every live sidecar.
    let live: Vec<&Sidecar> = new.iter().collect();
    let leader = wait_for_one_leader(&live, failover_bound()).expect("a new leader at the end");
    let holder = new[leader].leader().1["holder"].clone();
    let started = Instant::now();
    while rollout.last().1 != Some(2) || new.iter().any(|s| s.leader().1["holder"] != holder) {
        assert!(
            started.elapsed() < failover_bound(),
            "the candidates do not agree that {} leads: {:?}",
            new[leader].name,
            rollout.samples()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let leaderless = leaderless.stop();
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
        leaderless,
    }
}

/// Waits until `sidecar`'s `/leader` view satisfies `settled`, within a
/// few polls (the pod watch brings each change in one API round trip).
fn wait_for_view(sidecar: &Sidecar, what: &str, settled: impl Fn(&Value) -> bool) {
    let started = Instant::now();
    while !settled(&sidecar.leader().1) {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{} never {what}: {:?}",
            sidecar.name,
            sidecar.leader()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
