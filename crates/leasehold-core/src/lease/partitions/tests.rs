use super::*;
use crate::lease::{Identity, Timing};
use crate::store::MemoryStore;
use std::sync::Arc;

/// A view where `owners[i]` names the member index holding partition `i`.
fn view(members: usize, owners: &[Option<usize>]) -> PartitionView {
    let names: Vec<String> = (0..members).map(|m| format!("s{m}")).collect();
    PartitionView {
        members: names.clone(),
        free_slots: Vec::new(),
        owners: owners.iter().map(|o| o.map(|m| names[m].clone())).collect(),
        tokens: vec![None; owners.len()],
    }
}

/// Every member plans from the same read and acts; releases land before
/// takes (a released partition is taken at the next round). Returns the
/// rounds until nothing changes and how many partitions changed owner.
fn converge(members: usize, owners: &mut [Option<usize>]) -> (usize, usize) {
    let mut moved = 0;
    for round in 0.. {
        let v = view(members, owners);
        let plans: Vec<Plan> = v.members.iter().map(|m| plan(&v, m)).collect();
        let mut taken = BTreeSet::new();
        for (m, p) in plans.iter().enumerate() {
            for i in &p.take {
                assert!(taken.insert(*i), "partition {i} planned for two members");
                assert_eq!(owners[*i as usize], None, "partition {i} planned while owned");
                owners[*i as usize] = Some(m);
            }
            for i in &p.release {
                assert_eq!(owners[*i as usize], Some(m));
                owners[*i as usize] = None;
                moved += 1;
            }
        }
        if plans.iter().all(|p| p.take.is_empty() && p.release.is_empty()) {
            return (round, moved);
        }
        assert!(round < 4, "no fixpoint after {round} rounds: {owners:?}");
    }
    unreachable!()
}

fn counts(members: usize, owners: &[Option<usize>]) -> Vec<usize> {
    (0..members)
        .map(|m| owners.iter().filter(|o| **o == Some(m)).count())
        .collect()
}

#[test]
fn from_nothing_every_partition_gets_one_owner_and_shares_differ_by_at_most_one() {
    for members in 1..=6 {
        for n in [1usize, 2, 5, 7, 64, 100] {
            let mut owners = vec![None; n];
            let (rounds, _) = converge(members, &mut owners);
            assert!(rounds <= 1, "{members} members, {n} partitions: {rounds} rounds");
            assert!(owners.iter().all(Option::is_some), "unowned left: {owners:?}");
            let c = counts(members, &owners);
            let (max, min) = (c.iter().max().unwrap(), c.iter().min().unwrap());
            assert!(max - min <= 1, "{members} members, {n} partitions: {c:?}");
            assert!(*max <= n.div_ceil(members), "{c:?} above ⌈N/M⌉");
        }
    }
}

#[test]
fn a_join_moves_only_the_partitions_the_new_quotas_need() {
    let mut owners = vec![None; 64];
    converge(3, &mut owners);
    assert_eq!(counts(3, &owners), [22, 21, 21]);
    let (_, moved) = converge(4, &mut owners);
    assert_eq!(counts(4, &owners), [16, 16, 16, 16]);
    assert_eq!(moved, 64 - 3 * 16, "only the new member's share moves");
}

#[test]
fn a_dead_member_leaves_its_partitions_to_the_others_and_nothing_else_moves() {
    let mut owners = vec![None; 64];
    converge(3, &mut owners);
    let before = owners.clone();
    // Member 2 dies: its slot and partitions come free in the same read.
    for o in owners.iter_mut().filter(|o| **o == Some(2)) {
        *o = None;
    }
    let (rounds, moved) = converge(2, &mut owners);
    assert_eq!((rounds, moved), (1, 0), "survivors only pick up orphans");
    assert_eq!(counts(2, &owners), [32, 32]);
    for (i, (b, a)) in before.iter().zip(&owners).enumerate() {
        if *b != Some(2) {
            assert_eq!(b, a, "partition {i} moved though its owner lives");
        }
    }
}

#[test]
fn a_candidate_that_is_not_a_member_releases_everything_and_takes_nothing() {
    let mut v = view(2, &[Some(0), Some(1), None]);
    v.owners[2] = Some("gone".into());
    assert_eq!(
        plan(&v, "gone"),
        Plan {
            take: vec![],
            release: vec![2]
        }
    );
}

#[test]
fn a_partitioned_lock_is_checked_once_with_the_reason() {
    let fields = ("--lock", "--partitions");
    validate_partitions(fields, "jobs", 64).unwrap();
    let err = |lock: &str, n| validate_partitions(fields, lock, n).unwrap_err().to_string();
    assert_eq!(err("jobs", 0), "--partitions must be between 1 and 1024, not 0");
    assert_eq!(err("jobs", 1025), "--partitions must be between 1 and 1024, not 1025");
    assert_eq!(err("", 3), "--lock must not be empty");
    assert!(
        err(&"x".repeat(506), 3)
            .starts_with("--lock is 506 bytes long; a partitioned lock's name is at most 505 bytes")
    );
    validate_partitions(fields, &"x".repeat(505), MAX_PARTITIONS).unwrap();
    assert!(partition_lock(&"x".repeat(505), MAX_PARTITIONS - 1).len() <= MAX_LOCK_NAME_BYTES);
}

