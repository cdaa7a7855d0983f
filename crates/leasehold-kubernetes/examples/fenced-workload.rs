//! A fenced workload: the app container of a DistributedLease's candidate
//! pod that writes as fast as it reasonably can while its sidecar says it
//! leads, each write carrying (pod, fencing token, sequence), to
//!
//! * `postgres`: a row appended to `workload_fenced` through
//!   `leasehold_stores::fence::postgres::fenced` (the row's id is taken under
//!   the fence row's lock, so ids are the commit order);
//! * `configmap`: ConfigMap `CONFIG_MAP` patched with the fencing
//!   annotations the chart's admission policy judges (docs/fencing.md), as
//!   this pod's own ServiceAccount (allowed to patch it): the in-cluster
//!   client sends the pod's projected token, which binds the pod's name
//!   (`authentication.kubernetes.io/pod-name` in userInfo.extra, Kubernetes
//!   pkg/serviceaccount/claims.go), the writer the policy holds it to;
//! * `redis` (with `REDIS_URL`): key `workload:{<lock>}:last` set to `<pod>
//!   <token> <seq>` through `leasehold_stores::fence::redis::fenced`;
//! * `spanner` (with `SPANNER_DATABASE`): a row inserted into
//!   `workload_spanner` through `leasehold_stores::fence::spanner::fenced`,
//!   with its commit timestamp (fenced writes all write the fence row, so
//!   their timestamps are their commit order). The database's owner makes
//!   the tables beforehand (three candidates creating them at once would
//!   race on the schema): the fence table's
//!   `leasehold_stores::fence::spanner::create_table_statement` and
//!   `CREATE TABLE workload_spanner (pod STRING(MAX) NOT NULL, seq INT64 NOT
//!   NULL, token INT64 NOT NULL, committed_at TIMESTAMP NOT NULL OPTIONS
//!   (allow_commit_timestamp = true)) PRIMARY KEY (pod, seq)`;
//! * `control`: the same row to `workload_control`, unfenced, so a run shows
//!   how many stale writes its faults produced.
//!
//! Every attempt, accepted or refused, is one JSON line on stdout:
//! `{"resource", "pod", "token", "seq", "outcome": "accepted" | "refused" |
//! "failed", "version", "time", "error"}`, `version` being the row's id or
//! the ConfigMap's resourceVersion of an accepted write (Redis and Spanner have none). tests/e2e's
//! fenced_workload scenario runs it under faults and checks the history
//! (tests/support/fencing_history.rs).
//!
//! It follows its sidecar by polling `GET /leader` (docs/publishing.md): a
//! view with `"leader": true` and a token makes it write with that token
//! until a later view says otherwise; an answer that does not come within
//! `POLL_TIMEOUT` makes it stop. It deliberately does not stop at the
//! view's `validUntil`: a process paused between its check and its write
//! (a GC pause, a frozen node) writes late whatever it checked, and this
//! workload is there to show the fence refusing those writes.
//!
//! Settings (environment): `POD_NAME` (the downward API's metadata.name),
//! `DATABASE_URL`, `REDIS_URL` and `SPANNER_DATABASE` (optional; the
//! client finds the emulator by `SPANNER_EMULATOR_HOST`), `FENCE_LOCK` (the lease's lock, `<namespace>/<lease>`),
//! `FENCE_ISSUER` (the lease's store, default `postgres`), `CONFIG_MAP`
//! (default `ledger`; it exists and carries `leasehold.dev/fencing-lock:
//! <issuer>:<lock>`), `SIDECAR_ADDRESS` (default `127.0.0.1:4040`),
//! `WRITE_PAUSE_MS` (between rounds, default 10). The tables are created
//! when missing; on SIGTERM it exits.

use std::error::Error;
use std::net::SocketAddr;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;

use leasehold_core::lease::FencingToken;
use leasehold_stores::fence::postgres as fence_postgres;
use leasehold_stores::fence::{Fence, FenceError};

type Failure = Box<dyn Error + Send + Sync>;

/// How often the app asks its sidecar, and how long it waits for an answer.
const POLL: Duration = Duration::from_millis(50);
const POLL_TIMEOUT: Duration = Duration::from_millis(500);

const FENCED_TABLE: &str = "workload_fenced";
const CONTROL_TABLE: &str = "workload_control";
const SPANNER_TABLE: &str = "workload_spanner";

