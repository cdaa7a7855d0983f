//! `status.history`: the last terms of a lock, folded from what the operator
//! reads in the store (docs/design.md, "Leadership history").
//!
//! The fold is keyed by term, so a term seen on many reads is one entry; a
//! term the operator never saw (it was down, or the term was shorter than a
//! requeue) is a gap entry naming the missing terms, never an invented term.
//! A store that counts terms again (a deleted Kubernetes Lease) starts a new
//! run of terms, told apart by its tokens, which never go back.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use leasehold_core::lease::{EndReason, Observation};

/// Entries `status.history` keeps unless `spec.historyLimit` says otherwise.
pub(crate) const DEFAULT_HISTORY_LIMIT: u32 = 10;
/// The most `spec.historyLimit` may ask for: the status stays small.
pub const MAX_HISTORY_LIMIT: u32 = 100;

/// Why a term ended, as the store shows it: the reason the ending write
/// recorded (`lease::EndReason`, one variant each), or for a record without one
/// (written by an older sidecar) what the row shows.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, JsonSchema)]
pub enum TermEnd {
    /// The holder released it (shut down, or its campaign stopped).
    Released,
    /// The holder's release reserved the lease for a transfer target.
    Transferred,
    /// No renewal within the lease duration, by the store's clock.
    Expired,
    /// The holder stood aside for a preferred candidate or a rollout's
    /// preferred version.
    Preempted,
    /// A restarted sidecar of the holder's pod took it over.
    Restarted,
    /// The holder's pod was being deleted.
    PodTerminating,
    /// The holder's app was unhealthy.
    AppUnhealthy,
}

impl From<EndReason> for TermEnd {
    fn from(reason: EndReason) -> Self {
        match reason {
            EndReason::Released => TermEnd::Released,
            EndReason::Transferred => TermEnd::Transferred,
            EndReason::Expired => TermEnd::Expired,
            EndReason::Preempted => TermEnd::Preempted,
            EndReason::Restarted => TermEnd::Restarted,
            EndReason::PodTerminating => TermEnd::PodTerminating,
            EndReason::AppUnhealthy => TermEnd::AppUnhealthy,
        }
    }
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

    /// The token as a number, for comparing (every store's token is an
    /// `i64`; `status` writes it as a decimal string).
    fn token_value(&self) -> Option<i64> {
        self.token.as_deref()?.parse().ok()
    }

    /// What one read of the store says: its current (or last) term, and
    /// the end the record keeps for an earlier term (written by the release
    /// or the acquire that ended it, so known even when no read saw that
    /// term); nothing before the first acquisition (term 0).
    pub fn seen(observed: &Observation) -> Vec<HistoryEntry> {
        let Some(record) = observed.record.as_ref().filter(|r| r.term > 0) else {
            return Vec::new();
        };
        let written = |term: u64| record.ended.filter(|e| e.term == term).map(|e| TermEnd::from(e.reason));
        let earlier = (record.ended).filter(|e| e.term < record.term).map(|e| HistoryEntry {
            term: e.term,
            ended: Some(e.reason.into()),
            ..HistoryEntry::default()
        });
        // A record without an end for its term (an older sidecar's) ends
        // as the row shows.
        let ended = match (&record.holder, observed.live_holder()) {
            (_, Some(_)) => None,
            (None, None) => written(record.term).or(Some(match record.reservation {
                Some(_) => TermEnd::Transferred,
                None => TermEnd::Released,
            })),
            (Some(_), None) => Some(TermEnd::Expired),
        };
        let current = HistoryEntry {
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
        };
        earlier.into_iter().chain([current]).collect()
    }

    /// Adds what a later read says about the same term: fields stay as first
    /// seen (the earliest time, the holder before a release cleared it); the
    /// end follows the latest read, except that an end other than `Expired`
    /// is final (a lease judged expired may still be renewed by its holder
    /// if nobody took it). The time of an expiry stays once known.
    fn merge(&mut self, later: HistoryEntry) {
        self.holder = self.holder.take().or(later.holder);
        self.token = self.token.take().or(later.token);
        self.acquired_at = self.acquired_at.take().or(later.acquired_at);
        if matches!(self.ended, None | Some(TermEnd::Expired)) {
            let same = later.ended == self.ended;
            self.ended_at = later.ended_at.or(self.ended_at.take().filter(|_| same));
            self.ended = later.ended;
        }
    }
}

