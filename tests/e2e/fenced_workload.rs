//! Fencing proven by a workload under faults (issue 56): the short run is
//! this file's scenario, the long one the benchmarks' `fenced-workload`
//! part (benches/leasehold/fenced_workload.rs), both through [`run`]:
//! three candidate pods of a DistributedLease on PostgreSQL run the fenced
//! workload (crates/leasehold-kubernetes/examples/fenced-workload.rs) as
//! their app container, each writing while its sidecar says it leads: to a
//! PostgreSQL table through `fence::postgres`, to a Redis key through
//! `fence::redis`, to a Spanner table (the emulator) through
//! `fence::spanner`, to a ConfigMap through the chart's fencing policy as its
//! own ServiceAccount (the policy's holder rule passes only because the API
//! server takes the writer's pod name from the pod's bound token), and to
//! an unfenced control table. Faults drawn from a printed seed make stale
//! leaders; the fencing checker (tests/support/fencing_history.rs) then
//! judges the writers' logs against what each resource recorded (the
//! tables' rows, Spanner's by commit timestamp, the Redis key's values as
//! MONITOR shows Redis running the writes, the ConfigMap's values as a
//! watch on it delivers them) and the tokens the lease store issued (a
//! trigger on its table records each new term): no fenced resource may
//! accept a stale write, while the control shows the stale writes the
//! faults produced.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{AsyncBufReadExt, StreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{DeleteParams, ListParams, LogParams, Patch, PatchParams};
use leasehold::lease::Identity;
use leasehold::store::StoreUrl;
use leasehold::store::postgres::{PostgresConfig, PostgresStore};
use leasehold::testing::Emulator;
use leasehold::testing::servers::{PostgresServer, RedisServer};
use rand::seq::SliceRandom;
use rand::{RngExt, SeedableRng, rngs::StdRng};
use serde_json::{Value, json};

use crate::e2e::cluster::{DeleteOnDrop, Scenario, apply, rendered_fencing_policy, wait_for};
use crate::e2e::fixtures::{
    APP, FIRST_LEADER, LEASE, SIDECAR, SUCCESSOR, delete_now, rollout_restart, transfer, transferable_follower,
    watch_example,
};
use crate::e2e::node::{Partition, kill_and_await_restart, restarts, running_pid, signal_container, signal_process};
use crate::e2e::stores::{URL_SECRET, postgres_lease};
use crate::e2e::watcher::LeadershipWatcher;
use crate::support::fencing_history::{Attempt, History, Outcome::Accepted, Report, Write, attempts_in, check};

pub const NAMESPACE: &str = "e2e-fenced-workload";
/// The resources the workload writes through a fence (its log's names);
/// `control` is written unfenced.
const FENCED: [&str; 4] = ["postgres", "configmap", "redis", "spanner"];
/// The fenced ConfigMap the leaders patch.
const LEDGER: &str = "ledger";
/// The workload's binary in the leasehold image (scripts/e2e-cluster.sh).
const WORKLOAD: &str = "/usr/local/bin/fenced-workload";
/// Short terms, so that a few minutes hold many failovers: D, R, P.
const D: Duration = Duration::from_secs(4);
const TIMING: (&str, &str, &str) = ("4s", "3s", "1s");
/// How long a run goes on: until the lease store has begun at least
/// `terms` new terms and every fenced resource has accepted at least
/// `writes` writes, or for `at_most`, whichever comes first (a run cut
/// short fails: it proves less than it says).
pub struct Length {
    pub terms: usize,
    pub writes: usize,
    pub at_most: Duration,
}

