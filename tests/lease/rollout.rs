//! Issue 16: a Deployment rollout of three candidates (maxSurge 1 /
//! maxUnavailable 0, the app-health source on) with real electors,
//! publishers and peer watches on the API server model and a memory store,
//! on paused time (`support::rollout`). With `Newest` leadership moves once,
//! to the new version; with the fence it never moves back; `None` is the
//! baseline the issue describes.

use std::time::Duration;

use crate::support::rollout::{Outcome, STORE_LATENCY, TIMING, rollout};
use leasehold::lease::Prefer;

#[tokio::test(start_paused = true)]
async fn newest_hands_over_once_and_never_backwards() {
    let outcome = rollout(3, Prefer::Newest, true).await;
    println!("Newest + fence: {outcome:?}");
    assert_eq!(outcome.handovers, 1, "{outcome:?}");
    assert_eq!(outcome.backwards, 0, "{outcome:?}");
    assert_eq!(outcome.revisions.last(), Some(&Some(2)), "{outcome:?}");
    // One graceful handover, as fast as a release: the label turns false
    // when the old leader stops claiming, before its release commits, and
    // nudges the new pod (whose first observation may still be in flight).
    // The observation the release outran, a gap of at most one round trip
    // (the elector's quick re-poll), the observation that finds it free and
    // the acquire: 4 store round trips, plus one as margin and the 10 ms
    // sampling step; well below P (300 ms), which a follower that waited
    // for its next poll would need.
    let round_trip = STORE_LATENCY * 2;
    let bound = round_trip * 5 + Duration::from_millis(10);
    assert!(bound < TIMING.2 / 4);
    assert!(outcome.leaderless <= bound, "{outcome:?}, bound {bound:?}");
}

/// Whether every acquisition made while an old pod still ran went to the
/// old revision.
fn old_kept_while_any_ran(outcome: &Outcome) -> bool {
    outcome.revisions[..outcome.while_old_ran]
        .iter()
        .all(|revision| *revision == Some(1))
}

#[tokio::test(start_paused = true)]
async fn oldest_keeps_the_old_version_until_none_is_left() {
    let outcome = rollout(3, Prefer::Oldest, false).await;
    println!("Oldest: {outcome:?}");
    assert!(outcome.while_old_ran >= 1, "an old pod led first: {outcome:?}");
    assert!(
        old_kept_while_any_ran(&outcome),
        "no new pod leads while an old one runs: {outcome:?}"
    );
    let moves_to_new = outcome.revisions.windows(2).filter(|w| w[1] > w[0]).count();
    assert_eq!(moves_to_new, 1, "once, when the last old pod goes: {outcome:?}");
    assert_eq!(outcome.revisions.last(), Some(&Some(2)), "{outcome:?}");
}

/// The check above fails a rollout whose leadership moved to the new
/// version after the first old pod went (three old pods, each replaced in
/// turn; the new revision acquired while two old pods still ran), and
/// passes the one it should.
#[test]
fn the_oldest_check_fails_leadership_that_moved_to_new_early() {
    let rollout = |revisions: &[u64], while_old_ran| Outcome {
        handovers: revisions.len() - 1,
        leaderless: Duration::ZERO,
        backwards: 0,
        revisions: revisions.iter().map(|r| Some(*r)).collect(),
        while_old_ran,
    };
    assert!(!old_kept_while_any_ran(&rollout(&[1, 2], 2)));
    assert!(!old_kept_while_any_ran(&rollout(&[1, 1, 2], 3)));
    assert!(old_kept_while_any_ran(&rollout(&[1, 1, 2], 2)));
}

#[tokio::test(start_paused = true)]
async fn none_moves_leadership_with_every_old_leader_replaced() {
    let outcome = rollout(3, Prefer::None, false).await;
    println!("None: {outcome:?}");
    assert!(outcome.handovers >= 1, "{outcome:?}");
    assert_eq!(outcome.revisions.last(), Some(&Some(2)), "{outcome:?}");
}
