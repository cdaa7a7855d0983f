//! Operating it on the real cluster: `leasehold status` (and as the kubectl
//! plugin) on a led lease and through a failover with `--watch`; a real
//! Prometheus scraping the sidecars and the operator through the chart's
//! monitors with the shipped alerting rules (tests/e2e/prometheus.rs): the
//! two-leader alert stays silent through a failover and fires on a planted
//! duplicate leader series, the no-leader alert fires with every candidate
//! gone, and the often-leaderless alert fires on a lease whose leaders are
//! frozen one after another.

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::DeleteParams;
use serde_json::{Value, json};

use crate::e2e::cluster::{Scenario, scenario, wait_for};
use crate::e2e::fixtures::{APP, FIRST_LEADER, LEASE, SIDECAR, SUCCESSOR, leader_only_service};
use crate::e2e::node::signal_container;
use crate::e2e::prometheus::{PROMETHEUS_WAIT, Prometheus, tempdir, write_atomically};

/// The sidecar's metrics port (the chart's sidecar.metricsPort).
const METRICS_PORT: u16 = 4041;

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

/// The alerts Prometheus has loaded, by name.
fn loaded_alerts(prometheus: &Prometheus) -> Vec<String> {
    let rules = prometheus.get("/api/v1/rules", &[]).expect("/api/v1/rules");
    rules["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap())
        .map(|r| r["name"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn prometheus_scraping_the_sidecars_alerts_on_no_leader_and_only_then() {
    scenario("e2e-monitoring", |s| async move {
        let prometheus = Prometheus::start(&s, "alerts");
        let (_store, watcher) = leader_only_service(&s, json!({})).await;
        let leader = watcher.one_leader(None, FIRST_LEADER).await;
        // Both through the chart's monitors: the sidecars by the PodMonitor,
        // the operator's two replicas by the ServiceMonitor.
        prometheus.sees(&s, 1, 3).await;
        prometheus.sees_operator(2).await;
        let loaded = loaded_alerts(&prometheus);
        let shipped: Vec<String> = prometheus.fors.iter().map(|(n, _)| n.clone()).collect();
        assert_eq!(loaded, shipped, "Prometheus evaluates every shipped alert");

        // A failover: the leader pod deleted, a follower takes over.
        let started = std::time::Instant::now();
        s.api::<Pod>()
            .delete(&leader, &DeleteParams::default())
            .await
            .expect("deleting the leader");
        let successor = watcher.one_leader(Some(&leader), SUCCESSOR).await;
        prometheus.sees(&s, 1, 3).await;
        let fired = prometheus.fired_within(&s.ns, "LeaseholdTwoLeaders", started.elapsed() + Duration::from_secs(5));
        assert!(
            fired.is_empty(),
            "LeaseholdTwoLeaders fired through the failover: {fired:?}"
        );

        // Planted: the leader's metrics scraped a second time as another
        // target, as two pods claiming the lock would show: the alert fires.
        let planted = std::time::Instant::now();
        plant_duplicate(&prometheus, &s, &successor).await;
        let alert = prometheus
            .fires_after(
                &s.ns,
                "LeaseholdTwoLeaders",
                (planted, "the planted duplicate"),
                PROMETHEUS_WAIT,
            )
            .await;
        assert_eq!(
            alert["value"].as_str().map(|v| v.parse::<f64>().unwrap()),
            Some(2.0),
            "{alert}"
        );
        write_atomically(&prometheus.dir.join("planted.json"), "[]");
        prometheus
            .resolves_after(
                &s.ns,
                "LeaseholdTwoLeaders",
                (std::time::Instant::now(), "the duplicate target removed"),
                PROMETHEUS_WAIT,
            )
            .await;

        // A leaderless window (every candidate scaled away).
        assert!(
            prometheus.firing(&s.ns, "LeaseholdNoLeader").is_none(),
            "no-leader firing while led"
        );
        let leaderless = std::time::Instant::now();
        s.kubectl_ns(&["scale", "deployment/scheduler", "--replicas=0"]);
        wait_for("every candidate gone", SUCCESSOR, || async {
            s.pods(APP).await.is_empty().then_some(())
        })
        .await;
        let alert = prometheus
            .fires_after(
                &s.ns,
                "LeaseholdNoLeader",
                (leaderless, "the scale to 0"),
                PROMETHEUS_WAIT,
            )
            .await;
        assert_eq!(alert["labels"]["severity"], "critical", "{alert}");
        // Candidates again: one leads and the alert resolves.
        let scaled_back = std::time::Instant::now();
        s.kubectl_ns(&["scale", "deployment/scheduler", "--replicas=3"]);
        watcher.one_leader(None, FIRST_LEADER).await;
        prometheus
            .resolves_after(
                &s.ns,
                "LeaseholdNoLeader",
                (scaled_back, "the scale back to 3"),
                PROMETHEUS_WAIT,
            )
            .await;
        watcher.finish();
    })
    .await;
}

/// `pod`'s sidecar scraped a second time as a target of the `planted` job,
/// labelled as the PodMonitor labels it.
async fn plant_duplicate(prometheus: &Prometheus, s: &Scenario, pod: &str) {
    let ip = wait_for(&format!("{pod}'s address"), FIRST_LEADER, || async {
        s.api::<Pod>().get(pod).await.ok()?.status?.pod_ip
    })
    .await;
    let targets = json!([{"targets": [format!("{ip}:{METRICS_PORT}")],
                          "labels": {"namespace": s.ns, "lease": LEASE, "pod": pod}}]);
    write_atomically(&prometheus.dir.join("planted.json"), &targets.to_string());
}

/// The lease's timing in [`a_lease_that_keeps_going_dark_alerts`]: a short
/// D, so each freeze leaves the lease leaderless for seconds, not the
/// example's 15 s (the scaled rule's window is 60 s).
const DARK_TIMING: (&str, &str, &str) = ("4s", "3s", "1s");
/// How long each new leader leads before its sidecar is frozen in turn.
const LED_BETWEEN: Duration = Duration::from_secs(2);

/// The leader's sidecar frozen (SIGSTOP) until another candidate leads,
/// then thawed, and the new leader frozen in turn: the lease is dark for
/// about D of every D + 2 s, never long enough for LeaseholdNoLeader,
/// and LeaseholdOftenLeaderless fires; once the loop stops, it resolves.
#[tokio::test]
async fn a_lease_that_keeps_going_dark_alerts() {
    scenario("e2e-monitoring-dark", |s| async move {
        let prometheus = Prometheus::start(&s, "dark");
        let (d, r, p) = DARK_TIMING;
        let timing = json!({"leaseDuration": d, "renewDeadline": r, "retryPeriod": p});
        let (_store, watcher) = leader_only_service(&s, timing).await;
        let mut leader = watcher.one_leader(None, FIRST_LEADER).await;
        prometheus.sees(&s, 1, 3).await;
        // The first election's leaderless seconds are dark too: the freezes
        // start once they no longer weigh (the alert neither pending nor
        // firing), so what fires is the freezes'.
        prometheus.quiet(&s.ns, "LeaseholdOftenLeaderless").await;

        let started = std::time::Instant::now();
        let mut freezes = 0;
        let alert = loop {
            signal_container(&s, &leader, SIDECAR, "STOP").await;
            let successor = watcher.one_leader(Some(&leader), SUCCESSOR).await;
            signal_container(&s, &leader, SIDECAR, "CONT").await;
            leader = successor;
            freezes += 1;
            if let Some(alert) = prometheus.firing(&s.ns, "LeaseholdOftenLeaderless") {
                break alert;
            }
            assert!(
                started.elapsed() < 2 * PROMETHEUS_WAIT,
                "LeaseholdOftenLeaderless: not firing within {:?} of freezes",
                2 * PROMETHEUS_WAIT
            );
            tokio::time::sleep(LED_BETWEEN).await;
        };
        let fired = started.elapsed();
        eprintln!(
            "LeaseholdOftenLeaderless fired {fired:?} after the first of {freezes} freezes (for: {:?}, D {d}): {alert}",
            prometheus.for_of("LeaseholdOftenLeaderless")
        );
        let dark = prometheus.fired_within(&s.ns, "LeaseholdNoLeader", fired + Duration::from_secs(5));
        assert!(
            dark.is_empty(),
            "no stretch was dark for LeaseholdNoLeader's `for`: {dark:?}"
        );

        // Led steadily again: the dark share falls out of the window.
        let steady = std::time::Instant::now();
        prometheus
            .resolves_after(
                &s.ns,
                "LeaseholdOftenLeaderless",
                (steady, "the last freeze"),
                PROMETHEUS_WAIT,
            )
            .await;
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
        let prometheus = Prometheus::start(&s, "timing");
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
        let slowed = std::time::Instant::now();
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
        // And the alert, from the leader's leasehold_renew_budget_used.
        let alert = prometheus
            .fires_after(
                &s.ns,
                "LeaseholdTimingAtRisk",
                (slowed, "the store slowed"),
                2 * PROMETHEUS_WAIT,
            )
            .await;
        assert_eq!(alert["labels"]["pod"], json!(leader), "{alert}");
        // Slow, not failing: the leader kept its lease throughout.
        assert_eq!(watcher.leaders(), std::slice::from_ref(&leader));
        proxy.set(ProxyMode::Forward);
        let healed = std::time::Instant::now();
        prometheus
            .resolves_after(
                &s.ns,
                "LeaseholdTimingAtRisk",
                (healed, "the store's latency came back"),
                2 * PROMETHEUS_WAIT,
            )
            .await;
        watcher.finish();
    })
    .await;
}