/// The e2e suite's run (issue 56: ≥ 20 failovers, ≥ 1,000 writes): about
/// 2 minutes here; with the setup and the teardown within the 360 s
/// nextest gives an e2e test (.config/nextest.toml).
const SHORT: Length = Length {
    terms: 30,
    writes: 1_000,
    at_most: Duration::from_secs(240),
};
/// The workload's rest between rounds: the API server takes one ConfigMap
/// patch a round, on a machine it shares with the rest of the suite.
const WRITE_PAUSE_MS: &str = "20";

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fault {
    /// The leader's app frozen (SIGSTOP) for longer than D, its sidecar
    /// frozen too a moment later so the lease expires and another pod
    /// leads; the app resumed first, with its old token and its sidecar
    /// still silent: the classic stale writer.
    AppPaused,
    /// The leader's sidecar frozen past D, then resumed: its app stops
    /// writing once its question goes unanswered.
    SidecarPaused,
    /// The leader's sidecar killed; the kubelet restarts it.
    SidecarKilled,
    /// The leader's app killed; the kubelet restarts it (its sidecar
    /// releases while the app container is not running).
    AppKilled,
    /// The leader pod cut off from PostgreSQL (its lease store and the
    /// workload's tables) until another pod leads: its sidecar stops
    /// claiming, and its app's writes hang until the cut heals.
    CutOffFromStore,
    /// The leader pod deleted gracefully: the app exits on SIGTERM, the
    /// sidecar releases.
    GracefulDelete,
    /// The leader pod deleted with grace 0: the lease expires.
    DeleteNow,
    /// `leasehold transfer` to a ready follower.
    Transfer,
    /// The leader pod cut off from everything it talks to (PostgreSQL,
    /// Redis and the API server) until another pod leads: its app's
    /// writes to all three hang and are delivered once the cut heals.
    Isolated,
    /// A rollout restart of the Deployment: every candidate replaced, the
    /// leader among them, one at a time.
    RolloutRestart,
    /// The API server paused (SIGSTOP: it accepts and never answers)
    /// while the leader's sidecar is frozen until another pod leads
    /// through PostgreSQL, which goes on without the API server; the
    /// ConfigMap patches sent meanwhile, the old leader's among them, wait
    /// in the API server's sockets and are judged by the policy once it
    /// resumes, in whatever order it takes them.
    ApiServerPaused,
}

const FAULTS: [Fault; 11] = [
    Fault::AppPaused,
    Fault::SidecarPaused,
    Fault::SidecarKilled,
    Fault::AppKilled,
    Fault::CutOffFromStore,
    Fault::GracefulDelete,
    Fault::DeleteNow,
    Fault::Transfer,
    Fault::Isolated,
    Fault::RolloutRestart,
    Fault::ApiServerPaused,
];

/// What a run did and what the checker found.
pub struct WorkloadRun {
    pub seed: u64,
    pub took: Duration,
    /// The faults made, in order.
    pub ran: Vec<Fault>,
    pub report: Report,
    length: (usize, usize),
}

impl WorkloadRun {
    /// Fewest writes accepted by any fenced resource, by the checker.
    fn fewest_writes(&self) -> usize {
        fewest_of(|resource| self.report.resources.get(resource).map_or(0, |r| r.accepted))
    }

    /// The run's summary: the seed, the faults and the checker's report.
    pub fn summary(&self) -> String {
        let mut counts: BTreeMap<Fault, usize> = Default::default();
        for fault in &self.ran {
            *counts.entry(*fault).or_default() += 1;
        }
        format!(
            "fenced workload, seed {}: {} faults in {:.0?} ({counts:?})\n{}",
            self.seed,
            self.ran.len(),
            self.took,
            self.report.summary()
        )
    }

    /// Fails unless the run proves what it is for: no fenced resource
    /// accepted a stale write or disagrees with its writers' logs, while
    /// the control shows the stale writes the faults produced; every fault
    /// kind ran; the run reached its length.
    pub fn proves_the_fences(&self) {
        eprintln!("{}", self.summary());
        let report = &self.report;
        assert_eq!(report.violations(), Vec::<String>::new(), "{}", self.summary());
        let kinds: BTreeSet<Fault> = self.ran.iter().copied().collect();
        assert_eq!(
            kinds,
            FAULTS.into_iter().collect(),
            "every kind of fault ran\n{}",
            self.summary()
        );
        let (terms, writes) = self.length;
        assert!(
            report.new_terms >= terms && self.fewest_writes() >= writes,
            "the run ended before {terms} new terms and {writes} writes per fenced resource\n{}",
            self.summary()
        );
        let control = &report.resources["control"];
        assert!(
            !control.stale_accepted.is_empty(),
            "the faults made no stale write (the control accepted none): the run proves nothing\n{}",
            self.summary()
        );
        for fenced in FENCED {
            let resource = &report.resources[fenced];
            assert!(
                resource.refused > 0 && resource.accepted > 0,
                "{fenced} refused no stale write or accepted none\n{}",
                self.summary()
            );
        }
    }
}

