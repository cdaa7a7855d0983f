//! The checker of the elector schedule: what every process believed and
//! wrote, against the store's record of acquisitions (module docs of
//! [`super`], properties 1 to 4).

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use tokio::time::Instant;

use super::history::Folded;
use super::mutants::Mutant;
use super::report::{Report, Violation};
use leasehold_core::lease::FencingToken;
use leasehold_core::store::memory::Acquisition;

/// One write a leader's work issued with its token.
#[derive(Debug, Clone)]
pub(super) struct Write {
    pub(super) writer: String,
    pub(super) token: FencingToken,
    /// When the worker last checked it still led.
    pub(super) checked: Instant,
    /// How long the write takes by itself, without pauses.
    pub(super) latency: Duration,
    pub(super) issued: Instant,
}

/// The downstream system leaders write to, guarded by the fencing token:
/// it accepts a token >= the highest it has seen.
#[derive(Default)]
pub(super) struct FencedRegister {
    pub(super) highest: Option<FencingToken>,
    pub(super) accepted: Vec<Write>,
    pub(super) rejected: u64,
}

impl FencedRegister {
    pub(super) fn write(&mut self, write: Write) {
        if self.highest.is_some_and(|highest| write.token < highest) {
            self.rejected += 1;
        } else {
            self.highest = Some(write.token);
            self.accepted.push(write);
        }
    }
}

/// One published belief of one candidate.
#[derive(Debug, Clone)]
pub(super) struct Belief {
    pub(super) who: String,
    pub(super) from: Instant,
    pub(super) until: Instant,
    pub(super) term: u64,
    pub(super) token: Option<FencingToken>,
}

#[derive(Default)]
pub(super) struct Log {
    pub(super) events: Vec<String>,
    pub(super) beliefs: Vec<Belief>,
    /// Two clusters: label repairs that broke property 5, as they happened.
    pub(super) label_faults: Vec<String>,
}

impl Log {
    pub(super) fn end_beliefs(&mut self, who: &str, at: Instant) {
        for belief in self.beliefs.iter_mut().filter(|b| b.who == who) {
            belief.until = belief.until.min(at);
        }
    }
}

/// What an elector schedule left behind: the store's acquisitions and what
/// every process believed and wrote.
pub(super) struct Finished {
    pub(super) seed: u64,
    pub(super) mutant: Option<Mutant>,
    /// The schedule ran on the Kubernetes store's semantics.
    pub(super) kubernetes: bool,
    pub(super) start: Instant,
    pub(super) log: Log,
    /// In commit order.
    pub(super) acquisitions: Vec<Acquisition>,
    /// Every write that began a term: the acquisitions, and on the
    /// Kubernetes model the creates, which grant none until the write after
    /// them (a read may see the created term meanwhile).
    pub(super) claims: Vec<Acquisition>,
    pub(super) register: FencedRegister,
    /// Local time from a leader's deadline to the earliest commit of the
    /// next term: what stale writes must beat.
    pub(super) margin: Duration,
    /// Tokens of terms whose row was deleted while their lease was live.
    pub(super) deleted_tokens: HashSet<Option<FencingToken>>,
    /// When the Kubernetes Lease was deleted (its record starts again).
    pub(super) term_resets: Vec<Instant>,
    /// The version fence was on.
    pub(super) fence: bool,
    /// The operator's folded history of the lock, if the schedule kept one.
    pub(super) history: Option<Folded>,
    /// Counts so far; the checker adds its own.
    pub(super) report: Report,
}

