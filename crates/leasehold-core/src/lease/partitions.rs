//! Work partitioning: N partitions of one lock shared fairly by the live
//! sessions of its candidates, each partition a lock held through a
//! [`Session`].
//!
//! Layout, all plain session locks (so every store with sessions has it):
//! * partition `i` is the lock `<lock>/p/<i>`; its token fences the work on
//!   that partition;
//! * a candidate is a *member* while its session holds one of N member
//!   slots `<lock>/m/<j>`. M, the number of members, is read from the slots:
//!   a slot is held exactly while its session is live by the store's clock,
//!   so a killed candidate stops counting when its partitions come free,
//!   in the same read. More candidates than partitions would hold nothing
//!   anyway; the extra ones wait for a slot.
//!
//! Every candidate polls one consistent read of all 2N locks every P and
//! acts on its own share of one deterministic plan ([`plan`]):
//! * quotas: ⌊N/M⌋ each, one more for the first N mod M members by session
//!   id, so max − min ≤ 1 and nobody holds more than ⌈N/M⌉;
//! * a member above its quota stops claiming the extras (they leave the
//!   published set), waits the drain window and then releases them by
//!   check-and-set; it keeps the ones it ranks highest;
//! * free partitions go to members below their quota, each partition to the
//!   deficient member ranking it highest (rendezvous hashing), so members
//!   with the same read never race for the same partition, and a join moves
//!   only the partitions the new quotas need.
//!
//! A partition changes owner only through the store: its lock is taken only
//! when released or its session expired. Reads that disagree (members poll
//! at different moments) cost at most a busy answer and another poll.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info};

use super::clock::{Instant, Jitter, now};
use super::lock_set::{HeldSet, Session};
use super::record::{FencingToken, LockNameError, MAX_LOCK_NAME_BYTES, fnv1a_64, validate_lock_name};
use super::seams::PartitionFlaw;
use super::session::{LocksObservation, SessionStore};
use super::store::Result;

/// The most partitions one lock may have: slots and partitions together
/// (2N names) fit one store call ([`super::session::MAX_LOCKS_PER_CALL`]).
pub const MAX_PARTITIONS: u32 = 1024;

/// The longest suffix a partition or slot adds to the lock's name.
const MAX_SUFFIX_BYTES: usize = "/p/1023".len();

/// The lock of partition `index`.
pub fn partition_lock(lock: &str, index: u32) -> String {
    format!("{lock}/p/{index}")
}

/// The index of `name` when it is one of `lock`'s partitions: the inverse of
/// [`partition_lock`].
fn partition_index(lock: &str, name: &str) -> Option<u32> {
    name.strip_prefix(lock)?.strip_prefix("/p/")?.parse().ok()
}

/// The lock of member slot `slot`.
fn member_slot(lock: &str, slot: u32) -> String {
    format!("{lock}/m/{slot}")
}

