//! The deterministic safety simulation, 1,000 seeds in four shards so the
//! test runner spreads them over the cores, and the mutants it must catch.
//! `leasehold simulate --seeds N` runs any number.

use std::time::Duration;

use leasehold::sim::{
    Mutant, Report, SessionSemantics, Setup, Summary, Violation, hunt, hunt_with, simulate, simulate_kubernetes,
    simulate_rollouts, simulate_sessions, simulate_two_clusters, simulate_with,
};

/// Runs `seeds` one-minute schedules of one kind; panics with the first
/// violation (it names the seed that replays it).
fn run_seeds(seeds: std::ops::Range<u64>, schedule: fn(u64, Duration) -> Result<Report, Violation>) -> Summary {
    let mut summary = Summary::default();
    for seed in seeds {
        match schedule(seed, Duration::from_secs(60)) {
            Ok(report) => summary.add(&report),
            Err(violation) => panic!("{violation}"),
        }
    }
    summary
}

/// `leasehold simulate` with `flags` runs three short seeds and reports none failed.
fn the_simulate_command_runs(flags: &[&str]) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .arg("simulate")
        .args(flags)
        .args(["--seeds", "3", "--first-seed", "900", "--seconds", "10"])
        .output()
        .expect("leasehold runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("3 seeds, 0 failed"), "{stdout}");
}

fn run_shard(shard: u64) -> Summary {
    let summary = run_seeds(shard * 250..(shard + 1) * 250, simulate);
    // The schedules must actually exercise the faults they claim to.
    assert_eq!(summary.seeds, 250);
    assert!(
        summary.counts.terms > 250,
        "every seed elects someone, most more than once: {summary:?}"
    );
    assert!(
        summary.counts.crashes > 0 && summary.counts.long_pauses > 0,
        "{summary:?}"
    );
    assert!(
        summary.counts.late_commits > 0
            && summary.counts.duplicates > 0
            && summary.counts.clock_jumps > 0
            && summary.counts.deleted_live > 0,
        "late commits, duplicated requests, clock jumps and deleted rows all happened: {summary:?}"
    );
    assert!(
        summary.counts.fenced > 0,
        "some paused leader's late write was fenced off: {summary:?}"
    );
    assert!(
        summary.counts.ttl_seeds == 125 && summary.counts.ttl_expiries > 0,
        "half the seeds ran on Redis's TTL expiry, where leases did vanish: {summary:?}"
    );
    assert!(
        summary.counts.fenced_schedules > 50 && summary.counts.version_moves > 50,
        "the version fence was on and leadership moved between versions: {summary:?}"
    );
    // The operator's history was folded and checked, with terms it never
    // saw (it was down) as gaps.
    assert!(
        summary.counts.history_terms > summary.counts.terms / 2 && summary.counts.history_gaps > 0,
        "{summary:?}"
    );
    summary
}

#[test]
fn seeds_0_to_249() {
    run_shard(0);
}

#[test]
fn seeds_250_to_499() {
    run_shard(1);
}

#[test]
fn seeds_500_to_749() {
    run_shard(2);
}

#[test]
fn seeds_750_to_999() {
    run_shard(3);
}

#[test]
fn the_checker_catches_clock_drift_beyond_what_r_over_d_tolerates() {
    // With the store clock running faster than D/R allows, a lease can
    // expire by the store's clock while its holder still believes it leads.
    let caught = (0..100)
        .filter(|&seed| {
            let setup = Setup {
                drift: 1.5..3.0,
                ..Setup::default()
            };
            simulate_with(seed, &setup).is_err()
        })
        .count();
    assert!(caught > 0, "no violation found in 100 seeds of excessive drift");
}

/// Prints which seed caught `mutant` (`context` names the setup): that
/// seed, or `None` when the mutant survived.
fn caught(context: &str, mutant: Mutant, violation: Option<Violation>) -> Option<u64> {
    let violation = violation?;
    println!(
        "{context}mutant {:<38} caught by seed {:>3}: {}",
        mutant.name(),
        violation.seed,
        violation.what
    );
    Some(violation.seed)
}

