//! `status.history`: the last terms of a lock, folded from what the operator
//! reads in the store (docs/design.md, "Leadership history").
//!
//! The fold is keyed by term, so a term seen on many reads is one entry; a
//! term the operator never saw (it was down, or the term was shorter than a
//! requeue) is a gap entry naming the missing terms, never an invented term.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::lease::{LeaseRecord, Observation};

/// Entries `status.history` keeps unless `spec.historyLimit` says otherwise.
pub const DEFAULT_HISTORY_LIMIT: u32 = 10;
/// The most `spec.historyLimit` may ask for: the status stays small.
pub const MAX_HISTORY_LIMIT: u32 = 100;

/// Why a term ended, as the store shows it.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, JsonSchema)]
pub enum TermEnd {
    /// The holder's release check-and-set cleared the holder.
    Released,
    /// The holder's release reserved the lease for a transfer target.
    Transferred,
    /// No renewal within the lease duration, by the store's clock.
    Expired,
}

/// One term of the lock, or a gap of terms the operator never saw.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = super::unsigned_as_int64)]
pub struct HistoryEntry {
    /// The term; for a gap, the first missing term.
    pub term: u64,
    /// Gaps only: the last missing term. Those terms happened, but no read
    /// of the operator saw them, so nothing about them is known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub missing_through: Option<u64>,
    /// The identity that held the term, when a read saw it held.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
    /// The term's fencing token, as a decimal string (like `status.token`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// The store's time of the earliest write of this term the operator
    /// read (RFC 3339): the acquisition when a read came before the first
    /// renewal, otherwise a renewal, so at or after the acquisition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acquired_at: Option<String>,
    /// When the term ended by the store's clock (RFC 3339): the expiry
    /// (last renewal + lease duration); absent where the store keeps no time
    /// of the release.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<String>,
    /// Why the term ended, when a read saw it end; absent while it lasts
    /// and when the next term replaced it before any read saw it end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended: Option<TermEnd>,
}

impl HistoryEntry {
    /// A gap entry: terms `first..=last` happened unseen.
    pub fn is_gap(&self) -> bool {
        self.missing_through.is_some()
    }

    /// What one read of the store says about its current (or last) term;
    /// `None` before the first acquisition (term 0).
    pub fn seen(observed: &Observation) -> Option<HistoryEntry> {
        let record: &LeaseRecord = observed.record.as_ref().filter(|r| r.term > 0)?;
        let ended = match (&record.holder, observed.live_holder()) {
            (_, Some(_)) => None,
            (None, None) if record.reservation.is_some() => Some(TermEnd::Transferred),
            (None, None) => Some(TermEnd::Released),
            (Some(_), None) => Some(TermEnd::Expired),
        };
        Some(HistoryEntry {
            term: record.term,
            missing_through: None,
            holder: record.holder.clone(),
            token: record.token.map(|t| t.to_string()),
            acquired_at: record.renewed_at.map(|t| t.to_rfc3339()),
            ended_at: match ended {
                Some(TermEnd::Expired) => record.expires_at().map(|t| t.to_rfc3339()),
                _ => None,
            },
            ended,
        })
    }

    /// Adds what a later read says about the same term: fields stay as first
    /// seen (the earliest time, the holder before a release cleared it); the
    /// end follows the latest read, except that a release is final (a lease
    /// judged expired may still be renewed by its holder if nobody took it).
    fn merge(&mut self, later: HistoryEntry) {
        self.holder = self.holder.take().or(later.holder);
        self.token = self.token.take().or(later.token);
        self.acquired_at = self.acquired_at.take().or(later.acquired_at);
        if !matches!(self.ended, Some(TermEnd::Released | TermEnd::Transferred)) {
            self.ended = later.ended;
            self.ended_at = later.ended_at;
        }
    }
}

