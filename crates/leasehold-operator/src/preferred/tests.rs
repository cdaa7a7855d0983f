use super::*;

const PERIOD: Duration = Duration::from_secs(30);
const HOLDER: &str = "prod/web-0#n1@u0";

fn at(seconds: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + seconds).unwrap()
}

fn candidate(name: &str, priority: i64, ready_since: Option<i64>) -> Candidate {
    Candidate {
        name: name.into(),
        uid: format!("uid-{name}"),
        rank: Ok(Rank {
            priority,
            zone_place: 0,
        }),
        ready_since: ready_since.map(at),
        terminating: false,
        store_reachable: true,
        template: Some("t1".into()),
    }
}

fn input(candidates: &[Candidate]) -> Input<'_> {
    Input {
        candidates,
        leader: Some((HOLDER, "web-0")),
        term: 7,
        prefer: Prefer::None,
        stabilization: PERIOD,
        transfer_open: false,
    }
}

/// Looks at `now` with what the last look left, as the reconcile does.
fn look(input: &Input<'_>, memory: &mut Option<Pending>, now: i64) -> Step {
    let decision = decide(input, memory.as_ref(), at(now));
    *memory = decision.pending;
    decision.step
}

fn transfer_to(name: &str) -> Step {
    Step::Transfer { target: name.into() }
}

#[test]
fn a_ready_candidate_that_outranks_the_leader_takes_over_after_the_period() {
    let candidates = [candidate("web-0", 0, Some(-100)), candidate("web-1", 5, Some(-100))];
    let input = input(&candidates);
    let mut memory = None;
    assert_eq!(
        look(&input, &mut memory, 0),
        Step::Wait {
            target: "web-1".into(),
            after: PERIOD
        }
    );
    assert_eq!(
        look(&input, &mut memory, 29),
        Step::Wait {
            target: "web-1".into(),
            after: Duration::from_secs(1)
        }
    );
    assert_eq!(look(&input, &mut memory, 30), transfer_to("web-1"));
}

#[test]
fn equal_ranks_never_move_leadership() {
    let candidates = [candidate("web-0", 3, Some(-100)), candidate("web-1", 3, Some(-100))];
    let mut memory = None;
    for now in [0, 30, 60, 3600] {
        assert_eq!(look(&input(&candidates), &mut memory, now), Step::Stay, "at {now}s");
    }
    // Nor lower ones.
    let candidates = [candidate("web-0", 3, Some(-100)), candidate("web-1", 2, Some(-100))];
    assert_eq!(look(&input(&candidates), &mut None, 3600), Step::Stay);
}

#[test]
fn zones_rank_after_priority() {
    let mut leader = candidate("web-0", 0, Some(-100));
    leader.rank = Ok(Rank {
        priority: 0,
        zone_place: 1,
    });
    let in_first_zone = candidate("web-1", 0, Some(-100));
    let candidates = [leader.clone(), in_first_zone];
    let mut memory = None;
    look(&input(&candidates), &mut memory, 0);
    assert_eq!(look(&input(&candidates), &mut memory, 30), transfer_to("web-1"));
    // A higher priority in a worse zone keeps leading.
    leader.rank = Ok(Rank {
        priority: 1,
        zone_place: 1,
    });
    let candidates = [leader, candidate("web-1", 0, Some(-100))];
    assert_eq!(look(&input(&candidates), &mut None, 30), Step::Stay);
}

#[test]
fn toggling_health_restarts_the_clock() {
    let ready = [candidate("web-0", 0, Some(-100)), candidate("web-1", 5, Some(-100))];
    let unready = [candidate("web-0", 0, Some(-100)), candidate("web-1", 5, None)];
    // Ready again at 20 s: the kubelet's transition time says so.
    let ready_again = [candidate("web-0", 0, Some(-100)), candidate("web-1", 5, Some(20))];
    let mut memory = None;
    assert!(matches!(look(&input(&ready), &mut memory, 0), Step::Wait { .. }));
    assert_eq!(look(&input(&unready), &mut memory, 10), Step::Stay);
    assert!(matches!(look(&input(&ready_again), &mut memory, 20), Step::Wait { .. }));
    // 30 s after the first sighting, but only 10 s ready: wait.
    assert!(matches!(look(&input(&ready_again), &mut memory, 30), Step::Wait { .. }));
    assert_eq!(
        look(&input(&ready_again), &mut memory, 49),
        Step::Wait {
            target: "web-1".into(),
            after: Duration::from_secs(1)
        }
    );
    assert_eq!(look(&input(&ready_again), &mut memory, 50), transfer_to("web-1"));
}

