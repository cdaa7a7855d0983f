//! `leasehold run` through the run-wrapped example: the wrapped command runs
//! in exactly one pod, with the lease's token, and moves when that pod goes.

use std::time::Duration;

use leasehold::api::DistributedLease;
use serde_json::json;

use crate::e2e::cluster::{Scenario, scenario, wait_for};
use crate::e2e::fixtures::{FIRST_LEADER, SUCCESSOR, delete_now};
use crate::e2e::stores::{URL_SECRET, secret};

/// The wrapped command: it serves, as the example's consumer would work.
const WRAPPED: &str = "exec /bin/busybox httpd -f -p 8080";

/// Finds the live wrapped process in the container (its command line) and
/// prints the token in its environment.
const FIND_WRAPPED: &str = r#"for p in /proc/[0-9]*; do
  case "$(/bin/busybox tr '\0' ' ' < $p/cmdline 2>/dev/null)" in
    "/bin/busybox httpd -f -p 8080 "*)
      /bin/busybox tr '\0' '\n' < $p/environ | /bin/busybox sed -n 's/^LEASEHOLD_TOKEN=//p' ;;
  esac
done"#;

/// Which pods run the wrapped command now (a live process), with the token
/// in its environment.
async fn running(s: &Scenario) -> Vec<(String, String)> {
    let mut found = Vec::new();
    for pod in s.pods("app=consumer").await {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let out = s
            .env
            .kubectl()
            .args([
                "-n",
                &s.ns,
                "exec",
                &name,
                "-c",
                "consumer",
                "--",
                "/bin/busybox",
                "sh",
                "-c",
                FIND_WRAPPED,
            ])
            .output();
        if let Ok(out) = out
            && out.status.success()
        {
            let tokens = String::from_utf8_lossy(&out.stdout).trim().to_string();
            if !tokens.is_empty() {
                found.push((name, tokens));
            }
        }
    }
    found
}

async fn status_token(s: &Scenario) -> Option<String> {
    s.api::<DistributedLease>().get("consumer").await.ok()?.status?.token
}

#[tokio::test]
async fn the_wrapped_command_runs_in_exactly_one_pod_with_its_token_and_moves_on_delete() {
    scenario("e2e-run", |s| async move {
        let server = leasehold::testing::servers::PostgresServer::start_on(s.env.host_ip);
        s.apply(vec![secret(&s, &server.url_at((s.env.host_ip, server.port).into()))])
            .await;
        let mut example = s.example("run-wrapped.yaml");
        for object in &mut example {
            if object["kind"] == "DistributedLease" {
                object["spec"]["store"] = json!({"postgres": {"urlSecretRef": {"name": URL_SECRET, "key": "url"}}});
            }
            if let Some(container) = object.pointer_mut("/spec/template/spec/containers/0") {
                container["command"] = json!(["/bin/busybox", "sh", "-c", WRAPPED]);
            }
        }
        s.apply(example).await;
        let one = |other_than: Option<String>| {
            let s = &s;
            async move {
                let running = running(s).await;
                let [(pod, token)] = running.as_slice() else {
                    return None;
                };
                let status = status_token(s).await?;
                (other_than.as_ref() != Some(pod) && *token == status).then(|| (pod.clone(), token.clone()))
            }
        };
        let (first, token) = wait_for(
            "the wrapped command running in one pod, with the status token",
            FIRST_LEADER,
            || one(None),
        )
        .await;
        delete_now(&s, &first).await;
        let (second, next_token) = wait_for(
            "the wrapped command moved to another pod",
            SUCCESSOR + Duration::from_secs(30),
            || one(Some(first.clone())),
        )
        .await;
        assert_ne!(second, first);
        let (a, b): (u128, u128) = (token.parse().expect("a token"), next_token.parse().expect("a token"));
        assert!(b > a, "the next term's token {b} exceeds {a}");
    })
    .await;
}
