//! The lease table's schema: the DDL that creates it, and the check that an
//! existing table can work, read from `INFORMATION_SCHEMA` at
//! `ensure_schema` and before a store's first operation. A table that cannot
//! work (a column missing, of another type, or a commit-timestamp column
//! without `allow_commit_timestamp`) is reported as invalid with the fix,
//! instead of failing every commit and being retried forever.

/// Whether a column must accept `PENDING_COMMIT_TIMESTAMP()`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CommitTimestamp {
    Required,
    No,
}

/// Every column the store reads or writes: name, type (a `STRING` of any
/// length will do) and whether it holds commit timestamps.
const COLUMNS: [(&str, &str, CommitTimestamp); 13] = [
    ("shard", "INT64", CommitTimestamp::No),
    ("name", "STRING", CommitTimestamp::No),
    ("holder", "STRING", CommitTimestamp::No),
    ("term", "INT64", CommitTimestamp::No),
    ("token", "TIMESTAMP", CommitTimestamp::Required),
    ("renewed_at", "TIMESTAMP", CommitTimestamp::Required),
    ("lease_ms", "INT64", CommitTimestamp::No),
    ("revision", "INT64", CommitTimestamp::No),
    ("version", "STRING", CommitTimestamp::No),
    ("reserved_for", "STRING", CommitTimestamp::No),
    ("reserved_until", "TIMESTAMP", CommitTimestamp::No),
    ("ended_term", "INT64", CommitTimestamp::No),
    ("ended", "STRING", CommitTimestamp::No),
];

/// The columns leasehold added after the table's first release (the
/// version of the last holder, issue 16; a transfer's reservation and the
/// recorded end of a term, issue 35), with the DDL type `ensure_schema`
/// adds them with to a table created before: nullable, so existing rows
/// read as "no version recorded", "not reserved" and "no end recorded".
const ADDED_COLUMNS: [(&str, &str); 6] = [
    ("revision", "INT64"),
    ("version", "STRING(MAX)"),
    ("reserved_for", "STRING(MAX)"),
    ("reserved_until", "TIMESTAMP"),
    ("ended_term", "INT64"),
    ("ended", "STRING(MAX)"),
];

/// The `ALTER TABLE` statements that bring a table created by an older
/// leasehold up to date: one per added column it lacks (none when current,
/// so running it again changes nothing).
pub(super) fn upgrades(table: &str, found: &[Column]) -> Vec<String> {
    ADDED_COLUMNS
        .iter()
        .filter(|(column, _)| !found.iter().any(|c| c.name.eq_ignore_ascii_case(column)))
        .map(|(column, ddl_type)| format!("ALTER TABLE {table} ADD COLUMN {column} {ddl_type}"))
        .collect()
}

/// The DDL that creates the lease table.
pub(super) fn create_table(table: &str) -> String {
    format!(
        "CREATE TABLE {table} (\n  shard INT64 NOT NULL,\n  name STRING(MAX) NOT NULL,\n  holder STRING(MAX),\n  \
         term INT64 NOT NULL,\n  token TIMESTAMP OPTIONS (allow_commit_timestamp=true),\n  \
         renewed_at TIMESTAMP OPTIONS (allow_commit_timestamp=true),\n  lease_ms INT64 NOT NULL,\n  \
         revision INT64,\n  version STRING(MAX),\n  reserved_for STRING(MAX),\n  reserved_until TIMESTAMP,\n  \
         ended_term INT64,\n  ended STRING(MAX),\n) \
         PRIMARY KEY (shard, name)"
    )
}

/// The table's columns with their Spanner type and `allow_commit_timestamp`
/// option; no rows when the table does not exist.
pub(super) const COLUMNS_QUERY: &str = "SELECT c.COLUMN_NAME AS name, c.SPANNER_TYPE AS type, o.OPTION_VALUE AS commit_ts \
     FROM INFORMATION_SCHEMA.COLUMNS AS c LEFT JOIN INFORMATION_SCHEMA.COLUMN_OPTIONS AS o \
     ON o.TABLE_SCHEMA = c.TABLE_SCHEMA AND o.TABLE_NAME = c.TABLE_NAME AND o.COLUMN_NAME = c.COLUMN_NAME \
     AND o.OPTION_NAME = 'allow_commit_timestamp' \
     WHERE c.TABLE_SCHEMA = '' AND c.TABLE_NAME = @table";

/// One row of [`COLUMNS_QUERY`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Column {
    pub name: String,
    pub spanner_type: String,
    /// `OPTION_VALUE` of `allow_commit_timestamp`, `"TRUE"` when set.
    pub commit_ts: Option<String>,
}

