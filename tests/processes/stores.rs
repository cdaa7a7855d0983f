//! Whole processes on PostgreSQL and Redis: three `leasehold sidecar`
//! processes on one private server, each reaching it through a TCP proxy;
//! kill -9 of the leader and a graceful handover, timed, and a leader
//! paused past its lease (SIGSTOP) resuming as a follower.
//!
//! Bounds: [`failover_bound`] after kill -9; a handover within the drain, one
//! poll P·(1 + J) and the same [`MARGIN`].

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::support::*;
use leasehold::lease::timing::DEFAULT_JITTER;
use leasehold::testing::TcpProxy;
use leasehold::testing::servers::{PostgresServer, RedisServer};

/// Three sidecars on the server at `target`; `store(i, proxy)` gives sidecar
/// i's store flags and environment for its proxy's address.
fn sidecars(
    target: SocketAddr,
    lock: &str,
    store: impl Fn(usize, SocketAddr) -> (Vec<String>, Vec<(String, String)>),
) -> (tokio::runtime::Runtime, Vec<Sidecar>) {
    let runtime = proxy_runtime();
    let proxies: Vec<TcpProxy> = runtime.block_on(async {
        let mut proxies = Vec::new();
        for _ in 0..3 {
            proxies.push(TcpProxy::start(target).await);
        }
        proxies
    });
    let sidecars = proxies
        .into_iter()
        .enumerate()
        .map(|(i, proxy)| {
            let (flags, env) = store(i, proxy.addr);
            Sidecar::launch(&format!("pod-{i}"), proxy, lock, &flags, &env, &[])
        })
        .collect();
    (runtime, sidecars)
}

/// The folder of URL files, removed on drop.
struct UrlFiles(std::path::PathBuf);

