//! The status of a partitioned lease: the assignment one consistent read of
//! the store shows ([`PartitionView`]), kept small enough for N up to
//! [`MAX_PARTITIONS`](leasehold_core::lease::MAX_PARTITIONS) by writing index ranges.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use leasehold_core::lease::partitions::PartitionView;
use leasehold_core::lease::session::session_owner;
use leasehold_kubernetes::api::{PartitionHolder, PartitionsStatus};

/// The status of `view`: members, unowned partitions, the balance over
/// members and, per live session holding a slot or a partition, what it holds.
pub(super) fn partitions_status(view: &PartitionView) -> PartitionsStatus {
    // Members first (holding none is worth seeing), then any other live
    // owner (one that lost or gave up its slot while still holding).
    let mut by_session: BTreeMap<&str, Vec<u32>> = view.members.iter().map(|m| (m.as_str(), Vec::new())).collect();
    for (index, owner) in (0u32..).zip(&view.owners) {
        if let Some(owner) = owner {
            by_session.entry(owner.as_str()).or_default().push(index);
        }
    }
    let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
    PartitionsStatus {
        count: count(view.owners.len()),
        members: count(view.members.len()),
        unowned: count(view.unowned()),
        balance: count(view.balance()),
        assignment: by_session
            .into_iter()
            .map(|(session, indexes)| PartitionHolder {
                holder: session_owner(session).map(|owner| owner.name().to_string()),
                session: session.to_string(),
                count: count(indexes.len()),
                partitions: index_ranges(&indexes),
            })
            .collect(),
    }
}

/// Sorted indexes as ranges: `[0, 1, 2, 3, 7]` is `0-3,7`.
pub(super) fn index_ranges(indexes: &[u32]) -> String {
    let mut text = String::new();
    let mut rest = indexes.iter().copied().peekable();
    while let Some(start) = rest.next() {
        let mut end = start;
        while rest.next_if(|i| Some(*i) == end.checked_add(1)).is_some() {
            end += 1;
        }
        if !text.is_empty() {
            text.push(',');
        }
        match end == start {
            true => write!(text, "{start}"),
            false => write!(text, "{start}-{end}"),
        }
        .expect("writing to a String");
    }
    text
}

/// The note of the Event published when the members or the balance of a
/// partitioned lease changed since the last status, or `None`. The first
/// sighting is no change.
pub(super) fn assignment_change(old: Option<&PartitionsStatus>, new: &PartitionsStatus, lock: &str) -> Option<String> {
    let old = old?;
    if (old.members, old.balance) == (new.members, new.balance) {
        return None;
    }
    Some(format!(
        "partitions of lock {lock}: {} members (was {}), balance {} (was {}), {} of {} unowned",
        new.members, old.members, new.balance, old.balance, new.unowned, new.count
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold_core::lease::Identity;
    use leasehold_core::lease::session::new_session_id;

    #[test]
    fn indexes_are_written_as_ranges() {
        assert_eq!(index_ranges(&[]), "");
        assert_eq!(index_ranges(&[5]), "5");
        assert_eq!(index_ranges(&[0, 1, 2, 3, 7]), "0-3,7");
        assert_eq!(index_ranges(&[0, 2, 4, 5]), "0,2,4-5");
        assert_eq!(
            index_ranges(&[u32::MAX - 1, u32::MAX]),
            format!("{}-{}", u32::MAX - 1, u32::MAX)
        );
        let all: Vec<u32> = (0..1024).collect();
        assert_eq!(index_ranges(&all), "0-1023");
    }

    #[test]
    fn the_status_shows_members_owners_and_balance() {
        let a = new_session_id(&Identity::new(None, Some("prod".into()), "web-0"), 1);
        let b = new_session_id(&Identity::new(None, Some("prod".into()), "web-1"), 2);
        let c = new_session_id(&Identity::new(None, Some("prod".into()), "web-2"), 3);
        let (a, b, c) = (Some(a), Some(b), Some(c));
        // a and b are members holding 3 and 1; c holds one without a slot;
        // partition 5 is unowned.
        let view = PartitionView {
            members: vec![a.clone().unwrap(), b.clone().unwrap()],
            free_slots: vec![2, 3, 4, 5],
            owners: vec![a.clone(), a.clone(), b.clone(), a.clone(), c.clone(), None],
            tokens: vec![None; 6],
        };
        let status = partitions_status(&view);
        assert_eq!(
            (status.count, status.members, status.unowned, status.balance),
            (6, 2, 1, 2)
        );
        let shown: Vec<(Option<&str>, u32, &str)> = status
            .assignment
            .iter()
            .map(|h| (h.holder.as_deref(), h.count, h.partitions.as_str()))
            .collect();
        assert_eq!(
            shown,
            [
                (Some("web-0"), 3, "0-1,3"),
                (Some("web-1"), 1, "2"),
                (Some("web-2"), 1, "4")
            ]
        );
        let none = partitions_status(&PartitionView {
            members: vec![],
            free_slots: vec![0],
            owners: vec![None],
            tokens: vec![None],
        });
        assert_eq!((none.members, none.unowned, none.balance), (0, 1, 0));
        assert!(none.assignment.is_empty());
    }

    #[test]
    fn an_event_only_when_members_or_balance_change() {
        let status = |members, balance| PartitionsStatus {
            count: 8,
            members,
            balance,
            ..PartitionsStatus::default()
        };
        assert_eq!(assignment_change(None, &status(2, 0), "l"), None, "first sighting");
        assert_eq!(assignment_change(Some(&status(2, 0)), &status(2, 0), "l"), None);
        let joined = assignment_change(Some(&status(2, 0)), &status(3, 2), "l").unwrap();
        assert!(joined.contains("3 members (was 2), balance 2 (was 0)"), "{joined}");
        assert!(assignment_change(Some(&status(3, 2)), &status(3, 1), "l").is_some());
    }
}