impl Finished {
    pub(super) fn check(mut self) -> Result<Report, Violation> {
        let mut log = std::mem::take(&mut self.log);
        let acquisitions = std::mem::take(&mut self.acquisitions);
        log.events.extend(acquisitions.iter().map(|a| {
            format!(
                "{:>7}ms store committed term {} for {} token {:?}",
                (a.at - self.start).as_millis(),
                a.term,
                a.holder,
                a.token
            )
        }));
        let (seed, mutant) = (self.seed, self.mutant);
        let kubernetes = self.kubernetes && mutant.is_none();
        let fail = |what: String| Violation {
            seed,
            mutant,
            what: match kubernetes {
                true => format!("{what} [Kubernetes schedule: replay with --kubernetes]"),
                false => what,
            },
            events: log.events.clone(),
        };
        let start = self.start;
        let at = |instant: Instant| (instant - start).as_millis();
        // A deleted Kubernetes Lease takes its record along: the term count
        // and the version fence start again; tokens do not.
        let resets = self.term_resets.clone();
        let reset_between = |a: &Acquisition, b: &Acquisition| resets.iter().any(|r| a.at <= *r && *r <= b.at);
        // 1. Terms and tokens strictly increase in commit order.
        for pair in acquisitions.windows(2) {
            let (a, b) = (&pair[0], &pair[1]);
            if (b.term <= a.term && !reset_between(a, b)) || b.token <= a.token {
                return Err(fail(format!(
                    "term {} (token {:?}, {}) committed at {}ms after term {} (token {:?}, {}): terms and tokens must strictly increase",
                    b.term,
                    b.token,
                    b.holder,
                    at(b.at),
                    a.term,
                    a.token,
                    a.holder
                )));
            }
        }
        // 4. With the fence, revisions never decrease in commit order.
        for pair in acquisitions.windows(2) {
            let (a, b) = (&pair[0], &pair[1]);
            if b.revision > a.revision {
                self.report.counts.version_moves += 1;
            }
            if self.fence && b.revision < a.revision && !reset_between(a, b) {
                return Err(fail(format!(
                    "term {} ({}) at revision {:?} committed at {}ms after term {} ({}) at revision {:?}: with the \
                     version fence leadership must never move to an older version",
                    b.term,
                    b.holder,
                    b.revision,
                    at(b.at),
                    a.term,
                    a.holder,
                    a.revision
                )));
            }
        }
        // Terms repeat after a reset; a term and its token name one acquisition.
        let by_term: BTreeMap<u64, usize> = acquisitions.iter().enumerate().map(|(i, a)| (a.term, i)).collect();
        let by_grant: BTreeMap<(u64, Option<FencingToken>), usize> = acquisitions
            .iter()
            .enumerate()
            .map(|(i, a)| ((a.term, a.token), i))
            .collect();
        let next_commit = |i: usize| acquisitions.get(i + 1).map(|a| a.at);
        // 2. Every belief was granted, and ends by the next term's commit.
        let mut beliefs = log.beliefs.clone();
        beliefs.retain(|b| b.until > b.from);
        for b in &beliefs {
            let Some(&i) = by_grant.get(&(b.term, b.token)).or_else(|| by_term.get(&b.term)) else {
                return Err(fail(format!(
                    "{} believed it led term {} from {}ms, which the store never granted",
                    b.who,
                    b.term,
                    at(b.from)
                )));
            };
            let granted = &acquisitions[i];
            if granted.holder != b.who || granted.token != b.token {
                return Err(fail(format!(
                    "{} believed it led term {} with token {:?}; the store granted it to {} with token {:?}",
                    b.who, b.term, b.token, granted.holder, granted.token
                )));
            }
            if let Some(next) = next_commit(i)
                && b.until > next
                && !self.deleted_tokens.contains(&b.token)
            {
                return Err(fail(format!(
                    "{} believed it led term {} until {}ms, after term {} committed at {}ms",
                    b.who,
                    b.term,
                    at(b.until),
                    acquisitions[i + 1].term,
                    at(next)
                )));
            }
        }
        // 3. Accepted writes were issued by the next term's commit, or by a
        //    writer paused past the margin between its check and the write.
        let register = &self.register;
        let token_index: BTreeMap<Option<FencingToken>, usize> =
            acquisitions.iter().enumerate().map(|(i, a)| (a.token, i)).collect();
        for w in &register.accepted {
            let Some(&i) = token_index.get(&Some(w.token)) else {
                return Err(fail(format!(
                    "{} wrote at {}ms with token {}, which the store never granted",
                    w.writer,
                    at(w.issued),
                    w.token
                )));
            };
            let Some(next) = next_commit(i) else { continue };
            if w.issued <= next || self.deleted_tokens.contains(&acquisitions[i].token) {
                continue;
            }
            // Stale from a correct elector means issued − checked > margin,
            // so only a pause longer than margin − latency can explain it.
            let paused = (w.issued - w.checked).saturating_sub(w.latency);
            if paused > self.margin.saturating_sub(w.latency) {
                self.report.counts.excused += 1;
                continue;
            }
            return Err(fail(format!(
                "{} wrote with token {} (term {}) at {}ms, after term {} committed at {}ms; it checked at {}ms and was paused {paused:?} (margin {:?})",
                w.writer,
                w.token,
                acquisitions[i].term,
                at(w.issued),
                acquisitions[i + 1].term,
                at(next),
                at(w.checked),
                self.margin
            )));
        }
        // 5. Two clusters: no label repair took the holder's label or kept
        //    one for a holder in the other cluster.
        if let Some(fault) = log.label_faults.first() {
            return Err(fail(fault.clone()));
        }
        if beliefs.is_empty() {
            return Err(fail("nobody ever led: the schedule tested nothing".into()));
        }
        // 4. The operator's history: each term once, none invented.
        if let Some(folded) = &self.history {
            super::history::check(folded, &self.claims).map_err(fail)?;
            let history = &folded.history;
            let counts = &mut self.report.counts;
            counts.history_gaps = history.iter().filter(|e| e.is_gap()).count() as u64;
            counts.history_terms = history.len() as u64 - counts.history_gaps;
            counts.history_runs = history.windows(2).filter(|p| p[1].term <= p[0].term).count() as u64;
        }
        self.report.counts.terms = beliefs.iter().map(|b| b.term).collect::<HashSet<_>>().len() as u64;
        self.report.counts.accepted = register.accepted.len() as u64;
        self.report.counts.fenced = register.rejected;
        self.report.events = log.events;
        Ok(self.report)
    }
}
