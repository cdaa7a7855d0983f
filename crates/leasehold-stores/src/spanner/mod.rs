//! The Cloud Spanner store, on the official `google-cloud-spanner` client.
//!
//! * Every expiry judgement uses `CURRENT_TIMESTAMP()` inside the same
//!   transaction (S3): no candidate's wall clock is ever consulted.
//! * acquire, renew and release are one read-write transaction each (S7);
//!   renew and release are check-and-set on holder *and* token (S6, S8).
//! * Round trips: renew and release are one `UPDATE … THEN RETURN` plus the
//!   commit; acquire is one `UPDATE … THEN RETURN` that judges expiry in its
//!   `WHERE` under the row lock, plus the commit. Only when that matches no
//!   row does acquire read (absent row: insert; held row: lost).
//! * A check-and-set that finds holder or token changed rolls back instead
//!   of committing, so a slow commit cannot turn "lost" into "unknown".
//! * The fencing token is the acquisition's commit timestamp, written with
//!   `PENDING_COMMIT_TIMESTAMP()`; commit timestamps of transactions writing
//!   one row strictly increase, across delete and recreate too.
//! * `term` never goes backwards, also across a deleted and recreated row:
//!   every acquisition also writes the new term into the lock's *term-floor
//!   row* (same table, same shard, name `"\u{1}term-floor:" + lock`, a name
//!   no lock can have since lock names hold no control characters), buffered
//!   as a mutation that travels with the commit (no extra round trip). A
//!   recreated lock row starts at floor + 1. Deleting a lock row by name
//!   leaves its floor; only deleting the floor row too resets the term (the
//!   token still strictly increases).
//! * The transaction closures have no side effects beyond the transaction,
//!   so the runner may retry them after ABORTED (S10).
//! * An error once the commit may have been sent is an unknown outcome (S9),
//!   never success and never "nothing happened"; NOT_FOUND and
//!   FAILED_PRECONDITION included.
//! * Spanner may delete a session at any time (and an emulator restart loses
//!   them all): on `Session not found` the store opens a new database client
//!   (a new multiplexed session) and retries the operation once, as Google's
//!   client libraries do. With [`SpannerStore::with_create_table`] a table
//!   that disappeared is created again.
//! * The table's schema is checked against `INFORMATION_SCHEMA` before the
//!   first operation: a table that cannot work is invalid, with the fix.
//! * Followers poll with a strong single-use read and open a read-write
//!   transaction only when the lease looks free or expired (the elector's job).
//! * Statements are parameterized; only the table name, validated as an
//!   identifier, is part of the SQL text.

mod emulator;
mod errors;
mod queries;
mod row;
mod schema;
mod session;

pub use super::spanner_names::SpannerConfig;
pub use super::spanner_names::{check_database, check_table};
pub use emulator::create_emulator_database;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use async_trait::async_trait;
use google_cloud_lro::Poller;
use google_cloud_spanner::client::{DatabaseClient, Spanner};
use google_cloud_spanner::statement::{Statement, StatementBuilder};
use google_cloud_spanner::transaction::ReadWriteTransaction;
use google_cloud_spanner::types;
use google_cloud_spanner_admin_database_v1::client::DatabaseAdmin;
use tracing::{info, warn};

use self::errors::{Refusal, TABLE_MISSING_FIX, classify, lost, session_lost, table_missing};
use self::queries::{Queries, floor_name, keyed};
use self::row::{RawRow, lease_to_millis, returned_term, timestamp_to_store, token_to_timestamp};
use super::{lease_from_millis, term_from_row, version_columns};
use crate::lease::store::Result;
use crate::lease::{
    Claim, FencingToken, Grant, Handoff, Held, Identity, LeaseStore, Observation, Release, StoreError, StoreTime,
};

/// How to reach Spanner. Production uses the defaults (Google's endpoints and
/// Application Default Credentials, or `SPANNER_EMULATOR_HOST`); tests and
/// emulators on other ports name the endpoints.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Endpoints {
    /// gRPC data endpoint, e.g. `http://127.0.0.1:19010` (plaintext means the
    /// emulator and anonymous credentials).
    pub data: Option<String>,
    /// REST admin endpoint, e.g. `http://127.0.0.1:19020`. The client derives
    /// it by itself only for the emulator's default port 9010.
    pub admin: Option<String>,
}

