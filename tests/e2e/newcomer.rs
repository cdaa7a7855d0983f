//! A newcomer's first hour, scripted (issue 38, "Done when"): the README's
//! commands in order on the real cluster (the chart from this tree installed
//! as the README installs it, the example applied, a leader seen, `leasehold
//! check` and `status` on the result), every subcommand's `--help`, a wrong
//! kubeconfig and context, a lease whose store Secret is missing, and the
//! README's upgrade of the CRDs and the chart. Each step asserts what a
//! person would look for.

use std::process::Output;
use std::time::Duration;

use clap::CommandFactory;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::ListParams;
use serde_json::json;

use crate::e2e::cluster::{RELEASE_NAMESPACE, Scenario, repo, wait_for, walkthrough};
use crate::e2e::fixtures::{APP, lease_condition};
use crate::e2e::walkthrough::bash;
use crate::support::readme;

/// The README's namespace.
const NAMESPACE: &str = "my-app";

fn text(out: &Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Runs `script` as the README's reader would (see [`bash`]); fails naming `what`.
async fn run(s: &Scenario, what: &str, script: &str) {
    let mut bash = bash(s, script);
    // Minutes: off the test's one runtime thread.
    let out = tokio::task::spawn_blocking(move || bash.output())
        .await
        .expect("the script's thread")
        .expect("running bash");
    assert!(
        out.status.success(),
        "{what} failed:\n{}\n--- script ---\n{script}",
        text(&out)
    );
}

/// The pods of the example labelled leader.
async fn leaders(s: &Scenario) -> Vec<String> {
    let pods: Api<Pod> = Api::namespaced(s.client.clone(), NAMESPACE);
    let selector = format!("{APP},leasehold.dev/leader=true");
    pods.list(&ListParams::default().labels(&selector))
        .await
        .map(|list| list.items.into_iter().filter_map(|p| p.metadata.name).collect())
        .unwrap_or_default()
}

async fn one_leader(s: &Scenario, when: &str) -> String {
    wait_for(
        &format!("{when}: one pod labelled leader"),
        Duration::from_secs(120),
        || async {
            let leaders = leaders(s).await;
            (leaders.len() == 1).then(|| leaders[0].clone())
        },
    )
    .await
}

/// Changes the chart and the CRDs cluster-wide: nextest runs it alone, where no other test uses the cluster.
mod disruptive {
    use super::*;

    #[tokio::test]
    async fn a_newcomer_follows_the_readme_and_meets_the_common_mistakes() {
        walkthrough(NAMESPACE, |s| async move {
            let readme = std::fs::read_to_string(repo().join("README.md")).expect("README.md");

            // 1. "From nothing to a leader", up to its variants: the
            //    namespace, the chart, the store's Roles, the example.
            let variants = readme
                .find("### Variant:")
                .expect("the README's walkthrough has variants after its main part");
            run(&s, "the README's walkthrough", &readme::e2e_script(&readme[..variants])).await;
            let leader = one_leader(&s, "after the walkthrough").await;
            lease_condition(&s, "scheduler", "Ready", "True", Duration::from_secs(120)).await;

            // `leasehold check` finds nothing wrong with that install, and
            // `leasehold status` names the leader.
            let (clean, printed) = s.check();
            assert!(clean, "leasehold check after the README's install:\n{printed}");
            let status = wait_for(
                "leasehold status naming the leader",
                Duration::from_secs(60),
                || async {
                    let out = s.env.leasehold().args(["status", "-n", NAMESPACE]).output().ok()?;
                    let printed = text(&out);
                    (out.status.success() && printed.contains(&format!("{NAMESPACE}/{leader}#"))).then_some(printed)
                },
            )
            .await;
            assert!(status.contains("scheduler"), "{status}");

            // 2. Every subcommand's --help: exit 0 and its usage.
            for sub in leasehold::cmd::Cli::command()
                .get_subcommands()
                .filter(|c| !c.is_hide_set())
            {
                let name = sub.get_name();
                let out = s
                    .env
                    .leasehold()
                    .args([name, "--help"])
                    .output()
                    .expect("leasehold --help");
                assert!(out.status.success(), "leasehold {name} --help:\n{}", text(&out));
                let usage = String::from_utf8_lossy(&out.stdout);
                assert!(
                    usage.contains(&format!("Usage: leasehold {name}")),
                    "leasehold {name} --help:\n{usage}"
                );
            }

            // 3. A wrong kubeconfig or context: one clear error, naming
            //    what to fix.
            let missing = "/nonexistent/kubeconfig";
            for out in [
                s.env.leasehold().args(["status", "--kubeconfig", missing]).output(),
                s.env.leasehold().arg("status").env("KUBECONFIG", missing).output(),
            ] {
                let out = out.expect("leasehold status");
                let printed = String::from_utf8_lossy(&out.stderr);
                assert!(!out.status.success());
                let first = printed.lines().next().unwrap_or_default();
                assert!(
                    first.contains(missing) && first.contains("--kubeconfig") && first.contains("KUBECONFIG"),
                    "{printed}"
                );
            }
            let out = s
                .env
                .leasehold()
                .args(["status", "--context", "no-such-context"])
                .output()
                .unwrap();
            let printed = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success());
            let first = printed.lines().next().unwrap_or_default();
            assert!(
                first.contains("\"no-such-context\"") && first.contains("--context"),
                "{printed}"
            );

            // 4. A lease whose store Secret is missing: the condition names
            //    the Secret and the key.
            s.apply(vec![json!({
                "apiVersion": "leasehold.dev/v1alpha1", "kind": "DistributedLease",
                "metadata": {"name": "orders", "namespace": NAMESPACE},
                "spec": {
                    "store": {"postgres": {"urlSecretRef": {"name": "orders-db", "key": "url"}}},
                    "selector": {"matchLabels": {"app": "orders"}},
                },
            })])
            .await;
            let message = lease_condition(&s, "orders", "StoreReady", "False", Duration::from_secs(120)).await;
            assert!(
                message.contains(&format!("Secret {NAMESPACE}/orders-db does not exist"))
                    && message.contains("\"url\""),
                "{message}"
            );

            // Fixed as the newcomer would: the lease goes (check would report it).
            s.env
                .kubectl_ok(&["-n", NAMESPACE, "delete", "distributedlease", "orders", "--wait"]);

            // 5. The README's "Upgrading": the CRDs server-side, then the chart.
            let upgrade = readme::blocks(&readme, "sh")
                .into_iter()
                .find(|b| b.text.contains("helm upgrade"))
                .expect("the README's upgrade block");
            assert!(upgrade.text.contains("kubectl apply --server-side"), "{}", upgrade.text);
            run(&s, "the README's upgrade", &upgrade.text).await;
            s.env.kubectl_ok(&[
                "-n",
                RELEASE_NAMESPACE,
                "rollout",
                "status",
                "deployment/leasehold-operator",
                "--timeout=180s",
            ]);
            lease_condition(&s, "scheduler", "Ready", "True", Duration::from_secs(120)).await;
            one_leader(&s, "after the upgrade").await;
            let (clean, printed) = s.check();
            assert!(clean, "leasehold check after the upgrade:\n{printed}");
        })
        .await;
    }
}
