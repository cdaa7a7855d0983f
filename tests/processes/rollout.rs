//! Issue 16 across whole processes: the Deployment rollout of
//! `support::rollout_process` (three `leasehold sidecar` processes on the
//! Cloud Spanner emulator, the Kubernetes API server model over HTTP, the
//! app-health source on), once per leadership setting.

use crate::support::rollout_process::{Setting, rollout};
use leasehold::testing::Emulator;

/// Leadership moves to revision 2 once, when the first new pod turns
/// ready (before any old pod goes; with `--prefer none` in its place no new
/// pod leads then, which fails), and never back.
#[test]
fn newest_with_the_fence_hands_over_once_across_processes() {
    let emulator = Emulator::start_or_connect();
    let outcome = rollout(
        &emulator,
        Setting {
            prefer: "newest",
            fence: true,
        },
    );
    println!("newest + fence: {outcome:?}");
    assert_eq!(outcome.handovers, 1, "{outcome:?}");
    assert_eq!(outcome.backwards(), 0, "{outcome:?}");
}

/// The baseline: every old leader replaced moves leadership, at most once
/// per old pod.
#[test]
fn none_still_ends_with_a_new_leader_across_processes() {
    let emulator = Emulator::start_or_connect();
    let outcome = rollout(
        &emulator,
        Setting {
            prefer: "none",
            fence: false,
        },
    );
    println!("none: {outcome:?}");
    assert!((1..=3).contains(&outcome.handovers), "{outcome:?}");
}

/// `Oldest`: leadership stays on revision 1 while an old pod is live (each
/// old leader replaced hands over to another old pod), and moves to
/// revision 2 once, when the last old pod goes.
#[test]
fn oldest_keeps_the_old_version_leading_until_none_is_left_across_processes() {
    let emulator = Emulator::start_or_connect();
    let outcome = rollout(
        &emulator,
        Setting {
            prefer: "oldest",
            fence: true,
        },
    );
    println!("oldest + fence: {outcome:?}");
    assert_eq!(outcome.handovers, 3, "{outcome:?}");
    assert_eq!(outcome.backwards(), 0, "{outcome:?}");
    let (last_term, _) = *outcome.samples.last().unwrap();
    assert!(
        outcome
            .samples
            .iter()
            .all(|(term, revision)| (*revision == Some(2)) == (*term == last_term)),
        "only the last term is revision 2's: {outcome:?}"
    );
}
