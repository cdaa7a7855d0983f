//! Sessions and lock sets on Redis ([`SessionStore`]).
//!
//! Three keys per key prefix, sharing the hash tag `{sessions}` so that a
//! batch of any locks is one Lua script on one Cluster slot (the session
//! keys of a prefix live on one shard; the single-lock keys spread):
//!
//! * `<prefix>{sessions}:sessions`, a hash: session id →
//!   `"<renewed_us> <lease_ms> <owner>"`;
//! * `<prefix>{sessions}:expiry`, a sorted set: session id scored by the
//!   microsecond it expires at (`renewed_us + lease_ms × 1000`), so that
//!   garbage collection finds expired sessions without a scan;
//! * `<prefix>{sessions}:locks`, a hash: lock name → `"<token_us> <session>"`,
//!   the session empty once released. It never expires: the token
//!   outlives every holder.
//!
//! Every operation is one script (one atomic step on the server, S7). Expiry
//! is judged in the script by the server's clock, `TIME` in microseconds: a
//! session is live while `now_us <= renewed_us + lease_ms × 1000`, the
//! core's rule ([`SessionRecord::is_live_at`]). No key has a TTL: an expired
//! session's entry stays, judged dead, until a batch that finds it holding
//! a wanted lock or garbage collection deletes it.
//!
//! A batch's stamp is `max(now_us, renewed_us + 1, highest token read + 1)`:
//! the session's new `renewed_us` and the token of every lock it takes, so
//! tokens strictly increase per lock while its entry lives. Garbage
//! collection deletes a lock entry only once `TIME` has passed its token, so
//! an entry written again later gets a higher token unless the server's
//! clock goes back. Tokens are reported in nanoseconds (µs × 1000), like
//! the other session stores'. A failover can lose the last acknowledged
//! scripts, exactly as for single locks (`super` module docs).
//!
//! Scripts are never retried (a lost reply may hide a write): a reply that
//! never came is an unknown outcome for a write (S9).

use std::sync::LazyLock;
use std::time::Duration;

use async_trait::async_trait;
use redis::{Script, Value};

use super::{NOW_US, RedisStore, bad_reply, int, lease_ms, micros, text};
use crate::lease::session::{
    Collected, GARBAGE_BATCH, LockBatch, LocksObservation, ObservedLock, SessionObservation, SessionRecord,
    SessionStore, session_lost, validate_lock_names, validate_session_id,
};
use crate::lease::store::Result;
use crate::lease::{FencingToken, LeaseStore, StoreError};
use crate::{Effect, lease_from_millis};

/// Helpers every session script starts with (after `NOW_US`). KEYS:
/// sessions, expiry, locks.
const COMMON: &str = "
local function fmt(x) return string.format('%.0f', x) end
local function session_row(id)
  local value = redis.call('HGET', KEYS[1], id)
  if not value then return nil end
  local renewed, lease, owner = string.match(value, '^(%d+) (%d+) (.*)$')
  return tonumber(renewed), tonumber(lease), owner
end
local function live(renewed, lease) return renewed ~= nil and now_us <= renewed + lease * 1000 end
local function save_session(id, renewed, lease, owner)
  redis.call('HSET', KEYS[1], id, fmt(renewed) .. ' ' .. fmt(lease) .. ' ' .. owner)
  redis.call('ZADD', KEYS[2], fmt(renewed + lease * 1000), id)
end
local judged = {}
local function holder_live(id)
  if judged[id] == nil then
    local renewed, lease = session_row(id)
    judged[id] = live(renewed, lease)
  end
  return judged[id]
end
local function lock_rows(names)
  if #names == 0 then return {} end
  return redis.call('HMGET', KEYS[3], unpack(names))
end
local function lock_row(value)
  if not value then return nil end
  local token, holder = string.match(value, '^(%d+) (.*)$')
  return token, holder
end
";

/// ARGV: id, owner, lease_ms. Returns {1, now_us} when opened, {0} when the
/// id is in use.
const OPEN: &str = "
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then return {0} end
save_session(ARGV[1], now_us, tonumber(ARGV[3]), ARGV[2])
return {1, now_us}
";

