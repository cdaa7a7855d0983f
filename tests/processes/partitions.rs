//! Whole processes, partitioned: three `leasehold sidecar --partitions 8`
//! processes on one Cloud Spanner emulator, one PostgreSQL or one Redis
//! server share the lock's partitions, checked through each one's
//! `/partitions` (docs/partitions.md).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::support::*;
use leasehold::testing::TcpProxy;
use leasehold::testing::servers::{PostgresServer, RedisServer};
use serde_json::Value;

const N: u32 = 8;

/// Allowance on top of the single-lock failover bound for batches lost to
/// the store. The emulator runs one read-write transaction per database at a
/// time and cuts the others short ("Transaction not found", "Invalid
/// transaction ID"), so a batch taking partitions often loses to the
/// sessions' renewals, several times in a row on a loaded machine
/// (BENCHMARKS.md); each loss costs one more poll. Measured on a shared
/// two-core machine: takeovers of 2.5 to over 4.4 s with D = 2 s, P = 300 ms,
/// so this is a liveness check (the partitions do move, by expiry, once),
/// not the D + P target, which the benchmark measures.
fn emulator_allowance() -> Duration {
    2 * D
}

/// The partitions `sidecar` publishes, with their tokens; panics when it
/// does not answer (a dead sidecar publishes nothing, but holds nothing
/// either only once its sessions expired).
fn held(sidecar: &Sidecar) -> BTreeMap<u32, u128> {
    let (status, view) = get(sidecar.http, "/partitions")
        .unwrap_or_else(|e| panic!("{}: GET /partitions got no answer: {e}", sidecar.name));
    let partitions = view["partitions"].as_array().cloned().unwrap_or_default();
    assert_eq!(
        status == 200,
        !partitions.is_empty(),
        "200 exactly while holding any: {status} {view}"
    );
    partitions
        .iter()
        .map(|p: &Value| {
            let index = p["index"].as_u64().unwrap() as u32;
            (index, p["token"].as_str().unwrap().parse().unwrap())
        })
        .collect()
}

/// One poll of every sidecar; checks no partition is
/// published by two of them.
fn poll(sidecars: &[&Sidecar]) -> Vec<BTreeMap<u32, u128>> {
    let shares: Vec<BTreeMap<u32, u128>> = sidecars.iter().map(|s| held(s)).collect();
    let mut owners = BTreeMap::new();
    for (i, share) in shares.iter().enumerate() {
        for index in share.keys() {
            if let Some(other) = owners.insert(*index, i) {
                panic!("partition {index} is published by sidecars {other} and {i} at once: {shares:?}");
            }
        }
    }
    shares
}

