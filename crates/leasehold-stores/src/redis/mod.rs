//! The Redis store, on the `redis` crate's multiplexed connection.
//!
//! One connection per store, opened on first use and dropped after an I/O
//! error or timeout so the next call opens a new one. Not the crate's
//! `ConnectionManager`: it queues a request behind its reconnect attempts,
//! so a timeout could not tell "never sent" (nothing happened) from "sent,
//! reply lost" (unknown outcome); here connecting and sending are timed
//! apart.
//!
//! `rediss://` connects over TLS, checking the server's certificate
//! ([`parse_url`]).
//!
//! Per lock, two keys sharing one hash tag (so they live in one Cluster slot):
//!
//! * `leasehold:{<lock>}:lease`, a hash (holder, token, term, renewed_us,
//!   lease_ms) whose TTL is the lease: on every acquire and renew it expires
//!   with the last whole millisecond before `renewed_us + lease_ms`. Redis
//!   itself judges expiry by its own clock, in milliseconds and only once
//!   past the expiry time (src/db.c, `keyIsExpired`: `now > when`): `PEXPIRE
//!   lease_ms` would keep the key up to a millisecond past the lease's end
//!   the record reports (an acquire observed past the end was refused at
//!   random), so the key is gone by that end, at most 1 ms before it, far
//!   inside the D − R the elector keeps clear of the end.
//! * `leasehold:{<lock>}:fence`, a hash that never expires: the term counter
//!   (`HINCRBY`) and the last token handed out.
//!
//! acquire, renew and release are Lua scripts, so each check and its write are
//! one atomic step on the server (S7); renew and release compare holder *and*
//! token (S6, S8). observe is a script too, returning `TIME` with the row.
//!
//! The release script also publishes the lock on `<prefix>released`; a
//! follower subscribes (one connection per store, [`super::push`]) and looks
//! again at once instead of at its next poll.
//!
//! A takeover (a restarted sidecar resuming its own pod's lease) is the
//! acquire script with another check: the lease key must hold exactly the
//! holder and token named.
//!
//! The fencing token is the per-lock counter, advanced as
//! `max(last + 1, server clock in µs)`: it strictly increases while the fence
//! key lives, and it still increases past tokens the store forgot (the fence
//! key deleted, or lost in a failover, below) as long as the serving Redis's
//! clock is later than the forgotten acquisition. Microseconds keep it exact
//! in Lua's doubles (2^53 µs is the year 2255).
//!
//! # What a Redis failover can lose, and what still holds
//!
//! Redis replicates asynchronously: a primary acknowledges a script before a
//! replica has it. When a replica is promoted (Sentinel, Cluster, a managed
//! service), the last acknowledged acquisitions and renewals may be gone:
//!
//! * Lost acquisition: the new primary shows the lock free, another candidate
//!   acquires, and the old holder keeps claiming until its renew fails, at
//!   most R after its last successful renew. For up to R two pods believe they
//!   lead. Mutual exclusion of *belief* does not survive a failover.
//! * Lost renewal: the lease ends earlier than its holder thinks (a renewal
//!   lost), so a follower may take it while the holder still claims, again
//!   for at most R.
//! * TTLs move to the new primary's clock; a skew between the machines
//!   shifts every expiry by that skew.
//!
//! What still holds: the new holder's token exceeds every token handed out
//! before, lost or not, unless the new primary's clock is behind the old
//! one's by more than the time from the lost acquisition to the new one
//! (usually seconds of failover). So downstream systems that fence, accepting
//! a write only with a token >= the highest seen, reject the deposed leader's
//! writes as soon as the new leader has written once. `WAIT` would narrow the
//! window but not close it (an acknowledged-by-one-replica write can still be
//! lost with another replica promoted); there is deliberately no second
//! "shadow" lock key: a second key in the same asynchronously replicated
//! store is not mutual exclusion. Where a failover must not produce two
//! believing leaders, use PostgreSQL with synchronous replication or Spanner.

mod session;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, ErrorKind, RedisError, Script, ServerErrorKind, Value};

use super::push::Releases;
use super::{Effect, StoreUrl, lease_from_millis, term_from_row, tls};
use crate::lease::store::Result;
use crate::lease::{
    Claim, Ended, FencingToken, Grant, Held, Identity, LeaseRecord, LeaseStore, Observation, Release, Reservation,
    StoreError, StoreIdentity, StoreTime, Version,
};