impl Endpoints {
    /// From `SPANNER_EMULATOR_HOST` (read by the client itself) and
    /// `SPANNER_EMULATOR_REST`, the admin gateway the emulator's start script prints.
    pub fn from_env() -> Self {
        Endpoints {
            data: None,
            admin: std::env::var("SPANNER_EMULATOR_REST").ok().filter(|s| !s.is_empty()),
        }
    }
}

/// How long one store call may take before it is abandoned.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// How long `ensure_schema` waits for a table someone else is creating.
const SCHEMA_WAIT: Duration = Duration::from_secs(60);

/// How often it looks whether that table is there yet.
const SCHEMA_POLL: Duration = Duration::from_millis(250);

/// The Spanner-backed [`LeaseStore`].
#[derive(Clone)]
pub struct SpannerStore {
    config: SpannerConfig,
    spanner: Spanner,
    session: Arc<SessionSlot>,
    admin_endpoint: Option<String>,
    call_timeout: Duration,
    create_table: bool,
    /// Whether the table's schema was checked since it was last found missing.
    schema_checked: Arc<AtomicBool>,
    queries: Arc<Queries>,
}

impl std::fmt::Debug for SpannerStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpannerStore")
            .field("config", &self.config)
            .field("create_table", &self.create_table)
            .finish_non_exhaustive()
    }
}

/// The database client in use (and with it its multiplexed session), with a
/// generation so that callers who saw the same lost session rebuild it once.
struct SessionSlot {
    current: RwLock<(u64, DatabaseClient)>,
    rebuilding: tokio::sync::Mutex<()>,
}

impl SessionSlot {
    fn current(&self) -> (u64, DatabaseClient) {
        self.current.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Replaces the client of generation `seen` with a new one (new session),
    /// unless another caller already did.
    async fn rebuild(&self, seen: u64, spanner: &Spanner, config: &SpannerConfig, timeout: Duration) -> Result<()> {
        let _one_at_a_time = self.rebuilding.lock().await;
        if self.current().0 != seen {
            return Ok(());
        }
        let client = open_database(spanner, config, timeout).await?;
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = (seen + 1, client);
        Ok(())
    }
}

/// The table name, checked for the store ([`check_table`] is the one rule).
pub fn validate_table(table: &str) -> Result<()> {
    check_table(table).map_err(|e| StoreError::invalid("table").caused_by(e))
}

/// The database path, checked for the store ([`check_database`] is the one rule).
pub fn validate_database(database: &str) -> Result<()> {
    check_database(database).map_err(|e| StoreError::invalid("database").caused_by(e))
}

/// Lock names reach the store from validated flags and specs; the store
/// refuses control characters itself, so no lock can be named like a
/// term-floor row.
fn check_lock(lock: &str) -> Result<()> {
    if lock.is_empty() || lock.chars().any(char::is_control) {
        return Err(StoreError::invalid(format!(
            "lock name {lock:?} must be non-empty and hold no control characters"
        )));
    }
    Ok(())
}

/// Opens a database client: a new multiplexed session.
async fn open_database(spanner: &Spanner, config: &SpannerConfig, timeout: Duration) -> Result<DatabaseClient> {
    tokio::time::timeout(timeout, spanner.database_client(config.database.clone()).build())
        .await
        .map_err(|_| {
            StoreError::unavailable(format!(
                "no answer from Spanner for {} within {timeout:?}",
                config.database
            ))
        })?
        .map_err(|e| classify("opening a session".into(), e, false, config))
}

/// The Google clients are built without a TLS provider of their own (they
/// would link aws-lc-rs beside the ring that kube and the webhook use), so
/// they take the process default: ring, installed here once. Idempotent; an
/// embedding program that installed its own provider keeps it.
pub fn install_crypto_provider() {
    let _already_installed = rustls::crypto::ring::default_provider().install_default();
}

impl SpannerStore {
    /// Connects with endpoints from the environment.
    pub async fn connect(config: SpannerConfig) -> Result<Self> {
        Self::connect_to(config, Endpoints::from_env(), DEFAULT_CALL_TIMEOUT).await
    }