impl Drop for UrlFiles {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Flags for PostgreSQL: the first sidecar creates the table; the URL comes
/// from a file, as from a mounted Secret.
fn postgres_sidecars(server: &PostgresServer) -> (tokio::runtime::Runtime, Vec<Sidecar>, UrlFiles) {
    let dir = std::env::temp_dir().join(format!("leasehold-urls-{:08x}", rand::random::<u32>()));
    std::fs::create_dir_all(&dir).unwrap();
    let (runtime, sidecars) = sidecars(server.addr(), "pg-lock", |i, proxy| {
        let file = dir.join(format!("url-{i}"));
        std::fs::write(&file, server.url_at(proxy)).unwrap();
        let mut flags = vec![
            "--store".to_string(),
            "postgres".to_string(),
            "--store-url-file".to_string(),
            file.display().to_string(),
        ];
        if i == 0 {
            flags.push("--create-table".into());
        }
        (flags, Vec::new())
    });
    (runtime, sidecars, UrlFiles(dir))
}

/// Flags for Redis: the URL from the environment.
fn redis_sidecars(server: &RedisServer) -> (tokio::runtime::Runtime, Vec<Sidecar>) {
    sidecars(server.addr(), "redis-lock", |_, proxy| {
        (
            vec!["--store".to_string(), "redis".to_string()],
            vec![("LEASEHOLD_STORE_URL".to_string(), server.url_at(proxy))],
        )
    })
}

fn kill_9_fails_over(sidecars: &[Sidecar], store: &str) {
    let all: Vec<&Sidecar> = sidecars.iter().collect();
    let first = wait_for_one_leader(&all, Duration::from_secs(20)).expect("a first leader");
    let (_, before) = sidecars[first].leader();
    // Let a few renewals happen, so the failover starts from a renewed lease.
    std::thread::sleep(P * 3);
    assert!(sidecars[first].leads(), "the first leader keeps leading");
    sidecars[first].signal("KILL");
    let killed = Instant::now();
    let rest = others(sidecars, first);
    let bound = failover_bound();
    let next = wait_for_one_leader(&rest, bound)
        .unwrap_or_else(|| panic!("{store}: no new leader within D + P·(1 + J) + margin = {bound:?}"));
    let failover = killed.elapsed();
    let (_, after) = rest[next].leader();
    assert!(after["term"].as_u64() > before["term"].as_u64());
    assert!(token_of(&after).parse::<i64>().unwrap() > token_of(&before).parse::<i64>().unwrap());
    println!("{store} crash failover: {failover:?} (D={D:?}, P={P:?})");
}

fn sigterm_hands_over(sidecars: &[Sidecar], store: &str) {
    let all: Vec<&Sidecar> = sidecars.iter().collect();
    let first = wait_for_one_leader(&all, Duration::from_secs(20)).expect("a first leader");
    sidecars[first].signal("TERM");
    let termed = Instant::now();
    let rest = others(sidecars, first);
    // Released after the drain, so found at the next poll, well before D.
    let bound = DRAIN + P.mul_f64(1.0 + DEFAULT_JITTER) + MARGIN;
    let next = wait_for_one_leader(&rest, bound);
    let handover = termed.elapsed();
    assert!(
        next.is_some(),
        "{store}: no new leader within drain + P·(1 + J) + margin = {bound:?}"
    );
    println!("{store} graceful handover: {handover:?} (drain={DRAIN:?}, P={P:?}, D={D:?})");
}

/// S1: a leader stopped past D resumes as a follower, never with its old token.
fn a_paused_leader_resumes_as_a_follower(sidecars: &[Sidecar], store: &str) {
    let all: Vec<&Sidecar> = sidecars.iter().collect();
    let first = wait_for_one_leader(&all, Duration::from_secs(20)).expect("a first leader");
    let paused = &sidecars[first];
    let (_, before) = paused.leader();
    paused.signal("STOP");
    let rest = others(sidecars, first);
    let next = wait_for_one_leader(&rest, failover_bound()).unwrap_or_else(|| panic!("{store}: nobody took over"));
    let (_, usurper) = rest[next].leader();
    paused.signal("CONT");
    for _ in 0..20 {
        let (status, view) = paused.leader();
        assert_eq!(status, 503, "{store}: the resumed sidecar claims leadership: {view}");
        std::thread::sleep(Duration::from_millis(25));
    }
    let (_, resumed) = paused.leader();
    assert_ne!(token_of(&resumed), token_of(&before), "{store}: {resumed}");
    assert_eq!(resumed["holder"], usurper["holder"]);
    assert!(rest[next].leads(), "{store}: the new leader keeps leading");
}

#[test]
fn postgres_a_paused_leader_resumes_as_a_follower() {
    let server = PostgresServer::start();
    let (_runtime, sidecars, _urls) = postgres_sidecars(&server);
    a_paused_leader_resumes_as_a_follower(&sidecars, "postgres");
}

#[test]
fn redis_a_paused_leader_resumes_as_a_follower() {
    let server = RedisServer::start();
    let (_runtime, sidecars) = redis_sidecars(&server);
    a_paused_leader_resumes_as_a_follower(&sidecars, "redis");
}

#[test]
fn postgres_kill_9_of_the_leader_fails_over_within_d_plus_p() {
    let server = PostgresServer::start();
    let (_runtime, sidecars, _urls) = postgres_sidecars(&server);
    kill_9_fails_over(&sidecars, "postgres");
}

#[test]
fn postgres_sigterm_releases_and_a_follower_leads_before_expiry() {
    let server = PostgresServer::start();
    let (_runtime, sidecars, _urls) = postgres_sidecars(&server);
    sigterm_hands_over(&sidecars, "postgres");
}

#[test]
fn redis_kill_9_of_the_leader_fails_over_within_d_plus_p() {
    let server = RedisServer::start();
    let (_runtime, sidecars) = redis_sidecars(&server);
    kill_9_fails_over(&sidecars, "redis");
}

#[test]
fn redis_sigterm_releases_and_a_follower_leads_before_expiry() {
    let server = RedisServer::start();
    let (_runtime, sidecars) = redis_sidecars(&server);
    sigterm_hands_over(&sidecars, "redis");
}

/// Issue 25: a sidecar killed and started again with the same pod UID (as
/// the kubelet restarts its container) leads again at once: it takes its
/// own pod's lease over, for a new term with a higher token, instead of
/// waiting for the lease (D = 60 s here) to expire. A new pod of the same
/// name (a StatefulSet's, another UID) is another holder: it stays a
/// follower of the live lease.
#[test]
fn redis_a_restarted_sidecar_resumes_its_own_pods_lease_at_once() {
    let server = RedisServer::start();
    let runtime = proxy_runtime();
    let proxy = runtime.block_on(TcpProxy::start(server.addr()));
    let store = vec!["--store".to_string(), "redis".to_string()];
    let env = vec![("LEASEHOLD_STORE_URL".to_string(), server.url_at(proxy.addr))];
    let start = |uid: &str| {
        let flags: Vec<String> = ["--pod-uid", uid, "--lease-duration", "60s", "--renew-deadline", "40s"]
            .map(String::from)
            .to_vec();
        Sidecar::launch("pod-0", proxy.clone(), "resume", &store, &env, &flags)
    };
    let mut earlier = start("uid-a");
    wait_for_one_leader(&[&earlier], Duration::from_secs(20)).expect("the first process leads");
    let (_, before) = earlier.leader();
    earlier.signal("KILL");
    earlier.expect_gone(Duration::from_secs(5));

    let mut restarted = start("uid-a");
    // Far below D: only a takeover leads this soon.
    wait_for_one_leader(&[&restarted], Duration::from_secs(20))
        .expect("the restarted process leads again long before the lease could expire");
    let (_, after) = restarted.leader();
    assert_eq!(
        after["term"].as_u64(),
        before["term"].as_u64().map(|t| t + 1),
        "a new term: {after}"
    );
    assert!(
        token_of(&after).parse::<i64>().unwrap() > token_of(&before).parse::<i64>().unwrap(),
        "a higher token: {after} after {before}"
    );
    let holder = after["holder"].as_str().unwrap().to_string();
    assert!(holder.starts_with("pod-0#") && holder.ends_with("@uid-a"), "{holder}");
    assert_ne!(after["holder"], before["holder"], "another process run");
    restarted.signal("KILL");
    restarted.expect_gone(Duration::from_secs(5));

    let other_pod = start("uid-b");
    let started = Instant::now();
    while other_pod.leader().1["holder"] != after["holder"] {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the new pod never saw the live lease"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    for _ in 0..10 {
        let (status, view) = other_pod.leader();
        assert_eq!(status, 503, "a pod of another UID must wait for the lease: {view}");
        std::thread::sleep(P);
    }
}
