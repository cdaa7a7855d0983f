//! One leader across two clusters sharing one lock, on every shared store:
//! PostgreSQL, Redis and the Cloud Spanner emulator (issue 37).
//!
//! "west" is the suite's cluster: its candidates are the leader-only-service
//! example's pods, injected by its operator, installed with
//! `clusterName=west`. "east" is a second, control-plane-only cluster beside
//! it (`scripts/e2e-cluster.sh` starts it and prints
//! `LEASEHOLD_E2E_EAST_KUBECONFIG`): nothing runs there, so its operator runs
//! as a host process with east's kubeconfig and its candidates are
//! `leasehold sidecar` processes on the host, each publishing to a pod object
//! created in east that stays Pending behind a scheduling gate. Both
//! clusters' DistributedLeases name the same lock (same namespace and name)
//! in one private store the test starts on this machine's address: a
//! PostgreSQL or Redis server, or a Spanner emulator (each scenario runs
//! once per store, `<scenario>::<store>`).
//!
//! East leads first in every scenario; its candidates reach the store
//! through proxies the test controls. The cross-cluster watcher follows the
//! store's row, east's candidates' `/leader` and west's candidates' claims
//! (read inside the pods), beside one leadership watcher per cluster, and
//! fails on two leaders across the clusters and on tokens going back.

use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::ListParams;
use leasehold::api::{DEFAULT_LABEL_KEY, DistributedLease};
use leasehold::lease::{LeaseRecord, LeaseStore};
use leasehold::runtime::{StoreConfig, StoreKind};
use leasehold::store::spanner::{DEFAULT_CALL_TIMEOUT, SpannerStore};
use leasehold::store::{DEFAULT_TABLE, StoreUrl};
use leasehold::testing::servers::{PostgresServer, RedisServer};
use leasehold::testing::{ProxyMode, TcpProxy};
use serde_json::{Value, json};
use tokio::task::JoinHandle;

use crate::e2e::cluster::{
    DeleteOnDrop, Scenario, apply, crds, default_service_account, install_chart_with, namespace_object, scenario,
    wait_for,
};
use crate::e2e::fixtures::{APP, LEASE};
use crate::e2e::stores::{SpannerForPods, lease, secret};
use crate::e2e::watcher::{ClaimsNow, LeadershipWatcher, Watched};
use crate::support::{Sidecar, get};

const NS: &str = "e2e-clusters";
const WEST: &str = "west";
const EAST: &str = "east";
/// East's candidates.
const EAST_PODS: [&str; 2] = ["east-0", "east-1"];

/// D, R and P of both clusters' leases: short, so each scenario's failover
/// takes seconds; the bounds below are derived from them.
const D: Duration = Duration::from_secs(4);
const R: Duration = Duration::from_secs(3);
const P: Duration = Duration::from_secs(1);
/// What a bound adds to D, R and P: the watchers' polls (100 ms), one store
/// round trip and process scheduling on the loaded two-core machine.
const MARGIN: Duration = Duration::from_millis(1500);

/// What a user without the second cluster reads.
const HOW_TO_GET_EAST: &str = "LEASEHOLD_E2E_EAST_KUBECONFIG is not set: the two-cluster scenarios need a second \
     cluster beside the suite's (any disposable cluster; nothing runs in it, the test runs its operator and \
     candidates on this machine). `scripts/e2e-cluster.sh up` starts both clusters, \
     `scripts/e2e-cluster.sh east up` only the second, and each prints the variable (docs/e2e.md)";

/// The scenarios install the chart on the suite's cluster with
/// `clusterName=west` (and, on Spanner, the emulator's address), which every
/// pod injected meanwhile would carry: nextest runs them one at a time where
/// no other test uses the cluster (`.config/nextest.toml`, scripts/test.sh).
/// One test per scenario and store: `disruptive::<scenario>::<store>`.
mod disruptive {
    use super::*;