/// A partitioned lock that cannot work; messages start with the field or
/// flag the value came from.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PartitionsError {
    #[error("{field} must be between 1 and {MAX_PARTITIONS}, not {count}")]
    Count { field: &'static str, count: u32 },
    #[error(
        "{field} is {len} bytes long; a partitioned lock's name is at most {} bytes (its partitions add a suffix such as \"/p/1023\")",
        MAX_LOCK_NAME_BYTES - MAX_SUFFIX_BYTES
    )]
    NameTooLong { field: &'static str, len: usize },
    #[error(transparent)]
    Name(#[from] LockNameError),
}

/// The one check of a partitioned lock, wherever its settings enter: the
/// sidecar's flags, the resource's spec, the library. `fields` name the
/// lock's and the count's field or flag.
pub fn validate_partitions(
    (lock_field, count_field): (&'static str, &'static str),
    lock: &str,
    count: u32,
) -> Result<(), PartitionsError> {
    validate_lock_name(lock_field, lock)?;
    if !(1..=MAX_PARTITIONS).contains(&count) {
        return Err(PartitionsError::Count {
            field: count_field,
            count,
        });
    }
    if lock.len() > MAX_LOCK_NAME_BYTES - MAX_SUFFIX_BYTES {
        return Err(PartitionsError::NameTooLong {
            field: lock_field,
            len: lock.len(),
        });
    }
    Ok(())
}

/// How much `member` wants `index`: a rendezvous-hash score, the same on
/// every candidate and every version (FNV-1a, then a 64-bit finaliser so
/// that nearby indexes spread).
fn score(index: u32, member: &str) -> u64 {
    let mut h = fnv1a_64(member.as_bytes()) ^ u64::from(index).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// One consistent read of a partitioned lock, by the store's clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionView {
    /// Live sessions holding a member slot, sorted.
    pub members: Vec<String>,
    /// Which slots are free.
    pub free_slots: Vec<u32>,
    /// Per partition: the live session holding it, if any.
    pub owners: Vec<Option<String>>,
    /// Per partition: the token of its last acquisition, if it was ever taken.
    pub tokens: Vec<Option<FencingToken>>,
}

impl PartitionView {
    /// Reads the N slots and N partitions of `lock` in one store call.
    pub async fn observe(store: &dyn SessionStore, lock: &str, partitions: u32) -> Result<PartitionView> {
        let observed = store.observe_locks(&Self::names(lock, partitions)).await?;
        Ok(Self::from_observation(partitions, observed))
    }

    /// Reads several partitioned locks, `(lock, partitions)` each, in one
    /// store call ([`SessionStore::observe_lock_sets`]): their slots and
    /// partitions together are at most [`super::session::MAX_LOCKS_PER_CALL`]
    /// names (see [`Self::names_read`]).
    pub async fn observe_many(store: &dyn SessionStore, locks: &[(String, u32)]) -> Result<Vec<PartitionView>> {
        let sets: Vec<Vec<String>> = locks.iter().map(|(lock, n)| Self::names(lock, *n)).collect();
        let observed = store.observe_lock_sets(&sets).await?;
        Ok(locks
            .iter()
            .zip(observed)
            .map(|((_, n), observed)| Self::from_observation(*n, observed))
            .collect())
    }

    /// How many names a read of a lock with `partitions` covers.
    pub fn names_read(partitions: u32) -> usize {
        2 * partitions as usize
    }

    /// The locks one read covers: the N slots, then the N partitions.
    fn names(lock: &str, partitions: u32) -> Vec<String> {
        (0..partitions)
            .map(|j| member_slot(lock, j))
            .chain((0..partitions).map(|i| partition_lock(lock, i)))
            .collect()
    }

    fn from_observation(partitions: u32, LocksObservation { locks, .. }: LocksObservation) -> PartitionView {
        let (slots, parts) = locks.split_at(partitions as usize);
        let members: BTreeSet<String> = slots.iter().filter_map(|s| s.holder.clone()).collect();
        PartitionView {
            members: members.into_iter().collect(),
            free_slots: (0..partitions)
                .filter(|j| slots[*j as usize].holder.is_none())
                .collect(),
            owners: parts.iter().map(|p| p.holder.clone()).collect(),
            tokens: parts.iter().map(|p| p.token).collect(),
        }
    }

    /// The quota of `member`: 0 unless it is a member.
    pub fn quota(&self, member: &str) -> usize {
        let Some(rank) = self.members.iter().position(|m| m == member) else {
            return 0;
        };
        let (n, m) = (self.owners.len(), self.members.len());
        n / m + usize::from(rank < n % m)
    }

    /// How many partitions each member holds (members holding none too).
    pub fn held_by_member(&self) -> BTreeMap<&str, usize> {
        let mut held: BTreeMap<&str, usize> = self.members.iter().map(|m| (m.as_str(), 0)).collect();
        for owner in self.owners.iter().flatten() {
            if let Some(count) = held.get_mut(owner.as_str()) {
                *count += 1;
            }
        }
        held
    }

    /// The most partitions a member holds minus the fewest; 0 without members.
    pub fn balance(&self) -> usize {
        let held = self.held_by_member();
        match (held.values().max(), held.values().min()) {
            (Some(max), Some(min)) => max - min,
            _ => 0,
        }
    }

    /// Partitions no live session holds.
    pub fn unowned(&self) -> usize {
        self.owners.iter().filter(|o| o.is_none()).count()
    }
}

/// What one member should do after a read.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Plan {
    /// Free partitions the plan gives this member.
    pub take: Vec<u32>,
    /// Partitions above its quota, to drain and release.
    pub release: Vec<u32>,
}

