//! Sessions and lock sets on Spanner ([`SessionStore`]).
//!
//! Two tables beside the lease table `T`, created by `ensure_session_schema`:
//! `T_sessions` (one row per session) and `T_locks` (one row per lock,
//! naming its session and that session's shard, so the join from a lock to
//! its session is a key lookup). Both lead with the FNV-1a shard of their
//! name ([`shard_of`]), like the lease table, so a hot set of locks or
//! sessions spreads over splits.
//!
//! * Renewal is one `UPDATE … WHERE CURRENT_TIMESTAMP() <= renewed_at + D
//!   THEN RETURN` plus the commit, however many locks the session holds: a
//!   session that expired by the store's clock matches no row and stays dead.
//! * `try_lock` is one read-write transaction of three round trips: a read
//!   of the requested lock rows by primary key, one query judging the
//!   caller's session and every holder those rows name live or not by
//!   `CURRENT_TIMESTAMP()`, and the commit carrying the taken rows as
//!   mutations (the commit timestamp as token) and the session's renewal
//!   (`renewed_at` = the commit timestamp). Reading by key keeps a batch's
//!   cost independent of the table's size (a query joining the lock rows
//!   with their sessions took 2.5 s per batch at 10,000 locks on the
//!   emulator, which scans).
//! * Expiry is `CURRENT_TIMESTAMP() > TIMESTAMP_ADD(renewed_at, INTERVAL
//!   lease_ms MILLISECOND)`, exactly the core's rule
//!   ([`SessionRecord::is_live_at`]), in one place ([`LIVE`]).
//! * A refused check-and-set rolls back, as for leases; transaction bodies
//!   have no side effects (S10).
//! * Garbage collection reads at most [`GARBAGE_BATCH`] free lock rows and
//!   expired sessions per read-write transaction (the reads lock them) and
//!   deletes them by key, one bounded transaction after another until a
//!   batch comes back short: never one unbounded `DELETE`.

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;
use google_cloud_lro::Poller;
use google_cloud_spanner::client::DatabaseClient;
use google_cloud_spanner::key::{Key, KeySet, KeySetBuilder};
use google_cloud_spanner::mutation::Mutation;
use google_cloud_spanner::read::ReadRequest;
use google_cloud_spanner::result::ResultSet;
use google_cloud_spanner::statement::Statement;
use google_cloud_spanner::transaction::ReadWriteTransaction;
use google_cloud_wkt::Timestamp;
use tracing::info;

use super::{SpannerStore, classify, lease_from_millis, lease_to_millis, timestamp_to_store};
use crate::lease::session::{
    Collected, GARBAGE_BATCH, LockBatch, LocksObservation, ObservedLock, SessionObservation, SessionRecord,
    SessionStore, collect_in_batches, session_lost, validate_lock_names, validate_session_id,
};
use crate::lease::store::Result;
use crate::lease::{FencingToken, StoreError, StoreTime};
use crate::shard_of;

/// The session row `s` is live by the store's clock.
const LIVE: &str = "(CURRENT_TIMESTAMP() <= TIMESTAMP_ADD(s.renewed_at, INTERVAL s.lease_ms MILLISECOND))";

/// The two table names, from the lease table's.
struct Tables {
    sessions: String,
    locks: String,
}

impl Tables {
    fn of(store: &SpannerStore) -> Result<Tables> {
        let table = &store.config.table;
        let tables = Tables {
            sessions: format!("{table}_sessions"),
            locks: format!("{table}_locks"),
        };
        for name in [&tables.sessions, &tables.locks] {
            super::validate_table(name)?;
        }
        Ok(tables)
    }

    fn create(&self) -> [String; 2] {
        [
            format!(
                "CREATE TABLE {} (\n  shard INT64 NOT NULL,\n  id STRING(MAX) NOT NULL,\n  owner STRING(MAX) NOT NULL,\n  \
                 renewed_at TIMESTAMP NOT NULL OPTIONS (allow_commit_timestamp=true),\n  lease_ms INT64 NOT NULL,\n\
                 ) PRIMARY KEY (shard, id)",
                self.sessions
            ),
            format!(
                "CREATE TABLE {} (\n  shard INT64 NOT NULL,\n  name STRING(MAX) NOT NULL,\n  session STRING(MAX),\n  \
                 session_shard INT64,\n  token TIMESTAMP NOT NULL OPTIONS (allow_commit_timestamp=true),\n\
                 ) PRIMARY KEY (shard, name)",
                self.locks
            ),
        ]
    }

