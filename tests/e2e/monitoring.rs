//! Operating it on the real cluster: `leasehold status` (and as the kubectl
//! plugin) on a led lease and through a failover with `--watch`; a real
//! Prometheus (Debian's, started here on loopback) scraping the sidecars
//! with the shipped alerting rules: the two-leader alert stays silent
//! through a failover, fires on a planted duplicate leader series, and the
//! no-leader alert fires in a planted leaderless window.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::DeleteParams;
use serde_json::{Value, json};

use crate::e2e::cluster::{Scenario, repo, scenario, wait_for};
use crate::e2e::fixtures::{APP, FIRST_LEADER, LEASE, SUCCESSOR, leader_only_service};

/// The sidecar's metrics port (the chart's sidecar.metricsPort).
const METRICS_PORT: u16 = 4041;
/// Scrape and rule evaluation interval of the test's Prometheus.
const INTERVAL: &str = "1s";
/// Every rule's `for` in the test's copy of the rules: five intervals, as
/// the shipped minutes are several intervals of a 30 s scrape.
const FOR: &str = "5s";
/// Prometheus's scrapes and evaluations start within a few intervals; this
/// bounds each wait for a result in the generous way of the suite.
const PROMETHEUS_WAIT: Duration = Duration::from_secs(90);

/// `leasehold status -o json` in `namespace`, or in all namespaces.
fn status_json(s: &Scenario, namespace: Option<&str>) -> Vec<Value> {
    let mut status = s.env.leasehold();
    status.args(["status", "-o", "json"]);
    if let Some(ns) = namespace {
        status.args(["-n", ns]);
    }
    let out = status.output().expect("leasehold status");
    assert!(
        out.status.success(),
        "leasehold status: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("leasehold status -o json prints JSON")
}

#[tokio::test]
async fn status_shows_the_holder_and_watch_follows_a_failover() {
    scenario("e2e-status", |s| async move {
        let (_store, watcher) = leader_only_service(&s, json!({})).await;
        let leader = watcher.one_leader(None, FIRST_LEADER).await;

        // The operator's status catches up with the store; then one line
        // names the leader, Ready.
        let ready = |line: &Value| {
            let conditions = line["conditions"].as_array().cloned().unwrap_or_default();
            conditions.iter().any(|c| c["type"] == "Ready" && c["status"] == "True")
        };
        let line = wait_for("leasehold status names the leader, Ready", FIRST_LEADER, || async {
            let lines = status_json(&s, Some(&s.ns));
            let [line] = lines.as_slice() else { return None };
            (line["holder"].as_str().is_some_and(|h| h.contains(&leader)) && ready(line)).then(|| line.clone())
        })
        .await;
        assert_eq!(line["name"], LEASE);
        assert!(line["term"].as_u64().is_some_and(|t| t >= 1), "{line}");
        assert_eq!(line["candidates"], 3, "{line}");
        assert!(line["tokenAgeSeconds"].as_f64().is_some_and(|a| a >= 0.0), "{line}");
        // Without a namespace: every namespace's leases, this one among them.
        let all = status_json(&s, None);
        assert!(
            all.iter().any(|l| l["namespace"] == json!(s.ns) && l["name"] == LEASE),
            "{all:?}"
        );

        // The table, through kubectl's plugin mechanism: kubectl-leasehold on PATH.
        let plugins = tempdir("kubectl-plugins");
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_leasehold"), plugins.join("kubectl-leasehold")).unwrap();
        let path = format!("{}:{}", plugins.display(), std::env::var("PATH").unwrap_or_default());
        let table = wait_for(
            "kubectl leasehold status shows the leader, 3/3 ready, Ready",
            FIRST_LEADER,
            || async {
                let out = s
                    .env
                    .kubectl()
                    .env("PATH", &path)
                    .args(["leasehold", "status", "-n", &s.ns])
                    .output()
                    .unwrap();
                assert!(
                    out.status.success(),
                    "kubectl leasehold status: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                let table = String::from_utf8_lossy(&out.stdout).into_owned();
                let row = table.lines().nth(1).unwrap_or_default();
                (row.contains(&leader) && row.contains("3/3") && row.contains("Ready=True")).then_some(table)
            },
        )
        .await;
        assert!(table.starts_with("NAMESPACE"), "{table}");
        std::fs::remove_dir_all(&plugins).unwrap();

        // --watch prints the current line, then the successor's.
        let mut watch = s
            .env
            .leasehold()
            .args(["status", "-n", &s.ns, "-o", "json", "--watch"])
            .stdout(Stdio::piped())
            .spawn()
            .expect("leasehold status --watch");
        let (tx, mut lines) = tokio::sync::mpsc::unbounded_channel::<Value>();
        let stdout = watch.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(serde_json::from_str(&line).expect("each --watch line is JSON"));
            }
        });
        let first = lines.recv().await.expect("the current state");
        assert!(first["holder"].as_str().is_some_and(|h| h.contains(&leader)), "{first}");
        s.api::<Pod>()
            .delete(&leader, &DeleteParams::default())
            .await
            .expect("deleting the leader");
        let successor = watcher.one_leader(Some(&leader), SUCCESSOR).await;
        let seen = tokio::time::timeout(SUCCESSOR, async {
            loop {
                let line = lines.recv().await.expect("--watch keeps printing");
                if line["holder"].as_str().is_some_and(|h| h.contains(&successor)) {
                    return line;
                }
            }
        })
        .await
        .expect("--watch printed the successor");
        assert!(
            seen["term"].as_u64() > first["term"].as_u64(),
            "a new term: {first} then {seen}"
        );
        watch.kill().unwrap();
        watch.wait().unwrap();
        watcher.finish();
    })
    .await;
}

