//! The runtime: the one list of backends, the flags that choose one, the
//! validated `DistributedLease` spec turned into a store, and the one place
//! that connects to it. Every role (sidecar, `run`, `advise`, `demo`, the
//! operator) goes through here, so adding a store means adding a variant to
//! [`StoreKind`] and [`StoreConfig`] and letting the compiler point at each
//! `match` to complete. It sits above `api` and every store and below the
//! roles: `api` validates a spec without knowing the backends.

#![warn(unreachable_pub)]

pub mod shutdown;

use std::path::Path;
use std::sync::Arc;

use leasehold_core::lease::{LeaseStore, SessionStore, StoreError, StoreIdentity};
use leasehold_core::store::memory::MemoryStore;
use leasehold_kubernetes::api::ValidStore;
use leasehold_kubernetes::store::{KubernetesConfig, KubernetesStore};
use leasehold_stores::postgres::{PostgresConfig, PostgresStore};
use leasehold_stores::redis::{DEFAULT_PREFIX, RedisConfig, RedisStore};
use leasehold_stores::spanner::{SpannerConfig, SpannerStore};
use leasehold_stores::{DEFAULT_TABLE, StoreUrl};

/// The backends, as `--store` names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreKind {
    Memory,
    Spanner,
    Postgres,
    Redis,
    Kubernetes,
}

impl StoreKind {
    pub const ALL: [StoreKind; 5] = [
        StoreKind::Memory,
        StoreKind::Spanner,
        StoreKind::Postgres,
        StoreKind::Redis,
        StoreKind::Kubernetes,
    ];

    /// The name `--store` takes.
    pub fn flag(self) -> &'static str {
        match self {
            StoreKind::Memory => "memory",
            StoreKind::Spanner => "spanner",
            StoreKind::Postgres => "postgres",
            StoreKind::Redis => "redis",
            StoreKind::Kubernetes => "kubernetes",
        }
    }

    /// What the store is, and the flag that says where, for `--help`.
    pub fn about(self) -> &'static str {
        match self {
            StoreKind::Memory => "In-process memory store (one process only)",
            StoreKind::Spanner => "Cloud Spanner (`--database`)",
            StoreKind::Postgres => "PostgreSQL or CockroachDB (`--store-url`)",
            StoreKind::Redis => "Redis (`--store-url`)",
            StoreKind::Kubernetes => "`coordination.k8s.io/v1` Leases in a namespace of the cluster",
        }
    }

    /// The store `--store` names by `flag`.
    pub fn from_flag(flag: &str) -> Option<StoreKind> {
        StoreKind::ALL.into_iter().find(|kind| kind.flag() == flag)
    }

    /// Whether the store keeps sessions, through which partitions are held.
    pub fn keeps_sessions(self) -> bool {
        matches!(
            self,
            StoreKind::Memory | StoreKind::Spanner | StoreKind::Postgres | StoreKind::Redis
        )
    }
}

/// A store chosen and configured, credentials resolved: what `connect` opens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreConfig {
    Memory,
    Spanner(SpannerConfig),
    Postgres(PostgresConfig),
    Redis(RedisConfig),
    Kubernetes(KubernetesConfig),
}

/// A contradiction or gap in the store flags, named by its flags.
#[derive(Debug, thiserror::Error)]
pub enum SelectError {
    #[error("--store memory|spanner|postgres|redis|kubernetes (or --lease) is required")]
    Missing,
    #[error("{flag} contradicts --store {store}{why}")]
    Contradicts {
        flag: &'static str,
        store: &'static str,
        why: &'static str,
    },
    #[error("--store {0} needs --store-url or --store-url-file")]
    NeedsUrl(&'static str),
    /// The URL may come from the environment the user exported for another
    /// command (README, "Try it on one machine"), so the message names it.
    #[error(
        "--store-url (or --store-url-file) needs --store postgres or --store redis; a URL set as \
         LEASEHOLD_STORE_URL or LEASEHOLD_STORE_URL_FILE in the environment counts: unset it for this store"
    )]
    UrlWithoutUrlStore,
    #[error("--store spanner needs --database")]
    NeedsDatabase,
    #[error("cannot read --store-url-file {path}")]
    UrlFile {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("--store-url-file {0} is empty")]
    EmptyUrlFile(std::path::PathBuf),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The store URL from --store-url or --store-url-file (read now, trimmed);
