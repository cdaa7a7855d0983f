//! An exhaustive model check of the elector and the store (stateright),
//! for small bounds: 2–3 electors, every interleaving of their steps, message
//! delay (any order, any time), loss, and a store clock that runs ahead of
//! the electors' within what D − R absorbs.
//!
//! The model follows src/lease/elector.rs and the store contract in
//! src/lease/store.rs: acquire when the row is absent, free or expired by the
//! store's clock at commit; renew by check-and-set on holder and token; the
//! leader's deadline is send + R on its own clock; an elector that gave up on
//! a request (after R, as `bounded` does) ignores its reply, though the
//! request may still commit; a follower that sees itself as the live holder
//! (its earlier commit's reply was lost) confirms by renewing first.
//! Pauses need no action of their own: no elector is ever forced to step,
//! so every schedule in which one sits still (takes no reply, sends nothing)
//! while time passes is explored.
//!
//! Properties, checked in every reachable state: at most one elector
//! believes it leads at any instant (leader and before its deadline), and
//! acquisitions commit strictly increasing terms and tokens. A planted bug
//! (deadline from the reply, token from a local clock) yields a counterexample.
//!
//! With transfers (issue 35, docs/design.md "Transfer"), a leader may at any
//! moment hand over to the next elector: it stops claiming, then sends a
//! release that reserves the row for that elector until store time + D
//! (the cap). The release may be delayed or lost like any message. Checked
//! besides: no acquisition commits inside a reservation for anyone but its
//! target. Planted: the old leader keeps claiming after handing over; the
//! store lets a non-target acquire inside the window.

use stateright::{Checker, HasDiscoveries, Model, Property};

