//! Checks a `DistributedLease` spec and turns it into what the operator and
//! the sidecar work with. Every error names the field it is about.

// The roles validate a resource; the resource alone (`kubernetes`) does not.

use kube::core::Selector;

use super::gate::GATE_PROBE_HOLD;
use super::{DistributedLease, SecretKeyRef};
use leasehold_core::lease::timing::DEFAULT_JITTER;
use leasehold_core::lease::{
    LockNameError, PartitionsError, Timing, TimingError, VersionPolicy, validate_lock_name, validate_partitions,
};
use leasehold_stores::spanner_names::{self, SpannerConfig};

/// The store a valid lease names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ValidStore {
    Spanner(SpannerConfig),
    /// The URL is in the Secret, mounted into the sidecar.
    Postgres {
        url_secret: SecretKeyRef,
        table: String,
    },
    Redis {
        url_secret: SecretKeyRef,
    },
    /// Leases in the resource's namespace.
    Kubernetes,
}

impl std::fmt::Display for ValidStore {
    /// Where the leases are, for conditions and logs; never a credential.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ValidStore::Spanner(c) => write!(f, "{} (table {})", c.database, c.table),
            ValidStore::Postgres { url_secret, table } => write!(
                f,
                "PostgreSQL at the URL in Secret {} key {} (table {table})",
                url_secret.name, url_secret.key
            ),
            ValidStore::Redis { url_secret } => {
                write!(
                    f,
                    "Redis at the URL in Secret {} key {}",
                    url_secret.name, url_secret.key
                )
            }
            ValidStore::Kubernetes => write!(f, "Kubernetes Leases in the resource's namespace"),
        }
    }
}

impl ValidStore {
    /// The Secret key a PostgreSQL or Redis lease reads its URL from.
    pub fn url_secret(&self) -> Option<&SecretKeyRef> {
        match self {
            ValidStore::Spanner(_) | ValidStore::Kubernetes => None,
            ValidStore::Postgres { url_secret, .. } | ValidStore::Redis { url_secret } => Some(url_secret),
        }
    }
}

/// A spec that passed [`validate`], with the values parsed.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidLease {
    pub lock: String,
    pub store: ValidStore,
    pub timing: Timing,
    /// The candidate selector; `to_string()` gives the API form (`app=x,tier in (a,b)`).
    pub selector: Selector,
    pub label_key: String,
    pub readiness_gate: bool,
    pub versions: VersionPolicy,
    /// Work partitioning: the number of partitions, or `None` for one leader.
    pub partitions: Option<u32>,
    /// How many entries `status.history` keeps.
    pub history_limit: u32,
    /// Preferred candidates: zones in order and the stabilisation period.
    pub preference: Preference,
}