    /// All candidates of the leading cluster killed: a candidate of the other
    /// cluster leads within D + P of the last kill.
    async fn the_leading_clusters_candidates_killed(kind: StoreKind) {
        scenario(NS, |s| async move {
            let mut two = TwoClusters::start(&s, kind).await;
            two.east_leads().await;
            two.west_follows(&s).await;
            let killed = Instant::now();
            for sidecar in &mut two.east_sidecars {
                let _ = sidecar.child.kill();
                let _ = sidecar.child.wait();
            }
            let (holder, at) = two.store_holder_in(WEST, D + P + MARGIN * 4).await;
            assert!(
                at.duration_since(killed) <= D + P + MARGIN,
                "west's {holder} took the lock {:?} after east's candidates were killed: not within D + P ({:?}) \
                 and the margin",
                at.duration_since(killed),
                D + P
            );
            two.west_claims().await;
            two.statuses_name(&s, WEST).await;
            // East's dead leader's pod loses its leader label: east's operator
            // repairs labels of its own cluster's holders.
            two.east_labels(None).await;
            two.finish(&s).await;
        })
        .await;
    }

    /// The leading cluster cut off from the store: its leader stops claiming
    /// within R of the cut (its last renewal was sent before it), and a
    /// candidate of the other cluster leads once the lease has expired.
    async fn the_leading_cluster_cut_off_from_the_store(kind: StoreKind) {
        scenario(NS, |s| async move {
            let two = TwoClusters::start(&s, kind).await;
            let east_leader = two.east_leads().await;
            two.west_follows(&s).await;
            let cut = Instant::now();
            for sidecar in &two.east_sidecars {
                sidecar.proxy.set(ProxyMode::Cut);
            }
            let leader = &two.east_sidecars[east_leader];
            let stopped = wait_for("east's leader to stop claiming", R + MARGIN * 4, || async {
                (get(leader.http, "/leader").map(|(status, _)| status) != Ok(200)).then(Instant::now)
            })
            .await;
            assert!(
                stopped.duration_since(cut) <= R + MARGIN,
                "east's leader still claimed {:?} after the cut: not within R ({R:?})",
                stopped.duration_since(cut)
            );
            let (holder, at) = two.store_holder_in(WEST, D + P + MARGIN * 4).await;
            assert!(
                at.duration_since(cut) <= D + P + MARGIN,
                "west's {holder} took the lock {:?} after the cut: not within D + P ({:?})",
                at.duration_since(cut),
                D + P
            );
            two.west_claims().await;
            two.statuses_name(&s, WEST).await;
            two.finish(&s).await;
        })
        .await;
    }

