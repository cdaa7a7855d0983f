//! The PostgreSQL store (and CockroachDB, which speaks its protocol), on
//! `tokio-postgres` with a small `deadpool-postgres` pool.
//!
//! * acquire, renew and release are one SQL statement each, run in its own
//!   implicit transaction (S7): the statement *is* the commit, so there is no
//!   window between a decision and its write, and each costs one round trip.
//!   Renew and release are check-and-set on holder *and* token (S6, S8).
//! * Expiry is judged by the server's clock, `clock_timestamp()`, evaluated
//!   while the statement holds the row's lock (S3). `now()` would be the
//!   transaction's *start*, which can precede a long wait for that lock.
//! * The fencing token is `nextval()` of one sequence (`CACHE 1`, so values
//!   are handed out in call order), called in the `UPDATE` that takes an
//!   existing row, i.e. after the row lock is held, so a later term always
//!   draws a later value. The sequence is not tied to the table: a deleted
//!   and recreated row keeps drawing from it. `ensure_schema` starts it at the
//!   server's clock in nanoseconds, so even a dropped and recreated sequence
//!   starts above every token handed out before (unless the server clock went
//!   back), and tokens look like the Spanner store's commit timestamps.
//! * A statement whose reply is lost (connection closed, timeout) may have
//!   committed: an unknown outcome (S9), never success and never "nothing
//!   happened". An error the server returns for the statement means it did
//!   not commit; serialization failures and deadlocks (SQLSTATE 40001, 40P01;
//!   CockroachDB's retry errors) are retried with jittered backoff.
//! * Followers poll with a plain `SELECT` (MVCC, no locks), and learn of a
//!   release at once: the release statement sends `NOTIFY` on
//!   `<table>_released` with the lock as payload (delivered when it commits),
//!   and a follower's store listens on a connection of its own
//!   ([`super::push`]). A lost notice costs at most one poll.
//! * A takeover (a restarted sidecar resuming its own pod's lease) is one
//!   `UPDATE` matching exactly the holder and token it replaces.
//! * TLS (`sslmode=require`, `verify-ca`, `verify-full`) always checks the
//!   server's certificate, chain and host name ([`parse_url`]).
//!
//! CockroachDB: the same SQL runs unchanged (sequences, `INSERT … ON
//! CONFLICT … DO UPDATE … WHERE`, `RETURNING`, `clock_timestamp()`). The
//! differences: `clock_timestamp()` is the wall clock of whichever node
//! serves the statement, so two candidates connected to different nodes see
//! clocks up to the cluster's `--max-offset` (500 ms by default) apart; keep
//! D − R well above it. Its transactions are SERIALIZABLE, so racing
//! acquisitions surface as 40001 retry errors (retried here). A sequence is a
//! single hot key there; one `nextval` per acquisition, not per renewal, keeps
//! that cheap. The explicit `shard` column does what CockroachDB's hash-sharded
//! indexes do.

mod session;

pub use session::{Interleave, Stage};

use std::pin::Pin;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use futures::{Stream, StreamExt};
use tokio::sync::broadcast;
use tokio_postgres::config::SslMode;
use tokio_postgres::error::SqlState;
use tokio_postgres::{AsyncMessage, NoTls, Row};
use tokio_postgres_rustls::MakeRustlsConnect;
use tokio_util::task::AbortOnDropHandle;
use tracing::{debug, info};

use super::push::Releases;
use super::{Effect, StoreUrl, lease_from_millis, shard_of, term_from_row, tls, version_columns, version_from_row};
use crate::lease::store::Result;
use crate::lease::{
    Claim, Ended, FencingToken, Grant, Handoff, Held, Identity, LeaseRecord, LeaseStore, Observation, Release,
    Reservation, StoreError, StoreIdentity, StoreTime,
};

/// Where the lease table lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PostgresConfig {
    /// `postgres://user:password@host:port/database?…` (or key=value form).
    pub url: StoreUrl,
    /// Table name; the token sequence is `<table>_token_seq`.
    pub table: String,
}

/// How long one store call may take before it is abandoned.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections per store: one elector needs one; the rest absorb a racing
/// observe and a slow reconnect.
const POOL_SIZE: usize = 4;
/// Attempts of one statement that the server refused with a serialization
/// failure or deadlock before the call is reported unavailable.
const CONTENTION_ATTEMPTS: usize = 4;

/// PostgreSQL truncates identifiers at 63 bytes; the sequence name adds 10.
pub fn validate_table(table: &str) -> Result<()> {
    super::validate_table(table, "PostgreSQL", 48)
}

/// What a store URL asks for: the driver's settings and, when its `sslmode`
/// asks for TLS, the TLS client that checks the server's certificate.
#[derive(Debug, Clone)]
pub struct Connection {
    pub driver: tokio_postgres::Config,
    pub tls: Option<rustls::ClientConfig>,
}

