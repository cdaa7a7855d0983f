//! Fenced writes to Cloud Spanner: one read-write transaction reads the
//! fence row, compares, and buffers the fence's advance with the guarded
//! mutations; the commit applies them together or not at all.
//!
//! The fence table ([`create_table_statement`], applied with the database's
//! DDL like the lease table):
//!
//! ```sql
//! CREATE TABLE leasehold_fences (
//!     issuer    STRING(64)  NOT NULL,
//!     lock_name STRING(MAX) NOT NULL,
//!     token     INT64       NOT NULL,
//! ) PRIMARY KEY (issuer, lock_name)
//! ```
//!
//! The read takes the row's lock for the transaction, so of two racing
//! fenced writes one commits and the other is aborted by Spanner and run
//! again by the client, then reads the winner's token. The transaction body
//! has no effect outside the transaction, so those runs are safe.

use std::sync::{Arc, Mutex};

use google_cloud_spanner::client::DatabaseClient;
use google_cloud_spanner::mutation::Mutation;
use google_cloud_spanner::statement::Statement;
use google_cloud_spanner::transaction::ReadWriteTransaction;

use super::{Fence, FenceError, check_table};

/// The fence table unless the caller names another.
pub const DEFAULT_TABLE: &str = "leasehold_fences";

/// The DDL of the fence table `table`.
pub fn create_table_statement(table: &str) -> Result<String, FenceError> {
    check_table(table)?;
    Ok(format!(
        "CREATE TABLE {table} (issuer STRING(64) NOT NULL, lock_name STRING(MAX) NOT NULL, token INT64 NOT NULL) \
         PRIMARY KEY (issuer, lock_name)"
    ))
}

/// Commits `mutations` in one read-write transaction with the fence's
/// advance: committed when the fence's token is at least the highest one
/// seen for its issuer and lock, rolled back and refused
/// ([`FenceError::Stale`]) when it is lower.
pub async fn fenced(
    client: &DatabaseClient,
    table: &str,
    fence: &Fence,
    mutations: Vec<Mutation>,
) -> Result<(), FenceError> {
    check_table(table)?;
    let read: Arc<str> = format!("SELECT token FROM {table} WHERE issuer = @issuer AND lock_name = @lock").into();
    // The token that refused the write, left by the body for after the rollback.
    let refused_by: Arc<Mutex<Option<i64>>> = Arc::default();
    // The body owns what it uses (a closure returning an owned future, not
    // an async closure borrowing the caller's values): with borrows, the
    // helper's future is not provably Send and could not be spawned.
    let (claim, table): (Arc<Fence>, Arc<str>) = (Arc::new(fence.clone()), table.into());
    let mutations = Arc::new(mutations);
    let refused = refused_by.clone();
    let ran = client
        .read_write_transaction()
        .build()
        .run(move |tx: ReadWriteTransaction| {
            let (read, fence, table, mutations, refused_by) = (
                read.clone(),
                claim.clone(),
                table.clone(),
                mutations.clone(),
                refused.clone(),
            );
            async move {
                let statement = Statement::builder(&*read)
                    .add_param("issuer", fence.issuer.as_str())
                    .add_param("lock", fence.lock.as_str())
                    .build();
                let mut rows = tx.execute_query(statement).await?;
                let seen: Option<i64> = match rows.next().await.transpose()? {
                    Some(row) => Some(row.get("token")?),
                    None => None,
                };
                if let Some(seen) = seen.filter(|&seen| seen > fence.token.0) {
                    *refused_by.lock().unwrap_or_else(|e| e.into_inner()) = Some(seen);
                    // An error from the body rolls the transaction back.
                    return Err(google_cloud_spanner::Error::deser("stale fencing token; rolled back"));
                }
                *refused_by.lock().unwrap_or_else(|e| e.into_inner()) = None;
                let advance = Mutation::new_insert_or_update_builder(&*table)
                    .set("issuer")
                    .to(fence.issuer.as_str())
                    .set("lock_name")
                    .to(fence.lock.as_str())
                    .set("token")
                    .to(fence.token.0)
                    .build();
                tx.buffer(std::iter::once(advance).chain(mutations.iter().cloned()))
            }
        })
        .await;
    if let Some(seen) = *refused_by.lock().unwrap_or_else(|e| e.into_inner()) {
        return Err(fence.stale(seen));
    }
    ran.map(drop).map_err(|source| FenceError::Spanner {
        context: fence.context(),
        source,
    })
}
