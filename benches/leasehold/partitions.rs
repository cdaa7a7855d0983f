//! Work partitioning: N = 64 partitions over M = 3 `leasehold sidecar
//! --partitions 64` processes on the emulator, a private PostgreSQL server or
//! a private Redis server (D/R/P of `support`), read
//! through each one's `/partitions`. Per repetition: kill -9 one → time until
//! all 64 have an owner again and the balance (max − min) then; start a 4th
//! process (3 members again) → partitions that changed owner, against the
//! fewest possible (the newcomer's share: any fewer and it would be short),
//! and time until the shares differ by at most one.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use leasehold::store::spanner::SpannerConfig;
use leasehold::testing::servers::{PostgresServer, RedisServer};
use leasehold::testing::{Emulator, TcpProxy};

use super::sessions::Backend;
use super::{summary, support::*};

const N: u32 = 64;

/// Partition → index of the sidecar publishing it, among those answering.
fn owners(sidecars: &[&Sidecar]) -> BTreeMap<u32, usize> {
    let mut owners = BTreeMap::new();
    for (i, s) in sidecars.iter().enumerate() {
        let Ok((_, view)) = get(s.http, "/partitions") else {
            continue;
        };
        for p in view["partitions"].as_array().cloned().unwrap_or_default() {
            owners.insert(p["index"].as_u64().unwrap_or_default() as u32, i);
        }
    }
    owners
}

fn shares(owners: &BTreeMap<u32, usize>, members: usize) -> Vec<usize> {
    (0..members)
        .map(|m| owners.values().filter(|o| **o == m).count())
        .collect()
}

fn spread(shares: &[usize]) -> usize {
    shares.iter().max().unwrap_or(&0) - shares.iter().min().unwrap_or(&0)
}

/// Polls until `done` holds; the owners then and the time it took.
fn until(
    sidecars: &[&Sidecar],
    within: Duration,
    done: impl Fn(&BTreeMap<u32, usize>) -> bool,
) -> Option<(Duration, BTreeMap<u32, usize>)> {
    let started = Instant::now();
    while started.elapsed() < within {
        let owners = owners(sidecars);
        if done(&owners) {
            return Some((started.elapsed(), owners));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    None
}

/// The store the sidecars share, and a runtime for their proxies (the
/// clusters part starts its sidecars here too).
pub(super) struct Place {
    runtime: tokio::runtime::Runtime,
    store: Store,
}

enum Store {
    Spanner(Emulator, SpannerConfig),
    Postgres(PostgresServer),
    Redis(RedisServer),
}

impl Place {
    pub(super) fn new(backend: Backend) -> Place {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let store = match backend {
            Backend::Spanner => {
                let emulator = Emulator::start_or_connect();
                let (config, _) = runtime.block_on(lease_database(&emulator));
                Store::Spanner(emulator, config)
            }
            Backend::Postgres => Store::Postgres(PostgresServer::start()),
            Backend::Redis => Store::Redis(RedisServer::start()),
        };
        Place { runtime, store }
    }

    /// A sidecar reaching the store through a proxy of its own.
    pub(super) fn launch(&self, name: &str, lock: &str, extra: &[String]) -> Sidecar {
        let target = match &self.store {
            Store::Spanner(emulator, _) => emulator.host.parse().unwrap(),
            Store::Postgres(server) => server.addr(),
            Store::Redis(server) => server.addr(),
        };
        let proxy = self.runtime.block_on(TcpProxy::start(target));
        let url_store = |kind: &str, url: String| vec!["--store".to_string(), kind.into(), "--store-url".into(), url];
        let store = match &self.store {
            Store::Spanner(emulator, config) => return Sidecar::start(name, emulator, config, proxy, lock, extra),
            Store::Postgres(server) => url_store("postgres", server.url_at(proxy.addr)),
            Store::Redis(server) => url_store("redis", server.url_at(proxy.addr)),
        };
        Sidecar::launch(name, proxy, lock, &store, &[], extra)
    }
}

pub fn partitions(backend: Backend, reps: u64) -> Vec<String> {
    let extra = |_| vec!["--partitions".to_string(), N.to_string(), "--create-table".into()];
    let (mut takeovers, mut joins) = (Vec::new(), Vec::new());
    let (mut spreads, mut moved) = (Vec::new(), Vec::new());
    let place = Place::new(backend);
    for rep in 0..reps {
        let lock = format!("bench-parts-{rep}");
        let mut sidecars: Vec<Sidecar> = (0..3)
            .map(|i| place.launch(&format!("pod-{i}"), &lock, &extra(i)))
            .collect();
        let all: Vec<&Sidecar> = sidecars.iter().collect();
        let balanced =
            |members: usize| move |o: &BTreeMap<u32, usize>| o.len() == N as usize && spread(&shares(o, members)) <= 1;
        if until(&all, Duration::from_secs(120), balanced(3)).is_none() {
            println!("rep {rep}: never balanced over 3; skipped");
            continue;
        }
        sidecars[0].signal("KILL");
        let rest: Vec<&Sidecar> = sidecars[1..].iter().collect();
        let Some((takeover, owned)) = until(&rest, Duration::from_secs(60), |o| o.len() == N as usize) else {
            println!("rep {rep}: its partitions not taken over within 60 s");
            continue;
        };
        let after_kill = spread(&shares(&owned, 2));
        let Some((_, before)) = until(&rest, Duration::from_secs(30), balanced(2)) else {
            println!("rep {rep}: never balanced over 2");
            continue;
        };
        sidecars.push(place.launch("pod-3", &lock, &extra(3)));
        let four: Vec<&Sidecar> = sidecars[1..].iter().collect();
        let Some((join, after)) = until(&four, Duration::from_secs(60), balanced(3)) else {
            println!("rep {rep}: never balanced after the join");
            continue;
        };
        let changed = (0..N).filter(|i| before.get(i) != after.get(i)).count();
        let needed = shares(&after, 3)[2];
        println!(
            "rep {rep}: takeover {:.0} ms (max−min then {after_kill}); join: {changed} moved ({needed} needed), balanced in {:.0} ms",
            takeover.as_secs_f64() * 1000.0,
            join.as_secs_f64() * 1000.0
        );
        takeovers.push(takeover);
        spreads.push(after_kill);
        joins.push(join);
        moved.push((changed, needed));
    }
    if takeovers.is_empty() {
        return vec!["no repetition completed".into()];
    }
    spreads.sort();
    moved.sort();
    vec![
        format!("kill -9 takeover of all {N}: {}", summary(&mut takeovers)),
        format!("max−min when all were owned again: {spreads:?}"),
        format!("a 4th joins: partitions (moved, needed) {moved:?}"),
        format!("a 4th joins, time to balance: {}", summary(&mut joins)),
    ]
}
