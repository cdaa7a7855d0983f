//! `leasehold advise` against private servers: it measures, then suggests a
//! timing the sidecar accepts.

use std::process::Command;

use leasehold::lease::Timing;
use leasehold::testing::servers::{PostgresServer, RedisServer};

fn advise(store: &str, url: &str, extra: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(["advise", "--store", store, "--store-url", url, "--for", "1s"])
        .args(extra)
        .output()
        .expect("leasehold runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{store}: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The suggested flags, parsed as the sidecar parses them.
fn suggested(stdout: &str) -> Timing {
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("suggested: "))
        .unwrap_or_else(|| panic!("no suggestion in:\n{stdout}"));
    let words: Vec<&str> = line.split_whitespace().collect();
    let flag = |name: &str| words[words.iter().position(|w| *w == name).unwrap() + 1];
    Timing::parse(
        flag("--lease-duration"),
        flag("--renew-deadline"),
        flag("--retry-period"),
        0.1,
    )
    .unwrap()
}

#[test]
fn advise_measures_postgres_and_redis_and_suggests_a_valid_timing() {
    let postgres = PostgresServer::start();
    let redis = RedisServer::start();
    for (store, stdout) in [
        ("postgres", advise("postgres", &postgres.url(), &["--create-table"])),
        ("redis", advise("redis", &redis.url(), &[])),
    ] {
        assert!(stdout.contains(&format!("on the {store} store")), "{stdout}");
        assert!(stdout.contains("renew    p50"), "{stdout}");
        let timing = suggested(&stdout);
        assert!(timing.retry_period >= std::time::Duration::from_millis(250), "{stdout}");
        assert!(stdout.contains("safety gap"), "the reasoning is printed: {stdout}");
    }
}

#[test]
fn advise_without_a_url_names_the_flag() {
    let out = Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(["advise", "--store", "postgres"])
        .env_remove("LEASEHOLD_STORE_URL")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--store postgres needs --store-url or --store-url-file"),
        "{stderr}"
    );
}
