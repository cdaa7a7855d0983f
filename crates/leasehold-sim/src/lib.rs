//! The deterministic safety simulation: seeded schedules on paused tokio time,
//! several electors on a faulty memory store, a checker, and mutants the
//! checker must catch.
//!
//! Faults per schedule (design.md's scenarios in brackets):
//! * whole-process pauses: the elector's task, its timers and its leader
//!   work stop, often for longer than the safety gap (S1);
//! * per-candidate links with asymmetric latency, sometimes longer than R,
//!   so replies come late (S2) and requests the client gave up on still
//!   commit later (S9, S13); requests delivered twice;
//! * the store clock runs slow or fast within what R/D tolerates, and jumps
//!   backwards and forwards within the safety gap (S3);
//! * store outages, flaky calls, lost replies after commit and unknown
//!   outcomes (S4, S9);
//! * crashes (kill -9: the elector and its leader work stop at once, its
//!   requests in flight may still commit) and a restart under a new
//!   identity (S12, S13); campaigns stopped and resumed (S8);
//! * the lease row deleted under a live lease;
//! * odd seeds run on Redis's expiry semantics (the lease key vanishes at its
//!   TTL, the counter keeping term and token survives), even seeds on the
//!   SQL stores' (the row stays, expiry judged when read or taken).
//!
//! The checker compares what every process believed and wrote with the
//! store's own record of acquisitions (their commit instants on the
//! simulated clock):
//! 1. acquisitions commit with strictly increasing terms and tokens, and
//!    every term a process believed it led was granted to it, with that token;
//! 2. every interval in which a process believes it leads
//!    ([`LeaderState::is_leader_at`](leasehold_core::lease::LeaderState::is_leader_at))
//!    ends no later than the commit of the next term;
//! 3. every write the fenced register accepted was issued no later than
//!    the commit of the next term, unless its writer was paused between its
//!    leadership check and the write for longer than the margin (the
//!    documented pause case fencing tokens exist for). Writes the register
//!    rejected did no harm.
//!
//! 4. in schedules with the version fence (half of them), leadership never
//!    moves back: the revisions of acquisitions never decrease in commit
//!    order, while candidates restart under older and newer revisions, as
//!    pods of two ReplicaSets do during a rollout.
//!
//! 5. in schedules with two clusters sharing the store (pods of the same
//!    names in both, with or without cluster names in their identities),
//!    each cluster's operator releases the lock when it deletes one of its
//!    pods, judging the holder as the real operator does
//!    (`lease::holder`): checks 1–3 catch a release that reaches across;
//!    and its label repairs never take the leader label of the pod whose
//!    process holds the lock, nor keep one on a pod of the cluster that
//!    certainly does not lead ([`clusters`]).
//!
//! The only excuse besides that pause: a term whose row was deleted under
//! its live lease (an operator overriding the store) is exempt from 2 and 3.
//!
//! Sessions and lock sets have a schedule of their own ([`sessions`]), on
//! the memory store's, PostgreSQL's and Redis's semantics
//! ([`session_stores`]), and so do rolling updates with a version
//! preference ([`rollout`]). The elector schedule also runs on the
//! Kubernetes store's semantics ([`kubernetes`]).
//!
//! One file per job, layered so no module uses one that uses it:
//! [`mutants`], [`report`], [`pause`] (process pauses and the paused
//! runtime), [`link`] (the faulty store as each process reaches it), the
//! store models [`kubernetes`] and [`session_stores`], and [`checker`] at
//! the bottom; [`schedule`] (the elector schedule and its faults) uses
//! them; [`sessions`] and [`rollout`] extend a schedule; this module runs
//! schedules and hunts mutants. The command is `cmd::simulate`.

#![warn(unreachable_pub)]

mod checker;
mod clusters;
mod history;
mod kubernetes;
mod link;
mod mutants;
mod pause;
mod report;
mod rollout;
mod schedule;
mod session_stores;
mod sessions;
mod signal;

pub use mutants::Mutant;
pub use report::{Counts, Report, Summary, Violation};
pub use rollout::simulate_rollouts;
pub use schedule::Setup;
pub use session_stores::SessionSemantics;
pub use sessions::simulate_sessions;

use std::ops::Range;
use std::time::Duration;

use pause::paused_runtime;
use schedule::Schedule;

/// Runs one seeded schedule of the correct elector.
pub fn simulate(seed: u64, length: Duration) -> Result<Report, Violation> {
    simulate_with(
        seed,
        &Setup {
            length,
            ..Setup::default()
        },
    )
}

/// Runs one seeded schedule of the correct elector on the Kubernetes store's semantics.
pub fn simulate_kubernetes(seed: u64, length: Duration) -> Result<Report, Violation> {
    simulate_with(
        seed,
        &Setup {
            length,
            kubernetes: true,
            ..Setup::default()
        },
    )
}

/// Runs one seeded schedule of the correct elector in two clusters sharing the store.
pub fn simulate_two_clusters(seed: u64, length: Duration) -> Result<Report, Violation> {
    simulate_with(
        seed,
        &Setup {
            length,
            two_clusters: true,
            ..Setup::default()
        },
    )
}

/// Runs one seeded schedule on its own paused current-thread runtime.
pub fn simulate_with(seed: u64, setup: &Setup) -> Result<Report, Violation> {
    let runtime = paused_runtime();
    let setup = setup.clone();
    // Built inside the runtime so every instant is on the paused clock.
    runtime.block_on(async move {
        let schedule = Schedule::new(seed, &setup);
        match setup.mutant {
            Some(mutant) if sessions::is_session_mutant(mutant) => schedule.run_sessions(setup.length).await,
            Some(Mutant::LeaderIgnoresStandAside | Mutant::StandAsideForFencedPeers) => {
                schedule.run_rollout(setup.length).await
            }
            _ => schedule.run(setup.length).await,
        }
    })
}

/// The first seed in `seeds` on which the checker catches `mutant`.
pub fn hunt(mutant: Mutant, seeds: Range<u64>, length: Duration) -> Option<Violation> {
    hunt_with(
        mutant,
        seeds,
        &Setup {
            length,
            ..Setup::default()
        },
    )
}

/// [`hunt`] with `setup` (its mutant replaced by `mutant`).
pub fn hunt_with(mutant: Mutant, seeds: Range<u64>, setup: &Setup) -> Option<Violation> {
    let setup = Setup {
        mutant: Some(mutant),
        ..setup.clone()
    };
    seeds.into_iter().find_map(|seed| simulate_with(seed, &setup).err())
}