    /// Connects to the given endpoints; every call is bounded by `call_timeout`.
    pub async fn connect_to(config: SpannerConfig, endpoints: Endpoints, call_timeout: Duration) -> Result<Self> {
        validate_table(&config.table)?;
        validate_database(&config.database)?;
        let spanner = client(&endpoints, call_timeout).await?;
        let database = open_database(&spanner, &config, call_timeout).await?;
        let queries = Arc::new(Queries::new(&config.table));
        Ok(SpannerStore {
            config,
            spanner,
            session: Arc::new(SessionSlot {
                current: RwLock::new((0, database)),
                rebuilding: tokio::sync::Mutex::new(()),
            }),
            admin_endpoint: endpoints.admin,
            call_timeout,
            create_table: false,
            schema_checked: Arc::new(AtomicBool::new(false)),
            queries,
        })
    }

    /// Creates the table whenever it is found missing (`--create-table`):
    /// at the first operation, and again if it disappears later.
    pub fn with_create_table(mut self, create_table: bool) -> Self {
        self.create_table = create_table;
        self
    }

    pub fn config(&self) -> &SpannerConfig {
        &self.config
    }

    /// Runs `op` with the current database client, after the schema check.
    /// A lost session is replaced and `op` retried once; so is a table that
    /// went missing, when the store may create it.
    async fn call<T, F, Fut>(&self, op: F) -> Result<T>
    where
        F: Fn(DatabaseClient) -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        // Each recovery at most once per call: a new session, then (when
        // the store may create it) the table.
        let (mut new_session, mut new_table) = (false, false);
        loop {
            let (generation, client) = self.session.current();
            let result = match self.check_schema_once(&client).await {
                Ok(()) => op(client).await,
                Err(e) => Err(e),
            };
            match result {
                Err(e) if !new_session && session_lost(&e) => {
                    warn!(database = %self.config.database, error = %e.chain(), "Spanner lost our session; opening a new one");
                    new_session = true;
                    self.session
                        .rebuild(generation, &self.spanner, &self.config, self.call_timeout)
                        .await?;
                }
                Err(e) if table_missing(&e) => {
                    // Checked again (and, when allowed, created) next time.
                    self.schema_checked.store(false, Ordering::SeqCst);
                    if new_table || !self.create_table {
                        return Err(e);
                    }
                    warn!(table = %self.config.table, error = %e.chain(), "the lease table is gone; creating it again");
                    new_table = true;
                }
                result => return result,
            }
        }
    }

    /// The schema check before the first operation (and after the table was
    /// found missing); creates the table when the store may.
    async fn check_schema_once(&self, client: &DatabaseClient) -> Result<()> {
        if self.schema_checked.load(Ordering::SeqCst) {
            return Ok(());
        }
        self.prepare_schema(client, self.create_table).await
    }

    /// The table's columns, from `INFORMATION_SCHEMA`; empty when it is absent.
    async fn columns(&self, client: &DatabaseClient) -> Result<Vec<schema::Column>> {
        let statement = Statement::builder(schema::COLUMNS_QUERY)
            .add_param("table", self.config.table.as_str())
            .build();
        let read = async {
            let mut rows = client.single_use().build().execute_query(statement).await?;
            let mut columns = Vec::new();
            while let Some(row) = rows.next().await.transpose()? {
                columns.push(schema::Column {
                    name: row.get("name")?,
                    spanner_type: row.get("type")?,
                    commit_ts: row.get("commit_ts")?,
                });
            }
            Ok::<_, google_cloud_spanner::Error>(columns)
        };
        tokio::time::timeout(self.call_timeout, read)
            .await
            .map_err(|_| {
                StoreError::unavailable(format!(
                    "reading the schema of {}: no answer within {:?}",
                    self.config.database, self.call_timeout
                ))
            })?
            .map_err(|e| {
                classify(
                    format!("reading the schema of table {}", self.config.table),
                    e,
                    false,
                    &self.config,
                )
            })
    }