    /// The leading cluster's API server down: the store decides, so the same
    /// term of the same holder goes on; its labels and status converge after.
    async fn the_leading_clusters_api_server_down(kind: StoreKind) {
        scenario(NS, |s| async move {
            let two = TwoClusters::start(&s, kind).await;
            let east_leader = two.east_leads().await;
            two.west_follows(&s).await;
            let before = two.store_record().await;
            assert!(
                two.east.env.component.is_some(),
                "LEASEHOLD_E2E_EAST_COMPONENT is not set: this scenario stops east's API server through it \
                 (scripts/e2e-cluster.sh east up prints it)"
            );
            two.east.env.component("kube-apiserver", "stop");
            let outage = async {
                wait_for(
                    "a request to east's stopped API server failing",
                    Duration::from_secs(20),
                    || async { two.east.api::<Pod>().get_opt("any").await.is_err().then_some(()) },
                )
                .await;
                // Three lease durations without east's API server.
                tokio::time::sleep(D * 3).await;
            };
            let outage = futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(outage)).await;
            two.east.env.component("kube-apiserver", "start");
            outage.unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            let after = two.store_record().await;
            assert!(
                after.holder == before.holder && after.term == before.term && after.token == before.token,
                "the store's record across east's API-server outage: {before:?} then {after:?}"
            );
            assert_eq!(
                get(two.east_sidecars[east_leader].http, "/leader").map(|(status, _)| status),
                Ok(200),
                "east's leader led throughout"
            );
            two.east_labels(Some(EAST_PODS[east_leader])).await;
            two.statuses_name(&s, EAST).await;
            two.finish(&s).await;
        })
        .await;
    }

    macro_rules! on_every_shared_store {
        ($($scenario:ident),* $(,)?) => {$(
            mod $scenario {
                use super::*;

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn postgres() {
                    super::$scenario(StoreKind::Postgres).await;
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn redis() {
                    super::$scenario(StoreKind::Redis).await;
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn spanner() {
                    super::$scenario(StoreKind::Spanner).await;
                }
            }
        )*};
    }

    on_every_shared_store!(
        the_leading_clusters_candidates_killed,
        the_leading_cluster_cut_off_from_the_store,
        the_leading_clusters_api_server_down,
    );
}

/// The store both clusters share, started on this machine's address so
/// west's pods reach it; east's candidates reach it through proxies.
enum SharedStore {
    Postgres(PostgresServer),
    Redis(RedisServer),
    Spanner(SpannerForPods),
}

impl SharedStore {
    async fn start(kind: StoreKind, west: &Scenario) -> SharedStore {
        match kind {
            StoreKind::Postgres => SharedStore::Postgres(PostgresServer::start_on(west.env.host_ip)),
            StoreKind::Redis => SharedStore::Redis(RedisServer::start_on(west.env.host_ip)),
            StoreKind::Spanner => SharedStore::Spanner(SpannerForPods::start_without_chart(west).await),
            other => panic!("the {} store is not shared across clusters", other.flag()),
        }
    }

    fn kind(&self) -> StoreKind {
        match self {
            SharedStore::Postgres(_) => StoreKind::Postgres,
            SharedStore::Redis(_) => StoreKind::Redis,
            SharedStore::Spanner(_) => StoreKind::Spanner,
        }
    }

    /// The URL a pod uses (`None`: Spanner, reached through the
    /// environment), at this machine's address.
    fn pod_url(&self, host: std::net::IpAddr) -> Option<String> {
        match self {
            SharedStore::Postgres(server) => Some(server.url_at((host, server.port).into())),
            SharedStore::Redis(server) => Some(server.url_at((host, server.port).into())),
            SharedStore::Spanner(_) => None,
        }
    }

    /// The DistributedLease's `spec.store`.
    fn spec(&self) -> Value {
        let url = json!({"urlSecretRef": {"name": crate::e2e::stores::URL_SECRET, "key": "url"}});
        match self {
            SharedStore::Postgres(_) => json!({ "postgres": url }),
            SharedStore::Redis(_) => json!({ "redis": url }),
            SharedStore::Spanner(spanner) => spanner.store.clone(),
        }
    }

    /// A cluster's DistributedLease on this store, with its URL Secret.
    fn objects(&self, s: &Scenario, timing: &Value) -> Vec<Value> {
        let mut objects: Vec<Value> = self
            .pod_url(s.env.host_ip)
            .map(|url| secret(s, &url))
            .into_iter()
            .collect();
        objects.push(lease(s, LEASE, self.spec(), timing.clone()));
        objects
    }

    /// The environment that points a process at the emulator (its data
    /// connection at `data`); nothing for the URL stores, whose URL is in
    /// the Secret or a flag.
    fn env(&self, data: std::net::SocketAddr) -> Vec<(String, String)> {
        match self {
            SharedStore::Spanner(spanner) => spanner
                .env()
                .map(|(k, v)| match k {
                    "SPANNER_EMULATOR_HOST" => (k.to_string(), data.to_string()),
                    _ => (k.to_string(), v),
                })
                .collect(),
            SharedStore::Postgres(_) | SharedStore::Redis(_) => Vec::new(),
        }
    }

    /// West's chart values and pod annotations that point its operator and
    /// sidecars at the emulator.
    fn west_values(&self) -> (Vec<String>, Value) {
        match self {
            SharedStore::Spanner(spanner) => (spanner.chart_values(), spanner.pod_annotations()),
            SharedStore::Postgres(_) | SharedStore::Redis(_) => (Vec::new(), json!({})),
        }
    }

    /// Where the store listens (what east's proxies forward to).
    fn addr(&self) -> std::net::SocketAddr {
        match self {
            SharedStore::Postgres(server) => server.addr(),
            SharedStore::Redis(server) => server.addr(),
            SharedStore::Spanner(spanner) => spanner.emulator.host.parse().expect("the emulator's address"),
        }
    }

    /// An east candidate's store flags, reaching the store through `proxy`.
    fn candidate_flags(&self, proxy: std::net::SocketAddr) -> Vec<String> {
        let mut flags = vec!["--store".to_string(), self.kind().flag().to_string()];
        match self {
            SharedStore::Postgres(server) => flags.extend(["--store-url".into(), server.url_at(proxy)]),
            SharedStore::Redis(server) => flags.extend(["--store-url".into(), server.url_at(proxy)]),
            SharedStore::Spanner(spanner) => flags.extend(["--database".into(), spanner.config.database.clone()]),
        }
        flags
    }

    /// The store's own view, through no proxy, by the library's store
    /// selection; the emulator's endpoints are given, not read from this
    /// process's environment.
    async fn connect(&self) -> Arc<dyn LeaseStore> {
        let config = match self {
            SharedStore::Postgres(server) => StoreConfig::postgres(StoreUrl::new(server.url()), DEFAULT_TABLE.into()),
            SharedStore::Redis(server) => StoreConfig::redis(StoreUrl::new(server.url())),
            SharedStore::Spanner(spanner) => {
                let store = SpannerStore::connect_to(
                    spanner.config.clone(),
                    spanner.emulator.endpoints(),
                    DEFAULT_CALL_TIMEOUT,
                )
                .await
                .expect("connecting to the test's emulator");
                return Arc::new(store);
            }
        };
        let config = config.expect("the test's store URL");
        config.connect(false).await.expect("connecting to the test's store")
    }
}

/// The two clusters, their candidates and watchers, east leading first.
struct TwoClusters {
    east: Scenario,
    /// East's DistributedLease, deleted while east's operator runs (fields
    /// drop in order), so its finalizer is removed as in production and
    /// the next scenario finds east's namespace gone.
    east_lease: DeleteOnDrop,
    store: SharedStore,
    /// The store's own view (through no proxy).
    direct: Arc<dyn LeaseStore>,
    operator: HostProcess,
    east_sidecars: Vec<Sidecar>,
    west_watcher: LeadershipWatcher,
    east_watcher: LeadershipWatcher,
    across: AcrossClusters,
}

impl TwoClusters {
    async fn start(west: &Scenario, kind: StoreKind) -> TwoClusters {
        let east_kubeconfig = std::env::var("LEASEHOLD_E2E_EAST_KUBECONFIG")
            .ok()
            .filter(|v| !v.is_empty())
            .unwrap_or_else(|| panic!("{HOW_TO_GET_EAST}"));
        let mut east_env = west.env.clone();
        east_env.kubeconfig = east_kubeconfig.into();
        // Stops east's parts (its API server), never the suite's cluster's.
        east_env.component = std::env::var("LEASEHOLD_E2E_EAST_COMPONENT")
            .ok()
            .filter(|v| !v.is_empty());
        let east = Scenario {
            client: east_env.client().await,
            env: east_env,
            ns: NS.into(),
        };
        let store = SharedStore::start(kind, west).await;
        let direct = store.connect().await;
        // West names itself (the suite installs without a name; each
        // scenario's finish installs that again).
        let (mut values, west_annotations) = store.west_values();
        values.push(format!("clusterName={WEST}"));
        install_chart_with(&west.env, &west.client, &values).await;

        let timing = json!({"leaseDuration": secs(D), "renewDeadline": secs(R), "retryPeriod": secs(P)});

        // East: what a previous run left goes, then the resource, its
        // operator and its candidates.
        let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(east.client.clone());
        // A run killed before its guard deleted east's DistributedLease
        // (`east_lease`; e.g. ended by nextest's timeout) left it with its
        // `leasehold.dev/release` finalizer and no operator to remove it, so
        // the namespace would never finish terminating: drop it here (that
        // run's store is gone too, there is nothing to release).
        let old_leases: Api<DistributedLease> = Api::namespaced(east.client.clone(), NS);
        if let Ok(list) = old_leases.list(&ListParams::default()).await {
            for old in list {
                let unfinalized = kube::api::Patch::Merge(json!({"metadata": {"finalizers": null}}));
                let name = kube::ResourceExt::name_any(&old);
                let _ = old_leases
                    .patch(&name, &kube::api::PatchParams::default(), &unfinalized)
                    .await;
            }
        }
        let _ = namespaces.delete(NS, &Default::default()).await;
        wait_for("east's old namespace gone", Duration::from_secs(60), || async {
            namespaces.get_opt(NS).await.ok().flatten().is_none().then_some(())
        })
        .await;
        apply(&east.client, &crds()).await;
        apply(&east.client, &[namespace_object(NS)]).await;
        // East's candidates are Pod objects made here, not by a controller
        // that would retry them.
        default_service_account(&east.client, NS).await;
        east.apply(store.objects(&east, &timing)).await;
        let east_lease = DeleteOnDrop {
            env: east.env.clone(),
            namespace: Some(NS.into()),
            objects: vec![("distributedlease", LEASE.into())],
        };
        let operator = HostProcess::operator(&east, &store.env(store.addr()));
        let east_watcher = LeadershipWatcher::start(
            &east.client,
            Watched {
                ns: NS,
                pods: APP,
                service: None,
                lease: Some(LEASE),
            },
        );
        let mut east_sidecars = Vec::new();
        for name in EAST_PODS {
            let uid = gated_pod(&east, name).await;
            let proxy = TcpProxy::start(store.addr()).await;
            let mut flags = store.candidate_flags(proxy.addr);
            flags.extend(
                [
                    "--create-table",
                    "--pod-namespace",
                    NS,
                    "--pod-uid",
                    &uid,
                    "--cluster-name",
                    EAST,
                    "--kubernetes",
                    "true",
                ]
                .map(String::from),
            );
            let mut env = store.env(proxy.addr);
            env.extend(
                [
                    ("KUBECONFIG", east.env.kubeconfig.display().to_string()),
                    ("LEASEHOLD_LEASE_DURATION", secs(D)),
                    ("LEASEHOLD_RENEW_DEADLINE", secs(R)),
                    ("LEASEHOLD_RETRY_PERIOD", secs(P)),
                ]
                .map(|(k, v)| (k.to_string(), v)),
            );
            let lock = format!("{NS}/{LEASE}");
            let sidecar = tokio::task::block_in_place(|| Sidecar::launch(name, proxy, &lock, &[], &env, &flags));
            east_sidecars.push(sidecar);
        }

        // West: the example's lease (same namespace and name, so the same
        // lock) and its candidates, once east leads.
        let west_watcher = crate::e2e::fixtures::watch_example(west, true);
        let across = AcrossClusters::start(direct.clone(), &west_watcher, &east_sidecars);
        let two = TwoClusters {
            east,
            east_lease,
            store,
            direct,
            operator,
            east_sidecars,
            west_watcher,
            east_watcher,
            across,
        };
        two.east_leads().await;
        west.apply(two.store.objects(west, &timing)).await;
        let mut example = crate::e2e::fixtures::example_with_pod_annotations(west, west_annotations);
        for object in &mut example {
            if object["kind"] == "Deployment" {
                object["spec"]["replicas"] = json!(2);
            }
        }
        west.apply(example).await;
        two
    }

    /// The east candidate that leads (waited for).
    async fn east_leads(&self) -> usize {
        wait_for("one of east's candidates leading", Duration::from_secs(60), || async {
            self.east_sidecars
                .iter()
                .position(|s| get(s.http, "/leader").map(|(status, _)| status) == Ok(200))
        })
        .await
    }

    /// West's candidates run and follow: west's status names east's holder.
    async fn west_follows(&self, west: &Scenario) {
        wait_for("west's two candidates running", Duration::from_secs(120), || async {
            let pods = west.pods(APP).await;
            let running = pods
                .iter()
                .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"));
            (running.count() == 2).then_some(())
        })
        .await;
        self.statuses_name(west, EAST).await;
    }

    /// West's new leader claims, as west's watcher reads it inside the pod:
    /// the cross-cluster watcher's view of west is not empty by default.
    async fn west_claims(&self) {
        let claims = self.west_watcher.claims_now();
        wait_for(
            "west's leader claiming, read inside its pod",
            Duration::from_secs(30),
            || async { (!claims().is_empty()).then_some(()) },
        )
        .await;
    }

    /// Both clusters' DistributedLease statuses name the holder in
    /// `cluster`: `Ready=True` with `LeaderElected` there and
    /// `LeaderInOtherCluster` in the other.
    async fn statuses_name(&self, west: &Scenario, cluster: &str) {
        for (name, client) in [(WEST, &west.client), (EAST, &self.east.client)] {
            let reason = if name == cluster {
                "LeaderElected"
            } else {
                "LeaderInOtherCluster"
            };
            let leases: Api<DistributedLease> = Api::namespaced(client.clone(), NS);
            wait_for(
                &format!("{name}'s status naming the holder in {cluster} ({reason})"),
                Duration::from_secs(60),
                || async {
                    let lease = leases.get(LEASE).await.ok()?;
                    let status = lease.status?;
                    let ready = status.conditions.iter().find(|c| c.type_ == "Ready")?;
                    let holder = status.holder.as_deref()?;
                    (status.holder_cluster.as_deref() == Some(cluster)
                        && holder.starts_with(&format!("{cluster}/"))
                        && ready.status == "True"
                        && ready.reason == reason)
                        .then_some(())
                },
            )
            .await;
        }
        // No west pod labelled leader while east leads, and the other way round.
        if cluster == EAST {
            assert!(
                self.west_watcher.leaders().is_empty(),
                "west labels {:?} leader while east leads",
                self.west_watcher.leaders()
            );
        }
    }

    /// East's pods converge to `leader` alone labelled leader (none: no
    /// east pod labelled).
    async fn east_labels(&self, leader: Option<&str>) {
        let pods: Api<Pod> = Api::namespaced(self.east.client.clone(), NS);
        wait_for(
            &format!("east's leader labels on {leader:?} alone"),
            Duration::from_secs(60),
            || async {
                let list = pods.list(&ListParams::default().labels(APP)).await.ok()?;
                let labelled: Vec<String> = list
                    .items
                    .into_iter()
                    .filter(|p| {
                        p.metadata
                            .labels
                            .as_ref()
                            .and_then(|l| l.get(DEFAULT_LABEL_KEY))
                            .map(String::as_str)
                            == Some("true")
                    })
                    .filter_map(|p| p.metadata.name)
                    .collect();
                (labelled == leader.into_iter().map(String::from).collect::<Vec<_>>()).then_some(())
            },
        )
        .await;
    }

    /// Waits for the store's row to name a holder of `cluster`; when the
    /// cross-cluster watcher first saw it.
    async fn store_holder_in(&self, cluster: &str, within: Duration) -> (String, Instant) {
        wait_for(&format!("the store's holder in {cluster}"), within, || async {
            self.across.first_holder_in(cluster)
        })
        .await
    }

    async fn store_record(&self) -> LeaseRecord {
        read_row(self.direct.as_ref()).await.expect("the store's row")
    }

    /// Stops the watchers and the host processes and fails on any
    /// violation; back to the suite's install of west.
    async fn finish(self, west: &Scenario) {
        let violations = self.across.stop();
        self.east_watcher.stop();
        let east = self.east_watcher.violations();
        drop(self.east_sidecars);
        drop(self.east_lease);
        drop(self.operator);
        install_chart_with(&west.env, &west.client, &[]).await;
        assert!(violations.is_empty(), "across the clusters:\n{}", violations.join("\n"));
        assert!(east.is_empty(), "east's watcher:\n{}", east.join("\n"));
        // West's watcher reads the claims and may see its API server's
        // watches relist: its own violations are what is judged here.
        let west_violations = self.west_watcher.violations();
        self.west_watcher.stop();
        assert!(
            west_violations.is_empty(),
            "west's watcher:\n{}",
            west_violations.join("\n")
        );
    }
}

fn secs(d: Duration) -> String {
    format!("{}s", d.as_secs())
}

async fn read_row(store: &dyn LeaseStore) -> Option<LeaseRecord> {
    store.observe(&format!("{NS}/{LEASE}")).await.ok()?.record
}

/// A candidate's pod object in east: it never runs (no node), held Pending
/// by a scheduling gate (KEP-3521: the scheduler leaves gated pods alone);
/// its sidecar runs on the host. Returns its UID.
async fn gated_pod(east: &Scenario, name: &str) -> String {
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": {"app": "scheduler"}},
        "spec": {
            "schedulingGates": [{"name": "leasehold.dev/e2e-host-process"}],
            "containers": [{"name": "app", "image": east.env.app_image}],
        },
    });
    east.apply(vec![pod]).await;
    let pods: Api<Pod> = east.api();
    pods.get(name)
        .await
        .expect("the gated pod")
        .metadata
        .uid
        .expect("a UID")
}

