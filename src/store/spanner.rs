//! The Cloud Spanner store, on the official `google-cloud-spanner` client.
//!
//! * Every expiry judgement uses `CURRENT_TIMESTAMP()` read inside the same
//!   transaction (S3): no candidate's wall clock is ever consulted.
//! * acquire, renew and release are one read-write transaction each (S7);
//!   renew and release are check-and-set on holder *and* token (S6, S8).
//! * The fencing token is the acquisition's commit timestamp, written with
//!   `PENDING_COMMIT_TIMESTAMP()`; commit timestamps of transactions writing
//!   one row strictly increase, across delete and recreate too.
//! * The transaction closures have no side effects beyond the transaction,
//!   so the runner may retry them after ABORTED (S10).
//! * An error while the commit is in flight is an unknown outcome (S9),
//!   never success and never "nothing happened".
//! * Followers poll with a strong single-use read and open a read-write
//!   transaction only when the lease looks free or expired (the elector's job).
//! * Statements are parameterized; only the table name, validated as an
//!   identifier, is part of the SQL text.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use google_cloud_gax::error::rpc::Code;
use google_cloud_lro::Poller;
use google_cloud_spanner::client::{DatabaseClient, Spanner};
use google_cloud_spanner::statement::Statement;
use google_cloud_spanner_admin_database_v1::client::DatabaseAdmin;
use google_cloud_wkt::Timestamp;
use tracing::info;

use super::shard_of;
use crate::lease::store::Result;
use crate::lease::{FencingToken, Grant, LeaseRecord, LeaseStore, Observation, StoreError, StoreTime};

/// Where the lease table lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpannerConfig {
    /// `projects/<p>/instances/<i>/databases/<d>`.
    pub database: String,
    /// Table name, validated as an identifier.
    pub table: String,
}

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

/// The Spanner-backed [`LeaseStore`].
#[derive(Clone)]
pub struct SpannerStore {
    config: SpannerConfig,
    spanner: Spanner,
    client: DatabaseClient,
    admin_endpoint: Option<String>,
    call_timeout: Duration,
    queries: Arc<Queries>,
}

impl std::fmt::Debug for SpannerStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpannerStore")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// The SQL texts, built once per table.
#[derive(Debug)]
struct Queries {
    read: String,
    insert: String,
    take: String,
    renew: String,
    release: String,
    table_exists: &'static str,
    create_table: String,
}

impl Queries {
    fn new(table: &str) -> Self {
        Queries {
            // The LEFT JOIN returns the store's clock even when the row is absent.
            read: format!(
                "SELECT t.holder, t.term, t.token, t.renewed_at, t.lease_ms, CURRENT_TIMESTAMP() AS now \
                 FROM (SELECT 1 AS one) AS clock LEFT JOIN {table} AS t ON t.shard = @shard AND t.name = @name"
            ),
            insert: format!(
                "INSERT INTO {table} (shard, name, holder, term, token, renewed_at, lease_ms) \
                 VALUES (@shard, @name, @holder, @term, PENDING_COMMIT_TIMESTAMP(), PENDING_COMMIT_TIMESTAMP(), @lease_ms)"
            ),
            take: format!(
                "UPDATE {table} SET holder = @holder, term = @term, token = PENDING_COMMIT_TIMESTAMP(), \
                 renewed_at = PENDING_COMMIT_TIMESTAMP(), lease_ms = @lease_ms WHERE shard = @shard AND name = @name"
            ),
            renew: format!(
                "UPDATE {table} SET renewed_at = PENDING_COMMIT_TIMESTAMP(), lease_ms = @lease_ms \
                 WHERE shard = @shard AND name = @name AND holder = @holder AND token = @token"
            ),
            release: format!(
                "UPDATE {table} SET holder = NULL \
                 WHERE shard = @shard AND name = @name AND holder = @holder AND token = @token"
            ),
            table_exists: "SELECT COUNT(*) AS n FROM INFORMATION_SCHEMA.TABLES \
                           WHERE TABLE_SCHEMA = '' AND TABLE_NAME = @table",
            create_table: format!(
                "CREATE TABLE {table} (\n  shard INT64 NOT NULL,\n  name STRING(MAX) NOT NULL,\n  holder STRING(MAX),\n  \
                 term INT64 NOT NULL,\n  token TIMESTAMP OPTIONS (allow_commit_timestamp=true),\n  \
                 renewed_at TIMESTAMP OPTIONS (allow_commit_timestamp=true),\n  lease_ms INT64 NOT NULL,\n\
                 ) PRIMARY KEY (shard, name)"
            ),
        }
    }
}

/// A statement on one lock's row: `@shard` and `@name` bound.
fn keyed(sql: &str, lock: &str) -> google_cloud_spanner::statement::StatementBuilder {
    Statement::builder(sql)
        .add_param("shard", shard_of(lock))
        .add_param("name", lock)
}