/// Runs the workload in `s` under faults for `length` and checks its history.
pub async fn run(s: &Scenario, length: &Length) -> WorkloadRun {
    let seed = std::env::var("LEASEHOLD_E2E_FAULT_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(rand::random::<u64>);
    eprintln!("faults from LEASEHOLD_E2E_FAULT_SEED={seed}");
    let mut rng = StdRng::seed_from_u64(seed);

    let watcher = watch_example(s, false);
    let (d, r, p) = TIMING;
    let (server, lease_objects) = postgres_lease(
        s,
        LEASE,
        json!({"leaseDuration": d, "renewDeadline": r, "retryPeriod": p}),
    );
    let db = prepare_database(&server).await;
    let redis = RedisServer::start_on(s.env.host_ip);
    let redis_address = (s.env.host_ip, redis.port).into();
    let redis_writes = redis_writes(redis_address, &format!("workload:{{{}/{LEASE}}}:last", s.ns)).await;
    let spanner = SpannerWrites::start(s).await;
    let _policy = fencing_policy(s).await;
    let config_map_writes = config_map_writes(s).await;
    s.apply(lease_objects).await;
    s.apply(workload(s, &redis.url_at(redis_address), &spanner)).await;
    let logs = AppLogs::follow(s);
    let postgres = (s.env.host_ip, server.port).into();
    let cut_off_from = CutOffFrom {
        postgres,
        redis: redis_address,
        api_servers: api_server_addresses(s).await,
    };

    watcher.one_leader(None, FIRST_LEADER).await;
    let started = Instant::now();
    let mut ran: Vec<Fault> = Vec::new();
    // Every kind once in a shuffled order, then drawn at random; a
    // fault that could not happen yet is tried again later.
    let mut planned = FAULTS.to_vec();
    planned.shuffle(&mut rng);
    while started.elapsed() < length.at_most
        && (issued(&db).await.len() <= length.terms || logs.fewest_accepted() < length.writes)
    {
        let fault = planned
            .pop()
            .unwrap_or_else(|| FAULTS[rng.random_range(0..FAULTS.len())]);
        let leader = watcher.one_leader(None, SUCCESSOR).await;
        let fault = replaced_when_backing_off(s, fault, &leader).await;
        let terms = issued(&db).await.len();
        if inject(s, &watcher, fault, &leader, &cut_off_from, (&db, terms)).await {
            ran.push(fault);
            a_new_term(&db, terms, fault).await;
        } else {
            planned.insert(0, fault);
        }
        // Time for the new leader to write.
        tokio::time::sleep(Duration::from_millis(rng.random_range(500..2500))).await;
    }
    let took = started.elapsed();
    watcher.one_leader(None, SUCCESSOR).await;
    // The writers stop before their history is read: every app exits
    // on SIGTERM, and its log ends.
    s.api::<k8s_openapi::api::apps::v1::Deployment>()
        .patch_scale(
            "scheduler",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 0}})),
        )
        .await
        .expect("scaling the workload to 0");
    wait_for("every candidate pod gone", SUCCESSOR, || async {
        s.pods(APP).await.is_empty().then_some(())
    })
    .await;
    let lines = logs.finish().await;
    watcher.finish();

    let history = History {
        attempts: attempts_in(&lines),
        recorded: [
            ("postgres".to_string(), recorded(&db, "workload_fenced").await),
            ("control".to_string(), recorded(&db, "workload_control").await),
            ("redis".to_string(), redis_writes.finish().await),
            ("configmap".to_string(), config_map_writes.finish().await),
            ("spanner".to_string(), spanner.recorded().await),
        ]
        .into(),
        issued: issued(&db).await,
        fenced: FENCED.map(String::from).into(),
    };
    WorkloadRun {
        seed,
        took,
        ran,
        report: check(&history),
        length: (length.terms, length.writes),
    }
}

/// The fewest writes any fenced resource accepted, by `accepted`.
fn fewest_of(accepted: impl Fn(&str) -> usize) -> usize {
    FENCED.into_iter().map(accepted).min().unwrap_or_default()
}

/// Waits until the lease store has begun a term after the first `terms`.
async fn a_new_term(db: &tokio_postgres::Client, terms: usize, fault: Fault) {
    wait_for(&format!("a new term after {fault:?}"), SUCCESSOR, || async {
        (issued(db).await.len() > terms).then_some(())
    })
    .await;
}

/// A kill of a container the kubelet has restarted twice already becomes a
/// graceful delete of its pod: the kubelet delays each restart of a
/// container twice as long as the one before, from 10 s (backOffPeriod in
/// Kubernetes pkg/kubelet/kubelet.go), and a killed sidecar's pod keeps
/// leading (it takes its own lease over), so kills drawn in a row would
/// wait out ever longer back-offs. Deleted, the pod is replaced afresh.
async fn replaced_when_backing_off(s: &Scenario, fault: Fault, leader: &str) -> Fault {
    let container = match fault {
        Fault::SidecarKilled => SIDECAR,
        Fault::AppKilled => "app",
        other => return other,
    };
    if restarts(s, leader, container).await.unwrap_or_default() >= 2 {
        Fault::GracefulDelete
    } else {
        fault
    }
}

