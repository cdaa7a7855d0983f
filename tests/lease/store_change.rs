//! Issue 40, exhaustively (stateright): a lease moved to another store by
//! deleting its `DistributedLease` and creating it again on the other store,
//! and back, while its candidates campaign. Every interleaving of the
//! candidates' steps, the user's delete and create, the operator's gate and
//! the watches' delays (a sidecar sees the deletion at any later point).
//!
//! The model follows `sidecar::retire` and `operator::reconcile::delete`:
//! a candidate campaigns on the store of the resource incarnation it read
//! at start (its uid); when its watch shows that incarnation no longer live
//! it stops claiming, then releases, then annotates its pod retired-from
//! that uid, then re-executes onto a newer incarnation once one exists (one
//! found being deleted makes it retire at once, never campaign). The
//! operator removes a deleted incarnation only when every candidate carries
//! the annotation and the incarnation's store shows no holder.
//!
//! Property: at no moment do two candidates claim (serve 200 on `/leader`),
//! on whatever stores. Planted: a sidecar that keeps leading on the old
//! store (it releases and annotates on retiring, but its claim is never
//! withdrawn), and the operator's old delete (the finalizer dropped at once,
//! "its sidecar releases on shutdown"): each yields two claimants. A sidecar
//! that ignores the retirement altogether never annotates, so the gate
//! keeps the deletion from completing: the move never happens, which the
//! last test shows.

use stateright::{Checker, HasDiscoveries, Model, Property};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Planted {
    /// On retiring, candidate 0's sidecar releases and annotates, but keeps claiming.
    KeepsLeadingOnOldStore,
    /// Candidate 0's sidecar ignores the retirement: never stops, releases or annotates.
    IgnoresRetirement,
    /// The operator drops the finalizer at once on delete.
    NoGate,
}

