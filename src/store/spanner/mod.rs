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

mod schema;
mod session;

pub use super::spanner_names::{NameError, SpannerConfig, check_database, check_table};
pub use schema::SchemaError;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use async_trait::async_trait;
use google_cloud_gax::error::rpc::{Code, Status};
use google_cloud_lro::Poller;
use google_cloud_spanner::client::{DatabaseClient, Spanner};
use google_cloud_spanner::mutation::Mutation;
use google_cloud_spanner::result::ResultSet;
use google_cloud_spanner::statement::{Statement, StatementBuilder};
use google_cloud_spanner::transaction::ReadWriteTransaction;
use google_cloud_spanner_admin_database_v1::client::DatabaseAdmin;
use google_cloud_wkt::Timestamp;
use tracing::{info, warn};

use super::{lease_from_millis, shard_of, term_from_row, version_columns, version_from_row};
use crate::lease::store::Result;
use crate::lease::{Claim, FencingToken, Grant, Held, LeaseRecord, LeaseStore, Observation, StoreError, StoreTime};

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

/// What the store tells the operator when the lease table is absent.
const TABLE_MISSING_FIX: &str = "run the sidecar with --create-table or let the operator create it";

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

/// The SQL texts, built once per table.
#[derive(Debug)]
struct Queries {
    table: String,
    read: String,
    read_for_acquire: String,
    take: String,
    take_over: String,
    insert: String,
    renew: String,
    release: String,
}

/// The row is free, or its lease expired by the store's clock: the same
/// judgement as [`LeaseRecord::live_holder`], made under the row lock. The
/// elapsed time is truncated to whole milliseconds, so this can only find a
/// lease expired later than the exact comparison would, never sooner; a row
/// whose duration is not positive never matches (it is refused when read).
const FREE_OR_EXPIRED: &str = "(holder IS NULL OR renewed_at IS NULL \
     OR (lease_ms > 0 AND TIMESTAMP_DIFF(CURRENT_TIMESTAMP(), renewed_at, MILLISECOND) > lease_ms))";

/// [`Claim::fenced_by`] in SQL, judged under the row lock: no fence, no
/// version recorded, or the claim's revision at least the recorded one. A
/// claim without a revision (`@revision` NULL) compares as NULL, so it is
/// refused once a revision is recorded.
const FENCE_ALLOWS: &str = "(NOT @fence OR revision IS NULL OR revision <= @revision)";

