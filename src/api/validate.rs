//! Checks a `DistributedLease` spec and turns it into what the operator and
//! the sidecar work with. Every error names the field it is about.

use kube::core::Selector;

use super::DistributedLease;
use crate::lease::{LockNameError, Timing, TimingError, validate_lock_name};
use crate::store::spanner::SpannerConfig;

/// A spec that passed [`validate`], with the values parsed.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidLease {
    pub lock: String,
    pub spanner: SpannerConfig,
    pub timing: Timing,
    /// The candidate selector in API string form (`app=x,tier in (a,b)`).
    pub selector: String,
    pub label_key: String,
    pub readiness_gate: bool,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ValidationError {
    /// Timing messages start with the field name already.
    #[error("spec.{0}")]
    Timing(#[from] TimingError),
    /// Lock name messages start with the field name already.
    #[error(transparent)]
    LockName(#[from] LockNameError),
    #[error("{field} {message}")]
    Field { field: String, message: String },
}

pub type Result<T, E = ValidationError> = std::result::Result<T, E>;

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
    let spanner = &spec.store.spanner;
    check_database(&spanner.database)?;
    check_table(&spanner.table)?;
    let timing = Timing::parse(
        &spec.lease_duration,
        &spec.renew_deadline,
        &spec.retry_period,
        Timing::default().jitter,
    )?;
    let selector = check_selector(lease)?;
    check_label_key(&spec.publishing.label_key)?;
    Ok(ValidLease {
        lock: lease.lock_name(),
        spanner: SpannerConfig {
            database: spanner.database.clone(),
            table: spanner.table.clone(),
        },
        timing,
        selector,
        label_key: spec.publishing.label_key.clone(),
        readiness_gate: spec.publishing.readiness_gate,
    })
}

fn check_database(database: &str) -> Result<()> {
    let parts: Vec<&str> = database.split('/').collect();
    let shaped = matches!(
        parts.as_slice(),
        ["projects", p, "instances", i, "databases", d] if !p.is_empty() && !i.is_empty() && !d.is_empty()
    );
    if shaped {
        Ok(())
    } else {
        Err(invalid(
            "spec.store.spanner.database",
            format!("must look like projects/<project>/instances/<instance>/databases/<database>, got {database:?}"),
        ))
    }
}

fn check_table(table: &str) -> Result<()> {
    let mut chars = table.chars();
    let identifier = chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && table.len() <= 128;
    if identifier {
        Ok(())
    } else {
        Err(invalid(
            "spec.store.spanner.table",
            format!("must be a letter followed by up to 127 letters, digits or underscores, got {table:?}"),
        ))
    }
}

fn check_selector(lease: &DistributedLease) -> Result<String> {
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
    let parsed = Selector::try_from(selector.clone()).map_err(|e| invalid("spec.selector", e.0))?;
    Ok(parsed.to_string())
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