#[test]
fn a_flap_between_two_looks_restarts_the_clock_by_the_ready_transition_time() {
    let before = [candidate("web-0", 0, Some(-100)), candidate("web-1", 5, Some(-100))];
    // The operator never saw it unready, but the Ready condition moved at 25 s.
    let after = [candidate("web-0", 0, Some(-100)), candidate("web-1", 5, Some(25))];
    let mut memory = None;
    look(&input(&before), &mut memory, 0);
    assert!(matches!(look(&input(&after), &mut memory, 30), Step::Wait { .. }));
    assert_eq!(look(&input(&after), &mut memory, 55), transfer_to("web-1"));
}

#[test]
fn a_new_leader_term_or_target_restarts_the_clock() {
    let candidates = [
        candidate("web-0", 0, Some(-100)),
        candidate("web-1", 5, Some(-100)),
        candidate("web-2", 9, Some(-100)),
    ];
    let mut memory = None;
    look(&input(&candidates[..2]), &mut memory, 0);
    // A better candidate arrives at 20 s: its own clock.
    assert!(matches!(look(&input(&candidates), &mut memory, 20), Step::Wait { target, .. } if target == "web-2"));
    assert!(matches!(look(&input(&candidates), &mut memory, 40), Step::Wait { .. }));
    assert_eq!(look(&input(&candidates), &mut memory, 50), transfer_to("web-2"));
    // The same leader in a new term (it lost and re-acquired): start again.
    let next_term = Input {
        term: 8,
        ..input(&candidates)
    };
    assert!(matches!(look(&next_term, &mut memory, 51), Step::Wait { .. }));
}

#[test]
fn terminating_unready_or_unparsable_candidates_are_never_targets() {
    let mut terminating = candidate("web-1", 5, Some(-100));
    terminating.terminating = true;
    let mut unparsable = candidate("web-2", 5, Some(-100));
    unparsable.rank = Err(PriorityError::NotAnInteger {
        pod: "web-2".into(),
        place: "label",
        value: "high".into(),
    });
    let candidates = [
        candidate("web-0", 0, Some(-100)),
        terminating,
        unparsable,
        candidate("web-3", 5, None),
    ];
    assert_eq!(look(&input(&candidates), &mut None, 1000), Step::Stay);
}

#[test]
fn holds_off_while_a_transfer_is_open_or_without_a_local_leader() {
    let candidates = [candidate("web-0", 0, Some(-100)), candidate("web-1", 5, Some(-100))];
    let mut memory = None;
    look(&input(&candidates), &mut memory, 0);
    let open = Input {
        transfer_open: true,
        ..input(&candidates)
    };
    assert_eq!(look(&open, &mut memory, 30), Step::Stay);
    assert_eq!(memory, None, "an open transfer forgets the pending step");
    let elsewhere = Input {
        leader: None,
        ..input(&candidates)
    };
    assert_eq!(look(&elsewhere, &mut None, 30), Step::Stay);
}

#[test]
fn during_a_rollout_with_newest_or_oldest_the_version_decides() {
    let mut new = candidate("web-1", 5, Some(-100));
    new.template = Some("t2".into());
    let candidates = [candidate("web-0", 0, Some(-100)), new];
    for prefer in [Prefer::Newest, Prefer::Oldest] {
        let rolling = Input {
            prefer,
            ..input(&candidates)
        };
        let mut memory = None;
        assert_eq!(look(&rolling, &mut memory, 0), Step::Stay, "{prefer:?}");
        assert_eq!(look(&rolling, &mut memory, 60), Step::Stay, "{prefer:?}");
    }
    // Version-blind leases rank across templates.
    let mut memory = None;
    look(&input(&candidates), &mut memory, 0);
    assert_eq!(look(&input(&candidates), &mut memory, 30), transfer_to("web-1"));
    // Once the rollout is over (one template), preference applies again.
    let done = [candidate("web-0", 0, Some(-100)), candidate("web-1", 5, Some(-100))];
    let newest = Input {
        prefer: Prefer::Newest,
        ..input(&done)
    };
    let mut memory = None;
    look(&newest, &mut memory, 0);
    assert_eq!(look(&newest, &mut memory, 30), transfer_to("web-1"));
}

