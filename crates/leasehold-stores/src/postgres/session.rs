//! Sessions and lock sets on PostgreSQL and CockroachDB ([`SessionStore`]).
//!
//! Two tables beside the lease table `T`, created by `ensure_session_schema`:
//! `T_sessions` (one row per session: `owner`, `renewed_at`, `lease_ms`)
//! and `T_locks` (one row per lock: the `session` holding it, NULL once
//! released, that session's `session_shard`, and the `token` of its last
//! acquisition). Both lead with the FNV-1a shard of their name, like the
//! lease table.
//!
//! * Expiry is judged by the server's clock, `clock_timestamp()`, in the
//!   statement that acts on it: a session is live while
//!   `clock_timestamp() <= renewed_at + lease_ms`, exactly the core's rule
//!   ([`SessionRecord::is_live_at`]), in one place ([`LIVE`]).
//! * Renewal, release, close and the reads are one statement each, run as
//!   the single-lock statements are ([`PostgresStore::run`]). A renewal
//!   is one `UPDATE … WHERE <live> RETURNING`: one transaction per P
//!   however many locks the session holds.
//! * `try_lock` and each batch of `collect_garbage` are one `SERIALIZABLE`
//!   transaction ([`PostgresStore::transact`]). `try_lock` locks the
//!   requested lock rows (`FOR UPDATE`), renews the caller's session by
//!   check-and-set, *deletes* every holder session it finds expired (a
//!   write on that session's row, so a renewal of it racing the batch
//!   conflicts with it instead of reviving a session whose locks were just
//!   taken), and upserts the free locks.
//! * The batch's stamp is `GREATEST(clock_timestamp(), renewed_at + 1 µs,
//!   highest token read + 1 µs)`: the session's new `renewed_at` and the
//!   token of every lock the batch takes. Tokens strictly increase per lock
//!   (the lock's row is read under its row lock), and in nanoseconds like
//!   the Spanner store's commit timestamps. A lock row is collected only once
//!   the server's clock has passed its token, so a row written again later
//!   gets a higher token unless the server's clock goes back.
//! * Serialization failures and deadlocks (SQLSTATE 40001, 40P01: what
//!   CockroachDB reports for every conflict, and PostgreSQL under
//!   `SERIALIZABLE`) roll the transaction back; it is run again from the
//!   start with jittered exponential backoff while the call's time lasts
//!   (the retry loop of CockroachDB's client-side retry protocol). Bodies
//!   have no effects outside the transaction (S10). A `COMMIT` whose reply
//!   never came, or that CockroachDB answers with 40003 (result ambiguous),
//!   is an unknown outcome, never success and never retried (S9); an error
//!   before `COMMIT` was sent means nothing was written.
//! * Garbage collection deletes at most [`GARBAGE_BATCH`] sessions and
//!   [`GARBAGE_BATCH`] lock rows per transaction, and runs transactions
//!   until a batch comes back short: never one unbounded `DELETE`.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use deadpool_postgres::Transaction;
use tokio_postgres::IsolationLevel;
use tokio_postgres::Row;
use tracing::{debug, info};

use super::{PostgresStore, bad_reply, classify, contention_backoff, is_contention, lease_ms, store_time};
use crate::lease::session::{
    Collected, GARBAGE_BATCH, LockBatch, LocksObservation, ObservedLock, SessionObservation, SessionRecord,
    SessionStore, collect_in_batches, session_lost, validate_lock_names, validate_session_id,
};
use crate::lease::store::Result;
use crate::lease::{FencingToken, LeaseStore, StoreError, StoreTime};
use crate::{Effect, lease_from_millis, shard_of};

/// The session row `s` is live by the server's clock.
const LIVE: &str = "(clock_timestamp() <= s.renewed_at + s.lease_ms * INTERVAL '1 millisecond')";

/// A point in a transaction where a test may run something of its own
/// ([`PostgresStore::try_lock_interleaved`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// `try_lock` has read (and locked) the lock rows and written nothing.
    AfterRead,
    /// Every statement ran; `COMMIT` is about to be sent.
    BeforeCommit,
}