/// Where the leases live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisConfig {
    /// `redis://[user:password@]host:port[/db]`.
    pub url: StoreUrl,
    /// Key prefix, `leasehold:` by default; keys are `<prefix>{<lock>}:lease`
    /// and `<prefix>{<lock>}:fence`.
    pub prefix: String,
}

/// The key prefix unless configured otherwise.
pub const DEFAULT_PREFIX: &str = "leasehold:";
/// How long one store call may take before it is abandoned.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// TIME as µs, exact in a Lua number.
const NOW_US: &str = "local clock = redis.call('TIME')\n\
                      local now_us = tonumber(clock[1]) * 1000000 + tonumber(clock[2])\n";

/// The acquire script's check: KEYS: lease. Returns {0, holder} when held.
const ACQUIRE_IF_FREE: &str = "
local current = redis.call('HGET', KEYS[1], 'holder')
if current then return {0, current} end
local restarted = false
";

/// The acquire script's second check: KEYS: lease, fence. ARGV[6]: the
/// claimant's pod UID ("" for none). Returns {3, pod UID, until_us} while
/// the fence key keeps a reservation for another pod (a transfer's release
/// wrote it; `LeaseRecord::reserved_against`), judged on Redis's clock.
const ACQUIRE_IF_NOT_RESERVED: &str = "
local reserved = redis.call('HMGET', KEYS[2], 'reserved_for', 'reserved_until_us')
if reserved[1] and tonumber(reserved[2]) > now_us and reserved[1] ~= ARGV[6] then
  return {3, reserved[1], reserved[2]}
end
";

/// The takeover script's check: ARGV[6], ARGV[7]: the holder and token
/// taken over. Returns {0, holder or ''} unless the lease key holds exactly
/// them (an expired lease's key is gone: nothing to take over).
const TAKE_OVER_IF_HELD: &str = "
local current = redis.call('HMGET', KEYS[1], 'holder', 'token')
if current[1] ~= ARGV[6] or current[2] ~= ARGV[7] then return {0, current[1] or ''} end
local restarted = true
";

/// After [`ACQUIRE_IF_FREE`] or [`TAKE_OVER_IF_HELD`]: KEYS: lease, fence.
/// ARGV: holder, lease_ms, fence ("1" or "0"), revision ("" for none),
/// version name. Returns {2, revision, version} when the version fence
/// refuses (`Claim::fenced_by`: a missing or lower revision once one is
/// recorded), {1, term, token, now_us} when taken. The fence key keeps the
/// taker's revision and version, so they outlive the lease key, and the end
/// of the term taken: `restarted` for a takeover, else the end written for
/// it or `expired` (`LeaseRecord::ended_by_acquire`).
const TAKE: &str = "
local recorded = redis.call('HMGET', KEYS[2], 'revision', 'version')
if ARGV[3] == '1' and recorded[1] and (ARGV[4] == '' or tonumber(ARGV[4]) < tonumber(recorded[1])) then
  return {2, recorded[1], recorded[2] or ''}
end
if ARGV[4] == '' then
  redis.call('HDEL', KEYS[2], 'revision', 'version')
else
  redis.call('HSET', KEYS[2], 'revision', ARGV[4], 'version', ARGV[5])
end
redis.call('HDEL', KEYS[2], 'reserved_for', 'reserved_until_us')
local ended = redis.call('HMGET', KEYS[2], 'term', 'ended_term')
if ended[1] and (restarted or ended[2] ~= ended[1]) then
  redis.call('HSET', KEYS[2], 'ended_term', ended[1], 'ended', restarted and 'restarted' or 'expired')
end
local term = redis.call('HINCRBY', KEYS[2], 'term', 1)
local last = tonumber(redis.call('HGET', KEYS[2], 'token') or '0')
local token = math.max(last + 1, now_us)
local token_text = string.format('%.0f', token)
redis.call('HSET', KEYS[2], 'token', token_text, 'lease_ms', ARGV[2])
redis.call('HSET', KEYS[1], 'holder', ARGV[1], 'token', token_text, 'term', term,
           'renewed_us', string.format('%.0f', now_us), 'lease_ms', ARGV[2])