/// Lease duration D, renew deadline R, in ticks.
const D: u8 = 3;
const R: u8 = 1;
/// Acquisition commit timestamps: store tick × 16 + a counter, so several
/// acquisitions in one tick (at most one per elector) still get strictly
/// increasing timestamps without running ahead of the store clock (which
/// coarse ticks alone would do).
const SUBTICKS: u16 = 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Planted {
    /// deadline = receipt of the reply + R instead of send + R.
    DeadlineFromReply,
    /// The token is the requester's clock (elector 0's runs 6 ticks ahead).
    TokenFromLocalClock,
    /// A leader that hands over keeps claiming until its deadline.
    OldLeaderKeepsClaiming,
    /// The store's acquire ignores the reservation.
    NonTargetAcquiresInWindow,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Op {
    Acquire,
    Renew {
        token: u16,
    },
    /// A handover's release: check-and-set on the token, reserving the row
    /// for elector `to`. Sent without waiting for a reply.
    Release {
        token: u16,
        to: u8,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Reply {
    Granted {
        term: u8,
        token: u16,
    },
    Lost,
    /// Acquire found a live lease held by the requester itself: its own
    /// earlier commit whose reply it never saw (the elector learns this by
    /// observing; here the store says so).
    HeldByYou {
        token: u16,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Msg {
    /// `sent` (the tick) identifies the request: one outstanding per elector,
    /// and a new one only after giving up on the last, R ticks later.
    Request {
        from: u8,
        sent: u8,
        op: Op,
    },
    Reply {
        to: u8,
        sent: u8,
        reply: Reply,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Role {
    Follower,
    Leader { term: u8, token: u16, deadline: u8 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Pending {
    sent: u8,
    op: Op,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct ElectorState {
    role: Role,
    pending: Option<Pending>,
    /// Handed over: stands aside and campaigns no more. Without this the
    /// model found two leaders: a leader that handed over, acquired again
    /// while its release was in flight, was told the live lease was its own
    /// and confirmed it by a renewal, and then its release freed the row for
    /// the target (docs/design.md, "Transfer").
    aside: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
struct Row {
    holder: Option<u8>,
    term: u8,
    token: u16,
    renewed: u8,
    /// A handover's reservation: (target, store tick from which anyone may acquire).
    reserved: Option<(u8, u8)>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct State {
    now: u8,
    /// How far the store clock runs ahead of the electors' (never back).
    skew: u8,
    row: Row,
    last_commit: u16,
    electors: Vec<ElectorState>,
    /// Messages in flight, sorted: a bag.
    net: Vec<Msg>,
    /// An acquisition committed a term or token not above the previous one.
    regressed: bool,
    /// The handover releases committed, as (target, until): the record the
    /// reservation property judges acquisitions by, kept apart from the row.
    handoffs: Vec<(u8, u8)>,
    /// An acquisition committed inside a handoff's window by another elector.
    broke_reservation: bool,
    /// A handover's target acquired inside its window.
    handed_over: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Action {
    Tick,
    StoreClockRunsAhead,
    Send(u8, Op),
    /// The leader stands aside and releases for the next elector.
    HandOver(u8),
    GiveUp(u8),
    Deliver(Msg),
    Lose(Msg),
}

struct Election {
    electors: u8,
    max_time: u8,
    max_drift: u8,
    max_in_flight: usize,
    planted: Option<Planted>,
    transfers: bool,
}

impl Election {
    fn believes(&self, state: &State, i: usize) -> bool {
        matches!(state.electors[i].role, Role::Leader { deadline, .. } if state.now < deadline)
    }

    fn deadline(&self, sent: u8, received: u8) -> u8 {
        match self.planted {
            Some(Planted::DeadlineFromReply) => received + R,
            _ => sent + R,
        }
    }

    fn send(&self, state: &mut State, from: u8, op: Op) {
        state.electors[from as usize].pending = Some(Pending { sent: state.now, op });
        push(
            &mut state.net,
            Msg::Request {
                from,
                sent: state.now,
                op,
            },
        );
    }

    /// The store runs one transaction and answers.
    fn serve(&self, state: &mut State, from: u8, sent: u8, op: Op) {
        let clock = state.now + state.skew;
        let commit = if state.last_commit / SUBTICKS == u16::from(clock) {
            state.last_commit + 1
        } else {
            u16::from(clock) * SUBTICKS
        };
        let row = state.row;
        let live = row.holder.is_some() && clock <= row.renewed + D;
        let reserved_against = row.reserved.is_some_and(|(to, until)| {
            clock < until && to != from && self.planted != Some(Planted::NonTargetAcquiresInWindow)
        });
        let reply = match op {
            Op::Acquire if live && row.holder == Some(from) => Reply::HeldByYou { token: row.token },
            Op::Acquire if live || reserved_against => Reply::Lost,
            Op::Acquire => {
                if state.handoffs.iter().any(|&(to, until)| clock < until && to != from) {
                    state.broke_reservation = true;
                }
                if state.handoffs.iter().any(|&(to, until)| clock < until && to == from) {
                    state.handed_over = true;
                }
                let token = match self.planted {
                    Some(Planted::TokenFromLocalClock) if from == 0 => u16::from(sent + 6) * SUBTICKS,
                    Some(Planted::TokenFromLocalClock) => u16::from(sent) * SUBTICKS,
                    _ => commit,
                };
                if state.row.term > 0 && token <= row.token {
                    state.regressed = true;
                }
                state.row = Row {
                    holder: Some(from),
                    term: row.term + 1,
                    token,
                    renewed: clock,
                    reserved: None,
                };
                state.last_commit = commit;
                Reply::Granted {
                    term: row.term + 1,
                    token,
                }
            }
            Op::Renew { token } if row.holder == Some(from) && row.token == token => {
                // Only acquisitions need a timestamp of their own (the token).
                state.row.renewed = clock;
                Reply::Granted { term: row.term, token }
            }
            Op::Renew { .. } => Reply::Lost,
            Op::Release { token, to } => {
                if row.holder == Some(from) && row.token == token {
                    // The window capped at D from the release's commit.
                    let until = clock + D;
                    state.row.holder = None;
                    state.row.reserved = Some((to, until));
                    state.handoffs.push((to, until));
                }
                return; // nobody waits for the reply
            }
        };
        push(&mut state.net, Msg::Reply { to: from, sent, reply });
    }

    /// The elector takes the reply to its outstanding request.
    fn receive(&self, state: &mut State, to: u8, sent: u8, reply: Reply) {
        let now = state.now;
        let me = &mut state.electors[to as usize];
        let Some(pending) = me.pending.filter(|p| p.sent == sent) else {
            return; // a reply to a request it gave up on
        };
        me.pending = None;
        let deadline = self.deadline(pending.sent, now);
        match reply {
            Reply::Granted { term, token } => {
                me.role = if now < deadline {
                    Role::Leader { term, token, deadline }
                } else {
                    Role::Follower
                };
            }
            Reply::Lost => me.role = Role::Follower,
            Reply::HeldByYou { token } => {
                me.role = Role::Follower;
                if state.net.len() < self.max_in_flight {
                    self.send(state, to, Op::Renew { token });
                }
            }
        }
    }
}

fn push(net: &mut Vec<Msg>, msg: Msg) {
    let at = net.partition_point(|m| *m < msg);
    net.insert(at, msg);
}

fn remove(net: &mut Vec<Msg>, msg: Msg) {
    if let Some(at) = net.iter().position(|m| *m == msg) {
        net.remove(at);
    }
}

impl Model for Election {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            now: 0,
            skew: 0,
            row: Row::default(),
            last_commit: 0,
            electors: vec![
                ElectorState {
                    role: Role::Follower,
                    pending: None,
                    aside: false,
                };
                self.electors as usize
            ],
            net: Vec::new(),
            regressed: false,
            handoffs: Vec::new(),
            broke_reservation: false,
            handed_over: false,
        }]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        if state.now < self.max_time {
            actions.push(Action::Tick);
        }
        if state.skew < self.max_drift {
            actions.push(Action::StoreClockRunsAhead);
        }
        for (i, e) in state.electors.iter().enumerate() {
            let i = i as u8;
            match e.pending {
                Some(p) if state.now >= p.sent + R => actions.push(Action::GiveUp(i)),
                Some(_) => {}
                None if state.net.len() < self.max_in_flight => match e.role {
                    Role::Follower if !e.aside => actions.push(Action::Send(i, Op::Acquire)),
                    Role::Follower => {}
                    Role::Leader { token, .. } => {
                        actions.push(Action::Send(i, Op::Renew { token }));
                        if self.transfers && state.handoffs.is_empty() {
                            actions.push(Action::HandOver(i));
                        }
                    }
                },
                None => {}
            }
        }
        for msg in &state.net {
            actions.push(Action::Deliver(*msg));
            actions.push(Action::Lose(*msg));
        }
        actions.dedup();
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut state = last.clone();
        match action {
            Action::Tick => {
                state.now += 1;
                // The deadline timer: past it the elector stops claiming.
                for e in &mut state.electors {
                    if matches!(e.role, Role::Leader { deadline, .. } if state.now >= deadline) {
                        e.role = Role::Follower;
                    }
                }
            }
            Action::StoreClockRunsAhead => state.skew += 1,
            Action::Send(i, op) => self.send(&mut state, i, op),
            Action::HandOver(i) => {
                let me = &mut state.electors[i as usize];
                let Role::Leader { token, .. } = me.role else {
                    return None;
                };
                // Stand aside first: stop claiming, then release.
                if self.planted != Some(Planted::OldLeaderKeepsClaiming) {
                    me.role = Role::Follower;
                }
                me.aside = true;
                let to = (i + 1) % self.electors;
                push(
                    &mut state.net,
                    Msg::Request {
                        from: i,
                        sent: state.now,
                        op: Op::Release { token, to },
                    },
                );
            }
            Action::GiveUp(i) => state.electors[i as usize].pending = None,
            Action::Lose(msg) => remove(&mut state.net, msg),
            Action::Deliver(msg) => {
                remove(&mut state.net, msg);
                match msg {
                    Msg::Request { from, sent, op } => self.serve(&mut state, from, sent, op),
                    Msg::Reply { to, sent, reply } => self.receive(&mut state, to, sent, reply),
                }
            }
        }
        Some(state)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let mut properties = vec![
            Property::always(
                "at most one elector believes it leads",
                |model: &Election, s: &State| (0..s.electors.len()).filter(|&i| model.believes(s, i)).count() <= 1,
            ),
            Property::always("terms and tokens strictly increase", |_, s: &State| !s.regressed),
            Property::always("only the target acquires inside a reservation", |_, s: &State| {
                !s.broke_reservation
            }),
            Property::sometimes("an elector leads", |model: &Election, s: &State| {
                (0..s.electors.len()).any(|i| model.believes(s, i))
            }),
            Property::sometimes("a second term is granted", |_, s: &State| s.row.term >= 2),
        ];
        if self.transfers {
            properties.push(Property::sometimes("a handover's target leads", |_, s: &State| {
                s.handed_over
            }));
        }
        properties
    }
}

/// Store clock up to D − R − 1 ticks ahead: within what the gap absorbs.
fn election(electors: u8, max_time: u8, planted: Option<Planted>) -> Election {
    Election {
        electors,
        max_time,
        max_drift: D - R - 1,
        max_in_flight: 2,
        planted,
        transfers: false,
    }
}

/// [`election`] where a leader may hand over (once per run, to bound the
/// state space).
fn with_transfers(electors: u8, max_time: u8, planted: Option<Planted>) -> Election {
    Election {
        transfers: true,
        ..election(electors, max_time, planted)
    }
}

fn check(model: Election) -> impl Checker<Election> {
    model.checker().threads(2).spawn_bfs().join()
}

/// Stops at the first broken property.
fn hunt(model: Election) -> impl Checker<Election> {
    model
        .checker()
        .threads(2)
        .finish_when(HasDiscoveries::AnyFailures)
        .spawn_bfs()
        .join()
}

fn report(name: &str, checker: &impl Checker<Election>) {
    println!(
        "{name}: {} states ({} unique), depth {}",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth()
    );
}

/// Long enough for a lease to expire and a second term to be granted.
#[test]
fn two_electors_over_five_ticks_are_safe_in_every_reachable_state() {
    let checker = check(election(2, 5, None));
    report("2 electors, 5 ticks", &checker);
    // Both safety properties hold everywhere, and both examples were found.
    checker.assert_properties();
}

/// Three racing for the first term (a second needs more ticks than the
/// test budget allows: 4 ticks take minutes).
#[test]
fn three_electors_over_three_ticks_are_safe_in_every_reachable_state() {
    let checker = check(election(3, 3, None));
    report("3 electors, 3 ticks", &checker);
    checker.assert_no_discovery("at most one elector believes it leads");
    checker.assert_no_discovery("terms and tokens strictly increase");
    checker.assert_any_discovery("an elector leads");
}

#[test]
fn a_deadline_from_the_reply_is_caught() {
    let checker = hunt(election(2, 5, Some(Planted::DeadlineFromReply)));
    let path = checker.assert_any_discovery("at most one elector believes it leads");
    println!("counterexample: {:?}", path.into_actions());
}

#[test]
fn a_token_from_a_local_clock_is_caught() {
    let checker = hunt(election(2, 5, Some(Planted::TokenFromLocalClock)));
    let path = checker.assert_any_discovery("terms and tokens strictly increase");
    println!("counterexample: {:?}", path.into_actions());
}

/// Issue 35: handovers at any moment, their releases delayed or lost, on
/// top of everything above; the target leads in some run. Four ticks reach
/// a handover, the target's term and the window's end (D = 3).
#[test]
fn handovers_keep_one_leader_and_the_reservation_in_every_reachable_state() {
    let checker = check(with_transfers(2, 4, None));
    report("2 electors, 4 ticks, handovers", &checker);
    checker.assert_no_discovery("at most one elector believes it leads");
    checker.assert_no_discovery("terms and tokens strictly increase");
    checker.assert_no_discovery("only the target acquires inside a reservation");
    checker.assert_any_discovery("a handover's target leads");
}

#[test]
fn an_old_leader_that_keeps_claiming_after_handing_over_is_caught() {
    let checker = hunt(with_transfers(2, 5, Some(Planted::OldLeaderKeepsClaiming)));
    let path = checker.assert_any_discovery("at most one elector believes it leads");
    println!("counterexample: {:?}", path.into_actions());
}

#[test]
fn a_non_target_acquiring_inside_the_window_is_caught() {
    let checker = hunt(with_transfers(3, 3, Some(Planted::NonTargetAcquiresInWindow)));
    let path = checker.assert_any_discovery("only the target acquires inside a reservation");
    println!("counterexample: {:?}", path.into_actions());
}
