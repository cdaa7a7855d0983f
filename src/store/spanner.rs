//! The Cloud Spanner store (in progress).

/// Where the lease table lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpannerConfig {
    /// `projects/<p>/instances/<i>/databases/<d>`.
    pub database: String,
    /// Table name, validated as an identifier.
    pub table: String,
}