/// ARGV: id. Returns {1, renewed_us} when renewed, {0} when absent or expired.
const RENEW: &str = "
local renewed, lease, owner = session_row(ARGV[1])
if not live(renewed, lease) then return {0} end
local stamp = math.max(now_us, renewed + 1)
save_session(ARGV[1], stamp, lease, owner)
return {1, stamp}
";

/// ARGV: id. Returns 1 when closed, 0 when absent.
const CLOSE: &str = "
redis.call('ZREM', KEYS[2], ARGV[1])
return redis.call('HDEL', KEYS[1], ARGV[1])
";

/// ARGV: id. Returns {now_us} when absent, {now_us, renewed_us, lease_ms, owner}.
const OBSERVE_SESSION: &str = "
local renewed, lease, owner = session_row(ARGV[1])
if not renewed then return {now_us} end
return {now_us, renewed, lease, owner}
";

/// ARGV: session, then the names. Returns {0} when the session is absent or
/// expired, else {1, stamp, t_1, …, t_n}: per name its token in µs when the
/// session holds it now (taken or already held), 0 when busy.
const TRY_LOCK: &str = "
local own = ARGV[1]
local renewed, lease, owner = session_row(own)
if not live(renewed, lease) then return {0} end
local n = #ARGV - 1
local rows = lock_rows({unpack(ARGV, 2)})
local stamp = math.max(now_us, renewed + 1)
local found = {}
for i = 1, n do
  local token, holder = lock_row(rows[i])
  if token then
    found[i] = {tonumber(token), holder}
    stamp = math.max(stamp, tonumber(token) + 1)
  end
