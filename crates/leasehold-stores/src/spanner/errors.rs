//! Spanner's errors sorted into the kinds the elector acts on, and the
//! refusal a transaction body leaves before rolling back.

use std::sync::{Arc, Mutex};

use google_cloud_gax::error::rpc::{Code, Status};

use super::SpannerConfig;
use crate::lease::StoreError;

/// What the store tells the operator when the lease table is absent.
pub(super) const TABLE_MISSING_FIX: &str = "run the sidecar with --create-table or let the operator create it";

/// The Spanner status under a store error, when it came from Spanner. (Read
/// from the field: `Error::source` hands out the `Arc` around the cause, which
/// does not downcast to the client's error.)
pub(super) fn spanner_status(error: &StoreError) -> Option<&Status> {
    let cause = match error {
        StoreError::Unavailable { source, .. }
        | StoreError::OutcomeUnknown { source, .. }
        | StoreError::Invalid { source, .. } => source.as_ref()?,
        StoreError::Lost { .. } => return None,
    };
    cause.downcast_ref::<google_cloud_spanner::Error>()?.status()
}

/// Spanner deleted the session (or lost it in a restart): nothing ran.
pub(super) fn session_lost(error: &StoreError) -> bool {
    spanner_status(error).is_some_and(|s| s.code == Code::NotFound && s.message.contains("Session not found"))
}

/// Spanner reports an absent table as NOT_FOUND (reads) or INVALID_ARGUMENT
/// (when analysing a query).
pub(super) fn table_missing(error: &StoreError) -> bool {
    spanner_status(error).is_some_and(names_missing_table)
}

pub(super) fn names_missing_table(status: &Status) -> bool {
    matches!(status.code, Code::NotFound | Code::InvalidArgument) && status.message.contains("Table not found")
}

/// Sorts a client error into the kinds the elector acts on, keeping it as
/// the cause. `committing` says whether the commit request may have reached
/// Spanner.
pub(super) fn classify(
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
pub(super) struct Refusal(Arc<Mutex<Option<StoreError>>>);

impl Refusal {
    pub(super) fn refuse<T>(&self, error: StoreError) -> google_cloud_spanner::Result<T> {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(error);
        Err(google_cloud_spanner::Error::deser("refused; rolled back"))
    }

    pub(super) fn take(&self) -> Option<StoreError> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

pub(super) fn lost(lock: &str, reason: String) -> StoreError {
    StoreError::Lost {
        lock: lock.to_string(),
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
