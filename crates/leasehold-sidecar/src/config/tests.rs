//! The flags as clap reads them and the settings they resolve to.

use std::time::Duration;

use super::*;
use clap::Parser;
use leasehold_core::lease::{Timing, Version, VersionPolicy};
use leasehold_runtime::StoreConfig;
use leasehold_stores::DEFAULT_TABLE;
use leasehold_stores::StoreUrl;
use leasehold_stores::postgres::PostgresConfig;
use leasehold_stores::redis::RedisConfig;
use leasehold_stores::spanner::SpannerConfig;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: Args,
}

async fn settings(argv: &[&str]) -> Result<Settings> {
    let cli = Cli::parse_from(std::iter::once("sidecar").chain(argv.iter().copied()));
    resolve(&cli.args.election, None).await
}

/// Issue 16: standalone, the version flags become the candidate's version
/// and policy; a name without a revision cannot be ordered and is refused
/// naming the flags; a bad preference names the accepted values.
#[tokio::test]
async fn version_flags_are_read_and_a_name_without_a_revision_is_refused() {
    let base = ["--lock", "l", "--store", "memory", "--kubernetes", "false"];
    let with = |extra: &[&'static str]| base.iter().chain(extra).copied().collect::<Vec<_>>();
    let plain = settings(&base).await.unwrap();
    assert_eq!((plain.version, plain.versions), (None, VersionPolicy::default()));
    let versioned = settings(&with(&[
        "--revision",
        "7",
        "--version-name",
        "v7",
        "--prefer",
        "newest",
        "--version-fence",
    ]))
    .await
    .unwrap();
    assert_eq!(
        versioned.version,
        Some(Version {
            revision: 7,
            name: "v7".into()
        })
    );
    assert_eq!(versioned.versions.prefer, leasehold_core::lease::Prefer::Newest);
    assert!(versioned.versions.fence);
    let err = settings(&with(&["--version-name", "v7"]))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("--version-name \"v7\" needs --revision (LEASEHOLD_REVISION)"),
        "{err}"
    );
    let refused = Cli::try_parse_from(["sidecar", "--prefer", "latest"])
        .err()
        .unwrap()
        .to_string();
    assert!(
        refused.contains("is not a leadership preference: use None, Newest or Oldest"),
        "{refused}"
    );
}