redis.call('PEXPIREAT', KEYS[1], math.floor(now_us / 1000) + tonumber(ARGV[2]) - 1)
return {1, term, token, now_us}
";

/// KEYS: lease. ARGV: holder, token, lease_ms.
/// Returns {0} when not ours, {1, term, now_us} when renewed.
const RENEW: &str = "
local row = redis.call('HMGET', KEYS[1], 'holder', 'token', 'term')
if row[1] ~= ARGV[1] or row[2] ~= ARGV[2] then return {0} end
redis.call('HSET', KEYS[1], 'renewed_us', string.format('%.0f', now_us), 'lease_ms', ARGV[3])
redis.call('PEXPIREAT', KEYS[1], math.floor(now_us / 1000) + tonumber(ARGV[3]) - 1)
return {1, tonumber(row[3]), now_us}
";

/// KEYS: lease, fence. ARGV: holder, token, channel, lock, reserved pod UID
/// ("" for none), reservation window in ms, the end's reason. Returns 1
/// when released, 0 when not ours. The fence key keeps term and token, the
/// reservation until now + the window capped at the lease
/// (`Handoff::reservation`) or none, and the reason as the term's end.
/// Publishes the lock on the release channel, so followers learn at once
/// ([`LeaseStore::changed`]).
const RELEASE: &str = "
local row = redis.call('HMGET', KEYS[1], 'holder', 'token', 'lease_ms')
if row[1] ~= ARGV[1] or row[2] ~= ARGV[2] then return 0 end
redis.call('DEL', KEYS[1])
if ARGV[5] == '' then
  redis.call('HDEL', KEYS[2], 'reserved_for', 'reserved_until_us')
else
  local window_ms = math.min(tonumber(ARGV[6]), tonumber(row[3]))
  redis.call('HSET', KEYS[2], 'reserved_for', ARGV[5],
             'reserved_until_us', string.format('%.0f', now_us + window_ms * 1000))
end
redis.call('HSET', KEYS[2], 'ended_term', redis.call('HGET', KEYS[2], 'term'), 'ended', ARGV[7])
redis.call('PUBLISH', ARGV[3], ARGV[4])
return 1
";

/// KEYS: lease, fence of each lock in turn. Returns {now_us, row, row, …},
/// one row per lock in the order given, each {holder, token, term,
/// renewed_us, lease_ms, fence_term, fence_token, fence_lease_ms, revision,
/// version, reserved_for, reserved_until_us, ended_term, ended}, absent fields nil: every lock
/// at one reading of the clock.
const OBSERVE: &str = "
local rows = {now_us}
for i = 1, #KEYS, 2 do
  local lease = redis.call('HMGET', KEYS[i], 'holder', 'token', 'term', 'renewed_us', 'lease_ms')
  local fence = redis.call('HMGET', KEYS[i + 1], 'term', 'token', 'lease_ms', 'revision', 'version', 'reserved_for',
                           'reserved_until_us', 'ended_term', 'ended')
  rows[#rows + 1] = {lease[1], lease[2], lease[3], lease[4], lease[5], fence[1], fence[2], fence[3], fence[4], fence[5],
                     fence[6], fence[7], fence[8], fence[9]}
end
return rows
";

/// KEYS: the marker. ARGV: a new random marker. Returns the marker,
/// setting it first when absent: the first caller names the store.
const MARK: &str = "
local marker = redis.call('GET', KEYS[1])
if not marker then
  redis.call('SET', KEYS[1], ARGV[1])
  marker = ARGV[1]
end
return marker
";

struct Scripts {
    mark: Script,
    acquire: Script,
    take_over: Script,
    renew: Script,
    release: Script,
    observe: Script,
}

impl Scripts {
    fn new() -> Self {
        let with_clock = |body: &str| Script::new(&format!("{NOW_US}{body}"));
        Scripts {
            mark: Script::new(MARK),
            acquire: with_clock(&format!("{ACQUIRE_IF_FREE}{ACQUIRE_IF_NOT_RESERVED}{TAKE}")),
            take_over: with_clock(&format!("{TAKE_OVER_IF_HELD}{TAKE}")),
            renew: with_clock(RENEW),
            release: with_clock(RELEASE),
            observe: with_clock(OBSERVE),
        }
    }
}