    /// The store's clock, and each named session that exists with whether
    /// it is live (one row with a NULL id when none exists).
    fn sessions_live(&self) -> String {
        format!(
            "SELECT CURRENT_TIMESTAMP() AS now, s.id, {LIVE} AS live FROM (SELECT 1 AS one) AS clock \
             LEFT JOIN {} AS s ON s.shard IN UNNEST(@shards) AND s.id IN UNNEST(@names)",
            self.sessions
        )
    }

    /// The lock rows of `names`, read by primary key: one point read per
    /// name however large the table (module docs).
    fn lock_rows(&self, names: &[String]) -> ReadRequest {
        let keys = names
            .iter()
            .fold(KeySet::builder(), |keys, name| {
                keys.add_key(Key::new(vec![shard_of(name).into(), name.clone().into()]))
            })
            .build();
        ReadRequest::builder(&self.locks, ["name", "session", "token"])
            .with_keys(keys)
            .build()
    }
}

/// `@shards` and `@names` for a batch of names (locks or sessions).
fn batch_statement(sql: &str, names: &[String]) -> Statement {
    let mut shards: Vec<i64> = names.iter().map(|n| shard_of(n)).collect();
    shards.sort_unstable();
    shards.dedup();
    Statement::builder(sql)
        .add_param("shards", shards)
        .add_param("names", names.to_vec())
        .build()
}

fn session_statement(sql: &str, session: &str) -> google_cloud_spanner::statement::StatementBuilder {
    Statement::builder(sql)
        .add_param("shard", shard_of(session))
        .add_param("id", session)
}

/// One lock row as read.
struct LockRow {
    session: Option<String>,
    token: FencingToken,
}

async fn lock_rows(mut rows: ResultSet) -> google_cloud_spanner::Result<HashMap<String, LockRow>> {
    let mut found = HashMap::new();
    while let Some(row) = rows.next().await.transpose()? {
        let token: Timestamp = row.get("token")?;
        found.insert(
            row.get("name")?,
            LockRow {
                session: row.get("session")?,
                token: FencingToken(timestamp_to_store(&token).0),
            },
        );
    }
    Ok(found)
}