/// This member's share of the plan every member computes from `view`.
pub fn plan(view: &PartitionView, me: &str) -> Plan {
    let owned_by = |member: &str| -> Vec<u32> {
        (0..view.owners.len() as u32)
            .filter(|i| view.owners[*i as usize].as_deref() == Some(member))
            .collect()
    };
    let mine = owned_by(me);
    let quota = view.quota(me);
    if mine.len() > quota {
        let mut ranked = mine;
        ranked.sort_by_key(|i| std::cmp::Reverse(score(*i, me)));
        return Plan {
            take: Vec::new(),
            release: ranked.split_off(quota),
        };
    }
    // Free partitions to members below quota, each to the one that ranks it
    // highest among those still short.
    let held = view.held_by_member();
    let mut short: BTreeMap<&str, usize> = held
        .iter()
        .filter_map(|(m, n)| view.quota(m).checked_sub(*n).filter(|d| *d > 0).map(|d| (*m, d)))
        .collect();
    let mut take = Vec::new();
    for index in (0..view.owners.len() as u32).filter(|i| view.owners[*i as usize].is_none()) {
        let Some(winner) = short.keys().copied().max_by_key(|m| (score(index, m), *m)) else {
            break;
        };
        if winner == me {
            take.push(index);
        }
        let left = short.get_mut(winner).expect("a short member");
        *left -= 1;
        if *left == 0 {
            short.remove(winner);
        }
    }
    Plan {
        take,
        release: Vec::new(),
    }
}

/// The slot a non-member tries next: the free one it ranks highest, so
/// candidates joining at once mostly try different slots.
fn slot_to_try(view: &PartitionView, me: &str) -> Option<u32> {
    view.free_slots.iter().copied().max_by_key(|j| score(*j, me))
}

/// The partitions this candidate may work on now, as published.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Assigned {
    /// The session they are held through (empty before it opens).
    pub session: String,
    /// Held partitions with their tokens; empty past the session's deadline
    /// and without the ones being drained.
    pub partitions: BTreeMap<u32, FencingToken>,
    /// The session's deadline: claim nothing at or after it.
    pub deadline: Option<Instant>,
    /// Members in the last read (0 before the first).
    pub members: usize,
}

impl Assigned {
    /// The token of partition `index` if it may be worked on at `at`.
    pub fn token_at(&self, index: u32, at: Instant) -> Option<FencingToken> {
        self.deadline
            .filter(|d| at < *d)
            .and(self.partitions.get(&index).copied())
    }
}

/// A candidate taking part in a partitioned lock through its own session.
pub struct Partitioner {
    lock: String,
    partitions: u32,
    drain: Duration,
    session: Session,
    jitter: Jitter,
    draining: watch::Sender<BTreeSet<u32>>,
    members: watch::Sender<usize>,
    flaw: Option<PartitionFlaw>,
}

impl Partitioner {
    /// Takes part in `lock`'s `partitions` through `session`. `drain` is how
    /// long a partition stays unclaimed before it is released to another
    /// member.
    pub fn new(session: Session, lock: &str, partitions: u32, drain: Duration) -> Self {
        let jitter = Jitter::new(session.timing().jitter, None);
        Partitioner {
            lock: lock.to_string(),
            partitions,
            drain,
            session,
            jitter,
            draining: watch::channel(BTreeSet::new()).0,
            members: watch::channel(0).0,
            flaw: None,
        }
    }

    /// Seeds the poll jitter, so a simulation replays exactly, and plants
    /// `flaw` ([`super::seams`]).
    #[doc(hidden)]
    pub fn simulated(mut self, seed: u64, flaw: Option<PartitionFlaw>) -> Self {
        self.jitter = Jitter::new(self.session.timing().jitter, Some(seed));
        self.flaw = flaw;
        self
    }

    /// What may be worked on, updated on every change (a new partition, one
    /// drained, the session's deadline).
    pub fn assigned(&self) -> watch::Receiver<Assigned> {
        let (tx, rx) = watch::channel(Assigned::default());
        tokio::spawn(publish_assigned(
            self.lock.clone(),
            self.session.held(),
            self.draining.subscribe(),
            self.members.subscribe(),
            tx,
        ));
        rx
    }