    /// Checks the table, creating it first when it is missing, or adding
    /// the columns newer leasehold versions need, when `create` says so. A concurrent schema change (another replica creating the
    /// same table) is waited out, then the table is looked at again.
    async fn prepare_schema(&self, client: &DatabaseClient, create: bool) -> Result<()> {
        let (table, database) = (&self.config.table, &self.config.database);
        let give_up = tokio::time::Instant::now() + SCHEMA_WAIT;
        loop {
            let columns = self.columns(client).await?;
            let ddl = if columns.is_empty() {
                if !create {
                    return Err(StoreError::invalid(format!(
                        "table {table} does not exist in {database}: {TABLE_MISSING_FIX}"
                    )));
                }
                info!(%database, %table, "creating the lease table");
                vec![schema::create_table(table)]
            } else {
                // A table from an older leasehold gains the columns added since.
                let upgrades = if create {
                    schema::upgrades(table, &columns)
                } else {
                    Vec::new()
                };
                if upgrades.is_empty() {
                    schema::check(table, &columns)
                        .map_err(|e| StoreError::invalid(format!("the lease table in {database}")).caused_by(e))?;
                    self.schema_checked.store(true, Ordering::SeqCst);
                    return Ok(());
                }
                info!(%database, %table, ?upgrades, "upgrading the lease table");
                upgrades
            };
            if tokio::time::Instant::now() >= give_up {
                return Err(StoreError::unavailable(format!(
                    "table {table} is still not ready in {database} after {SCHEMA_WAIT:?} of concurrent schema changes"
                )));
            }
            let created = self
                .admin()
                .await?
                .update_database_ddl()
                .set_database(database.clone())
                .set_statements(ddl)
                .poller()
                .until_done()
                .await;
            match created {
                Ok(_) => {}
                Err(e) => {
                    let text = e.to_string();
                    if text.contains("concurrent schema change") {
                        // Someone else is changing the schema, most likely
                        // creating or upgrading this very table: wait, then look again.
                        info!(%database, %table, "a concurrent schema change is running; waiting for it");
                        tokio::time::sleep(SCHEMA_POLL).await;
                    } else if !(text.contains("Duplicate name in schema") || text.contains("already exists")) {
                        return Err(classify(
                            format!("creating or upgrading table {table}"),
                            e,
                            false,
                            &self.config,
                        ));
                    }
                }
            }
        }
    }

    /// Runs `body` in a read-write transaction (through [`Self::call`]),
    /// classifying failures and telling an error during the commit (unknown
    /// outcome) from one before. A body that refuses (see [`Refusal`]) is
    /// rolled back and its error returned.
    async fn transact<T, F, Fut>(&self, what: &'static str, lock: &str, body: F) -> Result<(T, Option<StoreTime>)>
    where
        T: Send + 'static,
        F: Fn(ReadWriteTransaction, Refusal) -> Fut + Send + Sync + Clone + 'static,
        Fut: Future<Output = google_cloud_spanner::Result<T>> + Send,
    {
        self.call(|client| self.transact_once(client, what, lock, body.clone()))
            .await
    }

    async fn transact_once<T, F, Fut>(
        &self,
        client: DatabaseClient,
        what: &'static str,
        lock: &str,
        body: F,
    ) -> Result<(T, Option<StoreTime>)>
    where
        T: Send + 'static,
        F: Fn(ReadWriteTransaction, Refusal) -> Fut + Send + Sync + Clone + 'static,
        Fut: Future<Output = google_cloud_spanner::Result<T>> + Send,
    {
        let committing = Arc::new(AtomicBool::new(false));
        let refusal = Refusal::default();
        let runner = client
            .read_write_transaction()
            .with_transaction_timeout(self.call_timeout)
            .build();
        let (flag, refused) = (committing.clone(), refusal.clone());
        let run = runner.run(move |tx| {
            let (body, flag, refused) = (body.clone(), flag.clone(), refused.clone());
            async move {
                flag.store(false, Ordering::SeqCst);
                refused.take();
                let value = body(tx, refused).await?;
                // From here on the commit may reach Spanner.
                flag.store(true, Ordering::SeqCst);
                Ok(value)
            }
        });
        let outcome = tokio::time::timeout(self.call_timeout, run).await;
        let committing = committing.load(Ordering::SeqCst);
        let context = || format!("{what} {lock}");
        // A refusal is known as soon as the body made it, even when the
        // rollback that follows is still on its way.
        if let Some(refused) = refusal.take() {
            return Err(refused);
        }
        match outcome {
            Err(_) if committing => Err(StoreError::outcome_unknown(format!(
                "{}: no commit reply within {:?}",
                context(),
                self.call_timeout
            ))),
            Err(_) => Err(StoreError::unavailable(format!(
                "{}: no reply within {:?}",
                context(),
                self.call_timeout
            ))),
            Ok(Err(e)) => Err(classify(context(), e, committing, &self.config)),
            Ok(Ok(result)) => {
                let committed_at = result.commit_timestamp().as_ref().map(timestamp_to_store);
                Ok((result.into_inner(), committed_at))
            }
        }
    }

    fn committed(what: &str, at: Option<StoreTime>) -> Result<StoreTime> {
        at.ok_or_else(|| StoreError::outcome_unknown(format!("{what}: Spanner returned no commit timestamp")))
    }

    async fn admin(&self) -> Result<DatabaseAdmin> {
        let mut builder = self.spanner.database_admin_builder();
        if let Some(endpoint) = &self.admin_endpoint {
            builder = builder.with_endpoint(endpoint.clone());
        }
        builder
            .build()
            .await
            .map_err(|e| StoreError::unavailable("Spanner admin client").caused_by(e))
    }
}

/// The root client: one per store, sharing its channels with the admin clients.
async fn client(endpoints: &Endpoints, call_timeout: Duration) -> Result<Spanner> {
    install_crypto_provider();
    let mut builder = Spanner::builder();
    if let Some(endpoint) = &endpoints.data {
        builder = builder.with_endpoint(endpoint.clone());
    }
    tokio::time::timeout(call_timeout, builder.build())
        .await
        .map_err(|_| StoreError::unavailable(format!("no answer from Spanner within {call_timeout:?}")))?
        .map_err(|e| StoreError::unavailable("cannot set up the Spanner client").caused_by(e))
}

#[async_trait]
impl LeaseStore for SpannerStore {
    fn kind(&self) -> &'static str {
        "spanner"
    }