/// The sessions whose liveness decides a batch: `own` (when given) and
/// every session named by a found row, each once.
fn sessions_to_judge(own: Option<&str>, found: &HashMap<String, LockRow>) -> Vec<String> {
    let mut ids: Vec<String> = own
        .into_iter()
        .map(str::to_string)
        .chain(found.values().filter_map(|r| r.session.clone()))
        .collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// What `sessions_live` read: the store's clock and, per existing
/// session, whether it is live by that clock.
struct Liveness {
    now: Timestamp,
    live: HashMap<String, bool>,
}

impl Liveness {
    /// Held by a live session other than none.
    fn holds(&self, row: &LockRow) -> bool {
        row.session.as_ref().is_some_and(|s| self.live.get(s) == Some(&true))
    }
}

async fn liveness(mut rows: ResultSet) -> google_cloud_spanner::Result<Liveness> {
    let (mut now, mut live) = (None, HashMap::new());
    while let Some(row) = rows.next().await.transpose()? {
        now = Some(row.get::<Timestamp>("now")?);
        if let Some(id) = row.get::<Option<String>>("id")? {
            live.insert(id, row.get::<Option<bool>>("live")?.unwrap_or(false));
        }
    }
    let now = now.ok_or_else(|| google_cloud_spanner::Error::deser("the clock query returned no row"))?;
    Ok(Liveness { now, live })
}

/// The primary keys (`shard`, `id`) a garbage query returned.
async fn row_keys(mut rows: ResultSet) -> google_cloud_spanner::Result<Vec<Key>> {
    let mut keys = Vec::new();
    while let Some(row) = rows.next().await.transpose()? {
        keys.push(Key::new(vec![
            row.get::<i64>("shard")?.into(),
            row.get::<String>("id")?.into(),
        ]));
    }
    Ok(keys)
}

/// How many rows a `THEN RETURN` statement gave back; reads them all.
async fn returned(mut rows: ResultSet) -> google_cloud_spanner::Result<usize> {
    let mut count = 0;
    while rows.next().await.transpose()?.is_some() {
        count += 1;
    }
    Ok(count)
}

/// The write of a lock row taken by `session` (inserted or updated; the
/// token is the commit timestamp), or of a held row freed (`None`: an
/// update keeping the token).
fn lock_mutation(table: &str, name: &str, session: Option<&str>) -> Mutation {
    let builder = match session {
        Some(_) => Mutation::new_insert_or_update_builder(table),
        None => Mutation::new_update_builder(table),
    };
    let builder = builder
        .set("shard")
        .to(shard_of(name))
        .set("name")
        .to(name)
        .set("session")
        .to(session.map(str::to_string))
        .set("session_shard")
        .to(session.map(shard_of));
    match session {
        // Spanner's placeholder for the commit timestamp in a mutation.
        Some(_) => builder.set("token").to("spanner.commit_timestamp()").build(),
        None => builder.build(),
    }
}

impl SpannerStore {
    /// A single-use (strong, lock-free) read with the call timeout.
    async fn read_only<T, Fut>(
        &self,
        what: String,
        statement: Statement,
        decode: impl FnOnce(ResultSet) -> Fut,
        client: DatabaseClient,
    ) -> Result<T>
    where
        Fut: Future<Output = google_cloud_spanner::Result<T>>,
    {
        let read = async {
            let rows = client.single_use().build().execute_query(statement).await?;
            decode(rows).await
        };
        tokio::time::timeout(self.call_timeout, read)
            .await
            .map_err(|_| StoreError::unavailable(format!("{what}: no reply within {:?}", self.call_timeout)))?
            .map_err(|e| classify(what, e, false, &self.config))
    }

    async fn session_tables_present(&self, tables: &Tables) -> Result<bool> {
        let client = self.session.current().1;
        let statement = Statement::builder(
            "SELECT COUNT(*) AS n FROM INFORMATION_SCHEMA.TABLES WHERE TABLE_SCHEMA = '' AND TABLE_NAME IN UNNEST(@names)",
        )
        .add_param("names", vec![tables.sessions.clone(), tables.locks.clone()])
        .build();
        let count = self
            .read_only(
                "reading the session tables".into(),
                statement,
                |mut rows: ResultSet| async move {
                    let row = rows.next().await.transpose()?;
                    row.map(|r| r.get::<i64>("n")).transpose()
                },
                client,
            )
            .await?;
        Ok(count == Some(2))
    }
}

#[async_trait]
impl SessionStore for SpannerStore {
    /// The lease table first (every call checks it), then both session
    /// tables in one schema change, when they are missing.
    async fn ensure_session_schema(&self) -> Result<()> {
        crate::lease::LeaseStore::ensure_schema(self).await?;
        let tables = Tables::of(self)?;
        if self.session_tables_present(&tables).await? {
            return Ok(());
        }
        info!(database = %self.config.database, sessions = %tables.sessions, locks = %tables.locks, "creating the session tables");
        let created = self
            .admin()
            .await?
            .update_database_ddl()
            .set_database(self.config.database.clone())
            .set_statements(tables.create())
            .poller()
            .until_done()
            .await;
        if let Err(e) = created {
            let text = e.to_string();
            let concurrent = ["Duplicate name in schema", "already exists", "concurrent schema change"];
            if !concurrent.iter().any(|c| text.contains(c)) {
                return Err(classify("creating the session tables".into(), e, false, &self.config));
            }
        }
        // Another replica may be creating them: wait until both are there.
        let give_up = tokio::time::Instant::now() + super::SCHEMA_WAIT;
        while !self.session_tables_present(&tables).await? {
            if tokio::time::Instant::now() >= give_up {
                return Err(StoreError::unavailable(format!(
                    "the session tables are still missing in {} after {:?}",
                    self.config.database,
                    super::SCHEMA_WAIT
                )));
            }
            tokio::time::sleep(super::SCHEMA_POLL).await;
        }
        Ok(())
    }

    async fn open_session(&self, session: &str, owner: &str, lease: Duration) -> Result<StoreTime> {
        validate_session_id(session)?;
        let lease_ms = lease_to_millis("lease duration", lease)?;
        let tables = Tables::of(self)?;
        let insert = format!(
            "INSERT INTO {} (shard, id, owner, renewed_at, lease_ms) \
             VALUES (@shard, @id, @owner, PENDING_COMMIT_TIMESTAMP(), @lease_ms)",
            tables.sessions
        );
        let (session_id, owner) = (session.to_string(), owner.to_string());
        let body = move |tx: ReadWriteTransaction, _refusal| {
            let statement = session_statement(&insert, &session_id)
                .add_param("owner", owner.as_str())
                .add_param("lease_ms", lease_ms)
                .build();
            async move { tx.execute_update(statement).await.map(drop) }
        };
        let ((), committed) = self.transact("open session", session, body).await?;
        Self::committed("open session", committed)
    }

    async fn renew_session(&self, session: &str) -> Result<StoreTime> {
        validate_session_id(session)?;
        let tables = Tables::of(self)?;
        let renew = format!(
            "UPDATE {} AS s SET renewed_at = PENDING_COMMIT_TIMESTAMP() \
             WHERE s.shard = @shard AND s.id = @id AND {LIVE} THEN RETURN s.lease_ms",
            tables.sessions
        );
        let session_id = session.to_string();
        let body = move |tx: ReadWriteTransaction, refusal: super::Refusal| {
            let statement = session_statement(&renew, &session_id).build();
            let session_id = session_id.clone();
            async move {
                match returned(tx.execute_query(statement).await?).await? {
                    0 => refusal.refuse(session_lost(
                        &session_id,
                        "expired by the store's clock, closed or collected",
                    )),
                    _ => Ok(()),
                }
            }
        };
        let ((), committed) = self.transact("renew session", session, body).await?;
        Self::committed("renew session", committed)
    }

    async fn close_session(&self, session: &str) -> Result<()> {
        validate_session_id(session)?;
        let tables = Tables::of(self)?;
        let delete = format!(
            "DELETE FROM {} WHERE shard = @shard AND id = @id THEN RETURN id",
            tables.sessions
        );
        let session_id = session.to_string();
        let body = move |tx: ReadWriteTransaction, refusal: super::Refusal| {
            let statement = session_statement(&delete, &session_id).build();
            let session_id = session_id.clone();
            async move {
                match returned(tx.execute_query(statement).await?).await? {
                    0 => refusal.refuse(session_lost(&session_id, "no such session (closed or collected)")),
                    _ => Ok(()),
                }
            }
        };
        self.transact("close session", session, body).await.map(drop)
    }

    async fn observe_session(&self, session: &str) -> Result<SessionObservation> {
        validate_session_id(session)?;
        let tables = Tables::of(self)?;
        let sql = format!(
            "SELECT s.owner, s.renewed_at, s.lease_ms, CURRENT_TIMESTAMP() AS now \
             FROM (SELECT 1 AS one) AS clock LEFT JOIN {} AS s ON s.shard = @shard AND s.id = @id",
            tables.sessions
        );
        let id = session.to_string();
        let raw = self
            .call(|client| {
                let statement = session_statement(&sql, &id).build();
                self.read_only(
                    format!("observe session {id}"),
                    statement,
                    |mut rows: ResultSet| async move {
                        let row = rows
                            .next()
                            .await
                            .transpose()?
                            .ok_or_else(|| google_cloud_spanner::Error::deser("the clock query returned no row"))?;
                        let owner: Option<String> = row.get("owner")?;
                        let renewed_at: Option<Timestamp> = row.get("renewed_at")?;
                        let lease_ms: Option<i64> = row.get("lease_ms")?;
                        let now: Timestamp = row.get("now")?;
                        Ok((owner, renewed_at, lease_ms, now))
                    },
                    client,
                )
            })
            .await?;
        let (owner, renewed_at, lease_ms, now) = raw;
        let record = match (owner, renewed_at) {
            (Some(owner), Some(renewed_at)) => Some(SessionRecord {
                id: session.to_string(),
                owner,
                renewed_at: timestamp_to_store(&renewed_at),
                lease_duration: lease_from_millis("lease_ms", session, lease_ms.unwrap_or(0))?,
            }),
            _ => None,
        };
        Ok(SessionObservation {
            record,
            now: timestamp_to_store(&now),
        })
    }

    async fn try_lock(&self, session: &str, names: &[String]) -> Result<LockBatch> {
        validate_session_id(session)?;
        validate_lock_names(names.iter().map(String::as_str))?;
        let tables = Tables::of(self)?;
        let (read, judge) = (tables.lock_rows(names), tables.sessions_live());
        let (locks, sessions) = (tables.locks.clone(), tables.sessions.clone());
        let (session_id, wanted) = (session.to_string(), names.to_vec());
        let body = move |tx: ReadWriteTransaction, refusal: super::Refusal| {
            let (read, judge) = (read.clone(), judge.clone());
            let (session_id, wanted) = (session_id.clone(), wanted.clone());
            let (locks, sessions) = (locks.clone(), sessions.clone());
            async move {
                // Two reads under the transaction's locks, then the commit:
                // the rows by key, then the caller's session and every
                // holder judged by the store's clock in one statement.
                let found = lock_rows(tx.execute_read(read).await?).await?;
                let judged = sessions_to_judge(Some(&session_id), &found);
                let liveness = liveness(tx.execute_query(batch_statement(&judge, &judged)).await?).await?;
                match liveness.live.get(&session_id) {
                    None => return refusal.refuse(session_lost(&session_id, "no such session (closed or collected)")),
                    Some(false) => return refusal.refuse(session_lost(&session_id, "expired by the store's clock")),
                    Some(true) => {}
                }
                let (mut held, mut busy, mut take) = (Vec::new(), Vec::new(), Vec::new());
                for name in wanted {
                    match found.get(&name) {
                        Some(row) if row.session.as_deref() == Some(session_id.as_str()) => {
                            held.push((name, row.token));
                        }
                        Some(row) if liveness.holds(row) => busy.push(name),
                        _ => take.push(name),
                    }
                }
                // Proven live: renewed by the same commit.
                let renew = Mutation::new_update_builder(sessions.as_str())
                    .set("shard")
                    .to(shard_of(&session_id))
                    .set("id")
                    .to(session_id.as_str())
                    .set("renewed_at")
                    .to("spanner.commit_timestamp()")
                    .build();
                tx.buffer(
                    take.iter()
                        .map(|name| lock_mutation(&locks, name, Some(&session_id)))
                        .chain([renew])
                        .collect::<Vec<_>>(),
                )?;
                Ok((held, busy, take))
            }
        };
        let ((held, busy, take), committed) = self.transact("try_lock", session, body).await?;
        let token = FencingToken(Self::committed("try_lock", committed)?.0);
        // Reported in the order asked.
        let mut taken: HashMap<String, FencingToken> = held.into_iter().collect();
        taken.extend(take.into_iter().map(|name| (name, token)));
        Ok(LockBatch {
            taken: names
                .iter()
                .filter_map(|n| taken.get(n).map(|t| (n.clone(), *t)))
                .collect(),
            busy,
        })
    }

    async fn unlock(&self, session: &str, locks: &[(String, FencingToken)]) -> Result<Vec<String>> {
        validate_session_id(session)?;
        validate_lock_names(locks.iter().map(|(name, _)| name.as_str()))?;
        let tables = Tables::of(self)?;
        let names: Vec<String> = locks.iter().map(|(n, _)| n.clone()).collect();
        let (read, table) = (tables.lock_rows(&names), tables.locks.clone());
        let (session_id, wanted) = (session.to_string(), locks.to_vec());
        let body = move |tx: ReadWriteTransaction, _refusal| {
            let (read, session_id, wanted, table) = (read.clone(), session_id.clone(), wanted.clone(), table.clone());
            async move {
                let found = lock_rows(tx.execute_read(read).await?).await?;
                let freed: Vec<String> = wanted
                    .iter()
                    .filter(|(name, token)| {
                        found
                            .get(name)
                            .is_some_and(|r| r.session.as_deref() == Some(session_id.as_str()) && r.token == *token)
                    })
                    .map(|(name, _)| name.clone())
                    .collect();
                tx.buffer(
                    freed
                        .iter()
                        .map(|name| lock_mutation(&table, name, None))
                        .collect::<Vec<_>>(),
                )?;
                Ok(freed)
            }
        };
        self.transact("unlock", session, body).await.map(|(freed, _)| freed)
    }

    async fn observe_locks(&self, names: &[String]) -> Result<LocksObservation> {
        validate_lock_names(names.iter().map(String::as_str))?;
        let tables = Tables::of(self)?;
        let (read, judge) = (tables.lock_rows(names), tables.sessions_live());
        let (found, liveness) = self
            .call(|client| {
                let (read, judge) = (read.clone(), judge.clone());
                // Both reads in one snapshot: the rows, then their holders.
                let observe = async move {
                    let tx = client.read_only_transaction().build().await?;
                    let found = lock_rows(tx.execute_read(read).await?).await?;
                    let judged = sessions_to_judge(None, &found);
                    let liveness = liveness(tx.execute_query(batch_statement(&judge, &judged)).await?).await?;
                    Ok::<_, google_cloud_spanner::Error>((found, liveness))
                };
                async move {
                    tokio::time::timeout(self.call_timeout, observe)
                        .await
                        .map_err(|_| {
                            StoreError::unavailable(format!("observe locks: no reply within {:?}", self.call_timeout))
                        })?
                        .map_err(|e| classify("observe locks".into(), e, false, &self.config))
                }
            })
            .await?;
        let locks = names
            .iter()
            .map(|name| {
                let row = found.get(name);
                ObservedLock {
                    name: name.clone(),
                    holder: row.filter(|r| liveness.holds(r)).and_then(|r| r.session.clone()),
                    token: row.map(|r| r.token),
                }
            })
            .collect();
        Ok(LocksObservation {
            locks,
            now: timestamp_to_store(&liveness.now),
        })
    }

    async fn collect_garbage(&self) -> Result<Collected> {
        let tables = Tables::of(self)?;
        let free_locks = format!(
            "SELECT l.shard, l.name AS id FROM {} AS l WHERE l.session IS NULL OR NOT EXISTS \
             (SELECT 1 FROM {} AS s WHERE s.shard = l.session_shard AND s.id = l.session AND {LIVE}) LIMIT @batch",
            tables.locks, tables.sessions
        );
        let expired = format!(
            "SELECT s.shard, s.id FROM {} AS s WHERE NOT {LIVE} LIMIT @batch",
            tables.sessions
        );
        let Tables { sessions, locks } = tables;
        let body = move |tx: ReadWriteTransaction, _refusal| {
            let (free_locks, expired) = (free_locks.clone(), expired.clone());
            let (locks, sessions) = (locks.clone(), sessions.clone());
            async move {
                // Locks first: a session expiring between the reads leaves
                // lock rows naming an absent session, free all the same and
                // collected by the next batch. Both reads lock what they
                // return until the commit deletes it.
                let batch = |sql: String| Statement::builder(sql).add_param("batch", GARBAGE_BATCH as i64).build();
                let free = row_keys(tx.execute_query(batch(free_locks)).await?).await?;
                let dead = row_keys(tx.execute_query(batch(expired)).await?).await?;
                let collected = Collected {
                    sessions: dead.len() as u64,
                    locks: free.len() as u64,
                };
                let deletes = [(locks, free), (sessions, dead)]
                    .into_iter()
                    .filter(|(_, keys)| !keys.is_empty())
                    .map(|(table, keys)| {
                        let keys = keys.into_iter().fold(KeySet::builder(), KeySetBuilder::add_key).build();
                        Mutation::delete(table, keys)
                    });
                tx.buffer(deletes.collect::<Vec<_>>())?;
                Ok(collected)
            }
        };
        collect_in_batches(|| async {
            self.transact("collect garbage", "sessions", body.clone())
                .await
                .map(|(collected, _)| collected)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_session_tables_lead_with_the_shard() {
        let tables = Tables {
            sessions: "t_sessions".into(),
            locks: "t_locks".into(),
        };
        let [sessions, locks] = tables.create();
        assert!(sessions.contains("PRIMARY KEY (shard, id)"), "{sessions}");
        assert!(locks.contains("PRIMARY KEY (shard, name)"), "{locks}");
    }

    #[test]
    fn a_taken_lock_is_written_with_the_commit_timestamp_and_a_freed_one_without_session() {
        let taken = format!("{:?}", lock_mutation("t_locks", "a", Some("s")));
        assert!(taken.contains("spanner.commit_timestamp()"), "{taken}");
        let freed = format!("{:?}", lock_mutation("t_locks", "a", None));
        assert!(!freed.contains("commit_timestamp"), "{freed}");
    }
}
