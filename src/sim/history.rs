//! The operator's leadership history under the elector schedule: an
//! observer reads the lock as the operator does (every few hundred ms, and
//! now and then not at all for seconds, as an operator that is down), turns
//! each read into entries with [`HistoryEntry::seen`] and folds them with
//! [`fold`], the operator's own code. The checker then holds the history
//! against the store's record of acquisitions: no term twice, in term order;
//! every term entry names a term the store granted, with its holder and
//! token; a term no read saw is inside a gap entry, never invented.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::{RngExt, SeedableRng, rngs::StdRng};

use super::mutants::Mutant;
use crate::api::history::{HistoryEntry, MAX_HISTORY_LIMIT, fold};
use crate::store::MemoryStore;
use crate::store::memory::Acquisition;

/// The history the observer has folded so far.
pub(super) type History = Arc<Mutex<Vec<HistoryEntry>>>;

/// Starts the observer of `lock` in `store`; it runs until the runtime
/// ends. Seeded apart from the schedule, and reading without the store's
/// faults, so the schedule's own draws are as without it.
pub(super) fn observe(store: MemoryStore, lock: &'static str, seed: u64, mutant: Option<Mutant>) -> History {
    let history = History::default();
    let folded = history.clone();
    tokio::spawn(async move {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x0415_7041);
        loop {
            let pause = match rng.random_bool(0.05) {
                // The operator is down (or restarting) for a while.
                true => Duration::from_millis(rng.random_range(1_000..6_000)),
                false => Duration::from_millis(rng.random_range(100..800)),
            };
            tokio::time::sleep(pause).await;
            let seen = HistoryEntry::seen(&store.peek(lock));
            let mut history = folded.lock().unwrap();
            *history = match mutant {
                Some(Mutant::HistoryRecordsATermTwice) => fold_by_entry(&history, seen),
                _ => fold(&history, seen, MAX_HISTORY_LIMIT),
            };
        }
    });
    history
}

/// The mutant's fold: keyed by the whole entry instead of by term, so a
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

/// What is wrong with `history` given the store's `acquisitions` of its
/// lock (in commit order), if anything.
pub(super) fn check(history: &[HistoryEntry], acquisitions: &[Acquisition]) -> Result<(), String> {
    for pair in history.windows(2) {
        let last = pair[0].missing_through.unwrap_or(pair[0].term);
        if pair[1].term <= last {
            return Err(format!(
                "the history records term {} after term {last}: each term once, in term order",
                pair[1].term
            ));
        }
    }
    for entry in history {
        if let Some(through) = entry.missing_through {
            if !(entry.term..=through).all(|term| acquisitions.iter().any(|a| a.term == term)) {
                return Err(format!(
                    "the history's gap {}..={through} names a term the store never granted",
                    entry.term
                ));
            }
            continue;
        }
        let Some(granted) = acquisitions.iter().find(|a| a.term == entry.term) else {
            return Err(format!(
                "the history records term {}, which the store never granted",
                entry.term
            ));
        };
        let token = granted.token.map(|t| t.to_string());
        if entry.holder.as_ref().is_some_and(|h| *h != granted.holder) || entry.token.is_some() && entry.token != token
        {
            return Err(format!(
                "the history records term {} as {:?} with token {:?}; the store granted it to {} with token {token:?}",
                entry.term, entry.holder, entry.token, granted.holder
            ));
        }
    }
    Ok(())
}
