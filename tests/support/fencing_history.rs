//! The fencing checker: a pure function over a fenced workload's history
//! (crates/leasehold-kubernetes/examples/fenced-workload.rs), in the manner
//! of Jepsen's lock checkers: what the writers logged, what each resource
//! itself recorded in its commit order, and which tokens the lease store
//! issued to which pod. Per resource it finds
//!
//! * a write accepted with a token lower than one accepted before it (so
//!   accepted tokens never decrease);
//! * an accepted write whose token the store never issued to its writer;
//! * a write logged refused that the resource recorded, and one logged
//!   accepted that it did not.
//!
//! Fenced resources may show none of these; a control (written unfenced)
//! shows how many stale writes the faults produced, so a run whose control
//! has none made no stale leader and proves nothing.

use std::collections::{BTreeMap, BTreeSet};

use serde::Deserialize;

/// One write attempt as a writer logged it (one JSON line).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Attempt {
    pub resource: String,
    pub pod: String,
    pub token: i64,
    pub seq: i64,
    pub outcome: Outcome,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    Accepted,
    /// Refused by the fence as stale.
    Refused,
    /// Anything else (a broken connection, an unknown commit outcome).
    Failed,
}

/// A write as a resource recorded it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Write {
    pub pod: String,
    pub token: i64,
    pub seq: i64,
}

impl Write {
    fn of(attempt: &Attempt) -> Write {
        Write {
            pod: attempt.pod.clone(),
            token: attempt.token,
            seq: attempt.seq,
        }
    }
}

impl std::fmt::Display for Write {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}'s write {} with token {}", self.pod, self.seq, self.token)
    }
}

/// A workload run's history.
#[derive(Debug, Default)]
pub struct History {
    /// Every attempt the writers logged, any resource, any order.
    pub attempts: Vec<Attempt>,
    /// Per resource, what it recorded itself, in commit order (e.g. rows by
    /// an id taken under the fence's lock, a ConfigMap's values by
    /// resourceVersion). A resource missing here recorded nothing.
    pub recorded: BTreeMap<String, Vec<Write>>,
    /// (pod, token) as the lease store issued them, in order.
    pub issued: Vec<(String, i64)>,
    /// The fenced resources; every other one is a control.
    pub fenced: BTreeSet<String>,
}

/// A stale write that was accepted: `write` after `newer`, whose token is higher.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaleAccepted {
    pub write: Write,
    pub newer: Write,
}

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ResourceReport {
    pub attempted: usize,
    pub accepted: usize,
    pub refused: usize,
    pub failed: usize,
    pub stale_accepted: Vec<StaleAccepted>,
    pub not_issued: Vec<Write>,
    pub refused_but_recorded: Vec<Write>,
    pub accepted_but_unrecorded: Vec<Write>,
}

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Report {
    pub resources: BTreeMap<String, ResourceReport>,
    pub fenced: BTreeSet<String>,
    /// Tokens issued after the first: each a new term (another pod, or the
    /// same pod taking its own lease over).
    pub new_terms: usize,
    /// New terms held by another pod than the term before.
    pub moves: usize,
}

impl Attempt {
    /// The attempt a writer's log line records, if it records one.
    pub fn in_line(line: &str) -> Option<Attempt> {
        serde_json::from_str(line).ok()
    }
}

/// The attempts among a writer's log lines (other lines are skipped).
pub fn attempts_in(lines: &[String]) -> Vec<Attempt> {
    lines.iter().filter_map(|line| Attempt::in_line(line)).collect()
}