struct Settings {
    pod: String,
    database_url: String,
    redis_url: Option<String>,
    spanner_database: Option<String>,
    issuer: String,
    lock: String,
    config_map: String,
    sidecar: SocketAddr,
    pause: Duration,
}

impl Settings {
    fn from_env() -> Result<Settings, Failure> {
        let var = |name: &str| std::env::var(name).map_err(|_| format!("set {name}"));
        let or = |name: &str, default: &str| std::env::var(name).unwrap_or_else(|_| default.to_string());
        Ok(Settings {
            pod: var("POD_NAME")?,
            database_url: var("DATABASE_URL")?,
            redis_url: std::env::var("REDIS_URL").ok(),
            spanner_database: std::env::var("SPANNER_DATABASE").ok(),
            issuer: or("FENCE_ISSUER", "postgres"),
            lock: var("FENCE_LOCK")?,
            config_map: or("CONFIG_MAP", "ledger"),
            sidecar: or("SIDECAR_ADDRESS", "127.0.0.1:4040").parse()?,
            pause: Duration::from_millis(or("WRITE_PAUSE_MS", "10").parse()?),
        })
    }
}

/// One attempt's outcome, as logged.
enum Outcome {
    /// Written; the store's version of it (row id, resourceVersion), if
    /// it has one.
    Accepted(Option<u64>),
    /// Refused by the fence as stale, with its message.
    Refused(String),
    /// Neither: the outcome is unknown or nothing was tried (e.g. the
    /// connection broke), with the error.
    Failed(String),
}

fn log_attempt(resource: &str, pod: &str, token: FencingToken, seq: i64, outcome: &Outcome) {
    let (outcome, version, error) = match outcome {
        Outcome::Accepted(version) => ("accepted", *version, None),
        Outcome::Refused(why) => ("refused", None, Some(why.as_str())),
        Outcome::Failed(why) => ("failed", None, Some(why.as_str())),
    };
    let line = json!({
        "resource": resource, "pod": pod, "token": token.0, "seq": seq, "outcome": outcome,
        "version": version, "error": error, "time": now(),
    });
    println!("{line}");
}

fn now() -> String {
    humantime::format_rfc3339_micros(SystemTime::now()).to_string()
}