/// The Redis-backed [`LeaseStore`].
#[derive(Clone)]
pub struct RedisStore {
    config: RedisConfig,
    client: redis::Client,
    /// The open connection, if any; replaced after an I/O error or timeout.
    connection: Arc<tokio::sync::Mutex<Option<MultiplexedConnection>>>,
    call_timeout: Duration,
    scripts: Arc<Scripts>,
    releases: Arc<Releases>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// Reads a store URL; the password never appears in an error.
///
/// `rediss://` connects over TLS, checking the certificate's chain and host
/// name against the CA file named by `sslrootcert=` in the query, or else
/// the system's roots.
pub fn parse_url(url: &StoreUrl) -> Result<redis::Client> {
    let split = tls::take_params(url, &[tls::CA_FILE_PARAM])?;
    let ca_file = split.taken.into_iter().next().flatten();
    let not_redis = |e| StoreError::invalid(format!("store URL {url:?} is not a Redis URL")).caused_by(e);
    match ca_file {
        None => redis::Client::open(split.url).map_err(not_redis),
        Some(_) if !split.url.starts_with("rediss://") => Err(StoreError::invalid(format!(
            "store URL {url:?} names {} but connects without TLS; use rediss://",
            tls::CA_FILE_PARAM
        ))),
        Some(path) => {
            // Checked here so that a bad file is named; the driver reads the PEM.
            let path = std::path::PathBuf::from(path);
            tls::ca_certificates(&path)?;
            let pem = std::fs::read(&path).map_err(|e| {
                StoreError::invalid(format!("{} {}: cannot read", tls::CA_FILE_PARAM, path.display())).caused_by(e)
            })?;
            let certificates = redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(pem),
            };
            redis::Client::build_with_tls(split.url, certificates).map_err(not_redis)
        }
    }
}

/// A key prefix: printable, no braces (they would move the hash tag).
pub fn validate_prefix(prefix: &str) -> Result<()> {
    if prefix.len() <= 64 && !prefix.contains(['{', '}']) && !prefix.chars().any(char::is_control) {
        Ok(())
    } else {
        Err(StoreError::invalid(format!(
            "key prefix {prefix:?} must be at most 64 characters without braces or control characters"
        )))
    }
}

/// Sorts a driver error into the kinds the elector acts on.
fn classify(what: &str, error: RedisError, effect: Effect) -> StoreError {
    let context = format!("{what}: {}", error.category());
    match error.kind() {
        ErrorKind::AuthenticationFailed
        | ErrorKind::InvalidClientConfig
        | ErrorKind::Server(ServerErrorKind::NoPerm)
        | ErrorKind::UnexpectedReturnType
        | ErrorKind::Parse => StoreError::invalid(context),
        // The server answered with an error: the script did not run. Our
        // scripts check before they write, so an error leaves no half write.
        ErrorKind::Server(_) | ErrorKind::Extension => StoreError::unavailable(context),
        // Refused before anything was sent.
        _ if error.is_connection_refusal() => StoreError::unavailable(context),
        _ => effect.no_reply(context),
    }
    .caused_by(error)
}

fn int(value: &Value) -> Option<i64> {
    match value {
        Value::Int(i) => Some(*i),
        Value::BulkString(bytes) => std::str::from_utf8(bytes).ok()?.parse().ok(),
        Value::SimpleString(text) => text.parse().ok(),
        _ => None,
    }
}

fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
        Value::SimpleString(text) => Some(text.clone()),
        _ => None,
    }
}

/// A number the lock's keys must hold; absent or not a number is refused.
fn stored_int(lock: &str, field: &'static str, value: &Value) -> Result<i64> {
    int(value).ok_or_else(|| {
        StoreError::invalid(format!(
            "lock {lock:?} holds {field} = {value:?}, not a number: delete its keys, or correct them"
        ))
    })
}