/// Reads the row and the store's clock inside a read-write transaction.
async fn read_in(
    tx: &google_cloud_spanner::transaction::ReadWriteTransaction,
    queries: &Queries,
    lock: &str,
) -> google_cloud_spanner::Result<Observation> {
    SpannerStore::read_row(lock, tx.execute_query(keyed(&queries.read, lock).build()).await?).await
}

/// A table name usable in Spanner SQL text.
pub fn validate_table(table: &str) -> Result<()> {
    super::validate_table(table, "Spanner", 128)
}

/// `projects/P/instances/I/databases/D`, each part non-empty.
pub fn validate_database(database: &str) -> Result<()> {
    let parts: Vec<&str> = database.split('/').collect();
    match parts.as_slice() {
        ["projects", p, "instances", i, "databases", d] if [p, i, d].iter().all(|s| !s.is_empty()) => Ok(()),
        _ => Err(StoreError::invalid(format!(
            "database {database:?} is not of the form projects/<project>/instances/<instance>/databases/<database>"
        ))),
    }
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

/// Sorts a client error into the kinds the elector acts on. `committing`
/// says whether the commit request may have reached Spanner.
fn classify(what: &str, error: &google_cloud_spanner::Error, committing: bool, database: &str) -> StoreError {
    let message = format!("{what}: {error}");
    if let Some(status) = error.status() {
        let text = status.message.as_str();
        return match status.code {
            Code::NotFound if text.contains("Database not found") || text.contains("Instance not found") => {
                StoreError::invalid(format!("{database}: {}", status.message))
            }
            Code::NotFound if text.contains("Table not found") => StoreError::invalid(format!(
                "{database}: {} (run ensure_schema, or let the operator create it)",
                status.message
            )),
            Code::InvalidArgument | Code::PermissionDenied | Code::Unauthenticated => StoreError::invalid(message),
            // The emulator reports contention between racing transactions as
            // FAILED_PRECONDITION / NOT_FOUND on the transaction; production as
            // ABORTED once retries ran out. Either way: nothing we know of
            // committed; try again later.
            Code::Aborted | Code::FailedPrecondition | Code::NotFound => StoreError::unavailable(message),
            Code::DeadlineExceeded | Code::Unavailable | Code::Cancelled | Code::Unknown | Code::Internal
                if committing =>
            {
                StoreError::outcome_unknown(message)
            }
            _ => StoreError::unavailable(message),
        };
    }
    if committing && (error.is_timeout() || error.is_io() || error.is_transport() || error.is_exhausted()) {
        StoreError::outcome_unknown(message)
    } else {
        StoreError::unavailable(message)
    }
}

/// What a read-write transaction decided.
enum Decision<T> {
    Wrote(T),
    Refused(String),
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
        let client = tokio::time::timeout(call_timeout, spanner.database_client(config.database.clone()).build())
            .await
            .map_err(|_| {
                StoreError::unavailable(format!(
                    "no answer from Spanner for {} within {call_timeout:?}",
                    config.database
                ))
            })?
            .map_err(|e| classify("opening the database", &e, false, &config.database))?;
        let queries = Arc::new(Queries::new(&config.table));
        Ok(SpannerStore {
            config,
            spanner,
            client,
            admin_endpoint: endpoints.admin,
            call_timeout,
            queries,
        })
    }

    pub fn config(&self) -> &SpannerConfig {
        &self.config
    }

    /// Reads the row and the store's clock in `tx` (a read-only or read-write transaction's query).
    async fn read_row(
        lock: &str,
        mut rows: google_cloud_spanner::result::ResultSet,
    ) -> google_cloud_spanner::Result<Observation> {
        let row = rows
            .next()
            .await
            .transpose()?
            .ok_or_else(|| google_cloud_spanner::Error::deser("the clock query returned no row"))?;
        let now: Timestamp = row.get("now")?;
        let term: Option<i64> = row.get("term")?;
        let record = match term {
            None => None,
            Some(term) => {
                let token: Option<Timestamp> = row.get("token")?;
                let renewed: Option<Timestamp> = row.get("renewed_at")?;
                let lease_ms: i64 = row.get("lease_ms")?;
                Some(LeaseRecord {
                    name: lock.to_string(),
                    holder: row.get("holder")?,
                    term: term as u64,
                    token: token.as_ref().map(|t| FencingToken(timestamp_to_store(t).0)),
                    renewed_at: renewed.as_ref().map(timestamp_to_store),
                    lease_duration: Duration::from_millis(lease_ms.max(0) as u64),
                })
            }
        };
        Ok(Observation {
            record,
            now: timestamp_to_store(&now),
        })
    }

    /// Runs `body` in a read-write transaction, classifying failures and
    /// telling an error during the commit (unknown outcome) from one before.
    async fn transact<T, F, Fut>(&self, what: &str, lock: &str, body: F) -> Result<(T, Option<StoreTime>)>
    where
        T: Send + 'static,
        F: Fn(google_cloud_spanner::transaction::ReadWriteTransaction) -> Fut + Send + Sync + Clone + 'static,
        Fut: std::future::Future<Output = google_cloud_spanner::Result<Decision<T>>> + Send,
    {
        let committing = Arc::new(AtomicBool::new(false));
        let runner = self
            .client
            .read_write_transaction()
            .with_transaction_timeout(self.call_timeout)
            .build();
        let flag = committing.clone();
        let run = runner.run(move |tx| {
            let (body, flag) = (body.clone(), flag.clone());
            async move {
                flag.store(false, Ordering::SeqCst);
                let decision = body(tx).await?;
                // From here on the commit may reach Spanner.
                flag.store(true, Ordering::SeqCst);
                Ok(decision)
            }
        });
        let outcome = tokio::time::timeout(self.call_timeout, run).await;
        let committing = committing.load(Ordering::SeqCst);
        let result = match outcome {
            Err(_) if committing => {
                return Err(StoreError::outcome_unknown(format!(
                    "{what} {lock}: no commit reply within {:?}",
                    self.call_timeout
                )));
            }
            Err(_) => {
                return Err(StoreError::unavailable(format!(
                    "{what} {lock}: no reply within {:?}",
                    self.call_timeout
                )));
            }
            Ok(Err(e)) => {
                return Err(classify(
                    &format!("{what} {lock}"),
                    &e,
                    committing,
                    &self.config.database,
                ));
            }
            Ok(Ok(result)) => result,
        };
        let committed_at = result.commit_timestamp().as_ref().map(timestamp_to_store);
        match result.into_inner() {
            Decision::Wrote(value) => Ok((value, committed_at)),
            Decision::Refused(reason) => Err(StoreError::Lost {
                lock: lock.to_string(),
                reason,
            }),
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
            .map_err(|e| StoreError::unavailable(format!("Spanner admin client: {e}")))
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
        .map_err(|e| StoreError::unavailable(format!("cannot set up the Spanner client: {e}")))
}

#[async_trait]
impl LeaseStore for SpannerStore {
    fn kind(&self) -> &'static str {
        "spanner"
    }

    async fn ensure_schema(&self) -> Result<()> {
        let database = &self.config.database;
        let statement = Statement::builder(self.queries.table_exists)
            .add_param("table", self.config.table.as_str())
            .build();
        let count = async {
            let mut rows = self.client.single_use().build().execute_query(statement).await?;
            let row = rows.next().await.transpose()?;
            Ok::<i64, google_cloud_spanner::Error>(match row {
                Some(row) => row.get("n")?,
                None => 0,
            })
        };
        let count = tokio::time::timeout(self.call_timeout, count)
            .await
            .map_err(|_| StoreError::unavailable(format!("{database}: no answer within {:?}", self.call_timeout)))?
            .map_err(|e| classify("looking for the lease table", &e, false, database))?;
        if count > 0 {
            return Ok(());
        }
        info!(%database, table = %self.config.table, "creating the lease table");
        let created = self
            .admin()
            .await?
            .update_database_ddl()
            .set_database(database.clone())
            .set_statements([self.queries.create_table.clone()])
            .poller()
            .until_done()
            .await;
        match created {
            Ok(_) => Ok(()),
            // Another replica created it first.
            Err(e)
                if e.to_string().contains("Duplicate name in schema") || e.to_string().contains("already exists") =>
            {
                Ok(())
            }
            Err(e) => Err(classify(
                &format!("creating table {}", self.config.table),
                &e,
                false,
                database,
            )),
        }
    }

    async fn observe(&self, lock: &str) -> Result<Observation> {
        let statement = keyed(&self.queries.read, lock).build();
        let read = async {
            let rows = self.client.single_use().build().execute_query(statement).await?;
            Self::read_row(lock, rows).await
        };
        tokio::time::timeout(self.call_timeout, read)
            .await
            .map_err(|_| StoreError::unavailable(format!("observe {lock}: no reply within {:?}", self.call_timeout)))?
            .map_err(|e| classify(&format!("observe {lock}"), &e, false, &self.config.database))
    }

    async fn acquire(&self, lock: &str, holder: &str, lease: Duration) -> Result<Grant> {
        let queries = self.queries.clone();
        let (lock_owned, holder) = (lock.to_string(), holder.to_string());
        let lease_ms = lease.as_millis() as i64;
        let (term, committed_at) = self
            .transact("acquire", lock, move |tx| {
                let (queries, lock, holder) = (queries.clone(), lock_owned.clone(), holder.clone());
                async move {
                    let observed = read_in(&tx, &queries, &lock).await?;
                    if let Some(current) = observed.live_holder() {
                        return Ok(Decision::Refused(format!("held by {current}")));
                    }
                    let term = observed.record.as_ref().map_or(0, |r| r.term) + 1;
                    let sql = if observed.record.is_some() {
                        &queries.take
                    } else {
                        &queries.insert
                    };
                    let write = keyed(sql.as_str(), &lock)
                        .add_param("holder", holder.as_str())
                        .add_param("term", term as i64)
                        .add_param("lease_ms", lease_ms)
                        .build();
                    tx.execute_update(write).await?;
                    Ok(Decision::Wrote(term))
                }
            })
            .await?;
        let committed_at = Self::committed("acquire", committed_at)?;
        Ok(Grant {
            term,
            token: FencingToken(committed_at.0),
            committed_at,
        })
    }

    async fn renew(&self, lock: &str, holder: &str, token: FencingToken, lease: Duration) -> Result<Grant> {
        let queries = self.queries.clone();
        let (lock_owned, holder) = (lock.to_string(), holder.to_string());
        let lease_ms = lease.as_millis() as i64;
        let (term, committed_at) = self
            .transact("renew", lock, move |tx| {
                let (queries, lock, holder) = (queries.clone(), lock_owned.clone(), holder.clone());
                async move {
                    let observed = read_in(&tx, &queries, &lock).await?;
                    let Some(record) = observed
                        .record
                        .filter(|r| r.holder.as_deref() == Some(holder.as_str()) && r.token == Some(token))
                    else {
                        return Ok(Decision::Refused(format!(
                            "no longer held by {holder} with token {token}"
                        )));
                    };
                    let write = keyed(queries.renew.as_str(), &lock)
                        .add_param("holder", holder.as_str())
                        .add_param("token", token_to_timestamp(token))
                        .add_param("lease_ms", lease_ms)
                        .build();
                    match tx.execute_update(write).await? {
                        1 => Ok(Decision::Wrote(record.term)),
                        _ => Ok(Decision::Refused(format!("token {token} superseded"))),
                    }
                }
            })
            .await?;
        Ok(Grant {
            term,
            token,
            committed_at: Self::committed("renew", committed_at)?,
        })
    }

    async fn release(&self, lock: &str, holder: &str, token: FencingToken) -> Result<()> {
        let queries = self.queries.clone();
        let (lock_owned, holder) = (lock.to_string(), holder.to_string());
        self.transact("release", lock, move |tx| {
            let (queries, lock, holder) = (queries.clone(), lock_owned.clone(), holder.clone());
            async move {
                let write = keyed(queries.release.as_str(), &lock)
                    .add_param("holder", holder.as_str())
                    .add_param("token", token_to_timestamp(token))
                    .build();
                match tx.execute_update(write).await? {
                    1 => Ok(Decision::Wrote(())),
                    _ => Ok(Decision::Refused(format!("not held by {holder} with token {token}"))),
                }
            }
        })
        .await
        .map(|_| ())
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
    let unavailable = |what: &str, e: &dyn std::fmt::Display| StoreError::unavailable(format!("{what}: {e}"));
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
        .map_err(|e| unavailable("emulator instance admin", &e))?;
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
    if let Err(e) = created
        && !e.to_string().contains("already exists")
        && e.status().map(|s| s.code) != Some(Code::AlreadyExists)
    {
        return Err(unavailable(&format!("creating emulator instance {instance_path}"), &e));
    }
    let databases = databases
        .build()
        .await
        .map_err(|e| unavailable("emulator database admin", &e))?;
    let created = databases
        .create_database()
        .set_parent(instance_path.clone())
        .set_create_statement(format!("CREATE DATABASE `{database}`"))
        .poller()
        .until_done()
        .await;
    if let Err(e) = created
        && !e.to_string().contains("already exists")
        && e.status().map(|s| s.code) != Some(Code::AlreadyExists)
    {
        return Err(unavailable(&format!("creating emulator database {database}"), &e));
    }
    Ok(format!("{instance_path}/databases/{database}"))
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
    fn database_paths_are_checked() {
        validate_database("projects/p/instances/i/databases/d").unwrap();
        for bad in [
            "",
            "projects/p/instances/i",
            "projects//instances/i/databases/d",
            "p/i/d",
        ] {
            let err = validate_database(bad).unwrap_err().to_string();
            assert!(
                err.contains("projects/<project>/instances/<instance>/databases/<database>"),
                "{err}"
            );
        }
    }

    #[test]
    fn tokens_round_trip_through_timestamps() {
        for nanos in [0, 1, 1_700_000_000_123_456_789, 999_999_999] {
            assert_eq!(timestamp_to_store(&token_to_timestamp(FencingToken(nanos))).0, nanos);
        }
    }
}