#[test]
fn every_mutant_is_caught_within_1000_seeds() {
    let mut survivors = Vec::new();
    for mutant in Mutant::ALL {
        if caught("", mutant, hunt(mutant, 0..1000, Duration::from_secs(60))).is_none() {
            survivors.push(mutant.name());
        }
    }
    assert!(survivors.is_empty(), "mutants survived 1,000 seeds: {survivors:?}");
}

#[test]
fn the_simulate_command_names_and_hunts_mutants() {
    let run = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_leasehold"))
            .arg("simulate")
            .args(args)
            .output()
            .expect("leasehold runs");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    };
    let (ok, list) = run(&["--mutant", "list"]);
    assert!(ok, "{list}");
    for mutant in Mutant::ALL {
        assert!(list.contains(mutant.name()), "{list}");
    }
    let (ok, caught) = run(&["--mutant", "deadline-D-instead-of-R"]);
    assert!(
        ok && caught.contains("mutant deadline-D-instead-of-R caught by seed"),
        "{caught}"
    );
    let (ok, unknown) = run(&["--mutant", "nonsense"]);
    assert!(
        !ok && unknown.contains("--mutant \"nonsense\" is not one of: list, deadline-from-reply"),
        "{unknown}"
    );
}

#[test]
fn the_simulate_command_runs_any_number_of_seeds() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(["simulate", "--seeds", "5", "--first-seed", "5000", "--seconds", "10"])
        .output()
        .expect("leasehold runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("5 seeds, 0 failed"), "{stdout}");
}

fn run_session_shard(shard: u64) -> Summary {
    let summary = run_seeds(shard * 100..(shard + 1) * 100, simulate_sessions);
    // The schedules must exercise what they claim to: locks changing hands,
    // sessions expiring and replaced, pauses past the gap, crashes.
    assert!(summary.counts.terms > 1000, "lock acquisitions: {summary:?}");
    // One seed in three shares partitions (and must converge once faults stop).
    assert!(summary.counts.partition_schedules >= 30, "{summary:?}");
    assert!(summary.counts.accepted > 10_000, "claims checked: {summary:?}");
    assert!(
        summary.counts.sessions_replaced > 0 && summary.counts.long_pauses > 0 && summary.counts.crashes > 0,
        "{summary:?}"
    );
    // Seeds take turns on the memory store's, PostgreSQL's and Redis's
    // semantics; PostgreSQL's serialization failures were retried.
    assert!(
        summary.counts.postgres_schedules >= 30 && summary.counts.redis_schedules >= 30,
        "{summary:?}"
    );
    assert!(summary.counts.serialization_failures > 0, "{summary:?}");
    assert!(
        summary.counts.late_commits > 0 && summary.counts.duplicates > 0 && summary.counts.clock_jumps > 0,
        "{summary:?}"
    );
    summary
}

#[test]
fn session_seeds_0_to_99() {
    run_session_shard(0);
}

#[test]
fn session_seeds_100_to_199() {
    run_session_shard(1);
}

#[test]
fn the_simulate_command_runs_the_session_schedule() {
    the_simulate_command_runs(&["--sessions"]);
}

/// Rolling updates with `Newest` or `Oldest` (`crates/leasehold-sim/src/rollout.rs`): the
/// stand-aside properties 5 and 6 besides every safety check.
fn run_rollout_shard(shard: u64) -> Summary {
    let summary = run_seeds(shard * 100..(shard + 1) * 100, simulate_rollouts);
    // Both preferences, with and without the fence, leaders told to stand
    // aside, leadership moving between versions, through crashes and faults.
    assert!(
        (20..=80).contains(&summary.counts.newest_schedules) && (20..=80).contains(&summary.counts.fenced_schedules),
        "{summary:?}"
    );
    assert!(
        summary.counts.stand_asides > 25 && summary.counts.version_moves > 50,
        "{summary:?}"
    );
    assert!(
        summary.counts.crashes > 0 && summary.counts.clock_jumps > 0 && summary.counts.terms > 300,
        "{summary:?}"
    );
    summary
}

#[test]
fn rollout_seeds_0_to_99() {
    run_rollout_shard(0);
}

