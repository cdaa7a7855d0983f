//! leasehold's database stores: PostgreSQL (and CockroachDB), Redis and
//! Cloud Spanner, one module per backend behind the core's ports, each with
//! its fence helper (`fence`), a feature each. The Kubernetes store is the
//! Kubernetes layer's; the memory store is the core's. The conformance
//! suite every backend must pass is test support (`testing::conformance`
//! in the `leasehold` package). Re-exported by `leasehold` as
//! `leasehold::store` and `leasehold::fence`.

#![warn(unreachable_pub)]

pub mod fence;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(any(feature = "postgres", feature = "redis"))]
mod push;
#[cfg(feature = "redis")]
pub mod redis;
#[cfg(feature = "spanner")]
pub mod spanner;
pub mod spanner_names;
#[cfg(any(feature = "postgres", feature = "redis"))]
pub mod tls;

use std::time::Duration;

/// The core's lease module, under the path every backend names.
pub(crate) use leasehold_core::lease;

pub use crate::lease::store::{LeaseStore, Result, StoreError};
#[cfg(any(feature = "postgres", feature = "spanner"))]
use crate::lease::{Claim, Version};

/// The lease table of the SQL stores unless a flag or the resource names another.
pub const DEFAULT_TABLE: &str = "leasehold_leases";

/// FNV-1a 64 of the lock name, mod 1024: the leading primary-key column of
/// the SQL stores, so that a hot set of locks spreads over splits (Spanner)
/// and ranges (CockroachDB) instead of one key range.
pub fn shard_of(name: &str) -> i64 {
    (lease::fnv1a_64(name.as_bytes()) % 1024) as i64
}

/// The recorded version, from the SQL stores' `revision` and `version`
/// columns: none without a revision; a negative revision is
/// refused, never read as some other order.
#[cfg(any(feature = "postgres", feature = "spanner"))]
pub fn version_from_row(lock: &str, revision: Option<i64>, name: Option<&str>) -> Result<Option<Version>> {
    let Some(revision) = revision else { return Ok(None) };
    let revision = u64::try_from(revision).map_err(|_| {
        StoreError::invalid(format!(
            "row {lock:?} holds revision = {revision}; revisions are never negative: correct the row"
        ))
    })?;
    Ok(Some(Version {
        revision,
        name: name.unwrap_or_default().to_string(),
    }))
}

/// A claim's version as the row's columns: (revision, version name).
#[cfg(any(feature = "postgres", feature = "spanner"))]
pub fn version_columns(claim: &Claim<'_>) -> Result<(Option<i64>, Option<String>)> {
    match claim.version {
        None => Ok((None, None)),
        Some(v) => {
            let revision = i64::try_from(v.revision)
                .map_err(|_| StoreError::invalid(format!("revision {} does not fit INT64", v.revision)))?;
            Ok((Some(revision), Some(v.name.clone())))
        }
    }
}

/// The one rule for table names in SQL text (they cannot be parameters): a
/// letter, then letters, digits or `_`, at most `max_len` characters.
#[cfg_attr(not(any(feature = "postgres", feature = "spanner")), allow(dead_code))]
pub fn is_sql_identifier(name: &str, max_len: usize) -> bool {
    let mut chars = name.chars();
    name.len() <= max_len
        && chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// A table name usable in SQL text: a letter, then letters, digits or `_`,
/// at most `max_len` characters. `dialect` names the store in the error.
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
pub fn validate_table(table: &str, dialect: &str, max_len: usize) -> Result<()> {
    if is_sql_identifier(table, max_len) {
        Ok(())
    } else {
        Err(StoreError::invalid(format!(
            "table {table:?} is not a valid {dialect} identifier (a letter, then letters, digits or '_', at most {max_len})"
        )))
    }
}

/// A stored lease duration back from milliseconds. A row whose duration is
/// out of range is refused, never clamped: a lease read as 0 ms would look
/// expired to everyone while its holder still claims it.
#[cfg_attr(
    not(any(feature = "postgres", feature = "redis", feature = "spanner")),
    allow(dead_code)
)]
pub fn lease_from_millis(field: &'static str, lock: &str, millis: i64) -> Result<Duration> {
    lease::lease_from_millis(field, millis).map_err(|e| {
        StoreError::invalid(format!(
            "row {lock:?} holds {field} = {millis}: delete the row, or correct it"
        ))
        .caused_by(e)
    })
}