/// Makes `fault` happen to `leader`; false when it could not (no ready
/// follower to transfer to). `(db, terms)`: the lease store's issued
/// tokens and how many there were before.
async fn inject(
    s: &Scenario,
    watcher: &LeadershipWatcher,
    fault: Fault,
    leader: &str,
    cut_off_from: &CutOffFrom,
    (db, terms): (&tokio_postgres::Client, usize),
) -> bool {
    match fault {
        Fault::AppPaused => {
            let paused = Instant::now();
            signal_container(s, leader, "app", "STOP").await;
            tokio::time::sleep(Duration::from_secs(1)).await;
            signal_container(s, leader, SIDECAR, "STOP").await;
            watcher.one_leader(Some(leader), SUCCESSOR).await;
            tokio::time::sleep((D + Duration::from_secs(1)).saturating_sub(paused.elapsed())).await;
            signal_container(s, leader, "app", "CONT").await;
            // The app writes with its old token until its question to the
            // frozen sidecar times out (the workload's POLL_TIMEOUT).
            tokio::time::sleep(Duration::from_secs(1)).await;
            signal_container(s, leader, SIDECAR, "CONT").await;
        }
        Fault::SidecarPaused => {
            signal_container(s, leader, SIDECAR, "STOP").await;
            watcher.one_leader(Some(leader), SUCCESSOR).await;
            signal_container(s, leader, SIDECAR, "CONT").await;
        }
        Fault::SidecarKilled => kill_and_await_restart(s, leader, SIDECAR).await,
        Fault::AppKilled => kill_and_await_restart(s, leader, "app").await,
        Fault::CutOffFromStore => {
            let cut = Partition::start(s, leader, cut_off_from.postgres).await;
            watcher.one_leader(Some(leader), SUCCESSOR).await;
            cut.heal();
        }
        Fault::Isolated => {
            let mut cuts = Vec::new();
            for address in cut_off_from.everything() {
                cuts.push(Partition::start(s, leader, address).await);
            }
            watcher.one_leader(Some(leader), SUCCESSOR).await;
            cuts.into_iter().for_each(Partition::heal);
        }
        Fault::RolloutRestart => rollout_restart(s, 3).await,
        Fault::ApiServerPaused => {
            let sidecar = running_pid(s, leader, SIDECAR, "to freeze it").await;
            let what = format!("{leader}'s sidecar");
            let paused = s.env.pause_component("kube-apiserver");
            signal_process(sidecar, "STOP", &what);
            // Judged by the lease store: the labels wait for the API server.
            a_new_term(db, terms, fault).await;
            signal_process(sidecar, "CONT", &what);
            paused.resume();
        }
        Fault::GracefulDelete => {
            s.api::<Pod>()
                .delete(leader, &DeleteParams::default())
                .await
                .unwrap_or_else(|e| panic!("deleting {leader}: {e}"));
        }
        Fault::DeleteNow => delete_now(s, leader).await,
        Fault::Transfer => {
            let Some(target) = transferable_follower(s, leader).await else {
                return false;
            };
            let (code, out, err) = transfer(s, &target).await;
            assert_eq!(code, 0, "leasehold transfer to {target}: {out}{err}");
        }
    }
    true
}

/// Where a pod is cut off from.
struct CutOffFrom {
    postgres: SocketAddr,
    redis: SocketAddr,
    api_servers: Vec<SocketAddr>,
}

impl CutOffFrom {
    fn everything(&self) -> Vec<SocketAddr> {
        [self.postgres, self.redis]
            .into_iter()
            .chain(self.api_servers.iter().copied())
            .collect()
    }
}

/// The addresses a pod reaches the API server at: the `kubernetes`
/// Service's cluster IP and port, which in-cluster clients dial
/// (KUBERNETES_SERVICE_HOST; rewritten to the API server outside the pod's
/// network namespace, so a pod's own rule must name it), and the API
/// server's own address.
async fn api_server_addresses(s: &Scenario) -> Vec<SocketAddr> {
    let service: k8s_openapi::api::core::v1::Service = kube::Api::namespaced(s.client.clone(), "default")
        .get("kubernetes")
        .await
        .expect("the kubernetes Service");
    let spec = service.spec.expect("the kubernetes Service's spec");
    let ip = spec.cluster_ip.expect("the kubernetes Service's cluster IP");
    let port = spec
        .ports
        .into_iter()
        .flatten()
        .find(|p| p.name.as_deref() == Some("https"));
    let port = port.expect("the kubernetes Service's https port").port as u16;
    let ip = ip
        .parse()
        .unwrap_or_else(|e| panic!("the kubernetes Service's cluster IP {ip}: {e}"));
    vec![SocketAddr::new(ip, port), s.env.api_server_addr()]
}

