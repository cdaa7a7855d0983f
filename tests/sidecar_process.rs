//! Whole processes: three `leasehold sidecar` processes on one Cloud Spanner
//! emulator, each reaching it through a TCP proxy the test controls, with the
//! HTTP API checked in every phase.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use leasehold::lease::LeaseStore;
use leasehold::store::spanner::{DEFAULT_CALL_TIMEOUT, SpannerConfig, SpannerStore};
use leasehold::testing::{Emulator, ProxyMode, TcpProxy, free_port};
use serde_json::Value;

const D: Duration = Duration::from_millis(2000);
const R: Duration = Duration::from_millis(1500);
const P: Duration = Duration::from_millis(300);
const DRAIN: Duration = Duration::from_millis(200);

/// A plain HTTP/1.1 GET: (status, JSON body); None when nothing answers.
fn get(port: u16, path: &str) -> Option<(u16, Value)> {
    let mut stream = TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(500)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let status = response.split(' ').nth(1)?.parse().ok()?;
    let body = response.split("\r\n\r\n").nth(1).unwrap_or_default();
    Some((status, serde_json::from_str(body).unwrap_or(Value::Null)))
}

struct Sidecar {
    name: String,
    http: u16,
    proxy: TcpProxy,
    child: Child,
}

impl Sidecar {
    fn start(name: &str, emulator: &Emulator, config: &SpannerConfig, proxy: TcpProxy, lock: &str) -> Sidecar {
        let http = free_port();
        let child = Command::new(env!("CARGO_BIN_EXE_leasehold"))
            .args([
                "sidecar",
                "--lock",
                lock,
                "--database",
                &config.database,
                "--table",
                &config.table,
            ])
            .args([
                "--lease-duration",
                "2s",
                "--renew-deadline",
                "1500ms",
                "--retry-period",
                "300ms",
                "--drain",
                "200ms",
            ])
            .args(["--pod-name", name, "--kubernetes", "false"])
            .args([
                "--http-addr",
                &format!("127.0.0.1:{http}"),
                "--metrics-addr",
                &format!("127.0.0.1:{}", free_port()),
            ])
            .env("SPANNER_EMULATOR_HOST", proxy.addr.to_string())
            .env("SPANNER_EMULATOR_REST", &emulator.rest)
            .env("LEASEHOLD_LOG", "warn")
            .stdin(Stdio::null())
            .spawn()
            .expect("leasehold sidecar starts");
        Sidecar {
            name: name.to_string(),
            http,
            proxy,
            child,
        }
    }

    fn leader(&self) -> Option<(u16, Value)> {
        get(self.http, "/leader")
    }

