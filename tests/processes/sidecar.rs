//! Whole processes: three `leasehold sidecar` processes on one Cloud Spanner
//! emulator, each reaching it through a TCP proxy the test controls, with the
//! HTTP API checked in every phase.

use std::time::{Duration, Instant};

use crate::support::*;
use leasehold::lease::LeaseStore;
use leasehold::testing::ProxyMode;

#[test]
fn kill_9_of_the_leader_fails_over_within_d_plus_p() {
    let cluster = cluster("kill");
    let all: Vec<&Sidecar> = cluster.sidecars.iter().collect();
    let first = wait_for_one_leader(&all, Duration::from_secs(20)).expect("a first leader");
    let (_, before) = cluster.sidecars[first].leader();
    for (i, s) in cluster.sidecars.iter().enumerate().filter(|(i, _)| *i != first) {
        // A follower that lost the first race reports the holder at its next observation.
        let started = Instant::now();
        let view = loop {
            let (status, view) = s.leader();
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
    let bound = failover_bound();
    let next = wait_for_one_leader(&rest, bound)
        .unwrap_or_else(|| panic!("no new leader within D + P·(1 + J) + margin = {bound:?}"));
    let failover = killed.elapsed();
    let (_, after) = rest[next].leader();
    assert!(after["term"].as_u64() > before["term"].as_u64());
    assert!(token_of(&after).parse::<i64>().unwrap() > token_of(&before).parse::<i64>().unwrap());
    println!("crash failover: {failover:?} (D={D:?}, P={P:?})");
}

#[test]
fn a_leader_paused_past_d_never_serves_its_old_token_after_resuming() {
    let cluster = cluster("pause");
    let all: Vec<&Sidecar> = cluster.sidecars.iter().collect();
    let first = wait_for_one_leader(&all, Duration::from_secs(20)).expect("a first leader");
    let paused = &cluster.sidecars[first];
    let (_, before) = paused.leader();
    paused.signal("STOP");
    let rest = others(&cluster.sidecars, first);
    let next = wait_for_one_leader(&rest, D + P + Duration::from_secs(1)).expect("another leads while it is stopped");
    let (_, usurper) = rest[next].leader();
    std::thread::sleep(D.saturating_sub(Duration::from_millis(500)));
    paused.signal("CONT");
    // At once after resuming: never 200, and never with the old token.
    for _ in 0..20 {
        let (status, view) = paused.leader();
        assert_eq!(status, 503, "the resumed sidecar claims leadership: {view}");
        assert_eq!(view["leader"], false);
        std::thread::sleep(Duration::from_millis(25));
    }
    let (_, resumed) = paused.leader();
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
    // Its last renewal was sent before the cut, so its lease can expire by
    // the store's clock from D after the cut on: it must have stopped
    // claiming by then (it stops at R after that send; how much sooner is
    // the benchmarks' business).
    while leader.leads() {
        assert!(
            cut.elapsed() < D,
            "still claiming {:?} after the cut, when its lease may have expired (D = {D:?})",
            cut.elapsed()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    println!("stopped claiming {:?} after the cut (R={R:?})", cut.elapsed());
    let rest = others(&cluster.sidecars, first);
    wait_for_one_leader(&rest, D + P + Duration::from_secs(1)).expect("another leads");
    assert!(!leader.leads());
}

/// SIGTERM to the leader with `--drain drain`: it answers 503 at once, waits
/// the drain, releases, and exits 0. No follower may lead before the drain
/// has elapsed (the release comes after it), and one leads within
/// drain + P + 0.7 s (one poll, plus the test's 20 ms polling and process
/// scheduling on a loaded machine) — well before the lease would expire (D).
fn sigterm_handover(lock: &str, drain: Duration) {
    let mut cluster = cluster_with(lock, |_| vec!["--drain".into(), format!("{}ms", drain.as_millis())]);
    let all: Vec<&Sidecar> = cluster.sidecars.iter().collect();
    let first = wait_for_one_leader(&all, Duration::from_secs(20)).expect("a first leader");
    cluster.sidecars[first].signal("TERM");
    let termed = Instant::now();
    let rest = others(&cluster.sidecars, first);
    let mut stopped_claiming = None;
    while termed.elapsed() < drain {
        if stopped_claiming.is_none() && !cluster.sidecars[first].leads() {
            stopped_claiming = Some(termed.elapsed());
        }
        assert!(
            rest.iter().all(|s| !s.leads()),
            "a follower leads {:?} after SIGTERM, before the drain ({drain:?}) elapsed",
            termed.elapsed()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    if !drain.is_zero() {
        let stopped_claiming = stopped_claiming.expect("the leader answers 503 during its drain");
        assert!(
            stopped_claiming < drain / 2,
            "503 comes first, not after the drain: {stopped_claiming:?}"
        );
    }
    let next = wait_for_one_leader(&rest, P + Duration::from_millis(700));
    let handover = termed.elapsed();
    assert!(next.is_some(), "no new leader within drain + P + 0.7 s");
    println!("graceful handover: {handover:?} (drain={drain:?}, 503 after {stopped_claiming:?}, P={P:?}, D={D:?})");
    // Released at the end of the drain: it exits right after.
    let status = cluster.sidecars[first].expect_gone(D);
    assert!(status.success(), "SIGTERM exits 0: {status}");
}

#[test]
fn sigterm_releases_and_a_follower_leads_without_waiting_for_expiry() {
    sigterm_handover("term", Duration::ZERO);
}

/// With a drain of 0.9 s a skipped drain cannot pass (a follower would
/// lead within P). Below R − P, so the drain's bound (it ends by R after the
/// last renewal, issue 54) never cuts it short.
#[test]
fn sigterm_stops_claiming_drains_then_releases() {
    sigterm_handover("drain", Duration::from_millis(900));
}

/// One sidecar on a fresh database (no table) behind its own proxy.
fn sidecar_on_a_fresh_database(
    lock: &str,
    mode: ProxyMode,
    extra: &[String],
) -> (
    tokio::runtime::Runtime,
    leasehold::testing::Emulator,
    leasehold::store::spanner::SpannerConfig,
    Sidecar,
) {
    let runtime = proxy_runtime();
    let emulator = leasehold::testing::Emulator::start_or_connect();
    let (config, proxy) = runtime.block_on(async {
        let config = emulator.create_database("leasehold_leases").await;
        (
            config,
            leasehold::testing::TcpProxy::start(emulator.host.parse().unwrap()).await,
        )
    });
    proxy.set(mode);
    let sidecar = Sidecar::start("pod-0", &emulator, &config, proxy, lock, extra);
    (runtime, emulator, config, sidecar)
}

/// The start-up problem /healthz reports (503), checking the sidecar stays up.
fn start_up_problem(sidecar: &mut Sidecar) -> String {
    let started = Instant::now();
    loop {
        assert!(sidecar.child.try_wait().unwrap().is_none(), "the sidecar exited");
        if let (503, text) = get_text(sidecar.http, "/healthz").unwrap() {
            return text;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "no start-up problem on /healthz"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits until the sidecar leads and /healthz says ok.
fn leads_within(sidecar: &mut Sidecar, within: Duration) {
    let since = Instant::now();
    while !sidecar.leads() {
        assert!(sidecar.child.try_wait().unwrap().is_none(), "the sidecar exited");
        assert!(
            since.elapsed() < within,
            "not leading {within:?} after the store became usable"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(get_text(sidecar.http, "/healthz").map(|(s, _)| s), Ok(200));
}

/// A store unreachable at start, with `--create-table` on a fresh database:
/// the sidecar stays up, says on /healthz what to fix, and creates the table
/// and leads once the store answers.
#[test]
fn a_store_unreachable_at_start_is_retried_and_reported_not_an_exit() {
    let (_runtime, _emulator, _config, mut sidecar) =
        sidecar_on_a_fresh_database("start", ProxyMode::Cut, &["--create-table".into()]);
    let problem = start_up_problem(&mut sidecar);
    assert!(problem.contains("fix: check the database name"), "{problem}");
    std::thread::sleep(Duration::from_secs(2));
    assert!(sidecar.child.try_wait().unwrap().is_none(), "the sidecar exited");
    let (status, view) = sidecar.leader();
    assert_eq!(status, 503);
    assert!(
        view["storeError"].as_str().is_some_and(|e| e.contains("fix:")),
        "{view}"
    );

    sidecar.proxy.set(ProxyMode::Forward);
    // The connection is retried with backoff capped at 5 s (up to 10 s
    // jittered), then the table is created and the elector observes.
    leads_within(&mut sidecar, Duration::from_secs(20));
}

/// The lease table missing at start (no `--create-table`): the sidecar stays
/// up and says how to get the table; once someone creates it, it leads.
#[test]
fn a_missing_table_at_start_is_retried_and_reported_with_the_fix() {
    let (runtime, emulator, config, mut sidecar) = sidecar_on_a_fresh_database("table", ProxyMode::Forward, &[]);
    let problem = start_up_problem(&mut sidecar);
    assert!(problem.contains("--create-table"), "{problem}");
    runtime.block_on(async {
        let store = leasehold::store::spanner::SpannerStore::connect_to(
            config.clone(),
            emulator.endpoints(),
            leasehold::store::spanner::DEFAULT_CALL_TIMEOUT,
        )
        .await
        .unwrap();
        store.ensure_schema().await.unwrap();
    });
    // The elector retries at its backoff, capped at P.
    leads_within(&mut sidecar, P * 2 + Duration::from_secs(5));
}

/// Issue 16, the version fence across whole processes on the emulator: once
/// revision 2 has led, revision 1 candidates find the lease free after its
/// graceful exit and stay followers, saying why on /leader, for longer than
/// a crash failover would take (D + P, plus a second for process scheduling
/// on a loaded machine); a revision 2 candidate then leads.
#[test]
fn behind_the_version_fence_an_older_revision_stays_a_follower() {
    let runtime = proxy_runtime();
    let emulator = leasehold::testing::Emulator::start_or_connect();
    let (config, _) = runtime.block_on(lease_database(&emulator));
    let lock = "fence";
    let start = |name: &str, revision: u64| {
        let proxy = runtime.block_on(leasehold::testing::TcpProxy::start(emulator.host.parse().unwrap()));
        let flags = [
            "--revision".to_string(),
            revision.to_string(),
            "--version-name".into(),
            format!("app:{revision}"),
            "--version-fence".into(),
        ];
        Sidecar::start(name, &emulator, &config, proxy, lock, &flags)
    };
    let new = start("new-0", 2);
    wait_for_one_leader(&[&new], Duration::from_secs(20)).expect("revision 2 leads");
    let (_, view) = new.leader();
    assert_eq!(view["version"], "app:2 (revision 2)", "{view}");
    assert_eq!(view["holderVersion"], "app:2 (revision 2)", "{view}");
    let old = [start("old-0", 1), start("old-1", 1)];
    new.signal("TERM");
    let termed = Instant::now();
    let held_off = D + P + Duration::from_secs(1);
    while termed.elapsed() < held_off {
        for sidecar in &old {
            let (status, view) = sidecar.leader();
            assert_eq!(status, 503, "{} leads behind the fence: {view}", sidecar.name);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    for sidecar in &old {
        let (_, view) = sidecar.leader();
        let hold = view["versionHold"].as_str().unwrap_or_default();
        assert!(
            hold.contains("version fence: app:2 (revision 2) has led, and app:1 (revision 1) is older"),
            "{}: {view}",
            sidecar.name
        );
    }
    let newer = start("new-1", 2);
    let mut all: Vec<&Sidecar> = old.iter().collect();
    all.push(&newer);
    let leader = wait_for_one_leader(&all, D + P + Duration::from_secs(5)).expect("revision 2 leads again");
    assert_eq!(all[leader].name, "new-1");
}