pub fn check(history: &History) -> Report {
    let issued: BTreeSet<&(String, i64)> = history.issued.iter().collect();
    let mut by_resource: BTreeMap<&str, Vec<&Attempt>> = BTreeMap::new();
    for attempt in &history.attempts {
        by_resource.entry(&attempt.resource).or_default().push(attempt);
    }
    for resource in history.recorded.keys() {
        by_resource.entry(resource).or_default();
    }
    let resources = by_resource
        .into_iter()
        .map(|(resource, attempts)| {
            let count = |outcome| attempts.iter().filter(|a| a.outcome == outcome).count();
            let mut report = ResourceReport {
                attempted: attempts.len(),
                accepted: count(Outcome::Accepted),
                refused: count(Outcome::Refused),
                failed: count(Outcome::Failed),
                ..Default::default()
            };
            // A resource with no record recorded nothing: every write
            // logged accepted is then missing from it.
            let committed: &[Write] = history.recorded.get(resource).map_or(&[], Vec::as_slice);
            let written: BTreeSet<&Write> = committed.iter().collect();
            let logged = |outcome| {
                attempts
                    .iter()
                    .filter(move |a| a.outcome == outcome)
                    .map(|a| Write::of(a))
            };
            report.refused_but_recorded = logged(Outcome::Refused).filter(|w| written.contains(w)).collect();
            report.accepted_but_unrecorded = logged(Outcome::Accepted).filter(|w| !written.contains(w)).collect();
            let mut highest: Option<&Write> = None;
            for write in committed {
                match highest {
                    Some(newer) if write.token < newer.token => report.stale_accepted.push(StaleAccepted {
                        write: write.clone(),
                        newer: newer.clone(),
                    }),
                    _ => highest = Some(write),
                }
                if !issued.contains(&(write.pod.clone(), write.token)) {
                    report.not_issued.push(write.clone());
                }
            }
            (resource.to_string(), report)
        })
        .collect();
    let terms: Vec<&(String, i64)> = history.issued.iter().collect();
    Report {
        resources,
        fenced: history.fenced.clone(),
        new_terms: terms.len().saturating_sub(1),
        moves: terms.windows(2).filter(|pair| pair[0].0 != pair[1].0).count(),
    }
}

impl Report {
    /// What breaks fencing: any stale write a fenced resource accepted, and
    /// on every resource a write no token was issued for, or a log that
    /// disagrees with the resource's record. Empty for a correct run.
    pub fn violations(&self) -> Vec<String> {
        let mut violations = Vec::new();
        for (resource, report) in &self.resources {
            if self.fenced.contains(resource) {
                for stale in &report.stale_accepted {
                    violations.push(format!(
                        "{resource} accepted {} after {} (a higher token)",
                        stale.write, stale.newer
                    ));
                }
            }
            for write in &report.not_issued {
                violations.push(format!(
                    "{resource} accepted {write}, a token the store never issued to {}",
                    write.pod
                ));
            }
            for write in &report.refused_but_recorded {
                violations.push(format!("{resource} recorded {write}, which its writer logged refused"));
            }
            for write in &report.accepted_but_unrecorded {
                violations.push(format!(
                    "{resource} has no record of {write}, which its writer logged accepted"
                ));
            }
        }
        violations
    }

