//! Issue 16's "Measure": whole-process Deployment rollouts
//! (`support::rollout_process`: three `leasehold sidecar` processes on one
//! Spanner emulator, the API server model over HTTP, the app-health source
//! on), `rollouts` per leadership setting.

use std::panic::AssertUnwindSafe;

use leasehold::testing::Emulator;

use super::quantile;
use super::support::rollout_process::{Setting, rollout};

/// One summary line per setting: handovers per rollout, time without a
/// leader per rollout, moves to an older version, and rollouts that failed
/// one of the harness's own checks (counted, not measured).
pub fn rollouts_across_processes(rollouts: u64) -> Vec<String> {
    let emulator = Emulator::start_or_connect();
    let settings = [
        ("None", "none", false),
        ("Newest", "newest", false),
        ("Newest + fence", "newest", true),
        ("Oldest", "oldest", false),
    ];
    let mut lines = Vec::new();
    for (label, prefer, fence) in settings {
        let (mut handovers, mut leaderless, mut backwards, mut failed) = (Vec::new(), Vec::new(), 0, 0);
        for rep in 0..rollouts {
            let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| rollout(&emulator, Setting { prefer, fence })));
            match outcome {
                Ok(outcome) => {
                    println!(
                        "{label} rollout {rep}: {} handovers, {:.0} ms without a leader, {} backwards; lease row {:?}",
                        outcome.handovers,
                        outcome.leaderless.as_secs_f64() * 1000.0,
                        outcome.backwards(),
                        outcome.samples
                    );
                    handovers.push(outcome.handovers);
                    leaderless.push(outcome.leaderless);
                    backwards += outcome.backwards();
                }
                Err(_) => {
                    eprintln!("{label} rollout {rep}: failed (see the panic above)");
                    failed += 1;
                }
            }
        }
        handovers.sort();
        leaderless.sort();
        let count = |q: f64| match handovers.len() {
            0 => "-".to_string(),
            n => handovers[((n - 1) as f64 * q).round() as usize].to_string(),
        };
        let line = format!(
            "{label}: n={} handovers per rollout min {} median {} max {}; without a leader per rollout median {:.0} ms \
             max {:.0} ms; moves to an older version {backwards}; failed rollouts {failed}",
            handovers.len(),
            count(0.0),
            count(0.5),
            count(1.0),
            quantile(&leaderless, 0.5),
            quantile(&leaderless, 1.0),
        );
        println!("{line}");
        lines.push(line);
    }
    lines
}