/// What a test runs at each [`Stage`] of every attempt.
pub type Interleave = dyn Fn(Stage) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync;

async fn interleave(hook: Option<&Interleave>, stage: Stage) {
    if let Some(hook) = hook {
        hook(stage).await;
    }
}

/// The two table names, from the lease table's (whose check leaves room
/// for the suffixes).
struct Tables {
    sessions: String,
    locks: String,
}

impl Tables {
    fn of(store: &PostgresStore) -> Tables {
        let table = &store.config().table;
        Tables {
            sessions: format!("{table}_sessions"),
            locks: format!("{table}_locks"),
        }
    }

    fn create(&self) -> [String; 2] {
        [
            format!(
                "CREATE TABLE IF NOT EXISTS {} (\n  shard BIGINT NOT NULL,\n  id TEXT NOT NULL,\n  owner TEXT NOT NULL,\n  \
                 renewed_at TIMESTAMPTZ NOT NULL,\n  lease_ms BIGINT NOT NULL,\n  PRIMARY KEY (shard, id)\n)",
                self.sessions
            ),
            format!(
                "CREATE TABLE IF NOT EXISTS {} (\n  shard BIGINT NOT NULL,\n  name TEXT NOT NULL,\n  session TEXT,\n  \
                 session_shard BIGINT,\n  token TIMESTAMPTZ NOT NULL,\n  PRIMARY KEY (shard, name)\n)",
                self.locks
            ),
        ]
    }
}

/// A token as the `token` column holds it: tokens are microsecond
/// timestamps in nanoseconds, so any other value is no row's token.
fn token_time(token: FencingToken) -> Option<SystemTime> {
    let nanos = u64::try_from(token.0).ok().filter(|n| n % 1000 == 0)?;
    UNIX_EPOCH.checked_add(Duration::from_nanos(nanos))
}

fn token_of(at: SystemTime) -> FencingToken {
    FencingToken(store_time(at).0)
}

/// The shards of `names`, for `shard = ANY($1) AND name = ANY($2)` (the
/// name decides the shard, so the pair matches exactly the names).
fn shards(names: &[String]) -> Vec<i64> {
    let mut shards: Vec<i64> = names.iter().map(|n| shard_of(n)).collect();
    shards.sort_unstable();
    shards.dedup();
    shards
}

/// Why one attempt of a transaction stopped.
enum Failure {
    /// The body refused (e.g. the session is not live), or a row could not
    /// be read: final, rolled back.
    Refused(StoreError),
    /// The driver failed; `committing` once `COMMIT` was sent.
    Driver {
        error: tokio_postgres::Error,
        committing: bool,
    },
}

impl From<tokio_postgres::Error> for Failure {
    fn from(error: tokio_postgres::Error) -> Self {
        Failure::Driver {
            error,
            committing: false,
        }
    }
}

impl From<StoreError> for Failure {
    fn from(error: StoreError) -> Self {
        Failure::Refused(error)
    }
}