/// Reads a store URL; the password never appears in an error.
///
/// `sslmode`: `require`, `verify-ca` and `verify-full` connect over TLS and
/// all check the certificate's chain *and* host name (libpq checks nothing
/// under `require`; a lease store must be the one it claims to be), against
/// `sslrootcert=FILE` or the system's roots. `disable`, `allow`, `prefer` and
/// no `sslmode` connect without TLS.
pub fn parse_url(url: &StoreUrl) -> Result<Connection> {
    let split = tls::take_params(url, &["sslmode", tls::CA_FILE_PARAM])?;
    let [mode, ca_file]: [Option<String>; 2] = split.taken.try_into().unwrap_or_default();
    let mut driver = tokio_postgres::Config::from_str(&split.url)
        .map_err(|e| StoreError::invalid(format!("store URL {url:?} is not a PostgreSQL URL")).caused_by(e))?;
    if driver.get_hosts().is_empty() {
        return Err(StoreError::invalid(format!("store URL {url:?} names no host")));
    }
    let wants_tls = match mode.as_deref() {
        // The key=value form keeps sslmode in the driver's settings.
        None => driver.get_ssl_mode() == SslMode::Require,
        Some("disable" | "allow" | "prefer") => false,
        Some("require" | "verify-ca" | "verify-full") => true,
        Some(other) => {
            return Err(StoreError::invalid(format!(
                "store URL {url:?}: sslmode={other} is not one of disable, allow, prefer, require, verify-ca, verify-full"
            )));
        }
    };
    let tls = match (wants_tls, ca_file) {
        (true, ca_file) => Some(tls::client_config(&tls::Roots::from_param(ca_file))?),
        (false, Some(_)) => {
            return Err(StoreError::invalid(format!(
                "store URL {url:?} names {} but connects without TLS; add sslmode=verify-full",
                tls::CA_FILE_PARAM
            )));
        }
        (false, None) => None,
    };
    driver.ssl_mode(if tls.is_some() {
        SslMode::Require
    } else {
        SslMode::Disable
    });
    Ok(Connection { driver, tls })
}

/// The SQL texts, built once per table.
#[derive(Debug)]
struct Queries {
    observe: String,
    observe_many: String,
    acquire: String,
    take_over: String,
    renew: String,
    /// Release and announce it ([`release_channel`]).
    release: String,
    /// Release without the notice, for servers without `pg_notify`.
    release_quietly: String,
    create_sequence: String,
    create_table: String,
    /// Adds the columns leasehold added after the table's first release.
    upgrade_table: String,
}

/// The lease row's columns both reads select (as `t`), in one place so that
/// a new column reaches both: `read_observation` decodes them by name.
const ROW_COLUMNS: &str = "t.holder, t.term, t.token, t.renewed_at, t.lease_ms, t.revision, t.version, t.reserved_for, t.reserved_until, \
     t.ended_term, t.ended";

/// What an acquire records as ended (`LeaseRecord::ended_by_acquire`): the
/// end written for the row's term, else `expired` for it.
const ENDED_BY_ACQUIRE: &str = "ended_term = t.term, \
     ended = CASE WHEN t.ended_term IS NOT DISTINCT FROM t.term THEN t.ended ELSE 'expired' END";