/// The lease table made now (as the operator would make it), with a
/// trigger recording every new term's holder and token, and the workload's
/// tables; a client on it.
async fn prepare_database(server: &PostgresServer) -> tokio_postgres::Client {
    use leasehold::store::LeaseStore;
    let store = PostgresStore::connect(PostgresConfig {
        url: StoreUrl::new(server.url()),
        table: leasehold::store::DEFAULT_TABLE.to_string(),
    })
    .expect("connecting to the lease's PostgreSQL");
    store.ensure_schema().await.expect("the lease table");
    let (client, connection) = tokio_postgres::connect(&server.url(), tokio_postgres::NoTls)
        .await
        .expect("connecting to PostgreSQL");
    tokio::spawn(connection);
    let leases = leasehold::store::DEFAULT_TABLE;
    client
        .batch_execute(&format!(
            "CREATE TABLE workload_issued (id BIGSERIAL PRIMARY KEY, holder TEXT NOT NULL, token BIGINT NOT NULL);
             CREATE FUNCTION workload_issued() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
               IF NEW.holder IS NOT NULL AND (TG_OP = 'INSERT' OR OLD.token IS DISTINCT FROM NEW.token) THEN
                 INSERT INTO workload_issued (holder, token) VALUES (NEW.holder, NEW.token);
               END IF;
               RETURN NEW;
             END $$;
             CREATE TRIGGER workload_issued AFTER INSERT OR UPDATE ON {leases}
               FOR EACH ROW EXECUTE FUNCTION workload_issued();
             CREATE TABLE workload_fenced (id BIGSERIAL PRIMARY KEY, pod TEXT NOT NULL, token BIGINT NOT NULL, seq BIGINT NOT NULL);
             CREATE TABLE workload_control (id BIGSERIAL PRIMARY KEY, pod TEXT NOT NULL, token BIGINT NOT NULL, seq BIGINT NOT NULL);"
        ))
        .await
        .expect("the workload's tables and the issued-token trigger");
    client
}

/// (pod, token) of every term the lease store began, in order.
async fn issued(db: &tokio_postgres::Client) -> Vec<(String, i64)> {
    let rows = db
        .query("SELECT holder, token FROM workload_issued ORDER BY id", &[])
        .await
        .expect("reading the issued tokens");
    rows.iter()
        .map(|row| {
            let holder: String = row.get(0);
            let identity: Identity = holder
                .parse()
                .unwrap_or_else(|e| panic!("the lease's holder {holder:?}: {e}"));
            (identity.name().to_string(), row.get(1))
        })
        .collect()
}

/// A workload table's rows in id order: the commit order for the fenced
/// table (its ids are taken under the fence row's lock).
async fn recorded(db: &tokio_postgres::Client, table: &str) -> Vec<Write> {
    let rows = db
        .query(&format!("SELECT pod, token, seq FROM {table} ORDER BY id"), &[])
        .await
        .unwrap_or_else(|e| panic!("reading {table}: {e}"));
    rows.iter()
        .map(|row| Write {
            pod: row.get(0),
            token: row.get(1),
            seq: row.get(2),
        })
        .collect()
}