#[test]
fn rollout_seeds_100_to_199() {
    run_rollout_shard(1);
}

#[test]
fn the_simulate_command_runs_the_rollout_schedule() {
    the_simulate_command_runs(&["--rollouts"]);
}

/// The three session mutants stay caught on PostgreSQL's and Redis's
/// semantics (`crates/leasehold-sim/src/session_stores.rs`), not only on the memory store's.
#[test]
fn session_mutants_are_caught_on_postgres_and_redis_semantics() {
    let mut survivors = Vec::new();
    for semantics in [SessionSemantics::Postgres, SessionSemantics::Redis] {
        let setup = Setup {
            sessions_on: Some(semantics),
            ..Setup::default()
        };
        for mutant in [
            Mutant::SessionRenewWithoutCas,
            Mutant::SessionRenewedAfterExpiry,
            Mutant::LockTakenFromLiveSession,
        ] {
            if caught(&format!("{semantics:?}: "), mutant, hunt_with(mutant, 0..1000, &setup)).is_none() {
                survivors.push((semantics, mutant.name()));
            }
        }
    }
    assert!(survivors.is_empty(), "mutants survived 1,000 seeds: {survivors:?}");
}

/// The Kubernetes store's semantics (`crates/leasehold-sim/src/kubernetes.rs`): expiry by
/// observed change on candidate clocks running at different rates within
/// what D/R tolerates, wall clocks skewed and stepping, watches lagging,
/// writes landing after the client gave up, the Lease deleted and created again.
fn run_kubernetes_shard(shard: u64) -> Summary {
    let summary = run_seeds(shard * 100..(shard + 1) * 100, simulate_kubernetes);
    assert_eq!(summary.counts.kubernetes_schedules, 100, "{summary:?}");
    assert!(summary.counts.terms > 100, "every seed elects someone: {summary:?}");
    assert!(
        summary.counts.late_commits > 0 && summary.counts.stale_conflicts > 0 && summary.counts.clock_jumps > 0,
        "writes landed after their client gave up, writes judged on a stale version were refused, wall clocks stepped: {summary:?}"
    );
    assert!(
        summary.counts.recreated > 0 && summary.counts.deleted_live > 0,
        "Leases were deleted under a live lease and created again: {summary:?}"
    );
    // The operator's history was folded and checked across those
    // recreations: terms counted again began new runs.
    assert!(
        summary.counts.history_terms > summary.counts.terms / 2 && summary.counts.history_runs > 0,
        "{summary:?}"
    );
    assert!(
        summary.counts.crashes > 0 && summary.counts.long_pauses > 0 && summary.counts.fenced > 0,
        "{summary:?}"
    );
    summary
}

#[test]
fn kubernetes_seeds_0_to_99() {
    run_kubernetes_shard(0);
}

#[test]
fn kubernetes_seeds_100_to_199() {
    run_kubernetes_shard(1);
}

/// Each Kubernetes mutant is caught within 1,000 seeds, and the correct
/// model passes every seed up to the one that caught it.
#[test]
fn kubernetes_mutants_are_caught_where_the_correct_model_passes() {
    for mutant in Mutant::ALL.into_iter().filter(|m| m.is_kubernetes()) {
        let seed = caught("", mutant, hunt(mutant, 0..1000, Duration::from_secs(60)))
            .unwrap_or_else(|| panic!("mutant {} survived 1,000 seeds", mutant.name()));
        run_seeds(0..seed + 1, simulate_kubernetes);
    }
}

#[test]
fn the_checker_catches_candidate_clock_rates_beyond_what_d_over_r_tolerates() {
    // A follower's clock running faster than D/R times the leader's lets it
    // judge a lease expired while its holder still believes it leads.
    let setup = Setup {
        drift: 1.5..3.0,
        kubernetes: true,
        ..Setup::default()
    };
    let caught = (0..100).filter(|&seed| simulate_with(seed, &setup).is_err()).count();
    assert!(caught > 0, "no violation found in 100 seeds of excessive clock rates");
}

#[test]
fn the_simulate_command_runs_the_kubernetes_schedule() {
    the_simulate_command_runs(&["--kubernetes"]);
}

