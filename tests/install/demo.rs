//! `leasehold demo` as a newcomer runs it, with short timings.

use std::process::Command;

/// Run as a reader of the README would: after "Try it on one machine",
/// which exports the sidecar's LEASEHOLD_STORE_URL (the demo has variables
/// of its own, so the export does not change it).
fn leasehold(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(args)
        .env(
            "LEASEHOLD_STORE_URL",
            "postgres://postgres:secret@127.0.0.1:5432/postgres?sslmode=disable",
        )
        .env("LEASEHOLD_LEASE_DURATION", "1h")
        .output()
        .expect("leasehold runs")
}

#[test]
fn the_demo_shows_a_leader_a_failover_and_a_handover() {
    let out = leasehold(&[
        "demo",
        "--lease-duration",
        "600ms",
        "--renew-deadline",
        "400ms",
        "--retry-period",
        "100ms",
        "--hold",
        "500ms",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "demo failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for expected in [
        "LEADS      term 1",
        "CRASHES",
        "failover took",
        "LEADS      term 2",
        "SHUTS DOWN",
        "handover took",
    ] {
        assert!(stdout.contains(expected), "missing {expected:?} in:\n{stdout}");
    }
    assert!(stdout.contains("tokens strictly increased: yes"), "{stdout}");
}

#[test]
fn bad_timing_is_one_clear_line_naming_the_field() {
    let out = leasehold(&["demo", "--lease-duration", "1s", "--renew-deadline", "2s"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("renewDeadline (2s) must be shorter than leaseDuration (1s)"),
        "{stderr}"
    );

    let out = leasehold(&["demo", "--retry-period", "10x"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("invalid value '10x' for '--retry-period <"), "{stderr}");
}

/// `leasehold demo --store postgres|redis --store-url …` on private servers.
#[test]
fn the_demo_runs_on_postgres_and_redis() {
    let postgres = leasehold::testing::servers::PostgresServer::start();
    let redis = leasehold::testing::servers::RedisServer::start();
    for (store, url) in [("postgres", postgres.url()), ("redis", redis.url())] {
        let out = leasehold(&[
            "demo",
            "--store",
            store,
            "--store-url",
            &url,
            "--lease-duration",
            "600ms",
            "--renew-deadline",
            "400ms",
            "--retry-period",
            "100ms",
            "--hold",
            "300ms",
        ]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{store} demo failed: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(stdout.contains(&format!("on the {store} store")), "{stdout}");
        assert!(stdout.contains("tokens strictly increased: yes"), "{stdout}");
    }
    let out = leasehold(&["demo", "--store", "redis"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--store postgres|redis needs --store-url"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