    async fn ensure_schema(&self) -> Result<()> {
        let (generation, client) = self.session.current();
        match self.prepare_schema(&client, true).await {
            Err(e) if session_lost(&e) => {
                self.session
                    .rebuild(generation, &self.spanner, &self.config, self.call_timeout)
                    .await?;
                self.prepare_schema(&self.session.current().1, true).await
            }
            result => result,
        }
    }

    async fn observe(&self, lock: &str) -> Result<Observation> {
        check_lock(lock)?;
        self.call(|client| async move {
            let statement = keyed(&self.queries.read, lock).build();
            let read = async {
                let rows = client.single_use().build().execute_query(statement).await?;
                RawRow::read(rows, false).await
            };
            tokio::time::timeout(self.call_timeout, read)
                .await
                .map_err(|_| {
                    StoreError::unavailable(format!("observe {lock}: no reply within {:?}", self.call_timeout))
                })?
                .map_err(|e| classify(format!("observe {lock}"), e, false, &self.config))?
                .decode(lock)
        })
        .await
    }

    /// One single-use query for every lock, the names and their shards as arrays.
    async fn observe_many(&self, locks: &[String]) -> Result<Vec<Observation>> {
        locks.iter().try_for_each(|lock| check_lock(lock))?;
        let what = format!("observe {} locks", locks.len());
        let shards: Vec<i64> = locks.iter().map(|lock| super::shard_of(lock)).collect();
        self.call(|client| {
            let (what, shards) = (&what, shards.clone());
            async move {
                let statement = Statement::builder(&self.queries.read_many)
                    .add_typed_param("shards", shards, types::array(types::int64()))
                    .add_typed_param("names", locks.to_vec(), types::array(types::string()))
                    .build();
                let read = async {
                    let rows = client.single_use().build().execute_query(statement).await?;
                    RawRow::read_many(rows).await
                };
                let (now, found) = tokio::time::timeout(self.call_timeout, read)
                    .await
                    .map_err(|_| StoreError::unavailable(format!("{what}: no reply within {:?}", self.call_timeout)))?
                    .map_err(|e| classify(what.clone(), e, false, &self.config))?;
                let now = timestamp_to_store(&now);
                locks
                    .iter()
                    .map(|lock| match found.get(lock) {
                        Some(row) => row.decode(lock),
                        None => Ok(Observation { record: None, now }),
                    })
                    .collect()
            }
        })
        .await
    }