/// `previous` with `seen` folded in: one entry per term in term order, a gap
/// entry where terms between two known ones are missing, at most `limit`
/// entries (the newest).
///
/// Terms count up from 1 per record, so a store whose record is deleted and
/// written again (a Kubernetes Lease deleted by hand) counts them again,
/// while its tokens keep increasing. The history is therefore a list of
/// runs, each counting up: a read whose term goes back, or repeats, under a
/// newer token starts a new run, instead of merging into the older terms of
/// those numbers. A read older
/// than the newest run (its token below one of a term it does not exceed)
/// adds nothing.
pub fn fold(previous: &[HistoryEntry], seen: Vec<HistoryEntry>, limit: u32) -> Vec<HistoryEntry> {
    let mut runs: Vec<BTreeMap<u64, HistoryEntry>> = Vec::new();
    for entry in previous.iter().filter(|e| !e.is_gap()) {
        match runs.last_mut() {
            Some(run) if run.last_key_value().is_some_and(|(&last, _)| entry.term > last) => {
                run.insert(entry.term, entry.clone());
            }
            _ => runs.push(BTreeMap::from([(entry.term, entry.clone())])),
        }
    }
    match runs.last().map_or(Placement::Newest, |run| placement(run, &seen)) {
        Placement::Newest => {
            if runs.is_empty() {
                runs.push(BTreeMap::new());
            }
            let run = runs.last_mut().expect("a run");
            for entry in seen {
                match run.get_mut(&entry.term) {
                    Some(known) => known.merge(entry),
                    None => {
                        run.insert(entry.term, entry);
                    }
                }
            }
        }
        Placement::Restarted => runs.push(seen.into_iter().map(|e| (e.term, e)).collect()),
        Placement::Older => {}
    }
    let mut history = Vec::new();
    for run in runs {
        // A run begins at the first term a read saw: what came before it in
        // a new count is not known to be a term (a created Lease's first
        // write may never have granted one).
        let mut next = None;
        for (term, entry) in run {
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
    }
    let keep = usize::try_from(limit).unwrap_or(usize::MAX);
    history.split_off(history.len().saturating_sub(keep))
}

/// Where one read's entries belong relative to the newest run.
enum Placement {
    /// In the newest run: its terms continue or repeat that run's.
    Newest,
    /// After it: the store counts terms again (a term that goes back or
    /// repeats under a newer token).
    Restarted,
    /// Before it: a read of the record as it was before the newest run.
    Older,
}

/// Judged by the read's current term (its last entry, the one with a token)
/// against the run's terms with tokens; within one run a later term always
/// has a higher token.
fn placement(run: &BTreeMap<u64, HistoryEntry>, seen: &[HistoryEntry]) -> Placement {
    let Some((term, token)) = seen.last().and_then(|e| Some((e.term, e.token_value()?))) else {
        return Placement::Newest;
    };
    let known = run.values().filter_map(|e| Some((e.term, e.token_value()?)));
    for (known_term, known_token) in known {
        if known_term >= term && known_token < token {
            return Placement::Restarted;
        }
        if known_term <= term && known_token > token {
            return Placement::Older;
        }
    }
    Placement::Newest
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use leasehold_core::lease::{Ended, FencingToken, LeaseRecord, StoreTime};

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
        let mut history = fold(&[], vec![term(1, "a", None)], 10);
        let mut later = term(1, "a", None);
        later.acquired_at = Some("2026-11-26T22:05:00Z".into());
        history = fold(&history, vec![later], 10);
        history = fold(&history, vec![term(1, "a", None)], 10);
        assert_eq!(terms(&history), [(1, None)]);
        assert_eq!(history[0].acquired_at.as_deref(), Some("2026-11-26T22:00:01Z"));
    }

    #[test]
    fn terms_are_kept_in_term_order_whatever_order_they_are_folded_in() {
        let history = fold(&[term(3, "c", None)], vec![term(2, "b", Some(TermEnd::Released))], 10);
        assert_eq!(terms(&history), [(2, None), (3, None)]);
    }

    #[test]
    fn unseen_terms_are_a_gap_entry_not_invented_terms() {
        let history = fold(&[term(2, "a", None)], vec![term(6, "b", None)], 10);
        assert_eq!(terms(&history), [(2, None), (3, Some(5)), (6, None)]);
        let gap = &history[1];
        assert!(gap.is_gap());
        assert_eq!((&gap.holder, &gap.token, gap.ended), (&None, &None, None));
        // Folding again recomputes the gap, never doubles it.
        let again = fold(&history, vec![term(6, "b", None)], 10);
        assert_eq!(again, history);
    }

    #[test]
    fn the_oldest_entries_go_beyond_the_limit() {
        let mut history = Vec::new();
        for n in 1..=12 {
            history = fold(&history, vec![term(n, "a", None)], 10);
        }
        assert_eq!(history.len(), 10);
        assert_eq!(history.first().map(|e| e.term), Some(3));
        assert_eq!(history.last().map(|e| e.term), Some(12));
        assert!(fold(&history, vec![term(13, "a", None)], 0).is_empty());
    }

    /// Term `n` of a record counting terms again: held by `holder` with
    /// token `token` (above every earlier one, as on the Kubernetes store
    /// after its Lease was deleted and created again).
    fn again(n: u64, holder: &str, token: u64) -> HistoryEntry {
        HistoryEntry {
            token: Some(token.to_string()),
            ..term(n, holder, None)
        }
    }

    #[test]
    fn a_term_counted_again_under_a_newer_token_starts_a_new_run() {
        let mut history = Vec::new();
        for n in 5..=7 {
            history = fold(&history, vec![term(n, "a", None)], 10);
        }
        // The record was deleted; terms 1 and 2 of the new one.
        history = fold(&history, vec![again(1, "b", 9_000)], 10);
        history = fold(&history, vec![again(1, "b", 9_000)], 10);
        history = fold(&history, vec![again(2, "c", 9_100)], 10);
        assert_eq!(terms(&history), [(5, None), (6, None), (7, None), (1, None), (2, None)]);
        assert_eq!(
            history[3].holder.as_deref(),
            Some("b"),
            "not merged into an older term 1"
        );
        assert_eq!(history[0].holder.as_deref(), Some("a"));
        // Folding the history again, and the same read again, keeps it.
        assert_eq!(fold(&history, vec![again(2, "c", 9_100)], 10), history);
        assert_eq!(fold(&history, vec![], 10), history);
    }

    #[test]
    fn the_same_term_number_under_a_newer_token_is_a_new_term() {
        let history = fold(&[term(1, "a", None)], vec![again(1, "b", 9_000)], 10);
        assert_eq!(terms(&history), [(1, None), (1, None)]);
        assert_eq!(history[1].holder.as_deref(), Some("b"));
    }

    #[test]
    fn a_new_run_begins_at_the_first_term_a_read_saw() {
        let history = fold(&[term(6, "a", None)], vec![again(3, "b", 9_000)], 10);
        assert_eq!(terms(&history), [(6, None), (3, None)]);
        let history = fold(&history, vec![again(5, "c", 9_200)], 10);
        assert_eq!(terms(&history), [(6, None), (3, None), (4, Some(4)), (5, None)]);
        assert_eq!(
            fold(&history, vec![], 10),
            history,
            "the gap is recomputed, not doubled"
        );
    }

    #[test]
    fn a_read_from_before_the_newest_run_adds_nothing() {
        let history = fold(&[term(6, "a", None)], vec![again(1, "b", 9_000)], 10);
        let stale = fold(&history, vec![term(7, "a", None)], 10);
        assert_eq!(stale, history);
    }

    /// A read of a row at term `term` (held by `holder` until the read's
    /// time when `live`) that keeps `ended`.
    fn read(term: u64, holder: Option<&str>, live: bool, ended: Option<Ended>) -> Observation {
        let record = LeaseRecord {
            name: "prod/web".into(),
            holder: holder.map(Into::into),
            term,
            token: Some(FencingToken(term as i64 * 100)),
            renewed_at: Some(StoreTime(1_000_000_000)),
            lease_duration: Duration::from_secs(10),
            version: None,
            reservation: None,
            ended,
        };
        let now = StoreTime(if live { 2_000_000_000 } else { 20_000_000_000 });
        Observation {
            record: Some(record),
            now,
        }
    }

    /// `TermEnd`'s name in snake case: what the store and the metric say.
    fn snake(end: TermEnd) -> String {
        let name = serde_json::to_value(end).unwrap().as_str().unwrap().to_string();
        name.chars().enumerate().fold(String::new(), |mut out, (i, c)| {
            if c.is_uppercase() && i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
            out
        })
    }

    #[test]
    fn every_recorded_reason_is_the_end_of_the_same_name() {
        for reason in EndReason::ALL {
            let released = read(3, None, false, Some(Ended { term: 3, reason }));
            let seen = HistoryEntry::seen(&released);
            assert_eq!(seen.len(), 1, "{seen:?}");
            let ended = seen[0].ended.expect("a released term ended");
            assert_eq!(snake(ended), reason.as_str(), "history, store and metric name it alike");
            assert_eq!(EndReason::parse(reason.as_str()), Some(reason));
        }
        assert_eq!(
            EndReason::parse("left_for_lunch"),
            None,
            "a newer sidecar's reason reads as none"
        );
    }

    #[test]
    fn a_record_without_a_reason_folds_as_the_row_shows() {
        let ended = |observed: &Observation| HistoryEntry::seen(observed).last().and_then(|e| e.ended);
        assert_eq!(ended(&read(3, None, false, None)), Some(TermEnd::Released));
        let mut reserved = read(3, None, false, None);
        reserved.record.as_mut().unwrap().reservation = Some(leasehold_core::lease::Reservation {
            pod_uid: "uid-1".into(),
            until: StoreTime(30_000_000_000),
        });
        assert_eq!(ended(&reserved), Some(TermEnd::Transferred));
        assert_eq!(ended(&read(3, Some("a"), true, None)), None, "it lasts");
        assert_eq!(ended(&read(3, Some("a"), false, None)), Some(TermEnd::Expired));
        // An end the record keeps for an older term says nothing of this one.
        let older = Some(Ended {
            term: 2,
            reason: EndReason::PodTerminating,
        });
        assert_eq!(ended(&read(3, None, false, older)), Some(TermEnd::Released));
    }

    #[test]
    fn a_written_end_names_a_term_no_read_saw() {
        let history = fold(&[term(2, "a", None)], vec![], 10);
        let preempted = Some(Ended {
            term: 5,
            reason: EndReason::Preempted,
        });
        let history = fold(&history, HistoryEntry::seen(&read(6, Some("b"), true, preempted)), 10);
        assert_eq!(terms(&history), [(2, None), (3, Some(4)), (5, None), (6, None)]);
        let five = &history[2];
        assert_eq!((five.ended, &five.holder), (Some(TermEnd::Preempted), &None));
        assert_eq!(history[3].ended, None, "term 6 lasts");
        // The record keeps the end on later reads: one entry still.
        let again = fold(&history, HistoryEntry::seen(&read(6, Some("b"), true, preempted)), 10);
        assert_eq!(again, history);
    }

    #[test]
    fn an_expiry_seen_is_replaced_by_the_end_written_later() {
        let seen = HistoryEntry::seen(&read(4, Some("a"), false, None));
        let history = fold(&[], seen, 10);
        assert_eq!(history[0].ended, Some(TermEnd::Expired));
        let expired_at = history[0].ended_at.clone();
        assert!(expired_at.is_some());
        // The same pod's restarted sidecar took term 4 over.
        let restarted = Some(Ended {
            term: 4,
            reason: EndReason::Restarted,
        });
        let history = fold(&history, HistoryEntry::seen(&read(5, Some("a2"), true, restarted)), 10);
        assert_eq!(history[0].ended, Some(TermEnd::Restarted));
        // The acquire after an expiry writes `Expired`: the time seen stays.
        let history = fold(&[], HistoryEntry::seen(&read(4, Some("a"), false, None)), 10);
        let expired = Some(Ended {
            term: 4,
            reason: EndReason::Expired,
        });
        let history = fold(&history, HistoryEntry::seen(&read(5, Some("b"), true, expired)), 10);
        assert_eq!(
            (history[0].ended, &history[0].ended_at),
            (Some(TermEnd::Expired), &expired_at)
        );
    }

    #[test]
    fn the_end_follows_the_store_but_a_release_is_final() {
        let expired = fold(&[term(4, "a", None)], vec![term(4, "a", Some(TermEnd::Expired))], 10);
        assert_eq!(expired[0].ended, Some(TermEnd::Expired));
        // The holder renewed an expired lease nobody took: it lasts again.
        let renewed = fold(&expired, vec![term(4, "a", None)], 10);
        assert_eq!(renewed[0].ended, None);
        let mut released = term(4, "a", Some(TermEnd::Released));
        released.holder = None;
        let history = fold(&renewed, vec![released], 10);
        assert_eq!(history[0].ended, Some(TermEnd::Released));
        assert_eq!(
            history[0].holder.as_deref(),
            Some("a"),
            "the release cleared the holder; history keeps it"
        );
        let history = fold(&history, vec![term(4, "a", Some(TermEnd::Expired))], 10);
        assert_eq!(history[0].ended, Some(TermEnd::Released));
    }
}