/// A `leasehold` process on the host, ended when dropped.
struct HostProcess {
    child: Child,
}

impl HostProcess {
    /// East's operator: a host process with east's kubeconfig and its
    /// name, and `env` (the emulator's address on Spanner).
    fn operator(east: &Scenario, env: &[(String, String)]) -> HostProcess {
        let log = std::fs::File::create(std::env::temp_dir().join("leasehold-e2e-east-operator.log"))
            .expect("the east operator's log file");
        let child = Command::new(env!("CARGO_BIN_EXE_leasehold"))
            .args(["operator", "--listen", "127.0.0.1:0", "--leader-election", "false"])
            .args(["--cluster-name", EAST, "--watch-namespace", NS])
            .env("KUBECONFIG", &east.env.kubeconfig)
            .env("LEASEHOLD_LOG", "info")
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("starting east's operator");
        HostProcess { child }
    }
}

impl Drop for HostProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The cross-cluster watcher: every 100 ms it reads the store's row (the
/// store's own record, through no proxy), east's candidates' `/leader` and
/// west's latest claims (read inside its pods by west's watcher), and
/// records two leaders claiming in two clusters at once, a token or term
/// going back in the store and a term changing holder.
struct AcrossClusters {
    state: Arc<Mutex<AcrossState>>,
    task: JoinHandle<()>,
}