/// `spec.preferZones` and `spec.preferenceStabilization`, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Preference {
    pub zones: Vec<String>,
    pub stabilization: std::time::Duration,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ValidationError {
    /// Timing messages start with the field name already; the whole
    /// message is here (not a source) so that it reads `spec.<field> …`.
    #[error("spec.{0}")]
    Timing(TimingError),
    /// Lock name messages start with the field name already.
    #[error(transparent)]
    LockName(#[from] LockNameError),
    /// Partition messages start with the field name already.
    #[error(transparent)]
    Partitions(#[from] PartitionsError),
    #[error("{field} {message}")]
    Field { field: String, message: String },
}

pub(super) type Result<T, E = ValidationError> = std::result::Result<T, E>;

impl From<TimingError> for ValidationError {
    fn from(e: TimingError) -> Self {
        ValidationError::Timing(e)
    }
}

fn invalid(field: &'static str, message: impl Into<String>) -> ValidationError {
    ValidationError::Field {
        field: field.into(),
        message: message.into(),
    }
}

/// Validates the spec, field by field in the order they appear, and reports
/// the first problem.
pub fn validate(lease: &DistributedLease) -> Result<ValidLease> {
    let spec = &lease.spec;
    if let Some(lock) = &spec.lock_name {
        validate_lock_name("spec.lockName", lock)?;
    }
    let store = check_store(&spec.store)?;
    let timing = Timing::parse(
        &spec.lease_duration,
        &spec.renew_deadline,
        &spec.retry_period,
        DEFAULT_JITTER,
    )?;
    let selector = check_selector(lease)?;
    check_label_key(&spec.publishing.label_key)?;
    let lock = lease.lock_name();
    check_partitions(spec, &lock, &store)?;
    check_gate(spec, &timing)?;
    if spec.history_limit > super::history::MAX_HISTORY_LIMIT {
        return Err(invalid(
            "spec.historyLimit",
            format!("must be at most {}", super::history::MAX_HISTORY_LIMIT),
        ));
    }
    let preference = check_preference(spec, &timing)?;
    Ok(ValidLease {
        lock,
        store,
        timing,
        selector,
        label_key: spec.publishing.label_key.clone(),
        readiness_gate: spec.publishing.readiness_gate,
        versions: VersionPolicy {
            prefer: spec.leadership.prefer,
            fence: spec.leadership.version_fence,
        },
        partitions: spec.partitions,
        history_limit: spec.history_limit,
        preference,
    })
}

/// Zones are label values, each once; the stabilisation is a duration of
/// at least P (a shorter one cannot be observed: the operator sees
/// readiness no more often than the sidecars renew).
fn check_preference(spec: &super::DistributedLeaseSpec, timing: &Timing) -> Result<Preference> {
    const ZONES: &str = "spec.preferZones";
    const STABILIZATION: &str = "preferenceStabilization";
    for (i, zone) in spec.prefer_zones.iter().enumerate() {
        let label_value = !zone.is_empty()
            && zone.len() <= 63
            && zone.starts_with(|c: char| c.is_ascii_alphanumeric())
            && zone.ends_with(|c: char| c.is_ascii_alphanumeric())
            && zone.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
        if !label_value {
            return Err(invalid(ZONES, format!("{zone:?} is not a label value (a zone name)")));
        }
        if spec.prefer_zones[..i].contains(zone) {
            return Err(invalid(ZONES, format!("lists {zone:?} twice")));
        }
    }
    let stabilization = match &spec.preference_stabilization {
        Some(text) => leasehold_core::lease::timing::parse_duration(STABILIZATION, text)?,
        None => super::preference::DEFAULT_STABILIZATION,
    };
    if stabilization < timing.retry_period {
        return Err(invalid(
            "spec.preferenceStabilization",
            format!(
                "({stabilization:?}) must be at least retryPeriod ({:?}): the operator sees readiness no more often",
                timing.retry_period
            ),
        ));
    }
    if spec.partitions.is_some() && (!spec.prefer_zones.is_empty() || spec.preference_stabilization.is_some()) {
        return Err(invalid(
            "spec.preferZones",
            "cannot be combined with spec.partitions: preferred candidates choose one leader",
        ));
    }
    Ok(Preference {
        zones: spec.prefer_zones.clone(),
        stabilization,
    })
}

/// Partitions are session locks, which every store but the Kubernetes one
/// keeps; leadership by version and the readiness gate are about one
/// leader, so they do not mix with them.
fn check_partitions(spec: &super::DistributedLeaseSpec, lock: &str, store: &ValidStore) -> Result<()> {
    let Some(n) = spec.partitions else { return Ok(()) };
    validate_partitions(("spec.lockName", "spec.partitions"), lock, n)?;
    if matches!(store, ValidStore::Kubernetes) {
        return Err(invalid(
            "spec.partitions",
            "needs store.spanner, store.postgres or store.redis: partitions are held through sessions, \
             which the Kubernetes store does not keep",
        ));
    }
    if spec.publishing.readiness_gate {
        return Err(invalid(
            "spec.partitions",
            "cannot be combined with spec.publishing.readinessGate: the gate marks one leader Ready, and every member of a partitioned lease works",
        ));
    }
    if spec.leadership != super::LeadershipSpec::default() {
        return Err(invalid(
            "spec.partitions",
            "cannot be combined with spec.leadership: version-aware leadership chooses one leader, partitions share the work among all candidates",
        ));
    }
    Ok(())
}

/// A gated leader's sidecar probe fails once less than [`GATE_PROBE_HOLD`]
/// is left of its claim; between two renewals (P with jitter) up to R − P
/// is left, so with less than the hold a leader would keep turning unready.
fn check_gate(spec: &super::DistributedLeaseSpec, timing: &Timing) -> Result<()> {
    let longest_retry = timing.retry_period.mul_f64(1.0 + timing.jitter);
    let left = timing.renew_deadline.saturating_sub(longest_retry);
    if spec.publishing.readiness_gate && left <= GATE_PROBE_HOLD {
        return Err(invalid(
            "spec.publishing.readinessGate",
            format!(
                "needs renewDeadline − retryPeriod (with jitter) above {GATE_PROBE_HOLD:?} (it is {left:?}): the sidecar's readiness probe fails once less than that is left of its claim, so the leader would keep turning unready"
            ),
        ));
    }
    Ok(())
}

/// Exactly one store, each field checked; a Secret reference, never a URL.
fn check_store(store: &super::LeaseStoreSpec) -> Result<ValidStore> {
    let set = [
        store.spanner.is_some(),
        store.postgres.is_some(),
        store.redis.is_some(),
        store.kubernetes.is_some(),
    ];
    if set.iter().filter(|s| **s).count() != 1 {
        return Err(invalid(
            "spec.store",
            "must set exactly one of spanner, postgres, redis and kubernetes",
        ));
    }
    if store.kubernetes.is_some() {
        return Ok(ValidStore::Kubernetes);
    }
    if let Some(spanner) = &store.spanner {
        check_database(&spanner.database)?;
        check_table(&spanner.table, "spec.store.spanner.table", 128)?;
        return Ok(ValidStore::Spanner(SpannerConfig {
            database: spanner.database.clone(),
            table: spanner.table.clone(),
        }));
    }
    if let Some(postgres) = &store.postgres {
        check_secret(&postgres.url_secret_ref, "spec.store.postgres.urlSecretRef")?;
        check_table(&postgres.table, "spec.store.postgres.table", 48)?;
        return Ok(ValidStore::Postgres {
            url_secret: postgres.url_secret_ref.clone(),
            table: postgres.table.clone(),
        });
    }
    let redis = store.redis.as_ref().expect("exactly one store is set");
    check_secret(&redis.url_secret_ref, "spec.store.redis.urlSecretRef")?;
    Ok(ValidStore::Redis {
        url_secret: redis.url_secret_ref.clone(),
    })
}

/// A Secret name (a DNS subdomain) and a Secret data key.
fn check_secret(secret: &SecretKeyRef, field: &'static str) -> Result<()> {
    let name_ok = !secret.name.is_empty()
        && secret.name.len() <= 253
        && secret.name.split('.').all(|l| {
            !l.is_empty()
                && l.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
                && l.ends_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
                && l.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        });
    if !name_ok {
        return Err(ValidationError::Field {
            field: format!("{field}.name"),
            message: format!(
                "must be a Secret name (a lowercase DNS subdomain), got {:?}",
                secret.name
            ),
        });
    }
    let key_ok = !secret.key.is_empty()
        && secret.key.len() <= 253
        && secret
            .key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
    if !key_ok {
        return Err(ValidationError::Field {
            field: format!("{field}.key"),
            message: format!(
                "must be a Secret key (letters, digits, '-', '_' or '.'), got {:?}",
                secret.key
            ),
        });
    }
    Ok(())
}

/// The Spanner store owns the rules for its names; this names the field.
fn check_database(database: &str) -> Result<()> {
    spanner_names::check_database(database).map_err(|e| invalid("spec.store.spanner.database", e.to_string()))
}

fn check_table(table: &str, field: &'static str, max_len: usize) -> Result<()> {
    if leasehold_stores::is_sql_identifier(table, max_len) {
        Ok(())
    } else {
        Err(invalid(
            field,
            format!(
                "must be a letter followed by up to {} letters, digits or underscores, got {table:?}",
                max_len - 1
            ),
        ))
    }
}

fn check_selector(lease: &DistributedLease) -> Result<Selector> {
    let selector = &lease.spec.selector;
    let empty = selector.match_labels.as_ref().is_none_or(|m| m.is_empty())
        && selector.match_expressions.as_ref().is_none_or(|e| e.is_empty());
    if empty {
        return Err(invalid(
            "spec.selector",
            "must not be empty: it would make every pod in the namespace a candidate",
        ));
    }
    for (index, requirement) in selector.match_expressions.iter().flatten().enumerate() {
        let values = requirement.values.as_deref().unwrap_or_default();
        let problem = match requirement.operator.as_str() {
            "In" | "NotIn" if values.is_empty() => Some("needs values".to_string()),
            "Exists" | "DoesNotExist" if !values.is_empty() => Some("takes no values".to_string()),
            "In" | "NotIn" | "Exists" | "DoesNotExist" => None,
            other => Some(format!("has operator {other:?}; use In, NotIn, Exists or DoesNotExist")),
        };
        if let Some(problem) = problem {
            return Err(ValidationError::Field {
                field: format!("spec.selector.matchExpressions[{index}]"),
                message: format!("(key {:?}) {problem}", requirement.key),
            });
        }
    }
    Selector::try_from(selector.clone()).map_err(|e| invalid("spec.selector", e.0))
}

/// A Kubernetes qualified name: `[prefix/]name`, the prefix a DNS subdomain.
fn check_label_key(key: &str) -> Result<()> {
    const FIELD: &str = "spec.publishing.labelKey";
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    let name_ok = !name.is_empty()
        && name.len() <= 63
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
    if !name_ok {
        return Err(invalid(
            FIELD,
            format!(
                "must be a label key: a name of at most 63 letters, digits, '-', '_' or '.', starting and ending alphanumeric, got {key:?}"
            ),
        ));
    }
    if let Some(prefix) = prefix {
        let subdomain = !prefix.is_empty()
            && prefix.len() <= 253
            && prefix.split('.').all(|label| {
                !label.is_empty()
                    && label.len() <= 63
                    && label.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
                    && label.ends_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
                    && label
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            });
        if !subdomain {
            return Err(invalid(
                FIELD,
                format!("prefix must be a lowercase DNS subdomain (like leasehold.dev), got {prefix:?}"),
            ));
        }
    }
    Ok(())
}
