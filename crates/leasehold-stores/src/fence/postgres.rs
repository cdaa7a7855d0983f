//! Fenced writes to PostgreSQL (and CockroachDB, by the same SQL).
//!
//! The fence table holds the highest token seen per (issuer, lock):
//!
//! ```sql
//! CREATE TABLE IF NOT EXISTS leasehold_fences (
//!     issuer    TEXT   NOT NULL,
//!     lock_name TEXT   NOT NULL,
//!     token     BIGINT NOT NULL,
//!     PRIMARY KEY (issuer, lock_name)
//! )
//! ```
//!
//! ([`ensure_table`] runs it.) [`fenced`] opens one transaction, advances
//! the fence with
//!
//! ```sql
//! INSERT INTO leasehold_fences AS f (issuer, lock_name, token) VALUES ($1, $2, $3)
//! ON CONFLICT (issuer, lock_name) DO UPDATE SET token = excluded.token
//! WHERE f.token <= excluded.token
//! ```
//!
//! and, when that touched the row, runs the guarded writes in the same
//! transaction and commits. When it touched nothing, the fence holds a
//! higher token: the transaction is rolled back and the write refused with
//! both tokens. The statement takes the fence row's lock (PostgreSQL locks
//! the conflicting row even when the `WHERE` is false), so fenced writes to
//! one lock run one after another: a deposed leader racing the new one waits
//! for its commit, then sees its token. Under CockroachDB's SERIALIZABLE
//! transactions a race may end in a 40001 retry error instead, returned as
//! [`FenceError::Postgres`]; nothing was written and the caller may retry.

use tokio_postgres::{Client, Transaction};

use super::{Fence, FenceError, check_table};

/// The fence table unless the caller names another.
pub const DEFAULT_TABLE: &str = "leasehold_fences";

/// Creates the fence table when it is missing.
pub async fn ensure_table(client: &Client, table: &str) -> Result<(), FenceError> {
    check_table(table)?;
    client
        .batch_execute(&format!(
            "CREATE TABLE IF NOT EXISTS {table} (issuer TEXT NOT NULL, lock_name TEXT NOT NULL, \
             token BIGINT NOT NULL, PRIMARY KEY (issuer, lock_name))"
        ))
        .await
        .map_err(|source| FenceError::Postgres {
            context: format!("creating the fence table {table}"),
            source,
        })
}

/// Runs `write` in one transaction with the fence's advance: committed when
/// the fence's token is at least the highest one seen for its issuer and
/// lock, rolled back and refused ([`FenceError::Stale`]) when it is lower.
/// An error from `write` rolls everything back, the fence's advance too.
pub async fn fenced<T, F>(client: &mut Client, table: &str, fence: &Fence, write: F) -> Result<T, FenceError>
where
    F: AsyncFnOnce(&Transaction<'_>) -> Result<T, tokio_postgres::Error>,
{
    check_table(table)?;
    let failed = |source| FenceError::Postgres {
        context: fence.context(),
        source,
    };
    let transaction = client.transaction().await.map_err(failed)?;
    let key: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&fence.issuer, &fence.lock];
    let advanced = transaction
        .execute(
            &format!(
                "INSERT INTO {table} AS f (issuer, lock_name, token) VALUES ($1, $2, $3) \
                 ON CONFLICT (issuer, lock_name) DO UPDATE SET token = excluded.token \
                 WHERE f.token <= excluded.token"
            ),
            &[key[0], key[1], &fence.token.0],
        )
        .await
        .map_err(failed)?;
    if advanced == 0 {
        // The statement left the row locked by this transaction: what it
        // holds now is what refused us. Dropping the transaction rolls back.
        let seen: i64 = transaction
            .query_one(
                &format!("SELECT token FROM {table} WHERE issuer = $1 AND lock_name = $2"),
                &key,
            )
            .await
            .map_err(failed)?
            .get(0);
        return Err(fence.stale(seen));
    }
    let value = write(&transaction).await.map_err(failed)?;
    transaction.commit().await.map_err(failed)?;
    Ok(value)
}