impl Queries {
    fn new(table: &str) -> Self {
        let key = "shard = @shard AND name = @name";
        let ours = "holder = @holder AND token = @token";
        Queries {
            table: table.to_string(),
            // The LEFT JOIN returns the store's clock even when the row is absent.
            read: format!(
                "SELECT t.holder, t.term, t.token, t.renewed_at, t.lease_ms, t.revision, t.version, \
                 CURRENT_TIMESTAMP() AS now \
                 FROM (SELECT 1 AS one) AS clock LEFT JOIN {table} AS t ON t.shard = @shard AND t.name = @name"
            ),
            read_for_acquire: format!(
                "SELECT t.holder, t.term, t.token, t.renewed_at, t.lease_ms, t.revision, t.version, f.term AS floor, \
                 CURRENT_TIMESTAMP() AS now \
                 FROM (SELECT 1 AS one) AS clock \
                 LEFT JOIN {table} AS t ON t.shard = @shard AND t.name = @name \
                 LEFT JOIN {table} AS f ON f.shard = @shard AND f.name = @floor"
            ),
            take: format!(
                "UPDATE {table} SET holder = @holder, term = term + 1, token = PENDING_COMMIT_TIMESTAMP(), \
                 renewed_at = PENDING_COMMIT_TIMESTAMP(), lease_ms = @lease_ms, revision = @revision, \
                 version = @version WHERE {key} AND {FREE_OR_EXPIRED} AND {FENCE_ALLOWS} THEN RETURN term"
            ),
            // Only from exactly the holder and token named, live or expired.
            take_over: format!(
                "UPDATE {table} SET holder = @holder, term = term + 1, token = PENDING_COMMIT_TIMESTAMP(), \
                 renewed_at = PENDING_COMMIT_TIMESTAMP(), lease_ms = @lease_ms, revision = @revision, \
                 version = @version WHERE {key} AND holder = @from_holder AND token = @from_token AND {FENCE_ALLOWS} \
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
            release: format!("UPDATE {table} SET holder = NULL WHERE {key} AND {ours} THEN RETURN term"),
        }
    }

    /// The write that keeps the lock's term floor at `term`; see the module docs.
    fn raise_floor(&self, lock: &str, term: i64) -> Mutation {
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
fn floor_name(lock: &str) -> String {
    format!("\u{1}term-floor:{lock}")
}

/// A statement on one lock's row: `@shard` and `@name` bound.
fn keyed(sql: &str, lock: &str) -> StatementBuilder {
    Statement::builder(sql)
        .add_param("shard", shard_of(lock))
        .add_param("name", lock)
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

/// A lease duration into the row's milliseconds, by the core's one checked
/// conversion.
fn lease_to_millis(field: &'static str, lease: Duration) -> Result<i64> {
    crate::lease::lease_to_millis(field, lease)
        .map_err(|e| StoreError::invalid(format!("{field} cannot be stored")).caused_by(e))
}

fn timestamp_to_store(t: &Timestamp) -> StoreTime {
    StoreTime(
        t.seconds()
            .saturating_mul(1_000_000_000)
            .saturating_add(i64::from(t.nanos())),
    )
}

fn token_to_timestamp(token: FencingToken) -> Timestamp {
    Timestamp::clamp(
        token.0.div_euclid(1_000_000_000),
        token.0.rem_euclid(1_000_000_000) as i32,
    )
}

/// The Spanner status under a store error, when it came from Spanner. (Read
/// from the field: `Error::source` hands out the `Arc` around the cause, which
/// does not downcast to the client's error.)
fn spanner_status(error: &StoreError) -> Option<&Status> {
    let cause = match error {
        StoreError::Unavailable { source, .. }
        | StoreError::OutcomeUnknown { source, .. }
        | StoreError::Invalid { source, .. } => source.as_ref()?,
        StoreError::Lost { .. } => return None,
    };
    cause.downcast_ref::<google_cloud_spanner::Error>()?.status()
}

/// Spanner deleted the session (or lost it in a restart): nothing ran.
fn session_lost(error: &StoreError) -> bool {
    spanner_status(error).is_some_and(|s| s.code == Code::NotFound && s.message.contains("Session not found"))
}

/// Spanner reports an absent table as NOT_FOUND (reads) or INVALID_ARGUMENT
/// (when analysing a query).
fn table_missing(error: &StoreError) -> bool {
    spanner_status(error).is_some_and(names_missing_table)
}

fn names_missing_table(status: &Status) -> bool {
    matches!(status.code, Code::NotFound | Code::InvalidArgument) && status.message.contains("Table not found")
}

/// Sorts a client error into the kinds the elector acts on, keeping it as
/// the cause. `committing` says whether the commit request may have reached
/// Spanner.
fn classify(
    context: String,
    error: google_cloud_spanner::Error,
    committing: bool,
    config: &SpannerConfig,
) -> StoreError {
    let kind: fn(String) -> StoreError = match error.status() {
        Some(status) => {
            let text = status.message.as_str();
            match status.code {
                // The request named a session Spanner no longer has: it did
                // nothing, commit included. The store opens a new session.
                Code::NotFound if text.contains("Session not found") => StoreError::unavailable,
                Code::NotFound if text.contains("Database not found") || text.contains("Instance not found") => {
                    return StoreError::invalid(format!(
                        "{context}: database {} does not exist: create it, or correct the database path",
                        config.database
                    ))
                    .caused_by(error);
                }
                _ if names_missing_table(status) => {
                    return StoreError::invalid(format!(
                        "{context}: table {} does not exist in {}: {TABLE_MISSING_FIX}",
                        config.table, config.database
                    ))
                    .caused_by(error);
                }
                Code::FailedPrecondition if text.contains("allow_commit_timestamp") => {
                    return StoreError::invalid(format!(
                        "{context}: table {} cannot hold commit timestamps: {}",
                        config.table,
                        "ALTER TABLE … ALTER COLUMN token/renewed_at SET OPTIONS (allow_commit_timestamp = true)"
                    ))
                    .caused_by(error);
                }
                Code::InvalidArgument | Code::PermissionDenied | Code::Unauthenticated => StoreError::invalid,
                // ABORTED, even on the commit, means it did not commit.
                Code::Aborted => StoreError::unavailable,
                // Once the commit may have been sent, any other answer leaves
                // the outcome open: NOT_FOUND or FAILED_PRECONDITION on a
                // commit (the emulator's answers to contention) included.
                Code::NotFound
                | Code::FailedPrecondition
                | Code::DeadlineExceeded
                | Code::Unavailable
                | Code::Cancelled
                | Code::Unknown
                | Code::Internal
                    if committing =>
                {
                    StoreError::outcome_unknown
                }
                // Before the commit: nothing we know of committed.
                _ => StoreError::unavailable,
            }
        }
        None if committing && (error.is_timeout() || error.is_io() || error.is_transport() || error.is_exhausted()) => {
            StoreError::outcome_unknown
        }
        None => StoreError::unavailable,
    };
    kind(context).caused_by(error)
}

/// Where a transaction body leaves a refusal (lost, or an invalid row) before
/// returning the error [`Refusal::refuse`] makes, so that the runner rolls
/// the transaction back instead of committing it.
#[derive(Clone, Default)]
struct Refusal(Arc<Mutex<Option<StoreError>>>);

impl Refusal {
    fn refuse<T>(&self, error: StoreError) -> google_cloud_spanner::Result<T> {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(error);
        Err(google_cloud_spanner::Error::deser("refused; rolled back"))
    }

    fn take(&self) -> Option<StoreError> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

fn lost(lock: &str, reason: String) -> StoreError {
    StoreError::Lost {
        lock: lock.to_string(),
        reason,
    }
}

/// One row as read, before the checked conversion into a [`LeaseRecord`].
struct RawRow {
    holder: Option<String>,
    term: Option<i64>,
    token: Option<Timestamp>,
    renewed_at: Option<Timestamp>,
    lease_ms: Option<i64>,
    revision: Option<i64>,
    version: Option<String>,
    /// The term floor, when the query reads it.
    floor: Option<i64>,
    now: Timestamp,
}

impl RawRow {
    /// Reads the single row of a `read`/`read_for_acquire` query.
    async fn read(mut rows: ResultSet, with_floor: bool) -> google_cloud_spanner::Result<RawRow> {
        let row = rows
            .next()
            .await
            .transpose()?
            .ok_or_else(|| google_cloud_spanner::Error::deser("the clock query returned no row"))?;
        Ok(RawRow {
            holder: row.get("holder")?,
            term: row.get("term")?,
            token: row.get("token")?,
            renewed_at: row.get("renewed_at")?,
            lease_ms: row.get("lease_ms")?,
            revision: row.get("revision")?,
            version: row.get("version")?,
            floor: if with_floor { row.get("floor")? } else { None },
            now: row.get("now")?,
        })
    }

    /// The observation, every stored value converted with a check.
    fn decode(&self, lock: &str) -> Result<Observation> {
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
async fn returned_term(mut rows: ResultSet) -> google_cloud_spanner::Result<Option<i64>> {
    let mut term = None;
    while let Some(row) = rows.next().await.transpose()? {
        term = Some(row.get::<i64>("term")?);
    }
    Ok(term)
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
                                let reason = match (observed.live_holder(), fenced) {
                                    (Some(current), _) => format!("held by {current}"),
                                    (None, Some(fenced)) => fenced,
                                    (None, None) => "not yet expired by the store's clock".to_string(),
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
        let body = check_and_set(&self.queries.renew, lock, holder, token, Some(lease_ms));
        let (term, committed_at) = self.transact("renew", lock, body).await?;
        Ok(Grant {
            term: term_from_row(lock, term)?,
            token,
            committed_at: Self::committed("renew", committed_at)?,
        })
    }

    async fn release(&self, lock: &str, holder: &str, token: FencingToken) -> Result<()> {
        check_lock(lock)?;
        let body = check_and_set(&self.queries.release, lock, holder, token, None);
        self.transact("release", lock, body).await.map(|_| ())
    }
}

/// What a transaction body returns.
type TransactionFuture<T> = std::pin::Pin<Box<dyn Future<Output = google_cloud_spanner::Result<T>> + Send>>;

/// The body of a renew or release: `sql` (an `UPDATE … WHERE holder =
/// @holder AND token = @token THEN RETURN term`), with `@lease_ms` when
/// given; when it matches no row the lease is lost and the transaction
/// rolled back.
fn check_and_set(
    sql: &str,
    lock: &str,
    holder: &str,
    token: FencingToken,
    lease_ms: Option<i64>,
) -> impl Fn(ReadWriteTransaction, Refusal) -> TransactionFuture<i64> + Send + Sync + Clone + 'static {
    let (sql, lock, holder) = (sql.to_string(), lock.to_string(), holder.to_string());
    move |tx, refusal| {
        let mut statement = keyed(&sql, &lock)
            .add_param("holder", holder.as_str())
            .add_param("token", token_to_timestamp(token));
        if let Some(lease_ms) = lease_ms {
            statement = statement.add_param("lease_ms", lease_ms);
        }
        let statement = statement.build();
        let (lock, holder) = (lock.clone(), holder.clone());
        Box::pin(async move {
            match returned_term(tx.execute_query(statement).await?).await? {
                Some(term) => Ok(term),
                None => refusal.refuse(lost(&lock, format!("not held by {holder} with token {token}"))),
            }
        })
    }
}

/// Creates (when missing) an instance and a database on the Cloud Spanner
/// emulator, for the demo and the tests; production databases are made by
/// their owners. Returns the database path.
pub async fn create_emulator_database(
    endpoints: &Endpoints,
    project: &str,
    instance: &str,
    database: &str,
) -> Result<String> {
    const ADMIN_TIMEOUT: Duration = Duration::from_secs(10);
    tokio::time::timeout(
        ADMIN_TIMEOUT,
        create_on_emulator(endpoints, project, instance, database),
    )
    .await
    .map_err(|_| {
        StoreError::unavailable(format!(
            "no answer from the Spanner emulator's admin API within {ADMIN_TIMEOUT:?}"
        ))
    })?
}

async fn create_on_emulator(endpoints: &Endpoints, project: &str, instance: &str, database: &str) -> Result<String> {
    let spanner = client(endpoints, DEFAULT_CALL_TIMEOUT).await?;
    let mut instances = spanner.instance_admin_builder();
    let mut databases = spanner.database_admin_builder();
    if let Some(endpoint) = &endpoints.admin {
        instances = instances.with_endpoint(endpoint.clone());
        databases = databases.with_endpoint(endpoint.clone());
    }
    let instances = instances
        .build()
        .await
        .map_err(|e| StoreError::unavailable("emulator instance admin").caused_by(e))?;
    let instance_path = format!("projects/{project}/instances/{instance}");
    let created = instances
        .create_instance()
        .set_parent(format!("projects/{project}"))
        .set_instance_id(instance)
        .set_instance(
            google_cloud_spanner_admin_instance_v1::model::Instance::new()
                .set_name(instance_path.clone())
                .set_config(format!("projects/{project}/instanceConfigs/emulator-config"))
                .set_display_name(instance)
                .set_node_count(1),
        )
        .poller()
        .until_done()
        .await;
    created_or_there(created, || format!("creating emulator instance {instance_path}"))?;
    let databases = databases
        .build()
        .await
        .map_err(|e| StoreError::unavailable("emulator database admin").caused_by(e))?;
    let created = databases
        .create_database()
        .set_parent(instance_path.clone())
        .set_create_statement(format!("CREATE DATABASE `{database}`"))
        .poller()
        .until_done()
        .await;
    created_or_there(created, || format!("creating emulator database {database}"))?;
    Ok(format!("{instance_path}/databases/{database}"))
}

/// A create that succeeded or found the thing already there.
fn created_or_there<T>(
    created: std::result::Result<T, google_cloud_spanner::Error>,
    what: impl FnOnce() -> String,
) -> Result<()> {
    match created {
        Err(e)
            if !e.to_string().contains("already exists") && e.status().map(|s| s.code) != Some(Code::AlreadyExists) =>
        {
            Err(StoreError::unavailable(what()).caused_by(e))
        }
        _ => Ok(()),
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

    fn spanner_error(code: Code, message: &str) -> google_cloud_spanner::Error {
        google_cloud_spanner::Error::service(Status::default().set_code(code).set_message(message))
    }

    fn config() -> SpannerConfig {
        SpannerConfig {
            database: "projects/p/instances/i/databases/d".into(),
            table: "leases".into(),
        }
    }

    #[test]
    fn an_answer_after_the_commit_was_sent_leaves_the_outcome_open() {
        for code in [
            Code::NotFound,
            Code::FailedPrecondition,
            Code::DeadlineExceeded,
            Code::Internal,
        ] {
            for committing in [false, true] {
                let error = classify(
                    "renew".into(),
                    spanner_error(code, "Transaction not found"),
                    committing,
                    &config(),
                );
                let expected = match error {
                    StoreError::Unavailable { .. } => !committing,
                    StoreError::OutcomeUnknown { .. } => committing,
                    _ => false,
                };
                assert!(expected, "{code:?}, committing {committing}: {error:?}");
                assert!(
                    error.chain().contains("Transaction not found"),
                    "the cause is kept: {}",
                    error.chain()
                );
            }
        }
        // ABORTED, even on the commit, did not commit.
        let aborted = classify("renew".into(), spanner_error(Code::Aborted, "aborted"), true, &config());
        assert!(matches!(aborted, StoreError::Unavailable { .. }), "{aborted:?}");
    }

    #[test]
    fn a_lost_session_did_nothing_and_is_recognised() {
        let lost = classify(
            "renew".into(),
            spanner_error(
                Code::NotFound,
                "Session not found: projects/p/instances/i/databases/d/sessions/0",
            ),
            true,
            &config(),
        );
        assert!(matches!(lost, StoreError::Unavailable { .. }), "{lost:?}");
        assert!(session_lost(&lost));
        assert!(!table_missing(&lost));
    }

    #[test]
    fn missing_things_are_invalid_with_the_fix() {
        for code in [Code::NotFound, Code::InvalidArgument] {
            let table = classify(
                "observe x".into(),
                spanner_error(code, "Table not found: leases [at 1:130]"),
                false,
                &config(),
            );
            assert!(matches!(table, StoreError::Invalid { .. }), "{table:?}");
            assert!(table.to_string().contains(TABLE_MISSING_FIX), "{table}");
            assert!(table_missing(&table));
        }
        let database = classify(
            "observe x".into(),
            spanner_error(Code::NotFound, "Database not found: projects/p/instances/i/databases/d"),
            false,
            &config(),
        );
        assert!(matches!(database, StoreError::Invalid { .. }), "{database:?}");
        assert!(database.to_string().contains("does not exist: create it"), "{database}");
        let schema = classify(
            "renew x".into(),
            spanner_error(
                Code::FailedPrecondition,
                "allow_commit_timestamp column option is not set",
            ),
            true,
            &config(),
        );
        assert!(matches!(schema, StoreError::Invalid { .. }), "{schema:?}");
    }

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
    fn lock_names_cannot_reach_term_floor_rows() {
        check_lock("prod/web").unwrap();
        for bad in ["", "\u{1}term-floor:prod/web", "a\nb"] {
            assert!(matches!(check_lock(bad), Err(StoreError::Invalid { .. })), "{bad:?}");
        }
    }

    #[test]
    fn tokens_round_trip_through_timestamps() {
        for nanos in [0, 1, 1_700_000_000_123_456_789, 999_999_999] {
            assert_eq!(timestamp_to_store(&token_to_timestamp(FencingToken(nanos))).0, nanos);
        }
    }
}