impl Queries {
    fn new(table: &str) -> Self {
        let sequence = format!("{table}_token_seq");
        Queries {
            // The LEFT JOIN returns the server's clock even when the row is absent.
            observe: format!(
                "SELECT clock_timestamp() AS now, {ROW_COLUMNS} \
                 FROM (SELECT 1) AS clock LEFT JOIN {table} AS t ON t.shard = $1 AND t.name = $2"
            ),
            // One row per named lock (its row's columns NULL when absent),
            // every one with the clock read once for the statement.
            observe_many: format!(
                "SELECT clock.now, l.name AS lock, {ROW_COLUMNS} \
                 FROM (SELECT clock_timestamp() AS now) AS clock \
                 CROSS JOIN unnest($1::BIGINT[], $2::TEXT[]) AS l(shard, name) \
                 LEFT JOIN {table} AS t ON t.shard = l.shard AND t.name = l.name"
            ),
            // Absent: insert term 1. Present: take it only when free or
            // expired by the server's clock, and the version fence allows
            // (`Claim::fenced_by`: no fence, nothing recorded, or $6 at least
            // the recorded revision; a NULL $6 compares as NULL, so refused),
            // judged under the row lock; and no reservation in force for a
            // pod other than the claimant's ($8, NULL without a pod UID:
            // `LeaseRecord::reserved_against`). Taking clears it.
            acquire: format!(
                "INSERT INTO {table} AS t (shard, name, holder, term, token, renewed_at, lease_ms, revision, version) \
                 VALUES ($1, $2, $3, 1, nextval('{sequence}'), clock_timestamp(), $4, $6, $7) \
                 ON CONFLICT (shard, name) DO UPDATE SET holder = excluded.holder, term = t.term + 1, \
                 token = nextval('{sequence}'), renewed_at = clock_timestamp(), lease_ms = excluded.lease_ms, \
                 revision = excluded.revision, version = excluded.version, reserved_for = NULL, reserved_until = NULL, \
                 {ENDED_BY_ACQUIRE} \
                 WHERE (t.holder IS NULL OR t.renewed_at + t.lease_ms * INTERVAL '1 millisecond' < clock_timestamp()) \
                 AND (NOT $5 OR t.revision IS NULL OR t.revision <= $6) \
                 AND (t.reserved_for IS NULL OR t.reserved_until <= clock_timestamp() OR t.reserved_for = $8) \
                 RETURNING t.term, t.token, t.renewed_at"
            ),
            // Only from exactly the holder and token named ($8, $9), live or
            // expired; the fence as in acquire. The term it replaces ended
            // by a restart of its sidecar.
            take_over: format!(
                "UPDATE {table} AS t SET holder = $3, term = t.term + 1, token = nextval('{sequence}'), \
                 renewed_at = clock_timestamp(), lease_ms = $4, revision = $6, version = $7, reserved_for = NULL, \
                 reserved_until = NULL, ended_term = t.term, ended = 'restarted' \
                 WHERE t.shard = $1 AND t.name = $2 AND t.holder = $8 AND t.token = $9 \
                 AND (NOT $5 OR t.revision IS NULL OR t.revision <= $6) \
                 RETURNING t.term, t.token, t.renewed_at"
            ),
            renew: format!(
                "UPDATE {table} SET renewed_at = clock_timestamp(), lease_ms = $5 \
                 WHERE shard = $1 AND name = $2 AND holder = $3 AND token = $4 RETURNING term, renewed_at"
            ),
            release_quietly: format!(
                "UPDATE {table} SET {RELEASED} WHERE shard = $1 AND name = $2 AND holder = $3 AND token = $4 \
                 RETURNING term"
            ),
            // The notice goes out when the release commits, and only then.
            release: format!(
                "WITH released AS (UPDATE {table} SET {RELEASED} \
                 WHERE shard = $1 AND name = $2 AND holder = $3 AND token = $4 RETURNING term) \
                 SELECT term, pg_notify('{}', $2) FROM released",
                release_channel(table)
            ),
            // START WITH is filled in with the server's clock at creation.
            create_sequence: format!("CREATE SEQUENCE IF NOT EXISTS {sequence} AS BIGINT CACHE 1 START WITH "),
            create_table: format!(
                "CREATE TABLE IF NOT EXISTS {table} (\n  shard BIGINT NOT NULL,\n  name TEXT NOT NULL,\n  \
                 holder TEXT,\n  term BIGINT NOT NULL,\n  token BIGINT NOT NULL,\n  \
                 renewed_at TIMESTAMPTZ NOT NULL,\n  lease_ms BIGINT NOT NULL,\n  revision BIGINT,\n  version TEXT,\n  \
                 reserved_for TEXT,\n  reserved_until TIMESTAMPTZ,\n  ended_term BIGINT,\n  ended TEXT,\n  PRIMARY KEY (shard, name)\n)"
            ),
            // Nullable: existing rows read as "no version recorded", "not
            // reserved" and "no end recorded".
            upgrade_table: format!(
                "ALTER TABLE {table} ADD COLUMN IF NOT EXISTS revision BIGINT, ADD COLUMN IF NOT EXISTS version TEXT, \
                 ADD COLUMN IF NOT EXISTS reserved_for TEXT, ADD COLUMN IF NOT EXISTS reserved_until TIMESTAMPTZ, \
                 ADD COLUMN IF NOT EXISTS ended_term BIGINT, ADD COLUMN IF NOT EXISTS ended TEXT"
            ),
        }
    }
}

/// What a release sets: no holder, the reservation of `$5` (a pod UID)
/// for `$6` ms capped at the row's lease duration (`Handoff::reservation`),
/// or none when `$5` is NULL, and `$7` as the end of its term.
const RELEASED: &str = "holder = NULL, reserved_for = $5::TEXT, reserved_until = CASE WHEN $5::TEXT IS NULL THEN NULL \
     ELSE clock_timestamp() + LEAST($6::BIGINT, lease_ms) * INTERVAL '1 millisecond' END, ended_term = term, \
     ended = $7::TEXT";

/// The channel a release of a lock in `table` is announced on (`NOTIFY`),
/// the lock as the payload. At most 57 bytes (the table at most 48), below
/// PostgreSQL's 63; quoted where it is an identifier, so its case is kept.
/// `host:port` of each server the driver config names (5432 when no port is given).
/// The store's identity ([`PostgresStore::identity`]).
const IDENTITY: &str = "SELECT (SELECT system_identifier::text FROM pg_catalog.pg_control_system()) AS system, \
                        current_database()::text AS database, current_schema()::text AS schema";

