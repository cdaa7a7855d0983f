//! The lease row as Spanner returns it, and the checked conversions between
//! its columns and the core's types.

use std::collections::HashMap;
use std::time::Duration;

use google_cloud_spanner::result::{ResultSet, Row};
use google_cloud_wkt::Timestamp;

use super::super::{lease_from_millis, term_from_row, version_from_row};
use crate::lease::store::Result;
use crate::lease::{Ended, FencingToken, LeaseRecord, Observation, Reservation, StoreError, StoreTime};

/// A lease duration into the row's milliseconds, by the core's one checked
/// conversion.
pub(super) fn lease_to_millis(field: &'static str, lease: Duration) -> Result<i64> {
    crate::lease::lease_to_millis(field, lease)
        .map_err(|e| StoreError::invalid(format!("{field} cannot be stored")).caused_by(e))
}

pub(super) fn timestamp_to_store(t: &Timestamp) -> StoreTime {
    StoreTime(
        t.seconds()
            .saturating_mul(1_000_000_000)
            .saturating_add(i64::from(t.nanos())),
    )
}

pub(super) fn token_to_timestamp(token: FencingToken) -> Timestamp {
    Timestamp::clamp(
        token.0.div_euclid(1_000_000_000),
        token.0.rem_euclid(1_000_000_000) as i32,
    )
}

/// One row as read, before the checked conversion into a [`LeaseRecord`].
pub(super) struct RawRow {
    pub(super) holder: Option<String>,
    pub(super) term: Option<i64>,
    pub(super) token: Option<Timestamp>,
    pub(super) renewed_at: Option<Timestamp>,
    pub(super) lease_ms: Option<i64>,
    pub(super) revision: Option<i64>,
    pub(super) version: Option<String>,
    pub(super) reserved_for: Option<String>,
    pub(super) reserved_until: Option<Timestamp>,
    pub(super) ended_term: Option<i64>,
    pub(super) ended: Option<String>,
    /// The term floor, when the query reads it.
    pub(super) floor: Option<i64>,
    pub(super) now: Timestamp,
}

impl RawRow {
    /// Reads the single row of a `read`/`read_for_acquire` query.
    pub(super) async fn read(mut rows: ResultSet, with_floor: bool) -> google_cloud_spanner::Result<RawRow> {
        let row = rows
            .next()
            .await
            .transpose()?
            .ok_or_else(|| google_cloud_spanner::Error::deser("the clock query returned no row"))?;
        Self::of(&row, with_floor)
    }

    /// Reads every row of a `read_many` query: the store's clock, and the
    /// row of each lock that has one, by name.
    pub(super) async fn read_many(
        mut rows: ResultSet,
    ) -> google_cloud_spanner::Result<(Timestamp, HashMap<String, RawRow>)> {
        let mut now = None;
        let mut found = HashMap::new();
        while let Some(row) = rows.next().await.transpose()? {
            let read = Self::of(&row, false)?;
            now = Some(read.now);
            if let Some(lock) = row.get::<Option<String>>("lock")? {
                found.insert(lock, read);
            }
        }
        let now = now.ok_or_else(|| google_cloud_spanner::Error::deser("the clock query returned no row"))?;
        Ok((now, found))
    }

    fn of(row: &Row, with_floor: bool) -> google_cloud_spanner::Result<RawRow> {
        Ok(RawRow {
            holder: row.get("holder")?,
            term: row.get("term")?,
            token: row.get("token")?,
            renewed_at: row.get("renewed_at")?,
            lease_ms: row.get("lease_ms")?,
            revision: row.get("revision")?,
            version: row.get("version")?,
            reserved_for: row.get("reserved_for")?,
            reserved_until: row.get("reserved_until")?,
            ended_term: row.get("ended_term")?,
            ended: row.get("ended")?,
            floor: if with_floor { row.get("floor")? } else { None },
            now: row.get("now")?,
        })
    }

    /// The observation, every stored value converted with a check.
    pub(super) fn decode(&self, lock: &str) -> Result<Observation> {
        let ended_term = self.ended_term.map(|t| term_from_row(lock, t)).transpose()?;
        let record = match self.term {
            None => None,
            Some(term) => Some(LeaseRecord {
                name: lock.to_string(),
                holder: self.holder.clone(),
                term: term_from_row(lock, term)?,
                token: self.token.as_ref().map(|t| FencingToken(timestamp_to_store(t).0)),
                renewed_at: self.renewed_at.as_ref().map(timestamp_to_store),
                lease_duration: lease_from_millis("lease_ms", lock, self.lease_ms.unwrap_or(0))?,
                version: version_from_row(lock, self.revision, self.version.as_deref())?,
                reservation: self
                    .reserved_for
                    .clone()
                    .zip(self.reserved_until.as_ref())
                    .map(|(pod_uid, until)| Reservation {
                        pod_uid,
                        until: timestamp_to_store(until),
                    }),
                ended: Ended::from_columns(ended_term, self.ended.as_deref()),
            }),
        };
        Ok(Observation {
            record,
            now: timestamp_to_store(&self.now),
        })
    }
}

/// The `term` a DML statement's `THEN RETURN term` gave back; `None` when it
/// matched no row. Reads the whole result, as Spanner wants before the commit.
pub(super) async fn returned_term(mut rows: ResultSet) -> google_cloud_spanner::Result<Option<i64>> {
    let mut term = None;
    while let Some(row) = rows.next().await.transpose()? {
        term = Some(row.get::<i64>("term")?);
    }
    Ok(term)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_durations_convert_checked_both_ways() {
        assert_eq!(
            lease_to_millis("leaseDuration", Duration::from_millis(1500)).unwrap(),
            1500
        );
        for bad in [Duration::ZERO, Duration::from_micros(1500), Duration::MAX] {
            let err = lease_to_millis("leaseDuration", bad).unwrap_err();
            assert!(matches!(err, StoreError::Invalid { .. }), "{bad:?}: {err:?}");
            assert!(err.to_string().contains("leaseDuration"), "{err}");
        }
        assert_eq!(
            lease_from_millis("lease_ms", "l", 15_000).unwrap(),
            Duration::from_secs(15)
        );
        for stored in [0, -1, i64::MIN] {
            let err = lease_from_millis("lease_ms", "l", stored).unwrap_err().to_string();
            assert!(err.contains(&format!("lease_ms = {stored}")), "{err}");
        }
    }

    #[test]
    fn tokens_round_trip_through_timestamps() {
        for nanos in [0, 1, 1_700_000_000_123_456_789, 999_999_999] {
            assert_eq!(timestamp_to_store(&token_to_timestamp(FencingToken(nanos))).0, nanos);
        }
    }
}
