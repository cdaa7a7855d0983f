//! The operator's leadership history under the elector schedule: an
//! observer reads the lock as the operator does (every few hundred ms, and
//! now and then not at all for seconds, as an operator that is down), turns
//! each read into entries with [`HistoryEntry::seen`] and folds them with
//! [`fold`], the operator's own code. The checker then holds the history
//! against the store's record of acquisitions: no term twice, in term order;
//! every term entry names a term the store granted, with its holder and
//! token; a term no read saw is inside a gap entry, never invented; a store
//! that counts terms again (a Lease deleted and created again) starts a new
//! run of terms, never merged into the old ones; the history ends with the
//! term the store holds.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::{RngExt, SeedableRng, rngs::StdRng};

use super::mutants::Mutant;
use leasehold_core::lease::Observation;
use leasehold_core::store::memory::Acquisition;
use leasehold_kubernetes::api::history::{HistoryEntry, MAX_HISTORY_LIMIT, fold};

/// One read of the lock as the operator makes it: of the store as it is,
/// without the faults or a link (so the schedule's own draws are as without
/// the observer).
pub(super) type Read = Arc<dyn Fn() -> Observation + Send + Sync>;

/// The operator's view of the lock: what it read, folded.
#[derive(Clone)]
pub(super) struct Observer {
    read: Read,
    mutant: Option<Mutant>,
    history: Arc<Mutex<Vec<HistoryEntry>>>,
}

/// The history when the schedule ended, and the token of the term the store
/// held then (a last read's), which the history must end with.
pub(super) struct Folded {
    pub(super) history: Vec<HistoryEntry>,
    pub(super) last_token: Option<String>,
}

impl Observer {
    /// Starts the observer; it reads until the runtime ends. Seeded apart
    /// from the schedule.
    pub(super) fn start(read: Read, seed: u64, mutant: Option<Mutant>) -> Self {
        let observer = Observer {
            read,
            mutant,
            history: Arc::default(),
        };
        let reading = observer.clone();
        tokio::spawn(async move {
            let mut rng = StdRng::seed_from_u64(seed ^ 0x0415_7041);
            loop {
                let pause = match rng.random_bool(0.05) {
                    // The operator is down (or restarting) for a while.
                    true => Duration::from_millis(rng.random_range(1_000..6_000)),
                    false => Duration::from_millis(rng.random_range(100..800)),
                };
                tokio::time::sleep(pause).await;
                reading.fold_in();
            }
        });
        observer
    }

    /// Reads once and folds what it read; returns the read.
    fn fold_in(&self) -> Observation {
        let observed = (self.read)();
        let seen = HistoryEntry::seen(&observed);
        let mut history = self.history.lock().unwrap();
        *history = match self.mutant {
            Some(Mutant::HistoryRecordsATermTwice) => fold_by_entry(&history, seen),
            Some(Mutant::HistoryMergesRecountedTerms) => fold_by_term(&history, seen),
            _ => fold(&history, seen, MAX_HISTORY_LIMIT),
        };
        observed
    }

    /// A last read, and the history as folded.
    pub(super) fn finish(&self) -> Folded {
        let last = self.fold_in();
        Folded {
            history: std::mem::take(&mut *self.history.lock().unwrap()),
            last_token: last.record.and_then(|r| r.token).map(|t| t.to_string()),
        }
    }
}

/// A mutant's fold: keyed by the whole entry instead of by term, so a
/// term read again after a renewal (a later time) is recorded again.
fn fold_by_entry(previous: &[HistoryEntry], seen: Vec<HistoryEntry>) -> Vec<HistoryEntry> {
    let mut history = previous.to_vec();
    for entry in seen {
        if !history.contains(&entry) {
            history.push(entry);
        }
    }
    history
}

/// A mutant's fold: keyed by term alone, so the terms of a Lease created
/// again, counted from 1, land on the old entries of those numbers.
fn fold_by_term(previous: &[HistoryEntry], seen: Vec<HistoryEntry>) -> Vec<HistoryEntry> {
    let mut terms: BTreeMap<u64, HistoryEntry> = previous.iter().map(|e| (e.term, e.clone())).collect();
    for entry in seen {
        terms.entry(entry.term).or_insert(entry);
    }
    terms.into_values().collect()
}

/// What is wrong with the folded history given the store's `claims` of its
/// lock: the writes that began a term, in commit order (the acquisitions,
/// with a token; on the Kubernetes model also a create, without one, which
/// the check-and-set after it grants under the same term).
///
/// A store may count terms again (a Lease deleted and created again), so a
/// term is placed by its run and number: runs follow the claims, a new one
/// where a term goes back, or repeats after a grant. A history entry with a
/// token is placed by that token's grant; one without (a gap, an end the
/// record kept for a term no read saw, a created term not yet granted) in
/// the run of the next entry that has one.
pub(super) fn check(folded: &Folded, claims: &[Acquisition]) -> Result<(), String> {
    let history = &folded.history;
    let mut runs = Vec::with_capacity(claims.len());
    for (i, a) in claims.iter().enumerate() {
        let run = match i.checked_sub(1).map(|p| (runs[p], &claims[p])) {
            Some((run, before)) if a.term < before.term || a.term == before.term && before.token.is_some() => run + 1,
            Some((run, _)) => run,
            None => 0,
        };
        runs.push(run);
    }
    let token_of = |a: &Acquisition| a.token.map(|t| t.to_string());
    let mut placed: Vec<(usize, &HistoryEntry)> = Vec::with_capacity(history.len());
    let mut next_run = runs.last().copied().unwrap_or(0);
    for entry in history.iter().rev() {
        if let Some(token) = &entry.token {
            let Some(i) = claims.iter().position(|a| token_of(a).as_ref() == Some(token)) else {
                return Err(format!(
                    "the history records term {} with token {token}, which the store never granted",
                    entry.term
                ));
            };
            let granted = &claims[i];
            if granted.term != entry.term || entry.holder.as_ref().is_some_and(|h| *h != granted.holder) {
                return Err(format!(
                    "the history records term {} as {:?} with token {token}; the store granted that token to {} in term {}",
                    entry.term, entry.holder, granted.holder, granted.term
                ));
            }
            next_run = runs[i];
        }
        placed.push((next_run, entry));
    }
    placed.reverse();
    for pair in placed.windows(2) {
        let ((run, before), (next_run, after)) = (pair[0], pair[1]);
        let last = before.missing_through.unwrap_or(before.term);
        if (next_run, after.term) <= (run, last) {
            return Err(format!(
                "the history records term {} after term {last}: each term once, in order",
                after.term
            ));
        }
    }
    for &(run, entry) in &placed {
        let through = entry.missing_through.unwrap_or(entry.term);
        let granted = |term| (0..claims.len()).any(|i| runs[i] == run && claims[i].term == term);
        if let Some(term) = (entry.term..=through).find(|&term| !granted(term)) {
            return Err(match entry.is_gap() {
                true => format!(
                    "the history's gap {}..={through} names term {term}, which no write of the store began",
                    entry.term
                ),
                false => format!("the history records term {term}, which no write of the store began"),
            });
        }
    }
    // The last read saw the store's current term: the history ends with it.
    if let Some(token) = &folded.last_token
        && history.last().and_then(|e| e.token.as_ref()) != Some(token)
    {
        return Err(format!(
            "the history ends with {:?}; the last read saw the term of token {token}",
            history.last()
        ));
    }
    Ok(())
}