/// clap lets only one of them through.
pub fn store_url(url: Option<&str>, file: Option<&Path>) -> Result<Option<StoreUrl>, SelectError> {
    match (url, file) {
        (Some(url), _) => Ok(Some(StoreUrl::new(url))),
        (None, Some(path)) => {
            let text = std::fs::read_to_string(path).map_err(|source| SelectError::UrlFile {
                path: path.to_path_buf(),
                source,
            })?;
            match text.trim() {
                "" => Err(SelectError::EmptyUrlFile(path.to_path_buf())),
                url => Ok(Some(StoreUrl::new(url))),
            }
        }
        (None, None) => Ok(None),
    }
}

/// The flags that choose a store and say where it is.
#[derive(Debug, Clone, Default)]
pub struct StoreFlags<'a> {
    pub kind: Option<StoreKind>,
    pub database: Option<&'a str>,
    pub table: Option<&'a str>,
    pub url: Option<StoreUrl>,
    /// Kubernetes: the namespace of the Leases (the pod's); `None`: the
    /// client's default namespace.
    pub namespace: Option<&'a str>,
}

impl StoreFlags<'_> {
    /// The store the flags name; every contradiction named by its flags.
    /// `--database` alone means Spanner.
    pub fn choose(self) -> Result<StoreConfig, SelectError> {
        let kind = match (self.kind, self.database) {
            (Some(kind), _) => kind,
            (None, Some(_)) => StoreKind::Spanner,
            (None, None) if self.url.is_some() => return Err(SelectError::UrlWithoutUrlStore),
            (None, None) => return Err(SelectError::Missing),
        };
        let contradicts = |flag, why| SelectError::Contradicts {
            flag,
            store: kind.flag(),
            why,
        };
        let takes_url = matches!(kind, StoreKind::Postgres | StoreKind::Redis);
        if !takes_url && self.url.is_some() {
            return Err(SelectError::UrlWithoutUrlStore);
        }
        if self.database.is_some() && kind != StoreKind::Spanner {
            return Err(contradicts("--database", ""));
        }
        let table = || self.table.unwrap_or(DEFAULT_TABLE).to_string();
        let config = match kind {
            StoreKind::Memory => StoreConfig::Memory,
            StoreKind::Spanner => {
                let database = self.database.ok_or(SelectError::NeedsDatabase)?;
                let config = SpannerConfig {
                    database: database.to_string(),
                    table: table(),
                };
                leasehold_stores::spanner::validate_database(&config.database)?;
                leasehold_stores::spanner::validate_table(&config.table)?;
                StoreConfig::Spanner(config)
            }
            StoreKind::Postgres => {
                let url = self.url.clone().ok_or(SelectError::NeedsUrl(kind.flag()))?;
                let config = PostgresConfig { url, table: table() };
                leasehold_stores::postgres::validate_table(&config.table)?;
                leasehold_stores::postgres::parse_url(&config.url)?;
                StoreConfig::Postgres(config)
            }
            StoreKind::Redis => {
                let url = self.url.clone().ok_or(SelectError::NeedsUrl(kind.flag()))?;
                if self.table.is_some() {
                    return Err(contradicts("--table", " (keys, not tables)"));
                }
                StoreConfig::redis(url)?
            }
            StoreKind::Kubernetes => {
                if self.table.is_some() {
                    return Err(contradicts("--table", " (one Lease per lock, not tables)"));
                }
                StoreConfig::Kubernetes(KubernetesConfig::new(self.namespace.map(str::to_string)))
            }
        };
        Ok(config)
    }
}

impl StoreConfig {
    /// The store a validated lease names: Leases in `namespace` (the
    /// resource's), and for PostgreSQL and Redis the URL that `url` reads
    /// from the Secret.
    pub fn of_lease<E: From<StoreError>>(
        store: &ValidStore,
        namespace: &str,
        url: impl FnOnce() -> Result<StoreUrl, E>,
    ) -> Result<StoreConfig, E> {
        Ok(match store {
            ValidStore::Spanner(config) => StoreConfig::Spanner(config.clone()),
            ValidStore::Postgres { table, .. } => StoreConfig::postgres(url()?, table.clone())?,
            ValidStore::Redis { .. } => StoreConfig::redis(url()?)?,
            ValidStore::Kubernetes => StoreConfig::Kubernetes(KubernetesConfig::new(Some(namespace.to_string()))),
        })
    }