    /// Polls and acts every P (jittered) until `shutdown`; then stops
    /// claiming everything, waits the drain window and closes the session,
    /// which frees every partition at once.
    pub async fn run(mut self, shutdown: CancellationToken) -> Result<()> {
        let period = self.session.timing().retry_period;
        let mut held = self.session.held();
        loop {
            if let Err(e) = self.step(&shutdown).await {
                debug!(lock = %self.lock, error = %e.chain(), "partitions: poll failed; retrying");
            }
            let next = now() + self.jitter.apply(period);
            // Biased: an unbiased select draws from an unseeded source, and
            // simulations must replay.
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep_until(next) => {}
                // A new session (the old one expired) holds nothing: rejoin at once.
                _ = held.wait_for(|h| h.locks.is_empty()), if !held.borrow().locks.is_empty() => {}
            }
        }
        let all: BTreeSet<u32> = (0..self.partitions).collect();
        self.draining.send_replace(all);
        info!(lock = %self.lock, drain = ?self.drain, "partitions: stopped claiming; draining before the release");
        tokio::time::sleep(self.drain).await;
        self.session.close().await
    }

    /// Reads the partitions through the session: one store call of it at a
    /// time, bounded by R, so a read that never answers cannot stall the
    /// member for good.
    async fn observe(&self) -> Result<PartitionView> {
        let names = PartitionView::names(&self.lock, self.partitions);
        let observed = self.session.observe_locks(&names).await?;
        Ok(PartitionView::from_observation(self.partitions, observed))
    }

    /// The locks of partitions `indexes`.
    fn locks_of(&self, indexes: &[u32]) -> Vec<String> {
        indexes.iter().map(|i| partition_lock(&self.lock, *i)).collect()
    }

    /// One poll: join if not a member, then take and release per the plan.
    async fn step(&mut self, shutdown: &CancellationToken) -> Result<()> {
        let me = self.session.id();
        let mut view = self.observe().await?;
        if !view.members.contains(&me) {
            let Some(slot) = slot_to_try(&view, &me) else {
                self.members.send_replace(view.members.len());
                return Ok(());
            };
            let got = self.session.try_lock_many(&[member_slot(&self.lock, slot)]).await?;
            if got.taken.is_empty() {
                return Ok(());
            }
            info!(lock = %self.lock, slot, session = %me, "partitions: joined as a member");
            view = self.observe().await?;
        }
        self.members.send_replace(view.members.len());
        // Level-triggered: partitions the store says this session holds but
        // the session does not know of (a batch whose reply was lost took
        // them) are confirmed by asking again, so they can be worked on or
        // handed over.
        let known = self.session.held().borrow().locks.clone();
        let unconfirmed: Vec<String> = (0..self.partitions)
            .filter(|i| view.owners[*i as usize].as_deref() == Some(me.as_str()))
            .map(|i| partition_lock(&self.lock, i))
            .filter(|name| !known.contains_key(name))
            .collect();
        if !unconfirmed.is_empty() {
            self.session.try_lock_many(&unconfirmed).await?;
        }
        let Plan { take, mut release } = plan(&view, &me);
        if self.flaw == Some(PartitionFlaw::ExtrasKept) {
            release.clear();
        }
        if !release.is_empty() {
            info!(lock = %self.lock, partitions = ?release, members = view.members.len(), "partitions: handing over extras");
            self.draining.send_modify(|d| d.extend(release.iter().copied()));
            tokio::select! {
                biased;
                _ = tokio::time::sleep(self.drain) => {}
                _ = shutdown.cancelled() => return Ok(()),
            }
            let released = self.session.release(&self.locks_of(&release)).await;
            self.draining.send_modify(|d| d.retain(|i| !release.contains(i)));
            released?;
        }
        if !take.is_empty() {
            let got = self.session.try_lock_many(&self.locks_of(&take)).await?;
            if !got.busy.is_empty() {
                debug!(lock = %self.lock, busy = got.busy.len(), "partitions: some free partitions were taken first; retrying at the next poll");
            }
        }
        Ok(())
    }
}

/// Publishes the held partitions: the session's held set (which empties at
/// its deadline) without slots and without the ones being drained.
async fn publish_assigned(
    lock: String,
    mut held: watch::Receiver<HeldSet>,
    mut draining: watch::Receiver<BTreeSet<u32>>,
    mut members: watch::Receiver<usize>,
    tx: watch::Sender<Assigned>,
) {
    loop {
        let assigned = {
            let (held, draining) = (held.borrow_and_update(), draining.borrow_and_update());
            Assigned {
                session: held.session.clone(),
                partitions: held
                    .locks
                    .iter()
                    .filter_map(|(name, token)| Some((partition_index(&lock, name)?, *token)))
                    .filter(|(i, _)| !draining.contains(i))
                    .collect(),
                deadline: held.deadline,
                members: *members.borrow_and_update(),
            }
        };
        tx.send_if_modified(|current| std::mem::replace(current, assigned.clone()) != assigned);
        tokio::select! {
            biased;
            r = held.changed() => if r.is_err() { return },
            r = draining.changed() => if r.is_err() { return },
            r = members.changed() => if r.is_err() { return },
            _ = tx.closed() => return,
        }
    }
}

#[cfg(test)]
mod tests;