    /// The figures, one resource a line.
    pub fn summary(&self) -> String {
        let mut lines = vec![format!(
            "{} new terms after the first ({} moves to another pod)",
            self.new_terms, self.moves
        )];
        for (resource, r) in &self.resources {
            let kind = if self.fenced.contains(resource) {
                "fenced"
            } else {
                "control"
            };
            lines.push(format!(
                "{resource} ({kind}): {} attempted, {} accepted, {} refused as stale, {} failed, {} stale accepted",
                r.attempted,
                r.accepted,
                r.refused,
                r.failed,
                r.stale_accepted.len()
            ));
        }
        lines.join("\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attempt(resource: &str, pod: &str, token: i64, seq: i64, outcome: Outcome) -> Attempt {
        Attempt {
            resource: resource.into(),
            pod: pod.into(),
            token,
            seq,
            outcome,
        }
    }

    fn write(pod: &str, token: i64, seq: i64) -> Write {
        Write {
            pod: pod.into(),
            token,
            seq,
        }
    }

    /// pod-a leads with token 10, pod-b takes over with 20 and writes, then
    /// pod-a, resumed, writes with 10 again: a fenced resource refuses it,
    /// the control (and a planted unfenced "fenced" resource) accepts it.
    fn history(fenced_accepts_stale: bool) -> History {
        use Outcome::*;
        let late = if fenced_accepts_stale { Accepted } else { Refused };
        let mut recorded = vec![write("pod-a", 10, 1), write("pod-b", 20, 1)];
        if fenced_accepts_stale {
            recorded.push(write("pod-a", 10, 2));
        }
        History {
            attempts: vec![
                attempt("postgres", "pod-a", 10, 1, Accepted),
                attempt("control", "pod-a", 10, 1, Accepted),
                attempt("configmap", "pod-a", 10, 1, Accepted),
                attempt("postgres", "pod-b", 20, 1, Accepted),
                attempt("control", "pod-b", 20, 1, Accepted),
                attempt("configmap", "pod-b", 20, 1, Accepted),
                attempt("postgres", "pod-a", 10, 2, late),
                attempt("control", "pod-a", 10, 2, Accepted),
                attempt("configmap", "pod-a", 10, 2, late),
            ],
            recorded: BTreeMap::from([
                ("postgres".to_string(), recorded.clone()),
                ("configmap".to_string(), recorded),
                (
                    "control".to_string(),
                    vec![write("pod-a", 10, 1), write("pod-b", 20, 1), write("pod-a", 10, 2)],
                ),
            ]),
            issued: vec![("pod-a".into(), 10), ("pod-b".into(), 20)],
            fenced: ["postgres", "configmap"].map(String::from).into(),
        }
    }

    #[test]
    fn a_fenced_history_passes_and_counts_the_controls_stale_write() {
        let report = check(&history(false));
        assert_eq!(report.violations(), Vec::<String>::new());
        assert_eq!((report.new_terms, report.moves), (1, 1));
        let control = &report.resources["control"];
        assert_eq!(
            control.stale_accepted,
            vec![StaleAccepted {
                write: write("pod-a", 10, 2),
                newer: write("pod-b", 20, 1)
            }]
        );
        let postgres = &report.resources["postgres"];
        assert_eq!((postgres.attempted, postgres.accepted, postgres.refused), (3, 2, 1));
        assert!(
            report
                .summary()
                .contains("control (control): 3 attempted, 3 accepted, 0 refused as stale, 0 failed, 1 stale accepted"),
            "{}",
            report.summary()
        );
    }

    /// The plant: fenced resources that accepted the stale write (an
    /// unfenced write path, or a helper that skips its comparison).
    #[test]
    fn a_stale_write_accepted_by_a_fenced_resource_fails_naming_it() {
        let violations = check(&history(true)).violations();
        assert_eq!(
            violations,
            vec![
                "configmap accepted pod-a's write 2 with token 10 after pod-b's write 1 with token 20 (a higher token)",
                "postgres accepted pod-a's write 2 with token 10 after pod-b's write 1 with token 20 (a higher token)",
            ]
        );
    }

    #[test]
    fn a_token_never_issued_to_the_writer_and_a_log_that_disagrees_with_the_record_fail() {
        let mut planted = history(false);
        // pod-a writes with pod-b's token; PostgreSQL recorded pod-a's
        // refused write and lost pod-b's accepted one.
        planted
            .attempts
            .push(attempt("configmap", "pod-a", 20, 3, Outcome::Accepted));
        planted
            .recorded
            .get_mut("configmap")
            .unwrap()
            .push(write("pod-a", 20, 3));
        planted
            .recorded
            .insert("postgres".into(), vec![write("pod-a", 10, 1), write("pod-a", 10, 2)]);
        assert_eq!(
            check(&planted).violations(),
            vec![
                "configmap accepted pod-a's write 3 with token 20, a token the store never issued to pod-a",
                "postgres recorded pod-a's write 2 with token 10, which its writer logged refused",
                "postgres has no record of pod-b's write 1 with token 20, which its writer logged accepted",
            ]
        );
    }
}