/// One transaction's statements, run again from the start on a retry.
#[async_trait]
trait Body: Sync {
    type Output: Send;
    async fn run(&self, tx: &Transaction<'_>) -> std::result::Result<Self::Output, Failure>;
}

/// Runs one prepared (and cached) statement in `tx`.
async fn query(
    tx: &Transaction<'_>,
    sql: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> std::result::Result<Vec<Row>, tokio_postgres::Error> {
    let statement = tx.prepare_cached(sql).await?;
    tx.query(&statement, params).await
}

fn column<'r, T: tokio_postgres::types::FromSql<'r>>(what: &str, row: &'r Row, name: &str) -> Result<T> {
    row.try_get(name).map_err(|e| bad_reply(what, e))
}

impl PostgresStore {
    /// Runs `body` in one `SERIALIZABLE` transaction, again from the start
    /// after a serialization failure or deadlock (module docs), all within
    /// the call timeout.
    async fn transact<B: Body>(&self, what: &str, body: &B, hook: Option<&Interleave>) -> Result<B::Output> {
        let deadline = tokio::time::Instant::now() + self.call_timeout;
        let mut backoff = contention_backoff();
        loop {
            let mut committing = false;
            let outcome = tokio::time::timeout_at(deadline, self.attempt(what, body, hook, &mut committing)).await;
            let failure = match outcome {
                Ok(Ok(value)) => return Ok(value),
                Ok(Err(failure)) => failure,
                Err(_) => {
                    let effect = if committing { Effect::Write } else { Effect::Read };
                    return Err(effect.no_reply(format!("{what}: no reply within {:?}", self.call_timeout)));
                }
            };
            let (error, committing) = match failure {
                Failure::Refused(error) => return Err(error),
                Failure::Driver { error, committing } => (error, committing),
            };
            if is_contention(&error)
                && let Some(pause) = backoff.next()
                && tokio::time::Instant::now() + pause < deadline
            {
                debug!(%what, ?pause, error = %error, "serialization failure; running the transaction again");
                tokio::time::sleep(pause).await;
                continue;
            }
            // Before COMMIT the server rolls an open transaction back when
            // its connection ends: nothing was written.
            let effect = if committing { Effect::Write } else { Effect::Read };
            return Err(classify(what, error, effect));
        }
    }

    async fn attempt<B: Body>(
        &self,
        what: &str,
        body: &B,
        hook: Option<&Interleave>,
        committing: &mut bool,
    ) -> std::result::Result<B::Output, Failure> {
        let mut client = self
            .pool
            .get()
            .await
            .map_err(|e| Failure::Refused(StoreError::unavailable(self.no_connection(what)).caused_by(e)))?;
        let tx = client
            .build_transaction()
            .isolation_level(IsolationLevel::Serializable)
            .start()
            .await?;
        // A refusal drops `tx`, which rolls it back.
        let value = body.run(&tx).await?;
        interleave(hook, Stage::BeforeCommit).await;
        *committing = true;
        tx.commit().await.map_err(|error| Failure::Driver {
            error,
            committing: true,
        })?;
        Ok(value)
    }

    /// As [`SessionStore::try_lock`], running `hook` at each [`Stage`] of
    /// every attempt: tests force serialization failures and lost commit
    /// replies with it (a test seam, hidden like the core's `lease::seams`).
    #[doc(hidden)]
    pub async fn try_lock_interleaved(&self, session: &str, names: &[String], hook: &Interleave) -> Result<LockBatch> {
        self.try_lock_with(session, names, Some(hook)).await
    }

    async fn try_lock_with(&self, session: &str, names: &[String], hook: Option<&Interleave>) -> Result<LockBatch> {
        validate_session_id(session)?;
        validate_lock_names(names.iter().map(String::as_str))?;
        let body = TryLock {
            tables: Tables::of(self),
            session,
            names,
            hook,
        };
        self.transact("try_lock", &body, hook).await
    }
}

/// `try_lock`'s transaction (module docs).
struct TryLock<'a> {
    tables: Tables,
    session: &'a str,
    names: &'a [String],
    hook: Option<&'a Interleave>,
}

/// A lock row as `try_lock` read it.
struct LockRow {
    session: Option<String>,
    token: SystemTime,
}

#[async_trait]
impl Body for TryLock<'_> {
    type Output = LockBatch;

