//! Fenced writes to Redis: one Lua script compares the fence key with the
//! token and, when the token is not lower, stores it and sets the guarded
//! keys. Redis runs a script atomically, so no other command runs between
//! the comparison and the writes.
//!
//! The fence key is [`fence_key`], `leasehold-fence:{<lock>}:<issuer>`, a
//! plain string that never expires. Redis Cluster runs a script only over
//! keys of one hash slot, so every guarded key must carry the same hash tag,
//! `{<lock>}` (e.g. `orders:{orders}:latest` for lock `orders`): [`fenced`]
//! refuses a key with another tag before sending anything.
//!
//! Tokens are compared as decimal strings (length, then bytes), not as Lua
//! numbers: Lua's doubles are exact only to 2^53, below the nanosecond
//! tokens of the Spanner and PostgreSQL stores.
//!
//! Like any Redis script, a command failing inside it (e.g. out of memory)
//! does not undo the commands before it; the fence key is written first, so
//! such a failure can only refuse older tokens early, never admit one.

use redis::Script;
use redis::aio::ConnectionLike;

use super::{Fence, FenceError};

/// KEYS[1] the fence key, KEYS[2..] the guarded keys; ARGV[1] the token,
/// ARGV[2..] the values. Replies {1, token} when written, {0, seen} when
/// refused.
const FENCED_SET: &str = r"
local offered, seen = ARGV[1], redis.call('GET', KEYS[1])
if seen and (#seen > #offered or (#seen == #offered and seen > offered)) then
  return {0, seen}
end
redis.call('SET', KEYS[1], offered)
for i = 2, #KEYS do
  redis.call('SET', KEYS[i], ARGV[i])
end
return {1, offered}
";

/// The key holding the highest token seen for the fence's issuer and lock.
pub fn fence_key(fence: &Fence) -> String {
    format!("leasehold-fence:{{{}}}:{}", fence.lock, fence.issuer)
}

/// What Redis Cluster hashes of `key`: the text between the first `{` and
/// the first `}` after it when that is not empty, else the whole key
/// (Redis Cluster specification, "Hash tags").
fn hash_tag(key: &str) -> &str {
    key.find('{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            rest.find('}').filter(|&close| close > 0).map(|close| &rest[..close])
        })
        .unwrap_or(key)
}

/// Sets each `(key, value)` of `writes` in one atomic step with the fence's
/// advance: done when the fence's token is at least the highest one seen for
/// its issuer and lock, refused ([`FenceError::Stale`]) with nothing written
/// when it is lower.
pub async fn fenced<C>(connection: &mut C, fence: &Fence, writes: &[(&str, &[u8])]) -> Result<(), FenceError>
where
    C: ConnectionLike + Send,
{
    let fence_key = fence_key(fence);
    let tag = hash_tag(&fence_key);
    if let Some((key, _)) = writes.iter().find(|(key, _)| hash_tag(key) != tag) {
        return Err(FenceError::HashSlot {
            key: key.to_string(),
            tag: tag.to_string(),
        });
    }
    let script = Script::new(FENCED_SET);
    let mut invocation = script.prepare_invoke();
    invocation.key(&fence_key).arg(fence.token.0);
    for (key, value) in writes {
        invocation.key(*key).arg(*value);
    }
    let (written, seen): (i64, i64) =
        invocation
            .invoke_async(connection)
            .await
            .map_err(|source| FenceError::Redis {
                context: fence.context(),
                source,
            })?;
    if written == 1 { Ok(()) } else { Err(fence.stale(seen)) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_tags_follow_the_cluster_rule() {
        assert_eq!(hash_tag("a:{orders}:b"), "orders");
        assert_eq!(hash_tag("{orders}{x}"), "orders");
        assert_eq!(
            hash_tag("a:{}:{orders}"),
            "a:{}:{orders}",
            "an empty tag hashes the whole key"
        );
        assert_eq!(hash_tag("plain"), "plain");
        assert_eq!(hash_tag("a{open"), "a{open");
    }

    #[test]
    fn the_fence_key_carries_the_lock_as_its_hash_tag() {
        let fence = Fence::new("redis", "orders", crate::lease::FencingToken(1)).unwrap();
        assert_eq!(fence_key(&fence), "leasehold-fence:{orders}:redis");
        assert_eq!(hash_tag(&fence_key(&fence)), "orders");
    }
}