fn address_of(config: &tokio_postgres::Config) -> String {
    let ports = config.get_ports();
    config
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(i, host)| {
            let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
            match host {
                tokio_postgres::config::Host::Tcp(name) => format!("{name}:{port}"),
                tokio_postgres::config::Host::Unix(dir) => format!("{}/.s.PGSQL.{port}", dir.display()),
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

fn release_channel(table: &str) -> String {
    format!("{table}_released")
}

/// The PostgreSQL-backed [`LeaseStore`].
#[derive(Clone)]
pub struct PostgresStore {
    config: PostgresConfig,
    pool: Pool,
    call_timeout: Duration,
    /// `host:port` of the server(s), for the errors that say it is unreachable.
    address: String,
    queries: Arc<Queries>,
    /// For the connection that listens for releases, outside the pool.
    listener: Connection,
    releases: Arc<Releases>,
    /// Whether releases are announced: until the server refuses `pg_notify`.
    announces: Arc<AtomicBool>,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

fn store_time(t: SystemTime) -> StoreTime {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => StoreTime(i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)),
        Err(e) => StoreTime(-i64::try_from(e.duration().as_nanos()).unwrap_or(i64::MAX)),
    }
}

/// The lease duration as the row keeps it, by the core's one checked
/// conversion (an out-of-range lease is refused, never clamped).
fn lease_ms(lease: Duration) -> Result<i64> {
    crate::lease::lease_to_millis("lease duration", lease)
        .map_err(|e| StoreError::invalid("lease duration cannot be stored").caused_by(e))
}

/// The pauses between attempts the server refused for contention: jittered
/// exponential backoff, [`CONTENTION_ATTEMPTS`] attempts in all.
fn contention_backoff() -> ExponentialBackoff {
    ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(5))
        .with_max_delay(Duration::from_millis(200))
        .with_max_times(CONTENTION_ATTEMPTS - 1)
        .with_jitter()
        .build()
}

/// The server refused the statement for contention: it did not commit, and
/// running it again is safe.
fn is_contention(error: &tokio_postgres::Error) -> bool {
    matches!(
        error.code(),
        Some(c) if *c == SqlState::T_R_SERIALIZATION_FAILURE || *c == SqlState::T_R_DEADLOCK_DETECTED
    )
}

/// Whether `error` is the server's refusal with `state` ([`classify`] names it).
fn refused_with(error: &StoreError, state: &SqlState) -> bool {
    matches!(error, StoreError::Invalid { .. }) && error.to_string().contains(&format!("SQLSTATE {}", state.code()))
}

/// Sorts a driver error into the kinds the elector acts on.
fn classify(what: &str, error: tokio_postgres::Error, effect: Effect) -> StoreError {
    if let Some(db) = error.as_db_error() {
        let code = db.code();
        // CockroachDB's "result is ambiguous": it may have committed.
        if *code == SqlState::T_R_STATEMENT_COMPLETION_UNKNOWN {
            return effect
                .no_reply(format!("{what}: SQLSTATE {} (result ambiguous)", code.code()))
                .caused_by(error);
        }
        // Otherwise the server answered: the statement did not commit.
        let invalid = *code == SqlState::UNDEFINED_TABLE
            || *code == SqlState::UNDEFINED_OBJECT
            || *code == SqlState::INVALID_CATALOG_NAME
            || *code == SqlState::INSUFFICIENT_PRIVILEGE
            || *code == SqlState::INVALID_PASSWORD
            || *code == SqlState::INVALID_AUTHORIZATION_SPECIFICATION
            || code.code().starts_with("42");
        let hint = if *code == SqlState::UNDEFINED_TABLE {
            " (run ensure_schema: --create-table, or let the operator create it)"
        } else if *code == SqlState::UNDEFINED_COLUMN {
            " (the table predates a column this leasehold needs: run ensure_schema, --create-table or the \
             operator, to add it)"
        } else {
            ""
        };
        let context = format!("{what}: SQLSTATE {}{hint}", code.code());
        return match invalid {
            true => StoreError::invalid(context),
            false => StoreError::unavailable(context),
        }
        .caused_by(error);
    }
    // A parameter the driver could not encode never left this process (the
    // driver has no public kind for it; its message is fixed).
    if error.to_string().starts_with("error serializing parameter") {
        return StoreError::invalid(format!("{what}: a parameter could not be encoded")).caused_by(error);
    }
    // No answer: the connection closed or broke while the statement was out.
    effect
        .no_reply(format!("{what}: the connection ended before the reply"))
        .caused_by(error)
}

impl PostgresStore {
    /// A store on `config.url`; connects lazily, so an unreachable server
    /// shows up as `Unavailable` on the first call, not here.
    pub fn connect(config: PostgresConfig) -> Result<Self> {
        Self::connect_with(config, DEFAULT_CALL_TIMEOUT)
    }

    /// As [`connect`](Self::connect); every call is bounded by `call_timeout`.
    pub fn connect_with(config: PostgresConfig, call_timeout: Duration) -> Result<Self> {
        validate_table(&config.table)?;
        let Connection { driver: mut pg, tls } = parse_url(&config.url)?;
        if pg.get_connect_timeout().is_none() {
            pg.connect_timeout(call_timeout);
        }
        if pg.get_application_name().is_none() {
            pg.application_name("leasehold");
        }
        let address = address_of(&pg);
        // A closed connection is dropped on return; a broken one shows up on
        // its next statement.
        let recycling = || ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        };
        let listener = Connection {
            driver: pg.clone(),
            tls: tls.clone(),
        };
        let manager = match tls {
            Some(tls) => Manager::from_config(pg, MakeRustlsConnect::new(tls), recycling()),
            None => Manager::from_config(pg, NoTls, recycling()),
        };
        let pool = Pool::builder(manager)
            .max_size(POOL_SIZE)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(call_timeout))
            .create_timeout(Some(call_timeout))
            .recycle_timeout(Some(call_timeout))
            .build()
            .map_err(|e| StoreError::invalid("building the PostgreSQL connection pool").caused_by(e))?;
        Ok(PostgresStore {
            queries: Arc::new(Queries::new(&config.table)),
            config,
            pool,
            call_timeout,
            address,
            listener,
            releases: Arc::new(Releases::new()),
            announces: Arc::new(AtomicBool::new(true)),
        })
    }

    pub fn config(&self) -> &PostgresConfig {
        &self.config
    }

    /// Which store this is, whatever the URL says: the server's cluster
    /// (its system identifier, which physical replicas share, so a promoted
    /// replica is the same store), the database and the schema the URL's
    /// search path puts first. A rotated password or a new host name for
    /// the same server reads the same identity; another database or server
    /// reads another (docs/migrating-stores.md, "The store's identity").
    pub async fn identity(&self) -> Result<StoreIdentity> {
        let what = "read the store's identity";
        let rows = self
            .run(what, IDENTITY, &[], Effect::Read)
            .await
            .map_err(|e| match &e {
                _ if refused_with(&e, &SqlState::INSUFFICIENT_PRIVILEGE) => StoreError::invalid(
                    "the URL's user may not call pg_control_system(), which names the server: grant it \
                         (GRANT EXECUTE ON FUNCTION pg_catalog.pg_control_system() TO <user>)",
                )
                .caused_by(e),
                _ => e,
            })?;
        let row = rows
            .first()
            .ok_or_else(|| StoreError::invalid(format!("{what}: the query returned no row")))?;
        let get = |column: &str| -> Result<String> { row.try_get(column).map_err(|e| bad_reply(what, e)) };
        Ok(StoreIdentity::new(format!(
            "postgres:{}/{}/{}",
            get("system")?,
            get("database")?,
            get("schema")?
        )))
    }

    /// What an unreachable server looks like to a person: where, and how long we waited.
    fn no_connection(&self, what: &str) -> String {
        format!(
            "{what}: no connection to PostgreSQL at {} within {:?} (is the server up and the URL's host right?)",
            self.address, self.call_timeout
        )
    }

    /// Runs one statement on a pooled connection. Contention errors are
    /// retried with jittered exponential backoff while the call's time lasts;
    /// everything else is classified once.
    async fn run(
        &self,
        what: &str,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
        effect: Effect,
    ) -> Result<Vec<Row>> {
        self.run_retrying(what, sql, params, effect, is_contention).await
    }

    /// One idempotent DDL statement (`IF NOT EXISTS`). Two processes
    /// creating the same table at once can both find it absent, and the
    /// later then fails on the catalog's unique index (SQLSTATE 23505 on
    /// `pg_type`, or 42P07): the object exists by then, so the statement is
    /// run again and finds it.
    async fn run_ddl(&self, what: &str, sql: &str) -> Result<()> {
        let concurrent = |e: &tokio_postgres::Error| {
            is_contention(e)
                || matches!(e.code(), Some(c) if *c == SqlState::UNIQUE_VIOLATION
                    || *c == SqlState::DUPLICATE_TABLE
                    || *c == SqlState::DUPLICATE_OBJECT)
        };
        self.run_retrying(what, sql, &[], Effect::Read, concurrent)
            .await
            .map(drop)
    }

    /// [`run`](Self::run), trying again with backoff within the call
    /// timeout while `retry` says the statement lost a race and did nothing.
    async fn run_retrying(
        &self,
        what: &str,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
        effect: Effect,
        retry: impl Fn(&tokio_postgres::Error) -> bool,
    ) -> Result<Vec<Row>> {
        let deadline = tokio::time::Instant::now() + self.call_timeout;
        let mut backoff = contention_backoff();
        loop {
            let client = tokio::time::timeout_at(deadline, self.pool.get())
                .await
                .map_err(|_| StoreError::unavailable(self.no_connection(what)))?
                .map_err(|e| StoreError::unavailable(self.no_connection(what)).caused_by(e))?;
            let attempt = async {
                let statement = client.prepare_cached(sql).await.map_err(|e| (e, Effect::Read))?;
                client.query(&statement, params).await.map_err(|e| (e, effect))
            };
            let failed = match tokio::time::timeout_at(deadline, attempt).await {
                Ok(Ok(rows)) => return Ok(rows),
                Ok(Err(failed)) => failed,
                Err(_) => {
                    return Err(effect.no_reply(format!("{what}: no reply within {:?}", self.call_timeout)));
                }
            };
            let (error, effect) = failed;
            if retry(&error)
                && let Some(pause) = backoff.next()
                && tokio::time::Instant::now() + pause < deadline
            {
                debug!(%what, ?pause, error = %error, "contention; trying again");
                tokio::time::sleep(pause).await;
                continue;
            }
            return Err(classify(what, error, effect));
        }
    }

    /// The observation, every stored value converted with a check: a row
    /// out of range is refused, never clamped.
    fn read_observation(what: &str, lock: &str, row: &Row) -> Result<Observation> {
        let get = |e| bad_reply(what, e);
        let now: SystemTime = row.try_get("now").map_err(get)?;
        let term: Option<i64> = row.try_get("term").map_err(get)?;
        let record = match term {
            None => None,
            Some(term) => {
                let token: i64 = row.try_get("token").map_err(get)?;
                let renewed_at: SystemTime = row.try_get("renewed_at").map_err(get)?;
                let lease_ms: i64 = row.try_get("lease_ms").map_err(get)?;
                let revision: Option<i64> = row.try_get("revision").map_err(get)?;
                let version: Option<String> = row.try_get("version").map_err(get)?;
                let reserved_for: Option<String> = row.try_get("reserved_for").map_err(get)?;
                let reserved_until: Option<SystemTime> = row.try_get("reserved_until").map_err(get)?;
                let ended_term: Option<i64> = row.try_get("ended_term").map_err(get)?;
                let ended: Option<String> = row.try_get("ended").map_err(get)?;
                let ended_term = ended_term.map(|t| term_from_row(lock, t)).transpose()?;
                Some(LeaseRecord {
                    name: lock.to_string(),
                    holder: row.try_get("holder").map_err(get)?,
                    term: term_from_row(lock, term)?,
                    token: Some(FencingToken(token)),
                    renewed_at: Some(store_time(renewed_at)),
                    lease_duration: lease_from_millis("lease_ms", lock, lease_ms)?,
                    version: version_from_row(lock, revision, version.as_deref())?,
                    reservation: reserved_for.zip(reserved_until).map(|(pod_uid, until)| Reservation {
                        pod_uid,
                        until: store_time(until),
                    }),
                    ended: Ended::from_columns(ended_term, ended.as_deref()),
                })
            }
        };
        Ok(Observation {
            record,
            now: store_time(now),
        })
    }
}