end
local reply = {1, stamp}
local writes = {}
for i = 1, n do
  local row = found[i]
  if row and row[2] == own then
    reply[i + 2] = row[1]
  elseif row and row[2] ~= '' and holder_live(row[2]) then
    reply[i + 2] = 0
  else
    reply[i + 2] = stamp
    writes[#writes + 1] = ARGV[i + 1]
    writes[#writes + 1] = fmt(stamp) .. ' ' .. own
    if #writes >= 1000 then
      redis.call('HSET', KEYS[3], unpack(writes))
      writes = {}
    end
  end
end
if #writes > 0 then redis.call('HSET', KEYS[3], unpack(writes)) end
save_session(own, stamp, lease, owner)
return reply
";

/// ARGV: session, then name and token (µs) pairs. Returns the names freed.
const UNLOCK: &str = "
local freed = {}
for i = 2, #ARGV, 2 do
  local token, holder = lock_row(redis.call('HGET', KEYS[3], ARGV[i]))
  if token == ARGV[i + 1] and holder == ARGV[1] then
    redis.call('HSET', KEYS[3], ARGV[i], token .. ' ')
    freed[#freed + 1] = ARGV[i]
  end
end
return freed
";

/// ARGV: the names. Returns {now_us, token_1, holder_1, …}: the token in µs
/// (false without an entry), the holder when live (false when free).
const OBSERVE_LOCKS: &str = "
local rows = lock_rows(ARGV)
local reply = {now_us}
for i = 1, #ARGV do
  local token, holder = lock_row(rows[i])
  reply[2 * i] = token and tonumber(token) or false
  reply[2 * i + 1] = (token and holder ~= '' and holder_live(holder)) and holder or false
end
return reply
";

/// ARGV: batch size, lock cursor. Deletes up to a batch of expired
/// sessions, then scans about a batch of lock entries from the cursor and
/// deletes the free ones whose token the clock has passed. Returns
/// {next cursor, sessions deleted, locks deleted}.
const COLLECT: &str = "
local batch = tonumber(ARGV[1])
local expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', '(' .. fmt(now_us), 'LIMIT', 0, batch)
local sessions = 0
for _, id in ipairs(expired) do
  redis.call('ZREM', KEYS[2], id)
  sessions = sessions + redis.call('HDEL', KEYS[1], id)
end
local scan = redis.call('HSCAN', KEYS[3], ARGV[2], 'COUNT', batch)
local locks = 0
for i = 1, #scan[2], 2 do
  local token, holder = lock_row(scan[2][i + 1])
  if tonumber(token) < now_us and (holder == '' or not holder_live(holder)) then
    locks = locks + redis.call('HDEL', KEYS[3], scan[2][i])
  end
end
return {scan[1], sessions, locks}
";

struct SessionScripts {
    open: Script,
    renew: Script,
    close: Script,
    observe_session: Script,
    try_lock: Script,
    unlock: Script,
    observe_locks: Script,
    collect: Script,
}

/// Built once per process: a script is its text and that text's SHA-1.
static SCRIPTS: LazyLock<SessionScripts> = LazyLock::new(|| {
    let script = |body: &str| Script::new(&format!("{NOW_US}{COMMON}{body}"));
    SessionScripts {
        open: script(OPEN),
        renew: script(RENEW),
        close: script(CLOSE),
        observe_session: script(OBSERVE_SESSION),
        try_lock: script(TRY_LOCK),
        unlock: script(UNLOCK),
        observe_locks: script(OBSERVE_LOCKS),
        collect: script(COLLECT),
    }
});

/// A token in µs as reported: nanoseconds, like the other session stores'.
fn token_from_micros(us: i64) -> FencingToken {
    FencingToken(us.saturating_mul(1000))
}

impl RedisStore {
    /// The session keys of this store's prefix: sessions, expiry, locks.
    pub fn session_keys(&self) -> [String; 3] {
        let prefix = &self.config().prefix;
        ["sessions", "expiry", "locks"].map(|key| format!("{prefix}{{sessions}}:{key}"))
    }

    async fn session_script(&self, what: &str, script: &Script, args: &[String], effect: Effect) -> Result<Vec<Value>> {
        self.invoke_array(what, script, &self.session_keys(), args, effect)
            .await
    }
}

#[async_trait]
impl SessionStore for RedisStore {
    /// Redis has no schema; this checks that the server answers and runs scripts.
    async fn ensure_session_schema(&self) -> Result<()> {
        self.ensure_schema().await
    }

    async fn open_session(&self, session: &str, owner: &str, lease: Duration) -> Result<crate::lease::StoreTime> {
        validate_session_id(session)?;
        let what = format!("open session {session}");
        let args = [session.to_string(), owner.to_string(), lease_ms(lease)?];
        let reply = self.session_script(&what, &SCRIPTS.open, &args, Effect::Write).await?;
        match reply.as_slice() {
            [opened, now] if int(opened) == Some(1) => int(now).map(micros).ok_or_else(|| bad_reply(&what, &reply)),
            [refused] if int(refused) == Some(0) => Err(StoreError::invalid(format!(
                "session id {session:?} is in use; ids are never reused"
            ))),
            _ => Err(bad_reply(&what, &reply)),
        }
    }

    async fn renew_session(&self, session: &str) -> Result<crate::lease::StoreTime> {
        validate_session_id(session)?;
        let what = format!("renew session {session}");
        let reply = self
            .session_script(&what, &SCRIPTS.renew, &[session.to_string()], Effect::Write)
            .await?;
        match reply.as_slice() {
            [renewed, at] if int(renewed) == Some(1) => int(at).map(micros).ok_or_else(|| bad_reply(&what, &reply)),
            [refused] if int(refused) == Some(0) => Err(session_lost(
                session,
                "expired by the store's clock, closed or collected",
            )),
            _ => Err(bad_reply(&what, &reply)),
        }
    }

    async fn close_session(&self, session: &str) -> Result<()> {
        validate_session_id(session)?;
        let what = format!("close session {session}");
        let reply = self
            .invoke(
                &what,
                &SCRIPTS.close,
                &self.session_keys(),
                &[session.to_string()],
                Effect::Write,
            )
            .await?;
        match int(&reply) {
            Some(1) => Ok(()),
            Some(0) => Err(session_lost(session, "no such session (closed or collected)")),
            _ => Err(bad_reply(&what, &[reply])),
        }
    }

    async fn observe_session(&self, session: &str) -> Result<SessionObservation> {
        validate_session_id(session)?;
        let what = format!("observe session {session}");
        let reply = self
            .session_script(&what, &SCRIPTS.observe_session, &[session.to_string()], Effect::Read)
            .await?;
        let (now, record) = match reply.as_slice() {
            [now] => (int(now), None),
            [now, renewed, lease, owner] => {
                let (Some(renewed), Some(lease), Some(owner)) = (int(renewed), int(lease), text(owner)) else {
                    return Err(bad_reply(&what, &reply));
                };
                let record = SessionRecord {
                    id: session.to_string(),
                    owner,
                    renewed_at: micros(renewed),
                    lease_duration: lease_from_millis("lease_ms", session, lease)?,
                };
                (int(now), Some(record))
            }
            _ => return Err(bad_reply(&what, &reply)),
        };
        let now = now.map(micros).ok_or_else(|| bad_reply(&what, &reply))?;
        Ok(SessionObservation { record, now })
    }

    async fn try_lock(&self, session: &str, names: &[String]) -> Result<LockBatch> {
        validate_session_id(session)?;
        validate_lock_names(names.iter().map(String::as_str))?;
        let what = format!("try_lock in session {session}");
        let args: Vec<String> = std::iter::once(session.to_string())
            .chain(names.iter().cloned())
            .collect();
        let reply = self
            .session_script(&what, &SCRIPTS.try_lock, &args, Effect::Write)
            .await?;
        match reply.split_first() {
            Some((refused, [])) if int(refused) == Some(0) => Err(session_lost(
                session,
                "expired by the store's clock, closed or collected",
            )),
            Some((ok, [_stamp, tokens @ ..])) if int(ok) == Some(1) && tokens.len() == names.len() => {
                let mut batch = LockBatch::default();
                for (name, token) in names.iter().zip(tokens) {
                    match int(token) {
                        Some(0) => batch.busy.push(name.clone()),
                        Some(us) => batch.taken.push((name.clone(), token_from_micros(us))),
                        None => return Err(bad_reply(&what, &reply)),
                    }
                }
                Ok(batch)
            }
            _ => Err(bad_reply(&what, &reply)),
        }
    }

    async fn unlock(&self, session: &str, locks: &[(String, FencingToken)]) -> Result<Vec<String>> {
        validate_session_id(session)?;
        validate_lock_names(locks.iter().map(|(name, _)| name.as_str()))?;
        // A token no entry can hold (not whole microseconds) frees nothing.
        let mut args = vec![session.to_string()];
        for (name, token) in locks {
            if token.0 > 0 && token.0 % 1000 == 0 {
                args.extend([name.clone(), (token.0 / 1000).to_string()]);
            }
        }
        if args.len() == 1 {
            return Ok(Vec::new());
        }
        let what = format!("unlock in session {session}");
        let reply = self
            .session_script(&what, &SCRIPTS.unlock, &args, Effect::Write)
            .await?;
        reply
            .iter()
            .map(|name| text(name).ok_or_else(|| bad_reply(&what, &reply)))
            .collect()
    }

    async fn observe_locks(&self, names: &[String]) -> Result<LocksObservation> {
        validate_lock_names(names.iter().map(String::as_str))?;
        let what = "observe locks";
        let reply = self
            .session_script(what, &SCRIPTS.observe_locks, names, Effect::Read)
            .await?;
        let Some((now, rows)) = reply.split_first() else {
            return Err(bad_reply(what, &reply));
        };
        let now = int(now).map(micros).ok_or_else(|| bad_reply(what, &reply))?;
        // Redis drops trailing nils from an array: pad them back.
        let field = |i: usize| rows.get(i).unwrap_or(&Value::Nil);
        let locks = names
            .iter()
            .enumerate()
            .map(|(i, name)| ObservedLock {
                name: name.clone(),
                holder: text(field(2 * i + 1)),
                token: int(field(2 * i)).map(token_from_micros),
            })
            .collect();
        Ok(LocksObservation { locks, now })
    }

    async fn collect_garbage(&self) -> Result<Collected> {
        let batch = GARBAGE_BATCH.to_string();
        let (mut cursor, mut total) = ("0".to_string(), Collected::default());
        loop {
            let what = "collect garbage";
            let args = [batch.clone(), cursor.clone()];
            let reply = self
                .session_script(what, &SCRIPTS.collect, &args, Effect::Write)
                .await?;
            let [next, sessions, locks] = reply.as_slice() else {
                return Err(bad_reply(what, &reply));
            };
            let (Some(next), Some(sessions), Some(locks)) = (text(next), int(sessions), int(locks)) else {
                return Err(bad_reply(what, &reply));
            };
            total.sessions += sessions.unsigned_abs();
            total.locks += locks.unsigned_abs();
            // Done once the scan of the lock entries came round and the
            // last batch of sessions was short.
            if next == "0" && sessions.unsigned_abs() < GARBAGE_BATCH as u64 {
                return Ok(total);
            }
            cursor = next;
        }
    }
}