    /// Redis at `url` with the key prefix every role uses (the resource has
    /// no field for it).
    pub fn redis(url: StoreUrl) -> Result<StoreConfig, StoreError> {
        let config = RedisConfig {
            url,
            prefix: DEFAULT_PREFIX.into(),
        };
        leasehold_stores::redis::parse_url(&config.url)?;
        Ok(StoreConfig::Redis(config))
    }

    /// PostgreSQL at `url`, `table` checked.
    pub fn postgres(url: StoreUrl, table: String) -> Result<StoreConfig, StoreError> {
        let config = PostgresConfig { url, table };
        leasehold_stores::postgres::parse_url(&config.url)?;
        Ok(StoreConfig::Postgres(config))
    }

    pub fn kind(&self) -> StoreKind {
        match self {
            StoreConfig::Memory => StoreKind::Memory,
            StoreConfig::Spanner(_) => StoreKind::Spanner,
            StoreConfig::Postgres(_) => StoreKind::Postgres,
            StoreConfig::Redis(_) => StoreKind::Redis,
            StoreConfig::Kubernetes(_) => StoreKind::Kubernetes,
        }
    }

    /// One key per store and table (or key space, or namespace): connections
    /// and created tables are remembered by it. Holds the URL; never logged.
    pub fn key(&self) -> String {
        match self {
            StoreConfig::Memory => "memory".into(),
            StoreConfig::Spanner(c) => format!("spanner\n{}\n{}", c.database, c.table),
            StoreConfig::Postgres(c) => format!("postgres\n{}\n{}", c.url.expose(), c.table),
            StoreConfig::Redis(c) => format!("redis\n{}\n{}", c.url.expose(), c.prefix),
            StoreConfig::Kubernetes(c) => format!("kubernetes\n{}", c.namespace.as_deref().unwrap_or_default()),
        }
    }

    /// Opens the store; with `create_table` a Spanner store creates its
    /// table whenever it finds it missing (at start and after it vanished).
    pub async fn connect(&self, create_table: bool) -> Result<Arc<dyn LeaseStore>, StoreError> {
        Ok(match self {
            StoreConfig::Memory => Arc::new(MemoryStore::default()),
            StoreConfig::Spanner(config) => Arc::new(
                SpannerStore::connect(config.clone())
                    .await?
                    .with_create_table(create_table),
            ),
            StoreConfig::Postgres(config) => Arc::new(PostgresStore::connect(config.clone())?),
            StoreConfig::Redis(config) => Arc::new(RedisStore::connect(config.clone())?),
            StoreConfig::Kubernetes(config) => Arc::new(KubernetesStore::connect(config.clone()).await?),
        })
    }

    /// Whether a URL (a Secret's, which users may edit) says where the
    /// store is, rather than the immutable spec: then only the store's
    /// identity tells which one the URL reaches.
    pub fn reached_by_url(&self) -> bool {
        matches!(self, StoreConfig::Postgres(_) | StoreConfig::Redis(_))
    }

    /// The identity of the store this configuration reaches
    /// ([`StoreIdentity`]), read from the store itself where an address
    /// could reach another one (PostgreSQL, Redis: on a connection of its
    /// own, closed after the read); where the configuration names the
    /// store (Spanner's database, the Kubernetes namespace), that name.
    pub async fn identity(&self) -> Result<StoreIdentity, StoreError> {
        Ok(match self {
            StoreConfig::Memory => StoreIdentity::new("memory"),
            StoreConfig::Spanner(config) => StoreIdentity::new(format!("spanner:{}", config.database)),
            StoreConfig::Postgres(config) => PostgresStore::connect(config.clone())?.identity().await?,
            StoreConfig::Redis(config) => RedisStore::connect(config.clone())?.identity().await?,
            StoreConfig::Kubernetes(config) => StoreIdentity::new(format!(
                "kubernetes:{}",
                config.namespace.as_deref().unwrap_or("(the client's namespace)")
            )),
        })
    }