/// The `DistributedLease` named "scheduler": incarnation n lives on store n % 2.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Resource {
    Live(u8),
    Deleting(u8),
    Gone(u8),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Phase {
    Campaigning,
    /// Saw its incarnation go: stopped claiming, may still hold the row.
    Stopping,
    /// Released the row; the annotation comes next.
    Released,
    /// Annotated its pod retired-from its incarnation; waits to re-execute.
    Retired,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Candidate {
    /// The incarnation it read at start.
    bound: u8,
    phase: Phase,
    /// Serves 200 on `/leader`.
    claiming: bool,
    /// `leasehold.dev/retired-from` on its pod.
    retired_from: Option<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct State {
    resource: Resource,
    /// The holder of the lock on each store.
    holders: [Option<u8>; 2],
    candidates: Vec<Candidate>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Action {
    Acquire(u8),
    /// The candidate's watch delivers the resource as it is now.
    WatchSees(u8),
    Release(u8),
    Annotate(u8),
    Reexec(u8),
    UserDeletes,
    OperatorRemoves,
    UserCreates,
}

struct StoreChange {
    candidates: u8,
    /// Incarnations created in all: 3 is PostgreSQL → Kubernetes → PostgreSQL.
    incarnations: u8,
    planted: Option<Planted>,
}

fn store_of(incarnation: u8) -> usize {
    usize::from(incarnation % 2)
}

impl StoreChange {
    fn gate_open(&self, state: &State, incarnation: u8) -> bool {
        self.planted == Some(Planted::NoGate)
            || (state.holders[store_of(incarnation)].is_none()
                && state.candidates.iter().all(|c| c.retired_from == Some(incarnation)))
    }
}

impl Model for StoreChange {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let candidate = Candidate {
            bound: 0,
            phase: Phase::Campaigning,
            claiming: false,
            retired_from: None,
        };
        vec![State {
            resource: Resource::Live(0),
            holders: [None, None],
            candidates: vec![candidate; usize::from(self.candidates)],
        }]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        for (i, c) in (0u8..).zip(&state.candidates) {
            match c.phase {
                Phase::Campaigning => {
                    if !c.claiming && state.holders[store_of(c.bound)].is_none() {
                        actions.push(Action::Acquire(i));
                    }
                    if state.resource != Resource::Live(c.bound) {
                        actions.push(Action::WatchSees(i));
                    }
                }
                Phase::Stopping => actions.push(Action::Release(i)),
                Phase::Released => actions.push(Action::Annotate(i)),
                Phase::Retired => match state.resource {
                    Resource::Live(n) | Resource::Deleting(n) if n != c.bound => actions.push(Action::Reexec(i)),
                    _ => {}
                },
            }
        }
        match state.resource {
            Resource::Live(_) => actions.push(Action::UserDeletes),
            Resource::Deleting(n) if self.gate_open(state, n) => actions.push(Action::OperatorRemoves),
            Resource::Gone(n) if n + 1 < self.incarnations => actions.push(Action::UserCreates),
            _ => {}
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut state = last.clone();
        // Planted sidecar bugs are candidate 0's; the others are correct.
        let planted = |i: u8, bug: Planted| i == 0 && self.planted == Some(bug);
        match action {
            Action::Acquire(i) => {
                let c = &mut state.candidates[usize::from(i)];
                state.holders[store_of(c.bound)] = Some(i);
                c.claiming = true;
            }
            Action::WatchSees(i) if planted(i, Planted::IgnoresRetirement) => return None,
            Action::WatchSees(i) => {
                let c = &mut state.candidates[usize::from(i)];
                c.phase = Phase::Stopping;
                if !planted(i, Planted::KeepsLeadingOnOldStore) {
                    c.claiming = false;
                }
            }
            Action::Release(i) => {
                let c = &mut state.candidates[usize::from(i)];
                let holder = &mut state.holders[store_of(c.bound)];
                if *holder == Some(i) {
                    *holder = None;
                }
                c.phase = Phase::Released;
            }
            Action::Annotate(i) => {
                let c = &mut state.candidates[usize::from(i)];
                c.retired_from = Some(c.bound);
                c.phase = Phase::Retired;
            }
            Action::Reexec(i) => {
                let c = &mut state.candidates[usize::from(i)];
                // A fresh process: nothing claimed, bound to what it reads.
                c.claiming = false;
                match state.resource {
                    Resource::Live(n) => {
                        c.bound = n;
                        c.phase = Phase::Campaigning;
                    }
                    // Found being deleted at start: retires at once.
                    Resource::Deleting(n) => {
                        c.bound = n;
                        c.retired_from = Some(n);
                    }
                    Resource::Gone(_) => return None,
                }
            }
            Action::UserDeletes => {
                let Resource::Live(n) = state.resource else { return None };
                state.resource = Resource::Deleting(n);
            }
            Action::OperatorRemoves => {
                let Resource::Deleting(n) = state.resource else {
                    return None;
                };
                state.resource = Resource::Gone(n);
            }
            Action::UserCreates => {
                let Resource::Gone(n) = state.resource else { return None };
                state.resource = Resource::Live(n + 1);
            }
        }
        Some(state)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("at most one candidate claims", |_, s: &State| {
                s.candidates.iter().filter(|c| c.claiming).count() <= 1
            }),
            Property::sometimes(
                "a candidate leads on the last incarnation's store",
                |m: &StoreChange, s: &State| s.candidates.iter().any(|c| c.claiming && c.bound + 1 == m.incarnations),
            ),
        ]
    }
}

fn model(candidates: u8, incarnations: u8, planted: Option<Planted>) -> StoreChange {
    StoreChange {
        candidates,
        incarnations,
        planted,
    }
}

/// PostgreSQL → Kubernetes store → PostgreSQL with three candidates: never
/// two claimants, and the last store does get a leader.
#[test]
fn moving_a_lease_there_and_back_never_has_two_claimants() {
    let checker = model(3, 3, None).checker().threads(2).spawn_bfs().join();
    println!(
        "store change, 3 candidates, 3 incarnations: {} states ({} unique), depth {}",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth()
    );
    checker.assert_properties();
}

/// A sidecar that keeps leading on the old store (it releases and
/// annotates, but its claim stays), and the operator's old delete: each
/// gives a counterexample with two claimants.
#[test]
fn a_sidecar_that_keeps_leading_on_the_old_store_and_the_old_delete_are_caught() {
    for planted in [Planted::KeepsLeadingOnOldStore, Planted::NoGate] {
        let checker = model(2, 2, Some(planted))
            .checker()
            .threads(2)
            .finish_when(HasDiscoveries::AnyFailures)
            .spawn_bfs()
            .join();
        let path = checker.assert_any_discovery("at most one candidate claims");
        println!("{planted:?}: counterexample {:?}", path.into_actions());
    }
}

/// A sidecar deaf to the retirement never annotates its pod, so the gate
/// never opens: safe, but the move never happens (the delete waits, as the
/// lease's `Released=False` condition says, until its pod goes).
#[test]
fn a_sidecar_that_ignores_the_retirement_blocks_the_move_without_two_claimants() {
    let checker = model(2, 2, Some(Planted::IgnoresRetirement))
        .checker()
        .threads(2)
        .spawn_bfs()
        .join();
    checker.assert_no_discovery("at most one candidate claims");
    checker.assert_no_discovery("a candidate leads on the last incarnation's store");
}
