//! The SQL of the lease row: one text per operation, built once per table.

use google_cloud_spanner::mutation::Mutation;
use google_cloud_spanner::statement::{Statement, StatementBuilder};

use super::super::shard_of;

/// The SQL texts, built once per table.
#[derive(Debug)]
pub(super) struct Queries {
    pub(super) table: String,
    pub(super) read: String,
    pub(super) read_many: String,
    pub(super) read_for_acquire: String,
    pub(super) take: String,
    pub(super) take_over: String,
    pub(super) insert: String,
    pub(super) renew: String,
    pub(super) release: String,
}

/// The row is free, or its lease expired by the store's clock: the same
/// judgement as [`LeaseRecord::live_holder`], made under the row lock. The
/// elapsed time is truncated to whole milliseconds, so this can only find a
/// lease expired later than the exact comparison would, never sooner; a row
/// whose duration is not positive never matches (it is refused when read).
pub(super) const FREE_OR_EXPIRED: &str = "(holder IS NULL OR renewed_at IS NULL \
     OR (lease_ms > 0 AND TIMESTAMP_DIFF(CURRENT_TIMESTAMP(), renewed_at, MILLISECOND) > lease_ms))";

/// No reservation in force for a pod other than the claimant's (`@claimant`,
/// NULL without a pod UID): [`LeaseRecord::reserved_against`] in SQL, on the
/// store's clock, under the row lock.
pub(super) const RESERVATION_ALLOWS: &str = "(reserved_for IS NULL OR reserved_until <= CURRENT_TIMESTAMP() \
     OR reserved_for = @claimant)";

/// What a taking write does to a reservation: clears it.
const UNRESERVED: &str = "reserved_for = NULL, reserved_until = NULL";

/// What an acquire records as ended
/// ([`LeaseRecord::ended_by_acquire`](crate::lease::LeaseRecord::ended_by_acquire)):
/// the end written for the row's term, else `expired` for it (SET reads the
/// row as it was before the update).
const ENDED_BY_ACQUIRE: &str =
    "ended_term = term, ended = IF(ended_term IS NOT NULL AND ended_term = term, ended, 'expired')";

/// [`Claim::fenced_by`](crate::lease::Claim::fenced_by) in SQL, judged under the row lock: no fence, no
/// version recorded, or the claim's revision at least the recorded one. A
/// claim without a revision (`@revision` NULL) compares as NULL, so it is
/// refused once a revision is recorded.
pub(super) const FENCE_ALLOWS: &str = "(NOT @fence OR revision IS NULL OR revision <= @revision)";

/// The lease row's columns every read selects (as `t`), in one place so that
/// a new column reaches every read: `RawRow` decodes them by name.
const ROW_COLUMNS: &str = "t.holder, t.term, t.token, t.renewed_at, t.lease_ms, t.revision, t.version, t.reserved_for, \
     t.reserved_until, t.ended_term, t.ended";

impl Queries {
    pub(super) fn new(table: &str) -> Self {
        let key = "shard = @shard AND name = @name";
        let ours = "holder = @holder AND token = @token";
        Queries {
            table: table.to_string(),
            // The LEFT JOIN returns the store's clock even when the row is absent.
            read: format!(
                "SELECT {ROW_COLUMNS}, CURRENT_TIMESTAMP() AS now \
                 FROM (SELECT 1 AS one) AS clock LEFT JOIN {table} AS t ON t.shard = @shard AND t.name = @name"
            ),
            // Every named lock that has a row (shard narrows the scan to
            // the names' key ranges; a name fixes its shard, so no other row
            // matches), or one row of NULLs: the store's clock either way.
            read_many: format!(
                "SELECT t.name AS lock, {ROW_COLUMNS}, CURRENT_TIMESTAMP() AS now \
                 FROM (SELECT 1 AS one) AS clock LEFT JOIN {table} AS t \
                 ON t.shard IN UNNEST(@shards) AND t.name IN UNNEST(@names)"
            ),
            read_for_acquire: format!(
                "SELECT {ROW_COLUMNS}, f.term AS floor, CURRENT_TIMESTAMP() AS now \
                 FROM (SELECT 1 AS one) AS clock \
                 LEFT JOIN {table} AS t ON t.shard = @shard AND t.name = @name \
                 LEFT JOIN {table} AS f ON f.shard = @shard AND f.name = @floor"
            ),
            take: format!(
                "UPDATE {table} SET holder = @holder, term = term + 1, token = PENDING_COMMIT_TIMESTAMP(), \
                 renewed_at = PENDING_COMMIT_TIMESTAMP(), lease_ms = @lease_ms, revision = @revision, \
                 version = @version, {UNRESERVED}, {ENDED_BY_ACQUIRE} \
                 WHERE {key} AND {FREE_OR_EXPIRED} AND {FENCE_ALLOWS} AND {RESERVATION_ALLOWS} THEN RETURN term"
            ),
            // Only from exactly the holder and token named, live or expired;
            // the term it replaces ended by a restart of its sidecar.
            take_over: format!(
                "UPDATE {table} SET holder = @holder, term = term + 1, token = PENDING_COMMIT_TIMESTAMP(), \
                 renewed_at = PENDING_COMMIT_TIMESTAMP(), lease_ms = @lease_ms, revision = @revision, \
                 version = @version, {UNRESERVED}, ended_term = term, ended = 'restarted' WHERE {key} AND holder = @from_holder AND token = @from_token AND {FENCE_ALLOWS} \
                 THEN RETURN term"
            ),
            insert: format!(
                "INSERT INTO {table} (shard, name, holder, term, token, renewed_at, lease_ms, revision, version) \
                 VALUES (@shard, @name, @holder, @term, PENDING_COMMIT_TIMESTAMP(), PENDING_COMMIT_TIMESTAMP(), \
                 @lease_ms, @revision, @version)"
            ),
            renew: format!(
                "UPDATE {table} SET renewed_at = PENDING_COMMIT_TIMESTAMP(), lease_ms = @lease_ms \
                 WHERE {key} AND {ours} THEN RETURN term"
            ),
            // The reservation of `@reserved_for` for `@window_ms` capped at
            // the row's lease (`Handoff::reservation`), or none when NULL;
            // `@ended` as the end of the term.
            release: format!(
                "UPDATE {table} SET holder = NULL, reserved_for = @reserved_for, \
                 reserved_until = IF(@reserved_for IS NULL, NULL, \
                 TIMESTAMP_ADD(CURRENT_TIMESTAMP(), INTERVAL LEAST(@window_ms, lease_ms) MILLISECOND)), \
                 ended_term = term, ended = @ended \
                 WHERE {key} AND {ours} THEN RETURN term"
            ),
        }
    }

    /// The write that keeps the lock's term floor at `term`; see the module docs.
    pub(super) fn raise_floor(&self, lock: &str, term: i64) -> Mutation {
        Mutation::new_insert_or_update_builder(self.table.as_str())
            .set("shard")
            .to(shard_of(lock))
            .set("name")
            .to(floor_name(lock))
            .set("term")
            .to(term)
            .set("lease_ms")
            .to(0_i64)
            .build()
    }
}

/// The name of a lock's term-floor row.
pub(super) fn floor_name(lock: &str) -> String {
    format!("\u{1}term-floor:{lock}")
}

/// A statement on one lock's row: `@shard` and `@name` bound.
pub(super) fn keyed(sql: &str, lock: &str) -> StatementBuilder {
    Statement::builder(sql)
        .add_param("shard", shard_of(lock))
        .add_param("name", lock)
}