    async fn acquire_as(&self, lock: &str, claim: &Claim<'_>, lease: Duration) -> Result<Grant> {
        check_lock(lock)?;
        let lease_ms = lease_to_millis("lease duration", lease)?;
        let (revision, version) = version_columns(claim)?;
        let (fence, recorded) = (claim.fence, claim.version.cloned());
        let (queries, lock_name, holder) = (self.queries.clone(), lock.to_string(), claim.holder.to_string());
        let (term, committed_at) = self
            .transact("acquire", lock, move |tx, refusal| {
                let (queries, lock, holder) = (queries.clone(), lock_name.clone(), holder.clone());
                let (version, recorded) = (version.clone(), recorded.clone());
                async move {
                    // Free or expired, and the fence allows: taken in this one statement.
                    let take = keyed(&queries.take, &lock)
                        .add_param("holder", holder.as_str())
                        .add_typed_param("claimant", Identity::pod_uid_of(&holder), types::string())
                        .add_param("lease_ms", lease_ms)
                        .add_param("revision", revision)
                        .add_param("version", version.clone())
                        .add_param("fence", fence)
                        .build();
                    let term = match returned_term(tx.execute_query(take).await?).await? {
                        Some(term) => term,
                        None => {
                            // Absent, or held: read to tell which.
                            let read = keyed(&queries.read_for_acquire, &lock)
                                .add_param("floor", floor_name(&lock))
                                .build();
                            let row = RawRow::read(tx.execute_query(read).await?, true).await?;
                            if row.term.is_some() {
                                let observed = match row.decode(&lock) {
                                    Ok(observed) => observed,
                                    Err(invalid) => return refusal.refuse(invalid),
                                };
                                let claim = Claim {
                                    holder: &holder,
                                    version: recorded.as_ref(),
                                    fence,
                                };
                                let fenced = claim.fenced_by(observed.record.as_ref().and_then(|r| r.version.as_ref()));
                                let reserved = observed
                                    .record
                                    .as_ref()
                                    .and_then(|r| r.reservation_refuses(&holder, observed.now));
                                let reason = match (observed.live_holder(), fenced, reserved) {
                                    (Some(current), _, _) => format!("held by {current}"),
                                    (None, Some(fenced), _) => fenced,
                                    (None, None, Some(reserved)) => reserved,
                                    (None, None, None) => "not yet expired by the store's clock".to_string(),
                                };
                                return refusal.refuse(lost(&lock, reason));
                            }
                            let Some(term) = row.floor.unwrap_or(0).max(0).checked_add(1) else {
                                return refusal.refuse(StoreError::invalid(format!(
                                    "the term floor of {lock:?} is at its maximum: delete its row"
                                )));
                            };
                            let insert = keyed(&queries.insert, &lock)
                                .add_param("holder", holder.as_str())
                                .add_param("term", term)
                                .add_param("lease_ms", lease_ms)
                                .add_param("revision", revision)
                                .add_param("version", version)
                                .build();
                            tx.execute_update(insert).await?;
                            term
                        }
                    };
                    tx.buffer([queries.raise_floor(&lock, term)])?;
                    Ok(term)
                }
            })
            .await?;
        let committed_at = Self::committed("acquire", committed_at)?;
        Ok(Grant {
            term: term_from_row(lock, term)?,
            token: FencingToken(committed_at.0),
            committed_at,
        })
    }

    async fn take_over(&self, lock: &str, claim: &Claim<'_>, from: Held<'_>, lease: Duration) -> Result<Grant> {
        check_lock(lock)?;
        let lease_ms = lease_to_millis("lease duration", lease)?;
        let (revision, version) = version_columns(claim)?;
        let fence = claim.fence;
        let (queries, lock_name) = (self.queries.clone(), lock.to_string());
        let (holder, from_holder, from_token) = (claim.holder.to_string(), from.holder.to_string(), from.token);
        let (term, committed_at) = self
            .transact("take over", lock, move |tx, refusal| {
                let (queries, lock, holder, from_holder) =
                    (queries.clone(), lock_name.clone(), holder.clone(), from_holder.clone());
                let version = version.clone();
                async move {
                    let take_over = keyed(&queries.take_over, &lock)
                        .add_param("holder", holder.as_str())
                        .add_param("lease_ms", lease_ms)
                        .add_param("revision", revision)
                        .add_param("version", version)
                        .add_param("fence", fence)
                        .add_param("from_holder", from_holder.as_str())
                        .add_param("from_token", token_to_timestamp(from_token))
                        .build();
                    let Some(term) = returned_term(tx.execute_query(take_over).await?).await? else {
                        return refusal.refuse(lost(
                            &lock,
                            format!(
                                "not held by {from_holder} with token {from_token}, or refused by the version fence"
                            ),
                        ));
                    };
                    tx.buffer([queries.raise_floor(&lock, term)])?;
                    Ok(term)
                }
            })
            .await?;
        let committed_at = Self::committed("take over", committed_at)?;
        Ok(Grant {
            term: term_from_row(lock, term)?,
            token: FencingToken(committed_at.0),
            committed_at,
        })
    }