/// The chart's fencing policy under a name of this test's, bound to its
/// namespace only (the fencing scenario installs and removes the chart's
/// own beside it); the ConfigMap it fences and the candidates' right to
/// patch it. Waits until the policy is in force.
async fn fencing_policy(s: &Scenario) -> DeleteOnDrop {
    let (mut policy, chart_name) = rendered_fencing_policy(&s.env, &[]);
    let name = format!("{chart_name}-{NAMESPACE}");
    for object in &mut policy {
        object["metadata"]["name"] = json!(name);
        if object["kind"] == "ValidatingAdmissionPolicyBinding" {
            object["spec"]["policyName"] = json!(name);
            object["spec"]["matchResources"]["namespaceSelector"] =
                json!({"matchLabels": {"kubernetes.io/metadata.name": NAMESPACE}});
        }
    }
    let guard = DeleteOnDrop {
        env: s.env.clone(),
        namespace: None,
        objects: vec![
            ("validatingadmissionpolicybinding", name.clone()),
            ("validatingadmissionpolicy", name),
        ],
    };
    let lock = format!("postgres:{}/{LEASE}", s.ns);
    s.apply(vec![
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
               "metadata": {"name": "ledger-writer"},
               "rules": [{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [LEDGER],
                          "verbs": ["get", "patch"]}]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": "ledger-writer"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "ledger-writer"},
               "subjects": [{"kind": "ServiceAccount", "name": "scheduler", "namespace": s.ns}]}),
        // Fenced from the start: no leader holds token 0.
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": LEDGER, "annotations": {
            "leasehold.dev/fencing-lock": lock,
            "leasehold.dev/fencing-token": "0",
            "leasehold.dev/fencing-holder": "nobody",
        }}}),
    ])
    .await;
    apply(&s.client, &policy).await;
    // In force once the API server's informers have it: this client is
    // not the holder, so its write (a dry run) is refused then.
    let ledger = s.api::<ConfigMap>();
    let dry_run = PatchParams {
        dry_run: true,
        ..Default::default()
    };
    wait_for("the fencing policy in force", Duration::from_secs(60), || async {
        let patch = Patch::Merge(json!({"data": {"probe": "x"}}));
        match ledger.patch(LEDGER, &dry_run, &patch).await {
            Err(kube::Error::Api(refused)) if refused.message.contains("must name the writer") => Some(()),
            _ => None,
        }
    })
    .await;
    guard
}

/// The leader-only-service example's ServiceAccount and Deployment with
/// the workload as the app container, from this tree's leasehold image.
fn workload(s: &Scenario, redis_url: &str, spanner: &SpannerWrites) -> Vec<Value> {
    let mut objects: Vec<Value> = s
        .example("leader-only-service.yaml")
        .into_iter()
        .filter(|o| o["kind"] != "Service")
        .collect();
    let deployment = objects
        .iter_mut()
        .find(|o| o["kind"] == "Deployment")
        .expect("the example's Deployment");
    deployment["spec"]["template"]["spec"]["containers"][0] = json!({
        "name": "app",
        "image": s.env.image,
        "imagePullPolicy": "IfNotPresent",
        "command": [WORKLOAD],
        "env": [
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "DATABASE_URL", "valueFrom": {"secretKeyRef": {"name": URL_SECRET, "key": "url"}}},
            {"name": "REDIS_URL", "value": redis_url},
            {"name": "FENCE_LOCK", "value": format!("{}/{LEASE}", s.ns)},
            {"name": "CONFIG_MAP", "value": LEDGER},
            {"name": "WRITE_PAUSE_MS", "value": WRITE_PAUSE_MS},
            {"name": "SPANNER_DATABASE", "value": spanner.database},
            {"name": "SPANNER_EMULATOR_HOST", "value": spanner.emulator.host},
        ],
    });
    objects
}

/// The values the workload's Redis key took, in the order Redis ran the
/// writes: MONITOR streams every command Redis runs, those a script runs
/// included (`[0 lua] "SET" "<key>" "<value>"`), in the order it runs them
/// (Redis' MONITOR documentation; seen here on Redis 7.0). A refused write
/// runs no SET.
async fn redis_writes(address: SocketAddr, key: &str) -> RecordedWrites {
    use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _};
    let mut connection = tokio::net::TcpStream::connect(address)
        .await
        .expect("connecting to Redis");
    connection.write_all(b"MONITOR\r\n").await.expect("MONITOR");
    let mut lines = tokio::io::BufReader::new(connection).lines();
    assert_eq!(
        lines.next_line().await.expect("MONITOR's answer").as_deref(),
        Some("+OK")
    );
    let writes = Arc::new(Mutex::new(Vec::new()));
    let set = format!("[0 lua] \"SET\" \"{key}\" \"");
    let task = tokio::spawn({
        let writes = writes.clone();
        async move {
            while let Ok(Some(line)) = lines.next_line().await {
                let Some((_, value)) = line.split_once(&set) else {
                    continue;
                };
                let fields: Vec<&str> = value.trim_end_matches('"').split(' ').collect();
                let [pod, token, seq] = fields[..] else {
                    panic!("the workload's Redis value {value:?} is not \"pod token seq\"")
                };
                let number = |n: &str| n.parse().unwrap_or_else(|e| panic!("{n:?} in {value:?}: {e}"));
                writes.lock().unwrap().push(Write {
                    pod: pod.to_string(),
                    token: number(token),
                    seq: number(seq),
                });
            }
        }
    });
    RecordedWrites { writes, task }
}