/// Two clusters sharing the store, pods of the same names in both, named
/// and unnamed: each cluster's operator released its own dead holders and
/// left the other cluster's live ones alone, repaired its own pods' leader
/// labels without taking the holder's, and no seed broke safety.
#[test]
fn two_cluster_seeds_0_to_199() {
    let summary = run_seeds(0..200, simulate_two_clusters);
    assert_eq!(summary.counts.two_cluster_schedules, 200, "{summary:?}");
    assert!(
        summary.counts.operator_releases > 0 && summary.counts.left_to_other_cluster > 0 && summary.counts.crashes > 0,
        "operators released their own cluster's dead holders and left the other's alone, and processes restarted: \
         {summary:?}"
    );
    assert!(
        summary.counts.labels_set_by_hand > 0 && summary.counts.label_repairs > 0,
        "labels were set by hand and operators took stale ones off: {summary:?}"
    );
}

/// The label repairs that judge a holder's locality wrongly (by its pod
/// name alone; only when proven local) are each caught within 1,000 seeds,
/// and the correct operator passes every two-cluster seed up to the one
/// that caught them.
#[test]
fn label_repairs_that_misjudge_the_holders_cluster_are_caught_where_the_correct_operator_passes() {
    let mut last = 0;
    for mutant in [Mutant::LabelRepairByNameAlone, Mutant::LabelRepairNeedsProof] {
        let seed = caught("", mutant, hunt(mutant, 0..1000, Duration::from_secs(60)))
            .unwrap_or_else(|| panic!("mutant {} survived 1,000 seeds", mutant.name()));
        last = last.max(seed);
    }
    run_seeds(0..last + 1, simulate_two_clusters);
}

/// The operator that takes an unnamed holder for its own (issue 37's
/// `is_local`) is caught within 1,000 seeds, and the correct operator
/// passes every two-cluster seed up to the one that caught it.
#[test]
fn the_cross_cluster_release_is_caught_where_the_correct_operator_passes() {
    let mutant = Mutant::ReleaseAcrossClusters;
    let seed = caught("", mutant, hunt(mutant, 0..1000, Duration::from_secs(60)))
        .unwrap_or_else(|| panic!("mutant {} survived 1,000 seeds", mutant.name()));
    run_seeds(0..seed + 1, simulate_two_clusters);
}

#[test]
fn the_simulate_command_runs_the_two_cluster_schedule() {
    the_simulate_command_runs(&["--two-clusters"]);
}

/// A seed replays exactly: the same seed run twice (each on a runtime of
/// its own, as `leasehold simulate --first-seed N` would) gives the same
/// event log, store commits and counts, on every kind of schedule. Anything
/// that orders wake-ups at random (tokio's `watch` picks one of eight
/// `Notify`s at random per runtime) shows up here as a differing log.
#[test]
fn every_schedule_replays_its_seed_exactly() {
    type Schedule = fn(u64, Duration) -> Result<Report, Violation>;
    let kinds: [(&str, Schedule, std::ops::Range<u64>); 5] = [
        // Nine session seeds cover the three stores' semantics, with and
        // without shared partitions (seed / 3 and seed % 3).
        ("sessions", simulate_sessions, 112..121),
        ("elector", simulate, 0..6),
        ("rollouts", simulate_rollouts, 0..4),
        ("kubernetes", simulate_kubernetes, 0..12),
        ("two clusters", simulate_two_clusters, 0..4),
    ];
    for (kind, schedule, seeds) in kinds {
        for seed in seeds {
            let run = || match schedule(seed, Duration::from_secs(30)) {
                Ok(report) => report.to_string(),
                Err(violation) => violation.to_string(),
            };
            let (first, second) = (run(), run());
            if first != second {
                let at = first.lines().zip(second.lines()).position(|(a, b)| a != b);
                panic!(
                    "{kind} seed {seed} did not replay; first difference at line {at:?}:\n{}\n---\n{}",
                    first.lines().nth(at.unwrap_or(0)).unwrap_or(""),
                    second.lines().nth(at.unwrap_or(0)).unwrap_or("")
                );
            }
        }
    }
}