#[tokio::test]
async fn standalone_settings_need_a_lock_and_a_store_and_agree_with_each_other() {
    let cases: &[(&[&str], &str)] = &[
        (&["--store", "memory"], "--lock (or --lease) is required"),
        (
            &["--lock", "l"],
            "--store memory|spanner|postgres|redis|kubernetes (or --lease) is required",
        ),
        (
            &["--lock", "l", "--store", "postgres"],
            "--store postgres needs --store-url or --store-url-file",
        ),
        (
            &[
                "--lock",
                "l",
                "--store",
                "redis",
                "--store-url",
                "redis://h",
                "--table",
                "t",
            ],
            "--table contradicts --store redis",
        ),
        (
            &["--lock", "l", "--store", "memory", "--store-url", "redis://h"],
            "--store-url (or --store-url-file) needs --store postgres or --store redis",
        ),
        (
            &[
                "--lock",
                "l",
                "--store",
                "postgres",
                "--store-url-file",
                "/nonexistent/url",
            ],
            "--store-url-file /nonexistent/url: No such file",
        ),
        (
            &[
                "--lock",
                "l",
                "--store",
                "postgres",
                "--store-url",
                "postgres://u:hunter2@db/x?sslmode=verify-everything",
            ],
            "sslmode=verify-everything is not one of",
        ),
        (
            &[
                "--lock",
                "l",
                "--store",
                "postgres",
                "--store-url",
                "postgres://db/x",
                "--table",
                "bad-name",
            ],
            "is not a valid PostgreSQL identifier",
        ),
        (&["--lock", "", "--store", "memory"], "--lock must not be empty"),
        (
            &["--lock", "l", "--store", "memory", "--lease-duration", "1000000000y"],
            "leaseDuration (31557600000000000s) must be between 10ms and 3600s",
        ),
        (
            &["--lock", "l", "--store", "spanner"],
            "--store spanner needs --database",
        ),
        (
            &[
                "--lock",
                "l",
                "--store",
                "memory",
                "--database",
                "projects/p/instances/i/databases/d",
            ],
            "--database contradicts --store memory",
        ),
        (
            &[
                "--lock",
                "l",
                "--store",
                "memory",
                "--lease-duration",
                "2s",
                "--renew-deadline",
                "3s",
            ],
            "invalid timing (--lease-duration/--renew-deadline/--retry-period): \
             renewDeadline (3s) must be shorter than leaseDuration (2s)",
        ),
        (
            &["--lock", "l", "--database", "nonsense"],
            "database: must look like projects/<project>",
        ),
        (
            &[
                "--lock",
                "l",
                "--database",
                "projects/p/instances/i/databases/d",
                "--table",
                "bad-name",
            ],
            "table: must be a letter followed by",
        ),
        (
            &["--lease", "web"],
            "--lease web needs the Kubernetes API and POD_NAMESPACE",
        ),
        (
            &["--lock", "l", "--store", "kubernetes", "--partitions", "4"],
            "--partitions needs --store memory, spanner, postgres or redis: the kubernetes store keeps no sessions",
        ),
        (
            &["--lock", "l", "--store", "memory", "--partitions", "0"],
            "--partitions must be between 1 and 1024, not 0",
        ),
    ];
    for (argv, expected) in cases {
        // As the binary prints it: the error and its causes.
        let err = format!("{:#}", anyhow::Error::from(settings(argv).await.unwrap_err()));
        assert!(err.contains(expected), "{argv:?}: got {err:?}, want {expected:?}");
    }
}

/// Issue 28: PostgreSQL and Redis keep sessions, so a partitioned lock
/// runs on them as on Spanner.
#[tokio::test]
async fn partitions_are_accepted_on_postgres_and_redis() {
    for (store, url) in [("postgres", "postgres://h/db"), ("redis", "redis://h")] {
        let argv = ["--lock", "l", "--store", store, "--store-url", url, "--partitions", "4"];
        let settings = settings(&argv).await.unwrap();
        assert_eq!((settings.store.kind().flag(), settings.partitions), (store, Some(4)));
    }
}