/// A Spanner emulator the pods write to through `fence::spanner` (the
/// lease stays on PostgreSQL: the fence's issuer is the lease's store, the
/// Spanner table only guarded by it), with the fence table and the
/// workload's table made as the database's owner makes them.
struct SpannerWrites {
    emulator: Emulator,
    database: String,
}

impl SpannerWrites {
    async fn start(s: &Scenario) -> SpannerWrites {
        let emulator = Emulator::start_on(s.env.host_ip).unwrap_or_else(|e| panic!("{e}"));
        let database = emulator.create_database(leasehold::store::DEFAULT_TABLE).await.database;
        for statement in [
            leasehold::fence::spanner::create_table_statement(leasehold::fence::spanner::DEFAULT_TABLE)
                .expect("the fence table's DDL"),
            "CREATE TABLE workload_spanner (pod STRING(MAX) NOT NULL, seq INT64 NOT NULL, token INT64 NOT NULL, \
             committed_at TIMESTAMP NOT NULL OPTIONS (allow_commit_timestamp = true)) PRIMARY KEY (pod, seq)"
                .to_string(),
        ] {
            emulator.ddl(&database, &statement).await;
        }
        SpannerWrites { emulator, database }
    }

    /// The rows in commit order: every fenced write also writes the fence
    /// row, so no two commit at the same timestamp (checked).
    async fn recorded(&self) -> Vec<Write> {
        let client = self.emulator.client().await;
        let database = client
            .database_client(self.database.as_str())
            .build()
            .await
            .expect("a client of the workload's Spanner database");
        let statement = google_cloud_spanner::statement::Statement::builder(
            "SELECT pod, token, seq, CAST(committed_at AS STRING) AS committed FROM workload_spanner \
             ORDER BY committed_at",
        )
        .build();
        let mut rows = database
            .single_use()
            .build()
            .execute_query(statement)
            .await
            .expect("reading workload_spanner");
        let (mut writes, mut last) = (Vec::new(), None::<String>);
        while let Some(row) = rows.next().await {
            let row = row.expect("a row of workload_spanner");
            let committed: String = row.get("committed").expect("committed_at");
            assert_ne!(
                last.as_ref(),
                Some(&committed),
                "two fenced writes committed at {committed}: no order"
            );
            last = Some(committed);
            writes.push(Write {
                pod: row.get("pod").expect("pod"),
                token: row.get("token").expect("token"),
                seq: row.get("seq").expect("seq"),
            });
        }
        writes
    }
}

/// The values the fenced ConfigMap took, in the order the API server wrote
/// them: a watch on it delivers every change in resourceVersion order,
/// resuming from the last one it saw across a broken connection (the API
/// server's watch cache replays what it missed; Kubernetes docs, "Efficient
/// detection of changes"). A relist would skip changes: it fails the run
/// instead of leaving writes unrecorded.
async fn config_map_writes(s: &Scenario) -> RecordedWrites {
    use kube::runtime::watcher::{self, Event};
    let config = watcher::Config::default().fields(&format!("metadata.name={LEDGER}"));
    let mut events = Box::pin(watcher::watcher(s.api::<ConfigMap>(), config));
    let writes = Arc::new(Mutex::new(Vec::new()));
    // The first list (the ConfigMap as the test made it, with no write)
    // is read before the writers start.
    loop {
        match events.next().await {
            Some(Ok(Event::InitDone)) => break,
            Some(Ok(_)) => {}
            other => panic!("listing the fenced ConfigMap: {other:?}"),
        }
    }
    let task = tokio::spawn({
        let writes = writes.clone();
        async move {
            while let Some(event) = events.next().await {
                match event {
                    Ok(Event::Apply(ledger)) => writes.lock().unwrap().extend(write_in(&ledger)),
                    Ok(Event::Init) => panic!("the fenced ConfigMap's watch relisted: its record would have a gap"),
                    // A broken connection: the watcher resumes from the
                    // last resourceVersion it delivered.
                    Ok(_) | Err(_) => {}
                }
            }
        }
    });
    RecordedWrites { writes, task }
}

/// The writes a resource recorded, as a task reading them collects them.
struct RecordedWrites {
    writes: Arc<Mutex<Vec<Write>>>,
    task: tokio::task::JoinHandle<()>,
}