/// The sidecar's `/leader` view: the token while it leads, else `None`.
/// A plain HTTP/1.0 request: the body is JSON whatever the status (200
/// leading, 503 not).
async fn leader_token(sidecar: SocketAddr) -> Result<Option<FencingToken>, Failure> {
    let mut stream = tokio::net::TcpStream::connect(sidecar).await?;
    stream
        .write_all(b"GET /leader HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .await?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await?;
    let response = String::from_utf8(response)?;
    let (_, body) = response
        .split_once("\r\n\r\n")
        .ok_or("an HTTP response without a body")?;
    let view: Value = serde_json::from_str(body)?;
    if view["leader"] != json!(true) {
        return Ok(None);
    }
    let token = view["token"].as_str().ok_or("a leader view without a token")?;
    Ok(Some(FencingToken(token.parse()?)))
}

/// Keeps `belief` at what the sidecar last said; no answer in time is
/// "not leading". Logs each change.
async fn follow_sidecar(pod: String, sidecar: SocketAddr, belief: watch::Sender<Option<FencingToken>>) {
    loop {
        let token = match tokio::time::timeout(POLL_TIMEOUT, leader_token(sidecar)).await {
            Ok(Ok(token)) => token,
            _ => None,
        };
        belief.send_if_modified(|held| {
            let changed = *held != token;
            if changed {
                let event = if token.is_some() { "leads" } else { "follows" };
                println!(
                    "{}",
                    json!({"event": event, "pod": pod, "token": token.map(|t| t.0), "time": now()})
                );
            }
            *held = token;
            changed
        });
        tokio::time::sleep(POLL).await;
    }
}

struct Writer {
    settings: Settings,
    postgres: tokio_postgres::Client,
    redis: Option<redis::aio::MultiplexedConnection>,
    spanner: Option<google_cloud_spanner::client::DatabaseClient>,
    config_maps: Api<ConfigMap>,
}

impl Writer {
    async fn connect(settings: Settings) -> Result<Writer, Failure> {
        let postgres = connect_postgres(&settings.database_url).await?;
        fence_postgres::ensure_table(&postgres, fence_postgres::DEFAULT_TABLE).await?;
        for table in [FENCED_TABLE, CONTROL_TABLE] {
            postgres
                .batch_execute(&format!(
                    "CREATE TABLE IF NOT EXISTS {table} (id BIGSERIAL PRIMARY KEY, pod TEXT NOT NULL, \
                     token BIGINT NOT NULL, seq BIGINT NOT NULL)"
                ))
                .await?;
        }
        let redis = match &settings.redis_url {
            Some(url) => Some(
                redis::Client::open(url.as_str())?
                    .get_multiplexed_async_connection()
                    .await?,
            ),
            None => None,
        };
        let spanner = match &settings.spanner_database {
            Some(database) => {
                leasehold_stores::spanner::install_crypto_provider();
                let spanner = google_cloud_spanner::client::Spanner::builder().build().await?;
                Some(spanner.database_client(database.as_str()).build().await?)
            }
            None => None,
        };
        // The pod's ServiceAccount token, projected and bound to this pod.
        let client = kube::Client::try_default().await?;
        Ok(Writer {
            config_maps: Api::default_namespaced(client),
            redis,
            spanner,
            settings,
            postgres,
        })
    }

    /// One round: the same (pod, token, seq) to every resource.
    async fn write_all(&mut self, token: FencingToken, seq: i64) {
        let pod = self.settings.pod.clone();
        if self.postgres.is_closed() {
            match connect_postgres(&self.settings.database_url).await {
                Ok(client) => self.postgres = client,
                Err(e) => {
                    let failed = Outcome::Failed(format!("reconnecting to PostgreSQL: {e}"));
                    log_attempt("postgres", &pod, token, seq, &failed);
                    log_attempt("control", &pod, token, seq, &failed);
                }
            }
        }
        if !self.postgres.is_closed() {
            let outcome = self.write_fenced_row(token, seq).await;
            log_attempt("postgres", &pod, token, seq, &outcome);
            let outcome = self.write_control_row(token, seq).await;
            log_attempt("control", &pod, token, seq, &outcome);
        }
        if let Some(outcome) = self.write_redis_key(token, seq).await {
            log_attempt("redis", &pod, token, seq, &outcome);
        }
        if let Some(outcome) = self.write_spanner_row(token, seq).await {
            log_attempt("spanner", &pod, token, seq, &outcome);
        }
        let outcome = self.write_config_map(token, seq).await;
        log_attempt("configmap", &pod, token, seq, &outcome);
    }

    /// The claim every fenced write carries: the token, its issuer, the lock.
    fn fence(&self, token: FencingToken) -> Result<Fence, Outcome> {
        Fence::new(&self.settings.issuer, &self.settings.lock, token).map_err(|e| Outcome::Failed(e.to_string()))
    }

    async fn write_fenced_row(&mut self, token: FencingToken, seq: i64) -> Outcome {
        let fence = match self.fence(token) {
            Ok(fence) => fence,
            Err(failed) => return failed,
        };
        let pod = &self.settings.pod;
        let written = fence_postgres::fenced(&mut self.postgres, fence_postgres::DEFAULT_TABLE, &fence, async |tx| {
            let sql = format!("INSERT INTO {FENCED_TABLE} (pod, token, seq) VALUES ($1, $2, $3) RETURNING id");
            Ok(tx.query_one(&sql, &[pod, &token.0, &seq]).await?.get::<_, i64>(0))
        })
        .await;
        match written {
            Ok(id) => Outcome::Accepted(Some(id as u64)),
            Err(stale @ FenceError::Stale { .. }) => Outcome::Refused(stale.to_string()),
            Err(e) => Outcome::Failed(error_chain(&e)),
        }
    }

    async fn write_control_row(&mut self, token: FencingToken, seq: i64) -> Outcome {
        let sql = format!("INSERT INTO {CONTROL_TABLE} (pod, token, seq) VALUES ($1, $2, $3) RETURNING id");
        match self
            .postgres
            .query_one(&sql, &[&self.settings.pod, &token.0, &seq])
            .await
        {
            Ok(row) => Outcome::Accepted(Some(row.get::<_, i64>(0) as u64)),
            Err(e) => Outcome::Failed(error_chain(&e)),
        }
    }

    /// The key's new value, when there is Redis to write to. The key carries
    /// the lock as its hash tag, as the fence key does (Redis Cluster).
    async fn write_redis_key(&mut self, token: FencingToken, seq: i64) -> Option<Outcome> {
        let fence = match self.fence(token) {
            Ok(fence) => fence,
            Err(failed) => return Some(failed),
        };
        let connection = self.redis.as_mut()?;
        let key = format!("workload:{{{}}}:last", self.settings.lock);
        let value = format!("{} {token} {seq}", self.settings.pod);
        let written = leasehold_stores::fence::redis::fenced(connection, &fence, &[(&key, value.as_bytes())]).await;
        Some(match written {
            Ok(()) => Outcome::Accepted(None),
            Err(stale @ FenceError::Stale { .. }) => Outcome::Refused(stale.to_string()),
            Err(e) => Outcome::Failed(error_chain(&e)),
        })
    }

    /// The row, when there is Spanner to write to; its commit timestamp is
    /// set by Spanner at the commit.
    async fn write_spanner_row(&self, token: FencingToken, seq: i64) -> Option<Outcome> {
        let client = self.spanner.as_ref()?;
        let fence = match self.fence(token) {
            Ok(fence) => fence,
            Err(failed) => return Some(failed),
        };
        let row = google_cloud_spanner::mutation::Mutation::new_insert_builder(SPANNER_TABLE)
            .set("pod")
            .to(self.settings.pod.as_str())
            .set("seq")
            .to(seq)
            .set("token")
            .to(token.0)
            .set("committed_at")
            .to("spanner.commit_timestamp()")
            .build();
        let written = leasehold_stores::fence::spanner::fenced(
            client,
            leasehold_stores::fence::spanner::DEFAULT_TABLE,
            &fence,
            vec![row],
        )
        .await;
        Some(match written {
            Ok(()) => Outcome::Accepted(None),
            Err(stale @ FenceError::Stale { .. }) => Outcome::Refused(stale.to_string()),
            Err(e) => Outcome::Failed(error_chain(&e)),
        })
    }

    /// The leader's write: its token and itself as holder with the data, in
    /// one merge patch, as docs/fencing.md shows it.
    async fn write_config_map(&self, token: FencingToken, seq: i64) -> Outcome {
        let Settings { pod, issuer, lock, .. } = &self.settings;
        let patch = json!({
            "metadata": {"annotations": {
                "leasehold.dev/fencing-lock": format!("{issuer}:{lock}"),
                "leasehold.dev/fencing-token": token.to_string(),
                "leasehold.dev/fencing-holder": pod,
            }},
            "data": {"pod": pod, "token": token.to_string(), "seq": seq.to_string()},
        });
        let written = self
            .config_maps
            .patch(
                &self.settings.config_map,
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await;
        match written {
            // On etcd, resourceVersion is the revision of the write: it
            // orders a resource's writes (an opaque string by the API's
            // contract, a number on every API server backed by etcd).
            Ok(written) => match written.metadata.resource_version.as_deref().map(str::parse) {
                Some(Ok(version)) => Outcome::Accepted(Some(version)),
                other => Outcome::Failed(format!("accepted with resourceVersion {other:?}")),
            },
            // The policy's token rule (charts/leasehold/templates/admission-policy-fencing.yaml).
            Err(kube::Error::Api(status)) if status.code == 403 && status.message.contains("fencing token") => {
                Outcome::Refused(status.message)
            }
            Err(e) => Outcome::Failed(error_chain(&e)),
        }
    }
}

async fn connect_postgres(url: &str) -> Result<tokio_postgres::Client, Failure> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    Ok(client)
}

fn error_chain(e: &dyn Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    text
}

/// Writes round after round while `belief` holds a token. A round takes its
/// token once, at its start: a pause anywhere in it makes the rest late.
async fn write_while_leading(mut writer: Writer, mut belief: watch::Receiver<Option<FencingToken>>) {
    // Starts at the process's start in microseconds, so a restarted app in
    // the same pod never repeats a sequence number.
    let mut seq = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64);
    loop {
        let held = *belief.borrow_and_update();
        let Some(token) = held else {
            // The sender lives as long as the follower, which never ends.
            let _ = belief.changed().await;
            continue;
        };
        seq += 1;
        writer.write_all(token, seq).await;
        tokio::time::sleep(writer.settings.pause).await;
    }
}

#[tokio::main]
async fn main() -> Result<(), Failure> {
    let settings = Settings::from_env()?;
    let (pod, sidecar) = (settings.pod.clone(), settings.sidecar);
    let writer = Writer::connect(settings).await?;
    let (belief, beliefs) = watch::channel(None);
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        () = follow_sidecar(pod, sidecar, belief) => {}
        () = write_while_leading(writer, beliefs) => {}
        _ = terminate.recv() => {}
    }
    Ok(())
}