/// What clap says about `argv`, which it must reject.
fn rejected(argv: &[&str]) -> String {
    match Cli::try_parse_from(std::iter::once("sidecar").chain(argv.iter().copied())) {
        Ok(_) => panic!("{argv:?} parsed"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn clap_rejects_a_bad_duration_naming_its_flag() {
    for flag in ["--lease-duration", "--renew-deadline", "--retry-period", "--drain"] {
        let err = rejected(&["--lock", "l", "--store", "memory", flag, "ten"]);
        assert!(err.contains(&format!("invalid value 'ten' for '{flag} <")), "{err}");
    }
}

#[test]
fn clap_rejects_contradicting_flags_naming_both() {
    for (flag, value) in [
        ("--lock", "l"),
        ("--store", "memory"),
        ("--database", "projects/p/instances/i/databases/d"),
        ("--table", "t"),
        ("--store-url", "redis://h"),
        ("--lease-duration", "5s"),
        ("--renew-deadline", "3s"),
        ("--retry-period", "1s"),
        ("--partitions", "4"),
    ] {
        let err = rejected(&["--lease", "web", flag, value]);
        assert!(
            err.contains("the argument '--lease <LEASE>' cannot be used with") && err.contains(&format!("'{flag} <")),
            "{flag}: {err}"
        );
    }
    let err = rejected(&["--store-url", "redis://h", "--store-url-file", "/f"]);
    assert!(
        err.contains("'--store-url <STORE_URL>' cannot be used with '--store-url-file <STORE_URL_FILE>'"),
        "{err}"
    );
}

/// The defaults the help states are the code's.
#[test]
fn the_timing_help_states_the_defaults() {
    use clap::CommandFactory;
    use leasehold_core::lease::timing::{DEFAULT_LEASE_DURATION, DEFAULT_RENEW_DEADLINE, DEFAULT_RETRY_PERIOD};
    let command = Cli::command();
    for (flag, default) in [
        ("lease_duration", DEFAULT_LEASE_DURATION),
        ("renew_deadline", DEFAULT_RENEW_DEADLINE),
        ("retry_period", DEFAULT_RETRY_PERIOD),
    ] {
        let arg = command.get_arguments().find(|a| a.get_id() == flag).unwrap();
        let help = arg.get_help().unwrap().to_string();
        let default = humantime::format_duration(default).to_string();
        assert!(help.ends_with(&format!("{default}]")), "--{flag}: {help:?}");
    }
}

#[tokio::test]
async fn a_lease_duration_alone_brings_r_and_p_in_the_default_ratio() {
    let s = settings(&["--lock", "l", "--store", "memory", "--lease-duration", "5s"])
        .await
        .unwrap();
    assert_eq!(
        (s.timing.lease_duration, s.timing.renew_deadline, s.timing.retry_period),
        (
            Duration::from_secs(5),
            Duration::from_millis(3333),
            Duration::from_millis(666)
        )
    );
    let s = settings(&["--lock", "l", "--store", "memory", "--renew-deadline", "5s"])
        .await
        .unwrap();
    assert_eq!(
        (s.timing.lease_duration, s.timing.retry_period),
        (Duration::from_secs(15), Duration::from_secs(1))
    );
    let s = settings(&["--lock", "l", "--store", "memory"]).await.unwrap();
    assert_eq!(s.timing, Timing::default());
}

#[tokio::test]
async fn partitions_come_from_the_flag_and_default_to_one_leader() {
    let plain = settings(&["--lock", "l", "--store", "memory"]).await.unwrap();
    assert_eq!(plain.partitions, None);
    let parts = settings(&["--lock", "l", "--store", "memory", "--partitions", "8"])
        .await
        .unwrap();
    assert_eq!(parts.partitions, Some(8));
}

#[tokio::test]
async fn standalone_spanner_settings() {
    let s = settings(&[
        "--lock",
        "l",
        "--database",
        "projects/p/instances/i/databases/d",
        "--retry-period",
        "1s",
    ])
    .await
    .unwrap();
    assert_eq!(s.lock, "l");
    assert_eq!(s.timing.retry_period, Duration::from_secs(1));
    assert_eq!(
        s.store,
        StoreConfig::Spanner(SpannerConfig {
            database: "projects/p/instances/i/databases/d".into(),
            table: DEFAULT_TABLE.into()
        })
    );
}

const LEASES: &str = "/apis/leasehold.dev/v1alpha1/namespaces/prod/distributedleases";

fn api_server() -> leasehold_testkit::api::ApiServer {
    leasehold_testkit::api::ApiServer::new(Some(crate::rbac::allows_request))
}

#[tokio::test]
async fn standalone_postgres_and_redis_settings_read_the_url_from_a_flag_or_a_file() {
    let dir = std::env::temp_dir().join(format!("leasehold-url-{:08x}", rand::random::<u32>()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("url");
    std::fs::write(&file, "postgres://app:hunter2@db:5432/leases\n").unwrap();
    let s = settings(&[
        "--lock",
        "l",
        "--store",
        "postgres",
        "--store-url-file",
        file.to_str().unwrap(),
    ])
    .await
    .unwrap();
    assert_eq!(
        s.store,
        StoreConfig::Postgres(PostgresConfig {
            url: StoreUrl::new("postgres://app:hunter2@db:5432/leases"),
            table: DEFAULT_TABLE.into()
        })
    );
    assert!(
        !format!("{:?}", s.store).contains("hunter2"),
        "settings are logged with Debug"
    );
    let s = settings(&["--lock", "l", "--store", "redis", "--store-url", "redis://cache:6379/0"])
        .await
        .unwrap();
    assert_eq!(
        s.store,
        StoreConfig::Redis(RedisConfig {
            url: StoreUrl::new("redis://cache:6379/0"),
            prefix: leasehold_stores::redis::DEFAULT_PREFIX.into()
        })
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The settings of `leasehold sidecar --lease web` in namespace prod,
/// resolved from a DistributedLease `web` with `spec`; and the API model.
async fn resolved_from_lease(spec: serde_json::Value) -> (Settings, leasehold_testkit::api::ApiServer) {
    let api = api_server();
    api.insert(
        LEASES,
        serde_json::json!({
            "apiVersion": "leasehold.dev/v1alpha1", "kind": "DistributedLease",
            "metadata": {"name": "web", "namespace": "prod"},
            "spec": spec,
        }),
    );
    let cli = Cli::parse_from([
        "sidecar",
        "--lease",
        "web",
        "--pod-name",
        "web-0",
        "--pod-namespace",
        "prod",
        "--kubernetes",
        "true",
    ]);
    let s = resolve(&cli.args.election, Some(api.client("prod"))).await.unwrap();
    (s, api)
}

#[tokio::test]
async fn with_lease_the_partitions_come_from_the_resource() {
    let (s, _) = resolved_from_lease(serde_json::json!({
        "store": {"spanner": {"database": "projects/p/instances/i/databases/d"}},
        "selector": {"matchLabels": {"app": "web"}},
        "partitions": 16,
    }))
    .await;
    assert_eq!(s.partitions, Some(16));
}

#[tokio::test]
async fn with_lease_every_setting_comes_from_the_resource() {
    let (s, api) = resolved_from_lease(serde_json::json!({
        "store": {"spanner": {"database": "projects/p/instances/i/databases/d"}},
        "leaseDuration": "6s", "renewDeadline": "4s", "retryPeriod": "1s",
        "selector": {"matchLabels": {"app": "web"}},
        "publishing": {"readinessGate": true},
    }))
    .await;
    let requests: Vec<(String, String)> = api.requests().into_iter().map(|r| (r.method, r.uri)).collect();
    assert_eq!(requests, [("GET".to_string(), format!("{LEASES}/web"))]);
    assert!(api.forbidden().is_empty(), "{:?}", api.forbidden());
    assert_eq!(s.lock, "prod/web", "the lock defaults to namespace/name");
    assert_eq!(s.timing.lease_duration, Duration::from_secs(6));
    assert_eq!(s.partitions, None, "absent: one leader");
    assert_eq!(
        s.publishing,
        Publishing {
            label_key: "leasehold.dev/leader".into(),
            selector: "app=web".into(),
            candidate_labels: Default::default(),
        }
    );
    assert_eq!(s.pod.unwrap().name, "web-0");
    assert!(s.identity.to_string().starts_with("prod/web-0#"));
}

/// A PostgreSQL lease: the URL comes from the file the webhook mounts
/// from the named Secret; without it, the error says what to mount.
#[tokio::test]
async fn a_postgres_lease_takes_its_url_from_the_mounted_secret_file() {
    let file = std::env::temp_dir().join(format!("leasehold-url-{:08x}", rand::random::<u32>()));
    std::fs::write(&file, "postgres://app:pw@db/leases").unwrap();
    for with_file in [true, false] {
        let (client, mut server) = leasehold_testkit::api::mock_client("prod");
        tokio::spawn(async move {
            let request = server.expect("GET the lease").await;
            let lease = serde_json::json!({
                "apiVersion": "leasehold.dev/v1alpha1", "kind": "DistributedLease",
                "metadata": {"name": "web", "namespace": "prod"},
                "spec": {
                    "store": {"postgres": {"urlSecretRef": {"name": "leases-db"}, "table": "web_leases"}},
                    "selector": {"matchLabels": {"app": "web"}},
                }
            });
            request.respond(200, &lease);
        });
        let mut argv = vec![
            "sidecar",
            "--lease",
            "web",
            "--pod-name",
            "web-0",
            "--pod-namespace",
            "prod",
        ];
        if with_file {
            argv.extend(["--store-url-file", file.to_str().unwrap()]);
        }
        let cli = Cli::parse_from(argv);
        let resolved = resolve(&cli.args.election, Some(client)).await;
        if with_file {
            assert_eq!(
                resolved.unwrap().store,
                StoreConfig::Postgres(PostgresConfig {
                    url: StoreUrl::new("postgres://app:pw@db/leases"),
                    table: "web_leases".into()
                })
            );
        } else {
            let err = resolved.unwrap_err().to_string();
            assert!(
                err.contains("Secret leases-db key url") && err.contains("--store-url-file"),
                "{err}"
            );
        }
    }
    std::fs::remove_file(&file).unwrap();
}

#[tokio::test]
async fn standalone_candidates_are_the_pods_labelled_with_the_lock() {
    let s = settings(&["--lock", "scheduler", "--store", "memory"]).await.unwrap();
    assert_eq!(s.publishing.selector, "leasehold.dev/lock=scheduler");
    assert_eq!(
        s.publishing.candidate_labels,
        [("leasehold.dev/lock".to_string(), "scheduler".to_string())].into()
    );
}

#[tokio::test(start_paused = true)]
async fn a_timing_change_of_the_lease_reaches_the_elector() {
    let api = api_server();
    let lease = |lease_duration: &str, renew_deadline: &str| {
        serde_json::json!({
            "apiVersion": "leasehold.dev/v1alpha1", "kind": "DistributedLease",
            "metadata": {"name": "web", "namespace": "prod", "uid": "u-1"},
            "spec": {
                "lockName": "prod/web",
                "store": {"spanner": {"database": "projects/p/instances/i/databases/d"}},
                "leaseDuration": lease_duration, "renewDeadline": renew_deadline, "retryPeriod": "2s",
                "selector": {"matchLabels": {"app": "web"}},
            }
        })
    };
    api.insert(LEASES, lease("15s", "10s"));
    let started = settings(&["--lock", "prod/web", "--database", "projects/p/instances/i/databases/d"])
        .await
        .unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let (identity_tx, mut recorded) = tokio::sync::watch::channel(None);
    let _watching = tokio::spawn(watch_lease(
        api.client("prod"),
        "prod",
        binding("u-1"),
        started,
        move |t| tx.send(t).unwrap(),
        identity_tx,
    ));
    api.wait_for_requests(2).await;
    assert_eq!(*recorded.borrow_and_update(), None, "nothing recorded yet");
    let mut changed = lease("30s", "20s");
    changed["status"] = serde_json::json!({"storeIdentity": "spanner:projects/p/instances/i/databases/d"});
    api.insert(LEASES, changed);
    let changed = async {
        while let Some(timing) = rx.recv().await {
            if timing.renew_deadline == Duration::from_secs(20) {
                return timing;
            }
        }
        panic!("the watch ended")
    };
    let timing = tokio::time::timeout(Duration::from_secs(5), changed)
        .await
        .expect("the new timing");
    assert_eq!(timing.lease_duration, Duration::from_secs(30));
    // The store the operator recorded reaches the sidecar's store check.
    tokio::time::timeout(Duration::from_secs(5), recorded.changed())
        .await
        .expect("the recorded store")
        .unwrap();
    assert_eq!(
        recorded.borrow().as_deref(),
        Some("spanner:projects/p/instances/i/databases/d")
    );
    let watch = api
        .requests()
        .into_iter()
        .find(|r| r.uri.contains("watch=true"))
        .expect("a watch");
    assert_eq!(watch.path(), LEASES);
    assert!(watch.uri.contains("fieldSelector=metadata.name%3Dweb"), "{}", watch.uri);
    assert!(api.forbidden().is_empty(), "{:?}", api.forbidden());
}

/// The Spanner lease "web" the tests below bind to, with `uid`.
fn spanner_lease(uid: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "leasehold.dev/v1alpha1", "kind": "DistributedLease",
        "metadata": {"name": "web", "namespace": "prod", "uid": uid},
        "spec": {
            "lockName": "prod/web",
            "store": {"spanner": {"database": "projects/p/instances/i/databases/d"}},
            "selector": {"matchLabels": {"app": "web"}},
        }
    })
}

/// A sidecar's binding to [`spanner_lease`] `uid`, read at start.
fn binding(uid: &str) -> LeaseBinding {
    LeaseBinding {
        name: "web".into(),
        uid: uid.into(),
        store: leasehold_kubernetes::api::client::object_from_value(&spanner_lease(uid)["spec"]["store"]).unwrap(),
        deleting: false,
        store_identity: None,
    }
}

async fn spanner_settings() -> Settings {
    settings(&["--lock", "prod/web", "--database", "projects/p/instances/i/databases/d"])
        .await
        .unwrap()
}

/// Issue 40: what a sidecar retires from. Timing is no move; another uid,
/// a deletion, another store block (a Secret reference included: the URL
/// behind it was read once), lock or partition count is.
#[tokio::test]
async fn a_recreated_deleting_or_moved_lease_is_one_to_retire_from() {
    let (bound, started) = (binding("u-1"), spanner_settings().await);
    // The resource with `section.field` set to `value`: moved, and why?
    let moved_by = |section: &str, field: &str, value: serde_json::Value| {
        let mut lease = spanner_lease("u-1");
        lease[section][field] = value;
        let lease: leasehold_kubernetes::api::DistributedLease =
            leasehold_kubernetes::api::client::object_from_value(&lease).unwrap();
        watch::moved(
            &bound,
            &started,
            &lease,
            leasehold_kubernetes::api::validate(&lease).ok().as_ref(),
        )
    };
    assert_eq!(moved_by("metadata", "uid", "u-1".into()), None);
    assert_eq!(
        moved_by("spec", "leaseDuration", "30s".into()),
        None,
        "timing applies in place"
    );
    let cases = [
        ("recreated", "metadata", "uid", "u-2".into()),
        (
            "being deleted",
            "metadata",
            "deletionTimestamp",
            "2026-01-01T00:00:00Z".into(),
        ),
        (
            "another store",
            "spec",
            "store",
            serde_json::json!({"postgres": {"urlSecretRef": {"name": "db"}}}),
        ),
        ("the lock changed", "spec", "lockName", "prod/other".into()),
        ("the partitions changed", "spec", "partitions", 4.into()),
    ];
    for (what, section, field, value) in cases {
        let why = moved_by(section, field, value).unwrap_or_else(|| panic!("{what}: not a move"));
        assert!(why.contains(what), "{what}: {why}");
    }
}

/// The watch returns the retirement when the resource is deleted, and when
/// it is gone from a (re)list, for the uid the sidecar started with.
#[tokio::test(start_paused = true)]
async fn the_lease_watch_retires_the_sidecar_when_its_lease_is_deleted() {
    let api = api_server();
    api.insert(LEASES, spanner_lease("u-1"));
    let watch = tokio::spawn(watch_lease(
        api.client("prod"),
        "prod",
        binding("u-1"),
        spanner_settings().await,
        |_| {},
        tokio::sync::watch::channel(None).0,
    ));
    api.wait_for_requests(2).await;
    assert!(!watch.is_finished(), "nothing moved yet");
    api.delete(LEASES, "web");
    let retired = tokio::time::timeout(Duration::from_secs(5), watch)
        .await
        .expect("retired")
        .unwrap();
    assert_eq!(retired.uid, "u-1");
    assert!(retired.why.contains("deleted"), "{}", retired.why);

    // Started on a lease that is gone by the time the watch lists.
    let watch = watch_lease(
        api.client("prod"),
        "prod",
        binding("u-1"),
        spanner_settings().await,
        |_| {},
        tokio::sync::watch::channel(None).0,
    );
    let retired = tokio::time::timeout(Duration::from_secs(5), watch)
        .await
        .expect("retired");
    assert!(retired.why.contains("gone"), "{}", retired.why);
    assert!(api.forbidden().is_empty(), "{:?}", api.forbidden());
}