    /// Opens the store as lease rows and, where it keeps them, sessions, on
    /// one connection.
    pub async fn connect_both(&self) -> Result<(Arc<dyn LeaseStore>, Option<Arc<dyn SessionStore>>), StoreError> {
        Ok(match self {
            StoreConfig::Memory => {
                let store = Arc::new(MemoryStore::default());
                (store.clone(), Some(store))
            }
            StoreConfig::Spanner(config) => {
                let store = Arc::new(SpannerStore::connect(config.clone()).await?);
                (store.clone(), Some(store))
            }
            StoreConfig::Postgres(config) => {
                let store = Arc::new(PostgresStore::connect(config.clone())?);
                (store.clone(), Some(store))
            }
            StoreConfig::Redis(config) => {
                let store = Arc::new(RedisStore::connect(config.clone())?);
                (store.clone(), Some(store))
            }
            StoreConfig::Kubernetes(_) => (self.connect(false).await?, None),
        })
    }

    /// Opens the store for sessions: only the stores that keep them.
    pub async fn connect_sessions(&self) -> Result<Arc<dyn SessionStore>, StoreError> {
        if !self.kind().keeps_sessions() {
            return Err(no_sessions(self.kind()));
        }
        let (_, sessions) = self.connect_both().await?;
        sessions.ok_or_else(|| no_sessions(self.kind()))
    }
}

/// The `Invalid` answer for sessions on a store that keeps none.
pub fn no_sessions(kind: StoreKind) -> StoreError {
    StoreError::invalid(format!(
        "the {} store keeps no sessions: partitions need memory, spanner, postgres or redis",
        kind.flag()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `store: {kubernetes: {}}` names Leases in the resource's namespace.
    #[test]
    fn a_kubernetes_lease_names_leases_in_its_namespace() {
        let resolved = StoreConfig::of_lease(&ValidStore::Kubernetes, "prod", || -> Result<StoreUrl, StoreError> {
            unreachable!("no URL for Leases")
        });
        assert_eq!(
            resolved.unwrap(),
            StoreConfig::Kubernetes(KubernetesConfig::new(Some("prod".into())))
        );
    }

    fn flags(kind: Option<StoreKind>) -> StoreFlags<'static> {
        StoreFlags {
            kind,
            ..Default::default()
        }
    }

    /// One table of what the flags may combine into, so that a new store
    /// gets its row here.
    #[test]
    fn every_kind_is_chosen_by_its_flags_alone() {
        let url = Some(StoreUrl::new("redis://h"));
        let cases = [
            (flags(Some(StoreKind::Memory)), StoreKind::Memory),
            (
                StoreFlags {
                    database: Some("projects/p/instances/i/databases/d"),
                    ..flags(None)
                },
                StoreKind::Spanner,
            ),
            (
                StoreFlags {
                    url: Some(StoreUrl::new("postgres://db/x")),
                    ..flags(Some(StoreKind::Postgres))
                },
                StoreKind::Postgres,
            ),
            (
                StoreFlags {
                    url,
                    ..flags(Some(StoreKind::Redis))
                },
                StoreKind::Redis,
            ),
            (flags(Some(StoreKind::Kubernetes)), StoreKind::Kubernetes),
        ];
        for (given, kind) in cases {
            assert_eq!(given.choose().unwrap().kind(), kind);
        }
        let err = StoreFlags {
            table: Some("t"),
            ..flags(Some(StoreKind::Kubernetes))
        }
        .choose()
        .unwrap_err()
        .to_string();
        assert_eq!(
            err,
            "--table contradicts --store kubernetes (one Lease per lock, not tables)"
        );
    }

    #[test]
    fn the_kubernetes_store_takes_the_namespace_given() {
        let chosen = StoreFlags {
            namespace: Some("team-a"),
            ..flags(Some(StoreKind::Kubernetes))
        }
        .choose()
        .unwrap();
        assert_eq!(
            chosen,
            StoreConfig::Kubernetes(KubernetesConfig::new(Some("team-a".into())))
        );
    }
}
