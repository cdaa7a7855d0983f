//! The deterministic safety simulation, 1,000 seeds in four shards so the
//! test runner spreads them over the cores. `leasehold simulate --seeds N`
//! runs any number.

use std::time::Duration;

use leasehold::sim::{Setup, Summary, simulate, simulate_with};

fn run_shard(shard: u64) -> Summary {
    let mut summary = Summary::default();
    for seed in shard * 250..(shard + 1) * 250 {
        match simulate(seed, Duration::from_secs(60)) {
            Ok(report) => summary.add(&report),
            Err(violation) => panic!("{violation}"),
        }
    }
    // The schedules must actually exercise the faults they claim to.
    assert_eq!(summary.seeds, 250);
    assert!(
        summary.terms > 250,
        "every seed elects someone, most more than once: {summary:?}"
    );
    assert!(summary.crashes > 0 && summary.long_pauses > 0, "{summary:?}");
    assert!(
        summary.fenced > 0,
        "some paused leader's late write was fenced off: {summary:?}"
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
fn a_seed_replays_exactly() {
    let a = simulate(42, Duration::from_secs(30)).expect("seed 42 is safe");
    let b = simulate(42, Duration::from_secs(30)).expect("seed 42 is safe");
    assert_eq!(a.events, b.events);
    assert_eq!((a.terms, a.accepted, a.fenced), (b.terms, b.accepted, b.fenced));
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