#[test]
fn an_unparsable_leader_priority_keeps_the_leader() {
    let mut leader = candidate("web-0", 0, Some(-100));
    leader.rank = Err(PriorityError::NotAnInteger {
        pod: "web-0".into(),
        place: "annotation",
        value: "x".into(),
    });
    let candidates = [leader, candidate("web-1", 5, Some(-100))];
    assert_eq!(look(&input(&candidates), &mut None, 1000), Step::Stay);
}

/// Issue 54: a candidate whose sidecar cannot reach the store is never
/// offered leadership, however it ranks: handing it the lease would leave
/// the lease leaderless for the reservation. Its reaching the store again
/// starts the period anew.
#[test]
fn a_candidate_that_cannot_reach_the_store_is_never_the_target() {
    let mut cut_off = candidate("web-1", 5, Some(-100));
    cut_off.store_reachable = false;
    let candidates = [candidate("web-0", 0, Some(-100)), cut_off.clone()];
    let mut memory = None;
    for now in [0, 30, 3600] {
        assert_eq!(look(&input(&candidates), &mut memory, now), Step::Stay, "at {now}s");
    }
    let reachable = [candidate("web-0", 0, Some(-100)), candidate("web-1", 5, Some(-100))];
    assert!(matches!(look(&input(&reachable), &mut memory, 3600), Step::Wait { .. }));
    assert_eq!(look(&input(&reachable), &mut memory, 3630), transfer_to("web-1"));
}

/// A LeaseTransfer of lease `web` to `to`, ended `phase` (`reason`) `at`
/// seconds, asked by `origin`.
fn ended(to: &str, origin: TransferOrigin, phase: TransferPhase, reason: &str, at_s: i64) -> LeaseTransfer {
    use leasehold_kubernetes::api::transfer::{LeaseTransferSpec, LeaseTransferStatus};
    let mut transfer = LeaseTransfer::new(
        &format!("web-{at_s}"),
        LeaseTransferSpec {
            lease: "web".into(),
            to: to.into(),
            origin: Some(origin),
        },
    );
    transfer.status = Some(LeaseTransferStatus {
        phase: Some(phase),
        reason: Some(reason.into()),
        target_uid: (reason != "TargetCannotReachStore").then(|| format!("uid-{to}")),
        completed_at: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(at(at_s))),
        ..Default::default()
    });
    transfer
}

/// Issue 54: failed preference transfers to a target back it off, counted
/// from the transfers themselves since the lease last handed over, by
/// target (UID, or name where none was recorded); the wait doubles from
/// the stabilization period and stops growing at BACKOFF_MAX.
#[test]
fn failed_preference_transfers_back_their_target_off_growing_and_bounded() {
    use TransferOrigin::{Manual, Preference};
    use TransferPhase::{TransferFailed, Transferred};
    let target = candidate("web-1", 5, Some(-100));
    assert_eq!(backoff(&[], "web", &target), None);
    let failed = |at_s| ended("web-1", Preference, TransferFailed, "TargetDidNotAcquire", at_s);
    let history = vec![
        failed(10),
        // A handover since: what failed before it no longer counts.
        ended("web-2", Manual, Transferred, "TargetLeads", 20),
        failed(30),
        ended("web-1", Preference, TransferFailed, "TargetCannotReachStore", 40),
        // Another target's failure, and a manual one to this target, do not count.
        ended("web-2", Preference, TransferFailed, "TargetDidNotAcquire", 50),
        ended("web-1", Manual, TransferFailed, "TargetNotReady", 60),
    ];
    let found = backoff(&history, "web", &target).expect("a backoff");
    assert_eq!(
        (found.failures, found.last, found.reason.as_str()),
        (2, at(40), "TargetCannotReachStore")
    );
    assert_eq!(found.until(PERIOD), at(40 + 60), "two failures: twice the period");
    let many = Backoff {
        failures: 40,
        last: at(0),
        reason: String::new(),
    };
    assert_eq!(many.until(PERIOD), at(600), "bounded by BACKOFF_MAX");
    assert_eq!(
        Backoff { failures: 1, ..many }.until(PERIOD),
        at(30),
        "the first failure waits one period"
    );
}