    fn leads(&self) -> bool {
        self.leader().is_some_and(|(status, _)| status == 200)
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill -{signal} {}", self.name);
    }
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Polls until exactly one of `sidecars` serves 200 on /leader; returns its index.
fn wait_for_one_leader(sidecars: &[&Sidecar], within: Duration) -> Option<usize> {
    let started = Instant::now();
    while started.elapsed() < within {
        let leaders: Vec<usize> = (0..sidecars.len()).filter(|&i| sidecars[i].leads()).collect();
        assert!(
            leaders.len() <= 1,
            "two sidecars serve 200 on /leader at once: {leaders:?}"
        );
        if let [one] = leaders.as_slice() {
            return Some(*one);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

struct Cluster {
    emulator: Emulator,
    config: SpannerConfig,
    sidecars: Vec<Sidecar>,
    _runtime: tokio::runtime::Runtime,
}

fn cluster(lock: &str) -> Cluster {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let emulator = Emulator::start_or_connect();
    let (config, proxies) = runtime.block_on(async {
        let config = emulator.create_database("leasehold_leases").await;
        let store = SpannerStore::connect_to(config.clone(), emulator.endpoints(), DEFAULT_CALL_TIMEOUT)
            .await
            .unwrap();
        store.ensure_schema().await.unwrap();
        let mut proxies = Vec::new();
        for _ in 0..3 {
            proxies.push(TcpProxy::start(emulator.host.parse().unwrap()).await);
        }
        (config, proxies)
    });
    let sidecars = proxies
        .into_iter()
        .enumerate()
        .map(|(i, proxy)| Sidecar::start(&format!("pod-{i}"), &emulator, &config, proxy, lock))
        .collect();
    Cluster {
        emulator,
        config,
        sidecars,
        _runtime: runtime,
    }
}

fn others(sidecars: &[Sidecar], except: usize) -> Vec<&Sidecar> {
    sidecars
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != except)
        .map(|(_, s)| s)
        .collect()
}

fn token_of(view: &Value) -> String {
    view["token"].as_str().unwrap_or_default().to_string()
}

#[test]
fn kill_9_of_the_leader_fails_over_within_d_plus_p() {
    let cluster = cluster("kill");
    let all: Vec<&Sidecar> = cluster.sidecars.iter().collect();
    let first = wait_for_one_leader(&all, Duration::from_secs(20)).expect("a first leader");
    let (_, before) = cluster.sidecars[first].leader().unwrap();
    for (i, s) in cluster.sidecars.iter().enumerate().filter(|(i, _)| *i != first) {
        // A follower that lost the first race reports the holder at its next observation.
        let started = Instant::now();
        let view = loop {
            let (status, view) = s.leader().unwrap();
            assert_eq!(status, 503, "follower {i}");
            if view["holder"] == before["holder"] || started.elapsed() > P * 4 {
                break view;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        assert_eq!(view["holder"], before["holder"], "follower {i} reports the leader");
    }
    cluster.sidecars[first].signal("KILL");
    let killed = Instant::now();
    let rest = others(&cluster.sidecars, first);
    let next = wait_for_one_leader(&rest, D + P).unwrap_or_else(|| panic!("no new leader within D + P = {:?}", D + P));
    let failover = killed.elapsed();
    let (_, after) = rest[next].leader().unwrap();
    assert!(after["term"].as_u64() > before["term"].as_u64());
    assert!(token_of(&after).parse::<i64>().unwrap() > token_of(&before).parse::<i64>().unwrap());
    println!("crash failover: {failover:?} (D={D:?}, P={P:?})");
    drop(cluster.config);
    drop(cluster.emulator);
}

#[test]
fn a_leader_paused_past_d_never_serves_its_old_token_after_resuming() {
    let cluster = cluster("pause");
    let all: Vec<&Sidecar> = cluster.sidecars.iter().collect();
    let first = wait_for_one_leader(&all, Duration::from_secs(20)).expect("a first leader");
    let paused = &cluster.sidecars[first];
    let (_, before) = paused.leader().unwrap();
    paused.signal("STOP");
    let rest = others(&cluster.sidecars, first);
    let next = wait_for_one_leader(&rest, D + P + Duration::from_secs(1)).expect("another leads while it is stopped");
    let (_, usurper) = rest[next].leader().unwrap();
    std::thread::sleep(D.saturating_sub(Duration::from_millis(500)));
    paused.signal("CONT");
    // At once after resuming: never 200, and never with the old token.
    for _ in 0..20 {
        let (status, view) = paused.leader().expect("the resumed sidecar answers");
        assert_eq!(status, 503, "the resumed sidecar claims leadership: {view}");
        assert_eq!(view["leader"], false);
        std::thread::sleep(Duration::from_millis(25));
    }
    let (_, resumed) = paused.leader().unwrap();
    assert_ne!(
        token_of(&resumed),
        token_of(&before),
        "the resumed sidecar shows the new term: {resumed}"
    );
    assert_eq!(resumed["holder"], usurper["holder"]);
    assert!(rest[next].leads(), "the new leader keeps leading");
}

#[test]
fn a_leader_cut_off_from_the_store_reports_follower_by_r() {
    let cluster = cluster("cut");
    let all: Vec<&Sidecar> = cluster.sidecars.iter().collect();
    let first = wait_for_one_leader(&all, Duration::from_secs(20)).expect("a first leader");
    let leader = &cluster.sidecars[first];
    leader.proxy.set(ProxyMode::Cut);
    let cut = Instant::now();
    while leader.leads() {
        assert!(
            cut.elapsed() <= R + Duration::from_millis(250),
            "still claiming {:?} after the cut (R = {R:?})",
            cut.elapsed()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    println!("stopped claiming {:?} after the cut (R={R:?})", cut.elapsed());
    let rest = others(&cluster.sidecars, first);
    wait_for_one_leader(&rest, D + P + Duration::from_secs(1)).expect("another leads");
    assert!(!leader.leads());
}

#[test]
fn sigterm_releases_and_a_follower_leads_without_waiting_for_expiry() {
    let mut cluster = cluster("term");
    let all: Vec<&Sidecar> = cluster.sidecars.iter().collect();
    let first = wait_for_one_leader(&all, Duration::from_secs(20)).expect("a first leader");
    cluster.sidecars[first].signal("TERM");
    let termed = Instant::now();
    let rest = others(&cluster.sidecars, first);
    // Released, so well before the lease would have expired (D).
    let next = wait_for_one_leader(&rest, DRAIN + P + Duration::from_millis(700));
    let handover = termed.elapsed();
    assert!(next.is_some(), "no new leader within drain + P + 0.7 s");
    println!("graceful handover: {handover:?} (drain={DRAIN:?}, P={P:?}, D={D:?})");
    let status = cluster.sidecars[first].child.wait().unwrap();
    assert!(status.success(), "SIGTERM exits 0: {status}");
}