#[derive(Default)]
struct AcrossState {
    violations: Vec<String>,
    last: Option<LeaseRecord>,
    /// Cluster -> (holder, when first seen in the store).
    first_holder: Vec<(String, String, Instant)>,
}

impl AcrossClusters {
    fn start(store: Arc<dyn LeaseStore>, west: &LeadershipWatcher, east: &[Sidecar]) -> AcrossClusters {
        let west_claims: ClaimsNow = west.claims_now();
        let east_ports: Vec<(String, u16)> = east.iter().map(|s| (s.name.clone(), s.http)).collect();
        let state = Arc::new(Mutex::new(AcrossState::default()));
        let shared = state.clone();
        let task = tokio::spawn(async move {
            loop {
                let row = read_row(store.as_ref()).await;
                let ports = east_ports.clone();
                let east_claims = tokio::task::spawn_blocking(move || {
                    ports
                        .iter()
                        .filter(|(_, port)| get(*port, "/leader").map(|(status, _)| status) == Ok(200))
                        .map(|(name, _)| name.clone())
                        .collect::<Vec<_>>()
                })
                .await
                .unwrap_or_default();
                let west_claimants = west_claims();
                {
                    let mut state = shared.lock().unwrap();
                    state.judge_claims(&east_claims, &west_claimants);
                    if let Some(row) = row {
                        state.judge(row);
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        AcrossClusters { state, task }
    }

    fn first_holder_in(&self, cluster: &str) -> Option<(String, Instant)> {
        let state = self.state.lock().unwrap();
        let seen = state.first_holder.iter().find(|(c, _, _)| c == cluster);
        seen.map(|(_, holder, at)| (holder.clone(), *at))
    }

    fn stop(&self) -> Vec<String> {
        self.task.abort();
        self.state.lock().unwrap().violations.clone()
    }
}

impl AcrossState {
    /// Who claims to lead in each cluster at one poll: at most one in all.
    fn judge_claims(&mut self, east: &[String], west: &[String]) {
        if east.len() + west.len() > 1 {
            self.violations
                .push(format!("two leaders claiming at once: east {east:?}, west {west:?}"));
        }
    }

    fn judge(&mut self, row: LeaseRecord) {
        if let Some(last) = &self.last {
            if row.term < last.term || row.token < last.token {
                self.violations
                    .push(format!("the store's term or token went back: {last:?} then {row:?}"));
            }
            if row.term == last.term && row.holder.is_some() && last.holder.is_some() && row.holder != last.holder {
                self.violations
                    .push(format!("term {} changed holder: {last:?} then {row:?}", row.term));
            }
            if row.term > last.term && row.token <= last.token {
                self.violations
                    .push(format!("a new term without a higher token: {last:?} then {row:?}"));
            }
        }
        if let Some(holder) = &row.holder
            && let Some((cluster, _)) = holder.split_once('/')
            && !self.first_holder.iter().any(|(c, h, _)| c == cluster && h == holder)
        {
            self.first_holder
                .push((cluster.to_string(), holder.clone(), Instant::now()));
        }
        self.last = Some(row);
    }
}

impl Drop for AcrossClusters {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The cross-cluster watcher's judgements catch what they are for, fed
/// planted histories (no cluster needed): a leader in each cluster at
/// once, a token going back, a term changing holder and a new term
/// without a higher token; a clean handover across the clusters passes.
#[test]
fn the_cross_cluster_watcher_catches_planted_histories() {
    let row = |holder: &str, term: u64, token: i64| LeaseRecord {
        name: format!("{NS}/{LEASE}"),
        holder: Some(holder.to_string()),
        term,
        token: Some(leasehold::lease::FencingToken(token)),
        renewed_at: None,
        lease_duration: D,
        version: None,
        reservation: None,
        ended: None,
    };
    let judged = |rows: Vec<LeaseRecord>, claims: (&[&str], &[&str])| {
        let mut state = AcrossState::default();
        let owned = |c: &[&str]| c.iter().map(|c| c.to_string()).collect::<Vec<_>>();
        state.judge_claims(&owned(claims.0), &owned(claims.1));
        for r in rows {
            state.judge(r);
        }
        state.violations
    };
    let clean = judged(
        vec![
            row("east/e2e-clusters/east-0#a", 1, 10),
            row("west/e2e-clusters/w-0#b", 2, 20),
        ],
        (&["east-0"], &[]),
    );
    assert!(clean.is_empty(), "{clean:?}");
    let planted = [
        ("two leaders", judged(vec![], (&["east-0"], &["w-0"]))),
        (
            "token back",
            judged(
                vec![
                    row("east/e2e-clusters/east-0#a", 2, 20),
                    row("west/e2e-clusters/w-0#b", 3, 15),
                ],
                (&[], &[]),
            ),
        ),
        (
            "holder changed within a term",
            judged(
                vec![
                    row("east/e2e-clusters/east-0#a", 2, 20),
                    row("west/e2e-clusters/w-0#b", 2, 20),
                ],
                (&[], &[]),
            ),
        ),
        (
            "term back",
            judged(
                vec![
                    row("east/e2e-clusters/east-0#a", 3, 20),
                    row("east/e2e-clusters/east-0#a", 2, 30),
                ],
                (&[], &[]),
            ),
        ),
    ];
    for (what, violations) in planted {
        assert!(!violations.is_empty(), "{what}: not caught");
    }
}