    async fn run(&self, tx: &Transaction<'_>) -> std::result::Result<LockBatch, Failure> {
        let what = "try_lock";
        let Tables { sessions, locks } = &self.tables;
        let names = self.names.to_vec();
        let read =
            format!("SELECT name, session, token FROM {locks} WHERE shard = ANY($1) AND name = ANY($2) FOR UPDATE");
        let mut found = HashMap::new();
        for row in query(tx, &read, &[&shards(self.names), &names]).await? {
            let name: String = column(what, &row, "name")?;
            let row = LockRow {
                session: column(what, &row, "session")?,
                token: column(what, &row, "token")?,
            };
            found.insert(name, row);
        }
        interleave(self.hook, Stage::AfterRead).await;

        // The caller's session: renewed by check-and-set to the batch's stamp.
        let highest = found.values().map(|r| r.token).max().unwrap_or(UNIX_EPOCH);
        let renew = format!(
            "UPDATE {sessions} AS s SET renewed_at = GREATEST(clock_timestamp(), \
             s.renewed_at + INTERVAL '1 microsecond', $3::TIMESTAMPTZ + INTERVAL '1 microsecond') \
             WHERE s.shard = $1 AND s.id = $2 AND {LIVE} RETURNING s.renewed_at"
        );
        let renewed = query(tx, &renew, &[&shard_of(self.session), &self.session, &highest]).await?;
        let Some(stamp) = renewed.first() else {
            return Err(session_lost(self.session, "expired by the store's clock, closed or collected").into());
        };
        let stamp: SystemTime = column(what, stamp, "renewed_at")?;

        // Every other session holding a requested lock: the expired ones
        // are deleted (module docs), the ones left are live.
        let holders: Vec<String> = found
            .values()
            .filter_map(|r| r.session.clone())
            .filter(|s| s != self.session)
            .collect::<HashSet<_>>()
            .into_iter()
            .collect();
        let mut live = HashSet::new();
        if !holders.is_empty() {
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&shards(&holders), &holders];
            let expired =
                format!("DELETE FROM {sessions} AS s WHERE s.shard = ANY($1) AND s.id = ANY($2) AND NOT {LIVE}");
            query(tx, &expired, &params).await?;
            let present = format!("SELECT id FROM {sessions} WHERE shard = ANY($1) AND id = ANY($2)");
            for row in query(tx, &present, &params).await? {
                live.insert(column::<String>(what, &row, "id")?);
            }
        }

        let (mut batch, mut take) = (LockBatch::default(), Vec::new());
        for name in self.names {
            match found.get(name) {
                Some(row) if row.session.as_deref() == Some(self.session) => {
                    batch.taken.push((name.clone(), token_of(row.token)));
                }
                Some(LockRow {
                    session: Some(holder), ..
                }) if live.contains(holder) => batch.busy.push(name.clone()),
                _ => {
                    take.push(name.clone());
                    batch.taken.push((name.clone(), token_of(stamp)));
                }
            }
        }
        if !take.is_empty() {
            let upsert = format!(
                "INSERT INTO {locks} (shard, name, session, session_shard, token) \
                 SELECT u.shard, u.name, $3, $4, $5 FROM unnest($1::BIGINT[], $2::TEXT[]) AS u(shard, name) \
                 ON CONFLICT (shard, name) DO UPDATE SET session = excluded.session, \
                 session_shard = excluded.session_shard, token = excluded.token"
            );
            let take_shards: Vec<i64> = take.iter().map(|n| shard_of(n)).collect();
            query(
                tx,
                &upsert,
                &[&take_shards, &take, &self.session, &shard_of(self.session), &stamp],
            )
            .await?;
        }
        Ok(batch)
    }
}

/// One batch of `collect_garbage`: expired sessions, then lock rows that
/// are released or name an absent session (those just deleted included),
/// at most [`GARBAGE_BATCH`] each.
struct CollectBatch {
    tables: Tables,
}

#[async_trait]
impl Body for CollectBatch {
    type Output = Collected;

    async fn run(&self, tx: &Transaction<'_>) -> std::result::Result<Collected, Failure> {
        let Tables { sessions, locks } = &self.tables;
        let batch = GARBAGE_BATCH as i64;
        let expired = format!(
            "DELETE FROM {sessions} WHERE (shard, id) IN \
             (SELECT s.shard, s.id FROM {sessions} AS s WHERE NOT {LIVE} LIMIT $1) RETURNING id"
        );
        let free = format!(
            "DELETE FROM {locks} WHERE (shard, name) IN \
             (SELECT l.shard, l.name FROM {locks} AS l WHERE l.token < clock_timestamp() AND (l.session IS NULL \
             OR NOT EXISTS (SELECT 1 FROM {sessions} AS s WHERE s.shard = l.session_shard AND s.id = l.session)) \
             LIMIT $1) RETURNING name"
        );
        let sessions = query(tx, &expired, &[&batch]).await?.len() as u64;
        let locks = query(tx, &free, &[&batch]).await?.len() as u64;
        Ok(Collected { sessions, locks })
    }
}