/// The record of one lock in the observe script's reply (its fields in
/// the order [`OBSERVE`] gives them).
fn record_of(what: &str, lock: &str, reply: &[Value]) -> Result<Option<LeaseRecord>> {
    let field = |i: usize| reply.get(i).unwrap_or(&Value::Nil);
    let version = match int(field(8)) {
        None => None,
        Some(revision) => Some(Version {
            revision: u64::try_from(revision).map_err(|_| bad_reply(what, reply))?,
            name: text(field(9)).unwrap_or_default(),
        }),
    };
    let reservation = match (text(field(10)), int(field(11))) {
        (Some(pod_uid), Some(until)) => Some(Reservation {
            pod_uid,
            until: micros(until),
        }),
        _ => None,
    };
    let ended_term = int(field(12)).map(|t| term_from_row(lock, t)).transpose()?;
    let ended = Ended::from_columns(ended_term, text(field(13)).as_deref());
    Ok(match (text(field(0)), int(field(5))) {
        // A live lease: the lease key still exists.
        (Some(holder), _) => Some(LeaseRecord {
            name: lock.to_string(),
            holder: Some(holder),
            term: term_from_row(lock, stored_int(lock, "term", field(2))?)?,
            token: int(field(1)).map(FencingToken),
            renewed_at: int(field(3)).map(micros),
            lease_duration: lease_from_millis("lease_ms", lock, stored_int(lock, "lease_ms", field(4))?)?,
            version: version.clone(),
            reservation: reservation.clone(),
            ended,
        }),
        // Released or expired: the fence keeps the last term and token.
        (None, Some(term)) => Some(LeaseRecord {
            name: lock.to_string(),
            holder: None,
            term: term_from_row(lock, term)?,
            token: int(field(6)).map(FencingToken),
            renewed_at: None,
            lease_duration: lease_from_millis("lease_ms", lock, stored_int(lock, "lease_ms", field(7))?)?,
            version,
            reservation,
            ended,
        }),
        (None, None) => None,
    })
}

fn micros(us: i64) -> StoreTime {
    StoreTime(us.saturating_mul(1000))
}

fn bad_reply(what: &str, reply: &[Value]) -> StoreError {
    StoreError::invalid(format!("{what}: unexpected reply from Redis: {reply:?}"))
}

impl RedisStore {
    /// A store on `config.url`; connects lazily, so an unreachable server
    /// shows up as `Unavailable` on the first call, not here.
    pub fn connect(config: RedisConfig) -> Result<Self> {
        Self::connect_with(config, DEFAULT_CALL_TIMEOUT)
    }

    /// As [`connect`](Self::connect); every call is bounded by `call_timeout`.
    pub fn connect_with(config: RedisConfig, call_timeout: Duration) -> Result<Self> {
        validate_prefix(&config.prefix)?;
        let client = parse_url(&config.url)?;
        Ok(RedisStore {
            config,
            client,
            connection: Arc::default(),
            call_timeout,
            scripts: Arc::new(Scripts::new()),
            releases: Arc::new(Releases::new()),
        })
    }

    pub fn config(&self) -> &RedisConfig {
        &self.config
    }

    /// Which store this is, whatever the URL says: a random marker kept in
    /// the key `<prefix>store-identity` of the URL's database, set by the
    /// first caller. A rotated password or another host name for the same
    /// server reads the same marker; another server or database, or this
    /// one emptied (restarted without persistence), reads another
    /// (docs/migrating-stores.md, "The store's identity").
    pub async fn identity(&self) -> Result<StoreIdentity> {
        let what = "read the store's identity";
        let fresh = format!("{:032x}", rand::random::<u128>());
        let key = format!("{}store-identity", self.config.prefix);
        let reply = self
            .invoke(what, &self.scripts.mark, &[key], &[fresh], Effect::Write)
            .await?;
        let marker = text(&reply).ok_or_else(|| bad_reply(what, &[reply]))?;
        Ok(StoreIdentity::new(format!("redis:{marker}")))
    }

    /// What an unreachable server looks like to a person: where, and how long we waited.
    fn no_connection(&self, what: &str, hint: &str) -> String {
        format!(
            "{what}: no connection to Redis at {} within {:?}{hint}",
            self.client.get_connection_info().addr(),
            self.call_timeout
        )
    }

    /// The channel every release under this prefix is published on, the
    /// lock as the message.
    fn channel(&self) -> String {
        format!("{}released", self.config.prefix)
    }

    /// The lease and fence keys of `lock`.
    pub fn keys(&self, lock: &str) -> [String; 2] {
        let prefix = &self.config.prefix;
        [format!("{prefix}{{{lock}}}:lease"), format!("{prefix}{{{lock}}}:fence")]
    }