/// A folder of its own under the temp dir.
fn tempdir(what: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("leasehold-e2e-{what}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Debian's Prometheus on a loopback port, with the shipped rules (every
/// `for` shortened to [`FOR`]) and two file_sd target files the test writes:
/// the sidecars, and a second job that starts empty (for a planted fault).
struct Prometheus {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl Prometheus {
    fn start() -> Prometheus {
        let dir = tempdir("prometheus");
        // The shipped rules; only the `for`s change.
        let shipped = std::fs::read_to_string(repo().join("manifests/prometheus/leasehold-rules.yaml")).unwrap();
        let mut rules: Value = serde_yaml::from_str(&shipped).unwrap();
        for group in rules["groups"].as_array_mut().unwrap() {
            for rule in group["rules"].as_array_mut().unwrap() {
                rule["for"] = json!(FOR);
            }
        }
        std::fs::write(dir.join("rules.yaml"), serde_yaml::to_string(&rules).unwrap()).unwrap();
        let config = json!({
            "global": {"scrape_interval": INTERVAL, "evaluation_interval": INTERVAL, "scrape_timeout": INTERVAL},
            "rule_files": [dir.join("rules.yaml")],
            "scrape_configs": [
                {"job_name": "leasehold-sidecars", "file_sd_configs": [{"files": [dir.join("sidecars.json")]}]},
                {"job_name": "planted", "file_sd_configs": [{"files": [dir.join("planted.json")]}]},
            ],
        });
        std::fs::write(dir.join("prometheus.yml"), serde_yaml::to_string(&config).unwrap()).unwrap();
        write_atomically(&dir.join("sidecars.json"), "[]");
        write_atomically(&dir.join("planted.json"), "[]");
        let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", dir.join("prometheus.yml").display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting prometheus: {e}; install it (Debian: apt-get install prometheus; scripts/setup-servers.sh does)"));
        Prometheus { child, port, dir }
    }

    /// GET on the HTTP API; the `data` of a successful answer.
    fn get(&self, path: &str, params: &[(&str, &str)]) -> Option<Value> {
        let query: String = url::form_urlencoded::Serializer::new(String::new())
            .extend_pairs(params)
            .finish();
        let mut stream = TcpStream::connect((Ipv4Addr::LOCALHOST, self.port)).ok()?;
        write!(stream, "GET {path}?{query} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer).ok()?;
        let (_, body) = answer.split_once("\r\n\r\n")?;
        let body: Value = serde_json::from_str(body).ok()?;
        (body["status"] == "success").then(|| body["data"].clone())
    }

    /// An instant query's result vector.
    fn query(&self, promql: &str) -> Option<Vec<Value>> {
        self.get("/api/v1/query", &[("query", promql)])?["result"]
            .as_array()
            .cloned()
    }

    /// The alerts named `name` in `state` (pending or firing) now.
    fn alerts(&self, name: &str, state: &str) -> Option<Vec<Value>> {
        let alerts = self.get("/api/v1/alerts", &[])?["alerts"].as_array()?.clone();
        Some(
            alerts
                .into_iter()
                .filter(|a| a["labels"]["alertname"] == name && a["state"] == state)
                .collect(),
        )
    }

    /// Scrapes the candidate pods, labelled as the chart's PodMonitor labels
    /// them, once `count` of them (not being deleted) have an address: a pod
    /// still starting has none, and a target list written without it never
    /// sums to every candidate (a fresh-clone CI run wrote its list about a
    /// second after the pods were created and never saw three).
    /// `only` narrows the list to one pod.
    async fn target_pods(&self, s: &Scenario, file: &str, count: usize, only: Option<&str>) {
        let addressed = wait_for(
            &format!("{count} candidate pod(s) with an address"),
            FIRST_LEADER,
            || async {
                let addressed: Vec<(String, String)> = s
                    .pods(APP)
                    .await
                    .into_iter()
                    .filter(|p| p.metadata.deletion_timestamp.is_none())
                    .filter_map(|p| Some((p.metadata.name?, p.status?.pod_ip?)))
                    .collect();
                (addressed.len() == count).then_some(addressed)
            },
        )
        .await;
        let targets: Vec<Value> = addressed
            .into_iter()
            .filter(|(name, _)| only.is_none_or(|o| o == name))
            .map(|(name, ip)| {
                json!({"targets": [format!("{ip}:{METRICS_PORT}")],
                       "labels": {"namespace": s.ns, "lease": LEASE, "pod": name}})
            })
            .collect();
        write_atomically(&self.dir.join(file), &Value::from(targets).to_string());
    }

    /// Waits until the scraped sidecars of the lease sum to `leaders` leaders
    /// over `candidates` candidates; if not, says what Prometheus saw last
    /// and how each target's scrapes went.
    async fn sees(&self, s: &Scenario, leaders: u64, candidates: u64) {
        let selector = format!(
            "{{job=\"leasehold-sidecars\", namespace=\"{}\", lease=\"{LEASE}\"}}",
            s.ns
        );
        let sum = format!("sum(leasehold_is_leader{selector}) * 1000 + count(leasehold_is_leader{selector})");
        let want = json!((leaders * 1000 + candidates).to_string());
        let started = std::time::Instant::now();
        loop {
            let seen = self.query(&sum);
            if seen
                .as_ref()
                .and_then(|r| r.first())
                .is_some_and(|r| r["value"][1] == want)
            {
                return;
            }
            if started.elapsed() > PROMETHEUS_WAIT {
                let targets = self.get("/api/v1/targets", &[]).unwrap_or_default();
                let targets: Vec<Value> = targets["activeTargets"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|t| json!([t["scrapeUrl"], t["health"], t["lastError"]]))
                    .collect();
                panic!(
                    "Prometheus sees {leaders} leader(s) among {candidates} sidecar(s): not within \
                     {PROMETHEUS_WAIT:?}; last `{sum}`: {seen:?}; targets: {targets:?}"
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Waits until `name` fires for this lease.
    async fn fires(&self, s: &Scenario, name: &str) -> Value {
        wait_for(
            &format!("{name} firing for {}/{LEASE}", s.ns),
            PROMETHEUS_WAIT,
            || async {
                let alerts = self.alerts(name, "firing")?;
                alerts
                    .into_iter()
                    .find(|a| a["labels"]["namespace"] == json!(s.ns) && a["labels"]["lease"] == LEASE)
            },
        )
        .await
    }

    /// The instants in the last `window` at which `name` was firing (the
    /// `ALERTS` series Prometheus writes at every evaluation).
    fn fired_within(&self, name: &str, window: Duration) -> Vec<Value> {
        let promql = format!(
            "ALERTS{{alertname=\"{name}\", alertstate=\"firing\"}}[{}s]",
            window.as_secs().max(1)
        );
        self.query(&promql).expect("a range query")
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let log = std::fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(30).collect();
            eprintln!(
                "===== prometheus log (last lines)\n{}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// file_sd reads a file as soon as it changes: it must never see half of one.
fn write_atomically(path: &Path, text: &str) {
    let partial = path.with_extension("partial");
    std::fs::write(&partial, text).unwrap();
    std::fs::rename(&partial, path).unwrap();
}

#[tokio::test]
async fn prometheus_scraping_the_sidecars_alerts_on_no_leader_and_only_then() {
    scenario("e2e-monitoring", |s| async move {
        // Prometheus runs before the candidates exist: the target list is
        // written as they start, so it must wait until every one has an
        // address (a list written too early never sums to three).
        let prometheus = Prometheus::start();
        let (_store, watcher) = leader_only_service(&s, json!({})).await;
        prometheus.target_pods(&s, "sidecars.json", 3, None).await;
        let leader = watcher.one_leader(None, FIRST_LEADER).await;
        prometheus.sees(&s, 1, 3).await;
        let rules = prometheus.get("/api/v1/rules", &[]).expect("/api/v1/rules");
        let names: Vec<&str> = rules["groups"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|g| g["rules"].as_array().unwrap())
            .map(|r| r["name"].as_str().unwrap())
            .collect();
        assert!(
            names.contains(&"LeaseholdTwoLeaders") && names.contains(&"LeaseholdNoLeader"),
            "{rules}"
        );

        // A failover: the leader pod deleted, a follower takes over.
        let started = std::time::Instant::now();
        s.api::<Pod>()
            .delete(&leader, &DeleteParams::default())
            .await
            .expect("deleting the leader");
        let successor = watcher.one_leader(Some(&leader), SUCCESSOR).await;
        prometheus.target_pods(&s, "sidecars.json", 3, None).await;
        prometheus.sees(&s, 1, 3).await;
        let fired = prometheus.fired_within("LeaseholdTwoLeaders", started.elapsed() + Duration::from_secs(5));
        assert!(
            fired.is_empty(),
            "LeaseholdTwoLeaders fired through the failover: {fired:?}"
        );

        // Planted: the leader's metrics scraped a second time as another
        // target, as two pods claiming the lock would show: the alert fires.
        let planted = std::time::Instant::now();
        prometheus.target_pods(&s, "planted.json", 3, Some(&successor)).await;
        let alert = prometheus.fires(&s, "LeaseholdTwoLeaders").await;
        eprintln!(
            "LeaseholdTwoLeaders fired {:?} after the planted duplicate (for: {FOR})",
            planted.elapsed()
        );
        assert_eq!(
            alert["value"].as_str().map(|v| v.parse::<f64>().unwrap()),
            Some(2.0),
            "{alert}"
        );
        write_atomically(&prometheus.dir.join("planted.json"), "[]");

        // Planted: a leaderless window (every candidate scaled away).
        assert!(
            prometheus.alerts("LeaseholdNoLeader", "firing").unwrap().is_empty(),
            "no-leader firing while led"
        );
        s.kubectl_ns(&["scale", "deployment/scheduler", "--replicas=0"]);
        wait_for("every candidate gone", SUCCESSOR, || async {
            s.pods(APP).await.is_empty().then_some(())
        })
        .await;
        let leaderless = std::time::Instant::now();
        prometheus.target_pods(&s, "sidecars.json", 0, None).await;
        let alert = prometheus.fires(&s, "LeaseholdNoLeader").await;
        eprintln!(
            "LeaseholdNoLeader fired {:?} after the last candidate was gone (for: {FOR})",
            leaderless.elapsed()
        );
        assert_eq!(alert["labels"]["severity"], "critical", "{alert}");
        watcher.finish();
    })
    .await;
}

/// The lease's D, R and P in [`renewals_slowed_past_a_quarter_of_r_minus_p_show_timing_at_risk`]:
/// a short P, so the sidecar's twenty renewals before its first verdict
/// take seconds, and R − P (7 s) wide enough that a delayed renewal still
/// lands well within R.
const TIMING: [(&str, Duration); 3] = [
    ("leaseDuration", Duration::from_secs(12)),
    ("renewDeadline", Duration::from_secs(8)),
    ("retryPeriod", Duration::from_secs(1)),
];
/// Each store reply held back this long: over a quarter of R − P (1.75 s),
/// so one renewal is over the budget's share, and (one or two round trips)
/// within the store calls' 5 s timeout.
const SLOW_REPLIES: Duration = Duration::from_secs(2);

/// The promise of docs/operator.md and the README: a candidate whose
/// renewal p99 uses more than 25 % of R − P sets its pod condition
/// `leasehold.dev/timing-at-risk`, with a Warning Event `TimingAtRisk`, and
/// the operator shows `TimingAtRisk=True` (RenewalsSlow) naming the pod.
/// The store is a PostgreSQL behind a proxy the test slows.
#[tokio::test]
async fn renewals_slowed_past_a_quarter_of_r_minus_p_show_timing_at_risk() {
    use leasehold::api::contract::TIMING_CONDITION;
    use leasehold::testing::servers::PostgresServer;
    use leasehold::testing::{ProxyMode, TcpProxy};

    use crate::e2e::stores::{lease, secret};

    scenario("e2e-timing-risk", |s| async move {
        let server = PostgresServer::start_on(s.env.host_ip);
        let proxy = TcpProxy::start_on(s.env.host_ip, server.addr()).await;
        let url = server.url_at((s.env.host_ip, proxy.addr.port()).into());
        let timing: serde_json::Map<String, Value> = TIMING
            .iter()
            .map(|(field, value)| (field.to_string(), json!(format!("{}s", value.as_secs()))))
            .collect();
        let [_, (_, r), (_, p)] = TIMING;
        let store = json!({"postgres": {"urlSecretRef": {"name": crate::e2e::stores::URL_SECRET, "key": "url"}}});
        let watcher = crate::e2e::fixtures::watch_example(&s, true);
        s.apply(vec![secret(&s, &url), lease(&s, LEASE, store, Value::Object(timing))])
            .await;
        s.apply(s.example("leader-only-service.yaml")).await;
        let leader = watcher.one_leader(None, FIRST_LEADER).await;

        // Under the store's own latency the leader's sidecar judges its
        // renewals within budget (after its first twenty, one per P).
        let condition = async |status: &str| {
            let pod: Pod = s.api().get(&leader).await.ok()?;
            let conditions = pod.status?.conditions?;
            conditions
                .into_iter()
                .find(|c| c.type_ == TIMING_CONDITION && c.status == status)
        };
        wait_for("the leader's renewals judged within budget", 20 * (p + r), || {
            condition("False")
        })
        .await;

        // Every reply slowed: the next renewal uses over a quarter of R − P.
        proxy.set(ProxyMode::DelayReplies(SLOW_REPLIES));
        let judged = wait_for("the leader's pod condition at risk", 2 * r + p, || condition("True")).await;
        assert_eq!(judged.reason.as_deref(), Some("RenewalsSlow"), "{judged:?}");
        let leases: kube::Api<leasehold::api::DistributedLease> = s.api();
        let shown = wait_for(
            "the DistributedLease's TimingAtRisk True, naming the leader",
            SUCCESSOR,
            || async {
                let status = leases.get(LEASE).await.ok()?.status?;
                status
                    .conditions
                    .into_iter()
                    .find(|c| c.type_ == "TimingAtRisk" && c.status == "True" && c.message.contains(&leader))
            },
        )
        .await;
        assert_eq!(shown.reason, "RenewalsSlow", "{shown:?}");
        let events = s.kubectl_ns(&[
            "get",
            "events",
            "--field-selector",
            &format!("involvedObject.name={leader},reason=TimingAtRisk,type=Warning"),
            "-o",
            "name",
        ]);
        assert!(!events.trim().is_empty(), "no Warning Event TimingAtRisk on {leader}");
        // Slow, not failing: the leader kept its lease throughout.
        assert_eq!(watcher.leaders(), std::slice::from_ref(&leader));
        proxy.set(ProxyMode::Forward);
        watcher.finish();
    })
    .await;
}