/// Listens on `channel` on a connection of its own and passes on every
/// released lock announced there, until the connection ends.
async fn listen(connection: Connection, channel: String, notices: broadcast::Sender<String>) -> Result<()> {
    let what = format!("listening on {channel}");
    let refused = |e: tokio_postgres::Error| StoreError::unavailable(what.clone()).caused_by(e);
    let (client, messages): (_, Pin<Box<dyn Stream<Item = _> + Send>>) = match connection.tls {
        Some(tls) => {
            let (client, driver) = connection
                .driver
                .connect(MakeRustlsConnect::new(tls))
                .await
                .map_err(refused)?;
            (client, Box::pin(messages(driver)))
        }
        None => {
            let (client, driver) = connection.driver.connect(NoTls).await.map_err(refused)?;
            (client, Box::pin(messages(driver)))
        }
    };
    // The connection makes progress only while its messages are read, the
    // LISTEN's reply included.
    let forward = AbortOnDropHandle::new(tokio::spawn(async move {
        let mut messages = messages;
        while let Some(message) = messages.next().await {
            match message {
                Ok(AsyncMessage::Notification(notice)) => {
                    // Nobody waiting is fine.
                    let _ = notices.send(notice.payload().to_string());
                }
                Ok(_) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }));
    client
        .batch_execute(&format!("LISTEN \"{channel}\""))
        .await
        .map_err(refused)?;
    match forward.await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(refused(e)),
        Err(e) => Err(StoreError::unavailable(what.clone()).caused_by(e)),
    }
}

/// The messages of a driver connection (notices among them), as a stream.
fn messages<S, T>(
    mut driver: tokio_postgres::Connection<S, T>,
) -> impl Stream<Item = Result<AsyncMessage, tokio_postgres::Error>>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    futures::stream::poll_fn(move |cx| driver.poll_message(cx))
}