    async fn renew(&self, lock: &str, holder: &str, token: FencingToken, lease: Duration) -> Result<Grant> {
        check_lock(lock)?;
        let lease_ms = lease_to_millis("lease duration", lease)?;
        let body = check_and_set(&self.queries.renew, lock, holder, token, move |statement| {
            statement.add_param("lease_ms", lease_ms)
        });
        let (term, committed_at) = self.transact("renew", lock, body).await?;
        Ok(Grant {
            term: term_from_row(lock, term)?,
            token,
            committed_at: Self::committed("renew", committed_at)?,
        })
    }

    async fn release_for(&self, lock: &str, holder: &str, token: FencingToken, release: &Release) -> Result<()> {
        check_lock(lock)?;
        let handoff = release.handoff.as_ref();
        let reserved_for = handoff.map(|h| h.pod_uid().to_string());
        let window_ms = handoff.map(Handoff::window_ms);
        let ended = release.reason.as_str();
        let body = check_and_set(&self.queries.release, lock, holder, token, move |statement| {
            statement
                .add_typed_param("reserved_for", reserved_for.clone(), types::string())
                .add_typed_param("window_ms", window_ms, types::int64())
                .add_param("ended", ended)
        });
        self.transact("release", lock, body).await.map(|_| ())
    }
}

/// What a transaction body returns.
type TransactionFuture<T> = std::pin::Pin<Box<dyn Future<Output = google_cloud_spanner::Result<T>> + Send>>;

/// The body of a renew or release: `sql` (an `UPDATE … WHERE holder =
/// @holder AND token = @token THEN RETURN term`), with the parameters
/// `bind` adds; when it matches no row the lease is lost and the
/// transaction rolled back.
fn check_and_set(
    sql: &str,
    lock: &str,
    holder: &str,
    token: FencingToken,
    bind: impl Fn(StatementBuilder) -> StatementBuilder + Send + Sync + Clone + 'static,
) -> impl Fn(ReadWriteTransaction, Refusal) -> TransactionFuture<i64> + Send + Sync + Clone + 'static {
    let (sql, lock, holder) = (sql.to_string(), lock.to_string(), holder.to_string());
    move |tx, refusal| {
        let statement = bind(
            keyed(&sql, &lock)
                .add_param("holder", holder.as_str())
                .add_param("token", token_to_timestamp(token)),
        )
        .build();
        let (lock, holder) = (lock.clone(), holder.clone());
        Box::pin(async move {
            match returned_term(tx.execute_query(statement).await?).await? {
                Some(term) => Ok(term),
                None => refusal.refuse(lost(&lock, format!("not held by {holder} with token {token}"))),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_google_clients_find_ring_as_the_process_tls_provider() {
        // tonic and reqwest are built without a provider of their own and
        // build their TLS config from the process default, which panics
        // when none was installed.
        install_crypto_provider();
        let provider = rustls::crypto::CryptoProvider::get_default().expect("a process default provider");
        let ring = rustls::crypto::ring::default_provider();
        assert_eq!(
            provider.cipher_suites.iter().map(|s| s.suite()).collect::<Vec<_>>(),
            ring.cipher_suites.iter().map(|s| s.suite()).collect::<Vec<_>>()
        );
        let _client = rustls::ClientConfig::builder().with_root_certificates(rustls::RootCertStore::empty());
    }

    #[test]
    fn lock_names_cannot_reach_term_floor_rows() {
        check_lock("prod/web").unwrap();
        for bad in ["", "\u{1}term-floor:prod/web", "a\nb"] {
            assert!(matches!(check_lock(bad), Err(StoreError::Invalid { .. })), "{bad:?}");
        }
    }
}