/// Polls until `sidecars` hold all N partitions between them with shares
/// that differ by at most one; returns the shares, or `None` after `within`.
fn wait_for_balance(sidecars: &[&Sidecar], within: Duration) -> Option<Vec<BTreeMap<u32, u128>>> {
    let started = Instant::now();
    while started.elapsed() < within {
        let shares = poll(sidecars);
        let sizes: Vec<usize> = shares.iter().map(BTreeMap::len).collect();
        let (min, max) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
        if sizes.iter().sum::<usize>() == N as usize && max - min <= 1 {
            return Some(shares);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// Three sidecars share the N partitions (2, 3, 3); kill -9 of the one
/// holding most: the other two hold all of them (4, 4) within `bound`, the
/// moved ones with higher tokens, the kept ones with theirs.
fn a_killed_ones_shares_move(sidecars: &[Sidecar], bound: Duration) {
    let all: Vec<&Sidecar> = sidecars.iter().collect();
    let before = wait_for_balance(&all, Duration::from_secs(60)).expect("8 partitions shared by 3");
    let mut sizes: Vec<usize> = before.iter().map(BTreeMap::len).collect();
    sizes.sort();
    assert_eq!(sizes, [2, 3, 3], "{before:?}");
    let (_, view) = get(all[0].http, "/partitions").unwrap();
    assert_eq!(
        (view["count"].as_u64(), view["members"].as_u64()),
        (Some(8), Some(3)),
        "{view}"
    );
    let (status, _) = get(all[0].http, "/leader").unwrap();
    assert_eq!(status, 409, "/leader does not name a leader of a partitioned lock");
    // Issue 38: the session's renewals count against R - P as a lease's do,
    // so LeaseholdTimingAtRisk covers partitioned sidecars too.
    let (_, metrics) = get_text(all[0].metrics, "/metrics").unwrap();
    assert!(metrics.contains("leasehold_renew_budget_used"), "{metrics}");

    let victim = (0..3).max_by_key(|i| before[*i].len()).unwrap();
    sidecars[victim].signal("KILL");
    let killed = Instant::now();
    let rest = others(sidecars, victim);
    let after =
        wait_for_balance(&rest, bound).unwrap_or_else(|| panic!("its partitions had no new owners within {bound:?}"));
    let failover = killed.elapsed();
    assert_eq!(after.iter().map(BTreeMap::len).collect::<Vec<_>>(), [4, 4]);
    let survivors: Vec<usize> = (0..3).filter(|i| *i != victim).collect();
    for (share, i) in after.iter().zip(&survivors) {
        for (index, token) in share {
            match before[*i].get(index) {
                Some(kept) => assert_eq!(token, kept, "partition {index} stayed with sidecar {i}"),
                None => {
                    let old = before[victim][index];
                    assert!(
                        *token > old,
                        "partition {index} moved with a higher token: {old} -> {token}"
                    );
                }
            }
        }
    }
    println!("partitions of a killed sidecar taken over in {failover:?} (D={D:?}, P={P:?})");
}

#[test]
fn three_sidecars_share_eight_partitions_and_a_killed_ones_shares_move_within_the_failover_bound() {
    let cluster = cluster_with("parts-kill", |_| {
        vec!["--partitions".into(), N.to_string(), "--create-table".into()]
    });
    a_killed_ones_shares_move(&cluster.sidecars, failover_bound() + emulator_allowance());
}

/// Three partitioned sidecars on a private server at `target`, each through
/// a proxy of its own; `store` gives the store flags for a proxy's address.
fn partitioned_sidecars(
    target: SocketAddr,
    store: impl Fn(SocketAddr) -> Vec<String>,
) -> (tokio::runtime::Runtime, Vec<Sidecar>) {
    // The proxies' tasks run on it: a worker thread of its own.
    let runtime = proxy_runtime();
    let extra = ["--partitions".to_string(), N.to_string(), "--create-table".into()];
    let sidecars = (0..3)
        .map(|i| {
            let proxy = runtime.block_on(TcpProxy::start(target));
            let flags = store(proxy.addr);
            Sidecar::launch(&format!("pod-{i}"), proxy, "parts-kill", &flags, &[], &extra)
        })
        .collect();
    (runtime, sidecars)
}

/// Issue 28: partitions on PostgreSQL, whose batches do not lose to
/// renewals as the emulator's do: the single-lock failover bound, no
/// allowance.
#[test]
fn a_killed_ones_partitions_move_within_the_failover_bound_on_postgres() {
    let server = PostgresServer::start();
    let (_runtime, sidecars) = partitioned_sidecars(server.addr(), |proxy| {
        vec![
            "--store".into(),
            "postgres".into(),
            "--store-url".into(),
            server.url_at(proxy),
        ]
    });
    a_killed_ones_shares_move(&sidecars, failover_bound());
}

/// Issue 28: the same on Redis.
#[test]
fn a_killed_ones_partitions_move_within_the_failover_bound_on_redis() {
    let server = RedisServer::start();
    let (_runtime, sidecars) = partitioned_sidecars(server.addr(), |proxy| {
        vec![
            "--store".into(),
            "redis".into(),
            "--store-url".into(),
            server.url_at(proxy),
        ]
    });
    a_killed_ones_shares_move(&sidecars, failover_bound());
}

/// Issue 37 item 4: a partitioned lock shared by two clusters spreads over
/// the members of both (membership is in the store, so a candidate's
/// cluster makes no difference), even where the pod names are the same in
/// each (StatefulSets): four sidecars on one PostgreSQL server, `pod-0` and
/// `pod-1` in cluster `west` and in cluster `east`, two partitions each,
/// every session naming its cluster. Then all of `west` goes: `east` holds
/// all eight within the failover bound, the moved ones under higher tokens.
#[test]
fn partitions_spread_over_the_members_of_both_clusters_and_move_across_when_one_goes() {
    let server = PostgresServer::start();
    let runtime = proxy_runtime();
    let sidecars: Vec<Sidecar> = ["west", "east"]
        .into_iter()
        .flat_map(|cluster| (0..2).map(move |i| (cluster, format!("pod-{i}"))))
        .map(|(cluster, pod)| {
            let proxy = runtime.block_on(TcpProxy::start(server.addr()));
            let store = [
                "--store".into(),
                "postgres".into(),
                "--store-url".into(),
                server.url_at(proxy.addr),
            ];
            let extra = [
                "--partitions".into(),
                N.to_string(),
                "--create-table".into(),
                "--cluster-name".into(),
                cluster.into(),
            ];
            Sidecar::launch(&pod, proxy, "parts-clusters", &store, &[], &extra)
        })
        .collect();
    let all: Vec<&Sidecar> = sidecars.iter().collect();
    // Balanced shares come first: a sidecar that took its two while it saw
    // three members says so until its next look, a poll later.
    let started = Instant::now();
    let before = loop {
        let shares = wait_for_balance(&all, Duration::from_secs(60)).expect("8 partitions shared by 4");
        let views: Vec<Value> = sidecars.iter().map(|s| get(s.http, "/partitions").unwrap().1).collect();
        if views.iter().all(|view| view["members"].as_u64() == Some(4)) {
            for ((sidecar, cluster), view) in sidecars.iter().zip(["west", "west", "east", "east"]).zip(&views) {
                let session = view["session"].as_str().unwrap_or_default();
                assert!(
                    session.starts_with(&format!("{cluster}/")),
                    "{}'s session names its cluster: {view}",
                    sidecar.name
                );
            }
            break shares;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "members of both clusters count: every sidecar sees 4 members within 60 s: {views:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(before.iter().map(BTreeMap::len).collect::<Vec<_>>(), [2, 2, 2, 2]);
    for west in &sidecars[..2] {
        west.signal("KILL");
    }
    let east: Vec<&Sidecar> = sidecars[2..].iter().collect();
    let after = wait_for_balance(&east, failover_bound())
        .unwrap_or_else(|| panic!("west's partitions had no owners in east within {:?}", failover_bound()));
    assert_eq!(after.iter().map(BTreeMap::len).collect::<Vec<_>>(), [4, 4]);
    for (share, kept) in after.iter().zip(&before[2..]) {
        for (index, token) in share {
            let old = before.iter().find_map(|b| b.get(index)).unwrap();
            match kept.get(index) {
                Some(kept) => assert_eq!(token, kept, "partition {index} stayed where it was"),
                None => assert!(
                    token > old,
                    "partition {index} moved with a higher token: {old} -> {token}"
                ),
            }
        }
    }
}

/// SIGTERM: the sidecar stops publishing its partitions at once, nobody
/// else publishes them during the drain (the release comes after it), the
/// others hold all of them before the session could have expired (so the
/// release freed them: the session renews through the drain, so an expiry
/// comes no sooner than drain + D; D is 4 s here to keep the two apart
/// under the emulator's lost batches), and it exits 0.
#[test]
fn sigterm_hands_the_partitions_over_after_the_drain() {
    let drain = Duration::from_millis(1500);
    let d = Duration::from_secs(4);
    let mut cluster = cluster_with("parts-term", |_| {
        vec![
            "--partitions".into(),
            N.to_string(),
            "--create-table".into(),
            "--drain".into(),
            format!("{}ms", drain.as_millis()),
            "--lease-duration".into(),
            format!("{}ms", d.as_millis()),
            "--renew-deadline".into(),
            "3s".into(),
        ]
    });
    let all: Vec<&Sidecar> = cluster.sidecars.iter().collect();
    let before = wait_for_balance(&all, Duration::from_secs(60)).expect("8 partitions shared by 3");
    let leaving = 0;
    let theirs = before[leaving].clone();
    cluster.sidecars[leaving].signal("TERM");
    let termed = Instant::now();
    let rest = others(&cluster.sidecars, leaving);
    let mut stopped_claiming = None;
    while termed.elapsed() < drain {
        // Asked only until it stops claiming: at the drain's end it
        // releases and exits.
        if stopped_claiming.is_none() && held(&cluster.sidecars[leaving]).is_empty() {
            stopped_claiming = Some(termed.elapsed());
        }
        for share in poll(&rest) {
            assert!(
                share.keys().all(|i| !theirs.contains_key(i)),
                "{share:?} holds one of {theirs:?} {:?} after SIGTERM, before the drain ({drain:?}) elapsed",
                termed.elapsed()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let stopped_claiming = stopped_claiming.expect("no partition published during the drain");
    assert!(
        stopped_claiming < drain / 2,
        "stops claiming first: {stopped_claiming:?}"
    );
    let after = wait_for_balance(&rest, d);
    let handover = termed.elapsed();
    let after = after.unwrap_or_else(|| panic!("the others hold every partition within drain + D = {:?}", drain + d));
    for (index, old) in &theirs {
        let token = after.iter().find_map(|s| s.get(index)).unwrap();
        assert!(token > old, "partition {index} moved with a higher token");
    }
    println!(
        "graceful partition handover: {handover:?} (drain={drain:?}, stopped claiming after {stopped_claiming:?})"
    );
    let status = cluster.sidecars[leaving].expect_gone(d);
    assert!(status.success(), "SIGTERM exits 0: {status}");
}