#[async_trait]
impl SessionStore for PostgresStore {
    /// The lease table first (as the Spanner store), then both session tables.
    async fn ensure_session_schema(&self) -> Result<()> {
        self.ensure_schema().await?;
        let tables = Tables::of(self);
        let what = format!("creating tables {} and {}", tables.sessions, tables.locks);
        for sql in tables.create() {
            // Idempotent (IF NOT EXISTS); a lost reply is retried by the next call.
            self.run_ddl(&what, &sql).await?;
        }
        info!(sessions = %tables.sessions, locks = %tables.locks, "session tables ready");
        Ok(())
    }

    async fn open_session(&self, session: &str, owner: &str, lease: Duration) -> Result<StoreTime> {
        validate_session_id(session)?;
        let what = format!("open session {session}");
        let sql = format!(
            "INSERT INTO {} (shard, id, owner, renewed_at, lease_ms) VALUES ($1, $2, $3, clock_timestamp(), $4) \
             ON CONFLICT (shard, id) DO NOTHING RETURNING renewed_at",
            Tables::of(self).sessions
        );
        let rows = self
            .run(
                &what,
                &sql,
                &[&shard_of(session), &session, &owner, &lease_ms(lease)?],
                Effect::Write,
            )
            .await?;
        let row = rows.first().ok_or_else(|| {
            StoreError::invalid(format!("session id {session:?} was used before; ids are never reused"))
        })?;
        Ok(store_time(column(&what, row, "renewed_at")?))
    }

    async fn renew_session(&self, session: &str) -> Result<StoreTime> {
        validate_session_id(session)?;
        let what = format!("renew session {session}");
        let sql = format!(
            "UPDATE {} AS s SET renewed_at = GREATEST(clock_timestamp(), s.renewed_at + INTERVAL '1 microsecond') \
             WHERE s.shard = $1 AND s.id = $2 AND {LIVE} RETURNING s.renewed_at",
            Tables::of(self).sessions
        );
        let rows = self
            .run(&what, &sql, &[&shard_of(session), &session], Effect::Write)
            .await?;
        let row = rows
            .first()
            .ok_or_else(|| session_lost(session, "expired by the store's clock, closed or collected"))?;
        Ok(store_time(column(&what, row, "renewed_at")?))
    }

    async fn close_session(&self, session: &str) -> Result<()> {
        validate_session_id(session)?;
        let what = format!("close session {session}");
        let sql = format!(
            "DELETE FROM {} WHERE shard = $1 AND id = $2 RETURNING id",
            Tables::of(self).sessions
        );
        let rows = self
            .run(&what, &sql, &[&shard_of(session), &session], Effect::Write)
            .await?;
        match rows.len() {
            0 => Err(session_lost(session, "no such session (closed or collected)")),
            _ => Ok(()),
        }
    }

    async fn observe_session(&self, session: &str) -> Result<SessionObservation> {
        validate_session_id(session)?;
        let what = format!("observe session {session}");
        // The clock in a subquery of its own is read once, also without a row.
        let sql = format!(
            "SELECT clock.now, s.owner, s.renewed_at, s.lease_ms FROM (SELECT clock_timestamp() AS now) AS clock \
             LEFT JOIN {} AS s ON s.shard = $1 AND s.id = $2",
            Tables::of(self).sessions
        );
        let rows = self
            .run(&what, &sql, &[&shard_of(session), &session], Effect::Read)
            .await?;
        let row = rows
            .first()
            .ok_or_else(|| StoreError::invalid(format!("{what}: the clock query returned no row")))?;
        let owner: Option<String> = column(&what, row, "owner")?;
        let record = match owner {
            None => None,
            Some(owner) => Some(SessionRecord {
                id: session.to_string(),
                owner,
                renewed_at: store_time(column(&what, row, "renewed_at")?),
                lease_duration: lease_from_millis("lease_ms", session, column(&what, row, "lease_ms")?)?,
            }),
        };
        Ok(SessionObservation {
            record,
            now: store_time(column(&what, row, "now")?),
        })
    }