/// `previous` with `seen` folded in: one entry per term in term order, a gap
/// entry where terms between two known ones are missing, at most `limit`
/// entries (the newest).
pub fn fold(previous: &[HistoryEntry], seen: Option<HistoryEntry>, limit: u32) -> Vec<HistoryEntry> {
    let mut terms = std::collections::BTreeMap::<u64, HistoryEntry>::new();
    for entry in previous.iter().filter(|e| !e.is_gap()).cloned().chain(seen) {
        match terms.get_mut(&entry.term) {
            Some(known) => known.merge(entry),
            None => {
                terms.insert(entry.term, entry);
            }
        }
    }
    let mut history = Vec::with_capacity(terms.len());
    let mut next = None;
    for (term, entry) in terms {
        if let Some(first) = next.filter(|&first| first < term) {
            history.push(HistoryEntry {
                term: first,
                missing_through: Some(term - 1),
                ..HistoryEntry::default()
            });
        }
        next = Some(term + 1);
        history.push(entry);
    }
    let keep = usize::try_from(limit).unwrap_or(usize::MAX);
    history.split_off(history.len().saturating_sub(keep))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn term(term: u64, holder: &str, ended: Option<TermEnd>) -> HistoryEntry {
        HistoryEntry {
            term,
            holder: Some(holder.into()),
            token: Some(format!("{}", term * 100)),
            acquired_at: Some(format!("2026-11-26T22:00:{term:02}Z")),
            ended,
            ..HistoryEntry::default()
        }
    }

    fn terms(history: &[HistoryEntry]) -> Vec<(u64, Option<u64>)> {
        history.iter().map(|e| (e.term, e.missing_through)).collect()
    }

    #[test]
    fn a_term_seen_on_many_reads_is_recorded_once_with_its_first_time() {
        let mut history = fold(&[], Some(term(1, "a", None)), 10);
        let mut later = term(1, "a", None);
        later.acquired_at = Some("2026-11-26T22:05:00Z".into());
        history = fold(&history, Some(later), 10);
        history = fold(&history, Some(term(1, "a", None)), 10);
        assert_eq!(terms(&history), [(1, None)]);
        assert_eq!(history[0].acquired_at.as_deref(), Some("2026-11-26T22:00:01Z"));
    }

    #[test]
    fn terms_are_kept_in_term_order_whatever_order_they_are_folded_in() {
        let history = fold(&[term(3, "c", None)], Some(term(2, "b", Some(TermEnd::Released))), 10);
        assert_eq!(terms(&history), [(2, None), (3, None)]);
    }

    #[test]
    fn unseen_terms_are_a_gap_entry_not_invented_terms() {
        let history = fold(&[term(2, "a", None)], Some(term(6, "b", None)), 10);
        assert_eq!(terms(&history), [(2, None), (3, Some(5)), (6, None)]);
        let gap = &history[1];
        assert!(gap.is_gap());
        assert_eq!((&gap.holder, &gap.token, gap.ended), (&None, &None, None));
        // Folding again recomputes the gap, never doubles it.
        let again = fold(&history, Some(term(6, "b", None)), 10);
        assert_eq!(again, history);
    }

    #[test]
    fn the_oldest_entries_go_beyond_the_limit() {
        let mut history = Vec::new();
        for n in 1..=12 {
            history = fold(&history, Some(term(n, "a", None)), 10);
        }
        assert_eq!(history.len(), 10);
        assert_eq!(history.first().map(|e| e.term), Some(3));
        assert_eq!(history.last().map(|e| e.term), Some(12));
        assert!(fold(&history, Some(term(13, "a", None)), 0).is_empty());
    }

    #[test]
    fn the_end_follows_the_store_but_a_release_is_final() {
        let expired = fold(&[term(4, "a", None)], Some(term(4, "a", Some(TermEnd::Expired))), 10);
        assert_eq!(expired[0].ended, Some(TermEnd::Expired));
        // The holder renewed an expired lease nobody took: it lasts again.
        let renewed = fold(&expired, Some(term(4, "a", None)), 10);
        assert_eq!(renewed[0].ended, None);
        let mut released = term(4, "a", Some(TermEnd::Released));
        released.holder = None;
        let history = fold(&renewed, Some(released), 10);
        assert_eq!(history[0].ended, Some(TermEnd::Released));
        assert_eq!(
            history[0].holder.as_deref(),
            Some("a"),
            "the release cleared the holder; history keeps it"
        );
        let history = fold(&history, Some(term(4, "a", Some(TermEnd::Expired))), 10);
        assert_eq!(history[0].ended, Some(TermEnd::Released));
    }
}