    /// The open connection, or a new one. Failing here sent nothing.
    async fn connection(&self, what: &str) -> Result<MultiplexedConnection> {
        let mut open = self.connection.lock().await;
        if let Some(connection) = open.as_ref() {
            return Ok(connection.clone());
        }
        // A server without TLS does not answer a TLS hello; it just waits.
        let hint = match self.config.url.expose().starts_with("rediss://") {
            true => " (the URL asks for TLS, rediss://: does the server speak TLS on that port?)",
            false => "",
        };
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.call_timeout))
            .set_response_timeout(None);
        let connection = tokio::time::timeout(
            self.call_timeout,
            self.client.get_multiplexed_async_connection_with_config(&config),
        )
        .await
        .map_err(|_| StoreError::unavailable(self.no_connection(what, hint)))?
        .map_err(|e| StoreError::unavailable(self.no_connection(what, hint)).caused_by(e))?;
        *open = Some(connection.clone());
        Ok(connection)
    }

    /// Drops the connection so that the next call opens a new one.
    async fn forget_connection(&self) {
        *self.connection.lock().await = None;
    }

    /// Runs a script once (never retried: a lost reply may hide a write),
    /// bounded by the call timeout.
    async fn invoke(
        &self,
        what: &str,
        script: &Script,
        keys: &[String],
        args: &[String],
        effect: Effect,
    ) -> Result<Value> {
        let mut invocation = script.prepare_invoke();
        for key in keys {
            invocation.key(key);
        }
        for arg in args {
            invocation.arg(arg);
        }
        let mut connection = self.connection(what).await?;
        match tokio::time::timeout(self.call_timeout, invocation.invoke_async(&mut connection)).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => {
                if !matches!(e.kind(), ErrorKind::Server(_)) {
                    self.forget_connection().await;
                }
                Err(classify(what, e, effect))
            }
            Err(_) => Err({
                self.forget_connection().await;
                effect.no_reply(format!("{what}: no reply within {:?}", self.call_timeout))
            }),
        }
    }

    async fn invoke_array(
        &self,
        what: &str,
        script: &Script,
        keys: &[String],
        args: &[String],
        effect: Effect,
    ) -> Result<Vec<Value>> {
        match self.invoke(what, script, keys, args, effect).await? {
            Value::Array(items) => Ok(items),
            other => Err(bad_reply(what, &[other])),
        }
    }
}

/// Subscribes to `channel` on a connection of its own and passes on every
/// released lock published there, until the connection ends.
async fn listen(
    client: redis::Client,
    channel: String,
    timeout: Duration,
    notices: tokio::sync::broadcast::Sender<String>,
) -> Result<()> {
    let subscribe = async {
        let mut pubsub = client.get_async_pubsub().await?;
        pubsub.subscribe(&channel).await?;
        Ok::<_, RedisError>(pubsub)
    };
    let pubsub = tokio::time::timeout(timeout, subscribe)
        .await
        .map_err(|_| StoreError::unavailable(format!("subscribing to {channel}: no answer within {timeout:?}")))?
        .map_err(|e| StoreError::unavailable(format!("subscribing to {channel}")).caused_by(e))?;
    let mut messages = pubsub.into_on_message();
    while let Some(message) = messages.next().await {
        if let Ok(lock) = message.get_payload::<String>() {
            // Nobody waiting is fine.
            let _ = notices.send(lock);
        }
    }
    Ok(())
}

/// The arguments the acquire and takeover scripts share, after their check:
/// holder, lease_ms, fence, revision, version name.
fn take_args(claim: &Claim<'_>, lease: Duration) -> Result<[String; 5]> {
    let (revision, name) = claim.version.map_or((String::new(), String::new()), |v| {
        (v.revision.to_string(), v.name.clone())
    });
    let fence = if claim.fence { "1" } else { "0" };
    Ok([claim.holder.to_string(), lease_ms(lease)?, fence.into(), revision, name])
}