impl RecordedWrites {
    /// What was written, once the writers are gone. A reader that ended
    /// early passes its panic on (an early end leaves writes unrecorded,
    /// which the checker reports).
    async fn finish(self) -> Vec<Write> {
        if self.task.is_finished() {
            self.task.await.expect("a resource's record reader");
        } else {
            self.task.abort();
        }
        self.writes.lock().unwrap().clone()
    }
}

/// The write a version of the fenced ConfigMap holds (its data's pod,
/// token and seq), if any.
fn write_in(ledger: &ConfigMap) -> Option<Write> {
    let data = ledger.data.as_ref()?;
    let number = |key: &str| -> Option<i64> {
        let text = data.get(key)?;
        Some(
            text.parse()
                .unwrap_or_else(|e| panic!("the ledger's {key} {text:?}: {e}")),
        )
    };
    Some(Write {
        pod: data.get("pod")?.clone(),
        token: number("token")?,
        seq: number("seq")?,
    })
}

/// The app containers' logs, followed from each candidate pod as it
/// appears until it is gone (a deleted pod's log goes with it).
struct AppLogs {
    read: Arc<Mutex<LinesRead>>,
    stop: tokio_util::sync::CancellationToken,
    task: tokio::task::JoinHandle<Vec<tokio::task::JoinHandle<()>>>,
}

/// Every line read once, and the writes each resource accepted among them,
/// counted as the lines arrive.
#[derive(Default)]
struct LinesRead {
    lines: BTreeSet<String>,
    accepted: BTreeMap<String, usize>,
}

impl LinesRead {
    /// Keeps `line` once: a stream read again from the start repeats lines
    /// (each carries its time, so two writes never share one).
    fn add(&mut self, line: String) {
        if self.lines.contains(&line) {
            return;
        }
        if let Some(attempt) = Attempt::in_line(&line).filter(|a| a.outcome == Accepted) {
            *self.accepted.entry(attempt.resource).or_default() += 1;
        }
        self.lines.insert(line);
    }
}

impl AppLogs {
    fn follow(s: &Scenario) -> AppLogs {
        let read = Arc::new(Mutex::new(LinesRead::default()));
        let stop = tokio_util::sync::CancellationToken::new();
        let pods = s.api::<Pod>();
        let task = tokio::spawn({
            let (read, stop) = (read.clone(), stop.clone());
            async move {
                let mut followed = BTreeSet::new();
                let mut followers = Vec::new();
                while !stop.is_cancelled() {
                    let list = pods.list(&ListParams::default().labels(APP)).await;
                    for pod in list.map(|l| l.items).unwrap_or_default() {
                        let Some(name) = pod.metadata.name else { continue };
                        if followed.insert(name.clone()) {
                            followers.push(tokio::spawn(follow_pod(pods.clone(), name, read.clone())));
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                followers
            }
        });
        AppLogs { read, stop, task }
    }

    /// The fewest writes any fenced resource accepted so far, by its
    /// writers' logs.
    fn fewest_accepted(&self) -> usize {
        let read = self.read.lock().unwrap();
        fewest_of(|resource| read.accepted.get(resource).copied().unwrap_or_default())
    }

    /// Every line, once every followed pod is gone.
    async fn finish(self) -> Vec<String> {
        self.stop.cancel();
        for follower in self.task.await.expect("the log follower") {
            follower.await.expect("a pod's log follower");
        }
        std::mem::take(&mut self.read.lock().unwrap().lines)
            .into_iter()
            .collect()
    }
}

/// Reads `pod`'s app log while the pod exists; a stream that ends early
/// (the container not started yet, a broken connection) is read again from
/// the start.
async fn follow_pod(pods: kube::Api<Pod>, pod: String, read: Arc<Mutex<LinesRead>>) {
    let params = LogParams {
        container: Some("app".into()),
        follow: true,
        ..Default::default()
    };
    loop {
        if let Ok(stream) = pods.log_stream(&pod, &params).await {
            let mut stream = Box::pin(stream.lines());
            while let Some(Ok(line)) = stream.next().await {
                read.lock().unwrap().add(line);
            }
        }
        match pods.get_opt(&pod).await {
            Ok(None) => return,
            _ => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}

/// The API server is paused in one of the faults: the scenario runs alone
/// (`::disruptive::`, .config/nextest.toml). The benchmarks' long run calls
/// [`run`] with its own [`Length`].
#[cfg(test)]
mod disruptive {
    #[tokio::test]
    async fn stale_leaders_under_faults_get_no_write_past_the_fences() {
        crate::e2e::cluster::scenario(super::NAMESPACE, |s| async move {
            super::run(&s, &super::SHORT).await.proves_the_fences();
        })
        .await;
    }
}