/// The grant an acquiring statement returned, or `Lost` (`why`) when it
/// matched no row.
fn granted(what: &str, lock: &str, rows: &[Row], why: impl FnOnce() -> String) -> Result<Grant> {
    let Some(row) = rows.first() else {
        return Err(StoreError::Lost {
            lock: lock.to_string(),
            reason: why(),
        });
    };
    let term: i64 = row.try_get("term").map_err(|e| bad_reply(what, e))?;
    let token: i64 = row.try_get("token").map_err(|e| bad_reply(what, e))?;
    let renewed_at: SystemTime = row.try_get("renewed_at").map_err(|e| bad_reply(what, e))?;
    Ok(Grant {
        term: term_from_row(lock, term)?,
        token: FencingToken(token),
        committed_at: store_time(renewed_at),
    })
}

/// A reply the store sent back that does not have the expected shape.
fn bad_reply(what: &str, error: tokio_postgres::Error) -> StoreError {
    StoreError::invalid(format!("{what}: unexpected reply from PostgreSQL")).caused_by(error)
}

#[async_trait]
impl LeaseStore for PostgresStore {
    fn kind(&self) -> &'static str {
        "postgres"
    }

    async fn ensure_schema(&self) -> Result<()> {
        let what = format!("creating table {}", self.config.table);
        // The sequence starts at the server's clock in nanoseconds (µs precision).
        let rows = self
            .run(
                &what,
                "SELECT (EXTRACT(EPOCH FROM clock_timestamp()) * 1000000)::BIGINT * 1000 AS now_ns",
                &[],
                Effect::Read,
            )
            .await?;
        let now_ns: i64 = rows
            .first()
            .ok_or_else(|| StoreError::invalid(format!("{what}: the clock query returned no row")))?
            .try_get("now_ns")
            .map_err(|e| bad_reply(&what, e))?;
        let create_sequence = format!("{}{now_ns}", self.queries.create_sequence);
        let sql = [
            create_sequence.as_str(),
            self.queries.create_table.as_str(),
            self.queries.upgrade_table.as_str(),
        ];
        for sql in sql {
            // DDL is idempotent (IF NOT EXISTS); a lost reply is retried by the next call.
            self.run_ddl(&what, sql).await?;
        }
        info!(table = %self.config.table, "lease table ready");
        Ok(())
    }

    /// Wakes at a release of `lock` announced by any store on this table
    /// (the release statement's `NOTIFY`).
    async fn changed(&self, lock: &str, _seen: &Observation) {
        let (connection, channel) = (self.listener.clone(), release_channel(&self.config.table));
        self.releases
            .released(lock, move |notices| {
                listen(connection.clone(), channel.clone(), notices)
            })
            .await
    }

    /// Wakes at a release of any lock announced on this table.
    async fn changed_any(&self) {
        let (connection, channel) = (self.listener.clone(), release_channel(&self.config.table));
        self.releases
            .any(move |notices| listen(connection.clone(), channel.clone(), notices))
            .await
    }

    async fn observe(&self, lock: &str) -> Result<Observation> {
        let what = format!("observe {lock}");
        let rows = self
            .run(&what, &self.queries.observe, &[&shard_of(lock), &lock], Effect::Read)
            .await?;
        let row = rows
            .first()
            .ok_or_else(|| StoreError::invalid(format!("{what}: the clock query returned no row")))?;
        Self::read_observation(&what, lock, row)
    }

    /// One statement: the locks as an array, each joined to its row.
    async fn observe_many(&self, locks: &[String]) -> Result<Vec<Observation>> {
        let what = format!("observe {} locks", locks.len());
        let shards: Vec<i64> = locks.iter().map(|lock| shard_of(lock)).collect();
        let rows = self
            .run(&what, &self.queries.observe_many, &[&shards, &locks], Effect::Read)
            .await?;
        let mut by_lock = std::collections::HashMap::with_capacity(rows.len());
        for row in &rows {
            let lock: String = row.try_get("lock").map_err(|e| bad_reply(&what, e))?;
            by_lock.insert(lock, row);
        }
        locks
            .iter()
            .map(|lock| {
                let row = by_lock
                    .get(lock)
                    .ok_or_else(|| StoreError::invalid(format!("{what}: no row came back for {lock:?}")))?;
                Self::read_observation(&what, lock, row)
            })
            .collect()
    }

    async fn acquire_as(&self, lock: &str, claim: &Claim<'_>, lease: Duration) -> Result<Grant> {
        let what = format!("acquire {lock}");
        let (revision, version) = version_columns(claim)?;
        let rows = self
            .run(
                &what,
                &self.queries.acquire,
                &[
                    &shard_of(lock),
                    &lock,
                    &claim.holder,
                    &lease_ms(lease)?,
                    &claim.fence,
                    &revision,
                    &version,
                    &Identity::pod_uid_of(claim.holder),
                ],
                Effect::Write,
            )
            .await?;
        granted(&what, lock, &rows, || {
            "held by an unexpired lease, refused by the version fence, or reserved for another pod (a transfer)".into()
        })
    }

    async fn take_over(&self, lock: &str, claim: &Claim<'_>, from: Held<'_>, lease: Duration) -> Result<Grant> {
        let what = format!("take over {lock}");
        let (revision, version) = version_columns(claim)?;
        let rows = self
            .run(
                &what,
                &self.queries.take_over,
                &[
                    &shard_of(lock),
                    &lock,
                    &claim.holder,
                    &lease_ms(lease)?,
                    &claim.fence,
                    &revision,
                    &version,
                    &from.holder,
                    &from.token.0,
                ],
                Effect::Write,
            )
            .await?;
        granted(&what, lock, &rows, || {
            format!(
                "not held by {} with token {}, or refused by the version fence",
                from.holder, from.token
            )
        })
    }

    async fn renew(&self, lock: &str, holder: &str, token: FencingToken, lease: Duration) -> Result<Grant> {
        let what = format!("renew {lock}");
        let rows = self
            .run(
                &what,
                &self.queries.renew,
                &[&shard_of(lock), &lock, &holder, &token.0, &lease_ms(lease)?],
                Effect::Write,
            )
            .await?;
        let Some(row) = rows.first() else {
            return Err(StoreError::Lost {
                lock: lock.to_string(),
                reason: format!("no longer held by {holder} with token {token}"),
            });
        };
        let term: i64 = row.try_get("term").map_err(|e| bad_reply(&what, e))?;
        let renewed_at: SystemTime = row.try_get("renewed_at").map_err(|e| bad_reply(&what, e))?;
        Ok(Grant {
            term: term_from_row(lock, term)?,
            token,
            committed_at: store_time(renewed_at),
        })
    }

    async fn release_for(&self, lock: &str, holder: &str, token: FencingToken, release: &Release) -> Result<()> {
        let what = format!("release {lock}");
        let handoff = release.handoff.as_ref();
        let (reserved_for, window_ms) = (handoff.map(Handoff::pod_uid), handoff.map(Handoff::window_ms));
        let ended = release.reason.as_str();
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 7] = [
            &shard_of(lock),
            &lock,
            &holder,
            &token.0,
            &reserved_for,
            &window_ms,
            &ended,
        ];
        let announced = self.announces.load(Ordering::Relaxed);
        let sql = match announced {
            true => &self.queries.release,
            false => &self.queries.release_quietly,
        };
        let rows = match self.run(&what, sql, &params, Effect::Write).await {
            // A server without pg_notify (CockroachDB) refused the statement,
            // so nothing happened: release without the notice from now on.
            Err(e) if announced && refused_with(&e, &SqlState::UNDEFINED_FUNCTION) => {
                info!(error = %e.chain(), "the server has no pg_notify: followers find releases at their next poll");
                self.announces.store(false, Ordering::Relaxed);
                self.run(&what, &self.queries.release_quietly, &params, Effect::Write)
                    .await?
            }
            rows => rows?,
        };
        match rows.len() {
            1 => Ok(()),
            _ => Err(StoreError::Lost {
                lock: lock.to_string(),
                reason: format!("not held by {holder} with token {token}"),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_checked_without_showing_the_password() {
        let ok = parse_url(&StoreUrl::new("postgres://app:pw@db:5432/leases")).unwrap();
        assert_eq!(ok.driver.get_dbname(), Some("leases"));
        assert!(ok.tls.is_none());
        for mode in ["require", "verify-ca", "verify-full"] {
            let url = format!("postgres://app:pw@db/x?sslmode={mode}&application_name=a");
            let tls = parse_url(&StoreUrl::new(url)).unwrap();
            assert!(tls.tls.is_some(), "{mode} connects over TLS");
            assert_eq!(tls.driver.get_ssl_mode(), SslMode::Require);
            assert_eq!(tls.driver.get_application_name(), Some("a"));
        }
        let keywords = parse_url(&StoreUrl::new("host=db user=app sslmode=require")).unwrap();
        assert!(keywords.tls.is_some(), "the key=value form's sslmode counts too");
        let err = parse_url(&StoreUrl::new("postgres://app:hunter2@db/x?sslmode=verify-everything"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("sslmode=verify-everything is not one of") && !err.contains("hunter2"),
            "{err}"
        );
        let err = parse_url(&StoreUrl::new("postgres://app:hunter2@db/x?sslrootcert=/ca.pem"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("sslrootcert but connects without TLS") && !err.contains("hunter2"),
            "{err}"
        );
        let err = parse_url(&StoreUrl::new("postgres://app:hunter2@db/x?bogus=1"))
            .unwrap_err()
            .chain();
        assert!(
            err.contains("is not a PostgreSQL URL") && !err.contains("hunter2"),
            "{err}"
        );
    }

    #[test]
    fn table_names_fit_postgres_identifiers_with_the_sequence_suffix() {
        validate_table("leasehold_leases").unwrap();
        let err = validate_table(&"t".repeat(49)).unwrap_err().to_string();
        assert!(err.contains("PostgreSQL identifier"), "{err}");
    }
}