/// The grant a script ending in [`TAKE`] returned; `Lost` when its check
/// refused (`held` says why, given the holder the script found) or the
/// version fence did.
fn taken(
    what: &str,
    lock: &str,
    claim: &Claim<'_>,
    reply: &[Value],
    held: impl FnOnce(&str) -> String,
) -> Result<Grant> {
    match reply {
        [taken, term, token, now] if int(taken) == Some(1) => {
            let (Some(term), Some(token), Some(now)) = (int(term), int(token), int(now)) else {
                return Err(bad_reply(what, reply));
            };
            Ok(Grant {
                term: term_from_row(lock, term)?,
                token: FencingToken(token),
                committed_at: micros(now),
            })
        }
        [refused, current] if int(refused) == Some(0) => Err(StoreError::Lost {
            lock: lock.to_string(),
            reason: held(&text(current).unwrap_or_default()),
        }),
        [reserved, pod_uid, until] if int(reserved) == Some(3) => {
            let (Some(pod_uid), Some(until)) = (text(pod_uid), int(until)) else {
                return Err(bad_reply(what, reply));
            };
            let reservation = Reservation {
                pod_uid,
                until: micros(until),
            };
            Err(StoreError::Lost {
                lock: lock.to_string(),
                reason: reservation.refusal(),
            })
        }
        [fenced, revision, name] if int(fenced) == Some(2) => {
            let recorded = int(revision)
                .and_then(|r| u64::try_from(r).ok())
                .map(|revision| Version {
                    revision,
                    name: text(name).unwrap_or_default(),
                })
                .ok_or_else(|| bad_reply(what, reply))?;
            Err(StoreError::Lost {
                lock: lock.to_string(),
                reason: claim
                    .fenced_by(Some(&recorded))
                    .unwrap_or_else(|| format!("version fence: {recorded} has led")),
            })
        }
        _ => Err(bad_reply(what, reply)),
    }
}

/// The lease duration as the key's TTL in milliseconds, by the core's one
/// checked conversion (an out-of-range lease is refused, never clamped).
fn lease_ms(lease: Duration) -> Result<String> {
    crate::lease::lease_to_millis("lease duration", lease)
        .map(|ms| ms.to_string())
        .map_err(|e| StoreError::invalid("lease duration cannot be stored").caused_by(e))
}