/// A stored term back as the core's unsigned term; a negative one is refused.
#[cfg_attr(
    not(any(feature = "postgres", feature = "redis", feature = "spanner")),
    allow(dead_code)
)]
pub fn term_from_row(lock: &str, term: i64) -> Result<u64> {
    u64::try_from(term).map_err(|_| {
        StoreError::invalid(format!(
            "row {lock:?} holds term = {term}; terms are never negative: delete the row, or correct it"
        ))
    })
}

/// A store URL that may carry a password: shown with the password replaced,
/// so settings can be logged.
#[derive(Clone, PartialEq, Eq)]
pub struct StoreUrl(String);

impl StoreUrl {
    pub fn new(url: impl Into<String>) -> Self {
        StoreUrl(url.into().trim().to_string())
    }

    /// The URL itself, for the driver only.
    #[cfg_attr(not(any(feature = "postgres", feature = "redis")), allow(dead_code))]
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// `scheme://user:***@host/...`: the password (between the first `:` after
    /// `//` and the last `@` before the path) replaced.
    pub fn redacted(&self) -> String {
        let url = &self.0;
        let Some(start) = url.find("://").map(|i| i + 3) else {
            return "<not a URL>".into();
        };
        let authority_end = url[start..].find(['/', '?']).map_or(url.len(), |i| start + i);
        let authority = &url[start..authority_end];
        match authority.rfind('@') {
            Some(at) => {
                let userinfo = &authority[..at];
                let user = userinfo.split_once(':').map_or(userinfo, |(user, _)| user);
                let masked = if userinfo.contains(':') { ":***" } else { "" };
                format!("{}{user}{masked}{}", &url[..start], &url[start + at..])
            }
            None => url.clone(),
        }
    }
}

impl std::fmt::Debug for StoreUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.redacted())
    }
}

/// Whether a call may have changed the row: what a call whose reply never
/// came means depends on it.
#[cfg(any(feature = "postgres", feature = "redis"))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    /// A read: a lost reply changed nothing.
    Read,
    /// A write: a lost reply means it may have committed.
    Write,
}

#[cfg(any(feature = "postgres", feature = "redis"))]
impl Effect {
    /// The error for a call that got no reply: a write's outcome is unknown
    /// (never success, S9); a read merely failed.
    pub fn no_reply(self, context: String) -> StoreError {
        match self {
            Effect::Write => StoreError::outcome_unknown(context),
            Effect::Read => StoreError::unavailable(context),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_is_fnv1a_64_mod_1024() {
        // FNV-1a 64 of "" is the offset basis; of "a" it is 0xaf63dc4c8601ec8c.
        assert_eq!(shard_of(""), (0xcbf2_9ce4_8422_2325_u64 % 1024) as i64);
        assert_eq!(shard_of("a"), (0xaf63_dc4c_8601_ec8c_u64 % 1024) as i64);
        assert!((0..1024).contains(&shard_of("prod/scheduler")));
    }

    #[test]
    fn table_names_are_identifiers() {
        validate_table("leasehold_leases", "Spanner", 128).unwrap();
        validate_table("L1", "Spanner", 128).unwrap();
        for bad in [
            "",
            "1abc",
            "lease-table",
            "leases; DROP TABLE x",
            "a b",
            &"x".repeat(129),
        ] {
            let err = validate_table(bad, "Spanner", 128).unwrap_err().to_string();
            assert!(err.contains("is not a valid Spanner identifier"), "{bad}: {err}");
        }
        let err = validate_table(&"x".repeat(49), "PostgreSQL", 48)
            .unwrap_err()
            .to_string();
        assert!(err.contains("at most 48"), "{err}");
    }

    #[test]
    fn urls_are_shown_without_their_password() {
        let shown = |u: &str| StoreUrl::new(u).redacted();
        assert_eq!(
            shown("postgres://app:s3cr@t@db:5432/leases?sslmode=disable"),
            "postgres://app:***@db:5432/leases?sslmode=disable"
        );
        assert_eq!(shown("redis://:pw@cache:6379/0"), "redis://:***@cache:6379/0");
        assert_eq!(shown("redis://cache:6379"), "redis://cache:6379");
        assert_eq!(shown("postgres://app@db/x"), "postgres://app@db/x");
        assert_eq!(shown("host=db password=x"), "<not a URL>");
        let debug = format!("{:?}", StoreUrl::new("redis://u:hunter2@h"));
        assert!(!debug.contains("hunter2"), "{debug}");
    }
}