fn timing() -> Timing {
    Timing::new(
        Duration::from_secs(6),
        Duration::from_secs(4),
        Duration::from_secs(1),
        0.2,
    )
    .unwrap()
}

struct Candidate {
    assigned: watch::Receiver<Assigned>,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<Result<()>>,
}

async fn candidate(store: &MemoryStore, name: &str, n: u32) -> Candidate {
    let store: Arc<dyn SessionStore> = Arc::new(store.clone());
    let session = Session::open(store.clone(), Identity::new(None, None, name), timing())
        .await
        .unwrap();
    let partitioner = Partitioner::new(session, "jobs", n, Duration::from_millis(500));
    let assigned = partitioner.assigned();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(partitioner.run(shutdown.clone()));
    Candidate {
        assigned,
        shutdown,
        task,
    }
}

/// Advances time in 100 ms steps for `span`, checking at each step that no
/// partition is claimed by two candidates; returns the counts at the end.
async fn run_for(candidates: &[&Candidate], span: Duration) -> Vec<usize> {
    let step = Duration::from_millis(100);
    let mut elapsed = Duration::ZERO;
    while elapsed < span {
        tokio::time::sleep(step).await;
        elapsed += step;
        let at = now();
        let mut claimed: BTreeMap<u32, usize> = BTreeMap::new();
        for (c, candidate) in candidates.iter().enumerate() {
            let assigned = candidate.assigned.borrow().clone();
            for index in assigned.partitions.keys() {
                if assigned.token_at(*index, at).is_some()
                    && let Some(other) = claimed.insert(*index, c)
                {
                    panic!("partition {index} claimed by candidates {other} and {c} at once");
                }
            }
        }
    }
    candidates
        .iter()
        .map(|c| c.assigned.borrow().partitions.len())
        .collect()
}

#[tokio::test(start_paused = true)]
async fn candidates_share_the_partitions_pick_up_a_dead_ones_and_hand_over_to_a_new_one() {
    let store = MemoryStore::new(3);
    let (a, b, c) = (
        candidate(&store, "a", 8).await,
        candidate(&store, "b", 8).await,
        candidate(&store, "c", 8).await,
    );
    let mut shares = run_for(&[&a, &b, &c], Duration::from_secs(5)).await;
    shares.sort();
    assert_eq!(shares, [2, 3, 3], "8 over 3");
    assert_eq!(a.assigned.borrow().members, 3);

    // c dies without a word (its task and session dropped, as kill -9).
    c.task.abort();
    let _ = c.task.await;
    let orphaned = c.assigned.borrow().partitions.clone();
    // Its session lives D = 6 s by the store's clock, then a poll (P = 1 s
    // with jitter) picks the orphans up.
    let shares = run_for(&[&a, &b], Duration::from_secs(8)).await;
    assert_eq!(shares, [4, 4]);
    for (index, token) in orphaned {
        let new = [&a, &b]
            .iter()
            .find_map(|x| x.assigned.borrow().partitions.get(&index).copied())
            .expect("orphan picked up");
        assert!(new > token, "partition {index}: token {new:?} not above {token:?}");
    }

    // d joins: quotas 3, 3, 2 by session id; a and b drain one each and
    // hand it over, nothing else moves.
    let before: Vec<BTreeMap<u32, FencingToken>> = [&a, &b]
        .iter()
        .map(|x| x.assigned.borrow().partitions.clone())
        .collect();
    let d = candidate(&store, "d", 8).await;
    let shares = run_for(&[&a, &b, &d], Duration::from_secs(5)).await;
    assert_eq!(shares, [3, 3, 2]);
    for (x, before) in [&a, &b].iter().zip(&before) {
        let after = x.assigned.borrow().partitions.clone();
        assert!(
            after.iter().all(|(i, t)| before.get(i) == Some(t)),
            "kept ones keep their token"
        );
    }

    // d shuts down: it stops claiming, drains, closes its session, and the
    // others pick its partitions up without waiting for D.
    d.shutdown.cancel();
    d.task.await.unwrap().unwrap();
    assert!(d.assigned.borrow().partitions.is_empty());
    let shares = run_for(&[&a, &b], Duration::from_secs(2)).await;
    assert_eq!(shares, [4, 4]);
    for x in [a, b] {
        x.shutdown.cancel();
        x.task.await.unwrap().unwrap();
    }
    let left = PartitionView::observe(&store, "jobs", 8).await.unwrap();
    assert_eq!((left.members.len(), left.unowned()), (0, 8), "closing frees everything");
}