/// Why an existing lease table cannot work, with the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum SchemaError {
    #[error(
        "table {table} has no column {column} {want}: add it (ALTER TABLE {table} ADD COLUMN {column} {want}), \
         or let --create-table or the operator (ensure-schema) upgrade the table"
    )]
    MissingColumn {
        table: String,
        column: &'static str,
        want: &'static str,
    },
    #[error(
        "column {table}.{column} is {found}, leasehold needs {want}: drop the table and let --create-table or the \
         operator create it"
    )]
    WrongType {
        table: String,
        column: &'static str,
        found: String,
        want: &'static str,
    },
    #[error(
        "column {table}.{column} cannot hold commit timestamps: run \
         ALTER TABLE {table} ALTER COLUMN {column} SET OPTIONS (allow_commit_timestamp = true)"
    )]
    NoCommitTimestamp { table: String, column: &'static str },
}

/// Checks the columns [`COLUMNS_QUERY`] found for `table` (at least one:
/// an absent table is the caller's case).
pub(super) fn check(table: &str, found: &[Column]) -> Result<(), SchemaError> {
    for (column, want, commit_ts) in COLUMNS {
        let Some(actual) = found.iter().find(|c| c.name.eq_ignore_ascii_case(column)) else {
            return Err(SchemaError::MissingColumn {
                table: table.to_string(),
                column,
                want,
            });
        };
        // STRING(MAX) and STRING(n) are both STRING.
        let base = actual.spanner_type.split('(').next().unwrap_or_default();
        if base != want {
            return Err(SchemaError::WrongType {
                table: table.to_string(),
                column,
                found: actual.spanner_type.clone(),
                want,
            });
        }
        let allowed = actual
            .commit_ts
            .as_deref()
            .is_some_and(|v| v.eq_ignore_ascii_case("TRUE"));
        if commit_ts == CommitTimestamp::Required && !allowed {
            return Err(SchemaError::NoCommitTimestamp {
                table: table.to_string(),
                column,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn good() -> Vec<Column> {
        COLUMNS
            .iter()
            .map(|(name, spanner_type, commit_ts)| Column {
                name: name.to_string(),
                spanner_type: if *spanner_type == "STRING" {
                    "STRING(MAX)".into()
                } else {
                    spanner_type.to_string()
                },
                commit_ts: (*commit_ts == CommitTimestamp::Required).then(|| "TRUE".into()),
            })
            .collect()
    }

    #[test]
    fn the_created_schema_passes() {
        check("t", &good()).unwrap();
        let mut extra = good();
        extra.push(Column {
            name: "note".into(),
            spanner_type: "STRING(100)".into(),
            commit_ts: None,
        });
        check("t", &extra).unwrap();
    }

    #[test]
    fn a_table_from_before_versions_is_refused_until_upgraded_once() {
        let mut old = good();
        let added = [
            "revision",
            "version",
            "reserved_for",
            "reserved_until",
            "ended_term",
            "ended",
        ];
        old.retain(|c| !added.contains(&c.name.as_str()));
        assert!(
            check("t", &old)
                .unwrap_err()
                .to_string()
                .starts_with("table t has no column revision INT64"),
            "a store without the column says so instead of answering without it"
        );
        assert_eq!(
            upgrades("t", &old),
            [
                "ALTER TABLE t ADD COLUMN revision INT64",
                "ALTER TABLE t ADD COLUMN version STRING(MAX)",
                "ALTER TABLE t ADD COLUMN reserved_for STRING(MAX)",
                "ALTER TABLE t ADD COLUMN reserved_until TIMESTAMP",
                "ALTER TABLE t ADD COLUMN ended_term INT64",
                "ALTER TABLE t ADD COLUMN ended STRING(MAX)"
            ]
        );
        assert!(upgrades("t", &good()).is_empty(), "idempotent: nothing left to add");
    }

    #[test]
    fn each_unworkable_schema_names_the_fix() {
        let mut missing = good();
        missing.retain(|c| c.name != "lease_ms");
        assert_eq!(
            check("t", &missing).unwrap_err().to_string(),
            "table t has no column lease_ms INT64: add it (ALTER TABLE t ADD COLUMN lease_ms INT64), or let \
             --create-table or the operator (ensure-schema) upgrade the table"
        );
        let mut wrong = good();
        wrong[3].spanner_type = "STRING(MAX)".into();
        assert_eq!(
            check("t", &wrong).unwrap_err(),
            SchemaError::WrongType {
                table: "t".into(),
                column: "term",
                found: "STRING(MAX)".into(),
                want: "INT64"
            }
        );
        let mut no_option = good();
        no_option[5].commit_ts = None;
        assert_eq!(
            check("t", &no_option).unwrap_err().to_string(),
            "column t.renewed_at cannot hold commit timestamps: run ALTER TABLE t ALTER COLUMN renewed_at SET \
             OPTIONS (allow_commit_timestamp = true)"
        );
    }
}