#[async_trait]
impl LeaseStore for RedisStore {
    fn kind(&self) -> &'static str {
        "redis"
    }

    /// Redis has no schema; this checks that the server answers and runs scripts.
    async fn ensure_schema(&self) -> Result<()> {
        self.observe("leasehold-schema-check").await.map(|_| ())
    }

    /// Wakes at a release of `lock` published by any store on this server
    /// and prefix (the release script's `PUBLISH`).
    async fn changed(&self, lock: &str, _seen: &Observation) {
        let (client, channel, timeout) = (self.client.clone(), self.channel(), self.call_timeout);
        self.releases
            .released(lock, move |notices| {
                listen(client.clone(), channel.clone(), timeout, notices)
            })
            .await
    }

    /// Wakes at a release of any lock published on this server and prefix.
    async fn changed_any(&self) {
        let (client, channel, timeout) = (self.client.clone(), self.channel(), self.call_timeout);
        self.releases
            .any(move |notices| listen(client.clone(), channel.clone(), timeout, notices))
            .await
    }

    async fn observe(&self, lock: &str) -> Result<Observation> {
        let mut observed = self.observe_many(&[lock.to_string()]).await?;
        Ok(observed.remove(0))
    }

    /// One script over every lock's two keys (standalone Redis and Sentinel;
    /// one lock's keys share a Cluster slot, many locks' do not).
    async fn observe_many(&self, locks: &[String]) -> Result<Vec<Observation>> {
        let what = match locks {
            [lock] => format!("observe {lock}"),
            _ => format!("observe {} locks", locks.len()),
        };
        let keys: Vec<String> = locks.iter().flat_map(|lock| self.keys(lock)).collect();
        let reply = self
            .invoke_array(&what, &self.scripts.observe, &keys, &[], Effect::Read)
            .await?;
        let now = reply
            .first()
            .and_then(int)
            .map(micros)
            .ok_or_else(|| bad_reply(&what, &reply))?;
        if reply.len() != locks.len() + 1 {
            return Err(bad_reply(&what, &reply));
        }
        locks
            .iter()
            .zip(&reply[1..])
            .map(|(lock, row)| match row {
                Value::Array(fields) => Ok(Observation {
                    record: record_of(&what, lock, fields)?,
                    now,
                }),
                other => Err(bad_reply(&what, std::slice::from_ref(other))),
            })
            .collect()
    }

    async fn acquire_as(&self, lock: &str, claim: &Claim<'_>, lease: Duration) -> Result<Grant> {
        let what = format!("acquire {lock}");
        let mut args = take_args(claim, lease)?.to_vec();
        args.push(Identity::pod_uid_of(claim.holder).unwrap_or_default());
        let reply = self
            .invoke_array(&what, &self.scripts.acquire, &self.keys(lock), &args, Effect::Write)
            .await?;
        taken(&what, lock, claim, &reply, |current| format!("held by {current}"))
    }

    async fn take_over(&self, lock: &str, claim: &Claim<'_>, from: Held<'_>, lease: Duration) -> Result<Grant> {
        let what = format!("take over {lock}");
        let mut args = take_args(claim, lease)?.to_vec();
        args.extend([from.holder.to_string(), from.token.0.to_string()]);
        let reply = self
            .invoke_array(&what, &self.scripts.take_over, &self.keys(lock), &args, Effect::Write)
            .await?;
        taken(&what, lock, claim, &reply, |current| match current {
            "" => format!(
                "not held by {} with token {}: released or expired",
                from.holder, from.token
            ),
            current => format!(
                "not held by {} with token {}, but by {current}",
                from.holder, from.token
            ),
        })
    }

    async fn renew(&self, lock: &str, holder: &str, token: FencingToken, lease: Duration) -> Result<Grant> {
        let what = format!("renew {lock}");
        let args = [holder.to_string(), token.0.to_string(), lease_ms(lease)?];
        let [lease_key, _] = self.keys(lock);
        let reply = self
            .invoke_array(&what, &self.scripts.renew, &[lease_key], &args, Effect::Write)
            .await?;
        match reply.as_slice() {
            [renewed, term, now] if int(renewed) == Some(1) => {
                let (Some(term), Some(now)) = (int(term), int(now)) else {
                    return Err(bad_reply(&what, &reply));
                };
                Ok(Grant {
                    term: term_from_row(lock, term)?,
                    token,
                    committed_at: micros(now),
                })
            }
            [refused] if int(refused) == Some(0) => Err(StoreError::Lost {
                lock: lock.to_string(),
                reason: format!("no longer held by {holder} with token {token}"),
            }),
            _ => Err(bad_reply(&what, &reply)),
        }
    }

    async fn release_for(&self, lock: &str, holder: &str, token: FencingToken, release: &Release) -> Result<()> {
        let what = format!("release {lock}");
        let handoff = release.handoff.as_ref();
        let args = [
            holder.to_string(),
            token.0.to_string(),
            self.channel(),
            lock.to_string(),
            handoff.map_or_else(String::new, |h| h.pod_uid().to_string()),
            handoff.map_or_else(String::new, |h| h.window_ms().to_string()),
            release.reason.as_str().to_string(),
        ];
        let reply = self
            .invoke(&what, &self.scripts.release, &self.keys(lock), &args, Effect::Write)
            .await?;
        match int(&reply) {
            Some(1) => Ok(()),
            Some(0) => Err(StoreError::Lost {
                lock: lock.to_string(),
                reason: format!("not held by {holder} with token {token}"),
            }),
            _ => Err(bad_reply(&what, &[reply])),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_prefixes_are_checked_without_showing_the_password() {
        parse_url(&StoreUrl::new("redis://:pw@cache:6379/0")).unwrap();
        parse_url(&StoreUrl::new("rediss://:pw@cache:6380/0")).unwrap();
        let err = parse_url(&StoreUrl::new("redis://:hunter2@cache:6380?sslrootcert=/ca.pem"))
            .unwrap_err()
            .chain();
        assert!(
            err.contains("connects without TLS; use rediss://") && !err.contains("hunter2"),
            "{err}"
        );
        let err = parse_url(&StoreUrl::new(
            "rediss://:hunter2@cache:6380?sslrootcert=/no/such/ca.pem",
        ))
        .unwrap_err()
        .chain();
        assert!(
            err.contains("/no/such/ca.pem: cannot read") && !err.contains("hunter2"),
            "{err}"
        );
        let err = parse_url(&StoreUrl::new("http://:hunter2@cache")).unwrap_err().chain();
        assert!(err.contains("is not a Redis URL") && !err.contains("hunter2"), "{err}");
        validate_prefix(DEFAULT_PREFIX).unwrap();
        assert!(validate_prefix("a{b}").is_err());
    }
}
