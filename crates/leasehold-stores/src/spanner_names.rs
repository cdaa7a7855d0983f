//! Where a Spanner lease table lives, and the one check of a database path
//! and a table name, for every place one enters: the resource spec
//! (`api::validate`), the sidecar's flags and the store itself. Callers name
//! the field. Plain data, compiled without the Spanner client: the
//! `DistributedLease` names a Spanner table whichever stores are built in.

// Without the Spanner store only the roles' validation reads it, and the
// store's re-export of `SpannerConfig` is not there.
#![cfg_attr(not(feature = "spanner"), allow(dead_code, unreachable_pub))]

/// Where the lease table lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpannerConfig {
    /// `projects/<p>/instances/<i>/databases/<d>`.
    pub database: String,
    /// Table name, validated as an identifier.
    pub table: String,
}

/// A database path or table name Spanner (or our SQL text) cannot use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("must look like projects/<project>/instances/<instance>/databases/<database>, got {0:?}")]
    Database(String),
    /// The table name is part of the SQL text (it cannot be a parameter),
    /// so it must be a plain identifier.
    #[error("must be a letter followed by up to 127 letters, digits or underscores, got {0:?}")]
    Table(String),
}

/// The longest Spanner table name.
const MAX_TABLE_NAME: usize = 128;

/// `projects/P/instances/I/databases/D`, each part non-empty.
pub fn check_database(database: &str) -> Result<(), NameError> {
    let parts: Vec<&str> = database.split('/').collect();
    match parts.as_slice() {
        ["projects", p, "instances", i, "databases", d] if [p, i, d].iter().all(|s| !s.is_empty()) => Ok(()),
        _ => Err(NameError::Database(database.to_string())),
    }
}

/// A letter, then letters, digits or `_`, at most 128 in all.
pub fn check_table(table: &str) -> Result<(), NameError> {
    if crate::is_sql_identifier(table, MAX_TABLE_NAME) {
        Ok(())
    } else {
        Err(NameError::Table(table.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_are_identifiers() {
        check_table("leasehold_leases").unwrap();
        check_table("L1").unwrap();
        check_table(&"x".repeat(MAX_TABLE_NAME)).unwrap();
        for bad in [
            "",
            "1abc",
            "lease-table",
            "leases; DROP TABLE x",
            "a b",
            &"x".repeat(MAX_TABLE_NAME + 1),
        ] {
            assert_eq!(check_table(bad), Err(NameError::Table(bad.to_string())));
        }
        assert_eq!(
            NameError::Table("a-b".into()).to_string(),
            "must be a letter followed by up to 127 letters, digits or underscores, got \"a-b\""
        );
    }

    #[test]
    fn database_paths_are_checked() {
        check_database("projects/p/instances/i/databases/d").unwrap();
        for bad in [
            "",
            "projects/p/instances/i",
            "projects//instances/i/databases/d",
            "p/i/d",
            "projects/p/instances/i/databases/d/extra",
        ] {
            let err = check_database(bad).unwrap_err().to_string();
            assert!(
                err.starts_with("must look like projects/<project>/instances/<instance>/databases/<database>"),
                "{err}"
            );
        }
    }
}