    async fn try_lock(&self, session: &str, names: &[String]) -> Result<LockBatch> {
        self.try_lock_with(session, names, None).await
    }

    async fn unlock(&self, session: &str, locks: &[(String, FencingToken)]) -> Result<Vec<String>> {
        validate_session_id(session)?;
        validate_lock_names(locks.iter().map(|(name, _)| name.as_str()))?;
        // A token no row can hold frees nothing.
        let (mut shards, mut names, mut tokens) = (Vec::new(), Vec::new(), Vec::new());
        for (name, token) in locks {
            if let Some(at) = token_time(*token) {
                shards.push(shard_of(name));
                names.push(name.clone());
                tokens.push(at);
            }
        }
        if names.is_empty() {
            return Ok(Vec::new());
        }
        let what = format!("unlock in session {session}");
        let sql = format!(
            "UPDATE {} AS l SET session = NULL, session_shard = NULL \
             FROM unnest($1::BIGINT[], $2::TEXT[], $3::TIMESTAMPTZ[]) AS u(shard, name, token) \
             WHERE l.shard = u.shard AND l.name = u.name AND l.token = u.token AND l.session = $4 RETURNING l.name",
            Tables::of(self).locks
        );
        let rows = self
            .run(&what, &sql, &[&shards, &names, &tokens, &session], Effect::Write)
            .await?;
        rows.iter().map(|row| column(&what, row, "name")).collect()
    }

    async fn observe_locks(&self, names: &[String]) -> Result<LocksObservation> {
        validate_lock_names(names.iter().map(String::as_str))?;
        let what = "observe locks";
        let Tables { sessions, locks } = Tables::of(self);
        // One statement: one snapshot of the rows and their holders, judged
        // by one reading of the server's clock.
        let sql = format!(
            "SELECT clock.now, l.name, l.session, l.token, \
             (s.id IS NOT NULL AND clock.now <= s.renewed_at + s.lease_ms * INTERVAL '1 millisecond') AS live \
             FROM (SELECT clock_timestamp() AS now) AS clock \
             LEFT JOIN {locks} AS l ON l.shard = ANY($1) AND l.name = ANY($2) \
             LEFT JOIN {sessions} AS s ON s.shard = l.session_shard AND s.id = l.session"
        );
        let rows = self
            .run(what, &sql, &[&shards(names), &names.to_vec()], Effect::Read)
            .await?;
        let first = rows
            .first()
            .ok_or_else(|| StoreError::invalid(format!("{what}: the clock query returned no row")))?;
        let now = store_time(column(what, first, "now")?);
        let mut found = HashMap::new();
        for row in &rows {
            let Some(name) = column::<Option<String>>(what, row, "name")? else {
                continue;
            };
            let live: bool = column(what, row, "live")?;
            let holder: Option<String> = column(what, row, "session")?;
            let token: SystemTime = column(what, row, "token")?;
            found.insert(name, (holder.filter(|_| live), token_of(token)));
        }
        let locks = names
            .iter()
            .map(|name| {
                let row = found.get(name);
                ObservedLock {
                    name: name.clone(),
                    holder: row.and_then(|(holder, _)| holder.clone()),
                    token: row.map(|(_, token)| *token),
                }
            })
            .collect();
        Ok(LocksObservation { locks, now })
    }

    async fn collect_garbage(&self) -> Result<Collected> {
        let body = CollectBatch {
            tables: Tables::of(self),
        };
        collect_in_batches(|| self.transact("collect garbage", &body, None)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_microsecond_timestamps_in_nanoseconds() {
        let at = UNIX_EPOCH + Duration::from_micros(1_700_000_000_123_456);
        let token = token_of(at);
        assert_eq!(token.0, 1_700_000_000_123_456_000);
        assert_eq!(token_time(token), Some(at));
        // Truncating to microseconds would match a row's token: refused instead.
        assert_eq!(token_time(FencingToken(token.0 + 1)), None);
        assert_eq!(token_time(FencingToken(-1000)), None);
    }
}
